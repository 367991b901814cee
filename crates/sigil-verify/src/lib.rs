//! sigil-verify: signature verification of the exact digest sigil pins.
//!
//! It owns loading the trust material a policy names (keys, Fulcio/Rekor
//! trusted roots, notation roots; `material`) once per policy load,
//! checking a rule's attestation entries ([`attest`]), checking cosign
//! (key, keyless, Sigstore bundle, bare DSSE envelopes: [`envelope`]) and
//! notation (JWS, COSE) signatures — for attestations too, returning the
//! signed statement and every Fulcio extension of its certificate — and
//! the verification cache: outcomes per (signature repository, digest,
//! verifier set, pull identities) with a lifetime per outcome, concurrent
//! verifications of one key coalesced into one (sigil-registry's cache,
//! the one the digests live in). It fetches through [`sigil_core::ArtifactSource`], so it has no
//! HTTP stack of its own, and it decides nothing about admission: it reports
//! per-verifier outcomes in sigil-core's types and the engine decides.

/// Declares a parser's error type: its message, typed, built by `?` from
/// the `&str`/`String` reasons the parser's steps give.
macro_rules! message_error {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
        #[error("{0}")]
        pub struct $name(String);

        impl From<String> for $name {
            fn from(s: String) -> Self {
                $name(s)
            }
        }

        impl From<&str> for $name {
            fn from(s: &str) -> Self {
                $name(s.to_owned())
            }
        }
    };
}

pub mod attest;
pub mod bundle;
mod cached;
pub mod checkpoint;
pub mod cosign;
pub mod crl;
pub mod der;
pub mod envelope;
pub mod gather;
pub mod keys;
mod material;
pub mod merkle;
pub mod notation;
mod platforms;
pub mod rekor;
pub mod roots;
pub mod sct;
pub mod trust;
pub mod tsa;
pub mod tuf;
pub mod x509;

use std::sync::Arc;
use std::time::{Instant, SystemTime};

use sigil_registry::cache::{Cache, Key};

use crate::cached::{Entry, Keyer, entry, lifetime, made_for};

pub use sigil_core::CacheConfig;
use sigil_core::{
    ArtifactSource, BoxFuture, Digest, PullCredentials, Reference, SignatureProblem,
    SignatureVerifier, Verification, VerificationReport, VerifierOutcome,
};

use crate::gather::Artifacts;
pub use crate::material::{Check, Loaded, LoadedSet, Material};

/// Why a policy's verification material could not be loaded.
#[derive(Debug, Clone, thiserror::Error)]
pub enum VerifyError {
    /// A key, certificate or trust-root file could not be read.
    #[error("{path}: {detail}")]
    File {
        /// The path as written in the policy.
        path: String,
        /// The I/O error.
        detail: String,
    },
    /// A public key is malformed or of an unsupported type.
    #[error("public key: {0}")]
    Key(String),
    /// A trusted_root.json is malformed.
    #[error("trusted root: {0}")]
    TrustRoot(String),
    /// A TUF repository could not be read or failed a TUF check.
    #[error("TUF: {0}")]
    Tuf(String),
    /// A certificate file holds no usable certificate.
    #[error("certificate: {0}")]
    Certificate(String),
    /// A keyless identity pattern is not a valid regular expression.
    #[error("keyless identity: {0}")]
    Identity(String),
    /// A verifier asks for what its trust material can never give (a
    /// required transparency log under a root that lists none).
    #[error("{0}")]
    Unsatisfiable(String),
    /// A notation `trustedIdentities` entry is not one notation accepts.
    #[error("notation trustedIdentities: {0}")]
    NotationIdentity(String),
    /// A verifier entry could not be loaded (names the rule and verifier).
    #[error("rule {rule:?}, verifier {verifier:?}: {source}")]
    Verifier {
        /// Rule name.
        rule: String,
        /// Verifier name.
        verifier: String,
        /// The underlying problem.
        #[source]
        source: Box<VerifyError>,
    },
}

/// Why one signature artifact, certificate or log entry cannot vouch for an
/// image. Found while parsing and checking; each becomes the matching
/// [`SignatureProblem`] in the verifier's report.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ArtifactError {
    /// Not the shape its media type promises (JSON, base64, PEM, DER, CBOR,
    /// a required field or header missing, an unsupported form).
    #[error("{0}")]
    Malformed(String),
    /// The certificate chain does not lead to a trusted root at the time checked.
    #[error("{0}")]
    Chain(String),
    /// The transparency-log entry is not from a trusted log, does not verify,
    /// or is not about this signature.
    #[error("{0}")]
    Log(String),
}

impl From<der::DerError> for ArtifactError {
    fn from(e: der::DerError) -> Self {
        ArtifactError::Malformed(e.to_string())
    }
}

impl From<ArtifactError> for SignatureProblem {
    fn from(e: ArtifactError) -> SignatureProblem {
        match e {
            ArtifactError::Malformed(detail) => SignatureProblem::Malformed { detail },
            ArtifactError::Chain(detail) => SignatureProblem::ChainInvalid { detail },
            ArtifactError::Log(detail) => SignatureProblem::LogEntryInvalid { detail },
        }
    }
}

/// DSSE's pre-authentication encoding of a payload: what an envelope's
/// signatures are over (`DSSEv1 <len> <type> <len> <payload>`).
pub fn pae(payload_type: &str, payload: &[u8]) -> Vec<u8> {
    let mut m = format!(
        "DSSEv1 {} {} {} ",
        payload_type.len(),
        payload_type,
        payload.len()
    )
    .into_bytes();
    m.extend_from_slice(payload);
    m
}

/// An error with its causes, one line.
pub(crate) fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        let t = c.to_string();
        if !s.contains(&t) {
            s.push_str(": ");
            s.push_str(&t);
        }
        cur = c.source();
    }
    s
}

/// Why a fetch (a CRL, TUF metadata) brought nothing back.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FetchError {
    /// The URL does not parse.
    #[error("{url}: {detail}")]
    Url {
        /// The URL as given.
        url: String,
        /// The parser's reason.
        detail: String,
    },
    /// A CRL distribution point other than `http://`.
    #[error("only http:// CRL distribution points are fetched")]
    Scheme,
    /// An internal address no allowed network names.
    #[error(
        "{0} is an internal address, which CRL fetches do not reach unless --crl-allow-networks names it"
    )]
    Internal(std::net::IpAddr),
    /// The request failed in transport.
    #[error("GET {url}: {detail}")]
    Transport {
        /// The URL.
        url: String,
        /// The transport's error chain.
        detail: String,
    },
    /// The server answered with an error status.
    #[error("GET {url}: HTTP {status}")]
    Status {
        /// The URL.
        url: String,
        /// The HTTP status.
        status: u16,
    },
    /// The body passed its cap.
    #[error("larger than {0} bytes")]
    TooLarge(usize),
    /// Reading the body failed.
    #[error("{0}")]
    Body(String),
}

/// A response body read to its end, refused once it passes `max` bytes
/// (TUF metadata and targets, CRLs: never held past their cap).
pub(crate) async fn read_capped(
    mut resp: reqwest::Response,
    max: usize,
) -> Result<Vec<u8>, FetchError> {
    let mut body = Vec::new();
    while let Some(chunk) = resp
        .chunk()
        .await
        .map_err(|e| FetchError::Body(error_chain(&e)))?
    {
        if body.len() + chunk.len() > max {
            return Err(FetchError::TooLarge(max));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// SHA-256 of `data`.
pub fn sha256(data: &[u8]) -> [u8; 32] {
    let d = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, data);
    let mut out = [0u8; 32];
    out.copy_from_slice(d.as_ref());
    out
}

fn unix_now() -> i64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

/// Runs every verifier over the gathered signatures. Pure: no I/O.
pub fn evaluate(
    verification: &Verification,
    loaded: &[Loaded],
    artifacts: &Artifacts,
    digest: &str,
    now: i64,
) -> VerificationReport {
    let results = loaded
        .iter()
        .map(|l| {
            let outcome = match &l.check {
                Check::Cosign(c) => run(&artifacts.cosign, |i| {
                    c.check(i, digest, now).map(|()| Vec::new())
                }),
                Check::Notation(n) => run(&artifacts.notation, |e| n.check(e, digest, now)),
                Check::Unavailable(why) => VerifierOutcome::failed(
                    0,
                    vec![SignatureProblem::TrustUnavailable {
                        detail: why.clone(),
                    }],
                ),
            };
            (l.name.clone(), outcome)
        })
        .collect();
    VerificationReport {
        results,
        fetch_failure: None,
        threshold: verification.threshold,
        required: verification.required.clone(),
        signed_at: verification.signed_at,
        platforms: None,
        attestations: Vec::new(),
        found: artifacts
            .cosign
            .iter()
            .map(|i| match i {
                Ok(item) => item.describe(),
                Err(e) => format!("unreadable signature: {e}"),
            })
            .chain(artifacts.notation.iter().map(|e| match e {
                Ok(env) => format!("notation signature ({}, {})", env.alg, env.scheme),
                Err(e) => format!("unreadable notation signature: {e}"),
            }))
            .collect(),
    }
}

fn run<T>(
    items: &[Result<T, ArtifactError>],
    check: impl Fn(&T) -> Result<Vec<String>, SignatureProblem>,
) -> VerifierOutcome {
    let mut problems = Vec::new();
    for item in items {
        match item {
            Ok(i) => match check(i) {
                Ok(logged) => {
                    return VerifierOutcome::Passed {
                        examined: items.len(),
                        logged,
                    };
                }
                Err(p) => problems.push(p),
            },
            Err(e) => problems.push(e.clone().into()),
        }
    }
    VerifierOutcome::failed(items.len(), problems)
}

/// Receives verification events, for metrics.
pub trait Observer: Send + Sync + 'static {
    /// One verifier's result for one digest (`passed`, or a problem kind).
    fn verifier(&self, verifier: &str, result: &str);
    /// A verification was answered from the cache (`hit`) or had to run.
    fn cache(&self, hit: bool);
}

/// Records nothing.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoObserver;

impl Observer for NoObserver {
    fn verifier(&self, _: &str, _: &str) {}
    fn cache(&self, _: bool) {}
}

/// Capacity of the verification cache unless the caller says otherwise.
pub const DEFAULT_CAPACITY: u64 = 50_000;

/// The signature verifier: one per policy load.
pub struct Verifier<S> {
    source: S,
    material: Material,
    cache: Cache<Entry>,
    /// The cache's keys (seeded per verifier).
    keys: Keyer,
    config: CacheConfig,
    observer: Arc<dyn Observer>,
}

impl<S> std::fmt::Debug for Verifier<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Verifier")
            .field("sets", &self.material.len())
            .field("cached", &self.cache.len())
            .finish()
    }
}

impl<S: ArtifactSource + 'static> Verifier<S> {
    /// A verifier for the loaded material, fetching through `source`.
    pub fn new(
        source: S,
        material: Material,
        cache: CacheConfig,
        observer: Arc<dyn Observer>,
    ) -> Self {
        Verifier {
            source,
            material,
            cache: Cache::new(cache.capacity, cache.ttl),
            keys: Keyer::default(),
            config: cache,
            observer,
        }
    }

    /// Verifies without the cache. `image` is where the image itself is
    /// read, when not `repo` (see [`SignatureVerifier::verify`]).
    pub async fn verify_uncached(
        &self,
        repo: &Reference,
        digest: &Digest,
        v: &Verification,
        creds: &PullCredentials,
        image: Option<(&Reference, &PullCredentials)>,
        deadline: Instant,
    ) -> VerificationReport {
        let Some(loaded) = self.material.get(v) else {
            return VerificationReport::unfetched(
                v,
                sigil_core::ResolveFailure::Config {
                    detail: "verifiers of this rule were not loaded (policy changed while the request ran?)".into(),
                },
            );
        };
        let budget = deadline.saturating_duration_since(Instant::now());
        let wanted = gather::Wanted {
            signatures: !v.verifiers.is_empty(),
            attestation_bytes: v.attestations.iter().map(|a| a.max_bytes).max(),
        };
        let gathered = tokio::time::timeout_at(
            deadline.into(),
            gather::gather(&self.source, repo, digest, creds, wanted, deadline),
        )
        .await
        .unwrap_or(Err(sigil_core::ResolveFailure::Timeout { budget }));
        let report = match gathered {
            Ok(a) => {
                let now = unix_now();
                let mut r = evaluate(v, &loaded.verifiers, &a, digest.as_str(), now);
                // One-shot commands have no background CRL fetcher: fetch
                // what the check asked for (within the deadline) and check again.
                let crls = self.material.revocation();
                if r.is_transient() && !crls.is_background() {
                    let fetched =
                        tokio::time::timeout_at(deadline.into(), crls.fetch_due(now)).await;
                    if fetched.is_ok_and(|n| n > 0) {
                        r = evaluate(v, &loaded.verifiers, &a, digest.as_str(), unix_now());
                    }
                }
                // `either` met at the index needs no platform read.
                let settled =
                    v.signed_at == sigil_core::verify::SignedAt::Either && r.signatures_satisfied();
                if v.signed_at.reads_platforms() && !v.verifiers.is_empty() && !settled {
                    let at = platforms::Places {
                        signatures: (repo, creds),
                        image: image.unwrap_or((repo, creds)),
                    };
                    let checked = tokio::time::timeout_at(
                        deadline.into(),
                        platforms::check(&self.source, at, digest, v, &loaded.verifiers, deadline),
                    )
                    .await
                    .unwrap_or(Err(sigil_core::ResolveFailure::Timeout { budget }));
                    match checked {
                        Ok(p) => r.platforms = p,
                        Err(f) => r.fetch_failure = Some(f),
                    }
                }
                match attest::entries_off_workers(
                    v.attestations.clone(),
                    loaded.clone(),
                    a.attestations,
                    repo.name(),
                    digest.as_str().to_owned(),
                    now,
                    deadline,
                )
                .await
                {
                    Ok(entries) => r.attestations = entries,
                    Err(failure) => r.fetch_failure = Some(failure),
                }
                for e in &r.attestations {
                    let result = if e.passed() { "passed" } else { "failed" };
                    self.observer
                        .verifier(&format!("attestation:{}", e.name), result);
                }
                r
            }
            Err(f) => VerificationReport::unfetched(v, f),
        };
        for (name, o) in &report.results {
            let result = match o {
                VerifierOutcome::Passed { .. } => "passed",
                VerifierOutcome::Failed { problem, .. } => problem.kind(),
            };
            self.observer.verifier(name, result);
        }
        report
    }
}

impl<S: ArtifactSource + 'static> SignatureVerifier for Verifier<S> {
    fn verify<'a>(
        &'a self,
        repo: &'a Reference,
        digest: &'a Digest,
        verification: &'a Arc<Verification>,
        creds: &'a PullCredentials,
        image: Option<(&'a Reference, &'a PullCredentials)>,
        deadline: Instant,
    ) -> BoxFuture<'a, Arc<VerificationReport>> {
        // The hit is the common case: its future stays small, and the
        // miss — whose future holds the whole verification — is boxed on
        // its own only when it runs (moving that large state machine into
        // a box on every hit was a measurable memcpy per admission).
        Box::pin(async move {
            let key = self.keys.key(repo, digest, verification, creds);
            if let Some(r) = self.hit(&key, repo, digest, verification, creds) {
                return r;
            }
            self.verify_miss(repo, digest, verification, creds, image, deadline)
                .await
        })
    }

    fn cached(
        &self,
        repo: &Reference,
        digest: &Digest,
        verification: &Arc<Verification>,
        creds: &PullCredentials,
    ) -> Option<Arc<VerificationReport>> {
        let key = self.keys.key(repo, digest, verification, creds);
        self.hit(&key, repo, digest, verification, creds)
    }
}

impl<S: ArtifactSource + 'static> Verifier<S> {
    /// The cached report made for this very check, counted as a hit.
    fn hit(
        &self,
        key: &Key,
        repo: &Reference,
        digest: &Digest,
        verification: &Arc<Verification>,
        creds: &PullCredentials,
    ) -> Option<Arc<VerificationReport>> {
        let r = self
            .cache
            .get_with(key, |e| made_for(e, repo, digest, verification, creds))?;
        self.observer.cache(true);
        Some(r)
    }

    /// A cache miss: one coalesced verification, bounded by the deadline.
    /// Its key is made again (a hash, nothing next to the verification).
    fn verify_miss<'a>(
        &'a self,
        repo: &'a Reference,
        digest: &'a Digest,
        verification: &'a Arc<Verification>,
        creds: &'a PullCredentials,
        image: Option<(&'a Reference, &'a PullCredentials)>,
        deadline: Instant,
    ) -> BoxFuture<'a, Arc<VerificationReport>> {
        Box::pin(async move {
            let key = self.keys.key(repo, digest, verification, creds);
            let budget = deadline.saturating_duration_since(Instant::now());
            let load = || async {
                let r = self
                    .verify_uncached(repo, digest, verification, creds, image, deadline)
                    .await;
                entry(repo, digest, verification, creds, r)
            };
            let ttl_of = |e: &Entry| lifetime(&self.config, &e.report);
            match tokio::time::timeout_at(
                deadline.into(),
                self.cache.get_or_load_for(key, load, ttl_of),
            )
            .await
            {
                Ok((e, loaded)) => match made_for(&e, repo, digest, verification, creds) {
                    Some(r) => {
                        self.observer.cache(!loaded);
                        r
                    }
                    // Another check under the same key (two 64-bit hashes
                    // met): verified here, not cached.
                    None => Arc::new(
                        self.verify_uncached(repo, digest, verification, creds, image, deadline)
                            .await,
                    ),
                },
                Err(_) => Arc::new(VerificationReport::unfetched(
                    verification,
                    sigil_core::ResolveFailure::Timeout { budget },
                )),
            }
        })
    }
}
