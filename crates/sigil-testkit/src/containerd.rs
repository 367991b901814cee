//! A real containerd (v2.3, from `SIGIL_CONTAINERD_ASSETS`: `containerd`,
//! `ctr`, `cripull`) for the node tier: a private daemon with its own root,
//! state, socket and verifier directory under a temporary directory (never
//! the system's /run/containerd), the overlayfs snapshotter, CRI pointed at
//! the plain-HTTP test registry through `hosts.toml`; and images whose
//! layers are real tar archives (a pull unpacks them). Needs root, as
//! containerd does; without the assets or root a test says it is skipped.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::json;

use crate::registry::{TestRegistry, sha256, uniq};

const ASSETS: &str = "SIGIL_CONTAINERD_ASSETS";

/// The assets directory, or why the tier cannot run here.
pub fn assets() -> Result<PathBuf, String> {
    let dir = std::env::var_os(ASSETS).map(PathBuf::from).ok_or_else(|| {
        format!(
            "{ASSETS} is not set (a directory with containerd, ctr and cripull; .ci/run sets it)"
        )
    })?;
    for b in ["containerd", "ctr", "cripull"] {
        if !dir.join(b).is_file() {
            return Err(format!("{ASSETS}={}: no {b} there", dir.display()));
        }
    }
    let uid = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .and_then(|l| l.split_whitespace().nth(1).map(str::to_owned))
        })
        .unwrap_or_default();
    if uid != "0" {
        return Err("containerd needs root (CI runs as root)".into());
    }
    Ok(dir)
}

/// The assets, or `None` after printing that the calling test is skipped.
pub fn assets_or_skip(test: &str) -> Option<PathBuf> {
    match assets() {
        Ok(a) => Some(a),
        Err(why) => {
            eprintln!("SKIPPED node::{test}: {why}");
            None
        }
    }
}

/// A running private containerd.
pub struct Containerd {
    child: Child,
    assets: PathBuf,
    dir: tempfile::TempDir,
    /// Its gRPC socket.
    pub socket: PathBuf,
    /// Its image verifiers' `bin_dir`.
    pub verifiers: PathBuf,
    /// Its config.toml.
    pub config: PathBuf,
}

impl Containerd {
    /// Starts containerd with `env` (what its verifiers see), pulling from
    /// `registry` (`127.0.0.1:PORT`) over plain HTTP, verifiers timing out
    /// after `timeout`; `images` adds settings to CRI's images table.
    pub fn start(
        assets: &Path,
        registry: &str,
        env: &[(&str, String)],
        timeout: &str,
        images: &str,
    ) -> Containerd {
        Self::start_in(assets, registry, env, timeout, images, None, None)
    }

    /// [`Self::start`] with the verifiers' `bin_dir` at `verifiers` (where
    /// a node install placed them), a 10 s verifier timeout.
    pub fn start_with_verifiers(
        assets: &Path,
        registry: &str,
        env: &[(&str, String)],
        verifiers: &Path,
    ) -> Containerd {
        Self::start_in(assets, registry, env, "10s", "", Some(verifiers), None)
    }

    /// [`Self::start_with_verifiers`] in a mount namespace of its own where
    /// `/etc/sigil` is `etc_sigil` (an overlay on `/etc`, so the host's
    /// `/etc` is untouched): a node whose well-known paths are the test's,
    /// as a verifier started by containerd sees them.
    pub fn start_as_node(
        assets: &Path,
        registry: &str,
        env: &[(&str, String)],
        verifiers: &Path,
        etc_sigil: &Path,
    ) -> Containerd {
        Self::start_in(
            assets,
            registry,
            env,
            "10s",
            "",
            Some(verifiers),
            Some(etc_sigil),
        )
    }

    fn start_in(
        assets: &Path,
        registry: &str,
        env: &[(&str, String)],
        timeout: &str,
        images: &str,
        verifiers: Option<&Path>,
        etc_sigil: Option<&Path>,
    ) -> Containerd {
        let dir = tempfile::Builder::new()
            .prefix("sigil-containerd")
            .tempdir()
            .unwrap();
        let d = dir.path();
        let verifiers = verifiers
            .map(Path::to_owned)
            .unwrap_or_else(|| d.join("verifiers"));
        std::fs::create_dir_all(&verifiers).unwrap();
        let hosts = d.join("certs.d").join(registry);
        std::fs::create_dir_all(&hosts).unwrap();
        std::fs::write(
            hosts.join("hosts.toml"),
            format!("server = \"http://{registry}\"\n"),
        )
        .unwrap();
        let socket = d.join("containerd.sock");
        let config = d.join("config.toml");
        std::fs::write(
            &config,
            format!(
                "version = 3\nroot = \"{root}\"\nstate = \"{state}\"\ntemp = \"{tmp}\"\n\
                 [grpc]\n  address = \"{sock}\"\n[ttrpc]\n  address = \"{sock}.ttrpc\"\n\
                 [plugins.\"io.containerd.internal.v1.opt\"]\n  path = \"{opt}\"\n\
                 [plugins.\"io.containerd.image-verifier.v1.bindir\"]\n  bin_dir = \"{v}\"\n  max_verifiers = 10\n  per_verifier_timeout = \"{timeout}\"\n\
                 [plugins.\"io.containerd.cri.v1.images\"]\n  snapshotter = \"overlayfs\"\n{images}\n\
                 [plugins.\"io.containerd.cri.v1.images\".registry]\n  config_path = \"{certs}\"\n",
                root = d.join("root").display(),
                state = d.join("state").display(),
                tmp = d.join("tmp").display(),
                // Its `opt` plugin's directory (default /opt/containerd):
                // a test writes only under its own temporary directory.
                opt = d.join("opt").display(),
                sock = socket.display(),
                v = verifiers.display(),
                certs = d.join("certs.d").display(),
            ),
        )
        .unwrap();
        std::fs::create_dir_all(d.join("tmp")).unwrap();
        let log = std::fs::File::create(d.join("containerd.log")).unwrap();
        let mut cmd = match etc_sigil {
            None => Command::new(assets.join("containerd")),
            Some(dir) => {
                let (upper, work) = (d.join("etc-upper"), d.join("etc-work"));
                std::fs::create_dir_all(&upper).unwrap();
                std::fs::create_dir_all(&work).unwrap();
                let mut c = Command::new("unshare");
                c.args(["--mount", "--propagation", "private", "sh", "-c"])
                    .arg(format!(
                        "set -e; mount -t overlay overlay -o lowerdir=/etc,upperdir={},workdir={} /etc; mkdir -p /etc/sigil; mount --bind {} /etc/sigil; exec \"$@\"",
                        upper.display(),
                        work.display(),
                        dir.display()
                    ))
                    .arg("sh")
                    .arg(assets.join("containerd"));
                c
            }
        };
        let child = cmd
            .arg("--config")
            .arg(&config)
            .arg("--log-level")
            .arg("debug")
            .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("containerd starts");
        let c = Containerd {
            child,
            assets: assets.to_owned(),
            dir,
            socket,
            verifiers,
            config,
        };
        let until = Instant::now() + Duration::from_secs(30);
        loop {
            let v = c.ctr(&["version"]);
            if v.status.success() {
                return c;
            }
            assert!(
                Instant::now() < until,
                "containerd did not start:\n{}",
                c.logs()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// `ctr -a SOCKET ARGS`.
    pub fn ctr(&self, args: &[&str]) -> Output {
        Command::new(self.assets.join("ctr"))
            .arg("-a")
            .arg(&self.socket)
            .args(args)
            .output()
            .unwrap()
    }

    /// `ctr image pull --plain-http IMAGE` (the transfer service).
    pub fn ctr_pull(&self, image: &str) -> Output {
        self.ctr(&["image", "pull", "--plain-http", image])
    }

    /// [`Self::ctr_pull`] with `--user USER:PASSWORD` (containerd's own
    /// credentials for the pull; the verifier has its own).
    pub fn ctr_pull_as(&self, image: &str, user: &str) -> Output {
        self.ctr(&["image", "pull", "--plain-http", "--user", user, image])
    }

    /// `cripull SOCKET IMAGE`: the CRI `PullImage` a kubelet sends.
    pub fn cri_pull(&self, image: &str) -> Output {
        Command::new(self.assets.join("cripull"))
            .arg(&self.socket)
            .arg(image)
            .output()
            .unwrap()
    }

    /// Installs `binary` as a verifier named `name` (a symlink, as the
    /// node install does).
    pub fn install_verifier(&self, binary: &Path, name: &str) {
        std::os::unix::fs::symlink(binary, self.verifiers.join(name)).unwrap();
    }

    /// containerd's log (debug: the verifiers' stderr is there).
    pub fn logs(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("containerd.log")).unwrap_or_default()
    }

    /// containerd's process id (in a node's mount namespace, `nsenter -t
    /// PID -m` runs a command as its verifiers see the files).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// A directory beside it for the test's files.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        // Unmount anything the snapshotter left mounted.
        let _ = Command::new("umount")
            .arg("-R")
            .arg(self.dir.path().join("root"))
            .stderr(Stdio::null())
            .status();
    }
}

/// One tar archive holding one small file (ustar: a header block, the
/// content padded to 512 bytes, two zero blocks).
pub fn tar_with(name: &str, content: &[u8]) -> Vec<u8> {
    let mut h = [0u8; 512];
    h[..name.len()].copy_from_slice(name.as_bytes());
    h[100..107].copy_from_slice(b"0000644");
    h[108..115].copy_from_slice(b"0000000");
    h[116..123].copy_from_slice(b"0000000");
    h[124..135].copy_from_slice(format!("{:011o}", content.len()).as_bytes());
    h[136..147].copy_from_slice(b"00000000000");
    h[148..156].copy_from_slice(b"        ");
    h[156] = b'0';
    h[257..263].copy_from_slice(b"ustar\0");
    h[263..265].copy_from_slice(b"00");
    let sum: u32 = h.iter().map(|b| u32::from(*b)).sum();
    h[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
    let mut out = h.to_vec();
    out.extend_from_slice(content);
    out.resize(out.len().div_ceil(512) * 512, 0);
    out.extend_from_slice(&[0u8; 1024]);
    out
}

/// Pushes an image of `os/arch` with one real tar layer; returns (manifest
/// digest, manifest length).
pub async fn push_tar_image_for(
    reg: &TestRegistry,
    repo: &str,
    tag: &str,
    arch: &str,
) -> (String, usize) {
    let layer = tar_with(
        "hello.txt",
        format!("{repo}:{tag} {arch} {}\n", uniq()).as_bytes(),
    );
    let ld = reg.push_blob(repo, &layer).await;
    let config = serde_json::to_vec(&json!({
        "architecture": arch, "os": "linux",
        "rootfs": {"type": "layers", "diff_ids": [sha256(&layer)]},
        "config": {"Cmd": ["/hello"]}
    }))
    .unwrap();
    reg.push_one_layer(repo, tag, &config, &ld, layer.len())
        .await
}

/// Pushes a linux/amd64 image with a real tar layer; its digest.
pub async fn push_tar_image(reg: &TestRegistry, repo: &str, tag: &str) -> String {
    push_tar_image_for(reg, repo, tag, "amd64").await.0
}

/// Pushes a linux/amd64 + linux/arm64 index of tar-layered images; returns
/// (index digest, amd64 manifest digest).
pub async fn push_tar_index(reg: &TestRegistry, repo: &str, tag: &str) -> (String, String) {
    let mut entries = Vec::new();
    let mut amd64 = String::new();
    for arch in ["amd64", "arm64"] {
        let (d, size) = push_tar_image_for(reg, repo, &format!("{tag}-{arch}"), arch).await;
        if arch == "amd64" {
            amd64 = d.clone();
        }
        entries.push(
            json!({"mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": d, "size": size, "platform": {"os": "linux", "architecture": arch}}),
        );
    }
    let index = serde_json::to_vec(&json!({"schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json", "manifests": entries}))
    .unwrap();
    let d = reg
        .push_manifest(repo, tag, "application/vnd.oci.image.index.v1+json", &index)
        .await;
    (d, amd64)
}
