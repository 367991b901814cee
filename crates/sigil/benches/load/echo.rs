//! The baseline: a bare hyper+rustls HTTPS echo server, run as a child
//! process like sigil, answering every request with its body.

use std::net::SocketAddr;

use sigil_testkit::sigil::KillOnDrop;

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

/// The echo server as a child process of this benchmark; its CA once it listens.
pub async fn start(dir: &std::path::Path) -> (KillOnDrop, crate::side::Target) {
    let echo_dir = dir.join("echo");
    std::fs::create_dir_all(&echo_dir).expect("echo dir");
    let echo_port = sigil_testkit::registry::free_port();
    let echo = KillOnDrop(
        std::process::Command::new(std::env::current_exe().expect("exe"))
            .arg("--echo-server")
            .env("ECHO_ADDR", format!("127.0.0.1:{echo_port}"))
            .env("ECHO_DIR", &echo_dir)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::inherit())
            .spawn()
            .expect("spawn echo"),
    );
    let echo_ca = echo_dir.join("ca.pem");
    let until = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !echo_ca.exists() && std::time::Instant::now() < until {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    let target = crate::side::Target {
        pid: echo.0.id(),
        addr: format!("127.0.0.1:{echo_port}").parse().expect("addr"),
        tls: crate::client::client_tls(&std::fs::read(&echo_ca).expect("echo ca")),
    };
    (echo, target)
}
