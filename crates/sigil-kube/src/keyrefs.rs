//! The ConfigMaps and Secrets verifiers name by `keyRef`, kept in memory.
//!
//! Owns one watch per referenced object (a field selector on its name, so
//! sigil holds exactly what the policy names and RBAC may be limited to
//! those names), started and stopped as the policy in force changes
//! ([`KeySource::want`]), and answering [`KeySource::pem`] from what the
//! watches last saw. Every change is signalled ([`KeyRefs::changed`]) so the
//! binary rebuilds its verifiers: a rotated key is in force within seconds,
//! without a restart. A missing object or key is an answer (the reason), never
//! a crash; what the PEM means is sigil-verify's. Of a Secret only the keys
//! a reference names are kept. [`KeyRefs::resolve`] is what `sigil node
//! sync` carries to nodes: the PEM with where it came from.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};

use futures_util::StreamExt as _;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::Api;
use kube::runtime::{WatchStreamExt as _, watcher};
use kube::{Client, ResourceExt as _};
use sigil_core::verify::keyref::KeyRefKind;
use sigil_core::verify::node_keys::{Origin, ResolvedKey};
use sigil_core::verify::{KeyRef, KeySource};

/// (kind, namespace, name).
type Object = (KeyRefKind, String, String);

/// What a watch last saw of its object.
#[derive(Debug, Clone)]
enum Seen {
    /// Not listed yet.
    Pending,
    /// The object's uid and resourceVersion, and its data (values as
    /// text; a Secret's only under the keys named).
    Data(String, String, BTreeMap<String, String>),
    /// Not there (or the watch is refused: the reason).
    Missing(String),
}

struct Watch {
    seen: Arc<Mutex<Seen>>,
    /// The keys the references name (all a Secret's watch keeps).
    keys: BTreeSet<String>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Watch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The watched `keyRef` objects.
pub struct KeyRefs {
    client: Client,
    namespace: String,
    watches: Mutex<HashMap<Object, Watch>>,
    changed: Arc<tokio::sync::Notify>,
}

impl std::fmt::Debug for KeyRefs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyRefs")
            .field("namespace", &self.namespace)
            .finish_non_exhaustive()
    }
}

fn kind_name(k: KeyRefKind) -> &'static str {
    match k {
        KeyRefKind::ConfigMap => "ConfigMap",
        KeyRefKind::Secret => "Secret",
    }
}

/// A ConfigMap's `data` and `binaryData` (UTF-8), or a Secret's `data`.
fn data_of_configmap(c: &ConfigMap) -> BTreeMap<String, String> {
    let mut out = c.data.clone().unwrap_or_default();
    for (k, v) in c.binary_data.iter().flatten() {
        if let Ok(s) = String::from_utf8(v.0.clone()) {
            out.insert(k.clone(), s);
        }
    }
    out
}

/// A Secret's `data` under the keys named, and the names of the rest
/// (their values are dropped at once: sigil keeps no key it was not asked
/// for).
fn data_of_secret(s: &Secret, named: &BTreeSet<String>) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for (k, v) in s.data.iter().flatten() {
        let value = if named.contains(k) {
            String::from_utf8(v.0.clone()).ok()
        } else {
            Some(String::new())
        };
        if let Some(t) = value {
            out.insert(k.clone(), t);
        }
    }
    out
}

impl KeyRefs {
    /// Watches objects in `namespace` (sigil's own) for references that
    /// name none.
    pub fn new(client: Client, namespace: String) -> Arc<KeyRefs> {
        Arc::new(KeyRefs {
            client,
            namespace,
            watches: Mutex::default(),
            changed: Arc::new(tokio::sync::Notify::new()),
        })
    }

    /// Notified whenever a watched object changes (or a new watch lists).
    pub fn changed(&self) -> Arc<tokio::sync::Notify> {
        self.changed.clone()
    }

    /// Whether every watch has listed once.
    pub fn all_listed(&self) -> bool {
        self.watches
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .all(|w| {
                !matches!(
                    *w.seen.lock().unwrap_or_else(|e| e.into_inner()),
                    Seen::Pending
                )
            })
    }

    fn object(&self, r: &KeyRef) -> Object {
        let (kind, name) = r.object();
        let ns = r
            .namespace
            .clone()
            .unwrap_or_else(|| self.namespace.clone());
        (kind, ns, name.to_owned())
    }

    fn start(&self, (kind, ns, name): &Object, keys: BTreeSet<String>) -> Watch {
        let seen = Arc::new(Mutex::new(Seen::Pending));
        let (s, changed) = (seen.clone(), self.changed.clone());
        let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
        let what = format!("{} {ns}/{name}", kind_name(*kind));
        let task = match kind {
            KeyRefKind::ConfigMap => {
                let api: Api<ConfigMap> = Api::namespaced(self.client.clone(), ns);
                tokio::spawn(follow(api, config, data_of_configmap, s, changed, what))
            }
            KeyRefKind::Secret => {
                let api: Api<Secret> = Api::namespaced(self.client.clone(), ns);
                let named = keys.clone();
                let data = move |s: &Secret| data_of_secret(s, &named);
                tokio::spawn(follow(api, config, data, s, changed, what))
            }
        };
        Watch { seen, keys, task }
    }

    /// `r` as a node policy carries it: the PEM with where it came from,
    /// or why it cannot be read.
    pub fn resolve(&self, r: &KeyRef) -> ResolvedKey {
        let o = self.object(r);
        let seen = {
            let watches = self.watches.lock().unwrap_or_else(|e| e.into_inner());
            watches
                .get(&o)
                .map(|w| w.seen.lock().unwrap_or_else(|e| e.into_inner()).clone())
        };
        let (pem, from) = match (seen, self.pem(r)) {
            (Some(Seen::Data(uid, rv, _)), Ok(pem)) => {
                let from = Origin::of(o.1, uid, rv, &pem);
                (Ok(pem), Some(from))
            }
            (_, Ok(_)) => (Err(format!("{r} has not been read yet")), None),
            (_, Err(e)) => (Err(e), None),
        };
        match pem {
            Ok(pem) => ResolvedKey {
                key_ref: r.clone(),
                pem: Some(pem),
                from,
                error: None,
            },
            Err(e) => ResolvedKey {
                key_ref: r.clone(),
                pem: None,
                from: None,
                error: Some(e),
            },
        }
    }
}

/// Follows one object's watch, recording what it holds.
async fn follow<K>(
    api: Api<K>,
    config: watcher::Config,
    data: impl Fn(&K) -> BTreeMap<String, String> + Send + 'static,
    seen: Arc<Mutex<Seen>>,
    changed: Arc<tokio::sync::Notify>,
    what: String,
) where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + 'static,
    K::DynamicType: Default,
{
    let mut events = watcher::watcher(api, config).default_backoff().boxed();
    let mut listing: Option<Seen> = None;
    let read = |o: &K| {
        let m = o.meta();
        Seen::Data(
            m.uid.clone().unwrap_or_default(),
            m.resource_version.clone().unwrap_or_default(),
            data(o),
        )
    };
    let set = |v: Seen| {
        *seen.lock().unwrap_or_else(|e| e.into_inner()) = v;
        changed.notify_one();
    };
    while let Some(ev) = events.next().await {
        match ev {
            Ok(watcher::Event::Init) => listing = None,
            Ok(watcher::Event::InitApply(o)) => listing = Some(read(&o)),
            Ok(watcher::Event::InitDone) => set(listing
                .take()
                .unwrap_or_else(|| Seen::Missing(format!("{what} not found")))),
            Ok(watcher::Event::Apply(o)) => {
                tracing::info!(object = %what, name = %o.name_any(), "a keyRef object changed");
                set(read(&o));
            }
            Ok(watcher::Event::Delete(_)) => set(Seen::Missing(format!("{what} was deleted"))),
            Err(e) => {
                tracing::warn!(object = %what, error = %e, "keyRef watch (grant get/list/watch on it: docs/trust.md)");
                let mut s = seen.lock().unwrap_or_else(|e| e.into_inner());
                if matches!(*s, Seen::Pending) {
                    *s = Seen::Missing(format!("{what} cannot be read: {e}"));
                    drop(s);
                    changed.notify_one();
                }
            }
        }
    }
}

impl KeySource for KeyRefs {
    fn pem(&self, r: &KeyRef) -> Result<String, String> {
        let o = self.object(r);
        let watches = self.watches.lock().unwrap_or_else(|e| e.into_inner());
        let Some(w) = watches.get(&o) else {
            return Err(format!("{r} is not watched yet"));
        };
        let seen = w.seen.lock().unwrap_or_else(|e| e.into_inner()).clone();
        match seen {
            Seen::Pending => Err(format!("{r} has not been read yet")),
            Seen::Missing(why) => Err(why),
            Seen::Data(_, _, d) => d.get(&r.key).cloned().ok_or_else(|| {
                let keys: Vec<&str> = d.keys().map(String::as_str).collect();
                format!(
                    "{} {}/{} has no key {:?} (it has: {})",
                    kind_name(o.0),
                    o.1,
                    o.2,
                    r.key,
                    if keys.is_empty() {
                        "none".into()
                    } else {
                        keys.join(", ")
                    }
                )
            }),
        }
    }

    fn want(&self, refs: &[KeyRef]) {
        let mut wanted: BTreeMap<Object, BTreeSet<String>> = BTreeMap::new();
        for r in refs {
            wanted
                .entry(self.object(r))
                .or_default()
                .insert(r.key.clone());
        }
        let mut watches = self.watches.lock().unwrap_or_else(|e| e.into_inner());
        // A Secret's watch keeps only the keys named when it started: one
        // naming another key starts again.
        watches.retain(|o, w| wanted.get(o).is_some_and(|k| *k == w.keys));
        for (o, keys) in wanted {
            if let std::collections::hash_map::Entry::Vacant(v) = watches.entry(o) {
                let w = self.start(v.key(), keys);
                v.insert(w);
            }
        }
    }
}
