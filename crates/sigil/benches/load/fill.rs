//! The memory row: sigil's digest cache filled with `n` distinct answers
//! (tags seeded into the real registry's storage, resolved through
//! admission requests of 50-container Pods), then the cached load again
//! while the server's RSS is sampled.

use std::sync::Arc;
use std::time::Duration;

use sigil_testkit::procstat::rss_kib;
use sigil_testkit::registry::TestRegistry;
use sigil_testkit::review::pod_review_bytes;

use crate::client::drive;
use crate::side::{Round, Target, round};

/// Images per filling Pod.
const PER_POD: usize = 50;

pub struct Filled {
    /// `sigil_digest_cache_entries` after filling.
    pub entries: u64,
    /// Largest RSS seen during the cached load afterwards, in KiB.
    pub peak_kib: u64,
    /// RSS right after filling, in KiB.
    pub after_fill_kib: u64,
    pub load: Round,
}

pub async fn fill_and_load(
    registry: &TestRegistry,
    sigil: &Target,
    admin_port: u16,
    n: usize,
    concurrency: usize,
    requests: usize,
    body: &Arc<Vec<u8>>,
) -> Filled {
    let reg = registry.host();
    let digest = registry.push_image("bench/many", "base").await;
    registry.seed_tags("bench/many", &digest, (0..n).map(|i| format!("t{i}")));
    let pods = n.div_ceil(PER_POD);
    drive(sigil.addr, sigil.tls.clone(), concurrency, pods, move |p| {
        let refs: Vec<String> = (p * PER_POD..((p + 1) * PER_POD).min(n))
            .map(|i| format!("{reg}/bench/many:t{i}"))
            .collect();
        let refs: Vec<&str> = refs.iter().map(String::as_str).collect();
        pod_review_bytes(&refs)
    })
    .await;
    let entries = crate::metric_sum(admin_port, "sigil_digest_cache_entries").await;
    let after_fill_kib = rss_kib(sigil.pid);
    let pid = sigil.pid;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let sampler = tokio::spawn(async move {
        let mut peak = 0;
        tokio::pin!(stopped);
        loop {
            peak = peak.max(rss_kib(pid));
            tokio::select! {
                _ = &mut stopped => return peak,
                _ = tokio::time::sleep(Duration::from_millis(5)) => {}
            }
        }
    });
    // Distinct objects: every request's lookups go to the full cache.
    let load = round(
        sigil,
        concurrency,
        requests,
        body,
        crate::side::Objects::Distinct,
    )
    .await;
    let _ = stop.send(());
    let peak_kib = sampler.await.unwrap_or(0).max(rss_kib(pid));
    Filled {
        entries,
        peak_kib,
        after_fill_kib,
        load,
    }
}
