//! Signed Certificate Timestamps embedded in Fulcio certificates (RFC 6962
//! §3.2): the CT log's promise that it logged the precertificate, checked
//! against the trusted root's `ctlogs` at the SCT's time.
//!
//! Owns rebuilding what the log signed — the leaf's TBSCertificate without
//! the SCT-list extension, bound to the issuer's key hash — and verifying
//! each SCT over it. x509-parser reads the SCT list; the TBS surgery is done
//! on the `der` reader, since no crate here re-encodes a TBSCertificate.

use x509_parser::prelude::{FromDer, ParsedExtension, X509Certificate};

use crate::der;
use crate::keys::SigEncoding;
use crate::trust::TrustedRoot;
use crate::{ArtifactError, sha256};

const SCT_LIST: &str = "1.3.6.1.4.1.11129.2.4.2";

/// The TBSCertificate of `cert` with the SCT-list extension taken out.
fn precert_tbs(cert: &[u8]) -> Result<Vec<u8>, crate::der::DerError> {
    let (c, _) = der::expect(cert, 0x30, "certificate")?;
    let (tbs, _) = der::expect(c.content, 0x30, "TBSCertificate")?;
    let mut content = Vec::new();
    for f in der::children(tbs.content)? {
        if f.tag != 0xa3 {
            content.extend_from_slice(f.raw);
            continue;
        }
        let (exts, _) = der::expect(f.content, 0x30, "extensions")?;
        let mut kept = Vec::new();
        for e in der::children(exts.content)? {
            let is_sct = der::children(e.content)?
                .first()
                .is_some_and(|oid| oid.tag == 0x06 && der::oid(oid.content) == SCT_LIST);
            if !is_sct {
                kept.extend_from_slice(e.raw);
            }
        }
        content.extend(der::encode(0xa3, &der::encode(0x30, &kept)));
    }
    Ok(der::encode(0x30, &content))
}

/// Verifies the embedded SCTs of `leaf` (issued by the certificate whose
/// SubjectPublicKeyInfo is `issuer_spki`): at least one must verify with a
/// CT log of the trusted root valid at its time. Returns how many did.
pub fn verify(
    leaf: &[u8],
    issuer_spki: &[u8],
    trust: &TrustedRoot,
) -> Result<usize, ArtifactError> {
    let (_, cert) = X509Certificate::from_der(leaf)
        .map_err(|e| ArtifactError::Malformed(format!("certificate: {e}")))?;
    let scts = cert
        .extensions()
        .iter()
        .find_map(|e| match e.parsed_extension() {
            ParsedExtension::SCT(list) => Some(list.clone()),
            _ => None,
        })
        .ok_or_else(|| ArtifactError::Chain("the certificate carries no SCT".into()))?;
    let tbs = precert_tbs(leaf)?;
    let issuer_hash = sha256(issuer_spki);
    let mut verified = 0;
    let mut last = String::from("no SCT from a trusted CT log");
    for s in &scts {
        let id = crate::trust::hex(s.id.key_id);
        let at = i64::try_from(s.timestamp / 1000).unwrap_or(i64::MAX);
        let Some(log) = trust
            .ctlogs
            .iter()
            .find(|l| l.id.eq_ignore_ascii_case(&id) && l.valid_at(at))
        else {
            last = format!(
                "SCT from CT log {} which the trusted root does not list (at that time)",
                &id[..12]
            );
            continue;
        };
        let mut m = vec![s.version.0, 0];
        m.extend_from_slice(&s.timestamp.to_be_bytes());
        m.extend_from_slice(&[0, 1]);
        m.extend_from_slice(&issuer_hash);
        let n = tbs.len();
        m.extend_from_slice(&[(n >> 16) as u8, (n >> 8) as u8, n as u8]);
        m.extend_from_slice(&tbs);
        let ext = s.extensions.0;
        m.extend_from_slice(&(ext.len() as u16).to_be_bytes());
        m.extend_from_slice(ext);
        if log.key.verify(SigEncoding::Der, &m, s.signature.data) {
            verified += 1;
        } else {
            last = format!("SCT does not verify with the key of CT log {}", &id[..12]);
        }
    }
    if verified == 0 {
        return Err(ArtifactError::Chain(last));
    }
    Ok(verified)
}
