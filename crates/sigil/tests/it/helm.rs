//! The Helm chart (`deploy/helm/sigil`), with the real `helm`: lint-clean;
//! with default values it renders the kustomize base's objects, object by
//! object (and with the overlays' settings, the overlays'); every value it
//! offers changes what it says; and what it renders runs, as shipped,
//! against the kube-apiserver stand-in with its own RBAC.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{Value, json};

use crate::deploy::render;
use crate::shipped::{b64, run_objects};
use crate::support::registry::test_ca;

fn chart() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/helm/sigil")
}

fn helm(args: &[&str]) -> std::process::Output {
    Command::new("helm")
        .args(args)
        .output()
        .expect("helm is installed (scripts/test.sh installs it: scripts/install-helm.sh)")
}

/// `helm template` with `--set`s (`@key=path`: `--set-file key=path`), as
/// objects; `Err` with helm's message.
fn template(sets: &[&str]) -> Result<Vec<Value>, String> {
    let chart = chart();
    let mut args = vec![
        "template",
        "sigil",
        chart.to_str().unwrap(),
        "--namespace",
        "sigil-system",
        "--include-crds",
    ];
    for s in sets {
        match s.strip_prefix('@') {
            Some(file) => {
                args.push("--set-file");
                args.push(file);
            }
            None => {
                args.push("--set");
                args.push(s);
            }
        }
    }
    let out = helm(&args);
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    let text = String::from_utf8(out.stdout).unwrap();
    Ok(sigil_core::manifest::parse_stream(&text)
        .unwrap()
        .into_iter()
        .map(|d| d.to_value())
        .collect())
}

pub(crate) fn rendered(sets: &[&str]) -> Vec<Value> {
    template(sets).unwrap_or_else(|e| panic!("helm template {sets:?}: {e}"))
}

/// Objects by (kind, name), with the lists Kubernetes merges by name (env,
/// volumes, volumeMounts) as sets: kustomize patches move what they patch
/// first; their order means nothing here (no variable refers to another).
fn normalized(objects: &[Value]) -> std::collections::BTreeMap<(String, String), Value> {
    objects
        .iter()
        .map(|o| {
            let mut o = o.clone();
            for list in [
                "/spec/template/spec/containers/0/env",
                "/spec/template/spec/containers/0/volumeMounts",
                "/spec/template/spec/volumes",
            ] {
                if let Some(items) = o.pointer_mut(list).and_then(Value::as_array_mut) {
                    items.sort_by(|a, b| a["name"].as_str().cmp(&b["name"].as_str()));
                }
            }
            let key = (
                o["kind"].as_str().unwrap().to_owned(),
                o["metadata"]["name"].as_str().unwrap().to_owned(),
            );
            (key, o)
        })
        .collect()
}

fn assert_same(helm: &[Value], kustomize: &[Value], what: &str) {
    let (h, k) = (normalized(helm), normalized(kustomize));
    let hk: Vec<_> = h.keys().collect();
    let kk: Vec<_> = k.keys().collect();
    assert_eq!(hk, kk, "{what}: the same objects");
    for (key, obj) in &k {
        assert_eq!(&h[key], obj, "{what}: {key:?} differs");
    }
}

fn find<'a>(objects: &'a [Value], kind: &str, name: &str) -> Option<&'a Value> {
    objects
        .iter()
        .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
}

fn deployment(objects: &[Value]) -> &Value {
    find(objects, "Deployment", "sigil").expect("a Deployment")
}

fn env(objects: &[Value], name: &str) -> Option<String> {
    deployment(objects)["spec"]["template"]["spec"]["containers"][0]["env"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == name)
        .map(|e| e["value"].as_str().unwrap().to_owned())
}

#[test]
fn the_chart_lints_clean() {
    let out = helm(&["lint", "--strict", chart().to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Defaults render the base; the overlays' settings render the overlays.
/// The Namespace is the one difference by default: Helm keeps its release
/// record in the release namespace, so `helm install --create-namespace`
/// creates it and a chart that also did could not be installed;
/// `namespace.create=true` renders the base's (for `helm template | kubectl
/// apply`, Argo CD, Flux).
#[test]
fn default_values_render_the_kustomize_base_object_by_object() {
    let mut base = render("base");
    let ns = base
        .iter()
        .position(|o| o["kind"] == "Namespace")
        .expect("the base has a Namespace");
    let namespace = base.remove(ns);
    assert_same(&rendered(&[]), &base, "defaults vs base");
    base.push(namespace);
    assert_same(
        &rendered(&["namespace.create=true"]),
        &base,
        "namespace.create vs base",
    );
    assert_same(
        &rendered(&["namespace.create=true", "webhook.failurePolicy=Ignore"]),
        &render("overlays/fail-open"),
        "failurePolicy=Ignore vs overlays/fail-open",
    );
    assert_same(
        &rendered(&["namespace.create=true", "certificates.mode=cert-manager"]),
        &render("overlays/cert-manager"),
        "certificates.mode=cert-manager vs overlays/cert-manager",
    );
    assert_same(
        &rendered(&[
            "namespace.create=true",
            "metrics.serviceMonitor.enabled=true",
            "metrics.prometheusRule.enabled=true",
            "metrics.dashboard.enabled=true",
        ]),
        &render("overlays/monitoring"),
        "metrics.* vs overlays/monitoring",
    );
    assert_same(
        &rendered(&["namespace.create=true", "backstop.register=true"]),
        &render("overlays/backstop"),
        "backstop.register vs overlays/backstop",
    );
    assert_same(
        &rendered(&["namespace.create=true", "node.enabled=true"]),
        &render("overlays/node"),
        "node.enabled vs overlays/node",
    );
    // The chart's CRDs are `sigil crds`, as the base's are.
    assert_eq!(
        std::fs::read_to_string(chart().join("crds/policies.yaml")).unwrap(),
        std::fs::read_to_string(chart().join("../../kustomize/base/crds/policies.yaml")).unwrap()
    );
}

#[test]
fn every_value_the_chart_offers_changes_what_it_renders() {
    let o = rendered(&[
        "image.repository=mirror.example.com/sigil",
        "image.tag=1.2.3",
        "image.pullPolicy=Always",
        "imagePullSecrets[0].name=mirror-creds",
        "replicas=5",
        "webhook.timeoutSeconds=5",
        "logLevel=debug",
        "limits.maxConnections=2048",
        "limits.bodyMemory=128Mi",
        "limits.firstRequestTimeout=5s",
        "limits.idleTimeout=60s",
        "limits.maxLookupsPerObject=32",
        "mirrorCopy.transfers=8",
        "mirrorCopy.maxBytesInFlight=33554432",
        "registryCredentials[0]=mirror-push",
        "resources.limits.memory=512Mi",
        "priorityClassName=",
        "nodeSelector.pool=system",
        "tolerations[0].key=dedicated",
        "tolerations[0].operator=Exists",
        "affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0].key=pool",
        "affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0].operator=Exists",
        "topologySpreadConstraints[0].maxSkew=2",
        "topologySpreadConstraints[0].topologyKey=kubernetes.io/hostname",
        "topologySpreadConstraints[0].whenUnsatisfiable=ScheduleAnyway",
        "podDisruptionBudget.maxUnavailable=2",
        "extraEnv[0].name=SIGIL_TUF_MIRROR",
        "extraEnv[0].value=https://tuf.example.com/",
        "audit.interval=1h",
        "audit.policyReports=openreports",
        "policy=apiVersion: sigil.dev/v1alpha1\nkind: ImagePolicy\nmetadata: {name: mine}\n",
    ]);
    let d = deployment(&o);
    let pod = &d["spec"]["template"]["spec"];
    let c = &pod["containers"][0];
    assert_eq!(c["image"], "mirror.example.com/sigil:1.2.3");
    assert_eq!(c["imagePullPolicy"], "Always");
    assert_eq!(pod["imagePullSecrets"], json!([{"name": "mirror-creds"}]));
    assert_eq!(d["spec"]["replicas"], 5);
    assert_eq!(env(&o, "SIGIL_WEBHOOK_TIMEOUT").as_deref(), Some("5"));
    assert_eq!(pod["terminationGracePeriodSeconds"], 40);
    assert_eq!(env(&o, "SIGIL_LOG").as_deref(), Some("debug"));
    assert_eq!(env(&o, "SIGIL_MAX_CONNECTIONS").as_deref(), Some("2048"));
    assert_eq!(env(&o, "SIGIL_BODY_MEMORY").as_deref(), Some("128Mi"));
    assert_eq!(
        env(&o, "SIGIL_FIRST_REQUEST_TIMEOUT").as_deref(),
        Some("5s")
    );
    assert_eq!(env(&o, "SIGIL_IDLE_TIMEOUT").as_deref(), Some("60s"));
    assert_eq!(
        env(&o, "SIGIL_MAX_LOOKUPS_PER_OBJECT").as_deref(),
        Some("32")
    );
    assert_eq!(env(&o, "SIGIL_MIRROR_COPY_TRANSFERS").as_deref(), Some("8"));
    assert_eq!(
        env(&o, "SIGIL_MIRROR_COPY_MAX_BYTES_IN_FLIGHT").as_deref(),
        Some("33554432")
    );
    assert!(
        c["volumeMounts"]
            .as_array()
            .unwrap()
            .iter()
            .any(
                |m| m["mountPath"] == "/etc/sigil/credentials/mirror-push" && m["readOnly"] == true
            ),
        "{c}"
    );
    assert!(
        pod["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|v| v["secret"]["secretName"] == "mirror-push"),
        "{pod}"
    );
    assert_eq!(env(&o, "SIGIL_AUDIT_INTERVAL").as_deref(), Some("1h"));
    assert_eq!(
        env(&o, "SIGIL_POLICY_REPORTS").as_deref(),
        Some("openreports")
    );
    assert_eq!(
        env(&o, "SIGIL_TUF_MIRROR").as_deref(),
        Some("https://tuf.example.com/")
    );
    assert_eq!(c["resources"]["limits"]["memory"], "512Mi");
    assert!(pod.get("priorityClassName").is_none());
    assert_eq!(pod["nodeSelector"], json!({"pool": "system"}));
    assert_eq!(pod["tolerations"][0]["key"], "dedicated");
    assert!(pod["affinity"]["nodeAffinity"].is_object());
    assert_eq!(
        pod["topologySpreadConstraints"].as_array().unwrap().len(),
        1
    );
    assert_eq!(pod["topologySpreadConstraints"][0]["maxSkew"], 2);
    assert_eq!(
        find(&o, "PodDisruptionBudget", "sigil").unwrap()["spec"]["maxUnavailable"],
        2
    );
    assert!(
        find(&o, "ConfigMap", "sigil-policy").unwrap()["data"]["policy.yaml"]
            .as_str()
            .unwrap()
            .contains("name: mine")
    );

    // Features off take their RBAC with them.
    let off = rendered(&[
        "webhook.register=false",
        "pullSecrets.enabled=false",
        "audit.interval=0s",
        "watchPolicies=false",
        "podDisruptionBudget=null",
    ]);
    assert_eq!(env(&off, "SIGIL_REGISTER").as_deref(), Some("false"));
    assert_eq!(env(&off, "SIGIL_PULL_SECRETS").as_deref(), Some("false"));
    assert_eq!(env(&off, "SIGIL_AUDIT_INTERVAL").as_deref(), Some("0s"));
    assert_eq!(env(&off, "SIGIL_WATCH_POLICIES").as_deref(), Some("false"));
    // Not registering, sigil only keeps the chart's configuration's caBundle.
    let only = find(&off, "ClusterRole", "sigil").unwrap()["rules"].to_string();
    assert!(
        !only.contains("create") && only.contains("update"),
        "{only}"
    );
    assert!(find(&off, "MutatingWebhookConfiguration", "sigil").is_some());
    for (kind, name) in [
        ("ClusterRole", "sigil-pull-secrets"),
        ("ClusterRoleBinding", "sigil-pull-secrets"),
        ("ClusterRole", "sigil-audit"),
        ("ClusterRole", "sigil-policy-reports"),
        ("ClusterRole", "sigil-policies"),
        ("ClusterRole", "sigil-key-refs"),
        ("RoleBinding", "sigil-key-refs"),
        ("PodDisruptionBudget", "sigil"),
    ] {
        assert!(
            find(&off, kind, name).is_none(),
            "{kind}/{name} rendered while off"
        );
    }

    // A given certificate: mounted, no Secret permissions, no cert-manager.
    let given = rendered(&[
        "certificates.mode=given",
        "certificates.secretName=my-tls",
        "certificates.caBundle=QUJD",
    ]);
    assert_eq!(
        find(&given, "MutatingWebhookConfiguration", "sigil").unwrap()["webhooks"][0]["clientConfig"]
            ["caBundle"],
        "QUJD"
    );
    assert!(
        find(&given, "ClusterRole", "sigil").is_none(),
        "no right on the configuration"
    );
    assert!(
        template(&["certificates.mode=given"])
            .unwrap_err()
            .contains("needs certificates.caBundle")
    );
    assert_eq!(
        env(&given, "SIGIL_SELF_MANAGED_CERTS").as_deref(),
        Some("false")
    );
    assert_eq!(
        env(&given, "SIGIL_TLS_CERT").as_deref(),
        Some("/etc/sigil/tls/tls.crt")
    );
    let vols = &deployment(&given)["spec"]["template"]["spec"]["volumes"];
    assert!(
        vols.as_array()
            .unwrap()
            .iter()
            .any(|v| v["secret"]["secretName"] == "my-tls")
    );
    let role = find(&given, "Role", "sigil").unwrap();
    assert!(!role.to_string().contains("secrets"), "{role}");
    assert!(find(&given, "Certificate", "sigil-serving").is_none());
    let cm = rendered(&[
        "certificates.mode=cert-manager",
        "certificates.duration=720h",
        "certificates.renewBefore=240h",
    ]);
    let serving = find(&cm, "Certificate", "sigil-serving").unwrap();
    assert_eq!(serving["spec"]["duration"], "720h");
    assert_eq!(serving["spec"]["renewBefore"], "240h");
}

#[test]
fn values_sigil_would_refuse_are_refused_when_rendering() {
    for (set, says) in [
        ("certificates.mode=vault", "certificates.mode"),
        ("webhook.failurePolicy=Fial", "webhook.failurePolicy"),
        ("replicas=0", "replicas"),
    ] {
        let e = template(&[set]).unwrap_err();
        assert!(e.contains(says), "{set}: {e}");
    }
}

/// `helm install --create-namespace`: the namespace exists before the chart.
fn created_namespace() -> Value {
    json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "sigil-system"}})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_chart_with_default_values_runs_as_shipped() {
    let mut objects = rendered(&[]);
    objects.push(created_namespace());
    run_objects(&objects).await.unwrap();
}

/// A given certificate, the Secret created beforehand as its user would,
/// its CA in the chart's webhook configuration (`certificates.caBundle`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_chart_with_a_given_certificate_runs_as_shipped() {
    let (ca, cert, key) = test_ca();
    let bundle = format!("certificates.caBundle={}", b64(&ca));
    let mut objects = rendered(&["certificates.mode=given", &bundle]);
    objects.push(created_namespace());
    objects.push(
        json!({"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
        "metadata": {"name": "sigil-serving-tls", "namespace": "sigil-system"},
        "data": {"tls.crt": b64(&cert), "tls.key": b64(&key), "ca.crt": b64(&ca)}}),
    );
    run_objects(&objects).await.unwrap();
}

/// Registry credentials from a Secret the user created beforehand (push
/// credentials for a mirror that copies), and the copy limits: runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_chart_with_registry_credentials_runs_as_shipped() {
    let mut objects = rendered(&[
        "registryCredentials[0]=mirror-push",
        "mirrorCopy.transfers=2",
        "mirrorCopy.maxBytesInFlight=8388608",
    ]);
    objects.push(created_namespace());
    objects.push(json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "mirror-push", "namespace": "sigil-system"},
        "data": {"username": b64("robot"), "password": b64("s3cret")}}));
    run_objects(&objects).await.unwrap();
}

/// `webhook.register=true`: sigil registers the configuration itself, with
/// the RBAC the chart gives it for that.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_chart_with_sigil_registering_runs_as_shipped() {
    let mut objects = rendered(&["webhook.register=true"]);
    assert!(find(&objects, "MutatingWebhookConfiguration", "sigil").is_none());
    objects.push(created_namespace());
    run_objects(&objects).await.unwrap();
}

/// Pull secrets read in listed namespaces only: a RoleBinding in each, and
/// sigil watches exactly those (the stand-in enforces the RBAC).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_chart_with_pull_secrets_per_namespace_runs_as_shipped() {
    let mut objects = rendered(&[
        "pullSecrets.enabled=true",
        "pullSecrets.namespaces={team-a,team-b}",
    ]);
    objects.push(created_namespace());
    for ns in ["team-a", "team-b"] {
        objects.push(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}));
    }
    run_objects(&objects).await.unwrap();
}

/// Features turned off run with the RBAC the chart keeps for them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_chart_with_features_off_runs_with_the_rbac_it_keeps() {
    let mut objects = rendered(&[
        "pullSecrets.enabled=false",
        "audit.interval=0s",
        "watchPolicies=false",
    ]);
    objects.push(created_namespace());
    run_objects(&objects).await.unwrap();
}

/// GitOps: what `sigil backstop` prints, given as `--set-file
/// backstop.manifests=`, is rendered object for object as printed (the
/// real-API test installs it this way); with `backstop.register` too the
/// chart refuses to render (one owner).
#[test]
fn the_printed_backstop_is_installed_as_printed() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("backstop.yaml");
    let printed = printed_backstop(&file, None);
    let objects = rendered(&[&format!("@backstop.manifests={}", file.display())]);
    for p in &printed {
        assert!(objects.contains(p), "{p} is not rendered as printed");
    }
    let err = template(&[
        &format!("@backstop.manifests={}", file.display()),
        "backstop.register=true",
    ])
    .unwrap_err();
    assert!(err.contains("choose one"), "{err}");
}

/// `sigil backstop [--policy POLICY]` written to `file`; its objects.
pub(crate) fn printed_backstop(file: &std::path::Path, policy: Option<&str>) -> Vec<Value> {
    let dir = tempfile::tempdir().unwrap();
    let mut args = vec!["backstop".to_owned()];
    if let Some(p) = policy {
        let path = dir.path().join("policy.yaml");
        std::fs::write(&path, p).unwrap();
        args.extend(["--policy".to_owned(), path.display().to_string()]);
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = crate::support::sigil::run_sigil(&args, None);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::write(file, &out.stdout).unwrap();
    crate::deploy::objects(&String::from_utf8(out.stdout).unwrap())
}
