//! Notary Project (notation) signatures: JWS and COSE envelopes.
//!
//! Owns reading both envelope formats into one [`Envelope`], and the checks
//! the Notary Project trust policy defines, grouped as it groups them:
//! integrity (the envelope's signature and the signing certificate's key
//! usage, always enforced), authenticity (the x509 chain to the configured
//! roots, of the trust-store type the signing scheme needs), authentic
//! timestamp and expiry. The verification level decides which of the last
//! three block and which are only logged. What sigil cannot do, it refuses
//! rather than skips: a signature that asks for a verification plugin fails
//! naming it, an unknown critical header fails. Revocation (OCSP/CRL) is not
//! checked: it would put network calls to CAs on the admission path. The
//! binding of the signed target digest to the pinned digest is sigil's own
//! rule and always enforced.

use crate::ArtifactError;
use base64::Engine as _;
use serde::Deserialize;
use serde_json::Value;

/// `artifactType` of notation signature manifests.
pub const ARTIFACT_TYPE: &str = "application/vnd.cncf.notary.signature";
/// Layer media type of a JWS envelope.
pub const JWS_MEDIA_TYPE: &str = "application/jose+json";
/// Layer media type of a COSE envelope.
pub const COSE_MEDIA_TYPE: &str = "application/cose";
const PAYLOAD_CTY: &str = "application/vnd.cncf.notary.payload.v1+json";
const SCHEME: &str = "io.cncf.notary.signingScheme";
const SIGNING_TIME: &str = "io.cncf.notary.signingTime";
const EXPIRY: &str = "io.cncf.notary.expiry";
const AUTHENTIC_TIME: &str = "io.cncf.notary.authenticSigningTime";
const PLUGIN: &str = "io.cncf.notary.verificationPlugin";
const PLUGIN_MIN_VERSION: &str = "io.cncf.notary.verificationPluginMinVersion";
/// Unprotected header carrying the RFC 3161 countersignature.
const TIMESTAMP_SIGNATURE: &str = "io.cncf.notary.timestampSignature";
/// Signing scheme whose signing time a signing authority vouches for.
const SIGNING_AUTHORITY: &str = "notary.x509.signingAuthority";
const KNOWN_CRIT: &[&str] = &[SCHEME, EXPIRY, AUTHENTIC_TIME, PLUGIN, PLUGIN_MIN_VERSION];

/// A notation envelope, decoded but not yet trusted.
#[derive(Debug, Clone)]
pub struct Envelope {
    /// JOSE/COSE algorithm name (`PS256`, `ES384`, …).
    pub alg: String,
    /// Exact bytes the signature covers.
    pub message: Vec<u8>,
    /// Raw signature.
    pub signature: Vec<u8>,
    /// Certificates, signing certificate first (DER).
    pub certs: Vec<Vec<u8>>,
    /// The signed payload (the target descriptor).
    pub payload: Vec<u8>,
    /// Signing scheme (`notary.x509` or `notary.x509.signingAuthority`).
    pub scheme: String,
    /// Claimed (or, for signingAuthority, authentic) signing time, Unix seconds.
    pub signing_time: Option<i64>,
    /// Signature expiry, Unix seconds.
    pub expiry: Option<i64>,
    /// The RFC 3161 timestamp countersignature over `signature`
    /// (`io.cncf.notary.timestampSignature`, unprotected), if any.
    pub timestamp: Option<Vec<u8>>,
}

#[derive(Deserialize)]
struct Jws {
    payload: String,
    protected: String,
    #[serde(default)]
    header: JwsHeader,
    signature: String,
}

#[derive(Deserialize, Default)]
struct JwsHeader {
    #[serde(default)]
    x5c: Vec<String>,
    #[serde(default, rename = "io.cncf.notary.timestampSignature")]
    timestamp_signature: Option<String>,
}

fn rfc3339(s: &str) -> Option<i64> {
    time::OffsetDateTime::parse(s, &time::format_description::well_known::Rfc3339)
        .ok()
        .map(|t| t.unix_timestamp())
}

fn check_crit(crit: &[String], present: &[&str]) -> Result<(), ArtifactError> {
    for c in crit {
        if !KNOWN_CRIT.contains(&c.as_str()) {
            return Err(ArtifactError::Malformed(format!(
                "critical header {c:?} is not understood"
            )));
        }
    }
    for p in present {
        if [SCHEME, EXPIRY, AUTHENTIC_TIME, PLUGIN, PLUGIN_MIN_VERSION].contains(p)
            && !crit.iter().any(|c| c == p)
        {
            return Err(ArtifactError::Malformed(format!(
                "header {p:?} must be listed as critical"
            )));
        }
    }
    Ok(())
}

/// A signature that names a verification plugin asks for checks only that
/// plugin can make (revocation, for example); notation fails when it cannot
/// run it, and sigil runs no plugins.
fn refuse_plugin(plugin: Option<&str>) -> Result<(), ArtifactError> {
    match plugin {
        Some(p) => Err(ArtifactError::Malformed(format!(
            "the signature requires the verification plugin {p:?} ({PLUGIN}), which sigil cannot run"
        ))),
        None => Ok(()),
    }
}

/// The signing time the scheme trusts: `authenticSigningTime` (required)
/// for signingAuthority, the signer's claimed `signingTime` otherwise.
fn scheme_time(
    scheme: &str,
    signing: Option<i64>,
    authentic: Option<i64>,
) -> Result<Option<i64>, ArtifactError> {
    if scheme == SIGNING_AUTHORITY {
        return authentic.map(Some).ok_or_else(|| {
            ArtifactError::Malformed(format!(
                "a {SIGNING_AUTHORITY} signature must carry {AUTHENTIC_TIME}"
            ))
        });
    }
    Ok(signing)
}

/// A JWS time header: absent, or an RFC 3339 string; anything else is malformed.
fn jws_time(h: &Value, key: &str) -> Result<Option<i64>, ArtifactError> {
    match h.get(key) {
        None => Ok(None),
        Some(v) => v.as_str().and_then(rfc3339).map(Some).ok_or_else(|| {
            ArtifactError::Malformed(format!("header {key:?} is not an RFC 3339 time: {v}"))
        }),
    }
}

impl Envelope {
    /// Decodes an envelope by its layer media type.
    pub fn parse(media_type: &str, bytes: &[u8]) -> Result<Envelope, ArtifactError> {
        match media_type {
            JWS_MEDIA_TYPE => Envelope::from_jws(bytes),
            COSE_MEDIA_TYPE => Envelope::from_cose(bytes),
            other => Err(ArtifactError::Malformed(format!(
                "envelope media type {other:?} is not supported"
            ))),
        }
    }

    /// A JWS JSON-serialized envelope.
    pub fn from_jws(bytes: &[u8]) -> Result<Envelope, ArtifactError> {
        let jws: Jws = serde_json::from_slice(bytes)
            .map_err(|e| ArtifactError::Malformed(format!("JWS envelope: {e}")))?;
        let url = base64::engine::general_purpose::URL_SAFE_NO_PAD;
        let std = base64::engine::general_purpose::STANDARD;
        let protected = url
            .decode(jws.protected.trim_end_matches('='))
            .map_err(|e| ArtifactError::Malformed(format!("JWS protected header: {e}")))?;
        let h: Value = serde_json::from_slice(&protected)
            .map_err(|e| ArtifactError::Malformed(format!("JWS protected header: {e}")))?;
        let s = |k: &str| h.get(k).and_then(|v| v.as_str());
        let cty = s("cty");
        if cty != Some(PAYLOAD_CTY) {
            return Err(ArtifactError::Malformed(format!(
                "payload content type {cty:?} is not {PAYLOAD_CTY}"
            )));
        }
        let crit: Vec<String> = h
            .get("crit")
            .and_then(|c| c.as_array())
            .map(|a| {
                a.iter()
                    .filter_map(|x| x.as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default();
        let present: Vec<&str> = h
            .as_object()
            .map(|o| o.keys().map(String::as_str).collect())
            .unwrap_or_default();
        check_crit(&crit, &present)?;
        refuse_plugin(
            h.get(PLUGIN)
                .map(|p| p.as_str().unwrap_or("(not a string)")),
        )?;
        let scheme = s(SCHEME)
            .ok_or(ArtifactError::Malformed("no signing scheme".into()))?
            .to_owned();
        let signing_time = scheme_time(
            &scheme,
            jws_time(&h, SIGNING_TIME)?,
            jws_time(&h, AUTHENTIC_TIME)?,
        )?;
        let expiry = jws_time(&h, EXPIRY)?;
        let certs = jws
            .header
            .x5c
            .iter()
            .map(|c| {
                std.decode(c.trim())
                    .map_err(|e| ArtifactError::Malformed(format!("x5c: {e}")))
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Envelope {
            alg: s("alg")
                .ok_or(ArtifactError::Malformed("no alg".into()))?
                .to_owned(),
            message: format!("{}.{}", jws.protected, jws.payload).into_bytes(),
            signature: url
                .decode(jws.signature.trim_end_matches('='))
                .map_err(|e| ArtifactError::Malformed(format!("JWS signature: {e}")))?,
            certs,
            payload: url
                .decode(jws.payload.trim_end_matches('='))
                .map_err(|e| ArtifactError::Malformed(format!("JWS payload: {e}")))?,
            scheme,
            signing_time,
            expiry,
            timestamp: jws
                .header
                .timestamp_signature
                .as_deref()
                .map(|t| {
                    std.decode(t.trim()).map_err(|e| {
                        ArtifactError::Malformed(format!("{TIMESTAMP_SIGNATURE}: {e}"))
                    })
                })
                .transpose()?,
        })
    }

    /// A COSE_Sign1 envelope (tagged or untagged).
    pub fn from_cose(bytes: &[u8]) -> Result<Envelope, ArtifactError> {
        use coset::{
            CborSerializable, Label, RegisteredLabelWithPrivate, TaggedCborSerializable, iana,
        };
        let sign1 = coset::CoseSign1::from_tagged_slice(bytes)
            .or_else(|_| coset::CoseSign1::from_slice(bytes))
            .map_err(|e| ArtifactError::Malformed(format!("COSE envelope: {e}")))?;
        let p = &sign1.protected.header;
        let alg = match &p.alg {
            Some(RegisteredLabelWithPrivate::Assigned(a)) => match a {
                iana::Algorithm::PS256 => "PS256",
                iana::Algorithm::PS384 => "PS384",
                iana::Algorithm::PS512 => "PS512",
                iana::Algorithm::ES256 => "ES256",
                iana::Algorithm::ES384 => "ES384",
                iana::Algorithm::ES512 => "ES512",
                other => {
                    return Err(ArtifactError::Malformed(format!(
                        "COSE algorithm {other:?} is not supported"
                    )));
                }
            },
            other => {
                return Err(ArtifactError::Malformed(format!(
                    "COSE algorithm {other:?} is not supported"
                )));
            }
        };
        let cty_ok =
            matches!(&p.content_type, Some(coset::ContentType::Text(t)) if t == PAYLOAD_CTY);
        if !cty_ok {
            return Err(ArtifactError::Malformed(format!(
                "payload content type is not {PAYLOAD_CTY}"
            )));
        }
        let text = |want: &str| {
            p.rest.iter().find_map(|(l, v)| match l {
                Label::Text(t) if t == want => Some(v),
                _ => None,
            })
        };
        // RFC 9052: a critical label the recipient does not understand fails;
        // notation defines only text labels, so an integer one is never understood.
        let crit: Vec<String> = p
            .crit
            .iter()
            .map(|c| match c {
                coset::RegisteredLabel::Text(t) => Ok(t.clone()),
                coset::RegisteredLabel::Assigned(a) => Err(ArtifactError::Malformed(format!(
                    "critical header label {a:?} is not understood"
                ))),
            })
            .collect::<Result<_, _>>()?;
        let present: Vec<&str> = p
            .rest
            .iter()
            .filter_map(|(l, _)| match l {
                Label::Text(t) => Some(t.as_str()),
                _ => None,
            })
            .collect();
        check_crit(&crit, &present)?;
        refuse_plugin(text(PLUGIN).map(|p| p.as_text().unwrap_or("(not a string)")))?;
        let scheme = text(SCHEME)
            .and_then(|v| v.as_text())
            .ok_or(ArtifactError::Malformed("no signing scheme".into()))?
            .to_owned();
        // A time header: absent, or a (tagged) integer; anything else is malformed.
        let time_of = |key: &str| -> Result<Option<i64>, ArtifactError> {
            let Some(v) = text(key) else {
                return Ok(None);
            };
            let int = match v {
                ciborium::Value::Tag(1, inner) => inner.as_integer(),
                ciborium::Value::Integer(i) => Some(*i),
                _ => None,
            };
            int.and_then(|i| i64::try_from(i).ok())
                .map(Some)
                .ok_or_else(|| {
                    ArtifactError::Malformed(format!("header {key:?} is not a time: {v:?}"))
                })
        };
        let signing_time = scheme_time(&scheme, time_of(SIGNING_TIME)?, time_of(AUTHENTIC_TIME)?)?;
        let expiry = time_of(EXPIRY)?;
        let x5chain = sign1
            .unprotected
            .rest
            .iter()
            .find_map(|(l, v)| (*l == Label::Int(33)).then_some(v))
            .ok_or(ArtifactError::Malformed(
                "COSE envelope has no x5chain".into(),
            ))?;
        let certs = match x5chain {
            ciborium::Value::Bytes(b) => vec![b.clone()],
            ciborium::Value::Array(a) => a
                .iter()
                .map(|c| {
                    c.as_bytes().cloned().ok_or(ArtifactError::Malformed(
                        "x5chain entry is not bytes".into(),
                    ))
                })
                .collect::<Result<Vec<_>, _>>()?,
            _ => {
                return Err(ArtifactError::Malformed(
                    "x5chain is neither bytes nor an array".into(),
                ));
            }
        };
        let timestamp = sign1
            .unprotected
            .rest
            .iter()
            .find_map(|(l, v)| match l {
                Label::Text(t) if t == TIMESTAMP_SIGNATURE => Some(v),
                _ => None,
            })
            .map(|v| {
                v.as_bytes().cloned().ok_or_else(|| {
                    ArtifactError::Malformed(format!("{TIMESTAMP_SIGNATURE} is not bytes"))
                })
            })
            .transpose()?;
        let payload = sign1.payload.clone().ok_or(ArtifactError::Malformed(
            "COSE envelope has a detached payload".into(),
        ))?;
        Ok(Envelope {
            alg: alg.to_owned(),
            message: sign1.tbs_data(b""),
            signature: sign1.signature.clone(),
            certs,
            payload,
            scheme,
            signing_time,
            expiry,
            timestamp,
        })
    }

    /// The `targetArtifact.digest` of the payload.
    pub fn target_digest(&self) -> Result<String, ArtifactError> {
        let v: Value = serde_json::from_slice(&self.payload)
            .map_err(|e| ArtifactError::Malformed(format!("notation payload: {e}")))?;
        v.pointer("/targetArtifact/digest")
            .and_then(|d| d.as_str())
            .map(str::to_owned)
            .ok_or_else(|| ArtifactError::Malformed("payload has no targetArtifact.digest".into()))
    }
}

mod check;
pub use check::NotationCheck;

#[cfg(test)]
mod tests;
