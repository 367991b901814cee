//! Side by side: sigil and the echo server driven by the same client in
//! alternating rounds, so drift on a noisy machine hits both; each side's
//! median round is reported, with the server's CPU per request in that round.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use sigil_testkit::procstat::cpu_total;

use crate::client::{Stats, drive};

/// A running HTTPS server the client can drive.
pub struct Target {
    pub pid: u32,
    pub addr: SocketAddr,
    pub tls: Arc<rustls::ClientConfig>,
}

/// One round's figures.
pub struct Round {
    pub stats: Stats,
    /// Server CPU (user + system) per request in this round.
    pub cpu: Duration,
}

/// One round: `n` requests of `body` at `concurrency`, with the server's CPU.
pub async fn round(t: &Target, concurrency: usize, n: usize, body: &Arc<Vec<u8>>) -> Round {
    let b = body.clone();
    let cpu0 = cpu_total(t.pid);
    let stats = drive(t.addr, t.tls.clone(), concurrency, n, move |_| (*b).clone()).await;
    let cpu = (cpu_total(t.pid).saturating_sub(cpu0)) / n.max(1) as u32;
    Round { stats, cpu }
}

/// `rounds` alternating rounds of each target; per target, the round with
/// the median of `key` (throughput or p99).
pub async fn alternate(
    targets: [&Target; 2],
    rounds: usize,
    concurrency: usize,
    n: usize,
    body: &Arc<Vec<u8>>,
    key: fn(&Round) -> Duration,
) -> [Round; 2] {
    let mut seen: [Vec<Round>; 2] = [Vec::new(), Vec::new()];
    for _ in 0..rounds {
        for (t, out) in targets.iter().zip(seen.iter_mut()) {
            out.push(round(t, concurrency, n, body).await);
        }
    }
    seen.map(|mut v| {
        v.sort_by_key(key);
        v.swap_remove(v.len() / 2)
    })
}

/// Sort key: time per request (inverse throughput).
pub fn by_throughput(r: &Round) -> Duration {
    Duration::from_secs_f64(1.0 / r.stats.rps.max(1e-9))
}

/// Sort key: p99 latency.
pub fn by_p99(r: &Round) -> Duration {
    r.stats.p99
}
