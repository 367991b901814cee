//! Signatures at each platform of an index, for rules whose
//! `signatures.signedAt` reads platforms: the index is fetched from where
//! the image lives, its runnable manifests listed
//! ([`sigil_core::verify::platforms::platform_manifests`], at most
//! [`sigil_core::MAX_PLATFORMS`]), and each one's signatures gathered and
//! checked with the rule's verifiers, a few at a time, under the same
//! deadline. What they satisfy together is sigil-core's arithmetic; this
//! module only fetches and checks. Attestations are not read here: they
//! are checked on the digest pinned.

use std::time::Instant;

use futures_util::StreamExt;
use sigil_core::verify::platforms::{PlatformManifest, PlatformReport, platform_manifests};
use sigil_core::{ArtifactSource, Digest, PullCredentials, Reference, ResolveFailure};

use crate::Loaded;
use crate::gather::{self, Wanted};

/// Platform manifests whose signatures are fetched at once: each is two
/// or three registry round trips, and an index is the publisher's input.
const CONCURRENCY: usize = 4;

/// Where a digest's signatures are read and where the image itself is.
#[derive(Clone, Copy)]
pub(crate) struct Places<'a> {
    /// The signature repository and its credentials.
    pub(crate) signatures: (&'a Reference, &'a PullCredentials),
    /// The image's repository and its credentials (the index is read there).
    pub(crate) image: (&'a Reference, &'a PullCredentials),
}

/// What each platform manifest of `digest`'s index satisfied: `Ok(None)`
/// when `digest` is not an index (the digest is its own only place), `Err`
/// when the index could not be read.
pub(crate) async fn check<S: ArtifactSource>(
    source: &S,
    at: Places<'_>,
    digest: &Digest,
    verification: &sigil_core::Verification,
    loaded: &[Loaded],
    deadline: Instant,
) -> Result<Option<Vec<PlatformReport>>, ResolveFailure> {
    let (image, image_creds) = at.image;
    let body = source
        .manifest(image, digest.as_str(), image_creds, deadline)
        .await?
        .ok_or_else(|| ResolveFailure::NotFound {
            detail: format!("{} is not in {image}", digest.as_str()),
        })?;
    let Some(manifests) =
        platform_manifests(&body).map_err(|detail| ResolveFailure::BadResponse { detail })?
    else {
        return Ok(None);
    };
    let (repo, creds) = at.signatures;
    let reports = futures_util::stream::iter(manifests)
        .map(|m: PlatformManifest| async move {
            match gather::gather(source, repo, &m.digest, creds, Wanted::SIGNATURES, deadline).await
            {
                Ok(a) => {
                    let r = crate::evaluate(
                        verification,
                        loaded,
                        &a,
                        m.digest.as_str(),
                        crate::unix_now(),
                    );
                    PlatformReport {
                        manifest: m,
                        results: r.results,
                        fetch_failure: None,
                        found: r.found,
                    }
                }
                Err(f) => PlatformReport {
                    manifest: m,
                    results: Vec::new(),
                    fetch_failure: Some(f),
                    found: Vec::new(),
                },
            }
        })
        .buffered(CONCURRENCY)
        .collect()
        .await;
    Ok(Some(reports))
}
