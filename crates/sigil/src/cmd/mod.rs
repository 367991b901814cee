//! One module per subcommand: each parses its own flags, validates them
//! before any runtime starts, calls the library, and renders the result.
//! What they share is here: exit codes, loading the policy, the engine for
//! client-side commands, and where sigil's cluster objects are.

use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use sigil::engine::Engine;
use sigil::engine::Sources;
use sigil::metrics::Metrics;
use sigil_core::Policy;
use sigil_kube::cluster::{FailurePolicy, Settings};
use sigil_registry::Registry;
use sigil_registry::keychain::Keychain;

/// `println!` that returns the error instead of panicking when stdout is a
/// pipe whose reader has gone (`sigil verify IMAGE | head -1`): the command
/// then exits 2 saying so, as for any other failure. Use as `say!(…)?`.
macro_rules! say {
    ($($arg:tt)*) => {
        $crate::cmd::write_out(&format!("{}\n", format_args!($($arg)*)))
    };
}

pub mod audit;
pub mod backstop;
pub mod break_glass;
pub mod crds;
pub mod krm;
pub mod mirror;
pub mod node;
pub mod node_check;
pub mod node_env;
pub mod node_rbac;
pub mod node_sync;
pub mod pin;
pub mod policy;
pub mod serve;
pub mod test;
pub mod trust_root;
pub mod verify;
pub mod verify_bundle;

/// Exit code: something is not pinned (`--check`) or is denied by the policy.
pub const EXIT_FINDINGS: u8 = 1;
/// Exit code: bad input (unreadable file, invalid YAML, bad policy, usage).
pub const EXIT_ERROR: u8 = 2;

/// The policy and, for a file, the bytes it came from (for hot reload).
pub fn load_policy_bytes(path: Option<&Path>) -> Result<(Policy, Option<Vec<u8>>)> {
    match path {
        None => Ok((Policy::embedded_default(), None)),
        Some(p) => {
            let bytes = sigil_registry::file::read(p, sigil_registry::file::MAX_CONFIG_BYTES)
                .with_context(|| format!("reading policy {}", p.display()))?;
            let text = std::str::from_utf8(&bytes)
                .with_context(|| format!("policy {} is not UTF-8", p.display()))?;
            let policy = Policy::from_documents_at(text, Some(sigil::engine::unix_now()))
                .with_context(|| format!("policy {}", p.display()))?;
            Ok((policy, Some(bytes)))
        }
    }
}

/// The policy at `path`, or the embedded default.
pub fn load_policy(path: Option<&Path>) -> Result<Policy> {
    load_policy_bytes(path).map(|(policy, _)| policy)
}

/// The engine a client-side command decides with (its metrics are not served).
pub fn engine_for(policy: Policy, sources: &Sources) -> Result<Engine<Registry>> {
    let metrics = Arc::new(Metrics::default());
    sigil::engine::engine_for(Arc::new(policy), None, sources, &metrics)
        .context("putting the policy in force")
}

/// How `sigil pin` and `sigil krm` decide: lookups, credentials, namespace.
#[derive(clap::Args, Debug, Clone)]
pub struct DecideArgs {
    /// No registry calls: apply mirrors and rules, report images that need a lookup.
    #[arg(long)]
    pub offline: bool,
    /// Time allowed for the registry lookups of one object.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    pub timeout: Duration,
    #[command(flatten)]
    pub creds: CredentialArgs,
    /// Namespace of objects that name none, for `exemptNamespaces` (kubectl's default).
    #[arg(short = 'n', long, default_value = sigil::pin::DEFAULT_NAMESPACE, env = "SIGIL_NAMESPACE")]
    pub namespace: String,
}

impl DecideArgs {
    /// The options `sigil::pin` decides with.
    pub fn options(&self) -> sigil::pin::PinOptions {
        sigil::pin::PinOptions {
            offline: self.offline,
            timeout: self.timeout,
            namespace: self.namespace.clone(),
        }
    }
}

/// Node-level credentials, configured as kubelet's are (docs/credentials.md).
#[derive(clap::Args, Debug, Clone, Default)]
pub struct CredentialArgs {
    /// A docker config.json: its `auths`, then its `credHelpers`/`credsStore`
    /// (docker-credential-<name> on PATH), are tried after the object's own pull secrets.
    #[arg(long, env = "SIGIL_DOCKER_CONFIG")]
    pub docker_config: Option<PathBuf>,
    /// A kubelet CredentialProviderConfig (kubelet.config.k8s.io/v1): the
    /// credential-provider plugins (ECR, GAR, ACR…) sigil runs as kubelet does.
    #[arg(
        long,
        env = "SIGIL_IMAGE_CREDENTIAL_PROVIDER_CONFIG",
        requires = "image_credential_provider_bin_dir"
    )]
    pub image_credential_provider_config: Option<PathBuf>,
    /// Where the plugins named in --image-credential-provider-config live.
    #[arg(
        long,
        env = "SIGIL_IMAGE_CREDENTIAL_PROVIDER_BIN_DIR",
        requires = "image_credential_provider_config"
    )]
    pub image_credential_provider_bin_dir: Option<PathBuf>,
    /// Consecutive failures (no answer, refused, 5xx) after which a
    /// registry host fails fast for --registry-breaker-cool-down; 0: never.
    #[arg(long, env = "SIGIL_REGISTRY_BREAKER_FAILURES", default_value_t = sigil_registry::breaker::DEFAULT_FAILURES)]
    pub registry_breaker_failures: u32,
    /// How long a failing registry host fails fast before one request probes it.
    #[arg(long, env = "SIGIL_REGISTRY_BREAKER_COOL_DOWN", default_value = "15s", value_parser = humantime::parse_duration)]
    pub registry_breaker_cool_down: Duration,
    /// Blob transfers at once when copying images into mirrors (`mirrors[].copy`, `sigil mirror`).
    #[arg(long, env = "SIGIL_MIRROR_COPY_TRANSFERS", default_value_t = sigil_registry::copy::DEFAULT_TRANSFERS)]
    pub mirror_copy_transfers: usize,
    /// Bytes read from origins and not yet written to mirrors, across all copies.
    #[arg(long, env = "SIGIL_MIRROR_COPY_MAX_BYTES_IN_FLIGHT", default_value_t = sigil_registry::copy::DEFAULT_BYTES_IN_FLIGHT)]
    pub mirror_copy_max_bytes_in_flight: usize,
    /// The most bytes one copy into a mirror may move; a larger image is not copied.
    #[arg(long, env = "SIGIL_MIRROR_COPY_MAX_BYTES", default_value_t = sigil_registry::copy::DEFAULT_MAX_COPY_BYTES)]
    pub mirror_copy_max_bytes: u64,
    /// The most bytes all copies into mirrors may move in an hour.
    #[arg(long, env = "SIGIL_MIRROR_COPY_MAX_BYTES_PER_HOUR", default_value_t = sigil_registry::copy::DEFAULT_MAX_BYTES_PER_HOUR)]
    pub mirror_copy_max_bytes_per_hour: u64,
}

impl CredentialArgs {
    /// The node-level keychain these flags describe.
    pub fn sources(&self) -> Result<Sources> {
        let providers = self
            .image_credential_provider_config
            .as_deref()
            .zip(self.image_credential_provider_bin_dir.as_deref());
        let keychain = Keychain::load(self.docker_config.as_deref(), providers)?;
        Ok(Sources {
            keychain: Arc::new(keychain),
            pull_secrets: None,
            namespaces: None,
            breaker: sigil_registry::breaker::Settings {
                failures: self.registry_breaker_failures,
                cool_down: self.registry_breaker_cool_down,
            },
            copy: sigil_registry::copy::Settings {
                transfers: self.mirror_copy_transfers,
                max_bytes_in_flight: self.mirror_copy_max_bytes_in_flight,
                max_copy_bytes: self.mirror_copy_max_bytes,
                max_bytes_per_hour: self.mirror_copy_max_bytes_per_hour,
            },
            ..Sources::default()
        })
    }
}

/// A multi-threaded runtime, started only after the flags were validated.
pub fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting runtime")
}

/// A runtime on the calling thread alone, for a command whose work is one
/// task (`sigil audit` decides every object inside its listing task, so a
/// worker pool only moved the HTTP connections' tasks to other threads,
/// paid for in wake-ups: 2,400 futex calls for a 10,000-Pod audit, 3–5 µs
/// of CPU per Pod, docs/benchmarks.md). Nothing it runs blocks a thread.
pub fn single_thread_runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting runtime")
}

/// Writes `text` to stdout. `print!` panics when stdout is a pipe whose
/// reader has gone (`sigil audit | head` of a large report); this returns
/// the error, so the command exits 2 saying so, as for any other failure.
pub fn write_out(text: &str) -> Result<()> {
    let mut out = std::io::stdout().lock();
    std::io::Write::write_all(&mut out, text.as_bytes()).context("writing to stdout")?;
    std::io::Write::flush(&mut out).context("writing to stdout")
}

/// Writes `report` as indented JSON and a newline to `out`, as it is
/// serialized: a report of 10,000 objects is about 11 MiB, which a `String`
/// would grow to (copying it as it doubles) before the first byte left.
pub fn write_json_pretty(out: impl std::io::Write, report: &impl serde::Serialize) -> Result<()> {
    let mut out = std::io::BufWriter::with_capacity(64 << 10, out);
    sigil::jsonout::to_writer(&mut out, report).context("writing the JSON report")?;
    std::io::Write::write_all(&mut out, b"\n").context("writing the JSON report")?;
    std::io::Write::flush(&mut out).context("writing the JSON report")?;
    Ok(())
}

/// All of stdin, as UTF-8.
pub fn read_stdin() -> Result<String> {
    let mut s = String::new();
    std::io::stdin()
        .read_to_string(&mut s)
        .context("reading stdin (it must be UTF-8 YAML)")?;
    Ok(s)
}

/// Where sigil's cluster objects are; shared by `serve` and `break-glass`.
#[derive(clap::Args, Debug, Clone)]
pub struct ClusterArgs {
    /// sigil's namespace (default: the pod's service-account namespace, else sigil-system).
    #[arg(long, env = "POD_NAMESPACE")]
    pub namespace: Option<String>,
    /// Name of the MutatingWebhookConfiguration.
    #[arg(long, default_value = "sigil", env = "SIGIL_WEBHOOK_NAME")]
    pub webhook_name: String,
    /// ConfigMap in sigil's namespace that carries the break-glass marker.
    #[arg(long, default_value = "sigil-state", env = "SIGIL_STATE_CONFIGMAP")]
    pub state_configmap: String,
    /// The node tier's namespace (docs/node.md), when it is installed:
    /// exempt from the webhook and the backstop as sigil's own namespace is,
    /// so its DaemonSet arms new nodes while the webhook is down.
    #[arg(long, env = "SIGIL_NODE_NAMESPACE")]
    pub node_namespace: Option<String>,
}

impl ClusterArgs {
    /// Settings with the defaults `serve` overrides from its own flags.
    pub fn settings(&self, namespace: String) -> Settings {
        Settings {
            namespace,
            node_namespace: self.node_namespace.clone(),
            config_name: self.webhook_name.clone(),
            service: "sigil".into(),
            service_port: 443,
            url: None,
            failure_policy: FailurePolicy::Fail,
            timeout_seconds: 10,
            state_configmap: self.state_configmap.clone(),
            interval: Duration::from_secs(30),
            custom_kinds: Default::default(),
        }
    }
}

/// Whether sigil was started as `name`: `sigil-krm` (kustomize's exec
/// functions take no arguments) or `sigil-containerd` (containerd's
/// verifier protocol has its own flags), so the name says which mode to run.
pub fn invoked_as(name: &str) -> bool {
    std::env::args_os()
        .next()
        .map(PathBuf::from)
        .and_then(|p| p.file_stem().map(|s| s.to_string_lossy().into_owned()))
        .is_some_and(|s| s == name)
}
