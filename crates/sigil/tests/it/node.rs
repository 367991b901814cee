//! sigil as containerd's image verifier, against a real containerd (v2.3,
//! `SIGIL_CONTAINERD_ASSETS`, as root) pulling from the real test registry
//! images with real tar layers: `sigil-containerd` (a symlink to sigil, as
//! the node install places it) in containerd's `bin_dir`, configured by
//! containerd's environment. Pulls through `ctr` (the transfer service) and
//! through CRI `PullImage` (what a kubelet sends); a refusal carries sigil's
//! reason in containerd's error; `sigil node check` reads the same config.

use std::net::TcpListener;
use std::process::Output;
use std::time::{Duration, Instant};

use crate::support::containerd::{Containerd, assets_or_skip, push_tar_image, push_tar_index};
use crate::support::registry::{Mode, TestRegistry};
use crate::support::signing::{Layer, Signer, push_legacy, simple_signing};

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Signs `digest` of `repo` with `key` (a cosign signature beside it).
async fn sign(reg: &TestRegistry, repo: &str, digest: &str, key: &Signer) {
    let payload = simple_signing(&format!("{}/{repo}", reg.host()), digest);
    let sig = key.sign(&payload);
    push_legacy(reg, repo, digest, vec![Layer::new(payload, &sig)]).await;
}

fn policy(reg: &TestRegistry, dark: u16, key: &Signer) -> String {
    let h = reg.host();
    format!(
        "apiVersion: sigil.dev/v1alpha1\nkind: ImagePolicy\nmetadata: {{name: node}}\nspec:\n  registries: [{{host: \"{h}\", insecure: true}}, {{host: \"127.0.0.1:{dark}\", insecure: true}}]\n  mirrors:\n    - {{from: \"{h}/dark\", to: [\"127.0.0.1:{dark}/m\"]}}\n  rules:\n    - name: signed\n      match: [\"{h}/signed/**\", \"{h}/dark/**\"]\n      mode: enforce\n      verify:\n        - name: team\n          cosign: {{key: {key:?}}}\n    - {{name: banned, match: [\"{h}/banned/**\"], action: deny}}\n    - {{name: tools, match: [\"{h}/tools/**\"], mode: enforce}}\n",
        key = key.public_pem()
    )
}

/// containerd with sigil as its verifier (`sigil-containerd` in its
/// bin_dir), on `policy_file`, caching in `cache`, a 3 s lookup deadline.
fn verifying(
    assets: &std::path::Path,
    host: &str,
    policy_file: &std::path::Path,
    cache: &std::path::Path,
) -> Containerd {
    let c = Containerd::start(
        assets,
        host,
        &[
            ("SIGIL_NODE_POLICY", policy_file.display().to_string()),
            ("SIGIL_NODE_CACHE", cache.display().to_string()),
            ("SIGIL_NODE_TIMEOUT", "3s".to_owned()),
        ],
        "5s",
        "",
    );
    c.install_verifier(
        std::path::Path::new(crate::support::sigil::bin()),
        "sigil-containerd",
    );
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn containerd_pulls_what_the_policy_admits_and_refuses_the_rest_with_sigils_reason() {
    let Some(assets) = assets_or_skip(
        "containerd_pulls_what_the_policy_admits_and_refuses_the_rest_with_sigils_reason",
    ) else {
        return;
    };
    let reg = TestRegistry::start(Mode::Plain).await;
    let h = reg.host();
    let key = Signer::p256();
    let other = Signer::p256();
    // A registry that accepts connections and never answers.
    let dark = TcpListener::bind("127.0.0.1:0").unwrap();
    let dark_port = dark.local_addr().unwrap().port();

    let signed = push_tar_image(&reg, "signed/app", "1.0").await;
    sign(&reg, "signed/app", &signed, &key).await;
    push_tar_image(&reg, "signed/unsigned", "1.0").await;
    let wrong = push_tar_image(&reg, "signed/wrong", "1.0").await;
    sign(&reg, "signed/wrong", &wrong, &other).await;
    push_tar_image(&reg, "banned/app", "1.0").await;
    push_tar_image(&reg, "tools/app", "1.0").await;
    let (index, _) = push_tar_index(&reg, "signed/multi", "1.0").await;
    sign(&reg, "signed/multi", &index, &key).await;
    push_tar_image(&reg, "dark/app", "1.0").await;

    let files = tempfile::tempdir().unwrap();
    let policy_file = files.path().join("node-policy.yaml");
    std::fs::write(&policy_file, policy(&reg, dark_port, &key)).unwrap();
    let cache = files.path().join("cache");
    let c = verifying(&assets, &h, &policy_file, &cache);

    // Admitted: signed by the key, through ctr and through CRI; the index
    // of a multi-platform image (containerd passes the index's digest).
    for image in [
        format!("{h}/signed/app:1.0"),
        format!("{h}/signed/multi:1.0"),
    ] {
        let o = c.ctr_pull(&image);
        assert!(
            o.status.success(),
            "ctr {image}: {}\n{}",
            text(&o),
            c.logs()
        );
    }
    let o = c.cri_pull(&format!("{h}/signed/app:1.0"));
    assert!(o.status.success(), "CRI: {}\n{}", text(&o), c.logs());
    // Refused with sigil's reason in containerd's error.
    for (image, why) in [
        (format!("{h}/signed/unsigned:1.0"), "no signature"),
        (format!("{h}/signed/wrong:1.0"), "team"),
        (format!("{h}/banned/app:1.0"), "rule banned"),
        (format!("{h}/tools/app:1.0"), ""),
    ] {
        if why.is_empty() {
            let o = c.ctr_pull(&image);
            assert!(o.status.success(), "{image}: {}", text(&o));
            continue;
        }
        for (how, o) in [("ctr", c.ctr_pull(&image)), ("CRI", c.cri_pull(&image))] {
            let said = text(&o);
            assert!(!o.status.success(), "{how} {image} was pulled");
            for want in [
                "image verifier bindir blocked pull",
                "sigil refused",
                &image,
                why,
            ] {
                assert!(said.contains(want), "{how} {image}: {want:?} not in {said}");
            }
        }
    }
    // A registry that never answers: refused within sigil's deadline, with
    // the reason, before containerd's own timeout kills it.
    let t = Instant::now();
    let o = c.ctr_pull(&format!("{h}/dark/app:1.0"));
    let said = text(&o);
    assert!(!o.status.success(), "{said}");
    assert!(said.contains("sigil refused"), "{said}\n{}", c.logs());
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "took {:?}",
        t.elapsed()
    );
    drop(dark);

    // The cache: an admission is kept per policy and digest; two pulls at
    // once of a new image verify it once (the second waits for the first).
    let cached = std::fs::read_dir(&cache)
        .unwrap()
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "ok"))
        .count();
    assert!(cached >= 2, "admissions cached: {cached}");
    let twice = push_tar_image(&reg, "signed/twice", "1.0").await;
    sign(&reg, "signed/twice", &twice, &key).await;
    let image = format!("{h}/signed/twice:1.0");
    let (a, b) = std::thread::scope(|s| {
        let a = s.spawn(|| c.ctr_pull(&image));
        let b = s.spawn(|| c.cri_pull(&image));
        (a.join().unwrap(), b.join().unwrap())
    });
    assert!(
        a.status.success() && b.status.success(),
        "{}\n{}",
        text(&a),
        text(&b)
    );
    let logs = c.logs();
    assert_eq!(
        logs.matches(&format!("{image}@{twice} admitted (cached)"))
            .count(),
        1,
        "the second pull read the first one's answer: {logs}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_node_policy_pulls_are_refused_unless_told_and_node_check_reads_the_config() {
    let Some(assets) = assets_or_skip(
        "without_a_node_policy_pulls_are_refused_unless_told_and_node_check_reads_the_config",
    ) else {
        return;
    };
    let reg = TestRegistry::start(Mode::Plain).await;
    let h = reg.host();
    push_tar_image(&reg, "any/app", "1.0").await;
    let missing = tempfile::tempdir().unwrap();
    let path = missing.path().join("absent.yaml").display().to_string();
    for (mode, pulled) in [("deny", false), ("allow", true)] {
        let c = Containerd::start(
            &assets,
            &h,
            &[
                ("SIGIL_NODE_POLICY", path.clone()),
                ("SIGIL_NODE_ON_MISSING_POLICY", mode.to_owned()),
            ],
            "5s",
            "",
        );
        c.install_verifier(
            std::path::Path::new(crate::support::sigil::bin()),
            "sigil-containerd",
        );
        let o = c.ctr_pull(&format!("{h}/any/app:1.0"));
        assert_eq!(o.status.success(), pulled, "{mode}: {}", text(&o));
        if !pulled {
            assert!(text(&o).contains("no node policy at"), "{}", text(&o));
        }
        // `sigil node check` on this containerd's own config: containerd
        // calls sigil, and the check says what sigil will answer there
        // without a policy (it said "ok").
        let check = std::process::Command::new(crate::support::sigil::bin())
            .args(["node", "check", "--config"])
            .arg(&c.config)
            .output()
            .unwrap();
        let said = text(&check);
        assert_eq!(check.status.code(), Some(1), "{said}");
        let answer = if pulled {
            "every pull is allowed unverified"
        } else {
            "every pull is refused"
        };
        assert!(said.contains(answer), "{said}");
        assert!(
            !said.contains("sigil-containerd is not in bin_dir"),
            "{said}"
        );
    }
    // A config that silently turns CRI pulls into local pulls: CRI pulls
    // bypass the verifier, and `sigil node check` says so.
    let c = Containerd::start(
        &assets,
        &h,
        &[("SIGIL_NODE_POLICY", path.clone())],
        "5s",
        "  max_concurrent_downloads = 5",
    );
    c.install_verifier(
        std::path::Path::new(crate::support::sigil::bin()),
        "sigil-containerd",
    );
    let o = c.cri_pull(&format!("{h}/any/app:1.0"));
    let check = std::process::Command::new(crate::support::sigil::bin())
        .args(["node", "check", "--config"])
        .arg(&c.config)
        .output()
        .unwrap();
    assert_eq!(check.status.code(), Some(1), "{}", text(&check));
    assert!(
        text(&check).contains("max_concurrent_downloads = 5"),
        "{}",
        text(&check)
    );
    // What the check warns of is real: the verifier (which refuses every
    // pull: there is no policy) is not called on the CRI pull.
    assert!(o.status.success(), "{}", text(&o));
    assert!(c.logs().contains("local image pull"), "{}", c.logs());
}

/// Credentials as the kubelet has them: the verifier reads a private
/// registry's signatures with the node's docker config
/// (`SIGIL_DOCKER_CONFIG` in containerd's environment) and, without it, is
/// refused by the registry and says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_verifier_reads_a_private_registry_with_the_nodes_docker_config() {
    let Some(assets) =
        assets_or_skip("the_verifier_reads_a_private_registry_with_the_nodes_docker_config")
    else {
        return;
    };
    let (user, password) = ("node", "s3cret");
    let reg = TestRegistry::start(Mode::Htpasswd { user, password }).await;
    let h = reg.host();
    let key = Signer::p256();
    let d = push_tar_image(&reg, "signed/app", "1.0").await;
    sign(&reg, "signed/app", &d, &key).await;
    let files = tempfile::tempdir().unwrap();
    let policy_file = files.path().join("node-policy.yaml");
    std::fs::write(&policy_file, policy(&reg, 9, &key)).unwrap();
    let config = files.path().join("config.json");
    use base64::Engine as _;
    let auth = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
    std::fs::write(
        &config,
        format!("{{\"auths\": {{\"{h}\": {{\"auth\": \"{auth}\"}}}}}}"),
    )
    .unwrap();
    let image = format!("{h}/signed/app:1.0");
    for (with_config, pulled) in [(true, true), (false, false)] {
        let mut env = vec![("SIGIL_NODE_POLICY", policy_file.display().to_string())];
        if with_config {
            env.push(("SIGIL_DOCKER_CONFIG", config.display().to_string()));
        }
        let c = Containerd::start(&assets, &h, &env, "5s", "");
        c.install_verifier(
            std::path::Path::new(crate::support::sigil::bin()),
            "sigil-containerd",
        );
        let o = c.ctr_pull_as(&image, &format!("{user}:{password}"));
        assert_eq!(
            o.status.success(),
            pulled,
            "config {with_config}: {}",
            text(&o)
        );
        if !pulled {
            let said = text(&o);
            assert!(said.contains("sigil refused"), "{said}");
            assert!(
                said.contains("401")
                    || said.to_lowercase().contains("unauthorized")
                    || said.contains("credentials"),
                "{said}"
            );
        }
    }
}

/// An admission cached for one name never stands for another: the same
/// bytes pulled as `tools/app` (a rule without signatures) and then as
/// `signed/copy` (a rule that requires one; the copy is unsigned) — the
/// second pull is decided again and refused. The cache was keyed by
/// (policy, digest) and admitted it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regression_the_same_bytes_under_another_name_are_decided_again_at_the_node() {
    let Some(assets) = assets_or_skip(
        "regression_the_same_bytes_under_another_name_are_decided_again_at_the_node",
    ) else {
        return;
    };
    let reg = TestRegistry::start(Mode::Plain).await;
    let h = reg.host();
    let key = Signer::p256();
    let dark = TcpListener::bind("127.0.0.1:0").unwrap();
    let digest = push_tar_image(&reg, "tools/app", "1.0").await;
    // The same manifest and blobs under a name whose rule wants a signature.
    let manifest = reqwest::Client::new()
        .get(format!("{}/v2/tools/app/manifests/{digest}", reg.base()))
        .header("accept", "application/vnd.oci.image.manifest.v1+json")
        .send()
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    assert_eq!(
        reg.push_exact("signed/copy", "1.0", &manifest).await,
        digest
    );

    let files = tempfile::tempdir().unwrap();
    let policy_file = files.path().join("node-policy.yaml");
    std::fs::write(
        &policy_file,
        policy(&reg, dark.local_addr().unwrap().port(), &key),
    )
    .unwrap();
    let c = verifying(&assets, &h, &policy_file, &files.path().join("cache"));
    let o = c.ctr_pull(&format!("{h}/tools/app:1.0"));
    assert!(o.status.success(), "{}\n{}", text(&o), c.logs());
    let copy = format!("{h}/signed/copy:1.0");
    let o = c.ctr_pull(&copy);
    let said = text(&o);
    assert!(
        !o.status.success(),
        "the unsigned copy was pulled:\n{}",
        c.logs()
    );
    assert!(
        said.contains("sigil refused") && said.contains("no signature"),
        "{said}"
    );
    assert!(
        !c.logs()
            .contains(&format!("{copy}@{digest} admitted (cached)")),
        "{}",
        c.logs()
    );
}

/// A node policy that is there but cannot be used is not "missing": too
/// large, not a regular file or unreadable, every pull is refused with the
/// reason, even under `SIGIL_NODE_ON_MISSING_POLICY=allow` (which admitted
/// every pull, denied images included). Only a file that does not exist
/// is missing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regression_an_oversize_or_unreadable_node_policy_refuses_even_when_a_missing_one_is_allowed()
 {
    let Some(assets) = assets_or_skip(
        "regression_an_oversize_or_unreadable_node_policy_refuses_even_when_a_missing_one_is_allowed",
    ) else {
        return;
    };
    let reg = TestRegistry::start(Mode::Plain).await;
    let h = reg.host();
    push_tar_image(&reg, "banned/app", "1.0").await;
    let files = tempfile::tempdir().unwrap();
    let big = files.path().join("big.yaml");
    std::fs::File::create(&big)
        .unwrap()
        .set_len(17 << 20)
        .unwrap();
    let dir = files.path().join("a-directory");
    std::fs::create_dir(&dir).unwrap();
    for (path, why) in [(&big, "larger than"), (&dir, "not a regular file")] {
        let c = Containerd::start(
            &assets,
            &h,
            &[
                ("SIGIL_NODE_POLICY", path.display().to_string()),
                ("SIGIL_NODE_ON_MISSING_POLICY", "allow".to_owned()),
            ],
            "5s",
            "",
        );
        c.install_verifier(
            std::path::Path::new(crate::support::sigil::bin()),
            "sigil-containerd",
        );
        let o = c.ctr_pull(&format!("{h}/banned/app:1.0"));
        let said = text(&o);
        assert!(!o.status.success(), "{why}: pulled\n{}", c.logs());
        assert!(
            said.contains("cannot be read") && said.contains(why),
            "{said}"
        );
    }
}

/// A node has no namespace, so `exemptNamespaces: [kube-system]` cannot
/// admit what a node pulls for itself: a policy that requires signatures
/// everywhere refused containerd's own sandbox image while `sigil node
/// check` said ok. The check now decides the sandbox image (from
/// containerd's config) and each `--image` as the verifier would, reading
/// the policy containerd's running environment names, and fails; the
/// policy's `nodeAdmits` admits them at pull.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regression_node_check_fails_when_the_node_policy_refuses_the_sandbox_image() {
    let Some(assets) = assets_or_skip(
        "regression_node_check_fails_when_the_node_policy_refuses_the_sandbox_image",
    ) else {
        return;
    };
    let reg = TestRegistry::start(Mode::Plain).await;
    let h = reg.host();
    let key = Signer::p256();
    push_tar_image(&reg, "k8s/pause", "3.10").await;
    push_tar_image(&reg, "k8s/kube-proxy", "1.36").await;
    let files = tempfile::tempdir().unwrap();
    let policy_file = files.path().join("node-policy.yaml");
    let signed_everywhere = format!(
        "apiVersion: sigil.dev/v1alpha1\nkind: ImagePolicy\nmetadata: {{name: node}}\nspec:\n  registries: [{{host: \"{h}\", insecure: true}}]\n  exemptNamespaces: [kube-system]\n  rules:\n    - name: signed\n      match: [\"{h}/**\"]\n      verify: [{{name: team, cosign: {{key: {k:?}}}}}]\n",
        k = key.public_pem()
    );
    std::fs::write(&policy_file, &signed_everywhere).unwrap();
    let c = Containerd::start(
        &assets,
        &h,
        &[
            ("SIGIL_NODE_POLICY", policy_file.display().to_string()),
            ("SIGIL_NODE_TIMEOUT", "3s".to_owned()),
        ],
        "5s",
        &format!(
            "  [plugins.\"io.containerd.cri.v1.images\".pinned_images]\n    sandbox = \"{h}/k8s/pause:3.10\""
        ),
    );
    c.install_verifier(
        std::path::Path::new(crate::support::sigil::bin()),
        "sigil-containerd",
    );
    let check = |extra: &[&str]| {
        // Run from a shell without the verifier's variables: the check
        // reads them from the running containerd.
        std::process::Command::new(crate::support::sigil::bin())
            .args(["node", "check", "--config"])
            .arg(&c.config)
            .args(extra)
            .env_remove("SIGIL_NODE_POLICY")
            .output()
            .unwrap()
    };
    let proxy = format!("{h}/k8s/kube-proxy:1.36");
    let o = check(&["--image", &proxy]);
    let said = text(&o);
    assert_eq!(o.status.code(), Some(1), "{said}");
    assert!(said.contains("containerd (pid"), "{said}");
    assert!(
        said.contains(&format!(
            "{h}/k8s/pause:3.10, which this node pulls for itself, would be refused"
        )),
        "{said}"
    );
    assert!(
        said.contains(&format!("{proxy}, which this node pulls")),
        "{said}"
    );
    assert!(!c.cri_pull(&format!("{h}/k8s/pause:3.10")).status.success());

    // The platform lists what nodes pull for themselves.
    std::fs::write(
        &policy_file,
        signed_everywhere.replace(
            "  exemptNamespaces: [kube-system]\n",
            &format!("  exemptNamespaces: [kube-system]\n  nodeAdmits: [\"{h}/k8s/pause\", \"{h}/k8s/kube-proxy\"]\n"),
        ),
    )
    .unwrap();
    let o = check(&["--image", &proxy]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("nodeAdmits ["), "{}", text(&o));
    let o = c.cri_pull(&format!("{h}/k8s/pause:3.10"));
    assert!(o.status.success(), "{}\n{}", text(&o), c.logs());
    assert!(c.logs().contains("admitted by nodeAdmits"), "{}", c.logs());
    // Everything else is still checked.
    push_tar_image(&reg, "team/app", "1.0").await;
    assert!(!c.ctr_pull(&format!("{h}/team/app:1.0")).status.success());
}

/// containerd refuses every pull whose verifier fails to start, and the
/// verifier runs with the host's libraries: the build linked against
/// Debian 12's glibc (2.36) does not start on Amazon Linux 2023, RHEL 9,
/// Ubuntu 22.04 or Debian 11. What the DaemonSet copies onto hosts is the
/// static build (`scripts/dist.sh --static`; here the musl build
/// `SIGIL_STATIC_BIN` that scripts/test.sh makes): it names no loader,
/// runs in a root that holds nothing but itself, and decides pulls under a
/// real containerd.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regression_the_node_verifier_runs_on_a_host_without_glibc() {
    let Some(assets) = assets_or_skip("regression_the_node_verifier_runs_on_a_host_without_glibc")
    else {
        return;
    };
    let Some(static_bin) = crate::support::sigil::static_bin() else {
        eprintln!(
            "regression_the_node_verifier_runs_on_a_host_without_glibc: skipped (SIGIL_STATIC_BIN is not set: scripts/test.sh builds sigil for musl)"
        );
        return;
    };
    let bytes = std::fs::read(&static_bin).unwrap();
    assert_eq!(sigil::node::sync::interpreter(&bytes), None, "not static");
    // A root with nothing but the binary: no libc, no loader, no /etc.
    let bare = tempfile::tempdir().unwrap();
    std::fs::write(bare.path().join("sigil"), &bytes).unwrap();
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(
        bare.path().join("sigil"),
        std::fs::Permissions::from_mode(0o755),
    )
    .unwrap();
    let o = std::process::Command::new("chroot")
        .arg(bare.path())
        .args(["/sigil", "node", "verify"])
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("did not pass -name"),
        "{}",
        text(&o)
    );
    // As containerd's verifier.
    let reg = TestRegistry::start(Mode::Plain).await;
    let h = reg.host();
    let key = Signer::p256();
    let signed = push_tar_image(&reg, "signed/app", "1.0").await;
    sign(&reg, "signed/app", &signed, &key).await;
    push_tar_image(&reg, "signed/unsigned", "1.0").await;
    let files = tempfile::tempdir().unwrap();
    let policy_file = files.path().join("node-policy.yaml");
    std::fs::write(&policy_file, policy(&reg, 9, &key)).unwrap();
    let c = Containerd::start(
        &assets,
        &h,
        &[("SIGIL_NODE_POLICY", policy_file.display().to_string())],
        "10s",
        "",
    );
    c.install_verifier(std::path::Path::new(&static_bin), "sigil-containerd");
    let o = c.ctr_pull(&format!("{h}/signed/app:1.0"));
    assert!(o.status.success(), "{}\n{}", text(&o), c.logs());
    let o = c.ctr_pull(&format!("{h}/signed/unsigned:1.0"));
    assert!(!o.status.success());
    assert!(text(&o).contains("no signature"), "{}", text(&o));
}
