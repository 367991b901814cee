//! What sigil learns once about each registry host, so that a burst of
//! never-seen images does not pay for it once per image: how the host
//! authenticates (the first request's anonymous answer: a 401's challenge,
//! or none) and whether it has the referrers API (the first referrers
//! request's answer). Each is one probe per host, single-flighted: callers
//! that arrive while it is in flight wait for its answer instead of asking
//! again. A failed probe is not remembered (the next caller asks); an
//! answer is kept for [`MEMORY`], since a registry may be reconfigured.
//!
//! Owns the memory, not the requests: the client (`client.rs`) probes and
//! acts on the answer (credentials sent with the first request instead of
//! after a 401; the tag schema instead of a referrers 404).

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::OnceCell;

/// How long an answer is kept.
pub const MEMORY: Duration = Duration::from_secs(600);

/// How a host asked to be authenticated, by its answer to an anonymous
/// request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scheme {
    /// It answered without asking (or said nothing usable): requests go
    /// anonymously, and a 401 is still answered as it comes.
    Open,
    /// `Basic`: credentials go with every request.
    Basic,
    /// `Bearer`: a token from `realm` for each repository's scope.
    Bearer {
        /// The token endpoint.
        realm: String,
        /// Its `service` parameter.
        service: Option<String>,
    },
}

/// One host's answer: when it was asked for, and the answer once known.
type Slot<T> = Arc<(Instant, OnceCell<T>)>;

/// One answer per host, learned once.
#[derive(Debug)]
pub struct Learned<T> {
    hosts: Mutex<HashMap<String, Slot<T>>>,
}

impl<T> Default for Learned<T> {
    fn default() -> Self {
        Learned {
            hosts: Mutex::default(),
        }
    }
}

impl<T: Clone> Learned<T> {
    /// What `host` answered, if known (and not older than [`MEMORY`]).
    pub fn known(&self, host: &str) -> Option<T> {
        let hosts = self.hosts.lock().unwrap_or_else(|e| e.into_inner());
        hosts
            .get(host)
            .filter(|c| c.0.elapsed() < MEMORY)
            .and_then(|c| c.1.get().cloned())
    }

    /// The host's answer: known, or learned by `probe` — run by the first
    /// caller only, the others waiting for it. `Err` (not remembered) when
    /// the probe failed; each waiter then gets the error of its own probe.
    pub async fn learn<E, F, Fut>(&self, host: &str, probe: F) -> Result<T, E>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        let cell = {
            let mut hosts = self.hosts.lock().unwrap_or_else(|e| e.into_inner());
            let stale = hosts.get(host).is_none_or(|c| c.0.elapsed() >= MEMORY);
            if stale {
                if hosts.len() >= 4096 {
                    hosts.retain(|_, c| c.0.elapsed() < MEMORY);
                }
                hosts.insert(host.to_owned(), Arc::new((Instant::now(), OnceCell::new())));
            }
            hosts
                .get(host)
                .cloned()
                .unwrap_or_else(|| Arc::new((Instant::now(), OnceCell::new())))
        };
        cell.1.get_or_try_init(probe).await.cloned()
    }

    /// Records what `host` answered without a probe of its own (a request
    /// that showed it), unless it is already known.
    pub fn record(&self, host: &str, answer: T) {
        let mut hosts = self.hosts.lock().unwrap_or_else(|e| e.into_inner());
        let c = hosts
            .entry(host.to_owned())
            .or_insert_with(|| Arc::new((Instant::now(), OnceCell::new())));
        let _ = c.1.set(answer);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    #[tokio::test]
    async fn callers_arriving_together_share_one_probe() {
        let learned: Arc<Learned<Scheme>> = Arc::default();
        let probes = Arc::new(AtomicU32::new(0));
        let calls = (0..50).map(|_| {
            let (learned, probes) = (learned.clone(), probes.clone());
            tokio::spawn(async move {
                learned
                    .learn("r.example.com", || async {
                        probes.fetch_add(1, Ordering::SeqCst);
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        Ok::<_, ()>(Scheme::Basic)
                    })
                    .await
            })
        });
        for c in futures_util::future::join_all(calls).await {
            assert_eq!(c.unwrap(), Ok(Scheme::Basic));
        }
        assert_eq!(probes.load(Ordering::SeqCst), 1);
        assert_eq!(learned.known("r.example.com"), Some(Scheme::Basic));
        assert_eq!(learned.known("other.example.com"), None);
    }

    #[tokio::test]
    async fn a_failed_probe_is_not_remembered() {
        let learned: Learned<bool> = Learned::default();
        let r = learned
            .learn("h", || async { Err::<bool, &str>("down") })
            .await;
        assert_eq!(r, Err("down"));
        assert_eq!(learned.known("h"), None);
        let r = learned
            .learn("h", || async { Ok::<bool, &str>(true) })
            .await;
        assert_eq!(r, Ok(true));
        learned.record("h", false);
        assert_eq!(learned.known("h"), Some(true), "a known answer stays");
    }
}
