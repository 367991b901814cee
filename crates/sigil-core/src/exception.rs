//! `ImagePolicyException`: a team's time-bounded waiver of named rules for
//! named images in its own namespace.
//!
//! Owns the document (images as patterns or exact digests, the rules it
//! waives, a required `expires`, `reason`, an optional `ticket`), checking it
//! against the policy in force (every rule it names must exist and accept
//! exceptions — `exceptions: {allowed: true, maxDuration}` on the rule — and
//! the exception may not outlive `maxDuration` from its creation), and the
//! one question a decision asks: does an exception in force at this instant
//! waive this failure? It reads no clock: callers pass `now` (unix seconds),
//! so an exception stops applying the second it expires, without a restart.
//! The waiver itself (an enforced failure becomes a warning naming the
//! exception) is applied in [`crate::object`].

use serde::{Deserialize, Serialize};

use crate::pattern::Pattern;
use crate::reference::{Digest, Reference};

/// The kind, as objects and policy-file documents spell it.
pub const KIND: &str = "ImagePolicyException";

/// The `apiVersion` of every sigil kind (`crate::policy::API_VERSION` is this one).
pub const API_VERSION: &str = "sigil.dev/v1alpha1";

/// Why an exception document means nothing sigil can apply.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ExceptionError {
    /// Malformed YAML or JSON, or a field of the wrong shape.
    #[error("{0}")]
    Syntax(String),
    /// Well-formed, but not an exception sigil can apply.
    #[error("{0}")]
    Invalid(String),
}

/// One rule an exception waives, as written: `policy` is
/// `ClusterImagePolicy/NAME`, `ImagePolicy/NAMESPACE/NAME` (a team's), or
/// `ImagePolicy/NAME` (the policy file's single cluster document).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RuleTarget {
    /// The policy object stating the rule.
    pub policy: String,
    /// The rule's name.
    pub rule: String,
}

impl RuleTarget {
    /// The `source` a [`RuleRef`] of this rule carries (`None`: the policy
    /// file's classic document), or why the `policy` is malformed.
    fn source(&self) -> Result<Option<String>, String> {
        let parts: Vec<&str> = self.policy.split('/').collect();
        match parts.as_slice() {
            ["ClusterImagePolicy", name] if !name.is_empty() => {
                Ok(Some(format!("ClusterImagePolicy {name}")))
            }
            ["ImagePolicy", ns, name] if !ns.is_empty() && !name.is_empty() => {
                Ok(Some(format!("ImagePolicy {ns}/{name}")))
            }
            ["ImagePolicy", name] if !name.is_empty() => Ok(None),
            _ => Err(format!(
                "policy {:?} is not ClusterImagePolicy/NAME, ImagePolicy/NAMESPACE/NAME or ImagePolicy/NAME",
                self.policy
            )),
        }
    }
}

/// `spec` as written.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ExceptionSpec {
    /// Image patterns (as in a rule's `match`) or exact `name@sha256:…`.
    pub images: Vec<String>,
    /// What it waives.
    pub rules: Vec<RuleTarget>,
    /// RFC 3339 instant after which it no longer applies.
    pub expires: String,
    /// Why: shown in warnings, the audit and reports.
    pub reason: String,
    /// A tracking reference (`SEC-1234`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ticket: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Doc {
    api_version: String,
    kind: String,
    metadata: Meta,
    spec: ExceptionSpec,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Meta {
    name: String,
    #[serde(default)]
    namespace: String,
    #[serde(default)]
    creation_timestamp: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum ImageMatch {
    Pattern(Pattern),
    /// An exact image: its name pattern and the one digest it waives.
    Digest(Pattern, Digest),
}

/// A compiled exception. Whether it is in force is [`Self::active_at`];
/// whether the policy accepts it is [`Self::check`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exception {
    /// Its namespace: it applies to objects there only.
    pub namespace: String,
    /// `metadata.name`.
    pub name: String,
    images: Vec<ImageMatch>,
    /// The rules it waives.
    pub rules: Vec<RuleTarget>,
    sources: Vec<Option<String>>,
    /// Unix seconds at which it stops applying.
    pub expires: i64,
    /// `expires` as written (RFC 3339), for messages.
    pub expires_text: String,
    /// Unix seconds it was created at, when known (objects), for `maxDuration`.
    pub created: Option<i64>,
    /// Why.
    pub reason: String,
    /// Tracking reference.
    pub ticket: Option<String>,
}

/// Where an exception stands at an instant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ExceptionState {
    /// Accepted and not expired.
    Active,
    /// Accepted, but its `expires` has passed.
    Expired,
    /// Refused by the policy (or malformed): never applies.
    Invalid,
}

impl ExceptionState {
    /// An exception's state at `now` (unix seconds), given whether the policy
    /// accepted it and when it expires: in force until `expires`, exclusive.
    pub fn at(accepted: bool, expires: i64, now: i64) -> ExceptionState {
        match (accepted, now < expires) {
            (false, _) => ExceptionState::Invalid,
            (true, true) => ExceptionState::Active,
            (true, false) => ExceptionState::Expired,
        }
    }

    /// Label for status and `sigil_exceptions{state}`.
    pub fn as_str(self) -> &'static str {
        match self {
            ExceptionState::Active => "active",
            ExceptionState::Expired => "expired",
            ExceptionState::Invalid => "invalid",
        }
    }
}

/// Parses an RFC 3339 instant into unix seconds.
pub fn parse_instant(s: &str) -> Option<i64> {
    chrono::DateTime::parse_from_rfc3339(s.trim())
        .ok()
        .map(|t| t.timestamp())
}

fn bad(message: String) -> ExceptionError {
    ExceptionError::Invalid(message)
}

impl Exception {
    /// `ImagePolicyException team-a/legacy`, as messages name it.
    pub fn display_name(&self) -> String {
        format!("{KIND} {}/{}", self.namespace, self.name)
    }

    /// Compiles one document (already parsed).
    pub fn from_value(v: serde_json::Value) -> Result<Exception, ExceptionError> {
        let doc: Doc =
            serde_json::from_value(v).map_err(|e| ExceptionError::Syntax(e.to_string()))?;
        Exception::compile(doc)
    }

    /// Compiles one document from YAML.
    pub fn from_yaml(text: &str) -> Result<Exception, ExceptionError> {
        let doc: Doc = serde_saphyr::from_str_with_options(text, crate::yaml::options(text))
            .map_err(|e| ExceptionError::Syntax(e.to_string()))?;
        Exception::compile(doc)
    }

    fn compile(doc: Doc) -> Result<Exception, ExceptionError> {
        if doc.api_version != API_VERSION || doc.kind != KIND {
            return Err(bad(format!(
                "expected apiVersion {API_VERSION} kind {KIND}, got {} {}",
                doc.api_version, doc.kind
            )));
        }
        let (namespace, name) = (doc.metadata.namespace, doc.metadata.name);
        if namespace.is_empty() {
            return Err(bad(format!(
                "{KIND} {name:?} needs metadata.namespace: it waives rules in one namespace"
            )));
        }
        let spec = doc.spec;
        if spec.images.is_empty() {
            return Err(bad("spec.images is empty: name the images it waives".into()));
        }
        if spec.rules.is_empty() {
            return Err(bad("spec.rules is empty: name the rules it waives".into()));
        }
        if spec.reason.trim().is_empty() {
            return Err(bad(
                "spec.reason is empty: say why the waiver is needed".into()
            ));
        }
        let images = spec
            .images
            .iter()
            .map(|i| compile_image(i).map_err(|m| bad(format!("spec.images: {m}"))))
            .collect::<Result<Vec<_>, _>>()?;
        let sources = spec
            .rules
            .iter()
            .map(|r| r.source().map_err(|m| bad(format!("spec.rules: {m}"))))
            .collect::<Result<Vec<_>, _>>()?;
        for (t, s) in spec.rules.iter().zip(&sources) {
            if let Some(s) = s
                && let Some(rest) = s.strip_prefix("ImagePolicy ")
                && !rest.starts_with(&format!("{namespace}/"))
            {
                return Err(bad(format!(
                    "spec.rules: {:?} is another namespace's policy; an exception waives rules in its own namespace ({namespace})",
                    t.policy
                )));
            }
        }
        let expires = parse_instant(&spec.expires).ok_or_else(|| {
            bad(format!(
                "spec.expires {:?} is not an RFC 3339 time (2026-12-31T00:00:00Z)",
                spec.expires
            ))
        })?;
        let created = doc
            .metadata
            .creation_timestamp
            .as_deref()
            .and_then(parse_instant);
        Ok(Exception {
            namespace,
            name,
            images,
            rules: spec.rules,
            sources,
            expires,
            expires_text: spec.expires.trim().to_owned(),
            created,
            reason: spec.reason,
            ticket: spec.ticket,
        })
    }

    /// Whether it is in force at `now` (unix seconds): until `expires`, exclusive.
    pub fn active_at(&self, now: i64) -> bool {
        now < self.expires
    }

    /// Its state at `now`, given whether the policy accepted it.
    pub fn state(&self, accepted: bool, now: i64) -> ExceptionState {
        ExceptionState::at(accepted, self.expires, now)
    }

    /// The rules it waives, each with the `source` its rule reference
    /// carries (`ClusterImagePolicy NAME`, `ImagePolicy NS/NAME`, or `None`
    /// for a policy file's classic document).
    pub fn targets(&self) -> impl Iterator<Item = (&RuleTarget, Option<&str>)> {
        self.rules
            .iter()
            .zip(&self.sources)
            .map(|(t, s)| (t, s.as_deref()))
    }

    /// Whether it waives a failure of rule `rule` (stated by `source`, as
    /// [`Self::targets`] names it) for an image of origin name `origin`
    /// running `digest` (when known). Pure matching: expiry is
    /// [`Self::active_at`]'s.
    pub fn covers(
        &self,
        origin: &Reference,
        digest: Option<&Digest>,
        rule: &str,
        source: Option<&str>,
    ) -> bool {
        let rule_named = self.targets().any(|(t, s)| t.rule == rule && s == source);
        rule_named
            && self.images.iter().any(|m| match m {
                ImageMatch::Pattern(p) => p.matches(origin),
                ImageMatch::Digest(p, d) => p.matches(origin) && digest == Some(d),
            })
    }
}

fn compile_image(s: &str) -> Result<ImageMatch, String> {
    if let Some((name, _)) = s.split_once('@') {
        let r = Reference::parse(s).map_err(|e| format!("{s:?}: {e}"))?;
        let d = r
            .digest()
            .cloned()
            .ok_or_else(|| format!("{s:?}: not name@sha256:…"))?;
        let p = Pattern::parse(name).map_err(|e| e.to_string())?;
        return Ok(ImageMatch::Digest(p, d));
    }
    Pattern::parse(s)
        .map(ImageMatch::Pattern)
        .map_err(|e| e.to_string())
}

/// The exception that waived a failure, as findings carry it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Waiver {
    /// `ImagePolicyException team-a/legacy`.
    pub exception: String,
    /// When it stops applying, as written.
    pub expires: String,
    /// Why.
    pub reason: String,
    /// Tracking reference.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ticket: Option<String>,
}

impl Waiver {
    /// What an exception says when it waives something.
    pub fn of(e: &Exception) -> Waiver {
        Waiver {
            exception: e.display_name(),
            expires: e.expires_text.clone(),
            reason: e.reason.clone(),
            ticket: e.ticket.clone(),
        }
    }
}
