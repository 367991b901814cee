//! What a TUF refresh parses before trusting it never panics: a bootstrap
//! or rotated `root.json` (parsed and checked against its own threshold)
//! and the `trusted_root.json` target it publishes. The rest of the update
//! workflow (timestamp, snapshot, targets) is the same parser on other roles.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sigil_verify::trust::TrustedRoot;
use sigil_verify::tuf::bootstrap_version;

fuzz_target!(|data: &[u8]| {
    let _ = bootstrap_version(data);
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = TrustedRoot::from_json(text);
    }
});
