//! sigil-core: every decision sigil makes, with no I/O and no async runtime.
//!
//! It owns image references ([`reference`]), the policy schema and its
//! meaning ([`policy`], [`pattern`]), where images live in any object
//! ([`walker`]) and how to edit them in YAML text ([`manifest`]), what happens to each image ([`decision`]) and the JSONPatch
//! that applies it ([`patch`]). It does not talk to registries, verify
//! signatures or serve HTTP: those edges are the traits in this file,
//! implemented by `sigil-registry` and driven by the `sigil` binary, which runs
//! the I/O a plan asks for under one deadline and hands the answers back here.
//! Because nothing here awaits, fuzzing, property tests and benches need no
//! runtime.

pub mod decision;
pub mod manifest;
pub mod patch;
pub mod pattern;
pub mod policy;
pub mod reference;
pub mod walker;

pub use decision::{Denial, Finding, Mode, ObjectRef, Outcome, ResolveFailure};
pub use policy::{Plan, Platform, Policy, PolicyError, Step};
pub use reference::{Digest, Reference, ReferenceError};
pub use walker::{FieldKind, ImageField, ObjectSummary};

use std::future::Future;
use std::time::Instant;

/// The I/O edge that turns a tag into the digest the registry serves.
///
/// Defined here so the decision code names what it needs without depending on
/// an HTTP stack; `sigil-registry` implements it with caching and
/// single-flight. `deadline` is the admission deadline: an implementation
/// must answer (possibly with [`ResolveFailure::Timeout`]) before it.
pub trait DigestResolver: Send + Sync {
    /// Resolves `target` (which carries a tag, not a digest) for `platform`.
    fn resolve(
        &self,
        target: &Reference,
        platform: Option<&Platform>,
        deadline: Instant,
    ) -> impl Future<Output = Result<Digest, ResolveFailure>> + Send;
}
