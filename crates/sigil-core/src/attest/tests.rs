//! Statements, predicate types and conditions.

use super::*;
use serde_json::json;

const D: &str = "sha256:ab0000000000000000000000000000000000000000000000000000000000cdef";

fn slsa_v1() -> Vec<u8> {
    serde_json::to_vec(&json!({
        "_type": "https://in-toto.io/Statement/v1",
        "subject": [{"name": "img", "digest": {"sha256": D.trim_start_matches("sha256:").to_uppercase()}}],
        "predicateType": "https://slsa.dev/provenance/v1",
        "predicate": {
            "buildDefinition": {"externalParameters": {"workflow": {"repository": "https://github.com/acme/api", "ref": "refs/heads/main"}}},
            "runDetails": {"builder": {"id": "https://github.com/actions/runner/github-hosted"}},
            "metadata": {"scanFinishedOn": "2025-11-20T00:00:00Z"},
            "scanner": {"result": {"summary": {"critical": 0}}},
            "materials": [{"uri": "a"}, {"uri": "b"}]
        }
    }))
    .unwrap()
}

fn signer() -> BTreeMap<String, String> {
    BTreeMap::from([
        ("verifier".into(), "gha".into()),
        ("sourceRepositoryRef".into(), "refs/heads/main".into()),
        (
            "issuer".into(),
            "https://token.actions.githubusercontent.com".into(),
        ),
    ])
}

fn run(exprs: &[&str], now: i64) -> Vec<ConditionResult> {
    let st = Statement::parse(&slsa_v1(), DEFAULT_MAX_ATTESTATION_BYTES).unwrap();
    let conditions: Vec<Condition> = exprs
        .iter()
        .map(|e| Condition::compile(e, None).unwrap())
        .collect();
    let signer = signer();
    evaluate(
        &conditions,
        &Evidence {
            statement: &st,
            digest: D,
            signer: &signer,
            image: None,
            timestamps: &[now - 60],
        },
        now,
    )
}

#[test]
fn statements_are_read_and_matched_on_any_digest_case() {
    let st = Statement::parse(&slsa_v1(), 1 << 20).unwrap();
    assert_eq!(st.predicate_type, "https://slsa.dev/provenance/v1");
    assert!(st.names(D));
    assert!(st.names(&D.to_uppercase().replace("SHA256", "sha256")));
    assert!(!st.names("sha256:00"));
    assert!(!st.names("sha512:ab"));
    assert!(matches!(
        Statement::parse(&slsa_v1(), 10),
        Err(AttestError::TooLarge { limit: 10, .. })
    ));
    for bad in [
        json!({"_type": "x", "subject": [], "predicateType": "p"}),
        json!({"_type": "https://in-toto.io/Statement/v0.1", "subject": []}),
        json!({"_type": "https://in-toto.io/Statement/v0.1", "predicateType": "p"}),
    ] {
        let b = serde_json::to_vec(&bad).unwrap();
        assert!(Statement::parse(&b, 1 << 20).is_err(), "{bad}");
    }
    assert!(Statement::parse(b"not json", 1 << 20).is_err());
}

/// Found by the `attest` fuzz target (its subject-naming invariant): a
/// subject digest written in upper case, or under an algorithm that is not
/// an OCI algorithm name (`sh:512`), must behave predictably — the first
/// names the image whatever the case, the second never names one.
#[test]
fn subject_digests_in_upper_case_name_the_image_and_odd_algorithms_never_do() {
    let hex = "EFEFEFEFEFEFEFEFEFEFEFEFEFEFEFEFEFEFEFEFEFEFEFEFEFEFEFEFEFEFEFEF";
    let doc = |alg: &str| {
        format!(
            r#"{{"_type":"https://in-toto.io/Statement/v1","subject":[{{"name":"img","digest":{{"{alg}":"{hex}"}}}}],"predicateType":"https://openvex.dev/ns","predicate":{{}}}}"#
        )
    };
    let st = Statement::parse(doc("sha256").as_bytes(), 1 << 20).unwrap();
    assert!(st.names(&format!("sha256:{}", hex.to_lowercase())));
    assert!(st.names(&format!("sha256:{hex}")));
    let st = Statement::parse(doc("sh:512").as_bytes(), 1 << 20).unwrap();
    assert!(!st.names(&format!("sh:512:{hex}")));
    assert!(!st.names(&format!("sha512:{hex}")));
}

#[test]
fn short_predicate_names_are_cosigns() {
    assert_eq!(
        predicate_type_uri("slsaprovenance1"),
        "https://slsa.dev/provenance/v1"
    );
    assert_eq!(
        predicate_type_uri("vuln"),
        "https://cosign.sigstore.dev/attestation/vuln/v1"
    );
    assert_eq!(predicate_type_uri("https://x/y"), "https://x/y");
}

#[test]
fn the_issue_examples_hold_over_a_slsa_v1_statement() {
    let now = 1_763_900_000; // 2025-11-23
    let r = run(
        &[
            r#"predicate.buildDefinition.externalParameters.workflow.repository == "https://github.com/acme/api""#,
            r#"signer.sourceRepositoryRef in ["refs/heads/main"] || signer.sourceRepositoryRef.startsWith("refs/tags/v")"#,
            "predicate.scanner.result.summary.critical == 0",
            r#"predicateType == "https://slsa.dev/provenance/v1" && subject.name == "img""#,
            "predicate.materials.exists(m, m.uri == 'b') && size(timestamps) == 1 && timestamps[0] < now",
        ],
        now,
    );
    assert!(r.iter().all(ConditionResult::holds), "{r:?}");
}

#[test]
fn freshness_is_judged_against_now() {
    let scanned = 1_763_596_800; // 2025-11-20T00:00:00Z
    let fresh = r#"now - timestamp(predicate.metadata.scanFinishedOn) < duration("168h")"#;
    assert!(run(&[fresh], scanned + 86_400)[0].holds());
    assert_eq!(run(&[fresh], scanned + 8 * 86_400)[0].outcome, Ok(false));
}

#[test]
fn a_missing_field_or_a_non_bool_is_false_with_the_reason() {
    let r = run(
        &["predicate.nothing.here == 1", "1 + 1", "signer.issuer"],
        0,
    );
    for c in &r {
        assert!(!c.holds());
        assert!(c.outcome.is_err(), "{c:?}");
        assert!(
            c.describe().contains("cannot be evaluated"),
            "{}",
            c.describe()
        );
    }
    assert!(r[0].describe().contains("nothing"), "{}", r[0].describe());
}

#[test]
fn bad_expressions_are_refused_when_compiled() {
    for (e, why) in [
        ("a +", "Syntax"),
        ("[1].all(x, [2].all(y, x < y))", "nest 2 deep"),
        (
            "[1].exists(x, [[2]].map(l, l.all(y, y > x)).size() > 0)",
            "nest 3 deep",
        ),
    ] {
        let err = Condition::compile(e, None).unwrap_err().to_string();
        assert!(err.contains(why), "{e}: {err}");
    }
    let long = "true && ".repeat(600) + "true";
    assert!(
        Condition::compile(&long, None)
            .unwrap_err()
            .to_string()
            .contains("longer than")
    );
    // One level, beside another one level, is fine.
    assert!(Condition::compile("[1].all(x, x > 0) && [2].exists(y, y == 2)", None).is_ok());
    assert_eq!(
        Condition::compile("true", Some(String::new()))
            .unwrap()
            .message,
        None
    );
}

/// A false condition reports the value its comparison read, so a denial can
/// say what was there (the false side of `&&`, the receiver of a method).
#[test]
fn a_false_condition_shows_the_value_it_read() {
    let r = run(
        &[
            r#"predicate.buildDefinition.externalParameters.workflow.repository == "https://github.com/acme/other""#,
            r#"predicateType != "" && predicate.scanner.result.summary.critical > 3"#,
            r#"signer.sourceRepositoryRef.startsWith("refs/tags/")"#,
            r#"signer.sourceRepositoryRef in ["refs/heads/release"]"#,
            r#"predicateType == "https://slsa.dev/provenance/v1""#,
        ],
        1_764_000_000,
    );
    let saw: Vec<Option<&str>> = r.iter().map(|c| c.saw.as_deref()).collect();
    assert_eq!(
        saw,
        [
            Some(r#""https://github.com/acme/api""#),
            Some("0"),
            Some(r#""refs/heads/main""#),
            Some(r#""refs/heads/main""#),
            None,
        ]
    );
    assert!(
        r[0].describe()
            .ends_with(r#"false (it read "https://github.com/acme/api")"#)
    );
}

/// Conditions see the same values whether the statement is read whole or
/// only as far as they name the predicate; what they do not name is still
/// checked as JSON, and `statement` (or `predicate` used whole) reads all.
#[test]
fn a_statement_read_for_its_conditions_answers_as_the_whole_one() {
    let exprs = [
        r#"predicate.buildDefinition.externalParameters.workflow.ref == "refs/heads/main""#,
        r#"has(predicate.scanner) && predicate.materials.size() == 2"#,
        r#"predicate.metadata.scanFinishedOn.startsWith("2025")"#,
    ];
    let conditions: Vec<Condition> = exprs
        .iter()
        .map(|e| Condition::compile(e, None).unwrap())
        .collect();
    assert_eq!(
        Reads::of_all(&conditions),
        Reads::Fields(
            ["buildDefinition", "scanner", "materials", "metadata"]
                .map(String::from)
                .into()
        )
    );
    let whole = Statement::parse(&slsa_v1(), 1 << 20).unwrap();
    let pruned = Statement::parse_for(&slsa_v1(), 1 << 20, &conditions).unwrap();
    assert_ne!(whole, pruned, "runDetails is skipped");
    let signer = signer();
    let ev = |s| Evidence {
        statement: s,
        digest: D,
        signer: &signer,
        image: None,
        timestamps: &[],
    };
    assert_eq!(
        evaluate(&conditions, &ev(&whole), 0),
        evaluate(&conditions, &ev(&pruned), 0)
    );
    assert!(
        evaluate(&conditions, &ev(&pruned), 0)
            .iter()
            .all(ConditionResult::holds)
    );
    let all = [Condition::compile("size(statement.predicate) > 0", None).unwrap()];
    assert_eq!(Reads::of_all(&all), Reads::All);
    let whole_use = [Condition::compile("predicate != null", None).unwrap()];
    assert_eq!(Reads::of_all(&whole_use), Reads::All);
    // Skipped is not unchecked: broken JSON in an unread field still refuses.
    let broken = br#"{"_type":"https://in-toto.io/Statement/v1","subject":[],"predicateType":"x","predicate":{"a":1,"b":[1,}}"#;
    assert!(Statement::parse_for(broken, 1 << 20, &conditions).is_err());
}

/// A heavy loop body: `predicate.a.all(x, x == 1 || x == 2 || …)`.
fn heavy(alternatives: usize) -> String {
    let body: Vec<String> = (0..alternatives).map(|i| format!("x=={i}")).collect();
    format!("predicate.a.all(x, {})", body.join("||"))
}

/// A condition whose cost bound on the entry's `maxAttestationSize` is
/// over the budget is refused when the policy loads, naming the field to
/// lower; the same one fits under a smaller size. Evaluated on a statement
/// larger than its bound allows (what `verify-bundle --condition` could
/// hand it), it is not evaluated and fails saying why.
#[test]
fn a_condition_over_the_budget_is_refused_at_load_and_not_evaluated() {
    let e = heavy(300);
    let c = Condition::compile(&e, None).unwrap();
    assert!(c.cost.per_element > 1000, "{:?}", c.cost);
    let policy = |size: &str| {
        format!(
            "apiVersion: sigil.dev/v1alpha1\nkind: ImagePolicy\nspec:\n  rules:\n    - name: a\n      match: [\"**\"]\n      verify: [{{name: k, cosign: {{key: /k.pub}}}}]\n      attestations:\n        - name: sbom\n          predicateType: spdx\n          attestors: [k]\n          maxAttestationSize: {size}\n          conditions: [{{expression: '{e}'}}]\n"
        )
    };
    let err = crate::Policy::from_yaml(&policy("8Mi"))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("over the budget") && err.contains("lower maxAttestationSize"),
        "{err}"
    );
    crate::Policy::from_yaml(&policy("16Ki")).expect("fits on a small statement");
    // Evaluated on a statement past what its bound allows: not run.
    let big = serde_json::to_vec(&json!({
        "_type": "https://in-toto.io/Statement/v1",
        "subject": [{"name": "img", "digest": {"sha256": "ab"}}],
        "predicateType": "https://spdx.dev/Document",
        "predicate": {"a": vec![0; 60_000]}
    }))
    .unwrap();
    let st = Statement::parse(&big, DEFAULT_MAX_ATTESTATION_BYTES).unwrap();
    assert!(c.cost.at(st.bytes(), st.elements()) > CONDITION_BUDGET);
    let signer = signer();
    let r = evaluate(
        std::slice::from_ref(&c),
        &Evidence {
            statement: &st,
            digest: D,
            signer: &signer,
            image: None,
            timestamps: &[],
        },
        0,
    );
    assert!(
        matches!(&r[0].outcome, Err(why) if why.starts_with("not evaluated") && why.contains("budget")),
        "{:?}",
        r[0].outcome
    );
}
