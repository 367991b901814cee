//! Audit: what already runs that the policy would not admit now.
//!
//! Owns listing the audited kinds through kube-rs (paginated with `limit` and
//! `continue`, one page in memory at a time), the `--since` window, running
//! each object through the one decision ([`Decide::decide`]: the binary's engine,
//! as a CREATE would be decided, with the object's own pull credentials)
//! with bounded concurrency, and the report. What a verdict means for
//! compliance is sigil-core's (`sigil_core::audit`); rendering is
//! [`report`]; the in-cluster loop (leader election, metrics, Events,
//! `GET /audit`) is [`continuous`]. Each distinct image is resolved and
//! verified once per audit: the engine's caches are shared by all objects.

pub mod continuous;
mod item;
pub mod kinds;
pub mod policyreport;
pub mod report;
pub mod reports;

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use futures_util::StreamExt as _;
use kube::api::{DynamicObject, ListParams};
use kube::discovery::ApiResource;
use kube::{Api, Client};
use serde_json::Value;
use sigil_core::audit::{audit_object, mirror_to_check, not_mirrored_now, running_images};
use sigil_core::walker::summarize_value;
use sigil_core::{ObjectFacts, Operation, Source, effective_namespace};

pub use kinds::Kind;
pub use report::{ObjectMeta, ObjectReport, Report, Scope};

use crate::Decide;
use crate::error::{Context as _, Error, Result};

/// Namespace labels listed once (the CLI), for rules with a `namespaceSelector`.
#[derive(Debug, Default)]
pub struct KnownNamespaces(pub std::collections::HashMap<String, sigil_core::policy::Labels>);

impl KnownNamespaces {
    /// Lists every namespace's labels once.
    pub async fn list(client: &Client) -> Result<KnownNamespaces> {
        let list = Api::<k8s_openapi::api::core::v1::Namespace>::all(client.clone())
            .list(&ListParams::default())
            .await
            .context("cannot list namespaces")?;
        Ok(KnownNamespaces(
            list.items
                .into_iter()
                .filter_map(|n| Some((n.metadata.name?, n.metadata.labels.unwrap_or_default())))
                .collect(),
        ))
    }
}

impl sigil_core::NamespaceLabels for KnownNamespaces {
    fn labels(&self, name: &str) -> Option<sigil_core::policy::Labels> {
        self.0.get(name).cloned()
    }
}

/// Objects per list page (kube-apiserver's own default page for kubectl is 500).
pub const DEFAULT_PAGE: u32 = 500;

/// What to audit and how.
#[derive(Debug, Clone)]
pub struct Options {
    /// One namespace, or all.
    pub namespace: Option<String>,
    /// Kinds to list; empty: every kind under the policy in force
    /// ([`kinds::all`]).
    pub kinds: Vec<Kind>,
    /// Label selector passed to the API server.
    pub label_selector: Option<String>,
    /// Only objects created or changed at or after this time.
    pub since: Option<SystemTime>,
    /// Objects decided at once.
    pub concurrency: usize,
    /// Objects per list page.
    pub page_size: u32,
    /// Time allowed for one object's registry lookups.
    pub timeout: Duration,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            namespace: None,
            kinds: Vec::new(),
            label_selector: None,
            since: None,
            concurrency: 16,
            page_size: DEFAULT_PAGE,
            timeout: Duration::from_secs(30),
        }
    }
}

/// Something told about progress (the CLI's progress bar).
pub trait Progress: Send + Sync {
    /// `n` more objects decided.
    fn advance(&self, n: u64);
    /// Now listing `kind`.
    fn listing(&self, kind: &str);
}

/// No progress shown.
#[derive(Debug)]
pub struct Quiet;

impl Progress for Quiet {
    fn advance(&self, _: u64) {}
    fn listing(&self, _: &str) {}
}

/// Lists and decides every object `opts` names; one kind that cannot be
/// listed is reported in `errors`, the rest is still audited.
pub async fn run(
    client: &Client,
    engine: Arc<dyn Decide>,
    opts: &Options,
    requests: impl Fn() -> u64,
    progress: &dyn Progress,
) -> Report {
    let started = SystemTime::now();
    let before = requests();
    let mut objects = Vec::new();
    let mut errors = Vec::new();
    let every;
    let kinds = if opts.kinds.is_empty() {
        every = kinds::all(&engine.policy().extractors);
        &every
    } else {
        &opts.kinds
    };
    for kind in kinds {
        progress.listing(&kind.plural);
        if let Err(e) = audit_kind(client, &engine, opts, kind, progress, &mut objects).await {
            errors.push(e.to_string());
        }
    }
    let scope = Scope {
        namespace: opts.namespace.clone(),
        kinds: kinds.iter().map(|k| k.plural.to_string()).collect(),
        label_selector: opts.label_selector.clone(),
        since: opts.since.map(report::rfc3339),
    };
    Report::finish(
        engine.policy().name.clone(),
        scope,
        objects,
        errors,
        started,
        requests().saturating_sub(before),
    )
}

/// One kind, page by page: each page is decided before the next is asked
/// for, so memory holds one page of objects plus the reports.
async fn audit_kind(
    client: &Client,
    engine: &Arc<dyn Decide>,
    opts: &Options,
    kind: &Kind,
    progress: &dyn Progress,
    out: &mut Vec<ObjectReport>,
) -> Result<()> {
    let Some((ar, cluster_scoped)) = served(client, kind).await? else {
        return Ok(());
    };
    if cluster_scoped && opts.namespace.is_some() {
        // A cluster-scoped kind (ClusterWorkflowTemplate) is in no namespace.
        return Ok(());
    }
    let api: Api<DynamicObject> = match &opts.namespace {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &ar),
        None => Api::all_with(client.clone(), &ar),
    };
    let mut lp = ListParams::default().limit(opts.page_size.max(1));
    if let Some(sel) = &opts.label_selector {
        lp = lp.labels(sel);
    }
    let mut pages = 0u32;
    loop {
        let page = list_page(client, &api, &lp)
            .await
            .map_err(|e| list_error(kind, opts, e))?;
        pages += 1;
        let next = page.metadata.continue_.filter(|c| !c.is_empty());
        let decided: Vec<Option<ObjectReport>> = futures_util::stream::iter(page.items)
            .map(|o| audit_one(engine, opts, kind, o))
            .buffer_unordered(opts.concurrency.max(1))
            .collect()
            .await;
        progress.advance(decided.len() as u64);
        out.extend(decided.into_iter().flatten());
        match next {
            Some(c) if pages < 100_000 => lp.continue_token = Some(c),
            _ => return Ok(()),
        }
    }
}

/// How to list `kind` and whether it is cluster-scoped: a built-in kind as
/// written; a custom one at the version discovery recommends (or the one
/// its extractor names). `None` when an optional kind is not served.
async fn served(client: &Client, kind: &Kind) -> Result<Option<(ApiResource, bool)>> {
    if kind.group.is_empty() || !kind.group.contains('.') {
        return Ok(Some((kind.api_resource(), false)));
    }
    let group = match kube::discovery::group(client, &kind.group).await {
        Ok(g) => g,
        Err(e) if kind.optional => {
            tracing::debug!(group = %kind.group, error = %e, "not served; not audited");
            return Ok(None);
        }
        Err(e) => {
            return Err(Error::Invalid(format!(
                "the API server does not serve {} ({}): {e}",
                kind.plural, kind.group
            )));
        }
    };
    let found = if kind.version.is_empty() {
        group.recommended_kind(&kind.kind)
    } else {
        group
            .versioned_resources(&kind.version)
            .into_iter()
            .find(|(ar, _)| ar.kind == kind.kind)
    };
    match found {
        Some((ar, caps)) => Ok(Some((ar, caps.scope == kube::discovery::Scope::Cluster))),
        None if kind.optional => Ok(None),
        None => Err(Error::Invalid(format!(
            "the API server serves {} but not its kind {}",
            kind.group, kind.kind
        ))),
    }
}

/// One list page as the API server wrote it, each item kept as its JSON
/// text (one allocation per object; read by [`read_item`]).
#[derive(serde::Deserialize)]
struct Page {
    #[serde(default)]
    metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ListMeta,
    #[serde(default)]
    items: Vec<Box<serde_json::value::RawValue>>,
}

/// `GET` one page through kube-rs's client (its auth, TLS and API errors),
/// read as [`Page`], each item kept as its JSON text, not as
/// `ObjectList<DynamicObject>`: a `DynamicObject` buffers every field
/// through serde's flatten and had to be serialized back into a `Value`
/// for the decision, which together cost about a fifth of an audit's CPU
/// (docs/benchmarks.md, issue 27). [`item`] reads each text once for the
/// metadata and status, the walker once for the images.
async fn list_page(
    client: &Client,
    api: &Api<DynamicObject>,
    lp: &ListParams,
) -> std::result::Result<Page, kube::Error> {
    let mut req = kube::core::Request::new(api.resource_url())
        .list(lp)
        .map_err(kube::Error::BuildRequest)?;
    req.extensions_mut().insert("list");
    let text = client.request_text(req).await?;
    serde_json::from_str(&text).map_err(kube::Error::SerdeError)
}

fn list_error(kind: &Kind, opts: &Options, e: kube::Error) -> Error {
    let scope = opts.namespace.as_deref().map_or_else(
        || "in all namespaces".to_owned(),
        |n| format!("in namespace {n}"),
    );
    let hint = match &e {
        kube::Error::Api(s) if s.code == 403 => format!(
            " (grant list on {}{} {scope}: ClusterRole sigil-audit in deploy/kustomize/base/rbac.yaml)",
            kind.plural,
            if kind.group.is_empty() {
                String::new()
            } else {
                format!(".{}", kind.group)
            }
        ),
        _ => String::new(),
    };
    Error::Kube {
        context: format!("listing {} {scope}{hint}", kind.plural),
        source: Box::new(e),
    }
}

/// Decides one object, or `None` when `--since` leaves it out.
async fn audit_one(
    engine: &Arc<dyn Decide>,
    opts: &Options,
    kind: &Kind,
    obj: Box<serde_json::value::RawValue>,
) -> Option<ObjectReport> {
    let (meta, summary, running) = read_item(obj.get(), kind, opts.since)?;
    let namespace = effective_namespace(None, Some(&meta.namespace), None);
    // The verdict of an exempt namespace lists no fields: the audit lists
    // them from the object. Anywhere else the verdict carries them.
    let exempt_fields = if namespace.is_some_and(|ns| engine.policy().is_exempt(ns)) {
        summary.fields.clone()
    } else {
        Vec::new()
    };
    let deadline = Instant::now() + opts.timeout;
    let verdict = engine
        .decide(
            ObjectFacts {
                operation: Operation::Create,
                source: Source::Admission,
                kind: &kind.kind,
                namespace,
                object: Some(summary),
                old_object: None,
                namespace_labels: None,
            },
            deadline,
        )
        .await;
    let mut audit = audit_object(verdict, &exempt_fields, &running);
    // Pinned at the origin when no mirror had it: does a mirror have it now?
    for f in audit.fields.iter_mut().filter(|f| f.violations.is_empty()) {
        if let Some((mirror, runs)) = mirror_to_check(engine.policy(), &f.field.value)
            && engine
                .resolve(&mirror, deadline)
                .await
                .is_ok_and(|d| d == runs)
        {
            not_mirrored_now(f, &mirror);
            audit.result = sigil_core::audit::ObjectResult::Violating;
        }
    }
    let exempt = audit.result == sigil_core::audit::ObjectResult::Exempt;
    let mut report = ObjectReport::new(meta, audit);
    if !exempt {
        for f in &mut report.fields {
            f.backstop = sigil_core::backstop::refusal(engine.policy(), &f.image);
        }
    }
    Some(report)
}

/// What the audit reads of one listed object (its JSON text): identity,
/// images, running images; `None` when `--since` leaves it out. One pass
/// over the text ([`item::read`]: the walker, with the head beside it),
/// or, for an object with a field of an unexpected type, a `Value` of it.
fn read_item(
    json: &str,
    kind: &Kind,
    since: Option<SystemTime>,
) -> Option<(
    ObjectMeta,
    sigil_core::ObjectSummary,
    Vec<sigil_core::audit::Running>,
)> {
    let pod = kind.kind == "Pod";
    match item::read(json) {
        Ok(Some((head, summary))) => {
            if since.is_some_and(|since| head.changed_at().is_some_and(|t| t < since)) {
                return None;
            }
            let running = if pod { head.running() } else { Vec::new() };
            return Some((head.object_meta(kind, &summary), summary, running));
        }
        // Not an object: nothing to audit (the API server never lists one).
        Ok(None) => return None,
        Err(_) => {}
    }
    let value: Value = serde_json::from_str(json).ok().filter(Value::is_object)?;
    if since.is_some_and(|since| changed_at(&value).is_some_and(|t| t < since)) {
        return None;
    }
    let running = if pod {
        running_images(&value)
    } else {
        Vec::new()
    };
    Some((object_meta(&value, kind), summarize_value(&value), running))
}

fn object_meta(v: &Value, kind: &Kind) -> ObjectMeta {
    let m = &v["metadata"];
    let s = |v: &Value| v.as_str().unwrap_or_default().to_owned();
    let owner = m["ownerReferences"].as_array().and_then(|refs| {
        refs.iter()
            .find(|r| r["controller"].as_bool() == Some(true))
            .map(|r| format!("{}/{}", s(&r["kind"]), s(&r["name"])))
    });
    ObjectMeta {
        namespace: s(&m["namespace"]),
        kind: kind.kind.to_string(),
        name: s(&m["name"]),
        uid: s(&m["uid"]),
        api_version: kind.api_version(),
        resource_version: s(&m["resourceVersion"]),
        owner,
    }
}

/// When an object was created or last changed by anyone but a status
/// writer: the latest of `creationTimestamp` and its `managedFields` times
/// (so a Deployment edited during a break-glass window is audited too). An
/// object with no readable time counts as changed now.
pub fn changed_at(v: &Value) -> Option<SystemTime> {
    let m = &v["metadata"];
    let parse = |t: &Value| {
        t.as_str()
            .and_then(|s| humantime::parse_rfc3339_weak(s).ok())
    };
    let managed = m["managedFields"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|f| f["subresource"].as_str().unwrap_or_default().is_empty())
        .filter_map(|f| parse(&f["time"]));
    parse(&m["creationTimestamp"])
        .into_iter()
        .chain(managed)
        .max()
}

/// Reads `--since`: a duration back from now (`2h`, `30m`) or an RFC 3339 time.
pub fn parse_since(s: &str, now: SystemTime) -> Result<SystemTime> {
    if let Ok(t) = humantime::parse_rfc3339_weak(s) {
        return Ok(t);
    }
    let d = humantime::parse_duration(s).map_err(|e| {
        Error::Invalid(format!(
            "--since {s:?}: neither a duration (2h, 30m) nor an RFC 3339 time ({e})"
        ))
    })?;
    now.checked_sub(d)
        .ok_or_else(|| Error::Invalid(format!("--since {s:?} reaches before 1970")))
}

/// The start of the last (or current) break-glass window, from the markers
/// `sigil break-glass` writes (`since=…; by=…; reason=…[; ended=…]`).
pub fn break_glass_since(current: Option<&str>, last: Option<&str>) -> Result<SystemTime> {
    let marker = current.or(last).ok_or_else(|| {
        Error::Invalid(
            "--since-break-glass: no break-glass window is recorded (sigil break-glass --end records one)"
                .into(),
        )
    })?;
    let since = marker
        .split(';')
        .find_map(|p| p.trim().strip_prefix("since="))
        .ok_or_else(|| Error::Invalid(format!("break-glass marker {marker:?} has no since=")))?;
    humantime::parse_rfc3339_weak(since.trim())
        .map_err(|e| Error::Invalid(format!("break-glass marker since={since:?}: {e}")))
}

/// The break-glass window's start, read from the state ConfigMap.
pub async fn since_break_glass(
    client: &Client,
    s: &crate::cluster::Settings,
) -> Result<SystemTime> {
    let cms: Api<k8s_openapi::api::core::v1::ConfigMap> =
        Api::namespaced(client.clone(), &s.namespace);
    let cm = cms
        .get_opt(&s.state_configmap)
        .await
        .with_context(|| format!("reading ConfigMap {}/{}", s.namespace, s.state_configmap))?;
    let ann = cm.and_then(|c| c.metadata.annotations).unwrap_or_default();
    break_glass_since(
        ann.get(crate::cluster::BREAK_GLASS_ANNOTATION)
            .map(String::as_str),
        ann.get(crate::cluster::LAST_BREAK_GLASS_ANNOTATION)
            .map(String::as_str),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn changed_at_is_the_latest_non_status_write() {
        let v = json!({"metadata": {"creationTimestamp": "2026-01-01T00:00:00Z",
            "managedFields": [
                {"manager": "kubectl", "time": "2026-02-01T00:00:00Z"},
                {"manager": "kubelet", "subresource": "status", "time": "2026-03-01T00:00:00Z"}]}});
        assert_eq!(
            changed_at(&v),
            humantime::parse_rfc3339("2026-02-01T00:00:00Z").ok()
        );
    }

    /// A listed object is read from its text: typed when it can be, as a
    /// `Value` when a field has an odd type, skipped when it is no object;
    /// `--since` leaves out what did not change after it.
    #[test]
    fn listed_items_are_read_from_their_text_either_way_alike() {
        let pod = kinds::ALL.iter().find(|k| k.kind == "Pod").expect("Pod");
        let typed = r#"{"metadata":{"name":"p","namespace":"ns","creationTimestamp":"2026-01-01T00:00:00Z"},
            "spec":{"containers":[{"name":"a","image":"nginx:1"}]},
            "status":{"containerStatuses":[{"name":"a","imageID":"docker.io/library/nginx@sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"}]}}"#;
        // The same object with a label of an odd type: read as a `Value`.
        let odd = typed.replace(r#""name":"p","#, r#""name":"p","ownerReferences":{"x":1},"#);
        let (m1, s1, r1) = read_item(typed, pod, None).expect("typed");
        let (m2, s2, r2) = read_item(&odd, pod, None).expect("as a Value");
        assert!(item::read(&odd).is_err());
        assert_eq!((&m1, &s1.fields, &r1), (&m2, &s2.fields, &r2));
        assert_eq!((m1.name.as_str(), m1.namespace.as_str()), ("p", "ns"));
        assert_eq!(s1.fields[0].value, "nginx:1");
        assert!(r1[0].digest.is_some());
        assert!(read_item("[1]", pod, None).is_none(), "no object");
        let later = humantime::parse_rfc3339("2026-06-01T00:00:00Z").ok();
        assert!(read_item(typed, pod, later).is_none(), "unchanged since");
        assert!(read_item(&odd, pod, later).is_none(), "unchanged since");
    }

    #[test]
    fn since_takes_a_duration_or_a_time() {
        let now = humantime::parse_rfc3339("2026-11-23T12:00:00Z").expect("t");
        assert_eq!(
            parse_since("2h", now).expect("d"),
            humantime::parse_rfc3339("2026-11-23T10:00:00Z").expect("t")
        );
        assert_eq!(
            parse_since("2026-11-20T00:00:00Z", now).expect("t"),
            humantime::parse_rfc3339("2026-11-20T00:00:00Z").expect("t")
        );
        assert!(parse_since("yesterday", now).is_err());
    }

    #[test]
    fn the_break_glass_window_starts_at_its_marker() {
        let last = "since=2026-11-20T10:00:00Z; by=ops; reason=registry down; a;b; ended=2026-11-20T11:00:00Z";
        assert_eq!(
            break_glass_since(None, Some(last)).expect("since"),
            humantime::parse_rfc3339("2026-11-20T10:00:00Z").expect("t")
        );
        // Still on: the current marker wins.
        let on = "since=2026-11-21T00:00:00Z; by=ops; reason=x";
        assert_eq!(
            break_glass_since(Some(on), Some(last)).expect("since"),
            humantime::parse_rfc3339("2026-11-21T00:00:00Z").expect("t")
        );
        assert!(break_glass_since(None, None).is_err());
    }
}
