//! A rollout's first minute at a registry's distance: the real registry
//! (htpasswd Basic auth, on HTTPS as registries at a distance are — HTTP/2
//! where the client asks; `BENCH_BURST_TRANSPORT=http` for plain HTTP/1.1)
//! behind [`crate::proxy`] at RTT 0, 50 and 150 ms;
//! images signed keyless by the test kit's Sigstore (half as cosign `.sig`
//! with certificate and Rekor bundle, half as a Sigstore bundle in the
//! referrers tag schema), and key-signed ones to compare.
//!
//! Per RTT, against a fresh sigil (no cache, no learned host): the **cold
//! sequence** (one never-seen image at a time, keyless and key-signed:
//! latency ÷ RTT is its round trips), the **floor** (the same dependent
//! requests issued directly on a warm connection), and the **burst** (Pods
//! offered at a steady rate over 64 connections, each image 10 times in
//! shuffled order), with one replica and with three behind a round-robin
//! client. Counted (from each replica's `/metrics`): admissions over the
//! webhook's 10 s timeout, registry requests per image, capability probes
//! per host (`sigil_registry_probes_total`: auth, referrers), verifications
//! per digest per replica, server CPU.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde_json::Value;
use sigil_testkit::procstat::cpu_total;
use sigil_testkit::registry::{Mode, TestRegistry, free_port};
use sigil_testkit::review::pod_review_bytes as review;
use sigil_testkit::sigil::wait_http;
use sigil_testkit::signing::{Layer, Signer, Sigstore, push_legacy, push_referrer, simple_signing};

use crate::client::{client_tls, pct};
use crate::proxy;

const SUBJECT: &str = "https://github.com/acme/app/.github/workflows/release.yml@refs/heads/main";
const ISSUER: &str = "https://token.actions.githubusercontent.com";
const BUNDLE: &str = "application/vnd.dev.sigstore.bundle.v0.3+json";
const USER: &str = "bench";
const PASSWORD: &str = "bench-password";
/// The API server's default webhook timeout.
const TIMEOUT: Duration = Duration::from_secs(10);

pub struct Size {
    pub rtts: Vec<u64>,
    /// Distinct keyless images in a burst (each offered `pods_per_image` times).
    pub images: usize,
    pub pods_per_image: usize,
    /// Over how long the burst's Pods are offered.
    pub offered_over: Duration,
    pub connections: usize,
    /// Images admitted one at a time for the cold sequence (each kind).
    pub sequential: usize,
    pub replicas: Vec<usize>,
}

/// One burst's figures.
pub struct Burst {
    pub rtt: u64,
    pub replicas: usize,
    /// Whether each replica had talked to the registry before (a live
    /// connection, its probes answered) — a webhook that has been serving.
    pub warm_host: bool,
    pub admissions: usize,
    pub p50: Duration,
    pub p99: Duration,
    pub max: Duration,
    pub over_timeout: usize,
    pub requests_per_image: f64,
    pub probes: u64,
    /// Referrers API requests (this registry has none: each is the probe
    /// that learns so).
    pub referrers: u64,
    /// Connections sigil opened to the registry.
    pub connections: u64,
    /// Verifications per digest each replica was asked about (exactly 1
    /// when single-flight holds), and server CPU in all.
    pub verifications_per_digest: f64,
    pub cpu: Duration,
    /// The registry's CPU over the burst.
    pub registry_cpu: Duration,
}

/// One RTT's cold sequence and floor.
pub struct Cold {
    pub rtt: u64,
    pub keyless_p50: Duration,
    pub keyed_p50: Duration,
    pub floor_keyless: Duration,
    pub floor_keyed: Duration,
}

struct World {
    registry: TestRegistry,
    /// `https` or `http`.
    scheme: &'static str,
    ca_pem: Option<String>,
    proxy: proxy::Proxy,
    rtt: Arc<std::sync::atomic::AtomicU64>,
    dir: tempfile::TempDir,
    host: String,
    /// (image reference, digest): the burst's keyless images.
    keyless: Vec<(String, String)>,
    /// Sequential cold images: keyless and key-signed.
    seq_keyless: Vec<(String, String)>,
    seq_keyed: Vec<(String, String)>,
}

pub async fn run(size: &Size, auth: Auth) -> (Vec<Cold>, Vec<Burst>) {
    let w = setup(size, auth).await;
    let mut colds = Vec::new();
    let mut bursts = Vec::new();
    for &rtt in &size.rtts {
        w.rtt.store(rtt, Ordering::Relaxed);
        // The cold sequence, on a fresh sigil.
        let sigils = start_sigils(&w, 1).await;
        let lat = |v: &mut Vec<Duration>| {
            v.sort();
            pct(v, 0.5)
        };
        let mut sender = crate::client::connect(sigils[0].addr, sigils[0].tls.clone()).await;
        let mut keyless = Vec::new();
        let mut keyed = Vec::new();
        for (images, out) in [(&w.seq_keyless, &mut keyless), (&w.seq_keyed, &mut keyed)] {
            for (image, _) in images {
                let t = Instant::now();
                let answer = crate::client::send(&mut sender, review(&[image])).await;
                out.push(t.elapsed());
                assert_allowed(&answer, image);
            }
        }
        drop(sigils);
        let (floor_keyless, floor_keyed) = floor(&w).await;
        colds.push(Cold {
            rtt,
            keyless_p50: lat(&mut keyless),
            keyed_p50: lat(&mut keyed),
            floor_keyless,
            floor_keyed,
        });
        for &replicas in &size.replicas {
            for warm_host in [false, true] {
                bursts.push(burst(&w, size, rtt, replicas, warm_host).await);
            }
        }
    }
    (colds, bursts)
}

fn assert_allowed(answer: &[u8], image: &str) {
    let v: Value = serde_json::from_slice(answer).expect("review answer");
    assert_eq!(
        v["response"]["allowed"], true,
        "{image} was not admitted (this would measure denials): {v}"
    );
}

/// How the registry asks to be authenticated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Auth {
    /// htpasswd Basic (bcrypt, checked by the registry on every request).
    Basic,
    /// None: anonymous pulls.
    Anonymous,
}

async fn setup(size: &Size, auth: Auth) -> World {
    let dir = tempfile::tempdir().expect("tmp");
    let tls = std::env::var("BENCH_BURST_TRANSPORT").as_deref() != Ok("http");
    let basic = auth == Auth::Basic;
    let registry = TestRegistry::start(match (tls, basic) {
        (true, true) => Mode::TlsHtpasswd {
            user: USER,
            password: PASSWORD,
        },
        (false, true) => Mode::Htpasswd {
            user: USER,
            password: PASSWORD,
        },
        (true, false) => Mode::Tls,
        (false, false) => Mode::Plain,
    })
    .await;
    let ca_pem = registry.ca_pem.clone();
    if let Some(ca) = &ca_pem {
        std::fs::write(dir.path().join("registry-ca.pem"), ca).expect("ca");
    }
    let transport = match &ca_pem {
        Some(_) => format!("ca: \"{}\"", dir.path().join("registry-ca.pem").display()),
        None => "insecure: true".to_owned(),
    };
    let upstream: SocketAddr = registry.host().parse().expect("registry addr");
    let rtt = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let proxy = proxy::start(upstream, rtt.clone()).await;
    let host = proxy.addr.to_string();
    let sigstore = Sigstore::new();
    let root = sigstore.write_trusted_root(dir.path());
    let key = Signer::p256();
    std::fs::write(dir.path().join("cosign.pub"), key.public_pem()).expect("key");
    std::fs::write(dir.path().join("password"), PASSWORD).expect("password");
    let now = i64::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock")
            .as_secs(),
    )
    .expect("now");
    let mut keyless = Vec::new();
    let mut seq_keyless = Vec::new();
    let mut seq_keyed = Vec::new();
    let total = size.images + size.sequential;
    for i in 0..total {
        // Ten repositories, the rest tags: scopes and tags both vary.
        let repo = format!("keyless/app{}", i % 10);
        let tag = format!("k{i}");
        let d = registry.push_image(&repo, &tag).await;
        if i % 2 == 0 {
            let payload = simple_signing(&format!("{host}/{repo}"), &d);
            let k = sigstore.sign(&payload, SUBJECT, ISSUER, now - 60, now - 30, None);
            push_legacy(&registry, &repo, &d, vec![k.layer(payload)]).await;
        } else {
            let b = sigstore.rekor_v2_bundle(&d, SUBJECT, ISSUER, now - 60, now - 30);
            let size = registry.manifest_size(&repo, &d).await;
            let bytes = serde_json::to_vec(&b).expect("bundle");
            push_referrer(&registry, &repo, &d, size, BUNDLE, BUNDLE, &bytes).await;
        }
        let image = (format!("{host}/{repo}:{tag}"), d);
        if i < size.images {
            keyless.push(image);
        } else {
            seq_keyless.push(image);
        }
    }
    for i in 0..size.sequential {
        let repo = format!("keyed/app{}", i % 10);
        let tag = format!("s{i}");
        let d = registry.push_image(&repo, &tag).await;
        let payload = simple_signing(&format!("{host}/{repo}"), &d);
        let sig = key.sign(&payload);
        push_legacy(&registry, &repo, &d, vec![Layer::new(payload, &sig)]).await;
        seq_keyed.push((format!("{host}/{repo}:{tag}"), d));
    }
    // `BENCH_BURST_SLOTS=N`: the host's request slots set in the policy
    // (without: sigil's default), to see what the default costs.
    let slots = std::env::var("BENCH_BURST_SLOTS")
        .map(|n| format!(", maxConcurrentRequests: {n}"))
        .unwrap_or_default();
    let creds = if basic {
        format!(
            ", auth: {{username: {USER}, passwordFile: \"{}\"}}",
            dir.path().join("password").display()
        )
    } else {
        String::new()
    };
    let policy = format!(
        "apiVersion: sigil.dev/v1alpha1\nkind: ImagePolicy\nspec:\n  registries:\n    - {{host: \"{host}\", {transport}{creds}{slots}}}\n  rules:\n    - name: keyless\n      match: [\"{host}/keyless/**\"]\n      verify:\n        - name: ci\n          cosign:\n            keyless: {{issuer: \"{ISSUER}\", subject: \"{SUBJECT}\"}}\n            trustedRoot: \"{}\"\n    - name: keyed\n      match: [\"{host}/keyed/**\"]\n      verify: [{{name: key, cosign: {{key: \"{}\"}}}}]\n",
        root.display(),
        dir.path().join("cosign.pub").display()
    );
    std::fs::write(dir.path().join("policy.yaml"), policy).expect("policy");
    World {
        registry,
        scheme: if tls { "https" } else { "http" },
        ca_pem,
        proxy,
        rtt,
        dir,
        host,
        keyless,
        seq_keyless,
        seq_keyed,
    }
}

struct Replica {
    proc: sigil_testkit::sigil::KillOnDrop,
    addr: SocketAddr,
    admin: u16,
    tls: Arc<rustls::ClientConfig>,
}

async fn start_sigils(w: &World, n: usize) -> Vec<Replica> {
    let mut out = Vec::new();
    for i in 0..n {
        let (port, admin) = (free_port(), free_port());
        let ca = w.dir.path().join(format!("ca-{i}-{port}.pem"));
        let proc = crate::spawn_sigil(&w.dir.path().join("policy.yaml"), &ca, port, admin);
        wait_http(&format!("http://127.0.0.1:{admin}/readyz")).await;
        out.push(Replica {
            proc,
            addr: format!("127.0.0.1:{port}").parse().expect("addr"),
            admin,
            tls: client_tls(&std::fs::read(&ca).expect("ca")),
        });
    }
    out
}

/// The burst against `replicas` fresh sigils.
async fn burst(w: &World, size: &Size, rtt: u64, replicas: usize, warm_host: bool) -> Burst {
    let sigils = start_sigils(w, replicas).await;
    // A serving webhook has talked to the registry before: one image of
    // each signature kind through each replica (not among the burst's).
    let mut senders = Vec::new();
    for s in &sigils {
        let mut sender = crate::client::connect(s.addr, s.tls.clone()).await;
        if warm_host {
            for (image, _) in w.seq_keyless.iter().take(2) {
                let answer = crate::client::send(&mut sender, review(&[image])).await;
                assert_allowed(&answer, image);
            }
        }
        senders.push(sender);
    }
    drop(senders);
    let before = counters(&sigils).await;
    let conns0 = w.proxy.counts.connections.load(Ordering::Relaxed);
    let reg_cpu0 = cpu_total(w.registry.pid());
    let cpu0: Vec<Duration> = sigils.iter().map(|s| cpu_total(s.proc.0.id())).collect();
    // Each image `pods_per_image` times, shuffled (a fixed LCG: the same
    // order every run).
    let mut order: Vec<usize> = (0..w.keyless.len())
        .flat_map(|i| std::iter::repeat_n(i, size.pods_per_image))
        .collect();
    let mut s: u64 = 0x9e37_79b9_7f4a_7c15;
    for i in (1..order.len()).rev() {
        s = s
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        order.swap(i, (s >> 33) as usize % (i + 1));
    }
    let bodies: Arc<Vec<Vec<u8>>> =
        Arc::new(order.iter().map(|&i| review(&[&w.keyless[i].0])).collect());
    let total = bodies.len();
    // Which images each replica is asked about (connection c → replica
    // c mod n; request i → the connection that takes it): filled below.
    let seen: Arc<std::sync::Mutex<Vec<std::collections::BTreeSet<usize>>>> =
        Arc::new(std::sync::Mutex::new(vec![
            Default::default();
            sigils.len()
        ]));
    let order = Arc::new(order);
    let gap = size.offered_over / total.max(1) as u32;
    let next = Arc::new(AtomicUsize::new(0));
    let started = tokio::time::Instant::now();
    let mut tasks = Vec::new();
    for c in 0..size.connections {
        let replica = c % sigils.len();
        let r = &sigils[replica];
        let (addr, tls, bodies, next) = (r.addr, r.tls.clone(), bodies.clone(), next.clone());
        let (seen, order) = (seen.clone(), order.clone());
        tasks.push(tokio::spawn(async move {
            let mut sender = crate::client::connect(addr, tls).await;
            let mut lat = Vec::new();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= total {
                    break;
                }
                tokio::time::sleep_until(started + gap * i as u32).await;
                seen.lock().expect("seen")[replica].insert(order[i]);
                let t = Instant::now();
                let answer = crate::client::send(&mut sender, bodies[i].clone()).await;
                lat.push(t.elapsed());
                if std::env::var_os("BENCH_BURST_DEBUG").is_some() {
                    eprintln!(
                        "burst-req {} {} {:.3} {:.3}",
                        i,
                        order[i],
                        (t - started.into_std()).as_secs_f64(),
                        t.elapsed().as_secs_f64()
                    );
                }
                assert_allowed(&answer, "a burst image");
            }
            lat
        }));
    }
    let mut all = Vec::with_capacity(total);
    for t in tasks {
        all.extend(t.await.expect("worker"));
    }
    all.sort();
    let cpu: Duration = sigils
        .iter()
        .zip(&cpu0)
        .map(|(s, c0)| cpu_total(s.proc.0.id()).saturating_sub(*c0))
        .sum();
    let after = counters(&sigils).await;
    let (verified, requests, probes, referrers) = (
        after[0] - before[0],
        after[1] - before[1],
        after[2] - before[2],
        after[3] - before[3],
    );
    let digests = w.keyless.len() as f64;
    let asked: usize = seen.lock().expect("seen").iter().map(|s| s.len()).sum();
    Burst {
        rtt,
        replicas,
        warm_host,
        admissions: all.len(),
        p50: pct(&all, 0.5),
        p99: pct(&all, 0.99),
        max: all.last().copied().unwrap_or_default(),
        over_timeout: all.iter().filter(|d| **d >= TIMEOUT).count(),
        requests_per_image: requests as f64 / digests,
        probes,
        referrers,
        connections: w.proxy.counts.connections.load(Ordering::Relaxed) - conns0,
        registry_cpu: cpu_total(w.registry.pid()).saturating_sub(reg_cpu0),
        verifications_per_digest: verified as f64 / asked.max(1) as f64,
        cpu,
    }
}

/// Over all replicas: verifications passed, registry requests, auth
/// probes, referrers probes.
async fn counters(sigils: &[Replica]) -> [u64; 4] {
    let mut out = [0; 4];
    for s in sigils {
        out[0] += crate::metric_sum(
            s.admin,
            "sigil_signature_verifications_total{verifier=\"ci\",result=\"passed\"}",
        )
        .await;
        out[1] += crate::metric_sum(s.admin, "sigil_registry_requests_total").await;
        out[2] +=
            crate::metric_with(s.admin, "sigil_registry_probes_total{", "kind=\"auth\"").await;
        out[3] += crate::metric_with(
            s.admin,
            "sigil_registry_probes_total{",
            "kind=\"referrers\"",
        )
        .await;
    }
    out
}

/// The floor for one cold image of each kind: its dependent requests
/// issued directly through the proxy on warm connections, credentials
/// sent at once. Keyless `.sig`: HEAD tag → GET `.sig` manifest and the
/// referrers tag-schema index → GET the payload blob. Keyless bundle: HEAD
/// → GET the tag-schema index (and `.sig`, 404) → GET the referrer
/// manifest → GET its bundle blob. Key-signed: as `.sig`. The p50 of a few.
async fn floor(w: &World) -> (Duration, Duration) {
    let mut http = reqwest::Client::builder().pool_max_idle_per_host(16);
    if let Some(ca) = &w.ca_pem {
        http = http.tls_certs_only([reqwest::Certificate::from_pem(ca.as_bytes()).expect("ca")]);
    }
    let http = http.build().expect("client");
    let base = format!("{}://{}", w.scheme, w.host);
    // Warm connections (as sigil's are after its first requests).
    let warm = (0..4).map(|_| {
        http.get(format!("{base}/v2/"))
            .basic_auth(USER, Some(PASSWORD))
            .send()
    });
    futures_util::future::join_all(warm).await;
    let get = |path: String, head: bool| {
        let req = if head {
            http.head(format!("{base}{path}"))
        } else {
            http.get(format!("{base}{path}"))
        };
        req.basic_auth(USER, Some(PASSWORD))
            .header("accept", "application/vnd.oci.image.manifest.v1+json, application/vnd.oci.image.index.v1+json")
            .send()
    };
    let mut keyless = Vec::new();
    let mut keyed = Vec::new();
    let picks = w
        .seq_keyless
        .iter()
        .take(4)
        .map(|i| (i, true))
        .chain(w.seq_keyed.iter().take(4).map(|i| (i, false)));
    for ((image, digest), is_keyless) in picks {
        let (repo_tag, _) = image.split_once('@').unwrap_or((image, ""));
        let path = repo_tag
            .strip_prefix(&format!("{}/", w.host))
            .expect("host");
        let (repo, tag) = path.rsplit_once(':').expect("tag");
        let t = Instant::now();
        let _ = get(format!("/v2/{repo}/manifests/{tag}"), true).await;
        let sig_tag = format!("{}.sig", digest.replace(':', "-"));
        let index_tag = digest.replace(':', "-");
        let (sig, index) = futures_util::future::join(
            get(format!("/v2/{repo}/manifests/{sig_tag}"), false),
            get(format!("/v2/{repo}/manifests/{index_tag}"), false),
        )
        .await;
        let body = |r: Result<reqwest::Response, reqwest::Error>| async move {
            match r {
                Ok(r) if r.status() == 200 => {
                    serde_json::from_slice::<Value>(&r.bytes().await.unwrap_or_default()).ok()
                }
                _ => None,
            }
        };
        let (sig, index) = (body(sig).await, body(index).await);
        if let Some(m) = sig.and_then(|m| {
            m.pointer("/layers/0/digest")
                .and_then(Value::as_str)
                .map(str::to_owned)
        }) {
            let _ = get(format!("/v2/{repo}/blobs/{m}"), false).await;
        } else if let Some(r) = index.and_then(|i| {
            i.pointer("/manifests/0/digest")
                .and_then(Value::as_str)
                .map(str::to_owned)
        }) {
            let m = body(get(format!("/v2/{repo}/manifests/{r}"), false).await).await;
            if let Some(b) = m.and_then(|m| {
                m.pointer("/layers/0/digest")
                    .and_then(Value::as_str)
                    .map(str::to_owned)
            }) {
                let _ = get(format!("/v2/{repo}/blobs/{b}"), false).await;
            }
        }
        if is_keyless {
            keyless.push(t.elapsed())
        } else {
            keyed.push(t.elapsed())
        }
    }
    keyless.sort();
    keyed.sort();
    (pct(&keyless, 0.5), pct(&keyed, 0.5))
}
