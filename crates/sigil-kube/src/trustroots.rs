//! TrustRoot objects (`sigil serve --watch-policies`): cluster-scoped
//! Sigstore trusted roots that verifiers name (`trustRoot: corp`).
//!
//! Owns keeping TrustRoots in memory (a kube-runtime reflector), handing
//! each new or changed spec to the binary's [`TrustRootSink`] (which loads
//! it: a TUF refresher, a shipped repository, or an inline root) and taking
//! back deletions, and writing each object's `status` from what the sink
//! says is in force — one replica at a time, under the policy-status Lease.
//! It does not verify or fetch anything itself, and never decides.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kube::api::{Api, Patch, PatchParams};
use kube::runtime::reflector::{self, Store};
use kube::{Client, ResourceExt as _};
use serde_json::json;

use crate::crd::{Condition, TrustRoot, TrustRootSpec, TrustRootStatus};

/// What is in force for one TrustRoot, as the sink reports it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TrustRootState {
    /// A root is in force.
    pub ready: bool,
    /// `Refreshed`, `Loaded`, `RefreshFailed`, `Invalid`.
    pub reason: String,
    /// What is in force, or why nothing is.
    pub message: String,
    /// `tuf <mirror>` or `inline`.
    pub source: Option<String>,
    /// TUF root metadata version.
    pub root_version: Option<u64>,
    /// TUF metadata expiry (Unix seconds).
    pub expires: Option<i64>,
    /// Last successful refresh (Unix seconds).
    pub last_refresh: Option<i64>,
    /// The last refresh's failure.
    pub error: Option<String>,
}

/// Loads TrustRoot specs (implemented by the binary, which owns TUF).
pub trait TrustRootSink: Send + Sync {
    /// `name` is new or its spec changed: load it (replacing what it was).
    fn apply(&self, name: &str, spec: &TrustRootSpec);
    /// `name` was deleted.
    fn remove(&self, name: &str);
    /// What is in force for `name`; `None` until its first load finished.
    fn state(&self, name: &str) -> Option<TrustRootState>;
}

/// The TrustRoot watch.
pub struct TrustRoots {
    store: Store<TrustRoot>,
    sink: Arc<dyn TrustRootSink>,
    /// Spec (as JSON) last handed to the sink, by name.
    applied: Mutex<HashMap<String, String>>,
}

impl std::fmt::Debug for TrustRoots {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TrustRoots").finish_non_exhaustive()
    }
}

/// How long readiness waits for the first load of every listed TrustRoot
/// (an unreachable mirror must not keep a replica out of service: its
/// verifiers fail with the reason instead).
const FIRST_LOAD: Duration = Duration::from_secs(20);

impl TrustRoots {
    /// Starts the watch; the receiver turns true once it has listed and
    /// every TrustRoot listed has had its first load (or [`FIRST_LOAD`] passed).
    pub fn start(
        client: Client,
        sink: Arc<dyn TrustRootSink>,
    ) -> (Arc<TrustRoots>, tokio::sync::watch::Receiver<bool>) {
        let (store, writer) = reflector::store::<TrustRoot>();
        let me = Arc::new(TrustRoots {
            store,
            sink,
            applied: Mutex::default(),
        });
        let (tx, rx) = tokio::sync::watch::channel(false);
        let api: Api<TrustRoot> = Api::all(client);
        let w = me.clone();
        crate::policies::reflect(
            api,
            writer,
            me.store.clone(),
            "TrustRoot watch (grant list/watch on trustroots.sigil.dev: ClusterRole sigil-policies)",
            move || {
                w.sync();
                if !*tx.borrow() {
                    let (w, tx) = (w.clone(), tx.clone());
                    tokio::spawn(async move {
                        let until = Instant::now() + FIRST_LOAD;
                        while !w.all_loaded() && Instant::now() < until {
                            tokio::time::sleep(Duration::from_millis(50)).await;
                        }
                        let _ = tx.send(true);
                    });
                }
            },
        );
        (me, rx)
    }

    fn all_loaded(&self) -> bool {
        self.store
            .state()
            .iter()
            .all(|t| self.sink.state(&t.name_any()).is_some())
    }

    /// Hands new and changed specs to the sink, and deletions.
    fn sync(&self) {
        let mut applied = self.applied.lock().unwrap_or_else(|e| e.into_inner());
        let objects = self.store.state();
        for t in &objects {
            let name = t.name_any();
            let spec = serde_json::to_string(&t.spec).unwrap_or_default();
            if applied.get(&name) != Some(&spec) {
                tracing::info!(trust_root = %name, "TrustRoot changed; loading it");
                self.sink.apply(&name, &t.spec);
                applied.insert(name, spec);
            }
        }
        let gone: Vec<String> = applied
            .keys()
            .filter(|n| !objects.iter().any(|t| &t.name_any() == *n))
            .cloned()
            .collect();
        for name in gone {
            tracing::info!(trust_root = %name, "TrustRoot deleted");
            self.sink.remove(&name);
            applied.remove(&name);
        }
    }

    /// Writes status while `leading` is true: runs until the process ends.
    pub async fn write_status(
        self: Arc<Self>,
        client: Client,
        mut leading: tokio::sync::watch::Receiver<bool>,
    ) {
        let api: Api<TrustRoot> = Api::all(client);
        let mut written: HashMap<String, TrustRootStatus> = HashMap::new();
        loop {
            if !*leading.borrow() {
                written.clear();
            }
            if leading.wait_for(|l| *l).await.is_err() {
                return;
            }
            for t in self.store.state() {
                let name = t.name_any();
                let Some(state) = self.sink.state(&name) else {
                    continue;
                };
                let before = t
                    .status
                    .as_ref()
                    .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Ready").cloned());
                let next = status(&state, t.metadata.generation, before.as_ref());
                if t.status.as_ref() == Some(&next) || written.get(&name) == Some(&next) {
                    continue;
                }
                let patch = Patch::Merge(json!({"status": next}));
                match api
                    .patch_status(&name, &PatchParams::default(), &patch)
                    .await
                {
                    Ok(_) => {
                        written.insert(name, next);
                    }
                    Err(e) => {
                        tracing::warn!(trust_root = %name, error = %e, "writing TrustRoot status failed")
                    }
                }
            }
            tokio::select! {
                () = tokio::time::sleep(Duration::from_secs(2)) => {}
                _ = leading.changed() => {}
            }
        }
    }
}

fn rfc3339(t: Option<i64>) -> Option<String> {
    let t = u64::try_from(t?).ok()?;
    Some(
        humantime::format_rfc3339_seconds(std::time::UNIX_EPOCH + Duration::from_secs(t))
            .to_string(),
    )
}

/// The status for `state`, keeping the Ready transition time while it holds.
fn status(
    state: &TrustRootState,
    generation: Option<i64>,
    before: Option<&Condition>,
) -> TrustRootStatus {
    let ready = if state.ready { "True" } else { "False" };
    let last_transition_time = match before {
        Some(b) if b.status == ready => b.last_transition_time.clone(),
        _ => humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string(),
    };
    TrustRootStatus {
        observed_generation: generation,
        source: state.source.clone(),
        root_version: state.root_version.and_then(|v| i64::try_from(v).ok()),
        expires: rfc3339(state.expires),
        last_refresh: rfc3339(state.last_refresh),
        error: state.error.clone(),
        conditions: vec![Condition {
            type_: "Ready".into(),
            status: ready.into(),
            reason: state.reason.clone(),
            message: state.message.clone(),
            observed_generation: generation,
            last_transition_time,
        }],
    }
}
