//! The baseline: a bare hyper+rustls HTTPS echo server, run as a child
//! process like sigil, answering every request with its body.

use std::net::SocketAddr;

use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;

/// The baseline: hyper + rustls answering every POST with its own body.
pub fn echo_server() {
    let addr: SocketAddr = std::env::var("ECHO_ADDR")
        .expect("ECHO_ADDR")
        .parse()
        .expect("addr");
    let dir = std::path::PathBuf::from(std::env::var("ECHO_DIR").expect("ECHO_DIR"));
    let cert = sigil::tls::self_signed(&["localhost".into()]).expect("cert");
    let cfg = sigil::tls::server_config(
        sigil::tls::CertStore::new(&cert, None).expect("store"),
        None,
    )
    .expect("tls");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("rt");
    rt.block_on(async move {
        let l = tokio::net::TcpListener::bind(addr).await.expect("bind");
        std::fs::write(dir.join("ca.pem"), cert.ca_pem.unwrap_or_default()).expect("ca");
        let acceptor = tokio_rustls::TlsAcceptor::from(cfg);
        loop {
            let (tcp, _) = l.accept().await.expect("accept");
            let _ = tcp.set_nodelay(true);
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(s) = acceptor.accept(tcp).await else {
                    return;
                };
                let svc = hyper::service::service_fn(
                    |req: hyper::Request<hyper::body::Incoming>| async move {
                        let b = req
                            .into_body()
                            .collect()
                            .await
                            .map(|c| c.to_bytes())
                            .unwrap_or_default();
                        Ok::<_, std::convert::Infallible>(hyper::Response::new(Full::new(b)))
                    },
                );
                let _ = hyper_util::server::conn::auto::Builder::new(
                    hyper_util::rt::TokioExecutor::new(),
                )
                .serve_connection(TokioIo::new(s), svc)
                .await;
            });
        }
    });
}
