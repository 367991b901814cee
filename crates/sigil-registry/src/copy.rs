//! Copying an image from its origin into a mirror: copy on admission
//! (`mirrors[].copy: true`) and `sigil mirror`.
//!
//! Owns the one copy per image at a time (concurrent admissions of a
//! missing image join the copy under way), running it in the background so
//! it outlives the admission that started it (only the process ending
//! stops it), remembering a finished copy as long as the mirror's cached
//! not-found could hide it, the process-wide limits (blob transfers at once,
//! bytes in flight, bytes per copy and per hour), the credentials (the
//! origin is read with sigil's own credentials — the policy's `auth`, the
//! node keychain — never a workload's pull secret, and only once the
//! workload's own credentials have shown it may pull it, so a copy never
//! publishes in a shared mirror what only one team may pull; the mirror is
//! written with `pushAuth`, else `auth`), and
//! the metrics, and what an admission's copy may read first: the origin as
//! the admitting workload itself could (`Registry::resolve_as_workload`).
//! The order of the requests is [`walk`]'s; the requests are
//! [`transfer`]'s.

mod transfer;
mod walk;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use sigil_core::credentials::{Candidate, Credential};
use sigil_core::{Digest, Freshness, Platform, PullCredentials, Reference, ResolveFailure};
use tokio::sync::{Semaphore, watch};

use crate::Registry;
use transfer::Repo;
use walk::{Limits, Walk};

/// Blob transfers at once, across all copies (`--mirror-copy-transfers`).
pub const DEFAULT_TRANSFERS: usize = 4;
/// Bytes read from origins and not yet taken by mirrors, across all copies
/// (`--mirror-copy-max-bytes-in-flight`).
pub const DEFAULT_BYTES_IN_FLIGHT: usize = 16 << 20;
/// The most one copy may move (`--mirror-copy-max-bytes`).
pub const DEFAULT_MAX_COPY_BYTES: u64 = 16 << 30;
/// The most all copies may move in an hour (`--mirror-copy-max-bytes-per-hour`).
pub const DEFAULT_MAX_BYTES_PER_HOUR: u64 = 256 << 30;
/// Copies under way at once; past it, a new one is refused (and retried by
/// the next admission that needs it).
const MAX_RUNNING: usize = 256;
/// How long a failed copy is remembered, so a mirror that refuses pushes is
/// not asked again by every admission.
const REMEMBER_FAILURE: Duration = Duration::from_secs(10);

/// The copier's limits.
#[derive(Debug, Clone, Copy)]
pub struct Settings {
    /// Blob transfers at once.
    pub transfers: usize,
    /// Bytes in flight.
    pub max_bytes_in_flight: usize,
    /// Bytes one copy may move: a larger image is not copied.
    pub max_copy_bytes: u64,
    /// Bytes all copies may move in an hour (a rolling window by the hour).
    pub max_bytes_per_hour: u64,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            transfers: DEFAULT_TRANSFERS,
            max_bytes_in_flight: DEFAULT_BYTES_IN_FLIGHT,
            max_copy_bytes: DEFAULT_MAX_COPY_BYTES,
            max_bytes_per_hour: DEFAULT_MAX_BYTES_PER_HOUR,
        }
    }
}

/// Where a copy stands when the caller stops waiting.
#[derive(Debug, Clone)]
pub enum CopyAnswer {
    /// The mirror has the image: its digest (the platform's, if asked).
    Copied(Digest),
    /// Still copying, started this long ago; it goes on in the background.
    Underway(Duration),
    /// The copy failed.
    Failed(ResolveFailure),
}

/// A finished copy.
struct Finished {
    result: Result<(Digest, Vec<u8>), ResolveFailure>,
    at: Instant,
}

/// One copy, under way or finished.
struct Job {
    started: Instant,
    done: watch::Receiver<Option<Arc<Finished>>>,
}

/// The copies of one registry client.
pub(crate) struct Copies {
    limits: Arc<Limits>,
    jobs: std::sync::Mutex<HashMap<String, Job>>,
}

impl Copies {
    pub(crate) fn new(s: Settings) -> Copies {
        let cap = s.max_bytes_in_flight.clamp(64 << 10, 1 << 30);
        Copies {
            limits: Arc::new(Limits {
                transfers: Arc::new(Semaphore::new(s.transfers.max(1))),
                bytes: Arc::new(Semaphore::new(cap)),
                cap,
                max_copy_bytes: s.max_copy_bytes,
                per_hour: walk::Window::new(s.max_bytes_per_hour),
            }),
            jobs: Default::default(),
        }
    }
}

impl Registry {
    /// Resolves `target` as the workload itself could: with its own pull
    /// credentials in order, then anonymous — never the policy's `auth` or
    /// the node keychain (sigil's own credentials), and without the cache
    /// (whose entries may have been filled with those). What a copy into a
    /// shared mirror is allowed to read.
    pub async fn resolve_as_workload(
        &self,
        target: &Reference,
        platform: Option<&Platform>,
        workload: &PullCredentials,
        deadline: Instant,
    ) -> Result<Digest, ResolveFailure> {
        let own = workload
            .candidates
            .iter()
            .map(|c| c.credential.clone())
            .chain(std::iter::once(None));
        let mut last = None;
        for credential in own {
            match self
                .resolve_as(target, platform, credential.as_ref(), deadline)
                .await
            {
                Err(f @ ResolveFailure::Unauthorized { .. }) => last = Some(f),
                other => return other,
            }
        }
        Err(last.unwrap_or(ResolveFailure::Unauthorized {
            status: 401,
            detail: "unauthorized".into(),
        }))
    }

    /// Copies `origin` (a tag or digest) into `mirror` (the same image under
    /// the mirror's name), or joins the copy under way, and waits for it
    /// until `wait_until`; the copy goes on after that.
    pub async fn copy(
        &self,
        origin: &Reference,
        mirror: &Reference,
        platform: Option<&Platform>,
        wait_until: Instant,
    ) -> CopyAnswer {
        let key = format!("{origin} {mirror}");
        let remember = self.inner.cache_config.lifetime(Freshness::Definite);
        let (started, mut done) = {
            let mut jobs = self
                .inner
                .copies
                .jobs
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            // A copy whose task ended without an answer (it panicked) is
            // forgotten, so the next admission starts a new one.
            let closed = |j: &Job| j.done.has_changed().is_err();
            jobs.retain(|_, j| {
                // Cloned first: the watch's lock is not held while asking it more.
                let finished = j.done.borrow().clone();
                match finished {
                    None => !closed(j),
                    Some(f) => {
                        let keep = if f.result.is_ok() {
                            remember
                        } else {
                            REMEMBER_FAILURE
                        };
                        f.at.elapsed() < keep
                    }
                }
            });
            match jobs.get(&key) {
                Some(j) => (j.started, j.done.clone()),
                None if jobs.len() >= MAX_RUNNING => {
                    return CopyAnswer::Failed(ResolveFailure::Unreachable {
                        detail: format!(
                            "{MAX_RUNNING} copies are under way; this one is left for a later admission"
                        ),
                    });
                }
                None => {
                    let (tx, rx) = watch::channel(None);
                    let started = Instant::now();
                    jobs.insert(
                        key,
                        Job {
                            started,
                            done: rx.clone(),
                        },
                    );
                    let reg = self.clone();
                    let (o, m) = (origin.clone(), mirror.clone());
                    tokio::spawn(async move {
                        let result = reg.run_copy(&o, &m).await;
                        let _ = tx.send(Some(Arc::new(Finished {
                            result,
                            at: Instant::now(),
                        })));
                    });
                    (started, rx)
                }
            }
        };
        let waited =
            tokio::time::timeout_at(wait_until.into(), done.wait_for(Option::is_some)).await;
        let finished = match waited {
            Ok(Ok(f)) => f.clone(),
            Ok(Err(_)) => {
                return CopyAnswer::Failed(ResolveFailure::Unreachable {
                    detail: "the copy ended without an answer".into(),
                });
            }
            Err(_) => return CopyAnswer::Underway(started.elapsed()),
        };
        let Some(f) = finished else {
            return CopyAnswer::Underway(started.elapsed());
        };
        match &f.result {
            Err(e) => CopyAnswer::Failed(e.clone()),
            Ok((digest, body)) => match platform {
                None => CopyAnswer::Copied(digest.clone()),
                Some(p) => match crate::response::pick_platform(body, p, digest.clone()) {
                    Ok(d) => CopyAnswer::Copied(d),
                    Err(e) => CopyAnswer::Failed(e),
                },
            },
        }
    }

    /// One copy, start to end, with its log line and metrics.
    async fn run_copy(
        &self,
        origin: &Reference,
        mirror: &Reference,
    ) -> Result<(Digest, Vec<u8>), ResolveFailure> {
        let observer = self.inner.observer.clone();
        observer.copy_started();
        let started = Instant::now();
        let moved = Arc::new(AtomicU64::new(0));
        let result = self.walk(origin, mirror, moved.clone()).await;
        let bytes = moved.load(Ordering::Relaxed);
        let elapsed = started.elapsed();
        observer.copy_finished(result.is_ok(), bytes, elapsed);
        match &result {
            Ok((d, _)) => tracing::info!(
                origin = %origin, mirror = %mirror, digest = %d, bytes,
                seconds = elapsed.as_secs_f64(), "copied into the mirror"
            ),
            Err(e) => tracing::warn!(
                origin = %origin, mirror = %mirror, bytes, error = %e,
                "copy into the mirror failed"
            ),
        }
        result
    }

    async fn walk(
        &self,
        origin: &Reference,
        mirror: &Reference,
        moved: Arc<AtomicU64>,
    ) -> Result<(Digest, Vec<u8>), ResolveFailure> {
        let reference = origin
            .digest()
            .map(|d| d.as_str().to_owned())
            .unwrap_or_else(|| origin.tag_or_latest().to_owned());
        let origin_credential = self.pull_credential(origin, &reference).await?;
        let same_host = origin.domain() == mirror.domain();
        let mut mirror_scope = format!("repository:{}:pull,push", mirror.path());
        if same_host {
            mirror_scope.push_str(&format!(" repository:{}:pull", origin.path()));
        }
        let limits = self.inner.copies.limits.clone();
        let walk = Walk {
            origin: Repo::new(
                &self.inner,
                origin.clone(),
                origin_credential,
                format!("repository:{}:pull", origin.path()),
            ),
            mirror: Repo::new(
                &self.inner,
                mirror.clone(),
                self.push_credential(mirror).await?,
                mirror_scope,
            ),
            mount_from: same_host.then(|| origin.path().to_owned()),
            limits: &limits,
            moved,
        };
        // Pinned by digest with a tag (`name:tag@sha256:…`, what an
        // admission's copy reads: the digest it verified): that digest is
        // copied, and tagged in the mirror.
        let tag = origin.digest().and(origin.tag());
        let copied = walk.image(&reference, tag).await?;
        Ok((copied.digest, copied.body))
    }

    /// The first of sigil's own credentials for the origin that may read
    /// the image (the policy's `auth`, the keychain, anonymous).
    async fn pull_credential(
        &self,
        origin: &Reference,
        reference: &str,
    ) -> Result<Option<Credential>, ResolveFailure> {
        let own = PullCredentials::default();
        let candidates = self.candidates(origin, &own).await;
        let mut last = None;
        for Candidate { credential, .. } in candidates.list {
            let probe = Repo::new(
                &self.inner,
                origin.clone(),
                credential.clone(),
                format!("repository:{}:pull", origin.path()),
            );
            match probe.manifest(reference).await {
                Ok(Some(_)) => return Ok(credential),
                Ok(None) => {
                    return Err(ResolveFailure::NotFound {
                        detail: format!("the origin has no {origin}"),
                    });
                }
                Err(e @ ResolveFailure::Unauthorized { .. }) => last = Some(e),
                Err(e) => return Err(e),
            }
        }
        Err(last.unwrap_or(ResolveFailure::Unauthorized {
            status: 401,
            detail: format!("sigil has no credential that may read {origin}"),
        }))
    }

    /// What the mirror is written with: `pushAuth`, else `auth`, else the
    /// keychain's credential for its host, else anonymous.
    async fn push_credential(
        &self,
        mirror: &Reference,
    ) -> Result<Option<Credential>, ResolveFailure> {
        let host = mirror.domain();
        match self.inner.hosts.get(host).push_creds.load(host) {
            Ok(Some(c)) => Ok(Some(c)),
            Ok(None) => Ok(self
                .inner
                .keychain
                .candidates(mirror, &PullCredentials::default(), Ok(None))
                .await
                .list
                .into_iter()
                .find_map(|c| c.credential)),
            Err(e) => Err(ResolveFailure::Config {
                detail: format!("push credentials for {host}: {e}"),
            }),
        }
    }
}
