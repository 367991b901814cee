//! What `sigil node sync` (the node DaemonSet) reads from the API: the
//! platform's policy as documents a node policy file can hold — the policy
//! ConfigMap's file and every ClusterImagePolicy in force, each as one
//! document (JSON is YAML), composed by the webhook's own composition — so
//! the node decides by the same policy as the webhook. Team ImagePolicies
//! are not read: namespaces do not exist at a pull. It writes nothing to
//! the API and decides nothing.

use std::collections::HashMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::Client;
use kube::api::{Api, ListParams};
use sigil_core::Policy;

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
        let file = configmap_file(client, namespace, name, "policy.yaml")
            .await?
            .ok_or_else(|| {
                Error::Invalid(format!("ConfigMap {namespace}/{name} has no policy.yaml"))
            })?;
        let policy = Policy::from_documents_at(&file, Some(now)).map_err(|e| {
            Error::Invalid(format!(
                "the policy in ConfigMap {namespace}/{name} is invalid: {e}"
            ))
        })?;
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
        let composed = compose::cluster(Some(policy), &cips, &mut self.good);
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
        })
    }
}
