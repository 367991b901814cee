//! An audit as the report objects compliance tooling reads: one report per
//! namespace (a cluster-wide one for cluster-scoped objects), in either API
//! of the Kubernetes policy working group — `wgpolicyk8s.io/v1alpha2`
//! PolicyReport/ClusterPolicyReport, or its successor `openreports.io/v1alpha1`
//! Report/ClusterReport (the same shape) — with a result per (object, image
//! field, rule): `pass` for a field that complies, and per violation `fail`
//! (the rule enforces), `warn` (it only warns) or `error` (the image could
//! not be evaluated: its tag did not resolve). Objects in exempt namespaces
//! are not reported (the webhook never looks at them). It builds objects; it
//! does not write them (`sigil audit -o policyreport` prints them).

use std::collections::BTreeMap;

use serde_json::{Value, json};
use sigil_core::Mode;
use sigil_core::audit::ObjectResult;
use sigil_core::audit::{Reason, Violation};

use super::report::{FieldReport, ObjectReport, Report};

/// Results kept in one report at most: a report must stay well under the
/// API server's object size limit (1.5 MiB) whatever the namespace holds.
/// Over it, passes are left out first, and the report says how many.
pub const MAX_RESULTS: usize = 1_500;

/// The annotation naming how many results a capped report leaves out.
pub const TRUNCATED: &str = "sigil.dev/results-left-out";

/// The name of every report sigil writes (one per namespace).
pub const NAME: &str = "sigil";

/// Which report API.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Api {
    /// `wgpolicyk8s.io/v1alpha2` PolicyReport / ClusterPolicyReport.
    Wgpolicyk8s,
    /// `openreports.io/v1alpha1` Report / ClusterReport.
    OpenReports,
}

impl Api {
    /// `apiVersion`.
    pub fn api_version(self) -> &'static str {
        match self {
            Api::Wgpolicyk8s => "wgpolicyk8s.io/v1alpha2",
            Api::OpenReports => "openreports.io/v1alpha1",
        }
    }

    /// `kind` of the namespaced report, and of the cluster-scoped one.
    pub fn kinds(self) -> (&'static str, &'static str) {
        match self {
            Api::Wgpolicyk8s => ("PolicyReport", "ClusterPolicyReport"),
            Api::OpenReports => ("Report", "ClusterReport"),
        }
    }
}

/// `ClusterImagePolicy base` → `ClusterImagePolicy/base`; the policy file's
/// rules are under its own name.
fn policy_name(field: &FieldReport, file_policy: &str) -> String {
    match &field.rule_source {
        Some(s) => s.replacen(' ', "/", 1),
        None => file_policy.to_owned(),
    }
}

fn outcome(v: &Violation) -> (&'static str, &'static str) {
    if v.exception.is_some() {
        // Waived by an ImagePolicyException for now: `skip`, as peers
        // report excepted results, with the exception in the properties.
        return ("skip", "medium");
    }
    match (v.reason, v.mode) {
        (Reason::Unresolvable, _) => ("error", "medium"),
        (_, Mode::Warn) => ("warn", "medium"),
        (_, Mode::Enforce) => ("fail", "high"),
    }
}

/// Rank for capping: failures are kept before passes.
fn keep_rank(result: &str) -> u8 {
    match result {
        "fail" => 0,
        "error" => 1,
        "warn" => 2,
        _ => 3,
    }
}

fn results_of(o: &ObjectReport, file_policy: &str, seconds: i64) -> Vec<Value> {
    let resource = json!({
        "apiVersion": o.api_version, "kind": o.kind, "name": o.name,
        "namespace": o.namespace, "uid": o.uid,
    });
    let mut out = Vec::new();
    for f in &o.fields {
        let mut properties = BTreeMap::from([
            ("image".to_owned(), f.image.clone()),
            ("field".to_owned(), f.field.clone()),
        ]);
        if let Some(c) = &f.container {
            properties.insert("container".into(), c.clone());
        }
        if let Some(d) = &f.expected_digest {
            properties.insert("digest".into(), d.clone());
        }
        if let Some(d) = &f.running_digest {
            properties.insert("runningDigest".into(), d.clone());
        }
        let policy = policy_name(f, file_policy);
        let rule = f.rule.clone().unwrap_or_else(|| "no-matching-rule".into());
        let at = f
            .container
            .as_deref()
            .map_or_else(|| f.field.clone(), |c| format!("container {c:?}"));
        let base = |result: &str| {
            json!({
                "source": "sigil", "policy": policy, "rule": rule, "result": result,
                "scored": true, "resources": [resource.clone()],
                "timestamp": {"seconds": seconds, "nanos": 0},
            })
        };
        if f.violations.is_empty() {
            let mut r = base("pass");
            r["message"] = format!("image {:?} in {at} complies ({})", f.image, f.verdict).into();
            r["properties"] = json!(properties);
            out.push(r);
        }
        for v in &f.violations {
            let (result, severity) = outcome(v);
            let mut r = base(result);
            r["severity"] = severity.into();
            r["category"] = v.reason.as_str().into();
            r["message"] = format!(
                "image {:?} in {at} of {} {}/{}: {}; to fix: {}",
                f.image, o.kind, o.namespace, o.name, v.detail, v.fix
            )
            .into();
            let mut p = properties.clone();
            p.insert("reason".into(), v.reason.as_str().into());
            if let Some(w) = &v.exception {
                r["message"] = format!(
                    "{} (excepted by {} until {}: {})",
                    r["message"].as_str().unwrap_or_default(),
                    w.exception,
                    w.expires,
                    w.reason
                )
                .into();
                p.insert("exception".into(), w.exception.clone());
                p.insert("expires".into(), w.expires.clone());
                if let Some(t) = &w.ticket {
                    p.insert("ticket".into(), t.clone());
                }
            }
            r["properties"] = json!(p);
            out.push(r);
        }
    }
    out
}

/// One report per namespace (the cluster-scoped objects' in a cluster
/// report), sorted by namespace; each with its summary and at most
/// [`MAX_RESULTS`] results.
pub fn reports(report: &Report, api: Api) -> Vec<Value> {
    let seconds = humantime::parse_rfc3339(&report.finished_at)
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_secs() as i64);
    let mut by_ns: BTreeMap<&str, Vec<Value>> = BTreeMap::new();
    for o in report
        .objects
        .iter()
        .filter(|o| o.result != ObjectResult::Exempt)
    {
        by_ns
            .entry(o.namespace.as_str())
            .or_default()
            .extend(results_of(o, &report.policy, seconds));
    }
    by_ns
        .into_iter()
        .map(|(ns, results)| build(api, ns, results))
        .collect()
}

fn build(api: Api, namespace: &str, mut results: Vec<Value>) -> Value {
    let mut summary = BTreeMap::from([
        ("pass", 0usize),
        ("fail", 0),
        ("warn", 0),
        ("error", 0),
        ("skip", 0),
    ]);
    for r in &results {
        if let Some(n) = r["result"].as_str().and_then(|k| summary.get_mut(k)) {
            *n += 1;
        }
    }
    let left_out = results.len().saturating_sub(MAX_RESULTS);
    if left_out > 0 {
        results.sort_by_key(|r| keep_rank(r["result"].as_str().unwrap_or_default()));
        results.truncate(MAX_RESULTS);
    }
    let (kind, cluster_kind) = api.kinds();
    let mut metadata = json!({
        "name": NAME,
        "labels": {"app.kubernetes.io/managed-by": "sigil"},
    });
    if left_out > 0 {
        metadata["annotations"] = json!({ TRUNCATED: left_out.to_string() });
    }
    let kind = if namespace.is_empty() {
        cluster_kind
    } else {
        metadata["namespace"] = namespace.into();
        kind
    };
    let mut obj = json!({
        "apiVersion": api.api_version(),
        "kind": kind,
        "metadata": metadata,
        "summary": summary,
        "results": results,
    });
    if api == Api::OpenReports {
        obj["source"] = "sigil".into();
    }
    obj
}

#[cfg(test)]
mod tests;
