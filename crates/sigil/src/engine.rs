//! The I/O half of the one decision path every front end shares.
//!
//! Owns running the lookups a [`sigil_core::ObjectPlan`] names — each
//! distinct tag resolved once and each distinct (digest, rule) verified once,
//! all concurrently under one deadline — and handing the answers back to
//! sigil-core, which makes the decision. It decides nothing itself, does not
//! know whether the object came from an AdmissionReview, a YAML file or a
//! cluster listing, and renders nothing.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use futures_util::future::join_all;
use sigil_core::credentials::{PullContext, PullSecretStore};
use sigil_core::{
    Answers, Digest, DigestResolver, NamespaceLabels, ObjectFacts, ObjectVerdict, Policy,
    PullCredentials, Reference, ResolveFailure, SignatureVerifier, VerificationReport, VerifyJob,
    VerifyKey, plan_object,
};

/// Distinct lookups one object may need by default (`--max-lookups-per-object`).
pub const DEFAULT_MAX_LOOKUPS: usize = 64;

/// A policy plus the resolver and signature verifier that feed it.
pub struct Engine<R> {
    /// The loaded policy.
    pub policy: Arc<Policy>,
    /// Where digests come from.
    pub resolver: R,
    /// Checks signatures for rules with `verify`; `None` when no rule verifies.
    pub verifier: Option<Arc<dyn SignatureVerifier>>,
    /// The cluster's pull secrets and ServiceAccounts (kept by watches);
    /// `None` when sigil does not read them (client side, `--pull-secrets` off).
    pub pull_secrets: Option<Arc<dyn PullSecretStore>>,
    /// Namespace labels (kept by a watch), for rules with a `namespaceSelector`.
    pub namespaces: Option<Arc<dyn NamespaceLabels>>,
    /// Beyond this many distinct lookups an object is denied, unlooked-up.
    pub max_lookups: usize,
}

impl<R: std::fmt::Debug> std::fmt::Debug for Engine<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("policy", &self.policy.name)
            .field("resolver", &self.resolver)
            .field("verifier", &self.verifier.is_some())
            .field("pull_secrets", &self.pull_secrets.is_some())
            .finish()
    }
}

impl<R: DigestResolver> Engine<R> {
    /// Creates an engine without a signature verifier.
    pub fn new(policy: Arc<Policy>, resolver: R) -> Self {
        Engine {
            policy,
            resolver,
            verifier: None,
            pull_secrets: None,
            namespaces: None,
            max_lookups: DEFAULT_MAX_LOOKUPS,
        }
    }

    /// Reads namespace labels from `store`.
    pub fn with_namespaces(mut self, store: Arc<dyn NamespaceLabels>) -> Self {
        self.namespaces = Some(store);
        self
    }

    /// Reads pull secrets and ServiceAccounts from `store`.
    pub fn with_pull_secrets(mut self, store: Arc<dyn PullSecretStore>) -> Self {
        self.pull_secrets = Some(store);
        self
    }

    /// Adds the verifier rules with `verify` need.
    pub fn with_verifier(mut self, verifier: Arc<dyn SignatureVerifier>) -> Self {
        self.verifier = Some(verifier);
        self
    }

    /// Decides one object: sigil-core plans it, the lookups run here
    /// (concurrently, so latency tracks the slowest, not the sum), and
    /// sigil-core turns the answers into the verdict.
    pub async fn decide(&self, facts: ObjectFacts<'_>, deadline: Instant) -> ObjectVerdict {
        // Labels are looked up only when a rule is limited to some namespaces.
        let looked_up = match (&self.namespaces, facts.namespace, facts.namespace_labels) {
            (Some(store), Some(ns), None) if self.policy.has_namespace_selectors() => {
                store.labels(ns)
            }
            _ => None,
        };
        let plan = plan_object(
            &self.policy,
            ObjectFacts {
                namespace_labels: looked_up.as_ref().or(facts.namespace_labels),
                ..facts
            },
        )
        .limit_lookups(self.max_lookups);
        let creds = self.cluster_credentials(plan.pull_context());
        let digests = self.resolve_all(plan.lookups(), &creds, deadline).await;
        let reports = self
            .verify_all(plan.verifications(&digests), &creds, deadline)
            .await;
        plan.decide(&Answers {
            offline: false,
            digests,
            reports,
        })
    }

    /// Decides without any registry call (`--offline`): what needs a lookup
    /// is reported as such.
    pub fn decide_offline(&self, facts: ObjectFacts<'_>) -> ObjectVerdict {
        plan_object(&self.policy, facts).decide(&Answers {
            offline: true,
            ..Answers::default()
        })
    }

    /// The object's cluster credentials: its Secrets (or its
    /// ServiceAccount's) as one keyring, read from the watches.
    fn cluster_credentials<'a>(&'a self, pull: Option<&'a PullContext>) -> ClusterCredentials<'a> {
        match (pull, &self.pull_secrets) {
            (Some(ctx), Some(store)) if !ctx.namespace.is_empty() => ClusterCredentials {
                of: Some((ctx, store.as_ref())),
                named: ctx.sources().into(),
            },
            _ => ClusterCredentials {
                of: None,
                named: Arc::from([]),
            },
        }
    }

    /// Verifies each job, all concurrently under the same deadline as the lookups.
    async fn verify_all(
        &self,
        jobs: Vec<VerifyJob>,
        creds: &ClusterCredentials<'_>,
        deadline: Instant,
    ) -> HashMap<VerifyKey, Arc<VerificationReport>> {
        if jobs.is_empty() {
            return HashMap::new();
        }
        let Some(verifier) = &self.verifier else {
            // A policy with verify rules always gets a verifier; without one,
            // nothing can pass (fail closed, with a reason).
            return jobs
                .into_iter()
                .map(|j| {
                    let r = VerificationReport::unfetched(
                        &j.verification,
                        ResolveFailure::Config {
                            detail: "no signature verifier is configured in this process".into(),
                        },
                    );
                    (j.key, Arc::new(r))
                })
                .collect();
        };
        let per_job: Vec<PullCredentials> = jobs
            .iter()
            .map(|j| creds.for_target(&j.repository))
            .collect();
        let reports = join_all(jobs.iter().zip(&per_job).map(|(j, c)| {
            verifier.verify(&j.repository, &j.key.digest, &j.verification, c, deadline)
        }))
        .await;
        jobs.into_iter().map(|j| j.key).zip(reports).collect()
    }

    /// Resolves each target once.
    async fn resolve_all(
        &self,
        targets: Vec<&Reference>,
        creds: &ClusterCredentials<'_>,
        deadline: Instant,
    ) -> HashMap<Reference, Result<Digest, ResolveFailure>> {
        if targets.is_empty() {
            return HashMap::new();
        }
        let platform = self.policy.platform.as_ref();
        let per_target: Vec<PullCredentials> =
            targets.iter().map(|t| creds.for_target(t)).collect();
        let answers = join_all(
            targets
                .iter()
                .zip(&per_target)
                .map(|(t, c)| self.resolver.resolve(t, platform, c, deadline)),
        )
        .await;
        targets.into_iter().cloned().zip(answers).collect()
    }
}

/// One object's cluster credentials, looked up per image.
struct ClusterCredentials<'a> {
    of: Option<(&'a PullContext, &'a dyn PullSecretStore)>,
    named: Arc<[String]>,
}

impl ClusterCredentials<'_> {
    /// The candidates for one image, most specific key first.
    fn for_target(&self, target: &Reference) -> PullCredentials {
        match self.of {
            None => PullCredentials::default(),
            Some((ctx, store)) => PullCredentials {
                candidates: ctx.candidates(store, &target.name()),
                named: self.named.clone(),
            },
        }
    }
}
