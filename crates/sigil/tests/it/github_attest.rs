//! GitHub artifact attestations pushed to the registry, laid out exactly as
//! `actions/attest` with `push-to-registry: true` writes them
//! (`sigil_testkit::github` says which tool and version each part mimics):
//! bundles v0.3 and v0.2 (`actions/attest` v1.0), on a registry that takes
//! OCI 1.1 manifests and as sigstore-js downgrades them for Docker Hub and
//! ECR (no `subject`, no `artifactType`), each found through the referrers
//! tag schema the tool writes on registries without the referrers API.

use crate::support::attestations::{self as att, SLSA_V1};
use crate::support::github::{BUNDLE_V02, BUNDLE_V03, Registry, push_to_registry};
use crate::support::sigil::{Sigil, run_sigil};
use crate::support::sigstore::{GITHUB_ISSUER, GITHUB_WORKFLOW, KeylessWorld};

const API: &str = "https://github.com/acme/api";
const INDEX: &str = "application/vnd.oci.image.index.v1+json";

/// The statement `actions/attest-build-provenance` makes for an image:
/// its name without tag, the index digest `docker/build-push-action`
/// reports, SLSA provenance v1.
fn statement(name: &str, digest: &str, now: i64) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({
        "_type": "https://in-toto.io/Statement/v1",
        "subject": [{"name": name, "digest": {"sha256": digest.trim_start_matches("sha256:")}}],
        "predicateType": SLSA_V1,
        "predicate": att::predicate(SLSA_V1, API, now - 3600)
    }))
    .unwrap()
}

#[tokio::test]
async fn github_attestations_pushed_to_the_registry_are_read_as_actions_attest_lays_them_out() {
    let w = KeylessWorld::start().await;
    let (reg, ss) = (&w.registry, &w.sigstore);
    let h = reg.host();
    let t = time::OffsetDateTime::now_utc().unix_timestamp();
    let ext = [
        ("sourceRepositoryUri", API),
        ("sourceRepositoryRef", "refs/heads/main"),
    ];
    let created = "2026-11-27T09:41:07.318Z";
    // Signed in the release workflow of acme/api, an hour ago.
    let attest = |media_type: &str, s: &[u8]| {
        ss.github_attestation(
            media_type,
            s,
            GITHUB_WORKFLOW,
            GITHUB_ISSUER,
            &ext,
            t - 3600,
            t - 3500,
        )
    };
    let cases = [
        ("gh/oci-v03", BUNDLE_V03, Registry::Oci),
        ("gh/hub-v03", BUNDLE_V03, Registry::Downgraded),
        ("gh/oci-v02", BUNDLE_V02, Registry::Oci),
        ("gh/hub-v02", BUNDLE_V02, Registry::Downgraded),
    ];
    for (repo, media_type, registry) in cases {
        let (d, _) = reg
            .push_index(
                repo,
                "v1",
                &[("linux", "amd64", None), ("linux", "arm64", None)],
            )
            .await;
        let bundle = attest(media_type, &statement(&format!("{h}/{repo}"), &d, t));
        push_to_registry(reg, repo, &d, INDEX, &bundle, SLSA_V1, created, registry).await;
    }
    // An attestation about another image, attached here: the statement,
    // not where it hangs, says what it is about.
    let (d, _) = reg
        .push_index("gh/other", "v1", &[("linux", "amd64", None)])
        .await;
    let other = reg.push_image("gh/elsewhere", "v1").await;
    let bundle = attest(
        BUNDLE_V03,
        &statement(&format!("{h}/gh/elsewhere"), &other, t),
    );
    push_to_registry(
        reg,
        "gh/other",
        &d,
        INDEX,
        &bundle,
        SLSA_V1,
        created,
        Registry::Oci,
    )
    .await;

    let root = w.root.display();
    let policy = format!(
        "apiVersion: sigil.dev/v1alpha1\nkind: ImagePolicy\nmetadata: {{name: github}}\nspec:\n  registries:\n    - {{host: \"{h}\", insecure: true}}\n  rules:\n    - name: built-by-ci\n      match: [\"{h}/gh/**\"]\n      attestations:\n        - name: provenance\n          predicateType: slsaprovenance1\n          attestors:\n            - {{name: gha, cosign: {{keyless: {{issuer: \"{GITHUB_ISSUER}\", subject: \"{GITHUB_WORKFLOW}\", extensions: {{sourceRepositoryUri: \"{API}\"}}}}, trustedRoot: \"{root}\"}}}}\n"
    );
    let sigil = Sigil::start(Some(&policy), &[]).await;
    for (repo, _, _) in cases {
        let a = sigil
            .apiserver()
            .create_pod("team", &[&format!("{h}/{repo}:v1")])
            .await;
        assert!(a.allowed, "{repo}: {}", a.message);
    }
    let a = sigil
        .apiserver()
        .create_pod("team", &[&format!("{h}/gh/other:v1")])
        .await;
    assert!(
        !a.allowed,
        "an attestation about another digest must not count"
    );
    assert!(a.message.contains("provenance"), "{}", a.message);

    // `sigil verify` names the form and the log entry kind it found.
    let file = w.dir.path().join("policy.yaml");
    std::fs::write(&file, &policy).unwrap();
    for (repo, _, _) in cases {
        let out = run_sigil(
            &[
                "verify",
                "--policy",
                file.to_str().unwrap(),
                &format!("{h}/{repo}:v1"),
            ],
            None,
        );
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{repo}:\n{text}");
        assert!(
            text.contains("verified by gha")
                && text.contains("(Sigstore bundle, keyless, Rekor dsse/0.0.1)"),
            "{repo}:\n{text}"
        );
    }
}

/// A private repository's attestation, as GitHub's own Sigstore instance
/// signs it (no transparency-log entry; a signed timestamp its trusted root
/// vouches for, and that root lists no log), attached to an image as
/// `actions/attest` pushes it: it was refused "the bundle has no
/// transparency-log entry, and one is required". It admits through
/// `sigil serve` and `sigil verify`; the same bundle about another digest,
/// or from another owner's repository, is refused.
#[tokio::test]
async fn regression_a_private_repositorys_attestation_from_githubs_own_instance_admits() {
    let w = KeylessWorld::start().await;
    let (reg, ss) = (&w.registry, &w.sigstore);
    let h = reg.host();
    let t = time::OffsetDateTime::now_utc().unix_timestamp();
    let root = w.dir.path().join("github-private-root.json");
    std::fs::write(&root, ss.trusted_root_without_logs().to_string()).unwrap();
    let created = "2026-11-27T09:41:07.318Z";
    let attest = |repo_uri: &str, s: &[u8]| {
        ss.github_private_attestation(
            s,
            GITHUB_WORKFLOW,
            GITHUB_ISSUER,
            &[
                ("sourceRepositoryUri", repo_uri),
                ("sourceRepositoryRef", "refs/heads/main"),
            ],
            t - 3600,
            t - 3500,
        )
    };
    // Ours, attested by our repository.
    let (ours, _) = reg
        .push_index("private/app", "v1", &[("linux", "amd64", None)])
        .await;
    let b = attest(API, &statement(&format!("{h}/private/app"), &ours, t));
    push_to_registry(
        reg,
        "private/app",
        &ours,
        INDEX,
        &b,
        SLSA_V1,
        created,
        Registry::Oci,
    )
    .await;
    // Another image carrying our bundle (its statement names `ours`).
    let (other, _) = reg
        .push_index("private/other", "v1", &[("linux", "amd64", None)])
        .await;
    push_to_registry(
        reg,
        "private/other",
        &other,
        INDEX,
        &b,
        SLSA_V1,
        created,
        Registry::Oci,
    )
    .await;
    // Attested, but by another owner's repository.
    let (forked, _) = reg
        .push_index("private/forked", "v1", &[("linux", "amd64", None)])
        .await;
    let fb = attest(
        "https://github.com/someone-else/api",
        &statement(&format!("{h}/private/forked"), &forked, t),
    );
    push_to_registry(
        reg,
        "private/forked",
        &forked,
        INDEX,
        &fb,
        SLSA_V1,
        created,
        Registry::Oci,
    )
    .await;

    let policy = format!(
        "apiVersion: sigil.dev/v1alpha1\nkind: ImagePolicy\nmetadata: {{name: github}}\nspec:\n  registries:\n    - {{host: \"{h}\", insecure: true}}\n  rules:\n    - name: built-by-ci\n      match: [\"{h}/private/**\"]\n      attestations:\n        - name: provenance\n          predicateType: slsaprovenance1\n          attestors:\n            - {{name: gha, cosign: {{keyless: {{issuer: \"{GITHUB_ISSUER}\", subject: \"{GITHUB_WORKFLOW}\", extensions: {{sourceRepositoryUri: \"{API}\"}}}}, trustedRoot: \"{}\"}}}}\n",
        root.display()
    );
    let sigil = Sigil::start(Some(&policy), &[]).await;
    let create = |image: String| {
        let api = sigil.apiserver();
        async move { api.create_pod("team", &[&image]).await }
    };
    let a = create(format!("{h}/private/app:v1")).await;
    assert!(a.allowed, "{}", a.message);
    for repo in ["private/other", "private/forked"] {
        let a = create(format!("{h}/{repo}:v1")).await;
        assert!(!a.allowed, "{repo} was admitted");
        assert!(a.message.contains("provenance"), "{repo}: {}", a.message);
    }
    let file = w.dir.path().join("policy.yaml");
    std::fs::write(&file, &policy).unwrap();
    let out = run_sigil(
        &[
            "verify",
            "--policy",
            file.to_str().unwrap(),
            &format!("{h}/private/app:v1"),
        ],
        None,
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("verified by gha"), "{text}");
}
