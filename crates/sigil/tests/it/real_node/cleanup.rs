//! A failing test leaves the machine clean: a node brought up with a Pod
//! running on it, then a panic; afterwards no address, bridge, route,
//! iptables chain, cgroup, process or mount of the node is left, and the
//! kubelet's hard-coded directories (and containerd's `/opt/containerd`)
//! were made only in the node's overlay.

use std::time::{Duration, Instant};

use crate::support::node::{self, Node, host, images};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_test_that_panics_leaves_nothing_on_the_machine() {
    let Some(assets) =
        node::assets_or_skip("a_node_test_that_panics_leaves_nothing_on_the_machine")
    else {
        return;
    };
    // /opt/containerd: containerd's `opt` plugin's default, which the
    // test kit's containerds once left on the host.
    let had = [
        "/var/log/containers",
        "/var/lib/kubelet",
        "/run/netns",
        "/opt/containerd",
    ]
    .map(|p| std::path::Path::new(p).exists());
    let failing = tokio::spawn(async move {
        let node = Node::start(&assets).await;
        let image = format!("{}/box:1", node.registry.host());
        images::push_busybox(&node.registry, "box", "1").await;
        let until = Instant::now() + Duration::from_secs(30);
        while node
            .kube
            .get("/api/v1/namespaces/default/serviceaccounts/default")
            .await
            .is_none()
        {
            assert!(Instant::now() < until, "no default ServiceAccount");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let (status, v) = node
            .kube
            .request(
                "POST",
                "/api/v1/namespaces/default/pods",
                Some(&super::workload("default", "box", &image)),
            )
            .await;
        assert_eq!(status, 201, "{v}");
        let until = Instant::now() + Duration::from_secs(60);
        loop {
            let p = node
                .kube
                .get("/api/v1/namespaces/default/pods/box")
                .await
                .unwrap();
            if p["status"]["phase"] == "Running" {
                break;
            }
            assert!(
                Instant::now() < until,
                "box never ran: {p:#}\n{}",
                node.logs()
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        panic!("a test failing with a Pod running");
    });
    let joined = failing.await;
    assert!(
        joined.as_ref().is_err_and(|e| e.is_panic()),
        "the test did not fail as meant: {joined:?}"
    );
    let left = host::traces();
    assert!(left.is_empty(), "left on the machine: {left:#?}");
    let ps = std::process::Command::new("ps")
        .args(["-eo", "stat,args"])
        .output()
        .unwrap();
    let running: Vec<String> = String::from_utf8_lossy(&ps.stdout)
        .lines()
        .filter(|l| l.contains("sigil-node") && !l.starts_with('Z'))
        .map(str::to_owned)
        .collect();
    assert!(running.is_empty(), "processes left: {running:#?}");
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(!mounts.contains("sigil-node"), "mounts left: {mounts}");
    let now = [
        "/var/log/containers",
        "/var/lib/kubelet",
        "/run/netns",
        "/opt/containerd",
    ]
    .map(|p| std::path::Path::new(p).exists());
    assert_eq!(
        had, now,
        "the kubelet's or containerd's directories reached the host"
    );
}
