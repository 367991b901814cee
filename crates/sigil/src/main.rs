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
use sigil::cluster::{CaSource, FailurePolicy};
use sigil::metrics::Metrics;
use sigil::server::{ServeConfig, Task, Tasks, serve};
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
    Serve(Box<ServeArgs>),
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
    /// Emergency switch: delete sigil's webhook configurations and keep every
    /// replica from registering them again, until `--end`.
    ///
    /// While it is on, images are NOT checked (the cluster runs fail-open).
    /// Afterwards, audit what was admitted: see docs/operations.md.
    BreakGlass(BreakGlassArgs),
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
        /// Check only the schema: do not read the key, certificate and trusted-root files `verify` names.
        #[arg(long)]
        schema_only: bool,
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
    /// Create or update the MutatingWebhookConfiguration once Ready (never
    /// before), and keep it so; needs Kubernetes API access.
    #[arg(long, env = "SIGIL_REGISTER")]
    register: bool,
    /// Keep a CA and serving certificate in a Secret shared by all replicas,
    /// write the CA bundle into the webhook configuration, rotate with overlap.
    #[arg(long, env = "SIGIL_SELF_MANAGED_CERTS")]
    self_managed_certs: bool,
    /// CA bundle to register with --tls-cert (cert-manager's ca.crt); re-read on every reconcile.
    #[arg(long, requires = "tls_cert", env = "SIGIL_CA_BUNDLE")]
    ca_bundle: Option<PathBuf>,
    #[command(flatten)]
    cluster: ClusterArgs,
    /// failurePolicy of the registered webhook: Fail (closed) or Ignore (open).
    #[arg(long, value_enum, default_value_t = FailurePolicy::Fail, env = "SIGIL_FAILURE_POLICY")]
    failure_policy: FailurePolicy,
    /// timeoutSeconds of the registered webhook.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(i32).range(1..=30), env = "SIGIL_WEBHOOK_TIMEOUT")]
    webhook_timeout: i32,
    /// Service in front of the replicas (named in the webhook configuration and the certificate).
    #[arg(long, default_value = "sigil", env = "SIGIL_SERVICE_NAME")]
    service_name: String,
    /// Port of that Service.
    #[arg(long, default_value_t = 443, env = "SIGIL_SERVICE_PORT")]
    service_port: i32,
    /// Register this URL (clientConfig.url) instead of the Service: sigil outside the cluster.
    #[arg(long, env = "SIGIL_WEBHOOK_URL")]
    webhook_url: Option<String>,
    /// Secret holding the self-managed CA and certificate.
    #[arg(long, default_value = "sigil-tls", env = "SIGIL_CERT_SECRET")]
    cert_secret: String,
    /// Lifetime of a self-managed CA (renewed with a third left).
    #[arg(long, default_value = "365d", value_parser = humantime::parse_duration, env = "SIGIL_CA_VALIDITY")]
    ca_validity: Duration,
    /// Lifetime of a self-managed serving certificate (renewed with a third left).
    #[arg(long, default_value = "90d", value_parser = humantime::parse_duration, env = "SIGIL_CERT_VALIDITY")]
    cert_validity: Duration,
    /// Extra DNS name or IP for the self-managed certificate (repeatable).
    #[arg(long = "extra-san", env = "SIGIL_EXTRA_SANS", value_delimiter = ',')]
    extra_sans: Vec<String>,
    /// How often each replica re-checks its registration, the break-glass
    /// marker and the certificate Secret.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration, env = "SIGIL_RECONCILE_INTERVAL")]
    reconcile_interval: Duration,
}

/// Where sigil's cluster objects are; shared by `serve` and `break-glass`.
#[derive(clap::Args, Debug, Clone)]
struct ClusterArgs {
    /// sigil's namespace (default: the pod's service-account namespace, else sigil-system).
    #[arg(long, env = "POD_NAMESPACE")]
    namespace: Option<String>,
    /// Name of the MutatingWebhookConfiguration.
    #[arg(long, default_value = "sigil", env = "SIGIL_WEBHOOK_NAME")]
    webhook_name: String,
    /// ConfigMap in sigil's namespace that carries the break-glass marker.
    #[arg(long, default_value = "sigil-state", env = "SIGIL_STATE_CONFIGMAP")]
    state_configmap: String,
}

#[derive(clap::Args, Debug)]
struct BreakGlassArgs {
    #[command(flatten)]
    cluster: ClusterArgs,
    /// End the emergency: clear the marker; replicas re-register within one reconcile interval.
    #[arg(long)]
    end: bool,
    /// Why (recorded in the marker, for the audit afterwards).
    #[arg(long, conflicts_with = "end")]
    reason: Option<String>,
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
        Command::Serve(args) => run_serve(*args),
        Command::Pin(args) => pin_cmd::run_pin(args),
        Command::Krm(args) => pin_cmd::run_krm(args),
        Command::BreakGlass(args) => run_break_glass(args),
        Command::Policy {
            command: PolicyCommand::Check { file, schema_only },
        } => policy_check(&file, schema_only),
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
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting runtime")?;
    // Checked here, not by clap: `SIGIL_SELF_MANAGED_CERTS=false` from an
    // overlay must not count as the flag being given.
    if args.self_managed_certs && (args.tls_cert.is_some() || args.ca_bundle.is_some()) {
        bail!(
            "--self-managed-certs cannot be combined with --tls-cert/--ca-bundle: choose one source of certificates"
        );
    }
    let namespace = sigil::cluster::own_namespace(args.cluster.namespace.clone());
    // The API server is contacted only when a flag asks for it.
    let client = if args.register || args.self_managed_certs {
        let flag = if args.register {
            "--register"
        } else {
            "--self-managed-certs"
        };
        Some(rt.block_on(sigil::cluster::connect(flag))?)
    } else {
        None
    };
    let cert_settings = sigil::certs::CertSettings {
        secret: args.cert_secret.clone(),
        ca_validity: args.ca_validity,
        cert_validity: args.cert_validity,
        names: sigil::certs::service_names(&args.service_name, &namespace, &args.extra_sans),
        interval: args.reconcile_interval,
        settle: args.reconcile_interval * 2,
    };
    let (cert, ca_source) = match (&args.tls_cert, &args.tls_key, &client) {
        (Some(c), Some(k), _) => {
            if args.register && args.ca_bundle.is_none() {
                bail!(
                    "--register with --tls-cert needs --ca-bundle (the CA the API server must trust, e.g. cert-manager's ca.crt)"
                );
            }
            (
                sigil::tls::load_files(c, k)?,
                args.ca_bundle.clone().map(CaSource::File),
            )
        }
        (_, _, Some(client)) if args.self_managed_certs => {
            let m = rt.block_on(initial_certs(
                client,
                &namespace,
                &args.cluster.webhook_name,
                &cert_settings,
            ))?;
            (
                m.serving_cert()?,
                Some(CaSource::Secret(args.cert_secret.clone())),
            )
        }
        _ => {
            let names = sigil::tls::default_names();
            let cert = sigil::tls::self_signed(&names)?;
            let out = args.ca_bundle_out.clone().unwrap_or_else(|| {
                std::env::temp_dir().join(format!("sigil-ca-{}.pem", std::process::id()))
            });
            let pem = cert.ca_pem.clone().unwrap_or_default();
            sigil::files::write_atomic(&out, pem.as_bytes(), sigil::files::Durability::RenameOnly)?;
            tracing::info!(ca_bundle = %out.display(), names = ?names, "no --tls-cert given: minted a CA and serving certificate in memory; clients must trust the CA bundle");
            if args.register {
                tracing::warn!(
                    "--register with a CA minted in memory: fine for one replica; with more, each would register its own CA (use --self-managed-certs)"
                );
            }
            (cert, Some(CaSource::Fixed(pem.into_bytes())))
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
    let engine =
        sigil::reload::engine_for(policy, None, &metrics).context("putting the policy in force")?;
    let webhook = Arc::new(Webhook::new(engine, metrics.clone()));
    let tasks = cluster_tasks(&args, namespace, client, ca_source, cert_settings, &metrics);
    rt.block_on(serve(
        ServeConfig {
            listen: args.listen,
            admin_listen: args.admin_listen,
            cert,
            cert_files: args.tls_cert.clone().zip(args.tls_key.clone()),
            policy_file: args.policy.clone().zip(policy_bytes),
            shutdown_delay: args.shutdown_delay,
            tasks,
        },
        webhook,
        metrics,
    ))?;
    Ok(ExitCode::SUCCESS)
}

impl ClusterArgs {
    fn settings(&self, namespace: String) -> sigil::cluster::Settings {
        sigil::cluster::Settings {
            namespace,
            config_name: self.webhook_name.clone(),
            service: "sigil".into(),
            service_port: 443,
            url: None,
            failure_policy: FailurePolicy::Fail,
            timeout_seconds: 10,
            state_configmap: self.state_configmap.clone(),
            interval: Duration::from_secs(30),
        }
    }
}

/// The Secret's certificate before serving starts: retried for a minute
/// (the API server may be coming up with the cluster), then a clear error.
async fn initial_certs(
    client: &kube::Client,
    namespace: &str,
    config: &str,
    cfg: &sigil::certs::CertSettings,
) -> Result<sigil::certs::Material> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let mut pause = Duration::from_millis(200);
    loop {
        match sigil::certs::reconcile(client, namespace, config, cfg).await {
            Ok(m) => return Ok(m),
            Err(e) if tokio::time::Instant::now() + pause < deadline => {
                tracing::warn!(error = %format!("{e:#}"), "self-managed certificates: cannot read or create the Secret yet; retrying");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(5));
            }
            Err(e) => return Err(e.context("--self-managed-certs: no certificate after 60 s")),
        }
    }
}

/// Registration and certificate rotation, started beside the server.
fn cluster_tasks(
    args: &ServeArgs,
    namespace: String,
    client: Option<kube::Client>,
    ca_source: Option<CaSource>,
    cert_settings: sigil::certs::CertSettings,
    metrics: &Arc<Metrics>,
) -> Tasks {
    let mut tasks: Vec<Task> = Vec::new();
    let Some(client) = client else {
        return Tasks(tasks);
    };
    let settings = sigil::cluster::Settings {
        service: args.service_name.clone(),
        service_port: args.service_port,
        url: args.webhook_url.clone(),
        failure_policy: args.failure_policy,
        timeout_seconds: args.webhook_timeout,
        interval: args.reconcile_interval,
        ..args.cluster.settings(namespace.clone())
    };
    if args.self_managed_certs {
        let (client, metrics, config) = (
            client.clone(),
            metrics.clone(),
            settings.config_name.clone(),
        );
        let namespace = namespace.clone();
        tasks.push(Box::new(move |_ready, store| {
            Box::pin(sigil::certs::run(
                client,
                namespace,
                config,
                cert_settings,
                store,
                metrics,
            ))
        }));
    }
    let scope = if args.register {
        Some(sigil::cluster::Scope::Register)
    } else if args.self_managed_certs {
        Some(sigil::cluster::Scope::CaBundleOnly)
    } else {
        None
    };
    if let (Some(scope), Some(source)) = (scope, ca_source) {
        let metrics = metrics.clone();
        tasks.push(Box::new(move |ready, _store| {
            Box::pin(sigil::cluster::run(
                client,
                settings,
                source,
                scope,
                ready.wait(),
                metrics,
            ))
        }));
    }
    Tasks(tasks)
}

fn run_break_glass(args: BreakGlassArgs) -> Result<ExitCode> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting runtime")?;
    let namespace = sigil::cluster::own_namespace(args.cluster.namespace.clone());
    let settings = args.cluster.settings(namespace.clone());
    let now = humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string();
    rt.block_on(async {
        let client = sigil::cluster::connect("sigil break-glass").await?;
        let cm = format!("{namespace}/{}", settings.state_configmap);
        if args.end {
            let previous = sigil::cluster::set_break_glass(&client, &settings, None, &now).await?;
            match previous {
                Some(p) => println!(
                    "break-glass ended ({p}; ended={now}).\n\
                     Running sigil replicas re-register the webhook within one reconcile interval (default 30s).\n\
                     Now audit what was admitted while images were not checked, e.g.:\n  \
                     kubectl get pods -A -o yaml | sigil pin --check --policy <your policy> -"
                ),
                None => println!("no break-glass was active (ConfigMap {cm}); nothing changed."),
            }
            return Ok(ExitCode::SUCCESS);
        }
        let reason = args.reason.unwrap_or_else(|| "unspecified".into());
        let user = std::env::var("USER").unwrap_or_else(|_| "unknown".into());
        let marker = format!("since={now}; by={user}; reason={reason}");
        // The marker first, so no replica re-registers between the delete and it.
        let previous =
            sigil::cluster::set_break_glass(&client, &settings, Some(marker.clone()), &now).await?;
        if let Some(p) = previous {
            println!("note: break-glass was already active ({p}); replaced.");
        }
        // Delete, then make sure it stays deleted: a replica that read "no
        // marker" just before we set it may still write once.
        let mut deleted = Vec::new();
        for round in 0..5 {
            let d = sigil::cluster::delete_configurations(&client, &settings).await?;
            deleted.extend(d.iter().cloned());
            if round > 0 && d.is_empty() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(400)).await;
        }
        deleted.sort();
        deleted.dedup();
        println!(
            "break-glass ON ({marker}).\n\
             Deleted MutatingWebhookConfiguration(s): {}.\n\
             The API server no longer calls sigil: images are admitted UNCHECKED (fail-open) until\n  \
             sigil break-glass --end\n\
             Marker: annotation {} on ConfigMap {cm}.",
            if deleted.is_empty() { "none found".to_owned() } else { deleted.join(", ") },
            sigil::cluster::BREAK_GLASS_ANNOTATION,
        );
        Ok(ExitCode::SUCCESS)
    })
}

fn policy_check(file: &PathBuf, schema_only: bool) -> Result<ExitCode> {
    let text =
        std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
    let p = match Policy::from_yaml(&text) {
        Ok(p) => p,
        Err(e) => bail!("{}: {e}", file.display()),
    };
    if !schema_only && let Err(e) = sigil_verify::Material::load(&p) {
        bail!(
            "{}: {e} (sigil serve would refuse this policy; --schema-only checks without reading these files)",
            file.display()
        );
    }
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
        if let Some(v) = &r.verification {
            let names: Vec<&str> = v.verifiers.iter().map(|x| x.name.as_str()).collect();
            let _ = writeln!(
                s,
                "    and their pinned digest must be signed: at least {} of {}{}; signatures are read from {}",
                v.threshold,
                names.join(", "),
                if v.required.is_empty() {
                    String::new()
                } else {
                    format!(", including {}", v.required.join(", "))
                },
                v.signatures_repository
                    .as_deref()
                    .unwrap_or("the repository the image is pulled from")
            );
        }
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
