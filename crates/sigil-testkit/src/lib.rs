//! sigil-testkit: what sigil's tests, benches and fuzz targets share, so
//! none of them keeps its own copy (dev-only, never published).
//!
//! It owns the real parts and the stand-ins tests run against: the CNCF
//! `docker-registry` on loopback with pushes through its HTTP API
//! ([`registry`]), its token service ([`token`]), a fault server for what a
//! real registry cannot do ([`fault`]), cosign/notation signing helpers
//! ([`signing`]) and the in-toto statements they sign ([`intoto`]), the
//! attestations teams require, signed in every layout ([`attestations`]),
//! AdmissionReview builders and the captured fixtures
//! ([`review`]), RFC 3161 tokens ([`timestamp`]), in-process digest resolvers ([`resolver`]) and signature
//! sources ([`artifacts`]), `sigil` as a
//! child process with a kube-apiserver-like webhook client ([`sigil`]), what
//! benchmarks read from `/proc` ([`procstat`]), where a process's
//! sockets point ([`sockets`]), policies of a chosen size ([`policies`]), a trusted root laid out in
//! overlapping authority windows as GitHub's ([`windows`]), python-tuf's
//! repositories ([`pytuf`]), and
//! the kube-apiserver stand-in ([`kube`]) and the real one it starts
//! (`kube::real`), and the shipped container image built and run with
//! buildah and podman ([`image`]). It contains no test itself and
//! decides nothing about images.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::new_without_default,
    missing_debug_implementations
)]

pub mod artifacts;
pub mod attestations;
pub mod conformance;
pub mod containerd;
pub mod entries;
pub mod fault;
pub mod featured;
pub mod github;
pub mod image;
pub mod intoto;
pub mod kube;
pub mod node;
pub mod oci_layout;
pub mod pki;
pub mod policies;
pub mod ports;
pub mod process;
pub mod procstat;
pub mod pytuf;
pub mod registry;
pub mod resolver;
pub mod review;
pub mod sigil;
pub mod signing;
pub mod sigstore;
pub mod sockets;
pub mod timestamp;
pub mod token;
pub mod tuf;
pub mod windows;

pub use review::{fixture, fixture_bytes, fixtures_dir};
