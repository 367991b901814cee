//! `sigil serve` end to end: real registry, real HTTPS, apiserver-like client.

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sigil_core::walker::image_fields;

use crate::support::fault::{DIGEST, Fault, FaultServer};
use crate::support::registry::{Mode, TestRegistry};
use crate::support::review::{pod, review};
use crate::support::sigil::Sigil;
use crate::support::{fixture, fixture_bytes};

const T: Duration = Duration::from_secs(10);

fn policy(body: &str) -> String {
    format!(
        "apiVersion: sigil.dev/v1alpha1\nkind: ImagePolicy\nmetadata: {{name: test}}\nspec:\n{body}"
    )
}

/// Pins every image, enforcing, with `host` reached over plain HTTP.
fn pin_all_from(host: &str) -> String {
    policy(&format!(
        "  registries:\n    - {{host: \"{host}\", insecure: true}}\n  rules:\n    - {{name: all, match: [\"**\"]}}\n"
    ))
}

/// sigil with user `robot` and `password` (from a file in `dir`) for `host`.
async fn with_password(
    host: &str,
    password: &str,
    extra_spec: &str,
    dir: &tempfile::TempDir,
) -> Sigil {
    let pw = dir.path().join("pw");
    std::fs::write(&pw, password).unwrap();
    let p = policy(&format!(
        "  registries:\n    - host: \"{host}\"\n      insecure: true\n      auth: {{username: robot, passwordFile: \"{}\"}}\n{extra_spec}  rules:\n    - {{name: all, match: [\"**\"]}}\n",
        pw.display()
    ));
    Sigil::start(Some(&p), &[]).await
}

fn images_of(obj: &Value) -> Vec<String> {
    image_fields(obj).into_iter().map(|f| f.value).collect()
}

/// Every fixture kind is pinned through the real registry; the patched object
/// still decodes; the reinvocation changes nothing.
#[tokio::test]
async fn every_fixture_kind_is_pinned_and_reinvocation_is_a_no_op() {
    let reg = TestRegistry::start(Mode::Plain).await;
    let h = reg.host();
    let app = reg.push_image("fixtures/app", "v1").await;
    let (multi, _) = reg
        .push_index(
            "fixtures/multi",
            "v2",
            &[("linux", "amd64", None), ("linux", "arm64", Some("v8"))],
        )
        .await;
    let sigil = Sigil::start(Some(&policy(&format!(
        "  registries:\n    - {{host: \"{h}\", insecure: true}}\n  rules:\n    - {{name: local, match: [\"{h}/**\"], mode: enforce}}\n    - {{name: rest, match: [\"**\"], mode: warn}}\n"
    ))), &[])
    .await;
    let api = sigil.apiserver();
    let with_images = [
        "01_deployment.json",
        "02_pod.json",
        "03_replicaset.json",
        "04_cronjob.json",
        "05_replication_controller.json",
        "06_daemonset.json",
        "07_statefulset.json",
        "08_job.json",
        "09_dply_multi_image.json",
        "10_update.json",
        "13_unknown_parent.json",
        "14_deny_me_job.json",
        "15_allow_me_job.json",
        "16_mismatch_uid.json",
        "17_deny_me_pod.json",
        "18_allow_me_pod.json",
        "19_pod_initcontainer.json",
        "20_pod_ephemeralcontainer.json",
        "22_allow_me_with_index_docker_io.json",
        "23_alice_digest_dpl.json",
        "24_alice_tag_digest_dpl.json",
    ];
    for name in with_images {
        let mut rev = fixture(name);
        let obj = &mut rev["request"]["object"];
        let fields = image_fields(obj);
        assert!(!fields.is_empty(), "{name} has no images");
        let mut want = Vec::new();
        for (i, f) in fields.iter().enumerate() {
            let (img, d) = if i % 2 == 0 {
                (format!("{h}/fixtures/app:v1"), &app)
            } else {
                (format!("{h}/fixtures/multi:v2"), &multi)
            };
            *obj.pointer_mut(&f.pointer).unwrap() = json!(img);
            want.push(format!("{img}@{d}"));
        }
        let got = api.admit(&rev, T).await;
        assert!(got.allowed, "{name}: {}", got.message);
        assert!(got.patched, "{name} was not patched");
        assert_eq!(images_of(&got.object), want, "{name}");
        let again = got.reinvoked.expect("reinvoked");
        assert!(
            again.allowed && !again.patched,
            "{name}: reinvocation must be a no-op: {:?}",
            again.response
        );
        let audit = got.response["response"]["auditAnnotations"]["images"]
            .as_str()
            .unwrap_or_default();
        assert!(
            audit.contains(&format!("{h}/fixtures/app:v1")),
            "{name}: audit annotation {audit}"
        );
    }
    // One registry lookup per distinct tag, however many objects used it.
    let heads = sigil
        .counter("sigil_registry_requests_total", &[("method", "HEAD")])
        .await;
    assert_eq!(heads, 2.0, "{}", sigil.metrics().await);
}

#[tokio::test]
async fn multi_arch_index_pins_index_or_platform_manifest() {
    let reg = TestRegistry::start(Mode::Plain).await;
    let h = reg.host();
    let (index, per) = reg
        .push_index(
            "multi/app",
            "1.0",
            &[
                ("linux", "amd64", None),
                ("linux", "arm64", Some("v8")),
                ("linux", "arm", Some("v7")),
            ],
        )
        .await;
    let base = format!(
        "  registries:\n    - {{host: \"{h}\", insecure: true}}\n  rules:\n    - {{name: all, match: [\"**\"], mode: enforce}}\n"
    );
    let img = format!("{h}/multi/app:1.0");
    let s = Sigil::start(Some(&policy(&base)), &[]).await;
    let got = s.apiserver().create_pod("default", &[&img]).await;
    assert_eq!(images_of(&got.object), [format!("{img}@{index}")]);
    drop(s);
    for (platform, want) in [
        ("linux/arm64", &per[1].1),
        ("linux/amd64", &per[0].1),
        ("linux/arm/v7", &per[2].1),
    ] {
        let s = Sigil::start(
            Some(&policy(&format!(
                "{base}  pin: {{platform: \"{platform}\"}}\n"
            ))),
            &[],
        )
        .await;
        let got = s.apiserver().create_pod("default", &[&img]).await;
        assert_eq!(
            images_of(&got.object),
            [format!("{img}@{want}")],
            "{platform}"
        );
    }
    let s = Sigil::start(
        Some(&policy(&format!(
            "{base}  pin: {{platform: \"linux/s390x\"}}\n"
        ))),
        &[],
    )
    .await;
    let got = s.apiserver().create_pod("default", &[&img]).await;
    assert!(!got.allowed);
    assert!(
        got.message.contains("no manifest for linux/s390x")
            && got.message.contains("linux/arm64/v8"),
        "{}",
        got.message
    );
}

/// origin → mirror on the way in; mirror → origin for rule matching; the
/// second pass (IfNeeded) sees the mirrored name and changes nothing.
#[tokio::test]
async fn mirror_round_trip_is_idempotent() {
    let reg = TestRegistry::start(Mode::Plain).await;
    let h = reg.host();
    let d = reg.push_image("mirror/hub/library/nginx", "1.25").await;
    let p = policy(&format!(
        "  mirrors:\n    - {{from: docker.io, to: \"{h}/mirror/hub\"}}\n  registries:\n    - {{host: \"{h}\", insecure: true}}\n  rules:\n    - {{name: hub, match: [\"docker.io/**\"], mode: enforce}}\n    - {{name: blocked, match: [\"docker.io/library/busybox\"], action: deny}}\n    - {{name: local-is-denied, match: [\"{h}/**\"], action: deny}}\n"
    ));
    let s = Sigil::start(Some(&p), &[]).await;
    let api = s.apiserver();
    let got = api.create_pod("default", &["nginx:1.25"]).await;
    assert!(got.allowed, "{}", got.message);
    assert_eq!(
        images_of(&got.object),
        [format!("{h}/mirror/hub/library/nginx:1.25@{d}")]
    );
    let again = got.reinvoked.unwrap();
    assert!(
        again.allowed && !again.patched,
        "rule must match the origin on the second pass: {}",
        again.message
    );
    // The decision line `sigil serve` formats by hand: one JSON object.
    let line = decision_line(&s, "nginx:1.25 -> ").await;
    assert_eq!(line["level"], "INFO");
    assert_eq!(line["message"], "admission");
    assert_eq!(line["target"], "sigil::admission");
    assert_eq!(line["decision"], "patched");
    assert_eq!(line["operation"], "CREATE");
    assert_eq!(
        line["images"],
        format!(
            "spec.containers[0].image pinned: nginx:1.25 -> {h}/mirror/hub/library/nginx:1.25@{d}"
        )
    );
    assert!(line["elapsed_ms"].as_f64().is_some(), "{line}");
    // The mirrored spelling of a blocked origin is still blocked.
    let got = api
        .admit(
            &review(
                "CREATE",
                "default",
                pod("p", &[&format!("{h}/mirror/hub/library/busybox:1")]),
            ),
            T,
        )
        .await;
    assert!(
        !got.allowed && got.message.contains("rule \"blocked\""),
        "{}",
        got.message
    );
}

/// The first decision line of the server's log that contains `needle`, parsed.
async fn decision_line(s: &Sigil, needle: &str) -> Value {
    let until = Instant::now() + Duration::from_secs(5);
    loop {
        let logs = s.logs();
        if let Some(l) = logs
            .lines()
            .find(|l| l.contains("\"message\":\"admission\"") && l.contains(needle))
        {
            return serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}"));
        }
        assert!(Instant::now() < until, "no decision line: {logs}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The finalizer / DELETE / exempt rules hold even when the registry is down
/// and the rule enforces; dryRun gets the same answer as a real request.
#[tokio::test]
async fn never_blocks_delete_finalizers_or_exempt_namespaces() {
    let p = policy(
        "  rules:\n    - {name: all, match: [\"**\"], mode: enforce}\n  exemptNamespaces: [kube-system, sigil-system]\n  registries:\n    - {host: \"127.0.0.1:9\", insecure: true}\n",
    );
    let s = Sigil::start(Some(&p), &[]).await;
    let api = s.apiserver();
    for name in [
        "28_deleted_deployment_updated.json",
        "29_deleted_deployment_update_for_delete.json",
    ] {
        let rev = fixture(name);
        let got = api.admit(&rev, T).await;
        assert!(got.allowed && !got.patched, "{name}: {}", got.message);
    }
    // A CREATE never carries a real deletionTimestamp (the API server clears
    // it), so fixture 27 is decided like any other CREATE: here, denied.
    let got = api.admit(&fixture("27_deleted_deployment.json"), T).await;
    assert!(!got.allowed, "{:?}", got.response);
    let mut del = review("DELETE", "default", pod("p", &["127.0.0.1:9/x:1"]));
    del["request"]["oldObject"] = del["request"]["object"].take();
    let got = api.admit(&del, T).await;
    assert!(got.allowed && !got.patched);
    let got = api
        .admit(
            &review("CONNECT", "default", pod("p", &["127.0.0.1:9/x:1"])),
            T,
        )
        .await;
    assert!(got.allowed && !got.patched);
    let got = api.create_pod("kube-system", &["127.0.0.1:9/x:1"]).await;
    assert!(got.allowed && !got.patched);
    // Not exempt, registry down: enforce denies, and says what the registry did.
    let mut dry = review("CREATE", "default", pod("p", &["127.0.0.1:9/x:1"]));
    dry["request"]["dryRun"] = json!(true);
    let got = api.admit(&dry, T).await;
    assert!(!got.allowed);
    assert!(
        got.message.contains("127.0.0.1:9/x:1")
            && got.message.contains("unreachable")
            && got.message.contains("container \"c0\""),
        "{}",
        got.message
    );
}

#[tokio::test]
async fn deny_and_warn_paths_say_what_why_and_how_to_fix() {
    let reg = TestRegistry::start(Mode::Plain).await;
    let h = reg.host();
    reg.push_image("team/app", "v1").await;
    let p = policy(&format!(
        "  registries:\n    - {{host: \"{h}\", insecure: true}}\n  rules:\n    - {{name: team, match: [\"{h}/team/**\"], mode: enforce}}\n    - {{name: soft, match: [\"{h}/soft/**\"], mode: warn}}\n    - {{name: nope, match: [\"{h}/blocked/*\"], action: deny}}\n    - {{name: free, match: [\"{h}/free/**\"], action: allow}}\n"
    ));
    let s = Sigil::start(Some(&p), &[]).await;
    let api = s.apiserver();
    // 404 in enforce: denied, naming image, container, object, registry answer, fix.
    let mut d = json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web", "namespace": "shop"},
        "spec": {"template": {"spec": {"containers": [{"name": "api", "image": format!("{h}/team/missing:v9")}]}}}});
    let got = api.admit(&review("CREATE", "shop", d.clone()), T).await;
    assert!(!got.allowed);
    for want in [
        &format!("{h}/team/missing:v9"),
        "container \"api\"",
        "Deployment shop/web",
        "404",
        "MANIFEST_UNKNOWN",
        "to fix:",
    ] {
        assert!(
            got.message.contains(want),
            "missing {want:?} in: {}",
            got.message
        );
    }
    assert_eq!(got.response["response"]["status"]["code"], 403);
    // warn: admitted unchanged with a warning.
    d["spec"]["template"]["spec"]["containers"][0]["image"] = json!(format!("{h}/soft/missing:v9"));
    let got = api.admit(&review("CREATE", "shop", d.clone()), T).await;
    assert!(got.allowed && !got.patched);
    assert!(
        got.warnings
            .iter()
            .any(|w| w.contains("soft/missing:v9") && w.contains("404")),
        "{:?}",
        got.warnings
    );
    // static deny, allow without pinning, no rule, invalid reference.
    let got = api.create_pod("shop", &[&format!("{h}/blocked/x:1")]).await;
    assert!(
        !got.allowed && got.message.contains("denied by rule \"nope\""),
        "{}",
        got.message
    );
    let got = api.create_pod("shop", &[&format!("{h}/free/x:1")]).await;
    assert!(got.allowed && !got.patched);
    let got = api.create_pod("shop", &["quay.io/x/y:1"]).await;
    assert!(
        !got.allowed && got.message.contains("matches no rule"),
        "{}",
        got.message
    );
    let got = api.create_pod("shop", &["Not/A:Valid:Ref"]).await;
    assert!(
        !got.allowed && got.message.contains("not a valid image reference"),
        "{}",
        got.message
    );
    // Mixed: one good, one bad in enforce → whole object denied, nothing patched.
    let got = api
        .admit(
            &review(
                "CREATE",
                "shop",
                pod(
                    "p",
                    &[&format!("{h}/team/app:v1"), &format!("{h}/team/missing:v9")],
                ),
            ),
            T,
        )
        .await;
    assert!(!got.allowed && !got.patched);
    // An UPDATE that keeps an already-present unresolvable image is not blocked.
    let mut upd = review(
        "UPDATE",
        "shop",
        pod("p", &[&format!("{h}/team/missing:v9")]),
    );
    upd["request"]["oldObject"] = upd["request"]["object"].clone();
    let got = api.admit(&upd, T).await;
    assert!(
        got.allowed && got.warnings.iter().any(|w| w.contains("missing:v9")),
        "{:?}",
        got.response
    );
}

#[tokio::test]
async fn scope_pods_checks_workloads_but_patches_only_pods() {
    let reg = TestRegistry::start(Mode::Plain).await;
    let h = reg.host();
    let d = reg.push_image("a/b", "1").await;
    let s = Sigil::start(Some(&policy(&format!("  registries:\n    - {{host: \"{h}\", insecure: true}}\n  pin: {{scope: pods}}\n  rules:\n    - {{name: all, match: [\"**\"]}}\n"))), &[]).await;
    let api = s.apiserver();
    let img = format!("{h}/a/b:1");
    let dep = json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "w"}, "spec": {"template": {"spec": {"containers": [{"name": "c", "image": img}]}}}});
    let got = api
        .admit(&review("CREATE", "default", dep.clone()), T)
        .await;
    assert!(got.allowed && !got.patched);
    let mut bad = dep;
    bad["spec"]["template"]["spec"]["containers"][0]["image"] = json!(format!("{h}/a/missing:1"));
    assert!(
        !api.admit(&review("CREATE", "default", bad), T)
            .await
            .allowed,
        "checked even when not patched"
    );
    let got = api.create_pod("default", &[&img]).await;
    assert_eq!(images_of(&got.object), [format!("{img}@{d}")]);
}

#[tokio::test]
async fn htpasswd_registry_needs_the_policy_credentials_and_secrets_stay_out_of_logs() {
    let reg = TestRegistry::start(Mode::Htpasswd {
        user: "robot",
        password: "s3cr3t-pa55",
    })
    .await;
    let h = reg.host();
    let d = reg.push_image("private/app", "v1").await;
    let img = format!("{h}/private/app:v1");
    // No credentials: the registry's 401 is reported.
    let s = Sigil::start(Some(&pin_all_from(&h)), &[]).await;
    let got = s.apiserver().create_pod("default", &[&img]).await;
    assert!(
        !got.allowed && got.message.contains("401") && got.message.contains("credentials"),
        "{}",
        got.message
    );
    drop(s);
    // Credentials from a password file.
    let dir = tempfile::tempdir().unwrap();
    let s = with_password(&h, "s3cr3t-pa55\n", "", &dir).await;
    let got = s.apiserver().create_pod("default", &[&img]).await;
    assert_eq!(
        images_of(&got.object),
        [format!("{img}@{d}")],
        "{}",
        got.message
    );
    drop(s);
    // Credentials from a docker config.json.
    let auth = base64::Engine::encode(
        &base64::engine::general_purpose::STANDARD,
        "robot:s3cr3t-pa55",
    );
    let cfg = dir.path().join("config.json");
    std::fs::write(
        &cfg,
        format!(r#"{{"auths":{{"{h}":{{"auth":"{auth}"}}}}}}"#),
    )
    .unwrap();
    let s = Sigil::start(
        Some(&policy(&format!("  registries:\n    - host: \"{h}\"\n      insecure: true\n      auth: {{dockerConfig: \"{}\"}}\n  rules:\n    - {{name: all, match: [\"**\"]}}\n", cfg.display()))),
        &[],
    )
    .await;
    let got = s.apiserver().create_pod("default", &[&img]).await;
    assert_eq!(
        images_of(&got.object),
        [format!("{img}@{d}")],
        "{}",
        got.message
    );
    let logs = s.settled_logs().await;
    assert!(
        !logs.contains("s3cr3t-pa55") && !logs.contains(&auth),
        "a secret reached the logs"
    );
}

/// The real registry in token mode: sigil follows the Bearer challenge to the
/// token service, with the policy's credentials, and caches the token.
#[tokio::test]
async fn bearer_token_registry_is_resolved_through_the_token_service() {
    let (ts, reg) = crate::support::token::token_registry("robot", "t0ken-pa55", "tok/app").await;
    let h = reg.host();
    let d = reg.push_image("tok/app", "v1").await;
    let img = format!("{h}/tok/app:v1");
    // Anonymous: the token service refuses and the denial says so.
    let s = Sigil::start(Some(&pin_all_from(&h)), &[]).await;
    let got = s.apiserver().create_pod("default", &[&img]).await;
    assert!(
        !got.allowed && got.message.contains("token service refused"),
        "{}",
        got.message
    );
    drop(s);
    let dir = tempfile::tempdir().unwrap();
    let s = with_password(&h, "t0ken-pa55", "  pin: {cacheTTL: 1ms}\n", &dir).await;
    let api = s.apiserver();
    let got = api.create_pod("default", &[&img]).await;
    assert_eq!(
        images_of(&got.object),
        [format!("{img}@{d}")],
        "{}",
        got.message
    );
    let hits = ts.hits.load(std::sync::atomic::Ordering::SeqCst);
    // Digest cache expired (1ms TTL), token still valid: no new token request.
    tokio::time::sleep(Duration::from_millis(20)).await;
    let got = api.create_pod("default", &[&img]).await;
    assert!(got.patched);
    assert_eq!(
        ts.hits.load(std::sync::atomic::Ordering::SeqCst),
        hits,
        "token is reused until it expires"
    );
    assert!(!s.settled_logs().await.contains("t0ken-pa55"));
}

#[tokio::test]
async fn tls_registry_is_trusted_only_with_the_policy_ca() {
    let reg = TestRegistry::start(Mode::Tls).await;
    let h = reg.host();
    let d = reg.push_image("secure/app", "v1").await;
    let img = format!("{h}/secure/app:v1");
    let s = Sigil::start(
        Some(&policy("  rules:\n    - {name: all, match: [\"**\"]}\n")),
        &[],
    )
    .await;
    let got = s.apiserver().create_pod("default", &[&img]).await;
    assert!(
        !got.allowed && got.message.contains("unreachable"),
        "{}",
        got.message
    );
    drop(s);
    let ca = reg.dir.path().join("ca.pem");
    std::fs::write(&ca, reg.ca_pem.as_ref().unwrap()).unwrap();
    let s = Sigil::start(Some(&policy(&format!("  registries:\n    - {{host: \"{h}\", ca: \"{}\"}}\n  rules:\n    - {{name: all, match: [\"**\"]}}\n", ca.display()))), &[]).await;
    let got = s.apiserver().create_pod("default", &[&img]).await;
    assert_eq!(
        images_of(&got.object),
        [format!("{img}@{d}")],
        "{}",
        got.message
    );
    // insecure: true means plain HTTP, which a TLS registry refuses.
    drop(s);
    let s = Sigil::start(Some(&pin_all_from(&h)), &[]).await;
    let got = s.apiserver().create_pod("default", &[&img]).await;
    assert!(!got.allowed, "{:?}", got.response);
}

/// Faults a real registry cannot make: slow past the deadline, 5xx, 429.
#[tokio::test]
async fn slow_registry_is_cut_at_the_apiserver_deadline() {
    let slow = FaultServer::start(Fault::Slow(Duration::from_secs(20))).await;
    let fast_reg = TestRegistry::start(Mode::Plain).await;
    let fh = fast_reg.host();
    let d = fast_reg.push_image("x/fast", "1").await;
    let sh = slow.addr.to_string();
    let p = policy(&format!(
        "  registries:\n    - {{host: \"{sh}\", insecure: true}}\n    - {{host: \"{fh}\", insecure: true}}\n  rules:\n    - {{name: slow, match: [\"{sh}/**\"], mode: enforce}}\n    - {{name: soft, match: [\"{sh}/soft/**\"], mode: warn}}\n    - {{name: fast, match: [\"{fh}/**\"]}}\n"
    ));
    let s = Sigil::start(Some(&p), &[]).await;
    let api = s.apiserver();
    let started = Instant::now();
    let got = api
        .admit(
            &review(
                "CREATE",
                "default",
                pod("p", &[&format!("{sh}/x/slow:1"), &format!("{fh}/x/fast:1")]),
            ),
            Duration::from_secs(2),
        )
        .await;
    let took = started.elapsed();
    assert!(
        took < Duration::from_millis(1950),
        "answer must come before the 2 s deadline, took {took:?}"
    );
    assert!(
        !got.allowed && got.message.contains("deadline") && got.message.contains("x/slow:1"),
        "{}",
        got.message
    );
    // In warn mode the same timeout admits unchanged with a warning.
    let got = api
        .admit(
            &review(
                "CREATE",
                "default",
                pod(
                    "p",
                    &[&format!("{sh}/soft/slow:1"), &format!("{fh}/x/fast:1")],
                ),
            ),
            Duration::from_secs(2),
        )
        .await;
    assert!(
        got.allowed && got.warnings.iter().any(|w| w.contains("deadline")),
        "{:?}",
        got.response
    );
    assert_eq!(images_of(&got.object)[1], format!("{fh}/x/fast:1@{d}"));
}

#[tokio::test]
async fn registry_5xx_and_429_are_reported_or_retried() {
    let e503 = FaultServer::start(Fault::Status(503)).await;
    let rl = FaultServer::start(Fault::RateLimitOnce(1)).await;
    let rl_long = FaultServer::start(Fault::RateLimitOnce(60)).await;
    let (a, b, c) = (
        e503.addr.to_string(),
        rl.addr.to_string(),
        rl_long.addr.to_string(),
    );
    let p = policy(&format!(
        "  registries:\n    - {{host: \"{a}\", insecure: true}}\n    - {{host: \"{b}\", insecure: true}}\n    - {{host: \"{c}\", insecure: true}}\n  rules:\n    - {{name: all, match: [\"**\"]}}\n"
    ));
    let s = Sigil::start(Some(&p), &[]).await;
    let api = s.apiserver();
    let got = api.create_pod("default", &[&format!("{a}/x:1")]).await;
    assert!(
        !got.allowed && got.message.contains("503"),
        "{}",
        got.message
    );
    let got = api.create_pod("default", &[&format!("{b}/x:1")]).await;
    assert_eq!(
        images_of(&got.object),
        [format!("{b}/x:1@{DIGEST}")],
        "Retry-After 1s fits the deadline: {}",
        got.message
    );
    let got = api.create_pod("default", &[&format!("{c}/x:1")]).await;
    assert!(
        !got.allowed && got.message.contains("429"),
        "{}",
        got.message
    );
    // Transient failures are not cached: the 503 host is asked again.
    let before = e503.hits.load(std::sync::atomic::Ordering::SeqCst);
    api.create_pod("default", &[&format!("{a}/x:1")]).await;
    assert!(e503.hits.load(std::sync::atomic::Ordering::SeqCst) > before);
}

/// Without Docker-Content-Digest sigil hashes the manifest it fetched; a
/// header that disagrees with the bytes is refused, not pinned.
#[tokio::test]
async fn missing_or_lying_digest_header_falls_back_to_hashing_the_manifest() {
    let plain = FaultServer::start(Fault::NoDigestHeader { lie: false }).await;
    let liar = FaultServer::start(Fault::NoDigestHeader { lie: true }).await;
    let (a, b) = (plain.addr.to_string(), liar.addr.to_string());
    let p = policy(&format!(
        "  registries:\n    - {{host: \"{a}\", insecure: true}}\n    - {{host: \"{b}\", insecure: true}}\n  rules:\n    - {{name: all, match: [\"**\"]}}\n"
    ));
    let s = Sigil::start(Some(&p), &[]).await;
    let api = s.apiserver();
    let got = api.create_pod("default", &[&format!("{a}/x:1")]).await;
    let want = crate::support::registry::sha256(crate::support::fault::BODY);
    assert_eq!(
        images_of(&got.object),
        [format!("{a}/x:1@{want}")],
        "{}",
        got.message
    );
    let got = api.create_pod("default", &[&format!("{b}/x:1")]).await;
    assert!(
        !got.allowed && got.message.contains("does not match"),
        "{}",
        got.message
    );
}

/// A 404 is remembered briefly: a burst of Pods naming a missing tag costs
/// the registry one lookup, not one per Pod.
#[tokio::test]
async fn not_found_is_cached_briefly() {
    let missing = FaultServer::start(Fault::Status(404)).await;
    let a = missing.addr.to_string();
    let s = Sigil::start(Some(&pin_all_from(&a)), &[]).await;
    let api = s.apiserver();
    for _ in 0..5 {
        let got = api.create_pod("default", &[&format!("{a}/gone:1")]).await;
        assert!(
            !got.allowed && got.message.contains("404"),
            "{}",
            got.message
        );
    }
    // HEAD, then GET for the registry's error body: two requests in all.
    assert_eq!(missing.hits.load(std::sync::atomic::Ordering::SeqCst), 2);
}

/// IPv6 registry hosts (`[::1]:port/…`) parse, match, resolve and pin.
#[tokio::test]
async fn ipv6_registry_host_is_pinned() {
    let reg = TestRegistry::start(Mode::PlainV6).await;
    let h = reg.host();
    assert!(h.starts_with("[::1]:"), "{h}");
    let d = reg.push_image("v6/app", "1").await;
    let s = Sigil::start(Some(&pin_all_from(&h)), &[]).await;
    let img = format!("{h}/v6/app:1");
    let got = s.apiserver().create_pod("default", &[&img]).await;
    assert_eq!(
        images_of(&got.object),
        [format!("{img}@{d}")],
        "{}",
        got.message
    );
    assert!(!got.reinvoked.unwrap().patched);
}

/// `maxConcurrentRequests` bounds what one registry sees from sigil, while
/// lookups of one Pod otherwise run concurrently (latency = the slowest).
#[tokio::test]
async fn per_registry_concurrency_limit_is_respected() {
    let slow = FaultServer::start(Fault::Slow(Duration::from_millis(300))).await;
    let a = slow.addr.to_string();
    let imgs: Vec<String> = (0..3).map(|i| format!("{a}/x:{i}")).collect();
    let imgs: Vec<&str> = imgs.iter().map(String::as_str).collect();
    let s = Sigil::start(Some(&pin_all_from(&a)), &[]).await;
    let t = Instant::now();
    assert!(s.apiserver().create_pod("default", &imgs).await.patched);
    let concurrent = t.elapsed();
    drop(s);
    let p = policy(&format!(
        "  registries:\n    - {{host: \"{a}\", insecure: true, maxConcurrentRequests: 1}}\n  rules:\n    - {{name: all, match: [\"**\"]}}\n"
    ));
    let s = Sigil::start(Some(&p), &[]).await;
    let t = Instant::now();
    assert!(s.apiserver().create_pod("default", &imgs).await.patched);
    let serial = t.elapsed();
    assert!(
        concurrent < Duration::from_millis(850),
        "3 lookups should overlap: {concurrent:?}"
    );
    assert!(
        serial >= Duration::from_millis(900),
        "limit 1 must serialize: {serial:?}"
    );
}

/// 50 concurrent admissions of the same new tag make one registry request.
#[tokio::test]
async fn concurrent_lookups_are_coalesced_into_one_request() {
    let slowish = FaultServer::start(Fault::Slow(Duration::from_millis(300))).await;
    let a = slowish.addr.to_string();
    let s = Sigil::start(Some(&pin_all_from(&a)), &[]).await;
    let api = std::sync::Arc::new(s.apiserver());
    let mut tasks = Vec::new();
    for i in 0..50 {
        let api = api.clone();
        let a = a.clone();
        tasks.push(tokio::spawn(async move {
            api.admit(
                &review(
                    "CREATE",
                    "default",
                    pod(&format!("p{i}"), &[&format!("{a}/same:1")]),
                ),
                T,
            )
            .await
            .patched
        }));
    }
    for t in tasks {
        assert!(t.await.unwrap());
    }
    assert_eq!(slowish.hits.load(std::sync::atomic::Ordering::SeqCst), 1);
}

#[tokio::test]
async fn bad_bodies_get_400_never_500() {
    let s = Sigil::start(None, &[]).await;
    let api = s.apiserver();
    for (name, body) in [
        ("garbage", b"not json".to_vec()),
        ("null", fixture_bytes("25_null_request.json")),
        ("no uid", fixture_bytes("21_broken_admission_request.json")),
        ("broken update", fixture_bytes("26_broken_update_admission_request.json")),
        ("wrong version", br#"{"apiVersion":"admission.k8s.io/v2","kind":"AdmissionReview","request":{"uid":"1","operation":"CREATE"}}"#.to_vec()),
        ("no request", br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}"#.to_vec()),
        ("array", b"[]".to_vec()),
    ] {
        let r = api.raw(body, T).await;
        assert_eq!(r.status(), 400, "{name}");
        let text = r.text().await.unwrap();
        assert!(!text.is_empty(), "{name}: a 400 says why");
    }
    let big = vec![b' '; (3 << 20) + 1];
    assert_eq!(api.raw(big, T).await.status(), 413);
    let r = api.client.get(&api.url).send().await.unwrap();
    assert_eq!(r.status(), 405);
    // Odd but valid shapes are answered, not refused.
    let role = fixture("11_role.json");
    assert!(api.admit(&role, T).await.allowed);
    let err_pod = fixture("12_err_pod.json");
    let r = api.raw(serde_json::to_vec(&err_pod).unwrap(), T).await;
    assert_eq!(r.status(), 200);
}

#[tokio::test]
async fn serves_given_certificate_files() {
    let dir = tempfile::tempdir().unwrap();
    let (ca, c, k) = crate::support::registry::test_cert_files(dir.path());
    let s = Sigil::start(None, &["--tls-cert", &c, "--tls-key", &k]).await;
    let got = s
        .api(&ca)
        .admit(
            &review(
                "CREATE",
                "default",
                json!({"kind": "ConfigMap", "metadata": {"name": "x"}}),
            ),
            T,
        )
        .await;
    assert!(got.allowed);
    // A client trusting another CA must fail the handshake.
    let (other, _, _) = crate::support::registry::test_ca();
    let r = s
        .api(&other)
        .client
        .post(s.api(&other).url)
        .body("{}")
        .send()
        .await;
    assert!(r.is_err());
}

#[tokio::test]
async fn readyz_livez_and_metrics() {
    let s = Sigil::start(None, &[]).await;
    let base = format!("http://{}", s.admin);
    assert_eq!(
        reqwest::get(format!("{base}/livez"))
            .await
            .unwrap()
            .status(),
        200
    );
    assert_eq!(
        reqwest::get(format!("{base}/readyz"))
            .await
            .unwrap()
            .status(),
        200
    );
    // The readiness self-check is not counted as an admission.
    assert!(!s.metrics().await.contains("sigil_admission_requests_total"));
    let got = s
        .apiserver()
        .create_pod(
            "default",
            &["nginx@sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"],
        )
        .await;
    assert!(got.allowed);
    let m = s.metrics().await;
    assert!(
        m.contains(
            r#"sigil_admission_requests_total{operation="CREATE",kind="Pod",decision="allowed"} 1"#
        ),
        "{m}"
    );
    for name in [
        "sigil_admission_requests_total",
        "sigil_admission_duration_seconds",
        "sigil_ready 1",
        "sigil_draining 0",
        "sigil_admission_inflight_requests",
        "sigil_digest_cache_entries",
    ] {
        assert!(m.contains(name), "missing {name} in\n{m}");
    }
}

/// cert-manager rotates the Secret: new handshakes get the new certificate,
/// open keep-alive connections keep working, and readiness follows.
#[tokio::test]
async fn rotated_certificate_files_are_hot_reloaded_without_dropping_connections() {
    let (ca_a, cert_a, key_a) = crate::support::registry::test_ca();
    let dir = tempfile::tempdir().unwrap();
    let (crt, key) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
    std::fs::write(&crt, &cert_a).unwrap();
    std::fs::write(&key, &key_a).unwrap();
    let (c, k) = (crt.display().to_string(), key.display().to_string());
    let s = Sigil::start(None, &["--tls-cert", &c, "--tls-key", &k]).await;
    let old = s.api(&ca_a);
    let cm = || {
        review(
            "CREATE",
            "default",
            json!({"kind": "ConfigMap", "metadata": {"name": "x"}}),
        )
    };
    assert!(old.admit(&cm(), T).await.allowed);

    let (ca_b, cert_b, key_b) = crate::support::registry::test_ca();
    // Replace like a Secret volume would: whole files, renamed into place.
    for (path, text) in [(&crt, &cert_b), (&key, &key_b)] {
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, path).unwrap();
    }
    let new = s.api(&ca_b);
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let r = new
            .client
            .post(format!("{}?timeout=5s", new.url))
            .body(serde_json::to_vec(&cm()).unwrap())
            .send()
            .await;
        if r.is_ok_and(|r| r.status() == 200) {
            break;
        }
        assert!(Instant::now() < until, "new certificate never served");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The connection opened before the rotation still answers.
    assert!(
        old.admit(&cm(), T).await.allowed,
        "keep-alive connection dropped by the reload"
    );
    // A fresh client that trusts only the old CA can no longer connect.
    let stale = s.api(&ca_a);
    assert!(
        stale
            .client
            .post(&stale.url)
            .body("{}")
            .send()
            .await
            .is_err()
    );
    s.wait_ready().await;
    assert!(s.logs().contains("serving certificate reloaded"));
}

/// The policy ConfigMap changes: the new policy is in force within seconds,
/// no restart; an invalid edit is refused and the previous policy stays.
#[tokio::test]
async fn policy_file_changes_take_effect_and_invalid_ones_are_refused() {
    let reg = TestRegistry::start(Mode::Plain).await;
    let h = reg.host();
    let warn = policy(&format!(
        "  registries:\n    - {{host: \"{h}\", insecure: true}}\n  rules:\n    - {{name: all, match: [\"**\"], mode: warn}}\n"
    ));
    let s = Sigil::start(Some(&warn), &[]).await;
    let api = s.apiserver();
    let missing = format!("{h}/app/missing:1");
    assert!(
        api.create_pod("default", &[&missing]).await.allowed,
        "warn mode admits"
    );
    let enforce = warn.replace("mode: warn", "mode: enforce");
    let write = |text: &str| {
        let tmp = s.policy_path().with_extension("tmp");
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, s.policy_path()).unwrap();
    };
    write(&enforce);
    let until = Instant::now() + Duration::from_secs(15);
    while api.create_pod("default", &[&missing]).await.allowed {
        assert!(Instant::now() < until, "new policy never took effect");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    write(
        "apiVersion: sigil.dev/v1alpha1\nkind: ImagePolicy\nspec:\n  rules:\n    - {name: all, match: [\"**\"], mood: warn}\n",
    );
    let until = Instant::now() + Duration::from_secs(15);
    while !s.logs().contains("policy file changed but is invalid") {
        assert!(Instant::now() < until, "invalid policy was not reported");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(s.logs().contains("mood"), "the error names the bad field");
    assert!(
        !api.create_pod("default", &[&missing]).await.allowed,
        "previous (enforce) policy stays in force"
    );
    assert_eq!(
        s.counter("sigil_policy_reloads_total", &[("result", "error")])
            .await,
        1.0
    );
    s.wait_ready().await;
}
