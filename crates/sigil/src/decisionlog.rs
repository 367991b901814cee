//! The per-admission decision line in JSON, formatted by hand.
//!
//! Owns writing the one line `sigil serve` logs per admission, byte for byte
//! the line tracing-subscriber's JSON formatter writes for the same event
//! (`timestamp`, `level`, `message`, the fields, `target`; a unit test holds
//! the two together), straight into [`crate::logwriter::BatchWriter`]'s
//! buffer from a per-thread scratch buffer. Why: formatting the event
//! through tracing-subscriber (a visitor per field, a `String` per line,
//! the `Display` of each value through `fmt::Write`) was the largest
//! single piece of sigil's own CPU per cached admission after the decision
//! itself (docs/benchmarks.md). Whether the line is written at all is still
//! the subscriber's filter's call (`SIGIL_LOG`), asked per line; the text
//! format and every other line go through tracing as before. It decides
//! nothing and formats no other line. The [`Verdict`] it writes (what the
//! webhook answered, for logs and metrics) lives here so the webhook depends
//! on its log line and not the other way round.

use std::cell::RefCell;
use std::io::Write as _;
use std::time::{Duration, SystemTime};

use sigil_core::ObjectRef;

use crate::logwriter::{BatchWriter, DECISION_TARGET};

/// The target the decision line is logged under (the filter's and the
/// log writer's name for it).
pub const TARGET: &str = DECISION_TARGET;

/// Summary of one answered review, for logs and metrics.
#[derive(Debug, Clone)]
pub struct Verdict {
    /// `allowed`, `patched`, `denied`, `warned`, `skipped`.
    pub decision: &'static str,
    /// Operation as sent.
    pub operation: String,
    /// Object kind.
    pub kind: String,
    /// Object identity for logs.
    pub object: ObjectRef,
    /// Why it was skipped, if it was.
    pub skipped: Option<&'static str>,
    /// Per-image summaries, `; `-separated: `field verdict: image[ -> new]`
    /// (built only when the decision line is logged).
    pub images: String,
}

/// Where hand-formatted decision lines go: the batched side of the log writer.
#[derive(Clone, Debug)]
pub struct DecisionLog {
    writer: BatchWriter,
}

thread_local! {
    /// One scratch line per thread, reused for every decision line.
    static LINE: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
    /// The object's text, before it is escaped into the line.
    static OBJECT: RefCell<String> = const { RefCell::new(String::new()) };
    /// The timestamp up to its seconds (`2026-12-05T10:20:30.`) and the
    /// second it is of: the calendar is worked out once a second, not per line.
    static STAMP: std::cell::Cell<(u64, [u8; 20])> = const { std::cell::Cell::new((u64::MAX, [0; 20])) };
}

/// `now` as RFC 3339 with microseconds, as humantime writes it.
fn timestamp(out: &mut Vec<u8>, now: SystemTime) {
    let Ok(since) = now.duration_since(std::time::UNIX_EPOCH) else {
        let _ = write!(out, "{}", humantime::format_rfc3339_micros(now));
        return;
    };
    let secs = since.as_secs();
    let (cached, mut head) = STAMP.get();
    if cached != secs {
        let whole = humantime::format_rfc3339_seconds(now).to_string();
        match whole.as_bytes().get(..19) {
            Some(h) => {
                head[..19].copy_from_slice(h);
                head[19] = b'.';
                STAMP.set((secs, head));
            }
            None => {
                let _ = write!(out, "{}", humantime::format_rfc3339_micros(now));
                return;
            }
        }
    }
    out.extend_from_slice(&head);
    let mut micros = since.subsec_micros();
    let mut digits = [b'0'; 6];
    for d in digits.iter_mut().rev() {
        *d = b'0' + (micros % 10) as u8;
        micros /= 10;
    }
    out.extend_from_slice(&digits);
    out.push(b'Z');
}

impl DecisionLog {
    /// Lines go to `writer`'s batch (they do not end its window).
    pub fn new(writer: &BatchWriter) -> Self {
        DecisionLog {
            writer: writer.batched(),
        }
    }

    /// Writes the decision line for `v`.
    pub fn write(&self, v: &Verdict, elapsed: Duration) {
        LINE.with_borrow_mut(|line| {
            line.clear();
            format_line(line, SystemTime::now(), v, elapsed);
            self.writer.append(line);
            if line.capacity() > 64 << 10 {
                *line = Vec::new();
            }
        });
    }
}

/// The decision line through tracing (text logs, or no [`DecisionLog`]).
pub fn via_tracing(v: &Verdict, elapsed: Duration) {
    tracing::info!(
        target: TARGET,
        decision = v.decision,
        operation = %v.operation,
        object = %v.object,
        skipped = v.skipped,
        images = %v.images,
        elapsed_ms = elapsed.as_secs_f64() * 1000.0,
        "admission"
    );
}

/// The decision line as tracing-subscriber's JSON formatter writes it
/// (`flatten_event(true)`, no span), ending in a newline.
pub fn format_line(out: &mut Vec<u8>, now: SystemTime, v: &Verdict, elapsed: Duration) {
    out.extend_from_slice(b"{\"timestamp\":\"");
    timestamp(out, now);
    out.extend_from_slice(b"\",\"level\":\"INFO\",\"message\":\"admission\",\"decision\":");
    string(out, v.decision);
    out.extend_from_slice(b",\"operation\":");
    string(out, &v.operation);
    out.extend_from_slice(b",\"object\":");
    OBJECT.with_borrow_mut(|o| {
        o.clear();
        // Writes to a String cannot fail.
        let _ = std::fmt::Write::write_fmt(o, format_args!("{}", v.object));
        string(out, o);
    });
    if let Some(skipped) = v.skipped {
        out.extend_from_slice(b",\"skipped\":");
        string(out, skipped);
    }
    out.extend_from_slice(b",\"images\":");
    string(out, &v.images);
    out.extend_from_slice(b",\"elapsed_ms\":");
    let _ = serde_json::to_writer(&mut *out, &(elapsed.as_secs_f64() * 1000.0));
    out.extend_from_slice(b",\"target\":\"");
    out.extend_from_slice(TARGET.as_bytes());
    out.extend_from_slice(b"\"}\n");
}

/// A JSON string, escaped by serde_json.
fn string(out: &mut Vec<u8>, s: &str) {
    // Writing a str to a Vec cannot fail.
    let _ = serde_json::to_writer(&mut *out, s);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    #[derive(Clone, Default)]
    struct Buf(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Buf {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// What `sigil serve --log-format json` wrote through tracing.
    fn tracing_line(v: &Verdict, elapsed: Duration) -> String {
        let buf = Buf::default();
        let b = buf.clone();
        let sub = tracing_subscriber::fmt()
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .with_writer(move || b.clone())
            .finish();
        tracing::subscriber::with_default(sub, || via_tracing(v, elapsed));
        String::from_utf8(buf.0.lock().unwrap().clone()).unwrap()
    }

    fn without_timestamp(line: &str) -> (&str, &str) {
        let rest = line.strip_prefix("{\"timestamp\":\"").expect(line);
        let end = rest.find('"').expect(line);
        (&rest[..end], &rest[end..])
    }

    fn verdict(name: &str, skipped: Option<&'static str>, images: &str) -> Verdict {
        Verdict {
            decision: "patched",
            operation: "CREATE".into(),
            kind: "Pod".into(),
            object: ObjectRef::new("Pod", "team-a", Some(name), None),
            skipped,
            images: images.into(),
        }
    }

    /// The hand-formatted line is the formatter's line, byte for byte but
    /// the instant: operators' log pipelines parse it unchanged.
    #[test]
    fn hand_formatted_decision_line_is_tracing_subscribers_line() {
        let odd = "quote \" backslash \\ newline \n tab \t cr \r bell \u{7} nul \u{0} del \u{7f} é 😀 \u{1b}[31m";
        for (v, elapsed) in [
            (
                verdict(
                    "web-1",
                    None,
                    "spec.containers[0].image pinned: nginx -> r/nginx@sha256:ab",
                ),
                Duration::from_micros(1234),
            ),
            (verdict("x", Some("exempt namespace"), ""), Duration::ZERO),
            (
                verdict(odd, None, odd),
                Duration::from_nanos(123_456_789_012),
            ),
            (verdict("", None, odd), Duration::from_secs(3)),
        ] {
            let theirs = tracing_line(&v, elapsed);
            let mut ours = Vec::new();
            format_line(&mut ours, SystemTime::now(), &v, elapsed);
            let ours = String::from_utf8(ours).unwrap();
            let (their_ts, their_rest) = without_timestamp(&theirs);
            let (our_ts, our_rest) = without_timestamp(&ours);
            assert_eq!(our_rest, their_rest);
            assert_eq!(our_ts.len(), their_ts.len(), "{our_ts} vs {their_ts}");
            assert_eq!(&our_ts[..11], &their_ts[..11]);
            assert!(our_ts.ends_with('Z'));
            let parsed: serde_json::Value = serde_json::from_str(&ours).unwrap();
            assert_eq!(parsed["object"], v.object.to_string());
        }
    }

    /// The timestamp worked out once a second is humantime's, at every
    /// microsecond count, across second, day and year boundaries.
    #[test]
    fn the_cached_timestamp_is_humantimes() {
        use std::time::UNIX_EPOCH;
        let instants = [
            0u64,
            1,
            999_999,
            1_000_000,
            59_999_999,
            86_399_999_999,
            1_798_761_599_999_999,
            1_798_761_600_000_000,
            1_798_761_600_000_001,
            1_798_761_600_500_000,
        ];
        for &us in instants.iter().chain(instants.iter()) {
            let now = UNIX_EPOCH + Duration::from_micros(us);
            let mut ours = Vec::new();
            timestamp(&mut ours, now);
            assert_eq!(
                String::from_utf8(ours).unwrap(),
                humantime::format_rfc3339_micros(now).to_string()
            );
        }
    }
}
