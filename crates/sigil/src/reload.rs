//! Policy hot reload: the policy file (usually a mounted ConfigMap) is
//! re-read when it changes, and a valid new policy is put in force for new
//! requests without a restart.
//!
//! Owns watching the file (and the key files its verifiers name) and
//! [`Live`]: the webhook's engine in force together with the credential
//! sources, which is how both this watch and sigil-kube's policy objects
//! (`sigil_kube::InForce`) put a new policy in force. What a new engine
//! reuses is [`engine_for`]'s. An invalid new file is logged with its line
//! and counted; the previous policy stays in force. It does not watch
//! certificates (see `tls`).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use sigil_core::Policy;
use sigil_kube::{BoxError, Decide, InForce};
use sigil_registry::Registry;

use crate::admission::Webhook;
use crate::engine::{Sources, engine_for};
use crate::metrics::Metrics;

/// How often the policy file is checked. ConfigMap volume updates take up to
/// a minute to reach the pod anyway.
pub const POLL: Duration = Duration::from_secs(2);

/// The contents of every file the policy's verifiers read (unreadable files
/// count as empty), to notice rotations.
async fn material_bytes(policy: &Policy) -> Vec<u8> {
    let files = sigil_verify::Material::files(policy);
    let read = move || {
        let mut out = Vec::new();
        for f in files {
            out.extend_from_slice(f.as_bytes());
            out.push(0);
            out.extend(
                sigil_registry::file::read(Path::new(&f), sigil_registry::file::MAX_CONFIG_BYTES)
                    .unwrap_or_default(),
            );
            out.push(0);
        }
        out
    };
    tokio::task::spawn_blocking(read).await.unwrap_or_default()
}

/// The policy file's bytes, through the one bounded reader.
async fn read_policy(path: &Path) -> Result<Vec<u8>, sigil_registry::file::FileError> {
    let path = path.to_owned();
    tokio::task::spawn_blocking(move || {
        sigil_registry::file::read(&path, sigil_registry::file::MAX_CONFIG_BYTES)
    })
    .await
    .unwrap_or_else(|e| {
        Err(sigil_registry::file::FileError::Io {
            path: String::new(),
            source: std::io::Error::other(e),
        })
    })
}

/// Watches `path` forever; `seen` is the content the running policy came from.
pub async fn watch_policy(
    path: PathBuf,
    mut seen: Vec<u8>,
    live: Arc<Live>,
    combiner: Option<Arc<sigil_kube::policies::Combiner>>,
) {
    let mut seen_material = material_bytes(&live.webhook.engine().policy).await;
    loop {
        tokio::time::sleep(POLL).await;
        let bytes = match read_policy(&path).await {
            Ok(b) => b,
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "cannot read the policy file; keeping the policy in force");
                continue;
            }
        };
        if bytes == seen {
            // Keys and trust roots rotate without the policy changing.
            let material = material_bytes(&live.webhook.engine().policy).await;
            if material == seen_material {
                continue;
            }
            tracing::info!(path = %path.display(), "a key, certificate or trusted root the policy names changed; reloading");
        }
        seen = bytes;
        let outcome = match std::str::from_utf8(&seen)
            .map_err(|e| e.to_string())
            .and_then(|t| {
                Policy::from_documents_at(t, Some(crate::engine::unix_now()))
                    .map_err(|e| e.to_string())
            }) {
            Ok(policy) => {
                // Recorded whatever the outcome: a broken key file is reported
                // once, then again only when it changes.
                seen_material = material_bytes(&policy).await;
                if let Some(c) = &combiner {
                    tracing::info!(path = %path.display(), policy = %policy.name, "policy file reloaded; combining it with the policy objects");
                    c.set_file(policy);
                    "ok"
                } else {
                    let (name, rules) = (policy.name.clone(), policy.rules.len());
                    match live.put_in_force(policy) {
                        Ok(()) => {
                            tracing::info!(path = %path.display(), policy = %name, rules, "policy reloaded");
                            "ok"
                        }
                        Err(e) => {
                            tracing::warn!(path = %path.display(), error = %e, "new policy cannot be put in force; keeping the policy in force");
                            "error"
                        }
                    }
                }
            }
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "policy file changed but is invalid; keeping the policy in force");
                "error"
            }
        };
        live.metrics.policy_reload(outcome);
    }
}

/// The webhook's engine in force, with what a new one is built from: the
/// credential sources set by flags and the metrics its clients record into.
#[derive(Debug)]
pub struct Live {
    /// The webhook whose engine is swapped.
    pub webhook: Arc<Webhook<Registry>>,
    /// Credentials besides the policy, kept across reloads.
    pub sources: Sources,
    /// Where the new registry client and verifier record.
    pub metrics: Arc<Metrics>,
}

impl Live {
    /// Rebuilds the engine for the policy in force: its verifiers pick up
    /// trust material that changed without the policy changing (a TrustRoot
    /// refreshed, a keyRef ConfigMap rotated). Requests in flight finish
    /// with the engine they started with.
    pub fn rebuild(&self, why: &str) {
        let policy = Policy::clone(&self.webhook.policy());
        match self.put_in_force(policy) {
            Ok(()) => tracing::info!(why, "verifiers rebuilt with the trust material in force"),
            Err(e) => {
                tracing::warn!(why, error = %e, "verifiers could not be rebuilt; the previous ones stay")
            }
        }
    }

    /// Rebuilds whenever `changed` is notified (changes within 200 ms
    /// coalesce into one rebuild). Runs until the process ends.
    pub async fn rebuild_on(self: Arc<Self>, changed: Arc<tokio::sync::Notify>, why: &'static str) {
        loop {
            changed.notified().await;
            tokio::time::sleep(Duration::from_millis(200)).await;
            self.rebuild(why);
        }
    }
}

impl InForce for Live {
    fn current(&self) -> Arc<dyn Decide> {
        self.webhook.engine()
    }

    fn policy(&self) -> Arc<Policy> {
        self.webhook.policy()
    }

    fn unavailable(&self) -> Vec<(String, String, String)> {
        self.webhook.engine().unavailable.clone()
    }

    fn put_in_force(&self, policy: Policy) -> Result<(), BoxError> {
        let current = self.webhook.engine();
        let engine = engine_for(
            Arc::new(policy),
            Some(&current),
            &self.sources,
            &self.metrics,
        )?;
        self.webhook.replace(engine);
        Ok(())
    }
}
