//! The walker's path and JSON pointers: [`Seg`], one step of where the
//! walker is (a key of its own table or a list index, so a step costs no
//! allocation), and the escaping of pointer tokens (RFC 6901). It knows
//! nothing of which keys hold images (the parent module's table).

/// Escapes one JSON pointer token (`~` → `~0`, `/` → `~1`).
pub fn escape_token(t: &str) -> String {
    let mut s = String::with_capacity(t.len());
    push_escaped(&mut s, t);
    s
}

/// Appends `t` to `out` escaped as a JSON pointer token: a pointer is
/// built in one string, without one per segment.
pub fn push_escaped(out: &mut String, t: &str) {
    if !t.contains(['~', '/']) {
        out.push_str(t);
        return;
    }
    for c in t.chars() {
        match c {
            '~' => out.push_str("~0"),
            '/' => out.push_str("~1"),
            c => out.push(c),
        }
    }
}

/// One step of the walker's path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Seg {
    /// A key of the walker's table.
    Key(&'static str),
    /// A list index.
    Index(usize),
    /// A key the table cannot name (none: its own keys are all named by
    /// `Node::key`; kept so that a mistake costs an allocation, not a panic).
    Other(String),
}

impl Seg {
    pub(super) fn to_owned_string(&self) -> String {
        match self {
            Seg::Key(k) => (*k).to_owned(),
            Seg::Index(i) => i.to_string(),
            Seg::Other(k) => k.clone(),
        }
    }

    /// Appends `/` and the step, escaped, to a JSON pointer.
    pub(super) fn push_pointer(&self, out: &mut String) {
        out.push('/');
        match self {
            Seg::Key(k) => push_escaped(out, k),
            Seg::Index(i) => {
                use std::fmt::Write as _;
                let _ = write!(out, "{i}");
            }
            Seg::Other(k) => push_escaped(out, k),
        }
    }
}
