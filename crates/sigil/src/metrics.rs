//! Prometheus metrics served on the admin port's `/metrics`.
//!
//! Owns the registry `/metrics` encodes and the families of the serving
//! side — admission requests, images, the registry client and the verifier
//! (through their `Observer` traits), the server's state; the cluster side's
//! families are sigil-kube's, registered into the same registry
//! ([`Metrics::kube`]). It does not serve HTTP itself.

use std::sync::Arc;
use std::sync::OnceLock;
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
struct FromLabels {
    from: String,
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
    registry_breaker: Family<HostLabels, Gauge>,
    mirror_fallbacks: Family<FromLabels, Counter>,
    copies_started: Counter,
    copies: Family<ResultLabels, Counter>,
    copy_bytes: Counter,
    copy_duration: Histogram,
    cache_lookups: Family<CacheLabels, Counter>,
    policy_reloads: Family<ResultLabels, Counter>,
    /// Entries in the digest cache; set at scrape time.
    pub cache_entries: Gauge,
    /// Admission requests being handled now.
    pub inflight: Gauge,
    /// Admissions answered with an identical admission's answer
    /// (`crate::admission::reuse`).
    pub answers_reused: Counter,
    /// 1 while draining after SIGTERM.
    pub draining: Gauge,
    /// 1 while `/readyz` answers 200.
    pub ready: Gauge,
    /// Unix time at which the served certificate expires.
    pub cert_not_after: Gauge,
    verifications: Family<VerifierLabels, Counter>,
    verification_cache: Family<CacheLabels, Counter>,
    credential_lookups: Family<SourceLabels, Counter>,
    registry_probes: Family<ProbeLabels, Counter>,
    trust_root_expiry: Family<TrustRootLabels, Gauge>,
    trust_root_refreshes: Family<TrustRefreshLabels, Counter>,
    crl_fetches: Family<ResultLabels, Counter>,
    crl_next_update: Family<UrlLabels, Gauge>,
    /// Registry requests made by this process (an audit reports its own share).
    registry_requests_total: AtomicU64,
    /// Handles to the series every cached admission touches, made on first
    /// use (a family lookup hashes its labels under a lock on each call).
    hot: Hot,
    /// The cluster side's families (sigil-kube's own), in the same registry.
    pub kube: Arc<sigil_kube::Metrics>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct UrlLabels {
    url: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TrustRootLabels {
    trust_root: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TrustRefreshLabels {
    trust_root: String,
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SourceLabels {
    source: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ProbeLabels {
    host: String,
    kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct VerifierLabels {
    verifier: String,
    result: String,
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
            registry_breaker: Family::default(),
            mirror_fallbacks: Family::default(),
            copies_started: Counter::default(),
            copies: Family::default(),
            copy_bytes: Counter::default(),
            copy_duration: Histogram::new(exponential_buckets(0.05, 2.0, 14)),
            cache_lookups: Family::default(),
            policy_reloads: Family::default(),
            cache_entries: Gauge::default(),
            inflight: Gauge::default(),
            answers_reused: Counter::default(),
            draining: Gauge::default(),
            ready: Gauge::default(),
            cert_not_after: Gauge::default(),
            verifications: Family::default(),
            verification_cache: Family::default(),
            credential_lookups: Family::default(),
            registry_probes: Family::default(),
            trust_root_expiry: Family::default(),
            trust_root_refreshes: Family::default(),
            crl_fetches: Family::default(),
            crl_next_update: Family::default(),
            registry_requests_total: AtomicU64::new(0),
            hot: Hot::default(),
            registry: Registry::default(),
            kube: Arc::default(),
        };
        // Series with a known, finite set of results start at 0, as
        // Prometheus advises: an alert's `increase()` sees the first error,
        // and a dashboard shows 0 rather than nothing.
        for result in ["ok", "error"] {
            drop(m.policy_reloads.get_or_create(&ResultLabels { result }));
            drop(m.copies.get_or_create(&ResultLabels { result }));
        }
        registry.register(
            "registry_credential_lookups",
            "Registry lookups answered, by the kind of credential that was accepted (secret, serviceaccount, policy, docker-config, helper, provider, anonymous)",
            m.credential_lookups.clone(),
        );
        registry.register(
            "registry_probes",
            "What sigil asked a registry host about itself, by host and kind (auth: how it authenticates, from the first request's anonymous answer; referrers: whether it has the referrers API): once per host while the answer is kept",
            m.registry_probes.clone(),
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
            "mirror_fallbacks",
            "Images no mirror could serve, pinned at their origin instead (fallback: origin), by mirror origin",
            m.mirror_fallbacks.clone(),
        );
        registry.register(
            "mirror_copies_started",
            "Copies of images into mirrors started (mirrors[].copy, sigil mirror)",
            m.copies_started.clone(),
        );
        registry.register(
            "mirror_copies",
            "Copies of images into mirrors that ended, by result (ok, error)",
            m.copies.clone(),
        );
        registry.register(
            "mirror_copy_bytes",
            "Bytes streamed from origins into mirrors (mounted and present blobs are not counted)",
            m.copy_bytes.clone(),
        );
        registry.register(
            "mirror_copy_duration_seconds",
            "How long a copy into a mirror took, start to end",
            m.copy_duration.clone(),
        );
        registry.register(
            "registry_breaker_state",
            "Circuit breaker per registry host that has failed: 0 closed, 1 open (failing fast), 2 half-open (one probe in flight)",
            m.registry_breaker.clone(),
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
            "admission_answers_reused",
            "Admissions answered with the answer of an identical CREATE decided in the same second (same object summary, namespace and dryRun; nothing the decision read changed)",
            m.answers_reused.clone(),
        );
        registry.register(
            "draining",
            "1 while the server drains after SIGTERM",
            m.draining.clone(),
        );
        registry.register("ready", "1 while /readyz answers 200", m.ready.clone());
        registry.register(
            "serving_certificate_expiry_timestamp_seconds",
            "Unix time at which the served TLS certificate expires",
            m.cert_not_after.clone(),
        );
        registry.register(
            "trust_root_expiry_timestamp_seconds",
            "Unix time at which the TUF metadata behind a trusted root in force expires (the first of root, timestamp, snapshot, targets)",
            m.trust_root_expiry.clone(),
        );
        registry.register(
            "trust_root_refresh",
            "TUF refreshes of a trusted root, by result (changed, unchanged, error: the last good root stays in force)",
            m.trust_root_refreshes.clone(),
        );
        registry.register(
            "crl_fetch",
            "Fetches of the CRLs notation verifiers check revocation against, by result (ok, stale: past its nextUpdate, error: the last CRL fetched stays in use)",
            m.crl_fetches.clone(),
        );
        registry.register(
            "crl_next_update_timestamp_seconds",
            "nextUpdate of the CRL last fetched from a distribution point",
            m.crl_next_update.clone(),
        );
        let kube = Arc::new(sigil_kube::Metrics::register(&mut registry));
        Metrics {
            registry,
            kube,
            ..m
        }
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
        let labels = || AdmissionLabels {
            operation: operation.to_owned(),
            kind: kind.to_owned(),
            decision,
        };
        // A rollout's Pods: a CREATE of a Pod, allowed or patched.
        let hot = match (operation, kind, decision) {
            ("CREATE", "Pod", "allowed") => Some(0),
            ("CREATE", "Pod", "patched") => Some(1),
            _ => None,
        };
        match hot {
            Some(i) => handle(&self.hot.admissions[i], &self.admissions, labels).inc(),
            None => self.admissions.get_or_create(&labels()).inc(),
        };
        self.latency.observe(elapsed.as_secs_f64());
    }

    /// Records one image field's outcome.
    pub fn image(&self, outcome: &'static str) {
        let slot = match outcome {
            "unchanged" => &self.hot.images[0],
            "pinned" => &self.hot.images[1],
            "rewritten" => &self.hot.images[2],
            _ => {
                self.images.get_or_create(&OutcomeLabels { outcome }).inc();
                return;
            }
        };
        handle(slot, &self.images, || OutcomeLabels { outcome }).inc();
    }

    /// Counts an image pinned at its origin because no mirror could serve it.
    pub fn mirror_fallback(&self, from: &str) {
        self.mirror_fallbacks
            .get_or_create(&FromLabels {
                from: from.to_owned(),
            })
            .inc();
    }

    /// Records a policy reload attempt.
    pub fn policy_reload(&self, result: &'static str) {
        self.policy_reloads
            .get_or_create(&ResultLabels { result })
            .inc();
    }

    /// Registry requests made so far by this process.
    pub fn registry_requests_total(&self) -> u64 {
        self.registry_requests_total.load(Ordering::Relaxed)
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
        cache_counter(&self.hot.verification_cache, &self.verification_cache, hit).inc();
    }
}

impl sigil_verify::roots::RefreshObserver for Metrics {
    fn refreshed(&self, name: &str, outcome: sigil_verify::roots::Refreshed, expires: Option<i64>) {
        self.trust_root_refreshes
            .get_or_create(&TrustRefreshLabels {
                trust_root: name.to_owned(),
                result: outcome.as_str(),
            })
            .inc();
        if let Some(t) = expires {
            self.trust_root_expiry
                .get_or_create(&TrustRootLabels {
                    trust_root: name.to_owned(),
                })
                .set(t);
        }
    }
}

impl sigil_verify::crl::CrlObserver for Metrics {
    fn fetched(&self, url: &str, result: &str, next_update: Option<i64>) {
        self.crl_fetches
            .get_or_create(&ResultLabels {
                result: match result {
                    "ok" => "ok",
                    "stale" => "stale",
                    _ => "error",
                },
            })
            .inc();
        if let Some(t) = next_update {
            self.crl_next_update
                .get_or_create(&UrlLabels {
                    url: url.to_owned(),
                })
                .set(t);
        }
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

    fn probe(&self, host: &str, kind: &str) {
        self.registry_probes
            .get_or_create(&ProbeLabels {
                host: host.to_owned(),
                kind: kind.to_owned(),
            })
            .inc();
    }

    fn credential(&self, source: &str) {
        self.credential_lookups
            .get_or_create(&SourceLabels {
                source: source.to_owned(),
            })
            .inc();
    }

    fn copy_started(&self) {
        self.copies_started.inc();
    }

    fn copy_finished(&self, ok: bool, bytes: u64, elapsed: Duration) {
        self.copies
            .get_or_create(&ResultLabels {
                result: if ok { "ok" } else { "error" },
            })
            .inc();
        self.copy_bytes.inc_by(bytes);
        self.copy_duration.observe(elapsed.as_secs_f64());
    }

    fn breaker(&self, host: &str, state: i64) {
        self.registry_breaker
            .get_or_create(&HostLabels {
                host: host.to_owned(),
            })
            .set(state);
    }

    fn cache(&self, hit: bool) {
        cache_counter(&self.hot.cache_lookups, &self.cache_lookups, hit).inc();
    }
}

/// Counter handles of fixed-label series, filled on first use so the
/// exposition is unchanged (a series appears once it was counted).
#[derive(Debug, Default)]
struct Hot {
    /// `unchanged`, `pinned`, `rewritten`.
    images: [OnceLock<Counter>; 3],
    /// A Pod CREATE `allowed`, `patched`.
    admissions: [OnceLock<Counter>; 2],
    /// hit, miss.
    cache_lookups: [OnceLock<Counter>; 2],
    /// hit, miss.
    verification_cache: [OnceLock<Counter>; 2],
}

/// The series of `family` with `labels`, through a handle kept in `slot`.
fn handle<'a, S: Clone + std::hash::Hash + Eq>(
    slot: &'a OnceLock<Counter>,
    family: &Family<S, Counter>,
    labels: impl FnOnce() -> S,
) -> &'a Counter {
    slot.get_or_init(|| family.get_or_create(&labels()).clone())
}

fn cache_counter<'a>(
    slots: &'a [OnceLock<Counter>; 2],
    family: &Family<CacheLabels, Counter>,
    hit: bool,
) -> &'a Counter {
    let result = if hit { "hit" } else { "miss" };
    handle(&slots[usize::from(!hit)], family, || CacheLabels { result })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The handles kept for a rollout's Pods count into the same series a
    /// family lookup does, and a series appears only once it is counted.
    #[test]
    fn hot_admission_handles_count_into_the_family() {
        let m = Metrics::default();
        let d = Duration::from_millis(1);
        assert!(!m.encode().contains("decision=\"patched\""));
        m.admission("CREATE", "Pod", "patched", d);
        m.admission("CREATE", "Pod", "patched", d);
        m.admissions
            .get_or_create(&AdmissionLabels {
                operation: "CREATE".into(),
                kind: "Pod".into(),
                decision: "patched",
            })
            .inc();
        m.admission("UPDATE", "Pod", "patched", d);
        let text = m.encode();
        let count = |op: &str| {
            text.lines()
                .find(|l| {
                    l.starts_with("sigil_admission_requests_total{")
                        && l.contains(&format!("operation=\"{op}\""))
                        && l.contains("decision=\"patched\"")
                })
                .and_then(|l| l.rsplit(' ').next())
                .map(str::to_owned)
        };
        assert_eq!(count("CREATE").as_deref(), Some("3"), "{text}");
        assert_eq!(count("UPDATE").as_deref(), Some("1"), "{text}");
        assert!(!text.contains("decision=\"allowed\""), "{text}");
    }
}
