//! The log sink `sigil serve` writes its lines to: formatted lines are
//! appended to a shared buffer and one background thread writes the buffer
//! to stderr in batches.
//!
//! Why not `tracing-appender`'s non-blocking writer: it allocates each line
//! and sends it through a channel whose receiver thread wakes (and spins in
//! `sched_yield`) once per line. With one decision line per admission that
//! was a fifth of the server's CPU under load (docs/benchmarks.md). Here a
//! line costs a mutex and a `memcpy`; the writer thread is woken once when
//! the buffer goes from empty to non-empty, waits [`BATCH_WINDOW`] for more,
//! and writes everything in one `write(2)`. Only the per-admission decision
//! line is batched that way: every other line (reloads, warnings, errors)
//! ends the window at once, so operators and tests see them as promptly as
//! before. Nothing is dropped: past
//! [`MAX_BUFFERED`] (stderr not draining) writers wait for the thread, as
//! the old writer's lossless mode did. [`FlushGuard`] writes what is left at
//! exit. It does not format lines and is not used
//! by the one-shot commands, which write to stderr directly. Lines are formatted
//! by tracing-subscriber, the decision line by [`crate::decisionlog`].

use std::io::Write;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

/// How long the writer thread gathers lines after the first one arrives.
pub const BATCH_WINDOW: Duration = Duration::from_millis(20);
/// Bytes buffered before writers wait for the writer thread.
pub const MAX_BUFFERED: usize = 8 << 20;

#[derive(Default)]
struct State {
    buf: Vec<u8>,
    closing: bool,
    /// A line that should not wait for the batch window is buffered.
    urgent: bool,
}

#[derive(Default)]
struct Shared {
    state: Mutex<State>,
    /// Signalled when the buffer becomes non-empty, or at close.
    filled: Condvar,
    /// Signalled when the writer thread took the buffer.
    drained: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves only bytes behind: keep going.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The `MakeWriter` for tracing-subscriber: cheap to clone, one per line.
#[derive(Clone)]
pub struct BatchWriter {
    shared: Arc<Shared>,
    /// This line ends the batch window (everything but the decision line).
    urgent: bool,
}

impl std::fmt::Debug for BatchWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("BatchWriter")
    }
}

/// Writes what is still buffered and stops the writer thread when dropped.
#[must_use = "dropping the guard flushes and stops the log writer"]
pub struct FlushGuard {
    shared: Arc<Shared>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl std::fmt::Debug for FlushGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("FlushGuard")
    }
}

impl BatchWriter {
    /// A writer whose batches go to `out`, and the guard that flushes it.
    pub fn new<W: Write + Send + 'static>(out: W) -> (BatchWriter, FlushGuard) {
        let shared = Arc::new(Shared::default());
        let s = shared.clone();
        let thread = std::thread::Builder::new()
            .name("sigil-log".into())
            .spawn(move || writer_thread(&s, out))
            .ok();
        let writer = BatchWriter {
            shared: shared.clone(),
            urgent: true,
        };
        (writer, FlushGuard { shared, thread })
    }
}

fn writer_thread<W: Write>(shared: &Shared, mut out: W) {
    let mut spare = Vec::new();
    loop {
        let mut st = shared.lock();
        while st.buf.is_empty() && !st.closing {
            st = shared
                .filled
                .wait(st)
                .unwrap_or_else(PoisonError::into_inner);
        }
        // Gather the lines of the next few milliseconds into one write,
        // unless a line that should not wait arrives.
        let until = std::time::Instant::now() + BATCH_WINDOW;
        while !st.urgent && !st.closing {
            let now = std::time::Instant::now();
            if now >= until {
                break;
            }
            st = shared
                .filled
                .wait_timeout(st, until - now)
                .map_or_else(|e| e.into_inner().0, |(g, _)| g);
        }
        let closing = st.closing;
        st.urgent = false;
        std::mem::swap(&mut st.buf, &mut spare);
        shared.drained.notify_all();
        drop(st);
        // Logging has nowhere to report its own failure.
        let _ = out.write_all(&spare);
        let _ = out.flush();
        spare.clear();
        if spare.capacity() > MAX_BUFFERED {
            spare = Vec::new();
        }
        if closing && shared.lock().buf.is_empty() {
            return;
        }
    }
}

impl BatchWriter {
    /// The same buffer, for lines that wait for the batch window (the
    /// decision line written by [`crate::decisionlog`]).
    pub fn batched(&self) -> BatchWriter {
        BatchWriter {
            shared: self.shared.clone(),
            urgent: false,
        }
    }

    /// Appends one whole line (or several) to the buffer.
    pub fn append(&self, line: &[u8]) {
        let mut st = self.shared.lock();
        while st.buf.len() >= MAX_BUFFERED && !st.closing {
            st = self
                .shared
                .drained
                .wait(st)
                .unwrap_or_else(PoisonError::into_inner);
        }
        let wake = st.buf.is_empty() || (self.urgent && !st.urgent);
        st.buf.extend_from_slice(line);
        st.urgent |= self.urgent;
        drop(st);
        if wake {
            self.shared.filled.notify_one();
        }
    }
}

impl Write for BatchWriter {
    fn write(&mut self, line: &[u8]) -> std::io::Result<usize> {
        self.append(line);
        Ok(line.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for BatchWriter {
    type Writer = BatchWriter;
    fn make_writer(&'a self) -> BatchWriter {
        self.clone()
    }

    /// The decision line (`sigil::admission` at INFO, one per admission) is
    /// batched; every other line ends the batch window.
    fn make_writer_for(&'a self, meta: &tracing::Metadata<'_>) -> BatchWriter {
        BatchWriter {
            shared: self.shared.clone(),
            urgent: !(meta.target() == DECISION_TARGET && *meta.level() == tracing::Level::INFO),
        }
    }
}

/// Where the per-admission decision line is logged from.
pub const DECISION_TARGET: &str = "sigil::admission";

impl Drop for FlushGuard {
    fn drop(&mut self) {
        self.shared.lock().closing = true;
        self.shared.filled.notify_all();
        self.shared.drained.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A `Write` that shares what it got with the test.
    #[derive(Clone, Default)]
    struct Sink(Arc<Mutex<Vec<u8>>>);

    impl Write for Sink {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn every_line_arrives_in_order_and_the_guard_flushes_the_rest() {
        let sink = Sink::default();
        let (w, guard) = BatchWriter::new(sink.clone());
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let mut w = w.clone();
                std::thread::spawn(move || {
                    for i in 0..2_000 {
                        w.write_all(format!("{t} {i}\n").as_bytes()).unwrap();
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        drop(guard);
        let got = String::from_utf8(sink.0.lock().unwrap().clone()).unwrap();
        assert_eq!(got.lines().count(), 8_000);
        for t in 0..4 {
            let mine: Vec<usize> = got
                .lines()
                .filter_map(|l| l.strip_prefix(&format!("{t} ")))
                .map(|n| n.parse().unwrap())
                .collect();
            assert_eq!(mine, (0..2_000).collect::<Vec<_>>(), "thread {t}");
        }
    }

    /// A decision line waits for the window; a reload or a warning behind
    /// it ends the window, so both are written at once.
    #[test]
    fn other_lines_end_the_batch_window() {
        let sink = Sink::default();
        let (w, _guard) = BatchWriter::new(sink.clone());
        let mut batched = BatchWriter {
            shared: w.shared.clone(),
            urgent: false,
        };
        batched.write_all(b"decision\n").unwrap();
        let mut urgent = w.clone();
        urgent.write_all(b"reloaded\n").unwrap();
        let until = std::time::Instant::now() + Duration::from_secs(5);
        while sink.0.lock().unwrap().len() < 18 && std::time::Instant::now() < until {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(&*sink.0.lock().unwrap(), b"decision\nreloaded\n");
    }

    #[test]
    fn a_lone_line_is_written_within_the_batch_window() {
        let sink = Sink::default();
        let (mut w, _guard) = BatchWriter::new(sink.clone());
        w.write_all(b"one\n").unwrap();
        let until = std::time::Instant::now() + Duration::from_secs(5);
        while sink.0.lock().unwrap().is_empty() && std::time::Instant::now() < until {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(&*sink.0.lock().unwrap(), b"one\n");
    }

    /// A sink that blocks (stderr not draining): writers wait past the
    /// bound instead of growing without limit, and nothing is lost.
    #[test]
    fn a_stuck_sink_applies_backpressure_without_losing_lines() {
        struct Slow(Sink);
        impl Write for Slow {
            fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
                std::thread::sleep(Duration::from_millis(30));
                self.0.write(b)
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let sink = Sink::default();
        let (mut w, guard) = BatchWriter::new(Slow(sink.clone()));
        let line = vec![b'x'; 1 << 20];
        for _ in 0..20 {
            w.write_all(&line).unwrap();
            assert!(w.shared.lock().buf.len() <= MAX_BUFFERED + line.len());
        }
        drop(guard);
        assert_eq!(sink.0.lock().unwrap().len(), 20 << 20);
    }
}
