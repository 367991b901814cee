//! How ClusterImagePolicies combine with the policy file: the one
//! composition both the webhook ([`super::Combiner`]) and the node
//! DaemonSet (`sigil node sync`, [`crate::node`]) put in force, so a node
//! enforces exactly the cluster-wide policy the webhook has.
//!
//! Owns the order (oldest first by creation time, then name), what a
//! conflict does (the *newer* object is left out, the rest stay), and what
//! an invalid edit does (the object's last generation that compiled stays
//! in force). Pure: the caller lists the objects and keeps the memory of
//! good generations between calls. Team ImagePolicies and exceptions are
//! not here: they are namespaced, and a pull has no namespace.

use std::collections::HashMap;

use kube::ResourceExt as _;
use serde_json::json;
use sigil_core::Policy;

use super::{Desired, not_ready, ready};
use crate::crd::ClusterImagePolicy;

/// The last generation of a ClusterImagePolicy that compiled, with the
/// document it was compiled from (what a node policy file holds).
#[derive(Debug, Clone)]
pub struct GoodCluster {
    generation: i64,
    policy: Box<Policy>,
    document: String,
}

/// What the cluster-wide policy is made of at one moment.
#[derive(Debug, Clone)]
pub struct Composed {
    /// The file merged with every ClusterImagePolicy in force; `None` with
    /// neither.
    pub policy: Option<Policy>,
    /// The documents of the ClusterImagePolicies in force, in the order they
    /// were merged (after the file's own documents, they load to `policy`).
    pub documents: Vec<String>,
    /// Each object's state, by name.
    pub(super) states: Vec<(String, Desired)>,
}

impl Composed {
    /// The objects that are not in force as they are now, with why (for a
    /// log line or a status).
    pub fn problems(&self) -> impl Iterator<Item = (&str, &str)> {
        self.states
            .iter()
            .filter(|(_, d)| !d.ready)
            .map(|(n, d)| (n.as_str(), d.message.as_str()))
    }
}

/// Merges `cips` into `file`, oldest first. `good` is the memory of each
/// object's (by uid) last generation that compiled: updated here, and
/// read when an object's current spec does not compile.
pub fn cluster(
    file: Option<Policy>,
    cips: &[std::sync::Arc<ClusterImagePolicy>],
    good: &mut HashMap<String, GoodCluster>,
) -> Composed {
    let mut cips: Vec<&ClusterImagePolicy> = cips.iter().map(AsRef::as_ref).collect();
    cips.sort_by(|a, b| {
        (
            a.metadata.creation_timestamp.as_ref().map(|t| t.0),
            a.name_any(),
        )
            .cmp(&(
                b.metadata.creation_timestamp.as_ref().map(|t| t.0),
                b.name_any(),
            ))
    });
    let mut merged = file;
    let mut documents = Vec::new();
    let mut states = Vec::new();
    for c in cips {
        let (uid, generation) = (c.uid().unwrap_or_default(), c.metadata.generation);
        // The generation in force already compiled: not again (a sync or a
        // recompute costs the objects that changed, not all of them).
        if let Some(g) = good.get(&uid).filter(|g| generation == Some(g.generation)) {
            let state = ready(g.policy.rules.len(), generation);
            let g = g.clone();
            merge_into(&mut merged, &mut documents, g, state, &mut states, c);
            continue;
        }
        let doc = json!({"apiVersion": "sigil.dev/v1alpha1", "kind": "ClusterImagePolicy",
            "metadata": {"name": c.name_any()}, "spec": c.spec});
        let (current, state) = match Policy::from_json_value(doc.clone()) {
            Ok(p) => {
                let g = GoodCluster {
                    generation: generation.unwrap_or(0),
                    policy: Box::new(p),
                    document: doc.to_string(),
                };
                let n = g.policy.rules.len();
                good.insert(uid, g.clone());
                (Some(g), ready(n, generation))
            }
            Err(e) => match good.get(&uid) {
                Some(g) => (
                    Some(g.clone()),
                    not_ready(
                        "InvalidSpec",
                        format!("{e}; generation {} stays in force", g.generation),
                        generation,
                        g.policy.rules.len(),
                    ),
                ),
                None => (None, not_ready("InvalidSpec", e.to_string(), generation, 0)),
            },
        };
        match current {
            Some(g) => merge_into(&mut merged, &mut documents, g, state, &mut states, c),
            None => states.push((c.name_any(), state)),
        }
    }
    Composed {
        policy: merged,
        documents,
        states,
    }
}

/// Merges one object's good generation into what is in force so far; on a
/// conflict the object (the newer: objects come oldest first) is left out.
fn merge_into(
    merged: &mut Option<Policy>,
    documents: &mut Vec<String>,
    g: GoodCluster,
    mut state: Desired,
    states: &mut Vec<(String, Desired)>,
    c: &ClusterImagePolicy,
) {
    *merged = Some(match merged.take() {
        None => {
            documents.push(g.document);
            *g.policy
        }
        Some(m) => match m.clone().merge(*g.policy) {
            Ok(x) => {
                documents.push(g.document);
                x
            }
            Err(e) => {
                state = not_ready(
                    "Conflict",
                    format!("{e}; this policy is newer, so it is not in force (the others are)"),
                    c.metadata.generation,
                    0,
                );
                m
            }
        },
    });
    states.push((c.name_any(), state));
}
