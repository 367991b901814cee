//! The per-object decision: every front end's one place to ask "what happens
//! to this object?".
//!
//! Owns the rules that decide an object as a whole — which requests pass
//! untouched (DELETE, CONNECT, finalizer removal on terminating objects,
//! exempt namespaces), which namespace an object counts as being in, the
//! UPDATE downgrade for images the object already ran, whether an object is
//! patched or only checked (`spec.pin.scope`), and which lookups and
//! signature checks a decision needs. The webhook, `sigil pin`, `sigil krm`
//! (and `sigil audit`) gather the facts, run the lookups this plan names, and
//! render the [`ObjectVerdict`] it returns; none of them decides anything.
//! It does no I/O: the answers arrive as plain data in [`Answers`].

use std::collections::HashMap;
use std::sync::Arc;

use crate::credentials::PullContext;
use crate::decision::{Finding, Outcome, decide};
use crate::denial::{Denial, Mode};
use crate::exception::{Exception, Waiver};
use crate::failure::ResolveFailure;
use crate::patch::Replacement;
pub use crate::policy::RuleRef;
use crate::policy::{Labels, Plan, Policy, Scope, Step, TeamVerdict, default_labels};
use crate::reference::{Digest, Reference};
use crate::verify::{Verification, VerificationReport};
use crate::walker::{ImageField, ObjectSummary};

/// The operation an object arrives with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    /// A new object (and every manifest decided client side).
    Create,
    /// A change to an existing object.
    Update,
    /// Deletion: always passes.
    Delete,
    /// `kubectl exec`/`attach`/`port-forward`: always passes.
    Connect,
    /// Anything else the API server might send one day: passes.
    Other,
}

impl Operation {
    /// Reads an AdmissionReview's `operation`.
    pub fn parse(s: &str) -> Operation {
        match s {
            "CREATE" => Operation::Create,
            "UPDATE" => Operation::Update,
            "DELETE" => Operation::Delete,
            "CONNECT" => Operation::Connect,
            _ => Operation::Other,
        }
    }
}

/// Where the object comes from, which decides whether it may be patched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// An AdmissionReview: `spec.pin.scope` says which kinds are patched.
    Admission,
    /// A manifest (`sigil pin`, `sigil krm`): every kind is pinned, since
    /// pinning the manifests in Git is the whole purpose.
    Manifest,
}

/// Why an object passes untouched, without looking at its images.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Skip {
    /// DELETE, CONNECT or an unknown operation.
    Operation,
    /// An UPDATE of an object marked for deletion: only finalizer removal
    /// and status changes remain, and blocking them keeps it alive forever.
    Terminating,
    /// The namespace is in the policy's `exemptNamespaces`.
    ExemptNamespace,
    /// The request carries no object to look at.
    NoObject,
}

impl Skip {
    /// Label for logs and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Skip::Operation => "operation",
            Skip::Terminating => "terminating",
            Skip::ExemptNamespace => "exempt-namespace",
            Skip::NoObject => "no-object",
        }
    }
}

/// The one rule for the namespace an object counts as being in (for
/// exemptions and messages): the request's namespace, else the object's
/// `metadata.namespace`, else `default` — the namespace a manifest without
/// one is applied to (`sigil pin --namespace`, kubectl's context). Empty
/// strings count as absent. The webhook passes no default: a cluster-scoped
/// object is in no namespace.
pub fn effective_namespace<'a>(
    request: Option<&'a str>,
    metadata: Option<&'a str>,
    default: Option<&'a str>,
) -> Option<&'a str> {
    [request, metadata, default]
        .into_iter()
        .flatten()
        .find(|n| !n.is_empty())
}

/// What a front end knows about one object before deciding it.
#[derive(Debug, Clone)]
pub struct ObjectFacts<'a> {
    /// The operation.
    pub operation: Operation,
    /// Where the object comes from.
    pub source: Source,
    /// `kind` of the object (from the request, else the object).
    pub kind: &'a str,
    /// The namespace, chosen by [`effective_namespace`].
    pub namespace: Option<&'a str>,
    /// The object's walk, if there is an object (moved into the plan).
    pub object: Option<ObjectSummary>,
    /// The previous object's walk, on UPDATE.
    pub old_object: Option<&'a ObjectSummary>,
    /// The namespace's labels, for rules with a `namespaceSelector`; when
    /// `None`, only `kubernetes.io/metadata.name` is assumed.
    pub namespace_labels: Option<&'a Labels>,
}

/// One signature check: the same digest under the same rule is checked once.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct VerifyKey {
    /// The digest that will run.
    pub digest: Digest,
    /// Rule whose verifiers apply.
    pub rule: Arc<str>,
}

/// A signature check the decision needs: what to check and where to look.
/// It borrows the plan it was made from (one per verified image per
/// admission: cloning the image's reference for each was a measurable
/// share of a cached attested admission).
#[derive(Debug, Clone)]
pub struct VerifyJob<'a> {
    /// Identity of the check (digest + rule).
    pub key: VerifyKey,
    /// Where signatures are read from.
    pub repository: &'a Reference,
    /// Where the image itself is read from (its index, for `signedAt`).
    pub image: &'a Reference,
    /// What the rule requires.
    pub verification: &'a Arc<Verification>,
}

/// The maps of one decision's answers: keyed by references and digests an
/// admission names (at most `maxLookups` of them), hashed with a fast
/// per-process seeded hasher — SipHash over a reference's strings was a
/// measurable share of a cached admission.
pub type AnswerMap<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

/// The I/O answers a decision is made from.
#[derive(Debug, Default)]
pub struct Answers {
    /// Registry lookups were not made (`--offline`): plans that need one
    /// are reported as [`Outcome::NeedsLookup`].
    pub offline: bool,
    /// Tag → digest answers, per lookup target.
    pub digests: AnswerMap<Reference, Result<Digest, ResolveFailure>>,
    /// Signature reports, per check.
    pub reports: AnswerMap<VerifyKey, Arc<VerificationReport>>,
    /// The instant of the decision (unix seconds), for exceptions' expiry;
    /// `None` applies no exception.
    pub now: Option<i64>,
}

/// What must be looked up before an object can be decided.
#[derive(Debug, Clone)]
pub enum ObjectPlan {
    /// The object passes untouched; nothing to look up.
    Skip(Skip),
    /// Its image fields, each planned by the policy.
    Fields(FieldPlans),
}

/// Every image field of an object with its plan.
#[derive(Debug, Clone)]
pub struct FieldPlans {
    fields: Vec<ImageField>,
    plans: Vec<Result<Arc<Plan>, Denial>>,
    patchable: bool,
    /// Images the old object had (pointer, value), for the UPDATE downgrade.
    old: Vec<(String, String)>,
    /// Per field, what each of the namespace's ImagePolicies says (AND).
    teams: Vec<Vec<TeamCheck>>,
    /// A namespace ImagePolicy with `mode: enforce` makes the cluster's
    /// warn-mode failures block.
    escalate: bool,
    /// The secrets the object's Pods may pull with.
    pull: PullContext,
    /// The namespace's accepted `ImagePolicyException`s (expiry is checked
    /// when deciding).
    exceptions: Vec<Arc<Exception>>,
}

/// The decision for one object.
#[derive(Debug, Clone, Default)]
pub struct ObjectVerdict {
    /// Why the object passed without a look, if it did.
    pub skipped: Option<Skip>,
    /// Every image field, in walker order, with its outcome.
    pub fields: Vec<FieldVerdict>,
    /// Whether changes are applied to this object (else only checked).
    pub patchable: bool,
}

/// The decision for one image field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldVerdict {
    /// Where the image is.
    pub field: ImageField,
    /// What happens to it.
    pub outcome: Outcome,
    /// The signature report, when its rule verifies and a check ran.
    pub report: Option<Arc<VerificationReport>>,
    /// The rule that decided it (a team policy's when that one refused),
    /// for reports; `None` when no rule applies (an invalid reference, no
    /// matching rule).
    pub rule: Option<RuleRef>,
    /// Set when no mirror had the image and it was pinned at its origin.
    pub fallback: Option<Arc<crate::policy::FellBack>>,
}

impl FieldVerdict {
    /// A stable one-word (or `word:kind`) label of the outcome, the same
    /// from every front end: `unchanged`, `pinned`, `rewritten`,
    /// `needs-lookup`, `denied:<reason>`, `warned:<reason>`,
    /// `excepted:<reason>` (an exception made it a warning).
    pub fn label(&self) -> std::borrow::Cow<'static, str> {
        match &self.outcome {
            Outcome::Unchanged { .. } => "unchanged".into(),
            Outcome::Changed {
                pinned: Some(_), ..
            } => "pinned".into(),
            Outcome::Changed { pinned: None, .. } => "rewritten".into(),
            Outcome::NeedsLookup { .. } => "needs-lookup".into(),
            Outcome::Failed(f) => match (f.mode, &f.waiver) {
                (_, Some(_)) => format!("excepted:{}", f.denial.kind()).into(),
                (Mode::Enforce, None) => format!("denied:{}", f.denial.kind()).into(),
                (Mode::Warn, None) => format!("warned:{}", f.denial.kind()).into(),
            },
        }
    }

    /// Whether this field blocks the object.
    pub fn denies(&self) -> bool {
        matches!(&self.outcome, Outcome::Failed(f) if f.mode == Mode::Enforce)
    }

    /// The verifiers that vouched for this image, if it was verified and admitted.
    /// (Its report: [`VerificationReport::vouched`] names them.)
    pub fn vouched_by(&self) -> Option<&VerificationReport> {
        let r = self.report.as_deref()?;
        (r.satisfied() && !matches!(self.outcome, Outcome::Failed(_))).then_some(r)
    }
}

impl ObjectVerdict {
    /// Fields that must change, with their new values (empty when not patchable).
    pub fn changes(&self) -> Vec<Replacement<'_>> {
        self.fields
            .iter()
            .filter_map(|v| match &v.outcome {
                Outcome::Changed { new, .. } => Some(Replacement {
                    field: &v.field,
                    new: new.as_str(),
                }),
                _ => None,
            })
            .collect()
    }

    /// Whether any field blocks the object.
    pub fn denied(&self) -> bool {
        self.fields.iter().any(FieldVerdict::denies)
    }
}

/// Plans one object: the skip rules first, then every image field through
/// the policy. Pure; the lookups it names are run by the caller.
pub fn plan_object(policy: &Policy, facts: ObjectFacts<'_>) -> ObjectPlan {
    let terminating = facts.object.as_ref().is_some_and(|o| o.terminating)
        || facts.old_object.is_some_and(|o| o.terminating);
    match facts.operation {
        Operation::Delete | Operation::Connect | Operation::Other => {
            return ObjectPlan::Skip(Skip::Operation);
        }
        Operation::Update if terminating => return ObjectPlan::Skip(Skip::Terminating),
        Operation::Create | Operation::Update => {}
    }
    if facts.namespace.is_some_and(|ns| policy.is_exempt(ns)) {
        return ObjectPlan::Skip(Skip::ExemptNamespace);
    }
    let Some(mut object) = facts.object else {
        return ObjectPlan::Skip(Skip::NoObject);
    };
    // Images in custom resources, where the policy's extractors say.
    policy.extractors.apply(&mut object);
    let pull = PullContext::of(
        facts.namespace.unwrap_or_default(),
        facts.kind,
        &object.pull_secrets,
        object.service_account.as_deref(),
    );
    let mut fields = object.fields;
    let known;
    let labels = match (facts.namespace_labels, facts.namespace) {
        (Some(l), _) => Some(l),
        // Only rules with a namespaceSelector read labels.
        (None, Some(_)) if !policy.has_namespace_selectors() => None,
        (None, Some(ns)) => {
            known = default_labels(ns);
            Some(&known)
        }
        (None, None) => None,
    };
    let mut plans: Vec<Result<Arc<Plan>, Denial>> = fields
        .iter()
        .map(|f| policy.plan_shared(&f.value, labels))
        .collect();
    for p in object.problems {
        fields.push(p.field);
        plans.push(Err(Denial::NotAnImage { what: p.what }));
    }
    let team_policies = facts
        .namespace
        .and_then(|ns| policy.namespaced.get(ns))
        .map(Vec::as_slice)
        .unwrap_or_default();
    let teams = plans
        .iter()
        .map(|p| match p {
            Ok(p) => team_policies
                .iter()
                .map(|t| TeamCheck {
                    policy: t.display_shared(),
                    mode: t.mode,
                    verdict: t.judge(&p.origin),
                })
                .collect(),
            Err(_) => Vec::new(),
        })
        .collect();
    let escalate = team_policies.iter().any(|t| t.mode == Mode::Enforce);
    let exceptions = facts
        .namespace
        .and_then(|ns| policy.exceptions.get(ns))
        .cloned()
        .unwrap_or_default();
    let old = match (facts.operation, facts.old_object) {
        (Operation::Update, Some(o)) => o
            .fields
            .iter()
            .map(|f| (f.pointer.clone(), f.value.clone()))
            .collect(),
        _ => Vec::new(),
    };
    ObjectPlan::Fields(FieldPlans {
        fields,
        plans,
        patchable: facts.source == Source::Manifest
            || policy.scope == Scope::Workloads
            || facts.kind == "Pod",
        old,
        pull,
        teams,
        escalate,
        exceptions,
    })
}

/// One namespace ImagePolicy's word on one image field.
#[derive(Debug, Clone)]
struct TeamCheck {
    /// `ImagePolicy ns/name`.
    policy: std::sync::Arc<str>,
    mode: Mode,
    verdict: TeamVerdict,
}

impl TeamCheck {
    /// The verification key of its signature requirement on `digest`.
    fn key(&self, rule: &str, digest: Digest) -> VerifyKey {
        VerifyKey {
            digest,
            rule: format!("{}, rule {rule}", self.policy).into(),
        }
    }
}

impl ObjectPlan {
    /// The secrets the object's Pods may pull with (`None` when skipped).
    pub fn pull_context(&self) -> Option<&PullContext> {
        match self {
            ObjectPlan::Fields(f) => Some(&f.pull),
            ObjectPlan::Skip(_) => None,
        }
    }

    /// Distinct registry lookups (tags to resolve), in field order.
    pub fn lookups(&self) -> Vec<&Reference> {
        let mut out: Vec<&Reference> = Vec::new();
        if let ObjectPlan::Fields(f) = self {
            for p in f.plans.iter().flatten() {
                if p.step == Step::Resolve && !out.contains(&&p.target) {
                    out.push(&p.target);
                }
            }
        }
        out
    }

    /// The plan with every field that needs a lookup denied
    /// ([`Denial::TooManyLookups`]) when the object needs more than `limit`
    /// distinct ones; unchanged otherwise.
    /// (A lookup is a tag to resolve or a pinned image whose signatures
    /// must be fetched.)
    pub fn limit_lookups(mut self, limit: usize) -> ObjectPlan {
        let ObjectPlan::Fields(f) = &mut self else {
            return self;
        };
        let needs_io =
            |p: &Plan| p.step == Step::Resolve || (p.step == Step::Keep && p.verify.is_some());
        let lookups = f
            .plans
            .iter()
            .flatten()
            .filter(|p| needs_io(p))
            .map(|p| &p.target)
            .collect::<std::collections::HashSet<_, foldhash::fast::RandomState>>()
            .len();
        if lookups > limit {
            for p in &mut f.plans {
                if p.as_deref().is_ok_and(needs_io) {
                    *p = Err(Denial::TooManyLookups { lookups, limit });
                }
            }
        }
        self
    }

    /// Distinct signature checks, given the lookup answers: each verifying
    /// plan's digest is the one that will run (resolved, or as written).
    pub fn verifications(
        &self,
        digests: &AnswerMap<Reference, Result<Digest, ResolveFailure>>,
    ) -> Vec<VerifyJob<'_>> {
        let mut jobs: Vec<VerifyJob> = Vec::new();
        let ObjectPlan::Fields(f) = self else {
            return jobs;
        };
        for p in f.plans.iter().flatten() {
            let (Some(v), Some(key)) = (&p.verify, verify_key(p, digests)) else {
                continue;
            };
            if jobs.iter().any(|j| j.key == key) {
                continue;
            }
            jobs.push(VerifyJob {
                key,
                repository: signature_repository(p, v),
                image: &p.target,
                verification: v,
            });
        }
        for (p, checks) in f.plans.iter().zip(&f.teams) {
            let Ok(p) = p else { continue };
            for c in checks {
                let TeamVerdict::Verify { rule, verification } = &c.verdict else {
                    continue;
                };
                let Some(digest) = running_digest(p, digests) else {
                    continue;
                };
                let key = c.key(rule, digest);
                if jobs.iter().any(|j| j.key == key) {
                    continue;
                }
                jobs.push(VerifyJob {
                    key,
                    repository: signature_repository(p, verification),
                    image: &p.target,
                    verification,
                });
            }
        }
        jobs
    }

    /// The verdict, from the answers to [`Self::lookups`] and [`Self::verifications`].
    pub fn decide(self, answers: &Answers) -> ObjectVerdict {
        let f = match self {
            ObjectPlan::Skip(s) => {
                return ObjectVerdict {
                    skipped: Some(s),
                    ..ObjectVerdict::default()
                };
            }
            ObjectPlan::Fields(f) => f,
        };
        let fields = f
            .fields
            .into_iter()
            .zip(&f.plans)
            .zip(&f.teams)
            .map(|((field, plan), teams)| {
                let plan = plan.as_deref();
                let (outcome, report) = decide_field(&field, plan, answers);
                let outcome = apply_teams(outcome, &field, plan.ok(), teams, f.escalate, answers);
                let outcome = downgrade_unchanged(outcome, &field, &f.old);
                let rule = RuleRef::of(&outcome, plan.ok());
                let outcome = waive(outcome, plan.ok(), rule.as_ref(), &f.exceptions, answers);
                FieldVerdict {
                    field,
                    outcome,
                    report,
                    rule,
                    fallback: plan.ok().and_then(|p| p.fallback.clone()),
                }
            })
            .collect();
        ObjectVerdict {
            skipped: None,
            fields,
            patchable: f.patchable,
        }
    }
}

fn decide_field(
    field: &ImageField,
    plan: Result<&Plan, &Denial>,
    answers: &Answers,
) -> (Outcome, Option<Arc<VerificationReport>>) {
    let Ok(p) = plan else {
        return (decide(field, plan, None, None), None);
    };
    let needs_io = p.step == Step::Resolve || (p.step == Step::Keep && p.verify.is_some());
    if answers.offline && needs_io {
        // The lookup was never tried: report it, and still apply the mirror.
        let rewrite = p.rewritten().then(|| p.final_image(None));
        return (
            Outcome::NeedsLookup {
                rule: p.rule.to_string(),
                new: rewrite,
            },
            None,
        );
    }
    let resolved = (p.step == Step::Resolve)
        .then(|| answers.digests.get(&p.target))
        .flatten();
    let report = verify_key(p, &answers.digests).and_then(|k| answers.reports.get(&k).cloned());
    (decide(field, plan, resolved, report.as_ref()), report)
}

/// The digest an image will run as, if known: resolved, or as written.
fn running_digest(
    p: &Plan,
    digests: &AnswerMap<Reference, Result<Digest, ResolveFailure>>,
) -> Option<Digest> {
    match p.step {
        Step::Resolve => digests.get(&p.target)?.as_ref().ok().cloned(),
        Step::Deny => None,
        Step::Keep => p.target.digest().cloned(),
    }
}

/// The digest a verifying plan will run, if known.
fn verify_key(
    p: &Plan,
    digests: &AnswerMap<Reference, Result<Digest, ResolveFailure>>,
) -> Option<VerifyKey> {
    p.verify.as_ref()?;
    let digest = match p.step {
        Step::Resolve => digests.get(&p.target)?.as_ref().ok()?.clone(),
        _ => p.target.digest()?.clone(),
    };
    Some(VerifyKey {
        digest,
        rule: p.rule.clone(),
    })
}

/// Where signatures are looked up: `signatures.repository`, else where the
/// image is pulled from (the mirror, after rewrite).
pub fn signature_repository<'a>(p: &'a Plan, v: &'a Verification) -> &'a Reference {
    v.signatures_repository.as_ref().unwrap_or(&p.target)
}

mod adjust;
use adjust::{downgrade_unchanged, waive};
mod failover;
mod teams;
use teams::apply_teams;

#[cfg(test)]
mod exception_tests;
#[cfg(test)]
mod tests;
