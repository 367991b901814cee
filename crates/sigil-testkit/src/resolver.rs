//! An in-process [`DigestResolver`] that answers at once, for unit tests,
//! the criterion benches and the fuzz targets: they exercise sigil's own
//! code (parsing, walking, planning, patching), not a registry. Tests that
//! need a registry run the real one ([`crate::registry`]).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use sha2::{Digest as _, Sha256};
use sigil_core::{Digest, DigestResolver, Platform, PullCredentials, Reference, ResolveFailure};

/// Answers every tag at once: with a fixed digest, or with one derived from
/// the name (so different images get different digests, the same image the
/// same one); a name whose path contains the `missing` marker answers 404.
/// Counts its calls.
#[derive(Debug)]
pub struct FakeResolver {
    fixed: Option<Digest>,
    missing: &'static str,
    calls: AtomicUsize,
}

impl Default for FakeResolver {
    fn default() -> Self {
        FakeResolver {
            fixed: None,
            missing: "missing",
            calls: AtomicUsize::new(0),
        }
    }
}

impl FakeResolver {
    /// Derives digests from names; paths containing `missing` are not found.
    pub fn new() -> FakeResolver {
        FakeResolver::default()
    }

    /// Answers `digest` for everything (not-found marker still applies).
    pub fn fixed(digest: Digest) -> FakeResolver {
        FakeResolver {
            fixed: Some(digest),
            ..FakeResolver::default()
        }
    }

    /// Paths containing `marker` are not found.
    pub fn missing_when(mut self, marker: &'static str) -> FakeResolver {
        self.missing = marker;
        self
    }

    /// How many lookups were made.
    pub fn calls(&self) -> usize {
        self.calls.load(Ordering::Relaxed)
    }

    /// The digest this resolver answers for `target` (its own digest, for a
    /// reference that has one).
    pub fn digest_of(&self, target: &Reference) -> Digest {
        if let Some(d) = target.digest() {
            return d.clone();
        }
        match &self.fixed {
            Some(d) => d.clone(),
            None => {
                let h: [u8; 32] = Sha256::digest(target.to_string().as_bytes()).into();
                Digest::from_sha256(&h)
            }
        }
    }
}

impl DigestResolver for FakeResolver {
    async fn resolve(
        &self,
        target: &Reference,
        _: Option<&Platform>,
        _: &PullCredentials,
        _: Instant,
    ) -> Result<Digest, ResolveFailure> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        if target.path().contains(self.missing) {
            return Err(ResolveFailure::NotFound {
                detail: "MANIFEST_UNKNOWN: manifest unknown".into(),
            });
        }
        Ok(self.digest_of(target))
    }
}
