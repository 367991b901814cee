//! Mirrors that fail over and copy (see docs/benchmarks.md).
//!
//! Copy throughput: `sigil mirror` as a child process copying one image of
//! one large layer between two real registries on loopback (streamed), within
//! one registry (mounted), and again when the mirror already has it: wall
//! time, MiB/s, the child's CPU and peak RSS. Fallback latency: `sigil
//! serve` admitting Pods one at a time, each naming a new tag (so every
//! admission looks up): the mirror has it; the mirror lacks it and
//! `fallback: origin` pins the origin; the mirror is dark (a black hole) and
//! its circuit breaker opens (`timeoutSeconds: 3`). Prints two tables.
//!
//! `cargo bench -p sigil --bench mirror` copies 200 MiB and admits 200 Pods
//! per row; run without `--bench` (as `cargo test --benches` does) it runs a
//! small smoke.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use sigil_testkit::procstat::{children_cpu, wait_with_peak_rss};
use sigil_testkit::registry::{Mode, TestRegistry};
use sigil_testkit::sigil::{Sigil, bin};

fn main() {
    sigil_testkit::procstat::run_bench((200, 200), (8, 20), run);
}

fn policy(hosts: &[&str], mirror: &str) -> String {
    let registries = hosts
        .iter()
        .map(|h| format!("{{host: \"{h}\", insecure: true}}"))
        .collect::<Vec<_>>()
        .join(", ");
    format!(
        "apiVersion: sigil.dev/v1alpha1\nkind: ImagePolicy\nspec:\n  registries: [{registries}]\n  mirrors:\n    - {{{mirror}}}\n  rules:\n    - {{name: all, match: [\"**\"], mode: enforce}}\n"
    )
}

/// One `sigil mirror` run: (wall, CPU, peak RSS KiB).
async fn copy(policy: &str, image: &str) -> (Duration, Duration, u64) {
    let dir = tempfile::tempdir().expect("tmp");
    let file = dir.path().join("policy.yaml");
    std::fs::write(&file, policy).expect("policy");
    let cpu0 = children_cpu();
    let t = Instant::now();
    let mut child = Command::new(bin())
        .args(["mirror", "--policy"])
        .arg(&file)
        .arg(image)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run sigil mirror");
    let (status, peak) = wait_with_peak_rss(&mut child, Duration::from_millis(10)).await;
    let wall = t.elapsed();
    assert!(status.success(), "sigil mirror failed: {status}");
    let ((u1, s1), (u0, s0)) = (children_cpu(), cpu0);
    (wall, (u1 + s1).saturating_sub(u0 + s0), peak)
}

fn copy_row(what: &str, mib: usize, (wall, cpu, peak): (Duration, Duration, u64), moved: bool) {
    let rate = if moved {
        format!("{:.0} MiB/s", mib as f64 / wall.as_secs_f64())
    } else {
        "no bytes moved".into()
    };
    println!(
        "| {what} | {mib} MiB | {:.2} s | {rate} | {:.2} s | {:.1} MiB |",
        wall.as_secs_f64(),
        cpu.as_secs_f64(),
        peak as f64 / 1024.0
    );
}

/// Admits one Pod per tag, one at a time; (p50, p99, max) of the round trip.
async fn admissions(s: &Sigil, image: &str, tags: &[String]) -> (Duration, Duration, Duration) {
    let api = s.apiserver();
    let mut took = Vec::with_capacity(tags.len());
    for t in tags {
        let i = format!("{image}:{t}");
        let review =
            sigil_testkit::review::review("CREATE", "shop", sigil_testkit::review::pod("p", &[&i]));
        let started = Instant::now();
        let a = api.admit(&review, Duration::from_secs(3)).await;
        took.push(started.elapsed());
        assert!(a.allowed, "{i}: {}", a.message);
    }
    took.sort();
    let at = |q: f64| took[((took.len() as f64 * q) as usize).min(took.len() - 1)];
    (at(0.5), at(0.99), *took.last().expect("one"))
}

fn latency_row(what: &str, (p50, p99, max): (Duration, Duration, Duration)) {
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    println!(
        "| {what} | {:.2} ms | {:.2} ms | {:.2} ms |",
        ms(p50),
        ms(p99),
        ms(max)
    );
}

/// Listens, accepts and never answers.
async fn black_hole() -> String {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = l.local_addr().expect("addr");
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((s, _)) = l.accept().await {
            held.push(s);
        }
    });
    addr.to_string()
}

async fn run(mib: usize, pods: usize) {
    let (origin, mirror) = tokio::join!(
        TestRegistry::start(Mode::Plain),
        TestRegistry::start(Mode::Plain)
    );
    let (o, m) = (origin.host(), mirror.host());
    origin.push_large_image("big/app", "v1", mib << 20, 5).await;
    let p = policy(
        &[&o, &m],
        &format!("from: \"{o}\", to: \"{m}/hub\", copy: true"),
    );
    let image = format!("{o}/big/app:v1");
    let streamed = copy(&p, &image).await;
    let again = copy(&p, &image).await;
    let same = policy(
        &[&o],
        &format!("from: \"{o}/big\", to: \"{o}/cache\", copy: true"),
    );
    let mounted = copy(&same, &image).await;
    println!();
    println!("| `sigil mirror` | image | wall | throughput | CPU | peak RSS |");
    println!("|---|---|---|---|---|---|");
    copy_row("streamed between two registries", mib, streamed, true);
    copy_row("mounted within one registry", mib, mounted, false);
    copy_row("already in the mirror (HEADs only)", mib, again, false);

    // Fallback latency: a new tag per admission, so each one looks up.
    let d = origin.push_image("team/app", "seed").await;
    let tags: Vec<String> = (0..pods).map(|i| format!("t{i}")).collect();
    origin.seed_tags("team/app", &d, tags.clone());
    copy(&p, &format!("{o}/team/app:seed")).await;
    mirror.seed_tags("hub/team/app", &d, tags.clone());
    let has = Sigil::start(
        Some(&policy(
            &[&o, &m],
            &format!("from: \"{o}\", to: \"{m}/hub\", fallback: origin"),
        )),
        &[],
    )
    .await;
    let served = admissions(&has, &format!("{o}/team/app"), &tags).await;
    drop(has);
    let lacks = Sigil::start(
        Some(&policy(
            &[&o, &m],
            &format!("from: \"{o}\", to: \"{m}/lacks\", fallback: origin"),
        )),
        &[],
    )
    .await;
    let fell_back = admissions(&lacks, &format!("{o}/team/app"), &tags).await;
    drop(lacks);
    let dark = black_hole().await;
    let off = Sigil::start(
        Some(&policy(
            &[&o, &dark],
            &format!("from: \"{o}\", to: \"{dark}/hub\", fallback: origin"),
        )),
        &[],
    )
    .await;
    let broken = admissions(&off, &format!("{o}/team/app"), &tags).await;
    println!();
    println!("| admission, new tag each, {pods} in a row | p50 | p99 | max |");
    println!("|---|---|---|---|");
    latency_row(
        "the mirror has it (mirror lookup + origin lookup, requireSameDigest)",
        served,
    );
    latency_row("the mirror lacks it: fallback to the origin", fell_back);
    latency_row("the mirror is dark: fallback, breaker open after 3", broken);
    println!();
}
