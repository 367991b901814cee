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

/// GitHub's own Sigstore instance (private repositories' attestations: no
/// transparency log, signed timestamps), as sigil embeds it
/// (`trust/README.md`): the root named `github` until a TUF refresh.
pub const GITHUB: &str = include_str!("../trust/github-trusted_root.json");

/// A transparency log (or CT log) sigil trusts.
#[derive(Debug)]
pub struct Log {
    /// `logID`: hex of `logId.keyId` (for Rekor v1 and CT logs the SHA-256 of
    /// the key's SubjectPublicKeyInfo, which is used when the root omits it).
    pub id: String,
    /// The origin a checkpoint of this log names (`baseUrl` without scheme).
    pub origin: Option<String>,
    /// Where it is served (`baseUrl` as the trusted root writes it).
    pub url: Option<String>,
    /// The log's signing key.
    pub key: PublicKey,
    /// Start of the key's validity (Unix seconds), if given.
    pub valid_from: Option<i64>,
    /// End of the key's validity, if given.
    pub valid_until: Option<i64>,
}

/// A certificate authority (Fulcio) or timestamp authority sigil trusts:
/// one chain and one window. A certificate is judged by one authority at a
/// time, through that authority's own certificates and inside its own
/// `validFor`; nothing a bundle or a timestamp token carries is added to
/// it (docs/trust.md, "Authorities, chains and windows").
#[derive(Debug, Clone)]
pub struct Authority {
    /// Root certificate (DER): the trust anchor.
    pub root: Vec<u8>,
    /// The authority's own signing certificate, when its chain starts with
    /// one that is no CA (a timestamp authority's: the only certificate
    /// whose timestamps this authority vouches for).
    pub leaf: Option<Vec<u8>>,
    /// Its CA certificates between that and the root (DER), leaf-most first.
    pub intermediates: Vec<Vec<u8>>,
    /// Start of its validity (Unix seconds), if given.
    pub valid_from: Option<i64>,
    /// End of its validity (inclusive), if given.
    pub valid_until: Option<i64>,
    /// Where it is served (`uri`), as the trusted root names it.
    pub uri: Option<String>,
    /// Its name (`subject`: common name and organization), as the trusted
    /// root names it.
    pub name: Option<String>,
}

impl Authority {
    /// Whether the trusted root says it may be used at `time`.
    pub fn valid_at(&self, time: i64) -> bool {
        self.valid_from.is_none_or(|s| time >= s) && self.valid_until.is_none_or(|e| time <= e)
    }

    /// [`Authority::valid_at`] for a timestamp authority, which the client
    /// specification trusts only with a validity start (as logs).
    pub fn valid_at_with_start(&self, time: i64) -> bool {
        self.valid_from.is_some() && self.valid_at(time)
    }
}

/// Everything needed to verify keyless signatures offline.
#[derive(Debug)]
pub struct TrustedRoot {
    /// Fulcio CAs.
    pub authorities: Vec<Authority>,
    /// Rekor logs.
    pub logs: Vec<Log>,
    /// Certificate Transparency logs (for SCTs in Fulcio certificates).
    pub ctlogs: Vec<Log>,
    /// RFC 3161 timestamp authorities.
    pub timestamp_authorities: Vec<Authority>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Doc {
    #[serde(default)]
    tlogs: Vec<TlogDoc>,
    #[serde(default)]
    certificate_authorities: Vec<CaDoc>,
    #[serde(default)]
    ctlogs: Vec<TlogDoc>,
    #[serde(default)]
    timestamp_authorities: Vec<CaDoc>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct TlogDoc {
    public_key: KeyDoc,
    #[serde(default)]
    log_id: Option<LogIdDoc>,
    #[serde(default)]
    base_url: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct LogIdDoc {
    key_id: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct KeyDoc {
    raw_bytes: String,
    #[serde(default)]
    key_details: Option<String>,
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
    #[serde(default)]
    valid_for: Option<Validity>,
    #[serde(default)]
    uri: Option<String>,
    #[serde(default)]
    subject: Option<SubjectDoc>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct SubjectDoc {
    #[serde(default)]
    organization: Option<String>,
    #[serde(default)]
    common_name: Option<String>,
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
        let logs = doc
            .tlogs
            .into_iter()
            .map(log_of)
            .collect::<Result<Vec<_>, _>>()?;
        let ctlogs = doc
            .ctlogs
            .into_iter()
            .map(log_of)
            .collect::<Result<Vec<_>, _>>()?;
        let authorities = doc
            .certificate_authorities
            .into_iter()
            .map(authority_of)
            .collect::<Result<Vec<_>, _>>()?;
        let timestamp_authorities = doc
            .timestamp_authorities
            .into_iter()
            .map(authority_of)
            .collect::<Result<Vec<_>, _>>()?;
        Ok(TrustedRoot {
            authorities,
            logs,
            ctlogs,
            timestamp_authorities,
        })
    }

    /// The embedded Sigstore public-good root.
    pub fn public_good() -> Result<TrustedRoot, VerifyError> {
        TrustedRoot::from_json(PUBLIC_GOOD)
    }

    /// The log with this id, if trusted at `time` (Unix seconds). A log
    /// without a validity start is never trusted (the trusted-root spec
    /// requires one); the end is inclusive.
    pub fn log(&self, id: &str, time: i64) -> Option<&Log> {
        self.logs
            .iter()
            .find(|l| l.id.eq_ignore_ascii_case(id) && l.valid_at(time))
    }

    /// The log with this id, whatever the time (for checkpoints, which are
    /// judged by the log's key, not by a time).
    pub fn log_by_id(&self, id: &str) -> Option<&Log> {
        self.logs.iter().find(|l| l.id.eq_ignore_ascii_case(id))
    }
}

impl Log {
    /// Whether the trusted root says this log's key may be used at `time`.
    pub fn valid_at(&self, time: i64) -> bool {
        self.valid_from.is_some_and(|s| time >= s) && self.valid_until.is_none_or(|e| time <= e)
    }

    /// The validity the trusted root gives, for messages.
    pub fn validity(&self) -> String {
        let t = |v: Option<i64>| v.map_or_else(|| "-".to_owned(), |v| v.to_string());
        match self.valid_from {
            None => "no validity start (never trusted)".into(),
            Some(_) => format!("Unix {} to {}", t(self.valid_from), t(self.valid_until)),
        }
    }

    /// The 4-byte key hint checkpoint signatures carry: the start of the log id.
    pub fn key_hint(&self) -> [u8; 4] {
        let mut h = [0u8; 4];
        for (i, b) in h.iter_mut().enumerate() {
            *b = self
                .id
                .get(i * 2..i * 2 + 2)
                .and_then(|x| u8::from_str_radix(x, 16).ok())
                .unwrap_or(0);
        }
        h
    }
}

fn validity(v: Option<&Validity>) -> (Option<i64>, Option<i64>) {
    match v {
        Some(v) => (
            v.start.as_deref().and_then(rfc3339),
            v.end.as_deref().and_then(rfc3339),
        ),
        None => (None, None),
    }
}

fn log_of(t: TlogDoc) -> Result<Log, VerifyError> {
    let bad = |m: String| VerifyError::TrustRoot(m);
    let b64 = base64::engine::general_purpose::STANDARD;
    let der = b64
        .decode(t.public_key.raw_bytes.trim())
        .map_err(|e| bad(format!("log key: {e}")))?;
    // `PKCS1_RSA_*` keys are a bare RSAPublicKey, not a SubjectPublicKeyInfo.
    let der = if t
        .public_key
        .key_details
        .as_deref()
        .is_some_and(|d| d.starts_with("PKCS1_RSA"))
    {
        rsa_spki(&der)
    } else {
        der
    };
    let key = PublicKey::from_spki(&der)?;
    let id = match &t.log_id {
        Some(l) => hex(&b64
            .decode(l.key_id.trim())
            .map_err(|e| bad(format!("logId: {e}")))?),
        None => hex(&crate::sha256(&der)),
    };
    let (valid_from, valid_until) = validity(t.public_key.valid_for.as_ref());
    let url = t.base_url.clone().filter(|u| !u.is_empty());
    let origin = t.base_url.map(|u| {
        u.trim_start_matches("https://")
            .trim_start_matches("http://")
            .trim_end_matches('/')
            .to_owned()
    });
    Ok(Log {
        id,
        origin,
        url,
        key,
        valid_from,
        valid_until,
    })
}

/// DER length octets.
fn der_len(n: usize) -> Vec<u8> {
    match n {
        0..=0x7f => vec![n as u8],
        0x80..=0xff => vec![0x81, n as u8],
        _ => vec![0x82, (n >> 8) as u8, n as u8],
    }
}

/// Wraps a PKCS#1 RSAPublicKey into a SubjectPublicKeyInfo.
fn rsa_spki(pkcs1: &[u8]) -> Vec<u8> {
    // SEQUENCE { OID rsaEncryption, NULL }
    const ALG: &[u8] = &[
        0x30, 0x0d, 0x06, 0x09, 0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x01, 0x05, 0x00,
    ];
    let mut bits = vec![0x03];
    bits.extend(der_len(pkcs1.len() + 1));
    bits.push(0);
    bits.extend_from_slice(pkcs1);
    let mut out = vec![0x30];
    out.extend(der_len(ALG.len() + bits.len()));
    out.extend_from_slice(ALG);
    out.extend(bits);
    out
}

fn authority_of(ca: CaDoc) -> Result<Authority, VerifyError> {
    let bad = |m: String| VerifyError::TrustRoot(m);
    let b64 = base64::engine::general_purpose::STANDARD;
    let mut certs = Vec::new();
    for c in ca.cert_chain.certificates {
        certs.push(
            b64.decode(c.raw_bytes.trim())
                .map_err(|e| bad(format!("CA certificate: {e}")))?,
        );
    }
    // The chain is leaf-most first; its last certificate is the root, and
    // a first certificate that is no CA is the authority's signing leaf.
    let Some(root) = certs.pop() else {
        return Err(bad("a certificate authority has an empty chain".into()));
    };
    let leaf = match certs.first() {
        Some(first) if !crate::x509::is_ca(first) => Some(certs.remove(0)),
        _ => None,
    };
    let (valid_from, valid_until) = validity(ca.valid_for.as_ref());
    let name = ca
        .subject
        .and_then(|s| match (s.common_name, s.organization) {
            (Some(cn), Some(o)) => Some(format!("{cn} ({o})")),
            (cn, o) => cn.or(o),
        });
    Ok(Authority {
        root,
        leaf,
        intermediates: certs,
        valid_from,
        valid_until,
        uri: ca.uri.filter(|u| !u.is_empty()),
        name,
    })
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

    /// What today's cosign needs on the public-good instance: the Rekor v2
    /// log and the timestamp authority (issue 24: the embedded root once
    /// listed neither, so such bundles failed with the default trust).
    #[test]
    fn public_good_root_has_rekor_v2_and_the_timestamp_authority() {
        let r = TrustedRoot::public_good().unwrap();
        let v2 = r
            .logs
            .iter()
            .find(|l| l.origin.as_deref() == Some("log2025-1.rekor.sigstore.dev"))
            .expect("the Rekor v2 log");
        assert!(r.log(&v2.id, 1_790_000_000).is_some());
        assert_eq!(r.timestamp_authorities.len(), 1);
        assert!(r.timestamp_authorities[0].valid_at_with_start(1_790_000_000));
    }

    #[test]
    fn a_log_without_validity_start_is_never_trusted() {
        let mut doc: serde_json::Value = serde_json::from_str(PUBLIC_GOOD).unwrap();
        doc["tlogs"][0]["publicKey"]
            .as_object_mut()
            .unwrap()
            .remove("validFor");
        let r = TrustedRoot::from_json(&doc.to_string()).unwrap();
        let rekor = "c0d23d6ad406973f9559f3ba2d1ca01f84147d8ffc5b8445c224f98b9591801d";
        assert!(r.log(rekor, 1_717_082_297).is_none());
        assert!(
            r.log_by_id(rekor)
                .unwrap()
                .validity()
                .contains("never trusted")
        );
    }
}
