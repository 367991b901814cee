//! An independent verifier as a test oracle: the Sigstore project's Rust
//! verifier (`sigstore-verify` =0.15.1, sigstore/sigstore-rust, a
//! dev-dependency only) judges every Sigstore bundle vector in the
//! repository beside sigil's `bundle::verify`, with the same trusted root,
//! artifact and identity or key, and the two must agree on accept or
//! refuse. It is not infallible: each case where they disagree is triaged
//! below (which one the specification backs) and held as it is, so a new
//! disagreement — either verifier changing its mind — fails here.
//! It cannot judge cosign's legacy `.sig` layers or notation (it reads
//! bundles only): those are held by their own vectors.

#![allow(clippy::unwrap_used)]

use sigil_testkit::conformance::{self, Case, Triaged, assert_triaged, disagreement};
use sigil_verify::bundle::{Artifact, Matcher, Requirements, Signer};
use sigil_verify::keys::PublicKey;
use sigil_verify::trust::TrustedRoot;
use sigstore_verify::types::{Bundle, DerPublicKey};
use sigstore_verify::{PublicKeyVerificationPolicy, VerificationPolicy};

/// Cases where the two verifiers disagree, with the triage: who is right
/// and why. (case, sigil accepts, sigstore-verify accepts, why).
const TRIAGED: &[Triaged] = &[];

/// The public-good root, the suite's default.
fn public_good_root() -> String {
    std::fs::read_to_string(conformance::public_good_root()).unwrap()
}

/// The suite's default artifact, `a.txt`.
fn a_txt() -> Vec<u8> {
    std::fs::read(conformance::suite().join("a.txt")).unwrap()
}

/// sigil's verdict: `Ok(())` or why not.
fn ours(case: &Case, bundle: &[u8], artifact: &[u8], root: &str) -> Result<(), String> {
    let trust = TrustedRoot::from_json(root).map_err(|e| e.to_string())?;
    let artifact = Artifact::Bytes(artifact.to_vec());
    let key = case
        .key_pem()
        .map(|k| PublicKey::from_pem(&k))
        .transpose()
        .map_err(|e| e.to_string())?;
    let (san, issuer) = (
        Matcher::Exact(case.identity()),
        Matcher::Exact(case.issuer()),
    );
    let signer = match &key {
        Some(k) => Signer::Key(k),
        None => Signer::Identity {
            san: &san,
            issuer: &issuer,
            extensions: &[],
        },
    };
    sigil_verify::bundle::verify(bundle, &artifact, signer, Requirements::default(), &trust)
        .map(|_| ())
        .map_err(|e| e.to_string())
}

/// sigstore-verify's verdict on the same inputs. A trusted root naming no
/// CT log (the test kit's, like a private Fulcio's) asks for no SCT, as
/// sigil reads it: sigstore-verify is told so (`skip_sct`), since it would
/// otherwise want an SCT no log in the root could vouch for.
fn theirs(case: &Case, bundle: &[u8], artifact: &[u8], root: &str) -> Result<(), String> {
    let no_ct_logs = serde_json::from_str::<serde_json::Value>(root)
        .ok()
        .and_then(|v| {
            v.get("ctlogs")
                .and_then(|c| c.as_array())
                .map(Vec::is_empty)
        })
        .unwrap_or(false);
    let root =
        sigstore_verify::trust_root::TrustedRoot::from_json(root).map_err(|e| e.to_string())?;
    let bundle = std::str::from_utf8(bundle).map_err(|e| e.to_string())?;
    let bundle = Bundle::from_json(bundle).map_err(|e| e.to_string())?;
    let r = match case.key_pem() {
        Some(pem) => {
            let key = DerPublicKey::from_pem(&pem).map_err(|e| e.to_string())?;
            sigstore_verify::verify(
                artifact,
                &bundle,
                &PublicKeyVerificationPolicy::new(key),
                &root,
            )
        }
        None => {
            let mut policy = VerificationPolicy::new(case.identity(), case.issuer());
            if no_ct_logs {
                policy = policy.skip_sct();
            }
            sigstore_verify::verify(artifact, &bundle, &policy, &root)
        }
    };
    r.map(|_| ()).map_err(|e| e.to_string())
}

#[test]
fn sigil_and_the_sigstore_projects_verifier_agree_on_every_conformance_bundle() {
    let cases = conformance::cases();
    assert!(cases.len() >= 35, "{} cases", cases.len());
    let mut found = Vec::new();
    let mut wrong = Vec::new();
    for case in &cases {
        let name = case.name();
        let bundle = std::fs::read(case.bundle()).unwrap();
        let artifact = std::fs::read(case.artifact()).unwrap();
        let root = std::fs::read_to_string(case.trusted_root()).unwrap();
        let (a, b) = (
            ours(case, &bundle, &artifact, &root),
            theirs(case, &bundle, &artifact, &root),
        );
        let must_fail = case.must_fail();
        if a.is_ok() == must_fail {
            wrong.push(format!(
                "{name}: sigil {a:?} (must {})",
                if must_fail { "fail" } else { "pass" }
            ));
        }
        disagreement(&mut found, name.clone(), &a, &b);
    }
    assert!(
        wrong.is_empty(),
        "sigil is wrong by the suite:\n{}",
        wrong.join("\n")
    );
    assert_triaged(&found, TRIAGED);
}

/// Cases where the two disagree on the attestation vectors (real bundles
/// made by GitHub, slsa-github-generator and sigstore-js), triaged as above.
const TRIAGED_ATTESTATIONS: &[Triaged] = &[];

/// The real attestation bundles that name their artifact: both verifiers
/// on the bundle, the artifact's bytes and the signer's exact identity.
/// (Policy beyond the identity — repository, builder — is sigil's own and
/// not compared: the upstream verdicts of the `_fail` cases rest on it.)
#[test]
fn sigil_and_the_sigstore_projects_verifier_agree_on_every_real_attestation_bundle() {
    let base = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../sigil/tests/vectors/attestations");
    let cases: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(base.join("cases.json")).unwrap()).unwrap();
    let mut found = Vec::new();
    let (mut judged, mut accepted) = (0, 0);
    for c in cases["cases"].as_array().unwrap() {
        let (Some(bundle), Some(artifact)) = (c["attestation"].as_str(), c["artifact"].as_str())
        else {
            continue;
        };
        if !c["kind"].as_str().unwrap_or_default().starts_with("bundle") {
            continue;
        }
        let id = c["id"].as_str().unwrap();
        let dir = base.join("cases").join(id);
        let root = std::fs::read_to_string(dir.join(c["trust"][0].as_str().unwrap())).unwrap();
        let bundle = std::fs::read(dir.join(bundle)).unwrap();
        // Some artifacts (package tarballs) are not copied: judged by digest elsewhere.
        let Ok(artifact) = std::fs::read(dir.join(artifact)) else {
            continue;
        };
        // The identity files the conformance layout reads, from the case.
        let tmp = tempfile::tempdir().unwrap();
        std::fs::write(
            tmp.path().join("identity"),
            c["signer"]["san"].as_str().unwrap(),
        )
        .unwrap();
        std::fs::write(
            tmp.path().join("issuer"),
            c["signer"]["oidc_issuer"].as_str().unwrap(),
        )
        .unwrap();
        let signer = Case::at(tmp.path());
        let (a, b) = (
            ours(&signer, &bundle, &artifact, &root),
            theirs(&signer, &bundle, &artifact, &root),
        );
        judged += 1;
        accepted += usize::from(a.is_ok() && b.is_ok());
        disagreement(&mut found, id.to_owned(), &a, &b);
    }
    assert!(judged >= 5, "{judged} bundles judged");
    // The upstream `-pass` cases, at least, verify in both (the harness
    // feeds both real inputs, not something both refuse).
    assert!(accepted >= 3, "{accepted} of {judged} accepted by both");
    assert_triaged(&found, TRIAGED_ATTESTATIONS);
}

/// Found by the differential fuzz target (`fuzz/fuzz_targets/bundle_oracle.rs`):
/// a bundle whose `mediaType` is missing (or names no bundle version).
/// sigstore-verify 0.15.1 accepts it; sigil refuses it. Triage: sigil is
/// right — the bundle specification requires `mediaType` to name the
/// version, and the version decides what the bundle must carry (v0.1 may
/// rest on a SET alone, v0.2 and later need an inclusion proof), so an
/// unversioned bundle has no defined rules to verify it by.
#[test]
fn a_bundle_that_names_no_version_is_refused_where_sigstore_verify_accepts_it() {
    let dir = Case::named("happy-path-v0.3");
    let (root, a_txt) = (public_good_root(), a_txt());
    let mut v: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.bundle()).unwrap()).unwrap();
    assert!(ours(&dir, &serde_json::to_vec(&v).unwrap(), &a_txt, &root).is_ok());
    for unversioned in [None, Some("application/json"), Some("")] {
        match unversioned {
            None => v.as_object_mut().unwrap().remove("mediaType"),
            Some(m) => v
                .as_object_mut()
                .unwrap()
                .insert("mediaType".into(), m.into()),
        };
        let bundle = serde_json::to_vec(&v).unwrap();
        let mine = ours(&dir, &bundle, &a_txt, &root);
        assert!(
            mine.as_ref()
                .is_err_and(|e| e.contains("not a supported Sigstore bundle")),
            "{unversioned:?}: {mine:?}"
        );
        if unversioned.is_none() {
            // The disagreement as found: if sigstore-verify changes its
            // mind, this triage is no longer needed.
            assert!(
                theirs(&dir, &bundle, &a_txt, &root).is_ok(),
                "sigstore-verify now refuses an unversioned bundle too"
            );
        }
    }
}

/// Found by the differential fuzz target: a message signature whose
/// `messageDigest` names no algorithm. sigil read it as SHA-256 and
/// accepted; sigstore-verify refuses the bundle. Triage: sigstore-verify is
/// right — a digest without its algorithm (the specification's
/// `HASH_ALGORITHM_UNSPECIFIED`) means nothing. Fixed: sigil refuses it.
#[test]
fn a_message_digest_without_its_algorithm_is_refused_as_sigstore_verify_refuses_it() {
    let (root, a_txt) = (public_good_root(), a_txt());
    for case in ["happy-path-v0.1", "happy-path-v0.3"] {
        let dir = Case::named(case);
        let mut v: serde_json::Value =
            serde_json::from_slice(&std::fs::read(dir.bundle()).unwrap()).unwrap();
        let Some(d) = v.pointer_mut("/messageSignature/messageDigest") else {
            continue;
        };
        d.as_object_mut().unwrap().remove("algorithm");
        let bundle = serde_json::to_vec(&v).unwrap();
        let mine = ours(&dir, &bundle, &a_txt, &root);
        assert!(
            mine.as_ref()
                .is_err_and(|e| e.contains("names no algorithm")),
            "{case}: {mine:?}"
        );
        assert!(theirs(&dir, &bundle, &a_txt, &root).is_err(), "{case}");
    }
}

/// The GitHub attestation bundles the test kit mints as `actions/attest`
/// writes them (`sigil_testkit::github`: v0.3, and v0.2 as its v1.0 did),
/// judged by both verifiers against the test Sigstore's trusted root: the
/// minted form is one the Sigstore project's verifier also accepts, so the
/// tests built on it do not rest on sigil's reading alone.
#[test]
fn sigil_and_the_sigstore_projects_verifier_both_accept_the_minted_github_attestations() {
    use sigil_testkit::github::{BUNDLE_V02, BUNDLE_V03};
    use sigil_testkit::sigstore::{GITHUB_ISSUER, GITHUB_WORKFLOW, Sigstore};
    let ss = Sigstore::new();
    let root = serde_json::to_string(&ss.trusted_root()).unwrap();
    let artifact = b"the image manifest attested";
    let digest = sigil_testkit::registry::sha256(artifact);
    let statement = sigil_testkit::intoto::statement(
        &digest,
        "https://slsa.dev/provenance/v1",
        serde_json::json!({}),
    );
    let t = time::OffsetDateTime::now_utc().unix_timestamp();
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("identity"), GITHUB_WORKFLOW).unwrap();
    std::fs::write(tmp.path().join("issuer"), GITHUB_ISSUER).unwrap();
    for media_type in [BUNDLE_V03, BUNDLE_V02] {
        let bundle = ss.github_attestation(
            media_type,
            &statement,
            GITHUB_WORKFLOW,
            GITHUB_ISSUER,
            &[],
            t - 3600,
            t - 3500,
        );
        let signer = Case::at(tmp.path());
        let mine = ours(&signer, &bundle, artifact, &root);
        let other = theirs(&signer, &bundle, artifact, &root);
        assert!(
            mine.is_ok() && other.is_ok(),
            "{media_type}: sigil {mine:?}; sigstore-verify {other:?}"
        );
    }
}

/// sigstore-java's bundles of every signing algorithm in Sigstore's
/// registry (`tests/vectors/sigstore-java`): both verifiers on each, with
/// its artifact, identity and the public-good root, and on a wrong
/// artifact. (GitHub's private-repository attestation is judged by its own
/// test: only its subject's digest is known, and sigstore-verify wants the
/// artifact's bytes.)
#[test]
fn sigil_and_the_sigstore_projects_verifier_agree_on_every_registry_algorithm() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/vectors/sigstore-java");
    let artifact = std::fs::read(dir.join("artifact.txt")).unwrap();
    let root = public_good_root();
    let trust = TrustedRoot::from_json(&root).unwrap();
    let their_root = sigstore_verify::trust_root::TrustedRoot::from_json(&root).unwrap();
    let (san, issuer) = (
        "untrusted-sa@sigstore-conformance.iam.gserviceaccount.com",
        "https://accounts.google.com",
    );
    let mut found = Vec::new();
    for alg in [
        "ECDSA_P256_SHA_256",
        "ECDSA_P384_SHA_384",
        "ECDSA_P521_SHA_512",
        "RSA_PKCS1V15_2048_SHA256",
        "RSA_PKCS1V15_3072_SHA256",
        "RSA_PKCS1V15_4096_SHA256",
    ] {
        let bundle = std::fs::read(dir.join(format!("PKIX_{alg}.sigstore.json"))).unwrap();
        for (what, bytes) in [("artifact", artifact.clone()), ("other", b"other".to_vec())] {
            let a = sigil_verify::bundle::verify(
                &bundle,
                &Artifact::Bytes(bytes.clone()),
                Signer::Identity {
                    san: &Matcher::Exact(san.into()),
                    issuer: &Matcher::Exact(issuer.into()),
                    extensions: &[],
                },
                Requirements::default(),
                &trust,
            )
            .map(|_| ())
            .map_err(|e| e.to_string());
            let b = Bundle::from_json(std::str::from_utf8(&bundle).unwrap())
                .map_err(|e| e.to_string())
                .and_then(|parsed| {
                    sigstore_verify::verify(
                        &bytes,
                        &parsed,
                        &VerificationPolicy::new(san.to_owned(), issuer.to_owned()),
                        &their_root,
                    )
                    .map(|_| ())
                    .map_err(|e| e.to_string())
                });
            assert_eq!(a.is_ok(), what == "artifact", "{alg} {what}: sigil {a:?}");
            disagreement(&mut found, format!("{alg} {what}"), &a, &b);
        }
    }
    assert_triaged(&found, TRIAGED_ALGORITHMS);
}

/// Disagreements on the registry's algorithms, triaged.
const TRIAGED_ALGORITHMS: &[Triaged] = &[
    (
        "ECDSA_P384_SHA_384 artifact",
        true,
        false,
        "sigil is right: Sigstore's algorithm registry pairs P-384 with SHA-384, the hashedrekord records a sha384 hash, and sigstore-java (which made it) verifies it; sigstore-verify 0.15.1 reads hashedrekord hashes as SHA-256 only",
    ),
    (
        "ECDSA_P521_SHA_512 artifact",
        true,
        false,
        "sigil is right: P-521 with SHA-512 is in Sigstore's registry and sigstore-java verifies it; sigstore-verify 0.15.1 cannot parse a P-521 key",
    ),
];

/// sigstore-go's bundles: a private deployment's (its own root, an
/// OtherName identity) and npm's publish attestation (npm's key, a SET
/// alone, a sha512 subject), each with its artifact's digest and with
/// another's. Both verifiers take the digest alone here.
#[test]
fn sigil_and_the_sigstore_projects_verifier_agree_on_sigstore_gos_bundles() {
    use sigstore_verify::types::{Artifact as Theirs, ArtifactDigest, HashAlgorithm};
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/vectors/sigstore-go");
    let read = |n: &str| std::fs::read(dir.join(n)).unwrap();
    let unhex = |h: &str| -> Vec<u8> {
        (0..h.len() / 2)
            .map(|i| u8::from_str_radix(&h[i * 2..i * 2 + 2], 16).unwrap())
            .collect()
    };
    let mut found = Vec::new();
    // The private deployment, by identity.
    let root = String::from_utf8(read("scaffolding-trusted_root.json")).unwrap();
    let (trust, their_root) = (
        TrustedRoot::from_json(&root).unwrap(),
        sigstore_verify::trust_root::TrustedRoot::from_json(&root).unwrap(),
    );
    let bundle = read("othername.sigstore.json");
    let parsed = Bundle::from_json(std::str::from_utf8(&bundle).unwrap()).unwrap();
    let good = unhex("bc103b4a84971ef6459b294a2b98568a2bfb72cded09d4acd1e16366a401f95b");
    for (what, d) in [("artifact", good), ("other", vec![7u8; 32])] {
        let a = sigil_verify::bundle::verify(
            &bundle,
            &Artifact::Digest(d.clone().try_into().unwrap()),
            Signer::Identity {
                san: &Matcher::Exact("foo!oidc.local".into()),
                issuer: &Matcher::Exact("http://oidc.local:8080".into()),
                extensions: &[],
            },
            Requirements::default(),
            &trust,
        )
        .map(|_| ())
        .map_err(|e| e.to_string());
        let digest = ArtifactDigest::new(HashAlgorithm::Sha2256, d).unwrap();
        let b = sigstore_verify::verify(
            Theirs::from(digest),
            &parsed,
            &VerificationPolicy::new(
                "foo!oidc.local".to_owned(),
                "http://oidc.local:8080".to_owned(),
            ),
            &their_root,
        )
        .map(|_| ())
        .map_err(|e| e.to_string());
        assert_eq!(
            a.is_ok(),
            what == "artifact",
            "othername {what}: sigil {a:?}"
        );
        disagreement(&mut found, format!("othername {what}"), &a, &b);
    }
    // npm's publish attestation, by key.
    let root = public_good_root();
    let (trust, their_root) = (
        TrustedRoot::from_json(&root).unwrap(),
        sigstore_verify::trust_root::TrustedRoot::from_json(&root).unwrap(),
    );
    let bundle = read("npm-publish.sigstore.json");
    let pem = String::from_utf8(read("npm-publish-key.pub")).unwrap();
    let key = PublicKey::from_pem(&pem).unwrap();
    let good = unhex(
        "76176ffa33808b54602c7c35de5c6e9a4deb96066dba6533f50ac234f4f1f4c6b3527515dc17c06fbe2860030f410eee69ea20079bd3a2c6f3dcf3b329b10751",
    );
    for (what, d) in [("artifact", good), ("other", vec![1u8; 64])] {
        let a = sigil_verify::bundle::verify(
            &bundle,
            &Artifact::Sha512(d.clone().try_into().unwrap()),
            Signer::Key(&key),
            Requirements::default(),
            &trust,
        )
        .map(|_| ())
        .map_err(|e| e.to_string());
        let b = Bundle::from_json(std::str::from_utf8(&bundle).unwrap())
            .map_err(|e| e.to_string())
            .and_then(|parsed| {
                let digest = ArtifactDigest::new(HashAlgorithm::Sha2512, d.clone())
                    .map_err(|e| e.to_string())?;
                let key = DerPublicKey::from_pem(&pem).map_err(|e| e.to_string())?;
                sigstore_verify::verify(
                    Theirs::from(digest),
                    &parsed,
                    &PublicKeyVerificationPolicy::new(key),
                    &their_root,
                )
                .map(|_| ())
                .map_err(|e| e.to_string())
            });
        assert_eq!(a.is_ok(), what == "artifact", "npm {what}: sigil {a:?}");
        disagreement(&mut found, format!("npm {what}"), &a, &b);
    }
    assert_triaged(&found, TRIAGED_SIGSTORE_GO);
}

/// Disagreements on sigstore-go's bundles, triaged.
const TRIAGED_SIGSTORE_GO: &[Triaged] = &[(
    "othername artifact",
    true,
    false,
    "sigil is right: Fulcio issues username identities as an OtherName SAN (OID 1.3.6.1.4.1.57264.1.7, `foo!oidc.local`), and sigstore-go, which made the vector, verifies it (TestEntityWithOthernameSan); sigstore-verify 0.15.1 reads only URI and email SANs and finds no identity",
)];
