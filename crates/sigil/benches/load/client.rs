//! The load client: `concurrency` workers, each on its own keep-alive HTTPS
//! connection, sending the same body; latencies collected for percentiles.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use rustls::pki_types::pem::PemObject;

pub struct Stats {
    pub rps: f64,
    pub p50: Duration,
    pub p99: Duration,
    pub p999: Duration,
}

pub fn pct(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

pub fn client_tls(ca_pem: &[u8]) -> Arc<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    for c in rustls::pki_types::CertificateDer::pem_slice_iter(ca_pem) {
        roots.add(c.expect("pem")).expect("root");
    }
    let cfg = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::aws_lc_rs::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("versions")
    .with_root_certificates(roots)
    .with_no_client_auth();
    Arc::new(cfg)
}

pub type Sender = hyper::client::conn::http1::SendRequest<Full<Bytes>>;

/// One keep-alive HTTPS connection, as the API server opens them.
pub async fn connect(addr: SocketAddr, tls: Arc<rustls::ClientConfig>) -> Sender {
    let tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
    tcp.set_nodelay(true).expect("nodelay");
    let stream = tokio_rustls::TlsConnector::from(tls)
        .connect(
            rustls::pki_types::ServerName::try_from("localhost").expect("name"),
            tcp,
        )
        .await
        .expect("tls");
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .expect("handshake");
    tokio::spawn(conn);
    sender
}

/// One `POST /mutate`; the answer's body.
pub async fn send(sender: &mut Sender, body: Vec<u8>) -> Bytes {
    let req = http::Request::post("/mutate?timeout=10s")
        .header("host", "localhost")
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body)))
        .expect("request");
    // The previous answer read, the connection may not have taken it in yet.
    sender.ready().await.expect("connection ready");
    let resp = sender.send_request(req).await.expect("send");
    assert!(resp.status().is_success(), "status {}", resp.status());
    resp.into_body().collect().await.expect("body").to_bytes()
}

/// One request on a new connection: the answer's body.
pub async fn one(addr: SocketAddr, tls: Arc<rustls::ClientConfig>, body: Vec<u8>) -> Bytes {
    send(&mut connect(addr, tls).await, body).await
}

/// `concurrency` workers, each on its own keep-alive HTTPS connection.
pub async fn drive(
    addr: SocketAddr,
    tls: Arc<rustls::ClientConfig>,
    concurrency: usize,
    total: usize,
    body: impl Fn(usize) -> Vec<u8> + Send + Sync + 'static,
) -> Stats {
    let body = Arc::new(body);
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..concurrency {
        let (tls, body, next) = (tls.clone(), body.clone(), next.clone());
        tasks.push(tokio::spawn(async move {
            let mut sender = connect(addr, tls).await;
            let mut lat = Vec::new();
            loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if i >= total {
                    break;
                }
                let t = Instant::now();
                let b = send(&mut sender, body(i)).await;
                lat.push(t.elapsed());
                assert!(!b.is_empty());
            }
            lat
        }));
    }
    let mut all = Vec::with_capacity(total);
    for t in tasks {
        all.extend(t.await.expect("worker"));
    }
    let elapsed = started.elapsed();
    all.sort();
    Stats {
        rps: all.len() as f64 / elapsed.as_secs_f64(),
        p50: pct(&all, 0.5),
        p99: pct(&all, 0.99),
        p999: pct(&all, 0.999),
    }
}
