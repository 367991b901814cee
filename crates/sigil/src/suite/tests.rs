use super::*;
use sigil_core::ObjectRef;

fn report(
    kind: &str,
    ns: &str,
    name: &str,
    container: &str,
    verdict: &str,
    status: Status,
) -> ImageReport {
    ImageReport {
        line: 1,
        column: 1,
        api_version: "v1".into(),
        object: ObjectRef {
            kind: kind.into(),
            namespace: ns.into(),
            name: name.into(),
        },
        field: "spec.containers[0].image".into(),
        describe: String::new(),
        verdict: verdict.into(),
        image: "r.example/app:v1".into(),
        new: (status == Status::Pinned).then(|| "r.example/app:v1@sha256:aa".into()),
        status,
        message: (status == Status::Denied).then(|| "image … denied".into()),
        item: None,
        container: Some(container.into()),
        rule: Some("signed".into()),
    }
}

fn suite(results: &str) -> Suite {
    serde_saphyr::from_str(&format!(
        "apiVersion: sigil.dev/v1alpha1\nkind: Test\nmetadata: {{name: s}}\npolicies: [p.yaml]\nresources: [r.yaml]\nresults:\n{results}"
    ))
    .unwrap()
}

#[test]
fn expectations_match_resources_containers_and_what_happened() {
    let reports = vec![
        report("Pod", "", "web", "app", "pinned", Status::Pinned),
        report(
            "Pod",
            "",
            "web",
            "side",
            "denied:unverified",
            Status::Denied,
        ),
        report(
            "Pod",
            "team-a",
            "legacy",
            "app",
            "excepted:static_deny",
            Status::Warning,
        ),
    ];
    let s = suite(
        "- {resource: Pod/web, container: app, result: admitted, image: 'r.example/app:v1@sha256:aa'}
- {resource: Pod/default/web, container: side, result: denied, rule: signed, reason: unverified}
- {resource: Pod/team-a/legacy, result: excepted}
- {resource: Pod/web, container: side, result: admitted}
- {resource: Pod/web, container: app, result: admitted, rule: other}
",
    );
    let checks = check(&s, &reports, "default").unwrap();
    let passed: Vec<bool> = checks.iter().map(|c| c.passed).collect();
    assert_eq!(passed, [true, true, true, false, false]);
    let m = checks[3].message.as_deref().unwrap();
    assert!(
        m.contains("expected admitted, got denied:unverified")
            && m.contains("the decision said: image … denied"),
        "{m}"
    );
    assert!(
        checks[4]
            .message
            .as_deref()
            .unwrap()
            .contains("expected rule \"other\", got \"signed\"")
    );
    let t = table(&checks);
    assert!(t.contains("5 check(s): 3 passed, 2 failed"), "{t}");
    let x = junit(&checks);
    assert!(
        x.contains("<testsuites name=\"sigil test\" tests=\"5\" failures=\"2\">"),
        "{x}"
    );
    assert!(x.contains("failure message=\"expected admitted, got denied:unverified; the decision said: image … denied\""), "{x}");
}

#[test]
fn an_expectation_naming_nothing_is_bad_input() {
    let reports = vec![report("Pod", "", "web", "app", "pinned", Status::Pinned)];
    let e = check(
        &suite("- {resource: Pod/nope, result: admitted}\n"),
        &reports,
        "default",
    )
    .unwrap_err();
    assert!(
        e.to_string().contains("result 1: no image of Pod/nope"),
        "{e}"
    );
    let e = check(
        &suite("- {resource: Pod/web, container: x, result: admitted}\n"),
        &reports,
        "default",
    )
    .unwrap_err();
    assert!(e.to_string().contains("container \"x\""), "{e}");
    let e = check(
        &suite("- {resource: web, result: admitted}\n"),
        &reports,
        "default",
    )
    .unwrap_err();
    assert!(e.to_string().contains("not KIND/NAME"), "{e}");
    let e = check(
        &suite("- {resource: Pod/other-ns/web, result: admitted}\n"),
        &reports,
        "default",
    )
    .unwrap_err();
    assert!(e.to_string().contains("no image"), "{e}");
}

#[test]
fn junit_escapes_what_it_quotes() {
    assert_eq!(xml("a<b>&\"c'\u{1}"), "a&lt;b&gt;&amp;&quot;c&apos;");
}
