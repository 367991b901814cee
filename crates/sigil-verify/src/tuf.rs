//! Keeping a Sigstore trusted root current from a TUF repository (what
//! Sigstore's public-good instance publishes at
//! `https://tuf-repo-cdn.sigstore.dev`, or a mirror of it, or a private
//! instance's).
//!
//! Owns one repository's client: the TUF update workflow itself is
//! `tough`'s (awslabs; root rotation with signature thresholds, versions
//! that never go back, expiry, snapshot and target hashes and lengths,
//! consistent snapshots), run over sigil's own transport (loopback-testable
//! HTTP with a size cap, or `file://` for an air-gapped copy). Between
//! refreshes it keeps the newest root it verified (the next update starts
//! from it, not from the bootstrap) and the metadata it last saw (so a
//! rollback is refused). It does not decide when to refresh or what is in
//! force: that is [`crate::roots`].

use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

use tough::{
    FilesystemTransport, IntoVec, RepositoryLoader, TargetName, Transport, TransportError,
    TransportErrorKind, TransportStream,
};
use url::Url;

use crate::VerifyError;
use crate::trust::TrustedRoot;

/// The public-good instance's TUF repository.
pub const PUBLIC_GOOD_MIRROR: &str = "https://tuf-repo-cdn.sigstore.dev/";

/// Version 15 of the public-good repository's `root.json`, the bootstrap.
pub const PUBLIC_GOOD_TUF_ROOT: &[u8] = include_bytes!("../trust/public-good-tuf-root.json");

/// GitHub's TUF repository, which publishes the `github` trusted root.
pub const GITHUB_MIRROR: &str = "https://tuf-repo.github.com/";

/// Version 3 of its `root.json`, as GitHub's CLI embeds it
/// (`trust/README.md`): the bootstrap of its refresh.
pub const GITHUB_TUF_ROOT: &[u8] = include_bytes!("../trust/github-tuf-root.json");

/// The target a Sigstore TUF repository publishes its trusted root as.
pub const TRUSTED_ROOT_TARGET: &str = "trusted_root.json";

/// Largest file fetched (metadata or target): Sigstore's are tens of KiB.
const MAX_FILE: usize = 8 << 20;

/// What one successful refresh verified.
#[derive(Debug, Clone)]
pub struct Fetched {
    /// The `trusted_root.json` target, as published.
    pub json: String,
    /// The root metadata version the repository is at.
    pub root_version: u64,
    /// The timestamp metadata version (rises with every publication).
    pub timestamp_version: u64,
    /// When the first of root, timestamp, snapshot and targets metadata
    /// expires (Unix seconds): the last moment this answer is fresh.
    pub expires: i64,
}

/// A TUF client for one repository.
#[derive(Debug)]
pub struct Client {
    metadata: Url,
    targets: Url,
    transport: HttpOrFile,
    /// The newest `root.json` verified so far (first the bootstrap).
    root: Mutex<Vec<u8>>,
    datastore: Datastore,
}

#[derive(Debug)]
enum Datastore {
    Temp(tempfile::TempDir),
    Dir(PathBuf),
}

impl Datastore {
    fn path(&self) -> &std::path::Path {
        match self {
            Datastore::Temp(t) => t.path(),
            Datastore::Dir(p) => p,
        }
    }
}

/// Checks a `root.json` as a TUF client's starting point: it parses as
/// root metadata and meets its own root-role threshold. Returns its version.
/// (Expiry does not matter here: the client walks to newer roots.)
pub fn bootstrap_version(root: &[u8]) -> Result<u64, VerifyError> {
    let signed: tough::schema::Signed<tough::schema::Root> =
        serde_json::from_slice(root).map_err(|e| VerifyError::Tuf(format!("root.json: {e}")))?;
    signed.signed.verify_role(&signed).map_err(|e| {
        VerifyError::Tuf(format!(
            "root.json does not verify itself: {}",
            crate::error_chain(&e)
        ))
    })?;
    Ok(signed.signed.version.get())
}

/// `mirror` with a trailing slash, parsed.
fn base(mirror: &str) -> Result<Url, VerifyError> {
    let with_slash = if mirror.ends_with('/') {
        mirror.to_owned()
    } else {
        format!("{mirror}/")
    };
    let url = Url::parse(&with_slash).map_err(|e| VerifyError::Tuf(format!("{mirror:?}: {e}")))?;
    match url.scheme() {
        "https" | "http" | "file" => Ok(url),
        s => Err(VerifyError::Tuf(format!(
            "{mirror:?}: the scheme {s:?} is not one of https, http, file"
        ))),
    }
}

impl Client {
    /// A client for the repository at `mirror` (metadata at its root,
    /// targets under `targets/`), trusting `bootstrap_root` first. The
    /// metadata it keeps between refreshes lives in `datastore` (a
    /// directory that must exist; one a restart keeps makes rollback
    /// protection survive it) or, without one, in a temporary directory.
    pub fn new(
        mirror: &str,
        bootstrap_root: Vec<u8>,
        http: reqwest::Client,
        datastore: Option<PathBuf>,
    ) -> Result<Client, VerifyError> {
        bootstrap_version(&bootstrap_root)?;
        let metadata = base(mirror)?;
        let targets = metadata
            .join("targets/")
            .map_err(|e| VerifyError::Tuf(e.to_string()))?;
        let datastore = match datastore {
            Some(d) => Datastore::Dir(d),
            None => Datastore::Temp(
                tempfile::Builder::new()
                    .prefix("sigil-tuf-")
                    .tempdir()
                    .map_err(|e| VerifyError::Tuf(format!("a datastore directory: {e}")))?,
            ),
        };
        // The newest root a previous run verified, if the datastore kept one.
        let kept = std::fs::read(datastore.path().join("root.json")).ok();
        Ok(Client {
            metadata,
            targets,
            transport: HttpOrFile { http },
            root: Mutex::new(kept.unwrap_or(bootstrap_root)),
            datastore,
        })
    }

    /// The repository's metadata URL.
    pub fn mirror(&self) -> &str {
        self.metadata.as_str()
    }

    /// Runs the TUF update workflow and reads the trusted root target.
    /// Any failure leaves what was verified before untouched.
    pub async fn refresh(&self) -> Result<Fetched, VerifyError> {
        let root = self.root.lock().map(|r| r.clone()).unwrap_or_default();
        let tuf = |e: tough::error::Error| VerifyError::Tuf(crate::error_chain(&e));
        let repo = RepositoryLoader::new(&root, self.metadata.clone(), self.targets.clone())
            .transport(self.transport.clone())
            .datastore(self.datastore.path())
            .load()
            .await
            .map_err(tuf)?;
        let name = TargetName::new(TRUSTED_ROOT_TARGET).map_err(tuf)?;
        let Some(stream) = repo.read_target(&name).await.map_err(tuf)? else {
            return Err(VerifyError::Tuf(format!(
                "the repository lists no {TRUSTED_ROOT_TARGET} target"
            )));
        };
        let bytes = stream.into_vec().await.map_err(tuf)?;
        let json = String::from_utf8(bytes)
            .map_err(|_| VerifyError::Tuf(format!("{TRUSTED_ROOT_TARGET} is not UTF-8")))?;
        // A target that verifies but does not parse is refused too.
        TrustedRoot::from_json(&json)?;
        if let Ok(newest) = std::fs::read(self.datastore.path().join("root.json"))
            && let Ok(mut r) = self.root.lock()
        {
            *r = newest;
        }
        let expires = [
            repo.root().signed.expires,
            repo.timestamp().signed.expires,
            repo.snapshot().signed.expires,
            repo.targets().signed.expires,
        ]
        .into_iter()
        .min()
        .map_or(0, |t| t.as_second());
        Ok(Fetched {
            json,
            root_version: repo.root().signed.version.get(),
            timestamp_version: repo.timestamp().signed.version.get(),
            expires,
        })
    }
}

/// `file://` through tough's own transport; `http(s)://` through sigil's
/// client, with every file capped at [`MAX_FILE`].
#[derive(Debug, Clone)]
struct HttpOrFile {
    http: reqwest::Client,
}

#[tough::async_trait]
impl Transport for HttpOrFile {
    async fn fetch(&self, url: Url) -> Result<TransportStream, TransportError> {
        match url.scheme() {
            "file" => FilesystemTransport.fetch(url).await,
            "http" | "https" => {
                let other = |e: String| {
                    TransportError::new_with_cause(
                        TransportErrorKind::Other,
                        url.clone(),
                        std::io::Error::other(e),
                    )
                };
                let resp = self
                    .http
                    .get(url.clone())
                    .timeout(Duration::from_secs(60))
                    .send()
                    .await
                    .map_err(|e| other(crate::error_chain(&e)))?;
                let status = resp.status();
                // Object stores answer a missing file with 403 as often as 404.
                if status == reqwest::StatusCode::NOT_FOUND
                    || status == reqwest::StatusCode::FORBIDDEN
                {
                    return Err(TransportError::new(
                        TransportErrorKind::FileNotFound,
                        url.clone(),
                    ));
                }
                if !status.is_success() {
                    return Err(other(format!("HTTP {status}")));
                }
                let body = crate::read_capped(resp, MAX_FILE)
                    .await
                    .map_err(|e| other(e.to_string()))?;
                Ok(Box::pin(futures_util::stream::iter([Ok(
                    tough::Bytes::from(body),
                )])))
            }
            _ => Err(TransportError::new(
                TransportErrorKind::UnsupportedUrlScheme,
                url,
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tough::schema::{Root, Signed};

    /// The embedded bootstrap is the real public-good `root.json`: it
    /// parses as TUF root metadata and meets its own threshold (3 of 5).
    #[test]
    fn the_embedded_bootstrap_root_verifies_itself() {
        let root: Signed<Root> = serde_json::from_slice(PUBLIC_GOOD_TUF_ROOT).unwrap();
        assert_eq!(root.signed.version.get(), 15);
        root.signed.verify_role(&root).unwrap();
        assert_eq!(bootstrap_version(PUBLIC_GOOD_TUF_ROOT).unwrap(), 15);
    }

    /// A bootstrap that is not root metadata, or whose signatures do not
    /// meet its threshold, is refused when the client is made (a bad
    /// `--tuf-root` fails at start, not at the first refresh).
    #[test]
    fn a_bootstrap_root_that_does_not_verify_itself_is_refused() {
        let mut doc: serde_json::Value = serde_json::from_slice(PUBLIC_GOOD_TUF_ROOT).unwrap();
        doc["signatures"].as_array_mut().unwrap().truncate(2);
        let err = bootstrap_version(doc.to_string().as_bytes()).unwrap_err();
        assert!(err.to_string().contains("does not verify itself"), "{err}");
        let err =
            Client::new("https://x/", b"{}".to_vec(), reqwest::Client::new(), None).unwrap_err();
        assert!(err.to_string().contains("root.json"), "{err}");
    }

    #[test]
    fn mirrors_get_a_trailing_slash_and_targets_beneath() {
        let c = Client::new(
            "https://tuf.example/repo",
            PUBLIC_GOOD_TUF_ROOT.to_vec(),
            reqwest::Client::new(),
            None,
        )
        .unwrap();
        assert_eq!(c.mirror(), "https://tuf.example/repo/");
        assert_eq!(c.targets.as_str(), "https://tuf.example/repo/targets/");
    }
}
