//! Policy objects in force (`sigil serve --watch-policies`).
//!
//! Owns keeping ClusterImagePolicies and ImagePolicies in memory
//! (kube-runtime reflectors: no API call per request), combining them with
//! the file policy — ClusterImagePolicies oldest first, each merged into what
//! is in force so far, so a conflict marks the *newer* object not Ready and
//! leaves the rest; an invalid edit keeps the object's previous generation in
//! force — and putting the result in force on every change. One replica at a
//! time (its own Lease) writes each object's `status` (`Ready` with reason
//! and message, `observedGeneration`, rules in force) and an Event when it
//! stops being Ready; every replica applies policies as soon as its watch
//! sees them, without waiting for status. What a policy means is
//! sigil-core's: an object's spec is parsed exactly as a file document.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::StreamExt as _;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::{Event as KubeEvent, EventType, Recorder, Reporter};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt as _, watcher};
use kube::{Client, Resource, ResourceExt as _};
use serde_json::json;
use sigil_core::Policy;
use sigil_core::policy::NamespacePolicy;

use crate::InForce;
use crate::crd::{ClusterImagePolicy, Condition, ImagePolicy, ImagePolicyException, PolicyStatus};

pub mod compose;
mod exceptions;
use crate::metrics::Metrics;

/// (kind, namespace, name).
type Key = (&'static str, String, String);

/// What an object's status should say.
#[derive(Debug, Clone, PartialEq)]
struct Desired {
    ready: bool,
    reason: &'static str,
    message: String,
    generation: Option<i64>,
    rules: i64,
}

/// The last generation of a team's ImagePolicy that compiled.
#[derive(Debug, Clone)]
enum Good {
    Team(i64, NamespacePolicy),
}

/// The watches and what they put in force.
pub struct Combiner {
    in_force: Arc<dyn InForce>,
    metrics: Arc<Metrics>,
    file: Mutex<Option<Policy>>,
    good: Mutex<HashMap<String, Good>>,
    good_cluster: Mutex<HashMap<String, compose::GoodCluster>>,
    desired: Mutex<HashMap<Key, Desired>>,
    cluster: Store<ClusterImagePolicy>,
    teams: Store<ImagePolicy>,
    exception_store: Store<ImagePolicyException>,
    /// What became of each exception object at the last recompute.
    exceptions: Mutex<HashMap<(String, String), exceptions::Entry>>,
    changed: tokio::sync::Notify,
}

impl std::fmt::Debug for Combiner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Combiner").finish_non_exhaustive()
    }
}

fn ready(rules: usize, generation: Option<i64>) -> Desired {
    Desired {
        ready: true,
        reason: "InForce",
        message: format!("{rules} rule(s) in force"),
        generation,
        rules: i64::try_from(rules).unwrap_or(i64::MAX),
    }
}

fn not_ready(
    reason: &'static str,
    message: String,
    generation: Option<i64>,
    rules: usize,
) -> Desired {
    Desired {
        ready: false,
        reason,
        message,
        generation,
        rules: i64::try_from(rules).unwrap_or(i64::MAX),
    }
}

impl Combiner {
    /// Starts both watches; returns the combiner and a receiver that turns
    /// true once both have listed (readiness waits for it, so a replica never
    /// serves with only part of the policies).
    pub fn start(
        client: Client,
        in_force: Arc<dyn InForce>,
        metrics: Arc<Metrics>,
        file: Option<Policy>,
    ) -> (Arc<Combiner>, tokio::sync::watch::Receiver<bool>) {
        let (cluster, cw) = reflector::store::<ClusterImagePolicy>();
        let (teams, tw) = reflector::store::<ImagePolicy>();
        let (exception_store, ew) = reflector::store::<ImagePolicyException>();
        let c = Arc::new(Combiner {
            exception_store: exception_store.clone(),
            exceptions: Mutex::default(),
            in_force,
            metrics,
            file: Mutex::new(file),
            good: Mutex::default(),
            good_cluster: Mutex::default(),
            desired: Mutex::default(),
            cluster: cluster.clone(),
            teams: teams.clone(),
            changed: tokio::sync::Notify::new(),
        });
        let (tx, rx) = tokio::sync::watch::channel(false);
        let capis: Api<ClusterImagePolicy> = Api::all(client.clone());
        let ipis: Api<ImagePolicy> = Api::all(client.clone());
        // Exceptions do not hold readiness back: until they are listed (or
        // when their CRD is not installed) sigil decides without them, which
        // only denies more.
        let me = c.clone();
        reflect(
            Api::<ImagePolicyException>::all(client),
            ew,
            exception_store,
            "ImagePolicyException watch (install the CRD from deploy/, and grant list/watch on imagepolicyexceptions.sigil.dev: ClusterRole sigil-policies)",
            move || {
                if me.cluster.wait_until_ready().now_or_never_ready()
                    && me.teams.wait_until_ready().now_or_never_ready()
                {
                    me.recompute();
                }
            },
        );
        tokio::spawn(c.clone().count_exceptions());
        let me = c.clone();
        tokio::spawn(async move {
            let a = reflector::reflector(cw, watcher::watcher(capis, watcher::Config::default()))
                .default_backoff()
                .map(|e| e.map(|_| ()));
            let b = reflector::reflector(tw, watcher::watcher(ipis, watcher::Config::default()))
                .default_backoff()
                .map(|e| e.map(|_| ()));
            let mut events = futures_util::stream::select(a, b).boxed();
            while let Some(ev) = events.next().await {
                if let Err(e) = ev {
                    tracing::warn!(error = %e, "policy watch (grant list/watch on clusterimagepolicies and imagepolicies.sigil.dev: ClusterRole sigil-policies)");
                    continue;
                }
                let listed = me.cluster.wait_until_ready().now_or_never_ready()
                    && me.teams.wait_until_ready().now_or_never_ready();
                if listed {
                    me.recompute();
                    let _ = tx.send(true);
                }
            }
        });
        (c, rx)
    }

    /// A new file policy (hot reload): combined with the objects again.
    pub fn set_file(&self, p: Policy) {
        *self.file.lock().unwrap_or_else(|e| e.into_inner()) = Some(p);
        self.recompute();
    }

    /// Recombines everything and puts it in force.
    pub fn recompute(&self) {
        let mut desired = HashMap::new();
        let file = self.file.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let composed = compose::cluster(
            file,
            &self.cluster.state(),
            &mut self.good_cluster.lock().unwrap_or_else(|e| e.into_inner()),
        );
        for (name, state) in composed.states {
            desired.insert(("ClusterImagePolicy", String::new(), name), state);
        }
        let merged = composed.policy;
        let mut good = self.good.lock().unwrap_or_else(|e| e.into_inner());
        // No file and no ClusterImagePolicy yet: the embedded default.
        let mut policy = merged.unwrap_or_else(Policy::embedded_default);
        for t in self.teams.state().iter() {
            let (uid, generation) = (t.uid().unwrap_or_default(), t.metadata.generation);
            let ns = t.namespace().unwrap_or_default();
            let doc = json!({"apiVersion": "sigil.dev/v1alpha1", "kind": "ImagePolicy",
                "metadata": {"name": t.name_any(), "namespace": ns}, "spec": t.spec});
            let state = match NamespacePolicy::from_value(doc) {
                Ok(p) => {
                    let n = p.rules.len();
                    good.insert(uid, Good::Team(generation.unwrap_or(0), p.clone()));
                    let _ = policy.add_namespaced(p);
                    ready(n, generation)
                }
                Err(e) => match good.get(&uid) {
                    Some(Good::Team(g, p)) => {
                        let _ = policy.add_namespaced(p.clone());
                        not_ready(
                            "InvalidSpec",
                            format!("{e}; generation {g} stays in force"),
                            generation,
                            p.rules.len(),
                        )
                    }
                    _ => not_ready("InvalidSpec", format!("{e}; ignored"), generation, 0),
                },
            };
            desired.insert(("ImagePolicy", ns, t.name_any()), state);
        }
        drop(good);
        let entries = exceptions::attach(&mut policy, &self.exception_store.state());
        *self.exceptions.lock().unwrap_or_else(|e| e.into_inner()) = entries;
        if let Err(e) = self.in_force.put_in_force(policy) {
            tracing::warn!(error = %e, "combined policy cannot be put in force; keeping the policy in force");
        }
        self.metrics
            .set_policies(desired.iter().map(|((k, _, _), d)| (*k, d.ready)));
        *self.desired.lock().unwrap_or_else(|e| e.into_inner()) = desired;
        self.changed.notify_waiters();
    }

    /// Writes the policies' and exceptions' status while `leading` is
    /// true: runs until the process ends.
    pub async fn write_status(
        self: Arc<Self>,
        client: Client,
        instance: String,
        leading: tokio::sync::watch::Receiver<bool>,
    ) {
        futures_util::future::join(
            self.clone()
                .write_policy_status(client.clone(), instance.clone(), leading.clone()),
            self.write_exception_status(client, instance, leading),
        )
        .await;
    }

    async fn write_policy_status(
        self: Arc<Self>,
        client: Client,
        instance: String,
        mut leading: tokio::sync::watch::Receiver<bool>,
    ) {
        let recorder = Recorder::new(
            client.clone(),
            Reporter {
                controller: "sigil.dev/policies".into(),
                instance: Some(instance.clone()),
            },
        );
        // What this leader wrote: its own store may not have seen the write
        // yet, and writing the same status twice would be noise.
        let mut written: HashMap<Key, PolicyStatus> = HashMap::new();
        loop {
            if !*leading.borrow() {
                written.clear();
            }
            if leading.wait_for(|l| *l).await.is_err() {
                return;
            }
            let notified = self.changed.notified();
            let desired = self
                .desired
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone();
            let unavailable = self.in_force.unavailable();
            for ((kind, ns, name), mut d) in desired {
                material_problems(&mut d, kind, &ns, &name, &unavailable, &self.cluster);
                let current = match kind {
                    "ClusterImagePolicy" => self
                        .cluster
                        .state()
                        .into_iter()
                        .find(|o| o.name_any() == name)
                        .map(|o| (o.status.clone(), o.object_ref(&()))),
                    _ => self
                        .teams
                        .state()
                        .into_iter()
                        .find(|o| {
                            o.name_any() == name && o.namespace().as_deref() == Some(ns.as_str())
                        })
                        .map(|o| (o.status.clone(), o.object_ref(&()))),
                };
                let Some((status, reference)) = current else {
                    continue;
                };
                let before = status
                    .as_ref()
                    .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Ready").cloned());
                let want = condition(&d, before.as_ref());
                let next = PolicyStatus {
                    observed_generation: d.generation,
                    rules: Some(d.rules),
                    conditions: vec![want.clone()],
                };
                let key = (kind, ns.clone(), name.clone());
                if status.as_ref() == Some(&next) || written.get(&key) == Some(&next) {
                    continue;
                }
                let patch = Patch::Merge(json!({"status": next}));
                let pp = PatchParams::default();
                let result = match kind {
                    "ClusterImagePolicy" => Api::<ClusterImagePolicy>::all(client.clone())
                        .patch_status(&name, &pp, &patch)
                        .await
                        .map(|_| ()),
                    _ => Api::<ImagePolicy>::namespaced(client.clone(), &ns)
                        .patch_status(&name, &pp, &patch)
                        .await
                        .map(|_| ()),
                };
                match result {
                    Ok(()) => {
                        written.insert(key, next);
                        let was_ready = before.as_ref().is_none_or(|c| c.status == "True");
                        if !d.ready && was_ready {
                            let ev = KubeEvent {
                                type_: EventType::Warning,
                                reason: "PolicyNotReady".into(),
                                note: Some(crate::cluster::event_note(&d.message)),
                                action: "Apply".into(),
                                secondary: None,
                            };
                            if let Err(e) = recorder.publish(&ev, &reference).await {
                                tracing::warn!(error = %e, "publishing a policy Event failed");
                            }
                        }
                    }
                    Err(e) => {
                        tracing::warn!(kind, namespace = %ns, name = %name, error = %e, "writing policy status failed")
                    }
                }
            }
            tokio::select! {
                () = notified => {}
                () = tokio::time::sleep(Duration::from_secs(10)) => {}
                _ = leading.changed() => {}
            }
        }
    }
}

/// Marks `d` not Ready when verifiers of its object's rules cannot verify
/// for want of trust material (a `keyRef` or `trustRoot`): the rules are in
/// force and deny what those verifiers should pass, and the message says
/// which verifier lacks what.
fn material_problems(
    d: &mut Desired,
    kind: &str,
    ns: &str,
    name: &str,
    unavailable: &[(String, String, String)],
    cluster: &Store<ClusterImagePolicy>,
) {
    if !d.ready {
        return;
    }
    let team_prefix = format!("ImagePolicy {ns}/{name}, rule ");
    let rules: Vec<String> = match kind {
        "ClusterImagePolicy" => cluster
            .state()
            .iter()
            .find(|c| c.name_any() == name)
            .map(|c| c.spec.rules.iter().map(|r| r.name.clone()).collect())
            .unwrap_or_default(),
        _ => Vec::new(),
    };
    let mine: Vec<String> = unavailable
        .iter()
        .filter_map(|(rule, verifier, why)| {
            let rule = match kind {
                "ClusterImagePolicy" => rules.contains(rule).then_some(rule.as_str()),
                _ => rule.strip_prefix(&team_prefix),
            }?;
            Some(format!("rule {rule:?} verifier {verifier:?}: {why}"))
        })
        .collect();
    if mine.is_empty() {
        return;
    }
    d.ready = false;
    d.reason = "TrustMaterialUnavailable";
    d.message = format!(
        "{}; these verifiers fail every image until their trust material is available: {}",
        d.message,
        mine.join("; ")
    );
}

/// The Ready condition for `d`, keeping the transition time while its status holds.
fn condition(d: &Desired, before: Option<&Condition>) -> Condition {
    let status = if d.ready { "True" } else { "False" };
    let last_transition_time = match before {
        Some(b) if b.status == status => b.last_transition_time.clone(),
        _ => humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string(),
    };
    Condition {
        type_: "Ready".into(),
        status: status.into(),
        reason: d.reason.into(),
        message: d.message.clone(),
        observed_generation: d.generation,
        last_transition_time,
    }
}

/// Whether a store's first list completed (without waiting).
trait NowReady {
    fn now_or_never_ready(self) -> bool;
}

impl<F: std::future::Future> NowReady for F {
    fn now_or_never_ready(self) -> bool {
        futures_util::FutureExt::now_or_never(self).is_some()
    }
}

/// Namespace labels kept by a reflector, for rules with a `namespaceSelector`,
/// and a generation counted up after every event the reflector applied.
#[derive(Debug, Clone)]
pub struct Namespaces(
    Store<k8s_openapi::api::core::v1::Namespace>,
    Arc<std::sync::atomic::AtomicU64>,
);

impl sigil_core::NamespaceLabels for Namespaces {
    fn labels(&self, name: &str) -> Option<sigil_core::policy::Labels> {
        self.0
            .get(&reflector::ObjectRef::new(name))
            .map(|n| n.metadata.labels.clone().unwrap_or_default())
    }

    fn generation(&self) -> Option<u64> {
        Some(self.1.load(std::sync::atomic::Ordering::Acquire))
    }
}

/// Starts the namespace watch; the receiver turns true once it has listed.
pub fn watch_namespaces(client: Client) -> (Arc<Namespaces>, tokio::sync::watch::Receiver<bool>) {
    let (store, writer) = reflector::store();
    let (tx, rx) = tokio::sync::watch::channel(false);
    let api: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client);
    let generation = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let bump = generation.clone();
    reflect(
        api,
        writer,
        store.clone(),
        "namespace watch (grant list/watch on namespaces: ClusterRole sigil-policies)",
        move || {
            // After the reflector applied the event: an answer made from
            // the labels before it is never reused after it.
            bump.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
            let _ = tx.send(true);
        },
    );
    (Arc::new(Namespaces(store, generation)), rx)
}

/// Runs a reflector of `api` into `writer` until the process ends; after
/// each event, once `store` has listed, calls `listed`. Watch errors are
/// logged with `what` (which should say which grant is missing).
pub(crate) fn reflect<K>(
    api: Api<K>,
    writer: reflector::store::Writer<K>,
    store: Store<K>,
    what: &'static str,
    mut listed: impl FnMut() + Send + 'static,
) where
    K: Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + Sync + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone + Send + Sync,
{
    tokio::spawn(async move {
        let mut events =
            reflector::reflector(writer, watcher::watcher(api, watcher::Config::default()))
                .default_backoff()
                .boxed();
        while let Some(ev) = events.next().await {
            if let Err(e) = ev {
                tracing::warn!(error = %e, "{what}");
                continue;
            }
            if store.wait_until_ready().now_or_never_ready() {
                listed();
            }
        }
    });
}
