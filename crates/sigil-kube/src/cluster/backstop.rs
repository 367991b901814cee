//! Keeping the in-API-server backstop registered (`sigil serve
//! --register-backstop`): the ValidatingAdmissionPolicies and bindings
//! `sigil_core::backstop` generates from the policy in force (policy
//! objects included), written beside the webhook configuration with the
//! same ownership (sigil's Namespace: uninstalling removes them) and the
//! same label, first once Ready, then on every change of the policy in
//! force and every reconcile interval.
//!
//! Written by server-side apply with one field manager: re-applying what is
//! already there writes nothing (the API server defaults fields of these
//! objects, so comparing specs ourselves would rewrite them every interval),
//! and a hand edit of a field sigil owns is put back. A field sigil does
//! not set but that changes what the backstop checks (`matchConditions`,
//! `paramKind`, excluded resources, a binding's `matchResources` or
//! `paramRef`: [`foreign_fields`]) is removed too, so the whole spec sigil
//! owns is the policy's. A backstop the API server cannot take (too large:
//! `Backstop::unfit`) is deleted rather than left stale, with a warning,
//! an Event on sigil's Namespace and `sigil_backstop_in_sync` 0. A warn pair the policy
//! no longer needs is deleted (binding first). Paused while
//! `sigil break-glass --backstop` holds its annotation on the state
//! ConfigMap; a write that raced with it is undone. It does not decide
//! what the backstop says (sigil-core) and never touches the webhook
//! configuration.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use kube::Client;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use serde_json::Value;
use sigil_core::backstop::{Backstop, NAME};

use super::registration::{Reconciled, namespace_owner};
use super::{BACKSTOP_BREAK_GLASS_ANNOTATION, MANAGED_BY, Settings};
use crate::InForce;
use crate::error::{Context as _, Error, Result};
use crate::metrics::Metrics;

/// The field manager of sigil's server-side applies.
const FIELD_MANAGER: &str = "sigil";

/// The `break-glass --backstop` marker, if set.
pub async fn paused(client: &Client, s: &Settings) -> Result<Option<String>> {
    super::break_glass::state_annotation(client, s, BACKSTOP_BREAK_GLASS_ANNOTATION).await
}

/// One object as sigil applies it: its labels plus sigil's, owned by
/// sigil's Namespace when that could be read.
fn owned(
    mut obj: Value,
    owner: Option<&k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference>,
) -> Value {
    let meta = &mut obj["metadata"];
    meta["labels"][MANAGED_BY.0] = Value::from(MANAGED_BY.1);
    if let Some(o) = owner
        && let Ok(o) = serde_json::to_value(o)
    {
        meta["ownerReferences"] = Value::Array(vec![o]);
    }
    obj
}

/// The fields of a live backstop object (its `spec`) that sigil never
/// sets and that change what it checks: a hand edit such as
/// `matchConditions: [{expression: "false"}]` switches it off without
/// touching a field sigil owns. Defaults the API server fills in are not
/// listed (`matchPolicy: Equivalent`, empty selectors, `scope: "*"`).
pub fn foreign_fields(live: &Value) -> Vec<String> {
    let spec = &live["spec"];
    let mut out = Vec::new();
    let empty = |v: &Value| v.is_null() || v.as_object().is_some_and(|o| o.is_empty());
    let ours = |allowed: &[&str], at: &Value, path: &str, out: &mut Vec<String>| {
        for k in at.as_object().into_iter().flat_map(|o| o.keys()) {
            if !allowed.contains(&k.as_str()) {
                out.push(format!("{path}{k}"));
            }
        }
    };
    match live["kind"].as_str() {
        Some("ValidatingAdmissionPolicy") => {
            ours(
                &[
                    "failurePolicy",
                    "matchConstraints",
                    "variables",
                    "validations",
                ],
                spec,
                "",
                &mut out,
            );
            let mc = &spec["matchConstraints"];
            ours(
                &[
                    "resourceRules",
                    "namespaceSelector",
                    "objectSelector",
                    "matchPolicy",
                ],
                mc,
                "matchConstraints.",
                &mut out,
            );
            if !empty(&mc["objectSelector"]) {
                out.push("matchConstraints.objectSelector".into());
            }
            if !(mc["matchPolicy"].is_null() || mc["matchPolicy"] == "Equivalent") {
                out.push("matchConstraints.matchPolicy".into());
            }
        }
        Some("ValidatingAdmissionPolicyBinding") => {
            ours(
                &["policyName", "validationActions", "matchResources"],
                spec,
                "",
                &mut out,
            );
            let mr = &spec["matchResources"];
            let defaulted = mr.as_object().is_none_or(|o| {
                o.iter().all(|(k, v)| match k.as_str() {
                    "namespaceSelector" | "objectSelector" => empty(v),
                    "matchPolicy" => v == "Equivalent",
                    _ => false,
                })
            });
            if !defaulted {
                out.push("matchResources".into());
            }
        }
        _ => {}
    }
    out
}

/// Removes [`foreign_fields`] from `live` (the object as the apply left
/// it) by a merge patch setting each to null (a changed `matchResources`
/// or selector is dropped whole and the API server defaults it again).
/// True if it removed any.
async fn remove_foreign<K>(api: &Api<K>, name: &str, live: &K) -> Result<bool>
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + serde::Serialize,
{
    let kind = K::kind(&());
    let live = serde_json::to_value(live).unwrap_or_default();
    let foreign = foreign_fields(&serde_json::json!({"kind": kind, "spec": live["spec"]}));
    if foreign.is_empty() {
        return Ok(false);
    }
    let mut patch = serde_json::json!({"spec": {}});
    for f in &foreign {
        match f.split_once('.') {
            Some((a, b)) => patch["spec"][a][b] = Value::Null,
            None => patch["spec"][f.as_str()] = Value::Null,
        }
    }
    tracing::warn!(object = %format!("{kind}/{name}"), fields = ?foreign, "removing fields sigil does not set from the backstop (a hand edit would change what it checks)");
    api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .with_context(|| format!("removing {foreign:?} from {kind} {name}"))?;
    Ok(true)
}

/// Applies one object; what it did, by its resourceVersion before and after.
async fn apply<K>(api: &Api<K>, name: &str, obj: &Value) -> Result<Reconciled>
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + serde::Serialize,
{
    let kind = K::kind(&());
    let before = api
        .get_opt(name)
        .await
        .with_context(|| format!("reading {kind} {name}"))?
        .and_then(|o| o.meta().resource_version.clone());
    let after = api
        .patch(
            name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(obj),
        )
        .await
        .with_context(|| format!("applying {kind} {name}"))?;
    if remove_foreign(api, name, &after).await? {
        return Ok(Reconciled::Updated);
    }
    Ok(match before {
        None => Reconciled::Created,
        Some(rv) if Some(&rv) == after.meta().resource_version.as_ref() => Reconciled::Unchanged,
        Some(_) => Reconciled::Updated,
    })
}

/// Deletes one object sigil registered (by its label); true if it did.
async fn delete_own<K>(api: &Api<K>, name: &str) -> Result<bool>
where
    K: kube::Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let kind = K::kind(&());
    let Some(o) = api
        .get_opt(name)
        .await
        .with_context(|| format!("reading {kind} {name}"))?
    else {
        return Ok(false);
    };
    let ours = o
        .meta()
        .labels
        .as_ref()
        .and_then(|l| l.get(MANAGED_BY.0))
        .is_some_and(|v| v == MANAGED_BY.1);
    if !ours {
        return Ok(false);
    }
    match api.delete(name, &DeleteParams::default()).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(st)) if st.is_not_found() => Ok(false),
        Err(e) => Err(e).with_context(|| format!("deleting {kind} {name}")),
    }
}

/// One pass: honour `break-glass --backstop`, apply every generated
/// object in order (each policy before its binding), delete the warn pair
/// the policy no longer has.
pub async fn reconcile(client: &Client, s: &Settings, backstop: &Backstop) -> Result<Reconciled> {
    if paused(client, s).await?.is_some() {
        return Ok(Reconciled::Paused);
    }
    let owner = namespace_owner(client, s).await;
    let policies: Api<ValidatingAdmissionPolicy> = Api::all(client.clone());
    let bindings: Api<ValidatingAdmissionPolicyBinding> = Api::all(client.clone());
    let mut result = Reconciled::Unchanged;
    let mut wanted = Vec::new();
    for obj in &backstop.objects {
        let name = obj["metadata"]["name"]
            .as_str()
            .ok_or_else(|| Error::Invalid("a generated backstop object has no name".into()))?
            .to_owned();
        let obj = owned(obj.clone(), owner.as_ref());
        let did = match obj["kind"].as_str() {
            Some("ValidatingAdmissionPolicy") => apply(&policies, &name, &obj).await?,
            Some("ValidatingAdmissionPolicyBinding") => apply(&bindings, &name, &obj).await?,
            other => {
                return Err(Error::Invalid(format!(
                    "a generated backstop object of kind {other:?}"
                )));
            }
        };
        result = merge(result, did);
        wanted.push(name);
    }
    for name in [NAME.to_owned(), format!("{NAME}-warn")] {
        if wanted.contains(&name) {
            continue;
        }
        let gone = delete_own(&bindings, &name).await?;
        if delete_own(&policies, &name).await? || gone {
            result = merge(result, Reconciled::Updated);
        }
    }
    // A `break-glass --backstop` that started between our read of its
    // marker and our writes must win.
    if result != Reconciled::Unchanged && paused(client, s).await?.is_some() {
        super::break_glass::delete_backstop(client).await?;
        return Ok(Reconciled::Paused);
    }
    Ok(result)
}

fn merge(a: Reconciled, b: Reconciled) -> Reconciled {
    match (a, b) {
        (Reconciled::Unchanged, x) | (x, Reconciled::Unchanged) => x,
        (Reconciled::Created, _) | (_, Reconciled::Created) => Reconciled::Created,
        (x, _) => x,
    }
}

/// Keeps the backstop registered and equal to the policy in force for the
/// life of the process: first once Ready, then whenever the policy in force
/// changes (checked every second, by pointer) and every `s.interval`.
/// `sigil_backstop_in_sync` says whether the last pass left it so.
pub async fn run(
    client: Client,
    s: Settings,
    in_force: Arc<dyn InForce>,
    ready: impl std::future::Future<Output = ()>,
    metrics: Arc<Metrics>,
) {
    ready.await;
    let opts = sigil_core::backstop::Options {
        namespace: s.namespace.clone(),
        node_namespace: s.node_namespace.clone(),
    };
    let mut last: Option<Reconciled> = None;
    let mut failures = 0u32;
    loop {
        let policy = in_force.policy();
        let backstop = sigil_core::backstop::generate(&policy, &opts);
        if !backstop.unfit.is_empty() {
            let pause = unfit(&client, &s, &backstop.unfit, &metrics, last.is_none()).await;
            last = None;
            let until = tokio::time::Instant::now() + pause;
            while tokio::time::Instant::now() < until && Arc::ptr_eq(&in_force.policy(), &policy) {
                tokio::time::sleep(Duration::from_secs(1).min(pause)).await;
            }
            continue;
        }
        let pause = match reconcile(&client, &s, &backstop).await {
            Ok(r) => {
                failures = 0;
                metrics.cluster("backstop", r.as_str());
                metrics.set_backstop_in_sync(r != Reconciled::Paused);
                if last != Some(r) && r != Reconciled::Unchanged {
                    match r {
                        Reconciled::Paused => tracing::warn!(
                            configmap = %format!("{}/{}", s.namespace, s.state_configmap),
                            "break-glass --backstop: not registering the backstop until `sigil break-glass --end`"
                        ),
                        _ => tracing::info!(
                            policy = %policy.name,
                            result = r.as_str(),
                            left_to_webhook = backstop.left_to_webhook.len(),
                            "backstop registered (ValidatingAdmissionPolicy {NAME})"
                        ),
                    }
                }
                last = Some(r);
                s.interval
            }
            Err(e) => {
                failures += 1;
                metrics.cluster("backstop", "error");
                metrics.set_backstop_in_sync(false);
                if failures == 1 || failures.is_multiple_of(10) {
                    tracing::warn!(error = %e, failures, "registering the backstop failed; retrying (serving is not affected)");
                }
                (Duration::from_millis(200) * failures.min(50)).min(s.interval)
            }
        };
        // Wait out the pause, or less if the policy in force changes.
        let until = tokio::time::Instant::now() + pause;
        while tokio::time::Instant::now() < until && Arc::ptr_eq(&in_force.policy(), &policy) {
            tokio::time::sleep(Duration::from_secs(1).min(pause)).await;
        }
    }
}

/// The policy in force makes a backstop the API server would refuse: the
/// registered one (an older policy's) is deleted, never left stale, and it
/// is said (log, an Event on sigil's Namespace, `sigil_backstop_in_sync`
/// 0). Returns how long to wait before looking again.
async fn unfit(
    client: &Client,
    s: &Settings,
    why: &[String],
    metrics: &Metrics,
    first: bool,
) -> Duration {
    metrics.set_backstop_in_sync(false);
    metrics.cluster("backstop", "unfit");
    let removed = match super::break_glass::delete_backstop(client).await {
        Ok(r) => r,
        Err(e) => {
            tracing::warn!(error = %e, "deleting the backstop the policy in force no longer fits failed; retrying");
            return Duration::from_secs(5).min(s.interval);
        }
    };
    if first || !removed.is_empty() {
        let note = format!(
            "the policy in force makes a backstop the API server cannot take, so it is not registered ({}); removed: {}. Make the policy smaller (sigil policy check says the limit)",
            why.join("; "),
            if removed.is_empty() {
                "nothing".to_owned()
            } else {
                removed.join(", ")
            }
        );
        tracing::warn!(reason = %note, "backstop not registered");
        let recorder = kube::runtime::events::Recorder::new(
            client.clone(),
            kube::runtime::events::Reporter {
                controller: "sigil.dev/backstop".into(),
                instance: None,
            },
        );
        let ns = k8s_openapi::api::core::v1::ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Namespace".into()),
            name: Some(s.namespace.clone()),
            ..Default::default()
        };
        let ev = kube::runtime::events::Event {
            type_: kube::runtime::events::EventType::Warning,
            reason: "BackstopUnfit".into(),
            note: Some(super::event_note(&note)),
            action: "Register".into(),
            secondary: None,
        };
        if let Err(e) = recorder.publish(&ev, &ns).await {
            tracing::warn!(error = %e, "publishing the backstop's Event failed");
        }
    }
    s.interval
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn regression_a_hand_edit_that_switches_the_backstop_off_is_foreign() {
        use serde_json::json;
        let vap = json!({"kind": "ValidatingAdmissionPolicy", "spec": {
            "failurePolicy": "Fail", "variables": [], "validations": [],
            "matchConstraints": {"resourceRules": [], "namespaceSelector": {}, "objectSelector": {}, "matchPolicy": "Equivalent"}}});
        assert!(foreign_fields(&vap).is_empty(), "defaults are not edits");
        let mut edited = vap.clone();
        edited["spec"]["matchConditions"] = json!([{"name": "off", "expression": "false"}]);
        edited["spec"]["matchConstraints"]["excludeResourceRules"] =
            json!([{"resources": ["pods"]}]);
        edited["spec"]["matchConstraints"]["objectSelector"] = json!({"matchLabels": {"x": "y"}});
        assert_eq!(
            foreign_fields(&edited),
            [
                "matchConditions",
                "matchConstraints.excludeResourceRules",
                "matchConstraints.objectSelector"
            ]
        );
        let binding = json!({"kind": "ValidatingAdmissionPolicyBinding", "spec": {
            "policyName": "sigil-backstop", "validationActions": ["Deny"],
            "matchResources": {"namespaceSelector": {}, "objectSelector": {}, "matchPolicy": "Equivalent"}}});
        assert!(foreign_fields(&binding).is_empty());
        let mut edited = binding.clone();
        edited["spec"]["matchResources"]["namespaceSelector"] =
            json!({"matchLabels": {"none": "x"}});
        edited["spec"]["paramRef"] = json!({"name": "x"});
        assert_eq!(foreign_fields(&edited), ["paramRef", "matchResources"]);
    }

    #[test]
    fn every_applied_object_carries_the_label_and_the_namespace_owner() {
        let b = sigil_core::backstop::generate(
            &sigil_core::Policy::embedded_default(),
            &sigil_core::backstop::Options {
                namespace: "sigil-system".into(),
                node_namespace: None,
            },
        );
        let owner = k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
            api_version: "v1".into(),
            kind: "Namespace".into(),
            name: "sigil-system".into(),
            uid: "u".into(),
            ..Default::default()
        };
        for o in b.objects {
            let o = owned(o, Some(&owner));
            assert_eq!(o["metadata"]["labels"][MANAGED_BY.0], MANAGED_BY.1);
            assert_eq!(
                o["metadata"]["labels"]["app.kubernetes.io/component"],
                "backstop"
            );
            assert_eq!(o["metadata"]["ownerReferences"][0]["kind"], "Namespace");
        }
    }

    #[test]
    fn a_pass_reports_the_strongest_thing_it_did() {
        use Reconciled::*;
        assert_eq!(merge(Unchanged, Unchanged), Unchanged);
        assert_eq!(merge(Unchanged, Updated), Updated);
        assert_eq!(merge(Updated, Created), Created);
        assert_eq!(merge(Created, Unchanged), Created);
    }
}
