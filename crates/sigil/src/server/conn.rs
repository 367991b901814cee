//! The webhook port: accepting TCP ourselves, the TLS handshake under a
//! timeout in its own task, HTTP/1.1 and HTTP/2 with a header-read timeout
//! and a body limit, and `POST /mutate`.
//!
//! Every connection is watched by hyper-util's graceful shutdown, so the
//! drain closes each one cleanly (in-flight requests finish) and waits for
//! them without polling. HTTP/2 connections opened before the drain get
//! GOAWAY [`H2_SETTLE`] after it starts, so their clients move to a ready
//! replica while this one still answers; everything else is closed when the
//! listener stops. HTTP/1.1 responses carry `Connection: close` during the
//! drain.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::{GracefulShutdown, Watcher};
use sigil_registry::Registry;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_rustls::TlsAcceptor;

use super::Phase;
use super::health::Health;
use crate::admission::{MAX_BODY_BYTES, Webhook, deadline_for, timeout_from_query};
use crate::metrics::Metrics;

/// How long a client may take to finish the TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a client may take to send request headers.
pub(super) const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// How long after the drain starts HTTP/2 connections get GOAWAY: a GOAWAY
/// during the h2 handshake would close a connection under a request
/// already sent, and every connection watched for it is at least this old.
const H2_SETTLE: Duration = Duration::from_millis(500);

pub(super) type Body = Full<Bytes>;

/// A plain-text response.
pub(super) fn text(status: StatusCode, body: impl Into<Bytes>) -> Response<Body> {
    let mut r = Response::new(Full::new(body.into()));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

/// One single-threaded runtime per CPU, on its own thread, each serving
/// the connections handed to it until the process exits.
pub(super) struct Cores {
    handles: Vec<tokio::runtime::Handle>,
    next: std::sync::atomic::AtomicUsize,
}

impl Cores {
    /// Starts `n` (at least one) runtimes.
    pub(super) fn start(n: usize) -> std::io::Result<Cores> {
        let mut handles = Vec::with_capacity(n.max(1));
        for i in 0..n.max(1) {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            handles.push(rt.handle().clone());
            std::thread::Builder::new()
                .name(format!("sigil-conn-{i}"))
                .spawn(move || rt.block_on(std::future::pending::<()>()))?;
        }
        Ok(Cores {
            handles,
            next: Default::default(),
        })
    }

    /// One runtime per CPU the process may use (cgroup quota included).
    pub(super) fn per_cpu() -> std::io::Result<Cores> {
        Cores::start(std::thread::available_parallelism().map_or(1, |n| n.get()))
    }

    /// Serves `f` on the next runtime, round robin.
    fn spawn<F: std::future::Future<Output = ()> + Send + 'static>(&self, f: F) {
        let i = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % self.handles.len();
        self.handles[i].spawn(f);
    }
}

/// What the accept loop shares with every connection.
#[derive(Clone)]
pub(super) struct Shared {
    pub(super) cores: Arc<Cores>,
    pub(super) acceptor: TlsAcceptor,
    pub(super) health: Arc<Health>,
    pub(super) webhook: Arc<Webhook<Registry>>,
    pub(super) metrics: Arc<Metrics>,
}

/// What the drain waits for once the listener is closed.
pub(super) struct Open {
    /// Every connection not handed GOAWAY at drain start.
    pub(super) rest: GracefulShutdown,
    /// The HTTP/2 connections handed GOAWAY at drain start, finishing.
    pub(super) early: Option<JoinHandle<()>>,
}

/// Accepts connections until the phase is [`Phase::Stopping`].
pub(super) async fn accept_loop(
    listener: TcpListener,
    shared: Shared,
    phase: watch::Receiver<Phase>,
) -> Open {
    // HTTP/2 connections accepted while serving: GOAWAY shortly after the drain starts.
    let mut early = Some(GracefulShutdown::new());
    let mut early_done = None;
    let rest = GracefulShutdown::new();
    let (mut draining, mut stopping) = (phase.clone(), phase);
    loop {
        let conn = tokio::select! {
            c = listener.accept() => c,
            _ = draining.wait_for(|p| *p != Phase::Serving), if early.is_some() => {
                if let Some(g) = early.take() {
                    early_done = Some(tokio::spawn(async move {
                        tokio::time::sleep(H2_SETTLE).await;
                        g.shutdown().await;
                    }));
                }
                continue;
            }
            _ = stopping.wait_for(|p| *p == Phase::Stopping) => break,
        };
        let (tcp, peer) = match conn {
            Ok(c) => c,
            Err(e) => {
                // EMFILE and friends: back off instead of spinning.
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = tcp.set_nodelay(true);
        let watchers = (
            early.as_ref().map(GracefulShutdown::watcher),
            rest.watcher(),
        );
        // Re-registered on the serving runtime's own reactor: left on this
        // one, every readiness event would wake this runtime to wake that one.
        let tcp = match tcp.into_std() {
            Ok(t) => t,
            Err(e) => {
                tracing::debug!(%peer, error = %e, "could not hand the connection over");
                continue;
            }
        };
        let cores = shared.cores.clone();
        let shared = shared.clone();
        cores.spawn(async move {
            match TcpStream::from_std(tcp) {
                Ok(tcp) => serve_connection(tcp, peer, shared, watchers).await,
                Err(e) => tracing::debug!(%peer, error = %e, "could not register the connection"),
            }
        });
    }
    Open {
        rest,
        early: early_done,
    }
}

/// TLS handshake, then HTTP until the client or the drain closes it.
async fn serve_connection(
    tcp: TcpStream,
    peer: SocketAddr,
    shared: Shared,
    (early, rest): (Option<Watcher>, Watcher),
) {
    let stream = match tokio::time::timeout(HANDSHAKE_TIMEOUT, shared.acceptor.accept(tcp)).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => {
            tracing::debug!(%peer, error = %e, "TLS handshake failed");
            return;
        }
        Err(_) => {
            tracing::debug!(%peer, "TLS handshake timed out");
            return;
        }
    };
    let h2 = stream.get_ref().1.alpn_protocol() == Some(b"h2".as_slice());
    let Shared {
        health,
        webhook,
        metrics,
        ..
    } = shared;
    let svc = service_fn(move |req| {
        let (webhook, health, metrics) = (webhook.clone(), health.clone(), metrics.clone());
        async move { Ok::<_, Infallible>(handle_webhook(req, &webhook, &health, &metrics).await) }
    });
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT)
        .keep_alive(true);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(256);
    let conn = builder
        .serve_connection(TokioIo::new(stream), svc)
        .into_owned();
    let watcher = match early {
        Some(w) if h2 => w,
        _ => rest,
    };
    if let Err(e) = watcher.watch(conn).await {
        tracing::debug!(%peer, error = %e, "connection ended with error");
    }
}

async fn handle_webhook(
    req: Request<Incoming>,
    webhook: &Webhook<Registry>,
    health: &Health,
    metrics: &Metrics,
) -> Response<Body> {
    let mut resp = webhook_response(req, webhook, metrics).await;
    if health.draining() {
        // HTTP/1.1 clients reconnect (to another replica) for their next request.
        resp.headers_mut().insert(
            header::CONNECTION,
            header::HeaderValue::from_static("close"),
        );
    }
    resp
}

async fn webhook_response(
    req: Request<Incoming>,
    webhook: &Webhook<Registry>,
    metrics: &Metrics,
) -> Response<Body> {
    let start = Instant::now();
    if req.uri().path() != "/mutate" {
        return text(
            StatusCode::NOT_FOUND,
            "not found: sigil serves POST /mutate\n",
        );
    }
    if req.method() != Method::POST {
        let mut r = text(
            StatusCode::METHOD_NOT_ALLOWED,
            "method not allowed: use POST\n",
        );
        r.headers_mut()
            .insert(header::ALLOW, header::HeaderValue::from_static("POST"));
        return r;
    }
    let too_big = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
        .is_some_and(|n| n > MAX_BODY_BYTES as u64);
    if too_big {
        return text(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("request body larger than {MAX_BODY_BYTES} bytes\n"),
        );
    }
    let timeout = timeout_from_query(req.uri().query());
    let deadline = deadline_for(timeout, start);
    metrics.inflight.inc();
    let _guard = InflightGuard(metrics);
    let body = match Limited::new(req.into_body(), MAX_BODY_BYTES)
        .collect()
        .await
    {
        Ok(b) => b.to_bytes(),
        Err(e) => {
            let status = if e
                .downcast_ref::<http_body_util::LengthLimitError>()
                .is_some()
            {
                StatusCode::PAYLOAD_TOO_LARGE
            } else {
                StatusCode::BAD_REQUEST
            };
            return text(status, format!("reading request body: {e}\n"));
        }
    };
    match webhook.review(&body, deadline).await {
        Ok((bytes, verdict)) => {
            webhook.record(&verdict, start.elapsed());
            let mut r = Response::new(Full::new(Bytes::from(bytes)));
            r.headers_mut().insert(
                header::CONTENT_TYPE,
                header::HeaderValue::from_static("application/json"),
            );
            r
        }
        Err(e) => {
            metrics.admission("", "", "bad_request", start.elapsed());
            tracing::warn!(error = %e, "bad admission request");
            text(StatusCode::BAD_REQUEST, format!("{e}\n"))
        }
    }
}

struct InflightGuard<'a>(&'a Metrics);

impl Drop for InflightGuard<'_> {
    fn drop(&mut self) {
        self.0.inflight.dec();
    }
}
