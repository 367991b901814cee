//! TUF metadata as the specification defines it (version 1): the signed
//! envelope, root (keys, roles, thresholds, consistent snapshots),
//! timestamp and snapshot (versions, lengths and hashes of the files they
//! vouch for), and targets (target files, delegations).
//!
//! Owns parsing metadata and checking its signatures against a role's keys
//! and threshold. Key IDs are taken as the root or delegating metadata
//! lists them, as python-tuf and go-tuf take them: they are names, never
//! recomputed (GitHub's root computes them without its custom key fields;
//! a client that recomputes refuses it). It does not fetch, order the
//! update, or keep anything: that is [`super::update`].

use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::Value;

use super::TufError;
use crate::keys::{PublicKey, SigEncoding};

/// The roles whose metadata a repository's top level holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// `root`.
    Root,
    /// `timestamp`.
    Timestamp,
    /// `snapshot`.
    Snapshot,
    /// `targets` (or a delegated targets role).
    Targets,
}

impl Role {
    /// The `_type` its metadata carries.
    pub fn type_name(self) -> &'static str {
        match self {
            Role::Root => "root",
            Role::Timestamp => "timestamp",
            Role::Snapshot => "snapshot",
            Role::Targets => "targets",
        }
    }
}

/// One role's keys and threshold, as its delegator lists them.
#[derive(Debug, Clone)]
pub struct Delegation {
    /// Key IDs allowed to sign.
    pub keyids: Vec<String>,
    /// How many distinct ones must.
    pub threshold: usize,
}

/// Parsed metadata: its `signed` part as JSON and the fields every role has.
#[derive(Debug, Clone)]
pub struct Metadata {
    /// The `signed` object.
    pub signed: Value,
    /// `version`.
    pub version: u64,
    /// `expires` (Unix seconds).
    pub expires: i64,
    /// The canonical JSON of `signed`: what the signatures are over.
    canonical: Vec<u8>,
    /// `(keyid, signature)` pairs.
    signatures: Vec<(String, Vec<u8>)>,
}

/// The file a snapshot or timestamp vouches for: its version and, if
/// given, its length and hashes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetaFile {
    /// `version`.
    pub version: u64,
    /// `length`, if given.
    pub length: Option<u64>,
    /// `hashes` (algorithm → lowercase hex), if given.
    pub hashes: BTreeMap<String, String>,
}

/// A target file as targets metadata lists it.
#[derive(Debug, Clone)]
pub struct TargetFile {
    /// `length`.
    pub length: u64,
    /// `hashes` (algorithm → lowercase hex).
    pub hashes: BTreeMap<String, String>,
}

/// A delegated targets role.
#[derive(Debug, Clone)]
pub struct DelegatedRole {
    /// Its name.
    pub name: String,
    /// Its keys and threshold.
    pub delegation: Delegation,
    /// Whether a miss stops the search.
    pub terminating: bool,
    /// `paths` patterns, if given.
    pub paths: Option<Vec<String>>,
    /// `path_hash_prefixes`, if given.
    pub path_hash_prefixes: Option<Vec<String>>,
}

fn bad(role: &str, what: impl std::fmt::Display) -> TufError {
    TufError::Malformed(format!("{role} metadata: {what}"))
}

/// OLPC canonical JSON, which TUF signatures are over.
pub fn canonical(v: &Value) -> Result<Vec<u8>, String> {
    let mut buf = Vec::new();
    let mut ser =
        serde_json::Serializer::with_formatter(&mut buf, olpc_cjson::CanonicalFormatter::new());
    v.serialize(&mut ser).map_err(|e| e.to_string())?;
    Ok(buf)
}

fn rfc3339(s: &str) -> Option<i64> {
    time::OffsetDateTime::parse(s, &time::format_description::well_known::Rfc3339)
        .ok()
        .map(|t| t.unix_timestamp())
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) || !s.is_ascii() {
        return None;
    }
    (0..s.len() / 2)
        .map(|i| u8::from_str_radix(&s[i * 2..i * 2 + 2], 16).ok())
        .collect()
}

impl Metadata {
    /// Parses `bytes` as metadata of `role` (its `_type` must say so, and
    /// its spec version must be 1.x).
    pub fn parse(bytes: &[u8], role: Role) -> Result<Metadata, TufError> {
        let name = role.type_name();
        let doc: Value = serde_json::from_slice(bytes).map_err(|e| bad(name, e))?;
        let signed = doc
            .get("signed")
            .filter(|s| s.is_object())
            .ok_or_else(|| bad(name, "no signed object"))?
            .clone();
        if signed.get("_type").and_then(Value::as_str) != Some(name) {
            return Err(bad(name, format!("_type is not {name:?}")));
        }
        let spec = signed
            .get("spec_version")
            .and_then(Value::as_str)
            .unwrap_or("");
        if spec.split('.').next() != Some("1") {
            return Err(bad(name, format!("spec_version {spec:?} is not 1.x")));
        }
        let version = signed
            .get("version")
            .and_then(Value::as_u64)
            .filter(|v| *v >= 1)
            .ok_or_else(|| bad(name, "no version of at least 1"))?;
        let expires = signed
            .get("expires")
            .and_then(Value::as_str)
            .and_then(rfc3339)
            .ok_or_else(|| bad(name, "no RFC 3339 expires"))?;
        let canonical = canonical(&signed).map_err(|e| bad(name, e))?;
        let mut signatures = Vec::new();
        for s in doc
            .get("signatures")
            .and_then(Value::as_array)
            .ok_or_else(|| bad(name, "no signatures list"))?
        {
            let keyid = s.get("keyid").and_then(Value::as_str);
            let sig = s.get("sig").and_then(Value::as_str).and_then(unhex);
            match (keyid, sig) {
                (Some(k), _) if signatures.iter().any(|(seen, _)| seen == k) => {
                    return Err(bad(name, format!("two signatures name key {k}")));
                }
                (Some(k), Some(sig)) => signatures.push((k.to_owned(), sig)),
                _ => return Err(bad(name, "a signature without keyid or hex sig")),
            }
        }
        Ok(Metadata {
            signed,
            version,
            expires,
            canonical,
            signatures,
        })
    }

    /// Whether it expired at `now`.
    pub fn expired(&self, now: i64) -> bool {
        now >= self.expires
    }

    /// Checks that `delegation`'s threshold of distinct keys from `keys`
    /// signed it; `role` names it in the error.
    pub fn verify(
        &self,
        role: &str,
        delegation: &Delegation,
        keys: &BTreeMap<String, PublicKey>,
    ) -> Result<(), TufError> {
        let mut good: Vec<&str> = Vec::new();
        for (keyid, sig) in &self.signatures {
            if good.contains(&keyid.as_str()) || !delegation.keyids.contains(keyid) {
                continue;
            }
            if keys
                .get(keyid)
                .is_some_and(|k| k.verify(SigEncoding::Der, &self.canonical, sig))
            {
                good.push(keyid);
            }
        }
        if delegation.threshold == 0 || good.len() < delegation.threshold {
            return Err(TufError::Threshold {
                role: role.to_owned(),
                valid: good.len(),
                threshold: delegation.threshold,
            });
        }
        Ok(())
    }
}

/// A key as TUF metadata lists it; `None` for a type or scheme sigil
/// cannot verify (such a key never counts towards a threshold).
fn key_of(k: &Value) -> Option<PublicKey> {
    let keytype = k.get("keytype")?.as_str()?;
    let scheme = k.get("scheme")?.as_str()?;
    let public = k.get("keyval")?.get("public")?.as_str()?;
    match (keytype, scheme) {
        ("ed25519", "ed25519") => {
            let raw = unhex(public).filter(|r| r.len() == 32)?;
            // SubjectPublicKeyInfo { id-Ed25519 } around the raw key.
            let mut spki = vec![
                0x30, 0x2a, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x03, 0x21, 0x00,
            ];
            spki.extend(raw);
            PublicKey::from_spki(&spki).ok()
        }
        (
            "ecdsa" | "ecdsa-sha2-nistp256" | "ecdsa-sha2-nistp384",
            "ecdsa-sha2-nistp256" | "ecdsa-sha2-nistp384",
        )
        | ("rsa", "rsassa-pss-sha256" | "rsa-pkcs1v15-sha256") => PublicKey::from_pem(public).ok(),
        _ => None,
    }
}

/// Every key a `keys` object lists, by the ID it is listed under.
pub fn keys_of(v: Option<&Value>) -> BTreeMap<String, PublicKey> {
    v.and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .filter_map(|(id, k)| key_of(k).map(|k| (id.clone(), k)))
                .collect()
        })
        .unwrap_or_default()
}

/// A `{keyids, threshold}` object.
fn delegation_of(v: &Value, role: &str) -> Result<Delegation, TufError> {
    let keyids = v
        .get("keyids")
        .and_then(Value::as_array)
        .ok_or_else(|| bad(role, "a role without keyids"))?
        .iter()
        .map(|k| k.as_str().map(str::to_owned))
        .collect::<Option<Vec<_>>>()
        .ok_or_else(|| bad(role, "a key ID that is not a string"))?;
    let threshold = v
        .get("threshold")
        .and_then(Value::as_u64)
        .filter(|t| *t >= 1)
        .ok_or_else(|| bad(role, "a role without a threshold of at least 1"))?;
    Ok(Delegation {
        keyids,
        threshold: usize::try_from(threshold).unwrap_or(usize::MAX),
    })
}

/// What root metadata says.
#[derive(Debug)]
pub struct Root {
    /// The metadata.
    pub meta: Metadata,
    /// Its keys, by ID.
    pub keys: BTreeMap<String, PublicKey>,
    /// `consistent_snapshot`.
    pub consistent_snapshot: bool,
    roles: BTreeMap<String, Delegation>,
}

impl Root {
    /// Reads root metadata (every top-level role must be delegated).
    pub fn parse(bytes: &[u8]) -> Result<Root, TufError> {
        let meta = Metadata::parse(bytes, Role::Root)?;
        let keys = keys_of(meta.signed.get("keys"));
        let mut roles = BTreeMap::new();
        let listed = meta
            .signed
            .get("roles")
            .and_then(Value::as_object)
            .ok_or_else(|| bad("root", "no roles"))?;
        for r in ["root", "timestamp", "snapshot", "targets"] {
            let d = listed
                .get(r)
                .ok_or_else(|| bad("root", format!("no {r} role")))?;
            roles.insert(r.to_owned(), delegation_of(d, "root")?);
        }
        let consistent_snapshot = meta
            .signed
            .get("consistent_snapshot")
            .and_then(Value::as_bool)
            .unwrap_or(false);
        Ok(Root {
            meta,
            keys,
            consistent_snapshot,
            roles,
        })
    }

    /// The delegation of a top-level role.
    pub fn role(&self, role: Role) -> &Delegation {
        // Every top-level role is present (checked in `parse`).
        &self.roles[role.type_name()]
    }

    /// Checks that `meta` is signed by this root's threshold for `role`.
    pub fn verify(&self, meta: &Metadata, role: Role) -> Result<(), TufError> {
        meta.verify(role.type_name(), self.role(role), &self.keys)
    }
}

/// A `meta` entry (timestamp → snapshot, snapshot → targets).
pub fn meta_file(signed: &Value, name: &str, role: &str) -> Result<MetaFile, TufError> {
    let m = signed
        .get("meta")
        .and_then(|m| m.get(name))
        .ok_or_else(|| bad(role, format!("no meta for {name}")))?;
    Ok(MetaFile {
        version: m
            .get("version")
            .and_then(Value::as_u64)
            .ok_or_else(|| bad(role, format!("no version for {name}")))?,
        length: m.get("length").and_then(Value::as_u64),
        hashes: hashes_of(m.get("hashes")),
    })
}

/// Every `meta` entry a snapshot lists, by file name.
pub fn meta_files(signed: &Value) -> BTreeMap<String, u64> {
    signed
        .get("meta")
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .filter_map(|(n, v)| Some((n.clone(), v.get("version")?.as_u64()?)))
                .collect()
        })
        .unwrap_or_default()
}

fn hashes_of(v: Option<&Value>) -> BTreeMap<String, String> {
    v.and_then(Value::as_object)
        .map(|h| {
            h.iter()
                .filter_map(|(a, d)| Some((a.clone(), d.as_str()?.to_ascii_lowercase())))
                .collect()
        })
        .unwrap_or_default()
}

/// A target a targets role lists by this path.
pub fn target(signed: &Value, path: &str) -> Result<Option<TargetFile>, TufError> {
    let Some(t) = signed.get("targets").and_then(|t| t.get(path)) else {
        return Ok(None);
    };
    let length = t
        .get("length")
        .and_then(Value::as_u64)
        .ok_or_else(|| bad("targets", format!("{path} has no length")))?;
    let hashes = hashes_of(t.get("hashes"));
    if hashes.is_empty() {
        return Err(bad("targets", format!("{path} has no hashes")));
    }
    Ok(Some(TargetFile { length, hashes }))
}

/// The roles a targets role delegates to, in order, with their keys.
pub fn delegations(
    signed: &Value,
) -> Result<(BTreeMap<String, PublicKey>, Vec<DelegatedRole>), TufError> {
    let Some(d) = signed.get("delegations") else {
        return Ok((BTreeMap::new(), Vec::new()));
    };
    let keys = keys_of(d.get("keys"));
    let mut roles = Vec::new();
    for r in d
        .get("roles")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let name = r
            .get("name")
            .and_then(Value::as_str)
            .ok_or_else(|| bad("targets", "a delegated role without a name"))?;
        let strings = |k: &str| -> Option<Vec<String>> {
            r.get(k)?
                .as_array()?
                .iter()
                .map(|p| p.as_str().map(str::to_owned))
                .collect()
        };
        roles.push(DelegatedRole {
            name: name.to_owned(),
            delegation: delegation_of(r, "targets")?,
            terminating: r
                .get("terminating")
                .and_then(Value::as_bool)
                .unwrap_or(false),
            paths: strings("paths"),
            path_hash_prefixes: strings("path_hash_prefixes"),
        });
    }
    Ok((keys, roles))
}

impl DelegatedRole {
    /// Whether this role is trusted for `target` (its `paths`, each
    /// segment a shell-style pattern, or its `path_hash_prefixes` over the
    /// SHA-256 of the path).
    pub fn covers(&self, target: &str) -> bool {
        if let Some(prefixes) = &self.path_hash_prefixes {
            let h = crate::trust::hex(&crate::sha256(target.as_bytes()));
            return prefixes.iter().any(|p| h.starts_with(p.as_str()));
        }
        let Some(paths) = &self.paths else {
            return false;
        };
        paths.iter().any(|p| {
            let (ps, ts): (Vec<&str>, Vec<&str>) =
                (p.split('/').collect(), target.split('/').collect());
            ps.len() == ts.len() && ps.iter().zip(&ts).all(|(p, t)| glob(p, t))
        })
    }
}

/// Shell-style `*` and `?` matching within one path segment.
fn glob(pattern: &str, text: &str) -> bool {
    let (p, t): (Vec<char>, Vec<char>) = (pattern.chars().collect(), text.chars().collect());
    // Iterative wildcard matching with one backtrack point.
    let (mut i, mut j, mut star, mut mark) = (0, 0, None, 0);
    while j < t.len() {
        if i < p.len() && (p[i] == '?' || p[i] == t[j]) {
            i += 1;
            j += 1;
        } else if i < p.len() && p[i] == '*' {
            star = Some(i);
            mark = j;
            i += 1;
        } else if let Some(s) = star {
            i = s + 1;
            mark += 1;
            j = mark;
        } else {
            return false;
        }
    }
    while i < p.len() && p[i] == '*' {
        i += 1;
    }
    i == p.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Found by the TUF conformance suite (`test_duplicate_sig_keyids`):
    /// the specification says a key ID is unique in the signatures list;
    /// a second signature under one was accepted (though never counted twice).
    #[test]
    fn regression_two_signatures_under_one_key_id_are_refused() {
        let doc = serde_json::json!({
            "signed": {"_type": "timestamp", "spec_version": "1.0.31", "version": 1,
                       "expires": "2099-01-01T00:00:00Z", "meta": {}},
            "signatures": [{"keyid": "k", "sig": "00"}, {"keyid": "k", "sig": "00"}]
        });
        let e = Metadata::parse(doc.to_string().as_bytes(), Role::Timestamp).unwrap_err();
        assert!(e.to_string().contains("two signatures name key k"), "{e}");
    }

    #[test]
    fn delegated_paths_match_per_segment() {
        let r = DelegatedRole {
            name: "r".into(),
            delegation: Delegation {
                keyids: vec![],
                threshold: 1,
            },
            terminating: false,
            paths: Some(vec!["files/*.json".into(), "a?c".into()]),
            path_hash_prefixes: None,
        };
        assert!(r.covers("files/trusted_root.json"));
        assert!(!r.covers("files/deeper/trusted_root.json"));
        assert!(r.covers("abc") && !r.covers("abbc"));
        assert!(glob("*", "") && glob("*.*", "a.b") && !glob("a*b", "ac"));
    }
}
