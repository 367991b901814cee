//! Self-managed certificates (`--self-managed-certs`): a CA and a serving
//! certificate kept in one Secret in sigil's namespace, so every replica
//! serves the same certificate and the webhook's caBundle is one CA set.
//!
//! It owns the rotation state machine, a pure function from (Secret, now,
//! "does the API server trust the signing CA yet?") to the next Secret, and
//! the loop that applies it with optimistic concurrency, so that of several
//! replicas exactly one wins each step. Rotation has overlap, in three steps
//! that are never merged:
//! 1. a new CA is *added* to the bundle (`ca.crt`) while the old serving
//!    certificate stays in use;
//! 2. only once the webhook configuration's caBundle holds the new CA is a
//!    serving certificate from it issued (replicas pick it up on their next
//!    poll);
//! 3. the old CA leaves the bundle only when it expires — every certificate
//!    it signed has expired by then too, so no replica can still need it.
//!
//! It also mints the in-memory CA and certificate sigil serves when no
//! certificate is given ([`in_memory`]). It does not write the webhook
//! configuration (`cluster`) or serve TLS (the binary's `tls`, which is
//! handed each new certificate through [`run`]'s callback).

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType,
};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

use crate::error::{Context as _, Error, Result};

mod secret;

pub use secret::{initial, reconcile, run};

/// A serving certificate chain and key, plus the CA bundle clients must trust.
#[derive(Debug)]
pub struct ServingCert {
    /// Leaf first.
    pub chain: Vec<CertificateDer<'static>>,
    /// Private key of the leaf.
    pub key: PrivateKeyDer<'static>,
    /// PEM of the CA that issued the leaf (the webhook's caBundle), when known.
    pub ca_pem: Option<String>,
}

const TLS_CRT: &str = "tls.crt";
const TLS_KEY: &str = "tls.key";
/// Every CA the API server must trust (the webhook's caBundle).
const CA_BUNDLE: &str = "ca.crt";
const SIGNING_CRT: &str = "ca-signing.crt";
const SIGNING_KEY: &str = "ca-signing.key";
/// Clock skew allowance: certificates are valid from this long ago.
const BACKDATE: Duration = Duration::from_secs(60);

/// How long certificates live and what they name.
#[derive(Debug, Clone)]
pub struct CertSettings {
    /// Secret holding the CA and serving certificate.
    pub secret: String,
    /// Lifetime of a new CA. Renewed with a third of it left.
    pub ca_validity: Duration,
    /// Lifetime of a serving certificate (capped by its CA's). Renewed with a third left.
    pub cert_validity: Duration,
    /// DNS names and IPs the serving certificate covers.
    pub names: Vec<String>,
    /// How often replicas re-read the Secret and advance rotation.
    pub interval: Duration,
    /// How long a new CA must have existed before serving certificates from
    /// it: the API server reloads a changed caBundle asynchronously.
    pub settle: Duration,
}

/// The Secret's contents, as PEM.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Material {
    /// Serving certificate (leaf only).
    pub tls_crt: String,
    /// Its key.
    pub tls_key: String,
    /// Every trusted CA, newest first.
    pub ca_bundle: String,
    /// The CA that signs new serving certificates.
    pub signing_crt: String,
    /// Its key.
    pub signing_key: String,
}

/// One certificate's facts the state machine needs.
#[derive(Debug, Clone)]
struct Facts {
    subject: Vec<u8>,
    issuer: Vec<u8>,
    not_before: i64,
    not_after: i64,
}

fn facts(pem: &str) -> Result<Vec<Facts>> {
    let mut out = Vec::new();
    for der in CertificateDer::pem_slice_iter(pem.as_bytes()) {
        let der = der.context("bad PEM certificate")?;
        let (_, cert) = x509_parser::parse_x509_certificate(der.as_ref())
            .map_err(|e| Error::Invalid(format!("bad certificate: {e}")))?;
        out.push(Facts {
            subject: cert.subject().as_raw().to_vec(),
            issuer: cert.issuer().as_raw().to_vec(),
            not_before: cert.validity().not_before.timestamp(),
            not_after: cert.validity().not_after.timestamp(),
        });
    }
    Ok(out)
}

fn one(pem: &str, what: &str) -> Result<Facts> {
    facts(pem)?
        .into_iter()
        .next()
        .ok_or_else(|| Error::Invalid(format!("{what} holds no certificate")))
}

fn unix(t: SystemTime) -> i64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

fn offset(t: i64) -> Result<time::OffsetDateTime> {
    time::OffsetDateTime::from_unix_timestamp(t)
        .map_err(|e| Error::Invalid(format!("timestamp {t} out of range: {e}")))
}

/// Seconds left below which a certificate of this lifetime is renewed.
fn renew_margin(not_before: i64, not_after: i64) -> i64 {
    // The backdated minute is not part of the intended lifetime.
    (not_after - not_before - BACKDATE.as_secs() as i64).max(0) / 3
}

fn new_ca(now: i64, validity: Duration) -> Result<(String, String)> {
    let key = KeyPair::generate().context("generating CA key")?;
    let mut p = CertificateParams::new(Vec::<String>::new()).context("CA params")?;
    p.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    p.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let mut dn = DistinguishedName::new();
    dn.push(DnType::OrganizationName, "sigil");
    // Unique per CA, so a serving certificate's issuer names exactly one CA.
    dn.push(
        DnType::CommonName,
        format!("sigil self-managed CA {now}-{:08x}", rand_u32(&key)),
    );
    p.distinguished_name = dn;
    p.not_before = offset(now - BACKDATE.as_secs() as i64)?;
    p.not_after = offset(now + validity.as_secs() as i64)?;
    let cert = p.self_signed(&key).context("self-signing CA")?;
    Ok((cert.pem(), key.serialize_pem()))
}

/// A few bytes that differ between CAs minted in the same second.
fn rand_u32(key: &KeyPair) -> u32 {
    use sha2::Digest;
    let h = sha2::Sha256::digest(key.public_key_pem().as_bytes());
    u32::from_be_bytes([h[0], h[1], h[2], h[3]])
}

fn new_leaf(
    now: i64,
    validity: Duration,
    names: &[String],
    ca_pem: &str,
    ca_key_pem: &str,
) -> Result<(String, String)> {
    let ca_key = KeyPair::from_pem(ca_key_pem).context("parsing CA key")?;
    let ca_not_after = one(ca_pem, "signing CA")?.not_after;
    let issuer = Issuer::from_ca_cert_pem(ca_pem, ca_key).context("loading signing CA")?;
    let key = KeyPair::generate().context("generating serving key")?;
    let mut p = CertificateParams::new(Vec::<String>::new()).context("serving cert params")?;
    for n in names {
        p.subject_alt_names
            .push(match n.parse::<std::net::IpAddr>() {
                Ok(ip) => SanType::IpAddress(ip),
                Err(_) => SanType::DnsName(
                    rcgen::string::Ia5String::try_from(n.clone())
                        .with_context(|| format!("{n:?} is not a valid DNS name"))?,
                ),
            });
    }
    let mut dn = DistinguishedName::new();
    dn.push(
        DnType::CommonName,
        names.first().cloned().unwrap_or_else(|| "sigil".into()),
    );
    p.distinguished_name = dn;
    p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    p.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    p.not_before = offset(now - BACKDATE.as_secs() as i64)?;
    p.not_after = offset((now + validity.as_secs() as i64).min(ca_not_after))?;
    let cert = p.signed_by(&key, &issuer).context("signing serving cert")?;
    Ok((cert.pem(), key.serialize_pem()))
}

/// A CA and serving certificate that live only in this process (sigil
/// without `--tls-cert`: for trying it out). CA ten years, leaf one.
pub fn in_memory(names: &[String]) -> Result<ServingCert> {
    let year = Duration::from_secs(365 * 24 * 3600);
    Material::fresh(unix(SystemTime::now()), year * 10, year, names)?.serving_cert()
}

/// What the next rotation step is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Nothing to do.
    Keep,
    /// Waiting for the API server to trust the new CA before switching to it.
    WaitForBundle,
    /// Write this; the string says why (for the log).
    Write(Material, &'static str),
}

/// The pure rotation state machine (see the module docs).
///
/// `bundle_trusted` is whether the webhook configuration's caBundle already
/// holds the signing CA (`None`: there is no configuration yet, so nothing
/// can break by switching).
pub fn next_step(
    current: Option<&Material>,
    now: SystemTime,
    cfg: &CertSettings,
    bundle_trusted: Option<bool>,
) -> Result<Step> {
    let now = unix(now);
    let fresh = |why| -> Result<Step> {
        Ok(Step::Write(
            Material::fresh(now, cfg.ca_validity, cfg.cert_validity, &cfg.names)?,
            why,
        ))
    };
    let Some(m) = current else {
        return fresh("created CA and serving certificate");
    };
    let (signing, leaf) = match (
        one(&m.signing_crt, "ca-signing.crt"),
        one(&m.tls_crt, "tls.crt"),
    ) {
        (Ok(s), Ok(l)) if KeyPair::from_pem(&m.signing_key).is_ok() => (s, l),
        _ => return fresh("the Secret was unreadable; replaced it with a new CA and certificate"),
    };
    // Step 3: expired CAs leave the bundle (never the signing one).
    let bundle: Vec<CertificateDer<'static>> =
        CertificateDer::pem_slice_iter(m.ca_bundle.as_bytes())
            .filter_map(|c| c.ok())
            .collect();
    let mut kept = Vec::new();
    let mut dropped = false;
    for der in &bundle {
        let pem = pem_of(der);
        match one(&pem, "ca.crt") {
            Ok(f) if f.subject == signing.subject || f.not_after > now => kept.push(pem),
            _ => dropped = true,
        }
    }
    if !kept.iter().any(|p| {
        one(p, "ca.crt")
            .map(|f| f.subject == signing.subject)
            .unwrap_or(false)
    }) {
        kept.insert(0, m.signing_crt.clone());
        dropped = true;
    }
    if dropped {
        let mut next = m.clone();
        next.ca_bundle = kept.concat();
        return Ok(Step::Write(next, "removed expired CAs from the bundle"));
    }
    // Step 1: a new CA joins the bundle; the serving certificate stays.
    if signing.not_after - now < renew_margin(signing.not_before, signing.not_after) {
        let (ca, ca_key) = new_ca(now, cfg.ca_validity)?;
        let mut next = m.clone();
        next.ca_bundle = format!("{ca}{}", m.ca_bundle);
        next.signing_crt = ca;
        next.signing_key = ca_key;
        return Ok(Step::Write(
            next,
            "added a new CA to the bundle (old one stays trusted)",
        ));
    }
    // Step 2: a serving certificate from the signing CA, once it is trusted.
    let stale = leaf.issuer != signing.subject
        || leaf.not_after - now < renew_margin(leaf.not_before, leaf.not_after);
    if stale {
        let switching = leaf.issuer != signing.subject;
        let ca_age = now - (signing.not_before + BACKDATE.as_secs() as i64);
        if bundle_trusted == Some(false)
            || (switching
                && bundle_trusted.is_some()
                && ca_age < cfg.settle.as_secs_f64().ceil() as i64)
        {
            return Ok(Step::WaitForBundle);
        }
        let (crt, key) = new_leaf(
            now,
            cfg.cert_validity,
            &cfg.names,
            &m.signing_crt,
            &m.signing_key,
        )?;
        let mut next = m.clone();
        next.tls_crt = crt;
        next.tls_key = key;
        return Ok(Step::Write(next, "issued a new serving certificate"));
    }
    Ok(Step::Keep)
}

fn pem_of(der: &CertificateDer<'_>) -> String {
    use base64::Engine;
    let b64 = base64::engine::general_purpose::STANDARD.encode(der.as_ref());
    let mut s = String::from("-----BEGIN CERTIFICATE-----\n");
    for chunk in b64.as_bytes().chunks(64) {
        s.push_str(std::str::from_utf8(chunk).unwrap_or_default());
        s.push('\n');
    }
    s.push_str("-----END CERTIFICATE-----\n");
    s
}

impl Material {
    /// A new CA and a serving certificate from it.
    fn fresh(
        now: i64,
        ca_validity: Duration,
        validity: Duration,
        names: &[String],
    ) -> Result<Material> {
        let (ca, ca_key) = new_ca(now, ca_validity)?;
        let (crt, key) = new_leaf(now, validity, names, &ca, &ca_key)?;
        Ok(Material {
            tls_crt: crt,
            tls_key: key,
            ca_bundle: ca.clone(),
            signing_crt: ca,
            signing_key: ca_key,
        })
    }

    fn from_secret(s: &Secret) -> Option<Material> {
        let d = s.data.as_ref()?;
        let get = |k: &str| {
            d.get(k)
                .and_then(|b| String::from_utf8(b.0.clone()).ok())
                .filter(|s| !s.is_empty())
        };
        Some(Material {
            tls_crt: get(TLS_CRT)?,
            tls_key: get(TLS_KEY)?,
            ca_bundle: get(CA_BUNDLE)?,
            signing_crt: get(SIGNING_CRT)?,
            signing_key: get(SIGNING_KEY)?,
        })
    }

    fn data(&self) -> BTreeMap<String, ByteString> {
        [
            (TLS_CRT, &self.tls_crt),
            (TLS_KEY, &self.tls_key),
            (CA_BUNDLE, &self.ca_bundle),
            (SIGNING_CRT, &self.signing_crt),
            (SIGNING_KEY, &self.signing_key),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), ByteString(v.clone().into_bytes())))
        .collect()
    }

    /// What to serve: the leaf plus the CA that signed it.
    pub fn serving_cert(&self) -> Result<ServingCert> {
        let leaf = one(&self.tls_crt, "tls.crt")?;
        let mut chain: Vec<CertificateDer<'static>> =
            CertificateDer::pem_slice_iter(self.tls_crt.as_bytes())
                .collect::<std::result::Result<_, _>>()
                .context("parsing tls.crt")?;
        for der in CertificateDer::pem_slice_iter(self.ca_bundle.as_bytes()).flatten() {
            if one(&pem_of(&der), "ca.crt").is_ok_and(|f| f.subject == leaf.issuer) {
                chain.push(der);
                break;
            }
        }
        let key =
            PrivateKeyDer::from_pem_slice(self.tls_key.as_bytes()).context("parsing tls.key")?;
        Ok(ServingCert {
            chain,
            key,
            ca_pem: Some(self.ca_bundle.clone()),
        })
    }

    /// Unix time the serving certificate expires.
    pub fn not_after(&self) -> i64 {
        one(&self.tls_crt, "tls.crt")
            .map(|f| f.not_after)
            .unwrap_or(0)
    }
}

/// The names a serving certificate behind Service `service` in `namespace` needs.
pub fn service_names(service: &str, namespace: &str, extra: &[String]) -> Vec<String> {
    let mut names = vec![
        format!("{service}.{namespace}.svc"),
        format!("{service}.{namespace}.svc.cluster.local"),
        format!("{service}.{namespace}"),
        service.to_owned(),
    ];
    for e in extra {
        if !names.contains(e) {
            names.push(e.clone());
        }
    }
    names
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> CertSettings {
        CertSettings {
            secret: "sigil-tls".into(),
            ca_validity: Duration::from_secs(300),
            cert_validity: Duration::from_secs(90),
            names: service_names("sigil", "sigil-system", &["127.0.0.1".into()]),
            interval: Duration::from_secs(1),
            settle: Duration::from_secs(2),
        }
    }

    fn at(secs: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000 + secs)
    }

    fn write(step: Step) -> Material {
        match step {
            Step::Write(m, _) => m,
            other => panic!("expected a write, got {other:?}"),
        }
    }

    fn cas(m: &Material) -> usize {
        facts(&m.ca_bundle).unwrap().len()
    }

    #[test]
    fn fresh_secret_serves_a_chain_to_its_bundle() {
        let m = write(next_step(None, at(0), &cfg(), None).unwrap());
        assert_eq!(cas(&m), 1);
        let c = m.serving_cert().unwrap();
        assert_eq!(c.chain.len(), 2);
        assert_eq!(
            next_step(Some(&m), at(1), &cfg(), Some(true)).unwrap(),
            Step::Keep
        );
    }

    #[test]
    fn rotation_overlaps_and_waits_for_the_bundle() {
        let c = cfg();
        let m0 = write(next_step(None, at(0), &c, None).unwrap());
        // Leaf (90 s) renews from the same CA after 60 s.
        let m1 = write(next_step(Some(&m0), at(61), &c, Some(true)).unwrap());
        assert_ne!(m1.tls_crt, m0.tls_crt);
        assert_eq!(m1.signing_crt, m0.signing_crt);
        // CA (300 s) renews after 200 s: added, leaf unchanged.
        let m2 = write(next_step(Some(&m1), at(201), &c, Some(true)).unwrap());
        assert_eq!(cas(&m2), 2);
        assert_eq!(m2.tls_crt, m1.tls_crt);
        assert_ne!(m2.signing_crt, m1.signing_crt);
        // Not trusted yet: wait, do not switch.
        assert_eq!(
            next_step(Some(&m2), at(202), &c, Some(false)).unwrap(),
            Step::WaitForBundle
        );
        // Trusted but only just created: the API server may not have it yet.
        assert_eq!(
            next_step(Some(&m2), at(202), &c, Some(true)).unwrap(),
            Step::WaitForBundle
        );
        // Trusted: a leaf from the new CA, old CA still in the bundle.
        let m3 = write(next_step(Some(&m2), at(203), &c, Some(true)).unwrap());
        assert_ne!(m3.tls_crt, m2.tls_crt);
        assert_eq!(cas(&m3), 2);
        let leaf = one(&m3.tls_crt, "").unwrap();
        assert_eq!(leaf.issuer, one(&m3.signing_crt, "").unwrap().subject);
        // Old CA leaves the bundle once expired (300 s + backdate margin).
        assert_eq!(
            next_step(Some(&m3), at(250), &c, Some(true)).unwrap(),
            Step::Keep
        );
        let m4 = write(next_step(Some(&m3), at(301), &c, Some(true)).unwrap());
        assert_eq!(cas(&m4), 1);
        assert_eq!(m4.ca_bundle, m4.signing_crt);
    }

    #[test]
    fn leaf_never_outlives_its_ca() {
        let mut c = cfg();
        c.cert_validity = Duration::from_secs(10_000);
        let m = write(next_step(None, at(0), &c, None).unwrap());
        let leaf = one(&m.tls_crt, "").unwrap();
        let ca = one(&m.signing_crt, "").unwrap();
        assert!(leaf.not_after <= ca.not_after);
    }

    #[test]
    fn garbage_secret_is_replaced() {
        let bad = Material {
            tls_crt: "nope".into(),
            tls_key: "nope".into(),
            ca_bundle: "nope".into(),
            signing_crt: "nope".into(),
            signing_key: "nope".into(),
        };
        let m = write(next_step(Some(&bad), at(0), &cfg(), None).unwrap());
        assert!(m.serving_cert().is_ok());
    }
}
