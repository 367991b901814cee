//! `sigil pin` and `sigil krm` end to end: the real registry, the real kpt,
//! golden files for byte-exact `--write`, and equivalence with the webhook.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use serde_json::{Value, json};
use sigil_core::manifest::parse_stream;
use sigil_core::walker::image_fields;

use crate::support::registry::{Mode, TestRegistry};
use crate::support::sigil::{Sigil, bin, run_bounded as run, run_sigil as sigil};
use crate::support::{fixture, fixtures_dir};

const PLACEHOLDER_HOST: &str = "registry.test:5000";

/// A registry holding the corpus' images, and the corpus copied beside a policy.
struct Corpus {
    _reg: TestRegistry,
    host: String,
    /// name (`app`, `db`, ...) → hex digest.
    digests: BTreeMap<&'static str, String>,
    dir: tempfile::TempDir,
}

impl Corpus {
    async fn start() -> Corpus {
        let reg = TestRegistry::start(Mode::Plain).await;
        let host = reg.host();
        let mut digests = BTreeMap::new();
        for (name, tag) in [
            ("app", "v1"),
            ("db", "15"),
            ("sidecar", "2"),
            ("tool", "latest"),
        ] {
            let d = reg.push_image(&format!("team/{name}"), tag).await;
            digests.insert(name, d.trim_start_matches("sha256:").to_owned());
        }
        let dir = tempfile::tempdir().unwrap();
        let c = Corpus {
            _reg: reg,
            host,
            digests,
            dir,
        };
        std::fs::create_dir(c.tree()).unwrap();
        for e in std::fs::read_dir(pin_fixtures().join("in")).unwrap() {
            let p = e.unwrap().path();
            let text = std::fs::read_to_string(&p).unwrap();
            std::fs::write(c.tree().join(p.file_name().unwrap()), c.subst(&text)).unwrap();
        }
        std::fs::write(c.policy(), c.policy_text("")).unwrap();
        c
    }

    fn tree(&self) -> PathBuf {
        self.dir.path().join("manifests")
    }

    fn policy(&self) -> PathBuf {
        self.dir.path().join("policy.yaml")
    }

    /// A policy that denies `team/db` and pins the rest.
    fn deny_db_policy(&self) -> PathBuf {
        let path = self.dir.path().join("deny.yaml");
        let rule = format!(
            "    - {{name: no-db, match: [\"{}/team/db\"], action: deny}}\n",
            self.host
        );
        std::fs::write(&path, self.policy_text(&rule)).unwrap();
        path
    }

    fn policy_text(&self, extra_rules: &str) -> String {
        format!(
            "apiVersion: sigil.dev/v1alpha1\nkind: ImagePolicy\nmetadata: {{name: pin-test}}\nspec:\n  registries:\n    - {{host: \"{}\", insecure: true}}\n  rules:\n{extra_rules}    - {{name: all, match: [\"**\"], mode: enforce}}\n",
            self.host
        )
    }

    /// Puts the real registry host and digests into fixture text.
    fn subst(&self, text: &str) -> String {
        let mut s = text.replace(PLACEHOLDER_HOST, &self.host);
        for (name, d) in &self.digests {
            s = s.replace(&format!("${{{name}}}"), d);
        }
        s
    }

    /// The inverse of [`Corpus::subst`], for blessing golden files.
    fn unsubst(&self, text: &str) -> String {
        let mut s = text.replace(&self.host, PLACEHOLDER_HOST);
        for (name, d) in &self.digests {
            s = s.replace(d.as_str(), &format!("${{{name}}}"));
        }
        s
    }

    fn golden(&self, file: &str) -> String {
        self.subst(&std::fs::read_to_string(pin_fixtures().join("golden").join(file)).unwrap())
    }
}

fn pin_fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/pin")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn snapshot(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    let mut m = BTreeMap::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_file() {
            m.insert(
                p.file_name().unwrap().to_string_lossy().into_owned(),
                std::fs::read(&p).unwrap(),
            );
        }
    }
    m
}

/// Every document with its image values blanked: equal before and after
/// means nothing but image values changed.
fn without_images(text: &str) -> Vec<Value> {
    parse_stream(text)
        .unwrap()
        .into_iter()
        .map(|d| {
            let mut v = d.to_value();
            let mut objs: Vec<String> = vec![String::new()];
            if v["kind"].as_str().is_some_and(|k| k.ends_with("List")) {
                objs = (0..v["items"].as_array().map_or(0, Vec::len))
                    .map(|i| format!("/items/{i}"))
                    .collect();
            }
            for o in objs {
                let fields = image_fields(v.pointer(&o).unwrap_or(&Value::Null));
                for f in fields {
                    *v.pointer_mut(&format!("{o}{}", f.pointer)).unwrap() = json!("<image>");
                }
            }
            v
        })
        .collect()
}

#[tokio::test]
async fn pin_write_matches_golden_files_and_changes_only_image_values() {
    let c = Corpus::start().await;
    let before = snapshot(&c.tree());
    let out = sigil(
        &[
            "pin",
            "--policy",
            c.policy().to_str().unwrap(),
            "--write",
            c.tree().to_str().unwrap(),
        ],
        None,
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    let report = text(&out.stdout);
    assert!(
        report.contains("values.yaml: note: line 2: not a Kubernetes object"),
        "{report}"
    );
    assert!(
        report.contains("4 registry lookup(s)"),
        "one lookup per unique reference: {report}"
    );
    let after = snapshot(&c.tree());
    if std::env::var_os("SIGIL_BLESS").is_some() {
        for (name, new) in &after {
            let golden = pin_fixtures().join("golden").join(name);
            std::fs::write(golden, c.unsubst(&text(new))).unwrap();
        }
    }
    for (name, old) in &before {
        let new = &after[name];
        assert_eq!(
            text(new),
            c.golden(name),
            "{name} differs from its golden file"
        );
        assert_eq!(
            without_images(&text(old)),
            without_images(&text(new)),
            "{name}: something besides image values changed"
        );
    }
    assert_eq!(
        after["batch-crlf.yaml"]
            .iter()
            .filter(|b| **b == b'\n')
            .count(),
        after["batch-crlf.yaml"]
            .windows(2)
            .filter(|w| w == b"\r\n")
            .count(),
        "CRLF line endings kept"
    );
    // Pinned output is final: a second run changes nothing.
    let again = sigil(
        &[
            "pin",
            "--policy",
            c.policy().to_str().unwrap(),
            "--check",
            c.tree().to_str().unwrap(),
        ],
        None,
    );
    assert_eq!(again.status.code(), Some(0), "{}", text(&again.stdout));
    assert_eq!(snapshot(&c.tree()), after);
}

#[tokio::test]
async fn check_lists_every_unpinned_image_with_file_and_line_and_changes_nothing() {
    let c = Corpus::start().await;
    let before = snapshot(&c.tree());
    let out = sigil(
        &[
            "pin",
            "--policy",
            c.policy().to_str().unwrap(),
            "--check",
            c.tree().to_str().unwrap(),
        ],
        None,
    );
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    let report = text(&out.stdout);
    let web = c.tree().join("web.yaml").display().to_string();
    assert!(
        report.contains(&format!("{web}:25:18: not pinned: Deployment shop/web init container \"migrate\": {}/team/db:15 -> {}/team/db:15@sha256:{}", c.host, c.host, c.digests["db"])),
        "{report}"
    );
    assert!(
        report.contains(&format!("{web}:34:21: not pinned")),
        "{report}"
    );
    assert!(
        report.contains("sigil pin --check: 10 image(s) not final"),
        "{report}"
    );
    assert_eq!(snapshot(&c.tree()), before, "--check must not write");
}

#[tokio::test]
async fn stdout_and_stdin_modes_print_the_pinned_stream() {
    let c = Corpus::start().await;
    let policy = c.policy();
    let file = c.tree().join("web.yaml");
    let out = sigil(
        &[
            "pin",
            "--policy",
            policy.to_str().unwrap(),
            file.to_str().unwrap(),
        ],
        None,
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), c.golden("web.yaml"));
    let input = std::fs::read_to_string(&file).unwrap();
    let out = sigil(
        &["pin", "--policy", policy.to_str().unwrap(), "-"],
        Some(&input),
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), c.golden("web.yaml"));
    assert!(
        text(&out.stderr).contains("3 pinned"),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(
        std::fs::read_to_string(&file).unwrap(),
        input,
        "stdout mode never writes"
    );
}

#[tokio::test]
async fn offline_rewrites_mirrors_reports_lookups_and_makes_no_requests() {
    let c = Corpus::start().await;
    let policy = format!(
        "apiVersion: sigil.dev/v1alpha1\nkind: ImagePolicy\nspec:\n  mirrors: [{{from: docker.io, to: \"{}/hub\"}}]\n  rules:\n    - {{name: all, match: [\"**\"], mode: enforce}}\n",
        c.host
    );
    let p = c.dir.path().join("mirror.yaml");
    std::fs::write(&p, policy).unwrap();
    let input = "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec:\n  containers:\n  - name: a\n    image: nginx:1.27 # from Docker Hub\n";
    let out = sigil(
        &[
            "pin",
            "--policy",
            p.to_str().unwrap(),
            "--offline",
            "--output",
            "json",
            "-",
        ],
        Some(input),
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(
        text(&out.stdout),
        input.replace("nginx:1.27", &format!("{}/hub/library/nginx:1.27", c.host))
    );
    let report: Value = serde_json::from_slice(&out.stderr).expect("JSON report on stderr");
    assert_eq!(report["registryRequests"], 0);
    assert_eq!(report["needsRegistry"], 1);
    assert_eq!(report["files"][0]["images"][0]["status"], "needs-registry");
    assert_eq!(report["files"][0]["images"][0]["line"], 7);
    let check = sigil(
        &[
            "pin",
            "--policy",
            p.to_str().unwrap(),
            "--offline",
            "--check",
            "-",
        ],
        Some(input),
    );
    assert_eq!(check.status.code(), Some(1));
    assert!(
        text(&check.stdout).contains("<stdin>:7:12: needs registry"),
        "{}",
        text(&check.stdout)
    );
}

#[tokio::test]
async fn a_thousand_manifests_sharing_four_images_make_four_registry_requests() {
    let c = Corpus::start().await;
    let many = c.dir.path().join("many");
    for i in 0..1000 {
        let sub = many.join(format!("team-{}", i % 10));
        std::fs::create_dir_all(&sub).unwrap();
        let img = ["app:v1", "db:15", "sidecar:2", "tool"][i % 4];
        std::fs::write(
            sub.join(format!("d{i}.yaml")),
            format!("apiVersion: apps/v1\nkind: Deployment\nmetadata: {{name: d{i}}}\nspec:\n  template:\n    spec:\n      containers:\n      - name: c\n        image: {}/team/{img}\n", c.host),
        )
        .unwrap();
    }
    let out = sigil(
        &[
            "pin",
            "--policy",
            c.policy().to_str().unwrap(),
            "-w",
            "--output",
            "json",
            many.to_str().unwrap(),
        ],
        None,
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["files"].as_array().unwrap().len(), 1000);
    assert_eq!(report["pinned"], 1000);
    assert_eq!(report["written"], 1000);
    assert_eq!(
        report["registryRequests"], 4,
        "single-flight + cache across files"
    );
}

#[tokio::test]
async fn bad_input_exits_2_and_writes_nothing() {
    let c = Corpus::start().await;
    std::fs::write(
        c.tree().join("zz-broken.yaml"),
        "apiVersion: v1\nkind: Pod\nspec: [unclosed\n",
    )
    .unwrap();
    let before = snapshot(&c.tree());
    let out = sigil(
        &[
            "pin",
            "--policy",
            c.policy().to_str().unwrap(),
            "--write",
            c.tree().to_str().unwrap(),
        ],
        None,
    );
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stdout));
    assert!(
        text(&out.stdout).contains("zz-broken.yaml: error: invalid YAML"),
        "{}",
        text(&out.stdout)
    );
    assert_eq!(
        snapshot(&c.tree()),
        before,
        "nothing written when any file is bad"
    );
    // Usage errors and unreadable paths are exit 2 too.
    let missing = sigil(&["pin", "/nonexistent/sigil-pin-test"], None);
    assert_eq!(missing.status.code(), Some(2));
    assert!(text(&missing.stderr).contains("/nonexistent/sigil-pin-test"));
    let stdin_write = sigil(&["pin", "-w", "-"], Some("a: 1\n"));
    assert_eq!(stdin_write.status.code(), Some(2));
}

#[tokio::test]
async fn denied_images_exit_1_and_say_what_why_and_how_to_fix() {
    let c = Corpus::start().await;
    let deny = c.deny_db_policy();
    let file = c.tree().join("web.yaml");
    let out = sigil(
        &[
            "pin",
            "--policy",
            deny.to_str().unwrap(),
            file.to_str().unwrap(),
        ],
        None,
    );
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(err.contains(":25:18: denied: image"), "{err}");
    assert!(
        err.contains("is denied by rule \"no-db\"; to fix:"),
        "{err}"
    );
    // The rest is still pinned.
    assert!(text(&out.stdout).contains(&format!("team/app:v1@sha256:{}", c.digests["app"])));
}

/// The verdict labels of admission number `seen` (0-based) in the server's
/// log, by field, once `total` admissions are logged (a patched object is
/// admitted twice: the API server reinvokes the webhook).
async fn logged_verdicts(server: &Sigil, seen: usize, total: usize) -> BTreeMap<String, String> {
    let until = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        let lines: Vec<Value> = server
            .logs()
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|l| l["message"] == "admission")
            .collect();
        if lines.len() >= total {
            return lines[seen]["images"]
                .as_str()
                .unwrap_or_default()
                .split("; ")
                .filter(|e| !e.is_empty())
                .map(|e| {
                    // `field verdict: image[ -> new]`
                    let (head, _) = e.split_once(": ").unwrap();
                    let (field, verdict) = head.split_once(' ').unwrap();
                    (field.to_owned(), verdict.to_owned())
                })
                .collect();
        }
        assert!(std::time::Instant::now() < until, "no admission log line");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The connaisseur fixtures give the same objects and the same per-field
/// verdicts through the webhook and through `sigil pin` — with images that
/// pin, a static deny and an image that does not exist — and the same
/// verdicts through `sigil audit` when they run in a cluster.
// `sigil pin` and `sigil audit` run as blocking children while the stand-in serves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhook_and_pin_give_identical_objects_and_verdicts_for_every_fixture() {
    let c = Corpus::start().await;
    let kube = crate::support::kube::FakeKube::start().await;
    // (namespace, kind, name) of each object put in the cluster, and the
    // webhook's verdict per field.
    type Running = ((String, String, String), BTreeMap<String, String>);
    let mut in_cluster: Vec<Running> = Vec::new();
    let policy_path = c.deny_db_policy();
    let policy = std::fs::read_to_string(&policy_path).unwrap();
    let server = Sigil::start(Some(&policy), &[]).await;
    let api = server.apiserver();
    let names: Vec<String> = std::fs::read_dir(fixtures_dir())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".json"))
        .collect();
    let allowed = ["team/app:v1", "team/sidecar:2", "team/tool"];
    let mixed = ["team/db:15", "team/app:v1", "team/missing:1", "team/tool"];
    let (mut compared, mut denied, mut logged) = (0, 0, 0);
    for name in names {
        let original = fixture(&name);
        let Some(obj) = original
            .pointer("/request/object")
            .filter(|o| o.is_object())
        else {
            continue;
        };
        let fields = image_fields(obj);
        if fields.is_empty() || original["request"]["operation"] != "CREATE" {
            continue;
        }
        let namespace = original["request"]["namespace"]
            .as_str()
            .unwrap_or("default")
            .to_owned();
        for images in [&allowed[..], &mixed[..]] {
            let mut rev = original.clone();
            let obj = rev.pointer_mut("/request/object").unwrap();
            for (i, f) in fields.iter().enumerate() {
                let img = images[i % images.len()];
                *obj.pointer_mut(&f.pointer).unwrap() = json!(format!("{}/{img}", c.host));
            }
            let admitted = api.admit(&rev, Duration::from_secs(10)).await;
            let total = logged + 1 + usize::from(admitted.reinvoked.is_some());
            let webhook_verdicts = logged_verdicts(&server, logged, total).await;
            logged = total;
            let yaml = serde_saphyr::to_string(&rev["request"]["object"]).unwrap();
            let out = sigil(
                &[
                    "pin",
                    "--policy",
                    policy_path.to_str().unwrap(),
                    "--namespace",
                    &namespace,
                    "--output",
                    "json",
                    "-",
                ],
                Some(&yaml),
            );
            // The pinned stream goes to stdout, the JSON report to stderr.
            let report: Value = serde_json::from_slice(&out.stderr)
                .unwrap_or_else(|e| panic!("{name}: {e}: {}", text(&out.stderr)));
            let pin_verdicts: BTreeMap<String, String> = report["files"][0]["images"]
                .as_array()
                .unwrap()
                .iter()
                .map(|i| {
                    let field = i["field"].as_str().unwrap().to_owned();
                    (field, i["verdict"].as_str().unwrap().to_owned())
                })
                .collect();
            assert_eq!(
                pin_verdicts, webhook_verdicts,
                "{name}: webhook and pin disagree on verdicts"
            );
            assert_eq!(pin_verdicts.len(), fields.len(), "{name}");
            // The same object, running in the cluster, for the audit.
            let kind = rev["request"]["object"]["kind"]
                .as_str()
                .unwrap_or_default();
            if let Some(k) = sigil_kube::audit::kinds::ALL
                .iter()
                .find(|k| k.kind == kind)
            {
                let n = format!("fixture-{}", in_cluster.len());
                let mut o = rev["request"]["object"].clone();
                o["metadata"]["name"] = json!(n);
                o["metadata"]["namespace"] = json!(namespace);
                let base = if k.group.is_empty() {
                    "/api/v1".to_owned()
                } else {
                    format!("/apis/{}/{}", k.group, k.version)
                };
                kube.insert(&format!("{base}/namespaces/{namespace}/{}", k.plural), o);
                in_cluster.push((
                    (namespace.clone(), kind.to_owned(), n),
                    webhook_verdicts.clone(),
                ));
            }
            if admitted.allowed {
                assert_eq!(out.status.code(), Some(0), "{name}: {}", text(&out.stderr));
                let pinned = parse_stream(&text(&out.stdout))
                    .unwrap()
                    .remove(0)
                    .to_value();
                assert_eq!(pinned, admitted.object, "{name}: webhook and pin disagree");
                compared += 1;
            } else {
                assert_eq!(out.status.code(), Some(1), "{name}: {}", text(&out.stderr));
                assert!(pin_verdicts.values().any(|v| v.starts_with("denied:")));
                denied += 1;
            }
        }
    }
    assert!(compared >= 15, "only {compared} fixtures compared");
    assert!(denied >= 15, "only {denied} denials compared");

    // sigil audit over all of them: the webhook's verdict for every field.
    let out = crate::support::sigil::audit_command(&policy_path, &kube.kubeconfig)
        .output()
        .unwrap();
    let report: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", text(&out.stderr)));
    assert!(
        in_cluster.len() >= 20,
        "only {} fixtures audited",
        in_cluster.len()
    );
    for ((ns, kind, name), webhook) in &in_cluster {
        let o = report["objects"]
            .as_array()
            .unwrap()
            .iter()
            .find(|o| o["namespace"] == *ns && o["kind"] == *kind && o["name"] == *name)
            .unwrap_or_else(|| panic!("{ns}/{kind}/{name} not audited: {}", report["errors"]));
        let audit: BTreeMap<String, String> = o["fields"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| {
                (
                    f["field"].as_str().unwrap().to_owned(),
                    f["verdict"].as_str().unwrap().to_owned(),
                )
            })
            .collect();
        assert_eq!(
            &audit, webhook,
            "{ns}/{kind}/{name}: audit and webhook disagree"
        );
    }
}

/// Regression: `sigil pin` decided exemptions from `metadata.namespace`
/// while the webhook used the request's namespace. Both now use one rule:
/// the request's namespace, else `metadata.namespace`, else `--namespace`
/// (default `default`, as kubectl applies it).
#[tokio::test]
async fn pin_exemption_follows_the_one_namespace_rule() {
    let c = Corpus::start().await;
    let policy = c.dir.path().join("exempt.yaml");
    std::fs::write(
        &policy,
        c.policy_text("").replace(
            "spec:\n",
            "spec:\n  exemptNamespaces: [default, kube-system]\n",
        ),
    )
    .unwrap();
    let manifest = |ns: &str| {
        let meta = if ns.is_empty() {
            "{name: p}".to_owned()
        } else {
            format!("{{name: p, namespace: {ns}}}")
        };
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {meta}\nspec:\n  containers:\n  - {{name: a, image: {}/team/app:v1}}\n",
            c.host
        )
    };
    let pin = |ns_flag: Option<&str>, text: &str| {
        let mut args = vec!["pin", "--check", "--policy", policy.to_str().unwrap()];
        if let Some(ns) = ns_flag {
            args.extend(["--namespace", ns]);
        }
        args.push("-");
        sigil(&args, Some(text))
    };
    // No metadata.namespace: kubectl would apply it to `default`, which is exempt.
    let out = pin(None, &manifest(""));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stdout));
    assert!(
        text(&out.stdout).contains("exempt"),
        "{}",
        text(&out.stdout)
    );
    // The same object applied to another namespace is checked.
    assert_eq!(pin(Some("shop"), &manifest("")).status.code(), Some(1));
    // metadata.namespace wins over the flag, as it does for kubectl.
    assert_eq!(
        pin(Some("shop"), &manifest("kube-system")).status.code(),
        Some(0)
    );
    assert_eq!(pin(None, &manifest("shop")).status.code(), Some(1));
}

fn kpt() -> PathBuf {
    for p in [
        "/usr/lib/google-cloud-sdk/bin/kpt",
        "/usr/bin/kpt",
        "/usr/local/bin/kpt",
    ] {
        if Path::new(p).exists() {
            return PathBuf::from(p);
        }
    }
    panic!("kpt is required for the KRM function tests (package google-cloud-cli-kpt)");
}

/// A kpt package of the corpus' Kubernetes files (kpt refuses non-KRM YAML).
fn kpt_package(c: &Corpus) -> PathBuf {
    let pkg = c.dir.path().join("pkg");
    std::fs::create_dir(&pkg).unwrap();
    for f in ["web.yaml", "batch-crlf.yaml", "knative.yaml"] {
        std::fs::copy(c.tree().join(f), pkg.join(f)).unwrap();
    }
    pkg
}

fn assert_kpt_pinned(c: &Corpus, pkg: &Path, out: &Output) {
    assert!(
        out.status.success(),
        "kpt: {}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    assert_pinned_package(c, pkg);
}

fn assert_pinned_package(c: &Corpus, pkg: &Path) {
    let web = std::fs::read_to_string(pkg.join("web.yaml")).unwrap();
    assert!(
        web.contains("# runs schema migrations"),
        "comments kept:\n{web}"
    );
    let mut seen = 0;
    for f in ["web.yaml", "batch-crlf.yaml", "knative.yaml"] {
        let t = std::fs::read_to_string(pkg.join(f)).unwrap();
        assert!(
            !t.contains("config.kubernetes.io/index"),
            "kpt's annotations are stripped on write-back:\n{t}"
        );
        for d in parse_stream(&t).unwrap() {
            for i in image_fields(&d.to_value()) {
                let (_, digest) = i
                    .value
                    .split_once("@sha256:")
                    .unwrap_or_else(|| panic!("{f}: {} not pinned", i.value));
                assert!(c.digests.values().any(|d| d == digest), "{f}: {}", i.value);
                seen += 1;
            }
        }
    }
    assert_eq!(seen, 6);
}

#[tokio::test]
async fn kpt_fn_eval_exec_pins_the_package_in_place() {
    let c = Corpus::start().await;
    let pkg = kpt_package(&c);
    let exec = format!("{} krm --policy {}", bin(), c.policy().display());
    let out = run(
        Command::new(kpt())
            .args(["fn", "eval"])
            .arg(&pkg)
            .args(["--exec", &exec]),
        None,
    );
    assert_kpt_pinned(&c, &pkg, &out);
}

#[tokio::test]
async fn kpt_fn_render_runs_sigil_from_the_kptfile_pipeline() {
    let c = Corpus::start().await;
    let pkg = kpt_package(&c);
    let policy = std::fs::read_to_string(c.policy()).unwrap();
    let indented: String = policy.lines().map(|l| format!("          {l}\n")).collect();
    std::fs::write(
        pkg.join("Kptfile"),
        format!(
            "apiVersion: kpt.dev/v1\nkind: Kptfile\nmetadata:\n  name: pkg\npipeline:\n  mutators:\n    - exec: \"{} krm\"\n      configMap:\n        policy: |\n{indented}",
            bin()
        ),
    )
    .unwrap();
    let out = run(
        Command::new(kpt())
            .args(["fn", "render"])
            .arg(&pkg)
            .arg("--allow-exec"),
        None,
    );
    assert_kpt_pinned(&c, &pkg, &out);
}

#[tokio::test]
async fn kpt_fails_and_shows_results_when_the_policy_denies() {
    let c = Corpus::start().await;
    let pkg = kpt_package(&c);
    let deny = c.deny_db_policy();
    let before = snapshot(&pkg);
    let exec = format!("{} krm --policy {}", bin(), deny.display());
    let results = c.dir.path().join("results");
    std::fs::create_dir(&results).unwrap();
    let out = run(
        Command::new(kpt())
            .args(["fn", "eval"])
            .arg(&pkg)
            .args(["--exec", &exec, "--results-dir"])
            .arg(&results),
        None,
    );
    assert!(!out.status.success());
    let all = format!("{}{}", text(&out.stdout), text(&out.stderr));
    assert!(
        all.contains("is denied by rule \\\"no-db\\\"")
            || all.contains("is denied by rule \"no-db\""),
        "{all}"
    );
    let saved = std::fs::read_to_string(results.join("results.yaml")).unwrap();
    assert!(
        saved.contains("path: web.yaml"),
        "results name the file: {saved}"
    );
    assert!(
        saved.contains("spec.template.spec.initContainers[0].image"),
        "{saved}"
    );
    assert_eq!(
        snapshot(&pkg),
        before,
        "kpt writes nothing when the function fails"
    );
}

/// kustomize's exec transformers take no arguments: `sigil-krm` (a symlink)
/// runs the KRM mode. Fed the ResourceList kustomize sends, it pins and keeps
/// every orchestrator annotation byte for byte.
#[tokio::test]
async fn sigil_krm_symlink_honours_the_kustomize_exec_contract() {
    let c = Corpus::start().await;
    let link = c.dir.path().join("sigil-krm");
    std::os::unix::fs::symlink(bin(), &link).unwrap();
    let input = c.subst(
        &std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("tests/fixtures/krm/kustomize-resourcelist.yaml"),
        )
        .unwrap(),
    );
    let out = run(&mut Command::new(&link), Some(&input));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let want = input.replace(
        &format!("image: {}/team/app:v1", c.host),
        &format!("image: {}/team/app:v1@sha256:{}", c.host, c.digests["app"]),
    );
    assert_eq!(
        text(&out.stdout),
        want,
        "only the image changed; no results for a clean run"
    );
    // A denial: exit 1 and a results entry kustomize can show.
    let denied = input.replace(
        "name: all\n      match: ['**']",
        "name: all\n      match: ['**']\n      action: deny",
    );
    let out = run(&mut Command::new(&link), Some(&denied));
    assert_eq!(out.status.code(), Some(1));
    let list = parse_stream(&text(&out.stdout))
        .unwrap()
        .remove(0)
        .to_value();
    let r = &list["results"][0];
    assert_eq!(r["severity"], "error");
    assert_eq!(r["resourceRef"]["kind"], "Deployment");
    assert_eq!(r["field"]["path"], "spec.template.spec.containers[0].image");
    assert!(
        r["message"]
            .as_str()
            .unwrap()
            .contains("denied by rule \"all\"")
    );
    // Not a ResourceList: a clear error, non-zero.
    let out = run(
        &mut Command::new(&link),
        Some("apiVersion: v1\nkind: Pod\n"),
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("expected kind ResourceList"));
}
