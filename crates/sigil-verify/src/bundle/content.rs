//! A bundle's signed content: which of `messageSignature` or `dsseEnvelope`
//! it carries, the bytes its signature covers and the hashes a log entry
//! must record, and (for DSSE) the in-toto statement's subject bound to the
//! artifact. Owns no signature or log check: `super::verify` runs those on
//! what this returns.

use serde_json::Value;

use sigil_core::SignatureProblem;

use super::{Artifact, b64, malformed};
use crate::{ArtifactError, sha256};

/// The signed content, reduced to what every later check needs.
pub(super) struct Content {
    /// The bytes the signature covers (the artifact, or the DSSE PAE); `None`
    /// when only the artifact's digest is known.
    pub(super) message: Option<Vec<u8>>,
    /// SHA-256 of what the log records as the payload.
    pub(super) payload_sha256: [u8; 32],
    /// SHA-256 of the DSSE PAE, for DSSE.
    pub(super) pae_sha256: Option<[u8; 32]>,
    /// The DSSE payload (the in-toto statement), for DSSE.
    pub(super) payload: Option<Vec<u8>>,
    pub(super) signature: Vec<u8>,
    /// For a message signature whose digest is not SHA-256 (P-384 signs
    /// SHA-384, P-521 SHA-512): the algorithm as Rekor names it and the
    /// artifact's digest under it, which the log entry records.
    pub(super) digest: Option<(&'static str, Vec<u8>)>,
}

/// The artifact's digest under a bundle's `messageDigest.algorithm`
/// (Sigstore's registry: SHA2_256, SHA2_384, SHA2_512), as
/// `(rekor name, digest)`; any other algorithm is refused by name.
fn message_digest(
    alg: &str,
    artifact: &Artifact,
) -> Result<(&'static str, Vec<u8>), ArtifactError> {
    use aws_lc_rs::digest;
    let (name, algorithm) = match alg {
        "SHA2_256" => return Ok(("sha256", artifact.sha256()?.to_vec())),
        "SHA2_384" => ("sha384", &digest::SHA384),
        "SHA2_512" => ("sha512", &digest::SHA512),
        other => {
            return Err(malformed(format!(
                "message digest algorithm {other} is not in Sigstore's algorithm registry (SHA2_256, SHA2_384, SHA2_512)"
            )));
        }
    };
    match artifact {
        Artifact::Bytes(b) => Ok((name, digest::digest(algorithm, b).as_ref().to_vec())),
        Artifact::Sha512(d) if name == "sha512" => Ok((name, d.to_vec())),
        _ => Err(malformed(format!(
            "the bundle signs the artifact's {alg} digest: give the artifact itself, not its digest"
        ))),
    }
}

/// Which content a bundle carries. `content` is a protobuf `oneof`: a bundle
/// with both (or neither) is malformed — with both, a verifier that checks
/// one signature and reads the other's statement trusts what nobody signed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ContentKind {
    MessageSignature,
    Dsse,
}

pub(crate) fn content_kind(v: &Value) -> Result<ContentKind, ArtifactError> {
    match (v.get("messageSignature"), v.get("dsseEnvelope")) {
        (Some(_), Some(_)) => Err(malformed(
            "the bundle carries both messageSignature and dsseEnvelope; its content must be exactly one of them",
        )),
        (Some(_), None) => Ok(ContentKind::MessageSignature),
        (None, Some(_)) => Ok(ContentKind::Dsse),
        (None, None) => Err(malformed(
            "bundle has neither messageSignature nor dsseEnvelope",
        )),
    }
}

pub(super) fn content(v: &Value, artifact: &Artifact) -> Result<Content, SignatureProblem> {
    if content_kind(v)? == ContentKind::MessageSignature {
        let signature = b64(v, "/messageSignature/signature")?;
        let mut digest = None;
        if let Some(d) = v.pointer("/messageSignature/messageDigest") {
            // A digest that names no algorithm means nothing (the
            // specification's UNSPECIFIED): refused, not read as SHA-256.
            let alg = d
                .get("algorithm")
                .and_then(Value::as_str)
                .ok_or_else(|| malformed("the message digest names no algorithm"))?;
            let (name, want) = message_digest(alg, artifact)?;
            let signed = b64(d, "/digest")?;
            if signed != want {
                return Err(SignatureProblem::DigestMismatch {
                    signed: format!("{name}:{}", crate::trust::hex(&signed)),
                });
            }
            if name != "sha256" {
                digest = Some((name, want));
            }
        }
        // The log's payload hash: SHA-256 unless the digest says otherwise
        // (then only the bytes are hashed, and the entry records `digest`).
        let payload_sha256 = match (&digest, artifact) {
            (Some(_), Artifact::Bytes(b)) => sha256(b),
            (Some(_), _) => [0; 32],
            (None, _) => artifact.sha256()?,
        };
        return Ok(Content {
            message: match artifact {
                Artifact::Bytes(b) => Some(b.clone()),
                Artifact::Digest(_) | Artifact::Sha512(_) => None,
            },
            payload: None,
            payload_sha256,
            pae_sha256: None,
            signature,
            digest,
        });
    }
    let env = v
        .get("dsseEnvelope")
        .ok_or_else(|| malformed("bundle has no dsseEnvelope"))?;
    let payload = b64(env, "/payload")?;
    let payload_type = env
        .get("payloadType")
        .and_then(Value::as_str)
        .ok_or_else(|| malformed("DSSE envelope has no payloadType"))?;
    let sigs = env
        .get("signatures")
        .and_then(Value::as_array)
        .map_or(0, Vec::len);
    if sigs != 1 {
        return Err(malformed(format!(
            "DSSE envelope has {sigs} signatures; exactly one is required"
        ))
        .into());
    }
    let signature = b64(env, "/signatures/0/sig")?;
    subject_binds(&payload, artifact)?;
    let pae = crate::pae(payload_type, &payload);
    Ok(Content {
        payload_sha256: sha256(&payload),
        pae_sha256: Some(sha256(&pae)),
        message: Some(pae),
        payload: Some(payload),
        signature,
        digest: None,
    })
}

/// The artifact must be a subject of the in-toto statement `payload`: a
/// statement about another digest counts as none.
pub(crate) fn subject_binds(payload: &[u8], artifact: &Artifact) -> Result<(), SignatureProblem> {
    // Only the subjects are read: the predicate (an SBOM may be megabytes)
    // is skipped, not built.
    #[derive(serde::Deserialize)]
    struct Subjects {
        #[serde(default)]
        subject: Option<Vec<Subject>>,
    }
    #[derive(serde::Deserialize)]
    struct Subject {
        #[serde(default)]
        digest: std::collections::BTreeMap<String, Value>,
    }
    let stmt: Subjects = serde_json::from_slice(payload)
        .map_err(|e| malformed(format!("DSSE payload is not an in-toto statement: {e}")))?;
    let wants = artifact.subject_digests();
    let subjects = stmt.subject.unwrap_or_default();
    let bound = subjects.iter().any(|s| {
        wants.iter().any(|(alg, want)| {
            s.digest
                .get(*alg)
                .and_then(Value::as_str)
                .is_some_and(|d| d.eq_ignore_ascii_case(want))
        })
    });
    if bound {
        return Ok(());
    }
    let signed = subjects
        .first()
        .and_then(|s| s.digest.iter().next())
        .map_or_else(
            || "(no subject digest)".to_owned(),
            |(alg, d)| format!("{alg}:{}", d.as_str().unwrap_or_default()),
        );
    Err(SignatureProblem::DigestMismatch { signed })
}
