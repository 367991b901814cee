//! `sigil node rbac`: prints the Roles and RoleBindings the node DaemonSet
//! needs for a policy — the policy ConfigMap and exactly the ConfigMaps and
//! Secrets its cluster rules name by `keyRef`, by `resourceNames`
//! (`sigil::node::rbac`). The Kustomize component ships its output for the
//! base's policy; regenerate it when the policy's keyRefs change (the chart
//! renders the same from its `policy` value).

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context as _, Result};
use clap::Args;
use sigil_core::verify::KeyRef;

/// Flags of `sigil node rbac`.
#[derive(Debug, Args)]
pub struct RbacArgs {
    /// The policy file (as `sigil serve --policy`); the embedded default without.
    #[arg(long, env = "SIGIL_POLICY")]
    policy: Option<PathBuf>,
    /// The ConfigMap holding the policy, `namespace/name`: read by name,
    /// and its namespace is where a `keyRef` without one is read.
    #[arg(long, default_value = "sigil-system/sigil-policy")]
    policy_configmap: String,
    /// The DaemonSet's ServiceAccount, `namespace/name`.
    #[arg(long, default_value = "sigil-node/sigil-node")]
    service_account: String,
    /// Another object to allow, for a ClusterImagePolicy applied later:
    /// `configmap/NAME`, `secret/NAME`, optionally `NAMESPACE/` first.
    /// Repeatable.
    #[arg(long = "allow")]
    allow: Vec<String>,
}

/// Runs `sigil node rbac`.
pub fn run(args: RbacArgs) -> Result<ExitCode> {
    let policy = super::load_policy(args.policy.as_deref())?;
    let configmap = args
        .policy_configmap
        .split_once('/')
        .context("--policy-configmap is namespace/name")?;
    let account = args
        .service_account
        .split_once('/')
        .context("--service-account is namespace/name")?;
    let extra = args
        .allow
        .iter()
        .map(|a| allowed(a))
        .collect::<Result<Vec<_>>>()?;
    let reads = sigil::node::rbac::reads(configmap, &policy, &extra);
    let mut out = String::from(
        "# What sigil node sync reads (`sigil node rbac`): the policy ConfigMap and the\n# ConfigMaps and Secrets the policy's keyRefs name, each by name. docs/node.md.\n",
    );
    for o in sigil::node::rbac::render(&reads, account) {
        out.push_str("---\n");
        out.push_str(&serde_saphyr::to_string(&o).context("rendering YAML")?);
    }
    super::write_out(&out)?;
    Ok(ExitCode::SUCCESS)
}

/// `[NAMESPACE/]configmap/NAME` or `[NAMESPACE/]secret/NAME`.
fn allowed(a: &str) -> Result<KeyRef> {
    let parts: Vec<&str> = a.split('/').collect();
    let (ns, kind, name) = match parts.as_slice() {
        [kind, name] => (None, *kind, *name),
        [ns, kind, name] => (Some((*ns).to_owned()), *kind, *name),
        _ => anyhow::bail!(
            "--allow {a:?}: want [NAMESPACE/]configmap/NAME or [NAMESPACE/]secret/NAME"
        ),
    };
    anyhow::ensure!(!name.is_empty(), "--allow {a:?}: the name is empty");
    let (config_map, secret) = match kind.to_ascii_lowercase().as_str() {
        "configmap" | "configmaps" => (Some(name.to_owned()), None),
        "secret" | "secrets" => (None, Some(name.to_owned())),
        other => anyhow::bail!("--allow {a:?}: {other:?} is neither configmap nor secret"),
    };
    Ok(KeyRef {
        config_map,
        secret,
        key: String::new(),
        namespace: ns,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allow_names_an_object_or_says_what_it_wants() {
        let r = allowed("vendors/secret/vendor-key").unwrap();
        assert_eq!(r.secret.as_deref(), Some("vendor-key"));
        assert_eq!(r.namespace.as_deref(), Some("vendors"));
        assert_eq!(
            allowed("configmap/keys").unwrap().config_map.as_deref(),
            Some("keys")
        );
        assert!(
            allowed("pod/x")
                .unwrap_err()
                .to_string()
                .contains("neither")
        );
        assert!(allowed("x").is_err());
    }
}
