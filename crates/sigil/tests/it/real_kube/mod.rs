//! The real-API tier: what sigil does with the Kubernetes API, against a
//! real kube-apiserver (v1.36, with etcd) started by the test kit
//! (`sigil_testkit::kube::real`, envtest-style: `SIGIL_KUBE_ASSETS`).
//! Without the assets each test says it is skipped, and why. The stand-in
//! (`FakeKube`) stays for faults a real server cannot be made to produce.

use std::collections::BTreeSet;

use crate::support::kube::real::{RealKube, assets_or_skip};

mod backstop;
mod backstop_agree;
mod backstop_kept;
mod everyday;
mod image;
mod loopback;
mod monitoring;
mod node;
mod node_keyrefs;
mod node_sync;

/// What the API server itself says sigil's ServiceAccount may do, once the
/// shipped manifests are applied: its SelfSubjectRulesReview (in sigil's
/// namespace, and in another namespace for the cluster-wide grants) equals
/// the written expectation the rendered RBAC is held to
/// (`tests/fixtures/rbac/base.txt`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_service_accounts_rights_on_a_real_api_server_are_the_written_ones() {
    let Some(assets) =
        assets_or_skip("the_service_accounts_rights_on_a_real_api_server_are_the_written_ones")
    else {
        return;
    };
    let kube = RealKube::start(&assets).await;
    kube.apply(&crate::deploy::render("base")).await;
    kube.namespaces(&["elsewhere"]).await;
    let token = kube.service_account_token("sigil-system", "sigil").await;
    let expected = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/rbac/base.txt"),
    )
    .unwrap();
    for (ns, scopes) in [
        ("sigil-system", &["cluster", "namespace/sigil-system"][..]),
        ("elsewhere", &["cluster"][..]),
    ] {
        let review = kube.rules_review(&token, ns).await;
        // Every authenticated user may review itself: not sigil's grants.
        let got: BTreeSet<String> = review["status"]["resourceRules"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(crate::rbac::rule_lines)
            .filter(|l| {
                !l.contains(" authorization.k8s.io/") && !l.contains(" authentication.k8s.io/")
            })
            .collect();
        let want: BTreeSet<String> = expected
            .lines()
            .filter_map(|l| l.split_once(' '))
            .filter(|(scope, _)| scopes.contains(scope))
            .map(|(_, rest)| rest.to_owned())
            .collect();
        assert_eq!(
            got, want,
            "in namespace {ns}: the API server's view differs from the written one"
        );
    }
}

/// The Kustomize base, installed as shipped on a real API server (its CRDs,
/// RBAC, the empty certificate Secret, the webhook configuration pointed at
/// sigil on loopback): sigil runs as its Deployment says, with its
/// ServiceAccount's token, fills in the configuration's caBundle, and the
/// API server's own call pins a Pod and an Argo Workflow (a custom resource
/// the shipped image extractors name). Stopped, it fails closed for the
/// namespaces it guards while kube-system and sigil's namespace admit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_base_as_shipped_pins_through_the_real_api_server_and_fails_closed_when_down() {
    let Some(assets) = assets_or_skip(
        "the_base_as_shipped_pins_through_the_real_api_server_and_fails_closed_when_down",
    ) else {
        return;
    };
    let kube = RealKube::start(&assets).await;
    let (launched, _) = base_with_sigil(&kube, crate::kubelet::Runtime::Process).await;
    let reg = &launched.registry;
    let digest = reg.push_image("shop/app", "1.0").await;
    let image = format!("{}/shop/app:1.0", reg.host());
    let (status, created) = kube
        .request(
            "POST",
            "/api/v1/namespaces/shop/pods",
            Some(&pod("shop", "web", &image)),
        )
        .await;
    assert_eq!(status, 201, "{created}\n{}", launched.sigil.logs());
    assert_eq!(
        created["spec"]["containers"][0]["image"],
        format!("{image}@{digest}"),
        "the API server's own call to sigil pinned the Pod"
    );
    // A custom resource with images (Argo's Workflow, its own CRD): the
    // base's rules send it to sigil and the shipped extractors pin it.
    kube.apply(&fixture_crds(&["argoproj.io_workflows.yaml"]))
        .await;
    let workflow = serde_json::json!({
        "apiVersion": "argoproj.io/v1alpha1", "kind": "Workflow",
        "metadata": {"name": "hello", "namespace": "shop"},
        "spec": {"entrypoint": "main", "templates": [
            {"name": "main", "container": {"image": image, "command": ["true"]}},
            {"name": "py", "script": {"image": image, "source": "print(1)"}}]}});
    let (status, created) = kube
        .request(
            "POST",
            "/apis/argoproj.io/v1alpha1/namespaces/shop/workflows",
            Some(&workflow),
        )
        .await;
    assert_eq!(status, 201, "{created}\n{}", launched.sigil.logs());
    for t in 0..2 {
        let field = if t == 0 { "container" } else { "script" };
        assert_eq!(
            created["spec"]["templates"][t][field]["image"],
            format!("{image}@{digest}"),
            "the Workflow came back pinned: {created}"
        );
    }
    // The audit lists Workflows too (discovery finds their version): one
    // created where the webhook never looked (sigil.dev/ignore) is reported.
    kube.apply(
        &[serde_json::json!({"apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": "legacy", "labels": {"sigil.dev/ignore": "true"}}})],
    )
    .await;
    let mut unpinned = workflow.clone();
    unpinned["metadata"]["namespace"] = "legacy".into();
    let (status, v) = kube
        .request(
            "POST",
            "/apis/argoproj.io/v1alpha1/namespaces/legacy/workflows",
            Some(&unpinned),
        )
        .await;
    assert_eq!(status, 201, "{v}");
    assert_eq!(
        v["spec"]["templates"][0]["container"]["image"],
        image.as_str()
    );
    let dir = tempfile::tempdir().unwrap();
    let deny = dir.path().join("policy.yaml");
    std::fs::write(
        &deny,
        "apiVersion: sigil.dev/v1alpha1\nkind: ImagePolicy\nmetadata: {name: audit}\nspec:\n  rules: [{name: no-shop, match: [\"**\"], action: deny}]\n",
    )
    .unwrap();
    let out = std::process::Command::new(crate::support::sigil::bin())
        .args(["audit", "-n", "legacy", "-o", "json", "--policy"])
        .arg(&deny)
        .env("KUBECONFIG", kube.admin_kubeconfig())
        .output()
        .unwrap();
    let report = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(1),
        "{report}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        report.contains("\"Workflow\"") && report.contains("spec.templates[1].script.image"),
        "{report}"
    );
    // Down: fail closed where sigil guards; kube-system and sigil's own
    // namespace are never sent to it.
    drop(launched);
    let (status, refused) = kube
        .request(
            "POST",
            "/api/v1/namespaces/shop/pods",
            Some(&pod("shop", "late", &image)),
        )
        .await;
    assert_eq!(status, 500, "fail closed: {refused}");
    assert!(
        refused["message"]
            .as_str()
            .unwrap_or_default()
            .contains("images.sigil.dev"),
        "{refused}"
    );
    for ns in ["kube-system", "sigil-system"] {
        let (status, v) = kube
            .request(
                "POST",
                &format!("/api/v1/namespaces/{ns}/pods"),
                Some(&pod(ns, "sys", &image)),
            )
            .await;
        assert_eq!(status, 201, "{ns} admits while sigil is down: {v}");
    }
}

/// The CRDs as shipped, on a real API server: their CEL rules refuse what
/// a namespace editor must not write (a namespaced ImagePolicy that
/// loosens: mirrors, registries) before sigil ever sees it, with the rule's
/// message; a tightening one is stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_crds_refuse_a_loosening_image_policy_on_a_real_api_server() {
    use serde_json::json;
    let Some(assets) =
        assets_or_skip("the_crds_refuse_a_loosening_image_policy_on_a_real_api_server")
    else {
        return;
    };
    let kube = RealKube::start(&assets).await;
    let crds: Vec<serde_json::Value> = crate::deploy::render("base")
        .into_iter()
        .filter(|o| o["kind"] == "CustomResourceDefinition")
        .collect();
    kube.apply(&crds).await;
    kube.namespaces(&["team-a"]).await;
    let policies = "/apis/sigil.dev/v1alpha1/namespaces/team-a/imagepolicies";
    let policy = |name: &str, extra: serde_json::Value| {
        let mut spec = json!({"rules": [{"name": "ours", "match": ["registry.example.com/team-a/**"], "action": "allow"}]});
        for (k, v) in extra.as_object().unwrap() {
            spec[k] = v.clone();
        }
        json!({"apiVersion": "sigil.dev/v1alpha1", "kind": "ImagePolicy",
               "metadata": {"name": name, "namespace": "team-a"}, "spec": spec})
    };
    for (field, extra, says) in [
        (
            "mirrors",
            json!({"mirrors": [{"from": "docker.io", "to": "m.example.com/hub"}]}),
            "mirrors belong in a ClusterImagePolicy",
        ),
        (
            "registries",
            json!({"registries": [{"host": "r.example.com", "insecure": true}]}),
            "registry settings and credentials belong in a ClusterImagePolicy",
        ),
    ] {
        let (status, v) = kube
            .request("POST", policies, Some(&policy(field, extra)))
            .await;
        assert_eq!(status, 422, "{field}: {v}");
        assert!(
            v["message"].as_str().unwrap_or_default().contains(says),
            "{field}: {v}"
        );
    }
    let (status, v) = kube
        .request(
            "POST",
            policies,
            Some(&policy("tight", json!({"defaultAction": "deny"}))),
        )
        .await;
    assert_eq!(status, 201, "{v}");
}

/// The Helm chart with its default values, installed as shipped on a real
/// API server with its controllers: a Deployment's Pods, made by the
/// ReplicaSet controller and admitted through the API server's own call to
/// sigil, come out pinned; and they reach sigil as the same object (each
/// with its own uid and token volume), so after the first the answer is
/// reused (`admission::reuse`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_chart_as_shipped_pins_a_deployments_pods_on_a_real_api_server() {
    use serde_json::json;
    let Some(assets) =
        assets_or_skip("the_chart_as_shipped_pins_a_deployments_pods_on_a_real_api_server")
    else {
        return;
    };
    let kube = RealKube::start_with(&assets, true).await;
    // `helm install --create-namespace`: the namespace first, with the Pod
    // Security labels the base gives it.
    kube.apply(&[
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "sigil-system"}}),
    ])
    .await;
    let objects = crate::helm::rendered(&[]);
    let (port, admin) = (
        crate::support::registry::free_port(),
        crate::support::registry::free_port(),
    );
    kube.apply(&crate::shipped::point_at(
        &objects,
        &format!("https://127.0.0.1:{port}/mutate"),
    ))
    .await;
    let kubeconfig = kube
        .service_account_kubeconfig("sigil-system", "sigil")
        .await;
    let lookup = |coll: &str, name: &str| {
        objects
            .iter()
            .find(|o| {
                o["metadata"]["name"] == name
                    && coll.ends_with("/configmaps")
                    && o["kind"] == "ConfigMap"
            })
            .cloned()
    };
    let launched = crate::kubelet::launch(
        &objects,
        (port, admin),
        &lookup,
        &|_, _| kubeconfig.clone(),
        crate::kubelet::Runtime::Process,
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", kube.logs()));
    kube.namespaces(&["shop"]).await;
    let reg = &launched.registry;
    let digest = reg.push_image("shop/app", "1.0").await;
    let image = format!("{}/shop/app:1.0", reg.host());
    let deployment = json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "web", "namespace": "shop"},
        "spec": {"replicas": 4, "selector": {"matchLabels": {"app": "web"}},
                 "template": {"metadata": {"labels": {"app": "web"}},
                              "spec": {"containers": [{"name": "app", "image": image}]}}}});
    // The caBundle first: until sigil has filled it in, the API server
    // cannot call it and fails closed.
    let until = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let created = loop {
        let (status, v) = kube
            .request(
                "POST",
                "/apis/apps/v1/namespaces/shop/deployments",
                Some(&deployment),
            )
            .await;
        if status == 201 {
            break v;
        }
        assert!(
            std::time::Instant::now() < until,
            "the Deployment was never admitted: {status} {v}\n{}",
            launched.sigil.logs()
        );
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    };
    let pinned = format!("{image}@{digest}");
    assert_eq!(
        created["spec"]["template"]["spec"]["containers"][0]["image"],
        pinned
    );
    let until = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let pods = kube.get("/api/v1/namespaces/shop/pods").await.unwrap();
        let images: Vec<String> = pods["items"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|p| {
                p["spec"]["containers"][0]["image"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned()
            })
            .collect();
        if images.len() == 4 {
            assert!(images.iter().all(|i| *i == pinned), "{images:?}");
            break;
        }
        assert!(
            std::time::Instant::now() < until,
            "the ReplicaSet's Pods never appeared: {images:?}\n{}",
            kube.logs()
        );
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    }
    // The ReplicaSet creates its Pods in batches of 1, 2 and 1, each batch
    // right after the one before: within a second, however slow the
    // machine, at least one Pod after the first is answered from the table.
    let metrics = launched.sigil.metrics().await;
    let reused: f64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("sigil_admission_answers_reused_total "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no reuse counter:\n{metrics}"));
    assert!(
        reused >= 1.0,
        "no Pod of the ReplicaSet was answered from the table:\n{metrics}"
    );
}

/// The Kustomize base applied as shipped (its webhook configuration pointed
/// at sigil on loopback), sigil started as its Deployment says with its
/// ServiceAccount's token, its caBundle filled in, and a namespace `shop`
/// (with the `default` ServiceAccounts the controller-manager would make).
/// Returns sigil and the objects applied.
pub(crate) async fn base_with_sigil(
    kube: &RealKube,
    runtime: crate::kubelet::Runtime<'_>,
) -> (crate::kubelet::Launched, Vec<serde_json::Value>) {
    install_with_sigil(kube, crate::deploy::render("base"), runtime).await
}

/// [`base_with_sigil`] for any rendering of `deploy/` (an overlay, or one a
/// test has edited).
pub(crate) async fn install_with_sigil(
    kube: &RealKube,
    objects: Vec<serde_json::Value>,
    runtime: crate::kubelet::Runtime<'_>,
) -> (crate::kubelet::Launched, Vec<serde_json::Value>) {
    use serde_json::json;
    let (port, admin) = (
        crate::support::registry::free_port(),
        crate::support::registry::free_port(),
    );
    let applied = crate::shipped::point_at(&objects, &format!("https://127.0.0.1:{port}/mutate"));
    kube.apply(&applied).await;
    let kubeconfig = kube
        .service_account_kubeconfig("sigil-system", "sigil")
        .await;
    let lookup = |coll: &str, name: &str| {
        let ns = coll.split('/').nth(4).unwrap_or_default();
        objects
            .iter()
            .find(|o| {
                o["metadata"]["name"] == name
                    && o["metadata"]["namespace"] == ns
                    && coll.ends_with(&format!(
                        "/{}s",
                        o["kind"].as_str().unwrap_or_default().to_lowercase()
                    ))
            })
            .cloned()
    };
    let launched = crate::kubelet::launch(
        &objects,
        (port, admin),
        &lookup,
        &|_, _| kubeconfig.clone(),
        runtime,
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", kube.logs()));
    wait_for_ca_bundle(kube, &launched).await;
    namespaces_with_accounts(kube, &["shop"]).await;
    // No controller-manager here: kube-system's and sigil's namespace's
    // `default` ServiceAccounts are made as its controller would.
    let defaults: Vec<serde_json::Value> = ["kube-system", "sigil-system"]
        .iter()
        .map(|ns| {
            json!({"apiVersion": "v1", "kind": "ServiceAccount",
                   "metadata": {"name": "default", "namespace": ns}})
        })
        .collect();
    kube.apply(&defaults).await;
    (launched, applied)
}

/// Waits until sigil has filled in the shipped configuration's caBundle
/// (get/update of that one object is all its RBAC allows).
async fn wait_for_ca_bundle(kube: &RealKube, launched: &crate::kubelet::Launched) {
    let mwc = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/sigil";
    let until = std::time::Instant::now() + std::time::Duration::from_secs(70);
    loop {
        let filled = kube
            .get(mwc)
            .await
            .is_some_and(|c| !c["webhooks"][0]["clientConfig"]["caBundle"].is_null());
        if filled {
            return;
        }
        assert!(
            std::time::Instant::now() < until,
            "sigil never filled in the caBundle:\n{}",
            launched.sigil.logs()
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}

/// A restricted-compliant Pod (Pod Security holds in sigil's namespace).
pub(crate) fn pod(ns: &str, name: &str, image: &str) -> serde_json::Value {
    serde_json::json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": ns},
        "spec": {"securityContext": {"runAsNonRoot": true, "seccompProfile": {"type": "RuntimeDefault"}},
                 "containers": [{"name": "app", "image": image,
                     "securityContext": {"allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}}}]}})
}

/// `sigil break-glass` as an operator runs it (the admin's kubeconfig) on a
/// real API server: the configuration is gone and Pods are admitted
/// unchecked; `--end` records the window; re-applying the manifests (the
/// documented way back when they install the configuration) brings sigil
/// back in front of the API server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn break_glass_on_a_real_api_server_and_back_by_reapplying_the_manifests() {
    let Some(assets) =
        assets_or_skip("break_glass_on_a_real_api_server_and_back_by_reapplying_the_manifests")
    else {
        return;
    };
    let kube = RealKube::start(&assets).await;
    let (launched, applied) = base_with_sigil(&kube, crate::kubelet::Runtime::Process).await;
    let reg = &launched.registry;
    let digest = reg.push_image("shop/app", "1.0").await;
    let image = format!("{}/shop/app:1.0", reg.host());
    let sigil = |args: &[&str]| sigil_as_admin(&kube, args);
    let said = tokio::task::block_in_place(|| sigil(&["break-glass", "--reason", "drill"]));
    assert!(said.contains("break-glass ON"), "{said}");
    let mwc = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/sigil";
    assert!(
        kube.get(mwc).await.is_none(),
        "the configuration is deleted"
    );
    let (status, open) = kube
        .request(
            "POST",
            "/api/v1/namespaces/shop/pods",
            Some(&pod("shop", "during", &image)),
        )
        .await;
    assert_eq!(status, 201, "{open}");
    assert_eq!(
        open["spec"]["containers"][0]["image"], image,
        "admitted unchecked"
    );
    let said = tokio::task::block_in_place(|| sigil(&["break-glass", "--end"]));
    assert!(said.contains("break-glass ended"), "{said}");
    let state = kube
        .get("/api/v1/namespaces/sigil-system/configmaps/sigil-state")
        .await
        .unwrap();
    assert!(
        state["metadata"]["annotations"]["sigil.dev/last-break-glass"]
            .as_str()
            .is_some_and(|w| w.contains("reason=drill")),
        "{state}"
    );
    kube.apply(&applied).await;
    wait_for_ca_bundle(&kube, &launched).await;
    let (status, after) = kube
        .request(
            "POST",
            "/api/v1/namespaces/shop/pods",
            Some(&pod("shop", "after", &image)),
        )
        .await;
    assert_eq!(status, 201, "{after}");
    assert_eq!(
        after["spec"]["containers"][0]["image"],
        format!("{image}@{digest}")
    );
}

/// Namespaces with the `default` ServiceAccount each (the ServiceAccount
/// admission plugin needs it; without the controller-manager nothing makes it).
pub(crate) async fn namespaces_with_accounts(kube: &RealKube, names: &[&str]) {
    kube.namespaces(names).await;
    let accounts: Vec<serde_json::Value> = names
        .iter()
        .map(|ns| {
            serde_json::json!({"apiVersion": "v1", "kind": "ServiceAccount",
                               "metadata": {"name": "default", "namespace": ns}})
        })
        .collect();
    kube.apply(&accounts).await;
}

/// A namespace `team` with a running workload whose image sigil cannot
/// resolve, created before sigil is installed: what the audit reports.
pub(crate) async fn team_with_a_workload(kube: &RealKube) {
    namespaces_with_accounts(kube, &["team"]).await;
    let (status, v) = kube
        .request(
            "POST",
            "/api/v1/namespaces/team/pods",
            Some(&pod("team", "app", "registry.invalid/team/app:v1")),
        )
        .await;
    assert_eq!(status, 201, "{v}");
}

/// `sigil ARGS` as an operator runs it (the cluster admin's kubeconfig):
/// its output; panics with its stderr if it fails.
pub(crate) fn sigil_as_admin(kube: &RealKube, args: &[&str]) -> String {
    let out = std::process::Command::new(crate::support::sigil::bin())
        .args(args)
        .env("KUBECONFIG", kube.admin_kubeconfig())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "sigil {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// CRDs other projects publish, copied into `tests/fixtures/crds` (their
/// attribution is in the fixtures' README), by file name.
pub(crate) fn fixture_crds(files: &[&str]) -> Vec<serde_json::Value> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/crds");
    files
        .iter()
        .flat_map(|f| crate::deploy::objects(&std::fs::read_to_string(dir.join(f)).unwrap()))
        .collect()
}
