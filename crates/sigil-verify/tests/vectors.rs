//! The real cosign and notation signatures from the vectors, checked without
//! a registry: every expected outcome the vectors' README (tests/vectors/README.md) and
//! their upstream notes give.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use serde_json::Value;
use sigil_core::verify::{CosignSpec, KeylessSpec, NotationSpec, VerifierSpec};
use sigil_core::{SignatureProblem, Verification, VerifierOutcome};
use sigil_verify::cosign::Item;
use sigil_verify::gather::Artifacts;
use sigil_verify::notation::Envelope;
use sigil_verify::{Material, evaluate};

const V: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/vectors");
const CO: &str = "cosign/securesystemsengineering/testimage";
const ALICE_ONLY: &str = "sha256:071bf7a986f1ca9cb2a1f0bc8392822a7777f90d58f2d2c6f271913e08de7c81";
const THREE: &str = "sha256:bfec161fecb0a887df7cb85e4da327c65986ccda7060cf3cd92171c6c90d7533";
const KEYLESS: &str = "sha256:31dc72a13a0c34b40eb95419d2b2fd67320c856baf3b72da518023ee8d370aee";

fn read(p: &str) -> Vec<u8> {
    std::fs::read(format!("{V}/{p}")).unwrap()
}

fn legacy(digest: &str) -> Artifacts {
    let hex = digest.trim_start_matches("sha256:");
    let m: Value =
        serde_json::from_slice(&read(&format!("{CO}/manifests/sha256-{hex}.sig.json"))).unwrap();
    let mut a = Artifacts::default();
    for l in m["layers"].as_array().unwrap() {
        let blob = l["digest"].as_str().unwrap().replace(':', "_");
        let payload = read(&format!("{CO}/blobs/{blob}.json"));
        a.cosign.push(Item::from_legacy(
            payload,
            l["annotations"].as_object().unwrap(),
        ));
    }
    a
}

fn key(name: &str, file: &str) -> VerifierSpec {
    VerifierSpec::cosign_key(name, &format!("{V}/cosign/{file}.key"))
}

fn run(
    verifiers: Vec<VerifierSpec>,
    a: &Artifacts,
    digest: &str,
    now: i64,
) -> Vec<(String, VerifierOutcome)> {
    let v = Arc::new(Verification::compile("r", &verifiers, Some(1), &[], None).unwrap());
    let policy = policy_with(&v);
    let m = Material::load(&policy).unwrap();
    evaluate(&v, &m.get(&v).unwrap().verifiers, a, digest, now).results
}

/// A policy whose only rule carries `v` (Material loads from a policy).
fn policy_with(v: &Verification) -> sigil_core::Policy {
    let doc = serde_json::json!({
        "apiVersion": "sigil.dev/v1alpha1", "kind": "ImagePolicy",
        "spec": {"rules": [{"name": "r", "match": ["**"], "verify": v.verifiers, "threshold": 1}]}
    });
    sigil_core::Policy::from_json_value(doc).unwrap()
}

const NOW: i64 = 1_795_000_000;

/// The reason a verifier failed, if it did.
fn problem(o: &VerifierOutcome) -> Option<&SignatureProblem> {
    match o {
        VerifierOutcome::Failed { problem, .. } => Some(problem),
        VerifierOutcome::Passed { .. } => None,
    }
}

#[test]
fn alice_signature_is_valid_only_with_alice() {
    let r = run(
        vec![
            key("alice", "alice"),
            key("bob", "bob"),
            key("charlie", "charlie"),
            key("default", "default"),
        ],
        &legacy(ALICE_ONLY),
        ALICE_ONLY,
        NOW,
    );
    assert!(r[0].1.passed(), "{r:?}");
    for (n, o) in &r[1..] {
        assert_eq!(
            *o,
            VerifierOutcome::Failed {
                examined: 1,
                problem: SignatureProblem::WrongKey
            },
            "{n}"
        );
    }
}

#[test]
fn three_layers_each_valid_with_its_own_key_and_default_fails() {
    let r = run(
        vec![
            key("alice", "alice"),
            key("bob", "bob"),
            key("charlie", "charlie"),
            key("default", "default"),
        ],
        &legacy(THREE),
        THREE,
        NOW,
    );
    assert!(
        r[0].1.passed() && r[1].1.passed() && r[2].1.passed(),
        "{r:?}"
    );
    assert!(!r[3].1.passed());
}

#[test]
fn a_valid_signature_over_another_digest_counts_as_none() {
    let r = run(vec![key("alice", "alice")], &legacy(ALICE_ONLY), THREE, NOW);
    assert_eq!(
        r[0].1,
        VerifierOutcome::Failed {
            examined: 1,
            problem: SignatureProblem::DigestMismatch {
                signed: ALICE_ONLY.into()
            }
        }
    );
}

fn keyless(subject: &str, trusted_root: Option<String>) -> VerifierSpec {
    VerifierSpec {
        name: "ci".into(),
        cosign: Some(CosignSpec {
            key: None,
            key_ref: None,
            keyless: Some(KeylessSpec {
                issuer: Some("https://github.com/login/oauth".into()),
                issuer_regex: None,
                subject: None,
                subject_regex: Some(subject.into()),
                ..KeylessSpec::default()
            }),
            trusted_root,
            trust_root: None,
            transparency_log: None,
            inclusion_proof: None,
            timestamp_threshold: None,
        }),
        notation: None,
    }
}

#[test]
fn keyless_vector_is_valid_at_integrated_time_against_the_public_good_root() {
    let r = run(
        vec![keyless("^philipp\\.belitz@securesystems\\.de$", None)],
        &legacy(KEYLESS),
        KEYLESS,
        NOW,
    );
    assert!(r[0].1.passed(), "{r:?}");
}

#[test]
fn keyless_vector_with_another_identity_is_an_identity_mismatch() {
    let r = run(
        vec![keyless("^https://github\\.com/acme/.+$", None)],
        &legacy(KEYLESS),
        KEYLESS,
        NOW,
    );
    assert!(
        matches!(problem(&r[0].1), Some(SignatureProblem::IdentityMismatch { found }) if found.contains("philipp.belitz")),
        "{r:?}"
    );
}

#[test]
fn keyless_vector_without_its_log_entry_is_checked_now_and_the_leaf_has_expired() {
    // transparencyLog optional + entry stripped: the only time left is now,
    // when the ten-minute Fulcio leaf is long expired.
    let mut a = legacy(KEYLESS);
    if let Ok(i) = &mut a.cosign[0] {
        i.entries.clear();
    }
    let mut spec = keyless("philipp", None);
    spec.cosign.as_mut().unwrap().transparency_log = Some(sigil_core::verify::TlogPolicy::Optional);
    let r = run(vec![spec.clone()], &a, KEYLESS, NOW);
    assert!(
        matches!(problem(&r[0].1), Some(SignatureProblem::ChainInvalid { detail }) if detail.contains("not valid at")),
        "{r:?}"
    );
    spec.cosign.as_mut().unwrap().transparency_log = None; // default: required
    let r = run(vec![spec], &a, KEYLESS, NOW);
    assert!(
        matches!(
            problem(&r[0].1),
            Some(SignatureProblem::LogEntryInvalid { .. })
        ),
        "{r:?}"
    );
}

#[test]
fn keyless_vector_against_another_rekor_key_is_a_log_entry_failure() {
    // A trusted root whose only log key is alice's: the SET cannot verify.
    let alice = std::fs::read_to_string(format!("{V}/cosign/alice.key")).unwrap();
    let der = sigil_verify::keys::pem_blocks(&alice).remove(0).1;
    let mut root: Value = serde_json::from_str(sigil_verify::trust::PUBLIC_GOOD).unwrap();
    use base64::Engine as _;
    let b64 = base64::engine::general_purpose::STANDARD;
    root["tlogs"][0]["publicKey"]["rawBytes"] = Value::String(b64.encode(&der));
    root["tlogs"][0]["logId"]["keyId"] = Value::String(b64.encode(sigil_verify::sha256(&der)));
    let dir = std::env::temp_dir().join(format!("sigil-wrong-rekor-{}", std::process::id()));
    std::fs::write(&dir, serde_json::to_vec(&root).unwrap()).unwrap();
    let r = run(
        vec![keyless("philipp", Some(dir.display().to_string()))],
        &legacy(KEYLESS),
        KEYLESS,
        NOW,
    );
    let _ = std::fs::remove_file(&dir);
    assert!(
        matches!(
            problem(&r[0].1),
            Some(SignatureProblem::LogEntryInvalid { .. })
        ),
        "{r:?}"
    );
}

fn notation(root: &str) -> VerifierSpec {
    VerifierSpec {
        name: "release".into(),
        cosign: None,
        notation: Some(NotationSpec {
            trust_roots: vec![format!("{V}/derived/{root}")],
            ..NotationSpec::default()
        }),
    }
}

#[test]
fn notation_vector_valid_with_its_root_and_invalid_with_the_wrong_one() {
    let env = read(
        "notation/sse-secure-systems/testimage/blobs/sha256_929a0a249c4614eb8bef5a914308896e7c8c5422d508eaddfd98dfe61683e556.json",
    );
    let a = Artifacts {
        notation: vec![Envelope::parse("application/jose+json", &env)],
        ..Default::default()
    };
    let d = "sha256:a136cc4e785798e5e8483047cf621cf0a0300a93d47703a3f066c340c070f5cf";
    assert!(
        run(vec![notation("notation-trust-root.crt")], &a, d, NOW)[0]
            .1
            .passed()
    );
    assert!(
        !run(vec![notation("notation-wrong-trust-root.crt")], &a, d, NOW)[0]
            .1
            .passed()
    );
    // The unsigned image has no envelope at all.
    let r = run(
        vec![notation("notation-trust-root.crt")],
        &Artifacts::default(),
        d,
        NOW,
    );
    assert_eq!(
        r[0].1,
        VerifierOutcome::Failed {
            examined: 0,
            problem: SignatureProblem::NoSignature
        }
    );
}
