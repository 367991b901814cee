//! What the benchmarks read about processes from `/proc`: CPU time (of a
//! child by pid, or of every waited-for child), resident and peak memory.
//! Linux only, like the machine CI runs on; a missing file reads as zero.

use std::time::Duration;

/// The line under a benchmark's table saying whether each unique image
/// cost exactly one registry request.
pub fn print_requests_line(requests: u64, images: usize) {
    let same = requests == images as u64;
    println!(
        "registry requests = unique references: {} ({requests} vs {images})",
        if same { "yes" } else { "NO" }
    );
}

/// Runs a benchmark's async body on a multi-threaded runtime, with the
/// full size under `cargo bench` (`--bench`) and `smoke` otherwise (CI runs
/// each bench once, small).
pub fn run_bench<F: std::future::Future<Output = ()>>(
    full: (usize, usize),
    smoke: (usize, usize),
    body: impl FnOnce(usize, usize) -> F,
) {
    let (a, b) = if std::env::args().any(|a| a == "--bench") {
        full
    } else {
        smoke
    };
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(body(a, b));
}

/// The fields of `/proc/<pid>/stat` after the `(comm)` field (which may hold spaces).
fn stat_fields(pid: &str) -> Vec<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or_default();
    after
        .split_whitespace()
        .map(|x| x.parse().unwrap_or(0))
        .collect()
}

/// Clock ticks (10 ms each, `USER_HZ` = 100) as time.
fn ticks(n: u64) -> Duration {
    Duration::from_millis(n * 10)
}

/// User and system CPU time of a running process so far (utime, stime).
pub fn cpu_of(pid: u32) -> (Duration, Duration) {
    let f = stat_fields(&pid.to_string());
    let at = |i: usize| ticks(f.get(i).copied().unwrap_or(0));
    (at(11), at(12))
}

/// User + system CPU time of a running process so far.
pub fn cpu_total(pid: u32) -> Duration {
    let (u, s) = cpu_of(pid);
    u + s
}

/// User and system CPU time of this process's waited-for children, to the
/// microsecond (`getrusage(RUSAGE_CHILDREN)`): `/proc`'s cutime and cstime
/// count 10 ms ticks, which for a 0.3 s `sigil pin --check` of 10,000
/// manifests moved each figure by up to 2 µs per manifest.
pub fn children_cpu() -> (Duration, Duration) {
    use nix::sys::resource::{UsageWho, getrusage};
    let Ok(r) = getrusage(UsageWho::RUSAGE_CHILDREN) else {
        let f = stat_fields("self");
        let at = |i: usize| ticks(f.get(i).copied().unwrap_or(0));
        return (at(13), at(14));
    };
    let us = |t: nix::sys::time::TimeVal| {
        Duration::from_secs(u64::try_from(t.tv_sec()).unwrap_or(0))
            + Duration::from_micros(u64::try_from(t.tv_usec()).unwrap_or(0))
    };
    (us(r.user_time()), us(r.system_time()))
}

/// A `kB` line of `/proc/<pid>/status`, in KiB.
fn status_kib(pid: u32, field: &str) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    s.lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

/// Resident memory now (VmRSS), in KiB; 0 once the process is gone.
pub fn rss_kib(pid: u32) -> u64 {
    status_kib(pid, "VmRSS:").unwrap_or(0)
}

/// What resident memory is made of, in KiB: (anonymous — what the process
/// allocated, and pages of its own it wrote, such as relocated data;
/// file-backed — the executable's and libraries' pages mapped around those
/// it ran, clean, shared and reclaimable). Both 0 once the process is gone.
pub fn rss_parts_kib(pid: u32) -> (u64, u64) {
    (
        status_kib(pid, "RssAnon:").unwrap_or(0),
        status_kib(pid, "RssFile:").unwrap_or(0),
    )
}

/// Peak resident memory so far (VmHWM), in KiB.
pub fn peak_rss_kib(pid: u32) -> Option<u64> {
    status_kib(pid, "VmHWM:")
}

/// Waits for `child`, reading its peak RSS (VmHWM, KiB) every `every` while
/// it runs: (exit status, peak).
pub async fn wait_with_peak_rss(
    child: &mut std::process::Child,
    every: Duration,
) -> (std::process::ExitStatus, u64) {
    let pid = child.id();
    let mut peak = 0;
    loop {
        if let Some(kib) = peak_rss_kib(pid) {
            peak = peak.max(kib);
        }
        if let Some(s) = child.try_wait().expect("wait") {
            return (s, peak);
        }
        tokio::time::sleep(every).await;
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn reads_this_process() {
        let me = std::process::id();
        assert!(super::rss_kib(me) > 0);
        assert!(super::peak_rss_kib(me).unwrap_or(0) >= super::rss_kib(me) / 2);
    }
}
