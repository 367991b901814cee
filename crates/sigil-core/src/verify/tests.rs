//! Policy-side checks of verifier specs and reports.

use super::*;

fn key(name: &str) -> VerifierSpec {
    VerifierSpec::cosign_key(name, "k.pub")
}

fn report(results: &[(&str, bool)], threshold: usize, required: &[&str]) -> VerificationReport {
    VerificationReport {
        results: results
            .iter()
            .map(|(n, ok)| {
                (
                    n.to_string(),
                    if *ok {
                        VerifierOutcome::Passed {
                            examined: 1,
                            logged: vec![],
                        }
                    } else {
                        VerifierOutcome::failed(1, vec![SignatureProblem::WrongKey])
                    },
                )
            })
            .collect(),
        fetch_failure: None,
        threshold,
        required: required.iter().map(|s| s.to_string()).collect(),
    }
}

#[test]
fn threshold_and_required() {
    assert!(
        report(
            &[("alice", true), ("bob", true), ("ci", false)],
            2,
            &["alice"]
        )
        .satisfied()
    );
    // Two pass but alice is not among them.
    assert!(
        !report(
            &[("alice", false), ("bob", true), ("ci", true)],
            2,
            &["alice"]
        )
        .satisfied()
    );
    assert!(!report(&[("alice", true), ("bob", false)], 2, &[]).satisfied());
    assert!(report(&[("alice", true)], 1, &[]).satisfied());
}

#[test]
fn default_threshold_is_all_and_bad_settings_are_refused() {
    let v = Verification::compile("r", &[key("a"), key("b")], None, &[], None).unwrap();
    assert_eq!(v.threshold, 2);
    assert!(Verification::compile("r", &[key("a")], Some(2), &[], None).is_err());
    assert!(Verification::compile("r", &[key("a")], Some(0), &[], None).is_err());
    assert!(Verification::compile("r", &[key("a")], None, &["b".into()], None).is_err());
    assert!(Verification::compile("r", &[key("a"), key("a")], None, &[], None).is_err());
    let mut ks = key("k");
    ks.cosign = Some(CosignSpec {
        key: None,
        keyless: Some(KeylessSpec {
            issuer: Some("https://x".into()),
            ..Default::default()
        }),
        trusted_root: None,
        transparency_log: None,
        inclusion_proof: None,
        timestamp_threshold: None,
    });
    let e = Verification::compile("r", &[ks], None, &[], None).unwrap_err();
    assert!(e.contains("subject"), "{e}");
}

#[test]
fn signatures_repository_is_normalized() {
    let v = Verification::compile(
        "r",
        &[key("a")],
        None,
        &[],
        Some(&SignaturesSpec {
            repository: Some("example.com/team/sigs".into()),
        }),
    )
    .unwrap();
    assert_eq!(
        v.signatures_repository.as_deref(),
        Some("example.com/team/sigs")
    );
    assert!(
        Verification::compile(
            "r",
            &[key("a")],
            None,
            &[],
            Some(&SignaturesSpec {
                repository: Some("example.com/team/sigs:v1".into()),
            }),
        )
        .is_err()
    );
}

#[test]
fn report_names_each_verifier_and_why() {
    let mut r = report(&[("alice", true), ("bob", false)], 2, &["alice"]);
    r.results
        .push(("ci".into(), VerifierOutcome::failed(0, vec![])));
    let s = r.to_string();
    assert!(
        s.contains("1 of 3 verifiers passed (need 2, including alice)"),
        "{s}"
    );
    assert!(s.contains("bob: wrong key"), "{s}");
    assert!(s.contains("ci: no signature found"), "{s}");
}
