//! Multi-platform images: where on an image index a rule wants signatures
//! (`signatures.signedAt`), which platform manifests an index lists, and
//! what checking each one found.
//!
//! `cosign sign IMAGE` on a multi-platform tag signs the index;
//! `cosign sign --recursive` signs the index and every manifest in it; some
//! pipelines sign each platform's build alone and never the index. Which of
//! these a rule requires is the policy's to say. This module is pure: it
//! reads an index's bytes and does the arithmetic and the words of the
//! verdict. `sigil-verify` fetches the index and each platform's signatures
//! and reports back in these types.

use std::fmt;

use serde::{Deserialize, Serialize};

use super::VerifierOutcome;
use crate::Digest;
use crate::failure::ResolveFailure;

/// `signatures.signedAt`: where signatures must be found when the digest
/// pinned is an image index. A single-platform manifest (or a platform's
/// manifest pinned with `pin.platform`) is its own only place: every value
/// verifies it alone.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SignedAt {
    /// On the index digest itself (`cosign sign` on a multi-platform tag).
    #[default]
    Index,
    /// On every platform manifest the index lists; the index's own
    /// signatures are not needed.
    Platforms,
    /// On the index and on every platform manifest (`cosign sign --recursive`).
    Both,
    /// On the index, or else on every platform manifest: images from
    /// pipelines of either kind.
    Either,
}

impl SignedAt {
    /// The value as a policy writes it.
    pub fn as_str(self) -> &'static str {
        match self {
            SignedAt::Index => "index",
            SignedAt::Platforms => "platforms",
            SignedAt::Both => "both",
            SignedAt::Either => "either",
        }
    }

    /// Whether verifying an index means reading its platform manifests.
    pub fn reads_platforms(self) -> bool {
        self != SignedAt::Index
    }
}

/// At most this many platform manifests are verified for one index: each
/// costs its own signature lookups, and the index is the publisher's input.
/// Real multi-platform images list up to about sixteen (Docker's official
/// images, Windows versions included), plus attestation manifests, which
/// are not counted.
pub const MAX_PLATFORMS: usize = 32;

/// One runnable manifest an index lists.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlatformManifest {
    /// `os/arch[/variant]`, or `unspecified platform` when the entry names none.
    pub platform: String,
    /// The manifest's digest, as the index lists it.
    pub digest: Digest,
}

/// A platform as an index entry names it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct EntryPlatform {
    /// `linux`, `windows`, …
    pub os: String,
    /// `amd64`, `arm64`, …
    pub architecture: String,
    /// `v8`, `v7`, … (absent or empty: none).
    #[serde(default)]
    pub variant: Option<String>,
}

impl fmt::Display for EntryPlatform {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.variant.as_deref().filter(|v| !v.is_empty()) {
            Some(v) => write!(f, "{}/{}/{v}", self.os, self.architecture),
            None => write!(f, "{}/{}", self.os, self.architecture),
        }
    }
}

/// One entry of an image index that names a runnable image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IndexEntry {
    /// The digest as the index lists it (not yet checked).
    pub digest: String,
    /// Its platform, if the entry names one.
    pub platform: Option<EntryPlatform>,
}

/// The runnable entries of an index, in the index's order: `Ok(None)` when
/// `body` is not an index (an image manifest). BuildKit's attestation
/// manifests (platform `unknown/unknown`, or annotated
/// `vnd.docker.reference.type: attestation-manifest`) and artifacts
/// (descriptors with an `artifactType`) are not runnable and are left out.
/// What verifying each platform reads, and what pinning by platform picks
/// from (`sigil-registry`).
pub fn runnable_entries(body: &[u8]) -> Result<Option<Vec<IndexEntry>>, serde_json::Error> {
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Index {
        media_type: Option<String>,
        manifests: Option<Vec<Entry>>,
    }
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Entry {
        digest: String,
        artifact_type: Option<String>,
        platform: Option<EntryPlatform>,
        #[serde(default)]
        annotations: std::collections::BTreeMap<String, String>,
    }
    let idx: Index = serde_json::from_slice(body)?;
    let is_index = matches!(
        idx.media_type.as_deref(),
        None | Some("application/vnd.oci.image.index.v1+json")
            | Some("application/vnd.docker.distribution.manifest.list.v2+json")
    );
    let Some(entries) = idx.manifests.filter(|_| is_index) else {
        return Ok(None);
    };
    Ok(Some(
        entries
            .into_iter()
            .filter(|e| {
                let attestation = e
                    .annotations
                    .get("vnd.docker.reference.type")
                    .is_some_and(|t| t == "attestation-manifest");
                let unknown = e.platform.as_ref().is_some_and(|p| p.os == "unknown");
                !(attestation || unknown || e.artifact_type.is_some())
            })
            .map(|e| IndexEntry {
                digest: e.digest,
                platform: e.platform,
            })
            .collect(),
    ))
}

/// The runnable manifests of an index ([`runnable_entries`]), each digest
/// once and checked, at most [`MAX_PLATFORMS`]: `Ok(None)` when `body` is
/// not an index (an image manifest, whose only place for signatures is
/// itself).
pub fn platform_manifests(body: &[u8]) -> Result<Option<Vec<PlatformManifest>>, String> {
    let Some(entries) = runnable_entries(body)
        .map_err(|e| format!("the manifest of the digest pinned is not JSON: {e}"))?
    else {
        return Ok(None);
    };
    let mut out: Vec<PlatformManifest> = Vec::new();
    for e in entries {
        let digest = Digest::parse(&e.digest)
            .map_err(|err| format!("the index lists a manifest digest {:?}: {err}", e.digest))?;
        if out.iter().any(|m| m.digest == digest) {
            continue;
        }
        if out.len() == MAX_PLATFORMS {
            return Err(format!(
                "the index lists more than {MAX_PLATFORMS} platform manifests; sigil verifies at most {MAX_PLATFORMS} (pin one platform with pin.platform, or require signatures at the index)"
            ));
        }
        let platform = e
            .platform
            .map_or_else(|| "unspecified platform".into(), |p| p.to_string());
        out.push(PlatformManifest { platform, digest });
    }
    Ok(Some(out))
}

/// What the signatures of one platform manifest satisfied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlatformReport {
    /// The manifest checked.
    pub manifest: PlatformManifest,
    /// `(verifier name, outcome)` in policy order.
    pub results: Vec<(String, VerifierOutcome)>,
    /// Its signatures could not be fetched.
    pub fetch_failure: Option<ResolveFailure>,
    /// Each signature found for it, by form and log entry kind.
    pub found: Vec<String>,
}

impl PlatformReport {
    /// Whether it meets the rule's threshold and required verifiers.
    pub fn satisfied(&self, threshold: usize, required: &[String]) -> bool {
        self.fetch_failure.is_none() && meets(&self.results, threshold, required)
    }

    /// Whether its outcome may change by itself soon.
    pub fn is_transient(&self) -> bool {
        self.fetch_failure
            .as_ref()
            .is_some_and(ResolveFailure::is_transient)
            || super::any_revocation_unknown(&self.results)
    }

    /// Whether `verifier` passed here.
    pub fn passed(&self, verifier: &str) -> bool {
        self.results
            .iter()
            .any(|(n, o)| n == verifier && o.passed())
    }
}

/// Whether the passing verifiers of `results` are at least `threshold`
/// and include every one of `required`.
pub(crate) fn meets(
    results: &[(String, VerifierOutcome)],
    threshold: usize,
    required: &[String],
) -> bool {
    let passed = || results.iter().filter(|(_, o)| o.passed());
    passed().count() >= threshold
        && required
            .iter()
            .all(|r| passed().any(|(n, _)| n == r.as_str()))
}

/// Writes `k of n verifiers passed (need t[, including …]); name: …` for
/// one place's results.
pub(crate) fn write_results(
    f: &mut fmt::Formatter<'_>,
    results: &[(String, VerifierOutcome)],
    threshold: usize,
    required: &[String],
) -> fmt::Result {
    let passed = results.iter().filter(|(_, o)| o.passed()).count();
    write!(
        f,
        "{passed} of {} verifiers passed (need {threshold}",
        results.len()
    )?;
    if !required.is_empty() {
        write!(f, ", including {}", required.join(", "))?;
    }
    write!(f, ")")?;
    for (name, o) in results {
        match o {
            VerifierOutcome::Passed { .. } => write!(f, "; {name}: ok")?,
            VerifierOutcome::Failed {
                examined: 0,
                problem,
            } => write!(f, "; {name}: {problem}")?,
            VerifierOutcome::Failed { examined, problem } => write!(
                f,
                "; {name}: {problem} ({examined} signature{} checked)",
                if *examined == 1 { "" } else { "s" }
            )?,
        }
    }
    Ok(())
}

/// Writes what each platform's signatures satisfied: the failing ones in
/// full, the rest as `ok`.
pub(crate) fn write_platforms(
    f: &mut fmt::Formatter<'_>,
    platforms: &[PlatformReport],
    threshold: usize,
    required: &[String],
) -> fmt::Result {
    if platforms.is_empty() {
        return write!(f, "the index lists no platform manifest");
    }
    for (i, p) in platforms.iter().enumerate() {
        if i > 0 {
            write!(f, "; ")?;
        }
        let short = &p.manifest.digest.as_str()[..p.manifest.digest.as_str().len().min(19)];
        write!(f, "{} ({short}…): ", p.manifest.platform)?;
        if let Some(e) = &p.fetch_failure {
            write!(f, "signatures could not be fetched: {e}")?;
        } else if p.satisfied(threshold, required) {
            write!(f, "ok")?;
        } else {
            write_results(f, &p.results, threshold, required)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
