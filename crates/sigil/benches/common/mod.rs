//! Shared by the benchmarks: a real `docker-registry` on loopback and image pushes.
//!
//! Owns only setup; nothing here is measured.
#![allow(dead_code)]

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::json;
use sha2::{Digest as _, Sha256};

/// A child process killed on drop.
pub struct Proc(pub Child);
impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("port")
}

pub async fn wait_http(http: &reqwest::Client, url: &str) {
    let until = Instant::now() + Duration::from_secs(20);
    loop {
        if let Ok(r) = http.get(url).send().await
            && r.status().is_success()
        {
            return;
        }
        assert!(Instant::now() < until, "{url} never came up");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

pub fn sha256(b: &[u8]) -> String {
    format!(
        "sha256:{}",
        Sha256::digest(b)
            .iter()
            .map(|x| format!("{x:02x}"))
            .collect::<String>()
    )
}

pub async fn push_blob(http: &reqwest::Client, reg: &str, repo: &str, data: Vec<u8>) -> String {
    let d = sha256(&data);
    let r = http
        .post(format!("http://{reg}/v2/{repo}/blobs/uploads/"))
        .send()
        .await
        .expect("upload");
    let loc = r.headers()["location"]
        .to_str()
        .expect("location")
        .to_string();
    let url = if loc.starts_with("http") {
        loc
    } else {
        format!("http://{reg}{loc}")
    };
    let sep = if url.contains('?') { '&' } else { '?' };
    let r = http
        .put(format!("{url}{sep}digest={d}"))
        .body(data)
        .send()
        .await
        .expect("put blob");
    assert_eq!(r.status(), 201);
    d
}

pub async fn push_image(http: &reqwest::Client, reg: &str, repo: &str, tag: String) -> String {
    let tag = tag.as_str();
    let config = serde_json::to_vec(&json!({"architecture": "amd64", "os": "linux", "rootfs": {"type": "layers", "diff_ids": []}, "tag": tag})).expect("json");
    let layer = format!("{repo}:{tag}").into_bytes();
    let (cl, ll) = (config.len(), layer.len());
    let cd = push_blob(http, reg, repo, config).await;
    let ld = push_blob(http, reg, repo, layer).await;
    let m = serde_json::to_vec(&json!({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": cd, "size": cl},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": ld, "size": ll}]}))
    .expect("json");
    let r = http
        .put(format!("http://{reg}/v2/{repo}/manifests/{tag}"))
        .header("content-type", "application/vnd.oci.image.manifest.v1+json")
        .body(m.clone())
        .send()
        .await
        .expect("put manifest");
    assert_eq!(r.status(), 201);
    sha256(&m)
}

/// Pushes an image and a cosign signature of it (legacy `.sig` tag) made
/// with `key`; returns the image digest.
#[allow(dead_code)]
pub async fn push_signed(
    http: &reqwest::Client,
    reg: &str,
    repo: &str,
    tag: String,
    key: &aws_lc_rs::signature::EcdsaKeyPair,
) -> String {
    use base64::Engine as _;
    let digest = push_image(http, reg, repo, tag).await;
    let payload = serde_json::to_vec(&json!({"critical": {"identity": {"docker-reference": format!("{reg}/{repo}")}, "image": {"docker-manifest-digest": digest}, "type": "cosign container image signature"}, "optional": null})).expect("json");
    let rng = aws_lc_rs::rand::SystemRandom::new();
    let sig = key.sign(&rng, &payload).expect("sign");
    let sig = base64::engine::general_purpose::STANDARD.encode(sig.as_ref());
    let pl = payload.len();
    // Unique per signature: concurrent uploads of one shared blob race in distribution 2.x.
    let config = serde_json::to_vec(&json!({"architecture": "", "os": "", "rootfs": {"type": "layers", "diff_ids": []}, "signs": digest})).expect("json");
    let cl = config.len();
    let cd = push_blob(http, reg, repo, config).await;
    let pd = push_blob(http, reg, repo, payload).await;
    let m = serde_json::to_vec(&json!({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": cd, "size": cl},
        "layers": [{"mediaType": "application/vnd.dev.cosign.simplesigning.v1+json", "digest": pd, "size": pl,
            "annotations": {"dev.cosignproject.cosign/signature": sig}}]}))
    .expect("json");
    let r = http
        .put(format!(
            "http://{reg}/v2/{repo}/manifests/{}.sig",
            digest.replace(':', "-")
        ))
        .header("content-type", "application/vnd.oci.image.manifest.v1+json")
        .body(m)
        .send()
        .await
        .expect("put signature");
    let status = r.status();
    assert_eq!(status, 201, "{:?}", r.text().await);
    digest
}

/// Starts the registry with storage under `dir`; returns it and its `host:port`.
pub async fn start_registry(dir: &std::path::Path, http: &reqwest::Client) -> (Proc, String) {
    let reg_port = free_port();
    let reg_cfg = dir.join("registry.yml");
    std::fs::write(
        &reg_cfg,
        format!(
            "version: 0.1\nlog:\n  level: error\n  accesslog:\n    disabled: true\nstorage:\n  filesystem:\n    rootdirectory: {}\nhttp:\n  addr: 127.0.0.1:{reg_port}\n  secret: bench\n",
            dir.join("data").display()
        ),
    )
    .expect("write registry config");
    let proc = Proc(
        Command::new("docker-registry")
            .arg("serve")
            .arg(&reg_cfg)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("docker-registry (apt install docker-registry)"),
    );
    let reg = format!("127.0.0.1:{reg_port}");
    wait_http(http, &format!("http://{reg}/v2/")).await;
    (proc, reg)
}
