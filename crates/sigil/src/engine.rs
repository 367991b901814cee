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
    Step,
};

/// What the engine decided for one object.
#[derive(Debug, Clone, Default)]
pub struct ObjectDecision {
    /// Every image field, in walker order.
    pub fields: Vec<ImageField>,
    /// One outcome per field.
    pub outcomes: Vec<Outcome>,
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

/// A policy plus the resolver that feeds it.
#[derive(Debug)]
pub struct Engine<R> {
    /// The loaded policy.
    pub policy: Arc<Policy>,
    /// Where digests come from.
    pub resolver: R,
}

impl<R: DigestResolver> Engine<R> {
    /// Creates an engine.
    pub fn new(policy: Arc<Policy>, resolver: R) -> Self {
        Engine { policy, resolver }
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
        let outcomes = fields
            .iter()
            .zip(&plans)
            .map(|(f, p)| {
                let answer = p
                    .as_ref()
                    .ok()
                    .filter(|p| p.step == Step::Resolve)
                    .and_then(|p| answers.get(&p.target));
                decide(f, p.as_ref(), answer)
            })
            .collect();
        ObjectDecision { fields, outcomes }
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
