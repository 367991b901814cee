//! What a real node changes on the host, made and undone: the node's /32 on
//! `lo`, the Pod bridge and its forwarding flag, the guard rules that keep
//! every Pod packet on this machine, the Service range's blackhole route;
//! and, on the way out, what the kubelet and kube-proxy added (their
//! iptables chains, the sysctls the kubelet rewrites, its cgroups, shim and
//! container processes). [`sweep`] is idempotent: [`Host::up`] runs it
//! first, so a run killed before its cleanup leaves nothing for the next.
//! What it does not own: the processes it does not know by name (the
//! parent module stops its own), files (they live in the node's temporary
//! directory or its mount namespace's overlays).

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::{BRIDGE, NODE_IP, POD_GATEWAY, SERVICE_RANGE};

/// The sysctls the kubelet rewrites (saved before, restored after).
const SYSCTLS: [&str; 3] = [
    "kernel.panic",
    "kernel.panic_on_oops",
    "vm.overcommit_memory",
];

/// Where the sysctls' values from before the node are kept while it runs, so
/// that a sweep after a killed run can still restore them.
const SAVED: &str = "/run/sigil-node-tier.sysctl";

/// The chains the kubelet adds (kube-proxy's go with `kube-proxy --cleanup`).
const KUBELET_CHAINS: [&str; 3] = ["KUBE-FIREWALL", "KUBE-KUBELET-CANARY", "KUBE-IPTABLES-HINT"];

/// Runs a host command; its exit status (false when it could not start).
pub(crate) fn sh(program: &str, args: &[&str]) -> bool {
    Command::new(program)
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Runs a host command that must succeed; panics with its output.
fn must(program: &str, args: &[&str]) {
    let out = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{program}: {e}"));
    assert!(
        out.status.success(),
        "{program} {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The guard rules: nothing enters or leaves the Pod bridge except to or
/// from the bridge itself and this machine's own stack (no forwarding off
/// the machine, whatever routes or NAT rules anything adds).
fn guards() -> [Vec<&'static str>; 2] {
    [
        vec![
            "-t", "mangle", "FORWARD", "-i", BRIDGE, "!", "-o", BRIDGE, "-j", "DROP",
        ],
        vec![
            "-t", "mangle", "FORWARD", "!", "-i", BRIDGE, "-o", BRIDGE, "-j", "DROP",
        ],
    ]
}

fn rule(op: &str, spec: &[&str]) -> Vec<String> {
    // "-t TABLE OP CHAIN rest…"
    let mut v: Vec<String> = spec[..2].iter().map(|s| (*s).to_owned()).collect();
    v.push(op.to_owned());
    v.extend(spec[2..].iter().map(|s| (*s).to_owned()));
    v
}

/// The host's changes for one node; undone on drop.
pub struct Host {
    /// Where the kube-proxy binary is (its `--cleanup`).
    kube_proxy: std::path::PathBuf,
}

impl Host {
    /// Sweeps what an earlier run may have left, saves the sysctls, then
    /// adds the node's address, the bridge, the guard rules and the
    /// blackhole route.
    pub fn up(kube_proxy: &Path) -> Host {
        sweep(kube_proxy);
        let saved: Vec<String> = SYSCTLS
            .iter()
            .filter_map(|k| {
                let out = Command::new("sysctl").args(["-n", k]).output().ok()?;
                let v = String::from_utf8_lossy(&out.stdout).trim().to_owned();
                (!v.is_empty()).then(|| format!("{k}={v}"))
            })
            .collect();
        std::fs::write(SAVED, saved.join("\n")).unwrap();
        must(
            "ip",
            &["addr", "add", &format!("{NODE_IP}/32"), "dev", "lo"],
        );
        must("ip", &["link", "add", BRIDGE, "type", "bridge"]);
        must(
            "ip",
            &["addr", "add", &format!("{POD_GATEWAY}/24"), "dev", BRIDGE],
        );
        must("ip", &["link", "set", BRIDGE, "up"]);
        // Service DNAT sends replies back onto the bridge: forwarding on it
        // alone (net.ipv4.ip_forward stays as it is).
        must(
            "sysctl",
            &["-qw", &format!("net.ipv4.conf.{BRIDGE}.forwarding=1")],
        );
        for g in guards() {
            let args = rule("-I", &g);
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            must("iptables", &args);
        }
        // The Service range never leaves the machine, whatever the default
        // route: the host itself cannot reach ClusterIPs (Pods can, by DNAT).
        must("ip", &["route", "add", "blackhole", SERVICE_RANGE]);
        Host {
            kube_proxy: kube_proxy.to_owned(),
        }
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        sweep(&self.kube_proxy);
    }
}

/// Undoes everything a node tier may have changed on the host; each step
/// is tolerant of it not being there.
pub fn sweep(kube_proxy: &Path) {
    kill_pods();
    // Shims of any node's containerd (their sockets are in the tier's
    // temporary directories).
    let _ = Command::new("pkill")
        .args(["-KILL", "-f", "containerd-shim-runc-v2 .*sigil-node"])
        .status();
    remove_cgroups();
    let _ = Command::new(kube_proxy)
        .arg("--cleanup")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
    for ipt in ["iptables", "ip6tables"] {
        for chain in ["INPUT", "OUTPUT"] {
            while sh(ipt, &["-D", chain, "-j", "KUBE-FIREWALL"]) {}
        }
        for table in ["filter", "nat", "mangle"] {
            for c in KUBELET_CHAINS {
                sh(ipt, &["-t", table, "-F", c]);
                sh(ipt, &["-t", table, "-X", c]);
            }
        }
    }
    for g in guards() {
        let args = rule("-D", &g);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        while sh("iptables", &args) {}
    }
    sh("ip", &["route", "del", "blackhole", SERVICE_RANGE]);
    sh("ip", &["link", "del", BRIDGE]);
    sh(
        "ip",
        &["addr", "del", &format!("{NODE_IP}/32"), "dev", "lo"],
    );
    if let Ok(saved) = std::fs::read_to_string(SAVED) {
        for kv in saved.lines().filter(|l| l.contains('=')) {
            sh("sysctl", &["-qw", kv]);
        }
        let _ = std::fs::remove_file(SAVED);
    }
}

/// Every cgroup directory the kubelet made (cgroup v1: one tree per
/// controller, `kubepods` at the top of each; v2: one), deepest first.
fn kubepods() -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    let Ok(roots) = std::fs::read_dir("/sys/fs/cgroup") else {
        return out;
    };
    let mut tops: Vec<std::path::PathBuf> = vec!["/sys/fs/cgroup/kubepods".into()];
    tops.extend(
        roots
            .flatten()
            .map(|e| e.path().join("kubepods"))
            .filter(|p| p.is_dir()),
    );
    fn walk(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
        if let Ok(rd) = std::fs::read_dir(dir) {
            for e in rd.flatten() {
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    walk(&e.path(), out);
                }
            }
        }
        out.push(dir.to_owned());
    }
    for t in tops.into_iter().filter(|p| p.is_dir()) {
        walk(&t, &mut out);
    }
    out
}

/// SIGKILLs every process in the kubelet's Pod cgroups (containers and
/// their sandboxes): what a power cut does to them.
pub fn kill_pods() {
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let mut any = false;
        for dir in kubepods() {
            let procs = std::fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
            for pid in procs.split_whitespace() {
                // A zombie PID 1 here reaps slowly: count it as stopped.
                let state =
                    std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
                if state.split_whitespace().nth(2) == Some("Z") {
                    continue;
                }
                any = true;
                sh("kill", &["-KILL", pid]);
            }
        }
        if !any || Instant::now() > until {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Removes the kubelet's cgroups (once empty), deepest first.
fn remove_cgroups() {
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let left: Vec<_> = kubepods()
            .into_iter()
            .filter(|d| std::fs::remove_dir(d).is_err() && d.exists())
            .collect();
        if left.is_empty() || Instant::now() > until {
            return;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// How many packets the guard rules have dropped so far.
pub fn guard_drops() -> u64 {
    let out = Command::new("iptables")
        .args(["-t", "mangle", "-L", "FORWARD", "-v", "-x", "-n"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    out.lines()
        .filter(|l| l.contains("DROP") && l.contains(BRIDGE))
        .filter_map(|l| l.split_whitespace().next()?.parse::<u64>().ok())
        .sum()
}

/// The kubelet's and kube-proxy's rules and the tier's address, bridge and
/// route that are still on the host (empty after a clean teardown): what a
/// test asserts after a node is gone.
pub fn traces() -> Vec<String> {
    let mut out = Vec::new();
    for ipt in ["iptables-save", "ip6tables-save"] {
        if let Ok(o) = Command::new(ipt).output() {
            let text = String::from_utf8_lossy(&o.stdout);
            out.extend(
                text.lines()
                    .filter(|l| l.contains("KUBE-") || l.contains(BRIDGE))
                    .map(|l| format!("{ipt}: {l}")),
            );
        }
    }
    let ip = |args: &[&str]| {
        Command::new("ip")
            .args(args)
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default()
    };
    if ip(&["addr", "show", "dev", "lo"]).contains(&format!("{NODE_IP}/32")) {
        out.push(format!("{NODE_IP}/32 on lo"));
    }
    if !ip(&["link", "show", BRIDGE]).is_empty() {
        out.push(format!("link {BRIDGE}"));
    }
    if ip(&["route", "show", "type", "blackhole"]).contains(SERVICE_RANGE) {
        out.push(format!("blackhole {SERVICE_RANGE}"));
    }
    out.extend(kubepods().into_iter().map(|d| d.display().to_string()));
    if Path::new(SAVED).exists() {
        out.push(SAVED.to_owned());
    }
    out
}
