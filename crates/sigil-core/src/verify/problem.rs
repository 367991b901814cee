//! Why a signature (or the lack of one) did not satisfy a verifier: the
//! typed reasons sigil-verify reports, their metric labels, which one is
//! worth reporting among many, and their words in denials. It checks
//! nothing itself.

use std::fmt;

/// Why one signature (or the lack of one) did not satisfy a verifier.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SignatureProblem {
    /// No signature of this verifier's kind exists for the digest.
    NoSignature,
    /// A signature exists but the configured key did not make it.
    WrongKey,
    /// Validly signed, but over another image digest.
    DigestMismatch {
        /// The digest the signature names.
        signed: String,
    },
    /// The certificate's identity is not the one the policy asks for.
    IdentityMismatch {
        /// Issuer and subject found in the certificate.
        found: String,
    },
    /// The certificate chain does not lead to a trusted root (at the time checked).
    ChainInvalid {
        /// Why.
        detail: String,
    },
    /// The transparency-log entry is missing, unsigned by a trusted log, or not about this signature.
    LogEntryInvalid {
        /// Why.
        detail: String,
    },
    /// The signature or envelope could not be parsed or uses an unsupported form.
    Malformed {
        /// Why.
        detail: String,
    },
    /// A check the verification level enforces failed (expiry, timestamp).
    LevelCheck {
        /// Which check and why.
        detail: String,
    },
    /// The trust material the verifier names is not available (a
    /// `TrustRoot` not in force yet, or failing): nothing could be checked.
    TrustUnavailable {
        /// Which material and why.
        detail: String,
    },
    /// A certificate of the signing chain is revoked (its CA's CRL lists it).
    Revoked {
        /// Which certificate, by which CRL.
        detail: String,
    },
    /// The signing chain's revocation status could not be determined (a
    /// CRL not fetched yet, unreachable, stale or not the issuer's). It may
    /// resolve by itself, so it is never cached.
    RevocationUnknown {
        /// Which certificate and CRL, and why.
        detail: String,
    },
}

impl SignatureProblem {
    /// Short label for metrics and logs.
    pub fn kind(&self) -> &'static str {
        match self {
            SignatureProblem::NoSignature => "no_signature",
            SignatureProblem::WrongKey => "wrong_key",
            SignatureProblem::DigestMismatch { .. } => "digest_mismatch",
            SignatureProblem::IdentityMismatch { .. } => "identity_mismatch",
            SignatureProblem::ChainInvalid { .. } => "chain_invalid",
            SignatureProblem::LogEntryInvalid { .. } => "log_entry_invalid",
            SignatureProblem::Malformed { .. } => "malformed",
            SignatureProblem::LevelCheck { .. } => "level_check",
            SignatureProblem::TrustUnavailable { .. } => "trust_unavailable",
            SignatureProblem::Revoked { .. } => "revoked",
            SignatureProblem::RevocationUnknown { .. } => "revocation_unknown",
        }
    }

    /// How bad the problem is, to pick the one worth reporting among many
    /// signatures: a signature that got further is more telling.
    pub(super) fn rank(&self) -> u8 {
        match self {
            SignatureProblem::NoSignature | SignatureProblem::TrustUnavailable { .. } => 0,
            SignatureProblem::Malformed { .. } => 1,
            SignatureProblem::WrongKey => 2,
            SignatureProblem::ChainInvalid { .. } => 3,
            SignatureProblem::IdentityMismatch { .. } => 4,
            SignatureProblem::LogEntryInvalid { .. } => 5,
            SignatureProblem::LevelCheck { .. } | SignatureProblem::RevocationUnknown { .. } => 6,
            SignatureProblem::Revoked { .. } => 7,
            SignatureProblem::DigestMismatch { .. } => 8,
        }
    }
}

impl fmt::Display for SignatureProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SignatureProblem::NoSignature => write!(f, "no signature found"),
            SignatureProblem::WrongKey => write!(f, "wrong key (signature does not verify)"),
            SignatureProblem::DigestMismatch { signed } => {
                write!(f, "digest mismatch (signature is for {signed})")
            }
            SignatureProblem::IdentityMismatch { found } => {
                write!(f, "identity mismatch (certificate has {found})")
            }
            SignatureProblem::ChainInvalid { detail } => write!(f, "chain invalid: {detail}"),
            SignatureProblem::LogEntryInvalid { detail } => {
                write!(f, "log entry invalid: {detail}")
            }
            SignatureProblem::Malformed { detail } => write!(f, "malformed signature: {detail}"),
            SignatureProblem::LevelCheck { detail } => write!(f, "{detail}"),
            SignatureProblem::TrustUnavailable { detail } => {
                write!(f, "trust material unavailable: {detail}")
            }
            SignatureProblem::Revoked { detail } => write!(f, "revoked: {detail}"),
            SignatureProblem::RevocationUnknown { detail } => {
                write!(f, "revocation status unknown: {detail}")
            }
        }
    }
}
