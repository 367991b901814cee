//! Trusted roots: the flags that keep the default Sigstore root current
//! from a TUF repository (shared by `sigil serve` and `sigil trust-root`),
//! the refresh task the server runs, and `sigil trust-root show`, which
//! prints what a root holds: transparency logs, certificate authorities,
//! timestamp authorities, CT logs, and their validity.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use sigil::reload::Live;
use sigil::server::Task;
use sigil_verify::roots::{BUILT_IN, DEFAULT, GITHUB, InForce, Origin, Refresher, TrustRoots};
use sigil_verify::trust::{Authority, Log, TrustedRoot};
use sigil_verify::tuf::{self, Client};

/// Where the default trusted root comes from.
#[derive(clap::Args, Debug, Clone)]
pub struct TufArgs {
    /// TUF repository the default (`public-good`) trusted root is kept
    /// current from: https:// or http:// (a mirror), or file:// (a
    /// directory, air-gapped).
    #[arg(long, default_value = tuf::PUBLIC_GOOD_MIRROR, env = "SIGIL_TUF_MIRROR")]
    tuf_mirror: String,
    /// That repository's root.json to start from (trusted on first use:
    /// ship it out of band). Default: the public-good repository's, embedded.
    #[arg(long, env = "SIGIL_TUF_ROOT")]
    tuf_root: Option<PathBuf>,
    /// TUF repository the `github` trusted root (GitHub's own Sigstore
    /// instance) is kept current from.
    #[arg(long, default_value = tuf::GITHUB_MIRROR, env = "SIGIL_GITHUB_TUF_MIRROR")]
    github_tuf_mirror: String,
    /// That repository's root.json to start from. Default: version 3, as
    /// GitHub's CLI embeds it.
    #[arg(long, env = "SIGIL_GITHUB_TUF_ROOT")]
    github_tuf_root: Option<PathBuf>,
    /// How often the built-in trusted roots are refreshed (± 10 %); 0s
    /// turns TUF off and the embedded roots stay in force.
    #[arg(long, default_value = "24h", value_parser = humantime::parse_duration, env = "SIGIL_TRUST_ROOT_REFRESH")]
    trust_root_refresh: Duration,
    /// Directory keeping the TUF metadata between refreshes (and restarts,
    /// if it survives them), so a rollback is refused. Default: a temporary one.
    #[arg(long, env = "SIGIL_TUF_CACHE_DIR")]
    tuf_cache_dir: Option<PathBuf>,
}

impl TufArgs {
    /// Whether a refresh is configured.
    pub fn enabled(&self) -> bool {
        !self.trust_root_refresh.is_zero()
    }

    /// How often TrustRoot objects' TUF sources are refreshed: the same
    /// interval (a day if the default root's refresh is off).
    pub fn object_interval(&self) -> Duration {
        if self.enabled() {
            self.trust_root_refresh
        } else {
            Duration::from_secs(24 * 3600)
        }
    }

    /// The TUF client these flags describe for the built-in root `name`
    /// (`public-good` or `github`); each keeps its metadata in its own
    /// directory under `--tuf-cache-dir`.
    fn client(&self, name: &str) -> Result<Client> {
        let (mirror, root_file, embedded, flag) = if name == GITHUB {
            (
                &self.github_tuf_mirror,
                &self.github_tuf_root,
                tuf::GITHUB_TUF_ROOT,
                "--github-tuf-mirror",
            )
        } else {
            (
                &self.tuf_mirror,
                &self.tuf_root,
                tuf::PUBLIC_GOOD_TUF_ROOT,
                "--tuf-mirror",
            )
        };
        let root = match root_file {
            Some(p) => std::fs::read(p).with_context(|| format!("reading {}", p.display()))?,
            None => embedded.to_vec(),
        };
        let cache = self.cache_dir(name);
        if let Some(d) = &cache {
            std::fs::create_dir_all(d).with_context(|| format!("creating {}", d.display()))?;
        }
        let http = sigil_registry::client::web_client().context("an HTTPS client")?;
        Client::new(mirror, root, http, cache).context(flag)
    }

    /// The root `name`'s last refresh as the TUF cache directory kept it
    /// (`sigil serve --tuf-cache-dir` keeps one), if there is one.
    fn kept(&self, name: &str) -> Result<Option<InForce>> {
        let Some(dir) = self.cache_dir(name) else {
            return Ok(None);
        };
        let Some((fetched, mirror, refreshed)) = tuf::last_refresh(&dir) else {
            return Ok(None);
        };
        let origin = Origin::Tuf {
            mirror,
            root_version: fetched.root_version,
            timestamp_version: fetched.timestamp_version,
            expires: fetched.expires,
        };
        let mut r = InForce::from_json(&fetched.json, origin)
            .with_context(|| format!("the trusted root kept in {}", dir.display()))?;
        r.refreshed = Some(refreshed);
        Ok(Some(r))
    }

    /// The directory root `name` keeps its TUF metadata in, if any.
    fn cache_dir(&self, name: &str) -> Option<PathBuf> {
        // The public-good root keeps the directory itself (as before).
        self.tuf_cache_dir.as_ref().map(|d| {
            if name == GITHUB {
                d.join(GITHUB)
            } else {
                d.clone()
            }
        })
    }

    /// The server's refresh task: refreshes the default root now and on the
    /// interval, and rebuilds the verifiers when a new root is in force.
    /// Never on the admission path; a failure keeps the last good root.
    pub fn task(&self, trust: Arc<TrustRoots>, live: Arc<Live>) -> Result<Option<Task>> {
        if !self.enabled() {
            return Ok(None);
        }
        let public_good = Refresher::new(DEFAULT, self.client(DEFAULT)?, trust.clone());
        // The github root's refresh never stops sigil from starting: when
        // its TUF client cannot be made (a bad --github-tuf-root), the
        // embedded root stays in force. It is refreshed only while a policy
        // in force names it: a root nobody asked for costs no request,
        // warning or alert.
        let since = trust
            .get(GITHUB)
            .map_or_else(String::new, |r| newest_authority(&r.root));
        let github = match self.client(GITHUB) {
            Ok(c) => Some(Refresher::new(GITHUB, c, trust.clone())),
            Err(e) => {
                tracing::warn!(trust_root = GITHUB, embedded_since = %since, error = %format!("{e:#}"), "the github trusted root cannot be refreshed; the one embedded in sigil stays in force");
                None
            }
        };
        if github.is_some() {
            tracing::info!(trust_root = GITHUB, embedded_since = %since, "the github trusted root embedded in sigil is in force until a refresh succeeds; it is refreshed while a policy in force names it");
        }
        let interval = self.trust_root_refresh;
        Ok(Some(Box::new(move |_ready, _store| {
            let observer = live.metrics.clone();
            let other = live.clone();
            Box::pin(async move {
                let wanted = other.clone();
                let github = async move {
                    if let Some(g) = github {
                        g.run_while(
                            move || names_root(&wanted.webhook.policy(), GITHUB),
                            interval,
                            observer.clone(),
                            move || other.rebuild("a new github trusted root"),
                        )
                        .await;
                    }
                };
                futures_util::future::join(
                    public_good.run(interval, live.metrics.clone(), move || {
                        live.rebuild("a new public-good trusted root")
                    }),
                    github,
                )
                .await;
            })
        })))
    }
}

/// Whether a verifier of `policy` names the trusted root `name`.
fn names_root(policy: &sigil_core::Policy, name: &str) -> bool {
    policy.verifications().into_iter().any(|(_, v)| {
        let attestors = v.attestations.iter().flat_map(|a| &a.attestors);
        v.verifiers
            .iter()
            .chain(attestors)
            .any(|s| s.cosign.as_ref().and_then(|c| c.trust_root.as_deref()) == Some(name))
    })
}

/// When the newest authority of `root` became valid (RFC 3339), to say how
/// current an embedded root is.
fn newest_authority(root: &TrustedRoot) -> String {
    root.authorities
        .iter()
        .chain(&root.timestamp_authorities)
        .filter_map(|a| a.valid_from)
        .max()
        .map_or_else(|| "unknown".into(), |t| when(Some(t)))
}

#[derive(clap::Subcommand, Debug)]
pub enum TrustRootCommand {
    /// Print what a trusted root holds: logs, CAs, TSAs, CT logs, validity.
    ///
    /// Without flags: the embedded public-good root. With --refresh: the
    /// root the TUF repository publishes now (verified as the server does).
    Show(ShowArgs),
}

#[derive(clap::Args, Debug)]
pub struct ShowArgs {
    /// The root's name: `public-good` or `github` (built in), or a TrustRoot object in
    /// the current kubeconfig's cluster, loaded from its spec as the server would.
    #[arg(default_value = DEFAULT)]
    name: String,
    /// A trusted_root.json file to show instead.
    #[arg(long, conflicts_with = "refresh")]
    trusted_root: Option<PathBuf>,
    /// Fetch and verify the current root from the TUF repository first.
    #[arg(long)]
    refresh: bool,
    #[command(flatten)]
    tuf: TufArgs,
    /// Print the trusted_root.json itself.
    #[arg(long)]
    json: bool,
}

pub fn run(command: TrustRootCommand) -> Result<ExitCode> {
    let TrustRootCommand::Show(args) = command;
    let built_in = BUILT_IN.iter().any(|(n, _)| *n == args.name);
    if !built_in && args.trusted_root.is_none() {
        return super::runtime()?.block_on(show_object(&args));
    }
    let shown: Arc<InForce> = match (&args.trusted_root, args.refresh) {
        (Some(p), _) => {
            let text =
                std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?;
            Arc::new(
                InForce::from_json(&text, Origin::Inline)
                    .with_context(|| p.display().to_string())?,
            )
        }
        (None, true) => {
            let roots = Arc::new(TrustRoots::embedded());
            let r = Refresher::new(&args.name, args.tuf.client(&args.name)?, roots.clone());
            let (_, result) = super::runtime()?.block_on(r.refresh_once());
            let mirror = if args.name == GITHUB {
                &args.tuf.github_tuf_mirror
            } else {
                &args.tuf.tuf_mirror
            };
            result.with_context(|| format!("refreshing from {mirror}"))?;
            roots.get(&args.name).context("refreshed root")?
        }
        (None, false) => match args.tuf.kept(&args.name)? {
            Some(kept) => Arc::new(kept),
            None => TrustRoots::embedded().get(&args.name).context("embedded")?,
        },
    };
    if args.json {
        super::write_out(&format!("{}\n", shown.json))?;
    } else {
        super::write_out(&describe(&args.name, &shown))?;
    }
    Ok(ExitCode::SUCCESS)
}

/// `sigil trust-root show NAME`: the TrustRoot object of that name in the
/// current kubeconfig's cluster — what its status says is in force, and its
/// root loaded from its spec as the server loads it.
async fn show_object(args: &ShowArgs) -> Result<ExitCode> {
    let client = sigil_kube::cluster::connect("sigil trust-root show NAME").await?;
    let api: kube::Api<sigil_kube::crd::TrustRoot> = kube::Api::all(client);
    let object = api.get_opt(&args.name).await.with_context(|| {
        format!(
            "reading TrustRoot {} (needs get on trustroots.sigil.dev)",
            args.name
        )
    })?;
    let Some(object) = object else {
        bail!(
            "no TrustRoot named {:?} in the cluster (`kubectl get trustroots` lists them; {DEFAULT:?} and {GITHUB:?} are built in)",
            args.name
        );
    };
    let http = sigil_registry::client::web_client().context("an HTTPS client")?;
    let root = sigil::trust::load_once(&args.name, &object.spec, http)
        .await
        .map_err(|e| anyhow::anyhow!("TrustRoot {}: {e}", args.name))?;
    if args.json {
        super::write_out(&format!("{}\n", root.json))?;
        return Ok(ExitCode::SUCCESS);
    }
    if let Some(st) = &object.status {
        let ready = st.conditions.iter().find(|c| c.type_ == "Ready");
        super::write_out(&format!(
            "status (written by sigil): Ready {}{}; source {}; root v{}; expires {}; last refresh {}{}\n",
            ready.map_or("Unknown", |c| c.status.as_str()),
            ready
                .map(|c| format!(" ({})", c.reason))
                .unwrap_or_default(),
            st.source.as_deref().unwrap_or("-"),
            st.root_version
                .map_or_else(|| "-".into(), |v| v.to_string()),
            st.expires.as_deref().unwrap_or("-"),
            st.last_refresh.as_deref().unwrap_or("-"),
            st.error
                .as_deref()
                .map(|e| format!("; last error: {e}"))
                .unwrap_or_default(),
        ))?;
    }
    super::write_out(&describe(&args.name, &root))?;
    Ok(ExitCode::SUCCESS)
}

fn when(t: Option<i64>) -> String {
    t.and_then(|t| time::OffsetDateTime::from_unix_timestamp(t).ok())
        .and_then(|t| {
            t.format(&time::format_description::well_known::Rfc3339)
                .ok()
        })
        .unwrap_or_else(|| "-".into())
}

fn log_line(l: &Log) -> String {
    format!(
        "  {:<40} id {}…  valid {} .. {}\n",
        l.url.as_deref().unwrap_or("(no baseUrl)"),
        l.id.get(..16).unwrap_or(&l.id),
        when(l.valid_from),
        when(l.valid_until),
    )
}

fn authority_line(a: &Authority) -> String {
    let subject = x509_parser::parse_x509_certificate(&a.root)
        .map(|(_, c)| c.subject().to_string())
        .unwrap_or_else(|_| "(unparsable certificate)".into());
    format!(
        "  {:<40} {}\n    root {subject}  chain {}  valid {} .. {}\n",
        a.name.as_deref().unwrap_or("(no name)"),
        a.uri.as_deref().unwrap_or("(no uri)"),
        a.intermediates.len() + 1 + usize::from(a.leaf.is_some()),
        when(a.valid_from),
        when(a.valid_until),
    )
}

/// The human-readable form `show` prints.
pub fn describe(name: &str, r: &InForce) -> String {
    let mut s = format!("trusted root {name}\n");
    match &r.origin {
        Origin::Embedded => s.push_str(&format!(
            "  source: embedded in sigil (newest authority valid from {}); not refreshed here: --refresh fetches the current one, --tuf-cache-dir reads what sigil serve kept\n",
            newest_authority(&r.root)
        )),
        Origin::Inline => s.push_str("  source: a trusted_root.json given as is (file or sigstoreKeys)\n"),
        Origin::Tuf {
            mirror,
            root_version,
            timestamp_version,
            expires,
        } => s.push_str(&format!(
            "  source: TUF {mirror} (root v{root_version}, timestamp v{timestamp_version}, metadata expires {})\n",
            when(Some(*expires))
        )),
    }
    if let Some(t) = r.refreshed {
        s.push_str(&format!("  last refreshed: {}\n", when(Some(t))));
    }
    let root: &TrustedRoot = &r.root;
    let sections: [(&str, Vec<String>); 4] = [
        (
            "transparency logs",
            root.logs.iter().map(log_line).collect(),
        ),
        (
            "certificate authorities",
            root.authorities.iter().map(authority_line).collect(),
        ),
        (
            "timestamp authorities",
            root.timestamp_authorities
                .iter()
                .map(authority_line)
                .collect(),
        ),
        ("CT logs", root.ctlogs.iter().map(log_line).collect()),
    ];
    for (title, lines) in sections {
        s.push_str(&format!("{title} ({}):\n", lines.len()));
        for l in lines {
            s.push_str(&l);
        }
    }
    s
}
