//! A Docker token service (the `auth.token` side of the real registry): it
//! signs ES256 JWTs with a key whose certificate is the registry's
//! `rootcertbundle`, and hands them out per the distribution token spec. The
//! registry itself is the real one; only the token issuer is written here,
//! as every registry deployment brings its own.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use aws_lc_rs::signature::{ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair};
use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use bytes::Bytes;
use http_body_util::Full;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair};
use serde_json::json;

use crate::registry::{ISSUER, SERVICE};

pub struct TokenServer {
    pub addr: SocketAddr,
    pub cert_pem: String,
    pub hits: Arc<AtomicUsize>,
    key: Arc<EcdsaKeyPair>,
    cert_der: Vec<u8>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for TokenServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn sign(key: &EcdsaKeyPair, cert_der: &[u8], subject: &str, access: serde_json::Value) -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let header = json!({"typ": "JWT", "alg": "ES256", "x5c": [STANDARD.encode(cert_der)]});
    let claims = json!({"iss": ISSUER, "sub": subject, "aud": SERVICE, "exp": now + 300, "nbf": now - 10, "iat": now, "jti": format!("{}", crate::registry::uniq()), "access": access});
    let input = format!(
        "{}.{}",
        URL_SAFE_NO_PAD.encode(header.to_string()),
        URL_SAFE_NO_PAD.encode(claims.to_string())
    );
    let sig = key
        .sign(&aws_lc_rs::rand::SystemRandom::new(), input.as_bytes())
        .unwrap();
    format!("{input}.{}", URL_SAFE_NO_PAD.encode(sig.as_ref()))
}

impl TokenServer {
    /// Grants `pull` on any repository to `user:password`; anonymous callers get no access.
    pub async fn start(user: &'static str, password: &'static str) -> TokenServer {
        let kp = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(vec!["token-issuer".to_string()]).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let cert = params.self_signed(&kp).unwrap();
        let key = Arc::new(
            EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &kp.serialize_der())
                .unwrap(),
        );
        let cert_der = cert.der().to_vec();
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let hits = Arc::new(AtomicUsize::new(0));
        let (k, c, h) = (key.clone(), cert_der.clone(), hits.clone());
        let want = format!("Basic {}", STANDARD.encode(format!("{user}:{password}")));
        let task = tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = l.accept().await else {
                    return;
                };
                let (k, c, h, want) = (k.clone(), c.clone(), h.clone(), want.clone());
                tokio::spawn(async move {
                    let svc = service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                        h.fetch_add(1, Ordering::SeqCst);
                        let authed = req
                            .headers()
                            .get("authorization")
                            .and_then(|v| v.to_str().ok())
                            == Some(want.as_str());
                        let q = req.uri().query().unwrap_or_default().to_string();
                        let scope = q
                            .split('&')
                            .find_map(|kv| kv.strip_prefix("scope="))
                            .map(|s| s.replace("%3A", ":").replace("%2F", "/"))
                            .unwrap_or_default();
                        let (k, c) = (k.clone(), c.clone());
                        async move {
                            let resp = if !authed {
                                hyper::Response::builder().status(401).body(Full::new(Bytes::from_static(br#"{"errors":[{"code":"UNAUTHORIZED","message":"bad credentials"}]}"#)))
                            } else {
                                let parts: Vec<&str> = scope.split(':').collect();
                                let access = if parts.len() == 3 {
                                    json!([{"type": parts[0], "name": parts[1], "actions": ["pull"]}])
                                } else {
                                    json!([])
                                };
                                let tok = sign(&k, &c, "robot", access);
                                hyper::Response::builder()
                                    .status(200)
                                    .header("content-type", "application/json")
                                    .body(Full::new(Bytes::from(
                                        json!({"token": tok, "expires_in": 300}).to_string(),
                                    )))
                            };
                            Ok::<_, Infallible>(resp.unwrap())
                        }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(tcp), svc)
                        .await;
                });
            }
        });
        TokenServer {
            addr,
            cert_pem: cert.pem(),
            hits,
            key,
            cert_der,
            task,
        }
    }

    /// A token with push and pull on `repo`, for the test's own uploads.
    pub fn push_token(&self, repo: &str) -> String {
        sign(
            &self.key,
            &self.cert_der,
            "pusher",
            json!([{"type": "repository", "name": repo, "actions": ["pull", "push"]}]),
        )
    }
}

/// A registry in token mode behind a token service that knows `user` and
/// `password`, with `repo` pushable; returns both (keep the server alive).
pub async fn token_registry(
    user: &'static str,
    password: &'static str,
    repo: &str,
) -> (TokenServer, crate::registry::TestRegistry) {
    let ts = TokenServer::start(user, password).await;
    let mut reg = crate::registry::TestRegistry::start(crate::registry::Mode::Token {
        realm: format!("http://{}/token", ts.addr),
        cert_pem: ts.cert_pem.clone(),
    })
    .await;
    reg.bearer = Some(ts.push_token(repo));
    (ts, reg)
}
