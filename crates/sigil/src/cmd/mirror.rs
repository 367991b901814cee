//! `sigil mirror IMAGE…`: copies images into their mirrors now, for
//! pre-seeding a mirror before workloads need it (the webhook copies on
//! admission only with `mirrors[].copy: true`). The mapping, credentials
//! and limits are the policy's and the flags', as in the webhook; the copy
//! is `sigil-registry`'s. It decides nothing.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use futures_util::future::join_all;
use sigil::metrics::Metrics;
use sigil_core::Reference;
use sigil_registry::copy::CopyAnswer;

use super::{CredentialArgs, EXIT_FINDINGS, load_policy};

/// Flags of `sigil mirror`.
#[derive(clap::Args, Debug)]
pub struct MirrorArgs {
    /// ImagePolicy file whose `mirrors` say where each image goes (and
    /// whose `registries` hold the push credentials).
    #[arg(long, env = "SIGIL_POLICY")]
    policy: PathBuf,
    /// How long all copies may take together.
    #[arg(long, default_value = "30m", value_parser = humantime::parse_duration)]
    timeout: Duration,
    #[command(flatten)]
    creds: CredentialArgs,
    /// Images at their origin, as a Pod would name them (a tag or a digest).
    #[arg(required = true)]
    images: Vec<String>,
}

/// Runs `sigil mirror`: exit 0 every image copied, 1 a copy failed, 2 bad input.
pub fn run(args: MirrorArgs) -> Result<ExitCode> {
    let policy = load_policy(Some(&args.policy))?;
    let mut pairs = Vec::new();
    for image in &args.images {
        let origin = Reference::parse(image).with_context(|| format!("image {image:?}"))?;
        let origin = policy.origin_of(&origin);
        let mirror = policy.mirror_of(&origin);
        anyhow::ensure!(
            mirror != origin,
            "{origin}: no mirror in policy {} maps it (spec.mirrors[].from)",
            args.policy.display()
        );
        pairs.push((origin, mirror));
    }
    let sources = args.creds.sources()?;
    let metrics = Arc::new(Metrics::default());
    let registry = sigil::engine::registry_for(&policy, None, &sources, &metrics)
        .context("setting up registry clients")?;
    let until = Instant::now() + args.timeout;
    let answers = super::runtime()?.block_on(join_all(
        pairs
            .iter()
            .map(|(o, m)| registry.copy(o, m, policy.platform.as_ref(), until)),
    ));
    let mut failed = false;
    for ((origin, mirror), answer) in pairs.iter().zip(answers) {
        match answer {
            CopyAnswer::Copied(d) => {
                super::write_out(&format!("copied  {origin} -> {mirror}@{d}\n"))?
            }
            CopyAnswer::Underway(t) => {
                failed = true;
                eprintln!(
                    "failed  {origin}: still copying after {:.0}s (--timeout)",
                    t.as_secs_f64()
                );
            }
            CopyAnswer::Failed(e) => {
                failed = true;
                eprintln!("failed  {origin} -> {mirror}: {e}");
            }
        }
    }
    Ok(if failed {
        ExitCode::from(EXIT_FINDINGS)
    } else {
        ExitCode::SUCCESS
    })
}
