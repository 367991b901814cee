//! A stand-in for kube-apiserver's REST storage, on 127.0.0.1, for the few
//! resources sigil writes (kube-apiserver cannot be installed here).
//!
//! It keeps the semantics sigil relies on: bearer-token auth, Status errors
//! (NotFound, AlreadyExists, Conflict), resourceVersion checks on PUT, label
//! selectors on list, uids. On every write of a MutatingWebhookConfiguration
//! it probes a configured URL (sigil's `/readyz`) and records the status, so
//! a test can prove registration never happens before Ready. The admission
//! side of kube-apiserver is [`crate::sigil::ApiServer`], pointed at what is
//! registered here by [`FakeKube::webhook_client`].

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};

pub const TOKEN: &str = "fake-kube-token";
const MWC: &str = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations";

#[derive(Default)]
pub struct State {
    /// collection path → name → object
    objects: BTreeMap<String, BTreeMap<String, Value>>,
    rv: u64,
    /// (method, path, status) of every request.
    pub log: Vec<(String, String, u16)>,
    /// GET this on every webhook configuration write, record the status.
    pub probe: Option<String>,
    pub probe_results: Vec<u16>,
}

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

fn status(code: u16, reason: &str, message: String) -> (u16, Value) {
    (
        code,
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
               "message": message, "reason": reason, "code": code}),
    )
}

/// (collection, name) for the paths this fake serves.
fn classify(path: &str) -> Option<(String, Option<String>)> {
    let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
    match segs.as_slice() {
        ["api", "v1", "namespaces"] => Some(("/api/v1/namespaces".into(), None)),
        ["api", "v1", "namespaces", ns] => {
            Some(("/api/v1/namespaces".into(), Some((*ns).to_owned())))
        }
        ["api", "v1", "namespaces", ns, res] => {
            Some((format!("/api/v1/namespaces/{ns}/{res}"), None))
        }
        ["api", "v1", "namespaces", ns, res, name] => Some((
            format!("/api/v1/namespaces/{ns}/{res}"),
            Some((*name).to_owned()),
        )),
        [
            "apis",
            "admissionregistration.k8s.io",
            "v1",
            "mutatingwebhookconfigurations",
        ] => Some((MWC.into(), None)),
        [
            "apis",
            "admissionregistration.k8s.io",
            "v1",
            "mutatingwebhookconfigurations",
            name,
        ] => Some((MWC.into(), Some((*name).to_owned()))),
        _ => None,
    }
}

fn selected(obj: &Value, selector: Option<&str>) -> bool {
    let Some(sel) = selector else { return true };
    sel.split(',').filter(|s| !s.is_empty()).all(|term| {
        let (k, v) = term.split_once('=').unwrap_or((term, ""));
        obj["metadata"]["labels"][k].as_str() == Some(v)
    })
}

fn query_param(q: &str, key: &str) -> Option<String> {
    q.split('&').find_map(|kv| {
        let (k, v) = kv.split_once('=')?;
        (k == key).then(|| {
            v.replace("%3D", "=")
                .replace("%2C", ",")
                .replace("%2F", "/")
        })
    })
}

impl State {
    fn bump(&mut self, obj: &mut Value) {
        self.rv += 1;
        obj["metadata"]["resourceVersion"] = json!(self.rv.to_string());
    }

    /// Puts an object straight into storage (test setup).
    pub fn insert(&mut self, collection: &str, mut obj: Value) {
        let name = obj["metadata"]["name"].as_str().unwrap().to_owned();
        if obj["metadata"]["uid"].is_null() {
            obj["metadata"]["uid"] = json!(format!("uid-{name}-{}", self.rv));
        }
        self.bump(&mut obj);
        self.objects
            .entry(collection.to_owned())
            .or_default()
            .insert(name, obj);
    }

    pub fn get(&self, collection: &str, name: &str) -> Option<Value> {
        self.objects.get(collection)?.get(name).cloned()
    }

    pub fn webhook_configuration(&self, name: &str) -> Option<Value> {
        self.get(MWC, name)
    }

    fn handle(&mut self, method: &str, path: &str, query: &str, body: &[u8]) -> (u16, Value) {
        let Some((coll, name)) = classify(path) else {
            return status(404, "NotFound", format!("the server could not find {path}"));
        };
        let parsed: Option<Value> = serde_json::from_slice(body).ok();
        let (code, v) = match (method, name) {
            ("GET", Some(n)) => match self.get(&coll, &n) {
                Some(o) => (200, o),
                None => status(404, "NotFound", format!("{coll} \"{n}\" not found")),
            },
            ("GET", None) => {
                let sel = query_param(query, "labelSelector");
                let items: Vec<Value> = self
                    .objects
                    .get(&coll)
                    .map(|m| {
                        m.values()
                            .filter(|o| selected(o, sel.as_deref()))
                            .cloned()
                            .collect()
                    })
                    .unwrap_or_default();
                (
                    200,
                    json!({"kind": "List", "apiVersion": "v1",
                           "metadata": {"resourceVersion": self.rv.to_string()}, "items": items}),
                )
            }
            ("POST", None) => {
                let Some(mut o) = parsed else {
                    return status(400, "BadRequest", "body is not JSON".into());
                };
                let n = o["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned();
                if self.get(&coll, &n).is_some() {
                    status(
                        409,
                        "AlreadyExists",
                        format!("{coll} \"{n}\" already exists"),
                    )
                } else {
                    o["metadata"]["uid"] = json!(format!("uid-{n}-{}", self.rv + 1));
                    o["metadata"]["creationTimestamp"] = json!("2026-11-22T00:00:00Z");
                    self.bump(&mut o);
                    self.objects
                        .entry(coll.clone())
                        .or_default()
                        .insert(n, o.clone());
                    (201, o)
                }
            }
            ("PUT", Some(n)) => {
                let Some(mut o) = parsed else {
                    return status(400, "BadRequest", "body is not JSON".into());
                };
                match self.get(&coll, &n) {
                    None => status(404, "NotFound", format!("{coll} \"{n}\" not found")),
                    Some(cur) => {
                        let want = o["metadata"]["resourceVersion"].as_str();
                        if want.is_some() && want != cur["metadata"]["resourceVersion"].as_str() {
                            status(
                                409,
                                "Conflict",
                                format!(
                                    "Operation cannot be fulfilled on {coll} \"{n}\": the object has been modified; please apply your changes to the latest version and try again"
                                ),
                            )
                        } else {
                            o["metadata"]["uid"] = cur["metadata"]["uid"].clone();
                            o["metadata"]["creationTimestamp"] =
                                cur["metadata"]["creationTimestamp"].clone();
                            self.bump(&mut o);
                            self.objects
                                .entry(coll.clone())
                                .or_default()
                                .insert(n, o.clone());
                            (200, o)
                        }
                    }
                }
            }
            ("DELETE", Some(n)) => match self.objects.get_mut(&coll).and_then(|m| m.remove(&n)) {
                Some(o) => (200, o),
                None => status(404, "NotFound", format!("{coll} \"{n}\" not found")),
            },
            (m, _) => status(405, "MethodNotAllowed", format!("{m} not supported here")),
        };
        (code, v)
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
        self.state.lock().unwrap().webhook_configuration(name)
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

async fn serve(
    req: hyper::Request<hyper::body::Incoming>,
    st: Arc<Mutex<State>>,
) -> hyper::Response<Full<Bytes>> {
    let method = req.method().to_string();
    let path = req.uri().path().to_owned();
    let query = req.uri().query().unwrap_or_default().to_owned();
    let authed = req
        .headers()
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        == Some(&format!("Bearer {TOKEN}"));
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
    let (code, v) = if authed {
        st.lock().unwrap().handle(&method, &path, &query, &body)
    } else {
        status(401, "Unauthorized", "Unauthorized".into())
    };
    st.lock().unwrap().log.push((method, path, code));
    hyper::Response::builder()
        .status(code)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(v.to_string())))
        .unwrap()
}
