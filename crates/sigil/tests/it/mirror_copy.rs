//! Copy on admission and `sigil mirror`, with real registries on loopback
//! (origin and mirror; one registry for the mount case; a throttling proxy
//! in front of the origin for a copy longer than an admission): a signed
//! multi-arch index arrives at the mirror with its signature, attestation
//! and referrers, and verifies there; fifty admissions of one missing image
//! make one copy; a copy the deadline cannot wait for falls back now and
//! lands afterwards; pushes use `pushAuth`; blobs are mounted within one
//! registry; a blob that does not hash to its digest is never committed;
//! 200 MiB copies in bounded memory, and a copy killed with SIGKILL leaves
//! no half image and is completed by the next.

use std::time::{Duration, Instant};

use crate::support::attestations::{self as att, CYCLONEDX, SPDX, push_att, push_bundles};
use crate::support::fault::Throttle;
use crate::support::intoto::statement;
use crate::support::registry::{Mode, TestRegistry};
use crate::support::sigil::{Sigil, bin, run_sigil};
use crate::support::signing::{Layer, Signer, push_legacy, simple_signing};

/// A policy mirroring `from` to `to` with `copy: true` (and `extra` on the
/// mirror entry), over plain-HTTP `hosts`, with `rules`.
fn policy(hosts: &[&str], from: &str, to: &str, extra: &str, rules: &str) -> String {
    let registries = crate::mirrors::plain_registries(hosts);
    format!(
        "apiVersion: sigil.dev/v1alpha1\nkind: ImagePolicy\nspec:\n  registries: [{registries}]\n  mirrors:\n    - {{from: \"{from}\", to: \"{to}\", copy: true{extra}}}\n  rules:\n{rules}"
    )
}

/// Two real registries: the origin and the mirror.
async fn origin_and_mirror() -> (TestRegistry, TestRegistry) {
    tokio::join!(
        TestRegistry::start(Mode::Plain),
        TestRegistry::start(Mode::Plain)
    )
}

const ALL: &str = "    - {name: all, match: [\"**\"], mode: enforce}\n";

/// Whether `reg` has `repo`'s manifest `reference` (a tag or digest).
pub(crate) async fn has_manifest(reg: &TestRegistry, repo: &str, reference: &str) -> bool {
    reqwest::Client::new()
        .head(format!("{}/v2/{repo}/manifests/{reference}", reg.base()))
        .header(
            "accept",
            "application/vnd.oci.image.index.v1+json, application/vnd.oci.image.manifest.v1+json",
        )
        .send()
        .await
        .unwrap()
        .status()
        == 200
}

/// `sigil mirror --policy FILE IMAGE`, as a user runs it.
fn sigil_mirror(policy: &std::path::Path, image: &str) -> std::process::Output {
    run_sigil(
        &["mirror", "--policy", policy.to_str().unwrap(), image],
        None,
    )
}

fn image_of(a: &crate::support::sigil::Admitted) -> String {
    a.object["spec"]["containers"][0]["image"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_signed_index_is_copied_with_its_attestations_and_verifies_at_the_mirror() {
    let (origin, mirror) = origin_and_mirror().await;
    let (o, m) = (origin.host(), mirror.host());
    let (d, platforms) = origin
        .push_index(
            "team/app",
            "v1",
            &[("linux", "amd64", None), ("linux", "arm64", None)],
        )
        .await;
    let team = Signer::p256();
    let payload = simple_signing(&format!("{o}/team/app"), &d);
    push_legacy(
        &origin,
        "team/app",
        &d,
        vec![Layer::new(payload.clone(), &team.sign(&payload))],
    )
    .await;
    let now = time::OffsetDateTime::now_utc().unix_timestamp();
    let stmt = |pt: &str| {
        statement(
            &d,
            pt,
            att::predicate(pt, "https://github.com/acme/app", now - 60),
        )
    };
    push_att(
        &origin,
        "team/app",
        &d,
        &[att::keyed_layer(&team, &stmt(SPDX))],
    )
    .await;
    push_bundles(
        &origin,
        "team/app",
        &d,
        &[att::keyed_bundle(&team, &stmt(CYCLONEDX))],
    )
    .await;
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("team.pub");
    std::fs::write(&key, team.public_pem()).unwrap();
    let rules = format!(
        "    - name: signed\n      match: [\"{o}/team/**\"]\n      verify: [{{name: team, cosign: {{key: \"{}\"}}}}]\n      attestations:\n        - {{name: sbom, predicateType: spdx, attestors: [team]}}\n        - {{name: cdx, predicateType: cyclonedx, attestors: [team]}}\n",
        key.display()
    );
    let p = policy(&[&o, &m], &o, &format!("{m}/hub"), "", &rules);
    let s = Sigil::start(Some(&p), &[]).await;
    let got = s
        .apiserver()
        .create_pod("shop", &[&format!("{o}/team/app:v1")])
        .await;
    assert!(got.allowed, "{}", got.message);
    assert_eq!(image_of(&got), format!("{m}/hub/team/app:v1@{d}"));
    let r = got.reinvoked.as_ref().unwrap();
    assert!(
        r.allowed && !r.patched,
        "reinvocation is a no-op: {}",
        r.message
    );
    // Everything verification reads is at the mirror, under the same names.
    let hex = d.trim_start_matches("sha256:");
    for reference in [
        d.clone(),
        "v1".into(),
        platforms[0].1.clone(),
        platforms[1].1.clone(),
        format!("sha256-{hex}.sig"),
        format!("sha256-{hex}.att"),
        format!("sha256-{hex}"),
    ] {
        assert!(
            has_manifest(&mirror, "hub/team/app", &reference).await,
            "{reference}"
        );
    }
    // The next Pod finds it there: no second copy.
    let again = s
        .apiserver()
        .create_pod("shop", &[&format!("{o}/team/app:v1")])
        .await;
    assert!(again.allowed, "{}", again.message);
    assert_eq!(image_of(&again), format!("{m}/hub/team/app:v1@{d}"));
    assert_eq!(
        s.counter("sigil_mirror_copies_started_total", &[]).await,
        1.0
    );
    assert_eq!(
        s.counter("sigil_mirror_copies_total", &[("result", "ok")])
            .await,
        1.0
    );
    assert!(s.counter("sigil_mirror_copy_bytes_total", &[]).await > 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_concurrent_admissions_of_a_missing_image_make_one_copy() {
    let (origin, mirror) = origin_and_mirror().await;
    let (o, m) = (origin.host(), mirror.host());
    let (d, _) = origin.push_large_image("team/app", "v1", 4 << 20, 7).await;
    let p = policy(&[&o, &m], &o, &format!("{m}/hub"), "", ALL);
    let s = Sigil::start(Some(&p), &[]).await;
    let api = s.apiserver();
    let image = format!("{o}/team/app:v1");
    let images = [image.as_str()];
    let all =
        futures_util::future::join_all((0..50).map(|_| api.create_pod("shop", &images))).await;
    for a in &all {
        assert!(a.allowed, "{}", a.message);
        assert_eq!(image_of(a), format!("{m}/hub/team/app:v1@{d}"));
    }
    assert_eq!(
        s.counter("sigil_mirror_copies_started_total", &[]).await,
        1.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_longer_than_the_deadline_falls_back_now_and_lands_afterwards() {
    let (origin, mirror) = origin_and_mirror().await;
    // The origin, read through a proxy passing 1 MiB/s: 6 MiB take ~6 s.
    let slow = Throttle::start(origin.host(), 1 << 20).await;
    let (o, m) = (slow.addr.to_string(), mirror.host());
    let (d, _) = origin.push_large_image("team/app", "v1", 6 << 20, 11).await;
    let p = policy(
        &[&o, &m],
        &o,
        &format!("{m}/hub"),
        ", fallback: origin",
        ALL,
    );
    let s = Sigil::start(Some(&p), &[]).await;
    let api = s.apiserver();
    let review = crate::support::review::review(
        "CREATE",
        "shop",
        crate::support::review::pod("p", &[&format!("{o}/team/app:v1")]),
    );
    let started = Instant::now();
    let got = api.admit(&review, Duration::from_secs(3)).await;
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "answered within the deadline"
    );
    assert!(got.allowed, "{}", got.message);
    assert_eq!(
        image_of(&got),
        format!("{o}/team/app:v1@{d}"),
        "pinned at the origin for now"
    );
    assert!(
        got.warnings
            .iter()
            .any(|w| w.contains("a copy from the origin is under way")
                && w.contains("pinned at the origin")),
        "{:?}",
        got.warnings
    );
    // The copy goes on without the admission, and the mirror has it.
    let until = Instant::now() + Duration::from_secs(60);
    while !has_manifest(&mirror, "hub/team/app", "v1").await {
        assert!(Instant::now() < until, "the copy did not finish in 60 s");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let after = api.create_pod("shop", &[&format!("{o}/team/app:v1")]).await;
    assert!(after.allowed, "{}", after.message);
    assert_eq!(image_of(&after), format!("{m}/hub/team/app:v1@{d}"));
    assert_eq!(
        s.counter("sigil_mirror_copies_started_total", &[]).await,
        1.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pushes_use_push_auth_and_a_refused_push_says_so() {
    let (origin, mirror) = tokio::join!(
        TestRegistry::start(Mode::Plain),
        TestRegistry::start(Mode::Htpasswd {
            user: "pusher",
            password: "s3cret"
        })
    );
    let (o, m) = (origin.host(), mirror.host());
    let d = origin.push_image("team/app", "v1").await;
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("good");
    let bad = dir.path().join("bad");
    std::fs::write(&good, "s3cret\n").unwrap();
    std::fs::write(&bad, "wrong\n").unwrap();
    let with_push = |push: &std::path::Path| {
        format!(
            "apiVersion: sigil.dev/v1alpha1\nkind: ImagePolicy\nspec:\n  registries:\n    - {{host: \"{o}\", insecure: true}}\n    - {{host: \"{m}\", insecure: true, auth: {{username: pusher, passwordFile: \"{}\"}}, pushAuth: {{username: pusher, passwordFile: \"{}\"}}}}\n  mirrors:\n    - {{from: \"{o}\", to: \"{m}/hub\", copy: true}}\n  rules:\n{ALL}",
            good.display(),
            push.display()
        )
    };
    // A wrong pushAuth (auth is right, so reads work): refused, naming the fix.
    let s = Sigil::start(Some(&with_push(&bad)), &[]).await;
    let got = s
        .apiserver()
        .create_pod("shop", &[&format!("{o}/team/app:v1")])
        .await;
    assert!(!got.allowed);
    assert!(
        got.message.contains("the copy from the origin failed") && got.message.contains("pushAuth"),
        "{}",
        got.message
    );
    assert!(
        !got.message.contains("(registry answered"),
        "the mirror's answer is said once, not nested: {}",
        got.message
    );
    assert!(
        !got.message.contains("wrong"),
        "no secret in a message: {}",
        got.message
    );
    drop(s);
    let s = Sigil::start(Some(&with_push(&good)), &[]).await;
    let got = s
        .apiserver()
        .create_pod("shop", &[&format!("{o}/team/app:v1")])
        .await;
    assert!(got.allowed, "{}", got.message);
    assert_eq!(image_of(&got), format!("{m}/hub/team/app:v1@{d}"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blobs_are_mounted_when_origin_and_mirror_share_a_registry() {
    let reg = TestRegistry::start(Mode::Plain).await;
    let h = reg.host();
    let (d, _) = reg.push_large_image("upstream/app", "v1", 2 << 20, 3).await;
    let p = policy(
        &[&h],
        &format!("{h}/upstream"),
        &format!("{h}/cache"),
        "",
        ALL,
    );
    let s = Sigil::start(Some(&p), &[]).await;
    let got = s
        .apiserver()
        .create_pod("shop", &[&format!("{h}/upstream/app:v1")])
        .await;
    assert!(got.allowed, "{}", got.message);
    assert_eq!(image_of(&got), format!("{h}/cache/app:v1@{d}"));
    assert_eq!(
        s.counter("sigil_mirror_copies_total", &[("result", "ok")])
            .await,
        1.0
    );
    assert_eq!(
        s.counter("sigil_mirror_copy_bytes_total", &[]).await,
        0.0,
        "mounted, not streamed"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blob_that_does_not_hash_to_its_digest_is_never_committed() {
    let (origin, mirror) = origin_and_mirror().await;
    let (o, m) = (origin.host(), mirror.host());
    // A layer whose stored bytes are not what its digest says.
    let lie = format!("sha256:{}", "ab".repeat(32));
    origin.seed_blob("team/app", &lie);
    let config = br#"{"architecture":"amd64","os":"linux","rootfs":{"type":"layers","diff_ids":[]},"config":{}}"#;
    let (d, _) = origin
        .push_one_layer("team/app", "v1", config, &lie, 18)
        .await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("policy.yaml");
    std::fs::write(&file, policy(&[&o, &m], &o, &format!("{m}/hub"), "", ALL)).unwrap();
    let out = sigil_mirror(&file, &format!("{o}/team/app:v1"));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("hashing to") && stderr.contains(&lie),
        "{stderr}"
    );
    assert!(!has_manifest(&mirror, "hub/team/app", &d).await);
    assert!(!has_manifest(&mirror, "hub/team/app", "v1").await);
    // An image no mirror maps is bad input.
    let out = run_sigil(
        &[
            "mirror",
            "--policy",
            file.to_str().unwrap(),
            "elsewhere.example/x:1",
        ],
        None,
    );
    assert_eq!(
        out.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Runs `sigil mirror` on `args`; samples its RSS every 10 ms until it
/// exits, or kills it with SIGKILL once `kill_when` says so. Returns (exit
/// status, peak RSS in KiB, stderr).
fn mirror_sampled(
    args: &[String],
    mut kill_when: impl FnMut() -> bool,
) -> (Option<i32>, u64, String) {
    let mut child = std::process::Command::new(bin())
        .arg("mirror")
        .args(args)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let mut peak = 0;
    let until = Instant::now() + Duration::from_secs(120);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let mut err = String::new();
            use std::io::Read as _;
            child
                .stderr
                .take()
                .unwrap()
                .read_to_string(&mut err)
                .unwrap();
            return (status.code(), peak, err);
        }
        peak = peak.max(crate::support::procstat::rss_kib(pid));
        if kill_when() || Instant::now() > until {
            child.kill().unwrap();
            let _ = child.wait();
            return (None, peak, String::new());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_200_mib_copy_stays_in_bounded_memory_and_survives_kill_9() {
    let (origin, mirror) = origin_and_mirror().await;
    let (o, m) = (origin.host(), mirror.host());
    let (d, layer) = origin
        .push_large_image("big/app", "v1", 200 << 20, 42)
        .await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("policy.yaml");
    std::fs::write(&file, policy(&[&o, &m], &o, &format!("{m}/hub"), "", ALL)).unwrap();
    let args = vec![
        "--policy".to_owned(),
        file.display().to_string(),
        format!("{o}/big/app:v1"),
    ];
    // Killed with SIGKILL once 20 MiB reached the mirror's upload area.
    let (status, _, _) = tokio::task::block_in_place(|| {
        mirror_sampled(&args, || {
            mirror.stored_bytes("repositories/hub/big/app/_uploads") > 20 << 20
        })
    });
    assert_eq!(status, None, "killed mid-copy");
    for reference in [d.as_str(), "v1"] {
        assert!(
            !has_manifest(&mirror, "hub/big/app", reference).await,
            "no half image: {reference}"
        );
    }
    // The next copy completes, in bounded memory.
    let (status, peak_kib, stderr) =
        tokio::task::block_in_place(|| mirror_sampled(&args, || false));
    assert_eq!(status, Some(0), "{stderr}");
    assert!(has_manifest(&mirror, "hub/big/app", "v1").await);
    assert!(has_manifest(&mirror, "hub/big/app", &d).await);
    let blob = reqwest::Client::new()
        .head(format!("{}/v2/hub/big/app/blobs/{layer}", mirror.base()))
        .send()
        .await
        .unwrap();
    assert_eq!(blob.status(), 200);
    assert_eq!(
        blob.headers()["content-length"].to_str().unwrap(),
        (200u64 << 20).to_string()
    );
    println!(
        "sigil mirror: 200 MiB copied, peak RSS {} MiB",
        peak_kib / 1024
    );
    assert!(
        peak_kib < 64 * 1024,
        "peak RSS {peak_kib} KiB during a 200 MiB copy"
    );
}

/// An image pinned at the origin by `fallback: origin` is compliant while no
/// mirror has it; once `sigil mirror` copied it, the audit says the Pod
/// runs from the origin what the mirror now serves (`not_mirrored`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_audit_reports_origin_pinned_images_a_mirror_now_has() {
    let (origin, mirror) = origin_and_mirror().await;
    let (o, m) = (origin.host(), mirror.host());
    let d = origin.push_image("team/app", "v1").await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("policy.yaml");
    std::fs::write(
        &file,
        policy(
            &[&o, &m],
            &o,
            &format!("{m}/hub"),
            ", fallback: origin",
            ALL,
        ),
    )
    .unwrap();
    let kube = crate::support::kube::FakeKube::start().await;
    kube.namespaces(&["shop"]);
    let running = format!("{o}/team/app:v1@{d}");
    kube.insert(
        "/api/v1/namespaces/shop/pods",
        serde_json::json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "fell-back", "namespace": "shop"},
            "spec": {"containers": [{"name": "app", "image": running}]},
            "status": {"phase": "Running", "containerStatuses": [{"name": "app", "image": running,
                "imageID": format!("{o}/team/app@{d}"), "ready": true}]}}),
    );
    let audit = || {
        let out = std::process::Command::new(bin())
            .args([
                "audit",
                "-n",
                "shop",
                "-o",
                "json",
                "--policy",
                file.to_str().unwrap(),
            ])
            .env_remove("KUBERNETES_SERVICE_HOST")
            .env("KUBECONFIG", &kube.kubeconfig)
            .output()
            .unwrap();
        let v: serde_json::Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)));
        (out.status.code(), v)
    };
    let (code, v) = tokio::task::block_in_place(audit);
    assert_eq!(code, Some(0), "{v:#}");
    assert_eq!(v["summary"]["compliant"], 1, "{v:#}");
    // `sigil pin` never pushes: it pins the origin (fallback) and names `sigil mirror`.
    let manifest = format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: p, namespace: shop}}\nspec:\n  containers:\n    - name: app\n      image: {o}/team/app:v1\n"
    );
    let out = run_sigil(
        &["pin", "--policy", file.to_str().unwrap(), "-"],
        Some(&manifest),
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(
        stderr.contains("copy on admission runs only in the webhook")
            && stderr.contains(&format!("sigil mirror {o}/team/app:v1")),
        "{stderr}"
    );
    assert!(
        !has_manifest(&mirror, "hub/team/app", "v1").await,
        "pin pushed nothing"
    );
    let out = sigil_mirror(&file, &format!("{o}/team/app:v1"));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains(&format!(
            "copied  {o}/team/app:v1 -> {m}/hub/team/app:v1@{d}"
        )),
        "{stdout}"
    );
    let (code, v) = tokio::task::block_in_place(audit);
    assert_eq!(code, Some(1), "{v:#}");
    let violation = &v["objects"][0]["fields"][0]["violations"][0];
    assert_eq!(violation["reason"], "not_mirrored", "{v:#}");
    assert!(
        violation["detail"]
            .as_str()
            .is_some_and(|s| s.contains(&format!("{m}/hub/team/app:v1 serves the same digest now"))),
        "{v:#}"
    );
}
