//! sigil, the binary's library half: the webhook server, the shared decision
//! engine, TLS, metrics, the readiness self-check, and the few writes sigil
//! makes to the Kubernetes API (registration, certificates, break-glass).
//!
//! It owns wiring — turning a policy and flags into running listeners — and
//! the Kubernetes-facing wire formats. Decisions live in `sigil-core`;
//! registry I/O in `sigil-registry`. `main.rs` is only flags and glue.

pub mod admission;
pub mod certs;
pub mod cluster;
pub mod engine;
pub mod error;
pub mod files;
pub mod krm;
pub mod metrics;
pub mod pin;
pub mod reload;
pub mod selfcheck;
pub mod server;
pub mod tls;
