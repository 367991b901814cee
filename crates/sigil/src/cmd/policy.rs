//! `sigil policy check`: load a policy file as `sigil serve` would (including
//! the key, certificate and trusted-root files its `verify` rules name) and
//! print what it means, or the exact line that is wrong; a policy whose
//! in-API-server backstop the API server would refuse (a limit it names)
//! fails too.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use sigil_core::Policy;

/// `sigil policy …`
#[derive(clap::Subcommand, Debug)]
pub enum PolicyCommand {
    /// Validate a policy and print what each rule means.
    Check {
        /// The ImagePolicy YAML file.
        file: PathBuf,
        /// Check only the schema: do not read the key, certificate and trusted-root files `verify` names.
        #[arg(long)]
        schema_only: bool,
    },
}

/// Runs a `policy` subcommand.
pub fn run(command: PolicyCommand) -> Result<ExitCode> {
    match command {
        PolicyCommand::Check { file, schema_only } => check(&file, schema_only),
    }
}

fn check(file: &Path, schema_only: bool) -> Result<ExitCode> {
    let text = sigil_registry::file::read_text(file, sigil_registry::file::MAX_CONFIG_BYTES)
        .with_context(|| format!("reading {}", file.display()))?;
    let p = match Policy::from_documents_at(&text, Some(sigil::engine::unix_now())) {
        Ok(p) => p,
        Err(e) => bail!("{}: {e}", file.display()),
    };
    if !schema_only && let Err(e) = sigil_verify::Material::load(&p) {
        bail!(
            "{}: {e} (sigil serve would refuse this policy; --schema-only checks without reading these files)",
            file.display()
        );
    }
    super::write_out(&p.describe())?;
    // The backstop the policy makes (`sigil backstop`, --register-backstop)
    // must be one the API server takes; sigil would otherwise remove it.
    let b = sigil_core::backstop::generate(
        &p,
        &sigil_core::backstop::Options {
            namespace: "sigil-system".to_owned(),
            node_namespace: None,
        },
    );
    if !b.unfit.is_empty() {
        bail!(
            "{}: its backstop would be refused by the API server: {} (the webhook can still serve it; make the policy smaller, or do not register the backstop)",
            file.display(),
            b.unfit.join("; ")
        );
    }
    Ok(ExitCode::SUCCESS)
}
