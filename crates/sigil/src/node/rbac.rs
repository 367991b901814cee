//! What the node DaemonSet's ServiceAccount may read, derived from the
//! policy: the policy ConfigMap and exactly the ConfigMaps and Secrets the
//! cluster's `keyRef`s name, each by `resourceNames` (a watch selected by
//! `metadata.name` is authorized by them), in each namespace they live in.
//! Nothing else — no other Secret, no write.
//!
//! Owns that derivation ([`reads`]) and its rendering as Roles and
//! RoleBindings ([`render`], what `sigil node rbac` prints and the Kustomize
//! component ships). The chart renders the same from its `policy` value
//! (templates/node.yaml); a test holds the two equal.

use std::collections::BTreeMap;

use serde_json::{Value, json};
use sigil_core::Policy;
use sigil_core::verify::keyref::KeyRefKind;
use sigil_core::verify::node_keys::cluster_refs;

/// The objects read in one namespace, by name.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Reads {
    /// ConfigMaps.
    pub config_maps: Vec<String>,
    /// Secrets.
    pub secrets: Vec<String>,
}

/// What node sync reads, by namespace: ConfigMap `policy` (`namespace`,
/// `name`), and every object the policy's cluster rules name by `keyRef`
/// (in `policy.0` unless the reference names another namespace) plus
/// `extra` (references in ClusterImagePolicies applied later).
pub fn reads(
    policy_configmap: (&str, &str),
    policy: &Policy,
    extra: &[sigil_core::verify::KeyRef],
) -> BTreeMap<String, Reads> {
    let (own, name) = policy_configmap;
    let mut out: BTreeMap<String, Reads> = BTreeMap::new();
    out.entry(own.to_owned())
        .or_default()
        .config_maps
        .push(name.to_owned());
    for r in cluster_refs(policy).iter().chain(extra) {
        let ns = r.namespace.clone().unwrap_or_else(|| own.to_owned());
        let e = out.entry(ns).or_default();
        let (kind, name) = r.object();
        let list = match kind {
            KeyRefKind::ConfigMap => &mut e.config_maps,
            KeyRefKind::Secret => &mut e.secrets,
        };
        if !list.iter().any(|n| n == name) {
            list.push(name.to_owned());
        }
    }
    out
}

/// A Role and RoleBinding per namespace of `reads`, for ServiceAccount
/// `account` (`namespace`, `name`).
pub fn render(reads: &BTreeMap<String, Reads>, account: (&str, &str)) -> Vec<Value> {
    let mut out = Vec::new();
    for (ns, r) in reads {
        let mut rules = Vec::new();
        for (resource, names) in [("configmaps", &r.config_maps), ("secrets", &r.secrets)] {
            if !names.is_empty() {
                rules.push(json!({"apiGroups": [""], "resources": [resource],
                    "resourceNames": names, "verbs": ["get", "list", "watch"]}));
            }
        }
        out.push(
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": {"name": "sigil-node", "namespace": ns}, "rules": rules}),
        );
        out.push(json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": "sigil-node", "namespace": ns},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "sigil-node"},
            "subjects": [{"kind": "ServiceAccount", "name": account.1, "namespace": account.0}]}));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_named_object_is_read_by_name_and_nothing_else() {
        let p = Policy::from_documents_at(
            "apiVersion: sigil.dev/v1alpha1\nkind: ImagePolicy\nmetadata: {name: p}\nspec:\n  rules:\n    - name: a\n      match: [\"r.example.com/a/**\"]\n      verify:\n        - {name: k, cosign: {keyRef: {configMap: keys, key: a.pub}}}\n        - {name: s, cosign: {keyRef: {secret: vendor, key: v.pub, namespace: vendors}}}\n    - name: b\n      match: [\"r.example.com/b/**\"]\n      verify: [{name: k2, cosign: {keyRef: {configMap: keys, key: b.pub}}}]\n",
            None,
        )
        .unwrap();
        let r = reads(("sigil-system", "sigil-policy"), &p, &[]);
        assert_eq!(r["sigil-system"].config_maps, ["sigil-policy", "keys"]);
        assert!(r["sigil-system"].secrets.is_empty());
        assert_eq!(r["vendors"].secrets, ["vendor"]);
        let objects = render(&r, ("sigil-node", "sigil-node"));
        assert_eq!(objects.len(), 4);
        let vendors = &objects[2];
        assert_eq!(vendors["metadata"]["namespace"], "vendors");
        assert_eq!(vendors["rules"][0]["resources"][0], "secrets");
        assert_eq!(vendors["rules"][0]["resourceNames"], json!(["vendor"]));
    }
}
