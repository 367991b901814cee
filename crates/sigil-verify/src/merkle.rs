//! RFC 6962 / RFC 9162 Merkle inclusion proofs: recomputes a log's root hash
//! from an entry, its index, the tree size and the audit path, so a bundle's
//! claim that its entry is in the log is checked, not taken on trust. Pure
//! hashing; which root to compare with (a signed checkpoint) is the caller's.

use crate::sha256;

message_error!(
    /// Why an inclusion proof cannot lead to any root.
    ProofError
);

impl From<ProofError> for crate::ArtifactError {
    fn from(e: ProofError) -> Self {
        crate::ArtifactError::Log(e.0)
    }
}

/// `SHA-256(0x00 || entry)`: the leaf hash of a log entry.
pub fn leaf_hash(entry: &[u8]) -> [u8; 32] {
    let mut m = Vec::with_capacity(entry.len() + 1);
    m.push(0);
    m.extend_from_slice(entry);
    sha256(&m)
}

fn node(l: &[u8; 32], r: &[u8; 32]) -> [u8; 32] {
    let mut m = [0u8; 65];
    m[0] = 1;
    m[1..33].copy_from_slice(l);
    m[33..].copy_from_slice(r);
    sha256(&m)
}

/// The root an inclusion proof leads to (RFC 9162 §2.1.3.2), or why the
/// proof cannot be one (index outside the tree, wrong length).
pub fn root_from_proof(
    index: u64,
    size: u64,
    leaf: [u8; 32],
    proof: &[[u8; 32]],
) -> Result<[u8; 32], ProofError> {
    if index >= size {
        return Err(format!("log index {index} is outside a tree of size {size}").into());
    }
    let (mut f, mut s) = (index, size - 1);
    let mut r = leaf;
    for p in proof {
        if s == 0 {
            return Err("inclusion proof is longer than the tree is deep".into());
        }
        if f & 1 == 1 || f == s {
            r = node(p, &r);
            if f & 1 == 0 {
                while f & 1 == 0 && f != 0 {
                    f >>= 1;
                    s >>= 1;
                }
            }
        } else {
            r = node(&r, p);
        }
        f >>= 1;
        s >>= 1;
    }
    if s != 0 {
        return Err("inclusion proof is shorter than the tree is deep".into());
    }
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;
    use sigil_testkit::sigstore::{inclusion_proof, tree_root};

    #[test]
    fn every_proof_of_every_small_tree_recomputes_the_root_and_tampering_fails() {
        for n in 1..=17usize {
            let leaves: Vec<[u8; 32]> = (0..n).map(|i| leaf_hash(&[i as u8])).collect();
            let root = tree_root(&leaves);
            for m in 0..n {
                let p = inclusion_proof(&leaves, m);
                assert_eq!(
                    root_from_proof(m as u64, n as u64, leaves[m], &p),
                    Ok(root),
                    "n={n} m={m}"
                );
                if let Some(first) = p.first() {
                    let mut bad = p.clone();
                    bad[0] = leaf_hash(first);
                    assert_ne!(
                        root_from_proof(m as u64, n as u64, leaves[m], &bad),
                        Ok(root)
                    );
                }
                assert!(root_from_proof(n as u64, n as u64, leaves[m], &p).is_err());
                if n > 1 {
                    assert!(root_from_proof(m as u64, n as u64, leaves[m], &p[1..]).is_err());
                }
            }
        }
    }
}
