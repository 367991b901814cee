use super::*;
use crate::audit::report::{ObjectMeta, Scope};
use sigil_core::audit::{FieldAudit, ObjectAudit};
use sigil_core::object::RuleRef;
use sigil_core::walker::{FieldKind, ImageField};

fn field(
    image: &str,
    violations: Vec<Violation>,
    rule: Option<(&str, Option<&str>)>,
) -> FieldAudit {
    FieldAudit {
        field: ImageField {
            pointer: "/spec/template/spec/containers/0/image".into(),
            path: ["spec", "template", "spec", "containers", "0", "image"]
                .map(str::to_owned)
                .to_vec(),
            kind: FieldKind::Container,
            name: Some("app".into()),
            value: image.into(),
        },
        verdict: if violations.is_empty() {
            "unchanged".into()
        } else {
            "denied:unverified".into()
        },
        expected: None,
        running: None,
        violations,
        rule: rule.map(|(n, s)| RuleRef {
            name: n.into(),
            source: s.map(str::to_owned),
        }),
    }
}

fn violation(reason: Reason, mode: Mode) -> Violation {
    Violation {
        reason,
        mode,
        detail: "failed signature verification".into(),
        fix: "sign it".into(),
        exception: None,
    }
}

fn object(ns: &str, name: &str, result: ObjectResult, fields: Vec<FieldAudit>) -> ObjectReport {
    ObjectReport::new(
        ObjectMeta {
            namespace: ns.into(),
            kind: "Deployment".into(),
            name: name.into(),
            uid: format!("uid-{name}"),
            api_version: "apps/v1".into(),
            ..ObjectMeta::default()
        },
        ObjectAudit { result, fields },
    )
}

fn audit(objects: Vec<ObjectReport>) -> Report {
    Report::finish(
        "cluster".into(),
        Scope::default(),
        objects,
        Vec::new(),
        std::time::SystemTime::now(),
        0,
    )
}

#[test]
fn one_report_per_namespace_with_a_result_per_field_and_rule() {
    let r = audit(vec![
        object(
            "team-a",
            "api",
            ObjectResult::Violating,
            vec![
                field(
                    "r.example/api:v1",
                    vec![violation(Reason::Signature, Mode::Enforce)],
                    Some(("signed", Some("ClusterImagePolicy supply-chain"))),
                ),
                field("r.example/side:v1", vec![], Some(("pin-everything", None))),
            ],
        ),
        object(
            "team-a",
            "web",
            ObjectResult::Violating,
            vec![
                field(
                    "r.example/web:v1",
                    vec![violation(Reason::NotPinned, Mode::Warn)],
                    Some(("pin-everything", None)),
                ),
                field(
                    "r.example/x:v1",
                    vec![violation(Reason::Unresolvable, Mode::Enforce)],
                    Some(("pin-everything", None)),
                ),
            ],
        ),
        object(
            "kube-system",
            "dns",
            ObjectResult::Exempt,
            vec![field("r.example/dns:v1", vec![], None)],
        ),
        object(
            "team-b",
            "job",
            ObjectResult::Compliant,
            vec![field(
                "r.example/job@sha256:00",
                vec![],
                Some(("allowed-images", Some("ImagePolicy team-b/strict"))),
            )],
        ),
    ]);
    let reports = reports(&r, Api::Wgpolicyk8s);
    assert_eq!(reports.len(), 2, "exempt namespaces are not reported");
    let a = &reports[0];
    assert_eq!(a["apiVersion"], "wgpolicyk8s.io/v1alpha2");
    assert_eq!(a["kind"], "PolicyReport");
    assert_eq!(a["metadata"]["namespace"], "team-a");
    assert_eq!(a["metadata"]["name"], "sigil");
    assert_eq!(
        a["summary"],
        json!({"pass": 1, "fail": 1, "warn": 1, "error": 1, "skip": 0})
    );
    let fail = a["results"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["result"] == "fail")
        .unwrap();
    assert_eq!(fail["policy"], "ClusterImagePolicy/supply-chain");
    assert_eq!(fail["rule"], "signed");
    assert_eq!(fail["severity"], "high");
    assert_eq!(fail["category"], "signature");
    assert_eq!(fail["source"], "sigil");
    assert_eq!(fail["properties"]["image"], "r.example/api:v1");
    assert_eq!(
        fail["resources"][0],
        json!({"apiVersion": "apps/v1", "kind": "Deployment", "name": "api", "namespace": "team-a", "uid": "uid-api"})
    );
    assert!(
        fail["message"]
            .as_str()
            .unwrap()
            .contains("failed signature verification; to fix: sign it")
    );
    assert!(fail["timestamp"]["seconds"].as_i64().unwrap() > 1_700_000_000);
    let pass = a["results"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["result"] == "pass")
        .unwrap();
    assert_eq!(
        pass["policy"], "cluster",
        "the policy file's rules are under its name"
    );
    let b = &reports[1];
    assert_eq!(b["results"][0]["policy"], "ImagePolicy/team-b/strict");
    let open = reports_of_openreports(&r);
    assert_eq!(open[0]["apiVersion"], "openreports.io/v1alpha1");
    assert_eq!(open[0]["kind"], "Report");
    assert_eq!(open[0]["source"], "sigil");
}

fn reports_of_openreports(r: &Report) -> Vec<Value> {
    reports(r, Api::OpenReports)
}

#[test]
fn cluster_scoped_objects_go_to_a_cluster_report() {
    let r = audit(vec![object(
        "",
        "node-agent",
        ObjectResult::Compliant,
        vec![field("r.example/a:v1", vec![], Some(("pin", None)))],
    )]);
    let reports = reports(&r, Api::OpenReports);
    assert_eq!(reports[0]["kind"], "ClusterReport");
    assert!(reports[0]["metadata"].get("namespace").is_none());
}

#[test]
fn a_namespace_over_the_limit_keeps_its_failures_and_says_how_many_it_left_out() {
    let mut objects = Vec::new();
    for i in 0..MAX_RESULTS {
        objects.push(object(
            "big",
            &format!("ok-{i}"),
            ObjectResult::Compliant,
            vec![field("r.example/a:v1", vec![], Some(("pin", None)))],
        ));
    }
    for i in 0..10 {
        objects.push(object(
            "big",
            &format!("bad-{i}"),
            ObjectResult::Violating,
            vec![field(
                "r.example/b:v1",
                vec![violation(Reason::Denied, Mode::Enforce)],
                Some(("deny", None)),
            )],
        ));
    }
    let reports = reports(&audit(objects), Api::Wgpolicyk8s);
    let big = &reports[0];
    assert_eq!(big["results"].as_array().unwrap().len(), MAX_RESULTS);
    assert_eq!(
        big["summary"]["pass"], MAX_RESULTS,
        "the summary counts everything"
    );
    assert_eq!(big["summary"]["fail"], 10);
    assert_eq!(big["metadata"]["annotations"][TRUNCATED], "10");
    let fails = big["results"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["result"] == "fail")
        .count();
    assert_eq!(fails, 10, "failures are kept before passes");
    assert!(serde_json::to_vec(big).unwrap().len() < 1_000_000);
}

/// An excepted failure is reported as `skip`, naming the exception, its
/// expiry and ticket.
#[test]
fn an_excepted_failure_is_a_skip_naming_the_exception() {
    let mut v = violation(Reason::Denied, Mode::Warn);
    v.exception = Some(sigil_core::exception::Waiver {
        exception: "ImagePolicyException team-a/legacy".into(),
        expires: "2026-12-31T00:00:00Z".into(),
        reason: "vendor image".into(),
        ticket: Some("SEC-1234".into()),
    });
    let r = audit(vec![object(
        "team-a",
        "api",
        ObjectResult::Violating,
        vec![field(
            "r.example/legacy:v1",
            vec![v],
            Some(("banned", Some("ClusterImagePolicy supply-chain"))),
        )],
    )]);
    let a = &reports(&r, Api::Wgpolicyk8s)[0];
    assert_eq!(a["summary"]["skip"], 1, "{a}");
    let s = &a["results"][0];
    assert_eq!(s["result"], "skip");
    assert_eq!(s["rule"], "banned");
    assert_eq!(
        s["properties"]["exception"],
        "ImagePolicyException team-a/legacy"
    );
    assert_eq!(s["properties"]["expires"], "2026-12-31T00:00:00Z");
    assert_eq!(s["properties"]["ticket"], "SEC-1234");
    assert!(
        s["message"]
            .as_str()
            .unwrap()
            .contains("excepted by ImagePolicyException team-a/legacy until 2026-12-31T00:00:00Z: vendor image"),
        "{s}"
    );
}
