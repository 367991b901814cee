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
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use base64::Engine as _;
use serde_json::{Value, json};

use crate::deploy::{env_of, render};
use crate::support::kube::FakeKube;
use crate::support::registry::{Mode, TestRegistry, free_port, test_ca};
use crate::support::review::{pod, review};
use crate::support::sigil::Sigil;
use crate::support::tuf::{StaticServer, TufRepo};

const POD_NAME: &str = "sigil-5d8f7c9b6-x2k4q";
const CIPS: &str = "/apis/sigil.dev/v1alpha1/clusterimagepolicies";

/// A started shipment: keep it alive while checking.
struct Shipped {
    kube: FakeKube,
    launched: Launched,
}

/// sigil started as the shipped Deployment says, and what it uses.
pub(crate) struct Launched {
    pub(crate) sigil: Sigil,
    pub(crate) registry: TestRegistry,
    _root: tempfile::TempDir,
    /// Stands in for Sigstore's TUF CDN (the only thing the harness adds
    /// to the shipped configuration besides where the API server is).
    _tuf: (TufRepo, StaticServer),
}

pub(crate) fn b64(s: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(s)
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

/// The kubelet's part for volumes: writes each mounted volume under `root`
/// and returns (mountPath, host path), longest mount first.
fn mount_volumes(
    lookup: &dyn Fn(&str, &str) -> Option<Value>,
    ns: &str,
    pod: &Value,
    root: &Path,
) -> Vec<(String, PathBuf)> {
    let container = &pod["containers"][0];
    let mut mounts = Vec::new();
    for m in container["volumeMounts"].as_array().into_iter().flatten() {
        let path = m["mountPath"].as_str().unwrap();
        let host = root.join(path.trim_start_matches('/'));
        std::fs::create_dir_all(&host).unwrap();
        let vol = pod["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["name"] == m["name"])
            .expect("every mount names a volume");
        let files: BTreeMap<String, Vec<u8>> = if let Some(cm) = vol["configMap"]["name"].as_str() {
            let o = lookup(&format!("/api/v1/namespaces/{ns}/configmaps"), cm)
                .unwrap_or_else(|| panic!("ConfigMap {cm} is not in the manifests"));
            o["data"]
                .as_object()
                .into_iter()
                .flatten()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap().as_bytes().to_vec()))
                .collect()
        } else if let Some(s) = vol["secret"]["secretName"].as_str() {
            let o = lookup(&format!("/api/v1/namespaces/{ns}/secrets"), s)
                .unwrap_or_else(|| panic!("Secret {s} does not exist"));
            o["data"]
                .as_object()
                .into_iter()
                .flatten()
                .map(|(k, v)| {
                    let d = base64::engine::general_purpose::STANDARD
                        .decode(v.as_str().unwrap())
                        .unwrap();
                    (k.clone(), d)
                })
                .collect()
        } else if vol["emptyDir"].is_object() {
            BTreeMap::new()
        } else {
            panic!("volume kind the test cannot mount: {vol}");
        };
        for (k, v) in files {
            std::fs::write(host.join(k), v).unwrap();
        }
        mounts.push((path.to_owned(), host));
    }
    mounts.sort_by_key(|(p, _)| std::cmp::Reverse(p.len()));
    mounts
}

/// A path inside a mount, as seen from the host.
fn remap(value: &str, mounts: &[(String, PathBuf)]) -> String {
    for (path, host) in mounts {
        if let Some(rest) = value.strip_prefix(path.as_str())
            && (rest.is_empty() || rest.starts_with('/'))
        {
            return format!("{}{rest}", host.display());
        }
    }
    value.to_owned()
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
    let launched = launch(objects, (port, admin), &lookup, &kubeconfig).await?;
    Ok(Shipped { kube, launched })
}

/// Starts the sigil container of the shipped Deployment in `objects` as a
/// kubelet would (see the module docs), listening on `ports` (webhook,
/// admin): its volumes from `lookup` (a collection path and a name), its
/// ServiceAccount's kubeconfig from `kubeconfig`; Ready within 30 s.
pub(crate) async fn launch(
    objects: &[Value],
    (port, admin): (u16, u16),
    lookup: &dyn Fn(&str, &str) -> Option<Value>,
    kubeconfig: &dyn Fn(&str, &str) -> PathBuf,
) -> Result<Launched, String> {
    let url = format!("https://127.0.0.1:{port}/mutate");
    let d = find(objects, "Deployment", "sigil").clone();
    let ns = d["metadata"]["namespace"].as_str().unwrap().to_owned();
    let pod = &d["spec"]["template"]["spec"];
    let container = pod["containers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "sigil")
        .expect("a container named sigil")
        .clone();
    let root = tempfile::tempdir().unwrap();
    let mounts = mount_volumes(lookup, &ns, pod, root.path());
    let registry = TestRegistry::start(Mode::Tls).await;
    let ca_file = root.path().join("registry-ca.pem");
    std::fs::write(&ca_file, registry.ca_pem.clone().unwrap()).unwrap();

    let tuf = TufRepo::new(sigil_verify::trust::PUBLIC_GOOD.as_bytes());
    let cdn = tuf.serve().await;
    let tuf_root = root.path().join("tuf-root.json");
    std::fs::write(&tuf_root, tuf.bootstrap_root()).unwrap();

    let mut args = Vec::new();
    for a in container["args"].as_array().unwrap() {
        let a = a.as_str().unwrap();
        args.push(match a.split_once('=') {
            Some(("--listen", _)) => format!("--listen=127.0.0.1:{port}"),
            Some(("--admin-listen", _)) => format!("--admin-listen=127.0.0.1:{admin}"),
            Some((flag, value)) => format!("{flag}={}", remap(value, &mounts)),
            None => a.to_owned(),
        });
    }
    for flag in ["--listen=", "--admin-listen="] {
        if !args.iter().any(|a| a.starts_with(flag)) {
            return Err(format!("the Deployment does not set {flag} explicitly"));
        }
    }
    let mut env = Vec::new();
    for e in container["env"].as_array().into_iter().flatten() {
        let name = e["name"].as_str().unwrap().to_owned();
        let value = if let Some(v) = e["value"].as_str() {
            remap(v, &mounts)
        } else {
            match e["valueFrom"]["fieldRef"]["fieldPath"].as_str() {
                Some("metadata.namespace") => ns.clone(),
                Some("metadata.name") => POD_NAME.to_owned(),
                other => return Err(format!("env {name}: valueFrom {other:?} is not emulated")),
            }
        };
        env.push((name, value));
    }
    let sa = pod["serviceAccountName"].as_str().unwrap_or("default");
    env.extend([
        ("HOSTNAME".to_owned(), POD_NAME.to_owned()),
        ("TMPDIR".to_owned(), remap("/tmp", &mounts)),
        (
            "KUBECONFIG".to_owned(),
            kubeconfig(&ns, sa).display().to_string(),
        ),
        ("SIGIL_WEBHOOK_URL".to_owned(), url),
        (
            "SIGIL_EXTRA_SANS".to_owned(),
            "127.0.0.1,localhost".to_owned(),
        ),
        ("SSL_CERT_FILE".to_owned(), ca_file.display().to_string()),
        ("SIGIL_TUF_MIRROR".to_owned(), cdn.url()),
        ("SIGIL_TUF_ROOT".to_owned(), tuf_root.display().to_string()),
    ]);
    let mut sigil = Sigil::spawn_exact(&args, &env)?;
    sigil.try_wait_ready(Duration::from_secs(30)).await?;
    Ok(Launched {
        sigil,
        registry,
        _root: root,
        _tuf: (tuf, cdn),
    })
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
