//! Client-side pinning: manifests in, pinned manifests out, through the same
//! [`Engine`] the webhook uses.
//!
//! Owns turning YAML text into decisions and decisions back into text:
//! every Kubernetes object in a stream (and every item of a `v1/List`) is
//! walked by the webhook's walker, decided by the webhook's engine, and each
//! changed image is spliced into the original bytes by
//! [`sigil_core::manifest`]. It also owns the report of what happened to each
//! image, with file and line. It does not read files, print, or pick exit
//! codes: `sigil pin` (`cmd/pin.rs`) and [`crate::krm`] do. Decisions are
//! sigil-core's per-object decision with `Source::Manifest`, so the
//! webhook and `sigil pin` agree on every verdict.

use std::time::{Duration, Instant};

use futures_util::future::join_all;
use serde::Serialize;
use sigil_core::manifest::{self, Document, Edit, ManifestError, NodeRef};
use sigil_core::{
    DigestResolver, FieldVerdict, Mode, ObjectFacts, ObjectRef, Operation, Outcome, Source,
    effective_namespace,
};

use crate::engine::Engine;

pub mod files;
pub mod report;

/// How to decide.
#[derive(Debug, Clone)]
pub struct PinOptions {
    /// No registry calls: apply mirrors and static rules, report what needs a lookup.
    pub offline: bool,
    /// Time allowed for each object's lookups.
    pub timeout: Duration,
    /// The namespace a manifest without `metadata.namespace` is applied to
    /// (for `exemptNamespaces`; see [`effective_namespace`]).
    pub namespace: String,
}

/// kubectl's namespace for objects that name none.
pub const DEFAULT_NAMESPACE: &str = "default";

impl Default for PinOptions {
    fn default() -> Self {
        PinOptions {
            offline: false,
            timeout: Duration::from_secs(30),
            namespace: DEFAULT_NAMESPACE.to_owned(),
        }
    }
}

/// What happened to one image.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Status {
    /// Already final (pinned, or allowed as written).
    Ok,
    /// A digest was added (and maybe a mirror rewrite).
    Pinned,
    /// Only the mirror rewrite applied (the rule keeps tags, or `--offline`).
    Rewritten,
    /// `--offline`: pinning needs a registry lookup.
    NeedsRegistry,
    /// The policy refuses it in enforce mode (or a static deny).
    Denied,
    /// The policy would refuse it, but the rule is in warn mode.
    Warning,
}

impl Status {
    /// Whether `--check` fails on this image.
    pub fn fails_check(self) -> bool {
        !matches!(self, Status::Ok)
    }
}

/// One image, where it is, and what happened to it.
#[derive(Debug, Clone, Serialize)]
pub struct ImageReport {
    /// 1-based line of the image scalar (the alias site for aliases).
    pub line: u64,
    /// 1-based column of the image scalar.
    pub column: u64,
    /// `apiVersion` of the object.
    #[serde(rename = "apiVersion")]
    pub api_version: String,
    /// The object.
    pub object: ObjectRef,
    /// kubectl-style path, e.g. `spec.template.spec.containers[0].image`.
    pub field: String,
    /// Container or volume wording for messages.
    #[serde(skip)]
    pub describe: String,
    /// The verdict label, the same every front end reports
    /// (`pinned`, `denied:unresolved`, …; see `FieldVerdict::label`).
    pub verdict: String,
    /// The image as written.
    pub image: String,
    /// The image after pinning/rewriting, when it changes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub new: Option<String>,
    /// What happened.
    pub status: Status,
    /// Why, for denials and warnings: what, why, how to fix.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Index of the object in a ResourceList's `items`, for KRM results.
    #[serde(skip)]
    pub item: Option<usize>,
    /// The container (or volume) the image is in, when it has a name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub container: Option<String>,
    /// The rule that decided it, when one did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rule: Option<String>,
}

/// An object to decide, and where it sits in its document.
#[derive(Debug)]
pub struct Target<'a> {
    /// Path from the document root to the object (e.g. `["items", "3"]`).
    pub prefix: Vec<String>,
    /// The object (a node of the document's tree).
    pub object: NodeRef<'a>,
    /// Index in a ResourceList's `items`.
    pub item: Option<usize>,
}

/// What deciding a set of objects produced.
#[derive(Debug, Default)]
pub struct Decided {
    /// Splices to apply to the text.
    pub edits: Vec<Edit>,
    /// One per image field.
    pub images: Vec<ImageReport>,
    /// Objects passed over, with why (non-Kubernetes documents, exempt namespaces).
    pub notes: Vec<String>,
    /// Images that could not be edited in place.
    pub errors: Vec<ManifestError>,
}

impl Decided {
    fn absorb(&mut self, other: Decided) {
        self.edits.extend(other.edits);
        self.images.extend(other.images);
        self.notes.extend(other.notes);
        self.errors.extend(other.errors);
    }
}

/// The result of pinning one YAML stream.
#[derive(Debug)]
pub struct Pinned {
    /// The text with every changed image spliced in (the input if nothing changed).
    pub text: String,
    /// Whether `text` differs from the input.
    pub changed: bool,
    /// Reports, notes and errors.
    pub decided: Decided,
}

/// Pins every Kubernetes object of a multi-document YAML stream.
pub async fn pin_text<R: DigestResolver>(
    engine: &Engine<R>,
    text: &str,
    opts: &PinOptions,
) -> Result<Pinned, ManifestError> {
    let docs = manifest::parse_stream(text)?;
    let mut decided = Decided::default();
    let per_doc = join_all(docs.iter().map(|doc| async {
        let mut notes = Vec::new();
        let targets = targets_of(doc, &mut notes);
        let mut d = decide_targets(engine, text, doc, targets, opts).await;
        d.notes.splice(0..0, notes);
        d
    }))
    .await;
    for d in per_doc {
        decided.absorb(d);
    }
    finish(text, decided)
}

/// Applies the edits of `decided` to `text`.
pub fn finish(text: &str, mut decided: Decided) -> Result<Pinned, ManifestError> {
    if let Some(e) = decided.errors.first() {
        return Err(e.clone());
    }
    let edits = std::mem::take(&mut decided.edits);
    let changed = !edits.is_empty();
    let text = if changed {
        manifest::apply_edits(text, edits)?
    } else {
        text.to_owned()
    };
    Ok(Pinned {
        text,
        changed,
        decided,
    })
}

/// The objects of one document: the document itself, or a `List`'s items.
fn targets_of<'a>(doc: &'a Document, notes: &mut Vec<String>) -> Vec<Target<'a>> {
    if !doc.is_kubernetes_object() {
        notes.push(format!(
            "line {}: not a Kubernetes object (no apiVersion and kind); skipped",
            doc.line
        ));
        return Vec::new();
    }
    let root = doc.root();
    let kind = root.get("kind").and_then(NodeRef::as_str).unwrap_or("");
    match root.get("items").and_then(NodeRef::items) {
        Some(items) if kind.ends_with("List") => items
            .enumerate()
            .map(|(i, object)| Target {
                prefix: vec!["items".to_owned(), i.to_string()],
                object,
                item: None,
            })
            .collect(),
        _ => vec![Target {
            prefix: Vec::new(),
            object: root,
            item: None,
        }],
    }
}

/// Decides `targets` (objects inside `doc`, whose source is `text`).
pub async fn decide_targets<R: DigestResolver>(
    engine: &Engine<R>,
    text: &str,
    doc: &Document,
    targets: Vec<Target<'_>>,
    opts: &PinOptions,
) -> Decided {
    let decisions = join_all(targets.iter().map(|t| async move {
        let summary = t.object.summarize();
        let object = ObjectRef::new(
            summary.kind.as_deref().unwrap_or_default(),
            summary.namespace.as_deref().unwrap_or_default(),
            summary.name.as_deref(),
            summary.generate_name.as_deref(),
        );
        let namespace = effective_namespace(
            None,
            summary.namespace.as_deref(),
            Some(opts.namespace.as_str()),
        )
        .map(str::to_owned);
        let facts = ObjectFacts {
            operation: Operation::Create,
            source: Source::Manifest,
            kind: &object.kind,
            namespace: namespace.as_deref(),
            object: Some(summary),
            old_object: None,
            namespace_labels: None,
        };
        let verdict = if opts.offline {
            engine.decide_offline(facts)
        } else {
            engine.decide(facts, Instant::now() + opts.timeout).await
        };
        (object, namespace, verdict)
    }))
    .await;
    let mut out = Decided::default();
    for (t, (object, namespace, verdict)) in targets.iter().zip(decisions) {
        if verdict.skipped.is_some() {
            out.notes.push(format!(
                "{object}: namespace {:?} is exempt in the policy; left as written",
                namespace.unwrap_or_default()
            ));
            continue;
        }
        let api_version = t
            .object
            .get("apiVersion")
            .and_then(NodeRef::as_str)
            .unwrap_or_default()
            .to_owned();
        for v in verdict.fields {
            let field = &v.field;
            let path = t.prefix.iter().chain(&field.path).map(String::as_str);
            let at = doc.scalar(path);
            let (status, new, message) = report_of(&v, &object);
            if let (Some(new), Some(at)) = (&new, &at) {
                match manifest::edit_scalar(text, at, &field.value, new) {
                    Ok(e) => out.edits.push(e),
                    Err(e) => out.errors.push(e),
                }
            }
            out.images.push(ImageReport {
                line: at.map_or(doc.line, |a| a.line),
                column: at.map_or(1, |a| a.column),
                api_version: api_version.clone(),
                object: object.clone(),
                field: field.dotted(),
                describe: field.describe(),
                verdict: v.label().into_owned(),
                image: field.value.clone(),
                new,
                status,
                message,
                item: t.item,
                container: field.name.clone(),
                rule: v.rule.as_ref().map(|r| r.name.clone()),
            });
        }
    }
    out
}

/// Renders one field's verdict as a report status, the new value, and the message.
fn report_of(v: &FieldVerdict, object: &ObjectRef) -> (Status, Option<String>, Option<String>) {
    // No mirror had it: pinned (or kept) at the origin, which the user
    // should know.
    let fell_back = || {
        v.fallback.as_ref().map(|f| {
            format!(
                "image {:?} in {} of {object}: {}",
                v.field.value,
                v.field.describe(),
                f.why
            )
        })
    };
    match &v.outcome {
        Outcome::Unchanged { .. } => (Status::Ok, None, fell_back()),
        Outcome::Changed {
            new, pinned: None, ..
        } => (Status::Rewritten, Some(new.clone()), None),
        Outcome::Changed { new, .. } => (Status::Pinned, Some(new.clone()), fell_back()),
        Outcome::NeedsLookup { new, .. } => (
            Status::NeedsRegistry,
            new.clone(),
            Some(format!(
                "image {:?} in {} of {object} needs a registry lookup to be pinned or verified (--offline)",
                v.field.value,
                v.field.describe()
            )),
        ),
        Outcome::Failed(f) => (
            if f.mode == Mode::Enforce {
                Status::Denied
            } else {
                Status::Warning
            },
            None,
            Some(f.message(object)),
        ),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use sigil_core::Policy;
    use sigil_testkit::resolver::FakeResolver;

    use super::*;

    fn engine(policy: &str) -> Engine<FakeResolver> {
        Engine::new(
            Arc::new(Policy::from_yaml(policy).expect("policy")),
            FakeResolver::new(),
        )
    }

    const ENFORCE: &str = "apiVersion: sigil.dev/v1alpha1\nkind: ImagePolicy\nspec:\n  mirrors: [{from: docker.io, to: mirror.local/hub}]\n  rules:\n  - {name: all, match: ['**'], mode: enforce}\n  - {name: no-bad, match: ['docker.io/library/bad'], action: deny}\n  exemptNamespaces: [kube-system]\n";

    #[tokio::test]
    async fn pins_rewrites_and_reports_lines() {
        let e = engine(ENFORCE);
        let text = "# c\nnot: kubernetes\n---\napiVersion: v1\nkind: Pod\nmetadata: {name: p, namespace: team}\nspec:\n  containers:\n  - name: a\n    image: nginx:1   # pinned by sigil\n  - name: b\n    image: docker.io/library/bad:1\n";
        let p = pin_text(&e, text, &PinOptions::default())
            .await
            .expect("pin");
        assert!(p.changed);
        let imgs = &p.decided.images;
        assert_eq!(imgs.len(), 2);
        assert_eq!(imgs[0].status, Status::Pinned);
        assert_eq!(imgs[0].line, 10);
        assert!(
            imgs[0]
                .new
                .as_deref()
                .expect("new")
                .starts_with("mirror.local/hub/library/nginx:1@sha256:")
        );
        assert_eq!(imgs[1].status, Status::Denied);
        assert!(
            p.text
                .contains("image: mirror.local/hub/library/nginx:1@sha256:")
        );
        assert!(p.text.contains("   # pinned by sigil\n"));
        assert!(p.text.contains("image: docker.io/library/bad:1\n"));
        assert_eq!(p.decided.notes.len(), 1, "{:?}", p.decided.notes);
    }

    #[tokio::test]
    async fn offline_rewrites_and_reports_lookups_without_calling_the_registry() {
        let e = engine(ENFORCE);
        let text = "apiVersion: v1\nkind: Pod\nspec:\n  containers:\n  - image: nginx:1\n";
        let opts = PinOptions {
            offline: true,
            ..PinOptions::default()
        };
        let p = pin_text(&e, text, &opts).await.expect("pin");
        assert_eq!(p.decided.images[0].status, Status::NeedsRegistry);
        assert!(p.text.contains("image: mirror.local/hub/library/nginx:1\n"));
        assert_eq!(e.resolver.calls(), 0);
    }

    #[tokio::test]
    async fn exempt_namespaces_and_list_items() {
        let e = engine(ENFORCE);
        let text = "apiVersion: v1\nkind: List\nitems:\n- apiVersion: v1\n  kind: Pod\n  metadata: {name: a, namespace: kube-system}\n  spec: {containers: [{image: nginx:1}]}\n- apiVersion: v1\n  kind: Pod\n  metadata: {name: b}\n  spec: {containers: [{image: nginx:1}]}\n";
        let p = pin_text(&e, text, &PinOptions::default())
            .await
            .expect("pin");
        assert_eq!(p.decided.images.len(), 1);
        assert_eq!(p.decided.images[0].object.name, "b");
        assert!(p.decided.notes[0].contains("exempt"));
        let lines: Vec<&str> = p.text.lines().collect();
        assert_eq!(lines[6], "  spec: {containers: [{image: nginx:1}]}");
        assert!(lines[10].contains("image: mirror.local/hub/library/nginx:1@sha256:"));
    }

    #[tokio::test]
    async fn pinning_is_idempotent() {
        let e = engine(ENFORCE);
        let text = "apiVersion: apps/v1\nkind: Deployment\nspec:\n  template:\n    spec:\n      containers:\n      - image: \"nginx:1\"\n";
        let once = pin_text(&e, text, &PinOptions::default())
            .await
            .expect("pin");
        let twice = pin_text(&e, &once.text, &PinOptions::default())
            .await
            .expect("pin");
        assert!(!twice.changed);
        assert_eq!(twice.text, once.text);
        assert!(twice.decided.images.iter().all(|i| i.status == Status::Ok));
    }
}
