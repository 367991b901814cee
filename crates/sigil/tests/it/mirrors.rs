//! Several mirrors per origin, with three real registries (origin, mirror
//! A, mirror B) on loopback and a black-hole host: the first mirror that has
//! the image wins and the pin is that mirror's; a dark mirror costs one
//! timeout per cool-down, not one per admission; with no mirror holding the
//! image, `fallback: origin` pins the origin with a warning, an audit
//! annotation and a metric, without it the object is denied naming every
//! mirror; a mirror serving another digest for the tag is refused under
//! `requireSameDigest`; an image pinned by digest moves to a mirror only
//! when the mirror serves that digest.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::support::registry::{Mode, TestRegistry};
use crate::support::review::{pod, review};
use crate::support::sigil::Sigil;

/// The same image (same bytes, so the same digest) pushed to `reg`.
async fn push_same(reg: &TestRegistry, repo: &str, tag: &str, content: &str) -> String {
    let config = br#"{"architecture":"amd64","os":"linux","rootfs":{"type":"layers","diff_ids":[]},"config":{}}"#;
    let ld = reg.push_blob(repo, content.as_bytes()).await;
    reg.push_one_layer(repo, tag, config, &ld, content.len())
        .await
        .0
}

/// Listens, accepts and never answers; counts connections.
async fn black_hole() -> (String, Arc<AtomicUsize>) {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let n = Arc::new(AtomicUsize::new(0));
    let count = n.clone();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((s, _)) = l.accept().await {
            count.fetch_add(1, Ordering::SeqCst);
            held.push(s);
        }
    });
    (addr.to_string(), n)
}

/// Three real registries: the origin, mirror A and mirror B.
async fn registries() -> (TestRegistry, TestRegistry, TestRegistry) {
    let (o, a, b) = tokio::join!(
        TestRegistry::start(Mode::Plain),
        TestRegistry::start(Mode::Plain),
        TestRegistry::start(Mode::Plain)
    );
    (o, a, b)
}

/// Starts sigil with `policy` and creates a Pod running `image` in `shop`.
async fn start_and_create(policy: &str, image: &str) -> (Sigil, crate::support::sigil::Admitted) {
    let s = Sigil::start(Some(policy), &[]).await;
    let got = s.apiserver().create_pod("shop", &[image]).await;
    (s, got)
}

/// `registries:` entries reaching each of `hosts` over plain HTTP.
pub(crate) fn plain_registries(hosts: &[&str]) -> String {
    hosts
        .iter()
        .map(|h| format!("{{host: \"{h}\", insecure: true}}"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn policy(origin: &str, hosts: &[&str], mirror: &str) -> String {
    let registries = plain_registries(hosts);
    format!(
        "apiVersion: sigil.dev/v1alpha1\nkind: ImagePolicy\nspec:\n  registries: [{registries}]\n  mirrors:\n    - {{from: \"{origin}\", {mirror}}}\n  rules:\n    - {{name: all, match: [\"**\"], mode: enforce}}\n"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_mirror_that_has_the_image_wins_and_a_dark_one_is_skipped() {
    let (origin, a, b) = registries().await;
    let (o, ha, hb) = (origin.host(), a.host(), b.host());
    let d_origin = push_same(&origin, "team/app", "v1", "app v1").await;
    // Only B has it.
    let d_b = push_same(&b, "mirror/team/app", "v1", "app v1").await;
    assert_eq!(d_origin, d_b);
    let (dark, hits) = black_hole().await;
    let p = policy(
        &o,
        &[&o, &ha, &hb, &dark],
        &format!("to: [\"{ha}/mirror\", \"{hb}/mirror\"]"),
    );
    let s = Sigil::start(Some(&p), &[]).await;
    let api = s.apiserver();
    let got = api.create_pod("shop", &[&format!("{o}/team/app:v1")]).await;
    assert!(got.allowed, "{}", got.message);
    assert_eq!(
        got.object["spec"]["containers"][0]["image"],
        format!("{hb}/mirror/team/app:v1@{d_b}").as_str(),
        "A lacks it: B's pin"
    );
    assert!(got.warnings.is_empty(), "{:?}", got.warnings);
    // Reinvocation (or a second pass) keeps B: idempotent.
    let again = api
        .create_pod("shop", &[&format!("{hb}/mirror/team/app:v1@{d_b}")])
        .await;
    assert!(again.allowed && !again.patched, "{}", again.message);

    // A dark first mirror: B answers within the deadline; after three
    // failures A is not even tried (one timeout per cool-down).
    let p = policy(
        &o,
        &[&o, &hb, &dark],
        &format!("to: [\"{dark}/mirror\", \"{hb}/mirror\"]"),
    );
    let s = Sigil::start(Some(&p), &[]).await;
    let api = s.apiserver();
    let admit = |tag: u32| {
        let api = &api;
        let o = o.clone();
        async move {
            let t = Instant::now();
            let got = api
                .admit(
                    &review("CREATE", "shop", pod("p", &[&format!("{o}/team/app:v1")])),
                    Duration::from_secs(2),
                )
                .await;
            let _ = tag;
            (got, t.elapsed())
        }
    };
    for i in 0..3 {
        let (got, _) = admit(i).await;
        assert!(got.allowed, "{}", got.message);
        assert_eq!(
            got.object["spec"]["containers"][0]["image"],
            format!("{hb}/mirror/team/app:v1@{d_b}").as_str()
        );
    }
    let tried = hits.load(Ordering::SeqCst);
    assert!(tried >= 1, "the dark mirror was tried first");
    for i in 3..8 {
        let (got, took) = admit(i).await;
        assert!(got.allowed, "{}", got.message);
        assert!(took < Duration::from_millis(500), "B at once: {took:?}");
    }
    assert_eq!(
        hits.load(Ordering::SeqCst),
        tried,
        "A skipped while its breaker is open"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_no_mirror_holding_it_fallback_pins_the_origin_or_the_object_is_denied() {
    let (origin, a, b) = registries().await;
    let (o, ha, hb) = (origin.host(), a.host(), b.host());
    let d = push_same(&origin, "team/app", "v1", "app v1").await;
    // Neither mirror has it; without fallback: denied naming both.
    let p = policy(
        &o,
        &[&o, &ha, &hb],
        &format!("to: [\"{ha}/m\", \"{hb}/m\"]"),
    );
    let (s, got) = start_and_create(&p, &format!("{o}/team/app:v1")).await;
    assert!(!got.allowed);
    assert!(
        got.message.contains("no mirror could serve it")
            && got.message.contains(&format!("{ha}/m/team/app:v1"))
            && got.message.contains(&format!("{hb}/m/team/app:v1")),
        "{}",
        got.message
    );
    drop(s);
    // With fallback: pinned at the origin, with a warning, an annotation and the metric.
    let p = policy(
        &o,
        &[&o, &ha, &hb],
        &format!("to: [\"{ha}/m\", \"{hb}/m\"], fallback: origin"),
    );
    let (s, got) = start_and_create(&p, &format!("{o}/team/app:v1")).await;
    assert!(got.allowed, "{}", got.message);
    assert_eq!(
        got.object["spec"]["containers"][0]["image"],
        format!("{o}/team/app:v1@{d}").as_str()
    );
    assert!(
        got.warnings
            .iter()
            .any(|w| w.contains("no mirror could serve it") && w.contains("pinned at the origin")),
        "{:?}",
        got.warnings
    );
    assert!(
        got.response["response"]["auditAnnotations"]["mirror-fallback"]
            .as_str()
            .is_some_and(|a| a.contains("spec.containers[0].image")),
        "{}",
        got.response
    );
    let m = s.metrics().await;
    assert!(
        m.contains(&format!("sigil_mirror_fallbacks_total{{from=\"{o}\"}} 1")),
        "{m}"
    );
    // `sigil pin` makes the same decision and says so too.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("policy.yaml");
    std::fs::write(&file, &p).unwrap();
    let manifest = format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: p, namespace: shop}}\nspec:\n  containers:\n    - name: app\n      image: {o}/team/app:v1\n"
    );
    let out = crate::support::sigil::run_sigil(
        &["pin", "--policy", file.to_str().unwrap(), "-"],
        Some(&manifest),
    );
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(
        stdout.contains(&format!("image: {o}/team/app:v1@{d}")),
        "{stdout}"
    );
    assert!(
        stderr.contains("warning:") && stderr.contains("pinned at the origin"),
        "{stderr}"
    );
    // And `sigil krm`, as a warning result.
    let list = serde_json::json!({"apiVersion": "config.kubernetes.io/v1", "kind": "ResourceList",
        "items": [{"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "shop"},
                   "spec": {"containers": [{"name": "app", "image": format!("{o}/team/app:v1")}]}}]});
    let out = crate::support::sigil::run_sigil(
        &["krm", "--policy", file.to_str().unwrap()],
        Some(&list.to_string()),
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}");
    assert!(
        stdout.contains("pinned at the origin") && stdout.contains("severity: warning"),
        "{stdout}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mirror_serving_another_digest_for_the_tag_is_refused() {
    let (origin, a, _) = registries().await;
    let (o, ha) = (origin.host(), a.host());
    let d = push_same(&origin, "team/app", "v1", "app v1 (rebuilt)").await;
    let stale = push_same(&a, "m/team/app", "v1", "app v1").await;
    assert_ne!(d, stale);
    let p = policy(
        &o,
        &[&o, &ha],
        &format!("to: \"{ha}/m\", requireSameDigest: true"),
    );
    let (s, got) = start_and_create(&p, &format!("{o}/team/app:v1")).await;
    assert!(!got.allowed);
    assert!(
        got.message.contains(&format!("the mirror serves {stale}"))
            && got.message.contains(&format!("serves {d}"))
            && got.message.contains("stale or tampered mirror"),
        "{}",
        got.message
    );
    drop(s);
    // The default without requireSameDigest: the mirror's answer, as before.
    let p = policy(&o, &[&o, &ha], &format!("to: \"{ha}/m\""));
    let (_s, got) = start_and_create(&p, &format!("{o}/team/app:v1")).await;
    assert_eq!(
        got.object["spec"]["containers"][0]["image"],
        format!("{ha}/m/team/app:v1@{stale}").as_str()
    );
}

/// After a fallback the rule's signature check runs on the origin's digest,
/// with the signatures read from the origin: signed there, admitted; the
/// same policy denies an unsigned origin image.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fallback_is_verified_at_the_origin() {
    use crate::support::signing::{Signer, push_signed};
    let (origin, a, _) = registries().await;
    let (o, ha) = (origin.host(), a.host());
    let key = Signer::p256();
    let dir = tempfile::tempdir().unwrap();
    let pk = dir.path().join("k.pub");
    std::fs::write(&pk, key.public_pem()).unwrap();
    let d = push_signed(&origin, "team/app", "v1", "team/app", &key).await;
    origin.push_image("team/unsigned", "v1").await;
    let p = format!(
        "apiVersion: sigil.dev/v1alpha1\nkind: ImagePolicy\nspec:\n  registries: [{{host: \"{o}\", insecure: true}}, {{host: \"{ha}\", insecure: true}}]\n  mirrors:\n    - {{from: \"{o}\", to: \"{ha}/m\", fallback: origin}}\n  rules:\n    - {{name: signed, match: [\"**\"], verify: [{{name: release, cosign: {{key: \"{}\"}}}}]}}\n",
        pk.display()
    );
    let s = Sigil::start(Some(&p), &[]).await;
    let api = s.apiserver();
    let got = api.create_pod("shop", &[&format!("{o}/team/app:v1")]).await;
    assert!(got.allowed, "{}", got.message);
    assert_eq!(
        got.object["spec"]["containers"][0]["image"],
        format!("{o}/team/app:v1@{d}").as_str()
    );
    let got = api
        .create_pod("shop", &[&format!("{o}/team/unsigned:v1")])
        .await;
    assert!(!got.allowed, "{}", got.message);
    assert!(got.message.contains("release"), "{}", got.message);
}

/// An image already pinned by digest (`controller:v1.15.1@sha256:…`) was
/// rewritten to its mirror without asking the mirror: `-w` exited 0 and
/// `--check` then passed, with a reference no registry serves (and the
/// webhook admitted a Pod that stuck in ErrImagePull). Now the mirror is
/// asked for the digest first: it is written at the mirror only when the
/// mirror serves it; otherwise the object is refused naming the mirror, or
/// kept at the origin with a warning under `fallback: origin`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regression_a_pinned_image_is_never_rewritten_to_a_mirror_that_lacks_its_digest() {
    let (origin, a, _) = registries().await;
    let (o, ha) = (origin.host(), a.host());
    let d = push_same(&origin, "team/app", "v1", "app v1").await;
    let pinned = format!("{o}/team/app:v1@{d}");
    let dir = tempfile::tempdir().unwrap();
    let pin = |p: &str, args: &[&str]| {
        let file = dir.path().join("policy.yaml");
        std::fs::write(&file, p).unwrap();
        let manifest = dir.path().join("pod.yaml");
        std::fs::write(
            &manifest,
            format!("apiVersion: v1\nkind: Pod\nmetadata: {{name: p, namespace: shop}}\nspec:\n  containers:\n    - name: app\n      image: {pinned}\n"),
        )
        .unwrap();
        let mut all = vec!["pin", "--policy", file.to_str().unwrap()];
        all.extend(args);
        all.push(manifest.to_str().unwrap());
        let out = crate::support::sigil::run_sigil(&all, None);
        let written = std::fs::read_to_string(&manifest).unwrap();
        (out, written)
    };
    // The mirror lacks it: refused, naming the mirror; nothing written.
    let p = policy(&o, &[&o, &ha], &format!("to: \"{ha}/m\""));
    let (out, written) = pin(&p, &["-w"]);
    let stderr = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("the mirror does not serve that digest")
            && stderr.contains(&format!("{ha}/m/team/app:v1@{d}")),
        "{stderr}"
    );
    assert!(written.contains(&pinned), "{written}");
    let (out, _) = pin(&p, &["--check"]);
    assert_eq!(out.status.code(), Some(1));
    let (s, got) = start_and_create(&p, &pinned).await;
    assert!(
        !got.allowed,
        "the webhook admitted a digest its mirror lacks"
    );
    assert!(
        got.message.contains("copy the image to the mirror"),
        "{}",
        got.message
    );
    drop(s);
    // With fallback: kept at the origin (sigil cannot tell it from an image
    // it pinned there itself when no mirror had it; the audit reports it
    // once a mirror has it).
    let fb = policy(
        &o,
        &[&o, &ha],
        &format!("to: [\"{ha}/m\"], fallback: origin"),
    );
    let (out, written) = pin(&fb, &["-w"]);
    let stderr = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(written.contains(&pinned), "{written}");
    assert!(stderr.contains("1 already final"), "{stderr}");
    // The mirror has it: written at the mirror, and the result is final.
    push_same(&a, "m/team/app", "v1", "app v1").await;
    let (out, written) = pin(&p, &["-w"]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        written.contains(&format!("image: {ha}/m/team/app:v1@{d}")),
        "{written}"
    );
    let (s, got) = start_and_create(&p, &pinned).await;
    assert!(got.allowed, "{}", got.message);
    assert_eq!(
        got.object["spec"]["containers"][0]["image"],
        format!("{ha}/m/team/app:v1@{d}").as_str()
    );
    drop(s);
}
