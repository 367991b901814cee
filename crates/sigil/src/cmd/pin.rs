//! `sigil pin`: files, stdin, stdout, exit codes.
//!
//! Owns what the user sees of client-side pinning: which files are read, what
//! goes to stdout and what to stderr, the progress bar, `--write` (atomic per
//! file, every directory checked first, links written through — see
//! `sigil::pin::files`), `--check`, and the exit codes documented in
//! `docs/pin.md`.
//! Deciding and editing live in `sigil::pin` (which calls the one
//! per-object decision in sigil-core).

use std::io::{IsTerminal as _, Write as _};
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use futures_util::StreamExt as _;
use sigil::pin::files::{Change, Walk, read_found, write_all};
use sigil::pin::report::Report;
use sigil::pin::{Pinned, pin_text};

use super::{
    EXIT_ERROR, EXIT_FINDINGS, engine_for, load_policy, read_stdin, runtime, write_json_pretty,
    write_out,
};

#[derive(clap::Args, Debug)]
pub struct PinArgs {
    /// Files or directories (recursing into *.yaml / *.yml); `-` or nothing reads stdin.
    paths: Vec<PathBuf>,
    /// ImagePolicy file; without it, the embedded default.
    #[arg(long, env = "SIGIL_POLICY")]
    policy: Option<PathBuf>,
    /// Edit the files in place (atomically; only image values change).
    #[arg(short = 'w', long, conflicts_with = "check")]
    write: bool,
    /// Change nothing; exit 1 if any image is not pinned, would be rewritten, or fails policy.
    #[arg(long)]
    check: bool,
    /// Report format.
    #[arg(long, value_enum, default_value_t = Output::Text)]
    output: Output,
    /// Resolve tags and read signatures from OCI image layouts under this
    /// directory (`DIR/registry.example.com/team/app/`) instead of
    /// registries: air-gapped pinning (see `sigil test`).
    #[arg(long, value_name = "DIR", conflicts_with = "offline")]
    oci_layout: Option<PathBuf>,
    #[command(flatten)]
    decide: super::DecideArgs,
}

/// Pins every input with `engine`, concurrently, with the progress bar.
fn pin_inputs<R: sigil_core::DigestResolver>(
    engine: &sigil::engine::Engine<R>,
    inputs: &[Input],
    opts: &sigil::pin::PinOptions,
) -> Result<Vec<Result<Pinned, sigil_core::manifest::ManifestError>>> {
    let bar = progress(inputs.len());
    let results = runtime()?.block_on(async {
        futures_util::stream::iter(inputs.iter())
            .map(|i| {
                let bar = &bar;
                async move {
                    let r = pin_text(engine, &i.text, opts).await;
                    bar.inc(1);
                    r
                }
            })
            .buffered(64)
            .collect()
            .await
    });
    bar.finish_and_clear();
    Ok(results)
}

#[derive(Copy, Clone, Debug, clap::ValueEnum)]
enum Output {
    Text,
    Json,
}

/// One input: a file or stdin.
struct Input {
    /// Shown in reports: the path as given, or `<stdin>`.
    name: String,
    path: Option<PathBuf>,
    text: String,
}

fn read_inputs(paths: &[PathBuf]) -> Result<Vec<Input>> {
    if paths.is_empty() || paths.iter().all(|p| p.as_os_str() == "-") {
        return Ok(vec![Input {
            name: "<stdin>".into(),
            path: None,
            text: read_stdin()?,
        }]);
    }
    if paths.iter().any(|p| p.as_os_str() == "-") {
        bail!("`-` (stdin) cannot be mixed with file paths");
    }
    let walk = Walk::of(paths)?;
    for n in &walk.notes {
        eprintln!("sigil pin: note: {}", sigil_core::text::escape_controls(n));
    }
    walk.files
        .into_iter()
        .zip(walk.sizes)
        .map(|(p, len)| {
            let bytes = read_found(&p, len).with_context(|| format!("reading {}", p.display()))?;
            let text = String::from_utf8(bytes)
                .with_context(|| format!("{} is not UTF-8 text", p.display()))?;
            Ok(Input {
                name: p.display().to_string(),
                path: Some(p),
                text,
            })
        })
        .collect()
}

fn progress(len: usize) -> indicatif::ProgressBar {
    if len < 2 || !std::io::stderr().is_terminal() {
        return indicatif::ProgressBar::hidden();
    }
    let bar = indicatif::ProgressBar::new(len as u64);
    if let Ok(style) = indicatif::ProgressStyle::with_template(
        "{spinner} pinning {pos}/{len} files {wide_bar} {eta}",
    ) {
        bar.set_style(style);
    }
    bar
}

/// `sigil pin`.
pub fn run(args: PinArgs) -> Result<ExitCode> {
    let inputs = read_inputs(&args.paths)?;
    if args.write && inputs.iter().any(|i| i.path.is_none()) {
        bail!("--write edits files; for stdin, leave it out and the pinned YAML goes to stdout");
    }
    let policy = load_policy(args.policy.as_deref())?;
    let sources = args.decide.creds.sources()?;
    let opts = args.decide.options();
    let (results, registry_requests) = match &args.oci_layout {
        Some(dir) => {
            if !dir.is_dir() {
                bail!("--oci-layout {}: not a directory", dir.display());
            }
            let engine = sigil::engine::engine_over(
                std::sync::Arc::new(policy),
                sigil_registry::layout::Layouts::new(dir),
                &sources,
                &std::sync::Arc::new(sigil::metrics::Metrics::default()),
            )
            .context("putting the policy in force")?;
            (pin_inputs(&engine, &inputs, &opts)?, 0)
        }
        None => {
            let engine = engine_for(policy, &sources)?;
            let results = pin_inputs(&engine, &inputs, &opts)?;
            (results, engine.resolver.loads())
        }
    };

    let yaml_to_stdout = !args.write && !args.check;
    let mut results = results;
    let mut report = Report::default();
    for (input, result) in inputs.iter().zip(&mut results) {
        report.add(&input.name, result, args.check);
    }
    report.registry_requests = registry_requests;

    let mut stdout = std::io::stdout().lock();
    if yaml_to_stdout && report.errors == 0 {
        // Buffered: stdout alone writes at every newline, a system call per file.
        let mut out = std::io::BufWriter::with_capacity(64 << 10, &mut stdout);
        let written: std::io::Result<()> =
            results.iter().flatten().enumerate().try_for_each(|(n, r)| {
                if n > 0 && !r.text.starts_with("---") {
                    out.write_all(b"---\n")?;
                }
                out.write_all(r.text.as_bytes())?;
                if !r.text.ends_with('\n') && !r.text.is_empty() {
                    out.write_all(b"\n")?;
                }
                Ok(())
            });
        written
            .and_then(|()| out.flush())
            .context("writing the pinned YAML to stdout")?;
    }
    if args.write && report.errors == 0 {
        let changes: Vec<Change<'_>> = inputs
            .iter()
            .zip(&results)
            .filter_map(|(input, result)| match (&input.path, result) {
                (Some(path), Ok(p)) if p.changed => Some(Change {
                    path,
                    text: &p.text,
                }),
                _ => None,
            })
            .collect();
        let written = write_all(&changes).context("sigil pin --write")?;
        report.written = written.files.len();
        for (link, target) in written.through_links {
            let name = link.display().to_string();
            if let Some(f) = report.files.iter_mut().find(|f| f.path == name) {
                f.notes
                    .push(format!("written through the link to {}", target.display()));
            }
        }
    }
    match (args.output, yaml_to_stdout) {
        (Output::Text, true) => eprint!("{}", report.text(args.check, true)),
        (Output::Text, false) => write_out(&report.text(args.check, false))?,
        (Output::Json, true) => write_json_pretty(std::io::stderr().lock(), &report)?,
        (Output::Json, false) => write_json_pretty(&mut stdout, &report)?,
    }
    Ok(ExitCode::from(if report.errors > 0 {
        EXIT_ERROR
    } else if report.denied > 0 || (args.check && report.check_failures > 0) {
        EXIT_FINDINGS
    } else {
        0
    }))
}
