//! Kubernetes manifests as YAML text: read them, and edit image scalars in place.
//!
//! Owns the byte-exact side of client-side pinning. A multi-document YAML
//! stream is parsed once into a tree whose every node remembers where it came
//! from — straight from the YAML parser's event stream ([`events`]), or,
//! for what that fast path leaves to it (anchors, tags, merge keys, numbers
//! other than plain integers, errors), through serde-saphyr's `Spanned`
//! ([`serde_tree`]), which both agree with; the [`walker`](crate::walker)
//! runs over that tree ([`NodeRef`]), and an image field found there is
//! mapped back to the byte range of its scalar. Edits are splices of those ranges only, so
//! comments, key order, quoting, indentation, anchors, line endings and
//! document separators stay exactly as written everywhere else. It never
//! re-serializes a document and it decides nothing about images.

mod events;
mod serde_tree;
mod view;

use serde_json::{Number, Value};

pub use view::NodeRef;

/// Why a manifest could not be read or edited.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ManifestError {
    /// The text is not YAML (the parser's message names line and column).
    #[error("invalid YAML: {0}")]
    Syntax(String),
    /// The image scalar is written in a form sigil will not rewrite safely.
    #[error(
        "line {line}: the image is a {style} scalar; write it as a plain or quoted scalar so it can be edited in place"
    )]
    UnsupportedScalar {
        /// 1-based line of the scalar.
        line: u64,
        /// e.g. "block (| or >)".
        style: &'static str,
    },
    /// An anchored image scalar is also used where sigil must not change it.
    #[error(
        "line {line}: the image is an anchored scalar that is also used by a field that is not this image; give the image its own scalar"
    )]
    SharedAnchor {
        /// 1-based line of the anchor.
        line: u64,
    },
    /// One anchored scalar is used by two image fields that need different values.
    #[error(
        "line {line}: an anchored image is used in places that need different values ({a:?} and {b:?}); give each its own scalar"
    )]
    ConflictingEdit {
        /// 1-based line of the anchor.
        line: u64,
        /// One wanted value.
        a: String,
        /// The other.
        b: String,
    },
}

/// One YAML node, with the span of every child.
#[derive(Debug, Clone, PartialEq)]
enum Node {
    Null,
    Bool(bool),
    Int(Number),
    Float(f64),
    Str(String),
    Seq(Vec<Tree>),
    Map(Vec<(String, Tree)>),
}

/// Where a node's text is: byte range (when known), 1-based line and column.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Pos {
    start: Option<usize>,
    len: Option<usize>,
    line: u64,
    column: u64,
}

/// A node and where it is used (`referenced`: the alias site for aliases
/// and merge copies) and written (`defined`).
#[derive(Debug, Clone, PartialEq)]
struct Tree {
    value: Node,
    referenced: Pos,
    defined: Pos,
}

/// Where a scalar's source text lies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScalarAt {
    /// Byte range of the scalar as written (quotes included) at its definition.
    pub start: usize,
    /// End of that range (exclusive).
    pub end: usize,
    /// 1-based line where the field uses it (the alias site for aliases).
    pub line: u64,
    /// 1-based column of that use.
    pub column: u64,
    /// Line of the definition (differs from `line` for aliases and merges).
    pub defined_line: u64,
    /// Byte offset of the use site (the alias for aliases).
    pub site: usize,
    /// How many places use the definition (1 unless it is anchored and aliased).
    pub uses: u32,
}

/// One document of a stream.
#[derive(Debug, Clone, PartialEq)]
pub struct Document {
    /// 1-based line of the document's first node.
    pub line: u64,
    root: Tree,
    /// Definition offset → number of alias/merge uses, for shared scalars.
    aliased: std::collections::HashMap<usize, u32>,
}

impl Document {
    /// The document's root node.
    pub fn root(&self) -> NodeRef<'_> {
        NodeRef(&self.root)
    }

    /// The document as JSON (a copy; pinning reads the tree through [`Self::root`]).
    pub fn to_value(&self) -> Value {
        self.root().to_value()
    }

    /// Whether this looks like a Kubernetes object (`apiVersion` and `kind` strings).
    pub fn is_kubernetes_object(&self) -> bool {
        let root = self.root();
        root.get("apiVersion").and_then(NodeRef::as_str).is_some()
            && root.get("kind").and_then(NodeRef::as_str).is_some()
    }

    /// Finds the scalar at `path` (map keys and decimal sequence indexes).
    pub fn scalar<'a>(&self, path: impl IntoIterator<Item = &'a str>) -> Option<ScalarAt> {
        let mut at = &self.root;
        for seg in path {
            at = match &at.value {
                Node::Map(entries) => &entries.iter().rev().find(|(k, _)| k == seg)?.1,
                Node::Seq(items) => items.get(seg.parse::<usize>().ok()?)?,
                _ => return None,
            };
        }
        let start = at.defined.start?;
        let len = at.defined.len?;
        let site = at.referenced.start.unwrap_or(start);
        Some(ScalarAt {
            start,
            end: start + len,
            line: at.referenced.line,
            column: at.referenced.column,
            defined_line: at.defined.line,
            site,
            uses: 1 + self.aliased.get(&start).copied().unwrap_or(0),
        })
    }
}

/// Parses a YAML stream. Empty documents (`---` alone, comments only) are skipped.
pub fn parse_stream(text: &str) -> Result<Vec<Document>, ManifestError> {
    let roots = match events::parse(text) {
        Some(roots) => roots,
        None => serde_tree::parse(text)?,
    };
    Ok(roots.into_iter().map(document).collect())
}

/// Both ways of parsing `text`, for the `manifest` fuzz target's check
/// that they agree: the fast path's documents (`None` where it leaves the
/// input to the general path) and the general path's.
#[doc(hidden)]
pub fn parse_both_paths(
    text: &str,
) -> (Option<Vec<Document>>, Result<Vec<Document>, ManifestError>) {
    let fast = events::parse(text).map(|r| r.into_iter().map(document).collect());
    let slow = serde_tree::parse(text).map(|r| r.into_iter().map(document).collect());
    (fast, slow)
}

fn document(root: Tree) -> Document {
    let mut aliased = std::collections::HashMap::new();
    count_aliases(&root, &mut aliased);
    Document {
        line: root.referenced.line,
        root,
        aliased,
    }
}

/// Counts, per defining offset, the nodes that are aliases (or merge copies) of it.
fn count_aliases(n: &Tree, out: &mut std::collections::HashMap<usize, u32>) {
    if let (Some(d), Some(r)) = (n.defined.start, n.referenced.start)
        && d != r
    {
        *out.entry(d).or_default() += 1;
    }
    match &n.value {
        Node::Seq(items) => items.iter().for_each(|i| count_aliases(i, out)),
        Node::Map(entries) => entries.iter().for_each(|(_, v)| count_aliases(v, out)),
        _ => {}
    }
}

/// One splice: replace `start..end` with `text`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Edit {
    /// Byte range start.
    pub start: usize,
    /// Byte range end (exclusive).
    pub end: usize,
    /// Replacement source text (quoted as the original was).
    pub text: String,
    /// The unquoted new value, for conflict messages.
    pub value: String,
    /// Line of the definition, for messages.
    pub line: u64,
    /// Use site this edit is for.
    pub site: usize,
    /// Places that use the edited definition; all must be edited alike.
    pub uses: u32,
}

/// Builds the splice that turns the scalar at `at` (whose value is `old`)
/// into `new`, keeping its quoting. Refuses forms where the source text is
/// not simply the value (block scalars, escapes, folded lines), because a
/// splice there could change more than the image.
pub fn edit_scalar(text: &str, at: &ScalarAt, old: &str, new: &str) -> Result<Edit, ManifestError> {
    let src = text.get(at.start..at.end).unwrap_or_default();
    let unsupported = |style| ManifestError::UnsupportedScalar {
        line: at.defined_line,
        style,
    };
    // An empty scalar (`image:`, `image: !!str # …`) has no text to replace:
    // inserting a value at its zero-length span could run into a comment.
    if old.is_empty() || src.is_empty() {
        return Err(unsupported("empty"));
    }
    let quoted = if src == old && !old.contains(['\n', '\r']) {
        if !plain_safe(new) {
            return Err(unsupported("plain"));
        }
        new.to_owned()
    } else if src.len() == old.len() + 2
        && src.starts_with('"')
        && src.ends_with('"')
        && &src[1..src.len() - 1] == old
    {
        if new.contains(['"', '\\']) || new.chars().any(char::is_control) {
            return Err(unsupported("double-quoted"));
        }
        format!("\"{new}\"")
    } else if src.len() == old.len() + 2
        && src.starts_with('\'')
        && src.ends_with('\'')
        && &src[1..src.len() - 1] == old
    {
        format!("'{}'", new.replace('\'', "''"))
    } else if !old.is_empty()
        && !old.contains(['\n', '\r'])
        && src
            .strip_prefix(old)
            .is_some_and(|rest| rest.trim().is_empty())
    {
        // A one-line block scalar (`|-`, `>-`): the span runs past the
        // content to the next line's indentation. Replace the content only;
        // an image has no spaces, so folding cannot change it.
        if !plain_safe(new) {
            return Err(unsupported("block"));
        }
        format!("{new}{}", &src[old.len()..])
    } else if src.starts_with('"') {
        return Err(unsupported("double-quoted (with escapes)"));
    } else if src.starts_with('\'') {
        return Err(unsupported("single-quoted (with escapes or line folding)"));
    } else if old.ends_with('\n') || src.contains('\n') {
        return Err(unsupported("block (| or >) or multi-line"));
    } else {
        return Err(unsupported("non-literal"));
    };
    Ok(Edit {
        start: at.start,
        end: at.end,
        text: quoted,
        value: new.to_owned(),
        line: at.defined_line,
        site: at.site,
        uses: at.uses,
    })
}

/// Whether `s` reads back as the same string when written as a plain scalar
/// in block or flow context. Image references always do; anything else is
/// refused rather than risked.
fn plain_safe(s: &str) -> bool {
    !s.is_empty()
        && s.bytes().all(|b| {
            b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-' | b'/' | b':' | b'@' | b'+')
        })
        && !s.starts_with(['-', ':', '@'])
        && !s.contains(": ")
}

/// Applies splices to `text`. Identical edits (one anchor used by several
/// fields) collapse to one; different edits of the same range are an error.
pub fn apply_edits(text: &str, mut edits: Vec<Edit>) -> Result<String, ManifestError> {
    edits.sort_by_key(|e| (e.start, e.end, e.site));
    // Every use of a shared (anchored) scalar must be an image edited alike;
    // otherwise the splice would change a field that is not an image.
    let mut i = 0;
    while i < edits.len() {
        let same = edits[i..]
            .iter()
            .take_while(|e| e.start == edits[i].start && e.end == edits[i].end)
            .count();
        let mut sites: Vec<usize> = edits[i..i + same].iter().map(|e| e.site).collect();
        sites.dedup();
        if (sites.len() as u32) < edits[i].uses {
            return Err(ManifestError::SharedAnchor {
                line: edits[i].line,
            });
        }
        i += same;
    }
    edits.dedup_by(|b, a| a.start == b.start && a.end == b.end && a.text == b.text);
    for w in edits.windows(2) {
        if w[1].start < w[0].end {
            return Err(ManifestError::ConflictingEdit {
                line: w[0].line,
                a: w[0].value.clone(),
                b: w[1].value.clone(),
            });
        }
    }
    let mut out = String::with_capacity(text.len() + edits.len() * 72);
    let mut pos = 0;
    for e in &edits {
        out.push_str(text.get(pos..e.start).unwrap_or_default());
        out.push_str(&e.text);
        pos = e.end;
    }
    out.push_str(text.get(pos..).unwrap_or_default());
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pin_all(text: &str, new: &str) -> Result<String, ManifestError> {
        let docs = parse_stream(text)?;
        let mut edits = Vec::new();
        for d in &docs {
            for f in d.root().summarize().fields {
                let at = d
                    .scalar(f.path.iter().map(String::as_str))
                    .expect("span for every image field");
                edits.push(edit_scalar(text, &at, &f.value, new)?);
            }
        }
        apply_edits(text, edits)
    }

    const NEW: &str =
        "nginx:1@sha256:0000000000000000000000000000000000000000000000000000000000000000";

    /// Regression (fuzz target `manifest`): an empty tagged scalar followed
    /// by a comment (`image: !!str # …`) was "replaced" at its zero-length
    /// span, running the new value into the comment.
    #[test]
    fn empty_scalars_are_refused_not_run_into_comments() {
        let text = "kind: Pod\nspec:\n  containers:\n    - image: !!str # a comment\n";
        assert!(matches!(
            pin_all(text, NEW),
            Err(ManifestError::UnsupportedScalar { .. })
        ));
        // A null image is no image field at all: nothing to edit.
        let text = "kind: Pod\nspec:\n  containers:\n    - image:\n";
        assert_eq!(pin_all(text, NEW).expect("no edits"), text);
    }

    #[test]
    fn only_image_scalars_change_whatever_the_quoting() {
        let text = "# head\r\napiVersion: v1\r\nkind: Pod\r\nspec:\r\n  containers:\r\n  - name: a\r\n    image: \"nginx:1\"  # keep\r\n  - {name: b, image: 'nginx:1'}\r\n  - name: c\r\n    image:   nginx:1\r\n";
        let out = pin_all(text, NEW).expect("edits");
        let want = text
            .replace("\"nginx:1\"", &format!("\"{NEW}\""))
            .replace("'nginx:1'", &format!("'{NEW}'"))
            .replace("  nginx:1\r", &format!("  {NEW}\r"));
        assert_eq!(out, want);
    }

    #[test]
    fn shared_anchor_is_edited_once() {
        let text = "apiVersion: v1\nkind: Pod\nspec:\n  containers:\n  - name: a\n    image: &img nginx:1\n  - name: b\n    image: *img\n";
        let out = pin_all(text, NEW).expect("edits");
        assert_eq!(out, text.replace("&img nginx:1", &format!("&img {NEW}")));
    }

    #[test]
    fn anchor_needing_two_values_is_refused() {
        let text = "apiVersion: v1\nkind: Pod\nspec:\n  containers:\n  - name: a\n    image: &img nginx:1\n  - name: b\n    image: *img\n";
        let docs = parse_stream(text).expect("parse");
        let fields = docs[0].root().summarize().fields;
        let e: Vec<Edit> = fields
            .iter()
            .zip(["x:1", "y:1"])
            .map(|(f, n)| {
                let at = docs[0]
                    .scalar(f.path.iter().map(String::as_str))
                    .expect("span");
                edit_scalar(text, &at, &f.value, n).expect("edit")
            })
            .collect();
        assert!(matches!(
            apply_edits(text, e),
            Err(ManifestError::ConflictingEdit { line: 6, .. })
        ));
    }

    #[test]
    fn anchor_shared_with_a_non_image_field_is_refused() {
        let text = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: &n nginx\nspec:\n  containers:\n  - name: a\n    image: *n\n";
        assert!(matches!(
            pin_all(text, NEW),
            Err(ManifestError::SharedAnchor { line: 4 })
        ));
        let text = "apiVersion: v1\nkind: Pod\nmetadata:\n  labels: {x: *n}\nspec:\n  containers:\n  - name: a\n    image: &n nginx\n";
        // An alias before its anchor is invalid YAML; the other order:
        assert!(parse_stream(text).is_err());
        let text = "apiVersion: v1\nkind: Pod\nspec:\n  containers:\n  - name: a\n    image: &n nginx\n  - name: *n\n    image: busybox\n";
        assert!(matches!(
            pin_all(text, NEW),
            Err(ManifestError::SharedAnchor { line: 6 })
        ));
    }

    #[test]
    fn block_scalar_image_is_refused_not_mangled() {
        let text = "apiVersion: v1\nkind: Pod\nspec:\n  containers:\n  - name: a\n    image: |\n      nginx:1\n";
        let got = pin_all(text, NEW);
        assert!(
            matches!(got, Err(ManifestError::UnsupportedScalar { .. })),
            "{got:?}"
        );
    }

    #[test]
    fn documents_report_their_lines_and_skip_empty_ones() {
        let text = "a: 1\n---\n# only a comment\n---\napiVersion: v1\nkind: Pod\n";
        let docs = parse_stream(text).expect("parse");
        assert_eq!(docs.len(), 2);
        assert!(!docs[0].is_kubernetes_object());
        assert!(docs[1].is_kubernetes_object());
        assert_eq!(docs[1].line, 5);
    }

    #[test]
    fn non_string_keys_and_multibyte_text_keep_byte_offsets_right() {
        let text = "apiVersion: v1\nkind: Pod\nmetadata:\n  annotations: {note: \"ünïcødé ✓\", 1: true}\nspec:\n  containers:\n  - image: nginx:1\n";
        let out = pin_all(text, NEW).expect("edits");
        assert_eq!(
            out,
            text.replace("image: nginx:1", &format!("image: {NEW}"))
        );
    }

    #[test]
    fn syntax_errors_are_errors() {
        assert!(matches!(
            parse_stream("a: [1\n"),
            Err(ManifestError::Syntax(_))
        ));
    }
}

#[cfg(test)]
mod size_tests {
    use super::*;

    /// A real ResourceList of 40,000 Pods once failed at ~14,000 items
    /// ("Nodes 250001"): the budget now grows with the input.
    fn pods(n: usize) -> String {
        let mut text =
            String::from("apiVersion: config.kubernetes.io/v1\nkind: ResourceList\nitems:\n");
        for i in 0..n {
            text.push_str(&format!(
                "  - apiVersion: v1\n    kind: Pod\n    metadata:\n      name: p{i}\n      namespace: shop\n      labels: {{app: web, tier: fe}}\n    spec:\n      containers:\n        - name: app\n          image: registry.example.com/shop/web:1.{i}\n          ports: [{{containerPort: 8080}}]\n"
            ));
        }
        text
    }

    #[test]
    fn a_resource_list_of_40000_pods_parses() {
        let docs = parse_stream(&pods(40_000)).expect("parses");
        assert_eq!(
            docs[0]
                .root()
                .get("items")
                .and_then(NodeRef::items)
                .map(|i| i.len()),
            Some(40_000)
        );
        // The general path (serde-saphyr), past its default 250,000 nodes.
        let (_, slow) = parse_both_paths(&pods(16_000));
        let items = slow.expect("serde-saphyr parses")[0]
            .root()
            .get("items")
            .and_then(NodeRef::items)
            .map(|i| i.len());
        assert_eq!(items, Some(16_000));
    }

    /// The bomb guards stay: exponential aliases and deep nesting are refused.
    #[test]
    fn billion_laughs_and_deep_nesting_are_still_refused() {
        let mut bomb = String::from(
            "a: &a [\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\"]\n",
        );
        let mut prev = 'a';
        for c in 'b'..='j' {
            bomb.push_str(&format!("{c}: &{c} [*{prev},*{prev},*{prev},*{prev},*{prev},*{prev},*{prev},*{prev},*{prev}]\n"));
            prev = c;
        }
        assert!(parse_stream(&bomb).is_err(), "billion laughs parsed");
        let deep = format!("{}1{}", "[".repeat(10_000), "]".repeat(10_000));
        assert!(parse_stream(&deep).is_err(), "deep nesting parsed");
    }
}
