//! Reference parsing and pattern compilation never panic, a parsed
//! reference re-parses to itself from both its canonical and familiar forms,
//! and the mirror prefix swap (`image\nto`: the name's prefix up to each of
//! its `/` and the whole name, replaced by `to`) equals parsing the swapped
//! name. A sha256 digest rebuilt from its bytes is the digest parsed; a
//! pinned name written directly is the pinned reference's display. A
//! pattern (`image\npattern`) matches as its segments do, whether or not it
//! takes the plain-text path.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sigil_core::Reference;
use sigil_core::pattern::Pattern;

fuzz_target!(|data: &[u8]| {
    let Ok(s) = std::str::from_utf8(data) else { return };
    if let Ok(r) = Reference::parse(s) {
        assert_eq!(Reference::parse(&r.to_string()).as_ref(), Ok(&r));
        assert_eq!(Reference::parse(&r.familiar()).as_ref(), Ok(&r));
        if let Some(d) = r.digest() {
            if let Some(bytes) = d.sha256_bytes() {
                assert_eq!(&sigil_core::Digest::from_sha256(&bytes), d);
            }
            assert_eq!(r.pinned_string(d), r.pinned(d.clone()).to_string());
        }
        if let Ok(p) = Pattern::parse(s) {
            let _ = p.matches(&r);
        }
    }
    let _ = Pattern::parse(s);
    if let Some((image, to)) = s.split_once('\n')
        && let Ok(r) = Reference::parse(image)
    {
        if let Ok(p) = Pattern::parse(to) {
            let by_segments = sigil_core::pattern::with_segments(&r, |s| p.matches_segments(&r, s));
            assert_eq!(p.matches(&r), by_segments, "{to} on {image}");
        }
        let name = r.name();
        for cut in name.match_indices('/').map(|(i, _)| i).chain([name.len()]) {
            let by_parsing = Reference::from_parts(
                &format!("{to}{}", &name[cut..]),
                r.tag(),
                r.digest().cloned(),
            )
            .ok();
            assert_eq!(r.with_prefix(cut, to), by_parsing, "{name} at {cut} to {to}");
        }
    }
});
