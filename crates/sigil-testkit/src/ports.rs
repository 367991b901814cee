//! Loopback ports for servers a test starts as another process (sigil,
//! kube-apiserver, etcd), which must be told their port before they bind.
//! Owns choosing and reserving such a port; servers that can bind
//! `127.0.0.1:0` themselves and report it do not need this.
//!
//! Why not `bind(":0")`, read the port, close it: the kernel hands that same
//! ephemeral range to every other `:0` bind and outgoing connection on the
//! machine, so between the close and the server's bind another test process
//! can take it (CI saw sigil's admin listener fail with `EADDRINUSE`). Ports
//! here come from below the ephemeral range, which the kernel never assigns
//! on its own, and each is reserved for the life of the test process by a
//! `flock` on a file every test process honours.

use std::fs::{File, OpenOptions};
use std::net::TcpListener;
use std::path::PathBuf;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};

/// Locks held for this process's life: dropping one would free its port.
static HELD: Mutex<Vec<File>> = Mutex::new(Vec::new());
static NEXT: AtomicU32 = AtomicU32::new(0);

/// The lowest port handed out: above the well-known and common service
/// ports a developer's machine may run.
const FLOOR: u16 = 15_000;

/// A free loopback TCP port no other test process holds; see the module
/// doc. Falls back to a kernel-chosen port if the reserved range is full.
pub fn free_port() -> u16 {
    let (lo, hi) = reserved_range();
    let span = u32::from(hi - lo) + 1;
    let seed = std::process::id().wrapping_mul(2_654_435_761)
        ^ std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or_default();
    let dir = std::env::temp_dir().join("sigil-test-ports");
    let _ = std::fs::create_dir_all(&dir);
    for _ in 0..span.min(2_000) {
        let step = NEXT.fetch_add(1, Ordering::Relaxed);
        let port = lo + u16::try_from(seed.wrapping_add(step) % span).unwrap_or(0);
        if let Some(lock) = reserve(&dir, port) {
            HELD.lock().unwrap_or_else(|e| e.into_inner()).push(lock);
            return port;
        }
    }
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port")
}

/// The port's lock, if no other process (or earlier call) holds it and
/// nothing listens on it now.
fn reserve(dir: &std::path::Path, port: u16) -> Option<File> {
    let path: PathBuf = dir.join(format!("{port}.lock"));
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .ok()?;
    file.try_lock().ok()?;
    TcpListener::bind(("127.0.0.1", port)).ok()?;
    Some(file)
}

/// `[FLOOR, start of the ephemeral range)`, or above it when the machine's
/// ephemeral range starts too low to leave room.
fn reserved_range() -> (u16, u16) {
    let (start, end) = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| {
            let mut it = s.split_whitespace().map(str::parse::<u16>);
            Some((it.next()?.ok()?, it.next()?.ok()?))
        })
        .unwrap_or((32_768, 60_999));
    if start > FLOOR + 1_000 {
        (FLOOR, start - 1)
    } else if end < u16::MAX - 1_000 {
        (end + 1, u16::MAX)
    } else {
        (FLOOR, u16::MAX)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_handed_out_are_distinct_and_outside_the_ephemeral_range() {
        let (lo, hi) = reserved_range();
        let ports: Vec<u16> = (0..20).map(|_| free_port()).collect();
        let mut unique = ports.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), ports.len(), "{ports:?}");
        assert!(ports.iter().all(|p| (lo..=hi).contains(p)), "{ports:?}");
    }
}
