//! Several mirrors per origin, fallback to the origin and requireSameDigest:
//! what the policy file accepts and what a plan carries (a digest moved to
//! a mirror included).

use super::*;

fn policy(mirrors: &str) -> Result<Policy, PolicyError> {
    Policy::from_yaml(&format!(
        "apiVersion: sigil.dev/v1alpha1\nkind: ImagePolicy\nspec:\n  mirrors:\n{mirrors}  rules:\n  - {{name: all, match: ['**']}}\n"
    ))
}

#[test]
fn to_takes_one_mirror_or_several_in_order() {
    let one = policy("  - {from: docker.io, to: m.local/hub}\n").unwrap();
    let p = one.plan("nginx:1").unwrap();
    assert_eq!(p.target.to_string(), "m.local/hub/library/nginx:1");
    assert!(p.failover.is_none(), "one mirror, no fallback: as before");

    let two =
        policy("  - {from: docker.io, to: [a.local/hub, b.local:5000/hub], fallback: origin}\n")
            .unwrap();
    let p = two.plan("nginx:1").unwrap();
    assert_eq!(p.target.to_string(), "a.local/hub/library/nginx:1");
    let f = p.failover.as_ref().unwrap();
    assert_eq!(
        f.alternates_of(&p.origin)
            .map(|a| a.to_string())
            .collect::<Vec<_>>(),
        ["b.local:5000/hub/library/nginx:1"]
    );
    assert!(f.resolves_origin());
    assert_eq!(p.origin.to_string(), "docker.io/library/nginx:1");
    assert!(
        Arc::ptr_eq(f, two.plan("nginx:2").unwrap().failover.as_ref().unwrap()),
        "one failover per mirror, shared by its plans"
    );
    assert!(
        f.fallback && f.require_same_digest,
        "requireSameDigest defaults on with fallback"
    );
    // A name under either mirror reads back as the origin (rules match it).
    let b = two.origin_of(&Reference::parse("b.local:5000/hub/library/nginx:1").unwrap());
    assert_eq!(b.to_string(), "docker.io/library/nginx:1");
    // Pinned by a failover already: kept where it was served (idempotent).
    let d = format!("sha256:{}", "c".repeat(64));
    let at_b = format!("b.local:5000/hub/library/nginx:1@{d}");
    let p = two.plan(&at_b).unwrap();
    assert_eq!(p.step, Step::Keep);
    assert_eq!(p.final_image(None), at_b);
    let at_origin = format!("docker.io/library/nginx:1@{d}");
    assert_eq!(two.plan(&at_origin).unwrap().final_image(None), at_origin);
    let s = two.describe();
    assert!(
        s.contains("else from b.local:5000/hub/…") && s.contains("fallback: origin"),
        "{s}"
    );

    let strict =
        policy("  - {from: docker.io, to: a.local/hub, requireSameDigest: true}\n").unwrap();
    let f = strict.plan("nginx:1").unwrap().failover.unwrap();
    assert!(f.require_same_digest && !f.fallback && f.resolves_origin());
}

#[test]
fn malformed_or_ambiguous_mirror_lists_are_refused() {
    for (m, want) in [
        ("  - {from: docker.io, to: []}\n", "to lists no mirror"),
        (
            "  - {from: docker.io, to: [a.local/x, a.local/x]}\n",
            "is used twice",
        ),
        (
            "  - {from: docker.io, to: [a.local/x]}\n  - {from: quay.io, to: [b.local/y, a.local/x]}\n",
            "is used twice",
        ),
        (
            "  - {from: docker.io, to: [a.local/x, quay.io/x]}\n  - {from: quay.io, to: c.local/q}\n",
            "chained mirrors",
        ),
        (
            "  - {from: docker.io, to: a.local/x, fallback: mirror}\n",
            "unknown variant",
        ),
        (
            "  - {from: docker.io, to: [a.local/x, 'not a host']}\n",
            "mirror to",
        ),
    ] {
        let e = policy(m).unwrap_err().to_string();
        assert!(e.contains(want), "{m}: {e}");
    }
    let a = policy("  - {from: docker.io, to: [a.local/x, b.local/x]}\n").unwrap();
    let b = Policy::from_yaml("apiVersion: sigil.dev/v1alpha1\nkind: ClusterImagePolicy\nmetadata: {name: other}\nspec:\n  mirrors: [{from: quay.io, to: [c.local/q, b.local/x]}]\n  rules: [{name: q, match: ['quay.io/**']}]\n").unwrap();
    let e = a.merge(b).unwrap_err().to_string();
    assert!(e.contains("both mirror to \"b.local/x\""), "{e}");
}

#[test]
fn policy_objects_take_a_mirror_list_too() {
    let p = Policy::from_json_value(serde_json::json!({
        "apiVersion": "sigil.dev/v1alpha1", "kind": "ClusterImagePolicy",
        "metadata": {"name": "m"},
        "spec": {"mirrors": [{"from": "docker.io", "to": ["a.local/hub", "b.local/hub"], "fallback": "origin"}],
                 "rules": [{"name": "all", "match": ["**"]}]}
    }))
    .unwrap();
    assert_eq!(p.mirrors[0].alternates(), ["b.local/hub"]);
    assert!(p.mirrors[0].fallback_origin());
}

#[test]
fn copy_alone_fails_over_to_the_origin_to_copy_from() {
    let p = policy("  - {from: docker.io, to: a.local/hub, copy: true}\n").unwrap();
    let plan = p.plan("nginx:1").unwrap();
    assert_eq!(plan.target.to_string(), "a.local/hub/library/nginx:1");
    let f = plan.failover.as_ref().expect("a copying mirror fails over");
    assert!(f.copy && !f.fallback && !f.require_same_digest);
    assert!(f.resolves_origin(), "the origin is what is copied");
    assert_eq!(plan.origin.to_string(), "docker.io/library/nginx:1");
    assert!(
        p.describe()
            .contains("an image a.local/hub lacks is copied into it from docker.io on admission"),
        "{}",
        p.describe()
    );
    let pushing = Policy::from_yaml(
        "apiVersion: sigil.dev/v1alpha1\nkind: ImagePolicy\nspec:\n  registries:\n    - {host: a.local, pushAuth: {username: robot, passwordFile: /run/push}}\n  rules:\n  - {name: all, match: ['**']}\n",
    )
    .unwrap();
    assert!(
        pushing
            .describe()
            .contains("a.local: HTTPS, anonymous, pushes (copies into mirrors) as user robot with password from /run/push"),
        "{}",
        pushing.describe()
    );
    let plain = policy("  - {from: docker.io, to: a.local/hub}\n").unwrap();
    assert!(plain.plan("nginx:1").unwrap().failover.is_none());
    assert!(policy("  - {from: docker.io, to: a.local/hub, copy: yes-please}\n").is_err());
}

/// An image pinned by digest was moved to its mirror with no lookup, so a
/// reference no registry served could be written. Now a digest moved to a
/// mirror is a lookup there (of that digest, kept as it is: tag, no tag);
/// a digest already at its mirror, or not moved, is kept as before.
#[test]
fn regression_a_digest_moved_to_a_mirror_is_asked_for_there() {
    let p = Policy::from_yaml(
        "apiVersion: sigil.dev/v1alpha1\nkind: ImagePolicy\nspec:\n  mirrors: [{from: registry.k8s.io, to: mirror.example.com/k8s}]\n  rules: [{name: all, match: [\"**\"]}]\n",
    )
    .unwrap();
    let d = format!("sha256:{}", "ab".repeat(32));
    let digest = crate::reference::Digest::parse(&d).unwrap();
    for (written, at_mirror) in [
        (
            format!("registry.k8s.io/ingress-nginx/controller:v1.15.1@{d}"),
            format!("mirror.example.com/k8s/ingress-nginx/controller:v1.15.1@{d}"),
        ),
        (
            format!("registry.k8s.io/pause@{d}"),
            format!("mirror.example.com/k8s/pause@{d}"),
        ),
    ] {
        let plan = p.plan(&written).unwrap();
        assert_eq!(plan.step, Step::Resolve, "{written}");
        assert_eq!(plan.target.to_string(), at_mirror);
        assert_eq!(plan.final_image(Some(&digest)), at_mirror);
        let again = p.plan(&at_mirror).unwrap();
        assert_eq!(again.step, Step::Keep, "{at_mirror}");
    }
    let elsewhere = format!("quay.io/app@{d}");
    assert_eq!(p.plan(&elsewhere).unwrap().step, Step::Keep);
}
