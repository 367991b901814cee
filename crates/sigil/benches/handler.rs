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
use sigil_core::credentials::{Auths, Credential, SecretAuths, StaticStore};
use sigil_core::{Digest, Policy};
use sigil_testkit::artifacts::MemorySource;
use sigil_testkit::registry::sha256;
use sigil_testkit::resolver::FakeResolver;
use sigil_testkit::signing::{Layer, Signer, legacy_manifest, simple_signing};

/// A policy verifying `registry.example.com/team/**` with a fresh P-256 key,
/// and a source holding that key's signature over `digest`.
fn signed(digest: &Digest, dir: &std::path::Path) -> (Policy, MemorySource) {
    let key = Signer::p256();
    let key_path = dir.join("k.pub");
    std::fs::write(&key_path, key.public_pem()).expect("key file");
    let payload = simple_signing("x", digest.as_str());
    let layer = Layer::new(payload.clone(), &key.sign(&payload));
    let pd = sha256(&payload);
    let manifest = legacy_manifest((&sha256(b"{}"), 2), &[(pd.clone(), &layer)]);
    let policy = Policy::from_yaml(&format!(
        "apiVersion: sigil.dev/v1alpha1\nkind: ImagePolicy\nspec:\n  rules:\n    - name: team\n      match: [\"registry.example.com/team/**\"]\n      verify:\n        - {{name: ci, cosign: {{key: \"{}\"}}}}\n    - {{name: rest, match: [\"**\"], mode: warn}}\n",
        key_path.display()
    ))
    .expect("policy");
    let source = MemorySource {
        manifests: [(
            format!("{}.sig", digest.as_str().replace(':', "-")),
            manifest,
        )]
        .into_iter()
        .collect(),
        blobs: [(pd, payload)].into_iter().collect(),
        ..MemorySource::default()
    };
    (policy, source)
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

    // The same Pod naming an imagePullSecret held by the watches: the
    // object's keyring is built and looked up per request.
    let mut store = StaticStore::default();
    let auths: SecretAuths = Arc::new(Auths::new(&[(
        "registry.example.com".to_owned(),
        Credential::basic("robot", "pa55"),
    )]));
    store.add_secret("bench", "regcred", auths);
    let phook = Webhook::new(
        Engine::new(
            Arc::new(Policy::embedded_default()),
            FakeResolver::fixed(d.clone()),
        )
        .with_pull_secrets(Arc::new(store)),
        Arc::new(sigil::metrics::Metrics::default()),
    );
    let mut review: serde_json::Value = serde_json::from_slice(&b).expect("json");
    review["request"]["object"]["spec"]["imagePullSecrets"] =
        serde_json::json!([{"name": "regcred"}]);
    let pb = serde_json::to_vec(&review).expect("json");
    c.bench_function(
        "admission_review_cached_3_container_pod_pull_secret",
        |bn| {
            bn.iter(|| {
                let deadline = Instant::now() + Duration::from_secs(9);
                let (out, v) = rt
                    .block_on(phook.review(black_box(&pb), deadline))
                    .expect("review");
                phook.record(&v, Duration::from_micros(1));
                out.len()
            })
        },
    );
}

/// 100 ClusterImagePolicy rules (some limited by namespaceSelector) and
/// 1,000 namespaces with an ImagePolicy each, the request's among them.
fn many_policies() -> Policy {
    let mut text = String::from(
        "apiVersion: sigil.dev/v1alpha1\nkind: ClusterImagePolicy\nmetadata: {name: platform}\nspec:\n  rules:\n    - {name: rest, match: [\"**\"], mode: warn}\n",
    );
    for i in 0..100 {
        text.push_str(&format!(
            "    - {{name: svc{i}, match: [\"registry.example.com/svc{i}/**\"]{}}}\n",
            if i % 4 == 0 {
                ", namespaceSelector: {matchLabels: {tier: prod}}"
            } else {
                ""
            }
        ));
    }
    for i in 0..1000 {
        let ns = if i == 0 {
            "bench".to_owned()
        } else {
            format!("team-{i}")
        };
        text.push_str(&format!(
            "---\napiVersion: sigil.dev/v1alpha1\nkind: ImagePolicy\nmetadata: {{name: team, namespace: {ns}}}\nspec:\n  rules:\n    - {{name: no-debug, match: [\"registry.example.com/team/debug\"], action: deny}}\n    - {{name: ours, match: [\"registry.example.com/team/**\"]}}\n"
        ));
    }
    Policy::from_documents(&text).expect("many policies")
}

/// The cached decision under [`many_policies`]: within 10 % of the plain
/// cached decision is the target (docs/benchmarks.md).
fn bench_many(c: &mut Criterion) {
    let d =
        Digest::parse("sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855")
            .expect("digest");
    let hook = Webhook::new(
        Engine::new(Arc::new(many_policies()), FakeResolver::fixed(d)),
        Arc::new(sigil::metrics::Metrics::default()),
    );
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("rt");
    let b = body();
    let (out, _) = rt
        .block_on(hook.review(&b, Instant::now() + Duration::from_secs(9)))
        .expect("review");
    let answer: serde_json::Value = serde_json::from_slice(&out).expect("json");
    assert_eq!(answer["response"]["allowed"], true, "{answer}");
    c.bench_function(
        "admission_review_cached_3_container_pod_100_cluster_rules_1000_team_policies",
        |bn| {
            bn.iter(|| {
                let deadline = Instant::now() + Duration::from_secs(9);
                let (out, v) = rt
                    .block_on(hook.review(black_box(&b), deadline))
                    .expect("review");
                hook.record(&v, Duration::from_micros(1));
                out.len()
            })
        },
    );
}

criterion_group!(benches, bench, bench_many);
criterion_main!(benches);
