//! One listed object as the audit reads it, straight from the list page's
//! JSON text, in one pass: the walker finds the images (as in the
//! webhook) and, beside it ([`sigil_core::walker::Beside`]), [`Head`]
//! takes the few metadata and status fields the audit needs — no
//! `serde_json::Value` of the object, no second reading of its text.
//!
//! Why: building a `Value` per object (and dropping it) was the largest
//! part of an audit's CPU after the registry lookups, and a second pass
//! for these fields the next (docs/benchmarks.md, issue 27). A field of an
//! unexpected type makes [`read`] an error, and the caller reads that
//! object the general way (a `Value`), so an odd object is audited exactly
//! as before. It owns no decision.

use std::borrow::Cow;
use std::marker::PhantomData;
use std::time::SystemTime;

use serde::de::MapAccess;
use serde::{Deserialize, Deserializer};
use sigil_core::ObjectSummary;
use sigil_core::audit::{Running, STATUS_LISTS};

use super::kinds::Kind;
use super::report::ObjectMeta;

/// What the audit reads of an object besides its images (its name and
/// namespace come from the walker's summary).
#[derive(Debug, Default)]
pub struct Head<'a> {
    meta: Meta<'a>,
    status: Option<Obj<Status<'a>>>,
}

type Text<'a> = Option<Cow<'a, str>>;

/// A [`Text`] read borrowed from the page when it has no escapes (a
/// `Cow` on its own always reads owned).
#[derive(Deserialize)]
struct Borrowed<'a>(#[serde(borrow)] Text<'a>);

/// A JSON object read as the struct `T`. serde would also read an array
/// into a struct, field by position, where a `Value` reads nothing: an
/// array is refused instead, so the caller reads that object as a `Value`.
#[derive(Debug, Default)]
struct Obj<T>(T);

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Obj<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<T>(PhantomData<T>);
        impl<'de, T: Deserialize<'de>> serde::de::Visitor<'de> for V<T> {
            type Value = Obj<T>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("an object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, a: A) -> Result<Obj<T>, A::Error> {
                T::deserialize(serde::de::value::MapAccessDeserializer::new(a)).map(Obj)
            }
        }
        d.deserialize_map(V(PhantomData))
    }
}

/// `metadata`'s fields beside those the walker reads; a repeated key
/// keeps its last value, as a `Value` would.
#[derive(Debug, Default)]
struct Meta<'a> {
    uid: Text<'a>,
    resource_version: Text<'a>,
    creation_timestamp: Text<'a>,
    owner_references: Option<Vec<Obj<Owner<'a>>>>,
    managed_fields: Option<Vec<Obj<Managed<'a>>>>,
}

impl<'de> sigil_core::walker::Beside<'de> for Head<'de> {
    fn root<A: MapAccess<'de>>(&mut self, key: &str, a: &mut A) -> Result<bool, A::Error> {
        if key != "status" {
            return Ok(false);
        }
        self.status = a.next_value()?;
        Ok(true)
    }

    fn metadata<A: MapAccess<'de>>(&mut self, key: &str, a: &mut A) -> Result<bool, A::Error> {
        let m = &mut self.meta;
        match key {
            "uid" => m.uid = a.next_value::<Borrowed<'de>>()?.0,
            "resourceVersion" => m.resource_version = a.next_value::<Borrowed<'de>>()?.0,
            "creationTimestamp" => m.creation_timestamp = a.next_value::<Borrowed<'de>>()?.0,
            "ownerReferences" => m.owner_references = a.next_value()?,
            "managedFields" => m.managed_fields = a.next_value()?,
            _ => return Ok(false),
        }
        Ok(true)
    }
}

/// Reads one object's JSON text in one pass: its images and, beside them,
/// its [`Head`]. `Ok(None)` when the text is not an object; an error for
/// malformed JSON or a field the head reads having an unexpected type
/// (the caller then reads the object as a `Value`).
pub fn read(json: &str) -> Result<Option<(Head<'_>, ObjectSummary)>, serde_json::Error> {
    let mut head = Head::default();
    let summary = sigil_core::walker::summarize_json_with(json, &mut head)?;
    Ok(summary.map(|s| (head, s)))
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Owner<'a> {
    #[serde(borrow)]
    kind: Text<'a>,
    #[serde(borrow)]
    name: Text<'a>,
    controller: Option<bool>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Managed<'a> {
    #[serde(borrow)]
    time: Text<'a>,
    #[serde(borrow)]
    subresource: Text<'a>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
struct Status<'a> {
    #[serde(borrow)]
    container_statuses: Option<Vec<Obj<ContainerStatus<'a>>>>,
    #[serde(borrow)]
    init_container_statuses: Option<Vec<Obj<ContainerStatus<'a>>>>,
    #[serde(borrow)]
    ephemeral_container_statuses: Option<Vec<Obj<ContainerStatus<'a>>>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct ContainerStatus<'a> {
    #[serde(borrow)]
    name: Text<'a>,
    #[serde(borrow, rename = "imageID")]
    image_id: Text<'a>,
}

fn text<'s>(t: &'s Text<'_>) -> &'s str {
    t.as_deref().unwrap_or_default()
}

impl<'a> Head<'a> {
    /// The object's identity in the report (`summary`: the walker's, for
    /// its name and namespace).
    pub fn object_meta(&self, kind: &Kind, summary: &ObjectSummary) -> ObjectMeta {
        let m = &self.meta;
        let owner = m
            .owner_references
            .as_ref()
            .and_then(|refs| {
                refs.iter()
                    .map(|r| &r.0)
                    .find(|r| r.controller == Some(true))
            })
            .map(|r| format!("{}/{}", text(&r.kind), text(&r.name)));
        ObjectMeta {
            namespace: summary.namespace.clone().unwrap_or_default(),
            kind: kind.kind.to_string(),
            name: summary.name.clone().unwrap_or_default(),
            uid: text(&m.uid).to_owned(),
            api_version: kind.api_version(),
            resource_version: text(&m.resource_version).to_owned(),
            owner,
        }
    }

    /// As [`super::changed_at`]: the latest of `creationTimestamp` and the
    /// times of `managedFields` entries that are not a subresource's.
    pub fn changed_at(&self) -> Option<SystemTime> {
        let m = &self.meta;
        let parse = |t: &Text<'_>| {
            t.as_deref()
                .and_then(|s| humantime::parse_rfc3339_weak(s).ok())
        };
        let managed = m
            .managed_fields
            .iter()
            .flatten()
            .map(|f| &f.0)
            .filter(|f| text(&f.subresource).is_empty())
            .filter_map(|f| parse(&f.time));
        parse(&m.creation_timestamp)
            .into_iter()
            .chain(managed)
            .max()
    }

    /// As `sigil_core::audit::running_images`.
    pub fn running(&self) -> Vec<Running> {
        let Some(Obj(s)) = &self.status else {
            return Vec::new();
        };
        let lists = [
            &s.container_statuses,
            &s.init_container_statuses,
            &s.ephemeral_container_statuses,
        ];
        let mut out = Vec::new();
        for ((_, kind), list) in STATUS_LISTS.into_iter().zip(lists) {
            for Obj(c) in list.iter().flatten() {
                if let Some(name) = &c.name {
                    out.push(Running::of(kind, name, c.image_id.as_deref()));
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;

    fn pod() -> Value {
        json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "web-1", "namespace": "team-a", "uid": "u-1",
                "resourceVersion": "42", "creationTimestamp": "2026-01-01T00:00:00Z",
                "labels": {"app": "web"}, "annotations": {"a": "\"quoted\" \u{e9}"},
                "ownerReferences": [
                    {"apiVersion": "v1", "kind": "Node", "name": "n", "controller": false},
                    {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-abc", "controller": true}],
                "managedFields": [
                    {"manager": "kubectl", "time": "2026-02-01T00:00:00Z"},
                    {"manager": "kubelet", "subresource": "status", "time": "2026-03-01T00:00:00Z"}]},
            "spec": {"containers": [{"name": "app", "image": "nginx:1"}]},
            "status": {"phase": "Running",
                "initContainerStatuses": [{"name": "init", "imageID": "docker.io/library/busybox@sha256:".to_owned() + &"b".repeat(64)}],
                "containerStatuses": [
                    {"name": "app", "imageID": "docker-pullable://docker.io/library/nginx@sha256:".to_owned() + &"a".repeat(64)},
                    {"name": "side", "imageID": "sha256:".to_owned() + &"c".repeat(64)}]}})
    }

    fn pod_kind() -> &'static Kind {
        super::super::kinds::ALL
            .iter()
            .find(|k| k.kind == "Pod")
            .expect("Pod")
    }

    /// The one-pass reading equals the general (`Value`) one, field by
    /// field, images included; `false` when it left the object to the
    /// general path.
    #[track_caller]
    fn agrees(v: &Value) -> bool {
        let json = v.to_string();
        let kind = pod_kind();
        match read(&json) {
            Ok(Some((head, summary))) => {
                assert_eq!(
                    head.object_meta(kind, &summary),
                    super::super::object_meta(v, kind),
                    "{v}"
                );
                assert_eq!(head.changed_at(), super::super::changed_at(v), "{v}");
                assert_eq!(head.running(), sigil_core::audit::running_images(v), "{v}");
                assert_eq!(summary, sigil_core::walker::summarize_value(v), "{v}");
                true
            }
            Ok(None) => {
                assert!(!v.is_object(), "an object read as none: {v}");
                true
            }
            Err(_) => false,
        }
    }

    #[test]
    fn one_pass_reads_what_the_value_path_reads() {
        for v in [
            pod(),
            json!({"metadata": {"name": "bare"}}),
            json!({}),
            json!({"metadata": null, "status": null}),
            json!({"metadata": {"ownerReferences": null, "managedFields": null,
                "name": null}, "status": {"containerStatuses": null}}),
            json!({"metadata": {"name": "esc\\aped\n\u{1F600}", "uid": "\"u\""},
                "status": {"containerStatuses": [{"imageID": "x@sha256:1"}, {"name": "n"}]}}),
            // Shapes the walker passes over as a `Value` reading does.
            json!({"metadata": {"name": 5}}),
            json!({"metadata": []}),
            json!({"metadata": ["by", "position"]}),
            json!([{"metadata": {"name": "an array"}}]),
            json!("a string"),
        ] {
            assert!(agrees(&v), "left to the general path: {v}");
        }
    }

    #[test]
    fn odd_types_are_left_to_the_value_path() {
        for odd in [
            json!({"metadata": {"managedFields": [["2026-01-01T00:00:00Z"]]}}),
            json!({"metadata": {"ownerReferences": {"kind": "x"}}}),
            json!({"metadata": {"uid": 7}}),
            json!({"status": {"containerStatuses": ["app"]}}),
            json!({"status": "Running"}),
            json!({"metadata": {"ownerReferences": [{"controller": "yes"}]}}),
        ] {
            assert!(read(&odd.to_string()).is_err(), "{odd}");
            assert!(!agrees(&odd));
        }
        // A repeated key keeps its last value, as serde_json's Value does.
        let json = r#"{"metadata":{"name":"a","uid":"1","name":"b","uid":"2"}}"#;
        let (head, summary) = read(json).expect("reads").expect("an object");
        let meta = head.object_meta(pod_kind(), &summary);
        assert_eq!((meta.name.as_str(), meta.uid.as_str()), ("b", "2"));
        assert!(read("{\"metadata\":").is_err(), "malformed JSON");
    }
}
