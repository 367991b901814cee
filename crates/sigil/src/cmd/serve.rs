//! `sigil serve`: the mutating admission webhook.
//!
//! Reads as linkerd2-proxy's main does: [`ServeArgs::validate`] (flags,
//! before anything starts), [`configure`] (policy, certificates, engine,
//! cluster tasks — nothing bound yet), then `server::bind` → `spawn` →
//! signal → `drain`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::ValueEnum;
use sigil::admission::Webhook;
use sigil::metrics::Metrics;
use sigil::reload::Live;
use sigil::server::{ServeConfig, Signals};
use sigil_core::Policy;
use sigil_kube::cluster::{self, CaSource, FailurePolicy, lease};
use sigil_kube::{certs, policies};

use super::ClusterArgs;

mod tasks;
use tasks::{audit_task, cluster_tasks, listed_within};

#[derive(clap::Args, Debug)]
pub struct ServeArgs {
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
    /// Keep the in-API-server backstop (what `sigil backstop` prints)
    /// registered beside the webhook and equal to the policy in force,
    /// owned like the webhook configuration; needs Kubernetes API access.
    #[arg(long, env = "SIGIL_REGISTER_BACKSTOP")]
    register_backstop: bool,
    /// Keep a CA and serving certificate in a Secret shared by all replicas,
    /// write the CA bundle into the webhook configuration, rotate with overlap.
    #[arg(long, env = "SIGIL_SELF_MANAGED_CERTS")]
    self_managed_certs: bool,
    /// CA bundle to register with --tls-cert (cert-manager's ca.crt); re-read on every reconcile.
    #[arg(long, requires = "tls_cert", env = "SIGIL_CA_BUNDLE")]
    ca_bundle: Option<PathBuf>,
    #[command(flatten)]
    cluster: ClusterArgs,
    #[command(flatten)]
    creds: super::CredentialArgs,
    /// Pull with the credentials the workloads themselves have: their
    /// imagePullSecrets, else their ServiceAccount's, kept in memory by
    /// watches on Secrets and ServiceAccounts (needs list/watch on both).
    #[arg(long, env = "SIGIL_PULL_SECRETS")]
    pull_secrets: bool,
    /// Watch pull secrets only in these namespaces (comma-separated); default cluster-wide.
    #[arg(
        long,
        env = "SIGIL_PULL_SECRETS_NAMESPACES",
        value_delimiter = ',',
        requires = "pull_secrets"
    )]
    pull_secrets_namespaces: Vec<String>,
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
    #[command(flatten)]
    audit: super::audit::ServeAuditArgs,
    #[command(flatten)]
    tuf: super::trust_root::TufArgs,
    /// Also put ClusterImagePolicy and ImagePolicy objects in force (kept by
    /// watches), combined with --policy; one replica writes their status.
    #[arg(long, env = "SIGIL_WATCH_POLICIES")]
    watch_policies: bool,
    /// Concurrent webhook connections at most (lowered to leave descriptors
    /// free under the open-files limit); more wait in the kernel's queue.
    #[arg(long, default_value_t = 1024, value_parser = clap::value_parser!(u32).range(1..), env = "SIGIL_MAX_CONNECTIONS")]
    max_connections: u32,
    /// Memory all request bodies may hold at once (bytes, or with Ki/Mi/Gi).
    #[arg(long, default_value = "64Mi", value_parser = parse_bytes, env = "SIGIL_BODY_MEMORY")]
    body_memory: usize,
    /// A connection must send its first request (TLS handshake included) within this.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration, env = "SIGIL_FIRST_REQUEST_TIMEOUT")]
    first_request_timeout: Duration,
    /// Require the API server to authenticate with a client certificate
    /// issued by this CA (PEM), as Kubernetes documents for webhooks
    /// (AdmissionConfiguration + kubeconfig: docs/operations.md, "Hardening").
    #[arg(long, env = "SIGIL_CLIENT_CA_FILE")]
    client_ca_file: Option<PathBuf>,
    /// Distinct registry lookups one object may need; an object needing more
    /// is denied naming the limit, with no lookup made.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=10_000), env = "SIGIL_MAX_LOOKUPS_PER_OBJECT")]
    max_lookups_per_object: u32,
    /// A connection with no request in flight for this long is closed (HTTP/2 with GOAWAY).
    #[arg(long, default_value = "120s", value_parser = humantime::parse_duration, env = "SIGIL_IDLE_TIMEOUT")]
    idle_timeout: Duration,
}

/// `64Mi`, `512Ki`, `1Gi` or a plain number of bytes (Kubernetes' binary suffixes).
fn parse_bytes(s: &str) -> std::result::Result<usize, String> {
    let (num, mult) = match s {
        _ if s.ends_with("Gi") => (&s[..s.len() - 2], 1usize << 30),
        _ if s.ends_with("Mi") => (&s[..s.len() - 2], 1 << 20),
        _ if s.ends_with("Ki") => (&s[..s.len() - 2], 1 << 10),
        _ => (s, 1),
    };
    num.trim()
        .parse::<usize>()
        .ok()
        .and_then(|n| n.checked_mul(mult))
        .filter(|n| *n >= 1 << 20)
        .ok_or_else(|| format!("{s:?} is not a size of at least 1Mi (bytes, or with Ki/Mi/Gi)"))
}

#[derive(Copy, Clone, Debug, ValueEnum)]
enum LogFormat {
    Json,
    Text,
}

impl ServeArgs {
    /// Flag combinations clap cannot express, checked before anything starts.
    /// (Checked here, not by clap: `SIGIL_SELF_MANAGED_CERTS=false` from an
    /// overlay must not count as the flag being given.)
    pub fn validate(&self) -> Result<()> {
        if self.self_managed_certs && (self.tls_cert.is_some() || self.ca_bundle.is_some()) {
            bail!(
                "--self-managed-certs cannot be combined with --tls-cert/--ca-bundle: choose one source of certificates"
            );
        }
        if self.register && self.tls_cert.is_some() && self.ca_bundle.is_none() {
            bail!(
                "--register with --tls-cert needs --ca-bundle (the CA the API server must trust, e.g. cert-manager's ca.crt)"
            );
        }
        self.audit.validate()
    }
}

/// Logs go to stderr through a batching background writer
/// ([`sigil::logwriter`]), so the one decision line per admission costs
/// formatting and a `memcpy`, not a write(2) or a thread wake-up on the
/// request path. Lossless; the returned guard flushes it at exit.
/// With JSON logs, the decision line is formatted by hand into the same
/// writer ([`sigil::decisionlog`]).
fn init_logging(
    format: LogFormat,
) -> (
    sigil::logwriter::FlushGuard,
    Option<sigil::decisionlog::DecisionLog>,
) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("SIGIL_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let (writer, guard) = sigil::logwriter::BatchWriter::new(std::io::stderr());
    let decisions = sigil::decisionlog::DecisionLog::new(&writer);
    let b = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(writer);
    match format {
        LogFormat::Json => {
            b.json().flatten_event(true).with_current_span(false).init();
            (guard, Some(decisions))
        }
        LogFormat::Text => {
            b.init();
            (guard, None)
        }
    }
}

/// Runs `sigil serve` until a signal and the drain complete.
pub fn run(args: ServeArgs) -> Result<ExitCode> {
    args.validate()?;
    let (_log_guard, decisions) = init_logging(args.log_format);
    let (policy, policy_bytes) = super::load_policy_bytes(args.policy.as_deref())?;
    let file_policy = args.policy.is_some().then(|| policy.clone());
    super::runtime()?.block_on(async {
        let (config, live, leaders) =
            configure(&args, policy, policy_bytes, file_policy, decisions).await?;
        let bound = sigil::server::bind(config).await?;
        let mut signals = Signals::install()?;
        let running = bound.spawn(live);
        signals.recv().await;
        // Hand the audit and the policy status over first: another replica
        // takes their Leases at its next try while this one drains.
        futures_util::future::join_all(leaders.into_iter().map(|l| l.shutdown())).await;
        running.drain(&mut signals).await;
        Ok(ExitCode::SUCCESS)
    })
}

/// Everything the server needs, loaded and checked; nothing bound yet.
async fn configure(
    args: &ServeArgs,
    policy: Policy,
    policy_bytes: Option<Vec<u8>>,
    file_policy: Option<Policy>,
    decisions: Option<sigil::decisionlog::DecisionLog>,
) -> Result<(ServeConfig, Arc<Live>, Vec<lease::Shutdown>)> {
    let namespace = cluster::own_namespace(args.cluster.namespace.clone());
    // The API server is contacted only when a flag asks for it.
    let flag = if args.register {
        Some("--register")
    } else if args.register_backstop {
        Some("--register-backstop")
    } else if args.self_managed_certs {
        Some("--self-managed-certs")
    } else if args.pull_secrets {
        Some("--pull-secrets")
    } else if args.audit.enabled() {
        Some("--audit-interval")
    } else if args.watch_policies {
        Some("--watch-policies")
    } else {
        None
    };
    let client = match flag {
        Some(flag) => Some(cluster::connect(flag).await?),
        None => None,
    };
    let cert_settings = certs::CertSettings {
        secret: args.cert_secret.clone(),
        ca_validity: args.ca_validity,
        cert_validity: args.cert_validity,
        names: certs::service_names(&args.service_name, &namespace, &args.extra_sans),
        interval: args.reconcile_interval,
        settle: args.reconcile_interval * 2,
    };
    let (cert, ca_source) = match (&args.tls_cert, &args.tls_key, &client) {
        (Some(c), Some(k), _) => (
            sigil::tls::load_files(c, k)?,
            args.ca_bundle.clone().map(CaSource::File),
        ),
        (_, _, Some(client)) if args.self_managed_certs => {
            let m = certs::initial(
                client,
                &namespace,
                &args.cluster.webhook_name,
                &cert_settings,
            )
            .await?;
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
    metrics.kube.set_webhook_info(args.failure_policy);
    let mut sources = args.creds.sources()?;
    sources.copy_on_admission = true;
    sources.max_lookups = args.max_lookups_per_object as usize;
    let trust = sources.trust.clone();
    sigil::trust::start_revocation(&trust, metrics.clone());
    let mut ready_gates = Vec::new();
    if let (true, Some(client)) = (args.pull_secrets, &client) {
        let (store, synced) = sigil_kube::pullsecrets::start(
            client.clone(),
            &args.pull_secrets_namespaces,
            metrics.kube.clone(),
        );
        sources.pull_secrets = Some(store);
        ready_gates.push((
            "waiting for the pull-secret watches to list Secrets and ServiceAccounts once"
                .to_owned(),
            synced,
        ));
    }
    if let (true, Some(client)) = (args.watch_policies, &client) {
        let (namespaces, listed) = policies::watch_namespaces(client.clone());
        sources.namespaces = Some(namespaces);
        ready_gates.push((
            "waiting for the namespace watch to list namespaces once".to_owned(),
            listed,
        ));
    }
    let mut key_refs = None;
    // keyRefs are read through watches that come with --watch-policies.
    if let (true, Some(client)) = (args.watch_policies, &client) {
        let k = sigil_kube::keyrefs::KeyRefs::new(client.clone(), namespace.clone());
        sources.keys = k.clone();
        key_refs = Some(k);
    }
    let engine = sigil::engine::engine_for(Arc::new(policy), None, &sources, &metrics)
        .context("putting the policy in force")?;
    let live = Arc::new(Live {
        webhook: Arc::new(match decisions {
            Some(log) => Webhook::new(engine, metrics.clone()).with_decision_log(log),
            None => Webhook::new(engine, metrics.clone()),
        }),
        sources,
        metrics: metrics.clone(),
    });
    // Leaders to stop (and whose Leases to release) on drain.
    let mut leaders = Vec::new();
    let mut latest = None;
    let mut tasks = cluster_tasks(
        args,
        namespace.clone(),
        client.clone(),
        ca_source,
        cert_settings,
        &metrics,
        &live,
    );
    if let Some(task) = args.tuf.task(trust.clone(), live.clone())? {
        tasks.0.push(task);
    }
    let mut trust_objects = None;
    if let (true, Some(client)) = (args.watch_policies, &client) {
        let loader = Arc::new(sigil::trust::TrustObjects::new(
            trust,
            live.clone(),
            sigil_registry::client::web_client().context("an HTTPS client for TUF")?,
            args.tuf.object_interval(),
        ));
        let (watch, loaded) = sigil_kube::trustroots::TrustRoots::start(client.clone(), loader);
        ready_gates.push((
            "waiting for the TrustRoot watch to list and load TrustRoots once".to_owned(),
            loaded,
        ));
        trust_objects = Some(watch);
    }
    let mut combiner = None;
    if let (true, Some(client)) = (args.watch_policies, &client) {
        let (c, listed) = policies::Combiner::start(
            client.clone(),
            live.clone(),
            metrics.kube.clone(),
            file_policy,
        );
        ready_gates.push((
            "waiting for the policy watches to list ClusterImagePolicies and ImagePolicies once"
                .to_owned(),
            listed.clone(),
        ));
        if let Some(k) = key_refs.take() {
            // The keyRefs the combined policy names are watched once it is
            // in force: readiness waits for both.
            tokio::spawn(
                live.clone()
                    .rebuild_on(k.changed(), "a keyRef object changed"),
            );
            ready_gates.push((
                "waiting for the keyRef watches to read their ConfigMaps and Secrets once"
                    .to_owned(),
                listed_within(listed, move || k.all_listed(), Duration::from_secs(20), {
                    // Ready with verifiers built from what was read, not
                    // from before the first read.
                    let live = live.clone();
                    move || live.rebuild("keyRef objects read")
                }),
            ));
        }
        let lease = lease::LeaseSettings {
            namespace: namespace.clone(),
            name: "sigil-policy-status".into(),
            identity: lease::identity(),
            duration: args.audit.audit_lease_duration,
        };
        let (client, c2) = (client.clone(), c.clone());
        let (handle, stopper) = lease::shutdown_pair();
        leaders.push(handle);
        tasks.0.push(Box::new(move |ready, _store| {
            Box::pin(async move {
                let instance = lease.identity.clone();
                let writer = |leading: tokio::sync::watch::Receiver<bool>| {
                    let trust =
                        trust_objects.map(|t| t.write_status(client.clone(), leading.clone()));
                    let policies = c2.write_status(client.clone(), instance, leading);
                    async move {
                        match trust {
                            Some(t) => {
                                futures_util::future::join(policies, t).await;
                            }
                            None => policies.await,
                        }
                    }
                };
                stopper
                    .lead(client.clone(), lease, ready.wait(), writer, || {})
                    .await;
            })
        }));
        combiner = Some(c);
    }
    if let (true, Some(client)) = (args.register_backstop, &client) {
        tasks.0.push(tasks::backstop_task(
            args,
            namespace.clone(),
            client.clone(),
            live.clone(),
            &metrics,
        ));
    }
    if let (true, Some(client)) = (args.audit.enabled(), client) {
        let (handle, task, l) = audit_task(args, namespace, client, &live);
        leaders.push(handle);
        latest = Some(l);
        tasks.0.push(task);
    }
    let config = ServeConfig {
        listen: args.listen,
        admin_listen: args.admin_listen,
        cert,
        cert_files: args.tls_cert.clone().zip(args.tls_key.clone()),
        policy_file: args.policy.clone().zip(policy_bytes),
        shutdown_delay: args.shutdown_delay,
        tasks,
        ready_gates,
        audit: latest,
        combiner,
        client_ca: args.client_ca_file.clone(),
        limits: sigil::server::Limits {
            max_connections: args.max_connections as usize,
            body_memory: args.body_memory,
            first_request: args.first_request_timeout,
            idle: args.idle_timeout,
        },
    };
    Ok((config, live, leaders))
}
