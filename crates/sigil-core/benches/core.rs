//! Criterion benches for the pure decision path: reference parsing, rule
//! matching, walking + planning + patching a 3-container Pod, and three
//! attestation conditions over a SLSA v1 statement.
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

fn bench_conditions(c: &mut Criterion) {
    use sigil_core::attest::{Condition, Evidence, Statement, evaluate};
    let digest = format!("sha256:{}", "ab".repeat(32));
    let statement = serde_json::to_vec(&serde_json::json!({
        "_type": "https://in-toto.io/Statement/v1",
        "subject": [{"name": "registry.example.com/team/app", "digest": {"sha256": "ab".repeat(32)}}],
        "predicateType": "https://slsa.dev/provenance/v1",
        "predicate": {
            "buildDefinition": {
                "buildType": "https://actions.github.io/buildtypes/workflow/v1",
                "externalParameters": {"workflow": {"ref": "refs/heads/main", "repository": "https://github.com/acme/api", "path": ".github/workflows/release.yml"}},
                "internalParameters": {"github": {"event_name": "push", "repository_id": "123", "repository_owner_id": "456"}},
                "resolvedDependencies": [{"uri": "git+https://github.com/acme/api@refs/heads/main", "digest": {"gitCommit": "0123456789abcdef0123456789abcdef01234567"}}]
            },
            "runDetails": {
                "builder": {"id": "https://github.com/actions/runner/github-hosted"},
                "metadata": {"invocationId": "https://github.com/acme/api/actions/runs/1/attempts/1"}
            }
        }
    }))
    .expect("statement");
    let st = Statement::parse(&statement, 1 << 20).expect("statement");
    let conditions: Vec<Condition> = [
        r#"predicate.buildDefinition.externalParameters.workflow.repository == "https://github.com/acme/api""#,
        r#"signer.sourceRepositoryRef in ["refs/heads/main"] || signer.sourceRepositoryRef.startsWith("refs/tags/v")"#,
        r#"predicate.runDetails.builder.id == "https://github.com/actions/runner/github-hosted""#,
    ]
    .iter()
    .map(|e| Condition::compile(e, None).expect("condition"))
    .collect();
    let signer = std::collections::BTreeMap::from([
        (
            "sourceRepositoryRef".to_owned(),
            "refs/heads/main".to_owned(),
        ),
        (
            "sourceRepositoryUri".to_owned(),
            "https://github.com/acme/api".to_owned(),
        ),
        (
            "issuer".to_owned(),
            "https://token.actions.githubusercontent.com".to_owned(),
        ),
    ]);
    c.bench_function("attest_three_conditions_slsa_v1", |b| {
        b.iter(|| {
            let ev = Evidence {
                statement: &st,
                digest: &digest,
                signer: &signer,
                image: None,
                timestamps: &[1_763_900_000],
            };
            let r = evaluate(black_box(&conditions), &ev, 1_763_900_060);
            assert!(r.iter().all(|c| c.holds()));
        })
    });
}

criterion_group!(
    benches,
    bench_parse,
    bench_match,
    bench_pod,
    bench_conditions
);
criterion_main!(benches);
