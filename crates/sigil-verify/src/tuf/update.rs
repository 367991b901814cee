//! The TUF client workflow (the specification's §5, "Detailed client
//! workflow"), with python-tuf's bounds: update the root one version at a
//! time (each new root signed by a threshold of the old root's keys and of
//! its own, its version exactly the next, at most 256 rotations), then the
//! timestamp (no version or snapshot version going back), the snapshot
//! (the version, length and hashes the timestamp names; no targets
//! metadata going back or disappearing), the targets metadata (as the
//! snapshot names it), every one unexpired at the update's fixed start
//! time; then one target, searched through delegations in order (at most
//! 32 roles), checked against its length and hashes.
//!
//! Owns the order of the checks and what is kept between updates (the
//! trusted metadata in the datastore directory, each file written whole).
//! Metadata kept from before is a trusted starting point only while it
//! verifies under the newest root's keys: a rotated timestamp or snapshot
//! key discards it (recovery from a fast-forward attack). It does not
//! parse metadata ([`super::meta`]) or speak HTTP ([`super::Transport`]).

use std::path::Path;

use url::Url;

use super::Transport;
use super::TufError;
use super::meta::{
    Delegation, MetaFile, Metadata, Role, Root, delegations, meta_file, meta_files, target,
};

/// Most root versions walked in one update.
const MAX_ROOT_ROTATIONS: u64 = 256;
/// Most targets roles visited looking for a target.
const MAX_DELEGATIONS: usize = 32;
/// Largest root metadata read (python-tuf's default).
const ROOT_MAX: u64 = 512_000;
/// Largest timestamp metadata read.
const TIMESTAMP_MAX: u64 = 16_384;
/// Largest snapshot metadata read when the timestamp gives no length.
const SNAPSHOT_MAX: u64 = 2_000_000;
/// Largest targets metadata read when the snapshot gives no length.
const TARGETS_MAX: u64 = 5_000_000;

/// What one update verified.
#[derive(Debug)]
pub(super) struct Outcome {
    /// The target's bytes.
    pub target: Vec<u8>,
    /// The trusted root after the update (its bytes, to start from next time).
    pub root: Vec<u8>,
    /// Root and timestamp versions.
    pub root_version: u64,
    pub timestamp_version: u64,
    /// The earliest expiry of root, timestamp, snapshot and targets.
    pub expires: i64,
}

/// The top-level metadata one update verified.
pub(super) struct Top {
    pub root: Root,
    pub root_bytes: Vec<u8>,
    pub timestamp: Metadata,
    pub snapshot: Metadata,
    pub targets: Metadata,
}

/// One update against one repository.
pub(super) struct Update<'a> {
    pub metadata: &'a Url,
    pub targets: &'a Url,
    pub transport: &'a Transport,
    pub store: &'a Path,
    /// The update's fixed start time (Unix seconds).
    pub now: i64,
}

fn digest_hex(alg: &str, data: &[u8]) -> Option<String> {
    let a = match alg {
        "sha256" => &aws_lc_rs::digest::SHA256,
        "sha384" => &aws_lc_rs::digest::SHA384,
        "sha512" => &aws_lc_rs::digest::SHA512,
        _ => return None,
    };
    Some(crate::trust::hex(
        aws_lc_rs::digest::digest(a, data).as_ref(),
    ))
}

/// `data` has the `length` and every one of the `hashes` given for `name`.
fn check_file(
    name: &str,
    data: &[u8],
    length: Option<u64>,
    hashes: &std::collections::BTreeMap<String, String>,
) -> Result<(), TufError> {
    if let Some(l) = length
        && data.len() as u64 != l
    {
        return Err(TufError::Length {
            file: name.to_owned(),
            want: l,
            got: data.len() as u64,
        });
    }
    for (alg, want) in hashes {
        match digest_hex(alg, data) {
            Some(got) if &got == want => {}
            Some(_) => return Err(TufError::Hash(name.to_owned())),
            None => {
                return Err(TufError::Malformed(format!(
                    "{name}: hash algorithm {alg:?} is not supported"
                )));
            }
        }
    }
    Ok(())
}

/// A role name as a file name component (percent-encoded but for
/// unreserved characters, as python-tuf quotes it).
fn quote(name: &str) -> String {
    name.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

impl Update<'_> {
    /// GETs `path` under `base`, at most `max` bytes; `None` when it is not there.
    async fn get(&self, base: &Url, path: &str, max: u64) -> Result<Option<Vec<u8>>, TufError> {
        let url = base
            .join(path)
            .map_err(|e| TufError::Fetch(format!("{path}: {e}")))?;
        self.transport.get(&url, max).await
    }

    /// Writes `name` into the datastore whole (a temporary file renamed).
    fn persist(&self, name: &str, bytes: &[u8]) -> Result<(), TufError> {
        let tmp = self.store.join(format!(".{name}.tmp"));
        std::fs::write(&tmp, bytes)
            .and_then(|()| std::fs::rename(&tmp, self.store.join(name)))
            .map_err(|e| TufError::Store(format!("{name}: {e}")))
    }

    /// The kept metadata `name`, if there is any and it verifies under
    /// `root`'s keys for `role` (expired or not: it is a floor for versions).
    fn kept(&self, name: &str, role: Role, root: &Root) -> Option<Metadata> {
        let bytes = std::fs::read(self.store.join(name)).ok()?;
        let m = Metadata::parse(&bytes, role).ok()?;
        root.verify(&m, role).ok().map(|()| m)
    }

    fn fresh(&self, m: &Metadata, role: &str) -> Result<(), TufError> {
        if m.expired(self.now) {
            return Err(TufError::Expired {
                role: role.to_owned(),
                expires: m.expires,
            });
        }
        Ok(())
    }

    /// The update, from `trusted_root`, for the target `name`.
    pub async fn run(&self, trusted_root: &[u8], name: &str) -> Result<Outcome, TufError> {
        let top = self.refresh(trusted_root).await?;
        let target = self.target(&top, name, None).await?;
        let expires = [
            top.root.meta.expires,
            top.timestamp.expires,
            top.snapshot.expires,
            top.targets.expires,
        ]
        .into_iter()
        .min()
        .unwrap_or(0);
        Ok(Outcome {
            target,
            root_version: top.root.meta.version,
            timestamp_version: top.timestamp.version,
            root: top.root_bytes,
            expires,
        })
    }

    /// §5.3–§5.6: the top-level metadata, from `trusted_root`.
    pub async fn refresh(&self, trusted_root: &[u8]) -> Result<Top, TufError> {
        let (root, root_bytes) = self.update_root(trusted_root).await?;
        let timestamp = self.update_timestamp(&root).await?;
        let snapshot = self.update_snapshot(&root, &timestamp).await?;
        let want = meta_file(&snapshot.signed, "targets.json", "snapshot")?;
        let (targets, fetched) = self
            .update_metadata(
                &root,
                "targets",
                "targets.json",
                &want,
                root.role(Role::Targets),
                &root.keys,
            )
            .await?;
        if let Some(bytes) = fetched {
            self.persist("targets.json", &bytes)?;
        }
        Ok(Top {
            root,
            root_bytes,
            timestamp,
            snapshot,
            targets,
        })
    }

    /// §5.7: the target `name` under the metadata of `top`: `cached` if
    /// those bytes have the length and hashes its metadata gives, else
    /// downloaded and checked.
    pub async fn target(
        &self,
        top: &Top,
        name: &str,
        cached: Option<Vec<u8>>,
    ) -> Result<Vec<u8>, TufError> {
        let t = self
            .find(&top.root, &top.snapshot, top.targets.clone(), name)
            .await?;
        if let Some(c) = cached
            && check_file(name, &c, Some(t.length), &t.hashes).is_ok()
        {
            return Ok(c);
        }
        self.download(&top.root, name, t.length, &t.hashes).await
    }

    /// §5.3: walks `N+1.root.json` until there is none.
    async fn update_root(&self, trusted: &[u8]) -> Result<(Root, Vec<u8>), TufError> {
        let mut root = Root::parse(trusted)?;
        // The trusted root meets its own threshold, or nothing is trusted.
        root.verify(&root.meta, Role::Root)?;
        let mut bytes = trusted.to_vec();
        for _ in 0..MAX_ROOT_ROTATIONS {
            let next = root.meta.version + 1;
            let Some(new_bytes) = self
                .get(self.metadata, &format!("{next}.root.json"), ROOT_MAX)
                .await?
            else {
                break;
            };
            let new = Root::parse(&new_bytes)?;
            // Signed by a threshold of the keys trusted so far, and of its own.
            root.verify(&new.meta, Role::Root)?;
            new.verify(&new.meta, Role::Root)?;
            if new.meta.version != next {
                return Err(TufError::Rollback(format!(
                    "{next}.root.json says it is version {}",
                    new.meta.version
                )));
            }
            self.persist("root.json", &new_bytes)?;
            root = new;
            bytes = new_bytes;
        }
        self.fresh(&root.meta, "root")?;
        Ok((root, bytes))
    }

    /// §5.4: the timestamp, never older than the one kept.
    async fn update_timestamp(&self, root: &Root) -> Result<Metadata, TufError> {
        let kept = self.kept("timestamp.json", Role::Timestamp, root);
        let bytes = self
            .get(self.metadata, "timestamp.json", TIMESTAMP_MAX)
            .await?
            .ok_or_else(|| TufError::Fetch("the repository has no timestamp.json".into()))?;
        let new = Metadata::parse(&bytes, Role::Timestamp)?;
        root.verify(&new, Role::Timestamp)?;
        let new_snapshot = meta_file(&new.signed, "snapshot.json", "timestamp")?;
        let (new, changed) = match kept {
            Some(old) => {
                let old_snapshot = meta_file(&old.signed, "snapshot.json", "timestamp")?;
                if new.version < old.version {
                    return Err(TufError::Rollback(format!(
                        "timestamp version {} is older than the trusted {}",
                        new.version, old.version
                    )));
                }
                if new_snapshot.version < old_snapshot.version {
                    return Err(TufError::Rollback(format!(
                        "the timestamp names snapshot version {}, older than the trusted {}",
                        new_snapshot.version, old_snapshot.version
                    )));
                }
                if new.version == old.version {
                    (old, false)
                } else {
                    (new, true)
                }
            }
            None => (new, true),
        };
        self.fresh(&new, "timestamp")?;
        if changed {
            self.persist("timestamp.json", &bytes)?;
        }
        Ok(new)
    }

    /// §5.5: the snapshot the timestamp names; no targets metadata going
    /// back or disappearing against the one kept.
    async fn update_snapshot(
        &self,
        root: &Root,
        timestamp: &Metadata,
    ) -> Result<Metadata, TufError> {
        let want = meta_file(&timestamp.signed, "snapshot.json", "timestamp")?;
        let kept = self.kept("snapshot.json", Role::Snapshot, root);
        let (new, fetched) = self
            .update_metadata(
                root,
                "snapshot",
                "snapshot.json",
                &want,
                root.role(Role::Snapshot),
                &root.keys,
            )
            .await?;
        if let Some(old) = kept {
            let now = meta_files(&new.signed);
            for (file, v) in meta_files(&old.signed) {
                match now.get(&file) {
                    None => {
                        return Err(TufError::Rollback(format!(
                            "the snapshot no longer lists {file}"
                        )));
                    }
                    Some(n) if *n < v => {
                        return Err(TufError::Rollback(format!(
                            "the snapshot names {file} version {n}, older than the trusted {v}"
                        )));
                    }
                    Some(_) => {}
                }
            }
        }
        if let Some(bytes) = fetched {
            self.persist("snapshot.json", &bytes)?;
        }
        Ok(new)
    }

    /// §5.5/§5.6: the metadata of `role` (kept as `name`) that `want`
    /// names: the kept copy if it is that version and verifies, else
    /// downloaded, its length and hashes checked, signed by
    /// `delegation`'s threshold of `keys`, exactly that version, unexpired;
    /// with the bytes to keep when it was downloaded (the caller keeps
    /// them once its own checks pass).
    #[allow(clippy::too_many_arguments)]
    async fn update_metadata(
        &self,
        root: &Root,
        role: &str,
        name: &str,
        want: &MetaFile,
        delegation: &Delegation,
        keys: &std::collections::BTreeMap<String, crate::keys::PublicKey>,
    ) -> Result<(Metadata, Option<Vec<u8>>), TufError> {
        let kind = if role == "snapshot" {
            Role::Snapshot
        } else {
            Role::Targets
        };
        if let Ok(bytes) = std::fs::read(self.store.join(name))
            && let Ok(m) = Metadata::parse(&bytes, kind)
            && m.version == want.version
            && m.verify(role, delegation, keys).is_ok()
        {
            self.fresh(&m, role)?;
            return Ok((m, None));
        }
        let file = if root.consistent_snapshot {
            format!("{}.{}.json", want.version, quote(role))
        } else {
            format!("{}.json", quote(role))
        };
        let max = want.length.unwrap_or(if kind == Role::Snapshot {
            SNAPSHOT_MAX
        } else {
            TARGETS_MAX
        });
        let bytes = self
            .get(self.metadata, &file, max)
            .await?
            .ok_or_else(|| TufError::Fetch(format!("the repository has no {file}")))?;
        check_file(&file, &bytes, want.length, &want.hashes)?;
        let m = Metadata::parse(&bytes, kind)?;
        m.verify(role, delegation, keys)?;
        if m.version != want.version {
            return Err(TufError::Version {
                file,
                want: want.version,
                got: m.version,
            });
        }
        self.fresh(&m, role)?;
        Ok((m, Some(bytes)))
    }

    /// §5.7: what the first targets role (pre-order, delegations in order,
    /// a terminating one ending the search) that lists `name` says of it.
    async fn find(
        &self,
        root: &Root,
        snapshot: &Metadata,
        top: Metadata,
        name: &str,
    ) -> Result<super::meta::TargetFile, TufError> {
        // Roles still to visit: (role name, its metadata once loaded, or
        // who delegated to it with which keys).
        let mut pending: Vec<Pending> = vec![Pending::Loaded(top)];
        let mut visited = 0;
        while let Some(next) = pending.pop() {
            if visited == MAX_DELEGATIONS {
                break;
            }
            visited += 1;
            let meta = match next {
                Pending::Loaded(m) => m,
                Pending::Delegated {
                    role,
                    delegation,
                    keys,
                } => {
                    let want = meta_file(&snapshot.signed, &format!("{role}.json"), "snapshot")?;
                    // Kept under its quoted name, as python-tuf keeps it.
                    let kept = format!("{}.json", quote(&role));
                    let (m, fetched) = self
                        .update_metadata(root, &role, &kept, &want, &delegation, &keys)
                        .await?;
                    if let Some(bytes) = fetched {
                        self.persist(&kept, &bytes)?;
                    }
                    m
                }
            };
            if let Some(t) = target(&meta.signed, name)? {
                return Ok(t);
            }
            let (keys, roles) = delegations(&meta.signed)?;
            let keys = std::sync::Arc::new(keys);
            let mut children = Vec::new();
            for r in roles.into_iter().filter(|r| r.covers(name)) {
                let terminating = r.terminating;
                children.push(Pending::Delegated {
                    role: r.name,
                    delegation: r.delegation,
                    keys: keys.clone(),
                });
                if terminating {
                    pending.clear();
                    break;
                }
            }
            pending.extend(children.into_iter().rev());
        }
        Err(TufError::NoTarget(name.to_owned()))
    }

    async fn download(
        &self,
        root: &Root,
        name: &str,
        length: u64,
        hashes: &std::collections::BTreeMap<String, String>,
    ) -> Result<Vec<u8>, TufError> {
        let path = if root.consistent_snapshot {
            let h = hashes
                .get("sha256")
                .or_else(|| hashes.values().next())
                .ok_or_else(|| TufError::Malformed(format!("{name} has no hashes")))?;
            match name.rsplit_once('/') {
                Some((dir, file)) => format!("{dir}/{h}.{file}"),
                None => format!("{h}.{name}"),
            }
        } else {
            name.to_owned()
        };
        let bytes = self
            .get(self.targets, &path, length)
            .await?
            .ok_or_else(|| TufError::Fetch(format!("the repository has no target {path}")))?;
        check_file(name, &bytes, Some(length), hashes)?;
        Ok(bytes)
    }
}

/// A targets role still to visit.
enum Pending {
    Loaded(Metadata),
    Delegated {
        role: String,
        delegation: Delegation,
        keys: std::sync::Arc<std::collections::BTreeMap<String, crate::keys::PublicKey>>,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn role_names_are_quoted_as_python_tuf_quotes_them() {
        assert_eq!(quote("targets"), "targets");
        assert_eq!(quote("a/b c"), "a%2Fb%20c");
    }

    #[test]
    fn a_file_must_have_its_length_and_every_hash() {
        let h = |d: &[u8]| [("sha256".to_owned(), digest_hex("sha256", d).unwrap())].into();
        assert!(check_file("f", b"abc", Some(3), &h(b"abc")).is_ok());
        assert!(matches!(
            check_file("f", b"abc", Some(4), &h(b"abc")),
            Err(TufError::Length { .. })
        ));
        assert!(matches!(
            check_file("f", b"abd", None, &h(b"abc")),
            Err(TufError::Hash(_))
        ));
        let odd = [("md5".to_owned(), "00".to_owned())].into();
        assert!(check_file("f", b"abc", None, &odd).is_err());
    }
}
