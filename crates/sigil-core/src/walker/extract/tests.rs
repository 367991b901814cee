use serde_json::json;

use super::*;
use crate::walker::summarize_value;

fn apply(obj: &Value) -> ObjectSummary {
    let mut s = summarize_value(obj);
    Extractors::defaults().apply(&mut s);
    s
}

fn images(s: &ObjectSummary) -> Vec<(String, String)> {
    s.fields
        .iter()
        .map(|f| (f.dotted(), f.value.clone()))
        .collect()
}

#[test]
fn the_shipped_defaults_parse_and_name_every_kind_the_issue_lists() {
    let d = Extractors::defaults();
    for (g, k) in [
        ("tekton.dev", "Task"),
        ("tekton.dev", "ClusterTask"),
        ("tekton.dev", "Pipeline"),
        ("tekton.dev", "PipelineRun"),
        ("tekton.dev", "TaskRun"),
        ("tekton.dev", "StepAction"),
        ("argoproj.io", "Workflow"),
        ("argoproj.io", "WorkflowTemplate"),
        ("argoproj.io", "ClusterWorkflowTemplate"),
        ("argoproj.io", "CronWorkflow"),
        ("monitoring.coreos.com", "Prometheus"),
        ("monitoring.coreos.com", "Alertmanager"),
        ("monitoring.coreos.com", "ThanosRuler"),
        ("monitoring.coreos.com", "PrometheusAgent"),
    ] {
        let e = d
            .find(&format!("{g}/v1"), k)
            .unwrap_or_else(|| panic!("{g}/{k}"));
        assert!(!e.paths.is_empty(), "{k}");
        assert_eq!(e.source, "default");
    }
    assert_eq!(d.find("tekton.dev/v1", "Task").unwrap().resource, "tasks");
    assert_eq!(
        d.find("monitoring.coreos.com/v1", "Prometheus")
            .unwrap()
            .resource,
        "prometheuses"
    );
    assert!(d.find("apps/v1", "Deployment").is_none());
}

#[test]
fn tekton_steps_sidecars_and_step_templates_are_found_with_step_names() {
    let s = apply(&json!({
        "apiVersion": "tekton.dev/v1", "kind": "Task", "metadata": {"name": "t"},
        "spec": {
            "steps": [{"name": "build", "image": "golang:1.22"}, {"name": "push", "image": "gcr.io/x/y:1"}],
            "sidecars": [{"image": "docker:dind"}],
            "stepTemplate": {"image": "alpine"}
        }
    }));
    assert_eq!(
        images(&s),
        [
            ("spec.steps[0].image".into(), "golang:1.22".into()),
            ("spec.steps[1].image".into(), "gcr.io/x/y:1".into()),
            ("spec.sidecars[0].image".into(), "docker:dind".into()),
            ("spec.stepTemplate.image".into(), "alpine".into()),
        ]
    );
    assert_eq!(s.fields[0].describe(), "spec.steps[0].image (\"build\")");
    assert_eq!(s.fields[0].pointer, "/spec/steps/0/image");
    assert!(s.problems.is_empty() && s.custom.is_none());
}

#[test]
fn fields_found_by_shape_are_kept_and_not_listed_twice() {
    let s = apply(&json!({
        "apiVersion": "monitoring.coreos.com/v1", "kind": "Prometheus",
        "spec": {"image": "quay.io/prometheus/prometheus:v2.54.1",
                 "containers": [{"name": "sidecar", "image": "busybox"}]}
    }));
    assert_eq!(
        images(&s),
        [
            ("spec.containers[0].image".into(), "busybox".into()),
            (
                "spec.image".into(),
                "quay.io/prometheus/prometheus:v2.54.1".into()
            ),
        ]
    );
    let policy = Extractors::defaults()
        .with(
            &[ExtractorSpec {
                api_version: "monitoring.coreos.com/v1".into(),
                kind: "Prometheus".into(),
                resource: None,
                paths: vec!["spec.containers[*].image".into(), "spec.image".into()],
            }],
            "test",
        )
        .unwrap();
    let mut s = summarize_value(&json!({
        "apiVersion": "monitoring.coreos.com/v1", "kind": "Prometheus",
        "spec": {"image": "p", "containers": [{"name": "c", "image": "busybox"}]}
    }));
    policy.apply(&mut s);
    assert_eq!(s.fields.len(), 2, "{:?}", s.fields);
}

#[test]
fn a_path_that_reaches_a_non_string_is_a_problem_not_a_skip() {
    let s = apply(&json!({
        "apiVersion": "tekton.dev/v1beta1", "kind": "Task",
        "spec": {"steps": [{"name": "a", "image": {"ref": "x"}}, {"image": 3}, {"image": null}],
                 "sidecars": "nope"}
    }));
    assert!(s.fields.is_empty(), "{:?}", s.fields);
    let what: Vec<&str> = s.problems.iter().map(|p| p.what.as_str()).collect();
    assert_eq!(what.len(), 3, "{what:?}");
    assert!(
        what[0].contains("spec.steps[0].image holds a map"),
        "{}",
        what[0]
    );
    assert!(
        what[0].contains("tekton.dev/* Task: spec.steps[*].image"),
        "{}",
        what[0]
    );
    assert!(what[1].contains("holds a number"), "{}", what[1]);
    assert!(what[2].contains("spec.sidecars holds a string") && what[2].contains("expects a list"));
}

#[test]
fn built_in_groups_keep_nothing_and_other_versions_only_when_listed() {
    let s = summarize_value(
        &json!({"apiVersion": "apps/v1", "kind": "Deployment", "spec": {"replicas": 1}}),
    );
    assert!(s.custom.is_none());
    let s =
        summarize_value(&json!({"spec": {"x": 1}, "apiVersion": "apps/v1", "kind": "Deployment"}));
    assert!(
        s.custom.is_none(),
        "apiVersion after spec: kept, then dropped"
    );
    let only_v2 = Extractors::default()
        .with(
            &[ExtractorSpec {
                api_version: "example.com/v2".into(),
                kind: "Thing".into(),
                resource: None,
                paths: vec!["spec.image".into()],
            }],
            "test",
        )
        .unwrap();
    for (v, n) in [("example.com/v2", 1), ("example.com/v1", 0)] {
        let mut s =
            summarize_value(&json!({"apiVersion": v, "kind": "Thing", "spec": {"image": "nginx"}}));
        only_v2.apply(&mut s);
        assert_eq!(s.fields.len(), n, "{v}");
    }
}

#[test]
fn the_shape_walk_is_the_same_when_spec_comes_before_api_version() {
    let a = json!({"apiVersion": "example.com/v1", "kind": "Thing",
                   "spec": {"containers": [{"name": "c", "image": "nginx"}], "template": {"spec": {"containers": [{"image": "x"}]}}}});
    let text = r#"{"spec": {"containers": [{"name": "c", "image": "nginx"}], "template": {"spec": {"containers": [{"image": "x"}]}}}, "kind": "Thing", "apiVersion": "example.com/v1"}"#;
    let b = crate::walker::summarize_json(text).unwrap();
    assert_eq!(summarize_value(&a).fields, b.fields);
    assert_eq!(b.fields.len(), 2);
}

#[test]
fn bad_extractors_are_refused_with_the_entry_named() {
    let spec = |v: &str, k: &str, p: &str| ExtractorSpec {
        api_version: v.into(),
        kind: k.into(),
        resource: None,
        paths: vec![p.into()],
    };
    for (s, want) in [
        (spec("v1", "Pod", "spec.image"), "has no group"),
        (spec("example.com/v1", "Thing", "spec..image"), "empty key"),
        (
            spec("example.com/v1", "Thing", "spec.steps[0].image"),
            "is not [*]",
        ),
        (
            spec("example.com/v1", "Thing", "spec.steps[*"),
            "is not [*]",
        ),
        (spec("example.com/v1", "", "spec.image"), "is not a kind"),
        (spec("example.com", "Thing", "spec.image"), "has no group"),
    ] {
        let e = Extractors::default().with(&[s], "p").unwrap_err();
        assert!(
            e.starts_with("imageExtractors[0]: ") && e.contains(want),
            "{e}"
        );
    }
    let twice = [
        spec("example.com/v1", "Thing", "spec.image"),
        spec("example.com/*", "Thing", "spec.other"),
    ];
    assert!(
        Extractors::default()
            .with(&twice, "p")
            .unwrap_err()
            .contains("listed twice")
    );
}

#[test]
fn a_policy_replaces_a_default_kind_and_empty_paths_turn_it_off() {
    let off = Extractors::defaults()
        .with(
            &[ExtractorSpec {
                api_version: "tekton.dev/*".into(),
                kind: "Task".into(),
                resource: None,
                paths: vec![],
            }],
            "ClusterImagePolicy p",
        )
        .unwrap();
    let mut s = summarize_value(
        &json!({"apiVersion": "tekton.dev/v1", "kind": "Task", "spec": {"steps": [{"image": "x"}]}}),
    );
    off.apply(&mut s);
    assert!(s.fields.is_empty());
    assert_eq!(
        off.find("tekton.dev/v1", "Task").unwrap().source,
        "ClusterImagePolicy p"
    );
    let merged = Extractors::defaults().merged(&off).unwrap();
    assert!(
        merged
            .find("tekton.dev/v1", "Task")
            .unwrap()
            .paths
            .is_empty()
    );
    let other = Extractors::defaults()
        .with(
            &[ExtractorSpec {
                api_version: "tekton.dev/*".into(),
                kind: "Task".into(),
                resource: None,
                paths: vec!["spec.x".into()],
            }],
            "ClusterImagePolicy q",
        )
        .unwrap();
    assert!(
        off.merged(&other)
            .unwrap_err()
            .contains("both set imageExtractors")
    );
}

#[test]
fn plurals_follow_kubernetes_defaults() {
    for (k, p) in [
        ("Task", "tasks"),
        ("Prometheus", "prometheuses"),
        ("Policy", "policies"),
        ("Gateway", "gateways"),
        ("Box", "boxes"),
        ("Watch", "watches"),
    ] {
        assert_eq!(plural(k), p);
    }
}
