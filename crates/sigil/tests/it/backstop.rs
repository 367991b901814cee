//! `sigil backstop` as a user runs it, without a cluster: the examples'
//! policies print a ValidatingAdmissionPolicy and binding (and a warning
//! pair where rules warn), headed by what is left to the webhook; a policy
//! it cannot load is a clear error (exit 2), nothing printed. On a real API
//! server: `real_kube::backstop`.

use crate::support::sigil::run_sigil;

fn examples(name: &str) -> String {
    format!("{}/../../examples/{name}", env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn the_examples_policies_print_a_backstop() {
    for (policy, warn) in [("policy-verify.yaml", true), ("policy.yaml", true)] {
        let out = run_sigil(&["backstop", "--policy", &examples(policy)], None);
        assert!(
            out.status.success(),
            "{policy}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = String::from_utf8(out.stdout).unwrap();
        let docs = crate::deploy::objects(&text);
        let kinds: Vec<&str> = docs.iter().map(|d| d["kind"].as_str().unwrap()).collect();
        assert_eq!(kinds.len(), if warn { 4 } else { 2 }, "{policy}: {kinds:?}");
        assert_eq!(docs[0]["metadata"]["name"], "sigil-backstop");
        assert_eq!(docs[1]["spec"]["validationActions"][0], "Deny");
        if policy == "policy-verify.yaml" {
            assert!(
                text.contains("# Left to the webhook")
                    && text.contains("signatures and attestations"),
                "{text}"
            );
        }
    }
}

#[test]
fn a_policy_it_cannot_load_is_an_error_and_prints_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.yaml");
    std::fs::write(&bad, "apiVersion: sigil.dev/v1alpha1\nkind: ImagePolicy\nspec:\n  rules: [{name: x, match: [\"**\"], mode: sometimes}]\n").unwrap();
    let out = run_sigil(&["backstop", "--policy", bad.to_str().unwrap()], None);
    assert_eq!(out.status.code(), Some(2));
    assert!(out.stdout.is_empty());
    assert!(String::from_utf8_lossy(&out.stderr).contains("bad.yaml"));
}

/// A policy whose backstop the API server would refuse or could not keep
/// inside its cost budget (here: more patterns per image than the
/// envelope) is refused by `sigil policy check` and `sigil backstop`,
/// naming the limit, nothing printed — both said "ok" before, and the
/// apply then failed in the cluster, leaving the older backstop in force.
#[test]
fn regression_a_policy_past_the_backstops_limits_fails_policy_check_and_backstop() {
    let dir = tempfile::tempdir().unwrap();
    let wide = dir.path().join("wide.yaml");
    let patterns: Vec<String> = (0..=sigil_core::backstop::MAX_CROWD)
        .map(|i| format!("\"*.r{i}.example.com/**\""))
        .collect();
    std::fs::write(
        &wide,
        format!(
            "apiVersion: sigil.dev/v1alpha1\nkind: ImagePolicy\nmetadata: {{name: wide}}\nspec:\n  rules: [{{name: wide, match: [{}]}}]\n",
            patterns.join(", ")
        ),
    )
    .unwrap();
    let file = wide.to_str().unwrap();
    for args in [
        &["backstop", "--policy", file][..],
        &["policy", "check", file],
    ] {
        let out = run_sigil(args, None);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(
            err.contains("tested against 101 patterns") && err.contains("at most 100"),
            "{args:?}: {err}"
        );
        if args[0] == "backstop" {
            assert!(out.stdout.is_empty());
        }
    }
}
