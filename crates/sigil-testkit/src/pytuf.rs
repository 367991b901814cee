//! A TUF repository made by python-tuf, the reference implementation, with
//! `scripts/tuf-repo.py` (GitHub's, Sigstore's or a delegated layout; root
//! rotations; each attack the TUF specification names), served over
//! loopback HTTP — so sigil's TUF client is tested against metadata it did
//! not write. Needs python3 with `tuf` 7 (scripts/test.sh installs it).
//! It checks nothing.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::tuf::StaticServer;

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/tuf-repo.py")
}

fn run(args: &[&str]) {
    let out = Command::new("python3")
        .arg(script())
        .args(args)
        .output()
        .expect("python3");
    assert!(
        out.status.success(),
        "tuf-repo.py {args:?} failed (python-tuf 7 is needed: scripts/test.sh installs it with pip):\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A python-tuf repository: its state directory (keys, history) and the
/// server of its `repo/` directory.
pub struct PyRepo {
    state: tempfile::TempDir,
    pub server: StaticServer,
}

impl PyRepo {
    /// A repository in `layout` (`github`, `sigstore`, `delegated`) whose
    /// first publication holds `target` as `trusted_root.json`.
    pub async fn init(layout: &str, target: &str) -> PyRepo {
        let state = tempfile::tempdir().unwrap();
        let file = state.path().join("target.json");
        std::fs::write(&file, target).unwrap();
        let dir = state.path().join("s");
        run(&[
            "init",
            dir.to_str().unwrap(),
            "--layout",
            layout,
            "--target",
            file.to_str().unwrap(),
        ]);
        let server = StaticServer::start(dir.join("repo")).await;
        PyRepo { state, server }
    }

    fn dir(&self) -> String {
        self.state.path().join("s").to_str().unwrap().to_owned()
    }

    /// The metadata URL.
    pub fn url(&self) -> String {
        self.server.url()
    }

    /// Publishes `target` as the next `trusted_root.json`.
    pub fn publish(&self, target: &str) {
        let file = self.state.path().join("target.json");
        std::fs::write(&file, target).unwrap();
        run(&["publish", &self.dir(), "--target", file.to_str().unwrap()]);
    }

    /// Replaces the root keys (the next root signed by old and new).
    pub fn rotate_root(&self) {
        run(&["rotate-root", &self.dir()]);
    }

    /// Makes the repository serve `kind` (rollback, freeze, arbitrary,
    /// mix-and-match, endless, below-threshold).
    pub fn attack(&self, kind: &str) {
        run(&["attack", &self.dir(), kind]);
    }

    /// The first `root.json`, a client's bootstrap.
    pub fn bootstrap(&self) -> Vec<u8> {
        std::fs::read(self.bootstrap_path()).unwrap()
    }

    /// Where `file` of the served repository is.
    pub fn file(&self, file: &str) -> PathBuf {
        self.state.path().join("s/repo").join(file)
    }

    /// Where the first `root.json` is.
    pub fn bootstrap_path(&self) -> PathBuf {
        self.state.path().join("s/repo/1.root.json")
    }
}
