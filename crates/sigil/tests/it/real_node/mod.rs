//! The real-node tier: sigil as a cluster runs it. One real node
//! (`sigil_testkit::node`: the control plane, containerd, kubelet,
//! kube-proxy, kube-scheduler; `SIGIL_NODE_ASSETS`), sigil's image from
//! `scripts/image.sh` pushed to the node's registry, the chart installed by
//! `helm install` with only the image and the registry changed, then the
//! backstop and the node DaemonSet turned on in the order
//! docs/operations.md gives. kubelet pulls sigil's image, probes decide
//! Ready, the API server calls sigil through its Service's Endpoints.
//! Without the assets (or root, runc, the CNI plugins, buildah and podman)
//! each test says it is skipped, and why. One node at a time (nextest's
//! `real-node` group).

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::support::image;
use crate::support::node::{self, Node, images};
use crate::support::signing::{Layer, Signer, push_legacy, simple_signing};

mod cleanup;
mod install;
mod restart;
mod rollout;

/// The chart, as shipped.
fn chart() -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../deploy/helm/sigil")
        .display()
        .to_string()
}

/// A node with sigil installed on it as docs/operations.md says.
pub(crate) struct Installed {
    pub node: Node,
    /// The registry host (`10.213.0.1:PORT`).
    pub host: String,
    /// A signed workload image, by tag, and its digest.
    pub signed: (String, String),
    /// An unsigned one, by tag, and its digest.
    pub unsigned: (String, String),
    _local_image: RemoveImage,
}

struct RemoveImage(String);

impl Drop for RemoveImage {
    fn drop(&mut self) {
        image::remove(&self.0);
    }
}

/// The cluster policy: the registry (plain HTTP, the only registry
/// setting), pin everything, the team's images signed by `key`, and what
/// the node pulls for itself admitted at the node.
fn policy(host: &str, key: &Signer) -> String {
    let pem: String = key
        .public_pem()
        .lines()
        .map(|l| format!("              {l}\n"))
        .collect();
    format!(
        "apiVersion: sigil.dev/v1alpha1
kind: ImagePolicy
metadata:
  name: cluster
spec:
  registries:
    - host: \"{host}\"
      insecure: true
  pin:
    scope: workloads
    cacheTTL: 5m
  nodeAdmits: [\"{host}/pause\", \"{host}/sigil\"]
  rules:
    - name: sigil
      match: [\"{host}/sigil\"]
      mode: enforce
    - name: apps
      match: [\"{host}/apps/**\"]
      mode: enforce
      verify:
        - name: team
          cosign:
            key: |
{pem}  exemptNamespaces: [kube-system, sigil-system]
"
    )
}

/// Runs `program args`, panicking with its output (and the node's logs)
/// when it fails.
fn run(node: &Node, program: &str, args: &[&str]) -> String {
    let out = std::process::Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{program}: {e}"));
    assert!(
        out.status.success(),
        "{program} {}: {}{}\n{}",
        args.join(" "),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        node.logs()
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `kubectl ARGS` as admin, which must succeed; its output.
pub(crate) fn kubectl(node: &Node, args: &[&str]) -> String {
    let k = node.kubeconfig().display().to_string();
    let mut all = vec!["--kubeconfig", &k];
    all.extend_from_slice(args);
    run(node, "kubectl", &all)
}

/// `kubectl -n NS rollout status WHAT --timeout=TIMEOUT`: waits until
/// the Deployment or DaemonSet has rolled out, or fails the test.
pub(crate) fn rollout_status(node: &Node, ns: &str, what: &str, timeout: &str) {
    let timeout = format!("--timeout={timeout}");
    kubectl(node, &["-n", ns, "rollout", "status", what, &timeout]);
}

/// `helm ARGS` as admin, which must succeed.
fn helm(node: &Node, args: &[&str]) -> String {
    let k = node.kubeconfig().display().to_string();
    let mut all = args.to_vec();
    all.extend_from_slice(&["--kubeconfig", &k]);
    run(node, "helm", &all)
}

/// The node's assets and the image tools, or `None` (skipped, saying why).
pub(crate) fn assets_or_skip(test: &str) -> Option<node::Assets> {
    let assets = node::assets_or_skip(test)?;
    image::tools_or_skip(test)?;
    Some(assets)
}

/// Starts a node and installs sigil on it exactly as docs/operations.md's
/// "On a cluster" steps say: image built and pushed, `helm install` (the
/// webhook, failing closed), `rollout status`, then `helm upgrade` with the
/// backstop, then with the node DaemonSet, each waited for.
pub(crate) async fn install(assets: &node::Assets) -> Installed {
    let node = Node::start(assets).await;
    let host = node.registry.host();
    let local = format!("localhost/sigil:node-{}", std::process::id());
    let built = image::build(crate::support::sigil::bin(), &local).unwrap();
    let cleanup = RemoveImage(built.clone());
    image::push(&built, &format!("{host}/sigil:it")).unwrap();
    // The team's images: one signed by the team's key, one not.
    let key = Signer::p256();
    let signed_digest = images::push_busybox(&node.registry, "apps/app", "1").await;
    let payload = simple_signing(&format!("{host}/apps/app"), &signed_digest);
    let sig = key.sign(&payload);
    push_legacy(
        &node.registry,
        "apps/app",
        &signed_digest,
        vec![Layer::new(payload, &sig)],
    )
    .await;
    let unsigned_digest = images::push_busybox(&node.registry, "apps/unsigned", "1").await;
    let policy_file = node.dir().join("policy.yaml");
    std::fs::write(&policy_file, policy(&host, &key)).unwrap();
    let p = policy_file.display().to_string();
    let (repo, chart) = (format!("image.repository={host}/sigil"), chart());
    // 1. The chart: the webhook, failing closed.
    helm(
        &node,
        &[
            "install",
            "sigil",
            &chart,
            "-n",
            "sigil-system",
            "--create-namespace",
            "--set",
            &repo,
            "--set",
            "image.tag=it",
            "--set-file",
            &format!("policy={p}"),
        ],
    );
    kubectl(
        &node,
        &[
            "label",
            "namespace",
            "sigil-system",
            "pod-security.kubernetes.io/enforce=restricted",
        ],
    );
    rollout_status(&node, "sigil-system", "deployment/sigil", "180s");
    // 2. The backstop, kept by sigil.
    helm(
        &node,
        &[
            "upgrade",
            "sigil",
            &chart,
            "-n",
            "sigil-system",
            "--reuse-values",
            "--set",
            "backstop.register=true",
        ],
    );
    rollout_status(&node, "sigil-system", "deployment/sigil", "180s");
    // 3. The node DaemonSet.
    helm(
        &node,
        &[
            "upgrade",
            "sigil",
            &chart,
            "-n",
            "sigil-system",
            "--reuse-values",
            "--set",
            "node.enabled=true",
        ],
    );
    rollout_status(&node, "sigil-node", "daemonset/sigil-node", "180s");
    // The node's namespace joins the webhook's exemptions, which rolls the
    // Deployment too: wait for it, or its Service briefly has a fourth Pod.
    rollout_status(&node, "sigil-system", "deployment/sigil", "180s");
    let installed = Installed {
        host: host.clone(),
        signed: (format!("{host}/apps/app:1"), signed_digest),
        unsigned: (format!("{host}/apps/unsigned:1"), unsigned_digest),
        node,
        _local_image: cleanup,
    };
    installed.wait_backstop().await;
    installed
}

impl Installed {
    /// Waits until sigil has registered the backstop (its binding too).
    async fn wait_backstop(&self) {
        let path = "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings/sigil-backstop";
        let until = Instant::now() + Duration::from_secs(60);
        while self.node.kube.get(path).await.is_none() {
            assert!(Instant::now() < until, "the backstop was never registered");
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// Creates `pod` as admin: (status, answer).
    pub async fn create(&self, pod: &Value) -> (u16, Value) {
        let ns = pod["metadata"]["namespace"].as_str().unwrap_or("default");
        self.node
            .kube
            .request("POST", &format!("/api/v1/namespaces/{ns}/pods"), Some(pod))
            .await
    }

    /// Waits until Pod `ns/name` is Running with every container ready.
    pub async fn wait_running(&self, ns: &str, name: &str, within: Duration) -> Value {
        let until = Instant::now() + within;
        loop {
            let pod = self
                .node
                .kube
                .get(&format!("/api/v1/namespaces/{ns}/pods/{name}"))
                .await;
            if let Some(p) = &pod
                && p["status"]["phase"] == "Running"
                && p["status"]["containerStatuses"]
                    .as_array()
                    .is_some_and(|c| c.iter().all(|c| c["ready"] == true))
            {
                return p.clone();
            }
            assert!(
                Instant::now() < until,
                "{ns}/{name} not Running within {within:?}: {pod:#?}\n{}",
                self.node.logs()
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// The Events about `ns/name` (their reasons and messages).
    pub async fn events(&self, ns: &str, name: &str) -> Vec<(String, String)> {
        let list = self
            .node
            .kube
            .get(&format!(
                "/api/v1/namespaces/{ns}/events?fieldSelector=involvedObject.name%3D{name}"
            ))
            .await
            .unwrap_or(Value::Null);
        list["items"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|e| {
                (
                    e["reason"].as_str().unwrap_or_default().to_owned(),
                    e["message"].as_str().unwrap_or_default().to_owned(),
                )
            })
            .collect()
    }
}

/// A workload Pod: busybox sleeping, stopped at once on delete.
pub(crate) fn workload(ns: &str, name: &str, image: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": ns},
        "spec": {"terminationGracePeriodSeconds": 0,
                 "containers": [{"name": "app", "image": image,
                                 "command": ["/bin/busybox", "sleep", "3600"]}]}})
}
