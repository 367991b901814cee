//! A rule's `verify` and `attestations` compiled into one requirement
//! ([`Verification`]): attestation entries checked (predicate types,
//! attestors resolved to verifiers, conditions compiled once with their
//! line, size limits). Shared by cluster and team policies.

use std::sync::Arc;

use serde_saphyr::Spanned;

use super::schema::{AttestationSpec, AttestorSpec, RuleSpec};
use super::{PolicyError, invalid};
use crate::attest::{Condition, DEFAULT_MAX_ATTESTATION_BYTES, SHORT_NAMES, predicate_type_uri};
use crate::verify::attestations::AttestationRequirement;
use crate::verify::{Verification, VerifierSpec};

/// Smallest and largest `maxAttestationSize` accepted.
const SIZE_BOUNDS: (usize, usize) = (1 << 10, 64 << 20);
/// At most this many entries per rule, and conditions per entry.
const MAX_ENTRIES: usize = 16;
const MAX_CONDITIONS: usize = 32;

/// A rule's `verify` and `attestations` compiled into one requirement
/// (`None` when it has neither).
pub(super) fn verification(r: &RuleSpec) -> Result<Option<Arc<Verification>>, PolicyError> {
    if r.verify.is_empty() && r.attestations.is_empty() {
        return Ok(None);
    }
    let v = Verification::compile(
        &r.name.value,
        &r.verify,
        r.threshold,
        &r.required,
        r.signatures.as_ref(),
    )
    .map_err(|m| invalid(&r.name, m))?;
    let attestations = compile(&r.name, &r.verify, &r.attestations)?;
    Ok(Some(Arc::new(v.with_attestations(attestations))))
}

/// Compiles a rule's `attestations:`; `verify` is the rule's own verifier
/// list (attestors may name its entries). Errors name the line.
fn compile(
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
                Condition::compile(&c.expression.value, c.message.clone()).map_err(|e| {
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
        // What cannot fit the budget on the largest statement the entry
        // accepts is refused now (as Kubernetes refuses a CRD rule whose
        // estimated cost exceeds its budget), naming the field to lower.
        let mut total: u64 = 0;
        for (c, spec) in conditions.iter().zip(&s.conditions) {
            let bound = c.cost.at_most(max_bytes);
            total = total.saturating_add(bound);
            let too_much = if bound > crate::attest::CONDITION_BUDGET {
                Some(format!(
                    "may cost {bound} evaluation steps on a statement of maxAttestationSize ({max_bytes} bytes), over the budget of {} per condition",
                    crate::attest::CONDITION_BUDGET
                ))
            } else if total > crate::attest::ENTRY_BUDGET {
                Some(format!(
                    "with the conditions before it may cost {total} evaluation steps on a statement of maxAttestationSize ({max_bytes} bytes), over the budget of {} per attestation",
                    crate::attest::ENTRY_BUDGET
                ))
            } else {
                None
            };
            if let Some(why) = too_much {
                return Err(invalid(
                    &spec.expression,
                    format!(
                        "rule {r:?}, attestation {name:?}: condition {:?} {why}; lower maxAttestationSize for this attestation, or simplify the condition",
                        spec.expression.value
                    ),
                ));
            }
        }
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
