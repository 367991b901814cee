//! Real bundles from sigstore-go's test data (`tests/vectors/README.md`):
//! a private Sigstore deployment's (sigstore/scaffolding: its own Fulcio,
//! Rekor and CT log, an OtherName identity, a checkpoint whose origin is the
//! Rekor pod's host name) and npm's publish attestation (a v0.1 bundle
//! signed by npm's key, `"inclusionProof": null` beside a valid SET). Each
//! verifies as upstream's tests assert, and each is refused when the
//! artifact, the identity, the key or the trusted root is another.

#![allow(clippy::unwrap_used)]

use sigil_core::SignatureProblem;
use sigil_verify::bundle::{Artifact, Matcher, Requirements, Signer, Verified, verify};
use sigil_verify::keys::PublicKey;
use sigil_verify::trust::TrustedRoot;

const DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/vectors/sigstore-go");
/// The OtherName SAN scaffolding's Fulcio issues (`username!host`), and its issuer.
const OTHERNAME: &str = "foo!oidc.local";
const SCAFFOLDING_ISSUER: &str = "http://oidc.local:8080";
/// sha256 of the artifact the scaffolding bundle signs (upstream's test).
const SCAFFOLDING_DIGEST: &str = "bc103b4a84971ef6459b294a2b98568a2bfb72cded09d4acd1e16366a401f95b";
/// sha512 of `sigstore@1.3.0`'s tarball, the publish attestation's subject.
const NPM_DIGEST: &str = "76176ffa33808b54602c7c35de5c6e9a4deb96066dba6533f50ac234f4f1f4c6b3527515dc17c06fbe2860030f410eee69ea20079bd3a2c6f3dcf3b329b10751";

fn read(name: &str) -> Vec<u8> {
    std::fs::read(format!("{DIR}/{name}")).unwrap()
}

fn bytes<const N: usize>(hex: &str) -> [u8; N] {
    let mut d = [0u8; N];
    for (i, b) in d.iter_mut().enumerate() {
        *b = u8::from_str_radix(&hex[i * 2..i * 2 + 2], 16).unwrap();
    }
    d
}

fn scaffolding() -> TrustedRoot {
    TrustedRoot::from_json(&String::from_utf8(read("scaffolding-trusted_root.json")).unwrap())
        .unwrap()
}

fn by_identity(
    bundle: &[u8],
    artifact: &Artifact,
    san: &str,
    trust: &TrustedRoot,
) -> Result<Verified, SignatureProblem> {
    verify(
        bundle,
        artifact,
        Signer::Identity {
            san: &Matcher::Exact(san.into()),
            issuer: &Matcher::Exact(SCAFFOLDING_ISSUER.into()),
            extensions: &[],
        },
        Requirements::default(),
        trust,
    )
}

/// A private deployment's bundle was refused because its checkpoint's
/// origin (`rekor-00001-deployment-…`, the pod's host name) is not the name
/// sigil derived from the log's `baseUrl`; the client spec identifies the
/// log by its key in the trusted root. Its certificate's identity is an
/// OtherName SAN (`foo!oidc.local`), matched as Fulcio issues it.
#[test]
fn regression_a_private_deployments_bundle_verifies_by_its_logs_key_and_othername_identity() {
    let bundle = read("othername.sigstore.json");
    let artifact = Artifact::Digest(bytes(SCAFFOLDING_DIGEST));
    let trust = scaffolding();
    let v = by_identity(&bundle, &artifact, OTHERNAME, &trust).unwrap();
    assert_eq!(v.inclusion_proofs, 1);
    // The checkpoint really names the pod, not the log's URL.
    let text = String::from_utf8(bundle.clone()).unwrap();
    assert!(text.contains("rekor-00001-deployment-56bf7777c9-jds5x"));
    let root = String::from_utf8(read("scaffolding-trusted_root.json")).unwrap();
    assert!(root.contains("http://rekor.rekor-system.172.18.255.1.sslip.io"));
    // An email spelling of the same name is another identity (upstream asserts it too).
    assert!(matches!(
        by_identity(&bundle, &artifact, "foo@oidc.local", &trust),
        Err(SignatureProblem::IdentityMismatch { .. })
    ));
    // Another artifact: refused.
    let other = Artifact::Digest([7u8; 32]);
    assert!(by_identity(&bundle, &other, OTHERNAME, &trust).is_err());
    // The public-good root trusts neither its Fulcio nor its log.
    assert!(
        by_identity(
            &bundle,
            &artifact,
            OTHERNAME,
            &TrustedRoot::public_good().unwrap()
        )
        .is_err()
    );
    // A checkpoint signed by another key, under the right origin, is refused:
    // the log is its key, and the origin alone proves nothing.
    let mut b: serde_json::Value = serde_json::from_slice(&bundle).unwrap();
    let cp = &mut b["verificationMaterial"]["tlogEntries"][0]["inclusionProof"]["checkpoint"]["envelope"];
    let envelope = cp.as_str().unwrap().to_owned();
    *cp = serde_json::Value::String(envelope.replace(" 9vs1f", " AAAAA"));
    assert!(by_identity(b.to_string().as_bytes(), &artifact, OTHERNAME, &trust).is_err());
}

fn npm_key() -> PublicKey {
    PublicKey::from_pem(&String::from_utf8(read("npm-publish-key.pub")).unwrap()).unwrap()
}

fn by_key(
    bundle: &[u8],
    artifact: &Artifact,
    key: &PublicKey,
) -> Result<Verified, SignatureProblem> {
    verify(
        bundle,
        artifact,
        Signer::Key(key),
        Requirements::default(),
        &TrustedRoot::public_good().unwrap(),
    )
}

/// npm's publish attestations are v0.1 bundles that write
/// `"inclusionProof": null` beside a valid SET: refused "inclusion proof has
/// no logIndex". JSON `null` is absence, and a v0.1 bundle may carry a SET
/// alone. Its entry is Rekor v1's `intoto` kind at version 0.0.2, which
/// sigil then took for a Rekor v2 entry (those must carry a proof) and
/// refused "log entry has no inclusion proof". This one is the registry's attestation of `sigstore@1.3.0`,
/// signed by npm's publish key and logged in the public-good Rekor.
#[test]
fn regression_npms_publish_attestation_with_a_null_inclusion_proof_verifies_by_its_set() {
    let bundle = read("npm-publish.sigstore.json");
    assert!(
        String::from_utf8(bundle.clone())
            .unwrap()
            .contains("\"inclusionProof\":null")
    );
    let artifact = Artifact::Sha512(bytes(NPM_DIGEST));
    let v = by_key(&bundle, &artifact, &npm_key()).unwrap();
    assert_eq!(v.inclusion_proofs, 0);
    assert!(v.statement.is_some());
    // Another package's digest: refused.
    let other = Artifact::Sha512([1u8; 64]);
    assert!(by_key(&bundle, &other, &npm_key()).is_err());
    // Another key (the scaffolding log's): refused.
    let stranger = PublicKey::from_pem(
        "-----BEGIN PUBLIC KEY-----\nMFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAEnPyeVMLRWPJQpCHcUdG41k+oJiQEjX4uGSX7ujPH7Iv5zQD3VYiHhyQ/oMJvc1vx+2Zk2DBcBhN9IT0eZjB2RQ==\n-----END PUBLIC KEY-----\n",
    )
    .unwrap();
    assert!(by_key(&bundle, &artifact, &stranger).is_err());
    // Without its SET, nothing proves it was logged: refused.
    let mut b: serde_json::Value = serde_json::from_slice(&bundle).unwrap();
    b["verificationMaterial"]["tlogEntries"][0]
        .as_object_mut()
        .unwrap()
        .remove("inclusionPromise");
    assert!(by_key(b.to_string().as_bytes(), &artifact, &npm_key()).is_err());
}
