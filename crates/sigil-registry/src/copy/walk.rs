//! What one copy moves, and in which order, so the mirror never serves half
//! an image: every blob before the manifest that names it, every child
//! manifest before its index, the image's signatures, attestations and
//! referrers (cosign's `sha256-<hex>.sig`/`.att` tags, the referrers tag
//! schema, the referrers API) before its tag — the tag is written last, so
//! whoever finds it by tag finds everything verification reads. A manifest
//! the mirror already has by digest is complete (registries refuse a
//! manifest whose blobs or children are missing) and is not walked again.
//!
//! It owns no connection or credential ([`super::transfer`]) and no
//! single-flight or metrics ([`super`]).

use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use futures_util::future::{BoxFuture, try_join_all};
use sha2::{Digest as _, Sha256};
use sigil_core::{Digest, ResolveFailure};
use tokio::sync::Semaphore;

use super::transfer::{Repo, Upload, guarded};

/// Index nesting a copy follows (an index of indexes of manifests is 2).
const MAX_DEPTH: u8 = 3;

/// The limits every copy in the process shares.
pub(crate) struct Limits {
    /// Blob transfers at once.
    pub(crate) transfers: Arc<Semaphore>,
    /// Bytes read from origins and not yet taken by mirrors.
    pub(crate) bytes: Arc<Semaphore>,
    /// The byte budget's size (one chunk never waits for more than this).
    pub(crate) cap: usize,
    /// Bytes one copy may move.
    pub(crate) max_copy_bytes: u64,
    /// Bytes all copies may move per hour.
    pub(crate) per_hour: Window,
}

/// Bytes moved in the current hour, against a limit.
pub(crate) struct Window {
    limit: u64,
    used: std::sync::Mutex<(std::time::Instant, u64)>,
}

impl Window {
    pub(crate) fn new(limit: u64) -> Window {
        Window {
            limit,
            used: std::sync::Mutex::new((std::time::Instant::now(), 0)),
        }
    }

    /// Takes `n` bytes from this hour's allowance, or says why not.
    pub(crate) fn take(&self, n: u64) -> Result<(), String> {
        let mut used = self.used.lock().unwrap_or_else(|e| e.into_inner());
        if used.0.elapsed() >= std::time::Duration::from_secs(3600) {
            *used = (std::time::Instant::now(), 0);
        }
        if used.1.saturating_add(n) > self.limit {
            return Err(format!(
                "copies into mirrors moved {} bytes this hour; {n} more would pass the limit of {} (--mirror-copy-max-bytes-per-hour)",
                used.1, self.limit
            ));
        }
        used.1 += n;
        Ok(())
    }
}

/// One copy from an origin repository into a mirror repository.
pub(crate) struct Walk<'a> {
    pub(crate) origin: Repo<'a>,
    pub(crate) mirror: Repo<'a>,
    /// Both on one registry: blobs are mounted, not streamed.
    pub(crate) mount_from: Option<String>,
    pub(crate) limits: &'a Limits,
    /// Bytes streamed so far.
    pub(crate) moved: Arc<AtomicU64>,
}

/// A manifest as copied.
pub(crate) struct Copied {
    pub(crate) digest: Digest,
    pub(crate) body: Vec<u8>,
    pub(crate) media_type: String,
}

impl Walk<'_> {
    /// Copies the image `reference` (a tag or a digest) with everything
    /// attached to it; the tag (`reference`'s, else `tag` for a digest), if
    /// any, last.
    pub(crate) async fn image(
        &self,
        reference: &str,
        tag: Option<&str>,
    ) -> Result<Copied, ResolveFailure> {
        let top = self.manifest(reference, 0).await?;
        let mut subjects = vec![top.digest.clone()];
        subjects.extend(children(&top.body)?.into_iter().map(|(d, _)| d));
        for s in &subjects {
            self.attached(s).await?;
        }
        let tag = match Digest::parse(reference) {
            Err(_) => Some(reference),
            Ok(_) => tag,
        };
        if let Some(t) = tag {
            self.mirror
                .put_manifest(t, &top.body, &top.media_type)
                .await?;
        }
        Ok(top)
    }

    /// What is attached to `subject`: cosign's signature and attestation
    /// tags, the referrers tag schema's index, and the referrers API's.
    async fn attached(&self, subject: &Digest) -> Result<(), ResolveFailure> {
        let base = format!("{}-{}", subject.algorithm(), subject.hex());
        for tag in [format!("{base}.sig"), format!("{base}.att"), base] {
            if let Some(m) = self.manifest_if(&tag, 0).await? {
                self.mirror
                    .put_manifest(&tag, &m.body, &m.media_type)
                    .await?;
            }
        }
        if let Some(index) = self.origin.referrers(subject).await? {
            for (d, _) in children(&index)? {
                self.manifest(d.as_str(), 1).await?;
            }
        }
        Ok(())
    }

    /// Copies one manifest by digest (children or blobs first); returns it.
    async fn manifest(&self, reference: &str, depth: u8) -> Result<Copied, ResolveFailure> {
        self.manifest_if(reference, depth)
            .await?
            .ok_or_else(|| ResolveFailure::NotFound {
                detail: format!("the origin {} has no manifest {reference}", self.origin.at),
            })
    }

    /// [`Self::manifest`], or `None` when the origin has no such manifest.
    fn manifest_if<'s>(
        &'s self,
        reference: &'s str,
        depth: u8,
    ) -> BoxFuture<'s, Result<Option<Copied>, ResolveFailure>> {
        Box::pin(async move {
            if depth > MAX_DEPTH {
                return Err(ResolveFailure::BadResponse {
                    detail: format!("indexes nested deeper than {MAX_DEPTH} at {reference}"),
                });
            }
            let Some((body, media_type)) = self.origin.manifest(reference).await? else {
                return Ok(None);
            };
            let digest = Digest::from_sha256(&Sha256::digest(&body).into());
            if let Ok(want) = Digest::parse(reference)
                && want != digest
            {
                return Err(ResolveFailure::BadResponse {
                    detail: format!(
                        "the origin served content hashing to {digest} for manifest {want}"
                    ),
                });
            }
            if !self.mirror.has("manifests", &digest).await? {
                let kids = children(&body)?;
                if kids.is_empty() {
                    try_join_all(
                        blobs(&body)?
                            .into_iter()
                            .map(|(d, size)| self.blob(d, size)),
                    )
                    .await?;
                } else {
                    for (d, _) in &kids {
                        self.manifest_if(d.as_str(), depth + 1)
                            .await?
                            .ok_or_else(|| ResolveFailure::NotFound {
                                detail: format!(
                                    "the origin has no manifest {d}, which {digest} lists"
                                ),
                            })?;
                    }
                }
                self.mirror
                    .put_manifest(digest.as_str(), &body, &media_type)
                    .await?;
            }
            Ok(Some(Copied {
                digest,
                body,
                media_type,
            }))
        })
    }

    /// Copies one blob: skipped when the mirror has it, mounted when both
    /// repositories are on one registry, else streamed.
    async fn blob(&self, digest: Digest, size: Option<u64>) -> Result<(), ResolveFailure> {
        let _slot = self
            .limits
            .transfers
            .acquire()
            .await
            .map_err(|_| ResolveFailure::Config {
                detail: "the copier is shutting down".into(),
            })?;
        if self.mirror.has("blobs", &digest).await? {
            return Ok(());
        }
        let at = match self
            .mirror
            .start_upload(&digest, self.mount_from.as_deref())
            .await?
        {
            Upload::Mounted => return Ok(()),
            Upload::At(at) => at,
        };
        let (res, stated) = self.origin.open_blob(&digest).await?;
        let len = match (stated, size) {
            (Some(a), Some(b)) if a != b => {
                return Err(ResolveFailure::BadResponse {
                    detail: format!(
                        "the origin says blob {digest} has {a} bytes, its manifest {b}"
                    ),
                });
            }
            (Some(n), _) | (None, Some(n)) => n,
            (None, None) => {
                return Err(ResolveFailure::BadResponse {
                    detail: format!("blob {digest} has no stated size"),
                });
            }
        };
        // A copy's bytes and the hour's are bounded before a byte moves.
        let so_far = self.moved.load(std::sync::atomic::Ordering::Relaxed);
        if so_far.saturating_add(len) > self.limits.max_copy_bytes {
            return Err(ResolveFailure::BadResponse {
                detail: format!(
                    "the image is larger than the {} bytes one copy may move (--mirror-copy-max-bytes)",
                    self.limits.max_copy_bytes
                ),
            });
        }
        self.limits
            .per_hour
            .take(len)
            .map_err(|detail| ResolveFailure::BadResponse { detail })?;
        let stream = guarded(
            res,
            digest.clone(),
            len,
            self.limits.bytes.clone(),
            self.limits.cap,
            self.moved.clone(),
        );
        self.mirror
            .finish_upload(at, &digest, len, reqwest::Body::wrap_stream(stream))
            .await
    }
}

/// The descriptors of an index's `manifests` (empty for an image manifest).
fn children(body: &[u8]) -> Result<Vec<(Digest, Option<u64>)>, ResolveFailure> {
    let v = json(body)?;
    descriptors(
        v.get("manifests")
            .and_then(|l| l.as_array())
            .into_iter()
            .flatten(),
    )
}

/// The blobs an image manifest names: its config, layers and (artifact
/// manifests) blobs.
fn blobs(body: &[u8]) -> Result<Vec<(Digest, Option<u64>)>, ResolveFailure> {
    let v = json(body)?;
    let list = |k: &str| v.get(k).and_then(|l| l.as_array()).into_iter().flatten();
    let mut out = descriptors(
        v.get("config")
            .into_iter()
            .chain(list("layers"))
            .chain(list("blobs")),
    )?;
    out.sort_by(|a, b| a.0.as_str().cmp(b.0.as_str()));
    out.dedup_by(|a, b| a.0 == b.0);
    Ok(out)
}

fn json(body: &[u8]) -> Result<serde_json::Value, ResolveFailure> {
    serde_json::from_slice(body).map_err(|e| ResolveFailure::BadResponse {
        detail: format!("a manifest that is not JSON: {e}"),
    })
}

fn descriptors<'v>(
    list: impl Iterator<Item = &'v serde_json::Value>,
) -> Result<Vec<(Digest, Option<u64>)>, ResolveFailure> {
    list.map(|d| {
        let digest = d.get("digest").and_then(|x| x.as_str()).unwrap_or_default();
        let digest = Digest::parse(digest).map_err(|e| ResolveFailure::BadResponse {
            detail: format!("a descriptor's digest {digest:?}: {e}"),
        })?;
        if digest.algorithm() != "sha256" {
            return Err(ResolveFailure::BadResponse {
                detail: format!("{digest}: only sha256 content is copied"),
            });
        }
        Ok((digest, d.get("size").and_then(serde_json::Value::as_u64)))
    })
    .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(c: char) -> String {
        format!("sha256:{}", c.to_string().repeat(64))
    }

    #[test]
    fn an_image_manifest_names_its_config_layers_and_blobs_once_each() {
        let m = serde_json::json!({
            "config": {"digest": d('a'), "size": 2},
            "layers": [{"digest": d('b'), "size": 10}, {"digest": d('a'), "size": 2}],
            "blobs": [{"digest": d('c')}]
        });
        let got = blobs(m.to_string().as_bytes()).unwrap();
        let names: Vec<&str> = got.iter().map(|(x, _)| x.as_str()).collect();
        assert_eq!(names, [d('a'), d('b'), d('c')]);
        assert_eq!(got[1].1, Some(10));
        assert_eq!(got[2].1, None, "a size the manifest does not state");
        assert!(children(m.to_string().as_bytes()).unwrap().is_empty());
    }

    #[test]
    fn what_cannot_be_copied_safely_is_refused() {
        let sha512 =
            serde_json::json!({"layers": [{"digest": format!("sha512:{}", "a".repeat(128))}]});
        assert!(
            blobs(sha512.to_string().as_bytes()).is_err(),
            "only sha256 content"
        );
        let bad = serde_json::json!({"manifests": [{"digest": "sha256:xyz"}]});
        assert!(children(bad.to_string().as_bytes()).is_err());
        assert!(blobs(b"not json").is_err());
    }
}
