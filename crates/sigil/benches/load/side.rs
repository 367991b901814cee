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
/// Each request carries its own uid, as the API server's do.
pub async fn round(t: &Target, concurrency: usize, n: usize, body: &Arc<Vec<u8>>) -> Round {
    let pool = uids(body, 256);
    let cpu0 = cpu_total(t.pid);
    let stats = drive(t.addr, t.tls.clone(), concurrency, n, move |i| {
        pool[i % pool.len()].clone()
    })
    .await;
    let cpu = (cpu_total(t.pid).saturating_sub(cpu0)) / n.max(1) as u32;
    Round { stats, cpu }
}

/// `n` copies of a review `body`, each with its own request uid of the same
/// length (the uid's last eight characters numbered), so every request is
/// as long as the captured one; `body` alone when it names no uid.
fn uids(body: &[u8], n: usize) -> Vec<Vec<u8>> {
    let uid = serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v["request"]["uid"].as_str().map(str::to_owned))
        .filter(|u| u.len() >= 8);
    let Some(uid) = uid else {
        return vec![body.to_vec()];
    };
    let needle = format!("\"uid\":\"{uid}\"");
    let Some(at) = body
        .windows(needle.len())
        .position(|w| w == needle.as_bytes())
    else {
        return vec![body.to_vec()];
    };
    // The uid's last eight characters, inside the needle's closing quote.
    let end = at + needle.len() - 1;
    (0..n)
        .map(|k| {
            let mut b = body.to_vec();
            b[end - 8..end].copy_from_slice(format!("{k:08x}").as_bytes());
            b
        })
        .collect()
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
