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

/// A content digest such as `sha256:2b7…`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Digest(String);

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
        Ok(Digest(s.to_owned()))
    }

    /// Builds a sha256 digest from raw hash bytes.
    pub fn from_sha256(bytes: &[u8; 32]) -> Digest {
        let mut s = String::with_capacity(71);
        s.push_str("sha256:");
        for b in bytes {
            s.push(char::from(HEX[usize::from(b >> 4)]));
            s.push(char::from(HEX[usize::from(b & 0xf)]));
        }
        Digest(s)
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
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Reference {
    domain: String,
    path: String,
    tag: Option<String>,
    digest: Option<Digest>,
}

impl Reference {
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
        Ok(Reference {
            domain: domain.into_owned(),
            path: path.to_owned(),
            tag: tag.map(str::to_owned),
            digest,
        })
    }

    /// Builds a reference from an already-valid name and parts. Used when a
    /// mirror prefix is swapped: both halves were validated before.
    pub fn from_parts(
        name: &str,
        tag: Option<&str>,
        digest: Option<Digest>,
    ) -> Result<Reference, ReferenceError> {
        let mut r = Reference::parse(name)?;
        if r.tag.is_some() || r.digest.is_some() {
            return Err(ReferenceError::InvalidPath(name.to_owned()));
        }
        if let Some(t) = tag
            && !is_tag(t)
        {
            return Err(ReferenceError::InvalidTag(t.to_owned()));
        }
        r.tag = tag.map(str::to_owned);
        r.digest = digest;
        Ok(r)
    }

    /// Registry host, with port if any (`docker.io`, `localhost:5000`, `[::1]:5000`).
    pub fn domain(&self) -> &str {
        &self.domain
    }

    /// Repository path within the registry (`library/nginx`).
    pub fn path(&self) -> &str {
        &self.path
    }

    /// The tag as written, if any.
    pub fn tag(&self) -> Option<&str> {
        self.tag.as_deref()
    }

    /// The tag to resolve: the written one, or `latest` when neither tag nor digest is given.
    pub fn tag_or_latest(&self) -> &str {
        self.tag.as_deref().unwrap_or("latest")
    }

    /// The digest, if the reference is already pinned.
    pub fn digest(&self) -> Option<&Digest> {
        self.digest.as_ref()
    }

    /// `domain/path`, the name policies and mirrors match on.
    pub fn name(&self) -> String {
        let mut s = String::with_capacity(self.domain.len() + 1 + self.path.len());
        s.push_str(&self.domain);
        s.push('/');
        s.push_str(&self.path);
        s
    }

    /// The same reference pinned to `digest`; a missing tag becomes `latest`
    /// so humans can still read which tag was resolved.
    pub fn pinned(&self, digest: Digest) -> Reference {
        Reference {
            domain: self.domain.clone(),
            path: self.path.clone(),
            tag: Some(self.tag_or_latest().to_owned()),
            digest: Some(digest),
        }
    }

    /// The short form Docker prints (`nginx:1.25`), for messages.
    pub fn familiar(&self) -> String {
        let mut s = String::new();
        // A Docker Hub path whose first segment looks like a host would read
        // back as that host, so it keeps `docker.io/` (Go's FamiliarName does
        // not; found by the `reference` fuzz target).
        let first = self.path.split('/').next().unwrap_or_default();
        let ambiguous = first.contains(['.', ':']) || first == "localhost";
        if self.domain == DEFAULT_DOMAIN && !ambiguous {
            // Like Go's familiarizeName: only single-segment official images
            // lose `library/` (`library/a/b` stays, or it would re-parse as `a/b`).
            match self.path.strip_prefix(OFFICIAL_REPO_PREFIX) {
                Some(rest) if !rest.contains('/') => s.push_str(rest),
                _ => s.push_str(&self.path),
            }
        } else {
            s.push_str(&self.domain);
            s.push('/');
            s.push_str(&self.path);
        }
        self.push_suffix(&mut s);
        s
    }

    fn push_suffix(&self, s: &mut String) {
        if let Some(t) = &self.tag {
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
        let mut s = self.name();
        self.push_suffix(&mut s);
        f.write_str(&s)
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
mod tests {
    #[test]
    fn sha256_bytes_round_trip() {
        let d = super::Digest::from_sha256(&[0xab; 32]);
        assert_eq!(d.sha256_bytes(), Some([0xab; 32]));
        let other = super::Digest::parse(&format!("sha512:{}", "0".repeat(128))).unwrap();
        assert_eq!(other.sha256_bytes(), None);
    }

    use super::*;

    const D: &str = "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

    fn norm(s: &str) -> String {
        Reference::parse(s)
            .map(|r| r.to_string())
            .unwrap_or_else(|e| format!("ERR {e}"))
    }

    #[test]
    fn normalizes_like_go_distribution_reference() {
        let cases = [
            ("nginx", "docker.io/library/nginx"),
            ("nginx:1.25", "docker.io/library/nginx:1.25"),
            ("docker.io/nginx", "docker.io/library/nginx"),
            ("index.docker.io/library/nginx", "docker.io/library/nginx"),
            ("index.docker.io/foo/bar", "docker.io/foo/bar"),
            ("foo/bar", "docker.io/foo/bar"),
            ("foo/bar/baz", "docker.io/foo/bar/baz"),
            ("localhost/foo", "localhost/foo"),
            ("localhost:5000/x", "localhost:5000/x"),
            ("localhost:5000/x:v1", "localhost:5000/x:v1"),
            ("127.0.0.1:5000/a/b:c", "127.0.0.1:5000/a/b:c"),
            ("[::1]:5000/x:tag", "[::1]:5000/x:tag"),
            ("[2001:db8::1]/x", "[2001:db8::1]/x"),
            (
                "example.com/a__b/c-d/e--f.g_h",
                "example.com/a__b/c-d/e--f.g_h",
            ),
            ("Foo/bar", "Foo/bar"),
            ("foo:5000", "docker.io/library/foo:5000"),
        ];
        for (input, want) in cases {
            assert_eq!(norm(input), want, "input {input}");
        }
    }

    #[test]
    fn digests_with_and_without_tag() {
        let r = Reference::parse(&format!("nginx@{D}")).unwrap();
        assert_eq!(r.tag(), None);
        assert_eq!(r.digest().unwrap().as_str(), D);
        let r = Reference::parse(&format!("nginx:1.25@{D}")).unwrap();
        assert_eq!(r.tag(), Some("1.25"));
        assert_eq!(r.to_string(), format!("docker.io/library/nginx:1.25@{D}"));
        assert_eq!(r.familiar(), format!("nginx:1.25@{D}"));
    }

    #[test]
    fn rejects_what_go_rejects() {
        let bad = [
            "",
            "Nginx",
            "docker.io/Library/nginx",
            "foo/Bar",
            "a//b",
            "-foo",
            "foo-",
            "foo/.bar",
            "foo..bar",
            "foo:",
            "foo:-tag",
            "foo@sha256:abc",
            "foo@sha256:E3B0C44298FC1C149AFBF4C8996FB92427AE41E4649B934CA495991B7852B855",
            "foo@md5:e3b0c44298fc1c149afbf4c8996fb924",
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
            "exa_mple.com/foo",
            "[::1/foo",
            "[zz]/foo",
            "host:port/foo",
            "foo bar",
            "foo\n",
        ];
        for b in bad {
            assert!(Reference::parse(b).is_err(), "accepted {b:?}");
        }
    }

    #[test]
    fn length_limits() {
        let long = format!("example.com/{}", "a".repeat(NAME_TOTAL_LENGTH_MAX));
        assert_eq!(Reference::parse(&long), Err(ReferenceError::NameTooLong));
        let tag = format!("nginx:{}", "t".repeat(TAG_LENGTH_MAX + 1));
        assert!(matches!(
            Reference::parse(&tag),
            Err(ReferenceError::InvalidTag(_))
        ));
        let tag = format!("nginx:{}", "t".repeat(TAG_LENGTH_MAX));
        assert!(Reference::parse(&tag).is_ok());
    }

    #[test]
    fn pinned_keeps_tag_for_humans() {
        let d = Digest::parse(D).unwrap();
        assert_eq!(
            Reference::parse("nginx")
                .unwrap()
                .pinned(d.clone())
                .to_string(),
            format!("docker.io/library/nginx:latest@{D}")
        );
        assert_eq!(
            Reference::parse("nginx:1").unwrap().pinned(d).familiar(),
            format!("nginx:1@{D}")
        );
    }

    /// Found by the `reference` fuzz target.
    #[test]
    fn familiar_keeps_docker_io_when_the_path_looks_like_a_host() {
        let r = Reference::parse("index.docker.io/ho.sdex.docker.io/ho.sl").unwrap();
        assert_eq!(r.familiar(), "docker.io/ho.sdex.docker.io/ho.sl");
        assert_eq!(Reference::parse(&r.familiar()).unwrap(), r);
    }

    /// Found by the `reference` fuzz target.
    #[test]
    fn familiar_keeps_nested_library_paths() {
        let r = Reference::parse("library/lnlibrary/ln-------os-------os").unwrap();
        assert_eq!(r.familiar(), "library/lnlibrary/ln-------os-------os");
        assert_eq!(Reference::parse(&r.familiar()).unwrap(), r);
    }

    #[test]
    fn reparse_of_display_is_identity() {
        for s in [
            "nginx",
            "a/b:c",
            "localhost:5000/x@sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
            "[::1]:1/a",
        ] {
            let r = Reference::parse(s).unwrap();
            assert_eq!(Reference::parse(&r.to_string()).unwrap(), r);
            assert_eq!(Reference::parse(&r.familiar()).unwrap(), r);
        }
    }

    proptest::proptest! {
        #[test]
        fn parse_never_panics(s in "\\PC{0,300}") {
            let _ = Reference::parse(&s);
        }

        #[test]
        fn valid_refs_roundtrip(
            domain in proptest::option::of("[a-z0-9]{1,10}(\\.[a-z0-9]{1,5}){1,2}(:[0-9]{1,5})?"),
            path in "[a-z0-9]{1,8}((__|[._]|-{1,2})[a-z0-9]{1,5})?(/[a-z0-9]{1,8}){0,3}",
            tag in proptest::option::of("[A-Za-z0-9_][A-Za-z0-9_.-]{0,20}"),
        ) {
            let mut s = String::new();
            if let Some(d) = &domain { s.push_str(d); s.push('/'); }
            s.push_str(&path);
            if let Some(t) = &tag { s.push(':'); s.push_str(t); }
            let r = Reference::parse(&s).unwrap();
            proptest::prop_assert_eq!(r.tag(), tag.as_deref());
            let again = Reference::parse(&r.to_string()).unwrap();
            proptest::prop_assert_eq!(&again, &r);
            proptest::prop_assert_eq!(Reference::parse(&r.familiar()).unwrap(), r);
        }
    }
}
