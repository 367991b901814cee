//! Writing files so that a crash, a full disk or a hostile neighbour never
//! leaves half of one or another file changed.
//!
//! Owns the one way sigil replaces a file (CA bundles, manifests edited by
//! `sigil pin --write`): create a temporary file in the target's directory
//! with an unpredictable name, exclusively and without following links
//! (`tempfile`: `O_CREAT|O_EXCL`), with the final permissions from the
//! start (the old file's, else 0644), write and optionally flush it, rename
//! it over the original, then flush the directory. Readers see the old
//! bytes or the new bytes, never a mix; a link planted where the temporary
//! file will be cannot redirect the write.

use std::io::Write as _;
use std::path::Path;

use crate::error::{Context as _, Result};

/// Whether the new bytes must be on disk before the call returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// fsync the file and its directory before returning.
    Synced,
    /// Rename only: atomic against crashes of the process (readers see the
    /// old or the new file), not against power loss. For the CA bundle
    /// (regenerated on every start; an fsync on a busy node's disk could cost
    /// more than the whole start-to-Ready budget) and for `sigil pin --write`
    /// (like gofmt and git's work tree: one fsync per manifest made a
    /// 10,000-file run six times slower).
    RenameOnly,
}

/// The directory a file lives in (`.` for a bare name).
pub fn dir_of(path: &Path) -> &Path {
    path.parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."))
}

/// Replaces `path` with `contents` atomically (see the module docs). A
/// `path` that is a symlink is replaced by a regular file: callers that
/// mean to write through a link resolve it first.
pub fn write_atomic(path: &Path, contents: &[u8], durability: Durability) -> Result<()> {
    write_atomic_mode(path, contents, durability, None)
}

/// [`write_atomic`] with the file's mode set to `mode` (`None`: the mode
/// the file had, else 0644). A file that may hold a Secret's key is written
/// 0600 from its first byte.
pub fn write_atomic_mode(
    path: &Path,
    contents: &[u8],
    durability: Durability,
    mode: Option<u32>,
) -> Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    let synced = durability == Durability::Synced;
    let dir = dir_of(path);
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "out".into());
    let mode = mode.unwrap_or_else(|| {
        std::fs::metadata(path)
            .map(|m| m.permissions().mode() & 0o7777)
            .unwrap_or(0o644)
    });
    let mut tmp = tempfile::Builder::new()
        .prefix(&format!(".{name}."))
        .suffix(".sigil.tmp")
        .permissions(std::fs::Permissions::from_mode(mode))
        .tempfile_in(dir)
        .with_context(|| format!("creating a temporary file in {}", dir.display()))?;
    // Created with `mode` less the umask; made exact on our own descriptor.
    tmp.as_file()
        .set_permissions(std::fs::Permissions::from_mode(mode))
        .with_context(|| format!("setting the mode of {}", tmp.path().display()))?;
    tmp.write_all(contents)
        .with_context(|| format!("writing {}", tmp.path().display()))?;
    if synced {
        tmp.as_file()
            .sync_all()
            .with_context(|| format!("flushing {}", tmp.path().display()))?;
    }
    // On failure the temporary file is removed with `tmp`.
    tmp.persist(path).map_err(|e| crate::error::Error::Io {
        context: format!("renaming the temporary file to {}", path.display()),
        source: e.error,
    })?;
    // Best effort: some filesystems refuse to open or sync a directory.
    if synced && let Ok(d) = std::fs::File::open(dir) {
        let _ = d.sync_all();
    }
    Ok(())
}

/// Whether a file can be created in `dir` (by creating and removing an
/// unnamed one): checked before `--write` changes anything.
pub fn dir_writable(dir: &Path) -> Result<()> {
    tempfile::tempfile_in(dir)
        .map(drop)
        .with_context(|| format!("{} is not writable", dir.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replaces_contents_and_keeps_permissions() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("a.yaml");
        std::fs::write(&p, "old").expect("write");
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o640)).expect("chmod");
        write_atomic(&p, b"new", Durability::Synced).expect("atomic write");
        assert_eq!(std::fs::read_to_string(&p).expect("read"), "new");
        let mode = std::fs::metadata(&p).expect("meta").permissions().mode() & 0o777;
        assert_eq!(mode, 0o640);
        let leftovers = std::fs::read_dir(dir.path()).expect("ls").count();
        assert_eq!(leftovers, 1, "no temporary file left behind");
    }

    #[test]
    fn failure_leaves_the_original_untouched() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("missing-dir").join("a.yaml");
        assert!(write_atomic(&p, b"new", Durability::RenameOnly).is_err());
        assert!(!p.exists());
    }

    /// A link planted at a predictable temporary name once redirected the
    /// write to another file (and changed its mode): names are now random and
    /// created exclusively, so a planted link is never followed.
    #[test]
    fn a_planted_symlink_never_redirects_the_write() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().expect("tempdir");
        let victim = dir.path().join("victim.txt");
        std::fs::write(&victim, "secret").expect("write");
        std::fs::set_permissions(&victim, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        let target = dir.path().join("a.yaml");
        std::fs::write(&target, "old").expect("write");
        // Every name the old scheme could have used, and a few guesses.
        for name in [
            format!(".a.yaml.sigil-{}.tmp", std::process::id()),
            ".a.yaml.sigil.tmp".to_owned(),
        ] {
            std::os::unix::fs::symlink(&victim, dir.path().join(name)).expect("symlink");
        }
        write_atomic(&target, b"new", Durability::RenameOnly).expect("write");
        assert_eq!(std::fs::read_to_string(&target).expect("read"), "new");
        assert_eq!(std::fs::read_to_string(&victim).expect("read"), "secret");
        let mode = std::fs::metadata(&victim)
            .expect("meta")
            .permissions()
            .mode()
            & 0o777;
        assert_eq!(mode, 0o600);
    }

    #[test]
    fn a_new_file_gets_0644_and_no_temporary_is_ever_world_writable() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("ca.pem");
        write_atomic(&p, b"pem", Durability::RenameOnly).expect("write");
        let mode = std::fs::metadata(&p).expect("meta").permissions().mode() & 0o777;
        assert_eq!(mode, 0o644);
        assert!(dir_writable(dir.path()).is_ok());
        assert!(dir_writable(&dir.path().join("missing")).is_err());
    }
}
