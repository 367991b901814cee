//! sigil's integration tests, compiled into one binary (ripgrep's layout).
//! They start real servers on 127.0.0.1: the CNCF distribution registry and
//! `sigil serve` itself.

mod drain;
mod support;
mod webhook;
