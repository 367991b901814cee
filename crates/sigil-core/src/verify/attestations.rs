//! What a rule's attestation entries require once compiled, and what
//! checking one digest against an entry found: the attestations of its
//! predicate type, who verified each, every condition's result. Whether an
//! entry passes, and how a denial, `sigil verify IMAGE` and `sigil policy
//! check` put it in words, is decided here, in one place. sigil-verify
//! finds and verifies the attestations and fills in [`Seen`].

use std::fmt;

use super::VerifierSpec;
use crate::attest::{Condition, ConditionResult, DEFAULT_MAX_ATTESTATION_BYTES};

/// One entry, compiled: what the verifier and the decision read.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct AttestationRequirement {
    /// Entry name.
    pub name: String,
    /// The predicate type's URI.
    pub predicate_type: String,
    /// The verifiers that may have signed it, in the order written.
    pub attestors: Vec<VerifierSpec>,
    /// Conditions that must all hold for one verified attestation.
    pub conditions: Vec<Condition>,
    /// Largest statement read, in bytes.
    pub max_bytes: usize,
}

/// One attestation of the entry's predicate type, as checking found it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    /// The attestor that verified it, if one did.
    pub attestor: Option<String>,
    /// Who signed it, as the certificate says (or `key`), when verified.
    pub signer: String,
    /// Why no attestor verified it (the most telling reason).
    pub problem: Option<String>,
    /// Every condition's result, when it was verified.
    pub conditions: Vec<ConditionResult>,
    /// How it was found: its form and transparency-log entry kind.
    pub form: String,
}

impl Seen {
    /// Verified by an attestor and every condition holds.
    pub fn passed(&self) -> bool {
        self.attestor.is_some() && self.conditions.iter().all(ConditionResult::holds)
    }
}

/// What one entry found on one digest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EntryOutcome {
    /// Entry name.
    pub name: String,
    /// Its predicate type's URI.
    pub predicate_type: String,
    /// Attestations of that type.
    pub seen: Vec<Seen>,
    /// Attestations of other types found beside them.
    pub other_types: usize,
}

impl EntryOutcome {
    /// At least one attestation verified and satisfies every condition.
    pub fn passed(&self) -> bool {
        self.seen.iter().any(Seen::passed)
    }

    /// The attestor of the first passing attestation.
    pub fn passed_by(&self) -> Option<&str> {
        self.seen
            .iter()
            .find(|s| s.passed())
            .and_then(|s| s.attestor.as_deref())
    }
}

impl fmt::Display for EntryOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (n, pt) = (&self.name, &self.predicate_type);
        if let Some(by) = self.passed_by() {
            return write!(f, "attestation {n}: ok ({pt} by {by})");
        }
        let count = self.seen.len();
        if count == 0 {
            write!(
                f,
                "attestation {n}: no {pt} attestation found for this digest"
            )?;
            if self.other_types > 0 {
                write!(f, " ({} of other types)", self.other_types)?;
            }
            return Ok(());
        }
        let plural = if count == 1 { "" } else { "s" };
        let verified: Vec<&Seen> = self.seen.iter().filter(|s| s.attestor.is_some()).collect();
        if verified.is_empty() {
            let problem = self
                .seen
                .iter()
                .find_map(|s| s.problem.as_deref())
                .unwrap_or("unverified");
            return write!(
                f,
                "attestation {n}: {count} {pt} attestation{plural} found, none verified by its attestors: {problem}"
            );
        }
        // Verified, but conditions fail: the first verified one's first failing condition.
        let s = verified[0];
        write!(
            f,
            "attestation {n}: {count} {pt} attestation{plural} found, {} verified (by {}, signer {})",
            verified.len(),
            s.attestor.as_deref().unwrap_or_default(),
            s.signer
        )?;
        if let Some(c) = s.conditions.iter().find(|c| !c.holds()) {
            write!(f, "; condition {:?}", c.expression)?;
            if let Some(m) = &c.message {
                write!(f, " ({m})")?;
            }
            match (&c.outcome, &c.saw) {
                (Err(e), _) => write!(f, " cannot be evaluated: {e}")?,
                (_, Some(saw)) => write!(f, " is false: it read {saw}")?,
                (_, None) => write!(f, " is false")?,
            }
        }
        Ok(())
    }
}

/// How `sigil policy check` explains an entry, in words.
pub fn describe(a: &AttestationRequirement) -> String {
    let by: Vec<String> = a
        .attestors
        .iter()
        .map(|v| match v.cosign.as_ref() {
            Some(c) if c.key.is_some() => format!("{} (key)", v.name),
            Some(c) => {
                let k = c.keyless.clone().unwrap_or_default();
                let who = k
                    .subject
                    .or(k.subject_regex.map(|r| format!("/{r}/")))
                    .unwrap_or_default();
                let iss = k
                    .issuer
                    .or(k.issuer_regex.map(|r| format!("/{r}/")))
                    .unwrap_or_default();
                format!("{} (keyless {who} from {iss})", v.name)
            }
            None => v.name.clone(),
        })
        .collect();
    let mut s = format!(
        "attestation {:?}: a {} statement about the pinned digest, signed by {}",
        a.name,
        a.predicate_type,
        by.join(" or ")
    );
    if a.conditions.is_empty() {
        s.push_str(", with no conditions");
    } else {
        s.push_str(", where ");
        let parts: Vec<String> = a
            .conditions
            .iter()
            .map(|c| match &c.message {
                Some(m) => format!("{m} ({})", c.expression),
                None => c.expression.clone(),
            })
            .collect();
        s.push_str(&parts.join("; and "));
    }
    if a.max_bytes != DEFAULT_MAX_ATTESTATION_BYTES {
        s.push_str(&format!(" (statements up to {} bytes)", a.max_bytes));
    }
    s
}
