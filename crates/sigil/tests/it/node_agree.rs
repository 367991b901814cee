//! One verdict at the node: a corpus of references decided by the webhook's
//! decision (`sigil verify`, the one per-object decision on a Pod holding
//! the image) and by `sigil-containerd` under a real containerd
//! (`SIGIL_CONTAINERD_ASSETS`, as root) must agree on admit or refuse
//! wherever the node can decide. Excepted, because a pull has no namespace:
//! team ImagePolicies, rules with `namespaceSelector`, `exemptNamespaces`
//! and ImagePolicyExceptions (the node applies the platform's rules only),
//! and `nodeAdmits` (the node admits those unchecked; admission applies the
//! rules). Docker Hub spellings reach the node normalized (CRI normalizes
//! them before containerd resolves them), so the corpus writes registry
//! hosts in full; the backstop's agreement test covers the spellings.

use std::process::Command;

use crate::support::containerd::{Containerd, assets_or_skip, push_tar_image};
use crate::support::registry::{Mode, TestRegistry};
use crate::support::signing::{Layer, Signer, push_legacy, simple_signing};

async fn sign(reg: &TestRegistry, repo: &str, digest: &str, key: &Signer) {
    let payload = simple_signing(&format!("{}/{repo}", reg.host()), digest);
    let sig = key.sign(&payload);
    push_legacy(reg, repo, digest, vec![Layer::new(payload, &sig)]).await;
}

/// `sigil verify` as the webhook decides (0 admitted; 1 denied or warned:
/// a warning admits).
fn webhook_admits(policy: &std::path::Path, image: &str) -> (bool, String) {
    let o = Command::new(crate::support::sigil::bin())
        .args(["verify", "-n", "apps", "--timeout", "10s", "--policy"])
        .arg(policy)
        .arg(image)
        .output()
        .unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    let admitted =
        o.status.success() || (o.status.code() == Some(1) && said.to_lowercase().contains("warn"));
    (admitted, said)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_webhook_and_the_node_give_one_verdict_on_every_reference_the_node_can_decide() {
    let Some(assets) = assets_or_skip(
        "the_webhook_and_the_node_give_one_verdict_on_every_reference_the_node_can_decide",
    ) else {
        return;
    };
    let reg = TestRegistry::start(Mode::Plain).await;
    let h = reg.host();
    let key = Signer::p256();
    let other = Signer::p256();
    let signed = push_tar_image(&reg, "signed/app", "1.0").await;
    sign(&reg, "signed/app", &signed, &key).await;
    push_tar_image(&reg, "signed/unsigned", "1.0").await;
    let wrong = push_tar_image(&reg, "signed/wrong", "1.0").await;
    sign(&reg, "signed/wrong", &wrong, &other).await;
    let v1 = push_tar_image(&reg, "tagged/app", "v1").await;
    let latest = push_tar_image(&reg, "tagged/app", "latest").await;
    let v2 = push_tar_image(&reg, "tagged/app", "v2").await;
    sign(&reg, "tagged/app", &v2, &key).await;
    push_tar_image(&reg, "banned/app", "1.0").await;
    push_tar_image(&reg, "warned/app", "1.0").await;
    push_tar_image(&reg, "nobody/app", "1.0").await;
    push_tar_image(&reg, "system/pause", "3.10").await;

    let files = tempfile::tempdir().unwrap();
    let policy = files.path().join("policy.yaml");
    std::fs::write(
        &policy,
        format!(
            "apiVersion: sigil.dev/v1alpha1\nkind: ImagePolicy\nmetadata: {{name: platform}}\nspec:\n  registries: [{{host: \"{h}\", insecure: true}}]\n  exemptNamespaces: [kube-system]\n  rules:\n    - name: signed\n      match: [\"{h}/signed/**\", \"{h}/system/**\"]\n      verify: [{{name: team, cosign: {{key: {k:?}}}}}]\n    - name: release-tags\n      match: [\"{h}/tagged/app:v*\"]\n      verify: [{{name: team, cosign: {{key: {k:?}}}}}]\n    - {{name: tools, match: [\"{h}/tagged/**\"], mode: enforce}}\n    - {{name: banned, match: [\"{h}/banned/**\"], action: deny}}\n    - name: warned\n      match: [\"{h}/warned/**\"]\n      mode: warn\n      verify: [{{name: team, cosign: {{key: {k:?}}}}}]\n",
            k = key.public_pem()
        ),
    )
    .unwrap();
    // (reference, admitted?) — what both must say.
    let corpus: Vec<(String, bool)> = vec![
        (format!("{h}/signed/app:1.0"), true),
        (format!("{h}/signed/app@{signed}"), true),
        (format!("{h}/signed/app:1.0@{signed}"), true),
        (format!("{h}/signed/unsigned:1.0"), false),
        (format!("{h}/signed/wrong:1.0"), false),
        // A tag pattern: v1 is a release tag and unsigned; latest is not.
        (format!("{h}/tagged/app:v1"), false),
        (format!("{h}/tagged/app:v2"), true),
        (format!("{h}/tagged/app:latest"), true),
        // Digest-only: no tag, so no tag pattern matches it.
        (format!("{h}/tagged/app@{v1}"), true),
        (format!("{h}/tagged/app@{latest}"), true),
        (format!("{h}/banned/app:1.0"), false),
        (format!("{h}/warned/app:1.0"), true),
        (format!("{h}/nobody/app:1.0"), false),
        // Unsigned, in a namespace the policy exempts: admission admits it
        // there, never at the node (no namespace) — so the node refuses.
        (format!("{h}/system/pause:3.10"), false),
    ];
    let c = Containerd::start(
        &assets,
        &h,
        &[
            ("SIGIL_NODE_POLICY", policy.display().to_string()),
            ("SIGIL_NODE_TIMEOUT", "3s".to_owned()),
        ],
        "10s",
        "",
    );
    c.install_verifier(
        std::path::Path::new(crate::support::sigil::bin()),
        "sigil-containerd",
    );
    let mut table = Vec::new();
    for (image, want) in &corpus {
        let (webhook, said) = webhook_admits(&policy, image);
        let o = c.ctr_pull(image);
        let node = o.status.success();
        table.push(format!(
            "{image}: want {want}, webhook {webhook}, node {node}"
        ));
        assert_eq!(webhook, *want, "webhook on {image}: {said}");
        assert_eq!(
            node,
            *want,
            "node on {image}: {}{}",
            String::from_utf8_lossy(&o.stderr),
            c.logs()
        );
    }
    // And the exempt namespace is the one place they may differ.
    let o = Command::new(crate::support::sigil::bin())
        .args(["verify", "-n", "kube-system", "--policy"])
        .arg(&policy)
        .arg(format!("{h}/system/pause:3.10"))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stdout));
    println!("{}", table.join("\n"));
}
