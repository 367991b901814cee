//! Attestations as a policy reads them: in-toto statements (what is claimed
//! about which digest), predicate types with cosign's short names, and the
//! CEL conditions a platform team writes over a verified statement.
//!
//! Owns parsing a statement (v0.1 and v1) and matching its subjects against
//! the digest that runs, compiling a condition once (a bad expression is an
//! error naming it, before anything is evaluated; expressions are bounded in
//! length and in how deeply comprehensions nest, so evaluation cost stays
//! linear in the statement's size), and evaluating conditions over one
//! statement with the variables `predicateType`, `predicate`, `statement`,
//! `subject`, `signer`, `image`, `timestamps` and `now`. A condition that
//! fails at run time (a missing field, a wrong type) is false with the
//! reason — never a panic. It does not verify signatures (sigil-verify) or
//! fetch anything; `signer` is what the verifier read from the certificate.

use std::collections::BTreeMap;
use std::sync::Arc;

use cel::common::ast::{Expr, IdedExpr};

pub mod cost;
pub use cost::{CONDITION_BUDGET, Cost, ENTRY_BUDGET};

/// Longest condition expression accepted, in bytes.
pub const MAX_EXPRESSION_BYTES: usize = 4096;
/// Deepest nesting of comprehensions (`all`, `exists`, `map`, `filter`): one
/// level keeps evaluation linear in the size of the statement.
pub const MAX_COMPREHENSION_DEPTH: usize = 1;
/// Default `maxAttestationSize`: the largest statement read, in bytes.
pub const DEFAULT_MAX_ATTESTATION_BYTES: usize = 8 << 20;

/// cosign's short predicate-type names and the URIs they stand for.
pub const SHORT_NAMES: &[(&str, &str)] = &[
    ("slsaprovenance", "https://slsa.dev/provenance/v0.2"),
    ("slsaprovenance02", "https://slsa.dev/provenance/v0.2"),
    ("slsaprovenance1", "https://slsa.dev/provenance/v1"),
    ("spdx", "https://spdx.dev/Document"),
    ("spdxjson", "https://spdx.dev/Document"),
    ("cyclonedx", "https://cyclonedx.org/bom"),
    ("vuln", "https://cosign.sigstore.dev/attestation/vuln/v1"),
    ("openvex", "https://openvex.dev/ns"),
    ("custom", "https://cosign.sigstore.dev/attestation/v1"),
];

/// The URI a `predicateType` names: a short name's URI, else itself.
pub fn predicate_type_uri(name: &str) -> &str {
    SHORT_NAMES
        .iter()
        .find(|(short, _)| *short == name)
        .map_or(name, |(_, uri)| uri)
}

/// Why a statement or a condition cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AttestError {
    /// The payload is not an in-toto statement.
    #[error("not an in-toto statement: {0}")]
    Statement(String),
    /// The statement is larger than the rule allows.
    #[error("statement is {size} bytes, over the {limit}-byte maxAttestationSize")]
    TooLarge {
        /// Its size.
        size: usize,
        /// The limit.
        limit: usize,
    },
    /// A condition does not compile, or is over the bounds.
    #[error("condition {expression:?}: {reason}")]
    Condition {
        /// The expression as written.
        expression: String,
        /// The compiler's reason, or the bound it breaks.
        reason: String,
    },
}

/// An in-toto statement, parsed.
#[derive(Debug, Clone)]
pub struct Statement {
    /// `predicateType`, as written.
    pub predicate_type: String,
    /// `subject[]`: names and digests (`sha256` → hex, …), in order.
    pub subjects: Vec<(String, BTreeMap<String, String>)>,
    /// The whole statement as CEL reads it (`statement` in a condition):
    /// built straight from the JSON in one pass, shared by every evaluation.
    cel: cel::Value,
    /// The payload's size and its longest list or map: what a condition's
    /// cost bound is taken at.
    bytes: usize,
    elements: usize,
}

impl PartialEq for Statement {
    fn eq(&self, other: &Self) -> bool {
        self.cel == other.cel
    }
}

/// A string field of a CEL map.
fn text<'v>(v: &'v cel::Value, field: &str) -> Option<&'v str> {
    match v {
        cel::Value::Map(m) => match m.get(&cel::objects::KeyRef::String(field)) {
            Some(cel::Value::String(s)) => Some(s.as_str()),
            _ => None,
        },
        _ => None,
    }
}

impl Statement {
    /// The payload's size in bytes.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// The most elements of any list or map in it (as far as it was read).
    pub fn elements(&self) -> usize {
        self.elements
    }

    /// Parses a DSSE payload, refusing one over `limit` bytes.
    pub fn parse(payload: &[u8], limit: usize) -> Result<Statement, AttestError> {
        Statement::parse_with(payload, limit, &Reads::All)
    }

    /// [`Statement::parse`], reading of the predicate only what `conditions`
    /// name (the rest is checked as JSON and skipped): what the webhook
    /// evaluates them on.
    pub fn parse_for(
        payload: &[u8],
        limit: usize,
        conditions: &[Condition],
    ) -> Result<Statement, AttestError> {
        Statement::parse_with(payload, limit, &Reads::of_all(conditions))
    }

    fn parse_with(payload: &[u8], limit: usize, reads: &Reads) -> Result<Statement, AttestError> {
        if payload.len() > limit {
            return Err(AttestError::TooLarge {
                size: payload.len(),
                limit,
            });
        }
        let cel = json::parse(payload, reads).map_err(|e| AttestError::Statement(e.to_string()))?;
        let kind = text(&cel, "_type").unwrap_or_default();
        if !kind.starts_with("https://in-toto.io/Statement/") {
            return Err(AttestError::Statement(format!(
                "_type is {kind:?}, not https://in-toto.io/Statement/v0.1 or v1"
            )));
        }
        let predicate_type = text(&cel, "predicateType")
            .filter(|t| !t.is_empty())
            .ok_or_else(|| AttestError::Statement("no predicateType".into()))?
            .to_owned();
        let cel::Value::Map(top) = &cel else {
            return Err(AttestError::Statement("not an object".into()));
        };
        let Some(cel::Value::List(list)) = top.get(&cel::objects::KeyRef::String("subject")) else {
            return Err(AttestError::Statement("no subject list".into()));
        };
        let subjects = list
            .iter()
            .map(|s| {
                let digests = match s {
                    cel::Value::Map(m) => match m.get(&cel::objects::KeyRef::String("digest")) {
                        Some(cel::Value::Map(d)) => d
                            .map
                            .iter()
                            .filter_map(|(k, v)| match (k, v) {
                                (cel::objects::Key::String(k), cel::Value::String(v)) => {
                                    Some((k.to_string(), v.to_ascii_lowercase()))
                                }
                                _ => None,
                            })
                            .collect(),
                        _ => BTreeMap::new(),
                    },
                    _ => BTreeMap::new(),
                };
                (text(s, "name").unwrap_or_default().to_owned(), digests)
            })
            .collect();
        Ok(Statement {
            predicate_type,
            subjects,
            elements: cost::longest(&cel),
            cel,
            bytes: payload.len(),
        })
    }

    /// Whether a subject names `digest` (`sha256:<hex>`, `sha512:<hex>`).
    pub fn names(&self, digest: &str) -> bool {
        let Some((alg, hex)) = digest.split_once(':') else {
            return false;
        };
        self.subjects
            .iter()
            .any(|(_, d)| d.get(alg).is_some_and(|h| h.eq_ignore_ascii_case(hex)))
    }

    /// A top-level field of the statement, as CEL reads it.
    fn cel_field(&self, name: &str) -> cel::Value {
        match &self.cel {
            cel::Value::Map(m) => m
                .get(&cel::objects::KeyRef::String(name))
                .cloned()
                .unwrap_or(cel::Value::Null),
            _ => cel::Value::Null,
        }
    }

    /// The first subject that names `digest`, as a condition sees it.
    fn subject_value(&self, digest: &str) -> cel::Value {
        let (alg, hex) = digest.split_once(':').unwrap_or_default();
        let hex = hex.to_ascii_lowercase();
        let at = self
            .subjects
            .iter()
            .position(|(_, d)| d.get(alg).is_some_and(|h| *h == hex));
        match (at, self.cel_field("subject")) {
            (Some(i), cel::Value::List(l)) => l.get(i).cloned().unwrap_or(cel::Value::Null),
            _ => cel::Value::Null,
        }
    }
}

/// One condition of an attestation entry, compiled.
#[derive(Clone)]
pub struct Condition {
    /// The CEL expression as written.
    pub expression: String,
    /// What the denial says when it is false (else the expression).
    pub message: Option<String>,
    program: Arc<cel::Program>,
    /// Which parts of the predicate it reads.
    reads: Reads,
    /// What evaluating it may cost ([`cost`]).
    pub cost: Cost,
}

/// Which top-level fields of the predicate conditions read: a statement is
/// parsed into CEL values only as far as that (an SBOM's package list of
/// megabytes is skipped when no condition names it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Reads {
    /// Only `predicate.<field>…` for these fields.
    Fields(std::collections::BTreeSet<String>),
    /// The whole predicate (it is used otherwise, or `statement` is read).
    All,
}

impl Reads {
    fn of(e: &IdedExpr) -> Reads {
        let mut fields = std::collections::BTreeSet::new();
        if collect(e, &mut fields) {
            Reads::All
        } else {
            Reads::Fields(fields)
        }
    }

    fn merge(self, other: &Reads) -> Reads {
        match (self, other) {
            (Reads::Fields(mut a), Reads::Fields(b)) => {
                a.extend(b.iter().cloned());
                Reads::Fields(a)
            }
            _ => Reads::All,
        }
    }

    /// What a set of conditions reads together.
    pub(crate) fn of_all(conditions: &[Condition]) -> Reads {
        conditions
            .iter()
            .fold(Reads::Fields(Default::default()), |r, c| {
                if c.program.references().has_variable("statement") {
                    Reads::All
                } else {
                    r.merge(&c.reads)
                }
            })
    }
}

/// Adds the fields `predicate.<field>` names in `e`; true when `predicate`
/// is used any other way (so all of it is needed).
fn collect(e: &IdedExpr, fields: &mut std::collections::BTreeSet<String>) -> bool {
    let mut all = false;
    let mut go = |x: &IdedExpr| all |= collect(x, fields);
    match &e.expr {
        Expr::Select(s) => match &s.operand.expr {
            Expr::Ident(n) if n == "predicate" => {
                fields.insert(s.field.clone());
            }
            _ => go(&s.operand),
        },
        Expr::Ident(n) => return n == "predicate",
        Expr::Comprehension(c) => {
            for x in [
                &c.iter_range,
                &c.accu_init,
                &c.loop_cond,
                &c.loop_step,
                &c.result,
            ] {
                go(x);
            }
        }
        Expr::Call(c) => {
            c.target.iter().for_each(|t| go(t));
            c.args.iter().for_each(&mut go);
        }
        Expr::List(l) => l.elements.iter().for_each(&mut go),
        Expr::Map(m) => m
            .entries
            .iter()
            .flat_map(|en| cost::entry_exprs(&en.expr))
            .for_each(&mut go),
        Expr::Struct(st) => st
            .entries
            .iter()
            .flat_map(|en| cost::entry_exprs(&en.expr))
            .for_each(&mut go),
        Expr::Literal(_) | Expr::Unspecified => {}
    }
    all
}

impl std::fmt::Debug for Condition {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Condition")
            .field("expression", &self.expression)
            .field("message", &self.message)
            .finish()
    }
}

impl PartialEq for Condition {
    fn eq(&self, other: &Self) -> bool {
        (&self.expression, &self.message) == (&other.expression, &other.message)
    }
}

impl Eq for Condition {}

impl std::hash::Hash for Condition {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        (&self.expression, &self.message).hash(state);
    }
}

impl Condition {
    /// Compiles `expression` (once, when the policy loads).
    pub fn compile(expression: &str, message: Option<String>) -> Result<Condition, AttestError> {
        let refuse = |reason: String| AttestError::Condition {
            expression: expression.to_owned(),
            reason,
        };
        if expression.len() > MAX_EXPRESSION_BYTES {
            return Err(refuse(format!("longer than {MAX_EXPRESSION_BYTES} bytes")));
        }
        let program = cel::Program::compile(expression)
            .map_err(|e| refuse(e.to_string().trim().to_owned()))?;
        let depth = cost::comprehension_depth(program.expression());
        if depth > MAX_COMPREHENSION_DEPTH {
            return Err(refuse(format!(
                "comprehensions (all, exists, map, filter) nest {depth} deep; at most {MAX_COMPREHENSION_DEPTH} is allowed, so evaluation stays linear in the statement's size"
            )));
        }
        let cost = cost::estimate(program.expression()).map_err(refuse)?;
        let reads = Reads::of(program.expression());
        Ok(Condition {
            expression: expression.to_owned(),
            message: message.filter(|m| !m.is_empty()),
            program: Arc::new(program),
            reads,
            cost,
        })
    }
}

/// What one verified attestation offers the conditions.
#[derive(Debug, Clone)]
pub struct Evidence<'a> {
    /// The statement.
    pub statement: &'a Statement,
    /// The digest it was checked against (`sha256:…`).
    pub digest: &'a str,
    /// Who signed, as the certificate (or the key) says: `verifier`,
    /// `subject`, `issuer` and every Fulcio extension present, by name.
    pub signer: &'a BTreeMap<String, String>,
    /// The image (`reference`, `repository`, `digest`), when it is one.
    pub image: Option<&'a BTreeMap<String, String>>,
    /// The verified signing times (Unix seconds).
    pub timestamps: &'a [i64],
}

/// One condition's result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConditionResult {
    /// The expression.
    pub expression: String,
    /// Its message, if it has one.
    pub message: Option<String>,
    /// `Ok(true)` holds, `Ok(false)` does not, `Err` could not be evaluated
    /// (counts as false; the reason is shown).
    pub outcome: Result<bool, String>,
    /// When it is false: the value the failing comparison read (a field of
    /// the predicate, the signer, …), shown so a denial says what was there.
    pub saw: Option<String>,
}

impl ConditionResult {
    /// Whether it holds.
    pub fn holds(&self) -> bool {
        self.outcome == Ok(true)
    }

    /// How a denial names it: its message or expression, and why it failed.
    pub fn describe(&self) -> String {
        let what = self.message.as_deref().unwrap_or(&self.expression);
        match (&self.outcome, &self.saw) {
            (Ok(true), _) => format!("{what}: holds"),
            (Ok(false), Some(saw)) => format!("{what}: false (it read {saw})"),
            (Ok(false), None) => format!("{what}: false"),
            (Err(e), _) => format!("{what}: cannot be evaluated ({e})"),
        }
    }
}

/// The standard CEL environment, built once (building it costs ~60 µs;
/// each evaluation adds its variables in a scope of its own).
fn root() -> &'static cel::Context<'static, 'static> {
    static ROOT: std::sync::OnceLock<cel::Context<'static, 'static>> = std::sync::OnceLock::new();
    ROOT.get_or_init(cel::Context::default)
}

fn timestamp(secs: i64) -> cel::Value {
    chrono::DateTime::from_timestamp(secs, 0)
        .map(|t| cel::Value::Timestamp(t.fixed_offset()))
        .unwrap_or(cel::Value::Null)
}

/// Evaluates `conditions` over one attestation at `now` (Unix seconds),
/// every one of them (a report lists each), in order.
pub fn evaluate(conditions: &[Condition], ev: &Evidence<'_>, now: i64) -> Vec<ConditionResult> {
    if conditions.is_empty() {
        return Vec::new();
    }
    let s = ev.statement;
    let mut ctx = root().new_inner_scope();
    // Binding a variable copies it into the interpreter's own form, so only
    // what some condition reads is bound.
    let uses = |v: &str| {
        conditions
            .iter()
            .any(|c| c.program.references().has_variable(v))
    };
    if uses("predicate") {
        ctx.add_variable_from_value("predicate", s.cel_field("predicate"));
    }
    if uses("statement") {
        ctx.add_variable_from_value("statement", s.cel.clone());
    }
    if uses("subject") {
        ctx.add_variable_from_value("subject", s.subject_value(ev.digest));
    }
    ctx.add_variable_from_value("predicateType", s.predicate_type.as_str());
    let mut broken = Vec::new();
    if uses("signer")
        && let Err(e) = ctx.add_variable("signer", ev.signer)
    {
        broken.push(format!("signer: {e}"));
    }
    if uses("image")
        && let Err(e) = ctx.add_variable("image", ev.image.cloned().unwrap_or_default())
    {
        broken.push(format!("image: {e}"));
    }
    ctx.add_variable_from_value("now", timestamp(now));
    if uses("timestamps") {
        ctx.add_variable_from_value(
            "timestamps",
            cel::Value::List(Arc::new(
                ev.timestamps.iter().map(|t| timestamp(*t)).collect(),
            )),
        );
    }
    // Each condition's bound at this statement's real size, and what all of
    // them may spend together: what does not fit is not evaluated.
    let mut spent: u64 = 0;
    conditions
        .iter()
        .map(|c| {
            let bound = c.cost.at(s.bytes, s.elements);
            spent = spent.saturating_add(bound);
            let over = if bound > CONDITION_BUDGET {
                Some(format!(
                    "not evaluated: on this {}-byte statement it may cost {bound} evaluation steps, over the budget of {CONDITION_BUDGET} per condition",
                    s.bytes
                ))
            } else if spent > ENTRY_BUDGET {
                Some(format!(
                    "not evaluated: with the conditions before it, on this {}-byte statement, it may cost {spent} evaluation steps, over the budget of {ENTRY_BUDGET} per attestation",
                    s.bytes
                ))
            } else {
                None
            };
            let outcome = if let Some(over) = over {
                Err(over)
            } else if broken.is_empty() {
                match c.program.execute(&ctx) {
                    Ok(cel::Value::Bool(b)) => Ok(b),
                    Ok(other) => Err(format!("evaluates to {}, not a bool", show(&other))),
                    Err(e) => Err(e.to_string()),
                }
            } else {
                Err(format!(
                    "the statement cannot be read: {}",
                    broken.join("; ")
                ))
            };
            let saw = (outcome == Ok(false))
                .then(|| observed(c.program.expression(), &ctx))
                .flatten();
            ConditionResult {
                expression: c.expression.clone(),
                message: c.message.clone(),
                outcome,
                saw,
            }
        })
        .collect()
}

/// The value a false condition read: the non-literal side of its failing
/// comparison (descending into the false side of `&&`), or the receiver
/// of a failing method call (`x.startsWith(…)`). `None` when there is no
/// such side or it cannot be evaluated.
fn observed(e: &IdedExpr, ctx: &cel::Context<'_, '_>) -> Option<String> {
    use cel::common::ast::operators as op;
    let Expr::Call(c) = &e.expr else {
        return None;
    };
    let side = |args: &[&IdedExpr]| -> Option<String> {
        let read = args
            .iter()
            .find(|a| !matches!(a.expr, Expr::Literal(_) | Expr::List(_)))?;
        ctx.resolve(read).ok().map(|v| show(&v))
    };
    match c.func_name.as_str() {
        op::LOGICAL_AND => c
            .args
            .iter()
            .find(|a| matches!(ctx.resolve(a), Ok(cel::Value::Bool(false))))
            .and_then(|a| observed(a, ctx)),
        op::EQUALS
        | op::NOT_EQUALS
        | op::LESS
        | op::LESS_EQUALS
        | op::GREATER
        | op::GREATER_EQUALS
        | op::IN => side(&c.args.iter().collect::<Vec<_>>()),
        _ => match &c.target {
            Some(t) => side(&[t.as_ref()]),
            None => None,
        },
    }
}

/// A value as a denial shows it: JSON-like, at most 120 characters.
fn show(v: &cel::Value) -> String {
    let full = match v {
        cel::Value::String(s) => format!("{:?}", s.as_str()),
        cel::Value::Int(i) => i.to_string(),
        cel::Value::UInt(u) => u.to_string(),
        cel::Value::Float(f) => f.to_string(),
        cel::Value::Bool(b) => b.to_string(),
        cel::Value::Null => "null".to_owned(),
        cel::Value::Timestamp(t) => t.to_rfc3339(),
        cel::Value::Duration(d) => format!("{}s", d.num_seconds()),
        cel::Value::List(l) => format!(
            "[{}]",
            l.iter().take(8).map(show).collect::<Vec<_>>().join(", ")
        ),
        cel::Value::Map(m) => format!("a map of {} entries", m.map.len()),
        other => format!("{other:?}"),
    };
    crate::text::truncate_chars(&full, 120)
}

mod json;

#[cfg(test)]
mod tests;
