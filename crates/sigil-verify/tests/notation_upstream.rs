//! Real timestamped notation signatures, JWS and COSE, from notation-go's
//! test data (`tests/vectors/README.md`): each carries an RFC 3161
//! countersignature from a real TSA (GlobalSign's), verified against a
//! `tsa` trust store as notation's `verifyTimestamp` asks. Judged by
//! [`NotationCheck`] as upstream's `TestAuthenticTimestamp` judges them:
//! valid, valid though the signing certificate has since expired (the
//! countersigned time is inside its validity), and refused when the TSA is
//! not trusted, when the countersigned time is outside the certificate's
//! validity, or when there is no countersignature to rescue an expired one.

#![allow(clippy::unwrap_used)]

use sigil_core::verify::{
    NotationLevel, NotationSpec, NotationStoreType, TrustedIdentity, VerifyTimestamp,
};
use sigil_verify::keys::pem_blocks;
use sigil_verify::notation::{COSE_MEDIA_TYPE, Envelope, JWS_MEDIA_TYPE, NotationCheck};

const DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/vectors/notation-go");
/// 2026-12-01: after every expired certificate here, before the others end.
const NOW: i64 = 1_796_083_200;

fn read(name: &str) -> Vec<u8> {
    std::fs::read(format!("{DIR}/{name}")).unwrap()
}

/// A certificate file, PEM or DER.
fn cert(name: &str) -> Vec<u8> {
    let bytes = read(name);
    match std::str::from_utf8(&bytes) {
        Ok(text) if text.contains("-----BEGIN") => pem_blocks(text).remove(0).1,
        _ => bytes,
    }
}

fn envelope(name: &str) -> Envelope {
    let media_type = if name.starts_with("cose") || name == "timestampAfterNotAfter.sig" {
        COSE_MEDIA_TYPE
    } else {
        JWS_MEDIA_TYPE
    };
    Envelope::parse(media_type, &read(name)).unwrap()
}

/// A strict verifier over `roots` with `tsa` as its tsa store.
fn verifier(roots: Vec<Vec<u8>>, tsa: Vec<Vec<u8>>, when: VerifyTimestamp) -> NotationCheck {
    let spec = NotationSpec {
        level: NotationLevel::Strict,
        ..NotationSpec::default()
    };
    NotationCheck {
        roots,
        store: NotationStoreType::Ca,
        tsa_roots: tsa,
        identities: vec![TrustedIdentity::Any],
        actions: spec.actions(),
        verify_timestamp: when,
        revocation: None,
    }
}

fn check(v: &NotationCheck, name: &str) -> Result<Vec<String>, String> {
    let env = envelope(name);
    let digest = env.target_digest().unwrap();
    v.check(&env, &digest, NOW).map_err(|e| e.to_string())
}

/// The envelope's own (self-signed) signing certificate as the `ca` store:
/// upstream's trust store holds it for the valid pair (`TestTimestamp.crt`).
fn own_leaf(name: &str) -> Vec<Vec<u8>> {
    vec![envelope(name).certs[0].clone()]
}

fn globalsign() -> Vec<Vec<u8>> {
    vec![cert("tsa-globalsignRoot.cer")]
}

#[test]
fn a_timestamped_jws_and_cose_signature_verify_against_the_tsa_store() {
    let v = verifier(
        vec![cert("ca-TestTimestamp.crt")],
        globalsign(),
        VerifyTimestamp::Always,
    );
    for name in ["jwsWithTimestamp.sig", "coseWithTimestamp.sig"] {
        let env = envelope(name);
        assert!(env.timestamp.is_some(), "{name}");
        assert_eq!(check(&v, name), Ok(vec![]), "{name}");
    }
    // Another artifact's digest: refused, whatever the timestamp.
    let env = envelope("coseWithTimestamp.sig");
    let other = format!("sha256:{}", "0".repeat(64));
    assert!(v.check(&env, &other, NOW).is_err());
    // A TSA root the timestamp does not chain to (upstream's test-mismatch).
    let v = verifier(
        vec![cert("ca-TestTimestamp.crt")],
        vec![cert("tsa-DigiCertTSARootSHA384.cer")],
        VerifyTimestamp::Always,
    );
    for name in ["jwsWithTimestamp.sig", "coseWithTimestamp.sig"] {
        let e = check(&v, name).unwrap_err();
        assert!(e.contains("authentic timestamp"), "{name}: {e}");
    }
}

#[test]
fn a_signature_whose_certificate_expired_verifies_by_its_countersigned_time() {
    for name in [
        "jwsExpiredWithTimestamp.sig",
        "coseExpiredWithTimestamp.sig",
    ] {
        // The certificate lived ten minutes on 2024-06-18; the TSA signed inside them.
        for when in [VerifyTimestamp::Always, VerifyTimestamp::AfterCertExpiry] {
            let v = verifier(own_leaf(name), globalsign(), when);
            assert_eq!(check(&v, name), Ok(vec![]), "{name} {when:?}");
        }
        // Without a tsa store, nothing vouches for the time: expired now.
        let v = verifier(own_leaf(name), vec![], VerifyTimestamp::Always);
        let e = check(&v, name).unwrap_err();
        assert!(e.contains("authentic timestamp"), "{name}: {e}");
    }
}

#[test]
fn a_countersigned_time_outside_the_certificates_validity_is_refused() {
    // Certificates valid 2099–2100 and ending 2001, timestamped in 2024.
    for name in ["timestampBeforeNotBefore.sig", "timestampAfterNotAfter.sig"] {
        let v = verifier(own_leaf(name), globalsign(), VerifyTimestamp::Always);
        let e = check(&v, name).unwrap_err();
        assert!(e.contains("authentic timestamp"), "{name}: {e}");
    }
    // The same store without the certificate's own: not authentic at all.
    let v = verifier(
        vec![cert("ca-TestTimestampNotYetValid.crt")],
        globalsign(),
        VerifyTimestamp::Always,
    );
    assert!(check(&v, "timestampAfterNotAfter.sig").is_err());
}

#[test]
fn a_signature_without_a_countersignature_is_judged_now() {
    // Its certificate is valid until 2033: no timestamp is needed.
    let v = verifier(
        vec![cert("ca-TestTimestamp.crt")],
        globalsign(),
        VerifyTimestamp::Always,
    );
    let env = envelope("withoutTimestamp.sig");
    assert!(env.timestamp.is_none());
    assert_eq!(check(&v, "withoutTimestamp.sig"), Ok(vec![]));
}
