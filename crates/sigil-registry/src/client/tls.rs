//! What registry clients trust: the system CA bundle and Mozilla's roots
//! (read once per process, on first use), and a host's own CA
//! (`registries[].ca`, read and checked when the policy loads). It builds
//! rustls configurations; it does not make connections.

use std::sync::Arc;

use crate::RegistryError;

/// The certificates of a host's extra CA (`registries[].ca`: a PEM file's
/// path, or inline PEM), each checked as a trust anchor.
pub(super) fn extra_roots(
    ca: &str,
) -> Result<Vec<rustls_pki_types::CertificateDer<'static>>, RegistryError> {
    let pem = if ca.contains("-----BEGIN") {
        ca.as_bytes().to_vec()
    } else {
        crate::file::read(std::path::Path::new(ca), crate::file::MAX_PEM_BYTES).map_err(|e| {
            RegistryError::Ca {
                source_name: ca.to_owned(),
                detail: e.to_string(),
            }
        })?
    };
    use rustls_pki_types::pem::PemObject;
    let mut certs = Vec::new();
    let mut check = rustls::RootCertStore::empty();
    for cert in rustls_pki_types::CertificateDer::pem_slice_iter(&pem) {
        let cert = cert.map_err(|e| RegistryError::Ca {
            source_name: ca_label(ca),
            detail: e.to_string(),
        })?;
        check.add(cert.clone()).map_err(|e| RegistryError::Ca {
            source_name: ca_label(ca),
            detail: e.to_string(),
        })?;
        certs.push(cert);
    }
    if certs.is_empty() {
        return Err(RegistryError::Ca {
            source_name: ca_label(ca),
            detail: "no PEM certificate found".into(),
        });
    }
    Ok(certs)
}

/// Builds the TLS config: system roots, Mozilla's roots (for minimal images
/// without a CA bundle), and the host's extra CA. TLS 1.2+ only.
pub(super) fn tls_config(
    extra: &[rustls_pki_types::CertificateDer<'static>],
) -> Result<rustls::ClientConfig, RegistryError> {
    let mut roots = base_roots().clone();
    for cert in extra {
        roots
            .add(cert.clone())
            .map_err(|e| RegistryError::Tls(e.to_string()))?;
    }
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut cfg = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .map_err(|e| RegistryError::Tls(e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(cfg)
}

/// System and Mozilla roots, parsed once per process: reading the system
/// bundle costs milliseconds, and every host client needs it.
fn base_roots() -> &'static rustls::RootCertStore {
    static ROOTS: std::sync::OnceLock<rustls::RootCertStore> = std::sync::OnceLock::new();
    ROOTS.get_or_init(|| {
        let mut roots = rustls::RootCertStore::empty();
        roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
        for cert in rustls_native_certs::load_native_certs().certs {
            let _ = roots.add(cert);
        }
        roots
    })
}

fn ca_label(ca: &str) -> String {
    if ca.contains("-----BEGIN") {
        "inline PEM".into()
    } else {
        ca.to_owned()
    }
}
