use serde_json::json;

use super::*;
use crate::failure::ResolveFailure;
use crate::object::{Answers, ObjectFacts, Operation, Source, plan_object};
use crate::policy::Policy;
use crate::walker::summarize_value;

const POLICY: &str = "apiVersion: sigil.dev/v1alpha1\nkind: ImagePolicy\nspec:\n  pin: {scope: pods}\n  mirrors: [{from: docker.io, to: m.local/hub}]\n  rules:\n  - {name: all, match: ['**'], mode: enforce}\n  - {name: soft, match: ['m.local/soft/**'], mode: warn}\n  - {name: bad, match: ['docker.io/library/bad'], action: deny}\n  exemptNamespaces: [kube-system]\n";

const D1: &str = "sha256:1111111111111111111111111111111111111111111111111111111111111111";
const D2: &str = "sha256:2222222222222222222222222222222222222222222222222222222222222222";

fn audit(kind: &str, ns: &str, obj: &Value, answers: &Answers) -> ObjectAudit {
    let policy = Policy::from_yaml(POLICY).expect("policy");
    let summary = summarize_value(obj);
    let fields = summary.fields.clone();
    let plan = plan_object(
        &policy,
        ObjectFacts {
            operation: Operation::Create,
            source: Source::Admission,
            kind,
            namespace: Some(ns),
            object: Some(summary),
            old_object: None,
            namespace_labels: None,
        },
    );
    audit_object(plan.decide(answers), &fields, &running_images(obj))
}

fn pod(image: &str, image_id: Option<&str>) -> Value {
    let mut p = json!({"kind": "Pod", "metadata": {"name": "p"},
        "spec": {"containers": [{"name": "c", "image": image}]}});
    if let Some(id) = image_id {
        p["status"] = json!({"containerStatuses": [{"name": "c", "imageID": id}]});
    }
    p
}

fn answers(target: &str, r: Result<&str, ResolveFailure>) -> Answers {
    let mut a = Answers::default();
    a.digests.insert(
        Reference::parse(target).expect("ref"),
        r.map(|d| Digest::parse(d).expect("digest")),
    );
    a
}

fn reasons(a: &ObjectAudit) -> Vec<Reason> {
    a.fields
        .iter()
        .flat_map(|f| f.violations.iter().map(|v| v.reason))
        .collect()
}

#[test]
fn a_pinned_pod_on_the_mirror_running_its_digest_is_compliant() {
    let img = format!("m.local/hub/library/nginx@{D1}");
    let a = audit(
        "Pod",
        "shop",
        &pod(&img, Some(&format!("m.local/hub/library/nginx@{D1}"))),
        &Answers::default(),
    );
    assert_eq!(a.result, ObjectResult::Compliant, "{a:#?}");
    assert_eq!(a.fields[0].verdict, "unchanged");
    assert_eq!(a.fields[0].running.as_ref().map(Digest::as_str), Some(D1));
}

#[test]
fn a_pod_by_tag_off_the_mirror_is_not_pinned_and_not_mirrored() {
    let a = audit(
        "Pod",
        "shop",
        &pod("nginx:1", None),
        &answers("m.local/hub/library/nginx:1", Ok(D1)),
    );
    assert_eq!(a.result, ObjectResult::Violating);
    assert_eq!(reasons(&a), vec![Reason::NotMirrored, Reason::NotPinned]);
    assert_eq!(a.fields[0].verdict, "pinned");
}

#[test]
fn workloads_the_webhook_only_checks_are_compliant_when_their_pods_would_be_pinned() {
    let d = json!({"kind": "Deployment", "metadata": {"name": "d"},
        "spec": {"template": {"spec": {"containers": [{"name": "c", "image": "nginx:1"}]}}}});
    let a = audit(
        "Deployment",
        "shop",
        &d,
        &answers("m.local/hub/library/nginx:1", Ok(D1)),
    );
    assert_eq!(a.result, ObjectResult::Compliant, "{a:#?}");
}

#[test]
fn denials_unresolvable_and_warn_mode_keep_their_reason_and_mode() {
    let a = audit("Pod", "shop", &pod("bad:1", None), &Answers::default());
    assert_eq!(reasons(&a), vec![Reason::Denied]);
    assert_eq!(a.fields[0].verdict, "denied:static_deny");

    let gone = ResolveFailure::NotFound {
        detail: "manifest unknown".into(),
    };
    let a = audit(
        "Pod",
        "shop",
        &pod("m.local/soft/app:1", None),
        &answers("m.local/soft/app:1", Err(gone)),
    );
    assert_eq!(reasons(&a), vec![Reason::Unresolvable]);
    assert_eq!(a.fields[0].violations[0].mode, Mode::Warn);
    assert!(a.fields[0].violations[0].detail.contains("404"));
}

#[test]
fn drift_is_a_running_digest_other_than_the_pinned_or_resolved_one() {
    let img = format!("m.local/hub/library/nginx@{D1}");
    let a = audit(
        "Pod",
        "shop",
        &pod(
            &img,
            Some(&format!("docker-pullable://m.local/hub/library/nginx@{D2}")),
        ),
        &Answers::default(),
    );
    assert_eq!(reasons(&a), vec![Reason::Drift]);
    assert!(a.fields[0].violations[0].detail.contains("spec pins"));

    // By tag: the tag moved since the Pod pulled it.
    let a = audit(
        "Pod",
        "shop",
        &pod(
            "m.local/hub/library/nginx:1",
            Some(&format!("m.local/hub/library/nginx@{D2}")),
        ),
        &answers("m.local/hub/library/nginx:1", Ok(D1)),
    );
    assert_eq!(reasons(&a), vec![Reason::NotPinned, Reason::Drift]);
    assert!(a.fields[0].violations[1].detail.contains("now resolves"));

    // A bare local image ID is not a repo digest: nothing to compare.
    let a = audit("Pod", "shop", &pod(&img, Some(D2)), &Answers::default());
    assert_eq!(a.result, ObjectResult::Compliant);
}

#[test]
fn exempt_namespaces_list_their_fields_without_judging_them() {
    let a = audit(
        "Pod",
        "kube-system",
        &pod("bad:1", None),
        &Answers::default(),
    );
    assert_eq!(a.result, ObjectResult::Exempt);
    assert_eq!(a.fields.len(), 1);
    assert_eq!(a.fields[0].verdict, "exempt");
    assert!(a.fields[0].violations.is_empty());
}

#[test]
fn labels_are_stable() {
    let labels: Vec<&str> = Reason::ALL.iter().map(|r| r.as_str()).collect();
    assert_eq!(
        labels,
        [
            "denied",
            "signature",
            "attestation",
            "unresolvable",
            "not_mirrored",
            "not_pinned",
            "drift"
        ]
    );
    for r in Reason::ALL {
        assert_eq!(
            serde_json::to_value(r).expect("json"),
            json!(r.as_str()),
            "serde and as_str agree"
        );
    }
}

#[test]
fn only_images_pinned_at_the_origin_by_a_fallback_are_checked_against_the_mirror() {
    let with = |extra: &str| {
        Policy::from_yaml(&format!(
            "apiVersion: sigil.dev/v1alpha1\nkind: ImagePolicy\nspec:\n  mirrors: [{{from: docker.io, to: [a.local/hub, b.local/hub]{extra}}}]\n  rules:\n  - {{name: all, match: ['**'], mode: enforce}}\n"
        ))
        .expect("policy")
    };
    let fallback = with(", fallback: origin");
    let at_origin = format!("docker.io/library/nginx:1.27@{D1}");
    let (mirror, runs) = mirror_to_check(&fallback, &at_origin).expect("checked");
    assert_eq!(mirror.to_string(), "a.local/hub/library/nginx:1.27");
    assert_eq!(runs.as_str(), D1);
    // Without fallback the webhook would have moved it; at a mirror it is
    // mirrored; without a tag there is nothing to ask the mirror.
    assert!(mirror_to_check(&with(""), &at_origin).is_none());
    assert!(mirror_to_check(&fallback, &format!("b.local/hub/library/nginx:1.27@{D1}")).is_none());
    assert!(mirror_to_check(&fallback, &format!("docker.io/library/nginx@{D1}")).is_none());
    assert!(mirror_to_check(&fallback, "docker.io/library/nginx:1.27").is_none());
    let mut f = FieldAudit {
        field: crate::walker::ImageField {
            kind: FieldKind::Container,
            name: Some("app".into()),
            path: Default::default(),
            pointer: Default::default(),
            value: at_origin.clone(),
        },
        verdict: "unchanged".into(),
        expected: None,
        running: None,
        violations: Vec::new(),
        rule: None,
    };
    not_mirrored_now(&mut f, &mirror);
    assert_eq!(f.violations[0].reason, Reason::NotMirrored);
    assert!(
        f.violations[0]
            .detail
            .contains("a.local/hub/library/nginx:1.27 serves the same digest now")
    );
}
