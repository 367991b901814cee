//! sigil's integration tests, compiled into one binary (ripgrep's layout).
//! They start real servers on 127.0.0.1: the CNCF distribution registry and
//! `sigil serve` itself (and, for registration, a stand-in for kube-apiserver).

#![allow(clippy::unwrap_used)]

mod attest;
mod attest_files;
mod audit;
mod backstop;
mod boundaries;
mod cluster;
mod conformance;
mod credentials;
mod deploy;
mod drain;
mod entry_kinds;
mod exceptions;
mod extractors;
mod github_attest;
mod hardening;
mod helm;
mod keyrefs;
mod kubelet;
mod mirror_copy;
mod mirrors;
mod monitoring;
mod multiplatform;
mod node;
mod node_agree;
mod notation_trust;
mod pin;
mod pin_files;
mod policies;
mod rbac;
mod readme;
mod real_kube;
mod real_node;
mod scripts;
mod shipped;
mod suites;
mod trust;
mod tuf_repositories;
use sigil_testkit as support;
mod verify;
mod webhook;
