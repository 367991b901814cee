//! Real bundles signed with every algorithm of Sigstore's registry, and a
//! real attestation from GitHub's own Sigstore instance (no transparency
//! log), from sigstore-java's test data (`tests/vectors/README.md`),
//! verified by `bundle::verify` as upstream's tests assert — and each
//! refused when the artifact, the identity or the trusted root is another.

#![allow(clippy::unwrap_used)]

use sigil_core::SignatureProblem;
use sigil_verify::bundle::{Artifact, Matcher, Requirements, Signer, Verified, verify};
use sigil_verify::trust::TrustedRoot;

const DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/vectors/sigstore-java");
const SA: &str = "untrusted-sa@sigstore-conformance.iam.gserviceaccount.com";
const GOOGLE: &str = "https://accounts.google.com";
const GH_SIGNER: &str = "https://github.com/neverendingsupport/slsa-attestations/.github/workflows/attest.yml@9f6d9dc1bfc02986955721eb15f89ad618f1cedb";
const GH_ISSUER: &str = "https://token.actions.githubusercontent.com";
const GH_SUBJECT: &str = "caa015ef69e9bc31a41322d6c71563ed9600c75bb988e4d639b1edc578580551";

fn read(name: &str) -> Vec<u8> {
    std::fs::read(format!("{DIR}/{name}")).unwrap()
}

fn check(
    bundle: &[u8],
    artifact: &Artifact,
    (san, issuer): (&str, &str),
    extensions: &[(String, Matcher)],
    trust: &TrustedRoot,
) -> Result<Verified, SignatureProblem> {
    verify(
        bundle,
        artifact,
        Signer::Identity {
            san: &Matcher::Exact(san.into()),
            issuer: &Matcher::Exact(issuer.into()),
            extensions,
        },
        Requirements::default(),
        trust,
    )
}

fn digest(hex: &str) -> Artifact {
    let mut d = [0u8; 32];
    for (i, b) in d.iter_mut().enumerate() {
        *b = u8::from_str_radix(&hex[i * 2..i * 2 + 2], 16).unwrap();
    }
    Artifact::Digest(d)
}

fn github() -> TrustedRoot {
    TrustedRoot::from_json(sigil_verify::trust::GITHUB).unwrap()
}

/// Fulcio certificates with P-384 and P-521 keys sign SHA-384 and SHA-512
/// digests (`messageDigest.algorithm` SHA2_384 / SHA2_512, a hashedrekord
/// of that algorithm): refused "message digest algorithm SHA2_384 is not
/// supported". Every algorithm of the registry now verifies.
#[test]
fn regression_every_signing_algorithm_of_sigstores_registry_verifies() {
    let artifact = Artifact::Bytes(read("artifact.txt"));
    let trust = TrustedRoot::public_good().unwrap();
    for alg in [
        "ECDSA_P256_SHA_256",
        "ECDSA_P384_SHA_384",
        "ECDSA_P521_SHA_512",
        "RSA_PKCS1V15_2048_SHA256",
        "RSA_PKCS1V15_3072_SHA256",
        "RSA_PKCS1V15_4096_SHA256",
    ] {
        let bundle = read(&format!("PKIX_{alg}.sigstore.json"));
        let v = check(&bundle, &artifact, (SA, GOOGLE), &[], &trust)
            .unwrap_or_else(|e| panic!("{alg}: {e}"));
        assert_eq!(v.inclusion_proofs, 1, "{alg}");
        // Another artifact, another identity: refused.
        let other = Artifact::Bytes(b"another artifact".to_vec());
        assert!(
            check(&bundle, &other, (SA, GOOGLE), &[], &trust).is_err(),
            "{alg}"
        );
        assert!(
            matches!(
                check(
                    &bundle,
                    &artifact,
                    ("someone@example.com", GOOGLE),
                    &[],
                    &trust
                ),
                Err(SignatureProblem::IdentityMismatch { .. })
            ),
            "{alg}"
        );
    }
    // A digest under an algorithm outside the registry is refused by name.
    let bundle = String::from_utf8(read("PKIX_ECDSA_P384_SHA_384.sigstore.json"))
        .unwrap()
        .replace("SHA2_384", "SHA3_384");
    let e = check(bundle.as_bytes(), &artifact, (SA, GOOGLE), &[], &trust).unwrap_err();
    assert!(e.to_string().contains("SHA3_384"), "{e}");
    // A SHA-384 signature cannot be checked against a SHA-256 digest alone.
    let bundle = read("PKIX_ECDSA_P384_SHA_384.sigstore.json");
    let sha256 = digest(&sigil_verify::trust::hex(&sigil_verify::sha256(&read(
        "artifact.txt",
    ))));
    let e = check(&bundle, &sha256, (SA, GOOGLE), &[], &trust).unwrap_err();
    assert!(e.to_string().contains("give the artifact itself"), "{e}");
}

/// GitHub's own Sigstore instance (private repositories' attestations:
/// Fulcio at fulcio.githubapp.com, timestamps from timestamp.githubapp.com,
/// no transparency log): refused "the bundle has no transparency-log entry,
/// and one is required", although its trusted root lists no log. The
/// built-in `github` root verifies it by its signed timestamp.
#[test]
fn regression_a_github_private_repository_attestation_verifies_by_its_timestamp() {
    let bundle = read("github-private-no-tlog/attestation.sigstore.json");
    let repo = vec![(
        "githubWorkflowRepository".to_owned(),
        Matcher::Exact("neverendingsupport/nes-java-test-lib-a".into()),
    )];
    let v = check(
        &bundle,
        &digest(GH_SUBJECT),
        (GH_SIGNER, GH_ISSUER),
        &repo,
        &github(),
    )
    .unwrap();
    assert_eq!((v.timestamps, v.inclusion_proofs), (1, 0));
    assert!(v.statement.is_some());
    // The root gh writes (its second line) is the one built in.
    let jsonl = String::from_utf8(read("github-private-no-tlog/trusted_root.jsonl")).unwrap();
    let written: serde_json::Value = serde_json::from_str(jsonl.lines().nth(1).unwrap()).unwrap();
    let built_in: serde_json::Value = serde_json::from_str(sigil_verify::trust::GITHUB).unwrap();
    assert_eq!(written, built_in);
    // Another subject, another owner, another root: refused.
    let other = digest(&"0".repeat(64));
    assert!(check(&bundle, &other, (GH_SIGNER, GH_ISSUER), &repo, &github()).is_err());
    let elsewhere = vec![(
        "githubWorkflowRepository".to_owned(),
        Matcher::Exact("someone-else/nes-java-test-lib-a".into()),
    )];
    assert!(matches!(
        check(
            &bundle,
            &digest(GH_SUBJECT),
            (GH_SIGNER, GH_ISSUER),
            &elsewhere,
            &github()
        ),
        Err(SignatureProblem::IdentityMismatch { .. })
    ));
    // The public-good root runs a log: there, a bundle without an entry is refused.
    let e = check(
        &bundle,
        &digest(GH_SUBJECT),
        (GH_SIGNER, GH_ISSUER),
        &repo,
        &TrustedRoot::public_good().unwrap(),
    )
    .unwrap_err();
    assert!(e.to_string().contains("no transparency-log entry"), "{e}");
    // Without its timestamp, nothing gives it a trusted time: refused.
    let mut stripped: serde_json::Value = serde_json::from_slice(&bundle).unwrap();
    stripped["verificationMaterial"]
        .as_object_mut()
        .unwrap()
        .remove("timestampVerificationData");
    let e = check(
        stripped.to_string().as_bytes(),
        &digest(GH_SUBJECT),
        (GH_SIGNER, GH_ISSUER),
        &repo,
        &github(),
    )
    .unwrap_err();
    assert!(e.to_string().contains("lists no transparency log"), "{e}");
}

/// JSON `null` is absence: a v0.1 bundle (npm's publish attestations) may
/// write `"inclusionProof": null` beside a valid SET. It was refused
/// "inclusion proof has no logIndex".
#[test]
fn regression_a_null_inclusion_proof_is_an_absent_one() {
    let dir = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/vectors/sigstore-conformance/happy-path-v0.1"
    );
    let mut b: serde_json::Value =
        serde_json::from_slice(&std::fs::read(format!("{dir}/bundle.sigstore.json")).unwrap())
            .unwrap();
    b["verificationMaterial"]["tlogEntries"][0]["inclusionProof"] = serde_json::Value::Null;
    let artifact = Artifact::Bytes(
        std::fs::read(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/vectors/sigstore-conformance/a.txt"
        ))
        .unwrap(),
    );
    let trust = TrustedRoot::public_good().unwrap();
    let id = (
        "https://github.com/sigstore-conformance/extremely-dangerous-public-oidc-beacon/.github/workflows/extremely-dangerous-oidc-beacon.yml@refs/heads/main",
        "https://token.actions.githubusercontent.com",
    );
    let v = check(b.to_string().as_bytes(), &artifact, id, &[], &trust).unwrap();
    assert_eq!(v.inclusion_proofs, 0);
}
