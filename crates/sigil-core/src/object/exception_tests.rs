//! ImagePolicyExceptions through the one decision: which failures they
//! waive, until when, and which documents the policy refuses.

use super::*;
use crate::exception::{Exception, ExceptionState};
use crate::walker::summarize_value;

/// 2026-12-01T00:00:00Z
const DEC1: i64 = 1_796_083_200;
const DAY: i64 = 86_400;

const FILE: &str = "apiVersion: sigil.dev/v1alpha1
kind: ClusterImagePolicy
metadata: {name: supply-chain}
spec:
  rules:
  - {name: everything, match: ['**'], action: allow}
  - name: banned
    match: ['registry.example.com/team/legacy-*']
    action: deny
    exceptions: {allowed: true, maxDuration: 240h}
  - {name: strict, match: ['registry.example.com/strict/**'], action: deny}
---
apiVersion: sigil.dev/v1alpha1
kind: ImagePolicy
metadata: {name: own, namespace: team-a}
spec:
  rules:
  - name: no-old
    match: ['registry.example.com/team/old']
    action: deny
    exceptions: {allowed: true}
";

fn exception(ns: &str, images: &str, rules: &str, expires: &str) -> String {
    format!(
        "apiVersion: sigil.dev/v1alpha1
kind: ImagePolicyException
metadata: {{name: legacy, namespace: {ns}, creationTimestamp: '2026-12-01T00:00:00Z'}}
spec:
  images: {images}
  rules: {rules}
  expires: '{expires}'
  reason: vendor image, signed build pending
  ticket: SEC-1234
"
    )
}

const BANNED: &str = "[{policy: ClusterImagePolicy/supply-chain, rule: banned}]";

fn pod(image: &str) -> crate::walker::ObjectSummary {
    summarize_value(
        &serde_json::json!({"kind": "Pod", "metadata": {"name": "p"},
        "spec": {"containers": [{"name": "app", "image": image}]}}),
    )
}

fn label(p: &Policy, ns: &str, image: &str, now: i64) -> (String, Option<String>) {
    let o = pod(image);
    let facts = ObjectFacts {
        operation: Operation::Create,
        source: Source::Admission,
        kind: "Pod",
        namespace: Some(ns),
        object: Some(o),
        old_object: None,
        namespace_labels: None,
    };
    let v = plan_object(p, facts).decide(&Answers {
        now: Some(now),
        ..Answers::default()
    });
    let f = &v.fields[0];
    let warning = match &f.outcome {
        crate::Outcome::Failed(x) if x.mode == crate::Mode::Warn => Some(x.warning()),
        _ => None,
    };
    (f.label().into_owned(), warning)
}

#[test]
fn an_exception_in_force_turns_the_failure_into_a_warning_naming_it() {
    let text = format!(
        "{FILE}---\n{}",
        exception(
            "team-a",
            "['registry.example.com/team/legacy-*']",
            BANNED,
            "2026-12-08T00:00:00Z"
        )
    );
    let p = Policy::from_documents(&text).expect("policy");
    let img = "registry.example.com/team/legacy-api:1";
    let (l, w) = label(&p, "team-a", img, DEC1 + DAY);
    assert_eq!(l, "excepted:static_deny");
    let w = w.expect("a warning");
    assert!(
        w.contains("excepted by ImagePolicyException team-a/legacy until 2026-12-08T00:00:00Z"),
        "{w}"
    );
    // At expiry, at once: denied again.
    assert_eq!(
        label(&p, "team-a", img, DEC1 + 7 * DAY).0,
        "denied:static_deny"
    );
    // Another namespace, another image, another rule: not waived.
    assert_eq!(label(&p, "team-b", img, DEC1).0, "denied:static_deny");
    assert_eq!(
        label(&p, "team-a", "registry.example.com/team/other:1", DEC1).0,
        "unchanged"
    );
    assert_eq!(
        label(&p, "team-a", "registry.example.com/strict/x:1", DEC1).0,
        "denied:static_deny"
    );
    // No clock, no exception.
    let o = pod(img);
    let v = plan_object(
        &p,
        ObjectFacts {
            operation: Operation::Create,
            source: Source::Admission,
            kind: "Pod",
            namespace: Some("team-a"),
            object: Some(o),
            old_object: None,
            namespace_labels: None,
        },
    )
    .decide(&Answers::default());
    assert_eq!(v.fields[0].label(), "denied:static_deny");
}

#[test]
fn an_exact_digest_waives_that_digest_only() {
    let d = format!("sha256:{}", "a".repeat(64));
    let text = format!(
        "{FILE}---\n{}",
        exception(
            "team-a",
            &format!("['registry.example.com/team/legacy-api@{d}']"),
            BANNED,
            "2026-12-08T00:00:00Z"
        )
    );
    let p = Policy::from_documents(&text).expect("policy");
    let at = |img: &str| label(&p, "team-a", img, DEC1).0;
    assert_eq!(
        at(&format!("registry.example.com/team/legacy-api@{d}")),
        "excepted:static_deny"
    );
    let other = format!("sha256:{}", "b".repeat(64));
    assert_eq!(
        at(&format!("registry.example.com/team/legacy-api@{other}")),
        "denied:static_deny"
    );
    assert_eq!(
        at("registry.example.com/team/legacy-api:1"),
        "denied:static_deny"
    );
}

#[test]
fn a_team_rule_is_waived_by_naming_its_policy() {
    let text = format!(
        "{FILE}---\n{}",
        exception(
            "team-a",
            "['registry.example.com/team/old']",
            "[{policy: ImagePolicy/team-a/own, rule: no-old}]",
            "2026-12-20T00:00:00Z"
        )
    );
    let p = Policy::from_documents(&text).expect("policy (team rule default maxDuration 720h)");
    assert_eq!(
        label(&p, "team-a", "registry.example.com/team/old:1", DEC1).0,
        "excepted:static_deny"
    );
}

#[test]
fn the_policy_refuses_what_its_rules_do_not_allow() {
    let cases = [
        (
            "team-a",
            BANNED,
            "2026-12-31T00:00:00Z",
            "allows at most 10days",
        ),
        (
            "team-a",
            "[{policy: ClusterImagePolicy/supply-chain, rule: strict}]",
            "2026-12-02T00:00:00Z",
            "allows no exceptions",
        ),
        (
            "team-a",
            "[{policy: ClusterImagePolicy/supply-chain, rule: nope}]",
            "2026-12-02T00:00:00Z",
            "no rule \"nope\"",
        ),
        (
            "team-a",
            "[{policy: ClusterImagePolicy/other, rule: banned}]",
            "2026-12-02T00:00:00Z",
            "no rule \"banned\" of ClusterImagePolicy/other",
        ),
        (
            "team-a",
            "[{policy: ImagePolicy/team-b/own, rule: no-old}]",
            "2026-12-02T00:00:00Z",
            "another namespace's policy",
        ),
        (
            "team-a",
            "[{policy: Cluster/x, rule: banned}]",
            "2026-12-02T00:00:00Z",
            "is not ClusterImagePolicy/NAME",
        ),
        ("team-a", BANNED, "next week", "not an RFC 3339 time"),
    ];
    for (ns, rules, expires, want) in cases {
        let text = format!(
            "{FILE}---\n{}",
            exception(ns, "['registry.example.com/**']", rules, expires)
        );
        let err = Policy::from_documents(&text).unwrap_err().to_string();
        assert!(err.contains(want), "{rules} {expires}: {err}");
        assert!(err.contains("document starting at line 23"), "{err}");
    }
    let no_created = format!(
        "{FILE}---\n{}",
        exception(
            "team-a",
            "['registry.example.com/**']",
            BANNED,
            "2026-12-05T00:00:00Z"
        )
        .replace(", creationTimestamp: '2026-12-01T00:00:00Z'", "")
    );
    let err = Policy::from_documents(&no_created).unwrap_err().to_string();
    assert!(err.contains("needs metadata.creationTimestamp"), "{err}");
    // Loaded at a known instant, it counts as created then.
    assert!(Policy::from_documents_at(&no_created, Some(DEC1)).is_ok());
    assert!(Policy::from_documents_at(&no_created, Some(DEC1 - 20 * DAY)).is_err());
}

#[test]
fn malformed_exceptions_say_what_is_missing() {
    for (spec, want) in [
        (
            "images: []\n  rules: [{policy: ImagePolicy/p, rule: r}]\n  expires: '2026-12-01T00:00:00Z'\n  reason: x",
            "spec.images is empty",
        ),
        (
            "images: ['a/b']\n  rules: []\n  expires: '2026-12-01T00:00:00Z'\n  reason: x",
            "spec.rules is empty",
        ),
        (
            "images: ['a/b']\n  rules: [{policy: ImagePolicy/p, rule: r}]\n  expires: '2026-12-01T00:00:00Z'\n  reason: ' '",
            "spec.reason is empty",
        ),
        (
            "images: ['a/b']\n  rules: [{policy: ImagePolicy/p, rule: r}]\n  reason: x",
            "expires",
        ),
        (
            "images: ['a/b@sha256:12']\n  rules: [{policy: ImagePolicy/p, rule: r}]\n  expires: '2026-12-01T00:00:00Z'\n  reason: x",
            "spec.images",
        ),
    ] {
        let doc = format!(
            "apiVersion: sigil.dev/v1alpha1\nkind: ImagePolicyException\nmetadata: {{name: e, namespace: n}}\nspec:\n  {spec}\n"
        );
        let err = Exception::from_yaml(&doc).unwrap_err().to_string();
        assert!(err.contains(want), "{spec}: {err}");
    }
    let cluster_wide = "apiVersion: sigil.dev/v1alpha1\nkind: ImagePolicyException\nmetadata: {name: e}\nspec: {images: [a], rules: [{policy: ImagePolicy/p, rule: r}], expires: '2026-12-01T00:00:00Z', reason: x}\n";
    let err = Exception::from_yaml(cluster_wide).unwrap_err().to_string();
    assert!(err.contains("needs metadata.namespace"), "{err}");
}

#[test]
fn states_follow_the_clock() {
    let e = Exception::from_yaml(&exception("n", "[a]", BANNED, "2026-12-01T00:00:10Z"))
        .expect("exception");
    assert_eq!(e.state(true, DEC1 + 9), ExceptionState::Active);
    assert_eq!(e.state(true, DEC1 + 10), ExceptionState::Expired);
    assert_eq!(e.state(false, DEC1), ExceptionState::Invalid);
}
