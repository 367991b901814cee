//! The generated CEL, evaluated by the `cel` crate with CEL's strings
//! extension (what kube-apiserver's CEL offers for these functions) on Pods
//! as the API server would pass them, and compared image by image with
//! what `Policy::plan` decides: the backstop must refuse exactly what an
//! `enforce` rule would refuse without a registry, and nothing sigil admits.

use std::sync::Arc;

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
"#;

fn pod(images: &[&str]) -> Value {
    let containers: Vec<Value> = images
        .iter()
        .enumerate()
        .map(|(i, im)| json!({"name": format!("c{i}"), "image": im}))
        .collect();
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
           "spec": {"containers": containers}})
}

/// The `verdicts` variable, evaluated as kube-apiserver would: each
/// variable in order, with `object`, `oldObject` and the ones before it.
fn verdicts(policy: &Policy, object: &Value, old: Option<&Value>) -> Vec<String> {
    let mut env = cel::Env::stdlib();
    env.add_extension(cel::extensions::strings).unwrap();
    let env = Arc::new(env);
    let mut computed = serde_json::Map::new();
    for (name, expr) in variables(policy) {
        let program = env
            .compile(&expr)
            .unwrap_or_else(|e| panic!("{name}: {e:?}\n{expr}"));
        let mut ctx = cel::Context::with_env(env.clone());
        ctx.add_variable_from_value("object", cel::to_value(object).unwrap());
        ctx.add_variable_from_value(
            "oldObject",
            cel::to_value(old.unwrap_or(&Value::Null)).unwrap(),
        );
        ctx.add_variable_from_value(
            "variables",
            cel::to_value(Value::Object(computed.clone())).unwrap(),
        );
        let v = program
            .execute(&ctx)
            .unwrap_or_else(|e| panic!("{name}: {e:?}\n{expr}"));
        computed.insert(name, json_of(&v));
    }
    let lists: Vec<Vec<String>> = serde_json::from_value(computed["verdicts"].clone()).unwrap();
    lists.into_iter().map(|l| l.join(" ")).collect()
}

/// The variables' values (lists of strings) as JSON, to feed the next one.
fn json_of(v: &cel::Value) -> Value {
    match v {
        cel::Value::List(l) => Value::Array(l.iter().map(json_of).collect()),
        cel::Value::String(s) => Value::String(s.to_string()),
        cel::Value::Bool(b) => Value::Bool(*b),
        cel::Value::Null => Value::Null,
        other => panic!("a variable of an unexpected type: {other:?}"),
    }
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
        },
    );
    let exempt = &b.objects[0]["spec"]["matchConstraints"]["namespaceSelector"]["matchExpressions"]
        [0]["values"];
    assert_eq!(exempt, &json!(["kube-system", "sigil", "playground"]));
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
