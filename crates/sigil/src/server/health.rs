//! Readiness as a latch: Ready only once a real TLS client got a real answer
//! from our own webhook port, re-proved periodically, and never again once
//! the drain has started.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::metrics::Metrics;
use crate::tls::CertStore;

/// How often a ready server re-proves that its webhook port serves.
const SELF_CHECK_INTERVAL: Duration = Duration::from_secs(10);

/// Resolves once the server has been Ready (its self-check passed) at least once.
#[derive(Debug, Clone)]
pub struct ReadySignal(pub(super) tokio::sync::watch::Receiver<bool>);

impl ReadySignal {
    /// Waits for the first Ready.
    pub async fn wait(mut self) {
        let _ = self.0.wait_for(|r| *r).await;
    }
}

/// Readiness and drain state, shared by the listeners.
#[derive(Debug)]
pub struct Health {
    ready: AtomicBool,
    pub(super) ever_ready: tokio::sync::watch::Sender<bool>,
    draining: AtomicBool,
    reason: Mutex<String>,
    /// Must all be true before Ready (e.g. the pull-secret watches synced).
    gates: Vec<(String, tokio::sync::watch::Receiver<bool>)>,
}

impl Health {
    pub(super) fn new(gates: Vec<(String, tokio::sync::watch::Receiver<bool>)>) -> Self {
        Health {
            ready: AtomicBool::new(false),
            ever_ready: tokio::sync::watch::Sender::new(false),
            draining: AtomicBool::new(false),
            reason: Mutex::new("starting: self-check has not passed yet".into()),
            gates,
        }
    }

    /// The first gate that does not hold yet, if any.
    fn waiting_for(&self) -> Option<&str> {
        self.gates
            .iter()
            .find(|(_, rx)| !*rx.borrow())
            .map(|(why, _)| why.as_str())
    }

    fn set_ready(&self, metrics: &Metrics) {
        self.ready.store(true, Ordering::SeqCst);
        self.ever_ready.send_replace(true);
        metrics.ready.set(1);
    }

    fn set_not_ready(&self, why: &str, metrics: &Metrics) {
        self.ready.store(false, Ordering::SeqCst);
        *self.reason.lock().unwrap_or_else(|p| p.into_inner()) = why.to_owned();
        metrics.ready.set(0);
    }

    /// Marks the drain: not ready from now on, whatever the self-check says.
    pub(super) fn start_draining(&self, metrics: &Metrics) {
        self.draining.store(true, Ordering::SeqCst);
        self.set_not_ready("draining: shutting down", metrics);
        metrics.draining.set(1);
    }

    /// Whether the drain has started.
    pub(super) fn draining(&self) -> bool {
        self.draining.load(Ordering::SeqCst)
    }

    /// `Ok` when ready, else why not (the body of a 503 from `/readyz`).
    pub(super) fn readiness(&self) -> Result<(), String> {
        if self.draining() {
            return Err("draining: shutting down".into());
        }
        if self.ready.load(Ordering::SeqCst) {
            Ok(())
        } else {
            Err(self
                .reason
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone())
        }
    }
}

/// Proves the webhook port serves, until the drain starts: every 50 ms–1 s
/// until the first success, then every [`SELF_CHECK_INTERVAL`].
pub(super) async fn self_check_loop(
    addr: SocketAddr,
    store: Arc<CertStore>,
    health: Arc<Health>,
    metrics: Arc<Metrics>,
) {
    let check_addr = if addr.ip().is_unspecified() {
        SocketAddr::new(std::net::Ipv4Addr::LOCALHOST.into(), addr.port())
    } else {
        addr
    };
    let started = Instant::now();
    let mut failures = 0u32;
    let mut ready = false;
    loop {
        if health.draining() {
            return;
        }
        if let Some(why) = health.waiting_for() {
            health.set_not_ready(&format!("starting: {why}"), &metrics);
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        }
        match crate::selfcheck::check(check_addr, store.leaf().as_ref()).await {
            Ok(()) => {
                failures = 0;
                if !ready {
                    ready = true;
                    health.set_ready(&metrics);
                    tracing::info!(
                        elapsed_ms = started.elapsed().as_secs_f64() * 1000.0,
                        "self-check passed; ready"
                    );
                }
            }
            Err(e) => {
                failures += 1;
                // Before the first success every failure counts; once
                // serving, three in a row (not one slow answer under load).
                if !ready || failures >= 3 {
                    if ready || failures % 20 == 1 {
                        tracing::warn!(error = %e, "self-check failed; not ready");
                    }
                    ready = false;
                    health.set_not_ready(&format!("self-check failed: {e}"), &metrics);
                }
            }
        }
        let pause = if ready {
            SELF_CHECK_INTERVAL
        } else {
            Duration::from_millis(50 * u64::from(failures.clamp(1, 20)))
        };
        tokio::time::sleep(pause).await;
    }
}
