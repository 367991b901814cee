//! The one seam between the cluster side and the decision: what sigil-kube
//! asks of the engine the webhook has in force, without knowing the
//! webhook, the registry client or the verifier behind it.
//!
//! The binary implements both traits (its engine is [`Decide`], its webhook
//! plus the credential sources is [`InForce`]); the audit and the policy
//! watches only call them. Nothing here does I/O itself.

use std::sync::Arc;
use std::time::Instant;

use futures_util::future::BoxFuture;
use sigil_core::{ObjectFacts, ObjectVerdict, Policy};

use crate::BoxError;

/// One engine: a policy and the lookups that feed it, deciding one object
/// the way the webhook would (the audit decides every object as a CREATE).
pub trait Decide: Send + Sync {
    /// The policy this engine decides by.
    fn policy(&self) -> &Arc<Policy>;

    /// Decides one object, running its registry lookups under `deadline`.
    fn decide<'a>(
        &'a self,
        facts: ObjectFacts<'a>,
        deadline: Instant,
    ) -> BoxFuture<'a, ObjectVerdict>;

    /// Resolves one tag as the webhook would (the policy's platform, sigil's
    /// own credentials): the audit asks whether a mirror has an image now.
    fn resolve<'a>(
        &'a self,
        target: &'a sigil_core::Reference,
        deadline: Instant,
    ) -> BoxFuture<'a, Result<sigil_core::Digest, sigil_core::ResolveFailure>>;
}

/// What is in force in this process, and how to change it.
pub trait InForce: Send + Sync {
    /// The engine in force now; an audit keeps the one it started with, so
    /// every object of one audit is decided by one policy with one cache.
    fn current(&self) -> Arc<dyn Decide>;

    /// The policy in force now (compared by pointer to notice a change).
    fn policy(&self) -> Arc<Policy>;

    /// Builds what `policy` needs (registry clients, trust material) and
    /// puts it in force for new requests; on error the previous stays.
    fn put_in_force(&self, policy: Policy) -> Result<(), BoxError>;

    /// (rule, verifier, why) for verifiers in force whose trust material
    /// (a `keyRef`, a `trustRoot`) is unavailable: policy status reports it.
    fn unavailable(&self) -> Vec<(String, String, String)> {
        Vec::new()
    }
}
