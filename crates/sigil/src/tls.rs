//! Serving certificates: loading PEM files, or minting a CA and serving
//! certificate in memory when none are given.
//!
//! Owns the rustls `ServerConfig` sigil serves with (TLS 1.2+ only, h2 and
//! http/1.1 via ALPN) and the certificate it presents. It does not watch files
//! or talk to the Kubernetes API.

use std::sync::Arc;

use crate::error::{Context as _, Error, Result};
use rustls::ServerConfig;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::sign::CertifiedKey;
use sigil_kube::certs::ServingCert;

/// Every PEM certificate in a file (at least one).
fn read_certs(path: &std::path::Path) -> Result<Vec<CertificateDer<'static>>> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(path)
        .with_context(|| format!("reading certificate {}", path.display()))?
        .collect::<std::result::Result<_, _>>()
        .with_context(|| format!("parsing certificate {}", path.display()))?;
    if certs.is_empty() {
        return Err(Error::Invalid(format!(
            "{} holds no PEM certificate",
            path.display()
        )));
    }
    Ok(certs)
}

/// Loads `--tls-cert` / `--tls-key`.
pub fn load_files(cert: &std::path::Path, key: &std::path::Path) -> Result<ServingCert> {
    let chain = read_certs(cert)?;
    let key = PrivateKeyDer::from_pem_file(key)
        .with_context(|| format!("reading TLS private key {}", key.display()))?;
    Ok(ServingCert {
        chain,
        key,
        ca_pem: None,
    })
}

/// Mints a CA and a serving certificate for `names` (DNS names or IPs), the
/// same way `--self-managed-certs` does, but only in memory. The CA is
/// separate from the leaf because rustls clients refuse a self-signed
/// certificate used as its own CA.
pub fn self_signed(names: &[String]) -> Result<ServingCert> {
    Ok(sigil_kube::certs::in_memory(names)?)
}

/// Unix time a certificate expires (0 if it cannot be parsed).
pub fn not_after(cert: &CertificateDer<'_>) -> i64 {
    x509_parser::parse_x509_certificate(cert.as_ref())
        .map(|(_, c)| c.validity().not_after.timestamp())
        .unwrap_or(0)
}

/// The rustls provider sigil uses everywhere.
pub fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}

/// The certificate sigil serves, swappable while connections are open.
///
/// cert-manager (and kubelet's Secret volumes) replace the files by swapping a
/// `..data` symlink; [`CertStore::reload_if_changed`] re-reads the files and
/// swaps in a new key only after it parsed and matched its certificate, so a
/// half-written or mismatched pair never replaces a working one. Existing
/// connections keep their session; new handshakes get the new certificate.
#[derive(Debug)]
pub struct CertStore {
    current: arc_swap::ArcSwap<CertifiedKey>,
    files: Option<(std::path::PathBuf, std::path::PathBuf)>,
    seen: std::sync::Mutex<Vec<u8>>,
}

impl CertStore {
    /// Serves `cert`; `files` are re-read by [`CertStore::reload_if_changed`].
    pub fn new(
        cert: &ServingCert,
        files: Option<(std::path::PathBuf, std::path::PathBuf)>,
    ) -> Result<Arc<CertStore>> {
        let key = certified(cert)?;
        let seen = files
            .as_ref()
            .map(|(c, k)| file_bytes(c, k))
            .transpose()?
            .unwrap_or_default();
        Ok(Arc::new(CertStore {
            current: arc_swap::ArcSwap::from_pointee(key),
            files,
            seen: std::sync::Mutex::new(seen),
        }))
    }

    /// The leaf certificate being served now.
    pub fn leaf(&self) -> Option<CertificateDer<'static>> {
        self.current.load().cert.first().cloned()
    }

    /// Serves `cert` from now on (self-managed certificates). Open
    /// connections keep their session; new handshakes get `cert`.
    pub fn replace(&self, cert: &ServingCert) -> Result<()> {
        self.current.store(Arc::new(certified(cert)?));
        Ok(())
    }

    /// Re-reads the files; swaps the certificate if they changed and are valid.
    /// `Ok(true)` when a new certificate is now served.
    pub fn reload_if_changed(&self) -> Result<bool> {
        let Some((c, k)) = &self.files else {
            return Ok(false);
        };
        let bytes = file_bytes(c, k)?;
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        if *seen == bytes {
            return Ok(false);
        }
        let cert = load_files(c, k)?;
        self.current.store(Arc::new(certified(&cert)?));
        *seen = bytes;
        Ok(true)
    }
}

impl rustls::server::ResolvesServerCert for CertStore {
    fn resolve(&self, _: rustls::server::ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current.load_full())
    }
}

fn certified(cert: &ServingCert) -> Result<CertifiedKey> {
    CertifiedKey::from_der(cert.chain.clone(), cert.key.clone_key(), &provider())
        .context("serving certificate and key do not match")
}

fn file_bytes(c: &std::path::Path, k: &std::path::Path) -> Result<Vec<u8>> {
    let mut b = std::fs::read(c).with_context(|| format!("reading {}", c.display()))?;
    b.extend(std::fs::read(k).with_context(|| format!("reading {}", k.display()))?);
    Ok(b)
}

/// A TLS 1.2+/h2 server config serving whatever `store` holds.
///
/// With `client_ca` (PEM), client certificates are verified against it: a
/// client that presents one that does not chain is refused in the
/// handshake; one that presents none gets through the handshake (so the
/// readiness self-check can connect) and is refused per request by the
/// webhook, which requires a verified certificate for `POST /mutate`.
pub fn server_config(
    store: Arc<CertStore>,
    client_ca: Option<&std::path::Path>,
) -> Result<Arc<ServerConfig>> {
    let builder = ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .context("TLS versions")?;
    let builder = match client_ca {
        None => builder.with_no_client_auth(),
        Some(path) => {
            let mut roots = rustls::RootCertStore::empty();
            for c in read_certs(path)? {
                roots
                    .add(c)
                    .with_context(|| format!("client CA {}", path.display()))?;
            }
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(roots),
                provider(),
            )
            .allow_unauthenticated()
            .build()
            .map_err(|e| Error::Invalid(format!("client CA {}: {e}", path.display())))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut cfg = builder.with_cert_resolver(store);
    cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(cfg))
}

/// The names a self-signed serving certificate covers: localhost, loopback
/// and this host's name.
pub fn default_names() -> Vec<String> {
    let mut names = vec![
        "localhost".to_owned(),
        "127.0.0.1".to_owned(),
        "::1".to_owned(),
    ];
    if let Ok(h) = std::fs::read_to_string("/proc/sys/kernel/hostname") {
        let h = h.trim();
        if !h.is_empty() && !names.iter().any(|n| n == h) {
            names.push(h.to_owned());
        }
    }
    names
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustls::client::danger::ServerCertVerifier;

    #[test]
    fn self_signed_chain_verifies_with_its_ca() {
        let c = self_signed(&default_names()).unwrap();
        let cfg = server_config(CertStore::new(&c, None).unwrap(), None).unwrap();
        assert!(cfg.alpn_protocols.contains(&b"h2".to_vec()));
        let ca = c.ca_pem.unwrap();
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(ca.as_bytes()) {
            roots.add(cert.unwrap()).unwrap();
        }
        let verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(
            Arc::new(roots),
            provider(),
        )
        .build()
        .unwrap();
        let now = rustls::pki_types::UnixTime::now();
        let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
        verifier
            .verify_server_cert(&c.chain[0], &c.chain[1..], &name, &[], now)
            .unwrap();
        let ip = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
        verifier
            .verify_server_cert(&c.chain[0], &c.chain[1..], &ip, &[], now)
            .unwrap();
    }
}
