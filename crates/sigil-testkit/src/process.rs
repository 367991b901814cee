//! Running programs from tests and benches: the `sigil` binary under test
//! ([`bin`]), commands run to their end with bounded time and pipes that
//! never block ([`run_bounded`], [`run_sigil`]), children killed on drop,
//! waiting for a server, and removing a podman container. Shared by the
//! `Sigil` harness (`sigil.rs`) and the image runner (`image.rs`), which
//! therefore need not import each other both ways.

use std::io::Write as _;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// sigil linked statically (`SIGIL_STATIC_BIN`: scripts/test.sh builds it
/// for musl, as `scripts/dist.sh --static` does for the image): what the
/// node DaemonSet copies onto hosts. `None` when the variable names no file.
pub fn static_bin() -> Option<String> {
    std::env::var("SIGIL_STATIC_BIN")
        .ok()
        .filter(|p| std::path::Path::new(p).is_file())
}

/// The `sigil` binary under test: what cargo or nextest name for the
/// running test or bench (`CARGO_BIN_EXE_sigil`, `NEXTEST_BIN_EXE_sigil`),
/// else the `sigil` beside the test executable's `deps/` directory (where
/// cargo puts it for every integration test and bench of the workspace).
pub fn bin() -> &'static str {
    static BIN: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    BIN.get_or_init(|| {
        for var in ["CARGO_BIN_EXE_sigil", "NEXTEST_BIN_EXE_sigil"] {
            if let Ok(p) = std::env::var(var)
                && std::path::Path::new(&p).is_file()
            {
                return p;
            }
        }
        let exe = std::env::current_exe().expect("current exe");
        let dir = exe.parent().expect("exe dir");
        let dir = if dir.ends_with("deps") {
            dir.parent().expect("target dir")
        } else {
            dir
        };
        let p = dir.join("sigil");
        assert!(
            p.is_file(),
            "no sigil binary at {} (build it: cargo build -p sigil)",
            p.display()
        );
        p.display().to_string()
    })
}

/// Runs `cmd` to its end and returns its output; panics, with its stderr,
/// unless it succeeded.
pub fn run_ok(cmd: &mut Command) -> Output {
    let out = cmd.output().expect("run the command");
    assert!(
        out.status.success(),
        "{cmd:?}: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Runs `cmd` with stdout a pipe whose reader has already gone (`sigil … |
/// head` once the head has read its lines): (exit code, stderr).
pub fn into_closed_pipe(cmd: &mut Command) -> (i32, String) {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn sigil");
    drop(child.stdout.take());
    let out = child.wait_with_output().expect("wait for sigil");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Runs `sigil ARGS` to completion (see [`run_bounded`]).
pub fn run_sigil(args: &[&str], stdin: Option<&str>) -> Output {
    run_bounded(Command::new(bin()).args(args), stdin)
}

/// Runs `cmd` to completion: `stdin` (if any) written from a thread and both
/// pipes read while it runs, so a full pipe never blocks the child; killed,
/// and the test failed, after 120 s.
pub fn run_bounded(cmd: &mut Command, stdin: Option<&str>) -> Output {
    let mut child = cmd
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    if let Some(input) = stdin {
        let mut w = child.stdin.take().expect("stdin");
        let input = input.to_owned();
        std::thread::spawn(move || {
            let _ = w.write_all(input.as_bytes());
        });
    }
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(Duration::from_secs(120)) {
        Ok(out) => out.expect("wait"),
        Err(_) => {
            let _ = Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .status();
            panic!("{cmd:?} did not finish within 120 s");
        }
    }
}

/// `sigil audit -A -o json` over the cluster `kubeconfig` names, with the
/// pull-secret watches off and no in-cluster configuration leaking in.
pub fn audit_command(policy: &std::path::Path, kubeconfig: &std::path::Path) -> Command {
    let mut cmd = Command::new(bin());
    cmd.args([
        "audit",
        "-A",
        "-o",
        "json",
        "--pull-secrets=false",
        "--policy",
    ])
    .arg(policy)
    .env_remove("KUBERNETES_SERVICE_HOST")
    .env("KUBECONFIG", kubeconfig);
    cmd
}

/// A child process killed (and reaped) on drop, for benches that start
/// sigil or a helper themselves.
pub struct KillOnDrop(pub Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Waits (up to 20 s) until `url` answers 2xx.
pub async fn wait_http(url: &str) {
    let http = reqwest::Client::new();
    let until = Instant::now() + Duration::from_secs(20);
    loop {
        if let Ok(r) = http.get(url).send().await
            && r.status().is_success()
        {
            return;
        }
        assert!(Instant::now() < until, "{url} never came up");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// Removes a container, running or not (best effort): killing the podman
/// client does not stop it.
pub fn remove_container(name: &str) {
    let _ = Command::new("podman")
        .args(["rm", "--force", "--time", "0", name])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}
