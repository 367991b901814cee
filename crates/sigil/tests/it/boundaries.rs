//! What a team, a signer or a dry run must never make sigil do, end to end
//! with real registries (docs/security.md): each test is named after the
//! door it keeps shut and failed on the build before it was shut.

use std::time::Duration;

use crate::support::registry::{Mode, TestRegistry};
use crate::support::review::{pod, review};
use crate::support::sigil::Sigil;

const ALL: &str = "    - {name: all, match: [\"**\"], mode: enforce}\n";

/// `copy: true` from `o` into `{m}/hub`, over plain HTTP (and `extra`
/// registry settings for the origin).
fn copy_policy(o: &str, m: &str, origin_extra: &str, rules: &str) -> String {
    format!(
        "apiVersion: sigil.dev/v1alpha1\nkind: ImagePolicy\nspec:\n  registries:\n    - {{host: \"{o}\", insecure: true{origin_extra}}}\n    - {{host: \"{m}\", insecure: true}}\n  mirrors:\n    - {{from: \"{o}\", to: \"{m}/hub\", copy: true}}\n  rules:\n{rules}"
    )
}

/// Whether `reg` serves `repo:reference`, asked a few times over `for_` (a
/// copy runs in the background: absence is only believed after a while).
async fn served_within(reg: &TestRegistry, repo: &str, reference: &str, for_: Duration) -> bool {
    let until = std::time::Instant::now() + for_;
    loop {
        if crate::mirror_copy::has_manifest(reg, repo, reference).await {
            return true;
        }
        if std::time::Instant::now() >= until {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// `kubectl diff`, Argo CD and Flux send `dryRun: true`: Kubernetes forbids
/// side effects then. Copy on admission used to push the image into the
/// mirror anyway. Now a dry run copies nothing, says why, and the same
/// review carried out copies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dry_run_never_writes_into_the_mirror() {
    let (origin, mirror) = tokio::join!(
        TestRegistry::start(Mode::Plain),
        TestRegistry::start(Mode::Plain)
    );
    let (o, m) = (origin.host(), mirror.host());
    let d = origin.push_image("team/app", "v1").await;
    let s = Sigil::start(Some(&copy_policy(&o, &m, "", ALL)), &[]).await;
    let image = format!("{o}/team/app:v1");
    let mut dry = review("CREATE", "shop", pod("p", &[&image]));
    dry["request"]["dryRun"] = serde_json::json!(true);
    let got = s.apiserver().admit(&dry, Duration::from_secs(10)).await;
    assert!(!got.allowed, "the mirror lacks it and fallback is off");
    assert!(
        got.message
            .contains("not copied from the origin: a dry run has no side effects"),
        "{}",
        got.message
    );
    assert!(
        !served_within(&mirror, "hub/team/app", "v1", Duration::from_secs(2)).await,
        "a dry run wrote into the mirror"
    );
    let got = s.apiserver().create_pod("shop", &[&image]).await;
    assert!(got.allowed, "{}", got.message);
    assert!(served_within(&mirror, "hub/team/app", &d, Duration::from_secs(5)).await);
}

/// Copy on admission ran before the rule's verification: an unsigned image
/// was denied, yet landed in the shared mirror for anyone to pull. Now the
/// origin's digest must pass the image's verification first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_denied_image_is_never_copied_into_the_mirror() {
    let (origin, mirror) = tokio::join!(
        TestRegistry::start(Mode::Plain),
        TestRegistry::start(Mode::Plain)
    );
    let (o, m) = (origin.host(), mirror.host());
    origin.push_image("team/app", "v1").await;
    let key = crate::support::signing::Signer::p256();
    let rules = format!(
        "    - name: signed\n      match: [\"{o}/team/**\"]\n      verify: [{{name: team, cosign: {{key: {:?}}}}}]\n",
        key.public_pem()
    );
    let s = Sigil::start(Some(&copy_policy(&o, &m, "", &rules)), &[]).await;
    let got = s
        .apiserver()
        .create_pod("shop", &[&format!("{o}/team/app:v1")])
        .await;
    assert!(!got.allowed);
    assert!(
        got.message
            .contains("not copied from the origin: the origin's digest does not pass verification"),
        "{}",
        got.message
    );
    assert!(
        !served_within(&mirror, "hub/team/app", "v1", Duration::from_secs(2)).await,
        "an unsigned image was copied into the mirror"
    );
}

/// Copies read the origin with sigil's own credentials (the policy's
/// `auth`): a Pod with no pull secret got a private image copied into a
/// mirror anyone can read. Now a copy runs only when the workload's own
/// credentials (pull secrets, else anonymous) can pull the origin.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_private_origin_is_not_laundered_into_the_shared_mirror() {
    let (origin, mirror) = tokio::join!(
        TestRegistry::start(Mode::Htpasswd {
            user: "robot",
            password: "pr1vate"
        }),
        TestRegistry::start(Mode::Plain)
    );
    let (o, m) = (origin.host(), mirror.host());
    origin.push_image("team-b/secret", "v1").await;
    let dir = tempfile::tempdir().unwrap();
    let pw = dir.path().join("pw");
    std::fs::write(&pw, "pr1vate\n").unwrap();
    let auth = format!(
        ", auth: {{username: robot, passwordFile: \"{}\"}}",
        pw.display()
    );
    let s = Sigil::start(Some(&copy_policy(&o, &m, &auth, ALL)), &[]).await;
    let got = s
        .apiserver()
        .create_pod("team-a", &[&format!("{o}/team-b/secret:v1")])
        .await;
    assert!(!got.allowed);
    assert!(
        got.message
            .contains("the workload's own pull secrets cannot pull")
            && got
                .message
                .contains("only what the admitting workload could pull itself"),
        "{}",
        got.message
    );
    assert!(!got.message.contains("pr1vate"), "{}", got.message);
    assert!(
        !served_within(&mirror, "hub/team-b/secret", "v1", Duration::from_secs(2)).await,
        "a private image was copied with sigil's own credentials"
    );
}

/// A copy had no byte limit of its own: one admission could make sigil move
/// any amount into the shared mirror. Now an image over
/// `--mirror-copy-max-bytes` is refused before a byte moves, saying which
/// flag bounds it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_image_over_the_copy_limit_is_not_copied() {
    let (origin, mirror) = tokio::join!(
        TestRegistry::start(Mode::Plain),
        TestRegistry::start(Mode::Plain)
    );
    let (o, m) = (origin.host(), mirror.host());
    origin.push_large_image("team/big", "v1", 1 << 20, 3).await;
    let s = Sigil::start(
        Some(&copy_policy(&o, &m, "", ALL)),
        &["--mirror-copy-max-bytes", "65536"],
    )
    .await;
    let got = s
        .apiserver()
        .create_pod("shop", &[&format!("{o}/team/big:v1")])
        .await;
    assert!(!got.allowed);
    assert!(
        got.message.contains("--mirror-copy-max-bytes"),
        "{}",
        got.message
    );
    assert!(!served_within(&mirror, "hub/team/big", "v1", Duration::from_secs(1)).await);
}
