//! Verification keys kept in ConfigMaps and Secrets (`keyRef`), through
//! `sigil serve --watch-policies` against the kube-apiserver stand-in.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde_json::json;

use crate::support::kube::FakeKube;
use crate::support::registry::{Mode, TestRegistry};
use crate::support::sigil::Sigil;
use crate::support::signing::{Signer, push_signed};

fn configmap(ns: &str, name: &str, data: serde_json::Value) -> serde_json::Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap",
           "metadata": {"name": name, "namespace": ns}, "data": data})
}

fn cms(ns: &str) -> String {
    format!("/api/v1/namespaces/{ns}/configmaps")
}

/// A cluster policy's keyRef reads sigil's namespace, a team's its own
/// (a same-named ConfigMap elsewhere never counts); a missing object, a
/// missing key and a malformed PEM each fail only the verifier naming them,
/// with the reason; a key rotated in its ConfigMap is in force within
/// seconds, under load, with every request answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_from_configmaps_are_watched_confined_and_rotated_under_load() {
    let reg = TestRegistry::start(Mode::Plain).await;
    let h = reg.host();
    let (a, b, team) = (Signer::p256(), Signer::p256(), Signer::p256());
    push_signed(&reg, "kr/a", "v1", "kr/a", &a).await;
    push_signed(&reg, "kr/b", "v1", "kr/b", &b).await;
    push_signed(&reg, "team/app", "v1", "team/app", &team).await;
    for repo in ["missing", "nokey", "bad"] {
        push_signed(&reg, &format!("kr/{repo}"), "v1", &format!("kr/{repo}"), &a).await;
    }
    let kube = FakeKube::start().await;
    kube.namespaces(&["sigil-system", "team"]);
    kube.insert(
        &cms("sigil-system"),
        configmap(
            "sigil-system",
            "keys",
            json!({"cosign.pub": a.public_pem(), "bad.pub": "not a key"}),
        ),
    );
    // The team's own, and a same-named one in sigil's namespace (A's key).
    kube.insert(
        &cms("team"),
        configmap("team", "team-keys", json!({"k": team.public_pem()})),
    );
    kube.insert(
        &cms("sigil-system"),
        configmap("sigil-system", "team-keys", json!({"k": a.public_pem()})),
    );
    kube.insert(
        "/apis/sigil.dev/v1alpha1/namespaces/team/imagepolicies",
        json!({"apiVersion": "sigil.dev/v1alpha1", "kind": "ImagePolicy",
               "metadata": {"name": "own-keys", "namespace": "team"},
               "spec": {"rules": [{"name": "ours", "match": [format!("{h}/team/**")],
                   "verify": [{"name": "team", "cosign": {"keyRef": {"configMap": "team-keys", "key": "k"}}}]}]}}),
    );
    let rule = |name: &str, pattern: &str, cm: &str, key: &str| {
        format!(
            "    - name: {name}\n      match: [\"{h}/{pattern}\"]\n      verify:\n        - name: {name}\n          cosign: {{keyRef: {{configMap: {cm}, key: {key}}}}}\n"
        )
    };
    let policy = format!(
        "apiVersion: sigil.dev/v1alpha1\nkind: ClusterImagePolicy\nmetadata: {{name: keyrefs}}\nspec:\n  registries:\n    - {{host: \"{h}\", insecure: true}}\n  rules:\n    - {{name: team, match: [\"{h}/team/**\"]}}\n{}{}{}{}",
        rule("signed", "kr/*", "keys", "cosign.pub"),
        rule("missing", "kr/missing", "nope", "k"),
        rule("nokey", "kr/nokey", "keys", "absent.pub"),
        rule("bad", "kr/bad", "keys", "bad.pub"),
    );
    let sigil = Sigil::start_env(
        Some(&policy),
        &["--watch-policies", "--namespace", "sigil-system"],
        &kube.env(),
    )
    .await;
    let api = sigil.apiserver();
    let image = |r: &str| format!("{h}/{r}:v1");
    let got = api.create_pod("team", &[&image("kr/a")]).await;
    assert!(got.allowed, "{}\n{}", got.message, sigil.logs());
    let got = api.create_pod("team", &[&image("kr/b")]).await;
    assert!(
        !got.allowed && got.message.contains("wrong key"),
        "{}",
        got.message
    );
    let got = api.create_pod("team", &[&image("team/app")]).await;
    assert!(
        got.allowed,
        "the team's own key from its namespace: {}",
        got.message
    );
    for (repo, reason) in [
        ("missing", "ConfigMap sigil-system/nope not found"),
        (
            "nokey",
            "has no key \"absent.pub\" (it has: bad.pub, cosign.pub)",
        ),
        ("bad", "ConfigMap keys key \"bad.pub\""),
    ] {
        let got = api
            .create_pod("team", &[&image(&format!("kr/{repo}"))])
            .await;
        assert!(!got.allowed, "{repo}");
        assert!(
            got.message.contains("trust material unavailable") && got.message.contains(reason),
            "{repo}: {}",
            got.message
        );
    }

    // Rotation from A to B under load: every request gets an answer.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (answered, failed) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let mut drivers = Vec::new();
    for repo in ["kr/a", "kr/b"] {
        let (api, img) = (sigil.apiserver(), image(repo));
        let (stop, answered, failed) = (stop.clone(), answered.clone(), failed.clone());
        drivers.push(tokio::spawn(async move {
            let mut n = 0;
            while !stop.load(Ordering::Relaxed) && n < 2000 {
                let got = api.create_pod("team", &[&img]).await;
                if got.allowed || got.message.contains("wrong key") {
                    answered.fetch_add(1, Ordering::Relaxed);
                } else {
                    failed.fetch_add(1, Ordering::Relaxed);
                }
                n += 1;
            }
        }));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    kube.insert(
        &cms("sigil-system"),
        configmap(
            "sigil-system",
            "keys",
            json!({"cosign.pub": b.public_pem(), "bad.pub": "not a key"}),
        ),
    );
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let got = api.create_pod("team", &[&image("kr/b")]).await;
        if got.allowed {
            break;
        }
        assert!(
            Instant::now() < until,
            "the rotated key never took effect: {}",
            got.message
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    stop.store(true, Ordering::Relaxed);
    for d in drivers {
        d.await.unwrap();
    }
    assert_eq!(
        failed.load(Ordering::Relaxed),
        0,
        "requests failed during the rotation"
    );
    assert!(answered.load(Ordering::Relaxed) > 10);
    let got = api.create_pod("team", &[&image("kr/a")]).await;
    assert!(!got.allowed, "the old key is no longer trusted");
    assert!(kube.denied().is_empty(), "{:?}", kube.denied());
}

/// A team policy may not point its keyRef at another namespace.
#[test]
fn a_team_keyref_into_another_namespace_is_refused() {
    let doc = json!({"apiVersion": "sigil.dev/v1alpha1", "kind": "ImagePolicy",
        "metadata": {"name": "p", "namespace": "team"},
        "spec": {"rules": [{"name": "r", "match": ["**"],
            "verify": [{"name": "v", "cosign": {"keyRef": {"configMap": "k", "key": "k", "namespace": "sigil-system"}}}]}]}});
    let err = sigil_core::policy::NamespacePolicy::from_value(doc)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("keyRef may only name objects in this policy's namespace"),
        "{err}"
    );
}

/// A policy object whose verifier names a keyRef that is not there says so
/// in its status (Ready False, TrustMaterialUnavailable, which verifier and
/// why); once the ConfigMap exists, it is Ready again, without a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_policy_object_reports_a_missing_keyref_in_its_status() {
    let reg = TestRegistry::start(Mode::Plain).await;
    let h = reg.host();
    let key = Signer::p256();
    push_signed(&reg, "kr/app", "v1", "kr/app", &key).await;
    let kube = FakeKube::start().await;
    kube.namespaces(&["sigil-system", "team"]);
    let cips = "/apis/sigil.dev/v1alpha1/clusterimagepolicies";
    kube.insert(
        cips,
        json!({"apiVersion": "sigil.dev/v1alpha1", "kind": "ClusterImagePolicy",
               "metadata": {"name": "keyed"},
               "spec": {"registries": [{"host": h, "insecure": true}],
                        "rules": [{"name": "signed", "match": [format!("{h}/kr/**")],
                            "verify": [{"name": "release", "cosign": {"keyRef": {"configMap": "release-keys", "key": "cosign.pub"}}}]}]}}),
    );
    let sigil = Sigil::start_env(
        None,
        &["--watch-policies", "--namespace", "sigil-system"],
        &kube.env(),
    )
    .await;
    let ready = |want: &'static str| {
        let kube = &kube;
        async move {
            let until = Instant::now() + Duration::from_secs(20);
            loop {
                let o = kube.get(cips, "keyed").unwrap();
                let c = &o["status"]["conditions"][0];
                if c["status"] == want {
                    return (
                        c["reason"].as_str().unwrap_or_default().to_owned(),
                        c["message"].as_str().unwrap_or_default().to_owned(),
                    );
                }
                assert!(Instant::now() < until, "status never {want}: {o}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    let (reason, message) = ready("False").await;
    assert_eq!(reason, "TrustMaterialUnavailable");
    assert!(
        message.contains(
            "rule \"signed\" verifier \"release\": ConfigMap sigil-system/release-keys not found"
        ),
        "{message}"
    );
    let got = sigil
        .apiserver()
        .create_pod("team", &[&format!("{h}/kr/app:v1")])
        .await;
    assert!(!got.allowed);
    kube.insert(
        &cms("sigil-system"),
        configmap(
            "sigil-system",
            "release-keys",
            json!({"cosign.pub": key.public_pem()}),
        ),
    );
    let (reason, _) = ready("True").await;
    assert_eq!(reason, "InForce");
    let got = sigil
        .apiserver()
        .create_pod("team", &[&format!("{h}/kr/app:v1")])
        .await;
    assert!(got.allowed, "{}", got.message);
}
