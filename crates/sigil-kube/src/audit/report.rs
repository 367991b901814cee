//! The audit report: one documented, stable schema (docs/audit.md) for
//! `sigil audit -o json|yaml`, `GET /audit` and the tests, and its table
//! rendering (grouped by namespace, one line per violation). It decides
//! nothing: each object's audit comes from sigil-core.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;
use sigil_core::audit::{FieldAudit, ObjectAudit, ObjectResult, Reason, Violation};

/// `apiVersion` of the report.
pub const API_VERSION: &str = "sigil.dev/v1alpha1";
/// `kind` of the report.
pub const KIND: &str = "AuditReport";

/// What was audited: the flags that chose the objects.
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Scope {
    /// One namespace, or `None` for all.
    pub namespace: Option<String>,
    /// Plural kinds listed.
    pub kinds: Vec<String>,
    /// `-l`.
    pub label_selector: Option<String>,
    /// Only objects created or changed at or after this time (RFC 3339).
    pub since: Option<String>,
}

/// Counts over the whole report.
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Summary {
    /// Objects audited (after `--since`).
    pub objects: usize,
    /// Objects whose every image complies.
    pub compliant: usize,
    /// Objects with at least one violation.
    pub violating: usize,
    /// Objects in exempt namespaces.
    pub exempt: usize,
    /// Image fields seen.
    pub images: usize,
    /// Distinct image strings seen.
    pub unique_images: usize,
    /// Violations (an image field may have more than one).
    pub violations: usize,
    /// Violations per reason label.
    pub by_reason: BTreeMap<&'static str, usize>,
    /// Objects with an image the backstop would refuse (their Pods cannot
    /// be created while the webhook is down and the backstop is in place).
    pub backstop_refusals: usize,
    /// HTTP requests this audit made to registries (cached answers cost none).
    pub registry_requests: u64,
}

/// Counts for one namespace.
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NamespaceSummary {
    /// Namespace (empty for cluster-scoped objects).
    pub name: String,
    /// Objects audited in it.
    pub objects: usize,
    /// Of which violating.
    pub violating: usize,
    /// Violations in it.
    pub violations: usize,
    /// Violations per reason label.
    pub by_reason: BTreeMap<&'static str, usize>,
}

/// One image field of one object.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct FieldReport {
    /// `spec.containers[0].image`.
    pub field: String,
    /// Container (or image volume) name, when it has one.
    pub container: Option<String>,
    /// The image as written.
    pub image: String,
    /// The webhook's verdict label (`unchanged`, `pinned`, `denied:…`, `exempt`).
    pub verdict: String,
    /// The digest the policy says should run.
    pub expected_digest: Option<String>,
    /// The digest the runtime reports (Pods).
    pub running_digest: Option<String>,
    /// Empty when compliant.
    pub violations: Vec<Violation>,
    /// The rule that decided it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rule: Option<String>,
    /// The policy object stating that rule (`ClusterImagePolicy base`,
    /// `ImagePolicy team-a/strict`); `None` for the policy file's rules.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rule_source: Option<String>,
    /// Why the in-API-server backstop (`sigil backstop`) would refuse a Pod
    /// with this image while the webhook is down: for a Pod, it could not
    /// be re-created then; for a template, its Pods could not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub backstop: Option<String>,
}

/// One audited object.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ObjectReport {
    /// Namespace.
    pub namespace: String,
    /// `Pod`, `Deployment`, …
    pub kind: String,
    /// `metadata.name`.
    pub name: String,
    /// `metadata.uid` (Events are attached by it).
    pub uid: String,
    /// `apiVersion` (for Events' object references).
    pub api_version: String,
    /// `metadata.resourceVersion` when audited.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub resource_version: String,
    /// The controlling owner, `Kind/name`.
    pub owner: Option<String>,
    /// compliant, violating or exempt.
    pub result: ObjectResult,
    /// Every image field.
    pub fields: Vec<FieldReport>,
}

impl ObjectReport {
    /// Builds the report entry of one object from its audit.
    pub fn new(meta: ObjectMeta, audit: ObjectAudit) -> ObjectReport {
        ObjectReport {
            namespace: meta.namespace,
            kind: meta.kind,
            name: meta.name,
            uid: meta.uid,
            api_version: meta.api_version,
            resource_version: meta.resource_version,
            owner: meta.owner,
            result: audit.result,
            fields: audit.fields.into_iter().map(field_report).collect(),
        }
    }

    /// Every violation with the field it is about.
    pub fn violations(&self) -> impl Iterator<Item = (&FieldReport, &Violation)> {
        self.fields
            .iter()
            .flat_map(|f| f.violations.iter().map(move |v| (f, v)))
    }
}

/// What the lister knows about an object besides its images.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ObjectMeta {
    /// Namespace.
    pub namespace: String,
    /// Kind.
    pub kind: String,
    /// Name.
    pub name: String,
    /// uid.
    pub uid: String,
    /// apiVersion.
    pub api_version: String,
    /// resourceVersion.
    pub resource_version: String,
    /// Controlling owner, `Kind/name`.
    pub owner: Option<String>,
}

fn field_report(f: FieldAudit) -> FieldReport {
    FieldReport {
        field: f.field.dotted(),
        container: f.field.name.clone(),
        image: f.field.value,
        verdict: f.verdict,
        expected_digest: f.expected.map(|d| d.to_string()),
        running_digest: f.running.map(|d| d.to_string()),
        violations: f.violations,
        rule: f.rule.as_ref().map(|r| r.name.clone()),
        rule_source: f.rule.and_then(|r| r.source),
        backstop: None,
    }
}

/// A whole audit.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    /// [`API_VERSION`].
    pub api_version: &'static str,
    /// [`KIND`].
    pub kind: &'static str,
    /// Name of the policy audited against.
    pub policy: String,
    /// When the audit started (RFC 3339).
    pub started_at: String,
    /// When it finished.
    pub finished_at: String,
    /// How long it took.
    pub duration_seconds: f64,
    /// What was listed.
    pub scope: Scope,
    /// Counts.
    pub summary: Summary,
    /// Counts per namespace, by name.
    pub namespaces: Vec<NamespaceSummary>,
    /// Every object, by namespace, kind and name.
    pub objects: Vec<ObjectReport>,
    /// Kinds that could not be listed (the audit is incomplete).
    pub errors: Vec<String>,
}

impl Report {
    /// Sorts the objects and computes every count.
    pub fn finish(
        policy: String,
        scope: Scope,
        mut objects: Vec<ObjectReport>,
        errors: Vec<String>,
        started: std::time::SystemTime,
        registry_requests: u64,
    ) -> Report {
        objects.sort_by(|a, b| {
            (&a.namespace, &a.kind, &a.name).cmp(&(&b.namespace, &b.kind, &b.name))
        });
        let mut summary = Summary {
            objects: objects.len(),
            registry_requests,
            ..Summary::default()
        };
        let mut namespaces: BTreeMap<&str, NamespaceSummary> = BTreeMap::new();
        let mut unique = std::collections::HashSet::new();
        for o in &objects {
            let ns = namespaces
                .entry(&o.namespace)
                .or_insert_with(|| NamespaceSummary {
                    name: o.namespace.clone(),
                    ..NamespaceSummary::default()
                });
            ns.objects += 1;
            match o.result {
                ObjectResult::Compliant => summary.compliant += 1,
                ObjectResult::Violating => {
                    summary.violating += 1;
                    ns.violating += 1;
                }
                ObjectResult::Exempt => summary.exempt += 1,
            }
            for f in &o.fields {
                summary.images += 1;
                unique.insert(f.image.as_str());
            }
            if o.fields.iter().any(|f| f.backstop.is_some()) {
                summary.backstop_refusals += 1;
            }
            for (_, v) in o.violations() {
                summary.violations += 1;
                ns.violations += 1;
                *summary.by_reason.entry(v.reason.as_str()).or_default() += 1;
                *ns.by_reason.entry(v.reason.as_str()).or_default() += 1;
            }
        }
        summary.unique_images = unique.len();
        let namespaces = namespaces.into_values().collect();
        let finished = std::time::SystemTime::now();
        Report {
            api_version: API_VERSION,
            kind: KIND,
            policy,
            started_at: rfc3339(started),
            finished_at: rfc3339(finished),
            duration_seconds: finished
                .duration_since(started)
                .unwrap_or_default()
                .as_secs_f64(),
            scope,
            summary,
            namespaces,
            objects,
            errors,
        }
    }

    /// Whether anything violates.
    pub fn has_violations(&self) -> bool {
        self.summary.violations > 0
    }

    /// The table: per namespace a count line, then one line per violation,
    /// `namespace kind/name container image: reason (detail) → fix`; then the totals.
    pub fn table(&self) -> String {
        use sigil_core::text::push_line;
        let mut s = String::new();
        for ns in &self.namespaces {
            let name = if ns.name.is_empty() {
                "(cluster)"
            } else {
                &ns.name
            };
            push_line(
                &mut s,
                format_args!(
                    "{name}: {} objects, {} violating, {} violations",
                    ns.objects, ns.violating, ns.violations
                ),
            );
            for o in self.objects.iter().filter(|o| o.namespace == ns.name) {
                for (f, v) in o.violations() {
                    let container = f.container.as_deref().unwrap_or(&f.field);
                    let mode = match v.mode {
                        sigil_core::Mode::Enforce => "",
                        sigil_core::Mode::Warn => " [warn]",
                    };
                    // Names, images and details come from the cluster and registries.
                    push_line(
                        &mut s,
                        format_args!(
                            "  {name} {}/{} {container} {}: {}{mode} ({}) → {}",
                            o.kind,
                            o.name,
                            f.image,
                            label(v.reason),
                            v.detail,
                            v.fix
                        ),
                    );
                }
            }
        }
        let by_reason: Vec<String> = Reason::ALL
            .iter()
            .filter_map(|r| {
                self.summary
                    .by_reason
                    .get(r.as_str())
                    .map(|n| format!("{n} {}", label(*r)))
            })
            .collect();
        let _ = writeln!(
            s,
            "audited {} objects ({}) against policy {:?} in {:.1}s: {} compliant, {} violating, {} exempt; {} violations{}; {} unique images, {} registry requests",
            self.summary.objects,
            self.scope.kinds.join(", "),
            self.policy,
            self.duration_seconds,
            self.summary.compliant,
            self.summary.violating,
            self.summary.exempt,
            self.summary.violations,
            if by_reason.is_empty() {
                String::new()
            } else {
                format!(" ({})", by_reason.join(", "))
            },
            self.summary.unique_images,
            self.summary.registry_requests,
        );
        if self.summary.backstop_refusals > 0 {
            let _ = writeln!(
                s,
                "{} objects have images the backstop would refuse while the webhook is down (backstop in the JSON report; pin them: sigil pin)",
                self.summary.backstop_refusals
            );
        }
        for e in &self.errors {
            push_line(&mut s, format_args!("error: {e}"));
        }
        s
    }
}

/// Words for a reason in the table.
pub fn label(r: Reason) -> &'static str {
    match r {
        Reason::NotPinned => "not pinned",
        Reason::NotMirrored => "would be rewritten",
        Reason::Denied => "denied by rule",
        Reason::Signature => "signature problem",
        Reason::Attestation => "attestation problem",
        Reason::Unresolvable => "unresolvable",
        Reason::Drift => "running digest drift",
    }
}

/// RFC 3339, seconds.
pub fn rfc3339(t: std::time::SystemTime) -> String {
    humantime::format_rfc3339_seconds(t).to_string()
}
