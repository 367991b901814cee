//! The Sigstore conformance suite's `bundle-verify` cases, as copied (with
//! their attribution) into `crates/sigil-verify/tests/vectors/sigstore-conformance`:
//! a directory per case, `_fail` = must fail, optional `artifact`,
//! `identity`, `issuer`, `key.pub` and `trusted_root.json`, and the
//! suite's defaults where a file is absent. Owns that layout and those
//! defaults; how a case is run (`sigil verify-bundle`, the library, another
//! verifier) is the caller's.

use std::path::{Path, PathBuf};

/// The suite's default signer identity (its OIDC beacon's workflow).
pub const IDENTITY: &str = "https://github.com/sigstore-conformance/extremely-dangerous-public-oidc-beacon/.github/workflows/extremely-dangerous-oidc-beacon.yml@refs/heads/main";
/// The suite's default OIDC issuer.
pub const ISSUER: &str = "https://token.actions.githubusercontent.com";

/// The suite's directory.
pub fn suite() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../sigil-verify/tests/vectors/sigstore-conformance")
}

/// The public-good production root the suite means when a case has none.
pub fn public_good_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../sigil-verify/trust/public-good-trusted_root.json")
}

/// Every case in the suite (a directory holding a bundle), by name.
pub fn cases() -> Vec<Case> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(suite())
        .expect("the conformance suite")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.join("bundle.sigstore.json").exists())
        .collect();
    dirs.sort();
    dirs.into_iter().map(Case::at).collect()
}

/// One case: a directory in the suite's layout (or one a test wrote so).
#[derive(Debug, Clone)]
pub struct Case {
    pub dir: PathBuf,
}

impl Case {
    pub fn at(dir: impl Into<PathBuf>) -> Case {
        Case { dir: dir.into() }
    }

    /// A case in the suite, by name.
    pub fn named(name: &str) -> Case {
        Case::at(suite().join(name))
    }

    pub fn name(&self) -> String {
        self.dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    }

    /// The suite's convention: a case named `…_fail` must be refused.
    pub fn must_fail(&self) -> bool {
        self.name().ends_with("_fail")
    }

    pub fn bundle(&self) -> PathBuf {
        self.dir.join("bundle.sigstore.json")
    }

    /// The case's public key file, when it is key-signed.
    pub fn key(&self) -> Option<PathBuf> {
        Some(self.dir.join("key.pub")).filter(|p| p.exists())
    }

    /// The key's PEM, trimmed.
    pub fn key_pem(&self) -> Option<String> {
        self.read_trimmed("key.pub")
    }

    pub fn identity(&self) -> String {
        self.read_trimmed("identity")
            .unwrap_or_else(|| IDENTITY.into())
    }

    pub fn issuer(&self) -> String {
        self.read_trimmed("issuer").unwrap_or_else(|| ISSUER.into())
    }

    /// The case's artifact, or the suite's `a.txt`.
    pub fn artifact(&self) -> PathBuf {
        Some(self.dir.join("artifact"))
            .filter(|p| p.exists())
            .unwrap_or_else(|| suite().join("a.txt"))
    }

    /// The case's trusted root, or [`public_good_root`].
    pub fn trusted_root(&self) -> PathBuf {
        Some(self.dir.join("trusted_root.json"))
            .filter(|p| p.exists())
            .unwrap_or_else(public_good_root)
    }

    fn read_trimmed(&self, file: &str) -> Option<String> {
        std::fs::read_to_string(self.dir.join(file))
            .ok()
            .map(|s| s.trim().to_owned())
    }
}

/// A disagreement between sigil and another verifier on one case: (case,
/// sigil accepts, the other accepts, both answers).
pub type Found = (String, bool, bool, String);

/// A triaged disagreement: (case, sigil accepts, the other accepts, who is
/// right and why).
pub type Triaged = (&'static str, bool, bool, &'static str);

/// Records a disagreement between sigil's verdict `a` and the other's `b`.
pub fn disagreement<T: std::fmt::Debug, U: std::fmt::Debug>(
    found: &mut Vec<Found>,
    name: impl Into<String>,
    a: &Result<T, String>,
    b: &Result<U, String>,
) {
    if a.is_ok() != b.is_ok() {
        found.push((
            name.into(),
            a.is_ok(),
            b.is_ok(),
            format!("sigil {a:?}; the other {b:?}"),
        ));
    }
}

/// The disagreements found are exactly the triaged ones: a new one, or a
/// verifier changing its mind, fails with both answers.
pub fn assert_triaged(found: &[Found], triaged: &[Triaged]) {
    let got: Vec<(&str, bool, bool)> = found
        .iter()
        .map(|(n, a, b, _)| (n.as_str(), *a, *b))
        .collect();
    let want: Vec<(&str, bool, bool)> = triaged.iter().map(|(n, a, b, _)| (*n, *a, *b)).collect();
    assert_eq!(
        got,
        want,
        "disagreements changed:\n{}",
        found
            .iter()
            .map(|(n, _, _, d)| format!("{n}: {d}"))
            .collect::<Vec<_>>()
            .join("\n")
    );
}
