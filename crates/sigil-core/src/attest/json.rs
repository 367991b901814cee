//! JSON straight into CEL values, in one pass: an SBOM of megabytes is
//! parsed once into what conditions read, with no intermediate
//! `serde_json::Value` to build, convert and drop (that was two thirds of
//! the cost of reading a 5 MiB statement). Numbers keep serde's split:
//! non-negative integers are `uint`, negative ones `int`, the rest `double`.
//! The statement's `predicate` is built only as far as conditions read it
//! ([`Reads`]): fields nobody names are validated as JSON and skipped.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use cel::objects::{Key, Map};
use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

use super::Reads;

/// Parses `bytes` (one JSON document) into a CEL value; of a top-level
/// `predicate` object, only what `reads` names.
pub(super) fn parse(bytes: &[u8], reads: &Reads) -> Result<cel::Value, serde_json::Error> {
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let v = match reads {
        Reads::All => Seed.deserialize(&mut de)?,
        Reads::Fields(f) => Top(f).deserialize(&mut de)?,
    };
    de.end()?;
    Ok(v)
}

/// The statement object: every field in full but `predicate`, pruned.
struct Top<'a>(&'a std::collections::BTreeSet<String>);

impl<'de> DeserializeSeed<'de> for Top<'_> {
    type Value = cel::Value;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<cel::Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Top<'_> {
    type Value = cel::Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an in-toto statement (a JSON object)")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<cel::Value, A::Error> {
        let mut out: HashMap<Key, cel::Value> = HashMap::new();
        while let Some(k) = map.next_key::<String>()? {
            let v = if k == "predicate" {
                map.next_value_seed(Only(self.0))?
            } else {
                map.next_value_seed(Seed)?
            };
            out.insert(Key::String(Arc::new(k)), v);
        }
        Ok(cel::Value::Map(Map { map: Arc::new(out) }))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<cel::Value, A::Error> {
        Seed.visit_seq(seq)
    }
}

/// An object of which only `fields` are built (anything else in full).
struct Only<'a>(&'a std::collections::BTreeSet<String>);

impl<'de> DeserializeSeed<'de> for Only<'_> {
    type Value = cel::Value;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<cel::Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Only<'_> {
    type Value = cel::Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<cel::Value, A::Error> {
        let mut out: HashMap<Key, cel::Value> = HashMap::new();
        while let Some(k) = map.next_key::<String>()? {
            if self.0.contains(&k) {
                let v = map.next_value_seed(Seed)?;
                out.insert(Key::String(Arc::new(k)), v);
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(cel::Value::Map(Map { map: Arc::new(out) }))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<cel::Value, A::Error> {
        Seed.visit_seq(seq)
    }

    fn visit_bool<E: serde::de::Error>(self, v: bool) -> Result<cel::Value, E> {
        Seed.visit_bool(v)
    }

    fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<cel::Value, E> {
        Seed.visit_i64(v)
    }

    fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<cel::Value, E> {
        Seed.visit_u64(v)
    }

    fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<cel::Value, E> {
        Seed.visit_f64(v)
    }

    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<cel::Value, E> {
        Seed.visit_str(v)
    }

    fn visit_unit<E: serde::de::Error>(self) -> Result<cel::Value, E> {
        Seed.visit_unit()
    }
}

struct Seed;

impl<'de> DeserializeSeed<'de> for Seed {
    type Value = cel::Value;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<cel::Value, D::Error> {
        d.deserialize_any(Seed)
    }
}

impl<'de> Visitor<'de> for Seed {
    type Value = cel::Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E: serde::de::Error>(self, v: bool) -> Result<cel::Value, E> {
        Ok(cel::Value::Bool(v))
    }

    fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<cel::Value, E> {
        Ok(cel::Value::Int(v))
    }

    fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<cel::Value, E> {
        Ok(cel::Value::UInt(v))
    }

    fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<cel::Value, E> {
        Ok(cel::Value::Float(v))
    }

    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<cel::Value, E> {
        Ok(cel::Value::String(Arc::new(v.to_owned())))
    }

    fn visit_string<E: serde::de::Error>(self, v: String) -> Result<cel::Value, E> {
        Ok(cel::Value::String(Arc::new(v)))
    }

    fn visit_unit<E: serde::de::Error>(self) -> Result<cel::Value, E> {
        Ok(cel::Value::Null)
    }

    fn visit_none<E: serde::de::Error>(self) -> Result<cel::Value, E> {
        Ok(cel::Value::Null)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<cel::Value, A::Error> {
        let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(4096));
        while let Some(v) = seq.next_element_seed(Seed)? {
            out.push(v);
        }
        Ok(cel::Value::List(Arc::new(out)))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<cel::Value, A::Error> {
        let mut out: HashMap<Key, cel::Value> = HashMap::new();
        while let Some(k) = map.next_key::<String>()? {
            let v = map.next_value_seed(Seed)?;
            // A duplicate key keeps its last value, as serde_json's map does.
            out.insert(Key::String(Arc::new(k)), v);
        }
        Ok(cel::Value::Map(Map { map: Arc::new(out) }))
    }
}
