//! One transparency-log entry of a bundle: the log is in the trusted root;
//! the body records this signature, signer and hash; its inclusion proof
//! recomputes a root that a checkpoint signed by that log commits to; its
//! SET, when present, verifies and gives a time. Whether the log was valid
//! at the entry's time is judged by the caller, once the timestamps are in.

use base64::Engine as _;
use serde_json::Value;

use super::{b64, int, malformed};
use crate::ArtifactError;
use crate::checkpoint::Checkpoint;
use crate::rekor::{Entry, Expected, check_body};
use crate::trust::TrustedRoot;

/// One log entry: returns its verified time (from a SET) and whether an
/// inclusion proof was verified.
pub(super) fn log_entry<'t>(
    e: &Value,
    ver: u8,
    trust: &'t TrustedRoot,
    expect: &Expected<'_>,
) -> Result<(Option<i64>, bool, &'t crate::trust::Log), ArtifactError> {
    let std = base64::engine::general_purpose::STANDARD;
    let log_index = int(e, "logIndex").ok_or_else(|| malformed("log entry has no logIndex"))?;
    if log_index < 0 {
        return Err(malformed("log entry has a negative logIndex"));
    }
    let key_id = e
        .pointer("/logId/keyId")
        .and_then(Value::as_str)
        .and_then(|k| std.decode(k).ok())
        .ok_or_else(|| malformed("log entry has no logId"))?;
    let id = crate::trust::hex(&key_id);
    let log = trust.log_by_id(&id).ok_or_else(|| {
        ArtifactError::Log(format!(
            "log {} is not in the trusted root",
            &id[..id.len().min(12)]
        ))
    })?;
    let body = b64(e, "/canonicalizedBody")?;
    check_body(&body, expect)?;
    // Rekor v2 writes only hashedrekord and dsse entries, both at 0.0.2;
    // Rekor v1's intoto kind is also at 0.0.2 (npm's publish attestations),
    // and a v1 entry may carry a SET alone.
    let kind = e.pointer("/kindVersion/kind").and_then(Value::as_str);
    let rekor_v2 = matches!(kind, Some("hashedrekord" | "dsse"))
        && e.pointer("/kindVersion/version").and_then(Value::as_str) == Some("0.0.2");
    // Inclusion proof against a signed checkpoint.
    let proven = match e.get("inclusionProof") {
        Some(p) => {
            let index =
                int(p, "logIndex").ok_or_else(|| malformed("inclusion proof has no logIndex"))?;
            let size =
                int(p, "treeSize").ok_or_else(|| malformed("inclusion proof has no treeSize"))?;
            let (Ok(index), Ok(size)) = (u64::try_from(index), u64::try_from(size)) else {
                return Err(malformed("inclusion proof has a negative index or size"));
            };
            let root = b64(p, "/rootHash")?;
            let hashes = p
                .get("hashes")
                .and_then(Value::as_array)
                .map(|a| {
                    a.iter()
                        .map(|h| {
                            h.as_str()
                                .and_then(|h| std.decode(h).ok())
                                .and_then(|h| <[u8; 32]>::try_from(h).ok())
                                .ok_or_else(|| {
                                    malformed("inclusion proof hash is not 32 bytes of base64")
                                })
                        })
                        .collect::<Result<Vec<_>, _>>()
                })
                .transpose()?
                .unwrap_or_default();
            let computed = crate::merkle::root_from_proof(
                index,
                size,
                crate::merkle::leaf_hash(&body),
                &hashes,
            )?;
            if computed.as_slice() != root.as_slice() {
                return Err(ArtifactError::Log(
                    "inclusion proof does not lead to its root hash".into(),
                ));
            }
            let envelope = p
                .pointer("/checkpoint/envelope")
                .and_then(Value::as_str)
                .ok_or_else(|| ArtifactError::Log("inclusion proof has no checkpoint".into()))?;
            let cp = Checkpoint::parse(envelope)?;
            if cp.root != computed || cp.size != size {
                return Err(ArtifactError::Log(
                    "the checkpoint is not for the proof's tree".into(),
                ));
            }
            cp.verify(log)?;
            // A Rekor v2 checkpoint names its log (the origin is the log's
            // `baseUrl` host), as sigstore-go checks it. Rekor v1's signed
            // tree heads name a shard (`host - tree id`), or a pod's host name
            // in private deployments: those are the log's by its key alone.
            if rekor_v2 && log.origin.as_deref() != Some(cp.origin.as_str()) {
                return Err(ArtifactError::Log(format!(
                    "the checkpoint names origin {:?}, not the log's ({}): a Rekor v2 checkpoint must name the log the trusted root lists",
                    cp.origin,
                    log.origin
                        .as_deref()
                        .unwrap_or("the trusted root gives this log no baseUrl")
                )));
            }
            true
        }
        None if rekor_v2 || ver >= 2 => {
            return Err(ArtifactError::Log(
                "log entry has no inclusion proof".into(),
            ));
        }
        None => false,
    };
    // The SET, when present: a promise with a time.
    let time = match e.pointer("/inclusionPromise/signedEntryTimestamp") {
        Some(_) => {
            let entry = Entry {
                body,
                integrated_time: int(e, "integratedTime")
                    .ok_or_else(|| malformed("log entry has no integratedTime"))?,
                log_index,
                log_id: id,
                set: b64(e, "/inclusionPromise/signedEntryTimestamp")?,
            };
            Some(entry.verify(trust, expect)?)
        }
        None if !proven => {
            return Err(ArtifactError::Log(
                "log entry has neither an inclusion proof nor a SET".into(),
            ));
        }
        None => None,
    };
    Ok((time, proven, log))
}
