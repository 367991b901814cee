//! The node DaemonSet's probe and metrics port (`sigil node sync
//! --listen`): `/livez`, `/readyz` (false, with the reason, while the node
//! lacks the cluster's policy or the verifier) and `/metrics` (Prometheus
//! text). Plain HTTP/1, a header deadline, nothing else: what is reported
//! is [`super::sync::Status`].

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;

use super::sync::Status;

fn page(code: StatusCode, body: String, kind: &'static str) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = code;
    r.headers_mut()
        .insert(header::CONTENT_TYPE, header::HeaderValue::from_static(kind));
    r
}

/// Answers on `listener` until the process exits.
pub async fn serve(listener: TcpListener, status: Arc<Status>) {
    loop {
        let Ok((tcp, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let status = status.clone();
        tokio::spawn(async move {
            let svc = service_fn(move |req: Request<Incoming>| {
                let status = status.clone();
                async move {
                    let plain = "text/plain; charset=utf-8";
                    let r = match (req.method(), req.uri().path()) {
                        (&Method::GET | &Method::HEAD, "/livez") => {
                            page(StatusCode::OK, "ok\n".into(), plain)
                        }
                        (&Method::GET | &Method::HEAD, "/readyz") => match status.readiness() {
                            Ok(()) => page(StatusCode::OK, "ok\n".into(), plain),
                            Err(why) => {
                                page(StatusCode::SERVICE_UNAVAILABLE, format!("{why}\n"), plain)
                            }
                        },
                        (&Method::GET, "/metrics") => page(
                            StatusCode::OK,
                            status.metrics(),
                            "text/plain; version=0.0.4; charset=utf-8",
                        ),
                        _ => page(
                            StatusCode::NOT_FOUND,
                            "not found: /livez /readyz /metrics\n".into(),
                            plain,
                        ),
                    };
                    Ok::<_, Infallible>(r)
                }
            });
            let mut b = hyper::server::conn::http1::Builder::new();
            b.timer(TokioTimer::new())
                .header_read_timeout(Duration::from_secs(10));
            let _ = b.serve_connection(TokioIo::new(tcp), svc).await;
        });
    }
}
