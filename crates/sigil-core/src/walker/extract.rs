//! Image fields named per kind: the policy's `imageExtractors` and the
//! shipped defaults (Tekton, Argo Workflows, the Prometheus operator).
//!
//! Owns the path syntax (`spec.steps[*].image`), its validation, which kinds
//! have extractors (matched on API group and kind, any or one version), and
//! reading the named fields out of the part of an object the walker keeps
//! for custom groups ([`ObjectSummary::custom`]). It does not find pod-shaped
//! images (the walker does that by shape for every kind) nor decide anything
//! about the images it reads. A path that reaches a value of the wrong type
//! is a [`Problem`], never a silent skip; an absent or `null` field is none.

use std::sync::{Arc, LazyLock};

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::{FieldKind, ImageField, ObjectSummary, push_escaped};

/// One kind's image fields, as written in a policy (`imageExtractors[]`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ExtractorSpec {
    /// `group/version`, or `group/*` for every version (`v1` is the core
    /// group, which the walker already covers by shape).
    pub api_version: String,
    /// The kind, as in the object's `kind`.
    pub kind: String,
    /// The resource's plural name for the webhook's rules, when it is not
    /// the kind in lowercase with Kubernetes' plural ending.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource: Option<String>,
    /// Dotted paths to image strings; `[*]` is every item of a list.
    pub paths: Vec<String>,
}

/// A validated extractor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Extractor {
    /// API group (never empty).
    pub group: String,
    /// One version, or `None` for all.
    pub version: Option<String>,
    /// The kind.
    pub kind: String,
    /// Plural resource name, for webhook rules and the audit's lists.
    pub resource: String,
    /// The paths, parsed.
    pub paths: Vec<FieldPath>,
    /// `default` or the policy that says it, for `sigil policy check`.
    pub source: String,
}

/// One parsed path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldPath {
    /// As written.
    pub text: String,
    segs: Vec<Seg>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Seg {
    Key(String),
    Each,
}

impl FieldPath {
    /// Parses `a.b[*].c`: keys separated by dots, each followed by any
    /// number of `[*]`. Only `[*]` indexes: an extractor names every item.
    pub fn parse(text: &str) -> Result<FieldPath, String> {
        let mut segs = Vec::new();
        for part in text.split('.') {
            let (key, mut rest) = part.split_at(part.find('[').unwrap_or(part.len()));
            if key.is_empty() {
                return Err(format!(
                    "path {text:?} has an empty key: write keys separated by '.', e.g. spec.steps[*].image"
                ));
            }
            if key.contains(']') {
                return Err(format!("path {text:?}: unexpected ']' in {key:?}"));
            }
            segs.push(Seg::Key(key.to_owned()));
            while !rest.is_empty() {
                let Some(after) = rest.strip_prefix("[*]") else {
                    return Err(format!(
                        "path {text:?}: {rest:?} is not [*]; an extractor names every item of a list, with [*]"
                    ));
                };
                segs.push(Seg::Each);
                rest = after;
            }
        }
        Ok(FieldPath {
            text: text.to_owned(),
            segs,
        })
    }
}

/// The extractors in force: the defaults, with the policy's on top.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Extractors {
    list: Vec<Extractor>,
}

/// The shipped defaults, as YAML (also the chart's `files/image-extractors.yaml`).
pub const DEFAULTS_YAML: &str = include_str!("extractors.yaml");

static DEFAULTS: LazyLock<Arc<Extractors>> = LazyLock::new(|| {
    let specs: Vec<ExtractorSpec> =
        serde_saphyr::from_str(DEFAULTS_YAML).expect("the shipped extractors parse");
    Arc::new(
        Extractors::default()
            .with(&specs, "default")
            .expect("the shipped extractors are valid"),
    )
});

impl Extractors {
    /// The shipped defaults.
    pub fn defaults() -> Arc<Extractors> {
        DEFAULTS.clone()
    }

    /// These, with `specs` added; one naming a group and kind already here
    /// replaces it. Errors name the entry and say what is wrong.
    pub fn with(&self, specs: &[ExtractorSpec], source: &str) -> Result<Extractors, String> {
        let mut list = self.list.clone();
        let mut seen = Vec::new();
        for (i, s) in specs.iter().enumerate() {
            let e =
                Extractor::compile(s, source).map_err(|e| format!("imageExtractors[{i}]: {e}"))?;
            if seen.contains(&(e.group.clone(), e.kind.clone())) {
                return Err(format!(
                    "imageExtractors[{i}]: {}/{} is listed twice; list each kind once, with all its paths",
                    e.group, e.kind
                ));
            }
            seen.push((e.group.clone(), e.kind.clone()));
            list.retain(|o| !(o.group == e.group && o.kind == e.kind));
            list.push(e);
        }
        Ok(Extractors { list })
    }

    /// These and `other`'s own (not default) extractors, for policies
    /// merged from several documents: two that name the same kind with
    /// different paths conflict.
    pub fn merged(&self, other: &Extractors) -> Result<Extractors, String> {
        let mut list = self.list.clone();
        for e in other.list.iter().filter(|e| e.source != "default") {
            match list
                .iter()
                .position(|o| o.group == e.group && o.kind == e.kind)
            {
                Some(i) if list[i].source != "default" && list[i].paths != e.paths => {
                    return Err(format!(
                        "{} and {} both set imageExtractors for {}/{}, differently; set it in one",
                        list[i].source, e.source, e.group, e.kind
                    ));
                }
                Some(i) => list[i] = e.clone(),
                None => list.push(e.clone()),
            }
        }
        Ok(Extractors { list })
    }

    /// Every extractor in force, in order.
    pub fn list(&self) -> &[Extractor] {
        &self.list
    }

    /// The extractor for an object of `api_version` and `kind`.
    pub fn find(&self, api_version: &str, kind: &str) -> Option<&Extractor> {
        let (group, version) = api_version.rsplit_once('/')?;
        self.list.iter().find(|e| {
            e.kind == kind && e.group == group && e.version.as_deref().is_none_or(|v| v == version)
        })
    }

    /// Adds the fields the matching extractor names to `summary` (after the
    /// ones found by shape, skipping any already there) and its problems;
    /// drops what the walker kept for it either way.
    pub fn apply(&self, summary: &mut ObjectSummary) {
        let Some(custom) = summary.custom.take() else {
            return;
        };
        let (Some(api_version), Some(kind)) = (&summary.api_version, &summary.kind) else {
            return;
        };
        let Some(e) = self.find(api_version, kind) else {
            return;
        };
        let mut out = Found::default();
        for p in &e.paths {
            let mut path = Vec::new();
            walk_map(&custom, &p.segs, &mut path, None, e, p, &mut out);
        }
        for f in out.fields {
            if !summary.fields.iter().any(|g| g.pointer == f.pointer) {
                summary.fields.push(f);
            }
        }
        summary.problems.extend(out.problems);
    }
}

impl Extractor {
    fn compile(s: &ExtractorSpec, source: &str) -> Result<Extractor, String> {
        let Some((group, version)) = s.api_version.split_once('/') else {
            return Err(format!(
                "apiVersion {:?} has no group: the core group's kinds are found by shape already; write group/version or group/*",
                s.api_version
            ));
        };
        if group.is_empty() || version.is_empty() || version.contains('/') {
            return Err(format!(
                "apiVersion {:?} is not group/version or group/*",
                s.api_version
            ));
        }
        if s.kind.is_empty() || !s.kind.chars().all(|c| c.is_ascii_alphanumeric()) {
            return Err(format!("kind {:?} is not a kind's name", s.kind));
        }
        let paths = s
            .paths
            .iter()
            .map(|p| FieldPath::parse(p))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| format!("{}: {e}", s.kind))?;
        let resource = match &s.resource {
            Some(r) if r.is_empty() || r.contains(['/', '*']) || r.to_lowercase() != *r => {
                return Err(format!("resource {r:?} is not a resource's plural name"));
            }
            Some(r) => r.clone(),
            None => plural(&s.kind),
        };
        Ok(Extractor {
            group: group.to_owned(),
            version: (version != "*").then(|| version.to_owned()),
            kind: s.kind.clone(),
            resource,
            paths,
            source: source.to_owned(),
        })
    }

    /// `group/version` or `group/*`, as written.
    pub fn api_version(&self) -> String {
        format!("{}/{}", self.group, self.version.as_deref().unwrap_or("*"))
    }
}

/// Kubernetes' default plural of a kind (what a CRD's `names.plural`
/// usually is): lowercase, then `-es` after s, x, z, ch, sh; `-ies` for a
/// consonant and y; else `-s`.
pub fn plural(kind: &str) -> String {
    let k = kind.to_lowercase();
    let b = k.as_bytes();
    if k.ends_with(['s', 'x', 'z']) || k.ends_with("ch") || k.ends_with("sh") {
        format!("{k}es")
    } else if b.len() > 1 && b[b.len() - 1] == b'y' && !b"aeiou".contains(&b[b.len() - 2]) {
        format!("{}ies", &k[..k.len() - 1])
    } else {
        format!("{k}s")
    }
}

/// A field an extractor names that holds something other than an image
/// string: the object is refused for it, as a wrong path would otherwise
/// let images through unseen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// Where, as a field with the offending value written as JSON.
    pub field: ImageField,
    /// What was found and which extractor expected a string.
    pub what: String,
}

#[derive(Default)]
struct Found {
    fields: Vec<ImageField>,
    problems: Vec<Problem>,
}

fn walk_map(
    map: &Map<String, Value>,
    segs: &[Seg],
    path: &mut Vec<String>,
    name: Option<&str>,
    e: &Extractor,
    p: &FieldPath,
    out: &mut Found,
) {
    let Some((Seg::Key(k), rest)) = segs.split_first() else {
        return;
    };
    let Some(v) = map.get(k) else { return };
    let name = map.get("name").and_then(Value::as_str).or(name);
    path.push(k.clone());
    walk(v, rest, path, name, e, p, out);
    path.pop();
}

fn walk(
    v: &Value,
    segs: &[Seg],
    path: &mut Vec<String>,
    name: Option<&str>,
    e: &Extractor,
    p: &FieldPath,
    out: &mut Found,
) {
    match (segs.first(), v) {
        (_, Value::Null) => {}
        (None, Value::String(s)) => out.fields.push(field(path, name, s.clone())),
        (Some(Seg::Key(_)), Value::Object(m)) => walk_map(m, segs, path, name, e, p, out),
        (Some(Seg::Each), Value::Array(items)) => {
            for (i, item) in items.iter().enumerate() {
                path.push(i.to_string());
                walk(item, &segs[1..], path, name, e, p, out);
                path.pop();
            }
        }
        (want, v) => {
            let want = match want {
                None => "an image string",
                Some(Seg::Key(_)) => "a map",
                Some(Seg::Each) => "a list",
            };
            let mut text = v.to_string();
            if text.len() > 80 {
                let mut cut = 77;
                while !text.is_char_boundary(cut) {
                    cut -= 1;
                }
                text.truncate(cut);
                text.push_str("...");
            }
            let f = field(path, name, text);
            out.problems.push(Problem {
                what: format!(
                    "{} holds {}, where imageExtractors ({} {}: {}) expects {want}",
                    f.dotted(),
                    type_name(v),
                    e.api_version(),
                    e.kind,
                    p.text
                ),
                field: f,
            });
        }
    }
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "a map",
    }
}

fn field(path: &[String], name: Option<&str>, value: String) -> ImageField {
    let pointer = path.iter().fold(String::new(), |mut acc, s| {
        acc.push('/');
        push_escaped(&mut acc, s);
        acc
    });
    ImageField {
        pointer,
        path: path.to_vec(),
        kind: FieldKind::Extracted,
        name: name.map(str::to_owned),
        value,
    }
}

#[cfg(test)]
mod tests;
