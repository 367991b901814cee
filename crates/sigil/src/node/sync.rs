//! What `sigil node sync` checks before it gives a node a policy, and the
//! health it reports: a node policy must load on the node exactly as it is
//! written, so the verifier never refuses every pull because of what sync
//! wrote (docs/node.md).
//!
//! Owns the limits on the file ([`MAX_POLICY_BYTES`]), the trust material a
//! node cannot have ([`elsewhere`]: files that exist in the webhook's Pod,
//! not on a host; `keyRef`s are resolved by sync and carried in the file),
//! the RBAC a node needs for them ([`rbac`]), and the sync's state as
//! `/readyz` and
//! `/metrics` show it ([`Status`]). The composition is sigil-kube's (the
//! webhook's own); serving HTTP is [`super::status`].

use std::sync::Mutex;

use sigil_core::Policy;

/// The largest node policy sync writes: the most the verifier reads (a
/// larger file would refuse every pull on the node).
pub const MAX_POLICY_BYTES: usize = sigil_registry::file::MAX_CONFIG_BYTES as usize;

/// Trust material the policy names that a node does not have, one line per
/// rule or registry: key and certificate files (they are mounted into the
/// webhook's Pod, not onto hosts; a `keyRef` is read by sync and carried in
/// the node policy instead). A policy with any is not given to nodes: every
/// signed image would be refused there.
pub fn elsewhere(policy: &Policy) -> Vec<String> {
    let mut out = Vec::new();
    for (rule, v) in policy.verifications() {
        let attestors = v.attestations.iter().flat_map(|a| &a.attestors);
        for spec in v.verifiers.iter().chain(attestors) {
            for (field, path) in spec.files() {
                out.push(format!(
                    "rule {rule:?}, verifier {:?}: {field} names the file {path}, which is in the webhook's Pod, not on the node: put the PEM in the policy itself, or name it by keyRef (a ConfigMap or Secret sync carries to nodes)",
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
                "registry {}: ca names the file {ca}, which is in the webhook's Pod, not on the node: put the PEM in the policy itself, or name it by keyRef (a ConfigMap or Secret sync carries to nodes)",
                r.host
            ));
        }
    }
    out
}

/// The program interpreter (dynamic loader) an ELF executable names, if
/// any: `None` for a static executable (or bytes that are not ELF, which
/// the run before linking refuses).
pub fn interpreter(elf: &[u8]) -> Option<String> {
    const PT_INTERP: u32 = 3;
    if elf.get(..4) != Some(b"\x7fELF") || elf.get(4) != Some(&2) || elf.get(5) != Some(&1) {
        return None;
    }
    let u16_at = |o: usize| elf.get(o..o + 2).map(|b| u16::from_le_bytes([b[0], b[1]]));
    let u32_at = |o: usize| {
        elf.get(o..o + 4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    };
    let u64_at = |o: usize| {
        elf.get(o..o + 8)
            .and_then(|b| <[u8; 8]>::try_from(b).ok())
            .map(u64::from_le_bytes)
    };
    let phoff = usize::try_from(u64_at(0x20)?).ok()?;
    let (size, count) = (usize::from(u16_at(0x36)?), usize::from(u16_at(0x38)?));
    (0..count).find_map(|i| {
        let h = phoff.checked_add(i.checked_mul(size)?)?;
        if u32_at(h)? != PT_INTERP {
            return None;
        }
        let off = usize::try_from(u64_at(h + 8)?).ok()?;
        let len = usize::try_from(u64_at(h + 32)?).ok()?;
        let name = elf.get(off..off.checked_add(len)?)?;
        Some(
            String::from_utf8_lossy(name)
                .trim_end_matches('\0')
                .to_owned(),
        )
    })
}

/// What the sync has done, as its probes and metrics show it.
#[derive(Debug, Default)]
pub struct Status {
    inner: Mutex<State>,
}

#[derive(Debug, Default, Clone)]
struct State {
    installed: bool,
    install_error: Option<String>,
    last_error: Option<String>,
    failures: u64,
    last_success: Option<u64>,
    bytes: usize,
    left_out: usize,
    keys_unreadable: usize,
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

    /// How many `keyRef`s of the policy given to the node could not be
    /// read (their verifiers refuse every image there, as at the webhook).
    pub fn keys_unreadable(&self, n: usize) {
        self.with(|s| s.keys_unreadable = n);
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
        self.with(|s| {
            s.installed = true;
            s.install_error = None;
        });
    }

    /// The verifier could not be installed (it is not linked: containerd
    /// pulls without it).
    pub fn install_failed(&self, why: String) {
        self.with(|s| {
            s.failures += 1;
            s.install_error = Some(why);
        });
    }

    /// `Ok` when the node has the policy in force and the verifier
    /// installed; else why not (the body of a 503 from `/readyz`).
    pub fn readiness(&self) -> Result<(), String> {
        self.with(|s| match (&s.last_error, &s.install_error, s.installed) {
            (Some(e), _, _) => Err(format!(
                "the last sync failed (the node keeps the policy it has): {e}"
            )),
            (None, Some(e), _) => Err(format!(
                "the verifier is not installed (containerd pulls without it): {e}"
            )),
            (None, None, false) => Err("the verifier is not installed yet".to_owned()),
            (None, None, true) => Ok(()),
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
            "Syncs that failed (the node kept the policy it had) and installs that failed.",
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
            "sigil_node_keyrefs_unreadable",
            "gauge",
            "keyRefs of the node policy that could not be read (their verifiers refuse every image, as at the webhook).",
            s.keys_unreadable.to_string(),
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
    fn a_dynamic_executable_names_its_loader_and_a_static_one_none() {
        // This test binary is linked as the host's toolchain links it.
        let me = std::fs::read("/proc/self/exe").unwrap();
        let dynamic = cfg!(target_env = "gnu");
        assert_eq!(
            interpreter(&me).is_some(),
            dynamic,
            "{:?}",
            interpreter(&me)
        );
        assert_eq!(interpreter(b"#!/bin/sh\n"), None);
        assert_eq!(interpreter(&me[..64]), None);
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
