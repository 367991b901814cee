//! Tests of the crate root: the lookup path's shape.

use super::*;

fn size_of_future<F: std::future::Future>(_: &F) -> usize {
    std::mem::size_of::<F>()
}

/// A cached admission makes one lookup future per image and moves it
/// into a join; with the miss (single-flight, the registry round trip)
/// and the credential helpers inline that future was 8 KiB, copied
/// per image (an eighth of an audit's instructions). The miss and the
/// helpers are boxed now; this holds the hit's future small.
#[test]
fn a_cached_lookups_future_stays_small() {
    let registry = Registry::new(
        &[],
        CacheConfig::default(),
        Arc::new(NoObserver),
        Arc::default(),
        Default::default(),
        Default::default(),
    )
    .expect("registry");
    let target = Reference::parse("example.com/a:b").expect("reference");
    let creds = PullCredentials::default();
    let lookup = DigestResolver::resolve(&registry, &target, None, &creds, Instant::now());
    let size = size_of_future(&lookup);
    assert!(size <= 1024, "the lookup's future is {size} bytes");
}

/// Counts requests by (method, status).
#[derive(Default)]
struct Counted(std::sync::Mutex<Vec<(String, String)>>);

impl Observer for Counted {
    fn request(&self, _: &str, method: &str, status: &str, _: Duration) {
        self.0
            .lock()
            .unwrap()
            .push((method.to_owned(), status.to_owned()));
    }
    fn cache(&self, _: bool) {}
    fn credential(&self, _: &str) {}
}

/// A burst of never-seen images on a Basic-auth registry paid a 401 round
/// trip per request: each went anonymously, was challenged, and went again
/// with credentials. Now the first request is the host's probe (its 401
/// says Basic; single-flighted: the burst's other lookups wait for it) and
/// every other request carries the credentials the host asked for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regression_a_burst_to_a_basic_auth_registry_pays_one_challenge_not_one_per_request() {
    use sigil_testkit::registry::{Mode, TestRegistry};
    let reg = TestRegistry::start(Mode::Htpasswd {
        user: "alice",
        password: "s3cret",
    })
    .await;
    let mut digests = Vec::new();
    for i in 0..20 {
        digests.push(reg.push_image("burst/app", &format!("t{i}")).await);
    }
    let dir = tempfile::tempdir().expect("tmp");
    let password = dir.path().join("password");
    std::fs::write(&password, "s3cret").expect("password");
    let spec: RegistrySpec = serde_json::from_value(serde_json::json!({
        "host": reg.host(), "insecure": true,
        "auth": {"username": "alice", "passwordFile": password.display().to_string()}}))
    .expect("spec");
    let seen = Arc::new(Counted::default());
    let registry = Registry::new(
        &[spec],
        CacheConfig::default(),
        seen.clone(),
        Arc::default(),
        Default::default(),
        Default::default(),
    )
    .expect("registry");
    let creds = PullCredentials::default();
    let deadline = Instant::now() + Duration::from_secs(10);
    let lookups = (0..20).map(|i| {
        let (registry, creds) = (registry.clone(), &creds);
        let target = Reference::parse(&format!("{}/burst/app:t{i}", reg.host())).expect("ref");
        async move { DigestResolver::resolve(&registry, &target, None, creds, deadline).await }
    });
    let got = futures_util::future::join_all(lookups).await;
    for (g, want) in got.iter().zip(&digests) {
        assert_eq!(g.as_ref().map(|d| d.as_str().to_owned()), Ok(want.clone()));
    }
    let seen = seen.0.lock().unwrap().clone();
    let challenged = seen.iter().filter(|(_, s)| s == "401").count();
    assert_eq!(challenged, 1, "one probe, no 401 per request: {seen:?}");
    assert_eq!(seen.len(), 21, "the probe and one HEAD per image: {seen:?}");
}
