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
                let (health, metrics, webhook, audit) = (
                    health.clone(),
                    metrics.clone(),
                    webhook.clone(),
                    audit.clone(),
                );
                async move {
                    let r = match (req.method(), req.uri().path()) {
                        (&Method::GET | &Method::HEAD, "/livez") => text(StatusCode::OK, "ok\n"),
                        (&Method::GET | &Method::HEAD, "/readyz") => match health.readiness() {
                            Ok(()) => text(StatusCode::OK, "ok\n"),
                            Err(why) => text(StatusCode::SERVICE_UNAVAILABLE, format!("{why}\n")),
                        },
                        (&Method::GET, "/metrics") => {
                            metrics_page(&metrics, webhook.engine().resolver.cache_size().await)
                        }
                        (&Method::GET, "/audit") => audit_report(audit.as_deref()),
                        _ => text(
                            StatusCode::NOT_FOUND,
                            "not found: /livez /readyz /metrics /audit\n",
                        ),
                    };
                    Ok::<_, Infallible>(r)
                }
            });
            let mut b = hyper::server::conn::http1::Builder::new();
            b.timer(TokioTimer::new())
                .header_read_timeout(HEADER_READ_TIMEOUT);
            let _ = b.serve_connection(TokioIo::new(tcp), svc).await;
        });
    }
}

/// `GET /metrics`: the OpenMetrics page, with the digest cache's size as of
/// this scrape.
fn metrics_page(metrics: &Metrics, cache_entries: u64) -> http::Response<super::conn::Body> {
    metrics
        .cache_entries
        .set(i64::try_from(cache_entries).unwrap_or(i64::MAX));
    let mut r = text(StatusCode::OK, metrics.encode());
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static(
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        ),
    );
    r
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
