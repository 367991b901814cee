//! Tests of the reference grammar: Go's normalization cases, round trips,
//! and the mirror prefix swap held equal to parsing the swapped name.

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
        Reference::parse("nginx:1")
            .unwrap()
            .pinned(d.clone())
            .familiar(),
        format!("nginx:1@{D}")
    );
    let by_digest = format!("r.example:5000/a/b:t@{D}");
    for image in ["nginx", "nginx:1", by_digest.as_str()] {
        let r = Reference::parse(image).unwrap();
        assert_eq!(
            r.pinned_string(&d),
            r.pinned(d.clone()).to_string(),
            "{image}"
        );
    }
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
        proptest::prop_assert_eq!(Reference::parse(&r.familiar()).unwrap(), r.clone());
        let d = Digest::parse(D).unwrap();
        proptest::prop_assert_eq!(r.pinned_string(&d), r.pinned(d).to_string());
    }
}

/// The old swap: the new name formatted and parsed again.
fn swapped_by_parsing(r: &Reference, from_len: usize, to: &str) -> Option<Reference> {
    let name = r.name();
    let new_name = format!("{to}{}", name.get(from_len..)?);
    Reference::from_parts(&new_name, r.tag(), r.digest().cloned()).ok()
}

#[test]
fn with_prefix_normalizes_as_parsing_the_swapped_name_does() {
    let d = "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
    for (image, from, to) in [
        (
            "registry.example.com/team/app:v1",
            "registry.example.com/team",
            "mirror.example.com/team",
        ),
        (
            "registry.example.com/team/app:v1",
            "registry.example.com",
            "mirror.example.com",
        ),
        (
            "registry.example.com/team/app",
            "registry.example.com/team/app",
            "mirror.example.com/x",
        ),
        // A mirror that is a bare host and an image that is the whole prefix:
        // parsing reads the host as a Docker Hub name.
        (
            "registry.example.com/team",
            "registry.example.com/team",
            "mirror.example.com",
        ),
        // Docker Hub as the mirror: a one-segment path gains `library/`.
        ("quay.io/nginx:1", "quay.io", "docker.io"),
        ("quay.io/org/nginx:1", "quay.io/org", "docker.io"),
        ("nginx:1.25", "docker.io/library", "localhost:5000/hub"),
        ("nginx:1.25", "docker.io", "[::1]:5000"),
        (
            &format!("ghcr.io/a/b:c@{d}"),
            "ghcr.io/a",
            "mirror.example.com:443/ghcr/a",
        ),
        // Too long once swapped.
        (
            "ghcr.io/a/b",
            "ghcr.io",
            &format!("mirror.example.com/{}", "p".repeat(250)),
        ),
        // Not a segment boundary, out of range: what parsing makes of it.
        ("ghcr.io/ab/c", "ghcr.io/a", "mirror.example.com"),
        ("ghcr.io/ab/c", "ghcr", "mirror.example.com"),
        ("ghcr.io/ab/c", "ghcr.io/ab/c/d/e", "mirror.example.com"),
        // A `to` no mirror prefix could be: uppercase host, bad component.
        ("ghcr.io/a/b", "ghcr.io", "MIRROR/x"),
        ("ghcr.io/a/b", "ghcr.io", "mirror.example.com/X"),
        ("ghcr.io/a/b", "ghcr.io", "mirror.example.com//x"),
        ("ghcr.io/a/b", "ghcr.io", "bad..host/x"),
    ] {
        let r = Reference::parse(image).unwrap();
        assert_eq!(
            r.with_prefix(from.len(), to),
            swapped_by_parsing(&r, from.len(), to),
            "{image} from {from} to {to}"
        );
    }
}

proptest::proptest! {
    #[test]
    fn with_prefix_equals_parsing_the_swapped_name(
        image in "([a-z0-9]{1,6}(\\.[a-z]{1,3})?(:[0-9]{1,4})?/)?[a-z0-9]{1,5}(/[a-z0-9]{1,5}){0,3}(:[a-z0-9]{1,4})?",
        cut in 0usize..40,
        to in "(localhost|docker\\.io|index\\.docker\\.io|[a-zA-Z0-9]{1,6}(\\.[a-z]{1,3})?(:[0-9]{1,4})?)(/[a-zA-Z0-9._-]{1,6}){0,2}",
    ) {
        let r = Reference::parse(&image).unwrap();
        let name = r.name();
        // Every segment boundary of the name, and every other byte offset.
        for from_len in [cut, name.len()].into_iter().chain(name.match_indices('/').map(|(i, _)| i)) {
            proptest::prop_assert_eq!(
                r.with_prefix(from_len, &to),
                swapped_by_parsing(&r, from_len, &to),
                "{} at {} to {}", name, from_len, to
            );
        }
    }
}
