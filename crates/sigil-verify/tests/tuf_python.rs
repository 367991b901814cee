//! sigil's TUF client against repositories made by python-tuf, the
//! reference implementation (`scripts/tuf-repo.py`), served over loopback
//! HTTP: GitHub's layout (tuf-on-ci's key IDs, computed without its custom
//! key fields), Sigstore's (root-signing's, with a delegated role) and a
//! trusted root held by a delegated role. Each refreshes, follows a new
//! target and a root rotation; each attack the TUF specification names is
//! refused with the attack named, and what was verified before stays.

#![allow(clippy::unwrap_used)]

use std::path::Path;

use sigil_testkit::pytuf::PyRepo;
use sigil_testkit::sigstore::Sigstore;
use sigil_verify::tuf::{Client, Fetched};

fn trusted_root() -> String {
    Sigstore::new().trusted_root().to_string()
}

/// A client of `repo` that trusts its first root, keeping its metadata in `store`.
fn client_of(repo: &PyRepo, store: &Path) -> Client {
    Client::new(
        &repo.url(),
        repo.bootstrap(),
        reqwest::Client::new(),
        Some(store.to_owned()),
    )
    .unwrap()
}

async fn refresh(c: &Client) -> Result<Fetched, String> {
    c.refresh().await.map_err(|e| e.to_string())
}

#[tokio::test]
async fn python_tuf_repositories_in_githubs_and_sigstores_layouts_refresh() {
    for layout in ["github", "sigstore", "delegated"] {
        let first = trusted_root();
        let repo = PyRepo::init(layout, &first).await;
        let store = tempfile::tempdir().unwrap();
        let client = client_of(&repo, store.path());
        let f = refresh(&client).await.unwrap();
        assert_eq!(f.json, first, "{layout}");
        assert_eq!((f.root_version, f.timestamp_version), (1, 1), "{layout}");
        // A new trusted root published.
        let second = trusted_root();
        repo.publish(&second);
        let f = refresh(&client).await.unwrap();
        assert_eq!(
            (f.json.as_str(), f.timestamp_version),
            (second.as_str(), 2),
            "{layout}"
        );
        // The root keys rotated (version 2 signed by old and new keys), then
        // a third trusted root published under them.
        repo.rotate_root();
        let third = trusted_root();
        repo.publish(&third);
        let f = refresh(&client).await.unwrap();
        assert_eq!(
            (f.json.as_str(), f.root_version),
            (third.as_str(), 2),
            "{layout}"
        );
        // A restarted client starts from what its datastore kept.
        let again = client_of(&repo, store.path());
        assert_eq!(refresh(&again).await.unwrap().root_version, 2, "{layout}");
    }
}

/// A repository at its second publication that the client has seen, for
/// the attacks that need a version to go back to.
async fn seen_twice() -> (PyRepo, tempfile::TempDir, Client) {
    let repo = PyRepo::init("github", &trusted_root()).await;
    repo.publish(&trusted_root());
    let store = tempfile::tempdir().unwrap();
    let client = client_of(&repo, store.path());
    refresh(&client).await.unwrap();
    (repo, store, client)
}

#[tokio::test]
async fn a_rollback_attack_is_refused() {
    let (repo, _store, client) = seen_twice().await;
    repo.attack("rollback");
    let e = refresh(&client).await.unwrap_err();
    assert!(
        e.contains("rollback refused") && e.contains("timestamp version 1"),
        "{e}"
    );
}

#[tokio::test]
async fn a_freeze_attack_is_refused() {
    let (repo, _store, client) = seen_twice().await;
    repo.attack("freeze");
    let e = refresh(&client).await.unwrap_err();
    assert!(
        e.contains("timestamp metadata expired") && e.contains("freeze"),
        "{e}"
    );
}

#[tokio::test]
async fn arbitrary_metadata_is_refused() {
    let (repo, _store, client) = seen_twice().await;
    repo.attack("arbitrary");
    let e = refresh(&client).await.unwrap_err();
    assert!(
        e.contains("timestamp metadata has 0 valid signature"),
        "{e}"
    );
}

#[tokio::test]
async fn a_mix_and_match_attack_is_refused() {
    // A client that has not seen the second publication gets its snapshot
    // naming targets version 2, and version 1 under that name.
    let repo = PyRepo::init("github", &trusted_root()).await;
    repo.publish(&trusted_root());
    repo.attack("mix-and-match");
    let store = tempfile::tempdir().unwrap();
    let e = refresh(&client_of(&repo, store.path())).await.unwrap_err();
    assert!(
        e.contains("2.targets.json is version 1") && e.contains("mix-and-match"),
        "{e}"
    );
}

#[tokio::test]
async fn an_endless_data_attack_is_refused() {
    let (repo, _store, client) = seen_twice().await;
    repo.attack("endless");
    let e = refresh(&client).await.unwrap_err();
    assert!(
        e.contains("larger than 16384 bytes (endless data refused)"),
        "{e}"
    );
}

#[tokio::test]
async fn a_key_compromise_below_the_threshold_is_refused() {
    let (repo, _store, client) = seen_twice().await;
    repo.attack("below-threshold");
    let e = refresh(&client).await.unwrap_err();
    assert!(
        e.contains("root metadata has 1 valid signature(s) from its role's keys; 2 are required"),
        "{e}"
    );
}

/// Found by the TUF conformance suite (`test_unsigned_initial_root`): a
/// root in the datastore was trusted as the starting point without meeting
/// its own threshold. Now one that does not is never trusted: the client
/// starts from its bootstrap again, and refreshes.
#[tokio::test]
async fn regression_a_kept_root_that_does_not_meet_its_own_threshold_is_not_trusted() {
    let (repo, store, client) = seen_twice().await;
    repo.rotate_root();
    repo.publish(&trusted_root());
    assert_eq!(refresh(&client).await.unwrap().root_version, 2);
    drop(client);
    let kept = store.path().join("root.json");
    let mut root: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&kept).unwrap()).unwrap();
    root["signatures"].as_array_mut().unwrap().truncate(1);
    std::fs::write(&kept, root.to_string()).unwrap();
    // Started again from the bootstrap (v1), it walks as far as the
    // repository lets it: here not to v2 (taken away), so root v1 it is.
    std::fs::remove_file(repo.file("2.root.json")).unwrap();
    let f = refresh(&client_of(&repo, store.path())).await.unwrap();
    assert_eq!(f.root_version, 1);
}
