//! Differential: a Sigstore bundle — libFuzzer mutating the real ones in
//! the repository (the conformance cases that use the suite's defaults) —
//! judged by sigil's `bundle::verify` and by the Sigstore project's own
//! verifier (`sigstore-verify` =0.15.1) with the same trusted root (public
//! good), artifact (`a.txt`) and identity. They must agree on accept or
//! refuse; a disagreement stops the run for triage (which one the
//! specification backs) into `crates/sigil-verify/tests/oracle.rs`.
//! Built only with `--features oracle` (the CI smoke builds without it):
//!   cargo +nightly fuzz run --features oracle bundle_oracle CORPUS \
//!     crates/sigil-verify/tests/vectors/sigstore-conformance/happy-path-v0.3 …
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use sigil_verify::bundle::{Artifact, Matcher, Requirements, Signer};
use sigil_verify::trust::TrustedRoot;

const ROOT: &str = include_str!("../../crates/sigil-verify/trust/public-good-trusted_root.json");
const A_TXT: &[u8] =
    include_bytes!("../../crates/sigil-verify/tests/vectors/sigstore-conformance/a.txt");
const IDENTITY: &str = "https://github.com/sigstore-conformance/extremely-dangerous-public-oidc-beacon/.github/workflows/extremely-dangerous-oidc-beacon.yml@refs/heads/main";
const ISSUER: &str = "https://token.actions.githubusercontent.com";

struct World {
    ours: TrustedRoot,
    theirs: sigstore_verify::Verifier,
    san: Matcher,
    issuer: Matcher,
    policy: sigstore_verify::VerificationPolicy,
}

fn world() -> &'static World {
    static W: OnceLock<World> = OnceLock::new();
    W.get_or_init(|| {
        let theirs = sigstore_verify::trust_root::TrustedRoot::from_json(ROOT).expect("their root");
        World {
            ours: TrustedRoot::from_json(ROOT).expect("our root"),
            theirs: sigstore_verify::Verifier::new(&theirs).expect("their verifier"),
            san: Matcher::Exact(IDENTITY.into()),
            issuer: Matcher::Exact(ISSUER.into()),
            policy: sigstore_verify::VerificationPolicy::new(IDENTITY, ISSUER),
        }
    })
}

/// Disagreements already triaged (each a test in
/// `crates/sigil-verify/tests/oracle.rs`): skipped so the run goes on to
/// find others. `true` when this input is one of them.
fn triaged<E>(data: &[u8], ours: &Result<sigil_verify::bundle::Verified, E>) -> bool {
    let v: serde_json::Value = serde_json::from_slice(data).unwrap_or_default();
    let known = [
        "application/vnd.dev.sigstore.bundle+json;version=0.1",
        "application/vnd.dev.sigstore.bundle+json;version=0.2",
        "application/vnd.dev.sigstore.bundle+json;version=0.3",
        "application/vnd.dev.sigstore.bundle.v0.3+json",
    ];
    // A bundle that names no version it has (sigstore-verify defaults
    // one; the bundle specification requires it): sigil refuses.
    let unversioned = !v["mediaType"].as_str().is_some_and(|m| known.contains(&m));
    unversioned && ours.is_err()
}

fuzz_target!(|data: &[u8]| {
    let w = world();
    let ours = sigil_verify::bundle::verify(
        data,
        &Artifact::Bytes(A_TXT.to_vec()),
        Signer::Identity {
            san: &w.san,
            issuer: &w.issuer,
            extensions: &[],
        },
        Requirements::default(),
        &w.ours,
    );
    let theirs = std::str::from_utf8(data)
        .ok()
        .and_then(|s| sigstore_verify::types::Bundle::from_json(s).ok())
        .map(|b| w.theirs.verify(A_TXT, &b, &w.policy));
    let theirs_ok = matches!(theirs, Some(Ok(_)));
    if ours.is_ok() != theirs_ok && triaged(data, &ours) {
        return;
    }
    assert_eq!(
        ours.is_ok(),
        theirs_ok,
        "disagreement: sigil {:?}; sigstore-verify {:?}",
        ours.as_ref().map(|_| "accepts"),
        theirs.as_ref().map(|r| r.as_ref().map(|_| "accepts").map_err(|e| e.to_string()))
    );
});
