//! in-toto statements and DSSE envelopes as the signers write them (cosign
//! `attest`, `--new-bundle-format`, GitHub's attest action): the statement
//! about one digest, and the pre-authentication encoding a DSSE signature
//! is over. Written here, not taken from sigil-verify, so a mistake in the
//! verifier's encoding cannot be mirrored by the fixtures it is tested with
//! (the real vectors under `tests/vectors` check both against other tools).

use serde_json::{Value, json};

/// DSSE payload type of an in-toto statement.
pub const PAYLOAD_TYPE: &str = "application/vnd.in-toto+json";
/// The predicate type of cosign's signature-as-statement.
pub const COSIGN_SIGN: &str = "https://sigstore.dev/cosign/sign/v1";

/// An in-toto v1 statement about `digest` (`sha256:…` or bare hex).
pub fn statement(digest: &str, predicate_type: &str, predicate: Value) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "_type": "https://in-toto.io/Statement/v1",
        "subject": [{"name": "", "digest": {"sha256": digest.trim_start_matches("sha256:")}}],
        "predicateType": predicate_type,
        "predicate": predicate
    }))
    .expect("statement")
}

/// `DSSEv1 <len> <type> <len> <payload>`.
pub fn pae(payload_type: &str, payload: &[u8]) -> Vec<u8> {
    let mut m = format!(
        "DSSEv1 {} {payload_type} {} ",
        payload_type.len(),
        payload.len()
    )
    .into_bytes();
    m.extend_from_slice(payload);
    m
}
