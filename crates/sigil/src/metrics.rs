//! Prometheus metrics served on the admin port's `/metrics`.
//!
//! Owns every metric sigil exports and their label sets; the webhook, the
//! registry client (through [`sigil_registry::Observer`]) and the server
//! record into it. It does not serve HTTP itself.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct AdmissionLabels {
    operation: String,
    kind: String,
    decision: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RegistryLabels {
    host: String,
    method: String,
    status: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct HostLabels {
    host: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CacheLabels {
    result: &'static str,
}

/// All of sigil's metrics.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    admissions: Family<AdmissionLabels, Counter>,
    latency: Histogram,
    images: Family<OutcomeLabels, Counter>,
    registry_requests: Family<RegistryLabels, Counter>,
    registry_latency: Family<HostLabels, Histogram>,
    cache_lookups: Family<CacheLabels, Counter>,
    policy_reloads: Family<ResultLabels, Counter>,
    /// Entries in the digest cache; set at scrape time.
    pub cache_entries: Gauge,
    /// Admission requests being handled now.
    pub inflight: Gauge,
    /// 1 while draining after SIGTERM.
    pub draining: Gauge,
    /// 1 while `/readyz` answers 200.
    pub ready: Gauge,
    cluster_writes: Family<ClusterLabels, Counter>,
    /// 1 while a break-glass marker stops this replica from registering.
    pub break_glass: Gauge,
    /// Unix time at which the served certificate expires.
    pub cert_not_after: Gauge,
    verifications: Family<VerifierLabels, Counter>,
    verification_cache: Family<CacheLabels, Counter>,
    credential_lookups: Family<SourceLabels, Counter>,
    /// Pull secrets and ServiceAccounts held by the watches, by kind.
    pub pull_secrets_objects: Family<Vec<(String, String)>, Gauge>,
    /// 1 once every pull-secret watch has listed once.
    pub pull_secrets_synced: Gauge,
    /// 1 while this replica holds the audit Lease.
    pub audit_leader: Gauge,
    audit_violations: Family<AuditLabels, Gauge>,
    audit_objects: Family<ResultLabels, Gauge>,
    audit_last_success: Gauge,
    audit_duration: Gauge<f64, AtomicU64>,
    audit_runs: Family<ResultLabels, Counter>,
    audit_events: Family<ResultLabels, Counter>,
    /// Registry requests made by this process (an audit reports its own share).
    registry_requests_total: AtomicU64,
    policies: Family<PolicyLabels, Gauge>,
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
struct SourceLabels {
    source: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct VerifierLabels {
    verifier: String,
    result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ClusterLabels {
    object: &'static str,
    result: &'static str,
}

fn latency_histogram() -> Histogram {
    // 0.25 ms … ~16 s
    Histogram::new(exponential_buckets(0.000_25, 2.0, 17))
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("sigil");
        let m = Metrics {
            admissions: Family::default(),
            latency: latency_histogram(),
            images: Family::default(),
            registry_requests: Family::default(),
            registry_latency: Family::new_with_constructor(latency_histogram),
            cache_lookups: Family::default(),
            policy_reloads: Family::default(),
            cache_entries: Gauge::default(),
            inflight: Gauge::default(),
            draining: Gauge::default(),
            ready: Gauge::default(),
            cluster_writes: Family::default(),
            break_glass: Gauge::default(),
            cert_not_after: Gauge::default(),
            verifications: Family::default(),
            verification_cache: Family::default(),
            credential_lookups: Family::default(),
            pull_secrets_objects: Family::default(),
            pull_secrets_synced: Gauge::default(),
            audit_leader: Gauge::default(),
            audit_violations: Family::default(),
            audit_objects: Family::default(),
            audit_last_success: Gauge::default(),
            audit_duration: Gauge::default(),
            audit_runs: Family::default(),
            audit_events: Family::default(),
            registry_requests_total: AtomicU64::new(0),
            policies: Family::default(),
            registry: Registry::default(),
        };
        registry.register(
            "registry_credential_lookups",
            "Registry lookups answered, by the kind of credential that was accepted (secret, serviceaccount, policy, docker-config, helper, provider, anonymous)",
            m.credential_lookups.clone(),
        );
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
            "signature_verifications",
            "Signature verifier outcomes per digest checked, by verifier and result (passed, no_signature, wrong_key, digest_mismatch, identity_mismatch, chain_invalid, log_entry_invalid, malformed, level_check)",
            m.verifications.clone(),
        );
        registry.register(
            "verification_cache_lookups",
            "Verification cache lookups by result (hit, miss)",
            m.verification_cache.clone(),
        );
        registry.register(
            "admission_requests",
            "Admission requests by operation, kind and decision",
            m.admissions.clone(),
        );
        registry.register(
            "admission_duration_seconds",
            "Time to answer an admission request",
            m.latency.clone(),
        );
        registry.register(
            "images",
            "Image fields by outcome (pinned, rewritten, unchanged, denied, warned)",
            m.images.clone(),
        );
        registry.register(
            "registry_requests",
            "HTTP requests to registries by host, method and status",
            m.registry_requests.clone(),
        );
        registry.register(
            "registry_request_duration_seconds",
            "Registry request latency by host",
            m.registry_latency.clone(),
        );
        registry.register(
            "digest_cache_lookups",
            "Digest cache lookups by result (hit, miss)",
            m.cache_lookups.clone(),
        );
        registry.register(
            "policy_reloads",
            "Policy file changes by result (ok, error: the previous policy stays in force)",
            m.policy_reloads.clone(),
        );
        registry.register(
            "digest_cache_entries",
            "Entries in the digest cache",
            m.cache_entries.clone(),
        );
        registry.register(
            "admission_inflight_requests",
            "Admission requests being handled",
            m.inflight.clone(),
        );
        registry.register(
            "draining",
            "1 while the server drains after SIGTERM",
            m.draining.clone(),
        );
        registry.register("ready", "1 while /readyz answers 200", m.ready.clone());
        registry.register(
            "cluster_reconciles",
            "Reconciles of cluster objects (webhook configuration, certificate Secret) by result (unchanged, created, updated, deleted, paused, error)",
            m.cluster_writes.clone(),
        );
        registry.register(
            "break_glass",
            "1 while a break-glass marker keeps this replica from registering its webhook",
            m.break_glass.clone(),
        );
        registry.register(
            "serving_certificate_expiry_timestamp_seconds",
            "Unix time at which the served TLS certificate expires",
            m.cert_not_after.clone(),
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
            "policies",
            "Policy objects (ClusterImagePolicy, ImagePolicy) by kind and whether they are Ready",
            m.policies.clone(),
        );
        Metrics { registry, ..m }
    }
}

impl Metrics {
    /// Records one answered admission request.
    pub fn admission(
        &self,
        operation: &str,
        kind: &str,
        decision: &'static str,
        elapsed: Duration,
    ) {
        self.admissions
            .get_or_create(&AdmissionLabels {
                operation: operation.to_owned(),
                kind: kind.to_owned(),
                decision,
            })
            .inc();
        self.latency.observe(elapsed.as_secs_f64());
    }

    /// Records one image field's outcome.
    pub fn image(&self, outcome: &'static str) {
        self.images.get_or_create(&OutcomeLabels { outcome }).inc();
    }

    /// Records a policy reload attempt.
    pub fn policy_reload(&self, result: &'static str) {
        self.policy_reloads
            .get_or_create(&ResultLabels { result })
            .inc();
    }

    /// Records one reconcile of a cluster object.
    pub fn cluster(&self, object: &'static str, result: &'static str) {
        self.cluster_writes
            .get_or_create(&ClusterLabels { object, result })
            .inc();
    }

    /// Registry requests made so far by this process.
    pub fn registry_requests_total(&self) -> u64 {
        self.registry_requests_total.load(Ordering::Relaxed)
    }

    /// Publishes an audit's counts (the leader's only).
    pub fn audit_report(&self, report: &crate::audit::Report, complete: bool) {
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

    /// Prometheus text exposition.
    pub fn encode(&self) -> String {
        let mut s = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut s, &self.registry);
        s
    }
}

impl sigil_verify::Observer for Metrics {
    fn verifier(&self, verifier: &str, result: &str) {
        self.verifications
            .get_or_create(&VerifierLabels {
                verifier: verifier.to_owned(),
                result: result.to_owned(),
            })
            .inc();
    }

    fn cache(&self, hit: bool) {
        self.verification_cache
            .get_or_create(&CacheLabels {
                result: if hit { "hit" } else { "miss" },
            })
            .inc();
    }
}

impl sigil_registry::Observer for Metrics {
    fn request(&self, host: &str, method: &str, status: &str, elapsed: Duration) {
        self.registry_requests_total.fetch_add(1, Ordering::Relaxed);
        self.registry_requests
            .get_or_create(&RegistryLabels {
                host: host.to_owned(),
                method: method.to_owned(),
                status: status.to_owned(),
            })
            .inc();
        self.registry_latency
            .get_or_create(&HostLabels {
                host: host.to_owned(),
            })
            .observe(elapsed.as_secs_f64());
    }

    fn credential(&self, source: &str) {
        self.credential_lookups
            .get_or_create(&SourceLabels {
                source: source.to_owned(),
            })
            .inc();
    }

    fn cache(&self, hit: bool) {
        self.cache_lookups
            .get_or_create(&CacheLabels {
                result: if hit { "hit" } else { "miss" },
            })
            .inc();
    }
}
