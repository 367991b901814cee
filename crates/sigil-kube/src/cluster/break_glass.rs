//! Break-glass: the emergency switch. [`begin`] sets the marker on the state
//! ConfigMap *first*, then deletes sigil's webhook configurations (and again
//! briefly, in case a replica was mid-write); replicas do not re-register
//! while the marker is set. [`end`] clears it and records the window for the
//! audit afterwards. The in-API-server backstop stays unless asked
//! (`backstop`: then it is deleted too, and kept deleted by its own marker
//! until `end`): it keeps refusing what sigil would never admit.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Client;
use kube::api::{Api, DeleteParams, PostParams};

use super::{
    BACKSTOP_BREAK_GLASS_ANNOTATION, BREAK_GLASS_ANNOTATION, LAST_BREAK_GLASS_ANNOTATION,
    MANAGED_BY, Settings,
};
use crate::error::{Context as _, Error, Result};

/// The break-glass marker, if set: its value says since when and why.
pub async fn break_glass_marker(client: &Client, s: &Settings) -> Result<Option<String>> {
    state_annotation(client, s, BREAK_GLASS_ANNOTATION).await
}

/// One annotation of the state ConfigMap, if it and the ConfigMap exist.
pub(crate) async fn state_annotation(
    client: &Client,
    s: &Settings,
    key: &str,
) -> Result<Option<String>> {
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &s.namespace);
    let cm = cms
        .get_opt(&s.state_configmap)
        .await
        .with_context(|| format!("reading ConfigMap {}/{}", s.namespace, s.state_configmap))?;
    Ok(cm.and_then(|c| c.metadata.annotations.and_then(|mut a| a.remove(key))))
}

/// Deletes sigil's configuration (by name, and any other carrying its
/// managed-by label). Returns the names deleted.
pub async fn delete_configurations(client: &Client, s: &Settings) -> Result<Vec<String>> {
    let api: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    let mut names = vec![s.config_name.clone()];
    let selector = format!("{}={}", MANAGED_BY.0, MANAGED_BY.1);
    match api
        .list(&kube::api::ListParams::default().labels(&selector))
        .await
    {
        Ok(list) => names.extend(list.items.into_iter().filter_map(|c| c.metadata.name)),
        Err(e) => {
            tracing::warn!(error = %e, "listing webhook configurations by label failed; deleting by name only")
        }
    }
    names.sort();
    names.dedup();
    let mut deleted = Vec::new();
    for name in names {
        match api.delete(&name, &DeleteParams::default()).await {
            Ok(_) => deleted.push(name),
            Err(kube::Error::Api(st)) if st.is_not_found() => {}
            Err(e) => {
                return Err(e)
                    .with_context(|| format!("deleting MutatingWebhookConfiguration {name}"));
            }
        }
    }
    Ok(deleted)
}

/// Deletes the in-API-server backstop (`sigil backstop`): its bindings
/// first, so no request meets a binding without its policy, then the
/// policies. Returns `Kind/name` of what was deleted.
pub async fn delete_backstop(client: &Client) -> Result<Vec<String>> {
    let names = [
        sigil_core::backstop::NAME.to_owned(),
        format!("{}-warn", sigil_core::backstop::NAME),
    ];
    let mut deleted = Vec::new();
    let bindings: Api<ValidatingAdmissionPolicyBinding> = Api::all(client.clone());
    let policies: Api<ValidatingAdmissionPolicy> = Api::all(client.clone());
    for name in &names {
        match bindings.delete(name, &DeleteParams::default()).await {
            Ok(_) => deleted.push(format!("ValidatingAdmissionPolicyBinding/{name}")),
            Err(kube::Error::Api(st)) if st.is_not_found() => {}
            Err(e) => {
                return Err(e)
                    .with_context(|| format!("deleting ValidatingAdmissionPolicyBinding {name}"));
            }
        }
    }
    for name in &names {
        match policies.delete(name, &DeleteParams::default()).await {
            Ok(_) => deleted.push(format!("ValidatingAdmissionPolicy/{name}")),
            Err(kube::Error::Api(st)) if st.is_not_found() => {}
            Err(e) => {
                return Err(e)
                    .with_context(|| format!("deleting ValidatingAdmissionPolicy {name}"));
            }
        }
    }
    Ok(deleted)
}

/// Sets (`Some(reason)`) or clears (`None`) the break-glass marker, creating
/// the ConfigMap if needed; with `backstop`, the marker that keeps replicas
/// from re-registering the backstop too ([`BACKSTOP_BREAK_GLASS_ANNOTATION`]).
/// Clearing clears both and records the ended window in
/// [`LAST_BREAK_GLASS_ANNOTATION`]. Returns the previous marker.
pub async fn set_break_glass(
    client: &Client,
    s: &Settings,
    marker: Option<String>,
    backstop: bool,
    now: &str,
) -> Result<Option<String>> {
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &s.namespace);
    // Optimistic concurrency: retry on conflict with a fresh read.
    for _ in 0..5 {
        let existing = cms
            .get_opt(&s.state_configmap)
            .await
            .with_context(|| format!("reading ConfigMap {}/{}", s.namespace, s.state_configmap))?;
        let mut cm = existing.clone().unwrap_or_else(|| ConfigMap {
            metadata: ObjectMeta {
                name: Some(s.state_configmap.clone()),
                namespace: Some(s.namespace.clone()),
                labels: Some(BTreeMap::from([(
                    MANAGED_BY.0.to_owned(),
                    MANAGED_BY.1.to_owned(),
                )])),
                ..ObjectMeta::default()
            },
            ..ConfigMap::default()
        });
        let ann = cm.metadata.annotations.get_or_insert_with(BTreeMap::new);
        let previous = ann.get(BREAK_GLASS_ANNOTATION).cloned();
        match &marker {
            Some(m) => {
                ann.insert(BREAK_GLASS_ANNOTATION.into(), m.clone());
                if backstop {
                    ann.insert(BACKSTOP_BREAK_GLASS_ANNOTATION.into(), m.clone());
                } else {
                    ann.remove(BACKSTOP_BREAK_GLASS_ANNOTATION);
                }
            }
            None => {
                ann.remove(BACKSTOP_BREAK_GLASS_ANNOTATION);
                if let Some(p) = ann.remove(BREAK_GLASS_ANNOTATION) {
                    ann.insert(
                        LAST_BREAK_GLASS_ANNOTATION.into(),
                        format!("{p}; ended={now}"),
                    );
                }
            }
        }
        let written = if existing.is_some() {
            cms.replace(&s.state_configmap, &PostParams::default(), &cm)
                .await
        } else {
            cms.create(&PostParams::default(), &cm).await
        };
        match written {
            Ok(_) => return Ok(previous),
            Err(kube::Error::Api(st)) if st.is_conflict() || st.is_already_exists() => continue,
            Err(e) => {
                return Err(e).with_context(|| {
                    format!("writing ConfigMap {}/{}", s.namespace, s.state_configmap)
                });
            }
        }
    }
    Err(Error::Invalid(format!(
        "ConfigMap {}/{} kept changing under us; try again",
        s.namespace, s.state_configmap
    )))
}

/// What [`begin`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Begun {
    /// The marker now set (`since=…; by=…; reason=…`).
    pub marker: String,
    /// The marker it replaced, if break-glass was already on.
    pub previous: Option<String>,
    /// Configurations deleted, sorted.
    pub deleted: Vec<String>,
    /// Backstop objects deleted (`Kind/name`), with `backstop`.
    pub backstop_deleted: Vec<String>,
}

/// Turns break-glass on: the marker first, so no replica re-registers
/// between the delete and it; then delete, and make sure it stays deleted (a
/// replica that read "no marker" just before it was set may still write once).
/// With `backstop`, the backstop goes the same way (and replicas that
/// register it leave it deleted until [`end`]).
pub async fn begin(
    client: &Client,
    s: &Settings,
    marker: String,
    backstop: bool,
    now: &str,
) -> Result<Begun> {
    let previous = set_break_glass(client, s, Some(marker.clone()), backstop, now).await?;
    let (mut deleted, mut backstop_deleted) = (Vec::new(), Vec::new());
    for round in 0..5 {
        let d = delete_configurations(client, s).await?;
        let b = if backstop {
            delete_backstop(client).await?
        } else {
            Vec::new()
        };
        let quiet = d.is_empty() && b.is_empty();
        deleted.extend(d);
        backstop_deleted.extend(b);
        if round > 0 && quiet {
            break;
        }
        tokio::time::sleep(Duration::from_millis(400)).await;
    }
    for v in [&mut deleted, &mut backstop_deleted] {
        v.sort();
        v.dedup();
    }
    Ok(Begun {
        marker,
        previous,
        deleted,
        backstop_deleted,
    })
}

/// Turns break-glass off; returns the marker that was set, if any. Replicas
/// re-register (the webhook, and the backstop where they register it)
/// within one reconcile interval.
pub async fn end(client: &Client, s: &Settings, now: &str) -> Result<Option<String>> {
    set_break_glass(client, s, None, false, now).await
}
