//! Finds every image field in any Kubernetes object.
//!
//! Owns the list of places images live: `containers`, `initContainers`,
//! `ephemeralContainers` and image volumes, under every pod-spec location a
//! workload can have (`spec`, `spec.template.spec`,
//! `spec.jobTemplate.spec.template.spec`, and PodTemplate's `template.spec`).
//! It goes by shape, not by kind, so CRDs and Knative sources with the same
//! paths are covered. It does not decide anything about the images it finds.

use serde_json::Value;

/// Pod-spec locations, as JSON pointer prefixes.
pub const POD_SPEC_PATHS: &[&[&str]] = &[
    &["spec"],
    &["spec", "template", "spec"],
    &["spec", "jobTemplate", "spec", "template", "spec"],
    &["template", "spec"],
];

/// Which kind of field holds the image.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FieldKind {
    /// `containers[].image`
    Container,
    /// `initContainers[].image`
    InitContainer,
    /// `ephemeralContainers[].image`
    EphemeralContainer,
    /// `volumes[].image.reference`
    ImageVolume,
}

impl FieldKind {
    fn list(self) -> &'static str {
        match self {
            FieldKind::Container => "containers",
            FieldKind::InitContainer => "initContainers",
            FieldKind::EphemeralContainer => "ephemeralContainers",
            FieldKind::ImageVolume => "volumes",
        }
    }
}

/// One image string and where it lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageField {
    /// RFC 6901 pointer to the string, e.g. `/spec/containers/0/image`.
    pub pointer: String,
    /// Path segments of the pointer (unescaped), for YAML editors.
    pub path: Vec<String>,
    /// Container or volume kind.
    pub kind: FieldKind,
    /// Container or volume name, when the object gives one.
    pub name: Option<String>,
    /// The image as written.
    pub value: String,
}

impl ImageField {
    /// Human wording, e.g. `container "web"` or `init container #1`.
    pub fn describe(&self) -> String {
        let what = match self.kind {
            FieldKind::Container => "container",
            FieldKind::InitContainer => "init container",
            FieldKind::EphemeralContainer => "ephemeral container",
            FieldKind::ImageVolume => "image volume",
        };
        match &self.name {
            Some(n) => format!("{what} {n:?}"),
            None => format!("{what} at {}", self.dotted()),
        }
    }

    /// `spec.containers[0].image` form, as kubectl prints field paths.
    pub fn dotted(&self) -> String {
        let mut s = String::new();
        for seg in &self.path {
            if seg.bytes().all(|b| b.is_ascii_digit()) && !seg.is_empty() {
                s.push('[');
                s.push_str(seg);
                s.push(']');
            } else {
                if !s.is_empty() {
                    s.push('.');
                }
                s.push_str(seg);
            }
        }
        s
    }
}

/// Escapes one JSON pointer token (`~` → `~0`, `/` → `~1`).
pub fn escape_token(t: &str) -> String {
    if !t.contains(['~', '/']) {
        return t.to_owned();
    }
    t.replace('~', "~0").replace('/', "~1")
}

/// Every image field in `obj`, in document order of the locations above.
/// Non-string or missing images are skipped: the API server validates types.
pub fn image_fields(obj: &Value) -> Vec<ImageField> {
    let mut out = Vec::new();
    for prefix in POD_SPEC_PATHS {
        let mut cur = obj;
        let mut found = true;
        for seg in *prefix {
            match cur.get(seg) {
                Some(v) => cur = v,
                None => {
                    found = false;
                    break;
                }
            }
        }
        if !found || !cur.is_object() {
            continue;
        }
        for kind in [
            FieldKind::InitContainer,
            FieldKind::Container,
            FieldKind::EphemeralContainer,
            FieldKind::ImageVolume,
        ] {
            let Some(Value::Array(items)) = cur.get(kind.list()) else {
                continue;
            };
            for (i, item) in items.iter().enumerate() {
                let (value, tail): (Option<&Value>, &[&str]) = match kind {
                    FieldKind::ImageVolume => (
                        item.get("image").and_then(|v| v.get("reference")),
                        &["image", "reference"],
                    ),
                    _ => (item.get("image"), &["image"]),
                };
                let Some(Value::String(image)) = value else {
                    continue;
                };
                let mut path: Vec<String> = prefix.iter().map(|s| (*s).to_owned()).collect();
                path.push(kind.list().to_owned());
                path.push(i.to_string());
                path.extend(tail.iter().map(|s| (*s).to_owned()));
                let pointer = path.iter().fold(String::new(), |mut acc, s| {
                    acc.push('/');
                    acc.push_str(&escape_token(s));
                    acc
                });
                out.push(ImageField {
                    pointer,
                    path,
                    kind,
                    name: item.get("name").and_then(Value::as_str).map(str::to_owned),
                    value: image.clone(),
                });
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn finds_every_location() {
        let pod = json!({"kind":"Pod","spec":{
            "initContainers":[{"name":"i","image":"busybox"}],
            "containers":[{"name":"a","image":"nginx"},{"name":"b","image":"redis"}],
            "ephemeralContainers":[{"name":"e","image":"debug"}],
            "volumes":[{"name":"v","image":{"reference":"data:1"}},{"name":"cm","configMap":{}}]}});
        let f = image_fields(&pod);
        let ptrs: Vec<_> = f.iter().map(|x| x.pointer.as_str()).collect();
        assert_eq!(
            ptrs,
            [
                "/spec/initContainers/0/image",
                "/spec/containers/0/image",
                "/spec/containers/1/image",
                "/spec/ephemeralContainers/0/image",
                "/spec/volumes/0/image/reference"
            ]
        );
        assert_eq!(f[4].describe(), "image volume \"v\"");
        assert_eq!(f[2].dotted(), "spec.containers[1].image");

        let cron = json!({"kind":"CronJob","spec":{"jobTemplate":{"spec":{"template":{"spec":{"containers":[{"name":"c","image":"x"}]}}}}}});
        assert_eq!(
            image_fields(&cron)[0].pointer,
            "/spec/jobTemplate/spec/template/spec/containers/0/image"
        );
        let pt = json!({"kind":"PodTemplate","template":{"spec":{"containers":[{"name":"c","image":"x"}]}}});
        assert_eq!(
            image_fields(&pt)[0].pointer,
            "/template/spec/containers/0/image"
        );
        let ks = json!({"kind":"ContainerSource","spec":{"template":{"spec":{"containers":[{"image":"x"}]}}}});
        assert_eq!(
            image_fields(&ks)[0].describe(),
            "container at spec.template.spec.containers[0].image"
        );
    }

    #[test]
    fn ignores_odd_shapes() {
        for v in [
            json!(null),
            json!([]),
            json!({"spec": 3}),
            json!({"spec":{"containers": {"a": 1}}}),
            json!({"spec":{"containers":[{"image": 5}, 7]}}),
        ] {
            assert!(image_fields(&v).is_empty());
        }
    }

    #[test]
    fn escapes_pointer_tokens() {
        assert_eq!(escape_token("a/b~c"), "a~1b~0c");
    }
}
