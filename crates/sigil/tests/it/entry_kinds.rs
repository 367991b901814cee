//! Every Rekor v1 entry kind cosign and its peers have written, each on the
//! path that uses it (`sigil_testkit::entries` mints the bodies as Rekor
//! canonicalizes them): image signatures logged as `hashedrekord` and, as
//! cosign before 1.5 logged them, `rekord`; `.att` attestations logged as
//! `intoto` 0.0.1 (cosign before 2.0: the envelope's hash, no signature),
//! `intoto` 0.0.2 and `dsse` 0.0.1. Each is admitted; an `intoto` 0.0.1
//! entry of another envelope is refused, as Rekor's own verifier would.
//! (Rekor v2's `hashedrekord`/`dsse` 0.0.2 are in bundles: `attest::`.)
//! And an attachment form: a signature bundle kept in another repository
//! (`COSIGN_REPOSITORY`).

use crate::support::attestations::{self as att, SLSA_V1, push_att};
use crate::support::entries::LogKind;
use crate::support::intoto::statement;
use crate::support::sigil::{Sigil, run_sigil};
use crate::support::signing::{push_legacy, simple_signing};
use crate::support::sigstore::{GITHUB_ISSUER, GITHUB_WORKFLOW, KeylessWorld};

const API: &str = "https://github.com/acme/api";

fn now() -> i64 {
    time::OffsetDateTime::now_utc().unix_timestamp()
}

#[tokio::test]
async fn every_rekor_entry_kind_cosign_has_written_is_verified_on_its_path() {
    let w = KeylessWorld::start().await;
    let (reg, ss) = (&w.registry, &w.sigstore);
    let h = reg.host();
    let t = now();
    let ext = [
        ("sourceRepositoryUri", API),
        ("sourceRepositoryRef", "refs/heads/main"),
    ];
    let root = w.root.display();
    let keyless = format!(
        "{{keyless: {{issuer: \"{GITHUB_ISSUER}\", subjectRegex: \"^https://github\\\\.com/acme/\"}}, trustedRoot: \"{root}\"}}"
    );
    // Attested in acme's release workflow an hour ago, logged as `kind`.
    let attest = |kind, s: &[u8]| {
        ss.attest_layer_as(
            kind,
            s,
            GITHUB_WORKFLOW,
            GITHUB_ISSUER,
            &ext,
            t - 3600,
            t - 3500,
        )
    };
    let mut rules = String::new();
    // Attestations, one image per entry kind.
    let kinds = [
        ("intoto-001", LogKind::Intoto001),
        ("intoto-002", LogKind::Intoto002),
        ("dsse-001", LogKind::Dsse001),
    ];
    for (name, kind) in kinds {
        let repo = format!("att/{name}");
        let d = reg.push_image(&repo, "v1").await;
        let s = statement(&d, SLSA_V1, att::predicate(SLSA_V1, API, t - 3600));
        let layer = attest(kind, &s);
        push_att(reg, &repo, &d, &[layer]).await;
        rules.push_str(&format!(
            "    - name: {name}\n      match: [\"{h}/{repo}\"]\n      attestations:\n        - {{name: provenance, predicateType: slsaprovenance1, attestors: [{{name: ci, cosign: {keyless}}}]}}\n"
        ));
    }
    // An intoto 0.0.1 entry of another envelope: the same statement and
    // signature, re-serialized (as a copy that rewrote the layer would be).
    // The signature still verifies; the entry does not vouch for it.
    let d = reg.push_image("att/intoto-001-other", "v1").await;
    let s = statement(&d, SLSA_V1, att::predicate(SLSA_V1, API, t - 3600));
    let mut layer = attest(LogKind::Intoto001, &s);
    let v: serde_json::Value = serde_json::from_slice(&layer.envelope).unwrap();
    layer.envelope = serde_json::to_vec_pretty(&v).unwrap();
    push_att(reg, "att/intoto-001-other", &d, &[layer]).await;
    rules.push_str(&format!(
        "    - name: intoto-001-other\n      match: [\"{h}/att/intoto-001-other\"]\n      attestations:\n        - {{name: provenance, predicateType: slsaprovenance1, attestors: [{{name: ci, cosign: {keyless}}}]}}\n"
    ));
    // Image signatures, one image per entry kind.
    for (name, kind) in [
        ("hashedrekord", LogKind::HashedRekord),
        ("rekord", LogKind::Rekord),
    ] {
        let repo = format!("sig/{name}");
        let d = reg.push_image(&repo, "v1").await;
        let payload = simple_signing(&format!("{h}/{repo}"), &d);
        let k = ss.sign_as(
            kind,
            &payload,
            GITHUB_WORKFLOW,
            GITHUB_ISSUER,
            t - 3600,
            t - 3500,
            None,
        );
        push_legacy(reg, &repo, &d, vec![k.layer(payload)]).await;
        rules.push_str(&format!(
            "    - name: {name}\n      match: [\"{h}/{repo}\"]\n      verify:\n        - {{name: ci, cosign: {keyless}}}\n"
        ));
    }
    let policy = format!(
        "apiVersion: sigil.dev/v1alpha1\nkind: ImagePolicy\nmetadata: {{name: kinds}}\nspec:\n  registries:\n    - {{host: \"{h}\", insecure: true}}\n  rules:\n{rules}"
    );
    let sigil = Sigil::start(Some(&policy), &[]).await;
    for image in [
        "att/intoto-001",
        "att/intoto-002",
        "att/dsse-001",
        "sig/hashedrekord",
        "sig/rekord",
    ] {
        let a = sigil
            .apiserver()
            .create_pod("team", &[&format!("{h}/{image}:v1")])
            .await;
        assert!(a.allowed, "{image}: {}", a.message);
    }
    let a = sigil
        .apiserver()
        .create_pod("team", &[&format!("{h}/att/intoto-001-other:v1")])
        .await;
    assert!(!a.allowed);
    assert!(
        a.message
            .contains("log entry records a different envelope hash"),
        "{}",
        a.message
    );
    // `sigil verify` names each signature's and attestation's form and
    // entry kind, so a user sees why one was or was not counted.
    let file = w.dir.path().join("policy.yaml");
    std::fs::write(&file, &policy).unwrap();
    for (image, says) in [
        (
            "sig/rekord",
            "found: cosign .sig layer, keyless, Rekor rekord/0.0.1",
        ),
        (
            "att/intoto-001",
            "verified by ci, signer subject https://github.com/acme/app/.github/workflows/release.yml@refs/heads/main",
        ),
        (
            "att/intoto-001",
            "(cosign .att layer, keyless, Rekor intoto/0.0.1)",
        ),
        (
            "att/dsse-001",
            "(cosign .att layer, keyless, Rekor dsse/0.0.1)",
        ),
        (
            "att/intoto-001-other",
            "log entry records a different envelope hash (cosign .att layer, keyless, Rekor intoto/0.0.1)",
        ),
    ] {
        let out = run_sigil(
            &[
                "verify",
                "--policy",
                file.to_str().unwrap(),
                &format!("{h}/{image}:v1"),
            ],
            None,
        );
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains(says), "{image}: {says:?} not in\n{text}");
    }
}

/// `COSIGN_REPOSITORY`: a key-signed cosign v3 bundle (`cosign sign
/// --new-bundle-format`) kept as a referrer in another repository, found
/// there through the rule's `signatures.repository` (the referrers tag
/// schema: the test registry has no referrers API) — and not counted when
/// the rule looks beside the image.
#[tokio::test]
async fn a_signature_bundle_kept_in_another_repository_is_found_there() {
    let w = KeylessWorld::start().await;
    let reg = &w.registry;
    let h = reg.host();
    let key = crate::support::signing::Signer::p256();
    let pem = w.dir.path().join("team.pub");
    std::fs::write(&pem, key.public_pem()).unwrap();
    let d = reg.push_image("apps/svc", "v1").await;
    let size = reg.manifest_size("apps/svc", &d).await;
    let signed = statement(
        &d,
        crate::support::intoto::COSIGN_SIGN,
        serde_json::json!({}),
    );
    let bundle = att::keyed_bundle(&key, &signed);
    crate::support::signing::push_referrers(
        reg,
        "signatures/svc",
        &d,
        size,
        &[(att::BUNDLE_V03, att::BUNDLE_V03, bundle.as_slice())],
    )
    .await;
    let rule = |name: &str, repo: Option<&str>| {
        format!(
            "    - name: {name}\n      match: [\"{h}/apps/svc\"]\n      verify:\n        - {{name: team, cosign: {{key: \"{}\"}}}}\n{}",
            pem.display(),
            repo.map(|r| format!("      signatures: {{repository: \"{h}/{r}\"}}\n"))
                .unwrap_or_default()
        )
    };
    let policy = |rules: String| {
        format!(
            "apiVersion: sigil.dev/v1alpha1\nkind: ImagePolicy\nmetadata: {{name: sep}}\nspec:\n  registries:\n    - {{host: \"{h}\", insecure: true}}\n  rules:\n{rules}"
        )
    };
    let image = format!("{h}/apps/svc:v1");
    let sigil = Sigil::start(
        Some(&policy(rule("elsewhere", Some("signatures/svc")))),
        &[],
    )
    .await;
    let a = sigil.apiserver().create_pod("team", &[&image]).await;
    assert!(a.allowed, "{}", a.message);
    let sigil = Sigil::start(Some(&policy(rule("beside", None))), &[]).await;
    let a = sigil.apiserver().create_pod("team", &[&image]).await;
    assert!(!a.allowed, "no signature beside the image");
    assert!(a.message.contains("no signature found"), "{}", a.message);
}
