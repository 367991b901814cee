//! Reference parsing and pattern compilation never panic, and a parsed
//! reference re-parses to itself from both its canonical and familiar forms.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sigil_core::Reference;
use sigil_core::pattern::Pattern;

fuzz_target!(|data: &[u8]| {
    let Ok(s) = std::str::from_utf8(data) else { return };
    if let Ok(r) = Reference::parse(s) {
        assert_eq!(Reference::parse(&r.to_string()).as_ref(), Ok(&r));
        assert_eq!(Reference::parse(&r.familiar()).as_ref(), Ok(&r));
        if let Ok(p) = Pattern::parse(s) {
            let _ = p.matches(&r);
        }
    }
    let _ = Pattern::parse(s);
});
