//! Keeping a Sigstore trusted root current from a TUF repository (what
//! Sigstore's public-good instance publishes at
//! `https://tuf-repo-cdn.sigstore.dev`, GitHub's at
//! `https://tuf-repo.github.com`, a mirror of either, or a private
//! instance's).
//!
//! Owns one repository's client: sigil's own implementation of the TUF
//! specification's client workflow ([`update`]: root rotation with the old
//! and new thresholds, timestamp → snapshot → targets with version, length
//! and hash checks, expiry at a fixed start time, rollback protection,
//! consistent snapshots, delegations) over metadata read as the
//! specification and python-tuf read it ([`meta`]: key IDs as listed,
//! never recomputed — GitHub's root lists IDs computed without its custom
//! key fields), fetched over sigil's HTTP client with a size cap per file,
//! or from `file://` for an air-gapped copy. Between refreshes it keeps the
//! newest root and the trusted timestamp, snapshot and targets metadata in
//! its datastore directory (the next update starts from them, so a
//! rollback is refused across restarts too). It does not decide when to
//! refresh or what is in force: that is [`crate::roots`].

mod meta;
mod update;

use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

use url::Url;

use crate::VerifyError;
use crate::trust::TrustedRoot;
use meta::{Role, Root};

/// Why a TUF update refused what the repository served. Each attack the
/// specification names is refused as one of these.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TufError {
    /// Metadata that is not what the specification defines.
    #[error("malformed {0}")]
    Malformed(String),
    /// Too few valid signatures: arbitrary metadata, or keys compromised
    /// below the threshold.
    #[error(
        "{role} metadata has {valid} valid signature(s) from its role's keys; {threshold} are required"
    )]
    Threshold {
        /// The role.
        role: String,
        /// Valid signatures from distinct keys of the role.
        valid: usize,
        /// The role's threshold.
        threshold: usize,
    },
    /// A version going back (a rollback attack).
    #[error("rollback refused: {0}")]
    Rollback(String),
    /// Expired metadata (a freeze attack, or an unmaintained repository).
    #[error("{role} metadata expired at Unix {expires} (freeze refused)")]
    Expired {
        /// The role.
        role: String,
        /// When it expired.
        expires: i64,
    },
    /// Metadata of another version than the metadata naming it says
    /// (mix-and-match).
    #[error(
        "{file} is version {got}, but the metadata naming it says {want} (mix-and-match refused)"
    )]
    Version {
        /// The file.
        file: String,
        /// The version named.
        want: u64,
        /// The version found.
        got: u64,
    },
    /// A file of another length than its metadata says.
    #[error("{file} is {got} bytes, its metadata says {want}")]
    Length {
        /// The file.
        file: String,
        /// The length named.
        want: u64,
        /// The length found.
        got: u64,
    },
    /// A file whose hash is not the one its metadata names.
    #[error("{0} does not have the hash its metadata names")]
    Hash(String),
    /// More bytes than a file may have (endless data).
    #[error("{file} is larger than {max} bytes (endless data refused)")]
    TooLarge {
        /// The URL.
        file: String,
        /// The cap.
        max: u64,
    },
    /// The repository could not be read.
    #[error("{0}")]
    Fetch(String),
    /// The datastore could not be written.
    #[error("the TUF datastore: {0}")]
    Store(String),
    /// No targets role lists the target.
    #[error("the repository lists no {0} target")]
    NoTarget(String),
}

impl From<TufError> for VerifyError {
    fn from(e: TufError) -> Self {
        VerifyError::Tuf(e.to_string())
    }
}

/// The public-good instance's TUF repository.
pub const PUBLIC_GOOD_MIRROR: &str = "https://tuf-repo-cdn.sigstore.dev/";

/// Version 15 of the public-good repository's `root.json`, the bootstrap.
pub const PUBLIC_GOOD_TUF_ROOT: &[u8] = include_bytes!("../../trust/public-good-tuf-root.json");

/// GitHub's TUF repository, which publishes the `github` trusted root.
pub const GITHUB_MIRROR: &str = "https://tuf-repo.github.com/";

/// Version 3 of its `root.json`, as GitHub's CLI embeds it
/// (`trust/README.md`): the bootstrap of its refresh.
pub const GITHUB_TUF_ROOT: &[u8] = include_bytes!("../../trust/github-tuf-root.json");

/// The target a Sigstore TUF repository publishes its trusted root as.
pub const TRUSTED_ROOT_TARGET: &str = "trusted_root.json";

/// Largest target fetched, whatever its metadata says.
const MAX_FILE: u64 = 8 << 20;

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
    transport: Transport,
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
/// root metadata and meets its own root-role threshold, with the key IDs
/// it lists. Returns its version. (Expiry does not matter here: the client
/// walks to newer roots.)
pub fn bootstrap_version(root: &[u8]) -> Result<u64, VerifyError> {
    let r = Root::parse(root).map_err(|e| VerifyError::Tuf(format!("root.json: {e}")))?;
    r.verify(&r.meta, Role::Root)
        .map_err(|e| VerifyError::Tuf(format!("root.json does not verify itself: {e}")))?;
    Ok(r.meta.version)
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
        let bootstrap = bootstrap_version(&bootstrap_root)?;
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
        // The newest root a previous run verified, if the datastore kept
        // one no older than the bootstrap that still meets its own
        // threshold (anything else there is not trusted).
        let kept = std::fs::read(datastore.path().join("root.json"))
            .ok()
            .filter(|r| bootstrap_version(r).is_ok_and(|v| v >= bootstrap));
        Ok(Client {
            metadata,
            targets,
            transport: Transport { http },
            root: Mutex::new(kept.unwrap_or(bootstrap_root)),
            datastore,
        })
    }

    /// The repository's metadata URL.
    pub fn mirror(&self) -> &str {
        self.metadata.as_str()
    }

    /// Runs the TUF update workflow and reads the trusted root target.
    /// Any failure leaves what was verified before in force.
    pub async fn refresh(&self) -> Result<Fetched, VerifyError> {
        let root = self.root.lock().map(|r| r.clone()).unwrap_or_default();
        let update = update::Update {
            metadata: &self.metadata,
            targets: &self.targets,
            transport: &self.transport,
            store: self.datastore.path(),
            now: time::OffsetDateTime::now_utc().unix_timestamp(),
        };
        let out = update.run(&root, TRUSTED_ROOT_TARGET).await?;
        let json = String::from_utf8(out.target)
            .map_err(|_| VerifyError::Tuf(format!("{TRUSTED_ROOT_TARGET} is not UTF-8")))?;
        // A target that verifies but does not parse is refused too.
        TrustedRoot::from_json(&json)?;
        if let Ok(mut r) = self.root.lock() {
            *r = out.root;
        }
        let fetched = Fetched {
            json,
            root_version: out.root_version,
            timestamp_version: out.timestamp_version,
            expires: out.expires,
        };
        // What `sigil trust-root show --tuf-cache-dir` reads back.
        let record = serde_json::json!({
            "mirror": self.mirror(),
            "refreshed": time::OffsetDateTime::now_utc().unix_timestamp(),
            "root_version": fetched.root_version,
            "timestamp_version": fetched.timestamp_version,
            "expires": fetched.expires,
        });
        let dir = self.datastore.path();
        std::fs::write(dir.join(TRUSTED_ROOT_TARGET), &fetched.json)
            .and_then(|()| std::fs::write(dir.join(LAST_REFRESH), record.to_string()))
            .map_err(|e| VerifyError::Tuf(format!("the TUF datastore: {e}")))?;
        Ok(fetched)
    }
}

/// A TUF repository as a general client sees it: trusted metadata in a
/// directory (`root.json` first, then what each refresh verified, each role
/// under its own name), any target fetched by its path. sigil itself uses
/// [`Client`], for one target; this serves the TUF conformance suite's
/// client protocol (`examples/tuf_conformance.rs`), so the workflow sigil
/// runs is the one the suite judges.
#[derive(Debug)]
pub struct Repository {
    metadata: Url,
    targets: Url,
    transport: Transport,
    dir: PathBuf,
}

impl Repository {
    /// The repository whose metadata is at `metadata` and targets at
    /// `targets`, trusted as `dir` says.
    pub fn new(
        metadata: &str,
        targets: &str,
        http: reqwest::Client,
        dir: PathBuf,
    ) -> Result<Repository, VerifyError> {
        Ok(Repository {
            metadata: base(metadata)?,
            targets: base(targets)?,
            transport: Transport { http },
            dir,
        })
    }

    fn update(&self) -> update::Update<'_> {
        update::Update {
            metadata: &self.metadata,
            targets: &self.targets,
            transport: &self.transport,
            store: &self.dir,
            now: time::OffsetDateTime::now_utc().unix_timestamp(),
        }
    }

    async fn top(&self) -> Result<update::Top, TufError> {
        let root = std::fs::read(self.dir.join("root.json"))
            .map_err(|e| TufError::Store(format!("root.json: {e}")))?;
        self.update().refresh(&root).await
    }

    /// Updates the top-level metadata.
    pub async fn refresh(&self) -> Result<(), TufError> {
        self.top().await.map(|_| ())
    }

    /// Updates the metadata, then fetches and checks each target of
    /// `paths` in order, stopping at the first that fails. What `cached`
    /// holds for a path is used instead of a download when it has the
    /// length and hashes the metadata gives.
    pub async fn targets(
        &self,
        paths: &[String],
        cached: impl Fn(&str) -> Option<Vec<u8>>,
    ) -> Result<Vec<Vec<u8>>, TufError> {
        let top = self.top().await?;
        let update = self.update();
        let mut out = Vec::with_capacity(paths.len());
        for p in paths {
            out.push(update.target(&top, p, cached(p)).await?);
        }
        Ok(out)
    }
}

/// The record of the last successful refresh a datastore keeps.
const LAST_REFRESH: &str = "last-refresh.json";

/// What a datastore says of its last successful refresh: what it
/// verified, from which mirror, and when (Unix seconds).
pub fn last_refresh(datastore: &std::path::Path) -> Option<(Fetched, String, i64)> {
    let record: serde_json::Value =
        serde_json::from_slice(&std::fs::read(datastore.join(LAST_REFRESH)).ok()?).ok()?;
    let json = std::fs::read_to_string(datastore.join(TRUSTED_ROOT_TARGET)).ok()?;
    let int = |k: &str| record.get(k).and_then(serde_json::Value::as_i64);
    let fetched = Fetched {
        json,
        root_version: u64::try_from(int("root_version")?).ok()?,
        timestamp_version: u64::try_from(int("timestamp_version")?).ok()?,
        expires: int("expires")?,
    };
    let mirror = record.get("mirror")?.as_str()?.to_owned();
    Some((fetched, mirror, int("refreshed")?))
}

/// `file://` from the filesystem; `http(s)://` through sigil's client.
/// Every file is capped; a missing one (404, or 403 as object stores
/// answer) is `None`.
#[derive(Debug, Clone)]
pub(crate) struct Transport {
    http: reqwest::Client,
}

impl Transport {
    async fn get(&self, url: &Url, max: u64) -> Result<Option<Vec<u8>>, TufError> {
        let max = max.min(MAX_FILE);
        let too_large = || TufError::TooLarge {
            file: url.to_string(),
            max,
        };
        match url.scheme() {
            "file" => {
                let path = url
                    .to_file_path()
                    .map_err(|()| TufError::Fetch(format!("{url}: not a file path")))?;
                let file = match std::fs::File::open(&path) {
                    Ok(f) => f,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
                    Err(e) => return Err(TufError::Fetch(format!("{url}: {e}"))),
                };
                let mut body = Vec::new();
                use std::io::Read as _;
                file.take(max + 1)
                    .read_to_end(&mut body)
                    .map_err(|e| TufError::Fetch(format!("{url}: {e}")))?;
                if body.len() as u64 > max {
                    return Err(too_large());
                }
                Ok(Some(body))
            }
            "http" | "https" => {
                let resp = self
                    .http
                    .get(url.clone())
                    .timeout(Duration::from_secs(60))
                    .send()
                    .await
                    .map_err(|e| TufError::Fetch(format!("{url}: {}", crate::error_chain(&e))))?;
                let status = resp.status();
                if status == reqwest::StatusCode::NOT_FOUND
                    || status == reqwest::StatusCode::FORBIDDEN
                {
                    return Ok(None);
                }
                if !status.is_success() {
                    return Err(TufError::Fetch(format!("{url}: HTTP {status}")));
                }
                match crate::read_capped(resp, usize::try_from(max).unwrap_or(usize::MAX)).await {
                    Ok(b) => Ok(Some(b)),
                    Err(crate::FetchError::TooLarge(_)) => Err(too_large()),
                    Err(e) => Err(TufError::Fetch(format!("{url}: {e}"))),
                }
            }
            s => Err(TufError::Fetch(format!(
                "{url}: the scheme {s:?} is not supported"
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The embedded bootstraps are the real `root.json`s: each parses as
    /// TUF root metadata and meets its own threshold with the key IDs it
    /// lists (public-good 3 of 5; GitHub's 3 of 8, whose IDs a client that
    /// recomputes them over the whole key object refuses).
    #[test]
    fn the_embedded_bootstrap_roots_verify_themselves() {
        assert_eq!(bootstrap_version(PUBLIC_GOOD_TUF_ROOT).unwrap(), 15);
        assert_eq!(bootstrap_version(GITHUB_TUF_ROOT).unwrap(), 3);
    }

    /// A bootstrap that is not root metadata, or whose signatures do not
    /// meet its threshold, is refused when the client is made (a bad
    /// `--tuf-root` fails at start, not at the first refresh).
    #[test]
    fn a_bootstrap_root_that_does_not_verify_itself_is_refused() {
        for bootstrap in [PUBLIC_GOOD_TUF_ROOT, GITHUB_TUF_ROOT] {
            let mut doc: serde_json::Value = serde_json::from_slice(bootstrap).unwrap();
            doc["signatures"].as_array_mut().unwrap().truncate(2);
            let err = bootstrap_version(doc.to_string().as_bytes()).unwrap_err();
            assert!(err.to_string().contains("does not verify itself"), "{err}");
        }
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
