//! Attestation rules end to end, through `sigil serve` against the real
//! registry: every predicate type platform teams ask for, minted by the test
//! kit in each layout (`.att` and referrer bundles; keyed, keyless with a
//! Rekor v1 SET, keyless against Rekor v2 with a timestamp), each tampered
//! variant refused with its reason; the real slsa-github-generator images
//! pushed byte for byte; and `sigil verify`, `sigil pin` and `sigil audit`
//! reading the same rules.

use std::path::Path;

use serde_json::{Value, json};

use crate::support::attestations::{
    self as att, CYCLONEDX, OPENVEX, SLSA_V1, SLSA_V02, SPDX, VULN, push_att, push_bundles,
};
use crate::support::intoto::statement;
use crate::support::registry::TestRegistry;
use crate::support::sigil::{Sigil, audit_command, run_bounded, run_sigil};
use crate::support::signing::Signer;
use crate::support::sigstore::{GITHUB_ISSUER, GITHUB_WORKFLOW, KeylessWorld};

const API: &str = "https://github.com/acme/api";
const VECTORS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/vectors/attestations");

fn now() -> i64 {
    time::OffsetDateTime::now_utc().unix_timestamp()
}

fn stmt(digest: &str, pt: &str) -> Vec<u8> {
    statement(digest, pt, att::predicate(pt, API, now() - 3600))
}

fn key_file(dir: &Path, name: &str, key: &Signer) -> String {
    let p = dir.join(name);
    std::fs::write(&p, key.public_pem()).unwrap();
    p.display().to_string()
}

fn write_policy(dir: &Path, host: &str, rules: &str) -> String {
    let text = format!(
        "apiVersion: sigil.dev/v1alpha1\nkind: ImagePolicy\nmetadata: {{name: attest-test}}\nspec:\n  registries:\n    - {{host: \"{host}\", insecure: true}}\n  rules:\n{rules}"
    );
    let p = dir.join("policy.yaml");
    std::fs::write(&p, &text).unwrap();
    text
}

/// The keyless attestor every rule here trusts: GitHub Actions of acme,
/// and only builds of acme/api (a Fulcio-extension matcher).
fn gha(root: &Path) -> String {
    format!(
        "{{name: gha, cosign: {{keyless: {{issuer: \"{GITHUB_ISSUER}\", subjectRegex: \"^https://github\\\\.com/acme/\", extensions: {{sourceRepositoryUri: \"{API}\"}}}}, trustedRoot: \"{}\"}}}}",
        root.display()
    )
}

/// Everything a platform team requires, attested in every layout: admitted,
/// and the audit annotation names each attestation that vouched.
#[tokio::test]
async fn every_predicate_type_in_every_layout_is_verified_with_its_conditions() {
    let w = KeylessWorld::start().await;
    let (reg, ss) = (&w.registry, &w.sigstore);
    let h = reg.host();
    let team = Signer::p256();
    let team_pub = key_file(w.dir.path(), "team.pub", &team);
    let d = reg.push_image("att/app", "v1").await;
    let t = now();
    let ext = [
        ("sourceRepositoryUri", API),
        ("sourceRepositoryRef", "refs/heads/main"),
    ];
    // .att: keyless SLSA v1 (Rekor v1 SET), keyed SPDX and OpenVEX.
    push_att(
        reg,
        "att/app",
        &d,
        &[
            ss.attest_layer(
                &stmt(&d, SLSA_V1),
                GITHUB_WORKFLOW,
                GITHUB_ISSUER,
                &ext,
                t - 3600,
                t - 3500,
            ),
            att::keyed_layer(&team, &stmt(&d, SPDX)),
            att::keyed_layer(&team, &stmt(&d, OPENVEX)),
        ],
    )
    .await;
    // Referrer bundles: keyless vuln scan (Rekor v2 + TSA), keyed CycloneDX and SLSA v0.2.
    push_bundles(
        reg,
        "att/app",
        &d,
        &[
            ss.attest_bundle(
                &stmt(&d, VULN),
                GITHUB_WORKFLOW,
                GITHUB_ISSUER,
                &ext,
                t - 3600,
                t - 3500,
            ),
            att::keyed_bundle(&team, &stmt(&d, CYCLONEDX)),
            att::keyed_bundle(&team, &stmt(&d, SLSA_V02)),
        ],
    )
    .await;
    let rules = format!(
        r#"    - name: attested
      match: ["{h}/att/**"]
      verify:
        - {{name: team, cosign: {{key: "{team_pub}"}}}}
      attestations:
        - name: built-by-ci
          predicateType: slsaprovenance1
          attestors: [{gha}]
          conditions:
            - expression: predicate.buildDefinition.externalParameters.workflow.repository == "{API}"
              message: built from acme/api
            - expression: signer.sourceRepositoryRef == "refs/heads/main" && image.digest == "{d}"
        - name: fresh-scan
          predicateType: vuln
          attestors: [{gha}]
          conditions:
            - expression: now - timestamp(predicate.metadata.scanFinishedOn) < duration("168h")
            - expression: predicate.scanner.result.summary.critical == 0
            - expression: timestamps.size() == 1 && timestamps[0] < now
        - {{name: sbom, predicateType: spdx, attestors: [team], maxAttestationSize: 2Mi, conditions: [{{expression: 'predicate.packages.exists(p, p.name == "openssl")'}}]}}
        - {{name: cdx, predicateType: cyclonedx, attestors: [team], conditions: [{{expression: 'predicate.components.size() > 0'}}]}}
        - {{name: vex, predicateType: openvex, attestors: [team], maxAttestationSize: 2Mi, conditions: [{{expression: 'predicate.statements.all(s, s.status == "not_affected")'}}]}}
        - {{name: prov02, predicateType: slsaprovenance02, attestors: [team], conditions: [{{expression: 'predicate.builder.id.startsWith("https://github.com/slsa-framework/")'}}]}}
"#,
        gha = gha(&w.root)
    );
    let policy = write_policy(w.dir.path(), &h, &rules);
    // No image signature yet: every attestation passes, and the rule is
    // denied for its signature (attestors named from verify need no image
    // signature of their own).
    let sigil = Sigil::start(Some(&policy), &[]).await;
    let a = sigil
        .apiserver()
        .create_pod("team", &[&format!("{h}/att/app:v1")])
        .await;
    assert!(!a.allowed);
    assert!(
        a.message.contains("failed signature verification"),
        "{}",
        a.message
    );
    assert!(
        a.message.contains("team: no signature found"),
        "{}",
        a.message
    );
    for name in ["built-by-ci", "fresh-scan", "sbom", "cdx", "vex", "prov02"] {
        assert!(
            a.message.contains(&format!("attestation {name}: ok")),
            "{name}: {}",
            a.message
        );
    }
    // The same rule with the signature supplied: admitted, pinned, and the
    // audit annotation names what vouched.
    let payload = crate::support::signing::simple_signing(&format!("{h}/att/app"), &d);
    crate::support::signing::push_legacy(
        reg,
        "att/app",
        &d,
        vec![crate::support::signing::Layer::new(
            payload.clone(),
            &team.sign(&payload),
        )],
    )
    .await;
    let sigil = Sigil::start(Some(&policy), &[]).await;
    let a = sigil
        .apiserver()
        .create_pod("team", &[&format!("{h}/att/app:v1")])
        .await;
    assert!(a.allowed, "{}", a.message);
    assert_eq!(
        a.response["response"]["auditAnnotations"]["verified"],
        json!(
            "spec.containers[0].image: team, attestation built-by-ci, attestation fresh-scan, attestation sbom, attestation cdx, attestation vex, attestation prov02"
        )
    );
    assert!(
        a.object["spec"]["containers"][0]["image"]
            .as_str()
            .unwrap()
            .ends_with(&d)
    );
}

/// One image per tampered variant, each under a rule that requires one
/// attestation: each is refused with its own reason, and the denial says
/// what was found, by whom, and the failing condition with the value read.
#[tokio::test]
async fn tampered_attestations_are_refused_with_their_reason() {
    let w = KeylessWorld::start().await;
    let (reg, ss) = (&w.registry, &w.sigstore);
    let h = reg.host();
    let team = Signer::p256();
    let stranger = Signer::p256();
    let team_pub = key_file(w.dir.path(), "team.pub", &team);
    let t = now();
    let ext = [
        ("sourceRepositoryUri", API),
        ("sourceRepositoryRef", "refs/heads/main"),
    ];
    let mut rules = String::new();
    let mut expect: Vec<(String, String)> = Vec::new();
    let mut case = |name: &str, pt: &str, conditions: &str, extra: &str, want: &str| {
        rules.push_str(&format!(
            "    - name: {name}\n      match: [\"{h}/bad/{name}\"]\n      attestations:\n        - {{name: a, predicateType: {pt}, attestors: [{{name: team, cosign: {{key: \"{team_pub}\"}}}}, {gha}], conditions: [{conditions}]{extra}}}\n",
            gha = gha(&w.root)
        ));
        expect.push((name.to_owned(), want.to_owned()));
    };
    case(
        "subject",
        "spdx",
        "",
        "",
        "none verified by its attestors: team: digest mismatch (signature is for sha256:",
    );
    case(
        "ptype",
        "spdx",
        "",
        "",
        "no https://spdx.dev/Document attestation found for this digest (1 of other types)",
    );
    case(
        "signer",
        "spdx",
        "",
        "",
        "none verified by its attestors: team: wrong key (signature does not verify); gha: chain invalid: signature carries no certificate (it was made with a key)",
    );
    case(
        "condition",
        "vuln",
        "{expression: 'predicate.scanner.result.summary.critical == 0', message: no critical finding}",
        "",
        "condition \"predicate.scanner.result.summary.critical == 0\" (no critical finding) is false: it read 2",
    );
    case(
        "oversize",
        "spdx",
        "",
        ", maxAttestationSize: 1Ki",
        "bytes, over the 1024-byte maxAttestationSize",
    );
    case(
        "malformed",
        "spdx",
        "",
        "",
        "signed by team, but not an in-toto statement: _type is \"https://example.test/not-a-statement\"",
    );
    case(
        "runtime",
        "spdx",
        "{expression: 'predicate.nosuch.field == 1'}",
        "",
        "cannot be evaluated: No such key: nosuch",
    );
    case(
        "repo",
        "slsaprovenance1",
        "",
        "",
        "identity mismatch (certificate has sourceRepositoryUri https://github.com/evil/api, not https://github.com/acme/api)",
    );
    let other = format!("sha256:{}", "ab".repeat(32));
    for name in [
        "subject",
        "ptype",
        "signer",
        "condition",
        "oversize",
        "malformed",
        "runtime",
        "repo",
    ] {
        let repo = format!("bad/{name}");
        let d = reg.push_image(&repo, "v1").await;
        let layer = match name {
            "subject" => att::keyed_layer(&team, &stmt(&other, SPDX)),
            "ptype" => att::keyed_layer(&team, &stmt(&d, CYCLONEDX)),
            "signer" => att::keyed_layer(&stranger, &stmt(&d, SPDX)),
            "condition" => {
                let mut p = att::predicate(VULN, API, t - 60);
                p["scanner"]["result"]["summary"]["critical"] = json!(2);
                att::keyed_layer(&team, &statement(&d, VULN, p))
            }
            "oversize" => {
                let mut p = att::predicate(SPDX, API, t);
                p["padding"] = json!("x".repeat(4096));
                att::keyed_layer(&team, &statement(&d, SPDX, p))
            }
            "malformed" => {
                let mut s: Value = serde_json::from_slice(&stmt(&d, SPDX)).unwrap();
                s["_type"] = json!("https://example.test/not-a-statement");
                att::keyed_layer(&team, &serde_json::to_vec(&s).unwrap())
            }
            "runtime" => att::keyed_layer(&team, &stmt(&d, SPDX)),
            _ => ss.attest_layer(
                &stmt(&d, SLSA_V1),
                GITHUB_WORKFLOW,
                GITHUB_ISSUER,
                &[
                    ("sourceRepositoryUri", "https://github.com/evil/api"),
                    ext[1],
                ],
                t - 3600,
                t - 3500,
            ),
        };
        push_att(reg, &repo, &d, &[layer]).await;
    }
    let policy = write_policy(w.dir.path(), &h, &rules);
    let sigil = Sigil::start(Some(&policy), &[]).await;
    for (name, want) in &expect {
        let a = sigil
            .apiserver()
            .create_pod("team", &[&format!("{h}/bad/{name}:v1")])
            .await;
        assert!(!a.allowed, "{name} must be refused");
        assert!(
            a.message.contains("failed attestation checks of"),
            "{name}: {}",
            a.message
        );
        assert!(
            a.message.contains(want),
            "{name}: want {want:?} in {}",
            a.message
        );
    }
}

/// Pushes an OCI image layout into `repo` byte for byte: blobs, child
/// manifests, then each top-level manifest (the image index at `tag`, the
/// cosign attestation manifest at `sha256-<index>.att`). Returns the index digest.
async fn push_layout(reg: &TestRegistry, repo: &str, dir: &Path, tag: &str) -> String {
    let blob = |d: &str| {
        std::fs::read(
            dir.join("blobs/sha256")
                .join(d.trim_start_matches("sha256:")),
        )
        .unwrap()
    };
    let index: Value =
        serde_json::from_slice(&std::fs::read(dir.join("index.json")).unwrap()).unwrap();
    let mut image = String::new();
    let mut atts = Vec::new();
    for m in index["manifests"].as_array().unwrap() {
        let d = m["digest"].as_str().unwrap();
        match m["annotations"]["kind"].as_str() {
            Some("dev.cosignproject.cosign/imageIndex") => image = d.to_owned(),
            _ => atts.push(d.to_owned()),
        }
    }
    async fn push_tree(
        reg: &TestRegistry,
        repo: &str,
        body: &[u8],
        reference: &str,
        blob: &dyn Fn(&str) -> Vec<u8>,
    ) -> String {
        let v: Value = serde_json::from_slice(body).unwrap();
        for c in v["manifests"].as_array().into_iter().flatten() {
            let d = c["digest"].as_str().unwrap();
            Box::pin(push_tree(reg, repo, &blob(d), d, blob)).await;
        }
        let config = v.pointer("/config/digest").and_then(Value::as_str);
        for d in config.into_iter().chain(
            v["layers"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|l| l["digest"].as_str()),
        ) {
            assert_eq!(reg.push_blob(repo, &blob(d)).await, d);
        }
        reg.push_exact(repo, reference, body).await
    }
    let pushed = push_tree(reg, repo, &blob(&image), tag, &blob).await;
    assert_eq!(pushed, image, "the index keeps its digest");
    for a in atts {
        let at = format!("{}.att", image.replace(':', "-"));
        assert_eq!(push_tree(reg, repo, &blob(&a), &at, &blob).await, a);
    }
    image
}

/// The real images slsa-github-generator built and attested (keyless, on
/// GitHub Actions, logged in the public Rekor), pushed byte for byte: the
/// source condition passes for the right repository and fails — naming the
/// value the certificate carries — for a look-alike (slsa-verifier's
/// "wrong source" case).
#[tokio::test]
async fn real_slsa_github_generator_images_pass_and_fail_as_upstream_says() {
    let reg = TestRegistry::start(crate::support::registry::Mode::Plain).await;
    let h = reg.host();
    let cases = format!("{VECTORS}/cases");
    let good = push_layout(
        &reg,
        "slsa/good",
        Path::new(&format!(
            "{cases}/slsa-oci-gha-container-v1.10.0-pass/oci-layout"
        )),
        "v1",
    )
    .await;
    let wrong = push_layout(
        &reg,
        "slsa/wrong",
        Path::new(&format!(
            "{cases}/slsa-oci-gha-container-v2.0.0-wrong-source-fail/oci-layout"
        )),
        "v1",
    )
    .await;
    let dir = tempfile::tempdir().unwrap();
    let root = format!("{VECTORS}/trust/sigstore-public-good.trusted_root.json");
    let entry = |source: &str| {
        format!(
            r#"      attestations:
        - name: slsa3
          predicateType: slsaprovenance02
          attestors:
            - name: generator
              cosign:
                keyless:
                  issuer: {GITHUB_ISSUER}
                  subjectRegex: '^https://github\.com/slsa-framework/slsa-github-generator/\.github/workflows/generator_container_slsa3\.yml@refs/tags/v'
                trustedRoot: "{root}"
          conditions:
            - expression: signer.sourceRepositoryUri == "https://{source}"
              message: built from {source}
            - expression: predicate.builder.id.startsWith("https://github.com/slsa-framework/slsa-github-generator/.github/workflows/generator_container_slsa3.yml@")
"#
        )
    };
    let rules = format!(
        "    - name: good\n      match: [\"{h}/slsa/good\"]\n{}    - name: wrong\n      match: [\"{h}/slsa/wrong\"]\n{}",
        entry("github.com/slsa-framework/example-package"),
        entry("github.com/slsa-framework/example-packageA")
    );
    let policy = write_policy(dir.path(), &h, &rules);
    let sigil = Sigil::start(Some(&policy), &[]).await;
    let a = sigil
        .apiserver()
        .create_pod("team", &[&format!("{h}/slsa/good:v1")])
        .await;
    assert!(a.allowed, "{}", a.message);
    assert_eq!(
        a.object["spec"]["containers"][0]["image"],
        json!(format!("{h}/slsa/good:v1@{good}"))
    );
    let a = sigil
        .apiserver()
        .create_pod("team", &[&format!("{h}/slsa/wrong:v1")])
        .await;
    assert!(!a.allowed);
    assert!(
        a.message.contains("attestation slsa3: 1 https://slsa.dev/provenance/v0.2 attestation found, 1 verified (by generator, signer subject https://github.com/slsa-framework/slsa-github-generator/.github/workflows/generator_container_slsa3.yml@refs/tags/v2.0.0"),
        "{}",
        a.message
    );
    assert!(
        a.message.contains("(built from github.com/slsa-framework/example-packageA) is false: it read \"https://github.com/slsa-framework/example-package\""),
        "{}",
        a.message
    );
    assert!(
        a.message.contains(&wrong),
        "names the digest it checked: {}",
        a.message
    );
}

/// `sigil verify IMAGE` lists every attestation with its signer and each
/// condition; `sigil pin` refuses what the webhook refuses, with the same
/// words; `sigil audit` reports reason `attestation`; `policy check`
/// explains the entry in words.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_pin_audit_and_policy_check_read_attestation_rules() {
    let w = KeylessWorld::start().await;
    let reg = &w.registry;
    let h = reg.host();
    let team = Signer::p256();
    let team_pub = key_file(w.dir.path(), "team.pub", &team);
    let good = reg.push_image("cli/good", "v1").await;
    let bad = reg.push_image("cli/bad", "v1").await;
    push_att(
        reg,
        "cli/good",
        &good,
        &[
            att::keyed_layer(&team, &stmt(&good, VULN)),
            att::keyed_layer(&team, &stmt(&good, SPDX)),
        ],
    )
    .await;
    let mut p = att::predicate(VULN, API, now() - 60);
    p["scanner"]["result"]["summary"]["critical"] = json!(3);
    push_att(
        reg,
        "cli/bad",
        &bad,
        &[att::keyed_layer(&team, &statement(&bad, VULN, p))],
    )
    .await;
    let rules = format!(
        "    - name: scanned\n      match: [\"{h}/cli/**\"]\n      attestations:\n        - name: fresh-scan\n          predicateType: vuln\n          attestors: [{{name: scanner, cosign: {{key: \"{team_pub}\"}}}}]\n          conditions:\n            - {{expression: 'predicate.scanner.result.summary.critical == 0', message: no critical finding}}\n"
    );
    write_policy(w.dir.path(), &h, &rules);
    let policy = w.dir.path().join("policy.yaml");
    let policy_s = policy.display().to_string();
    let out = run_sigil(
        &["verify", "--policy", &policy_s, &format!("{h}/cli/good:v1")],
        None,
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("attestation fresh-scan: passed (https://cosign.sigstore.dev/attestation/vuln/v1; 1 found, 1 of other types)"), "{text}");
    assert!(text.contains("verified by scanner, signer a key"), "{text}");
    assert!(
        text.contains("condition no critical finding: holds"),
        "{text}"
    );
    let out = run_sigil(
        &["verify", "--policy", &policy_s, &format!("{h}/cli/bad:v1")],
        None,
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        text.contains("condition no critical finding: false (it read 3)"),
        "{text}"
    );
    // pin: the same refusal.
    let manifest = format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: p, namespace: team}}\nspec:\n  containers:\n    - {{name: a, image: \"{h}/cli/bad:v1\"}}\n"
    );
    let out = run_sigil(&["pin", "--policy", &policy_s, "-"], Some(&manifest));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_ne!(out.status.code(), Some(0), "{err}");
    assert!(
        err.contains("failed attestation checks of") && err.contains("is false: it read 3"),
        "{err}"
    );
    // audit: reason attestation.
    let kube = crate::support::kube::FakeKube::start().await;
    kube.namespaces(&["team"]);
    kube.insert(
        "/api/v1/namespaces/team/pods",
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "bad", "namespace": "team"},
               "spec": {"containers": [{"name": "a", "image": format!("{h}/cli/bad@{bad}")}]}}),
    );
    let out = run_bounded(&mut audit_command(&policy, &kube.kubeconfig), None);
    let report: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)));
    let text = report.to_string();
    assert!(text.contains("\"reason\":\"attestation\""), "{text}");
    // policy check: the entry in words.
    let out = run_sigil(&["policy", "check", "--schema-only", &policy_s], None);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("and it must carry attestation \"fresh-scan\": a https://cosign.sigstore.dev/attestation/vuln/v1 statement about the pinned digest, signed by scanner (key), where no critical finding (predicate.scanner.result.summary.critical == 0)"),
        "{text}"
    );
}

/// The shipped example loads, and `policy check` explains every entry.
#[test]
fn the_attestation_example_is_explained_by_policy_check() {
    let example = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../examples/policy-attestations.yaml"
    );
    let out = run_sigil(&["policy", "check", "--schema-only", example], None);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for want in [
        "and it must carry attestation \"built-by-ci\": a https://slsa.dev/provenance/v1 statement about the pinned digest, signed by gha (keyless /^https://github\\.com/acme/api/\\.github/workflows/release\\.yml@/ from https://token.actions.githubusercontent.com), where built from acme/api",
        "and it must carry attestation \"sbom\": a https://cyclonedx.org/bom statement about the pinned digest, signed by scanner (key), where size(predicate.components) > 0",
        "where scanned in the last 7 days (now - timestamp(predicate.metadata.scanFinishedOn) < duration(\"168h\")); and no critical finding",
    ] {
        assert!(text.contains(want), "{want}\n{text}");
    }
}
