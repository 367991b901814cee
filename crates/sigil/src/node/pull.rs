//! A pull decided at the node, shared by containerd's verifier (`sigil
//! node verify`) and `sigil node check`: the node policy loaded (missing,
//! unreadable or invalid, each with the verdict every pull then gets), what
//! the node pulls for itself (`nodeAdmits`), and the one per-object
//! decision on a Pod holding the image, as every front end makes it. The
//! commands only read their flags and print.

use std::path::{Path, PathBuf};
use std::time::Instant;

use serde_json::json;
use sigil_core::verify::node_keys::NodeKeys;
use sigil_core::walker::summarize_value;
use sigil_core::{ObjectFacts, Operation, Policy, Source};

use super::Verdict;
use crate::engine::Sources;
use crate::error::{Context as _, Result};

/// A node policy as loaded: the policy, what its `keyRef`s hold (the
/// `NodeKeys` sync wrote), and the file's bytes.
#[derive(Debug, Clone)]
pub struct Loaded {
    /// The policy.
    pub policy: Policy,
    /// The keys it carries.
    pub keys: NodeKeys,
    /// The file as read (the verdict cache's fingerprint).
    pub bytes: Vec<u8>,
}

/// The node policy the verifier decides by, as containerd's environment
/// names it (or the file sync writes), or the verdict every pull gets
/// without one.
pub fn load(policy: Option<&Path>, allow_missing: bool, image: &str) -> Result<Loaded, Verdict> {
    let (path, named) = match policy {
        Some(p) => (p.to_owned(), "SIGIL_NODE_POLICY"),
        None => (
            PathBuf::from(super::DEFAULT_POLICY),
            "SIGIL_NODE_POLICY is unset: the file sigil node sync writes",
        ),
    };
    let bytes = match sigil_registry::file::read(&path, sigil_registry::file::MAX_CONFIG_BYTES) {
        Ok(b) => b,
        Err(e) if is_not_found(&e) => {
            return Err(missing(
                allow_missing,
                image,
                &format!("no node policy at {} ({named})", path.display()),
            ));
        }
        // Not "missing": a file that is there and cannot be used refuses,
        // whatever SIGIL_NODE_ON_MISSING_POLICY says.
        Err(e) => {
            return Err(Verdict::Deny(format!(
                "sigil refused {image} at pull: the node policy {} cannot be read: {e}; to fix: see sigil node sync's log and /readyz (docs/node.md)",
                path.display()
            )));
        }
    };
    match std::str::from_utf8(&bytes)
        .map_err(|e| e.to_string())
        .and_then(|t| {
            Policy::from_node_documents_at(t, Some(crate::engine::unix_now()))
                .map_err(|e| e.to_string())
        }) {
        Ok((policy, keys)) => Ok(Loaded {
            policy,
            keys,
            bytes,
        }),
        Err(e) => Err(Verdict::Deny(format!(
            "sigil refused {image} at pull: the node policy {} is invalid: {e}",
            path.display()
        ))),
    }
}

/// What a node pulls for itself (`nodeAdmits`): no namespace can exempt it.
pub fn node_admits(policy: &Policy, image: &str) -> Option<Verdict> {
    let p = sigil_core::Reference::parse(image)
        .ok()
        .and_then(|r| policy.node_admits(&r).map(|p| p.source().to_owned()))?;
    Some(Verdict::Allow(Some(format!(
        "sigil-containerd: {image} admitted by nodeAdmits {p:?}"
    ))))
}

fn is_not_found(e: &sigil_registry::file::FileError) -> bool {
    matches!(e, sigil_registry::file::FileError::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound)
}

/// The documented fail mode when there is no policy to decide by.
fn missing(allow: bool, image: &str, why: &str) -> Verdict {
    if allow {
        Verdict::Allow(Some(format!(
            "sigil-containerd: {why}; {image} allowed unverified (SIGIL_NODE_ON_MISSING_POLICY=allow)"
        )))
    } else {
        Verdict::Deny(format!(
            "sigil refused {image} at pull: {why}; to fix: write the node policy (docs/node.md), or set SIGIL_NODE_ON_MISSING_POLICY=allow"
        ))
    }
}

/// The one decision, on a Pod holding the image (no namespace: rules that
/// select namespaces cannot apply at the node), its `keyRef`s answered by
/// the keys the node policy carries.
pub fn decide(
    loaded: Loaded,
    sources: &Sources,
    image: &str,
    deadline: Instant,
) -> Result<Verdict> {
    let metrics = std::sync::Arc::new(crate::metrics::Metrics::default());
    let sources = Sources {
        keys: std::sync::Arc::new(loaded.keys),
        ..sources.clone()
    };
    let policy = std::sync::Arc::new(loaded.policy);
    let engine = crate::engine::engine_for(policy, None, &sources, &metrics)?;
    let pod = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "sigil-containerd"},
        "spec": {"containers": [{"name": "pull", "image": image}]}});
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the verifier's runtime")?;
    let verdict = rt.block_on(engine.decide(
        ObjectFacts {
            operation: Operation::Create,
            source: Source::Manifest,
            kind: "Pod",
            namespace: None,
            object: Some(summarize_value(&pod)),
            old_object: None,
            namespace_labels: None,
        },
        deadline,
    ));
    Ok(Verdict::of(image, &verdict))
}
