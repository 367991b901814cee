//! The credentials a lookup tries, in kubelet's order: the object's cluster
//! credentials (its pull secrets, or its ServiceAccount's — handed in by the
//! caller), then the node-level ones this process holds — the policy's
//! `registries[].auth`, `--docker-config` (`auths`, then its credential
//! helpers), kubelet credential-provider plugins — and anonymous last.
//!
//! Owns assembling that list for one image. It does not send requests: the
//! registry client tries each candidate until one is accepted.

use std::path::Path;
use std::time::Duration;

use sigil_core::credentials::{Candidate, CredentialSource, Keyring, parse_docker_config};
use sigil_core::{PullCredentials, Reference};

use crate::RegistryError;
use crate::helper::Helpers;
use crate::provider::Providers;

/// How long a credential helper or provider plugin may take.
pub const EXEC_TIMEOUT: Duration = Duration::from_secs(10);

/// Node-level credential sources beyond the policy: a docker config and the
/// kubelet credential-provider plugins.
#[derive(Debug, Default)]
pub struct Keychain {
    docker_config: Keyring,
    helpers: Option<Helpers>,
    providers: Option<Providers>,
}

/// The candidates for one lookup, and what went wrong gathering them.
#[derive(Debug, Default)]
pub struct Candidates {
    /// In the order to try; anonymous last.
    pub list: Vec<Candidate>,
    /// Sources that could not be asked (a helper or plugin failed), with why.
    pub problems: Vec<String>,
}

impl Keychain {
    /// Loads `--docker-config` (its `auths` and credential helpers) and
    /// `--image-credential-provider-config` with its bin dir.
    pub fn load(
        docker_config: Option<&Path>,
        providers: Option<(&Path, &Path)>,
    ) -> Result<Keychain, RegistryError> {
        let mut k = Keychain::default();
        if let Some(path) = docker_config {
            let bytes = crate::file::read(path, crate::file::MAX_CONFIG_BYTES).map_err(|e| {
                RegistryError::Credentials {
                    source_name: path.display().to_string(),
                    detail: e.to_string(),
                }
            })?;
            let bad = |detail: String| RegistryError::Credentials {
                source_name: path.display().to_string(),
                detail,
            };
            let auths = parse_docker_config(&bytes, false).map_err(|e| bad(e.to_string()))?;
            k.docker_config.add(&auths, &CredentialSource::DockerConfig);
            k.helpers = Helpers::from_docker_config(&bytes, EXEC_TIMEOUT).map_err(bad)?;
        }
        if let Some((config, bin_dir)) = providers {
            k.providers = Some(Providers::load(config, bin_dir, EXEC_TIMEOUT).map_err(|e| {
                RegistryError::Credentials {
                    source_name: config.display().to_string(),
                    detail: e.to_string(),
                }
            })?);
        }
        Ok(k)
    }

    /// Whether it holds no source at all.
    pub fn is_empty(&self) -> bool {
        self.docker_config.is_empty() && self.helpers.is_none() && self.providers.is_none()
    }

    /// Every candidate for `target`, in order: `cluster`, then `policy`
    /// (the host's `registries[].auth`), the docker config's auths and
    /// helper, the providers, anonymous.
    ///
    /// Helpers and providers run processes; their futures are boxed so that
    /// every lookup's future (made per image, cached or not) stays small.
    pub async fn candidates(
        &self,
        target: &Reference,
        cluster: &PullCredentials,
        policy: Result<Option<Candidate>, String>,
    ) -> Candidates {
        let mut c = Candidates {
            list: cluster.candidates.clone(),
            problems: Vec::new(),
        };
        match policy {
            Ok(Some(p)) => c.list.push(p),
            Ok(None) => {}
            Err(why) => c.problems.push(why),
        }
        if !self.is_empty() {
            let name = target.name_str();
            c.list.extend(self.docker_config.lookup(name));
            if let Some(h) = &self.helpers {
                match Box::pin(h.credential(target.domain())).await {
                    Ok(Some(found)) => c.list.push(found),
                    Ok(None) => {}
                    Err(why) => c.problems.push(why),
                }
            }
            if let Some(p) = &self.providers {
                let got = Box::pin(p.credentials(name, &target.to_string())).await;
                c.list.extend(got.candidates);
                c.problems.extend(got.failures);
            }
        }
        c.list.push(Candidate::anonymous());
        c
    }
}
