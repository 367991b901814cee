//! The webhook port against a client that will not behave, each attack a
//! security review ran, bounded in count and time, on loopback: stalled
//! bodies, idle connections past the descriptor limit, a review that fans
//! out to thousands of lookups on a dark host, rapid HTTP/2 stream resets,
//! and clients without the certificate `--client-ca-file` requires.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::support::procstat::rss_kib;
use crate::support::registry::{Mode, TestRegistry};
use crate::support::review::{pod, review};
use crate::support::sigil::Sigil;

/// A TLS client config trusting `ca_pem`, optionally with a client identity.
fn tls_client(ca_pem: &str, alpn: &[&[u8]]) -> tokio_rustls::TlsConnector {
    let mut roots = rustls::RootCertStore::empty();
    for c in rustls::pki_types::CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(c.unwrap()).unwrap();
    }
    let mut cfg = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::aws_lc_rs::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    cfg.alpn_protocols = alpn.iter().map(|a| a.to_vec()).collect();
    tokio_rustls::TlsConnector::from(Arc::new(cfg))
}

use rustls::pki_types::pem::PemObject as _;

/// The attack is over and sigil still answers an admission.
async fn still_serving(s: &Sigil) {
    let a = s
        .apiserver()
        .create_pod(
            "shop",
            &["busybox@sha256:0000000000000000000000000000000000000000000000000000000000000000"],
        )
        .await;
    assert!(a.allowed, "{}", a.message);
}

/// Listens on 127.0.0.1, accepts and never answers; counts connections.
async fn black_hole() -> (std::net::SocketAddr, Arc<std::sync::atomic::AtomicUsize>) {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let n = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let count = n.clone();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((s, _)) = l.accept().await {
            count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            held.push(s);
        }
    });
    (addr, n)
}

/// 60 connections each send 3 MiB − 16 bytes of a 3 MiB body and stop.
/// Body memory is bounded by `--body-memory` (16 MiB here), every one is
/// answered 408 at the admission deadline, and the server stays Ready.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_bodies_are_answered_at_the_deadline_within_the_body_memory() {
    let s = Sigil::start(None, &["--body-memory", "16Mi"]).await;
    let idle = rss_kib(s.pid());
    let connector = tls_client(&s.ca_pem, &[b"http/1.1"]);
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..60 {
        let (connector, addr) = (connector.clone(), s.addr);
        tasks.push(tokio::spawn(async move {
            let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
            let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
            let mut tls = connector.connect(name, tcp).await.unwrap();
            let len = 3usize << 20;
            let head = format!(
                "POST /mutate?timeout=2s HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\ncontent-length: {len}\r\n\r\n"
            );
            tls.write_all(head.as_bytes()).await.unwrap();
            let chunk = vec![b' '; 64 << 10];
            let mut sent = 0;
            // Writes block once sigil stops reading (budget spent): bounded.
            let _ = tokio::time::timeout(Duration::from_secs(4), async {
                while sent < len - 16 {
                    let n = chunk.len().min(len - 16 - sent);
                    if tls.write_all(&chunk[..n]).await.is_err() {
                        break;
                    }
                    sent += n;
                }
            })
            .await;
            let mut answer = Vec::new();
            let _ = tokio::time::timeout(Duration::from_secs(6), tls.read_to_end(&mut answer)).await;
            String::from_utf8_lossy(&answer).into_owned()
        }));
    }
    // Sample memory while the bodies stall.
    let mut peak = 0;
    while started.elapsed() < Duration::from_millis(1700) {
        peak = peak.max(rss_kib(s.pid()));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut answered = 0;
    for t in tasks {
        let a = t.await.unwrap();
        if a.starts_with("HTTP/1.1 408") {
            answered += 1;
        }
    }
    assert_eq!(answered, 60, "every stalled body gets 408 at the deadline");
    assert!(
        started.elapsed() < Duration::from_secs(8),
        "answered late: {:?}",
        started.elapsed()
    );
    let grown_mib = (peak.saturating_sub(idle)) / 1024;
    eprintln!(
        "stalled bodies: idle {idle} KiB, peak {peak} KiB (+{grown_mib} MiB), after {} KiB",
        rss_kib(s.pid())
    );
    // 16 MiB of bodies plus TLS and HTTP buffers of 60 connections; without
    // the budget this was ~180 MiB.
    assert!(
        grown_mib < 48,
        "RSS grew by {grown_mib} MiB (idle {idle} KiB, peak {peak} KiB)"
    );
    // Still serving.
    still_serving(&s).await;
}

/// A review whose body arrives in pieces — a `content-length` body in
/// three writes with pauses, and a chunked one in three chunks — is read
/// whole and answered like one sent at once (the server keeps a body that
/// arrives as one frame as that frame, and joins the frames of one that
/// does not).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_review_arriving_in_pieces_is_answered_whole() {
    let s = Sigil::start(None, &[]).await;
    let connector = tls_client(&s.ca_pem, &[b"http/1.1"]);
    let image = "busybox@sha256:0000000000000000000000000000000000000000000000000000000000000000";
    let mut body = review("CREATE", "shop", pod("pieces", &[image]));
    body["request"]["uid"] = json!("uid-in-pieces");
    let body = serde_json::to_vec(&body).unwrap();
    let thirds = [
        &body[..body.len() / 3],
        &body[body.len() / 3..2 * body.len() / 3],
        &body[2 * body.len() / 3..],
    ];
    for chunked in [false, true] {
        let tcp = tokio::net::TcpStream::connect(s.addr).await.unwrap();
        let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
        let mut tls = connector.connect(name, tcp).await.unwrap();
        let framing = if chunked {
            "transfer-encoding: chunked".to_string()
        } else {
            format!("content-length: {}", body.len())
        };
        let head = format!(
            "POST /mutate?timeout=5s HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\nconnection: close\r\n{framing}\r\n\r\n"
        );
        tls.write_all(head.as_bytes()).await.unwrap();
        for piece in thirds {
            if chunked {
                tls.write_all(format!("{:x}\r\n", piece.len()).as_bytes())
                    .await
                    .unwrap();
                tls.write_all(piece).await.unwrap();
                tls.write_all(b"\r\n").await.unwrap();
            } else {
                tls.write_all(piece).await.unwrap();
            }
            tls.flush().await.unwrap();
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        if chunked {
            tls.write_all(b"0\r\n\r\n").await.unwrap();
        }
        let mut answer = Vec::new();
        tokio::time::timeout(Duration::from_secs(10), tls.read_to_end(&mut answer))
            .await
            .expect("answered")
            .unwrap();
        let answer = String::from_utf8_lossy(&answer);
        assert!(
            answer.starts_with("HTTP/1.1 200"),
            "chunked {chunked}: {answer}"
        );
        let json: Value = serde_json::from_str(answer.split_once("\r\n\r\n").unwrap().1)
            .unwrap_or_else(|e| panic!("chunked {chunked}: {e}: {answer}"));
        assert_eq!(json["response"]["uid"], "uid-in-pieces", "{answer}");
        assert_eq!(json["response"]["allowed"], true, "{answer}");
    }
}

/// Under an open-files limit of 400, 1,000 connections that never send a
/// byte: the connection cap (400 − 128) keeps descriptors for the admin
/// port, /readyz answers throughout, every connection is closed by the
/// first-request deadline (2 s here) as it is accepted, and no accept fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_are_closed_and_readyz_answers_under_a_descriptor_limit() {
    let s = Sigil::start_with_nofile(400, &["--first-request-timeout", "2s"]).await;
    let mut conns = Vec::new();
    for _ in 0..1000 {
        conns.push(tokio::net::TcpStream::connect(s.addr).await.unwrap());
    }
    let readers: Vec<_> = conns
        .into_iter()
        .map(|mut c| {
            tokio::spawn(async move {
                let mut b = [0u8; 1];
                // EOF (or reset) once sigil closes it.
                tokio::time::timeout(Duration::from_secs(20), c.read(&mut b))
                    .await
                    .is_ok()
            })
        })
        .collect();
    let http = reqwest::Client::new();
    let until = Instant::now() + Duration::from_secs(6);
    while Instant::now() < until {
        let r = http
            .get(format!("http://{}/readyz", s.admin))
            .timeout(Duration::from_secs(2))
            .send()
            .await
            .expect("/readyz answers under the flood");
        assert_eq!(r.status(), 200, "not Ready under the flood");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut closed = 0;
    for r in readers {
        closed += usize::from(r.await.unwrap());
    }
    assert_eq!(closed, 1000, "every idle connection is closed");
    let logs = s.logs();
    assert!(!logs.contains("Too many open files"), "{logs}");
    assert!(logs.contains("\"max_connections\":272"), "{logs}");
    still_serving(&s).await;
}

fn many_images(ns: &str, images: &[String]) -> Value {
    let containers: Vec<Value> = images
        .iter()
        .enumerate()
        .map(|(i, img)| json!({"name": format!("c{i}"), "image": img}))
        .collect();
    review(
        "CREATE",
        ns,
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "big", "namespace": ns},
               "spec": {"containers": containers}}),
    )
}

/// A 3,000-image review on a host that never answers is denied at the
/// lookup limit without one connection; a 60-image one (under the limit)
/// holds only that host's request slots, so a concurrent review for another
/// registry is pinned in its usual time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fan_out_is_bounded_per_object_and_a_dark_host_takes_only_its_own_slots() {
    let reg = TestRegistry::start(Mode::Plain).await;
    let h = reg.host();
    let digest = reg.push_image("ok/app", "v1").await;
    let (dark, hits) = black_hole().await;
    let policy = format!(
        "apiVersion: sigil.dev/v1alpha1\nkind: ImagePolicy\nspec:\n  registries: [{{host: \"{h}\", insecure: true}}]\n  rules:\n    - {{name: all, match: [\"**\"], mode: warn}}\n"
    );
    let s = Sigil::start(Some(&policy), &[]).await;
    let api = Arc::new(s.apiserver());
    let huge: Vec<String> = (0..3000).map(|i| format!("{dark}/img{i}:1")).collect();
    let a = api
        .admit(&many_images("shop", &huge), Duration::from_secs(5))
        .await;
    assert!(!a.allowed);
    assert!(
        a.message
            .contains("3000 distinct images to resolve, more than the limit of 64"),
        "{}",
        a.message
    );
    assert_eq!(
        hits.load(std::sync::atomic::Ordering::SeqCst),
        0,
        "no lookup was made"
    );

    let sixty: Vec<String> = (0..60).map(|i| format!("{dark}/img{i}:1")).collect();
    let stuck = {
        let api = api.clone();
        tokio::spawn(async move {
            api.admit(&many_images("shop", &sixty), Duration::from_secs(5))
                .await
        })
    };
    // Wait until the dark host holds its 32 slots.
    let until = Instant::now() + Duration::from_secs(3);
    while hits.load(std::sync::atomic::Ordering::SeqCst) < 32 && Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let t = Instant::now();
    let ok = api
        .admit(
            &review("CREATE", "shop", pod("p", &[&format!("{h}/ok/app:v1")])),
            Duration::from_secs(5),
        )
        .await;
    let took = t.elapsed();
    assert_eq!(
        ok.object["spec"]["containers"][0]["image"],
        format!("{h}/ok/app:v1@{digest}").as_str()
    );
    assert!(
        took < Duration::from_secs(1),
        "pinned in {took:?} while a dark host was busy"
    );
    let stuck = stuck.await.unwrap();
    assert!(stuck.allowed, "warn mode admits, with warnings");
    assert!(
        hits.load(std::sync::atomic::Ordering::SeqCst) <= 32,
        "the dark host got more than its slots"
    );
}

/// 20,000 HTTP/2 streams opened and reset at once by the client: the server
/// keeps answering and its memory does not grow with the resets.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rapid_http2_stream_resets_do_not_grow_memory() {
    let s = Sigil::start(None, &[]).await;
    let connector = tls_client(&s.ca_pem, &[b"h2"]);
    let body = crate::support::review::pod_review_bytes(&["busybox:1"]);
    let mut before = 0;
    let started = Instant::now();
    let mut sent = 0;
    'outer: for round in 0..20 {
        let tcp = tokio::net::TcpStream::connect(s.addr).await.unwrap();
        let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
        let Ok(tls) = connector.connect(name, tcp).await else {
            continue;
        };
        let Ok((mut sender, conn)) = hyper::client::conn::http2::handshake(
            hyper_util::rt::TokioExecutor::new(),
            hyper_util::rt::TokioIo::new(tls),
        )
        .await
        else {
            continue;
        };
        tokio::spawn(conn);
        for _ in 0..1000 {
            if sender.ready().await.is_err() {
                continue 'outer;
            }
            let req = http::Request::post(format!(
                "https://localhost:{}/mutate?timeout=5s",
                s.addr.port()
            ))
            .header("content-type", "application/json")
            .body(http_body_util::Full::new(bytes::Bytes::from(body.clone())))
            .unwrap();
            // Dropping the response future resets the stream (RST_STREAM CANCEL).
            let f = sender.send_request(req);
            drop(f);
            sent += 1;
        }
        if round == 1 {
            before = rss_kib(s.pid());
        }
        if started.elapsed() > Duration::from_secs(20) {
            break;
        }
    }
    assert!(sent >= 5000, "only {sent} streams were opened");
    tokio::time::sleep(Duration::from_millis(500)).await;
    let after = rss_kib(s.pid());
    eprintln!("h2 resets: {sent} streams reset; RSS {before} KiB -> {after} KiB");
    assert!(
        after < before + 16 * 1024,
        "RSS grew from {before} KiB to {after} KiB over {sent} resets"
    );
    still_serving(&s).await;
}

/// `--client-ca-file`: a request without a client certificate is refused
/// (401), one whose certificate another CA issued fails the handshake, one
/// from the configured CA is answered — and sigil is Ready (its self-check
/// needs no client certificate).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_certificates_are_required_with_client_ca_file() {
    let dir = tempfile::tempdir().unwrap();
    let (ca_key, ca) = client_ca("apiserver-ca");
    let (cert, key) = client_cert(&ca_key, &ca, "kube-apiserver");
    let ca_path = dir.path().join("client-ca.pem");
    std::fs::write(&ca_path, ca.pem()).unwrap();
    let s = Sigil::start(None, &["--client-ca-file", ca_path.to_str().unwrap()]).await;
    let url = format!("https://localhost:{}/mutate?timeout=5s", s.addr.port());
    let body = crate::support::review::pod_review_bytes(&["busybox:1"]);
    let anonymous = reqwest::Client::builder()
        .tls_certs_only([reqwest::Certificate::from_pem(s.ca_pem.as_bytes()).unwrap()])
        .build()
        .unwrap();
    let r = anonymous
        .post(&url)
        .body(body.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    let with = |cert: &str, key: &str| {
        reqwest::Client::builder()
            .tls_certs_only([reqwest::Certificate::from_pem(s.ca_pem.as_bytes()).unwrap()])
            .identity(reqwest::Identity::from_pem(format!("{cert}{key}").as_bytes()).unwrap())
            .build()
            .unwrap()
    };
    let r = with(&cert, &key)
        .post(&url)
        .body(body.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let (other_key, other) = client_ca("someone-else");
    let (cert2, key2) = client_cert(&other_key, &other, "intruder");
    assert!(
        with(&cert2, &key2)
            .post(&url)
            .body(body)
            .send()
            .await
            .is_err()
    );
}

fn client_ca(name: &str) -> (rcgen::KeyPair, rcgen::Certificate) {
    let key = rcgen::KeyPair::generate().unwrap();
    let mut p = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    p.distinguished_name.push(rcgen::DnType::CommonName, name);
    p.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let c = p.self_signed(&key).unwrap();
    (key, c)
}

fn client_cert(ca_key: &rcgen::KeyPair, ca: &rcgen::Certificate, name: &str) -> (String, String) {
    let key = rcgen::KeyPair::generate().unwrap();
    let mut p = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    p.distinguished_name.push(rcgen::DnType::CommonName, name);
    p.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
    let issuer = rcgen::Issuer::from_ca_cert_der(ca.der(), ca_key).unwrap();
    let c = p.signed_by(&key, &issuer).unwrap();
    (c.pem(), key.serialize_pem())
}

/// A registry host that never answers, and one that answers 503: after
/// three failures in a row its circuit breaker opens, and the next
/// admissions are denied at once with the same clear reason, without
/// another connection, instead of each waiting out the deadline; a healthy
/// host is not affected, and `sigil_registry_breaker_state{host}` says which
/// host is failing fast. (Half-open probing and recovery: the unit tests of
/// `sigil_registry::breaker`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dark_or_failing_registry_fails_fast_after_three_failures() {
    let reg = TestRegistry::start(Mode::Plain).await;
    let h = reg.host();
    reg.push_image("ok/app", "v1").await;
    let (dark, hits) = black_hole().await;
    let e503 =
        crate::support::fault::FaultServer::start(crate::support::fault::Fault::Status(503)).await;
    let failing = e503.addr.to_string();
    let policy = format!(
        "apiVersion: sigil.dev/v1alpha1\nkind: ImagePolicy\nspec:\n  registries: [{{host: \"{h}\", insecure: true}}, {{host: \"{failing}\", insecure: true}}]\n  rules:\n    - {{name: all, match: [\"**\"], mode: enforce}}\n"
    );
    let s = Sigil::start(Some(&policy), &[]).await;
    let api = s.apiserver();
    let admit = |image: String| {
        let api = &api;
        async move {
            let t = Instant::now();
            let a = api
                // Two seconds: sigil answers the dark host's lookups at the
                // deadline, 200 ms before the client gives up (1 s left
                // only 100 ms, which a loaded two-core machine overran
                // while the test suite started several servers at once).
                .admit(
                    &review("CREATE", "shop", pod("p", &[&image])),
                    Duration::from_secs(2),
                )
                .await;
            (a, t.elapsed())
        }
    };
    for i in 0..3 {
        let (a, took) = admit(format!("{dark}/app:{i}")).await;
        assert!(
            !a.allowed && took >= Duration::from_millis(500),
            "{took:?} {}",
            a.message
        );
    }
    let seen = hits.load(std::sync::atomic::Ordering::SeqCst);
    for i in 3..13 {
        let (a, took) = admit(format!("{dark}/app:{i}")).await;
        assert!(!a.allowed);
        assert!(took < Duration::from_millis(300), "failed fast: {took:?}");
        assert!(
            a.message.contains(&format!(
                "{dark} is failing fast: 3 consecutive requests failed"
            )),
            "{}",
            a.message
        );
    }
    assert_eq!(
        hits.load(std::sync::atomic::Ordering::SeqCst),
        seen,
        "no new connection"
    );
    for i in 0..3 {
        let (a, _) = admit(format!("{failing}/app:{i}")).await;
        assert!(!a.allowed && a.message.contains("503"), "{}", a.message);
    }
    let before = e503.hits.load(std::sync::atomic::Ordering::SeqCst);
    let (a, _) = admit(format!("{failing}/app:9")).await;
    assert!(
        a.message.contains("failing fast") && a.message.contains("503"),
        "{}",
        a.message
    );
    assert_eq!(e503.hits.load(std::sync::atomic::Ordering::SeqCst), before);
    // A healthy registry is not affected.
    let (ok, _) = admit(format!("{h}/ok/app:v1")).await;
    assert!(ok.allowed && ok.patched, "{}", ok.message);
    let m = s.metrics().await;
    for host in [dark.to_string(), failing.clone()] {
        assert!(
            m.contains(&format!(
                "sigil_registry_breaker_state{{host=\"{host}\"}} 1"
            )),
            "{host} open in\n{m}"
        );
    }
    assert!(
        !m.contains(&format!("sigil_registry_breaker_state{{host=\"{h}\"}}")),
        "{m}"
    );
    drop(s);

    // Tuned by flags: open after one failure, probe again after a second.
    let s = Sigil::start(
        Some(&policy),
        &[
            "--registry-breaker-failures",
            "1",
            "--registry-breaker-cool-down",
            "1s",
        ],
    )
    .await;
    let api = s.apiserver();
    let once = |image: String| {
        let api = &api;
        async move {
            api.admit(
                &review("CREATE", "shop", pod("p", &[&image])),
                Duration::from_secs(1),
            )
            .await
        }
    };
    let before = hits.load(std::sync::atomic::Ordering::SeqCst);
    once(format!("{dark}/other:1")).await;
    let after_first = hits.load(std::sync::atomic::Ordering::SeqCst);
    assert!(after_first > before);
    let a = once(format!("{dark}/other:2")).await;
    assert!(
        a.message.contains("1 consecutive requests failed"),
        "{}",
        a.message
    );
    assert_eq!(hits.load(std::sync::atomic::Ordering::SeqCst), after_first);
    tokio::time::sleep(Duration::from_millis(1100)).await;
    once(format!("{dark}/other:3")).await;
    assert!(
        hits.load(std::sync::atomic::Ordering::SeqCst) > after_first,
        "after the cool-down one request probes the host"
    );
}
