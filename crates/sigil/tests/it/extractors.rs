//! Images in custom resources: the shipped image extractors on the real
//! Tekton, Argo Workflows and Prometheus-operator examples
//! (`tests/fixtures/upstream`, attributed in its README), through `sigil
//! pin` (byte-exact elsewhere, idempotent) and `sigil krm` under the real
//! kpt; a policy's own extractor for a custom kind, and `sigil policy
//! check` listing them. The webhook on the real API server is in
//! `real_kube::everyday`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use sigil_core::Reference;

use crate::support::registry::{Mode, TestRegistry};
use crate::support::sigil::{bin, run_bounded as run, run_sigil as sigil};

/// The registry mirrors stand in for: each origin host's images under
/// `<registry>/<host>/…`, as an air-gapped cluster's mirror holds them.
const ORIGINS: &[&str] = &["docker.io", "quay.io", "ghcr.io", "mirror.gcr.io"];

struct Upstream {
    _reg: TestRegistry,
    host: String,
    /// Image as written (by tag) → the reference `sigil pin` must write.
    pinned: BTreeMap<String, String>,
    dir: tempfile::TempDir,
}

fn upstream_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/upstream")
}

/// `image:` values of a YAML text, as the independent oracle of where the
/// images are (every `image:` key in these examples holds one).
fn image_lines(text: &str) -> Vec<String> {
    text.lines()
        .filter_map(|l| {
            let t = l.trim_start().trim_start_matches("- ");
            let v = t.strip_prefix("image:")?.trim();
            (!v.is_empty()).then(|| v.to_owned())
        })
        .collect()
}

/// `text` with each by-tag image value replaced as `pinned` says.
fn expected(text: &str, pinned: &BTreeMap<String, String>) -> String {
    text.split_inclusive('\n')
        .map(|l| {
            let t = l.trim_start().trim_start_matches("- ");
            match t.strip_prefix("image:").map(str::trim) {
                Some(v) if pinned.contains_key(v) => l.replacen(v, &pinned[v], 1),
                _ => l.to_owned(),
            }
        })
        .collect()
}

impl Upstream {
    async fn start() -> Upstream {
        let reg = TestRegistry::start(Mode::Plain).await;
        let host = reg.host();
        let dir = tempfile::tempdir().unwrap();
        let mut pinned = BTreeMap::new();
        for project in ["tekton", "argo", "prometheus"] {
            let to = dir.path().join("manifests").join(project);
            std::fs::create_dir_all(&to).unwrap();
            for e in std::fs::read_dir(upstream_dir().join(project)).unwrap() {
                let p = e.unwrap().path();
                let text = std::fs::read_to_string(&p).unwrap();
                for image in image_lines(&text) {
                    if image.contains('@') || pinned.contains_key(&image) {
                        continue;
                    }
                    let r = Reference::parse(&image).unwrap();
                    let tag = r.tag().unwrap_or("latest").to_owned();
                    let name = r.name();
                    let digest = reg.push_image(&name, &tag).await;
                    pinned.insert(image, format!("{host}/{name}:{tag}@{digest}"));
                }
                std::fs::copy(&p, to.join(p.file_name().unwrap())).unwrap();
            }
        }
        let u = Upstream {
            _reg: reg,
            host,
            pinned,
            dir,
        };
        std::fs::write(u.policy(), u.policy_text("")).unwrap();
        u
    }

    fn tree(&self) -> PathBuf {
        self.dir.path().join("manifests")
    }

    fn policy(&self) -> PathBuf {
        self.dir.path().join("policy.yaml")
    }

    /// Mirrors for every origin (an image already pinned by digest keeps its
    /// origin: the mirror lacks that digest), and a catch-all rule.
    fn policy_text(&self, extra_spec: &str) -> String {
        let mirrors: String = ORIGINS
            .iter()
            .map(|o| {
                format!(
                    "    - {{from: {o}, to: \"{}/{o}\", fallback: origin, requireSameDigest: false}}\n",
                    self.host
                )
            })
            .collect();
        format!(
            "apiVersion: sigil.dev/v1alpha1\nkind: ImagePolicy\nmetadata: {{name: upstream}}\nspec:\n  registries:\n    - {{host: \"{}\", insecure: true}}\n  mirrors:\n{mirrors}  rules:\n    - {{name: all, match: [\"**\"], mode: enforce}}\n{extra_spec}",
            self.host
        )
    }

    fn files(&self) -> Vec<PathBuf> {
        let mut out = Vec::new();
        for project in ["tekton", "argo", "prometheus"] {
            for e in std::fs::read_dir(self.tree().join(project)).unwrap() {
                out.push(e.unwrap().path());
            }
        }
        out.sort();
        out
    }
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn pin(u: &Upstream, mode: &str) -> Output {
    sigil(
        &[
            "pin",
            "--policy",
            u.policy().to_str().unwrap(),
            mode,
            u.tree().to_str().unwrap(),
        ],
        None,
    )
}

#[tokio::test]
async fn the_shipped_extractors_pin_tekton_argo_and_prometheus_examples_byte_exact_elsewhere() {
    let u = Upstream::start().await;
    let before: Vec<(PathBuf, String)> = u
        .files()
        .into_iter()
        .map(|p| {
            let t = std::fs::read_to_string(&p).unwrap();
            (p, t)
        })
        .collect();
    let by_tag: usize = before
        .iter()
        .map(|(_, t)| image_lines(t).iter().filter(|i| !i.contains('@')).count())
        .sum();
    assert!(by_tag >= 30, "the examples name {by_tag} images by tag");
    // Before: --check sees every image in a custom resource as unpinned.
    let check = pin(&u, "--check");
    let report = text(&check.stdout);
    assert_eq!(
        check.status.code(),
        Some(1),
        "{report}{}",
        text(&check.stderr)
    );
    for kind in [
        "Task",
        "Pipeline",
        "PipelineRun",
        "Workflow",
        "CronWorkflow",
        "WorkflowTemplate",
        "ClusterWorkflowTemplate",
        "Prometheus",
        "Alertmanager",
    ] {
        assert!(
            report.contains(&format!(" {kind} ")) || report.contains(&format!("{kind}/")),
            "{kind} not reported:\n{report}"
        );
    }
    let write = pin(&u, "--write");
    assert_eq!(
        write.status.code(),
        Some(0),
        "{}{}",
        text(&write.stdout),
        text(&write.stderr)
    );
    for (p, old) in &before {
        let new = std::fs::read_to_string(p).unwrap();
        assert_eq!(
            new,
            expected(old, &u.pinned),
            "{}: only the by-tag image values change, to the mirror's digest",
            p.display()
        );
    }
    // Idempotent: a second write changes nothing and --check passes.
    let again = pin(&u, "--write");
    assert_eq!(again.status.code(), Some(0), "{}", text(&again.stderr));
    for (p, old) in &before {
        assert_eq!(
            std::fs::read_to_string(p).unwrap(),
            expected(old, &u.pinned)
        );
    }
    let check = pin(&u, "--check");
    assert_eq!(
        check.status.code(),
        Some(0),
        "{}{}",
        text(&check.stdout),
        text(&check.stderr)
    );
}

fn kpt() -> PathBuf {
    [
        "/usr/lib/google-cloud-sdk/bin/kpt",
        "/usr/bin/kpt",
        "/usr/local/bin/kpt",
    ]
    .iter()
    .map(PathBuf::from)
    .find(|p| p.exists())
    .expect("kpt is required for the KRM function tests (package google-cloud-cli-kpt)")
}

#[tokio::test]
async fn sigil_krm_under_kpt_pins_images_in_custom_resources() {
    let u = Upstream::start().await;
    let pkg = u.dir.path().join("pkg");
    std::fs::create_dir(&pkg).unwrap();
    // kpt takes only objects with a metadata.name (not generateName).
    let mut by_tag = 0;
    for p in u.files() {
        let t = std::fs::read_to_string(&p).unwrap();
        if !t.contains("generateName:") {
            by_tag += image_lines(&t).iter().filter(|i| !i.contains('@')).count();
            std::fs::write(pkg.join(p.file_name().unwrap()), t).unwrap();
        }
    }
    let exec = format!("{} krm --policy {}", bin(), u.policy().display());
    let out = run(
        Command::new(kpt())
            .args(["fn", "eval"])
            .arg(&pkg)
            .args(["--exec", &exec]),
        None,
    );
    assert!(
        out.status.success(),
        "kpt: {}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    let mut seen = 0;
    for e in std::fs::read_dir(&pkg).unwrap() {
        let p = e.unwrap().path();
        for image in image_lines(&std::fs::read_to_string(&p).unwrap()) {
            let (_, digest) = image
                .split_once('@')
                .unwrap_or_else(|| panic!("{}: {image} not pinned", p.display()));
            if u.pinned.values().any(|v| v.ends_with(digest)) {
                assert!(image.starts_with(&u.host), "{image}");
                seen += 1;
            }
        }
    }
    assert!(by_tag >= 15, "{by_tag} images by tag in the package");
    assert_eq!(seen, by_tag, "every image by tag pinned to the mirror");
}

/// A platform's own kind: its extractor is validated at load, listed by
/// `sigil policy check`, pins the kind's image, and a path that reaches a
/// map refuses the object instead of skipping it.
#[tokio::test]
async fn a_policys_own_extractor_pins_a_custom_kind_and_a_map_at_its_path_is_refused() {
    let u = Upstream::start().await;
    let extra = "  imageExtractors:\n    - apiVersion: example.com/v1\n      kind: Widget\n      paths: [spec.image, \"spec.workers[*].image\"]\n";
    std::fs::write(u.policy(), u.policy_text(extra)).unwrap();
    let listed = sigil(&["policy", "check", u.policy().to_str().unwrap()], None);
    let listing = text(&listed.stdout);
    assert!(listed.status.success(), "{listing}{}", text(&listed.stderr));
    assert!(
        listing.contains("example.com/v1 Widget (widgets; ImagePolicy upstream): spec.image, spec.workers[*].image"),
        "{listing}"
    );
    assert!(
        listing.contains("tekton.dev/* Task (tasks; default): spec.steps[*].image"),
        "{listing}"
    );
    let widgets = u.dir.path().join("widgets");
    std::fs::create_dir(&widgets).unwrap();
    let ok = widgets.join("widget.yaml");
    std::fs::write(
        &ok,
        "apiVersion: example.com/v1\nkind: Widget\nmetadata:\n  name: w\nspec:\n  image: busybox # the main one\n  workers:\n    - name: a\n      image: \"alpine:3.23\"\n",
    )
    .unwrap();
    let out = sigil(
        &[
            "pin",
            "--policy",
            u.policy().to_str().unwrap(),
            "--write",
            ok.to_str().unwrap(),
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
    let written = std::fs::read_to_string(&ok).unwrap();
    assert!(
        written.contains(&format!(
            "  image: {} # the main one\n",
            u.pinned["busybox"]
        )),
        "{written}"
    );
    assert!(
        written.contains(&format!("      image: \"{}\"\n", u.pinned["alpine:3.23"])),
        "{written}"
    );
    let bad = widgets.join("bad.yaml");
    let bad_text = "apiVersion: example.com/v1\nkind: Widget\nmetadata:\n  name: b\nspec:\n  image:\n    repository: busybox\n";
    std::fs::write(&bad, bad_text).unwrap();
    let out = sigil(
        &[
            "pin",
            "--policy",
            u.policy().to_str().unwrap(),
            "--write",
            bad.to_str().unwrap(),
        ],
        None,
    );
    let report = text(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{report}{}", text(&out.stderr));
    assert!(
        report.contains("spec.image holds a map, where imageExtractors (example.com/v1 Widget: spec.image) expects an image string"),
        "{report}"
    );
    assert_eq!(
        std::fs::read_to_string(&bad).unwrap(),
        bad_text,
        "nothing written"
    );
    // An invalid path is refused at load, naming the entry.
    std::fs::write(
        u.policy(),
        u.policy_text("  imageExtractors:\n    - {apiVersion: example.com/v1, kind: Widget, paths: [\"spec.workers[0].image\"]}\n"),
    )
    .unwrap();
    let out = sigil(&["policy", "check", u.policy().to_str().unwrap()], None);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("imageExtractors[0]") && err.contains("[*]"),
        "{err}"
    );
}

/// The webhook's rules for custom resources come from one list: `--register`
/// writes them from the policy in force, the chart renders them from the
/// shipped file and its `policy` value, the Kustomize base carries the
/// shipped ones — all equal.
#[test]
fn the_chart_the_base_and_register_render_the_same_rules_from_the_extractors() {
    use sigil_core::walker::Extractors;
    use sigil_kube::cluster::{CustomKinds, registration};
    let rules_of = |objects: &[serde_json::Value]| {
        objects
            .iter()
            .find(|o| o["kind"] == "MutatingWebhookConfiguration")
            .expect("a webhook configuration")["webhooks"][0]["rules"]
            .clone()
    };
    let shipped = serde_json::to_value(registration::rules(&CustomKinds::of(
        &Extractors::defaults(),
    )))
    .unwrap();
    assert_eq!(rules_of(&crate::deploy::render("base")), shipped, "base");
    assert_eq!(rules_of(&crate::helm::rendered(&[])), shipped, "chart");
    assert_eq!(
        std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../../deploy/helm/sigil/files/image-extractors.yaml")
        )
        .unwrap(),
        sigil_core::walker::extract::DEFAULTS_YAML,
        "the chart's copy of the shipped list is the embedded one"
    );
    // A policy with a kind of its own and a default turned off.
    let dir = tempfile::tempdir().unwrap();
    let policy = "apiVersion: sigil.dev/v1alpha1\nkind: ImagePolicy\nmetadata: {name: cluster}\nspec:\n  rules: [{name: all, match: [\"**\"]}]\n  imageExtractors:\n    - {apiVersion: example.com/v1, kind: Widget, paths: [spec.image]}\n    - {apiVersion: tekton.dev/*, kind: ClusterTask, paths: []}\n    - {apiVersion: example.com/v1, kind: Gadget, resource: gizmos, paths: [spec.image]}\n";
    let file = dir.path().join("policy.yaml");
    std::fs::write(&file, policy).unwrap();
    let loaded = sigil_core::Policy::from_yaml(policy).unwrap();
    let want =
        serde_json::to_value(registration::rules(&CustomKinds::of(&loaded.extractors))).unwrap();
    let chart = rules_of(&crate::helm::rendered(&[&format!(
        "@policy={}",
        file.display()
    )]));
    assert_eq!(chart, want);
    let text = chart.to_string();
    assert!(
        text.contains("\"gizmos\",\"widgets\"") && !text.contains("clustertasks"),
        "{text}"
    );
}
