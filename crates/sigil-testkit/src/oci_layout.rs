//! OCI image layouts on disk, for the offline registry (`sigil test`,
//! `sigil_registry::layout`): one layout per repository under a root, as
//! `skopeo copy oci:DIR:TAG` writes them, with cosign signatures as
//! `sha256-<hex>.sig` tags and referrers as untagged manifests with a
//! `subject`.

use std::path::{Path, PathBuf};

use serde_json::{Value, json};
use sha2::{Digest as _, Sha256};

use crate::signing::{Layer, Signer, legacy_manifest, simple_signing};

/// One repository's OCI image layout being written.
pub struct Layout {
    dir: PathBuf,
    entries: Vec<Value>,
}

fn sha256(bytes: &[u8]) -> String {
    let d = Sha256::digest(bytes);
    format!(
        "sha256:{}",
        d.iter().map(|b| format!("{b:02x}")).collect::<String>()
    )
}

impl Layout {
    /// An empty layout for `repository` (a normalized name) under `root`.
    pub fn create(root: &Path, repository: &str) -> Layout {
        let dir = repository
            .split('/')
            .fold(root.to_path_buf(), |p, s| p.join(s));
        std::fs::create_dir_all(dir.join("blobs/sha256")).unwrap();
        std::fs::write(
            dir.join("oci-layout"),
            "{\"imageLayoutVersion\":\"1.0.0\"}\n",
        )
        .unwrap();
        let l = Layout {
            dir,
            entries: Vec::new(),
        };
        l.write_index();
        l
    }

    fn write_index(&self) {
        let index = json!({"schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.index.v1+json", "manifests": self.entries});
        let mut text = serde_json::to_string_pretty(&index).unwrap();
        text.push('\n');
        std::fs::write(self.dir.join("index.json"), text).unwrap();
    }

    /// Stores a blob; returns its digest.
    pub fn blob(&mut self, bytes: &[u8]) -> String {
        let d = sha256(bytes);
        let hex = d.trim_start_matches("sha256:");
        std::fs::write(self.dir.join("blobs/sha256").join(hex), bytes).unwrap();
        d
    }

    /// Stores a manifest and lists it in `index.json` (tagged when `tag`
    /// is given); returns its digest.
    pub fn manifest(&mut self, bytes: &[u8], media_type: &str, tag: Option<&str>) -> String {
        let d = self.blob(bytes);
        let mut entry = json!({"mediaType": media_type, "digest": d, "size": bytes.len()});
        if let Some(t) = tag {
            entry["annotations"] = json!({"org.opencontainers.image.ref.name": t});
        }
        self.entries.push(entry);
        self.write_index();
        d
    }

    /// A one-layer image tagged `tag` whose layer says `content`; returns its digest.
    pub fn image(&mut self, tag: &str, content: &str) -> String {
        let config = serde_json::to_vec(&json!({"architecture": "amd64", "os": "linux",
            "rootfs": {"type": "layers", "diff_ids": []}, "config": {}}))
        .unwrap();
        let cd = self.blob(&config);
        let ld = self.blob(content.as_bytes());
        let manifest = serde_json::to_vec(&json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": cd, "size": config.len()},
            "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": ld, "size": content.len()}]
        }))
        .unwrap();
        self.manifest(
            &manifest,
            "application/vnd.oci.image.manifest.v1+json",
            Some(tag),
        )
    }

    /// A legacy cosign signature of `digest` by `key` (its payload naming
    /// `reference`), at tag `sha256-<hex>.sig`.
    pub fn sign(&mut self, digest: &str, reference: &str, key: &Signer) {
        let payload = simple_signing(reference, digest);
        let layer = Layer::new(payload.clone(), &key.sign(&payload));
        let config = serde_json::to_vec(&json!({"architecture": "", "config": {}, "os": "",
            "rootfs": {"type": "layers", "diff_ids": []}, "signs": digest}))
        .unwrap();
        let cd = self.blob(&config);
        let pd = self.blob(&payload);
        let m = legacy_manifest((&cd, config.len()), &[(pd, &layer)]);
        let tag = format!("{}.sig", digest.replace(':', "-"));
        self.manifest(&m, "application/vnd.oci.image.manifest.v1+json", Some(&tag));
    }
}
