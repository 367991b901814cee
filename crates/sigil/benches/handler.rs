//! Criterion bench of the whole admission handler on a cached 3-container Pod:
//! parse, walk, plan, (instant) resolve, patch, serialize. This is sigil's own
//! CPU per request, without TLS or the network.

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use sigil::admission::Webhook;
use sigil::engine::Engine;
use sigil_core::{Digest, DigestResolver, Platform, Policy, Reference, ResolveFailure};

struct Cached(Digest);

impl DigestResolver for Cached {
    async fn resolve(
        &self,
        _: &Reference,
        _: Option<&Platform>,
        _: Instant,
    ) -> Result<Digest, ResolveFailure> {
        Ok(self.0.clone())
    }
}

fn body() -> Vec<u8> {
    let containers: Vec<serde_json::Value> = (0..3)
        .map(|i| serde_json::json!({"name": format!("c{i}"), "image": format!("registry.example.com/team/app{i}:v1"), "ports": [{"containerPort": 8080 + i}]}))
        .collect();
    serde_json::to_vec(&serde_json::json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": "bench", "kind": {"group": "", "version": "v1", "kind": "Pod"}, "resource": {"group": "", "version": "v1", "resource": "pods"},
        "operation": "CREATE", "namespace": "bench", "userInfo": {"username": "bench"},
        "object": {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web", "namespace": "bench", "labels": {"app": "web"}}, "spec": {"containers": containers}}}}))
    .expect("json")
}

fn bench(c: &mut Criterion) {
    let policy = Arc::new(Policy::embedded_default());
    let d =
        Digest::parse("sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855")
            .expect("digest");
    let hook = Webhook::new(
        Engine::new(policy, Cached(d)),
        Arc::new(sigil::metrics::Metrics::default()),
    );
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("rt");
    let b = body();
    c.bench_function("admission_review_cached_3_container_pod", |bn| {
        bn.iter(|| {
            let deadline = Instant::now() + Duration::from_secs(9);
            let (out, v) = rt
                .block_on(hook.review(black_box(&b), deadline))
                .expect("review");
            hook.record(&v, Duration::from_micros(1));
            out.len()
        })
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
