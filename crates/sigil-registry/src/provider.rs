//! Kubelet image credential-provider plugins, run exactly as kubelet runs
//! them, so the binaries cloud providers ship for kubelet (ECR, GAR, ACR)
//! work with sigil unchanged.
//!
//! Owns reading `--image-credential-provider-config` (a
//! `CredentialProviderConfig`, `kubelet.config.k8s.io/v1`), choosing the
//! providers whose `matchImages` match an image, executing the plugin from
//! `--image-credential-provider-bin-dir` with `args` and `env` and a
//! `CredentialProviderRequest` on stdin (under a timeout, killed if it
//! overruns), reading its `CredentialProviderResponse`, and caching the
//! answer by `cacheKeyType` (Image, Registry, Global) for `cacheDuration`
//! (else the provider's `defaultCacheDuration`). A plugin that fails, hangs
//! or prints garbage yields no credentials and a reason, never a hang.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde::Deserialize;
use sigil_core::credentials::{
    Candidate, Credential, CredentialSource, Keyring, key_matches, registry_of,
};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

/// The only request/response version sigil speaks (kubelet's GA one).
pub const PROVIDER_API_VERSION: &str = "credentialprovider.kubelet.k8s.io/v1";
/// The config's own version.
pub const CONFIG_API_VERSION: &str = "kubelet.config.k8s.io/v1";
/// Largest plugin answer read.
const MAX_RESPONSE: usize = 1 << 20;

/// Why the provider configuration cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ProviderError {
    /// The config file could not be read.
    #[error("reading credential provider config {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// Not a valid `CredentialProviderConfig`.
    #[error("credential provider config {path}: {detail}")]
    Invalid {
        /// The file.
        path: String,
        /// What is wrong.
        detail: String,
    },
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ConfigDoc {
    api_version: String,
    kind: String,
    #[serde(default)]
    providers: Vec<ProviderDoc>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ProviderDoc {
    name: String,
    #[serde(default)]
    match_images: Vec<String>,
    default_cache_duration: Option<String>,
    api_version: String,
    #[serde(default)]
    args: Vec<String>,
    #[serde(default)]
    env: Vec<EnvVar>,
}

#[derive(Debug, Deserialize)]
struct EnvVar {
    name: String,
    value: String,
}

/// One configured plugin.
#[derive(Debug, Clone)]
pub struct Provider {
    /// Its name, which is also the executable's name in the bin dir.
    pub name: String,
    /// Images it serves (kubelet's glob rules).
    pub match_images: Vec<String>,
    /// Cache lifetime when the plugin names none.
    pub default_cache_duration: Duration,
    /// Executable.
    pub bin: PathBuf,
    /// Arguments.
    pub args: Vec<String>,
    /// Extra environment.
    pub env: Vec<(String, String)>,
}

#[derive(Debug, serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct Request<'a> {
    api_version: &'static str,
    kind: &'static str,
    image: &'a str,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Response {
    api_version: String,
    kind: String,
    cache_key_type: String,
    cache_duration: Option<String>,
    #[serde(default)]
    auth: HashMap<String, AuthEntry>,
}

#[derive(Debug, Deserialize)]
struct AuthEntry {
    #[serde(default)]
    username: String,
    #[serde(default)]
    password: String,
}

/// A cached plugin answer.
#[derive(Debug, Clone)]
struct Cached {
    until: Instant,
    auth: Vec<(String, Credential)>,
}

/// The configured plugins, their cache and how often each ran.
#[derive(Debug)]
pub struct Providers {
    providers: Vec<Provider>,
    timeout: Duration,
    /// (provider, cache key) → answer. Keys: the image, its registry, or "".
    cache: Mutex<HashMap<(String, String), Cached>>,
    /// One per provider: concurrent lookups wait for one run and reuse its
    /// cached answer (the cache key is only known from the answer).
    running: Vec<tokio::sync::Mutex<()>>,
    runs: AtomicU64,
}

/// What the providers gave for one image.
#[derive(Debug, Default)]
pub struct Provided {
    /// Credentials, in provider order, most specific key first.
    pub candidates: Vec<Candidate>,
    /// Providers that matched but failed, with why.
    pub failures: Vec<String>,
    /// Providers that matched.
    pub matched: Vec<String>,
}

impl Providers {
    /// Loads a `CredentialProviderConfig` (YAML or JSON) and resolves each
    /// provider's executable in `bin_dir`.
    pub fn load(
        config: &Path,
        bin_dir: &Path,
        timeout: Duration,
    ) -> Result<Providers, ProviderError> {
        let path = config.display().to_string();
        let text = std::fs::read_to_string(config).map_err(|source| ProviderError::Read {
            path: path.clone(),
            source,
        })?;
        let invalid = |detail: String| ProviderError::Invalid {
            path: path.clone(),
            detail,
        };
        let doc: ConfigDoc = serde_saphyr::from_str(&text).map_err(|e| invalid(e.to_string()))?;
        if doc.kind != "CredentialProviderConfig"
            || !doc.api_version.starts_with("kubelet.config.k8s.io/")
        {
            return Err(invalid(format!(
                "expected kind CredentialProviderConfig, apiVersion {CONFIG_API_VERSION}; got {} {}",
                doc.kind, doc.api_version
            )));
        }
        let mut providers = Vec::new();
        for p in doc.providers {
            if p.api_version != PROVIDER_API_VERSION {
                return Err(invalid(format!(
                    "provider {}: apiVersion {:?} is not supported (use {PROVIDER_API_VERSION})",
                    p.name, p.api_version
                )));
            }
            if p.name.is_empty() || p.name.contains('/') || p.name == "." || p.name == ".." {
                return Err(invalid(format!(
                    "provider name {:?} must be a file name in the bin dir",
                    p.name
                )));
            }
            if p.match_images.is_empty() {
                return Err(invalid(format!(
                    "provider {}: matchImages is empty",
                    p.name
                )));
            }
            let default_cache_duration = match p.default_cache_duration.as_deref() {
                None | Some("") => Duration::ZERO,
                Some(d) => sigil_core::duration::parse_go(d).ok_or_else(|| {
                    invalid(format!(
                        "provider {}: defaultCacheDuration {d:?} is not a duration",
                        p.name
                    ))
                })?,
            };
            providers.push(Provider {
                bin: bin_dir.join(&p.name),
                name: p.name,
                match_images: p.match_images,
                default_cache_duration,
                args: p.args,
                env: p.env.into_iter().map(|e| (e.name, e.value)).collect(),
            });
        }
        Ok(Providers {
            running: providers
                .iter()
                .map(|_| tokio::sync::Mutex::new(()))
                .collect(),
            providers,
            timeout,
            cache: Mutex::new(HashMap::new()),
            runs: AtomicU64::new(0),
        })
    }

    /// How many times a plugin was executed.
    pub fn runs(&self) -> u64 {
        self.runs.load(Ordering::Relaxed)
    }

    /// Credentials for a normalized image name (`host[:port]/path`) and the
    /// image string as pulled (sent to the plugin), from every matching
    /// provider in config order; cached answers are reused.
    pub async fn credentials(&self, name: &str, image: &str) -> Provided {
        let mut out = Provided::default();
        for (p, running) in self.providers.iter().zip(&self.running) {
            if !p.match_images.iter().any(|g| key_matches(g, name)) {
                continue;
            }
            out.matched.push(p.name.clone());
            // Held until this provider's answer is in the cache.
            let mut _running = None;
            let cached = match self.cached(p, name, image) {
                Some(a) => Some(a),
                None => {
                    _running = Some(running.lock().await);
                    self.cached(p, name, image)
                }
            };
            let auth = match cached {
                Some(a) => a,
                None => match self.run(p, name, image).await {
                    Ok(a) => a,
                    Err(why) => {
                        tracing::warn!(provider = %p.name, image, error = %why, "credential provider failed");
                        out.failures.push(format!("provider {}: {why}", p.name));
                        continue;
                    }
                },
            };
            let mut ring = Keyring::default();
            ring.add(
                &auth,
                &CredentialSource::Provider {
                    name: p.name.clone(),
                },
            );
            out.candidates.extend(ring.lookup(name));
        }
        out
    }

    fn cached(&self, p: &Provider, name: &str, image: &str) -> Option<Vec<(String, Credential)>> {
        let cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        [image, registry_of(name), ""].iter().find_map(|k| {
            cache
                .get(&(p.name.clone(), (*k).to_owned()))
                .filter(|c| c.until > now)
                .map(|c| c.auth.clone())
        })
    }

    async fn run(
        &self,
        p: &Provider,
        name: &str,
        image: &str,
    ) -> Result<Vec<(String, Credential)>, String> {
        self.runs.fetch_add(1, Ordering::Relaxed);
        let request = serde_json::to_vec(&Request {
            api_version: PROVIDER_API_VERSION,
            kind: "CredentialProviderRequest",
            image,
        })
        .map_err(|e| e.to_string())?;
        let stdout = exec(&p.bin, &p.args, &p.env, &request, self.timeout).await?;
        let r: Response = serde_json::from_slice(&stdout)
            .map_err(|e| format!("answer is not a CredentialProviderResponse: {e}"))?;
        if r.kind != "CredentialProviderResponse" || r.api_version != PROVIDER_API_VERSION {
            return Err(format!(
                "answer is {} {}, expected CredentialProviderResponse {PROVIDER_API_VERSION}",
                r.kind, r.api_version
            ));
        }
        let key = match r.cache_key_type.as_str() {
            "Image" => image.to_owned(),
            "Registry" => registry_of(name).to_owned(),
            "Global" => String::new(),
            other => {
                return Err(format!(
                    "cacheKeyType {other:?} is not Image, Registry or Global"
                ));
            }
        };
        let ttl = match r.cache_duration.as_deref() {
            Some(d) if !d.is_empty() => sigil_core::duration::parse_go(d)
                .ok_or_else(|| format!("cacheDuration {d:?} is not a duration"))?,
            _ => p.default_cache_duration,
        };
        let mut auth: Vec<(String, Credential)> = r
            .auth
            .into_iter()
            .map(|(k, a)| (k, Credential::basic(a.username, a.password)))
            .collect();
        auth.sort_by(|a, b| a.0.cmp(&b.0));
        if !ttl.is_zero() {
            self.cache.lock().unwrap_or_else(|e| e.into_inner()).insert(
                (p.name.clone(), key),
                Cached {
                    until: Instant::now() + ttl,
                    auth: auth.clone(),
                },
            );
        }
        Ok(auth)
    }
}

/// Runs `bin args…` with `input` on stdin and returns stdout, or why not:
/// not startable, killed after `timeout`, non-zero exit (with stderr), or an
/// answer over [`MAX_RESPONSE`]. Shared with the docker credential helpers.
pub(crate) async fn exec(
    bin: &Path,
    args: &[String],
    env: &[(String, String)],
    input: &[u8],
    timeout: Duration,
) -> Result<Vec<u8>, String> {
    let mut child = tokio::process::Command::new(bin)
        .args(args)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("cannot run {}: {e}", bin.display()))?;
    let run = async {
        if let Some(mut stdin) = child.stdin.take() {
            // A plugin that exits without reading stdin is not an error here.
            let _ = stdin.write_all(input).await;
        }
        let mut stdout = Vec::new();
        let mut stderr = Vec::new();
        let (mut out, mut err) = (child.stdout.take(), child.stderr.take());
        let read_out = async {
            if let Some(o) = out.as_mut() {
                let _ = o
                    .take(MAX_RESPONSE as u64 + 1)
                    .read_to_end(&mut stdout)
                    .await;
            }
        };
        let read_err = async {
            if let Some(e) = err.as_mut() {
                let _ = e.take(4096).read_to_end(&mut stderr).await;
            }
        };
        tokio::join!(read_out, read_err);
        let status = child.wait().await.map_err(|e| e.to_string())?;
        Ok::<_, String>((status, stdout, stderr))
    };
    let (status, stdout, stderr) = tokio::time::timeout(timeout, run).await.map_err(|_| {
        format!(
            "{} gave no answer within {timeout:?} (killed)",
            bin.display()
        )
    })??;
    if !status.success() {
        // Docker's helpers say why on stdout, plugins on stderr.
        let why = if stderr.iter().all(u8::is_ascii_whitespace) {
            String::from_utf8_lossy(&stdout)
        } else {
            String::from_utf8_lossy(&stderr)
        };
        return Err(format!(
            "{} exited with {status}: {}",
            bin.display(),
            why.trim().chars().take(300).collect::<String>()
        ));
    }
    if stdout.len() > MAX_RESPONSE {
        return Err(format!(
            "{} answered more than {MAX_RESPONSE} bytes",
            bin.display()
        ));
    }
    Ok(stdout)
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt as _;

    use super::*;

    /// Writes an executable shell script that speaks the plugin protocol.
    fn plugin(dir: &Path, name: &str, body: &str) {
        let p = dir.join(name);
        std::fs::write(&p, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    }

    fn config(dir: &Path, providers: &str) -> PathBuf {
        let p = dir.join("config.yaml");
        std::fs::write(
            &p,
            format!("apiVersion: kubelet.config.k8s.io/v1\nkind: CredentialProviderConfig\nproviders:\n{providers}"),
        )
        .unwrap();
        p
    }

    const ANSWER: &str = r#"cat > "$DIR/request.json"; echo run >> "$DIR/runs"; printf '{"apiVersion":"credentialprovider.kubelet.k8s.io/v1","kind":"CredentialProviderResponse","cacheKeyType":"%s","cacheDuration":"1m","auth":{"*.ecr.test":{"username":"AWS","password":"tok-%s"}}}' "$KEY_TYPE" "$KEY_TYPE""#;

    fn provider_entry(name: &str, key_type: &str, dir: &Path) -> String {
        format!(
            "- name: {name}\n  matchImages: [\"*.ecr.test\"]\n  defaultCacheDuration: 10m\n  apiVersion: credentialprovider.kubelet.k8s.io/v1\n  args: [get-credentials]\n  env:\n  - {{name: KEY_TYPE, value: {key_type}}}\n  - {{name: DIR, value: \"{}\"}}\n",
            dir.display()
        )
    }

    fn runs(dir: &Path) -> usize {
        std::fs::read_to_string(dir.join("runs"))
            .map(|s| s.lines().count())
            .unwrap_or(0)
    }

    #[tokio::test]
    async fn cache_key_types_are_honoured() {
        for (key_type, expected_runs) in [("Image", 3), ("Registry", 2), ("Global", 1)] {
            let dir = tempfile::tempdir().unwrap();
            plugin(dir.path(), "ecr-credential-provider", ANSWER);
            let cfg = config(
                dir.path(),
                &provider_entry("ecr-credential-provider", key_type, dir.path()),
            );
            let p = Providers::load(&cfg, dir.path(), Duration::from_secs(5)).unwrap();
            for (name, image) in [
                ("a.ecr.test/app", "a.ecr.test/app:v1"),
                ("a.ecr.test/app", "a.ecr.test/app:v2"),
                ("b.ecr.test/app", "b.ecr.test/app:v1"),
                ("a.ecr.test/app", "a.ecr.test/app:v1"),
            ] {
                let got = p.credentials(name, image).await;
                assert!(got.failures.is_empty(), "{:?}", got.failures);
                assert_eq!(got.candidates.len(), 1, "{key_type} {image}");
                let c = got.candidates[0].credential.as_ref().unwrap();
                assert_eq!(c.username(), "AWS");
                assert_eq!(c.secret(), format!("tok-{key_type}"));
                assert_eq!(
                    got.candidates[0].source.to_string(),
                    "provider ecr-credential-provider"
                );
            }
            assert_eq!(runs(dir.path()), expected_runs, "{key_type}");
            let req: serde_json::Value =
                serde_json::from_slice(&std::fs::read(dir.path().join("request.json")).unwrap())
                    .unwrap();
            assert_eq!(req["apiVersion"], PROVIDER_API_VERSION);
            assert_eq!(req["kind"], "CredentialProviderRequest");
            assert!(req["image"].as_str().unwrap().contains(".ecr.test/app:"));
        }
    }

    #[tokio::test]
    async fn unmatched_images_do_not_run_the_plugin() {
        let dir = tempfile::tempdir().unwrap();
        plugin(dir.path(), "p", ANSWER);
        let cfg = config(dir.path(), &provider_entry("p", "Global", dir.path()));
        let p = Providers::load(&cfg, dir.path(), Duration::from_secs(5)).unwrap();
        let got = p.credentials("ghcr.io/app", "ghcr.io/app:v1").await;
        assert!(got.candidates.is_empty() && got.matched.is_empty());
        assert_eq!(p.runs(), 0);
    }

    #[tokio::test]
    async fn hanging_failing_and_garbage_plugins_give_a_reason_not_a_hang() {
        for (body, expect) in [
            ("sleep 30", "no answer within"),
            ("echo denied >&2; exit 3", "exited with"),
            ("echo not json", "not a CredentialProviderResponse"),
            (
                r#"printf '{"apiVersion":"credentialprovider.kubelet.k8s.io/v1alpha1","kind":"CredentialProviderResponse","cacheKeyType":"Image"}'"#,
                "expected CredentialProviderResponse",
            ),
            (
                r#"printf '{"apiVersion":"credentialprovider.kubelet.k8s.io/v1","kind":"CredentialProviderResponse","cacheKeyType":"Forever"}'"#,
                "cacheKeyType",
            ),
        ] {
            let dir = tempfile::tempdir().unwrap();
            plugin(dir.path(), "p", body);
            let cfg = config(dir.path(), &provider_entry("p", "Image", dir.path()));
            let p = Providers::load(&cfg, dir.path(), Duration::from_millis(500)).unwrap();
            let started = Instant::now();
            let got = p.credentials("a.ecr.test/app", "a.ecr.test/app:v1").await;
            assert!(started.elapsed() < Duration::from_secs(5), "{body}");
            assert!(got.candidates.is_empty());
            assert!(
                got.failures[0].contains(expect),
                "{body}: {:?}",
                got.failures
            );
            assert!(got.failures[0].starts_with("provider p: "));
        }
    }

    #[test]
    fn config_errors_name_the_problem() {
        let dir = tempfile::tempdir().unwrap();
        let bad = [
            (
                "- {name: p, matchImages: [x], apiVersion: credentialprovider.kubelet.k8s.io/v1beta1}\n",
                "not supported",
            ),
            (
                "- {name: ../p, matchImages: [x], apiVersion: credentialprovider.kubelet.k8s.io/v1}\n",
                "file name",
            ),
            (
                "- {name: p, matchImages: [], apiVersion: credentialprovider.kubelet.k8s.io/v1}\n",
                "matchImages",
            ),
            (
                "- {name: p, matchImages: [x], defaultCacheDuration: soon, apiVersion: credentialprovider.kubelet.k8s.io/v1}\n",
                "defaultCacheDuration",
            ),
        ];
        for (providers, expect) in bad {
            let cfg = config(dir.path(), providers);
            let e = Providers::load(&cfg, dir.path(), Duration::from_secs(1)).unwrap_err();
            assert!(e.to_string().contains(expect), "{e}");
        }
        let missing = Providers::load(&dir.path().join("nope"), dir.path(), Duration::from_secs(1));
        assert!(matches!(missing, Err(ProviderError::Read { .. })));
    }
}
