//! Rekor-v2-style bundles (no SET: an inclusion proof against an Ed25519
//! checkpoint, an RFC 3161 timestamp as the only signing time) made by the
//! test kit's Sigstore, verified by `bundle::verify`, and each part tampered.

#![allow(clippy::unwrap_used)]

use base64::Engine as _;
use serde_json::{Value, json};
use sigil_core::SignatureProblem;
use sigil_core::verify::TlogPolicy;
use sigil_testkit::signing::{Signer, b64};
use sigil_testkit::sigstore::Sigstore;
use sigil_verify::bundle::Matcher;
use sigil_verify::bundle::{Artifact, Requirements, Signer as Who, verify};
use sigil_verify::trust::TrustedRoot;

const SUBJECT: &str = "https://github.com/acme/app/.github/workflows/release.yml@refs/heads/main";
const ISSUER: &str = "https://token.actions.githubusercontent.com";
const DIGEST: &str = "sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";
const SIGNED_AT: i64 = 1_790_000_000;

fn digest() -> Artifact {
    let hex = DIGEST.trim_start_matches("sha256:");
    let mut d = [0u8; 32];
    for (i, b) in d.iter_mut().enumerate() {
        *b = u8::from_str_radix(&hex[i * 2..i * 2 + 2], 16).unwrap();
    }
    Artifact::Digest(d)
}

fn check(
    s: &Sigstore,
    bundle: &Value,
    req: Requirements,
) -> Result<sigil_verify::bundle::Verified, SignatureProblem> {
    check_with(s, bundle, req, |_| {})
}

/// [`check`] with the trusted root changed by `edit` first.
fn check_with(
    s: &Sigstore,
    bundle: &Value,
    req: Requirements,
    edit: impl FnOnce(&mut Value),
) -> Result<sigil_verify::bundle::Verified, SignatureProblem> {
    let mut root = s.trusted_root();
    edit(&mut root);
    let trust = TrustedRoot::from_json(&root.to_string()).unwrap();
    let (san, iss) = (
        Matcher::Exact(SUBJECT.into()),
        Matcher::Exact(ISSUER.into()),
    );
    verify(
        bundle.to_string().as_bytes(),
        &digest(),
        Who::Identity {
            san: &san,
            issuer: &iss,
            extensions: &[],
        },
        req,
        &trust,
    )
}

/// Where a bundle's first RFC 3161 timestamp is.
const TIMESTAMP: &str =
    "/verificationMaterial/timestampVerificationData/rfc3161Timestamps/0/signedTimestamp";

/// The signature bytes of a bundle's DSSE envelope (what timestamps cover).
fn dsse_signature(b: &Value) -> Vec<u8> {
    base64::engine::general_purpose::STANDARD
        .decode(b["dsseEnvelope"]["signatures"][0]["sig"].as_str().unwrap())
        .unwrap()
}

fn bundle(s: &Sigstore) -> Value {
    s.rekor_v2_bundle(DIGEST, SUBJECT, ISSUER, SIGNED_AT - 60, SIGNED_AT)
}

#[test]
fn a_rekor_v2_bundle_verifies_by_its_inclusion_proof_and_timestamp() {
    let s = Sigstore::new();
    let v = check(&s, &bundle(&s), Requirements::default()).unwrap();
    assert_eq!(
        (v.inclusion_proofs, v.timestamps, v.times.clone()),
        (1, 1, vec![SIGNED_AT])
    );
    // The policy can require both, and a threshold of timestamps.
    let strict = Requirements {
        tlog: TlogPolicy::Required,
        inclusion_proof: TlogPolicy::Required,
        timestamps: 1,
        tlog_default: false,
    };
    assert!(check(&s, &bundle(&s), strict).is_ok());
    let two = Requirements {
        timestamps: 2,
        ..strict
    };
    assert!(matches!(
        check(&s, &bundle(&s), two),
        Err(SignatureProblem::LevelCheck { .. })
    ));
}

#[test]
fn every_tampered_part_is_refused() {
    let s = Sigstore::new();
    let good = bundle(&s);
    let entry = "/verificationMaterial/tlogEntries/0";
    let mut cases: Vec<(&str, Value)> = Vec::new();

    let mut b = good.clone();
    let h = b
        .pointer(&format!("{entry}/inclusionProof/hashes/0"))
        .unwrap()
        .as_str()
        .unwrap()
        .to_owned();
    let mut raw = base64::engine::general_purpose::STANDARD.decode(h).unwrap();
    raw[0] ^= 1;
    *b.pointer_mut(&format!("{entry}/inclusionProof/hashes/0"))
        .unwrap() = json!(b64(&raw));
    cases.push(("a flipped proof hash", b));

    let mut b = good.clone();
    let root: [u8; 32] = base64::engine::general_purpose::STANDARD
        .decode(
            b.pointer(&format!("{entry}/inclusionProof/rootHash"))
                .unwrap()
                .as_str()
                .unwrap(),
        )
        .unwrap()
        .try_into()
        .unwrap();
    *b.pointer_mut(&format!("{entry}/inclusionProof/checkpoint/envelope"))
        .unwrap() = json!(s.checkpoint(9, &root, Some(&Signer::ed25519())));
    cases.push(("a checkpoint signed by another key", b));

    let mut b = good.clone();
    b.pointer_mut(entry)
        .unwrap()
        .as_object_mut()
        .unwrap()
        .remove("inclusionProof");
    cases.push(("a Rekor v2 entry without an inclusion proof", b));

    let mut b = good.clone();
    b["verificationMaterial"]
        .as_object_mut()
        .unwrap()
        .remove("timestampVerificationData");
    cases.push(("no timestamp (Rekor v2 has no SET: no signing time)", b));

    let sig = dsse_signature(&good);
    let ts = TIMESTAMP;
    let mut b = good.clone();
    *b.pointer_mut(ts).unwrap() = json!(b64(&s.timestamp(
        b"another signature",
        SIGNED_AT,
        false,
        None
    )));
    cases.push(("a timestamp over another signature", b));

    let mut b = good.clone();
    *b.pointer_mut(ts).unwrap() = json!(b64(&s.timestamp(
        &sig,
        SIGNED_AT,
        false,
        Some(&Signer::p256())
    )));
    cases.push(("a timestamp by an untrusted authority", b));

    let mut b = good.clone();
    *b.pointer_mut(ts).unwrap() = json!(b64(&s.timestamp(&sig, SIGNED_AT + 3600, true, None)));
    cases.push(("a timestamp after the certificate expired", b));

    cases.push((
        "a certificate for someone else",
        s.rekor_v2_bundle(
            DIGEST,
            "https://github.com/evil/app",
            ISSUER,
            SIGNED_AT - 60,
            SIGNED_AT,
        ),
    ));
    cases.push((
        "a signature over another image",
        s.rekor_v2_bundle(
            "sha256:0000000000000000000000000000000000000000000000000000000000000000",
            SUBJECT,
            ISSUER,
            SIGNED_AT - 60,
            SIGNED_AT,
        ),
    ));

    for (what, b) in cases {
        let got = check(&s, &b, Requirements::default());
        assert!(got.is_err(), "{what} was accepted");
    }
    // An embedded TSA certificate is fine.
    let mut b = good.clone();
    *b.pointer_mut(ts).unwrap() = json!(b64(&s.timestamp(&sig, SIGNED_AT, true, None)));
    assert!(check(&s, &b, Requirements::default()).is_ok());
}

fn check_root(
    s: &Sigstore,
    bundle: &Value,
    edit: impl FnOnce(&mut Value),
) -> Result<sigil_verify::bundle::Verified, SignatureProblem> {
    check_with(s, bundle, Requirements::default(), edit)
}

/// The Rekor v2 log is the trusted root's second tlog.
const V2_VALIDITY: &str = "/tlogs/1/publicKey/validFor";

fn rfc3339(t: i64) -> String {
    time::OffsetDateTime::from_unix_timestamp(t)
        .unwrap()
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap()
}

#[test]
fn a_log_outside_its_validity_does_not_verify_an_entry_by_inclusion_proof() {
    let s = Sigstore::new();
    let b = bundle(&s);
    // The log's key expired before the entry's verified (timestamp) time.
    let ended = check_root(&s, &b, |r| {
        *r.pointer_mut(V2_VALIDITY).unwrap() =
            json!({"start": "2020-01-01T00:00:00Z", "end": rfc3339(SIGNED_AT - 3600)});
    })
    .unwrap_err();
    assert!(
        ended.to_string().contains("not valid at the entry's time"),
        "{ended}"
    );
    // …or starts after it.
    let later = check_root(&s, &b, |r| {
        *r.pointer_mut(V2_VALIDITY).unwrap() = json!({"start": rfc3339(SIGNED_AT + 3600)});
    })
    .unwrap_err();
    assert!(
        later.to_string().contains("not valid at the entry's time"),
        "{later}"
    );
    // A log without a validity start is never trusted.
    let no_start = check_root(&s, &b, |r| {
        *r.pointer_mut(V2_VALIDITY).unwrap() = json!({});
    })
    .unwrap_err();
    assert!(
        no_start.to_string().contains("no validity start"),
        "{no_start}"
    );
    // Inside its validity (end inclusive) it verifies.
    assert!(
        check_root(&s, &b, |r| {
            *r.pointer_mut(V2_VALIDITY).unwrap() =
                json!({"start": "2020-01-01T00:00:00Z", "end": rfc3339(SIGNED_AT)});
        })
        .is_ok()
    );
}

/// Regression (issue 24): a trusted root whose transparency log has no
/// `validFor.start` let an entry in that log verify. The client
/// specification requires a start; such a log is never trusted, whether
/// `validFor` is missing or empty, and whatever the entry's time.
#[test]
fn a_transparency_log_without_validity_start_is_not_trusted() {
    let s = Sigstore::new();
    let b = bundle(&s);
    for edit in [
        |r: &mut Value| {
            r["tlogs"][1]["publicKey"]
                .as_object_mut()
                .unwrap()
                .remove("validFor");
        },
        |r: &mut Value| {
            *r.pointer_mut(V2_VALIDITY).unwrap() = json!({"end": "2099-01-01T00:00:00Z"})
        },
    ] {
        let err = check_root(&s, &b, edit).unwrap_err();
        assert!(err.to_string().contains("no validity start"), "{err}");
    }
    assert!(
        check_root(&s, &b, |_| {}).is_ok(),
        "the same bundle with a start verifies"
    );
}

#[test]
fn a_timestamp_authority_without_validity_start_is_not_trusted() {
    let s = Sigstore::new();
    let err = check_root(&s, &bundle(&s), |r| {
        r["timestampAuthorities"][0]
            .as_object_mut()
            .unwrap()
            .remove("validFor");
    })
    .unwrap_err();
    assert!(err.to_string().contains("no validity start"), "{err}");
}

#[test]
fn a_timestamp_whose_signing_certificate_attribute_names_another_certificate_is_refused() {
    let s = Sigstore::new();
    let good = bundle(&s);
    let sig = dsse_signature(&good);
    let ts = TIMESTAMP;
    let other = Sigstore::new();
    let mut b = good.clone();
    *b.pointer_mut(ts).unwrap() = json!(b64(&s.timestamp_naming(
        &sig,
        SIGNED_AT,
        false,
        None,
        Some(&other.tsa_cert)
    )));
    let err = check(&s, &b, Requirements::default()).unwrap_err();
    assert!(
        err.to_string().contains("names another certificate"),
        "{err}"
    );
    let mut b = good.clone();
    *b.pointer_mut(ts).unwrap() =
        json!(b64(&s.timestamp_naming(&sig, SIGNED_AT, false, None, None)));
    let err = check(&s, &b, Requirements::default()).unwrap_err();
    assert!(err.to_string().contains("ESSCertID"), "{err}");
}

/// A private Sigstore deployment (sigstore/scaffolding) serves Rekor v1 at
/// a URL whose host is not the origin its checkpoints name (the Rekor pod's
/// host name): refused because the origin was derived from `baseUrl`. A
/// Rekor v1 checkpoint is the log's by its key, as sigstore-go judges it
/// (`sigstore_go.rs` holds the real vector); a Rekor v2 checkpoint must name
/// its log besides (`authorities.rs`); a checkpoint the log's key did not
/// sign is refused either way.
#[test]
fn regression_a_checkpoint_is_the_logs_by_its_key_whatever_its_origin() {
    let s = Sigstore::new();
    let statement =
        sigil_testkit::intoto::statement(DIGEST, "https://slsa.dev/provenance/v1", json!({}));
    let v1: Value = serde_json::from_slice(&s.github_attestation(
        sigil_testkit::github::BUNDLE_V03,
        &statement,
        SUBJECT,
        ISSUER,
        &[],
        SIGNED_AT - 100,
        SIGNED_AT,
    ))
    .unwrap();
    let pod = |r: &mut Value| r["tlogs"][0]["baseUrl"] = json!("https://rekor.rekor-system.svc");
    check_with(&s, &v1, Requirements::default(), pod).unwrap();
    let err = check_with(&s, &bundle(&s), Requirements::default(), |r| {
        r["tlogs"][1]["baseUrl"] = json!("https://rekor.rekor-system.svc");
    })
    .unwrap_err();
    assert!(err.to_string().contains("names origin"), "{err}");
    let other = Sigstore::new();
    let err = check_root(&s, &bundle(&s), |r| {
        r["tlogs"][1]["publicKey"] = other.trusted_root()["tlogs"][1]["publicKey"].clone();
    })
    .unwrap_err();
    assert!(!err.to_string().is_empty());
}

/// `content` is a oneof: a bundle carrying a valid messageSignature and a
/// DSSE statement with a garbage signature once verified the first and
/// trusted the second's statement.
#[test]
fn a_bundle_with_both_message_signature_and_dsse_envelope_is_malformed() {
    let key = Signer::p256();
    let mut b: Value =
        serde_json::from_slice(&sigil_testkit::signing::dsse_bundle(&key, DIGEST)).unwrap();
    b["messageSignature"] = json!({
        "messageDigest": {"algorithm": "SHA2_256", "digest": b64(&[0u8; 32])},
        "signature": b64(&key.sign(b"x")),
    });
    let err =
        sigil_verify::cosign::Item::from_bundle(&serde_json::to_vec(&b).unwrap()).unwrap_err();
    assert!(
        err.to_string()
            .contains("both messageSignature and dsseEnvelope"),
        "{err}"
    );
    let pk = sigil_verify::keys::PublicKey::from_spki(&key.spki()).unwrap();
    let err = verify(
        b.to_string().as_bytes(),
        &digest(),
        Who::Key(&pk),
        Requirements {
            tlog: TlogPolicy::Optional,
            ..Requirements::default()
        },
        &TrustedRoot::public_good().unwrap(),
    )
    .unwrap_err();
    assert!(
        err.to_string()
            .contains("both messageSignature and dsseEnvelope"),
        "{err}"
    );
}
