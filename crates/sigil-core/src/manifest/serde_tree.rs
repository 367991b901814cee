//! The general path from YAML text to the span tree: serde-saphyr's
//! deserializer with `Spanned` nodes. It handles everything YAML allows
//! (anchors, aliases, merge keys, tags, every scalar form) and produces the
//! error messages users see; [`super::events`] handles the common subset
//! faster and leaves the rest here, and the two must agree on every input
//! both accept (a unit test here and the `manifest` fuzz target check it).

use std::fmt;

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::Number;
use serde_saphyr::{Location, Spanned};

use super::{ManifestError, Node, Pos, Tree};

/// Parses every document of `text` (empty and null documents skipped).
pub(super) fn parse(text: &str) -> Result<Vec<Tree>, ManifestError> {
    let roots: Vec<Spanned<SNode>> =
        serde_saphyr::from_multiple_with_options(text, crate::yaml::options(text))
            .map_err(|e| ManifestError::Syntax(e.to_string()))?;
    Ok(roots.into_iter().map(tree).collect())
}

fn pos(l: &Location) -> Pos {
    let span = l.span();
    Pos {
        start: span.byte_offset().and_then(|o| usize::try_from(o).ok()),
        len: span.byte_len().and_then(|o| usize::try_from(o).ok()),
        line: l.line(),
        column: l.column(),
    }
}

fn tree(n: Spanned<SNode>) -> Tree {
    let value = match n.value {
        SNode::Null => Node::Null,
        SNode::Bool(b) => Node::Bool(b),
        SNode::Int(i) => Node::Int(i),
        SNode::Float(f) => Node::Float(f),
        SNode::Str(s) => Node::Str(s),
        SNode::Seq(items) => Node::Seq(items.into_iter().map(tree).collect()),
        SNode::Map(entries) => Node::Map(entries.into_iter().map(|(k, v)| (k, tree(v))).collect()),
    };
    Tree {
        value,
        referenced: pos(&n.referenced),
        defined: pos(&n.defined),
    }
}

/// A YAML node as serde-saphyr hands it over, children with their spans.
#[derive(Debug)]
enum SNode {
    Null,
    Bool(bool),
    Int(Number),
    Float(f64),
    Str(String),
    Seq(Vec<Spanned<SNode>>),
    Map(Vec<(String, Spanned<SNode>)>),
}

impl<'de> Deserialize<'de> for SNode {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<SNode, D::Error> {
        d.deserialize_any(NodeVisitor)
    }
}

struct NodeVisitor;

impl<'de> Visitor<'de> for NodeVisitor {
    type Value = SNode;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any YAML value")
    }
    fn visit_unit<E>(self) -> Result<SNode, E> {
        Ok(SNode::Null)
    }
    fn visit_none<E>(self) -> Result<SNode, E> {
        Ok(SNode::Null)
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<SNode, D::Error> {
        SNode::deserialize(d)
    }
    fn visit_bool<E>(self, v: bool) -> Result<SNode, E> {
        Ok(SNode::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<SNode, E> {
        Ok(SNode::Int(v.into()))
    }
    fn visit_u64<E>(self, v: u64) -> Result<SNode, E> {
        Ok(SNode::Int(v.into()))
    }
    fn visit_i128<E: de::Error>(self, v: i128) -> Result<SNode, E> {
        Ok(SNode::Str(v.to_string()))
    }
    fn visit_u128<E: de::Error>(self, v: u128) -> Result<SNode, E> {
        Ok(SNode::Str(v.to_string()))
    }
    fn visit_f64<E>(self, v: f64) -> Result<SNode, E> {
        Ok(SNode::Float(v))
    }
    fn visit_str<E>(self, v: &str) -> Result<SNode, E> {
        Ok(SNode::Str(v.to_owned()))
    }
    fn visit_string<E>(self, v: String) -> Result<SNode, E> {
        Ok(SNode::Str(v))
    }
    fn visit_bytes<E>(self, v: &[u8]) -> Result<SNode, E> {
        Ok(SNode::Str(String::from_utf8_lossy(v).into_owned()))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut a: A) -> Result<SNode, A::Error> {
        let mut items = Vec::with_capacity(a.size_hint().unwrap_or(0).min(1024));
        while let Some(x) = a.next_element()? {
            items.push(x);
        }
        Ok(SNode::Seq(items))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut a: A) -> Result<SNode, A::Error> {
        let mut entries = Vec::with_capacity(a.size_hint().unwrap_or(0).min(1024));
        while let Some((k, v)) = a.next_entry::<Key, Spanned<SNode>>()? {
            entries.push((k.0, v));
        }
        Ok(SNode::Map(entries))
    }
}

/// A map key: any scalar, as its text (JSON keys are strings).
struct Key(String);

impl<'de> Deserialize<'de> for Key {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Key, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Key;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a scalar map key")
            }
            fn visit_str<E>(self, v: &str) -> Result<Key, E> {
                Ok(Key(v.to_owned()))
            }
            fn visit_string<E>(self, v: String) -> Result<Key, E> {
                Ok(Key(v))
            }
            fn visit_bool<E>(self, v: bool) -> Result<Key, E> {
                Ok(Key(v.to_string()))
            }
            fn visit_i64<E>(self, v: i64) -> Result<Key, E> {
                Ok(Key(v.to_string()))
            }
            fn visit_u64<E>(self, v: u64) -> Result<Key, E> {
                Ok(Key(v.to_string()))
            }
            fn visit_f64<E>(self, v: f64) -> Result<Key, E> {
                Ok(Key(v.to_string()))
            }
            fn visit_unit<E>(self) -> Result<Key, E> {
                Ok(Key("null".to_owned()))
            }
            fn visit_none<E>(self) -> Result<Key, E> {
                Ok(Key("null".to_owned()))
            }
        }
        d.deserialize_any(V)
    }
}
