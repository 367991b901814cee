//! The backstop's cost in the API server (see docs/benchmarks.md).
//!
//! Starts kube-apiserver v1.36 with etcd (`SIGIL_KUBE_ASSETS`; without it
//! the benchmark says so and does nothing), then creates Pods with 1, 10
//! and 50 containers (each image pinned at its mirror, so every one is
//! checked and admitted) as dry runs, first without and then with the
//! backstop `sigil backstop` prints for a policy of twelve rules and two
//! mirrors. Prints one table: per Pod size, the median and 99th percentile
//! of the create's round trip without and with it, and the API server's own
//! measure of the policy's evaluation
//! (`apiserver_validating_admission_policy_check_duration_seconds`, mean;
//! the API server records it only for a check that refuses, so it is taken
//! over as many Pods whose last image is unpinned).
//!
//! `cargo bench -p sigil --bench backstop` makes 300 creates per row; run
//! without `--bench` (as `cargo test --benches` does) it makes 10.

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sigil_testkit::kube::real::{RealKube, assets};

const DIGEST: &str = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

const POLICY: &str = "apiVersion: sigil.dev/v1alpha1\nkind: ImagePolicy\nmetadata: {name: cluster}\nspec:\n  mirrors:\n    - {from: \"registry.example.com/team\", to: [\"mirror.example.com/team\", \"backup.example.com/team\"]}\n    - {from: \"docker.io/library\", to: [\"hub.example.com/library\"], fallback: origin}\n  rules:\n    - {name: team, match: [\"registry.example.com/team/**\"], mode: enforce}\n    - {name: team-tools, match: [\"registry.example.com/team/tools/*\"], mode: enforce, action: allow}\n    - {name: legacy, match: [\"registry.example.com/legacy/**\"], action: deny}\n    - {name: hub, match: [\"docker.io/library/**\"], mode: enforce}\n    - {name: quay, match: [\"quay.io/acme/**\"], mode: enforce}\n    - {name: gcr, match: [\"gcr.io/acme-prod/**\"], mode: enforce}\n    - {name: ecr, match: [\"*.dkr.ecr.*.amazonaws.com/**\"], mode: enforce}\n    - {name: ghcr, match: [\"ghcr.io/acme/**\"], mode: enforce}\n    - {name: internal, match: [\"*.corp.example.com/**\"], mode: enforce}\n    - {name: releases, match: [\"quay.io/acme/release:v*\"], mode: enforce}\n    - {name: sandbox, match: [\"registry.example.com/sandbox/**\"], mode: warn}\n    - {name: rest, match: [\"**\"], mode: warn}\n";

fn main() {
    sigil_testkit::procstat::run_bench((300, 0), (10, 0), |n, _| run(n));
}

fn pod(name: &str, containers: usize) -> Value {
    let list: Vec<Value> = (0..containers)
        .map(|i| {
            json!({"name": format!("c{i}"),
                   "image": format!("mirror.example.com/team/app{i}:1.0@{DIGEST}")})
        })
        .collect();
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "bench"},
           "spec": {"containers": list}})
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

/// Round trips of `n` dry-run creates of a Pod with `containers` images
/// (the last unpinned when `refused`, which the backstop refuses).
async fn creates(kube: &RealKube, containers: usize, n: usize, refused: bool) -> Vec<Duration> {
    let mut body = pod("p", containers);
    if refused {
        body["spec"]["containers"][containers - 1]["image"] =
            json!("registry.example.com/team/app:1");
    }
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
    let policy = sigil_core::Policy::from_documents_at(POLICY, None).expect("policy");
    let backstop = sigil_core::backstop::generate(
        &policy,
        &sigil_core::backstop::Options {
            namespace: "sigil-system".into(),
        },
    );
    let sizes = [1, 10, 50];
    // Warm up the API server's paths once.
    creates(&kube, 1, 5, false).await;
    let mut without = Vec::new();
    for &c in &sizes {
        without.push(creates(&kube, c, n, false).await);
    }
    kube.apply(&backstop.objects).await;
    // In force once a Pod it refuses is refused.
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        let mut bad = pod("probe", 1);
        bad["spec"]["containers"][0]["image"] = json!("registry.example.com/team/app:1");
        let (status, _) = kube
            .request(
                "POST",
                "/api/v1/namespaces/bench/pods?dryRun=All",
                Some(&bad),
            )
            .await;
        if status == 403 {
            break;
        }
        assert!(Instant::now() < until, "the backstop never came into force");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    creates(&kube, 1, 5, false).await;
    println!(
        "backstop: dry-run Pod creates on kube-apiserver v1.36, {n} per row (policy: 12 rules, 2 mirrors)"
    );
    println!(
        "{:>10} | {:>12} | {:>12} | {:>12} | {:>12} | {:>22}",
        "containers",
        "p50 without",
        "p50 with",
        "p99 without",
        "p99 with",
        "CEL, refused Pod (mean)"
    );
    for (i, &c) in sizes.iter().enumerate() {
        let with = creates(&kube, c, n, false).await;
        // The API server times a policy's check only when it refuses.
        let before = check_seconds(&kube).await;
        creates(&kube, c, n, true).await;
        let after = check_seconds(&kube).await;
        let mean = if after.1 > before.1 {
            Duration::from_secs_f64((after.0 - before.0) / (after.1 - before.1))
        } else {
            Duration::ZERO
        };
        println!(
            "{:>10} | {:>12.2?} | {:>12.2?} | {:>12.2?} | {:>12.2?} | {:>22.2?}",
            c,
            pct(&without[i], 0.5),
            pct(&with, 0.5),
            pct(&without[i], 0.99),
            pct(&with, 0.99),
            mean
        );
    }
}
