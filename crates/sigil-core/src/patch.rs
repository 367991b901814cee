//! JSONPatch building for changed image fields.
//!
//! Owns the translation from outcomes to RFC 6902 operations. Patches are
//! built against the raw object the API server sent (never a re-serialized
//! typed object, which would drop unknown fields), one `replace` per changed
//! string, so applying them cannot touch anything else.

use json_patch::jsonptr::PointerBuf;
use json_patch::{Patch, PatchOperation, ReplaceOperation};
use serde_json::Value;

use crate::walker::ImageField;

/// One replacement: the field and its new image string.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Replacement<'a> {
    /// Where.
    pub field: &'a ImageField,
    /// New value.
    pub new: &'a str,
}

/// Builds a patch replacing each field's string. Fields come from
/// [`crate::walker::image_fields`], so their pointers are already escaped.
pub fn build_patch(changes: &[Replacement<'_>]) -> Patch {
    let ops = changes
        .iter()
        .map(|c| {
            PatchOperation::Replace(ReplaceOperation {
                path: PointerBuf::from_tokens(c.field.path.iter().map(String::as_str)),
                value: Value::String(c.new.to_owned()),
            })
        })
        .collect();
    Patch(ops)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::walker::image_fields;
    use serde_json::json;

    #[test]
    fn patch_applies_and_touches_only_images() {
        let mut obj = json!({"metadata":{"name":"p","annotations":{"a/b":"~"}},"spec":{"containers":[{"name":"a","image":"nginx","x-unknown":1}]}});
        let fields = image_fields(&obj);
        let p = build_patch(&[Replacement {
            field: &fields[0],
            new: "nginx:latest@sha256:00",
        }]);
        let before = obj.clone();
        json_patch::patch(&mut obj, &p).unwrap();
        assert_eq!(
            obj["spec"]["containers"][0]["image"],
            "nginx:latest@sha256:00"
        );
        assert_eq!(obj["spec"]["containers"][0]["x-unknown"], 1);
        assert_eq!(obj["metadata"], before["metadata"]);
        let wire = serde_json::to_value(&p).unwrap();
        assert_eq!(
            wire,
            json!([{"op":"replace","path":"/spec/containers/0/image","value":"nginx:latest@sha256:00"}])
        );
    }
}
