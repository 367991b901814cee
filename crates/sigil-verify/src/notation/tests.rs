//! notation's checks on the real JWS vector and on COSE envelopes made here.

use super::*;
use crate::x509;
use sigil_core::SignatureProblem;
use sigil_core::verify::{NotationLevel, NotationStoreType};

mod jws {
    use super::*;

    const ENVELOPE: &[u8] = include_bytes!(
        "../../tests/vectors/notation/sse-secure-systems/testimage/blobs/sha256_929a0a249c4614eb8bef5a914308896e7c8c5422d508eaddfd98dfe61683e556.json"
    );
    const ROOT: &str = include_str!("../../tests/vectors/derived/notation-trust-root.crt");
    const WRONG: &str = include_str!("../../tests/vectors/derived/notation-wrong-trust-root.crt");
    const DIGEST: &str = "sha256:a136cc4e785798e5e8483047cf621cf0a0300a93d47703a3f066c340c070f5cf";
    const NOW: i64 = 1_795_000_000;

    fn check(
        level: NotationLevel,
        root: &str,
        digest: &str,
    ) -> Result<Vec<String>, SignatureProblem> {
        let env = Envelope::from_jws(ENVELOPE).unwrap();
        NotationCheck::new(
            x509::certs_from_pem(root),
            level,
            NotationStoreType::Ca,
            None,
        )
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
        let r = NotationCheck::new(
            x509::certs_from_pem(ROOT),
            NotationLevel::Audit,
            NotationStoreType::Ca,
            None,
        )
        .check(&env, DIGEST, NOW);
        assert_eq!(r, Err(SignatureProblem::WrongKey));
    }
}

mod cose {
    use aws_lc_rs::rand::SystemRandom;
    use aws_lc_rs::signature::{ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair};
    use coset::{CborSerializable, CoseSign1Builder, HeaderBuilder, TaggedCborSerializable, iana};

    use super::*;

    const DIGEST: &str = "sha256:a136cc4e785798e5e8483047cf621cf0a0300a93d47703a3f066c340c070f5cf";

    /// A COSE envelope as notation writes it (`--signature-format cose`),
    /// signed ES256 by a self-signed code-signing certificate.
    fn envelope(target: &str, tamper: bool) -> (Vec<u8>, Vec<u8>) {
        envelope_with(target, tamper, false)
    }

    /// With `int_crit`, the protected header also lists an integer label
    /// (4, `kid`) as critical.
    fn envelope_with(target: &str, tamper: bool, int_crit: bool) -> (Vec<u8>, Vec<u8>) {
        let rng = SystemRandom::new();
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng).unwrap();
        let key =
            EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8.as_ref()).unwrap();
        let rk = rcgen::KeyPair::try_from(pkcs8.as_ref()).unwrap();
        let mut p = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        p.distinguished_name
            .push(rcgen::DnType::CommonName, "cose-signer");
        p.key_usages = vec![rcgen::KeyUsagePurpose::DigitalSignature];
        p.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::CodeSigning];
        let cert = p.self_signed(&rk).unwrap().der().to_vec();
        let payload = format!(
            r#"{{"targetArtifact":{{"digest":"{target}","mediaType":"application/vnd.oci.image.manifest.v1+json","size":1}}}}"#
        );
        let mut protected = HeaderBuilder::new();
        if int_crit {
            protected = protected.add_critical(iana::HeaderParameter::Kid);
        }
        let protected = protected
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
        let check = NotationCheck::new(
            vec![cert],
            NotationLevel::Strict,
            NotationStoreType::Ca,
            None,
        );
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
        let check = NotationCheck::new(
            vec![cert],
            NotationLevel::Audit,
            NotationStoreType::Ca,
            None,
        );
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

    /// RFC 9052: a critical label the recipient does not understand fails;
    /// integer labels were once dropped from `crit` and so never checked.
    #[test]
    fn an_unknown_integer_critical_label_fails() {
        let (bytes, _) = envelope_with(DIGEST, false, true);
        let err = Envelope::parse(COSE_MEDIA_TYPE, &bytes).unwrap_err();
        assert!(err.to_string().contains("critical header label"), "{err}");
    }
}
