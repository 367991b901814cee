//! `sigil verify-bundle` on real attestations signed by other projects
//! (`tests/vectors/attestations`, attribution in its README): each case
//! passes or fails as its upstream test says, for the reason it says.

use std::path::PathBuf;

use crate::support::sigil::run_sigil;

fn case(id: &str, file: &str) -> String {
    vectors()
        .join("cases")
        .join(id)
        .join(file)
        .display()
        .to_string()
}

fn vectors() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/vectors/attestations")
}

fn trust() -> String {
    vectors()
        .join("trust/sigstore-public-good.trusted_root.json")
        .display()
        .to_string()
}

const GHA: &str = "https://token.actions.githubusercontent.com";

/// Runs `sigil verify-bundle` with the public-good root; returns (exit, stdout + stderr).
fn verify(args: &[&str]) -> (i32, String) {
    let root = trust();
    let mut all = vec!["verify-bundle", "--trusted-root", &root];
    all.extend_from_slice(args);
    let out = run_sigil(&all, None);
    (
        out.status.code().unwrap_or(-1),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

fn expect(args: &[&str], code: i32, says: &str) {
    let (got, text) = verify(args);
    assert_eq!(got, code, "{args:?}: {text}");
    assert!(text.contains(says), "{args:?} should say {says:?}: {text}");
}

#[test]
fn a_custom_issuer_bundle_passes_only_with_its_issuer() {
    let b = case("gh-custom-issuer-pass", "custom-issuer.sigstore.json");
    let a = case("gh-custom-issuer-pass", "custom-issuer-artifact");
    let san =
        "https://github.com/too-legit/attest/.github/workflows/integration.yml@refs/heads/main";
    expect(
        &[
            "--bundle",
            &b,
            "--certificate-identity",
            san,
            "--certificate-oidc-issuer",
            "https://token.actions.githubusercontent.com/hammer-time",
            "--predicate-type",
            "slsaprovenance1",
            "--condition",
            r#"signer.sourceRepositoryUri == "https://github.com/too-legit/attest""#,
            "--condition",
            r#"signer.sourceRepositoryOwnerUri == "https://github.com/too-legit""#,
            &a,
        ],
        0,
        "holds",
    );
    expect(
        &[
            "--bundle",
            &b,
            "--certificate-identity-regexp",
            "^https://github.com/too-legit/attest",
            "--certificate-oidc-issuer",
            GHA,
            &a,
        ],
        1,
        "identity mismatch",
    );
    // The right signer, the wrong predicate type.
    expect(
        &[
            "--bundle",
            &b,
            "--certificate-identity",
            san,
            "--certificate-oidc-issuer-regexp",
            "^https://token.actions.githubusercontent.com/",
            "--predicate-type",
            "cyclonedx",
            &a,
        ],
        1,
        "predicate type is https://slsa.dev/provenance/v1, not https://cyclonedx.org/bom",
    );
}

#[test]
fn a_reusable_workflow_attestation_needs_the_signer_workflow_that_signed_it() {
    let b = case(
        "gh-reusable-workflow-wrong-signer-workflow-fail",
        "reusable-workflow-attestation.sigstore.json",
    );
    let a = case(
        "gh-reusable-workflow-wrong-signer-workflow-fail",
        "reusable-workflow-artifact",
    );
    expect(
        &[
            "--bundle",
            &b,
            "--certificate-identity-regexp",
            "^https://github.com/foo/bar/.github/workflows/attest.yml@",
            "--certificate-oidc-issuer",
            GHA,
            &a,
        ],
        1,
        "identity mismatch",
    );
    expect(
        &[
            "--bundle",
            &b,
            "--certificate-identity-regexp",
            "^https://github.com/github/artifact-attestations-workflows/.github/workflows/attest.yml@",
            "--certificate-oidc-issuer",
            GHA,
            "--predicate-type",
            "https://slsa.dev/provenance/v1",
            "--condition",
            r#"signer.sourceRepositoryUri == "https://github.com/malancas/attest-demo""#,
            &a,
        ],
        0,
        "holds",
    );
}

#[test]
fn an_npm_provenance_is_matched_by_sha512_and_its_repository_extension() {
    let b = case(
        "gh-sigstore-js-2.1.0-wrong-repo-fail",
        "sigstore-js-2.1.0-bundle.json",
    );
    let a = case(
        "gh-sigstore-js-2.1.0-wrong-repo-fail",
        "sigstore-js-2.1.0.tgz",
    );
    let base = [
        "--bundle",
        &b,
        "--certificate-identity-regexp",
        "^https://github.com/sigstore/",
        "--certificate-oidc-issuer",
        GHA,
    ];
    let wrong = [
        &base[..],
        &[
            "--certificate-github-workflow-repository",
            "sigstore/fakerepo",
            &a,
        ],
    ]
    .concat();
    expect(
        &wrong,
        1,
        "certificate has githubWorkflowRepository sigstore/sigstore-js, not sigstore/fakerepo",
    );
    let cel = [
        &base[..],
        &[
            "--condition",
            r#"signer.sourceRepositoryUri == "https://github.com/sigstore/fakerepo""#,
            &a,
        ],
    ]
    .concat();
    expect(&cel, 1, "condition not met");
    let right = [
        &base[..],
        &[
            "--certificate-github-workflow-repository",
            "sigstore/sigstore-js",
            "--predicate-type",
            "slsaprovenance1",
            "--condition",
            r#"subject.name == "pkg:npm/sigstore@2.1.0""#,
            &a,
        ],
    ]
    .concat();
    expect(&right, 0, "holds");
}

#[test]
fn a_provenance_about_another_sha512_digest_counts_as_none() {
    expect(
        &[
            "--bundle",
            &case(
                "sgo-sigstore-js-2.0.0-wrong-digest-fail",
                "sigstore.js@2.0.0-provenance.sigstore.json",
            ),
            "--certificate-identity-regexp",
            "^https://github.com/sigstore/sigstore-js/",
            "--certificate-oidc-issuer",
            GHA,
            "sha512:56d4e2f74c4877316640000a6fdf8a8b59f1e0847667973e9859f774dd31b8f1e0937813b777fb66a2ac67d50540fe34640966eee9fc2ccca387082b4c85cd3c",
        ],
        1,
        "digest mismatch (signature is for sha512:46d4e2f7",
    );
}

#[test]
fn key_signed_sbom_envelopes_verify_and_a_tampered_one_does_not() {
    let e = case("grype-cdx-sbom-pass", "alpine.cdx.att.json");
    let subject = "sha256:".to_owned() + &subject_of(&e);
    expect(
        &[
            "--bundle",
            &e,
            "--key",
            &case("grype-cdx-sbom-pass", "cosign.pub"),
            "--predicate-type",
            "cyclonedx",
            "--condition",
            r#"predicate.bomFormat == "CycloneDX" && size(predicate.components) > 0"#,
            &subject,
        ],
        0,
        "predicateType https://cyclonedx.org/bom",
    );
    // The same envelope about another image counts as none.
    expect(
        &[
            "--bundle",
            &e,
            "--key",
            &case("grype-cdx-sbom-pass", "cosign.pub"),
            &format!("sha256:{}", "0".repeat(64)),
        ],
        1,
        "digest mismatch",
    );
    let t = case(
        "grype-syft-sbom-tampered-payload-fail",
        "alpine-tampered.att.json",
    );
    let subject = "sha256:".to_owned() + &subject_of(&t);
    expect(
        &[
            "--bundle",
            &t,
            "--key",
            &case("grype-syft-sbom-tampered-payload-fail", "cosign.pub"),
            &subject,
        ],
        1,
        "wrong key",
    );
}

fn subject_of(envelope: &str) -> String {
    use base64::Engine as _;
    let e: serde_json::Value = serde_json::from_slice(&std::fs::read(envelope).unwrap()).unwrap();
    let payload = base64::engine::general_purpose::STANDARD
        .decode(e["payload"].as_str().unwrap())
        .unwrap();
    let s: serde_json::Value = serde_json::from_slice(&payload).unwrap();
    s["subject"][0]["digest"]["sha256"]
        .as_str()
        .unwrap()
        .to_owned()
}

#[test]
fn a_dsse_bundle_with_two_signatures_is_malformed() {
    expect(
        &[
            "--bundle",
            &case("sgo-dsse-two-signatures-fail", "dsse-2sigs.sigstore.json"),
            "--certificate-identity-regexp",
            ".",
            "--certificate-oidc-issuer-regexp",
            ".",
            &format!("sha256:{}", "0".repeat(64)),
        ],
        1,
        "2 signatures; exactly one is required",
    );
}

#[test]
fn slsa_generator_files_verify_with_the_builder_on_the_certificate() {
    let id = "slsa-gha-generic-v2.1.0-pass";
    let digest =
        std::fs::read_to_string(case(id, "binary-linux-amd64-workflow_dispatch.sha256")).unwrap();
    expect(
        &[
            "--bundle",
            &case(id, "binary-linux-amd64-workflow_dispatch.intoto.jsonl"),
            "--certificate-identity-regexp",
            "^https://github.com/slsa-framework/slsa-github-generator/.github/workflows/generator_generic_slsa3.yml@refs/tags/v2.1.0$",
            "--certificate-oidc-issuer",
            GHA,
            "--predicate-type",
            "slsaprovenance",
            "--condition",
            r#"signer.sourceRepositoryUri == "https://github.com/slsa-framework/example-package" && signer.sourceRepositoryRef == "refs/heads/main""#,
            &format!("sha256:{}", digest.trim()),
        ],
        0,
        "predicateType https://slsa.dev/provenance/v0.2",
    );
    // BYOB: the certificate names the trusted delegator, the builder is in the provenance.
    let id = "slsa-gha-delegator-v2.1.0-pass";
    expect(
        &[
            "--bundle",
            &case(id, "binary-linux-amd64-workflow_dispatch.build.slsa"),
            "--certificate-identity-regexp",
            "^https://github.com/slsa-framework/slsa-github-generator/.github/workflows/delegator_generic_slsa3.yml@",
            "--certificate-oidc-issuer",
            GHA,
            "--predicate-type",
            "slsaprovenance1",
            "--condition",
            r#"predicate.runDetails.builder.id.startsWith("https://github.com/slsa-framework/example-trw/.github/workflows/builder_high-perms_slsa3.yml@")"#,
            &case(id, "binary-linux-amd64-workflow_dispatch"),
        ],
        0,
        "holds",
    );
    // A validly signed attestation for the same bytes by another workflow.
    let id = "slsa-bcr-module-wrong-signer-fail";
    expect(
        &[
            "--bundle",
            &case(id, "MODULE-wrong-signer.bazel.intoto.jsonl"),
            "--certificate-identity-regexp",
            "^https://github.com/bazel-contrib/publish-to-bcr/.github/workflows/publish.yaml@",
            "--certificate-oidc-issuer",
            GHA,
            &case(id, "MODULE-wrong-signer.bazel"),
        ],
        1,
        "malicious_attestation.yaml",
    );
}

#[test]
fn bad_conditions_and_flags_are_bad_input() {
    let b = case("gh-custom-issuer-pass", "custom-issuer.sigstore.json");
    let a = case("gh-custom-issuer-pass", "custom-issuer-artifact");
    for (extra, says) in [
        (
            vec![
                "--certificate-identity-regexp",
                ".",
                "--certificate-oidc-issuer",
                GHA,
                "--condition",
                "a +",
            ],
            "condition",
        ),
        (
            vec![
                "--certificate-identity-regexp",
                "(",
                "--certificate-oidc-issuer",
                GHA,
            ],
            "regexp",
        ),
        (vec!["--certificate-identity-regexp", "x"], "issuer"),
    ] {
        let mut args = vec!["--bundle", b.as_str()];
        args.extend(extra);
        args.push(&a);
        let (code, text) = verify(&args);
        assert_eq!(code, 2, "{args:?}: {text}");
        assert!(text.contains(says), "{args:?}: {text}");
    }
}
