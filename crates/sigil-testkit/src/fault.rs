//! A loopback HTTP server for faults a real registry cannot make: slowness,
//! 5xx, 429 with Retry-After. Everything else is tested against the real one.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;

#[derive(Clone, Copy, Debug)]
pub enum Fault {
    /// Sleep, then answer 200 with a digest.
    Slow(Duration),
    /// Answer this status.
    Status(u16),
    /// 429 with Retry-After: N the first time, then 200.
    RateLimitOnce(u64),
    /// 200 with a manifest body but no Docker-Content-Digest header (some
    /// registries and proxies drop it); `lie` sends a wrong header on GET.
    NoDigestHeader { lie: bool },
}

/// The manifest [`Fault::NoDigestHeader`] serves.
pub const BODY: &[u8] = br#"{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa","size":2},"layers":[]}"#;

pub const DIGEST: &str = "sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";

pub struct FaultServer {
    pub addr: SocketAddr,
    pub hits: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for FaultServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl FaultServer {
    pub async fn start(fault: Fault) -> FaultServer {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let hits = Arc::new(AtomicUsize::new(0));
        let h = hits.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = l.accept().await else {
                    return;
                };
                let h = h.clone();
                tokio::spawn(async move {
                    let svc = service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                        let n = h.fetch_add(1, Ordering::SeqCst);
                        let head = req.method() == hyper::Method::HEAD;
                        async move {
                            let mut b = hyper::Response::builder();
                            let status = match fault {
                                Fault::Slow(d) => {
                                    tokio::time::sleep(d).await;
                                    200
                                }
                                Fault::Status(s) => s,
                                Fault::RateLimitOnce(secs) if n == 0 => {
                                    b = b.header("retry-after", secs.to_string());
                                    429
                                }
                                Fault::RateLimitOnce(_) => 200,
                                Fault::NoDigestHeader { lie } => {
                                    if lie && !head {
                                        b = b.header("docker-content-digest", DIGEST);
                                    }
                                    let body = if head {
                                        Bytes::new()
                                    } else {
                                        Bytes::from_static(BODY)
                                    };
                                    return Ok::<_, Infallible>(
                                        b.status(200).body(Full::new(body)).unwrap(),
                                    );
                                }
                            };
                            if status == 200 {
                                b = b.header("docker-content-digest", DIGEST).header(
                                    "content-type",
                                    "application/vnd.oci.image.manifest.v1+json",
                                );
                            }
                            Ok::<_, Infallible>(
                                b.status(status).body(Full::new(Bytes::new())).unwrap(),
                            )
                        }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(tcp), svc)
                        .await;
                });
            }
        });
        FaultServer { addr, hits, task }
    }
}

/// A TCP proxy in front of `upstream` that passes what upstream sends at
/// most `bytes_per_sec` (requests pass at full speed): a real registry made
/// slow, for copies that cannot finish within an admission's deadline.
pub struct Throttle {
    pub addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Throttle {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Throttle {
    pub async fn start(upstream: String, bytes_per_sec: u64) -> Throttle {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = l.accept().await {
                let upstream = upstream.clone();
                tokio::spawn(async move {
                    let Ok(server) = tokio::net::TcpStream::connect(&upstream).await else {
                        return;
                    };
                    let (mut cr, mut cw) = client.into_split();
                    let (mut sr, mut sw) = server.into_split();
                    let up = tokio::spawn(async move {
                        let _ = tokio::io::copy(&mut cr, &mut sw).await;
                        let _ = sw.shutdown().await;
                    });
                    let chunk = 16 * 1024;
                    let pause = Duration::from_secs_f64(chunk as f64 / bytes_per_sec.max(1) as f64);
                    let mut buf = vec![0u8; chunk];
                    loop {
                        match sr.read(&mut buf).await {
                            Ok(0) | Err(_) => break,
                            Ok(n) => {
                                if cw.write_all(&buf[..n]).await.is_err() {
                                    break;
                                }
                                tokio::time::sleep(pause.mul_f64(n as f64 / chunk as f64)).await;
                            }
                        }
                    }
                    let _ = cw.shutdown().await;
                    up.abort();
                });
            }
        });
        Throttle { addr, task }
    }
}
