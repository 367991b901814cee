//! AdmissionReview builders (what kube-apiserver sends), the captured
//! fixtures, and the check that a patched object still decodes as its
//! Kubernetes type.

use std::path::PathBuf;

use serde_json::{Value, json};

/// The captured AdmissionReview fixtures (from connaisseur, Apache-2.0),
/// kept in the sigil crate's `tests/fixtures/admission_requests`.
pub fn fixtures_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../sigil/tests/fixtures/admission_requests")
}

/// A fixture, parsed.
pub fn fixture(name: &str) -> Value {
    let p = fixtures_dir().join(name);
    serde_json::from_slice(&std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display())))
        .unwrap()
}

/// A fixture's bytes.
pub fn fixture_bytes(name: &str) -> Vec<u8> {
    std::fs::read(fixtures_dir().join(name)).unwrap()
}

/// A v1 AdmissionReview for `object`, with a fresh uid.
pub fn review(operation: &str, namespace: &str, object: Value) -> Value {
    let kind = object["kind"].as_str().unwrap_or("Pod").to_string();
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": format!("uid-{}", crate::registry::uniq()),
            "kind": {"group": "", "version": "v1", "kind": kind},
            "resource": {"group": "", "version": "v1", "resource": format!("{}s", kind.to_lowercase())},
            "operation": operation,
            "namespace": namespace,
            "userInfo": {"username": "test"},
            "object": object,
            "dryRun": false
        }
    })
}

/// A Pod named `name` in `default`, one container `c<i>` per image.
pub fn pod(name: &str, images: &[&str]) -> Value {
    let containers: Vec<Value> = images
        .iter()
        .enumerate()
        .map(|(i, im)| json!({"name": format!("c{i}"), "image": im}))
        .collect();
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"}, "spec": {"containers": containers}})
}

/// The benchmarks' request: a CREATE of Pod `bench/web` whose containers
/// carry these images (with ports and labels, ~1.5 KB per container, like a
/// real Pod), as the bytes kube-apiserver sends.
pub fn pod_review_bytes(images: &[&str]) -> Vec<u8> {
    let containers: Vec<Value> = images
        .iter()
        .enumerate()
        .map(|(i, im)| json!({"name": format!("c{i}"), "image": im, "ports": [{"containerPort": 8080 + i}]}))
        .collect();
    serde_json::to_vec(&json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": "bench", "kind": {"group": "", "version": "v1", "kind": "Pod"}, "resource": {"group": "", "version": "v1", "resource": "pods"},
        "operation": "CREATE", "namespace": "bench", "userInfo": {"username": "bench"},
        "object": {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web", "namespace": "bench", "labels": {"app": "web"}}, "spec": {"containers": containers}}}}))
    .unwrap()
}

/// A captured kube-apiserver Pod CREATE (fixture `02_pod.json`: user info,
/// managed fields, service-account volume, tolerations) whose one container
/// is repeated once per image (`c<i>`), as the bytes kube-apiserver sends:
/// what the load benchmark sends (~4.5 KB for three images).
pub fn captured_pod_review_bytes(images: &[&str]) -> Vec<u8> {
    let mut review = fixture("02_pod.json");
    let spec = &mut review["request"]["object"]["spec"];
    let template = spec["containers"][0].clone();
    spec["containers"] = images
        .iter()
        .enumerate()
        .map(|(i, im)| {
            let mut c = template.clone();
            c["name"] = format!("c{i}").into();
            c["image"] = (*im).into();
            c
        })
        .collect();
    serde_json::to_vec(&review).unwrap()
}

/// Panics unless the patched `obj` still decodes as its Kubernetes type.
pub fn assert_decodes(obj: &Value) {
    if let Err(e) = decodes(obj) {
        panic!("patched {} no longer decodes: {e}\n{obj:#}", obj["kind"]);
    }
}

/// Decodes `obj` as its Kubernetes type (fixtures may be trimmed captures
/// that never decoded; only a decoding object must keep decoding).
pub fn decodes(obj: &Value) -> Result<(), serde_json::Error> {
    use k8s_openapi::api::{apps::v1 as apps, batch::v1 as batch, core::v1 as core};
    let kind = obj["kind"].as_str().unwrap_or_default();
    let mut o = obj.clone();
    let fix = |o: &mut Value, av: &str| o["apiVersion"] = json!(av);

    match kind {
        "Pod" => serde_json::from_value::<core::Pod>(o).map(|_| ()),
        "PodTemplate" => serde_json::from_value::<core::PodTemplate>(o).map(|_| ()),
        "ReplicationController" => {
            serde_json::from_value::<core::ReplicationController>(o).map(|_| ())
        }
        "Deployment" => {
            fix(&mut o, "apps/v1");
            serde_json::from_value::<apps::Deployment>(o).map(|_| ())
        }
        "ReplicaSet" => {
            fix(&mut o, "apps/v1");
            serde_json::from_value::<apps::ReplicaSet>(o).map(|_| ())
        }
        "DaemonSet" => serde_json::from_value::<apps::DaemonSet>(o).map(|_| ()),
        "StatefulSet" => serde_json::from_value::<apps::StatefulSet>(o).map(|_| ()),
        "Job" => serde_json::from_value::<batch::Job>(o).map(|_| ()),
        "CronJob" => {
            fix(&mut o, "batch/v1");
            serde_json::from_value::<batch::CronJob>(o).map(|_| ())
        }
        _ => Ok(()),
    }
}

/// A review body made ready for [`number_object`]: its object's
/// `generateName` (eight characters before the trailing `-`), or its name
/// `web` made `web-00000000`; and where those eight characters end.
pub fn numberable(body: &[u8]) -> (Vec<u8>, usize) {
    let find = |b: &[u8], n: &[u8]| b.windows(n.len()).position(|w| w == n);
    let g = b"\"generateName\":\"";
    if let Some(at) = find(body, g).map(|a| a + g.len()) {
        let close = at + find(&body[at..], b"\"").expect("closing quote");
        assert!(
            close >= at + 9 && body[close - 1] == b'-',
            "generateName too short"
        );
        return (body.to_vec(), close - 1);
    }
    let n = b"\"name\":\"web\"";
    let at = find(body, n).expect("a generateName or an object named web");
    let mut b = body[..at].to_vec();
    b.extend_from_slice(b"\"name\":\"web-00000000");
    let end = b.len();
    b.extend_from_slice(&body[at + n.len() - 1..]);
    (b, end)
}

/// Writes `n` as eight hex digits ending at `end` ([`numberable`]): each
/// number a different object, which sigil decides rather than reuses.
pub fn number_object(body: &mut [u8], end: usize, n: u32) {
    for (i, d) in body[end - 8..end].iter_mut().enumerate() {
        *d = b"0123456789abcdef"[((n >> (28 - 4 * i)) & 15) as usize];
    }
}
