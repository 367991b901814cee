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

/// Writes the same patch as [`build_patch`] straight as JSON bytes into
/// `out`: the admission path's form, with no operation, pointer or value
/// allocated on the way.
pub fn write_patch(out: &mut Vec<u8>, changes: &[Replacement<'_>]) {
    // Room for the whole patch at once: growing the buffer as it is
    // written moved it several times per admission (a pinned image's
    // operation is ~170 bytes), a measurable share of rendering.
    let needed: usize = changes
        .iter()
        .map(|c| OP_LEN + c.new.len() + c.field.path.iter().map(|s| s.len() + 1).sum::<usize>())
        .sum();
    out.reserve(needed + 2);
    out.push(b'[');
    for (i, c) in changes.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(br#"{"op":"replace","path":"#);
        pointer(out, &c.field.path);
        out.extend_from_slice(br#","value":"#);
        // Writing a str to a Vec cannot fail.
        let _ = serde_json::to_writer(&mut *out, c.new);
        out.push(b'}');
    }
    out.push(b']');
}

/// The bytes of one operation besides its pointer and value (and their
/// quotes, and the comma before it).
const OP_LEN: usize = r#",{"op":"replace","path":"","value":""}"#.len();

/// The RFC 6901 pointer of `path` as a JSON string (`~` → `~0`, `/` → `~1`).
fn pointer(out: &mut Vec<u8>, path: &[String]) {
    let plain = |s: &String| {
        s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-' || b == b'.')
    };
    if path.iter().all(plain) {
        // The walker's fields: nothing to escape, written as they are.
        out.push(b'"');
        for seg in path {
            out.push(b'/');
            out.extend_from_slice(seg.as_bytes());
        }
        out.push(b'"');
        return;
    }
    let mut p = String::with_capacity(path.iter().map(|s| s.len() + 1).sum());
    for seg in path {
        p.push('/');
        crate::walker::push_escaped(&mut p, seg);
    }
    let _ = serde_json::to_writer(&mut *out, &p);
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

    /// The bytes the admission path writes are the serialized patch.
    #[test]
    fn written_patch_is_the_serialized_patch() {
        let obj = json!({"spec":{"containers":[{"image":"a"},{"image":"b"}],
            "volumes":[{"name":"v","image":{"reference":"c"}}]},
            "template":{"spec":{"initContainers":[{"image":"d"}]}}});
        let fields = image_fields(&obj);
        let news = ["x", "quote\" and \\ ~ / é", "", "n@sha256:00"];
        for n in 0..=fields.len() {
            let reps: Vec<_> = fields
                .iter()
                .zip(news)
                .take(n)
                .map(|(field, new)| Replacement { field, new })
                .collect();
            let mut ours = Vec::new();
            write_patch(&mut ours, &reps);
            assert_eq!(ours, serde_json::to_vec(&build_patch(&reps)).unwrap());
        }
        let odd = ImageField {
            pointer: String::new(),
            path: vec!["a~b".into(), "c/d".into(), "0".into()],
            kind: crate::walker::FieldKind::Container,
            name: None,
            value: "v".into(),
        };
        let reps = [Replacement {
            field: &odd,
            new: "w",
        }];
        let mut ours = Vec::new();
        write_patch(&mut ours, &reps);
        assert_eq!(ours, serde_json::to_vec(&build_patch(&reps)).unwrap());
    }
}
