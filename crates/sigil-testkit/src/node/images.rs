//! Runnable images for a real node, pushed to the test registry: the
//! sandbox (`pause`, from the node assets) and workloads made of Debian's
//! static busybox (`/bin/busybox`: its `sleep`, `nc` and `httpd` work in a
//! Pod). One uncompressed tar layer each, with real file modes, so a
//! kubelet really starts them. What it does not own: signing them
//! (`crate::signing`).

use serde_json::json;

use crate::registry::{TestRegistry, sha256};

/// Where Debian's `busybox-static` puts its binary.
pub const BUSYBOX: &str = "/bin/busybox";

/// A ustar archive of `entries`: (path, mode, content); a path ending in
/// `/` is a directory.
pub fn tar(entries: &[(&str, u32, &[u8])]) -> Vec<u8> {
    let mut out = Vec::new();
    for (name, mode, content) in entries {
        let dir = name.ends_with('/');
        let mut h = [0u8; 512];
        h[..name.len()].copy_from_slice(name.as_bytes());
        h[100..107].copy_from_slice(format!("{mode:07o}").as_bytes());
        h[108..115].copy_from_slice(b"0000000");
        h[116..123].copy_from_slice(b"0000000");
        let size = if dir { 0 } else { content.len() };
        h[124..135].copy_from_slice(format!("{size:011o}").as_bytes());
        h[136..147].copy_from_slice(b"00000000000");
        h[148..156].copy_from_slice(b"        ");
        h[156] = if dir { b'5' } else { b'0' };
        h[257..263].copy_from_slice(b"ustar\0");
        h[263..265].copy_from_slice(b"00");
        let sum: u32 = h.iter().map(|b| u32::from(*b)).sum();
        h[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
        out.extend_from_slice(&h);
        if !dir {
            out.extend_from_slice(content);
            out.resize(out.len().div_ceil(512) * 512, 0);
        }
    }
    out.extend_from_slice(&[0u8; 1024]);
    out
}

/// Pushes a linux/amd64 image of one layer holding `path` (mode 0755, from
/// `binary`'s bytes) with `entrypoint`; its manifest digest. `salt` goes
/// into a file beside it, so two pushes of the same binary are two images.
pub async fn push_binary_image(
    reg: &TestRegistry,
    repo: &str,
    tag: &str,
    binary: &[u8],
    path: &str,
    entrypoint: &[&str],
    salt: &str,
) -> String {
    let dir = path.rsplit_once('/').map_or("", |(d, _)| d);
    let mut entries: Vec<(String, u32, &[u8])> = Vec::new();
    if !dir.is_empty() {
        entries.push((format!("{dir}/"), 0o755, b""));
    }
    entries.push((path.to_owned(), 0o755, binary));
    entries.push(("etc/".into(), 0o755, b""));
    entries.push(("etc/sigil-test-image".into(), 0o644, salt.as_bytes()));
    let refs: Vec<(&str, u32, &[u8])> = entries
        .iter()
        .map(|(n, m, c)| (n.as_str(), *m, *c))
        .collect();
    let layer = tar(&refs);
    let ld = reg.push_blob(repo, &layer).await;
    let config = serde_json::to_vec(&json!({
        "architecture": "amd64", "os": "linux",
        "rootfs": {"type": "layers", "diff_ids": [sha256(&layer)]},
        "config": {"Entrypoint": entrypoint}
    }))
    .unwrap();
    reg.push_one_layer(repo, tag, &config, &ld, layer.len())
        .await
        .0
}

/// Pushes a busybox image as `repo:tag` (entrypoint `/bin/busybox`); its
/// digest.
pub async fn push_busybox(reg: &TestRegistry, repo: &str, tag: &str) -> String {
    let bin = std::fs::read(BUSYBOX)
        .unwrap_or_else(|e| panic!("{BUSYBOX}: {e} (Debian: apt-get install busybox-static)"));
    push_binary_image(
        reg,
        repo,
        tag,
        &bin,
        "bin/busybox",
        &["/bin/busybox"],
        &format!("{repo}:{tag}"),
    )
    .await
}
