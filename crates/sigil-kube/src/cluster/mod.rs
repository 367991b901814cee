//! Everything sigil writes to the Kubernetes API, and how it connects.
//!
//! Owns the client ([`connect`]: only when a flag asks for it — without
//! `--register`, `--self-managed-certs` or `break-glass` sigil never contacts
//! the API server), where sigil lives ([`Settings`], [`own_namespace`]), the
//! registration of its own MutatingWebhookConfiguration ([`registration`]:
//! register only once Ready, never while a break-glass marker is set, never
//! write a CA bundle read before the configuration it replaces) and the
//! break-glass procedure ([`break_glass`]), and the in-API-server backstop
//! kept registered beside it ([`backstop`]). It does not own certificates
//! (`certs`), serving, or decisions.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use kube::Client;

use crate::error::{Context as _, Error, Result};

pub mod backstop;
pub mod break_glass;
pub mod lease;
pub mod registration;

pub use registration::{
    Reconciled, Scope, namespace_selector, reconcile, run, webhook_configuration,
};

/// Label that exempts a namespace from sigil (see docs/operations.md for who
/// may set it: it switches off image policy for everything in the namespace).
pub const IGNORE_LABEL: &str = "sigil.dev/ignore";
/// Annotation on the state ConfigMap that pauses registration (break-glass).
pub const BREAK_GLASS_ANNOTATION: &str = "sigil.dev/break-glass";
/// Annotation on the state ConfigMap that keeps the backstop deleted
/// (`sigil break-glass --backstop`) until `--end`.
pub const BACKSTOP_BREAK_GLASS_ANNOTATION: &str = "sigil.dev/break-glass-backstop";
/// Annotation recording the last ended break-glass window, for audits.
pub const LAST_BREAK_GLASS_ANNOTATION: &str = "sigil.dev/last-break-glass";
/// Label on every object sigil writes, so break-glass finds them all.
pub const MANAGED_BY: (&str, &str) = ("app.kubernetes.io/managed-by", "sigil");
/// The one webhook inside sigil's configuration.
pub const WEBHOOK_NAME: &str = "images.sigil.dev";
/// Well-known label every namespace carries with its own name (Kubernetes ≥ 1.21).
const NAMESPACE_NAME_LABEL: &str = "kubernetes.io/metadata.name";

/// What the API server does when sigil cannot answer.
///
/// Spelled as Kubernetes spells `failurePolicy` (`Fail`, `Ignore`), which is
/// what `--help` shows and what the manifests set; lower case is accepted
/// too, since that is how clap spelled it before.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum FailurePolicy {
    /// Fail closed: requests sigil cannot answer are rejected.
    #[value(name = "Fail", alias = "fail")]
    Fail,
    /// Fail open: they are admitted without sigil (audit afterwards).
    #[value(name = "Ignore", alias = "ignore")]
    Ignore,
}

impl FailurePolicy {
    pub fn as_str(self) -> &'static str {
        match self {
            FailurePolicy::Fail => "Fail",
            FailurePolicy::Ignore => "Ignore",
        }
    }
}

/// Where sigil lives in the cluster and how its webhook is registered.
#[derive(Debug, Clone)]
pub struct Settings {
    /// sigil's own namespace (exempted; holds the Secret and the state ConfigMap).
    pub namespace: String,
    /// The node tier's namespace, exempted as sigil's own is (its
    /// DaemonSet must start, and arm new nodes, while the webhook is down).
    pub node_namespace: Option<String>,
    /// Name of the MutatingWebhookConfiguration.
    pub config_name: String,
    /// Service in front of the replicas.
    pub service: String,
    /// Port of that Service.
    pub service_port: i32,
    /// `clientConfig.url` instead of the Service (sigil outside the cluster).
    pub url: Option<String>,
    /// failurePolicy of the webhook.
    pub failure_policy: FailurePolicy,
    /// timeoutSeconds of the webhook (1–30).
    pub timeout_seconds: i32,
    /// ConfigMap holding the break-glass marker.
    pub state_configmap: String,
    /// How often each replica re-checks the marker and its registration.
    pub interval: Duration,
    /// The custom resources the policy in force names image fields in
    /// (its `imageExtractors`), registered beside the built-in kinds.
    pub custom_kinds: CustomKinds,
}

/// The (group, resource) pairs of the policy in force's image extractors,
/// read at each reconcile so an edited policy's kinds are registered
/// without a restart.
#[derive(Clone)]
pub struct CustomKinds(pub Arc<dyn Fn() -> Vec<(String, String)> + Send + Sync>);

impl CustomKinds {
    /// The kinds of `extractors` with at least one path.
    pub fn of(extractors: &sigil_core::walker::Extractors) -> Vec<(String, String)> {
        extractors
            .list()
            .iter()
            .filter(|e| !e.paths.is_empty())
            .map(|e| (e.group.clone(), e.resource.clone()))
            .collect()
    }
}

impl Default for CustomKinds {
    /// The shipped defaults.
    fn default() -> Self {
        CustomKinds(Arc::new(|| {
            CustomKinds::of(&sigil_core::walker::Extractors::defaults())
        }))
    }
}

impl std::fmt::Debug for CustomKinds {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries((self.0)()).finish()
    }
}

/// Where the caBundle written into the configuration comes from.
#[derive(Debug, Clone)]
pub enum CaSource {
    /// Known at start (a CA minted in memory).
    Fixed(Vec<u8>),
    /// A file re-read on every reconcile (cert-manager's `ca.crt`).
    File(PathBuf),
    /// The self-managed Secret's `ca.crt`, read fresh on every reconcile.
    Secret(String),
}

/// An Event's note as the API accepts it: at most 1 kB, cut on a character
/// boundary with `...` when longer.
pub fn event_note(s: &str) -> String {
    let mut s = s.to_owned();
    if s.len() > 1000 {
        let mut cut = 997;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
        s.push_str("...");
    }
    s
}

/// A client from the in-cluster service account or KUBECONFIG, or an error
/// that says which flag needed it and how to provide it.
pub async fn connect(flag: &str) -> Result<Client> {
    let config = kube::Config::infer().await.map_err(|e| Error::NoCluster {
        flag: flag.to_owned(),
        detail: e.to_string(),
    })?;
    Client::try_from(config).with_context(|| format!("building a Kubernetes client for {flag}"))
}

/// The namespace sigil runs in: `--namespace`, else the pod's service
/// account namespace, else `sigil-system`.
pub fn own_namespace(flag: Option<String>) -> String {
    flag.or_else(|| {
        std::fs::read_to_string("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
            .ok()
            .map(|s| s.trim().to_owned())
            .filter(|s| !s.is_empty())
    })
    .unwrap_or_else(|| "sigil-system".into())
}

#[cfg(test)]
mod tests {
    use super::FailurePolicy;
    use clap::ValueEnum as _;

    /// The shipped Deployment sets `SIGIL_FAILURE_POLICY=Fail` (Kubernetes'
    /// spelling); the flag once took only `fail`, and every replica crash-looped.
    #[test]
    fn failure_policy_accepts_the_kubernetes_spelling_the_manifests_use() {
        for (s, want) in [
            ("Fail", FailurePolicy::Fail),
            ("fail", FailurePolicy::Fail),
            ("Ignore", FailurePolicy::Ignore),
            ("ignore", FailurePolicy::Ignore),
        ] {
            assert_eq!(FailurePolicy::from_str(s, false), Ok(want), "{s}");
        }
        assert!(FailurePolicy::from_str("Open", false).is_err());
        let shown: Vec<String> = FailurePolicy::value_variants()
            .iter()
            .filter_map(|v| v.to_possible_value())
            .map(|v| v.get_name().to_owned())
            .collect();
        assert_eq!(
            shown,
            ["Fail", "Ignore"],
            "--help shows the Kubernetes spelling"
        );
        assert_eq!(FailurePolicy::Fail.as_str(), "Fail");
    }
}
