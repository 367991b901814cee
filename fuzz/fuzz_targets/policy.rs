//! Policy loading never panics; a loaded policy plans any image without panicking.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sigil_core::Policy;

fuzz_target!(|data: &[u8]| {
    let Ok(s) = std::str::from_utf8(data) else { return };
    if let Ok(p) = Policy::from_documents(s) {
        for img in ["nginx", "a.io/b/c:d", s] {
            let _ = p.plan(img);
        }
    }
});
