//! What on-call gets with the chart and the Kustomize component, checked
//! with the real Prometheus tools (Debian's `promtool`): the alert rules
//! pass `promtool check rules` and their unit tests (each alert fires when
//! it should and stays quiet when it should not,
//! `tests/fixtures/monitoring/alerts_test.yaml`), every dashboard query
//! parses, and each monitoring value of the chart changes what it renders.
//! That every metric they name is one sigil (or kube-apiserver) really
//! exports, and that the objects pass the Prometheus Operator's CRD schemas,
//! is checked on a real API server (`real_kube::monitoring`).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

pub(crate) fn alerts_file() -> PathBuf {
    repo().join("deploy/helm/sigil/files/alerts.yaml")
}

pub(crate) fn dashboard() -> Value {
    serde_json::from_str(
        &std::fs::read_to_string(repo().join("deploy/helm/sigil/files/dashboard.json")).unwrap(),
    )
    .unwrap()
}

/// Runs `promtool` with `args`; its output, or a panic saying what failed.
fn promtool(args: &[&str]) -> String {
    let out = Command::new("promtool").args(args).output().expect(
        "promtool is installed (scripts/test.sh installs Debian's prometheus, which ships it)",
    );
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "promtool {args:?}:\n{text}");
    text
}

/// Every PromQL expression of the alert rules and the dashboard, with
/// Grafana's `$__rate_interval` as the 5m a scrape every 30 s gives it.
pub(crate) fn expressions() -> Vec<String> {
    let rules: Value = serde_json::to_value(
        sigil_core::manifest::parse_stream(&std::fs::read_to_string(alerts_file()).unwrap())
            .unwrap()
            .remove(0)
            .to_value(),
    )
    .unwrap();
    let mut exprs: Vec<String> = rules["groups"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|g| g["rules"].as_array().unwrap().iter())
        .map(|r| r["expr"].as_str().unwrap().to_owned())
        .collect();
    for p in dashboard()["panels"].as_array().unwrap() {
        for t in p["targets"].as_array().unwrap() {
            exprs.push(
                t["expr"]
                    .as_str()
                    .unwrap()
                    .replace("$__rate_interval", "5m"),
            );
        }
    }
    exprs
}

/// The metric names an expression selects: identifiers outside label
/// matchers and strings that name sigil's series (`sigil_…`) or
/// kube-apiserver's (`apiserver_…`), the only two sources the rules and
/// the dashboard read.
pub(crate) fn metric_names(expr: &str) -> BTreeSet<String> {
    let mut outside = String::new();
    let (mut depth, mut quoted) = (0, false);
    for c in expr.chars() {
        match c {
            '"' => quoted = !quoted,
            '{' if !quoted => depth += 1,
            '}' if !quoted => depth -= 1,
            _ if quoted || depth > 0 => {}
            _ => outside.push(c),
        }
        if depth > 0 || quoted {
            // Keep words apart across a removed matcher.
            if !outside.ends_with(' ') {
                outside.push(' ');
            }
        }
    }
    outside
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
        .filter(|w| w.starts_with("sigil_") || w.starts_with("apiserver_"))
        .map(str::to_owned)
        .collect()
}

#[test]
fn the_alert_rules_pass_promtool_and_their_unit_tests() {
    let alerts = alerts_file();
    let checked = promtool(&["check", "rules", alerts.to_str().unwrap()]);
    assert!(checked.contains("SUCCESS"), "{checked}");
    // The unit tests name the rules as `alerts.yaml` beside them.
    let tests =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/monitoring/alerts_test.yaml");
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(&alerts, dir.path().join("alerts.yaml")).unwrap();
    let copy = dir.path().join("alerts_test.yaml");
    std::fs::copy(&tests, &copy).unwrap();
    let tested = promtool(&["test", "rules", copy.to_str().unwrap()]);
    assert!(tested.contains("SUCCESS"), "{tested}");
    // Every alert has a test that fires it and one that keeps it quiet.
    let text = std::fs::read_to_string(&tests).unwrap();
    let unit: Value = sigil_core::manifest::parse_stream(&text)
        .unwrap()
        .remove(0)
        .to_value();
    let (mut fired, mut quiet) = (BTreeSet::new(), BTreeSet::new());
    for t in unit["tests"].as_array().unwrap() {
        for a in t["alert_rule_test"].as_array().unwrap() {
            let name = a["alertname"].as_str().unwrap().to_owned();
            if a["exp_alerts"].as_array().is_some_and(|e| !e.is_empty()) {
                fired.insert(name);
            } else {
                quiet.insert(name);
            }
        }
    }
    let rules: Value =
        sigil_core::manifest::parse_stream(&std::fs::read_to_string(&alerts).unwrap())
            .unwrap()
            .remove(0)
            .to_value();
    for g in rules["groups"].as_array().unwrap() {
        for r in g["rules"].as_array().unwrap() {
            let name = r["alert"].as_str().unwrap();
            assert!(fired.contains(name), "no test fires {name}");
            assert!(quiet.contains(name), "no test keeps {name} quiet");
            let runbook = r["annotations"]["runbook_url"].as_str().unwrap();
            let anchor = runbook.rsplit_once('#').unwrap().1;
            assert_eq!(anchor, name.to_lowercase(), "{name}'s runbook anchor");
            let docs = std::fs::read_to_string(repo().join("docs/operations.md")).unwrap();
            assert!(
                docs.contains(&format!("### {name}\n")),
                "docs/operations.md has a runbook section for {name}"
            );
        }
    }
}

/// Every dashboard query parses (as a recording rule, which promtool
/// parses and type-checks).
#[test]
fn the_dashboards_queries_parse_with_promtool() {
    let dir = tempfile::tempdir().unwrap();
    let mut rules = String::from("groups:\n  - name: dashboard\n    rules:\n");
    let d = dashboard();
    for (i, p) in d["panels"].as_array().unwrap().iter().enumerate() {
        assert_eq!(p["datasource"]["uid"], "${datasource}", "panel {i}");
        let targets = p["targets"].as_array().unwrap();
        assert!(!targets.is_empty(), "panel {} has no query", p["title"]);
        for (j, t) in targets.iter().enumerate() {
            let expr = t["expr"]
                .as_str()
                .unwrap()
                .replace("$__rate_interval", "5m");
            rules.push_str(&format!(
                "      - record: sigil:dashboard:p{i}_{j}\n        expr: {}\n",
                serde_json::to_string(&expr).unwrap()
            ));
        }
    }
    let file = dir.path().join("dashboard-rules.yaml");
    std::fs::write(&file, rules).unwrap();
    let checked = promtool(&["check", "rules", file.to_str().unwrap()]);
    assert!(checked.contains("SUCCESS"), "{checked}");
}

/// The chart's monitoring values each change what it renders: off by
/// default; the ServiceMonitor's labels and interval, the rules' labels and
/// runbook links, the dashboard's labels and namespace.
#[test]
fn each_monitoring_value_changes_what_the_chart_renders() {
    let kinds = |objects: &[Value]| -> BTreeSet<String> {
        objects
            .iter()
            .map(|o| {
                format!(
                    "{}/{}",
                    o["kind"].as_str().unwrap(),
                    o["metadata"]["name"].as_str().unwrap()
                )
            })
            .collect()
    };
    let off = kinds(&crate::helm::rendered(&[]));
    for k in [
        "ServiceMonitor/sigil",
        "PrometheusRule/sigil",
        "ConfigMap/sigil-dashboard",
        "Service/sigil-metrics",
    ] {
        assert!(!off.contains(k), "{k} is off by default");
    }
    let on = crate::helm::rendered(&[
        "metrics.serviceMonitor.enabled=true",
        "metrics.serviceMonitor.interval=15s",
        "metrics.serviceMonitor.labels.release=kube-prometheus-stack",
        "metrics.prometheusRule.enabled=true",
        "metrics.prometheusRule.labels.release=kube-prometheus-stack",
        "metrics.prometheusRule.runbookBaseURL=https://wiki.example.com/sigil",
        "metrics.dashboard.enabled=true",
        "metrics.dashboard.namespace=grafana",
        "metrics.dashboard.labels.team=platform",
    ]);
    let find = |kind: &str, name: &str| crate::shipped::find(&on, kind, name).clone();
    let sm = find("ServiceMonitor", "sigil");
    assert_eq!(sm["spec"]["endpoints"][0]["interval"], "15s");
    assert_eq!(sm["metadata"]["labels"]["release"], "kube-prometheus-stack");
    let rule = find("PrometheusRule", "sigil");
    assert_eq!(
        rule["metadata"]["labels"]["release"],
        "kube-prometheus-stack"
    );
    let text = rule.to_string();
    assert!(
        text.contains("https://wiki.example.com/sigil#sigildownfailclosed"),
        "{text}"
    );
    assert!(
        !text.contains("github.com/sigil-dev"),
        "every runbook link moved"
    );
    let cm = find("ConfigMap", "sigil-dashboard");
    assert_eq!(cm["metadata"]["namespace"], "grafana");
    assert_eq!(cm["metadata"]["labels"]["team"], "platform");
    let json: Value = serde_json::from_str(cm["data"]["sigil.json"].as_str().unwrap()).unwrap();
    assert_eq!(json, dashboard());
}

#[test]
fn metric_names_are_read_off_expressions() {
    let names = metric_names(
        r#"histogram_quantile(0.99, sum by (host, le) (rate(sigil_registry_request_duration_seconds_bucket{job="sigil-metrics", le="+Inf"}[5m]))) > 5 and on() (max(last_over_time(sigil_webhook_info{failure_policy="Fail"}[1d])) == 1) unless absent(apiserver_x_total offset 10m)"#,
    );
    assert_eq!(
        names.into_iter().collect::<Vec<_>>(),
        [
            "apiserver_x_total",
            "sigil_registry_request_duration_seconds_bucket",
            "sigil_webhook_info"
        ]
    );
}
