//! A stand-in for kube-apiserver's REST storage, on 127.0.0.1, for the few
//! resources sigil writes (kube-apiserver cannot be installed here).
//!
//! It keeps the semantics sigil relies on: bearer-token auth, Status errors
//! (NotFound, AlreadyExists, Conflict), resourceVersion checks on PUT, label
//! and field selectors (`type`, `metadata.name`, `metadata.namespace`) on
//! list, cluster-wide lists (`/api/v1/secrets`), pagination with `limit` and
//! `continue`, and watches (`?watch=true`) from a resourceVersion with
//! ADDED/MODIFIED/DELETED events, BOOKMARKs, `timeoutSeconds`, and an
//! ERROR event carrying 410 Gone for a resourceVersion older than the last
//! compaction — enough for kube-runtime's watcher to run unchanged. On every write of a MutatingWebhookConfiguration
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
    /// Every change: (resourceVersion, collection, ADDED/MODIFIED/DELETED, object).
    events: Vec<(u64, String, &'static str, Value)>,
    /// Watches from a resourceVersion below this get 410 Gone.
    compacted: u64,
    /// Wakes open watches when an event is recorded.
    pub changed: Arc<tokio::sync::Notify>,
    /// Path prefixes the caller may not read (RBAC says no: 403 Forbidden).
    pub forbidden: Vec<String>,
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
        // Every namespace's objects of a kind (`/api/v1/secrets`).
        ["api", "v1", res] => Some((format!("/api/v1/namespaces/*/{res}"), None)),
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

/// Whether objects stored under `stored` belong to the requested `coll`
/// (`/api/v1/namespaces/*/secrets` covers every namespace).
fn in_collection(coll: &str, stored: &str) -> bool {
    match coll.split_once("/*/") {
        Some((prefix, res)) => {
            stored.starts_with(prefix)
                && stored.ends_with(&format!("/{res}"))
                && stored[prefix.len()..]
                    .trim_start_matches('/')
                    .split('/')
                    .count()
                    == 2
        }
        None => coll == stored,
    }
}

/// Field selectors kube-apiserver supports for the kinds served here:
/// `type` (Secrets), `metadata.name`, `metadata.namespace`; `=`, `==`, `!=`.
fn fields_match(obj: &Value, selector: Option<&str>) -> bool {
    let Some(sel) = selector else { return true };
    sel.split(',').filter(|s| !s.is_empty()).all(|term| {
        let (k, v, negate) = if let Some((k, v)) = term.split_once("!=") {
            (k, v, true)
        } else if let Some((k, v)) = term.split_once("==") {
            (k, v, false)
        } else {
            let (k, v) = term.split_once('=').unwrap_or((term, ""));
            (k, v, false)
        };
        let got = match k {
            "type" => obj["type"].as_str(),
            "metadata.name" => obj["metadata"]["name"].as_str(),
            "metadata.namespace" => obj["metadata"]["namespace"].as_str(),
            _ => return false,
        };
        (got.unwrap_or_default() == v) != negate
    })
}

fn query_param(q: &str, key: &str) -> Option<String> {
    q.split('&').find_map(|kv| {
        let (k, v) = kv.split_once('=')?;
        (k == key).then(|| {
            v.replace("%3D", "=")
                .replace("%21", "!")
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

    fn record(&mut self, coll: &str, kind: &'static str, obj: &Value) {
        self.events
            .push((self.rv, coll.to_owned(), kind, obj.clone()));
        self.changed.notify_waiters();
    }

    /// Forgets history: watches from an older resourceVersion get 410 Gone
    /// (what etcd compaction does), so clients must relist.
    pub fn compact(&mut self) {
        self.compacted = self.rv + 1;
        self.events.clear();
    }

    /// Deletes an object (test setup), recording the event.
    pub fn remove(&mut self, collection: &str, name: &str) -> Option<Value> {
        let mut o = self.objects.get_mut(collection)?.remove(name)?;
        self.bump(&mut o);
        self.record(collection, "DELETED", &o);
        Some(o)
    }

    /// Puts an object straight into storage (test setup).
    pub fn insert(&mut self, collection: &str, mut obj: Value) {
        let name = obj["metadata"]["name"].as_str().unwrap().to_owned();
        if obj["metadata"]["uid"].is_null() {
            obj["metadata"]["uid"] = json!(format!("uid-{name}-{}", self.rv));
        }
        self.bump(&mut obj);
        let existed = self
            .objects
            .get(collection)
            .is_some_and(|m| m.contains_key(&name));
        self.record(collection, if existed { "MODIFIED" } else { "ADDED" }, &obj);
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
                let fields = query_param(query, "fieldSelector");
                let items: Vec<Value> = self
                    .objects
                    .iter()
                    .filter(|(c, _)| in_collection(&coll, c))
                    .flat_map(|(_, m)| m.values())
                    .filter(|o| selected(o, sel.as_deref()) && fields_match(o, fields.as_deref()))
                    .cloned()
                    .collect();
                // Pagination: `continue` is the offset of the next page.
                let start: usize = query_param(query, "continue")
                    .and_then(|c| c.parse().ok())
                    .unwrap_or(0);
                let limit: usize = query_param(query, "limit")
                    .and_then(|l| l.parse().ok())
                    .filter(|l| *l > 0)
                    .unwrap_or(usize::MAX);
                let end = start.saturating_add(limit).min(items.len());
                let page: Vec<Value> = items
                    .get(start.min(items.len())..end)
                    .unwrap_or_default()
                    .to_vec();
                let mut meta = json!({"resourceVersion": self.rv.to_string()});
                if end < items.len() {
                    meta["continue"] = json!(end.to_string());
                    meta["remainingItemCount"] = json!(items.len() - end);
                }
                (
                    200,
                    json!({"kind": "List", "apiVersion": "v1", "metadata": meta, "items": page}),
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
                    self.record(&coll, "ADDED", &o);
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
                            self.record(&coll, "MODIFIED", &o);
                            self.objects
                                .entry(coll.clone())
                                .or_default()
                                .insert(n, o.clone());
                            (200, o)
                        }
                    }
                }
            }
            ("DELETE", Some(n)) => match self.remove(&coll, &n) {
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

type Body = http_body_util::combinators::BoxBody<Bytes, Infallible>;

/// Longest a watch stays open (the API server's own limit is minutes;
/// clients reconnect from the last resourceVersion either way).
const WATCH_MAX: std::time::Duration = std::time::Duration::from_secs(5);
/// How often an idle watch gets a BOOKMARK.
const BOOKMARK_EVERY: std::time::Duration = std::time::Duration::from_millis(500);

/// A `?watch=true` request: events after `resourceVersion`, as
/// newline-delimited JSON, until `timeoutSeconds` (at most [`WATCH_MAX`]).
fn watch(st: Arc<Mutex<State>>, coll: String, query: &str) -> hyper::Response<Body> {
    let from: Option<u64> = query_param(query, "resourceVersion")
        .filter(|r| !r.is_empty() && r != "0")
        .and_then(|r| r.parse().ok());
    let bookmarks = query_param(query, "allowWatchBookmarks").as_deref() == Some("true");
    let timeout = query_param(query, "timeoutSeconds")
        .and_then(|t| t.parse().ok())
        .map(std::time::Duration::from_secs)
        .unwrap_or(WATCH_MAX)
        .min(WATCH_MAX);
    let labels = query_param(query, "labelSelector");
    let fields = query_param(query, "fieldSelector");
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<hyper::body::Frame<Bytes>, Infallible>>(64);
    let line = |v: Value| Ok(hyper::body::Frame::data(Bytes::from(format!("{v}\n"))));
    tokio::spawn(async move {
        let until = tokio::time::Instant::now() + timeout;
        let (changed, mut cursor, gone) = {
            let s = st.lock().unwrap();
            let gone = from.is_some_and(|rv| rv < s.compacted);
            (s.changed.clone(), from.unwrap_or(0), gone)
        };
        if gone {
            let status = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": format!("too old resource version: {cursor} (compacted)"), "reason": "Expired", "code": 410});
            let _ = tx
                .send(line(json!({"type": "ERROR", "object": status})))
                .await;
            return;
        }
        if from.is_none() {
            // No resourceVersion: existing objects first, as synthetic ADDED events.
            let (items, rv) = {
                let s = st.lock().unwrap();
                let items: Vec<Value> = s
                    .objects
                    .iter()
                    .filter(|(c, _)| in_collection(&coll, c))
                    .flat_map(|(_, m)| m.values().cloned())
                    .collect();
                (items, s.rv)
            };
            for o in items {
                if selected(&o, labels.as_deref())
                    && fields_match(&o, fields.as_deref())
                    && tx
                        .send(line(json!({"type": "ADDED", "object": o})))
                        .await
                        .is_err()
                {
                    return;
                }
            }
            cursor = rv;
        }
        let mut last_sent = tokio::time::Instant::now();
        loop {
            let notified = changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let (batch, rv) = {
                let s = st.lock().unwrap();
                let batch: Vec<(u64, &'static str, Value)> = s
                    .events
                    .iter()
                    .filter(|(rv, c, _, o)| {
                        *rv > cursor
                            && in_collection(&coll, c)
                            && selected(o, labels.as_deref())
                            && fields_match(o, fields.as_deref())
                    })
                    .map(|(rv, _, t, o)| (*rv, *t, o.clone()))
                    .collect();
                (batch, s.rv)
            };
            for (erv, t, o) in batch {
                if tx
                    .send(line(json!({"type": t, "object": o})))
                    .await
                    .is_err()
                {
                    return;
                }
                cursor = cursor.max(erv);
                last_sent = tokio::time::Instant::now();
            }
            let now = tokio::time::Instant::now();
            if now >= until {
                return;
            }
            if bookmarks && now.duration_since(last_sent) >= BOOKMARK_EVERY {
                let kind = if coll.ends_with("/serviceaccounts") {
                    "ServiceAccount"
                } else {
                    "Secret"
                };
                let b = json!({"type": "BOOKMARK", "object": {"kind": kind, "apiVersion": "v1",
                    "metadata": {"resourceVersion": rv.to_string()}}});
                if tx.send(line(b)).await.is_err() {
                    return;
                }
                cursor = cursor.max(rv);
                last_sent = now;
            }
            tokio::select! {
                () = &mut notified => {}
                () = tokio::time::sleep_until(until.min(now + BOOKMARK_EVERY)) => {}
            }
        }
    });
    let stream = tokio_stream_from(rx);
    hyper::Response::builder()
        .status(200)
        .header("content-type", "application/json")
        .body(http_body_util::StreamBody::new(stream).boxed())
        .unwrap()
}

/// An mpsc receiver as a `Stream` (what `StreamBody` wants).
fn tokio_stream_from<T: Send + 'static>(
    mut rx: tokio::sync::mpsc::Receiver<T>,
) -> impl futures_core::Stream<Item = T> + Send + 'static {
    futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx))
}

async fn serve(
    req: hyper::Request<hyper::body::Incoming>,
    st: Arc<Mutex<State>>,
) -> hyper::Response<Body> {
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
    let refused = st
        .lock()
        .unwrap()
        .forbidden
        .iter()
        .any(|p| path.starts_with(p.as_str()));
    if authed && refused {
        let (code, v) = status(
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
    let is_watch = matches!(
        query_param(&query, "watch").as_deref(),
        Some("true") | Some("1")
    );
    if authed
        && method == "GET"
        && is_watch
        && let Some((coll, None)) = classify(&path)
    {
        st.lock().unwrap().log.push((method, path, 200));
        return watch(st, coll, &query);
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
        .body(Full::new(Bytes::from(v.to_string())).boxed())
        .unwrap()
}
