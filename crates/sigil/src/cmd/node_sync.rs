//! `sigil node sync`: what the node DaemonSet runs (docs/node.md). It keeps
//! the node's policy file equal to the cluster-wide policy the webhook has
//! in force — the policy ConfigMap's file plus the ClusterImagePolicies,
//! composed by the webhook's own composition (`sigil_kube::node`), checked
//! to load on the node as written, written atomically when it changes — and
//! installs the verifier: the static build copied to the host, run once,
//! and `sigil-containerd` linked to it in containerd's `bin_dir` last (so
//! the verifier never runs without the policy). A policy a node could not
//! load is never written: the node keeps the one it has, and `/readyz` and
//! `sigil_node_sync_healthy` say so. The pull path never calls the network
//! for the policy: containerd's verifier reads the file.

use std::path::{Path, PathBuf};
use std::time::Duration;

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::{Context as _, Result};
use sigil::node::sync::{MAX_POLICY_BYTES, Status};
use sigil_core::Policy;
use sigil_kube::node::{Change, NodePolicy};

/// Flags of `sigil node sync`.
#[derive(clap::Args, Debug)]
pub struct SyncArgs {
    /// The ConfigMap holding the policy file, `namespace/name` (key
    /// `policy.yaml`): the one the webhook mounts.
    #[arg(
        long,
        env = "SIGIL_NODE_POLICY_CONFIGMAP",
        default_value = "sigil-system/sigil-policy"
    )]
    policy_configmap: String,
    /// Also put the ClusterImagePolicy objects in the node policy.
    #[arg(long, env = "SIGIL_WATCH_POLICIES")]
    watch_policies: bool,
    /// Where the node policy is written (a hostPath; containerd's
    /// SIGIL_NODE_POLICY names the same file on the host).
    #[arg(long, env = "SIGIL_NODE_POLICY_OUT")]
    out: PathBuf,
    /// Where sigil's binary is copied (a hostPath).
    #[arg(long, env = "SIGIL_NODE_INSTALL_DIR")]
    install_dir: PathBuf,
    /// That binary's path as the host sees it (the link's target).
    #[arg(long, env = "SIGIL_NODE_BINARY_HOST_PATH")]
    binary_host_path: PathBuf,
    /// containerd's verifier `bin_dir` (a hostPath): `sigil-containerd` is
    /// linked there.
    #[arg(long, env = "SIGIL_NODE_VERIFIER_DIR")]
    verifier_dir: PathBuf,
    /// The binary copied to the host as the verifier: the image's static
    /// build (`/usr/local/bin/sigil-static`, which runs on any Linux host
    /// of its architecture); without, this process's own binary.
    #[arg(long, env = "SIGIL_NODE_VERIFIER_BINARY")]
    verifier_binary: Option<PathBuf>,
    /// Where `/readyz` (false while the node lacks the cluster's policy or
    /// the verifier), `/livez` and `/metrics` are served; none without.
    #[arg(long, env = "SIGIL_NODE_SYNC_LISTEN")]
    listen: Option<SocketAddr>,
}

/// Runs `sigil node sync` until killed.
pub fn run(args: SyncArgs) -> Result<std::process::ExitCode> {
    let (ns, name) = args
        .policy_configmap
        .split_once('/')
        .context("--policy-configmap is namespace/name")?;
    let (ns, name) = (ns.to_owned(), name.to_owned());
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("SIGIL_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .json()
        .flatten_event(true)
        .with_writer(std::io::stderr)
        .init();
    super::runtime()?.block_on(async move {
        let status = Arc::new(Status::default());
        if let Some(addr) = args.listen {
            let l = tokio::net::TcpListener::bind(addr)
                .await
                .with_context(|| format!("listening on {addr}"))?;
            tracing::info!(addr = %l.local_addr()?, "probes and metrics listening (HTTP, /livez /readyz /metrics)");
            tokio::spawn(sigil::node::status::serve(l, status.clone()));
        }
        let client = sigil_kube::cluster::connect("sigil node sync").await?;
        let mut installed = false;
        // The last policy given to the node: its size, what it left out and
        // how many of its keyRefs could not be read.
        let mut last = (0, 0, 0);
        let on = |change: sigil_kube::Result<Change>| {
            let synced = change.map_err(anyhow::Error::from).and_then(|c| match c {
                Change::Composed(policy) => {
                    apply(&args, &policy)?;
                    let unreadable = policy.keys.keys.iter().filter(|k| k.error.is_some()).count();
                    last = (policy.text.len(), policy.left_out.len(), unreadable);
                    Ok(())
                }
                Change::Unchanged => Ok(()),
            });
            match synced {
                Ok(()) => {
                    status.synced(last.0, last.1, now());
                    status.keys_unreadable(last.2);
                    if !installed {
                        match install(&args) {
                            Ok(()) => {
                                installed = true;
                                status.installed();
                                tracing::info!(policy = %args.out.display(), verifier = %args.verifier_dir.join(sigil::node::check::VERIFIER).display(), "node verifier installed");
                            }
                            Err(e) => {
                                let why = format!("{e:#}");
                                tracing::error!(error = %why, "the verifier is not installed: containerd keeps pulling without it");
                                status.install_failed(why);
                            }
                        }
                    }
                }
                Err(e) => {
                    let why = format!("{e:#}");
                    tracing::warn!(error = %why, "the node keeps the policy it has");
                    status.failed(why);
                }
            }
        };
        sigil_kube::node::watch(client, (&ns, &name), args.watch_policies, on).await;
        anyhow::bail!("the policy watches ended")
    })
}

fn now() -> u64 {
    u64::try_from(sigil::engine::unix_now()).unwrap_or(0)
}

/// Gives the node a newly composed policy: checked as the node will load
/// it, written when it changed. An error leaves the node's file as it was.
fn apply(args: &SyncArgs, policy: &NodePolicy) -> Result<()> {
    for (cip, why) in &policy.left_out {
        tracing::warn!(policy = %cip, error = %why, "ClusterImagePolicy not in force as it is (the webhook leaves it out too)");
    }
    for k in &policy.keys.keys {
        match (&k.from, &k.error) {
            (Some(o), _) => {
                tracing::info!(key_ref = %k.key_ref, namespace = %o.namespace, resource_version = %o.resource_version, sha256 = %o.sha256, "keyRef carried to the node")
            }
            (None, Some(e)) => {
                tracing::warn!(key_ref = %k.key_ref, error = %e, "keyRef not readable: its verifiers refuse every image on the node, as at the webhook (allow it: sigil node rbac, the chart's node.keyRefs)")
            }
            (None, None) => {}
        }
    }
    // What the node has already passed these checks.
    if std::fs::read(&args.out).is_ok_and(|b| b == policy.text.as_bytes()) {
        return Ok(());
    }
    let node = node_policy_problems(policy)?;
    write_if_changed(&args.out, node.as_bytes())
}

/// The node policy's text, or why a node cannot be given it: too large for
/// the verifier to read, trust material only the webhook's Pod has, or
/// text that does not load back as the policy composed.
fn node_policy_problems(policy: &NodePolicy) -> Result<&str> {
    let text = policy.text.as_str();
    if text.len() > MAX_POLICY_BYTES {
        anyhow::bail!(
            "the composed policy is {} bytes; a node reads at most {MAX_POLICY_BYTES}: it is not given to nodes (split rules over fewer, broader patterns)",
            text.len()
        );
    }
    let elsewhere = sigil::node::sync::elsewhere(&policy.policy);
    if !elsewhere.is_empty() {
        anyhow::bail!(
            "the policy names trust material nodes do not have, so nodes keep the policy they have: {}",
            elsewhere.join("; ")
        );
    }
    let (loaded, _) = Policy::from_node_documents_at(text, Some(sigil::engine::unix_now()))
        .context("the node policy does not load as written")?;
    anyhow::ensure!(
        loaded.rules.len() == policy.policy.rules.len(),
        "the node policy loads to {} rules, not the {} in force",
        loaded.rules.len(),
        policy.policy.rules.len()
    );
    Ok(text)
}

/// Writes `bytes` to `path` (temporary file, then rename) unless it holds
/// them, readable by root only: it may carry a Secret's key.
fn write_if_changed(path: &Path, bytes: &[u8]) -> Result<()> {
    if std::fs::read(path).is_ok_and(|b| b == bytes) {
        return Ok(());
    }
    let mode = Some(0o600);
    sigil::files::write_atomic_mode(path, bytes, sigil::files::Durability::Synced, mode)
        .with_context(|| format!("writing the node policy {}", path.display()))?;
    tracing::info!(path = %path.display(), "node policy written");
    Ok(())
}

/// Copies this binary to the host (if it differs) and links the verifier
/// to it (replacing the link atomically).
fn install(args: &SyncArgs) -> Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    let source = args
        .verifier_binary
        .clone()
        .unwrap_or_else(|| PathBuf::from("/proc/self/exe"));
    let me = std::fs::read(&source)
        .with_context(|| format!("reading the verifier's binary {}", source.display()))?;
    // containerd runs the copy with the host's libraries: only a static
    // binary runs on any host (Debian 12's glibc 2.36 is newer than many).
    if let Some(loader) = sigil::node::sync::interpreter(&me) {
        tracing::warn!(binary = %source.display(), %loader, "the verifier is dynamically linked: it runs only on hosts with the libraries it was built against (set SIGIL_NODE_VERIFIER_BINARY to the image's static /usr/local/bin/sigil-static)");
    }
    let target = args.install_dir.join("sigil");
    if !std::fs::read(&target).is_ok_and(|b| b == me) {
        sigil::files::write_atomic(&target, &me, sigil::files::Durability::Synced)
            .with_context(|| format!("copying sigil to {}", target.display()))?;
    }
    std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o755))
        .with_context(|| format!("making {} executable", target.display()))?;
    // containerd refuses every pull whose verifier fails to start: run the
    // copy once, as containerd will, before it is linked.
    runs(&target)?;
    let link = args.verifier_dir.join(sigil::node::check::VERIFIER);
    // A link left by a sync that died between its two steps (containerd
    // would run it as one more verifier).
    let stale = format!(".{}.", sigil::node::check::VERIFIER);
    for e in std::fs::read_dir(&args.verifier_dir)
        .with_context(|| format!("reading {}", args.verifier_dir.display()))?
        .flatten()
    {
        if e.file_name().to_string_lossy().starts_with(&stale) {
            let _ = std::fs::remove_file(e.path());
        }
    }
    let tmp = args.verifier_dir.join(format!(
        ".{}.{}",
        sigil::node::check::VERIFIER,
        std::process::id()
    ));
    let _ = std::fs::remove_file(&tmp);
    std::os::unix::fs::symlink(&args.binary_host_path, &tmp)
        .with_context(|| format!("linking {}", tmp.display()))?;
    std::fs::rename(&tmp, &link).with_context(|| format!("placing {}", link.display()))?;
    Ok(())
}

/// Runs `binary node verify` with no arguments (it must answer, on stdout,
/// that containerd passed no `-name`) within 10 s.
fn runs(binary: &Path) -> Result<()> {
    use std::process::{Command, Stdio};
    let mut child = Command::new(binary)
        .args(["node", "verify"])
        .env_clear()
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("{} does not start on this node", binary.display()))?;
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while child.try_wait()?.is_none() {
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            anyhow::bail!("{} did not answer within 10 s", binary.display());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output()?;
    let said = String::from_utf8_lossy(&out.stdout);
    anyhow::ensure!(
        said.contains("did not pass -name"),
        "{} does not run on this node (exit {:?}): {}{}",
        binary.display(),
        out.status.code(),
        said.trim(),
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(text: String) -> NodePolicy {
        NodePolicy {
            policy: Policy::from_documents_at(&text, None)
                .unwrap_or_else(|_| Policy::embedded_default()),
            text,
            left_out: Vec::new(),
            keys: Default::default(),
        }
    }

    #[test]
    fn regression_a_policy_a_node_cannot_read_is_never_written() {
        let small = "apiVersion: sigil.dev/v1alpha1\nkind: ImagePolicy\nmetadata: {name: p}\nspec:\n  rules: [{name: r, match: [\"r.example.com/**\"]}]\n";
        assert!(node_policy_problems(&node(small.to_owned())).is_ok());
        // Past what the verifier reads: every pull on the node would be refused.
        let big = format!("{small}#{}\n", "x".repeat(MAX_POLICY_BYTES));
        let e = node_policy_problems(&node(big)).unwrap_err().to_string();
        assert!(e.contains("a node reads at most"), "{e}");
        // Trust material only the webhook's Pod has.
        let keyed = small.replace(
            "match: [\"r.example.com/**\"]}",
            "match: [\"r.example.com/**\"], verify: [{name: k, cosign: {key: /etc/sigil/k.pub}}]}",
        );
        let e = node_policy_problems(&node(keyed)).unwrap_err().to_string();
        assert!(
            e.contains("rule \"r\"") && e.contains("/etc/sigil/k.pub"),
            "{e}"
        );
    }
}
