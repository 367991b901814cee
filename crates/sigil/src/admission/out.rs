//! The AdmissionReview answer sigil writes: its shape, and the writer that
//! puts it into the response buffer.
//!
//! Owns the answer's fields and their JSON: [`write_review`] writes exactly
//! the bytes serde_json's compact form of [`ReviewOut`] would (the tests
//! hold the two equal), except that the JSONPatch is base64-encoded straight
//! into the buffer, with no `String` in between and no scan for characters
//! to escape — base64 has none, and serde_json checks every byte of a string
//! it writes (a visible share of a cached admission in the server's
//! profile, the patch being the answer's longest string). What the answer
//! says is decided in `admission.rs`; this module only writes it.

use std::collections::BTreeMap;

use base64::Engine as _;
use serde::Serialize;

/// base64 as kube-apiserver decodes a webhook's `patch`.
const BASE64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct ReviewOut<'a> {
    pub api_version: &'a str,
    pub kind: &'static str,
    pub response: ResponseOut,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct ResponseOut {
    pub uid: String,
    pub allowed: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub patch_type: Option<&'static str>,
    /// The JSONPatch, base64-encoded on the wire as kube-apiserver expects.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub patch: Option<JsonPatch>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub audit_annotations: BTreeMap<String, String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<StatusOut>,
}

#[derive(Debug, Serialize)]
pub(super) struct StatusOut {
    pub code: u16,
    pub reason: &'static str,
    pub message: String,
}

/// A JSONPatch's bytes; written as their base64 text.
#[derive(Debug)]
pub(super) struct JsonPatch(pub Vec<u8>);

impl JsonPatch {
    /// The length of the base64 text.
    fn encoded_len(&self) -> usize {
        self.0.len().div_ceil(3) * 4
    }
}

impl Serialize for JsonPatch {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&BASE64.encode(&self.0))
    }
}

/// About how many bytes [`write_review`] writes: the patch's base64, the
/// strings, and room for the keys and punctuation.
pub(super) fn size_hint(out: &ReviewOut<'_>) -> usize {
    let r = &out.response;
    let strings: usize = r.warnings.iter().map(|w| w.len() + 3).sum::<usize>()
        + r.audit_annotations
            .iter()
            .map(|(k, v)| k.len() + v.len() + 6)
            .sum::<usize>()
        + r.status.as_ref().map_or(0, |s| s.message.len() + 64);
    256 + out.api_version.len()
        + r.uid.len()
        + r.patch.as_ref().map_or(0, JsonPatch::encoded_len)
        + strings
}

/// Appends the answer's head, everything up to and including the uid: a
/// reused answer is this head and the bytes that followed it the first time.
pub(super) fn write_head(buf: &mut Vec<u8>, api_version: &str, kind: &str, uid: &str) {
    buf.extend_from_slice(b"{\"apiVersion\":");
    string(buf, api_version);
    buf.extend_from_slice(b",\"kind\":");
    string(buf, kind);
    buf.extend_from_slice(b",\"response\":{\"uid\":");
    string(buf, uid);
}

/// Appends `out` to `buf` as compact JSON: serde_json's bytes, the field
/// order of [`ReviewOut`]'s derive, empty fields left out as it leaves them.
/// Returns where the head ([`write_head`]) ends.
pub(super) fn write_review(buf: &mut Vec<u8>, out: &ReviewOut<'_>) -> usize {
    let r = &out.response;
    write_head(buf, out.api_version, out.kind, &r.uid);
    let head = buf.len();
    buf.extend_from_slice(if r.allowed {
        b",\"allowed\":true"
    } else {
        b",\"allowed\":false"
    });
    if let Some(t) = r.patch_type {
        buf.extend_from_slice(b",\"patchType\":");
        string(buf, t);
    }
    if let Some(p) = &r.patch {
        buf.extend_from_slice(b",\"patch\":\"");
        let at = buf.len();
        buf.resize(at + p.encoded_len(), 0);
        // The room is exactly the padded encoding's length.
        let written = BASE64.encode_slice(&p.0, &mut buf[at..]).unwrap_or(0);
        buf.truncate(at + written);
        buf.push(b'"');
    }
    if !r.warnings.is_empty() {
        buf.extend_from_slice(b",\"warnings\":[");
        for (i, w) in r.warnings.iter().enumerate() {
            if i > 0 {
                buf.push(b',');
            }
            string(buf, w);
        }
        buf.push(b']');
    }
    if !r.audit_annotations.is_empty() {
        buf.extend_from_slice(b",\"auditAnnotations\":{");
        for (i, (k, v)) in r.audit_annotations.iter().enumerate() {
            if i > 0 {
                buf.push(b',');
            }
            string(buf, k);
            buf.push(b':');
            string(buf, v);
        }
        buf.push(b'}');
    }
    if let Some(s) = &r.status {
        buf.extend_from_slice(b",\"status\":{\"code\":");
        buf.extend_from_slice(s.code.to_string().as_bytes());
        buf.extend_from_slice(b",\"reason\":");
        string(buf, s.reason);
        buf.extend_from_slice(b",\"message\":");
        string(buf, &s.message);
        buf.push(b'}');
    }
    buf.extend_from_slice(b"}}");
    head
}

/// A JSON string, escaped as serde_json escapes it.
fn string(buf: &mut Vec<u8>, s: &str) {
    // Serializing a `str` into a `Vec` cannot fail.
    let _ = serde_json::to_writer(&mut *buf, s);
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn both(out: &ReviewOut<'_>) -> (Vec<u8>, Vec<u8>) {
        let mut hand = Vec::new();
        let head = write_review(&mut hand, out);
        let mut alone = Vec::new();
        write_head(&mut alone, out.api_version, out.kind, &out.response.uid);
        assert_eq!(
            hand[..head],
            alone[..],
            "the head ends where write_review says"
        );
        (hand, serde_json::to_vec(out).expect("serialize"))
    }

    fn response(allowed: bool) -> ResponseOut {
        ResponseOut {
            uid: "705ab4f5-6393-11e8-b7cc-42010a800002".into(),
            allowed,
            patch_type: None,
            patch: None,
            warnings: Vec::new(),
            audit_annotations: BTreeMap::new(),
            status: None,
        }
    }

    /// Every shape the webhook answers with: allowed alone, patched with
    /// annotations, warned, denied; strings that need escaping; patches
    /// of every length modulo 3 (base64 padding).
    #[test]
    fn the_answer_is_serde_jsons_compact_form_byte_for_byte() {
        let mut shapes = vec![response(true)];
        for n in [0usize, 1, 2, 3, 4, 5, 299, 300, 301] {
            let mut r = response(true);
            r.patch_type = Some("JSONPatch");
            r.patch = Some(JsonPatch((0..n).map(|i| (i * 7 % 256) as u8).collect()));
            r.audit_annotations.insert(
                "images".into(),
                "spec.containers[0].image: a -> b@sha256:00".into(),
            );
            r.audit_annotations
                .insert("verified".into(), "x: \"q\"\\ \u{1}\u{7f} é 日本".into());
            shapes.push(r);
        }
        let mut warned = response(true);
        warned.warnings = vec!["sigil: \"a\"\n\tb".into(), String::new(), "ü".into()];
        shapes.push(warned);
        let mut denied = response(false);
        denied.status = Some(StatusOut {
            code: 403,
            reason: "Forbidden",
            message: "sigil denied the request: image \"x\" </script>".into(),
        });
        denied.warnings = vec!["w".into()];
        shapes.push(denied);
        for (api_version, response) in ["admission.k8s.io/v1", "admission.k8s.io/v1beta1"]
            .into_iter()
            .cycle()
            .zip(shapes)
        {
            let out = ReviewOut {
                api_version,
                kind: "AdmissionReview",
                response,
            };
            let (hand, serde) = both(&out);
            assert_eq!(
                String::from_utf8_lossy(&hand),
                String::from_utf8_lossy(&serde)
            );
            assert!(size_hint(&out) >= hand.len(), "{}", size_hint(&out));
        }
    }

    proptest! {
        /// The same for any strings and patch bytes.
        #[test]
        fn any_answer_is_written_as_serde_json_writes_it(
            uid in ".*",
            warnings in proptest::collection::vec(".*", 0..3),
            annotations in proptest::collection::btree_map(".*", ".*", 0..3),
            patch in proptest::option::of(proptest::collection::vec(any::<u8>(), 0..64)),
            message in proptest::option::of(".*"),
        ) {
            let out = ReviewOut {
                api_version: "admission.k8s.io/v1",
                kind: "AdmissionReview",
                response: ResponseOut {
                    uid,
                    allowed: message.is_none(),
                    patch_type: patch.as_ref().map(|_| "JSONPatch"),
                    patch: patch.map(JsonPatch),
                    warnings,
                    audit_annotations: annotations,
                    status: message.map(|message| StatusOut { code: 403, reason: "Forbidden", message }),
                },
            };
            let (hand, serde) = both(&out);
            prop_assert_eq!(hand, serde);
        }
    }
}
