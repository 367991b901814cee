//! Which files `sigil pin` reads and how `--write` changes them: the walk
//! (directories recursively, `*.yaml`/`*.yml`, hidden entries skipped,
//! directory links not followed, every file once however many paths reach
//! it, cycles impossible, a link named like a manifest that dangles or
//! loops an error naming it), and the write plan (links written through to
//! their target, every directory checked writable before the first write,
//! and on a failure mid-way exactly what was written). It decides nothing
//! about images.

use std::collections::HashSet;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};

use crate::error::{Context as _, Error, Result};
use crate::files::{Durability, dir_of, dir_writable, write_atomic};

/// The files to read, and what the walk passed over (said to the user).
#[derive(Debug, Default)]
pub struct Walk {
    /// Files in order: each explicit path, then each directory's files
    /// (sorted) before its subdirectories.
    pub files: Vec<PathBuf>,
    /// Each file's size when the walk saw it (`files[i]`'s is `sizes[i]`):
    /// reading sizes its buffer by it instead of asking the kernel again.
    pub sizes: Vec<u64>,
    /// Directory links not followed, and files reached twice.
    pub notes: Vec<String>,
    seen_files: HashSet<(u64, u64)>,
    seen_dirs: HashSet<(u64, u64)>,
}

fn is_yaml(p: &Path) -> bool {
    p.extension().is_some_and(|x| x == "yaml" || x == "yml")
}

impl Walk {
    /// Expands `paths`: files as given (a link to a file is read through),
    /// directories recursively. A path given explicitly is followed even if
    /// it is a link to a directory; links found inside a walk are not.
    pub fn of(paths: &[PathBuf]) -> Result<Walk> {
        let mut w = Walk::default();
        for p in paths {
            let meta = std::fs::metadata(p).with_context(|| format!("{}", p.display()))?;
            if meta.is_dir() {
                w.dir(p, &meta)?;
            } else {
                w.file(p, &meta);
            }
        }
        Ok(w)
    }

    fn file(&mut self, p: &Path, meta: &std::fs::Metadata) {
        if self.seen_files.insert((meta.dev(), meta.ino())) {
            self.files.push(p.to_owned());
            self.sizes.push(meta.len());
        } else {
            self.notes.push(format!(
                "{}: skipped: the same file was already read through another path",
                p.display()
            ));
        }
    }

    fn dir(&mut self, dir: &Path, meta: &std::fs::Metadata) -> Result<()> {
        if !self.seen_dirs.insert((meta.dev(), meta.ino())) {
            return Ok(());
        }
        let mut entries: Vec<(PathBuf, std::fs::FileType)> = std::fs::read_dir(dir)
            .with_context(|| format!("listing {}", dir.display()))?
            .map(|e| e.and_then(|e| Ok((e.path(), e.file_type()?))))
            .collect::<std::result::Result<_, _>>()
            .with_context(|| format!("listing {}", dir.display()))?;
        entries.sort_by(|a, b| a.0.cmp(&b.0));
        let mut dirs = Vec::new();
        for (e, own) in entries {
            let hidden = e
                .file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with('.'));
            // The entry's own type comes with the listing: a plain file that
            // is not YAML needs no `stat`, anything else one (its target's).
            if hidden || (own.is_file() && !is_yaml(&e)) {
                continue;
            }
            // Where a link points. A link named like a manifest that leads
            // nowhere (dangling, or a loop) is an error naming it, as an
            // unreadable file is: passing it over would let `--check` pass
            // and `-w` report success with a manifest unread.
            let target = match std::fs::metadata(&e) {
                Ok(t) => t,
                Err(err) if own.is_symlink() && is_yaml(&e) => {
                    return Err(err).with_context(|| format!("{} (a link)", e.display()));
                }
                Err(_) => continue,
            };
            if target.is_dir() {
                if own.is_symlink() {
                    self.notes.push(format!(
                        "{}: directory link not followed (name its target to pin it)",
                        e.display()
                    ));
                } else {
                    dirs.push((e, target));
                }
            } else if is_yaml(&e) {
                self.file(&e, &target);
            }
        }
        for (d, meta) in dirs {
            self.dir(&d, &meta)?;
        }
        Ok(())
    }
}

/// Reads a file the walk found, its buffer sized by the walk's `stat`
/// (`len`): `std::fs::read` would `stat` the open file again, one system
/// call in six per manifest. The size is only a hint: a file that grew or
/// shrank since is read whole all the same, to its end.
pub fn read_found(path: &Path, len: u64) -> std::io::Result<Vec<u8>> {
    use std::io::Read as _;
    /// A hint never reserves more than this up front (the file grows the
    /// buffer past it if it really is larger).
    const MOST_RESERVED: usize = 64 << 20;
    let mut file = std::fs::File::open(path)?;
    // One byte more than the hint, so a file of that size ends with a short
    // read and the read that returns 0, not a read into a full buffer. A
    // size of 0 says nothing (a pipe named on the command line, such as
    // `<(kustomize build)`, or an empty file): start at 8 KiB.
    let first = match usize::try_from(len) {
        Ok(0) => 8 << 10,
        Ok(n) => n.min(MOST_RESERVED) + 1,
        Err(_) => MOST_RESERVED + 1,
    };
    let mut buf = vec![0u8; first];
    let mut filled = 0;
    loop {
        if filled == buf.len() {
            buf.resize(buf.len().saturating_mul(2), 0);
        }
        match file.read(&mut buf[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    buf.truncate(filled);
    Ok(buf)
}

/// One file `--write` will replace.
#[derive(Debug)]
pub struct Change<'a> {
    /// As the user named it.
    pub path: &'a Path,
    /// The new contents.
    pub text: &'a str,
}

/// What `--write` did.
#[derive(Debug, Default)]
pub struct Written {
    /// Files replaced, as named.
    pub files: Vec<PathBuf>,
    /// Links written through to their target: (link, target).
    pub through_links: Vec<(PathBuf, PathBuf)>,
}

/// Writes every change, or none when one cannot be made: links resolve to
/// their target (the link stays), every target directory must accept a new
/// file first. A failure after that (a full disk) names what was written.
pub fn write_all(changes: &[Change<'_>]) -> Result<Written> {
    let mut targets = Vec::with_capacity(changes.len());
    for c in changes {
        let link = std::fs::symlink_metadata(c.path)
            .with_context(|| format!("{}", c.path.display()))?
            .file_type()
            .is_symlink();
        let target = if link {
            std::fs::canonicalize(c.path)
                .with_context(|| format!("resolving the link {}", c.path.display()))?
        } else {
            c.path.to_owned()
        };
        targets.push((link, target));
    }
    let dirs: HashSet<&Path> = targets.iter().map(|(_, t)| dir_of(t)).collect();
    let mut refused: Vec<String> = Vec::new();
    for d in dirs {
        if let Err(e) = dir_writable(d) {
            refused.push(e.to_string());
        }
    }
    if !refused.is_empty() {
        refused.sort();
        return Err(Error::Invalid(format!(
            "nothing was written: {}",
            refused.join("; ")
        )));
    }
    let mut done = Written::default();
    for (c, (link, target)) in changes.iter().zip(&targets) {
        if let Err(e) = write_atomic(target, c.text.as_bytes(), Durability::RenameOnly) {
            let wrote: Vec<String> = done.files.iter().map(|p| p.display().to_string()).collect();
            return Err(Error::Invalid(format!(
                "{e}; written before the failure ({} of {} file(s)): {}",
                wrote.len(),
                changes.len(),
                if wrote.is_empty() {
                    "none".to_owned()
                } else {
                    wrote.join(", ")
                }
            )));
        }
        if *link {
            done.through_links.push((c.path.to_owned(), target.clone()));
        }
        done.files.push(c.path.to_owned());
    }
    Ok(done)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn touch(p: &Path) {
        std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
        std::fs::write(p, "a: 1\n").expect("write");
    }

    /// `ln -s . d/loop1` once made the same file processed 41 times, and two
    /// such links made the walk never end.
    #[test]
    fn directory_link_loops_are_not_followed_and_no_file_is_read_twice() {
        let d = tempfile::tempdir().expect("tempdir");
        let root = d.path().join("d");
        touch(&root.join("a.yaml"));
        touch(&root.join("sub/b.yml"));
        std::os::unix::fs::symlink(".", root.join("loop1")).expect("link");
        std::os::unix::fs::symlink("..", root.join("sub/loop2")).expect("link");
        std::os::unix::fs::symlink("a.yaml", root.join("alias.yaml")).expect("link");
        let w = Walk::of(&[root.clone(), root.join("a.yaml")]).expect("walk");
        assert_eq!(w.files, vec![root.join("a.yaml"), root.join("sub/b.yml")]);
        assert_eq!(w.sizes, vec![5, 5], "each file's size as the walk saw it");
        assert!(
            w.notes
                .iter()
                .any(|n| n.contains("loop1: directory link not followed")),
            "{:?}",
            w.notes
        );
        assert!(
            w.notes.iter().any(|n| n.contains("alias.yaml: skipped")),
            "{:?}",
            w.notes
        );
    }

    /// Reading by the walk's size once saved a `stat` per file; a size that
    /// is stale by the time the file is read (it grew, shrank, emptied)
    /// must still read the file whole, exactly as `fs::read` does.
    #[test]
    fn a_file_read_by_a_stale_size_is_still_read_whole() {
        let d = tempfile::tempdir().expect("tempdir");
        let p = d.path().join("m.yaml");
        for (text, hint) in [
            (vec![], 0),
            (vec![], 100),
            (b"a: 1\n".to_vec(), 5),
            (b"a: 1\n".to_vec(), 0),
            (b"a: 1\n".to_vec(), 2),
            (b"a: 1\n".to_vec(), 4096),
            ((0..100_000).map(|i| b'a' + (i % 26) as u8).collect(), 10),
            (
                (0..100_000).map(|i| b'a' + (i % 26) as u8).collect(),
                100_000,
            ),
            (b"x".to_vec(), u64::MAX),
        ] {
            std::fs::write(&p, &text).expect("write");
            assert_eq!(
                read_found(&p, hint).expect("read"),
                text,
                "{} bytes read with the size {hint}",
                text.len()
            );
        }
        // A pipe named on the command line (`sigil pin <(kustomize build)`):
        // the walk's size is 0, the text arrives in pieces.
        let fifo = d.path().join("fifo.yaml");
        let made = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .expect("mkfifo");
        assert!(made.success());
        let text: Vec<u8> = (0..50_000).map(|i| b'a' + (i % 26) as u8).collect();
        let writer = {
            let (fifo, text) = (fifo.clone(), text.clone());
            std::thread::spawn(move || {
                let mut f = std::fs::OpenOptions::new()
                    .write(true)
                    .open(fifo)
                    .expect("open");
                for piece in text.chunks(1000) {
                    std::io::Write::write_all(&mut f, piece).expect("write");
                }
            })
        };
        assert_eq!(read_found(&fifo, 0).expect("read the pipe"), text);
        writer.join().expect("writer");
        let gone = read_found(&d.path().join("gone.yaml"), 5).expect_err("missing");
        assert_eq!(gone.kind(), std::io::ErrorKind::NotFound);
    }

    /// The walk takes each entry's type from the listing (one `stat` for
    /// YAML files, links and directories, none for other files): what it
    /// reads must be what it read when it asked twice per entry.
    #[test]
    fn the_walk_reads_yaml_files_and_links_to_them_and_passes_over_the_rest() {
        let d = tempfile::tempdir().expect("tempdir");
        let root = d.path().join("d");
        touch(&root.join("a.yaml"));
        touch(&root.join("notes.txt"));
        touch(&root.join(".hidden.yaml"));
        touch(&d.path().join("outside/o.yaml"));
        std::os::unix::fs::symlink("../outside/o.yaml", root.join("ext.yaml")).expect("link");
        std::os::unix::fs::symlink("missing", root.join("dangling")).expect("link");
        std::os::unix::fs::symlink("../outside", root.join("dirlink")).expect("link");
        std::fs::create_dir_all(root.join("tree.yaml")).expect("a directory named like YAML");
        touch(&root.join("tree.yaml/inner.yml"));
        let w = Walk::of(std::slice::from_ref(&root)).expect("walk");
        assert_eq!(
            w.files,
            vec![
                root.join("a.yaml"),
                root.join("ext.yaml"),
                root.join("tree.yaml/inner.yml")
            ]
        );
        assert_eq!(w.notes.len(), 1, "{:?}", w.notes);
        assert!(w.notes[0].contains("dirlink: directory link not followed"));
    }

    /// A link named like a manifest that loops (`self.yaml -> self.yaml`,
    /// `a.yml <-> b.yml`) or dangles was passed over in silence: `--check`
    /// passed and `-w` reported success with a manifest unread. Now the
    /// walk fails naming it (exit 2), before anything is read or written.
    #[test]
    fn regression_a_looping_or_dangling_manifest_link_in_a_walked_directory_is_an_error() {
        let cases: [(&str, &[(&str, &str)]); 3] = [
            ("self.yaml", &[("self.yaml", "self.yaml")]),
            ("a.yml", &[("a.yml", "b.yml"), ("b.yml", "a.yml")]),
            ("gone.yaml", &[("gone.yaml", "missing.yaml")]),
        ];
        for (named, links) in cases {
            let d = tempfile::tempdir().expect("tempdir");
            touch(&d.path().join("ok.yaml"));
            for (link, to) in links {
                std::os::unix::fs::symlink(to, d.path().join(link)).expect("link");
            }
            let e = Walk::of(&[d.path().to_owned()])
                .expect_err(named)
                .to_string();
            assert!(e.contains(&format!("{named} (a link)")), "{e}");
        }
    }

    #[test]
    fn writes_go_through_links_and_nothing_is_written_when_a_directory_refuses() {
        use std::os::unix::fs::PermissionsExt as _;
        let d = tempfile::tempdir().expect("tempdir");
        let real = d.path().join("real.yaml");
        touch(&real);
        let link = d.path().join("link.yaml");
        std::os::unix::fs::symlink(&real, &link).expect("link");
        let w = write_all(&[Change {
            path: &link,
            text: "b: 2\n",
        }])
        .expect("write");
        assert!(
            std::fs::symlink_metadata(&link)
                .expect("meta")
                .file_type()
                .is_symlink(),
            "the link stays"
        );
        assert_eq!(std::fs::read_to_string(&real).expect("read"), "b: 2\n");
        assert_eq!(w.through_links.len(), 1);

        let a = d.path().join("a/m.yaml");
        let b = d.path().join("b/m.yaml");
        touch(&a);
        touch(&b);
        std::fs::set_permissions(d.path().join("b"), std::fs::Permissions::from_mode(0o555))
            .expect("chmod");
        // Root ignores directory permissions: only check when they bite.
        if dir_writable(&d.path().join("b")).is_err() {
            let e = write_all(&[
                Change {
                    path: &a,
                    text: "x: 1\n",
                },
                Change {
                    path: &b,
                    text: "x: 1\n",
                },
            ])
            .expect_err("b/ is not writable");
            assert!(e.to_string().starts_with("nothing was written"), "{e}");
            assert_eq!(
                std::fs::read_to_string(&a).expect("read"),
                "a: 1\n",
                "a/ unchanged"
            );
        }
        std::fs::set_permissions(d.path().join("b"), std::fs::Permissions::from_mode(0o755))
            .expect("chmod");
    }
}
