//! `sigil pin` against a hostile or awkward file tree, each case a review
//! ran: a link planted at the temporary name, directory link loops, an
//! unwritable directory among several, a manifest that is a link, and names
//! carrying terminal escapes.

use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;
use std::process::Command;

use crate::support::sigil::bin;

const MANIFEST: &str = "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec:\n  containers:\n    - {name: a, image: nginx:1.27}\n";
/// Rewrites Docker Hub to a mirror: a change made offline.
const POLICY: &str = "apiVersion: sigil.dev/v1alpha1\nkind: ImagePolicy\nspec:\n  mirrors: [{from: docker.io, to: mirror.local/hub}]\n  rules:\n    - {name: all, match: [\"**\"], mode: warn}\n";

fn write(p: &Path, s: &str) {
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, s).unwrap();
}

fn policy(dir: &Path) -> std::path::PathBuf {
    let p = dir.join("policy.yaml.txt");
    std::fs::write(&p, POLICY).unwrap();
    p
}

/// Runs `sigil pin --offline` (in `dir`), bounded in time.
fn pin(dir: &Path, args: &[&str]) -> (i32, String, String) {
    let out = crate::support::sigil::run_bounded(
        Command::new(bin())
            .args(["pin", "--offline", "--policy"])
            .arg(policy(dir))
            .args(args)
            .current_dir(dir),
        None,
    );
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The reproduction: a link planted at `.a.yaml.sigil-$$.tmp`
/// (the old, predictable name) before `exec sigil pin -w`.
#[test]
fn a_link_planted_at_the_temporary_name_is_never_followed() {
    let d = tempfile::tempdir().unwrap();
    let victim = d.path().join("victim.txt");
    std::fs::write(&victim, "secret").unwrap();
    std::fs::set_permissions(&victim, std::fs::Permissions::from_mode(0o600)).unwrap();
    write(&d.path().join("shared/a.yaml"), MANIFEST);
    let script = format!(
        "ln -s {} shared/.a.yaml.sigil-$$.tmp; exec {} pin -w --offline --policy {} shared/a.yaml",
        victim.display(),
        bin(),
        policy(d.path()).display()
    );
    crate::support::sigil::run_ok(
        Command::new("sh")
            .args(["-c", &script])
            .current_dir(d.path()),
    );
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "secret");
    let mode = std::fs::metadata(&victim).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    assert!(
        std::fs::read_to_string(d.path().join("shared/a.yaml"))
            .unwrap()
            .contains("mirror.local/hub/library/nginx:1.27")
    );
}

/// Tekton steps, sidecars and step templates, an Argo Workflow's script and
/// container set, and a Prometheus's `spec.image` were never reported:
/// `--check` passed with all of them unpinned. The shipped extractors find
/// every one (each named by its path and kind in the report).
#[test]
fn regression_images_in_custom_resources_are_invisible_to_pin_check() {
    let d = tempfile::tempdir().unwrap();
    write(
        &d.path().join("crs.yaml"),
        "apiVersion: tekton.dev/v1\nkind: Task\nmetadata: {name: build}\nspec:\n  stepTemplate: {image: alpine:3.20}\n  steps:\n    - {name: a, image: golang:1.23}\n  sidecars:\n    - {name: d, image: docker:dind}\n---\napiVersion: argoproj.io/v1alpha1\nkind: Workflow\nmetadata: {name: w}\nspec:\n  templates:\n    - name: s\n      script: {image: python:3.12}\n    - name: c\n      containerSet:\n        containers:\n          - {name: x, image: busybox:1.36}\n---\napiVersion: monitoring.coreos.com/v1\nkind: Prometheus\nmetadata: {name: p}\nspec:\n  image: quay.io/prometheus/prometheus:v3.0.0\n",
    );
    let (code, out, err) = pin(d.path(), &["--check", "crs.yaml"]);
    assert_eq!(code, 1, "{out}{err}");
    let all = format!("{out}{err}");
    for seen in [
        "spec.stepTemplate.image of Task build",
        "spec.steps[0].image (\"a\") of Task build",
        "spec.sidecars[0].image (\"d\") of Task build",
        "spec.templates[0].script.image (\"s\") of Workflow w",
        "spec.templates[1].containerSet.containers[0].image (\"x\") of Workflow w",
        "spec.image of Prometheus p",
    ] {
        assert!(all.contains(seen), "{seen} not reported:\n{all}");
    }
}

/// `ln -s . d/loop1` made one file processed (and written) 41 times; two
/// such links made `--check` never finish.
#[test]
fn directory_link_loops_end_and_each_file_is_processed_once() {
    let d = tempfile::tempdir().unwrap();
    write(&d.path().join("d/a.yaml"), MANIFEST);
    std::os::unix::fs::symlink(".", d.path().join("d/loop1")).unwrap();
    std::os::unix::fs::symlink(".", d.path().join("d/loop2")).unwrap();
    let (code, out, err) = pin(d.path(), &["--check", "--output", "json", "d"]);
    assert_eq!(code, 1, "{out}{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["files"].as_array().unwrap().len(), 1, "{out}");
    assert!(err.contains("directory link not followed"), "{err}");
    let (code, out, _) = pin(d.path(), &["-w", "d"]);
    assert_eq!(code, 0);
    assert!(out.contains("1 file(s) written"), "{out}");
}

/// `sigil pin -w a b` with `b/` not writable rewrote `a/m.yaml` and then
/// stopped without saying so: now nothing is written, and the error says
/// which directory refused. (Run as an unprivileged user: root writes anywhere.)
#[test]
fn an_unwritable_directory_means_nothing_is_written() {
    let d = tempfile::tempdir().unwrap();
    std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    for sub in ["a", "b"] {
        write(&d.path().join(sub).join("m.yaml"), MANIFEST);
        std::fs::set_permissions(d.path().join(sub), std::fs::Permissions::from_mode(0o777))
            .unwrap();
        std::fs::set_permissions(
            d.path().join(sub).join("m.yaml"),
            std::fs::Permissions::from_mode(0o666),
        )
        .unwrap();
    }
    std::fs::set_permissions(d.path().join("b"), std::fs::Permissions::from_mode(0o555)).unwrap();
    let pol = policy(d.path());
    std::fs::set_permissions(&pol, std::fs::Permissions::from_mode(0o644)).unwrap();
    let root = Command::new("id").arg("-u").output().unwrap().stdout == b"0\n";
    let mut cmd = if root {
        let mut c = Command::new("setpriv");
        c.args(["--reuid=65534", "--regid=65534", "--clear-groups", bin()]);
        c
    } else {
        Command::new(bin())
    };
    // The test binary's directory must be reachable for the unprivileged user.
    let out = cmd
        .args(["pin", "-w", "--offline", "--policy"])
        .arg(&pol)
        .args(["a", "b"])
        .current_dir(d.path())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    if root
        && err.contains("Permission denied")
        && err.contains("sigil")
        && !err.contains("nothing was written")
    {
        // The binary itself is not executable by nobody (e.g. under /root): nothing to learn.
        eprintln!("skipped: {err}");
        return;
    }
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("nothing was written") && err.contains("b is not writable"),
        "{err}"
    );
    assert_eq!(
        std::fs::read_to_string(d.path().join("a/m.yaml")).unwrap(),
        MANIFEST,
        "a/ changed"
    );
}

/// A manifest that is a link: the target is written, the link stays, and
/// the report says so (it used to be replaced by a regular file).
#[test]
fn a_manifest_that_is_a_link_is_written_through_it() {
    let d = tempfile::tempdir().unwrap();
    write(&d.path().join("real/m.yaml"), MANIFEST);
    std::os::unix::fs::symlink("real/m.yaml", d.path().join("m.yaml")).unwrap();
    let (code, out, err) = pin(d.path(), &["-w", "m.yaml"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        std::fs::symlink_metadata(d.path().join("m.yaml"))
            .unwrap()
            .file_type()
            .is_symlink()
    );
    assert!(
        std::fs::read_to_string(d.path().join("real/m.yaml"))
            .unwrap()
            .contains("mirror.local")
    );
    assert!(
        out.contains("m.yaml: note: written through the link to"),
        "{out}"
    );
}

/// A file name and a `metadata.name` with terminal escapes and a newline
/// are printed escaped; `-o json` keeps them exact.
#[test]
fn names_with_terminal_escapes_are_printed_escaped() {
    let d = tempfile::tempdir().unwrap();
    let name = "evil\u{1b}]0;pwned\u{7}\n.yaml";
    write(
        &d.path().join(name),
        &MANIFEST.replace("name: p}", "name: \"p\\e[31m\"}"),
    );
    let (code, out, err) = pin(d.path(), &["--check", "."]);
    assert_eq!(code, 1, "{out}{err}");
    let all = format!("{out}{err}");
    assert!(!all.contains('\u{1b}') && !all.contains('\u{7}'), "{all:?}");
    assert!(out.contains("evil\\u{1b}]0;pwned\\u{7}\\n.yaml"), "{out}");
    let (_, json, _) = pin(d.path(), &["--check", "--output", "json", "."]);
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert!(
        v["files"][0]["path"].as_str().unwrap().contains('\u{1b}'),
        "JSON stays exact"
    );
}
