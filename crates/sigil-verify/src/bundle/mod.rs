//! Sigstore bundles verified offline, the way the Sigstore client spec and
//! its conformance suite require: v0.1, v0.2 and v0.3 (both media types),
//! `messageSignature` and `dsseEnvelope` content, a configured key or a
//! Fulcio certificate.
//!
//! Owns the order of checks for one bundle: the signature over the artifact
//! (or its digest, or the DSSE pre-authentication encoding, with the
//! statement's subject bound to the artifact); every transparency-log entry
//! (a trusted log; its body records this signature, signer and hash; its
//! inclusion proof recomputes a checkpoint's root and the log signed that
//! checkpoint; its SET, when present); every RFC 3161 timestamp; then the
//! verified times — at least one — at each of which the certificate must
//! chain to a trusted Fulcio CA; last the identity. It reads no network.

use base64::Engine as _;
use regex::Regex;
use serde_json::Value;
use x509_parser::prelude::{FromDer, X509Certificate};

use sigil_core::SignatureProblem;
use sigil_core::verify::TlogPolicy;

use crate::keys::{PublicKey, SigEncoding};
use crate::rekor::Expected;
use crate::trust::TrustedRoot;
use crate::x509::{self, Eku};
use crate::{ArtifactError, sha256};

mod content;
mod tlog;
use content::content;
pub(crate) use content::{ContentKind, content_kind, subject_binds};
use tlog::log_entry;

/// What was signed.
#[derive(Debug, Clone)]
pub enum Artifact {
    /// The artifact's bytes.
    Bytes(Vec<u8>),
    /// Only its SHA-256.
    Digest([u8; 32]),
    /// Only its SHA-512 (npm provenance names packages by SHA-512): only a
    /// DSSE statement can be checked against it.
    Sha512([u8; 64]),
}

impl Artifact {
    fn sha256(&self) -> Result<[u8; 32], ArtifactError> {
        match self {
            Artifact::Bytes(b) => Ok(sha256(b)),
            Artifact::Digest(d) => Ok(*d),
            Artifact::Sha512(_) => Err(malformed(
                "a sha512 digest can only be checked against a DSSE statement's subject",
            )),
        }
    }

    /// The `alg:hex` digests an in-toto subject may name it by.
    pub fn subject_digests(&self) -> Vec<(&'static str, String)> {
        let hex = crate::trust::hex;
        match self {
            Artifact::Bytes(b) => {
                let d512 = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA512, b);
                vec![("sha256", hex(&sha256(b))), ("sha512", hex(d512.as_ref()))]
            }
            Artifact::Digest(d) => vec![("sha256", hex(d))],
            Artifact::Sha512(d) => vec![("sha512", hex(d))],
        }
    }
}

/// A keyless identity, compiled.
#[derive(Debug, Clone)]
pub enum Matcher {
    /// Exact string.
    Exact(String),
    /// Regular expression.
    Regex(Regex),
}

impl Matcher {
    /// Whether `s` is the identity (exactly, or by the regex).
    pub fn matches(&self, s: &str) -> bool {
        match self {
            Matcher::Exact(e) => e == s,
            Matcher::Regex(r) => r.is_match(s),
        }
    }

    /// How a mismatch names what was wanted: the value, or `/regex/`.
    pub fn describe(&self) -> String {
        match self {
            Matcher::Exact(e) => e.clone(),
            Matcher::Regex(r) => format!("/{}/", r.as_str()),
        }
    }
}

/// Who must have signed.
#[derive(Debug, Clone, Copy)]
pub enum Signer<'a> {
    /// A key the verifier holds (`--key`, a policy's `key`).
    Key(&'a PublicKey),
    /// A Fulcio certificate whose SAN, OIDC issuer and Fulcio extensions match.
    Identity {
        /// SAN (URI or email).
        san: &'a Matcher,
        /// OIDC issuer.
        issuer: &'a Matcher,
        /// Fulcio extensions by name (`githubWorkflowRepository`,
        /// `sourceRepositoryRef`, …) and what each must be: the
        /// certificate's word, as cosign's `--certificate-github-workflow-*`
        /// flags check it.
        extensions: &'a [(String, Matcher)],
    },
}

/// Whether a certificate's identity is the one asked for: issuer, one SAN,
/// and every named Fulcio extension (absent counts as a mismatch).
pub fn identity_matches(
    id: &x509::Identity,
    san: &Matcher,
    issuer: &Matcher,
    extensions: &[(String, Matcher)],
) -> Result<(), SignatureProblem> {
    let issuer_ok = id.issuer.as_deref().is_some_and(|i| issuer.matches(i));
    if !issuer_ok || !id.subjects.iter().any(|s| san.matches(s)) {
        return Err(SignatureProblem::IdentityMismatch {
            found: id.to_string(),
        });
    }
    for (name, want) in extensions {
        let got = id.extensions.get(name);
        if !got.is_some_and(|g| want.matches(g)) {
            return Err(SignatureProblem::IdentityMismatch {
                found: format!(
                    "{name} {}, not {}",
                    got.map_or("(absent)", String::as_str),
                    want.describe()
                ),
            });
        }
    }
    Ok(())
}

/// What a policy demands beyond a valid signature. The defaults are what
/// cosign's verifier demands (and what the conformance suite expects).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Requirements {
    /// At least one verified log entry (`transparencyLog: required`).
    pub tlog: TlogPolicy,
    /// Every log entry must carry an inclusion proof against a signed
    /// checkpoint (otherwise a verified SET suffices for Rekor v1 entries).
    pub inclusion_proof: TlogPolicy,
    /// At least this many verified RFC 3161 timestamps.
    pub timestamps: usize,
    /// `tlog` is the keyless default, not the policy's word: under a
    /// trusted root that lists no transparency log (GitHub's instance, a
    /// private deployment without Rekor) a verified signed timestamp stands
    /// in for the log entry. An explicit `transparencyLog: required` always
    /// means a verified log entry.
    pub tlog_default: bool,
}

impl Default for Requirements {
    fn default() -> Self {
        Requirements {
            tlog: TlogPolicy::Required,
            inclusion_proof: TlogPolicy::Optional,
            timestamps: 0,
            tlog_default: true,
        }
    }
}

/// What a verified bundle proved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verified {
    /// Verified signing times (SET integrated times, RFC 3161 times).
    pub times: Vec<i64>,
    /// Log entries whose inclusion proof was checked against a signed checkpoint.
    pub inclusion_proofs: usize,
    /// RFC 3161 timestamps verified.
    pub timestamps: usize,
    /// The signed in-toto statement, for a DSSE bundle (its subject names
    /// the artifact; what it claims is the caller's to judge).
    pub statement: Option<Vec<u8>>,
    /// What the verified signing certificate says (for a certificate).
    pub identity: Option<x509::Identity>,
}

fn malformed(m: impl Into<String>) -> ArtifactError {
    ArtifactError::Malformed(m.into())
}

fn b64(v: &Value, p: &str) -> Result<Vec<u8>, ArtifactError> {
    let s = v
        .pointer(p)
        .and_then(Value::as_str)
        .ok_or_else(|| malformed(format!("bundle has no {p}")))?;
    base64::engine::general_purpose::STANDARD
        .decode(s.trim())
        .map_err(|e| malformed(format!("bundle {p}: {e}")))
}

fn int(v: &Value, k: &str) -> Option<i64> {
    match v.get(k)? {
        Value::Number(n) => n.as_i64(),
        Value::String(s) => s.parse().ok(),
        _ => None,
    }
}

/// The bundle's version (1, 2 or 3 for v0.1…v0.3).
fn version(v: &Value) -> Result<u8, ArtifactError> {
    let mt = v
        .get("mediaType")
        .and_then(Value::as_str)
        .unwrap_or_default();
    match mt {
        "application/vnd.dev.sigstore.bundle+json;version=0.1" => Ok(1),
        "application/vnd.dev.sigstore.bundle+json;version=0.2" => Ok(2),
        "application/vnd.dev.sigstore.bundle+json;version=0.3"
        | "application/vnd.dev.sigstore.bundle.v0.3+json" => Ok(3),
        other => Err(malformed(format!(
            "not a supported Sigstore bundle (mediaType {other:?})"
        ))),
    }
}

/// The signing certificate (DER), or `None` for a key hint. The rest of a
/// v0.1/v0.2 `x509CertificateChain` is read and dropped: a chain to a
/// trusted-root authority is built from that authority's own certificates
/// only (an intermediate the bundle brings could take a leaf into another
/// authority's window).
fn certificates(v: &Value) -> Result<Option<Vec<u8>>, ArtifactError> {
    let m = v
        .get("verificationMaterial")
        .ok_or_else(|| malformed("bundle has no verificationMaterial"))?;
    if m.get("certificate").is_some() {
        return Ok(Some(b64(m, "/certificate/rawBytes")?));
    }
    if let Some(chain) = m.pointer("/x509CertificateChain/certificates") {
        let certs = chain
            .as_array()
            .ok_or_else(|| malformed("certificate chain is not a list"))?
            .iter()
            .map(|c| b64(c, "/rawBytes"))
            .collect::<Result<Vec<_>, _>>()?;
        let Some((leaf, rest)) = certs.split_first() else {
            return Err(malformed("the bundle's certificate chain is empty"));
        };
        for c in rest {
            let self_signed = X509Certificate::from_der(c)
                .map(|(_, c)| c.subject() == c.issuer())
                .map_err(|e| malformed(format!("chain certificate: {e}")))?;
            if self_signed {
                return Err(ArtifactError::Chain(
                    "the bundle carries a root certificate; roots come only from the trusted root"
                        .into(),
                ));
            }
        }
        return Ok(Some(leaf.clone()));
    }
    if m.get("publicKey").is_some() {
        return Ok(None);
    }
    Err(malformed("bundle has no certificate, chain or public key"))
}

fn log_problem(e: ArtifactError) -> SignatureProblem {
    e.into()
}

/// Verifies one bundle over `artifact` for `signer` under `req`.
pub fn verify(
    bundle: &[u8],
    artifact: &Artifact,
    signer: Signer<'_>,
    req: Requirements,
    trust: &TrustedRoot,
) -> Result<Verified, SignatureProblem> {
    let mut v: Value =
        serde_json::from_slice(bundle).map_err(|e| malformed(format!("bundle: {e}")))?;
    // The bundle is protobuf JSON, where `null` is the field's absence
    // (npm's v0.1 bundles write `"inclusionProof": null` beside a SET).
    drop_nulls(&mut v);
    let ver = version(&v)?;
    let c = content(&v, artifact)?;
    let certs = certificates(&v)?;
    // The key that signed, and the signer as the log records it.
    let owned;
    let (key, signer_der): (&PublicKey, Vec<u8>) = match (&certs, signer) {
        (Some(leaf), Signer::Identity { .. }) => {
            let spki = x509::spki(leaf)?;
            owned = PublicKey::from_spki(&spki).map_err(|e| malformed(e.to_string()))?;
            (&owned, leaf.clone())
        }
        (None, Signer::Key(k)) => (k, k.spki.clone()),
        (Some(_), Signer::Key(_)) => {
            return Err(SignatureProblem::WrongKey);
        }
        (None, Signer::Identity { .. }) => {
            return Err(SignatureProblem::ChainInvalid {
                detail: "the bundle is signed with a key, not a certificate".into(),
            });
        }
    };
    let ok = match (&c.message, &c.digest) {
        (Some(m), _) => key.verify(SigEncoding::Der, m, &c.signature),
        (None, Some(("sha512", d))) => {
            key.verify_prehashed_as(&aws_lc_rs::digest::SHA512, d, &c.signature)
        }
        (None, _) => key.verify_prehashed(&c.payload_sha256, &c.signature),
    };
    if !ok {
        return Err(SignatureProblem::WrongKey);
    }
    let expect = Expected {
        payload_sha256: c.payload_sha256,
        pae_sha256: c.pae_sha256,
        envelope_sha256: None,
        digest: c.digest.as_ref().map(|(a, d)| (*a, d.as_slice())),
        signature: &c.signature,
        signer_der: &signer_der,
    };
    let mut out = Verified {
        times: Vec::new(),
        inclusion_proofs: 0,
        timestamps: 0,
        statement: c.payload.clone(),
        identity: None,
    };
    let entries = v
        .pointer("/verificationMaterial/tlogEntries")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    // An instance that runs no transparency log (GitHub's own, a private
    // deployment) lists none in its trusted root: its bundles carry signed
    // timestamps instead, and those are the time source (the client
    // specification's observer timestamps). The keyless default then
    // means: at least one verified RFC 3161 timestamp. A policy's explicit
    // `required` is never relaxed (policy loading refuses it under such a
    // root; a root refreshed since to list no log fails here).
    let no_log = trust.logs.is_empty();
    let mut req = req;
    if no_log && req.tlog == TlogPolicy::Required && req.tlog_default {
        req.tlog = TlogPolicy::Optional;
        req.timestamps = req.timestamps.max(1);
    }
    if entries.is_empty() && req.tlog == TlogPolicy::Required {
        return Err(SignatureProblem::LogEntryInvalid {
            detail: if no_log {
                "the bundle has no transparency-log entry, and the policy requires one (transparencyLog: required), but its trusted root lists no transparency log".into()
            } else {
                "the bundle has no transparency-log entry, and one is required".into()
            },
        });
    }
    // Logs verified by inclusion proof alone: their validity is checked
    // once the timestamps give the entry a verified time.
    let mut proof_only = Vec::new();
    for e in &entries {
        let (time, proven, log) = log_entry(e, ver, trust, &expect).map_err(log_problem)?;
        if !proven && req.inclusion_proof == TlogPolicy::Required {
            return Err(SignatureProblem::LogEntryInvalid {
                detail: "the log entry has no inclusion proof, and the policy requires one".into(),
            });
        }
        if time.is_none() {
            proof_only.push(log);
        }
        out.times.extend(time);
        out.inclusion_proofs += usize::from(proven);
    }
    if let Some(ts) = v
        .pointer("/verificationMaterial/timestampVerificationData/rfc3161Timestamps")
        .and_then(Value::as_array)
    {
        for t in ts {
            let der = b64(t, "/signedTimestamp")?;
            let at = crate::tsa::verify(&der, &c.signature, trust)?;
            out.times.push(at);
            out.timestamps += 1;
        }
    }
    // A log's key counts only while the trusted root says it is valid: at
    // the entry's verified times (the RFC 3161 times; without any, now).
    // (Entries with a SET were checked at their integrated time.)
    let tsa_times: Vec<i64> = out.times[out.times.len() - out.timestamps..].to_vec();
    for log in proof_only {
        let times = if tsa_times.is_empty() {
            vec![now()]
        } else {
            tsa_times.clone()
        };
        if let Some(t) = times.iter().find(|t| !log.valid_at(**t)) {
            return Err(SignatureProblem::LogEntryInvalid {
                detail: format!(
                    "log {} is not valid at the entry's time (Unix {t}): the trusted root gives it {}",
                    &log.id[..log.id.len().min(12)],
                    log.validity()
                ),
            });
        }
    }
    if out.timestamps < req.timestamps {
        return Err(SignatureProblem::LevelCheck {
            detail: if no_log {
                format!(
                    "{} verified RFC 3161 timestamp(s): the trusted root lists no transparency log, so a signed timestamp from one of its timestamp authorities is required",
                    out.timestamps
                )
            } else {
                format!(
                    "{} verified RFC 3161 timestamp(s); the policy requires {}",
                    out.timestamps, req.timestamps
                )
            },
        });
    }
    let Some(leaf) = &certs else {
        return Ok(out);
    };
    let Signer::Identity {
        san,
        issuer,
        extensions,
    } = signer
    else {
        return Ok(out);
    };
    // A certificate is judged at verified times only: a SET's integrated
    // time or a timestamp authority's time; never "now".
    if out.times.is_empty() {
        return Err(SignatureProblem::LogEntryInvalid {
            detail: "no verified signing time (no SET and no RFC 3161 timestamp) to check the certificate at".into(),
        });
    }
    certificate_at(leaf, trust, &out.times)?;
    let id = x509::identity(leaf)?;
    identity_matches(&id, san, issuer, extensions)?;
    out.identity = Some(id);
    Ok(out)
}

/// The certificate checks every signature path shares: the leaf chains to
/// a Fulcio CA of the trusted root at every one of `times`, and, when the
/// trusted root lists CT logs, carries an SCT that verifies with one of them.
/// Certificates the signature carries beside its leaf (a bundle's chain,
/// cosign's chain annotation) play no part.
pub(crate) fn certificate_at(
    leaf: &[u8],
    trust: &TrustedRoot,
    times: &[i64],
) -> Result<(), SignatureProblem> {
    let mut issuer_spki = None;
    for &at in times {
        issuer_spki = Some(chain_at(leaf, trust, at)?);
    }
    if let Some(spki) = issuer_spki
        && !trust.ctlogs.is_empty()
    {
        crate::sct::verify(leaf, &spki, trust)?;
    }
    Ok(())
}

/// The certificate chains to a Fulcio CA of the trusted root valid at `at`,
/// through that authority's own certificates alone (one chain, one
/// window); returns the SubjectPublicKeyInfo of the leaf's issuer (for SCTs).
fn chain_at(leaf: &[u8], trust: &TrustedRoot, at: i64) -> Result<Vec<u8>, ArtifactError> {
    let mut last = if trust.authorities.iter().any(|a| a.valid_at(at)) {
        "no certificate authority in the trusted root".to_owned()
    } else {
        format!(
            "no certificate authority of the trusted root is valid at the signing time (Unix {at})"
        )
    };
    for a in trust.authorities.iter().filter(|a| a.valid_at(at)) {
        match x509::verified_issuer(leaf, &a.intermediates, &a.root, at, Eku::Required) {
            Ok(issuer) => return x509::spki(&issuer),
            Err(e) => {
                last = format!(
                    "{e}: the certificate does not chain to a certificate authority of the trusted root valid at the signing time through that authority's own certificates (intermediates a signature carries are not used)"
                )
            }
        }
    }
    Err(ArtifactError::Chain(last))
}

/// The current time, Unix seconds.
fn now() -> i64 {
    time::OffsetDateTime::now_utc().unix_timestamp()
}

/// Removes every object member whose value is `null` (protobuf JSON:
/// absent), at any depth.
fn drop_nulls(v: &mut Value) {
    match v {
        Value::Object(m) => {
            m.retain(|_, x| !x.is_null());
            m.values_mut().for_each(drop_nulls);
        }
        Value::Array(a) => a.iter_mut().for_each(drop_nulls),
        _ => {}
    }
}
