use super::*;
use crate::ObjectRef;
use crate::walker::summarize_value;

const POLICY: &str = "apiVersion: sigil.dev/v1alpha1\nkind: ImagePolicy\nspec:\n  pin: {scope: pods}\n  mirrors: [{from: docker.io, to: m.local/hub}]\n  rules:\n  - {name: all, match: ['**'], mode: enforce}\n  - {name: bad, match: ['docker.io/library/bad'], action: deny}\n  exemptNamespaces: [kube-system]\n";

fn policy() -> Policy {
    Policy::from_yaml(POLICY).expect("policy")
}

fn deployment(image: &str) -> ObjectSummary {
    summarize_value(
        &serde_json::json!({"kind": "Deployment", "metadata": {"name": "d"},
        "spec": {"template": {"spec": {"containers": [{"name": "c", "image": image}]}}}}),
    )
}

fn facts<'a>(op: Operation, ns: Option<&'a str>, obj: &ObjectSummary) -> ObjectFacts<'a> {
    ObjectFacts {
        operation: op,
        source: Source::Admission,
        kind: "Deployment",
        namespace: ns,
        object: Some(obj.clone()),
        old_object: None,
        namespace_labels: None,
    }
}

fn answers(target: &str, r: Result<Digest, ResolveFailure>) -> Answers {
    let mut a = Answers::default();
    a.digests.insert(Reference::parse(target).expect("ref"), r);
    a
}

#[test]
fn skip_rules_come_before_the_images() {
    let p = policy();
    let o = deployment("nginx:1");
    for (op, ns, skip) in [
        (Operation::Delete, Some("shop"), Some(Skip::Operation)),
        (Operation::Connect, Some("shop"), Some(Skip::Operation)),
        (
            Operation::Create,
            Some("kube-system"),
            Some(Skip::ExemptNamespace),
        ),
        (Operation::Create, Some("shop"), None),
        (Operation::Create, None, None),
    ] {
        let plan = plan_object(&p, facts(op, ns, &o));
        assert_eq!(
            plan.decide(&Answers::default()).skipped,
            skip,
            "{op:?} {ns:?}"
        );
    }
    let mut dying = deployment("nginx:1");
    dying.terminating = true;
    let f = ObjectFacts {
        old_object: Some(&dying),
        ..facts(Operation::Update, Some("shop"), &o)
    };
    assert_eq!(
        plan_object(&p, f).decide(&Answers::default()).skipped,
        Some(Skip::Terminating)
    );
}

/// Regression: `sigil pin` read `metadata.namespace` where the webhook
/// read the request's namespace; one rule now serves both.
#[test]
fn manifest_exemption_uses_the_one_namespace_rule() {
    assert_eq!(
        effective_namespace(Some("a"), Some("b"), Some("default")),
        Some("a")
    );
    assert_eq!(
        effective_namespace(Some(""), Some("b"), Some("default")),
        Some("b")
    );
    assert_eq!(
        effective_namespace(None, None, Some("default")),
        Some("default")
    );
    assert_eq!(effective_namespace(None, Some(""), None), None);
}

#[test]
fn update_of_an_image_already_running_only_warns_when_the_lookup_fails() {
    let p = policy();
    let o = deployment("nginx:1");
    let failure = ResolveFailure::Unreachable {
        detail: "down".into(),
    };
    let a = answers("m.local/hub/library/nginx:1", Err(failure));
    let f = ObjectFacts {
        old_object: Some(&o),
        ..facts(Operation::Update, Some("shop"), &o)
    };
    let v = plan_object(&p, f).decide(&a);
    assert_eq!(v.fields[0].label(), "warned:unresolved");
    let v = plan_object(&p, facts(Operation::Create, Some("shop"), &o)).decide(&a);
    assert_eq!(v.fields[0].label(), "denied:unresolved");
    assert!(v.denied());
    // A static deny blocks even an image the object already ran.
    let bad = deployment("bad:1");
    let f = ObjectFacts {
        old_object: Some(&bad),
        ..facts(Operation::Update, Some("shop"), &bad)
    };
    let v = plan_object(&p, f).decide(&Answers::default());
    assert_eq!(v.fields[0].label(), "denied:static_deny");
}

#[test]
fn scope_pods_checks_workloads_but_manifests_are_always_pinned() {
    let p = policy();
    let o = deployment("nginx:1");
    let a = answers(
        "m.local/hub/library/nginx:1",
        Ok(Digest::from_sha256(&[1; 32])),
    );
    let plan = plan_object(&p, facts(Operation::Create, Some("shop"), &o));
    assert_eq!(plan.lookups().len(), 1);
    let v = plan.decide(&a);
    assert!(!v.patchable);
    assert_eq!(v.fields[0].label(), "pinned");
    let f = ObjectFacts {
        source: Source::Manifest,
        ..facts(Operation::Create, Some("shop"), &o)
    };
    assert!(plan_object(&p, f).decide(&a).patchable);
}

#[test]
fn offline_reports_lookups_and_still_rewrites() {
    let p = policy();
    let o = deployment("nginx:1");
    let a = Answers {
        offline: true,
        ..Answers::default()
    };
    let v = plan_object(&p, facts(Operation::Create, None, &o)).decide(&a);
    assert_eq!(v.fields[0].label(), "needs-lookup");
    assert_eq!(
        v.fields[0].outcome,
        Outcome::NeedsLookup {
            rule: "all".into(),
            new: Some("m.local/hub/library/nginx:1".into())
        }
    );
}

/// A platform policy in warn mode plus three teams' namespaced policies.
const MULTI: &str = r#"apiVersion: sigil.dev/v1alpha1
kind: ClusterImagePolicy
metadata: {name: platform}
spec:
  rules:
    - {name: all, match: ["**"], mode: warn}
    - {name: no-latest-base, match: ["registry.example.com/base/**"], action: deny}
---
apiVersion: sigil.dev/v1alpha1
kind: ImagePolicy
metadata: {name: allow-list, namespace: team-a}
spec:
  defaultAction: deny
  rules:
    - {name: ours, match: ["registry.example.com/team-a/**"]}
    - {name: no-debug, match: ["registry.example.com/team-a/debug"], action: deny}
---
apiVersion: sigil.dev/v1alpha1
kind: ImagePolicy
metadata: {name: signed-only, namespace: team-b}
spec:
  rules:
    - name: team-keys
      match: ["**"]
      verify:
        - {name: team, cosign: {key: "-----BEGIN PUBLIC KEY-----\nAA==\n-----END PUBLIC KEY-----"}}
---
apiVersion: sigil.dev/v1alpha1
kind: ImagePolicy
metadata: {name: relaxed, namespace: team-c}
spec:
  mode: warn
  rules:
    - {name: no-tools, match: ["registry.example.com/tools/**"], action: deny}
"#;

const D: &str = "sha256:1111111111111111111111111111111111111111111111111111111111111111";

fn decide_in(ns: &str, image: &str, answers: &Answers) -> FieldVerdict {
    let p = Policy::from_documents(MULTI).expect("policy");
    let pod = summarize_value(
        &serde_json::json!({"kind": "Pod", "metadata": {"name": "p"},
        "spec": {"containers": [{"name": "c", "image": image}]}}),
    );
    let f = ObjectFacts {
        kind: "Pod",
        ..facts(Operation::Create, Some(ns), &pod)
    };
    let plan = plan_object(&p, f);
    plan.decide(answers).fields.remove(0)
}

#[test]
fn a_namespaced_policy_refuses_what_the_cluster_admits_and_names_itself() {
    let pinned = format!("registry.example.com/team-a/debug@{D}");
    // Cluster: admitted (warn rule, nothing to do). team-a: a deny rule.
    let v = decide_in("team-a", &pinned, &Answers::default());
    let Outcome::Failed(f) = &v.outcome else {
        panic!("{v:?}")
    };
    assert_eq!(f.mode, Mode::Enforce);
    let msg = f.message(&ObjectRef::new("Pod", "team-a", Some("p"), None));
    assert!(
        msg.contains("is denied by ImagePolicy team-a/allow-list, rule no-debug"),
        "{msg}"
    );
    assert_eq!(v.label(), "denied:static_deny");
    // The allow-list: images no rule of it matches are refused there...
    let v = decide_in(
        "team-a",
        &format!("registry.example.com/other/x@{D}"),
        &Answers::default(),
    );
    let Outcome::Failed(f) = &v.outcome else {
        panic!("{v:?}")
    };
    assert!(
        f.denial
            .why()
            .contains("not on the allow-list of ImagePolicy team-a/allow-list")
    );
    // ...and admitted in a namespace without team policies.
    let v = decide_in(
        "team-z",
        &format!("registry.example.com/other/x@{D}"),
        &Answers::default(),
    );
    assert_eq!(v.label(), "unchanged");
    // Its own images pass.
    let v = decide_in(
        "team-a",
        &format!("registry.example.com/team-a/app@{D}"),
        &Answers::default(),
    );
    assert_eq!(v.label(), "unchanged");
}

#[test]
fn a_namespaced_policy_cannot_loosen_and_enforce_makes_cluster_warnings_block() {
    // The cluster denies base images everywhere; team-a's rule for its own
    // registry cannot admit them (AND).
    let v = decide_in(
        "team-a",
        &format!("registry.example.com/base/x@{D}"),
        &Answers::default(),
    );
    assert_eq!(v.label(), "denied:static_deny");
    // A cluster warn (unresolvable) blocks in a namespace whose policy enforces...
    let gone = ResolveFailure::NotFound {
        detail: "manifest unknown".into(),
    };
    let a = answers("registry.example.com/team-a/app:v1", Err(gone.clone()));
    let v = decide_in("team-a", "registry.example.com/team-a/app:v1", &a);
    assert_eq!(v.label(), "denied:unresolved");
    // ...and stays a warning elsewhere.
    let a = answers("registry.example.com/team-z/app:v1", Err(gone));
    let v = decide_in("team-z", "registry.example.com/team-z/app:v1", &a);
    assert_eq!(v.label(), "warned:unresolved");
    // A warn-mode team policy only warns.
    let v = decide_in(
        "team-c",
        &format!("registry.example.com/tools/x@{D}"),
        &Answers::default(),
    );
    assert_eq!(v.label(), "warned:static_deny");
}

#[test]
fn a_team_key_is_checked_on_the_digest_that_will_run() {
    let p = Policy::from_documents(MULTI).expect("policy");
    let img = format!("registry.example.com/app@{D}");
    let pod = summarize_value(
        &serde_json::json!({"kind": "Pod", "metadata": {"name": "p"},
        "spec": {"containers": [{"name": "c", "image": img}]}}),
    );
    let plan = plan_object(
        &p,
        ObjectFacts {
            kind: "Pod",
            ..facts(Operation::Create, Some("team-b"), &pod)
        },
    );
    let jobs = plan.verifications(&AnswerMap::default());
    assert_eq!(jobs.len(), 1);
    assert_eq!(
        &*jobs[0].key.rule,
        "ImagePolicy team-b/signed-only, rule team-keys"
    );
    assert_eq!(jobs[0].key.digest.as_str(), D);
    // Signed by the cluster's keys only: the team's verifier fails → denied.
    let mut a = Answers::default();
    let report = crate::verify::VerificationReport {
        results: vec![(
            "team".into(),
            crate::verify::VerifierOutcome::failed(
                1,
                vec![crate::verify::SignatureProblem::WrongKey],
            ),
        )],
        fetch_failure: None,
        threshold: 1,
        required: Vec::new(),
        attestations: Vec::new(),
        found: Vec::new(),
        signed_at: Default::default(),
        platforms: None,
    };
    a.reports.insert(jobs[0].key.clone(), Arc::new(report));
    let v = plan.decide(&a).fields.remove(0);
    let Outcome::Failed(f) = &v.outcome else {
        panic!("{v:?}")
    };
    assert!(
        f.denial
            .why()
            .contains("required by ImagePolicy team-b/signed-only, rule team-keys")
            && f.denial.why().contains("team: wrong key"),
        "{}",
        f.denial.why()
    );
    // The same image in another namespace needs no team key.
    let v = decide_in("team-z", &img, &Answers::default());
    assert_eq!(v.label(), "unchanged");
}

#[test]
fn namespaced_policies_may_only_tighten() {
    for (field, yaml) in [
        ("mirrors", "mirrors: [{from: docker.io, to: m.local/hub}]"),
        (
            "registries",
            "registries: [{host: r.local, insecure: true}]",
        ),
        ("exemptNamespaces", "exemptNamespaces: [team-a]"),
        ("pin", "pin: {scope: pods}"),
    ] {
        let text = format!(
            "apiVersion: sigil.dev/v1alpha1\nkind: ClusterImagePolicy\nmetadata: {{name: p}}\nspec:\n  rules: [{{name: all, match: ['**']}}]\n---\napiVersion: sigil.dev/v1alpha1\nkind: ImagePolicy\nmetadata: {{name: t, namespace: team-a}}\nspec:\n  {yaml}\n"
        );
        let err = Policy::from_documents(&text).unwrap_err().to_string();
        assert!(
            err.contains(&format!(
                "spec.{field} is not allowed in a namespaced ImagePolicy"
            )) && err.contains("may only tighten"),
            "{field}: {err}"
        );
    }
    // Two cluster policies combine; a rule name used twice is a conflict.
    let two = "apiVersion: sigil.dev/v1alpha1\nkind: ClusterImagePolicy\nmetadata: {name: a}\nspec:\n  rules: [{name: all, match: ['**']}]\n---\napiVersion: sigil.dev/v1alpha1\nkind: ClusterImagePolicy\nmetadata: {name: b}\nspec:\n  rules: [{name: deny-bad, match: ['docker.io/library/bad'], action: deny}]\n";
    let p = Policy::from_documents(two).expect("two policies");
    assert_eq!(p.rules.len(), 2);
    assert_eq!(p.plan("bad:1").expect("plan").step, Step::Deny);
    assert_eq!(p.plan("nginx:1").expect("plan").step, Step::Resolve);
    let dup = two
        .replace("deny-bad", "all")
        .replace("docker.io/library/bad", "docker.io/x");
    let err = Policy::from_documents(&dup).unwrap_err().to_string();
    assert!(
        err.contains("policies \"a\" and \"b\" conflict: both define rule \"all\""),
        "{err}"
    );
    let tie = two.replace("docker.io/library/bad", "**");
    let err = Policy::from_documents(&tie).unwrap_err().to_string();
    assert!(err.contains("equally specific"), "{err}");
    // Errors in a later document name its line in the file.
    let bad = format!(
        "{two}---\napiVersion: sigil.dev/v1alpha1\nkind: ClusterImagePolicy\nmetadata: {{name: c}}\nspec:\n  rules: [{{name: x, match: ['Bad Pattern']}}]\n"
    );
    let err = Policy::from_documents(&bad).unwrap_err().to_string();
    assert!(err.starts_with("line 17:"), "{err}");
}

/// Regression: offline decisions passed a team policy's signature
/// requirement silently; they now report that a lookup is needed.
#[test]
fn offline_decisions_report_a_team_key_as_needing_a_lookup() {
    let offline = Answers {
        offline: true,
        ..Answers::default()
    };
    let v = decide_in("team-b", &format!("registry.example.com/app@{D}"), &offline);
    assert_eq!(v.label(), "needs-lookup", "{v:?}");
    let v = decide_in("team-z", &format!("registry.example.com/app@{D}"), &offline);
    assert_eq!(v.label(), "unchanged");
}

/// One object may not fan out to more lookups than the limit: every field
/// that needed one is denied naming the limit, in enforce as in warn mode,
/// and nothing is left to look up; at the limit nothing changes.
#[test]
fn an_object_needing_more_lookups_than_the_limit_is_denied_unlooked_up() {
    let p = policy();
    let containers: Vec<serde_json::Value> = (0..5)
        .map(|i| serde_json::json!({"name": format!("c{i}"), "image": format!("nginx:{i}")}))
        .collect();
    let o = summarize_value(
        &serde_json::json!({"kind": "Deployment", "metadata": {"name": "d"},
        "spec": {"template": {"spec": {"containers": containers}}}}),
    );
    let at_limit = plan_object(&p, facts(Operation::Create, Some("shop"), &o)).limit_lookups(5);
    assert_eq!(at_limit.lookups().len(), 5);
    let over = plan_object(&p, facts(Operation::Create, Some("shop"), &o)).limit_lookups(4);
    assert!(over.lookups().is_empty(), "nothing is looked up");
    let v = over.decide(&Answers::default());
    assert!(v.denied());
    for f in &v.fields {
        let Outcome::Failed(finding) = &f.outcome else {
            panic!("{:?}", f.outcome)
        };
        assert_eq!(finding.mode, Mode::Enforce);
        assert_eq!(
            finding.denial,
            Denial::TooManyLookups {
                lookups: 5,
                limit: 4
            }
        );
        assert!(finding.denial.why().contains("limit of 4"));
    }
}

/// Found by the boundaries review: `cosign: {key: /dev/zero}` in one
/// namespace's ImagePolicy made every replica read without end. A team
/// names keys and certificates inline or by keyRef; any file path — in a
/// verifier or an inline attestor — is refused at load, naming the field,
/// without the file ever being opened (so the error says nothing about
/// sigil's filesystem either).
#[test]
fn a_team_policy_naming_a_file_is_refused_before_any_file_is_read() {
    let pem = "-----BEGIN PUBLIC KEY-----\\nMFkw\\n-----END PUBLIC KEY-----";
    for (field, verifier) in [
        (
            "cosign.key",
            "{name: v, cosign: {key: /dev/zero}}".to_owned(),
        ),
        (
            "cosign.trustedRoot",
            "{name: v, cosign: {keyless: {issuer: i, subject: s}, trustedRoot: /etc/shadow}}"
                .to_owned(),
        ),
        (
            "notation.trustRoots",
            "{name: v, notation: {trustRoots: [/var/run/secrets/x]}}".to_owned(),
        ),
        (
            "notation.tsaRoots",
            format!("{{name: v, notation: {{trustRoots: [\"{pem}\"], tsaRoots: [/dev/zero]}}}}"),
        ),
    ] {
        for rule in [
            format!("{{name: r, match: ['**'], verify: [{verifier}]}}"),
            format!(
                "{{name: r, match: ['**'], attestations: [{{name: a, predicateType: slsaprovenance1, attestors: [{verifier}]}}]}}"
            ),
        ] {
            let text = format!(
                "apiVersion: sigil.dev/v1alpha1\nkind: ClusterImagePolicy\nmetadata: {{name: p}}\nspec:\n  rules: [{{name: all, match: ['**']}}]\n---\napiVersion: sigil.dev/v1alpha1\nkind: ImagePolicy\nmetadata: {{name: t, namespace: team-a}}\nspec:\n  rules: [{rule}]\n"
            );
            let err = Policy::from_documents(&text).unwrap_err().to_string();
            assert!(
                err.contains(&format!("{field} names a file"))
                    && err.contains("inline (PEM) or by keyRef"),
                "{field}: {err}"
            );
        }
    }
}
