//! The one decision path the webhook and the CLI share.
//!
//! Owns running a policy over one object: find every image field, plan each
//! with `sigil-core`, resolve the distinct targets concurrently under one
//! deadline, and turn the answers into outcomes. It does not know whether the
//! object came from an AdmissionReview or a YAML file, and it renders nothing.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use futures_util::future::join_all;
use serde_json::Value;
use sigil_core::decision::decide;
use sigil_core::walker::image_fields;
use sigil_core::{
    Denial, Digest, DigestResolver, ImageField, Outcome, Plan, Policy, Reference, ResolveFailure,
    SignatureVerifier, Step, Verification, VerificationReport,
};

/// One verification job: the same digest under the same rule is checked once per request.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct VerifyKey {
    /// The digest that will run.
    pub digest: Digest,
    /// Rule whose verifiers apply.
    pub rule: String,
}

/// The digest a verifying plan will run, if known.
fn verify_key(p: &Plan, answer: Option<&Result<Digest, ResolveFailure>>) -> Option<VerifyKey> {
    p.verify.as_ref()?;
    let digest = match answer {
        Some(Ok(d)) => d.clone(),
        Some(Err(_)) => return None,
        None => p.target.digest()?.clone(),
    };
    Some(VerifyKey {
        digest,
        rule: p.rule.clone(),
    })
}

/// Where signatures are looked up: `signatures.repository`, else where the
/// image is pulled from (the mirror, after rewrite).
pub fn signature_repository(p: &Plan, v: &Verification) -> Reference {
    v.signatures_repository
        .as_deref()
        .and_then(|r| Reference::parse(r).ok())
        .unwrap_or_else(|| p.target.clone())
}

/// What the engine decided for one object.
#[derive(Debug, Clone, Default)]
pub struct ObjectDecision {
    /// Every image field, in walker order.
    pub fields: Vec<ImageField>,
    /// One outcome per field.
    pub outcomes: Vec<Outcome>,
    /// Per field, the signature report when its rule verifies (empty when no rule did).
    pub reports: Vec<Option<Arc<VerificationReport>>>,
}

impl ObjectDecision {
    /// Fields that must change, with their new values.
    pub fn changes(&self) -> Vec<sigil_core::patch::Replacement<'_>> {
        self.fields
            .iter()
            .zip(&self.outcomes)
            .filter_map(|(f, o)| match o {
                Outcome::Changed { new, .. } => Some(sigil_core::patch::Replacement {
                    field: f,
                    new: new.as_str(),
                }),
                _ => None,
            })
            .collect()
    }
}

/// A policy plus the resolver and signature verifier that feed it.
pub struct Engine<R> {
    /// The loaded policy.
    pub policy: Arc<Policy>,
    /// Where digests come from.
    pub resolver: R,
    /// Checks signatures for rules with `verify`; `None` when no rule verifies.
    pub verifier: Option<Arc<dyn SignatureVerifier>>,
}

impl<R: std::fmt::Debug> std::fmt::Debug for Engine<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("policy", &self.policy.name)
            .field("resolver", &self.resolver)
            .field("verifier", &self.verifier.is_some())
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
        }
    }

    /// Adds the verifier rules with `verify` need.
    pub fn with_verifier(mut self, verifier: Arc<dyn SignatureVerifier>) -> Self {
        self.verifier = Some(verifier);
        self
    }

    /// Decides every image field of `obj`. Distinct targets are resolved
    /// concurrently, so latency tracks the slowest lookup, not the sum.
    pub async fn decide_object(&self, obj: &Value, deadline: Instant) -> ObjectDecision {
        self.decide_fields(image_fields(obj), deadline).await
    }

    /// Decides fields already found by the walker.
    pub async fn decide_fields(
        &self,
        fields: Vec<ImageField>,
        deadline: Instant,
    ) -> ObjectDecision {
        if fields.is_empty() {
            return ObjectDecision::default();
        }
        let plans: Vec<Result<Plan, Denial>> =
            fields.iter().map(|f| self.policy.plan(&f.value)).collect();
        let answers = self
            .resolve_all(plans.iter().filter_map(|p| p.as_ref().ok()), deadline)
            .await;
        let answer_of = |p: &Plan| {
            (p.step == Step::Resolve)
                .then(|| answers.get(&p.target))
                .flatten()
        };
        // The digest each verifying plan will run, computed once per field.
        let keys: Vec<Option<VerifyKey>> = plans
            .iter()
            .map(|p| p.as_ref().ok().and_then(|p| verify_key(p, answer_of(p))))
            .collect();
        let reports = self.verify_all(&plans, &keys, deadline).await;
        let mut per_field = Vec::new();
        let outcomes = fields
            .iter()
            .zip(&plans)
            .zip(&keys)
            .map(|((f, p), k)| {
                let answer = p.as_ref().ok().and_then(answer_of);
                let report = k.as_ref().and_then(|k| reports.get(k));
                if !reports.is_empty() {
                    per_field.push(report.cloned());
                }
                decide(f, p.as_ref(), answer, report)
            })
            .collect();
        ObjectDecision {
            fields,
            outcomes,
            reports: per_field,
        }
    }

    /// Verifies each distinct (signature repository, digest, rule) once, all
    /// concurrently under the same deadline as the lookups.
    async fn verify_all(
        &self,
        plans: &[Result<Plan, Denial>],
        keys: &[Option<VerifyKey>],
        deadline: Instant,
    ) -> HashMap<VerifyKey, Arc<VerificationReport>> {
        let mut jobs: Vec<(VerifyKey, Reference, Arc<Verification>)> = Vec::new();
        for (p, key) in plans.iter().zip(keys) {
            let (Ok(p), Some(key)) = (p, key) else {
                continue;
            };
            let Some(v) = &p.verify else { continue };
            if jobs.iter().any(|(k, _, _)| k == key) {
                continue;
            }
            jobs.push((key.clone(), signature_repository(p, v), v.clone()));
        }
        if jobs.is_empty() {
            return HashMap::new();
        }
        let Some(verifier) = &self.verifier else {
            // A policy with verify rules always gets a verifier; without one,
            // nothing can pass (fail closed, with a reason).
            return jobs
                .into_iter()
                .map(|(k, _, v)| {
                    let r = VerificationReport::unfetched(
                        &v,
                        ResolveFailure::Config {
                            detail: "no signature verifier is configured in this process".into(),
                        },
                    );
                    (k, Arc::new(r))
                })
                .collect();
        };
        let reports = join_all(
            jobs.iter()
                .map(|(k, repo, v)| verifier.verify(repo, &k.digest, v, deadline)),
        )
        .await;
        jobs.into_iter().map(|(k, _, _)| k).zip(reports).collect()
    }

    /// Resolves each distinct target of the plans that need a lookup.
    pub async fn resolve_all<'p>(
        &self,
        plans: impl Iterator<Item = &'p Plan>,
        deadline: Instant,
    ) -> HashMap<Reference, Result<Digest, ResolveFailure>> {
        let mut targets: Vec<&Reference> = Vec::new();
        for p in plans {
            if p.step == Step::Resolve && !targets.contains(&&p.target) {
                targets.push(&p.target);
            }
        }
        let platform = self.policy.platform.as_ref();
        let answers = join_all(
            targets
                .iter()
                .map(|t| self.resolver.resolve(t, platform, deadline)),
        )
        .await;
        targets.into_iter().cloned().zip(answers).collect()
    }
}
