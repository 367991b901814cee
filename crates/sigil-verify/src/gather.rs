//! Finding every signature of one digest, fetching each artifact once.
//!
//! Owns where signatures and attestations live: the legacy cosign tags
//! `sha256-<hex>.sig` and `sha256-<hex>.att` (the latter only when a rule
//! asks for attestations), and referrers (the OCI referrers API, else the
//! referrers tag schema `sha256-<hex>`) whose artifactType is a notation
//! signature or a Sigstore bundle (a bundle is a signature or, when its
//! statement has another predicate, an attestation). Everything found is fetched once per verification, however many
//! verifiers and signatures there are; blobs shared by several layers (cosign
//! writes one payload per layer) are fetched once. Parse failures are kept
//! per signature so a verifier can say "malformed"; a registry failure fails
//! the whole gather (nothing was checked, so nothing may pass).

use crate::ArtifactError;
use std::collections::HashMap;
use std::time::Instant;

use futures_util::future::join_all;
use serde_json::Value;
use sigil_core::{ArtifactSource, Digest, PullCredentials, Reference, ResolveFailure};

use crate::attest::Attestation;
use crate::cosign::{self, Item};
use crate::notation::{self, Envelope};

/// Largest signature payload, envelope or bundle read (they are a few KiB).
pub const MAX_SIGNATURE_BLOB: usize = 1 << 20;
/// At most this many referrers are examined per digest.
pub const MAX_REFERRERS: usize = 32;

/// Every signature found for one digest.
#[derive(Debug, Default)]
pub struct Artifacts {
    /// cosign signatures (legacy layers and bundles), or why one could not be read.
    pub cosign: Vec<Result<Item, ArtifactError>>,
    /// notation envelopes, or why one could not be read.
    pub notation: Vec<Result<Envelope, ArtifactError>>,
    /// Attestations (`.att` layers and attestation bundles), when asked for.
    pub attestations: Vec<Result<Attestation, ArtifactError>>,
    /// Manifests and blobs fetched, for tests and logs.
    pub fetches: usize,
}

fn not_json(what: &str, e: serde_json::Error) -> ResolveFailure {
    ResolveFailure::BadResponse {
        detail: format!("{what}: {e}"),
    }
}

/// How many bytes of attestations (or bundles) one digest may make sigil
/// read from each place it looks: twice the largest one allowed. Beyond
/// it, what is listed is reported, not fetched, so an image with dozens of
/// huge attestations costs bounded memory per lookup.
struct Budget {
    left: u64,
    total: u64,
}

impl Budget {
    fn new(limit: usize) -> Budget {
        let total = 2 * limit as u64;
        Budget { left: total, total }
    }

    /// Takes `size` bytes if they fit.
    fn take(&mut self, size: u64) -> bool {
        match self.left.checked_sub(size) {
            Some(left) => {
                self.left = left;
                true
            }
            None => false,
        }
    }

    fn spent(&self) -> ArtifactError {
        ArtifactError::Malformed(format!(
            "not read: the attestations listed for this digest exceed the {}-byte budget sigil reads per digest (twice the largest allowed)",
            self.total
        ))
    }
}

/// What a rule needs gathered.
#[derive(Debug, Clone, Copy)]
pub struct Wanted {
    /// Signatures (`verify`): the `.sig` tag is read.
    pub signatures: bool,
    /// Attestations, up to this many statement bytes (`attestations`): the
    /// `.att` tag is read and large bundles are fetched.
    pub attestation_bytes: Option<usize>,
}

impl Wanted {
    /// Signatures only.
    pub const SIGNATURES: Wanted = Wanted {
        signatures: true,
        attestation_bytes: None,
    };

    /// The largest blob read: a signature's, or an attestation's statement
    /// in base64 plus its envelope and verification material.
    fn blob_limit(&self) -> usize {
        self.attestation_bytes.map_or(MAX_SIGNATURE_BLOB, |b| {
            (b / 3 * 4 + (64 << 10)).max(MAX_SIGNATURE_BLOB)
        })
    }
}

/// Gathers the signatures (and attestations) of `digest` stored in `repo`.
/// The legacy tags and the referrers are followed concurrently, so the
/// slowest chain (not their sum) sets the latency.
pub async fn gather<S: ArtifactSource>(
    source: &S,
    repo: &Reference,
    digest: &Digest,
    creds: &PullCredentials,
    wanted: Wanted,
    deadline: Instant,
) -> Result<Artifacts, ResolveFailure> {
    let (legacy, atts, referred) = futures_util::join!(
        async {
            match wanted.signatures {
                true => legacy(source, repo, digest, creds, deadline).await,
                false => Ok((Vec::new(), 0)),
            }
        },
        async {
            match wanted.attestation_bytes {
                Some(_) => {
                    legacy_att(source, repo, digest, creds, wanted.blob_limit(), deadline).await
                }
                None => Ok((Vec::new(), 0)),
            }
        },
        referred(source, repo, digest, creds, wanted, deadline)
    );
    let (mut cosign, f1) = legacy?;
    let (mut attestations, f3) = atts?;
    let (bundles, notation, attested, f2) = referred?;
    cosign.extend(bundles);
    attestations.extend(attested);
    Ok(Artifacts {
        cosign,
        notation,
        attestations,
        fetches: f1 + f2 + f3,
    })
}

/// cosign's attestation tag: one manifest at `sha256-<hex>.att` whose
/// layers are DSSE envelopes. A layer over the size limit is an
/// attestation that cannot be used, not a registry failure.
async fn legacy_att<S: ArtifactSource>(
    source: &S,
    repo: &Reference,
    digest: &Digest,
    creds: &PullCredentials,
    limit: usize,
    deadline: Instant,
) -> Fetched<Attestation> {
    let tag = format!("{}-{}.att", digest.algorithm(), digest.hex());
    let mut out = Vec::new();
    let mut budget = Budget::new(limit);
    let Some(bytes) = source.manifest(repo, &tag, creds, deadline).await? else {
        return Ok((out, 1));
    };
    let m: Value = serde_json::from_slice(&bytes).map_err(|e| not_json(&tag, e))?;
    let mut layers: Vec<(Digest, serde_json::Map<String, Value>)> = Vec::new();
    for l in m
        .get("layers")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .take(MAX_REFERRERS)
    {
        let ann = l
            .get("annotations")
            .and_then(Value::as_object)
            .cloned()
            .unwrap_or_default();
        let size = l.get("size").and_then(Value::as_u64).unwrap_or(0);
        match l.get("digest").and_then(Value::as_str).map(Digest::parse) {
            Some(Ok(_)) if size > limit as u64 => out.push(Err(ArtifactError::Malformed(format!(
                "the attestation is {size} bytes, over the {limit}-byte limit its rule's maxAttestationSize allows"
            )))),
            Some(Ok(_)) if !budget.take(size) => out.push(Err(budget.spent())),
            Some(Ok(d)) => layers.push((d, ann)),
            _ => out.push(Err(ArtifactError::Malformed("attestation layer has no valid digest".into()))),
        }
    }
    let (blobs, n) = fetch(
        source,
        repo,
        layers.iter().map(|(d, _)| d),
        limit,
        true,
        creds,
        deadline,
    )
    .await?;
    for (d, ann) in &layers {
        out.push(match blobs.get(d) {
            Some(Ok(envelope)) => crate::attest::from_att_layer(envelope, ann),
            Some(Err(e)) => Err(e.clone()),
            None => Err(ArtifactError::Malformed(format!(
                "attestation {d} is missing from the registry"
            ))),
        });
    }
    Ok((out, 1 + n))
}

/// Fetches each distinct blob once, concurrently. A blob the registry
/// lists but cannot find is that blob's problem (a broken signature, not an
/// outage), and so, when `lenient`, is one over `limit`; anything else (a
/// timeout, 5xx, refused) fails the whole gather.
async fn fetch<'d, S: ArtifactSource>(
    source: &S,
    repo: &Reference,
    digests: impl Iterator<Item = &'d Digest>,
    limit: usize,
    lenient: bool,
    creds: &PullCredentials,
    deadline: Instant,
) -> Result<(HashMap<Digest, Result<Vec<u8>, ArtifactError>>, usize), ResolveFailure> {
    let mut distinct: Vec<&Digest> = Vec::new();
    for d in digests {
        if !distinct.contains(&d) {
            distinct.push(d);
        }
    }
    let got = join_all(
        distinct
            .iter()
            .map(|d| source.blob(repo, d, limit, creds, deadline)),
    )
    .await;
    let mut out = HashMap::new();
    for (d, b) in distinct.iter().zip(got) {
        let r = match b {
            Ok(bytes) => Ok(bytes),
            Err(ResolveFailure::NotFound { .. }) => Err(ArtifactError::Malformed(format!(
                "blob {d} is missing from the registry"
            ))),
            Err(ResolveFailure::BadResponse { detail }) if lenient => {
                Err(ArtifactError::Malformed(detail))
            }
            Err(e) => return Err(e),
        };
        out.insert((*d).clone(), r);
    }
    Ok((out, distinct.len()))
}

type Fetched<T> = Result<(Vec<Result<T, ArtifactError>>, usize), ResolveFailure>;

/// Legacy cosign: one manifest at `sha256-<hex>.sig` whose layers each carry a signature.
async fn legacy<S: ArtifactSource>(
    source: &S,
    repo: &Reference,
    digest: &Digest,
    creds: &PullCredentials,
    deadline: Instant,
) -> Fetched<Item> {
    let sig_tag = format!("{}-{}.sig", digest.algorithm(), digest.hex());
    let mut out = Vec::new();
    let Some(bytes) = source.manifest(repo, &sig_tag, creds, deadline).await? else {
        return Ok((out, 1));
    };
    let m: Value = serde_json::from_slice(&bytes).map_err(|e| not_json(&sig_tag, e))?;
    let mut layers: Vec<(Digest, serde_json::Map<String, Value>)> = Vec::new();
    for l in m
        .get("layers")
        .and_then(|l| l.as_array())
        .into_iter()
        .flatten()
    {
        let ann = l
            .get("annotations")
            .and_then(|a| a.as_object())
            .cloned()
            .unwrap_or_default();
        match l.get("digest").and_then(|d| d.as_str()).map(Digest::parse) {
            Some(Ok(d)) => layers.push((d, ann)),
            _ => out.push(Err(ArtifactError::Malformed(
                "signature layer has no valid digest".into(),
            ))),
        }
    }
    let (blobs, n) = fetch(
        source,
        repo,
        layers.iter().map(|(d, _)| d),
        MAX_SIGNATURE_BLOB,
        false,
        creds,
        deadline,
    )
    .await?;
    for (d, ann) in &layers {
        out.push(match blobs.get(d) {
            Some(Ok(payload)) => Item::from_legacy(payload.clone(), ann),
            Some(Err(e)) => Err(e.clone()),
            None => Err(ArtifactError::Malformed(format!(
                "signature payload {d} is missing from the registry"
            ))),
        });
    }
    Ok((out, 1 + n))
}

/// Referrers: notation signatures and Sigstore bundles.
#[allow(clippy::type_complexity)]
async fn referred<S: ArtifactSource>(
    source: &S,
    repo: &Reference,
    digest: &Digest,
    creds: &PullCredentials,
    wanted: Wanted,
    deadline: Instant,
) -> Result<
    (
        Vec<Result<Item, ArtifactError>>,
        Vec<Result<Envelope, ArtifactError>>,
        Vec<Result<Attestation, ArtifactError>>,
        usize,
    ),
    ResolveFailure,
> {
    let mut fetches = 1;
    let mut listed: Vec<(Digest, &'static str)> = Vec::new();
    let mut budget = Budget::new(wanted.blob_limit());
    let mut over_budget = Vec::new();
    if let Some(index) = referrers(source, repo, digest, creds, deadline).await? {
        let v: Value =
            serde_json::from_slice(&index).map_err(|e| not_json("referrers index", e))?;
        for d in v
            .get("manifests")
            .and_then(|m| m.as_array())
            .into_iter()
            .flatten()
        {
            let at = d
                .get("artifactType")
                .and_then(|a| a.as_str())
                .unwrap_or_default();
            let kind = match at {
                notation::ARTIFACT_TYPE if wanted.signatures => "notation",
                // v0.3 and the v0.1/v0.2 media types (`…bundle+json;version=0.2`).
                a if a.starts_with(cosign::BUNDLE_PREFIX) => "bundle",
                _ => continue,
            };
            if let Some(Ok(dg)) = d.get("digest").and_then(|x| x.as_str()).map(Digest::parse)
                && listed.len() < MAX_REFERRERS
                && !listed.iter().any(|(w, _)| *w == dg)
            {
                listed.push((dg, kind));
            }
        }
    }
    let manifests = join_all(
        listed
            .iter()
            .map(|(d, _)| source.manifest(repo, d.as_str(), creds, deadline)),
    )
    .await;
    fetches += manifests.len();
    // (blob digest, media type, kind) of every envelope or bundle to read.
    let mut envelopes: Vec<(Digest, String, &'static str)> = Vec::new();
    for ((d, kind), m) in listed.iter().zip(manifests) {
        let Some(bytes) = m? else {
            continue; // listed but gone: nothing to check
        };
        let v: Value = serde_json::from_slice(&bytes).map_err(|e| not_json(d.as_str(), e))?;
        match v.get("subject") {
            // A referrer must point at the digest it is listed for.
            Some(s) if s.get("digest").and_then(Value::as_str) != Some(digest.as_str()) => {
                continue;
            }
            // No subject: listed in the tag-schema index of this digest,
            // as sigstore-js (GitHub's `actions/attest`) writes it for
            // Docker Hub and ECR, which refuse `subject`. The signed
            // statement, not the listing, binds it to the digest.
            _ => {}
        }
        for l in v
            .get("layers")
            .and_then(|l| l.as_array())
            .into_iter()
            .flatten()
        {
            let mt = l
                .get("mediaType")
                .and_then(|m| m.as_str())
                .unwrap_or_default();
            let ok = match *kind {
                "notation" => mt == notation::JWS_MEDIA_TYPE || mt == notation::COSE_MEDIA_TYPE,
                _ => mt.starts_with("application/vnd.dev.sigstore.bundle"),
            };
            if let (true, Some(Ok(bd))) = (
                ok,
                l.get("digest").and_then(|x| x.as_str()).map(Digest::parse),
            ) {
                let size = l.get("size").and_then(Value::as_u64).unwrap_or(0);
                if *kind == "bundle" && !budget.take(size) {
                    over_budget.push(budget.spent());
                    continue;
                }
                envelopes.push((bd, mt.to_owned(), kind));
            }
        }
    }
    let (blobs, n) = fetch(
        source,
        repo,
        envelopes.iter().map(|(d, _, _)| d),
        wanted.blob_limit(),
        true,
        creds,
        deadline,
    )
    .await?;
    fetches += n;
    let (mut bundles, mut envs, mut atts) = (Vec::new(), Vec::new(), Vec::new());
    for e in over_budget {
        match wanted.attestation_bytes {
            Some(_) => atts.push(Err(e)),
            None => bundles.push(Err(e)),
        }
    }
    for (d, mt, kind) in &envelopes {
        let b = match blobs.get(d) {
            Some(Ok(b)) => b,
            Some(Err(e)) => {
                let e = e.clone();
                match *kind {
                    "notation" => envs.push(Err(e)),
                    _ if wanted.signatures => bundles.push(Err(e)),
                    _ => atts.push(Err(e)),
                }
                continue;
            }
            None => continue,
        };
        if *kind == "notation" {
            envs.push(Envelope::parse(mt, b));
            continue;
        }
        // A bundle: cosign's image signature, or an attestation.
        match crate::attest::from_bundle(b) {
            Ok(Some(a)) if wanted.attestation_bytes.is_some() => atts.push(Ok(a)),
            Ok(Some(_)) => {}
            Ok(None) if wanted.signatures => bundles.push(Item::from_bundle(b)),
            Ok(None) => {}
            Err(e) => {
                if wanted.signatures {
                    bundles.push(Err(e.clone()));
                }
                if wanted.attestation_bytes.is_some() {
                    atts.push(Err(e));
                }
            }
        }
    }
    Ok((bundles, envs, atts, fetches))
}

/// The referrers index: the API if the registry has it, else the tag schema.
/// While the source is still learning whether the host has the API, both
/// are asked at once; the API's answer wins when there is one, so a
/// registry keeping referrers only behind its API is read as before.
async fn referrers<S: ArtifactSource>(
    source: &S,
    repo: &Reference,
    digest: &Digest,
    creds: &PullCredentials,
    deadline: Instant,
) -> Result<Option<Vec<u8>>, ResolveFailure> {
    let tag = format!("{}-{}", digest.algorithm(), digest.hex());
    if source.referrers_api_unknown(repo) {
        let (api, by_tag) = futures_util::join!(
            source.referrers(repo, digest, creds, deadline),
            source.manifest(repo, &tag, creds, deadline)
        );
        return match api? {
            Some(index) => Ok(Some(index)),
            None => by_tag,
        };
    }
    match source.referrers(repo, digest, creds, deadline).await? {
        Some(index) => Ok(Some(index)),
        None => source.manifest(repo, &tag, creds, deadline).await,
    }
}

#[cfg(test)]
mod tests;
