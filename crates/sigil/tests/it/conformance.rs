//! The Sigstore conformance suite's `bundle-verify` cases (the part in
//! `../shared/vectors/sigstore-conformance`), each run through
//! `sigil verify-bundle` exactly as the suite's harness drives a client: a
//! directory per case, `_fail` = must fail, optional `artifact`, `identity`,
//! `issuer`, `key.pub`, `trusted_root.json`, with the README's defaults.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::support::sigil::bin;

const IDENTITY: &str = "https://github.com/sigstore-conformance/extremely-dangerous-public-oidc-beacon/.github/workflows/extremely-dangerous-oidc-beacon.yml@refs/heads/main";
const ISSUER: &str = "https://token.actions.githubusercontent.com";

fn suite() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/vectors/sigstore-conformance")
}

fn read_trimmed(p: &Path) -> Option<String> {
    std::fs::read_to_string(p).ok().map(|s| s.trim().to_owned())
}

/// Runs one case; returns (passed as expected, what sigil said).
fn run_case(dir: &Path, artifact_override: Option<&str>) -> (bool, String) {
    let root = suite();
    let trusted = if dir.join("trusted_root.json").exists() {
        dir.join("trusted_root.json")
    } else {
        root.join("../sigstore-trust/trusted_root.json")
    };
    let mut cmd = Command::new(bin());
    cmd.arg("verify-bundle")
        .arg("--bundle")
        .arg(dir.join("bundle.sigstore.json"))
        .arg("--trusted-root")
        .arg(&trusted);
    if dir.join("key.pub").exists() {
        cmd.arg("--key").arg(dir.join("key.pub"));
    } else {
        cmd.arg("--certificate-identity")
            .arg(read_trimmed(&dir.join("identity")).unwrap_or_else(|| IDENTITY.into()))
            .arg("--certificate-oidc-issuer")
            .arg(read_trimmed(&dir.join("issuer")).unwrap_or_else(|| ISSUER.into()));
    }
    match artifact_override {
        Some(a) => cmd.arg(a),
        None if dir.join("artifact").exists() => cmd.arg(dir.join("artifact")),
        None => cmd.arg(root.join("a.txt")),
    };
    let out = cmd.output().unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let must_fail = dir.to_string_lossy().ends_with("_fail");
    (out.status.success() != must_fail, said)
}

#[test]
fn every_shared_conformance_case_passes_through_sigil_verify_bundle() {
    let mut cases: Vec<PathBuf> = std::fs::read_dir(suite())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("bundle.sigstore.json").exists())
        .collect();
    cases.sort();
    assert!(
        cases.len() >= 35,
        "the shared suite has {} cases",
        cases.len()
    );
    let mut wrong = Vec::new();
    for dir in &cases {
        let (ok, said) = run_case(dir, None);
        if !ok {
            wrong.push(format!(
                "{}: {said}",
                dir.file_name().unwrap().to_string_lossy()
            ));
        }
    }
    assert!(
        wrong.is_empty(),
        "cases that did not behave as required:\n{}",
        wrong.join("\n")
    );
}

/// The protocol's `sha256:<hex>` argument: a message-signature bundle
/// verifies against the artifact's digest alone, and a wrong digest fails.
#[test]
fn a_digest_argument_stands_for_the_artifact() {
    let dir = suite().join("happy-path-v0.3");
    let a = std::fs::read(suite().join("a.txt")).unwrap();
    let hex: String = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, &a)
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let (ok, said) = run_case(&dir, Some(&format!("sha256:{hex}")));
    assert!(ok, "{said}");
    let (ok, _) = run_case(&dir, Some(&format!("sha256:{}", "0".repeat(64))));
    assert!(!ok, "a wrong digest must fail");
    let bad = Command::new(bin())
        .args([
            "verify-bundle",
            "--bundle",
            "/nonexistent",
            "--key",
            "/nonexistent",
            "x",
        ])
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(2), "bad input is exit 2");
}
