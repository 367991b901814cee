//! What a signer (or whoever serves a distribution point) must never make
//! notation's revocation check do: keep a CRL its CA did not sign, hold
//! more memory than the budget, fetch a URL of a certificate outside the
//! verified path, reach an internal address or another host by redirect,
//! show a connection error to a tenant, or starve other CAs' CRLs of slots
//! and time (docs/security.md). Each test is named after the door it shuts.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use rcgen::DnType;
use serde_json::json;
use sigil_core::verify::{NotationLevel, NotationSpec};
use sigil_testkit::pki::{Ca, Issued};
use sigil_testkit::signing::notation_jws_chain;
use sigil_testkit::tuf::StaticServer;
use sigil_verify::crl::{Crls, Lookup, MAX_CRL_BYTES, MAX_URLS, MAX_URLS_PER_ISSUER};
use sigil_verify::notation::{Envelope, NotationCheck};
use x509_parser::prelude::FromDer as _;

const DIGEST: &str = "sha256:a136cc4e785798e5e8483047cf621cf0a0300a93d47703a3f066c340c070f5cf";
const SUBJECT: &[(DnType, &str)] = &[(DnType::OrganizationName, "acme")];

fn loopback() -> Vec<ipnet::IpNet> {
    vec!["127.0.0.0/8".parse().unwrap()]
}

fn now() -> i64 {
    time::OffsetDateTime::now_utc().unix_timestamp()
}

fn spki(der: &[u8]) -> Vec<u8> {
    let (_, c) = x509_parser::certificate::X509Certificate::from_der(der).unwrap();
    c.public_key().raw.to_vec()
}

/// A root and an intermediate; the intermediate's CRL is at `cdp`.
struct Chain {
    root: Ca,
    inter: Ca,
    leaf: Issued,
}

impl Chain {
    fn new(cdp: &str) -> Chain {
        let root = Ca::root("boundary root");
        let inter = root.intermediate("boundary intermediate", None);
        let leaf = inter.leaf(SUBJECT, Some(cdp), None);
        Chain { root, inter, leaf }
    }

    fn envelope(&self, extra: &[Vec<u8>]) -> Envelope {
        let mut x5c = vec![self.leaf.der.clone(), self.inter.der.clone()];
        x5c.extend(extra.iter().cloned());
        let bytes = notation_jws_chain(
            &self.leaf.key,
            "ES256",
            &x5c,
            DIGEST,
            1,
            json!({"io.cncf.notary.signingTime": "2026-11-19T03:06:40Z"}),
            None,
        );
        Envelope::from_jws(&bytes).unwrap()
    }

    /// Writes the intermediate's CRL (valid an hour) where `dir` is served.
    fn publish(&self, dir: &std::path::Path, now: i64) {
        std::fs::write(
            dir.join("inter.crl"),
            self.inter.crl(&[], now - 60, now + 3600),
        )
        .unwrap();
    }

    /// Checks `env` once (the CRLs are wanted), fetches what is due, and
    /// answers the check after the fetch.
    async fn check_after_fetch(
        &self,
        env: &Envelope,
        crls: &Arc<Crls>,
        now: i64,
    ) -> Result<Vec<String>, sigil_core::SignatureProblem> {
        let check = self.check(crls);
        let _ = check.check(env, DIGEST, now);
        crls.fetch_due(now).await;
        check.check(env, DIGEST, now)
    }

    fn check(&self, crls: &Arc<Crls>) -> NotationCheck {
        let spec = NotationSpec {
            level: NotationLevel::Strict,
            trust_roots: vec!["(loaded by the test)".into()],
            ..NotationSpec::default()
        };
        NotationCheck::from_spec(
            &spec,
            vec![self.root.der.clone()],
            vec![],
            Some(crls.clone()),
        )
        .unwrap()
    }
}

/// CRLs were parsed and kept before their signature was checked: four
/// 31 MiB junk CRLs took a process from 27 MB to 1 GB. Now a fetched CRL
/// is kept only if the CA it was fetched for signed it — junk, a forged
/// CRL under the CA's name and an oversized one all leave nothing held.
#[tokio::test]
async fn a_crl_its_ca_did_not_sign_is_never_kept() {
    let dir = tempfile::tempdir().unwrap();
    let server = StaticServer::start(dir.path().to_path_buf()).await;
    let chain = Chain::new(&format!("{}inter.crl", server.url()));
    let env = chain.envelope(&[]);
    // Same name as the intermediate, another key.
    let forger = Ca::root("boundary intermediate");
    let now = now();
    for (what, bytes) in [
        ("junk", vec![0x30; 1 << 20]),
        ("forged", forger.crl(&[], now - 60, now + 3600)),
        ("oversized", vec![0x30; MAX_CRL_BYTES + 1]),
    ] {
        std::fs::write(dir.path().join("inter.crl"), bytes).unwrap();
        let crls = Arc::new(Crls::with_allowed(loopback()));
        let check = chain.check(&crls);
        assert!(
            check.check(&env, DIGEST, now).is_err(),
            "{what}: nothing fetched yet"
        );
        assert_eq!(crls.fetch_due(now).await, 1, "{what}");
        assert_eq!(crls.bytes_held(), 0, "{what} was kept");
        assert!(check.check(&env, DIGEST, now).is_err(), "{what}");
    }
    // The CA's own CRL is kept and counts.
    let good = chain.inter.crl(&[], now - 60, now + 3600);
    std::fs::write(dir.path().join("inter.crl"), &good).unwrap();
    let crls = Arc::new(Crls::with_allowed(loopback()));
    let check = chain.check(&crls);
    let _ = check.check(&env, DIGEST, now);
    crls.fetch_due(now).await;
    assert_eq!(crls.bytes_held(), good.len());
    assert_eq!(check.check(&env, DIGEST, now), Ok(vec![]));
}

/// Revocation looked up the distribution points of every certificate in the
/// envelope's `x5c` — an unsigned header anyone can append to. Now only the
/// path that verified to the trust store is followed: a certificate riding
/// along names a URL that is never fetched.
#[tokio::test]
async fn a_certificate_outside_the_verified_path_makes_sigil_fetch_nothing() {
    let (good_dir, evil_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (good, evil) = tokio::join!(
        StaticServer::start(good_dir.path().to_path_buf()),
        StaticServer::start(evil_dir.path().to_path_buf())
    );
    let chain = Chain::new(&format!("{}inter.crl", good.url()));
    let now = now();
    std::fs::write(
        good_dir.path().join("inter.crl"),
        chain.inter.crl(&[], now - 60, now + 3600),
    )
    .unwrap();
    let stranger = Ca::root("stranger").leaf(SUBJECT, Some(&format!("{}scan", evil.url())), None);
    let env = chain.envelope(std::slice::from_ref(&stranger.der));
    let crls = Arc::new(Crls::with_allowed(loopback()));
    let check = chain.check(&crls);
    let _ = check.check(&env, DIGEST, now);
    crls.fetch_due(now).await;
    assert_eq!(check.check(&env, DIGEST, now), Ok(vec![]));
    assert_eq!(
        evil.hits.load(std::sync::atomic::Ordering::Relaxed),
        0,
        "a URL of a certificate outside the path was fetched"
    );
}

/// A distribution point on an internal address (here loopback) is refused
/// unless the platform allows its network, and what went wrong on the
/// network never reaches the denial a tenant reads (it was an internal port
/// scanner: connection errors were echoed).
#[tokio::test]
async fn internal_addresses_are_refused_and_transport_errors_stay_in_the_logs() {
    let dir = tempfile::tempdir().unwrap();
    let server = StaticServer::start(dir.path().to_path_buf()).await;
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    for cdp in [
        format!("{}inter.crl", server.url()),
        format!("http://{closed}/inter.crl"),
        "http://localhost:1/inter.crl".to_owned(),
    ] {
        let chain = Chain::new(&cdp);
        let now = now();
        std::fs::write(
            dir.path().join("inter.crl"),
            chain.inter.crl(&[], now - 60, now + 3600),
        )
        .unwrap();
        let env = chain.envelope(&[]);
        let crls = Arc::new(Crls::default());
        let check = chain.check(&crls);
        let _ = check.check(&env, DIGEST, now);
        crls.fetch_due(now).await;
        let e = check.check(&env, DIGEST, now).unwrap_err().to_string();
        assert!(
            e.contains("not available: the last fetch failed (sigil's logs say why)"),
            "{cdp}: {e}"
        );
        for leak in [
            "refused",
            "internal address",
            "resolves",
            "error sending",
            "tcp",
        ] {
            assert!(!e.contains(leak), "{cdp}: transport detail {leak:?} in {e}");
        }
    }
    assert_eq!(server.hits.load(std::sync::atomic::Ordering::Relaxed), 0);
}

/// An HTTP server on `addr` that answers every request with a redirect to `to`.
async fn redirector(addr: &str, to: String) -> std::net::SocketAddr {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let l = tokio::net::TcpListener::bind(addr).await.unwrap();
    let at = l.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut tcp, _)) = l.accept().await {
            let to = to.clone();
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                let _ = tcp.read(&mut buf).await;
                let answer = format!(
                    "HTTP/1.1 302 Found\r\nLocation: {to}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                );
                let _ = tcp.write_all(answer.as_bytes()).await;
            });
        }
    });
    at
}

/// The fetch followed redirects to any host. Now a redirect to another host
/// is not followed (the allowed network holds both here: the host is what
/// is checked), and one within the same host is.
#[tokio::test]
async fn a_redirect_to_another_host_is_not_followed() {
    let dir = tempfile::tempdir().unwrap();
    let server = StaticServer::start(dir.path().to_path_buf()).await;
    let away = redirector("127.0.0.2:0", format!("{}inter.crl", server.url())).await;
    let chain = Chain::new(&format!("http://{away}/inter.crl"));
    let now = now();
    chain.publish(dir.path(), now);
    let crls = Arc::new(Crls::with_allowed(loopback()));
    let got = chain
        .check_after_fetch(&chain.envelope(&[]), &crls, now)
        .await;
    assert!(got.is_err());
    assert_eq!(server.hits.load(std::sync::atomic::Ordering::Relaxed), 0);
    // Within one host, a redirect is followed.
    let port = server.addr.port();
    let same = redirector("127.0.0.1:0", format!("http://127.0.0.1:{port}/inter.crl")).await;
    let chain = Chain::new(&format!("http://127.0.0.1:{}/moved.crl", same.port()));
    chain.publish(dir.path(), now);
    let crls = Arc::new(Crls::with_allowed(loopback()));
    let got = chain
        .check_after_fetch(&chain.envelope(&[]), &crls, now)
        .await;
    assert_eq!(got, Ok(vec![]));
}

/// 512 junk URLs filled the process-wide slots (another team's correctly
/// signed image was then denied), and URLs were fetched one at a time with
/// a 5 s timeout each (8 hanging URLs delayed a real CRL 40 s). Now a URL
/// that never served a valid CRL gives its slot up, one CA's certificates
/// may name only a few URLs, and fetches run side by side.
#[tokio::test]
async fn junk_urls_neither_hold_slots_nor_delay_a_real_crl() {
    let now = now();
    let crls = Arc::new(Crls::with_allowed(loopback()));
    // Slots: fill every one with URLs that fail (no verified issuer: they
    // fail without a request), then a real one still gets in.
    for i in 0..MAX_URLS {
        let _ = crls.lookup(&format!("http://127.0.0.1:9/junk{i}"), now);
    }
    let dir = tempfile::tempdir().unwrap();
    let server = StaticServer::start(dir.path().to_path_buf()).await;
    let chain = Chain::new(&format!("{}inter.crl", server.url()));
    std::fs::write(
        dir.path().join("inter.crl"),
        chain.inter.crl(&[], now - 60, now + 3600),
    )
    .unwrap();
    let full = crls.lookup_for(
        &format!("{}inter.crl", server.url()),
        Some(&spki(&chain.inter.der)),
        now,
    );
    assert!(
        matches!(&full, Lookup::Missing(w) if w.contains("already follows")),
        "{full:?}"
    );
    crls.fetch_due(now).await;
    let env = chain.envelope(&[]);
    let check = chain.check(&crls);
    let _ = check.check(&env, DIGEST, now);
    crls.fetch_due(now).await;
    assert_eq!(
        check.check(&env, DIGEST, now),
        Ok(vec![]),
        "a junk URL kept the slot"
    );
    // Per CA: its certificates name at most a few distribution points.
    let key = spki(&chain.root.der);
    let fresh = Crls::with_allowed(loopback());
    for i in 0..MAX_URLS_PER_ISSUER {
        let _ = fresh.lookup_for(&format!("http://ca.test/{i}"), Some(&key), now);
    }
    assert!(matches!(
        fresh.lookup_for("http://ca.test/one-more", Some(&key), now),
        Lookup::Missing(w) if w.contains("this CA's certificates already name")
    ));
    // Time: eight hanging distribution points and a real one, fetched side
    // by side: the real CRL is in after one timeout, not nine.
    let hang = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let hang_at = hang.local_addr().unwrap();
    let held = tokio::spawn(async move {
        let mut open = Vec::new();
        while let Ok((tcp, _)) = hang.accept().await {
            open.push(tcp);
        }
    });
    let crls = Arc::new(Crls::with_allowed(loopback()));
    for i in 0..8 {
        let _ = crls.lookup_for(
            &format!("http://{hang_at}/h{i}"),
            Some(&spki(&Ca::root("h").der)),
            now,
        );
    }
    let check = chain.check(&crls);
    let _ = check.check(&env, DIGEST, now);
    let started = Instant::now();
    crls.fetch_due(now).await;
    assert!(
        started.elapsed() < Duration::from_secs(12),
        "fetches ran one after another: {:?}",
        started.elapsed()
    );
    assert_eq!(check.check(&env, DIGEST, now), Ok(vec![]));
    held.abort();
}
