//! Certificate revocation lists for notation's revocation check, kept
//! current off the admission path.
//!
//! Owns the CRL cache: one entry per distribution-point URL (the `http://`
//! CDPs of the certificates on the path that verified to a trust store —
//! never of other certificates a signer appends to its chain — so a signer
//! cannot make sigil fetch URLs of its choosing), each holding the last CRL
//! that parsed *and whose signature verified with the key of the issuer it
//! was fetched for* (anything else is dropped before it is kept), when it
//! was fetched and its `nextUpdate`. Its bounds: a size per CRL near real
//! ones, bytes held in all, URLs in all and per issuing CA, fetches at once;
//! a URL that never served a valid CRL never holds a slot another one needs.
//! How a fetch reaches the network (no internal addresses unless allowed,
//! no redirects to another host) is [`fetch`]'s. Lookups
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

pub mod fetch;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use rustls_pki_types::UnixTime;

/// How long one CRL download may take (the Notary Project's default).
pub const FETCH_TIMEOUT: Duration = Duration::from_secs(5);
/// Largest CRL accepted (the largest public CAs' full CRLs are a few MiB;
/// a signing CA's are kilobytes).
pub const MAX_CRL_BYTES: usize = 8 << 20;
/// The CRL bytes held in all (a parsed CRL takes several times its size).
pub const MAX_TOTAL_BYTES: usize = 24 << 20;
/// Distribution points remembered at most (each is a CA's CRL).
pub const MAX_URLS: usize = 512;
/// Distribution points one issuing CA's certificates may make sigil follow.
pub const MAX_URLS_PER_ISSUER: usize = 8;
/// Fetches under way at once.
pub const FETCH_PARALLEL: usize = 8;
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

/// Why a CRL could not be fetched or kept.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CrlError {
    /// Not a CRL webpki and x509-parser both read (DER, or PEM `X509 CRL`).
    #[error("CRL does not parse: {0}")]
    Parse(String),
    /// A CRL without `nextUpdate` (which webpki requires).
    #[error("CRL has no nextUpdate")]
    NoNextUpdate,
    /// PEM that is not UTF-8 text.
    #[error("PEM CRL is not text")]
    PemNotText,
    /// PEM without an `X509 CRL` block.
    #[error("no X509 CRL block in the PEM")]
    NoPemBlock,
    /// The issuing CA's SubjectPublicKeyInfo does not parse.
    #[error("the issuer's key does not parse: {0}")]
    IssuerKey(String),
    /// Signed by someone other than the CA whose certificate names it.
    #[error("the CRL is not signed by the CA whose certificate names it")]
    NotSignedByIssuer,
    /// No verified chain named this URL: nothing fetched could be checked.
    #[error("no verified issuer to check a CRL against")]
    NoVerifiedIssuer,
    /// The distribution point was not fetched (a URL or scheme refused, an
    /// internal address, a network or HTTP error, too large).
    #[error("{0}")]
    Fetch(#[from] crate::FetchError),
}

impl Crl {
    /// Parses a DER (or PEM `X509 CRL`) CRL. webpki supports version-2 CRLs
    /// with `nextUpdate`; delta CRLs are refused.
    pub fn parse(bytes: &[u8]) -> Result<Crl, CrlError> {
        let der = pem_or_der(bytes)?;
        let der = der.as_ref();
        let owned = webpki::OwnedCertRevocationList::from_der(der)
            .map_err(|e| CrlError::Parse(format!("{e:?}")))?;
        let (_, parsed) =
            x509_parser::parse_x509_crl(der).map_err(|e| CrlError::Parse(e.to_string()))?;
        let next_update = parsed
            .next_update()
            .ok_or(CrlError::NoNextUpdate)?
            .timestamp();
        Ok(Crl {
            issuer: parsed.issuer().as_raw().to_vec(),
            this_update: parsed.last_update().timestamp(),
            next_update,
            list: webpki::CertRevocationList::Owned(owned),
        })
    }

    /// [`Crl::parse`], then the signature checked with the issuer's public
    /// key (`issuer_spki`: its SubjectPublicKeyInfo, DER): a CRL is kept only
    /// when the CA it was fetched for signed it.
    pub fn parse_signed_by(bytes: &[u8], issuer_spki: &[u8]) -> Result<Crl, CrlError> {
        let crl = Crl::parse(bytes)?;
        let der = pem_or_der(bytes)?;
        let (_, parsed) =
            x509_parser::parse_x509_crl(&der).map_err(|e| CrlError::Parse(e.to_string()))?;
        let (_, spki) = <x509_parser::x509::SubjectPublicKeyInfo<'_> as x509_parser::prelude::FromDer<'_, _>>::from_der(issuer_spki)
            .map_err(|e| CrlError::IssuerKey(e.to_string()))?;
        parsed
            .verify_signature(&spki)
            .map_err(|_| CrlError::NotSignedByIssuer)?;
        Ok(crl)
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

/// The DER of a CRL given as DER or PEM.
fn pem_or_der(bytes: &[u8]) -> Result<std::borrow::Cow<'_, [u8]>, CrlError> {
    if !bytes.starts_with(b"-----BEGIN") {
        return Ok(std::borrow::Cow::Borrowed(bytes));
    }
    let text = std::str::from_utf8(bytes).map_err(|_| CrlError::PemNotText)?;
    crate::keys::pem_blocks(text)
        .into_iter()
        .find(|(l, _)| l == "X509 CRL")
        .map(|(_, d)| std::borrow::Cow::Owned(d))
        .ok_or(CrlError::NoPemBlock)
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
    /// Its size, counted against [`MAX_TOTAL_BYTES`].
    bytes: usize,
    /// The SubjectPublicKeyInfo of the CA whose certificate named the URL:
    /// what a fetched CRL must be signed by (none: nothing fetched is kept).
    issuer: Option<Arc<[u8]>>,
    fetched: i64,
    error: Option<CrlError>,
    next_try: i64,
    failures: u32,
    last_wanted: i64,
}

impl Entry {
    fn wanted(issuer: Option<Arc<[u8]>>, now: i64) -> Entry {
        Entry {
            crl: None,
            bytes: 0,
            issuer,
            fetched: 0,
            error: None,
            next_try: 0,
            failures: 0,
            last_wanted: now,
        }
    }

    /// Asked for and failed, never served a valid CRL: it gives its slot up.
    fn never_succeeded(&self) -> bool {
        self.crl.is_none() && self.failures > 0
    }
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
    /// Internal networks fetches may reach ([`fetch`]).
    allowed: Arc<Vec<ipnet::IpNet>>,
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
        Crls::with_allowed(fetch::allowed_by_default())
    }
}

fn now_unix() -> i64 {
    UnixTime::now().as_secs() as i64
}

impl Crls {
    /// An empty cache whose fetches may reach these internal networks (the
    /// default: the process-wide `--crl-allow-networks`).
    pub fn with_allowed(allowed: Vec<ipnet::IpNet>) -> Crls {
        Crls {
            entries: Mutex::default(),
            wake: tokio::sync::Notify::new(),
            background: AtomicBool::new(false),
            client: OnceLock::new(),
            observer: OnceLock::new(),
            allowed: Arc::new(allowed),
        }
    }

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

    /// What the cache holds for `url` at `now`, for a certificate issued by
    /// no known CA (nothing fetched for it is kept): see [`Crls::lookup_for`].
    pub fn lookup(&self, url: &str, now: i64) -> Lookup {
        self.lookup_for(url, None, now)
    }

    /// What the cache holds for `url` at `now`, named by a certificate of a
    /// verified path whose issuer's SubjectPublicKeyInfo is `issuer` (what
    /// a fetched CRL must be signed by); remembers that it is wanted. Never
    /// waits: a URL without a CRL wakes the fetcher.
    pub fn lookup_for(&self, url: &str, issuer: Option<&[u8]>, now: i64) -> Lookup {
        let mut map = self.lock();
        if !map.contains_key(url) {
            if let Some(key) = issuer {
                let named = map
                    .values()
                    .filter(|e| e.issuer.as_deref() == Some(key))
                    .count();
                if named >= MAX_URLS_PER_ISSUER {
                    return Lookup::Missing(format!(
                        "not fetched: this CA's certificates already name {MAX_URLS_PER_ISSUER} CRL distribution points"
                    ));
                }
            }
            if map.len() >= MAX_URLS {
                // A URL that never served a valid CRL gives its slot up.
                let idle = map
                    .iter()
                    .filter(|(_, e)| e.never_succeeded())
                    .min_by_key(|(_, e)| e.last_wanted)
                    .map(|(u, _)| u.clone());
                match idle {
                    Some(u) => {
                        map.remove(&u);
                    }
                    None => {
                        return Lookup::Missing(format!(
                            "not fetched: sigil already follows {MAX_URLS} CRL distribution points"
                        ));
                    }
                }
            }
            map.insert(url.to_owned(), Entry::wanted(issuer.map(Arc::from), now));
            self.wake.notify_one();
        }
        let Some(e) = map.get_mut(url) else {
            return Lookup::Missing("not fetched yet".into());
        };
        e.last_wanted = now;
        if e.issuer.is_none()
            && let Some(key) = issuer
        {
            e.issuer = Some(Arc::from(key));
        }
        match &e.crl {
            Some(c) if now < c.next_update => Lookup::Fresh(c.clone()),
            Some(c) => Lookup::Stale(c.clone()),
            // What went wrong on the network stays in sigil's logs: a
            // tenant's denial never carries a connection error.
            None => Lookup::Missing(match &e.error {
                Some(_) => "not available: the last fetch failed (sigil's logs say why)".into(),
                None => "not fetched yet (sigil is fetching it; retry in a few seconds)".into(),
            }),
        }
    }

    /// Puts a CRL for `url` as if just fetched (tests, fuzzing).
    pub fn insert(&self, url: &str, crl: Crl, now: i64) {
        let mut e = Entry::wanted(None, now);
        e.crl = Some(Arc::new(crl));
        e.fetched = now;
        self.lock().insert(url.to_owned(), e);
    }

    /// The CRL bytes held now.
    pub fn bytes_held(&self) -> usize {
        self.lock().values().map(|e| e.bytes).sum()
    }

    /// Fetches every URL that is due: never fetched, near or past its
    /// `nextUpdate`, or failed and out of backoff. Returns how many were
    /// fetched. Forgets URLs nobody looked up for a week.
    pub async fn fetch_due(&self, now: i64) -> usize {
        use futures_util::StreamExt as _;
        let due: Vec<(String, Option<Arc<[u8]>>)> = {
            let mut map = self.lock();
            map.retain(|_, e| now - e.last_wanted < FORGET_AFTER);
            map.iter()
                .filter(|(_, e)| e.due(now))
                .map(|(u, e)| (u.clone(), e.issuer.clone()))
                .collect()
        };
        let count = due.len();
        // A few at once: one hanging distribution point costs its own
        // timeout, not everyone's.
        let mut results = futures_util::stream::iter(due)
            .map(|(url, issuer)| async move {
                // Nothing fetched for a URL no verified path named could be
                // kept: it is not fetched at all.
                let result = match issuer {
                    None => Err(CrlError::NoVerifiedIssuer),
                    Some(key) => self
                        .fetch(&url)
                        .await
                        .and_then(|b| Crl::parse_signed_by(&b, &key).map(|crl| (crl, b.len()))),
                };
                (url, result)
            })
            .buffer_unordered(FETCH_PARALLEL);
        while let Some((url, result)) = results.next().await {
            self.settle(&url, result);
        }
        count
    }

    /// Records one fetch's result: the CRL kept (within the byte budget) or
    /// the failure, with backoff.
    fn settle(&self, url: &str, result: Result<(Crl, usize), CrlError>) {
        let now = now_unix();
        let (label, next_update) = match &result {
            Ok((c, _)) if c.next_update <= now => ("stale", Some(c.next_update)),
            Ok((c, _)) => ("ok", Some(c.next_update)),
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
        let Some(e) = map.get_mut(url) else { return };
        match result {
            Ok((c, bytes)) => {
                // A CRL served stale is not fetched again in a hot loop.
                e.next_try = if label == "stale" { now + 60 } else { 0 };
                e.crl = Some(Arc::new(c));
                e.bytes = bytes;
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
        // Past the byte budget, the CRLs wanted longest ago are dropped
        // (fetched again when wanted).
        let mut held: usize = map.values().map(|e| e.bytes).sum();
        while held > MAX_TOTAL_BYTES {
            let Some(oldest) = map
                .iter()
                .filter(|(u, e)| e.bytes > 0 && u.as_str() != url)
                .min_by_key(|(_, e)| e.last_wanted)
                .map(|(u, _)| u.clone())
            else {
                break;
            };
            if let Some(e) = map.get_mut(&oldest) {
                held -= e.bytes;
                e.bytes = 0;
                e.crl = None;
                e.next_try = 0;
            }
        }
    }

    async fn fetch(&self, url: &str) -> Result<Vec<u8>, CrlError> {
        let client = self
            .client
            .get_or_init(|| fetch::client(self.allowed.clone(), FETCH_TIMEOUT));
        fetch::get(client, &self.allowed, url, MAX_CRL_BYTES)
            .await
            .map_err(CrlError::Fetch)
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
