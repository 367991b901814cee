//! Signature, bundle and envelope parsing never panics, and neither does
//! checking whatever parses: cosign legacy layers (payload + annotations),
//! Sigstore bundles, Rekor bundle annotations, notation JWS and COSE
//! envelopes, trusted roots and public keys.
#![no_main]

use std::sync::{Arc, OnceLock};

use libfuzzer_sys::fuzz_target;
use sigil_core::verify::{NotationLevel, TlogPolicy};
use sigil_verify::cosign::{CosignCheck, Item};
use sigil_verify::keys::PublicKey;
use sigil_verify::notation::{Envelope, NotationCheck};
use sigil_verify::rekor::Entry;
use sigil_verify::trust::TrustedRoot;

const ALICE: &str = include_str!("../../crates/sigil-verify/tests/vectors/cosign/alice.key");
const ROOT: &str = include_str!("../../crates/sigil-verify/tests/vectors/derived/notation-trust-root.crt");
const DIGEST: &str = "sha256:071bf7a986f1ca9cb2a1f0bc8392822a7777f90d58f2d2c6f271913e08de7c81";

fn checks() -> &'static (CosignCheck, NotationCheck) {
    static C: OnceLock<(CosignCheck, NotationCheck)> = OnceLock::new();
    C.get_or_init(|| {
        let trust = Arc::new(TrustedRoot::public_good().expect("embedded root"));
        (
            CosignCheck::Key {
                key: PublicKey::from_pem(ALICE).expect("alice key"),
                tlog: TlogPolicy::Optional,
                trust,
            },
            NotationCheck {
                roots: sigil_verify::x509::certs_from_pem(ROOT),
                level: NotationLevel::Permissive,
            },
        )
    })
}

fuzz_target!(|data: &[u8]| {
    let Some((&which, rest)) = data.split_first() else { return };
    let (cosign, notation) = checks();
    match which % 8 {
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
        _ => {
            let _ = sigil_verify::x509::identity(rest);
            let _ = sigil_verify::cosign::simple_signing_digest(rest);
        }
    }
});
