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
use sigil_verify::bundle::{Artifact, Requirements, Signer as Who, verify};
use sigil_verify::cosign::Matcher;
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
    let trust = TrustedRoot::from_json(&s.trusted_root().to_string()).unwrap();
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
        },
        req,
        &trust,
    )
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

    let sig = base64::engine::general_purpose::STANDARD
        .decode(
            good["dsseEnvelope"]["signatures"][0]["sig"]
                .as_str()
                .unwrap(),
        )
        .unwrap();
    let ts = "/verificationMaterial/timestampVerificationData/rfc3161Timestamps/0/signedTimestamp";
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
