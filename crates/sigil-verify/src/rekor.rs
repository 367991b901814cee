//! Rekor transparency-log entries, checked offline.
//!
//! Owns the Signed Entry Timestamp (the log's signature over the canonical
//! JSON of body, integratedTime, logID and logIndex) and tying the entry's
//! body to the signature in hand: same signature bytes, same signer, same
//! payload hash. A valid SET over an unrelated body proves nothing, so both
//! checks always run together. Inclusion proofs against a checkpoint are not
//! checked (they need the log's current tree head); the SET is the promise.

use crate::ArtifactError;
use base64::Engine as _;
use serde::Deserialize;

use crate::keys::SigEncoding;
use crate::trust::TrustedRoot;

/// A log entry in the form both cosign layouts reduce to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The canonicalized body, decoded.
    pub body: Vec<u8>,
    /// Seconds since the epoch at which the log integrated the entry.
    pub integrated_time: i64,
    /// Index in the log.
    pub log_index: i64,
    /// Hex log id (SHA-256 of the log key).
    pub log_id: String,
    /// The Signed Entry Timestamp.
    pub set: Vec<u8>,
}

#[derive(Deserialize)]
struct LegacyBundle {
    #[serde(rename = "SignedEntryTimestamp")]
    set: String,
    #[serde(rename = "Payload")]
    payload: LegacyPayload,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct LegacyPayload {
    body: String,
    integrated_time: i64,
    log_index: i64,
    #[serde(rename = "logID")]
    log_id: String,
}

impl Entry {
    /// Parses the `dev.sigstore.cosign/bundle` annotation of a legacy signature.
    pub fn from_legacy_annotation(text: &str) -> Result<Entry, ArtifactError> {
        let b: LegacyBundle = serde_json::from_str(text)
            .map_err(|e| ArtifactError::Malformed(format!("Rekor bundle annotation: {e}")))?;
        let std = base64::engine::general_purpose::STANDARD;
        Ok(Entry {
            body: std
                .decode(b.payload.body.trim())
                .map_err(|e| ArtifactError::Malformed(format!("Rekor body: {e}")))?,
            integrated_time: b.payload.integrated_time,
            log_index: b.payload.log_index,
            log_id: b.payload.log_id.to_ascii_lowercase(),
            set: std
                .decode(b.set.trim())
                .map_err(|e| ArtifactError::Malformed(format!("SignedEntryTimestamp: {e}")))?,
        })
    }

    /// The bytes the SET signs: canonical JSON (sorted keys, no spaces).
    fn set_message(&self) -> String {
        let body = base64::engine::general_purpose::STANDARD.encode(&self.body);
        format!(
            "{{\"body\":{},\"integratedTime\":{},\"logID\":{},\"logIndex\":{}}}",
            serde_json::Value::String(body),
            self.integrated_time,
            serde_json::Value::String(self.log_id.clone()),
            self.log_index
        )
    }

    /// Checks the SET against the trusted logs and that the body records
    /// exactly this signature. Returns the integrated time on success.
    pub fn verify(&self, trust: &TrustedRoot, expect: &Expected<'_>) -> Result<i64, ArtifactError> {
        let log = trust
            .log(&self.log_id, self.integrated_time)
            .ok_or_else(|| {
                ArtifactError::Log(format!(
                    "log {} is not a trusted transparency log (or its key was not valid at {})",
                    short(&self.log_id),
                    self.integrated_time
                ))
            })?;
        if !log
            .key
            .verify(SigEncoding::Der, self.set_message().as_bytes(), &self.set)
        {
            return Err(ArtifactError::Log(format!(
                "signed entry timestamp does not verify with the key of log {}",
                short(&self.log_id)
            )));
        }
        check_body(&self.body, expect)?;
        Ok(self.integrated_time)
    }
}

fn short(id: &str) -> &str {
    id.get(..12).unwrap_or(id)
}

/// What the entry must record.
#[derive(Debug)]
pub struct Expected<'a> {
    /// SHA-256 of the signed payload (hashedrekord) or DSSE payload.
    pub payload_sha256: [u8; 32],
    /// For a DSSE envelope, SHA-256 of its pre-authentication encoding: what
    /// Rekor v2 records when it logs DSSE as a `hashedrekord` 0.0.2.
    pub pae_sha256: Option<[u8; 32]>,
    /// SHA-256 of the DSSE envelope as uploaded, when the bytes are in
    /// hand (a `.att` layer): what `intoto` 0.0.1 records instead of the
    /// signature.
    pub envelope_sha256: Option<[u8; 32]>,
    /// For a `hashedrekord` of an artifact digested with another algorithm
    /// than SHA-256 (`sha384`, `sha512`): that algorithm and the digest the
    /// entry must record.
    pub digest: Option<(&'static str, &'a [u8])>,
    /// The raw signature.
    pub signature: &'a [u8],
    /// DER of the signer: the certificate, or the public key's SPKI.
    pub signer_der: &'a [u8],
}

/// The entry kinds [`check_body`] reads, as `kind/apiVersion` (docs/policy.md
/// says which producer writes each and how it is compared).
pub const KINDS: [&str; 7] = [
    "hashedrekord/0.0.1",
    "rekord/0.0.1",
    "intoto/0.0.1",
    "intoto/0.0.2",
    "dsse/0.0.1",
    "hashedrekord/0.0.2",
    "dsse/0.0.2",
];

/// A body's `kind/apiVersion` (for reports), if it parses.
pub fn kind_of(body: &[u8]) -> Option<String> {
    let v: serde_json::Value = serde_json::from_slice(body).ok()?;
    let kind = v.get("kind")?.as_str()?;
    let version = v.get("apiVersion").and_then(|a| a.as_str()).unwrap_or("?");
    Some(format!("{kind}/{version}"))
}

/// Compares the logged body with the signature in hand, as each Rekor
/// type's own verifier does: Rekor v1 `hashedrekord`, `rekord` (old cosign)
/// and `dsse` 0.0.1, `intoto` 0.0.1 (the envelope's hash as uploaded, the
/// payload's hash and the signer; no signature) and 0.0.2 (the signature
/// base64-encoded twice), Rekor v2 `hashedrekord` and `dsse` 0.0.2.
pub(crate) fn check_body(body: &[u8], expect: &Expected<'_>) -> Result<(), ArtifactError> {
    let v: serde_json::Value = serde_json::from_slice(body)
        .map_err(|e| ArtifactError::Log(format!("log entry body: {e}")))?;
    let kind = v.get("kind").and_then(|k| k.as_str()).unwrap_or_default();
    let spec = v
        .get("spec")
        .ok_or(ArtifactError::Log("log entry body has no spec".into()))?;
    let std = base64::engine::general_purpose::STANDARD;
    let hex_of = |h: Option<&str>| h.map(str::to_ascii_lowercase);
    let b64_hex = |h: Option<&str>| {
        h.and_then(|d| std.decode(d.trim()).ok())
            .map(|d| crate::trust::hex(&d))
    };
    let ptr = |p: &str| spec.pointer(p).and_then(|x| x.as_str());
    // (logged hash as hex, [(signature b64, signer: PEM b64 or DER b64)], hashes it may equal)
    let payload = crate::trust::hex(&expect.payload_sha256);
    let pae = expect.pae_sha256.map(|h| crate::trust::hex(&h));
    let (hash, sigs, wanted): (Option<String>, Vec<Logged<'_>>, Vec<String>) = match kind {
        "hashedrekord" if spec.get("hashedRekordV002").is_some() => (
            b64_hex(ptr("/hashedRekordV002/data/digest")),
            vec![logged_v2(
                spec.pointer("/hashedRekordV002/signature"),
                "content",
            )],
            pae.iter().cloned().chain([payload.clone()]).collect(),
        ),
        // `rekord` 0.0.1 (cosign before 1.5) records the same fields at the
        // same places, with the payload's hash computed by Rekor.
        "hashedrekord" | "rekord" => {
            // The entry names its hash algorithm (`sha256` when absent); it
            // must be the one the bundle's digest used.
            let logged = ptr("/data/hash/algorithm").unwrap_or("sha256");
            let want = match expect.digest {
                Some((alg, d)) if logged == alg => crate::trust::hex(d),
                Some((alg, _)) => {
                    return Err(ArtifactError::Log(format!(
                        "the log entry records a {logged} digest, the bundle a {alg} one"
                    )));
                }
                None => payload.clone(),
            };
            (
                hex_of(ptr("/data/hash/value")),
                vec![Logged::V1(
                    ptr("/signature/content"),
                    ptr("/signature/publicKey/content"),
                )],
                vec![want],
            )
        }
        "dsse" if spec.get("dsseV002").is_some() => (
            b64_hex(ptr("/dsseV002/payloadHash/digest")),
            spec.pointer("/dsseV002/signatures")
                .and_then(|s| s.as_array())
                .map(|a| a.iter().map(|s| logged_v2(Some(s), "content")).collect())
                .unwrap_or_default(),
            vec![payload.clone()],
        ),
        "dsse" => (
            hex_of(ptr("/payloadHash/value")),
            spec.get("signatures")
                .and_then(|s| s.as_array())
                .map(|a| {
                    a.iter()
                        .map(|s| {
                            Logged::V1(
                                s.get("signature").and_then(|x| x.as_str()),
                                s.get("verifier").and_then(|x| x.as_str()),
                            )
                        })
                        .collect()
                })
                .unwrap_or_default(),
            vec![payload.clone()],
        ),
        "intoto" if v.get("apiVersion").and_then(|a| a.as_str()) == Some("0.0.1") => {
            return check_intoto_v001(spec, expect);
        }
        "intoto" => (
            hex_of(ptr("/content/payloadHash/value")),
            spec.pointer("/content/envelope/signatures")
                .and_then(|s| s.as_array())
                .map(|a| {
                    a.iter()
                        .map(|s| {
                            Logged::Intoto(
                                s.get("sig").and_then(|x| x.as_str()),
                                s.get("publicKey").and_then(|x| x.as_str()),
                            )
                        })
                        .collect()
                })
                .unwrap_or_default(),
            vec![payload.clone()],
        ),
        other => {
            return Err(ArtifactError::Log(format!(
                "log entry kind {other:?} is not supported"
            )));
        }
    };
    if !hash.is_some_and(|h| wanted.contains(&h)) {
        return Err(ArtifactError::Log(
            "log entry records a different payload hash".into(),
        ));
    }
    if !sigs.iter().any(|l| l.matches(expect)) {
        return Err(ArtifactError::Log(
            "log entry records a different signature or signer".into(),
        ));
    }
    Ok(())
}

/// `intoto` 0.0.1: Rekor keeps the hash of the envelope as it was uploaded
/// (which covers its signature), the payload's hash and the signer's key or
/// certificate — not the signature. So the entry vouches for this signature
/// only when the envelope in hand hashes to what it records.
fn check_intoto_v001(spec: &serde_json::Value, expect: &Expected<'_>) -> Result<(), ArtifactError> {
    let std = base64::engine::general_purpose::STANDARD;
    let ptr = |p: &str| spec.pointer(p).and_then(|x| x.as_str());
    let Some(envelope) = expect.envelope_sha256 else {
        return Err(ArtifactError::Log(
            "an intoto 0.0.1 entry records the envelope's hash, and the envelope as uploaded is not in hand".into(),
        ));
    };
    let recorded = ptr("/content/hash/value").map(str::to_ascii_lowercase);
    if recorded.as_deref() != Some(crate::trust::hex(&envelope).as_str()) {
        return Err(ArtifactError::Log(
            "log entry records a different envelope hash".into(),
        ));
    }
    let payload = ptr("/content/payloadHash/value").map(str::to_ascii_lowercase);
    if payload.as_deref() != Some(crate::trust::hex(&expect.payload_sha256).as_str()) {
        return Err(ArtifactError::Log(
            "log entry records a different payload hash".into(),
        ));
    }
    let signer = ptr("/publicKey")
        .and_then(|k| std.decode(k.trim()).ok())
        .and_then(|pem| String::from_utf8(pem).ok())
        .is_some_and(|pem| {
            crate::keys::pem_blocks(&pem)
                .iter()
                .any(|(_, der)| der == expect.signer_der)
        });
    if !signer {
        return Err(ArtifactError::Log(
            "log entry records a different signer".into(),
        ));
    }
    Ok(())
}

/// One signature as an entry records it.
enum Logged<'a> {
    /// v1: base64 signature, base64 of a PEM certificate or key.
    V1(Option<&'a str>, Option<&'a str>),
    /// intoto 0.0.2: the signature base64-encoded twice, base64 PEM.
    Intoto(Option<&'a str>, Option<&'a str>),
    /// v2: base64 signature, base64 DER of the certificate or key.
    V2(Option<&'a str>, Option<&'a str>),
}

fn logged_v2<'a>(sig: Option<&'a serde_json::Value>, field: &str) -> Logged<'a> {
    let s = |p: &str| sig.and_then(|v| v.pointer(p)).and_then(|x| x.as_str());
    let content = sig.and_then(|v| v.get(field)).and_then(|x| x.as_str());
    let signer = s("/verifier/x509Certificate/rawBytes").or(s("/verifier/publicKey/rawBytes"));
    Logged::V2(content, signer)
}

impl Logged<'_> {
    fn matches(&self, expect: &Expected<'_>) -> bool {
        let std = base64::engine::general_purpose::STANDARD;
        let dec = |s: Option<&str>| s.and_then(|s| std.decode(s.trim()).ok());
        let pem_has = |b: Option<Vec<u8>>| {
            b.and_then(|pem| String::from_utf8(pem).ok())
                .is_some_and(|pem| {
                    crate::keys::pem_blocks(&pem)
                        .iter()
                        .any(|(_, der)| der == expect.signer_der)
                })
        };
        match self {
            Logged::V1(sig, signer) => {
                dec(*sig).is_some_and(|s| s == expect.signature) && pem_has(dec(*signer))
            }
            Logged::Intoto(sig, signer) => {
                let once = dec(*sig);
                let twice = once
                    .as_deref()
                    .and_then(|s| std::str::from_utf8(s).ok())
                    .and_then(|s| std.decode(s.trim()).ok());
                (once.as_deref() == Some(expect.signature)
                    || twice.as_deref() == Some(expect.signature))
                    && pem_has(dec(*signer))
            }
            Logged::V2(sig, signer) => {
                dec(*sig).is_some_and(|s| s == expect.signature)
                    && dec(*signer).is_some_and(|d| d == expect.signer_der)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ANNOTATION: &str =
        include_str!("../tests/vectors/derived/keyless-rekor-test/bundle.json");

    #[test]
    fn set_of_the_real_keyless_vector_verifies_with_the_public_rekor_key() {
        let e = Entry::from_legacy_annotation(ANNOTATION).unwrap();
        let trust = TrustedRoot::public_good().unwrap();
        let log = trust.log(&e.log_id, e.integrated_time).unwrap();
        assert!(
            log.key
                .verify(SigEncoding::Der, e.set_message().as_bytes(), &e.set)
        );
        let mut tampered = e.clone();
        tampered.integrated_time += 1;
        assert!(!log.key.verify(
            SigEncoding::Der,
            tampered.set_message().as_bytes(),
            &tampered.set
        ));
    }
}
