//! `sigil`: flags and glue. Parse flags, load the policy, build the registry
//! client, bind, serve, drain. Everything else lives in the library crates.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand, ValueEnum};
use sigil::admission::Webhook;
use sigil::engine::Engine;
use sigil::metrics::Metrics;
use sigil::server::{ServeConfig, serve};
use sigil_core::Policy;
use sigil_core::policy::{Action, Scope};

mod pin_cmd;

#[derive(Parser, Debug)]
#[command(
    name = "sigil",
    version,
    about = "Rewrite, pin and verify every container image that enters a Kubernetes cluster"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run the mutating admission webhook.
    Serve(ServeArgs),
    /// Pin (and rewrite) every image in manifests before they go into Git.
    ///
    /// Exit codes: 0 done; 1 an image is denied by the policy, or (--check)
    /// not pinned / not rewritten / failing policy; 2 bad input or usage.
    Pin(pin_cmd::PinArgs),
    /// Run as a KRM function: ResourceList on stdin, pinned ResourceList on stdout.
    ///
    /// Invoked as `sigil-krm` (a symlink), sigil runs this mode with no
    /// arguments, for orchestrators whose exec spec takes none (kustomize).
    Krm(pin_cmd::KrmArgs),
    /// Work with policy files.
    Policy {
        #[command(subcommand)]
        command: PolicyCommand,
    },
}

#[derive(Subcommand, Debug)]
enum PolicyCommand {
    /// Validate a policy and print what each rule means.
    Check {
        /// The ImagePolicy YAML file.
        file: PathBuf,
    },
}

#[derive(clap::Args, Debug)]
struct ServeArgs {
    /// ImagePolicy file; without it, the embedded default (pin everything, warn mode).
    #[arg(long, env = "SIGIL_POLICY")]
    policy: Option<PathBuf>,
    /// HTTPS address for POST /mutate.
    #[arg(long, default_value = "0.0.0.0:8443", env = "SIGIL_LISTEN")]
    listen: SocketAddr,
    /// Plain-HTTP address for /livez, /readyz and /metrics.
    #[arg(long, default_value = "0.0.0.0:8080", env = "SIGIL_ADMIN_LISTEN")]
    admin_listen: SocketAddr,
    /// Serving certificate (PEM, leaf first). Without it sigil mints a CA and certificate in memory.
    #[arg(long, requires = "tls_key", env = "SIGIL_TLS_CERT")]
    tls_cert: Option<PathBuf>,
    /// Private key for --tls-cert (PEM).
    #[arg(long, requires = "tls_cert", env = "SIGIL_TLS_KEY")]
    tls_key: Option<PathBuf>,
    /// Where to write the CA bundle of a self-minted certificate.
    #[arg(long, env = "SIGIL_CA_BUNDLE_OUT")]
    ca_bundle_out: Option<PathBuf>,
    /// Keep serving this long after SIGTERM so endpoints can be removed first
    /// (keep it below the pod's terminationGracePeriodSeconds).
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration, env = "SIGIL_SHUTDOWN_DELAY")]
    shutdown_delay: Duration,
    /// Log format.
    #[arg(long, value_enum, default_value_t = LogFormat::Json, env = "SIGIL_LOG_FORMAT")]
    log_format: LogFormat,
}

#[derive(Copy, Clone, Debug, ValueEnum)]
enum LogFormat {
    Json,
    Text,
}

/// Logs go to stderr through a background writer, so the one decision line
/// per admission costs formatting, not a write(2) on the request path. The
/// writer is lossless (it applies backpressure if ever 128k lines behind);
/// the returned guard flushes it at exit.
fn init_logging(format: LogFormat) -> tracing_appender::non_blocking::WorkerGuard {
    let filter = tracing_subscriber::EnvFilter::try_from_env("SIGIL_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let (writer, guard) = tracing_appender::non_blocking::NonBlockingBuilder::default()
        .lossy(false)
        .thread_name("sigil-log")
        .finish(std::io::stderr());
    let b = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(writer);
    match format {
        LogFormat::Json => b.json().flatten_event(true).with_current_span(false).init(),
        LogFormat::Text => b.init(),
    }
    guard
}

/// The policy and, for a file, the bytes it came from (for hot reload).
fn load_policy(path: Option<&std::path::Path>) -> Result<(Policy, Option<Vec<u8>>)> {
    match path {
        None => Ok((Policy::embedded_default(), None)),
        Some(p) => {
            let bytes =
                std::fs::read(p).with_context(|| format!("reading policy {}", p.display()))?;
            let text = std::str::from_utf8(&bytes)
                .with_context(|| format!("policy {} is not UTF-8", p.display()))?;
            let policy =
                Policy::from_yaml(text).with_context(|| format!("policy {}", p.display()))?;
            Ok((policy, Some(bytes)))
        }
    }
}

/// Whether sigil was started as `sigil-krm` (see [`Command::Krm`]).
fn invoked_as_krm() -> bool {
    std::env::args_os()
        .next()
        .map(PathBuf::from)
        .and_then(|p| p.file_stem().map(|s| s.to_string_lossy().into_owned()))
        .is_some_and(|s| s == "sigil-krm")
}

fn main() -> ExitCode {
    let cli = if invoked_as_krm() {
        let mut args = vec![std::ffi::OsString::from("sigil"), "krm".into()];
        args.extend(std::env::args_os().skip(1));
        Cli::parse_from(args)
    } else {
        Cli::parse()
    };
    let result = match cli.command {
        Command::Serve(args) => run_serve(args),
        Command::Pin(args) => pin_cmd::run_pin(args),
        Command::Krm(args) => pin_cmd::run_krm(args),
        Command::Policy {
            command: PolicyCommand::Check { file },
        } => policy_check(&file),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(pin_cmd::EXIT_ERROR)
        }
    }
}

fn run_serve(args: ServeArgs) -> Result<ExitCode> {
    let _log_guard = init_logging(args.log_format);
    let (policy, policy_bytes) = load_policy(args.policy.as_deref())?;
    let policy = Arc::new(policy);
    let cert = match (&args.tls_cert, &args.tls_key) {
        (Some(c), Some(k)) => sigil::tls::load_files(c, k)?,
        _ => {
            let names = sigil::tls::default_names();
            let cert = sigil::tls::self_signed(&names)?;
            let out = args.ca_bundle_out.clone().unwrap_or_else(|| {
                std::env::temp_dir().join(format!("sigil-ca-{}.pem", std::process::id()))
            });
            let pem = cert.ca_pem.as_deref().unwrap_or_default();
            sigil::files::write_atomic(&out, pem.as_bytes(), sigil::files::Durability::RenameOnly)?;
            tracing::info!(ca_bundle = %out.display(), names = ?names, "no --tls-cert given: minted a CA and serving certificate in memory; clients must trust the CA bundle");
            cert
        }
    };
    tracing::info!(
        policy = %policy.name,
        source = %args.policy.as_ref().map(|p| p.display().to_string()).unwrap_or_else(|| "embedded default".into()),
        rules = policy.rules.len(),
        mirrors = policy.mirrors.len(),
        "policy loaded"
    );
    let metrics = Arc::new(Metrics::default());
    let registry = sigil::reload::registry_for(&policy, None, &metrics)
        .context("setting up registry clients")?;
    let webhook = Arc::new(Webhook::new(Engine::new(policy, registry), metrics.clone()));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting runtime")?;
    rt.block_on(serve(
        ServeConfig {
            listen: args.listen,
            admin_listen: args.admin_listen,
            cert,
            cert_files: args.tls_cert.clone().zip(args.tls_key.clone()),
            policy_file: args.policy.clone().zip(policy_bytes),
            shutdown_delay: args.shutdown_delay,
        },
        webhook,
        metrics,
    ))?;
    Ok(ExitCode::SUCCESS)
}

fn policy_check(file: &PathBuf) -> Result<ExitCode> {
    let text =
        std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
    let p = match Policy::from_yaml(&text) {
        Ok(p) => p,
        Err(e) => bail!("{}: {e}", file.display()),
    };
    print!("{}", describe(&p));
    Ok(ExitCode::SUCCESS)
}

/// Plain-words rendering of a policy for `sigil policy check`.
fn describe(p: &Policy) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    let name = if p.name.is_empty() {
        "(unnamed)"
    } else {
        &p.name
    };
    let _ = writeln!(s, "policy {name:?} is valid.\n");
    if p.mirrors.is_empty() {
        let _ = writeln!(s, "mirrors: none; images are pulled from where they name.");
    } else {
        let _ = writeln!(
            s,
            "mirrors (applied first; the longest matching origin wins):"
        );
        for m in &p.mirrors {
            let _ = writeln!(
                s,
                "  {}/… is pulled from {}/… (and {}/… is read back as {}/… for rule matching)",
                m.from, m.to, m.to, m.from
            );
        }
    }
    if !p.registries.is_empty() {
        let _ = writeln!(s, "registries:");
        for r in &p.registries {
            let mut parts = vec![if r.insecure {
                "plain HTTP (insecure: true)".to_owned()
            } else {
                "HTTPS".to_owned()
            }];
            if let Some(ca) = &r.ca {
                parts.push(format!(
                    "extra CA {}",
                    if ca.contains("-----BEGIN") {
                        "(inline PEM)"
                    } else {
                        ca
                    }
                ));
            }
            match &r.auth {
                Some(a) if a.docker_config.is_some() => parts.push(format!(
                    "credentials from docker config {}",
                    a.docker_config.as_deref().unwrap_or_default()
                )),
                Some(a) => parts.push(format!(
                    "user {} with password from {}",
                    a.username.as_deref().unwrap_or_default(),
                    a.password_file.as_deref().unwrap_or_default()
                )),
                None => parts.push("anonymous".into()),
            }
            let _ = writeln!(s, "  {}: {}", r.host, parts.join(", "));
        }
    }
    let scope = match p.scope {
        Scope::Workloads => "every object with pod-spec image fields is patched",
        Scope::Pods => "only Pods are patched; other workloads are checked but left as written",
    };
    let platform = p
        .platform
        .as_ref()
        .map(|x| format!("the {x} manifest's digest"))
        .unwrap_or_else(|| "the index digest (all platforms)".into());
    let _ = writeln!(
        s,
        "pinning: {scope}; tags are pinned to {platform}; digests are cached for {}.",
        humantime::format_duration(p.cache_ttl)
    );
    let _ = writeln!(s, "rules (the most specific matching pattern wins):");
    for r in &p.rules {
        let pats: Vec<&str> = r.patterns.iter().map(|x| x.normalized()).collect();
        let what = match r.action {
            Action::Deny => "are denied".to_owned(),
            Action::Allow => "are admitted as written, without pinning".to_owned(),
            Action::Pin => format!(
                "are pinned to a digest; if that fails they are {}",
                if r.mode == sigil_core::Mode::Enforce {
                    "denied (enforce)"
                } else {
                    "admitted unchanged with a warning (warn)"
                }
            ),
        };
        let _ = writeln!(
            s,
            "  {}: images matching {} {what}",
            r.name,
            pats.join(", ")
        );
        if let Some(d) = &r.description {
            let _ = writeln!(s, "    {d}");
        }
    }
    let _ = writeln!(s, "  any other image is denied: no rule matches it.");
    if p.exempt_namespaces.is_empty() {
        let _ = writeln!(s, "exempt namespaces: none");
    } else {
        let _ = writeln!(
            s,
            "exempt namespaces (requests pass untouched): {}",
            p.exempt_namespaces.join(", ")
        );
    }
    s
}
