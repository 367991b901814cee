//! The in-toto statement parser and CEL conditions over arbitrary
//! statements and expressions: never a panic, never a hang; a condition
//! compiled from the input is either refused or evaluates to a result; and
//! a statement read only as far as the conditions name its predicate
//! (`Statement::parse_for`, the webhook's path) answers exactly as the
//! whole one.
//! Input: one line of expression, then the statement.
#![no_main]

use std::collections::BTreeMap;
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use sigil_core::attest::{Condition, Evidence, Statement, evaluate};

/// Conditions of the shapes policies use, compiled once.
fn fixed() -> &'static [Condition] {
    static C: OnceLock<Vec<Condition>> = OnceLock::new();
    C.get_or_init(|| {
        [
            r#"predicate.buildDefinition.externalParameters.workflow.repository == "https://github.com/acme/api""#,
            r#"signer.sourceRepositoryRef in ["refs/heads/main"] || signer.sourceRepositoryRef.startsWith("refs/tags/v")"#,
            r#"now - timestamp(predicate.metadata.scanFinishedOn) < duration("168h")"#,
            "predicate.scanner.result.summary.critical == 0",
            "statement.subject.all(s, size(s.digest) > 0) && predicate.materials.exists(m, m.uri.matches('^git'))",
            "size(predicate) * 2 > 1 && predicateType.endsWith('v1') && subject.name != ''",
        ]
        .iter()
        .map(|e| Condition::compile(e, None).expect("fixed conditions compile"))
        .collect()
    })
}

fuzz_target!(|data: &[u8]| {
    let (expr, rest) = match data.iter().position(|b| *b == b'\n') {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (&data[..0], data),
    };
    let mut conditions = fixed().to_vec();
    if let Ok(e) = std::str::from_utf8(expr)
        && let Ok(c) = Condition::compile(e, None)
    {
        conditions.push(c);
    }
    let Ok(st) = Statement::parse(rest, 1 << 20) else { return };
    let signer = BTreeMap::from([("sourceRepositoryRef".to_owned(), "refs/heads/main".to_owned())]);
    // A subject digest under an OCI-shaped algorithm (no ':') names the
    // image whatever the hex's case; one under any other never can.
    let digest = st
        .subjects
        .first()
        .and_then(|(_, d)| d.iter().find(|(a, _)| !a.contains(':')))
        .map(|(a, h)| format!("{a}:{h}"))
        .unwrap_or_default();
    if let Some((alg, hex)) = digest.split_once(':') {
        assert!(st.names(&digest));
        assert!(st.names(&format!("{alg}:{}", hex.to_ascii_uppercase())));
    }
    let results = evaluate(
        &conditions,
        &Evidence { statement: &st, digest: &digest, signer: &signer, image: None, timestamps: &[0, i64::MAX] },
        1_763_900_000,
    );
    assert_eq!(results.len(), conditions.len());
    // The pruned read: the conditions that name predicate fields (not
    // `statement`, not the predicate as a whole) plus the input's own.
    let named: Vec<Condition> = conditions[..4].iter().chain(conditions.get(6)).cloned().collect();
    let ev = |s| Evidence { statement: s, digest: &digest, signer: &signer, image: None, timestamps: &[0, i64::MAX] };
    let pruned = Statement::parse_for(rest, 1 << 20, &named).expect("what parses whole parses pruned");
    assert_eq!(evaluate(&named, &ev(&st), 1_763_900_000), evaluate(&named, &ev(&pruned), 1_763_900_000));
});
