//! Test harness: real registry, sigil as a child process, an apiserver-like
//! client, a loopback fault server, and a stand-in for kube-apiserver's storage.
#![allow(dead_code)]

pub mod fault;
pub mod kube;
pub mod registry;
pub mod sigil;
pub mod signing;
pub mod token;

use std::path::PathBuf;

/// The connaisseur AdmissionReview fixtures (../shared/vectors, Apache-2.0).
pub fn fixtures_dir() -> PathBuf {
    let here = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let local = here.join("tests/fixtures/admission_requests");
    if local.is_dir() {
        local
    } else {
        here.join("../../../shared/vectors/connaisseur/admission_requests")
    }
}

pub fn fixture(name: &str) -> serde_json::Value {
    let p = fixtures_dir().join(name);
    serde_json::from_slice(&std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display())))
        .unwrap()
}

pub fn fixture_bytes(name: &str) -> Vec<u8> {
    std::fs::read(fixtures_dir().join(name)).unwrap()
}
