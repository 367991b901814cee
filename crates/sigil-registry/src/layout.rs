//! A registry read from disk: OCI image layouts, one per repository, so
//! decisions — tags, digests, signatures, attestations — can be made without
//! a network (`sigil test`, air-gapped pinning).
//!
//! Owns the directory convention and answering [`DigestResolver`] and
//! [`ArtifactSource`] from it: repository `registry.example.com/team/app`
//! is the OCI image layout (`oci-layout`, `index.json`, `blobs/<alg>/<hex>`)
//! at `<root>/registry.example.com/team/app/` — what `skopeo copy
//! oci:DIR:TAG`, `oras copy --to-oci-layout` and `cosign save` write. A tag
//! is an `index.json` entry annotated `org.opencontainers.image.ref.name`
//! (the tag, or a full reference ending in it); cosign's `sha256-<hex>.sig`
//! and `.att` are tags like any other; referrers are the manifests in
//! `index.json` whose `subject` names the digest. Every blob read is checked
//! against its digest. It does not write layouts.

use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::Deserialize;
use sha2::{Digest as _, Sha256};
use sigil_core::{
    ArtifactSource, Digest, DigestResolver, Platform, PullCredentials, Reference, ResolveFailure,
};

/// The annotation naming an `index.json` entry's tag.
pub const REF_NAME: &str = "org.opencontainers.image.ref.name";

/// OCI image layouts under one directory, by repository name.
#[derive(Debug, Clone)]
pub struct Layouts {
    root: PathBuf,
}

#[derive(Deserialize)]
struct Index {
    #[serde(default)]
    manifests: Vec<Entry>,
}

#[derive(Deserialize, Clone)]
#[serde(rename_all = "camelCase")]
struct Entry {
    media_type: Option<String>,
    digest: String,
    #[serde(default)]
    size: i64,
    #[serde(default)]
    annotations: std::collections::BTreeMap<String, String>,
    #[serde(default)]
    artifact_type: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct WithSubject {
    media_type: Option<String>,
    artifact_type: Option<String>,
    config: Option<Descriptor>,
    subject: Option<Descriptor>,
    #[serde(default)]
    annotations: std::collections::BTreeMap<String, String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Descriptor {
    digest: String,
    #[serde(default)]
    media_type: Option<String>,
}

fn not_found(detail: String) -> ResolveFailure {
    ResolveFailure::NotFound { detail }
}

fn bad(detail: String) -> ResolveFailure {
    ResolveFailure::BadResponse { detail }
}

impl Layouts {
    /// Layouts under `root`.
    pub fn new(root: impl Into<PathBuf>) -> Layouts {
        Layouts { root: root.into() }
    }

    /// The layout directory of `repository` (its normalized name, one
    /// directory per path segment).
    fn dir(&self, repository: &Reference) -> Result<PathBuf, ResolveFailure> {
        let name = repository.name();
        let mut p = self.root.clone();
        for seg in name.split('/') {
            // A parsed reference has no empty, `.` or `..` segments; refuse
            // them anyway rather than read outside the root.
            if seg.is_empty() || seg == "." || seg == ".." {
                return Err(bad(format!("repository {name:?} cannot name a directory")));
            }
            p.push(seg);
        }
        Ok(p)
    }

    fn index(&self, dir: &Path, name: &str) -> Result<Index, ResolveFailure> {
        let path = dir.join("index.json");
        let bytes = match std::fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(not_found(format!(
                    "repository {name} is not in the offline registry (no {})",
                    path.display()
                )));
            }
            Err(e) => return Err(bad(format!("{}: {e}", path.display()))),
        };
        serde_json::from_slice(&bytes).map_err(|e| bad(format!("{}: {e}", path.display())))
    }

    /// A blob of `dir`'s layout, checked against `digest`; `Ok(None)` when absent.
    fn read_blob(
        dir: &Path,
        digest: &Digest,
        max: usize,
    ) -> Result<Option<Vec<u8>>, ResolveFailure> {
        if digest.algorithm() != "sha256" {
            return Err(bad(format!("{digest}: only sha256 blobs are read")));
        }
        let path = dir.join("blobs").join("sha256").join(digest.hex());
        let meta = match std::fs::metadata(&path) {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(bad(format!("{}: {e}", path.display()))),
        };
        if meta.len() > max as u64 {
            return Err(bad(format!(
                "{} is {} bytes, over the {max}-byte limit",
                path.display(),
                meta.len()
            )));
        }
        let bytes = std::fs::read(&path).map_err(|e| bad(format!("{}: {e}", path.display())))?;
        let got = hex(&Sha256::digest(&bytes));
        if got != digest.hex() {
            return Err(bad(format!(
                "{} does not match its digest (sha256:{got})",
                path.display()
            )));
        }
        Ok(Some(bytes))
    }

    /// The `index.json` entry tagged `tag`.
    fn tagged(
        &self,
        repository: &Reference,
        tag: &str,
    ) -> Result<(PathBuf, Entry), ResolveFailure> {
        let dir = self.dir(repository)?;
        let name = repository.name();
        let index = self.index(&dir, &name)?;
        let entry = index
            .manifests
            .into_iter()
            .find(|m| {
                m.annotations
                    .get(REF_NAME)
                    .is_some_and(|r| r == tag || *r == format!("{name}:{tag}"))
            })
            .ok_or_else(|| not_found(format!("{name}:{tag} is not in the offline registry")))?;
        Ok((dir, entry))
    }
}

const MAX_MANIFEST: usize = 4 << 20;

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

impl DigestResolver for Layouts {
    async fn resolve(
        &self,
        target: &Reference,
        platform: Option<&Platform>,
        _creds: &PullCredentials,
        _deadline: Instant,
    ) -> Result<Digest, ResolveFailure> {
        // A digest: is its manifest in the repository's layout?
        if let Some(d) = target.digest() {
            let dir = self.dir(target)?;
            return match Layouts::read_blob(&dir, d, MAX_MANIFEST)? {
                Some(_) => Ok(d.clone()),
                None => Err(not_found(format!(
                    "manifest {d} of {} is not in its layout",
                    target.name()
                ))),
            };
        }
        let tag = target.tag().unwrap_or("latest");
        let (dir, entry) = self.tagged(target, tag)?;
        let digest = Digest::parse(&entry.digest)
            .map_err(|e| bad(format!("index.json entry {:?}: {e}", entry.digest)))?;
        let Some(p) = platform else {
            return Ok(digest);
        };
        let body = Layouts::read_blob(&dir, &digest, MAX_MANIFEST)?
            .ok_or_else(|| not_found(format!("blob {digest} of {} is missing", target.name())))?;
        crate::response::pick_platform(&body, p, digest)
    }
}

impl ArtifactSource for Layouts {
    async fn manifest(
        &self,
        repository: &Reference,
        reference: &str,
        _creds: &PullCredentials,
        _deadline: Instant,
    ) -> Result<Option<Vec<u8>>, ResolveFailure> {
        let dir = self.dir(repository)?;
        let digest = match Digest::parse(reference) {
            Ok(d) => d,
            Err(_) => match self.tagged(repository, reference) {
                Ok((_, e)) => Digest::parse(&e.digest).map_err(|e| bad(e.to_string()))?,
                Err(ResolveFailure::NotFound { .. }) => return Ok(None),
                Err(e) => return Err(e),
            },
        };
        Layouts::read_blob(&dir, &digest, MAX_MANIFEST)
    }

    async fn referrers(
        &self,
        repository: &Reference,
        digest: &Digest,
        _creds: &PullCredentials,
        _deadline: Instant,
    ) -> Result<Option<Vec<u8>>, ResolveFailure> {
        let dir = self.dir(repository)?;
        let index = match self.index(&dir, &repository.name()) {
            Ok(i) => i,
            Err(ResolveFailure::NotFound { .. }) => return Ok(Some(empty_index(Vec::new()))),
            Err(e) => return Err(e),
        };
        let mut found = Vec::new();
        for e in &index.manifests {
            let Ok(d) = Digest::parse(&e.digest) else {
                continue;
            };
            let Some(body) = Layouts::read_blob(&dir, &d, MAX_MANIFEST)? else {
                continue;
            };
            let Ok(m) = serde_json::from_slice::<WithSubject>(&body) else {
                continue;
            };
            if m.subject
                .as_ref()
                .is_none_or(|s| s.digest != digest.to_string())
            {
                continue;
            }
            let artifact_type = m
                .artifact_type
                .or_else(|| e.artifact_type.clone())
                .or_else(|| m.config.and_then(|c| c.media_type));
            found.push(serde_json::json!({
                "mediaType": m.media_type.or_else(|| e.media_type.clone()),
                "digest": e.digest, "size": e.size,
                "artifactType": artifact_type,
                "annotations": m.annotations,
            }));
        }
        Ok(Some(empty_index(found)))
    }

    async fn blob(
        &self,
        repository: &Reference,
        digest: &Digest,
        max: usize,
        _creds: &PullCredentials,
        _deadline: Instant,
    ) -> Result<Vec<u8>, ResolveFailure> {
        let dir = self.dir(repository)?;
        Layouts::read_blob(&dir, digest, max)?.ok_or_else(|| {
            not_found(format!(
                "blob {digest} of {} is not in the offline registry",
                repository.name()
            ))
        })
    }
}

fn empty_index(manifests: Vec<serde_json::Value>) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": manifests,
    }))
    .unwrap_or_default()
}

#[cfg(test)]
mod tests;
