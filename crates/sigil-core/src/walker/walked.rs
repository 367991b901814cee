//! [`Walked`]: the walker as a serde type, so an AdmissionReview's object
//! is walked while the review around it is parsed. It owns only that
//! adapter; what is found, and how, is the parent module's.

use super::{Node, ObjectSummary, Seed, Walker};

/// An object walked while the document around it is parsed, so an
/// AdmissionReview's object is read once, not skimmed as raw JSON and then
/// walked. Anything but a JSON object is no object (`None`), as
/// kube-apiserver never sends one and a missing object means no images.
/// Boxed: the review around it is a small value to move while it is parsed.
#[derive(Debug, Default)]
pub struct Walked(pub Option<Box<ObjectSummary>>);

impl<'de> serde::Deserialize<'de> for Walked {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Walked, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = Walked;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a Kubernetes object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, a: A) -> Result<Walked, A::Error> {
                let mut w = Walker::default();
                serde::de::Visitor::visit_map(
                    Seed {
                        w: &mut w,
                        b: &mut (),
                        node: Node::Root,
                    },
                    a,
                )?;
                Ok(Walked(Some(Box::new(w.finish()))))
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut a: A) -> Result<Walked, A::Error> {
                while a.next_element::<serde::de::IgnoredAny>()?.is_some() {}
                Ok(Walked(None))
            }
            fn visit_some<D: serde::Deserializer<'de>>(self, d: D) -> Result<Walked, D::Error> {
                d.deserialize_any(self)
            }
            fn visit_none<E>(self) -> Result<Walked, E> {
                Ok(Walked(None))
            }
            fn visit_unit<E>(self) -> Result<Walked, E> {
                Ok(Walked(None))
            }
            fn visit_bool<E>(self, _: bool) -> Result<Walked, E> {
                Ok(Walked(None))
            }
            fn visit_i64<E>(self, _: i64) -> Result<Walked, E> {
                Ok(Walked(None))
            }
            fn visit_u64<E>(self, _: u64) -> Result<Walked, E> {
                Ok(Walked(None))
            }
            fn visit_f64<E>(self, _: f64) -> Result<Walked, E> {
                Ok(Walked(None))
            }
            fn visit_str<E>(self, _: &str) -> Result<Walked, E> {
                Ok(Walked(None))
            }
        }
        d.deserialize_any(V)
    }
}
