//! The node tier at fleet scale (see docs/benchmarks.md): N simulated node
//! syncers in one process against a real kube-apiserver v1.36
//! (`SIGIL_KUBE_ASSETS`; without it the benchmark says so and does
//! nothing). Each syncer is the node's own sync code with its own API
//! client (its own connections, as a node has) and output directory:
//! **before**, the polling read every 30 s (`NodeComposer::read`: a GET of
//! the ConfigMap and a LIST of the ClusterImagePolicies, each node starting
//! at its own offset in the interval); **after**, `sigil_kube::node::watch`
//! (list, then watch).
//!
//! For each N and mode it reports, in steady state, the API server's
//! requests per second (from its own `apiserver_request_total`, all verbs
//! but WATCH, less the benchmark's own reads of `/metrics`) and its CPU
//! (`process_cpu_seconds_total`); then the time from a ClusterImagePolicy
//! edit to each node's new file (p50/p99/max); and memory per syncer (this
//! process's RSS growth over N).
//!
//! `cargo bench -p sigil --bench node_fleet -- --bench` runs N = 100, 500
//! and 1,000 with a 30 s steady window; run without `--bench` (as `cargo
//! test --benches` does) it runs N = 5 with a 6 s window and asserts that
//! the watching syncers make no request in steady state.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sigil_kube::node::{Change, NodeComposer, NodePolicy};
use sigil_testkit::kube::real::{RealKube, assets};

const POLL: Duration = Duration::from_secs(30);
const CM: (&str, &str) = ("sigil-system", "sigil-policy");

fn main() {
    sigil_testkit::procstat::run_bench((0, 30), (1, 6), |full, window| {
        run(full == 0, window as u64)
    });
}

fn now() -> i64 {
    sigil::engine::unix_now()
}

/// Writes a syncer's file (as sync does, atomically) and, when it carries
/// `marker`, records when.
fn wrote(out: &Path, p: &NodePolicy, seen: &Mutex<Vec<(String, Instant)>>) {
    let tmp = out.with_extension("tmp");
    std::fs::write(&tmp, &p.text).expect("write");
    std::fs::rename(&tmp, out).expect("rename");
    if let Some(m) = p.text.split("marker-").nth(1) {
        let m: String = m.chars().take_while(char::is_ascii_digit).collect();
        seen.lock().expect("lock").push((m, Instant::now()));
    }
}

async fn client(kubeconfig: &Path) -> kube::Client {
    let kc = kube::config::Kubeconfig::read_from(kubeconfig).expect("kubeconfig");
    let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .expect("config");
    kube::Client::try_from(cfg).expect("client")
}

/// One syncer as a task: polling (`watching` false) or watching.
fn syncer(
    client: kube::Client,
    out: PathBuf,
    watching: bool,
    offset: Duration,
    seen: Arc<Mutex<Vec<(String, Instant)>>>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        if watching {
            sigil_kube::node::watch(client, CM, true, |c| {
                if let Ok(Change::Composed(p)) = c {
                    wrote(&out, &p, &seen);
                }
            })
            .await;
        } else {
            let mut composer = NodeComposer::default();
            tokio::time::sleep(offset).await;
            let mut last = String::new();
            loop {
                if let Ok(p) = composer.read(&client, CM, true, now()).await
                    && p.text != last
                {
                    wrote(&out, &p, &seen);
                    last = p.text;
                }
                tokio::time::sleep(POLL).await;
            }
        }
    })
}

/// (requests but WATCH, API server CPU seconds) from its `/metrics`.
async fn server_counts(kube: &RealKube) -> (f64, f64) {
    let (_, text) = kube.get_text("/metrics").await;
    let value = |l: &str| {
        l.rsplit(' ')
            .next()
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    let mut requests = 0.0;
    let mut cpu = 0.0;
    for l in text.lines() {
        if l.starts_with("apiserver_request_total{") && !l.contains("verb=\"WATCH\"") {
            requests += value(l);
        } else if l.starts_with("process_cpu_seconds_total ") {
            cpu = value(l);
        }
    }
    (requests, cpu)
}

fn cip(marker: u64) -> Value {
    json!({"apiVersion": "sigil.dev/v1alpha1", "kind": "ClusterImagePolicy",
        "metadata": {"name": "fleet"},
        "spec": {"rules": [{"name": format!("marker-{marker}"),
            "match": ["fleet.example.com/**"], "action": "deny"}]}})
}

fn pct(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

struct Row {
    mode: &'static str,
    n: usize,
    rps: f64,
    requests: f64,
    cpu: f64,
    p50: Duration,
    p99: Duration,
    max: Duration,
    reached: usize,
    kib: f64,
}

async fn round(
    kube: &RealKube,
    kubeconfig: &Path,
    n: usize,
    watching: bool,
    window: u64,
    marker: &mut u64,
) -> Row {
    let dir = tempfile::tempdir().expect("tempdir");
    let me = std::process::id();
    let rss0 = sigil_testkit::procstat::rss_kib(me);
    let seen = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::with_capacity(n);
    for i in 0..n {
        let offset = POLL.mul_f64(i as f64 / n as f64);
        let out = dir.path().join(format!("node-{i}.yaml"));
        tasks.push(syncer(
            client(kubeconfig).await,
            out,
            watching,
            offset,
            seen.clone(),
        ));
    }
    // Every node has the current policy (polling: after one interval).
    let current = marker.to_string();
    let until = Instant::now() + POLL + Duration::from_secs(60);
    while seen
        .lock()
        .expect("lock")
        .iter()
        .filter(|(m, _)| *m == current)
        .count()
        < n
    {
        assert!(
            Instant::now() < until,
            "not every syncer wrote its first file"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let kib = (sigil_testkit::procstat::rss_kib(me).saturating_sub(rss0)) as f64 / n as f64;
    // Steady state.
    let (r0, c0) = server_counts(kube).await;
    tokio::time::sleep(Duration::from_secs(window)).await;
    let (r1, c1) = server_counts(kube).await;
    // The benchmark's own GET of /metrics is counted once in the window.
    let rps = (r1 - r0 - 1.0).max(0.0) / window as f64;
    let requests = r1 - r0 - 1.0;
    let cpu = (c1 - c0) / window as f64;
    // An edit: until every node has it (polling: up to an interval).
    *marker += 1;
    let want = marker.to_string();
    let t0 = Instant::now();
    kube.apply(&[cip(*marker)]).await;
    let until = t0 + POLL + Duration::from_secs(30);
    loop {
        let reached = seen
            .lock()
            .expect("lock")
            .iter()
            .filter(|(m, _)| *m == want)
            .count();
        if reached >= n || Instant::now() > until {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut times: Vec<Duration> = seen
        .lock()
        .expect("lock")
        .iter()
        .filter(|(m, _)| *m == want)
        .map(|(_, t)| t.saturating_duration_since(t0))
        .collect();
    times.sort();
    for t in tasks {
        t.abort();
    }
    Row {
        mode: if watching {
            "watch (after)"
        } else {
            "poll 30 s (before)"
        },
        n,
        rps,
        requests,
        cpu,
        p50: pct(&times, 0.5),
        p99: pct(&times, 0.99),
        max: times.last().copied().unwrap_or_default(),
        reached: times.len(),
        kib,
    }
}

async fn run(full: bool, window: u64) {
    let assets = match assets() {
        Ok(a) => a,
        Err(why) => {
            println!("node_fleet benchmark skipped: {why}");
            return;
        }
    };
    let kube = RealKube::start(&assets).await;
    let crds = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../deploy/kustomize/base/crds/policies.yaml"),
    )
    .expect("CRDs");
    let crds: Vec<Value> = sigil_core::manifest::parse_stream(&crds)
        .expect("CRDs parse")
        .into_iter()
        .map(|d| d.to_value())
        .collect();
    kube.apply(&crds).await;
    kube.namespaces(&[CM.0]).await;
    let policy = "apiVersion: sigil.dev/v1alpha1\nkind: ImagePolicy\nmetadata: {name: cluster}\nspec:\n  rules:\n    - {name: all, match: [\"**\"], mode: warn}\n";
    kube.apply(&[json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": CM.1, "namespace": CM.0}, "data": {"policy.yaml": policy}})])
        .await;
    let mut marker = 1;
    // The CRD serves once a ClusterImagePolicy can be applied.
    kube.apply(&[cip(marker)]).await;
    let kubeconfig = kube.admin_kubeconfig();
    // What the API server does with no syncer at all (its own leases and
    // controllers): subtracted from every row.
    let (r0, c0) = server_counts(&kube).await;
    tokio::time::sleep(Duration::from_secs(window)).await;
    let (r1, c1) = server_counts(&kube).await;
    let (bg_requests, bg_cpu) = (r1 - r0 - 1.0, (c1 - c0) / window as f64);
    let ns: &[usize] = if full { &[100, 500, 1000] } else { &[5] };
    let mut rows = Vec::new();
    for &n in ns {
        for watching in [false, true] {
            if !full && !watching {
                continue;
            }
            rows.push(round(&kube, &kubeconfig, n, watching, window, &mut marker).await);
        }
    }
    println!(
        "node_fleet: simulated node syncers on kube-apiserver v1.36, steady window {window} s\n"
    );
    println!(
        "no syncer: {bg_requests} requests in {window} s ({:.2}/s), {bg_cpu:.3} cores (subtracted below)\n",
        bg_requests / window as f64
    );
    println!(
        "| sync | nodes | API requests/s (steady) | API server CPU (cores, steady) | edit → node file p50 / p99 / max | nodes reached | memory per syncer |"
    );
    println!("|---|---|---|---|---|---|---|");
    for r in &rows {
        println!(
            "| {} | {} | {:.2} | {:.3} | {:.2?} / {:.2?} / {:.2?} | {} / {} | {:.0} KiB |",
            r.mode,
            r.n,
            (r.rps - bg_requests / window as f64).max(0.0),
            (r.cpu - bg_cpu).max(0.0),
            r.p50,
            r.p99,
            r.max,
            r.reached,
            r.n,
            r.kib
        );
    }
    println!();
    for r in &rows {
        let own = (r.requests - bg_requests).max(0.0);
        let at_5000 = own / window as f64 * 5000.0 / r.n as f64;
        println!(
            "{} {} nodes: {own} requests in {window} s beyond the API server's own; at 5,000 nodes ≈ {at_5000:.1} requests/s",
            r.n, r.mode
        );
        if !full && r.mode.starts_with("watch") {
            // Bookmarks are watch events, not requests; a relist or a poll
            // would be (the window's noise is the API server's own: ±2).
            assert!(
                own <= 2.0,
                "watching syncers made {own} requests in {window} s of steady state"
            );
            assert_eq!(r.reached, r.n, "an edit did not reach every node");
        }
    }
}
