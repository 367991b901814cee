//! A read-only view of one node of a parsed manifest ([`NodeRef`]): what
//! pinning reads of an object (`kind`, `apiVersion`, a List's `items`) and
//! the [`walker`](crate::walker) run over the span tree itself, through
//! serde, so no JSON `Value` is built for a manifest — building one was
//! about 15 % of `sigil pin --check`'s instructions (docs/benchmarks.md).
//! It owns that serde `Deserializer`; it does not parse text or edit it
//! ([`super`] does), and converts to JSON only when asked ([`NodeRef::to_value`],
//! for callers that need a tree, such as KRM's `functionConfig`).

use serde::de::value::BorrowedStrDeserializer;
use serde::de::{self, DeserializeSeed, Visitor};
use serde_json::{Map, Number, Value};

use super::{Node, Tree};
use crate::walker::{self, ObjectSummary};

/// One node of a parsed document.
///
/// Map lookups take the last entry with the key, as a JSON map built from
/// the same entries would keep. Duplicate keys do not reach the walker:
/// serde-saphyr refuses them (its default `DuplicateKeyPolicy::Error`) and
/// the fast path hands every duplicate to it; keys that are equal only once
/// made strings (`1` and `"1"`) are never keys the walker follows.
#[derive(Debug, Clone, Copy)]
pub struct NodeRef<'a>(pub(super) &'a Tree);

impl<'a> NodeRef<'a> {
    /// The value of `key`, when this is a map that has it.
    pub fn get(self, key: &str) -> Option<NodeRef<'a>> {
        match &self.0.value {
            Node::Map(entries) => entries
                .iter()
                .rev()
                .find(|(k, _)| k == key)
                .map(|(_, v)| NodeRef(v)),
            _ => None,
        }
    }

    /// The string, when this is one.
    pub fn as_str(self) -> Option<&'a str> {
        match &self.0.value {
            Node::Str(s) => Some(s),
            _ => None,
        }
    }

    /// The items, when this is a sequence.
    pub fn items(self) -> Option<impl ExactSizeIterator<Item = NodeRef<'a>>> {
        match &self.0.value {
            Node::Seq(items) => Some(items.iter().map(NodeRef)),
            _ => None,
        }
    }

    /// What the walker finds in this object (see [`walker::summarize_value`],
    /// which gives the same for the node's JSON).
    pub fn summarize(self) -> ObjectSummary {
        // Reading the tree cannot fail; the walker skips what it does not expect.
        walker::summarize_from(self).unwrap_or_default()
    }

    /// The node as JSON (a copy: the tree keeps its strings).
    pub fn to_value(self) -> Value {
        to_json(&self.0.value)
    }
}

fn to_json(n: &Node) -> Value {
    match n {
        Node::Null => Value::Null,
        Node::Bool(b) => Value::Bool(*b),
        Node::Int(i) => Value::Number(i.clone()),
        Node::Float(f) => Number::from_f64(*f).map_or(Value::Null, Value::Number),
        Node::Str(s) => Value::String(s.clone()),
        Node::Seq(items) => Value::Array(items.iter().map(|i| to_json(&i.value)).collect()),
        Node::Map(entries) => {
            let mut m = Map::new();
            for (k, v) in entries {
                m.insert(k.clone(), to_json(&v.value));
            }
            Value::Object(m)
        }
    }
}

impl<'de> de::Deserializer<'de> for NodeRef<'de> {
    type Error = de::value::Error;

    /// Hands each node to the visitor as its JSON would be handed: numbers
    /// as `u64`/`i64`/`f64` (a float that is not finite reads as JSON's
    /// `null` does, through `Value`'s own `visit_f64`), strings and keys
    /// borrowed from the tree.
    fn deserialize_any<V: Visitor<'de>>(self, v: V) -> Result<V::Value, Self::Error> {
        match &self.0.value {
            Node::Null => v.visit_unit(),
            Node::Bool(b) => v.visit_bool(*b),
            Node::Int(n) => match (n.as_u64(), n.as_i64()) {
                (Some(u), _) => v.visit_u64(u),
                (None, Some(i)) => v.visit_i64(i),
                (None, None) => v.visit_f64(n.as_f64().unwrap_or(f64::NAN)),
            },
            Node::Float(f) => v.visit_f64(*f),
            Node::Str(s) => v.visit_borrowed_str(s),
            Node::Seq(items) => v.visit_seq(Items(items.iter())),
            Node::Map(entries) => v.visit_map(Entries {
                entries: entries.iter(),
                value: None,
            }),
        }
    }

    /// Skipping a subtree costs nothing: it is already parsed.
    fn deserialize_ignored_any<V: Visitor<'de>>(self, v: V) -> Result<V::Value, Self::Error> {
        v.visit_unit()
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string
        bytes byte_buf option unit unit_struct newtype_struct seq tuple
        tuple_struct map struct enum identifier
    }
}

struct Items<'a>(std::slice::Iter<'a, Tree>);

impl<'de> de::SeqAccess<'de> for Items<'de> {
    type Error = de::value::Error;
    fn next_element_seed<T: DeserializeSeed<'de>>(
        &mut self,
        seed: T,
    ) -> Result<Option<T::Value>, Self::Error> {
        self.0
            .next()
            .map(|t| seed.deserialize(NodeRef(t)))
            .transpose()
    }
    fn size_hint(&self) -> Option<usize> {
        Some(self.0.len())
    }
}

struct Entries<'a> {
    entries: std::slice::Iter<'a, (String, Tree)>,
    value: Option<&'a Tree>,
}

impl<'de> de::MapAccess<'de> for Entries<'de> {
    type Error = de::value::Error;
    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, Self::Error> {
        let Some((k, v)) = self.entries.next() else {
            return Ok(None);
        };
        self.value = Some(v);
        seed.deserialize(BorrowedStrDeserializer::new(k)).map(Some)
    }
    fn next_value_seed<V: DeserializeSeed<'de>>(
        &mut self,
        seed: V,
    ) -> Result<V::Value, Self::Error> {
        let v = self
            .value
            .take()
            .ok_or_else(|| de::Error::custom("a map value asked for before its key"))?;
        seed.deserialize(NodeRef(v))
    }
    fn size_hint(&self) -> Option<usize> {
        Some(self.entries.len())
    }
}

#[cfg(test)]
mod tests {
    use super::super::parse_stream;
    use crate::walker::summarize_value;

    /// What the walker reads besides images — metadata, pull secrets,
    /// service account, a deletion timestamp of every type, numbers, nulls,
    /// a List — comes out of the tree as out of the JSON, and the JSON is
    /// the document's.
    #[test]
    fn the_tree_walks_as_its_json_does() {
        let text = "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: d, generateName: g-, namespace: n, deletionTimestamp: 2024-01-01T00:00:00Z, labels: {a: '1'}}\nspec:\n  replicas: 3\n  template:\n    spec:\n      serviceAccount: old\n      serviceAccountName: sa\n      imagePullSecrets: [{name: p}, {name: ''}, {}, 7]\n      initContainers: [{name: i, image: 'i:1'}]\n      containers:\n      - {name: a, image: \"a:1\", ports: [{containerPort: 80}], x: 1.5, y: -3, z: ~}\n      - {image: 12}\n      - image: b:1\n      volumes: [{name: v, image: {reference: v:1}}, {name: w, image: {}}]\n---\napiVersion: v1\nkind: Pod\nmetadata: {name: p, deletionTimestamp: ~}\nspec: {containers: [{image: c:1}], ephemeralContainers: [{name: e, image: e:1}]}\n---\n- not an object\n---\n42\n";
        let docs = parse_stream(text).expect("parses");
        assert_eq!(docs.len(), 4);
        for d in &docs {
            let json = d.to_value();
            assert_eq!(d.root().summarize(), summarize_value(&json), "{json}");
        }
        let deploy = docs[0].root().summarize();
        assert_eq!(deploy.fields.len(), 4, "i:1, a:1, b:1, v:1");
        assert!(deploy.terminating);
        assert_eq!(deploy.pull_secrets, ["p"]);
        assert_eq!(deploy.service_account.as_deref(), Some("sa"));
        assert!(!docs[1].root().summarize().terminating);
        assert_eq!(
            docs[0].to_value()["spec"]["template"]["spec"]["containers"][0]["x"],
            1.5
        );
    }
}
