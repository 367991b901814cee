//! One verdict from the backstop, on a real API server: the
//! ValidatingAdmissionPolicy `sigil backstop` prints, applied alone (no
//! webhook: what it decides while sigil is down or bypassed), answers every
//! image of a corpus — Docker Hub in each spelling and case, ports,
//! digest-only images under tag patterns, mirrors and their failovers,
//! deny, warn and unmatched — as `sigil_core::backstop::decide` does, and
//! admits what sigil writes (the image pinned at its mirror) for every
//! image sigil admits. A policy of 500 rules and 50 mirrors registers and a
//! Pod of 250 pinned containers under it is admitted (the size and cost
//! findings of the first backstop).

use std::time::{Duration, Instant};

use serde_json::Value;
use sigil_core::backstop::{Verdict, decide};
use sigil_testkit::policies::{self, DIGEST};

use super::namespaces_with_accounts;
use crate::support::kube::real::{RealKube, assets_or_skip};

/// The policy of the corpus: a mirror with failover and fallback, Docker
/// Hub rules, tag patterns, a wildcard registry, deny and warn.
const POLICY: &str = r#"apiVersion: sigil.dev/v1alpha1
kind: ImagePolicy
metadata: {name: cluster}
spec:
  mirrors:
    - {from: "registry.example.com/team", to: ["mirror.example.com/team", "backup.example.com/team"]}
    - {from: "registry.example.com/team/fallback", to: ["mirror.example.com/fb"], fallback: origin}
    - {from: "docker.io/library", to: ["hub.example.com/library"]}
  rules:
    - {name: team, match: ["registry.example.com/team/**"], mode: enforce}
    - {name: tools, match: ["registry.example.com/team/tools/*"], action: allow}
    - {name: legacy, match: ["registry.example.com/legacy/**"], action: deny}
    - {name: soft, match: ["registry.example.com/legacy/soft/**"], action: deny, mode: warn}
    - {name: hub, match: ["docker.io/library/**"], mode: enforce}
    - {name: evil, match: ["docker.io/evil/**"], action: deny}
    - {name: local, match: ["127.0.0.1:*/**", "localhost:*/**"], mode: enforce}
    - {name: releases, match: ["ghcr.io/acme/*:v*", "ghcr.io/acme/*:*-*"], action: deny}
    - {name: acme, match: ["ghcr.io/acme/**"], mode: enforce}
    - {name: corp, match: ["*.corp.example.com/**"], mode: enforce}
"#;

/// Every image of the corpus (`@D` stands for a digest).
const CORPUS: &[&str] = &[
    "nginx",
    "nginx:1.27",
    "nginx@D",
    "library/nginx:1@D",
    "docker.io/nginx:1@D",
    "index.docker.io/library/nginx:1@D",
    "registry-1.docker.io/library/nginx@D",
    "registry.hub.docker.com/library/nginx:1@D",
    "INDEX.DOCKER.IO/library/nginx:1@D",
    "Registry-1.Docker.IO/nginx@D",
    "hub.example.com/library/nginx:1@D",
    "hub.example.com/library/nginx:1",
    "evil/x:1@D",
    "registry-1.docker.io/evil/x@D",
    "REGISTRY.HUB.DOCKER.COM/evil/x@D",
    "registry.example.com/team/app:1",
    "registry.example.com/team/app:1@D",
    "registry.example.com/team/app@D",
    "mirror.example.com/team/app:1@D",
    "mirror.example.com/team/app:1",
    "backup.example.com/team/deep/app@D",
    "backup.example.com/team/app:1",
    "registry.example.com/team/fallback/app:1@D",
    "mirror.example.com/fb/app:1@D",
    "registry.example.com/team/tools/kubectl:1",
    "mirror.example.com/team/tools/kubectl:1",
    "registry.example.com/legacy/x@D",
    "registry.example.com/legacy/soft/x:1@D",
    "Registry.Example.com/team/app:1@D",
    "127.0.0.1:5000/shop/app:1.0",
    "127.0.0.1:5000/shop/app:1.0@D",
    "localhost:5000/app@D",
    "ghcr.io/acme/app@D",
    "ghcr.io/acme/app:v1@D",
    "ghcr.io/acme/app:1-2@D",
    "ghcr.io/acme/app:1@D",
    "ghcr.io/acme/app",
    "a.corp.example.com/x/y:1@D",
    "a.corp.example.com/x/y:1",
    "quay.io/other/x:1@D",
];

/// Waits until the API server enforces the backstop (it loads policies
/// asynchronously): a dry run of a Pod no rule matches is refused.
async fn in_force(kube: &RealKube, ns: &str) {
    let until = Instant::now() + Duration::from_secs(60);
    loop {
        let (status, v) = dry_run(kube, ns, &["quay.io/never/admitted:1".to_owned()]).await;
        if status == 403 {
            return;
        }
        assert!(
            Instant::now() < until,
            "the backstop never came into force: {status} {v}\n{}",
            kube.logs()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn dry_run(kube: &RealKube, ns: &str, images: &[String]) -> (u16, Value) {
    kube.request(
        "POST",
        &format!("/api/v1/namespaces/{ns}/pods?dryRun=All"),
        Some(&policies::pod(ns, "p", images)),
    )
    .await
}

/// `sigil backstop --policy` as a user runs it, applied as printed.
async fn register(kube: &RealKube, policy: &str) -> Vec<Value> {
    let dir = tempfile::tempdir().unwrap();
    let printed = crate::helm::printed_backstop(&dir.path().join("backstop.yaml"), Some(policy));
    kube.apply(&printed).await;
    printed
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regression_docker_hub_spellings_and_digest_only_images_get_sigils_verdict_from_the_backstop_alone()
 {
    let Some(assets) = assets_or_skip(
        "regression_docker_hub_spellings_and_digest_only_images_get_sigils_verdict_from_the_backstop_alone",
    ) else {
        return;
    };
    let kube = RealKube::start(&assets).await;
    register(&kube, POLICY).await;
    namespaces_with_accounts(&kube, &["shop"]).await;
    in_force(&kube, "shop").await;
    let policy = sigil_core::Policy::from_documents_at(POLICY, None).unwrap();
    let mut wrong = Vec::new();
    for image in CORPUS {
        let image = image.replace("@D", &format!("@{DIGEST}"));
        let verdict = decide(&policy, &image).unwrap_or_else(|| panic!("{image}: no verdict"));
        let (status, v) = dry_run(&kube, "shop", std::slice::from_ref(&image)).await;
        let refused = status == 403;
        let expected = matches!(verdict, Verdict::Refuse { .. });
        if refused != expected {
            wrong.push(format!(
                "{image}: sigil {verdict:?}, API server {status} {}",
                v["message"]
            ));
        }
        if let Verdict::Warn { .. } = verdict {
            // (Warnings come back in a header: the verdict is admit.)
            assert_eq!(status, 201, "{image}: {v}");
        }
        // What sigil writes for an image it admits (its plan's target,
        // pinned) is admitted too.
        if let Ok(plan) = policy.plan(&image)
            && !matches!(plan.step, sigil_core::Step::Deny)
        {
            let digest = sigil_core::Digest::parse(DIGEST).unwrap();
            let written = plan.target.pinned_string(&digest);
            if matches!(decide(&policy, &written), Some(Verdict::Refuse { .. })) {
                wrong.push(format!(
                    "{image}: sigil writes {written}, which its backstop refuses"
                ));
            }
            let (status, v) = dry_run(&kube, "shop", std::slice::from_ref(&written)).await;
            if status != 201 {
                wrong.push(format!(
                    "{image}: sigil writes {written}; API server {status} {}",
                    v["message"]
                ));
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regression_a_policy_of_500_rules_and_50_mirrors_registers_and_admits_a_pod_of_250_pinned_images()
 {
    let Some(assets) = assets_or_skip(
        "regression_a_policy_of_500_rules_and_50_mirrors_registers_and_admits_a_pod_of_250_pinned_images",
    ) else {
        return;
    };
    let kube = RealKube::start(&assets).await;
    let text = policies::large(500, 50);
    register(&kube, &text).await;
    namespaces_with_accounts(&kube, &["shop"]).await;
    in_force(&kube, "shop").await;
    let images = policies::admitted_images(500, 50, 250);
    let policy = sigil_core::Policy::from_documents_at(&text, None).unwrap();
    for i in &images {
        assert!(
            !matches!(decide(&policy, i), Some(Verdict::Refuse { .. })),
            "{i}: sigil refuses it"
        );
    }
    let (status, v) = dry_run(&kube, "shop", &images).await;
    assert_eq!(status, 201, "250 pinned images: {status} {}", v["message"]);
    // One of them unpinned: refused, naming it.
    let mut one_off = images.clone();
    one_off[0] = one_off[0].split('@').next().unwrap().to_owned();
    let (status, v) = dry_run(&kube, "shop", &one_off).await;
    assert_eq!(status, 403, "{v}");
    let message = v["message"].as_str().unwrap_or_default();
    assert!(
        message.contains(&format!("{} has no digest", one_off[0])),
        "{message}"
    );
    assert!(
        message.contains("whether or not the webhook images.sigil.dev is healthy"),
        "{message}"
    );
}

/// At the edge of the documented envelope (`backstop::MAX_CROWD` patterns
/// tested per image, `ENVELOPE_IMAGES` images of `MAX_IMAGE_CHARS`
/// characters, each image matching one pattern's literal text so its
/// regular expression runs): the API server admits, never refusing for
/// cost what sigil admits (the first backstop refused a 50-image Pod under
/// 120 rules: "actual cost limit exceeded").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regression_at_the_cost_envelopes_edge_a_pod_is_never_refused_for_cost() {
    use sigil_core::backstop::{ENVELOPE_IMAGES, MAX_CROWD, MAX_IMAGE_CHARS};
    let Some(assets) =
        assets_or_skip("regression_at_the_cost_envelopes_edge_a_pod_is_never_refused_for_cost")
    else {
        return;
    };
    let kube = RealKube::start(&assets).await;
    let mut text = String::from(
        "apiVersion: sigil.dev/v1alpha1\nkind: ImagePolicy\nmetadata: {name: cluster}\nspec:\n  rules:\n",
    );
    for i in 0..MAX_CROWD {
        text.push_str(&format!(
            "    - {{name: wild-{i}, match: [\"*.ecr{i}.example.com/**/app-*\"], mode: enforce}}\n"
        ));
    }
    let policy = sigil_core::Policy::from_documents_at(&text, None).unwrap();
    assert_eq!(sigil_core::backstop::crowd(&policy), MAX_CROWD);
    register(&kube, &text).await;
    namespaces_with_accounts(&kube, &["shop"]).await;
    in_force(&kube, "shop").await;
    let images: Vec<String> = (0..ENVELOPE_IMAGES)
        .map(|k| {
            let head = format!("a{k}.ecr{}.example.com/", k % MAX_CROWD);
            let tail = format!("/app-{k}:1@{DIGEST}");
            let pad = MAX_IMAGE_CHARS.saturating_sub(head.len() + tail.len() + 2);
            format!("{head}p{}{tail}", "x".repeat(pad))
        })
        .collect();
    assert!(images.iter().all(|i| i.len() <= MAX_IMAGE_CHARS + 1));
    for i in &images {
        assert_eq!(decide(&policy, i), Some(Verdict::Ok), "{i}");
    }
    let (status, v) = dry_run(&kube, "shop", &images).await;
    assert_eq!(status, 201, "{status} {}", v["message"]);
}
