//! sigil-registry: the OCI distribution client sigil resolves digests with.
//!
//! It owns talking to registries ([`client`]) and reading their answers
//! (error bodies, statuses, platform indexes), credentials and tokens
//! ([`auth`]), and the process-wide digest cache: positive answers live for the
//! policy's `cacheTTL`, not-found answers for a short negative TTL, transient
//! failures are never kept, and concurrent lookups of one reference are
//! coalesced into one request (single-flight, via moka's entry API). It
//! implements [`sigil_core::DigestResolver`]; it makes no policy decisions and
//! knows nothing about Kubernetes.

pub mod auth;
pub mod client;
pub mod helper;
pub mod provider;
mod response;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use moka::Expiry;
use moka::future::Cache;
use sigil_core::policy::RegistrySpec;
use sigil_core::{Digest, DigestResolver, Freshness, Platform, Reference, ResolveFailure};

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
}

/// Receives one call per HTTP request and per cache lookup, for metrics.
pub trait Observer: Send + Sync + 'static {
    /// An HTTP request finished (`status` is the code, or `error`/`timeout`).
    fn request(&self, host: &str, method: &str, status: &str, elapsed: Duration);
    /// A digest lookup was answered from the cache (`hit`) or had to load.
    fn cache(&self, hit: bool);
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

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Key {
    domain: String,
    path: String,
    tag: String,
    platform: Option<Platform>,
}

type Answer = Arc<Result<Digest, ResolveFailure>>;

struct TtlByAnswer(CacheConfig);

impl Expiry<Key, Answer> for TtlByAnswer {
    fn expire_after_create(&self, _: &Key, v: &Answer, _: std::time::Instant) -> Option<Duration> {
        Some(self.0.lifetime(match v.as_ref() {
            Ok(_) => Freshness::Good,
            Err(f) if !f.is_transient() => Freshness::Definite,
            Err(_) => Freshness::Transient,
        }))
    }
}

/// The registry client: one per process, shared by every request.
#[derive(Clone)]
pub struct Registry {
    inner: Arc<Inner>,
}

struct Inner {
    hosts: client::Hosts,
    tokens: auth::TokenCache,
    cache: Cache<Key, Answer>,
    observer: Arc<dyn Observer>,
    lookups: AtomicU64,
    /// Hosts known to lack the referrers API, and since when: clients go
    /// straight to the tag schema instead of paying a 404 round trip each time.
    no_referrers_api: std::sync::Mutex<std::collections::HashMap<String, Instant>>,
}

/// How long a host's missing referrers API is remembered (it may be upgraded).
const REFERRERS_API_MEMORY: Duration = Duration::from_secs(600);

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry")
            .field("hosts", &self.inner.hosts)
            .field("cached", &self.inner.cache.entry_count())
            .finish()
    }
}

impl Registry {
    /// Builds clients for the policy's registries.
    pub fn new(
        specs: &[RegistrySpec],
        cache: CacheConfig,
        observer: Arc<dyn Observer>,
    ) -> Result<Registry, RegistryError> {
        Ok(Registry {
            inner: Arc::new(Inner {
                hosts: client::Hosts::new(specs)?,
                tokens: auth::TokenCache::default(),
                cache: Cache::builder()
                    .max_capacity(cache.capacity)
                    .expire_after(TtlByAnswer(cache))
                    .build(),
                observer,
                lookups: AtomicU64::new(0),
                no_referrers_api: Default::default(),
            }),
        })
    }

    /// Entries in the digest cache (approximate, as moka counts).
    pub fn cache_size(&self) -> u64 {
        self.inner.cache.entry_count()
    }

    /// Lookups that went to a registry (cache misses that loaded).
    pub fn loads(&self) -> u64 {
        self.inner.lookups.load(Ordering::Relaxed)
    }

    fn lookup(&self, target: &Reference, deadline: Instant) -> client::Lookup<'_> {
        client::Lookup {
            host: self.inner.hosts.get(target.domain()),
            tokens: &self.inner.tokens,
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
        deadline: Instant,
    ) -> Result<Option<Vec<u8>>, ResolveFailure> {
        let lookup = self.lookup(target, deadline);
        let budget = lookup.budget;
        match tokio::time::timeout_at(deadline.into(), lookup.get_optional(target, rest)).await {
            Ok(r) => r,
            Err(_) => Err(ResolveFailure::Timeout { budget }),
        }
    }

    /// Resolves without the cache: one fresh lookup.
    pub async fn resolve_uncached(
        &self,
        target: &Reference,
        platform: Option<&Platform>,
        deadline: Instant,
    ) -> Result<Digest, ResolveFailure> {
        let lookup = self.lookup(target, deadline);
        let budget = lookup.budget;
        match tokio::time::timeout_at(deadline.into(), lookup.resolve(target, platform)).await {
            Ok(r) => r,
            Err(_) => Err(ResolveFailure::Timeout { budget }),
        }
    }
}

impl DigestResolver for Registry {
    async fn resolve(
        &self,
        target: &Reference,
        platform: Option<&Platform>,
        deadline: Instant,
    ) -> Result<Digest, ResolveFailure> {
        if let Some(d) = target.digest() {
            return Ok(d.clone());
        }
        let key = Key {
            domain: target.domain().to_owned(),
            path: target.path().to_owned(),
            tag: target.tag_or_latest().to_owned(),
            platform: platform.cloned(),
        };
        // Hit path: no timer, no initializer bookkeeping.
        if let Some(v) = self.inner.cache.get(&key).await {
            self.inner.observer.cache(true);
            return v.as_ref().clone();
        }
        let budget = deadline.saturating_duration_since(Instant::now());
        let load = async {
            self.inner.lookups.fetch_add(1, Ordering::Relaxed);
            Arc::new(self.resolve_uncached(target, platform, deadline).await)
        };
        let entry = tokio::time::timeout_at(
            deadline.into(),
            self.inner.cache.entry(key).or_insert_with(load),
        )
        .await;
        match entry {
            Ok(e) => {
                self.inner.observer.cache(!e.is_fresh());
                e.into_value().as_ref().clone()
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
        deadline: Instant,
    ) -> Result<Option<Vec<u8>>, ResolveFailure> {
        let body = self
            .get_optional(repository, &format!("manifests/{reference}"), deadline)
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
        deadline: Instant,
    ) -> Result<Option<Vec<u8>>, ResolveFailure> {
        // A registry with the referrers API never answers it with 404 (OCI
        // distribution spec), so 404 means "no API": remember it per host.
        let host = repository.domain().to_owned();
        let known_missing = self
            .inner
            .no_referrers_api
            .lock()
            .map(|m| {
                m.get(&host)
                    .is_some_and(|t| t.elapsed() < REFERRERS_API_MEMORY)
            })
            .unwrap_or(false);
        if known_missing {
            return Ok(None);
        }
        let r = self
            .get_optional(repository, &format!("referrers/{digest}"), deadline)
            .await?;
        if r.is_none()
            && let Ok(mut m) = self.inner.no_referrers_api.lock()
        {
            m.insert(host, Instant::now());
        }
        Ok(r)
    }

    async fn blob(
        &self,
        repository: &Reference,
        digest: &Digest,
        max: usize,
        deadline: Instant,
    ) -> Result<Vec<u8>, ResolveFailure> {
        let body = self
            .get_optional(repository, &format!("blobs/{digest}"), deadline)
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
