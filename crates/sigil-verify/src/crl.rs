//! Certificate revocation lists for notation's revocation check, kept
//! current off the admission path.
//!
//! Owns the CRL cache: one entry per distribution-point URL (the `http://`
//! CDPs of signing chains that already verified to a trust store, so a
//! signer cannot make sigil fetch URLs of its choosing), each holding the
//! last CRL that parsed, when it was fetched and its `nextUpdate`. Lookups
//! never wait on the network: a URL not fetched yet, or whose fetches fail,
//! answers "unknown" and wakes the fetcher; the verifier's level decides what
//! that means. In the server the fetcher runs in the background ([`Crls::run`]):
//! new URLs at once, each CRL again before its `nextUpdate`, failures with
//! backoff, keeping the last good CRL (a CRL past its `nextUpdate` is
//! "stale": it still proves a revocation, never the absence of one). The
//! one-shot CLI fetches what a verification asked for and verifies again
//! ([`Crls::fetch_due`]). Checking a chain against the CRLs (signatures,
//! issuers, serials) is [`crate::x509::verify_chain_revocation`]'s
//! (rustls-webpki); this module does not decide anything about a chain.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use rustls_pki_types::UnixTime;

/// How long one CRL download may take (the Notary Project's default).
pub const FETCH_TIMEOUT: Duration = Duration::from_secs(5);
/// Largest CRL accepted.
pub const MAX_CRL_BYTES: usize = 32 << 20;
/// Distribution points remembered at most (each is a CA's CRL).
pub const MAX_URLS: usize = 512;
/// An entry nobody looked up for this long is forgotten.
const FORGET_AFTER: i64 = 7 * 24 * 3600;
/// Re-fetch at least this often, whatever `nextUpdate` says.
const MAX_AGE: i64 = 24 * 3600;

/// A parsed CRL.
#[derive(Debug)]
pub struct Crl {
    /// The list, for rustls-webpki.
    pub list: webpki::CertRevocationList<'static>,
    /// The issuer's name (raw DER), to match it to the certificate it is for.
    pub issuer: Vec<u8>,
    /// `thisUpdate`, Unix seconds.
    pub this_update: i64,
    /// `nextUpdate`, Unix seconds.
    pub next_update: i64,
}

impl Crl {
    /// Parses a DER (or PEM `X509 CRL`) CRL. webpki supports version-2 CRLs
    /// with `nextUpdate`; delta CRLs are refused.
    pub fn parse(bytes: &[u8]) -> Result<Crl, String> {
        let pem;
        let der = if bytes.starts_with(b"-----BEGIN") {
            let text = std::str::from_utf8(bytes).map_err(|_| "PEM CRL is not text")?;
            pem = crate::keys::pem_blocks(text)
                .into_iter()
                .find(|(l, _)| l == "X509 CRL")
                .map(|(_, d)| d)
                .ok_or("no X509 CRL block in the PEM")?;
            pem.as_slice()
        } else {
            bytes
        };
        let owned = webpki::OwnedCertRevocationList::from_der(der)
            .map_err(|e| format!("CRL does not parse: {e:?}"))?;
        let (_, parsed) =
            x509_parser::parse_x509_crl(der).map_err(|e| format!("CRL does not parse: {e}"))?;
        let next_update = parsed
            .next_update()
            .ok_or("CRL has no nextUpdate")?
            .timestamp();
        Ok(Crl {
            issuer: parsed.issuer().as_raw().to_vec(),
            this_update: parsed.last_update().timestamp(),
            next_update,
            list: webpki::CertRevocationList::Owned(owned),
        })
    }

    /// Whether it lists the certificate with this serial (DER INTEGER
    /// content), and why if it does.
    pub fn revoked(&self, serial: &[u8]) -> Option<String> {
        match self.list.find_serial(serial) {
            Ok(Some(r)) => Some(match r.reason_code {
                Some(reason) => format!("{reason:?}"),
                None => "no reason given".into(),
            }),
            _ => None,
        }
    }
}

/// What the cache holds for a URL.
#[derive(Debug, Clone)]
pub enum Lookup {
    /// A CRL within its `nextUpdate`.
    Fresh(Arc<Crl>),
    /// The last CRL fetched, past its `nextUpdate`: a revocation it lists
    /// stands; it cannot prove that a certificate is not revoked.
    Stale(Arc<Crl>),
    /// None yet, and why (not fetched yet, the last fetch's error).
    Missing(String),
}

/// Receives what the fetcher did, for metrics.
pub trait CrlObserver: Send + Sync + 'static {
    /// One fetch of `url`: `ok`, `stale` (fetched, already past nextUpdate) or `error`.
    fn fetched(&self, url: &str, result: &str, next_update: Option<i64>);
}

#[derive(Debug)]
struct Entry {
    crl: Option<Arc<Crl>>,
    fetched: i64,
    error: Option<String>,
    next_try: i64,
    failures: u32,
    last_wanted: i64,
}

impl Entry {
    fn due(&self, now: i64) -> bool {
        if now < self.next_try {
            return false;
        }
        match &self.crl {
            None => true,
            Some(c) => {
                let window = (c.next_update - c.this_update).max(0);
                let early = (window / 10).min(3600);
                now >= (c.next_update - early).min(self.fetched + MAX_AGE)
            }
        }
    }
}

/// The CRL cache and its fetcher.
pub struct Crls {
    entries: Mutex<HashMap<String, Entry>>,
    wake: tokio::sync::Notify,
    background: AtomicBool,
    client: OnceLock<reqwest::Client>,
    observer: OnceLock<Arc<dyn CrlObserver>>,
}

impl std::fmt::Debug for Crls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Crls")
            .field("urls", &self.lock().len())
            .field("background", &self.background.load(Ordering::Relaxed))
            .finish()
    }
}

impl Default for Crls {
    fn default() -> Self {
        Crls {
            entries: Mutex::default(),
            wake: tokio::sync::Notify::new(),
            background: AtomicBool::new(false),
            client: OnceLock::new(),
            observer: OnceLock::new(),
        }
    }
}

fn now_unix() -> i64 {
    UnixTime::now().as_secs() as i64
}

impl Crls {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Entry>> {
        self.entries.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Sets the observer (once; later calls are ignored).
    pub fn observe(&self, observer: Arc<dyn CrlObserver>) {
        let _ = self.observer.set(observer);
    }

    /// Whether a background fetcher keeps the cache current.
    pub fn is_background(&self) -> bool {
        self.background.load(Ordering::Relaxed)
    }

    /// What the cache holds for `url` at `now`; remembers that it is wanted.
    /// Never waits: a URL without a CRL wakes the fetcher.
    pub fn lookup(&self, url: &str, now: i64) -> Lookup {
        let mut map = self.lock();
        if !map.contains_key(url) {
            if map.len() >= MAX_URLS {
                return Lookup::Missing(format!(
                    "not fetched: sigil already follows {MAX_URLS} CRL distribution points"
                ));
            }
            map.insert(
                url.to_owned(),
                Entry {
                    crl: None,
                    fetched: 0,
                    error: None,
                    next_try: 0,
                    failures: 0,
                    last_wanted: now,
                },
            );
            self.wake.notify_one();
        }
        let Some(e) = map.get_mut(url) else {
            return Lookup::Missing("not fetched yet".into());
        };
        e.last_wanted = now;
        match &e.crl {
            Some(c) if now < c.next_update => Lookup::Fresh(c.clone()),
            Some(c) => Lookup::Stale(c.clone()),
            None => Lookup::Missing(match &e.error {
                Some(err) => format!("not available: {err}"),
                None => "not fetched yet (sigil is fetching it; retry in a few seconds)".into(),
            }),
        }
    }

    /// Puts a CRL for `url` as if just fetched (tests, fuzzing).
    pub fn insert(&self, url: &str, crl: Crl, now: i64) {
        self.lock().insert(
            url.to_owned(),
            Entry {
                crl: Some(Arc::new(crl)),
                fetched: now,
                error: None,
                next_try: 0,
                failures: 0,
                last_wanted: now,
            },
        );
    }

    /// Fetches every URL that is due: never fetched, near or past its
    /// `nextUpdate`, or failed and out of backoff. Returns how many were
    /// fetched. Forgets URLs nobody looked up for a week.
    pub async fn fetch_due(&self, now: i64) -> usize {
        let due: Vec<String> = {
            let mut map = self.lock();
            map.retain(|_, e| now - e.last_wanted < FORGET_AFTER);
            map.iter()
                .filter(|(_, e)| e.due(now))
                .map(|(u, _)| u.clone())
                .collect()
        };
        for url in &due {
            let result = self.fetch(url).await.and_then(|b| Crl::parse(&b));
            let now = now_unix();
            let (label, next_update) = match &result {
                Ok(c) if c.next_update <= now => ("stale", Some(c.next_update)),
                Ok(c) => ("ok", Some(c.next_update)),
                Err(_) => ("error", None),
            };
            match &result {
                Ok(_) if label == "stale" => tracing::warn!(
                    url = %url, next_update = ?next_update,
                    "the CRL at this distribution point is past its nextUpdate: revocation status stays unknown until its CA publishes a new one"
                ),
                Ok(_) => tracing::debug!(url = %url, "CRL fetched"),
                Err(e) => {
                    tracing::warn!(url = %url, error = %e, "CRL fetch failed; the last CRL fetched (if any) stays in use")
                }
            }
            if let Some(o) = self.observer.get() {
                o.fetched(url, label, next_update);
            }
            let mut map = self.lock();
            let Some(e) = map.get_mut(url) else { continue };
            match result {
                Ok(c) => {
                    // A CRL served stale is not fetched again in a hot loop.
                    e.next_try = if label == "stale" { now + 60 } else { 0 };
                    e.crl = Some(Arc::new(c));
                    e.fetched = now;
                    e.error = None;
                    e.failures = 0;
                }
                Err(err) => {
                    e.failures = e.failures.saturating_add(1);
                    let backoff = (30i64 << e.failures.min(5)).min(900);
                    e.next_try = now + backoff;
                    e.error = Some(err);
                }
            }
        }
        due.len()
    }

    async fn fetch(&self, url: &str) -> Result<Vec<u8>, String> {
        if !url.starts_with("http://") {
            return Err("only http:// CRL distribution points are fetched".into());
        }
        let client = self.client.get_or_init(|| {
            reqwest::Client::builder()
                .timeout(FETCH_TIMEOUT)
                .build()
                .unwrap_or_default()
        });
        let resp = client
            .get(url)
            .timeout(FETCH_TIMEOUT)
            .send()
            .await
            .map_err(|e| format!("GET {url}: {}", crate::error_chain(&e)))?;
        if !resp.status().is_success() {
            return Err(format!("GET {url}: HTTP {}", resp.status()));
        }
        crate::read_capped(resp, MAX_CRL_BYTES)
            .await
            .map_err(|e| format!("GET {url}: {e}"))
    }

    /// Starts keeping the cache current until the process ends (see
    /// [`Crls::run`]); from now on verifications never fetch themselves.
    pub fn start(self: &Arc<Self>, tick: Duration) -> tokio::task::JoinHandle<()> {
        self.background.store(true, Ordering::Relaxed);
        tokio::spawn(self.clone().run(tick))
    }

    /// Keeps the cache current: fetches what is due whenever a lookup wants
    /// a new URL, and every `tick` otherwise.
    pub async fn run(self: Arc<Self>, tick: Duration) {
        self.background.store(true, Ordering::Relaxed);
        loop {
            self.fetch_due(now_unix()).await;
            tokio::select! {
                () = self.wake.notified() => {}
                () = tokio::time::sleep(tick) => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        for bytes in [
            &b""[..],
            b"\x30\x03\x02\x01\x01",
            b"-----BEGIN X509 CRL-----\nAA==\n",
        ] {
            assert!(Crl::parse(bytes).is_err());
        }
    }

    #[test]
    fn an_unknown_url_is_missing_and_remembered() {
        let c = Crls::default();
        assert!(
            matches!(c.lookup("http://ca.test/crl", 10), Lookup::Missing(w) if w.contains("not fetched yet"))
        );
        assert_eq!(c.lock().len(), 1);
        assert!(c.lock()["http://ca.test/crl"].due(10));
    }
}
