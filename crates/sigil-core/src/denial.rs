//! What happens when an image cannot be made to satisfy its rule ([`Mode`])
//! and why it is refused ([`Denial`]): the typed reasons every front end
//! renders through `decision::Finding`, each able to say what, why and how
//! to fix. No I/O, no rendering of whole answers.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::failure::ResolveFailure;
use crate::reference::ReferenceError;
use crate::verify::VerificationReport;

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

/// Why an image is refused (in `enforce`) or warned about (in `warn`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Denial {
    /// The image string is not a valid reference.
    InvalidReference {
        /// Parser's reason.
        error: ReferenceError,
    },
    /// A field an image extractor names holds no image string (a wrong
    /// path would otherwise let images through unseen).
    NotAnImage {
        /// What it holds, and which extractor expected a string.
        what: String,
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
            Denial::NotAnImage { .. } => "not_an_image",
            Denial::NoRule => "no_rule",
            Denial::StaticDeny { .. } => "static_deny",
            Denial::Unresolved { .. } => "unresolved",
            Denial::Unverified { .. } => "unverified",
            Denial::TooManyLookups { .. } => "too_many_lookups",
            Denial::TeamPolicy { refusal, .. } => refusal.kind(),
        }
    }

    /// Whether an image pinned by digest was to move to a mirror that does
    /// not serve that digest (so writing it there would not pull).
    pub fn not_at_mirror(&self) -> bool {
        matches!(self, Denial::Unresolved { target, failure: ResolveFailure::NotFound { .. }, .. } if target.contains('@'))
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
            Denial::NotAnImage { what } => format!("is not an image string: {what}"),
            Denial::NoRule => "matches no rule of the policy".to_owned(),
            Denial::StaticDeny { rule, source } => {
                format!("is denied by rule {rule:?}{}", of(source))
            }
            // A digest asked of the mirror it was to be moved to.
            Denial::Unresolved {
                target, failure, ..
            } if self.not_at_mirror() => format!(
                "is pinned by digest, and the mirror does not serve that digest: asked {target}: {failure}"
            ),
            Denial::Unresolved {
                target, failure, ..
            } if target.contains('@') => format!(
                "is pinned by digest, and the mirror could not be asked for it: {target}: {failure}"
            ),
            Denial::Unresolved {
                target, failure, ..
            } => format!("could not be pinned: resolving {target}: {failure}"),
            Denial::Unverified {
                target,
                report,
                rule,
                source: Some(s),
            } => format!(
                "failed {} of {target} (rule {rule:?} of {s}): {report}",
                checked(report)
            ),
            Denial::Unverified { target, report, .. } => {
                format!("failed {} of {target}: {report}", checked(report))
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
                    "failed {} of {target} required by {policy}, rule {rule}: {report}",
                    checked(report)
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
            Denial::NotAnImage { .. } => {
                "write an image reference there, or ask the platform team to fix the path in the policy's imageExtractors (sigil policy check lists them)"
            }
            Denial::StaticDeny { .. } => {
                "use an image the policy allows, or ask the platform team to change the rule"
            }
            Denial::Unresolved { .. } if self.not_at_mirror() => {
                "copy the image to the mirror (sigil mirror, or mirrors[].copy), or let the mirror fall back to the origin (fallback: origin)"
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
                None if report.is_transient() => {
                    "retry in a few seconds: the signing chain's revocation status is not known yet (sigil fetches its CRLs in the background); if it persists, check that sigil can reach the CRL distribution points named in the denial"
                }
                None if report.revoked() => {
                    "a certificate that signed this image is revoked by its CA: sign it again with a valid certificate; the revoked one no longer counts"
                }
                None if report.platforms_failed() => {
                    "sign every platform's manifest of this index (cosign sign --recursive signs the index and each manifest in it), or ask the platform team to change the rule's signatures.signedAt"
                }
                None if report.only_attestations_failed() => {
                    "attach an attestation of that type about this exact digest, signed by one of the entry's attestors, whose statement satisfies the conditions (cosign attest, actions/attest with push-to-registry), or ask the platform team to change the rule"
                }
                None => {
                    "sign this exact digest with the keys or identities the rule lists (cosign sign / notation sign), push the signatures where sigil looks (the image's repository or signatures.repository), or ask the platform team to change the rule"
                }
            },
        }
    }
}

/// What failed: signatures, or (when they passed or none are asked for) attestations.
fn checked(report: &VerificationReport) -> &'static str {
    if report.fetch_failure.is_none() && report.only_attestations_failed() {
        "attestation checks"
    } else {
        "signature verification"
    }
}

/// ` of ClusterImagePolicy base`, when the rule's policy object is named.
fn of(source: &Option<String>) -> String {
    source
        .as_ref()
        .map(|s| format!(" of {s}"))
        .unwrap_or_default()
}
