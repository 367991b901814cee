//! What happens to one image: mirror rewrites both ways (so a second
//! admission pass decides the same), the rule that governs the image, and
//! whether it must be resolved, kept, or denied.

use std::sync::Arc;

use super::{Action, Labels, Plan, Policy, Rule, Step};
use crate::denial::Denial;
use crate::reference::{self, Reference};

impl Policy {
    /// The rule governing a normalized origin name in a namespace with
    /// `labels` (`None`: no namespace; rules with a selector do not apply).
    pub fn rule_for(&self, origin: &Reference, labels: Option<&Labels>) -> Option<&Rule> {
        self.first_rule(origin, |r| {
            r.namespace_selector
                .as_ref()
                .is_none_or(|s| labels.is_some_and(|l| s.matches(l)))
        })
    }

    /// The rule of the first (most specific) pattern that matches `origin`,
    /// whether or not the rule selects namespaces: what the backstop, which
    /// cannot see a namespace's labels, decides by (such a rule admits there).
    pub fn rule_in_any_namespace(&self, origin: &Reference) -> Option<&Rule> {
        self.first_rule(origin, |_| true)
    }

    /// The rule of the first pattern, most specific first, that matches
    /// `origin` and whose rule `applies`.
    fn first_rule(&self, origin: &Reference, applies: impl Fn(&Rule) -> bool) -> Option<&Rule> {
        let segs = crate::pattern::segments_of(origin);
        // Only patterns whose literal start the name shares can match.
        let mut candidates: Vec<usize> = self.index.get("").cloned().unwrap_or_default();
        let mut key = String::with_capacity(64);
        for (i, s) in segs.iter().enumerate() {
            if i > 0 {
                key.push('/');
            }
            key.push_str(s);
            if let Some(v) = self.index.get(key.as_str()) {
                candidates.extend_from_slice(v);
            }
        }
        candidates.sort_unstable();
        candidates
            .iter()
            .map(|&at| &self.order[at])
            .find(|&&(ri, pi)| {
                let r = &self.rules[ri];
                r.patterns[pi].matches_segments(origin, &segs) && applies(r)
            })
            .map(|&(ri, _)| &self.rules[ri])
    }

    /// Maps a mirrored name back to its origin (longest `to` wins). Names not
    /// under any mirror are their own origin.
    pub fn origin_of(&self, r: &Reference) -> Reference {
        let name = r.name();
        let best = self
            .mirrors
            .iter()
            .flat_map(|m| m.targets().map(move |t| (m, t)))
            .filter(|(_, t)| under(&name, t))
            .max_by_key(|(_, t)| t.len());
        match best {
            Some((m, t)) => swap_prefix(r, &name, t, &m.from).unwrap_or_else(|| r.clone()),
            None => r.clone(),
        }
    }

    /// Maps an origin name to where it is pulled from (longest `from` wins).
    pub fn mirror_of(&self, origin: &Reference) -> Reference {
        let name = origin.name();
        mirrored(origin, &name, self.mirror_for(&name))
    }

    /// The mirror of an origin name (`mirrors` is sorted longest `from` first).
    fn mirror_for(&self, name: &str) -> Option<&super::Mirror> {
        self.mirrors.iter().find(|m| under(name, &m.from))
    }

    /// Decides what must happen to one image string. Pure and idempotent:
    /// planning the output of a previous plan yields `Step::Keep` with the same target.
    pub fn plan(&self, written: &str) -> Result<Plan, Denial> {
        self.plan_in(written, None)
    }

    /// [`Self::plan_in`], remembered for the life of this policy: the plan
    /// of an image string already planned is shared, not made again. A
    /// policy whose rules select namespaces plans anew whenever labels are
    /// given (they may differ from one namespace, or one moment, to the next).
    pub fn plan_shared(&self, written: &str, labels: Option<&Labels>) -> Result<Arc<Plan>, Denial> {
        if labels.is_some() && self.has_namespace_selectors() {
            return self.plan_in(written, labels).map(Arc::new);
        }
        self.plans
            .get_or_plan(written, || self.plan_in(written, None).map(Arc::new))
    }

    /// [`Self::plan`] for an object in a namespace with `labels`.
    pub fn plan_in(&self, written: &str, labels: Option<&Labels>) -> Result<Plan, Denial> {
        let reference =
            Reference::parse(written.trim()).map_err(|e| Denial::InvalidReference { error: e })?;
        let origin = self.origin_of(&reference);
        let rule = self.rule_for(&origin, labels).ok_or(Denial::NoRule)?;
        let name = origin.name();
        let mirror = self.mirror_for(&name);
        let mut target = mirrored(&origin, &name, mirror);
        let failover = mirror.and_then(|m| m.failover.clone());
        if let Some(f) = &failover
            && reference.digest().is_some()
            && let written_name = reference.name()
            && (f.alternates_of(&origin).any(|a| a.name() == written_name)
                || (f.fallback && name == written_name))
        {
            // Pinned by a failover already (a second admission pass, a
            // manifest sigil pinned): keep the mirror or origin that served it.
            target = reference.clone();
        }
        let moved = target.domain() != reference.domain() || target.path() != reference.path();
        let step = match rule.action {
            Action::Deny => Step::Deny,
            Action::Allow => Step::Keep,
            // A digest moved to a mirror is asked for there first: written
            // where no registry serves it, it would never pull.
            Action::Pin if target.digest().is_some() && moved => Step::Resolve,
            Action::Pin if target.digest().is_some() => Step::Keep,
            Action::Pin => Step::Resolve,
        };
        Ok(Plan {
            written: written.to_owned(),
            reference,
            origin,
            target,
            rule: rule.name.as_str().into(),
            mode: rule.mode,
            step,
            verify: rule.verification.clone(),
            source: rule.source.clone(),
            failover,
            fallback: None,
        })
    }
}

/// Where `origin` (named `name`) is pulled from under `mirror`, if any.
fn mirrored(origin: &Reference, name: &str, mirror: Option<&super::Mirror>) -> Reference {
    match mirror {
        Some(m) => swap_prefix(origin, name, &m.from, &m.to).unwrap_or_else(|| origin.clone()),
        None => origin.clone(),
    }
}

impl Plan {
    /// Whether the mirror stage changed where the image comes from.
    pub fn rewritten(&self) -> bool {
        self.target.domain() != self.reference.domain()
            || self.target.path() != self.reference.path()
    }

    /// The image string to write back, given the digest resolved (if any).
    /// Keeps the user's spelling when only a digest is added.
    pub fn final_image(&self, digest: Option<&reference::Digest>) -> String {
        match digest {
            // Already pinned: written as it is, at the mirror.
            Some(_) if self.rewritten() && self.target.digest().is_some() => {
                self.target.to_string()
            }
            Some(d) if self.rewritten() => self.target.pinned_string(d),
            Some(d) => {
                let w = self.written.trim();
                let base = match w.split_once('@') {
                    Some((b, _)) => b,
                    None => w,
                };
                let has_tag = base
                    .rsplit('/')
                    .next()
                    .is_some_and(|last| last.contains(':'));
                if has_tag {
                    format!("{base}@{d}")
                } else {
                    format!("{base}:latest@{d}")
                }
            }
            None if self.rewritten() => self.target.to_string(),
            None => self.written.clone(),
        }
    }
}

/// The rule index of a policy: positions in `order` by literal prefix.
pub(super) fn index_of(
    rules: &[Rule],
    order: &[(usize, usize)],
) -> std::collections::HashMap<String, Vec<usize>> {
    let mut index: std::collections::HashMap<String, Vec<usize>> = Default::default();
    for (at, &(ri, pi)) in order.iter().enumerate() {
        index
            .entry(rules[ri].patterns[pi].literal_prefix())
            .or_default()
            .push(at);
    }
    index
}

/// `name` is `prefix` or lies below it on a segment boundary.
pub(super) fn under(name: &str, prefix: &str) -> bool {
    name.strip_prefix(prefix)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
}

/// `r` (named `name`) with its prefix `from` swapped for `to`.
fn swap_prefix(r: &Reference, name: &str, from: &str, to: &str) -> Option<Reference> {
    debug_assert!(under(name, from));
    r.with_prefix(from.len(), to)
}

/// A rule by name and the policy object stating it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleRef {
    /// The rule's name.
    pub name: String,
    /// `ClusterImagePolicy base`, `ImagePolicy team-a/strict`; `None` for
    /// the policy file's rules.
    pub source: Option<String>,
}

impl RuleRef {
    /// The rule that decided `outcome` for a field planned as `plan`.
    pub(crate) fn of(outcome: &crate::decision::Outcome, plan: Option<&Plan>) -> Option<RuleRef> {
        if let crate::decision::Outcome::Failed(f) = outcome
            && let crate::denial::Denial::TeamPolicy { policy, refusal } = &f.denial
        {
            let name = match refusal.as_ref() {
                crate::denial::Denial::StaticDeny { rule, .. }
                | crate::denial::Denial::Unverified { rule, .. } => rule.clone(),
                _ => "allowed-images".to_owned(),
            };
            return Some(RuleRef {
                name,
                source: Some(policy.clone()),
            });
        }
        plan.map(|p| RuleRef {
            name: p.rule.to_string(),
            source: p.source.clone(),
        })
    }
}
