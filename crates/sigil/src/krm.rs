//! `sigil krm`: the pin pipeline as a KRM function (kpt, kustomize).
//!
//! Owns the KRM Functions Specification side: reading a
//! `config.kubernetes.io/v1` ResourceList, choosing the policy from its
//! `functionConfig`, and writing the list back with images pinned and a
//! `results` entry per denial or warning. Items are edited in place in the
//! input text (like `sigil pin --write`), so every annotation the
//! orchestrator relies on (`config.kubernetes.io/*`,
//! `internal.config.kubernetes.io/*`) and every comment survive byte for
//! byte. Decisions come from [`crate::pin`]; this module only adapts.

use serde::Serialize;
use serde_json::Value;
use sigil_core::manifest::{self, Document, NodeRef};
use sigil_core::{DigestResolver, Policy};

use crate::engine::Engine;
use crate::pin::{self, ImageReport, PinOptions, Status, Target};

/// Why a ResourceList could not be processed at all.
#[derive(Debug, thiserror::Error)]
pub enum KrmError {
    /// stdin is not YAML.
    #[error("reading the ResourceList: {0}")]
    Manifest(#[from] manifest::ManifestError),
    /// stdin is YAML, but not one `config.kubernetes.io/v1` ResourceList.
    #[error("{0}")]
    NotAResourceList(String),
}

/// A parsed ResourceList, kept with its text for in-place edits.
#[derive(Debug)]
pub struct ResourceList {
    text: String,
    doc: Document,
    /// The list as JSON, for `functionConfig` and the items' annotations
    /// (the pipeline itself reads the items from `doc`'s tree).
    value: Value,
}

impl ResourceList {
    /// Parses stdin.
    pub fn parse(text: String) -> Result<ResourceList, KrmError> {
        let mut docs = manifest::parse_stream(&text)?;
        if docs.len() != 1 {
            return Err(KrmError::NotAResourceList(format!(
                "expected one ResourceList document on stdin, got {}",
                docs.len()
            )));
        }
        let doc = docs.remove(0);
        let value = doc.to_value();
        let kind = value.get("kind").and_then(Value::as_str);
        if kind != Some("ResourceList") {
            return Err(KrmError::NotAResourceList(format!(
                "expected kind ResourceList (config.kubernetes.io/v1) on stdin, got {}",
                kind.map_or_else(|| "no kind".to_owned(), |k| format!("kind {k:?}"))
            )));
        }
        Ok(ResourceList { text, doc, value })
    }

    /// The policy `functionConfig` carries: an ImagePolicy, or a ConfigMap
    /// whose `data.policy` holds one. `Ok(None)` when there is none (or an
    /// empty ConfigMap, which is what kpt sends for `fn eval` without config).
    pub fn policy(&self) -> Result<Option<Policy>, String> {
        let Some(fc) = self.value.get("functionConfig").filter(|v| !v.is_null()) else {
            return Ok(None);
        };
        match fc.get("kind").and_then(Value::as_str) {
            Some(sigil_core::policy::KIND) => Policy::from_json_value(fc.clone())
                .map(Some)
                .map_err(|e| format!("functionConfig (ImagePolicy): {e}")),
            Some("ConfigMap") => match fc.pointer("/data/policy") {
                Some(Value::String(text)) => Policy::from_documents_at(text, Some(crate::engine::unix_now()))
                    .map(Some)
                    .map_err(|e| format!("functionConfig ConfigMap data.policy: {e}")),
                Some(_) => Err("functionConfig ConfigMap data.policy must be a string holding an ImagePolicy".into()),
                None if fc.pointer("/data").is_none_or(|d| d.as_object().is_none_or(|m| m.is_empty())) => Ok(None),
                None => Err("functionConfig ConfigMap has data but no data.policy key; put the ImagePolicy YAML under data.policy".into()),
            },
            None if fc.as_object().is_some_and(|m| m.is_empty()) => Ok(None),
            other => Err(format!(
                "functionConfig must be an ImagePolicy (sigil.dev/v1alpha1) or a ConfigMap with data.policy, not {}",
                other.map_or_else(|| "an object without kind".to_owned(), |k| format!("kind {k:?}"))
            )),
        }
    }

    /// The ResourceList unchanged except for one error result (bad config).
    pub fn fail(&self, message: String) -> KrmOutput {
        let results = vec![KrmResult {
            message,
            severity: "error",
            resource_ref: None,
            field: None,
            file: None,
        }];
        KrmOutput {
            text: with_results(&self.text, &self.value, &results),
            failed: true,
        }
    }

    /// Runs the pipeline over `items`.
    pub async fn process<R: DigestResolver>(
        &self,
        engine: &Engine<R>,
        opts: &PinOptions,
    ) -> KrmOutput {
        let items = self
            .value
            .get("items")
            .and_then(Value::as_array)
            .map(Vec::as_slice)
            .unwrap_or_default();
        let targets = self
            .doc
            .root()
            .get("items")
            .and_then(NodeRef::items)
            .into_iter()
            .flatten()
            .enumerate()
            .map(|(i, object)| Target {
                prefix: vec!["items".to_owned(), i.to_string()],
                object,
                item: Some(i),
            })
            .collect();
        let decided = pin::decide_targets(engine, &self.text, &self.doc, targets, opts).await;
        let pinned = match pin::finish(&self.text, decided) {
            Ok(p) => p,
            Err(e) => return self.fail(format!("cannot edit the resources in place: {e}")),
        };
        let results: Vec<KrmResult> = pinned
            .decided
            .images
            .iter()
            .filter_map(|r| result_for(r, items))
            .collect();
        let text = if results.is_empty() {
            pinned.text
        } else {
            match manifest::parse_stream(&pinned.text) {
                Ok(docs) if docs.len() == 1 => {
                    with_results(&pinned.text, &docs[0].to_value(), &results)
                }
                _ => {
                    return self
                        .fail("internal error: the edited ResourceList no longer parses".into());
                }
            }
        };
        // An error result — a denial, or the list could not be written back.
        let failed = results.iter().any(|r| r.severity == "error") || has_error(&text);
        KrmOutput { text, failed }
    }
}

/// What to write to stdout, and whether to exit non-zero.
#[derive(Debug)]
pub struct KrmOutput {
    /// The ResourceList.
    pub text: String,
    /// Some result has severity `error`.
    pub failed: bool,
}

/// One entry of `results`, as the KRM Functions Specification defines it.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct KrmResult {
    message: String,
    severity: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    resource_ref: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    field: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    file: Option<Value>,
}

impl KrmResult {
    /// A result of severity `warning` with only a message.
    pub fn warning(message: impl Into<String>) -> KrmResult {
        KrmResult {
            message: message.into(),
            severity: "warning",
            resource_ref: None,
            field: None,
            file: None,
        }
    }
}

fn annotation<'a>(obj: &'a Value, keys: &[&str]) -> Option<&'a str> {
    let ann = obj.pointer("/metadata/annotations")?;
    keys.iter()
        .find_map(|k| ann.get(*k).and_then(Value::as_str))
}

fn result_for(r: &ImageReport, items: &[Value]) -> Option<KrmResult> {
    let severity = match r.status {
        Status::Denied => "error",
        Status::Warning | Status::NeedsRegistry => "warning",
        // Pinned or kept with something to know (a mirror fallback): a warning.
        Status::Ok | Status::Pinned | Status::Rewritten if r.message.is_some() => "warning",
        Status::Ok | Status::Pinned | Status::Rewritten => return None,
    };
    let obj = r.item.and_then(|i| items.get(i));
    let mut resource_ref = serde_json::json!({
        "apiVersion": r.api_version,
        "kind": r.object.kind,
        "name": r.object.name,
    });
    if !r.object.namespace.is_empty() {
        resource_ref["namespace"] = Value::String(r.object.namespace.clone());
    }
    let file = obj.and_then(|o| {
        let path = annotation(
            o,
            &[
                "internal.config.kubernetes.io/path",
                "config.kubernetes.io/path",
            ],
        )?;
        let mut f = serde_json::json!({ "path": path });
        if let Some(i) = annotation(
            o,
            &[
                "internal.config.kubernetes.io/index",
                "config.kubernetes.io/index",
            ],
        )
        .and_then(|i| i.parse::<u64>().ok())
        {
            f["index"] = i.into();
        }
        Some(f)
    });
    let mut field = serde_json::json!({ "path": r.field, "currentValue": r.image });
    if let Some(new) = &r.new {
        field["proposedValue"] = Value::String(new.clone());
    }
    Some(KrmResult {
        message: r.message.clone().unwrap_or_default(),
        severity,
        resource_ref: Some(resource_ref),
        field: Some(field),
        file,
    })
}

/// Adds `results` to the list. A block-style list gets one `results:` line
/// appended (JSON flow inside, which is YAML), leaving the rest byte-exact —
/// but only when the result parses back to exactly the list plus its
/// results; otherwise (a flow or indented root, a `---` with nothing after
/// it, an existing `results`, a `...` end marker) the list is written again
/// as block YAML, else as JSON, whichever parses back to it first. If none
/// does (a key longer than YAML's 1,024-character simple-key limit once
/// escaped), the output is a ResourceList carrying only the results and an
/// error saying why: it always parses, and the orchestrator fails.
pub fn with_results(text: &str, list: &Value, results: &[KrmResult]) -> String {
    let results_json = serde_json::to_string(results).unwrap_or_else(|_| "[]".into());
    let mut expected = list.clone();
    if let Some(m) = expected.as_object_mut() {
        m.insert(
            "results".into(),
            serde_json::from_str(&results_json).unwrap_or(Value::Null),
        );
    }
    let parses_back = |out: &str| {
        manifest::parse_stream(out)
            .is_ok_and(|docs| docs.len() == 1 && docs[0].to_value() == expected)
    };
    let first = text
        .lines()
        .map(str::trim_start)
        .find(|l| !l.is_empty() && !l.starts_with('#') && !l.starts_with("%") && *l != "---");
    let block = first.is_some_and(|l| !l.starts_with('{'))
        && list.get("results").is_none()
        && !text.trim_end().ends_with("...");
    if block {
        let mut out = text.to_owned();
        if !out.ends_with('\n') {
            out.push('\n');
        }
        out.push_str("results: ");
        out.push_str(&results_json);
        out.push('\n');
        if parses_back(&out) {
            return out;
        }
    }
    let yaml = serde_saphyr::to_string(&expected).ok();
    let json = serde_json::to_string_pretty(&expected).ok().map(|mut s| {
        s.push('\n');
        s
    });
    for out in [yaml, json].into_iter().flatten() {
        if parses_back(&out) {
            return out;
        }
    }
    let mut all: Vec<Value> = serde_json::from_str(&results_json).unwrap_or_default();
    all.push(serde_json::json!({
        "message": "sigil cannot write this ResourceList back as YAML that parses (a key longer than YAML allows once escaped); nothing was changed",
        "severity": "error",
    }));
    let minimal = serde_json::json!({
        "apiVersion": "config.kubernetes.io/v1",
        "kind": "ResourceList",
        "items": [],
        "results": all,
    });
    let mut s = serde_json::to_string_pretty(&minimal).unwrap_or_default();
    s.push('\n');
    s
}

/// Whether `out` carries an error result (the orchestrator then fails).
fn has_error(out: &str) -> bool {
    manifest::parse_stream(out).is_ok_and(|docs| {
        docs.first()
            .and_then(|d| d.to_value()["results"].as_array().cloned())
            .unwrap_or_default()
            .iter()
            .any(|r| r["severity"] == "error")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Appends a warning result and requires the output to parse as one
    /// document: the list unchanged plus the result.
    fn round_trips(text: &str) {
        let Ok(docs) = manifest::parse_stream(text) else {
            return;
        };
        let [doc] = docs.as_slice() else { return };
        let value = doc.to_value();
        if !value.is_object() {
            return;
        }
        let out = with_results(text, &value, &[KrmResult::warning("w")]);
        let back = manifest::parse_stream(&out)
            .unwrap_or_else(|e| panic!("output does not parse ({e}):\n{out}"));
        assert_eq!(back.len(), 1, "{out}");
        let mut want = value;
        want["results"] = serde_json::json!([{"message": "w", "severity": "warning"}]);
        assert_eq!(back[0].to_value(), want, "{out}");
    }

    /// Found by the `manifest` fuzz target: a ~1,000-character key full of
    /// tabs parses as written, but not once JSON escapes it past YAML's
    /// 1,024-character simple-key limit. The output still parses, as block
    /// YAML or, failing that, a list with an error result.
    #[test]
    fn a_key_too_long_once_escaped_still_gives_output_that_parses() {
        let key = format!("k{}", "\t".repeat(600));
        let text = format!("{key}: v\nkind: ResourceList\n");
        let Ok(docs) = manifest::parse_stream(&text) else {
            return;
        };
        let out = with_results(&text, &docs[0].to_value(), &[KrmResult::warning("w")]);
        let back = manifest::parse_stream(&out).expect("output parses");
        assert_eq!(back.len(), 1);
        let results = back[0].to_value()["results"]
            .as_array()
            .cloned()
            .expect("results");
        assert!(results.iter().any(|r| r["message"] == "w"), "{out}");
    }

    /// Only-warning results once produced invalid YAML with exit 0 for a
    /// flow-mapping root, an indented root mapping, and a trailing `--- `.
    #[test]
    fn results_are_added_so_that_the_output_always_parses() {
        for text in [
            "--- {apiVersion: config.kubernetes.io/v1, kind: ResourceList, items: []}\n",
            "  apiVersion: config.kubernetes.io/v1\n  kind: ResourceList\n  items: []\n",
            "apiVersion: config.kubernetes.io/v1\nkind: ResourceList\nitems: []\n--- ",
            "apiVersion: config.kubernetes.io/v1\nkind: ResourceList\nitems: []\n",
            "apiVersion: config.kubernetes.io/v1\nkind: ResourceList\nitems: []\n...\n",
        ] {
            round_trips(text);
        }
    }

    /// Every fixture and fuzz seed of the repository.
    #[test]
    fn every_fixture_and_seed_round_trips() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        for dir in [
            root.join("tests/fixtures/krm"),
            root.join("tests/fixtures/pin"),
            root.join("../../fuzz/seeds/manifest"),
        ] {
            for e in std::fs::read_dir(&dir).expect("fixtures") {
                let p = e.expect("entry").path();
                if let Ok(text) = std::fs::read_to_string(&p) {
                    round_trips(&text);
                }
            }
        }
    }
}
