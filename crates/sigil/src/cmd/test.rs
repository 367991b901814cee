//! `sigil test [DIR…]`: runs every `sigil-test.yaml` found, as `kyverno
//! test` does — its policies over its resources, with an offline registry of
//! OCI layouts — and checks the expected results. Exit 0 when all hold, 1
//! when one does not, 2 on bad input (a malformed suite, policy or manifest,
//! an expectation naming nothing).

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use sigil::engine::{Engine, Sources, engine_over};
use sigil::metrics::Metrics;
use sigil::pin::{ImageReport, PinOptions, pin_text};
use sigil::suite::{self, Check, Suite};
use sigil_core::{DigestResolver, Policy};
use sigil_registry::layout::Layouts;

use super::{EXIT_ERROR, EXIT_FINDINGS};

/// `sigil test`.
#[derive(clap::Args, Debug)]
pub struct TestArgs {
    /// Directories searched for `sigil-test.yaml` (recursively), or suite files.
    #[arg(default_value = ".")]
    pub paths: Vec<PathBuf>,
    /// `table` (default), `json` or `junit`.
    #[arg(short, long, default_value = "table", value_parser = ["table", "json", "junit"])]
    pub output: String,
}

/// Every `sigil-test.yaml` under `paths`, sorted (hidden directories and
/// `target/` skipped).
fn find(paths: &[PathBuf]) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    for p in paths {
        let meta = std::fs::metadata(p).with_context(|| format!("reading {}", p.display()))?;
        if meta.is_file() {
            out.push(p.clone());
            continue;
        }
        let mut stack = vec![p.clone()];
        while let Some(dir) = stack.pop() {
            let entries =
                std::fs::read_dir(&dir).with_context(|| format!("reading {}", dir.display()))?;
            for e in entries {
                let e = e.with_context(|| format!("reading {}", dir.display()))?;
                let path = e.path();
                let name = e.file_name().to_string_lossy().into_owned();
                let ty = e.file_type()?;
                if ty.is_dir() && !name.starts_with('.') && name != "target" {
                    stack.push(path);
                } else if ty.is_file() && name == suite::FILE_NAME {
                    out.push(path);
                }
            }
        }
    }
    out.sort();
    out.dedup();
    if out.is_empty() {
        bail!(
            "no {} under {}",
            suite::FILE_NAME,
            paths
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    Ok(out)
}

fn read(base: &Path, rel: &str) -> Result<String> {
    let p = base.join(rel);
    std::fs::read_to_string(&p).with_context(|| format!("reading {}", p.display()))
}

/// Runs `pin_text` over every resource file; the reports of every image.
async fn decide_all<R: DigestResolver>(
    engine: &Engine<R>,
    texts: &[(String, String)],
    opts: &PinOptions,
) -> Result<Vec<ImageReport>> {
    let mut out = Vec::new();
    for (name, text) in texts {
        let pinned = pin_text(engine, text, opts)
            .await
            .with_context(|| format!("resource file {name}"))?;
        out.extend(pinned.decided.images);
    }
    Ok(out)
}

/// One suite: its checks, or why it cannot run.
fn run_suite(file: &Path, rt: &tokio::runtime::Runtime) -> Result<Vec<Check>> {
    let text = sigil_registry::file::read_text(file, sigil_registry::file::MAX_CONFIG_BYTES)
        .with_context(|| format!("reading {}", file.display()))?;
    let s: Suite = serde_saphyr::from_str(&text).with_context(|| format!("{}", file.display()))?;
    if s.api_version != sigil_core::policy::API_VERSION || s.kind != "Test" {
        bail!(
            "{}: expected apiVersion {} kind Test",
            file.display(),
            sigil_core::policy::API_VERSION
        );
    }
    let base = file.parent().unwrap_or(Path::new(".")).to_path_buf();
    let now =
        match &s.now {
            Some(t) => Some(sigil_core::exception::parse_instant(t).with_context(|| {
                format!("{}: now {t:?} is not an RFC 3339 time", file.display())
            })?),
            None => None,
        };
    let mut policy_text = String::new();
    for p in &s.policies {
        policy_text.push_str("---\n");
        policy_text.push_str(&read(&base, p)?);
        policy_text.push('\n');
    }
    let policy =
        Policy::from_documents_at(&policy_text, now.or(Some(sigil::engine::unix_now())))
            .with_context(|| format!("{}: policies {}", file.display(), s.policies.join(", ")))?;
    let texts = s
        .resources
        .iter()
        .map(|r| read(&base, r).map(|t| (r.clone(), t)))
        .collect::<Result<Vec<_>>>()?;
    let opts = PinOptions {
        offline: s.registry.is_none(),
        timeout: Duration::from_secs(10),
        namespace: s
            .namespace
            .clone()
            .unwrap_or_else(|| sigil::pin::DEFAULT_NAMESPACE.into()),
    };
    // Paths in the policy (keys, certificates) are relative to the suite.
    let previous = std::env::current_dir().context("reading the current directory")?;
    std::env::set_current_dir(&base).with_context(|| format!("entering {}", base.display()))?;
    // Without a registry the suite runs offline: nothing is read from it.
    let registry = Layouts::new(base.join(s.registry.as_deref().unwrap_or_default()));
    let engine = engine_over(
        Arc::new(policy),
        registry,
        &Sources::default(),
        &Arc::new(Metrics::default()),
    );
    std::env::set_current_dir(&previous).context("returning to the current directory")?;
    let mut engine =
        engine.with_context(|| format!("{}: putting the policy in force", file.display()))?;
    engine.now = now;
    let reports = rt.block_on(decide_all(&engine, &texts, &opts))?;
    suite::check(&s, &reports, &opts.namespace).with_context(|| format!("{}", file.display()))
}

/// Runs `sigil test`.
pub fn run(args: TestArgs) -> Result<ExitCode> {
    let files = find(&args.paths)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the runtime")?;
    let mut checks = Vec::new();
    let mut errors = Vec::new();
    for f in &files {
        match run_suite(f, &rt) {
            Ok(c) => checks.extend(c),
            Err(e) => errors.push(format!("{e:#}")),
        }
    }
    match args.output.as_str() {
        "json" => super::write_json_pretty(
            std::io::stdout().lock(),
            &serde_json::json!({
                "suites": files.len(), "checks": checks, "errors": errors,
            }),
        )?,
        "junit" => super::write_out(&suite::junit(&checks))?,
        _ => super::write_out(&suite::table(&checks))?,
    }
    for e in &errors {
        eprintln!("error: {e}");
    }
    Ok(if !errors.is_empty() {
        ExitCode::from(EXIT_ERROR)
    } else if checks.iter().any(|c| !c.passed) {
        ExitCode::from(EXIT_FINDINGS)
    } else {
        ExitCode::SUCCESS
    })
}
