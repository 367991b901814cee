//! The namespace's ImagePolicies on one image field, ANDed with the
//! cluster's outcome: they may refuse what the cluster admits (or make its
//! warnings block), never admit what it refuses.

use super::*;

/// The namespace's ImagePolicies, ANDed with the cluster's outcome: they
/// may refuse what the cluster admits (or make its warnings block), never
/// admit what it refuses.
pub(super) fn apply_teams(
    outcome: Outcome,
    field: &ImageField,
    plan: Option<&Plan>,
    teams: &[TeamCheck],
    escalate: bool,
    answers: &Answers,
) -> Outcome {
    let admitted = match outcome {
        Outcome::Failed(f) => {
            return Outcome::Failed(if escalate && f.mode == Mode::Warn {
                Finding {
                    mode: Mode::Enforce,
                    ..f
                }
            } else {
                f
            });
        }
        Outcome::NeedsLookup { .. } => return outcome,
        o => o,
    };
    let Some(p) = plan else { return admitted };
    for c in teams {
        let refusal = match &c.verdict {
            TeamVerdict::Pass => continue,
            TeamVerdict::Denied { rule } => Denial::StaticDeny {
                rule: rule.clone(),
                source: None,
            },
            TeamVerdict::NotAllowed => Denial::NoRule,
            TeamVerdict::Verify { rule, .. } => {
                if answers.offline {
                    // The team's signatures were not checked: say so, as for
                    // the cluster's, instead of passing silently.
                    let rewrite = p.rewritten().then(|| p.final_image(None));
                    return Outcome::NeedsLookup {
                        rule: format!("{}, rule {rule}", c.policy),
                        new: rewrite,
                    };
                }
                let Some(digest) = running_digest(p, &answers.digests) else {
                    continue;
                };
                match answers.reports.get(&c.key(rule, digest.clone())) {
                    Some(r) if r.satisfied() => continue,
                    Some(r) => Denial::Unverified {
                        rule: rule.clone(),
                        source: None,
                        target: p.target.pinned(digest).to_string(),
                        report: r.clone(),
                    },
                    None => continue,
                }
            }
        };
        return Outcome::Failed(Finding {
            image: field.value.clone(),
            field: field.clone(),
            denial: Denial::TeamPolicy {
                policy: c.policy.to_string(),
                refusal: Box::new(refusal),
            },
            mode: c.mode,
            waiver: None,
        });
    }
    admitted
}
