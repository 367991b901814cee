//! The backstop's cost in the API server (see docs/benchmarks.md).
//!
//! Starts kube-apiserver v1.36 with etcd (`SIGIL_KUBE_ASSETS`; without it
//! the benchmark says so and does nothing), then creates Pods of 1, 50 and
//! 250 containers (each image one the policy admits, pinned at its mirror)
//! as dry runs, first without a backstop and then under the backstop
//! `sigil_core::backstop` generates for policies of 4, 120 and 500 rules
//! (`sigil_testkit::policies::large`: 2, 20 and 50 mirrors). Prints one
//! table: per policy and Pod size, the median and 99th percentile of the
//! create's round trip, and the API server's own measure of the policy's
//! evaluation (`apiserver_validating_admission_policy_check_duration_seconds`,
//! mean; the API server records it only for a check that refuses, so it is
//! taken over as many Pods whose last image no rule matches).
//!
//! `cargo bench -p sigil --bench backstop` makes 50 creates per row; run
//! without `--bench` (as `cargo test --benches` does) it makes 3.

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sigil_testkit::kube::real::{RealKube, assets};
use sigil_testkit::policies;

fn main() {
    sigil_testkit::procstat::run_bench((50, 0), (3, 0), |n, _| run(n));
}

/// (sum, count) of the API server's policy check duration histogram.
async fn check_seconds(kube: &RealKube) -> (f64, f64) {
    let (_, text) = kube.get_text("/metrics").await;
    let mut sum = (0.0, 0.0);
    for line in text.lines() {
        let value = |l: &str| {
            l.rsplit(' ')
                .next()
                .and_then(|v| v.parse::<f64>().ok())
                .unwrap_or(0.0)
        };
        if line.starts_with("apiserver_validating_admission_policy_check_duration_seconds_sum{")
            && line.contains("policy=\"sigil-backstop\"")
        {
            sum.0 += value(line);
        } else if line
            .starts_with("apiserver_validating_admission_policy_check_duration_seconds_count{")
            && line.contains("policy=\"sigil-backstop\"")
        {
            sum.1 += value(line);
        }
    }
    sum
}

/// Round trips of `n` dry-run creates of a Pod of `images` (the last
/// replaced by one no rule matches when `refused`).
async fn creates(kube: &RealKube, images: &[String], n: usize, refused: bool) -> Vec<Duration> {
    let mut images = images.to_vec();
    if refused && let Some(last) = images.last_mut() {
        *last = "quay.io/never/admitted:1".to_owned();
    }
    let body: Value = policies::pod("bench", "p", &images);
    let mut times = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        let (status, v) = kube
            .request(
                "POST",
                "/api/v1/namespaces/bench/pods?dryRun=All",
                Some(&body),
            )
            .await;
        times.push(t.elapsed());
        assert_eq!(status, if refused { 403 } else { 201 }, "{v}");
    }
    times.sort();
    times
}

fn pct(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

async fn run(n: usize) {
    let assets = match assets() {
        Ok(a) => a,
        Err(why) => {
            println!("backstop benchmark skipped: {why}");
            return;
        }
    };
    let kube = RealKube::start(&assets).await;
    kube.namespaces(&["bench"]).await;
    kube.apply(&[json!({"apiVersion": "v1", "kind": "ServiceAccount",
        "metadata": {"name": "default", "namespace": "bench"}})])
        .await;
    let sizes = [1usize, 50, 250];
    let policies_ = [(4usize, 2usize), (120, 20), (500, 50)];
    // Warm up the API server's paths once; then each Pod without a backstop.
    let baseline = policies::admitted_images(4, 2, 1);
    creates(&kube, &baseline, 5, false).await;
    let mut without = Vec::new();
    for &c in &sizes {
        without.push(creates(&kube, &policies::admitted_images(4, 2, c), n, false).await);
    }
    println!("backstop: dry-run Pod creates on kube-apiserver v1.36, {n} per row");
    println!(
        "{:>14} | {:>6} | {:>11} | {:>11} | {:>11} | {:>11} | {:>14}",
        "rules/mirrors",
        "images",
        "p50 without",
        "p50 with",
        "p99 without",
        "p99 with",
        "CEL (refused)"
    );
    for (rules, mirrors) in policies_ {
        let text = policies::large(rules, mirrors);
        let policy = sigil_core::Policy::from_documents_at(&text, None).expect("policy");
        let backstop = sigil_core::backstop::generate(
            &policy,
            &sigil_core::backstop::Options {
                namespace: "sigil-system".into(),
                node_namespace: None,
            },
        );
        assert!(backstop.unfit.is_empty(), "{:?}", backstop.unfit);
        kube.apply(&backstop.objects).await;
        // In force once an unpinned image is refused and the largest Pod of
        // this policy's images (most of which the previous policy lacks) is
        // admitted: the API server swaps a policy in a moment after it is
        // applied, and a row measured before that is measured on the old one.
        let probe = policies::admitted_images(rules, mirrors, *sizes.last().unwrap_or(&1));
        let until = Instant::now() + Duration::from_secs(30);
        loop {
            let unpinned = vec![probe[0].split('@').next().unwrap_or_default().to_owned()];
            let (status, v) = kube
                .request(
                    "POST",
                    "/api/v1/namespaces/bench/pods?dryRun=All",
                    Some(&policies::pod("bench", "probe", &unpinned)),
                )
                .await;
            let ours = v["message"]
                .as_str()
                .is_some_and(|m| m.contains("has no digest"));
            let (ok, _) = kube
                .request(
                    "POST",
                    "/api/v1/namespaces/bench/pods?dryRun=All",
                    Some(&policies::pod("bench", "probe", &probe)),
                )
                .await;
            if status == 403 && ours && ok == 201 {
                break;
            }
            assert!(Instant::now() < until, "the backstop never came into force");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        for (i, &c) in sizes.iter().enumerate() {
            let images = policies::admitted_images(rules, mirrors, c);
            let with = creates(&kube, &images, n, false).await;
            let before = check_seconds(&kube).await;
            creates(&kube, &images, n, true).await;
            let after = check_seconds(&kube).await;
            let mean = if after.1 > before.1 {
                Duration::from_secs_f64((after.0 - before.0) / (after.1 - before.1))
            } else {
                Duration::ZERO
            };
            println!(
                "{:>14} | {:>6} | {:>11.2?} | {:>11.2?} | {:>11.2?} | {:>11.2?} | {:>14.2?}",
                format!("{rules}/{mirrors}"),
                c,
                pct(&without[i], 0.5),
                pct(&with, 0.5),
                pct(&without[i], 0.99),
                pct(&with, 0.99),
                mean
            );
        }
    }
}
