//! sigil's own MutatingWebhookConfiguration: its shape (what is
//! intercepted, what is exempt), and the reconcile loop that keeps it
//! registered and its CA bundle current — first once Ready, then every
//! interval, paused while a break-glass marker is set.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhook, MutatingWebhookConfiguration, RuleWithOperations, ServiceReference,
    WebhookClientConfig,
};
use k8s_openapi::api::core::v1::{Namespace, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
    LabelSelector, LabelSelectorRequirement, ObjectMeta, OwnerReference,
};
use kube::Client;
use kube::api::{Api, PostParams};

use super::break_glass::{break_glass_marker, delete_configurations};
use super::{CaSource, IGNORE_LABEL, MANAGED_BY, NAMESPACE_NAME_LABEL, Settings, WEBHOOK_NAME};
use crate::error::{Context as _, Error, Result};
use crate::metrics::Metrics;

/// The (group, version, resources) sigil intercepts: every kind of the core
/// issue, plus `pods/ephemeralcontainers` (`kubectl debug` adds images there).
const RULES: &[(&str, &str, &[&str])] = &[
    (
        "",
        "v1",
        &[
            "pods",
            "pods/ephemeralcontainers",
            "podtemplates",
            "replicationcontrollers",
        ],
    ),
    (
        "apps",
        "v1",
        &["deployments", "replicasets", "statefulsets", "daemonsets"],
    ),
    ("batch", "v1", &["jobs", "cronjobs"]),
    ("sources.knative.dev", "*", &["containersources"]),
];

/// The webhook's rules: the built-in kinds, then one rule per custom group
/// the image extractors name (every version; `*` scope, as a CRD may be
/// cluster-scoped, like Argo's ClusterWorkflowTemplate), groups and
/// resources sorted so a re-read compares equal.
pub fn rules(custom: &[(String, String)]) -> Vec<RuleWithOperations> {
    let rule =
        |group: &str, version: &str, resources: Vec<String>, scope: &str| RuleWithOperations {
            api_groups: Some(vec![group.to_owned()]),
            api_versions: Some(vec![version.to_owned()]),
            operations: Some(owned(&["CREATE", "UPDATE"])),
            resources: Some(resources),
            scope: Some(scope.into()),
        };
    let mut out: Vec<RuleWithOperations> = RULES
        .iter()
        .map(|(g, v, r)| rule(g, v, owned(r), "Namespaced"))
        .collect();
    let mut by_group: BTreeMap<&str, std::collections::BTreeSet<&str>> = BTreeMap::new();
    for (g, r) in custom {
        by_group.entry(g).or_default().insert(r);
    }
    for (g, rs) in by_group {
        out.push(rule(
            g,
            "*",
            rs.into_iter().map(str::to_owned).collect(),
            "*",
        ));
    }
    out
}

fn owned(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| (*s).to_owned()).collect()
}

/// The namespaces sigil never sees: kube-system, its own, and any namespace
/// labelled [`IGNORE_LABEL`]. This is what makes a cluster restart safe with a
/// fail-closed configuration in place: sigil's pods (and the system pods it
/// depends on) are admitted without sigil, so they can start first.
pub fn namespace_selector(own_namespace: &str, node_namespace: Option<&str>) -> LabelSelector {
    let mut exempt = vec!["kube-system".to_owned()];
    for ns in std::iter::once(own_namespace).chain(node_namespace) {
        if !exempt.iter().any(|e| e == ns) {
            exempt.push(ns.to_owned());
        }
    }
    LabelSelector {
        match_expressions: Some(vec![
            LabelSelectorRequirement {
                key: NAMESPACE_NAME_LABEL.into(),
                operator: "NotIn".into(),
                values: Some(exempt),
            },
            LabelSelectorRequirement {
                key: IGNORE_LABEL.into(),
                operator: "DoesNotExist".into(),
                values: None,
            },
        ]),
        match_labels: None,
    }
}

/// The MutatingWebhookConfiguration sigil registers. Every field the API
/// server would default is set, so a re-read compares equal and replicas do
/// not rewrite it on every reconcile.
pub fn webhook_configuration(
    s: &Settings,
    ca_bundle: &[u8],
    owner: Option<OwnerReference>,
) -> MutatingWebhookConfiguration {
    let client_config = match &s.url {
        Some(url) => WebhookClientConfig {
            url: Some(url.clone()),
            ca_bundle: Some(ByteString(ca_bundle.to_vec())),
            service: None,
        },
        None => WebhookClientConfig {
            url: None,
            ca_bundle: Some(ByteString(ca_bundle.to_vec())),
            service: Some(ServiceReference {
                namespace: s.namespace.clone(),
                name: s.service.clone(),
                path: Some("/mutate".into()),
                port: Some(s.service_port),
            }),
        },
    };
    let rules = rules(&(s.custom_kinds.0)());
    MutatingWebhookConfiguration {
        metadata: ObjectMeta {
            name: Some(s.config_name.clone()),
            labels: Some(BTreeMap::from([
                (MANAGED_BY.0.to_owned(), MANAGED_BY.1.to_owned()),
                ("app.kubernetes.io/name".to_owned(), "sigil".to_owned()),
            ])),
            owner_references: owner.map(|o| vec![o]),
            ..ObjectMeta::default()
        },
        webhooks: Some(vec![MutatingWebhook {
            name: WEBHOOK_NAME.into(),
            admission_review_versions: owned(&["v1"]),
            client_config,
            failure_policy: Some(s.failure_policy.as_str().into()),
            match_policy: Some("Equivalent".into()),
            namespace_selector: Some(namespace_selector(
                &s.namespace,
                s.node_namespace.as_deref(),
            )),
            object_selector: Some(LabelSelector::default()),
            reinvocation_policy: Some("IfNeeded".into()),
            rules: Some(rules),
            side_effects: "NoneOnDryRun".into(),
            timeout_seconds: Some(s.timeout_seconds),
            match_conditions: None,
        }]),
    }
}

/// Reads the CA bundle to write, after the configuration it will replace was
/// read (see [`reconcile`]).
async fn read_ca(client: &Client, s: &Settings, source: &CaSource) -> Result<Vec<u8>> {
    match source {
        CaSource::Fixed(b) => Ok(b.clone()),
        CaSource::File(p) => {
            std::fs::read(p).with_context(|| format!("reading CA bundle {}", p.display()))
        }
        CaSource::Secret(name) => {
            let secrets: Api<Secret> = Api::namespaced(client.clone(), &s.namespace);
            let secret = secrets
                .get(name)
                .await
                .with_context(|| format!("reading Secret {}/{name}", s.namespace))?;
            secret
                .data
                .and_then(|mut d| d.remove("ca.crt"))
                .map(|b| b.0)
                .ok_or_else(|| {
                    Error::Invalid(format!("Secret {}/{name} has no ca.crt", s.namespace))
                })
        }
    }
}

/// The Namespace as owner, so deleting sigil's namespace (`kubectl delete -k`)
/// garbage-collects the configuration instead of leaving a fail-closed webhook
/// pointing at nothing. `None` (with a warning) if it cannot be read.
pub(crate) async fn namespace_owner(client: &Client, s: &Settings) -> Option<OwnerReference> {
    let nss: Api<Namespace> = Api::all(client.clone());
    match nss.get(&s.namespace).await {
        Ok(ns) => ns.metadata.uid.map(|uid| OwnerReference {
            api_version: "v1".into(),
            kind: "Namespace".into(),
            name: s.namespace.clone(),
            uid,
            block_owner_deletion: None,
            controller: None,
        }),
        Err(e) => {
            tracing::warn!(namespace = %s.namespace, error = %e, "cannot read own namespace; registering without an owner (delete the webhook configuration by hand on uninstall)");
            None
        }
    }
}

/// What one reconcile did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reconciled {
    /// The configuration was already as desired.
    Unchanged,
    /// It did not exist and was created.
    Created,
    /// It existed and was updated.
    Updated,
    /// A break-glass marker is set: nothing was written.
    Paused,
    /// Only the CA bundle is managed and there is no configuration to update.
    Absent,
}

impl Reconciled {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Reconciled::Unchanged => "unchanged",
            Reconciled::Created => "created",
            Reconciled::Updated => "updated",
            Reconciled::Paused => "paused",
            Reconciled::Absent => "absent",
        }
    }
}

/// What a reconcile manages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// The whole configuration (`--register`).
    Register,
    /// Only the caBundle of an existing configuration (`--self-managed-certs`
    /// without `--register`: someone else installs the configuration).
    CaBundleOnly,
}

/// One pass: honour the marker, then create or update the configuration.
///
/// Order matters with several replicas: the configuration is read *before*
/// the CA bundle, and written with that read's resourceVersion. A replica
/// whose bundle is older than another replica's write therefore gets a
/// conflict instead of removing a CA the API server already needs.
pub async fn reconcile(
    client: &Client,
    s: &Settings,
    source: &CaSource,
    scope: Scope,
) -> Result<Reconciled> {
    if let Some(since) = break_glass_marker(client, s).await? {
        tracing::debug!(marker = %since, "break-glass marker set; not registering");
        return Ok(Reconciled::Paused);
    }
    let api: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    let existing = api
        .get_opt(&s.config_name)
        .await
        .with_context(|| format!("reading MutatingWebhookConfiguration {}", s.config_name))?;
    let ca = read_ca(client, s, source).await?;
    let result = match (existing, scope) {
        (None, Scope::CaBundleOnly) => return Ok(Reconciled::Absent),
        (None, Scope::Register) => {
            let owner = namespace_owner(client, s).await;
            api.create(
                &PostParams::default(),
                &webhook_configuration(s, &ca, owner),
            )
            .await
            .with_context(|| format!("creating MutatingWebhookConfiguration {}", s.config_name))?;
            Reconciled::Created
        }
        (Some(mut current), scope) => {
            let desired = match scope {
                Scope::Register => {
                    let owner = current
                        .metadata
                        .owner_references
                        .as_ref()
                        .and_then(|o| o.first().cloned());
                    let owner = match owner {
                        Some(o) => Some(o),
                        None => namespace_owner(client, s).await,
                    };
                    webhook_configuration(s, &ca, owner)
                }
                Scope::CaBundleOnly => {
                    let mut d = current.clone();
                    for w in d.webhooks.iter_mut().flatten() {
                        w.client_config.ca_bundle = Some(ByteString(ca.clone()));
                    }
                    d
                }
            };
            let same = current.webhooks == desired.webhooks
                && labels_include(&current.metadata, &desired.metadata);
            if same {
                Reconciled::Unchanged
            } else {
                current.webhooks = desired.webhooks;
                let labels = current.metadata.labels.get_or_insert_with(BTreeMap::new);
                labels.extend(desired.metadata.labels.unwrap_or_default());
                if current.metadata.owner_references.is_none() {
                    current.metadata.owner_references = desired.metadata.owner_references;
                }
                api.replace(&s.config_name, &PostParams::default(), &current)
                    .await
                    .with_context(|| {
                        format!("updating MutatingWebhookConfiguration {}", s.config_name)
                    })?;
                Reconciled::Updated
            }
        }
    };
    // A break-glass that started between our read of the marker and our
    // write must win: re-read it and undo what we just wrote.
    if result != Reconciled::Unchanged && break_glass_marker(client, s).await?.is_some() {
        delete_configurations(client, s).await?;
        return Ok(Reconciled::Paused);
    }
    Ok(result)
}

fn labels_include(have: &ObjectMeta, want: &ObjectMeta) -> bool {
    let empty = BTreeMap::new();
    let have = have.labels.as_ref().unwrap_or(&empty);
    want.labels
        .iter()
        .flatten()
        .all(|(k, v)| have.get(k) == Some(v))
}

/// Keeps the configuration registered (or its caBundle current) for the
/// life of the process: first once Ready (never before, so the API server is
/// never sent to a replica that cannot answer), then every `interval`.
pub async fn run(
    client: Client,
    s: Settings,
    source: CaSource,
    scope: Scope,
    ready: impl std::future::Future<Output = ()>,
    metrics: Arc<Metrics>,
) {
    ready.await;
    let mut last: Option<Reconciled> = None;
    let mut failures = 0u32;
    loop {
        let pause = match reconcile(&client, &s, &source, scope).await {
            Ok(r) => {
                failures = 0;
                metrics.cluster("webhook_configuration", r.as_str());
                metrics.break_glass.set(i64::from(r == Reconciled::Paused));
                if last != Some(r) && r != Reconciled::Unchanged {
                    match r {
                        Reconciled::Paused => tracing::warn!(
                            configmap = %format!("{}/{}", s.namespace, s.state_configmap),
                            "break-glass marker set: not registering the webhook until `sigil break-glass --end`"
                        ),
                        Reconciled::Absent => tracing::info!(
                            config = %s.config_name,
                            "no MutatingWebhookConfiguration to put the CA bundle into yet"
                        ),
                        _ => tracing::info!(
                            config = %s.config_name,
                            result = r.as_str(),
                            failure_policy = s.failure_policy.as_str(),
                            "webhook configuration registered"
                        ),
                    }
                }
                last = Some(r);
                s.interval
            }
            Err(e) => {
                failures += 1;
                metrics.cluster("webhook_configuration", "error");
                if failures == 1 || failures.is_multiple_of(10) {
                    tracing::warn!(error = %e, failures, "registering the webhook failed; retrying (serving is not affected)");
                }
                // Back off, but never wait longer than the normal interval.
                (Duration::from_millis(200) * failures.min(50)).min(s.interval)
            }
        };
        tokio::time::sleep(pause).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::FailurePolicy;

    fn settings() -> Settings {
        Settings {
            namespace: "sigil-system".into(),
            node_namespace: None,
            config_name: "sigil".into(),
            service: "sigil".into(),
            service_port: 443,
            url: None,
            failure_policy: FailurePolicy::Fail,
            timeout_seconds: 10,
            state_configmap: "sigil-state".into(),
            interval: Duration::from_secs(30),
            custom_kinds: Default::default(),
        }
    }

    /// Evaluates a label selector the way the API server does for the
    /// operators sigil uses (In, NotIn, Exists, DoesNotExist).
    fn selects(sel: &LabelSelector, labels: &BTreeMap<String, String>) -> bool {
        sel.match_labels
            .iter()
            .flatten()
            .all(|(k, v)| labels.get(k) == Some(v))
            && sel.match_expressions.iter().flatten().all(|r| {
                let v = labels.get(&r.key);
                let vals = r.values.clone().unwrap_or_default();
                match r.operator.as_str() {
                    "In" => v.is_some_and(|v| vals.contains(v)),
                    "NotIn" => v.is_none_or(|v| !vals.contains(v)),
                    "Exists" => v.is_some(),
                    "DoesNotExist" => v.is_none(),
                    other => panic!("unexpected operator {other}"),
                }
            })
    }

    fn ns(name: &str, extra: &[(&str, &str)]) -> BTreeMap<String, String> {
        let mut l = BTreeMap::from([(NAMESPACE_NAME_LABEL.to_owned(), name.to_owned())]);
        for (k, v) in extra {
            l.insert((*k).into(), (*v).into());
        }
        l
    }

    #[test]
    fn namespace_selector_exempts_kube_system_own_namespace_and_ignore_label() {
        let sel = namespace_selector("sigil-system", None);
        assert!(!selects(&sel, &ns("kube-system", &[])));
        assert!(!selects(&sel, &ns("sigil-system", &[])));
        assert!(!selects(&sel, &ns("team-a", &[(IGNORE_LABEL, "true")])));
        assert!(!selects(&sel, &ns("team-a", &[(IGNORE_LABEL, "")])));
        assert!(selects(&sel, &ns("team-a", &[])));
        assert!(selects(&sel, &ns("default", &[("sigil.dev/other", "x")])));
        // The node tier's namespace only when it is named.
        assert!(selects(&sel, &ns("sigil-node", &[])));
        let sel = namespace_selector("sigil-system", Some("sigil-node"));
        assert!(!selects(&sel, &ns("sigil-node", &[])));
        assert!(!selects(&sel, &ns("sigil-system", &[])));
        assert!(selects(&sel, &ns("team-a", &[])));
        // Named twice (or as kube-system), it is listed once.
        let sel = namespace_selector("kube-system", Some("kube-system"));
        let values = &sel.match_expressions.as_ref().unwrap()[0].values;
        assert_eq!(values.as_deref(), Some(&["kube-system".to_owned()][..]));
    }

    #[test]
    fn configuration_has_the_safe_settings() {
        let mut s = settings();
        let c = webhook_configuration(&s, b"CA", None);
        let w = &c.webhooks.as_ref().unwrap()[0];
        assert_eq!(w.failure_policy.as_deref(), Some("Fail"));
        assert_eq!(w.reinvocation_policy.as_deref(), Some("IfNeeded"));
        assert_eq!(w.side_effects, "NoneOnDryRun");
        assert_eq!(w.timeout_seconds, Some(10));
        assert_eq!(w.admission_review_versions, vec!["v1"]);
        let svc = w.client_config.service.as_ref().unwrap();
        assert_eq!(
            (
                svc.namespace.as_str(),
                svc.name.as_str(),
                svc.path.as_deref()
            ),
            ("sigil-system", "sigil", Some("/mutate"))
        );
        assert_eq!(w.client_config.ca_bundle.as_ref().unwrap().0, b"CA");
        let rules = w.rules.as_ref().unwrap();
        let resources: Vec<&str> = rules
            .iter()
            .flat_map(|r| r.resources.iter().flatten().map(String::as_str))
            .collect();
        for r in [
            "pods",
            "pods/ephemeralcontainers",
            "podtemplates",
            "replicationcontrollers",
            "deployments",
            "replicasets",
            "statefulsets",
            "daemonsets",
            "jobs",
            "cronjobs",
            "containersources",
        ] {
            assert!(resources.contains(&r), "{r} not intercepted");
        }
        for r in rules {
            assert_eq!(
                r.operations.as_deref(),
                Some(&["CREATE".to_owned(), "UPDATE".to_owned()][..]),
                "DELETE and CONNECT must never reach sigil"
            );
        }
        s.failure_policy = FailurePolicy::Ignore;
        s.url = Some("https://127.0.0.1:8443/mutate".into());
        let c = webhook_configuration(&s, b"CA", None);
        let w = &c.webhooks.as_ref().unwrap()[0];
        assert_eq!(w.failure_policy.as_deref(), Some("Ignore"));
        assert!(w.client_config.service.is_none());
        // It round-trips through the typed API object unchanged.
        let json = serde_json::to_value(&c).unwrap();
        let back: MutatingWebhookConfiguration = serde_json::from_value(json).unwrap();
        assert_eq!(back, c);
    }
}
