//! Writing files so that a crash or a full disk never leaves half of one.
//!
//! Owns the one way sigil replaces a file (CA bundles, manifests edited by
//! `sigil pin --write`): write a sibling temporary file, flush it to disk,
//! keep the old file's permissions, rename over the original, then flush the
//! directory. Readers see the old bytes or the new bytes, never a mix.

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

/// Replaces `path` with `contents` atomically (see the module docs).
pub fn write_atomic(path: &Path, contents: &[u8], durability: Durability) -> Result<()> {
    let synced = durability == Durability::Synced;
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "out".into());
    let tmp = dir.join(format!(".{name}.sigil-{}.tmp", std::process::id()));
    let result = (|| -> Result<()> {
        let mut f =
            std::fs::File::create(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
        f.write_all(contents)
            .with_context(|| format!("writing {}", tmp.display()))?;
        if let Ok(meta) = std::fs::metadata(path) {
            f.set_permissions(meta.permissions())
                .with_context(|| format!("copying permissions of {}", path.display()))?;
        }
        if synced {
            f.sync_all()
                .with_context(|| format!("flushing {}", tmp.display()))?;
        }
        drop(f);
        std::fs::rename(&tmp, path)
            .with_context(|| format!("renaming {} to {}", tmp.display(), path.display()))?;
        // Best effort: some filesystems refuse to open or sync a directory.
        if synced && let Ok(d) = std::fs::File::open(dir) {
            let _ = d.sync_all();
        }
        Ok(())
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
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
}
