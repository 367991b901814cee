//! The readiness self-check: a real TLS client against sigil's own webhook port.
//!
//! Owns proving that the port serves: TCP connect, TLS handshake that accepts
//! only the exact certificate sigil loaded (so a stale or foreign certificate
//! fails), and a synthetic AdmissionReview that must come back with its uid.
//! It does not decide readiness policy; the server latches the result.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use crate::error::{Context as _, Error, Result};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};

const CHECK_TIMEOUT: Duration = Duration::from_secs(2);
/// Header carrying [`token`]: with `--client-ca-file` the webhook requires a
/// client certificate, which the self-check has none of; it proves itself
/// with a secret that never leaves the process instead.
pub const TOKEN_HEADER: &str = "x-sigil-self-check";

/// This process's self-check secret (random, made once).
pub fn token() -> &'static str {
    static TOKEN: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    TOKEN.get_or_init(|| {
        let mut b = [0u8; 24];
        // Falls back to a value no client can guess from outside only if the
        // system RNG fails, which aws-lc treats as fatal anyway.
        let _ = crate::tls::provider().secure_random.fill(&mut b);
        b.iter().map(|x| format!("{x:02x}")).collect()
    })
}

/// Accepts exactly one certificate, byte for byte, with a valid handshake signature.
#[derive(Debug)]
struct PinnedLeaf {
    leaf: Option<CertificateDer<'static>>,
    provider: Arc<rustls::crypto::CryptoProvider>,
}

impl ServerCertVerifier for PinnedLeaf {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match &self.leaf {
            Some(l) if l.as_ref() == end_entity.as_ref() => Ok(ServerCertVerified::assertion()),
            _ => Err(rustls::Error::General(
                "served certificate is not the one sigil loaded".into(),
            )),
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// One self-check round trip.
pub async fn check(addr: SocketAddr, leaf: Option<&CertificateDer<'static>>) -> Result<()> {
    tokio::time::timeout(CHECK_TIMEOUT, check_inner(addr, leaf))
        .await
        .map_err(|_| Error::Invalid(format!("no answer within {CHECK_TIMEOUT:?}")))?
}

async fn check_inner(addr: SocketAddr, leaf: Option<&CertificateDer<'static>>) -> Result<()> {
    let provider = crate::tls::provider();
    let verifier = Arc::new(PinnedLeaf {
        leaf: leaf.cloned(),
        provider: provider.clone(),
    });
    let cfg = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .context("TLS versions")?
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(cfg));
    let tcp = tokio::net::TcpStream::connect(addr)
        .await
        .with_context(|| format!("connecting to {addr}"))?;
    let tls = connector
        .connect(
            ServerName::try_from("localhost")
                .map_err(|e| Error::Invalid(format!("server name: {e}")))?,
            tcp,
        )
        .await
        .context("TLS handshake")?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .context("HTTP handshake")?;
    tokio::spawn(conn);
    let uid = format!("sigil-self-check-{}", std::process::id());
    let req = http::Request::post("/mutate?timeout=2s")
        .header(http::header::HOST, "localhost")
        .header(http::header::CONTENT_TYPE, "application/json")
        .header(TOKEN_HEADER, token())
        .body(Full::new(Bytes::from(crate::admission::synthetic_review(
            &uid,
        ))))
        .map_err(|e| Error::Invalid(format!("building the self-check request: {e}")))?;
    let resp = sender
        .send_request(req)
        .await
        .context("sending synthetic AdmissionReview")?;
    let status = resp.status();
    let body = resp
        .into_body()
        .collect()
        .await
        .context("reading the answer")?
        .to_bytes();
    if !status.is_success() {
        return Err(Error::Invalid(format!(
            "synthetic AdmissionReview answered {status}"
        )));
    }
    let v: serde_json::Value = serde_json::from_slice(&body)
        .map_err(|e| Error::Invalid(format!("answer is not JSON: {e}")))?;
    if v.pointer("/response/uid").and_then(|u| u.as_str()) != Some(uid.as_str()) {
        return Err(Error::Invalid(
            "answer does not echo the request uid".into(),
        ));
    }
    Ok(())
}
