//! Pull credentials the way kubelet finds them: which secrets an object may
//! use, how a docker config's keys match an image, and in which order
//! credentials are tried.
//!
//! Owns the credential value (whose secret part never prints and is wiped on
//! drop), where each credential came from ([`CredentialSource`], for denials
//! and metrics), docker config parsing (`kubernetes.io/dockerconfigjson` and
//! `kubernetes.io/dockercfg`) and kubelet's keyring matching ([`Keyring`]) —
//! both in the `keyring` submodule — and the object's pull context ([`PullContext`]: its own `imagePullSecrets`,
//! else — for workloads — its ServiceAccount's, exactly as the
//! ServiceAccount admission plugin would give the Pod). It does no I/O:
//! Secrets and ServiceAccounts arrive through [`PullSecretStore`],
//! implemented by the binary's watches; credential helpers and provider
//! plugins are run by `sigil-registry`.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use base64::Engine as _;
use serde::Deserialize;
use sha2::{Digest as _, Sha256};
use zeroize::Zeroizing;

use crate::dockerhub::canonical_domain;

mod keyring;

use keyring::ImageLocation;
pub use keyring::{
    Auths, CredentialError, Keyring, SecretAuths, key_matches, parse_docker_config, registry_of,
};

/// A registry credential: Basic user and password, or an identity token
/// (exchanged at the token service as a refresh token). The secret part is
/// never shown by `Debug` and is zeroed when dropped.
/// Cloning is cheap (shared), so a credential can be handed to every
/// lookup that may use it.
#[derive(Clone)]
pub struct Credential(Arc<Inner>);

struct Inner {
    username: String,
    secret: Zeroizing<String>,
    identity_token: bool,
    /// See [`Credential::identity`]; computed once, used per lookup.
    identity: String,
}

impl PartialEq for Credential {
    fn eq(&self, other: &Credential) -> bool {
        self.0.username == other.0.username
            && self.0.identity_token == other.0.identity_token
            && self.0.secret == other.0.secret
    }
}

impl Eq for Credential {}

impl fmt::Debug for Credential {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Credential")
            .field("username", &self.0.username)
            .field("identity", &self.identity())
            .finish_non_exhaustive()
    }
}

impl Credential {
    fn new(username: String, secret: String, identity_token: bool) -> Credential {
        let mut h = Sha256::new();
        h.update(username.as_bytes());
        h.update([0, u8::from(identity_token)]);
        h.update(secret.as_bytes());
        let identity = h
            .finalize()
            .iter()
            .take(8)
            .map(|b| format!("{b:02x}"))
            .collect();
        Credential(Arc::new(Inner {
            username,
            secret: Zeroizing::new(secret),
            identity_token,
            identity,
        }))
    }

    /// The user name (`<token>` for identity tokens, as docker writes them).
    pub fn username(&self) -> &str {
        &self.0.username
    }

    /// Whether the secret is an identity (refresh) token, not a password.
    pub fn is_identity_token(&self) -> bool {
        self.0.identity_token
    }

    /// Basic credentials.
    pub fn basic(username: impl Into<String>, password: impl Into<String>) -> Credential {
        Credential::new(username.into(), password.into(), false)
    }

    /// An identity (refresh) token.
    pub fn identity_token(username: impl Into<String>, token: impl Into<String>) -> Credential {
        Credential::new(username.into(), token.into(), true)
    }

    /// `Authorization: Basic …` value for the registry or its token service.
    pub fn basic_header(&self) -> Zeroizing<String> {
        let raw = Zeroizing::new(format!("{}:{}", self.0.username, self.0.secret.as_str()));
        Zeroizing::new(format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(raw.as_bytes())
        ))
    }

    /// The password or token. Only the registry client should call this.
    pub fn secret(&self) -> &str {
        &self.0.secret
    }

    /// A stable name for this credential that reveals nothing about it: the
    /// first 16 hex digits of SHA-256 over user and secret. Cached answers
    /// are keyed by it, so two namespaces holding the same credential share
    /// the cache, and one that holds another does not.
    pub fn identity(&self) -> &str {
        &self.0.identity
    }
}

/// Where a credential came from, in the words a denial uses.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum CredentialSource {
    /// One of the object's own `imagePullSecrets`.
    Secret {
        /// Namespace of the Secret.
        namespace: String,
        /// Its name.
        name: String,
    },
    /// A secret listed by the workload's ServiceAccount.
    ServiceAccount {
        /// Namespace.
        namespace: String,
        /// The ServiceAccount.
        name: String,
        /// The Secret it lists.
        secret: String,
    },
    /// The policy's `registries[].auth` for a host.
    Policy {
        /// The host.
        host: String,
    },
    /// `--docker-config` (its `auths`).
    DockerConfig,
    /// A docker credential helper (`credHelpers` / `credsStore`).
    Helper {
        /// `docker-credential-<name>`.
        name: String,
    },
    /// A kubelet image credential-provider plugin.
    Provider {
        /// The provider's name in the CredentialProviderConfig.
        name: String,
    },
    /// No credential.
    Anonymous,
}

impl CredentialSource {
    /// Label for metrics (`sigil_registry_credential_lookups_total{source}`).
    pub fn kind(&self) -> &'static str {
        match self {
            CredentialSource::Secret { .. } => "secret",
            CredentialSource::ServiceAccount { .. } => "serviceaccount",
            CredentialSource::Policy { .. } => "policy",
            CredentialSource::DockerConfig => "docker-config",
            CredentialSource::Helper { .. } => "helper",
            CredentialSource::Provider { .. } => "provider",
            CredentialSource::Anonymous => "anonymous",
        }
    }
}

impl fmt::Display for CredentialSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CredentialSource::Secret { namespace, name } => write!(f, "secret {namespace}/{name}"),
            CredentialSource::ServiceAccount {
                namespace,
                name,
                secret,
            } => write!(
                f,
                "serviceaccount {namespace}/{name} (secret {namespace}/{secret})"
            ),
            CredentialSource::Policy { host } => write!(f, "policy registries[{host}].auth"),
            CredentialSource::DockerConfig => f.write_str("docker config (--docker-config)"),
            CredentialSource::Helper { name } => write!(f, "credential helper {name}"),
            CredentialSource::Provider { name } => write!(f, "provider {name}"),
            CredentialSource::Anonymous => f.write_str("anonymous"),
        }
    }
}

/// A credential to try, and where it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    /// The credential; `None` for anonymous.
    pub credential: Option<Credential>,
    /// Where it came from.
    pub source: CredentialSource,
}

impl Candidate {
    /// The cache identity of what this candidate can see: the credential's
    /// [`Credential::identity`], or `anonymous`.
    pub fn identity(&self) -> &str {
        self.credential
            .as_ref()
            .map_or(ANONYMOUS, Credential::identity)
    }

    /// The last resort every lookup ends with.
    pub fn anonymous() -> Candidate {
        Candidate {
            credential: None,
            source: CredentialSource::Anonymous,
        }
    }
}

/// The cache identity of anonymous lookups.
pub const ANONYMOUS: &str = "anonymous";

/// The cluster credentials one lookup may use, most specific first, and
/// every cluster source the object named (for denials). The registry adds
/// its node-level credentials (policy, `--docker-config`, helpers,
/// providers) and anonymous after these.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PullCredentials {
    /// Candidates from the object's Secrets or its ServiceAccount's.
    pub candidates: Vec<Candidate>,
    /// `secret ns/name`, `serviceaccount ns/name`, whether or not found
    /// (shared by every image of the object).
    pub named: Arc<[String]>,
}

impl Default for PullCredentials {
    fn default() -> Self {
        PullCredentials {
            candidates: Vec::new(),
            named: Arc::from([]),
        }
    }
}

/// Cluster state a credential lookup reads: kept in memory by watches,
/// never fetched per request.
pub trait PullSecretStore: Send + Sync {
    /// The auths of Secret `namespace/name`, if it exists with a docker config type.
    fn secret(&self, namespace: &str, name: &str) -> Option<SecretAuths>;
    /// The `imagePullSecrets` of ServiceAccount `namespace/name`, if it exists.
    fn service_account(&self, namespace: &str, name: &str) -> Option<Vec<String>>;

    /// A number that changes whenever any Secret or ServiceAccount it holds
    /// may have changed (see [`crate::NamespaceLabels::generation`]); `None`
    /// (the default) when the store cannot say.
    fn generation(&self) -> Option<u64> {
        None
    }
}

/// The secrets an object's Pods may pull with, from its pod spec.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PullContext {
    /// The namespace the Secrets and ServiceAccount live in.
    pub namespace: String,
    /// The pod spec's `imagePullSecrets` names.
    pub secrets: Vec<String>,
    /// The ServiceAccount whose secrets apply (workloads whose template
    /// lists none: the ServiceAccount admission plugin will copy them into
    /// each Pod); `None` for Pods, which already carry them.
    pub service_account: Option<String>,
}

impl PullContext {
    /// The pull context of an object: its pod spec's `imagePullSecrets`;
    /// for a workload whose template names none, its ServiceAccount's
    /// (`serviceAccountName`, default `default`). A Pod never uses its
    /// ServiceAccount's here: by the time webhooks run, the ServiceAccount
    /// admission plugin has copied them into the Pod, or the Pod listed its
    /// own and the ServiceAccount's do not apply to it.
    pub fn of(
        namespace: &str,
        kind: &str,
        secrets: &[String],
        service_account: Option<&str>,
    ) -> PullContext {
        let sa = (kind != "Pod" && secrets.is_empty())
            .then(|| {
                service_account
                    .filter(|s| !s.is_empty())
                    .unwrap_or("default")
            })
            .map(str::to_owned);
        PullContext {
            namespace: namespace.to_owned(),
            secrets: secrets.to_vec(),
            service_account: sa,
        }
    }

    /// The cluster credentials for one image (a normalized name without
    /// tag), as kubelet orders them: every matching key of the context's
    /// secrets, most specific first (one index across all of them); equal
    /// keys in the order the secrets are listed. Missing Secrets are skipped
    /// (kubelet does the same); [`PullContext::sources`] names them.
    pub fn candidates(&self, store: &dyn PullSecretStore, name: &str) -> Vec<Candidate> {
        let loc = ImageLocation::new(name);
        // (the secret's auths, which entry, where it came from): sorted by
        // key text without copying it.
        let mut found: Vec<(SecretAuths, usize, CredentialSource)> = Vec::new();
        let mut add = |auths: SecretAuths, source: &dyn Fn() -> CredentialSource| {
            for i in 0..auths.entries.len() {
                if auths.entries[i].0.matches(&loc) {
                    found.push((auths.clone(), i, source()));
                }
            }
        };
        for s in &self.secrets {
            if let Some(auths) = store.secret(&self.namespace, s) {
                add(auths, &|| CredentialSource::Secret {
                    namespace: self.namespace.clone(),
                    name: s.clone(),
                });
            }
        }
        if let Some(sa) = &self.service_account {
            for s in store
                .service_account(&self.namespace, sa)
                .unwrap_or_default()
            {
                if let Some(auths) = store.secret(&self.namespace, &s) {
                    add(auths, &|| CredentialSource::ServiceAccount {
                        namespace: self.namespace.clone(),
                        name: sa.clone(),
                        secret: s.clone(),
                    });
                }
            }
        }
        found.sort_by(|(a, i, _), (b, j, _)| b.entries[*j].0.text.cmp(&a.entries[*i].0.text));
        found
            .into_iter()
            .map(|(auths, i, source)| Candidate {
                credential: Some(auths.entries[i].1.clone()),
                source,
            })
            .collect()
    }

    /// Every cluster source this context names, whether or not it exists
    /// or matched, for denial messages.
    pub fn sources(&self) -> Vec<String> {
        let mut out: Vec<String> = self
            .secrets
            .iter()
            .map(|s| format!("secret {}/{s}", self.namespace))
            .collect();
        if let Some(sa) = &self.service_account {
            out.push(format!("serviceaccount {}/{sa}", self.namespace));
        }
        out
    }
}

/// An in-memory [`PullSecretStore`], for client-side commands (which have
/// no cluster) and tests.
#[derive(Debug, Default)]
pub struct StaticStore {
    /// namespace → name → auths.
    pub secrets: HashMap<String, HashMap<String, SecretAuths>>,
    /// namespace → name → secret names.
    pub service_accounts: HashMap<String, HashMap<String, Vec<String>>>,
}

impl StaticStore {
    /// Adds Secret `namespace/name`.
    pub fn add_secret(&mut self, namespace: &str, name: &str, auths: SecretAuths) {
        self.secrets
            .entry(namespace.to_owned())
            .or_default()
            .insert(name.to_owned(), auths);
    }

    /// Adds ServiceAccount `namespace/name` listing `secrets`.
    pub fn add_service_account(&mut self, namespace: &str, name: &str, secrets: Vec<String>) {
        self.service_accounts
            .entry(namespace.to_owned())
            .or_default()
            .insert(name.to_owned(), secrets);
    }
}

impl PullSecretStore for StaticStore {
    fn secret(&self, namespace: &str, name: &str) -> Option<SecretAuths> {
        self.secrets.get(namespace)?.get(name).cloned()
    }
    fn service_account(&self, namespace: &str, name: &str) -> Option<Vec<String>> {
        self.service_accounts.get(namespace)?.get(name).cloned()
    }
}

#[cfg(test)]
mod tests;
