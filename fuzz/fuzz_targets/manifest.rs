//! `sigil pin`'s in-place editor never panics, and whatever it writes parses
//! back to the same documents with exactly the image values replaced; and
//! wherever the fast event-stream parser answers, it agrees with
//! serde-saphyr's (values, lines, spans) and accepts nothing serde-saphyr refuses;
//! and `sigil krm`'s output for any single-document input with results
//! always parses back to that document plus its results; and the walker
//! finds the same over a document's tree as over its JSON.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sigil_core::manifest::{apply_edits, edit_scalar, parse_both_paths, parse_stream};
use sigil_core::walker::summarize_value;

const NEW: &str = "r.io/a/b:1@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    if let (Some(fast), slow) = parse_both_paths(text) {
        match slow {
            Ok(slow) => assert_eq!(fast, slow, "the fast parser disagrees with serde-saphyr"),
            Err(e) => panic!("the fast parser accepted what serde-saphyr refuses: {e}"),
        }
    }
    let Ok(docs) = parse_stream(text) else { return };
    let values: Vec<_> = docs.iter().map(|d| d.to_value()).collect();
    for (d, v) in docs.iter().zip(&values) {
        // The tree is walked in document order, the JSON in its map's key
        // order: only the order of pull secrets found in two pod specs and
        // which of two pod specs' service accounts is kept may differ.
        let (mut tree, mut json) = (d.root().summarize(), summarize_value(v));
        tree.pull_secrets.sort();
        json.pull_secrets.sort();
        tree.service_account = None;
        json.service_account = None;
        assert_eq!(tree, json, "the walker disagrees between a document's tree and its JSON");
    }
    if let [doc] = docs.as_slice()
        && values[0].is_object()
    {
        let out =
            sigil::krm::with_results(text, &values[0], &[sigil::krm::KrmResult::warning("w")]);
        let back = parse_stream(&out).expect("krm output must parse");
        assert_eq!(back.len(), 1, "krm output is one document: {out}");
        let back = back[0].to_value();
        assert_eq!(back["results"][0]["message"], "w");
        let results = back["results"].as_array().cloned().unwrap_or_default();
        // Written back faithfully, or (only when no form parses) replaced by
        // a list whose error result makes the orchestrator fail.
        if !results.iter().any(|r| r["severity"] == "error") {
            let mut without = back.clone();
            if let Some(m) = without.as_object_mut() {
                m.remove("results");
            }
            let mut orig = doc.to_value();
            if let Some(m) = orig.as_object_mut() {
                m.remove("results");
            }
            assert_eq!(without, orig, "krm output changed the list");
        }
    }
    let mut edits = Vec::new();
    let mut want = Vec::new();
    for (d, v) in docs.iter().zip(values) {
        let mut v = v;
        for f in d.root().summarize().fields {
            let Some(at) = d.scalar(f.path.iter().map(String::as_str)) else { continue };
            match edit_scalar(text, &at, &f.value, NEW) {
                Ok(e) => {
                    edits.push(e);
                    if let Some(x) = v.pointer_mut(&f.pointer) {
                        *x = serde_json::Value::String(NEW.into());
                    }
                }
                Err(_) => return,
            }
        }
        want.push(v);
    }
    let Ok(out) = apply_edits(text, edits) else { return };
    let again = parse_stream(&out).expect("edited text must still parse");
    let got: Vec<_> = again.iter().map(|d| d.to_value()).collect();
    assert_eq!(got, want, "only the image values may change");
});
