//! A real Kubernetes control plane for tests, envtest-style: etcd and
//! kube-apiserver (v1.36 as CI runs them) started on free loopback ports
//! with a fresh PKI, an admin client, ServiceAccount kubeconfigs from the
//! TokenRequest API, and server-side apply of rendered manifests.
//!
//! The binaries come from one directory named by `SIGIL_KUBE_ASSETS`
//! (`kube-apiserver`, and `etcd` there or on `PATH`), as controller-runtime's
//! envtest takes `KUBEBUILDER_ASSETS`: `.ci/run` unpacks them, and a user
//! points the variable at their own (`setup-envtest` assets have this layout). Without
//! it [`assets`] says why, and each real-API test reports itself skipped.
//! Every process is stopped by PID when the [`RealKube`] is dropped, and
//! each runs under a watchdog that stops it when the test process is gone
//! (a panicking or killed test binary leaves nothing running). It does not
//! start kubelets: there are no nodes, Pods stay Pending, which is all an
//! admission webhook needs.

mod boot;

pub use boot::NodeLayout;
pub(crate) use boot::spawn_watched;

use boot::{Credential, kubeconfig};
use std::collections::HashMap;
use std::path::PathBuf;
use std::process::{Child, Command};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

/// The variable that names the assets directory.
pub const ASSETS: &str = "SIGIL_KUBE_ASSETS";

/// The assets directory with a runnable `kube-apiserver`, and the `etcd`
/// to use, or why there is none.
pub fn assets() -> Result<(PathBuf, PathBuf), String> {
    let dir = std::env::var_os(ASSETS).map(PathBuf::from).ok_or_else(|| {
        format!(
            "{ASSETS} is not set (a directory with kube-apiserver, and etcd there or on PATH; .ci/run sets it)"
        )
    })?;
    let apiserver = dir.join("kube-apiserver");
    if !apiserver.is_file() {
        return Err(format!(
            "{ASSETS}={}: no kube-apiserver there",
            dir.display()
        ));
    }
    let etcd = [dir.join("etcd")]
        .into_iter()
        .chain(crate::registry::which("etcd"))
        .find(|p| p.is_file())
        .ok_or_else(|| {
            format!(
                "no etcd in {} or on PATH (Debian: etcd-server)",
                dir.display()
            )
        })?;
    Ok((dir, etcd))
}

/// The assets, or `None` after printing that the calling test is skipped
/// and why (the closing lines of the test command count these).
pub fn assets_or_skip(test: &str) -> Option<(PathBuf, PathBuf)> {
    match assets() {
        Ok(a) => Some(a),
        Err(why) => {
            eprintln!("SKIPPED real_kube::{test}: {why}");
            None
        }
    }
}

/// A running etcd + kube-apiserver.
pub struct RealKube {
    /// `https://127.0.0.1:PORT`.
    pub url: String,
    /// The cluster CA (PEM): what the API server's certificate chains to.
    pub ca_pem: String,
    dir: tempfile::TempDir,
    /// The admin client certificate and key (PEM), for kubeconfigs.
    admin_pem: (String, String),
    procs: Mutex<Vec<Child>>,
    /// How each process was started (program, flags, log): a restart
    /// reuses it.
    commands: Mutex<Vec<(PathBuf, Vec<String>, String)>>,
    admin: reqwest::Client,
    discovery: Mutex<HashMap<String, Vec<Value>>>,
}

impl Drop for RealKube {
    fn drop(&mut self) {
        let mut procs = self.procs.lock().unwrap_or_else(|e| e.into_inner());
        // The API server first, etcd last.
        for c in procs.iter_mut().rev() {
            let _ = Command::new("kill")
                .args(["-TERM", &c.id().to_string()])
                .status();
            let until = Instant::now() + Duration::from_secs(10);
            while Instant::now() < until && matches!(c.try_wait(), Ok(None)) {
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl RealKube {
    /// The last lines of the control plane's logs (controller-manager,
    /// scheduler, API server, etcd).
    pub fn logs(&self) -> String {
        // The API server's boot-time warnings about its own requests say
        // nothing about a failure and would fill the tail.
        let tail = |name: &str| {
            let text = std::fs::read_to_string(self.dir.path().join(name)).unwrap_or_default();
            let lines: Vec<&str> = text
                .lines()
                .filter(|l| !l.contains("before server is ready"))
                .collect();
            lines[lines.len().saturating_sub(40)..].join("\n")
        };
        let mut out = String::new();
        for name in [
            "kube-controller-manager.log",
            "kube-scheduler.log",
            "kube-apiserver.log",
            "etcd.log",
        ] {
            if self.dir.path().join(name).exists() {
                out.push_str(&format!("--- {name} ---\n{}\n", tail(name)));
            }
        }
        out
    }

    /// The API server's whole log so far.
    pub fn apiserver_log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("kube-apiserver.log")).unwrap_or_default()
    }

    /// GET `path` as admin, as text (`/metrics`): (status, body).
    pub async fn get_text(&self, path: &str) -> (u16, String) {
        let resp = self
            .admin
            .get(format!("{}{path}", self.url))
            .send()
            .await
            .unwrap_or_else(|e| panic!("GET {path}: {e}"));
        (
            resp.status().as_u16(),
            resp.text().await.unwrap_or_default(),
        )
    }

    /// A request as cluster admin: `method path` with a JSON `body` (a
    /// JSON merge patch for PATCH); (status, answer).
    pub async fn request(&self, method: &str, path: &str, body: Option<&Value>) -> (u16, Value) {
        let mut req = self
            .admin
            .request(method.parse().unwrap(), format!("{}{path}", self.url));
        if let Some(b) = body {
            let content_type = if method == "PATCH" {
                "application/merge-patch+json"
            } else {
                "application/json"
            };
            req = req
                .header("content-type", content_type)
                .body(serde_json::to_vec(b).unwrap());
        }
        let resp = req
            .send()
            .await
            .unwrap_or_else(|e| panic!("{method} {path}: {e}"));
        answer(resp).await
    }

    /// GET `path` as admin: the object, or `None` on 404.
    pub async fn get(&self, path: &str) -> Option<Value> {
        match self.request("GET", path, None).await {
            (200, v) => Some(v),
            (404, _) => None,
            (s, v) => panic!("GET {path}: {s} {v}"),
        }
    }

    /// The API resources of `api_version` (discovery, cached).
    async fn resources(&self, api_version: &str) -> Vec<Value> {
        if let Some(r) = self.discovery.lock().unwrap().get(api_version) {
            return r.clone();
        }
        let path = if api_version.contains('/') {
            format!("/apis/{api_version}")
        } else {
            format!("/api/{api_version}")
        };
        let until = Instant::now() + Duration::from_secs(30);
        let list = loop {
            // A CRD's kinds are served a moment after it is Established.
            match self.request("GET", &path, None).await {
                (200, v) => break v["resources"].as_array().cloned().unwrap_or_default(),
                (s, v) => assert!(Instant::now() < until, "discovery {path}: {s} {v}"),
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
        self.discovery
            .lock()
            .unwrap()
            .insert(api_version.to_owned(), list.clone());
        list
    }

    /// Where `obj` lives: its collection's path (by discovery).
    pub async fn collection(&self, obj: &Value) -> String {
        let api = obj["apiVersion"].as_str().unwrap();
        let kind = obj["kind"].as_str().unwrap();
        let r = self
            .resources(api)
            .await
            .into_iter()
            .find(|r| r["kind"] == kind && !r["name"].as_str().unwrap_or("/").contains('/'))
            .unwrap_or_else(|| panic!("the API server serves no {kind} in {api}"));
        let base = if api.contains('/') {
            format!("/apis/{api}")
        } else {
            format!("/api/{api}")
        };
        let plural = r["name"].as_str().unwrap();
        match (
            r["namespaced"].as_bool(),
            obj["metadata"]["namespace"].as_str(),
        ) {
            (Some(true), Some(ns)) => format!("{base}/namespaces/{ns}/{plural}"),
            (Some(true), None) => format!("{base}/namespaces/default/{plural}"),
            _ => format!("{base}/{plural}"),
        }
    }

    /// Server-side applies `objects` as `kubectl apply --server-side` would:
    /// CRDs first (waiting until they are Established), then the rest.
    /// Panics naming the object the API server refused.
    pub async fn apply(&self, objects: &[Value]) {
        let (crds, rest): (Vec<&Value>, Vec<&Value>) = objects
            .iter()
            .partition(|o| o["kind"] == "CustomResourceDefinition");
        for o in &crds {
            self.apply_one(o).await;
        }
        for o in &crds {
            let name = o["metadata"]["name"].as_str().unwrap();
            let path = format!("/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}");
            let until = Instant::now() + Duration::from_secs(30);
            loop {
                let established = self.get(&path).await.is_some_and(|c| {
                    c["status"]["conditions"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .any(|c| c["type"] == "Established" && c["status"] == "True")
                });
                if established {
                    break;
                }
                assert!(Instant::now() < until, "CRD {name} never Established");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        // Namespaces before what lives in them.
        let (namespaces, rest): (Vec<&Value>, Vec<&Value>) =
            rest.into_iter().partition(|o| o["kind"] == "Namespace");
        for o in namespaces.into_iter().chain(rest) {
            self.apply_one(o).await;
        }
    }

    async fn apply_one(&self, obj: &Value) {
        let coll = self.collection(obj).await;
        let name = obj["metadata"]["name"].as_str().unwrap();
        // Strict: a field the schema does not know is an error, not pruned.
        let path =
            format!("{coll}/{name}?fieldManager=sigil-tests&force=true&fieldValidation=Strict");
        let resp = self
            .admin
            .patch(format!("{}{path}", self.url))
            .header("content-type", "application/apply-patch+yaml")
            .body(serde_json::to_vec(obj).unwrap())
            .send()
            .await
            .unwrap();
        let status = resp.status();
        if !status.is_success() {
            let body = resp.text().await.unwrap_or_default();
            panic!(
                "applying {} {name}: {status} {body}",
                obj["kind"].as_str().unwrap_or_default()
            );
        }
    }

    /// Creates the Namespaces `names` (as admin).
    pub async fn namespaces(&self, names: &[&str]) {
        let objects: Vec<Value> = names
            .iter()
            .map(|n| json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": n}}))
            .collect();
        self.apply(&objects).await;
    }

    /// A kubeconfig for the ServiceAccount `namespace/name` (which must
    /// exist), with a token from the TokenRequest API (an hour): RBAC
    /// applies to what a process started with it does.
    pub async fn service_account_kubeconfig(&self, namespace: &str, name: &str) -> PathBuf {
        let token = self.service_account_token(namespace, name).await;
        let path = self
            .dir
            .path()
            .join(format!("kubeconfig-{namespace}-{name}"));
        std::fs::write(
            &path,
            kubeconfig(
                &self.url,
                &self.ca_pem,
                name,
                Credential::Token {
                    token: &token,
                    namespace,
                },
            ),
        )
        .unwrap();
        path
    }

    /// A kubeconfig for the cluster admin (`system:masters`): what an
    /// operator's `kubectl` and `sigil break-glass` run with.
    pub fn admin_kubeconfig(&self) -> PathBuf {
        let path = self.dir.path().join("kubeconfig-admin");
        std::fs::write(
            &path,
            kubeconfig(
                &self.url,
                &self.ca_pem,
                "admin",
                Credential::Client {
                    cert: &self.admin_pem.0,
                    key: &self.admin_pem.1,
                },
            ),
        )
        .unwrap();
        path
    }

    /// A token for the ServiceAccount `namespace/name` (TokenRequest, an hour).
    pub async fn service_account_token(&self, namespace: &str, name: &str) -> String {
        let (status, v) = self
            .request(
                "POST",
                &format!("/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token"),
                Some(
                    &json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                             "spec": {"expirationSeconds": 3600}}),
                ),
            )
            .await;
        assert_eq!(status, 201, "TokenRequest for {namespace}/{name}: {v}");
        v["status"]["token"].as_str().unwrap().to_owned()
    }

    /// A client that trusts the API server's CA and sends no credential of
    /// its own (the caller adds a token).
    fn client_trusting_ca(&self) -> reqwest::Client {
        reqwest::Client::builder()
            .tls_certs_only([reqwest::Certificate::from_pem(self.ca_pem.as_bytes()).unwrap()])
            .build()
            .unwrap()
    }

    /// GET `path` as the identity `token` holds (a ServiceAccount's):
    /// (status, answer) — what RBAC really lets it read.
    pub async fn get_as(&self, token: &str, path: &str) -> (u16, Value) {
        let resp = self
            .client_trusting_ca()
            .get(format!("{}{path}", self.url))
            .bearer_auth(token)
            .send()
            .await
            .unwrap_or_else(|e| panic!("GET {path}: {e}"));
        answer(resp).await
    }

    /// What `token` may do in `namespace`: the API
    /// server's own SelfSubjectRulesReview, asked as that identity.
    pub async fn rules_review(&self, token: &str, namespace: &str) -> Value {
        let resp = self
            .client_trusting_ca()
            .post(format!(
                "{}/apis/authorization.k8s.io/v1/selfsubjectrulesreviews",
                self.url
            ))
            .bearer_auth(token)
            .header("content-type", "application/json")
            .body(
                serde_json::to_vec(&json!({"apiVersion": "authorization.k8s.io/v1",
                    "kind": "SelfSubjectRulesReview", "spec": {"namespace": namespace}}))
                .unwrap(),
            )
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 201, "SelfSubjectRulesReview");
        serde_json::from_slice(&resp.bytes().await.unwrap()).unwrap()
    }
}

/// An API answer: (status, JSON body or `Null`).
async fn answer(resp: reqwest::Response) -> (u16, Value) {
    let status = resp.status().as_u16();
    let bytes = resp.bytes().await.unwrap_or_default();
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}
