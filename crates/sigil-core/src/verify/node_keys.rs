//! The keys a node policy carries for its `keyRef`s: a node's verifier
//! calls no API at a pull, so `sigil node sync` reads each ConfigMap or
//! Secret key the policy names and writes what it found into the node
//! policy file as one more document, `kind: NodeKeys`.
//!
//! Owns that document's schema, [`refs_of`] (every `keyRef` a policy's
//! verifiers name: what sync must resolve and what RBAC must allow) and
//! the [`KeySource`] a node decides with: each reference answers exactly
//! what sync found — the PEM with where it came from (namespace, uid,
//! resourceVersion, sha256), or why it could not be read, which fails only
//! the verifiers naming it, as at the webhook. Reading the API is
//! sigil-kube's; writing the file is the binary's.

use serde::{Deserialize, Serialize};

use super::{KeyRef, KeySource};
use crate::Policy;

/// The document's `kind`.
pub const KIND: &str = "NodeKeys";

/// Where a resolved key came from: enough to tell, on the node, which
/// object and revision the PEM is (and that it is the PEM read).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Origin {
    /// The object's namespace (the reference's, or sigil's own).
    pub namespace: String,
    /// The object's `metadata.uid`.
    pub uid: String,
    /// The object's `metadata.resourceVersion` when read.
    pub resource_version: String,
    /// Hex SHA-256 of the PEM text.
    pub sha256: String,
}

impl Origin {
    /// The origin of `pem`, read from object `namespace` (`uid`) at
    /// `resource_version`.
    pub fn of(namespace: String, uid: String, resource_version: String, pem: &str) -> Origin {
        use sha2::Digest as _;
        let sha256 = sha2::Sha256::digest(pem.as_bytes())
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        Origin {
            namespace,
            uid,
            resource_version,
            sha256,
        }
    }
}

/// One reference as sync resolved it: `pem` and `from`, or `error`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ResolvedKey {
    /// The reference exactly as the policy writes it.
    pub key_ref: KeyRef,
    /// The PEM text under the named key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pem: Option<String>,
    /// Where it came from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<Origin>,
    /// Why it could not be read (the verifiers naming it fail with it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Document {
    api_version: String,
    kind: String,
    metadata: Metadata,
    #[serde(default)]
    keys: Vec<ResolvedKey>,
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct Metadata {
    name: String,
}

/// The keys of a node policy, answering its `keyRef`s.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeKeys {
    /// One per reference, in the order the policy names them.
    pub keys: Vec<ResolvedKey>,
}

impl NodeKeys {
    /// The document as it is written into a node policy (JSON, which is
    /// YAML: a PEM's newlines stay escaped on one line).
    pub fn document(&self) -> String {
        let doc = Document {
            api_version: "sigil.dev/v1alpha1".into(),
            kind: KIND.into(),
            metadata: Metadata {
                name: "sigil-node-keys".into(),
            },
            keys: self.keys.clone(),
        };
        serde_json::to_string(&doc).unwrap_or_default()
    }

    /// Reads one `NodeKeys` document.
    pub fn from_yaml(doc: &str) -> Result<NodeKeys, String> {
        let d: Document = serde_saphyr::from_str_with_options(doc, crate::yaml::options(doc))
            .map_err(|e| e.to_string())?;
        if d.api_version != "sigil.dev/v1alpha1" {
            return Err(format!(
                "{KIND} apiVersion {:?} is not sigil.dev/v1alpha1",
                d.api_version
            ));
        }
        for k in &d.keys {
            k.key_ref.validate()?;
            if k.pem.is_some() == k.error.is_some() {
                return Err(format!(
                    "{KIND}: {} needs exactly one of pem or error",
                    k.key_ref
                ));
            }
        }
        Ok(NodeKeys { keys: d.keys })
    }
}

impl KeySource for NodeKeys {
    fn pem(&self, r: &KeyRef) -> Result<String, String> {
        let Some(k) = self.keys.iter().find(|k| &k.key_ref == r) else {
            return Err(format!(
                "{r} is not in the node policy (sigil node sync writes every keyRef the policy names: see its /readyz)"
            ));
        };
        match (&k.pem, &k.error) {
            (Some(pem), _) => Ok(pem.clone()),
            (None, Some(e)) => Err(e.clone()),
            (None, None) => Err(format!("{r} has no PEM in the node policy")),
        }
    }

    fn want(&self, _: &[KeyRef]) {}
}

/// Every `keyRef` the policy's verifiers and attestors name, each once, in
/// the order the policy names them (as written: a cluster rule's namespace
/// not resolved; a team's set to the team's).
pub fn refs_of(policy: &Policy) -> Vec<KeyRef> {
    refs_in(policy.verifications().into_iter().map(|(_, v)| v))
}

/// [`refs_of`] for the cluster's rules only: what a node enforces (a pull
/// has no namespace, so teams' rules never apply there) and so what sync
/// resolves and the node's RBAC names.
pub fn cluster_refs(policy: &Policy) -> Vec<KeyRef> {
    refs_in(policy.rules.iter().filter_map(|r| r.verification.as_ref()))
}

fn refs_in<'a>(
    verifications: impl Iterator<Item = &'a std::sync::Arc<super::Verification>>,
) -> Vec<KeyRef> {
    let mut out: Vec<KeyRef> = Vec::new();
    for v in verifications {
        let attestors = v.attestations.iter().flat_map(|a| &a.attestors);
        for spec in v.verifiers.iter().chain(attestors) {
            let cosign = spec.cosign.iter().flat_map(|c| c.key_ref.iter());
            let notation = spec.notation.iter().flat_map(|n| n.refs());
            for r in cosign.chain(notation) {
                if !out.contains(r) {
                    out.push(r.clone());
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cm(name: &str, key: &str) -> KeyRef {
        KeyRef {
            config_map: Some(name.into()),
            secret: None,
            key: key.into(),
            namespace: None,
        }
    }

    #[test]
    fn a_document_round_trips_and_answers_each_reference_as_resolved() {
        let keys = NodeKeys {
            keys: vec![
                ResolvedKey {
                    key_ref: cm("keys", "cosign.pub"),
                    pem: Some(
                        "-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n".into(),
                    ),
                    from: Some(Origin {
                        namespace: "sigil-system".into(),
                        uid: "u".into(),
                        resource_version: "7".into(),
                        sha256: "ab".into(),
                    }),
                    error: None,
                },
                ResolvedKey {
                    key_ref: cm("gone", "k"),
                    pem: None,
                    from: None,
                    error: Some("ConfigMap sigil-system/gone not found".into()),
                },
            ],
        };
        let back = NodeKeys::from_yaml(&keys.document()).unwrap();
        assert_eq!(back, keys);
        assert!(
            back.pem(&cm("keys", "cosign.pub"))
                .unwrap()
                .contains("AAAA")
        );
        assert!(
            back.pem(&cm("gone", "k"))
                .unwrap_err()
                .contains("not found")
        );
        assert!(
            back.pem(&cm("other", "k"))
                .unwrap_err()
                .contains("not in the node policy")
        );
    }

    #[test]
    fn only_a_node_policy_may_carry_keys() {
        let policy = "apiVersion: sigil.dev/v1alpha1\nkind: ImagePolicy\nmetadata: {name: p}\nspec:\n  rules: [{name: r, match: [\"r.example.com/**\"], verify: [{name: k, cosign: {keyRef: {configMap: keys, key: k.pub}}}]}]\n";
        let keys = NodeKeys {
            keys: vec![ResolvedKey {
                key_ref: cm("keys", "k.pub"),
                pem: Some("PEM".into()),
                from: None,
                error: None,
            }],
        };
        let text = format!("{policy}---\n{}\n", keys.document());
        let e = Policy::from_documents_at(&text, None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("written by sigil node sync"), "{e}");
        let (p, back) = Policy::from_node_documents_at(&text, None).unwrap();
        assert_eq!(back, keys);
        assert_eq!(cluster_refs(&p), vec![cm("keys", "k.pub")]);
        let (_, none) = Policy::from_node_documents_at(policy, None).unwrap();
        assert!(none.keys.is_empty());
    }

    #[test]
    fn an_entry_with_both_or_neither_of_pem_and_error_is_refused() {
        let both = r#"{"apiVersion":"sigil.dev/v1alpha1","kind":"NodeKeys","metadata":{"name":"n"},"keys":[{"keyRef":{"configMap":"a","key":"k"},"pem":"x","error":"y"}]}"#;
        assert!(
            NodeKeys::from_yaml(both)
                .unwrap_err()
                .contains("exactly one")
        );
        let neither = both.replace(r#","pem":"x","error":"y""#, "");
        assert!(NodeKeys::from_yaml(&neither).is_err());
    }
}
