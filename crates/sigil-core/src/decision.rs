//! Outcomes and typed denial reasons, rendered in exactly one place.
//!
//! The webhook's status message, its warnings, the CLI's lines and KRM results
//! all come from [`Finding::message`], so a user sees the same words — what,
//! why, and how to fix — wherever sigil refuses or warns. This module does no
//! I/O; registry failures arrive as [`ResolveFailure`] values from the I/O edge.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::policy::Plan;
use crate::reference::{Digest, ReferenceError};
use crate::verify::VerificationReport;
use crate::walker::ImageField;

/// What happens when an image cannot be made to satisfy its rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Refuse the object.
    Enforce,
    /// Admit it unchanged, with a warning.
    Warn,
}

impl Mode {
    /// Lowercase name for logs and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Enforce => "enforce",
            Mode::Warn => "warn",
        }
    }
}

/// How a registry lookup failed, as reported by the I/O edge.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ResolveFailure {
    /// The registry answered 404 / MANIFEST_UNKNOWN / NAME_UNKNOWN.
    NotFound {
        /// The registry's own words, trimmed.
        detail: String,
    },
    /// 401/403 even after authenticating (or no credentials configured).
    Unauthorized {
        /// HTTP status.
        status: u16,
        /// The registry's own words, trimmed.
        detail: String,
    },
    /// 429 with no time left to honour Retry-After.
    RateLimited {
        /// What the registry asked us to wait.
        retry_after: Option<Duration>,
    },
    /// Any other non-success status.
    Status {
        /// HTTP status.
        status: u16,
        /// The registry's own words, trimmed.
        detail: String,
    },
    /// Connection refused, DNS, TLS handshake and other transport errors.
    Unreachable {
        /// Transport error text.
        detail: String,
    },
    /// The admission deadline passed before the registry answered.
    Timeout {
        /// Time that was available.
        budget: Duration,
    },
    /// The registry answered something that is not a usable manifest.
    BadResponse {
        /// What was wrong.
        detail: String,
    },
    /// The index has no manifest for the policy's platform.
    PlatformNotFound {
        /// Wanted platform.
        platform: String,
        /// Platforms the index offers.
        available: Vec<String>,
    },
    /// Local configuration prevented the request (unreadable password file, bad CA).
    Config {
        /// What was wrong.
        detail: String,
    },
}

impl ResolveFailure {
    /// Short label for metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            ResolveFailure::NotFound { .. } => "not_found",
            ResolveFailure::Unauthorized { .. } => "unauthorized",
            ResolveFailure::RateLimited { .. } => "rate_limited",
            ResolveFailure::Status { .. } => "status",
            ResolveFailure::Unreachable { .. } => "unreachable",
            ResolveFailure::Timeout { .. } => "timeout",
            ResolveFailure::BadResponse { .. } => "bad_response",
            ResolveFailure::PlatformNotFound { .. } => "platform_not_found",
            ResolveFailure::Config { .. } => "config",
        }
    }

    /// Whether the failure may go away by itself (worth caching only briefly).
    pub fn is_transient(&self) -> bool {
        !matches!(
            self,
            ResolveFailure::NotFound { .. } | ResolveFailure::PlatformNotFound { .. }
        )
    }

    fn hint(&self) -> &'static str {
        match self {
            ResolveFailure::NotFound { .. } => {
                "check the image name and tag, or push the image (and mirror it, if a mirror is configured)"
            }
            ResolveFailure::Unauthorized { .. } => {
                "give the workload an imagePullSecret for this registry (on the Pod spec or its ServiceAccount), or give sigil node-level credentials (spec.registries[].auth, --docker-config, a credential provider); see docs/credentials.md"
            }
            ResolveFailure::RateLimited { .. } => {
                "use a mirror or authenticated pulls, or retry later"
            }
            ResolveFailure::Status { .. } | ResolveFailure::BadResponse { .. } => {
                "check the registry's health, or retry later"
            }
            ResolveFailure::Unreachable { .. } => {
                "check that sigil can reach the registry (network policy, DNS, TLS: spec.registries[].ca or insecure)"
            }
            ResolveFailure::Timeout { .. } => {
                "the registry is slow; retry, raise the webhook's timeoutSeconds, or pin the image by digest"
            }
            ResolveFailure::PlatformNotFound { .. } => {
                "publish the image for this platform or change spec.pin.platform"
            }
            ResolveFailure::Config { .. } => "fix sigil's registry configuration",
        }
    }
}

impl fmt::Display for ResolveFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ResolveFailure::NotFound { detail } => {
                write!(f, "registry answered 404 not found ({detail})")
            }
            ResolveFailure::Unauthorized { status, detail } => {
                write!(f, "registry refused access: {status} ({detail})")
            }
            ResolveFailure::RateLimited {
                retry_after: Some(d),
            } => write!(
                f,
                "registry rate-limited the lookup (429, Retry-After {}s exceeds the deadline)",
                d.as_secs()
            ),
            ResolveFailure::RateLimited { retry_after: None } => {
                write!(f, "registry rate-limited the lookup (429)")
            }
            ResolveFailure::Status { status, detail } => {
                write!(f, "registry answered {status} ({detail})")
            }
            ResolveFailure::Unreachable { detail } => write!(f, "registry unreachable: {detail}"),
            ResolveFailure::Timeout { budget } => write!(
                f,
                "no answer from the registry within the admission deadline ({} ms)",
                budget.as_millis()
            ),
            ResolveFailure::BadResponse { detail } => {
                write!(f, "registry sent an unusable manifest: {detail}")
            }
            ResolveFailure::PlatformNotFound {
                platform,
                available,
            } => write!(
                f,
                "index has no manifest for {platform} (has: {})",
                available.join(", ")
            ),
            ResolveFailure::Config { detail } => {
                write!(f, "registry configuration error: {detail}")
            }
        }
    }
}

/// Why an image is refused (in `enforce`) or warned about (in `warn`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Denial {
    /// The image string is not a valid reference.
    InvalidReference {
        /// Parser's reason.
        error: ReferenceError,
    },
    /// No rule's pattern matches the image's origin name.
    NoRule,
    /// A rule with `action: deny` matched.
    StaticDeny {
        /// Rule name.
        rule: String,
        /// The policy object stating the rule (`ClusterImagePolicy base`), if named.
        source: Option<String>,
    },
    /// The tag could not be resolved to a digest.
    Unresolved {
        /// Rule name.
        rule: String,
        /// Where the lookup went (after the mirror stage).
        target: String,
        /// What the registry (or transport) said.
        failure: ResolveFailure,
    },
    /// The pinned digest does not carry the signatures the rule asks for.
    Unverified {
        /// Rule name.
        rule: String,
        /// The policy object stating the rule, if named.
        source: Option<String>,
        /// The exact image (with digest) that was checked.
        target: String,
        /// Per-verifier findings.
        report: Arc<VerificationReport>,
    },
    /// The object names more distinct images to look up than the limit: a
    /// guard against one request fanning out to thousands of lookups (real
    /// workloads are far below it). Blocks in either mode.
    TooManyLookups {
        /// Distinct lookups the object needs.
        lookups: usize,
        /// The limit in force.
        limit: usize,
    },
    /// A namespace's ImagePolicy refused what the cluster policy admits.
    TeamPolicy {
        /// `ImagePolicy team-a/signed-only`.
        policy: String,
        /// Its reason: a deny rule, not on its allow-list (`NoRule`), or
        /// its own signature requirement.
        refusal: Box<Denial>,
    },
}

impl Denial {
    /// Short label for metrics and logs.
    pub fn kind(&self) -> &'static str {
        match self {
            Denial::InvalidReference { .. } => "invalid_reference",
            Denial::NoRule => "no_rule",
            Denial::StaticDeny { .. } => "static_deny",
            Denial::Unresolved { .. } => "unresolved",
            Denial::Unverified { .. } => "unverified",
            Denial::TooManyLookups { .. } => "too_many_lookups",
            Denial::TeamPolicy { refusal, .. } => refusal.kind(),
        }
    }

    /// Whether the refusal comes from not being able to look something up
    /// (the tag, or the signatures), rather than from what was found.
    pub fn lookup_failed(&self) -> bool {
        match self {
            Denial::Unresolved { .. } => true,
            Denial::Unverified { report, .. } => report.fetch_failure.is_some(),
            Denial::TeamPolicy { refusal, .. } => refusal.lookup_failed(),
            _ => false,
        }
    }

    /// Why the image fails, in words (the middle of every message).
    pub fn why(&self) -> String {
        match self {
            Denial::InvalidReference { error } => {
                format!("is not a valid image reference: {error}")
            }
            Denial::NoRule => "matches no rule of the policy".to_owned(),
            Denial::StaticDeny { rule, source } => {
                format!("is denied by rule {rule:?}{}", of(source))
            }
            Denial::Unresolved {
                target, failure, ..
            } => format!("could not be pinned: resolving {target}: {failure}"),
            Denial::Unverified {
                target,
                report,
                rule,
                source: Some(s),
            } => format!(
                "failed signature verification of {target} (rule {rule:?} of {s}): {report}"
            ),
            Denial::Unverified { target, report, .. } => {
                format!("failed signature verification of {target}: {report}")
            }
            Denial::TooManyLookups { lookups, limit } => format!(
                "was not looked up: the object names {lookups} distinct images to resolve, more than the limit of {limit} per object"
            ),
            Denial::TeamPolicy { policy, refusal } => match refusal.as_ref() {
                Denial::NoRule => {
                    format!("is not on the allow-list of {policy} (defaultAction: deny)")
                }
                Denial::StaticDeny { rule, .. } => format!("is denied by {policy}, rule {rule}"),
                Denial::Unverified {
                    rule,
                    target,
                    report,
                    ..
                } => format!(
                    "failed signature verification of {target} required by {policy}, rule {rule}: {report}"
                ),
                other => format!("{} ({policy})", other.why()),
            },
        }
    }

    /// How to fix it (the end of every message).
    pub fn hint(&self) -> &'static str {
        match self {
            Denial::InvalidReference { .. } => {
                "fix the image reference (names are lowercase; tags are [A-Za-z0-9_.-]; digests are sha256:<64 hex>)"
            }
            Denial::NoRule => {
                "add a rule whose match covers this image (e.g. a catch-all \"**\" rule)"
            }
            Denial::StaticDeny { .. } => {
                "use an image the policy allows, or ask the platform team to change the rule"
            }
            Denial::Unresolved { failure, .. } => failure.hint(),
            Denial::TooManyLookups { .. } => {
                "split the object into smaller ones, or ask the platform team to raise sigil's --max-lookups-per-object"
            }
            Denial::TeamPolicy { refusal, .. } => match refusal.as_ref() {
                Denial::NoRule | Denial::StaticDeny { .. } => {
                    "use an image the namespace's ImagePolicy allows, or ask the namespace's admins to change it (kubectl get imagepolicies)"
                }
                other => other.hint(),
            },
            Denial::Unverified { report, .. } => match &report.fetch_failure {
                Some(f) => f.hint(),
                None => {
                    "sign this exact digest with the keys or identities the rule lists (cosign sign / notation sign), push the signatures where sigil looks (the image's repository or signatures.repository), or ask the platform team to change the rule"
                }
            },
        }
    }
}

/// ` of ClusterImagePolicy base`, when the rule's policy object is named.
fn of(source: &Option<String>) -> String {
    source
        .as_ref()
        .map(|s| format!(" of {s}"))
        .unwrap_or_default()
}

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
}

impl Finding {
    /// The one rendering of a denial: what, where, why, how to fix.
    pub fn message(&self, object: &ObjectRef) -> String {
        // Names and registry answers come from outside: a denial kubectl
        // prints must not carry terminal escapes (see `crate::text`).
        crate::text::escape_controls(&format!(
            "image {:?} in {} of {}: {}; to fix: {}",
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
        let mut s = crate::text::escape_controls(&format!(
            "sigil: image {:?} in {} {} (admitted unchanged: warn mode)",
            self.image,
            self.field.describe(),
            self.denial.why()
        ))
        .into_owned();
        if s.len() > 480 {
            let mut cut = 477;
            while !s.is_char_boundary(cut) {
                cut -= 1;
            }
            s.truncate(cut);
            s.push_str("...");
        }
        s
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
            });
        }
    };
    let fail = |denial: Denial| {
        Outcome::Failed(Finding {
            image: plan.written.clone(),
            field: field.clone(),
            denial,
            mode: plan.mode,
        })
    };
    let digest = match plan.step {
        crate::policy::Step::Deny => {
            // A static deny blocks in either mode: `mode` is about lookups failing.
            return Outcome::Failed(Finding {
                image: plan.written.clone(),
                field: field.clone(),
                denial: Denial::StaticDeny {
                    rule: plan.rule.clone(),
                    source: plan.source.clone(),
                },
                mode: Mode::Enforce,
            });
        }
        crate::policy::Step::Keep => None,
        crate::policy::Step::Resolve => match resolved {
            Some(Ok(d)) => Some(d),
            Some(Err(f)) => {
                return fail(Denial::Unresolved {
                    rule: plan.rule.clone(),
                    target: plan.target.to_string(),
                    failure: f.clone(),
                });
            }
            None => {
                return fail(Denial::Unresolved {
                    rule: plan.rule.clone(),
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
                rule: plan.rule.clone(),
                source: plan.source.clone(),
                target,
                report,
            });
        }
    }
    let new = plan.final_image(digest);
    if new == plan.written {
        Outcome::Unchanged {
            rule: plan.rule.clone(),
        }
    } else {
        Outcome::Changed {
            rule: plan.rule.clone(),
            new,
            rewritten: plan.rewritten(),
            pinned: digest.cloned(),
        }
    }
}
