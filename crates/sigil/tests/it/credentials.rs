//! Pull credentials the way kubelet finds them, end to end: the real
//! `docker-registry` behind htpasswd, the kube-apiserver stand-in serving
//! Secrets and ServiceAccounts to kube-runtime's watcher, `sigil serve
//! --pull-secrets`, and `sigil pin` with a docker credential helper and a
//! kubelet credential-provider plugin (shell scripts speaking the real
//! protocols).

use std::os::unix::fs::PermissionsExt as _;
use std::time::{Duration, Instant};

use base64::Engine as _;
use serde_json::{Value, json};

use crate::support::kube::FakeKube;
use crate::support::registry::{Mode, TestRegistry};
use crate::support::review::review;
use crate::support::sigil::{Admitted, Sigil, bin};

const USER: &str = "puller";
const PASSWORD: &str = "s3cret-pull";

fn b64(s: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(s)
}

/// A `kubernetes.io/dockerconfigjson` Secret for `host`.
pub(crate) fn pull_secret(ns: &str, name: &str, host: &str, user: &str, password: &str) -> Value {
    let cfg = json!({"auths": {host: {"auth": b64(&format!("{user}:{password}"))}}});
    json!({"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/dockerconfigjson",
           "metadata": {"name": name, "namespace": ns},
           "data": {".dockerconfigjson": b64(&cfg.to_string())}})
}

fn service_account(ns: &str, name: &str, secrets: &[&str]) -> Value {
    let refs: Vec<Value> = secrets.iter().map(|s| json!({"name": s})).collect();
    json!({"apiVersion": "v1", "kind": "ServiceAccount",
           "metadata": {"name": name, "namespace": ns}, "imagePullSecrets": refs})
}

fn secrets(ns: &str) -> String {
    format!("/api/v1/namespaces/{ns}/secrets")
}

fn policy(host: &str) -> String {
    format!(
        "apiVersion: sigil.dev/v1alpha1\nkind: ImagePolicy\nspec:\n  registries:\n    - {{host: \"{host}\", insecure: true}}\n  rules:\n    - {{name: all, match: [\"**\"], mode: enforce}}\n"
    )
}

fn pod(ns: &str, image: &str, secrets: &[&str]) -> Value {
    let refs: Vec<Value> = secrets.iter().map(|s| json!({"name": s})).collect();
    review(
        "CREATE",
        ns,
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": ns},
               "spec": {"imagePullSecrets": refs, "containers": [{"name": "app", "image": image}]}}),
    )
}

fn deployment(ns: &str, image: &str, secrets: &[&str], sa: Option<&str>) -> Value {
    let refs: Vec<Value> = secrets.iter().map(|s| json!({"name": s})).collect();
    let mut spec =
        json!({"imagePullSecrets": refs, "containers": [{"name": "app", "image": image}]});
    if let Some(sa) = sa {
        spec["serviceAccountName"] = json!(sa);
    }
    let mut r = review(
        "CREATE",
        ns,
        json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web", "namespace": ns},
               "spec": {"selector": {"matchLabels": {"app": "web"}}, "template": {"metadata": {"labels": {"app": "web"}}, "spec": spec}}}),
    );
    r["request"]["kind"] = json!({"group": "apps", "version": "v1", "kind": "Deployment"});
    r
}

/// A registry behind htpasswd holding `team/app:v1`, the stand-in, and sigil
/// watching pull secrets through it.
struct Cluster {
    reg: TestRegistry,
    kube: FakeKube,
    digest: String,
}

impl Cluster {
    async fn start() -> Cluster {
        let reg = TestRegistry::start(Mode::Htpasswd {
            user: USER,
            password: PASSWORD,
        })
        .await;
        let digest = reg.push_image("team/app", "v1").await;
        let kube = FakeKube::start().await;
        Cluster { reg, kube, digest }
    }

    async fn sigil(&self) -> Sigil {
        Sigil::start_env(
            Some(&policy(&self.reg.host())),
            &["--pull-secrets"],
            &self.kube.env(),
        )
        .await
    }

    fn image(&self) -> String {
        format!("{}/team/app:v1", self.reg.host())
    }

    fn put(&self, collection: &str, obj: Value) {
        self.kube.state.lock().unwrap().insert(collection, obj);
    }
}

async fn admit(s: &Sigil, r: &Value) -> Admitted {
    s.apiserver().admit(r, Duration::from_secs(10)).await
}

#[tokio::test]
async fn pods_templates_and_service_accounts_pull_with_their_own_secrets() {
    let c = Cluster::start().await;
    let host = c.reg.host();
    c.put(
        &secrets("shop"),
        pull_secret("shop", "regcred", &host, USER, PASSWORD),
    );
    c.put(
        &secrets("shop"),
        pull_secret("shop", "stale", &host, USER, "old-password"),
    );
    c.put(
        "/api/v1/namespaces/shop/serviceaccounts",
        service_account("shop", "default", &["regcred"]),
    );
    c.put(
        "/api/v1/namespaces/shop/serviceaccounts",
        service_account("shop", "builder", &[]),
    );
    let s = c.sigil().await;
    let pinned = format!("{}@{}", c.image(), c.digest);

    // The Pod's own secret.
    let a = admit(&s, &pod("shop", &c.image(), &["regcred"])).await;
    assert!(a.allowed, "{}", a.message);
    assert_eq!(a.object["spec"]["containers"][0]["image"], pinned.as_str());
    // A workload's template secret; a wrong one first is passed over.
    let a = admit(
        &s,
        &deployment("shop", &c.image(), &["stale", "regcred"], None),
    )
    .await;
    assert!(a.allowed, "{}", a.message);
    assert_eq!(
        a.object["spec"]["template"]["spec"]["containers"][0]["image"],
        pinned.as_str()
    );
    // A workload naming no secret: its ServiceAccount's (default).
    let a = admit(&s, &deployment("shop", &c.image(), &[], None)).await;
    assert!(a.allowed, "{}", a.message);
    // A Pod naming none: the ServiceAccount admission plugin would already
    // have copied them in, so sigil does not add them: denied.
    let a = admit(&s, &pod("shop", &c.image(), &[])).await;
    assert!(!a.allowed);
    for want in [
        c.image().as_str(),
        "Pod shop/p",
        "registry refused access: 401",
        "tried anonymous",
        "imagePullSecret",
    ] {
        assert!(a.message.contains(want), "{want:?} missing: {}", a.message);
    }
    // A workload whose ServiceAccount has no secret: every source named.
    let a = admit(&s, &deployment("shop", &c.image(), &[], Some("builder"))).await;
    assert!(!a.allowed);
    assert!(
        a.message
            .contains("serviceaccount shop/builder held no credential for this registry"),
        "{}",
        a.message
    );
    // Only the stale secret: tried by name, then anonymous.
    let a = admit(&s, &pod("shop", &c.image(), &["stale"])).await;
    assert!(!a.allowed);
    assert!(
        a.message.contains("tried secret shop/stale, anonymous"),
        "{}",
        a.message
    );
    let logs = s.settled_logs().await;
    assert!(!a.message.contains("old-password") && !logs.contains("old-password"));
    assert!(!logs.contains(PASSWORD), "a credential reached the logs");
    assert!(
        s.counter(
            "sigil_registry_credential_lookups_total",
            &[("source", "secret")]
        )
        .await
            >= 1.0
    );
    assert!(
        s.counter(
            "sigil_registry_credential_lookups_total",
            &[("source", "serviceaccount")]
        )
        .await
            >= 1.0
    );
    assert_eq!(s.counter("sigil_pull_secrets_synced", &[]).await, 1.0);
}

#[tokio::test]
async fn namespaces_with_different_credentials_never_share_a_cached_answer() {
    let c = Cluster::start().await;
    let host = c.reg.host();
    c.put(
        &secrets("a"),
        pull_secret("a", "regcred", &host, USER, PASSWORD),
    );
    c.put(
        &secrets("b"),
        pull_secret("b", "regcred", &host, USER, "not-the-password"),
    );
    c.put(
        &secrets("c"),
        pull_secret("c", "regcred", &host, USER, PASSWORD),
    );
    let s = c.sigil().await;
    let a = admit(&s, &pod("a", &c.image(), &["regcred"])).await;
    assert!(a.allowed, "{}", a.message);
    // Same image, right after: namespace b's credential is refused, and the
    // answer learned with a's is not served to it.
    let b = admit(&s, &pod("b", &c.image(), &["regcred"])).await;
    assert!(!b.allowed, "cross-namespace cache hit: {b:?}");
    assert!(
        b.message.contains("tried secret b/regcred, anonymous"),
        "{}",
        b.message
    );
    // Namespace c holds the same credential as a: it shares a's cached answer.
    let loads = s
        .counter("sigil_digest_cache_lookups_total", &[("result", "miss")])
        .await;
    let cc = admit(&s, &pod("c", &c.image(), &["regcred"])).await;
    assert!(cc.allowed, "{}", cc.message);
    assert_eq!(
        s.counter("sigil_digest_cache_lookups_total", &[("result", "miss")])
            .await,
        loads,
        "the same credential in another namespace is the same cache identity"
    );
}

#[tokio::test]
async fn secrets_created_or_rotated_after_start_take_effect_within_a_second() {
    let c = Cluster::start().await;
    let host = c.reg.host();
    let s = c.sigil().await;
    let r = pod("late", &c.image(), &["regcred"]);
    assert!(!admit(&s, &r).await.allowed);
    c.put(
        &secrets("late"),
        pull_secret("late", "regcred", &host, USER, PASSWORD),
    );
    let started = Instant::now();
    loop {
        let a = admit(&s, &r).await;
        if a.allowed {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "new Secret not used after 1 s: {}",
            a.message
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    // Rotated to a wrong password: the new credential is a new identity, so
    // nothing cached under the old one answers for it.
    c.put(
        &secrets("late"),
        pull_secret("late", "regcred", &host, USER, "rotated-wrong"),
    );
    let started = Instant::now();
    loop {
        let a = admit(&s, &r).await;
        if !a.allowed {
            assert!(
                a.message.contains("tried secret late/regcred"),
                "{}",
                a.message
            );
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "rotation not seen after 1 s"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    // Deleted: gone from memory too.
    c.kube
        .state
        .lock()
        .unwrap()
        .remove(&secrets("late"), "regcred");
    let started = Instant::now();
    loop {
        let a = admit(&s, &r).await;
        if a.message.contains("secret late/regcred held no credential") {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "deletion not seen: {}",
            a.message
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

#[tokio::test]
async fn watches_survive_compaction_and_readiness_waits_for_the_first_sync() {
    let c = Cluster::start().await;
    let host = c.reg.host();
    c.put(
        &secrets("shop"),
        pull_secret("shop", "regcred", &host, USER, PASSWORD),
    );
    let s = c.sigil().await;
    // Ready implies synced: the Secret present at start is already known.
    assert!(
        admit(&s, &pod("shop", &c.image(), &["regcred"]))
            .await
            .allowed
    );
    // History compacted (410 Gone on re-watch): the watcher relists, and a
    // Secret created meanwhile is seen.
    c.kube.state.lock().unwrap().compact();
    c.put(
        &secrets("other"),
        pull_secret("other", "regcred", &host, USER, PASSWORD),
    );
    let started = Instant::now();
    while !admit(&s, &pod("other", &c.image(), &["regcred"]))
        .await
        .allowed
    {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "not seen after compaction"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let lists = c
        .kube
        .requests()
        .iter()
        .filter(|(m, p, _)| m == "GET" && p == "/api/v1/secrets")
        .count();
    assert!(
        lists >= 2,
        "the watcher should have listed and watched secrets: {lists}"
    );
}

/// `sigil pin` with node-level credentials only: a docker config whose
/// `credsStore` is a credential helper, and a credential-provider plugin
/// whose answers are cached by registry (counted by its invocations).
#[tokio::test]
async fn credential_helpers_and_provider_plugins_speak_the_real_protocols() {
    let reg = TestRegistry::start(Mode::Htpasswd {
        user: USER,
        password: PASSWORD,
    })
    .await;
    let host = reg.host();
    for tag in ["v1", "v2"] {
        reg.push_image("team/app", tag).await;
    }
    let dir = tempfile::tempdir().unwrap();
    let script = |name: &str, body: String| {
        let p = dir.path().join(name);
        std::fs::write(&p, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    };
    let runs = dir.path().join("runs");
    script(
        "ecr-like-provider",
        format!(
            r#"cat > /dev/null; echo run >> "{}"; printf '{{"apiVersion":"credentialprovider.kubelet.k8s.io/v1","kind":"CredentialProviderResponse","cacheKeyType":"Registry","cacheDuration":"5m","auth":{{"{host}":{{"username":"{USER}","password":"{PASSWORD}"}}}}}}'"#,
            runs.display()
        ),
    );
    std::fs::write(
        dir.path().join("providers.yaml"),
        format!("apiVersion: kubelet.config.k8s.io/v1\nkind: CredentialProviderConfig\nproviders:\n- name: ecr-like-provider\n  matchImages: [\"{host}\"]\n  defaultCacheDuration: 1m\n  apiVersion: credentialprovider.kubelet.k8s.io/v1\n"),
    )
    .unwrap();
    std::fs::write(dir.path().join("policy.yaml"), policy(&host)).unwrap();
    let manifest = format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: p, namespace: shop}}\nspec:\n  containers:\n  - {{name: a, image: {host}/team/app:v1}}\n  - {{name: b, image: {host}/team/app:v2}}\n"
    );
    let pin = |extra: &[&str], path: &str| {
        let mut cmd = std::process::Command::new(bin());
        cmd.args(["pin", "--check", "--output", "json", "--policy"])
            .arg(dir.path().join("policy.yaml"))
            .args(extra)
            .arg("-")
            .env("PATH", format!("{}:{path}", dir.path().display()));
        crate::support::sigil::run_bounded(&mut cmd, Some(&manifest))
    };
    let system_path = std::env::var("PATH").unwrap_or_default();
    // No credentials at all: refused, naming what was tried.
    let out = pin(&[], &system_path);
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["denied"], 2, "{report:#}");
    // The provider plugin: run once for both images (cacheKeyType Registry).
    let providers = dir.path().join("providers.yaml");
    let out = pin(
        &[
            "--image-credential-provider-config",
            providers.to_str().unwrap(),
            "--image-credential-provider-bin-dir",
            dir.path().to_str().unwrap(),
        ],
        &system_path,
    );
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        report["denied"],
        0,
        "{report:#} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(report["checkFailures"], 2, "not pinned yet, but resolvable");
    assert_eq!(std::fs::read_to_string(&runs).unwrap().lines().count(), 1);
    // A docker config whose credsStore is a helper on PATH.
    script(
        "docker-credential-testhelper",
        format!(
            r#"read server; printf '{{"ServerURL":"%s","Username":"{USER}","Secret":"{PASSWORD}"}}' "$server""#
        ),
    );
    let cfg = dir.path().join("config.json");
    std::fs::write(&cfg, r#"{"auths":{},"credsStore":"testhelper"}"#).unwrap();
    let out = pin(&["--docker-config", cfg.to_str().unwrap()], &system_path);
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        report["denied"],
        0,
        "{report:#} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // A helper that hangs is cut off, and named in the denial.
    script("docker-credential-testhelper", "sleep 60".into());
    let started = Instant::now();
    let out = pin(&["--docker-config", cfg.to_str().unwrap()], &system_path);
    assert!(started.elapsed() < Duration::from_secs(30));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["denied"], 2);
    let msg = report["files"][0]["images"][0]["message"].as_str().unwrap();
    assert!(
        msg.contains("could not ask") && msg.contains("no answer within"),
        "{msg}"
    );
}

/// The same through a token service (Bearer challenge): the token a
/// namespace's secret obtains is never sent on behalf of another namespace.
#[tokio::test]
async fn token_service_registries_use_each_namespaces_own_secret() {
    let (_ts, reg) = crate::support::token::token_registry("robot", "t0ken-pa55", "tok/app").await;
    let host = reg.host();
    let digest = reg.push_image("tok/app", "v1").await;
    let kube = FakeKube::start().await;
    let put = |ns: &str, password: &str| {
        kube.state.lock().unwrap().insert(
            &secrets(ns),
            pull_secret(ns, "regcred", &host, "robot", password),
        );
    };
    put("good", "t0ken-pa55");
    put("bad", "wrong");
    let s = Sigil::start_env(Some(&policy(&host)), &["--pull-secrets"], &kube.env()).await;
    let image = format!("{host}/tok/app:v1");
    let a = admit(&s, &pod("good", &image, &["regcred"])).await;
    assert!(a.allowed, "{}", a.message);
    assert_eq!(
        a.object["spec"]["containers"][0]["image"],
        format!("{image}@{digest}").as_str()
    );
    let b = admit(&s, &pod("bad", &image, &["regcred"])).await;
    assert!(!b.allowed, "another namespace's token was reused");
    assert!(b.message.contains("token service refused"), "{}", b.message);
    assert!(
        b.message.contains("tried secret bad/regcred, anonymous"),
        "{}",
        b.message
    );
}

/// RBAC that does not allow listing Secrets: never Ready (so never
/// registered, never sent traffic), and the log says which permission.
#[tokio::test]
async fn a_watch_refused_by_rbac_keeps_sigil_unready_and_names_the_permission() {
    let kube = FakeKube::start().await;
    kube.state
        .lock()
        .unwrap()
        .forbidden
        .push("/api/v1/secrets".into());
    let s = Sigil::spawn_env(Some(&policy("r.example")), &["--pull-secrets"], &kube.env()).await;
    let started = Instant::now();
    while !s.logs().contains("may not list/watch secrets") {
        assert!(started.elapsed() < Duration::from_secs(10), "{}", s.logs());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let r = reqwest::get(format!("http://{}/readyz", s.admin))
        .await
        .unwrap();
    assert_eq!(r.status(), 503);
    assert!(r.text().await.unwrap().contains("pull-secret watches"));
    assert!(s.logs().contains("grant list and watch on secrets"));
}

/// An HTTPS registry whose Bearer challenge names a plain-HTTP realm: sigil
/// never sends the credentials there (the token service sees no request),
/// and the denial says why.
#[tokio::test]
async fn basic_credentials_are_never_sent_to_a_plain_http_realm_of_an_https_registry() {
    use crate::support::registry::{Mode, TestRegistry};
    use crate::support::token::TokenServer;
    let ts = TokenServer::start("robot", "t0ken-pa55").await;
    let mut reg = TestRegistry::start(Mode::TlsToken {
        realm: format!("http://{}/token", ts.addr),
        cert_pem: ts.cert_pem.clone(),
    })
    .await;
    reg.bearer = Some(ts.push_token("tok/app"));
    let host = reg.host();
    reg.push_image("tok/app", "v1").await;
    let hits_before = ts.hits.load(std::sync::atomic::Ordering::SeqCst);
    let dir = tempfile::tempdir().unwrap();
    let (ca, pw) = (dir.path().join("ca.pem"), dir.path().join("password"));
    std::fs::write(&ca, reg.ca_pem.clone().unwrap()).unwrap();
    std::fs::write(&pw, "t0ken-pa55").unwrap();
    let policy = format!(
        "apiVersion: sigil.dev/v1alpha1\nkind: ImagePolicy\nspec:\n  registries:\n    - host: \"{host}\"\n      ca: {}\n      auth: {{username: robot, passwordFile: {}}}\n  rules:\n    - {{name: all, match: [\"**\"], mode: enforce}}\n",
        ca.display(),
        pw.display()
    );
    let s = Sigil::start(Some(&policy), &[]).await;
    let a = admit(&s, &pod("shop", &format!("{host}/tok/app:v1"), &[])).await;
    assert!(!a.allowed);
    assert!(
        a.message
            .contains("is not HTTPS; sigil does not send credentials there"),
        "{}",
        a.message
    );
    assert_eq!(
        ts.hits.load(std::sync::atomic::Ordering::SeqCst),
        hits_before,
        "the token service was called"
    );
}
