//! A whole cluster restart (seeds 000/001): every process of the node and
//! the control plane killed at once, then started again. sigil comes back
//! failing closed with the backstop and the node verifier in force,
//! kube-system's and sigil's own Pods are never refused, and the first
//! workload Pod is admitted (pinned) within a bound (the measured figure is
//! in docs/operations.md, "A full cluster restart"). It is the install
//! test's last step: one node boot and one install serve both.

use std::time::{Duration, Instant};

use super::{Installed, rollout_status, workload};
use crate::support::node::{NODE_NAME, config::VERIFIER_DIR};

/// Run last on the installed node (the install test's final step, so the
/// tier boots and installs once for both): the webhook back to failing
/// closed as shipped, then the power cut.
pub(super) async fn after_a_power_cut_the_cluster_comes_back_failing_closed_with_no_manual_step(
    i: &Installed,
) {
    // webhook_gone left the webhook failing open: back to the chart's default.
    super::helm(
        &i.node,
        &[
            "upgrade",
            "sigil",
            &super::chart(),
            "-n",
            "sigil-system",
            "--reuse-values",
            "--set",
            "webhook.failurePolicy=Fail",
        ],
    );
    rollout_status(&i.node, "sigil-system", "deployment/sigil", "180s");
    // A kube-system Pod the node runs itself (as kube-proxy or a CNI would).
    let pinned = format!("{}@{}", i.signed.0, i.signed.1);
    let mut probe = workload("kube-system", "probe", &pinned);
    probe["metadata"]["namespace"] = "kube-system".into();
    i.node.static_pod("probe", &probe);
    i.wait_running(
        "kube-system",
        &format!("probe-{NODE_NAME}"),
        Duration::from_secs(90),
    )
    .await;

    i.node.power_off();
    let on = Instant::now();
    i.node.power_on().await;
    let node_ready = on.elapsed();
    // A client creating a workload Pod every 250 ms from the moment the API
    // server answers: refused (fail closed) until sigil is back, then pinned.
    let mut refusals = Vec::new();
    let admitted = loop {
        let name = format!("first-{}", refusals.len());
        let (status, answer) = i.create(&workload("shop", &name, &i.signed.0)).await;
        if status == 201 {
            break answer;
        }
        refusals.push(format!("{status}: {}", answer["message"]));
        assert!(
            on.elapsed() < Duration::from_secs(240),
            "no workload Pod admitted within 240 s of the power coming back: {refusals:#?}\n{}",
            i.node.logs()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    let first = on.elapsed();
    eprintln!(
        "power on: node Ready after {node_ready:?}, first workload Pod admitted after {first:?} ({} refused before)",
        refusals.len()
    );
    assert_eq!(
        admitted["spec"]["containers"][0]["image"], pinned,
        "the first Pod admitted was pinned by sigil"
    );
    assert!(
        refusals.iter().all(|r| r.contains("sigil")),
        "every refusal before sigil was back is sigil's fail-closed answer: {refusals:#?}"
    );
    assert!(
        first < Duration::from_secs(120),
        "first workload Pod after {first:?}"
    );
    // Still failing closed, the backstop and the node verifier in force.
    let mwc = i
        .node
        .kube
        .get("/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/sigil")
        .await
        .unwrap();
    assert_eq!(mwc["webhooks"][0]["failurePolicy"], "Fail");
    assert!(
        i.node
            .kube
            .get("/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings/sigil-backstop")
            .await
            .is_some()
    );
    let link = i
        .node
        .in_node(&["readlink", &format!("{VERIFIER_DIR}/sigil-containerd")]);
    assert!(link.status.success(), "{link:?}");
    rollout_status(&i.node, "sigil-system", "deployment/sigil", "120s");
    rollout_status(&i.node, "sigil-node", "daemonset/sigil-node", "120s");
    i.wait_running(
        "kube-system",
        &format!("probe-{NODE_NAME}"),
        Duration::from_secs(90),
    )
    .await;
    // Never refused: no controller or kubelet was told no in those namespaces.
    for ns in ["kube-system", "sigil-system", "sigil-node"] {
        let events = i
            .node
            .kube
            .get(&format!("/api/v1/namespaces/{ns}/events"))
            .await
            .unwrap();
        let refused: Vec<&serde_json::Value> = events["items"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|e| {
                e["reason"] == "FailedCreate"
                    || e["message"]
                        .as_str()
                        .is_some_and(|m| m.contains("denied the request"))
            })
            .collect();
        assert!(refused.is_empty(), "{ns}: {refused:#?}");
    }
}
