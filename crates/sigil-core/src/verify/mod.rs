//! What a rule's `verify` section means, and what verifying found.
//!
//! This module owns the schema of verifiers (cosign key or keyless, notation),
//! their validation (`compile`), the threshold/required arithmetic that turns
//! per-verifier results into one verdict, the typed reasons a signature did
//! not count, and the attestation entries a rule adds and what checking them
//! found (`attestations`). It reads no key
//! files and does no cryptography: `sigil-verify` loads the material the
//! paths name, checks signatures, and reports back in these types, so the
//! denial text is rendered here, in one place, like every other denial.

use std::fmt;

use serde::{Deserialize, Serialize};

pub mod attestations;
mod compile;
pub mod keyref;
pub mod node_keys;
pub mod notation;
pub mod platforms;
mod problem;

use crate::failure::ResolveFailure;
pub use attestations::{AttestationRequirement, EntryOutcome};
pub use compile::{FULCIO_EXTENSION_NAMES, MAX_REGEX_BYTES, identity_regex};
pub use keyref::{KeyRef, KeySource, NoKeySource};
pub use notation::{
    Action, NotationActions, NotationLevel, NotationOverride, NotationSpec, NotationStoreType,
    TrustedIdentity, VerifyTimestamp,
};
pub use platforms::{MAX_PLATFORMS, PlatformManifest, PlatformReport, SignedAt};
pub use problem::SignatureProblem;

/// One entry of a rule's `verify` list.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct VerifierSpec {
    /// Named in `required`, in denials and in metrics.
    pub name: String,
    /// A cosign verifier (key-based or keyless).
    #[serde(default)]
    pub cosign: Option<CosignSpec>,
    /// A notation (Notary Project) verifier.
    #[serde(default)]
    pub notation: Option<NotationSpec>,
}

impl VerifierSpec {
    /// The fields that name a file on sigil's own filesystem (inline PEM is
    /// not a file), as `(field, path)`: what a team may not set, and what a
    /// watcher re-reads on rotation.
    pub fn files(&self) -> Vec<(&'static str, &str)> {
        let is_file = |v: &&String| !v.contains("-----BEGIN ");
        let mut out = Vec::new();
        if let Some(c) = &self.cosign {
            out.extend(
                c.key
                    .iter()
                    .filter(is_file)
                    .map(|k| ("cosign.key", k.trim())),
            );
            out.extend(
                c.trusted_root
                    .iter()
                    .filter(is_file)
                    .map(|k| ("cosign.trustedRoot", k.trim())),
            );
        }
        if let Some(n) = &self.notation {
            out.extend(
                n.trust_roots
                    .iter()
                    .filter(is_file)
                    .map(|k| ("notation.trustRoots", k.trim())),
            );
            out.extend(
                n.tsa_roots
                    .iter()
                    .filter(is_file)
                    .map(|k| ("notation.tsaRoots", k.trim())),
            );
        }
        out
    }

    /// A cosign verifier named `name` with the public key `key` (a path or
    /// inline PEM) and every other setting at its default.
    pub fn cosign_key(name: &str, key: &str) -> VerifierSpec {
        VerifierSpec {
            name: name.into(),
            cosign: Some(CosignSpec {
                key: Some(key.into()),
                ..CosignSpec::default()
            }),
            notation: None,
        }
    }
}

/// `cosign:` — exactly one of `key` and `keyless`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CosignSpec {
    /// Public key: a PEM file path or inline PEM (ECDSA P-256/P-384, Ed25519, RSA).
    #[serde(default)]
    pub key: Option<String>,
    /// Public key from a ConfigMap or Secret (watched: a rotation is in
    /// force within seconds).
    #[serde(default)]
    pub key_ref: Option<KeyRef>,
    /// Fulcio-certificate identity to require.
    #[serde(default)]
    pub keyless: Option<KeylessSpec>,
    /// Sigstore `trusted_root.json` (path); default: the public-good root
    /// (embedded, kept current by TUF).
    #[serde(default)]
    pub trusted_root: Option<String>,
    /// A trusted root in force by name: a `TrustRoot` object (cluster
    /// policies and objects), kept current by sigil. Not with `trustedRoot`.
    #[serde(default)]
    pub trust_root: Option<String>,
    /// Whether a Rekor entry must be present (default: required for keyless,
    /// optional for keys). A present entry is always checked.
    #[serde(default)]
    pub transparency_log: Option<TlogPolicy>,
    /// Whether log entries must carry an inclusion proof against a signed
    /// checkpoint (default optional: a verified SET also proves inclusion,
    /// as cosign accepts; Rekor v2 entries always need the proof).
    #[serde(default)]
    pub inclusion_proof: Option<TlogPolicy>,
    /// How many RFC 3161 timestamps from the trusted root's timestamp
    /// authorities must verify (default 0, as cosign).
    #[serde(default)]
    pub timestamp_threshold: Option<usize>,
}

/// The identity a keyless certificate must carry. Give the issuer and the
/// subject, each exactly or as a regular expression.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct KeylessSpec {
    /// OIDC issuer, exact.
    #[serde(default)]
    pub issuer: Option<String>,
    /// OIDC issuer, regular expression (unanchored unless you anchor it).
    #[serde(default)]
    pub issuer_regex: Option<String>,
    /// Certificate SAN (email or URI), exact.
    #[serde(default)]
    pub subject: Option<String>,
    /// Certificate SAN, regular expression.
    #[serde(default)]
    pub subject_regex: Option<String>,
    /// Fulcio certificate extensions that must have exactly these values,
    /// by name (`githubWorkflowRepository: acme/api`,
    /// `sourceRepositoryRef: refs/heads/main`): what the certificate says,
    /// as cosign's `--certificate-github-workflow-*` flags check it.
    #[serde(default)]
    pub extensions: std::collections::BTreeMap<String, String>,
    /// Fulcio certificate extensions that must match these regular expressions.
    #[serde(default)]
    pub extensions_regex: std::collections::BTreeMap<String, String>,
}

/// `transparencyLog:`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum TlogPolicy {
    /// A verified Rekor entry must accompany the signature.
    Required,
    /// Checked if present, not required.
    Optional,
}

/// `signatures:` on a rule.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SignaturesSpec {
    /// Repository holding the signatures, instead of the one the image is pulled from.
    #[serde(default)]
    pub repository: Option<String>,
    /// Where on a multi-platform image signatures must be: `index`
    /// (default), `platforms`, `both` or `either`.
    #[serde(default)]
    pub signed_at: Option<SignedAt>,
}

/// A rule's compiled verification requirement.
///
/// It keys the verification cache (three lookups per cached 3-image Pod):
/// it hashes as a fingerprint of its contents computed once at compile,
/// not field by field (conditions and attestors made that cost grow with
/// the rule), and compares in full.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verification {
    /// Verifiers, in the order written.
    pub verifiers: Vec<VerifierSpec>,
    /// At least this many must pass.
    pub threshold: usize,
    /// These must be among those that pass.
    pub required: Vec<String>,
    /// Normalized repository (`host/path`, no tag or digest) signatures live
    /// in, if not the image's. Parsed once at compile: every verified image
    /// of every admission borrows it.
    pub signatures_repository: Option<crate::Reference>,
    /// Where on an image index the signatures must be.
    pub signed_at: SignedAt,
    /// Attestations that must be present, verified and satisfy their conditions.
    pub attestations: Vec<AttestationRequirement>,
    /// Hash of everything above, computed by [`Verification::seal`].
    fingerprint: u64,
}

impl Verification {
    /// The hash of its contents, computed once at compile (caches key on
    /// it; equal sets have equal fingerprints).
    pub fn fingerprint(&self) -> u64 {
        self.fingerprint
    }
}

impl std::hash::Hash for Verification {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        state.write_u64(self.fingerprint);
    }
}

/// What one verifier concluded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VerifierOutcome {
    /// At least one signature satisfied it. `logged` lists checks the
    /// verification level only logs (notation permissive/audit).
    Passed {
        /// Signatures of this kind that were examined.
        examined: usize,
        /// Failed checks that the level does not enforce.
        logged: Vec<String>,
    },
    /// None did; `problem` is the most telling reason among `examined` signatures.
    Failed {
        /// Signatures of this kind that were examined.
        examined: usize,
        /// Why none counted.
        problem: SignatureProblem,
    },
}

impl VerifierOutcome {
    /// Picks the failure to report among several signatures' problems.
    pub fn failed(examined: usize, problems: Vec<SignatureProblem>) -> VerifierOutcome {
        let problem = problems
            .into_iter()
            .max_by_key(SignatureProblem::rank)
            .unwrap_or(SignatureProblem::NoSignature);
        VerifierOutcome::Failed { examined, problem }
    }

    /// Whether the verifier passed.
    pub fn passed(&self) -> bool {
        matches!(self, VerifierOutcome::Passed { .. })
    }
}

/// Every verifier's result for one digest under one rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerificationReport {
    /// `(verifier name, outcome)` in policy order.
    pub results: Vec<(String, VerifierOutcome)>,
    /// Fetching the signatures failed (registry down, timeout): nothing could be checked.
    pub fetch_failure: Option<ResolveFailure>,
    /// Threshold the rule asks for.
    pub threshold: usize,
    /// Required verifiers.
    pub required: Vec<String>,
    /// Each attestation entry's findings, in policy order.
    pub attestations: Vec<EntryOutcome>,
    /// Each signature found for the digest, by its form and transparency-log
    /// entry kind (`cosign .sig layer, keyless, Rekor intoto/0.0.1`), so a
    /// user can see why one was or was not counted.
    pub found: Vec<String>,
    /// Where the rule wants signatures on an index (`signatures.signedAt`).
    pub signed_at: SignedAt,
    /// What each platform manifest's signatures satisfied: `Some` only when
    /// `signed_at` reads platforms and the digest is an index.
    pub platforms: Option<Vec<PlatformReport>>,
}

impl VerificationReport {
    /// A report for a fetch that failed before any verifier ran.
    pub fn unfetched(v: &Verification, failure: ResolveFailure) -> VerificationReport {
        VerificationReport {
            results: Vec::new(),
            fetch_failure: Some(failure),
            threshold: v.threshold,
            required: v.required.clone(),
            attestations: Vec::new(),
            found: Vec::new(),
            signed_at: v.signed_at,
            platforms: None,
        }
    }

    /// Whether the passing set meets the threshold and includes every
    /// required verifier, and every attestation entry passed.
    pub fn satisfied(&self) -> bool {
        self.signatures_satisfied() && self.attestations.iter().all(EntryOutcome::passed)
    }

    /// The signature part alone: the threshold and required verifiers met
    /// where `signedAt` asks (the digest; for an index, the index and/or
    /// each platform manifest).
    pub fn signatures_satisfied(&self) -> bool {
        if self.fetch_failure.is_some() {
            return false;
        }
        let (at_digest, at_platforms) = self.counted();
        (!at_digest || platforms::meets(&self.results, self.threshold, &self.required))
            && at_platforms.is_none_or(|ps| {
                !ps.is_empty()
                    && ps
                        .iter()
                        .all(|p| p.satisfied(self.threshold, &self.required))
            })
    }

    /// Where signatures count, as `signedAt` says: at the digest itself,
    /// and at these platforms (`either` counts the index when it is met
    /// there, else the platforms). The one answer the verdict and the
    /// `verified` annotation both follow.
    fn counted(&self) -> (bool, Option<&[PlatformReport]>) {
        match (self.platforms.as_deref(), self.signed_at) {
            (None, _) | (Some(_), SignedAt::Index) => (true, None),
            (Some(ps), SignedAt::Platforms) => (false, Some(ps)),
            (Some(ps), SignedAt::Both) => (true, Some(ps)),
            (Some(ps), SignedAt::Either) => {
                if platforms::meets(&self.results, self.threshold, &self.required) {
                    (true, None)
                } else {
                    (false, Some(ps))
                }
            }
        }
    }

    /// Whether the signatures failed only for want of them at the
    /// platforms (the denial's hint names `cosign sign --recursive`).
    pub fn platforms_failed(&self) -> bool {
        self.platforms.as_ref().is_some_and(|ps| {
            ps.is_empty()
                || ps
                    .iter()
                    .any(|p| !p.satisfied(self.threshold, &self.required))
        }) && !self.signatures_satisfied()
    }

    /// Whether the outcome may change by itself soon (a fetch failure), so it must not be cached.
    pub fn is_transient(&self) -> bool {
        self.fetch_failure
            .as_ref()
            .is_some_and(|f| f.is_transient())
            || any_revocation_unknown(&self.results)
            || self
                .platforms
                .iter()
                .flatten()
                .any(PlatformReport::is_transient)
    }

    /// Whether a verifier failed only because its signer was revoked.
    pub fn revoked(&self) -> bool {
        let revoked = |results: &[(String, VerifierOutcome)]| {
            results.iter().any(|(_, o)| {
                matches!(
                    o,
                    VerifierOutcome::Failed {
                        problem: SignatureProblem::Revoked { .. },
                        ..
                    }
                )
            })
        };
        revoked(&self.results) || self.platforms.iter().flatten().any(|p| revoked(&p.results))
    }

    /// Names of the verifiers that passed.
    pub fn passed_names(&self) -> Vec<&str> {
        self.results
            .iter()
            .filter(|(_, o)| o.passed())
            .map(|(n, _)| n.as_str())
            .collect()
    }

    /// The verifiers that vouched where the rule asks (`signedAt`): at the
    /// digest; with platforms, at every platform (and the index, for `both`).
    fn vouching(&self) -> impl Iterator<Item = &str> {
        let (at_digest, at_platforms) = self.counted();
        self.results
            .iter()
            .filter(move |(n, o)| {
                (!at_digest || o.passed())
                    && at_platforms.is_none_or(|ps| ps.iter().all(|p| p.passed(n)))
            })
            .map(|(n, _)| n.as_str())
    }

    /// What vouched for the digest: the verifiers that passed (where
    /// `signedAt` asks), then each attestation entry that passed
    /// (`attestation built-by-ci`).
    pub fn vouched(&self) -> Vec<String> {
        let mut out: Vec<String> = self.vouching().map(str::to_owned).collect();
        out.extend(
            self.attestations
                .iter()
                .filter(|a| a.passed())
                .map(|a| format!("attestation {}", a.name)),
        );
        out
    }

    /// Appends [`Self::vouched`] to `out`, `, `-separated (the admission's
    /// `verified` annotation, written without a `String` per name).
    pub fn write_vouched(&self, out: &mut String) {
        let names = self.vouching().map(|n| ("", n)).chain(
            self.attestations
                .iter()
                .filter(|a| a.passed())
                .map(|a| ("attestation ", a.name.as_str())),
        );
        for (i, (prefix, name)) in names.enumerate() {
            if i > 0 {
                out.push_str(", ");
            }
            out.push_str(prefix);
            out.push_str(name);
        }
    }

    /// Whether signatures passed and only attestations failed (the audit's
    /// reason `attestation`, and the denial's wording).
    pub fn only_attestations_failed(&self) -> bool {
        self.signatures_satisfied() && !self.satisfied()
    }
}

/// Whether any verifier failed only because a revocation status is unknown.
fn any_revocation_unknown(results: &[(String, VerifierOutcome)]) -> bool {
    results.iter().any(|(_, o)| {
        matches!(
            o,
            VerifierOutcome::Failed {
                problem: SignatureProblem::RevocationUnknown { .. },
                ..
            }
        )
    })
}

impl fmt::Display for VerificationReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(e) = &self.fetch_failure {
            return if self.threshold == 0 && self.results.is_empty() {
                write!(f, "attestations could not be fetched: {e}")
            } else {
                write!(f, "signatures could not be fetched: {e}")
            };
        }
        if self.results.is_empty() {
            // Attestations only.
            for (i, a) in self.attestations.iter().enumerate() {
                write!(f, "{}{a}", if i == 0 { "" } else { "; " })?;
            }
            return Ok(());
        }
        match (&self.platforms, self.signed_at) {
            (None, _) | (Some(_), SignedAt::Index) => {
                platforms::write_results(f, &self.results, self.threshold, &self.required)?;
            }
            (Some(ps), SignedAt::Platforms) => {
                write!(f, "signatures are required on every platform's manifest: ")?;
                platforms::write_platforms(f, ps, self.threshold, &self.required)?;
            }
            (Some(ps), at) => {
                write!(f, "at the index: ")?;
                platforms::write_results(f, &self.results, self.threshold, &self.required)?;
                write!(
                    f,
                    "; {} at every platform's manifest: ",
                    if at == SignedAt::Both { "and" } else { "or" }
                )?;
                platforms::write_platforms(f, ps, self.threshold, &self.required)?;
            }
        }
        for a in &self.attestations {
            write!(f, "; {a}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
