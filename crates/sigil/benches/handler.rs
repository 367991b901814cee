//! Criterion bench of the whole admission handler on a cached 3-container Pod:
//! parse, walk, plan, (instant) resolve, patch, serialize. This is sigil's own
//! CPU per request, without TLS or the network. The `_verified` variant runs
//! the same Pod under a rule with a cosign key verifier whose outcomes are in
//! the verification cache: the difference is what a cached verified decision
//! costs (the load benchmark shows the same at p99 over HTTPS).

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use sigil::admission::Webhook;
use sigil::engine::Engine;
use sigil_core::{ArtifactSource, Digest, Policy, Reference, ResolveFailure};
use sigil_testkit::resolver::FakeResolver;

/// Serves one legacy cosign signature for any digest asked about: an
/// in-process stand-in, only to warm the cache before measuring hits.
struct Signed {
    manifest: Vec<u8>,
    payloads: std::collections::HashMap<String, Vec<u8>>,
}

impl ArtifactSource for Signed {
    async fn manifest(
        &self,
        _: &Reference,
        r: &str,
        _: Instant,
    ) -> Result<Option<Vec<u8>>, ResolveFailure> {
        Ok(r.ends_with(".sig").then(|| self.manifest.clone()))
    }
    async fn referrers(
        &self,
        _: &Reference,
        _: &Digest,
        _: Instant,
    ) -> Result<Option<Vec<u8>>, ResolveFailure> {
        Ok(None)
    }
    async fn blob(
        &self,
        _: &Reference,
        d: &Digest,
        _: usize,
        _: Instant,
    ) -> Result<Vec<u8>, ResolveFailure> {
        self.payloads
            .get(d.as_str())
            .cloned()
            .ok_or(ResolveFailure::NotFound {
                detail: "blob".into(),
            })
    }
}

/// A policy verifying `registry.example.com/team/**` with a fresh P-256 key,
/// and a source holding that key's signature over `digest`.
fn signed(digest: &Digest, dir: &std::path::Path) -> (Policy, Signed) {
    use aws_lc_rs::encoding::AsDer;
    use aws_lc_rs::signature::{ECDSA_P256_SHA256_ASN1_SIGNING, EcdsaKeyPair, KeyPair};
    use base64::Engine as _;
    use sha2::Digest as _;
    let b64 = base64::engine::general_purpose::STANDARD;
    let key = EcdsaKeyPair::generate(&ECDSA_P256_SHA256_ASN1_SIGNING).expect("key");
    let pem = format!(
        "-----BEGIN PUBLIC KEY-----\n{}\n-----END PUBLIC KEY-----\n",
        b64.encode(key.public_key().as_der().expect("spki").as_ref())
    );
    let key_path = dir.join("k.pub");
    std::fs::write(&key_path, pem).expect("key file");
    let payload = serde_json::to_vec(&serde_json::json!({"critical": {"identity": {"docker-reference": "x"}, "image": {"docker-manifest-digest": digest.as_str()}, "type": "cosign container image signature"}, "optional": null})).expect("json");
    let sig = key
        .sign(&aws_lc_rs::rand::SystemRandom::new(), &payload)
        .expect("sign");
    let pd = format!("sha256:{:x}", sha2::Sha256::digest(&payload));
    let manifest = serde_json::to_vec(&serde_json::json!({"schemaVersion": 2, "layers": [
        {"mediaType": "application/vnd.dev.cosign.simplesigning.v1+json", "digest": pd, "size": payload.len(),
         "annotations": {"dev.cosignproject.cosign/signature": b64.encode(sig.as_ref())}}]})).expect("json");
    let policy = Policy::from_yaml(&format!(
        "apiVersion: sigil.dev/v1alpha1\nkind: ImagePolicy\nspec:\n  rules:\n    - name: team\n      match: [\"registry.example.com/team/**\"]\n      verify:\n        - {{name: ci, cosign: {{key: \"{}\"}}}}\n    - {{name: rest, match: [\"**\"], mode: warn}}\n",
        key_path.display()
    ))
    .expect("policy");
    (
        policy,
        Signed {
            manifest,
            payloads: [(pd, payload)].into_iter().collect(),
        },
    )
}

fn body() -> Vec<u8> {
    sigil_testkit::review::pod_review_bytes(&[
        "registry.example.com/team/app0:v1",
        "registry.example.com/team/app1:v1",
        "registry.example.com/team/app2:v1",
    ])
}

fn bench(c: &mut Criterion) {
    let policy = Arc::new(Policy::embedded_default());
    let d =
        Digest::parse("sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855")
            .expect("digest");
    let hook = Webhook::new(
        Engine::new(policy, FakeResolver::fixed(d.clone())),
        Arc::new(sigil::metrics::Metrics::default()),
    );
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("rt");
    let b = body();
    let run = |hook: &Webhook<FakeResolver>| {
        let deadline = Instant::now() + Duration::from_secs(9);
        let (out, v) = rt
            .block_on(hook.review(black_box(&b), deadline))
            .expect("review");
        hook.record(&v, Duration::from_micros(1));
        out.len()
    };
    c.bench_function("admission_review_cached_3_container_pod", |bn| {
        bn.iter(|| run(&hook))
    });

    let dir = tempfile::tempdir().expect("tmp");
    let (vpolicy, source) = signed(&d, dir.path());
    let metrics = Arc::new(sigil::metrics::Metrics::default());
    let material = sigil_verify::Material::load(&vpolicy).expect("material");
    let verifier =
        sigil_verify::Verifier::new(source, material, Default::default(), metrics.clone());
    let vhook = Webhook::new(
        Engine::new(Arc::new(vpolicy), FakeResolver::fixed(d.clone()))
            .with_verifier(Arc::new(verifier)),
        metrics,
    );
    // Warm the verification cache, and check the bench measures admissions.
    let (out, _) = rt
        .block_on(vhook.review(&b, Instant::now() + Duration::from_secs(9)))
        .expect("review");
    let answer: serde_json::Value = serde_json::from_slice(&out).expect("json");
    assert_eq!(answer["response"]["allowed"], true, "{answer}");
    assert!(
        answer["response"]["auditAnnotations"]["verified"].is_string(),
        "{answer}"
    );
    c.bench_function("admission_review_cached_3_container_pod_verified", |bn| {
        bn.iter(|| run(&vhook))
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
