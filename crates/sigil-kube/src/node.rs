//! What `sigil node sync` (the node DaemonSet) reads from the API: the
//! platform's policy as documents a node policy file can hold — the policy
//! ConfigMap's file and every ClusterImagePolicy in force, each as one
//! document (JSON is YAML), composed by the webhook's own composition — so
//! the node decides by the same policy as the webhook. Team ImagePolicies
//! are not read: namespaces do not exist at a pull. It writes nothing to
//! the API and decides nothing.
//!
//! [`watch`] is how a node follows the policy: list once, then watch (the
//! ConfigMap by a `metadata.name` field selector, the ClusterImagePolicies
//! with bookmarks), composing only when an input's `resourceVersion`
//! changed. A watch that breaks resumes from its last resourceVersion; a
//! 410 Gone relists (kube-runtime's watcher). [`NodeComposer::read`] is the
//! one-shot read (the fleet benchmark's polling baseline).
//!
//! The `keyRef`s of the policy composed are followed too (one watch per
//! object named, [`crate::keyrefs::KeyRefs`], in the policy ConfigMap's
//! namespace unless a reference names another), and the node policy
//! carries what they hold as a `NodeKeys` document: a rotated key reaches
//! the nodes as a policy edit does.

use std::collections::HashMap;
use std::sync::Arc;

use futures_util::{FutureExt as _, StreamExt as _};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Client;
use kube::api::{Api, ListParams};
use kube::runtime::{WatchStreamExt as _, reflector, watcher};
use sigil_core::Policy;

use sigil_core::verify::node_keys::{self, NodeKeys};

use crate::crd::ClusterImagePolicy;
use crate::error::{Context as _, Error, Result};
use crate::policies::compose::{self, GoodCluster};

/// The policy file held in ConfigMap `namespace/name` under `key`; `None`
/// when the ConfigMap or the key does not exist.
pub async fn configmap_file(
    client: &Client,
    namespace: &str,
    name: &str,
    key: &str,
) -> Result<Option<String>> {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    let cm = api
        .get_opt(name)
        .await
        .with_context(|| format!("reading ConfigMap {namespace}/{name}"))?;
    Ok(cm.and_then(|c| c.data).and_then(|mut d| d.remove(key)))
}

/// What `sigil node sync` writes: the cluster-wide policy the webhook has
/// in force, as a file a node loads.
#[derive(Debug, Clone)]
pub struct NodePolicy {
    /// The file's text: the ConfigMap's documents, then each
    /// ClusterImagePolicy in force as one document, in the order merged.
    pub text: String,
    /// What it loads to.
    pub policy: Policy,
    /// ClusterImagePolicies not in force as they are now, and why.
    pub left_out: Vec<(String, String)>,
    /// What the policy's `keyRef`s hold (in `text` as its last document
    /// when there are any).
    pub keys: NodeKeys,
}

impl NodePolicy {
    /// This policy carrying `keys`: its text with them as the last
    /// document.
    fn with_keys(&self, keys: NodeKeys) -> NodePolicy {
        let mut text = self.text.clone();
        if !keys.keys.is_empty() {
            text.push_str("\n---\n");
            text.push_str(&keys.document());
            text.push('\n');
        }
        NodePolicy {
            text,
            policy: self.policy.clone(),
            left_out: self.left_out.clone(),
            keys,
        }
    }
}

/// Composes the node policy across syncs as the webhook does (one code
/// path, [`crate::policies::compose`]): it remembers each
/// ClusterImagePolicy's last generation that compiled, so an invalid edit
/// keeps that generation at the nodes too, and settles conflicts oldest
/// first.
#[derive(Debug, Default)]
pub struct NodeComposer {
    good: HashMap<String, GoodCluster>,
}

impl NodeComposer {
    /// Reads ConfigMap `namespace/name` (key `policy.yaml`, loaded at `now`
    /// as the webhook loads its file) and, with `objects`, every
    /// ClusterImagePolicy (listed from the API server's watch cache).
    pub async fn read(
        &mut self,
        client: &Client,
        (namespace, name): (&str, &str),
        objects: bool,
        now: i64,
    ) -> Result<NodePolicy> {
        let file = configmap_file(client, namespace, name, "policy.yaml").await?;
        let cips: Vec<Arc<ClusterImagePolicy>> = if objects {
            Api::<ClusterImagePolicy>::all(client.clone())
                // Any resourceVersion: served from the API server's watch
                // cache, not etcd (every node lists on every sync).
                .list(&ListParams::default().match_any())
                .await
                .context("listing ClusterImagePolicies")?
                .items
                .into_iter()
                .map(Arc::new)
                .collect()
        } else {
            Vec::new()
        };
        self.compose((namespace, name), file, &cips, now)
    }

    /// Composes the node policy from the ConfigMap's `policy.yaml` (`None`:
    /// the ConfigMap or its key is missing, an error) and the
    /// ClusterImagePolicies, loaded at `now`.
    pub fn compose(
        &mut self,
        (namespace, name): (&str, &str),
        file: Option<String>,
        cips: &[Arc<ClusterImagePolicy>],
        now: i64,
    ) -> Result<NodePolicy> {
        let file = file.ok_or_else(|| {
            Error::Invalid(format!("ConfigMap {namespace}/{name} has no policy.yaml"))
        })?;
        let policy = Policy::from_documents_at(&file, Some(now)).map_err(|e| {
            Error::Invalid(format!(
                "the policy in ConfigMap {namespace}/{name} is invalid: {e}"
            ))
        })?;
        let composed = compose::cluster(Some(policy), cips, &mut self.good);
        // Objects deleted since: forget them.
        self.good
            .retain(|uid, _| cips.iter().any(|c| c.metadata.uid.as_deref() == Some(uid)));
        let left_out = composed
            .problems()
            .map(|(n, why)| (n.to_owned(), why.to_owned()))
            .collect();
        let mut text = file;
        for d in &composed.documents {
            text.push_str("\n---\n");
            text.push_str(d);
            text.push('\n');
        }
        Ok(NodePolicy {
            text,
            policy: composed
                .policy
                .ok_or_else(|| Error::Invalid("no policy was composed".to_owned()))?,
            left_out,
            keys: NodeKeys::default(),
        })
    }
}

/// What [`watch`] reports after its inputs moved.
#[derive(Debug)]
pub enum Change {
    /// An input changed: the policy composed from them now.
    Composed(Box<NodePolicy>),
    /// The watches listed again (after an error or a 410 Gone) and found
    /// the inputs as they were: the policy last reported stands.
    Unchanged,
}

/// The `resourceVersion`s the last composition was made from: the
/// ConfigMap's, then each ClusterImagePolicy's (by uid, sorted).
type Inputs = (Option<String>, Vec<(String, String)>);

/// Follows the node policy's inputs — ConfigMap `namespace/name` (key
/// `policy.yaml`), with `objects` the ClusterImagePolicies, and the objects
/// the composed policy's `keyRef`s name — by list-then-watch, calling `on`
/// once all have listed and again each time an input changed (events that
/// arrive together are composed once), with an error when a watch fails (it
/// retries with backoff, resuming from its last resourceVersion) or the
/// inputs do not compose. A `keyRef` that cannot be read is carried as its
/// reason (the verifiers naming it fail on the node, as at the webhook). In
/// steady state it makes no request beyond its watches. Runs until the
/// process ends.
pub async fn watch(
    client: Client,
    (namespace, name): (&str, &str),
    objects: bool,
    mut on: impl FnMut(Result<Change>),
) {
    let (cm_store, cm_writer) = reflector::store::<ConfigMap>();
    let by_name = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let cms = reflector::reflector(
        cm_writer,
        watcher::watcher(Api::namespaced(client.clone(), namespace), by_name),
    )
    .default_backoff()
    .map(|e| {
        e.map(|_| ())
            .map_err(|e| Error::Invalid(format!("watching the policy ConfigMap: {e}")))
    });
    let (cip_store, cip_writer) = reflector::store::<ClusterImagePolicy>();
    let cips = if objects {
        reflector::reflector(
            cip_writer,
            watcher::watcher(Api::all(client.clone()), watcher::Config::default()),
        )
        .default_backoff()
        .map(|e| {
            e.map(|_| ())
                .map_err(|e| Error::Invalid(format!("watching ClusterImagePolicies: {e}")))
        })
        .boxed()
    } else {
        futures_util::stream::empty::<Result<()>>().boxed()
    };
    let mut events = futures_util::stream::select(cms.boxed(), cips);
    let key_refs = crate::keyrefs::KeyRefs::new(client, namespace.to_owned());
    let keys_changed = key_refs.changed();
    let mut composer = NodeComposer::default();
    let mut last: Option<Inputs> = None;
    let mut failed = false;
    // The policy last composed (without keys), and whether it has been
    // reported; the keys last reported with it.
    let mut composed: Option<(NodePolicy, bool)> = None;
    let mut reported_keys: Option<NodeKeys> = None;
    loop {
        let ev = tokio::select! {
            ev = events.next() => match ev {
                Some(ev) => Some(ev),
                None => return,
            },
            () = keys_changed.notified() => None,
        };
        if let Some(ev) = ev {
            let mut errors = Vec::new();
            if let Err(e) = ev {
                errors.push(e);
            }
            // Events already here (a list's objects, a burst of edits): one
            // composition for all of them.
            while let Some(Some(ev)) = events.next().now_or_never() {
                if let Err(e) = ev {
                    errors.push(e);
                }
            }
            if let Some(e) = errors.pop() {
                failed = true;
                on(Err(e));
                continue;
            }
            let listed = cm_store.wait_until_ready().now_or_never().is_some()
                && (!objects || cip_store.wait_until_ready().now_or_never().is_some());
            if !listed {
                continue;
            }
            let cm = cm_store
                .state()
                .into_iter()
                .find(|c| c.metadata.name.as_deref() == Some(name));
            let objs = if objects {
                cip_store.state()
            } else {
                Vec::new()
            };
            let inputs = inputs_of(cm.as_deref(), &objs);
            if last.as_ref() == Some(&inputs) {
                if std::mem::take(&mut failed) {
                    on(Ok(Change::Unchanged));
                }
                continue;
            }
            last = Some(inputs);
            failed = false;
            let file = cm.and_then(|c| c.data.as_ref().and_then(|d| d.get("policy.yaml").cloned()));
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX));
            match composer.compose((namespace, name), file, &objs, now) {
                Ok(p) => {
                    sigil_core::verify::KeySource::want(
                        key_refs.as_ref(),
                        &node_keys::cluster_refs(&p.policy),
                    );
                    composed = Some((p, false));
                }
                Err(e) => {
                    failed = true;
                    on(Err(e));
                    continue;
                }
            }
        }
        // Report once every keyRef object has been read: the composed
        // policy when it is new, or when what its keys hold changed.
        let Some((policy, reported)) = composed.as_mut() else {
            continue;
        };
        if !key_refs.all_listed() {
            continue;
        }
        let keys = NodeKeys {
            keys: node_keys::cluster_refs(&policy.policy)
                .iter()
                .map(|r| key_refs.resolve(r))
                .collect(),
        };
        if *reported && reported_keys.as_ref() == Some(&keys) {
            continue;
        }
        *reported = true;
        on(Ok(Change::Composed(Box::new(
            policy.with_keys(keys.clone()),
        ))));
        reported_keys = Some(keys);
    }
}

/// The `resourceVersion`s of the ConfigMap and the ClusterImagePolicies.
fn inputs_of(cm: Option<&ConfigMap>, objs: &[Arc<ClusterImagePolicy>]) -> Inputs {
    let mut versions: Vec<(String, String)> = objs
        .iter()
        .map(|c| {
            (
                c.metadata.uid.clone().unwrap_or_default(),
                c.metadata.resource_version.clone().unwrap_or_default(),
            )
        })
        .collect();
    versions.sort_unstable();
    (
        cm.and_then(|c| c.metadata.resource_version.clone()),
        versions,
    )
}
