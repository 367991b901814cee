//! Registry credentials and the `WWW-Authenticate` challenge.
//!
//! Owns where credentials come from (policy `username` + `passwordFile`, or a
//! docker `config.json`), parsing Bearer/Basic challenges, and the token cache
//! keyed by (host, scope, credential identity). Secrets never appear in `Debug` output or errors.
//! It does not send the manifest requests themselves; see `client`.

use std::collections::HashMap;
use std::fmt;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use sigil_core::credentials::{Credential, Keyring, parse_docker_config};
use sigil_core::policy::AuthSpec;
use zeroize::Zeroizing;

/// Where a host's credentials come from. Files are read when needed, so a
/// rotated Secret takes effect without a restart.
#[derive(Clone, Default, PartialEq, Eq)]
pub enum CredentialSource {
    /// No credentials.
    #[default]
    Anonymous,
    /// User name plus a file holding the password.
    PasswordFile {
        /// User name.
        username: String,
        /// Path of the password file.
        path: String,
    },
    /// A docker `config.json`.
    DockerConfig {
        /// Path of the file.
        path: String,
    },
}

impl fmt::Debug for CredentialSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CredentialSource::Anonymous => f.write_str("Anonymous"),
            CredentialSource::PasswordFile { username, path } => {
                write!(f, "PasswordFile({username}, {path})")
            }
            CredentialSource::DockerConfig { path } => write!(f, "DockerConfig({path})"),
        }
    }
}

impl CredentialSource {
    /// From the policy's `auth` block.
    pub fn from_spec(spec: Option<&AuthSpec>) -> CredentialSource {
        match spec {
            Some(AuthSpec {
                username: Some(u),
                password_file: Some(p),
                ..
            }) => CredentialSource::PasswordFile {
                username: u.clone(),
                path: p.clone(),
            },
            Some(AuthSpec {
                docker_config: Some(p),
                ..
            }) => CredentialSource::DockerConfig { path: p.clone() },
            _ => CredentialSource::Anonymous,
        }
    }

    /// Loads the credentials for `host`. `Ok(None)` means anonymous.
    pub fn load(&self, host: &str) -> Result<Option<Credential>, String> {
        match self {
            CredentialSource::Anonymous => Ok(None),
            CredentialSource::PasswordFile { username, path } => {
                let pw = Zeroizing::new(
                    crate::file::read_text(std::path::Path::new(path), crate::file::MAX_PEM_BYTES)
                        .map_err(|e| format!("cannot read passwordFile {path}: {e}"))?,
                );
                Ok(Some(Credential::basic(
                    username.clone(),
                    pw.trim_end_matches(['\r', '\n']),
                )))
            }
            CredentialSource::DockerConfig { path } => {
                let text = Zeroizing::new(
                    crate::file::read(std::path::Path::new(path), crate::file::MAX_CONFIG_BYTES)
                        .map_err(|e| format!("cannot read dockerConfig {path}: {e}"))?,
                );
                docker_config_lookup(&text, host).map_err(|e| format!("dockerConfig {path}: {e}"))
            }
        }
    }
}

/// The credential a docker config's `auths` holds for `host` (kubelet's
/// key rules: `host`, `https://host`, `/v1/`, Docker Hub's legacy URL).
pub fn docker_config_lookup(text: &[u8], host: &str) -> Result<Option<Credential>, String> {
    let entries = parse_docker_config(text, false).map_err(|e| e.to_string())?;
    let mut ring = Keyring::default();
    ring.add(
        &entries,
        &sigil_core::credentials::CredentialSource::DockerConfig,
    );
    Ok(ring
        .lookup(&format!("{host}/"))
        .into_iter()
        .find_map(|c| c.credential))
}

/// A parsed `WWW-Authenticate` header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Challenge {
    /// `Basic realm="…"`
    Basic,
    /// `Bearer realm="…",service="…",scope="…"`
    Bearer {
        /// Token endpoint.
        realm: String,
        /// `service` parameter, if given.
        service: Option<String>,
        /// `scope` parameter, if given.
        scope: Option<String>,
    },
}

/// Parses the first challenge of a `WWW-Authenticate` value.
pub fn parse_challenge(v: &str) -> Option<Challenge> {
    let v = v.trim();
    let (scheme, rest) = v.split_once(' ').unwrap_or((v, ""));
    let params = parse_params(rest);
    match scheme.to_ascii_lowercase().as_str() {
        "basic" => Some(Challenge::Basic),
        "bearer" => Some(Challenge::Bearer {
            realm: params.get("realm")?.clone(),
            service: params.get("service").cloned(),
            scope: params.get("scope").cloned(),
        }),
        _ => None,
    }
}

fn parse_params(s: &str) -> HashMap<String, String> {
    let mut out = HashMap::new();
    let b = s.as_bytes();
    let mut i = 0;
    while i < b.len() {
        while i < b.len() && (b[i] == b',' || b[i] == b' ') {
            i += 1;
        }
        let ks = i;
        while i < b.len() && b[i] != b'=' {
            i += 1;
        }
        let key = s[ks..i].trim().to_ascii_lowercase();
        i += 1;
        let mut val = String::new();
        if i < b.len() && b[i] == b'"' {
            i += 1;
            while i < b.len() && b[i] != b'"' {
                if b[i] == b'\\' && i + 1 < b.len() {
                    i += 1;
                }
                // Values are ASCII in practice; keep any UTF-8 intact by char.
                let ch = s[i..].chars().next().unwrap_or('\u{fffd}');
                val.push(ch);
                i += ch.len_utf8();
            }
            i += 1;
        } else {
            let vs = i.min(b.len());
            while i < b.len() && b[i] != b',' {
                i += 1;
            }
            val = s[vs..i.min(b.len())].trim().to_owned();
        }
        if !key.is_empty() {
            out.insert(key, val);
        }
    }
    out
}

/// Bearer tokens by (host, scope), kept until shortly before they expire.
#[derive(Debug, Default)]
pub struct TokenCache {
    inner: Mutex<HashMap<TokenKey, (String, Instant)>>,
}

/// (host, scope, identity of the credential the token was issued for):
/// a token obtained with one namespace's pull secret is never sent on
/// behalf of another.
type TokenKey = (String, String, String);

impl TokenCache {
    /// A still-valid token.
    pub fn get(&self, host: &str, scope: &str, identity: &str) -> Option<String> {
        let map = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        map.get(&(host.to_owned(), scope.to_owned(), identity.to_owned()))
            .filter(|(_, exp)| *exp > Instant::now())
            .map(|(t, _)| t.clone())
    }

    /// Stores a token valid for `ttl` (minus a safety margin).
    pub fn put(&self, host: &str, scope: &str, identity: &str, token: String, ttl: Duration) {
        let ttl = ttl
            .saturating_sub(Duration::from_secs(5))
            .max(Duration::from_secs(1));
        let mut map = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        if map.len() > 10_000 {
            let now = Instant::now();
            map.retain(|_, (_, e)| *e > now);
        }
        map.insert(
            (host.to_owned(), scope.to_owned(), identity.to_owned()),
            (token, Instant::now() + ttl),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_challenges() {
        let c = parse_challenge(r#"Bearer realm="https://auth.docker.io/token",service="registry.docker.io",scope="repository:library/nginx:pull""#).unwrap();
        assert_eq!(
            c,
            Challenge::Bearer {
                realm: "https://auth.docker.io/token".into(),
                service: Some("registry.docker.io".into()),
                scope: Some("repository:library/nginx:pull".into())
            }
        );
        assert_eq!(
            parse_challenge(r#"Basic realm="basic-realm""#),
            Some(Challenge::Basic)
        );
        assert_eq!(parse_challenge("Negotiate"), None);
        assert_eq!(parse_challenge("Bearer service=x"), None);
        assert_eq!(
            parse_challenge(r#"Bearer realm="a\"b""#),
            Some(Challenge::Bearer {
                realm: "a\"b".into(),
                service: None,
                scope: None
            })
        );
        let _ = parse_challenge("Bearer realm=\"unterminated");
        let _ = parse_challenge("Bearer =,,=\"");
    }

    #[test]
    fn docker_config_spellings() {
        use base64::Engine as _;
        let auth = base64::engine::general_purpose::STANDARD.encode("u:p:w");
        let cfg = format!(
            r#"{{"auths":{{"https://index.docker.io/v1/":{{"auth":"{auth}"}},"reg.local:5000":{{"username":"a","password":"b"}}}}}}"#
        );
        let c = docker_config_lookup(cfg.as_bytes(), "docker.io")
            .unwrap()
            .unwrap();
        assert_eq!(c, Credential::basic("u", "p:w"));
        assert_eq!(
            docker_config_lookup(cfg.as_bytes(), "reg.local:5000")
                .unwrap()
                .unwrap()
                .username(),
            "a"
        );
        assert_eq!(
            docker_config_lookup(cfg.as_bytes(), "other.io").unwrap(),
            None
        );
        assert!(docker_config_lookup(b"{", "x").is_err());
    }
}
