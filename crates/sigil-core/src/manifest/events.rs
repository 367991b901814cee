//! The fast path from YAML text to the span tree: built straight from the
//! YAML parser's event stream (granit-parser, the parser serde-saphyr itself
//! runs on), with no serde layer between.
//!
//! Why: building the tree through serde-saphyr's deserializer cost more than
//! the parsing itself (docs/benchmarks.md, `sigil pin`). This builder covers
//! what Kubernetes manifests are made of — block and flow mappings and
//! sequences, plain, quoted and block scalars, comments, `---` separators —
//! and resolves plain scalars the way serde-saphyr does by default (YAML 1.1
//! booleans, null words, decimal integers). For everything else it answers
//! `None` and [`super::serde_tree`] parses the whole stream instead:
//! anchors and aliases, tags, merge keys, duplicate or non-scalar keys, any
//! other number form, a root that is a scalar, limits near serde-saphyr's
//! budget, and every syntax error (so error messages stay serde-saphyr's).
//! Both paths give equal trees wherever this one answers: checked over every
//! manifest in the repository by a unit test and by the `manifest` fuzz
//! target on arbitrary input.

use std::borrow::Cow;

use granit_parser::{Event, Parser, ScalarStyle, Span};
use serde_json::Number;

use super::{Node, Pos, Tree};

/// Larger inputs go to the general path (serde-saphyr caps input at 256 MiB).
const MAX_BYTES: usize = 64 << 20;
/// Deeper nesting goes to the general path (serde-saphyr's budget: 64).
const MAX_DEPTH: usize = 48;
/// More events go to the general path (serde-saphyr's budget: 1,000,000).
const MAX_EVENTS: usize = 500_000;
/// More documents go to the general path (serde-saphyr's budget: 1,024).
const MAX_DOCUMENTS: usize = 1_000;
/// Longer keys go to the general path (YAML's simple-key limit is 1,024).
const MAX_KEY_BYTES: usize = 1_000;

/// A collection being built.
enum Frame {
    Seq(Pos, Vec<Tree>),
    Map(Pos, Vec<(String, Tree)>, Option<String>),
}

/// Every document of `text`, or `None` when the general path must decide.
pub(super) fn parse(text: &str) -> Option<Vec<Tree>> {
    if text.len() > MAX_BYTES {
        return None;
    }
    let mut docs = Vec::new();
    let mut stack: Vec<Frame> = Vec::new();
    // The general path's budget grows with the input (`crate::yaml`); this
    // path's caps follow it, so large inputs stay on the fast path.
    let budget = crate::yaml::budget(text.len());
    // Below the general path's own limits, so this path never accepts what
    // serde-saphyr would refuse (events ≥ nodes; half its event budget).
    let (max_events, max_documents) = (
        MAX_EVENTS.max(budget.max_events / 2),
        MAX_DOCUMENTS.max(budget.max_documents - budget.max_documents / 40),
    );
    // Comments are checked but not emitted, as on the general path
    // (`crate::yaml::options`): capturing them (the `comments` feature
    // another dependency turns on) cost 4 % of `sigil pin --check`'s instructions.
    let mut options = granit_parser::Options::default();
    options.set_emit_comments(false);
    for (n, item) in Parser::new_from_str_with_options(text, options).enumerate() {
        if n > max_events {
            return None;
        }
        let (event, span) = item.ok()?;
        let done = match event {
            Event::StreamStart | Event::DocumentEnd | Event::Comment(..) => None,
            Event::DocumentStart(_, version) => {
                if version.is_some() || docs.len() >= max_documents {
                    return None;
                }
                None
            }
            Event::StreamEnd => break,
            Event::Scalar(value, style, anchor, tag) => {
                if anchor != 0 || tag.is_some() {
                    return None;
                }
                let at = pos(&span)?;
                let key_expected = matches!(stack.last(), Some(Frame::Map(_, _, None)));
                if key_expected {
                    let key = map_key(value, style)?;
                    let Some(Frame::Map(_, entries, slot)) = stack.last_mut() else {
                        return None;
                    };
                    if entries.iter().any(|(k, _)| *k == key) {
                        return None;
                    }
                    *slot = Some(key);
                    None
                } else if stack.is_empty() {
                    // A scalar document: serde-saphyr skips null-like ones.
                    if style == ScalarStyle::Plain && is_null(&value) {
                        None
                    } else {
                        return None;
                    }
                } else {
                    Some(Tree {
                        value: resolve(value, style)?,
                        referenced: at,
                        defined: at,
                    })
                }
            }
            Event::SequenceStart(_, anchor, ref tag) | Event::MappingStart(_, anchor, ref tag) => {
                if anchor != 0 || tag.is_some() || stack.len() >= MAX_DEPTH {
                    return None;
                }
                if matches!(stack.last(), Some(Frame::Map(_, _, None))) {
                    return None; // a collection as a mapping key
                }
                let at = pos(&span)?;
                stack.push(if matches!(event, Event::SequenceStart(..)) {
                    Frame::Seq(at, Vec::new())
                } else {
                    Frame::Map(at, Vec::new(), None)
                });
                None
            }
            Event::SequenceEnd | Event::MappingEnd => {
                let (at, value) = match stack.pop()? {
                    Frame::Seq(at, items) => (at, Node::Seq(items)),
                    Frame::Map(at, entries, None) => (at, Node::Map(entries)),
                    Frame::Map(_, _, Some(_)) => return None,
                };
                Some(Tree {
                    value,
                    referenced: at,
                    defined: at,
                })
            }
            // Anchors, aliases and anything newer: the general path.
            _ => return None,
        };
        if let Some(node) = done {
            match stack.last_mut() {
                None => docs.push(node),
                Some(Frame::Seq(_, items)) => items.push(node),
                Some(Frame::Map(_, entries, slot)) => entries.push((slot.take()?, node)),
            }
        }
    }
    stack.is_empty().then_some(docs)
}

/// serde-saphyr's location of an event, in bytes, 1-based line and column.
fn pos(span: &Span) -> Option<Pos> {
    let start = span.start.byte_offset()?;
    let end = span.end.byte_offset()?;
    Some(Pos {
        start: Some(start),
        len: Some(end.checked_sub(start)?),
        line: span.start.line() as u64,
        column: span.start.col() as u64 + 1,
    })
}

fn is_null(v: &str) -> bool {
    matches!(v, "" | "~" | "null" | "Null" | "NULL")
}

/// A mapping key as serde-saphyr reads it into a string.
fn map_key(value: Cow<'_, str>, style: ScalarStyle) -> Option<String> {
    if value.len() > MAX_KEY_BYTES || (style == ScalarStyle::Plain && value == "<<") {
        return None;
    }
    Some(match resolve(value, style)? {
        Node::Str(s) => s,
        Node::Null => "null".to_owned(),
        Node::Bool(b) => b.to_string(),
        Node::Int(i) => i.to_string(),
        _ => return None,
    })
}

/// A scalar's value as serde-saphyr resolves an untagged scalar by default:
/// quoted and block scalars are strings; plain ones are null, a YAML 1.1
/// boolean, a decimal integer, or a string. Any other form that could be a
/// number (leading digit, sign or dot) is left to the general path.
fn resolve(value: Cow<'_, str>, style: ScalarStyle) -> Option<Node> {
    if style != ScalarStyle::Plain {
        return Some(Node::Str(value.into_owned()));
    }
    let v = value.as_ref();
    if is_null(v) {
        return Some(Node::Null);
    }
    let first = v.as_bytes()[0];
    if first.is_ascii_alphabetic() {
        if let Some(b) = yaml11_bool(v) {
            return Some(Node::Bool(b));
        }
    } else if first.is_ascii_digit() || matches!(first, b'-' | b'+' | b'.') {
        if let Some(n) = decimal(v) {
            return Some(Node::Int(n));
        }
        // `2Gi`, `500m`, `10.0.0.1:5000/app:1`: a byte no YAML number form
        // has makes it a string; anything else could be a float, a hex or
        // octal integer, `.inf`, … and is left to the general path.
        if v.bytes().all(|b| NUMBER_BYTES.contains(&b)) {
            return None;
        }
    }
    Some(Node::Str(value.into_owned()))
}

/// Every byte any YAML 1.1/1.2 number form (ints in any radix, with `_` or
/// sexagesimal `:`, floats, `.inf`, `.nan`) can contain.
const NUMBER_BYTES: &[u8] = b"0123456789abcdefABCDEFxXoObB_+-.:inIN";

fn yaml11_bool(v: &str) -> Option<bool> {
    let is = |w: &str| v.eq_ignore_ascii_case(w);
    if is("true") || is("yes") || is("y") || is("on") {
        Some(true)
    } else if is("false") || is("no") || is("n") || is("off") {
        Some(false)
    } else {
        None
    }
}

/// `0`, or decimal digits without a leading zero, optionally after `-`,
/// within 64 bits; `None` for everything else (left to the general path).
fn decimal(v: &str) -> Option<Number> {
    let (neg, digits) = match v.strip_prefix('-') {
        Some(d) => (true, d),
        None => (false, v),
    };
    let plain = !digits.is_empty()
        && digits.len() <= 20
        && digits.bytes().all(|b| b.is_ascii_digit())
        && (digits == "0" || !digits.starts_with('0'));
    if !plain || (neg && digits == "0") {
        return None;
    }
    if neg {
        v.parse::<i64>().ok().map(Number::from)
    } else {
        digits.parse::<u64>().ok().map(Number::from)
    }
}

#[cfg(test)]
mod tests {
    use super::super::serde_tree;
    use super::*;

    /// Both paths, and whether the fast one answered.
    fn both(
        text: &str,
    ) -> (
        Option<Vec<Tree>>,
        Result<Vec<Tree>, super::super::ManifestError>,
    ) {
        (parse(text), serde_tree::parse(text))
    }

    /// Whether the fast path answered (and agreed); either way, the walker
    /// finds the same over each document's tree as over its JSON.
    #[track_caller]
    fn agree(text: &str) -> bool {
        if let Ok(docs) = super::super::parse_stream(text) {
            for d in &docs {
                assert_eq!(
                    d.root().summarize(),
                    crate::walker::summarize_value(&d.to_value()),
                    "the walker disagrees between tree and JSON on:\n{text}"
                );
            }
        }
        match both(text) {
            (Some(fast), Ok(slow)) => {
                assert_eq!(fast, slow, "the paths disagree on:\n{text}");
                true
            }
            (Some(fast), Err(e)) => {
                panic!("fast path accepted what serde-saphyr refuses ({e}): {fast:?}\n{text}")
            }
            (None, _) => false,
        }
    }

    #[test]
    fn kubernetes_shapes_take_the_fast_path_and_agree() {
        for text in [
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: a\n  labels: {app: a, \"x/y\": 'z'}\nspec:\n  containers:\n  - name: a   # c\n    image: \"nginx:1\"\n    ports: [{containerPort: 8080}]\n    args: [\"--x\", -1, 0, true, On, no, ~, null, '']\n    command:\n      - |\n        echo hi\n      - >-\n        folded\n",
            "---\n# only a comment\n---\na: 1\n---\n",
            "a:\n  - b\n  -\n  - c: ~\n",
            "ünïcødé: \"✓\"\nb: ✓ x\n",
            "a: 18446744073709551615\nb: -9223372036854775808\n",
            "image: 127.0.0.1:5000/app:v1\nmemory: 2Gi\ncpu: 500m\np: 80%\nv: 1.2.3-rc\nf: .gitignore\n",
        ] {
            assert!(agree(text), "took the general path:\n{text}");
        }
    }

    #[test]
    fn what_the_fast_path_leaves_to_serde_saphyr() {
        for text in [
            "a: &x 1\nb: *x\n",
            "a: !!str 1\n",
            "base: &b {x: 1}\nc:\n  <<: *b\n",
            "a: 1\na: 2\n",
            "? [a]\n: 1\n",
            "a: 1.5\n",
            "a: -.inf\n",
            "a: 1:30\n",
            "a: 10.0.0.1\n",
            "a: 0x1F\n",
            "a: 012\n",
            "a: 1_000\n",
            "a: +1\n",
            "a: .inf\n",
            "a: 18446744073709551616\n",
            "just a string\n",
            "%YAML 1.2\n---\na: 1\n",
            "a: [1\n",
            "1: true\n",
        ] {
            assert!(
                !agree(text) || text == "1: true\n",
                "fast path answered:\n{text}"
            );
        }
    }

    /// Every YAML file in the repository parses the same either way.
    #[test]
    fn every_manifest_in_the_repository_agrees() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let mut stack = vec![root.clone()];
        let (mut seen, mut fast) = (0, 0);
        while let Some(dir) = stack.pop() {
            let Ok(entries) = std::fs::read_dir(&dir) else {
                continue;
            };
            for e in entries.flatten() {
                let p = e.path();
                let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
                if p.is_dir() {
                    if !matches!(
                        name,
                        "target" | ".git" | "node_modules" | "corpus" | "artifacts"
                    ) {
                        stack.push(p);
                    }
                } else if (name.ends_with(".yaml") || name.ends_with(".yml"))
                    && let Ok(text) = std::fs::read_to_string(&p)
                {
                    seen += 1;
                    fast += usize::from(agree(&text));
                }
            }
        }
        assert!(
            seen > 20,
            "found only {seen} YAML files under {}",
            root.display()
        );
        assert!(fast * 2 > seen, "only {fast} of {seen} took the fast path");
    }
}
