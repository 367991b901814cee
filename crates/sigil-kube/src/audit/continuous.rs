//! The audit inside the cluster (`sigil serve --audit-interval`): one
//! replica at a time (the Lease in `cluster::lease`) audits every namespace
//! on the interval and whenever the policy in force changes, and publishes
//! the result three ways — Prometheus gauges (no image or object names in
//! labels), a Warning Event per offending object and reason (events.k8s.io
//! through kube-runtime's recorder, deduplicated and capped per run), policy
//! reports per namespace ([`super::reports`]), and the last report at
//! `GET /audit` on the admin port. A replica that loses
//! the Lease stops mid-audit and withdraws its gauges, so a dashboard never
//! sums two replicas' counts. It decides nothing itself: it runs
//! [`super::run`] with the engine in force.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use bytes::Bytes;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::Client;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use sigil_core::audit::{ObjectResult, Reason};

use super::{Options, Quiet, Report};
use crate::InForce;
use crate::metrics::Metrics;

/// Event reason on offending objects.
pub const EVENT_REASON: &str = "ImagePolicyViolation";
/// The shortest gap between two audits (policy edits in a burst cost one).
const MIN_GAP: Duration = Duration::from_secs(5);
/// How often a policy change is looked for.
const POLICY_POLL: Duration = Duration::from_secs(1);

/// How the in-cluster audit runs.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Time between audits.
    pub interval: Duration,
    /// What to list (all namespaces, all kinds, by default).
    pub options: Options,
    /// Most Events published per audit; the rest wait for the next one.
    pub max_events: usize,
    /// An (object, reason) already reported gets another Event only after this.
    pub event_refresh: Duration,
    /// `reportingInstance` of the Events (the Lease identity).
    pub instance: String,
    /// Which policy reports to write.
    pub reports: super::reports::Mode,
}

/// The last report this replica made, as served at `GET /audit`.
#[derive(Debug, Default)]
pub struct Latest {
    json: RwLock<Option<Bytes>>,
    leading: std::sync::atomic::AtomicBool,
}

impl Latest {
    /// The last report, serialized once when it was made.
    pub fn json(&self) -> Option<Bytes> {
        self.json.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Whether this replica holds the audit Lease now.
    pub fn leading(&self) -> bool {
        self.leading.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn set(&self, report: &Report) {
        let bytes = serde_json::to_vec_pretty(report).ok().map(Bytes::from);
        *self.json.write().unwrap_or_else(|e| e.into_inner()) = bytes;
    }
}

/// Stops the in-cluster audit on drain and releases its Lease.
pub type Handle = crate::cluster::lease::Shutdown;

/// Everything the in-cluster audit needs, started by [`Start::run`] once
/// the server is Ready (a replica that cannot serve must not hold the Lease).
pub struct Start {
    /// API client.
    pub client: Client,
    /// The engine in force (policy, caches, credentials), which the audit uses.
    pub in_force: Arc<dyn InForce>,
    /// Registry requests made so far by this process (each report counts its own share).
    pub requests: Arc<dyn Fn() -> u64 + Send + Sync>,
    /// Where results are counted.
    pub metrics: Arc<Metrics>,
    /// How it runs.
    pub settings: Settings,
    /// The Lease.
    pub lease: crate::cluster::lease::LeaseSettings,
    /// Where `GET /audit` reads from.
    pub latest: Arc<Latest>,
}

impl std::fmt::Debug for Start {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Start")
            .field("settings", &self.settings)
            .field("lease", &self.lease)
            .finish()
    }
}

impl Start {
    /// A handle for the drain, and the audit waiting to be run.
    pub fn prepare(self) -> (Handle, Pending) {
        let (handle, stopper) = crate::cluster::lease::shutdown_pair();
        (
            handle,
            Pending {
                start: self,
                stopper,
            },
        )
    }
}

/// The in-cluster audit, not started yet.
#[derive(Debug)]
pub struct Pending {
    start: Start,
    stopper: crate::cluster::lease::Stopper,
}

impl Pending {
    /// Waits for `ready`, then campaigns and audits until [`Handle::shutdown`].
    pub async fn run(self, ready: impl std::future::Future<Output = ()>) {
        let Pending { start, stopper } = self;
        let (metrics, latest) = (start.metrics.clone(), start.latest.clone());
        let client = start.client.clone();
        stopper
            .lead(
                client,
                start.lease,
                ready,
                |leading| {
                    run(
                        start.client,
                        start.in_force,
                        start.requests,
                        start.metrics,
                        start.settings,
                        start.latest,
                        leading,
                    )
                },
                move || {
                    metrics.audit_leader.set(0);
                    metrics.clear_audit();
                    latest
                        .leading
                        .store(false, std::sync::atomic::Ordering::Relaxed);
                },
            )
            .await;
    }
}

/// Runs forever: waits for the Lease, audits while it holds it.
pub async fn run(
    client: Client,
    in_force: Arc<dyn InForce>,
    requests: Arc<dyn Fn() -> u64 + Send + Sync>,
    metrics: Arc<Metrics>,
    settings: Settings,
    latest: Arc<Latest>,
    mut leading: tokio::sync::watch::Receiver<bool>,
) {
    let mut events = EventSink::new(client.clone(), &settings);
    let mut reports = super::reports::Writer::new(client.clone(), settings.reports);
    loop {
        metrics.audit_leader.set(0);
        latest
            .leading
            .store(false, std::sync::atomic::Ordering::Relaxed);
        metrics.clear_audit();
        if leading.wait_for(|l| *l).await.is_err() {
            return;
        }
        metrics.audit_leader.set(1);
        latest
            .leading
            .store(true, std::sync::atomic::Ordering::Relaxed);
        loop {
            let engine = in_force.current();
            let policy = engine.policy().clone();
            let started = Instant::now();
            let audit = super::run(&client, engine, &settings.options, || requests(), &Quiet);
            let report = tokio::select! {
                r = audit => r,
                _ = leading.wait_for(|l| !*l) => break,
            };
            let ok = report.errors.is_empty();
            tracing::info!(
                objects = report.summary.objects,
                violating = report.summary.violating,
                violations = report.summary.violations,
                registry_requests = report.summary.registry_requests,
                errors = report.errors.len(),
                elapsed_ms = started.elapsed().as_millis() as u64,
                "audit finished"
            );
            for e in &report.errors {
                tracing::warn!(error = %e, "audit incomplete");
            }
            metrics.audit_report(&report, ok);
            latest.set(&report);
            events.publish(&report, &metrics).await;
            // An incomplete audit would delete reports of what it could not list.
            if ok {
                reports.write(&report, &metrics).await;
            }
            // Next: the interval, a policy change, or losing the Lease.
            let next = tokio::time::Instant::now() + settings.interval;
            tokio::time::sleep(MIN_GAP).await;
            let lost = loop {
                if !*leading.borrow() {
                    break true;
                }
                if tokio::time::Instant::now() >= next {
                    break false;
                }
                if !Arc::ptr_eq(&in_force.policy(), &policy) {
                    tracing::info!("policy changed; auditing again");
                    break false;
                }
                tokio::select! {
                    _ = tokio::time::sleep(POLICY_POLL) => {}
                    _ = leading.changed() => {}
                }
            };
            if lost {
                break;
            }
        }
        tracing::info!("no longer the audit leader; withdrawing audit metrics");
    }
}

/// Publishes Events for violations: one per (object, reason) until
/// `event_refresh` passes, at most `max_events` per audit.
struct EventSink {
    recorder: Recorder,
    seen: HashMap<(String, Reason), Instant>,
    max: usize,
    refresh: Duration,
}

impl EventSink {
    fn new(client: Client, s: &Settings) -> EventSink {
        let reporter = Reporter {
            controller: "sigil.dev/audit".into(),
            instance: Some(s.instance.clone()),
        };
        EventSink {
            recorder: Recorder::new(client, reporter),
            seen: HashMap::new(),
            max: s.max_events,
            refresh: s.event_refresh,
        }
    }

    async fn publish(&mut self, report: &Report, metrics: &Metrics) {
        // Forget objects that are gone or compliant now: if they violate
        // again later, that is news.
        let live: std::collections::HashSet<(&str, Reason)> = report
            .objects
            .iter()
            .flat_map(|o| o.violations().map(move |(_, v)| (o.uid.as_str(), v.reason)))
            .collect();
        self.seen
            .retain(|(uid, r), _| live.contains(&(uid.as_str(), *r)));
        let mut sent = 0usize;
        for o in report
            .objects
            .iter()
            .filter(|o| o.result == ObjectResult::Violating && !o.uid.is_empty())
        {
            let mut reasons: Vec<Reason> = o.violations().map(|(_, v)| v.reason).collect();
            reasons.sort();
            reasons.dedup();
            for reason in reasons {
                let key = (o.uid.clone(), reason);
                if self
                    .seen
                    .get(&key)
                    .is_some_and(|t| t.elapsed() < self.refresh)
                {
                    metrics.audit_event("deduplicated");
                    continue;
                }
                if sent >= self.max {
                    metrics.audit_event("rate_limited");
                    continue;
                }
                let note = note(o, reason);
                let ev = Event {
                    type_: EventType::Warning,
                    reason: EVENT_REASON.into(),
                    note: Some(note),
                    action: action(reason).into(),
                    secondary: None,
                };
                let reference = ObjectReference {
                    api_version: Some(o.api_version.clone()),
                    kind: Some(o.kind.clone()),
                    name: Some(o.name.clone()),
                    namespace: Some(o.namespace.clone()).filter(|n| !n.is_empty()),
                    uid: Some(o.uid.clone()),
                    resource_version: Some(o.resource_version.clone()).filter(|r| !r.is_empty()),
                    field_path: None,
                };
                sent += 1;
                match self.recorder.publish(&ev, &reference).await {
                    Ok(()) => {
                        metrics.audit_event("published");
                        self.seen.insert(key, Instant::now());
                    }
                    Err(e) => {
                        metrics.audit_event("error");
                        tracing::warn!(object = %format!("{}/{}/{}", o.namespace, o.kind, o.name), error = %e, "publishing an audit Event failed");
                    }
                }
            }
        }
    }
}

/// The Event's `action` carries the audit reason, so kube-runtime's
/// recorder (keyed by object, reason and action) keeps one series per
/// (object, audit reason).
fn action(r: Reason) -> &'static str {
    match r {
        Reason::NotPinned => "AuditNotPinned",
        Reason::NotMirrored => "AuditNotMirrored",
        Reason::Denied => "AuditDenied",
        Reason::Signature => "AuditSignature",
        Reason::Attestation => "AuditAttestation",
        Reason::Unresolvable => "AuditUnresolvable",
        Reason::Drift => "AuditDrift",
    }
}

/// What `kubectl describe` shows: every image with this reason, bounded to
/// the API's 1 kB note limit.
fn note(o: &super::ObjectReport, reason: Reason) -> String {
    let mut s = String::new();
    for (f, v) in o.violations().filter(|(_, v)| v.reason == reason) {
        if !s.is_empty() {
            s.push_str("; ");
        }
        let c = f.container.as_deref().unwrap_or(&f.field);
        s.push_str(&format!(
            "{} {c} {}: {} → {}",
            super::report::label(reason),
            f.image,
            v.detail,
            v.fix
        ));
    }
    crate::cluster::event_note(&s)
}
