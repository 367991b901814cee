//! The node verifier's cost per pull (see docs/benchmarks.md): what
//! containerd waits for, process start included — `sigil-containerd` run as
//! containerd runs it (argv, the descriptor on stdin, its environment), on
//! an image signed with a cosign key in the real test registry.
//!
//! Rows: cold (no cache: the digest's signatures fetched and verified),
//! cached (`SIGIL_NODE_CACHE` holds the admission), and refused (unsigned:
//! a refusal is never cached). Prints the median, 90th percentile and
//! maximum per row. containerd's own work (resolving, spawning) is not in
//! it. `cargo bench -p sigil --bench node` makes 200 runs per row; run
//! without `--bench` (as `cargo test --benches` does) it makes 5.

use std::io::Write as _;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use sigil_testkit::registry::{Mode, TestRegistry};
use sigil_testkit::signing::{Signer, push_signed};

fn main() {
    sigil_testkit::procstat::run_bench((200, 0), (5, 0), |n, _| run(n));
}

/// One verifier run; its wall time and whether it allowed the pull.
fn pull(bin: &Path, env: &[(&str, &Path)], name: &str, digest: &str) -> (Duration, bool) {
    let t = Instant::now();
    let mut child = Command::new(bin)
        .args([
            "-name",
            name,
            "-digest",
            digest,
            "-stdin-media-type",
            "application/vnd.oci.descriptor.v1+json",
        ])
        .envs(env.iter().map(|(k, v)| (*k, *v)))
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("sigil-containerd starts");
    let descriptor = format!(
        "{{\"mediaType\":\"application/vnd.oci.image.manifest.v1+json\",\"digest\":\"{digest}\",\"size\":400}}\n"
    );
    let _ = child
        .stdin
        .take()
        .expect("stdin is piped")
        .write_all(descriptor.as_bytes());
    let ok = child.wait().expect("sigil-containerd ends").success();
    (t.elapsed(), ok)
}

fn row(name: &str, mut times: Vec<Duration>) {
    times.sort();
    let at = |q: f64| times[((times.len() as f64 - 1.0) * q).round() as usize];
    println!(
        "| {name:<34} | {:>6} | {:>9.1} | {:>9.1} | {:>9.1} |",
        times.len(),
        at(0.5).as_secs_f64() * 1e3,
        at(0.9).as_secs_f64() * 1e3,
        at(1.0).as_secs_f64() * 1e3
    );
}

async fn run(n: usize) {
    let reg = TestRegistry::start(Mode::Plain).await;
    let key = Signer::p256();
    let h = reg.host();
    let signed = push_signed(&reg, "signed/app", "1.0", "signed/app", &key).await;
    let unsigned = reg.push_image("signed/unsigned", "1.0").await;
    let dir = tempfile::tempdir().expect("a temporary directory");
    let policy = dir.path().join("node-policy.yaml");
    std::fs::write(
        &policy,
        format!(
            "apiVersion: sigil.dev/v1alpha1\nkind: ImagePolicy\nmetadata: {{name: node}}\nspec:\n  registries: [{{host: \"{h}\", insecure: true}}]\n  rules:\n    - name: signed\n      match: [\"{h}/signed/**\"]\n      mode: enforce\n      verify:\n        - name: team\n          cosign: {{key: {:?}}}\n",
            key.public_pem()
        ),
    )
    .expect("the node policy is written");
    let bin = dir.path().join("sigil-containerd");
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_sigil"), &bin).expect("the verifier link");
    let cache = dir.path().join("cache");
    let name = format!("{h}/signed/app:1.0");
    let unsigned_name = format!("{h}/signed/unsigned:1.0");
    let bin2 = bin.clone();
    let (cold, cached, refused) = tokio::task::spawn_blocking(move || {
        let no_cache = [("SIGIL_NODE_POLICY", policy.as_path())];
        let with_cache = [
            ("SIGIL_NODE_POLICY", policy.as_path()),
            ("SIGIL_NODE_CACHE", cache.as_path()),
        ];
        let mut cold = Vec::with_capacity(n);
        let mut cached = Vec::with_capacity(n);
        let mut refused = Vec::with_capacity(n);
        for _ in 0..n {
            let (t, ok) = pull(&bin2, &no_cache, &name, &signed);
            assert!(ok, "the signed image is admitted");
            cold.push(t);
        }
        assert!(pull(&bin2, &with_cache, &name, &signed).1);
        for _ in 0..n {
            let (t, ok) = pull(&bin2, &with_cache, &name, &signed);
            assert!(ok);
            cached.push(t);
        }
        for _ in 0..n {
            let (t, ok) = pull(&bin2, &with_cache, &unsigned_name, &unsigned);
            assert!(!ok, "the unsigned image is refused");
            refused.push(t);
        }
        (cold, cached, refused)
    })
    .await
    .expect("the runs end");
    println!("sigil-containerd per pull (ms, process start included)");
    println!(
        "| {:<34} | {:>6} | {:>9} | {:>9} | {:>9} |",
        "case", "runs", "median", "p90", "max"
    );
    println!(
        "|{:-<36}|{:-<8}|{:-<11}|{:-<11}|{:-<11}|",
        "", "", "", "", ""
    );
    row("cold (fetch + verify signature)", cold);
    row("cached (SIGIL_NODE_CACHE hit)", cached);
    row("refused (unsigned, never cached)", refused);
}
