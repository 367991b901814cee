//! Resolving a mirrored image when its mirror fails over: the mirrors in
//! order, then (with `fallback: origin`) the origin, and with
//! `requireSameDigest` every mirror's answer checked against the origin's.
//!
//! Owns the order and the time each try gets — a mirror with more
//! candidates after it gets a share of what is left of the deadline, so one
//! dark mirror cannot spend a whole admission (and after three failures its
//! circuit breaker in `sigil-registry` makes it fail at once) — and the
//! words when nothing could serve the image. With `copy: true`, an image the
//! first mirror lacks (or serves stale) is copied into it from the origin
//! ([`MirrorCopier`]) and waited for while a share of the deadline allows —
//! only when the [`CopyGate`] holds: not a dry run, the admitting workload
//! can pull the origin with its own credentials, and the origin's digest
//! passes the image's verification there (a shared mirror never receives
//! what its reader could not have pulled, nor what would be denied); the
//! copy itself is `sigil-registry`'s. What a plan means, and which
//! mirrors exist, is sigil-core's ([`sigil_core::policy::Failover`]).

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::FutureExt as _;
use futures_util::future::BoxFuture;
use sigil_core::policy::{Failover, FellBack};
use sigil_core::{Digest, DigestResolver, Platform, PullCredentials, Reference, ResolveFailure};
use sigil_registry::copy::CopyAnswer;

/// Where a lookup was answered, and with what.
#[derive(Debug)]
pub struct Resolved {
    /// The reference that answered (the planned target when none did).
    pub by: Reference,
    /// The answer.
    pub result: Result<Digest, ResolveFailure>,
    /// Set when the origin answered because no mirror could.
    pub fallback: Option<Arc<FellBack>>,
}

/// The same kind of failure with `detail` in place of its own words (or
/// `Unreachable` for kinds without words).
fn with_detail(f: &ResolveFailure, detail: String) -> ResolveFailure {
    match f {
        ResolveFailure::NotFound { .. } => ResolveFailure::NotFound { detail },
        ResolveFailure::BadResponse { .. } => ResolveFailure::BadResponse { detail },
        ResolveFailure::Status { status, .. } => ResolveFailure::Status {
            status: *status,
            detail,
        },
        _ => ResolveFailure::Unreachable { detail },
    }
}

/// Copies an image from its origin into a mirror (the registry client).
pub trait MirrorCopier: Send + Sync {
    /// Resolves `origin` with the workload's own credentials only (its pull
    /// secrets, then anonymous; never sigil's): what the workload could pull.
    fn probe<'a>(
        &'a self,
        origin: &'a Reference,
        platform: Option<&'a Platform>,
        workload: &'a PullCredentials,
        deadline: Instant,
    ) -> BoxFuture<'a, Result<Digest, ResolveFailure>>;

    /// Starts or joins the copy of `origin` into `mirror`; waits until
    /// `wait_until`, after which the copy goes on in the background.
    fn copy<'a>(
        &'a self,
        origin: &'a Reference,
        mirror: &'a Reference,
        platform: Option<&'a Platform>,
        wait_until: Instant,
    ) -> BoxFuture<'a, CopyAnswer>;
}

impl MirrorCopier for sigil_registry::Registry {
    fn probe<'a>(
        &'a self,
        origin: &'a Reference,
        platform: Option<&'a Platform>,
        workload: &'a PullCredentials,
        deadline: Instant,
    ) -> BoxFuture<'a, Result<Digest, ResolveFailure>> {
        Box::pin(self.resolve_as_workload(origin, platform, workload, deadline))
    }

    fn copy<'a>(
        &'a self,
        origin: &'a Reference,
        mirror: &'a Reference,
        platform: Option<&'a Platform>,
        wait_until: Instant,
    ) -> BoxFuture<'a, CopyAnswer> {
        Box::pin(sigil_registry::Registry::copy(
            self, origin, mirror, platform, wait_until,
        ))
    }
}

/// Verifies `origin@digest` under every requirement the image has in this
/// admission: `Err(why)` when it does not pass.
pub type Vet<'a> =
    dyn Fn(Reference, Digest) -> BoxFuture<'a, Result<(), String>> + Send + Sync + 'a;

/// What must hold before an admission writes into a shared mirror.
pub struct CopyGate<'a> {
    /// The review is a dry run: it has no side effects (the webhook is
    /// registered `sideEffects: NoneOnDryRun`).
    pub dry_run: bool,
    /// The admitting workload's own pull credentials.
    pub workload: &'a PullCredentials,
    /// The image's verification, run on the origin's digest.
    pub vet: &'a Vet<'a>,
}

impl std::fmt::Debug for CopyGate<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CopyGate")
            .field("dry_run", &self.dry_run)
            .field("workload", &self.workload.named)
            .finish_non_exhaustive()
    }
}

/// Whether the copy of `origin` may run, and what to copy: the origin
/// pinned to the digest that was checked (so a tag moved meanwhile is not
/// what lands in the mirror).
async fn vetted(
    copier: &dyn MirrorCopier,
    gate: &CopyGate<'_>,
    origin: &Reference,
    platform: Option<&Platform>,
    deadline: Instant,
) -> Result<Reference, String> {
    if gate.dry_run {
        return Err("a dry run has no side effects".into());
    }
    let cannot_pull = |e: ResolveFailure| {
        format!(
            "the workload's own pull secrets cannot pull {origin} ({e}); sigil copies into a shared mirror only what the admitting workload could pull itself"
        )
    };
    // The index (or manifest) that will be copied, and the digest that will
    // run, both as the workload would see them.
    let copied = copier
        .probe(origin, None, gate.workload, deadline)
        .await
        .map_err(cannot_pull)?;
    let running = match platform {
        None => copied.clone(),
        Some(p) => copier
            .probe(origin, Some(p), gate.workload, deadline)
            .await
            .map_err(cannot_pull)?,
    };
    (gate.vet)(origin.clone(), running)
        .await
        .map_err(|why| format!("the origin's digest does not pass verification: {why}"))?;
    Ok(origin.pinned(copied))
}

/// The share of what is left of the deadline an admission waits for a copy:
/// the rest stays for verifying the copied image, or falling back.
fn copy_wait(now: Instant, deadline: Instant) -> Instant {
    now + deadline.saturating_duration_since(now).mul_f32(0.6)
}

/// Resolves `primary` (the first mirror's image of `origin`) under `f`.
#[allow(clippy::too_many_arguments)]
pub async fn resolve<R: DigestResolver>(
    resolver: &R,
    copier: Option<(&dyn MirrorCopier, &CopyGate<'_>)>,
    primary: &Reference,
    (f, origin_image): (&Failover, &Reference),
    platform: Option<&Platform>,
    creds: &(dyn Fn(&Reference) -> PullCredentials + Sync),
    deadline: Instant,
) -> Resolved {
    // The origin is asked at once, alongside the mirrors, when its answer
    // may be needed: to compare digests, or to fall back on.
    let at_origin = f.resolves_origin().then_some(origin_image);
    let origin_creds = at_origin.map(creds);
    let origin = match (at_origin, &origin_creds) {
        (Some(o), Some(c)) => Some(resolver.resolve(o, platform, c, deadline).boxed().shared()),
        _ => None,
    };
    // The further mirrors' images are made only if the first fails.
    let mirrors = std::iter::once(std::borrow::Cow::Borrowed(primary))
        .chain(f.alternates_of(origin_image).map(std::borrow::Cow::Owned));
    let count = 1 + f.alternates.len();
    let mut failures: Vec<(String, ResolveFailure)> = Vec::new();
    let tries_left = |i: usize| count.saturating_sub(i) as u32 + u32::from(f.fallback);
    for (i, m) in mirrors.enumerate() {
        let now = Instant::now();
        let left = deadline.saturating_duration_since(now);
        // A share of what is left, so the next candidates still get a try.
        let until = now + left / tries_left(i).max(1);
        let c = creds(&m);
        let answer = resolver
            .resolve(&m, platform, &c, until.min(deadline))
            .await;
        let digest = match answer {
            Ok(d) => d,
            Err(e) => {
                failures.push((m.to_string(), e));
                continue;
            }
        };
        if f.require_same_digest
            && let Some(o) = &origin
            && let Ok(want) = o.clone().await
            && want != digest
        {
            failures.push((
                m.to_string(),
                ResolveFailure::BadResponse {
                    detail: format!(
                        "the mirror serves {digest}, the origin {} serves {want}: a stale or tampered mirror (requireSameDigest)",
                        origin_image
                    ),
                },
            ));
            continue;
        }
        return Resolved {
            by: m.into_owned(),
            result: Ok(digest),
            fallback: None,
        };
    }
    // The first mirror lacks the image (or serves another digest): copy it
    // there from the origin, and use it if the copy is done in time.
    if f.copy
        && let Some(o) = at_origin
        && let Some((_, first)) = failures.first_mut()
        && matches!(
            first,
            ResolveFailure::NotFound { .. } | ResolveFailure::BadResponse { .. }
        )
    {
        // The mirror's own words, without the kind's prefix (it is kept).
        let said = match &*first {
            ResolveFailure::NotFound { detail } | ResolveFailure::BadResponse { detail } => {
                detail.clone()
            }
            other => other.to_string(),
        };
        match copier {
            None => {
                *first = with_detail(
                    first,
                    format!(
                        "{said}; copy on admission runs only in the webhook (sigil mirror {o} copies it now)"
                    ),
                );
            }
            Some((c, gate)) => match vetted(c, gate, o, platform, deadline).await {
                Err(why) => {
                    *first =
                        with_detail(first, format!("{said}; not copied from the origin: {why}"));
                }
                Ok(o) => match c
                    .copy(&o, primary, platform, copy_wait(Instant::now(), deadline))
                    .await
                {
                    CopyAnswer::Copied(d) => {
                        return Resolved {
                            by: primary.clone(),
                            result: Ok(d),
                            fallback: None,
                        };
                    }
                    CopyAnswer::Underway(since) => {
                        *first = ResolveFailure::NotFound {
                            detail: format!(
                                "not in the mirror yet: a copy from the origin is under way (for {}); admissions find it there once it is done",
                                round(since)
                            ),
                        };
                    }
                    CopyAnswer::Failed(e) => {
                        *first = with_detail(
                            first,
                            format!("{said}; the copy from the origin failed: {e}"),
                        );
                    }
                },
            },
        }
    }
    let why = failures
        .iter()
        .map(|(m, e)| format!("{m}: {e}"))
        .collect::<Vec<_>>()
        .join("; ");
    if f.fallback
        && let (Some(o), Some(at)) = (origin, at_origin)
    {
        match o.await {
            Ok(d) => {
                return Resolved {
                    by: at.clone(),
                    result: Ok(d),
                    fallback: Some(Arc::new(FellBack {
                        from: f.from.clone(),
                        why: format!("no mirror could serve it ({why}); pinned at the origin"),
                    })),
                };
            }
            Err(e) => failures.push((format!("{at} (origin)"), e)),
        }
    }
    let first = failures
        .first()
        .map(|(_, e)| e.clone())
        .unwrap_or(ResolveFailure::Unreachable {
            detail: String::new(),
        });
    let result = if failures.len() == 1 {
        Err(first)
    } else {
        let all = failures
            .iter()
            .map(|(m, e)| format!("{m}: {e}"))
            .collect::<Vec<_>>()
            .join("; ");
        let same_kind = failures.iter().all(|(_, e)| e.kind() == first.kind());
        Err(if same_kind {
            with_detail(&first, format!("no mirror could serve it: {all}"))
        } else {
            ResolveFailure::Unreachable {
                detail: format!("no mirror could serve it: {all}"),
            }
        })
    };
    Resolved {
        by: primary.clone(),
        result,
        fallback: None,
    }
}

/// A duration as people read it in a message (`1.2s`).
fn round(d: Duration) -> String {
    format!("{:.1}s", d.as_secs_f64())
}
