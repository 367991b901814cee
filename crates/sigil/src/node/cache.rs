//! The verifier's cache on disk (`SIGIL_NODE_CACHE`): each containerd pull
//! starts a new sigil process, so what one pull verified is kept as a file
//! for the next. An answer is as specific as the decision it stands for:
//! keyed by the policy's fingerprint (its bytes and the trust material it
//! names: a new policy or key starts afresh), the image's normalized
//! reference (its name and tag decide which rule applies) and the digest —
//! the same bytes pulled under another name are decided again.
//!
//! Only admissions are kept, for `ttl` (a refusal is decided again: the
//! signature may have been added since). Safe with pulls at once: a pull
//! takes the answer's lock file (`flock`) before looking, so a second pull
//! of the same image waits for the first and reads its answer instead of
//! verifying again; entries are written to a temporary file and renamed.
//! Bounded: at most `max_entries` answers, the oldest removed first.
//!
//! The directory is trusted only if no one else could have written it: it
//! must be a real directory (not a link) owned by this process's user and
//! writable by no one else; sigil never changes its mode (it may be shared).
//! Files are opened without following links, and only sigil's own files
//! (`sigil-<key>.ok|.lock|.tmp`) are ever read, pruned or replaced. Any
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

/// What an answer file says: the image's normalized reference (as written
/// if it does not parse) and the digest.
fn answer(image: &str, digest: &str) -> String {
    let name = sigil_core::Reference::parse(image)
        .map(|r| r.to_string())
        .unwrap_or_else(|_| image.to_owned());
    format!("{name}@{digest}")
}

/// `O_NOFOLLOW` on an `OpenOptions`.
trait NoFollow {
    fn custom_flags_nofollow(&mut self) -> &mut Self;
}

impl NoFollow for OpenOptions {
    fn custom_flags_nofollow(&mut self) -> &mut Self {
        use std::os::unix::fs::OpenOptionsExt as _;
        self.mode(0o600).custom_flags(nix::libc::O_NOFOLLOW)
    }
}

/// An answer's lock, held while it is decided (released on drop).
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
    /// The cache under `dir` for the policy with `fingerprint`: created
    /// owner-only if missing; an existing one is used only if it is a real
    /// directory owned by this user and writable by no one else (an error
    /// says which, and the pull is verified without a cache).
    pub fn open(
        dir: &Path,
        fingerprint: String,
        ttl: Duration,
        max_entries: usize,
    ) -> std::io::Result<Cache> {
        use std::os::unix::fs::{DirBuilderExt as _, MetadataExt as _};
        match fs::DirBuilder::new().mode(0o700).create(dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
        let meta = fs::symlink_metadata(dir)?;
        let refuse = |why: String| {
            Err(std::io::Error::new(
                std::io::ErrorKind::PermissionDenied,
                format!("not used as a cache: {why}"),
            ))
        };
        let me = nix::unistd::geteuid().as_raw();
        if !meta.file_type().is_dir() {
            return refuse("it is not a directory (a link is not followed)".into());
        }
        if meta.uid() != me {
            return refuse(format!("it is owned by uid {}, not {me}", meta.uid()));
        }
        if meta.mode() & 0o022 != 0 {
            return refuse(format!(
                "its mode {:o} lets others write in it",
                meta.mode() & 0o7777
            ));
        }
        Ok(Cache {
            dir: dir.to_owned(),
            fingerprint,
            ttl,
            max_entries: max_entries.max(1),
        })
    }

    /// The file name stem of the answer for `image` (its normalized
    /// reference; as written if it does not parse) at `digest`.
    fn key(&self, image: &str, digest: &str) -> String {
        let mut h = Sha256::new();
        h.update(answer(image, digest).as_bytes());
        let hex: String = h.finalize()[..16]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        format!("sigil-{}-{hex}", self.fingerprint)
    }

    /// Opens `path` without following a link there.
    fn open_file(path: &Path, write: bool) -> std::io::Result<File> {
        let mut o = OpenOptions::new();
        if write {
            o.create(true).truncate(false).write(true);
        } else {
            o.read(true);
        }
        o.custom_flags_nofollow().open(path)
    }

    /// Takes the answer's lock, waiting at most until `deadline` (past it,
    /// the pull is decided without: a stuck holder costs a verification,
    /// not the answer).
    pub fn lock(&self, image: &str, digest: &str, deadline: Instant) -> Held {
        let path = self.dir.join(format!("{}.lock", self.key(image, digest)));
        let Ok(file) = Self::open_file(&path, true) else {
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

    /// Whether `image` at `digest` was admitted under this policy within
    /// the TTL (the answer names both: a file planted under another name
    /// does not count).
    pub fn admitted(&self, image: &str, digest: &str) -> bool {
        use std::io::Read as _;
        let path = self.dir.join(format!("{}.ok", self.key(image, digest)));
        let Ok(file) = Self::open_file(&path, false) else {
            return false;
        };
        let fresh = file
            .metadata()
            .ok()
            .filter(|m| m.file_type().is_file())
            .and_then(|m| m.modified().ok())
            .and_then(|t| SystemTime::now().duration_since(t).ok())
            .is_some_and(|age| age < self.ttl);
        let mut said = String::new();
        let read = file.take(4096).read_to_string(&mut said).is_ok();
        fresh && read && said == answer(image, digest)
    }

    /// Records an admission (atomically), then keeps the bound.
    pub fn remember(&self, image: &str, digest: &str) {
        let key = self.key(image, digest);
        let tmp = self.dir.join(format!("{key}.{}.tmp", std::process::id()));
        let _ = fs::remove_file(&tmp);
        let written = OpenOptions::new()
            .write(true)
            .create_new(true)
            .custom_flags_nofollow()
            .open(&tmp)
            .and_then(|mut f| f.write_all(answer(image, digest).as_bytes()))
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
            // Only sigil's own files: a shared directory keeps the rest.
            let ours = e
                .file_name()
                .to_str()
                .is_some_and(|n| n.starts_with("sigil-"))
                && e.file_type().is_ok_and(|t| t.is_file());
            if !ours {
                continue;
            }
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
                    if let Ok(f) = Self::open_file(&path, false)
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
    const IMAGE: &str = "registry.example.com/prod/app:v1";

    fn dir() -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        use std::os::unix::fs::PermissionsExt as _;
        fs::set_permissions(d.path(), fs::Permissions::from_mode(0o700)).unwrap();
        d
    }

    fn answers(dir: &Path) -> usize {
        fs::read_dir(dir)
            .unwrap()
            .flatten()
            .filter(|e| e.path().extension().is_some_and(|x| x == "ok"))
            .count()
    }

    #[test]
    fn an_admission_is_kept_per_policy_and_bounded() {
        let dir = dir();
        let c = Cache::open(dir.path(), fingerprint(b"policy a", &[]), DEFAULT_TTL, 2).unwrap();
        assert!(!c.admitted(IMAGE, D));
        c.remember(IMAGE, D);
        assert!(c.admitted(IMAGE, D));
        let other = Cache::open(dir.path(), fingerprint(b"policy b", &[]), DEFAULT_TTL, 2).unwrap();
        assert!(!other.admitted(IMAGE, D), "another policy starts afresh");
        for d in ["sha256:aa", "sha256:bb", "sha256:cc"] {
            c.remember(IMAGE, d);
        }
        assert_eq!(answers(dir.path()), 2, "bounded");
    }

    #[test]
    fn regression_the_same_bytes_under_another_name_are_decided_again() {
        let dir = dir();
        let c = Cache::open(dir.path(), "f".into(), DEFAULT_TTL, 10).unwrap();
        c.remember("registry.example.com/dev/app:v1", D);
        assert!(c.admitted("registry.example.com/dev/app:v1", D));
        assert!(!c.admitted(IMAGE, D), "prod/app is not dev/app");
        assert!(
            !c.admitted("registry.example.com/dev/app:v2", D),
            "a tag decides a rule too"
        );
        // One name, however written, is one answer.
        c.remember("nginx:1", D);
        assert!(c.admitted("docker.io/library/nginx:1", D));
    }

    #[test]
    fn an_expired_admission_is_decided_again() {
        let dir = dir();
        let c = Cache::open(dir.path(), "f".into(), Duration::ZERO, 10).unwrap();
        c.remember(IMAGE, D);
        assert!(!c.admitted(IMAGE, D));
    }

    #[test]
    fn a_second_pull_waits_for_the_first_ones_lock() {
        let dir = dir();
        let c = Cache::open(dir.path(), "f".into(), DEFAULT_TTL, 10).unwrap();
        let first = c.lock(IMAGE, D, Instant::now());
        assert!(first.0.is_some());
        let t = Instant::now();
        let second = c.lock(IMAGE, D, Instant::now() + Duration::from_millis(200));
        assert!(
            second.0.is_none(),
            "held by the first: waited, then went on"
        );
        assert!(t.elapsed() >= Duration::from_millis(200));
        drop(first);
        assert!(c.lock(IMAGE, D, Instant::now()).0.is_some());
    }

    #[test]
    fn regression_a_directory_others_can_write_or_a_link_is_not_trusted_and_never_chmodded() {
        use std::os::unix::fs::PermissionsExt as _;
        let parent = dir();
        let shared = parent.path().join("shared");
        fs::create_dir(&shared).unwrap();
        fs::set_permissions(&shared, fs::Permissions::from_mode(0o777)).unwrap();
        let e = Cache::open(&shared, "f".into(), DEFAULT_TTL, 10).unwrap_err();
        assert!(e.to_string().contains("lets others write"), "{e}");
        let mode = fs::metadata(&shared).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o777, "never chmodded");
        let link = parent.path().join("link");
        std::os::unix::fs::symlink(parent.path(), &link).unwrap();
        let e = Cache::open(&link, "f".into(), DEFAULT_TTL, 10).unwrap_err();
        assert!(e.to_string().contains("not a directory"), "{e}");
        // A directory only its owner writes is used as it is (0755 stays).
        let mine = parent.path().join("mine");
        fs::create_dir(&mine).unwrap();
        fs::set_permissions(&mine, fs::Permissions::from_mode(0o755)).unwrap();
        Cache::open(&mine, "f".into(), DEFAULT_TTL, 10).unwrap();
        assert_eq!(
            fs::metadata(&mine).unwrap().permissions().mode() & 0o777,
            0o755
        );
        // A missing one is created owner-only.
        let new = parent.path().join("new");
        Cache::open(&new, "f".into(), DEFAULT_TTL, 10).unwrap();
        assert_eq!(
            fs::metadata(&new).unwrap().permissions().mode() & 0o777,
            0o700
        );
    }

    #[test]
    fn regression_planted_answers_links_and_other_programs_files_are_left_alone() {
        let dir = dir();
        let c = Cache::open(dir.path(), "f".into(), Duration::from_secs(60), 1).unwrap();
        let key = c.key(IMAGE, D);
        // An answer that names another image, or a link, is not believed.
        fs::write(dir.path().join(format!("{key}.ok")), "something else").unwrap();
        assert!(!c.admitted(IMAGE, D));
        fs::remove_file(dir.path().join(format!("{key}.ok"))).unwrap();
        let target = dir.path().join("target");
        fs::write(&target, answer(IMAGE, D)).unwrap();
        std::os::unix::fs::symlink(&target, dir.path().join(format!("{key}.ok"))).unwrap();
        assert!(!c.admitted(IMAGE, D), "a link is not followed");
        // A link where the lock goes is not followed either (nothing written through it).
        let victim = dir.path().join("victim");
        fs::write(&victim, "root-only").unwrap();
        let other_key = c.key("other/app:1", D);
        std::os::unix::fs::symlink(&victim, dir.path().join(format!("{other_key}.lock"))).unwrap();
        assert!(c.lock("other/app:1", D, Instant::now()).0.is_none());
        assert_eq!(fs::read_to_string(&victim).unwrap(), "root-only");
        // Other programs' files survive pruning, whatever their names.
        for f in ["x.lock", "x.tmp", "x.ok"] {
            fs::write(dir.path().join(f), "theirs").unwrap();
        }
        c.remember("a/b:1", D);
        c.remember("a/c:1", D);
        for f in ["x.lock", "x.tmp", "x.ok"] {
            assert!(dir.path().join(f).exists(), "{f} removed");
        }
    }
}
