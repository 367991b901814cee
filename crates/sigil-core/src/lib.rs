//! sigil-core: every decision sigil makes, with no I/O and no async runtime.
//!
//! It owns image references ([`mod@reference`], with Docker Hub's many names
//! folded in one place: [`dockerhub`]), the policy schema and its meaning
//! ([`policy`], [`pattern`]), where images live in any object ([`walker`])
//! and how to edit them in YAML text ([`manifest`]), the per-object decision
//! every front end calls ([`object`]: skip rules, namespace, UPDATE
//! downgrade, scope, and which lookups a decision needs), what happens to
//! each image and the denial reasons ([`decision`]), what a rule's signature
//! requirement means and whether a set of verifier results meets it
//! ([`verify`]), what an attestation states and the CEL conditions a policy
//! puts on it ([`attest`]), and the JSONPatch that applies a decision
//! ([`patch`]). It
//! does not talk to registries, check signatures or serve HTTP: those edges
//! are the traits in this file, implemented by `sigil-registry` and
//! `sigil-verify` and driven by the `sigil` binary, which runs the I/O a plan
//! asks for under one deadline and hands the answers back here. Because
//! nothing here awaits, fuzzing, property tests and benches need no runtime.

pub mod attest;
pub mod audit;
pub mod backstop;
pub mod credentials;
pub mod decision;
pub mod denial;
pub mod dockerhub;
pub mod duration;
pub mod error_context;
pub mod exception;
pub mod failure;
pub mod manifest;
pub mod object;
pub mod patch;
pub mod pattern;
pub mod policy;
pub mod reference;
pub mod text;
pub mod verify;
pub mod walker;
pub mod yaml;

pub use credentials::PullCredentials;
pub use decision::{Finding, ObjectRef, Outcome};
pub use denial::{Denial, Mode};
pub use failure::ResolveFailure;
pub use object::{
    AnswerMap, Answers, FieldVerdict, ObjectFacts, ObjectPlan, ObjectVerdict, Operation, Skip,
    Source, VerifyJob, VerifyKey, effective_namespace, plan_object,
};
pub use policy::{Plan, Platform, Policy, PolicyError, Step};
pub use reference::{Digest, Reference, ReferenceError};
pub use verify::{SignatureProblem, Verification, VerificationReport, VerifierOutcome};
pub use walker::{FieldKind, ImageField, ObjectSummary};

/// Namespace labels, for rules with a `namespaceSelector`: kept in memory by
/// a watch, never fetched per request.
pub trait NamespaceLabels: Send + Sync {
    /// The labels of namespace `name`, if it is known.
    fn labels(&self, name: &str) -> Option<policy::Labels>;

    /// A number that changes whenever any namespace's labels may have
    /// changed, so an answer that read them can tell it is still current;
    /// `None` (the default) when the store cannot say, and then no answer
    /// that read it is reused.
    fn generation(&self) -> Option<u64> {
        None
    }
}

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long the I/O crates keep an answer (digests, verification outcomes).
/// One rule for both: a good answer lives `ttl`; a definite "no" lives
/// briefly (the image or signature may be pushed next); a transient failure
/// is never kept (waiters coalesced on its load still share it).
#[derive(Debug, Clone, Copy)]
pub struct CacheConfig {
    /// Lifetime of a good answer.
    pub ttl: Duration,
    /// Lifetime of a definite negative answer (capped at `ttl`).
    pub negative_ttl: Duration,
    /// Most entries kept.
    pub capacity: u64,
}

impl Default for CacheConfig {
    fn default() -> Self {
        CacheConfig {
            ttl: Duration::from_secs(300),
            negative_ttl: Duration::from_secs(10),
            capacity: 100_000,
        }
    }
}

/// What kind of answer is being cached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Freshness {
    /// A positive answer.
    Good,
    /// A negative answer that will not change by itself.
    Definite,
    /// A failure that may go away (timeout, 5xx, 429).
    Transient,
}

impl CacheConfig {
    /// How long an answer of this kind is kept.
    pub fn lifetime(&self, f: Freshness) -> Duration {
        match f {
            Freshness::Good => self.ttl,
            Freshness::Definite => self.negative_ttl.min(self.ttl),
            Freshness::Transient => Duration::ZERO,
        }
    }
}

/// The I/O edge that turns a tag into the digest the registry serves.
///
/// Defined here so the decision code names what it needs without depending on
/// an HTTP stack; `sigil-registry` implements it with caching and
/// single-flight. `deadline` is the admission deadline: an implementation
/// must answer (possibly with [`ResolveFailure::Timeout`]) before it.
/// `creds` are the cluster credentials the object may use (its pull
/// secrets); an implementation tries them before its own and anonymous, and
/// never serves an answer learned with a credential `creds` does not hold.
pub trait DigestResolver: Send + Sync {
    /// Resolves `target` (which carries a tag, not a digest) for `platform`.
    fn resolve(
        &self,
        target: &Reference,
        platform: Option<&Platform>,
        creds: &PullCredentials,
        deadline: Instant,
    ) -> impl Future<Output = Result<Digest, ResolveFailure>> + Send;
}

/// The I/O edge that fetches signature artifacts from a registry.
///
/// `sigil-verify` gathers signatures through it and `sigil-registry`
/// implements it, so neither depends on the other. Every call answers before
/// `deadline`. `Ok(None)` means "not there" (404), which for signatures is an
/// answer, not a failure.
pub trait ArtifactSource: Send + Sync {
    /// A manifest by tag or digest, as raw bytes, checked against the digest when given one.
    fn manifest(
        &self,
        repository: &Reference,
        reference: &str,
        creds: &PullCredentials,
        deadline: Instant,
    ) -> impl Future<Output = Result<Option<Vec<u8>>, ResolveFailure>> + Send;

    /// The OCI referrers index of `digest`. `Ok(None)` when the registry has no
    /// referrers API (the caller then falls back to the tag schema).
    fn referrers(
        &self,
        repository: &Reference,
        digest: &Digest,
        creds: &PullCredentials,
        deadline: Instant,
    ) -> impl Future<Output = Result<Option<Vec<u8>>, ResolveFailure>> + Send;

    /// Whether this source is still learning if `repository`'s host has the
    /// referrers API (its first referrers request is out). Meanwhile a
    /// caller asks the tag schema at the same time as the API and keeps the
    /// API's answer when there is one: an image arriving during a cold
    /// host's probe then waits for neither answer in turn.
    fn referrers_api_unknown(&self, _repository: &Reference) -> bool {
        false
    }

    /// A blob, checked against its digest, at most `max` bytes.
    fn blob(
        &self,
        repository: &Reference,
        digest: &Digest,
        max: usize,
        creds: &PullCredentials,
        deadline: Instant,
    ) -> impl Future<Output = Result<Vec<u8>, ResolveFailure>> + Send;
}

/// A boxed future, so [`SignatureVerifier`] can be a trait object that the
/// engine holds without another type parameter.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// The I/O edge that checks a digest's signatures against a rule's verifiers.
pub trait SignatureVerifier: Send + Sync {
    /// Verifies `digest`, its signatures read from `repository` with
    /// `creds`, under `verification`. `image` is where the image itself is
    /// read (with its credentials) when that is another repository
    /// (`signatures.repository`): a rule wanting signatures at each platform
    /// reads the index there. Always answers (a fetch failure is a report,
    /// not an error).
    fn verify<'a>(
        &'a self,
        repository: &'a Reference,
        digest: &'a Digest,
        verification: &'a Arc<Verification>,
        creds: &'a PullCredentials,
        image: Option<(&'a Reference, &'a PullCredentials)>,
        deadline: Instant,
    ) -> BoxFuture<'a, Arc<VerificationReport>>;

    /// The report [`Self::verify`] would answer at once, from what the
    /// verifier already holds for this very check; `None` when it would
    /// have to verify (or keeps nothing). A cached admission — the common
    /// case — verifies every image this way, without building, boxing and
    /// joining a future per image.
    fn cached(
        &self,
        _repository: &Reference,
        _digest: &Digest,
        _verification: &Arc<Verification>,
        _creds: &PullCredentials,
    ) -> Option<Arc<VerificationReport>> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_lifetimes_by_kind_of_answer() {
        let c = CacheConfig {
            ttl: Duration::from_secs(5),
            ..CacheConfig::default()
        };
        assert_eq!(c.lifetime(Freshness::Good), Duration::from_secs(5));
        // The negative lifetime never outlives the positive one.
        assert_eq!(c.lifetime(Freshness::Definite), Duration::from_secs(5));
        assert_eq!(
            CacheConfig::default().lifetime(Freshness::Definite),
            Duration::from_secs(10)
        );
        assert_eq!(c.lifetime(Freshness::Transient), Duration::ZERO);
    }
}
