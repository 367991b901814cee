//! What a condition may cost: a bound, known when the policy loads, on the
//! work evaluating it can take over a statement of a given size — the role
//! Kubernetes' CEL cost estimator plays for CRD validation rules and
//! admission policies.
//!
//! Owns the estimate and the budgets. A condition's cost is written
//! `fixed + per_element × N + per_byte × B / 32`: every node of the
//! expression outside a loop is evaluated once; every node inside a
//! comprehension's loop once per element, and no list or map holds more
//! than N elements; an operation whose cost grows with its operands (`in`,
//! `contains`, `+`, `==`, `matches`, `size`, …) works through up to B, the
//! statement's bytes, when it reads data from outside the loop (scanning a
//! byte is some thirty times cheaper than evaluating a node, hence B / 32). Inside a loop such an operation would
//! make the cost quadratic (`predicate.a.all(x, x in predicate.a)`: seconds
//! at 85 KB), so it is refused when compiled, like a nested comprehension;
//! over the loop's own element it is not (the elements add up to at most
//! B). The estimate is checked against the budget twice: at load, on the
//! largest statement the entry accepts (B its `maxAttestationSize`, N half
//! of that: a JSON element takes at least two bytes) — what cannot fit is
//! refused, naming the field to lower, as Kubernetes refuses a CRD rule
//! whose estimated cost is over its budget; and before each evaluation, on
//! the statement at hand (its bytes and its longest list) — what does not
//! fit is not evaluated and fails, saying so. It does not evaluate anything.

use cel::common::ast::operators as op;
use cel::common::ast::{EntryExpr, Expr, IdedExpr};

/// The most one condition may cost, in node evaluations (a node is a
/// literal, a variable, a field selection or a function call): one to three
/// seconds of the interpreter's work at worst on a two-core machine
/// (docs/benchmarks.md), run off the async workers and cached per digest. On an 8 MiB statement (the default
/// `maxAttestationSize`) it leaves a loop body of up to 5 nodes; a 4 MiB
/// one, 11.
pub const CONDITION_BUDGET: u64 = 25_000_000;
/// The most all conditions of one attestation entry may cost together, per
/// statement evaluated.
pub const ENTRY_BUDGET: u64 = 2 * CONDITION_BUDGET;

/// Bytes an operation scans for the cost of evaluating one node.
const BYTES_PER_STEP: u64 = 32;

/// `fixed + per_element × N + per_byte × B / 32` node evaluations at most, for
/// a statement of `B` bytes whose longest list (or map) has `N` elements.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Cost {
    /// Nodes evaluated once.
    pub fixed: u64,
    /// Nodes evaluated once per element of the list a loop ranges over.
    pub per_element: u64,
    /// Operations whose work grows with the statement's bytes.
    pub per_byte: u64,
}

impl Cost {
    /// The bound for a statement of `bytes` bytes whose longest list or map
    /// has `elements` elements.
    pub fn at(&self, bytes: usize, elements: usize) -> u64 {
        self.fixed
            .saturating_add(self.per_element.saturating_mul(elements as u64))
            .saturating_add(self.per_byte.saturating_mul(bytes as u64 / BYTES_PER_STEP))
    }

    /// The bound for the largest statement of `max_bytes` bytes (a JSON
    /// element takes at least two bytes: the value and a comma).
    pub fn at_most(&self, max_bytes: usize) -> u64 {
        self.at(max_bytes, max_bytes / 2)
    }

    fn add(&mut self, other: Cost) {
        self.fixed = self.fixed.saturating_add(other.fixed);
        self.per_element = self.per_element.saturating_add(other.per_element);
        self.per_byte = self.per_byte.saturating_add(other.per_byte);
    }
}

/// Calls whose cost does not grow with their operands' size: logic, a
/// conditional, negation, indexing, `has()`. Every other function (the
/// comparisons, `in`, `+`, `contains`, `matches`, `size`, conversions, …)
/// may cost as much as its operands are long.
const CONSTANT: &[&str] = &[
    op::LOGICAL_AND,
    op::LOGICAL_OR,
    op::LOGICAL_NOT,
    op::CONDITIONAL,
    op::NOT_STRICTLY_FALSE,
    op::NEGATE,
    op::INDEX,
    op::OPT_INDEX,
    op::OPT_SELECT,
    op::HAS,
];

/// The estimate of `e`, or why it cannot be bounded linearly.
pub fn estimate(e: &IdedExpr) -> Result<Cost, String> {
    let mut locals = Vec::new();
    let mut cost = Cost::default();
    walk(e, &mut locals, false, &mut cost)?;
    Ok(cost)
}

/// Whether `e` reads a variable that is not one of `locals` (data from
/// outside the loop: the statement, the signer, the image, …).
fn reads_outside(e: &IdedExpr, locals: &[String]) -> bool {
    match &e.expr {
        Expr::Ident(name) => !locals.iter().any(|l| l == name),
        Expr::Literal(_) | Expr::Unspecified => false,
        Expr::Select(s) => reads_outside(&s.operand, locals),
        Expr::Call(c) => c
            .target
            .iter()
            .map(|t| t.as_ref())
            .chain(&c.args)
            .any(|a| reads_outside(a, locals)),
        Expr::List(l) => l.elements.iter().any(|x| reads_outside(x, locals)),
        Expr::Map(m) => m.entries.iter().any(|en| entry_reads(&en.expr, locals)),
        Expr::Struct(s) => s.entries.iter().any(|en| entry_reads(&en.expr, locals)),
        // A comprehension inside a loop is refused on its own.
        Expr::Comprehension(_) => true,
    }
}

fn entry_reads(e: &cel::common::ast::EntryExpr, locals: &[String]) -> bool {
    entry_exprs(e).into_iter().any(|x| reads_outside(x, locals))
}

fn walk(
    e: &IdedExpr,
    locals: &mut Vec<String>,
    in_loop: bool,
    cost: &mut Cost,
) -> Result<(), String> {
    let one = if in_loop {
        Cost {
            per_element: 1,
            ..Cost::default()
        }
    } else {
        Cost {
            fixed: 1,
            ..Cost::default()
        }
    };
    cost.add(one);
    match &e.expr {
        Expr::Ident(_) | Expr::Literal(_) | Expr::Unspecified => Ok(()),
        Expr::Select(s) => walk(&s.operand, locals, in_loop, cost),
        Expr::List(l) => l
            .elements
            .iter()
            .try_for_each(|x| walk(x, locals, in_loop, cost)),
        Expr::Map(m) => m
            .entries
            .iter()
            .flat_map(|en| entry_exprs(&en.expr))
            .try_for_each(|x| walk(x, locals, in_loop, cost)),
        Expr::Struct(s) => s
            .entries
            .iter()
            .flat_map(|en| entry_exprs(&en.expr))
            .try_for_each(|x| walk(x, locals, in_loop, cost)),
        Expr::Call(c) => {
            let operands: Vec<&IdedExpr> =
                c.target.iter().map(|t| t.as_ref()).chain(&c.args).collect();
            let grows = !CONSTANT.contains(&c.func_name.as_str());
            // The macros' own `@result + [x]` (map, filter) and `@result + 1`
            // (exists_one) only read the loop's locals.
            if grows && operands.iter().any(|o| reads_outside(o, locals)) {
                if in_loop {
                    return Err(format!(
                        "{} over data from outside the loop, inside a comprehension, makes evaluation quadratic in the statement's size; compute it once outside the loop (for example `x in list.map(m, m.field)` instead of `list.exists(m, m.field == x)`)",
                        shown(&c.func_name)
                    ));
                }
                cost.add(Cost {
                    per_byte: 1,
                    ..Cost::default()
                });
            }
            operands
                .into_iter()
                .try_for_each(|o| walk(o, locals, in_loop, cost))
        }
        Expr::Comprehension(c) => {
            if in_loop {
                return Err("a comprehension inside a comprehension makes evaluation quadratic in the statement's size".into());
            }
            walk(&c.iter_range, locals, false, cost)?;
            walk(&c.accu_init, locals, false, cost)?;
            let outer = locals.len();
            locals.push(c.iter_var.clone());
            locals.extend(c.iter_var2.iter().cloned());
            locals.push(c.accu_var.clone());
            let body = walk(&c.loop_cond, locals, true, cost)
                .and_then(|()| walk(&c.loop_step, locals, true, cost))
                .and_then(|()| walk(&c.result, locals, false, cost));
            locals.truncate(outer);
            body
        }
    }
}

/// An operator as people write it (`in`, `+`), a function by its name.
fn shown(func: &str) -> String {
    let bare = func.trim_start_matches('@');
    match bare.strip_prefix('_').and_then(|b| b.strip_suffix('_')) {
        Some(infix) => format!("`{infix}`"),
        None => format!("`{bare}`"),
    }
}

/// How deeply comprehensions nest in `e`.
pub(crate) fn comprehension_depth(e: &IdedExpr) -> usize {
    let max =
        |it: &mut dyn Iterator<Item = &IdedExpr>| it.map(comprehension_depth).max().unwrap_or(0);
    match &e.expr {
        Expr::Comprehension(c) => {
            let inner = max(&mut [&c.loop_cond, &c.loop_step, &c.result].into_iter());
            let outside = max(&mut [&c.iter_range, &c.accu_init].into_iter());
            (1 + inner).max(outside)
        }
        Expr::Call(c) => max(&mut c.target.iter().map(|t| t.as_ref()).chain(c.args.iter())),
        Expr::List(l) => max(&mut l.elements.iter()),
        Expr::Select(s) => comprehension_depth(&s.operand),
        Expr::Map(m) => max(&mut m.entries.iter().flat_map(|en| entry_exprs(&en.expr))),
        Expr::Struct(s) => max(&mut s.entries.iter().flat_map(|en| entry_exprs(&en.expr))),
        Expr::Ident(_) | Expr::Literal(_) | Expr::Unspecified => 0,
    }
}

pub(crate) fn entry_exprs(e: &EntryExpr) -> Vec<&IdedExpr> {
    match e {
        EntryExpr::StructField(f) => vec![&f.value],
        EntryExpr::MapEntry(m) => vec![&m.key, &m.value],
    }
}

/// The most elements of any list or map in `v`.
pub(crate) fn longest(v: &cel::Value) -> usize {
    match v {
        cel::Value::List(l) => l.iter().map(longest).fold(l.len(), usize::max),
        cel::Value::Map(m) => m.map.values().map(longest).fold(m.map.len(), usize::max),
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cost(e: &str) -> Result<Cost, String> {
        estimate(cel::Program::compile(e).unwrap().expression())
    }

    #[test]
    fn a_loop_costs_its_body_per_byte_and_the_rest_once() {
        let c = cost("predicate.a.all(x, x == 1)").unwrap();
        assert!(c.per_element > 0 && c.per_element < 10, "{c:?}");
        assert_eq!(c.per_byte, 0, "{c:?}");
        let flat = cost("predicate.a == 1 && signer.subject != ''").unwrap();
        // `==` over the statement's data grows with it; over a literal too.
        assert_eq!(flat.per_byte, 2, "{flat:?}");
        assert_eq!(cost("true && !false").unwrap().per_byte, 0);
    }

    /// Found by the boundaries review: a team's condition quadratic in the
    /// signer's data (2 s at 85 KB, 26 s at 373 KB) stalled every
    /// namespace's admissions. Each shape is refused when compiled.
    #[test]
    fn work_over_outside_data_inside_a_loop_is_refused_as_quadratic() {
        for e in [
            "predicate.a.all(x, x in predicate.a)",
            "predicate.a.exists(x, predicate.b.contains(x))",
            "predicate.a.map(x, predicate.a + [x]).size() > 0",
            "predicate.a.all(x, predicate.a == predicate.a)",
            "predicate.a.all(x, x.matches(predicate.re))",
            "predicate.a.all(x, size(predicate.s) > 0)",
        ] {
            let why = cost(e).unwrap_err();
            assert!(why.contains("quadratic"), "{e}: {why}");
        }
        // Over the loop's own element, or literals: linear, accepted.
        for e in [
            "predicate.a.all(x, x in ['a', 'b'])",
            "predicate.a.exists(m, m.uri.startsWith('git+') && m.digest.sha256 != '')",
            "predicate.a.map(m, m.uri).size() > 0",
            "predicate.a.filter(m, m.k == 'v').size() == 1",
            "predicate.a.exists_one(m, m.k == 'v')",
            "'x' in predicate.a.map(m, m.uri)",
        ] {
            assert!(cost(e).is_ok(), "{e}: {:?}", cost(e));
        }
    }
}
