//! Keys named by `keyRef` at the node, on a real kube-apiserver and a real
//! containerd: the node DaemonSet (the shipped overlay, its Roles rendered
//! by `sigil node rbac` from the policy as docs/node.md says) reads exactly
//! the ConfigMap and Secret the policy names, carries their PEM to the node
//! policy (root-only), and containerd's pulls are decided by them; a key
//! rotated in the ConfigMap reaches the node as a policy edit does.

use serde_json::{Value, json};

use super::node::{launch, on_host, until};
use crate::support::containerd::{Containerd, push_tar_image};
use crate::support::kube::real::{RealKube, assets_or_skip};
use crate::support::registry::{Mode, TestRegistry};
use crate::support::signing::{Layer, Signer, push_legacy, simple_signing};

async fn sign(reg: &TestRegistry, repo: &str, digest: &str, key: &Signer) {
    let payload = simple_signing(&format!("{}/{repo}", reg.host()), digest);
    let sig = key.sign(&payload);
    push_legacy(reg, repo, digest, vec![Layer::new(payload, &sig)]).await;
}

fn said(o: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn policy(h: &str) -> String {
    format!(
        "apiVersion: sigil.dev/v1alpha1\nkind: ImagePolicy\nmetadata: {{name: cluster}}\nspec:\n  registries: [{{host: \"{h}\", insecure: true}}]\n  nodeAdmits: [registry.k8s.io/pause]\n  rules:\n    - name: team\n      match: [\"{h}/team/**\"]\n      verify: [{{name: release, cosign: {{keyRef: {{configMap: release-keys, key: cosign.pub}}}}}}]\n    - name: vendor\n      match: [\"{h}/vendor/**\"]\n      verify: [{{name: vendor, cosign: {{keyRef: {{secret: vendor-key, key: cosign.pub}}}}}}]\n"
    )
}

fn configmap(name: &str, data: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": "sigil-system"}, "data": data})
}

fn secret(name: &str, data: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": name, "namespace": "sigil-system"}, "stringData": data})
}

/// Keys by reference were refused for nodes ("put the PEM in the policy
/// itself") and the node kept its old policy: the documented keyRef policy
/// gave webhook enforcement and silently none at the node. Now sync reads
/// the named ConfigMap and Secret (and no other Secret: the API server
/// refuses the rest), carries their PEM with where it came from, and a real
/// containerd pull is decided by them — before and after a rotation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regression_a_keyref_rule_is_enforced_at_a_real_containerd_pull_and_a_rotated_key_reaches_the_node()
 {
    let test = "regression_a_keyref_rule_is_enforced_at_a_real_containerd_pull_and_a_rotated_key_reaches_the_node";
    let Some(assets) = assets_or_skip(test) else {
        return;
    };
    let Some(ctrd) = crate::support::containerd::assets_or_skip(test) else {
        return;
    };
    let reg = TestRegistry::start(Mode::Plain).await;
    let h = reg.host();
    let (alice, bob, vendor) = (Signer::p256(), Signer::p256(), Signer::p256());
    for (repo, key) in [
        ("team/app", Some(&alice)),
        ("team/next", Some(&bob)),
        ("team/old", Some(&alice)),
        ("vendor/app", Some(&vendor)),
        ("vendor/unsigned", None),
    ] {
        let digest = push_tar_image(&reg, repo, "1.0").await;
        if let Some(k) = key {
            sign(&reg, repo, &digest, k).await;
        }
    }
    let kube = RealKube::start(&assets).await;
    let root = tempfile::tempdir().unwrap();
    let policy_file = root.path().join("policy.yaml");
    std::fs::write(&policy_file, policy(&h)).unwrap();

    // The overlay as shipped, its policy Roles rendered from this policy.
    let mut objects: Vec<Value> = crate::deploy::render("overlays/node")
        .into_iter()
        .filter(|o| {
            o["kind"] != "MutatingWebhookConfiguration"
                && !(o["metadata"]["name"] == "sigil-node"
                    && (o["kind"] == "Role" || o["kind"] == "RoleBinding"))
        })
        .collect();
    crate::shipped::find_mut(&mut objects, "ConfigMap", "sigil-policy")["data"]["policy.yaml"] =
        json!(policy(&h));
    let rbac = std::process::Command::new(crate::support::sigil::bin())
        .args(["node", "rbac", "--policy"])
        .arg(&policy_file)
        .output()
        .unwrap();
    assert!(rbac.status.success(), "{}", said(&rbac));
    objects.extend(crate::deploy::objects(&String::from_utf8_lossy(
        &rbac.stdout,
    )));
    objects.push(configmap(
        "release-keys",
        json!({"cosign.pub": alice.public_pem()}),
    ));
    objects.push(secret(
        "vendor-key",
        json!({"cosign.pub": vendor.public_pem(), "signing.key": "never-on-a-node"}),
    ));
    objects.push(secret("unnamed", json!({"token": "not-for-nodes"})));
    kube.apply(&objects).await;

    let etc = on_host(root.path(), "/etc/sigil");
    let verifiers = on_host(root.path(), "/opt/containerd/image-verifier/bin");
    std::fs::create_dir_all(&etc).unwrap();
    std::fs::create_dir_all(&verifiers).unwrap();
    let c = Containerd::start_as_node(&ctrd, &h, &[], &verifiers, &etc);
    let ds = crate::shipped::find(&objects, "DaemonSet", "sigil-node").clone();
    let kubeconfig = kube
        .service_account_kubeconfig("sigil-node", "sigil-node")
        .await;
    let (mut sync, _port) = launch(&ds, root.path(), &kubeconfig, &[]);
    until("the DaemonSet never installed the verifier", || {
        verifiers.join("sigil-containerd").exists()
    });
    let node_policy = etc.join("node-policy.yaml");
    let read = || std::fs::read_to_string(&node_policy).unwrap_or_default();

    // The keys are on the node, root-only, with where they came from; of
    // the Secret only the key a rule names.
    use std::os::unix::fs::PermissionsExt as _;
    let mode = std::fs::metadata(&node_policy)
        .unwrap()
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(mode, 0o600, "the node policy carries a Secret's key");
    let (_, keys) = sigil_core::Policy::from_node_documents_at(&read(), None).unwrap();
    assert_eq!(keys.keys.len(), 2, "{keys:?}");
    assert!(keys.keys.iter().all(|k| k.from.is_some()), "{keys:?}");
    assert!(!read().contains("never-on-a-node") && !read().contains("not-for-nodes"));

    let pull = |repo: &str| c.ctr_pull(&format!("{h}/{repo}:1.0"));
    for repo in ["team/app", "vendor/app"] {
        let o = pull(repo);
        assert!(o.status.success(), "{repo}: {}\n{}", said(&o), c.logs());
    }
    for (repo, rule) in [
        ("team/next", "rule team"),
        ("vendor/unsigned", "rule vendor"),
    ] {
        let o = pull(repo);
        assert!(!o.status.success(), "{repo} pulled");
        assert!(said(&o).contains(rule), "{repo}: {}", said(&o));
    }

    // Rotation: bob's key replaces alice's in the ConfigMap.
    let before = read();
    kube.apply(&[configmap(
        "release-keys",
        json!({"cosign.pub": bob.public_pem()}),
    )])
    .await;
    until("the rotated key never reached the node", || {
        read() != before && read().contains(&bob.public_pem().replace('\n', "\\n"))
    });
    let o = pull("team/next");
    assert!(
        o.status.success(),
        "after rotation: {}\n{}",
        said(&o),
        c.logs()
    );
    let o = pull("team/old");
    assert!(
        !o.status.success(),
        "alice's key is still in force at the node"
    );

    // What the DaemonSet's identity may read: the named objects, by name;
    // never another Secret, nor the list of them.
    let token = kube.service_account_token("sigil-node", "sigil-node").await;
    let secrets = "/api/v1/namespaces/sigil-system/secrets";
    for (path, want) in [
        (format!("{secrets}/vendor-key"), 200),
        (
            format!("{secrets}?fieldSelector=metadata.name%3Dvendor-key"),
            200,
        ),
        (format!("{secrets}/unnamed"), 403),
        (
            format!("{secrets}?fieldSelector=metadata.name%3Dunnamed"),
            403,
        ),
        (secrets.to_owned(), 403),
        (format!("{secrets}/sigil-tls"), 403),
    ] {
        let (status, answer) = kube.get_as(&token, &path).await;
        assert_eq!(status, want, "GET {path} as sigil-node: {answer}");
    }
    let _ = sync.kill();
    let _ = sync.wait();
}
