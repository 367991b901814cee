//! What `sigil node sync` checks before it gives a node a policy, and the
//! health it reports: a node policy must load on the node exactly as it is
//! written, so the verifier never refuses every pull because of what sync
//! wrote (docs/node.md).
//!
//! Owns the limits on the file ([`MAX_POLICY_BYTES`]), the trust material a
//! node cannot have ([`elsewhere`]: files and `keyRef`s that exist in the
//! webhook's Pod, not on a host), and the sync's state as `/readyz` and
//! `/metrics` show it ([`Status`]). The composition is sigil-kube's (the
//! webhook's own); serving HTTP is [`super::status`].

use std::sync::Mutex;

use sigil_core::Policy;

/// The largest node policy sync writes: the most the verifier reads (a
/// larger file would refuse every pull on the node).
pub const MAX_POLICY_BYTES: usize = sigil_registry::file::MAX_CONFIG_BYTES as usize;

/// Trust material the policy names that a node does not have, one line per
/// rule or registry: key and certificate files (they are mounted into the
/// webhook's Pod, not onto hosts) and `keyRef`s (resolved by the webhook's
/// watch of its own namespace). A policy with any is not given to nodes:
/// every signed image would be refused there.
pub fn elsewhere(policy: &Policy) -> Vec<String> {
    let mut out = Vec::new();
    for (rule, v) in policy.verifications() {
        let attestors = v.attestations.iter().flat_map(|a| &a.attestors);
        for spec in v.verifiers.iter().chain(attestors) {
            for (field, path) in spec.files() {
                out.push(format!(
                    "rule {rule:?}, verifier {:?}: {field} names the file {path}, which is in the webhook's Pod, not on the node: put the PEM in the policy itself",
                    spec.name
                ));
            }
            let cosign = spec.cosign.iter().flat_map(|c| c.key_ref.iter());
            let notation = spec.notation.iter().flat_map(|n| n.refs());
            for r in cosign.chain(notation) {
                out.push(format!(
                    "rule {rule:?}, verifier {:?}: keyRef {r} is read by the webhook from the API, which the node's verifier does not call: put the PEM in the policy itself",
                    spec.name
                ));
            }
        }
    }
    for r in &policy.registries {
        if let Some(ca) = r.ca.as_deref()
            && !ca.contains("-----BEGIN ")
        {
            out.push(format!(
                "registry {}: ca names the file {ca}, which is in the webhook's Pod, not on the node: put the PEM in the policy itself",
                r.host
            ));
        }
    }
    out
}

/// What the sync has done, as its probes and metrics show it.
#[derive(Debug, Default)]
pub struct Status {
    inner: Mutex<State>,
}

#[derive(Debug, Default, Clone)]
struct State {
    installed: bool,
    last_error: Option<String>,
    failures: u64,
    last_success: Option<u64>,
    bytes: usize,
    left_out: usize,
}

impl Status {
    fn with<T>(&self, f: impl FnOnce(&mut State) -> T) -> T {
        f(&mut self.inner.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// A sync that gave the node `bytes` of policy, leaving out `left_out`
    /// ClusterImagePolicies (not in force at the webhook either).
    pub fn synced(&self, bytes: usize, left_out: usize, at: u64) {
        self.with(|s| {
            s.last_error = None;
            s.last_success = Some(at);
            s.bytes = bytes;
            s.left_out = left_out;
        });
    }

    /// A sync that failed: the node keeps the policy it has.
    pub fn failed(&self, why: String) {
        self.with(|s| {
            s.failures += 1;
            s.last_error = Some(why);
        });
    }

    /// The verifier is linked in containerd's `bin_dir`.
    pub fn installed(&self) {
        self.with(|s| s.installed = true);
    }

    /// `Ok` when the node has the policy in force and the verifier
    /// installed; else why not (the body of a 503 from `/readyz`).
    pub fn readiness(&self) -> Result<(), String> {
        self.with(|s| match (&s.last_error, s.installed) {
            (Some(e), _) => Err(format!(
                "the last sync failed (the node keeps the policy it has): {e}"
            )),
            (None, false) => Err("the verifier is not installed yet".to_owned()),
            (None, true) => Ok(()),
        })
    }

    /// The Prometheus text page.
    pub fn metrics(&self) -> String {
        let s = self.with(|s| s.clone());
        let mut out = String::new();
        let mut family = |name: &str, kind: &str, help: &str, value: String| {
            out.push_str(&format!(
                "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}\n"
            ));
        };
        family(
            "sigil_node_sync_healthy",
            "gauge",
            "1 when the last sync gave the node the cluster's policy and the verifier is installed.",
            u8::from(s.last_error.is_none() && s.installed).to_string(),
        );
        family(
            "sigil_node_sync_failures_total",
            "counter",
            "Syncs that failed: the node kept the policy it had.",
            s.failures.to_string(),
        );
        family(
            "sigil_node_sync_last_success_timestamp_seconds",
            "gauge",
            "When a sync last gave the node the cluster's policy (unix seconds).",
            s.last_success.unwrap_or(0).to_string(),
        );
        family(
            "sigil_node_policy_bytes",
            "gauge",
            "The size of the node policy file written last.",
            s.bytes.to_string(),
        );
        family(
            "sigil_node_policies_left_out",
            "gauge",
            "ClusterImagePolicies not in force as they are (invalid or in conflict; the webhook leaves them out too).",
            s.left_out.to_string(),
        );
        family(
            "sigil_node_verifier_installed",
            "gauge",
            "1 once sigil-containerd is linked in containerd's bin_dir.",
            u8::from(s.installed).to_string(),
        );
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trust_the_node_cannot_read_is_named_by_rule() {
        let p = Policy::from_documents_at(
            "apiVersion: sigil.dev/v1alpha1\nkind: ImagePolicy\nmetadata: {name: p}\nspec:\n  registries: [{host: r.example.com, ca: /etc/sigil/ca.pem}]\n  rules:\n    - name: signed\n      match: [\"r.example.com/**\"]\n      verify: [{name: alice, cosign: {key: /etc/sigil/alice.pub}}]\n",
            None,
        )
        .unwrap();
        let e = elsewhere(&p);
        assert_eq!(e.len(), 2, "{e:?}");
        assert!(e[0].contains("rule \"signed\"") && e[0].contains("/etc/sigil/alice.pub"));
        assert!(e[1].contains("registry r.example.com") && e[1].contains("ca.pem"));
    }

    #[test]
    fn readiness_follows_the_last_sync() {
        let s = Status::default();
        assert!(s.readiness().is_err());
        s.synced(10, 0, 1);
        s.installed();
        assert!(s.readiness().is_ok());
        s.failed("the API server is gone".into());
        assert!(s.readiness().unwrap_err().contains("gone"));
        assert!(s.metrics().contains("sigil_node_sync_healthy 0"));
        assert!(s.metrics().contains("sigil_node_sync_failures_total 1"));
        s.synced(10, 1, 2);
        assert!(s.metrics().contains("sigil_node_sync_healthy 1"));
    }
}
