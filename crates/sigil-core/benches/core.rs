//! Criterion benches for the pure decision path: reference parsing, rule
//! matching, and walking + planning + patching a 3-container Pod.
//! Run: `cargo bench -p sigil-core` (prints a table per group).

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use sigil_core::patch::{Replacement, build_patch};
use sigil_core::walker::image_fields;
use sigil_core::{Digest, Policy, Reference};

const POLICY: &str = r#"apiVersion: sigil.dev/v1alpha1
kind: ImagePolicy
spec:
  mirrors:
    - {from: docker.io, to: mirror.internal:5000/dockerhub}
    - {from: quay.io, to: mirror.internal:5000/quay}
  rules:
    - {name: team, match: ["registry.example.com/team/**"], mode: enforce}
    - {name: app, match: ["registry.example.com/team/app:v*"], mode: enforce}
    - {name: blocked, match: ["docker.io/library/busybox"], action: deny}
    - {name: bitnami, match: ["docker.io/bitnami/*"], mode: warn}
    - {name: quay, match: ["quay.io/**"], mode: enforce}
    - {name: internal, match: ["*.internal.example.com/**"], action: allow}
    - {name: everything-else, match: ["**"], mode: warn}
"#;

fn bench_parse(c: &mut Criterion) {
    let mut g = c.benchmark_group("reference_parse");
    for (name, s) in [
        ("short", "nginx"),
        ("tagged", "registry.example.com/team/app:v1.2.3"),
        (
            "digest",
            "localhost:5000/a/b:c@sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
        ),
    ] {
        g.bench_function(name, |b| b.iter(|| Reference::parse(black_box(s))));
    }
    g.finish();
}

fn bench_match(c: &mut Criterion) {
    let p = Policy::from_yaml(POLICY).expect("bench policy");
    let mut g = c.benchmark_group("rule_match");
    for (name, s) in [
        ("literal", "registry.example.com/team/app:v1"),
        (
            "mirror_inverse",
            "mirror.internal:5000/dockerhub/bitnami/redis:7",
        ),
        ("catch_all", "ghcr.io/x/y:z"),
    ] {
        g.bench_function(name, |b| b.iter(|| p.plan(black_box(s))));
    }
    g.finish();
}

fn bench_pod(c: &mut Criterion) {
    let p = Policy::from_yaml(POLICY).expect("bench policy");
    let pod: serde_json::Value = serde_json::json!({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web", "namespace": "shop", "labels": {"app": "web"}},
        "spec": {
            "initContainers": [{"name": "migrate", "image": "registry.example.com/team/migrate:v7"}],
            "containers": [
                {"name": "app", "image": "registry.example.com/team/app:v1", "ports": [{"containerPort": 8080}]},
                {"name": "proxy", "image": "envoyproxy/envoy:v1.30.1"}
            ]
        }
    });
    let d =
        Digest::parse("sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855")
            .expect("digest");
    c.bench_function("walk_plan_patch_3_container_pod", |b| {
        b.iter(|| {
            let fields = image_fields(black_box(&pod));
            let news: Vec<String> = fields
                .iter()
                .filter_map(|f| p.plan(&f.value).ok())
                .map(|pl| pl.final_image(Some(&d)))
                .collect();
            let reps: Vec<Replacement<'_>> = fields
                .iter()
                .zip(&news)
                .map(|(field, new)| Replacement { field, new })
                .collect();
            let patch = build_patch(&reps);
            serde_json::to_vec(&patch).map(|v| v.len())
        })
    });
}

criterion_group!(benches, bench_parse, bench_match, bench_pod);
criterion_main!(benches);
