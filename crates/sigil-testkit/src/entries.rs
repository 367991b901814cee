//! Rekor v1 entry bodies of every kind cosign and its peers have written,
//! minted as Rekor canonicalizes them (what a SET signs and a log serves),
//! so tests can log one signature or attestation as any of them:
//!
//! | kind | written by | records |
//! |---|---|---|
//! | `hashedrekord` 0.0.1 | cosign ≥ 1.5 `sign` | payload hash, signature, signer |
//! | `rekord` 0.0.1 | cosign < 1.5 `sign` | payload hash (Rekor computes it), signature, signer |
//! | `intoto` 0.0.1 | cosign < 2.0 `attest` (container builders in 2021–2023) | hash of the envelope as uploaded, payload hash, signer — no signature |
//! | `intoto` 0.0.2 | cosign 2.x `attest` | the envelope's signatures (base64 twice) and signer, payload hash |
//! | `dsse` 0.0.1 | cosign ≥ 2.2 `attest --tlog-upload` with dsse, sigstore-go, GitHub | envelope hash, payload hash, signatures with their verifiers |
//!
//! (Layouts after Rekor's `pkg/types/*/v0.0.x/entry.go` `Canonicalize`.)

use serde_json::{Value, json};

use crate::signing::b64;

/// A Rekor v1 entry kind and version.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogKind {
    /// `hashedrekord` 0.0.1.
    HashedRekord,
    /// `rekord` 0.0.1.
    Rekord,
    /// `intoto` 0.0.1.
    Intoto001,
    /// `intoto` 0.0.2.
    Intoto002,
    /// `dsse` 0.0.1.
    Dsse001,
}

impl LogKind {
    /// `kind/apiVersion`, as reports name it.
    pub fn name(self) -> &'static str {
        match self {
            LogKind::HashedRekord => "hashedrekord/0.0.1",
            LogKind::Rekord => "rekord/0.0.1",
            LogKind::Intoto001 => "intoto/0.0.1",
            LogKind::Intoto002 => "intoto/0.0.2",
            LogKind::Dsse001 => "dsse/0.0.1",
        }
    }
}

fn digest(d: &[u8]) -> Value {
    use sha2::Digest as _;
    let hex: String = sha2::Sha256::digest(d)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    json!({"algorithm": "sha256", "value": hex})
}

/// The body logging a signature over `payload` (a `.sig` layer) by the
/// signer whose PEM is `signer_pem`.
pub fn signature_body(
    kind: LogKind,
    payload: &[u8],
    signature: &[u8],
    signer_pem: &str,
) -> Vec<u8> {
    let (name, version) = match kind {
        LogKind::HashedRekord => ("hashedrekord", "0.0.1"),
        LogKind::Rekord => ("rekord", "0.0.1"),
        other => panic!("{} logs attestations, not signatures", other.name()),
    };
    let mut spec = json!({
        "data": {"hash": digest(payload)},
        "signature": {"content": b64(signature), "publicKey": {"content": b64(signer_pem.as_bytes())}}
    });
    if kind == LogKind::Rekord {
        spec["signature"]["format"] = json!("x509");
    }
    serde_json::to_vec(&json!({"apiVersion": version, "kind": name, "spec": spec})).unwrap()
}

/// The body logging a DSSE `envelope` (its bytes as uploaded) carrying
/// `statement`, signed `signature` by `signer_pem`.
pub fn attestation_body(
    kind: LogKind,
    envelope: &[u8],
    statement: &[u8],
    signature: &[u8],
    signer_pem: &str,
) -> Vec<u8> {
    let body = match kind {
        LogKind::Intoto001 => json!({"apiVersion": "0.0.1", "kind": "intoto", "spec": {
            "content": {"hash": digest(envelope), "payloadHash": digest(statement)},
            "publicKey": b64(signer_pem.as_bytes())
        }}),
        LogKind::Intoto002 => json!({"apiVersion": "0.0.2", "kind": "intoto", "spec": {"content": {
            "envelope": {"payloadType": crate::intoto::PAYLOAD_TYPE, "signatures": [
                {"sig": b64(b64(signature).as_bytes()), "publicKey": b64(signer_pem.as_bytes())}]},
            "payloadHash": digest(statement)
        }}}),
        LogKind::Dsse001 => json!({"apiVersion": "0.0.1", "kind": "dsse", "spec": {
            "envelopeHash": digest(envelope),
            "payloadHash": digest(statement),
            "signatures": [{"signature": b64(signature), "verifier": b64(signer_pem.as_bytes())}]
        }}),
        other => panic!("{} logs signatures, not attestations", other.name()),
    };
    serde_json::to_vec(&body).unwrap()
}
