//! Runs what we ship, as shipped: each kustomization in `deploy/` is
//! rendered with `kubectl kustomize`, applied to the kube-apiserver stand-in
//! (which enforces RBAC for ServiceAccount tokens from the rendered Roles and
//! bindings), and the sigil container is started as a kubelet would start
//! it — exactly its `args` and its `env` (literal values, and `fieldRef`s
//! resolved as the downward API does), its ConfigMap, Secret and emptyDir
//! volumes written where it mounts them, its ServiceAccount's token.
//!
//! What a loopback test must change, and nothing else: listen addresses
//! (`127.0.0.1` and free ports instead of `0.0.0.0`), mount paths (under a
//! temporary root instead of `/etc/…`), the webhook URL and serving-cert SAN
//! (`SIGIL_WEBHOOK_URL`, `SIGIL_EXTRA_SANS`, and a shipped configuration's
//! `clientConfig`: the stand-in calls `https://127.0.0.1:PORT`, not the
//! Service), the kubeconfig (the stand-in's
//! address with the ServiceAccount's token), and the test registry's CA
//! (`SSL_CERT_FILE`). sigil must become Ready and do everything the manifest
//! turns on, with no request refused by RBAC.

use std::collections::BTreeMap;

use std::time::{Duration, Instant};

use base64::Engine as _;
use serde_json::{Value, json};

use crate::deploy::{env_of, render};
use crate::kubelet::{Launched, POD_NAME, Runtime, launch};
use crate::support::kube::FakeKube;
use crate::support::registry::{free_port, test_ca};
use crate::support::review::{pod, review};

const CIPS: &str = "/apis/sigil.dev/v1alpha1/clusterimagepolicies";

/// A started shipment: keep it alive while checking.
struct Shipped {
    kube: FakeKube,
    launched: Launched,
}

pub(crate) fn b64(s: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(s)
}

/// [`find`], to edit the object in place.
pub(crate) fn find_mut<'a>(objects: &'a mut [Value], kind: &str, name: &str) -> &'a mut Value {
    objects
        .iter_mut()
        .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("the manifests have no {kind}/{name}"))
}

pub(crate) fn find<'a>(objects: &'a [Value], kind: &str, name: &str) -> &'a Value {
    objects
        .iter()
        .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("the manifests have no {kind}/{name}"))
}

/// cert-manager's part: every Certificate's Secret, signed by a fresh CA,
/// for the Certificate's dnsNames (and 127.0.0.1, which the stand-in calls).
fn issue_certificates(kube: &FakeKube, objects: &[Value]) {
    for c in objects.iter().filter(|o| o["kind"] == "Certificate") {
        let ns = c["metadata"]["namespace"].as_str().unwrap();
        let name = c["metadata"]["name"].as_str().unwrap();
        let secret = c["spec"]["secretName"].as_str().unwrap();
        let (ca, cert, key) = test_ca();
        kube.insert(
            &format!("/api/v1/namespaces/{ns}/secrets"),
            json!({"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
                   "metadata": {"name": secret, "namespace": ns},
                   "data": {"tls.crt": b64(&cert), "tls.key": b64(&key), "ca.crt": b64(&ca)}}),
        );
        // cert-manager's CA injector: a configuration that asks for this
        // Certificate's CA gets it as its caBundle.
        let wanted = format!("{ns}/{name}");
        if let Some(mut w) = kube.webhook_configuration("sigil")
            && w["metadata"]["annotations"]["cert-manager.io/inject-ca-from"] == wanted.as_str()
        {
            w["webhooks"][0]["clientConfig"]["caBundle"] = json!(b64(&ca));
            kube.apply(&[w]);
        }
    }
}

/// The loopback remap of a shipped webhook configuration: the stand-in
/// calls `url`, not the Service (what `SIGIL_WEBHOOK_URL` does for one sigil
/// registers).
pub(crate) fn point_at(objects: &[Value], url: &str) -> Vec<Value> {
    objects
        .iter()
        .cloned()
        .map(|mut o| {
            if o["kind"] == "MutatingWebhookConfiguration" {
                for w in o["webhooks"].as_array_mut().into_iter().flatten() {
                    let cc = w["clientConfig"].as_object_mut().unwrap();
                    cc.remove("service");
                    cc.insert("url".into(), json!(url));
                }
            }
            o
        })
        .collect()
}

/// Applies rendered `objects` and starts sigil from their Deployment as
/// shipped. `Err` says what went wrong.
async fn start_shipped(objects: &[Value]) -> Result<Shipped, String> {
    let kube = FakeKube::start().await;
    let (port, admin) = (free_port(), free_port());
    let url = format!("https://127.0.0.1:{port}/mutate");
    kube.apply(&point_at(objects, &url));
    // A cluster with the PolicyReport CRDs and a workload to report on.
    kube.apply(&FakeKube::report_crds("wgpolicyk8s"));
    kube.namespaces(&["team"]);
    kube.insert(
        "/api/v1/namespaces/team/pods",
        json!({"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": "app", "namespace": "team", "uid": "uid-team-app"},
               "spec": {"containers": [{"name": "app", "image": "registry.invalid/team/app:v1"}]}}),
    );
    issue_certificates(&kube, objects);
    let lookup = |coll: &str, name: &str| kube.get(coll, name);
    let kubeconfig = |ns: &str, sa: &str| kube.service_account_kubeconfig(ns, sa);
    let launched = launch(
        objects,
        (port, admin),
        &lookup,
        &kubeconfig,
        Runtime::Process,
    )
    .await?;
    Ok(Shipped { kube, launched })
}

async fn wait_for<T>(
    limit: Duration,
    what: &str,
    mut f: impl AsyncFnMut() -> Option<T>,
) -> Result<T, String> {
    let until = Instant::now() + limit;
    loop {
        if let Some(v) = f().await {
            return Ok(v);
        }
        if Instant::now() > until {
            return Err(format!("timed out waiting for {what}"));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Everything the Deployment turns on works, with no request refused.
async fn check_shipped(s: &Shipped, objects_env: &BTreeMap<String, String>) -> Result<(), String> {
    let on = |k: &str| objects_env.get(k).is_some_and(|v| v == "true");
    let ns = "sigil-system";
    let kube = &s.kube;
    let image = format!("{}/shop/app:1.0", s.launched.registry.host());
    let digest = s.launched.registry.push_image("shop/app", "1.0").await;
    kube.insert(
        "/api/v1/namespaces",
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "shop"}}),
    );
    // Registered by sigil, or shipped with the manifests (sigil, or
    // cert-manager's CA injector, fills in its caBundle).
    if on("SIGIL_REGISTER") || kube.webhook_configuration("sigil").is_some() {
        let c = wait_for(
            Duration::from_secs(15),
            "the webhook configuration",
            async || {
                kube.webhook_configuration("sigil")
                    .filter(|c| c["webhooks"][0]["clientConfig"]["caBundle"].is_string())
            },
        )
        .await?;
        let w = &c["webhooks"][0];
        if w["failurePolicy"] != objects_env["SIGIL_FAILURE_POLICY"].as_str() {
            return Err(format!("registered failurePolicy {} ", w["failurePolicy"]));
        }
        if w["timeoutSeconds"]
            .as_i64()
            .map(|t| t.to_string())
            .as_deref()
            != Some(objects_env["SIGIL_WEBHOOK_TIMEOUT"].as_str())
        {
            return Err(format!("registered timeoutSeconds {}", w["timeoutSeconds"]));
        }
        // The API server's call, trusting exactly the registered caBundle: pinned.
        let api = kube.webhook_client("sigil");
        let got = api
            .admit(
                &review("CREATE", "shop", pod("web", &[&image])),
                Duration::from_secs(10),
            )
            .await;
        let pinned = got.object["spec"]["containers"][0]["image"]
            .as_str()
            .unwrap_or_default();
        if !got.allowed || pinned != format!("{image}@{digest}") {
            return Err(format!("the webhook did not pin {image}: {got:?}"));
        }
    }
    if on("SIGIL_SELF_MANAGED_CERTS")
        && kube
            .get(&format!("/api/v1/namespaces/{ns}/secrets"), "sigil-tls")
            .is_none_or(|s| s["data"]["ca.crt"].as_str().unwrap_or_default().is_empty())
    {
        return Err("the certificate Secret sigil-tls was never filled in".into());
    }
    if on("SIGIL_PULL_SECRETS") {
        // Cluster-wide, or in each listed namespace.
        let scopes: Vec<String> = match objects_env.get("SIGIL_PULL_SECRETS_NAMESPACES") {
            Some(list) => list
                .split(',')
                .map(|n| format!("/api/v1/namespaces/{n}"))
                .collect(),
            None => vec!["/api/v1".to_owned()],
        };
        for scope in &scopes {
            for r in ["secrets", "serviceaccounts"] {
                let watched = kube
                    .requests()
                    .iter()
                    .any(|(m, p, c)| m == "GET" && p == &format!("{scope}/{r}") && *c == 200);
                if !watched {
                    return Err(format!("the pull-secret watch never listed {scope}/{r}"));
                }
            }
        }
    }
    if on("SIGIL_WATCH_POLICIES") {
        kube.insert(
            CIPS,
            json!({"apiVersion": "sigil.dev/v1alpha1", "kind": "ClusterImagePolicy",
                   "metadata": {"name": "shipped"},
                   "spec": {"rules": [{"name": "shop", "match": ["**/shop/**"], "mode": "warn"}]}}),
        );
        wait_for(
            Duration::from_secs(15),
            "the policy object's status",
            async || {
                kube.get(CIPS, "shipped")
                    .filter(|o| o["status"]["conditions"][0]["status"] == "True")
            },
        )
        .await?;
        // A keyRef in sigil's namespace is watched as the base's Role allows
        // (a refused watch would show in `kube.denied()` below).
        kube.insert(
            "/api/v1/namespaces/sigil-system/configmaps",
            json!({"apiVersion": "v1", "kind": "ConfigMap",
                   "metadata": {"name": "shipped-keys", "namespace": ns},
                   "data": {"cosign.pub": crate::support::signing::Signer::p256().public_pem()}}),
        );
        kube.insert(
            CIPS,
            json!({"apiVersion": "sigil.dev/v1alpha1", "kind": "ClusterImagePolicy",
                   "metadata": {"name": "shipped-keys"},
                   "spec": {"rules": [{"name": "keyed", "match": ["**/keyed/**"], "mode": "warn",
                       "verify": [{"name": "k", "cosign": {"keyRef": {"configMap": "shipped-keys", "key": "cosign.pub"}}}]}]}}),
        );
        wait_for(
            Duration::from_secs(15),
            "the keyRef ConfigMap to be watched",
            async || {
                kube.requests()
                    .iter()
                    .any(|(m, p, c)| {
                        m == "GET" && p == "/api/v1/namespaces/sigil-system/configmaps" && *c == 200
                    })
                    .then_some(())
            },
        )
        .await?;
        // A TrustRoot is loaded and its status written, as the base's RBAC allows.
        let trs = "/apis/sigil.dev/v1alpha1/trustroots";
        let keys: Value = serde_json::from_str(sigil_verify::trust::PUBLIC_GOOD).unwrap();
        kube.insert(
            trs,
            json!({"apiVersion": "sigil.dev/v1alpha1", "kind": "TrustRoot",
                   "metadata": {"name": "shipped"}, "spec": {"sigstoreKeys": keys}}),
        );
        wait_for(
            Duration::from_secs(15),
            "the TrustRoot's status",
            async || {
                kube.get(trs, "shipped")
                    .filter(|o| o["status"]["conditions"][0]["status"] == "True")
            },
        )
        .await?;
    }
    if objects_env
        .get("SIGIL_AUDIT_INTERVAL")
        .is_some_and(|v| v != "0" && v != "0s")
    {
        let admin = s.launched.sigil.admin;
        wait_for(
            Duration::from_secs(20),
            "an audit report at /audit",
            async || {
                let r = reqwest::get(format!("http://{admin}/audit")).await.ok()?;
                (r.status() == 200).then_some(())
            },
        )
        .await?;
        let lease = kube
            .get(
                "/apis/coordination.k8s.io/v1/namespaces/sigil-system/leases",
                "sigil-audit",
            )
            .ok_or("no audit Lease")?;
        if !lease["spec"]["holderIdentity"]
            .as_str()
            .unwrap_or_default()
            .starts_with(POD_NAME)
        {
            return Err(format!("the audit Lease is not held by this pod: {lease}"));
        }
        if objects_env
            .get("SIGIL_POLICY_REPORTS")
            .is_some_and(|v| v != "off")
        {
            wait_for(
                Duration::from_secs(20),
                "the team namespace's PolicyReport",
                async || {
                    kube.get(
                        "/apis/wgpolicyk8s.io/v1alpha2/namespaces/team/policyreports",
                        "sigil",
                    )
                },
            )
            .await?;
        }
    }
    // The trusted root is refreshed from its TUF repository at start, with
    // the datastore in the shipped /tmp volume.
    let sigil = &s.launched.sigil;
    wait_for(
        Duration::from_secs(15),
        "a TUF refresh of the trusted root",
        async || {
            let mut verified = 0.0;
            for result in ["changed", "unchanged"] {
                verified += sigil
                    .counter(
                        "sigil_trust_root_refresh_total",
                        &[("trust_root", "public-good"), ("result", result)],
                    )
                    .await;
            }
            (verified >= 1.0).then_some(())
        },
    )
    .await?;
    let denied = kube.denied();
    if !denied.is_empty() {
        return Err(format!(
            "RBAC refused requests the base needs:\n{}",
            denied.join("\n")
        ));
    }
    let unauthorized: Vec<_> = kube
        .requests()
        .into_iter()
        .filter(|(_, _, c)| *c == 401)
        .collect();
    if !unauthorized.is_empty() {
        return Err(format!("requests were not authenticated: {unauthorized:?}"));
    }
    Ok(())
}

/// Renders `overlay`, lets `edit` change the rendered objects (to prove the
/// test catches a broken manifest), starts sigil from them and checks it.
async fn run_shipped(overlay: &str, edit: impl FnOnce(&mut Vec<Value>)) -> Result<(), String> {
    let mut objects = render(overlay);
    edit(&mut objects);
    run_objects(&objects).await
}

/// Starts sigil from rendered `objects` (kustomize's or Helm's) and checks it.
pub(crate) async fn run_objects(objects: &[Value]) -> Result<(), String> {
    let objects = objects.to_vec();
    let env = env_of(find(&objects, "Deployment", "sigil"));
    let s = start_shipped(&objects).await?;
    check_shipped(&s, &env)
        .await
        .map_err(|e| format!("{e}\nsigil's logs:\n{}", s.launched.sigil.logs()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_base_runs_as_shipped_with_its_own_rbac() {
    run_shipped("base", |_| {}).await.unwrap();
}

/// sigil registers the configuration itself (`--register`), with the
/// RBAC the overlay gives it for that.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_register_overlay_runs_as_shipped() {
    run_shipped("overlays/register", |_| {}).await.unwrap();
}

/// Pull secrets on (the component, as the overlay composes it): sigil
/// watches Secrets and ServiceAccounts cluster-wide with the RBAC it adds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pull_secrets_overlay_runs_as_shipped() {
    run_shipped("overlays/pull-secrets", |_| {}).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fail_open_overlay_runs_as_shipped() {
    run_shipped("overlays/fail-open", |_| {}).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cert_manager_overlay_runs_as_shipped() {
    run_shipped("overlays/cert-manager", |_| {}).await.unwrap();
}

/// The test fails when an env value is one sigil refuses (as
/// `SIGIL_FAILURE_POLICY=Fail` was refused before the flag took Kubernetes'
/// spelling, and every replica crash-looped).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn running_what_we_ship_catches_an_env_value_sigil_refuses() {
    let err = run_shipped("base", |objects| {
        let d = objects
            .iter_mut()
            .find(|o| o["kind"] == "Deployment")
            .unwrap();
        for e in d["spec"]["template"]["spec"]["containers"][0]["env"]
            .as_array_mut()
            .unwrap()
        {
            if e["name"] == "SIGIL_FAILURE_POLICY" {
                e["value"] = json!("FailClosed");
            }
        }
    })
    .await
    .unwrap_err();
    assert!(err.contains("invalid value 'FailClosed'"), "{err}");
}

/// The test fails when the base's RBAC lacks a verb sigil needs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn running_what_we_ship_catches_a_removed_rbac_verb() {
    let err = run_shipped("base", |objects| {
        let role = objects
            .iter_mut()
            .find(|o| o["kind"] == "ClusterRole" && o["metadata"]["name"] == "sigil-policies")
            .unwrap();
        role["rules"][0]["verbs"] = json!(["list"]);
    })
    .await
    .unwrap_err();
    assert!(err.contains("cannot watch resource"), "{err}");
}
