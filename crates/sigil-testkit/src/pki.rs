//! A certificate authority for notation tests, as a CA runs one: a root, an
//! intermediate, signing certificates with subjects and CRL distribution
//! points, and the CRLs themselves (revoked serials, thisUpdate/nextUpdate),
//! signed by the CA they speak for. Serve the CRLs with
//! [`crate::tuf::StaticServer`] to test fetching, staleness and outages.

use rcgen::{
    BasicConstraints, CertificateParams, CertificateRevocationListParams, CrlDistributionPoint,
    DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyIdMethod, KeyPair, KeyUsagePurpose,
    RevocationReason, RevokedCertParams, SerialNumber,
};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::signing::Signer;

static SERIAL: AtomicU64 = AtomicU64::new(0x1000);

fn next_serial() -> u64 {
    SERIAL.fetch_add(1, Ordering::Relaxed)
}

fn t(unix: i64) -> time::OffsetDateTime {
    time::OffsetDateTime::from_unix_timestamp(unix).unwrap()
}

/// A CA: its certificate (DER) and what it needs to issue and revoke.
pub struct Ca {
    pub der: Vec<u8>,
    pub serial: u64,
    issuer: Issuer<'static, KeyPair>,
}

/// A certificate a CA issued, with its key.
pub struct Issued {
    pub key: Signer,
    pub der: Vec<u8>,
    pub serial: u64,
}

fn ca_params(name: &str, cdp: Option<&str>, serial: u64) -> CertificateParams {
    let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
    p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    p.distinguished_name.push(DnType::CommonName, name);
    p.distinguished_name
        .push(DnType::OrganizationName, "sigil tests");
    p.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    p.serial_number = Some(SerialNumber::from(serial));
    p.not_before = t(1_577_836_800);
    p.not_after = t(4_102_444_800);
    if let Some(u) = cdp {
        p.crl_distribution_points = vec![CrlDistributionPoint {
            uris: vec![u.to_owned()],
        }];
    }
    p
}

impl Ca {
    /// A self-signed root CA.
    pub fn root(name: &str) -> Ca {
        let key = KeyPair::generate().unwrap();
        let serial = next_serial();
        let p = ca_params(name, None, serial);
        let cert = p.self_signed(&key).unwrap();
        Ca {
            der: cert.der().to_vec(),
            serial,
            issuer: Issuer::new(p, key),
        }
    }

    /// An intermediate CA under this one, naming `cdp` (this CA's CRL) if given.
    pub fn intermediate(&self, name: &str, cdp: Option<&str>) -> Ca {
        let key = KeyPair::generate().unwrap();
        let serial = next_serial();
        let p = ca_params(name, cdp, serial);
        let cert = p.signed_by(&key, &self.issuer).unwrap();
        Ca {
            der: cert.der().to_vec(),
            serial,
            issuer: Issuer::new(p, key),
        }
    }

    /// A notation signing certificate (P-256, digitalSignature, codeSigning)
    /// for `subject` (`(C, "US")`, …), naming `cdp` if given, valid within
    /// `validity` (Unix seconds; default 2020–2100).
    pub fn leaf(
        &self,
        subject: &[(DnType, &str)],
        cdp: Option<&str>,
        validity: Option<(i64, i64)>,
    ) -> Issued {
        let key = Signer::p256();
        let serial = next_serial();
        let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
        for (ty, v) in subject {
            p.distinguished_name.push(ty.clone(), *v);
        }
        p.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        p.extended_key_usages = vec![ExtendedKeyUsagePurpose::CodeSigning];
        p.serial_number = Some(SerialNumber::from(serial));
        let (from, until) = validity.unwrap_or((1_577_836_800, 4_102_444_800));
        p.not_before = t(from);
        p.not_after = t(until);
        if let Some(u) = cdp {
            p.crl_distribution_points = vec![CrlDistributionPoint {
                uris: vec![u.to_owned()],
            }];
        }
        let cert = p.signed_by(&key.rcgen(), &self.issuer).unwrap();
        Issued {
            key,
            der: cert.der().to_vec(),
            serial,
        }
    }

    /// A CRL of this CA listing `revoked` serials (key compromise), valid
    /// from `this_update` to `next_update` (Unix seconds), DER.
    pub fn crl(&self, revoked: &[u64], this_update: i64, next_update: i64) -> Vec<u8> {
        CertificateRevocationListParams {
            this_update: t(this_update),
            next_update: t(next_update),
            crl_number: SerialNumber::from(next_serial()),
            issuing_distribution_point: None,
            revoked_certs: revoked
                .iter()
                .map(|s| RevokedCertParams {
                    serial_number: SerialNumber::from(*s),
                    revocation_time: t(this_update),
                    reason_code: Some(RevocationReason::KeyCompromise),
                    invalidity_date: None,
                })
                .collect(),
            key_identifier_method: KeyIdMethod::Sha256,
        }
        .signed_by(&self.issuer)
        .unwrap()
        .der()
        .to_vec()
    }
}
