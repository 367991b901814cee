//! The monitoring that ships, on a real API server: `overlays/monitoring`
//! installed as shipped, and the chart's monitoring objects, accepted under
//! the Prometheus Operator's own CRD schemas (strict field validation);
//! every metric the alert rules and the dashboard name is one a running
//! sigil or kube-apiserver really exports (the API server's webhook metrics
//! made to appear by a call that fails closed and one that fails open).

use std::collections::BTreeSet;

use serde_json::{Value, json};

use super::{install_with_sigil, pod};
use crate::kubelet::Runtime;
use crate::support::kube::real::{RealKube, assets_or_skip};
use crate::support::registry::{Mode, TestRegistry};

/// The series names a Prometheus text exposition offers: each family's
/// name with the suffixes its type gives samples (`_total`, `_bucket`,
/// `_sum`, `_count`), and every sample's name.
fn exported(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut parts = rest.split_whitespace();
            let (Some(name), Some(kind)) = (parts.next(), parts.next()) else {
                continue;
            };
            names.insert(name.to_owned());
            let suffixes: &[&str] = match kind {
                "counter" => &["_total"],
                "histogram" => &["_bucket", "_sum", "_count"],
                "summary" => &["_sum", "_count"],
                _ => &[],
            };
            for s in suffixes {
                names.insert(format!("{name}{s}"));
            }
        } else if !line.starts_with('#') && !line.is_empty() {
            let end = line.find(['{', ' ']).unwrap_or(line.len());
            names.insert(line[..end].to_owned());
        }
    }
    names
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_monitoring_objects_pass_their_crds_and_name_only_exported_metrics() {
    let Some(assets) =
        assets_or_skip("the_monitoring_objects_pass_their_crds_and_name_only_exported_metrics")
    else {
        return;
    };
    // A policy that makes sigil export every series the rules name: a
    // mirror that is dark (its breaker, a fallback to the origin), a rule
    // that verifies signatures (an unsigned image), and a workload the
    // audit finds in violation.
    let origin = TestRegistry::start(Mode::Plain).await;
    let o = origin.host();
    let dark = format!("127.0.0.1:{}", crate::support::registry::free_port());
    origin.push_image("shop/app", "1.0").await;
    origin.push_image("signed/app", "1.0").await;
    let key = crate::support::signing::Signer::p256().public_pem();
    let policy = format!(
        "apiVersion: sigil.dev/v1alpha1\nkind: ImagePolicy\nspec:\n  registries: [{{host: \"{o}\", insecure: true}}, {{host: \"{dark}\", insecure: true}}]\n  mirrors:\n    - {{from: \"{o}/shop\", to: [\"{dark}/m\"], fallback: origin}}\n  rules:\n    - name: signed\n      match: [\"{o}/signed/**\"]\n      mode: warn\n      verify:\n        - name: team\n          cosign: {{key: {key:?}}}\n    - {{name: all, match: [\"**\"], mode: warn}}\n"
    );
    let mut objects = crate::deploy::render("overlays/monitoring");
    crate::shipped::find_mut(&mut objects, "ConfigMap", "sigil-policy")["data"]["policy.yaml"] =
        json!(policy);
    // With the backstop component too (its RBAC and flag, as
    // overlays/backstop composes it), so its metric is exported.
    let backstop = crate::deploy::render("overlays/backstop");
    objects.extend(
        backstop
            .iter()
            .filter(|o| o["metadata"]["name"] == "sigil-backstop")
            .cloned(),
    );
    crate::shipped::find_mut(&mut objects, "Deployment", "sigil")["spec"]["template"]["spec"]
        ["containers"][0]["env"] = crate::shipped::find(&backstop, "Deployment", "sigil")["spec"]
        ["template"]["spec"]["containers"][0]["env"]
        .clone();
    let kube = RealKube::start(&assets).await;
    kube.apply(&super::fixture_crds(&[
        "monitoring.coreos.com_servicemonitors.yaml",
        "monitoring.coreos.com_prometheusrules.yaml",
    ]))
    .await;
    super::team_with_a_workload(&kube).await;
    let (launched, applied) = install_with_sigil(&kube, objects, Runtime::Process).await;
    for kind in ["ServiceMonitor", "PrometheusRule"] {
        assert!(
            applied.iter().any(|o| o["kind"] == kind),
            "the overlay ships a {kind}"
        );
    }
    // The chart's, with every monitoring value set, under the same schemas.
    let chart: Vec<Value> = crate::helm::rendered(&[
        "metrics.serviceMonitor.enabled=true",
        "metrics.serviceMonitor.labels.release=kube-prometheus-stack",
        "metrics.prometheusRule.enabled=true",
        "metrics.prometheusRule.labels.release=kube-prometheus-stack",
        "metrics.dashboard.enabled=true",
    ])
    .into_iter()
    .filter(|o| {
        ["ServiceMonitor", "PrometheusRule"].contains(&o["kind"].as_str().unwrap_or_default())
            || o["metadata"]["name"] == "sigil-dashboard"
            || o["metadata"]["name"] == "sigil-metrics"
    })
    .collect();
    assert_eq!(chart.len(), 4, "the chart renders four monitoring objects");
    kube.apply(&chart).await;

    // Pods through the webhook (a pin, a fallback past the dark mirror, an
    // unsigned image), the audit's first run, then sigil's own exposition.
    let reg = &launched.registry;
    reg.push_image("shop/app", "1.0").await;
    let image = format!("{}/shop/app:1.0", reg.host());
    // Three failed calls open the dark mirror's breaker.
    let fallbacks = (0..4).map(|i| (format!("fallback-{i}"), format!("{o}/shop/app:1.0")));
    for (name, img) in [
        ("web".to_owned(), image.clone()),
        ("unsigned".to_owned(), format!("{o}/signed/app:1.0")),
    ]
    .into_iter()
    .chain(fallbacks)
    {
        let name = name.as_str();
        let (status, v) = kube
            .request(
                "POST",
                "/api/v1/namespaces/shop/pods",
                Some(&pod("shop", name, &img)),
            )
            .await;
        assert_eq!(status, 201, "{name}: {v}");
    }
    let admin = launched.sigil.admin;
    let until = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !reqwest::get(format!("http://{admin}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
        .contains("sigil_audit_violations{")
    {
        assert!(
            std::time::Instant::now() < until,
            "the audit never reported the violating workload:\n{}",
            launched.sigil.logs()
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    let metrics = launched.sigil.metrics().await;
    let mut known = exported(&metrics);
    // Down: a call that fails closed, then (failurePolicy Ignore) one that
    // fails open, so kube-apiserver's webhook failure series exist.
    drop(launched);
    let (status, _) = kube
        .request(
            "POST",
            "/api/v1/namespaces/shop/pods",
            Some(&pod("shop", "closed", &image)),
        )
        .await;
    assert_eq!(status, 500, "fails closed");
    let mut webhook =
        crate::shipped::find(&applied, "MutatingWebhookConfiguration", "sigil").clone();
    webhook["webhooks"][0]["failurePolicy"] = json!("Ignore");
    kube.apply(&[webhook]).await;
    // The API server takes the new failure policy on within a moment.
    let until = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let mut n = 0;
    loop {
        n += 1;
        let (status, v) = kube
            .request(
                "POST",
                "/api/v1/namespaces/shop/pods",
                Some(&pod("shop", &format!("open-{n}"), &image)),
            )
            .await;
        if status == 201 {
            break;
        }
        assert!(std::time::Instant::now() < until, "never failed open: {v}");
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    let (status, apiserver) = kube.get_text("/metrics").await;
    assert_eq!(status, 200);
    known.extend(exported(&apiserver));

    let mut missing = BTreeSet::new();
    for expr in crate::monitoring::expressions() {
        let names = crate::monitoring::metric_names(&expr);
        assert!(
            !names.is_empty(),
            "{expr} names no sigil or kube-apiserver metric"
        );
        missing.extend(names.into_iter().filter(|n| !known.contains(n)));
    }
    assert!(
        missing.is_empty(),
        "named by the alerts or the dashboard but exported by neither sigil nor kube-apiserver: {missing:?}"
    );
}
