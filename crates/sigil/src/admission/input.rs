//! The AdmissionReview as sigil reads it: the request's strings borrowed
//! from the body where JSON allows, its objects walked by sigil-core's
//! streaming walker while the review is parsed, and the object's name for
//! messages. It owns reading, not checking: `admission.rs` refuses what is
//! not a review sigil can answer.

use std::borrow::Cow;

use serde::Deserialize;
use sigil_core::ObjectRef;
use sigil_core::walker::{ObjectSummary, Walked};

/// Strings are borrowed from the body where JSON allows (no escapes).
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct ReviewIn<'a> {
    #[serde(default, borrow, deserialize_with = "text")]
    pub(super) api_version: Option<Cow<'a, str>>,
    #[serde(default, borrow, deserialize_with = "text")]
    pub(super) kind: Option<Cow<'a, str>>,
    #[serde(borrow)]
    pub(super) request: Option<RequestIn<'a>>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
/// The objects are walked as they are parsed: the walker allocates only the
/// image strings and the metadata it needs; patches address the fields of
/// the object the API server sent.
pub(super) struct RequestIn<'a> {
    #[serde(default, borrow, deserialize_with = "text")]
    pub(super) uid: Option<Cow<'a, str>>,
    #[serde(borrow)]
    pub(super) kind: Option<Gvk<'a>>,
    #[serde(default, borrow, deserialize_with = "text")]
    pub(super) operation: Option<Cow<'a, str>>,
    #[serde(default, borrow, deserialize_with = "text")]
    pub(super) namespace: Option<Cow<'a, str>>,
    #[serde(default, borrow, deserialize_with = "text")]
    pub(super) name: Option<Cow<'a, str>>,
    #[serde(default)]
    pub(super) object: Option<Walked>,
    #[serde(default)]
    pub(super) old_object: Option<Walked>,
    /// dryRun requests get the same answer, without side effects: no copy
    /// into a mirror (the webhook is registered `NoneOnDryRun`).
    #[serde(default, rename = "dryRun")]
    pub(super) dry_run: Option<bool>,
}

/// A string field or null, borrowed from the body when it has no escapes
/// (serde's own `Option<Cow<str>>` always copies).
fn text<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Cow<'de, str>>, D::Error> {
    struct V;
    impl<'de> serde::de::Visitor<'de> for V {
        type Value = Option<Cow<'de, str>>;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a string")
        }
        fn visit_none<E>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_unit<E>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_some<D: serde::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
            d.deserialize_str(self)
        }
        fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Self::Value, E> {
            Ok(Some(Cow::Borrowed(v)))
        }
        fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
            Ok(Some(Cow::Owned(v.to_owned())))
        }
        fn visit_string<E>(self, v: String) -> Result<Self::Value, E> {
            Ok(Some(Cow::Owned(v)))
        }
    }
    d.deserialize_option(V)
}

#[derive(Debug, Deserialize)]
pub(super) struct Gvk<'a> {
    #[serde(default, borrow)]
    pub(super) kind: Cow<'a, str>,
}

pub(super) fn object_ref(
    req: &RequestIn<'_>,
    obj: Option<&ObjectSummary>,
    kind: &str,
) -> ObjectRef {
    let name = req
        .name
        .as_deref()
        .filter(|n| !n.is_empty())
        .or_else(|| obj.and_then(|o| o.name.as_deref()));
    ObjectRef::new(
        kind,
        req.namespace.as_deref().unwrap_or_default(),
        name,
        obj.and_then(|o| o.generate_name.as_deref()),
    )
}
