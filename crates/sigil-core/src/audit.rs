//! What an audit says about an object that already exists: the webhook's
//! verdict for it (the same [`crate::plan_object`] decision, made as if the
//! object were created now) read as compliance, plus what only a running Pod
//! can show — the digest it really runs (`status.containerStatuses[].imageID`).
//!
//! Owns the audit reasons and their stable labels (used in reports, metrics
//! and Events), the rule for which verdicts are violations, and reading
//! running digests out of a Pod. It does no I/O: `sigil audit` and the
//! in-cluster audit list objects, run the decision, and render this.

use serde::Serialize;
use serde_json::Value;

use crate::decision::Outcome;
use crate::denial::{Denial, Mode};
use crate::object::{ObjectVerdict, Skip};
use crate::reference::{Digest, Reference};
use crate::walker::{FieldKind, ImageField};

/// Why an image field does not comply. The labels are a stable interface:
/// they appear in JSON reports, in `sigil_audit_violations{reason}` and in
/// Events.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Reason {
    /// Runs by tag: the webhook would have pinned it.
    NotPinned,
    /// Pulled from where the policy mirrors it away from.
    NotMirrored,
    /// A rule denies it (deny pattern, no matching rule, invalid reference).
    Denied,
    /// Its signatures do not satisfy the rule (the verifier's reason).
    Signature,
    /// Its signatures pass (or none are asked for) but a required
    /// attestation is missing, unverified, or fails a condition.
    Attestation,
    /// Its tag cannot be resolved now (the registry's reason).
    Unresolvable,
    /// The Pod runs a different digest than its spec pins, or its tag now
    /// resolves elsewhere.
    Drift,
}

impl Reason {
    /// Every reason, in report order.
    pub const ALL: [Reason; 7] = [
        Reason::Denied,
        Reason::Signature,
        Reason::Attestation,
        Reason::Unresolvable,
        Reason::NotMirrored,
        Reason::NotPinned,
        Reason::Drift,
    ];

    /// The stable label.
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::NotPinned => "not_pinned",
            Reason::NotMirrored => "not_mirrored",
            Reason::Denied => "denied",
            Reason::Signature => "signature",
            Reason::Attestation => "attestation",
            Reason::Unresolvable => "unresolvable",
            Reason::Drift => "drift",
        }
    }
}

/// How one object came out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ObjectResult {
    /// Every image field complies.
    Compliant,
    /// At least one violation.
    Violating,
    /// In an exempt namespace: not checked, as the webhook would not.
    Exempt,
}

impl ObjectResult {
    /// The stable label (`sigil_audit_objects{result}`).
    pub fn as_str(self) -> &'static str {
        match self {
            ObjectResult::Compliant => "compliant",
            ObjectResult::Violating => "violating",
            ObjectResult::Exempt => "exempt",
        }
    }
}

/// One reason an image field does not comply.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Violation {
    /// Why, as a stable label.
    pub reason: Reason,
    /// Whether the rule enforces (the webhook would refuse it) or only warns.
    pub mode: Mode,
    /// What is wrong, in words.
    pub detail: String,
    /// How to fix it.
    pub fix: String,
    /// The `ImagePolicyException` that waives it for now (then `mode` is
    /// `warn` and reports show it as excepted).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exception: Option<crate::exception::Waiver>,
}

/// The audit of one image field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldAudit {
    /// Where the image is.
    pub field: ImageField,
    /// The webhook's verdict label ([`crate::FieldVerdict::label`]), or
    /// `exempt`: the same words every front end uses.
    pub verdict: String,
    /// The digest the policy says it should run, when known.
    pub expected: Option<Digest>,
    /// The digest it runs (Pods), when the runtime reports a repo digest.
    pub running: Option<Digest>,
    /// Empty when compliant.
    pub violations: Vec<Violation>,
    /// The rule that decided it (none when exempt or no rule applies).
    pub rule: Option<crate::object::RuleRef>,
}

/// The audit of one object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectAudit {
    /// Compliant, violating or exempt.
    pub result: ObjectResult,
    /// Every image field, in walker order.
    pub fields: Vec<FieldAudit>,
}

/// A container's running image, from a Pod's status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Running {
    /// Which list the status came from.
    pub kind: FieldKind,
    /// The container's name.
    pub name: String,
    /// The repo digest in `imageID`, if it names one.
    pub digest: Option<Digest>,
}

/// The running images of a Pod (`status.containerStatuses`,
/// `initContainerStatuses`, `ephemeralContainerStatuses`). `imageID` is
/// `[docker-pullable://]repo@sha256:…` under containerd, CRI-O and
/// cri-dockerd; a bare `sha256:…` is the local image ID, not a repo digest,
/// and says nothing comparable.
pub fn running_images(pod: &Value) -> Vec<Running> {
    let mut out = Vec::new();
    for (key, kind) in STATUS_LISTS {
        let Some(list) = pod["status"][key].as_array() else {
            continue;
        };
        for s in list {
            if let Some(name) = s["name"].as_str() {
                out.push(Running::of(kind, name, s["imageID"].as_str()));
            }
        }
    }
    out
}

/// The Pod status lists [`running_images`] reads, and what each holds.
pub const STATUS_LISTS: [(&str, FieldKind); 3] = [
    ("containerStatuses", FieldKind::Container),
    ("initContainerStatuses", FieldKind::InitContainer),
    ("ephemeralContainerStatuses", FieldKind::EphemeralContainer),
];

impl Running {
    /// One container status: its name and `imageID` (see [`running_images`]).
    pub fn of(kind: FieldKind, name: &str, image_id: Option<&str>) -> Running {
        let digest = image_id
            .and_then(|id| id.rsplit_once('@'))
            .and_then(|(_, d)| Digest::parse(d).ok());
        Running {
            kind,
            name: name.to_owned(),
            digest,
        }
    }
}

/// Reads a verdict as an audit. `fields` are the object's image fields,
/// read only when the verdict skipped an exempt namespace (whose verdict
/// lists none; a caller may pass them only then); `running` is what
/// [`running_images`] found (empty for everything but Pods).
///
/// A change the webhook would make is a violation only where the webhook
/// makes it: for kinds it only checks (`spec.pin.scope: pods` and a
/// workload), their Pods are pinned and rewritten as they are created.
pub fn audit_object(
    verdict: ObjectVerdict,
    fields: &[ImageField],
    running: &[Running],
) -> ObjectAudit {
    if verdict.skipped == Some(Skip::ExemptNamespace) {
        return ObjectAudit {
            result: ObjectResult::Exempt,
            fields: fields
                .iter()
                .map(|f| FieldAudit {
                    field: f.clone(),
                    verdict: "exempt".into(),
                    expected: None,
                    running: None,
                    violations: Vec::new(),
                    rule: None,
                })
                .collect(),
        };
    }
    let patchable = verdict.patchable;
    let fields: Vec<FieldAudit> = verdict
        .fields
        .into_iter()
        .map(|v| {
            let mut violations = Vec::new();
            // Only a reference with `@` has a digest to read: most images
            // run by tag, and parsing is the costliest step here.
            let written = v
                .field
                .value
                .contains('@')
                .then(|| Reference::parse(&v.field.value).ok())
                .flatten();
            let expected = match &v.outcome {
                Outcome::Unchanged { .. } => written.as_ref().and_then(|r| r.digest().cloned()),
                Outcome::Changed { pinned, .. } => pinned
                    .clone()
                    .or_else(|| written.as_ref().and_then(|r| r.digest().cloned())),
                _ => None,
            };
            match &v.outcome {
                Outcome::Changed {
                    new,
                    rewritten,
                    pinned,
                    ..
                } if patchable => {
                    if *rewritten {
                        violations.push(Violation {
                            reason: Reason::NotMirrored,
                            mode: Mode::Enforce,
                            detail: format!("pulled from where the policy mirrors it away from; the webhook would run {new}"),
                            fix: "push the image to the mirror and point the manifest at it (sigil pin does both), then roll the workload".into(),
                            exception: None,
                        });
                    }
                    if let Some(d) = pinned {
                        violations.push(Violation {
                            reason: Reason::NotPinned,
                            mode: Mode::Enforce,
                            detail: format!("runs by tag; the tag resolves to {d} now"),
                            fix: "pin the manifest by digest (sigil pin) and roll the workload".into(),
                            exception: None,
                        });
                    }
                }
                Outcome::Failed(f) => violations.push(Violation {
                    reason: reason_of(&f.denial),
                    mode: f.mode,
                    detail: f.denial.why(),
                    fix: f.denial.hint().into(),
                    exception: f.waiver.as_deref().cloned(),
                }),
                Outcome::NeedsLookup { .. } => violations.push(Violation {
                    reason: Reason::Unresolvable,
                    mode: Mode::Enforce,
                    detail: "was not looked up (offline)".into(),
                    fix: "run the audit with registry access".into(),
                    exception: None,
                }),
                _ => {}
            }
            let run = running
                .iter()
                .find(|r| r.kind == v.field.kind && Some(&r.name) == v.field.name.as_ref())
                .and_then(|r| r.digest.clone());
            if let (Some(want), Some(got)) = (&expected, &run)
                && want != got
            {
                let by_tag = written.as_ref().is_none_or(|r| r.digest().is_none());
                violations.push(Violation {
                    reason: Reason::Drift,
                    mode: Mode::Enforce,
                    detail: if by_tag {
                        format!("runs {got}, but its tag now resolves to {want}")
                    } else {
                        format!("runs {got}, not the {want} its spec pins")
                    },
                    fix: "find out what changed the running image (a mutable tag, a node-local image, another mutator), then pin and roll the workload".into(),
                    exception: None,
                });
            }
            FieldAudit {
                verdict: v.label().into_owned(),
                field: v.field,
                expected,
                running: run,
                violations,
                rule: v.rule,
            }
        })
        .collect();
    let result = if fields.iter().any(|f| !f.violations.is_empty()) {
        ObjectResult::Violating
    } else {
        ObjectResult::Compliant
    };
    ObjectAudit { result, fields }
}

/// For an image its Pod runs from the origin because no mirror could serve
/// it when it was admitted (`fallback: origin` pinned it there): the first
/// mirror's name for it by tag, and the digest it runs, so the audit can ask
/// whether that mirror has it now. `None` for anything else.
pub fn mirror_to_check(policy: &crate::Policy, written: &str) -> Option<(Reference, Digest)> {
    // Most policies have no fallback: then no image is planned twice.
    if !policy.mirrors.iter().any(|m| m.fallback_origin()) {
        return None;
    }
    let plan = policy.plan(written).ok()?;
    let f = plan.failover.as_ref()?;
    let digest = plan.reference.digest()?.clone();
    let tag = plan.reference.tag()?;
    if !f.fallback || plan.reference.name_str() != plan.origin.name_str() {
        return None;
    }
    let mirror = policy.mirror_of(&plan.origin);
    if mirror.name_str() == plan.origin.name_str() {
        return None;
    }
    let by_tag = Reference::parse(&format!("{}:{tag}", mirror.name())).ok()?;
    Some((by_tag, digest))
}

/// Records that `field` runs from the origin although `mirror` (by tag)
/// serves the digest it runs now.
pub fn not_mirrored_now(field: &mut FieldAudit, mirror: &Reference) {
    field.violations.push(Violation {
        reason: Reason::NotMirrored,
        mode: Mode::Warn,
        detail: format!(
            "runs from the origin, where it was pinned when no mirror could serve it; {mirror} serves the same digest now"
        ),
        fix: "apply the workload again as written (by tag): the webhook now pins it to the mirror (or run sigil pin)".into(),
        exception: None,
    });
}

/// The audit reason for a denial (a team policy's by its own reason).
fn reason_of(d: &Denial) -> Reason {
    match d {
        Denial::InvalidReference { .. }
        | Denial::NotAnImage { .. }
        | Denial::NoRule
        | Denial::StaticDeny { .. }
        | Denial::TooManyLookups { .. } => Reason::Denied,
        Denial::Unresolved { .. } if d.not_at_mirror() => Reason::NotMirrored,
        Denial::Unresolved { .. } => Reason::Unresolvable,
        Denial::Unverified { report, .. } if report.only_attestations_failed() => {
            Reason::Attestation
        }
        Denial::Unverified { .. } => Reason::Signature,
        Denial::TeamPolicy { refusal, .. } => reason_of(refusal),
    }
}

#[cfg(test)]
mod tests;
