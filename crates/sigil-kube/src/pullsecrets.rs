//! Pull secrets and ServiceAccounts held in memory by kube-runtime watches
//! (`sigil serve --pull-secrets`), so a decision never waits for the API
//! server.
//!
//! Owns three kinds of watch — Secrets of type
//! `kubernetes.io/dockerconfigjson`, Secrets of type `kubernetes.io/dockercfg`
//! (each by field selector on `type`), ServiceAccounts — cluster-wide or per
//! namespace, and what is kept of them: a Secret's parsed auths (never the
//! Secret itself; the credentials are zeroed when dropped), a
//! ServiceAccount's `imagePullSecrets` names. A relist replaces a watch's
//! contents atomically. It implements [`PullSecretStore`] for the engine, and
//! reports when every watch has synced once (readiness waits for it). A
//! watch refused for RBAC says which permission is missing.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use futures_util::StreamExt as _;
use k8s_openapi::api::core::v1::{Secret, ServiceAccount};
use kube::runtime::WatchStreamExt as _;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client, ResourceExt as _};
use sigil_core::credentials::{Auths, PullSecretStore, SecretAuths, parse_docker_config};

use crate::metrics::Metrics;

/// `(namespace, name)`.
type Key = (String, String);

/// One watch's contents: namespace → name → value, so a lookup allocates nothing.
#[derive(Debug)]
struct Partition<V> {
    items: RwLock<HashMap<String, HashMap<String, V>>>,
}

impl<V> Default for Partition<V> {
    fn default() -> Self {
        Partition {
            items: RwLock::default(),
        }
    }
}

impl<V: Clone> Partition<V> {
    fn get(&self, ns: &str, name: &str) -> Option<V> {
        self.items
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(ns)?
            .get(name)
            .cloned()
    }

    fn len(&self) -> usize {
        self.items
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .map(HashMap::len)
            .sum()
    }

    fn insert(map: &mut HashMap<String, HashMap<String, V>>, (ns, name): Key, v: V) {
        map.entry(ns).or_default().insert(name, v);
    }

    fn remove(map: &mut HashMap<String, HashMap<String, V>>, (ns, name): &Key) {
        if let Some(m) = map.get_mut(ns) {
            m.remove(name);
            if m.is_empty() {
                map.remove(ns);
            }
        }
    }
}

/// The store the engine reads.
#[derive(Debug, Default)]
pub struct PullSecrets {
    dockerconfigjson: Partition<SecretAuths>,
    dockercfg: Partition<SecretAuths>,
    service_accounts: Partition<Vec<String>>,
    /// Counted up after every event applied (see [`PullSecretStore::generation`]).
    generation: std::sync::atomic::AtomicU64,
}

impl PullSecrets {
    /// After an event was applied: answers made before it are not reused.
    fn changed(&self) {
        self.generation
            .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
    }
}

impl PullSecretStore for PullSecrets {
    fn secret(&self, namespace: &str, name: &str) -> Option<SecretAuths> {
        self.dockerconfigjson
            .get(namespace, name)
            .or_else(|| self.dockercfg.get(namespace, name))
    }

    fn service_account(&self, namespace: &str, name: &str) -> Option<Vec<String>> {
        self.service_accounts.get(namespace, name)
    }

    fn generation(&self) -> Option<u64> {
        Some(self.generation.load(std::sync::atomic::Ordering::Acquire))
    }
}

/// The Secret types kubelet reads pull credentials from: (type, data key, legacy form).
const SECRET_TYPES: [(&str, &str, bool); 2] = [
    ("kubernetes.io/dockerconfigjson", ".dockerconfigjson", false),
    ("kubernetes.io/dockercfg", ".dockercfg", true),
];

/// The parsed auths of a Secret, or why not (logged, never the content).
fn auths_of(s: &Secret, key: &str, legacy: bool) -> Result<SecretAuths, String> {
    let data = s
        .data
        .as_ref()
        .and_then(|d| d.get(key))
        .ok_or_else(|| format!("has no {key} key"))?;
    parse_docker_config(&data.0, legacy)
        .map(|entries| Arc::new(Auths::new(&entries)))
        .map_err(|e| e.to_string())
}

fn key_of<K: kube::Resource>(o: &K) -> Key {
    (o.namespace().unwrap_or_default(), o.name_any())
}

/// Applies one watch's events to a partition: single changes at once, a
/// relist (Init … InitDone) atomically when it completes. Returns whether
/// this event completed a (re)list.
fn apply<K: kube::Resource, V: Clone>(
    part: &Partition<V>,
    buffer: &mut Option<HashMap<String, HashMap<String, V>>>,
    event: Event<K>,
    value: impl Fn(&K) -> Option<V>,
) -> bool {
    match event {
        Event::Init => {
            *buffer = Some(HashMap::new());
            false
        }
        Event::InitApply(o) => {
            if let (Some(b), Some(v)) = (buffer.as_mut(), value(&o)) {
                Partition::insert(b, key_of(&o), v);
            }
            false
        }
        Event::InitDone => {
            if let Some(b) = buffer.take() {
                *part.items.write().unwrap_or_else(|e| e.into_inner()) = b;
            }
            true
        }
        Event::Apply(o) => {
            let mut items = part.items.write().unwrap_or_else(|e| e.into_inner());
            match value(&o) {
                Some(v) => Partition::insert(&mut items, key_of(&o), v),
                None => Partition::remove(&mut items, &key_of(&o)),
            }
            false
        }
        Event::Delete(o) => {
            let mut items = part.items.write().unwrap_or_else(|e| e.into_inner());
            Partition::remove(&mut items, &key_of(&o));
            false
        }
    }
}

/// What an RBAC refusal means for this watch, in the operator's words.
fn explain(e: &watcher::Error, what: &str, scope: &str) -> String {
    let forbidden = match e {
        watcher::Error::InitialListFailed(kube::Error::Api(s))
        | watcher::Error::WatchStartFailed(kube::Error::Api(s)) => s.code == 403,
        watcher::Error::WatchError(s) => s.code == 403,
        _ => false,
    };
    if forbidden {
        format!(
            "sigil's ServiceAccount may not list/watch {what} {scope}: grant list and watch on {what} (ClusterRole sigil-pull-secrets in deploy/kustomize/base/rbac.yaml), or limit --pull-secrets-namespaces to namespaces it may read ({e})"
        )
    } else {
        format!("watching {what} {scope}: {e}")
    }
}

/// Starts the watches; returns the store and a receiver that turns true
/// once every watch has listed once.
pub fn start(
    client: Client,
    namespaces: &[String],
    metrics: Arc<Metrics>,
) -> (Arc<PullSecrets>, tokio::sync::watch::Receiver<bool>) {
    let store = Arc::new(PullSecrets::default());
    let scopes: Vec<Option<String>> = if namespaces.is_empty() {
        vec![None]
    } else {
        namespaces.iter().cloned().map(Some).collect()
    };
    let watches = scopes.len() * 3;
    let (synced_tx, synced_rx) = tokio::sync::watch::channel(false);
    let synced = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let done = {
        let synced = synced.clone();
        let metrics = metrics.clone();
        move |first: &mut bool| {
            if std::mem::take(first)
                && synced.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1 == watches
            {
                metrics.pull_secrets_synced.set(1);
                tracing::info!("pull secrets and ServiceAccounts synced");
                let _ = synced_tx.send(true);
            }
        }
    };
    let done = Arc::new(std::sync::Mutex::new(done));
    for scope in scopes {
        let where_ = scope.as_deref().map_or_else(
            || "cluster-wide".to_owned(),
            |n| format!("in namespace {n}"),
        );
        for (i, (ty, key, legacy)) in SECRET_TYPES.iter().enumerate() {
            let api: Api<Secret> = match &scope {
                Some(ns) => Api::namespaced(client.clone(), ns),
                None => Api::all(client.clone()),
            };
            let cfg = watcher::Config::default().fields(&format!("type={ty}"));
            let (store, done, metrics, where_) =
                (store.clone(), done.clone(), metrics.clone(), where_.clone());
            tokio::spawn(async move {
                let part = if i == 0 {
                    &store.dockerconfigjson
                } else {
                    &store.dockercfg
                };
                let mut buffer = None;
                let mut first = true;
                let mut events = watcher::watcher(api, cfg).default_backoff().boxed();
                while let Some(ev) = events.next().await {
                    match ev {
                        Ok(ev) => {
                            let listed = apply(part, &mut buffer, ev, |s: &Secret| {
                                auths_of(s, key, *legacy)
                                    .map_err(|why| tracing::warn!(secret = %format!("{}/{}", s.namespace().unwrap_or_default(), s.name_any()), r#type = ty, %why, "pull secret ignored"))
                                    .ok()
                            });
                            store.changed();
                            metrics
                                .pull_secrets_objects
                                .get_or_create(&vec![("kind".to_owned(), (*ty).to_owned())])
                                .set(i64::try_from(part.len()).unwrap_or(i64::MAX));
                            if listed {
                                (done.lock().unwrap_or_else(|e| e.into_inner()))(&mut first);
                            }
                        }
                        Err(e) => {
                            tracing::warn!(error = %explain(&e, "secrets", &where_), "pull secrets watch")
                        }
                    }
                }
            });
        }
        let api: Api<ServiceAccount> = match &scope {
            Some(ns) => Api::namespaced(client.clone(), ns),
            None => Api::all(client.clone()),
        };
        let (store, done, metrics) = (store.clone(), done.clone(), metrics.clone());
        tokio::spawn(async move {
            let mut buffer = None;
            let mut first = true;
            let mut events = watcher::watcher(api, watcher::Config::default())
                .default_backoff()
                .boxed();
            while let Some(ev) = events.next().await {
                match ev {
                    Ok(ev) => {
                        let listed = apply(
                            &store.service_accounts,
                            &mut buffer,
                            ev,
                            |sa: &ServiceAccount| {
                                Some(
                                    sa.image_pull_secrets
                                        .iter()
                                        .flatten()
                                        .map(|r| r.name.clone())
                                        .filter(|n| !n.is_empty())
                                        .collect(),
                                )
                            },
                        );
                        store.changed();
                        metrics
                            .pull_secrets_objects
                            .get_or_create(&vec![("kind".to_owned(), "serviceaccount".to_owned())])
                            .set(i64::try_from(store.service_accounts.len()).unwrap_or(i64::MAX));
                        if listed {
                            (done.lock().unwrap_or_else(|e| e.into_inner()))(&mut first);
                        }
                    }
                    Err(e) => {
                        tracing::warn!(error = %explain(&e, "serviceaccounts", &where_), "pull secrets watch")
                    }
                }
            }
        });
    }
    (store, synced_rx)
}
