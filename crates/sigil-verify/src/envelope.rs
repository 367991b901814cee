//! Bare DSSE envelopes — what `cosign attest --key` writes and
//! `cosign download attestation` prints, one per line — verified with a
//! public key. An envelope carries no certificate, log entry or timestamp,
//! so the key is the only trust: a signature over the DSSE
//! pre-authentication encoding that verifies with it, and a statement whose
//! subject names the artifact. Anything an envelope would need a log for
//! (keyless signers) goes through a Sigstore bundle ([`crate::bundle`]).

use base64::Engine as _;
use serde_json::Value;
use sigil_core::SignatureProblem;

use crate::ArtifactError;
use crate::bundle::{Artifact, Verified, subject_binds};
use crate::keys::{PublicKey, SigEncoding};

/// Whether `v` looks like a bare envelope (not a bundle).
pub fn is_envelope(v: &Value) -> bool {
    v.get("payloadType").is_some() && v.get("signatures").is_some() && v.get("mediaType").is_none()
}

fn decode(s: &str) -> Option<Vec<u8>> {
    let e = base64::engine::general_purpose::STANDARD;
    let u = base64::engine::general_purpose::URL_SAFE;
    e.decode(s.trim()).or_else(|_| u.decode(s.trim())).ok()
}

/// Verifies an envelope with `key`: at least one of its signatures must
/// verify over the PAE, and the statement must name `artifact`.
pub fn verify(
    envelope: &[u8],
    artifact: &Artifact,
    key: &PublicKey,
) -> Result<Verified, SignatureProblem> {
    let malformed = |m: String| SignatureProblem::from(ArtifactError::Malformed(m));
    let v: Value =
        serde_json::from_slice(envelope).map_err(|e| malformed(format!("DSSE envelope: {e}")))?;
    let payload_type = v["payloadType"]
        .as_str()
        .ok_or_else(|| malformed("DSSE envelope has no payloadType".into()))?;
    let payload = v["payload"]
        .as_str()
        .and_then(decode)
        .ok_or_else(|| malformed("DSSE envelope has no base64 payload".into()))?;
    let sigs: Vec<Vec<u8>> = v["signatures"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|s| decode(s["sig"].as_str()?))
                .collect()
        })
        .unwrap_or_default();
    if sigs.is_empty() {
        return Err(malformed("DSSE envelope has no signatures".into()));
    }
    let pae = crate::pae(payload_type, &payload);
    if !sigs.iter().any(|s| key.verify(SigEncoding::Der, &pae, s)) {
        return Err(SignatureProblem::WrongKey);
    }
    subject_binds(&payload, artifact)?;
    Ok(Verified {
        times: Vec::new(),
        inclusion_proofs: 0,
        timestamps: 0,
        statement: Some(payload),
        identity: None,
    })
}
