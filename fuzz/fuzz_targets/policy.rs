//! Policy loading never panics; a loaded policy plans any image without
//! panicking, and its remembered plans (`plan_shared`) are the plans made
//! afresh, shared from the second time on.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sigil_core::Policy;

fuzz_target!(|data: &[u8]| {
    let Ok(s) = std::str::from_utf8(data) else { return };
    if let Ok(p) = Policy::from_documents(s) {
        for img in ["nginx", "a.io/b/c:d", s] {
            let fresh = p.plan(img);
            let first = p.plan_shared(img, None);
            let again = p.plan_shared(img, None);
            match (&fresh, &first, &again) {
                (Ok(f), Ok(a), Ok(b)) => {
                    assert_eq!(f, &**a, "{img:?}");
                    assert!(std::sync::Arc::ptr_eq(a, b), "{img:?} planned twice");
                }
                (Err(f), Err(a), Err(b)) => {
                    assert_eq!(f, a, "{img:?}");
                    assert_eq!(f, b, "{img:?}");
                }
                _ => panic!("{img:?}: {fresh:?} / {first:?} / {again:?}"),
            }
        }
    }
});
