//! A real CNCF distribution registry (`docker-registry`) on 127.0.0.1, with
//! its own config: plain HTTP, TLS with a test CA, or htpasswd auth. Images
//! are pushed through its HTTP API.

use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair, SanType};
use serde_json::{Value, json};
use sha2::{Digest as _, Sha256};

/// The `service` a token-auth registry expects in its tokens' audience.
pub const SERVICE: &str = "sigil-test-registry";
/// The issuer a token-auth registry trusts.
pub const ISSUER: &str = "sigil-test-issuer";

pub enum Mode {
    Plain,
    /// Plain HTTP on the IPv6 loopback, `[::1]:port`.
    PlainV6,
    Tls,
    Htpasswd {
        user: &'static str,
        password: &'static str,
    },
    /// [`Mode::Htpasswd`] with the registry on HTTPS (a test CA): what a
    /// registry at a distance looks like (HTTP/2 where the client asks).
    TlsHtpasswd {
        user: &'static str,
        password: &'static str,
    },
    /// Bearer tokens from this token service (realm), verified with its certificate.
    Token {
        realm: String,
        cert_pem: String,
    },
    /// [`Mode::Token`] with the registry itself on HTTPS (a test CA).
    TlsToken {
        realm: String,
        cert_pem: String,
    },
}

pub struct TestRegistry {
    child: Child,
    pub addr: SocketAddr,
    pub dir: tempfile::TempDir,
    pub ca_pem: Option<String>,
    pub basic: Option<(String, String)>,
    /// Sent on pushes instead of Basic credentials.
    pub bearer: Option<String>,
    http: reqwest::Client,
    scheme: &'static str,
}

impl Drop for TestRegistry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub use crate::ports::free_port;

/// A CA and a leaf for 127.0.0.1/localhost, PEM.
pub fn test_ca() -> (String, String, String) {
    let ca_key = KeyPair::generate().unwrap();
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca_cert = ca.self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(ca, ca_key);
    let key = KeyPair::generate().unwrap();
    let mut leaf = CertificateParams::new(vec!["localhost".to_string()]).unwrap();
    leaf.subject_alt_names
        .push(SanType::IpAddress("127.0.0.1".parse().unwrap()));
    let cert = leaf.signed_by(&key, &issuer).unwrap();
    (ca_cert.pem(), cert.pem(), key.serialize_pem())
}

/// A fresh [`test_ca`] serving certificate written to `dir` as `tls.crt`
/// and `tls.key`: returns (CA PEM, certificate path, key path).
pub fn test_cert_files(dir: &std::path::Path) -> (String, String, String) {
    let (ca, cert, key) = test_ca();
    let (crt_path, key_path) = (dir.join("tls.crt"), dir.join("tls.key"));
    std::fs::write(&crt_path, cert).unwrap();
    std::fs::write(&key_path, key).unwrap();
    (
        ca,
        crt_path.display().to_string(),
        key_path.display().to_string(),
    )
}

impl TestRegistry {
    pub async fn start(mode: Mode) -> TestRegistry {
        let ip = if matches!(mode, Mode::PlainV6) {
            "[::1]"
        } else {
            "127.0.0.1"
        };
        TestRegistry::start_on(mode, ip).await
    }

    /// [`TestRegistry::start`] listening on `ip` (an address of this
    /// machine: a real node's, which both its containerd and its Pods reach).
    pub async fn start_on(mode: Mode, ip: &str) -> TestRegistry {
        let bin = which("docker-registry")
            .expect("docker-registry not installed: run scripts/test.sh (it installs it)");
        for _attempt in 0..5 {
            let dir = tempfile::tempdir().unwrap();
            let port = TcpListener::bind(format!("{ip}:0"))
                .and_then(|l| l.local_addr())
                .map(|a| a.port())
                .expect("free port");
            let addr: SocketAddr = format!("{ip}:{port}").parse().unwrap();
            let mut http_cfg = format!("  addr: \"{ip}:{port}\"\n  secret: sigil-test-secret\n");
            let mut auth_cfg = String::new();
            let mut ca_pem = None;
            let mut basic = None;
            let mut scheme = "http";
            if matches!(
                mode,
                Mode::Tls | Mode::TlsToken { .. } | Mode::TlsHtpasswd { .. }
            ) {
                let (ca, cert, key) = test_ca();
                std::fs::write(dir.path().join("cert.pem"), &cert).unwrap();
                std::fs::write(dir.path().join("key.pem"), &key).unwrap();
                http_cfg.push_str(&format!(
                    "  tls:\n    certificate: {}\n    key: {}\n",
                    dir.path().join("cert.pem").display(),
                    dir.path().join("key.pem").display()
                ));
                ca_pem = Some(ca);
                scheme = "https";
            }
            match &mode {
                Mode::Plain | Mode::PlainV6 | Mode::Tls => {}
                Mode::Htpasswd { user, password } | Mode::TlsHtpasswd { user, password } => {
                    // bcrypt at its least cost (4; htpasswd's default is 5):
                    // the registry checks it on every request, on the same
                    // cores as what a test or benchmark measures.
                    let out = Command::new("htpasswd")
                        .args(["-Bbn", "-C", "4", user, password])
                        .output()
                        .expect("htpasswd (apache2-utils) not installed");
                    assert!(out.status.success());
                    std::fs::write(dir.path().join("htpasswd"), &out.stdout).unwrap();
                    auth_cfg = format!(
                        "auth:\n  htpasswd:\n    realm: sigil-test\n    path: {}\n",
                        dir.path().join("htpasswd").display()
                    );
                    basic = Some((user.to_string(), password.to_string()));
                }
                Mode::Token { realm, cert_pem } | Mode::TlsToken { realm, cert_pem } => {
                    std::fs::write(dir.path().join("token-root.pem"), cert_pem).unwrap();
                    auth_cfg = format!(
                        "auth:\n  token:\n    realm: {realm}\n    service: {}\n    issuer: {}\n    rootcertbundle: {}\n",
                        SERVICE,
                        ISSUER,
                        dir.path().join("token-root.pem").display()
                    );
                }
            }
            let config = format!(
                "version: 0.1\nlog:\n  level: error\n  accesslog:\n    disabled: true\nstorage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\nhttp:\n{http_cfg}{auth_cfg}",
                dir.path().join("data").display()
            );
            let cfg_path = dir.path().join("config.yml");
            std::fs::write(&cfg_path, config).unwrap();
            let child = Command::new(&bin)
                .arg("serve")
                .arg(&cfg_path)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("spawn docker-registry");
            let mut b = reqwest::Client::builder().timeout(Duration::from_secs(10));
            if let Some(ca) = &ca_pem {
                b = b.tls_certs_only([reqwest::Certificate::from_pem(ca.as_bytes()).unwrap()]);
            }
            let mut reg = TestRegistry {
                child,
                addr,
                dir,
                ca_pem,
                basic,
                bearer: None,
                http: b.build().unwrap(),
                scheme,
            };
            if reg.wait_up().await {
                return reg;
            }
            let _ = reg.child.kill();
        }
        panic!("docker-registry did not start");
    }

    async fn wait_up(&mut self) -> bool {
        let until = Instant::now() + Duration::from_secs(10);
        while Instant::now() < until {
            if let Ok(Some(_)) = self.child.try_wait() {
                return false;
            }
            if let Ok(r) = self.http.get(format!("{}/v2/", self.base())).send().await
                && (r.status().is_success() || r.status() == 401)
            {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        false
    }

    /// The registry process's id (to read its CPU time).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn host(&self) -> String {
        self.addr.to_string()
    }

    pub fn base(&self) -> String {
        format!("{}://{}", self.scheme, self.addr)
    }

    fn auth(&self, rb: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        match (&self.basic, &self.bearer) {
            (Some((u, p)), _) => rb.basic_auth(u, Some(p)),
            (None, Some(t)) => rb.bearer_auth(t),
            (None, None) => rb,
        }
    }

    pub async fn push_blob(&self, repo: &str, data: &[u8]) -> String {
        let digest = sha256(data);
        let r = self
            .auth(
                self.http
                    .post(format!("{}/v2/{repo}/blobs/uploads/", self.base())),
            )
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 202, "start upload: {:?}", r.text().await);
        let loc = r.headers()["location"].to_str().unwrap().to_string();
        let url = if loc.starts_with("http") {
            loc
        } else {
            format!("{}{loc}", self.base())
        };
        let sep = if url.contains('?') { '&' } else { '?' };
        let r = self
            .auth(self.http.put(format!("{url}{sep}digest={digest}")))
            .header("content-type", "application/octet-stream")
            .body(data.to_vec())
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 201, "finish upload: {:?}", r.text().await);
        digest
    }

    pub async fn push_manifest(
        &self,
        repo: &str,
        reference: &str,
        media_type: &str,
        body: &[u8],
    ) -> String {
        let r = self
            .auth(
                self.http
                    .put(format!("{}/v2/{repo}/manifests/{reference}", self.base())),
            )
            .header("content-type", media_type)
            .body(body.to_vec())
            .send()
            .await
            .unwrap();
        assert_eq!(
            r.status(),
            201,
            "push manifest {repo}:{reference}: {:?}",
            r.text().await
        );
        sha256(body)
    }

    /// Puts a blob straight into the registry's filesystem storage and links
    /// it into `repo`, for image blobs the vectors do not carry (sigil never
    /// reads them, but the registry refuses a manifest whose blobs it lacks).
    pub fn seed_blob(&self, repo: &str, digest: &str) {
        let hex = digest.trim_start_matches("sha256:");
        let root = self.dir.path().join("data/docker/registry/v2");
        let blob = root.join(format!("blobs/sha256/{}/{hex}", &hex[..2]));
        std::fs::create_dir_all(&blob).unwrap();
        if !blob.join("data").exists() {
            std::fs::write(blob.join("data"), b"seeded placeholder").unwrap();
        }
        let link = root.join(format!("repositories/{repo}/_layers/sha256/{hex}"));
        std::fs::create_dir_all(&link).unwrap();
        std::fs::write(link.join("link"), digest).unwrap();
    }

    /// Writes a blob of `size` pseudo-random bytes straight into the
    /// registry's storage and links it into `repo` (hashed as it is written,
    /// never held in memory): large images in seconds. Returns its digest.
    pub fn seed_large_blob(&self, repo: &str, size: usize, seed: u64) -> String {
        use sha2::{Digest as _, Sha256};
        use std::io::Write as _;
        let root = self.dir.path().join("data/docker/registry/v2");
        let tmp = root.join(format!("seed-{seed}.tmp"));
        std::fs::create_dir_all(&root).unwrap();
        let mut f = std::io::BufWriter::new(std::fs::File::create(&tmp).unwrap());
        let mut h = Sha256::new();
        let mut x = seed | 1;
        let mut buf = vec![0u8; 1 << 20];
        let mut left = size;
        while left > 0 {
            let n = left.min(buf.len());
            for w in buf[..n].chunks_mut(8) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let b = x.to_le_bytes();
                w.copy_from_slice(&b[..w.len()]);
            }
            h.update(&buf[..n]);
            f.write_all(&buf[..n]).unwrap();
            left -= n;
        }
        f.flush().unwrap();
        drop(f);
        let hex = format!("{:x}", h.finalize());
        let blob = root.join(format!("blobs/sha256/{}/{hex}", &hex[..2]));
        std::fs::create_dir_all(&blob).unwrap();
        std::fs::rename(&tmp, blob.join("data")).unwrap();
        let digest = format!("sha256:{hex}");
        let link = root.join(format!("repositories/{repo}/_layers/sha256/{hex}"));
        std::fs::create_dir_all(&link).unwrap();
        std::fs::write(link.join("link"), &digest).unwrap();
        digest
    }

    /// Pushes an image whose one layer is a seeded blob of `size` bytes;
    /// returns (manifest digest, layer digest).
    pub async fn push_large_image(
        &self,
        repo: &str,
        tag: &str,
        size: usize,
        seed: u64,
    ) -> (String, String) {
        let layer = self.seed_large_blob(repo, size, seed);
        let config = format!(
            r#"{{"architecture":"amd64","os":"linux","rootfs":{{"type":"layers","diff_ids":[]}},"config":{{}},"seed":{seed}}}"#
        );
        let (d, _) = self
            .push_one_layer(repo, tag, config.as_bytes(), &layer, size)
            .await;
        (d, layer)
    }

    /// Bytes under the registry's storage directory `sub` (e.g. where
    /// uploads in progress are kept), 0 if it does not exist.
    pub fn stored_bytes(&self, sub: &str) -> u64 {
        fn walk(p: &std::path::Path) -> u64 {
            let Ok(rd) = std::fs::read_dir(p) else {
                return 0;
            };
            rd.flatten()
                .map(|e| match e.file_type() {
                    Ok(t) if t.is_dir() => walk(&e.path()),
                    _ => e.metadata().map(|m| m.len()).unwrap_or(0),
                })
                .sum()
        }
        walk(&self.dir.path().join("data/docker/registry/v2").join(sub))
    }

    /// Tags an already pushed manifest `digest` of `repo` under every name in
    /// `tags`, by writing the registry's own tag links into its storage: the
    /// registry then answers `HEAD /v2/repo/manifests/<tag>` for each exactly
    /// as if it had been pushed, but 100,000 tags take seconds, not minutes.
    pub fn seed_tags(&self, repo: &str, digest: &str, tags: impl IntoIterator<Item = String>) {
        let root = self.dir.path().join(format!(
            "data/docker/registry/v2/repositories/{repo}/_manifests"
        ));
        let hex = digest.trim_start_matches("sha256:");
        let revision = root.join(format!("revisions/sha256/{hex}"));
        assert!(
            revision.join("link").is_file(),
            "seed_tags: push {repo}@{digest} first"
        );
        for tag in tags {
            let dir = root.join(format!("tags/{tag}"));
            for sub in ["current", &format!("index/sha256/{hex}")] {
                std::fs::create_dir_all(dir.join(sub)).unwrap();
                std::fs::write(dir.join(sub).join("link"), digest).unwrap();
            }
        }
    }

    /// Pushes a manifest byte for byte, seeding the blobs it names that the
    /// registry lacks and are not in `have` (those are uploaded through the API first).
    pub async fn push_exact(&self, repo: &str, reference: &str, body: &[u8]) -> String {
        let v: Value = serde_json::from_slice(body).unwrap();
        let mut blobs: Vec<&str> = Vec::new();
        if let Some(c) = v.pointer("/config/digest").and_then(Value::as_str) {
            blobs.push(c);
        }
        for l in v
            .get("layers")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            blobs.push(l["digest"].as_str().unwrap());
        }
        for b in blobs {
            let r = self
                .auth(
                    self.http
                        .head(format!("{}/v2/{repo}/blobs/{b}", self.base())),
                )
                .send()
                .await
                .unwrap();
            if r.status() != 200 {
                self.seed_blob(repo, b);
            }
        }
        let mt = v["mediaType"]
            .as_str()
            .unwrap_or("application/vnd.oci.image.manifest.v1+json");
        self.push_manifest(repo, reference, mt, body).await
    }

    /// The size of a pushed OCI manifest (for descriptors that point at it).
    pub async fn manifest_size(&self, repo: &str, digest: &str) -> usize {
        let r = self
            .auth(
                self.http
                    .get(format!("{}/v2/{repo}/manifests/{digest}", self.base())),
            )
            .header(
                "accept",
                "application/vnd.oci.image.manifest.v1+json, application/vnd.oci.image.index.v1+json",
            )
            .send()
            .await
            .unwrap();
        let body = r.bytes().await.unwrap();
        assert_eq!(sha256(&body), digest);
        body.len()
    }

    /// Pushes a small single-platform OCI image and returns its manifest digest.
    pub async fn push_image(&self, repo: &str, tag: &str) -> String {
        self.push_image_for(repo, tag, "linux", "amd64", None)
            .await
            .0
    }

    async fn push_image_for(
        &self,
        repo: &str,
        tag: &str,
        os: &str,
        arch: &str,
        variant: Option<&str>,
    ) -> (String, usize) {
        let config = json!({"architecture": arch, "os": os, "variant": variant, "rootfs": {"type": "layers", "diff_ids": []}, "config": {}, "created": format!("{repo}:{tag}:{os}/{arch}")});
        let config = serde_json::to_vec(&config).unwrap();
        let layer = format!("layer of {repo}:{tag} {os}/{arch} {}", uniq()).into_bytes();
        let ld = self.push_blob(repo, &layer).await;
        self.push_one_layer(repo, tag, &config, &ld, layer.len())
            .await
    }

    /// Pushes `config` and an OCI image manifest naming it and one layer
    /// the registry already holds (`layer`, `size` bytes, stated as given);
    /// returns (manifest digest, manifest length).
    pub async fn push_one_layer(
        &self,
        repo: &str,
        tag: &str,
        config: &[u8],
        layer: &str,
        size: usize,
    ) -> (String, usize) {
        let cd = self.push_blob(repo, config).await;
        let manifest = serde_json::to_vec(&json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": cd, "size": config.len()},
            "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": layer, "size": size}]
        }))
        .unwrap();
        let d = self
            .push_manifest(
                repo,
                tag,
                "application/vnd.oci.image.manifest.v1+json",
                &manifest,
            )
            .await;
        (d, manifest.len())
    }

    /// Pushes a multi-arch OCI index; returns (index digest, [(platform, manifest digest)]).
    pub async fn push_index(
        &self,
        repo: &str,
        tag: &str,
        platforms: &[(&str, &str, Option<&str>)],
    ) -> (String, Vec<(String, String)>) {
        let mut entries = Vec::new();
        let mut out = Vec::new();
        for (os, arch, variant) in platforms {
            let (d, size) = self
                .push_image_for(
                    repo,
                    &format!("{tag}-{arch}{}", variant.unwrap_or("")),
                    os,
                    arch,
                    *variant,
                )
                .await;
            let mut p = json!({"os": os, "architecture": arch});
            if let Some(v) = variant {
                p["variant"] = json!(v);
            }
            entries.push(json!({"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": d, "size": size, "platform": p}));
            out.push((
                format!(
                    "{os}/{arch}{}",
                    variant.map(|v| format!("/{v}")).unwrap_or_default()
                ),
                d,
            ));
        }
        let index = serde_json::to_vec(&json!({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json", "manifests": entries})).unwrap();
        let d = self
            .push_manifest(repo, tag, "application/vnd.oci.image.index.v1+json", &index)
            .await;
        (d, out)
    }
}

pub fn sha256(data: &[u8]) -> String {
    format!(
        "sha256:{}",
        Sha256::digest(data)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
    )
}

pub fn uniq() -> u128 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    t ^ u128::from(N.fetch_add(1, Ordering::Relaxed))
}

pub fn which(bin: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|p| {
        std::env::split_paths(&p)
            .map(|d| d.join(bin))
            .find(|p| p.is_file())
    })
}
