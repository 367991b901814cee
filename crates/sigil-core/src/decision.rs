//! Outcomes, and the one place they are rendered in words.
//!
//! The webhook's status message, its warnings, the CLI's lines and KRM results
//! all come from [`Finding::message`], so a user sees the same words — what,
//! why, and how to fix — wherever sigil refuses or warns; [`decide`] turns a
//! plan step and the lookups' answers into one image's [`Outcome`]. The
//! reasons themselves are [`crate::denial`]'s, registry failures
//! [`crate::failure`]'s. This module does no I/O.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;

use crate::denial::{Denial, Mode};
use crate::failure::ResolveFailure;
use crate::policy::Plan;
use crate::reference::Digest;
use crate::verify::VerificationReport;
use crate::walker::ImageField;

/// The object a finding is about, for messages.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ObjectRef {
    /// e.g. `Deployment`
    pub kind: String,
    /// May be empty for cluster-scoped or generated-name objects.
    pub namespace: String,
    /// `metadata.name`, or `generateName` + `*`.
    pub name: String,
}

impl ObjectRef {
    /// Names an object the way messages do: `metadata.name`, else
    /// `generateName` followed by `*` (the API server has not named it yet).
    pub fn new(
        kind: &str,
        namespace: &str,
        name: Option<&str>,
        generate_name: Option<&str>,
    ) -> ObjectRef {
        let name = match (name.filter(|n| !n.is_empty()), generate_name) {
            (Some(n), _) => n.to_owned(),
            (None, Some(g)) if !g.is_empty() => format!("{g}*"),
            _ => String::new(),
        };
        ObjectRef {
            kind: kind.to_owned(),
            namespace: namespace.to_owned(),
            name,
        }
    }
}

impl fmt::Display for ObjectRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = if self.kind.is_empty() {
            "object"
        } else {
            &self.kind
        };
        match (self.namespace.is_empty(), self.name.is_empty()) {
            (_, true) => write!(f, "{kind} (unnamed)"),
            (true, false) => write!(f, "{kind} {}", self.name),
            (false, false) => write!(f, "{kind} {}/{}", self.namespace, self.name),
        }
    }
}

/// A denial or warning tied to the field it concerns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    /// The image as written.
    pub image: String,
    /// Where it was found.
    pub field: ImageField,
    /// Why.
    pub denial: Denial,
    /// Whether it blocks (`Enforce`) or only warns.
    pub mode: Mode,
    /// The exception that turned it into a warning, if one did.
    pub waiver: Option<Arc<crate::exception::Waiver>>,
}

impl Finding {
    /// The one rendering of a denial: what, where, why, how to fix.
    pub fn message(&self, object: &ObjectRef) -> String {
        let waived = self
            .waiver
            .as_ref()
            .map(|w| {
                format!(
                    " (excepted by {} until {}: {})",
                    w.exception, w.expires, w.reason
                )
            })
            .unwrap_or_default();
        // Names and registry answers come from outside: a denial kubectl
        // prints must not carry terminal escapes (see `crate::text`).
        crate::text::escape_controls(&format!(
            "image {:?} in {} of {}: {}; to fix: {}{waived}",
            self.image,
            self.field.describe(),
            object,
            self.denial.why(),
            self.denial.hint()
        ))
        .into_owned()
    }

    /// A shorter form for admission warnings (kept near the 256-character
    /// limit kubectl shows), without the object, which the user just applied.
    pub fn warning(&self) -> String {
        let why = match &self.waiver {
            Some(w) => format!(
                "admitted unchanged: excepted by {} until {}",
                w.exception, w.expires
            ),
            None => "admitted unchanged: warn mode".to_owned(),
        };
        crate::text::admission_warning(&format!(
            "sigil: image {:?} in {} {} ({why})",
            self.image,
            self.field.describe(),
            self.denial.why()
        ))
    }
}

/// The final decision for one image field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The field is fine as written.
    Unchanged {
        /// Rule that applied.
        rule: String,
    },
    /// The field must be replaced with `new`.
    Changed {
        /// Rule that applied.
        rule: String,
        /// Replacement image string.
        new: String,
        /// Whether a mirror rewrite happened.
        rewritten: bool,
        /// Digest that was added, if any.
        pinned: Option<Digest>,
    },
    /// The field blocks (enforce) or warns (warn); it is left unchanged.
    Failed(Finding),
    /// Decided without registry access (`--offline`): the rule needs a
    /// lookup or a signature check that was not made.
    NeedsLookup {
        /// Rule that applied.
        rule: String,
        /// The mirror rewrite, which needs no lookup, if one applies.
        new: Option<String>,
    },
}

/// Turns a plan, the lookup answer (if one was needed) and the signature
/// report (if the rule verifies) into an outcome.
pub fn decide(
    field: &ImageField,
    plan: Result<&Plan, &Denial>,
    resolved: Option<&Result<Digest, ResolveFailure>>,
    verified: Option<&Arc<VerificationReport>>,
) -> Outcome {
    let plan = match plan {
        Ok(p) => p,
        Err(d) => {
            return Outcome::Failed(Finding {
                image: field.value.clone(),
                field: field.clone(),
                denial: d.clone(),
                mode: Mode::Enforce,
                waiver: None,
            });
        }
    };
    let fail = |denial: Denial| {
        Outcome::Failed(Finding {
            image: plan.written.clone(),
            field: field.clone(),
            denial,
            mode: plan.mode,
            waiver: None,
        })
    };
    let digest = match plan.step {
        crate::policy::Step::Deny => {
            // A static deny blocks in either mode: `mode` is about lookups failing.
            return Outcome::Failed(Finding {
                image: plan.written.clone(),
                field: field.clone(),
                denial: Denial::StaticDeny {
                    rule: plan.rule.to_string(),
                    source: plan.source.clone(),
                },
                mode: Mode::Enforce,
                waiver: None,
            });
        }
        crate::policy::Step::Keep => None,
        crate::policy::Step::Resolve => match resolved {
            Some(Ok(d)) => Some(d),
            Some(Err(f)) => {
                return fail(Denial::Unresolved {
                    rule: plan.rule.to_string(),
                    target: plan.target.to_string(),
                    failure: f.clone(),
                });
            }
            None => {
                return fail(Denial::Unresolved {
                    rule: plan.rule.to_string(),
                    target: plan.target.to_string(),
                    failure: ResolveFailure::Timeout {
                        budget: Duration::ZERO,
                    },
                });
            }
        },
    };
    if let Some(v) = &plan.verify {
        let report = verified.cloned().unwrap_or_else(|| {
            Arc::new(VerificationReport::unfetched(
                v,
                ResolveFailure::Timeout {
                    budget: Duration::ZERO,
                },
            ))
        });
        if !report.satisfied() {
            // The digest checked is the one that will run: the resolved one, or the one written.
            let target = match digest.or(plan.target.digest()) {
                Some(d) => plan.target.pinned(d.clone()).to_string(),
                None => plan.target.to_string(),
            };
            return fail(Denial::Unverified {
                rule: plan.rule.to_string(),
                source: plan.source.clone(),
                target,
                report,
            });
        }
    }
    let new = plan.final_image(digest);
    if new == plan.written {
        Outcome::Unchanged {
            rule: plan.rule.to_string(),
        }
    } else {
        Outcome::Changed {
            rule: plan.rule.to_string(),
            new,
            rewritten: plan.rewritten(),
            pinned: digest.cloned(),
        }
    }
}
