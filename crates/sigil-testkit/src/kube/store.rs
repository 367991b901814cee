//! The stand-in's storage and its REST verbs: get, list (selectors, `limit`
//! and `continue`), create, replace (resourceVersion preconditions → 409),
//! patch (merge, strategic-merge as merge, JSON patch), delete, the status
//! subresource (writes to the main resource keep `.status`, writes to
//! `/status` change only `.status`), `metadata.generation` (bumped when
//! anything but metadata and status changes) and the change history that
//! watches read.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use serde_json::{Value, json};

use super::route::{Route, classify, fields_match, in_collection, labels_match, query_param};

/// Everything the stand-in holds; tests reach in through `FakeKube::state`.
#[derive(Default)]
pub struct State {
    /// collection path → name → object
    pub(super) objects: BTreeMap<String, BTreeMap<String, Value>>,
    pub(super) rv: u64,
    /// Every change: (resourceVersion, collection, ADDED/MODIFIED/DELETED, object).
    pub(super) events: Vec<(u64, String, &'static str, Value)>,
    /// Watches from a resourceVersion below this get 410 Gone.
    pub(super) compacted: u64,
    /// resource (plural) → kind, learnt from stored objects (for BOOKMARKs and lists).
    pub(super) kinds: HashMap<String, String>,
    /// Wakes open watches when an event is recorded.
    pub changed: Arc<tokio::sync::Notify>,
    /// Path prefixes the caller may not read (RBAC says no: 403 Forbidden).
    pub forbidden: Vec<String>,
    /// (method, path, status) of every request.
    pub log: Vec<(String, String, u16)>,
    /// The message of every request RBAC refused (403), in order.
    pub denied: Vec<String>,
    /// Bearer tokens other than the admin's [`super::TOKEN`]: ServiceAccount tokens.
    pub tokens: HashMap<String, super::User>,
    /// GET this on every webhook configuration write, record the status.
    pub probe: Option<String>,
    pub probe_results: Vec<u16>,
}

pub(super) fn status(code: u16, reason: &str, message: String) -> (u16, Value) {
    (
        code,
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
               "message": message, "reason": reason, "code": code}),
    )
}

/// RFC 3339 "now", as the API server stamps `creationTimestamp`.
pub fn now_rfc3339() -> String {
    let now = time::OffsetDateTime::now_utc();
    now.replace_nanosecond(0)
        .unwrap_or(now)
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default()
}

/// The object without metadata and status: what `generation` tracks.
fn spec_of(o: &Value) -> Value {
    let mut o = o.clone();
    if let Some(m) = o.as_object_mut() {
        m.remove("metadata");
        m.remove("status");
    }
    o
}

impl State {
    /// Who a bearer token is: the admin, or a ServiceAccount whose object
    /// still exists (a deleted ServiceAccount's tokens stop working).
    pub fn authenticate(&self, token: &str) -> Option<super::User> {
        if token == super::TOKEN {
            return Some(super::User::admin());
        }
        let user = self.tokens.get(token)?;
        if let Some((ns, name)) = &user.service_account {
            self.get(&format!("/api/v1/namespaces/{ns}/serviceaccounts"), name)?;
        }
        Some(user.clone())
    }

    fn bump(&mut self, obj: &mut Value) {
        self.rv += 1;
        obj["metadata"]["resourceVersion"] = json!(self.rv.to_string());
    }

    fn record(&mut self, coll: &str, kind: &'static str, obj: &Value) {
        if let (Some(res), Some(k)) = (coll.rsplit('/').next(), obj["kind"].as_str()) {
            self.kinds.insert(res.to_owned(), k.to_owned());
        }
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

    /// Puts an object straight into storage (test setup): a uid, a
    /// `creationTimestamp` (now) and `generation` 1 unless the object has them.
    pub fn insert(&mut self, collection: &str, mut obj: Value) {
        let name = obj["metadata"]["name"]
            .as_str()
            .expect("inserted objects need metadata.name")
            .to_owned();
        if obj["metadata"]["uid"].is_null() {
            obj["metadata"]["uid"] = json!(format!("uid-{name}-{}", self.rv));
        }
        // The API server always stamps it (a request's `""` or null never survives).
        if obj["metadata"]["creationTimestamp"]
            .as_str()
            .is_none_or(str::is_empty)
        {
            obj["metadata"]["creationTimestamp"] = json!(now_rfc3339());
        }
        if obj["metadata"]["generation"].is_null() {
            obj["metadata"]["generation"] = json!(1);
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

    /// Every object of a collection (`*` for all namespaces), in name order.
    pub fn list(&self, collection: &str) -> Vec<Value> {
        self.objects
            .iter()
            .filter(|(c, _)| in_collection(collection, c))
            .flat_map(|(_, m)| m.values().cloned())
            .collect()
    }

    pub(super) fn kind_of(&self, resource: &str) -> String {
        self.kinds
            .get(resource)
            .cloned()
            .unwrap_or_else(|| "Unknown".into())
    }

    pub(super) fn handle(
        &mut self,
        method: &str,
        path: &str,
        query: &str,
        content_type: &str,
        body: &[u8],
    ) -> (u16, Value) {
        let Some(route) = classify(path) else {
            return status(404, "NotFound", format!("the server could not find {path}"));
        };
        let parsed: Option<Value> = serde_json::from_slice(body).ok();
        match (method, route.name.clone()) {
            ("GET", Some(n)) => match self.get(&route.coll, &n) {
                Some(o) => (200, o),
                None => not_found(&route, &n),
            },
            ("GET", None) => self.list_page(&route, query),
            ("POST", None) => match parsed {
                Some(o) => self.create(&route, o),
                None => status(400, "BadRequest", "body is not JSON".into()),
            },
            ("PUT", Some(n)) => match parsed {
                Some(o) => self.replace(&route, &n, o),
                None => status(400, "BadRequest", "body is not JSON".into()),
            },
            ("PATCH", Some(n)) => self.patch(&route, &n, content_type, parsed),
            ("DELETE", Some(n)) => match self.remove(&route.coll, &n) {
                Some(o) => (200, o),
                None => not_found(&route, &n),
            },
            (m, _) => status(405, "MethodNotAllowed", format!("{m} not supported here")),
        }
    }

    fn list_page(&self, route: &Route, query: &str) -> (u16, Value) {
        let sel = query_param(query, "labelSelector");
        let fields = query_param(query, "fieldSelector");
        let items: Vec<Value> = self
            .list(&route.coll)
            .into_iter()
            .filter(|o| labels_match(o, sel.as_deref()) && fields_match(o, fields.as_deref()))
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
        let kind = format!("{}List", self.kind_of(&route.resource));
        (
            200,
            json!({"kind": kind, "apiVersion": "v1", "metadata": meta, "items": page}),
        )
    }

    fn create(&mut self, route: &Route, mut o: Value) -> (u16, Value) {
        let n = o["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        if n.is_empty() {
            return status(
                422,
                "Invalid",
                "metadata.name: Required value: name is required".into(),
            );
        }
        if let Some(refused) = self.refused_by_crd(route, &o) {
            return refused;
        }
        if self.get(&route.coll, &n).is_some() {
            return status(
                409,
                "AlreadyExists",
                format!("{} \"{n}\" already exists", route.resource),
            );
        }
        if let Some(ns) = route.coll.split("/namespaces/").nth(1)
            && let Some((ns, _)) = ns.split_once('/')
        {
            // NamespaceLifecycle: nothing is created in a namespace that is not there.
            if self.get("/api/v1/namespaces", ns).is_none() {
                let (code, mut v) =
                    status(404, "NotFound", format!("namespaces \"{ns}\" not found"));
                v["details"] = json!({"name": ns, "kind": "namespaces"});
                return (code, v);
            }
            o["metadata"]["namespace"] = json!(ns);
        }
        o["metadata"]["uid"] = json!(format!("uid-{n}-{}", self.rv + 1));
        o["metadata"]["creationTimestamp"] = json!(now_rfc3339());
        o["metadata"]["generation"] = json!(1);
        self.bump(&mut o);
        self.record(&route.coll, "ADDED", &o);
        self.objects
            .entry(route.coll.clone())
            .or_default()
            .insert(n, o.clone());
        (201, o)
    }

    /// PUT and the result of PATCH: preconditions, the status subresource
    /// split, generation, and the write.
    fn replace(&mut self, route: &Route, n: &str, mut o: Value) -> (u16, Value) {
        let Some(cur) = self.get(&route.coll, n) else {
            return not_found(route, n);
        };
        let want = o["metadata"]["resourceVersion"].as_str();
        if want.is_some_and(|w| !w.is_empty())
            && want != cur["metadata"]["resourceVersion"].as_str()
        {
            return status(
                409,
                "Conflict",
                format!(
                    "Operation cannot be fulfilled on {} \"{n}\": the object has been modified; please apply your changes to the latest version and try again",
                    route.resource
                ),
            );
        }
        if route.sub.is_none()
            && let Some(refused) = self.refused_by_crd(route, &o)
        {
            return refused;
        }
        if route.sub.as_deref() == Some("status") {
            // Only .status changes through the subresource.
            let st = o["status"].clone();
            o = cur.clone();
            o["status"] = st;
        } else if route.has_status() {
            o["status"] = cur["status"].clone();
            if o["status"].is_null()
                && let Some(m) = o.as_object_mut()
            {
                m.remove("status");
            }
        }
        for keep in ["uid", "creationTimestamp", "namespace", "name"] {
            o["metadata"][keep] = cur["metadata"][keep].clone();
        }
        let generation = cur["metadata"]["generation"].as_i64().unwrap_or(1);
        let changed = spec_of(&o) != spec_of(&cur);
        o["metadata"]["generation"] = json!(if changed { generation + 1 } else { generation });
        self.bump(&mut o);
        self.record(&route.coll, "MODIFIED", &o);
        self.objects
            .entry(route.coll.clone())
            .or_default()
            .insert(n.to_owned(), o.clone());
        (200, o)
    }

    fn patch(
        &mut self,
        route: &Route,
        n: &str,
        content_type: &str,
        body: Option<Value>,
    ) -> (u16, Value) {
        let Some(cur) = self.get(&route.coll, n) else {
            return not_found(route, n);
        };
        let Some(body) = body else {
            return status(400, "BadRequest", "patch body is not JSON".into());
        };
        let mut o = cur.clone();
        match content_type.split(';').next().unwrap_or_default().trim() {
            "application/merge-patch+json" | "application/strategic-merge-patch+json" => {
                json_patch::merge(&mut o, &body);
            }
            "application/json-patch+json" => {
                let Ok(p) = serde_json::from_value::<json_patch::Patch>(body) else {
                    return status(400, "BadRequest", "not a JSON patch".into());
                };
                if let Err(e) = json_patch::patch(&mut o, &p) {
                    return status(422, "Invalid", format!("JSON patch: {e}"));
                }
            }
            other => {
                return status(
                    415,
                    "UnsupportedMediaType",
                    format!(
                        "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/strategic-merge-patch+json (got {other:?})"
                    ),
                );
            }
        }
        // A patch without a resourceVersion applies to the latest version.
        if o["metadata"]["resourceVersion"] == cur["metadata"]["resourceVersion"]
            || o["metadata"]["resourceVersion"].is_null()
        {
            o["metadata"]["resourceVersion"] = cur["metadata"]["resourceVersion"].clone();
        }
        self.replace(route, n, o)
    }
}

impl State {
    /// 422 Invalid when a custom object breaks a validation rule of its
    /// stored CRD (`x-kubernetes-validations` on `spec`).
    fn refused_by_crd(&self, route: &Route, o: &Value) -> Option<(u16, Value)> {
        let group = route.coll.strip_prefix("/apis/")?.split('/').next()?;
        let crd = self.get(
            "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
            &format!("{}.{group}", route.resource),
        )?;
        let broken = super::validation::violations(&crd, o);
        if broken.is_empty() {
            return None;
        }
        Some(status(
            422,
            "Invalid",
            format!(
                "{}.{group} {:?} is invalid: {}",
                o["kind"].as_str().unwrap_or_default(),
                o["metadata"]["name"].as_str().unwrap_or_default(),
                broken.join(", ")
            ),
        ))
    }
}

fn not_found(route: &Route, n: &str) -> (u16, Value) {
    status(
        404,
        "NotFound",
        format!("{} \"{n}\" not found", route.resource),
    )
}
