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
    refreshes_of(sigil, "public-good", result).await
}

/// How many refreshes of the root `root` ended with `result`.
async fn refreshes_of(sigil: &Sigil, root: &str, result: &str) -> f64 {
    sigil
        .counter(
            "sigil_trust_root_refresh_total",
            &[("trust_root", root), ("result", result)],
        )
        .await
}

/// Waits (at most 20 s) until the public-good `result` refresh count reaches `n`.
async fn wait_refreshes(sigil: &Sigil, result: &str, n: f64) {
    wait_refreshes_of(sigil, "public-good", result, n).await;
}

/// Waits (at most 20 s) until the root `root`'s `result` refresh count reaches `n`.
pub(crate) async fn wait_refreshes_of(sigil: &Sigil, root: &str, result: &str, n: f64) {
    let until = Instant::now() + Duration::from_secs(20);
    while refreshes_of(sigil, root, result).await < n {
        assert!(
            Instant::now() < until,
            "no {result} refresh #{n} of {root}:\n{}",
            sigil.logs()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The log lines about the `github` root, once there is one (at most 10 s).
async fn github_lines(sigil: &Sigil) -> Vec<serde_json::Value> {
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let lines: Vec<serde_json::Value> = sigil
            .logs()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .filter(|l: &serde_json::Value| l["trust_root"] == "github")
            .collect();
        if !lines.is_empty() || Instant::now() > until {
            return lines;
        }
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
    // The github root, which no policy here names and which cannot be
    // refreshed yet, is reported once at info level, never as a warning.
    let github = github_lines(&sigil).await;
    assert_eq!(github.len(), 1, "{github:?}");
    assert_eq!(github[0]["level"], "INFO", "{github:?}");
    assert_eq!(
        github[0]["embedded_since"], "2026-06-12T00:00:00Z",
        "{github:?}"
    );
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

/// `sigil serve` warned on every start about the github root (its refresh
/// failed), whether or not any policy used it. Now the root is refreshed,
/// and warned about when a refresh fails, only while a policy in force names
/// it (here one does; the case without is asserted above): the start says
/// once, at info level, which embedded root is in force.
#[tokio::test]
async fn regression_the_github_root_is_refreshed_and_warned_about_only_when_a_policy_names_it() {
    let policy = format!(
        "apiVersion: sigil.dev/v1alpha1\nkind: ImagePolicy\nmetadata: {{name: gh}}\nspec:\n  rules:\n    - name: private\n      match: [\"private.example/**\"]\n      verify:\n        - name: gha\n          cosign:\n            keyless: {{issuer: \"{ISSUER}\", subject: \"{WHO}\"}}\n            trustRoot: github\n"
    );
    // Both mirrors on a closed loopback port: nothing leaves the machine.
    let closed = "http://127.0.0.1:9/";
    let sigil = Sigil::start(
        Some(&policy),
        &[
            "--tuf-mirror",
            closed,
            "--github-tuf-mirror",
            closed,
            "--trust-root-refresh",
            "24h",
        ],
    )
    .await;
    let until = Instant::now() + Duration::from_secs(10);
    let github = loop {
        let lines = github_lines(&sigil).await;
        if lines.len() >= 2 || Instant::now() > until {
            break lines;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(github[0]["level"], "INFO", "{github:?}");
    assert!(
        github[1..].iter().any(|l| l["level"] == "WARN"
            && l["message"] == "trusted root refresh failed; the last good root stays in force"),
        "{github:?}"
    );
}

/// `sigil trust-root show` prints the embedded root's logs, CAs, TSA and
/// CT logs, each by its URL as well as its name; `--refresh` prints what a
/// TUF repository publishes, verified.
#[tokio::test]
async fn trust_root_show_prints_the_embedded_root_and_a_refreshed_one() {
    let out = crate::support::sigil::run_sigil(&["trust-root", "show"], None);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    for want in [
        "source: embedded in sigil",
        "https://log2025-1.rekor.sigstore.dev ",
        "timestamp authorities (1)",
        "sigstore-tsa-selfsigned (sigstore.dev)   https://timestamp.sigstore.dev/api/v1/timestamp",
        "sigstore (sigstore.dev)                  https://fulcio.sigstore.dev",
        "CT logs (2)",
        "https://ctfe.sigstore.dev/2022 ",
    ] {
        assert!(text.contains(want), "{want:?} in {text}");
    }
    let ss = Sigstore::new();
    let repo = TufRepo::new(ss.trusted_root().to_string().as_bytes());
    let dir = tempfile::tempdir().unwrap();
    let bootstrap = dir.path().join("root.json");
    std::fs::write(&bootstrap, repo.bootstrap_root()).unwrap();
    let show = || {
        crate::support::sigil::run_sigil(
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
        )
    };
    let out = show();
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
    let out = show();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("TUF"));
}

const TRS: &str = "/apis/sigil.dev/v1alpha1/trustroots";

fn trust_root(name: &str, spec: serde_json::Value) -> serde_json::Value {
    serde_json::json!({"apiVersion": "sigil.dev/v1alpha1", "kind": "TrustRoot",
        "metadata": {"name": name}, "spec": spec})
}

fn b64(bytes: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// A TUF repository's files as `spec.repository.files` holds them.
fn files_of(dir: &std::path::Path) -> serde_json::Map<String, serde_json::Value> {
    let mut out = serde_json::Map::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else {
                let rel = p.strip_prefix(dir).unwrap().to_string_lossy().into_owned();
                out.insert(rel, serde_json::json!(b64(&std::fs::read(&p).unwrap())));
            }
        }
    }
    out
}

fn ready_of(o: &serde_json::Value) -> (String, String) {
    let c = &o["status"]["conditions"][0];
    (
        c["status"].as_str().unwrap_or_default().to_owned(),
        c["message"].as_str().unwrap_or_default().to_owned(),
    )
}

/// TrustRoot objects through the kube-apiserver stand-in, as the sigil
/// ServiceAccount would see them: an inline root (`sigstoreKeys`), a TUF
/// repository at a URL (`remote`) and one shipped in the object
/// (`repository`) each verify the images their Sigstore signed, for the
/// verifier that names them; a refused object and a missing name fail the
/// verifiers naming them with the reason (the rest of the policy stays in
/// force); status says what is in force; a deleted TrustRoot stops being
/// trusted without a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trust_root_objects_are_loaded_named_by_verifiers_and_report_status() {
    use crate::support::kube::FakeKube;
    use serde_json::json;
    let w = KeylessWorld::start().await;
    let (inline, remote, shipped) = (&w.sigstore, Sigstore::new(), Sigstore::new());
    let images = [
        push_signed_by(&w, inline, "kl/inline").await,
        push_signed_by(&w, &remote, "kl/remote").await,
        push_signed_by(&w, &shipped, "kl/shipped").await,
    ];
    let remote_repo = TufRepo::new(remote.trusted_root().to_string().as_bytes());
    let cdn = remote_repo.serve().await;
    let shipped_repo = TufRepo::new(shipped.trusted_root().to_string().as_bytes());

    let kube = FakeKube::start().await;
    kube.namespaces(&["team"]);
    kube.insert(
        TRS,
        trust_root("inline", json!({"sigstoreKeys": inline.trusted_root()})),
    );
    kube.insert(
        TRS,
        trust_root(
            "corp",
            json!({"remote": {"mirror": cdn.url(), "root": b64(&remote_repo.bootstrap_root())}}),
        ),
    );
    kube.insert(
        TRS,
        trust_root(
            "airgap",
            json!({"repository": {"root": b64(&shipped_repo.bootstrap_root()),
                                  "files": files_of(shipped_repo.dir())}}),
        ),
    );
    kube.insert(
        TRS,
        trust_root(
            "broken",
            json!({"remote": {"mirror": cdn.url(), "root": "not base64!"}}),
        ),
    );
    let h = w.registry.host();
    let verifier = |name: &str, root: &str| {
        format!(
            "    - name: {name}\n      match: [\"{h}/kl/{name}\"]\n      verify:\n        - name: {name}\n          cosign:\n            keyless: {{issuer: \"{ISSUER}\", subject: \"{WHO}\"}}\n            trustRoot: {root}\n"
        )
    };
    let policy = format!(
        "apiVersion: sigil.dev/v1alpha1\nkind: ImagePolicy\nmetadata: {{name: objects}}\nspec:\n  registries:\n    - {{host: \"{h}\", insecure: true}}\n  rules:\n{}{}{}{}{}",
        verifier("inline", "inline"),
        verifier("remote", "corp"),
        verifier("shipped", "airgap"),
        verifier("broken", "broken"),
        verifier("missing", "nope"),
    );
    let broken = push_signed_by(&w, inline, "kl/broken").await;
    let missing = push_signed_by(&w, inline, "kl/missing").await;
    let sigil = Sigil::start_env(
        Some(&policy),
        &["--watch-policies", "--namespace", "sigil-system"],
        &kube.env(),
    )
    .await;
    let api = sigil.apiserver();
    for image in &images {
        let got = api.create_pod("team", &[image]).await;
        assert!(got.allowed, "{image}: {}\n{}", got.message, sigil.logs());
    }
    let got = api.create_pod("team", &[&broken]).await;
    assert!(!got.allowed);
    assert!(
        got.message.contains(
            "trust material unavailable: trust root \"broken\" is not in force: remote.root is not base64"
        ),
        "{}",
        got.message
    );
    let got = api.create_pod("team", &[&missing]).await;
    assert!(!got.allowed);
    assert!(
        got.message
            .contains("trust root \"nope\" is not in force (no TrustRoot of that name"),
        "{}",
        got.message
    );

    // Status, written by the replica holding the policy-status Lease.
    let until = Instant::now() + Duration::from_secs(15);
    while ["inline", "corp", "airgap", "broken"]
        .iter()
        .any(|n| kube.get(TRS, n).is_none_or(|o| o["status"].is_null()))
    {
        assert!(Instant::now() < until, "TrustRoot status never written");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let corp = kube.get(TRS, "corp").unwrap();
    assert_eq!(ready_of(&corp).0, "True", "{corp}");
    assert_eq!(corp["status"]["rootVersion"], 1);
    assert_eq!(corp["status"]["expires"], "2099-01-01T00:00:00Z");
    assert!(
        corp["status"]["source"]
            .as_str()
            .unwrap()
            .starts_with("tuf http://127.0.0.1:")
    );
    assert_eq!(
        kube.get(TRS, "inline").unwrap()["status"]["source"],
        "inline"
    );
    assert!(
        kube.get(TRS, "airgap").unwrap()["status"]["source"]
            .as_str()
            .unwrap()
            .starts_with("tuf file://")
    );
    let (ready, message) = ready_of(&kube.get(TRS, "broken").unwrap());
    assert_eq!(ready, "False");
    assert!(message.contains("remote.root is not base64"), "{message}");

    // Deleted: its verifier fails within seconds, no restart.
    kube.remove(TRS, "inline");
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let got = api.create_pod("team", &[&images[0]]).await;
        if !got.allowed {
            assert!(
                got.message
                    .contains("trust root \"inline\" is not in force"),
                "{}",
                got.message
            );
            break;
        }
        assert!(
            Instant::now() < until,
            "the deleted TrustRoot is still trusted"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(kube.denied().is_empty(), "{:?}", kube.denied());
}

/// `sigil trust-root show NAME` reads the TrustRoot object from the current
/// kubeconfig's cluster, prints the status sigil wrote and the root loaded
/// from its spec as the server loads it; an unknown name is an error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trust_root_show_reads_a_trust_root_object_from_the_cluster() {
    use crate::support::kube::FakeKube;
    use serde_json::json;
    let ss = Sigstore::new();
    let repo = TufRepo::new(ss.trusted_root().to_string().as_bytes());
    let kube = FakeKube::start().await;
    kube.insert(
        TRS,
        json!({"apiVersion": "sigil.dev/v1alpha1", "kind": "TrustRoot",
               "metadata": {"name": "corp"},
               "spec": {"remote": {"mirror": repo.file_url(), "root": b64(&repo.bootstrap_root())}},
               "status": {"source": "tuf x", "rootVersion": 1, "conditions": [
                   {"type": "Ready", "status": "True", "reason": "Refreshed", "message": "m",
                    "lastTransitionTime": "2026-11-24T00:00:00Z"}]}}),
    );
    kube.insert(
        TRS,
        trust_root("lab", json!({"sigstoreKeys": ss.trusted_root()})),
    );
    let kubeconfig = kube.env()[0].1.clone();
    let show = |name: &str| {
        let mut cmd = std::process::Command::new(crate::support::sigil::bin());
        cmd.args(["trust-root", "show", name])
            .env_remove("KUBERNETES_SERVICE_HOST")
            .env("KUBECONFIG", &kubeconfig);
        crate::support::sigil::run_bounded(&mut cmd, None)
    };
    let out = show("corp");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("status (written by sigil): Ready True (Refreshed)"),
        "{text}"
    );
    assert!(text.contains("source: TUF file://"), "{text}");
    assert!(text.contains("transparency logs (2)"), "{text}");
    let out = show("lab");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("source: a trusted_root.json given as is"),
        "{text}"
    );
    let out = show("nope");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no TrustRoot named \"nope\""));
}
