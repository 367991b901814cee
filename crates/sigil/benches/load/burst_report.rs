//! The burst's entry, tables and checks: what `burst.rs` measured, printed
//! as docs/benchmarks.md shows it, and the counts the smoke asserts (no
//! admission over the timeout, one probe of each kind per cold host per
//! replica, one verification per digest a replica saw).

use std::time::Duration;

use crate::burst::{self, Auth, Burst, Cold};

/// The burst's size: the figures in full, a small smoke that still
/// asserts its counts.
fn sized(full: bool) -> burst::Size {
    if full {
        burst::Size {
            rtts: vec![0, 50, 150],
            images: 100,
            pods_per_image: 10,
            offered_over: Duration::from_secs(10),
            connections: 64,
            sequential: 20,
            replicas: vec![1, 3],
        }
    } else {
        burst::Size {
            rtts: vec![50],
            images: 6,
            pods_per_image: 3,
            offered_over: Duration::from_secs(1),
            connections: 8,
            sequential: 2,
            replicas: vec![1, 3],
        }
    }
}

/// The burst rows: run, printed, and (in the smoke too) checked.
pub async fn run(full: bool) {
    let mut size = sized(full);
    // While iterating: `BENCH_BURST_RTTS=150` and `BENCH_BURST_REPLICAS=1`.
    let list = |name: &str| -> Option<Vec<u64>> {
        std::env::var(name)
            .ok()
            .map(|v| v.split(',').filter_map(|n| n.trim().parse().ok()).collect())
    };
    if let Some(r) = list("BENCH_BURST_RTTS") {
        size.rtts = r;
    }
    if let Some(r) = list("BENCH_BURST_REPLICAS") {
        size.replicas = r.into_iter().map(|n| n as usize).collect();
    }
    let auth = if std::env::var("BENCH_BURST_AUTH").as_deref() == Ok("none") {
        burst::Auth::Anonymous
    } else {
        burst::Auth::Basic
    };
    let (colds, bursts) = burst::run(&size, auth).await;
    print(&colds, &bursts, auth);
    check(&bursts);
}

/// Prints the burst's tables.
fn print(colds: &[Cold], bursts: &[Burst], auth: Auth) {
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let rt = |d: Duration, rtt: u64| {
        if rtt == 0 {
            "–".to_owned()
        } else {
            format!("{:.1}", ms(d) / rtt as f64)
        }
    };
    println!();
    println!(
        "Cold, one image at a time (p50; round trips = latency ÷ RTT), and the floor (the same requests issued directly, warm connection):"
    );
    println!(
        "| RTT | keyless | keyless RT | floor keyless RT | key-signed | key-signed RT | floor key-signed RT |"
    );
    println!("|---|---|---|---|---|---|---|");
    for c in colds {
        println!(
            "| {} ms | {:.1} ms | {} | {} | {:.1} ms | {} | {} |",
            c.rtt,
            ms(c.keyless_p50),
            rt(c.keyless_p50, c.rtt),
            rt(c.floor_keyless, c.rtt),
            ms(c.keyed_p50),
            rt(c.keyed_p50, c.rtt),
            rt(c.floor_keyed, c.rtt)
        );
    }
    println!();
    println!(
        "Burst of keyless images ({}; admission latency from the request's send):",
        match auth {
            Auth::Basic => "htpasswd Basic auth",
            Auth::Anonymous => "anonymous",
        }
    );
    println!(
        "| RTT | replicas | host | admissions | p50 | p99 | p99 RT | max | over 10 s | registry requests/image | probes: auth, referrers | connections | verifications per digest a replica saw | CPU: sigil, registry |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for b in bursts {
        println!(
            "| {} ms | {} | {} | {} | {:.1} ms | {:.1} ms | {} | {:.1} ms | {} | {:.2} | {}, {} | {} | {:.2} | {:.2} s, {:.2} s |",
            b.rtt,
            b.replicas,
            if b.warm_host { "warm" } else { "cold" },
            b.admissions,
            ms(b.p50),
            ms(b.p99),
            rt(b.p99, b.rtt),
            ms(b.max),
            b.over_timeout,
            b.requests_per_image,
            b.probes,
            b.referrers,
            b.connections,
            b.verifications_per_digest,
            b.cpu.as_secs_f64(),
            b.registry_cpu.as_secs_f64()
        );
    }
}

/// The smoke's assertions (`cargo test --benches`).
fn check(bursts: &[Burst]) {
    for b in bursts {
        assert_eq!(
            b.over_timeout, 0,
            "admissions over the timeout at {} ms",
            b.rtt
        );
        // A cold host is probed once per replica; a warm one not again.
        let probes = if b.warm_host { 0 } else { b.replicas as u64 };
        assert_eq!(
            b.probes, probes,
            "one capability probe per host per replica at {} ms",
            b.rtt
        );
        assert_eq!(
            b.referrers, probes,
            "one referrers API probe per host per replica at {} ms",
            b.rtt
        );
        assert!(
            (b.verifications_per_digest - 1.0).abs() < 1e-9,
            "one verification per digest per replica at {} ms: {}",
            b.rtt,
            b.verifications_per_digest
        );
    }
}
