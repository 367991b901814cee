//! What bounds the webhook port against a client that will not behave: the
//! number of open connections (a cap sized below the descriptor limit, with
//! accept back-pressure, so the admin port and the API clients always have
//! descriptors left), the memory request bodies may hold at once, and each
//! connection's clock (time to its first request, idle time between
//! requests). It also counts open connections so the drain can wait for
//! them. It does not parse HTTP or decide anything.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};

/// The limits of the webhook port (flags of `sigil serve`; docs/operations.md, "Hardening").
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Concurrent connections at most (lowered to fit the descriptor limit).
    pub max_connections: usize,
    /// Bytes of request bodies held in memory at once, over all requests.
    pub body_memory: usize,
    /// From accept to the first request's headers (TLS handshake and HTTP
    /// version detection included).
    pub first_request: Duration,
    /// A connection with no request in flight for this long is closed
    /// (HTTP/2 with GOAWAY).
    pub idle: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_connections: 1024,
            body_memory: 64 << 20,
            first_request: Duration::from_secs(10),
            idle: Duration::from_secs(120),
        }
    }
}

/// Descriptors kept free for everything but webhook connections: the admin
/// port, the Kubernetes and registry clients, files.
const RESERVED_FDS: usize = 128;

/// The soft `RLIMIT_NOFILE` of this process, from /proc (no libc call).
pub fn open_files_limit() -> Option<usize> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line.split_whitespace().nth(3)?.parse().ok()
}

impl Limits {
    /// The connection cap in force: the flag, lowered to leave
    /// [`RESERVED_FDS`] descriptors free under `fd_limit`.
    pub fn effective_connections(&self, fd_limit: Option<usize>) -> usize {
        let fit = fd_limit.map_or(usize::MAX, |n| n.saturating_sub(RESERVED_FDS).max(16));
        self.max_connections.min(fit).max(1)
    }
}

/// Open connections: the cap, the count the drain waits on, the body budget.
#[derive(Debug)]
pub(super) struct Conns {
    slots: Arc<Semaphore>,
    open: AtomicUsize,
    none_open: Notify,
    body: Arc<Semaphore>,
    pub(super) limits: Limits,
    pub(super) cap: usize,
}

impl Conns {
    pub(super) fn new(limits: Limits) -> Arc<Conns> {
        let cap = limits.effective_connections(open_files_limit());
        let body = limits.body_memory.min(Semaphore::MAX_PERMITS);
        Arc::new(Conns {
            slots: Arc::new(Semaphore::new(cap)),
            open: AtomicUsize::new(0),
            none_open: Notify::new(),
            body: Arc::new(Semaphore::new(body)),
            limits,
            cap,
        })
    }

    /// Waits for a free connection slot (accept back-pressure: while every
    /// slot is taken, the listener is not polled and the kernel queues).
    pub(super) async fn slot(self: &Arc<Self>) -> Slot {
        let permit = self
            .slots
            .clone()
            .acquire_owned()
            .await
            .expect("the connection semaphore is never closed");
        self.open.fetch_add(1, Ordering::AcqRel);
        Slot {
            conns: self.clone(),
            _permit: permit,
        }
    }

    /// Connections open now.
    pub(super) fn open(&self) -> usize {
        self.open.load(Ordering::Acquire)
    }

    /// Waits until no connection is open.
    pub(super) async fn all_closed(&self) {
        loop {
            let notified = self.none_open.notified();
            if self.open() == 0 {
                return;
            }
            notified.await;
        }
    }

    /// Reserves `n` bytes of the body budget until the returned permit drops
    /// (waits while other requests hold it; the caller bounds the wait).
    pub(super) async fn body_bytes(&self, n: usize) -> Option<OwnedSemaphorePermit> {
        let n = u32::try_from(n).ok()?;
        self.body.clone().acquire_many_owned(n).await.ok()
    }

    /// The whole budget, for a request larger than it could ever be given.
    pub(super) fn body_budget(&self) -> usize {
        self.limits.body_memory
    }
}

/// One open connection's share of the cap; counted until dropped.
#[derive(Debug)]
pub(super) struct Slot {
    conns: Arc<Conns>,
    _permit: OwnedSemaphorePermit,
}

impl Drop for Slot {
    fn drop(&mut self) {
        if self.conns.open.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.conns.none_open.notify_waiters();
        }
    }
}

/// One connection's clock: requests in flight and when it last did anything.
#[derive(Debug)]
pub(super) struct Activity {
    started: Instant,
    in_flight: AtomicUsize,
    requests: AtomicUsize,
    /// Milliseconds after `started` of the last request start or end.
    last_ms: AtomicU64,
}

impl Activity {
    pub(super) fn new() -> Arc<Activity> {
        Arc::new(Activity {
            started: Instant::now(),
            in_flight: AtomicUsize::new(0),
            requests: AtomicUsize::new(0),
            last_ms: AtomicU64::new(0),
        })
    }

    fn touch(&self) {
        let ms = u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last_ms.store(ms, Ordering::Release);
    }

    /// A request started; it ends when the guard drops.
    pub(super) fn begin(self: &Arc<Self>) -> InFlight {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        self.requests.fetch_add(1, Ordering::AcqRel);
        self.touch();
        InFlight(self.clone())
    }

    /// When this connection must be closed if nothing happens before: the
    /// first-request deadline until a request came, then the idle timeout
    /// after the last one; `None` while a request is in flight.
    pub(super) fn close_at(&self, limits: &Limits) -> Option<Instant> {
        if self.in_flight.load(Ordering::Acquire) > 0 {
            return None;
        }
        if self.requests.load(Ordering::Acquire) == 0 {
            return Some(self.started + limits.first_request);
        }
        let last = Duration::from_millis(self.last_ms.load(Ordering::Acquire));
        Some(self.started + last + limits.idle)
    }
}

/// A request in flight on a connection.
#[derive(Debug)]
pub(super) struct InFlight(Arc<Activity>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.touch();
        self.0.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_connection_cap_leaves_descriptors_for_everything_else() {
        let l = Limits::default();
        assert_eq!(l.effective_connections(None), 1024);
        assert_eq!(l.effective_connections(Some(1_048_576)), 1024);
        assert_eq!(l.effective_connections(Some(400)), 400 - RESERVED_FDS);
        assert_eq!(l.effective_connections(Some(50)), 16);
        assert!(open_files_limit().is_some_and(|n| n > 0));
    }

    #[test]
    fn a_connection_closes_after_its_first_request_deadline_then_when_idle() {
        let l = Limits {
            first_request: Duration::from_secs(10),
            idle: Duration::from_secs(60),
            ..Limits::default()
        };
        let a = Activity::new();
        assert_eq!(a.close_at(&l), Some(a.started + l.first_request));
        let req = a.begin();
        assert_eq!(a.close_at(&l), None, "never while a request is in flight");
        drop(req);
        let at = a.close_at(&l).unwrap();
        assert!(at >= a.started + l.idle && at <= Instant::now() + l.idle);
    }

    #[tokio::test]
    async fn slots_count_open_connections_and_release_on_drop() {
        let c = Conns::new(Limits {
            max_connections: 2,
            ..Limits::default()
        });
        let (a, b) = (c.slot().await, c.slot().await);
        assert_eq!(c.open(), 2);
        assert!(
            tokio::time::timeout(Duration::from_millis(50), c.slot())
                .await
                .is_err(),
            "a third waits"
        );
        drop(a);
        let waiter = tokio::spawn({
            let c = c.clone();
            async move { c.all_closed().await }
        });
        drop(b);
        tokio::time::timeout(Duration::from_secs(1), waiter)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(c.open(), 0);
    }
}
