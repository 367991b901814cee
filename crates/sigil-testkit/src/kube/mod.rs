//! A stand-in for kube-apiserver, on 127.0.0.1 (kube-apiserver cannot be
//! installed here), close enough to the real protocol that kube-rs and
//! kube-runtime run against it unchanged.
//!
//! `route` reads paths (core and API groups, namespaced and cluster-scoped,
//! subresources) and selectors; `store` holds objects and implements the
//! verbs (get, list with `limit`/`continue`, create, replace with
//! resourceVersion preconditions, merge and JSON patches, delete, the
//! status subresource, `generation`); `watch` serves watches with bookmarks
//! and 410 Gone after [`State::compact`]. This module serves HTTP: bearer
//! auth (401), RBAC refusals a test configures (403), and on every write of
//! a MutatingWebhookConfiguration a probe of a configured URL (sigil's
//! `/readyz`), so a test can prove registration never happens before Ready.
//! The admission side of kube-apiserver is [`crate::sigil::ApiServer`],
//! pointed at what is registered here by [`FakeKube::webhook_client`].

mod rbac;
pub mod real;
mod route;
mod store;
mod validation;
mod watch;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};

pub use rbac::{Attributes, User, attributes};
pub use route::{Route, classify};
pub use store::{State, now_rfc3339};

pub const TOKEN: &str = "fake-kube-token";
const MWC: &str = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations";

pub struct FakeKube {
    pub addr: SocketAddr,
    pub state: Arc<Mutex<State>>,
    pub kubeconfig: PathBuf,
    _dir: tempfile::TempDir,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for FakeKube {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl FakeKube {
    /// Starts empty but for the Namespace `sigil-system`.
    pub async fn start() -> FakeKube {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let state = Arc::new(Mutex::new(State::default()));
        state.lock().unwrap().insert(
            "/api/v1/namespaces",
            json!({"apiVersion": "v1", "kind": "Namespace",
                   "metadata": {"name": "sigil-system", "labels": {"kubernetes.io/metadata.name": "sigil-system"}}}),
        );
        let st = state.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = l.accept().await else {
                    return;
                };
                let st = st.clone();
                tokio::spawn(async move {
                    let svc = service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                        let st = st.clone();
                        async move { Ok::<_, Infallible>(serve(req, st).await) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(tcp), svc)
                        .await;
                });
            }
        });
        let dir = tempfile::tempdir().unwrap();
        let kubeconfig = dir.path().join("kubeconfig");
        std::fs::write(
            &kubeconfig,
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: http://{addr}\nusers:\n- name: sigil\n  user:\n    token: {TOKEN}\ncontexts:\n- name: fake\n  context:\n    cluster: fake\n    user: sigil\n    namespace: sigil-system\ncurrent-context: fake\n"
            ),
        )
        .unwrap();
        FakeKube {
            addr,
            state,
            kubeconfig,
            _dir: dir,
            task,
        }
    }

    pub fn env(&self) -> Vec<(String, String)> {
        vec![("KUBECONFIG".into(), self.kubeconfig.display().to_string())]
    }

    pub fn webhook_configuration(&self, name: &str) -> Option<Value> {
        self.state.lock().unwrap().get(MWC, name)
    }

    pub fn get(&self, collection: &str, name: &str) -> Option<Value> {
        self.state.lock().unwrap().get(collection, name)
    }

    pub fn requests(&self) -> Vec<(String, String, u16)> {
        self.state.lock().unwrap().log.clone()
    }

    /// Waits (bounded) until `cond` holds for the named webhook configuration.
    pub async fn wait_config(
        &self,
        name: &str,
        limit: std::time::Duration,
        cond: impl Fn(Option<&Value>) -> bool,
    ) -> Option<Value> {
        let until = std::time::Instant::now() + limit;
        loop {
            let c = self.webhook_configuration(name);
            if cond(c.as_ref()) {
                return c;
            }
            assert!(
                std::time::Instant::now() < until,
                "webhook configuration {name} never reached the expected state; now: {c:#?}"
            );
            tokio::time::sleep(std::time::Duration::from_millis(25)).await;
        }
    }

    /// A kube-apiserver-like admission client for what is registered now:
    /// the configuration's URL, trusting exactly its caBundle.
    pub fn webhook_client(&self, name: &str) -> crate::sigil::ApiServer {
        use base64::Engine as _;
        let c = self
            .webhook_configuration(name)
            .expect("no webhook configuration registered");
        let cc = &c["webhooks"][0]["clientConfig"];
        let ca = base64::engine::general_purpose::STANDARD
            .decode(cc["caBundle"].as_str().expect("caBundle"))
            .unwrap();
        let mut builder = reqwest::Client::builder();
        let certs = reqwest::Certificate::from_pem_bundle(&ca).expect("caBundle is PEM");
        builder = builder.tls_certs_only(certs);
        crate::sigil::ApiServer {
            client: builder.build().unwrap(),
            url: cc["url"].as_str().expect("clientConfig.url").to_owned(),
        }
    }
}

pub(crate) type Body = http_body_util::combinators::BoxBody<Bytes, Infallible>;

async fn serve(
    req: hyper::Request<hyper::body::Incoming>,
    st: Arc<Mutex<State>>,
) -> hyper::Response<Body> {
    let method = req.method().to_string();
    let path = req.uri().path().to_owned();
    let query = req.uri().query().unwrap_or_default().to_owned();
    let content_type = req
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let bearer = req
        .headers()
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or_default()
        .to_owned();
    let user = st.lock().unwrap().authenticate(&bearer);
    let authed = user.is_some();
    let body = req
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    // Probe readiness *before* a webhook configuration write is stored, so
    // the result is recorded by the time the object can be seen.
    let writes_mwc = authed
        && matches!(method.as_str(), "POST" | "PUT")
        && path.contains("/mutatingwebhookconfigurations");
    let probe = if writes_mwc {
        st.lock().unwrap().probe.clone()
    } else {
        None
    };
    if let Some(url) = probe {
        let got = match reqwest::get(&url).await {
            Ok(r) => r.status().as_u16(),
            Err(_) => 0,
        };
        st.lock().unwrap().probe_results.push(got);
    }
    let refused = st
        .lock()
        .unwrap()
        .forbidden
        .iter()
        .any(|p| path.starts_with(p.as_str()));
    if authed && refused {
        let (code, v) = store::status(
            403,
            "Forbidden",
            format!(
                "{path} is forbidden: User \"system:serviceaccount:sigil-system:sigil\" cannot list the resource at the cluster scope"
            ),
        );
        st.lock().unwrap().log.push((method, path, code));
        return hyper::Response::builder()
            .status(code)
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(v.to_string())).boxed())
            .unwrap();
    }
    // RBAC, as kube-apiserver's authorizer decides it (the admin token is
    // in system:masters and passes).
    if let Some(user) = &user {
        let attrs = rbac::attributes(&method, &path, &query);
        let mut st = st.lock().unwrap();
        if !st.authorize(user, &attrs) {
            let (code, v) = rbac::forbidden(user, &attrs);
            st.denied
                .push(v["message"].as_str().unwrap_or_default().to_owned());
            st.log.push((method, path, code));
            return hyper::Response::builder()
                .status(code)
                .header("content-type", "application/json")
                .body(Full::new(Bytes::from(v.to_string())).boxed())
                .unwrap();
        }
    }
    let is_watch = matches!(
        route::query_param(&query, "watch").as_deref(),
        Some("true") | Some("1")
    );
    if authed
        && method == "GET"
        && is_watch
        && let Some(Route {
            coll,
            name: None,
            resource,
            ..
        }) = classify(&path)
    {
        st.lock().unwrap().log.push((method, path, 200));
        return watch::watch(st, coll, resource, &query);
    }
    let (code, v) = if authed {
        st.lock()
            .unwrap()
            .handle(&method, &path, &query, &content_type, &body)
    } else {
        store::status(401, "Unauthorized", "Unauthorized".into())
    };
    st.lock().unwrap().log.push((method, path, code));
    hyper::Response::builder()
        .status(code)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(v.to_string())).boxed())
        .unwrap()
}

impl FakeKube {
    /// A kubeconfig that authenticates as the ServiceAccount `namespace/name`
    /// (its token works while the ServiceAccount object exists), so RBAC
    /// applies to what a process started with it does.
    pub fn service_account_kubeconfig(&self, namespace: &str, name: &str) -> PathBuf {
        let token = format!("sa-{namespace}-{name}-{}", crate::registry::uniq());
        self.state
            .lock()
            .unwrap()
            .tokens
            .insert(token.clone(), User::service_account(namespace, name));
        let path = self
            ._dir
            .path()
            .join(format!("kubeconfig-{namespace}-{name}"));
        std::fs::write(
            &path,
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: http://{}\nusers:\n- name: {name}\n  user:\n    token: {token}\ncontexts:\n- name: fake\n  context:\n    cluster: fake\n    user: {name}\n    namespace: {namespace}\ncurrent-context: fake\n",
                self.addr
            ),
        )
        .unwrap();
        path
    }

    /// Where an object of this apiVersion/kind is stored: core kinds under
    /// `/api/v1`, others under `/apis/<group>/<version>`; cluster-scoped
    /// kinds (and custom kinds whose stored CRD says `Cluster`) without a
    /// namespace. The plural is the CRD's where one is stored, else the
    /// lower-cased kind made plural as Kubernetes' own kinds are.
    pub fn collection_for(&self, obj: &Value) -> String {
        let api = obj["apiVersion"].as_str().unwrap_or("v1");
        let kind = obj["kind"].as_str().unwrap_or_default();
        let base = if api.contains('/') {
            format!("/apis/{api}")
        } else {
            format!("/api/{api}")
        };
        let group = api.split_once('/').map(|(g, _)| g).unwrap_or_default();
        let crd = self
            .list("/apis/apiextensions.k8s.io/v1/customresourcedefinitions")
            .into_iter()
            .find(|c| c["spec"]["group"] == group && c["spec"]["names"]["kind"] == kind);
        let (plural, cluster) = match &crd {
            Some(c) => (
                c["spec"]["names"]["plural"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
                c["spec"]["scope"] == "Cluster",
            ),
            None => {
                let lower = kind.to_ascii_lowercase();
                let plural = if let Some(stem) = lower.strip_suffix('y') {
                    format!("{stem}ies")
                } else if lower.ends_with('s') {
                    format!("{lower}es")
                } else {
                    format!("{lower}s")
                };
                let cluster = route::CLUSTER_SCOPED.contains(&plural.as_str());
                (plural, cluster)
            }
        };
        match obj["metadata"]["namespace"].as_str() {
            Some(ns) if !cluster => format!("{base}/namespaces/{ns}/{plural}"),
            _ => format!("{base}/{plural}"),
        }
    }

    /// The CRDs of a policy report API (`wgpolicyk8s` or `openreports`),
    /// namespaced and cluster kinds: their group, names and scope, as a
    /// cluster that runs Policy Reporter or Kyverno has them (the stand-in
    /// checks no schema, so none is given; the upstream files are not copied).
    pub fn report_crds(api: &str) -> Vec<Value> {
        let (group, version, kinds) = match api {
            "openreports" => ("openreports.io", "v1alpha1", ["Report", "ClusterReport"]),
            _ => (
                "wgpolicyk8s.io",
                "v1alpha2",
                ["PolicyReport", "ClusterPolicyReport"],
            ),
        };
        kinds
            .iter()
            .map(|kind| {
                let plural = format!("{}s", kind.to_ascii_lowercase());
                json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
                    "metadata": {"name": format!("{plural}.{group}")},
                    "spec": {"group": group, "scope": if kind.starts_with("Cluster") { "Cluster" } else { "Namespaced" },
                        "names": {"kind": kind, "plural": plural, "singular": kind.to_ascii_lowercase(), "listKind": format!("{kind}List")},
                        "versions": [{"name": version, "served": true, "storage": true,
                            "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}]}})
            })
            .collect()
    }

    /// `kubectl apply` of rendered objects, as the admin (test setup).
    pub fn apply(&self, objects: &[Value]) {
        // CRDs first, so the kinds they define are stored where they belong.
        let (crds, rest): (Vec<&Value>, Vec<&Value>) = objects
            .iter()
            .partition(|o| o["kind"] == "CustomResourceDefinition");
        for o in crds.into_iter().chain(rest) {
            let coll = self.collection_for(o);
            self.insert(&coll, o.clone());
        }
    }

    /// Creates these Namespaces (test setup): as in a real cluster, nothing
    /// can be created in a namespace that does not exist.
    pub fn namespaces(&self, names: &[&str]) {
        for n in names {
            self.insert(
                "/api/v1/namespaces",
                json!({"apiVersion": "v1", "kind": "Namespace",
                       "metadata": {"name": n, "labels": {"kubernetes.io/metadata.name": n}}}),
            );
        }
    }

    /// The messages of every request RBAC refused so far.
    pub fn denied(&self) -> Vec<String> {
        self.state.lock().unwrap().denied.clone()
    }

    /// Stores an object (test setup), as [`State::insert`].
    pub fn insert(&self, collection: &str, obj: Value) {
        self.state.lock().unwrap().insert(collection, obj);
    }

    /// Deletes an object (test setup), as [`State::remove`]: watchers see it.
    pub fn remove(&self, collection: &str, name: &str) -> Option<Value> {
        self.state.lock().unwrap().remove(collection, name)
    }

    /// Every object of a collection (`*` for all namespaces).
    pub fn list(&self, collection: &str) -> Vec<Value> {
        self.state.lock().unwrap().list(collection)
    }
}
