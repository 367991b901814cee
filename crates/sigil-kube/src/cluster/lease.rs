//! Leader election on a `coordination.k8s.io/v1` Lease, with client-go's
//! semantics, so one replica at a time does cluster-wide work (the audit).
//!
//! A candidate takes the Lease when it is free (no holder, or released) or
//! expired — judged by *local* time since this replica last saw the record
//! change, never by comparing clocks across nodes — and renews it every
//! retry period; every write carries the resourceVersion it read, so two
//! candidates racing get one success and one 409 Conflict. A leader that
//! cannot renew within the renew deadline steps down before the Lease can
//! expire under it. On drain the leader releases the Lease (empty holder,
//! 1 s duration) so another replica takes over at its next retry instead of
//! after a full lease duration. It does not decide what leaders do.

use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::api::{Api, PostParams};
use tokio::sync::watch;

use crate::error::{Context as _, Result};

/// Where the Lease is and how it is held.
#[derive(Debug, Clone)]
pub struct LeaseSettings {
    /// Namespace (sigil's own).
    pub namespace: String,
    /// Lease name.
    pub name: String,
    /// This replica's identity (pod name + a random suffix).
    pub identity: String,
    /// `leaseDurationSeconds`: how long a silent holder keeps it.
    pub duration: Duration,
}

impl LeaseSettings {
    /// How often candidates try and the leader renews (client-go: 2 s of 15 s).
    pub fn retry(&self) -> Duration {
        (self.duration / 5).max(Duration::from_millis(200))
    }

    /// A leader that has not renewed for this long steps down (client-go: 10 s of 15 s).
    pub fn renew_deadline(&self) -> Duration {
        self.duration * 2 / 3
    }
}

/// A running election: whether this replica leads now, and how to stop.
#[derive(Debug)]
pub struct Election {
    /// `true` while this replica holds the Lease.
    pub leading: watch::Receiver<bool>,
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl Election {
    /// Stops campaigning and releases the Lease if held (bounded by one retry).
    pub async fn release(self) {
        let _ = self.stop.send(true);
        let _ = tokio::time::timeout(Duration::from_secs(5), self.task).await;
    }
}

/// Starts campaigning for the Lease.
pub fn spawn(client: Client, s: LeaseSettings) -> Election {
    let (leading_tx, leading) = watch::channel(false);
    let (stop, mut stop_rx) = watch::channel(false);
    let task = tokio::spawn(async move {
        let api: Api<Lease> = Api::namespaced(client, &s.namespace);
        let mut candidate = Candidate::default();
        let mut last_renew: Option<Instant> = None;
        let mut last_error: Option<String> = None;
        loop {
            let round = candidate.try_acquire_or_renew(&api, &s).await;
            if round.is_ok()
                && let Some(was) = last_error.take()
            {
                tracing::info!(lease = %s.name, previously = %was, "lease updates work again");
            }
            match round {
                Ok(true) => {
                    if !*leading_tx.borrow() {
                        tracing::info!(lease = %s.name, identity = %s.identity, "became the leader");
                    }
                    last_renew = Some(Instant::now());
                    let _ = leading_tx.send(true);
                }
                Ok(false) => {
                    if *leading_tx.borrow() {
                        tracing::info!(lease = %s.name, holder = ?candidate.holder(), "lost the lease to another replica");
                    }
                    last_renew = None;
                    let _ = leading_tx.send(false);
                }
                Err(e) => {
                    // Said once per cause, not on every retry.
                    let why = failure_message(&e, &s);
                    if last_error.as_deref() != Some(why.as_str()) {
                        tracing::warn!(lease = %s.name, error = %why, "lease update failed; retrying quietly until this changes");
                        last_error = Some(why);
                    }
                    if last_renew.is_some_and(|t| t.elapsed() > s.renew_deadline()) {
                        tracing::warn!(lease = %s.name, "could not renew within the renew deadline; stepping down");
                        last_renew = None;
                        let _ = leading_tx.send(false);
                    }
                }
            }
            tokio::select! {
                _ = tokio::time::sleep(s.retry()) => {}
                _ = stop_rx.changed() => break,
            }
        }
        if *leading_tx.borrow() {
            let _ = leading_tx.send(false);
            match candidate.release(&api, &s).await {
                Ok(()) => tracing::info!(lease = %s.name, "lease released"),
                Err(e) => {
                    tracing::warn!(lease = %s.name, error = %e, "releasing the lease failed; another replica takes over when it expires")
                }
            }
        }
    });
    Election {
        leading,
        stop,
        task,
    }
}

/// What a failed round logs: concise, and for a namespace that does not
/// exist (sigil run outside its cluster namespace) the fix.
fn failure_message(e: &crate::error::Error, s: &LeaseSettings) -> String {
    match e.missing_namespace() {
        Some(ns) => format!(
            "namespace {ns} does not exist: create namespace {ns} or pass --namespace (the Lease {} lives in sigil's own namespace)",
            s.name
        ),
        None => e.brief(),
    }
}

/// Stops a leader's work on drain and waits, bounded, until its Lease is
/// released, so another replica takes over at its next try instead of after
/// a full lease duration.
#[derive(Debug)]
pub struct Shutdown {
    stop: watch::Sender<bool>,
    done: tokio::sync::oneshot::Receiver<()>,
}

/// The working side of a [`Shutdown`].
#[derive(Debug)]
pub struct Stopper {
    stop: watch::Receiver<bool>,
    done: tokio::sync::oneshot::Sender<()>,
}

/// A [`Shutdown`] for the drain and its [`Stopper`] for the task.
pub fn shutdown_pair() -> (Shutdown, Stopper) {
    let (stop, stop_rx) = watch::channel(false);
    let (done_tx, done) = tokio::sync::oneshot::channel();
    (
        Shutdown { stop, done },
        Stopper {
            stop: stop_rx,
            done: done_tx,
        },
    )
}

impl Shutdown {
    /// Stops the work and waits for the Lease's release (at most 5 s: a
    /// stuck API server cannot hold up the drain).
    pub async fn shutdown(self) {
        let _ = self.stop.send(true);
        let _ = tokio::time::timeout(Duration::from_secs(5), self.done).await;
    }
}

impl Stopper {
    /// Waits for `ready`, campaigns for the Lease, and runs `work` (given
    /// whether this replica leads) until the [`Shutdown`]; then `after`,
    /// then releases the Lease.
    pub async fn lead<W, F>(
        mut self,
        client: Client,
        settings: LeaseSettings,
        ready: impl std::future::Future<Output = ()>,
        work: W,
        after: impl FnOnce(),
    ) where
        W: FnOnce(watch::Receiver<bool>) -> F,
        F: std::future::Future<Output = ()>,
    {
        tokio::select! {
            () = ready => {}
            _ = self.stop.wait_for(|s| *s) => {
                let _ = self.done.send(());
                return;
            }
        }
        let election = spawn(client, settings);
        tokio::select! {
            () = work(election.leading.clone()) => {}
            _ = self.stop.wait_for(|s| *s) => {}
        }
        after();
        election.release().await;
        let _ = self.done.send(());
    }
}

/// What this candidate last saw, and when (local monotonic time).
#[derive(Debug, Default)]
struct Candidate {
    observed: Option<(LeaseSpec, Instant)>,
}

fn now() -> MicroTime {
    MicroTime(Timestamp::now())
}

impl Candidate {
    fn holder(&self) -> Option<String> {
        self.observed
            .as_ref()
            .and_then(|(s, _)| s.holder_identity.clone())
    }

    /// One round: `Ok(true)` if this replica holds the Lease afterwards.
    async fn try_acquire_or_renew(&mut self, api: &Api<Lease>, s: &LeaseSettings) -> Result<bool> {
        let duration = i32::try_from(s.duration.as_secs().max(1)).unwrap_or(i32::MAX);
        let Some(current) = api
            .get_opt(&s.name)
            .await
            .with_context(|| format!("reading Lease {}/{}", s.namespace, s.name))?
        else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(s.name.clone()),
                    namespace: Some(s.namespace.clone()),
                    labels: Some(
                        [(
                            super::MANAGED_BY.0.to_owned(),
                            super::MANAGED_BY.1.to_owned(),
                        )]
                        .into(),
                    ),
                    ..ObjectMeta::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(s.identity.clone()),
                    lease_duration_seconds: Some(duration),
                    acquire_time: Some(now()),
                    renew_time: Some(now()),
                    lease_transitions: Some(0),
                    ..LeaseSpec::default()
                }),
            };
            return match api.create(&PostParams::default(), &lease).await {
                Ok(l) => {
                    self.observe(l.spec.unwrap_or_default());
                    Ok(true)
                }
                Err(kube::Error::Api(e)) if e.is_already_exists() => Ok(false),
                Err(e) => {
                    Err(e).with_context(|| format!("creating Lease {}/{}", s.namespace, s.name))
                }
            };
        };
        let spec = current.spec.clone().unwrap_or_default();
        self.observe(spec.clone());
        let holder = spec.holder_identity.clone().unwrap_or_default();
        let mine = holder == s.identity;
        let held_for = Duration::from_secs(
            u64::try_from(spec.lease_duration_seconds.unwrap_or(duration)).unwrap_or(0),
        );
        let expired = self
            .observed
            .as_ref()
            .is_some_and(|(_, at)| at.elapsed() >= held_for);
        if !holder.is_empty() && !mine && !expired {
            return Ok(false);
        }
        let mut next = current.clone();
        let transitions = spec.lease_transitions.unwrap_or(0);
        next.spec = Some(LeaseSpec {
            holder_identity: Some(s.identity.clone()),
            lease_duration_seconds: Some(duration),
            renew_time: Some(now()),
            acquire_time: if mine {
                spec.acquire_time.clone()
            } else {
                Some(now())
            },
            lease_transitions: Some(if mine { transitions } else { transitions + 1 }),
            ..spec
        });
        match api.replace(&s.name, &PostParams::default(), &next).await {
            Ok(l) => {
                self.observe(l.spec.unwrap_or_default());
                Ok(true)
            }
            // Someone else wrote first: they hold it (or renewed it).
            Err(kube::Error::Api(e)) if e.is_conflict() => Ok(false),
            Err(e) => Err(e).with_context(|| format!("updating Lease {}/{}", s.namespace, s.name)),
        }
    }

    /// Gives the Lease up: no holder, so the next candidate takes it at once.
    async fn release(&mut self, api: &Api<Lease>, s: &LeaseSettings) -> Result<()> {
        let current = api
            .get(&s.name)
            .await
            .with_context(|| format!("reading Lease {}/{}", s.namespace, s.name))?;
        let spec = current.spec.clone().unwrap_or_default();
        if spec.holder_identity.as_deref() != Some(s.identity.as_str()) {
            return Ok(());
        }
        let mut next = current;
        next.spec = Some(LeaseSpec {
            holder_identity: None,
            lease_duration_seconds: Some(1),
            renew_time: Some(now()),
            acquire_time: Some(now()),
            ..spec
        });
        api.replace(&s.name, &PostParams::default(), &next)
            .await
            .with_context(|| format!("releasing Lease {}/{}", s.namespace, s.name))?;
        Ok(())
    }

    /// Restarts the expiry clock when the record changed since last seen.
    fn observe(&mut self, spec: LeaseSpec) {
        let changed = self.observed.as_ref().is_none_or(|(seen, _)| *seen != spec);
        if changed {
            self.observed = Some((spec, Instant::now()));
        }
    }
}

/// An identity unique to this process: the pod name (`HOSTNAME`) and a
/// random suffix, so a restarted container never mistakes the old one's Lease
/// for its own.
pub fn identity() -> String {
    let host = std::env::var("POD_NAME")
        .or_else(|_| std::env::var("HOSTNAME"))
        .unwrap_or_else(|_| "sigil".into());
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .subsec_nanos();
    let suffix = format!("{:x}{nanos:08x}", std::process::id());
    format!("{host}_{suffix}")
}
