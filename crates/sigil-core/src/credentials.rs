//! Pull credentials the way kubelet finds them: which secrets an object may
//! use, how a docker config's keys match an image, and in which order
//! credentials are tried.
//!
//! Owns the credential value (whose secret part never prints and is wiped on
//! drop), where each credential came from ([`CredentialSource`], for denials
//! and metrics), docker config parsing (`kubernetes.io/dockerconfigjson` and
//! `kubernetes.io/dockercfg`), kubelet's keyring matching ([`Keyring`]), and
//! the object's pull context ([`PullContext`]: its own `imagePullSecrets`,
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

/// Why a docker config could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CredentialError {
    /// Not JSON, or not the docker config shape.
    #[error("not a docker config: {0}")]
    Malformed(String),
    /// An `auth` field that is not base64 of `user:password`.
    #[error("entry {key:?}: auth is not base64 of user:password")]
    BadAuth {
        /// The entry's key.
        key: String,
    },
}

#[derive(Deserialize)]
struct Entry {
    #[serde(default)]
    username: Option<String>,
    #[serde(default)]
    password: Option<String>,
    #[serde(default)]
    auth: Option<String>,
    #[serde(default, rename = "identitytoken")]
    identity_token: Option<String>,
}

/// The `auths` of a docker config: (key as written, credential), in the
/// order of the keys. `legacy` reads the old `.dockercfg` form (the map
/// itself, without `auths`). Entries with nothing usable are skipped.
pub fn parse_docker_config(
    bytes: &[u8],
    legacy: bool,
) -> Result<Vec<(String, Credential)>, CredentialError> {
    let mut v: serde_json::Value =
        serde_json::from_slice(bytes).map_err(|e| CredentialError::Malformed(e.to_string()))?;
    let auths = if legacy {
        v
    } else {
        v.get_mut("auths")
            .map(serde_json::Value::take)
            .unwrap_or(serde_json::Value::Object(Default::default()))
    };
    let map: std::collections::BTreeMap<String, Entry> =
        serde_json::from_value(auths).map_err(|e| CredentialError::Malformed(e.to_string()))?;
    let mut out = Vec::new();
    for (key, e) in map {
        if let Some(t) = e.identity_token.filter(|t| !t.is_empty()) {
            out.push((
                key,
                Credential::identity_token(e.username.unwrap_or_else(|| "<token>".into()), t),
            ));
            continue;
        }
        let (user, pass) = match e.auth.filter(|a| !a.is_empty()) {
            Some(a) => {
                let raw = base64::engine::general_purpose::STANDARD
                    .decode(a.trim())
                    .map_err(|_| CredentialError::BadAuth { key: key.clone() })?;
                let text = Zeroizing::new(
                    String::from_utf8(raw)
                        .map_err(|_| CredentialError::BadAuth { key: key.clone() })?,
                );
                let (u, p) = text
                    .split_once(':')
                    .ok_or_else(|| CredentialError::BadAuth { key: key.clone() })?;
                (u.to_owned(), p.to_owned())
            }
            None => match (e.username, e.password) {
                (Some(u), Some(p)) => (u, p),
                _ => continue,
            },
        };
        out.push((key, Credential::basic(user, pass)));
    }
    Ok(out)
}

/// One keyring key: a host (`*` and `?` match within one DNS label), an
/// optional port (must be equal), and a path prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Key {
    /// As normalized, for ordering (kubelet sorts keys in reverse).
    text: String,
    labels: Vec<String>,
    port: Option<String>,
    path: String,
}

impl Key {
    /// Parses a docker config key: `host`, `host:port/path`, with or without
    /// `https://`/`http://`; `/v1/` and `/v2/` paths mean the host. Docker
    /// Hub's names all mean `docker.io`.
    fn parse(key: &str) -> Option<Key> {
        let k = key.trim();
        let k = k
            .strip_prefix("https://")
            .or_else(|| k.strip_prefix("http://"))
            .unwrap_or(k);
        let (hostport, path) = match k.find('/') {
            Some(i) => (&k[..i], &k[i..]),
            None => (k, ""),
        };
        let path = match path {
            p if p.starts_with("/v1/") || p.starts_with("/v2/") => &p[3..],
            p => p,
        };
        let path = path.trim_end_matches('/');
        let (host, port) = split_port(hostport);
        if host.is_empty() {
            return None;
        }
        let host = canonical_domain(&host.to_ascii_lowercase()).to_owned();
        let text = match &port {
            Some(p) => format!("{host}:{p}{path}"),
            None => format!("{host}{path}"),
        };
        Some(Key {
            labels: host.split('.').map(str::to_owned).collect(),
            port,
            path: path.to_owned(),
            text,
        })
    }

    /// kubelet's rule: same number of host labels, each matching its glob,
    /// the same port, and the key's path a prefix of the image's path.
    fn matches(&self, image: &ImageLocation<'_>) -> bool {
        self.port.as_deref() == image.port
            && self.labels.len() == image.labels.len()
            && image.path.starts_with(&self.path)
            && self
                .labels
                .iter()
                .zip(&image.labels)
                .all(|(g, l)| glob(g.as_bytes(), l.as_bytes()))
    }
}

/// `host[:port]` → (host, port); IPv6 `[…]:port` kept whole.
fn split_port(hostport: &str) -> (&str, Option<String>) {
    if hostport.starts_with('[') {
        return match hostport.rsplit_once("]:") {
            Some((h, p)) => (&hostport[..h.len() + 1], Some(p.to_owned())),
            None => (hostport, None),
        };
    }
    match hostport.rsplit_once(':') {
        Some((h, p)) if !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) => {
            (h, Some(p.to_owned()))
        }
        _ => (hostport, None),
    }
}

/// `*` (any run within the label) and `?` (one character), as Go's
/// `filepath.Match` on one DNS label.
fn glob(pattern: &[u8], text: &[u8]) -> bool {
    match pattern.split_first() {
        None => text.is_empty(),
        Some((b'*', rest)) => (0..=text.len()).any(|i| glob(rest, &text[i..])),
        Some((b'?', rest)) => !text.is_empty() && glob(rest, &text[1..]),
        Some((c, rest)) => text.first() == Some(c) && glob(rest, &text[1..]),
    }
}

/// An image name split the way keys are (`host[:port]/path`).
struct ImageLocation<'a> {
    labels: Vec<&'a str>,
    port: Option<&'a str>,
    path: &'a str,
}

impl<'a> ImageLocation<'a> {
    fn new(name: &'a str) -> ImageLocation<'a> {
        let (hostport, path) = match name.find('/') {
            Some(i) => (&name[..i], &name[i..]),
            None => (name, ""),
        };
        let (host, port) = match hostport.rsplit_once(':') {
            Some((h, p)) if !hostport.starts_with('[') || h.ends_with(']') => (h, Some(p)),
            _ => (hostport, None),
        };
        ImageLocation {
            labels: host.split('.').collect(),
            port,
            path,
        }
    }
}

/// kubelet's match of a docker config key, or a credential provider's
/// `matchImages` entry, against a normalized image name: same number of host
/// labels (`*` and `?` within one label), same port, the key's path a
/// prefix of the image's.
pub fn key_matches(glob: &str, name: &str) -> bool {
    Key::parse(glob).is_some_and(|k| k.matches(&ImageLocation::new(name)))
}

/// The registry host of a normalized image name (`host[:port]`), for
/// `cacheKeyType: Registry`.
pub fn registry_of(name: &str) -> &str {
    name.split('/').next().unwrap_or(name)
}

/// Credentials indexed by docker config key, looked up as kubelet does:
/// every key matching the image, most specific first (keys sorted in
/// reverse, so `quay.io/team` comes before `quay.io`); several credentials
/// for one key are kept in the order they were added.
#[derive(Debug, Clone, Default)]
pub struct Keyring {
    entries: Vec<(Key, Credential, CredentialSource)>,
}

impl Keyring {
    /// Adds the entries of one docker config; keys that are not
    /// `host[:port][/path]` are skipped (as kubelet skips them).
    pub fn add(&mut self, entries: &[(String, Credential)], source: &CredentialSource) {
        for (k, c) in entries {
            if let Some(key) = Key::parse(k) {
                self.entries.push((key, c.clone(), source.clone()));
            }
        }
        // Stable: equal keys keep the order they were added in.
        self.entries.sort_by(|(a, ..), (b, ..)| b.text.cmp(&a.text));
    }

    /// Candidates for a normalized image name (`host[:port]/path`, no tag).
    pub fn lookup(&self, name: &str) -> Vec<Candidate> {
        let loc = ImageLocation::new(name);
        self.entries
            .iter()
            .filter(|(k, ..)| k.matches(&loc))
            .map(|(_, c, s)| Candidate {
                credential: Some(c.clone()),
                source: s.clone(),
            })
            .collect()
    }

    /// Whether it holds nothing.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// The parsed auths of one Secret of type `kubernetes.io/dockerconfigjson`
/// or `kubernetes.io/dockercfg` — all that is kept of it. Keys are parsed
/// once, when the Secret is seen, not per request.
#[derive(Debug, Default)]
pub struct Auths {
    entries: Vec<(Key, Credential)>,
}

impl Auths {
    /// Indexes docker config entries (keys that are not `host[:port][/path]`
    /// are skipped, as kubelet skips them).
    pub fn new(entries: &[(String, Credential)]) -> Auths {
        Auths {
            entries: entries
                .iter()
                .filter_map(|(k, c)| Some((Key::parse(k)?, c.clone())))
                .collect(),
        }
    }

    /// How many entries it holds.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// A Secret's [`Auths`], shared.
pub type SecretAuths = Arc<Auths>;

/// Cluster state a credential lookup reads: kept in memory by watches,
/// never fetched per request.
pub trait PullSecretStore: Send + Sync {
    /// The auths of Secret `namespace/name`, if it exists with a docker config type.
    fn secret(&self, namespace: &str, name: &str) -> Option<SecretAuths>;
    /// The `imagePullSecrets` of ServiceAccount `namespace/name`, if it exists.
    fn service_account(&self, namespace: &str, name: &str) -> Option<Vec<String>>;
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
mod tests {
    use super::*;

    fn ring(keys: &[&str]) -> Keyring {
        let mut k = Keyring::default();
        let entries: Vec<(String, Credential)> = keys
            .iter()
            .map(|k| ((*k).to_owned(), Credential::basic(*k, "pw")))
            .collect();
        k.add(&entries, &CredentialSource::DockerConfig);
        k
    }

    fn users(k: &Keyring, image: &str) -> Vec<String> {
        k.lookup(image)
            .into_iter()
            .map(|c| {
                c.credential
                    .map(|c| c.username().to_owned())
                    .unwrap_or_default()
            })
            .collect()
    }

    #[test]
    fn kubelet_key_matching() {
        let k = ring(&[
            "quay.io",
            "https://quay.io/team",
            "*.azurecr.io",
            "registry.local:5000",
            "http://other.io/v2/",
            "https://index.docker.io/v1/",
        ]);
        // Most specific first, then the next.
        assert_eq!(
            users(&k, "quay.io/team/app"),
            ["https://quay.io/team", "quay.io"]
        );
        assert_eq!(users(&k, "quay.io/other/app"), ["quay.io"]);
        // `*` matches one DNS label, not more.
        assert_eq!(users(&k, "acme.azurecr.io/app"), ["*.azurecr.io"]);
        assert!(users(&k, "a.b.azurecr.io/app").is_empty());
        assert!(users(&k, "azurecr.io/app").is_empty());
        // The port must be equal.
        assert_eq!(users(&k, "registry.local:5000/x"), ["registry.local:5000"]);
        assert!(users(&k, "registry.local/x").is_empty());
        assert!(users(&k, "registry.local:5001/x").is_empty());
        // /v1/ and /v2/ mean the host.
        assert_eq!(users(&k, "other.io/a/b"), ["http://other.io/v2/"]);
        // Docker Hub's legacy key serves docker.io names.
        assert_eq!(
            users(&k, "docker.io/library/nginx"),
            ["https://index.docker.io/v1/"]
        );
    }

    #[test]
    fn provider_match_images() {
        assert!(key_matches(
            "*.dkr.ecr.*.amazonaws.com",
            "123.dkr.ecr.eu-west-1.amazonaws.com/app"
        ));
        assert!(!key_matches(
            "*.dkr.ecr.*.amazonaws.com",
            "123.dkr.ecr.amazonaws.com/app"
        ));
        assert!(key_matches(
            "*-docker.pkg.dev",
            "europe-docker.pkg.dev/p/r/app"
        ));
        assert!(key_matches("docker.io", "docker.io/library/nginx"));
        assert_eq!(registry_of("r.io:5000/a/b"), "r.io:5000");
    }

    #[test]
    fn docker_config_forms() {
        let auth = base64::engine::general_purpose::STANDARD.encode("alice:s3cret");
        let json = format!(
            r#"{{"auths":{{"a.io":{{"auth":"{auth}"}},"b.io":{{"username":"bob","password":"pw"}},"c.io":{{"identitytoken":"tok"}},"d.io":{{}}}}}}"#
        );
        let e = parse_docker_config(json.as_bytes(), false).unwrap();
        assert_eq!(e.len(), 3);
        assert_eq!(e[0].1, Credential::basic("alice", "s3cret"));
        assert_eq!(e[1].1, Credential::basic("bob", "pw"));
        assert!(e[2].1.is_identity_token());
        let legacy = format!(r#"{{"a.io":{{"auth":"{auth}","email":"x@y"}}}}"#);
        assert_eq!(
            parse_docker_config(legacy.as_bytes(), true).unwrap()[0].1,
            Credential::basic("alice", "s3cret")
        );
        assert!(matches!(
            parse_docker_config(br#"{"auths":{"a.io":{"auth":"!!"}}}"#, false),
            Err(CredentialError::BadAuth { .. })
        ));
        assert!(parse_docker_config(b"nope", false).is_err());
    }

    #[test]
    fn secrets_never_print_and_identities_do_not_reveal_them() {
        let c = Credential::basic("alice", "hunter2");
        let shown = format!("{c:?}");
        assert!(!shown.contains("hunter2"), "{shown}");
        assert_eq!(
            c.identity(),
            Credential::basic("alice", "hunter2").identity()
        );
        assert_ne!(c.identity(), Credential::basic("alice", "other").identity());
        assert_eq!(c.identity().len(), 16);
    }

    #[test]
    fn pods_use_their_own_secrets_workloads_fall_back_to_the_service_account() {
        let pod = PullContext::of("shop", "Pod", &[], Some("builder"));
        assert_eq!(pod.service_account, None);
        let d = PullContext::of("shop", "Deployment", &[], None);
        assert_eq!(d.service_account.as_deref(), Some("default"));
        let d = PullContext::of("shop", "Deployment", &["own".into()], Some("builder"));
        assert_eq!(
            d.service_account, None,
            "the SA's secrets would not reach the Pod"
        );
        let mut store = StaticStore::default();
        let auths: SecretAuths =
            Arc::new(Auths::new(&[("r.io".into(), Credential::basic("u", "p"))]));
        store.add_secret("shop", "regcred", auths);
        store.add_service_account("shop", "default", vec!["regcred".into(), "gone".into()]);
        let d = PullContext::of("shop", "Deployment", &[], None);
        let found = d.candidates(&store, "r.io/app");
        assert_eq!(found.len(), 1);
        assert_eq!(
            found[0].source.to_string(),
            "serviceaccount shop/default (secret shop/regcred)"
        );
        assert_eq!(d.sources(), ["serviceaccount shop/default"]);
    }
}
