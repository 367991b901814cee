//! The TUF client against a repository built in the test kit, served over
//! loopback HTTP or from a directory: a rotated trusted root (and rotated
//! TUF keys) is in force after a refresh; a rollback, a bad signature,
//! expired timestamp metadata and a wrong target hash are each refused,
//! and the previous root stays in force.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use sigil_testkit::sigstore::Sigstore;
use sigil_testkit::tuf::TufRepo;
use sigil_verify::roots::{DEFAULT, Origin, Refreshed, Refresher, TrustRoots};
use sigil_verify::tuf::Client;

fn root_json() -> String {
    Sigstore::new().trusted_root().to_string()
}

fn refresher(repo: &TufRepo, mirror: &str) -> (Refresher, Arc<TrustRoots>) {
    let roots = Arc::new(TrustRoots::embedded());
    let client = Client::new(mirror, repo.bootstrap_root(), reqwest::Client::new(), None).unwrap();
    (Refresher::new(DEFAULT, client, roots.clone()), roots)
}

fn in_force(roots: &TrustRoots) -> String {
    roots.get(DEFAULT).unwrap().json.to_string()
}

#[tokio::test]
async fn a_published_root_is_in_force_after_a_refresh_over_http_and_from_a_directory() {
    let first = root_json();
    let repo = TufRepo::new(first.as_bytes());
    let server = repo.serve().await;
    for mirror in [server.url(), repo.file_url()] {
        let (r, roots) = refresher(&repo, &mirror);
        assert_eq!(roots.get(DEFAULT).unwrap().origin, Origin::Embedded);
        let (outcome, fetched) = r.refresh_once().await;
        let f = fetched.unwrap();
        assert_eq!(outcome, Refreshed::Changed, "{mirror}");
        assert_eq!(in_force(&roots), first);
        assert_eq!((f.root_version, f.timestamp_version), (1, 1));
        let (outcome, _) = r.refresh_once().await;
        assert_eq!(outcome, Refreshed::Unchanged);
    }
    assert!(server.hits.load(std::sync::atomic::Ordering::Relaxed) >= 5);
}

#[tokio::test]
async fn a_rotated_trusted_root_and_rotated_tuf_keys_are_followed() {
    let mut repo = TufRepo::new(root_json().as_bytes());
    let server = repo.serve().await;
    let (r, roots) = refresher(&repo, &server.url());
    assert_eq!(r.refresh_once().await.0, Refreshed::Changed);
    // A new trusted root, then every TUF key rotated (root version 2,
    // signed by the old and the new root keys).
    let second = root_json();
    repo.publish(second.as_bytes());
    repo.rotate_keys();
    let (outcome, f) = r.refresh_once().await;
    let f = f.unwrap();
    assert_eq!(outcome, Refreshed::Changed);
    assert_eq!(in_force(&roots), second);
    assert_eq!(f.root_version, 2);
    assert!(matches!(
        roots.get(DEFAULT).unwrap().origin,
        Origin::Tuf {
            root_version: 2,
            ..
        }
    ));
}

/// Each attack leaves the previous root in force, with the reason recorded.
async fn refused(attack: impl FnOnce(&mut TufRepo), reason: &str) {
    let first = root_json();
    let mut repo = TufRepo::new(first.as_bytes());
    let server = repo.serve().await;
    let (r, roots) = refresher(&repo, &server.url());
    assert_eq!(r.refresh_once().await.0, Refreshed::Changed);
    attack(&mut repo);
    let (outcome, err) = r.refresh_once().await;
    let err = err.unwrap_err().to_string();
    assert_eq!(outcome, Refreshed::Failed, "{err}");
    assert!(
        err.to_lowercase().contains(reason),
        "{reason:?} not in {err}"
    );
    let kept = roots.get(DEFAULT).unwrap();
    assert_eq!(*kept.json, *first, "the previous root stays in force");
    assert_eq!(kept.error.as_deref(), Some(err.as_str()));
}

#[tokio::test]
async fn a_timestamp_older_than_the_one_seen_is_refused() {
    let mut repo = TufRepo::new(root_json().as_bytes());
    let server = repo.serve().await;
    let (r, roots) = refresher(&repo, &server.url());
    let second = root_json();
    repo.publish(second.as_bytes());
    assert_eq!(r.refresh_once().await.0, Refreshed::Changed);
    assert_eq!(in_force(&roots), second);
    // The mirror now serves the earlier timestamp (version 1): a rollback.
    repo.write_timestamp(1, sigil_testkit::tuf::FAR, false);
    let (outcome, err) = r.refresh_once().await;
    let err = err.unwrap_err().to_string();
    assert_eq!(outcome, Refreshed::Failed);
    assert!(err.contains("version"), "{err}");
    assert_eq!(in_force(&roots), second);
}

#[tokio::test]
async fn a_timestamp_signed_by_an_unlisted_key_is_refused() {
    refused(
        |repo| {
            repo.publish(root_json().as_bytes());
            let (_, v) = repo.versions();
            repo.write_timestamp(v, sigil_testkit::tuf::FAR, true);
        },
        "signature",
    )
    .await;
}

#[tokio::test]
async fn expired_timestamp_metadata_is_refused() {
    refused(
        |repo| {
            repo.publish(root_json().as_bytes());
            let (_, v) = repo.versions();
            repo.write_timestamp(v, "2020-01-01T00:00:00Z", false);
        },
        "expired",
    )
    .await;
}

#[tokio::test]
async fn a_target_that_does_not_match_its_hash_is_refused() {
    refused(
        |repo| {
            repo.publish(root_json().as_bytes());
            repo.corrupt_target();
        },
        "hash",
    )
    .await;
}

#[tokio::test]
async fn an_unreachable_mirror_leaves_the_embedded_root_in_force() {
    let repo = TufRepo::new(root_json().as_bytes());
    // A port nothing listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let (r, roots) = refresher(&repo, &format!("http://127.0.0.1:{port}/"));
    let (outcome, err) = r.refresh_once().await;
    assert_eq!(outcome, Refreshed::Failed);
    assert!(err.is_err());
    let kept = roots.get(DEFAULT).unwrap();
    assert_eq!(kept.origin, Origin::Embedded);
    assert!(kept.error.is_some());
}

#[test]
fn a_mirror_that_is_not_http_or_a_directory_is_refused() {
    let repo = TufRepo::new(root_json().as_bytes());
    let err = Client::new(
        "ftp://mirror/",
        repo.bootstrap_root(),
        reqwest::Client::new(),
        None,
    )
    .unwrap_err();
    assert!(
        err.to_string().contains("not one of https, http, file"),
        "{err}"
    );
}
