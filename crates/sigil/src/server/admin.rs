//! The plain-HTTP admin port: `/livez`, `/readyz` (the readiness latch, with
//! the reason when not ready) and `/metrics` (OpenMetrics text).

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use http::{Method, Request, StatusCode, header};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use sigil_registry::Registry;
use tokio::net::TcpListener;

use super::conn::{HEADER_READ_TIMEOUT, text};
use super::health::Health;
use crate::admission::Webhook;
use crate::metrics::Metrics;
use sigil_kube::audit::continuous::Latest;

/// Serves the admin port until the process exits.
pub(super) async fn admin_loop(
    listener: TcpListener,
    health: Arc<Health>,
    metrics: Arc<Metrics>,
    webhook: Arc<Webhook<Registry>>,
    audit: Option<Arc<Latest>>,
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
        let audit = audit.clone();
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
                    (&Method::GET, "/audit") => audit_report(audit.as_deref()),
                    _ => text(
                        StatusCode::NOT_FOUND,
                        "not found: /livez /readyz /metrics /audit\n",
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

/// `GET /audit`: the last report this replica made (JSON, the AuditReport
/// schema), 404 when the audit is off, 503 before the first one completes.
fn audit_report(audit: Option<&Latest>) -> http::Response<super::conn::Body> {
    let Some(latest) = audit else {
        return text(
            StatusCode::NOT_FOUND,
            "the in-cluster audit is off (sigil serve --audit-interval)\n",
        );
    };
    match latest.json() {
        Some(json) => {
            let mut r = http::Response::new(http_body_util::Full::new(json));
            r.headers_mut().insert(
                header::CONTENT_TYPE,
                header::HeaderValue::from_static("application/json"),
            );
            r
        }
        None if latest.leading() => text(
            StatusCode::SERVICE_UNAVAILABLE,
            "the first audit has not finished yet\n",
        ),
        None => text(
            StatusCode::SERVICE_UNAVAILABLE,
            "this replica has not audited: another replica holds the audit Lease (see its /audit, or the Lease's holderIdentity)\n",
        ),
    }
}
