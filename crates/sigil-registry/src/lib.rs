//! sigil-registry: the OCI distribution client sigil resolves digests with.
//!
//! It owns talking to registries ([`client`]) and reading their answers
//! (error bodies, statuses, platform indexes), credentials and tokens
//! ([`auth`]), and the process-wide digest cache: positive answers live for the
//! policy's `cacheTTL`, not-found answers for a short negative TTL, transient
//! failures are never kept, and concurrent lookups of one reference are
//! coalesced into one request (single-flight; the table is [`cache`]'s). It
//! implements [`sigil_core::DigestResolver`]; it makes no policy decisions and
//! knows nothing about Kubernetes.

pub mod auth;
pub mod breaker;
pub mod cache;
pub mod client;
pub mod copy;
pub mod file;
pub mod helper;
mod hosts;
pub mod keychain;
pub mod layout;
pub mod probe;
pub mod provider;
mod response;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use sigil_core::credentials::{ANONYMOUS, Candidate, Credential, CredentialSource};
use sigil_core::policy::RegistrySpec;
use sigil_core::{
    Digest, DigestResolver, Freshness, Platform, PullCredentials, Reference, ResolveFailure,
};

/// Why the registry client could not be built from the policy.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    /// A `ca:` entry could not be read or holds no certificate.
    #[error("registry CA {source_name}: {detail}")]
    Ca {
        /// The file path, or "inline PEM".
        source_name: String,
        /// What went wrong.
        detail: String,
    },
    /// The TLS or HTTP client could not be set up.
    #[error("TLS setup: {0}")]
    Tls(String),
    /// A credential source (`--docker-config`, the credential-provider
    /// config) could not be read.
    #[error("credentials {source_name}: {detail}")]
    Credentials {
        /// The file.
        source_name: String,
        /// What went wrong.
        detail: String,
    },
}

/// Receives one call per HTTP request and per cache lookup, for metrics.
pub trait Observer: Send + Sync + 'static {
    /// An HTTP request finished (`status` is the code, or `error`/`timeout`).
    fn request(&self, host: &str, method: &str, status: &str, elapsed: Duration);
    /// A digest lookup was answered from the cache (`hit`) or had to load.
    fn cache(&self, hit: bool);
    /// A lookup was answered using a credential from this kind of source
    /// (`secret`, `serviceaccount`, `policy`, `docker-config`, `helper`,
    /// `provider`, `anonymous`).
    fn credential(&self, _source: &str) {}
    /// sigil asked `host` what it supports (`kind`: `auth`, the first
    /// request, whose anonymous answer says how the host authenticates;
    /// `referrers`, the first referrers request): once per host while the
    /// answer is kept.
    fn probe(&self, _host: &str, _kind: &str) {}
    /// A host's circuit breaker changed state: 0 closed, 1 open, 2 half-open.
    fn breaker(&self, _host: &str, _state: i64) {}
    /// A copy into a mirror started.
    fn copy_started(&self) {}
    /// A copy into a mirror ended (`ok`), having streamed `bytes`.
    fn copy_finished(&self, _ok: bool, _bytes: u64, _elapsed: Duration) {}
}

/// An observer that records nothing.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoObserver;

impl Observer for NoObserver {
    fn request(&self, _: &str, _: &str, _: &str, _: Duration) {}
    fn cache(&self, _: bool) {}
}

/// Cache settings (shared with the verification cache).
pub use sigil_core::CacheConfig;

/// A cached answer is keyed by the credential identity it was learned with,
/// so namespaces sharing one credential share it and no other request sees it.
///
/// The key is the SHA-256 of every part ([`cache::KeyBuilder`]): 32 bytes
/// inline instead of five separately allocated strings, so a cache of
/// 100,000 digests spends its memory on answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Key([u8; 32]);

impl Key {
    fn new(target: &Reference, platform: Option<&Platform>, identity: &str) -> Key {
        let mut k = cache::KeyBuilder::new();
        k.part(identity)
            .part(target.domain())
            .part(target.path())
            .part(target.tag_or_latest());
        // A reference with a digest is a question about that digest.
        if let Some(d) = target.digest() {
            k.part(d.as_str());
        }
        match platform.filter(|_| target.digest().is_none()) {
            None => k.part(""),
            Some(p) => k
                .part(&p.os)
                .part(&p.architecture)
                .part(p.variant.as_deref().unwrap_or("\0none")),
        };
        Key(k.finish())
    }
}

/// A cached answer: a sha256 digest (nearly every answer) as its 32 raw
/// bytes inline, anything else shared with the instant it stops being
/// usable. No allocation per cached digest, and no per-entry timer: the
/// cache expires everything at `cacheTTL`, and the shorter lives of
/// negative answers (and the zero life of transient failures) are checked
/// here on each hit — a timer node per entry was a sixth of the memory of a
/// full cache (docs/benchmarks.md).
#[derive(Clone)]
enum Answer {
    Sha256([u8; 32]),
    Other(Arc<(Result<Digest, ResolveFailure>, Instant)>),
}

impl Answer {
    fn new(r: Result<Digest, ResolveFailure>, cfg: &CacheConfig) -> Answer {
        if let Some(b) = r.as_ref().ok().and_then(Digest::sha256_bytes) {
            return Answer::Sha256(b);
        }
        let freshness = match &r {
            Ok(_) => Freshness::Good,
            Err(f) if !f.is_transient() => Freshness::Definite,
            // Refused for this identity: a rotated credential is a new
            // identity, so remembering the refusal briefly is safe.
            Err(ResolveFailure::Unauthorized { .. }) => Freshness::Definite,
            Err(_) => Freshness::Transient,
        };
        Answer::Other(Arc::new((r, Instant::now() + cfg.lifetime(freshness))))
    }

    /// Whether a hit may be used now (a positive answer until the cache drops it).
    fn usable(&self, now: Instant) -> bool {
        match self {
            Answer::Sha256(_) => true,
            Answer::Other(o) => now < o.1,
        }
    }

    fn result(&self) -> Result<Digest, ResolveFailure> {
        match self {
            Answer::Sha256(b) => Ok(Digest::from_sha256(b)),
            Answer::Other(o) => o.0.clone(),
        }
    }
}

/// The registry client: one per process, shared by every request.
#[derive(Clone)]
pub struct Registry {
    inner: Arc<Inner>,
}

pub(crate) struct Inner {
    hosts: hosts::Hosts,
    keychain: Arc<keychain::Keychain>,
    tokens: auth::TokenCache,
    /// How each host authenticates (one probe per host).
    schemes: probe::Learned<probe::Scheme>,
    cache: cache::Cache<Answer>,
    cache_config: CacheConfig,
    observer: Arc<dyn Observer>,
    lookups: AtomicU64,
    /// A circuit breaker per host: a dark registry fails fast.
    breakers: breaker::Breakers,
    /// Whether each host has the referrers API (its first referrers answer,
    /// single-flighted): a host without goes straight to the tag schema
    /// instead of paying a 404 per image.
    referrers_api: probe::Learned<bool>,
    /// Copies into mirrors, one per image at a time.
    copies: copy::Copies,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry")
            .field("hosts", &self.inner.hosts)
            .field("cached", &self.inner.cache.len())
            .finish()
    }
}

impl Registry {
    /// Builds clients for the policy's registries; `keychain` holds the
    /// node-level credentials (`--docker-config`, credential-provider
    /// plugins; `Arc::default()` for none).
    pub fn new(
        specs: &[RegistrySpec],
        cache: CacheConfig,
        observer: Arc<dyn Observer>,
        keychain: Arc<keychain::Keychain>,
        breaker: breaker::Settings,
        copies: copy::Settings,
    ) -> Result<Registry, RegistryError> {
        Ok(Registry {
            inner: Arc::new(Inner {
                hosts: hosts::Hosts::new(specs)?,
                keychain,
                tokens: auth::TokenCache::default(),
                schemes: probe::Learned::default(),
                cache: cache::Cache::new(cache.capacity, cache.ttl),
                cache_config: cache,
                observer,
                lookups: AtomicU64::new(0),
                breakers: breaker::Breakers::new(breaker),
                referrers_api: probe::Learned::default(),
                copies: copy::Copies::new(copies),
            }),
        })
    }

    /// The node-level keychain in use.
    pub fn keychain(&self) -> &Arc<keychain::Keychain> {
        &self.inner.keychain
    }

    /// Entries in the digest cache.
    pub async fn cache_size(&self) -> u64 {
        self.inner.cache.len()
    }

    /// Lookups that went to a registry (cache misses that loaded).
    pub fn loads(&self) -> u64 {
        self.inner.lookups.load(Ordering::Relaxed)
    }

    fn lookup<'a>(
        &'a self,
        target: &Reference,
        credential: Option<&'a Credential>,
        deadline: Instant,
    ) -> client::Lookup<'a> {
        client::Lookup {
            host: self.inner.hosts.get(target.domain()),
            permits: self.inner.hosts.permits(target.domain()),
            credential,
            tokens: &self.inner.tokens,
            schemes: &self.inner.schemes,
            observer: self.inner.observer.as_ref(),
            deadline,
            budget: deadline.saturating_duration_since(Instant::now()),
        }
    }

    /// One uncached GET under the deadline; 404 is `Ok(None)`.
    async fn get_optional(
        &self,
        target: &Reference,
        rest: &str,
        credential: Option<&Credential>,
        deadline: Instant,
    ) -> Result<Option<Vec<u8>>, ResolveFailure> {
        let permit = self
            .inner
            .breakers
            .admit(target.domain(), self.inner.observer.as_ref())?;
        let lookup = self.lookup(target, credential, deadline);
        let budget = lookup.budget;
        let r = match tokio::time::timeout_at(deadline.into(), lookup.get_optional(target, rest))
            .await
        {
            Ok(r) => r,
            Err(_) => Err(ResolveFailure::Timeout { budget }),
        };
        self.inner.breakers.record(permit, &r);
        r
    }

    /// The credentials to try for `target`, in order, anonymous last.
    pub async fn candidates(
        &self,
        target: &Reference,
        cluster: &PullCredentials,
    ) -> keychain::Candidates {
        let host = target.domain();
        let policy = self.inner.hosts.get(host).policy_credential(host).map(|c| {
            c.map(|credential| Candidate {
                credential: Some(credential),
                source: CredentialSource::Policy {
                    host: host.to_owned(),
                },
            })
        });
        self.inner
            .keychain
            .candidates(target, cluster, policy)
            .await
    }

    /// Tries `op` with each candidate in order until one is not refused
    /// (401/403); a refusal by every one names them all.
    async fn with_candidates<T, F, Fut>(
        &self,
        target: &Reference,
        cluster: &PullCredentials,
        mut op: F,
    ) -> Result<T, ResolveFailure>
    where
        F: FnMut(Option<Credential>) -> Fut,
        Fut: std::future::Future<Output = Result<T, ResolveFailure>>,
    {
        let candidates = self.candidates(target, cluster).await;
        let mut tried: Vec<String> = Vec::new();
        let mut last = None;
        for Candidate { credential, source } in candidates.list {
            let kind = source.kind();
            match op(credential).await {
                Err(f @ ResolveFailure::Unauthorized { .. }) => {
                    tried.push(source.to_string());
                    last = Some(f);
                }
                other => {
                    if other.is_ok() {
                        self.inner.observer.credential(kind);
                    }
                    return other;
                }
            }
        }
        Err(refused(last, &tried, cluster, &candidates.problems))
    }

    /// Resolves without the cache: one fresh lookup, anonymous.
    pub async fn resolve_uncached(
        &self,
        target: &Reference,
        platform: Option<&Platform>,
        deadline: Instant,
    ) -> Result<Digest, ResolveFailure> {
        self.resolve_as(target, platform, None, deadline).await
    }

    pub(crate) async fn resolve_as(
        &self,
        target: &Reference,
        platform: Option<&Platform>,
        credential: Option<&Credential>,
        deadline: Instant,
    ) -> Result<Digest, ResolveFailure> {
        let permit = self
            .inner
            .breakers
            .admit(target.domain(), self.inner.observer.as_ref())?;
        let lookup = self.lookup(target, credential, deadline);
        let budget = lookup.budget;
        let r = match tokio::time::timeout_at(deadline.into(), lookup.resolve(target, platform))
            .await
        {
            Ok(r) => r,
            Err(_) => Err(ResolveFailure::Timeout { budget }),
        };
        self.inner.breakers.record(permit, &r);
        r
    }
}

/// Every candidate refused: the registry's last word, then what was tried
/// (by kind and name), what the object named that held nothing for this
/// registry, and what could not be asked.
fn refused(
    last: Option<ResolveFailure>,
    tried: &[String],
    cluster: &PullCredentials,
    problems: &[String],
) -> ResolveFailure {
    let (status, detail) = match last {
        Some(ResolveFailure::Unauthorized { status, detail }) => (status, detail),
        _ => (401, "unauthorized".to_owned()),
    };
    let mut detail = format!("{detail}; tried {}", tried.join(", "));
    let unmatched: Vec<&String> = cluster
        .named
        .iter()
        .filter(|n| !tried.iter().any(|t| t.starts_with(n.as_str())))
        .collect();
    if !unmatched.is_empty() {
        let names: Vec<&str> = unmatched.iter().map(|s| s.as_str()).collect();
        detail.push_str(&format!(
            "; {} held no credential for this registry",
            names.join(", ")
        ));
    }
    if !problems.is_empty() {
        detail.push_str(&format!("; could not ask: {}", problems.join("; ")));
    }
    ResolveFailure::Unauthorized { status, detail }
}

impl DigestResolver for Registry {
    async fn resolve(
        &self,
        target: &Reference,
        platform: Option<&Platform>,
        creds: &PullCredentials,
        deadline: Instant,
    ) -> Result<Digest, ResolveFailure> {
        // A digest is asked about as it is (is it served there?), whatever
        // the platform: a pinned digest is never swapped for another.
        let platform = platform.filter(|_| target.digest().is_none());
        self.with_candidates(target, creds, |c| {
            self.resolve_cached(target, platform, c, deadline)
        })
        .await
    }
}

impl Registry {
    /// One candidate's answer, from the cache or one coalesced load.
    async fn resolve_cached(
        &self,
        target: &Reference,
        platform: Option<&Platform>,
        credential: Option<Credential>,
        deadline: Instant,
    ) -> Result<Digest, ResolveFailure> {
        let key = Key::new(
            target,
            platform,
            credential.as_ref().map_or(ANONYMOUS, Credential::identity),
        );
        // Hit path: one shard lock, no allocation for a sha256 answer.
        if let Some(v) = self.inner.cache.get(&key.0) {
            if v.usable(Instant::now()) {
                self.inner.observer.cache(true);
                return v.result();
            }
            // A negative answer past its shorter life: ask again.
            self.inner.cache.invalidate(&key.0);
        }
        // The miss (single-flight, the registry round trip) is a future of
        // several KiB; boxed on its own so that the hit's future, which
        // every cached admission makes and moves per image, stays small.
        Box::pin(self.resolve_missed(key, target, platform, credential, deadline)).await
    }

    /// A miss: one coalesced load for every caller waiting on `key`.
    async fn resolve_missed(
        &self,
        key: Key,
        target: &Reference,
        platform: Option<&Platform>,
        credential: Option<Credential>,
        deadline: Instant,
    ) -> Result<Digest, ResolveFailure> {
        let budget = deadline.saturating_duration_since(Instant::now());
        let load = async {
            self.inner.lookups.fetch_add(1, Ordering::Relaxed);
            Answer::new(
                self.resolve_as(target, platform, credential.as_ref(), deadline)
                    .await,
                &self.inner.cache_config,
            )
        };
        let entry = tokio::time::timeout_at(
            deadline.into(),
            self.inner.cache.get_or_load(key.0, || load),
        )
        .await;
        match entry {
            Ok((answer, loaded)) => {
                self.inner.observer.cache(!loaded);
                answer.result()
            }
            Err(_) => Err(ResolveFailure::Timeout { budget }),
        }
    }
}

fn check_digest(bytes: &[u8], want: &Digest, what: &str) -> Result<(), ResolveFailure> {
    use sha2::{Digest as _, Sha256};
    if want.algorithm() != "sha256" {
        return Err(ResolveFailure::BadResponse {
            detail: format!("{what} {want}: only sha256 digests are supported"),
        });
    }
    let got = Digest::from_sha256(&Sha256::digest(bytes).into());
    if got != *want {
        return Err(ResolveFailure::BadResponse {
            detail: format!("{what} {want}: registry served content hashing to {got}"),
        });
    }
    Ok(())
}

/// Signature artifacts are read uncached: the verification cache above
/// holds outcomes, and a fresh signature must be seen when that expires.
impl sigil_core::ArtifactSource for Registry {
    async fn manifest(
        &self,
        repository: &Reference,
        reference: &str,
        creds: &PullCredentials,
        deadline: Instant,
    ) -> Result<Option<Vec<u8>>, ResolveFailure> {
        let rest = &format!("manifests/{reference}");
        let body = self
            .with_candidates(repository, creds, |c| async move {
                self.get_optional(repository, rest, c.as_ref(), deadline)
                    .await
            })
            .await?;
        if let (Some(b), Ok(d)) = (&body, Digest::parse(reference)) {
            check_digest(b, &d, "manifest")?;
        }
        Ok(body)
    }

    async fn referrers(
        &self,
        repository: &Reference,
        digest: &Digest,
        creds: &PullCredentials,
        deadline: Instant,
    ) -> Result<Option<Vec<u8>>, ResolveFailure> {
        // A registry with the referrers API never answers it with 404 (OCI
        // distribution spec), so 404 means "no API". The first request to a
        // host is its probe: others arriving meanwhile wait for its answer.
        let host = repository.domain();
        let rest = &format!("referrers/{digest}");
        let ask = || async {
            self.with_candidates(repository, creds, |c| async move {
                self.get_optional(repository, rest, c.as_ref(), deadline)
                    .await
            })
            .await
        };
        if let Some(has) = self.inner.referrers_api.known(host) {
            return if has { ask().await } else { Ok(None) };
        }
        let mut mine = None;
        let has = self
            .inner
            .referrers_api
            .learn(host, || async {
                self.inner.observer.probe(host, "referrers");
                let r = ask().await?;
                let has = r.is_some();
                mine = Some(r);
                Ok::<_, ResolveFailure>(has)
            })
            .await?;
        match mine {
            Some(r) => Ok(r),
            None if has => ask().await,
            None => Ok(None),
        }
    }

    fn referrers_api_unknown(&self, repository: &Reference) -> bool {
        self.inner
            .referrers_api
            .known(repository.domain())
            .is_none()
    }

    async fn blob(
        &self,
        repository: &Reference,
        digest: &Digest,
        max: usize,
        creds: &PullCredentials,
        deadline: Instant,
    ) -> Result<Vec<u8>, ResolveFailure> {
        let rest = &format!("blobs/{digest}");
        let body = self
            .with_candidates(repository, creds, |c| async move {
                self.get_optional(repository, rest, c.as_ref(), deadline)
                    .await
            })
            .await?
            .ok_or_else(|| ResolveFailure::NotFound {
                detail: format!("blob {digest} not found"),
            })?;
        if body.len() > max {
            return Err(ResolveFailure::BadResponse {
                detail: format!("blob {digest} is larger than {max} bytes"),
            });
        }
        check_digest(&body, digest, "blob")?;
        Ok(body)
    }
}

#[cfg(test)]
mod tests;
