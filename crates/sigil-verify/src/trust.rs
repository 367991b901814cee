//! Sigstore trust material: Fulcio CAs and Rekor log keys.
//!
//! Owns reading a `trusted_root.json` (the Sigstore protobuf-specs format:
//! `certificateAuthorities[].certChain`, `tlogs[].publicKey`) and the embedded
//! public-good root used when a policy names none. It fetches nothing: TUF
//! updates are the operator's job (mount a newer file), so admission never
//! waits on a trust-root download.

use base64::Engine as _;
use serde::Deserialize;

use crate::VerifyError;
use crate::keys::PublicKey;

/// The Sigstore public-good trusted root, embedded at build time.
pub const PUBLIC_GOOD: &str = include_str!("../trust/public-good-trusted_root.json");

/// A transparency log sigil trusts.
#[derive(Debug)]
pub struct Log {
    /// `logID`: hex SHA-256 of the key's SubjectPublicKeyInfo.
    pub id: String,
    /// The log's signing key.
    pub key: PublicKey,
    /// Start of the key's validity (Unix seconds), if given.
    pub valid_from: Option<i64>,
    /// End of the key's validity, if given.
    pub valid_until: Option<i64>,
}

/// A certificate authority (Fulcio) sigil trusts.
#[derive(Debug, Clone)]
pub struct Authority {
    /// Root certificate (DER): the trust anchor.
    pub root: Vec<u8>,
    /// Intermediates (DER), leaf-most first.
    pub intermediates: Vec<Vec<u8>>,
}

/// Everything needed to verify keyless signatures offline.
#[derive(Debug)]
pub struct TrustedRoot {
    /// Fulcio CAs.
    pub authorities: Vec<Authority>,
    /// Rekor logs.
    pub logs: Vec<Log>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Doc {
    #[serde(default)]
    tlogs: Vec<TlogDoc>,
    #[serde(default)]
    certificate_authorities: Vec<CaDoc>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct TlogDoc {
    public_key: KeyDoc,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct KeyDoc {
    raw_bytes: String,
    #[serde(default)]
    valid_for: Option<Validity>,
}

#[derive(Deserialize)]
struct Validity {
    #[serde(default)]
    start: Option<String>,
    #[serde(default)]
    end: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct CaDoc {
    cert_chain: ChainDoc,
}

#[derive(Deserialize)]
struct ChainDoc {
    certificates: Vec<RawDoc>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawDoc {
    raw_bytes: String,
}

fn rfc3339(s: &str) -> Option<i64> {
    time::OffsetDateTime::parse(s, &time::format_description::well_known::Rfc3339)
        .ok()
        .map(|t| t.unix_timestamp())
}

impl TrustedRoot {
    /// Parses a `trusted_root.json`.
    pub fn from_json(text: &str) -> Result<TrustedRoot, VerifyError> {
        let bad = |m: String| VerifyError::TrustRoot(m);
        let doc: Doc = serde_json::from_str(text).map_err(|e| bad(e.to_string()))?;
        let b64 = base64::engine::general_purpose::STANDARD;
        let mut logs = Vec::new();
        for t in doc.tlogs {
            let der = b64
                .decode(t.public_key.raw_bytes.trim())
                .map_err(|e| bad(format!("tlog key: {e}")))?;
            let key = PublicKey::from_spki(&der)?;
            let id = hex(&crate::sha256(&der));
            let (valid_from, valid_until) = match &t.public_key.valid_for {
                Some(v) => (
                    v.start.as_deref().and_then(rfc3339),
                    v.end.as_deref().and_then(rfc3339),
                ),
                None => (None, None),
            };
            logs.push(Log {
                id,
                key,
                valid_from,
                valid_until,
            });
        }
        let mut authorities = Vec::new();
        for ca in doc.certificate_authorities {
            let mut certs = Vec::new();
            for c in ca.cert_chain.certificates {
                certs.push(
                    b64.decode(c.raw_bytes.trim())
                        .map_err(|e| bad(format!("CA certificate: {e}")))?,
                );
            }
            // The chain is leaf-most first; its last certificate is the root.
            let Some(root) = certs.pop() else {
                return Err(bad("a certificate authority has an empty chain".into()));
            };
            authorities.push(Authority {
                root,
                intermediates: certs,
            });
        }
        Ok(TrustedRoot { authorities, logs })
    }

    /// The embedded Sigstore public-good root.
    pub fn public_good() -> Result<TrustedRoot, VerifyError> {
        TrustedRoot::from_json(PUBLIC_GOOD)
    }

    /// The log with this id, if trusted at `time` (Unix seconds).
    pub fn log(&self, id: &str, time: i64) -> Option<&Log> {
        self.logs.iter().find(|l| {
            l.id.eq_ignore_ascii_case(id)
                && l.valid_from.is_none_or(|s| time >= s)
                && l.valid_until.is_none_or(|e| time <= e)
        })
    }
}

/// Lowercase hex.
pub fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(s, "{b:02x}");
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn public_good_root_has_rekor_and_fulcio() {
        let r = TrustedRoot::public_good().unwrap();
        assert_eq!(r.authorities.len(), 2);
        let rekor = "c0d23d6ad406973f9559f3ba2d1ca01f84147d8ffc5b8445c224f98b9591801d";
        assert!(r.log(rekor, 1_717_082_297).is_some());
        assert!(r.log(rekor, 0).is_none(), "before the key's validity");
    }
}
