//! Installed as shipped, and everyday use: sigil's Pods Ready by their own
//! probes behind their Service, its own image pulled through its own node
//! verifier, a Deployment by tag pinned and running, a refused image with
//! the what/why/fix, a static Pod (which no webhook sees) refused by the
//! node verifier with sigil's reason in its Events; then the webhook gone
//! (scaled to zero): the backstop refuses an unpinned Pod, the node an
//! unsigned image, and scaling up brings sigil back with no other step.
//! Also: nothing a Pod sends leaves the machine.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::{Installed, assets_or_skip, install, kubectl, rollout_status, workload};
use crate::support::node::{NODE_NAME, POD_CIDR, SERVICE_IP, config::VERIFIER_DIR};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn installed_by_its_chart_sigil_pins_refuses_and_the_node_refuses_what_no_webhook_sees() {
    let test =
        "installed_by_its_chart_sigil_pins_refuses_and_the_node_refuses_what_no_webhook_sees";
    let Some(assets) = assets_or_skip(test) else {
        return;
    };
    let started = Instant::now();
    let i = install(&assets).await;
    eprintln!("node up and sigil installed in {:?}", started.elapsed());
    sigil_is_served_through_its_service(&i).await;
    its_own_image_is_pulled_through_its_own_verifier(&i).await;
    i.node.kube.namespaces(&["shop"]).await;
    wait_default_account(&i, "shop").await;
    everyday(&i).await;
    pods_stay_on_this_machine(&i).await;
    the_node_tier_starts_while_the_webhook_is_down(&i).await;
    webhook_gone(&i).await;
    super::restart::after_a_power_cut_the_cluster_comes_back_failing_closed_with_no_manual_step(&i)
        .await;
}

/// The Deployment's Pods Ready (their readiness probe), the Service's
/// Endpoints exactly those Pods' addresses on the Pod network, and the
/// DaemonSet's verifier linked with the cluster's policy on the node.
async fn sigil_is_served_through_its_service(i: &Installed) {
    let d = i
        .node
        .kube
        .get("/apis/apps/v1/namespaces/sigil-system/deployments/sigil")
        .await
        .unwrap();
    assert_eq!(d["status"]["readyReplicas"], 3, "{d:#}");
    let slices = i
        .node
        .kube
        .get("/apis/discovery.k8s.io/v1/namespaces/sigil-system/endpointslices?labelSelector=kubernetes.io%2Fservice-name%3Dsigil")
        .await
        .unwrap();
    let ready: Vec<String> = slices["items"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|s| s["endpoints"].as_array().cloned().unwrap_or_default())
        .filter(|e| e["conditions"]["ready"] == true)
        .flat_map(|e| e["addresses"].as_array().cloned().unwrap_or_default())
        .map(|a| a.as_str().unwrap_or_default().to_owned())
        .collect();
    assert_eq!(ready.len(), 3, "{slices:#}");
    let net = POD_CIDR.trim_end_matches(".0/24");
    assert!(ready.iter().all(|a| a.starts_with(net)), "{ready:?}");
    let link = i
        .node
        .in_node(&["readlink", &format!("{VERIFIER_DIR}/sigil-containerd")]);
    assert_eq!(
        String::from_utf8_lossy(&link.stdout).trim(),
        "/opt/sigil/bin/sigil",
        "{link:?}"
    );
    let policy = i.node.in_node(&["cat", "/etc/sigil/node-policy.yaml"]);
    assert!(
        String::from_utf8_lossy(&policy.stdout).contains("apps"),
        "{policy:?}"
    );
}

/// Remove sigil's image from the node and replace one replica: kubelet pulls
/// it again, now through the verifier sigil installed (its `nodeAdmits`).
async fn its_own_image_is_pulled_through_its_own_verifier(i: &Installed) {
    let image = format!("{}/sigil:it", i.host);
    let before = i.node.verifier_calls();
    let rm = i.node.ctr(&["-n", "k8s.io", "images", "rm", &image]);
    assert!(rm.status.success(), "{rm:?}");
    kubectl(
        &i.node,
        &[
            "-n",
            "sigil-system",
            "rollout",
            "restart",
            "deployment/sigil",
        ],
    );
    rollout_status(&i.node, "sigil-system", "deployment/sigil", "180s");
    let calls = i.node.verifier_calls();
    assert!(
        calls[before.len()..].iter().any(|c| c.contains("sigil")),
        "no verifier call for sigil's own image: {calls:#?}"
    );
}

/// Waits until the controller-manager has made `ns`'s default ServiceAccount.
pub(super) async fn wait_default_account(i: &Installed, ns: &str) {
    let until = Instant::now() + Duration::from_secs(30);
    let path = format!("/api/v1/namespaces/{ns}/serviceaccounts/default");
    while i.node.kube.get(&path).await.is_none() {
        assert!(Instant::now() < until, "no default ServiceAccount in {ns}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn everyday(i: &Installed) {
    // A Deployment by tag: pinned by sigil, its Pod running the signed digest.
    let deploy = json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "web", "namespace": "shop"},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "web"}},
            "template": {"metadata": {"labels": {"app": "web"}},
                "spec": workload("shop", "x", &i.signed.0)["spec"].clone()}}});
    i.node.kube.apply(&[deploy]).await;
    let pod = wait_labelled_running(i, "shop", "app=web").await;
    let image = pod["spec"]["containers"][0]["image"].as_str().unwrap();
    assert_eq!(
        image,
        format!("{}@{}", i.signed.0, i.signed.1),
        "the Deployment's Pod runs the pinned digest"
    );
    // An unsigned image is refused at admission: what, why, how to fix.
    let (status, answer) = i.create(&workload("shop", "unsigned", &i.unsigned.0)).await;
    let message = answer["message"].as_str().unwrap_or_default();
    assert_eq!(status, 403, "{answer:#}");
    assert!(
        message.contains("apps/unsigned:1")
            && message.contains("team: no signature found")
            && message.contains("to fix:"),
        "the refusal says what, why and how to fix: {message}"
    );
    // The same image as a static Pod: no webhook sees it; the node refuses
    // the pull with sigil's reason, in the Pod's Events.
    let mut static_pod = workload(
        "default",
        "bypass",
        &format!("{}@{}", i.unsigned.0, i.unsigned.1),
    );
    static_pod["metadata"]
        .as_object_mut()
        .unwrap()
        .remove("namespace");
    i.node.static_pod("bypass", &static_pod);
    let reason = wait_pull_refused(i, "default", &format!("bypass-{NODE_NAME}")).await;
    assert!(
        reason.contains("sigil") && reason.contains("apps/unsigned"),
        "the node's refusal is sigil's: {reason}"
    );
    i.node.remove_static_pod("bypass");
}

/// Waits for one Pod labelled `selector` in `ns` to be Running.
async fn wait_labelled_running(i: &Installed, ns: &str, selector: &str) -> Value {
    let until = Instant::now() + Duration::from_secs(90);
    loop {
        let list = i
            .node
            .kube
            .get(&format!(
                "/api/v1/namespaces/{ns}/pods?labelSelector={}",
                selector.replace('=', "%3D")
            ))
            .await
            .unwrap();
        if let Some(p) = list["items"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|p| p["status"]["phase"] == "Running")
        {
            return p.clone();
        }
        assert!(
            Instant::now() < until,
            "no Running Pod {selector} in {ns}: {list:#}\n{}",
            i.node.logs()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Waits for a `Failed` pull Event on `ns/name`; its message.
async fn wait_pull_refused(i: &Installed, ns: &str, name: &str) -> String {
    let until = Instant::now() + Duration::from_secs(90);
    loop {
        let events = i.events(ns, name).await;
        if let Some((_, m)) = events
            .iter()
            .find(|(r, m)| r == "Failed" && m.contains("pull"))
        {
            return m.clone();
        }
        assert!(
            Instant::now() < until,
            "no refused pull for {ns}/{name}: {events:#?}\n{}",
            i.node.logs()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// From a Pod: the API server's ClusterIP answers (kube-proxy's DNAT onto
/// the node), an address off the machine does not, and the guard rule
/// counted the attempt (nothing is forwarded off the machine).
async fn pods_stay_on_this_machine(i: &Installed) {
    let pod = wait_labelled_running(i, "shop", "app=web").await;
    let name = pod["metadata"]["name"].as_str().unwrap();
    let exec = |cmd: &str| {
        i.node.kubectl(&[
            "-n",
            "shop",
            "exec",
            name,
            "--",
            "/bin/busybox",
            "sh",
            "-c",
            cmd,
        ])
    };
    let api = exec(&format!(
        "echo | /bin/busybox nc -w 3 {SERVICE_IP} 443 && echo reached"
    ));
    assert!(
        String::from_utf8_lossy(&api.stdout).contains("reached"),
        "{api:?}"
    );
    let dropped_before = crate::support::node::host::guard_drops();
    let off = exec("echo | /bin/busybox nc -w 3 192.0.2.1 80 && echo reached");
    assert!(
        !String::from_utf8_lossy(&off.stdout).contains("reached"),
        "a Pod reached an address off the machine: {off:?}"
    );
    assert!(
        crate::support::node::host::guard_drops() > dropped_before,
        "the guard rule did not see the packet"
    );
    let nat = std::process::Command::new("iptables-save")
        .args(["-t", "nat"])
        .output()
        .unwrap();
    let nat = String::from_utf8_lossy(&nat.stdout);
    for l in nat.lines().filter(|l| l.contains("MASQUERADE")) {
        // kube-proxy's one rule masquerades only packets it marked for a
        // Service; the guard drops them before they could leave.
        assert!(l.starts_with("-A KUBE-POSTROUTING"), "{l}");
    }
}

/// The webhook at zero replicas, failing closed: a new DaemonSet Pod is
/// still created (the node tier's namespace is exempt, as sigil's own is),
/// by tag (the backstop exempts it too), and arms the node again; then the
/// webhook comes back.
async fn the_node_tier_starts_while_the_webhook_is_down(i: &Installed) {
    webhook_down(i);
    // Still failing closed for everyone else.
    let (status, answer) = i.create(&workload("shop", "while-down", &i.signed.0)).await;
    assert!(status >= 400, "the webhook fails closed: {answer:#}");
    let before = kubectl(&i.node, &["-n", "sigil-node", "get", "pods", "-o", "name"]);
    kubectl(
        &i.node,
        &[
            "-n",
            "sigil-node",
            "delete",
            "pod",
            "--all",
            "--wait=true",
            "--timeout=60s",
        ],
    );
    let until = Instant::now() + Duration::from_secs(60);
    let after = loop {
        let now = kubectl(&i.node, &["-n", "sigil-node", "get", "pods", "-o", "name"]);
        if !now.trim().is_empty() && now != before {
            break now;
        }
        assert!(
            Instant::now() < until,
            "no new DaemonSet Pod while the webhook is down: {}",
            kubectl(&i.node, &["-n", "sigil-node", "get", "events"])
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    kubectl(
        &i.node,
        &[
            "-n",
            "sigil-node",
            "wait",
            "--for=condition=Ready",
            after.trim(),
            "--timeout=120s",
        ],
    );
    daemonset_available(i, "sigil-node", "sigil-node", Duration::from_secs(180)).await;
    let events = kubectl(
        &i.node,
        &["-n", "sigil-node", "get", "events", "-o", "json"],
    );
    assert!(
        !events.contains("FailedCreate"),
        "no Pod creation refused: {events}"
    );
    webhook_up(i);
}

/// Scales sigil's Deployment to zero and waits until its Pods are gone.
fn webhook_down(i: &Installed) {
    let ns = "sigil-system";
    kubectl(
        &i.node,
        &["-n", ns, "scale", "deployment/sigil", "--replicas=0"],
    );
    let selector = "app.kubernetes.io/name=sigil";
    kubectl(
        &i.node,
        &[
            "-n",
            ns,
            "wait",
            "--for=delete",
            "pod",
            "-l",
            selector,
            "--timeout=120s",
        ],
    );
}

/// Scales sigil's Deployment back to three replicas and waits for them.
fn webhook_up(i: &Installed) {
    kubectl(
        &i.node,
        &[
            "-n",
            "sigil-system",
            "scale",
            "deployment/sigil",
            "--replicas=3",
        ],
    );
    rollout_status(&i.node, "sigil-system", "deployment/sigil", "180s");
}

/// Waits until the DaemonSet's controller counts every scheduled Pod as
/// available (what `kubectl rollout status` waits for), or fails the test
/// with the DaemonSet's status, its Pods and the node's logs.
async fn daemonset_available(i: &Installed, ns: &str, name: &str, within: Duration) {
    let path = format!("/apis/apps/v1/namespaces/{ns}/daemonsets/{name}");
    let until = Instant::now() + within;
    loop {
        let ds = i.node.kube.get(&path).await.unwrap_or_default();
        let status = &ds["status"];
        let desired = status["desiredNumberScheduled"].as_u64().unwrap_or(0);
        if desired > 0
            && status["numberAvailable"].as_u64() == Some(desired)
            && status["updatedNumberScheduled"].as_u64() == Some(desired)
            && status["observedGeneration"] == ds["metadata"]["generation"]
        {
            return;
        }
        if Instant::now() > until {
            panic!(
                "DaemonSet {ns}/{name} not available within {within:?}: {status:#}\n{}\n{}\n{}",
                kubectl(&i.node, &["-n", ns, "get", "pods", "-o", "wide"]),
                kubectl(&i.node, &["-n", ns, "get", "events"]),
                i.node.logs()
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// sigil scaled to zero, the webhook failing open as the backstop's
/// documented pairing: the backstop refuses an unpinned Pod, an unsigned
/// pinned one is admitted and its pull refused at the node; scaled up,
/// sigil pins again with no other step.
async fn webhook_gone(i: &Installed) {
    let chart = super::chart();
    super::helm(
        &i.node,
        &[
            "upgrade",
            "sigil",
            &chart,
            "-n",
            "sigil-system",
            "--reuse-values",
            "--set",
            "webhook.failurePolicy=Ignore",
        ],
    );
    webhook_down(i);
    let (status, answer) = i.create(&workload("shop", "by-tag", &i.signed.0)).await;
    let message = answer["message"].as_str().unwrap_or_default();
    assert_eq!(status, 403, "{answer:#}");
    assert!(
        message.contains("sigil-backstop") && message.contains("has no digest"),
        "{message}"
    );
    let pinned_unsigned = format!("{}@{}", i.unsigned.0, i.unsigned.1);
    let (status, answer) = i
        .create(&workload("shop", "unsigned-pinned", &pinned_unsigned))
        .await;
    assert_eq!(
        status, 201,
        "the backstop admits a pinned image: {answer:#}"
    );
    let reason = wait_pull_refused(i, "shop", "unsigned-pinned").await;
    assert!(reason.contains("sigil"), "{reason}");
    webhook_up(i);
    let (status, answer) = i.create(&workload("shop", "back", &i.signed.0)).await;
    assert_eq!(status, 201, "{answer:#}");
    assert_eq!(
        answer["spec"]["containers"][0]["image"],
        format!("{}@{}", i.signed.0, i.signed.1),
        "pinned again once sigil is back"
    );
}
