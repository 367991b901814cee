//! A rule's `attestations:` — the entries as written, their compilation
//! (predicate types resolved, attestors resolved to verifiers, conditions
//! compiled once, size limits), and what checking one digest against an
//! entry found, rendered once for denials, `sigil verify IMAGE` and
//! `sigil policy check`.
//!
//! It does no cryptography and fetches nothing: sigil-verify finds the
//! attestations, verifies them with the entry's attestors and hands back
//! [`Seen`] records; whether an entry passes is decided here.

use std::fmt;

use serde::{Deserialize, Serialize};
use serde_saphyr::Spanned;

use super::{ConditionResult, DEFAULT_MAX_ATTESTATION_BYTES, SHORT_NAMES, predicate_type_uri};
use crate::policy::{PolicyError, invalid};
use crate::verify::{Verification, VerifierSpec};

/// Smallest and largest `maxAttestationSize` accepted.
const SIZE_BOUNDS: (usize, usize) = (1 << 10, 64 << 20);
/// At most this many entries per rule, and conditions per entry.
const MAX_ENTRIES: usize = 16;
const MAX_CONDITIONS: usize = 32;

/// One entry of a rule's `attestations:`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AttestationSpec {
    /// Named in denials, reports and the audit annotation.
    pub name: Spanned<String>,
    /// An exact URI, or one of cosign's short names (`slsaprovenance1`, `spdx`, `vuln`, …).
    pub predicate_type: Spanned<String>,
    /// Who may have signed it: inline verifiers, or names of the rule's `verify` entries.
    #[serde(default)]
    pub attestors: Vec<AttestorSpec>,
    /// CEL expressions that must all hold for one attestation.
    #[serde(default)]
    pub conditions: Vec<ConditionSpec>,
    /// Largest statement read (bytes, or `Ki`/`Mi` units); default 8 MiB.
    #[serde(default)]
    pub max_attestation_size: Option<Spanned<ByteSize>>,
}

/// An attestor: the name of one of the rule's `verify` entries, or a verifier inline.
#[derive(Debug, Clone, Serialize)]
#[serde(untagged)]
pub enum AttestorSpec {
    /// `attestors: [scanner]`.
    Name(String),
    /// `attestors: [{name: gha, cosign: {...}}]`.
    Inline(Box<VerifierSpec>),
}

impl<'de> Deserialize<'de> for AttestorSpec {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = AttestorSpec;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(
                    "the name of one of the rule's verify entries, or a verifier (name and cosign)",
                )
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<AttestorSpec, E> {
                Ok(AttestorSpec::Name(v.to_owned()))
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                m: A,
            ) -> Result<AttestorSpec, A::Error> {
                VerifierSpec::deserialize(serde::de::value::MapAccessDeserializer::new(m))
                    .map(|v| AttestorSpec::Inline(Box::new(v)))
            }
        }
        d.deserialize_any(V)
    }
}

/// One condition as written.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ConditionSpec {
    /// A CEL expression over `predicate`, `signer`, `image`, … that must be true.
    pub expression: Spanned<String>,
    /// What a denial says when it is false.
    #[serde(default)]
    pub message: Option<String>,
}

/// A size in bytes, written as a number or with a binary unit (`512Ki`, `8Mi`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct ByteSize(pub u64);

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = ByteSize;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a size in bytes, or with Ki or Mi (e.g. 8Mi)")
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<ByteSize, E> {
                Ok(ByteSize(v))
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<ByteSize, E> {
                u64::try_from(v)
                    .map(ByteSize)
                    .map_err(|_| E::custom("a size cannot be negative"))
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<ByteSize, E> {
                let t = v.trim();
                let (num, mul) = if let Some(n) = t.strip_suffix("Mi") {
                    (n, 1 << 20)
                } else if let Some(n) = t.strip_suffix("Ki") {
                    (n, 1 << 10)
                } else {
                    (t, 1)
                };
                num.trim()
                    .parse::<u64>()
                    .ok()
                    .and_then(|n| n.checked_mul(mul))
                    .map(ByteSize)
                    .ok_or_else(|| {
                        E::custom(format!("{v:?} is not a size like 8388608, 512Ki or 8Mi"))
                    })
            }
        }
        d.deserialize_any(V)
    }
}

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
    pub conditions: Vec<super::Condition>,
    /// Largest statement read, in bytes.
    pub max_bytes: usize,
}

/// Compiles a rule's `attestations:`; `verify` is the rule's own verifier
/// list (attestors may name its entries). Errors name the line.
pub fn compile(
    rule: &Spanned<String>,
    verify: &[VerifierSpec],
    specs: &[AttestationSpec],
) -> Result<Vec<AttestationRequirement>, PolicyError> {
    let r = &rule.value;
    if specs.len() > MAX_ENTRIES {
        return Err(invalid(
            rule,
            format!("rule {r:?}: at most {MAX_ENTRIES} attestation entries"),
        ));
    }
    let mut out: Vec<AttestationRequirement> = Vec::with_capacity(specs.len());
    for s in specs {
        let name = s.name.value.trim();
        if name.is_empty() {
            return Err(invalid(
                &s.name,
                format!("rule {r:?}: an attestation entry has an empty name"),
            ));
        }
        if out.iter().any(|o| o.name == name) {
            return Err(invalid(
                &s.name,
                format!("rule {r:?}: attestation {name:?} is listed twice"),
            ));
        }
        let at = |m: String| invalid(&s.name, format!("rule {r:?}, attestation {name:?}: {m}"));
        let written = s.predicate_type.value.trim();
        let uri = predicate_type_uri(written);
        if uri == written && !written.contains("://") {
            return Err(invalid(
                &s.predicate_type,
                format!(
                    "rule {r:?}, attestation {name:?}: predicateType {written:?} is neither a URI nor one of cosign's short names ({})",
                    SHORT_NAMES
                        .iter()
                        .map(|(n, _)| *n)
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            ));
        }
        if s.attestors.is_empty() {
            return Err(at(
                "list at least one attestor (who must have signed the attestation)".into(),
            ));
        }
        let mut attestors = Vec::with_capacity(s.attestors.len());
        for a in &s.attestors {
            let v =
                match a {
                    AttestorSpec::Name(n) => verify
                        .iter()
                        .find(|v| v.name == *n)
                        .cloned()
                        .ok_or_else(|| {
                            at(format!(
                                "attestor {n:?} is not one of the rule's verify entries (have: {})",
                                if verify.is_empty() {
                                    "none".to_owned()
                                } else {
                                    verify
                                        .iter()
                                        .map(|v| v.name.as_str())
                                        .collect::<Vec<_>>()
                                        .join(", ")
                                }
                            ))
                        })?,
                    AttestorSpec::Inline(v) => {
                        // The same checks as a verify entry.
                        Verification::compile(r, std::slice::from_ref(v.as_ref()), None, &[], None)
                            .map_err(at)?;
                        v.as_ref().clone()
                    }
                };
            if v.notation.is_some() {
                return Err(at(format!(
                    "attestor {:?} is a notation verifier; attestations are in-toto statements signed with cosign (key or keyless)",
                    v.name
                )));
            }
            if attestors.iter().any(|o: &VerifierSpec| o.name == v.name) {
                return Err(at(format!("attestor {:?} is listed twice", v.name)));
            }
            attestors.push(v);
        }
        if s.conditions.len() > MAX_CONDITIONS {
            return Err(at(format!("at most {MAX_CONDITIONS} conditions")));
        }
        let mut conditions = Vec::with_capacity(s.conditions.len());
        for c in &s.conditions {
            conditions.push(
                super::Condition::compile(&c.expression.value, c.message.clone()).map_err(|e| {
                    invalid(
                        &c.expression,
                        format!("rule {r:?}, attestation {name:?}: {e}"),
                    )
                })?,
            );
        }
        let max_bytes = match &s.max_attestation_size {
            None => DEFAULT_MAX_ATTESTATION_BYTES,
            Some(m) => {
                let n = usize::try_from(m.value.0).unwrap_or(usize::MAX);
                if !(SIZE_BOUNDS.0..=SIZE_BOUNDS.1).contains(&n) {
                    return Err(invalid(
                        m,
                        format!(
                            "rule {r:?}, attestation {name:?}: maxAttestationSize must be between 1Ki and 64Mi"
                        ),
                    ));
                }
                n
            }
        };
        out.push(AttestationRequirement {
            name: name.to_owned(),
            predicate_type: uri.to_owned(),
            attestors,
            conditions,
            max_bytes,
        });
    }
    Ok(out)
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
