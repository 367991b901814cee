//! Reading a file sigil was told to read: the one reader every file input
//! goes through (policies, keys, trusted roots, certificates, docker
//! configs, registry CAs).
//!
//! Owns two bounds: only a regular file is read (a FIFO, a device such as
//! `/dev/zero`, a socket or a directory is refused before it is opened for
//! reading, and again on the opened descriptor), and never more than the
//! caller's cap (the read stops one byte past it). It lives in the lowest
//! crate that does I/O so that sigil-verify and the binary share it; it
//! decides nothing about what the bytes mean.

use std::io::Read as _;
use std::path::Path;

/// The largest key, certificate or PEM bundle read from a file.
pub const MAX_PEM_BYTES: u64 = 1 << 20;
/// The largest policy, trusted root or configuration file read.
pub const MAX_CONFIG_BYTES: u64 = 16 << 20;

/// Why a file was not read. Its words do not repeat the path (callers name
/// the file as the user wrote it).
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    /// Opening or reading failed (not found, permission, …).
    #[error("{source}")]
    Io {
        /// The path.
        path: String,
        /// What the OS said.
        source: std::io::Error,
    },
    /// Not a regular file.
    #[error("not a regular file ({kind}); sigil reads only regular files")]
    NotRegular {
        /// The path.
        path: String,
        /// What it is.
        kind: &'static str,
    },
    /// Larger than the cap.
    #[error("larger than {limit} bytes, the most sigil reads for this kind of file")]
    TooLarge {
        /// The path.
        path: String,
        /// The cap.
        limit: u64,
    },
    /// Not UTF-8 text where text was expected.
    #[error("not UTF-8 text")]
    NotText {
        /// The path.
        path: String,
    },
}

fn kind_of(t: std::fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt as _;
    if t.is_dir() {
        "a directory"
    } else if t.is_fifo() {
        "a FIFO"
    } else if t.is_char_device() {
        "a character device"
    } else if t.is_block_device() {
        "a block device"
    } else if t.is_socket() {
        "a socket"
    } else {
        "not a regular file"
    }
}

/// Reads `path` (following links) if it is a regular file of at most
/// `limit` bytes.
pub fn read(path: &Path, limit: u64) -> Result<Vec<u8>, FileError> {
    let shown = || path.display().to_string();
    let io = |source| FileError::Io {
        path: shown(),
        source,
    };
    // Checked before opening: opening a FIFO for reading would block.
    let meta = std::fs::metadata(path).map_err(io)?;
    if !meta.file_type().is_file() {
        return Err(FileError::NotRegular {
            path: shown(),
            kind: kind_of(meta.file_type()),
        });
    }
    let file = std::fs::File::open(path).map_err(io)?;
    // And again on what was opened: the path may have been swapped between.
    let opened = file.metadata().map_err(io)?;
    if !opened.file_type().is_file() {
        return Err(FileError::NotRegular {
            path: shown(),
            kind: kind_of(opened.file_type()),
        });
    }
    if opened.len() > limit {
        return Err(FileError::TooLarge {
            path: shown(),
            limit,
        });
    }
    let mut out = Vec::with_capacity(opened.len() as usize);
    file.take(limit + 1).read_to_end(&mut out).map_err(io)?;
    if out.len() as u64 > limit {
        return Err(FileError::TooLarge {
            path: shown(),
            limit,
        });
    }
    Ok(out)
}

/// [`read`], as UTF-8 text.
pub fn read_text(path: &Path, limit: u64) -> Result<String, FileError> {
    String::from_utf8(read(path, limit)?).map_err(|_| FileError::NotText {
        path: path.display().to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dev_zero_is_refused_before_a_byte_is_read() {
        let e = read(Path::new("/dev/zero"), MAX_PEM_BYTES).unwrap_err();
        assert!(
            e.to_string()
                .contains("not a regular file (a character device)"),
            "{e}"
        );
    }

    #[test]
    fn a_fifo_and_a_directory_are_refused_without_blocking() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo");
        assert!(
            std::process::Command::new("mkfifo")
                .arg(&fifo)
                .status()
                .unwrap()
                .success()
        );
        assert!(matches!(
            read(&fifo, 10),
            Err(FileError::NotRegular { kind: "a FIFO", .. })
        ));
        assert!(matches!(
            read(dir.path(), 10),
            Err(FileError::NotRegular {
                kind: "a directory",
                ..
            })
        ));
    }

    #[test]
    fn a_file_over_the_cap_is_refused_and_one_at_it_is_read() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("k.pem");
        std::fs::write(&p, vec![b'a'; 11]).unwrap();
        assert!(matches!(
            read(&p, 10),
            Err(FileError::TooLarge { limit: 10, .. })
        ));
        assert_eq!(read(&p, 11).unwrap().len(), 11);
        // A link to a regular file is followed.
        let l = dir.path().join("link");
        std::os::unix::fs::symlink(&p, &l).unwrap();
        assert_eq!(read_text(&l, 11).unwrap(), "a".repeat(11));
    }
}
