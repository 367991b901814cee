//! One listed object as the audit reads it, straight from the list page's
//! JSON text: the few metadata and status fields the audit needs
//! ([`Head`]), read without building a `serde_json::Value` of the object
//! (the image fields come from the walker's own pass over the same text,
//! `sigil_core::walker::summarize_json`, as in the webhook).
//!
//! Why: building a `Value` per object (and dropping it) was the largest
//! part of an audit's CPU after the registry lookups (docs/benchmarks.md,
//! issue 27). A field of an unexpected type makes [`Head::read`] answer
//! `None`, and the caller reads that object the general way (a `Value`),
//! so an odd object is audited exactly as before. It owns no decision.

use std::borrow::Cow;
use std::marker::PhantomData;
use std::time::SystemTime;

use serde::{Deserialize, Deserializer};
use sigil_core::audit::{Running, STATUS_LISTS};

use super::kinds::Kind;
use super::report::ObjectMeta;

/// What the audit reads of an object besides its images.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct Head<'a> {
    #[serde(borrow)]
    metadata: Option<Obj<Meta<'a>>>,
    #[serde(borrow)]
    status: Option<Obj<Status<'a>>>,
}

type Text<'a> = Option<Cow<'a, str>>;

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

#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
struct Meta<'a> {
    #[serde(borrow)]
    name: Text<'a>,
    #[serde(borrow)]
    namespace: Text<'a>,
    #[serde(borrow)]
    uid: Text<'a>,
    #[serde(borrow)]
    resource_version: Text<'a>,
    #[serde(borrow)]
    creation_timestamp: Text<'a>,
    #[serde(borrow)]
    owner_references: Option<Vec<Obj<Owner<'a>>>>,
    #[serde(borrow)]
    managed_fields: Option<Vec<Obj<Managed<'a>>>>,
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
    /// Reads `json` (one object); `None` when a field the audit reads has an
    /// unexpected type (or a key is repeated): read it as a `Value` instead.
    pub fn read(json: &'a str) -> Option<Head<'a>> {
        serde_json::from_str::<Obj<Head<'a>>>(json)
            .ok()
            .map(|h| h.0)
    }

    fn meta(&self) -> Option<&Meta<'a>> {
        self.metadata.as_ref().map(|m| &m.0)
    }

    /// The object's identity in the report.
    pub fn object_meta(&self, kind: &Kind) -> ObjectMeta {
        let m = self.meta();
        let field = |f: for<'m> fn(&'m Meta<'a>) -> &'m Text<'a>| {
            m.map(|m| text(f(m)).to_owned()).unwrap_or_default()
        };
        let owner = m
            .and_then(|m| m.owner_references.as_ref())
            .and_then(|refs| {
                refs.iter()
                    .map(|r| &r.0)
                    .find(|r| r.controller == Some(true))
            })
            .map(|r| format!("{}/{}", text(&r.kind), text(&r.name)));
        ObjectMeta {
            namespace: field(|m| &m.namespace),
            kind: kind.kind.to_owned(),
            name: field(|m| &m.name),
            uid: field(|m| &m.uid),
            api_version: kind.api_resource().api_version,
            resource_version: field(|m| &m.resource_version),
            owner,
        }
    }

    /// As [`super::changed_at`]: the latest of `creationTimestamp` and the
    /// times of `managedFields` entries that are not a subresource's.
    pub fn changed_at(&self) -> Option<SystemTime> {
        let m = self.meta()?;
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

    /// The typed reading equals the general (`Value`) one, field by field.
    #[track_caller]
    fn agrees(v: &Value) {
        let json = v.to_string();
        let head = Head::read(&json).expect("typed reading");
        let kind = super::super::kinds::ALL
            .iter()
            .find(|k| k.kind == "Pod")
            .expect("Pod");
        assert_eq!(head.object_meta(kind), super::super::object_meta(v, kind));
        assert_eq!(head.changed_at(), super::super::changed_at(v));
        assert_eq!(head.running(), sigil_core::audit::running_images(v));
    }

    #[test]
    fn typed_head_reads_what_the_value_path_reads() {
        agrees(&pod());
        agrees(&json!({"metadata": {"name": "bare"}}));
        agrees(&json!({}));
        agrees(&json!({"metadata": null, "status": null}));
        agrees(
            &json!({"metadata": {"ownerReferences": null, "managedFields": null,
            "name": null}, "status": {"containerStatuses": null}}),
        );
        agrees(&json!({"metadata": {"name": "esc\\aped\n\u{1F600}"},
            "status": {"containerStatuses": [{"imageID": "x@sha256:1"}, {"name": "n"}]}}));
    }

    #[test]
    fn odd_types_are_left_to_the_value_path() {
        for odd in [
            json!({"metadata": {"name": 5}}),
            json!({"metadata": []}),
            json!({"metadata": ["by", "position"]}),
            json!([{"metadata": {"name": "an array"}}]),
            json!({"metadata": {"managedFields": [["2026-01-01T00:00:00Z"]]}}),
            json!({"metadata": {"ownerReferences": {"kind": "x"}}}),
            json!({"status": {"containerStatuses": ["app"]}}),
            json!({"metadata": {"ownerReferences": [{"controller": "yes"}]}}),
        ] {
            assert!(Head::read(&odd.to_string()).is_none(), "{odd}");
        }
        // A repeated key: serde_json's Value keeps the last; the typed
        // reading refuses, so the general path decides.
        assert!(Head::read(r#"{"metadata":{"name":"a","name":"b"}}"#).is_none());
    }
}
