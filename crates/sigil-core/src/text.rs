//! Text for people, made of values from outside (file names, object names,
//! image strings, registry and cluster answers): control characters — C0,
//! DEL, C1 — and the bidirectional overrides that reorder what a terminal
//! shows are escaped, so a value can neither drive the terminal (`ESC[…`,
//! `ESC]0;…`) nor forge a line of its own (`\n`). JSON and YAML outputs do
//! not use this: they carry values exactly.

use std::borrow::Cow;
use std::fmt::Write as _;

/// Whether `c` must not reach a terminal as itself.
fn dangerous(c: char) -> bool {
    c.is_control()
        || matches!(c, '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// `s` with every dangerous character escaped (`\n`, `\r`, `\t`,
/// otherwise `\u{…}`); borrowed when there is none.
pub fn escape_controls(s: &str) -> Cow<'_, str> {
    if !s.chars().any(dangerous) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if dangerous(c) => {
                let _ = write!(out, "\\u{{{:x}}}", c as u32);
            }
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

/// Appends one line to `out`: the formatted text with dangerous characters
/// escaped, then a newline (so a value can never start a line of its own).
pub fn push_line(out: &mut String, line: std::fmt::Arguments<'_>) {
    let line = line.to_string();
    out.push_str(&escape_controls(&line));
    out.push('\n');
}

/// Appends a message that may span lines (a YAML parser's diagnostic with
/// its source excerpt): its first line after `prefix`, each further line
/// indented by four spaces, every line escaped as [`push_line`] escapes it
/// (so no line of it can pass for a line of its own).
pub fn push_block(out: &mut String, prefix: std::fmt::Arguments<'_>, message: &str) {
    let mut lines = message.lines();
    push_line(
        out,
        format_args!("{prefix}{}", lines.next().unwrap_or_default()),
    );
    for l in lines {
        push_line(out, format_args!("    {l}"));
    }
}

/// `s` cut to at most `max` characters, with `…` where it was cut.
pub fn truncate_chars(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        None => s.to_owned(),
        Some((at, _)) => format!("{}…", &s[..at]),
    }
}

/// An admission warning as kubectl shows it: control characters escaped,
/// cut to 480 bytes (with `...`) to stay near the limit the API server keeps.
pub fn admission_warning(s: &str) -> String {
    let mut s = escape_controls(s).into_owned();
    if s.len() > 480 {
        let mut cut = 477;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
        s.push_str("...");
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn terminal_escapes_newlines_and_bidi_overrides_are_escaped() {
        assert!(matches!(escape_controls("nginx:1.27"), Cow::Borrowed(_)));
        assert_eq!(
            escape_controls("a\u{1b}[31mred\u{1b}]0;title\u{7}\nfake line"),
            "a\\u{1b}[31mred\\u{1b}]0;title\\u{7}\\nfake line"
        );
        assert_eq!(escape_controls("x\u{202e}y\u{9b}z"), "x\\u{202e}y\\u{9b}z");
        assert_eq!(escape_controls("tab\there"), "tab\\there");
        let mut s = String::new();
        push_line(&mut s, format_args!("{}: {}", "f\nile", "ok"));
        assert_eq!(s, "f\\nile: ok\n");
    }

    /// A YAML parser's diagnostic (a message, then an excerpt of the file)
    /// was printed as one line with literal `\n`s. Now each of its lines is
    /// a line, indented under the first, still escaped.
    #[test]
    fn regression_a_multi_line_diagnostic_prints_as_indented_lines() {
        let mut s = String::new();
        push_block(
            &mut s,
            format_args!("{}: error: ", "bad.yaml"),
            "invalid YAML: line 4\n --> <input>:4:5\n4 | spec:\u{1b}[2J",
        );
        assert_eq!(
            s,
            "bad.yaml: error: invalid YAML: line 4\n     --> <input>:4:5\n    4 | spec:\\u{1b}[2J\n"
        );
    }
}
