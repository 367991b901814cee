//! cosign signatures: the legacy `sha256-<hex>.sig` layout and Sigstore
//! bundles (v0.3, found through referrers), checked against a key or a
//! keyless identity.
//!
//! Owns turning either layout into one [`Item`] (what was signed, the
//! signature, the certificate and chain if any, the Rekor entries) and the
//! order of checks for one item under one verifier: signature, log entry,
//! chain at the log's integrated time, identity, and last the binding to the
//! pinned digest. It fetches nothing; `gather` hands it bytes.

use crate::ArtifactError;
use base64::Engine as _;
use serde_json::Value;
use sigil_core::SignatureProblem;
use sigil_core::verify::TlogPolicy;

use crate::bundle::{Matcher, Requirements};
use crate::keys::{PublicKey, SigEncoding};
use crate::rekor::{Entry, Expected};
use crate::trust::TrustedRoot;
use crate::x509;

/// Annotation holding the base64 signature of a legacy layer.
pub const SIGNATURE_ANNOTATION: &str = "dev.cosignproject.cosign/signature";
/// Annotation holding the Fulcio certificate (PEM).
pub const CERT_ANNOTATION: &str = "dev.sigstore.cosign/certificate";
/// Annotation holding the certificate chain (PEM): never read — a chain is
/// built from the trusted root's authority alone.
pub const CHAIN_ANNOTATION: &str = "dev.sigstore.cosign/chain";
/// Annotation holding the Rekor bundle (JSON).
pub const BUNDLE_ANNOTATION: &str = "dev.sigstore.cosign/bundle";
/// Media type (and artifactType) of a Sigstore bundle v0.3.
pub const BUNDLE_MEDIA_TYPE: &str = "application/vnd.dev.sigstore.bundle.v0.3+json";
/// What every Sigstore bundle media type starts with (v0.1–v0.3).
pub const BUNDLE_PREFIX: &str = "application/vnd.dev.sigstore.bundle";
/// The in-toto predicate `cosign sign --new-bundle-format` signs.
pub const SIGN_PREDICATE: &str = "https://sigstore.dev/cosign/sign/v1";

/// One cosign signature, in either layout.
#[derive(Debug, Clone)]
pub struct Item {
    /// The exact bytes the signature covers.
    pub message: Vec<u8>,
    /// SHA-256 of the payload as the log records it.
    pub payload_sha256: [u8; 32],
    /// Raw signature.
    pub signature: Vec<u8>,
    /// Signing certificate (DER), for keyless.
    pub cert: Option<Vec<u8>>,
    /// Log entries (or why one could not be read).
    pub entries: Vec<Result<Entry, ArtifactError>>,
    /// The image digest the payload names, or why none could be read.
    pub signed_digest: Result<String, ArtifactError>,
    /// The whole Sigstore bundle, when the item came from one: verified as a
    /// bundle (inclusion proofs, checkpoints, timestamps, SCTs).
    pub bundle: Option<std::sync::Arc<[u8]>>,
    /// SHA-256 of the DSSE envelope exactly as it was uploaded (a `.att`
    /// layer's bytes): what an `intoto` 0.0.1 entry records in place of
    /// the signature.
    pub envelope_sha256: Option<[u8; 32]>,
}

impl Item {
    /// Its form and log entry kind, for reports: `cosign .sig layer,
    /// keyless, Rekor hashedrekord/0.0.1`, `Sigstore bundle, key, Rekor
    /// dsse/0.0.2`.
    pub fn describe(&self) -> String {
        let form = if self.bundle.is_some() {
            "Sigstore bundle"
        } else if self.envelope_sha256.is_some() {
            "cosign .att layer"
        } else {
            "cosign .sig layer"
        };
        let signer = if self.cert.is_some() {
            "keyless"
        } else {
            "key"
        };
        let kinds: Vec<String> = self
            .entries
            .iter()
            .map(|e| match e {
                Ok(e) => crate::rekor::kind_of(&e.body).unwrap_or_else(|| "unreadable".into()),
                Err(_) => "unreadable".into(),
            })
            .collect();
        let log = if kinds.is_empty() {
            "no log entry".to_owned()
        } else {
            format!("Rekor {}", kinds.join(", "))
        };
        format!("{form}, {signer}, {log}")
    }

    /// A layer of a legacy `.sig` manifest: the simple-signing payload blob
    /// and the layer's annotations.
    pub fn from_legacy(
        payload: Vec<u8>,
        annotations: &serde_json::Map<String, Value>,
    ) -> Result<Item, ArtifactError> {
        let ann = |k: &str| annotations.get(k).and_then(|v| v.as_str());
        let sig_b64 = ann(SIGNATURE_ANNOTATION).ok_or(ArtifactError::Malformed(
            "layer has no signature annotation".into(),
        ))?;
        let signature = base64::engine::general_purpose::STANDARD
            .decode(sig_b64.trim())
            .map_err(|e| {
                ArtifactError::Malformed(format!("signature annotation is not base64: {e}"))
            })?;
        let cert = match ann(CERT_ANNOTATION).filter(|s| !s.trim().is_empty()) {
            Some(pem) => Some(x509::certs_from_pem(pem).into_iter().next().ok_or(
                ArtifactError::Malformed("certificate annotation holds no certificate".into()),
            )?),
            None => None,
        };
        let entries = ann(BUNDLE_ANNOTATION)
            .map(|b| vec![Entry::from_legacy_annotation(b)])
            .unwrap_or_default();
        let signed_digest = simple_signing_digest(&payload);
        Ok(Item {
            payload_sha256: crate::sha256(&payload),
            message: payload,
            signature,
            cert,
            entries,
            signed_digest,
            bundle: None,
            envelope_sha256: None,
        })
    }

    /// A Sigstore bundle (v0.3; v0.1/v0.2 certificate chains also read) with a DSSE envelope.
    pub fn from_bundle(bytes: &[u8]) -> Result<Item, ArtifactError> {
        let v: Value = serde_json::from_slice(bytes)
            .map_err(|e| ArtifactError::Malformed(format!("bundle: {e}")))?;
        let std = base64::engine::general_purpose::STANDARD;
        let b64 = |p: &str| -> Result<Vec<u8>, ArtifactError> {
            let s = v
                .pointer(p)
                .and_then(|x| x.as_str())
                .ok_or_else(|| ArtifactError::Malformed(format!("bundle has no {p}")))?;
            std.decode(s.trim())
                .map_err(|e| ArtifactError::Malformed(format!("bundle {p}: {e}")))
        };
        let mt = v
            .get("mediaType")
            .and_then(|m| m.as_str())
            .unwrap_or_default();
        if !mt.starts_with("application/vnd.dev.sigstore.bundle") {
            return Err(ArtifactError::Malformed(format!(
                "not a Sigstore bundle (mediaType {mt:?})"
            )));
        }
        if crate::bundle::content_kind(&v)? != crate::bundle::ContentKind::Dsse {
            return Err(ArtifactError::Malformed("bundle carries a messageSignature, not the DSSE envelope cosign sign writes for images".into()));
        }
        let payload = b64("/dsseEnvelope/payload")?;
        let payload_type = v
            .pointer("/dsseEnvelope/payloadType")
            .and_then(|x| x.as_str())
            .ok_or(ArtifactError::Malformed("bundle has no payloadType".into()))?;
        let signature = b64("/dsseEnvelope/signatures/0/sig")?;
        let cert = if v.pointer("/verificationMaterial/certificate").is_some() {
            Some(b64("/verificationMaterial/certificate/rawBytes")?)
        } else if v
            .pointer("/verificationMaterial/x509CertificateChain")
            .is_some()
        {
            Some(b64(
                "/verificationMaterial/x509CertificateChain/certificates/0/rawBytes",
            )?)
        } else {
            None
        };
        let entries = v
            .pointer("/verificationMaterial/tlogEntries")
            .and_then(|t| t.as_array())
            .map(|a| a.iter().map(bundle_entry).collect())
            .unwrap_or_default();
        let signed_digest = if payload_type == "application/vnd.in-toto+json" {
            statement_digest(&payload)
        } else {
            Err(ArtifactError::Malformed(format!(
                "DSSE payload type {payload_type:?} is not an in-toto statement"
            )))
        };
        Ok(Item {
            message: crate::pae(payload_type, &payload),
            payload_sha256: crate::sha256(&payload),
            signature,
            cert,
            entries,
            signed_digest,
            bundle: Some(bytes.into()),
            envelope_sha256: None,
        })
    }
}

fn int_field(v: &Value, k: &str) -> Option<i64> {
    match v.get(k)? {
        Value::Number(n) => n.as_i64(),
        Value::String(s) => s.parse().ok(),
        _ => None,
    }
}

fn bundle_entry(t: &Value) -> Result<Entry, ArtifactError> {
    let std = base64::engine::general_purpose::STANDARD;
    let get = |p: &str| t.pointer(p).and_then(|x| x.as_str());
    let key_id =
        get("/logId/keyId").ok_or(ArtifactError::Malformed("log entry has no logId".into()))?;
    let set = get("/inclusionPromise/signedEntryTimestamp").ok_or(ArtifactError::Malformed(
        "log entry has no inclusion promise (SET)".into(),
    ))?;
    Ok(Entry {
        body: std
            .decode(
                get("/canonicalizedBody")
                    .ok_or(ArtifactError::Malformed("log entry has no body".into()))?,
            )
            .map_err(|e| ArtifactError::Malformed(format!("log entry body: {e}")))?,
        integrated_time: int_field(t, "integratedTime").ok_or(ArtifactError::Malformed(
            "log entry has no integratedTime".into(),
        ))?,
        log_index: int_field(t, "logIndex")
            .ok_or(ArtifactError::Malformed("log entry has no logIndex".into()))?,
        log_id: crate::trust::hex(
            &std.decode(key_id)
                .map_err(|e| ArtifactError::Malformed(format!("logId: {e}")))?,
        ),
        set: std
            .decode(set)
            .map_err(|e| ArtifactError::Malformed(format!("SET: {e}")))?,
    })
}

/// `critical.image.docker-manifest-digest` of a simple-signing payload.
pub fn simple_signing_digest(payload: &[u8]) -> Result<String, ArtifactError> {
    let v: Value = serde_json::from_slice(payload)
        .map_err(|e| ArtifactError::Malformed(format!("simple-signing payload: {e}")))?;
    let ty = v.pointer("/critical/type").and_then(|t| t.as_str());
    if ty != Some("cosign container image signature") {
        return Err(ArtifactError::Malformed(format!(
            "payload type {ty:?} is not a cosign container image signature"
        )));
    }
    v.pointer("/critical/image/docker-manifest-digest")
        .and_then(|d| d.as_str())
        .map(str::to_owned)
        .ok_or_else(|| ArtifactError::Malformed("payload names no docker-manifest-digest".into()))
}

/// The subject digest of an in-toto statement made by `cosign sign`.
fn statement_digest(payload: &[u8]) -> Result<String, ArtifactError> {
    let v: Value = serde_json::from_slice(payload)
        .map_err(|e| ArtifactError::Malformed(format!("in-toto statement: {e}")))?;
    let pt = v.get("predicateType").and_then(|p| p.as_str());
    if pt != Some(SIGN_PREDICATE) {
        return Err(ArtifactError::Malformed(format!(
            "in-toto predicateType {pt:?} is an attestation, not a cosign image signature"
        )));
    }
    let subjects = v
        .get("subject")
        .and_then(|s| s.as_array())
        .ok_or(ArtifactError::Malformed("statement has no subject".into()))?;
    match subjects.as_slice() {
        [one] => one
            .pointer("/digest/sha256")
            .and_then(|d| d.as_str())
            .map(|h| format!("sha256:{}", h.to_ascii_lowercase()))
            .ok_or_else(|| {
                ArtifactError::Malformed("statement subject has no sha256 digest".into())
            }),
        _ => Err(ArtifactError::Malformed(format!(
            "statement names {} subjects; expected one image",
            subjects.len()
        ))),
    }
}

/// A loaded cosign verifier.
#[derive(Debug)]
pub enum CosignCheck {
    /// Key-based.
    Key {
        /// The trusted public key.
        key: PublicKey,
        /// Log entries, inclusion proofs and timestamps required.
        req: Requirements,
        /// Logs to check entries against.
        trust: std::sync::Arc<TrustedRoot>,
    },
    /// Keyless (Fulcio).
    Keyless {
        /// Required OIDC issuer.
        issuer: Matcher,
        /// Required SAN.
        subject: Matcher,
        /// Fulcio extensions that must match, by name.
        extensions: Vec<(String, Matcher)>,
        /// Log entries, inclusion proofs and timestamps required.
        req: Requirements,
        /// Fulcio CAs and Rekor keys.
        trust: std::sync::Arc<TrustedRoot>,
    },
}

/// What checking a signature proved besides its validity.
#[derive(Debug, Clone, Default)]
pub struct Checked {
    /// Verified signing times (log integrated times, RFC 3161 times).
    pub times: Vec<i64>,
    /// The certificate's identity, for keyless.
    pub identity: Option<x509::Identity>,
}

impl CosignCheck {
    /// Checks one item; `Ok` means this signature satisfies the verifier for `digest`.
    pub fn check(&self, item: &Item, digest: &str, now: i64) -> Result<(), SignatureProblem> {
        if let Some(b) = &item.bundle {
            bind(item, digest)?;
            return self.verify_bundle(b, digest).map(|_| ());
        }
        self.check_signed(item, now)?;
        bind(item, digest)
    }

    /// The log and timestamp requirements and the trusted root.
    fn parts(&self) -> (Requirements, &TrustedRoot) {
        match self {
            CosignCheck::Key { req, trust, .. } | CosignCheck::Keyless { req, trust, .. } => {
                (*req, trust)
            }
        }
    }

    /// Every check of a legacy item (signature, log entry, chain at the
    /// log's time, identity) except what it is about: the caller binds the
    /// payload to the digest (a simple-signing payload, or an attestation's
    /// in-toto subject).
    pub fn check_signed(&self, item: &Item, now: i64) -> Result<Checked, SignatureProblem> {
        let (req, trust) = self.parts();
        if req.inclusion_proof == TlogPolicy::Required {
            return Err(SignatureProblem::LogEntryInvalid {
                detail: "a legacy cosign signature carries no inclusion proof, and the policy requires one (sign with --new-bundle-format)".into(),
            });
        }
        if req.timestamps > 0 {
            return Err(SignatureProblem::LevelCheck {
                detail: format!(
                    "a legacy cosign signature carries no RFC 3161 timestamp; the policy requires {}",
                    req.timestamps
                ),
            });
        }
        match self {
            CosignCheck::Key { key, .. } => {
                if !key.verify(SigEncoding::Der, &item.message, &item.signature) {
                    return Err(SignatureProblem::WrongKey);
                }
                let at = check_entries(item, trust, req.tlog, &key.spki)?;
                Ok(Checked {
                    times: at.into_iter().collect(),
                    identity: None,
                })
            }
            CosignCheck::Keyless {
                issuer,
                subject,
                extensions,
                ..
            } => {
                let Some(cert) = &item.cert else {
                    return Err(SignatureProblem::ChainInvalid {
                        detail: "signature carries no certificate (it was made with a key)".into(),
                    });
                };
                let spki = x509::spki(cert).map_err(SignatureProblem::from)?;
                let key = PublicKey::from_spki(&spki).map_err(|e| SignatureProblem::Malformed {
                    detail: e.to_string(),
                })?;
                if !key.verify(SigEncoding::Der, &item.message, &item.signature) {
                    return Err(SignatureProblem::WrongKey);
                }
                // Fulcio leaves live ten minutes: the chain is checked at the
                // time the log saw the signature, never at "now".
                let logged = check_entries(item, trust, req.tlog, cert)?;
                crate::bundle::certificate_at(cert, trust, &[logged.unwrap_or(now)])?;
                let id = x509::identity(cert).map_err(SignatureProblem::from)?;
                crate::bundle::identity_matches(&id, subject, issuer, extensions)?;
                Ok(Checked {
                    times: logged.into_iter().collect(),
                    identity: Some(id),
                })
            }
        }
    }

    /// Verifies a whole Sigstore bundle as the Sigstore client spec says,
    /// with the image digest as the artifact (a DSSE statement must name it).
    pub fn verify_bundle(
        &self,
        bundle: &[u8],
        digest: &str,
    ) -> Result<crate::bundle::Verified, SignatureProblem> {
        let artifact = crate::bundle::Artifact::Digest(sha256_bytes(digest)?);
        let (req, trust) = self.parts();
        let signer = match self {
            CosignCheck::Key { key, .. } => crate::bundle::Signer::Key(key),
            CosignCheck::Keyless {
                issuer,
                subject,
                extensions,
                ..
            } => crate::bundle::Signer::Identity {
                san: subject,
                issuer,
                extensions,
            },
        };
        crate::bundle::verify(bundle, &artifact, signer, req, trust)
    }
}

/// The 32 bytes of a `sha256:<hex>` digest.
pub(crate) fn sha256_bytes(digest: &str) -> Result<[u8; 32], SignatureProblem> {
    let bad = || SignatureProblem::Malformed {
        detail: format!("{digest} is not a sha256 digest"),
    };
    let hex = digest.strip_prefix("sha256:").ok_or_else(bad)?;
    if hex.len() != 64 || !hex.is_ascii() {
        return Err(bad());
    }
    let mut d = [0u8; 32];
    for (i, b) in d.iter_mut().enumerate() {
        *b = u8::from_str_radix(&hex[i * 2..i * 2 + 2], 16).map_err(|_| bad())?;
    }
    Ok(d)
}

/// Verifies the item's log entries; returns the integrated time of the first
/// valid one. A present entry that fails is always an error; a missing one
/// only when the policy requires it.
fn check_entries(
    item: &Item,
    trust: &TrustedRoot,
    tlog: TlogPolicy,
    signer_der: &[u8],
) -> Result<Option<i64>, SignatureProblem> {
    if item.entries.is_empty() {
        return match tlog {
            TlogPolicy::Required => Err(SignatureProblem::LogEntryInvalid {
                detail: "no transparency-log entry, and the policy requires one".into(),
            }),
            TlogPolicy::Optional => Ok(None),
        };
    }
    let expect = Expected {
        payload_sha256: item.payload_sha256,
        pae_sha256: Some(crate::sha256(&item.message)),
        envelope_sha256: item.envelope_sha256,
        digest: None,
        signature: &item.signature,
        signer_der,
    };
    let mut last = String::new();
    for e in &item.entries {
        match e
            .as_ref()
            .map_err(Clone::clone)
            .and_then(|e| e.verify(trust, &expect))
        {
            Ok(t) => return Ok(Some(t)),
            Err(m) => last = m.to_string(),
        }
    }
    Err(SignatureProblem::LogEntryInvalid { detail: last })
}

fn bind(item: &Item, digest: &str) -> Result<(), SignatureProblem> {
    match &item.signed_digest {
        Ok(d) if d == digest => Ok(()),
        Ok(d) => Err(SignatureProblem::DigestMismatch { signed: d.clone() }),
        Err(e) => Err(e.clone().into()),
    }
}
