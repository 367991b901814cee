//! Where kubelet looks up a credential for an image: docker config files
//! (`auths` of `.dockerconfigjson`, the older `.dockercfg`) parsed into keys,
//! and the keyring that matches keys against a normalized image name exactly
//! as kubelet does (host labels with `*`/`?`, port, path prefix, most
//! specific first). Parsing and matching only; which secrets apply to an
//! object is the parent module's.

use super::*;

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
pub(super) struct Key {
    /// As normalized, for ordering (kubelet sorts keys in reverse).
    pub(super) text: String,
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
    pub(super) fn matches(&self, image: &ImageLocation<'_>) -> bool {
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
pub(super) struct ImageLocation<'a> {
    labels: Vec<&'a str>,
    port: Option<&'a str>,
    path: &'a str,
}

impl<'a> ImageLocation<'a> {
    pub(super) fn new(name: &'a str) -> ImageLocation<'a> {
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
    pub(super) entries: Vec<(Key, Credential)>,
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
