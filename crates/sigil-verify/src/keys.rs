//! Public keys as cosign and notation use them: PEM or DER SubjectPublicKeyInfo
//! in, a signature check out.
//!
//! Owns mapping a key type to the signature algorithms that signers really
//! use with it — Sigstore's algorithm registry: ECDSA with SHA-256 on P-256,
//! SHA-384 or SHA-256 on P-384, SHA-512 or SHA-256 on P-521, pure Ed25519,
//! RSA PKCS#1 v1.5 or PSS with SHA-256. Any other curve or algorithm is
//! refused by name. It does not decide which key is trusted.

use aws_lc_rs::signature::{self, ParsedPublicKey, VerificationAlgorithm};
use x509_parser::prelude::FromDer;
use x509_parser::x509::SubjectPublicKeyInfo;

use crate::VerifyError;

const OID_EC: &str = "1.2.840.10045.2.1";
const OID_P256: &str = "1.2.840.10045.3.1.7";
const OID_P384: &str = "1.3.132.0.34";
const OID_P521: &str = "1.3.132.0.35";
const OID_ED25519: &str = "1.3.101.112";
const OID_RSA: &str = "1.2.840.113549.1.1.1";

/// Which family a key belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyType {
    /// ECDSA on NIST P-256.
    P256,
    /// ECDSA on NIST P-384.
    P384,
    /// ECDSA on NIST P-521.
    P521,
    /// Ed25519.
    Ed25519,
    /// RSA, any size aws-lc accepts (2048–8192 bits).
    Rsa,
}

/// A public key ready to check signatures; parsed once at policy load.
pub struct PublicKey {
    /// Key family.
    pub kind: KeyType,
    /// The key parsed once per algorithm it may be used with.
    parsed: Vec<ParsedPublicKey>,
    /// The SubjectPublicKeyInfo DER, to compare keys.
    pub spki: Vec<u8>,
}

impl std::fmt::Debug for PublicKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PublicKey")
            .field("kind", &self.kind)
            .finish()
    }
}

/// Signature encodings to try for a key family: ASN.1 DER for cosign and
/// X.509, fixed r||s for JOSE/COSE.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SigEncoding {
    /// DER-encoded ECDSA, PKCS#1 v1.5 or PSS for RSA (cosign, Rekor).
    Der,
    /// Fixed-width ECDSA, PSS for RSA (JWS/COSE `ES*`/`PS*`).
    Jose,
}

fn algorithms(kind: KeyType, enc: SigEncoding) -> &'static [&'static dyn VerificationAlgorithm] {
    match (kind, enc) {
        (KeyType::P256, SigEncoding::Der) => &[&signature::ECDSA_P256_SHA256_ASN1],
        (KeyType::P384, SigEncoding::Der) => &[
            &signature::ECDSA_P384_SHA384_ASN1,
            &signature::ECDSA_P384_SHA256_ASN1,
        ],
        (KeyType::P521, SigEncoding::Der) => &[
            &signature::ECDSA_P521_SHA512_ASN1,
            &signature::ECDSA_P521_SHA256_ASN1,
        ],
        (KeyType::P256, SigEncoding::Jose) => &[&signature::ECDSA_P256_SHA256_FIXED],
        (KeyType::P521, SigEncoding::Jose) => &[&signature::ECDSA_P521_SHA512_FIXED],
        (KeyType::P384, SigEncoding::Jose) => &[&signature::ECDSA_P384_SHA384_FIXED],
        (KeyType::Ed25519, _) => &[&signature::ED25519],
        (KeyType::Rsa, SigEncoding::Der) => &[
            &signature::RSA_PKCS1_2048_8192_SHA256,
            &signature::RSA_PSS_2048_8192_SHA256,
        ],
        (KeyType::Rsa, SigEncoding::Jose) => &[
            &signature::RSA_PSS_2048_8192_SHA256,
            &signature::RSA_PSS_2048_8192_SHA384,
            &signature::RSA_PSS_2048_8192_SHA512,
        ],
    }
}

impl PublicKey {
    /// Parses a PEM `PUBLIC KEY` block (the first one in `pem`).
    pub fn from_pem(pem: &str) -> Result<PublicKey, VerifyError> {
        let block = pem_blocks(pem)
            .into_iter()
            .find(|(label, _)| label == "PUBLIC KEY")
            .ok_or_else(|| VerifyError::Key("no \"PUBLIC KEY\" PEM block".into()))?;
        PublicKey::from_spki(&block.1)
    }

    /// Parses a DER SubjectPublicKeyInfo.
    pub fn from_spki(der: &[u8]) -> Result<PublicKey, VerifyError> {
        let (_, spki) = SubjectPublicKeyInfo::from_der(der)
            .map_err(|e| VerifyError::Key(format!("not a SubjectPublicKeyInfo: {e}")))?;
        let alg = spki.algorithm.algorithm.to_id_string();
        let kind = match alg.as_str() {
            OID_EC => {
                let curve = spki
                    .algorithm
                    .parameters
                    .as_ref()
                    .and_then(|p| p.as_oid().ok())
                    .map(|o| o.to_id_string());
                match curve.as_deref() {
                    Some(OID_P256) => KeyType::P256,
                    Some(OID_P384) => KeyType::P384,
                    Some(OID_P521) => KeyType::P521,
                    other => {
                        return Err(VerifyError::Key(format!(
                            "unsupported elliptic curve {} (Sigstore's registry: P-256, P-384, P-521)",
                            other.unwrap_or("(none)")
                        )));
                    }
                }
            }
            OID_ED25519 => KeyType::Ed25519,
            OID_RSA => KeyType::Rsa,
            other => {
                return Err(VerifyError::Key(format!(
                    "unsupported key algorithm {other}"
                )));
            }
        };
        let raw: &[u8] = spki.subject_public_key.data.as_ref();
        let mut parsed = Vec::new();
        for enc in [SigEncoding::Der, SigEncoding::Jose] {
            for alg in algorithms(kind, enc) {
                let p = ParsedPublicKey::new(*alg, raw)
                    .map_err(|e| VerifyError::Key(format!("key rejected: {e}")))?;
                parsed.push(p);
            }
        }
        Ok(PublicKey {
            kind,
            parsed,
            spki: der.to_vec(),
        })
    }

    /// Verifies a JOSE/COSE signature with exactly the algorithm its header
    /// names (`PS256`, `ES384`, …); an algorithm that does not fit the key fails.
    pub fn verify_jose(&self, alg: &str, msg: &[u8], sig: &[u8]) -> bool {
        let want: &'static dyn VerificationAlgorithm = match (alg, self.kind) {
            ("PS256", KeyType::Rsa) => &signature::RSA_PSS_2048_8192_SHA256,
            ("PS384", KeyType::Rsa) => &signature::RSA_PSS_2048_8192_SHA384,
            ("PS512", KeyType::Rsa) => &signature::RSA_PSS_2048_8192_SHA512,
            ("ES256", KeyType::P256) => &signature::ECDSA_P256_SHA256_FIXED,
            ("ES384", KeyType::P384) => &signature::ECDSA_P384_SHA384_FIXED,
            ("ES512", KeyType::P521) => &signature::ECDSA_P521_SHA512_FIXED,
            _ => return false,
        };
        self.parsed.iter().any(|p| {
            std::ptr::addr_eq(want as *const _, p.algorithm() as *const _)
                && p.verify_sig(msg, sig).is_ok()
        })
    }

    /// Whether `sig` (DER ECDSA or RSA) signs a message whose SHA-256 is
    /// `digest` — for a signed artifact known only by its digest. Ed25519
    /// signs messages, not digests, so it never verifies here.
    pub fn verify_prehashed(&self, digest: &[u8; 32], sig: &[u8]) -> bool {
        self.verify_prehashed_as(&aws_lc_rs::digest::SHA256, digest, sig)
    }

    /// [`Self::verify_prehashed`] for a digest under `alg` (SHA-384 for
    /// P-384, SHA-512 for P-521, as Sigstore's registry pairs them).
    pub fn verify_prehashed_as(
        &self,
        alg: &'static aws_lc_rs::digest::Algorithm,
        digest: &[u8],
        sig: &[u8],
    ) -> bool {
        let Ok(d) = aws_lc_rs::digest::Digest::import_less_safe(digest, alg) else {
            return false;
        };
        let allowed = algorithms(self.kind, SigEncoding::Der);
        self.parsed.iter().any(|p| {
            allowed
                .iter()
                .any(|a| std::ptr::addr_eq(*a as *const _, p.algorithm() as *const _))
                && p.verify_digest_sig(&d, sig).is_ok()
        })
    }

    /// Whether `sig` is a valid signature of `msg` by this key, in any
    /// algorithm the encoding allows for the key's family.
    pub fn verify(&self, enc: SigEncoding, msg: &[u8], sig: &[u8]) -> bool {
        let allowed = algorithms(self.kind, enc);
        self.parsed.iter().any(|p| {
            allowed
                .iter()
                .any(|a| std::ptr::addr_eq(*a as *const _, p.algorithm() as *const _))
                && p.verify_sig(msg, sig).is_ok()
        })
    }
}

/// Splits PEM text into `(label, der)` blocks; malformed blocks are skipped.
pub fn pem_blocks(text: &str) -> Vec<(String, Vec<u8>)> {
    use base64::Engine as _;
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(start) = rest.find("-----BEGIN ") {
        let after = &rest[start + 11..];
        let Some(label_end) = after.find("-----") else {
            break;
        };
        let label = after[..label_end].to_owned();
        let body_start = &after[label_end + 5..];
        let end_marker = format!("-----END {label}-----");
        let Some(end) = body_start.find(&end_marker) else {
            break;
        };
        let b64: String = body_start[..end]
            .chars()
            .filter(|c| !c.is_whitespace())
            .collect();
        if let Ok(der) = base64::engine::general_purpose::STANDARD.decode(b64) {
            out.push((label, der));
        }
        rest = &body_start[end + end_marker.len()..];
    }
    out
}

/// Reads a policy value that is either inline PEM or a path to a PEM file.
pub fn pem_text(value: &str) -> Result<String, VerifyError> {
    if value.contains("-----BEGIN ") {
        return Ok(value.to_owned());
    }
    sigil_registry::file::read_text(
        std::path::Path::new(value.trim()),
        sigil_registry::file::MAX_PEM_BYTES,
    )
    .map_err(|e| VerifyError::File {
        path: value.trim().to_owned(),
        detail: e.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALICE: &str = include_str!("../tests/vectors/cosign/alice.key");

    /// A platform's policy may name files; each goes through the bounded
    /// reader, so a device or a huge file is a clear error, never a hang.
    #[test]
    fn a_key_file_that_is_a_device_is_refused_not_read() {
        let e = pem_text("/dev/zero").unwrap_err().to_string();
        assert!(e.starts_with("/dev/zero: not a regular file"), "{e}");
    }

    #[test]
    fn reads_cosign_public_keys() {
        let k = PublicKey::from_pem(ALICE).unwrap();
        assert_eq!(k.kind, KeyType::P256);
        assert!(
            PublicKey::from_pem("-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----")
                .is_err()
        );
        assert!(PublicKey::from_pem("nothing").is_err());
    }

    #[test]
    fn keys_of_each_family_verify_their_own_signatures() {
        use aws_lc_rs::rand::SystemRandom;
        use aws_lc_rs::signature::{EcdsaKeyPair, Ed25519KeyPair, KeyPair};
        let rng = SystemRandom::new();
        let msg = b"payload";
        let p256 = EcdsaKeyPair::generate(&signature::ECDSA_P256_SHA256_ASN1_SIGNING).unwrap();
        let spki = spki_of_ec(&p256, OID_P256);
        let k = PublicKey::from_spki(&spki).unwrap();
        let sig = p256.sign(&rng, msg).unwrap();
        assert!(k.verify(SigEncoding::Der, msg, sig.as_ref()));
        assert!(!k.verify(SigEncoding::Der, b"other", sig.as_ref()));
        // P-384 with SHA-384, as cosign signs with a P-384 key.
        let p384 = EcdsaKeyPair::generate(&signature::ECDSA_P384_SHA384_ASN1_SIGNING).unwrap();
        let k = PublicKey::from_spki(&spki_of_ec(&p384, OID_P384)).unwrap();
        assert_eq!(k.kind, KeyType::P384);
        assert!(k.verify(
            SigEncoding::Der,
            msg,
            p384.sign(&rng, msg).unwrap().as_ref()
        ));
        let ed = Ed25519KeyPair::generate().unwrap();
        let spki = {
            use aws_lc_rs::encoding::AsDer;
            ed.public_key().as_der().unwrap()
        };
        let k = PublicKey::from_spki(spki.as_ref()).unwrap();
        assert_eq!(k.kind, KeyType::Ed25519);
        assert!(k.verify(SigEncoding::Der, msg, ed.sign(msg).as_ref()));
    }

    fn spki_of_ec(k: &aws_lc_rs::signature::EcdsaKeyPair, _curve: &str) -> Vec<u8> {
        use aws_lc_rs::encoding::AsDer;
        use aws_lc_rs::signature::KeyPair;
        k.public_key().as_der().unwrap().as_ref().to_vec()
    }
}
