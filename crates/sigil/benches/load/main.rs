//! Load benchmark for `sigil serve` (see docs/benchmarks.md).
//!
//! One run: starts the real registry and pushes images; starts `sigil serve`
//! (release build) and measures start-to-Ready and idle RSS; warms the cache
//! and drives `POST /mutate` with a 3-container Pod over keep-alive HTTPS at a
//! fixed concurrency; drives a bare hyper+rustls HTTPS echo server (a child
//! process, like sigil) with the same client and body; then a cold run with
//! unique images per request, counting registry requests and comparing pod
//! latency with the registry's own round trip. Prints one table.
//!
//! `cargo bench -p sigil --bench load` runs the full size; run without
//! `--bench` (as `cargo test --benches` does) it runs a small smoke.

use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;

use sigil_testkit::registry::{Mode, TestRegistry, free_port};
use sigil_testkit::review::pod_review_bytes as review;
use sigil_testkit::sigil::{KillOnDrop as Proc, bin, wait_http};
use sigil_testkit::signing::{Signer, push_signed};

struct Size {
    concurrency: usize,
    requests: usize,
    cold_pods: usize,
}

mod client;
mod echo;

use client::{Stats, client_tls, drive, pct};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.iter().any(|a| a == "--echo-server") {
        return echo::echo_server();
    }
    let full = args.iter().any(|a| a == "--bench");
    let size = if full {
        Size {
            concurrency: 16,
            requests: 40_000,
            cold_pods: 100,
        }
    } else {
        Size {
            concurrency: 4,
            requests: 200,
            cold_pods: 5,
        }
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(run(size, full));
}

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|n| n.parse().ok())
        })
        .unwrap_or(0)
}

/// User+system CPU time of a process so far (from /proc, in clock ticks of 10 ms).
fn cpu_time(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after = stat.rsplit(") ").next().unwrap_or_default();
    let f: Vec<u64> = after
        .split_whitespace()
        .map(|x| x.parse().unwrap_or(0))
        .collect();
    let ticks = f.get(11).copied().unwrap_or(0) + f.get(12).copied().unwrap_or(0);
    Duration::from_millis(ticks * 10)
}

async fn run(size: Size, full: bool) {
    let dir = tempfile::tempdir().expect("tmp");
    // Registry.
    let http = reqwest::Client::new();
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
    let sigil = Proc(
        Command::new(bin())
            .args([
                "serve",
                "--shutdown-delay",
                "0s",
                "--listen",
                &format!("127.0.0.1:{port}"),
                "--admin-listen",
                &format!("127.0.0.1:{admin_port}"),
            ])
            .arg("--policy")
            .arg(&policy)
            .arg("--ca-bundle-out")
            .arg(&ca)
            .env(
                "SIGIL_LOG",
                std::env::var("BENCH_SIGIL_LOG").unwrap_or_else(|_| "info".into()),
            )
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn sigil"),
    );
    wait_http(&format!("http://127.0.0.1:{admin_port}/readyz")).await;
    let start_to_ready = started.elapsed();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let idle_rss = rss_kib(sigil.0.id());
    let sigil_addr: SocketAddr = format!("127.0.0.1:{port}").parse().expect("addr");
    let tls = client_tls(&std::fs::read(&ca).expect("ca"));

    let warm_body = Arc::new(review(&[
        &format!("{reg}/bench/app:warm0"),
        &format!("{reg}/bench/app:warm1"),
        &format!("{reg}/bench/app:warm2"),
    ]));
    let same = |b: &Arc<Vec<u8>>| {
        let b = b.clone();
        move |_| (*b).clone()
    };
    let warmup = drive(
        sigil_addr,
        tls.clone(),
        size.concurrency,
        (size.requests / 10).max(50),
        same(&warm_body),
    )
    .await;
    let _ = warmup;
    let cpu0 = cpu_time(sigil.0.id());
    let cached = drive(
        sigil_addr,
        tls.clone(),
        size.concurrency,
        size.requests,
        same(&warm_body),
    )
    .await;
    let sigil_cpu = (cpu_time(sigil.0.id()) - cpu0) / size.requests as u32;
    let loaded_rss = rss_kib(sigil.0.id());
    // The same at a moderate load (2 connections), for latency without queueing.
    let moderate = drive(
        sigil_addr,
        tls.clone(),
        2,
        size.requests / 4,
        same(&warm_body),
    )
    .await;

    // Cached *verified* decisions against cached unverified ones: the same
    // Pod shape with three signed images. Rounds alternate so drift on a
    // noisy machine hits both sides; the median round is reported.
    let signed_body = Arc::new(review(&[
        &format!("{reg}/bench/signed:s0"),
        &format!("{reg}/bench/signed:s1"),
        &format!("{reg}/bench/signed:s2"),
    ]));
    drive(sigil_addr, tls.clone(), 1, 1, same(&signed_body)).await;
    assert_eq!(
        metric_sum(
            &http,
            admin_port,
            "sigil_signature_verifications_total{verifier=\"ci\",result=\"passed\"}"
        )
        .await,
        3,
        "the signed images must verify (else this measures denials)"
    );
    drive(
        sigil_addr,
        tls.clone(),
        size.concurrency,
        (size.requests / 10).max(50),
        same(&signed_body),
    )
    .await;
    let mut verified_rounds = Vec::new();
    let mut plain_rounds = Vec::new();
    for _ in 0..3 {
        for (body, out) in [
            (&warm_body, &mut plain_rounds),
            (&signed_body, &mut verified_rounds),
        ] {
            out.push(drive(sigil_addr, tls.clone(), 2, size.requests / 8, same(body)).await);
        }
    }
    let median = |mut v: Vec<Stats>| {
        v.sort_by_key(|s| s.p99);
        v.swap_remove(v.len() / 2)
    };
    let verified = median(verified_rounds);
    let plain = median(plain_rounds);

    // Echo server with the same client and body.
    let echo_dir = dir.path().join("echo");
    std::fs::create_dir_all(&echo_dir).expect("echo dir");
    let echo_port = free_port();
    let echo = Proc(
        Command::new(std::env::current_exe().expect("exe"))
            .arg("--echo-server")
            .env("ECHO_ADDR", format!("127.0.0.1:{echo_port}"))
            .env("ECHO_DIR", &echo_dir)
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn echo"),
    );
    let echo_ca = echo_dir.join("ca.pem");
    let until = Instant::now() + Duration::from_secs(10);
    while !echo_ca.exists() && Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let echo_tls = client_tls(&std::fs::read(&echo_ca).expect("echo ca"));
    let echo_addr: SocketAddr = format!("127.0.0.1:{echo_port}").parse().expect("addr");
    drive(
        echo_addr,
        echo_tls.clone(),
        size.concurrency,
        (size.requests / 10).max(50),
        same(&warm_body),
    )
    .await;
    let cpu0 = cpu_time(echo.0.id());
    let echo_stats = drive(
        echo_addr,
        echo_tls,
        size.concurrency,
        size.requests,
        same(&warm_body),
    )
    .await;
    let echo_cpu = (cpu_time(echo.0.id()) - cpu0) / size.requests as u32;
    let echo_rss = rss_kib(echo.0.id());
    drop(echo);

    // Registry's own round trip for one HEAD, measured directly.
    let mut reg_lat = Vec::new();
    for i in 0..50 {
        let t = Instant::now();
        let _ = http
            .head(format!(
                "http://{reg}/v2/bench/cold/manifests/c{}",
                i % cold_tags.max(1)
            ))
            .header("accept", "application/vnd.oci.image.manifest.v1+json")
            .send()
            .await;
        reg_lat.push(t.elapsed());
    }
    reg_lat.sort();
    // And for three HEADs at once (what one cold 3-image Pod needs): the time
    // until the slowest answers. This is the floor for a cold Pod.
    let mut reg_lat3 = Vec::new();
    for i in 0..50 {
        let t = Instant::now();
        let heads = (0..3).map(|k| {
            http.head(format!(
                "http://{reg}/v2/bench/cold/manifests/c{}",
                (i * 3 + k) % cold_tags.max(1)
            ))
            .header("accept", "application/vnd.oci.image.manifest.v1+json")
            .send()
        });
        let _ = futures_util::future::join_all(heads).await;
        reg_lat3.push(t.elapsed());
    }
    reg_lat3.sort();

    // Cold: every pod has 3 images never seen before.
    let before = registry_requests(&http, admin_port).await;
    let cold_bodies: Vec<Vec<u8>> = (0..size.cold_pods)
        .map(|p| {
            review(&[
                &format!("{reg}/bench/cold:c{}", p * 3),
                &format!("{reg}/bench/cold:c{}", p * 3 + 1),
                &format!("{reg}/bench/cold:c{}", p * 3 + 2),
            ])
        })
        .collect();
    let cold_bodies = Arc::new(cold_bodies);
    let cb = cold_bodies.clone();
    let cold = drive(sigil_addr, tls.clone(), 1, size.cold_pods, move |i| {
        cb[i].clone()
    })
    .await;
    let after = registry_requests(&http, admin_port).await;
    let cold_requests = after - before;

    // Cold verified: three new signed images per pod (resolve + gather + verify each).
    let before = registry_requests(&http, admin_port).await;
    let signed_cold: Arc<Vec<Vec<u8>>> = Arc::new(
        (0..size.cold_pods)
            .map(|p| {
                review(&[
                    &format!("{reg}/bench/signedcold:c{}", p * 3),
                    &format!("{reg}/bench/signedcold:c{}", p * 3 + 1),
                    &format!("{reg}/bench/signedcold:c{}", p * 3 + 2),
                ])
            })
            .collect(),
    );
    let sc = signed_cold.clone();
    let cold_verified = drive(sigil_addr, tls.clone(), 1, size.cold_pods, move |i| {
        sc[i].clone()
    })
    .await;
    let cold_verified_requests = registry_requests(&http, admin_port).await - before;

    // The registry floor for one cold verified pod: the same requests with the
    // same dependencies, issued directly (3 HEADs; then per image the .sig
    // manifest and the tag-schema index; then the payload blobs).
    let mut floor = Vec::new();
    for p in 0..size.cold_pods.min(50) {
        let tags: Vec<String> = (0..3).map(|k| format!("c{}", p * 3 + k)).collect();
        let t = Instant::now();
        let heads = futures_util::future::join_all(tags.iter().map(|tag| {
            http.head(format!("http://{reg}/v2/bench/signedcold/manifests/{tag}"))
                .header("accept", "application/vnd.oci.image.manifest.v1+json")
                .send()
        }))
        .await;
        let digests: Vec<String> = heads
            .into_iter()
            .map(|r| {
                r.expect("head").headers()["docker-content-digest"]
                    .to_str()
                    .expect("digest")
                    .to_owned()
            })
            .collect();
        let sigs = futures_util::future::join_all(digests.iter().flat_map(|d| {
            let tag = d.replace(':', "-");
            [format!("{tag}.sig"), tag].map(|t| {
                http.get(format!("http://{reg}/v2/bench/signedcold/manifests/{t}"))
                    .header("accept", "application/vnd.oci.image.manifest.v1+json, application/vnd.oci.image.index.v1+json")
                    .send()
            })
        }))
        .await;
        let mut blobs = Vec::new();
        for r in sigs.into_iter().flatten() {
            if r.status() == 200 {
                let v: Value =
                    serde_json::from_slice(&r.bytes().await.expect("body")).unwrap_or(Value::Null);
                if let Some(d) = v.pointer("/layers/0/digest").and_then(Value::as_str) {
                    blobs.push(d.to_owned());
                }
            }
        }
        futures_util::future::join_all(blobs.iter().map(|b| {
            http.get(format!("http://{reg}/v2/bench/signedcold/blobs/{b}"))
                .send()
        }))
        .await;
        floor.push(t.elapsed());
    }
    floor.sort();

    println!();
    println!(
        "sigil load benchmark ({} mode, {} cores)",
        if full { "full" } else { "smoke" },
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
    );
    println!("| run | requests | concurrency | req/s | p50 | p99 | p99.9 | server RSS |");
    println!("|---|---|---|---|---|---|---|---|");
    let row = |name: &str, n: usize, c: usize, s: &Stats, rss: u64| {
        println!(
            "| {name} | {n} | {c} | {:.0} | {:.3} ms | {:.3} ms | {:.3} ms | {:.1} MiB |",
            s.rps,
            ms(s.p50),
            ms(s.p99),
            ms(s.p999),
            rss as f64 / 1024.0
        );
    };
    row(
        "sigil /mutate, cached, 3-container Pod",
        size.requests,
        size.concurrency,
        &cached,
        loaded_rss,
    );
    row(
        "sigil /mutate, cached, moderate load",
        size.requests / 4,
        2,
        &moderate,
        loaded_rss,
    );
    row(
        "bare hyper+rustls echo, same client/body",
        size.requests,
        size.concurrency,
        &echo_stats,
        echo_rss,
    );
    row(
        "sigil /mutate, cached, unverified (median of 3 rounds)",
        size.requests / 8,
        2,
        &plain,
        loaded_rss,
    );
    row(
        "sigil /mutate, cached, 3 verified images (median of 3 rounds)",
        size.requests / 8,
        2,
        &verified,
        loaded_rss,
    );
    row(
        "sigil /mutate, cold (3 new images/pod)",
        size.cold_pods,
        1,
        &cold,
        rss_kib(sigil.0.id()),
    );
    row(
        "sigil /mutate, cold, 3 new signed images/pod",
        size.cold_pods,
        1,
        &cold_verified,
        rss_kib(sigil.0.id()),
    );
    println!();
    println!("| figure | value | target |");
    println!("|---|---|---|");
    println!(
        "| throughput vs echo | {:.1} % | ≥ 80 % |",
        100.0 * cached.rps / echo_stats.rps
    );
    println!(
        "| cached p99 at 16 / at 2 connections | {:.3} ms / {:.3} ms | ≤ 1 ms |",
        ms(cached.p99),
        ms(moderate.p99)
    );
    println!(
        "| server CPU per request: sigil vs echo | {:.1} µs vs {:.1} µs | |",
        sigil_cpu.as_secs_f64() * 1e6,
        echo_cpu.as_secs_f64() * 1e6
    );
    println!(
        "| idle RSS | {:.1} MiB | ≤ 20 MiB |",
        idle_rss as f64 / 1024.0
    );
    println!(
        "| start to Ready | {:.1} ms | ≤ 200 ms |",
        start_to_ready.as_secs_f64() * 1000.0
    );
    println!(
        "| cold: registry requests / unique references | {cold_requests} / {cold_tags} | equal (single-flight) |"
    );
    println!(
        "| cold pod p50 vs registry: 1 HEAD p50, 3 concurrent HEADs p50 | {:.3} ms vs {:.3} ms, {:.3} ms | tracks the concurrent max, not 3× one HEAD |",
        ms(cold.p50),
        ms(pct(&reg_lat, 0.5)),
        ms(pct(&reg_lat3, 0.5))
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
        ms(cold_verified.p50),
        ms(cold_verified.p99),
        ms(pct(&floor, 0.5))
    );
    println!(
        "| cold verified: registry requests per image | {:.2} (HEAD, .sig manifest, referrers tag schema, payload blob; the referrers API's 404 once per host) | |",
        cold_verified_requests as f64 / cold_tags.max(1) as f64
    );
    assert!(verified.rps > 0.0 && cold_verified.rps > 0.0);
    assert_eq!(
        cold_requests as usize, cold_tags,
        "one registry request per unique reference"
    );
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

async fn registry_requests(http: &reqwest::Client, admin: u16) -> u64 {
    metric_sum(http, admin, "sigil_registry_requests_total").await
}

/// Sum of every sample of a metric whose line starts with `prefix`.
async fn metric_sum(http: &reqwest::Client, admin: u16, prefix: &str) -> u64 {
    let text = http
        .get(format!("http://127.0.0.1:{admin}/metrics"))
        .send()
        .await
        .expect("metrics")
        .text()
        .await
        .expect("metrics body");
    text.lines()
        .filter(|l| l.starts_with(prefix))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}
