//! The node DaemonSet (`overlays/node`) as shipped, against a real
//! kube-apiserver and a real containerd: its container's args and env run as
//! a kubelet would run them (its hostPath volumes under a temporary "host"
//! root, its ServiceAccount's token), it installs sigil-containerd and
//! writes the node policy; containerd, configured as docs/node.md says,
//! then refuses what that policy refuses, and a ClusterImagePolicy added
//! later reaches the node.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::support::containerd::{Containerd, push_tar_image};
use crate::support::kube::real::{RealKube, assets_or_skip};
use crate::support::registry::{Mode, TestRegistry};

/// A host path under the test's host root.
pub(super) fn on_host(root: &Path, host_path: &str) -> PathBuf {
    root.join(host_path.trim_start_matches('/'))
}

/// Starts the DaemonSet's container as a kubelet would: hostPath volumes
/// under `root`, env values inside a mount (or naming a host path) placed
/// there, its ServiceAccount's kubeconfig. Its probe port (the Pod's own
/// network namespace in a cluster) is moved to a free loopback port,
/// returned with it. `overrides` replace env values (a test's fault).
pub(super) fn launch(
    ds: &Value,
    root: &Path,
    kubeconfig: &Path,
    overrides: &[(&str, String)],
) -> (Child, u16) {
    let pod = &ds["spec"]["template"]["spec"];
    let c = &pod["containers"][0];
    let mut mounts: Vec<(String, PathBuf)> = Vec::new();
    for m in c["volumeMounts"].as_array().unwrap() {
        let vol = pod["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["name"] == m["name"])
            .unwrap();
        let host = vol["hostPath"]["path"]
            .as_str()
            .expect("the node DaemonSet mounts hostPaths only");
        let dir = on_host(root, host);
        std::fs::create_dir_all(&dir).unwrap();
        mounts.push((m["mountPath"].as_str().unwrap().to_owned(), dir));
    }
    let hosts: Vec<String> = pod["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["hostPath"]["path"].as_str().unwrap().to_owned())
        .collect();
    let place = |v: &str| {
        for (path, dir) in &mounts {
            if let Some(rest) = v.strip_prefix(path.as_str())
                && (rest.is_empty() || rest.starts_with('/'))
            {
                return format!("{}{rest}", dir.display());
            }
        }
        // A host path (the link's target): under the host root too.
        if hosts.iter().any(|h| v.starts_with(h.as_str())) {
            return on_host(root, v).display().to_string();
        }
        v.to_owned()
    };
    let args: Vec<&str> = c["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    let mut cmd = Command::new(crate::support::sigil::bin());
    cmd.args(&args)
        .env_clear()
        .env("KUBECONFIG", kubeconfig)
        .stdout(Stdio::null())
        .stderr(Stdio::inherit());
    let port = crate::support::ports::free_port();
    for e in c["env"].as_array().unwrap() {
        let name = e["name"].as_str().unwrap();
        let value = if name == "SIGIL_NODE_SYNC_LISTEN" {
            // The probes the manifest declares are served on this port.
            let probe = &c["readinessProbe"]["httpGet"];
            assert_eq!(probe["path"], "/readyz");
            let named = c["ports"]
                .as_array()
                .unwrap()
                .iter()
                .find(|p| p["name"] == probe["port"])
                .expect("the readiness probe names a container port");
            assert!(
                e["value"]
                    .as_str()
                    .unwrap()
                    .ends_with(&format!(":{}", named["containerPort"])),
                "{e}"
            );
            format!("127.0.0.1:{port}")
        } else if name == "SIGIL_NODE_VERIFIER_BINARY" {
            // A path in the image: the static build under test when there
            // is one (scripts/test.sh builds it), else the test's binary.
            assert_eq!(e["value"], "/usr/local/bin/sigil-static");
            crate::support::sigil::static_bin()
                .unwrap_or_else(|| crate::support::sigil::bin().to_owned())
        } else {
            place(e["value"].as_str().unwrap())
        };
        cmd.env(name, value);
    }
    cmd.envs(overrides.iter().map(|(k, v)| (*k, v.as_str())));
    (cmd.spawn().unwrap(), port)
}

pub(super) fn until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !done() {
        assert!(Instant::now() < deadline, "{what}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_node_daemonset_as_shipped_installs_the_verifier_and_keeps_its_policy_current() {
    let test = "the_node_daemonset_as_shipped_installs_the_verifier_and_keeps_its_policy_current";
    let Some(assets) = assets_or_skip(test) else {
        return;
    };
    let Some(ctrd) = crate::support::containerd::assets_or_skip(test) else {
        return;
    };
    let reg = TestRegistry::start(Mode::Plain).await;
    let h = reg.host();
    push_tar_image(&reg, "shop/app", "1.0").await;
    push_tar_image(&reg, "banned/app", "1.0").await;

    let kube = RealKube::start(&assets).await;
    let mut objects = crate::deploy::render("overlays/node");
    // The platform's policy: everything from the test registry, pinned.
    crate::shipped::find_mut(&mut objects, "ConfigMap", "sigil-policy")["data"]["policy.yaml"] = json!(
        format!(
            "apiVersion: sigil.dev/v1alpha1\nkind: ImagePolicy\nmetadata: {{name: cluster}}\nspec:\n  registries: [{{host: \"{h}\", insecure: true}}]\n  rules:\n    - {{name: ours, match: [\"{h}/**\"], mode: enforce}}\n"
        )
    );
    // The DaemonSet's own objects and what it reads (no webhook: nothing
    // here creates Pods).
    let applied: Vec<Value> = objects
        .iter()
        .filter(|o| o["kind"] != "MutatingWebhookConfiguration")
        .cloned()
        .collect();
    kube.apply(&applied).await;
    let ds = crate::shipped::find(&objects, "DaemonSet", "sigil-node").clone();
    let kubeconfig = kube
        .service_account_kubeconfig("sigil-node", "sigil-node")
        .await;
    let root = tempfile::tempdir().unwrap();
    let (mut sync, _) = launch(&ds, root.path(), &kubeconfig, &[]);

    let policy = on_host(root.path(), "/etc/sigil/node-policy.yaml");
    let verifiers = on_host(root.path(), "/opt/containerd/image-verifier/bin");
    let link = verifiers.join("sigil-containerd");
    until("the DaemonSet never installed the verifier", || {
        link.exists() && policy.exists()
    });
    assert_eq!(
        std::fs::read_link(&link).unwrap(),
        on_host(root.path(), "/opt/sigil/bin/sigil"),
        "linked to the copy on the host"
    );

    // containerd as docs/node.md configures it: its bin_dir, and the
    // policy file in its environment.
    let c = Containerd::start_with_verifiers(
        &ctrd,
        &h,
        &[("SIGIL_NODE_POLICY", policy.display().to_string())],
        &verifiers,
    );
    let o = c.ctr_pull(&format!("{h}/banned/app:1.0"));
    assert!(
        o.status.success(),
        "admitted before the ClusterImagePolicy: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    // A ClusterImagePolicy reaches the node within a sync.
    kube.apply(&[json!({"apiVersion": "sigil.dev/v1alpha1", "kind": "ClusterImagePolicy",
        "metadata": {"name": "banned"},
        "spec": {"rules": [{"name": "banned", "match": [format!("{h}/banned/**")], "action": "deny"}]}})])
        .await;
    until(
        "the ClusterImagePolicy never reached the node policy",
        || std::fs::read_to_string(&policy).is_ok_and(|p| p.contains("\"banned\"")),
    );
    let o = c.ctr_pull(&format!("{h}/banned/app:1.0"));
    let said = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(!o.status.success(), "refused after it: {said}");
    assert!(said.contains("rule banned"), "{said}");
    let o = c.ctr_pull(&format!("{h}/shop/app:1.0"));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let _ = sync.kill();
    let _ = sync.wait();
}
