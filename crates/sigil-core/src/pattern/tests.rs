//! Tests of the pattern language: segment and `**` matching, tags,
//! specificity, and the plain-text path held equal to the segment matcher.

use super::*;

fn m(p: &str, r: &str) -> bool {
    Pattern::parse(p)
        .unwrap()
        .matches(&Reference::parse(r).unwrap())
}

/// The stack split is the allocated one, and a name longer than the
/// stack holds is still split whole.
#[test]
fn segments_from_the_stack_are_the_segments() {
    let deep = format!("r.example/{}", vec!["s"; 20].join("/"));
    for image in ["nginx", "r.example:5000/a/b/c:t", deep.as_str()] {
        let r = Reference::parse(image).unwrap();
        let want = segments_of(&r);
        with_segments(&r, |segs| assert_eq!(segs, want.as_slice(), "{image}"));
    }
    assert!(m("r.example/**/s", &deep));
}

/// A plain-text pattern compared as text says what the segment matcher
/// says, at every boundary: exact names, prefixes that end mid-segment,
/// `**` needing one more segment, tags and digests.
#[test]
fn literal_patterns_match_as_the_segments_do() {
    let names = [
        "a.io/team/app",
        "a.io/team/app:v1",
        "a.io/team",
        "a.io/teamx/app",
        "a.io/team/app/sub",
        "a.io:5000/team/app",
        "b.io/team/app",
        "nginx",
        "docker.io/library/nginx@sha256:0000000000000000000000000000000000000000000000000000000000000000",
    ];
    let patterns = [
        "**",
        "a.io/**",
        "a.io/team/**",
        "a.io/team/app",
        "a.io/team/app:v*",
        "a.io/tea/**",
        "a.io/team/app/**",
        "a.io",
        "nginx",
        "docker.io/**",
        "a.io/*/app",
    ];
    for p in patterns {
        let pat = Pattern::parse(p).unwrap();
        assert_eq!(pat.is_literal(), p != "a.io/*/app", "{p}");
        for n in names {
            let r = Reference::parse(n).unwrap();
            let by_segments = with_segments(&r, |s| pat.matches_segments(&r, s));
            assert_eq!(pat.matches(&r), by_segments, "{p} on {n}");
        }
    }
}

proptest::proptest! {
    /// The same, over generated names and patterns of their segments.
    #[test]
    fn literal_matching_is_segment_matching(
        name in proptest::collection::vec("[ab]{1,2}", 1..5),
        cut in 0usize..6,
        tail in 0u8..3,
    ) {
        let image = format!("x.io/{}", name.join("/"));
        let r = Reference::parse(&image).unwrap();
        let mut segs: Vec<&str> = std::iter::once("x.io").chain(name.iter().map(String::as_str)).collect();
        segs.truncate(cut.min(segs.len()));
        let head = segs.join("/");
        let p = match tail {
            0 if !head.is_empty() => head,
            1 if !head.is_empty() => format!("{head}/**"),
            _ => if head.is_empty() { "**".to_owned() } else { format!("{head}a/**") },
        };
        let pat = Pattern::parse(&p).unwrap();
        proptest::prop_assert!(pat.is_literal());
        let by_segments = with_segments(&r, |s| pat.matches_segments(&r, s));
        proptest::prop_assert_eq!(pat.matches(&r), by_segments, "{} on {}", p, image);
    }
}

#[test]
fn star_stays_in_segment_double_star_crosses() {
    assert!(m(
        "registry.example.com/team/*",
        "registry.example.com/team/app"
    ));
    assert!(!m(
        "registry.example.com/team/*",
        "registry.example.com/team/a/b"
    ));
    assert!(m(
        "registry.example.com/team/**",
        "registry.example.com/team/a/b"
    ));
    assert!(!m(
        "registry.example.com/team/**",
        "registry.example.com/team"
    ));
    assert!(!m(
        "registry.example.com/team/**",
        "registry.example.com/teams/x"
    ));
    assert!(m("**", "nginx"));
    assert!(m("**", "localhost:5000/a/b/c"));
    assert!(m("*.example.com/**", "registry.example.com/x"));
    assert!(m("docker.io/library/nginx-*", "nginx-unprivileged"));
}

#[test]
fn shorthand_patterns_are_normalized() {
    assert_eq!(
        Pattern::parse("nginx").unwrap().normalized(),
        "docker.io/library/nginx"
    );
    assert_eq!(
        Pattern::parse("bitnami/*").unwrap().normalized(),
        "docker.io/bitnami/*"
    );
    assert_eq!(
        Pattern::parse("index.docker.io/x/**").unwrap().normalized(),
        "docker.io/x/**"
    );
    assert!(m("nginx", "docker.io/library/nginx:1"));
    assert!(m("busybox", "index.docker.io/library/busybox"));
}

#[test]
fn tag_globs() {
    assert!(m("nginx:1.*", "nginx:1.25"));
    assert!(!m("nginx:1.*", "nginx:2.0"));
    assert!(m("nginx:latest", "nginx"));
    assert!(!m(
        "nginx:*",
        "nginx@sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
    ));
    assert!(m("localhost:5000/**", "localhost:5000/a/b:t"));
}

#[test]
fn specificity_order() {
    let s = |p: &str| Pattern::parse(p).unwrap().specificity();
    assert!(s("registry.example.com/team/app") > s("registry.example.com/team/**"));
    assert!(s("registry.example.com/team/**") > s("registry.example.com/**"));
    assert!(s("registry.example.com/**") > s("**"));
    assert!(s("docker.io/library/nginx:1.*") > s("docker.io/library/nginx:*"));
    assert!(s("registry.example.com/team/app-*") > s("registry.example.com/team/*"));
    assert!(s("*.internal.example.com/**") > s("**"));
    assert!(s("*/library/*") > s("*/*/*"));
}

#[test]
fn overlap_detection() {
    let o = |a: &str, b: &str| {
        Pattern::parse(a)
            .unwrap()
            .overlaps(&Pattern::parse(b).unwrap())
    };
    assert!(o("**", "a.com/x"));
    assert!(!o("a.com/**", "b.com/**"));
    assert!(o("a.com/*/x", "a.com/y/*"));
    assert!(!o("a.com/x:1.*", "a.com/x:2.*"));
    assert!(o("a.com/**/z", "a.com/q/**"));
    assert!(!o("a.com/foo-*", "a.com/bar-*"));
}

#[test]
fn bad_patterns() {
    for p in [
        "",
        "a.com//x",
        "a.com/x**",
        "a.com/X",
        "a.com/x:",
        "a.com/x y",
    ] {
        assert!(Pattern::parse(p).is_err(), "{p}");
    }
}

#[test]
fn glob_backtracks() {
    assert!(glob_match(b"a*b*c", b"aXbYbZc"));
    assert!(!glob_match(b"a*b*c", b"aXbYbZ"));
    assert!(glob_match(b"*", b""));
}
