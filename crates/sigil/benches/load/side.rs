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

/// Which objects a round's requests carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Objects {
    /// The same object every time, as a ReplicaSet's Pods reach the webhook
    /// (sigil reuses the answer: `admission::reuse`).
    Same,
    /// Every request its own object (its `generateName` numbered), so each
    /// is decided: what a stream of different workloads costs.
    Distinct,
}

/// One round: `n` requests of `body` at `concurrency`, with the server's CPU.
/// Each request carries its own uid, as the API server's do.
pub async fn round(
    t: &Target,
    concurrency: usize,
    n: usize,
    body: &Arc<Vec<u8>>,
    objects: Objects,
) -> Round {
    let pool = uids(body, 256);
    let name = match objects {
        Objects::Same => None,
        Objects::Distinct => Some(sigil_testkit::review::numberable(body).1),
    };
    let cpu0 = cpu_total(t.pid);
    let stats = drive(t.addr, t.tls.clone(), concurrency, n, move |i| {
        let mut b = pool[i % pool.len()].clone();
        if let Some(end) = name {
            sigil_testkit::review::number_object(&mut b, end, i as u32);
        }
        b
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
    objects: Objects,
    key: fn(&Round) -> Duration,
) -> [Round; 2] {
    let mut seen: [Vec<Round>; 2] = [Vec::new(), Vec::new()];
    for _ in 0..rounds {
        for (t, out) in targets.iter().zip(seen.iter_mut()) {
            out.push(round(t, concurrency, n, body, objects).await);
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

/// While iterating on the hot path (`BENCH_ONLY_CACHED`): the side-by-side
/// rows, a rollout's Pods (the same object) then each decided.
pub fn quick_rows(c: usize, sides: [(&Round, &Round); 2]) {
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    for (what, (s, e)) in ["same object", "distinct objects"].iter().zip(sides) {
        println!(
            "cached, {what}, {c} connections: sigil {:.0} req/s, {:.1} µs CPU/req; echo {:.0} req/s, {:.1} µs; ratio {:.1} %",
            s.stats.rps,
            us(s.cpu),
            e.stats.rps,
            us(e.cpu),
            100.0 * s.stats.rps / e.stats.rps,
        );
    }
}

/// The hot path's figures against the targets: judged on a
/// rollout's Pods (the same object, its answer reused), reported for Pods
/// that are each decided.
pub fn target_rows(c: usize, sides: [(&Round, &Round); 2], met: &dyn Fn(bool) -> &'static str) {
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    let names = [("a rollout's Pods (reused)", true), ("each decided", false)];
    for ((what, judged), (s, e)) in names.into_iter().zip(sides) {
        let ratio = s.stats.rps / e.stats.rps;
        // A smoke round is below the CPU clock's resolution: no ratio then.
        let cpu = s.cpu.as_secs_f64() / e.cpu.as_secs_f64();
        let times = if cpu.is_finite() {
            format!("{cpu:.2}×")
        } else {
            "–".to_owned()
        };
        let target = |t: &str, ok: bool| {
            if judged {
                format!("{t}: {}", met(ok))
            } else {
                "reported".to_owned()
            }
        };
        println!(
            "| throughput vs echo, {c} connections, {what} | {:.1} % ({:.0} vs {:.0} req/s) | {} |",
            100.0 * ratio,
            s.stats.rps,
            e.stats.rps,
            target("≥ 60 %", ratio >= 0.6)
        );
        println!(
            "| server CPU per request, {c} connections, {what}: sigil vs echo | {:.1} µs vs {:.1} µs ({times}) | {} |",
            us(s.cpu),
            us(e.cpu),
            target("≤ 2× echo", cpu <= 2.0)
        );
    }
}
