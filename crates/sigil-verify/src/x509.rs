//! Certificate chains and the identities in them.
//!
//! Owns path building to a trust anchor at a *given* time (rustls-webpki
//! does the RFC 5280 work), and reading what keyless and notation policies
//! match on: the SAN (email or URI) and Fulcio's OIDC-issuer extension. It
//! does not decide which time to check at; callers pass the Rekor
//! integratedTime or the signing time.

use crate::ArtifactError;
use rustls_pki_types::{CertificateDer, UnixTime};
use webpki::{EndEntityCert, KeyUsage};
use x509_parser::prelude::{FromDer, GeneralName, ParsedExtension, X509Certificate};

/// id-kp-codeSigning (1.3.6.1.5.5.7.3.3), DER value bytes.
const CODE_SIGNING: &[u8] = &[0x2b, 0x06, 0x01, 0x05, 0x05, 0x07, 0x03, 0x03];
/// id-kp-timeStamping (1.3.6.1.5.5.7.3.8), DER value bytes.
const TIME_STAMPING: &[u8] = &[0x2b, 0x06, 0x01, 0x05, 0x05, 0x07, 0x03, 0x08];
/// Fulcio OIDC issuer, v1 (raw string value).
const FULCIO_ISSUER_V1: &str = "1.3.6.1.4.1.57264.1.1";
/// Fulcio OIDC issuer, v2 (DER UTF8String value).
const FULCIO_ISSUER_V2: &str = "1.3.6.1.4.1.57264.1.8";

static ALGS: &[&dyn rustls_pki_types::SignatureVerificationAlgorithm] = &[
    webpki::aws_lc_rs::ECDSA_P256_SHA256,
    webpki::aws_lc_rs::ECDSA_P256_SHA384,
    webpki::aws_lc_rs::ECDSA_P384_SHA256,
    webpki::aws_lc_rs::ECDSA_P384_SHA384,
    webpki::aws_lc_rs::ED25519,
    webpki::aws_lc_rs::RSA_PKCS1_2048_8192_SHA256,
    webpki::aws_lc_rs::RSA_PKCS1_2048_8192_SHA384,
    webpki::aws_lc_rs::RSA_PKCS1_2048_8192_SHA512,
    webpki::aws_lc_rs::RSA_PSS_2048_8192_SHA256_LEGACY_KEY,
    webpki::aws_lc_rs::RSA_PSS_2048_8192_SHA384_LEGACY_KEY,
    webpki::aws_lc_rs::RSA_PSS_2048_8192_SHA512_LEGACY_KEY,
];

/// How strictly the code-signing EKU is required.
#[derive(Debug, Clone, Copy)]
pub enum Eku {
    /// Must be present (Fulcio always sets it).
    Required,
    /// Checked only if the certificate has an EKU extension (Notary Project rule).
    IfPresent,
    /// An RFC 3161 timestamp authority: timeStamping must be present.
    TimeStamping,
}

/// Verifies that `leaf` chains through `intermediates` to one of `roots`,
/// with every certificate valid at `at` (Unix seconds).
pub fn verify_chain(
    leaf: &[u8],
    intermediates: &[Vec<u8>],
    roots: &[Vec<u8>],
    at: i64,
    eku: Eku,
) -> Result<(), ArtifactError> {
    build_path(leaf, intermediates, roots, at, eku, None, |_, _| ())
        .map_err(|e| ArtifactError::Chain(describe(&e, leaf, at)))
}

/// [`verify_chain`] to the one anchor `root`; returns the certificate (DER)
/// that issued `leaf` on the path found: the first intermediate, or the
/// root itself.
pub fn verified_issuer(
    leaf: &[u8],
    intermediates: &[Vec<u8>],
    root: &[u8],
    at: i64,
    eku: Eku,
) -> Result<Vec<u8>, ArtifactError> {
    let roots = [root.to_vec()];
    build_path(leaf, intermediates, &roots, at, eku, None, |path, _| {
        path.intermediate_certificates()
            .next()
            .map_or_else(|| root.to_vec(), |c| c.der().as_ref().to_vec())
    })
    .map_err(|e| ArtifactError::Chain(describe(&e, leaf, at)))
}

/// What checking a chain against CRLs found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RevocationFailure {
    /// A CRL lists a certificate of the path.
    Revoked(String),
    /// A CRL could not be used (bad signature, unsupported form, …).
    Unknown(String),
}

/// [`verify_chain`] with revocation: every certificate of the path the
/// given CRLs speak for must not be listed (a certificate none of them
/// speaks for passes; callers make sure each certificate with distribution
/// points has its CRL here). CRL expiry is the caller's to judge.
pub fn verify_chain_revocation(
    leaf: &[u8],
    intermediates: &[Vec<u8>],
    roots: &[Vec<u8>],
    at: i64,
    crls: &[&webpki::CertRevocationList<'_>],
) -> Result<(), RevocationFailure> {
    let Ok(builder) = webpki::RevocationOptionsBuilder::new(crls) else {
        return Ok(());
    };
    let options = builder
        .with_depth(webpki::RevocationCheckDepth::Chain)
        .with_status_policy(webpki::UnknownStatusPolicy::Allow)
        .with_expiration_policy(webpki::ExpirationPolicy::Ignore)
        .build();
    match build_path(
        leaf,
        intermediates,
        roots,
        at,
        Eku::IfPresent,
        Some(options),
        |_, _| (),
    ) {
        Ok(()) => Ok(()),
        Err(webpki::Error::CertRevoked) => Err(RevocationFailure::Revoked(
            "a certificate of the signing chain is listed in its CA's CRL".into(),
        )),
        Err(e) => Err(RevocationFailure::Unknown(format!(
            "the CRL could not be used: {e:?}"
        ))),
    }
}

/// One certificate of a verified path (DER) and its issuer's
/// SubjectPublicKeyInfo (DER).
pub type PathLink = (Vec<u8>, Vec<u8>);

/// The path `leaf` verifies on to `roots` at `at`: each certificate of it
/// (the leaf, then the intermediates webpki used, in order towards the
/// anchor) with its issuer's SubjectPublicKeyInfo (DER). Certificates a
/// chain carries beside the path are not in it: whatever they name (CRL
/// distribution points) was not vouched for by the trust store.
pub fn verified_path(
    leaf: &[u8],
    intermediates: &[Vec<u8>],
    roots: &[Vec<u8>],
    at: i64,
) -> Result<Vec<PathLink>, ArtifactError> {
    let certs = build_path(
        leaf,
        intermediates,
        roots,
        at,
        Eku::IfPresent,
        None,
        |path, root| {
            let mut certs: Vec<Vec<u8>> = vec![leaf.to_vec()];
            certs.extend(
                path.intermediate_certificates()
                    .map(|c| c.der().as_ref().to_vec()),
            );
            certs.push(roots[root].clone());
            certs
        },
    )
    .map_err(|e| ArtifactError::Chain(describe(&e, leaf, at)))?;
    let spki = |der: &[u8]| -> Result<Vec<u8>, ArtifactError> {
        X509Certificate::from_der(der)
            .map(|(_, c)| c.public_key().raw.to_vec())
            .map_err(|e| ArtifactError::Malformed(format!("certificate does not parse: {e}")))
    };
    certs
        .windows(2)
        .map(|w| Ok((w[0].clone(), spki(&w[1])?)))
        .collect()
}

/// Builds the path from `leaf` to one of `roots` and hands it, with the
/// index of the root it ends at, to `then`.
#[allow(clippy::too_many_arguments)]
fn build_path<T>(
    leaf: &[u8],
    intermediates: &[Vec<u8>],
    roots: &[Vec<u8>],
    at: i64,
    eku: Eku,
    revocation: Option<webpki::RevocationOptions<'_>>,
    then: impl FnOnce(&webpki::VerifiedPath<'_>, usize) -> T,
) -> Result<T, webpki::Error> {
    let leaf_der = CertificateDer::from(leaf);
    let ee = EndEntityCert::try_from(&leaf_der)?;
    let root_ders: Vec<CertificateDer<'_>> = roots
        .iter()
        .map(|r| CertificateDer::from(r.as_slice()))
        .collect();
    // Each anchor with the index of the root it came from (a root that is
    // no valid anchor is skipped).
    let (anchors, index): (Vec<_>, Vec<usize>) = root_ders
        .iter()
        .enumerate()
        .filter_map(|(i, r)| webpki::anchor_from_trusted_cert(r).ok().map(|a| (a, i)))
        .unzip();
    if anchors.is_empty() {
        return Err(webpki::Error::UnknownIssuer);
    }
    let inter: Vec<CertificateDer<'_>> = intermediates
        .iter()
        .map(|c| CertificateDer::from(c.as_slice()))
        .collect();
    let time = UnixTime::since_unix_epoch(std::time::Duration::from_secs(
        u64::try_from(at).map_err(|_| webpki::Error::BadDerTime)?,
    ));
    // The purpose is required of the leaf; a CA on the path may omit the
    // extension (GitHub's Fulcio intermediate l1 does), and one that has it
    // must list the purpose — as Go's crypto/x509, which sigstore-go uses,
    // nests EKUs. webpki applies one rule to every certificate, so the
    // leaf's own requirement is checked here.
    let (usage, leaf_needs) = match eku {
        Eku::Required => (KeyUsage::required_if_present(CODE_SIGNING), Some(false)),
        Eku::IfPresent => (KeyUsage::required_if_present(CODE_SIGNING), None),
        Eku::TimeStamping => (KeyUsage::required_if_present(TIME_STAMPING), Some(true)),
    };
    if let Some(time_stamping) = leaf_needs {
        let has = X509Certificate::from_der(leaf).ok().is_some_and(|(_, c)| {
            c.extended_key_usage().ok().flatten().is_some_and(|e| {
                if time_stamping {
                    e.value.time_stamping
                } else {
                    e.value.code_signing
                }
            })
        });
        if !has {
            #[allow(deprecated)]
            return Err(webpki::Error::RequiredEkuNotFound);
        }
    }
    let path = ee.verify_for_usage(ALGS, &anchors, &inter, time, usage, revocation, None)?;
    let anchor = path.anchor();
    let root = anchors
        .iter()
        .position(|a| {
            a.subject.as_ref() == anchor.subject.as_ref()
                && a.subject_public_key_info.as_ref() == anchor.subject_public_key_info.as_ref()
        })
        .map_or(0, |i| index[i]);
    Ok(then(&path, root))
}

fn describe(e: &webpki::Error, leaf: &[u8], at: i64) -> String {
    let when = time::OffsetDateTime::from_unix_timestamp(at)
        .map(|t| t.to_string())
        .unwrap_or_else(|_| at.to_string());
    match e {
        webpki::Error::CertExpired { .. } | webpki::Error::CertNotValidYet { .. } => {
            let validity = X509Certificate::from_der(leaf)
                .map(|(_, c)| {
                    format!(
                        " (leaf valid {} to {})",
                        c.validity().not_before,
                        c.validity().not_after
                    )
                })
                .unwrap_or_default();
            format!("certificate not valid at {when}{validity}")
        }
        webpki::Error::UnknownIssuer => "issuer is not a trusted root".into(),
        #[allow(deprecated)]
        webpki::Error::RequiredEkuNotFound => {
            "the certificate's extended key usage does not include the purpose it signs for (code signing, or time stamping for a timestamp authority)".into()
        }
        webpki::Error::BadDerTime if at < 0 => "time before 1970".into(),
        other => format!("{other:?} (checked at {when})"),
    }
}

/// What a certificate says about who signed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Identity {
    /// SAN values: emails and URIs.
    pub subjects: Vec<String>,
    /// Fulcio OIDC issuer, if present.
    pub issuer: Option<String>,
    /// Every Fulcio extension present, by the name policies use for it
    /// (`sourceRepositoryUri`, `githubWorkflowRef`, …; see [`FULCIO_EXTENSIONS`]).
    pub extensions: std::collections::BTreeMap<String, String>,
}

/// Fulcio's certificate extensions (OID arc 1.3.6.1.4.1.57264.1), by the
/// last OID component: the name a policy matches on, and whether the value
/// is DER-encoded (the v2 extensions) or raw bytes (the deprecated v1 ones).
pub const FULCIO_EXTENSIONS: &[(u32, &str, bool)] = &[
    (1, "issuerV1", false),
    (2, "githubWorkflowTrigger", false),
    (3, "githubWorkflowSha", false),
    (4, "githubWorkflowName", false),
    (5, "githubWorkflowRepository", false),
    (6, "githubWorkflowRef", false),
    (8, "issuer", true),
    (9, "buildSignerUri", true),
    (10, "buildSignerDigest", true),
    (11, "runnerEnvironment", true),
    (12, "sourceRepositoryUri", true),
    (13, "sourceRepositoryDigest", true),
    (14, "sourceRepositoryRef", true),
    (15, "sourceRepositoryIdentifier", true),
    (16, "sourceRepositoryOwnerUri", true),
    (17, "sourceRepositoryOwnerIdentifier", true),
    (18, "buildConfigUri", true),
    (19, "buildConfigDigest", true),
    (20, "buildTrigger", true),
    (21, "runInvocationUri", true),
    (22, "sourceRepositoryVisibilityAtSigning", true),
];

impl std::fmt::Display for Identity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "subject {}, issuer {}",
            if self.subjects.is_empty() {
                "(none)".to_owned()
            } else {
                self.subjects.join(", ")
            },
            self.issuer.as_deref().unwrap_or("(none)")
        )
    }
}

/// Reads the SAN and Fulcio issuer of a DER certificate.
pub fn identity(der: &[u8]) -> Result<Identity, ArtifactError> {
    let (_, cert) = X509Certificate::from_der(der)
        .map_err(|e| ArtifactError::Malformed(format!("certificate: {e}")))?;
    let mut id = Identity::default();
    let mut v1 = None;
    let mut v2 = None;
    for ext in cert.extensions() {
        match ext.parsed_extension() {
            ParsedExtension::SubjectAlternativeName(san) => {
                for n in &san.general_names {
                    match n {
                        GeneralName::RFC822Name(s) | GeneralName::URI(s) => {
                            id.subjects.push((*s).to_owned())
                        }
                        // Fulcio's `username@host` identities (its
                        // OtherName type 1.3.6.1.4.1.57264.1.7, a UTF8String)
                        // are subjects like emails and URIs.
                        GeneralName::OtherName(oid, value)
                            if oid.to_id_string() == FULCIO_OTHERNAME =>
                        {
                            let inner = explicit_inner(value).unwrap_or(value);
                            if let Some(u) = der_utf8(inner) {
                                id.subjects.push(u);
                            }
                        }
                        GeneralName::OtherName(_, _) | GeneralName::DNSName(_) => {}
                        _ => {}
                    }
                }
            }
            _ => {
                let oid = ext.oid.to_id_string();
                if oid == FULCIO_ISSUER_V1 {
                    v1 = std::str::from_utf8(ext.value).ok().map(str::to_owned);
                } else if oid == FULCIO_ISSUER_V2 {
                    v2 = der_utf8(ext.value);
                }
                let known = oid
                    .strip_prefix("1.3.6.1.4.1.57264.1.")
                    .and_then(|n| n.parse::<u32>().ok())
                    .and_then(|n| FULCIO_EXTENSIONS.iter().find(|(k, _, _)| *k == n));
                if let Some((_, name, encoded)) = known {
                    let value = if *encoded {
                        der_utf8(ext.value)
                    } else {
                        std::str::from_utf8(ext.value).ok().map(str::to_owned)
                    };
                    if let Some(v) = value {
                        id.extensions.insert((*name).to_owned(), v);
                    }
                }
            }
        }
    }
    id.issuer = v2.or(v1);
    Ok(id)
}

/// Decodes a DER UTF8String (tag 12) with a short-form or long-form length.
/// Fulcio's OtherName SAN type: a `username@host` identity.
const FULCIO_OTHERNAME: &str = "1.3.6.1.4.1.57264.1.7";

/// The content of a `[0] EXPLICIT` wrapper (short or two-byte lengths), if
/// `v` is one.
fn explicit_inner(v: &[u8]) -> Option<&[u8]> {
    let (&tag, rest) = v.split_first()?;
    if tag != 0xa0 {
        return None;
    }
    let (&len0, rest) = rest.split_first()?;
    let (len, body) = if len0 < 0x80 {
        (len0 as usize, rest)
    } else {
        let n = (len0 & 0x7f) as usize;
        if n == 0 || n > 2 || rest.len() < n {
            return None;
        }
        let len = rest[..n].iter().fold(0usize, |a, &b| (a << 8) | b as usize);
        (len, &rest[n..])
    };
    body.get(..len)
}

fn der_utf8(v: &[u8]) -> Option<String> {
    let (&tag, rest) = v.split_first()?;
    if tag != 0x0c {
        return None;
    }
    let (&len0, rest) = rest.split_first()?;
    let (len, body) = if len0 < 0x80 {
        (len0 as usize, rest)
    } else {
        let n = (len0 & 0x7f) as usize;
        if n == 0 || n > 2 || rest.len() < n {
            return None;
        }
        let len = rest[..n].iter().fold(0usize, |a, &b| (a << 8) | b as usize);
        (len, &rest[n..])
    };
    std::str::from_utf8(body.get(..len)?)
        .ok()
        .map(str::to_owned)
}

/// Whether a certificate says it is a CA (basicConstraints `cA`); an
/// unreadable one is not.
pub fn is_ca(der: &[u8]) -> bool {
    X509Certificate::from_der(der)
        .ok()
        .and_then(|(_, c)| c.basic_constraints().ok().flatten().map(|b| b.value.ca))
        .unwrap_or(false)
}

/// The DER SubjectPublicKeyInfo of a certificate.
pub fn spki(der: &[u8]) -> Result<Vec<u8>, ArtifactError> {
    let (_, cert) = X509Certificate::from_der(der)
        .map_err(|e| ArtifactError::Malformed(format!("certificate: {e}")))?;
    Ok(cert.public_key().raw.to_vec())
}

/// A certificate's subject as `trustedIdentities` match it: attributes by
/// short name (`C`, `ST`, `L`, `O`, `OU`, `CN`, …; others by dotted OID).
/// An attribute present twice is refused, as notation refuses it.
pub fn subject_attributes(
    der: &[u8],
) -> Result<std::collections::BTreeMap<String, String>, ArtifactError> {
    let (_, cert) = X509Certificate::from_der(der)
        .map_err(|e| ArtifactError::Malformed(format!("certificate: {e}")))?;
    let mut out = std::collections::BTreeMap::new();
    for rdn in cert.subject().iter_rdn() {
        for atv in rdn.iter() {
            let oid = atv.attr_type().to_id_string();
            let name = match oid.as_str() {
                "2.5.4.6" => "C",
                "2.5.4.8" => "ST",
                "2.5.4.7" => "L",
                "2.5.4.10" => "O",
                "2.5.4.11" => "OU",
                "2.5.4.3" => "CN",
                "2.5.4.5" => "SERIALNUMBER",
                "2.5.4.9" => "STREET",
                "2.5.4.17" => "POSTALCODE",
                other => other,
            }
            .to_owned();
            let value = atv.as_str().map_err(|e| {
                ArtifactError::Malformed(format!("certificate subject {name}: {e}"))
            })?;
            if out.insert(name.clone(), value.to_owned()).is_some() {
                return Err(ArtifactError::Chain(format!(
                    "the signing certificate's subject has {name} twice (notation matches identities only on subjects with unique attributes)"
                )));
            }
        }
    }
    Ok(out)
}

/// The `http://` CRL distribution points of a certificate, in order (the
/// Notary Project uses HTTP CRL URLs only).
pub fn crl_urls(der: &[u8]) -> Vec<String> {
    let Ok((_, cert)) = X509Certificate::from_der(der) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for ext in cert.extensions() {
        if let ParsedExtension::CRLDistributionPoints(points) = ext.parsed_extension() {
            for p in points.iter() {
                if let Some(x509_parser::extensions::DistributionPointName::FullName(names)) =
                    &p.distribution_point
                {
                    for n in names {
                        if let GeneralName::URI(u) = n
                            && u.starts_with("http://")
                        {
                            out.push((*u).to_owned());
                        }
                    }
                }
            }
        }
    }
    out
}

/// The latest `notBefore` among `certs` (Unix seconds): a moment at which
/// a chain of them can be valid, to check its shape apart from its time.
pub fn latest_not_before(certs: &[Vec<u8>]) -> i64 {
    certs
        .iter()
        .filter_map(|c| X509Certificate::from_der(c).ok())
        .map(|(_, c)| c.validity().not_before.timestamp())
        .max()
        .unwrap_or(0)
        .max(0)
}

/// The serial number as its DER INTEGER content (what CRLs list).
pub fn serial(der: &[u8]) -> Result<Vec<u8>, ArtifactError> {
    let (_, cert) = X509Certificate::from_der(der)
        .map_err(|e| ArtifactError::Malformed(format!("certificate: {e}")))?;
    Ok(cert.raw_serial().to_vec())
}

/// The raw DER issuer and subject names and the subject's display form.
pub fn names(der: &[u8]) -> Result<(Vec<u8>, String), ArtifactError> {
    let (_, cert) = X509Certificate::from_der(der)
        .map_err(|e| ArtifactError::Malformed(format!("certificate: {e}")))?;
    Ok((cert.issuer().as_raw().to_vec(), cert.subject().to_string()))
}

/// Certificates (DER) from PEM text, in order.
pub fn certs_from_pem(text: &str) -> Vec<Vec<u8>> {
    crate::keys::pem_blocks(text)
        .into_iter()
        .filter(|(l, _)| l == "CERTIFICATE")
        .map(|(_, d)| d)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const LEAF: &str = include_str!("../tests/vectors/derived/keyless-rekor-test/cert.pem");
    const CHAIN: &str = include_str!("../tests/vectors/derived/keyless-rekor-test/chain.pem");
    const FULCIO: &str = include_str!("../tests/vectors/fulcio_v1.crt.pem");

    #[test]
    fn fulcio_chain_is_valid_at_signing_time_only() {
        let leaf = &certs_from_pem(LEAF)[0];
        let chain = certs_from_pem(CHAIN);
        let roots = certs_from_pem(FULCIO);
        verify_chain(leaf, &chain, &roots, 1_717_082_297, Eku::Required).unwrap();
        let e = verify_chain(leaf, &chain, &roots, 1_800_000_000, Eku::Required).unwrap_err();
        assert!(
            matches!(&e, ArtifactError::Chain(d) if d.contains("not valid at")),
            "{e}"
        );
    }

    #[test]
    fn reads_fulcio_identity() {
        let id = identity(&certs_from_pem(LEAF)[0]).unwrap();
        assert_eq!(id.subjects, vec!["philipp.belitz@securesystems.de"]);
        assert_eq!(id.issuer.as_deref(), Some("https://github.com/login/oauth"));
    }

    /// A private Fulcio issues `username@host` identities as an OtherName
    /// SAN (type 1.3.6.1.4.1.57264.1.7): they were not read, so no identity
    /// could match them. Another OtherName type is still not an identity.
    #[test]
    fn regression_fulcios_othername_identities_are_subjects() {
        use rcgen::{CertificateParams, KeyPair, OtherNameValue, SanType};
        let key = KeyPair::generate().unwrap();
        let mut p = CertificateParams::default();
        p.subject_alt_names = vec![
            SanType::OtherName((
                vec![1, 3, 6, 1, 4, 1, 57264, 1, 7],
                OtherNameValue::Utf8String("alice@build.example.com".into()),
            )),
            SanType::OtherName((
                vec![1, 3, 6, 1, 4, 1, 99999, 1],
                OtherNameValue::Utf8String("not-an-identity".into()),
            )),
        ];
        let cert = p.self_signed(&key).unwrap();
        let id = identity(cert.der()).unwrap();
        assert_eq!(id.subjects, vec!["alice@build.example.com"]);
    }
}
