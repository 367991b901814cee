//! `sigil audit`: what runs in the cluster (current kubeconfig) that the
//! policy would not admit now, and the in-cluster audit's flags for `sigil
//! serve`. Listing and deciding is `sigil::audit`; this parses flags, sets up
//! the engine with the cluster's pull secrets, shows progress and renders.

use std::io::IsTerminal as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use anyhow::{Context as _, Result, bail};
use clap::ValueEnum;
use sigil::metrics::Metrics;
use sigil_kube::audit::{Options, Progress};

use super::{CredentialArgs, EXIT_ERROR, EXIT_FINDINGS, load_policy};

/// Report format.
#[derive(Copy, Clone, Debug, ValueEnum, PartialEq, Eq)]
pub enum Output {
    /// Per namespace: counts and one line per violation.
    Table,
    /// The AuditReport schema (docs/audit.md).
    Json,
    /// The same, as YAML.
    Yaml,
    /// wgpolicyk8s.io/v1alpha2 PolicyReports, one per namespace (YAML).
    Policyreport,
    /// openreports.io/v1alpha1 Reports, one per namespace (YAML).
    Openreports,
}

/// Flags of `sigil audit`.
#[derive(clap::Args, Debug)]
pub struct AuditArgs {
    /// ImagePolicy file; without it, the embedded default.
    #[arg(long, env = "SIGIL_POLICY")]
    policy: Option<PathBuf>,
    /// Namespace to audit (default: the kubeconfig context's).
    #[arg(short = 'n', long)]
    namespace: Option<String>,
    /// Audit every namespace.
    #[arg(short = 'A', long, conflicts_with = "namespace")]
    all_namespaces: bool,
    /// Label selector (as kubectl's -l).
    #[arg(short = 'l', long)]
    selector: Option<String>,
    /// Kinds to list (comma-separated; default: pods and every workload kind).
    #[arg(long, value_delimiter = ',')]
    kinds: Vec<String>,
    /// Only objects created or changed since: a duration back (2h) or an RFC 3339 time.
    #[arg(long, conflicts_with = "since_break_glass")]
    since: Option<String>,
    /// Only objects created or changed since the last (or current) break-glass began.
    #[arg(long)]
    since_break_glass: bool,
    /// Report format.
    #[arg(short = 'o', long, value_enum, default_value_t = Output::Table)]
    output: Output,
    /// Check signatures as the webhook would (the default).
    #[arg(long, overrides_with = "no_verify")]
    verify: bool,
    /// Skip signature checks (rules, mirrors and pinning only; fast).
    #[arg(long, overrides_with = "verify")]
    no_verify: bool,
    /// Objects decided at once.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..=1024))]
    concurrency: u32,
    /// Objects per list page.
    #[arg(long, default_value_t = sigil_kube::audit::DEFAULT_PAGE, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    page_size: u32,
    /// Time allowed for one object's registry lookups.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    timeout: Duration,
    /// Pull with each workload's imagePullSecrets and ServiceAccount, read
    /// from the cluster (as the webhook does); false: node-level credentials only.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, value_name = "BOOL")]
    pull_secrets: bool,
    #[command(flatten)]
    creds: CredentialArgs,
    /// sigil's namespace (where the break-glass marker is kept).
    #[arg(long, env = "SIGIL_NAMESPACE_OF_SIGIL", default_value = "sigil-system")]
    sigil_namespace: String,
    /// ConfigMap in sigil's namespace that carries the break-glass markers.
    #[arg(long, default_value = "sigil-state", env = "SIGIL_STATE_CONFIGMAP")]
    state_configmap: String,
}

/// How long `sigil audit` waits for the pull-secret lists before going on without them.
const PULL_SECRET_WAIT: Duration = Duration::from_secs(15);

/// Runs `sigil audit`: exit 0 compliant, 1 violations, 2 error.
pub fn run(args: AuditArgs) -> Result<ExitCode> {
    let mut policy = load_policy(args.policy.as_deref())?;
    let kinds = sigil_kube::audit::kinds::parse(&args.kinds, &policy.extractors)?;
    if args.no_verify {
        policy = policy.without_verification();
    }
    let now = SystemTime::now();
    let since = args
        .since
        .as_deref()
        .map(|s| sigil_kube::audit::parse_since(s, now))
        .transpose()?;
    let mut sources = args.creds.sources()?;
    super::single_thread_runtime()?.block_on(async {
        let client = sigil_kube::cluster::connect("sigil audit").await?;
        let namespace = match (&args.namespace, args.all_namespaces) {
            (_, true) => None,
            (Some(n), false) => Some(n.clone()),
            (None, false) => Some(client.default_namespace().to_owned()),
        };
        let since = if args.since_break_glass {
            let s = super::ClusterArgs {
                namespace: Some(args.sigil_namespace.clone()),
                webhook_name: "sigil".into(),
                state_configmap: args.state_configmap.clone(),
                node_namespace: None,
            }
            .settings(args.sigil_namespace.clone());
            Some(sigil_kube::audit::since_break_glass(&client, &s).await?)
        } else {
            since
        };
        let metrics = Arc::new(Metrics::default());
        if args.pull_secrets {
            let scope: Vec<String> = namespace.iter().cloned().collect();
            let (store, mut synced) =
                sigil_kube::pullsecrets::start(client.clone(), &scope, metrics.kube.clone());
            let waited =
                tokio::time::timeout(PULL_SECRET_WAIT, synced.wait_for(|s| *s)).await;
            if !matches!(waited, Ok(Ok(_))) {
                eprintln!(
                    "warning: could not list pull secrets and ServiceAccounts within {}s (see the log above); images are pulled with node-level credentials only (--pull-secrets=false silences this)",
                    PULL_SECRET_WAIT.as_secs()
                );
            } else {
                sources.pull_secrets = Some(store);
            }
        }
        if policy.has_namespace_selectors() {
            // Rules limited to some namespaces need their labels: list once.
            match sigil_kube::audit::KnownNamespaces::list(&client).await {
                Ok(known) => sources.namespaces = Some(Arc::new(known)),
                Err(e) => eprintln!(
                    "warning: {e}; rules with a namespaceSelector see only kubernetes.io/metadata.name"
                ),
            }
        }
        let engine = sigil::engine::engine_for(Arc::new(policy), None, &sources, &metrics)
            .context("putting the policy in force")?;
        let opts = Options {
            namespace,
            kinds,
            label_selector: args.selector.clone(),
            since,
            concurrency: args.concurrency as usize,
            page_size: args.page_size,
            timeout: args.timeout,
        };
        let bar = Bar::new();
        let report = sigil_kube::audit::run(
            &client,
            Arc::new(engine),
            &opts,
            || metrics.registry_requests_total(),
            &bar,
        )
        .await;
        bar.0.finish_and_clear();
        match args.output {
            Output::Table => super::write_out(&report.table())?,
            Output::Json => super::write_json_pretty(std::io::stdout().lock(), &report)?,
            Output::Yaml => super::write_out(
                &serde_saphyr::to_string(&report).context("rendering YAML")?,
            )?,
            Output::Policyreport | Output::Openreports => {
                use sigil_kube::audit::policyreport::{Api, reports};
                let api = if args.output == Output::Policyreport {
                    Api::Wgpolicyk8s
                } else {
                    Api::OpenReports
                };
                for r in reports(&report, api) {
                    super::write_out(&format!(
                        "---\n{}",
                        serde_saphyr::to_string(&r).context("rendering YAML")?
                    ))?;
                }
            }
        }
        Ok(if !report.errors.is_empty() {
            ExitCode::from(EXIT_ERROR)
        } else if report.has_violations() {
            ExitCode::from(EXIT_FINDINGS)
        } else {
            ExitCode::SUCCESS
        })
    })
}

/// The progress bar, drawn only on a terminal.
struct Bar(indicatif::ProgressBar);

impl Bar {
    fn new() -> Bar {
        if !std::io::stderr().is_terminal() {
            return Bar(indicatif::ProgressBar::hidden());
        }
        let bar = indicatif::ProgressBar::new_spinner();
        if let Ok(style) = indicatif::ProgressStyle::with_template(
            "{spinner} auditing {msg}: {pos} objects ({per_sec})",
        ) {
            bar.set_style(style);
        }
        bar.enable_steady_tick(Duration::from_millis(120));
        Bar(bar)
    }
}

impl Progress for Bar {
    fn advance(&self, n: u64) {
        self.0.inc(n);
    }
    fn listing(&self, kind: &str) {
        self.0.set_message(kind.to_owned());
    }
}

/// The in-cluster audit's flags (`sigil serve --audit-interval`).
#[derive(clap::Args, Debug, Clone)]
pub struct ServeAuditArgs {
    /// Audit every namespace this often (one replica at a time, by Lease),
    /// and whenever the policy changes; off when not given or 0.
    #[arg(long, value_parser = humantime::parse_duration, env = "SIGIL_AUDIT_INTERVAL")]
    pub audit_interval: Option<Duration>,
    /// Lease (in sigil's namespace) that elects the auditing replica.
    #[arg(long, default_value = "sigil-audit", env = "SIGIL_AUDIT_LEASE")]
    pub audit_lease: String,
    /// How long a silent leader keeps the Lease (a draining one releases it at once).
    #[arg(long, default_value = "15s", value_parser = humantime::parse_duration, env = "SIGIL_AUDIT_LEASE_DURATION")]
    pub audit_lease_duration: Duration,
    /// Most Events published per audit.
    #[arg(long, default_value_t = 100, env = "SIGIL_AUDIT_MAX_EVENTS")]
    pub audit_max_events: usize,
    /// A violation already reported on an object is reported again after this.
    #[arg(long, default_value = "1h", value_parser = humantime::parse_duration, env = "SIGIL_AUDIT_EVENT_REFRESH")]
    pub audit_event_refresh: Duration,
    /// Objects decided at once by the in-cluster audit.
    #[arg(long, default_value_t = 8, env = "SIGIL_AUDIT_CONCURRENCY")]
    pub audit_concurrency: usize,
    /// Policy reports the in-cluster audit writes, one per namespace:
    /// `auto` (whichever CRD is installed, wgpolicyk8s first), `wgpolicyk8s`,
    /// `openreports` or `off`.
    #[arg(long, value_enum, default_value_t = PolicyReports::Auto, env = "SIGIL_POLICY_REPORTS")]
    pub policy_reports: PolicyReports,
}

/// `--policy-reports`.
#[derive(Copy, Clone, Debug, ValueEnum, PartialEq, Eq)]
pub enum PolicyReports {
    /// The first installed of wgpolicyk8s.io and openreports.io.
    Auto,
    /// `wgpolicyk8s.io/v1alpha2` PolicyReport.
    Wgpolicyk8s,
    /// `openreports.io/v1alpha1` Report.
    Openreports,
    /// None.
    Off,
}

impl PolicyReports {
    /// The writer's mode.
    pub fn mode(self) -> sigil_kube::audit::reports::Mode {
        use sigil_kube::audit::policyreport::Api;
        use sigil_kube::audit::reports::Mode;
        match self {
            PolicyReports::Auto => Mode::Auto,
            PolicyReports::Wgpolicyk8s => Mode::Only(Api::Wgpolicyk8s),
            PolicyReports::Openreports => Mode::Only(Api::OpenReports),
            PolicyReports::Off => Mode::Off,
        }
    }
}

impl ServeAuditArgs {
    /// Whether the in-cluster audit is on.
    pub fn enabled(&self) -> bool {
        self.audit_interval.is_some_and(|d| !d.is_zero())
    }

    /// Flag combinations clap cannot express.
    pub fn validate(&self) -> Result<()> {
        if self.enabled() && self.audit_lease_duration < Duration::from_secs(1) {
            bail!("--audit-lease-duration must be at least 1s");
        }
        Ok(())
    }
}
