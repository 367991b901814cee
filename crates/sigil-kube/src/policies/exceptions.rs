//! `ImagePolicyException` objects: put in force with the policies they
//! waive, and their `status` kept true as time passes.
//!
//! Owns turning the watched objects into sigil-core exceptions checked
//! against the combined policy (every rule named must allow exceptions, for
//! no longer than its `maxDuration` from the object's creation), the status
//! one replica writes (`state` Active/Expired/Invalid and a `Ready`
//! condition), the Event when one expires or is refused, and
//! `sigil_exceptions{state}` on every replica. Expiry needs no recompute:
//! each decision compares `expires` with its own clock, so an exception stops
//! waiving the second it expires; this module only wakes then to say so.
//! What an exception means is sigil-core's ([`sigil_core::exception`]).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::{Event as KubeEvent, EventType, Recorder, Reporter};
use kube::{Client, Resource, ResourceExt as _};
use serde_json::json;
use sigil_core::Policy;
use sigil_core::exception::{Exception, ExceptionState};

use super::Combiner;
use crate::crd::{Condition, ExceptionStatus, ImagePolicyException};

/// What sigil made of one exception object.
#[derive(Debug, Clone)]
pub(super) struct Entry {
    accepted: bool,
    /// Why it was refused, or what it waives.
    message: String,
    expires: i64,
    expires_text: String,
    generation: Option<i64>,
    reference: ObjectReference,
}

impl Entry {
    fn state(&self, now: i64) -> ExceptionState {
        ExceptionState::at(self.accepted, self.expires, now)
    }
}

/// The clock, in unix seconds.
fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

/// Checks every exception object against `policy` and attaches the
/// accepted ones; returns what became of each, by (namespace, name).
pub(super) fn attach(
    policy: &mut Policy,
    objects: &[Arc<ImagePolicyException>],
) -> HashMap<(String, String), Entry> {
    let now = unix_now();
    let mut out = HashMap::new();
    for o in objects {
        let (ns, name) = (o.namespace().unwrap_or_default(), o.name_any());
        let created = o
            .metadata
            .creation_timestamp
            .as_ref()
            .map(|t| t.0.as_second());
        let doc = json!({"apiVersion": "sigil.dev/v1alpha1", "kind": sigil_core::exception::KIND,
            "metadata": {"name": name, "namespace": ns}, "spec": o.spec});
        let compiled = Exception::from_value(doc).map_err(|e| e.to_string());
        let (accepted, message, expires, expires_text) = match compiled {
            Ok(mut e) => {
                e.created = created;
                let (expires, text) = (e.expires, e.expires_text.clone());
                let waives = e
                    .rules
                    .iter()
                    .map(|r| format!("{} rule {}", r.policy, r.rule))
                    .collect::<Vec<_>>()
                    .join(", ");
                match policy.accepts(&e, created.unwrap_or(now)) {
                    Ok(()) => {
                        let _ = policy.add_exception(e);
                        (true, format!("waives {waives} until {text}"), expires, text)
                    }
                    Err(m) => (false, m, expires, text),
                }
            }
            Err(m) => (false, m, i64::MAX, o.spec.expires.clone()),
        };
        out.insert(
            (ns, name),
            Entry {
                accepted,
                message,
                expires,
                expires_text,
                generation: o.metadata.generation,
                reference: o.object_ref(&()),
            },
        );
    }
    out
}

/// How long until the next exception expires (at most `cap`).
fn until_next_expiry(
    entries: &HashMap<(String, String), Entry>,
    now: i64,
    cap: Duration,
) -> Duration {
    entries
        .values()
        .filter(|e| e.accepted && e.expires > now)
        .map(|e| Duration::from_secs((e.expires - now).unsigned_abs()))
        .min()
        .map_or(cap, |d| d.min(cap))
}

fn desired(e: &Entry, now: i64, before: Option<&Condition>) -> ExceptionStatus {
    let state = e.state(now);
    let (ready, reason, message, label) = match state {
        ExceptionState::Active => (true, "Active", e.message.clone(), "Active"),
        ExceptionState::Expired => (
            false,
            "Expired",
            format!(
                "expired at {}; the rules it waived apply again (delete it, or create a new exception if the platform allows)",
                e.expires_text
            ),
            "Expired",
        ),
        ExceptionState::Invalid => (false, "Refused", e.message.clone(), "Invalid"),
    };
    let status = if ready { "True" } else { "False" };
    let last_transition_time = match before {
        Some(b) if b.status == status && b.reason == reason => b.last_transition_time.clone(),
        _ => humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string(),
    };
    ExceptionStatus {
        observed_generation: e.generation,
        state: Some(label.into()),
        conditions: vec![Condition {
            type_: "Ready".into(),
            status: status.into(),
            reason: reason.into(),
            message,
            observed_generation: e.generation,
            last_transition_time,
        }],
    }
}

impl Combiner {
    /// Keeps `sigil_exceptions{state}` true on this replica as exceptions
    /// expire: runs until the process ends.
    pub(super) async fn count_exceptions(self: Arc<Self>) {
        loop {
            let notified = self.changed.notified();
            let now = unix_now();
            let wait = {
                let entries = self.exceptions.lock().unwrap_or_else(|e| e.into_inner());
                self.metrics
                    .set_exceptions(entries.values().map(|e| e.state(now).as_str()));
                until_next_expiry(&entries, now, Duration::from_secs(60))
            };
            tokio::select! {
                () = notified => {}
                () = tokio::time::sleep(wait + Duration::from_millis(50)) => {}
            }
        }
    }

    /// Writes exceptions' status while `leading` is true (and an Event when
    /// one expires or is refused): runs until the process ends.
    pub(super) async fn write_exception_status(
        self: Arc<Self>,
        client: Client,
        instance: String,
        mut leading: tokio::sync::watch::Receiver<bool>,
    ) {
        let recorder = Recorder::new(
            client.clone(),
            Reporter {
                controller: "sigil.dev/exceptions".into(),
                instance: Some(instance),
            },
        );
        let mut written: HashMap<(String, String), ExceptionStatus> = HashMap::new();
        loop {
            if !*leading.borrow() {
                written.clear();
            }
            if leading.wait_for(|l| *l).await.is_err() {
                return;
            }
            let notified = self.changed.notified();
            let now = unix_now();
            let entries = self
                .exceptions
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone();
            for ((ns, name), e) in &entries {
                let Some(current) = self
                    .exception_store
                    .state()
                    .into_iter()
                    .find(|o| o.name_any() == *name && o.namespace().as_deref() == Some(ns))
                else {
                    continue;
                };
                let status = current.status.clone();
                let before = status
                    .as_ref()
                    .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Ready").cloned());
                let next = desired(e, now, before.as_ref());
                let key = (ns.clone(), name.clone());
                if status.as_ref() == Some(&next) || written.get(&key) == Some(&next) {
                    continue;
                }
                let was = status.as_ref().and_then(|s| s.state.clone());
                let result = Api::<ImagePolicyException>::namespaced(client.clone(), ns)
                    .patch_status(
                        name,
                        &PatchParams::default(),
                        &Patch::Merge(json!({"status": next})),
                    )
                    .await;
                if let Err(err) = result {
                    tracing::warn!(namespace = %ns, name = %name, error = %err, "writing ImagePolicyException status failed (grant patch on imagepolicyexceptions/status: ClusterRole sigil-policies)");
                    continue;
                }
                let event = match (next.state.as_deref(), was.as_deref()) {
                    (Some("Expired"), Some("Expired")) | (Some("Invalid"), Some("Invalid")) => None,
                    (Some("Expired"), _) => Some((
                        EventType::Normal,
                        "ExceptionExpired",
                        format!(
                            "expired at {}: the rules it waived apply to its images again",
                            e.expires_text
                        ),
                    )),
                    (Some("Invalid"), _) => {
                        Some((EventType::Warning, "ExceptionRefused", e.message.clone()))
                    }
                    _ => None,
                };
                if let Some((type_, reason, note)) = event {
                    let ev = KubeEvent {
                        type_,
                        reason: reason.into(),
                        note: Some(crate::cluster::event_note(&note)),
                        action: "Waive".into(),
                        secondary: None,
                    };
                    if let Err(err) = recorder.publish(&ev, &e.reference).await {
                        tracing::warn!(error = %err, "publishing an exception Event failed");
                    }
                }
                written.insert(key, next);
            }
            let wait = until_next_expiry(&entries, now, Duration::from_secs(10));
            tokio::select! {
                () = notified => {}
                () = tokio::time::sleep(wait + Duration::from_millis(50)) => {}
                _ = leading.changed() => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(accepted: bool, expires: i64) -> Entry {
        Entry {
            accepted,
            message: "m".into(),
            expires,
            expires_text: "t".into(),
            generation: Some(1),
            reference: ObjectReference::default(),
        }
    }

    #[test]
    fn the_next_wake_is_the_next_expiry() {
        let m = HashMap::from([
            (("a".into(), "1".into()), entry(true, 100)),
            (("a".into(), "2".into()), entry(true, 130)),
            (("a".into(), "3".into()), entry(false, 105)),
        ]);
        let cap = Duration::from_secs(60);
        assert_eq!(until_next_expiry(&m, 90, cap), Duration::from_secs(10));
        assert_eq!(until_next_expiry(&m, 100, cap), Duration::from_secs(30));
        assert_eq!(until_next_expiry(&m, 200, cap), cap);
        assert_eq!(entry(true, 100).state(99), ExceptionState::Active);
        assert_eq!(entry(true, 100).state(100), ExceptionState::Expired);
        let s = desired(&entry(true, 100), 100, None);
        assert_eq!(s.state.as_deref(), Some("Expired"));
        assert_eq!(s.conditions[0].status, "False");
    }
}
