//! Container image references, parsed and normalized exactly like Go's
//! `github.com/distribution/reference` (`ParseNormalizedNamed`).
//!
//! This module owns the grammar and the canonical spelling of a reference
//! (`docker.io/library/nginx:1.25@sha256:…`). Everything in sigil that matches,
//! rewrites or resolves an image works on a [`Reference`] produced here, so a
//! policy never sees an unnormalized name. It does not know about mirrors,
//! policies or registries' wire protocol.

use std::fmt;

/// Docker Hub's canonical domain, as Go's library spells it.
pub const DEFAULT_DOMAIN: &str = "docker.io";
pub use crate::dockerhub::{
    DOCKER_HUB_ALIASES, DOCKER_HUB_API_HOST, api_host, canonical_domain, is_docker_hub,
};

const OFFICIAL_REPO_PREFIX: &str = "library/";
/// Longest accepted name (domain + `/` + path), as in Go's `NameTotalLengthMax`.
pub const NAME_TOTAL_LENGTH_MAX: usize = 255;
/// Longest accepted tag (the grammar allows one word character plus 127 more).
pub const TAG_LENGTH_MAX: usize = 128;

/// Why a string is not a valid image reference.
///
/// Messages mirror the Go library's so users can search for them.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReferenceError {
    /// The string was empty.
    #[error("repository name must have at least one component")]
    NameEmpty,
    /// A bare 64-hex string is an image ID, which Go refuses as a name.
    #[error("invalid repository name ({0}), cannot specify 64-byte hexadecimal strings")]
    Identifier(String),
    /// The repository path contained uppercase letters.
    #[error("invalid reference format: repository name ({0}) must be lowercase")]
    Uppercase(String),
    /// The name (domain and path) is longer than 255 characters.
    #[error("repository name must not be more than {NAME_TOTAL_LENGTH_MAX} characters")]
    NameTooLong,
    /// The domain part is not a host name, IPv4 address or bracketed IPv6 address with optional port.
    #[error("invalid reference format: invalid domain {0:?}")]
    InvalidDomain(String),
    /// A path component does not match `[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*`.
    #[error("invalid reference format: invalid path component {0:?}")]
    InvalidPath(String),
    /// The tag does not match `[\w][\w.-]{0,127}`.
    #[error("invalid reference format: invalid tag {0:?}")]
    InvalidTag(String),
    /// The digest algorithm is not one of sha256, sha384, sha512.
    #[error("unsupported digest algorithm {0:?}")]
    UnsupportedDigest(String),
    /// The digest's hex part has the wrong length or is not lowercase hex.
    #[error("invalid checksum digest format {0:?}")]
    InvalidDigest(String),
}

/// A content digest such as `sha256:2b7…`. Shared text: a decision copies
/// each digest into its answers, its signature checks and its verdict.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Digest(std::sync::Arc<str>);

impl Digest {
    /// Parses and validates `algorithm:hex` as the Go `go-digest` package does.
    pub fn parse(s: &str) -> Result<Digest, ReferenceError> {
        let Some((alg, hex)) = s.split_once(':') else {
            return Err(ReferenceError::InvalidDigest(s.to_owned()));
        };
        let want = match alg {
            "sha256" => 64,
            "sha384" => 96,
            "sha512" => 128,
            _ if is_digest_algorithm(alg) => {
                return Err(ReferenceError::UnsupportedDigest(alg.to_owned()));
            }
            _ => return Err(ReferenceError::InvalidDigest(s.to_owned())),
        };
        if hex.len() != want || !hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
            return Err(ReferenceError::InvalidDigest(s.to_owned()));
        }
        Ok(Digest(s.into()))
    }

    /// Builds a sha256 digest from raw hash bytes.
    pub fn from_sha256(bytes: &[u8; 32]) -> Digest {
        // Written on the stack, then one allocation for the shared text.
        let mut s = [0u8; 71];
        s[..7].copy_from_slice(b"sha256:");
        for (i, b) in bytes.iter().enumerate() {
            s[7 + 2 * i] = HEX[usize::from(b >> 4)];
            s[8 + 2 * i] = HEX[usize::from(b & 0xf)];
        }
        // Only ASCII was written.
        Digest(String::from_utf8_lossy(&s).into())
    }

    /// The raw hash of a sha256 digest (`None` for other algorithms), so
    /// caches can hold 32 bytes instead of the 71-byte text.
    pub fn sha256_bytes(&self) -> Option<[u8; 32]> {
        let hex = self.0.strip_prefix("sha256:")?.as_bytes();
        let nibble = |c: u8| match c {
            b'0'..=b'9' => Some(c - b'0'),
            b'a'..=b'f' => Some(c - b'a' + 10),
            _ => None,
        };
        let mut out = [0u8; 32];
        if hex.len() != 64 {
            return None;
        }
        for (o, pair) in out.iter_mut().zip(hex.chunks_exact(2)) {
            *o = (nibble(pair[0])? << 4) | nibble(pair[1])?;
        }
        Some(out)
    }

    /// The algorithm, e.g. `sha256`.
    pub fn algorithm(&self) -> &str {
        self.0.split_once(':').map_or("", |(a, _)| a)
    }

    /// The hex-encoded hash.
    pub fn hex(&self) -> &str {
        self.0.split_once(':').map_or("", |(_, h)| h)
    }

    /// The full `algorithm:hex` form.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

const HEX: &[u8; 16] = b"0123456789abcdef";

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A parsed, normalized image reference.
///
/// Invariant: `domain` and `path` are valid per the grammar, `domain` is never
/// `index.docker.io`, and single-segment Docker Hub paths carry `library/`.
///
/// Held as one text, `domain/path[:tag]`, and where its parts end: a
/// reference is cloned into every decision's answers (a lookup's key, the
/// image it was served by), and one allocation is a third of three. The
/// fields determine each other both ways (a path never holds `:`, a tag is
/// never empty), so the derived equality and hash are the parts'.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Reference {
    /// `domain/path[:tag]`.
    text: Box<str>,
    /// The `/` after the domain.
    domain_end: u32,
    /// The end of the path: the `:` before the tag, or the text's end.
    path_end: u32,
    digest: Option<Digest>,
}

impl fmt::Debug for Reference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Reference")
            .field("domain", &self.domain())
            .field("path", &self.path())
            .field("tag", &self.tag())
            .field("digest", &self.digest)
            .finish()
    }
}

impl Reference {
    /// A reference of parts already valid, in one allocation of its size.
    fn of_parts(domain: &str, path: &str, tag: Option<&str>, digest: Option<Digest>) -> Reference {
        let len = domain.len() + 1 + path.len() + tag.map_or(0, |t| 1 + t.len());
        let mut text = String::with_capacity(len);
        text.push_str(domain);
        text.push('/');
        text.push_str(path);
        let path_end = text.len();
        if let Some(t) = tag {
            text.push(':');
            text.push_str(t);
        }
        // Names are at most 255 bytes and tags 128 (checked before this).
        let at = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
        Reference {
            text: text.into_boxed_str(),
            domain_end: at(domain.len()),
            path_end: at(path_end),
            digest,
        }
    }

    /// Parses and normalizes a reference the way `ParseNormalizedNamed` does.
    pub fn parse(s: &str) -> Result<Reference, ReferenceError> {
        if s.is_empty() {
            return Err(ReferenceError::NameEmpty);
        }
        if s.len() == 64 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
            return Err(ReferenceError::Identifier(s.to_owned()));
        }
        let (domain, remainder) = split_docker_domain(s);
        // Go checks lowercase on everything before the first ':' of the remainder.
        let remote = remainder.split(':').next().unwrap_or_default();
        if remote.bytes().any(|b| b.is_ascii_uppercase()) {
            return Err(ReferenceError::Uppercase(remote.to_owned()));
        }
        let (rest, digest) = match remainder.split_once('@') {
            Some((r, d)) => (r, Some(Digest::parse(d)?)),
            None => (remainder.as_ref(), None),
        };
        let last_slash = rest.rfind('/').map_or(0, |i| i + 1);
        let (path, tag) = match rest[last_slash..].find(':') {
            Some(i) => (&rest[..last_slash + i], Some(&rest[last_slash + i + 1..])),
            None => (rest, None),
        };
        validate_domain(&domain)?;
        if path.is_empty() {
            return Err(ReferenceError::NameEmpty);
        }
        for component in path.split('/') {
            if !is_path_component(component) {
                return Err(ReferenceError::InvalidPath(component.to_owned()));
            }
        }
        if domain.len() + 1 + path.len() > NAME_TOTAL_LENGTH_MAX {
            return Err(ReferenceError::NameTooLong);
        }
        if let Some(t) = tag
            && !is_tag(t)
        {
            return Err(ReferenceError::InvalidTag(t.to_owned()));
        }
        Ok(Reference::of_parts(&domain, path, tag, digest))
    }

    /// Builds a reference from an already-valid name and parts. Used when a
    /// mirror prefix is swapped: both halves were validated before.
    pub fn from_parts(
        name: &str,
        tag: Option<&str>,
        digest: Option<Digest>,
    ) -> Result<Reference, ReferenceError> {
        let r = Reference::parse(name)?;
        if r.tag().is_some() || r.digest.is_some() {
            return Err(ReferenceError::InvalidPath(name.to_owned()));
        }
        if let Some(t) = tag
            && !is_tag(t)
        {
            return Err(ReferenceError::InvalidTag(t.to_owned()));
        }
        Ok(Reference::of_parts(r.domain(), r.path(), tag, digest))
    }

    /// This reference under another prefix: the first `from_len` bytes of
    /// its name (a prefix ending where a segment does) replaced by `to`, a
    /// mirror prefix (`host[/path]`), tag and digest kept. The same answer as
    /// [`Reference::from_parts`] on the new name — `None` where that fails —
    /// but without parsing what is already known valid: the rest of this
    /// name. Only `to` is checked, and the cases where parsing would
    /// normalize the result differently (a Docker Hub or bare host, a name
    /// with no path) take the parse. Mirror rewrites call it per image per
    /// admission.
    pub fn with_prefix(&self, from_len: usize, to: &str) -> Option<Reference> {
        // What follows the prefix in `domain/path`: "/" and the rest of the
        // path from a segment's start (or nothing) in every well-formed call.
        let rest = match from_len.checked_sub(self.domain().len()) {
            Some(0) => Some(self.path()),
            Some(n) => self.path().get(n - 1..).and_then(|tail| {
                if tail.is_empty() {
                    Some("")
                } else {
                    tail.strip_prefix('/')
                }
            }),
            None => None,
        };
        let (host, to_path) = match to.split_once('/') {
            Some((h, p)) => (h, Some(p)),
            None => (to, None),
        };
        let new_path = match (rest, to_path) {
            (Some(""), Some(p)) => Some(std::borrow::Cow::Borrowed(p)),
            (Some(r), Some(p)) => {
                let mut s = String::with_capacity(p.len() + 1 + r.len());
                s.push_str(p);
                s.push('/');
                s.push_str(r);
                Some(std::borrow::Cow::Owned(s))
            }
            (Some(r), None) => Some(std::borrow::Cow::Borrowed(r)),
            (None, _) => None,
        };
        let plain = new_path.as_ref().is_some_and(|p| {
            !p.is_empty()
                && (host == "localhost" || host.contains(['.', ':']))
                && !is_docker_hub(host)
                && host.len() + 1 + p.len() <= NAME_TOTAL_LENGTH_MAX
                && validate_domain(host).is_ok()
                && to_path.is_none_or(|p| p.split('/').all(is_path_component))
        });
        match new_path {
            Some(p) if plain => Some(Reference::of_parts(
                host,
                &p,
                self.tag(),
                self.digest.clone(),
            )),
            // Whatever parsing would make of it: the swapped name, parsed.
            _ => {
                let name = format!("{to}{}", self.name_str().get(from_len..)?);
                Reference::from_parts(&name, self.tag(), self.digest.clone()).ok()
            }
        }
    }

    /// Registry host, with port if any (`docker.io`, `localhost:5000`, `[::1]:5000`).
    pub fn domain(&self) -> &str {
        &self.text[..self.domain_end as usize]
    }

    /// Repository path within the registry (`library/nginx`).
    pub fn path(&self) -> &str {
        &self.text[self.domain_end as usize + 1..self.path_end as usize]
    }

    /// The tag as written, if any.
    pub fn tag(&self) -> Option<&str> {
        self.text.get(self.path_end as usize + 1..)
    }

    /// The tag to resolve: the written one, or `latest` when neither tag nor digest is given.
    pub fn tag_or_latest(&self) -> &str {
        self.tag().unwrap_or("latest")
    }

    /// The digest, if the reference is already pinned.
    pub fn digest(&self) -> Option<&Digest> {
        self.digest.as_ref()
    }

    /// `domain/path`, the name policies and mirrors match on.
    pub fn name(&self) -> String {
        self.name_str().to_owned()
    }

    /// [`Self::name`], borrowed.
    pub fn name_str(&self) -> &str {
        &self.text[..self.path_end as usize]
    }

    /// The same reference pinned to `digest`; a missing tag becomes `latest`
    /// so humans can still read which tag was resolved.
    pub fn pinned(&self, digest: Digest) -> Reference {
        Reference::of_parts(
            self.domain(),
            self.path(),
            Some(self.tag_or_latest()),
            Some(digest),
        )
    }

    /// `self.pinned(digest).to_string()`, written once into a string of its
    /// size: the image a mirror rewrite writes back, per image per admission
    /// (the `Reference` in between was four allocations and two regrowths).
    pub fn pinned_string(&self, digest: &Digest) -> String {
        let tag = self.tag_or_latest();
        let len = self.path_end as usize + tag.len() + digest.as_str().len() + 2;
        let mut s = String::with_capacity(len);
        // Writing to a `String` cannot fail.
        let _ = self.write_parts(&mut s, Some(tag), Some(digest));
        s
    }

    /// `domain/path[:tag][@digest]`: the canonical form ([`fmt::Display`])
    /// and [`Self::pinned_string`] both write it.
    fn write_parts(
        &self,
        w: &mut impl fmt::Write,
        tag: Option<&str>,
        digest: Option<&Digest>,
    ) -> fmt::Result {
        w.write_str(self.name_str())?;
        if let Some(t) = tag {
            w.write_str(":")?;
            w.write_str(t)?;
        }
        if let Some(d) = digest {
            w.write_str("@")?;
            w.write_str(d.as_str())?;
        }
        Ok(())
    }

    /// The short form Docker prints (`nginx:1.25`), for messages.
    pub fn familiar(&self) -> String {
        let mut s = String::new();
        // A Docker Hub path whose first segment looks like a host would read
        // back as that host, so it keeps `docker.io/` (Go's FamiliarName does
        // not; found by the `reference` fuzz target).
        let first = self.path().split('/').next().unwrap_or_default();
        let ambiguous = first.contains(['.', ':']) || first == "localhost";
        if self.domain() == DEFAULT_DOMAIN && !ambiguous {
            // Like Go's familiarizeName: only single-segment official images
            // lose `library/` (`library/a/b` stays, or it would re-parse as `a/b`).
            match self.path().strip_prefix(OFFICIAL_REPO_PREFIX) {
                Some(rest) if !rest.contains('/') => s.push_str(rest),
                _ => s.push_str(self.path()),
            }
        } else {
            s.push_str(self.name_str());
        }
        self.push_suffix(&mut s);
        s
    }

    fn push_suffix(&self, s: &mut String) {
        if let Some(t) = self.tag() {
            s.push(':');
            s.push_str(t);
        }
        if let Some(d) = &self.digest {
            s.push('@');
            s.push_str(d.as_str());
        }
    }
}

impl fmt::Display for Reference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.write_parts(f, self.tag(), self.digest.as_ref())
    }
}

impl std::str::FromStr for Reference {
    type Err = ReferenceError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Reference::parse(s)
    }
}

/// Splits a reference into domain and remainder the way Go's `splitDockerDomain` does.
fn split_docker_domain(s: &str) -> (std::borrow::Cow<'_, str>, std::borrow::Cow<'_, str>) {
    use std::borrow::Cow;
    let (domain, remote): (Cow<'_, str>, Cow<'_, str>) = match s.split_once('/') {
        None => {
            return (
                Cow::Borrowed(DEFAULT_DOMAIN),
                Cow::Owned(format!("{OFFICIAL_REPO_PREFIX}{s}")),
            );
        }
        Some((d, r)) if d == "localhost" => (Cow::Borrowed(d), Cow::Borrowed(r)),
        Some((d, r)) if is_docker_hub(d) => (Cow::Borrowed(DEFAULT_DOMAIN), Cow::Borrowed(r)),
        Some((d, r)) if d.contains(['.', ':']) => (Cow::Borrowed(d), Cow::Borrowed(r)),
        Some((d, r)) if d.bytes().any(|b| b.is_ascii_uppercase()) => {
            (Cow::Borrowed(d), Cow::Borrowed(r))
        }
        Some(_) => (Cow::Borrowed(DEFAULT_DOMAIN), Cow::Borrowed(s)),
    };
    if domain == DEFAULT_DOMAIN && !remote.contains('/') {
        return (
            domain,
            Cow::Owned(format!("{OFFICIAL_REPO_PREFIX}{remote}")),
        );
    }
    (domain, remote)
}

/// `host[:port]` where host is a domain name, IPv4 address or `[IPv6]`.
pub fn validate_domain(d: &str) -> Result<(), ReferenceError> {
    let bad = || ReferenceError::InvalidDomain(d.to_owned());
    let (host, port) = if let Some(rest) = d.strip_prefix('[') {
        let end = rest.find(']').ok_or_else(bad)?;
        let v6 = &rest[..end];
        if v6.is_empty() || !v6.bytes().all(|b| b.is_ascii_hexdigit() || b == b':') {
            return Err(bad());
        }
        let after = &rest[end + 1..];
        match after.strip_prefix(':') {
            Some(p) => (None, Some(p)),
            None if after.is_empty() => (None, None),
            None => return Err(bad()),
        }
    } else {
        match d.split_once(':') {
            Some((h, p)) => (Some(h), Some(p)),
            None => (Some(d), None),
        }
    };
    if let Some(p) = port
        && (p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit()))
    {
        return Err(bad());
    }
    if let Some(h) = host
        && (h.is_empty() || !h.split('.').all(is_domain_component))
    {
        return Err(bad());
    }
    Ok(())
}

fn is_domain_component(c: &str) -> bool {
    let b = c.as_bytes();
    !b.is_empty()
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter().all(|&x| x.is_ascii_alphanumeric() || x == b'-')
}

/// `[a-z0-9]+(?:(?:[._]|__|[-]+)[a-z0-9]+)*`
pub fn is_path_component(c: &str) -> bool {
    let b = c.as_bytes();
    let alnum = |x: u8| x.is_ascii_lowercase() || x.is_ascii_digit();
    if b.is_empty() || !alnum(b[0]) || !alnum(b[b.len() - 1]) {
        return false;
    }
    let mut i = 0;
    while i < b.len() {
        if alnum(b[i]) {
            i += 1;
            continue;
        }
        // A separator run: ".", "_", "__", or one or more "-".
        let start = i;
        while i < b.len() && !alnum(b[i]) {
            i += 1;
        }
        let sep = &b[start..i];
        let ok = matches!(sep, b"." | b"_" | b"__") || sep.iter().all(|&x| x == b'-');
        if !ok {
            return false;
        }
    }
    true
}

/// `[\w][\w.-]{0,127}`
pub fn is_tag(t: &str) -> bool {
    let b = t.as_bytes();
    let word = |x: u8| x.is_ascii_alphanumeric() || x == b'_';
    !b.is_empty()
        && b.len() <= TAG_LENGTH_MAX
        && word(b[0])
        && b.iter().all(|&x| word(x) || x == b'.' || x == b'-')
}

fn is_digest_algorithm(a: &str) -> bool {
    !a.is_empty()
        && a.split(['+', '.', '-', '_']).all(|c| {
            let b = c.as_bytes();
            !b.is_empty() && b[0].is_ascii_alphabetic() && b.iter().all(u8::is_ascii_alphanumeric)
        })
}

#[cfg(test)]
mod tests;
