//! An in-memory [`ArtifactSource`]: signature manifests, blobs and a
//! referrers index held in maps, with every call recorded. For what the
//! real registry (distribution 2.x) cannot serve — the referrers API — and
//! for benches that measure cache hits, not fetches.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Instant;

use sigil_core::{ArtifactSource, Digest, PullCredentials, Reference, ResolveFailure};

/// Manifests by reference (tag or digest), blobs by digest, one referrers
/// index (answered for any subject; `None`: no referrers API).
#[derive(Debug, Default)]
pub struct MemorySource {
    pub manifests: HashMap<String, Vec<u8>>,
    pub blobs: HashMap<String, Vec<u8>>,
    pub referrers: Option<Vec<u8>>,
    /// A host whose referrers API is being learned: the source says so, and
    /// each referrers request answers (`answered <digest>`) only once the
    /// tag schema has been asked too, or after 2 s.
    pub learning: bool,
    /// `manifest <ref>`, `referrers <digest>`, `blob <digest>`, in call order.
    pub calls: Mutex<Vec<String>>,
}

impl MemorySource {
    /// The calls made so far.
    pub fn calls(&self) -> Vec<String> {
        self.calls.lock().unwrap().clone()
    }
}

impl ArtifactSource for MemorySource {
    async fn manifest(
        &self,
        _: &Reference,
        r: &str,
        _: &PullCredentials,
        _: Instant,
    ) -> Result<Option<Vec<u8>>, ResolveFailure> {
        self.calls.lock().unwrap().push(format!("manifest {r}"));
        Ok(self.manifests.get(r).cloned())
    }

    async fn referrers(
        &self,
        _: &Reference,
        d: &Digest,
        _: &PullCredentials,
        _: Instant,
    ) -> Result<Option<Vec<u8>>, ResolveFailure> {
        self.calls.lock().unwrap().push(format!("referrers {d}"));
        if self.learning {
            let tag = format!("manifest {}-{}", d.algorithm(), d.hex());
            let until = Instant::now() + std::time::Duration::from_secs(2);
            while !self.calls().contains(&tag) && Instant::now() < until {
                tokio::time::sleep(std::time::Duration::from_millis(1)).await;
            }
            self.calls.lock().unwrap().push(format!("answered {d}"));
        }
        Ok(self.referrers.clone())
    }

    fn referrers_api_unknown(&self, _: &Reference) -> bool {
        self.learning
    }

    async fn blob(
        &self,
        _: &Reference,
        d: &Digest,
        _: usize,
        _: &PullCredentials,
        _: Instant,
    ) -> Result<Vec<u8>, ResolveFailure> {
        self.calls.lock().unwrap().push(format!("blob {d}"));
        self.blobs
            .get(d.as_str())
            .cloned()
            .ok_or(ResolveFailure::NotFound {
                detail: "blob".into(),
            })
    }
}

/// A shared [`MemorySource`], so a test can read its calls after handing
/// it to a verifier.
pub struct Shared(pub std::sync::Arc<MemorySource>);

impl ArtifactSource for Shared {
    async fn manifest(
        &self,
        repo: &Reference,
        r: &str,
        creds: &PullCredentials,
        deadline: Instant,
    ) -> Result<Option<Vec<u8>>, ResolveFailure> {
        self.0.manifest(repo, r, creds, deadline).await
    }

    async fn referrers(
        &self,
        repo: &Reference,
        d: &Digest,
        creds: &PullCredentials,
        deadline: Instant,
    ) -> Result<Option<Vec<u8>>, ResolveFailure> {
        self.0.referrers(repo, d, creds, deadline).await
    }

    fn referrers_api_unknown(&self, repo: &Reference) -> bool {
        self.0.referrers_api_unknown(repo)
    }

    async fn blob(
        &self,
        repo: &Reference,
        d: &Digest,
        max: usize,
        creds: &PullCredentials,
        deadline: Instant,
    ) -> Result<Vec<u8>, ResolveFailure> {
        self.0.blob(repo, d, max, creds, deadline).await
    }
}
