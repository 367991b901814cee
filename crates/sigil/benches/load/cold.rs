//! The cold rows: Pods whose three images sigil has never seen (one
//! registry round trip per image, concurrently, and single-flight), the same
//! with signature verification, and the registry's own floor for both,
//! measured directly with the same requests.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;
use sigil_testkit::registry::TestRegistry;
use sigil_testkit::review::pod_review_bytes as review;

use crate::client::{Stats, drive};
use crate::side::Target;

pub struct Cold {
    pub cold: Stats,
    pub cold_requests: u64,
    pub cold_verified: Stats,
    pub cold_verified_requests: u64,
    /// One HEAD, sorted.
    pub reg_lat: Vec<Duration>,
    /// Three concurrent HEADs, sorted.
    pub reg_lat3: Vec<Duration>,
    /// The cold verified Pod's requests issued directly, sorted.
    pub floor: Vec<Duration>,
}

pub async fn run(
    registry: &TestRegistry,
    sigil: &Target,
    admin_port: u16,
    cold_pods: usize,
) -> Cold {
    let http = reqwest::Client::new();
    let reg = registry.host();
    let cold_tags = cold_pods * 3;
    let (sigil_addr, tls) = (sigil.addr, sigil.tls.clone());
    // Registry's own round trip for one HEAD, measured directly.
    let mut reg_lat = Vec::new();
    for i in 0..50 {
        let t = Instant::now();
        let _ = http
            .head(format!(
                "http://{reg}/v2/bench/cold/manifests/c{}",
                i % cold_tags.max(1)
            ))
            .header("accept", "application/vnd.oci.image.manifest.v1+json")
            .send()
            .await;
        reg_lat.push(t.elapsed());
    }
    reg_lat.sort();
    // And for three HEADs at once (what one cold 3-image Pod needs): the time
    // until the slowest answers. This is the floor for a cold Pod.
    let mut reg_lat3 = Vec::new();
    for i in 0..50 {
        let t = Instant::now();
        let heads = (0..3).map(|k| {
            http.head(format!(
                "http://{reg}/v2/bench/cold/manifests/c{}",
                (i * 3 + k) % cold_tags.max(1)
            ))
            .header("accept", "application/vnd.oci.image.manifest.v1+json")
            .send()
        });
        let _ = futures_util::future::join_all(heads).await;
        reg_lat3.push(t.elapsed());
    }
    reg_lat3.sort();

    // Cold: every pod has 3 images never seen before.
    let before = crate::metric_sum(admin_port, "sigil_registry_requests_total").await;
    let cold_bodies: Vec<Vec<u8>> = (0..cold_pods)
        .map(|p| {
            review(&[
                &format!("{reg}/bench/cold:c{}", p * 3),
                &format!("{reg}/bench/cold:c{}", p * 3 + 1),
                &format!("{reg}/bench/cold:c{}", p * 3 + 2),
            ])
        })
        .collect();
    let cold_bodies = Arc::new(cold_bodies);
    let cb = cold_bodies.clone();
    let cold = drive(sigil_addr, tls.clone(), 1, cold_pods, move |i| {
        cb[i].clone()
    })
    .await;
    let after = crate::metric_sum(admin_port, "sigil_registry_requests_total").await;
    let cold_requests = after - before;

    // Cold verified: three new signed images per pod (resolve + gather + verify each).
    let before = crate::metric_sum(admin_port, "sigil_registry_requests_total").await;
    let signed_cold: Arc<Vec<Vec<u8>>> = Arc::new(
        (0..cold_pods)
            .map(|p| {
                review(&[
                    &format!("{reg}/bench/signedcold:c{}", p * 3),
                    &format!("{reg}/bench/signedcold:c{}", p * 3 + 1),
                    &format!("{reg}/bench/signedcold:c{}", p * 3 + 2),
                ])
            })
            .collect(),
    );
    let sc = signed_cold.clone();
    let cold_verified = drive(sigil_addr, tls.clone(), 1, cold_pods, move |i| {
        sc[i].clone()
    })
    .await;
    let cold_verified_requests =
        crate::metric_sum(admin_port, "sigil_registry_requests_total").await - before;

    // The registry floor for one cold verified pod: the same requests with the
    // same dependencies, issued directly (3 HEADs; then per image the .sig
    // manifest and the tag-schema index; then the payload blobs).
    let mut floor = Vec::new();
    for p in 0..cold_pods.min(50) {
        let tags: Vec<String> = (0..3).map(|k| format!("c{}", p * 3 + k)).collect();
        let t = Instant::now();
        let heads = futures_util::future::join_all(tags.iter().map(|tag| {
            http.head(format!("http://{reg}/v2/bench/signedcold/manifests/{tag}"))
                .header("accept", "application/vnd.oci.image.manifest.v1+json")
                .send()
        }))
        .await;
        let digests: Vec<String> = heads
            .into_iter()
            .map(|r| {
                r.expect("head").headers()["docker-content-digest"]
                    .to_str()
                    .expect("digest")
                    .to_owned()
            })
            .collect();
        let sigs = futures_util::future::join_all(digests.iter().flat_map(|d| {
            let tag = d.replace(':', "-");
            [format!("{tag}.sig"), tag].map(|t| {
                http.get(format!("http://{reg}/v2/bench/signedcold/manifests/{t}"))
                    .header("accept", "application/vnd.oci.image.manifest.v1+json, application/vnd.oci.image.index.v1+json")
                    .send()
            })
        }))
        .await;
        let mut blobs = Vec::new();
        for r in sigs.into_iter().flatten() {
            if r.status() == 200 {
                let v: Value =
                    serde_json::from_slice(&r.bytes().await.expect("body")).unwrap_or(Value::Null);
                if let Some(d) = v.pointer("/layers/0/digest").and_then(Value::as_str) {
                    blobs.push(d.to_owned());
                }
            }
        }
        futures_util::future::join_all(blobs.iter().map(|b| {
            http.get(format!("http://{reg}/v2/bench/signedcold/blobs/{b}"))
                .send()
        }))
        .await;
        floor.push(t.elapsed());
    }
    floor.sort();

    Cold {
        cold,
        cold_requests,
        cold_verified,
        cold_verified_requests,
        reg_lat,
        reg_lat3,
        floor,
    }
}
