//! What gathering finds where the test registry (distribution 2.x) cannot
//! serve it: the referrers API (a notation signature, a cosign v3 bundle),
//! and a referrer as sigstore-js lists it for Docker Hub (no `subject`),
//! from an in-memory source.

use sigil_testkit::artifacts::MemorySource;

use super::*;

fn sha(b: &[u8]) -> String {
    format!("sha256:{}", crate::trust::hex(&crate::sha256(b)))
}

/// What gathering the signatures of `subject` from `mem` finds.
async fn signatures_of(mem: &MemorySource, subject: &str) -> Artifacts {
    gather(
        mem,
        &Reference::parse("r.example/app").unwrap(),
        &Digest::parse(subject).unwrap(),
        &PullCredentials::default(),
        Wanted::SIGNATURES,
        Instant::now() + std::time::Duration::from_secs(5),
    )
    .await
    .unwrap()
}

/// A notation envelope and the referrer manifest that carries it for `subject`.
fn notation_referrer(subject: &str) -> (Vec<u8>, Vec<u8>) {
    let env = br#"{"payload":"e30","protected":"e30","signature":"AA"}"#.to_vec();
    let m = serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "artifactType": notation::ARTIFACT_TYPE,
        "config": {"mediaType": "application/vnd.oci.empty.v1+json", "digest": sha(b"{}"), "size": 2},
        "layers": [{"mediaType": notation::JWS_MEDIA_TYPE, "digest": sha(&env), "size": env.len()}],
        "subject": {"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": subject, "size": 1}
    }))
    .unwrap();
    (env, m)
}

#[tokio::test]
async fn referrers_api_answer_is_used_without_the_tag_schema() {
    let subject = format!("sha256:{}", "ab".repeat(32));
    let (env, m) = notation_referrer(&subject);
    // A second referrer claims another subject: it must be ignored.
    let stray = serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2, "artifactType": notation::ARTIFACT_TYPE,
        "layers": [{"mediaType": notation::JWS_MEDIA_TYPE, "digest": sha(&env), "size": env.len()}],
        "subject": {"digest": format!("sha256:{}", "cd".repeat(32))}
    }))
    .unwrap();
    let index = serde_json::to_vec(&serde_json::json!({"schemaVersion": 2, "manifests": [
        {"digest": sha(&m), "artifactType": notation::ARTIFACT_TYPE},
        {"digest": sha(&stray), "artifactType": notation::ARTIFACT_TYPE},
        {"digest": sha(b"sbom"), "artifactType": "application/spdx+json"}
    ]}))
    .unwrap();
    let mem = MemorySource {
        manifests: [(sha(&m), m.clone()), (sha(&stray), stray.clone())]
            .into_iter()
            .collect(),
        blobs: [(sha(&env), env.clone())].into_iter().collect(),
        referrers: Some(index),
        ..Default::default()
    };
    let a = signatures_of(&mem, &subject).await;
    assert_eq!(
        a.notation.len(),
        1,
        "one envelope, from the referrer naming this subject"
    );
    let calls = mem.calls();
    let tag_schema = format!("manifest sha256-{}", "ab".repeat(32));
    assert!(
        !calls.contains(&tag_schema),
        "API answered: no tag-schema lookup: {calls:?}"
    );
    assert_eq!(
        calls.iter().filter(|c| c.starts_with("blob")).count(),
        1,
        "{calls:?}"
    );
    assert!(
        !calls.iter().any(|c| c.contains(&sha(b"sbom"))),
        "other artifact types are not fetched"
    );
}

/// sigstore-js (GitHub's `actions/attest`) pushing to Docker Hub or ECR
/// deletes the manifest's `subject` and lists it in the tag-schema
/// index by hand: such a referrer was skipped, so those attestations
/// were never found.
#[tokio::test]
async fn regression_a_referrer_without_subject_listed_by_the_tag_schema_is_read() {
    let subject = format!("sha256:{}", "ef".repeat(32));
    let env = br#"{"payload":"e30","protected":"e30","signature":"AA"}"#.to_vec();
    let m = serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": sha(b"{}"), "size": 2},
        "layers": [{"mediaType": notation::JWS_MEDIA_TYPE, "digest": sha(&env), "size": env.len()}]
    }))
    .unwrap();
    let index = serde_json::to_vec(&serde_json::json!({"schemaVersion": 2, "manifests": [
        {"digest": sha(&m), "artifactType": notation::ARTIFACT_TYPE}
    ]}))
    .unwrap();
    let tag = format!("sha256-{}", "ef".repeat(32));
    let mem = MemorySource {
        manifests: [(sha(&m), m.clone()), (tag, index)].into_iter().collect(),
        blobs: [(sha(&env), env.clone())].into_iter().collect(),
        referrers: None,
        ..Default::default()
    };
    let a = signatures_of(&mem, &subject).await;
    assert_eq!(a.notation.len(), 1, "{:?}", mem.calls());
}

/// A cosign v3 signature bundle (`cosign sign --new-bundle-format`)
/// found through the referrers API, without the tag schema: the path a
/// registry with the API (Harbor, GHCR, Zot, distribution 3) serves.
#[tokio::test]
async fn a_signature_bundle_is_found_through_the_referrers_api() {
    let subject = format!("sha256:{}", "12".repeat(32));
    let key = sigil_testkit::signing::Signer::p256();
    let bundle = sigil_testkit::signing::dsse_bundle(&key, &subject);
    let bt = "application/vnd.dev.sigstore.bundle.v0.3+json";
    let m = serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "artifactType": bt,
        "config": {"mediaType": "application/vnd.oci.empty.v1+json", "digest": sha(b"{}"), "size": 2},
        "layers": [{"mediaType": bt, "digest": sha(&bundle), "size": bundle.len()}],
        "subject": {"mediaType": "application/vnd.oci.image.index.v1+json", "digest": subject, "size": 1}
    }))
    .unwrap();
    let index = serde_json::to_vec(&serde_json::json!({"schemaVersion": 2, "manifests": [
        {"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": sha(&m), "size": m.len(), "artifactType": bt}
    ]}))
    .unwrap();
    let mem = MemorySource {
        manifests: [(sha(&m), m.clone())].into_iter().collect(),
        blobs: [(sha(&bundle), bundle.clone())].into_iter().collect(),
        referrers: Some(index),
        ..Default::default()
    };
    let a = signatures_of(&mem, &subject).await;
    assert_eq!(a.cosign.len(), 1, "{:?}", mem.calls());
    let item = a.cosign[0].as_ref().unwrap();
    assert_eq!(item.describe(), "Sigstore bundle, key, no log entry");
    let tag_schema = format!("manifest sha256-{}", "12".repeat(32));
    assert!(
        !mem.calls().contains(&tag_schema),
        "no tag-schema lookup when the API answers: {:?}",
        mem.calls()
    );
}

/// An image arriving while a cold host's first referrers request is out
/// waited for that answer before asking the tag schema: one round trip
/// more for every image of a rollout's first moments (the burst benchmark,
/// docs/benchmarks.md). Now both are asked at once.
#[tokio::test]
async fn regression_an_image_arriving_during_the_referrers_probe_asks_the_tag_schema_meanwhile() {
    let subject = format!("sha256:{}", "ef".repeat(32));
    let (env, m) = notation_referrer(&subject);
    let index = serde_json::to_vec(&serde_json::json!({"schemaVersion": 2, "manifests": [
        {"digest": sha(&m), "artifactType": notation::ARTIFACT_TYPE}
    ]}))
    .unwrap();
    let tag = format!("sha256-{}", "ef".repeat(32));
    let asked = format!("manifest {tag}");
    let answered = format!("answered {subject}");
    let position = |calls: &[String], c: &str| calls.iter().position(|x| x == c);
    // The host turns out to have no API: the tag schema's index is read.
    let no_api = MemorySource {
        manifests: [(sha(&m), m.clone()), (tag.clone(), index.clone())]
            .into_iter()
            .collect(),
        blobs: [(sha(&env), env.clone())].into_iter().collect(),
        learning: true,
        ..Default::default()
    };
    let a = signatures_of(&no_api, &subject).await;
    assert_eq!(a.notation.len(), 1, "{:?}", no_api.calls());
    let calls = no_api.calls();
    assert!(
        position(&calls, &asked) < position(&calls, &answered),
        "the tag schema is asked before the probe answers: {calls:?}"
    );
    // Control: a host with the API answers through it; the tag schema's
    // (here: a different, empty) index is not used.
    let empty = br#"{"schemaVersion":2,"manifests":[]}"#.to_vec();
    let api = MemorySource {
        manifests: [(sha(&m), m.clone()), (tag, empty)].into_iter().collect(),
        blobs: [(sha(&env), env.clone())].into_iter().collect(),
        referrers: Some(index),
        learning: true,
        ..Default::default()
    };
    let a = signatures_of(&api, &subject).await;
    assert_eq!(
        a.notation.len(),
        1,
        "the API's answer wins: {:?}",
        api.calls()
    );
}
