//! sigil, the binary's library half: what turns a policy and flags into a
//! running webhook, and what renders sigil-core's decisions for each front end.
//!
//! It owns the webhook server and process lifecycle ([`server`]), the
//! AdmissionReview wire format ([`admission`]), the I/O half of the one
//! decision path ([`engine`]: runs the lookups a sigil-core plan names, and
//! builds the engine a policy needs), client-side pinning and the KRM
//! function ([`pin`], [`krm`]), policy test suites ([`suite`]), the policy file's hot reload ([`reload`]),
//! serving certificates ([`tls`]), the readiness self-check
//! ([`selfcheck`]), metrics ([`metrics`]), the batching log writer
//! ([`logwriter`]), atomic file writes ([`files`]) and the reports' indented
//! JSON ([`jsonout`]). Its errors are
//! [`error::Error`].
//!
//! Decisions live in `sigil-core`, registry I/O in `sigil-registry`,
//! signature checks in `sigil-verify`, and everything that talks to the
//! Kubernetes API in `sigil-kube` (which this crate starts and hands the
//! engine in force through `sigil_kube::InForce`); the binary's `main.rs`
//! and `cmd/` are only flags and glue.

pub mod admission;
pub mod decisionlog;
pub mod engine;
pub mod error;
pub mod failover;
pub mod files;
pub mod jsonout;
pub mod krm;
pub mod logwriter;
pub mod metrics;
pub mod node;
pub mod pin;
pub mod reload;
pub mod selfcheck;
pub mod server;
pub mod suite;
pub mod tls;
pub mod trust;
