//! Verification keys and certificates kept in the cluster: a `keyRef`
//! names one key of a ConfigMap or Secret, and [`KeySource`] is the I/O
//! edge that answers it (sigil-kube's watches implement it).
//!
//! Owns the reference's schema, where it is looked up (a cluster policy's
//! in sigil's own namespace unless it says otherwise; a team's always in
//! its own namespace, set when the team policy compiles), and the trait.
//! It reads nothing itself.

use std::fmt;

use serde::{Deserialize, Serialize};

/// `keyRef: {configMap: NAME, key: KEY}` or `{secret: NAME, key: KEY}`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct KeyRef {
    /// A ConfigMap's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_map: Option<String>,
    /// A Secret's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret: Option<String>,
    /// The key in its `data` holding PEM.
    pub key: String,
    /// Its namespace: sigil's own when a cluster policy leaves it out; a
    /// team policy's is always its own (a team cannot name another).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
}

/// Which kind of object a [`KeyRef`] names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum KeyRefKind {
    /// A ConfigMap.
    ConfigMap,
    /// A Secret.
    Secret,
}

impl KeyRef {
    /// The kind and name it refers to (validation guarantees exactly one).
    pub fn object(&self) -> (KeyRefKind, &str) {
        match (&self.config_map, &self.secret) {
            (Some(n), _) => (KeyRefKind::ConfigMap, n),
            (None, Some(n)) => (KeyRefKind::Secret, n),
            (None, None) => (KeyRefKind::ConfigMap, ""),
        }
    }

    /// Checks the reference as written.
    pub fn validate(&self) -> Result<(), String> {
        match (&self.config_map, &self.secret) {
            (Some(_), Some(_)) | (None, None) => {
                return Err("keyRef needs exactly one of configMap or secret".into());
            }
            _ => {}
        }
        if self.key.is_empty() {
            return Err("keyRef.key is empty".into());
        }
        Ok(())
    }
}

impl fmt::Display for KeyRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (kind, name) = self.object();
        let kind = match kind {
            KeyRefKind::ConfigMap => "ConfigMap",
            KeyRefKind::Secret => "Secret",
        };
        match &self.namespace {
            Some(ns) => write!(f, "{kind} {ns}/{name} key {:?}", self.key),
            None => write!(f, "{kind} {name} key {:?}", self.key),
        }
    }
}

/// Puts every `keyRef` of a team's verifier in the team's namespace; a
/// reference to another namespace is refused (a team reads its own keys).
pub fn confine(spec: &mut super::VerifierSpec, namespace: &str) -> Result<(), String> {
    let refs = spec
        .cosign
        .iter_mut()
        .flat_map(|c| c.key_ref.iter_mut())
        .chain(spec.notation.iter_mut().flat_map(|n| n.refs_mut()));
    for r in refs {
        match &r.namespace {
            Some(ns) if ns != namespace => {
                return Err(format!(
                    "verifier {:?}: keyRef may only name objects in this policy's namespace {namespace:?}, not {ns:?}",
                    spec.name
                ));
            }
            _ => r.namespace = Some(namespace.to_owned()),
        }
    }
    Ok(())
}

/// Answers [`KeyRef`]s from the cluster (kept current by watches).
pub trait KeySource: Send + Sync {
    /// The PEM text `r` names (namespace already resolved), or why not.
    fn pem(&self, r: &KeyRef) -> Result<String, String>;
    /// The references the policy in force needs, so only those are watched.
    fn want(&self, refs: &[KeyRef]);
}

/// No cluster: every `keyRef` is unavailable (client-side commands).
#[derive(Debug, Default, Clone, Copy)]
pub struct NoKeySource;

impl KeySource for NoKeySource {
    fn pem(&self, r: &KeyRef) -> Result<String, String> {
        Err(format!(
            "{r} cannot be read here: keyRef needs sigil serve with cluster access (--watch-policies)"
        ))
    }

    fn want(&self, _: &[KeyRef]) {}
}
