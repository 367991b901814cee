//! Load benchmark for `sigil serve` (see docs/benchmarks.md).
//!
//! One run: starts the real registry and pushes images; starts `sigil serve`
//! (release build, production log level, metrics on) and measures
//! start-to-Ready and idle RSS; starts a bare hyper+rustls HTTPS echo server
//! (a child process, like sigil); drives both with the same client and the
//! same captured 3-image Pod AdmissionReview over keep-alive HTTPS, in
//! alternating rounds at 8 connections and at 1; compares cached verified
//! with cached unverified decisions; runs Pods of images sigil has never
//! seen (counting registry requests); fills the digest cache with 100,000
//! answers and loads it again, sampling RSS. Prints one table; then a
//! rollout's burst at a registry's distance (`burst.rs`, printed by
//! `burst_report.rs`; `BENCH_ONLY=burst` runs only that).
//!
//! `cargo bench -p sigil --bench load` runs the full size; run without
//! `--bench` (as `cargo test --benches` does) it runs a small smoke.

use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sigil_testkit::procstat::{rss_kib, rss_parts_kib};
use sigil_testkit::registry::{Mode, TestRegistry, free_port};
use sigil_testkit::review::captured_pod_review_bytes as review;
use sigil_testkit::sigil::{KillOnDrop as Proc, bin, wait_http};
use sigil_testkit::signing::{Signer, push_signed};

mod burst;
mod burst_report;
mod client;
mod cold;
mod echo;
mod features;
mod fill;
mod proxy;
mod side;

use client::{Stats, client_tls, pct};
use side::{Objects, Target, alternate, by_p99, by_throughput};

struct Size {
    /// Connections of the main side-by-side comparison.
    concurrency: usize,
    /// Requests per round.
    requests: usize,
    /// Alternating rounds per comparison.
    rounds: usize,
    cold_pods: usize,
    /// Distinct digests in the cache for the memory row.
    cached_digests: usize,
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.iter().any(|a| a == "--echo-server") {
        return echo::echo_server();
    }
    let full = args.iter().any(|a| a == "--bench");
    // `BENCH_CACHED_DIGESTS=N` sizes the memory row (e.g. small while iterating).
    let digests = std::env::var("BENCH_CACHED_DIGESTS")
        .ok()
        .and_then(|n| n.parse().ok());
    let mut size = if full {
        Size {
            concurrency: 8,
            requests: 40_000,
            rounds: 3,
            cold_pods: 100,
            cached_digests: 100_000,
        }
    } else {
        Size {
            concurrency: 4,
            requests: 200,
            rounds: 1,
            cold_pods: 5,
            cached_digests: 500,
        }
    };
    if let Some(n) = digests {
        size.cached_digests = n;
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(run(size, full));
}

async fn run(size: Size, full: bool) {
    if std::env::var("BENCH_ONLY").as_deref() == Ok("burst") {
        return burst_report::run(full).await;
    }
    let dir = tempfile::tempdir().expect("tmp");
    // Registry.
    let registry = TestRegistry::start(Mode::Plain).await;
    let reg = registry.host();
    for i in 0..3 {
        registry.push_image("bench/app", &format!("warm{i}")).await;
    }
    let cold_tags = size.cold_pods * 3;
    let mut pushed = 0;
    while pushed < cold_tags {
        let batch: Vec<_> = (pushed..(pushed + 32).min(cold_tags))
            .map(|i| {
                let tag = format!("c{i}");
                let registry = &registry;
                async move { registry.push_image("bench/cold", &tag).await }
            })
            .collect();
        futures_util::future::join_all(batch).await;
        pushed = (pushed + 32).min(cold_tags);
    }

    // Signed images: three warm ones and three per cold pod, one P-256 key.
    let key = Signer::p256();
    let key_pem = key.public_pem();
    std::fs::write(dir.path().join("cosign.pub"), key_pem).expect("key file");
    for i in 0..3 {
        push_signed(
            &registry,
            "bench/signed",
            &format!("s{i}"),
            "bench/signed",
            &key,
        )
        .await;
    }
    let mut pushed = 0;
    while pushed < cold_tags {
        let batch: Vec<_> = (pushed..(pushed + 16).min(cold_tags))
            .map(|i| {
                let (tag, registry, key) = (format!("c{i}"), &registry, &key);
                async move {
                    push_signed(registry, "bench/signedcold", &tag, "bench/signedcold", key).await
                }
            })
            .collect();
        futures_util::future::join_all(batch).await;
        pushed = (pushed + 16).min(cold_tags);
    }

    // sigil.
    let policy = dir.path().join("policy.yaml");
    std::fs::write(&policy, format!("apiVersion: sigil.dev/v1alpha1\nkind: ImagePolicy\nspec:\n  registries:\n    - {{host: \"{reg}\", insecure: true}}\n  rules:\n    - {{name: all, match: [\"**\"], mode: enforce}}\n    - name: signed\n      match: [\"{reg}/bench/signed\", \"{reg}/bench/signedcold\"]\n      verify:\n        - {{name: ci, cosign: {{key: \"{}\"}}}}\n", dir.path().join("cosign.pub").display())).expect("policy");
    let ca = dir.path().join("ca.pem");
    let admin_port = free_port();
    let port = free_port();
    let started = Instant::now();
    let sigil = spawn_sigil(&policy, &ca, port, admin_port);
    wait_http(&format!("http://127.0.0.1:{admin_port}/readyz")).await;
    let start_to_ready = started.elapsed();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let idle_rss = rss_kib(sigil.0.id());
    let (idle_anon, idle_file) = rss_parts_kib(sigil.0.id());
    let sigil_addr: SocketAddr = format!("127.0.0.1:{port}").parse().expect("addr");
    let sig = Target {
        pid: sigil.0.id(),
        addr: sigil_addr,
        tls: client_tls(&std::fs::read(&ca).expect("ca")),
    };
    let (_echo, echo) = echo::start(dir.path()).await;

    let warm_body = Arc::new(review(&[
        &format!("{reg}/bench/app:warm0"),
        &format!("{reg}/bench/app:warm1"),
        &format!("{reg}/bench/app:warm2"),
    ]));
    let warmup = (size.requests / 10).max(50);
    for t in [&sig, &echo] {
        side::round(t, size.concurrency, warmup, &warm_body, Objects::Same).await;
    }
    // The main comparison: a rollout's Pods (the same object each time),
    // then every Pod its own object (each decided), then latency without
    // queueing (1 connection, each decided).
    let [cached, echo_cached] = alternate(
        [&sig, &echo],
        size.rounds,
        size.concurrency,
        size.requests,
        &warm_body,
        Objects::Same,
        by_throughput,
    )
    .await;
    let reused = metric_sum(admin_port, "sigil_admission_answers_reused_total").await;
    assert!(
        reused > 0,
        "a rollout's identical Pods must be answered from the reuse table"
    );
    let [distinct, echo_distinct] = alternate(
        [&sig, &echo],
        size.rounds,
        size.concurrency,
        size.requests,
        &warm_body,
        Objects::Distinct,
        by_throughput,
    )
    .await;
    let loaded_rss = rss_kib(sig.pid);
    let [single, echo_single] = alternate(
        [&sig, &echo],
        size.rounds,
        1,
        size.requests / 4,
        &warm_body,
        Objects::Distinct,
        by_p99,
    )
    .await;
    let echo_rss = rss_kib(echo.pid);
    // The features of the latest round, decided by a second sigil, against
    // the plain one: same request, alternating rounds.
    let warm_tags: Vec<String> = (0..3).map(|i| format!("warm{i}")).collect();
    let (_featured_proc, featured, _) = features::start(&registry, dir.path(), &warm_tags).await;
    features::check_answer(
        &client::one(featured.addr, featured.tls.clone(), (*warm_body).clone()).await,
        &reg,
    );
    side::round(
        &featured,
        size.concurrency,
        warmup,
        &warm_body,
        Objects::Distinct,
    )
    .await;
    // Distinct objects: the features' cost is in deciding.
    let [plain_cached, featured_cached] = alternate(
        [&sig, &featured],
        size.rounds,
        size.concurrency,
        size.requests,
        &warm_body,
        Objects::Distinct,
        by_throughput,
    )
    .await;
    let features_cost = featured_cached.cpu.as_secs_f64() / plain_cached.cpu.as_secs_f64() - 1.0;
    if std::env::var_os("BENCH_ONLY_CACHED").is_some() {
        // While iterating on the hot path: the side-by-side rows only.
        side::quick_rows(
            size.concurrency,
            [(&cached, &echo_cached), (&distinct, &echo_distinct)],
        );
        let us = |d: Duration| d.as_secs_f64() * 1e6;
        println!(
            "1 connection p99 (distinct objects) {:.3} ms vs {:.3} ms; answers reused {reused}",
            ms(single.stats.p99),
            ms(echo_single.stats.p99)
        );
        println!(
            "features of the round vs plain, {} connections: {:.1} vs {:.1} µs CPU/req ({:+.1} %), {:.0} vs {:.0} req/s",
            size.concurrency,
            us(featured_cached.cpu),
            us(plain_cached.cpu),
            100.0 * features_cost,
            featured_cached.stats.rps,
            plain_cached.stats.rps
        );
        return;
    }

    // Cached *verified* decisions against cached unverified ones: the same
    // Pod shape with three signed images. Rounds alternate so drift on a
    // noisy machine hits both sides; the median round is reported.
    let signed_body = Arc::new(review(&[
        &format!("{reg}/bench/signed:s0"),
        &format!("{reg}/bench/signed:s1"),
        &format!("{reg}/bench/signed:s2"),
    ]));
    side::round(&sig, 1, 1, &signed_body, Objects::Distinct).await;
    assert_eq!(
        metric_sum(
            admin_port,
            "sigil_signature_verifications_total{verifier=\"ci\",result=\"passed\"}"
        )
        .await,
        3,
        "the signed images must verify (else this measures denials)"
    );
    side::round(
        &sig,
        size.concurrency,
        warmup,
        &signed_body,
        Objects::Distinct,
    )
    .await;
    let mut verified_rounds = Vec::new();
    let mut plain_rounds = Vec::new();
    for _ in 0..3 {
        for (body, out) in [
            (&warm_body, &mut plain_rounds),
            (&signed_body, &mut verified_rounds),
        ] {
            out.push(
                side::round(&sig, 2, size.requests / 8, body, Objects::Distinct)
                    .await
                    .stats,
            );
        }
    }
    let median = |mut v: Vec<Stats>| {
        v.sort_by_key(|s| s.p99);
        v.swap_remove(v.len() / 2)
    };
    let verified = median(verified_rounds);
    let plain = median(plain_rounds);

    let cold = cold::run(&registry, &sig, admin_port, size.cold_pods).await;
    let cold_rss = rss_kib(sig.pid);
    let filled = fill::fill_and_load(
        &registry,
        &sig,
        admin_port,
        size.cached_digests,
        size.concurrency,
        size.requests / 4,
        &warm_body,
    )
    .await;

    println!();
    println!(
        "sigil load benchmark ({} mode, {} cores; request: captured 3-image Pod AdmissionReview, {} bytes)",
        if full { "full" } else { "smoke" },
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1),
        warm_body.len()
    );
    println!(
        "| run | requests | concurrency | req/s | p50 | p99 | p99.9 | server CPU/req | server RSS |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    let row = |name: &str, n: usize, c: usize, s: &Stats, cpu: Option<Duration>, rss: u64| {
        println!(
            "| {name} | {n} | {c} | {:.0} | {:.3} ms | {:.3} ms | {:.3} ms | {} | {:.1} MiB |",
            s.rps,
            ms(s.p50),
            ms(s.p99),
            ms(s.p999),
            cpu.map_or("".into(), |c| format!("{:.1} µs", c.as_secs_f64() * 1e6)),
            rss as f64 / 1024.0
        );
    };
    let c = size.concurrency;
    let rounds = size.rounds;
    row(
        &format!(
            "sigil /mutate, cached, a rollout's Pods: the same object, answer reused (median of {rounds} rounds)"
        ),
        size.requests,
        c,
        &cached.stats,
        Some(cached.cpu),
        loaded_rss,
    );
    row(
        &format!("bare hyper+rustls echo, same client/body (median of {rounds})"),
        size.requests,
        c,
        &echo_cached.stats,
        Some(echo_cached.cpu),
        echo_rss,
    );
    row(
        &format!(
            "sigil /mutate, cached, every Pod its own object, each decided (median of {rounds} rounds)"
        ),
        size.requests,
        c,
        &distinct.stats,
        Some(distinct.cpu),
        loaded_rss,
    );
    row(
        &format!("bare hyper+rustls echo, alternating with the row above (median of {rounds})"),
        size.requests,
        c,
        &echo_distinct.stats,
        Some(echo_distinct.cpu),
        echo_rss,
    );
    row(
        &format!("sigil /mutate, cached, each decided, 1 connection (median p99 of {rounds})"),
        size.requests / 4,
        1,
        &single.stats,
        Some(single.cpu),
        loaded_rss,
    );
    row(
        &format!("bare echo, 1 connection (median p99 of {rounds})"),
        size.requests / 4,
        1,
        &echo_single.stats,
        Some(echo_single.cpu),
        echo_rss,
    );
    row(
        &format!(
            "sigil /mutate, cached, plain policy, alternating with the next (median of {rounds})"
        ),
        size.requests,
        c,
        &plain_cached.stats,
        Some(plain_cached.cpu),
        loaded_rss,
    );
    row(
        &format!(
            "sigil /mutate, cached, features of the round: two mirrors, attestation rule, team policy, exception (median of {rounds})"
        ),
        size.requests,
        c,
        &featured_cached.stats,
        Some(featured_cached.cpu),
        rss_kib(featured.pid),
    );
    row(
        "sigil /mutate, cached, unverified (median of 3 rounds)",
        size.requests / 8,
        2,
        &plain,
        None,
        loaded_rss,
    );
    row(
        "sigil /mutate, cached, 3 verified images (median of 3 rounds)",
        size.requests / 8,
        2,
        &verified,
        None,
        loaded_rss,
    );
    row(
        "sigil /mutate, cold (3 new images/pod)",
        size.cold_pods,
        1,
        &cold.cold,
        None,
        cold_rss,
    );
    row(
        "sigil /mutate, cold, 3 new signed images/pod",
        size.cold_pods,
        1,
        &cold.cold_verified,
        None,
        cold_rss,
    );
    row(
        &format!(
            "sigil /mutate, cached, with {} digests cached",
            filled.entries
        ),
        size.requests / 4,
        c,
        &filled.load.stats,
        Some(filled.load.cpu),
        filled.peak_kib,
    );
    println!();
    println!("| figure | value | target |");
    println!("|---|---|---|");
    // A smoke run's few hundred requests are below the CPU clock's
    // resolution: it shows the rows run, and judges no target.
    let met = |ok: bool| match (full, ok) {
        (false, _) => "not judged (smoke run)",
        (true, true) => "**met**",
        (true, false) => "not met",
    };
    side::target_rows(
        c,
        [(&cached, &echo_cached), (&distinct, &echo_distinct)],
        &met,
    );
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    println!(
        "| CPU per request, features of the round vs plain ({c} connections, alternating) | {:.1} µs vs {:.1} µs ({:+.1} %) | within 10 %: {} |",
        us(featured_cached.cpu),
        us(plain_cached.cpu),
        100.0 * features_cost,
        met(features_cost <= 0.10)
    );
    let gap = single.stats.p99.as_secs_f64() - echo_single.stats.p99.as_secs_f64();
    println!(
        "| p99 at 1 connection: sigil − echo | {:+.1} µs ({:.3} ms vs {:.3} ms) | ≤ 100 µs: {} |",
        gap * 1e6,
        ms(single.stats.p99),
        ms(echo_single.stats.p99),
        met(gap <= 0.0001)
    );
    let idle_mib = idle_rss as f64 / 1024.0;
    println!(
        "| idle RSS (anonymous + file-backed: the binary's pages mapped around those run) | {idle_mib:.1} MiB ({:.1} + {:.1}) | ≤ 20 MiB: {} |",
        idle_anon as f64 / 1024.0,
        idle_file as f64 / 1024.0,
        met(idle_mib <= 20.0)
    );
    let peak_mib = filled.peak_kib as f64 / 1024.0;
    println!(
        "| RSS under load with {} cached digests (after filling: {:.1} MiB) | {peak_mib:.1} MiB | ≤ 64 MiB: {} |",
        filled.entries,
        filled.after_fill_kib as f64 / 1024.0,
        met(peak_mib <= 64.0)
    );
    println!(
        "| start to Ready | {:.1} ms | ≤ 200 ms |",
        start_to_ready.as_secs_f64() * 1000.0
    );
    println!(
        "| cold: registry requests / unique references | {} / {cold_tags} | equal (single-flight) |",
        cold.cold_requests
    );
    println!(
        "| cold pod p50 vs registry: 1 HEAD p50, 3 concurrent HEADs p50 | {:.3} ms vs {:.3} ms, {:.3} ms | tracks the concurrent max, not 3× one HEAD |",
        ms(cold.cold.p50),
        ms(pct(&cold.reg_lat, 0.5)),
        ms(pct(&cold.reg_lat3, 0.5))
    );
    let delta = verified.p99.as_secs_f64() - plain.p99.as_secs_f64();
    println!(
        "| cached p99: verified − unverified (2 connections) | {:+.1} µs ({:.3} ms vs {:.3} ms) | ≤ 50 µs |",
        delta * 1e6,
        ms(verified.p99),
        ms(plain.p99)
    );
    println!(
        "| cold verified pod p50 / p99 vs the registry floor p50 (same requests, issued directly) | {:.3} ms / {:.3} ms vs {:.3} ms | ≈ round trips + crypto |",
        ms(cold.cold_verified.p50),
        ms(cold.cold_verified.p99),
        ms(pct(&cold.floor, 0.5))
    );
    println!(
        "| cold verified: registry requests per image | {:.2} (HEAD, .sig manifest, referrers tag schema, payload blob; the referrers API's 404 once per host) | |",
        cold.cold_verified_requests as f64 / cold_tags.max(1) as f64
    );
    assert!(verified.rps > 0.0 && cold.cold_verified.rps > 0.0);
    assert_eq!(
        cold.cold_requests as usize, cold_tags,
        "one registry request per unique reference"
    );
    assert!(
        filled.entries as usize + 10 >= size.cached_digests.min(100_000),
        "the cache holds what was filled ({} entries)",
        filled.entries
    );
    burst_report::run(full).await;
}

/// `sigil serve` as the benchmark runs it: production log level (or
/// `BENCH_SIGIL_LOG`), its CA written to `ca`, output discarded.
fn spawn_sigil(policy: &std::path::Path, ca: &std::path::Path, port: u16, admin: u16) -> Proc {
    Proc(
        Command::new(bin())
            .args(["serve", "--shutdown-delay", "0s"])
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .args(["--admin-listen", &format!("127.0.0.1:{admin}")])
            .arg("--policy")
            .arg(policy)
            .arg("--ca-bundle-out")
            .arg(ca)
            // Its temporary files go with the benchmark's directory.
            .envs(ca.parent().map(|d| ("TMPDIR", d)))
            .env(
                "SIGIL_LOG",
                std::env::var("BENCH_SIGIL_LOG").unwrap_or_else(|_| "info".into()),
            )
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn sigil"),
    )
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Sum of every sample of a metric on sigil's admin port whose line starts with `prefix`.
async fn metric_sum(admin: u16, prefix: &str) -> u64 {
    metric_with(admin, prefix, "").await
}

/// [`metric_sum`] of the samples whose line also contains `label`.
async fn metric_with(admin: u16, prefix: &str, label: &str) -> u64 {
    let text = reqwest::get(format!("http://127.0.0.1:{admin}/metrics"))
        .await
        .expect("metrics")
        .text()
        .await
        .expect("metrics body");
    text.lines()
        .filter(|l| l.starts_with(prefix) && l.contains(label))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}
