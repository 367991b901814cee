//! Zero-loss rollout, modelled on the Gatekeeper #3776 reproduction: a TCP
//! balancer that routes only to replicas whose `/readyz` is 200 and learns
//! about changes with a lag (like Service endpoint propagation); clients that
//! open a fresh connection per request (1 s connect timeout) and one that
//! keeps its connection alive; a restart loop that starts a new replica, waits
//! for Ready, and SIGTERMs the old one.
//!
//! `SIGIL_DRAIN_RESTARTS` sets the number of restarts (default 30; the soak in
//! docs/operations.md uses 100).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::json;

use crate::support::review::review;
use crate::support::sigil::Sigil;

const LAG: Duration = Duration::from_millis(1000);

/// Each change of the routed endpoint list, and when.
type History = Arc<Mutex<Vec<(Duration, Vec<SocketAddr>)>>>;

/// Routes each new TCP connection to a replica in its endpoint list.
struct Balancer {
    addr: SocketAddr,
    /// The clock every time in a failure report is read from.
    started: Instant,
    /// Connections dropped because no endpoint was published, and when.
    dropped: Arc<Mutex<Vec<Duration>>>,
    /// The endpoint list connections are routed by now.
    endpoints: Arc<Mutex<Vec<SocketAddr>>>,
    /// Every change of the routed list, and when (to tell, when requests
    /// fail, which replica was routed to and since when).
    published: History,
    /// Routed connections that failed at the replica's end: when, to which
    /// replica, and how (connect refused or timed out, or reset mid-copy).
    failed: Arc<Mutex<Vec<(Duration, SocketAddr, String)>>>,
    /// (webhook addr, admin addr) of every replica that exists.
    replicas: Arc<Mutex<Vec<(SocketAddr, SocketAddr)>>>,
    stop: Arc<AtomicBool>,
}

impl Balancer {
    /// Waits (at most 10 s) until connections are routed to `hook`.
    async fn wait_routed(&self, hook: SocketAddr) {
        let until = Instant::now() + Duration::from_secs(10);
        while !self.endpoints.lock().unwrap().contains(&hook) {
            assert!(Instant::now() < until, "balancer never published {hook}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    async fn start() -> Balancer {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let replicas: Arc<Mutex<Vec<(SocketAddr, SocketAddr)>>> = Arc::default();
        let endpoints: Arc<Mutex<Vec<SocketAddr>>> = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let started = Instant::now();
        let history: History = Arc::default();
        // Endpoint controller: probe /readyz every 100 ms, publish after LAG.
        {
            let (replicas, endpoints, stop, history) = (
                replicas.clone(),
                endpoints.clone(),
                stop.clone(),
                history.clone(),
            );
            let published: Arc<Mutex<Vec<SocketAddr>>> = Arc::default();
            tokio::spawn(async move {
                // A fresh connection per probe, like the kubelet: a pooled
                // keep-alive connection to an exited replica whose port a new
                // replica reused would fail the new replica's probe, empty the
                // endpoint list and drop ~100 ms of requests (what made the
                // 100-restart soak flaky).
                let http = reqwest::Client::builder()
                    .timeout(Duration::from_secs(1))
                    .pool_max_idle_per_host(0)
                    .build()
                    .unwrap();
                // Like a readiness probe with failureThreshold 1 for a 503
                // answer (sigil's drain signal) and 3 for probes that time out
                // or cannot connect (a busy CI machine must not empty the list).
                let mut misses: std::collections::HashMap<SocketAddr, u32> = Default::default();
                while !stop.load(Ordering::SeqCst) {
                    let snapshot = replicas.lock().unwrap().clone();
                    let mut ready = Vec::new();
                    for (hook, admin) in snapshot {
                        let ok = match http.get(format!("http://{admin}/readyz")).send().await {
                            Ok(r) if r.status() == 200 => Some(true),
                            Ok(_) => Some(false),
                            Err(_) => None,
                        };
                        let m = misses.entry(hook).or_insert(0);
                        match ok {
                            Some(true) => *m = 0,
                            Some(false) => *m = 3,
                            None => *m += 1,
                        }
                        // Never seen ready → not ready until it answers 200.
                        if *m < 3 && (ok == Some(true) || published.lock().unwrap().contains(&hook))
                        {
                            ready.push(hook);
                        }
                    }
                    let (endpoints, history) = (endpoints.clone(), history.clone());
                    *published.lock().unwrap() = ready.clone();
                    tokio::spawn(async move {
                        tokio::time::sleep(LAG).await;
                        let mut routed = endpoints.lock().unwrap();
                        if *routed != ready {
                            history
                                .lock()
                                .unwrap()
                                .push((started.elapsed(), ready.clone()));
                        }
                        *routed = ready;
                    });
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            });
        }
        let rr = Arc::new(AtomicUsize::new(0));
        let routed = endpoints.clone();
        let dropped: Arc<Mutex<Vec<Duration>>> = Arc::default();
        let dropped_log = dropped.clone();
        let failed: Arc<Mutex<Vec<(Duration, SocketAddr, String)>>> = Arc::default();
        let failed_log = failed.clone();
        tokio::spawn(async move {
            loop {
                let Ok((mut inbound, _)) = l.accept().await else {
                    return;
                };
                let eps = endpoints.lock().unwrap().clone();
                if eps.is_empty() {
                    // Dropped: the client sees a reset, counted as a failure.
                    dropped_log.lock().unwrap().push(started.elapsed());
                    continue;
                }
                let target = eps[rr.fetch_add(1, Ordering::Relaxed) % eps.len()];
                let failed_log = failed_log.clone();
                tokio::spawn(async move {
                    let failure = match tokio::time::timeout(
                        Duration::from_secs(1),
                        tokio::net::TcpStream::connect(target),
                    )
                    .await
                    {
                        Ok(Ok(mut out)) => tokio::io::copy_bidirectional(&mut inbound, &mut out)
                            .await
                            .err()
                            .map(|e| format!("while copying: {e}")),
                        Ok(Err(e)) => Some(format!("connect: {e}")),
                        Err(_) => Some("connect: timed out".to_string()),
                    };
                    if let Some(f) = failure {
                        failed_log
                            .lock()
                            .unwrap()
                            .push((started.elapsed(), target, f));
                    }
                });
            }
        });
        Balancer {
            addr,
            started,
            dropped,
            endpoints: routed,
            published: history,
            failed,
            replicas,
            stop,
        }
    }
}

impl Drop for Balancer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

#[derive(Default)]
struct Tally {
    /// When the first request failed (on the balancer's clock).
    first_failure: std::sync::OnceLock<Duration>,
    ok: AtomicUsize,
    failed: AtomicUsize,
    errors: Mutex<Vec<String>>,
}

impl Tally {
    fn record(&self, r: Result<(), String>) {
        match r {
            Ok(()) => self.ok.fetch_add(1, Ordering::Relaxed),
            Err(e) => {
                let mut errs = self.errors.lock().unwrap();
                if errs.len() < 400 {
                    errs.push(e);
                }
                self.failed.fetch_add(1, Ordering::Relaxed)
            }
        };
    }
}

async fn call(client: &reqwest::Client, url: &str, n: usize) -> Result<(), String> {
    let mut rev = review(
        "CREATE",
        "default",
        json!({"kind": "ConfigMap", "metadata": {"name": "x"}}),
    );
    rev["request"]["uid"] = json!(format!("drain-{n}"));
    let r = client
        .post(url)
        .body(serde_json::to_vec(&rev).unwrap())
        .send()
        .await
        .map_err(|e| format!("{e:?}"))?;
    if r.status() != 200 {
        return Err(format!("status {}", r.status()));
    }
    let v: serde_json::Value = serde_json::from_slice(&r.bytes().await.map_err(|e| e.to_string())?)
        .map_err(|e| e.to_string())?;
    if v["response"]["uid"] != json!(format!("drain-{n}")) {
        return Err("uid not echoed".into());
    }
    Ok(())
}

/// Runs `restarts` rolling restarts behind the balancer; returns (ok, failed).
async fn rollout(restarts: usize, shutdown_delay: &str) -> (usize, usize, Vec<String>) {
    let dir = tempfile::tempdir().unwrap();
    let (ca, crt, k) = crate::support::registry::test_cert_files(dir.path());
    let args = [
        "--tls-cert",
        crt.as_str(),
        "--tls-key",
        k.as_str(),
        "--shutdown-delay",
        shutdown_delay,
    ];

    let lb = Balancer::start().await;
    let first = Sigil::start(None, &args).await;
    lb.replicas.lock().unwrap().push((first.addr, first.admin));
    // Wait until the balancer routes to it.
    tokio::time::sleep(LAG + Duration::from_millis(300)).await;

    let url = format!("https://localhost:{}/mutate?timeout=5s", lb.addr.port());
    let tally = Arc::new(Tally::default());
    let stop = Arc::new(AtomicBool::new(false));
    let t0 = lb.started;
    let mut clients = Vec::new();
    // Workers 0-1: a fresh connection per request. Worker 2: one keep-alive
    // HTTP/2 connection (what kube-apiserver uses). Worker 3: keep-alive HTTP/1.1.
    for worker in 0..4 {
        let keep_alive = worker >= 2;
        let (tally, stop, url, ca) = (tally.clone(), stop.clone(), url.clone(), ca.clone());
        clients.push(tokio::spawn(async move {
            let t0 = t0;
            let mut b = reqwest::Client::builder()
                .tls_certs_only([reqwest::Certificate::from_pem(ca.as_bytes()).unwrap()])
                .connect_timeout(Duration::from_secs(1))
                .timeout(Duration::from_secs(5));
            if !keep_alive {
                b = b.pool_max_idle_per_host(0);
            }
            if worker == 3 {
                b = b.http1_only();
            }
            let client = b.build().unwrap();
            let mut n = worker * 1_000_000;
            while !stop.load(Ordering::SeqCst) {
                let r = call(&client, &url, n).await;
                if r.is_err() {
                    tally.first_failure.get_or_init(|| t0.elapsed());
                    // Do not spin on instant failures (the control run has many).
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
                tally.record(r.map_err(|e| {
                    format!(
                        "worker {worker} (keep-alive: {keep_alive}) at {:?}: {e}",
                        t0.elapsed()
                    )
                }));
                n += 1;
            }
        }));
    }

    let mut current = first;
    let mut terminated = Vec::new();
    let mut terminations: Vec<(Duration, SocketAddr)> = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(300);
    for _ in 0..restarts {
        assert!(Instant::now() < deadline, "rollout took too long");
        let next = Sigil::start(None, &args).await;
        lb.replicas.lock().unwrap().push((next.addr, next.admin));
        // The old replica goes only once the new one receives traffic, as
        // with several replicas behind a Service (sigil's Deployment runs 3
        // with maxUnavailable 0). Without this wait the single-replica model
        // here has a ~100 ms window where the old replica's 503 is published
        // one probe round before the new replica's 200, and the balancer has
        // nowhere to route: a harness gap, not a drain failure.
        lb.wait_routed(next.addr).await;
        // Like a Deployment rollout: the old pod is terminated once the new one is Ready.
        let old = std::mem::replace(&mut current, next);
        eprintln!("{:?}: terminate {}", t0.elapsed(), old.addr);
        terminations.push((t0.elapsed(), old.addr));
        old.terminate();
        terminated.push(old);
        // Keep the replica set small: reap replicas that have exited.
        terminated.retain_mut(|s| !s.exited());
        let alive: Vec<_> = terminated
            .iter()
            .map(|s| s.addr)
            .chain([current.addr])
            .collect();
        lb.replicas
            .lock()
            .unwrap()
            .retain(|(a, _)| alive.contains(a));
        tokio::time::sleep(LAG + Duration::from_millis(200)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.store(true, Ordering::SeqCst);
    for c in clients {
        let _ = c.await;
    }
    for s in &mut terminated {
        s.wait_exit(Duration::from_secs(15));
    }
    let mut errors = tally.errors.lock().unwrap().clone();
    if tally.failed.load(Ordering::SeqCst) > 0 {
        // Which side closed: the replicas the failed connections were routed
        // to, when each list was routed by, and when each replica was told to go.
        let first = tally.first_failure.get().copied().unwrap_or_default();
        let window = first.saturating_sub(LAG * 3)..first + LAG * 3;
        let near = |t: &Duration| window.contains(t);
        let failed: Vec<_> = lb
            .failed
            .lock()
            .unwrap()
            .iter()
            .filter(|f| near(&f.0))
            .cloned()
            .collect();
        errors.insert(
            0,
            format!(
                "routed connections that failed at the replica near the first lost request \
                 (first 20 of {}): {:?}; \
                 routed lists near them: {:?}; terminated near them: {:?}",
                failed.len(),
                &failed[..failed.len().min(20)],
                lb.published
                    .lock()
                    .unwrap()
                    .iter()
                    .filter(|(t, _)| near(t))
                    .collect::<Vec<_>>(),
                terminations
                    .iter()
                    .filter(|(t, _)| near(t))
                    .collect::<Vec<_>>(),
            ),
        );
    }
    let dropped = lb.dropped.lock().unwrap().clone();
    if !dropped.is_empty() {
        // Tells a test-harness gap (no endpoint published) from a sigil failure.
        errors.insert(
            0,
            format!(
                "balancer had no endpoint for {} connections (first at {:?}, last at {:?})",
                dropped.len(),
                dropped[0],
                dropped[dropped.len() - 1]
            ),
        );
    }
    (
        tally.ok.load(Ordering::SeqCst),
        tally.failed.load(Ordering::SeqCst),
        errors,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rolling_restarts_lose_zero_requests() {
    let restarts = std::env::var("SIGIL_DRAIN_RESTARTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(30);
    let started = Instant::now();
    let (ok, failed, errors) = rollout(restarts, "3s").await;
    eprintln!(
        "drain: {restarts} restarts in {:?}: {ok} requests ok, {failed} failed",
        started.elapsed()
    );
    assert!(
        ok > restarts * 10,
        "too few requests to mean anything: {ok}"
    );
    assert_eq!(
        failed, 0,
        "requests lost during rolling restarts: {errors:?}"
    );
}

/// The control: without the drain delay, the same rollout loses requests,
/// which is what the test above would catch if the drain regressed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_shutdown_delay_requests_are_lost() {
    let (ok, failed, _) = rollout(8, "0s").await;
    eprintln!("no drain: {ok} ok, {failed} failed");
    assert!(
        failed > 0,
        "expected failures with --shutdown-delay 0 ({ok} ok)"
    );
}

/// SIGTERM: /readyz is 503 at once while /mutate still answers (with
/// `Connection: close` on HTTP/1.1); a second signal exits at once, status 0.
#[tokio::test]
async fn sigterm_turns_unready_at_once_and_keeps_serving_until_the_delay() {
    let mut s = Sigil::start(None, &["--shutdown-delay", "30s"]).await;
    s.terminate();
    let until = Instant::now() + Duration::from_millis(500);
    loop {
        let r = reqwest::get(format!("http://{}/readyz", s.admin))
            .await
            .unwrap();
        if r.status() == 503 {
            assert!(r.text().await.unwrap().contains("draining"));
            break;
        }
        assert!(Instant::now() < until, "/readyz still 200 after SIGTERM");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let api = s.apiserver();
    let h1 = reqwest::Client::builder()
        .tls_certs_only([reqwest::Certificate::from_pem(s.ca_pem.as_bytes()).unwrap()])
        .http1_only()
        .build()
        .unwrap();
    let body =
        serde_json::to_vec(&review("CREATE", "default", json!({"kind": "ConfigMap"}))).unwrap();
    let r = h1.post(&api.url).body(body).send().await.unwrap();
    assert_eq!(r.status(), 200, "still serving during the drain");
    assert_eq!(
        r.headers().get("connection").and_then(|v| v.to_str().ok()),
        Some("close")
    );
    let started = Instant::now();
    s.terminate();
    s.wait_exit(Duration::from_secs(5));
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "second signal must exit at once"
    );
}
