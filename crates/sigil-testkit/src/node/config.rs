//! The node's configuration files, as the node assets' notes found they
//! must be on these machines: containerd (CRI with runc, the restricted OOM
//! score, the pinned sandbox image, `hosts.toml` for the plain-HTTP test
//! registry, CNI; the image verifiers at containerd's default `bin_dir`),
//! the kubelet (cgroup v1 allowed, no swap check, its own directories),
//! kube-proxy (iptables, node ports on the node's address only) and the
//! CNI bridge (no masquerade). Pure text; writing and starting is the
//! parent module's.

use std::path::Path;

use super::{BRIDGE, NODE_IP, NODE_NAME, POD_CIDR, POD_GATEWAY};

/// containerd 2's default image-verifier `bin_dir`: where the chart's node
/// DaemonSet links sigil (inside the node's mount namespace, a directory of
/// the test's).
pub const VERIFIER_DIR: &str = "/opt/containerd/image-verifier/bin";

/// containerd's config.toml (version 3) for a node under `d`.
pub fn containerd(d: &Path, sandbox: &str, runc: &Path) -> String {
    format!(
        r#"version = 3
root = "{d}/containerd/root"
state = "{d}/containerd/state"
temp = "{d}/tmp"
[grpc]
  address = "{d}/containerd.sock"
[ttrpc]
  address = "{d}/containerd.sock.ttrpc"
[plugins."io.containerd.image-verifier.v1.bindir"]
  bin_dir = "{VERIFIER_DIR}"
  max_verifiers = 10
  per_verifier_timeout = "10s"
[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = "{sandbox}"
  [plugins."io.containerd.cri.v1.images".registry]
    config_path = "{d}/certs.d"
[plugins."io.containerd.cri.v1.runtime"]
  restrict_oom_score_adj = true
  disable_hugetlb_controller = true
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = ["/usr/lib/cni"]
    conf_dir = "{d}/cni"
  [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
      BinaryName = "{runc}"
      SystemdCgroup = false
"#,
        d = d.display(),
        runc = runc.display(),
    )
}

/// `hosts.toml` for the plain-HTTP registry `host`.
pub fn hosts(host: &str) -> String {
    format!(
        "server = \"http://{host}\"\n[host.\"http://{host}\"]\n  capabilities = [\"pull\", \"resolve\"]\n"
    )
}

/// The CNI network: the bridge, host-local addresses, no masquerade.
pub fn cni(d: &Path) -> String {
    serde_json::json!({
        "cniVersion": "1.0.0",
        "name": "sigil-node",
        "plugins": [
            {"type": "bridge", "bridge": BRIDGE, "isGateway": false, "ipMasq": false,
             "hairpinMode": true,
             "ipam": {"type": "host-local", "dataDir": d.join("ipam"),
                      "ranges": [[{"subnet": POD_CIDR, "gateway": POD_GATEWAY}]],
                      "routes": [{"dst": "0.0.0.0/0", "gw": POD_GATEWAY}]}},
            {"type": "portmap", "capabilities": {"portMappings": true}}
        ]
    })
    .to_string()
}

/// The KubeletConfiguration.
pub fn kubelet(d: &Path, ca: &Path) -> String {
    format!(
        r#"apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
cgroupDriver: cgroupfs
failCgroupV1: false
failSwapOn: false
staticPodPath: {d}/manifests
fileCheckFrequency: 2s
containerRuntimeEndpoint: unix://{d}/containerd.sock
authentication:
  x509: {{clientCAFile: {ca}}}
  anonymous: {{enabled: false}}
  webhook: {{enabled: false}}
authorization: {{mode: AlwaysAllow}}
resolvConf: ""
podLogsDir: {d}/pod-logs
volumePluginDir: {d}/volume-plugins
protectKernelDefaults: false
address: {NODE_IP}
healthzBindAddress: 127.0.0.1
healthzPort: 0
serializeImagePulls: false
"#,
        d = d.display(),
        ca = ca.display(),
    )
}

/// The KubeProxyConfiguration (iptables mode; metrics and health on
/// loopback `ports`).
pub fn kube_proxy(kubeconfig: &Path, ports: (u16, u16)) -> String {
    format!(
        r#"apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: iptables
clientConnection: {{kubeconfig: {k}}}
clusterCIDR: {POD_CIDR}
hostnameOverride: {NODE_NAME}
bindAddress: {NODE_IP}
metricsBindAddress: 127.0.0.1:{m}
healthzBindAddress: 127.0.0.1:{h}
nodePortAddresses: ["{NODE_IP}/32"]
conntrack: {{maxPerCore: 0}}
"#,
        k = kubeconfig.display(),
        m = ports.0,
        h = ports.1,
    )
}
