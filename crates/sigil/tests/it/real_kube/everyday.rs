//! What the base does day to day, on a real API server: the status of
//! policy objects (a keyRef'd key and a TrustRoot among them) through their
//! real status subresources, the audit's Lease and its PolicyReports
//! validated by the Policy Working Group's own CRD schema, Events through
//! `events.k8s.io/v1`, a team's ImagePolicyException waiving a rule until it
//! expires, and the policy watches surviving a restart of the API server.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::{base_with_sigil, namespaces_with_accounts, pod, team_with_a_workload};
use crate::kubelet::{POD_NAME, Runtime};
use crate::support::kube::real::{RealKube, assets_or_skip};

const CIPS: &str = "/apis/sigil.dev/v1alpha1/clusterimagepolicies";

/// The PolicyReport CRDs as the Policy Working Group publishes them.
fn report_crds() -> Vec<Value> {
    super::fixture_crds(&[
        "wgpolicyk8s.io_policyreports.yaml",
        "wgpolicyk8s.io_clusterpolicyreports.yaml",
    ])
}

/// Polls `f` every 200 ms until it gives a value; panics naming `what`
/// (with sigil's logs) after `limit`.
async fn eventually<T>(
    what: &str,
    limit: Duration,
    logs: &dyn Fn() -> String,
    mut f: impl AsyncFnMut() -> Option<T>,
) -> T {
    let until = Instant::now() + limit;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(
            Instant::now() < until,
            "timed out waiting for {what}; sigil's logs:\n{}",
            logs()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Waits (up to `limit`) until the object at `path` says in its status
/// that it is in force (its Ready condition True).
async fn wait_in_force(kube: &RealKube, path: &str, limit: Duration, logs: &dyn Fn() -> String) {
    eventually(path, limit, logs, async || {
        kube.get(path)
            .await
            .filter(|o| o["status"]["conditions"][0]["status"] == "True")
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_reports_leases_and_events_on_a_real_api_server_and_watches_survive_its_restart() {
    let Some(assets) = assets_or_skip(
        "status_reports_leases_and_events_on_a_real_api_server_and_watches_survive_its_restart",
    ) else {
        return;
    };
    let kube = RealKube::start(&assets).await;
    // The report CRDs and a workload to audit, before sigil starts.
    kube.apply(&report_crds()).await;
    team_with_a_workload(&kube).await;
    let (launched, _) = base_with_sigil(&kube, Runtime::Process).await;
    let logs = || launched.sigil.logs();

    // Policy objects, a keyRef'd key and a TrustRoot: in force, said in status.
    let (status, v) = kube
        .request(
            "POST",
            CIPS,
            Some(&json!({"apiVersion": "sigil.dev/v1alpha1", "kind": "ClusterImagePolicy",
                "metadata": {"name": "shipped"},
                "spec": {"rules": [{"name": "shop", "match": ["registry.example.com/shop/**"], "mode": "warn"}]}})),
        )
        .await;
    assert_eq!(status, 201, "{v}");
    wait_in_force(
        &kube,
        &format!("{CIPS}/shipped"),
        Duration::from_secs(30),
        &logs,
    )
    .await;
    kube.apply(&[json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "shipped-keys", "namespace": "sigil-system"},
        "data": {"cosign.pub": crate::support::signing::Signer::p256().public_pem()}})])
        .await;
    kube.apply(&[json!({"apiVersion": "sigil.dev/v1alpha1", "kind": "ClusterImagePolicy",
        "metadata": {"name": "shipped-keys"},
        "spec": {"rules": [{"name": "keyed", "match": ["registry.example.com/keyed/**"], "mode": "warn",
            "verify": [{"name": "k", "cosign": {"keyRef": {"configMap": "shipped-keys", "key": "cosign.pub"}}}]}]}})])
        .await;
    wait_in_force(
        &kube,
        &format!("{CIPS}/shipped-keys"),
        Duration::from_secs(30),
        &logs,
    )
    .await;
    let keys: Value = serde_json::from_str(sigil_verify::trust::PUBLIC_GOOD).unwrap();
    let trs = "/apis/sigil.dev/v1alpha1/trustroots";
    kube.apply(&[
        json!({"apiVersion": "sigil.dev/v1alpha1", "kind": "TrustRoot",
        "metadata": {"name": "shipped"}, "spec": {"sigstoreKeys": keys}}),
    ])
    .await;
    wait_in_force(
        &kube,
        &format!("{trs}/shipped"),
        Duration::from_secs(30),
        &logs,
    )
    .await;

    // The audit: its Lease held by this pod, a PolicyReport the real CRD
    // schema accepted, a Warning Event about the workload.
    let lease = eventually(
        "the audit Lease",
        Duration::from_secs(30),
        &logs,
        async || {
            kube.get("/apis/coordination.k8s.io/v1/namespaces/sigil-system/leases/sigil-audit")
                .await
        },
    )
    .await;
    assert!(
        lease["spec"]["holderIdentity"]
            .as_str()
            .unwrap_or_default()
            .starts_with(POD_NAME),
        "{lease}"
    );
    let report = eventually(
        "the team's PolicyReport",
        Duration::from_secs(30),
        &logs,
        async || {
            kube.get("/apis/wgpolicyk8s.io/v1alpha2/namespaces/team/policyreports/sigil")
                .await
        },
    )
    .await;
    assert!(
        report["results"]
            .as_array()
            .is_some_and(|r| r.iter().any(|r| r["resources"][0]["name"] == "app")),
        "the report names the workload: {report}"
    );
    let event = eventually(
        "a Warning Event about team/app",
        Duration::from_secs(30),
        &logs,
        async || {
            kube.get("/apis/events.k8s.io/v1/namespaces/team/events")
                .await?["items"]
                .as_array()?
                .iter()
                .find(|e| e["regarding"]["name"] == "app" && e["type"] == "Warning")
                .cloned()
        },
    )
    .await;
    assert_eq!(event["reportingController"], "sigil.dev/audit", "{event}");

    // The API server restarts under sigil's watches: they resume, and a
    // policy written afterwards is in force (its deny rule refuses a Pod)
    // and says so in its status. Watches cut by an outage resume with
    // client-go's backoff (up to 30 s between attempts), and the new server
    // answers 403 until its RBAC informers have synced: seen here, never
    // produced by the stand-in.
    kube.restart_apiserver().await;
    kube.apply(&[json!({"apiVersion": "sigil.dev/v1alpha1", "kind": "ClusterImagePolicy",
        "metadata": {"name": "after-restart"},
        "spec": {"rules": [{"name": "late", "match": ["registry.example.com/late/**"], "action": "deny"}]}})])
        .await;
    let mut n = 0;
    eventually(
        "the policy written after the restart to deny",
        Duration::from_secs(75),
        &logs,
        async || {
            n += 1;
            let late = pod(
                "shop",
                &format!("late-{n}"),
                "registry.example.com/late/x:1",
            );
            let (status, _) = kube
                .request("POST", "/api/v1/namespaces/shop/pods", Some(&late))
                .await;
            (status == 403).then_some(())
        },
    )
    .await;
    wait_in_force(
        &kube,
        &format!("{CIPS}/after-restart"),
        Duration::from_secs(30),
        &logs,
    )
    .await;
    let reg = &launched.registry;
    let digest = reg.push_image("shop/app", "2.0").await;
    let image = format!("{}/shop/app:2.0", reg.host());
    let (status, created) = kube
        .request(
            "POST",
            "/api/v1/namespaces/shop/pods",
            Some(&pod("shop", "after", &image)),
        )
        .await;
    assert_eq!(status, 201, "{created}");
    assert_eq!(
        created["spec"]["containers"][0]["image"],
        format!("{image}@{digest}")
    );
}

/// A team's ImagePolicyException on a real API server: the CRD stores it,
/// sigil waives the rule in that namespace until it expires (the API
/// server's own call admits the Pod), writes its status through the status
/// subresource, and at expiry denies again and says so with an Event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exception_waives_a_rule_until_it_expires_on_a_real_api_server() {
    let Some(assets) =
        assets_or_skip("an_exception_waives_a_rule_until_it_expires_on_a_real_api_server")
    else {
        return;
    };
    let kube = RealKube::start(&assets).await;
    let (launched, _) = base_with_sigil(&kube, Runtime::Process).await;
    let logs = || launched.sigil.logs();
    namespaces_with_accounts(&kube, &["team-a"]).await;
    kube.apply(&[
        json!({"apiVersion": "sigil.dev/v1alpha1", "kind": "ClusterImagePolicy",
        "metadata": {"name": "supply-chain"},
        "spec": {"rules": [
            {"name": "banned", "match": ["registry.example.com/legacy/**"], "action": "deny",
             "exceptions": {"allowed": true, "maxDuration": "1h"}}]}}),
    ])
    .await;
    wait_in_force(
        &kube,
        &format!("{CIPS}/supply-chain"),
        Duration::from_secs(30),
        &logs,
    )
    .await;
    let image = "registry.example.com/legacy/api:1";
    let create = async |name: &str| {
        kube.request(
            "POST",
            "/api/v1/namespaces/team-a/pods",
            Some(&pod("team-a", name, image)),
        )
        .await
    };
    let (status, denied) = create("before").await;
    assert_eq!(status, 403, "denied by the rule: {denied}");
    assert!(
        denied["message"]
            .as_str()
            .unwrap_or_default()
            .contains("banned"),
        "{denied}"
    );

    let expires =
        humantime::format_rfc3339_seconds(std::time::SystemTime::now() + Duration::from_secs(12))
            .to_string();
    let exceptions = "/apis/sigil.dev/v1alpha1/namespaces/team-a/imagepolicyexceptions";
    kube.apply(&[
        json!({"apiVersion": "sigil.dev/v1alpha1", "kind": "ImagePolicyException",
        "metadata": {"name": "legacy", "namespace": "team-a"},
        "spec": {"images": ["registry.example.com/legacy/**"],
                 "rules": [{"policy": "ClusterImagePolicy/supply-chain", "rule": "banned"}],
                 "expires": expires, "reason": "vendor image, signed build pending",
                 "ticket": "SEC-1234"}}),
    ])
    .await;
    let mut n = 0;
    eventually(
        "the exception to admit",
        Duration::from_secs(10),
        &logs,
        async || {
            n += 1;
            (create(&format!("during-{n}")).await.0 == 201).then_some(())
        },
    )
    .await;
    let state = async |want: &str| {
        kube.get(&format!("{exceptions}/legacy"))
            .await
            .filter(|o| o["status"]["state"] == want)
    };
    eventually(
        "status Active",
        Duration::from_secs(10),
        &logs,
        async || state("Active").await,
    )
    .await;

    // At expiry: denied again, status Expired, an Event saying so.
    eventually(
        "the exception to expire",
        Duration::from_secs(30),
        &logs,
        async || (create("after").await.0 == 403).then_some(()),
    )
    .await;
    eventually(
        "status Expired",
        Duration::from_secs(15),
        &logs,
        async || state("Expired").await,
    )
    .await;
    eventually(
        "an ExceptionExpired Event",
        Duration::from_secs(15),
        &logs,
        async || {
            kube.get("/apis/events.k8s.io/v1/namespaces/team-a/events")
                .await?["items"]
                .as_array()?
                .iter()
                .find(|e| e["reason"] == "ExceptionExpired" && e["regarding"]["name"] == "legacy")
                .cloned()
        },
    )
    .await;
}

/// The `pull-secrets` overlay as shipped, on a real API server: with only
/// the rights it grants, sigil reads a namespace's pull secrets and its
/// `default` ServiceAccount's, and pins images from a registry behind
/// htpasswd with them; a Pod with no credential is refused. Only the policy
/// is the test's (the registry's host, and `enforce` so a failed pull
/// denies).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pull_secrets_overlay_pulls_with_a_namespaces_own_secrets_on_a_real_api_server() {
    use crate::support::registry::{Mode, TestRegistry};
    let Some(assets) = assets_or_skip(
        "the_pull_secrets_overlay_pulls_with_a_namespaces_own_secrets_on_a_real_api_server",
    ) else {
        return;
    };
    let (user, password) = ("puller", "s3cret-pull");
    let private = TestRegistry::start(Mode::Htpasswd { user, password }).await;
    let digest = private.push_image("team/app", "v1").await;
    let host = private.host();
    let mut objects = crate::deploy::render("overlays/pull-secrets");
    let policy = objects
        .iter_mut()
        .find(|o| o["kind"] == "ConfigMap" && o["metadata"]["name"] == "sigil-policy")
        .expect("the shipped policy ConfigMap");
    policy["data"]["policy.yaml"] = json!(format!(
        "apiVersion: sigil.dev/v1alpha1\nkind: ImagePolicy\nspec:\n  registries:\n    - {{host: \"{host}\", insecure: true}}\n  rules:\n    - {{name: team, match: [\"{host}/**\"], mode: enforce}}\n"
    ));
    let kube = RealKube::start(&assets).await;
    let (launched, _) = super::install_with_sigil(&kube, objects, Runtime::Process).await;
    kube.namespaces(&["team"]).await;
    let secret = crate::credentials::pull_secret("team", "regcred", &host, user, password);
    kube.apply(&[
        secret,
        json!({"apiVersion": "v1", "kind": "ServiceAccount",
               "metadata": {"name": "default", "namespace": "team"},
               "imagePullSecrets": [{"name": "regcred"}]}),
        json!({"apiVersion": "v1", "kind": "ServiceAccount",
               "metadata": {"name": "bare", "namespace": "team"}}),
    ])
    .await;
    let image = format!("{host}/team/app:v1");
    let logs = || launched.sigil.logs();
    // Through the default ServiceAccount's pull secret (once the watch has
    // read it: retried until then).
    let mut n = 0;
    let created = eventually(
        "a Pod pinned with the namespace's pull secret",
        Duration::from_secs(30),
        &logs,
        async || {
            n += 1;
            let (status, v) = kube
                .request(
                    "POST",
                    "/api/v1/namespaces/team/pods",
                    Some(&pod("team", &format!("web-{n}"), &image)),
                )
                .await;
            (status == 201).then_some(v)
        },
    )
    .await;
    assert_eq!(
        created["spec"]["containers"][0]["image"],
        format!("{image}@{digest}")
    );
    // A ServiceAccount without pull secrets: sigil cannot pull, enforce denies.
    let mut bare = pod("team", "bare", &image);
    bare["spec"]["serviceAccountName"] = json!("bare");
    let (status, refused) = kube
        .request("POST", "/api/v1/namespaces/team/pods", Some(&bare))
        .await;
    assert_eq!(status, 403, "{refused}");
    // Named on the Pod itself.
    let mut own = pod("team", "own", &image);
    own["spec"]["serviceAccountName"] = json!("bare");
    own["spec"]["imagePullSecrets"] = json!([{"name": "regcred"}]);
    let (status, v) = kube
        .request("POST", "/api/v1/namespaces/team/pods", Some(&own))
        .await;
    assert_eq!(status, 201, "{v}");
    assert_eq!(
        v["spec"]["containers"][0]["image"],
        format!("{image}@{digest}")
    );
}
