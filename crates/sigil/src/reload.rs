//! Policy hot reload: the policy file (usually a mounted ConfigMap) is
//! re-read when it changes, and a valid new policy is put in force for new
//! requests without a restart.
//!
//! Owns the decision of what to rebuild: the registry clients and digest
//! cache are kept when the policy's registry settings and cache TTL did not
//! change, so editing a rule does not cool the cache. An invalid new file is
//! logged with its line and counted; the previous policy stays in force. It
//! does not watch certificates (see `tls`).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use sigil_core::Policy;
use sigil_core::credentials::PullSecretStore;
use sigil_registry::keychain::Keychain;
use sigil_registry::{CacheConfig, Registry, RegistryError};

use crate::admission::Webhook;
use crate::engine::Engine;
use crate::metrics::Metrics;

/// How often the policy file is checked. ConfigMap volume updates take up to
/// a minute to reach the pod anyway.
pub const POLL: Duration = Duration::from_secs(2);

/// Where credentials come from besides the policy: set once from flags and
/// kept across policy reloads.
#[derive(Clone, Default)]
pub struct Sources {
    /// `--docker-config`, credential helpers, credential-provider plugins.
    pub keychain: Arc<Keychain>,
    /// Pull secrets and ServiceAccounts from watches (`--pull-secrets`).
    pub pull_secrets: Option<Arc<dyn PullSecretStore>>,
    /// Namespace labels from a watch (`--watch-policies`).
    pub namespaces: Option<Arc<dyn sigil_core::NamespaceLabels>>,
    /// Distinct lookups one object may need (`--max-lookups-per-object`).
    pub max_lookups: usize,
}

impl std::fmt::Debug for Sources {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sources")
            .field("keychain", &self.keychain)
            .field("pull_secrets", &self.pull_secrets.is_some())
            .finish()
    }
}

/// The registry client a policy needs, reusing `current` when nothing it
/// depends on changed.
pub fn registry_for(
    policy: &Policy,
    current: Option<(&Policy, &Registry)>,
    keychain: &Arc<Keychain>,
    metrics: &Arc<Metrics>,
) -> Result<Registry, RegistryError> {
    if let Some((old, reg)) = current
        && old.registries == policy.registries
        && old.cache_ttl == policy.cache_ttl
    {
        return Ok(reg.clone());
    }
    let cache = CacheConfig {
        ttl: policy.cache_ttl,
        ..CacheConfig::default()
    };
    Registry::new(&policy.registries, cache, metrics.clone(), keychain.clone())
}

/// Why a policy could not be put in force.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// Its registry settings cannot be used.
    #[error(transparent)]
    Registry(#[from] RegistryError),
    /// A key, certificate or trust root it names cannot be loaded.
    #[error("signature verification: {0}")]
    Verify(#[from] sigil_verify::VerifyError),
}

/// Builds the engine for a policy: registry clients (reused from `current`
/// when unchanged) and, if any rule verifies, the signature verifier with its
/// trust material loaded now, so a bad key file fails the load, not a request.
pub fn engine_for(
    policy: Arc<Policy>,
    current: Option<&Engine<Registry>>,
    sources: &Sources,
    metrics: &Arc<Metrics>,
) -> Result<Engine<Registry>, EngineError> {
    let registry = registry_for(
        &policy,
        current.map(|e| (e.policy.as_ref(), &e.resolver)),
        &sources.keychain,
        metrics,
    )?;
    let material = sigil_verify::Material::load(&policy)?;
    let mut engine = Engine::new(policy.clone(), registry.clone());
    engine.max_lookups = sources.max_lookups;
    if !material.is_empty() {
        let cache = sigil_verify::CacheConfig {
            ttl: policy.cache_ttl,
            capacity: sigil_verify::DEFAULT_CAPACITY,
            ..Default::default()
        };
        let verifier = sigil_verify::Verifier::new(registry, material, cache, metrics.clone());
        engine = engine.with_verifier(Arc::new(verifier));
    }
    if let Some(store) = &sources.pull_secrets {
        engine = engine.with_pull_secrets(store.clone());
    }
    if let Some(store) = &sources.namespaces {
        engine = engine.with_namespaces(store.clone());
    }
    Ok(engine)
}

/// The contents of every file the policy's verifiers read (unreadable files
/// count as empty), to notice rotations.
async fn material_bytes(policy: &Policy) -> Vec<u8> {
    let mut out = Vec::new();
    for f in sigil_verify::Material::files(policy) {
        out.extend_from_slice(f.as_bytes());
        out.push(0);
        out.extend(tokio::fs::read(&f).await.unwrap_or_default());
        out.push(0);
    }
    out
}

/// Watches `path` forever; `seen` is the content the running policy came from.
pub async fn watch_policy(
    path: PathBuf,
    mut seen: Vec<u8>,
    webhook: Arc<Webhook<Registry>>,
    metrics: Arc<Metrics>,
    combiner: Option<Arc<crate::policies::Combiner>>,
) {
    let mut seen_material = material_bytes(&webhook.engine().policy).await;
    loop {
        tokio::time::sleep(POLL).await;
        let bytes = match tokio::fs::read(&path).await {
            Ok(b) => b,
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "cannot read the policy file; keeping the policy in force");
                continue;
            }
        };
        if bytes == seen {
            // Keys and trust roots rotate without the policy changing.
            let material = material_bytes(&webhook.engine().policy).await;
            if material == seen_material {
                continue;
            }
            tracing::info!(path = %path.display(), "a key, certificate or trusted root the policy names changed; reloading");
        }
        seen = bytes;
        let outcome = match std::str::from_utf8(&seen)
            .map_err(|e| e.to_string())
            .and_then(|t| Policy::from_documents(t).map_err(|e| e.to_string()))
        {
            Ok(policy) if combiner.is_some() => {
                seen_material = material_bytes(&policy).await;
                tracing::info!(path = %path.display(), policy = %policy.name, "policy file reloaded; combining it with the policy objects");
                if let Some(c) = &combiner {
                    c.set_file(policy);
                }
                "ok"
            }
            Ok(policy) => {
                let current = webhook.engine();
                let (name, rules) = (policy.name.clone(), policy.rules.len());
                // Recorded whatever the outcome: a broken key file is reported
                // once, then again only when it changes.
                seen_material = material_bytes(&policy).await;
                let sources = Sources {
                    keychain: current.resolver.keychain().clone(),
                    pull_secrets: current.pull_secrets.clone(),
                    namespaces: current.namespaces.clone(),
                    max_lookups: current.max_lookups,
                };
                match engine_for(Arc::new(policy), Some(&current), &sources, &metrics) {
                    Ok(engine) => {
                        tracing::info!(path = %path.display(), policy = %name, rules, "policy reloaded");
                        webhook.replace(engine);
                        "ok"
                    }
                    Err(e) => {
                        tracing::warn!(path = %path.display(), error = %e, "new policy cannot be put in force; keeping the policy in force");
                        "error"
                    }
                }
            }
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "policy file changed but is invalid; keeping the policy in force");
                "error"
            }
        };
        metrics.policy_reload(outcome);
    }
}
