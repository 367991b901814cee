//! sigil keeping the backstop registered (`--register-backstop`, the base
//! with `components/backstop` as shipped) on a real API server: registered
//! once Ready with the webhook's ownership, equal to the policy in force
//! as a ClusterImagePolicy changes it, put back after a hand deletion, kept
//! deleted by `break-glass --backstop` until `--end`; and the audit naming
//! the workload the backstop would refuse.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::{install_with_sigil, namespaces_with_accounts, pod, sigil_as_admin};
use crate::kubelet::Runtime;
use crate::support::kube::real::{RealKube, assets_or_skip};

const DIGEST: &str = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

/// Enforcing, with a warn rule (so the warn pair is registered too); no
/// rule for quay.io until a ClusterImagePolicy adds one.
const POLICY: &str = "apiVersion: sigil.dev/v1alpha1\nkind: ImagePolicy\nmetadata: {name: cluster}\nspec:\n  rules:\n    - {name: team, match: [\"registry.example.com/team/**\"], mode: enforce}\n    - {name: tools, match: [\"docker.io/library/**\"], mode: warn}\n    - {name: local, match: [\"127.0.0.1:*/**\"], mode: enforce}\n";

const VAPS: &str = "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies";
const BINDINGS: &str = "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings";

/// Waits until `check` holds for what `path` answers (None: absent).
async fn until(kube: &RealKube, path: &str, what: &str, check: impl Fn(Option<&Value>) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let got = kube.get(path).await;
        if check(got.as_ref()) {
            return;
        }
        assert!(Instant::now() < deadline, "{what}: {got:?}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// A dry-run Pod create's status once the API server agrees with `want`.
async fn until_admission(kube: &RealKube, image: &str, want: u16) -> Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (status, v) = kube
            .request(
                "POST",
                "/api/v1/namespaces/shop/pods?dryRun=All",
                Some(&pod("shop", "probe", image)),
            )
            .await;
        if status == want {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "{image}: want {want}, got {status} {v}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

async fn metrics(launched: &crate::kubelet::Launched) -> String {
    launched.sigil.metrics().await
}

/// `overlays/backstop` installed as shipped with [`POLICY`] and sigil
/// running it; a short reconcile interval (2 s), so that what it puts back
/// or keeps away is seen within the test.
async fn keeping(kube: &RealKube) -> crate::kubelet::Launched {
    let mut objects = crate::deploy::render("overlays/backstop");
    crate::shipped::find_mut(&mut objects, "ConfigMap", "sigil-policy")["data"]["policy.yaml"] =
        json!(POLICY);
    crate::shipped::find_mut(&mut objects, "Deployment", "sigil")["spec"]["template"]["spec"]
        ["containers"][0]["env"]
        .as_array_mut()
        .unwrap()
        .push(json!({"name": "SIGIL_RECONCILE_INTERVAL", "value": "2s"}));
    install_with_sigil(kube, objects, Runtime::Process).await.0
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigil_keeps_the_backstop_equal_to_the_policy_in_force_and_the_audit_names_what_it_would_refuse()
 {
    let Some(assets) = assets_or_skip(
        "sigil_keeps_the_backstop_equal_to_the_policy_in_force_and_the_audit_names_what_it_would_refuse",
    ) else {
        return;
    };
    let kube = RealKube::start(&assets).await;
    // A workload admitted before sigil (and its backstop) existed.
    namespaces_with_accounts(&kube, &["team"]).await;
    let (status, v) = kube
        .request(
            "POST",
            "/api/v1/namespaces/team/pods",
            Some(&pod("team", "app", "registry.example.com/team/app:v1")),
        )
        .await;
    assert_eq!(status, 201, "{v}");

    let launched = keeping(&kube).await;

    // Registered once Ready, owned as the webhook configuration is.
    for (path, name) in [
        (VAPS, "sigil-backstop"),
        (BINDINGS, "sigil-backstop"),
        (VAPS, "sigil-backstop-warn"),
        (BINDINGS, "sigil-backstop-warn"),
    ] {
        until(&kube, &format!("{path}/{name}"), name, |o| o.is_some()).await;
        let o = kube.get(&format!("{path}/{name}")).await.unwrap();
        assert_eq!(
            o["metadata"]["labels"]["app.kubernetes.io/managed-by"], "sigil",
            "{o}"
        );
        assert_eq!(o["metadata"]["ownerReferences"][0]["kind"], "Namespace");
        assert_eq!(o["metadata"]["ownerReferences"][0]["name"], "sigil-system");
    }
    let m = metrics(&launched).await;
    assert!(
        m.contains("sigil_backstop_in_sync{policy=\"sigil-backstop\"} 1"),
        "{m}"
    );

    // The webhook gone (sigil only keeps this configuration's caBundle and
    // does not re-create it): the backstop decides alone.
    let (status, v) = kube
        .request(
            "DELETE",
            "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/sigil",
            None,
        )
        .await;
    assert_eq!(status, 200, "{v}");
    let quay = format!("quay.io/acme/app:1@{DIGEST}");
    let refused = until_admission(&kube, &quay, 403).await;
    assert!(
        refused["message"]
            .as_str()
            .unwrap_or_default()
            .contains("matches no rule of the policy"),
        "{refused}"
    );
    // A ClusterImagePolicy put in force changes what the API server refuses.
    kube.apply(&[
        json!({"apiVersion": "sigil.dev/v1alpha1", "kind": "ClusterImagePolicy",
        "metadata": {"name": "quay"},
        "spec": {"rules": [{"name": "quay", "match": ["quay.io/acme/**"], "action": "allow"}]}}),
    ])
    .await;
    until_admission(&kube, &quay, 201).await;

    // A hand deletion is put back within a reconcile interval.
    let (status, v) = kube
        .request("DELETE", &format!("{BINDINGS}/sigil-backstop"), None)
        .await;
    assert_eq!(status, 200, "{v}");
    until(
        &kube,
        &format!("{BINDINGS}/sigil-backstop"),
        "re-created",
        |o| o.is_some(),
    )
    .await;

    // break-glass --backstop: deleted, and kept deleted until --end.
    let said = tokio::task::block_in_place(|| {
        sigil_as_admin(&kube, &["break-glass", "--reason", "drill", "--backstop"])
    });
    assert!(
        said.contains("ValidatingAdmissionPolicy/sigil-backstop"),
        "{said}"
    );
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert!(
        kube.get(&format!("{VAPS}/sigil-backstop")).await.is_none(),
        "re-created during break-glass --backstop:\n{}",
        launched.sigil.logs()
    );
    let m = metrics(&launched).await;
    assert!(
        m.contains("sigil_backstop_in_sync{policy=\"sigil-backstop\"} 0"),
        "{m}"
    );
    until_admission(&kube, "quay.io/unknown/x:1", 201).await;
    tokio::task::block_in_place(|| sigil_as_admin(&kube, &["break-glass", "--end"]));
    until(
        &kube,
        &format!("{VAPS}/sigil-backstop"),
        "back after --end",
        |o| o.is_some(),
    )
    .await;
    until_admission(&kube, "quay.io/unknown/x:1", 403).await;

    // The audit names the workload the backstop would refuse.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("policy.yaml");
    std::fs::write(&file, POLICY).unwrap();
    let out = std::process::Command::new(crate::support::sigil::bin())
        .args(["audit", "-n", "team", "-o", "json", "--no-verify"])
        .arg("--policy")
        .arg(&file)
        .env("KUBECONFIG", kube.admin_kubeconfig())
        .output()
        .unwrap();
    let report: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)));
    assert_eq!(report["summary"]["backstopRefusals"], 1, "{report}");
    let field = &report["objects"][0]["fields"][0];
    assert_eq!(field["image"], "registry.example.com/team/app:v1");
    assert_eq!(
        field["backstop"], "has no digest (rule team pins it)",
        "{report}"
    );
}

/// Hand edits that switch the registered backstop off without touching a
/// field sigil owns (`matchConditions: [{expression: "false"}]` on the
/// policy, a binding's `matchResources` narrowed to no namespace) are put
/// back within a reconcile interval; a policy in force whose backstop the
/// API server could not take (past the cost envelope) gets its stale
/// backstop removed, said by `sigil_backstop_in_sync` 0 and an Event, and
/// registered again once the policy fits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regression_hand_edits_are_put_back_and_a_backstop_that_cannot_match_the_policy_is_removed()
{
    let Some(assets) = assets_or_skip(
        "regression_hand_edits_are_put_back_and_a_backstop_that_cannot_match_the_policy_is_removed",
    ) else {
        return;
    };
    let kube = RealKube::start(&assets).await;
    let launched = keeping(&kube).await;
    let vap = format!("{VAPS}/sigil-backstop");
    let binding = format!("{BINDINGS}/sigil-backstop");
    until(&kube, &binding, "registered", |o| o.is_some()).await;

    let (status, v) = kube
        .request(
            "PATCH",
            &vap,
            Some(&json!({"spec": {"matchConditions": [{"name": "off", "expression": "false"}]}})),
        )
        .await;
    assert_eq!(status, 200, "{v}");
    let (status, v) = kube
        .request(
            "PATCH",
            &binding,
            Some(&json!({"spec": {"matchResources": {"namespaceSelector": {"matchLabels": {"nowhere": "x"}}}}})),
        )
        .await;
    assert_eq!(status, 200, "{v}");
    until(&kube, &vap, "matchConditions removed", |o| {
        o.is_some_and(|o| o["spec"]["matchConditions"].is_null())
    })
    .await;
    until(&kube, &binding, "matchResources put back", |o| {
        o.is_some_and(|o| {
            o["spec"]["matchResources"]["namespaceSelector"]
                .as_object()
                .is_none_or(|s| s.is_empty())
        })
    })
    .await;

    // Past the envelope: removed, never left stale.
    let patterns: Vec<String> = (0..=sigil_core::backstop::MAX_CROWD)
        .map(|i| format!("*.r{i}.example.com/**"))
        .collect();
    kube.apply(&[
        json!({"apiVersion": "sigil.dev/v1alpha1", "kind": "ClusterImagePolicy",
        "metadata": {"name": "wide"},
        "spec": {"rules": [{"name": "wide", "match": patterns, "mode": "enforce"}]}}),
    ])
    .await;
    until(&kube, &vap, "the stale backstop removed", |o| o.is_none()).await;
    until(&kube, &binding, "its binding removed", |o| o.is_none()).await;
    let m = metrics(&launched).await;
    assert!(
        m.contains("sigil_backstop_in_sync{policy=\"sigil-backstop\"} 0"),
        "{m}"
    );
    let events = kube
        .get("/apis/events.k8s.io/v1/events")
        .await
        .unwrap_or_default();
    assert!(
        events["items"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|e| e["reason"] == "BackstopUnfit"
                && e["note"]
                    .as_str()
                    .unwrap_or_default()
                    .contains("tested against")),
        "{events}\n{}",
        launched.sigil.logs()
    );
    // The policy fits again: registered again.
    let (status, v) = kube
        .request(
            "DELETE",
            "/apis/sigil.dev/v1alpha1/clusterimagepolicies/wide",
            None,
        )
        .await;
    assert_eq!(status, 200, "{v}");
    until(&kube, &vap, "registered again", |o| o.is_some()).await;
}
