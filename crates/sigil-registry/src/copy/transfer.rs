//! The distribution-protocol requests of a copy, against one repository:
//! manifests read and written whole (they are small, and their digest is
//! checked), blobs checked with HEAD, mounted across repositories of one
//! registry, or streamed from the origin's GET into the mirror's PUT — a
//! blob is never held whole in memory, and every chunk in flight holds
//! permits of the process-wide byte budget until the mirror has taken it.
//!
//! Owns authentication for requests with bodies (the last good
//! `Authorization` is reused, since a streamed body cannot be replayed after
//! a 401) and the words of a refused push. It does not decide what to copy
//! or in which order ([`super::walk`]).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::{Stream, StreamExt as _};
use http::{HeaderValue, Method, StatusCode, header};
use sha2::{Digest as _, Sha256};
use sigil_core::credentials::{ANONYMOUS, Credential};
use sigil_core::reference::api_host;
use sigil_core::{Digest, Reference, ResolveFailure};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::Inner;
use crate::auth::{Challenge, parse_challenge};
use crate::client::{HostClient, Lookup, read_limited, transport_failure};
use crate::response::error_detail;

/// How long one request without a streamed body may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

/// Media types read when copying a manifest: every kind a lookup accepts,
/// plus the ones signatures and attestations are stored as.
const COPY_ACCEPT: &str = "application/vnd.oci.image.index.v1+json, application/vnd.docker.distribution.manifest.list.v2+json, application/vnd.oci.image.manifest.v1+json, application/vnd.docker.distribution.manifest.v2+json, application/vnd.oci.artifact.manifest.v1+json";

/// One repository on one registry, with the credential and scope a copy
/// uses there.
pub(crate) struct Repo<'a> {
    pub(crate) inner: &'a Inner,
    /// The repository (its tag or digest is not used).
    pub(crate) at: Reference,
    pub(crate) credential: Option<Credential>,
    /// `repository:<path>:pull` at the origin, `…:pull,push` (plus the
    /// origin's pull scope when blobs are mounted) at the mirror.
    pub(crate) scope: String,
    /// The last `Authorization` that was accepted, for requests with bodies.
    auth: std::sync::Mutex<Option<String>>,
}

/// Where an upload stands after it was started.
pub(crate) enum Upload {
    /// Mounted from the origin's repository: nothing to send.
    Mounted,
    /// Send the blob to this URL.
    At(reqwest::Url),
}

impl<'a> Repo<'a> {
    pub(crate) fn new(
        inner: &'a Inner,
        at: Reference,
        credential: Option<Credential>,
        scope: String,
    ) -> Repo<'a> {
        Repo {
            inner,
            at,
            credential,
            scope,
            auth: std::sync::Mutex::new(None),
        }
    }

    fn host(&self) -> &'a HostClient {
        self.inner.hosts.get(self.at.domain())
    }

    fn url(&self, rest: &str) -> String {
        format!(
            "{}://{}/v2/{}/{rest}",
            self.host().scheme,
            api_host(self.at.domain()),
            self.at.path()
        )
    }

    /// Sends one request; a 401 on a request without a body is answered
    /// (Basic, or a token for the scope) and the request sent once more.
    async fn send(
        &self,
        method: Method,
        url: &str,
        content_type: Option<&str>,
        mut body: Option<(reqwest::Body, u64)>,
        timeout: Option<Duration>,
    ) -> Result<reqwest::Response, ResolveFailure> {
        let domain = self.at.domain();
        let identity = self
            .credential
            .as_ref()
            .map_or(ANONYMOUS, Credential::identity);
        let remembered = self.auth.lock().ok().and_then(|a| a.clone());
        let mut auth = remembered.or_else(|| {
            self.inner
                .tokens
                .get(domain, &self.scope, identity)
                .map(|t| format!("Bearer {t}"))
        });
        let mut answered = false;
        loop {
            let mut rb = self.host().http()?.request(method.clone(), url);
            if method != Method::PUT && method != Method::POST {
                rb = rb.header(header::ACCEPT, COPY_ACCEPT);
            }
            if let Some(t) = timeout {
                rb = rb.timeout(t);
            }
            if let Some(ct) = content_type {
                rb = rb.header(header::CONTENT_TYPE, ct);
            }
            if let Some(a) = &auth {
                let mut v = HeaderValue::from_str(a).map_err(|_| ResolveFailure::Config {
                    detail: "credentials contain characters not allowed in a header".into(),
                })?;
                v.set_sensitive(true);
                rb = rb.header(header::AUTHORIZATION, v);
            }
            let replayable = body.is_none();
            if let Some((b, len)) = body.take() {
                // Stated, so registries that refuse chunked uploads take it.
                rb = rb.header(header::CONTENT_LENGTH, len).body(b);
            } else if method == Method::PUT || method == Method::POST {
                rb = rb.header(header::CONTENT_LENGTH, 0);
            }
            let started = Instant::now();
            let res = rb.send().await.map_err(|e| {
                self.inner
                    .observer
                    .request(domain, method.as_str(), "error", started.elapsed());
                transport_failure(&e, REQUEST_TIMEOUT)
            })?;
            self.inner.observer.request(
                domain,
                method.as_str(),
                res.status().as_str(),
                started.elapsed(),
            );
            if res.status() != StatusCode::UNAUTHORIZED || answered || !replayable {
                if res.status().is_success()
                    && let Ok(mut a) = self.auth.lock()
                {
                    a.clone_from(&auth);
                }
                return Ok(res);
            }
            answered = true;
            let challenge = res
                .headers()
                .get(header::WWW_AUTHENTICATE)
                .and_then(|v| v.to_str().ok())
                .and_then(parse_challenge);
            auth = match challenge {
                Some(Challenge::Basic) => match &self.credential {
                    Some(c) => Some(c.basic_header().to_string()),
                    None => return Ok(res),
                },
                Some(Challenge::Bearer { realm, service, .. }) => {
                    let lookup = Lookup {
                        host: self.host(),
                        permits: self.inner.hosts.permits(domain),
                        credential: self.credential.as_ref(),
                        tokens: &self.inner.tokens,
                        schemes: &self.inner.schemes,
                        observer: self.inner.observer.as_ref(),
                        deadline: Instant::now() + REQUEST_TIMEOUT,
                        budget: REQUEST_TIMEOUT,
                    };
                    // The scope asked for is the copy's own (pull and push, or
                    // two repositories), not the one the challenge names.
                    let (token, ttl) = lookup
                        .fetch_token(
                            domain,
                            &realm,
                            service.as_deref(),
                            &self.scope,
                            self.credential.as_ref(),
                        )
                        .await?;
                    self.inner
                        .tokens
                        .put(domain, &self.scope, identity, token.clone(), ttl);
                    Some(format!("Bearer {token}"))
                }
                None => return Ok(res),
            };
        }
    }

    /// A manifest and its media type; `None` when the registry has none.
    pub(crate) async fn manifest(
        &self,
        reference: &str,
    ) -> Result<Option<(Vec<u8>, String)>, ResolveFailure> {
        let url = self.url(&format!("manifests/{reference}"));
        let res = self
            .send(Method::GET, &url, None, None, Some(REQUEST_TIMEOUT))
            .await?;
        let status = res.status();
        let media_type = res
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(|s| s.split(';').next().unwrap_or(s).trim().to_owned());
        let body = read_limited(res, REQUEST_TIMEOUT).await?;
        match status {
            StatusCode::OK => {}
            StatusCode::NOT_FOUND => return Ok(None),
            s => return Err(refused(&format!("reading manifest {reference}"), s, &body)),
        }
        let media_type = media_type
            .filter(|m| m.contains("manifest") || m.contains("index"))
            .or_else(|| {
                serde_json::from_slice::<serde_json::Value>(&body)
                    .ok()?
                    .get("mediaType")?
                    .as_str()
                    .map(str::to_owned)
            })
            .unwrap_or_else(|| "application/vnd.oci.image.manifest.v1+json".to_owned());
        Ok(Some((body, media_type)))
    }

    /// The referrers index of `digest`; `None` without the referrers API.
    pub(crate) async fn referrers(
        &self,
        digest: &Digest,
    ) -> Result<Option<Vec<u8>>, ResolveFailure> {
        let url = self.url(&format!("referrers/{digest}"));
        let res = self
            .send(Method::GET, &url, None, None, Some(REQUEST_TIMEOUT))
            .await?;
        let status = res.status();
        let body = read_limited(res, REQUEST_TIMEOUT).await?;
        match status {
            StatusCode::OK => Ok(Some(body)),
            // No API (distribution 2.x), or a proxy in front that refuses it.
            StatusCode::NOT_FOUND | StatusCode::METHOD_NOT_ALLOWED => Ok(None),
            s => Err(refused(&format!("listing referrers of {digest}"), s, &body)),
        }
    }

    /// Whether the repository has a manifest or blob (`kind` is `manifests`
    /// or `blobs`).
    pub(crate) async fn has(&self, kind: &str, digest: &Digest) -> Result<bool, ResolveFailure> {
        let url = self.url(&format!("{kind}/{digest}"));
        let res = self
            .send(Method::HEAD, &url, None, None, Some(REQUEST_TIMEOUT))
            .await?;
        match res.status() {
            StatusCode::OK => Ok(true),
            StatusCode::NOT_FOUND => Ok(false),
            s => Err(refused(&format!("checking {kind} {digest}"), s, &[])),
        }
    }

    /// Writes a manifest (by digest or tag) exactly as read from the origin.
    pub(crate) async fn put_manifest(
        &self,
        reference: &str,
        body: &[u8],
        media_type: &str,
    ) -> Result<(), ResolveFailure> {
        let url = self.url(&format!("manifests/{reference}"));
        let res = self
            .send(
                Method::PUT,
                &url,
                Some(media_type),
                Some((reqwest::Body::from(body.to_vec()), body.len() as u64)),
                Some(REQUEST_TIMEOUT),
            )
            .await?;
        let status = res.status();
        if status.is_success() {
            return Ok(());
        }
        let body = read_limited(res, REQUEST_TIMEOUT).await.unwrap_or_default();
        Err(refused(
            &format!("pushing manifest {reference}"),
            status,
            &body,
        ))
    }

    /// Starts an upload of `digest`: mounted from `from` (a repository on
    /// the same registry) when it allows, else an upload URL to send to.
    pub(crate) async fn start_upload(
        &self,
        digest: &Digest,
        from: Option<&str>,
    ) -> Result<Upload, ResolveFailure> {
        let rest = match from {
            Some(repo) => format!("blobs/uploads/?mount={digest}&from={repo}"),
            None => "blobs/uploads/".to_owned(),
        };
        let url = self.url(&rest);
        let res = self
            .send(Method::POST, &url, None, None, Some(REQUEST_TIMEOUT))
            .await?;
        let status = res.status();
        if status == StatusCode::CREATED && from.is_some() {
            return Ok(Upload::Mounted);
        }
        if status != StatusCode::ACCEPTED {
            let body = read_limited(res, REQUEST_TIMEOUT).await.unwrap_or_default();
            return Err(refused(
                &format!("starting the upload of blob {digest}"),
                status,
                &body,
            ));
        }
        let location = res
            .headers()
            .get(header::LOCATION)
            .and_then(|v| v.to_str().ok())
            .ok_or_else(|| ResolveFailure::BadResponse {
                detail: format!(
                    "the mirror started the upload of blob {digest} without a Location"
                ),
            })?;
        let base = reqwest::Url::parse(&url).map_err(|e| ResolveFailure::Config {
            detail: format!("upload URL {url}: {e}"),
        })?;
        let mut at = base
            .join(location)
            .map_err(|e| ResolveFailure::BadResponse {
                detail: format!("upload Location {location:?}: {e}"),
            })?;
        // Only where the registry said: an upload URL on another host would
        // carry the push credential there.
        if at.host_str() != base.host_str()
            || at.port_or_known_default() != base.port_or_known_default()
        {
            return Err(ResolveFailure::BadResponse {
                detail: format!(
                    "the mirror sent the upload of blob {digest} to another host ({location}); sigil does not send credentials there"
                ),
            });
        }
        at.query_pairs_mut().append_pair("digest", digest.as_str());
        Ok(Upload::At(at))
    }

    /// Finishes an upload with one streamed PUT of `len` bytes.
    pub(crate) async fn finish_upload(
        &self,
        at: reqwest::Url,
        digest: &Digest,
        len: u64,
        body: reqwest::Body,
    ) -> Result<(), ResolveFailure> {
        let res = self
            .send(
                Method::PUT,
                at.as_str(),
                Some("application/octet-stream"),
                Some((body, len)),
                Some(upload_timeout(len)),
            )
            .await?;
        let status = res.status();
        if status == StatusCode::CREATED || status == StatusCode::NO_CONTENT {
            return Ok(());
        }
        let body = read_limited(res, REQUEST_TIMEOUT).await.unwrap_or_default();
        Err(refused(&format!("uploading blob {digest}"), status, &body))
    }

    /// Opens a blob for streaming; its length when the registry says.
    pub(crate) async fn open_blob(
        &self,
        digest: &Digest,
    ) -> Result<(reqwest::Response, Option<u64>), ResolveFailure> {
        let url = self.url(&format!("blobs/{digest}"));
        let res = self.send(Method::GET, &url, None, None, None).await?;
        let status = res.status();
        if status != StatusCode::OK {
            let body = read_limited(res, REQUEST_TIMEOUT).await.unwrap_or_default();
            return Err(refused(&format!("reading blob {digest}"), status, &body));
        }
        let len = res.content_length();
        Ok((res, len))
    }
}

/// How long one blob upload may take: a minute, plus a second per MiB (a
/// mirror that takes less than 1 MiB/s is treated as stalled; a stalled
/// origin fails sooner, after 30 s without a byte).
fn upload_timeout(len: u64) -> Duration {
    REQUEST_TIMEOUT + Duration::from_secs(len >> 20)
}

/// A registry's refusal of one step, in words that say what to fix.
fn refused(what: &str, status: StatusCode, body: &[u8]) -> ResolveFailure {
    let detail = error_detail(body).unwrap_or_else(|| {
        status
            .canonical_reason()
            .unwrap_or("no reason given")
            .to_lowercase()
    });
    match status {
        StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => ResolveFailure::Unauthorized {
            status: status.as_u16(),
            detail: format!(
                "{what}: {detail} (a mirror needs push credentials: registries[].pushAuth or auth for its host)"
            ),
        },
        StatusCode::NOT_FOUND => ResolveFailure::NotFound {
            detail: format!("{what}: {detail}"),
        },
        s => ResolveFailure::Status {
            status: s.as_u16(),
            detail: format!("{what}: {detail}"),
        },
    }
}

/// A chunk that holds its share of the byte budget until the mirror's
/// connection has taken it (the permit is released when the bytes drop).
struct Held {
    bytes: Bytes,
    _permit: OwnedSemaphorePermit,
}

impl AsRef<[u8]> for Held {
    fn as_ref(&self) -> &[u8] {
        &self.bytes
    }
}

/// The origin's blob as a stream for the mirror's PUT: each chunk waits for
/// its bytes in the budget, the content is hashed on the way, and a blob
/// that does not hash to `digest` (or is not `len` bytes) ends in an error,
/// so the mirror never commits it.
pub(crate) fn guarded(
    res: reqwest::Response,
    digest: Digest,
    len: u64,
    budget: Arc<Semaphore>,
    cap: usize,
    moved: Arc<AtomicU64>,
) -> impl Stream<Item = Result<Bytes, std::io::Error>> + Send + 'static {
    struct State<S> {
        inner: S,
        hasher: Sha256,
        seen: u64,
        done: bool,
    }
    let state = State {
        inner: res.bytes_stream(),
        hasher: Sha256::new(),
        seen: 0,
        done: false,
    };
    futures_util::stream::unfold(state, move |mut st| {
        let budget = budget.clone();
        let digest = digest.clone();
        let moved = moved.clone();
        async move {
            if st.done {
                return None;
            }
            match st.inner.next().await {
                Some(Ok(chunk)) => {
                    st.seen += chunk.len() as u64;
                    if st.seen > len {
                        st.done = true;
                        return Some((
                            Err(bad(format!("blob {digest} is longer than {len} bytes"))),
                            st,
                        ));
                    }
                    st.hasher.update(&chunk);
                    // The last chunk is held back unless the whole blob hashes
                    // right, so the mirror never receives all of a bad blob.
                    if st.seen == len {
                        st.done = true;
                        if let Err(e) = check(&mut st.hasher, &digest, len) {
                            return Some((Err(e), st));
                        }
                    }
                    let n = chunk.len().clamp(1, cap) as u32;
                    let Ok(permit) = budget.acquire_many_owned(n).await else {
                        st.done = true;
                        return Some((Err(bad("the copy budget was closed".into())), st));
                    };
                    moved.fetch_add(chunk.len() as u64, Ordering::Relaxed);
                    let held = Bytes::from_owner(Held {
                        bytes: chunk,
                        _permit: permit,
                    });
                    Some((Ok(held), st))
                }
                Some(Err(e)) => {
                    st.done = true;
                    Some((Err(bad(format!("reading blob {digest}: {e}"))), st))
                }
                // The end, short of `len` (a whole blob ends above), or empty.
                None => {
                    st.done = true;
                    let end = if st.seen == len {
                        check(&mut st.hasher, &digest, len).err()
                    } else {
                        Some(bad(format!(
                            "the origin ended blob {digest} after {} of {len} bytes",
                            st.seen
                        )))
                    };
                    end.map(|e| (Err(e), st))
                }
            }
        }
    })
}

/// Whether what was hashed is `digest`.
fn check(hasher: &mut Sha256, digest: &Digest, len: u64) -> Result<(), std::io::Error> {
    let got = Digest::from_sha256(&std::mem::take(hasher).finalize().into());
    if got == *digest {
        return Ok(());
    }
    Err(bad(format!(
        "the origin served {len} bytes hashing to {got} for blob {digest}"
    )))
}

fn bad(detail: String) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, detail)
}
