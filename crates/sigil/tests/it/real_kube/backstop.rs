//! The in-API-server backstop (`sigil backstop`) on a real API server: the
//! printed ValidatingAdmissionPolicy, installed as the chart installs it
//! (`--set-file backstop.manifests=`), type-checks against the Pod schema;
//! with sigil serving nothing changes (it pins first; the backstop runs
//! after mutation); with the webhook failing open and sigil gone, and again
//! with the webhook timing out, Pods with images sigil would never admit
//! are refused naming the backstop and the fix, a Pod pinned at the mirror
//! (as `sigil pin` writes it in Git) is admitted, exempt namespaces admit,
//! an UPDATE that keeps its images passes, and all of it holds after the
//! API server restarts.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::{install_with_sigil, namespaces_with_accounts, pod, sigil_as_admin};
use crate::kubelet::Runtime;
use crate::support::kube::real::{RealKube, assets_or_skip};

const DIGEST: &str = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

/// An enforcing policy with a mirror, a deny rule and a warn rule; the test
/// registry (`127.0.0.1:PORT`) is pinned under `local`.
const POLICY: &str = "apiVersion: sigil.dev/v1alpha1\nkind: ImagePolicy\nmetadata: {name: cluster}\nspec:\n  mirrors:\n    - {from: \"registry.example.com/team\", to: [\"mirror.example.com/team\"]}\n  rules:\n    - {name: team, match: [\"registry.example.com/team/**\"], mode: enforce}\n    - {name: legacy, match: [\"registry.example.com/legacy/**\"], action: deny}\n    - {name: tools, match: [\"docker.io/library/**\"], mode: warn}\n    - {name: local, match: [\"127.0.0.1:*/**\"], mode: enforce}\n  exemptNamespaces: [kube-system, sigil-system, playground]\n";

/// `sigil backstop --policy FILE`, installed as the chart installs it
/// (`--set-file backstop.manifests=`, GitOps): the chart's rendering of it.
fn backstop(policy: &str) -> Vec<Value> {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("backstop.yaml");
    let printed = crate::helm::printed_backstop(&file, Some(policy));
    let chart: Vec<Value> =
        crate::helm::rendered(&[&format!("@backstop.manifests={}", file.display())])
            .into_iter()
            .filter(|o| {
                o["kind"]
                    .as_str()
                    .is_some_and(|k| k.starts_with("ValidatingAdmissionPolicy"))
            })
            .collect();
    // Helm installs by kind (policies before their bindings).
    let key = |o: &Value| (o["kind"].to_string(), o["metadata"]["name"].to_string());
    let (mut a, mut b) = (chart.clone(), printed);
    a.sort_by_key(key);
    b.sort_by_key(key);
    assert_eq!(a, b, "the chart renders the printed backstop");
    chart
}

async fn create(kube: &RealKube, ns: &str, name: &str, image: &str) -> (u16, Value) {
    kube.request(
        "POST",
        &format!("/api/v1/namespaces/{ns}/pods"),
        Some(&pod(ns, name, image)),
    )
    .await
}

/// Waits until the API server enforces the backstop (it loads policies
/// asynchronously): a dry run of a Pod it refuses is refused.
async fn wait_in_force(kube: &RealKube) {
    namespaces_with_accounts(kube, &["probe"]).await;
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        let (status, v) = kube
            .request(
                "POST",
                "/api/v1/namespaces/probe/pods?dryRun=All",
                Some(&pod("probe", "probe", "quay.io/never/admitted:1")),
            )
            .await;
        if status == 403 {
            assert!(
                v["message"]
                    .as_str()
                    .unwrap_or_default()
                    .contains("sigil-backstop"),
                "{v}"
            );
            return;
        }
        assert!(
            Instant::now() < until,
            "the backstop never came into force: {status} {v}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Waits until the API server has type-checked the policy; its warnings.
async fn type_checked(kube: &RealKube, name: &str) -> Value {
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        let p = kube
            .get(&format!(
                "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies/{name}"
            ))
            .await
            .unwrap();
        if p["status"]["observedGeneration"] == p["metadata"]["generation"] {
            return p["status"]["typeChecking"].clone();
        }
        assert!(Instant::now() < until, "{name} was never type-checked: {p}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_backstop_refuses_what_sigil_would_never_admit_while_the_webhook_fails_open() {
    let Some(assets) = assets_or_skip(
        "the_backstop_refuses_what_sigil_would_never_admit_while_the_webhook_fails_open",
    ) else {
        return;
    };
    // The controller-manager writes the policies' type-checking status.
    let kube = RealKube::start_with(&assets, true).await;
    let generated = backstop(POLICY);
    let mut kinds: Vec<&str> = generated
        .iter()
        .map(|o| o["kind"].as_str().unwrap())
        .collect();
    kinds.sort();
    assert_eq!(
        kinds,
        [
            "ValidatingAdmissionPolicy",
            "ValidatingAdmissionPolicy",
            "ValidatingAdmissionPolicyBinding",
            "ValidatingAdmissionPolicyBinding"
        ]
    );
    kube.apply(&generated).await;
    for name in ["sigil-backstop", "sigil-backstop-warn"] {
        let checked = type_checked(&kube, name).await;
        assert!(
            checked["expressionWarnings"].is_null(),
            "the API server's type check of {name}: {checked}"
        );
    }

    wait_in_force(&kube).await;
    let mut objects = crate::deploy::render("base");
    crate::shipped::find_mut(&mut objects, "ConfigMap", "sigil-policy")["data"]["policy.yaml"] =
        json!(POLICY);
    let (launched, applied) = install_with_sigil(&kube, objects, Runtime::Process).await;
    namespaces_with_accounts(&kube, &["playground", "ignored"]).await;
    kube.apply(&[json!({"apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": "ignored", "labels": {"sigil.dev/ignore": "true"}}})])
        .await;
    let reg = &launched.registry;
    let digest = reg.push_image("shop/app", "1.0").await;
    let local = format!("{}/shop/app:1.0", reg.host());

    // sigil serving: nothing changes (pinned by the webhook, then checked).
    let (status, v) = create(&kube, "shop", "served", &local).await;
    assert_eq!(status, 201, "{v}\n{}", launched.sigil.logs());
    assert_eq!(
        v["spec"]["containers"][0]["image"],
        format!("{local}@{digest}")
    );

    // sigil gone, the webhook failing open: the backstop decides alone.
    drop(launched);
    let mut webhook =
        crate::shipped::find(&applied, "MutatingWebhookConfiguration", "sigil").clone();
    webhook["webhooks"][0]["failurePolicy"] = json!("Ignore");
    kube.apply(&[webhook]).await;
    // The API server takes the new failure policy on within a moment.
    let until = Instant::now() + Duration::from_secs(30);
    while create(&kube, "probe", "open", "quay.io/never/admitted:1")
        .await
        .0
        == 500
    {
        assert!(Instant::now() < until, "the webhook never failed open");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    check_alone(&kube, &local).await;
    // Timing out instead (a listener that never answers, timeoutSeconds 1,
    // failing open): the API server waits out the webhook, then the
    // backstop refuses alone.
    let blackhole = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let mut webhook =
        crate::shipped::find(&applied, "MutatingWebhookConfiguration", "sigil").clone();
    webhook["webhooks"][0]["failurePolicy"] = json!("Ignore");
    webhook["webhooks"][0]["timeoutSeconds"] = json!(1);
    webhook["webhooks"][0]["clientConfig"]["url"] = json!(format!(
        "https://127.0.0.1:{}/mutate",
        blackhole.local_addr().unwrap().port()
    ));
    kube.apply(&[webhook]).await;
    let until = Instant::now() + Duration::from_secs(30);
    let mut n = 0;
    loop {
        n += 1;
        let t = Instant::now();
        let (status, v) = create(&kube, "shop", &format!("timeout-{n}"), "quay.io/other/x:1").await;
        if t.elapsed() >= Duration::from_millis(900) {
            assert_eq!(status, 403, "{v}");
            assert!(
                v["message"]
                    .as_str()
                    .unwrap_or_default()
                    .contains("sigil-backstop"),
                "{v}"
            );
            break;
        }
        assert!(Instant::now() < until, "the webhook never timed out");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    drop(blackhole);
    // Still in force after the API server restarts (it is stored, not served).
    kube.restart_apiserver().await;
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        let (status, _) = create(&kube, "shop", "after-restart", &local).await;
        if status == 403 {
            break;
        }
        assert!(
            Instant::now() < until,
            "the backstop is not in force after a restart: {status}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    break_glass_leaves_the_backstop_unless_told(&kube).await;
}

/// `sigil break-glass` as an operator runs it: the backstop stays (and it
/// says so); with `--backstop` it goes too.
async fn break_glass_leaves_the_backstop_unless_told(kube: &RealKube) {
    let sigil = |args: &[&str]| sigil_as_admin(kube, args);
    let vap = "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies/sigil-backstop";
    let said = tokio::task::block_in_place(|| sigil(&["break-glass", "--reason", "drill"]));
    assert!(
        said.contains("backstop") && said.contains("stays"),
        "{said}"
    );
    assert!(kube.get(vap).await.is_some(), "the backstop stays");
    let (status, _) = create(kube, "shop", "during-break-glass", "quay.io/other/x:1").await;
    assert_eq!(status, 403, "still refused by the backstop");
    tokio::task::block_in_place(|| sigil(&["break-glass", "--end"]));
    let said = tokio::task::block_in_place(|| {
        sigil(&["break-glass", "--reason", "backstop broken", "--backstop"])
    });
    for gone in [
        "ValidatingAdmissionPolicyBinding/sigil-backstop",
        "ValidatingAdmissionPolicy/sigil-backstop",
        "ValidatingAdmissionPolicy/sigil-backstop-warn",
    ] {
        assert!(said.contains(gone), "{gone} in {said}");
    }
    assert!(kube.get(vap).await.is_none(), "the backstop is deleted");
}

/// What the backstop refuses and admits with no webhook answering.
async fn check_alone(kube: &RealKube, local: &str) {
    let refused = [
        (
            "unpinned",
            "registry.example.com/team/app:1",
            "has no digest (rule team pins it)",
        ),
        (
            "origin",
            &format!("registry.example.com/team/app:1@{DIGEST}"),
            "is not pulled from its mirror (rule team)",
        ),
        (
            "mirror-tag",
            "mirror.example.com/team/app:1",
            "has no digest (rule team pins it)",
        ),
        (
            "legacy",
            &format!("registry.example.com/legacy/x@{DIGEST}"),
            "is denied by rule legacy",
        ),
        (
            "unknown",
            "quay.io/other/x:1",
            "matches no rule of the policy",
        ),
        ("local", local, "has no digest (rule local pins it)"),
    ];
    for (name, image, why) in refused {
        let (status, v) = create(kube, "shop", name, image).await;
        assert_eq!(status, 403, "{name}: {v}");
        let message = v["message"].as_str().unwrap_or_default();
        for want in [
            "sigil-backstop",
            "sigil's backstop refused this Pod",
            why,
            "sigil pin -w DIR",
        ] {
            assert!(message.contains(want), "{name}: {want:?} not in {message}");
        }
    }
    // Pinned at the mirror, as `sigil pin` writes it in Git; a warn rule's
    // image (a warning only); exempt namespaces.
    let admitted = [
        (
            "shop",
            "pinned",
            format!("mirror.example.com/team/app:1@{DIGEST}"),
        ),
        ("shop", "tools", "nginx:1.27".to_owned()),
        (
            "kube-system",
            "sys",
            "registry.example.com/team/app:1".to_owned(),
        ),
        (
            "playground",
            "play",
            "registry.example.com/team/app:1".to_owned(),
        ),
        (
            "ignored",
            "opted-out",
            "registry.example.com/team/app:1".to_owned(),
        ),
    ];
    for (ns, name, image) in admitted {
        let (status, v) = create(kube, ns, name, &image).await;
        assert_eq!(status, 201, "{ns}/{name} ({image}): {v}");
    }
    // A Pod with many containers stays inside the API server's CEL cost
    // budget: 150 containers and 100 init containers, each image checked.
    let many = |bad: Option<&str>| {
        let pinned = format!("mirror.example.com/team/app:1@{DIGEST}");
        let list = |prefix: &str, n: usize| -> Vec<Value> {
            (0..n)
                .map(|i| {
                    json!({"name": format!("{prefix}{i}"),
                           "image": format!("mirror.example.com/team/app{i}:1@{DIGEST}")})
                })
                .collect()
        };
        let mut p = pod(
            "shop",
            if bad.is_some() { "many-bad" } else { "many" },
            &pinned,
        );
        p["spec"]["containers"] = json!(list("c", 150));
        p["spec"]["initContainers"] = json!(list("i", 100));
        if let Some(b) = bad {
            p["spec"]["containers"][149]["image"] = json!(b);
        }
        p
    };
    let (status, v) = kube
        .request("POST", "/api/v1/namespaces/shop/pods", Some(&many(None)))
        .await;
    assert_eq!(status, 201, "250 pinned images: {v}");
    let (status, v) = kube
        .request(
            "POST",
            "/api/v1/namespaces/shop/pods",
            Some(&many(Some("registry.example.com/team/app:2"))),
        )
        .await;
    assert_eq!(status, 403, "one unpinned among 250: {v}");
    assert!(
        v["message"]
            .as_str()
            .unwrap_or_default()
            .contains("registry.example.com/team/app:2 has no digest"),
        "{v}"
    );
    // An UPDATE that keeps its images (a label, a finalizer's removal)
    // passes, even for images the backstop would refuse now: the Pod in
    // `ignored` is moved under the backstop by dropping the label.
    kube.apply(&[json!({"apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": "ignored", "labels": {"sigil.dev/ignore": null}}})])
        .await;
    let (status, v) = kube
        .request(
            "PATCH",
            "/api/v1/namespaces/ignored/pods/opted-out",
            Some(&json!({"metadata": {"labels": {"touched": "yes"}}})),
        )
        .await;
    assert_eq!(status, 200, "an UPDATE keeping its images: {v}");
}
