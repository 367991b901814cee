//! The whole admission handler: bytes in, an AdmissionReview or a 400 out,
//! never a panic. Digests come from the test kit's resolver, which answers at once, so the
//! fuzzer explores parsing, walking, planning and patch building.
#![no_main]

use std::sync::{Arc, LazyLock};
use std::time::{Duration, Instant};

use libfuzzer_sys::fuzz_target;
use sigil::admission::Webhook;
use sigil::engine::Engine;
use sigil_core::Policy;
use sigil_testkit::resolver::FakeResolver;

const POLICY: &str = r#"apiVersion: sigil.dev/v1alpha1
kind: ImagePolicy
spec:
  mirrors: [{from: docker.io, to: mirror.local/hub}]
  rules:
    - {name: team, match: ["registry.example.com/**"], mode: enforce}
    - {name: blocked, match: ["docker.io/library/busybox"], action: deny}
    - {name: free, match: ["quay.io/**"], action: allow}
    - {name: rest, match: ["**"], mode: warn}
  exemptNamespaces: [kube-system]
"#;

static RT: LazyLock<tokio::runtime::Runtime> = LazyLock::new(|| tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap());
static HOOK: LazyLock<Webhook<FakeResolver>> = LazyLock::new(|| {
    let policy = Arc::new(Policy::from_yaml(POLICY).unwrap());
    Webhook::new(Engine::new(policy, FakeResolver::new()), Arc::new(sigil::metrics::Metrics::default()))
});

fuzz_target!(|data: &[u8]| {
    let deadline = Instant::now() + Duration::from_secs(5);
    if let Ok((bytes, _)) = RT.block_on(HOOK.review(data, deadline)) {
        let v: serde_json::Value = serde_json::from_slice(&bytes).expect("answer is JSON");
        assert!(v["response"]["uid"].is_string());
    }
});
