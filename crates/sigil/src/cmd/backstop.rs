//! `sigil backstop`: prints the in-API-server backstop for a policy — a
//! ValidatingAdmissionPolicy and its binding (and a warning one for `warn`
//! rules) that kube-apiserver evaluates itself, so that while the webhook is
//! down, failing open or timing out, Pods with images sigil would never
//! admit are still refused (`sigil_core::backstop` generates them; this
//! renders them as YAML for `kubectl apply` or Git).

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context as _, Result};
use clap::Args;

/// Flags of `sigil backstop`.
#[derive(Debug, Args)]
pub struct BackstopArgs {
    /// The policy file (as `sigil serve --policy`); the embedded default without.
    #[arg(long, env = "SIGIL_POLICY")]
    pub policy: Option<PathBuf>,
    /// sigil's namespace: exempt from the backstop as from the webhook.
    #[arg(long, env = "POD_NAMESPACE", default_value = "sigil-system")]
    pub namespace: String,
    /// The node tier's namespace (docs/node.md), exempt as sigil's own is:
    /// its DaemonSet must start while the webhook is down.
    #[arg(long, env = "SIGIL_NODE_NAMESPACE")]
    pub node_namespace: Option<String>,
}

/// Runs `sigil backstop`.
pub fn run(args: BackstopArgs) -> Result<ExitCode> {
    let policy = super::load_policy(args.policy.as_deref())?;
    let b = sigil_core::backstop::generate(
        &policy,
        &sigil_core::backstop::Options {
            namespace: args.namespace,
            node_namespace: args.node_namespace,
        },
    );
    if !b.unfit.is_empty() {
        anyhow::bail!(
            "the backstop for this policy would be refused by the API server: {}; make the policy smaller (nothing was printed)",
            b.unfit.join("; ")
        );
    }
    super::write_out(&render(&b)?)?;
    Ok(ExitCode::SUCCESS)
}

/// The backstop as a YAML stream, headed by what it leaves to the webhook.
pub fn render(b: &sigil_core::backstop::Backstop) -> Result<String> {
    let mut out = String::from(
        "# sigil's in-API-server backstop (`sigil backstop`): refuses Pods whose images\n# sigil would never admit while the webhook does not answer. docs/operations.md.\n",
    );
    if !b.left_to_webhook.is_empty() {
        out.push_str("# Left to the webhook (the API server cannot check these):\n");
        for l in &b.left_to_webhook {
            out.push_str(&format!("#   - {l}\n"));
        }
    }
    for o in &b.objects {
        out.push_str("---\n");
        out.push_str(&serde_saphyr::to_string(o).context("rendering the backstop as YAML")?);
    }
    Ok(out)
}
