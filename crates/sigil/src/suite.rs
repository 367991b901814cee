//! Policy test suites (`sigil test`): what a `sigil-test.yaml` says, and
//! whether the verdicts hold it.
//!
//! Owns the suite document (policies, resources, an offline registry, the
//! instant to judge at, and expected results per resource and container),
//! matching expectations against the per-image reports `sigil pin` produces
//! (so a suite sees exactly what the webhook and `sigil pin` decide), and
//! rendering the checks as a table, JSON or JUnit XML. It reads no files and
//! decides nothing: `cmd/test.rs` loads the suite, runs the one decision per
//! object through [`crate::pin::pin_text`], and hands the reports here.

use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use crate::pin::{ImageReport, Status};

/// The file name `sigil test` looks for.
pub const FILE_NAME: &str = "sigil-test.yaml";

/// A suite, as written.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Suite {
    /// `sigil.dev/v1alpha1`.
    pub api_version: String,
    /// `Test`.
    pub kind: String,
    /// Its name, in reports.
    pub metadata: SuiteMeta,
    /// Policy files (their documents act as one policy file), relative to the suite.
    pub policies: Vec<String>,
    /// Manifest files, relative to the suite.
    pub resources: Vec<String>,
    /// A directory of OCI image layouts, one per repository
    /// (`<dir>/registry.example.com/team/app/`); without it the suite runs
    /// offline and anything needing a lookup is `needs-lookup`.
    #[serde(default)]
    pub registry: Option<String>,
    /// The namespace of resources that name none (default `default`).
    #[serde(default)]
    pub namespace: Option<String>,
    /// The instant to judge at (RFC 3339), for exceptions' expiry; default now.
    #[serde(default)]
    pub now: Option<String>,
    /// What must come out.
    pub results: Vec<Expect>,
}

/// `metadata`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SuiteMeta {
    /// The suite's name.
    pub name: String,
}

/// The outcome a check expects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Expected {
    /// Admitted: as written, pinned or rewritten.
    Admitted,
    /// Refused (enforce, or a static deny).
    Denied,
    /// Admitted with a warning (a warn-mode rule).
    Warned,
    /// Admitted with a warning because an `ImagePolicyException` waives the failure.
    Excepted,
}

/// One expected result.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Expect {
    /// `KIND/NAME` or `KIND/NAMESPACE/NAME`.
    pub resource: String,
    /// A container (or volume) name; every image of the resource when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container: Option<String>,
    /// What must happen.
    pub result: Expected,
    /// For `admitted`: the image after rewrite and pinning.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// The rule that decided it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rule: Option<String>,
    /// The reason, as verdict labels say it (`unverified`, `static_deny`, …).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// One check: an expectation against one image's verdict.
#[derive(Debug, Clone, Serialize)]
pub struct Check {
    /// The suite's name.
    pub suite: String,
    /// The resource, as the expectation names it.
    pub resource: String,
    /// The container, when the image has a named one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub container: Option<String>,
    /// What was expected.
    pub expected: Expected,
    /// What happened: the verdict label, and the new image when it changed.
    pub got: String,
    /// Whether it holds.
    pub passed: bool,
    /// Why not (and the decision's own message, if any).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// Why an expectation cannot be checked: the suite is wrong, not the policy.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SuiteError {
    /// The resource reference is not `KIND/NAME` or `KIND/NAMESPACE/NAME`.
    #[error("result {index}: resource {resource:?} is not KIND/NAME or KIND/NAMESPACE/NAME")]
    BadResource {
        /// 1-based position in `results`.
        index: usize,
        /// As written.
        resource: String,
    },
    /// No image of the suite's resources matches the expectation.
    #[error("result {index}: no image of {resource}{container} in the suite's resources")]
    NoSuchResource {
        /// 1-based position in `results`.
        index: usize,
        /// As written.
        resource: String,
        /// ` container "x"`, or empty.
        container: String,
    },
}

/// Checks every expectation of `suite` against `reports` (every image of
/// the suite's resources); `namespace` is the suite's default namespace.
pub fn check(
    suite: &Suite,
    reports: &[ImageReport],
    namespace: &str,
) -> Result<Vec<Check>, SuiteError> {
    let mut out = Vec::new();
    for (i, e) in suite.results.iter().enumerate() {
        let index = i + 1;
        let parts: Vec<&str> = e.resource.split('/').collect();
        let (kind, ns, name) = match parts.as_slice() {
            [k, n] if !k.is_empty() && !n.is_empty() => (*k, None, *n),
            [k, ns, n] if !k.is_empty() && !n.is_empty() => (*k, Some(*ns), *n),
            _ => {
                return Err(SuiteError::BadResource {
                    index,
                    resource: e.resource.clone(),
                });
            }
        };
        let matching: Vec<&ImageReport> = reports
            .iter()
            .filter(|r| {
                let r_ns = if r.object.namespace.is_empty() {
                    namespace
                } else {
                    &r.object.namespace
                };
                r.object.kind == kind
                    && r.object.name == name
                    && ns.is_none_or(|n| n == r_ns)
                    && e.container
                        .as_ref()
                        .is_none_or(|c| r.container.as_ref() == Some(c))
            })
            .collect();
        if matching.is_empty() {
            return Err(SuiteError::NoSuchResource {
                index,
                resource: e.resource.clone(),
                container: e
                    .container
                    .as_ref()
                    .map(|c| format!(" container {c:?}"))
                    .unwrap_or_default(),
            });
        }
        for r in matching {
            out.push(judge(&suite.metadata.name, e, r));
        }
    }
    Ok(out)
}

fn judge(suite: &str, e: &Expect, r: &ImageReport) -> Check {
    let label = r.verdict.as_str();
    let reason = label.split_once(':').map(|(_, k)| k);
    let final_image = r.new.as_deref().unwrap_or(&r.image);
    let got = match &r.new {
        Some(n) => format!("{label} → {n}"),
        None => label.to_owned(),
    };
    let outcome_holds = match e.result {
        Expected::Admitted => matches!(r.status, Status::Ok | Status::Pinned | Status::Rewritten),
        Expected::Denied => r.status == Status::Denied,
        Expected::Warned => label.starts_with("warned:"),
        Expected::Excepted => label.starts_with("excepted:"),
    };
    let mut why = Vec::new();
    if !outcome_holds {
        why.push(format!("expected {}, got {label}", expected_word(e.result)));
    }
    if let Some(want) = &e.image
        && want != final_image
    {
        why.push(format!("expected image {want}, got {final_image}"));
    }
    if let Some(want) = &e.rule
        && r.rule.as_ref() != Some(want)
    {
        why.push(format!(
            "expected rule {want:?}, got {}",
            r.rule
                .as_deref()
                .map_or("no rule".to_owned(), |x| format!("{x:?}"))
        ));
    }
    if let Some(want) = &e.reason
        && reason != Some(want.as_str())
    {
        why.push(format!(
            "expected reason {want}, got {}",
            reason.unwrap_or("none")
        ));
    }
    let passed = why.is_empty();
    let message = match (&r.message, passed) {
        (_, true) => None,
        (Some(m), false) => Some(format!("{}; the decision said: {m}", why.join("; "))),
        (None, false) => Some(why.join("; ")),
    };
    Check {
        suite: suite.to_owned(),
        resource: e.resource.clone(),
        container: r.container.clone(),
        expected: e.result,
        got,
        passed,
        message,
    }
}

fn expected_word(e: Expected) -> &'static str {
    match e {
        Expected::Admitted => "admitted",
        Expected::Denied => "denied",
        Expected::Warned => "warned",
        Expected::Excepted => "excepted",
    }
}

/// One line per check, then a summary.
pub fn table(checks: &[Check]) -> String {
    let mut s = String::new();
    for c in checks {
        let _ = writeln!(
            s,
            "{}  {}  {}{}  expected {}, got {}",
            if c.passed { "PASS" } else { "FAIL" },
            c.suite,
            c.resource,
            c.container
                .as_ref()
                .map(|x| format!(" container {x:?}"))
                .unwrap_or_default(),
            expected_word(c.expected),
            c.got
        );
        if let Some(m) = &c.message {
            let _ = writeln!(s, "      {m}");
        }
    }
    let failed = checks.iter().filter(|c| !c.passed).count();
    let _ = writeln!(
        s,
        "\n{} check(s): {} passed, {failed} failed",
        checks.len(),
        checks.len() - failed
    );
    s
}

fn xml(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for ch in s.chars() {
        match ch {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            c if (c as u32) < 0x20 && !matches!(c, '\t' | '\n' | '\r') => {}
            c => out.push(c),
        }
    }
    out
}

/// JUnit XML, one `testsuite` per suite and one `testcase` per check.
pub fn junit(checks: &[Check]) -> String {
    let mut suites: Vec<&str> = Vec::new();
    for c in checks {
        if !suites.contains(&c.suite.as_str()) {
            suites.push(&c.suite);
        }
    }
    let failed = checks.iter().filter(|c| !c.passed).count();
    let mut s = format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<testsuites name=\"sigil test\" tests=\"{}\" failures=\"{failed}\">\n",
        checks.len()
    );
    for name in suites {
        let mine: Vec<&Check> = checks.iter().filter(|c| c.suite == name).collect();
        let f = mine.iter().filter(|c| !c.passed).count();
        let _ = writeln!(
            s,
            "  <testsuite name=\"{}\" tests=\"{}\" failures=\"{f}\">",
            xml(name),
            mine.len()
        );
        for c in mine {
            let case = format!(
                "{}{}: {}",
                c.resource,
                c.container
                    .as_ref()
                    .map(|x| format!(" container {x}"))
                    .unwrap_or_default(),
                expected_word(c.expected)
            );
            match &c.message {
                None => {
                    let _ = writeln!(
                        s,
                        "    <testcase classname=\"{}\" name=\"{}\"/>",
                        xml(name),
                        xml(&case)
                    );
                }
                Some(m) => {
                    let _ = writeln!(
                        s,
                        "    <testcase classname=\"{}\" name=\"{}\">\n      <failure message=\"{}\">got {}</failure>\n    </testcase>",
                        xml(name),
                        xml(&case),
                        xml(m),
                        xml(&c.got)
                    );
                }
            }
        }
        s.push_str("  </testsuite>\n");
    }
    s.push_str("</testsuites>\n");
    s
}

#[cfg(test)]
mod tests;
