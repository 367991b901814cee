//! The two listeners: HTTPS webhook (`POST /mutate`) and plain-HTTP admin
//! (`/livez`, `/readyz`, `/metrics`), and the process lifecycle around them.
//!
//! Owns accepting TCP ourselves (TLS handshake under a timeout in its own
//! task, header-read timeout, body limit), readiness as a latch set only after
//! a real TLS self-check against our own port, and the drain on SIGTERM:
//! not-ready at once, keep serving for `--shutdown-delay`, then stop accepting
//! and finish in-flight requests. It makes no admission decisions.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use bytes::Bytes;
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use sigil_registry::Registry;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

use crate::admission::{MAX_BODY_BYTES, Webhook, deadline_for, timeout_from_query};
use crate::metrics::Metrics;
use crate::tls::{CertStore, ServingCert};

/// How often the certificate files are checked for a rotation.
const CERT_POLL: Duration = Duration::from_secs(1);

/// How long a client may take to finish the TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a client may take to send request headers.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// How often a ready server re-proves that its webhook port serves.
const SELF_CHECK_INTERVAL: Duration = Duration::from_secs(10);
/// How old an HTTP/2 connection must be before a drain sends it GOAWAY.
const H2_SETTLE: Duration = Duration::from_millis(500);
/// Upper bound on finishing in-flight requests after the drain delay.
const FINISH_TIMEOUT: Duration = Duration::from_secs(30);

/// Where the server is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Ready (once the self-check passed) and serving.
    Serving,
    /// SIGTERM received: not ready, still accepting and answering.
    Draining,
    /// Listener closed; finishing what is in flight.
    Stopping,
}

/// Everything `serve` needs, already loaded (nothing here touches the disk).
#[derive(Debug)]
pub struct ServeConfig {
    /// Webhook HTTPS address.
    pub listen: SocketAddr,
    /// Admin HTTP address.
    pub admin_listen: SocketAddr,
    /// Serving certificate.
    pub cert: ServingCert,
    /// The files it came from, watched and hot-reloaded when given.
    pub cert_files: Option<(std::path::PathBuf, std::path::PathBuf)>,
    /// The policy file and the bytes the running policy came from, watched
    /// and hot-reloaded when given.
    pub policy_file: Option<(std::path::PathBuf, Vec<u8>)>,
    /// How long to keep serving after SIGTERM before closing the listener.
    pub shutdown_delay: Duration,
    /// Started with the server (registration, self-managed certificates).
    pub tasks: Tasks,
}

/// Work that runs beside the server and needs its readiness or the
/// certificate it serves. Each is spawned once the listeners are bound.
pub type Task = Box<
    dyn FnOnce(ReadySignal, Arc<CertStore>) -> futures_util::future::BoxFuture<'static, ()> + Send,
>;

/// The tasks of a [`ServeConfig`].
#[derive(Default)]
pub struct Tasks(pub Vec<Task>);

impl std::fmt::Debug for Tasks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Tasks({})", self.0.len())
    }
}

/// Resolves once the server has been Ready (its self-check passed) at least once.
#[derive(Debug, Clone)]
pub struct ReadySignal(tokio::sync::watch::Receiver<bool>);

impl ReadySignal {
    /// Waits for the first Ready.
    pub async fn wait(mut self) {
        let _ = self.0.wait_for(|r| *r).await;
    }
}

/// Readiness and drain state, shared by the listeners.
#[derive(Debug)]
pub struct Health {
    ready: AtomicBool,
    ever_ready: tokio::sync::watch::Sender<bool>,
    draining: AtomicBool,
    reason: Mutex<String>,
}

impl Health {
    fn new() -> Self {
        Health {
            ready: AtomicBool::new(false),
            ever_ready: tokio::sync::watch::Sender::new(false),
            draining: AtomicBool::new(false),
            reason: Mutex::new("starting: self-check has not passed yet".into()),
        }
    }

    fn set_ready(&self, metrics: &Metrics) {
        self.ready.store(true, Ordering::SeqCst);
        self.ever_ready.send_replace(true);
        metrics.ready.set(1);
    }

    fn set_not_ready(&self, why: &str, metrics: &Metrics) {
        self.ready.store(false, Ordering::SeqCst);
        *self.reason.lock().unwrap_or_else(|p| p.into_inner()) = why.to_owned();
        metrics.ready.set(0);
    }

    fn readiness(&self) -> Result<(), String> {
        if self.draining.load(Ordering::SeqCst) {
            return Err("draining: shutting down".into());
        }
        if self.ready.load(Ordering::SeqCst) {
            Ok(())
        } else {
            Err(self
                .reason
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone())
        }
    }
}

type Body = Full<Bytes>;

fn text(status: StatusCode, body: impl Into<Bytes>) -> Response<Body> {
    let mut r = Response::new(Full::new(body.into()));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

/// Runs the server until SIGTERM/SIGINT and the drain complete.
pub async fn serve(
    cfg: ServeConfig,
    webhook: Arc<Webhook<Registry>>,
    metrics: Arc<Metrics>,
) -> Result<()> {
    let listener = TcpListener::bind(cfg.listen)
        .await
        .with_context(|| format!("binding webhook listener {}", cfg.listen))?;
    let admin = TcpListener::bind(cfg.admin_listen)
        .await
        .with_context(|| format!("binding admin listener {}", cfg.admin_listen))?;
    let addr = listener.local_addr()?;
    let admin_addr = admin.local_addr()?;
    tracing::info!(%addr, "webhook listening (HTTPS, POST /mutate)");
    tracing::info!(addr = %admin_addr, "admin listening (HTTP, /livez /readyz /metrics)");

    let health = Arc::new(Health::new());
    let store = CertStore::new(&cfg.cert, cfg.cert_files.clone())?;
    let tls = crate::tls::server_config(store.clone())?;
    if cfg.cert_files.is_some() {
        tokio::spawn(watch_cert(store.clone(), metrics.clone()));
    }
    if let Some(leaf) = store.leaf() {
        metrics.cert_not_after.set(crate::tls::not_after(&leaf));
    }
    for task in cfg.tasks.0 {
        tokio::spawn(task(
            ReadySignal(health.ever_ready.subscribe()),
            store.clone(),
        ));
    }
    let acceptor = TlsAcceptor::from(tls);
    // Serving → Draining (SIGTERM) → Stopping (after --shutdown-delay).
    let (phase_tx, phase_rx) = tokio::sync::watch::channel(Phase::Serving);
    // One clone per open connection; the drain waits for them to go.
    let live = Arc::new(());

    tokio::spawn(admin_loop(
        admin,
        health.clone(),
        metrics.clone(),
        webhook.clone(),
    ));
    if let Some((path, seen)) = cfg.policy_file.clone() {
        tokio::spawn(crate::reload::watch_policy(
            path,
            seen,
            webhook.clone(),
            metrics.clone(),
        ));
    }

    let accept = {
        let mut stop_rx = phase_rx.clone();
        let phase_rx = phase_rx.clone();
        let live = live.clone();
        let health = health.clone();
        let webhook = webhook.clone();
        let metrics = metrics.clone();
        tokio::spawn(async move {
            loop {
                let conn = tokio::select! {
                    c = listener.accept() => c,
                    _ = stop_rx.wait_for(|p| *p == Phase::Stopping) => break,
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
                let acceptor = acceptor.clone();
                let mut phase = phase_rx.clone();
                let live = live.clone();
                let health = health.clone();
                let webhook = webhook.clone();
                let metrics = metrics.clone();
                tokio::spawn(async move {
                    let stream =
                        match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
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
                    let svc = service_fn(move |req| {
                        let webhook = webhook.clone();
                        let health = health.clone();
                        let metrics = metrics.clone();
                        async move {
                            Ok::<_, Infallible>(
                                handle_webhook(req, &webhook, &health, &metrics).await,
                            )
                        }
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
                    let h2 = stream.get_ref().1.alpn_protocol() == Some(b"h2".as_slice());
                    let conn = builder
                        .serve_connection(TokioIo::new(stream), svc)
                        .into_owned();
                    let _live = live;
                    tokio::pin!(conn);
                    let accepted = tokio::time::Instant::now();
                    // When to ask this connection to close. HTTP/2 clients get
                    // GOAWAY as soon as the drain starts (they reconnect,
                    // through the Service, to a ready replica) — but not before
                    // the connection is H2_SETTLE old, because a GOAWAY during
                    // the h2 handshake closes it under a request already sent.
                    // HTTP/1.1 clients get `Connection: close` on every response
                    // during the drain; idle ones are closed when the listener stops.
                    let close_when = async {
                        let _ = phase.wait_for(|p| *p != Phase::Serving).await;
                        if h2 && *phase.borrow() == Phase::Draining {
                            tokio::select! {
                                _ = tokio::time::sleep_until(accepted + H2_SETTLE) => {}
                                _ = phase.wait_for(|p| *p == Phase::Stopping) => {}
                            }
                        } else {
                            let _ = phase.wait_for(|p| *p == Phase::Stopping).await;
                        }
                    };
                    tokio::pin!(close_when);
                    tokio::select! {
                        r = conn.as_mut() => {
                            if let Err(e) = r {
                                tracing::debug!(%peer, error = %e, "connection ended with error");
                            }
                            return;
                        }
                        () = &mut close_when => conn.as_mut().graceful_shutdown(),
                    }
                    if let Err(e) = conn.await {
                        tracing::debug!(%peer, error = %e, "connection ended with error");
                    }
                });
            }
        })
    };

    // Ready only once a real TLS client gets a real answer from our own port.
    let leaf_store = store.clone();
    let check_addr = if addr.ip().is_unspecified() {
        SocketAddr::new(std::net::Ipv4Addr::LOCALHOST.into(), addr.port())
    } else {
        addr
    };
    {
        let health = health.clone();
        let metrics = metrics.clone();
        tokio::spawn(async move {
            let started = Instant::now();
            let mut failures = 0u32;
            let mut ready = false;
            loop {
                if health.draining.load(Ordering::SeqCst) {
                    return;
                }
                match crate::selfcheck::check(check_addr, leaf_store.leaf().as_ref()).await {
                    Ok(()) => {
                        failures = 0;
                        if !ready {
                            ready = true;
                            health.set_ready(&metrics);
                            tracing::info!(
                                elapsed_ms = started.elapsed().as_secs_f64() * 1000.0,
                                "self-check passed; ready"
                            );
                        }
                    }
                    Err(e) => {
                        failures += 1;
                        // Before the first success every failure counts; once
                        // serving, three in a row (not one slow answer under load).
                        if !ready || failures >= 3 {
                            if ready || failures % 20 == 1 {
                                tracing::warn!(error = %format!("{e:#}"), "self-check failed; not ready");
                            }
                            ready = false;
                            health.set_not_ready(&format!("self-check failed: {e:#}"), &metrics);
                        }
                    }
                }
                let pause = if ready {
                    SELF_CHECK_INTERVAL
                } else {
                    Duration::from_millis(50 * u64::from(failures.clamp(1, 20)))
                };
                tokio::time::sleep(pause).await;
            }
        });
    }

    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("installing SIGTERM handler")?;
    let mut int = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())
        .context("installing SIGINT handler")?;
    tokio::select! {
        _ = term.recv() => {},
        _ = int.recv() => {},
    }
    health.draining.store(true, Ordering::SeqCst);
    let _ = phase_tx.send(Phase::Draining);
    health.set_not_ready("draining: shutting down", &metrics);
    metrics.draining.set(1);
    tracing::info!(
        delay_ms = cfg.shutdown_delay.as_millis() as u64,
        "signal received: not ready; still serving until endpoints are removed"
    );
    let second = async {
        tokio::select! {
            _ = term.recv() => {},
            _ = int.recv() => {},
        }
    };
    tokio::select! {
        _ = tokio::time::sleep(cfg.shutdown_delay) => {},
        _ = second => {
            tracing::warn!("second signal: exiting now");
            return Ok(());
        }
    }
    let _ = phase_tx.send(Phase::Stopping);
    let _ = accept.await;
    tracing::info!("listener closed; finishing in-flight requests");
    let until = Instant::now() + FINISH_TIMEOUT;
    while Arc::strong_count(&live) > 1 && Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    if Arc::strong_count(&live) > 1 {
        tracing::warn!(
            open = Arc::strong_count(&live) - 1,
            "connections did not finish in time; exiting"
        );
    } else {
        tracing::info!("drained; exiting");
    }
    Ok(())
}

/// Polls the certificate files (Secret volumes swap a symlink, so inotify on
/// the file itself misses rotations) and swaps in a new certificate.
async fn watch_cert(store: Arc<CertStore>, metrics: Arc<Metrics>) {
    loop {
        tokio::time::sleep(CERT_POLL).await;
        match store.reload_if_changed() {
            Ok(true) => {
                tracing::info!("serving certificate reloaded");
                if let Some(leaf) = store.leaf() {
                    metrics.cert_not_after.set(crate::tls::not_after(&leaf));
                }
            }
            Ok(false) => {}
            Err(e) => {
                tracing::warn!(error = %format!("{e:#}"), "certificate files changed but could not be loaded; still serving the previous certificate")
            }
        }
    }
}

async fn handle_webhook(
    req: Request<Incoming>,
    webhook: &Webhook<Registry>,
    health: &Health,
    metrics: &Metrics,
) -> Response<Body> {
    let mut resp = webhook_response(req, webhook, metrics).await;
    if health.draining.load(Ordering::SeqCst) {
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

async fn admin_loop(
    listener: TcpListener,
    health: Arc<Health>,
    metrics: Arc<Metrics>,
    webhook: Arc<Webhook<Registry>>,
) {
    loop {
        let (tcp, _) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(error = %e, "admin accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let health = health.clone();
        let metrics = metrics.clone();
        let webhook = webhook.clone();
        tokio::spawn(async move {
            let svc = service_fn(move |req: Request<Incoming>| {
                let r = match (req.method(), req.uri().path()) {
                    (&Method::GET | &Method::HEAD, "/livez") => text(StatusCode::OK, "ok\n"),
                    (&Method::GET | &Method::HEAD, "/readyz") => match health.readiness() {
                        Ok(()) => text(StatusCode::OK, "ok\n"),
                        Err(why) => text(StatusCode::SERVICE_UNAVAILABLE, format!("{why}\n")),
                    },
                    (&Method::GET, "/metrics") => {
                        metrics.cache_entries.set(
                            i64::try_from(webhook.engine().resolver.cache_size())
                                .unwrap_or(i64::MAX),
                        );
                        let mut r = text(StatusCode::OK, metrics.encode());
                        r.headers_mut().insert(
                            header::CONTENT_TYPE,
                            header::HeaderValue::from_static(
                                "application/openmetrics-text; version=1.0.0; charset=utf-8",
                            ),
                        );
                        r
                    }
                    _ => text(
                        StatusCode::NOT_FOUND,
                        "not found: /livez /readyz /metrics\n",
                    ),
                };
                async move { Ok::<_, Infallible>(r) }
            });
            let mut b = hyper::server::conn::http1::Builder::new();
            b.timer(TokioTimer::new())
                .header_read_timeout(HEADER_READ_TIMEOUT);
            let _ = b.serve_connection(TokioIo::new(tcp), svc).await;
        });
    }
}
