//! Signed checkpoints (the `golang.org/x/mod/sumdb/note` format Rekor and
//! every tile log use): `origin\nsize\nbase64(root)\n[extra lines]\n\n`
//! followed by one line per signature, `— name base64(keyhint[4] || sig)`.
//!
//! Owns parsing a checkpoint and accepting it only when a signature line
//! whose key hint is the log's verifies with the log's key over the note
//! text. Other lines (witness cosignatures, other
//! keys) are tolerated and ignored, wherever they appear.

use base64::Engine as _;

use crate::keys::SigEncoding;
use crate::trust::Log;

message_error!(
    /// Why a checkpoint is unreadable or not signed by its log.
    CheckpointError
);

impl From<CheckpointError> for crate::ArtifactError {
    fn from(e: CheckpointError) -> Self {
        crate::ArtifactError::Log(e.0)
    }
}

/// A parsed checkpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checkpoint {
    /// The log's origin line.
    pub origin: String,
    /// Tree size.
    pub size: u64,
    /// Root hash.
    pub root: [u8; 32],
    /// The signed text: everything up to and including the last note line's newline.
    text: String,
    /// `(name, key hint, signature)` per signature line.
    sigs: Vec<(String, [u8; 4], Vec<u8>)>,
}

impl Checkpoint {
    /// Parses a checkpoint envelope.
    pub fn parse(envelope: &str) -> Result<Checkpoint, CheckpointError> {
        let (note, sigs) = envelope
            .split_once("\n\n")
            .ok_or("checkpoint has no signature block")?;
        let text = format!("{note}\n");
        let mut lines = note.lines();
        let origin = lines
            .next()
            .filter(|o| !o.is_empty())
            .ok_or("checkpoint has no origin")?;
        let size = lines
            .next()
            .and_then(|s| s.parse::<u64>().ok())
            .ok_or("checkpoint has no tree size")?;
        let root = lines
            .next()
            .and_then(|r| base64::engine::general_purpose::STANDARD.decode(r).ok())
            .and_then(|r| <[u8; 32]>::try_from(r).ok())
            .ok_or("checkpoint has no 32-byte root hash")?;
        let mut parsed = Vec::new();
        for line in sigs.lines().filter(|l| !l.is_empty()) {
            let Some(rest) = line.strip_prefix("\u{2014} ") else {
                return Err(format!(
                    "checkpoint signature line {line:?} does not start with an em dash"
                )
                .into());
            };
            let Some((name, b64)) = rest.rsplit_once(' ') else {
                return Err("checkpoint signature line has no signature".into());
            };
            let raw = base64::engine::general_purpose::STANDARD
                .decode(b64)
                .map_err(|e| format!("checkpoint signature: {e}"))?;
            if raw.len() < 5 {
                return Err("checkpoint signature is too short".into());
            }
            let mut hint = [0u8; 4];
            hint.copy_from_slice(&raw[..4]);
            parsed.push((name.to_owned(), hint, raw[4..].to_vec()));
        }
        Ok(Checkpoint {
            origin: origin.to_owned(),
            size,
            root,
            text,
            sigs: parsed,
        })
    }

    /// Whether the log itself signed this checkpoint: a signature line
    /// whose key hint is the log's verifies with the log's key. The log is
    /// identified by its key in the trusted root, as the client
    /// specification does, not by its origin line: a private deployment's
    /// Rekor v1 names itself by its pod's host name, not by the URL clients
    /// reach it at. (A Rekor v2 checkpoint's origin is checked besides, by
    /// the caller, which knows the entry's kind.)
    pub fn verify(&self, log: &Log) -> Result<(), CheckpointError> {
        let hint = log.key_hint();
        let ours: Vec<_> = self.sigs.iter().filter(|(_, h, _)| *h == hint).collect();
        if ours.is_empty() {
            return Err(format!(
                "checkpoint of {:?} carries no signature with the log's key hint",
                self.origin
            )
            .into());
        }
        if ours
            .iter()
            .any(|(_, _, sig)| log.key.verify(SigEncoding::Der, self.text.as_bytes(), sig))
        {
            Ok(())
        } else {
            Err("checkpoint signature does not verify with the log's key".into())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notes_parse_and_bad_ones_are_refused() {
        let root = base64::engine::general_purpose::STANDARD.encode([7u8; 32]);
        let sig = base64::engine::general_purpose::STANDARD.encode([1u8, 2, 3, 4, 9, 9]);
        let c = Checkpoint::parse(&format!(
            "log.example\n12\n{root}\nextra\n\n\u{2014} witness {sig}\n\u{2014} log.example {sig}\n"
        ))
        .unwrap();
        assert_eq!(
            (c.origin.as_str(), c.size, c.root),
            ("log.example", 12, [7u8; 32])
        );
        assert_eq!(c.sigs.len(), 2);
        assert!(c.text.ends_with("extra\n"));
        assert!(
            Checkpoint::parse(&format!("log\n12\n\n\u{2014} log {sig}\n")).is_err(),
            "no root"
        );
        assert!(
            Checkpoint::parse(&format!("log\n12\n{root}\n")).is_err(),
            "unsigned"
        );
        assert!(Checkpoint::parse(&format!("log\n12\n{root}\n\n- log {sig}\n")).is_err());
    }
}
