//! ImagePolicyExceptions through the kube-apiserver stand-in with their
//! real CRD: the CRD's CEL rules refuse malformed ones at the API; a rule
//! that allows exceptions is waived in the exception's namespace only, as a
//! warning naming it, until it expires — then denied again at once, without
//! a restart, with status, an Event and `sigil_exceptions{state}` saying so;
//! one the policy does not allow (no exceptions on the rule, longer than
//! `maxDuration`) is refused with status and an Event.

use std::time::{Duration, Instant, SystemTime};

use kube::api::{Api, PostParams};
use serde_json::json;
use sigil_kube::crd::ImagePolicyException;

use crate::support::kube::FakeKube;
use crate::support::sigil::Sigil;

const CIPS: &str = "/apis/sigil.dev/v1alpha1/clusterimagepolicies";
const EXCEPTIONS: &str = "/apis/sigil.dev/v1alpha1/namespaces/team-a/imagepolicyexceptions";
const EVENTS: &str = "/apis/events.k8s.io/v1/namespaces/team-a/events";

fn rfc3339_in(secs: u64) -> String {
    humantime::format_rfc3339_seconds(SystemTime::now() + Duration::from_secs(secs)).to_string()
}

fn exception(
    name: &str,
    rule: &str,
    images: serde_json::Value,
    expires: &str,
) -> ImagePolicyException {
    serde_json::from_value(json!({
        "apiVersion": "sigil.dev/v1alpha1", "kind": "ImagePolicyException",
        "metadata": {"name": name, "namespace": "team-a"},
        "spec": {"images": images,
                 "rules": [{"policy": "ClusterImagePolicy/supply-chain", "rule": rule}],
                 "expires": expires, "reason": "vendor image, signed build pending", "ticket": "SEC-1234"}}))
    .unwrap()
}

async fn wait_for(what: &str, limit: Duration, mut f: impl AsyncFnMut() -> bool) {
    let until = Instant::now() + limit;
    while !f().await {
        assert!(Instant::now() < until, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn state_of(kube: &FakeKube, name: &str) -> (String, String, String) {
    let o = kube.get(EXCEPTIONS, name).unwrap_or_default();
    let c = &o["status"]["conditions"][0];
    (
        o["status"]["state"].as_str().unwrap_or_default().to_owned(),
        c["reason"].as_str().unwrap_or_default().to_owned(),
        c["message"].as_str().unwrap_or_default().to_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exceptions_waive_allowed_rules_in_their_namespace_until_they_expire() {
    let kube = FakeKube::start().await;
    kube.apply(
        &sigil_kube::crd::all()
            .into_iter()
            .map(|c| serde_json::to_value(c).unwrap())
            .collect::<Vec<_>>(),
    );
    kube.namespaces(&["team-a", "team-b"]);
    kube.insert(
        CIPS,
        json!({"apiVersion": "sigil.dev/v1alpha1", "kind": "ClusterImagePolicy",
            "metadata": {"name": "supply-chain", "creationTimestamp": "2026-01-01T00:00:00Z"},
            "spec": {"rules": [
                {"name": "all", "match": ["**"], "action": "allow"},
                {"name": "banned", "match": ["registry.example.com/legacy/**"], "action": "deny",
                 "exceptions": {"allowed": true, "maxDuration": "1h"}},
                {"name": "strict", "match": ["registry.example.com/strict/**"], "action": "deny"}]}}),
    );
    let s = Sigil::start_env(
        None,
        &["--watch-policies", "--namespace", "sigil-system"],
        &kube.env(),
    )
    .await;
    let config = kube::Config::from_custom_kubeconfig(
        kube::config::Kubeconfig::read_from(&kube.kubeconfig).unwrap(),
        &kube::config::KubeConfigOptions::default(),
    )
    .await
    .unwrap();
    let api: Api<ImagePolicyException> =
        Api::namespaced(kube::Client::try_from(config).unwrap(), "team-a");
    let pp = PostParams::default();

    // The CRD's CEL rules refuse malformed exceptions at the API.
    for (bad, want) in [
        (
            exception("no-images", "banned", json!([]), &rfc3339_in(60)),
            "name at least one image",
        ),
        (
            exception(
                "bad-time",
                "banned",
                json!(["registry.example.com/legacy/**"]),
                "next week",
            ),
            "expires is an RFC 3339 time",
        ),
    ] {
        let err = api.create(&pp, &bad).await.unwrap_err().to_string();
        assert!(err.contains(want) && err.contains("422"), "{err}");
    }
    let mut bad_policy = exception("bad-policy", "banned", json!(["x"]), &rfc3339_in(60));
    bad_policy.spec.rules[0].policy = "supply-chain".into();
    let err = api.create(&pp, &bad_policy).await.unwrap_err().to_string();
    assert!(err.contains("ClusterImagePolicy/NAME"), "{err}");

    let image = "registry.example.com/legacy/api:1";
    let apiserver = s.apiserver();
    let denied = apiserver.create_pod("team-a", &[image]).await;
    assert!(!denied.allowed, "{}", denied.message);

    // A valid exception, a refused one (the rule allows none) and one longer
    // than the rule's maxDuration.
    let expires = rfc3339_in(6);
    api.create(
        &pp,
        &exception(
            "legacy",
            "banned",
            json!(["registry.example.com/legacy/**"]),
            &expires,
        ),
    )
    .await
    .unwrap();
    api.create(
        &pp,
        &exception(
            "strict",
            "strict",
            json!(["registry.example.com/strict/**"]),
            &rfc3339_in(60),
        ),
    )
    .await
    .unwrap();
    api.create(
        &pp,
        &exception(
            "too-long",
            "banned",
            json!(["registry.example.com/legacy/**"]),
            &rfc3339_in(7200),
        ),
    )
    .await
    .unwrap();

    // Waived in team-a, as a warning naming the exception; not in team-b.
    let mut admitted = None;
    wait_for(
        "the exception to apply",
        Duration::from_secs(5),
        async || {
            let p = apiserver.create_pod("team-a", &[image]).await;
            let ok = p.allowed;
            admitted = Some(p);
            ok
        },
    )
    .await;
    let p = admitted.unwrap();
    assert!(
        p.warnings.iter().any(|w| w.contains(&format!(
            "excepted by ImagePolicyException team-a/legacy until {expires}"
        ))),
        "{:?}",
        p.warnings
    );
    let b = apiserver.create_pod("team-b", &[image]).await;
    assert!(!b.allowed, "another namespace is not waived: {}", b.message);
    let strict = apiserver
        .create_pod("team-a", &["registry.example.com/strict/x:1"])
        .await;
    assert!(!strict.allowed, "{}", strict.message);

    // Status and Events, written by the Lease holder.
    wait_for("exception status", Duration::from_secs(10), async || {
        state_of(&kube, "legacy").0 == "Active"
            && state_of(&kube, "strict").0 == "Invalid"
            && state_of(&kube, "too-long").0 == "Invalid"
    })
    .await;
    let (_, reason, message) = state_of(&kube, "legacy");
    assert_eq!(reason, "Active");
    assert!(
        message.contains("ClusterImagePolicy/supply-chain rule banned"),
        "{message}"
    );
    let (_, reason, message) = state_of(&kube, "strict");
    assert_eq!(reason, "Refused");
    assert!(message.contains("allows no exceptions"), "{message}");
    let (_, _, message) = state_of(&kube, "too-long");
    assert!(message.contains("allows at most 1h"), "{message}");
    let metrics = s.metrics().await;
    for line in [
        "sigil_exceptions{state=\"active\"} 1",
        "sigil_exceptions{state=\"invalid\"} 2",
        "sigil_exceptions{state=\"expired\"} 0",
    ] {
        assert!(metrics.contains(line), "{line} in\n{metrics}");
    }

    // At expiry: denied again at once, status Expired, an Event, the gauge.
    wait_for(
        "the exception to expire",
        Duration::from_secs(10),
        async || !apiserver.create_pod("team-a", &[image]).await.allowed,
    )
    .await;
    wait_for(
        "Expired status and Event",
        Duration::from_secs(10),
        async || {
            state_of(&kube, "legacy").0 == "Expired"
                && kube.list(EVENTS).iter().any(|e| {
                    e["reason"] == "ExceptionExpired" && e["regarding"]["name"] == "legacy"
                })
        },
    )
    .await;
    assert!(
        kube.list(EVENTS)
            .iter()
            .any(|e| e["reason"] == "ExceptionRefused" && e["regarding"]["name"] == "strict"),
        "{:?}",
        kube.list(EVENTS)
    );
    let metrics = s.metrics().await;
    assert!(
        metrics.contains("sigil_exceptions{state=\"expired\"} 1"),
        "{metrics}"
    );
}
