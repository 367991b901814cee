//! The default Sigstore trusted root kept current by TUF, through `sigil
//! serve`: a repository built here stands in for Sigstore's CDN.

use std::time::{Duration, Instant};

use crate::support::sigil::Sigil;
use crate::support::signing;
use crate::support::sigstore::{
    GITHUB_ISSUER as ISSUER, GITHUB_WORKFLOW as WHO, KeylessWorld, Sigstore,
};
use crate::support::tuf::TufRepo;

fn policy(host: &str) -> String {
    format!(
        "apiVersion: sigil.dev/v1alpha1\nkind: ImagePolicy\nmetadata: {{name: tuf}}\nspec:\n  registries:\n    - {{host: \"{host}\", insecure: true}}\n  rules:\n    - name: ci\n      match: [\"{host}/kl/**\"]\n      verify:\n        - name: ci\n          cosign:\n            keyless: {{issuer: \"{ISSUER}\", subject: \"{WHO}\"}}\n"
    )
}

/// Pushes `repo:v1` signed keylessly by `ss` (logged in its Rekor).
async fn push_signed_by(w: &KeylessWorld, ss: &Sigstore, repo: &str) -> String {
    let reg = &w.registry;
    let now = time::OffsetDateTime::now_utc().unix_timestamp();
    let d = reg.push_image(repo, "v1").await;
    let payload = signing::simple_signing(&format!("{}/{repo}", reg.host()), &d);
    let k = ss.sign(&payload, WHO, ISSUER, now - 3600, now - 3600 + 60, None);
    signing::push_legacy(reg, repo, &d, vec![k.layer(payload)]).await;
    format!("{}/{repo}:v1", reg.host())
}

async fn refreshes(sigil: &Sigil, result: &str) -> f64 {
    sigil
        .counter(
            "sigil_trust_root_refresh_total",
            &[("trust_root", "public-good"), ("result", result)],
        )
        .await
}

/// Waits (at most 20 s) until the `result` refresh count reaches `n`.
async fn wait_refreshes(sigil: &Sigil, result: &str, n: f64) {
    let until = Instant::now() + Duration::from_secs(20);
    while refreshes(sigil, result).await < n {
        assert!(
            Instant::now() < until,
            "no {result} refresh #{n}:\n{}",
            sigil.logs()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A Sigstore instance the embedded root does not know is trusted once its
/// TUF repository publishes its root, without a restart; a rotation to
/// another instance (with every TUF key rotated) is followed; a refresh
/// that fails TUF's checks leaves the last good root in force; the
/// metadata expiry is a metric.
#[tokio::test]
async fn the_default_trusted_root_follows_its_tuf_repository() {
    let w = KeylessWorld::start().await;
    let first = &w.sigstore;
    let second = Sigstore::new();
    let a = push_signed_by(&w, first, "kl/a").await;
    let b = push_signed_by(&w, &second, "kl/b").await;

    let mut repo = TufRepo::new(first.trusted_root().to_string().as_bytes());
    let cdn = repo.serve().await;
    let bootstrap = w.dir.path().join("tuf-root.json");
    std::fs::write(&bootstrap, repo.bootstrap_root()).unwrap();
    let sigil = Sigil::start(
        Some(&policy(&w.registry.host())),
        &[
            "--tuf-mirror",
            &cdn.url(),
            "--tuf-root",
            bootstrap.to_str().unwrap(),
            "--trust-root-refresh",
            "1s",
        ],
    )
    .await;
    wait_refreshes(&sigil, "changed", 1.0).await;
    let pod = |image: String| {
        let api = sigil.apiserver();
        async move { api.create_pod("team", &[&image]).await }
    };
    let got = pod(a.clone()).await;
    assert!(
        got.allowed,
        "signed by the published instance: {}",
        got.message
    );
    let got = pod(b.clone()).await;
    assert!(!got.allowed, "an instance the root does not list");

    // Rotation: the repository now publishes the second instance's root
    // and every TUF key is replaced (root v2 signed by old and new keys).
    repo.publish(second.trusted_root().to_string().as_bytes());
    repo.rotate_keys();
    wait_refreshes(&sigil, "changed", 2.0).await;
    let got = pod(b.clone()).await;
    assert!(got.allowed, "after the rotation: {}", got.message);
    let got = pod(a.clone()).await;
    assert!(!got.allowed, "the first instance is no longer trusted");

    // A tampered target fails TUF's hash check: the second root stays.
    let third = Sigstore::new();
    repo.publish(third.trusted_root().to_string().as_bytes());
    repo.corrupt_target();
    let errors = refreshes(&sigil, "error").await;
    wait_refreshes(&sigil, "error", errors + 1.0).await;
    let got = pod(b).await;
    assert!(
        got.allowed,
        "the last good root stays in force: {}",
        got.message
    );
    assert!(
        sigil.logs().contains("trusted root refresh failed"),
        "the failure is logged with its reason"
    );
    let metrics = sigil.metrics().await;
    assert!(
        metrics.contains(
            "sigil_trust_root_expiry_timestamp_seconds{trust_root=\"public-good\"} 4070908800"
        ),
        "{metrics}"
    );
}

/// `sigil trust-root show` prints the embedded root's logs, CAs, TSA and
/// CT logs; `--refresh` prints what a TUF repository publishes, verified.
#[tokio::test]
async fn trust_root_show_prints_the_embedded_root_and_a_refreshed_one() {
    let out = crate::support::sigil::run_sigil(&["trust-root", "show"], None);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    for want in [
        "source: embedded in sigil",
        "log2025-1.rekor.sigstore.dev",
        "timestamp authorities (1)",
        "CT logs (2)",
    ] {
        assert!(text.contains(want), "{want:?} in {text}");
    }
    let ss = Sigstore::new();
    let repo = TufRepo::new(ss.trusted_root().to_string().as_bytes());
    let dir = tempfile::tempdir().unwrap();
    let bootstrap = dir.path().join("root.json");
    std::fs::write(&bootstrap, repo.bootstrap_root()).unwrap();
    let out = crate::support::sigil::run_sigil(
        &[
            "trust-root",
            "show",
            "--refresh",
            "--tuf-mirror",
            &repo.file_url(),
            "--tuf-root",
            bootstrap.to_str().unwrap(),
        ],
        None,
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("source: TUF file://"), "{text}");
    assert!(text.contains("root v1, timestamp v1"), "{text}");
    // A repository that fails TUF's checks is an error, exit 2.
    repo.corrupt_target();
    let out = crate::support::sigil::run_sigil(
        &[
            "trust-root",
            "show",
            "--refresh",
            "--tuf-mirror",
            &repo.file_url(),
            "--tuf-root",
            bootstrap.to_str().unwrap(),
        ],
        None,
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("TUF"));
}
