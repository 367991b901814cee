//! The walker's two leaf readers, for any serde deserializer: [`Str`]
//! keeps a string and skips any other value (a field the walker reads
//! must never turn an odd type into an error), and [`Key`] reads a map key
//! borrowed when the input allows. They know nothing of where images live
//! (the parent module's table).

/// Captures a string, or skips any other value.
pub(super) struct Str;

impl<'de> serde::de::DeserializeSeed<'de> for Str {
    type Value = Option<String>;
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Option<String>, D::Error> {
        d.deserialize_any(self)
    }
}

macro_rules! ignore_scalars {
    ($ret:expr) => {
        fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
            Ok($ret)
        }
        fn visit_i64<E>(self, _: i64) -> Result<Self::Value, E> {
            Ok($ret)
        }
        fn visit_u64<E>(self, _: u64) -> Result<Self::Value, E> {
            Ok($ret)
        }
        fn visit_f64<E>(self, _: f64) -> Result<Self::Value, E> {
            Ok($ret)
        }
        fn visit_unit<E>(self) -> Result<Self::Value, E> {
            Ok($ret)
        }
        fn visit_none<E>(self) -> Result<Self::Value, E> {
            Ok($ret)
        }
        fn visit_some<D: serde::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
            d.deserialize_ignored_any(serde::de::IgnoredAny)
                .map(|_| $ret)
        }
        fn visit_seq<A: serde::de::SeqAccess<'de>>(
            self,
            mut a: A,
        ) -> Result<Self::Value, A::Error> {
            while a.next_element::<serde::de::IgnoredAny>()?.is_some() {}
            Ok($ret)
        }
        fn visit_map<A: serde::de::MapAccess<'de>>(
            self,
            mut a: A,
        ) -> Result<Self::Value, A::Error> {
            while a
                .next_entry::<serde::de::IgnoredAny, serde::de::IgnoredAny>()?
                .is_some()
            {}
            Ok($ret)
        }
    };
}

impl<'de> serde::de::Visitor<'de> for Str {
    type Value = Option<String>;
    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("any value")
    }
    fn visit_str<E>(self, v: &str) -> Result<Option<String>, E> {
        Ok(Some(v.to_owned()))
    }
    fn visit_string<E>(self, v: String) -> Result<Option<String>, E> {
        Ok(Some(v))
    }
    fn visit_bytes<E>(self, _: &[u8]) -> Result<Option<String>, E> {
        Ok(None)
    }
    ignore_scalars!(None);
}

/// Map keys, borrowed when the input allows.
pub(super) struct Key<'de>(pub(super) std::borrow::Cow<'de, str>);

impl<'de> serde::Deserialize<'de> for Key<'de> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = Key<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a string key")
            }
            fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Key<'de>, E> {
                Ok(Key(std::borrow::Cow::Borrowed(v)))
            }
            fn visit_str<E>(self, v: &str) -> Result<Key<'de>, E> {
                Ok(Key(std::borrow::Cow::Owned(v.to_owned())))
            }
            fn visit_string<E>(self, v: String) -> Result<Key<'de>, E> {
                Ok(Key(std::borrow::Cow::Owned(v)))
            }
        }
        d.deserialize_str(V)
    }
}
