//! Signature verification through `sigil serve`, against the real registry:
//! the real cosign/notation signatures from the vectors pushed byte-exact,
//! and signatures made here for every must-pass and must-fail case.

use std::time::Duration;

use serde_json::Value;

use crate::support::registry::{Mode, TestRegistry};
use crate::support::sigil::{Admitted, Sigil};
use crate::support::signing::{self, Layer, Signer, push_signed};

const VECTORS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../sigil-verify/tests/vectors");
const CO: &str = "cosign/securesystemsengineering/testimage";
const NO: &str = "notation/sse-secure-systems/testimage";
const ALICE: &str = "sha256:071bf7a986f1ca9cb2a1f0bc8392822a7777f90d58f2d2c6f271913e08de7c81";
const ABC: &str = "sha256:bfec161fecb0a887df7cb85e4da327c65986ccda7060cf3cd92171c6c90d7533";
const KEYLESS: &str = "sha256:31dc72a13a0c34b40eb95419d2b2fd67320c856baf3b72da518023ee8d370aee";
const NOTATION_SIGNED: &str =
    "sha256:a136cc4e785798e5e8483047cf621cf0a0300a93d47703a3f066c340c070f5cf";
const NOTATION_UNSIGNED: &str =
    "sha256:c51f6b33b43f9f234af90bf310d976ea1bec487ab00ab61bd684b0efbbc15b53";

fn vector(p: &str) -> Vec<u8> {
    std::fs::read(format!("{VECTORS}/{p}")).unwrap()
}

fn vpath(p: &str) -> String {
    format!("{VECTORS}/{p}")
}

fn policy(host: &str, rules: &str) -> String {
    format!(
        "apiVersion: sigil.dev/v1alpha1\nkind: ImagePolicy\nmetadata: {{name: verify-test}}\nspec:\n  registries:\n    - {{host: \"{host}\", insecure: true}}\n  rules:\n{rules}"
    )
}

/// Pushes the real cosign vectors into `repo`: three images (tags alice,
/// abc, keyless) and their `.sig` manifests, byte for byte.
async fn push_cosign_vectors(reg: &TestRegistry, repo: &str) {
    for (tag, file, digest) in [
        ("alice", "multi-cosigned-alice.json", ALICE),
        ("abc", "multi-cosigned-alice-bob-charlie.json", ABC),
        ("keyless", "keyless.json", KEYLESS),
    ] {
        let pushed = reg
            .push_exact(repo, tag, &vector(&format!("{CO}/manifests/{file}")))
            .await;
        assert_eq!(pushed, digest, "{file} must hash to its digest");
        let sig = vector(&format!(
            "{CO}/manifests/{}.sig.json",
            digest.replace(':', "-")
        ));
        let v: Value = serde_json::from_slice(&sig).unwrap();
        for l in v["layers"].as_array().unwrap() {
            let d = l["digest"].as_str().unwrap();
            let blob = vector(&format!("{CO}/blobs/{}.json", d.replace(':', "_")));
            assert_eq!(reg.push_blob(repo, &blob).await, d);
        }
        reg.push_exact(repo, &format!("{}.sig", digest.replace(':', "-")), &sig)
            .await;
    }
}

/// Writes `key`'s public PEM to `dir/name` and returns the path, as a policy names it.
fn key_file(dir: &tempfile::TempDir, name: &str, key: &Signer) -> String {
    let path = dir.path().join(name);
    std::fs::write(&path, key.public_pem()).unwrap();
    path.display().to_string()
}

async fn pod(sigil: &Sigil, image: &str) -> Admitted {
    sigil.apiserver().create_pod("team", &[image]).await
}

fn image_of(a: &Admitted) -> String {
    a.object["spec"]["containers"][0]["image"]
        .as_str()
        .unwrap()
        .to_owned()
}

fn key_rule(name: &str, pattern: &str, keys: &[(&str, &str)], extra: &str) -> String {
    let mut s = format!("    - name: {name}\n      match: [\"{pattern}\"]\n      verify:\n");
    for (n, path) in keys {
        s.push_str(&format!(
            "        - {{name: {n}, cosign: {{key: \"{path}\"}}}}\n"
        ));
    }
    s.push_str(extra);
    s
}

/// The real cosign signatures: each verifier accepts exactly what the vectors
/// README says it must, and every denial names the verifier and the reason.
#[tokio::test]
async fn connaisseur_cosign_vectors_verify_as_expected_through_sigil_serve() {
    let reg = TestRegistry::start(Mode::Plain).await;
    let h = reg.host();
    for repo in [
        "k-alice/testimage",
        "k-bob/testimage",
        "k-threshold/testimage",
        "k-keyless/testimage",
        "k-wrongid/testimage",
        "k-wrongrekor/testimage",
    ] {
        push_cosign_vectors(&reg, repo).await;
    }
    let unsigned = reg.push_image("k-alice/testimage", "unsigned").await;
    // A trusted root whose Rekor key is not the one that signed the SET.
    let dir = tempfile::tempdir().unwrap();
    let mut root: Value = serde_json::from_str(sigil_verify::trust::PUBLIC_GOOD).unwrap();
    let other = Signer::p256();
    root["tlogs"][0]["publicKey"]["rawBytes"] = Value::String(signing::b64(&other.spki()));
    let wrong_root = dir.path().join("wrong-rekor.json");
    std::fs::write(&wrong_root, serde_json::to_vec(&root).unwrap()).unwrap();
    let key = |k: &str| vpath(&format!("cosign/{k}.key"));
    let (alice, bob, charlie, default) = (key("alice"), key("bob"), key("charlie"), key("default"));
    let keyless = |name: &str, pattern: &str, subject: &str, extra: &str| {
        format!(
            "    - name: {name}\n      match: [\"{pattern}\"]\n      verify:\n        - name: ci\n          cosign:\n            keyless: {{issuer: \"https://github.com/login/oauth\", {subject}}}\n{extra}"
        )
    };
    let rules = [
        key_rule(
            "alice",
            &format!("{h}/k-alice/**"),
            &[("alice", &alice)],
            "",
        ),
        key_rule("bob", &format!("{h}/k-bob/**"), &[("bob", &bob)], ""),
        key_rule(
            "threshold",
            &format!("{h}/k-threshold/**"),
            &[
                ("alice", &alice),
                ("bob", &bob),
                ("charlie", &charlie),
                ("default", &default),
            ],
            "      threshold: 3\n      required: [alice]\n",
        ),
        keyless(
            "keyless",
            &format!("{h}/k-keyless/**"),
            "subject: philipp.belitz@securesystems.de",
            "",
        ),
        keyless(
            "wrongid",
            &format!("{h}/k-wrongid/**"),
            "subjectRegex: '^https://github\\.com/acme/.+$'",
            "",
        ),
        keyless(
            "wrongrekor",
            &format!("{h}/k-wrongrekor/**"),
            "subject: philipp.belitz@securesystems.de",
            &format!("            trustedRoot: \"{}\"\n", wrong_root.display()),
        ),
    ];
    let text = rules.join("");
    let sigil = Sigil::start(Some(&policy(&h, &text)), &[]).await;

    // alice's key: alice's image and the three-signature image pass, pinned to the signed digest.
    let a = pod(&sigil, &format!("{h}/k-alice/testimage:alice")).await;
    assert!(a.allowed, "{}", a.message);
    assert_eq!(image_of(&a), format!("{h}/k-alice/testimage:alice@{ALICE}"));
    assert!(
        pod(&sigil, &format!("{h}/k-alice/testimage:abc"))
            .await
            .allowed
    );
    let a = pod(&sigil, &format!("{h}/k-alice/testimage:keyless")).await;
    assert!(!a.allowed);
    assert!(a.message.contains("alice: wrong key"), "{}", a.message);
    let a = pod(&sigil, &format!("{h}/k-alice/testimage:unsigned")).await;
    assert!(!a.allowed);
    assert!(
        a.message.contains(&format!(
            "failed signature verification of {h}/k-alice/testimage:unsigned@{unsigned}"
        )),
        "{}",
        a.message
    );
    assert!(
        a.message.contains("alice: no signature found"),
        "{}",
        a.message
    );

    // Images already written with a digest are verified on that digest, unchanged.
    for written in [
        format!("{h}/k-alice/testimage@{ALICE}"),
        format!("{h}/k-alice/testimage:alice@{ALICE}"),
    ] {
        let a = pod(&sigil, &written).await;
        assert!(a.allowed && !a.patched, "{written}: {}", a.message);
    }
    let a = pod(&sigil, &format!("{h}/k-alice/testimage@{unsigned}")).await;
    assert!(!a.allowed, "a digest without signatures is refused too");

    // bob's key: alice's signature is not bob's.
    let a = pod(&sigil, &format!("{h}/k-bob/testimage:alice")).await;
    assert!(!a.allowed);
    assert!(
        a.message
            .contains("bob: wrong key (signature does not verify) (1 signature checked)"),
        "{}",
        a.message
    );
    assert!(
        pod(&sigil, &format!("{h}/k-bob/testimage:abc"))
            .await
            .allowed
    );

    // threshold 3 of 4 with alice required: abc has alice, bob, charlie;
    // the audit annotation records who vouched for the image.
    let a = pod(&sigil, &format!("{h}/k-threshold/testimage:abc")).await;
    assert!(a.allowed, "{}", a.message);
    assert_eq!(
        a.response["response"]["auditAnnotations"]["verified"],
        "spec.containers[0].image: alice, bob, charlie"
    );
    let a = pod(&sigil, &format!("{h}/k-threshold/testimage:alice")).await;
    assert!(!a.allowed);
    assert!(
        a.message
            .contains("1 of 4 verifiers passed (need 3, including alice)"),
        "{}",
        a.message
    );
    assert!(a.message.contains("default: wrong key"), "{}", a.message);

    // keyless: valid at the Rekor integratedTime against the embedded public-good root.
    let a = pod(&sigil, &format!("{h}/k-keyless/testimage:keyless")).await;
    assert!(a.allowed, "{}", a.message);
    assert_eq!(
        image_of(&a),
        format!("{h}/k-keyless/testimage:keyless@{KEYLESS}")
    );
    let a = pod(&sigil, &format!("{h}/k-keyless/testimage:alice")).await;
    assert!(
        a.message
            .contains("ci: chain invalid: signature carries no certificate"),
        "{}",
        a.message
    );
    let a = pod(&sigil, &format!("{h}/k-wrongid/testimage:keyless")).await;
    assert!(!a.allowed);
    assert!(a.message.contains("ci: identity mismatch (certificate has subject philipp.belitz@securesystems.de, issuer https://github.com/login/oauth)"), "{}", a.message);
    let a = pod(&sigil, &format!("{h}/k-wrongrekor/testimage:keyless")).await;
    assert!(!a.allowed);
    assert!(a.message.contains("ci: log entry invalid"), "{}", a.message);

    assert!(
        sigil
            .counter(
                "sigil_signature_verifications_total",
                &[("verifier", "alice"), ("result", "passed")]
            )
            .await
            >= 2.0
    );
    assert!(
        sigil
            .counter(
                "sigil_signature_verifications_total",
                &[("verifier", "bob"), ("result", "wrong_key")]
            )
            .await
            >= 1.0
    );
}

/// The real notation signature, found through the referrers tag schema (the
/// registry has no referrers API): valid under its root, refused under the
/// wrong root unless the level is audit, and the unsigned image refused.
#[tokio::test]
async fn connaisseur_notation_vector_verifies_through_the_referrers_tag_schema() {
    let reg = TestRegistry::start(Mode::Plain).await;
    let h = reg.host();
    for repo in ["n-ok/testimage", "n-wrong/testimage", "n-audit/testimage"] {
        assert_eq!(
            reg.push_exact(
                repo,
                "signed",
                &vector(&format!("{NO}/manifests/notation-sign.json"))
            )
            .await,
            NOTATION_SIGNED
        );
        assert_eq!(
            reg.push_exact(
                repo,
                "unsigned",
                &vector(&format!("{NO}/manifests/notation-unsign.json"))
            )
            .await,
            NOTATION_UNSIGNED
        );
        reg.push_blob(repo, b"{}").await;
        let env = vector(&format!(
            "{NO}/blobs/sha256_929a0a249c4614eb8bef5a914308896e7c8c5422d508eaddfd98dfe61683e556.json"
        ));
        reg.push_blob(repo, &env).await;
        let sig = vector(&format!(
            "{NO}/manifests/sha256_d397b30282982b80818b2705f8d542d35158bc59d8bf42549f3e898f23d55a77.json"
        ));
        reg.push_exact(
            repo,
            "sha256:d397b30282982b80818b2705f8d542d35158bc59d8bf42549f3e898f23d55a77",
            &sig,
        )
        .await;
        let index = vector(&format!(
            "{NO}/manifests/sha256-a136cc4e785798e5e8483047cf621cf0a0300a93d47703a3f066c340c070f5cf.json"
        ));
        reg.push_manifest(
            repo,
            &NOTATION_SIGNED.replace(':', "-"),
            "application/vnd.oci.image.index.v1+json",
            &index,
        )
        .await;
    }
    let root = vpath("derived/notation-trust-root.crt");
    let wrong = vpath("derived/notation-wrong-trust-root.crt");
    let rule = |name: &str, repo: &str, root: &str, level: &str| {
        format!(
            "    - name: {name}\n      match: [\"{h}/{repo}/**\"]\n      verify:\n        - name: release\n          notation: {{trustRoots: [\"{root}\"], level: {level}}}\n"
        )
    };
    let text = [
        rule("ok", "n-ok", &root, "strict"),
        rule("wrong", "n-wrong", &wrong, "strict"),
        rule("audit", "n-audit", &wrong, "audit"),
    ]
    .join("");
    let sigil = Sigil::start(Some(&policy(&h, &text)), &[]).await;
    let a = pod(&sigil, &format!("{h}/n-ok/testimage:signed")).await;
    assert!(a.allowed, "{}", a.message);
    assert_eq!(
        image_of(&a),
        format!("{h}/n-ok/testimage:signed@{NOTATION_SIGNED}")
    );
    let a = pod(&sigil, &format!("{h}/n-ok/testimage:unsigned")).await;
    assert!(!a.allowed);
    assert!(
        a.message.contains("release: no signature found"),
        "{}",
        a.message
    );
    let a = pod(&sigil, &format!("{h}/n-wrong/testimage:signed")).await;
    assert!(!a.allowed);
    assert!(
        a.message
            .contains("release: chain invalid: issuer is not a trusted root"),
        "{}",
        a.message
    );
    let a = pod(&sigil, &format!("{h}/n-audit/testimage:signed")).await;
    assert!(
        a.allowed,
        "audit level only logs authenticity: {}",
        a.message
    );
}

/// Signatures made here with each key family, and the must-fail cases:
/// tampered payload, a valid signature over another digest, the wrong key.
#[tokio::test]
async fn own_key_signatures_of_each_family_and_the_must_fail_cases() {
    let reg = TestRegistry::start(Mode::Plain).await;
    let h = reg.host();
    let dir = tempfile::tempdir().unwrap();
    let mut keys = Vec::new();
    for (name, signer) in [
        ("p256", Signer::p256()),
        ("ed25519", Signer::ed25519()),
        ("rsa", Signer::rsa()),
    ] {
        let path = key_file(&dir, &format!("{name}.pub"), &signer);
        keys.push((name, signer, path));
    }
    let mut rules = String::new();
    for (name, signer, path) in &keys {
        let repo = format!("own/{name}");
        push_signed(&reg, &repo, "v1", &repo, signer).await;
        rules.push_str(&key_rule(name, &format!("{h}/{repo}"), &[(name, path)], ""));
    }
    let (_, p256, p256_path) = &keys[0];
    // Tampered: the signature of one payload attached to an edited payload.
    let d = reg.push_image("own/tampered", "v1").await;
    let good = signing::simple_signing(&format!("{h}/own/tampered"), &d);
    let sig = p256.sign(&good);
    let mut bad = good.clone();
    bad.extend_from_slice(b" ");
    signing::push_legacy(&reg, "own/tampered", &d, vec![Layer::new(bad, &sig)]).await;
    // Another digest: a valid signature of image X copied to image Y.
    let x = reg.push_image("own/other", "x").await;
    let y = reg.push_image("own/other", "y").await;
    let px = signing::simple_signing(&format!("{h}/own/other"), &x);
    let sx = p256.sign(&px);
    signing::push_legacy(&reg, "own/other", &y, vec![Layer::new(px, &sx)]).await;
    // A key-based signature checked with another family's key.
    let ed_path = &keys[1].2;
    rules.push_str(&key_rule(
        "tampered",
        &format!("{h}/own/tampered"),
        &[("p256", p256_path)],
        "",
    ));
    rules.push_str(&key_rule(
        "other",
        &format!("{h}/own/other"),
        &[("p256", p256_path)],
        "",
    ));
    let d_wrong = reg.push_image("own/wrongkey", "v1").await;
    let pw = signing::simple_signing(&format!("{h}/own/wrongkey"), &d_wrong);
    let sw = p256.sign(&pw);
    signing::push_legacy(&reg, "own/wrongkey", &d_wrong, vec![Layer::new(pw, &sw)]).await;
    rules.push_str(&key_rule(
        "wrongkey",
        &format!("{h}/own/wrongkey"),
        &[("ed", ed_path)],
        "",
    ));
    let sigil = Sigil::start(Some(&policy(&h, &rules)), &[]).await;

    for (name, _, _) in &keys {
        let a = pod(&sigil, &format!("{h}/own/{name}:v1")).await;
        assert!(a.allowed, "{name}: {}", a.message);
        assert!(image_of(&a).contains("@sha256:"));
    }
    let a = pod(&sigil, &format!("{h}/own/tampered:v1")).await;
    assert!(!a.allowed);
    assert!(a.message.contains("p256: wrong key"), "{}", a.message);
    let a = pod(&sigil, &format!("{h}/own/other:y")).await;
    assert!(!a.allowed);
    assert!(
        a.message
            .contains(&format!("p256: digest mismatch (signature is for {x})")),
        "{}",
        a.message
    );
    assert!(
        !pod(&sigil, &format!("{h}/own/other:x")).await.allowed,
        "x has no .sig of its own"
    );
    let a = pod(&sigil, &format!("{h}/own/wrongkey:v1")).await;
    assert!(!a.allowed);
    assert!(a.message.contains("ed: wrong key"), "{}", a.message);
}

/// Keyless signatures made here with a ten-minute leaf: valid at the log's
/// integratedTime; an entry logged after the leaf expired, a SET from another
/// log key and another identity each fail with their own reason.
#[tokio::test]
async fn own_keyless_signatures_are_checked_at_integrated_time() {
    use crate::support::sigstore::{GITHUB_ISSUER as issuer, GITHUB_WORKFLOW as who, KeylessWorld};
    let w = KeylessWorld::start().await;
    let (reg, ss, root) = (&w.registry, &w.sigstore, w.root.clone());
    let h = reg.host();
    let now = time::OffsetDateTime::now_utc().unix_timestamp();
    let forger = Signer::p256();
    let cases: [(&str, &str, i64, Option<&Signer>); 4] = [
        ("good", who, now - 3600 + 60, None),
        ("expired", who, now - 60, None),
        ("forged", who, now - 3600 + 60, Some(&forger)),
        (
            "stranger",
            "https://github.com/evil/app/.github/workflows/x.yml@refs/heads/main",
            now - 3600 + 60,
            None,
        ),
    ];
    for (name, subject, integrated, log) in cases {
        let repo = format!("kl/{name}");
        let d = reg.push_image(&repo, "v1").await;
        let payload = signing::simple_signing(&format!("{h}/{repo}"), &d);
        let k = ss.sign(&payload, subject, issuer, now - 3600, integrated, log);
        signing::push_legacy(reg, &repo, &d, vec![k.layer(payload)]).await;
    }
    let rules = format!(
        "    - name: ci\n      match: [\"{h}/kl/**\"]\n      verify:\n        - name: ci\n          cosign:\n            keyless:\n              issuer: {issuer}\n              subjectRegex: ^https://github\\.com/acme/.+$\n            trustedRoot: \"{}\"\n            transparencyLog: required\n",
        root.display()
    );
    let sigil = Sigil::start(Some(&policy(&h, &rules)), &[]).await;
    let a = pod(&sigil, &format!("{h}/kl/good:v1")).await;
    assert!(a.allowed, "{}", a.message);
    let a = pod(&sigil, &format!("{h}/kl/expired:v1")).await;
    assert!(!a.allowed);
    assert!(
        a.message
            .contains("ci: chain invalid: certificate not valid at"),
        "{}",
        a.message
    );
    let a = pod(&sigil, &format!("{h}/kl/forged:v1")).await;
    assert!(!a.allowed);
    assert!(
        a.message
            .contains("ci: log entry invalid: signed entry timestamp does not verify"),
        "{}",
        a.message
    );
    let a = pod(&sigil, &format!("{h}/kl/stranger:v1")).await;
    assert!(!a.allowed);
    assert!(
        a.message
            .contains("ci: identity mismatch (certificate has subject https://github.com/evil/"),
        "{}",
        a.message
    );
}

/// Sigstore bundles and notation envelopes made here, found through the
/// referrers tag schema; notation under the wrong root fails.
#[tokio::test]
async fn own_bundle_and_notation_signatures_via_referrers() {
    let reg = TestRegistry::start(Mode::Plain).await;
    let h = reg.host();
    let dir = tempfile::tempdir().unwrap();
    let key = Signer::p256();
    let key_path = key_file(&dir, "cosign.pub", &key);
    let d = reg.push_image("ref/bundle", "v1").await;
    let size = manifest_size(&reg, "ref/bundle", &d).await;
    signing::push_referrer(
        &reg,
        "ref/bundle",
        &d,
        size,
        "application/vnd.dev.sigstore.bundle.v0.3+json",
        "application/vnd.dev.sigstore.bundle.v0.3+json",
        &signing::dsse_bundle(&key, &d),
    )
    .await;
    // A bundle over another digest, attached to this one, does not count.
    let e = reg.push_image("ref/bundle", "v2").await;
    let size_e = manifest_size(&reg, "ref/bundle", &e).await;
    signing::push_referrer(
        &reg,
        "ref/bundle",
        &e,
        size_e,
        "application/vnd.dev.sigstore.bundle.v0.3+json",
        "application/vnd.dev.sigstore.bundle.v0.3+json",
        &signing::dsse_bundle(&key, &d),
    )
    .await;

    let nkey = Signer::rsa();
    let (cert_der, cert_pem) = signing::notation_cert(&nkey, "release-signer");
    let root_path = dir.path().join("notation.pem");
    std::fs::write(&root_path, &cert_pem).unwrap();
    let (_, other_pem) = signing::notation_cert(&Signer::rsa(), "someone-else");
    let other_path = dir.path().join("other.pem");
    std::fs::write(&other_path, &other_pem).unwrap();
    // COSE: an ES256 envelope under its own certificate, trusted by the same rule shape.
    let ckey = Signer::p256();
    let (ccert_der, ccert_pem) = signing::notation_cert(&ckey, "cose-signer");
    let croot = dir.path().join("cose.pem");
    std::fs::write(&croot, &ccert_pem).unwrap();
    let c = reg.push_image("ref/cose", "v1").await;
    let csize = manifest_size(&reg, "ref/cose", &c).await;
    signing::push_referrer(
        &reg,
        "ref/cose",
        &c,
        csize,
        "application/vnd.cncf.notary.signature",
        "application/cose",
        &signing::notation_cose(&ckey, &ccert_der, &c, csize),
    )
    .await;
    for repo in ["ref/notation", "ref/notation-wrong"] {
        let n = reg.push_image(repo, "v1").await;
        let size = manifest_size(&reg, repo, &n).await;
        let env = signing::notation_jws(&nkey, "PS256", &cert_der, &n, size);
        signing::push_referrer(
            &reg,
            repo,
            &n,
            size,
            "application/vnd.cncf.notary.signature",
            "application/jose+json",
            &env,
        )
        .await;
    }
    let rules = format!(
        "{}    - name: notation\n      match: [\"{h}/ref/notation\"]\n      verify:\n        - {{name: release, notation: {{trustRoots: [\"{}\"]}}}}\n    - name: notation-wrong\n      match: [\"{h}/ref/notation-wrong\"]\n      verify:\n        - {{name: release, notation: {{trustRoots: [\"{}\"]}}}}\n    - name: cose\n      match: [\"{h}/ref/cose\"]\n      verify:\n        - {{name: release, notation: {{trustRoots: [\"{}\"], level: strict}}}}\n",
        key_rule(
            "bundle",
            &format!("{h}/ref/bundle"),
            &[("key", &key_path)],
            ""
        ),
        root_path.display(),
        other_path.display(),
        croot.display()
    );
    let sigil = Sigil::start(Some(&policy(&h, &rules)), &[]).await;
    let a = pod(&sigil, &format!("{h}/ref/bundle:v1")).await;
    assert!(a.allowed, "{}", a.message);
    let a = pod(&sigil, &format!("{h}/ref/bundle:v2")).await;
    assert!(!a.allowed);
    assert!(
        a.message
            .contains(&format!("key: digest mismatch (signature is for {d})")),
        "{}",
        a.message
    );
    let a = pod(&sigil, &format!("{h}/ref/notation:v1")).await;
    assert!(a.allowed, "{}", a.message);
    let a = pod(&sigil, &format!("{h}/ref/cose:v1")).await;
    assert!(a.allowed, "COSE envelope: {}", a.message);
    assert_eq!(image_of(&a), format!("{h}/ref/cose:v1@{c}"));
    let a = pod(&sigil, &format!("{h}/ref/notation-wrong:v1")).await;
    assert!(!a.allowed);
    assert!(
        a.message.contains("release: chain invalid"),
        "{}",
        a.message
    );
}

async fn manifest_size(reg: &TestRegistry, repo: &str, digest: &str) -> usize {
    reg.manifest_size(repo, digest).await
}

/// Mirrors: signatures are looked up where the image is pulled from (the
/// mirror), or in `signatures.repository` when the rule says so; `warn`
/// admits unsigned images unchanged with a warning.
#[tokio::test]
async fn mirrored_images_verify_against_mirrored_signatures_or_the_signatures_repository() {
    let reg = TestRegistry::start(Mode::Plain).await;
    let h = reg.host();
    let dir = tempfile::tempdir().unwrap();
    let key = Signer::ed25519();
    let kp = key_file(&dir, "k.pub", &key);
    // Mirrored image and its mirrored signature.
    let d = reg.push_image("mirror/team/app", "v1").await;
    let p = signing::simple_signing("origin.example/team/app", &d);
    signing::push_legacy(
        &reg,
        "mirror/team/app",
        &d,
        vec![Layer::new(p.clone(), &key.sign(&p))],
    )
    .await;
    // Image whose signatures live in a separate repository.
    push_signed(&reg, "apps/svc", "v1", "signatures/svc", &key).await;
    let u = reg.push_image("warned/app", "v1").await;
    let rules = format!(
        "{}{}{}",
        key_rule("origin", "origin.example/team/**", &[("k", &kp)], ""),
        key_rule(
            "svc",
            &format!("{h}/apps/**"),
            &[("k", &kp)],
            &format!("      signatures: {{repository: \"{h}/signatures/svc\"}}\n")
        ),
        key_rule(
            "warned",
            &format!("{h}/warned/**"),
            &[("k", &kp)],
            "      mode: warn\n"
        ),
    );
    let text = policy(&h, &rules).replace(
        "  rules:\n",
        &format!(
            "  mirrors:\n    - {{from: origin.example/team, to: \"{h}/mirror/team\"}}\n  rules:\n"
        ),
    );
    let sigil = Sigil::start(Some(&text), &[]).await;
    let a = pod(&sigil, "origin.example/team/app:v1").await;
    assert!(a.allowed, "{}", a.message);
    assert_eq!(image_of(&a), format!("{h}/mirror/team/app:v1@{d}"));
    let a = pod(&sigil, &format!("{h}/apps/svc:v1")).await;
    assert!(a.allowed, "{}", a.message);
    let a = pod(&sigil, &format!("{h}/warned/app:v1")).await;
    assert!(a.allowed && !a.patched, "warn admits unchanged");
    assert!(
        a.warnings
            .iter()
            .any(|w| w.contains("k: no signature found")),
        "{:?}",
        a.warnings
    );
    assert!(!u.is_empty());
}

/// Twenty concurrent admissions of one image under four verifiers run one
/// verification, and it fetches the `.sig` manifest and the shared payload
/// blob once; later requests are cache hits.
#[tokio::test]
async fn concurrent_verifications_coalesce_and_fetch_each_signature_once() {
    let reg = TestRegistry::start(Mode::Plain).await;
    let h = reg.host();
    push_cosign_vectors(&reg, "co/testimage").await;
    let key = |k: &str| vpath(&format!("cosign/{k}.key"));
    let (alice, bob, charlie, default) = (key("alice"), key("bob"), key("charlie"), key("default"));
    let rules = key_rule(
        "co",
        &format!("{h}/co/**"),
        &[
            ("alice", &alice),
            ("bob", &bob),
            ("charlie", &charlie),
            ("default", &default),
        ],
        "      threshold: 3\n",
    );
    let sigil = Sigil::start(Some(&policy(&h, &rules)), &[]).await;
    let api = sigil.apiserver();
    let image = format!("{h}/co/testimage:abc");
    let images = [image.as_str()];
    let calls = (0..20).map(|_| api.create_pod("team", &images));
    let answers = futures_util::future::join_all(calls).await;
    assert!(answers.iter().all(|a| a.allowed), "{}", answers[0].message);
    assert_eq!(
        sigil
            .counter(
                "sigil_verification_cache_lookups_total",
                &[("result", "miss")]
            )
            .await,
        1.0
    );
    // One verification: .sig manifest (200), referrers API (404), tag schema (404), one payload blob.
    assert_eq!(
        sigil
            .counter("sigil_registry_requests_total", &[("method", "GET")])
            .await,
        4.0
    );
    for v in ["alice", "bob", "charlie"] {
        assert_eq!(
            sigil
                .counter(
                    "sigil_signature_verifications_total",
                    &[("verifier", v), ("result", "passed")]
                )
                .await,
            1.0
        );
    }
    // A later admission is answered without a future: from the reuse table
    // (the same Pod within the second, `admission::reuse`) or from the
    // verification cache (`SignatureVerifier::cached`), once per review
    // (the API server may call the webhook again after it mutated), no miss.
    let sigil = &sigil;
    let count = |name: &'static str, label: (&'static str, &'static str)| async move {
        sigil.counter(name, &[label]).await
    };
    let hits = || count("sigil_verification_cache_lookups_total", ("result", "hit"));
    let reviews = || count("sigil_admission_requests_total", ("operation", "CREATE"));
    let reused = || async move {
        sigil
            .counter("sigil_admission_answers_reused_total", &[])
            .await
    };
    let (hits_before, reviews_before, reused_before) =
        (hits().await, reviews().await, reused().await);
    let a = tokio::time::timeout(
        Duration::from_secs(5),
        api.create_pod("team", &[image.as_str()]),
    )
    .await
    .unwrap();
    assert!(a.allowed, "{}", a.message);
    let reviewed = reviews().await - reviews_before;
    assert!(reviewed >= 1.0);
    assert_eq!(
        hits().await - hits_before + reused().await - reused_before,
        reviewed
    );
    let misses = count("sigil_verification_cache_lookups_total", ("result", "miss"));
    assert_eq!(misses.await, 1.0);
}

/// `sigil policy check` reads the files `verify` names (a policy `sigil serve`
/// would refuse is not reported valid), and `--schema-only` checks without them.
#[test]
fn policy_check_loads_verification_material_unless_schema_only() {
    let example = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../examples/policy-verify.yaml"
    );
    let out = std::process::Command::new(crate::support::sigil::bin())
        .args(["policy", "check", example])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("rule \"team\", verifier \"alice\": /etc/sigil/alice.pub"),
        "{err}"
    );
    let out = crate::support::sigil::run_ok(
        std::process::Command::new(crate::support::sigil::bin()).args([
            "policy",
            "check",
            "--schema-only",
            example,
        ]),
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("at least 2 of alice, bob, ci, release, including alice; signatures are read from registry.example.com/team/signatures"),
        "{text}"
    );
}

/// `sigil serve` refuses to start on a policy whose key cannot be read,
/// saying which rule, verifier and file.
#[test]
fn serve_refuses_a_policy_whose_key_cannot_be_read() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("policy.yaml");
    std::fs::write(
        &p,
        policy(
            "127.0.0.1:1",
            &key_rule("r", "**", &[("k", "/nonexistent/k.pub")], ""),
        ),
    )
    .unwrap();
    let out = std::process::Command::new(crate::support::sigil::bin())
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--admin-listen",
            "127.0.0.1:0",
            "--policy",
        ])
        .arg(&p)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("verifier \"k\": /nonexistent/k.pub"), "{err}");
}

/// Client-side pinning runs the same verification: `sigil pin` pins the
/// signed image and refuses the unsigned one with the same reason.
#[tokio::test]
async fn sigil_pin_verifies_like_the_webhook() {
    let reg = TestRegistry::start(Mode::Plain).await;
    let h = reg.host();
    let dir = tempfile::tempdir().unwrap();
    let key = Signer::p256();
    let key_path = key_file(&dir, "k.pub", &key);
    let d = push_signed(&reg, "cli/app", "signed", "cli/app", &key).await;
    reg.push_image("cli/app", "unsigned").await;
    let policy_file = dir.path().join("policy.yaml");
    std::fs::write(
        &policy_file,
        policy(
            &h,
            &key_rule("cli", &format!("{h}/cli/**"), &[("k", &key_path)], ""),
        ),
    )
    .unwrap();
    let manifest = |tag: &str| {
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: p, namespace: team}}\nspec:\n  containers:\n    - name: app\n      image: {h}/cli/app:{tag}\n"
        )
    };
    let policy = policy_file.to_string_lossy();
    let run = |tag: &str| {
        crate::support::sigil::run_sigil(&["pin", "--policy", &policy, "-"], Some(&manifest(tag)))
    };
    // The registry is another process: blocking this test's thread is fine.
    let (ok, bad) = (run("signed"), run("unsigned"));
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    assert!(String::from_utf8_lossy(&ok.stdout).contains(&format!("{h}/cli/app:signed@{d}")));
    assert_eq!(bad.status.code(), Some(1));
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(
        err.contains("failed signature verification") && err.contains("k: no signature found"),
        "{err}"
    );
}

/// A rotated key file takes effect without a restart or a policy edit: the
/// policy watcher also watches the files `verify` names.
#[tokio::test]
async fn rotated_key_file_takes_effect_without_restart() {
    let reg = TestRegistry::start(Mode::Plain).await;
    let h = reg.host();
    let dir = tempfile::tempdir().unwrap();
    let (old, new) = (Signer::p256(), Signer::p256());
    let key_path = key_file(&dir, "k.pub", &old);
    push_signed(&reg, "rot/app", "v1", "rot/app", &new).await;
    let rules = key_rule("rot", &format!("{h}/rot/**"), &[("k", &key_path)], "");
    let sigil = Sigil::start(Some(&policy(&h, &rules)), &[]).await;
    let image = format!("{h}/rot/app:v1");
    assert!(
        !pod(&sigil, &image).await.allowed,
        "signed by the new key, policy trusts the old"
    );
    key_file(&dir, "k.pub", &new);
    let until = std::time::Instant::now() + Duration::from_secs(15);
    loop {
        if pod(&sigil, &image).await.allowed {
            break;
        }
        assert!(
            std::time::Instant::now() < until,
            "rotated key never took effect: {}",
            sigil.logs()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Signatures in a registry that needs credentials are fetched with the
/// policy's credentials (manifests and blobs alike), and the password never
/// reaches the logs.
#[tokio::test]
async fn signatures_behind_htpasswd_are_fetched_with_the_policy_credentials() {
    let reg = TestRegistry::start(Mode::Htpasswd {
        user: "robot",
        password: "s3cr3t-pa55",
    })
    .await;
    let h = reg.host();
    let dir = tempfile::tempdir().unwrap();
    let key = Signer::p256();
    let kp = key_file(&dir, "k.pub", &key);
    let d = push_signed(&reg, "private/app", "v1", "private/app", &key).await;
    let pw = dir.path().join("pw");
    std::fs::write(&pw, "s3cr3t-pa55\n").unwrap();
    let text = policy(&h, &key_rule("private", &format!("{h}/private/**"), &[("k", &kp)], ""))
        .replace(
            &format!("    - {{host: \"{h}\", insecure: true}}\n"),
            &format!(
                "    - host: \"{h}\"\n      insecure: true\n      auth: {{username: robot, passwordFile: \"{}\"}}\n",
                pw.display()
            ),
        );
    let sigil = Sigil::start(Some(&text), &[]).await;
    let a = pod(&sigil, &format!("{h}/private/app:v1")).await;
    assert!(a.allowed, "{}", a.message);
    assert_eq!(image_of(&a), format!("{h}/private/app:v1@{d}"));
    assert!(!sigil.settled_logs().await.contains("s3cr3t-pa55"));
}

/// `sigil verify IMAGE | head -1` panicked ("failed printing to stdout",
/// exit 101) once the reader had gone, as `sigil audit | head` once did:
/// its lines now go out through `say!`, and it exits 2 saying stdout is
/// gone. An image pinned by digest under the embedded policy needs no
/// registry.
#[test]
fn verify_into_a_reader_that_has_gone_is_an_error_not_a_panic() {
    let image = format!("docker.io/library/nginx@sha256:{}", "a".repeat(64));
    let (code, err) = crate::support::sigil::into_closed_pipe(
        std::process::Command::new(crate::support::sigil::bin())
            .args(["verify", &image])
            .env_remove("SIGIL_POLICY"),
    );
    assert!(!err.contains("panicked"), "{err}");
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("Broken pipe"), "{err}");
    // Read, the same command answers.
    let out = std::process::Command::new(crate::support::sigil::bin())
        .args(["verify", &image])
        .env_remove("SIGIL_POLICY")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.starts_with("image:   docker.io/library/nginx@sha256:"),
        "{text}"
    );
    assert!(text.contains("result:  "), "{text}");
}
