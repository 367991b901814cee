//! `sigil node sync`: what the node DaemonSet runs (docs/node.md). It keeps
//! the node's policy file equal to the platform's policy — the policy
//! ConfigMap's file plus every ClusterImagePolicy that loads with it, read
//! through the API, written atomically when it changes — and installs the
//! verifier: sigil's own binary copied to the host and `sigil-containerd`
//! linked to it in containerd's `bin_dir`, the policy always first (so the
//! verifier never runs without one). The pull path never calls the
//! network for the policy: containerd's verifier reads the file.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context as _, Result};
use sigil_core::Policy;

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
    /// How often the policy is read again (two reads per node per interval,
    /// the list from the API server's cache).
    #[arg(long, env = "SIGIL_NODE_SYNC_INTERVAL", default_value = "30s", value_parser = humantime::parse_duration)]
    interval: Duration,
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
        let client = sigil_kube::cluster::connect("sigil node sync").await?;
        let mut installed = false;
        let mut failures = 0u32;
        loop {
            match compose(&client, &ns, &name, args.watch_policies).await {
                Ok(text) => {
                    failures = 0;
                    write_if_changed(&args.out, text.as_bytes())?;
                    if !installed {
                        install(&args)?;
                        installed = true;
                        tracing::info!(policy = %args.out.display(), verifier = %args.verifier_dir.join(sigil::node::check::VERIFIER).display(), "node verifier installed");
                    }
                }
                Err(e) => {
                    failures += 1;
                    if failures == 1 || failures.is_multiple_of(30) {
                        tracing::warn!(error = %format!("{e:#}"), "reading the cluster's policy failed; the node keeps the policy it has");
                    }
                }
            }
            tokio::time::sleep(args.interval).await;
        }
    })
}

/// The node policy: the ConfigMap's file, then each ClusterImagePolicy that
/// loads with it (one that does not is left out and logged, as the webhook
/// leaves it out of the policy in force).
async fn compose(client: &kube::Client, ns: &str, name: &str, objects: bool) -> Result<String> {
    let file = sigil_kube::node::configmap_file(client, ns, name, "policy.yaml")
        .await?
        .with_context(|| format!("ConfigMap {ns}/{name} has no policy.yaml"))?;
    Policy::from_documents_at(&file, None)
        .with_context(|| format!("the policy in ConfigMap {ns}/{name} is invalid"))?;
    let mut text = file;
    if objects {
        for (cip, doc) in sigil_kube::node::cluster_policy_documents(client).await? {
            let with = format!("{text}\n---\n{doc}\n");
            match Policy::from_documents_at(&with, None) {
                Ok(_) => text = with,
                Err(e) => {
                    tracing::warn!(policy = %cip, error = %e, "ClusterImagePolicy left out of the node policy")
                }
            }
        }
    }
    Ok(text)
}

/// Writes `bytes` to `path` (temporary file, then rename) unless it holds them.
fn write_if_changed(path: &Path, bytes: &[u8]) -> Result<()> {
    if std::fs::read(path).is_ok_and(|b| b == bytes) {
        return Ok(());
    }
    sigil::files::write_atomic(path, bytes, sigil::files::Durability::Synced)
        .with_context(|| format!("writing the node policy {}", path.display()))?;
    tracing::info!(path = %path.display(), "node policy written");
    Ok(())
}

/// Copies this binary to the host (if it differs) and links the verifier
/// to it (replacing the link atomically).
fn install(args: &SyncArgs) -> Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    let me = std::fs::read("/proc/self/exe").context("reading sigil's own binary")?;
    let target = args.install_dir.join("sigil");
    if !std::fs::read(&target).is_ok_and(|b| b == me) {
        sigil::files::write_atomic(&target, &me, sigil::files::Durability::Synced)
            .with_context(|| format!("copying sigil to {}", target.display()))?;
    }
    std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o755))
        .with_context(|| format!("making {} executable", target.display()))?;
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
