//! Docker credential helpers (`credHelpers`, `credsStore` in a docker
//! `config.json`), run as docker runs them: `docker-credential-<name> get`
//! from `PATH`, the server URL on stdin, `{"ServerURL","Username","Secret"}`
//! on stdout (`<token>` as the user means an identity token).
//!
//! Owns choosing the helper for a host (`credHelpers` by host, else
//! `credsStore`), running it under a timeout, and caching each answer —
//! found or "credentials not found" — for a fixed time, since helpers state
//! no lifetime. A helper that fails or hangs yields a reason, never a hang.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde::Deserialize;
use sigil_core::credentials::{Candidate, Credential, CredentialSource};
use sigil_core::dockerhub::{canonical_domain, is_docker_hub};

/// How long a helper's answer is reused.
pub const HELPER_CACHE: Duration = Duration::from_secs(300);

#[derive(Debug, Deserialize)]
struct ConfigDoc {
    #[serde(default, rename = "credHelpers")]
    cred_helpers: HashMap<String, String>,
    #[serde(default, rename = "credsStore")]
    creds_store: Option<String>,
}

/// A helper's answer for (helper, server URL): until when, and what it was.
type Answered = (Instant, Option<Credential>);

#[derive(Deserialize)]
struct Answer {
    #[serde(rename = "Username", default)]
    username: String,
    #[serde(rename = "Secret", default)]
    secret: String,
}

/// The helpers a docker config names, and their cached answers.
#[derive(Debug)]
pub struct Helpers {
    per_host: HashMap<String, String>,
    store: Option<String>,
    path: Vec<PathBuf>,
    timeout: Duration,
    cache: Mutex<HashMap<(String, String), Answered>>,
    runs: AtomicU64,
}

/// `host` as docker config keys name it, for matching `credHelpers`.
fn host_key(k: &str) -> String {
    let k = k
        .trim()
        .trim_start_matches("https://")
        .trim_start_matches("http://");
    let host = k.split('/').next().unwrap_or(k).to_ascii_lowercase();
    canonical_domain(&host).to_owned()
}

impl Helpers {
    /// Reads `credHelpers` and `credsStore` from a docker config; `None`
    /// when it names no helper. Helpers are looked up on `PATH`.
    pub fn from_docker_config(bytes: &[u8], timeout: Duration) -> Result<Option<Helpers>, String> {
        let doc: ConfigDoc =
            serde_json::from_slice(bytes).map_err(|e| format!("not a docker config: {e}"))?;
        let store = doc.creds_store.filter(|s| !s.is_empty());
        if doc.cred_helpers.is_empty() && store.is_none() {
            return Ok(None);
        }
        let path = std::env::var_os("PATH")
            .map(|p| std::env::split_paths(&p).collect())
            .unwrap_or_default();
        Ok(Some(Helpers {
            per_host: doc
                .cred_helpers
                .into_iter()
                .map(|(k, v)| (host_key(&k), v))
                .collect(),
            store,
            path,
            timeout,
            cache: Mutex::new(HashMap::new()),
            runs: AtomicU64::new(0),
        }))
    }

    /// How many times a helper was executed.
    pub fn runs(&self) -> u64 {
        self.runs.load(Ordering::Relaxed)
    }

    /// The helper's credential for `host` (a canonical registry host):
    /// `Ok(None)` when no helper serves it or the helper has none.
    pub async fn credential(&self, host: &str) -> Result<Option<Candidate>, String> {
        let Some(name) = self.per_host.get(host).or(self.store.as_ref()) else {
            return Ok(None);
        };
        let helper = format!("docker-credential-{name}");
        // Docker Hub's credentials are stored under its legacy URL.
        let server = if is_docker_hub(host) {
            "https://index.docker.io/v1/".to_owned()
        } else {
            host.to_owned()
        };
        let key = (helper.clone(), server.clone());
        let source = CredentialSource::Helper {
            name: helper.clone(),
        };
        let now = Instant::now();
        if let Some((_, c)) = self
            .cache
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&key)
            .filter(|(until, _)| *until > now)
        {
            return Ok(c.clone().map(|credential| Candidate {
                credential: Some(credential),
                source,
            }));
        }
        let bin = self
            .path
            .iter()
            .map(|d| d.join(&helper))
            .find(|p| p.is_file())
            .ok_or_else(|| format!("credential helper {helper} is not on PATH"))?;
        self.runs.fetch_add(1, Ordering::Relaxed);
        let found = match crate::provider::exec(
            &bin,
            &["get".to_owned()],
            &[],
            server.as_bytes(),
            self.timeout,
        )
        .await
        {
            Ok(out) => {
                let a: Answer = serde_json::from_slice(&out)
                    .map_err(|e| format!("{helper} answered something that is not JSON: {e}"))?;
                Some(if a.username == "<token>" {
                    Credential::identity_token(a.username, a.secret)
                } else {
                    Credential::basic(a.username, a.secret)
                })
            }
            // docker's helpers say so on exit 1; it is an answer, not a failure.
            Err(e) if e.contains("credentials not found") => None,
            Err(e) => return Err(e),
        };
        self.cache
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key, (now + HELPER_CACHE, found.clone()));
        Ok(found.map(|credential| Candidate {
            credential: Some(credential),
            source,
        }))
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt as _;
    use std::path::Path;

    use super::*;

    fn helper(dir: &Path, name: &str, body: &str) {
        let p = dir.join(format!("docker-credential-{name}"));
        std::fs::write(&p, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    }

    fn helpers(dir: &Path, config: &str) -> Helpers {
        let mut h = Helpers::from_docker_config(config.as_bytes(), Duration::from_millis(500))
            .unwrap()
            .unwrap();
        h.path = vec![dir.to_path_buf()];
        h
    }

    #[tokio::test]
    async fn helpers_answer_per_host_and_are_cached() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("asked");
        helper(
            dir.path(),
            "test",
            &format!(
                r#"read server; echo "$1 $server" >> "{}"; printf '{{"ServerURL":"%s","Username":"u","Secret":"s-%s"}}' "$server" "$server""#,
                log.display()
            ),
        );
        helper(
            dir.path(),
            "empty",
            "echo 'credentials not found in native keychain'; exit 1",
        );
        let h = helpers(
            dir.path(),
            r#"{"credHelpers":{"https://reg.example:5000":"test","index.docker.io":"test"},"credsStore":"empty"}"#,
        );
        let c = h.credential("reg.example:5000").await.unwrap().unwrap();
        let cred = c.credential.unwrap();
        assert_eq!(
            (cred.username(), cred.secret()),
            ("u", "s-reg.example:5000")
        );
        assert_eq!(
            c.source.to_string(),
            "credential helper docker-credential-test"
        );
        let hub = h.credential("docker.io").await.unwrap().unwrap();
        assert_eq!(
            hub.credential.unwrap().secret(),
            "s-https://index.docker.io/v1/"
        );
        // Other hosts go to credsStore, which has nothing: an answer, not an error.
        assert!(h.credential("ghcr.io").await.unwrap().is_none());
        // Cached: asking again runs nothing.
        let before = h.runs();
        h.credential("reg.example:5000").await.unwrap();
        h.credential("ghcr.io").await.unwrap();
        assert_eq!(h.runs(), before);
        let asked = std::fs::read_to_string(&log).unwrap();
        assert_eq!(asked.lines().count(), 2, "{asked}");
        assert!(asked.lines().all(|l| l.starts_with("get ")));
    }

    #[tokio::test]
    async fn failing_hanging_and_missing_helpers_give_a_reason() {
        let dir = tempfile::tempdir().unwrap();
        helper(dir.path(), "slow", "sleep 30");
        helper(dir.path(), "broken", "echo 'keychain locked' >&2; exit 2");
        helper(dir.path(), "garbage", "echo nope");
        for (name, expect) in [
            ("slow", "no answer within"),
            ("broken", "keychain locked"),
            ("garbage", "not JSON"),
            ("absent", "not on PATH"),
        ] {
            let h = helpers(dir.path(), &format!(r#"{{"credsStore":"{name}"}}"#));
            let started = Instant::now();
            let e = h.credential("reg.example").await.unwrap_err();
            assert!(e.contains(expect), "{name}: {e}");
            assert!(started.elapsed() < Duration::from_secs(5));
        }
        assert!(
            Helpers::from_docker_config(br#"{"auths":{}}"#, Duration::from_secs(1))
                .unwrap()
                .is_none()
        );
    }
}
