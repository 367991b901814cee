//! The features row: the same cached 3-image Pod decided under a policy with
//! every feature of the latest round — two mirrors (the images are rewritten
//! to the first), an attestation rule (a keyed SLSA v1 provenance with two
//! conditions on the pinned digest), a team ImagePolicy for the Pod's
//! namespace, and an active ImagePolicyException in that namespace — by a
//! second `sigil serve`, driven in alternating rounds against the plain one.
//! It measures what those features cost a cached admission; it checks the
//! decision is the intended one (patched to the mirror, attestation passed)
//! before measuring.

use std::path::Path;
use std::time::{Duration, Instant};

use sigil_testkit::attestations::{SLSA_V1, keyed_layer, predicate, push_att};
use sigil_testkit::featured::{Featured, REPOSITORY, featured_policy};
use sigil_testkit::intoto::statement;
use sigil_testkit::registry::{TestRegistry, free_port};
use sigil_testkit::sigil::{KillOnDrop as Proc, wait_http};
use sigil_testkit::signing::Signer;

use crate::client::client_tls;
use crate::side::Target;

/// The captured Pod's namespace (`02_pod.json`).
const NAMESPACE: &str = "test-connaisseur";

/// Pushes what the featured policy reads — the warm images at the first
/// mirror, each with a keyed SLSA v1 attestation — and starts the second
/// `sigil serve`. Returns the process, its target and its admin port.
pub async fn start(registry: &TestRegistry, dir: &Path, tags: &[String]) -> (Proc, Target, u16) {
    let reg = registry.host();
    let key = Signer::p256();
    let key_path = dir.join("ci.pub");
    std::fs::write(&key_path, key.public_pem()).expect("key file");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs() as i64;
    for tag in tags {
        let d = registry.push_image("mirror-a/bench/app", tag).await;
        let st = statement(&d, SLSA_V1, predicate(SLSA_V1, REPOSITORY, now - 3600));
        push_att(
            registry,
            "mirror-a/bench/app",
            &d,
            &[keyed_layer(&key, &st)],
        )
        .await;
    }
    let policy = dir.join("featured.yaml");
    let registries = format!("    - {{host: \"{reg}\", insecure: true}}\n");
    let text = featured_policy(&Featured {
        registries: &registries,
        origin: &format!("{reg}/bench"),
        mirrors: [
            &format!("{reg}/mirror-a/bench"),
            &format!("{reg}/mirror-b/bench"),
        ],
        namespace: NAMESPACE,
        key: &key_path,
        now,
    });
    std::fs::write(&policy, text).expect("policy");
    let ca = dir.join("featured-ca.pem");
    let (port, admin) = (free_port(), free_port());
    let proc = crate::spawn_sigil(&policy, &ca, port, admin);
    let until = Instant::now() + Duration::from_secs(10);
    while !ca.exists() && Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    wait_http(&format!("http://127.0.0.1:{admin}/readyz")).await;
    let target = Target {
        pid: proc.0.id(),
        addr: format!("127.0.0.1:{port}").parse().expect("addr"),
        tls: client_tls(&std::fs::read(&ca).expect("ca")),
    };
    (proc, target, admin)
}

/// Checks one answer of the featured server: patched to the first mirror,
/// nothing denied or warned (so the row measures the intended decision).
pub fn check_answer(answer: &[u8], reg: &str) {
    let v: serde_json::Value = serde_json::from_slice(answer).expect("answer json");
    let r = &v["response"];
    assert_eq!(r["allowed"], true, "featured decision denied: {v}");
    assert!(r["warnings"].is_null(), "featured decision warned: {v}");
    let images = r["auditAnnotations"]["images"].as_str().unwrap_or_default();
    assert!(
        images.contains(&format!("-> {reg}/mirror-a/bench/app:warm0@sha256:")),
        "not rewritten to the first mirror: {v}"
    );
    let verified = r["auditAnnotations"]["verified"]
        .as_str()
        .unwrap_or_default();
    assert!(
        verified.contains("provenance"),
        "attestation not verified: {v}"
    );
}
