//! `sigil krm`: a ResourceList on stdin, the pinned ResourceList on stdout,
//! exit 1 when a result is an error (the KRM Functions Specification). The
//! ResourceList handling lives in `sigil::krm`.

use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Result;
use sigil::krm::ResourceList;
use sigil::pin::PinOptions;

use super::{EXIT_FINDINGS, engine_for, load_policy, read_stdin, runtime};

#[derive(clap::Args, Debug, Default)]
pub struct KrmArgs {
    /// Policy used when the ResourceList carries no functionConfig.
    #[arg(long, env = "SIGIL_POLICY")]
    policy: Option<PathBuf>,
    /// No registry calls: apply mirrors and rules; lookups become warnings.
    #[arg(long)]
    offline: bool,
    /// Time allowed for the registry lookups of one object.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    timeout: Duration,
    #[command(flatten)]
    creds: super::CredentialArgs,
    /// Namespace of objects that name none, for `exemptNamespaces` (kubectl's default).
    #[arg(short = 'n', long, default_value = sigil::pin::DEFAULT_NAMESPACE, env = "SIGIL_NAMESPACE")]
    namespace: String,
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
            match policy.and_then(|p| engine_for(p, &args.creds.sources()?)) {
                Err(e) => list.fail(format!("{e:#}")),
                Ok(engine) => {
                    let opts = PinOptions {
                        offline: args.offline,
                        timeout: args.timeout,
                        namespace: args.namespace.clone(),
                    };
                    runtime()?.block_on(list.process(&engine, &opts))
                }
            }
        }
    };
    let mut stdout = std::io::stdout().lock();
    stdout.write_all(out.text.as_bytes())?;
    stdout.flush()?;
    Ok(ExitCode::from(if out.failed { EXIT_FINDINGS } else { 0 }))
}
