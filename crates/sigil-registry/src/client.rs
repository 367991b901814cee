//! The OCI distribution wire protocol for one lookup: tag → digest.
//!
//! Owns per-host HTTP clients (TLS roots plus the policy's CA, in `tls`; plain HTTP only
//! where `insecure: true`), the auth dance (anonymous → challenge → Basic or
//! Bearer token), one retry on connection errors, `Retry-After` on 429 when it
//! fits the deadline, and digest verification when a body is fetched. It does
//! not cache or coalesce; `lib.rs` wraps it for that.

use std::sync::Arc;
use std::time::{Duration, Instant};

use http::{HeaderValue, Method, StatusCode, header};
use sha2::{Digest as _, Sha256};
use sigil_core::credentials::{ANONYMOUS, Credential};
use sigil_core::policy::RegistrySpec;
use sigil_core::reference::api_host;
use sigil_core::{Digest, Platform, Reference, ResolveFailure};
use tokio::sync::Semaphore;

use crate::auth::{Challenge, CredentialSource, TokenCache, parse_challenge};
use crate::probe::{Learned, Scheme};
use crate::response::{Resp, error_detail, failure_for, pick_platform, retry_after};
use crate::{Observer, RegistryError};

mod ahead;
mod tls;
use ahead::scheme_of;
use tls::{extra_roots, tls_config};

/// Media types sigil accepts for a manifest lookup, most preferred first.
pub const MANIFEST_ACCEPT: &str = "application/vnd.oci.image.index.v1+json, application/vnd.docker.distribution.manifest.list.v2+json, application/vnd.oci.image.manifest.v1+json, application/vnd.docker.distribution.manifest.v2+json";
/// Largest manifest body sigil reads (the distribution spec suggests 4 MiB).
pub const MAX_MANIFEST_BYTES: usize = 4 << 20;
pub(crate) const DEFAULT_MAX_CONCURRENT: u32 = 128;
const USER_AGENT: &str = concat!("sigil/", env!("CARGO_PKG_VERSION"));

/// Connection settings for one registry host.
#[derive(Debug)]
pub(crate) struct HostClient {
    pub(crate) scheme: &'static str,
    /// Built on first use ([`HostClient::http`]): the system CA bundle it
    /// trusts costs some 19 million instructions to read (5 ms), which
    /// `sigil pin --check` on pinned files, `--offline`, and a policy's
    /// unused hosts never need.
    http: std::sync::OnceLock<reqwest::Client>,
    /// The host's own CA (`registries[].ca`), read and checked when the
    /// client is made, so a bad CA is still an error at policy load.
    extra_roots: Vec<rustls_pki_types::CertificateDer<'static>>,
    pub(crate) creds: CredentialSource,
    /// What copies push with (`pushAuth`, else `auth`).
    pub(crate) push_creds: CredentialSource,
    /// The policy credential as last read, and when: files are re-read at
    /// most every [`CREDENTIAL_FILE_POLL`], so a rotated Secret takes effect
    /// without a restart and lookups do not read the disk each time.
    loaded: std::sync::Mutex<Option<Loaded>>,
    /// Concurrent requests to this host (for the default client, the size
    /// each unlisted host gets: see [`Hosts::permits`]).
    pub(crate) permits: Arc<Semaphore>,
}

/// An HTTPS client with the same trust as registry clients (system and
/// Mozilla roots), for fetching that is not a registry's (TUF metadata).
pub fn web_client() -> Result<reqwest::Client, RegistryError> {
    reqwest::Client::builder()
        .tls_backend_preconfigured(tls_config(&[])?)
        .user_agent(USER_AGENT)
        .connect_timeout(Duration::from_secs(5))
        .redirect(reqwest::redirect::Policy::limited(5))
        .build()
        .map_err(|e| RegistryError::Tls(e.to_string()))
}

impl HostClient {
    pub(crate) fn new(spec: &RegistrySpec) -> Result<HostClient, RegistryError> {
        let extra_roots = match spec.ca.as_deref() {
            Some(ca) => extra_roots(ca)?,
            None => Vec::new(),
        };
        Ok(HostClient {
            scheme: if spec.insecure { "http" } else { "https" },
            http: std::sync::OnceLock::new(),
            extra_roots,
            creds: CredentialSource::from_spec(spec.auth.as_ref()),
            push_creds: CredentialSource::from_spec(spec.push_auth.as_ref().or(spec.auth.as_ref())),
            loaded: std::sync::Mutex::new(None),
            permits: Arc::new(Semaphore::new(
                spec.max_concurrent_requests
                    .unwrap_or(DEFAULT_MAX_CONCURRENT)
                    .max(1) as usize,
            )),
        })
    }

    /// The HTTP client, built on first use (see the field). Its TLS
    /// settings were checked when the host client was made, so building
    /// fails only where the TLS library itself cannot start.
    pub(crate) fn http(&self) -> Result<&reqwest::Client, ResolveFailure> {
        if let Some(c) = self.http.get() {
            return Ok(c);
        }
        let built = tls_config(&self.extra_roots).and_then(|tls| {
            reqwest::Client::builder()
                .tls_backend_preconfigured(tls)
                .user_agent(USER_AGENT)
                .connect_timeout(Duration::from_secs(5))
                .pool_idle_timeout(Duration::from_secs(90))
                // A stalled transfer (a copy streams for as long as it takes)
                // fails instead of hanging; lookups have shorter deadlines.
                .read_timeout(Duration::from_secs(30))
                .redirect(reqwest::redirect::Policy::limited(5))
                .no_proxy()
                .build()
                .map_err(|e| RegistryError::Tls(e.to_string()))
        });
        match built {
            // Two first uses at once may both build; one client is kept.
            Ok(c) => Ok(self.http.get_or_init(|| c)),
            Err(e) => Err(ResolveFailure::Config {
                detail: format!("the registry client could not be built: {e}"),
            }),
        }
    }
}

/// A policy credential read from its file, and when.
type Loaded = (Instant, Result<Option<Credential>, String>);

/// How often the policy's password or docker config file is re-read.
pub const CREDENTIAL_FILE_POLL: Duration = Duration::from_secs(2);

impl HostClient {
    /// The policy's credential for `host` (`registries[].auth`), read from
    /// its file at most every [`CREDENTIAL_FILE_POLL`].
    pub(crate) fn policy_credential(&self, host: &str) -> Result<Option<Credential>, String> {
        if self.creds == CredentialSource::Anonymous {
            return Ok(None);
        }
        let mut loaded = self.loaded.lock().unwrap_or_else(|e| e.into_inner());
        match &*loaded {
            Some((at, c)) if at.elapsed() < CREDENTIAL_FILE_POLL => c.clone(),
            _ => {
                let c = self.creds.load(host);
                *loaded = Some((Instant::now(), c.clone()));
                c
            }
        }
    }
}

pub(crate) struct Lookup<'a> {
    pub(crate) host: &'a HostClient,
    /// Request slots of the registry host this lookup talks to.
    pub(crate) permits: Arc<Semaphore>,
    /// The credential this lookup authenticates with (`None`: anonymous).
    pub(crate) credential: Option<&'a Credential>,
    pub(crate) tokens: &'a TokenCache,
    /// How each host authenticates, probed once per host.
    pub(crate) schemes: &'a Learned<Scheme>,
    pub(crate) observer: &'a dyn Observer,
    pub(crate) deadline: Instant,
    pub(crate) budget: Duration,
}

/// The `Docker-Content-Digest` a registry answered with, if readable.
fn content_digest(headers: &http::HeaderMap) -> Option<&str> {
    headers
        .get("docker-content-digest")
        .and_then(|v| v.to_str().ok())
}

impl Lookup<'_> {
    /// Resolves one reference with a tag to the digest its registry serves;
    /// a reference with a digest is confirmed served as it is
    /// ([`Lookup::confirm`]).
    pub(crate) async fn resolve(
        &self,
        target: &Reference,
        platform: Option<&Platform>,
    ) -> Result<Digest, ResolveFailure> {
        if let Some(d) = target.digest() {
            return self.confirm(target, d).await;
        }
        let domain = target.domain();
        let url = format!(
            "{}://{}/v2/{}/manifests/{}",
            self.host.scheme,
            api_host(domain),
            target.path(),
            target.tag_or_latest()
        );
        let scope = format!("repository:{}:pull", target.path());
        if platform.is_none() {
            let r = self.send(Method::HEAD, &url, domain, &scope).await?;
            if r.status == StatusCode::OK {
                if let Some(d) = content_digest(&r.headers) {
                    return Digest::parse(d.trim()).map_err(|e| ResolveFailure::BadResponse {
                        detail: format!("Docker-Content-Digest {d:?}: {e}"),
                    });
                }
            } else if r.status != StatusCode::NOT_FOUND {
                return Err(failure_for(&r));
            }
            // A HEAD 404 has no body; the GET below tells which is unknown
            // (MANIFEST_UNKNOWN vs NAME_UNKNOWN), which is what users need.
        }
        // No digest header, or a platform to pick: read the body and hash it ourselves.
        let r = self.send(Method::GET, &url, domain, &scope).await?;
        if r.status != StatusCode::OK {
            return Err(failure_for(&r));
        }
        let computed = Digest::from_sha256(&Sha256::digest(&r.body).into());
        if let Some(h) = content_digest(&r.headers)
            && h.trim().starts_with("sha256:")
            && h.trim() != computed.as_str()
        {
            return Err(ResolveFailure::BadResponse {
                detail: format!(
                    "Docker-Content-Digest {h} does not match the manifest's sha256 {computed}"
                ),
            });
        }
        match platform {
            None => Ok(computed),
            Some(p) => pick_platform(&r.body, p, computed),
        }
    }

    /// Asks the registry for the manifest `digest` of `target`'s repository
    /// (HEAD, a GET only to tell which part is unknown): before an image
    /// pinned by digest is written at a mirror, the mirror must serve that
    /// digest, or the reference would not pull.
    async fn confirm(&self, target: &Reference, digest: &Digest) -> Result<Digest, ResolveFailure> {
        let domain = target.domain();
        let url = format!(
            "{}://{}/v2/{}/manifests/{}",
            self.host.scheme,
            api_host(domain),
            target.path(),
            digest.as_str()
        );
        let scope = format!("repository:{}:pull", target.path());
        let r = self.send(Method::HEAD, &url, domain, &scope).await?;
        if r.status == StatusCode::OK {
            if let Some(h) = content_digest(&r.headers)
                && h.trim() != digest.as_str()
            {
                return Err(ResolveFailure::BadResponse {
                    detail: format!("asked for {digest}, the registry answered {h}"),
                });
            }
            return Ok(digest.clone());
        }
        if r.status != StatusCode::NOT_FOUND {
            return Err(failure_for(&r));
        }
        let r = self.send(Method::GET, &url, domain, &scope).await?;
        if r.status == StatusCode::OK {
            return Ok(digest.clone());
        }
        Err(failure_for(&r))
    }

    /// GETs a registry path under `/v2/<name>/`; 404 is `Ok(None)`.
    pub(crate) async fn get_optional(
        &self,
        target: &Reference,
        rest: &str,
    ) -> Result<Option<Vec<u8>>, ResolveFailure> {
        let domain = target.domain();
        let url = format!(
            "{}://{}/v2/{}/{rest}",
            self.host.scheme,
            api_host(domain),
            target.path()
        );
        let scope = format!("repository:{}:pull", target.path());
        let r = self.send(Method::GET, &url, domain, &scope).await?;
        match r.status {
            StatusCode::OK => Ok(Some(r.body)),
            StatusCode::NOT_FOUND => Ok(None),
            _ => Err(failure_for(&r)),
        }
    }

    async fn send(
        &self,
        method: Method,
        url: &str,
        domain: &str,
        scope: &str,
    ) -> Result<Resp, ResolveFailure> {
        let _permit = tokio::time::timeout_at(self.deadline.into(), self.permits.acquire())
            .await
            .map_err(|_| ResolveFailure::Timeout {
                budget: self.budget,
            })?
            .map_err(|_| ResolveFailure::Config {
                detail: "registry client is shutting down".into(),
            })?;
        let identity = self.credential.map_or(ANONYMOUS, Credential::identity);
        let mut auth = self
            .tokens
            .get(domain, scope, identity)
            .map(|t| format!("Bearer {t}"));
        // The first request to an unknown host is its probe: answered here.
        let mut answered = None;
        if auth.is_none() {
            match self.ahead((&method, url), domain, scope, identity).await? {
                ahead::Ahead::Auth(a) => auth = a,
                ahead::Ahead::Answered(r) => answered = Some(r),
            }
        }
        let mut authed_once = false;
        let mut rate_limited_once = false;
        let mut conn_retried = false;
        loop {
            let sent = match answered.take() {
                Some(r) => Ok(r),
                None => {
                    self.once(method.clone(), url, domain, auth.as_deref())
                        .await
                }
            };
            let r = match sent {
                Ok(r) => r,
                Err(ResolveFailure::Unreachable { detail })
                    if !conn_retried && self.remaining() > Duration::from_millis(50) =>
                {
                    tracing::debug!(url, %detail, "registry connection failed; retrying once");
                    conn_retried = true;
                    continue;
                }
                Err(e) => return Err(e),
            };
            if r.status == StatusCode::UNAUTHORIZED && !authed_once {
                authed_once = true;
                let challenge = r
                    .headers
                    .get(header::WWW_AUTHENTICATE)
                    .and_then(|v| v.to_str().ok())
                    .and_then(parse_challenge);
                if let Some(c) = &challenge {
                    self.schemes.record(domain, scheme_of(c));
                }
                auth = match challenge {
                    Some(Challenge::Basic) => match self.credential {
                        Some(c) => Some(c.basic_header().to_string()),
                        None => return Err(failure_for(&r)),
                    },
                    Some(Challenge::Bearer {
                        realm,
                        service,
                        scope: ch_scope,
                    }) => {
                        let sc = ch_scope.unwrap_or_else(|| scope.to_owned());
                        let token = self
                            .fetch_token(domain, &realm, service.as_deref(), &sc, self.credential)
                            .await?;
                        self.tokens
                            .put(domain, scope, identity, token.0.clone(), token.1);
                        Some(format!("Bearer {}", token.0))
                    }
                    None => return Err(failure_for(&r)),
                };
                continue;
            }
            if r.status == StatusCode::TOO_MANY_REQUESTS && !rate_limited_once {
                rate_limited_once = true;
                let wait = retry_after(&r.headers);
                match wait {
                    Some(w) if w + Duration::from_millis(100) < self.remaining() => {
                        tokio::time::sleep(w).await;
                        continue;
                    }
                    _ => return Err(ResolveFailure::RateLimited { retry_after: wait }),
                }
            }
            return Ok(r);
        }
    }

    fn remaining(&self) -> Duration {
        self.deadline.saturating_duration_since(Instant::now())
    }

    async fn once(
        &self,
        method: Method,
        url: &str,
        domain: &str,
        auth: Option<&str>,
    ) -> Result<Resp, ResolveFailure> {
        let remaining = self.remaining();
        if remaining.is_zero() {
            return Err(ResolveFailure::Timeout {
                budget: self.budget,
            });
        }
        let mut req = self
            .host
            .http()?
            .request(method.clone(), url)
            .header(header::ACCEPT, MANIFEST_ACCEPT)
            .timeout(remaining);
        if let Some(a) = auth {
            let mut v = HeaderValue::from_str(a).map_err(|_| ResolveFailure::Config {
                detail: "credentials contain characters not allowed in a header".into(),
            })?;
            v.set_sensitive(true);
            req = req.header(header::AUTHORIZATION, v);
        }
        let started = Instant::now();
        let res = req.send().await;
        let res = match res {
            Ok(r) => r,
            Err(e) => {
                self.observer.request(
                    domain,
                    method.as_str(),
                    if e.is_timeout() { "timeout" } else { "error" },
                    started.elapsed(),
                );
                return Err(transport_failure(&e, self.budget));
            }
        };
        let status = res.status();
        let headers = res.headers().clone();
        let body = if method == Method::HEAD {
            Vec::new()
        } else {
            read_limited(res, self.budget).await?
        };
        self.observer
            .request(domain, method.as_str(), status.as_str(), started.elapsed());
        Ok(Resp {
            status,
            headers,
            body,
        })
    }

    /// A token for `scope` (several scopes separated by spaces, as copies
    /// across two repositories need) from the challenge's realm.
    pub(crate) async fn fetch_token(
        &self,
        registry: &str,
        realm: &str,
        service: Option<&str>,
        scope: &str,
        creds: Option<&Credential>,
    ) -> Result<(String, Duration), ResolveFailure> {
        let mut url = reqwest::Url::parse(realm).map_err(|e| ResolveFailure::BadResponse {
            detail: format!("token realm {realm:?} is not a URL: {e}"),
        })?;
        // A registry reached over HTTPS must not make sigil send its
        // credentials in the clear (a challenge names any realm it likes).
        if creds.is_some() && self.host.scheme == "https" && url.scheme() != "https" {
            return Err(ResolveFailure::Config {
                detail: format!(
                    "registry {registry} named the token realm {realm}, which is not HTTPS; sigil does not send credentials there"
                ),
            });
        }
        let realm_host = url.host_str().unwrap_or_default();
        let registry_host = registry.split(':').next().unwrap_or(registry);
        if realm_host != registry_host && first_sighting(registry, realm_host) {
            tracing::info!(
                registry,
                realm_host,
                credentials = creds.is_some(),
                "the registry's token realm is on another host"
            );
        }
        {
            let mut q = url.query_pairs_mut();
            if let Some(s) = service {
                q.append_pair("service", s);
            }
            for s in scope.split(' ').filter(|s| !s.is_empty()) {
                q.append_pair("scope", s);
            }
        }
        let mut req = self.host.http()?.get(url.clone()).timeout(self.remaining());
        if let Some(c) = creds {
            let mut v = HeaderValue::from_str(c.basic_header().as_str()).map_err(|_| {
                ResolveFailure::Config {
                    detail: "credentials contain characters not allowed in a header".into(),
                }
            })?;
            v.set_sensitive(true);
            req = req.header(header::AUTHORIZATION, v);
        }
        let started = Instant::now();
        let host = url.host_str().unwrap_or_default().to_owned();
        let res = req.send().await.map_err(|e| {
            self.observer
                .request(&host, "GET", "error", started.elapsed());
            transport_failure(&e, self.budget)
        })?;
        let status = res.status();
        self.observer
            .request(&host, "GET", status.as_str(), started.elapsed());
        let body = read_limited(res, self.budget).await?;
        if !status.is_success() {
            let detail = error_detail(&body)
                .unwrap_or_else(|| status.canonical_reason().unwrap_or("").to_owned());
            return Err(
                if status == StatusCode::UNAUTHORIZED || status == StatusCode::FORBIDDEN {
                    ResolveFailure::Unauthorized {
                        status: status.as_u16(),
                        detail: format!("token service refused: {detail}"),
                    }
                } else {
                    ResolveFailure::Status {
                        status: status.as_u16(),
                        detail: format!("token service: {detail}"),
                    }
                },
            );
        }
        #[derive(serde::Deserialize)]
        struct TokenResp {
            token: Option<String>,
            access_token: Option<String>,
            expires_in: Option<u64>,
        }
        let t: TokenResp =
            serde_json::from_slice(&body).map_err(|e| ResolveFailure::BadResponse {
                detail: format!("token response is not JSON: {e}"),
            })?;
        let token = t
            .token
            .or(t.access_token)
            .filter(|t| !t.is_empty())
            .ok_or_else(|| ResolveFailure::BadResponse {
                detail: "token response has no token".into(),
            })?;
        Ok((
            token,
            Duration::from_secs(t.expires_in.unwrap_or(60).clamp(1, 3600)),
        ))
    }
}

pub(crate) async fn read_limited(
    mut res: reqwest::Response,
    budget: Duration,
) -> Result<Vec<u8>, ResolveFailure> {
    if res
        .content_length()
        .is_some_and(|n| n > MAX_MANIFEST_BYTES as u64)
    {
        return Err(ResolveFailure::BadResponse {
            detail: format!("response larger than {MAX_MANIFEST_BYTES} bytes"),
        });
    }
    let mut out = Vec::new();
    loop {
        match res.chunk().await {
            Ok(Some(c)) => {
                if out.len() + c.len() > MAX_MANIFEST_BYTES {
                    return Err(ResolveFailure::BadResponse {
                        detail: format!("response larger than {MAX_MANIFEST_BYTES} bytes"),
                    });
                }
                out.extend_from_slice(&c);
            }
            Ok(None) => return Ok(out),
            Err(e) => return Err(transport_failure(&e, budget)),
        }
    }
}

pub(crate) fn transport_failure(e: &reqwest::Error, budget: Duration) -> ResolveFailure {
    if e.is_timeout() {
        return ResolveFailure::Timeout { budget };
    }
    // Walk the source chain: reqwest's own Display is just "error sending request".
    let mut detail = e.to_string();
    let mut src = std::error::Error::source(e);
    while let Some(s) = src {
        detail.push_str(": ");
        detail.push_str(&s.to_string());
        src = s.source();
    }
    ResolveFailure::Unreachable { detail }
}

/// Whether (registry, realm host) is seen for the first time (remembered
/// for up to 1024 pairs), so the realm's host is logged once, not per token.
fn first_sighting(registry: &str, realm_host: &str) -> bool {
    static SEEN: std::sync::Mutex<Option<std::collections::HashSet<String>>> =
        std::sync::Mutex::new(None);
    let mut seen = SEEN.lock().unwrap_or_else(|e| e.into_inner());
    let set = seen.get_or_insert_with(Default::default);
    if set.len() >= 1024 {
        set.clear();
    }
    set.insert(format!("{registry} {realm_host}"))
}
