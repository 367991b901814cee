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
