//! The Sigstore trusted roots in force, by name, and keeping them current.
//!
//! Owns [`TrustRoots`] (what a policy load resolves a verifier's trusted
//! root against: the default, `public-good`, is the embedded root until a
//! TUF refresh replaces it) and [`Refresher`] (one TUF repository's
//! background refresh: it never runs on the admission path, and a failed
//! refresh leaves the last good root in force). It does not fetch (see
//! [`crate::tuf`]), schedule (the server's loop calls [`Refresher::run`])
//! or record metrics (it reports to a [`RefreshObserver`]).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;

use crate::VerifyError;
use crate::trust::{PUBLIC_GOOD, TrustedRoot};
use crate::tuf::{Client, Fetched};

/// The name of the root verifiers use when they name none.
pub const DEFAULT: &str = "public-good";

/// GitHub's own Sigstore instance (`trustRoot: github`): private
/// repositories' attestations, verified by their signed timestamps.
pub const GITHUB: &str = "github";

/// The roots built in, by name, with their embedded `trusted_root.json`.
pub const BUILT_IN: [(&str, &str); 2] = [(DEFAULT, PUBLIC_GOOD), (GITHUB, crate::trust::GITHUB)];

/// Where a root in force came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// Built into sigil (no refresh has succeeded yet, or none is configured).
    Embedded,
    /// Verified from a TUF repository.
    Tuf {
        /// The repository's metadata URL.
        mirror: String,
        /// Root metadata version.
        root_version: u64,
        /// Timestamp metadata version.
        timestamp_version: u64,
        /// When the repository's metadata expires (Unix seconds).
        expires: i64,
    },
    /// Given inline (a private Sigstore without TUF).
    Inline,
}

/// One trusted root in force and how it got there.
#[derive(Debug, Clone)]
pub struct InForce {
    /// The parsed root.
    pub root: Arc<TrustedRoot>,
    /// Its `trusted_root.json`.
    pub json: Arc<str>,
    /// Where it came from.
    pub origin: Origin,
    /// Last successful refresh (Unix seconds), if any.
    pub refreshed: Option<i64>,
    /// Why the last refresh failed, if it did (the root above stays in force).
    pub error: Option<String>,
}

impl InForce {
    /// A root given as `trusted_root.json` text.
    pub fn from_json(json: &str, origin: Origin) -> Result<InForce, VerifyError> {
        Ok(InForce {
            root: Arc::new(TrustedRoot::from_json(json)?),
            json: Arc::from(json),
            origin,
            refreshed: None,
            error: None,
        })
    }
}

/// The trusted roots in force, by name. Cheap to read; replaced whole.
#[derive(Debug)]
pub struct TrustRoots {
    map: ArcSwap<BTreeMap<String, Arc<InForce>>>,
    /// Names with no root in force, and why (a `TrustRoot` whose first
    /// load failed); a verifier naming one fails with that reason.
    unavailable: ArcSwap<BTreeMap<String, String>>,
    /// The CRLs notation verifiers check revocation against (kept current
    /// by [`crate::crl::Crls::run`] in the server, fetched on demand by the CLI).
    revocation: Arc<crate::crl::Crls>,
}

impl TrustRoots {
    /// Only the embedded roots: public-good, as `public-good`, and
    /// GitHub's, as `github`.
    pub fn embedded() -> TrustRoots {
        let map = BUILT_IN
            .iter()
            .map(|(name, json)| {
                let root = InForce::from_json(json, Origin::Embedded)
                    .expect("the embedded trusted roots parse (a unit test checks them)");
                ((*name).to_owned(), Arc::new(root))
            })
            .collect();
        TrustRoots {
            map: ArcSwap::from_pointee(map),
            unavailable: ArcSwap::default(),
            revocation: Arc::default(),
        }
    }

    /// The CRL cache notation verifiers use.
    pub fn revocation(&self) -> Arc<crate::crl::Crls> {
        self.revocation.clone()
    }

    /// Why no root named `name` is in force, for a verifier's failure.
    pub fn why_not(&self, name: &str) -> String {
        match self.unavailable.load().get(name) {
            Some(why) => format!("trust root {name:?} is not in force: {why}"),
            None => format!(
                "trust root {name:?} is not in force (no TrustRoot of that name, or it has not loaded yet)"
            ),
        }
    }

    /// Why `name` has no root in force, if that was recorded.
    pub fn unavailable(&self, name: &str) -> Option<String> {
        self.unavailable.load().get(name).cloned()
    }

    /// Records that `name` has no root in force and why (its previous
    /// root, if any, is removed: the object that defined it changed).
    pub fn set_unavailable(&self, name: &str, why: &str) {
        self.remove(name);
        self.unavailable.rcu(|m| {
            let mut m = BTreeMap::clone(m);
            m.insert(name.to_owned(), why.to_owned());
            m
        });
    }

    /// Forgets `name` (its object was deleted).
    pub fn remove(&self, name: &str) {
        self.map.rcu(|m| {
            let mut m = BTreeMap::clone(m);
            m.remove(name);
            m
        });
        self.unavailable.rcu(|m| {
            let mut m = BTreeMap::clone(m);
            m.remove(name);
            m
        });
    }

    /// The root named `name`, if one is in force.
    pub fn get(&self, name: &str) -> Option<Arc<InForce>> {
        self.map.load().get(name).cloned()
    }

    /// The root a verifier that names none uses.
    pub fn default_root(&self) -> Arc<TrustedRoot> {
        match self.get(DEFAULT) {
            Some(r) => r.root.clone(),
            None => Arc::new(TrustedRoot::public_good().expect("the embedded trusted root parses")),
        }
    }

    /// Every root in force, by name.
    pub fn all(&self) -> Arc<BTreeMap<String, Arc<InForce>>> {
        self.map.load_full()
    }

    /// Puts `root` in force as `name`.
    pub fn set(&self, name: &str, root: InForce) {
        self.unavailable.rcu(|m| {
            let mut m = BTreeMap::clone(m);
            m.remove(name);
            m
        });
        self.map.rcu(|m| {
            let mut m = BTreeMap::clone(m);
            m.insert(name.to_owned(), Arc::new(root.clone()));
            m
        });
    }

    /// Records why `name`'s refresh failed; its root, if any, stays in
    /// force (without one, `name` is unavailable for that reason).
    fn failed(&self, name: &str, why: &str) {
        if self.get(name).is_none() {
            self.unavailable.rcu(|m| {
                let mut m = BTreeMap::clone(m);
                m.insert(name.to_owned(), why.to_owned());
                m
            });
            return;
        }
        self.map.rcu(|m| {
            let mut m = BTreeMap::clone(m);
            if let Some(r) = m.get(name) {
                let mut r = InForce::clone(r);
                r.error = Some(why.to_owned());
                m.insert(name.to_owned(), Arc::new(r));
            }
            m
        });
    }
}

impl Default for TrustRoots {
    fn default() -> Self {
        TrustRoots::embedded()
    }
}

/// What a refresh did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refreshed {
    /// A new trusted root is in force.
    Changed,
    /// The repository verified and still publishes the root in force.
    Unchanged,
    /// The refresh failed; the last good root stays in force.
    Failed,
}

impl Refreshed {
    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Refreshed::Changed => "changed",
            Refreshed::Unchanged => "unchanged",
            Refreshed::Failed => "error",
        }
    }
}

/// Told about every refresh (the server turns it into metrics).
pub trait RefreshObserver: Send + Sync {
    /// `name` was refreshed with this outcome; `expires` is the
    /// repository's metadata expiry in force (Unix seconds), if known.
    fn refreshed(&self, name: &str, outcome: Refreshed, expires: Option<i64>);
}

/// One TUF repository kept current as one named root.
#[derive(Debug)]
pub struct Refresher {
    name: String,
    client: Client,
    roots: Arc<TrustRoots>,
}

fn now() -> i64 {
    time::OffsetDateTime::now_utc().unix_timestamp()
}

impl Refresher {
    /// Refreshes `roots[name]` from `client`'s repository.
    pub fn new(name: &str, client: Client, roots: Arc<TrustRoots>) -> Refresher {
        Refresher {
            name: name.to_owned(),
            client,
            roots,
        }
    }

    /// The root's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// One refresh. A root that verified is put in force if it differs
    /// from the one in force; any failure is recorded and changes nothing.
    pub async fn refresh_once(&self) -> (Refreshed, Result<Fetched, VerifyError>) {
        match self.client.refresh().await {
            Ok(f) => {
                let same = self
                    .roots
                    .get(&self.name)
                    .is_some_and(|r| *r.json == *f.json);
                let origin = Origin::Tuf {
                    mirror: self.client.mirror().to_owned(),
                    root_version: f.root_version,
                    timestamp_version: f.timestamp_version,
                    expires: f.expires,
                };
                match InForce::from_json(&f.json, origin) {
                    Ok(mut r) => {
                        r.refreshed = Some(now());
                        self.roots.set(&self.name, r);
                        let outcome = if same {
                            Refreshed::Unchanged
                        } else {
                            Refreshed::Changed
                        };
                        (outcome, Ok(f))
                    }
                    Err(e) => {
                        self.roots.failed(&self.name, &e.to_string());
                        (Refreshed::Failed, Err(e))
                    }
                }
            }
            Err(e) => {
                self.roots.failed(&self.name, &e.to_string());
                (Refreshed::Failed, Err(e))
            }
        }
    }

    /// Refreshes now, then every `interval` (± 10 % jitter, so replicas
    /// do not ask at once), forever. After a failure it retries sooner
    /// (a minute, doubling up to the interval). `changed` runs after a new
    /// root is put in force (the server rebuilds its verifiers).
    pub async fn run(
        self,
        interval: Duration,
        observer: Arc<dyn RefreshObserver>,
        changed: impl Fn() + Send + Sync,
    ) {
        self.run_while(|| true, interval, observer, changed).await;
    }

    /// [`Refresher::run`], refreshing only while `wanted` says so (checked
    /// every few seconds, and before each refresh): a built-in root no
    /// policy names costs no request, no warning and no alert.
    pub async fn run_while(
        self,
        wanted: impl Fn() -> bool + Send + Sync,
        interval: Duration,
        observer: Arc<dyn RefreshObserver>,
        changed: impl Fn() + Send + Sync,
    ) {
        let mut retry = Duration::from_secs(60).min(interval);
        loop {
            if !wanted() {
                tokio::time::sleep(Duration::from_secs(5).min(interval)).await;
                continue;
            }
            let (outcome, result) = self.refresh_once().await;
            let expires = match (&result, self.roots.get(&self.name)) {
                (Ok(f), _) => Some(f.expires),
                (Err(_), Some(r)) => match r.origin {
                    Origin::Tuf { expires, .. } => Some(expires),
                    _ => None,
                },
                _ => None,
            };
            observer.refreshed(&self.name, outcome, expires);
            let wait = match &result {
                Ok(f) => {
                    retry = Duration::from_secs(60).min(interval);
                    tracing::info!(
                        trust_root = %self.name,
                        mirror = %self.client.mirror(),
                        root_version = f.root_version,
                        timestamp_version = f.timestamp_version,
                        outcome = outcome.as_str(),
                        "trusted root refreshed"
                    );
                    if outcome == Refreshed::Changed {
                        changed();
                    }
                    jitter(interval)
                }
                Err(e) => {
                    tracing::warn!(
                        trust_root = %self.name,
                        mirror = %self.client.mirror(),
                        error = %e,
                        "trusted root refresh failed; the last good root stays in force"
                    );
                    let w = retry;
                    retry = (retry * 2).min(interval);
                    jitter(w)
                }
            };
            tokio::time::sleep(wait).await;
        }
    }
}

/// `d` ± 10 %, from the clock's sub-second noise (no RNG needed for this).
fn jitter(d: Duration) -> Duration {
    let noise = time::OffsetDateTime::now_utc().nanosecond() % 2001;
    let permille = 900 + u64::from(noise) / 10; // 900..=1100
    Duration::from_millis(
        u64::try_from(d.as_millis())
            .unwrap_or(u64::MAX)
            .saturating_mul(permille)
            / 1000,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_embedded_default_is_in_force_until_replaced() {
        let roots = TrustRoots::embedded();
        let r = roots.get(DEFAULT).unwrap();
        assert_eq!(r.origin, Origin::Embedded);
        assert!(!roots.default_root().logs.is_empty());
        roots.failed(DEFAULT, "unreachable");
        let r = roots.get(DEFAULT).unwrap();
        assert_eq!(r.error.as_deref(), Some("unreachable"));
        assert_eq!(r.origin, Origin::Embedded, "a failure changes no root");
    }

    #[test]
    fn jitter_stays_within_ten_percent() {
        for _ in 0..100 {
            let j = jitter(Duration::from_secs(1000));
            assert!((900..=1100).contains(&j.as_secs()), "{j:?}");
        }
    }
}
