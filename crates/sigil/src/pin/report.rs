//! `sigil pin`'s report: per file and per image what happened, the totals,
//! and its two renderings — the text lines (`file:line:column: …`) and the
//! stable JSON document `--output json` prints (docs/pin.md).

use sigil_core::text::{push_block, push_line};

use super::{ImageReport, Pinned, Status};

#[derive(Debug, Default, serde::Serialize)]
#[serde(rename_all = "camelCase")]
/// What `sigil pin` did, per file and in total; `--output json` prints it as is.
pub struct Report {
    pub files: Vec<FileReport>,
    pub images: usize,
    pub pinned: usize,
    pub rewritten: usize,
    pub ok: usize,
    pub needs_registry: usize,
    pub denied: usize,
    pub warnings: usize,
    pub errors: usize,
    pub check_failures: usize,
    pub written: usize,
    pub registry_requests: u64,
}

#[derive(Debug, serde::Serialize)]
#[serde(rename_all = "camelCase")]
/// One input file (or stdin).
pub struct FileReport {
    pub path: String,
    pub changed: bool,
    pub images: Vec<ImageReport>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl Report {
    /// Counts one input's result (taking its images and notes).
    pub fn add(
        &mut self,
        name: &str,
        result: &mut Result<Pinned, sigil_core::manifest::ManifestError>,
        check: bool,
    ) {
        let mut f = FileReport {
            path: name.to_owned(),
            changed: false,
            images: Vec::new(),
            notes: Vec::new(),
            error: None,
        };
        match result {
            Err(e) => {
                self.errors += 1;
                f.error = Some(e.to_string());
            }
            Ok(p) => {
                f.changed = p.changed;
                f.notes = std::mem::take(&mut p.decided.notes);
                for i in &p.decided.images {
                    self.images += 1;
                    match i.status {
                        Status::Ok => self.ok += 1,
                        Status::Pinned => self.pinned += 1,
                        Status::Rewritten => self.rewritten += 1,
                        Status::NeedsRegistry => self.needs_registry += 1,
                        Status::Denied => self.denied += 1,
                        Status::Warning => self.warnings += 1,
                    }
                    if check && i.status.fails_check() {
                        self.check_failures += 1;
                    }
                }
                f.images = std::mem::take(&mut p.decided.images);
            }
        }
        self.files.push(f);
    }

    /// The text report: one line per image that is not final (`file:line:col:`),
    /// then the totals. `quiet_changes` leaves out the pinned/rewritten lines
    /// (the pinned YAML itself goes to stdout).
    pub fn text(&self, check: bool, quiet_changes: bool) -> String {
        use std::fmt::Write as _;
        let mut s = String::new();
        for f in &self.files {
            if let Some(e) = &f.error {
                push_block(&mut s, format_args!("{}: error: ", f.path), e);
            }
            for n in &f.notes {
                push_line(&mut s, format_args!("{}: note: {n}", f.path));
            }
            for i in &f.images {
                let loc = format!("{}:{}:{}", f.path, i.line, i.column);
                let what = format!("{} {}", i.object, i.describe);
                if let (Status::Ok | Status::Pinned | Status::Rewritten, Some(m)) =
                    (i.status, &i.message)
                {
                    // Pinned or kept, with something to know (a mirror fallback).
                    push_line(&mut s, format_args!("{loc}: warning: {m}"));
                }
                match (i.status, &i.new, &i.message) {
                    (Status::Ok, _, _) => {}
                    (Status::Pinned | Status::Rewritten, Some(new), _) if !quiet_changes => {
                        let verb = match (i.status, check) {
                            (Status::Pinned, true) => "not pinned",
                            (Status::Rewritten, true) => "not rewritten",
                            (Status::Pinned, false) => "pinned",
                            _ => "rewritten",
                        };
                        push_line(
                            &mut s,
                            format_args!("{loc}: {verb}: {what}: {} -> {new}", i.image),
                        );
                    }
                    (Status::Pinned | Status::Rewritten, _, _) => {}
                    (status, _, msg) => {
                        let label = match status {
                            Status::Denied => "denied",
                            Status::Warning => "warning",
                            _ => "needs registry",
                        };
                        push_line(
                            &mut s,
                            format_args!("{loc}: {label}: {}", msg.as_deref().unwrap_or_default()),
                        );
                    }
                }
            }
        }
        let _ = writeln!(
            s,
            "sigil pin: {} file(s), {} image(s): {} pinned, {} rewritten, {} already final, {} need a registry, {} denied, {} warning(s), {} error(s); {} registry lookup(s){}",
            self.files.len(),
            self.images,
            self.pinned,
            self.rewritten,
            self.ok,
            self.needs_registry,
            self.denied,
            self.warnings,
            self.errors,
            self.registry_requests,
            if self.written > 0 {
                format!("; {} file(s) written", self.written)
            } else {
                String::new()
            }
        );
        if check && self.check_failures > 0 {
            let _ = writeln!(
                s,
                "sigil pin --check: {} image(s) not final; run `sigil pin --write` on these files and commit the result",
                self.check_failures
            );
        }
        s
    }
}
