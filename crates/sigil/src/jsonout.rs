//! Indented JSON as `serde_json::to_writer_pretty` writes it (two spaces,
//! kubectl's `-o json` layout), byte for byte, for the reports `sigil pin`,
//! `sigil audit` and `sigil test` print. It owns only the layout; what is
//! written is each report's `Serialize`.
//!
//! Why not serde_json's own `PrettyFormatter`: it writes each level of
//! indentation as a separate write, so a key four levels down costs five
//! calls into the buffered writer before its first byte; an audit of 10,000
//! Pods wrote about a million keys that way, 5 % of its instructions
//! (docs/benchmarks.md). Here the comma, the newline and the indentation
//! are one slice of a static line.

use std::io;

use serde_json::ser::Formatter;

/// `,` then a newline then the indentation of [`DEPTH`] levels.
const LINE: &[u8] = b",\n                                                                                                                                ";

/// Levels [`LINE`] holds (two spaces each); deeper ones are written a level at a time.
const DEPTH: usize = (LINE.len() - 2) / 2;

/// The formatter: serde_json's pretty layout, fewer writes.
#[derive(Debug, Default)]
pub struct Indented {
    depth: usize,
    has_value: bool,
}

impl Indented {
    /// A newline (after a comma unless `first`) and the current indentation.
    fn line<W: ?Sized + io::Write>(&self, w: &mut W, first: bool) -> io::Result<()> {
        let from = usize::from(first);
        if self.depth <= DEPTH {
            return w.write_all(&LINE[from..2 + 2 * self.depth]);
        }
        w.write_all(&LINE[from..2 + 2 * DEPTH])?;
        for _ in DEPTH..self.depth {
            w.write_all(b"  ")?;
        }
        Ok(())
    }

    fn close<W: ?Sized + io::Write>(&mut self, w: &mut W, bracket: &[u8]) -> io::Result<()> {
        self.depth -= 1;
        if self.has_value {
            self.line(w, true)?;
        }
        w.write_all(bracket)
    }
}

impl Formatter for Indented {
    fn begin_array<W: ?Sized + io::Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.depth += 1;
        self.has_value = false;
        w.write_all(b"[")
    }

    fn end_array<W: ?Sized + io::Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.close(w, b"]")
    }

    fn begin_array_value<W: ?Sized + io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> io::Result<()> {
        self.line(w, first)
    }

    fn end_array_value<W: ?Sized + io::Write>(&mut self, _: &mut W) -> io::Result<()> {
        self.has_value = true;
        Ok(())
    }

    fn begin_object<W: ?Sized + io::Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.depth += 1;
        self.has_value = false;
        w.write_all(b"{")
    }

    fn end_object<W: ?Sized + io::Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.close(w, b"}")
    }

    fn begin_object_key<W: ?Sized + io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> io::Result<()> {
        self.line(w, first)
    }

    fn begin_object_value<W: ?Sized + io::Write>(&mut self, w: &mut W) -> io::Result<()> {
        w.write_all(b": ")
    }

    fn end_object_value<W: ?Sized + io::Write>(&mut self, _: &mut W) -> io::Result<()> {
        self.has_value = true;
        Ok(())
    }
}

/// Serializes `value` to `w` in the pretty layout.
pub fn to_writer<W: io::Write>(w: W, value: &impl serde::Serialize) -> serde_json::Result<()> {
    let mut ser = serde_json::Serializer::with_formatter(w, Indented::default());
    value.serialize(&mut ser)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn both(v: &serde_json::Value) -> (Vec<u8>, Vec<u8>) {
        let mut ours = Vec::new();
        to_writer(&mut ours, v).expect("ours");
        (ours, serde_json::to_vec_pretty(v).expect("serde_json's"))
    }

    /// Every shape the reports have, and nesting past the static line.
    #[test]
    fn the_layout_is_serde_jsons_pretty_layout_byte_for_byte() {
        let cases = [
            json!(null),
            json!({}),
            json!([]),
            json!({"a": [], "b": {}, "c": [1, {"d": "e\n\"x\""}, [[]]], "f": null}),
            json!([{"k": 1.5}, {"k": -2}, true, "s"]),
        ];
        for v in &cases {
            let (ours, theirs) = both(v);
            assert_eq!(
                String::from_utf8_lossy(&ours),
                String::from_utf8_lossy(&theirs)
            );
        }
        let mut deep = json!({"leaf": [1, 2]});
        for i in 0..(DEPTH + 7) {
            deep = if i % 2 == 0 {
                json!({"k": deep, "after": i})
            } else {
                json!([deep, i])
            };
        }
        let (ours, theirs) = both(&deep);
        assert_eq!(ours, theirs, "nesting deeper than {DEPTH} levels");
    }
}
