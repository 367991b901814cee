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
        attestations: Vec::new(),
        found: Vec::new(),
        signed_at: Default::default(),
        platforms: None,
    }
}

fn seen(attestor: Option<&str>, holds: &[bool]) -> crate::verify::attestations::Seen {
    crate::verify::attestations::Seen {
        form: String::new(),
        attestor: attestor.map(str::to_owned),
        signer:
            "subject https://github.com/acme/x, issuer https://token.actions.githubusercontent.com"
                .into(),
        problem: attestor
            .is_none()
            .then(|| "wrong key (signature does not verify)".to_owned()),
        conditions: holds
            .iter()
            .map(|h| crate::attest::ConditionResult {
                expression: "predicate.builder.id == \"https://ci\"".into(),
                message: Some("built by our CI".into()),
                outcome: Ok(*h),
                saw: (!h).then(|| "\"https://evil\"".to_owned()),
            })
            .collect(),
    }
}

/// An entry passes when one attestation is verified and every condition
/// holds; the rule's report is satisfied only when signatures and every
/// entry pass; each failure says how many were found, by whom, and the
/// first failing condition with the value it read.
#[test]
fn attestation_entries_pass_only_verified_and_satisfied() {
    use crate::verify::attestations::EntryOutcome;
    let entry = |seen: Vec<crate::verify::attestations::Seen>| EntryOutcome {
        name: "built-by-ci".into(),
        predicate_type: "https://slsa.dev/provenance/v1".into(),
        seen,
        other_types: 2,
    };
    let mut r = report(&[("alice", true)], 1, &[]);
    r.attestations = vec![entry(vec![
        seen(None, &[]),
        seen(Some("gha"), &[true, true]),
    ])];
    assert!(r.satisfied());
    assert_eq!(r.vouched(), ["alice", "attestation built-by-ci"]);
    let mut line = String::from("spec.containers[0].image: ");
    r.write_vouched(&mut line);
    assert_eq!(
        line,
        format!("spec.containers[0].image: {}", r.vouched().join(", ")),
        "the annotation's writer says what vouched() lists"
    );
    // A verifier named "" (names need only be unique) still gets its comma.
    let unnamed = report(&[("", true), ("bob", true)], 1, &[]);
    let mut line = String::new();
    unnamed.write_vouched(&mut line);
    assert_eq!(line, unnamed.vouched().join(", "));
    r.attestations = vec![entry(vec![])];
    assert!(!r.satisfied() && r.only_attestations_failed());
    assert!(r.to_string().ends_with("; attestation built-by-ci: no https://slsa.dev/provenance/v1 attestation found for this digest (2 of other types)"), "{r}");
    r.attestations = vec![entry(vec![seen(None, &[])])];
    assert!(r.to_string().contains("1 https://slsa.dev/provenance/v1 attestation found, none verified by its attestors: wrong key"), "{r}");
    r.attestations = vec![entry(vec![seen(Some("gha"), &[true, false])])];
    let text = r.to_string();
    assert!(
        text.contains("1 verified (by gha, signer subject https://github.com/acme/x"),
        "{text}"
    );
    assert!(text.contains("; condition \"predicate.builder.id == \\\"https://ci\\\"\" (built by our CI) is false: it read \"https://evil\""), "{text}");
    // Attestations only (no verify): the report is the entries alone.
    let mut only = report(&[], 0, &[]);
    only.attestations = vec![entry(vec![])];
    assert!(
        only.to_string().starts_with("attestation built-by-ci: no "),
        "{only}"
    );
    // Signatures failing is reported as a signature failure, not an attestation one.
    let mut both = report(&[("alice", false)], 1, &[]);
    both.attestations = vec![entry(vec![])];
    assert!(!both.only_attestations_failed());
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
        key_ref: None,
        keyless: Some(KeylessSpec {
            issuer: Some("https://x".into()),
            ..Default::default()
        }),
        trusted_root: None,
        trust_root: None,
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
            signed_at: None,
        }),
    )
    .unwrap();
    assert_eq!(
        v.signatures_repository
            .as_ref()
            .map(|r| r.to_string())
            .as_deref(),
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
                signed_at: None,
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
