//! Policies for teams: a policy file holding a ClusterImagePolicy and
//! namespaced ImagePolicies, through the webhook, `sigil pin` and
//! `sigil policy check` — a team may add its own keys and allow-list in its
//! namespace, never loosen the platform's rules.

use std::process::Command;

use crate::support::registry::{Mode, TestRegistry};
use crate::support::sigil::{Sigil, bin};
use crate::support::signing::{Signer, push_signed};

fn policy(h: &str, platform_key: &str, team_key: &str) -> String {
    format!(
        r#"apiVersion: sigil.dev/v1alpha1
kind: ClusterImagePolicy
metadata: {{name: platform}}
spec:
  registries: [{{host: "{h}", insecure: true}}]
  rules:
    - name: signed
      match: ["{h}/**"]
      verify: [{{name: platform, cosign: {{key: "{platform_key}"}}}}]
---
apiVersion: sigil.dev/v1alpha1
kind: ImagePolicy
metadata: {{name: signed-only, namespace: team-b}}
spec:
  rules:
    - name: team-keys
      match: ["{h}/**"]
      verify: [{{name: team, cosign: {{key: {team_key:?}}}}}]
---
apiVersion: sigil.dev/v1alpha1
kind: ImagePolicy
metadata: {{name: allow-list, namespace: team-c}}
spec:
  defaultAction: deny
  rules:
    - {{name: ours, match: ["{h}/team-c/**"]}}
"#
    )
}

fn pin(policy: &std::path::Path, namespace: &str, image: &str) -> (Option<i32>, String) {
    let manifest = format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: p, namespace: {namespace}}}\nspec:\n  containers:\n    - name: app\n      image: {image}\n"
    );
    let policy = policy.to_string_lossy();
    let out = crate::support::sigil::run_sigil(&["pin", "--policy", &policy, "-"], Some(&manifest));
    (
        out.status.code(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

#[tokio::test]
async fn team_policies_tighten_in_their_namespace_only_through_webhook_and_pin() {
    let reg = TestRegistry::start(Mode::Plain).await;
    let h = reg.host();
    let dir = tempfile::tempdir().unwrap();
    let (platform, team) = (Signer::p256(), Signer::p256());
    let pk = dir.path().join("platform.pub");
    std::fs::write(&pk, platform.public_pem()).unwrap();
    // Signed by the platform key only; and one signed by both.
    push_signed(&reg, "apps/web", "v1", "apps/web", &platform).await;
    push_signed(&reg, "apps/both", "v1", "apps/both", &platform).await;
    let both = reg.push_image("apps/both", "v1").await;
    let payload = crate::support::signing::simple_signing(&format!("{h}/apps/both"), &both);
    crate::support::signing::push_legacy(
        &reg,
        "apps/both",
        &both,
        vec![
            crate::support::signing::Layer::new(payload.clone(), &platform.sign(&payload)),
            crate::support::signing::Layer::new(payload.clone(), &team.sign(&payload)),
        ],
    )
    .await;
    // A team gives its key inline (a file on sigil's filesystem is the
    // platform's to name).
    let text = policy(&h, &pk.display().to_string(), &team.public_pem());
    let file = dir.path().join("policies.yaml");
    std::fs::write(&file, &text).unwrap();

    let s = Sigil::start(Some(&text), &[]).await;
    let api = s.apiserver();
    let web = format!("{h}/apps/web:v1");
    // Signed by the cluster key only: admitted in team-a, denied in team-b.
    let a = api.create_pod("team-a", &[&web]).await;
    assert!(a.allowed, "{}", a.message);
    let b = api.create_pod("team-b", &[&web]).await;
    assert!(!b.allowed);
    assert!(
        b.message
            .contains("ImagePolicy team-b/signed-only, rule team-keys")
            && b.message.contains("team: wrong key"),
        "{}",
        b.message
    );
    // Signed by both: admitted in team-b too.
    let b = api
        .create_pod("team-b", &[&format!("{h}/apps/both:v1")])
        .await;
    assert!(b.allowed, "{}", b.message);
    // The allow-list in team-c: only team-c's own images.
    let c = api.create_pod("team-c", &[&web]).await;
    assert!(!c.allowed);
    assert!(
        c.message
            .contains("is not on the allow-list of ImagePolicy team-c/allow-list"),
        "{}",
        c.message
    );

    // sigil pin applies the same policies by the manifest's namespace.
    let (code, out) = pin(&file, "team-a", &web);
    assert_eq!(code, Some(0), "{out}");
    let (code, out) = pin(&file, "team-b", &web);
    assert_eq!(code, Some(1), "{out}");
    assert!(
        out.contains("ImagePolicy team-b/signed-only, rule team-keys"),
        "{out}"
    );

    // sigil policy check describes both kinds.
    let out = Command::new(bin())
        .args(["policy", "check", "--schema-only"])
        .arg(&file)
        .output()
        .unwrap();
    let text_out = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text_out}");
    assert!(
        text_out.contains("ImagePolicy team-b/signed-only (objects in namespace team-b only")
            && text_out.contains("refused (defaultAction: deny, an allow-list)"),
        "{text_out}"
    );
    // A loosening field in a team policy is refused, naming it.
    let loose = text.replace(
        "metadata: {name: allow-list, namespace: team-c}\nspec:\n",
        "metadata: {name: allow-list, namespace: team-c}\nspec:\n  exemptNamespaces: [team-c]\n",
    );
    std::fs::write(&file, &loose).unwrap();
    let out = Command::new(bin())
        .args(["policy", "check", "--schema-only"])
        .arg(&file)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("spec.exemptNamespaces is not allowed in a namespaced ImagePolicy"),
        "{err}"
    );
}

const CIPS: &str = "/apis/sigil.dev/v1alpha1/clusterimagepolicies";

fn cip(name: &str, created: &str, spec: serde_json::Value) -> serde_json::Value {
    serde_json::json!({"apiVersion": "sigil.dev/v1alpha1", "kind": "ClusterImagePolicy",
        "metadata": {"name": name, "creationTimestamp": created}, "spec": spec})
}

fn team_policy(ns: &str, name: &str, spec: serde_json::Value) -> serde_json::Value {
    serde_json::json!({"apiVersion": "sigil.dev/v1alpha1", "kind": "ImagePolicy",
        "metadata": {"name": name, "namespace": ns}, "spec": spec})
}

fn ready_of(o: &serde_json::Value) -> (String, String, String) {
    let c = &o["status"]["conditions"][0];
    (
        c["status"].as_str().unwrap_or_default().to_owned(),
        c["reason"].as_str().unwrap_or_default().to_owned(),
        c["message"].as_str().unwrap_or_default().to_owned(),
    )
}

/// Policy objects through the stand-in: ClusterImagePolicies combine (a
/// conflict marks only the newer one not Ready), a team's ImagePolicy
/// applies in its namespace, a loosening one forced in is ignored with a
/// not-Ready condition, an edit is in force within a second without a
/// restart, and only one of two replicas writes status.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn policy_objects_combine_report_status_and_take_effect_at_once() {
    use crate::support::kube::FakeKube;
    use serde_json::json;
    let reg = TestRegistry::start(Mode::Plain).await;
    let h = reg.host();
    reg.push_image("ok/app", "v1").await;
    let kube = FakeKube::start().await;
    kube.namespaces(&["team-a", "team-b", "team-c"]);
    kube.insert(
        CIPS,
        cip(
            "base",
            "2026-01-01T00:00:00Z",
            json!({
            "registries": [{"host": h, "insecure": true}],
            "rules": [{"name": "all", "match": ["**"], "mode": "enforce"}]}),
        ),
    );
    kube.insert(
        CIPS,
        cip(
            "deny-bad",
            "2026-02-01T00:00:00Z",
            json!({
            "rules": [{"name": "deny-bad", "match": [format!("{h}/bad/**")], "action": "deny"}]}),
        ),
    );
    kube.insert(
        CIPS,
        cip(
            "dup",
            "2026-03-01T00:00:00Z",
            json!({
            "rules": [{"name": "all", "match": [format!("{h}/dup/**")]}]}),
        ),
    );
    kube.insert(
        CIPS,
        cip(
            "prod-only",
            "2026-04-01T00:00:00Z",
            json!({
            "rules": [{"name": "no-ok-in-prod", "match": [format!("{h}/ok/**")], "action": "deny",
                       "namespaceSelector": {"matchLabels": {"tier": "prod"}}}]}),
        ),
    );
    kube.insert(
        "/api/v1/namespaces",
        json!({"apiVersion": "v1", "kind": "Namespace",
               "metadata": {"name": "shop-prod", "labels": {"tier": "prod", "kubernetes.io/metadata.name": "shop-prod"}}}),
    );
    kube.insert(
        "/apis/sigil.dev/v1alpha1/namespaces/team-a/imagepolicies",
        team_policy(
            "team-a",
            "allow-list",
            json!({"defaultAction": "deny",
            "rules": [{"name": "ours", "match": [format!("{h}/team-a/**")]}]}),
        ),
    );
    kube.insert(
        "/apis/sigil.dev/v1alpha1/namespaces/team-b/imagepolicies",
        team_policy(
            "team-b",
            "loose",
            json!({"mirrors": [{"from": "docker.io", "to": "evil.example/hub"}]}),
        ),
    );
    // A lease long enough that a loaded CI machine never moves leadership
    // mid-test (a new leader may rewrite status its store has not seen yet).
    let args = [
        "--watch-policies",
        "--namespace",
        "sigil-system",
        "--audit-lease-duration",
        "10s",
    ];
    let a = Sigil::start_env(None, &args, &kube.env()).await;
    let b = Sigil::start_env(None, &args, &kube.env()).await;
    let ok = format!("{h}/ok/app:v1");
    for s in [&a, &b] {
        let api = s.apiserver();
        let p = api.create_pod("team-z", &[&ok]).await;
        assert!(p.allowed && p.patched, "{}", p.message);
        let p = api.create_pod("team-z", &[&format!("{h}/bad/x:v1")]).await;
        assert!(
            !p.allowed
                && p.message
                    .contains("denied by rule \"deny-bad\" of ClusterImagePolicy deny-bad"),
            "{}",
            p.message
        );
        let p = api.create_pod("team-a", &[&ok]).await;
        assert!(
            !p.allowed
                && p.message
                    .contains("not on the allow-list of ImagePolicy team-a/allow-list"),
            "{}",
            p.message
        );
    }
    // Status: written once, by the replica holding the Lease.
    let until = std::time::Instant::now() + std::time::Duration::from_secs(15);
    loop {
        let done = ["base", "deny-bad", "dup"]
            .iter()
            .all(|n| kube.get(CIPS, n).is_some_and(|o| !o["status"].is_null()))
            && kube
                .get(
                    "/apis/sigil.dev/v1alpha1/namespaces/team-b/imagepolicies",
                    "loose",
                )
                .is_some_and(|o| !o["status"].is_null());
        if done {
            break;
        }
        assert!(std::time::Instant::now() < until, "status never written");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let (st, reason, _) = ready_of(&kube.get(CIPS, "base").unwrap());
    assert_eq!((st.as_str(), reason.as_str()), ("True", "InForce"));
    assert_eq!(ready_of(&kube.get(CIPS, "deny-bad").unwrap()).0, "True");
    let (st, reason, msg) = ready_of(&kube.get(CIPS, "dup").unwrap());
    assert_eq!(
        (st.as_str(), reason.as_str()),
        ("False", "Conflict"),
        "{msg}"
    );
    assert!(msg.contains("both define rule \"all\""), "{msg}");
    let loose = kube
        .get(
            "/apis/sigil.dev/v1alpha1/namespaces/team-b/imagepolicies",
            "loose",
        )
        .unwrap();
    let (st, reason, msg) = ready_of(&loose);
    assert_eq!((st.as_str(), reason.as_str()), ("False", "InvalidSpec"));
    assert!(msg.contains("spec.mirrors is not allowed"), "{msg}");
    assert_eq!(loose["status"]["observedGeneration"], 1);
    // An Event on the object that is not Ready.
    let events = kube.list("/apis/events.k8s.io/v1/namespaces/team-b/events");
    assert!(
        events.iter().any(|e| e["reason"] == "PolicyNotReady"
            && e["regarding"]["name"] == "loose"
            && e["note"]
                .as_str()
                .unwrap_or_default()
                .contains("spec.mirrors")),
        "{events:#?}"
    );
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    let writes = kube
        .requests()
        .iter()
        .filter(|(m, p, _)| m == "PATCH" && p == &format!("{CIPS}/dup/status"))
        .count();
    assert_eq!(writes, 1, "status written by one replica, once");
    assert_eq!(
        a.counter(
            "sigil_policies",
            &[("kind", "ClusterImagePolicy"), ("ready", "false")]
        )
        .await,
        1.0
    );
    // The loosening policy was ignored: team-b still pulls from where images name.
    let p = a.apiserver().create_pod("team-b", &[&ok]).await;
    assert!(
        p.allowed && !p.object.to_string().contains("evil.example"),
        "{p:?}"
    );

    // An edit is in force within a second, on both replicas, without a restart.
    let mut edit = kube.get(CIPS, "deny-bad").unwrap();
    edit["spec"]["rules"][0]["match"] = json!([format!("{h}/ok/**")]);
    edit["metadata"]["generation"] = json!(2);
    kube.insert(CIPS, edit);
    let edited = std::time::Instant::now();
    for s in [&a, &b] {
        loop {
            let p = s.apiserver().create_pod("team-z", &[&ok]).await;
            if !p.allowed {
                break;
            }
            assert!(
                edited.elapsed() < std::time::Duration::from_secs(1),
                "edit not in force after 1s"
            );
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    }

    // An invalid edit never removes the policy in force: generation 2 stays.
    let mut broken = kube.get(CIPS, "deny-bad").unwrap();
    broken["spec"]["rules"][0]["match"] = json!(["Not A Pattern"]);
    broken["metadata"]["generation"] = json!(3);
    kube.insert(CIPS, broken);
    let until = std::time::Instant::now() + std::time::Duration::from_secs(15);
    loop {
        let (st, reason, msg) = ready_of(&kube.get(CIPS, "deny-bad").unwrap());
        if st == "False" {
            assert_eq!(reason, "InvalidSpec");
            assert!(msg.contains("generation 2 stays in force"), "{msg}");
            break;
        }
        assert!(
            std::time::Instant::now() < until,
            "invalid edit not reported"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let p = a.apiserver().create_pod("team-z", &[&ok]).await;
    assert!(
        !p.allowed,
        "the previous generation still denies: {}",
        p.message
    );
}

/// On drain the policy-status Lease is released as the audit Lease is, so
/// another replica writes status at its next try instead of after a full
/// lease duration.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_policy_status_lease_is_released_on_drain() {
    use crate::support::kube::FakeKube;
    const LEASES: &str = "/apis/coordination.k8s.io/v1/namespaces/sigil-system/leases";
    let kube = FakeKube::start().await;
    let mut sigil = Sigil::start_env(
        None,
        &["--watch-policies", "--namespace", "sigil-system"],
        &kube.env(),
    )
    .await;
    let until = std::time::Instant::now() + std::time::Duration::from_secs(15);
    while kube
        .get(LEASES, "sigil-policy-status")
        .is_none_or(|l| l["spec"]["holderIdentity"].as_str().is_none())
    {
        assert!(std::time::Instant::now() < until, "never took the Lease");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    sigil.terminate();
    sigil.wait_exit(std::time::Duration::from_secs(15));
    let lease = kube.get(LEASES, "sigil-policy-status").unwrap();
    assert!(
        lease["spec"]["holderIdentity"].is_null(),
        "the Lease is still held after the drain: {lease}"
    );
    assert!(sigil.logs().contains("lease released"), "{}", sigil.logs());
}

/// Outside its namespace (none created), sigil says once, with the fix,
/// that the namespace is missing — not a warning per retry carrying the
/// API Status in Debug form.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_namespace_is_reported_once_with_the_fix() {
    use crate::support::kube::FakeKube;
    let kube = FakeKube::start().await;
    let sigil = Sigil::start_env(
        None,
        &[
            "--watch-policies",
            "--namespace",
            "nowhere",
            "--audit-interval",
            "10m",
            "--audit-lease-duration",
            "1s",
        ],
        &kube.env(),
    )
    .await;
    // 1 s leases retry every 200 ms: a few seconds are many retries.
    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    let logs = sigil.logs();
    let said: Vec<&str> = logs
        .lines()
        .filter(|l| l.contains("lease update failed"))
        .collect();
    // One line per Lease (the audit's and the policy status'), not one per retry.
    assert_eq!(said.len(), 2, "{logs}");
    for l in said {
        assert!(
            l.contains(
                "namespace nowhere does not exist: create namespace nowhere or pass --namespace"
            ),
            "{l}"
        );
        assert!(!l.contains("Status {"), "Debug form leaked: {l}");
    }
}
