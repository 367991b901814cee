//! The plan memo: shared plans equal fresh ones, and nothing is remembered
//! where it could be wrong (labels under selectors, a policy changed by
//! `without_verification`, a plan one admission had served elsewhere).

use std::sync::Arc;

use super::super::*;
use super::{SHARD_CAPACITY, SHARDS};

fn policy(rules: &str) -> Policy {
    Policy::from_yaml(&format!(
        "apiVersion: sigil.dev/v1alpha1\nkind: ImagePolicy\nspec:\n  mirrors:\n  - {{from: docker.io, to: [a.local/hub, b.local/hub], fallback: origin}}\n  rules:\n{rules}"
    ))
    .unwrap()
}

#[test]
fn a_planned_image_is_shared_by_later_plans_and_equals_a_fresh_plan() {
    let p = policy("  - {name: all, match: ['**']}\n");
    for written in ["nginx:1", " a.local/hub/library/nginx:1 ", "Bad:Ref", ""] {
        let first = p.plan_shared(written, None);
        let again = p.plan_shared(written, None);
        let fresh = p.plan_in(written, None);
        match (&first, &again, &fresh) {
            (Ok(a), Ok(b), Ok(f)) => {
                assert!(Arc::ptr_eq(a, b), "{written:?}: planned once");
                assert_eq!(**a, *f, "{written:?}");
            }
            (Err(a), Err(b), Err(f)) => {
                assert_eq!(a, f, "{written:?}");
                assert_eq!(b, f, "{written:?}");
            }
            _ => panic!("{written:?}: {first:?} / {again:?} / {fresh:?}"),
        }
    }
    assert_eq!(p.plans.len(), 4, "denials are remembered too");
}

#[test]
fn rules_that_select_namespaces_are_planned_for_the_labels_given() {
    let p = policy(
        "  - {name: all, match: ['**']}\n  - name: prod\n    match: ['**']\n    action: deny\n    namespaceSelector: {matchLabels: {tier: prod}}\n",
    );
    let prod: Labels = [("tier".to_owned(), "prod".to_owned())].into();
    let dev: Labels = [("tier".to_owned(), "dev".to_owned())].into();
    assert_eq!(
        &*p.plan_shared("nginx:1", Some(&prod)).unwrap().rule,
        "prod"
    );
    assert_eq!(&*p.plan_shared("nginx:1", Some(&dev)).unwrap().rule, "all");
    assert_eq!(
        &*p.plan_shared("nginx:1", Some(&prod)).unwrap().rule,
        "prod"
    );
    assert_eq!(p.plans.len(), 0, "nothing remembered under labels");
    // Without labels, selecting rules never apply: that plan is the same
    // every time, so it is remembered.
    assert_eq!(&*p.plan_shared("nginx:1", None).unwrap().rule, "all");
    assert_eq!(p.plans.len(), 1);
    // A policy without selectors reads no labels, so it remembers them all.
    let plain = policy("  - {name: all, match: ['**']}\n");
    plain.plan_shared("nginx:1", Some(&prod)).unwrap();
    assert!(Arc::ptr_eq(
        &plain.plan_shared("nginx:1", Some(&dev)).unwrap(),
        &plain.plan_shared("nginx:1", None).unwrap()
    ));
}

#[test]
fn without_verification_forgets_the_plans_that_named_a_verification() {
    let p = policy(
        "  - name: signed\n    match: ['**']\n    verify: [{name: k, cosign: {key: /etc/sigil/k.pub}}]\n",
    );
    assert!(p.plan_shared("nginx:1", None).unwrap().verify.is_some());
    let p = p.without_verification();
    assert!(p.plan_shared("nginx:1", None).unwrap().verify.is_none());
    let copy = p.clone();
    assert_eq!(copy.plans.len(), 0, "a clone starts empty");
}

#[test]
fn a_flood_of_distinct_images_keeps_the_memo_bounded() {
    let p = policy("  - {name: all, match: ['**']}\n");
    for i in 0..(SHARDS * SHARD_CAPACITY * 3) {
        p.plan_shared(&format!("img{i}:1"), None).unwrap();
    }
    assert!(
        p.plans.len() <= SHARDS * SHARD_CAPACITY,
        "{}",
        p.plans.len()
    );
    // And it still answers equal to planning afresh.
    assert_eq!(
        *p.plan_shared("img7:1", None).unwrap(),
        p.plan_in("img7:1", None).unwrap()
    );
}

#[test]
fn an_image_served_by_another_mirror_changes_only_that_admissions_plan() {
    use crate::object::{ObjectFacts, ObjectPlan, Operation, Source, plan_object};
    use crate::walker::summarize_value;
    let p = policy("  - {name: all, match: ['**']}\n");
    let pod = serde_json::json!({"kind": "Pod", "spec": {"containers": [{"name": "a", "image": "nginx:1"}]}});
    let plan_it = || {
        plan_object(
            &p,
            ObjectFacts {
                operation: Operation::Create,
                source: Source::Admission,
                kind: "Pod",
                namespace: Some("team"),
                object: Some(summarize_value(&pod)),
                old_object: None,
                namespace_labels: None,
            },
        )
    };
    let first = plan_it();
    let planned = first.lookups()[0].clone();
    assert_eq!(planned.to_string(), "a.local/hub/library/nginx:1");
    let by = Reference::parse("b.local/hub/library/nginx:1").unwrap();
    let served: crate::AnswerMap<_, _> = [(planned.clone(), (by.clone(), None))]
        .into_iter()
        .collect();
    let first = first.served_by(&served);
    assert!(matches!(first, ObjectPlan::Fields(_)));
    assert_eq!(
        first.lookups(),
        [&by],
        "this admission pins where it was served"
    );
    assert_eq!(
        plan_it().lookups(),
        [&planned],
        "the next admission plans the first mirror again"
    );
}
