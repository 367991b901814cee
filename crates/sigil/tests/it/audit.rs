//! Audit end to end: `sigil audit` and `sigil serve --audit-interval`
//! against the kube-apiserver stand-in (paginated lists, Leases with
//! resourceVersion conflicts, events.k8s.io) and the real docker-registry.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::support::kube::FakeKube;
use crate::support::registry::{Mode, TestRegistry};
use crate::support::sigil::{Sigil, bin};
use crate::support::signing::{Signer, push_signed};

const PODS: &str = "/api/v1/namespaces/shop/pods";

fn pod(ns: &str, name: &str, image: &str, image_id: Option<&str>) -> Value {
    let mut p = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"containers": [{"name": "app", "image": image}]}});
    if let Some(id) = image_id {
        p["status"] = json!({"phase": "Running",
            "containerStatuses": [{"name": "app", "image": image, "imageID": id, "ready": true}]});
    }
    p
}

fn deployment(ns: &str, name: &str, image: &str) -> Value {
    json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"selector": {"matchLabels": {"app": name}},
                 "template": {"metadata": {"labels": {"app": name}},
                              "spec": {"containers": [{"name": "app", "image": image}]}}}})
}

/// A registry with one image of each kind of trouble, the policy that
/// judges them, and a cluster holding one Pod per audit reason.
struct World {
    reg: TestRegistry,
    kube: FakeKube,
    dir: tempfile::TempDir,
    policy: std::path::PathBuf,
    ok: String,
    other: String,
}

impl World {
    async fn start() -> World {
        let reg = TestRegistry::start(Mode::Plain).await;
        let h = reg.host();
        let ok = reg.push_image("ok/app", "v1").await;
        let other = reg.push_image("ok/app", "v2").await;
        reg.push_image("tag/app", "v1").await;
        let key = Signer::p256();
        push_signed(&reg, "signed/app", "good", "signed/app", &key).await;
        let unsigned = reg.push_image("signed/app", "unsigned").await;
        let dir = tempfile::tempdir().unwrap();
        let key_path = dir.path().join("k.pub");
        std::fs::write(&key_path, key.public_pem()).unwrap();
        let policy = dir.path().join("policy.yaml");
        std::fs::write(
            &policy,
            format!(
                "apiVersion: sigil.dev/v1alpha1\nkind: ImagePolicy\nmetadata: {{name: audit-test}}\nspec:\n  pin: {{scope: pods}}\n  registries: [{{host: \"{h}\", insecure: true}}]\n  mirrors: [{{from: docker.io, to: \"{h}/hub\"}}]\n  exemptNamespaces: [kube-system]\n  rules:\n    - {{name: all, match: [\"**\"], mode: enforce}}\n    - {{name: bad, match: [\"{h}/bad/**\"], action: deny}}\n    - name: signed\n      match: [\"{h}/signed/**\"]\n      verify:\n        - {{name: k, cosign: {{key: \"{}\"}}}}\n",
                key_path.display()
            ),
        )
        .unwrap();
        let kube = FakeKube::start().await;
        kube.namespaces(&["shop", "clean", "kube-system", "other", "parity"]);
        let w = World {
            reg,
            kube,
            dir,
            policy,
            ok,
            other,
        };
        let (ok, other) = (&w.ok, &w.other);
        let pinned = format!("{h}/ok/app@{ok}");
        let pods = [
            pod(
                "shop",
                "compliant",
                &pinned,
                Some(&format!("{h}/ok/app@{ok}")),
            ),
            pod("shop", "by-tag", &format!("{h}/tag/app:v1"), None),
            pod("shop", "hub", &format!("nginx@{ok}"), None),
            pod("shop", "banned", &format!("{h}/bad/x@{ok}"), None),
            pod(
                "shop",
                "unsigned",
                &format!("{h}/signed/app@{unsigned}"),
                None,
            ),
            pod("shop", "missing", &format!("{h}/missing/app:v1"), None),
            pod(
                "shop",
                "drifted",
                &pinned,
                Some(&format!("docker-pullable://{h}/ok/app@{other}")),
            ),
        ];
        for p in pods {
            w.kube.insert(PODS, p);
        }
        w.kube.insert(
            "/api/v1/namespaces/kube-system/pods",
            pod("kube-system", "exempt", &format!("{h}/bad/x:v1"), None),
        );
        w.kube.insert(
            "/api/v1/namespaces/clean/pods",
            pod("clean", "fine", &pinned, None),
        );
        w.kube.insert(
            "/apis/apps/v1/namespaces/shop/deployments",
            deployment("shop", "web", &format!("{h}/tag/app:v1")),
        );
        w
    }

    /// `sigil audit` under this world's policy and kubeconfig.
    fn audit_command(&self, args: &[&str]) -> std::process::Command {
        let mut c = std::process::Command::new(bin());
        c.arg("audit")
            .arg("--policy")
            .arg(&self.policy)
            .args(args)
            .env_remove("KUBERNETES_SERVICE_HOST")
            .env("KUBECONFIG", &self.kube.kubeconfig);
        c
    }

    fn audit(&self, args: &[&str]) -> (i32, String, String) {
        let out = self.audit_command(args).output().unwrap();
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    /// Runs `sigil audit` with stdout a pipe whose reader has already gone
    /// (`sigil audit | head` once the head has read its lines): (exit code,
    /// stderr).
    fn audit_into_closed_pipe(&self, args: &[&str]) -> (i32, String) {
        crate::support::sigil::into_closed_pipe(&mut self.audit_command(args))
    }

    fn audit_json(&self, args: &[&str]) -> (i32, Value) {
        let mut a = vec!["-o", "json"];
        a.extend_from_slice(args);
        let (code, out, err) = self.audit(&a);
        let v = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}\n{err}"));
        (code, v)
    }
}

fn object<'a>(report: &'a Value, ns: &str, kind: &str, name: &str) -> &'a Value {
    report["objects"]
        .as_array()
        .unwrap()
        .iter()
        .find(|o| o["namespace"] == ns && o["kind"] == kind && o["name"] == name)
        .unwrap_or_else(|| panic!("{ns}/{kind}/{name} not in {report:#}"))
}

fn reasons(o: &Value) -> Vec<String> {
    o["fields"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|f| f["violations"].as_array().unwrap().clone())
        .map(|v| v["reason"].as_str().unwrap().to_owned())
        .collect()
}

/// `-o policyreport` / `-o openreports`: the same audit as report objects.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cli_audit_prints_policy_reports_per_namespace() {
    let w = World::start().await;
    for (flag, api, kind) in [
        ("policyreport", "wgpolicyk8s.io/v1alpha2", "PolicyReport"),
        ("openreports", "openreports.io/v1alpha1", "Report"),
    ] {
        let (code, out, err) = w.audit(&["-A", "-o", flag]);
        assert_eq!(code, 1, "{err}");
        let docs: Vec<Value> = sigil_core::manifest::parse_stream(&out)
            .unwrap_or_else(|e| panic!("{e}: {out}"))
            .into_iter()
            .map(|d| d.to_value())
            .collect();
        assert!(
            docs.iter()
                .all(|d| d["apiVersion"] == api && d["kind"] == kind),
            "{out}"
        );
        assert!(
            !docs
                .iter()
                .any(|d| d["metadata"]["namespace"] == "kube-system"),
            "exempt namespaces are not reported"
        );
        let shop = docs
            .iter()
            .find(|d| d["metadata"]["namespace"] == "shop")
            .unwrap_or_else(|| panic!("{out}"));
        let results = shop["results"].as_array().unwrap();
        let of = |name: &str| -> Vec<&Value> {
            results
                .iter()
                .filter(|r| r["resources"][0]["name"] == name)
                .collect()
        };
        assert_eq!(of("compliant")[0]["result"], "pass");
        let unsigned = of("unsigned");
        assert_eq!(unsigned[0]["result"], "fail", "{unsigned:?}");
        assert_eq!(unsigned[0]["category"], "signature");
        assert_eq!(unsigned[0]["policy"], "audit-test");
        assert!(
            unsigned[0]["message"]
                .as_str()
                .unwrap()
                .contains("no signature found")
        );
        assert_eq!(of("missing")[0]["result"], "error");
        let fails = results.iter().filter(|r| r["result"] == "fail").count() as u64;
        assert_eq!(shop["summary"]["fail"], fails);
    }
}

// `sigil audit` runs as a blocking child while the stand-in serves it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cli_audit_reports_every_reason_across_pages_with_exit_codes() {
    let w = World::start().await;
    let (code, r) = w.audit_json(&["-A", "--page-size", "2"]);
    assert_eq!(code, 1, "violations → exit 1: {r:#}");
    assert_eq!(r["kind"], "AuditReport");
    assert_eq!(r["policy"], "audit-test");
    let expect: &[(&str, &str, &[&str])] = &[
        ("compliant", "compliant", &[]),
        ("by-tag", "violating", &["not_pinned"]),
        ("hub", "violating", &["not_mirrored"]),
        ("banned", "violating", &["denied"]),
        ("unsigned", "violating", &["signature"]),
        ("missing", "violating", &["unresolvable"]),
        ("drifted", "violating", &["drift"]),
    ];
    for (name, result, want) in expect {
        let o = object(&r, "shop", "Pod", name);
        assert_eq!(o["result"], *result, "{name}: {o:#}");
        assert_eq!(reasons(o), *want, "{name}: {o:#}");
    }
    let unsigned = object(&r, "shop", "Pod", "unsigned");
    let v = &unsigned["fields"][0]["violations"][0];
    assert!(
        v["detail"]
            .as_str()
            .unwrap()
            .contains("k: no signature found"),
        "the verifier's reason: {v:#}"
    );
    assert!(!v["fix"].as_str().unwrap().is_empty());
    let drifted = &object(&r, "shop", "Pod", "drifted")["fields"][0];
    assert_eq!(drifted["expectedDigest"], w.ok.as_str());
    assert_eq!(drifted["runningDigest"], w.other.as_str());
    let exempt = object(&r, "kube-system", "Pod", "exempt");
    assert_eq!(exempt["result"], "exempt");
    assert_eq!(exempt["fields"][0]["verdict"], "exempt");
    // scope: pods — the webhook pins the Deployment's Pods, not the Deployment.
    assert_eq!(
        object(&r, "shop", "Deployment", "web")["result"],
        "compliant"
    );
    assert_eq!(r["summary"]["violating"], 6);
    assert_eq!(r["summary"]["exempt"], 1);
    assert_eq!(r["summary"]["byReason"]["drift"], 1);
    // 10 Pods in pages of 2: five list calls, the last without `continue`.
    let pod_lists = w
        .kube
        .requests()
        .iter()
        .filter(|(m, p, _)| m == "GET" && p == "/api/v1/pods")
        .count();
    assert_eq!(pod_lists, 5, "paginated");

    // The table: counts per namespace, one line per violation with the fix.
    let (code, table, _) = w.audit(&["-A"]);
    assert_eq!(code, 1);
    assert!(
        table.contains("shop: 8 objects, 6 violating, 6 violations"),
        "{table}"
    );
    assert!(
        table.contains(&format!(
            "shop Pod/by-tag app {}/tag/app:v1: not pinned",
            w.reg.host()
        )) && table.contains("→ pin the manifest by digest"),
        "{table}"
    );
    assert!(table.contains("audited 10 objects"), "{table}");

    // A compliant namespace exits 0; YAML renders the same schema.
    let (code, yaml, err) = w.audit(&["-n", "clean", "-o", "yaml"]);
    assert_eq!(code, 0, "{yaml}{err}");
    assert!(
        yaml.contains("kind: AuditReport") && yaml.contains("result: compliant"),
        "{yaml}"
    );

    // --no-verify drops the signature check only.
    let (_, r) = w.audit_json(&["-n", "shop", "--no-verify", "-l", "app!=none"]);
    assert_eq!(object(&r, "shop", "Pod", "unsigned")["result"], "compliant");
    assert_eq!(object(&r, "shop", "Pod", "banned")["result"], "violating");

    // Usage and RBAC errors exit 2 and say what to grant.
    let (code, _, err) = w.audit(&["--kinds", "services"]);
    assert_eq!(code, 2, "{err}");
    w.kube
        .state
        .lock()
        .unwrap()
        .forbidden
        .push("/apis/apps/v1/deployments".into());
    let (code, out, _) = w.audit(&["-A", "--pull-secrets=false"]);
    assert_eq!(code, 2, "{out}");
    assert!(
        out.contains("grant list on deployments.apps in all namespaces"),
        "{out}"
    );
    drop(w.dir);
}

// `sigil audit` runs as a blocking child while the stand-in serves it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn since_break_glass_audits_only_what_changed_in_the_window() {
    let w = World::start().await;
    // Everything above was "created" long ago, except one Pod and one
    // Deployment edited during the window.
    let h = w.reg.host();
    {
        let mut st = w.kube.state.lock().unwrap();
        for (coll, name) in [
            (PODS, "by-tag"),
            (PODS, "hub"),
            (PODS, "banned"),
            (PODS, "compliant"),
            (PODS, "unsigned"),
            (PODS, "missing"),
            (PODS, "drifted"),
            ("/api/v1/namespaces/kube-system/pods", "exempt"),
            ("/api/v1/namespaces/clean/pods", "fine"),
        ] {
            let mut o = st.get(coll, name).unwrap();
            o["metadata"]["creationTimestamp"] = json!("2020-01-01T00:00:00Z");
            st.insert(coll, o);
        }
        let mut d = st
            .get("/apis/apps/v1/namespaces/shop/deployments", "web")
            .unwrap();
        d["metadata"]["creationTimestamp"] = json!("2020-01-01T00:00:00Z");
        d["metadata"]["managedFields"] = json!([
            {"manager": "kubectl", "operation": "Update", "time": "2026-11-20T10:30:00Z"},
            {"manager": "kube-controller-manager", "operation": "Update", "subresource": "status", "time": "2026-11-23T00:00:00Z"}]);
        st.insert("/apis/apps/v1/namespaces/shop/deployments", d);
    }
    w.kube.insert(
        PODS,
        pod("shop", "slipped-in", &format!("{h}/bad/x@{}", w.ok), None),
    );
    w.kube.insert(
        "/api/v1/namespaces/sigil-system/configmaps",
        json!({"apiVersion": "v1", "kind": "ConfigMap",
               "metadata": {"name": "sigil-state", "namespace": "sigil-system",
                 "annotations": {"sigil.dev/last-break-glass":
                   "since=2026-11-20T10:00:00Z; by=ops; reason=registry outage; ended=2026-11-20T11:00:00Z"}}}),
    );
    let (code, r) = w.audit_json(&["-A", "--since-break-glass"]);
    assert_eq!(code, 1, "{r:#}");
    let names: Vec<&str> = r["objects"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["web", "slipped-in"], "{r:#}");
    assert_eq!(r["scope"]["since"], "2026-11-20T10:00:00Z");

    // No window recorded: a clear error, exit 2.
    w.kube
        .state
        .lock()
        .unwrap()
        .remove("/api/v1/namespaces/sigil-system/configmaps", "sigil-state");
    let (code, _, err) = w.audit(&["-A", "--since-break-glass"]);
    assert_eq!(code, 2);
    assert!(err.contains("no break-glass window is recorded"), "{err}");
}

/// The webhook, `sigil pin` and `sigil audit` give every fixture object the
/// same verdict label (the audit decides as a CREATE would be decided).
// `sigil audit` runs as a blocking child while the stand-in serves it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn audit_verdicts_match_the_webhook_and_pin_for_the_fixtures() {
    let w = World::start().await;
    let h = w.reg.host();
    let s = Sigil::start(Some(&std::fs::read_to_string(&w.policy).unwrap()), &[]).await;
    // Each image once as a Pod in namespace "parity".
    let images = [
        format!("{h}/ok/app@{}", w.ok),
        format!("{h}/ok/app:v1"),
        format!("{h}/tag/app:v1"),
        format!("nginx@{}", w.ok),
        format!("{h}/bad/x@{}", w.ok),
        format!("{h}/signed/app:unsigned"),
        format!("{h}/signed/app:good"),
        format!("{h}/missing/app:v1"),
        "Not A Reference".to_owned(),
    ];
    for (i, img) in images.iter().enumerate() {
        w.kube.insert(
            "/api/v1/namespaces/parity/pods",
            pod("parity", &format!("p{i}"), img, None),
        );
    }
    let (_, r) = w.audit_json(&["-n", "parity"]);
    let api = s.apiserver();
    for (i, img) in images.iter().enumerate() {
        let audit = object(&r, "parity", "Pod", &format!("p{i}"))["fields"][0]["verdict"]
            .as_str()
            .unwrap()
            .to_owned();
        // The webhook: the decision log line's `images` names the verdict.
        let admitted = api.create_pod("parity", &[img]).await;
        // The log writer is asynchronous: wait (bounded) for the line. (A
        // reinvocation logs the pinned image again, so match the exact value.)
        let wanted = [
            format!("image {audit}: {img}\""),
            format!("image {audit}: {img} -> "),
        ];
        let mut found = false;
        for _ in 0..40 {
            found = s
                .logs()
                .lines()
                .any(|l| wanted.iter().any(|w| l.contains(w.as_str())));
            if found {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(
            found,
            "{img}: audit says {audit}; webhook logs: {} ({admitted:?})",
            s.logs()
        );
        // sigil pin: --output json carries the same label.
        let manifest = format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: p, namespace: parity}}\nspec:\n  containers:\n    - name: app\n      image: \"{img}\"\n"
        );
        let policy = w.policy.to_string_lossy();
        let out = crate::support::sigil::run_sigil(
            &["pin", "--output", "json", "--policy", &policy, "-"],
            Some(&manifest),
        );
        // The report goes to stderr (stdout carries the pinned YAML).
        let pin: Value = serde_json::from_slice(&out.stderr)
            .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)));
        let pin_label = pin.to_string();
        assert!(
            pin_label.contains(&format!("\"verdict\":\"{audit}\"")),
            "{img}: audit says {audit}, pin says {pin_label}"
        );
    }
}

async fn get(url: &str) -> (u16, String) {
    match reqwest::get(url).await {
        Ok(r) => (r.status().as_u16(), r.text().await.unwrap_or_default()),
        Err(e) => (0, e.to_string()),
    }
}

async fn wait_for<T>(limit: Duration, what: &str, mut f: impl AsyncFnMut() -> Option<T>) -> T {
    let until = Instant::now() + limit;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(Instant::now() < until, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

const SHOP_REPORTS: &str = "/apis/wgpolicyk8s.io/v1alpha2/namespaces/shop/policyreports";

/// The Lease holder writes a PolicyReport per namespace once the CRD is
/// installed (no restart), keeps it current (a deleted object's results
/// go), deletes it when its namespace has nothing left, and without any
/// report CRD says so once and audits on.
#[tokio::test]
async fn the_audit_writes_policy_reports_once_their_crd_is_installed() {
    let w = World::start().await;
    let policy = std::fs::read_to_string(&w.policy).unwrap();
    let args = ["--audit-interval", "1s", "--namespace", "sigil-system"];
    let s = Sigil::start_env(Some(&policy), &args, &w.kube.env()).await;
    let admin = format!("http://{}/audit", s.admin);
    wait_for(Duration::from_secs(20), "a first audit", async || {
        (get(&admin).await.0 == 200).then_some(())
    })
    .await;
    wait_for(Duration::from_secs(10), "the no-CRD log line", async || {
        s.logs()
            .contains("no policy report CRD is installed")
            .then_some(())
    })
    .await;
    assert!(w.kube.list(SHOP_REPORTS).is_empty());
    w.kube.apply(&FakeKube::report_crds("wgpolicyk8s"));
    let report = wait_for(
        Duration::from_secs(20),
        "the shop PolicyReport",
        async || w.kube.get(SHOP_REPORTS, "sigil"),
    )
    .await;
    assert_eq!(
        report["summary"]["fail"].as_u64().unwrap() + report["summary"]["error"].as_u64().unwrap(),
        6,
        "{report:#}"
    );
    let names = |r: &Value| -> Vec<String> {
        r["results"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x["resources"][0]["name"].as_str().unwrap().to_owned())
            .collect()
    };
    assert!(
        names(&report).contains(&"unsigned".to_owned()),
        "{report:#}"
    );
    assert!(
        w.kube
            .get(
                "/apis/wgpolicyk8s.io/v1alpha2/namespaces/kube-system/policyreports",
                "sigil"
            )
            .is_none()
    );
    // A deleted object's results disappear from the next report.
    w.kube.remove(PODS, "unsigned").unwrap();
    wait_for(
        Duration::from_secs(20),
        "unsigned gone from the report",
        async || {
            let r = w.kube.get(SHOP_REPORTS, "sigil")?;
            (!names(&r).contains(&"unsigned".to_owned())).then_some(())
        },
    )
    .await;
    // A namespace with nothing left loses its report.
    let clean = "/apis/wgpolicyk8s.io/v1alpha2/namespaces/clean/policyreports";
    assert!(w.kube.get(clean, "sigil").is_some());
    w.kube
        .remove("/api/v1/namespaces/clean/pods", "fine")
        .unwrap();
    wait_for(
        Duration::from_secs(20),
        "the clean report deleted",
        async || w.kube.get(clean, "sigil").is_none().then_some(()),
    )
    .await;
    assert!(
        s.counter("sigil_policy_reports_total", &[("result", "created")])
            .await
            >= 2.0
    );
}

const LEASES: &str = "/apis/coordination.k8s.io/v1/namespaces/sigil-system/leases";
const EVENTS: &str = "/apis/events.k8s.io/v1/namespaces/shop/events";

/// Two replicas with `--audit-interval`: one audits (Lease), publishes
/// metrics, Events (deduplicated) and `GET /audit`; when it drains, the
/// other takes over within one lease duration.
#[tokio::test]
async fn one_replica_audits_and_hands_over_when_it_drains() {
    let w = World::start().await;
    let policy = std::fs::read_to_string(&w.policy).unwrap();
    let args = [
        "--audit-interval",
        "2s",
        "--audit-lease-duration",
        "3s",
        "--namespace",
        "sigil-system",
    ];
    let a = Sigil::start_env(Some(&policy), &args, &w.kube.env()).await;
    let b = Sigil::start_env(Some(&policy), &args, &w.kube.env()).await;
    let admin = |s: &Sigil| format!("http://{}", s.admin);
    // Exactly one holds the Lease and serves a report.
    let holder = wait_for(
        Duration::from_secs(20),
        "a lease holder with a report",
        async || {
            let lease = w.kube.get(LEASES, "sigil-audit")?;
            let holder = lease["spec"]["holderIdentity"].as_str()?.to_owned();
            for s in [&a, &b] {
                if get(&format!("{}/audit", admin(s))).await.0 == 200 {
                    return Some(holder.clone());
                }
            }
            None
        },
    )
    .await;
    let (leader, follower) = if get(&format!("{}/audit", admin(&a))).await.0 == 200 {
        (&a, &b)
    } else {
        (&b, &a)
    };
    let (code, body) = get(&format!("{}/audit", admin(follower))).await;
    assert_eq!(code, 503, "the follower has not audited: {body}");
    assert!(
        body.contains("another replica holds the audit Lease"),
        "{body}"
    );
    let report: Value =
        serde_json::from_str(&get(&format!("{}/audit", admin(leader))).await.1).unwrap();
    assert_eq!(report["summary"]["violating"], 6, "{report:#}");
    assert!(
        holder.contains('_'),
        "identity is pod name + suffix: {holder}"
    );

    // Metrics: the leader's gauges; the follower exports none.
    let v = leader
        .counter(
            "sigil_audit_violations",
            &[("namespace", "shop"), ("reason", "drift")],
        )
        .await;
    assert_eq!(v, 1.0);
    assert_eq!(
        leader
            .counter("sigil_audit_objects", &[("result", "violating")])
            .await,
        6.0
    );
    assert_eq!(leader.counter("sigil_audit_leader", &[]).await, 1.0);
    assert!(
        leader
            .counter("sigil_audit_last_success_timestamp_seconds", &[])
            .await
            > 1.7e9
    );
    assert_eq!(follower.counter("sigil_audit_leader", &[]).await, 0.0);
    assert!(!follower.metrics().await.contains("sigil_audit_violations{"));

    // Events: one per (object, reason), not repeated by the next audits.
    let events_now = || w.kube.list(EVENTS);
    let first = wait_for(Duration::from_secs(10), "six events", async || {
        let e = events_now();
        (e.len() >= 6).then_some(e)
    })
    .await;
    assert_eq!(first.len(), 6, "{first:#?}");
    for e in &first {
        assert_eq!(e["reason"], "ImagePolicyViolation");
        assert_eq!(e["type"], "Warning");
        assert_eq!(e["regarding"]["kind"], "Pod");
        assert!(
            e["regarding"]["uid"]
                .as_str()
                .is_some_and(|u| !u.is_empty())
        );
        assert!(e["note"].as_str().unwrap().contains("→"), "{e:#}");
    }
    let runs = |s: &Sigil| {
        let s = s.admin;
        async move {
            let m = reqwest::get(format!("http://{s}/metrics"))
                .await
                .ok()?
                .text()
                .await
                .ok()?;
            m.lines()
                .find(|l| l.starts_with("sigil_audit_runs_total{result=\"ok\"}"))
                .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        }
    };
    let before = runs(leader).await.unwrap_or(0.0);
    wait_for(Duration::from_secs(15), "two more audits", async || {
        (runs(leader).await? >= before + 2.0).then_some(())
    })
    .await;
    assert_eq!(events_now().len(), 6, "deduplicated across audits");
    assert!(
        leader
            .counter("sigil_audit_events_total", &[("result", "deduplicated")])
            .await
            >= 6.0
    );

    // The leader drains: the follower takes over within one lease duration.
    let old = holder.clone();
    leader.terminate();
    let drained_at = Instant::now();
    let new = wait_for(
        Duration::from_secs(10),
        "the follower to take the Lease",
        async || {
            let lease = w.kube.get(LEASES, "sigil-audit")?;
            let h = lease["spec"]["holderIdentity"].as_str()?.to_owned();
            (h != old).then_some(h)
        },
    )
    .await;
    assert!(
        drained_at.elapsed() < Duration::from_secs(3),
        "takeover took {:?}",
        drained_at.elapsed()
    );
    let lease = w.kube.get(LEASES, "sigil-audit").unwrap();
    assert_eq!(lease["spec"]["leaseTransitions"], 1, "{lease:#}");
    assert!(!new.is_empty());
    wait_for(
        Duration::from_secs(15),
        "the new leader's report",
        async || (get(&format!("{}/audit", admin(follower))).await.0 == 200).then_some(()),
    )
    .await;
    // Lease writes race: the stand-in refused stale ones with 409.
    let _conflicts = w
        .kube
        .requests()
        .iter()
        .filter(|(m, p, c)| m == "PUT" && p.contains("/leases/") && *c == 409)
        .count();
}

/// Two candidates race for one Lease through kube-rs: the stand-in's
/// resourceVersion check lets exactly one write win (the other gets 409);
/// the holder renews, a released Lease is taken at the next try, and an
/// abandoned one only after the loser has watched it unchanged for a lease
/// duration on its own clock.
#[tokio::test]
async fn lease_candidates_race_with_conflicts_and_take_over_released_or_expired_leases() {
    use sigil_kube::cluster::lease::{LeaseSettings, spawn};
    let kube = FakeKube::start().await;
    let config = kube::Config::from_custom_kubeconfig(
        kube::config::Kubeconfig::read_from(&kube.kubeconfig).unwrap(),
        &kube::config::KubeConfigOptions::default(),
    )
    .await
    .unwrap();
    let client = kube::Client::try_from(config).unwrap();
    let settings = |id: &str| LeaseSettings {
        namespace: "sigil-system".into(),
        name: "race".into(),
        identity: id.into(),
        duration: Duration::from_secs(2),
    };
    let a = spawn(client.clone(), settings("a"));
    let b = spawn(client.clone(), settings("b"));
    let mut leaders = (a.leading.clone(), b.leading.clone());
    let start = Instant::now();
    while !(*leaders.0.borrow() || *leaders.1.borrow()) {
        assert!(start.elapsed() < Duration::from_secs(5), "nobody leads");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Several renew rounds: never both.
    for _ in 0..20 {
        assert!(
            !(*leaders.0.borrow_and_update() && *leaders.1.borrow_and_update()),
            "two leaders"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let lease = kube.get(LEASES, "race").unwrap();
    let holder = lease["spec"]["holderIdentity"].as_str().unwrap().to_owned();
    let (held, other) = if holder == "a" { (a, b) } else { (b, a) };
    // Release: the other takes it at its next try (duration / 5).
    let released = Instant::now();
    held.release().await;
    let mut other_leading = other.leading.clone();
    tokio::time::timeout(Duration::from_secs(3), other_leading.wait_for(|l| *l))
        .await
        .expect("takeover after release")
        .unwrap();
    assert!(released.elapsed() < Duration::from_secs(2));
    let lease = kube.get(LEASES, "race").unwrap();
    assert_ne!(
        lease["spec"]["holderIdentity"].as_str(),
        Some(holder.as_str())
    );
    assert_eq!(lease["spec"]["leaseTransitions"], 1);

    // A stale write is refused with 409 Conflict, as kube-apiserver does.
    let leases: kube::Api<k8s_openapi::api::coordination::v1::Lease> =
        kube::Api::namespaced(client.clone(), "sigil-system");
    let mut stale = leases.get("race").await.unwrap();
    tokio::time::sleep(Duration::from_millis(900)).await; // the holder renews meanwhile
    stale.spec.as_mut().unwrap().holder_identity = Some("thief".into());
    match leases.replace("race", &Default::default(), &stale).await {
        Err(kube::Error::Api(e)) => assert_eq!(e.code, 409, "{e:?}"),
        other => panic!("stale write accepted: {other:?}"),
    }
    other.release().await;

    // A crashed holder ("gone" never renews): a new candidate takes the
    // Lease only after watching it unchanged for its duration.
    let mut l = kube.get(LEASES, "race").unwrap();
    l["spec"]["holderIdentity"] = json!("gone");
    l["spec"]["leaseDurationSeconds"] = json!(2);
    kube.insert(LEASES, l);
    let abandoned = Instant::now();
    let c = spawn(client.clone(), settings("c"));
    let mut c_leading = c.leading.clone();
    tokio::time::timeout(Duration::from_secs(6), c_leading.wait_for(|l| *l))
        .await
        .expect("takeover after expiry")
        .unwrap();
    assert!(
        abandoned.elapsed() >= Duration::from_millis(1900),
        "took over an unexpired Lease after {:?}",
        abandoned.elapsed()
    );
    c.release().await;
}

/// A policy edit is audited within seconds, not at the next interval; Events
/// are capped per audit.
#[tokio::test]
async fn a_policy_change_triggers_an_audit_and_events_are_rate_limited() {
    let w = World::start().await;
    let policy = std::fs::read_to_string(&w.policy).unwrap();
    let args = [
        "--audit-interval",
        "10m",
        "--audit-max-events",
        "2",
        "--audit-lease-duration",
        "2s",
        "--namespace",
        "sigil-system",
    ];
    let s = Sigil::start_env(Some(&policy), &args, &w.kube.env()).await;
    let url = format!("http://{}/audit", s.admin);
    let first: Value = wait_for(Duration::from_secs(15), "the first report", async || {
        let (code, body) = get(&url).await;
        (code == 200).then(|| serde_json::from_str(&body).unwrap())
    })
    .await;
    assert_eq!(first["summary"]["violating"], 6);
    let events = wait_for(Duration::from_secs(10), "the capped events", async || {
        let n = w.kube.list(EVENTS).len();
        (n >= 2).then_some(n)
    })
    .await;
    assert_eq!(events, 2, "at most --audit-max-events per audit");
    assert_eq!(
        s.counter("sigil_audit_events_total", &[("result", "rate_limited")])
            .await,
        4.0
    );
    // Exempt the namespace: the next report, well before 10m, says so.
    std::fs::write(
        s.policy_path(),
        policy.replace(
            "exemptNamespaces: [kube-system]",
            "exemptNamespaces: [kube-system, shop]",
        ),
    )
    .unwrap();
    let edited = Instant::now();
    wait_for(
        Duration::from_secs(20),
        "a report under the new policy",
        async || {
            let (_, body) = get(&url).await;
            let r: Value = serde_json::from_str(&body).ok()?;
            (r["summary"]["violating"] == 0).then_some(())
        },
    )
    .await;
    assert!(edited.elapsed() < Duration::from_secs(15));
    assert_eq!(s.counter("sigil_audit_violations", &[]).await, 0.0);
}

/// The audit pulls as the webhook would: with the Pod's own
/// imagePullSecrets (read from the cluster); a Pod without them cannot
/// resolve a private image, and the report says why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn audit_pulls_with_the_workloads_own_secrets() {
    let reg = TestRegistry::start(Mode::Htpasswd {
        user: "puller",
        password: "s3cret",
    })
    .await;
    let h = reg.host();
    let d = reg.push_image("team/app", "v1").await;
    let kube = FakeKube::start().await;
    kube.namespaces(&["shop"]);
    kube.insert(
        "/api/v1/namespaces/shop/secrets",
        crate::credentials::pull_secret("shop", "regcred", &h, "puller", "s3cret"),
    );
    let mut with = pod("shop", "with-secret", &format!("{h}/team/app:v1"), None);
    with["spec"]["imagePullSecrets"] = json!([{"name": "regcred"}]);
    kube.insert(PODS, with);
    kube.insert(
        "/api/v1/namespaces/other/pods",
        pod("other", "without", &format!("{h}/team/app:v1"), None),
    );
    let dir = tempfile::tempdir().unwrap();
    let policy = dir.path().join("policy.yaml");
    std::fs::write(
        &policy,
        format!("apiVersion: sigil.dev/v1alpha1\nkind: ImagePolicy\nspec:\n  registries: [{{host: \"{h}\", insecure: true}}]\n  rules: [{{name: all, match: [\"**\"], mode: enforce}}]\n"),
    )
    .unwrap();
    let out = std::process::Command::new(bin())
        .args(["audit", "-A", "-o", "json", "--kinds", "pods", "--policy"])
        .arg(&policy)
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env("KUBECONFIG", &kube.kubeconfig)
        .output()
        .unwrap();
    let r: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)));
    let with = object(&r, "shop", "Pod", "with-secret");
    assert_eq!(reasons(with), ["not_pinned"], "{with:#}");
    assert_eq!(with["fields"][0]["expectedDigest"], d.as_str());
    let without = object(&r, "other", "Pod", "without");
    assert_eq!(reasons(without), ["unresolvable"], "{without:#}");
    let detail = without["fields"][0]["violations"][0]["detail"]
        .as_str()
        .unwrap();
    assert!(detail.contains("401"), "{detail}");
}

/// Object names and images come from the cluster: a Pod named with terminal
/// escapes (and a newline) is shown escaped in the table; JSON stays exact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_audit_table_escapes_control_characters_from_the_cluster() {
    let w = World::start().await;
    let h = w.reg.host();
    let evil = "x\u{1b}]0;pwned\u{7}\u{1b}[2J\nFAKE";
    w.kube
        .insert(PODS, pod("shop", evil, &format!("{h}/tag/app:v1"), None));
    let (_, table, _) = w.audit(&["-n", "shop"]);
    assert!(
        !table.contains('\u{1b}') && !table.contains('\u{7}'),
        "{table:?}"
    );
    assert!(
        table.contains("x\\u{1b}]0;pwned\\u{7}\\u{1b}[2J\\nFAKE"),
        "{table}"
    );
    assert!(!table.lines().any(|l| l.starts_with("FAKE")), "{table}");
    let (_, json) = w.audit_json(&["-n", "shop"]);
    assert!(
        json["objects"]
            .as_array()
            .unwrap()
            .iter()
            .any(|o| o["name"] == evil),
        "JSON carries the name exactly"
    );
}

/// `sigil audit | head` once panicked ("failed printing to stdout"), exit
/// 101) when the reader had gone before the report was written: every
/// output format now exits 2 saying stdout is gone, like any other failure
/// (not 0: a pipeline with `pipefail` must not read findings as a pass).
/// `sigil audit` runs as a blocking child while the stand-in serves it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_that_has_gone_is_an_error_not_a_panic_in_every_output_format() {
    let w = World::start().await;
    for format in ["table", "json", "yaml", "policyreport", "openreports"] {
        let (code, err) = w.audit_into_closed_pipe(&["-A", "-o", format]);
        assert!(!err.contains("panicked"), "{format}: {err}");
        assert_eq!(code, 2, "{format}: {err}");
        assert!(err.contains("Broken pipe"), "{format}: {err}");
    }
}
