//! The YAML budget every parse of outside input runs under: serde-saphyr's
//! defaults, with the limits that only count what the input itself spells
//! out (nodes, events, documents, scalar bytes) raised in proportion to its
//! size, so a real 40,000-Pod ResourceList or a 60,000-rule policy parses,
//! while the limits that stop bombs — aliases, anchors, retained anchor
//! copies, the alias-to-anchor ratio, nesting depth — stay as they are
//! (billion laughs and deep nesting are refused as before). No I/O.

/// The budget for an input of `len` bytes.
///
/// | limit | value |
/// |---|---|
/// | nodes | `len / 2`, between 250,000 and 10,000,000 |
/// | parser events | twice the nodes, at least 1,000,000 |
/// | documents | `len / 64`, at least 1,024 |
/// | scalar bytes | `len`, at least 64 MiB |
/// | aliases, anchors, anchor copies, depth | serde-saphyr's defaults (50,000, 50,000, 1,000,000, 64) |
pub fn budget(len: usize) -> serde_saphyr::Budget {
    let mut b = serde_saphyr::Budget::default();
    b.max_nodes = (len / 2).clamp(b.max_nodes, MAX_NODES);
    b.max_events = b.max_events.max(b.max_nodes.saturating_mul(2));
    b.max_documents = b.max_documents.max(len / 64);
    b.max_total_scalar_bytes = b.max_total_scalar_bytes.max(len);
    b
}

/// Most nodes any input may have, however large.
pub const MAX_NODES: usize = 10_000_000;

/// serde-saphyr's options with [`budget`] for `text`.
///
/// Comments are not emitted: sigil never reads them, and with emission on
/// serde-saphyr refuses valid YAML whose key is followed by more than 32
/// comment lines before its value (it buffers them while looking ahead),
/// which the fast path in `manifest::events` rightly accepts. Comment
/// syntax is still checked either way.
pub fn options(text: &str) -> serde_saphyr::Options {
    let mut o = serde_saphyr::Options::default();
    o.budget = Some(budget(text.len()));
    o.emit_comments = false;
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_inputs_keep_the_defaults_and_large_ones_scale() {
        let d = serde_saphyr::Budget::default();
        let small = budget(10_000);
        assert_eq!(
            (small.max_nodes, small.max_events, small.max_documents),
            (d.max_nodes, d.max_events, d.max_documents)
        );
        let big = budget(16 << 20);
        assert_eq!(big.max_nodes, 8 << 20);
        assert_eq!(
            (big.max_aliases, big.max_anchors, big.max_depth),
            (d.max_aliases, d.max_anchors, d.max_depth)
        );
        assert_eq!(budget(1 << 30).max_nodes, MAX_NODES);
    }

    /// Caught by the `manifest` fuzz target: a key whose value follows a
    /// long comment block was refused by serde-saphyr ("too many buffered
    /// comments") while the fast path accepted it.
    #[test]
    fn a_value_after_forty_comment_lines_parses() {
        let text = format!("spec:\n{}  image: a:1\n", "# note\n".repeat(40));
        let v: serde_json::Value =
            serde_saphyr::from_str_with_options(&text, options(&text)).expect("valid YAML");
        assert_eq!(v["spec"]["image"], "a:1");
    }
}
