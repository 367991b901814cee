//! Both built-in trusted roots kept current by `sigil serve` from TUF
//! repositories python-tuf made (`scripts/tuf-repo.py`): `github` from one
//! in GitHub's layout (tuf-on-ci's key IDs, which a client that recomputes
//! them refuses) — a new authority, an authority's end date and a root
//! rotation published there reach the verdicts of a policy naming
//! `trustRoot: github`, and `sigil trust-root show github` says where the
//! root in force came from and when — and `public-good` from one in
//! Sigstore's layout (root-signing's key IDs, a delegated role).

use crate::support::attestations::{self as att, SLSA_V1};
use crate::support::github::{Registry, push_to_registry};
use crate::support::pytuf::PyRepo;
use crate::support::sigil::{Sigil, run_sigil};
use crate::support::sigstore::{GITHUB_ISSUER, GITHUB_WORKFLOW, KeylessWorld, Sigstore};

const API: &str = "https://github.com/acme/api";
const MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";

/// Waits (at most 20 s) until the root `name` has changed `n` times.
async fn wait_changes_of(sigil: &Sigil, name: &str, n: f64) {
    crate::trust::wait_refreshes_of(sigil, name, "changed", n).await;
}

/// Waits (at most 20 s) until the github root has changed `n` times.
async fn wait_changes(sigil: &Sigil, n: f64) {
    wait_changes_of(sigil, "github", n).await;
}

/// `sigil ARGS` on a blocking thread, so this test's servers keep serving.
async fn cli(args: &[&str]) -> std::process::Output {
    let args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
    tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        run_sigil(&args, None)
    })
    .await
    .unwrap()
}

/// `root` with `other`'s certificate and timestamp authorities added.
fn with_authorities_of(root: &serde_json::Value, other: &Sigstore) -> serde_json::Value {
    let mut r = root.clone();
    let o = other.trusted_root_without_logs();
    for k in ["certificateAuthorities", "timestampAuthorities"] {
        let list = r[k].as_array_mut().unwrap();
        list.extend(o[k].as_array().unwrap().iter().cloned());
    }
    r
}

#[tokio::test]
async fn the_github_root_follows_a_tuf_repository_in_githubs_layout() {
    let w = KeylessWorld::start().await;
    let (reg, first) = (&w.registry, &w.sigstore);
    let second = Sigstore::new();
    let h = reg.host();
    let t = time::OffsetDateTime::now_utc().unix_timestamp();
    // gh/a attested by the instance the repository publishes first, gh/b
    // by one it adds later; both as GitHub's own instance signs private
    // repositories' attestations (no log, a signed timestamp).
    for (repo, ss) in [("gh/a", first), ("gh/b", &second)] {
        let d = reg.push_image(repo, "v1").await;
        let statement = serde_json::to_vec(&serde_json::json!({
            "_type": "https://in-toto.io/Statement/v1",
            "subject": [{"name": format!("{h}/{repo}"), "digest": {"sha256": d.trim_start_matches("sha256:")}}],
            "predicateType": SLSA_V1,
            "predicate": att::predicate(SLSA_V1, API, t - 3600)
        }))
        .unwrap();
        let bundle = ss.github_private_attestation(
            &statement,
            GITHUB_WORKFLOW,
            GITHUB_ISSUER,
            &[("sourceRepositoryUri", API)],
            t - 3600,
            t - 3500,
        );
        let created = "2026-12-03T09:41:07.318Z";
        push_to_registry(
            reg,
            repo,
            &d,
            MANIFEST,
            &bundle,
            SLSA_V1,
            created,
            Registry::Oci,
        )
        .await;
    }
    let published = first.trusted_root_without_logs();
    let repo = PyRepo::init("github", &published.to_string()).await;
    let cache = tempfile::tempdir().unwrap();
    let bootstrap = repo.bootstrap_path();
    let flags = [
        "--tuf-mirror",
        "http://127.0.0.1:9/",
        "--github-tuf-mirror",
        &repo.url(),
        "--github-tuf-root",
        bootstrap.to_str().unwrap(),
        "--tuf-cache-dir",
        cache.path().to_str().unwrap(),
    ];
    let policy = format!(
        "apiVersion: sigil.dev/v1alpha1\nkind: ImagePolicy\nmetadata: {{name: github}}\nspec:\n  registries:\n    - {{host: \"{h}\", insecure: true}}\n  rules:\n    - name: built-by-ci\n      match: [\"{h}/gh/**\"]\n      attestations:\n        - name: provenance\n          predicateType: slsaprovenance1\n          attestors:\n            - {{name: gha, cosign: {{keyless: {{issuer: \"{GITHUB_ISSUER}\", subject: \"{GITHUB_WORKFLOW}\"}}, trustRoot: github}}}}\n"
    );
    let mut args = flags.to_vec();
    args.extend(["--trust-root-refresh", "1s"]);
    let sigil = Sigil::start(Some(&policy), &args).await;
    wait_changes(&sigil, 1.0).await;
    let admit = |repo: &'static str| {
        let api = sigil.apiserver();
        let image = format!("{h}/{repo}:v1");
        async move { api.create_pod("team", &[&image]).await }
    };
    let a = admit("gh/a").await;
    assert!(a.allowed, "the published instance: {}", a.message);
    let b = admit("gh/b").await;
    assert!(!b.allowed, "an instance the github root does not list yet");

    // A new certificate and timestamp authority published.
    let both = with_authorities_of(&published, &second);
    repo.publish(&both.to_string());
    wait_changes(&sigil, 2.0).await;
    let b = admit("gh/b").await;
    assert!(b.allowed, "after the new authorities: {}", b.message);

    // The first instance's authorities end before gh/a was signed.
    let mut ended = both.clone();
    let end = time::OffsetDateTime::from_unix_timestamp(t - 7200)
        .unwrap()
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap();
    for k in ["certificateAuthorities", "timestampAuthorities"] {
        ended[k][0]["validFor"]["end"] = end.clone().into();
    }
    // A root rotation comes with it (new root keys, signed by old and new).
    repo.rotate_root();
    repo.publish(&ended.to_string());
    wait_changes(&sigil, 3.0).await;
    let a = admit("gh/a").await;
    assert!(!a.allowed, "signed after its authority's end date");
    assert!(admit("gh/b").await.allowed);

    // What `trust-root show github` says: the repository's current root,
    // verified by the same client (--refresh), and what the server kept.
    let mut show = vec!["trust-root", "show", "github", "--refresh"];
    show.extend(flags);
    let out = cli(&show).await;
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains(&format!("source: TUF {}", repo.url())),
        "{text}"
    );
    assert!(text.contains("(root v2, timestamp v3"), "{text}");
    assert!(text.contains("timestamp authorities (2)"), "{text}");
    assert!(
        text.contains(&format!("valid {} .. {end}", "2020-01-01T00:00:00Z")),
        "{text}"
    );
    let kept = [
        "trust-root",
        "show",
        "github",
        "--tuf-cache-dir",
        cache.path().to_str().unwrap(),
    ];
    let out = cli(&kept).await;
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("(root v2, timestamp v3") && text.contains("last refreshed: "),
        "{text}"
    );
    let out = cli(&["trust-root", "show", "github"]).await;
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(
            "source: embedded in sigil (newest authority valid from 2026-06-12T00:00:00Z)"
        ),
        "{text}"
    );
}

#[tokio::test]
async fn the_public_good_root_follows_a_tuf_repository_in_sigstores_layout() {
    let w = KeylessWorld::start().await;
    let (reg, ss) = (&w.registry, &w.sigstore);
    let h = reg.host();
    let now = time::OffsetDateTime::now_utc().unix_timestamp();
    let d = reg.push_image("kl/a", "v1").await;
    let payload = crate::support::signing::simple_signing(&format!("{h}/kl/a"), &d);
    let k = ss.sign(
        &payload,
        GITHUB_WORKFLOW,
        GITHUB_ISSUER,
        now - 3600,
        now - 3540,
        None,
    );
    crate::support::signing::push_legacy(reg, "kl/a", &d, vec![k.layer(payload)]).await;
    let repo = PyRepo::init("sigstore", &ss.trusted_root().to_string()).await;
    let bootstrap = repo.bootstrap_path();
    let policy = format!(
        "apiVersion: sigil.dev/v1alpha1\nkind: ImagePolicy\nmetadata: {{name: kl}}\nspec:\n  registries:\n    - {{host: \"{h}\", insecure: true}}\n  rules:\n    - name: ci\n      match: [\"{h}/kl/**\"]\n      verify:\n        - name: ci\n          cosign:\n            keyless: {{issuer: \"{GITHUB_ISSUER}\", subject: \"{GITHUB_WORKFLOW}\"}}\n"
    );
    let sigil = Sigil::start(
        Some(&policy),
        &[
            "--tuf-mirror",
            &repo.url(),
            "--tuf-root",
            bootstrap.to_str().unwrap(),
            "--trust-root-refresh",
            "1s",
        ],
    )
    .await;
    wait_changes_of(&sigil, "public-good", 1.0).await;
    let got = sigil
        .apiserver()
        .create_pod("team", &[&format!("{h}/kl/a:v1")])
        .await;
    assert!(
        got.allowed,
        "signed by the instance the repository publishes: {}",
        got.message
    );
    // Its root keys rotated and another instance published: followed.
    repo.rotate_root();
    repo.publish(&Sigstore::new().trusted_root().to_string());
    wait_changes_of(&sigil, "public-good", 2.0).await;
    let got = sigil
        .apiserver()
        .create_pod("team", &[&format!("{h}/kl/a:v1")])
        .await;
    assert!(!got.allowed, "the first instance is no longer published");
}
