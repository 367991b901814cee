//! The generated CEL, evaluated by the `cel` crate with CEL's strings
//! extension (what kube-apiserver's CEL offers for these functions) on Pods
//! as the API server would pass them, and compared image by image with
//! what `Policy::plan` decides: the backstop must refuse exactly what an
//! `enforce` rule would refuse without a registry, and nothing sigil admits.

use serde_json::{Value, json};

use super::*;
use crate::Policy;

const DIGEST: &str = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

const POLICY: &str = r#"apiVersion: sigil.dev/v1alpha1
kind: ImagePolicy
metadata: {name: cluster}
spec:
  mirrors:
    - {from: "registry.example.com/team", to: ["mirror.example.com/team", "backup.example.com/team"]}
    - {from: "registry.example.com/team/fallback", to: ["mirror.example.com/fb"], fallback: origin}
    - {from: "docker.io/library", to: ["hub-mirror.example.com/library"]}
  rules:
    - {name: team, match: ["registry.example.com/team/**"], mode: enforce}
    - {name: team-allow, match: ["registry.example.com/team/tools/*"], mode: enforce, action: allow}
    - {name: legacy, match: ["registry.example.com/legacy/**"], action: deny}
    - {name: legacy-warn, match: ["registry.example.com/legacy/soft/**"], action: deny, mode: warn}
    - {name: hub, match: ["docker.io/library/**"], mode: warn}
    - {name: local, match: ["127.0.0.1:*/**", "localhost:*/**"], mode: enforce}
    - {name: tagged, match: ["quay.io/acme/*:v*"], mode: enforce}
    - {name: any-tag, match: ["ghcr.io/acme/*:*", "ghcr.io/acme/*:*-*"], action: deny}
    - {name: acme, match: ["ghcr.io/acme/**"], mode: enforce}
    - {name: hub-deny, match: ["docker.io/evil/**"], action: deny}
    - {name: corp, match: ["*.corp.example.com/**"], mode: enforce}
    - {name: exact, match: ["gcr.io/x/y"], action: allow}
"#;

/// The shape of `sigil_testkit::policies::large` (the test kit depends on
/// this crate): `rules` rules over team prefixes, tags, path globs and
/// wildcard registries, `mirrors` mirrors, some with failover.
fn large(rules: usize, mirrors: usize) -> String {
    let mut out = String::from(
        "apiVersion: sigil.dev/v1alpha1\nkind: ImagePolicy\nmetadata: {name: cluster}\nspec:\n  mirrors:\n",
    );
    for m in 0..mirrors {
        let alt = if m % 5 == 4 {
            format!(", \"backup.example.com/team{m}\"], fallback: origin")
        } else {
            "]".to_owned()
        };
        out.push_str(&format!("    - {{from: \"registry.example.com/team{m}\", to: [\"mirror{}.example.com/team{m}\"{alt}}}\n", m % 3));
    }
    out.push_str("  rules:\n");
    for i in 0..rules {
        let (pattern, how) = match i % 10 {
            7 => (format!("quay.io/org{i}/app:v*"), "mode: enforce"),
            8 => (format!("ghcr.io/org{i}/*-svc"), "mode: enforce"),
            9 => (format!("*.ecr{i}.example.com/**"), "mode: enforce"),
            3 => (format!("registry.example.com/team{i}/**"), "action: deny"),
            5 => (format!("registry.example.com/team{i}/**"), "mode: warn"),
            6 => (format!("registry.example.com/team{i}/**"), "action: allow"),
            _ => (format!("registry.example.com/team{i}/**"), "mode: enforce"),
        };
        out.push_str(&format!(
            "    - {{name: r-{i}, match: [\"{pattern}\"], {how}}}\n"
        ));
    }
    out
}

fn pod(images: &[&str]) -> Value {
    let containers: Vec<Value> = images
        .iter()
        .enumerate()
        .map(|(i, im)| json!({"name": format!("c{i}"), "image": im}))
        .collect();
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
           "spec": {"containers": containers}})
}

/// The `verdicts` of the generated policy, evaluated as kube-apiserver
/// would ([`eval::verdicts`]), each joined by spaces.
fn verdicts(policy: &Policy, object: &Value, old: Option<&Value>) -> Vec<String> {
    let b = generate(
        policy,
        &Options {
            namespace: "sigil".to_owned(),
            node_namespace: None,
        },
    );
    eval::verdicts(&b.objects[0], object, old)
        .unwrap_or_else(|e| panic!("{e}"))
        .into_iter()
        .map(|l| l.join(" "))
        .collect()
}

/// What sigil decides of `image` without a registry, as a verdict.
fn expected(policy: &Policy, image: &str) -> String {
    match policy.plan(image) {
        Err(crate::denial::Denial::NoRule) => "refuse norule -".to_owned(),
        Err(e) => panic!("{image}: {e:?}"),
        Ok(plan) => {
            let kind = match plan.mode {
                Mode::Enforce => "refuse",
                Mode::Warn => "warn",
            };
            let at_origin_by_policy =
                plan.rewritten() && !plan.failover.as_ref().is_some_and(|f| f.fallback);
            match plan.step {
                crate::policy::Step::Deny => format!("{kind} deny {}", plan.rule),
                crate::policy::Step::Resolve if plan.target.digest().is_some() => {
                    format!("{kind} nomirror {}", plan.rule)
                }
                crate::policy::Step::Resolve => format!("{kind} nodigest {}", plan.rule),
                crate::policy::Step::Keep if at_origin_by_policy => {
                    format!("{kind} nomirror {}", plan.rule)
                }
                crate::policy::Step::Keep => "ok".to_owned(),
            }
        }
    }
}

/// [`decide`] (what the audit reports) in the CEL's words.
fn decided(policy: &Policy, image: &str) -> String {
    match decide(policy, image).unwrap_or_else(|| panic!("{image}: no verdict")) {
        Verdict::Ok => "ok".to_owned(),
        Verdict::Refuse { why, rule } => format!("refuse {} {rule}", why.as_str()),
        Verdict::Warn { why, rule } => format!("warn {} {rule}", why.as_str()),
    }
}

#[test]
fn the_cel_decides_each_image_as_the_policy_does() {
    let policy = Policy::from_documents_at(POLICY, None).unwrap();
    let images: Vec<String> = [
        "nginx",
        "nginx:1.27",
        "library/nginx:1",
        "docker.io/nginx",
        "docker.io/library/nginx:1",
        "index.docker.io/library/nginx:1",
        "hub-mirror.example.com/library/nginx:1",
        "registry.example.com/team/app",
        "registry.example.com/team/app:1",
        "registry.example.com/team/app:1@DIGEST",
        "registry.example.com/team/app@DIGEST",
        "mirror.example.com/team/app:1",
        "mirror.example.com/team/app:1@DIGEST",
        "backup.example.com/team/deep/app@DIGEST",
        "registry.example.com/team/fallback/app:1@DIGEST",
        "registry.example.com/team/fallback/app:1",
        "mirror.example.com/fb/app:1@DIGEST",
        "registry.example.com/team/tools/kubectl:1",
        "mirror.example.com/team/tools/kubectl:1",
        "registry.example.com/legacy/x@DIGEST",
        "registry.example.com/legacy/soft/x:1",
        "127.0.0.1:5000/shop/app:1.0",
        "127.0.0.1:5000/shop/app:1.0@DIGEST",
        "localhost:5000/app",
        "quay.io/acme/app:v2",
        "quay.io/acme/app:v2@DIGEST",
        "quay.io/acme/app:latest",
        "quay.io/acme/app@DIGEST",
        "quay.io/other/x:1",
        "gcr.io/a/b/c/d:1",
        // Docker Hub's every spelling, any case, is docker.io (finding 2).
        "registry-1.docker.io/library/nginx@DIGEST",
        "registry.hub.docker.com/library/nginx:1",
        "INDEX.DOCKER.IO/library/nginx:1@DIGEST",
        "Registry-1.Docker.IO/nginx",
        "registry-1.docker.io/evil/x@DIGEST",
        "evil/x:1",
        "docker.io/evil/x@DIGEST",
        // Upper case elsewhere is a registry of its own (no rule).
        "Registry.Example.com/team/app:1@DIGEST",
        "Team/app:1",
        // A digest alone has no tag for a tag pattern (finding 4).
        "ghcr.io/acme/app@DIGEST",
        "ghcr.io/acme/app:1@DIGEST",
        "ghcr.io/acme/app:1-2@DIGEST",
        "ghcr.io/acme/app",
        "ghcr.io/acme/deep/app@DIGEST",
        "a.corp.example.com/x/y:1@DIGEST",
        "a.corp.example.com/x/y:1",
        "gcr.io/x/y:7",
        "gcr.io/x/y/z:7",
    ]
    .iter()
    .map(|i| i.replace("DIGEST", DIGEST))
    .collect();
    let refs: Vec<&str> = images.iter().map(String::as_str).collect();
    let got = verdicts(&policy, &pod(&refs), None);
    assert_eq!(got.len(), images.len());
    for (image, verdict) in images.iter().zip(&got) {
        let (written, decided) = verdict.split_once(' ').unwrap();
        assert_eq!(written, image);
        assert_eq!(decided, expected(&policy, image), "{image}");
        assert_eq!(decided, self::decided(&policy, image), "{image}: decide()");
    }
}

#[test]
fn an_update_checks_only_the_images_it_adds() {
    let policy = Policy::from_documents_at(POLICY, None).unwrap();
    let old = pod(&["registry.example.com/team/app:1"]);
    let new = pod(&["registry.example.com/team/app:1", "quay.io/other/x:1"]);
    assert_eq!(
        verdicts(&policy, &new, Some(&old)),
        ["quay.io/other/x:1 refuse norule -"]
    );
    assert!(verdicts(&policy, &old, Some(&old)).is_empty());
}

#[test]
fn init_and_ephemeral_containers_and_image_volumes_are_checked() {
    let policy = Policy::from_documents_at(POLICY, None).unwrap();
    let object = json!({"spec": {
        "containers": [{"name": "a", "image": format!("mirror.example.com/team/app:1@{DIGEST}")}],
        "initContainers": [{"name": "i", "image": "registry.example.com/team/init:1"}],
        "ephemeralContainers": [{"name": "e", "image": "quay.io/other/debug:1"}],
        "volumes": [{"name": "v", "image": {"reference": "registry.example.com/legacy/data:1"}},
                    {"name": "e", "emptyDir": {}}]}});
    let got = verdicts(&policy, &object, None);
    assert_eq!(
        got,
        [
            format!("mirror.example.com/team/app:1@{DIGEST} ok"),
            "registry.example.com/team/init:1 refuse nodigest team".to_owned(),
            "quay.io/other/debug:1 refuse norule -".to_owned(),
            "registry.example.com/legacy/data:1 refuse deny legacy".to_owned(),
        ]
    );
}

#[test]
fn exemptions_and_what_is_left_to_the_webhook_are_the_policys() {
    let text = format!(
        "{POLICY}    - {{name: team-b, match: [\"registry.example.com/b/**\"], namespaceSelector: {{matchLabels: {{team: b}}}}}}\n  exemptNamespaces: [kube-system, playground]\n"
    );
    let policy = Policy::from_documents_at(&text, None).unwrap();
    let b = generate(
        &policy,
        &Options {
            namespace: "sigil".to_owned(),
            node_namespace: None,
        },
    );
    let exempt = &b.objects[0]["spec"]["matchConstraints"]["namespaceSelector"]["matchExpressions"]
        [0]["values"];
    assert_eq!(exempt, &json!(["kube-system", "sigil", "playground"]));
    // The node tier's namespace, when named, right after sigil's own.
    let with_node = generate(
        &policy,
        &Options {
            namespace: "sigil".to_owned(),
            node_namespace: Some("sigil-node".to_owned()),
        },
    );
    assert_eq!(
        with_node.objects[0]["spec"]["matchConstraints"]["namespaceSelector"]["matchExpressions"]
            [0]["values"],
        json!(["kube-system", "sigil", "sigil-node", "playground"])
    );
    assert!(
        b.left_to_webhook
            .iter()
            .any(|l| l.contains("team-b") && l.contains("namespaces by label")),
        "{:?}",
        b.left_to_webhook
    );
    // A rule limited by namespace labels never refuses here.
    let got = verdicts(&policy, &pod(&["registry.example.com/b/app:1"]), None);
    assert_eq!(got, ["registry.example.com/b/app:1 ok"]);
    let actions: Vec<&Value> = b
        .objects
        .iter()
        .filter(|o| o["kind"] == "ValidatingAdmissionPolicyBinding")
        .map(|o| &o["spec"]["validationActions"])
        .collect();
    assert_eq!(actions, [&json!(["Deny"]), &json!(["Warn"])]);
}

#[test]
fn regression_exempt_namespaces_the_api_server_would_refuse_are_refused_at_load() {
    let long = "a".repeat(64);
    for bad in [
        "legacy-*",
        "Team A",
        "Kube-system",
        "-x",
        "x-",
        "",
        long.as_str(),
    ] {
        let text = format!("{POLICY}  exemptNamespaces: [{bad:?}]\n");
        let e = Policy::from_documents_at(&text, None)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("exemptNamespaces") && e.contains("namespace's name"),
            "{bad:?}: {e}"
        );
    }
    let ok = format!(
        "{POLICY}  exemptNamespaces: [kube-system, team-a, {:?}]\n",
        "b".repeat(63)
    );
    Policy::from_documents_at(&ok, None).unwrap();
}

/// A policy grown to 500 rules and 50 mirrors: every expression stays far
/// inside the API server's limits (the first backstop nested one level per
/// pattern and copied the mirror check into every rule: 122 patterns hit
/// the recursion limit, 50 rules × 20 mirrors the length limit), and the
/// CEL still decides each image as the policy does.
#[test]
fn regression_a_large_policy_stays_inside_the_api_servers_limits_and_decides_as_sigil() {
    let text = large(500, 50);
    let policy = Policy::from_documents_at(&text, None).unwrap();
    let b = generate(
        &policy,
        &Options {
            namespace: "sigil".to_owned(),
            node_namespace: None,
        },
    );
    assert!(b.unfit.is_empty(), "{:?}", b.unfit);
    let longest = expr::variables(&policy)
        .iter()
        .map(|(_, e)| e.chars().count())
        .max()
        .unwrap();
    assert!(longest < MAX_EXPRESSION * 3 / 4, "{longest}");
    let mut images = Vec::new();
    for i in [0usize, 1, 3, 4, 5, 6, 7, 8, 9, 49, 51, 123, 499] {
        for form in [
            format!("registry.example.com/team{i}/app:1"),
            format!("registry.example.com/team{i}/app:1@{DIGEST}"),
            format!("mirror{}.example.com/team{i}/app:1@{DIGEST}", i % 3),
            format!("mirror{}.example.com/team{i}/app:1", i % 3),
            format!("backup.example.com/team{i}/app@{DIGEST}"),
            format!("quay.io/org{i}/app:v1@{DIGEST}"),
            format!("quay.io/org{i}/app@{DIGEST}"),
            format!("quay.io/org{i}/app:1"),
            format!("ghcr.io/org{i}/a-svc@{DIGEST}"),
            format!("ghcr.io/org{i}/a-svc/x@{DIGEST}"),
            format!("x.ecr{i}.example.com/a/b:1@{DIGEST}"),
            format!("x.ecr{i}.example.com/a/b:1"),
        ] {
            images.push(form);
        }
    }
    let refs: Vec<&str> = images.iter().map(String::as_str).collect();
    let got = verdicts(&policy, &pod(&refs), None);
    for (image, verdict) in images.iter().zip(&got) {
        let (_, decided) = verdict.split_once(' ').unwrap();
        assert_eq!(decided, expected(&policy, image), "{image}");
        assert_eq!(decided, self::decided(&policy, image), "{image}: decide()");
    }
}

#[test]
fn regression_a_policy_past_the_cost_envelope_is_unfit_and_says_why() {
    let mut text = String::from(
        "apiVersion: sigil.dev/v1alpha1\nkind: ImagePolicy\nmetadata: {name: c}\nspec:\n  rules:\n",
    );
    for i in 0..=MAX_CROWD {
        text.push_str(&format!(
            "    - {{name: w{i}, match: [\"*.r{i}.example.com/**\"]}}\n"
        ));
    }
    let policy = Policy::from_documents_at(&text, None).unwrap();
    assert_eq!(crowd(&policy), MAX_CROWD + 1);
    let b = generate(
        &policy,
        &Options {
            namespace: "sigil".to_owned(),
            node_namespace: None,
        },
    );
    assert!(
        b.unfit
            .iter()
            .any(|u| u.contains("tested against 101 patterns")),
        "{:?}",
        b.unfit
    );
    // Patterns that start with their registry are looked up, not counted.
    assert_eq!(
        crowd(&Policy::from_documents_at(&large(500, 50), None).unwrap()),
        51
    );
}
