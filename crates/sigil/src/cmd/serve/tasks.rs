//! The tasks `sigil serve` starts beside the server, each waiting for
//! Ready: registration of the webhook (and of the backstop), certificate
//! rotation, the in-cluster audit, and the gate that waits for watches to
//! list. Glue between the flags and sigil-kube; nothing here decides.

use std::sync::Arc;
use std::time::Duration;

use sigil::metrics::Metrics;
use sigil::reload::Live;
use sigil::server::{Task, Tasks};
use sigil_kube::cluster::{self, CaSource, lease};
use sigil_kube::{audit, certs};

use super::ServeArgs;

/// A receiver that turns true (after running `then`) once `after` has and
/// `done` holds, or `limit` after `after` (a
/// source that cannot be read must not keep a replica out of service:
/// what needs it fails with the reason instead).
pub(super) fn listed_within(
    mut after: tokio::sync::watch::Receiver<bool>,
    done: impl Fn() -> bool + Send + 'static,
    limit: Duration,
    then: impl FnOnce() + Send + 'static,
) -> tokio::sync::watch::Receiver<bool> {
    let (tx, rx) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        let _ = after.wait_for(|l| *l).await;
        let until = tokio::time::Instant::now() + limit;
        while !done() && tokio::time::Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        then();
        let _ = tx.send(true);
    });
    rx
}

/// The in-cluster audit: campaigns for the Lease once Ready.
pub(super) fn audit_task(
    args: &ServeArgs,
    namespace: String,
    client: kube::Client,
    live: &Arc<Live>,
) -> (
    audit::continuous::Handle,
    Task,
    Arc<audit::continuous::Latest>,
) {
    let a = &args.audit;
    let identity = lease::identity();
    let latest = Arc::new(audit::continuous::Latest::default());
    let start = audit::continuous::Start {
        client,
        in_force: live.clone(),
        requests: {
            let metrics = live.metrics.clone();
            Arc::new(move || metrics.registry_requests_total())
        },
        metrics: live.metrics.kube.clone(),
        settings: audit::continuous::Settings {
            interval: a.audit_interval.unwrap_or(Duration::from_secs(600)),
            options: audit::Options {
                concurrency: a.audit_concurrency.max(1),
                ..audit::Options::default()
            },
            max_events: a.audit_max_events,
            event_refresh: a.audit_event_refresh,
            instance: identity.clone(),
            reports: a.policy_reports.mode(),
        },
        lease: lease::LeaseSettings {
            namespace,
            name: a.audit_lease.clone(),
            identity,
            duration: a.audit_lease_duration,
        },
        latest: latest.clone(),
    };
    let (handle, pending) = start.prepare();
    let task: Task = Box::new(move |ready, _store| Box::pin(pending.run(ready.wait())));
    (handle, task, latest)
}

/// Registration and certificate rotation, started beside the server.
pub(super) fn cluster_tasks(
    args: &ServeArgs,
    namespace: String,
    client: Option<kube::Client>,
    ca_source: Option<CaSource>,
    cert_settings: certs::CertSettings,
    metrics: &Arc<Metrics>,
    live: &Arc<Live>,
) -> Tasks {
    let mut tasks: Vec<Task> = Vec::new();
    let Some(client) = client else {
        return Tasks(tasks);
    };
    let mut settings = settings(args, &namespace);
    // The webhook's rules follow the policy in force's image extractors.
    let in_force = live.clone();
    settings.custom_kinds = cluster::CustomKinds(Arc::new(move || {
        use sigil_kube::InForce as _;
        cluster::CustomKinds::of(&in_force.policy().extractors)
    }));
    if args.self_managed_certs {
        let (client, metrics, config) = (
            client.clone(),
            metrics.clone(),
            settings.config_name.clone(),
        );
        tasks.push(Box::new(move |_ready, store| {
            let kube_metrics = metrics.kube.clone();
            let serve = move |cert: &certs::ServingCert| -> Result<(), sigil_kube::BoxError> {
                store.replace(cert)?;
                if let Some(leaf) = cert.chain.first() {
                    metrics.cert_not_after.set(sigil::tls::not_after(leaf));
                }
                Ok(())
            };
            Box::pin(certs::run(
                client,
                namespace,
                config,
                cert_settings,
                serve,
                kube_metrics,
            ))
        }));
    }
    let scope = if args.register {
        Some(cluster::Scope::Register)
    } else if args.self_managed_certs {
        Some(cluster::Scope::CaBundleOnly)
    } else {
        None
    };
    if let (Some(scope), Some(source)) = (scope, ca_source) {
        let metrics = metrics.kube.clone();
        tasks.push(Box::new(move |ready, _store| {
            Box::pin(cluster::run(
                client,
                settings,
                source,
                scope,
                ready.wait(),
                metrics,
            ))
        }));
    }
    Tasks(tasks)
}

/// Where sigil lives and how it registers, from the flags.
fn settings(args: &ServeArgs, namespace: &str) -> cluster::Settings {
    cluster::Settings {
        service: args.service_name.clone(),
        service_port: args.service_port,
        url: args.webhook_url.clone(),
        failure_policy: args.failure_policy,
        timeout_seconds: args.webhook_timeout,
        interval: args.reconcile_interval,
        ..args.cluster.settings(namespace.to_owned())
    }
}

/// `--register-backstop`: keeps the backstop equal to the policy in force.
pub(super) fn backstop_task(
    args: &ServeArgs,
    namespace: String,
    client: kube::Client,
    live: Arc<Live>,
    metrics: &Arc<Metrics>,
) -> Task {
    let settings = settings(args, &namespace);
    let metrics = metrics.kube.clone();
    Box::new(move |ready, _store| {
        Box::pin(cluster::backstop::run(
            client,
            settings,
            live,
            ready.wait(),
            metrics,
        ))
    })
}
