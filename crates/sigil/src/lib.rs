//! sigil, the binary's library half: what turns a policy and flags into a
//! running webhook, and what renders sigil-core's decisions for each front end.
//!
//! It owns the webhook server and process lifecycle ([`server`]), the
//! AdmissionReview wire format ([`admission`]), the I/O half of the one
//! decision path ([`engine`]: runs the lookups a sigil-core plan names),
//! client-side pinning and the KRM function ([`pin`], [`krm`]), policy hot
//! reload ([`reload`]), serving certificates ([`tls`], and self-managed ones
//! in [`certs`]), the readiness self-check ([`selfcheck`]), metrics
//! ([`metrics`]), the batching log writer ([`logwriter`]), atomic file writes ([`files`]), and the few writes sigil
//! makes to the Kubernetes API (registration and break-glass: [`cluster`]),
//! and the pull secrets it reads from it ([`pullsecrets`]).
//! Its errors are [`error::Error`]. Decisions live in `sigil-core`, registry
//! I/O in `sigil-registry`, signature checks in `sigil-verify`; the
//! binary's `main.rs` and `cmd/` are only flags and glue.

pub mod admission;
pub mod audit;
pub mod certs;
pub mod cluster;
pub mod crd;
pub mod engine;
pub mod error;
pub mod files;
pub mod krm;
pub mod logwriter;
pub mod metrics;
pub mod pin;
pub mod policies;
pub mod pullsecrets;
pub mod reload;
pub mod selfcheck;
pub mod server;
pub mod tls;
