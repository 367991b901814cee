//! The metric families of sigil's cluster side: reconciles of the objects
//! sigil writes, break-glass, the pull-secret watches, the policy objects
//! and the in-cluster audit.
//!
//! It owns their names, help texts and label sets, and registers them into
//! the `prometheus_client` registry the binary hands in at start (the binary
//! serves `/metrics`; nothing here encodes or serves).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;

use crate::audit::Report;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PolicyLabels {
    kind: &'static str,
    ready: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct AuditLabels {
    namespace: String,
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ClusterLabels {
    object: &'static str,
    result: &'static str,
}

/// The cluster side's metrics, registered by [`Metrics::register`].
#[derive(Debug, Default)]
pub struct Metrics {
    cluster_writes: Family<ClusterLabels, Counter>,
    /// 1 while a break-glass marker stops this replica from registering.
    pub break_glass: Gauge,
    /// Constant 1, labelled with the failure policy this replica is
    /// configured with: an alert can tell a fail-closed outage (the cluster
    /// blocks) from a fail-open one (images admitted unchecked) from the
    /// last value scraped before the replicas went away.
    webhook_info: Family<Vec<(String, String)>, Gauge>,
    /// 1 while the backstop this replica registers is in force and equal
    /// to the policy in force, 0 while it is not; absent when this replica
    /// does not register it (`--register-backstop`). Labelled with the
    /// ValidatingAdmissionPolicy's name (a family, so that it can be absent).
    backstop_in_sync: Family<Vec<(String, String)>, Gauge>,
    /// Pull secrets and ServiceAccounts held by the watches, by kind.
    pub pull_secrets_objects: Family<Vec<(String, String)>, Gauge>,
    /// 1 once every pull-secret watch has listed once.
    pub pull_secrets_synced: Gauge,
    /// 1 while this replica holds the audit Lease.
    pub audit_leader: Gauge,
    audit_violations: Family<AuditLabels, Gauge>,
    audit_objects: Family<ResultLabels, Gauge>,
    audit_backstop_refusals: Gauge,
    audit_last_success: Gauge,
    audit_duration: Gauge<f64, AtomicU64>,
    audit_runs: Family<ResultLabels, Counter>,
    audit_events: Family<ResultLabels, Counter>,
    policy_reports: Family<ResultLabels, Counter>,
    policies: Family<PolicyLabels, Gauge>,
    exceptions: Family<StateLabels, Gauge>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabels {
    state: &'static str,
}

impl Metrics {
    /// Records the failure policy this replica registers or expects.
    pub fn set_webhook_info(&self, failure_policy: crate::cluster::FailurePolicy) {
        self.webhook_info
            .get_or_create(&vec![(
                "failure_policy".to_owned(),
                failure_policy.as_str().to_owned(),
            )])
            .set(1);
    }

    /// Records whether the registered backstop matches the policy in force.
    pub fn set_backstop_in_sync(&self, in_sync: bool) {
        self.backstop_in_sync
            .get_or_create(&vec![(
                "policy".to_owned(),
                sigil_core::backstop::NAME.to_owned(),
            )])
            .set(i64::from(in_sync));
    }

    /// Creates the families and registers them into `registry`.
    pub fn register(registry: &mut Registry) -> Metrics {
        let m = Metrics::default();
        registry.register(
            "pull_secrets_objects",
            "Pull secrets (by type) and ServiceAccounts held in memory by the --pull-secrets watches",
            m.pull_secrets_objects.clone(),
        );
        registry.register(
            "pull_secrets_synced",
            "1 once every --pull-secrets watch has listed once",
            m.pull_secrets_synced.clone(),
        );
        registry.register(
            "cluster_reconciles",
            "Reconciles of cluster objects (webhook configuration, backstop, certificate Secret) by result (unchanged, created, updated, deleted, paused, error)",
            m.cluster_writes.clone(),
        );
        registry.register(
            "break_glass",
            "1 while a break-glass marker keeps this replica from registering its webhook",
            m.break_glass.clone(),
        );
        registry.register(
            "backstop_in_sync",
            "1 while the in-API-server backstop this replica registers (--register-backstop) is in force and equal to the policy in force; 0 while it is not (registration failing, or deleted by break-glass --backstop)",
            m.backstop_in_sync.clone(),
        );
        registry.register(
            "webhook_info",
            "Constant 1, labelled with the webhook's failurePolicy (Fail, Ignore) as this replica is configured",
            m.webhook_info.clone(),
        );
        registry.register(
            "audit_leader",
            "1 while this replica holds the audit Lease (exactly one replica should)",
            m.audit_leader.clone(),
        );
        registry.register(
            "audit_violations",
            "Violations found by the last audit, by namespace and reason (denied, signature, unresolvable, not_mirrored, not_pinned, drift); exported by the audit leader only",
            m.audit_violations.clone(),
        );
        registry.register(
            "audit_objects",
            "Objects in the last audit by result (compliant, violating, exempt)",
            m.audit_objects.clone(),
        );
        registry.register(
            "audit_backstop_refusals",
            "Objects in the last audit with an image the in-API-server backstop would refuse (their Pods cannot be created while the webhook is down)",
            m.audit_backstop_refusals.clone(),
        );
        registry.register(
            "audit_last_success_timestamp_seconds",
            "Unix time at which the last complete audit finished",
            m.audit_last_success.clone(),
        );
        registry.register(
            "audit_duration_seconds",
            "How long the last audit took",
            m.audit_duration.clone(),
        );
        registry.register(
            "audit_runs",
            "Audits by result (ok; error: a kind could not be listed)",
            m.audit_runs.clone(),
        );
        registry.register(
            "audit_events",
            "Audit Events by result (published, deduplicated, rate_limited, error)",
            m.audit_events.clone(),
        );
        registry.register(
            "policy_reports",
            "Policy report objects the audit wrote, by result (created, updated, deleted, error)",
            m.policy_reports.clone(),
        );
        registry.register(
            "policies",
            "Policy objects (ClusterImagePolicy, ImagePolicy) by kind and whether they are Ready",
            m.policies.clone(),
        );
        registry.register(
            "exceptions",
            "ImagePolicyExceptions by state (active, expired, invalid)",
            m.exceptions.clone(),
        );
        m
    }

    /// Counts ImagePolicyExceptions by state (every state present, 0 or more).
    pub fn set_exceptions(&self, states: impl Iterator<Item = &'static str>) {
        let mut counts =
            std::collections::BTreeMap::from([("active", 0i64), ("expired", 0), ("invalid", 0)]);
        for s in states {
            *counts.entry(s).or_default() += 1;
        }
        for (state, n) in counts {
            self.exceptions.get_or_create(&StateLabels { state }).set(n);
        }
    }

    /// Records one reconcile of a cluster object.
    pub fn cluster(&self, object: &'static str, result: &'static str) {
        self.cluster_writes
            .get_or_create(&ClusterLabels { object, result })
            .inc();
    }

    /// Publishes an audit's counts (the leader's only).
    pub fn audit_report(&self, report: &Report, complete: bool) {
        self.audit_violations.clear();
        for ns in &report.namespaces {
            for (reason, n) in &ns.by_reason {
                self.audit_violations
                    .get_or_create(&AuditLabels {
                        namespace: ns.name.clone(),
                        reason,
                    })
                    .set(i64::try_from(*n).unwrap_or(i64::MAX));
            }
        }
        self.audit_objects.clear();
        let s = &report.summary;
        for (result, n) in [
            ("compliant", s.compliant),
            ("violating", s.violating),
            ("exempt", s.exempt),
        ] {
            self.audit_objects
                .get_or_create(&ResultLabels { result })
                .set(i64::try_from(n).unwrap_or(i64::MAX));
        }
        self.audit_backstop_refusals
            .set(i64::try_from(s.backstop_refusals).unwrap_or(i64::MAX));
        self.audit_duration.set(report.duration_seconds);
        if complete {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default()
                .as_secs();
            self.audit_last_success
                .set(i64::try_from(now).unwrap_or(i64::MAX));
        }
        self.audit_runs
            .get_or_create(&ResultLabels {
                result: if complete { "ok" } else { "error" },
            })
            .inc();
    }

    /// Counts policy objects by kind and readiness.
    pub fn set_policies(&self, objects: impl Iterator<Item = (&'static str, bool)>) {
        self.policies.clear();
        for kind in ["ClusterImagePolicy", "ImagePolicy"] {
            for ready in ["true", "false"] {
                self.policies
                    .get_or_create(&PolicyLabels { kind, ready })
                    .set(0);
            }
        }
        for (kind, ready) in objects {
            self.policies
                .get_or_create(&PolicyLabels {
                    kind,
                    ready: if ready { "true" } else { "false" },
                })
                .inc();
        }
    }

    /// Withdraws the audit gauges (this replica no longer leads).
    pub fn clear_audit(&self) {
        self.audit_violations.clear();
        self.audit_objects.clear();
    }

    /// Counts one audit Event outcome.
    pub fn audit_event(&self, result: &'static str) {
        self.audit_events
            .get_or_create(&ResultLabels { result })
            .inc();
    }

    /// Counts one policy report write.
    pub fn policy_report(&self, result: &'static str) {
        self.policy_reports
            .get_or_create(&ResultLabels { result })
            .inc();
    }
}
