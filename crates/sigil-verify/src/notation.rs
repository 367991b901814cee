//! Notary Project (notation) signatures: JWS and COSE envelopes.
//!
//! Owns reading both envelope formats into one [`Envelope`], and the checks
//! the Notary Project trust policy defines, grouped as it groups them:
//! integrity (the envelope's signature, always enforced), authenticity (the
//! x509 chain to the configured roots), authentic timestamp and expiry. The
//! verification level decides which of the last three block and which are
//! only logged. Revocation (OCSP/CRL) is not checked: it would put network
//! calls to CAs on the admission path. The binding of the signed target
//! digest to the pinned digest is sigil's own rule and always enforced.

use crate::ArtifactError;
use base64::Engine as _;
use serde::Deserialize;
use serde_json::Value;
use sigil_core::SignatureProblem;
use sigil_core::verify::NotationLevel;

use crate::keys::{KeyType, PublicKey};
use crate::x509::{self, Eku};

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
const KNOWN_CRIT: &[&str] = &[
    SCHEME,
    EXPIRY,
    AUTHENTIC_TIME,
    "io.cncf.notary.verificationPlugin",
    "io.cncf.notary.verificationPluginMinVersion",
];

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
        if [SCHEME, EXPIRY, AUTHENTIC_TIME].contains(p) && !crit.iter().any(|c| c == p) {
            return Err(ArtifactError::Malformed(format!(
                "header {p:?} must be listed as critical"
            )));
        }
    }
    Ok(())
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
        let scheme = s(SCHEME)
            .ok_or(ArtifactError::Malformed("no signing scheme".into()))?
            .to_owned();
        let signing_time = if scheme == "notary.x509.signingAuthority" {
            s(AUTHENTIC_TIME).and_then(rfc3339)
        } else {
            s(SIGNING_TIME).and_then(rfc3339)
        };
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
            expiry: s(EXPIRY).and_then(rfc3339),
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
        let crit: Vec<String> = p
            .crit
            .iter()
            .filter_map(|c| match c {
                coset::RegisteredLabel::Text(t) => Some(t.clone()),
                _ => None,
            })
            .collect();
        let present: Vec<&str> = p
            .rest
            .iter()
            .filter_map(|(l, _)| match l {
                Label::Text(t) => Some(t.as_str()),
                _ => None,
            })
            .collect();
        check_crit(&crit, &present)?;
        let scheme = text(SCHEME)
            .and_then(|v| v.as_text())
            .ok_or(ArtifactError::Malformed("no signing scheme".into()))?
            .to_owned();
        let time_of = |v: &ciborium::Value| -> Option<i64> {
            match v {
                ciborium::Value::Tag(1, inner) => {
                    inner.as_integer().and_then(|i| i64::try_from(i).ok())
                }
                ciborium::Value::Integer(i) => i64::try_from(*i).ok(),
                _ => None,
            }
        };
        let signing_time = if scheme == "notary.x509.signingAuthority" {
            text(AUTHENTIC_TIME).and_then(time_of)
        } else {
            text(SIGNING_TIME).and_then(time_of)
        };
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
            expiry: text(EXPIRY).and_then(time_of),
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

/// A loaded notation verifier.
#[derive(Debug)]
pub struct NotationCheck {
    /// Trusted roots (DER).
    pub roots: Vec<Vec<u8>>,
    /// Verification level.
    pub level: NotationLevel,
}

fn key_fits(alg: &str, kind: KeyType) -> bool {
    matches!(
        (alg, kind),
        ("PS256" | "PS384" | "PS512", KeyType::Rsa)
            | ("ES256", KeyType::P256)
            | ("ES384", KeyType::P384)
    )
}

impl NotationCheck {
    /// Checks one envelope for `digest` at time `now`. `Ok` carries the
    /// failed checks the level only logs.
    pub fn check(
        &self,
        env: &Envelope,
        digest: &str,
        now: i64,
    ) -> Result<Vec<String>, SignatureProblem> {
        // Integrity: always enforced.
        let leaf = env.certs.first().ok_or(SignatureProblem::Malformed {
            detail: "envelope carries no certificate".into(),
        })?;
        let spki = x509::spki(leaf).map_err(SignatureProblem::from)?;
        let key = PublicKey::from_spki(&spki).map_err(|e| SignatureProblem::Malformed {
            detail: e.to_string(),
        })?;
        if !key_fits(&env.alg, key.kind) {
            return Err(SignatureProblem::Malformed {
                detail: format!(
                    "algorithm {} does not fit the certificate's {:?} key",
                    env.alg, key.kind
                ),
            });
        }
        if !key.verify_jose(&env.alg, &env.message, &env.signature) {
            return Err(SignatureProblem::WrongKey);
        }
        if !matches!(
            env.scheme.as_str(),
            "notary.x509" | "notary.x509.signingAuthority"
        ) {
            return Err(SignatureProblem::Malformed {
                detail: format!("signing scheme {:?} is not supported", env.scheme),
            });
        }
        // Binding: sigil's rule, at every level.
        let target = env.target_digest().map_err(SignatureProblem::from)?;
        let mut logged = Vec::new();
        let mut enforce =
            |enforced: bool, problem: SignatureProblem| -> Result<(), SignatureProblem> {
                if enforced {
                    Err(problem)
                } else {
                    logged.push(problem.to_string());
                    Ok(())
                }
            };
        let (authenticity, timestamp, expiry) = match self.level {
            NotationLevel::Strict => (true, true, true),
            NotationLevel::Permissive => (true, false, false),
            NotationLevel::Audit => (false, false, false),
        };
        let at = env.signing_time.unwrap_or(now);
        if let Err(e) = x509::verify_chain(leaf, &env.certs[1..], &self.roots, at, Eku::IfPresent) {
            enforce(authenticity, e.into())?;
        } else if env.scheme == "notary.x509" {
            // Without a timestamp countersignature, the signing time is only a
            // claim: the chain must still be valid now.
            if let Err(detail) =
                x509::verify_chain(leaf, &env.certs[1..], &self.roots, now, Eku::IfPresent)
            {
                enforce(
                    timestamp,
                    SignatureProblem::LevelCheck {
                        detail: format!("authentic timestamp: {detail}"),
                    },
                )?;
            }
        }
        if let Some(exp) = env.expiry
            && exp < now
        {
            enforce(
                expiry,
                SignatureProblem::LevelCheck {
                    detail: format!("signature expired at Unix time {exp}"),
                },
            )?;
        }
        if target != digest {
            return Err(SignatureProblem::DigestMismatch { signed: target });
        }
        Ok(logged)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ENVELOPE: &[u8] = include_bytes!(
        "../tests/vectors/notation/sse-secure-systems/testimage/blobs/sha256_929a0a249c4614eb8bef5a914308896e7c8c5422d508eaddfd98dfe61683e556.json"
    );
    const ROOT: &str = include_str!("../tests/vectors/derived/notation-trust-root.crt");
    const WRONG: &str = include_str!("../tests/vectors/derived/notation-wrong-trust-root.crt");
    const DIGEST: &str = "sha256:a136cc4e785798e5e8483047cf621cf0a0300a93d47703a3f066c340c070f5cf";
    const NOW: i64 = 1_795_000_000;

    fn check(
        level: NotationLevel,
        root: &str,
        digest: &str,
    ) -> Result<Vec<String>, SignatureProblem> {
        let env = Envelope::from_jws(ENVELOPE).unwrap();
        NotationCheck {
            roots: x509::certs_from_pem(root),
            level,
        }
        .check(&env, digest, NOW)
    }

    #[test]
    fn real_notation_jws_verifies_under_its_root() {
        assert_eq!(check(NotationLevel::Strict, ROOT, DIGEST), Ok(vec![]));
    }

    #[test]
    fn wrong_root_fails_strict_and_permissive_but_audit_only_logs() {
        assert!(matches!(
            check(NotationLevel::Strict, WRONG, DIGEST),
            Err(SignatureProblem::ChainInvalid { .. })
        ));
        assert!(matches!(
            check(NotationLevel::Permissive, WRONG, DIGEST),
            Err(SignatureProblem::ChainInvalid { .. })
        ));
        let logged = check(NotationLevel::Audit, WRONG, DIGEST).unwrap();
        assert_eq!(logged.len(), 1, "{logged:?}");
    }

    #[test]
    fn other_digest_is_a_mismatch_at_every_level() {
        let other = "sha256:c51f6b33b43f9f234af90bf310d976ea1bec487ab00ab61bd684b0efbbc15b53";
        for l in [NotationLevel::Strict, NotationLevel::Audit] {
            assert!(matches!(
                check(l, ROOT, other),
                Err(SignatureProblem::DigestMismatch { .. })
            ));
        }
    }

    #[test]
    fn tampered_payload_fails_integrity() {
        let mut v: Value = serde_json::from_slice(ENVELOPE).unwrap();
        let url = base64::engine::general_purpose::URL_SAFE_NO_PAD;
        let other = url.encode(br#"{"targetArtifact":{"digest":"sha256:c51f6b33b43f9f234af90bf310d976ea1bec487ab00ab61bd684b0efbbc15b53","mediaType":"x","size":1}}"#);
        v["payload"] = Value::String(other);
        let env = Envelope::from_jws(&serde_json::to_vec(&v).unwrap()).unwrap();
        let r = NotationCheck {
            roots: x509::certs_from_pem(ROOT),
            level: NotationLevel::Audit,
        }
        .check(&env, DIGEST, NOW);
        assert_eq!(r, Err(SignatureProblem::WrongKey));
    }
}

#[cfg(test)]
mod cose_tests {
    use aws_lc_rs::rand::SystemRandom;
    use aws_lc_rs::signature::{ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair};
    use coset::{CborSerializable, CoseSign1Builder, HeaderBuilder, TaggedCborSerializable, iana};

    use super::*;

    const DIGEST: &str = "sha256:a136cc4e785798e5e8483047cf621cf0a0300a93d47703a3f066c340c070f5cf";

    /// A COSE envelope as notation writes it (`--signature-format cose`),
    /// signed ES256 by a self-signed code-signing certificate.
    fn envelope(target: &str, tamper: bool) -> (Vec<u8>, Vec<u8>) {
        let rng = SystemRandom::new();
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng).unwrap();
        let key =
            EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8.as_ref()).unwrap();
        let rk = rcgen::KeyPair::try_from(pkcs8.as_ref()).unwrap();
        let mut p = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        p.distinguished_name
            .push(rcgen::DnType::CommonName, "cose-signer");
        p.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::CodeSigning];
        let cert = p.self_signed(&rk).unwrap().der().to_vec();
        let payload = format!(
            r#"{{"targetArtifact":{{"digest":"{target}","mediaType":"application/vnd.oci.image.manifest.v1+json","size":1}}}}"#
        );
        let protected = HeaderBuilder::new()
            .algorithm(iana::Algorithm::ES256)
            .content_type(PAYLOAD_CTY.into())
            .add_critical_label(coset::RegisteredLabel::Text(SCHEME.into()))
            .text_value(SCHEME.into(), ciborium::Value::Text("notary.x509".into()))
            .text_value(
                SIGNING_TIME.into(),
                ciborium::Value::Tag(1, Box::new(ciborium::Value::Integer(1_700_000_000.into()))),
            )
            .build();
        let unprotected = HeaderBuilder::new()
            .value(
                33,
                ciborium::Value::Array(vec![ciborium::Value::Bytes(cert.clone())]),
            )
            .build();
        let mut sign1 = CoseSign1Builder::new()
            .protected(protected)
            .unprotected(unprotected)
            .payload(payload.into_bytes())
            .create_signature(b"", |m| key.sign(&rng, m).unwrap().as_ref().to_vec())
            .build();
        if tamper {
            sign1.payload = Some(br#"{"targetArtifact":{"digest":"sha256:00"}}"#.to_vec());
        }
        (sign1.to_tagged_vec().unwrap(), cert)
    }

    #[test]
    fn cose_envelope_verifies_and_binds_to_the_digest() {
        let (bytes, cert) = envelope(DIGEST, false);
        let env = Envelope::parse(COSE_MEDIA_TYPE, &bytes).unwrap();
        assert_eq!(env.alg, "ES256");
        assert_eq!(env.signing_time, Some(1_700_000_000));
        let check = NotationCheck {
            roots: vec![cert],
            level: NotationLevel::Strict,
        };
        assert_eq!(check.check(&env, DIGEST, 1_795_000_000), Ok(vec![]));
        let other = "sha256:c51f6b33b43f9f234af90bf310d976ea1bec487ab00ab61bd684b0efbbc15b53";
        assert!(matches!(
            check.check(&env, other, 1_795_000_000),
            Err(SignatureProblem::DigestMismatch { .. })
        ));
    }

    #[test]
    fn tampered_cose_payload_fails_integrity_and_untagged_form_reads() {
        let (bytes, cert) = envelope(DIGEST, true);
        let env = Envelope::parse(COSE_MEDIA_TYPE, &bytes).unwrap();
        let check = NotationCheck {
            roots: vec![cert],
            level: NotationLevel::Audit,
        };
        assert_eq!(
            check.check(&env, DIGEST, 1_795_000_000),
            Err(SignatureProblem::WrongKey)
        );
        let (bytes, _) = envelope(DIGEST, false);
        let untagged = coset::CoseSign1::from_tagged_slice(&bytes)
            .unwrap()
            .to_vec()
            .unwrap();
        assert!(Envelope::from_cose(&untagged).is_ok());
        assert!(Envelope::from_cose(b"\xa0garbage").is_err());
    }
}
