//! The shipped container image, built and run without a daemon: builds it
//! with `scripts/image.sh` (buildah), pushes it to a test registry and runs
//! it with podman (runc; `crun` refuses this host's hybrid cgroups) as a
//! kubelet would run the Deployment's container. What it does not own: what
//! the container is given (args, env, volumes: the caller reads them from
//! the rendered manifests) and the registry (`registry`).
//!
//! Without root, buildah, podman or runc, [`tools_or_skip`] says the test
//! is skipped and why, like the real-API tier without its assets.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::sigil::{Sigil, run_bounded};

/// Whether this machine can build and run the image; `None` (after
/// printing why) when it cannot, so the test returns early as skipped.
pub fn tools_or_skip(test: &str) -> Option<()> {
    let missing: Vec<&str> = ["buildah", "podman", "runc"]
        .into_iter()
        .filter(|t| !on_path(t))
        .collect();
    let reason = if !missing.is_empty() {
        format!(
            "{} not installed (Debian: apt-get install buildah podman runc)",
            missing.join(", ")
        )
    } else if !is_root() {
        "podman needs root here (rootless podman cannot set the limits sigil needs)".to_owned()
    } else {
        return Some(());
    };
    eprintln!("SKIPPED {test}: the image tier needs {reason}");
    None
}

fn on_path(tool: &str) -> bool {
    std::env::var_os("PATH").is_some_and(|paths| {
        std::env::split_paths(&paths).any(|d| d.join(tool).is_file())
            || ["/usr/sbin", "/sbin"]
                .iter()
                .any(|d| Path::new(d).join(tool).is_file())
    })
}

fn is_root() -> bool {
    // The owner of /proc/self is the effective user.
    std::fs::metadata("/proc/self").is_ok_and(|m| std::os::unix::fs::MetadataExt::uid(&m) == 0)
}

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Builds the image from `binary` (and the static node verifier
/// [`crate::process::static_bin`], else the one `scripts/dist.sh --static`
/// builds) with `scripts/image.sh` as `tag`; the reference the script
/// printed on its last line.
pub fn build(binary: &str, tag: &str) -> Result<String, String> {
    let mut cmd = Command::new(workspace().join("scripts/image.sh"));
    cmd.args(["--binary", binary, "--tag", tag]);
    if let Some(s) = crate::process::static_bin() {
        cmd.args(["--static-binary", &s]);
    }
    let out = run_bounded(&mut cmd, None);
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        return Err(format!(
            "scripts/image.sh failed ({}):\n{stdout}{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(stdout.lines().last().unwrap_or_default().to_owned())
}

/// `buildah push` of local `image` to `dest` (a registry reference), as
/// a release pipeline pushes it; TLS is not verified (the test CA).
pub fn push(image: &str, dest: &str) -> Result<(), String> {
    let out = run_bounded(
        Command::new("buildah").args([
            "push",
            "--quiet",
            "--tls-verify=false",
            image,
            &format!("docker://{dest}"),
        ]),
        None,
    );
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "buildah push {image} {dest}: {}",
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// What `podman image inspect` says of a local image (its `Size`, its
/// `Config` with `User`, `Entrypoint`, `Cmd`, `ExposedPorts`, ...).
pub fn inspect(image: &str) -> Result<serde_json::Value, String> {
    let out = run_bounded(
        Command::new("podman").args(["image", "inspect", image]),
        None,
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)
        .map_err(|e| format!("podman image inspect {image}: {e}: {out:?}"))?;
    Ok(v[0].clone())
}

/// The host's process id of a running container's first process (for
/// /proc readings: its user, its mounts).
pub fn container_pid(name: &str) -> Result<u32, String> {
    let out = run_bounded(
        Command::new("podman").args(["inspect", "--format", "{{.State.Pid}}", name]),
        None,
    );
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .map_err(|_| format!("podman inspect {name}: {out:?}"))
}

pub use crate::process::remove_container;

/// Removes a local image (best effort).
pub fn remove(image: &str) {
    let _ = Command::new("podman")
        .args(["rmi", "--force", image])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

/// How a container is run: what a kubelet turns the Pod's
/// securityContext, volumes and env into.
#[derive(Debug, Default)]
pub struct Run {
    /// `--user UID:GID` (runAsUser/runAsGroup).
    pub user: Option<String>,
    /// readOnlyRootFilesystem.
    pub read_only: bool,
    /// capabilities.drop contains ALL.
    pub drop_all_caps: bool,
    /// allowPrivilegeEscalation: false.
    pub no_new_privileges: bool,
    /// (host path, container path, read-only).
    pub mounts: Vec<(PathBuf, String, bool)>,
    pub env: Vec<(String, String)>,
    pub args: Vec<String>,
}

/// Runs `image` (pulled from a registry with TLS unverified) in the host's
/// network namespace, as `run` says; the container's stderr is the
/// returned `Sigil`'s log, and dropping it removes the container.
pub fn run(image: &str, run: &Run) -> Result<Sigil, String> {
    let name = format!(
        "sigil-it-{}-{}",
        std::process::id(),
        crate::registry::free_port()
    );
    let mut cmd = Command::new("podman");
    cmd.args(["--runtime", "runc", "run", "--rm", "--name", &name])
        .args([
            "--network",
            "host",
            "--tls-verify=false",
            "--pull",
            "always",
        ])
        // podman cannot raise limits on these hosts: give it what a node's
        // containerd gives a container.
        .args([
            "--ulimit",
            "nofile=20000:20000",
            "--ulimit",
            "nproc=32768:32768",
        ]);
    if let Some(user) = &run.user {
        cmd.args(["--user", user]);
    }
    if run.read_only {
        cmd.args(["--read-only", "--read-only-tmpfs=false"]);
    }
    if run.drop_all_caps {
        cmd.args(["--cap-drop", "ALL"]);
    }
    if run.no_new_privileges {
        cmd.args(["--security-opt", "no-new-privileges"]);
    }
    for (host, path, ro) in &run.mounts {
        let opt = if *ro { ":ro" } else { "" };
        cmd.args(["--volume", &format!("{}:{path}{opt}", host.display())]);
    }
    for (k, v) in &run.env {
        cmd.args(["--env", &format!("{k}={v}")]);
    }
    cmd.arg(image).args(&run.args);
    Sigil::spawn_container(cmd, name)
}
