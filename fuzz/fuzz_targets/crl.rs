//! What the CRL cache parses from a distribution point never panics, and a
//! CRL that parses is only ever used as webpki uses it: against a real
//! chain (a root, an intermediate naming the root's CRL, a signing
//! certificate naming the intermediate's), whatever it lists or claims.
//! Checked against the key of the CA it was fetched for (what the cache
//! keeps), no input a fuzzer makes is ever kept: none is signed by it.
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use sigil_testkit::pki::{Ca, Issued};
use sigil_verify::crl::Crl;
use sigil_verify::x509;

struct Chain {
    root: Ca,
    inter: Ca,
    leaf: Issued,
}

fn chain() -> &'static Chain {
    static CHAIN: OnceLock<Chain> = OnceLock::new();
    CHAIN.get_or_init(|| {
        let root = Ca::root("fuzz root");
        let inter = root.intermediate("fuzz inter", Some("http://ca.test/root.crl"));
        let leaf = inter.leaf(&[], Some("http://ca.test/inter.crl"), None);
        Chain { root, inter, leaf }
    })
}

/// The intermediate's SubjectPublicKeyInfo (DER), found in its certificate
/// by the path code the cache's caller uses.
fn inter_key() -> &'static [u8] {
    static KEY: OnceLock<Vec<u8>> = OnceLock::new();
    KEY.get_or_init(|| {
        let c = chain();
        x509::verified_path(
            &c.leaf.der,
            std::slice::from_ref(&c.inter.der),
            std::slice::from_ref(&c.root.der),
            1_800_000_000,
        )
        .expect("the fuzz chain verifies")[0]
            .1
            .clone()
    })
}

fuzz_target!(|data: &[u8]| {
    assert!(
        Crl::parse_signed_by(data, inter_key()).is_err(),
        "a CRL the intermediate never signed was accepted as its own"
    );
    let Ok(crl) = Crl::parse(data) else { return };
    let c = chain();
    for der in [&c.leaf.der, &c.inter.der] {
        if let Ok(serial) = x509::serial(der) {
            let _ = crl.revoked(&serial);
        }
    }
    let result = x509::verify_chain_revocation(
        &c.leaf.der,
        std::slice::from_ref(&c.inter.der),
        std::slice::from_ref(&c.root.der),
        1_800_000_000,
        &[&crl.list],
    );
    // A CRL nobody here signed can never revoke this chain.
    assert!(!matches!(result, Err(x509::RevocationFailure::Revoked(_))));
});
