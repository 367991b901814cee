//! sigil at the node: containerd's image verifier (`sigil-containerd` in
//! containerd's `bin_dir`, docs/node.md). containerd runs it on every pull
//! through its transfer service with `-name REF -digest D
//! -stdin-media-type …` and the top-level descriptor on stdin; exit 0
//! allows the pull, any other exit refuses it with the first 32 KiB of
//! stdout as the reason.
//!
//! Owns that protocol ([`Request::parse`]), the image a pull is decided as
//! ([`Request::image`]: the name with the digest containerd resolved), the
//! verdict read off the one per-object decision ([`Verdict::of`]), the
//! verification cache on disk ([`cache`]) and the reading of containerd's
//! configuration ([`check`]), and the pull decision ([`pull`]: the node
//! policy loaded, `nodeAdmits`, then `Engine::decide` on a Pod holding the
//! image, as every front end decides).

pub mod cache;
pub mod check;
pub mod pull;
pub mod rbac;
pub mod status;
pub mod sync;

use sigil_core::{Mode, ObjectVerdict, Outcome};

/// Where `sigil node sync` writes the node policy on the host, and what the
/// verifier reads when containerd's environment names no other
/// (`SIGIL_NODE_POLICY` unset): the verifier is armed only once sync has
/// written the file and then linked it.
pub const DEFAULT_POLICY: &str = "/etc/sigil/node-policy.yaml";

/// The most stdin the verifier reads: one descriptor (containerd sends a
/// line of about 200 bytes).
pub const MAX_STDIN: usize = 64 * 1024;
/// The most of a reason containerd keeps (it cuts stdout there).
pub const MAX_REASON: usize = 32 * 1024;

/// One pull, as containerd describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// The reference as the puller gave it (`-name`).
    pub name: String,
    /// The top-level digest containerd resolved (`-digest`): for a
    /// multi-platform image, the index's.
    pub digest: String,
    /// The descriptor's media type, from stdin when it parses.
    pub media_type: Option<String>,
    /// Arguments this protocol does not know (containerd's newer ones,
    /// such as `-operation pull`): logged and ignored, never a refusal.
    pub ignored: Vec<String>,
}

/// Why a request cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    /// A flag containerd always passes is missing.
    #[error("containerd did not pass {0} (is this sigil-containerd in containerd's bin_dir?)")]
    Missing(&'static str),
    /// A flag this protocol has, without its value.
    #[error("argument {0:?} has no value")]
    Unexpected(String),
    /// The digest is not `sha256:` and 64 hex digits.
    #[error("-digest {0:?} is not a sha256 digest")]
    Digest(String),
    /// The descriptor on stdin names another digest than `-digest`.
    #[error("the descriptor on stdin is for {stdin}, not -digest {flag}")]
    Mismatch {
        /// The descriptor's digest.
        stdin: String,
        /// The flag's.
        flag: String,
    },
}

impl Request {
    /// Reads containerd's arguments (`-name`, `-digest`,
    /// `-stdin-media-type`, single or double dash) and the descriptor it
    /// wrote to stdin (at most [`MAX_STDIN`] bytes; an unreadable one is
    /// ignored, a contradicting one refused). An argument it does not know
    /// is kept in `ignored` (with the value that follows an unknown flag),
    /// so a containerd that passes more than today's protocol still pulls.
    pub fn parse(args: &[String], stdin: &[u8]) -> Result<Request, RequestError> {
        let (mut name, mut digest) = (None, None);
        let mut ignored = Vec::new();
        let mut it = args.iter().peekable();
        while let Some(a) = it.next() {
            let flag = a.trim_start_matches('-');
            let (key, inline) = match flag.split_once('=') {
                Some((k, v)) => (k, Some(v.to_owned())),
                None => (flag, None),
            };
            let mut value = || {
                inline
                    .clone()
                    .or_else(|| it.next().cloned())
                    .ok_or_else(|| RequestError::Unexpected(a.clone()))
            };
            match key {
                "name" if a.starts_with('-') => name = Some(value()?),
                "digest" if a.starts_with('-') => digest = Some(value()?),
                "stdin-media-type" if a.starts_with('-') => {
                    value()?;
                }
                _ => {
                    ignored.push(a.clone());
                    let takes_value = a.starts_with('-') && inline.is_none();
                    if takes_value && it.peek().is_some_and(|v| !v.starts_with('-')) {
                        ignored.extend(it.next().cloned());
                    }
                }
            }
        }
        let name = name.ok_or(RequestError::Missing("-name"))?;
        let digest = digest.ok_or(RequestError::Missing("-digest"))?;
        let hex = digest.strip_prefix("sha256:").unwrap_or_default();
        if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(RequestError::Digest(digest));
        }
        let descriptor: Option<serde_json::Value> = serde_json::from_slice(
            stdin
                .split(|b| *b == b'\n')
                .find(|l| !l.is_empty())
                .unwrap_or_default(),
        )
        .ok();
        if let Some(d) = descriptor.as_ref().and_then(|d| d["digest"].as_str())
            && d != digest
        {
            return Err(RequestError::Mismatch {
                stdin: d.to_owned(),
                flag: digest,
            });
        }
        Ok(Request {
            name,
            media_type: descriptor
                .as_ref()
                .and_then(|d| d["mediaType"].as_str().map(str::to_owned)),
            digest,
            ignored,
        })
    }

    /// The image the pull is decided as: the name, without any digest it
    /// was given with, at the digest containerd resolved (what will run).
    pub fn image(&self) -> String {
        let name = self.name.split('@').next().unwrap_or(&self.name);
        format!("{name}@{}", self.digest)
    }
}

/// What the verifier answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Exit 0. With a note when a `warn` rule found something (stderr:
    /// containerd's debug log).
    Allow(Option<String>),
    /// Exit 1, the reason on stdout.
    Deny(String),
}

impl Verdict {
    /// Reads the decision on a Pod holding the one image: a failure of an
    /// `enforce` rule refuses the pull with the denial's what, why and fix;
    /// anything else allows it (a rewrite or pin makes no sense at pull: the
    /// digest is what runs, and it passed).
    pub fn of(image: &str, verdict: &ObjectVerdict) -> Verdict {
        let Some(f) = verdict.fields.first() else {
            return Verdict::Allow(None);
        };
        match &f.outcome {
            Outcome::Failed(failed) => {
                let line = format!(
                    "sigil refused {image} at pull{}: {}; to fix: {}",
                    f.rule
                        .as_ref()
                        .map(|r| format!(" (rule {})", r.name))
                        .unwrap_or_default(),
                    failed.denial.why(),
                    failed.denial.hint()
                );
                let line = sigil_core::text::escape_controls(&line).into_owned();
                match failed.mode {
                    Mode::Enforce => Verdict::Deny(cut(line, MAX_REASON)),
                    Mode::Warn => Verdict::Allow(Some(line)),
                }
            }
            Outcome::NeedsLookup { .. } => Verdict::Deny(format!(
                "sigil refused {image} at pull: it was not looked up (no registry answer in time)"
            )),
            Outcome::Unchanged { .. } | Outcome::Changed { .. } => Verdict::Allow(None),
        }
    }
}

/// `s` cut to at most `max` bytes on a character boundary.
pub fn cut(mut s: String, max: usize) -> String {
    if s.len() > max {
        let mut at = max;
        while !s.is_char_boundary(at) {
            at -= 1;
        }
        s.truncate(at);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    const D: &str = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    fn args(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn reads_what_containerd_passes() {
        let stdin = format!(
            "{{\"mediaType\":\"application/vnd.oci.image.index.v1+json\",\"digest\":\"{D}\",\"size\":1}}\n"
        );
        let r = Request::parse(
            &args(&[
                "-name",
                "127.0.0.1:5000/shop/app:1.0",
                "-digest",
                D,
                "-stdin-media-type",
                "application/vnd.oci.descriptor.v1+json",
            ]),
            stdin.as_bytes(),
        )
        .unwrap();
        assert_eq!(r.image(), format!("127.0.0.1:5000/shop/app:1.0@{D}"));
        assert_eq!(
            r.media_type.as_deref(),
            Some("application/vnd.oci.image.index.v1+json")
        );
        // A name that already carries a digest is decided at containerd's.
        let r = Request::parse(
            &args(&["--name=r.example.com/a@sha256:00", "--digest", D]),
            b"",
        )
        .unwrap();
        assert_eq!(r.image(), format!("r.example.com/a@{D}"));
    }

    #[test]
    fn refuses_what_containerd_never_passes() {
        for (a, want) in [
            (&["-digest", D][..], "-name"),
            (&["-name", "x"][..], "-digest"),
            (&["-name", "x", "-digest", "sha256:zz"][..], "sha256"),
            (&["-name"][..], "no value"),
        ] {
            let e = Request::parse(&args(a), b"").unwrap_err().to_string();
            assert!(e.contains(want), "{a:?}: {e}");
        }
        let other = D.replace('0', "f");
        let e = Request::parse(
            &args(&["-name", "x", "-digest", D]),
            format!("{{\"digest\":\"{other}\"}}").as_bytes(),
        )
        .unwrap_err();
        assert!(matches!(e, RequestError::Mismatch { .. }), "{e}");
    }

    #[test]
    fn regression_arguments_a_newer_containerd_passes_are_ignored_not_refused() {
        let r = Request::parse(
            &args(&[
                "-operation",
                "pull",
                "-name",
                "r.example.com/a:1",
                "--future=1",
                "-digest",
                D,
                "-flag-alone",
                "extra",
            ]),
            b"",
        )
        .unwrap();
        assert_eq!(r.name, "r.example.com/a:1");
        assert_eq!(r.digest, D);
        assert_eq!(
            r.ignored,
            ["-operation", "pull", "--future=1", "-flag-alone", "extra"]
        );
    }

    #[test]
    fn a_reason_is_cut_on_a_character_boundary() {
        let s = "é".repeat(20);
        let c = cut(s, 7);
        assert_eq!(c, "ééé");
    }
}
