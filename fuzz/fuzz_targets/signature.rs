//! Signature, bundle and envelope parsing never panics, and neither does
//! checking whatever parses: cosign legacy layers (payload + annotations),
//! Sigstore bundles (whole-bundle verification: inclusion proofs,
//! checkpoints, RFC 3161 timestamps, SCTs), Rekor bundle annotations,
//! checkpoints, Merkle proofs, DER, notation JWS and COSE envelopes, trusted
//! roots and public keys.
#![no_main]

use std::sync::{Arc, OnceLock};

use libfuzzer_sys::fuzz_target;
use sigil_core::verify::{
    Action, NotationLevel, NotationOverride, NotationSpec, NotationStoreType, TlogPolicy,
};
use sigil_verify::bundle::{Artifact, Requirements, Signer};
use sigil_verify::checkpoint::Checkpoint;
use sigil_verify::bundle::Matcher;
use sigil_verify::cosign::{CosignCheck, Item};
use sigil_verify::keys::PublicKey;
use sigil_verify::notation::{Envelope, NotationCheck};
use sigil_verify::rekor::Entry;
use sigil_verify::trust::TrustedRoot;

const ALICE: &str = include_str!("../../crates/sigil-verify/tests/vectors/cosign/alice.key");
const ROOT: &str = include_str!("../../crates/sigil-verify/tests/vectors/derived/notation-trust-root.crt");
const DIGEST: &str = "sha256:071bf7a986f1ca9cb2a1f0bc8392822a7777f90d58f2d2c6f271913e08de7c81";

/// A test Sigstore's trusted root (a Rekor v2 log, a TSA): what the
/// checkpoint, timestamp and bundle paths are checked against.
fn test_root() -> &'static TrustedRoot {
    static T: OnceLock<TrustedRoot> = OnceLock::new();
    T.get_or_init(|| {
        let s = sigil_testkit::sigstore::Sigstore::new();
        TrustedRoot::from_json(&s.trusted_root().to_string()).expect("test root")
    })
}

fn checks() -> &'static (CosignCheck, NotationCheck) {
    static C: OnceLock<(CosignCheck, NotationCheck)> = OnceLock::new();
    C.get_or_init(|| {
        let trust = Arc::new(TrustedRoot::public_good().expect("embedded root"));
        (
            CosignCheck::Key {
                key: PublicKey::from_pem(ALICE).expect("alice key"),
                req: Requirements {
                    tlog: TlogPolicy::Optional,
                    ..Requirements::default()
                },
                trust,
            },
            // Every check the trust policy has, failures logged so the
            // checks after them run too: identities, a tsa store, CRLs.
            NotationCheck::from_spec(
                &NotationSpec {
                    level: NotationLevel::Permissive,
                    trust_store_type: NotationStoreType::Ca,
                    trusted_identities: vec!["x509.subject: C=US, ST=WA, O=acme".into()],
                    overrides: NotationOverride {
                        authenticity: Some(Action::Log),
                        ..NotationOverride::default()
                    },
                    ..NotationSpec::default()
                },
                sigil_verify::x509::certs_from_pem(ROOT),
                vec![sigil_testkit::sigstore::Sigstore::new().tsa_root],
                Some(Arc::new(sigil_verify::crl::Crls::default())),
            )
            .expect("a valid notation spec"),
        )
    })
}

fuzz_target!(|data: &[u8]| {
    let Some((&which, rest)) = data.split_first() else { return };
    let (cosign, notation) = checks();
    match which % 14 {
        0 => {
            // payload \0 annotations-json
            let mut parts = rest.splitn(2, |b| *b == 0);
            let payload = parts.next().unwrap_or_default().to_vec();
            let ann = parts.next().unwrap_or_default();
            if let Ok(serde_json::Value::Object(m)) = serde_json::from_slice(ann)
                && let Ok(item) = Item::from_legacy(payload, &m)
            {
                let _ = cosign.check(&item, DIGEST, 1_795_000_000);
            }
        }
        1 => {
            if let Ok(item) = Item::from_bundle(rest) {
                let _ = cosign.check(&item, DIGEST, 1_795_000_000);
            }
        }
        2 | 3 => {
            let mt = if which % 8 == 2 { "application/jose+json" } else { "application/cose" };
            if let Ok(env) = Envelope::parse(mt, rest) {
                let _ = env.target_digest();
                let _ = notation.check(&env, DIGEST, 1_795_000_000);
            }
        }
        4 => {
            if let Ok(text) = std::str::from_utf8(rest) {
                let _ = Entry::from_legacy_annotation(text);
            }
        }
        5 => {
            if let Ok(text) = std::str::from_utf8(rest) {
                let _ = TrustedRoot::from_json(text);
            }
        }
        6 => {
            let _ = PublicKey::from_spki(rest);
            if let Ok(text) = std::str::from_utf8(rest) {
                let _ = PublicKey::from_pem(text);
                let _ = sigil_verify::x509::certs_from_pem(text);
            }
        }
        7 => {
            let _ = sigil_verify::x509::identity(rest);
            let _ = sigil_verify::cosign::simple_signing_digest(rest);
        }
        8 => {
            if let Ok(text) = std::str::from_utf8(rest)
                && let Ok(c) = Checkpoint::parse(text)
            {
                for log in &test_root().logs {
                    let _ = c.verify(log);
                }
            }
        }
        9 => {
            // index(8) size(8) leaf(32) then proof hashes
            if rest.len() >= 48 {
                let n = |b: &[u8]| u64::from_be_bytes(b.try_into().unwrap_or_default());
                let leaf: [u8; 32] = rest[16..48].try_into().unwrap_or_default();
                let proof: Vec<[u8; 32]> = rest[48..]
                    .chunks_exact(32)
                    .map(|c| c.try_into().unwrap_or_default())
                    .collect();
                let _ = sigil_verify::merkle::root_from_proof(n(&rest[..8]), n(&rest[8..16]), leaf, &proof);
            }
        }
        10 => {
            let _ = sigil_verify::tsa::verify(rest, b"signature", test_root());
            let _ = sigil_verify::der::children(rest);
        }
        11 => {
            let (san, issuer) = (Matcher::Exact("a".into()), Matcher::Exact("b".into()));
            let _ = sigil_verify::bundle::verify(
                rest,
                &Artifact::Digest([7; 32]),
                Signer::Identity { san: &san, issuer: &issuer, extensions: &[] },
                Requirements::default(),
                test_root(),
            );
        }
        12 => {
            if let CosignCheck::Key { key, trust, .. } = &checks().0 {
                let _ = sigil_verify::bundle::verify(
                    rest,
                    &Artifact::Bytes(rest.to_vec()),
                    Signer::Key(key),
                    Requirements::default(),
                    trust,
                );
            }
        }
        _ => {
            let _ = sigil_verify::sct::verify(rest, rest, test_root());
        }
    }
});
