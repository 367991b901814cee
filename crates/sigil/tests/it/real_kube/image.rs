//! The shipped image, built and run: `scripts/image.sh` builds it (from the
//! binary under test; users get the `dist` build), it is pushed to the test
//! registry, pulled and run by podman with the chart's securityContext
//! (read-only root filesystem, uid 65532, no capabilities, no privilege
//! escalation), and the real API server's admission call is answered
//! through it. Skipped, saying why, without the real-API assets or without
//! root, buildah, podman and runc.

use super::pod;
use crate::kubelet::Runtime;
use crate::support::image;
use crate::support::kube::real::{RealKube, assets_or_skip};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shipped_image_answers_the_real_api_server_read_only_as_uid_65532() {
    let test = "the_shipped_image_answers_the_real_api_server_read_only_as_uid_65532";
    let Some(assets) = assets_or_skip(test) else {
        return;
    };
    if image::tools_or_skip(test).is_none() {
        return;
    }
    let local = format!("localhost/sigil:it-{}", std::process::id());
    let built = image::build(crate::support::sigil::bin(), &local).unwrap();
    assert_eq!(built, local, "scripts/image.sh prints the reference last");
    let mut cleanup = RemoveImages(vec![local.clone()]);
    let inspected = image::inspect(&local).unwrap();
    eprintln!(
        "image {local}: {} MB unpacked",
        inspected["Size"].as_u64().unwrap_or_default() / 1_000_000
    );
    same_as_the_dockerfile(&inspected["Config"]);
    // The node verifier the DaemonSet copies onto hosts is in the image,
    // and runs there (a root without a shell).
    let o = std::process::Command::new("podman")
        .args([
            "--runtime",
            "runc",
            "run",
            "--rm",
            "--network=none",
            // The limits this machine lets a container set (as
            // sigil_testkit::image runs the image).
            "--ulimit",
            "nofile=20000:20000",
            "--ulimit",
            "nproc=32768:32768",
            "--entrypoint",
            "/usr/local/bin/sigil-static",
            &local,
            "--version",
        ])
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&o.stdout).starts_with("sigil "),
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );

    let kube = RealKube::start(&assets).await;
    let (launched, _) = super::base_with_sigil(&kube, Runtime::Image(&local)).await;
    // What podman pulled from the test registry goes too.
    cleanup
        .0
        .push(format!("{}/sigil:shipped", launched.registry.host()));
    let name = launched.sigil.container().expect("runs in a container");
    let pid = image::container_pid(name).unwrap();
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let uids = status.lines().find(|l| l.starts_with("Uid:")).unwrap();
    assert!(
        uids.split_whitespace().skip(1).all(|u| u == "65532"),
        "runs as uid 65532: {uids}"
    );
    let caps = status.lines().find(|l| l.starts_with("CapEff:")).unwrap();
    assert!(
        caps.ends_with("0000000000000000"),
        "no capabilities: {caps}"
    );
    assert!(
        status.lines().any(|l| l == "NoNewPrivs:\t1"),
        "no privilege escalation"
    );
    let mountinfo = std::fs::read_to_string(format!("/proc/{pid}/mountinfo")).unwrap();
    let root = mountinfo
        .lines()
        .find(|l| l.split_whitespace().nth(4) == Some("/"))
        .expect("a root mount");
    assert!(
        root.split_whitespace()
            .nth(5)
            .is_some_and(|o| o.split(',').any(|o| o == "ro")),
        "the root filesystem is read-only: {root}"
    );

    let reg = &launched.registry;
    let digest = reg.push_image("shop/app", "1.0").await;
    let app = format!("{}/shop/app:1.0", reg.host());
    let (status, created) = kube
        .request(
            "POST",
            "/api/v1/namespaces/shop/pods",
            Some(&pod("shop", "web", &app)),
        )
        .await;
    assert_eq!(status, 201, "{created}\n{}", launched.sigil.logs());
    assert_eq!(
        created["spec"]["containers"][0]["image"],
        format!("{app}@{digest}"),
        "the image answered the API server's call and pinned the Pod"
    );
}

/// The image's configuration is what the Dockerfile's final stage says:
/// its user, entrypoint, command and ports.
fn same_as_the_dockerfile(config: &serde_json::Value) {
    let dockerfile = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../Dockerfile"),
    )
    .unwrap();
    let last = |word: &str| {
        dockerfile
            .lines()
            .rev()
            .find_map(|l| l.strip_prefix(word))
            .unwrap_or_else(|| panic!("the Dockerfile has no {word}"))
            .trim()
            .to_owned()
    };
    let json_list = |s: String| serde_json::from_str::<serde_json::Value>(&s).unwrap();
    assert_eq!(config["User"], last("USER "), "USER");
    assert_eq!(
        config["Entrypoint"],
        json_list(last("ENTRYPOINT ")),
        "ENTRYPOINT"
    );
    assert_eq!(config["Cmd"], json_list(last("CMD ")), "CMD");
    let mut ports: Vec<String> = config["ExposedPorts"]
        .as_object()
        .expect("exposed ports")
        .keys()
        .map(|p| p.trim_end_matches("/tcp").to_owned())
        .collect();
    ports.sort();
    let mut want: Vec<String> = last("EXPOSE ")
        .split_whitespace()
        .map(String::from)
        .collect();
    want.sort();
    assert_eq!(ports, want, "EXPOSE");
}

/// Removes the test's images however the test ends (declared before the
/// container, so dropped after it).
struct RemoveImages(Vec<String>);

impl Drop for RemoveImages {
    fn drop(&mut self) {
        for i in &self.0 {
            image::remove(i);
        }
    }
}
