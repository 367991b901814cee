//! What sigil's ServiceAccount may do, as shipped: every grant the rendered
//! Roles and ClusterRoles give it through their bindings, one line each
//! (`scope verb group/resource[/name]`), held against the written
//! expectation in `tests/fixtures/rbac/` — so a new grant is a reviewed
//! change of that file, never a side effect (docs/security.md says what each
//! line lets a stolen token do). One file per shipped configuration.

use std::collections::BTreeSet;
use std::path::PathBuf;

use serde_json::Value;

const NS: &str = "sigil-system";

/// The grants `objects` give ServiceAccount `sigil-system/sigil`.
fn grants(objects: &[Value]) -> BTreeSet<String> {
    grants_of(objects, NS, "sigil")
}

/// The grants `objects` give ServiceAccount `sa_ns/sa`.
fn grants_of(objects: &[Value], sa_ns: &str, sa: &str) -> BTreeSet<String> {
    let role = |kind: &str, name: &str, ns: Option<&str>| {
        objects.iter().find(|o| {
            o["kind"] == kind
                && o["metadata"]["name"] == name
                && (kind == "ClusterRole" || o["metadata"]["namespace"].as_str() == ns)
        })
    };
    let mut out = BTreeSet::new();
    for b in objects {
        let (scope, ns) = match b["kind"].as_str() {
            Some("ClusterRoleBinding") => ("cluster".to_owned(), None),
            Some("RoleBinding") => {
                let ns = b["metadata"]["namespace"].as_str().unwrap_or_default();
                (format!("namespace/{ns}"), Some(ns))
            }
            _ => continue,
        };
        let to_sigil =
            b["subjects"].as_array().into_iter().flatten().any(|s| {
                s["kind"] == "ServiceAccount" && s["name"] == sa && s["namespace"] == sa_ns
            });
        if !to_sigil {
            continue;
        }
        let kind = b["roleRef"]["kind"].as_str().unwrap();
        let name = b["roleRef"]["name"].as_str().unwrap();
        let r = role(kind, name, ns)
            .unwrap_or_else(|| panic!("{scope}: binding to missing {kind} {name}"));
        for rule in r["rules"].as_array().into_iter().flatten() {
            out.extend(rule_lines(rule).into_iter().map(|l| format!("{scope} {l}")));
        }
    }
    out
}

/// One RBAC rule as lines `verb group/resource[/name]` (`core` for the
/// core group), one per combination it grants.
pub(crate) fn rule_lines(rule: &Value) -> Vec<String> {
    let strs = |f: &str| -> Vec<String> {
        rule[f]
            .as_array()
            .into_iter()
            .flatten()
            .map(|v| v.as_str().unwrap().to_owned())
            .collect()
    };
    let names = strs("resourceNames");
    let mut out = Vec::new();
    for g in strs("apiGroups") {
        let g = if g.is_empty() { "core".to_owned() } else { g };
        for res in strs("resources") {
            for v in strs("verbs") {
                if names.is_empty() {
                    out.push(format!("{v} {g}/{res}"));
                }
                out.extend(names.iter().map(|n| format!("{v} {g}/{res}/{n}")));
            }
        }
    }
    out
}

fn expected(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/rbac")
        .join(format!("{name}.txt"))
}

/// Compares with the written expectation (`SIGIL_BLESS=1` writes it).
fn assert_grants(name: &str, objects: &[Value]) {
    assert_lines(name, grants(objects));
}

fn assert_lines(name: &str, got: BTreeSet<String>) {
    let got: Vec<String> = got.into_iter().collect();
    let path = expected(name);
    if std::env::var_os("SIGIL_BLESS").is_some() {
        std::fs::write(&path, got.join("\n") + "\n").unwrap();
    }
    let want = std::fs::read_to_string(&path).unwrap_or_default();
    let want: Vec<&str> = want
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
        .collect();
    assert_eq!(
        got,
        want,
        "{name}: sigil's ServiceAccount may do other than {} says; review the change and the docs/security.md table",
        path.display()
    );
}

/// Every grant, nothing more, with nothing that reads or writes what the
/// ServiceAccount does not need: no wildcard, no delete of anything but
/// its own reports, no Secret create, no cluster-wide Secret read by default.
fn assert_least(name: &str, objects: &[Value]) {
    for g in grants(objects) {
        assert!(!g.contains('*'), "{name}: wildcard grant {g}");
        assert!(
            !g.starts_with("cluster ")
                || !g.contains("core/secrets")
                || name.contains("pull-secrets"),
            "{name}: cluster-wide Secret access {g}"
        );
        assert!(!g.contains("create core/secrets"), "{name}: {g}");
    }
}

#[test]
fn the_base_grants_exactly_what_it_says() {
    let objects = crate::deploy::render("base");
    assert_least("base", &objects);
    assert_grants("base", &objects);
}

#[test]
fn the_register_overlay_grants_exactly_what_it_says() {
    let objects = crate::deploy::render("overlays/register");
    assert_least("register", &objects);
    assert_grants("register", &objects);
}

#[test]
fn the_cert_manager_overlay_grants_exactly_what_it_says() {
    let objects = crate::deploy::render("overlays/cert-manager");
    assert_least("cert-manager", &objects);
    assert_grants("cert-manager", &objects);
}

/// The pull-secrets component, composed as `overlays/pull-secrets` ships it.
#[test]
fn the_pull_secrets_component_adds_only_its_read_grant() {
    let objects = crate::deploy::render("overlays/pull-secrets");
    let d = objects.iter().find(|o| o["kind"] == "Deployment").unwrap();
    let env = crate::deploy::env_of(d);
    assert_eq!(env["SIGIL_PULL_SECRETS"], "true");
    assert_least("base-pull-secrets", &objects);
    assert_grants("base-pull-secrets", &objects);
}

/// The backstop component, composed as `overlays/backstop` ships it: its
/// grant is the backstop's objects by name (and create), nothing else.
#[test]
fn the_backstop_component_adds_only_the_backstops_objects() {
    let objects = crate::deploy::render("overlays/backstop");
    let d = objects.iter().find(|o| o["kind"] == "Deployment").unwrap();
    let env = crate::deploy::env_of(d);
    assert_eq!(env["SIGIL_REGISTER_BACKSTOP"], "true");
    assert_least("backstop", &objects);
    assert_grants("backstop", &objects);
}

/// The node component: sigil's own grants are the base's; the node
/// DaemonSet's ServiceAccount may read the policy ConfigMap and list
/// ClusterImagePolicies, nothing else.
#[test]
fn the_node_component_grants_only_reading_the_policy() {
    let objects = crate::deploy::render("overlays/node");
    assert_least("base", &objects);
    assert_grants("base", &objects);
    assert_lines("node-sa", grants_of(&objects, "sigil-node", "sigil-node"));
}

/// The component's `policy-rbac.yaml` is what `sigil node rbac` renders
/// from the base's policy, byte for byte: regenerated, not hand-edited.
#[test]
fn the_node_components_policy_reads_are_rendered_from_the_base_policy() {
    let deploy = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/kustomize");
    let out = std::process::Command::new(crate::support::sigil::bin())
        .args(["node", "rbac", "--policy"])
        .arg(deploy.join("base/policy.yaml"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let shipped = std::fs::read_to_string(deploy.join("components/node/policy-rbac.yaml")).unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        shipped,
        "regenerate: sigil node rbac --policy deploy/kustomize/base/policy.yaml > deploy/kustomize/components/node/policy-rbac.yaml"
    );
}

/// A policy naming keys by `keyRef` (a ConfigMap in sigil's namespace, a
/// Secret in another, a notation root; a team's Secret, which nodes never
/// enforce) and one more object for a ClusterImagePolicy applied later:
/// the chart and `sigil node rbac` give the node's ServiceAccount the same
/// reads — each named object, by name, and nothing else.
#[test]
fn the_chart_and_sigil_node_rbac_give_the_node_the_same_named_reads() {
    let dir = tempfile::tempdir().unwrap();
    let policy = dir.path().join("policy.yaml");
    std::fs::write(&policy, "apiVersion: sigil.dev/v1alpha1\nkind: ImagePolicy\nmetadata: {name: cluster}\nspec:\n  rules:\n    - name: a\n      match: [\"r.example.com/a/**\"]\n      verify:\n        - {name: k, cosign: {keyRef: {configMap: keys, key: a.pub}}}\n        - {name: s, cosign: {keyRef: {secret: vendor, key: v.pub, namespace: vendors}}}\n    - name: b\n      match: [\"r.example.com/b/**\"]\n      verify: [{name: n, notation: {trustRootRefs: [{configMap: ca, key: ca.crt}]}}]\n---\napiVersion: sigil.dev/v1alpha1\nkind: ImagePolicy\nmetadata: {name: team, namespace: team-a}\nspec:\n  rules: [{name: t, match: [\"r.example.com/t/**\"], verify: [{name: k, cosign: {keyRef: {secret: team-key, key: k}}}]}]\n").unwrap();
    let file = format!("@policy={}", policy.display());
    let chart =
        crate::helm::rendered(&["node.enabled=true", &file, "node.keyRefs[0].secret=later"]);
    let out = std::process::Command::new(crate::support::sigil::bin())
        .args(["node", "rbac", "--allow", "secret/later", "--policy"])
        .arg(&policy)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let printed = crate::deploy::objects(&String::from_utf8_lossy(&out.stdout));
    let from_chart = grants_of(&chart, "sigil-node", "sigil-node");
    let from_sigil = grants_of(&printed, "sigil-node", "sigil-node");
    let expected: BTreeSet<String> = [
        "namespace/sigil-system {v} core/configmaps/sigil-policy",
        "namespace/sigil-system {v} core/configmaps/keys",
        "namespace/sigil-system {v} core/configmaps/ca",
        "namespace/sigil-system {v} core/secrets/later",
        "namespace/vendors {v} core/secrets/vendor",
    ]
    .iter()
    .flat_map(|l| ["get", "list", "watch"].map(|v| l.replace("{v}", v)))
    .collect();
    assert_eq!(from_sigil, expected);
    let namespaced: BTreeSet<String> = from_chart
        .into_iter()
        .filter(|l| l.starts_with("namespace/"))
        .collect();
    assert_eq!(
        namespaced, expected,
        "the chart differs from sigil node rbac"
    );
}

#[test]
fn the_chart_grants_exactly_what_it_says() {
    for (name, sets) in [
        ("chart-default", &[][..]),
        (
            "chart-pull-secrets-namespaces",
            &[
                "pullSecrets.enabled=true",
                "pullSecrets.namespaces={team-a,team-b}",
            ][..],
        ),
        (
            "chart-cert-manager-no-register",
            &["certificates.mode=cert-manager", "webhook.register=false"][..],
        ),
        ("chart-register", &["webhook.register=true"][..]),
        ("chart-backstop", &["backstop.register=true"][..]),
    ] {
        let objects = crate::helm::rendered(sets);
        assert_least(name, &objects);
        assert_grants(name, &objects);
    }
}

/// `webhook.register=false` installs the configuration from the chart: it
/// must be what `sigil serve --register` writes, field for field (but the
/// caBundle, which sigil or cert-manager fills in), or the API server
/// would call sigil for other objects than sigil registers for.
#[test]
fn the_charts_own_webhook_configuration_is_what_sigil_registers() {
    use sigil_kube::cluster::{FailurePolicy, Settings, webhook_configuration};
    let objects = crate::helm::rendered(&[]);
    let mut chart = objects
        .iter()
        .find(|o| o["kind"] == "MutatingWebhookConfiguration")
        .expect("the chart renders the configuration")
        .clone();
    let settings = Settings {
        namespace: NS.into(),
        node_namespace: None,
        config_name: "sigil".into(),
        service: "sigil".into(),
        service_port: 443,
        url: None,
        failure_policy: FailurePolicy::Fail,
        timeout_seconds: 10,
        state_configmap: "sigil-state".into(),
        interval: std::time::Duration::from_secs(60),
        custom_kinds: Default::default(),
    };
    let mut sigils = serde_json::to_value(webhook_configuration(&settings, b"", None)).unwrap();
    sigils["webhooks"][0]["clientConfig"]
        .as_object_mut()
        .unwrap()
        .remove("caBundle");
    chart["webhooks"][0]["clientConfig"]
        .as_object_mut()
        .unwrap()
        .remove("caBundle");
    assert_eq!(chart["webhooks"], sigils["webhooks"]);
    assert_eq!(chart["metadata"]["name"], sigils["metadata"]["name"]);
}
