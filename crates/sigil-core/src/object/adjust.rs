//! What happens to a field's outcome after its rules decided it: the
//! UPDATE downgrade for images the object already ran, and the
//! `ImagePolicyException`s in force that turn a failure into a warning.
//! Neither can make a refusal out of an admission.

use super::*;

/// On UPDATE, an image that the old object already had is not new to the
/// cluster: failing to resolve it again (or to fetch its signatures) warns
/// instead of blocking unrelated edits (labels, replicas) of a running
/// workload. Static denials and failed signatures still block.
pub(super) fn downgrade_unchanged(
    outcome: Outcome,
    field: &ImageField,
    old: &[(String, String)],
) -> Outcome {
    let Outcome::Failed(f) = outcome else {
        return outcome;
    };
    let unchanged = old
        .iter()
        .any(|(p, v)| *p == field.pointer && *v == field.value);
    let lookup_failed = f.denial.lookup_failed();
    if unchanged && lookup_failed && f.mode == Mode::Enforce {
        return Outcome::Failed(Finding {
            mode: Mode::Warn,
            ..f
        });
    }
    Outcome::Failed(f)
}

/// A failure an `ImagePolicyException` in force waives becomes a warning
/// naming it (the image is admitted as written); everything else stays.
/// Exceptions apply to the namespace's objects only (they were planned so),
/// to the rules they name, and only while `answers.now` is before `expires`.
pub(super) fn waive(
    outcome: Outcome,
    plan: Option<&Plan>,
    rule: Option<&RuleRef>,
    exceptions: &[Arc<Exception>],
    answers: &Answers,
) -> Outcome {
    let (Outcome::Failed(f), Some(p), Some(rule), Some(now)) = (&outcome, plan, rule, answers.now)
    else {
        return outcome;
    };
    if exceptions.is_empty() {
        return outcome;
    }
    // The digest that runs; for a static deny (nothing resolved) the one written.
    let digest = running_digest(p, &answers.digests).or_else(|| p.target.digest().cloned());
    let Some(e) = exceptions.iter().find(|e| {
        e.active_at(now)
            && e.covers(
                &p.origin,
                digest.as_ref(),
                &rule.name,
                rule.source.as_deref(),
            )
    }) else {
        return outcome;
    };
    Outcome::Failed(Finding {
        mode: Mode::Warn,
        waiver: Some(Arc::new(Waiver::of(e))),
        ..f.clone()
    })
}
