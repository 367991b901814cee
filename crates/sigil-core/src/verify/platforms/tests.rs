//! Reading an index's platforms, and the verdict for each `signedAt`.

use super::*;
use crate::verify::{
    SignatureProblem, SignaturesSpec, Verification, VerificationReport, VerifierSpec,
};

fn d(n: u8) -> Digest {
    Digest::from_sha256(&[n; 32])
}

fn entry(n: u8, platform: &str) -> String {
    let mut parts = platform.split('/');
    let (os, arch) = (parts.next().unwrap(), parts.next().unwrap());
    let variant = parts
        .next()
        .map(|v| format!(r#","variant":"{v}""#))
        .unwrap_or_default();
    format!(
        r#"{{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"{}","size":1,"platform":{{"os":"{os}","architecture":"{arch}"{variant}}}}}"#,
        d(n).as_str()
    )
}

fn index(entries: &[String]) -> Vec<u8> {
    format!(
        r#"{{"schemaVersion":2,"mediaType":"application/vnd.oci.image.index.v1+json","manifests":[{}]}}"#,
        entries.join(",")
    )
    .into_bytes()
}

#[test]
fn an_index_lists_its_runnable_platforms_once_and_skips_attestations_and_artifacts() {
    let attestation_annotated = format!(
        r#"{{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"{}","size":1,"annotations":{{"vnd.docker.reference.type":"attestation-manifest","vnd.docker.reference.digest":"{}"}}}}"#,
        d(4).as_str(),
        d(1).as_str()
    );
    let artifact = format!(
        r#"{{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"{}","size":1,"artifactType":"application/vnd.example.sbom"}}"#,
        d(5).as_str()
    );
    let no_platform = format!(
        r#"{{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"{}","size":1}}"#,
        d(6).as_str()
    );
    let body = index(&[
        entry(1, "linux/amd64"),
        entry(2, "linux/arm64/v8"),
        entry(3, "unknown/unknown"),
        attestation_annotated,
        artifact,
        entry(1, "linux/amd64"),
        no_platform,
    ]);
    let got = platform_manifests(&body).unwrap().unwrap();
    let labels: Vec<_> = got.iter().map(|m| m.platform.as_str()).collect();
    assert_eq!(
        labels,
        ["linux/amd64", "linux/arm64/v8", "unspecified platform"]
    );
    assert_eq!(got[1].digest, d(2));
}

#[test]
fn a_docker_manifest_list_is_an_index_and_an_image_manifest_is_not() {
    let list = format!(
        r#"{{"schemaVersion":2,"mediaType":"application/vnd.docker.distribution.manifest.list.v2+json","manifests":[{}]}}"#,
        entry(1, "linux/arm/v7")
    );
    assert_eq!(
        platform_manifests(list.as_bytes()).unwrap().unwrap()[0].platform,
        "linux/arm/v7"
    );
    let image = br#"{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{},"layers":[]}"#;
    assert_eq!(platform_manifests(image).unwrap(), None);
    // An OCI index may omit its mediaType; `manifests` says what it is.
    let bare = format!(
        r#"{{"schemaVersion":2,"manifests":[{}]}}"#,
        entry(1, "linux/amd64")
    );
    assert!(platform_manifests(bare.as_bytes()).unwrap().is_some());
}

#[test]
fn a_bad_or_oversized_index_is_refused_with_its_reason() {
    assert!(
        platform_manifests(b"not json")
            .unwrap_err()
            .contains("not JSON")
    );
    let bad = index(&[
        r#"{"digest":"sha256:short","platform":{"os":"linux","architecture":"amd64"}}"#.into(),
    ]);
    assert!(
        platform_manifests(&bad)
            .unwrap_err()
            .contains("sha256:short")
    );
    let many: Vec<String> = (0..=MAX_PLATFORMS as u8)
        .map(|n| entry(n, "linux/amd64"))
        .collect();
    let e = platform_manifests(&index(&many)).unwrap_err();
    assert!(e.contains("more than 32"), "{e}");
    // Exactly the limit is fine.
    assert_eq!(
        platform_manifests(&index(&many[..MAX_PLATFORMS]))
            .unwrap()
            .unwrap()
            .len(),
        MAX_PLATFORMS
    );
}

fn outcome(ok: bool) -> VerifierOutcome {
    if ok {
        VerifierOutcome::Passed {
            examined: 1,
            logged: vec![],
        }
    } else {
        VerifierOutcome::failed(0, vec![])
    }
}

fn results(r: &[(&str, bool)]) -> Vec<(String, VerifierOutcome)> {
    r.iter()
        .map(|(n, ok)| (n.to_string(), outcome(*ok)))
        .collect()
}

fn at(n: u8, r: &[(&str, bool)]) -> PlatformReport {
    PlatformReport {
        manifest: PlatformManifest {
            platform: format!("linux/p{n}"),
            digest: d(n),
        },
        results: results(r),
        fetch_failure: None,
        found: vec![],
    }
}

fn report(
    signed_at: SignedAt,
    index: &[(&str, bool)],
    platforms: Option<Vec<PlatformReport>>,
    threshold: usize,
) -> VerificationReport {
    VerificationReport {
        results: results(index),
        fetch_failure: None,
        threshold,
        required: vec![],
        attestations: vec![],
        found: vec![],
        signed_at,
        platforms,
    }
}

#[test]
fn each_signed_at_requires_what_it_names() {
    let signed = || Some(vec![at(1, &[("k", true)]), at(2, &[("k", true)])]);
    let one_unsigned = || Some(vec![at(1, &[("k", true)]), at(2, &[("k", false)])]);
    // (signedAt, index signed, platforms, satisfied, failed for want of platforms)
    let cases = [
        (SignedAt::Index, true, one_unsigned(), true, false),
        (SignedAt::Index, false, signed(), false, false),
        (SignedAt::Platforms, false, signed(), true, false),
        (SignedAt::Platforms, true, one_unsigned(), false, true),
        (SignedAt::Platforms, true, Some(vec![]), false, true),
        (SignedAt::Both, true, signed(), true, false),
        (SignedAt::Both, false, signed(), false, false),
        (SignedAt::Both, true, one_unsigned(), false, true),
        (SignedAt::Either, true, one_unsigned(), true, false),
        (SignedAt::Either, false, signed(), true, false),
        (SignedAt::Either, false, one_unsigned(), false, true),
        // Not an index: the digest is its own only place, whatever signedAt says.
        (SignedAt::Platforms, true, None, true, false),
        (SignedAt::Both, false, None, false, false),
    ];
    for (i, (at_, idx, ps, want, for_platforms)) in cases.into_iter().enumerate() {
        let r = report(at_, &[("k", idx)], ps, 1);
        assert_eq!(r.satisfied(), want, "case {i}: {at_:?} index={idx}: {r}");
        assert_eq!(r.platforms_failed(), for_platforms, "case {i}: {r}");
    }
}

#[test]
fn the_threshold_holds_at_each_platform_and_vouched_names_who_signed_everywhere() {
    // Two of three at each platform, by different pairs.
    let ps = Some(vec![
        at(1, &[("a", true), ("b", true), ("c", false)]),
        at(2, &[("a", false), ("b", true), ("c", true)]),
    ]);
    let r = report(
        SignedAt::Platforms,
        &[("a", false), ("b", false), ("c", false)],
        ps,
        2,
    );
    assert!(r.satisfied(), "{r}");
    assert_eq!(r.vouched(), ["b"]);
    let mut annotation = String::new();
    r.write_vouched(&mut annotation);
    assert_eq!(annotation, "b");
    // Either: the index satisfied → the index's signers vouch.
    let r = report(
        SignedAt::Either,
        &[("a", true), ("b", true), ("c", false)],
        Some(vec![at(1, &[("a", false), ("b", false), ("c", false)])]),
        2,
    );
    assert_eq!(r.vouched(), ["a", "b"]);
}

#[test]
fn the_denial_names_each_unsigned_platform_and_says_ok_for_the_rest() {
    let r = report(
        SignedAt::Platforms,
        &[("release", true)],
        Some(vec![
            at(1, &[("release", true)]),
            at(2, &[("release", false)]),
        ]),
        1,
    );
    let s = r.to_string();
    assert!(
        s.starts_with("signatures are required on every platform's manifest: linux/p1 (sha256:010101010101…): ok; linux/p2 (sha256:020202020202…): 0 of 1 verifiers passed (need 1); release: no signature found"),
        "{s}"
    );
    let r = report(
        SignedAt::Both,
        &[("release", false)],
        Some(vec![at(1, &[("release", true)])]),
        1,
    );
    let s = r.to_string();
    assert!(
        s.starts_with("at the index: 0 of 1 verifiers passed (need 1); release: no signature found; and at every platform's manifest: linux/p1"),
        "{s}"
    );
    let r = report(SignedAt::Platforms, &[("release", true)], Some(vec![]), 1);
    assert!(
        r.to_string()
            .contains("the index lists no platform manifest")
    );
}

#[test]
fn a_platform_whose_signatures_could_not_be_fetched_is_transient_and_named() {
    let mut p = at(2, &[]);
    p.fetch_failure = Some(ResolveFailure::Timeout {
        budget: std::time::Duration::from_secs(1),
    });
    let r = report(
        SignedAt::Platforms,
        &[("k", true)],
        Some(vec![at(1, &[("k", true)]), p]),
        1,
    );
    assert!(!r.satisfied());
    assert!(
        r.is_transient(),
        "a timeout at one platform must not be cached"
    );
    assert!(
        r.to_string()
            .contains("linux/p2 (sha256:020202020202…): signatures could not be fetched")
    );
    // A revoked signer at one platform is reported as revoked.
    let revoked = PlatformReport {
        results: vec![(
            "k".into(),
            VerifierOutcome::failed(
                1,
                vec![SignatureProblem::Revoked {
                    detail: "by the CA".into(),
                }],
            ),
        )],
        ..at(3, &[])
    };
    let r = report(SignedAt::Both, &[("k", true)], Some(vec![revoked]), 1);
    assert!(r.revoked());
}

#[test]
fn signed_at_is_part_of_the_requirement_and_needs_a_verify_list() {
    let key = VerifierSpec::cosign_key("k", "k.pub");
    let spec = |at| SignaturesSpec {
        repository: None,
        signed_at: Some(at),
    };
    let index = Verification::compile("r", std::slice::from_ref(&key), None, &[], None).unwrap();
    let each = Verification::compile(
        "r",
        std::slice::from_ref(&key),
        None,
        &[],
        Some(&spec(SignedAt::Platforms)),
    )
    .unwrap();
    assert_eq!(index.signed_at, SignedAt::Index);
    assert_eq!(each.signed_at, SignedAt::Platforms);
    assert_ne!(
        index.fingerprint(),
        each.fingerprint(),
        "a cached report for one must not answer the other"
    );
    let e = Verification::compile("r", &[], None, &[], Some(&spec(SignedAt::Both))).unwrap_err();
    assert!(e.contains("signedAt: both needs a verify list"), "{e}");
    let parsed: SignaturesSpec = serde_json::from_str(r#"{"signedAt":"either"}"#).unwrap();
    assert_eq!(parsed.signed_at, Some(SignedAt::Either));
    assert!(serde_json::from_str::<SignaturesSpec>(r#"{"signedAt":"all"}"#).is_err());
}

#[test]
fn a_team_may_require_signatures_at_each_platform_of_its_own_images() {
    let team = crate::policy::NamespacePolicy::from_yaml(
        r#"apiVersion: sigil.dev/v1alpha1
kind: ImagePolicy
metadata: {name: per-platform, namespace: team-a}
spec:
  rules:
    - name: team-keys
      match: ["**"]
      verify:
        - {name: team, cosign: {key: "-----BEGIN PUBLIC KEY-----\nAA==\n-----END PUBLIC KEY-----"}}
      signatures: {signedAt: platforms}
"#,
    )
    .unwrap();
    let origin = crate::Reference::parse("registry.example.com/team-a/app:v1").unwrap();
    match team.judge(&origin) {
        crate::policy::TeamVerdict::Verify { verification, .. } => {
            assert_eq!(verification.signed_at, SignedAt::Platforms);
        }
        other => panic!("{other:?}"),
    }
}
