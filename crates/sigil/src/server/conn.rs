//! The webhook port: accepting TCP ourselves (no more connections than
//! [`super::limits::Limits`] allow, with back-pressure), the TLS handshake under a timeout
//! in its own task, HTTP/1.1 and HTTP/2 with explicit limits, and
//! `POST /mutate` with the whole request — headers, body and decision —
//! inside the admission's deadline.
//!
//! Each connection is driven here, not by a generic graceful-shutdown
//! helper, so one select loop can close it for every reason: no first
//! request in time, idle too long, the drain. HTTP/2 connections opened
//! before the drain get GOAWAY [`H2_SETTLE`] after it starts, so their
//! clients move to a ready replica while this one still answers; everything
//! else is closed gracefully when the listener stops. HTTP/1.1 responses
//! carry `Connection: close` during the drain.

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
use sigil_registry::Registry;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;

use super::Phase;
use super::health::Health;
use super::limits::{Activity, Conns};
use crate::admission::{MAX_BODY_BYTES, Webhook, deadline_for, timeout_from_query};
use crate::metrics::Metrics;

/// How long a client may take to send request headers.
pub(super) const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a connection told to close may take to finish what is in
/// flight before it is dropped (a drain waits longer: `FINISH_TIMEOUT`).
const CLOSE_GRACE: Duration = Duration::from_secs(5);
/// HTTP/2 limits: streams per connection, header list size, and the reset
/// budgets that stop rapid-reset floods (CVE-2023-44487 and its kin).
const H2_MAX_STREAMS: u32 = 256;
const H2_MAX_HEADER_LIST: u32 = 64 << 10;
const H2_MAX_PENDING_RESETS: usize = 20;
const H2_MAX_LOCAL_RESETS: usize = 1024;
/// HTTP/2 keep-alive: a ping this often; no answer within the timeout closes.
const H2_PING_INTERVAL: Duration = Duration::from_secs(30);
const H2_PING_TIMEOUT: Duration = Duration::from_secs(20);
/// HTTP/1 read buffer (headers must fit; the body is read in chunks).
const H1_MAX_BUF: usize = 64 << 10;
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
    /// `--client-ca-file`: `POST /mutate` needs a verified client certificate.
    pub(super) client_auth: bool,
    pub(super) health: Arc<Health>,
    pub(super) webhook: Arc<Webhook<Registry>>,
    pub(super) metrics: Arc<Metrics>,
    pub(super) conns: Arc<Conns>,
}

/// Accepts connections until the phase is [`Phase::Stopping`], never more
/// at once than the connection cap: while every slot is taken the listener
/// is not polled (the kernel queues, then refuses), so a flood of idle
/// connections cannot take the descriptors the admin port needs.
pub(super) async fn accept_loop(
    listener: TcpListener,
    shared: Shared,
    phase: watch::Receiver<Phase>,
) {
    let mut stopping = phase.clone();
    let mut full_since: Option<Instant> = None;
    loop {
        let slot = tokio::select! {
            s = shared.conns.slot() => s,
            _ = stopping.wait_for(|p| *p == Phase::Stopping) => break,
        };
        if let Some(t) = full_since.take() {
            tracing::warn!(
                cap = shared.conns.cap,
                waited_ms = t.elapsed().as_millis() as u64,
                "webhook connections were at their cap; accepting again"
            );
        }
        let conn = tokio::select! {
            c = listener.accept() => c,
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
        if shared.conns.open() >= shared.conns.cap {
            full_since = Some(Instant::now());
        }
        let _ = tcp.set_nodelay(true);
        let accepted_serving = *phase.borrow() == Phase::Serving;
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
        let phase = phase.clone();
        cores.spawn(async move {
            let _slot = slot;
            match TcpStream::from_std(tcp) {
                Ok(tcp) => serve_connection(tcp, peer, shared, phase, accepted_serving).await,
                Err(e) => tracing::debug!(%peer, error = %e, "could not register the connection"),
            }
        });
    }
}

/// Why a connection is being closed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Closing {
    Drain,
    Idle,
}

/// TLS handshake, then HTTP until the client, a limit or the drain closes it.
async fn serve_connection(
    tcp: TcpStream,
    peer: SocketAddr,
    shared: Shared,
    mut phase: watch::Receiver<Phase>,
    accepted_serving: bool,
) {
    let limits = shared.conns.limits;
    let activity = Activity::new();
    // The handshake shares the first-request deadline.
    let handshake = tokio::time::timeout(limits.first_request, shared.acceptor.accept(tcp));
    let stream = match handshake.await {
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
    // rustls records peer certificates only once they verified.
    let unauthenticated = shared.client_auth
        && stream
            .get_ref()
            .1
            .peer_certificates()
            .is_none_or(|c| c.is_empty());
    let Shared {
        health,
        webhook,
        metrics,
        conns,
        ..
    } = shared;
    let act = activity.clone();
    let svc = service_fn(move |req| {
        let (webhook, health, metrics, conns) = (
            webhook.clone(),
            health.clone(),
            metrics.clone(),
            conns.clone(),
        );
        let in_flight = act.begin();
        async move {
            let r = if unauthenticated && !is_self_check(&req) {
                text(
                    StatusCode::UNAUTHORIZED,
                    "a client certificate issued by the --client-ca-file CA is required\n",
                )
            } else {
                handle_webhook(req, &webhook, &health, &metrics, &conns).await
            };
            drop(in_flight);
            Ok::<_, Infallible>(r)
        }
    });
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT)
        .max_buf_size(H1_MAX_BUF)
        .keep_alive(true);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(H2_MAX_STREAMS)
        .max_header_list_size(H2_MAX_HEADER_LIST)
        .max_pending_accept_reset_streams(H2_MAX_PENDING_RESETS)
        .max_local_error_reset_streams(H2_MAX_LOCAL_RESETS)
        .keep_alive_interval(H2_PING_INTERVAL)
        .keep_alive_timeout(H2_PING_TIMEOUT);
    let conn = builder
        .serve_connection(TokioIo::new(stream), svc)
        .into_owned();
    let mut conn = std::pin::pin!(conn);
    // HTTP/2 connections opened while serving hear of the drain early.
    let early = h2 && accepted_serving;
    let mut closing: Option<(Closing, Instant)> = None;
    // When an early HTTP/2 connection gets its GOAWAY (the connection keeps
    // being served meanwhile).
    let mut goaway_at: Option<Instant> = None;
    let result = loop {
        let close_at = if closing.is_some() {
            None
        } else {
            activity.close_at(&limits)
        };
        let dropped_at = closing.map(|(_, at)| at + CLOSE_GRACE);
        tokio::select! {
            r = conn.as_mut() => break r,
            draining = async {
                phase
                    .wait_for(|p| *p == Phase::Stopping || (early && *p == Phase::Draining))
                    .await
                    .is_ok_and(|p| *p == Phase::Draining)
            }, if closing.is_none() && goaway_at.is_none() => {
                if draining {
                    // A GOAWAY right after the h2 handshake would close a
                    // connection under a request already sent.
                    goaway_at = Some(Instant::now() + H2_SETTLE);
                } else {
                    conn.as_mut().graceful_shutdown();
                    closing = Some((Closing::Drain, Instant::now()));
                }
            }
            _ = sleep_until_opt(goaway_at), if closing.is_none() => {
                conn.as_mut().graceful_shutdown();
                closing = Some((Closing::Drain, Instant::now()));
            }
            _ = sleep_until_opt(close_at) => {
                // Re-checked: a request may have started meanwhile.
                if activity.close_at(&limits).is_some_and(|t| t <= Instant::now()) {
                    tracing::debug!(%peer, h2, "closing a connection with no request in time or idle too long");
                    conn.as_mut().graceful_shutdown();
                    closing = Some((Closing::Idle, Instant::now()));
                }
            }
            _ = sleep_until_opt(dropped_at.filter(|_| closing.is_some_and(|(c, _)| c == Closing::Idle))) => {
                tracing::debug!(%peer, "connection did not close in time; dropped");
                return;
            }
        }
    };
    if let Err(e) = result {
        tracing::debug!(%peer, error = %e, "connection ended with error");
    }
}

/// Whether a request carries this process's self-check secret.
fn is_self_check(req: &Request<Incoming>) -> bool {
    req.headers()
        .get(crate::selfcheck::TOKEN_HEADER)
        .is_some_and(|v| v.as_bytes() == crate::selfcheck::token().as_bytes())
}

/// Sleeps until `at`, or forever when there is none.
async fn sleep_until_opt(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at.into()).await,
        None => std::future::pending().await,
    }
}

async fn handle_webhook(
    req: Request<Incoming>,
    webhook: &Webhook<Registry>,
    health: &Health,
    metrics: &Metrics,
    conns: &Conns,
) -> Response<Body> {
    let mut resp = webhook_response(req, webhook, metrics, conns).await;
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
    conns: &Conns,
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
    let body = match read_body(req.into_body(), conns, deadline).await {
        Ok((b, _budget)) => b,
        Err(r) => return r,
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

/// Reads a body of at most [`MAX_BODY_BYTES`] before `deadline`, each chunk
/// paid for from the connections' shared body budget (held until the
/// request is answered). A body that is too slow is answered 408 and its
/// connection closed; its memory is freed with the future.
async fn read_body(
    body: Incoming,
    conns: &Conns,
    deadline: Instant,
) -> Result<(Bytes, Option<tokio::sync::OwnedSemaphorePermit>), Response<Body>> {
    let mut body = Limited::new(body, MAX_BODY_BYTES);
    // A body that arrives as one frame (most: a review is a few KiB) is
    // kept as that frame, not copied; a second frame starts a buffer.
    let mut first: Option<Bytes> = None;
    let mut buf = bytes::BytesMut::new();
    let mut budget: Option<tokio::sync::OwnedSemaphorePermit> = None;
    let read = async {
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| {
                let status = if e
                    .downcast_ref::<http_body_util::LengthLimitError>()
                    .is_some()
                {
                    StatusCode::PAYLOAD_TOO_LARGE
                } else {
                    StatusCode::BAD_REQUEST
                };
                text(status, format!("reading request body: {e}\n"))
            })?;
            if let Ok(data) = frame.into_data() {
                let held = first.as_ref().map_or(0, Bytes::len) + buf.len();
                if held + data.len() > conns.body_budget() {
                    return Err(text(
                        StatusCode::PAYLOAD_TOO_LARGE,
                        "request body larger than the server's body memory\n",
                    ));
                }
                let permit = conns.body_bytes(data.len()).await.ok_or_else(|| {
                    text(StatusCode::SERVICE_UNAVAILABLE, "server is shutting down\n")
                })?;
                match &mut budget {
                    Some(b) => b.merge(permit),
                    None => budget = Some(permit),
                }
                if let Some(f) = first.take() {
                    buf.reserve(f.len() + data.len());
                    buf.extend_from_slice(&f);
                    buf.extend_from_slice(&data);
                } else if buf.is_empty() {
                    first = Some(data);
                } else {
                    buf.extend_from_slice(&data);
                }
            }
        }
        Ok(())
    };
    match tokio::time::timeout_at(deadline.into(), read).await {
        Ok(Ok(())) => Ok((first.unwrap_or_else(|| buf.freeze()), budget)),
        Ok(Err(r)) => Err(r),
        Err(_) => {
            let mut r = text(
                StatusCode::REQUEST_TIMEOUT,
                "the request body did not arrive before the admission deadline\n",
            );
            r.headers_mut().insert(
                header::CONNECTION,
                header::HeaderValue::from_static("close"),
            );
            Err(r)
        }
    }
}

struct InflightGuard<'a>(&'a Metrics);

impl Drop for InflightGuard<'_> {
    fn drop(&mut self) {
        self.0.inflight.dec();
    }
}
