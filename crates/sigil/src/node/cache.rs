//! The verifier's cache on disk (`SIGIL_NODE_CACHE`): each containerd pull
//! starts a new sigil process, so what one pull verified is kept as a file
//! for the next, keyed by the policy's fingerprint (its bytes and the trust
//! material it names: a new policy or key starts afresh) and the digest.
//!
//! Only admissions are kept, for `ttl` (a refusal is decided again: the
//! signature may have been added since). Safe with pulls at once: a pull
//! takes the digest's lock file (`flock`) before looking, so a second pull
//! of the same image waits for the first and reads its answer instead of
//! verifying again; entries are written to a temporary file and renamed.
//! Bounded: at most `max_entries` answers, the oldest removed first. Any
//! error of the cache only costs a verification, never an answer.

use std::fs::{self, File, OpenOptions};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use sha2::{Digest as _, Sha256};

/// The default entry lifetime.
pub const DEFAULT_TTL: Duration = Duration::from_secs(600);
/// The default bound on entries.
pub const DEFAULT_MAX_ENTRIES: usize = 4096;

/// A cache directory for one policy.
#[derive(Debug, Clone)]
pub struct Cache {
    dir: PathBuf,
    fingerprint: String,
    ttl: Duration,
    max_entries: usize,
}

/// The digest's lock, held while it is decided (released on drop).
#[derive(Debug)]
pub struct Held(#[allow(dead_code)] Option<File>);

/// The fingerprint of a policy: its bytes and every trust file it names
/// (read through the one bounded reader; an unreadable one counts as empty).
pub fn fingerprint(policy_bytes: &[u8], material_files: &[String]) -> String {
    let mut h = Sha256::new();
    h.update(policy_bytes);
    for f in material_files {
        h.update([0]);
        h.update(f.as_bytes());
        h.update([0]);
        h.update(
            sigil_registry::file::read(Path::new(f), sigil_registry::file::MAX_CONFIG_BYTES)
                .unwrap_or_default(),
        );
    }
    h.finalize()[..12]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

impl Cache {
    /// The cache under `dir` (created, owner-only) for the policy with
    /// `fingerprint`.
    pub fn open(
        dir: &Path,
        fingerprint: String,
        ttl: Duration,
        max_entries: usize,
    ) -> std::io::Result<Cache> {
        fs::create_dir_all(dir)?;
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt as _;
            fs::set_permissions(dir, fs::Permissions::from_mode(0o700))?;
        }
        Ok(Cache {
            dir: dir.to_owned(),
            fingerprint,
            ttl,
            max_entries: max_entries.max(1),
        })
    }

    fn key(&self, digest: &str) -> String {
        let hex: String = digest
            .trim_start_matches("sha256:")
            .chars()
            .filter(char::is_ascii_hexdigit)
            .take(64)
            .collect();
        format!("{}-{hex}", self.fingerprint)
    }

    /// Takes the digest's lock, waiting at most until `deadline` (past it,
    /// the pull is decided without: a stuck holder costs a verification,
    /// not the answer).
    pub fn lock(&self, digest: &str, deadline: Instant) -> Held {
        let path = self.dir.join(format!("{}.lock", self.key(digest)));
        let Ok(file) = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
        else {
            return Held(None);
        };
        loop {
            match file.try_lock() {
                Ok(()) => return Held(Some(file)),
                Err(fs::TryLockError::WouldBlock) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(_) => return Held(None),
            }
        }
    }

    /// Whether this digest was admitted under this policy within the TTL.
    pub fn admitted(&self, digest: &str) -> bool {
        let path = self.dir.join(format!("{}.ok", self.key(digest)));
        fs::metadata(&path)
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| SystemTime::now().duration_since(t).ok())
            .is_some_and(|age| age < self.ttl)
    }

    /// Records an admission (atomically), then keeps the bound.
    pub fn remember(&self, digest: &str, image: &str) {
        let key = self.key(digest);
        let tmp = self.dir.join(format!("{key}.{}.tmp", std::process::id()));
        let written = File::create(&tmp)
            .and_then(|mut f| f.write_all(image.as_bytes()))
            .and_then(|()| fs::rename(&tmp, self.dir.join(format!("{key}.ok"))));
        if written.is_err() {
            let _ = fs::remove_file(&tmp);
        }
        self.prune();
    }

    /// Removes expired answers, then the oldest past the bound, and lock
    /// files whose answer is gone and that nobody holds.
    fn prune(&self) {
        let Ok(entries) = fs::read_dir(&self.dir) else {
            return;
        };
        let now = SystemTime::now();
        let mut answers: Vec<(SystemTime, PathBuf)> = Vec::new();
        for e in entries.flatten() {
            let path = e.path();
            let modified = e
                .metadata()
                .and_then(|m| m.modified())
                .unwrap_or(SystemTime::UNIX_EPOCH);
            let stale = now.duration_since(modified).unwrap_or_default() >= self.ttl;
            match path.extension().and_then(|x| x.to_str()) {
                Some("ok") if stale => {
                    let _ = fs::remove_file(&path);
                }
                Some("ok") => answers.push((modified, path)),
                Some("lock") if stale => {
                    if let Ok(f) = File::open(&path)
                        && f.try_lock().is_ok()
                    {
                        let _ = fs::remove_file(&path);
                    }
                }
                Some("tmp") if stale => {
                    let _ = fs::remove_file(&path);
                }
                _ => {}
            }
        }
        if answers.len() > self.max_entries {
            answers.sort();
            let extra = answers.len() - self.max_entries;
            for (_, p) in answers.into_iter().take(extra) {
                let _ = fs::remove_file(p);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const D: &str = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    #[test]
    fn an_admission_is_kept_per_policy_and_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let c = Cache::open(dir.path(), fingerprint(b"policy a", &[]), DEFAULT_TTL, 2).unwrap();
        assert!(!c.admitted(D));
        c.remember(D, "x");
        assert!(c.admitted(D));
        let other = Cache::open(dir.path(), fingerprint(b"policy b", &[]), DEFAULT_TTL, 2).unwrap();
        assert!(!other.admitted(D), "another policy starts afresh");
        for d in ["sha256:aa", "sha256:bb", "sha256:cc"] {
            c.remember(d, "x");
        }
        let oks = fs::read_dir(dir.path())
            .unwrap()
            .flatten()
            .filter(|e| e.path().extension().is_some_and(|x| x == "ok"))
            .count();
        assert_eq!(oks, 2, "bounded");
    }

    #[test]
    fn an_expired_admission_is_decided_again() {
        let dir = tempfile::tempdir().unwrap();
        let c = Cache::open(dir.path(), "f".into(), Duration::ZERO, 10).unwrap();
        c.remember(D, "x");
        assert!(!c.admitted(D));
    }

    #[test]
    fn a_second_pull_waits_for_the_first_ones_lock() {
        let dir = tempfile::tempdir().unwrap();
        let c = Cache::open(dir.path(), "f".into(), DEFAULT_TTL, 10).unwrap();
        let first = c.lock(D, Instant::now());
        assert!(first.0.is_some());
        let t = Instant::now();
        let second = c.lock(D, Instant::now() + Duration::from_millis(200));
        assert!(
            second.0.is_none(),
            "held by the first: waited, then went on"
        );
        assert!(t.elapsed() >= Duration::from_millis(200));
        drop(first);
        assert!(c.lock(D, Instant::now()).0.is_some());
    }
}
