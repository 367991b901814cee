//! The Sigstore conformance suite's `bundle-verify` cases (the part copied,
//! with its attribution, into `crates/sigil-verify/tests/vectors/sigstore-conformance`),
//! each run through
//! `sigil verify-bundle` exactly as the suite's harness drives a client: a
//! directory per case, `_fail` = must fail, optional `artifact`, `identity`,
//! `issuer`, `key.pub`, `trusted_root.json`, with the README's defaults.

use std::process::Command;

use sigil_testkit::conformance::{self, Case, suite};

use crate::support::sigil::bin;

/// Hex SHA-256 of the suite's default artifact `a.txt`.
fn a_txt_sha256() -> String {
    let a = std::fs::read(suite().join("a.txt")).unwrap();
    aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, &a)
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Runs one case; returns (passed as expected, what sigil said).
fn run_case(case: &Case, artifact_override: Option<&str>) -> (bool, String) {
    let mut cmd = Command::new(bin());
    cmd.arg("verify-bundle")
        .arg("--bundle")
        .arg(case.bundle())
        .arg("--trusted-root")
        .arg(case.trusted_root());
    match case.key() {
        Some(key) => cmd.arg("--key").arg(key),
        None => cmd
            .arg("--certificate-identity")
            .arg(case.identity())
            .arg("--certificate-oidc-issuer")
            .arg(case.issuer()),
    };
    match artifact_override {
        Some(a) => cmd.arg(a),
        None => cmd.arg(case.artifact()),
    };
    let out = cmd.output().unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success() != case.must_fail(), said)
}

#[test]
fn every_conformance_case_in_the_repository_passes_through_sigil_verify_bundle() {
    let cases = conformance::cases();
    assert!(
        cases.len() >= 35,
        "the suite here has {} cases",
        cases.len()
    );
    let mut wrong = Vec::new();
    for case in &cases {
        let (ok, said) = run_case(case, None);
        if !ok {
            wrong.push(format!("{}: {said}", case.name()));
        }
    }
    assert!(
        wrong.is_empty(),
        "cases that did not behave as required:\n{}",
        wrong.join("\n")
    );
}

/// The protocol's `sha256:<hex>` argument: a message-signature bundle
/// verifies against the artifact's digest alone, and a wrong digest fails.
#[test]
fn a_digest_argument_stands_for_the_artifact() {
    let dir = Case::named("happy-path-v0.3");
    let hex = a_txt_sha256();
    let (ok, said) = run_case(&dir, Some(&format!("sha256:{hex}")));
    assert!(ok, "{said}");
    let (ok, _) = run_case(&dir, Some(&format!("sha256:{}", "0".repeat(64))));
    assert!(!ok, "a wrong digest must fail");
    let bad = Command::new(bin())
        .args([
            "verify-bundle",
            "--bundle",
            "/nonexistent",
            "--key",
            "/nonexistent",
            "x",
        ])
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(2), "bad input is exit 2");
}

/// The conformance case `happy-path-v0.3` with a `dsseEnvelope` added whose
/// statement names the artifact (cosign's sign predicate) and whose
/// signature is garbage: `content` is a oneof, so the bundle is malformed —
/// it once verified the message signature and trusted the unsigned statement.
#[test]
fn a_bundle_with_both_message_signature_and_dsse_envelope_fails_verify_bundle() {
    use base64::Engine as _;
    let b64 = |d: &[u8]| base64::engine::general_purpose::STANDARD.encode(d);
    let case = Case::named("happy-path-v0.3");
    let hex = a_txt_sha256();
    let mut bundle: serde_json::Value =
        serde_json::from_slice(&std::fs::read(case.bundle()).unwrap()).unwrap();
    let statement = serde_json::json!({
        "_type": "https://in-toto.io/Statement/v1",
        "subject": [{"name": "a.txt", "digest": {"sha256": hex}}],
        "predicateType": "https://sigstore.dev/cosign/sign/v1",
        "predicate": {}
    });
    bundle["dsseEnvelope"] = serde_json::json!({
        "payload": b64(statement.to_string().as_bytes()),
        "payloadType": "application/vnd.in-toto+json",
        "signatures": [{"sig": b64(b"garbage"), "keyid": ""}]
    });
    let dir = tempfile::tempdir().unwrap();
    for f in std::fs::read_dir(&case.dir).unwrap() {
        let f = f.unwrap().path();
        std::fs::copy(&f, dir.path().join(f.file_name().unwrap())).unwrap();
    }
    std::fs::write(
        dir.path().join("bundle.sigstore.json"),
        serde_json::to_vec(&bundle).unwrap(),
    )
    .unwrap();
    let (ok, said) = run_case(
        &Case::at(dir.path()),
        Some(suite().join("a.txt").to_str().unwrap()),
    );
    assert!(!ok, "accepted: {said}");
    assert!(
        said.contains("both messageSignature and dsseEnvelope"),
        "{said}"
    );
}

/// The webhook accepts a Rekor-v2-style keyless bundle (an RFC 3161
/// timestamp, an inclusion proof against a signed checkpoint, no SET)
/// attached through the referrers tag schema, refuses its tampered variants
/// with the verifier's reason, and applies `inclusionProof` and
/// `timestampThreshold`.
#[tokio::test]
async fn the_webhook_verifies_rekor_v2_bundles_and_refuses_tampered_ones() {
    use crate::support::sigil::Sigil;
    use serde_json::json;

    const MT: &str = "application/vnd.dev.sigstore.bundle.v0.3+json";
    use crate::support::sigstore::{GITHUB_ISSUER as issuer, GITHUB_WORKFLOW as who, KeylessWorld};
    let w = KeylessWorld::start().await;
    let (reg, ss, root) = (&w.registry, &w.sigstore, w.root.clone());
    let h = reg.host();
    let now = time::OffsetDateTime::now_utc().unix_timestamp();
    let mut images = Vec::new();
    for name in ["good", "proof", "untimed", "late", "stranger"] {
        let repo = format!("v2/{name}");
        let d = reg.push_image(&repo, "v1").await;
        let mut b = match name {
            "stranger" => ss.rekor_v2_bundle(
                &d,
                "https://github.com/evil/x",
                issuer,
                now - 600,
                now - 590,
            ),
            "late" => ss.rekor_v2_bundle(&d, who, issuer, now - 3600, now - 60),
            _ => ss.rekor_v2_bundle(&d, who, issuer, now - 600, now - 590),
        };
        match name {
            "proof" => {
                let p = "/verificationMaterial/tlogEntries/0/inclusionProof/hashes/0";
                *b.pointer_mut(p).unwrap() = json!(crate::support::signing::b64(&[7u8; 32]));
            }
            "untimed" => {
                b["verificationMaterial"]
                    .as_object_mut()
                    .unwrap()
                    .remove("timestampVerificationData");
            }
            _ => {}
        }
        let size = reg.manifest_size(&repo, &d).await;
        let bytes = serde_json::to_vec(&b).unwrap();
        crate::support::signing::push_referrer(reg, &repo, &d, size, MT, MT, &bytes).await;
        images.push(format!("{h}/{repo}:v1"));
    }
    let rule = |extra: &str| {
        format!(
            "apiVersion: sigil.dev/v1alpha1\nkind: ImagePolicy\nspec:\n  registries: [{{host: \"{h}\", insecure: true}}]\n  rules:\n    - name: v2\n      match: [\"{h}/v2/**\"]\n      verify:\n        - name: ci\n          cosign:\n            keyless: {{issuer: \"{issuer}\", subjectRegex: \"^https://github\\\\.com/acme/.+$\"}}\n            trustedRoot: \"{}\"\n{extra}",
            root.display()
        )
    };
    let sigil = Sigil::start(
        Some(&rule(
            "            inclusionProof: required\n            timestampThreshold: 1\n",
        )),
        &[],
    )
    .await;
    let api = sigil.apiserver();
    let a = api.create_pod("team", &[&images[0]]).await;
    assert!(a.allowed, "{}", a.message);
    for (img, reason) in [
        (
            &images[1],
            "ci: log entry invalid: inclusion proof does not lead to its root hash",
        ),
        (
            &images[2],
            "ci: 0 verified RFC 3161 timestamp(s); the policy requires 1",
        ),
        (&images[3], "ci: chain invalid: certificate not valid at"),
        (&images[4], "ci: identity mismatch"),
    ] {
        let a = api.create_pod("team", &[img]).await;
        assert!(!a.allowed, "{img} admitted");
        assert!(a.message.contains(reason), "{img}: {}", a.message);
    }
    drop(sigil);
    // Without a timestamp there is no signing time at all: refused even
    // when the policy asks for none.
    let sigil = Sigil::start(Some(&rule("")), &[]).await;
    let a = sigil.apiserver().create_pod("team", &[&images[2]]).await;
    assert!(!a.allowed);
    assert!(
        a.message.contains("no verified signing time"),
        "{}",
        a.message
    );
    let a = sigil.apiserver().create_pod("team", &[&images[0]]).await;
    assert!(a.allowed, "{}", a.message);

    // `sigil verify IMAGE`: what the user runs after the denial.
    let verify = |img: &str| {
        let out = Command::new(bin())
            .args(["verify", "--policy"])
            .arg(sigil.policy_path())
            .arg(img)
            .output()
            .unwrap();
        (
            out.status.code(),
            format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        )
    };
    let (code, out) = verify(&images[0]);
    assert_eq!(code, Some(0), "{out}");
    assert!(
        out.contains("rule:    v2") && out.contains("  ci: passed"),
        "{out}"
    );
    assert!(
        out.contains(&format!("runs as: {}@sha256:", images[0])),
        "{out}"
    );
    let (code, out) = verify(&images[1]);
    assert_eq!(code, Some(1), "{out}");
    assert!(
        out.contains(
            "  ci: FAILED: log entry invalid: inclusion proof does not lead to its root hash"
        ),
        "{out}"
    );
    assert!(out.contains("result:  denied:unverified"), "{out}");
}
