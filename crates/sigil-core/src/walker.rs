//! Finds every image field in any Kubernetes object.
//!
//! Owns the list of places images live: `containers`, `initContainers`,
//! `ephemeralContainers` and image volumes, under every pod-spec location a
//! workload can have (`spec`, `spec.template.spec`,
//! `spec.jobTemplate.spec.template.spec`, and PodTemplate's `template.spec`).
//! It goes by shape, not by kind, so CRDs and Knative sources with the same
//! paths are covered. It does not decide anything about the images it finds.

use std::ops::Not as _;

use serde_json::Value;

use leaves::{Key, Str};
use path::Seg;
pub use path::{escape_token, push_escaped};

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
    /// A field an image extractor names (`spec.steps[].image`).
    Extracted,
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
            FieldKind::Extracted => {
                return match &self.name {
                    Some(n) => format!("{} ({n:?})", self.dotted()),
                    None => self.dotted(),
                };
            }
        };
        match &self.name {
            Some(n) => format!("{what} {n:?}"),
            None => format!("{what} at {}", self.dotted()),
        }
    }

    /// `spec.containers[0].image` form, as kubectl prints field paths.
    pub fn dotted(&self) -> String {
        let mut s = String::new();
        self.write_dotted(&mut s);
        s
    }

    /// Appends [`Self::dotted`] to `out` (the hot path builds one line of
    /// several fields without a `String` per field).
    pub fn write_dotted(&self, out: &mut String) {
        let start = out.len();
        for seg in &self.path {
            if seg.bytes().all(|b| b.is_ascii_digit()) && !seg.is_empty() {
                out.push('[');
                out.push_str(seg);
                out.push(']');
            } else {
                if out.len() > start {
                    out.push('.');
                }
                out.push_str(seg);
            }
        }
    }
}

/// What the walker learns about an object in one pass.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ObjectSummary {
    /// Every image field, ordered by location (`spec` before templates),
    /// then init, regular, ephemeral containers, then volumes, then index.
    pub fields: Vec<ImageField>,
    /// `kind`, if a string.
    pub kind: Option<String>,
    /// `apiVersion`, if a string.
    pub api_version: Option<String>,
    /// The object's top-level fields beside `apiVersion`, `kind`,
    /// `metadata` and `status`, kept only for a custom group (or an object
    /// whose `apiVersion` comes after them), for [`Extractors::apply`];
    /// `None` once applied.
    pub custom: Option<serde_json::Map<String, Value>>,
    /// Fields an extractor names that hold no image string.
    pub problems: Vec<extract::Problem>,
    /// `metadata.name`.
    pub name: Option<String>,
    /// `metadata.generateName`.
    pub generate_name: Option<String>,
    /// `metadata.namespace`.
    pub namespace: Option<String>,
    /// The pod spec's `imagePullSecrets` names.
    pub pull_secrets: Vec<String>,
    /// The pod spec's `serviceAccountName` (or deprecated `serviceAccount`).
    pub service_account: Option<String>,
    /// `metadata.deletionTimestamp` is set (not null).
    pub terminating: bool,
}

/// Every image field in `obj` (see [`ObjectSummary::fields`] for the order).
/// Values of unexpected types are skipped, never an error: the API server
/// validates built-in kinds, and a CRD may use these names for other things.
pub fn image_fields(obj: &Value) -> Vec<ImageField> {
    summarize_value(obj).fields
}

/// What a caller reads of an object beside the images, in the walker's
/// one pass over it: offered each key the walker itself does not read at
/// the object's root and in its `metadata`, it takes the value
/// (`a.next_value()`, answering `true`) or leaves it to be skipped
/// (`false`). An error it returns ends the walk (the caller then reads
/// the object another way). The audit reads identity and status so
/// (`sigil_kube::audit`), instead of a second pass over each object.
pub trait Beside<'de> {
    /// A key at the object's root (`status`, …).
    fn root<A: serde::de::MapAccess<'de>>(
        &mut self,
        key: &str,
        a: &mut A,
    ) -> Result<bool, A::Error>;
    /// A key in `metadata` other than `name`, `generateName`,
    /// `namespace` and `deletionTimestamp` (`uid`, `ownerReferences`, …).
    fn metadata<A: serde::de::MapAccess<'de>>(
        &mut self,
        key: &str,
        a: &mut A,
    ) -> Result<bool, A::Error>;
}

/// Reads nothing beside the images.
impl<'de> Beside<'de> for () {
    fn root<A: serde::de::MapAccess<'de>>(&mut self, _: &str, _: &mut A) -> Result<bool, A::Error> {
        Ok(false)
    }
    fn metadata<A: serde::de::MapAccess<'de>>(
        &mut self,
        _: &str,
        _: &mut A,
    ) -> Result<bool, A::Error> {
        Ok(false)
    }
}

/// Walks a parsed object.
pub fn summarize_value(obj: &Value) -> ObjectSummary {
    // `&Value` deserializes infallibly for our lenient visitor.
    summarize_from(obj).unwrap_or_default()
}

/// Walks an object from any serde deserializer (a parsed manifest's tree:
/// `manifest::NodeRef`); `Err` only when the deserializer fails.
pub fn summarize_from<'de, D: serde::Deserializer<'de>>(d: D) -> Result<ObjectSummary, D::Error> {
    let mut w = Walker::default();
    serde::de::DeserializeSeed::deserialize(
        Seed {
            w: &mut w,
            b: &mut (),
            node: Node::Root,
        },
        d,
    )?;
    Ok(w.finish())
}

/// Walks an object straight from JSON text, without building a tree: only
/// image strings and a few metadata fields are allocated. `Err` only for
/// malformed JSON.
pub fn summarize_json(json: &str) -> Result<ObjectSummary, serde_json::Error> {
    summarize_json_with(json, &mut ()).map(Option::unwrap_or_default)
}

/// [`summarize_json`] with `beside` reading what else the caller needs in
/// the same pass; `Ok(None)` when the JSON is not an object.
pub fn summarize_json_with<'de, B: Beside<'de>>(
    json: &'de str,
    beside: &mut B,
) -> Result<Option<ObjectSummary>, serde_json::Error> {
    let mut w = Walker::default();
    let mut de = serde_json::Deserializer::from_str(json);
    serde::de::DeserializeSeed::deserialize(
        Seed {
            w: &mut w,
            b: beside,
            node: Node::Root,
        },
        &mut de,
    )?;
    de.end()?;
    Ok(w.object.then(|| w.finish()))
}

#[derive(Debug, Default)]
struct Walker {
    /// Where the walker is: the keys it descends into are its own table's
    /// (`spec`, `containers`, …) and list indices, so a step costs no
    /// allocation; the strings are made only for a field found.
    path: Vec<Seg>,
    /// `volumes[].image.reference`, handed up from the nested map.
    pending: Option<String>,
    found: Vec<(u8, ImageField)>,
    summary: ObjectSummary,
    /// The root was a map (an object), not a scalar or a sequence.
    object: bool,
    /// Whether the `apiVersion` read is a custom group's, decided once
    /// when it is read (asked of every root key).
    custom_group: Option<bool>,
}

impl Walker {
    /// Whether the object's other top-level fields are kept for the image
    /// extractors: for a custom group (a CRD's group has a dot and is not a
    /// `*.k8s.io` one), or while `apiVersion` is not known yet.
    fn keeps_custom(&self) -> bool {
        self.custom_group.unwrap_or(true)
    }

    fn finish(mut self) -> ObjectSummary {
        if !self.summary.api_version.as_deref().is_some_and(is_custom) {
            self.summary.custom = None;
        }
        // Stable: document order within one (location, kind) group.
        self.found.sort_by_key(|(rank, _)| *rank);
        self.summary.fields = self.found.into_iter().map(|(_, f)| f).collect();
        self.summary
    }
}

/// Whether `api_version` is a custom resource's group (which has a dot and
/// is not one of Kubernetes' own `*.k8s.io` groups).
fn is_custom(api_version: &str) -> bool {
    api_version
        .rsplit_once('/')
        .is_some_and(|(g, _)| g.contains('.') && !g.ends_with(".k8s.io") && g != "k8s.io")
}

/// Where in the object the walker is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Node {
    Root,
    Metadata,
    /// `spec`: a pod spec that may also hold `template` / `jobTemplate`.
    TopSpec,
    /// `template` (holds `spec`): rank of the pod spec inside.
    Template(u8),
    JobTemplate,
    JobSpec,
    /// A pod spec, with its location rank (index into [`POD_SPEC_PATHS`]).
    PodSpec(u8),
    List(u8, FieldKind),
    Item(u8, FieldKind),
    VolumeImage,
    Skip,
}

struct Seed<'w, B> {
    w: &'w mut Walker,
    b: &'w mut B,
    node: Node,
}

impl<'de, B: Beside<'de>> serde::de::DeserializeSeed<'de> for Seed<'_, B> {
    type Value = ();
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        if self.node == Node::Skip {
            return d.deserialize_ignored_any(serde::de::IgnoredAny).map(|_| ());
        }
        d.deserialize_any(self)
    }
}

impl Node {
    /// The key that leads to this node from its parent: the table in
    /// `visit_map` read backwards. `None` for the nodes no key leads to by
    /// itself (the root, a list item, a skipped value).
    fn key(self) -> Option<&'static str> {
        Some(match self {
            Node::Metadata => "metadata",
            Node::TopSpec | Node::JobSpec | Node::PodSpec(_) => "spec",
            Node::Template(_) => "template",
            Node::JobTemplate => "jobTemplate",
            Node::List(_, FieldKind::InitContainer) => "initContainers",
            Node::List(_, FieldKind::Container) => "containers",
            Node::List(_, FieldKind::EphemeralContainer) => "ephemeralContainers",
            Node::List(_, FieldKind::ImageVolume) => "volumes",
            Node::VolumeImage => "image",
            Node::List(_, FieldKind::Extracted) | Node::Root | Node::Item(..) | Node::Skip => {
                return None;
            }
        })
    }

    /// The path step into this node, reached by key `k`.
    fn step(self, k: &str) -> Seg {
        debug_assert_eq!(
            self.key(),
            Some(k),
            "the walker's table and Node::key disagree"
        );
        match self.key() {
            Some(key) if key == k => Seg::Key(key),
            _ => Seg::Other(k.to_owned()),
        }
    }
}

fn kind_of(key: &str) -> Option<FieldKind> {
    Some(match key {
        "initContainers" => FieldKind::InitContainer,
        "containers" => FieldKind::Container,
        "ephemeralContainers" => FieldKind::EphemeralContainer,
        "volumes" => FieldKind::ImageVolume,
        _ => return None,
    })
}

fn kind_rank(k: FieldKind) -> u8 {
    match k {
        FieldKind::InitContainer => 0,
        FieldKind::Container => 1,
        FieldKind::EphemeralContainer => 2,
        FieldKind::ImageVolume => 3,
        FieldKind::Extracted => 4,
    }
}

impl<'de, B: Beside<'de>> serde::de::Visitor<'de> for Seed<'_, B> {
    type Value = ();
    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("any value")
    }
    fn visit_str<E>(self, _: &str) -> Result<(), E> {
        Ok(())
    }
    fn visit_bytes<E>(self, _: &[u8]) -> Result<(), E> {
        Ok(())
    }
    fn visit_bool<E>(self, _: bool) -> Result<(), E> {
        Ok(())
    }
    fn visit_i64<E>(self, _: i64) -> Result<(), E> {
        Ok(())
    }
    fn visit_u64<E>(self, _: u64) -> Result<(), E> {
        Ok(())
    }
    fn visit_f64<E>(self, _: f64) -> Result<(), E> {
        Ok(())
    }
    fn visit_unit<E>(self) -> Result<(), E> {
        Ok(())
    }
    fn visit_none<E>(self) -> Result<(), E> {
        Ok(())
    }
    fn visit_some<D: serde::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut a: A) -> Result<(), A::Error> {
        let Node::List(rank, kind) = self.node else {
            while a.next_element::<serde::de::IgnoredAny>()?.is_some() {}
            return Ok(());
        };
        let mut i = 0usize;
        loop {
            self.w.path.push(Seg::Index(i));
            let more = a
                .next_element_seed(Seed {
                    w: &mut *self.w,
                    b: &mut *self.b,
                    node: Node::Item(rank, kind),
                })?
                .is_some();
            self.w.path.pop();
            if !more {
                return Ok(());
            }
            i += 1;
        }
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut a: A) -> Result<(), A::Error> {
        let (w, b) = (self.w, self.b);
        w.object |= self.node == Node::Root;
        let mut name: Option<String> = None;
        let mut image: Option<String> = None;
        while let Some(Key(k)) = a.next_key::<Key<'de>>()? {
            let child = match (self.node, k.as_ref()) {
                (Node::Root, "kind") => {
                    w.summary.kind = a.next_value_seed(Str)?;
                    continue;
                }
                (Node::Root, "apiVersion") => {
                    w.summary.api_version = a.next_value_seed(Str)?;
                    w.custom_group = w.summary.api_version.as_deref().map(is_custom);
                    continue;
                }
                (Node::Root, key) if key != "metadata" && key != "status" && w.keeps_custom() => {
                    let v = a.next_value::<Value>()?;
                    if matches!(key, "spec" | "template") {
                        let node = if key == "spec" {
                            Node::TopSpec
                        } else {
                            Node::Template(3)
                        };
                        w.path.push(node.step(key));
                        let r = serde::de::DeserializeSeed::deserialize(
                            Seed {
                                w: &mut *w,
                                b: &mut (),
                                node,
                            },
                            &v,
                        );
                        w.path.pop();
                        r.map_err(serde::de::Error::custom)?;
                    }
                    w.summary
                        .custom
                        .get_or_insert_with(Default::default)
                        .insert(key.to_owned(), v);
                    continue;
                }
                (Node::Metadata, "name") => {
                    w.summary.name = a.next_value_seed(Str)?;
                    continue;
                }
                (Node::Metadata, "generateName") => {
                    w.summary.generate_name = a.next_value_seed(Str)?;
                    continue;
                }
                (Node::Metadata, "namespace") => {
                    w.summary.namespace = a.next_value_seed(Str)?;
                    continue;
                }
                (Node::Metadata, "deletionTimestamp") => {
                    w.summary.terminating = a.next_value::<serde_json::Value>()?.is_null().not();
                    continue;
                }
                (Node::TopSpec | Node::PodSpec(_), "serviceAccountName") => {
                    if let Some(sa) = a.next_value_seed(Str)?.filter(|s| !s.is_empty()) {
                        w.summary.service_account = Some(sa);
                    }
                    continue;
                }
                // Deprecated alias, used only when serviceAccountName is absent.
                (Node::TopSpec | Node::PodSpec(_), "serviceAccount") => {
                    if let Some(sa) = a.next_value_seed(Str)?.filter(|s| !s.is_empty()) {
                        w.summary.service_account.get_or_insert(sa);
                    }
                    continue;
                }
                (Node::TopSpec | Node::PodSpec(_), "imagePullSecrets") => {
                    let v = a.next_value::<serde_json::Value>()?;
                    w.summary.pull_secrets.extend(
                        v.as_array()
                            .into_iter()
                            .flatten()
                            .filter_map(|s| s.get("name")?.as_str())
                            .filter(|n| !n.is_empty())
                            .map(str::to_owned),
                    );
                    continue;
                }
                (Node::Item(_, FieldKind::ImageVolume), "name") | (Node::Item(..), "name") => {
                    name = a.next_value_seed(Str)?;
                    continue;
                }
                (Node::Item(_, FieldKind::ImageVolume), "image") => Node::VolumeImage,
                (Node::Item(..), "image") => {
                    image = a.next_value_seed(Str)?;
                    continue;
                }
                (Node::VolumeImage, "reference") => {
                    w.pending = a.next_value_seed(Str)?;
                    continue;
                }
                (Node::Root, "metadata") => Node::Metadata,
                (Node::Root, "spec") => Node::TopSpec,
                (Node::Root, "template") => Node::Template(3),
                (Node::TopSpec, "template") => Node::Template(1),
                (Node::TopSpec, "jobTemplate") => Node::JobTemplate,
                (Node::JobTemplate, "spec") => Node::JobSpec,
                (Node::JobSpec, "template") => Node::Template(2),
                (Node::Template(r), "spec") => Node::PodSpec(r),
                (Node::TopSpec, key) => kind_of(key).map_or(Node::Skip, |kind| Node::List(0, kind)),
                (Node::PodSpec(r), key) => {
                    kind_of(key).map_or(Node::Skip, |kind| Node::List(r, kind))
                }
                _ => Node::Skip,
            };
            if child == Node::Skip {
                let taken = match self.node {
                    Node::Root => b.root(&k, &mut a)?,
                    Node::Metadata => b.metadata(&k, &mut a)?,
                    _ => false,
                };
                if !taken {
                    a.next_value::<serde::de::IgnoredAny>()?;
                }
                continue;
            }
            w.path.push(child.step(&k));
            let r = a.next_value_seed(Seed {
                w: &mut *w,
                b: &mut *b,
                node: child,
            });
            w.path.pop();
            r?;
            if child == Node::VolumeImage {
                image = w.pending.take();
            }
        }
        if let (Node::Item(rank, kind), Some(value)) = (self.node, image) {
            let mut path = Vec::with_capacity(w.path.len() + 2);
            path.extend(w.path.iter().map(Seg::to_owned_string));
            path.push("image".to_owned());
            let mut pointer = String::with_capacity(64);
            for s in &w.path {
                s.push_pointer(&mut pointer);
            }
            pointer.push_str("/image");
            if kind == FieldKind::ImageVolume {
                path.push("reference".to_owned());
                pointer.push_str("/reference");
            }
            w.found.push((
                rank * 5 + kind_rank(kind),
                ImageField {
                    pointer,
                    path,
                    kind,
                    name,
                    value,
                },
            ));
        }
        Ok(())
    }
}

mod leaves;
mod path;
#[cfg(test)]
mod tests;
mod walked;

pub mod extract;
pub use extract::{Extractor, ExtractorSpec, Extractors, FieldPath};
pub use walked::Walked;
