//! sigil, the binary's library half: the webhook server, the shared decision
//! engine, TLS, metrics and the readiness self-check.
//!
//! It owns wiring — turning a policy and flags into running listeners — and
//! the Kubernetes-facing wire formats. Decisions live in `sigil-core`;
//! registry I/O in `sigil-registry`. `main.rs` is only flags and glue.

pub mod admission;
pub mod engine;
pub mod files;
pub mod krm;
pub mod metrics;
pub mod pin;
pub mod reload;
pub mod selfcheck;
pub mod server;
pub mod tls;
