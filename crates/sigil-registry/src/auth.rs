//! Registry credentials and the `WWW-Authenticate` challenge.
//!
//! Owns where credentials come from (policy `username` + `passwordFile`, or a
//! docker `config.json`), parsing Bearer/Basic challenges, and the token cache
//! keyed by (host, scope). Secrets never appear in `Debug` output or errors.
//! It does not send the manifest requests themselves; see `client`.

use std::collections::HashMap;
use std::fmt;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use sigil_core::policy::AuthSpec;
use sigil_core::reference::is_docker_hub;

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
    pub fn load(&self, host: &str) -> Result<Option<Credentials>, String> {
        match self {
            CredentialSource::Anonymous => Ok(None),
            CredentialSource::PasswordFile { username, path } => {
                let pw = std::fs::read_to_string(path)
                    .map_err(|e| format!("cannot read passwordFile {path}: {e}"))?;
                Ok(Some(Credentials {
                    username: username.clone(),
                    secret: Secret::Password(pw.trim_end_matches(['\r', '\n']).to_owned()),
                }))
            }
            CredentialSource::DockerConfig { path } => {
                let text = std::fs::read_to_string(path)
                    .map_err(|e| format!("cannot read dockerConfig {path}: {e}"))?;
                docker_config_lookup(&text, host).map_err(|e| format!("dockerConfig {path}: {e}"))
            }
        }
    }
}

/// A secret value; `Debug` never prints it.
#[derive(Clone, PartialEq, Eq)]
pub enum Secret {
    /// A password for Basic auth or the token service.
    Password(String),
    /// An OAuth2 refresh token (`identitytoken` in docker config).
    IdentityToken(String),
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

/// Loaded credentials for one host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Credentials {
    /// User name.
    pub username: String,
    /// Password or identity token.
    pub secret: Secret,
}

impl Credentials {
    /// `Authorization: Basic …` value.
    pub fn basic_header(&self) -> String {
        let pw = match &self.secret {
            Secret::Password(p) | Secret::IdentityToken(p) => p,
        };
        format!(
            "Basic {}",
            STANDARD.encode(format!("{}:{pw}", self.username))
        )
    }
}

/// Finds `host` in a docker config's `auths`, accepting the key spellings
/// docker itself writes (`host`, `https://host`, Docker Hub's legacy URL).
pub fn docker_config_lookup(text: &str, host: &str) -> Result<Option<Credentials>, String> {
    let v: serde_json::Value =
        serde_json::from_str(text).map_err(|e| format!("not valid JSON: {e}"))?;
    let Some(auths) = v.get("auths").and_then(|a| a.as_object()) else {
        return Ok(None);
    };
    let hub = is_docker_hub(host);
    let entry = auths.iter().find(|(k, _)| {
        let k = k
            .trim_start_matches("https://")
            .trim_start_matches("http://");
        let k_host = k.split('/').next().unwrap_or_default();
        k_host == host || (hub && is_docker_hub(k_host))
    });
    let Some((_, e)) = entry else { return Ok(None) };
    if let Some(tok) = e
        .get("identitytoken")
        .and_then(|t| t.as_str())
        .filter(|t| !t.is_empty())
    {
        let user = e
            .get("username")
            .and_then(|u| u.as_str())
            .unwrap_or("<token>")
            .to_owned();
        return Ok(Some(Credentials {
            username: user,
            secret: Secret::IdentityToken(tok.to_owned()),
        }));
    }
    if let Some(a) = e
        .get("auth")
        .and_then(|a| a.as_str())
        .filter(|a| !a.is_empty())
    {
        let raw = STANDARD
            .decode(a.trim())
            .map_err(|_| format!("auths entry for {host}: `auth` is not base64"))?;
        let s = String::from_utf8(raw)
            .map_err(|_| format!("auths entry for {host}: `auth` is not UTF-8"))?;
        let (u, p) = s
            .split_once(':')
            .ok_or_else(|| format!("auths entry for {host}: `auth` is not user:password"))?;
        return Ok(Some(Credentials {
            username: u.to_owned(),
            secret: Secret::Password(p.to_owned()),
        }));
    }
    match (
        e.get("username").and_then(|u| u.as_str()),
        e.get("password").and_then(|p| p.as_str()),
    ) {
        (Some(u), Some(p)) => Ok(Some(Credentials {
            username: u.to_owned(),
            secret: Secret::Password(p.to_owned()),
        })),
        _ => Ok(None),
    }
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
    inner: Mutex<HashMap<(String, String), (String, Instant)>>,
}

impl TokenCache {
    /// A still-valid token.
    pub fn get(&self, host: &str, scope: &str) -> Option<String> {
        let map = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        map.get(&(host.to_owned(), scope.to_owned()))
            .filter(|(_, exp)| *exp > Instant::now())
            .map(|(t, _)| t.clone())
    }

    /// Stores a token valid for `ttl` (minus a safety margin).
    pub fn put(&self, host: &str, scope: &str, token: String, ttl: Duration) {
        let ttl = ttl
            .saturating_sub(Duration::from_secs(5))
            .max(Duration::from_secs(1));
        let mut map = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        if map.len() > 10_000 {
            let now = Instant::now();
            map.retain(|_, (_, e)| *e > now);
        }
        map.insert(
            (host.to_owned(), scope.to_owned()),
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
        let auth = STANDARD.encode("u:p:w");
        let cfg = format!(
            r#"{{"auths":{{"https://index.docker.io/v1/":{{"auth":"{auth}"}},"reg.local:5000":{{"username":"a","password":"b"}}}}}}"#
        );
        let c = docker_config_lookup(&cfg, "docker.io").unwrap().unwrap();
        assert_eq!(c.username, "u");
        assert_eq!(c.secret, Secret::Password("p:w".into()));
        assert_eq!(
            docker_config_lookup(&cfg, "reg.local:5000")
                .unwrap()
                .unwrap()
                .username,
            "a"
        );
        assert_eq!(docker_config_lookup(&cfg, "other.io").unwrap(), None);
        assert!(docker_config_lookup("{", "x").is_err());
    }

    #[test]
    fn secrets_never_debug_print() {
        let c = Credentials {
            username: "u".into(),
            secret: Secret::Password("hunter2".into()),
        };
        assert!(!format!("{c:?}").contains("hunter2"));
    }
}
