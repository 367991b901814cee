//! Multi-platform images signed at the index, at each platform, or both,
//! and the rule's `signatures.signedAt` deciding which it requires —
//! against the real registry, through `sigil serve` and `sigil verify`.
//! Signatures are laid out as cosign 2.x writes them: `cosign sign
//! IMAGE@INDEX` signs the index; `cosign sign --recursive` signs the index
//! and every manifest it lists; a pipeline signing each platform's build by
//! its digest signs only the platforms. Each index also lists a BuildKit
//! attestation manifest (`unknown/unknown`), which nobody signs and no rule
//! asks to be signed.

use crate::support::registry::{Mode, TestRegistry};
use crate::support::sigil::{Sigil, run_sigil};
use crate::support::signing::{Layer, Signer, push_legacy, simple_signing};

/// An index of linux/amd64, linux/arm64 and an attestation manifest, at
/// `repo:v1`; returns (index digest, [amd64, arm64] digests).
async fn push_multiplatform(reg: &TestRegistry, repo: &str) -> (String, Vec<String>) {
    let (_, platforms) = reg
        .push_index(
            repo,
            "build",
            &[("linux", "amd64", None), ("linux", "arm64", None)],
        )
        .await;
    let attestation = reg.push_image(repo, "attestation").await;
    let mut entries = Vec::new();
    for (p, d) in &platforms {
        let (os, arch) = p.split_once('/').unwrap();
        entries.push(serde_json::json!({
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": d, "size": reg.manifest_size(repo, d).await,
            "platform": {"os": os, "architecture": arch}
        }));
    }
    entries.push(serde_json::json!({
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "digest": attestation, "size": reg.manifest_size(repo, &attestation).await,
        "platform": {"os": "unknown", "architecture": "unknown"},
        "annotations": {"vnd.docker.reference.type": "attestation-manifest", "vnd.docker.reference.digest": platforms[0].1}
    }));
    let index = serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json", "manifests": entries
    }))
    .unwrap();
    let d = reg
        .push_manifest(
            repo,
            "v1",
            "application/vnd.oci.image.index.v1+json",
            &index,
        )
        .await;
    (d, platforms.into_iter().map(|(_, d)| d).collect())
}

/// `cosign sign --key` of `digest`, the signature stored in `sig_repo`.
async fn sign(reg: &TestRegistry, key: &Signer, image_repo: &str, sig_repo: &str, digest: &str) {
    let payload = simple_signing(&format!("{}/{image_repo}", reg.host()), digest);
    let sig = key.sign(&payload);
    push_legacy(reg, sig_repo, digest, vec![Layer::new(payload, &sig)]).await;
}

/// Where each image is signed.
#[derive(Clone, Copy, Debug)]
enum Signed {
    /// `cosign sign IMAGE@INDEX`.
    Index,
    /// Each platform's build, by digest.
    Platforms,
    /// `cosign sign --recursive`.
    Recursive,
    /// The index and amd64 only (arm64 added to the index later, unsigned).
    Partial,
}

const MODES: [&str; 4] = ["index", "platforms", "both", "either"];

#[tokio::test]
async fn each_signed_at_admits_exactly_the_images_signed_where_it_asks() {
    let reg = TestRegistry::start(Mode::Plain).await;
    let h = reg.host();
    let key = Signer::p256();
    let dir = tempfile::tempdir().unwrap();
    let pem = dir.path().join("release.pub");
    std::fs::write(&pem, key.public_pem()).unwrap();
    let layouts = [
        Signed::Index,
        Signed::Platforms,
        Signed::Recursive,
        Signed::Partial,
    ];
    for mode in MODES {
        for layout in layouts {
            let repo = format!("{mode}/{layout:?}").to_lowercase();
            let (index, platforms) = push_multiplatform(&reg, &repo).await;
            let mut signed = Vec::new();
            match layout {
                Signed::Index => signed.push(&index),
                Signed::Platforms => signed.extend(&platforms),
                Signed::Recursive => signed.extend(std::iter::once(&index).chain(&platforms)),
                Signed::Partial => signed.extend([&index, &platforms[0]]),
            }
            for d in signed {
                sign(&reg, &key, &repo, &repo, d).await;
            }
        }
    }
    // Signatures in another repository (`COSIGN_REPOSITORY`), the index
    // read where the image is.
    let (index, platforms) = push_multiplatform(&reg, "apps/elsewhere").await;
    for d in std::iter::once(&index).chain(&platforms) {
        sign(&reg, &key, "apps/elsewhere", "signatures/elsewhere", d).await;
    }
    let mut rules = String::new();
    for mode in MODES {
        rules.push_str(&format!(
            "    - name: {mode}\n      match: [\"{h}/{mode}/**\"]\n      verify: [{{name: release, cosign: {{key: \"{}\"}}}}]\n      signatures: {{signedAt: {mode}}}\n",
            pem.display()
        ));
    }
    rules.push_str(&format!(
        "    - name: elsewhere\n      match: [\"{h}/apps/**\"]\n      verify: [{{name: release, cosign: {{key: \"{}\"}}}}]\n      signatures: {{repository: \"{h}/signatures/elsewhere\", signedAt: both}}\n",
        pem.display()
    ));
    let policy = format!(
        "apiVersion: sigil.dev/v1alpha1\nkind: ImagePolicy\nmetadata: {{name: platforms}}\nspec:\n  registries:\n    - {{host: \"{h}\", insecure: true}}\n  rules:\n{rules}"
    );
    let sigil = Sigil::start(Some(&policy), &[]).await;
    // (signedAt, layout, admitted)
    let expected = [
        ("index", Signed::Index, true),
        ("index", Signed::Platforms, false),
        ("index", Signed::Recursive, true),
        ("index", Signed::Partial, true),
        ("platforms", Signed::Index, false),
        ("platforms", Signed::Platforms, true),
        ("platforms", Signed::Recursive, true),
        ("platforms", Signed::Partial, false),
        ("both", Signed::Index, false),
        ("both", Signed::Platforms, false),
        ("both", Signed::Recursive, true),
        ("both", Signed::Partial, false),
        ("either", Signed::Index, true),
        ("either", Signed::Platforms, true),
        ("either", Signed::Recursive, true),
        ("either", Signed::Partial, true),
    ];
    for (mode, layout, admitted) in expected {
        let image = format!("{h}/{mode}/{layout:?}:v1").to_lowercase();
        let a = sigil.apiserver().create_pod("team", &[&image]).await;
        assert_eq!(
            a.allowed, admitted,
            "signedAt {mode}, signed {layout:?}: {}",
            a.message
        );
    }
    let a = sigil
        .apiserver()
        .create_pod("team", &[&format!("{h}/apps/elsewhere:v1")])
        .await;
    assert!(a.allowed, "{}", a.message);
    // The denial names the platform left unsigned, and how to fix it.
    let a = sigil
        .apiserver()
        .create_pod("team", &[&format!("{h}/platforms/partial:v1")])
        .await;
    for says in [
        "signatures are required on every platform's manifest",
        "linux/amd64 (sha256:",
        "): ok; linux/arm64 (sha256:",
        "release: no signature found",
        "cosign sign --recursive",
    ] {
        assert!(a.message.contains(says), "{says:?} not in {}", a.message);
    }
    assert!(
        !a.message.contains("unknown/unknown"),
        "attestation manifests are not platforms: {}",
        a.message
    );

    // `sigil verify` shows each platform and what it carried.
    let file = dir.path().join("policy.yaml");
    std::fs::write(&file, &policy).unwrap();
    let out = run_sigil(
        &[
            "verify",
            "--policy",
            file.to_str().unwrap(),
            &format!("{h}/both/partial:v1"),
        ],
        None,
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{text}");
    for says in [
        "verify:  at the index: 1 of 1 verifiers passed (need 1)",
        "platforms (signatures.signedAt: both): 2 manifest(s) in the index",
        "  linux/amd64 sha256:",
        ": signed",
        "  linux/arm64 sha256:",
        ": NOT SIGNED as the rule requires",
        "    release: FAILED: no signature found",
        "    found: cosign .sig layer, key, no log entry",
    ] {
        assert!(text.contains(says), "{says:?} not in\n{text}");
    }
    let out = run_sigil(
        &[
            "verify",
            "--policy",
            file.to_str().unwrap(),
            &format!("{h}/platforms/platforms:v1"),
        ],
        None,
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("verify:  at the index (not required there): 0 of 1 verifiers passed"),
        "{text}"
    );
}
