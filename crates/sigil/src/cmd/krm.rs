//! `sigil krm`: a ResourceList on stdin, the pinned ResourceList on stdout,
//! exit 1 when a result is an error (the KRM Functions Specification). The
//! ResourceList handling lives in `sigil::krm`.

use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Result;
use sigil::krm::ResourceList;

use super::{EXIT_FINDINGS, engine_for, load_policy, read_stdin, runtime};

#[derive(clap::Args, Debug)]
pub struct KrmArgs {
    /// Policy used when the ResourceList carries no functionConfig.
    #[arg(long, env = "SIGIL_POLICY")]
    policy: Option<PathBuf>,
    #[command(flatten)]
    decide: super::DecideArgs,
}

/// `sigil krm`: ResourceList on stdin, ResourceList on stdout.
pub fn run(args: KrmArgs) -> Result<ExitCode> {
    let list = match ResourceList::parse(read_stdin()?) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("sigil krm: {e}");
            return Ok(ExitCode::from(EXIT_FINDINGS));
        }
    };
    let out = match list.policy() {
        Err(msg) => list.fail(msg),
        Ok(policy) => {
            let policy = match policy {
                Some(p) => Ok(p),
                None => load_policy(args.policy.as_deref()),
            };
            match policy.and_then(|p| engine_for(p, &args.decide.creds.sources()?)) {
                Err(e) => list.fail(format!("{e:#}")),
                Ok(engine) => runtime()?.block_on(list.process(&engine, &args.decide.options())),
            }
        }
    };
    let mut stdout = std::io::stdout().lock();
    stdout.write_all(out.text.as_bytes())?;
    stdout.flush()?;
    Ok(ExitCode::from(if out.failed { EXIT_FINDINGS } else { 0 }))
}
