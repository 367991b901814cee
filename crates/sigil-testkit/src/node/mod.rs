//! A real single-node Kubernetes cluster for tests, envtest-style: etcd,
//! kube-apiserver, kube-controller-manager and kube-scheduler
//! (`crate::kube::real`), containerd with runc, the kubelet and kube-proxy
//! (v1.36.2, containerd 2.3), and a plain-HTTP test registry on the node's
//! address that both containerd and Pods reach. As root; the binaries come
//! from `SIGIL_NODE_ASSETS` (kubelet, kube-proxy, kube-scheduler,
//! containerd-shim-runc-v2, pause) with `SIGIL_KUBE_ASSETS` and
//! `SIGIL_CONTAINERD_ASSETS`, which `.ci/run` unpacks; without them, root,
//! runc, the CNI plugins or iptables, [`assets_or_skip`] says why and the
//! test is skipped.
//!
//! containerd and the kubelet share a mount namespace of their own in which
//! `/etc`, `/var` and `/run` are overlays and `/opt` a directory of the test:
//! a hostPath the chart's node DaemonSet writes (`/etc/sigil`,
//! `/opt/containerd/image-verifier/bin`) and every mount the kubelet makes
//! exist only there, and vanish with it. The host's own changes (address,
//! bridge, guard rules, chains, sysctls, cgroups) are `host`'s, undone on
//! drop and swept before each start. Addresses: the node `10.213.0.1/32` on
//! `lo`, Pods `10.214.0.0/24` on bridge `sigilbr0`, Services
//! `10.215.0.0/24` (blackholed): they exist only on this machine, and the
//! guard rules drop whatever would be forwarded off it. One node at a time
//! (nextest's `real-node` group).

pub mod config;
pub mod host;
pub mod images;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::kube::real::{NodeLayout, RealKube, spawn_watched};
use crate::registry::{Mode, TestRegistry};

/// The variable naming the node assets' directory.
pub const ASSETS: &str = "SIGIL_NODE_ASSETS";
/// The node's address (a /32 on `lo`).
pub const NODE_IP: &str = "10.213.0.1";
/// The node's name.
pub const NODE_NAME: &str = "sigil-node";
/// The Pod bridge, its address (the Pods' gateway) and the Pod range.
pub const BRIDGE: &str = "sigilbr0";
pub const POD_GATEWAY: &str = "10.214.0.1";
pub const POD_CIDR: &str = "10.214.0.0/24";
/// The Service range and the `kubernetes` Service's address.
pub const SERVICE_RANGE: &str = "10.215.0.0/24";
pub const SERVICE_IP: &str = "10.215.0.1";

/// Where each binary of a node is.
#[derive(Clone, Debug)]
pub struct Assets {
    /// `SIGIL_KUBE_ASSETS` and etcd.
    pub kube: (PathBuf, PathBuf),
    /// `SIGIL_CONTAINERD_ASSETS`.
    pub containerd: PathBuf,
    /// `SIGIL_NODE_ASSETS`.
    pub node: PathBuf,
    /// Debian's runc.
    pub runc: PathBuf,
}

/// The assets, or why a node cannot run here.
pub fn assets() -> Result<Assets, String> {
    let node = std::env::var_os(ASSETS).map(PathBuf::from).ok_or_else(|| {
        format!("{ASSETS} is not set (a directory with kubelet, kube-proxy, kube-scheduler, containerd-shim-runc-v2 and pause; .ci/run sets it)")
    })?;
    for b in [
        "kubelet",
        "kube-proxy",
        "kube-scheduler",
        "containerd-shim-runc-v2",
        "pause",
    ] {
        if !node.join(b).is_file() {
            return Err(format!("{ASSETS}={}: no {b} there", node.display()));
        }
    }
    let kube = crate::kube::real::assets()?;
    let containerd = crate::containerd::assets()?;
    let runc = ["/usr/sbin/runc", "/usr/bin/runc"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
        .ok_or("runc is not installed (Debian: runc)")?;
    for (path, package) in [
        ("/usr/lib/cni/bridge", "containernetworking-plugins"),
        ("/usr/sbin/iptables", "iptables"),
        (images::BUSYBOX, "busybox-static"),
    ] {
        if !Path::new(path).is_file() {
            return Err(format!("{path} is missing (Debian: {package})"));
        }
    }
    Ok(Assets {
        kube,
        containerd,
        node,
        runc,
    })
}

/// The assets, or `None` after printing that the calling test is skipped
/// and why (the test command's summary counts these).
pub fn assets_or_skip(test: &str) -> Option<Assets> {
    match assets() {
        Ok(a) => Some(a),
        Err(why) => {
            eprintln!("SKIPPED real_node::{test}: {why}");
            None
        }
    }
}

/// The sandbox image's repository and tag in the node's registry.
pub const PAUSE: &str = "pause:3.10";

/// A running node with its control plane.
pub struct Node {
    /// The control plane (the API as admin; kubeconfigs).
    pub kube: RealKube,
    /// The registry on the node's address (`10.213.0.1:PORT`).
    pub registry: TestRegistry,
    assets: Assets,
    dir: tempfile::TempDir,
    /// holder of the mount namespace, containerd, kubelet, kube-proxy.
    procs: Mutex<Vec<Child>>,
    // Last: undone after every process is gone.
    _host: host::Host,
}

impl Node {
    /// Brings up a node: the host's network, the control plane, the
    /// registry with the sandbox image, containerd, the kubelet and
    /// kube-proxy; returns once the Node is Ready.
    pub async fn start(assets: &Assets) -> Node {
        let host = host::Host::up(&assets.node.join("kube-proxy"));
        let layout = NodeLayout {
            address: NODE_IP.into(),
            service_range: SERVICE_RANGE.into(),
            service_ip: SERVICE_IP.into(),
            node_name: NODE_NAME.into(),
        };
        let kube =
            RealKube::start_for_node(&assets.kube, &layout, &assets.node.join("kube-scheduler"))
                .await;
        let registry = TestRegistry::start_on(Mode::Plain, NODE_IP).await;
        let pause = std::fs::read(assets.node.join("pause")).unwrap();
        let (repo, tag) = PAUSE.split_once(':').unwrap();
        images::push_binary_image(&registry, repo, tag, &pause, "pause", &["/pause"], "pause")
            .await;
        let dir = tempfile::Builder::new()
            .prefix("sigil-node")
            .tempdir()
            .unwrap();
        let d = dir.path();
        for sub in [
            "cni",
            "ipam",
            "tmp",
            "bin",
            "manifests",
            "pod-logs",
            "volume-plugins",
            "kubelet",
            "kubelet-pki",
            "opt",
            "etc-upper",
            "etc-work",
            "var-upper",
            "var-work",
            "run-work",
        ] {
            std::fs::create_dir_all(d.join(sub)).unwrap();
        }
        std::fs::create_dir_all(d.join("opt").join(&config::VERIFIER_DIR[5..])).unwrap();
        std::fs::copy(
            assets.node.join("containerd-shim-runc-v2"),
            d.join("bin/containerd-shim-runc-v2"),
        )
        .unwrap();
        let hosts = d.join("certs.d").join(registry.host());
        std::fs::create_dir_all(&hosts).unwrap();
        std::fs::write(hosts.join("hosts.toml"), config::hosts(&registry.host())).unwrap();
        std::fs::write(d.join("cni/10-sigil-node.conflist"), config::cni(d)).unwrap();
        let sandbox = format!("{}/{PAUSE}", registry.host());
        std::fs::write(
            d.join("containerd.toml"),
            config::containerd(d, &sandbox, &assets.runc),
        )
        .unwrap();
        std::fs::write(
            d.join("kubelet.yaml"),
            config::kubelet(d, &kube.dir().join("ca.crt")),
        )
        .unwrap();
        std::fs::write(
            d.join("kube-proxy.yaml"),
            config::kube_proxy(
                &kube.dir().join("admin.kubeconfig"),
                (crate::ports::free_port(), crate::ports::free_port()),
            ),
        )
        .unwrap();
        let node = Node {
            kube,
            registry,
            assets: assets.clone(),
            dir,
            procs: Mutex::new(Vec::new()),
            _host: host,
        };
        node.start_processes();
        node.wait_ready(Duration::from_secs(60)).await;
        node
    }

    /// Starts the mount namespace's holder, containerd, the kubelet and
    /// kube-proxy (as at boot: `/run` empty again, the rest as left).
    fn start_processes(&self) {
        let d = self.dir.path();
        let run_upper = d.join("run-upper");
        let _ = std::fs::remove_dir_all(&run_upper);
        std::fs::create_dir_all(&run_upper).unwrap();
        let overlay = |target: &str, upper: &str, work: &str| {
            format!(
                "mount -t overlay overlay -o lowerdir={target},upperdir={},workdir={} {target}",
                d.join(upper).display(),
                d.join(work).display()
            )
        };
        let script = format!(
            "set -e; {}; {}; {}; mount --bind {} /opt; exec sleep 2147483647",
            overlay("/etc", "etc-upper", "etc-work"),
            overlay("/var", "var-upper", "var-work"),
            overlay("/run", "run-upper", "run-work"),
            d.join("opt").display()
        );
        let log = |n: &str| d.join(n);
        let holder = spawn_watched(
            Path::new("unshare"),
            &[
                "--mount".into(),
                "--propagation".into(),
                "private".into(),
                "sh".into(),
                "-c".into(),
                script,
            ],
            &log("holder.log"),
        );
        let ns = format!("/proc/{}/ns/mnt", holder.id());
        // Until the overlays are mounted in it, the namespace is not the node's.
        let until = Instant::now() + Duration::from_secs(10);
        while !std::fs::read_to_string(format!("/proc/{}/cmdline", holder.id()))
            .unwrap_or_default()
            .starts_with("sleep")
        {
            assert!(
                Instant::now() < until,
                "the node's mount namespace did not come up"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        let path = format!(
            "{}:{}",
            d.join("bin").display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let in_ns = |program: &Path, args: Vec<String>| -> Vec<String> {
            let mut v = vec![
                format!("--mount={ns}"),
                "--".into(),
                "env".into(),
                format!("PATH={path}"),
                program.display().to_string(),
            ];
            v.extend(args);
            v
        };
        let containerd = spawn_watched(
            Path::new("nsenter"),
            &in_ns(
                &self.assets.containerd.join("containerd"),
                vec![
                    "--config".into(),
                    d.join("containerd.toml").display().to_string(),
                    // Debug: the verifiers' stderr is logged (each admission
                    // says so: `verifier_calls`).
                    "--log-level".into(),
                    "debug".into(),
                ],
            ),
            &log("containerd.log"),
        );
        let until = Instant::now() + Duration::from_secs(30);
        while !self.ctr(&["version"]).status.success() {
            assert!(
                Instant::now() < until,
                "containerd did not start:\n{}",
                self.tail("containerd.log")
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        let kubelet = spawn_watched(
            Path::new("nsenter"),
            &in_ns(
                &self.assets.node.join("kubelet"),
                vec![
                    format!("--config={}", d.join("kubelet.yaml").display()),
                    format!(
                        "--kubeconfig={}",
                        self.kube.dir().join("kubelet.kubeconfig").display()
                    ),
                    format!("--root-dir={}", d.join("kubelet").display()),
                    format!("--cert-dir={}", d.join("kubelet-pki").display()),
                    format!("--hostname-override={NODE_NAME}"),
                    format!("--node-ip={NODE_IP}"),
                ],
            ),
            &log("kubelet.log"),
        );
        let proxy = spawn_watched(
            &self.assets.node.join("kube-proxy"),
            &[format!("--config={}", d.join("kube-proxy.yaml").display())],
            &log("kube-proxy.log"),
        );
        *self.procs.lock().unwrap() = vec![holder, containerd, kubelet, proxy];
    }

    /// Waits until the Node reports Ready.
    pub async fn wait_ready(&self, within: Duration) {
        let until = Instant::now() + within;
        loop {
            let node = self.kube.get(&format!("/api/v1/nodes/{NODE_NAME}")).await;
            let ready = node.is_some_and(|n| {
                n["status"]["conditions"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|c| c["type"] == "Ready" && c["status"] == "True")
            });
            let exited = self
                .procs
                .lock()
                .unwrap()
                .iter_mut()
                .any(|c| !matches!(c.try_wait(), Ok(None)));
            assert!(!exited, "a node process exited:\n{}", self.logs());
            if ready {
                return;
            }
            assert!(
                Instant::now() < until,
                "node {NODE_NAME} not Ready within {within:?}:\n{}",
                self.logs()
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// `ctr -a SOCKET ARGS` against the node's containerd.
    pub fn ctr(&self, args: &[&str]) -> Output {
        Command::new(self.assets.containerd.join("ctr"))
            .arg("-a")
            .arg(self.dir.path().join("containerd.sock"))
            .args(args)
            .output()
            .unwrap()
    }

    /// A command run in the node's mount namespace (as the kubelet and
    /// containerd see the files): `nsenter --mount=… -- ARGS`.
    pub fn in_node(&self, args: &[&str]) -> Output {
        let holder = self.procs.lock().unwrap()[0].id();
        Command::new("nsenter")
            .arg(format!("--mount=/proc/{holder}/ns/mnt"))
            .arg("--")
            .args(args)
            .output()
            .unwrap()
    }

    /// The admin kubeconfig (what an operator's kubectl and helm use).
    pub fn kubeconfig(&self) -> PathBuf {
        self.kube.dir().join("admin.kubeconfig")
    }

    /// `kubectl --kubeconfig ADMIN ARGS`.
    pub fn kubectl(&self, args: &[&str]) -> Output {
        Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(self.kubeconfig())
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("kubectl: {e}"))
    }

    /// Writes a static Pod manifest (the kubelet starts it itself, no API
    /// server admission involved; its mirror Pod is `NAME-sigil-node`).
    pub fn static_pod(&self, name: &str, manifest: &Value) {
        let path = self
            .dir
            .path()
            .join("manifests")
            .join(format!("{name}.json"));
        std::fs::write(path, serde_json::to_vec_pretty(manifest).unwrap()).unwrap();
    }

    /// Removes a static Pod manifest.
    pub fn remove_static_pod(&self, name: &str) {
        let _ = std::fs::remove_file(
            self.dir
                .path()
                .join("manifests")
                .join(format!("{name}.json")),
        );
    }

    /// A power cut: every process of the node (Pods, shims, containerd,
    /// kubelet, kube-proxy) and of the control plane killed at once.
    pub fn power_off(&self) {
        {
            let mut procs = self.procs.lock().unwrap();
            for c in procs.iter_mut() {
                let _ = c.kill();
            }
            host::kill_pods();
            self.kill_shims();
            for c in procs.iter_mut() {
                let _ = c.wait();
            }
        }
        self.kube.kill_all();
    }

    /// After [`Node::power_off`]: the control plane and the node started
    /// again with their data; returns once the Node is Ready.
    pub async fn power_on(&self) {
        self.kube.start_again().await;
        self.start_processes();
        self.wait_ready(Duration::from_secs(90)).await;
    }

    fn kill_shims(&self) {
        let _ = Command::new("pkill")
            .arg("-KILL")
            .arg("-f")
            .arg(format!(
                "containerd-shim-runc-v2 .*{}",
                self.dir.path().display()
            ))
            .status();
    }

    fn tail(&self, name: &str) -> String {
        let text = std::fs::read_to_string(self.dir.path().join(name)).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }

    /// The last lines of every node process's log, then the control
    /// plane's (a CI report keeps only the beginning of a long failure).
    pub fn logs(&self) -> String {
        let mut out = String::new();
        for n in [
            "kubelet.log",
            "containerd.log",
            "kube-proxy.log",
            "holder.log",
        ] {
            out.push_str(&format!("--- {n} ---\n{}\n", self.tail(n)));
        }
        out.push_str(&self.kube.logs());
        out
    }

    /// What sigil's verifier said on stderr for each pull it admitted (in
    /// containerd's log, oldest first): `sigil-containerd: IMAGE admitted …`.
    pub fn verifier_calls(&self) -> Vec<String> {
        let text =
            std::fs::read_to_string(self.dir.path().join("containerd.log")).unwrap_or_default();
        text.lines()
            .filter(|l| l.contains("sigil-containerd:") || l.contains("sigil refused"))
            .map(str::to_owned)
            .collect()
    }

    /// The node's directory (configs, logs, the overlays' upper layers).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        // The kubelet first, so it starts nothing again; then every Pod and
        // shim, containerd, the namespace (its mounts go with it).
        let mut procs = self.procs.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(kubelet) = procs.get_mut(2) {
            let _ = kubelet.kill();
            let _ = kubelet.wait();
        }
        host::kill_pods();
        self.kill_shims();
        for c in procs.iter_mut().rev() {
            let _ = c.kill();
            let _ = c.wait();
        }
        // The control plane (`kube`) and the host (`_host`) go next, in
        // field order.
    }
}
