//! RFC 3161 signed timestamps, as Sigstore bundles carry them
//! (`verificationMaterial.timestampVerificationData.rfc3161Timestamps`): the
//! only source of a verified signing time for Rekor v2 entries.
//!
//! Owns reading a TimeStampResp or bare TimeStampToken (CMS SignedData around
//! a TSTInfo), and accepting it only when: the message imprint is the hash of
//! the signature it vouches for; the signed attributes' message digest is the
//! hash of the TSTInfo; the signature over the signed attributes verifies
//! with the TSA's certificate (embedded, or the trusted root's); that
//! certificate chains to a timestamp authority of the trusted root, with the
//! timeStamping EKU, valid at the stamped time; the signed
//! signing-certificate attribute (ESSCertID or ESSCertIDv2, RFC 3161 §2.4.1,
//! RFC 5816) names that very certificate; and the trusted root lists the
//! authority, with a validity start, as valid at that time. Written on the `der` reader because
//! no CMS crate is in this workspace's dependency set (see the closing note).

use aws_lc_rs::digest;

use crate::der::{self, Tlv};
use crate::keys::{PublicKey, SigEncoding};
use crate::trust::TrustedRoot;
use crate::x509::{self, Eku};

message_error!(
    /// Why an RFC 3161 timestamp is unreadable, not over this signature, or not from a trusted authority.
    TimestampError
);

impl From<der::DerError> for TimestampError {
    fn from(e: der::DerError) -> Self {
        TimestampError(e.to_string())
    }
}

impl From<TimestampError> for sigil_core::SignatureProblem {
    fn from(e: TimestampError) -> Self {
        sigil_core::SignatureProblem::LevelCheck {
            detail: format!("RFC 3161 timestamp: {}", e.0),
        }
    }
}

const SIGNED_DATA: &str = "1.2.840.113549.1.7.2";
const TST_INFO: &str = "1.2.840.113549.1.9.16.1.4";
const MESSAGE_DIGEST: &str = "1.2.840.113549.1.9.4";
/// id-aa-signingCertificate (ESSCertID, SHA-1).
const SIGNING_CERTIFICATE: &str = "1.2.840.113549.1.9.16.2.12";
/// id-aa-signingCertificateV2 (ESSCertIDv2, SHA-256 unless named).
const SIGNING_CERTIFICATE_V2: &str = "1.2.840.113549.1.9.16.2.47";
const SHA1: &str = "1.3.14.3.2.26";
const SHA256: &str = "2.16.840.1.101.3.4.2.1";

fn hash(alg_oid: &str, data: &[u8]) -> Result<Vec<u8>, TimestampError> {
    let alg = match alg_oid {
        SHA1 => &digest::SHA1_FOR_LEGACY_USE_ONLY,
        SHA256 => &digest::SHA256,
        "2.16.840.1.101.3.4.2.2" => &digest::SHA384,
        "2.16.840.1.101.3.4.2.3" => &digest::SHA512,
        other => return Err(format!("unsupported hash algorithm {other}").into()),
    };
    Ok(digest::digest(alg, data).as_ref().to_vec())
}

fn alg_oid(t: &Tlv<'_>) -> Result<String, TimestampError> {
    let (oid, _) = der::expect(t.content, 0x06, "algorithm")?;
    Ok(der::oid(oid.content))
}

/// `YYYYMMDDHHMMSS[.f]Z` → Unix seconds.
fn generalized_time(s: &[u8]) -> Result<i64, TimestampError> {
    let s = std::str::from_utf8(s).map_err(|_| "genTime is not ASCII")?;
    let digits = s.get(..14).ok_or("genTime is too short")?;
    if !s.ends_with('Z') || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("genTime {s:?} is not a UTC GeneralizedTime").into());
    }
    let n = |a: usize, b: usize| digits[a..b].parse::<u32>().unwrap_or(0);
    let month = time::Month::try_from(n(4, 6) as u8).map_err(|e| e.to_string())?;
    let date = time::Date::from_calendar_date(n(0, 4) as i32, month, n(6, 8) as u8)
        .map_err(|e| e.to_string())?;
    let t = time::Time::from_hms(n(8, 10) as u8, n(10, 12) as u8, n(12, 14) as u8)
        .map_err(|e| e.to_string())?;
    Ok(time::PrimitiveDateTime::new(date, t)
        .assume_utc()
        .unix_timestamp())
}

/// The (hash algorithm, certificate hash) of the first certificate the
/// signed signing-certificate attribute names: ESSCertIDv2 if present, else
/// ESSCertID.
fn signing_certificate(attrs: &[u8]) -> Result<(String, Vec<u8>), TimestampError> {
    let mut v1 = None;
    for a in der::children(attrs)? {
        let kv = der::children(a.content)?;
        let (Some(k), Some(set)) = (kv.first(), kv.get(1)) else {
            continue;
        };
        let oid = der::oid(k.content);
        if oid != SIGNING_CERTIFICATE && oid != SIGNING_CERTIFICATE_V2 {
            continue;
        }
        // SET { SigningCertificate(V2) SEQUENCE { certs SEQUENCE OF ESSCertID(v2), … } }
        let (sc, _) = der::expect(set.content, 0x30, "SigningCertificate")?;
        let (certs, _) = der::expect(sc.content, 0x30, "SigningCertificate.certs")?;
        let (first, _) = der::expect(certs.content, 0x30, "ESSCertID")?;
        let parts = der::children(first.content)?;
        let id = match parts.as_slice() {
            [alg, hash, ..]
                if oid == SIGNING_CERTIFICATE_V2 && alg.tag == 0x30 && hash.tag == 0x04 =>
            {
                (alg_oid(alg)?, hash.content.to_vec())
            }
            [hash, ..] if hash.tag == 0x04 => (
                if oid == SIGNING_CERTIFICATE_V2 {
                    SHA256
                } else {
                    SHA1
                }
                .to_owned(),
                hash.content.to_vec(),
            ),
            _ => return Err("the signing-certificate attribute is malformed".into()),
        };
        if oid == SIGNING_CERTIFICATE_V2 {
            return Ok(id);
        }
        v1 = Some(id);
    }
    v1.ok_or_else(|| {
        "the timestamp's signed attributes name no signing certificate (ESSCertID/ESSCertIDv2, RFC 3161 §2.4.1)".into()
    })
}

/// What a verified timestamp says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stamp {
    /// `TSTInfo.genTime`, Unix seconds.
    pub time: i64,
    /// `TSTInfo.accuracy` in whole seconds, rounded up (1 for the baseline
    /// time-stamp policy without one, else 0), as RFC 3161 §2.4.2 reads it.
    pub accuracy: i64,
}

/// A timestamp token read, its imprint checked against the signature, its
/// signer not yet trusted.
struct Token<'a> {
    stamp: Stamp,
    certs: Vec<Vec<u8>>,
    /// The signed attributes re-tagged as a SET: what the signature covers.
    signed: Vec<u8>,
    sig: &'a [u8],
    ess: (String, Vec<u8>),
}

/// ETSI's baseline time-stamp policy (RFC 3628 §5.2): accuracy 1 s.
const BASELINE_POLICY: &str = "0.4.0.2023.1.1";

fn accuracy(tst: &[Tlv<'_>]) -> Result<i64, TimestampError> {
    // TSTInfo: version, policy, messageImprint, serialNumber, genTime, accuracy?, …
    let Some(acc) = tst.get(5).filter(|t| t.tag == 0x30) else {
        let policy = tst.get(1).map(|p| der::oid(p.content)).unwrap_or_default();
        return Ok(i64::from(policy == BASELINE_POLICY));
    };
    let mut seconds = 0i64;
    let mut fraction = false;
    for part in der::children(acc.content)? {
        let n = part
            .content
            .iter()
            .try_fold(0i64, |a, &b| a.checked_mul(256).map(|a| a + i64::from(b)))
            .ok_or("accuracy is too large")?;
        match part.tag {
            0x02 => seconds = n,
            0x80 | 0x81 => fraction |= n > 0,
            _ => return Err("accuracy is malformed".into()),
        }
    }
    Ok(seconds + i64::from(fraction))
}

fn read<'t>(token: &'t [u8], signature: &[u8]) -> Result<Token<'t>, TimestampError> {
    let (outer, _) = der::expect(token, 0x30, "timestamp")?;
    let parts = der::children(outer.content)?;
    // A TimeStampResp starts with PKIStatusInfo (a SEQUENCE starting with an INTEGER).
    let content_info = match parts.as_slice() {
        [status, token, ..] if status.tag == 0x30 && token.tag == 0x30 => {
            let (code, _) = der::expect(status.content, 0x02, "PKIStatus")?;
            if !matches!(code.content, [0] | [1]) {
                return Err("the timestamp authority did not grant the timestamp".into());
            }
            der::children(token.content)?
        }
        _ => parts,
    };
    let [ct, explicit, ..] = content_info.as_slice() else {
        return Err("timestamp is not a CMS ContentInfo".into());
    };
    if ct.tag != 0x06 || der::oid(ct.content) != SIGNED_DATA || explicit.tag != 0xa0 {
        return Err("timestamp is not CMS SignedData".into());
    }
    let (sd, _) = der::expect(explicit.content, 0x30, "SignedData")?;
    let sd = der::children(sd.content)?;
    let encap = sd.get(2).ok_or("SignedData has no content")?;
    let certs: Vec<Vec<u8>> = match sd.get(3) {
        Some(c) if c.tag == 0xa0 => der::children(c.content)?
            .into_iter()
            .filter(|c| c.tag == 0x30)
            .map(|c| c.raw.to_vec())
            .collect(),
        _ => Vec::new(),
    };
    let signer_infos = sd
        .last()
        .filter(|s| s.tag == 0x31)
        .ok_or("SignedData has no signerInfos")?;
    // The TSTInfo.
    let encap = der::children(encap.content)?;
    let [ety, econtent, ..] = encap.as_slice() else {
        return Err("SignedData has no encapsulated content".into());
    };
    if der::oid(ety.content) != TST_INFO || econtent.tag != 0xa0 {
        return Err("SignedData does not carry a TSTInfo".into());
    }
    let (tst_octets, _) = der::expect(econtent.content, 0x04, "eContent")?;
    let tst_der = tst_octets.content;
    let (tst, _) = der::expect(tst_der, 0x30, "TSTInfo")?;
    let tst = der::children(tst.content)?;
    let imprint = der::children(tst.get(2).ok_or("TSTInfo has no messageImprint")?.content)?;
    let [imprint_alg, imprint_hash, ..] = imprint.as_slice() else {
        return Err("messageImprint is malformed".into());
    };
    let gen_time = generalized_time(
        tst.get(4)
            .filter(|t| t.tag == 0x18)
            .ok_or("TSTInfo has no genTime")?
            .content,
    )?;
    let stamp = Stamp {
        time: gen_time,
        accuracy: accuracy(&tst)?,
    };
    if hash(&alg_oid(imprint_alg)?, signature)? != imprint_hash.content {
        return Err("the timestamp is not over this signature (message imprint differs)".into());
    }
    // The signer: signed attributes bind the TSTInfo; the signature binds them.
    let (si, _) = der::expect(signer_infos.content, 0x30, "SignerInfo")?;
    let si = der::children(si.content)?;
    let digest_alg = alg_oid(si.get(2).ok_or("SignerInfo has no digestAlgorithm")?)?;
    let attrs = si
        .get(3)
        .filter(|a| a.tag == 0xa0)
        .ok_or("SignerInfo has no signed attributes")?;
    let sig = si
        .get(5)
        .filter(|s| s.tag == 0x04)
        .ok_or("SignerInfo has no signature")?;
    let want = hash(&digest_alg, tst_der)?;
    let digest_ok = der::children(attrs.content)?.iter().any(|a| {
        der::children(a.content).is_ok_and(|kv| {
            kv.first()
                .is_some_and(|k| der::oid(k.content) == MESSAGE_DIGEST)
                && kv.get(1).is_some_and(|set| {
                    der::read(set.content).is_ok_and(|(v, _)| v.content == want.as_slice())
                })
        })
    });
    if !digest_ok {
        return Err("the timestamp's signed attributes do not match its TSTInfo".into());
    }
    let (ess_alg, ess_hash) = signing_certificate(attrs.content)?;
    let mut signed = attrs.raw.to_vec();
    signed[0] = 0x31;
    Ok(Token {
        stamp,
        certs,
        signed,
        sig: sig.content,
        ess: (ess_alg, ess_hash),
    })
}

impl Token<'_> {
    /// The certificate among `candidates` whose key made the signature.
    fn signed_by<'c>(&self, candidates: &[&'c Vec<u8>]) -> Option<&'c Vec<u8>> {
        candidates.iter().copied().find(|c| {
            x509::spki(c)
                .ok()
                .and_then(|k| PublicKey::from_spki(&k).ok())
                .is_some_and(|k| k.verify(SigEncoding::Der, &self.signed, self.sig))
        })
    }

    /// The signed signing-certificate attribute names `leaf`.
    fn names(&self, leaf: &[u8]) -> Result<(), TimestampError> {
        if hash(&self.ess.0, leaf)? != self.ess.1 {
            return Err("the timestamp's signing-certificate attribute names another certificate than the one that signed it".into());
        }
        Ok(())
    }

    /// The certificate among `candidates` whose key made the signature and
    /// that the signing-certificate attribute names.
    fn signer<'c>(&self, candidates: &[&'c Vec<u8>]) -> Result<&'c Vec<u8>, TimestampError> {
        let leaf = self.signed_by(candidates).ok_or(
            "the timestamp's signature does not verify with a trusted timestamp authority's key",
        )?;
        self.names(leaf)?;
        Ok(leaf)
    }
}

/// Verifies one timestamp over `signature` against the trusted root's
/// timestamp authorities; returns the stamped time.
///
/// Each authority is one chain and one window: the token must be signed by
/// the signing certificate the authority lists (a certificate the token
/// carries is unsigned data anyone can add, so it never stands in for
/// it), which chains to the authority's own root through the authority's
/// own intermediates at the stamped time, and the stamped time lies in the
/// authority's `validFor`. Only an authority that lists no signing
/// certificate takes the token's, and still chains it through its own
/// certificates alone.
pub fn verify(token: &[u8], signature: &[u8], trust: &TrustedRoot) -> Result<i64, TimestampError> {
    let t = read(token, signature)?;
    let gen_time = t.stamp.time;
    // Why an authority whose key made the signature refused it, which says
    // more than "no key matched" from the others.
    let mut signed_by: Option<String> = None;
    let mut last = "no timestamp authority in the trusted root".to_owned();
    for a in &trust.timestamp_authorities {
        let leaf = match &a.leaf {
            Some(listed) => {
                if t.signed_by(&[listed]).is_none() {
                    last = "the timestamp is not signed by the signing certificate of any timestamp authority in the trusted root (a certificate the token carries is never trusted by itself)".into();
                    continue;
                }
                if let Err(e) = t.names(listed) {
                    signed_by = Some(e.0);
                    continue;
                }
                listed
            }
            None => match t.signer(&t.certs.iter().collect::<Vec<_>>()) {
                Ok(l) => l,
                Err(e) => {
                    last = e.0;
                    continue;
                }
            },
        };
        if let Err(e) = x509::verify_chain(
            leaf,
            &a.intermediates,
            std::slice::from_ref(&a.root),
            gen_time,
            Eku::TimeStamping,
        ) {
            signed_by = Some(format!("timestamp authority certificate: {e}"));
            continue;
        }
        if !a.valid_at_with_start(gen_time) {
            signed_by = Some(if a.valid_from.is_none() {
                "the timestamp authority has no validity start in the trusted root (never trusted)"
                    .into()
            } else {
                format!(
                    "the timestamp (Unix {gen_time}) falls outside the validity its signing authority has in the trusted root ({})",
                    window(a)
                )
            });
            continue;
        }
        return Ok(gen_time);
    }
    Err(signed_by.unwrap_or(last).into())
}

/// An authority's `validFor`, for messages.
fn window(a: &crate::trust::Authority) -> String {
    let t = |v: Option<i64>| v.map_or_else(|| "-".to_owned(), |v| v.to_string());
    format!("Unix {} to {}", t(a.valid_from), t(a.valid_until))
}

/// Verifies one timestamp countersignature over `signature` against a
/// notation `tsa` trust store (root certificates; the token carries its
/// signing certificate and any intermediates, as `notation sign
/// --timestamp-url` asks TSAs to).
pub fn verify_with_store(
    token: &[u8],
    signature: &[u8],
    roots: &[Vec<u8>],
) -> Result<Stamp, TimestampError> {
    if roots.is_empty() {
        return Err("no tsa trust store to verify it against (tsaRoots)".into());
    }
    let t = read(token, signature)?;
    let candidates: Vec<&Vec<u8>> = t.certs.iter().collect();
    let leaf = t.signer(&candidates)?;
    let inter: Vec<Vec<u8>> = t.certs.iter().filter(|c| *c != leaf).cloned().collect();
    for at in [
        t.stamp.time - t.stamp.accuracy,
        t.stamp.time + t.stamp.accuracy,
    ] {
        x509::verify_chain(leaf, &inter, roots, at, Eku::TimeStamping)
            .map_err(|e| format!("timestamp authority certificate: {e}"))?;
    }
    Ok(t.stamp)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generalized_times() {
        assert_eq!(generalized_time(b"19700101000001Z"), Ok(1));
        assert_eq!(generalized_time(b"20250806190351.123Z"), Ok(1_754_507_031));
        assert!(generalized_time(b"20250806190351").is_err());
        assert!(generalized_time(b"2025").is_err());
    }
}
