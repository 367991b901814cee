//! `sigil break-glass [--reason …] | --end`: the emergency switch, as the
//! operator sees it. The procedure (marker first, then delete, then make sure
//! it stays deleted) is `sigil_kube::cluster::break_glass`; this prints what
//! happened and what to do next.

use std::process::ExitCode;

use anyhow::{Context, Result};

use super::ClusterArgs;

/// Flags of `sigil break-glass`.
#[derive(clap::Args, Debug)]
pub struct BreakGlassArgs {
    #[command(flatten)]
    cluster: ClusterArgs,
    /// End the emergency: clear the marker; replicas re-register within one reconcile interval.
    #[arg(long)]
    end: bool,
    /// Why (recorded in the marker, for the audit afterwards).
    #[arg(long, conflicts_with = "end")]
    reason: Option<String>,
    /// Delete the in-API-server backstop too (`sigil backstop`); without,
    /// it stays and keeps refusing Pods with images sigil would never admit.
    #[arg(long, conflicts_with = "end")]
    backstop: bool,
}

/// Runs `sigil break-glass`.
pub fn run(args: BreakGlassArgs) -> Result<ExitCode> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting runtime")?;
    let namespace = sigil_kube::cluster::own_namespace(args.cluster.namespace.clone());
    let settings = args.cluster.settings(namespace.clone());
    let now = humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string();
    let cm = format!("{namespace}/{}", settings.state_configmap);
    rt.block_on(async {
        let client = sigil_kube::cluster::connect("sigil break-glass").await?;
        if args.end {
            match sigil_kube::cluster::break_glass::end(&client, &settings, &now).await? {
                Some(p) => say!(
                    "break-glass ended ({p}; ended={now}).\n\
                     Running sigil replicas re-register the webhook (and the backstop, with --register-backstop) within one reconcile interval (default 30s).\n\
                     Now audit what was created or changed while images were not checked:\n  \
                     sigil audit -A --since-break-glass --policy <your policy>{}",
                    if namespace == "sigil-system" {
                        String::new()
                    } else {
                        format!(" --sigil-namespace {namespace}")
                    }
                )?,
                None => say!("no break-glass was active (ConfigMap {cm}); nothing changed.")?,
            }
            return Ok(ExitCode::SUCCESS);
        }
        let reason = args.reason.unwrap_or_else(|| "unspecified".into());
        let user = std::env::var("USER").unwrap_or_else(|_| "unknown".into());
        let marker = format!("since={now}; by={user}; reason={reason}");
        let begun = sigil_kube::cluster::break_glass::begin(
            &client,
            &settings,
            marker,
            args.backstop,
            &now,
        )
        .await?;
        if let Some(p) = &begun.previous {
            say!("note: break-glass was already active ({p}); replaced.")?;
        }
        say!(
            "break-glass ON ({}).\n\
             Deleted MutatingWebhookConfiguration(s): {}.\n\
             The API server no longer calls sigil: images are admitted UNCHECKED (fail-open) until\n  \
             sigil break-glass --end\n\
             Marker: annotation {} on ConfigMap {cm}.",
            begun.marker,
            if begun.deleted.is_empty() {
                "none found".to_owned()
            } else {
                begun.deleted.join(", ")
            },
            sigil_kube::cluster::BREAK_GLASS_ANNOTATION,
        )?;
        if args.backstop {
            say!(
                "Deleted the backstop: {}. Replicas that register it (--register-backstop) re-create it after\n  \
                 sigil break-glass --end\n\
                 otherwise re-apply it afterwards (sigil backstop | kubectl apply -f -, or your manifests).",
                if begun.backstop_deleted.is_empty() {
                    "none found".to_owned()
                } else {
                    begun.backstop_deleted.join(", ")
                }
            )?;
        } else {
            say!(
                "The in-API-server backstop (ValidatingAdmissionPolicy sigil-backstop), if installed, stays:\n\
                 Pods with unpinned or unmirrored images are still refused. Add --backstop to delete it too."
            )?;
        }
        Ok(ExitCode::SUCCESS)
    })
}
