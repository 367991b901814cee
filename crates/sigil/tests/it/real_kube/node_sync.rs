//! The node DaemonSet (`overlays/node`) as shipped, on a real
//! kube-apiserver (and, for arming, a real containerd in a mount namespace
//! of its own, so its `/etc/sigil` is the test's): installing it never
//! turns a node's pulls into refusals, and the node is given exactly the
//! cluster-wide policy the webhook has in force — or keeps the one it has,
//! and says so on `/readyz` and `/metrics`.

use std::time::Duration;

use serde_json::{Value, json};

use super::node::{launch, on_host, until};
use crate::support::containerd::{Containerd, push_tar_image};
use crate::support::kube::real::{RealKube, assets_or_skip};
use crate::support::registry::{Mode, TestRegistry};

fn text(o: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// The shipped node overlay with `policy` as the platform's policy file.
fn node_objects(policy: &str) -> Vec<Value> {
    let mut objects = crate::deploy::render("overlays/node");
    crate::shipped::find_mut(&mut objects, "ConfigMap", "sigil-policy")["data"]["policy.yaml"] =
        json!(policy);
    objects
}

/// Applies the overlay's objects but the webhook (nothing here creates
/// Pods) and starts the DaemonSet's container under `root`.
async fn install(
    kube: &RealKube,
    objects: &[Value],
    root: &std::path::Path,
    overrides: &[(&str, String)],
) -> (std::process::Child, u16) {
    let applied: Vec<Value> = objects
        .iter()
        .filter(|o| o["kind"] != "MutatingWebhookConfiguration")
        .cloned()
        .collect();
    kube.apply(&applied).await;
    let ds = crate::shipped::find(objects, "DaemonSet", "sigil-node").clone();
    let kubeconfig = kube
        .service_account_kubeconfig("sigil-node", "sigil-node")
        .await;
    launch(&ds, root, &kubeconfig, overrides)
}

async fn get(port: u16, path: &str) -> (u16, String) {
    match reqwest::get(format!("http://127.0.0.1:{port}{path}")).await {
        Ok(r) => (r.status().as_u16(), r.text().await.unwrap_or_default()),
        Err(e) => (0, e.to_string()),
    }
}

fn cluster_policy(h: &str) -> String {
    format!(
        "apiVersion: sigil.dev/v1alpha1\nkind: ImagePolicy\nmetadata: {{name: cluster}}\nspec:\n  registries: [{{host: \"{h}\", insecure: true}}]\n  nodeAdmits: [registry.k8s.io/pause]\n  rules:\n    - {{name: ours, match: [\"{h}/**\"], mode: enforce, exceptions: {{allowed: true, maxDuration: 720h}}}}\n    - {{name: banned, match: [\"{h}/banned/**\"], action: deny}}\n"
    )
}

/// containerd 2 loads the verifier plugin by default, with the `bin_dir`
/// the DaemonSet links into: installing the DaemonSet armed the verifier on
/// every node before containerd's environment named a policy, and every
/// pull was refused ("SIGIL_NODE_POLICY is not set"). Now an unset variable
/// means the file sync writes, and sync writes it before it links the
/// verifier: a node pulls unverified until it has the policy, then by it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regression_installing_the_node_daemonset_before_containerd_names_a_policy_never_refuses_a_pull()
 {
    let test = "regression_installing_the_node_daemonset_before_containerd_names_a_policy_never_refuses_a_pull";
    let Some(assets) = assets_or_skip(test) else {
        return;
    };
    let Some(ctrd) = crate::support::containerd::assets_or_skip(test) else {
        return;
    };
    let reg = TestRegistry::start(Mode::Plain).await;
    let h = reg.host();
    push_tar_image(&reg, "shop/app", "1.0").await;
    push_tar_image(&reg, "shop/other", "1.0").await;
    push_tar_image(&reg, "banned/app", "1.0").await;
    let kube = RealKube::start(&assets).await;
    let root = tempfile::tempdir().unwrap();
    let etc = on_host(root.path(), "/etc/sigil");
    let verifiers = on_host(root.path(), "/opt/containerd/image-verifier/bin");
    std::fs::create_dir_all(&etc).unwrap();
    std::fs::create_dir_all(&verifiers).unwrap();
    // containerd as docs/node.md step 1 leaves it: its default bin_dir,
    // nothing about sigil in its environment.
    let c = Containerd::start_as_node(&ctrd, &h, &[], &verifiers, &etc);
    let o = c.ctr_pull(&format!("{h}/shop/app:1.0"));
    assert!(o.status.success(), "before the DaemonSet: {}", text(&o));

    let (mut sync, port) =
        install(&kube, &node_objects(&cluster_policy(&h)), root.path(), &[]).await;
    let link = verifiers.join("sigil-containerd");
    until("the DaemonSet never installed the verifier", || {
        link.exists()
    });
    assert!(
        etc.join("node-policy.yaml").exists(),
        "linked before the policy"
    );
    let o = c.ctr_pull(&format!("{h}/shop/other:1.0"));
    assert!(o.status.success(), "after: {}\n{}", text(&o), c.logs());
    let o = c.ctr_pull(&format!("{h}/banned/app:1.0"));
    let said = text(&o);
    assert!(!o.status.success(), "the synced policy is not in force");
    assert!(said.contains("rule banned"), "{said}");
    assert!(!c.logs().contains("is not set"), "{}", c.logs());
    // `sigil node check`, on the node (its mount namespace), reads the
    // environment containerd gives its verifiers and the policy it names.
    let o = std::process::Command::new("nsenter")
        .arg("-t")
        .arg(c.pid().to_string())
        .args(["-m", "--"])
        .arg(crate::support::sigil::bin())
        .args(["node", "check", "--config"])
        .arg(&c.config)
        .args(["--image", &format!("{h}/shop/app:1.0")])
        .output()
        .unwrap();
    let said = text(&o);
    assert!(o.status.success(), "{said}");
    assert!(
        said.contains("SIGIL_NODE_POLICY=(unset: the file sigil node sync writes)"),
        "{said}"
    );
    assert!(said.contains("node policy: 2 rule(s)"), "{said}");
    let (code, body) = get(port, "/readyz").await;
    assert_eq!(code, 200, "{body}");
    let _ = sync.kill();
    let _ = sync.wait();
}

/// `node sync` composed ClusterImagePolicies its own way: an invalid edit
/// dropped the policy at the nodes (the webhook keeps its last good
/// generation), a conflict was settled by name instead of age (a newer
/// `warn` replaced an older `deny` at the nodes), an ImagePolicyException
/// in the policy file made sync reject the file forever, and keys named by
/// path were written to nodes that cannot read them. Now sync composes
/// with the webhook's own composition, loads the file as the webhook does,
/// refuses trust material a node lacks by rule — keeping the node's policy
/// — and says so on `/readyz` and `/metrics`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regression_sync_gives_nodes_the_webhooks_policy_and_keeps_the_last_good_one_when_it_cannot()
 {
    let test = "regression_sync_gives_nodes_the_webhooks_policy_and_keeps_the_last_good_one_when_it_cannot";
    let Some(assets) = assets_or_skip(test) else {
        return;
    };
    let h = "r.example.com";
    let expires = humantime::format_rfc3339_seconds(
        std::time::SystemTime::now() + Duration::from_secs(86_400 * 10),
    );
    // The documented exception, in the policy file.
    let file = format!(
        "{}---\napiVersion: sigil.dev/v1alpha1\nkind: ImagePolicyException\nmetadata: {{name: legacy, namespace: team-a}}\nspec:\n  images: [\"{h}/legacy-*\"]\n  rules: [{{policy: ImagePolicy/cluster, rule: ours}}]\n  expires: \"{expires}\"\n  reason: vendor image, signed build pending\n",
        cluster_policy(h)
    );
    let kube = RealKube::start(&assets).await;
    let root = tempfile::tempdir().unwrap();
    let objects = node_objects(&file);
    let (mut sync, port) = install(&kube, &objects, root.path(), &[]).await;
    let policy = on_host(root.path(), "/etc/sigil/node-policy.yaml");
    until(
        "the policy with an exception never reached the node",
        || policy.exists(),
    );
    let read = || std::fs::read_to_string(&policy).unwrap_or_default();
    let cip = |name: &str, rule: Value| {
        json!({"apiVersion": "sigil.dev/v1alpha1", "kind": "ClusterImagePolicy",
            "metadata": {"name": name}, "spec": {"rules": [rule]}})
    };
    // An older deny and a newer, equally specific warn (named to sort
    // first): the newer is the one left out, as the webhook leaves it out.
    kube.apply(&[cip(
        "z-older",
        json!({"name": "deny-prod", "match": [format!("{h}/prod/**")], "action": "deny"}),
    )])
    .await;
    tokio::time::sleep(Duration::from_millis(1100)).await;
    kube.apply(&[cip(
        "a-newer",
        json!({"name": "warn-prod", "match": [format!("{h}/prod/**")], "mode": "warn"}),
    )])
    .await;
    until(
        "the older ClusterImagePolicy never reached the node",
        || read().contains("deny-prod"),
    );
    std::thread::sleep(Duration::from_secs(3));
    let text_now = read();
    assert!(!text_now.contains("warn-prod"), "{text_now}");
    let loaded =
        sigil_core::Policy::from_documents_at(&text_now, Some(sigil::engine::unix_now())).unwrap();
    assert!(loaded.rules.iter().any(|r| r.name == "deny-prod"));
    let (_, metrics) = get(port, "/metrics").await;
    assert!(
        metrics.contains("sigil_node_policies_left_out 1"),
        "{metrics}"
    );
    assert!(metrics.contains("sigil_node_sync_healthy 1"), "{metrics}");

    // An invalid edit of the older one: its last good generation stays.
    kube.apply(&[cip(
        "z-older",
        json!({"name": "deny-prod", "match": [format!("{h}/prod/**")], "threshold": 1}),
    )])
    .await;
    std::thread::sleep(Duration::from_secs(3));
    assert!(read().contains("\"action\":\"deny\""), "{}", read());

    // Keys by path: a node has no such file. The node keeps its policy;
    // readiness and the metric say why, naming the rule.
    let before = read();
    let keyed = cluster_policy(h).replace(
        "    - {name: banned,",
        "    - {name: signed, match: [\"r.example.com/signed/**\"], verify: [{name: alice, cosign: {key: /etc/sigil/alice.pub}}]}\n    - {name: banned,",
    );
    let mut cm = crate::shipped::find(&objects, "ConfigMap", "sigil-policy").clone();
    cm["data"]["policy.yaml"] = json!(keyed);
    kube.apply(&[cm]).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let body = loop {
        let (code, body) = get(port, "/readyz").await;
        if code == 503 {
            break body;
        }
        assert!(std::time::Instant::now() < deadline, "still ready: {body}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(
        body.contains("rule \"signed\"") && body.contains("/etc/sigil/alice.pub"),
        "{body}"
    );
    let (_, metrics) = get(port, "/metrics").await;
    assert!(metrics.contains("sigil_node_sync_healthy 0"), "{metrics}");
    assert_eq!(read(), before, "the node's policy was replaced");
    let _ = sync.kill();
    let _ = sync.wait();
}

/// A verifier that does not start refuses every pull on the node: sync runs
/// the host copy once before it links it and, when it fails, leaves the
/// link out and says why (log, `/readyz`, `sigil_node_verifier_installed`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regression_a_verifier_that_does_not_run_is_never_linked() {
    let test = "regression_a_verifier_that_does_not_run_is_never_linked";
    let Some(assets) = assets_or_skip(test) else {
        return;
    };
    let kube = RealKube::start(&assets).await;
    let root = tempfile::tempdir().unwrap();
    // What a binary for another libc or architecture looks like to exec.
    let broken = root.path().join("broken");
    std::fs::write(&broken, b"\x7fELF\x02\x01\x01 not a program").unwrap();
    let (mut sync, port) = install(
        &kube,
        &node_objects(&cluster_policy("r.example.com")),
        root.path(),
        &[("SIGIL_NODE_VERIFIER_BINARY", broken.display().to_string())],
    )
    .await;
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let body = loop {
        let (code, body) = get(port, "/readyz").await;
        if code == 503 && body.contains("the verifier is not installed (") {
            break body;
        }
        assert!(std::time::Instant::now() < deadline, "{code} {body}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(
        body.contains("does not start") || body.contains("does not run"),
        "{body}"
    );
    let (_, metrics) = get(port, "/metrics").await;
    assert!(
        metrics.contains("sigil_node_verifier_installed 0"),
        "{metrics}"
    );
    assert!(
        !on_host(
            root.path(),
            "/opt/containerd/image-verifier/bin/sigil-containerd"
        )
        .exists(),
        "linked"
    );
    let _ = sync.kill();
    let _ = sync.wait();
}
