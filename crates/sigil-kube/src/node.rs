//! What `sigil node sync` (the node DaemonSet) reads from the API: the
//! platform's policy as documents a node policy file can hold — the policy
//! ConfigMap's file and every ClusterImagePolicy, each as one document (JSON
//! is YAML) — so the node decides by the same policy as the webhook. Team
//! ImagePolicies are not read: namespaces do not exist at a pull. It
//! writes nothing to the API and decides nothing.

use k8s_openapi::api::core::v1::ConfigMap;
use kube::Client;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, ListParams};

use crate::error::{Context as _, Result};

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

/// Every ClusterImagePolicy as `(name, document)`, sorted by name.
pub async fn cluster_policy_documents(client: &Client) -> Result<Vec<(String, String)>> {
    let gvk = GroupVersionKind::gvk("sigil.dev", "v1alpha1", "ClusterImagePolicy");
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &ApiResource::from_gvk(&gvk));
    let list = api
        // Any resourceVersion: served from the API server's watch cache,
        // not etcd (every node lists on every sync).
        .list(&ListParams::default().match_any())
        .await
        .context("listing ClusterImagePolicies")?;
    let mut docs: Vec<(String, String)> = list
        .items
        .into_iter()
        .filter_map(|o| {
            let name = o.metadata.name?;
            let doc = serde_json::json!({
                "apiVersion": "sigil.dev/v1alpha1",
                "kind": "ClusterImagePolicy",
                "metadata": {"name": name},
                "spec": o.data.get("spec").cloned().unwrap_or_default(),
            });
            Some((name, doc.to_string()))
        })
        .collect();
    docs.sort();
    Ok(docs)
}
