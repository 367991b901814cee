//! Wrong acceptances a review found in the notation verifier, each signed
//! by the test kit as a signer would sign it, and refused with its reason.
#![allow(clippy::unwrap_used)]

use serde_json::{Value, json};
use sigil_core::SignatureProblem;
use sigil_core::verify::{NotationLevel, NotationStoreType};
use sigil_testkit::signing::{Signer, notation_cert_with, notation_jws_with};
use sigil_verify::notation::{Envelope, NotationCheck};

const DIGEST: &str = "sha256:a136cc4e785798e5e8483047cf621cf0a0300a93d47703a3f066c340c070f5cf";
/// 2020-01-01 and 2021-01-01: the only year the expired signer's certificate is valid.
const Y2020: (i64, i64) = (1_577_836_800, 1_609_459_200);
const IN_2020: &str = "2020-06-01T00:00:00Z";
/// Today, for the checks (2026).
const NOW: i64 = 1_795_000_000;

struct Case {
    key: Signer,
    cert: Vec<u8>,
}

impl Case {
    fn new(validity: Option<(i64, i64)>, digital_signature: bool) -> Case {
        let key = Signer::p256();
        let (cert, _) = notation_cert_with(&key, "signer", validity, digital_signature);
        Case { key, cert }
    }

    fn envelope(&self, header: Value) -> Result<Envelope, String> {
        let bytes = notation_jws_with(&self.key, "ES256", &self.cert, DIGEST, 1, header);
        Envelope::from_jws(&bytes).map_err(|e| e.to_string())
    }

    fn check(
        &self,
        header: Value,
        store: NotationStoreType,
        level: NotationLevel,
    ) -> Result<Vec<String>, String> {
        let env = self.envelope(header)?;
        NotationCheck::new(vec![self.cert.clone()], level, store, None)
            .check(&env, DIGEST, NOW)
            .map_err(|e| e.to_string())
    }
}

fn signing_authority(time: Option<&str>) -> Value {
    json!({
        "crit": ["io.cncf.notary.signingScheme", "io.cncf.notary.authenticSigningTime"],
        "io.cncf.notary.signingScheme": "notary.x509.signingAuthority",
        "io.cncf.notary.signingTime": null,
        "io.cncf.notary.authenticSigningTime": time,
    })
}

#[test]
fn an_expired_signer_cannot_pass_strict_by_switching_to_signing_authority() {
    let expired = Case::new(Some(Y2020), true);
    // notary.x509 with a 2020 signing time: the signer's own claim; judged now.
    let x509 = json!({"io.cncf.notary.signingTime": IN_2020});
    let err = expired
        .check(x509, NotationStoreType::Ca, NotationLevel::Strict)
        .unwrap_err();
    assert!(err.contains("authentic timestamp"), "{err}");
    // The same key and certificate under notary.x509.signingAuthority with
    // an authenticSigningTime in 2020: a ca store never validates it.
    let err = expired
        .check(
            signing_authority(Some(IN_2020)),
            NotationStoreType::Ca,
            NotationLevel::Strict,
        )
        .unwrap_err();
    assert!(
        err.contains("trust store of type signingAuthority") && err.contains("type ca"),
        "{err}"
    );
    // Only a store declared as signing authorities vouches for that time.
    let ok = expired.check(
        signing_authority(Some(IN_2020)),
        NotationStoreType::SigningAuthority,
        NotationLevel::Strict,
    );
    assert_eq!(ok, Ok(vec![]));
    // …and such a store does not validate plain notary.x509 signatures.
    let fresh = Case::new(None, true);
    let err = fresh
        .check(
            json!({}),
            NotationStoreType::SigningAuthority,
            NotationLevel::Strict,
        )
        .unwrap_err();
    assert!(err.contains("trust store of type ca"), "{err}");
}

#[test]
fn signing_authority_without_authentic_signing_time_is_refused_not_judged_now() {
    let c = Case::new(None, true);
    let err = c
        .check(
            signing_authority(None),
            NotationStoreType::SigningAuthority,
            NotationLevel::Strict,
        )
        .unwrap_err();
    assert!(
        err.contains("must carry io.cncf.notary.authenticSigningTime"),
        "{err}"
    );
}

#[test]
fn a_critical_verification_plugin_header_fails_naming_the_plugin() {
    let c = Case::new(None, true);
    let err = c
        .check(
            json!({
                "crit": ["io.cncf.notary.signingScheme", "io.cncf.notary.verificationPlugin"],
                "io.cncf.notary.verificationPlugin": "com.example.revocation",
            }),
            NotationStoreType::Ca,
            NotationLevel::Audit,
        )
        .unwrap_err();
    assert!(
        err.contains("\"com.example.revocation\"") && err.contains("cannot run"),
        "{err}"
    );
}

#[test]
fn an_expiry_of_the_wrong_type_is_malformed_and_expiry_is_inclusive() {
    let c = Case::new(None, true);
    let crit = json!(["io.cncf.notary.signingScheme", "io.cncf.notary.expiry"]);
    let err = c
        .check(
            json!({"crit": crit, "io.cncf.notary.expiry": 1_800_000_000}),
            NotationStoreType::Ca,
            NotationLevel::Strict,
        )
        .unwrap_err();
    assert!(
        err.contains("io.cncf.notary.expiry") && err.contains("RFC 3339"),
        "{err}"
    );
    // Expired when now ≥ expiry: at the very second of expiry.
    let at_now = time::OffsetDateTime::from_unix_timestamp(NOW)
        .unwrap()
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap();
    let err = c
        .check(
            json!({"crit": crit, "io.cncf.notary.expiry": at_now}),
            NotationStoreType::Ca,
            NotationLevel::Strict,
        )
        .unwrap_err();
    assert!(err.contains("expired"), "{err}");
}

#[test]
fn a_signing_certificate_without_digital_signature_key_usage_is_refused() {
    let c = Case::new(None, false);
    let err = c
        .check(json!({}), NotationStoreType::Ca, NotationLevel::Audit)
        .unwrap_err();
    assert!(err.contains("digitalSignature"), "{err}");
    // The same signer with the key usage passes.
    let ok = Case::new(None, true).check(json!({}), NotationStoreType::Ca, NotationLevel::Strict);
    assert_eq!(ok, Ok(vec![]));
}

/// Keep the problem types reachable for callers matching on them.
#[test]
fn store_mismatch_is_an_authenticity_failure() {
    let expired = Case::new(Some(Y2020), true);
    let env = expired.envelope(signing_authority(Some(IN_2020))).unwrap();
    let r = NotationCheck::new(
        vec![expired.cert.clone()],
        NotationLevel::Strict,
        NotationStoreType::Ca,
        None,
    )
    .check(&env, DIGEST, NOW);
    assert!(
        matches!(r, Err(SignatureProblem::ChainInvalid { .. })),
        "{r:?}"
    );
}
