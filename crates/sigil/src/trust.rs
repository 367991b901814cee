//! TrustRoot objects loaded into the trusted roots in force.
//!
//! Owns [`TrustObjects`], the binary's `sigil_kube::trustroots::TrustRootSink`:
//! each TrustRoot spec becomes a root in `sigil_verify::roots::TrustRoots`
//! under the object's name — `sigstoreKeys` parsed at once, `remote` and
//! `repository` (written to a private directory and read as `file://`)
//! kept current by a TUF refresher task of their own — and every change
//! rebuilds the verifiers for new requests — and the start of the
//! background CRL fetcher notation's revocation checks read. What a TUF
//! refresh or a CRL checks is sigil-verify's; watching the objects and
//! writing status is sigil-kube's.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine as _;
use sigil_kube::crd::TrustRootSpec;
use sigil_kube::trustroots::{TrustRootSink, TrustRootState};
use sigil_verify::roots::{InForce, Origin, RefreshObserver, Refresher, TrustRoots};
use sigil_verify::tuf::Client;

use crate::reload::Live;

/// One object's loader: its refresh task and the directory a shipped
/// repository was written to (removed with it).
struct Loader {
    task: Option<tokio::task::JoinHandle<()>>,
    _dir: Option<tempfile::TempDir>,
}

impl Drop for Loader {
    fn drop(&mut self) {
        if let Some(t) = self.task.take() {
            t.abort();
        }
    }
}

/// TrustRoot objects, loaded.
pub struct TrustObjects {
    roots: Arc<TrustRoots>,
    live: Arc<Live>,
    http: reqwest::Client,
    interval: Duration,
    loaders: Mutex<HashMap<String, Loader>>,
}

impl std::fmt::Debug for TrustObjects {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TrustObjects").finish_non_exhaustive()
    }
}

fn b64(field: &str, s: &str) -> Result<Vec<u8>, String> {
    base64::engine::general_purpose::STANDARD
        .decode(s.trim())
        .map_err(|e| format!("{field} is not base64: {e}"))
}

/// Writes a shipped repository's files under a new directory; a path that
/// is absolute or climbs out (`..`) is refused, nothing is half-written
/// into a directory another load uses.
fn write_repository(
    files: &std::collections::BTreeMap<String, String>,
) -> Result<tempfile::TempDir, String> {
    let dir = tempfile::Builder::new()
        .prefix("sigil-trustroot-")
        .tempdir()
        .map_err(|e| format!("a directory for the repository: {e}"))?;
    for (path, content) in files {
        let rel = std::path::Path::new(path);
        let safe = !path.is_empty()
            && rel
                .components()
                .all(|c| matches!(c, std::path::Component::Normal(_)));
        if !safe {
            return Err(format!(
                "repository.files: {path:?} is not a relative path inside the repository"
            ));
        }
        let bytes = b64(&format!("repository.files[{path:?}]"), content)?;
        let target = dir.path().join(rel);
        if let Some(parent) = target.parent() {
            std::fs::create_dir_all(parent).map_err(|e| format!("{path}: {e}"))?;
        }
        std::fs::write(&target, bytes).map_err(|e| format!("{path}: {e}"))?;
    }
    Ok(dir)
}

impl TrustObjects {
    /// Loads TrustRoots into `roots`, refreshing TUF sources every
    /// `interval`, rebuilding `live`'s verifiers on every change.
    pub fn new(
        roots: Arc<TrustRoots>,
        live: Arc<Live>,
        http: reqwest::Client,
        interval: Duration,
    ) -> TrustObjects {
        TrustObjects {
            roots,
            live,
            http,
            interval,
            loaders: Mutex::default(),
        }
    }

    /// Starts the refresher for a TUF source (an error when the source
    /// itself is unusable: a bad URL).
    fn tuf(
        &self,
        name: &str,
        mirror: &str,
        root: &[u8],
    ) -> Result<tokio::task::JoinHandle<()>, String> {
        let client = Client::new(mirror, root.to_vec(), self.http.clone(), None)
            .map_err(|e| e.to_string())?;
        let refresher = Refresher::new(name, client, self.roots.clone());
        let observer: Arc<dyn RefreshObserver> = self.live.metrics.clone();
        let (live, interval, name) = (self.live.clone(), self.interval, name.to_owned());
        Ok(tokio::spawn(async move {
            refresher
                .run(interval, observer, move || live.rebuild(&name))
                .await;
        }))
    }

    fn load(&self, name: &str, spec: &TrustRootSpec) -> Result<Loader, String> {
        match (&spec.remote, &spec.repository, &spec.sigstore_keys) {
            (Some(r), None, None) => {
                let root = b64("remote.root", &r.root)?;
                Ok(Loader {
                    task: Some(self.tuf(name, &r.mirror, &root)?),
                    _dir: None,
                })
            }
            (None, Some(r), None) => {
                let root = b64("repository.root", &r.root)?;
                let dir = write_repository(&r.files)?;
                let url = format!("file://{}/", dir.path().display());
                Ok(Loader {
                    task: Some(self.tuf(name, &url, &root)?),
                    _dir: Some(dir),
                })
            }
            (None, None, Some(keys)) => {
                let root = InForce::from_json(&keys.to_string(), Origin::Inline)
                    .map_err(|e| format!("sigstoreKeys: {e}"))?;
                self.roots.set(name, root);
                self.live.rebuild(name);
                Ok(Loader {
                    task: None,
                    _dir: None,
                })
            }
            _ => Err("give exactly one of remote, repository or sigstoreKeys".into()),
        }
    }
}

/// Loads one TrustRoot spec once, as the server would, without keeping it
/// current (`sigil trust-root show NAME`): an inline root as written; a
/// remote or shipped repository through one TUF refresh.
pub async fn load_once(
    name: &str,
    spec: &TrustRootSpec,
    http: reqwest::Client,
) -> Result<Arc<InForce>, String> {
    let (mirror, root, _dir) = match (&spec.remote, &spec.repository, &spec.sigstore_keys) {
        (Some(r), None, None) => (r.mirror.clone(), b64("remote.root", &r.root)?, None),
        (None, Some(r), None) => {
            let dir = write_repository(&r.files)?;
            let url = format!("file://{}/", dir.path().display());
            (url, b64("repository.root", &r.root)?, Some(dir))
        }
        (None, None, Some(keys)) => {
            return InForce::from_json(&keys.to_string(), Origin::Inline)
                .map(Arc::new)
                .map_err(|e| format!("sigstoreKeys: {e}"));
        }
        _ => return Err("give exactly one of remote, repository or sigstoreKeys".into()),
    };
    let roots = Arc::new(TrustRoots::embedded());
    let client = Client::new(&mirror, root, http, None).map_err(|e| e.to_string())?;
    let (_, result) = Refresher::new(name, client, roots.clone())
        .refresh_once()
        .await;
    result.map_err(|e| e.to_string())?;
    roots
        .get(name)
        .ok_or_else(|| format!("{name}: refreshed but not in force"))
}

impl TrustRootSink for TrustObjects {
    fn apply(&self, name: &str, spec: &TrustRootSpec) {
        let mut loaders = self.loaders.lock().unwrap_or_else(|e| e.into_inner());
        // The old source stops first: its root leaves with it.
        loaders.remove(name);
        self.roots.remove(name);
        match self.load(name, spec) {
            Ok(l) => {
                loaders.insert(name.to_owned(), l);
            }
            Err(why) => {
                tracing::warn!(trust_root = %name, error = %why, "TrustRoot refused");
                self.roots.set_unavailable(name, &why);
                self.live.rebuild(name);
            }
        }
    }

    fn remove(&self, name: &str) {
        self.loaders
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(name);
        self.roots.remove(name);
        self.live.rebuild(name);
    }

    fn state(&self, name: &str) -> Option<TrustRootState> {
        if let Some(r) = self.roots.get(name) {
            let (source, root_version, expires, reason) = match &r.origin {
                Origin::Tuf {
                    mirror,
                    root_version,
                    expires,
                    ..
                } => (
                    format!("tuf {mirror}"),
                    Some(*root_version),
                    Some(*expires),
                    if r.error.is_some() {
                        "RefreshFailed"
                    } else {
                        "Refreshed"
                    },
                ),
                Origin::Inline => ("inline".to_owned(), None, None, "Loaded"),
                Origin::Embedded => ("embedded".to_owned(), None, None, "Loaded"),
            };
            let root = &r.root;
            let mut message = format!(
                "{} log(s), {} CA(s), {} timestamp authority(ies), {} CT log(s) in force",
                root.logs.len(),
                root.authorities.len(),
                root.timestamp_authorities.len(),
                root.ctlogs.len()
            );
            if let Some(e) = &r.error {
                message.push_str(&format!("; the last refresh failed ({e}), this root stays"));
            }
            return Some(TrustRootState {
                ready: true,
                reason: reason.into(),
                message,
                source: Some(source),
                root_version,
                expires,
                last_refresh: r.refreshed,
                error: r.error.clone(),
            });
        }
        self.roots.unavailable(name).map(|why| TrustRootState {
            ready: false,
            reason: "NotLoaded".into(),
            message: why.clone(),
            error: Some(why),
            ..TrustRootState::default()
        })
    }
}

/// How often the CRL fetcher looks for CRLs due (a new distribution point
/// wakes it at once).
const CRL_TICK: std::time::Duration = std::time::Duration::from_secs(60);

/// Starts keeping notation's CRLs current in the background (`sigil
/// serve`): from then on no verification fetches a CRL itself.
pub fn start_revocation(trust: &TrustRoots, metrics: Arc<crate::metrics::Metrics>) {
    let crls = trust.revocation();
    crls.observe(metrics);
    crls.start(CRL_TICK);
}
