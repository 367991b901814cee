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
        self.intermediate_for(name, cdp, None)
    }

    /// [`Ca::intermediate`] restricted by an extended key usage to `eku`,
    /// if given (GitHub's Fulcio `l2` says codeSigning, its TSA
    /// intermediate timeStamping).
    pub fn intermediate_for(
        &self,
        name: &str,
        cdp: Option<&str>,
        eku: Option<ExtendedKeyUsagePurpose>,
    ) -> Ca {
        let key = KeyPair::generate().unwrap();
        let serial = next_serial();
        let mut p = ca_params(name, cdp, serial);
        p.extended_key_usages = eku.into_iter().collect();
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

    /// Signs `params` for `key` as this CA: any certificate a test needs
    /// (DER).
    pub fn sign(&self, params: &CertificateParams, key: &Signer) -> Vec<u8> {
        params
            .signed_by(&key.rcgen(), &self.issuer)
            .unwrap()
            .der()
            .to_vec()
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

/// A self-signed notation signing certificate (P-256, digitalSignature)
/// whose subject names `OU` twice — what rcgen cannot make, built by hand:
/// notation refuses to match identities on such a subject.
pub fn twice_named_signer() -> (Signer, Vec<u8>) {
    use crate::sigstore::{der, der_oid, seq};
    let key = Signer::p256();
    let rdn = |oid: &str, v: &str| der(0x31, &seq(&[der_oid(oid), der(0x0c, v.as_bytes())]));
    let name = seq(&[
        rdn("2.5.4.6", "US"),
        rdn("2.5.4.8", "WA"),
        rdn("2.5.4.10", "acme"),
        rdn("2.5.4.11", "build"),
        rdn("2.5.4.11", "release"),
    ]);
    let alg = seq(&[der_oid("1.2.840.10045.4.3.2")]);
    // keyUsage: critical, digitalSignature.
    let key_usage = seq(&[
        der_oid("2.5.29.15"),
        der(0x01, &[0xff]),
        der(0x04, &der(0x03, &[0x07, 0x80])),
    ]);
    let tbs = seq(&[
        der(0xa0, &der(0x02, &[2])),
        der(0x02, &[0x42]),
        alg.clone(),
        name.clone(),
        seq(&[der(0x17, b"200101000000Z"), der(0x18, b"21000101000000Z")]),
        name,
        key.spki(),
        der(0xa3, &seq(&[key_usage])),
    ]);
    let sig = key.sign(&tbs);
    let mut bits = vec![0u8];
    bits.extend_from_slice(&sig);
    let cert = seq(&[tbs, alg, der(0x03, &bits)]);
    (key, cert)
}
