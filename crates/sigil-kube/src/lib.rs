//! sigil's side of the Kubernetes API, through kube-rs and kube-runtime only.
//!
//! It owns the policy kinds' Rust types, from which the CRDs are generated
//! ([`crd`]); the watches that keep in-memory stores the decision reads —
//! pull secrets and ServiceAccounts ([`pullsecrets`]), policy objects and
//! namespace labels ([`policies`]), TrustRoots ([`trustroots`], loaded by
//! the binary through [`trustroots::TrustRootSink`]), the ConfigMaps and
//! Secrets verifiers name by `keyRef` ([`keyrefs`]); the status and Event
//! writers; the Leases
//! that pick one writer among replicas, webhook registration and break-glass
//! ([`cluster`]); the self-managed certificate Secret ([`certs`]); and the
//! audit's listing and in-cluster loop ([`audit`]). Its metric families are
//! its own ([`metrics`]), registered into the registry the binary hands in.
//!
//! It never serves HTTP and decides nothing: the stores it fills are read by
//! sigil-core's traits (`PullSecretStore`, `NamespaceLabels`), and what it
//! needs of the decision in force — the policy, deciding one object, putting
//! a combined policy in force — it asks through [`InForce`], which the
//! binary implements. Its errors are [`Error`].

pub mod audit;
pub mod certs;
pub mod cluster;
pub mod crd;
pub mod error;
mod in_force;
pub mod keyrefs;
pub mod metrics;
pub mod node;
pub mod policies;
pub mod pullsecrets;
pub mod trustroots;

pub use error::{BoxError, Error, Result};
pub use in_force::{Decide, InForce};
pub use metrics::Metrics;
