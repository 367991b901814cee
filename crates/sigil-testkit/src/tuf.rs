//! A TUF repository built in the tests, laid out as Sigstore's is
//! (consistent snapshots: `N.root.json`, `timestamp.json`,
//! `N.snapshot.json`, `N.targets.json`, `targets/<sha256>.<name>`), one
//! Ed25519 key per role, holding a `trusted_root.json` target. It can
//! publish a new trusted root, rotate its root keys, and make each attack
//! a TUF client must refuse (rollback, a bad signature, expired timestamp
//! metadata, a target that does not match its hash). Served from a
//! directory (`file://`) or over loopback HTTP ([`TufRepo::serve`]).
//! It checks nothing: that is the client's job.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use aws_lc_rs::signature::{Ed25519KeyPair, KeyPair};
use bytes::Bytes;
use http_body_util::Full;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use serde::Serialize;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

/// Far enough ahead for any test run.
pub const FAR: &str = "2099-01-01T00:00:00Z";

/// The target a Sigstore TUF repository carries.
pub const TARGET: &str = "trusted_root.json";

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// OLPC canonical JSON, which TUF signs.
pub fn canonical(v: &Value) -> Vec<u8> {
    let mut buf = Vec::new();
    let mut ser =
        serde_json::Serializer::with_formatter(&mut buf, olpc_cjson::CanonicalFormatter::new());
    v.serialize(&mut ser).expect("canonical JSON");
    buf
}

/// One role key.
pub struct Key(Ed25519KeyPair);

impl Key {
    pub fn generate() -> Key {
        Key(Ed25519KeyPair::generate().expect("ed25519 key"))
    }

    /// The key as root metadata lists it.
    pub fn json(&self) -> Value {
        json!({
            "keytype": "ed25519",
            "scheme": "ed25519",
            "keyval": {"public": hex(self.0.public_key().as_ref())},
        })
    }

    /// TUF's key id: the SHA-256 of the key's canonical JSON.
    pub fn id(&self) -> String {
        hex(&Sha256::digest(canonical(&self.json())))
    }

    fn sign(&self, signed: &Value) -> Value {
        json!({"keyid": self.id(), "sig": hex(self.0.sign(&canonical(signed)).as_ref())})
    }
}

/// Signs `signed` with every key in `keys`.
pub fn envelope(signed: Value, keys: &[&Key]) -> Vec<u8> {
    let signatures: Vec<Value> = keys.iter().map(|k| k.sign(&signed)).collect();
    serde_json::to_vec_pretty(&json!({"signed": signed, "signatures": signatures})).expect("json")
}

/// The repository, in a temporary directory.
pub struct TufRepo {
    dir: tempfile::TempDir,
    root_key: Key,
    targets_key: Key,
    snapshot_key: Key,
    timestamp_key: Key,
    root_version: u64,
    version: u64,
    bootstrap: Vec<u8>,
    target: Vec<u8>,
}

impl TufRepo {
    /// A repository at root version 1 whose `trusted_root.json` is `target`.
    pub fn new(target: &[u8]) -> TufRepo {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir_all(dir.path().join("targets")).expect("targets dir");
        let mut repo = TufRepo {
            dir,
            root_key: Key::generate(),
            targets_key: Key::generate(),
            snapshot_key: Key::generate(),
            timestamp_key: Key::generate(),
            root_version: 0,
            version: 0,
            bootstrap: Vec::new(),
            target: Vec::new(),
        };
        repo.bootstrap = repo.write_root(&[]);
        repo.publish(target);
        repo
    }

    /// The directory (for `file://` mirrors and air-gapped tests).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// `file://` URL of the repository (metadata at its root, targets under `targets/`).
    pub fn file_url(&self) -> String {
        format!("file://{}/", self.dir.path().display())
    }

    /// Root version 1, what a client is bootstrapped with.
    pub fn bootstrap_root(&self) -> Vec<u8> {
        self.bootstrap.clone()
    }

    /// The trusted root published last.
    pub fn target(&self) -> &[u8] {
        &self.target
    }

    /// Current versions: (root, targets/snapshot/timestamp).
    pub fn versions(&self) -> (u64, u64) {
        (self.root_version, self.version)
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn write(&self, name: &str, bytes: &[u8]) {
        std::fs::write(self.path(name), bytes).expect("write metadata");
    }

    /// Writes the next root version, signed by the current root key and
    /// by every key in `previous` (the keys of the version before, for a
    /// rotation). Returns its bytes.
    fn write_root(&mut self, previous: &[&Key]) -> Vec<u8> {
        self.root_version += 1;
        let keys: serde_json::Map<String, Value> = [
            &self.root_key,
            &self.targets_key,
            &self.snapshot_key,
            &self.timestamp_key,
        ]
        .iter()
        .map(|k| (k.id(), k.json()))
        .collect();
        let role = |k: &Key| json!({"keyids": [k.id()], "threshold": 1});
        let signed = json!({
            "_type": "root",
            "spec_version": "1.0.31",
            "consistent_snapshot": true,
            "version": self.root_version,
            "expires": FAR,
            "keys": keys,
            "roles": {
                "root": role(&self.root_key),
                "targets": role(&self.targets_key),
                "snapshot": role(&self.snapshot_key),
                "timestamp": role(&self.timestamp_key),
            },
        });
        let mut signers: Vec<&Key> = previous.to_vec();
        signers.push(&self.root_key);
        let bytes = envelope(signed, &signers);
        self.write(&format!("{}.root.json", self.root_version), &bytes);
        bytes
    }

    /// Publishes `target` as the new `trusted_root.json`: new targets,
    /// snapshot and timestamp versions.
    pub fn publish(&mut self, target: &[u8]) {
        self.version += 1;
        let hash = hex(&Sha256::digest(target));
        std::fs::write(self.path(&format!("targets/{hash}.{TARGET}")), target).expect("target");
        self.target = target.to_vec();
        let targets = json!({
            "_type": "targets",
            "spec_version": "1.0.31",
            "version": self.version,
            "expires": FAR,
            "targets": {TARGET: {
                "length": target.len(),
                "hashes": {"sha256": hash},
                "custom": {"sigstore": {"status": "Active", "usage": "Unknown"}},
            }},
        });
        let t = envelope(targets, &[&self.targets_key]);
        self.write(&format!("{}.targets.json", self.version), &t);
        let snapshot = json!({
            "_type": "snapshot",
            "spec_version": "1.0.31",
            "version": self.version,
            "expires": FAR,
            "meta": {"targets.json": {"version": self.version}},
        });
        let s = envelope(snapshot, &[&self.snapshot_key]);
        self.write(&format!("{}.snapshot.json", self.version), &s);
        self.write_timestamp(self.version, FAR, false);
    }

    /// Writes `timestamp.json` naming snapshot `version`, expiring at
    /// `expires`, signed by the timestamp key (or, with `forged`, by a key
    /// the root does not list).
    pub fn write_timestamp(&self, version: u64, expires: &str, forged: bool) {
        let snapshot = std::fs::read(self.path(&format!("{version}.snapshot.json")))
            .expect("that snapshot version was published");
        let signed = json!({
            "_type": "timestamp",
            "spec_version": "1.0.31",
            "version": version,
            "expires": expires,
            "meta": {"snapshot.json": {
                "version": version,
                "length": snapshot.len(),
                "hashes": {"sha256": hex(&Sha256::digest(&snapshot))},
            }},
        });
        let other = Key::generate();
        let key = if forged { &other } else { &self.timestamp_key };
        self.write("timestamp.json", &envelope(signed, &[key]));
    }

    /// Rotates every key: a new root version signed by the old and the new
    /// root keys (a client walks to it), and new metadata under the new keys.
    pub fn rotate_keys(&mut self) {
        let old = std::mem::replace(&mut self.root_key, Key::generate());
        self.targets_key = Key::generate();
        self.snapshot_key = Key::generate();
        self.timestamp_key = Key::generate();
        self.write_root(&[&old]);
        let target = self.target.clone();
        self.publish(&target);
    }

    /// Replaces the published target's bytes (same length) so they no
    /// longer match the hash the targets metadata lists.
    pub fn corrupt_target(&self) {
        let hash = hex(&Sha256::digest(&self.target));
        let mut bytes = self.target.clone();
        if let Some(b) = bytes.last_mut() {
            *b ^= 1;
        }
        std::fs::write(self.path(&format!("targets/{hash}.{TARGET}")), bytes).expect("target");
    }

    /// Serves the repository directory over loopback HTTP.
    pub async fn serve(&self) -> StaticServer {
        StaticServer::start(self.dir.path().to_path_buf()).await
    }
}

/// A loopback HTTP server for a directory: GET of a file answers it, 404
/// otherwise. A stand-in for a CDN; it counts requests.
pub struct StaticServer {
    pub addr: SocketAddr,
    pub hits: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for StaticServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl StaticServer {
    pub async fn start(root: PathBuf) -> StaticServer {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let hits = Arc::new(AtomicUsize::new(0));
        let counted = hits.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    continue;
                };
                let (root, hits) = (root.clone(), counted.clone());
                tokio::spawn(async move {
                    let svc = service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                        hits.fetch_add(1, Ordering::Relaxed);
                        let path = req.uri().path().trim_start_matches('/').to_owned();
                        let file = (!path.split('/').any(|p| p == ".." || p.is_empty()))
                            .then(|| std::fs::read(root.join(&path)).ok())
                            .flatten();
                        let resp = match file {
                            Some(b) => hyper::Response::new(Full::new(Bytes::from(b))),
                            None => {
                                let mut r = hyper::Response::new(Full::new(Bytes::new()));
                                *r.status_mut() = hyper::StatusCode::NOT_FOUND;
                                r
                            }
                        };
                        async move { Ok::<_, Infallible>(resp) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(tcp), svc)
                        .await;
                });
            }
        });
        StaticServer { addr, hits, task }
    }

    /// `http://127.0.0.1:PORT/`.
    pub fn url(&self) -> String {
        format!("http://{}/", self.addr)
    }
}
