//! The `ImagePolicy` file: its schema, its validation, and the per-image plan.
//!
//! This module owns what a policy *means*: mirror rewrites (and their inverse,
//! so a second admission pass decides the same), which rule governs an image,
//! and whether the image must be resolved, kept, or denied. It reads no files
//! and talks to no registry: paths in the policy (CA files, password files) are
//! handed to the I/O crates as written.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_saphyr::Spanned;

use std::sync::Arc;

use crate::decision::{Denial, Mode};
use crate::pattern::{Pattern, PatternError};
use crate::reference::{self, Reference};
use crate::verify::{SignaturesSpec, Verification, VerifierSpec};

/// The only `apiVersion` this build understands.
pub const API_VERSION: &str = "sigil.dev/v1alpha1";
/// The policy's `kind`.
pub const KIND: &str = "ImagePolicy";

/// The policy sigil uses when none is given: pin every image, only warn on failure.
pub const DEFAULT_POLICY_YAML: &str = r#"apiVersion: sigil.dev/v1alpha1
kind: ImagePolicy
metadata:
  name: embedded-default
spec:
  pin:
    scope: workloads
    platform: ""
    cacheTTL: 5m
  rules:
    - name: pin-everything
      match: ["**"]
      mode: warn
  exemptNamespaces: [kube-system]
"#;

/// Why a policy could not be loaded. Every variant names the line when known.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    /// The YAML is malformed or does not fit the schema (unknown field, wrong type).
    #[error("{0}")]
    Syntax(String),
    /// A value is well-formed YAML but means nothing sigil can apply.
    #[error("{}{message}", fmt_line(*line))]
    Invalid {
        /// 1-based line of the offending value, if known.
        line: Option<u64>,
        /// What is wrong and how to fix it.
        message: String,
    },
}

fn fmt_line(line: Option<u64>) -> String {
    line.map(|l| format!("line {l}: ")).unwrap_or_default()
}

fn invalid<T>(at: &Spanned<T>, message: impl Into<String>) -> PolicyError {
    let l = at.referenced.line();
    PolicyError::Invalid {
        line: (l > 0).then_some(l),
        message: message.into(),
    }
}

/// The document as written. Field names are the YAML's.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ImagePolicyDoc {
    /// Must be `sigil.dev/v1alpha1`.
    pub api_version: Spanned<String>,
    /// Must be `ImagePolicy`.
    pub kind: Spanned<String>,
    /// Only `name` is used; labels and annotations are accepted and ignored.
    #[serde(default)]
    pub metadata: Metadata,
    /// What the policy says.
    pub spec: Spec,
}

/// Object metadata, kept loose so a policy can live in a Kubernetes object.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
pub struct Metadata {
    /// Shown in logs and `sigil policy check`.
    #[serde(default)]
    pub name: String,
}

/// `spec` of an ImagePolicy.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Spec {
    /// Rewrite stage, applied first.
    #[serde(default)]
    pub mirrors: Vec<MirrorSpec>,
    /// Per-host connection settings.
    #[serde(default)]
    pub registries: Vec<RegistrySpec>,
    /// How tags become digests.
    #[serde(default)]
    pub pin: PinSpec,
    /// Matched on the origin name; most specific wins.
    #[serde(default)]
    pub rules: Vec<RuleSpec>,
    /// Namespaces whose requests pass untouched.
    #[serde(default)]
    pub exempt_namespaces: Vec<String>,
}

/// One origin → mirror mapping.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct MirrorSpec {
    /// Origin prefix on the normalized name: a host, or host/path.
    pub from: Spanned<String>,
    /// Mirror prefix that replaces it.
    pub to: Spanned<String>,
}

/// How to reach one registry host.
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RegistrySpec {
    /// `host[:port]` exactly as it appears in normalized names.
    pub host: String,
    /// Plain HTTP for this host only.
    #[serde(default)]
    pub insecure: bool,
    /// Extra CA: a PEM file path, or inline PEM.
    #[serde(default)]
    pub ca: Option<String>,
    /// Credentials; anonymous when absent.
    #[serde(default)]
    pub auth: Option<AuthSpec>,
    /// At most this many requests in flight to the host (default 32).
    #[serde(default)]
    pub max_concurrent_requests: Option<u32>,
}

/// Where credentials come from. Secrets are never inline in the policy, which
/// usually lives in a ConfigMap.
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AuthSpec {
    /// Basic-auth / token-service user name.
    #[serde(default)]
    pub username: Option<String>,
    /// File holding the password (a mounted Secret key).
    #[serde(default)]
    pub password_file: Option<String>,
    /// A docker `config.json` (`auths` section) to take credentials from.
    #[serde(default)]
    pub docker_config: Option<String>,
}

/// `spec.pin`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PinSpec {
    /// Which objects are patched.
    #[serde(default)]
    pub scope: Scope,
    /// `""` pins the index digest; `os/arch[/variant]` pins that platform's manifest.
    #[serde(default = "empty_spanned")]
    pub platform: Spanned<String>,
    /// How long a resolved digest is trusted (Go/humantime duration: `5m`, `30s`).
    #[serde(default = "default_ttl", rename = "cacheTTL")]
    pub cache_ttl: Spanned<String>,
}

fn default_ttl() -> Spanned<String> {
    unspanned("5m")
}

fn empty_spanned() -> Spanned<String> {
    unspanned("")
}

fn unspanned(s: &str) -> Spanned<String> {
    Spanned::new(
        s.to_owned(),
        serde_saphyr::Location::UNKNOWN,
        serde_saphyr::Location::UNKNOWN,
    )
}

impl Default for PinSpec {
    fn default() -> Self {
        PinSpec {
            scope: Scope::default(),
            platform: empty_spanned(),
            cache_ttl: default_ttl(),
        }
    }
}

/// Which objects the webhook patches.
#[derive(Debug, Clone, Copy, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Scope {
    /// Every object with pod-spec image fields (Deployments, Jobs, Pods, …).
    #[default]
    Workloads,
    /// Only Pods are patched; other objects are checked but left as written.
    Pods,
}

/// What a rule does with a matching image.
#[derive(Debug, Clone, Copy, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Action {
    /// Resolve the tag to a digest and pin it (the default).
    #[default]
    Pin,
    /// Admit as written (after mirror rewrite), without pinning.
    Allow,
    /// Refuse the image outright.
    Deny,
}

/// One entry of `spec.rules`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RuleSpec {
    /// Shown in denials, warnings and metrics.
    pub name: Spanned<String>,
    /// Name patterns matched on the origin name.
    #[serde(rename = "match")]
    pub patterns: Vec<Spanned<String>>,
    /// What happens when resolution fails (default `enforce`).
    #[serde(default)]
    pub mode: Option<Mode>,
    /// `pin` (default), `allow` or `deny`.
    #[serde(default)]
    pub action: Option<Action>,
    /// Free text for humans; printed by `sigil policy check`.
    #[serde(default)]
    pub description: Option<String>,
    /// Signature verifiers run on the pinned digest.
    #[serde(default)]
    pub verify: Vec<VerifierSpec>,
    /// At least this many verifiers must pass (default: all).
    #[serde(default)]
    pub threshold: Option<u32>,
    /// Verifiers that must be among those that pass.
    #[serde(default)]
    pub required: Vec<String>,
    /// Where signatures are looked up.
    #[serde(default)]
    pub signatures: Option<SignaturesSpec>,
}

/// A platform selector such as `linux/arm64/v8`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Platform {
    /// e.g. `linux`
    pub os: String,
    /// e.g. `amd64`
    pub architecture: String,
    /// e.g. `v8`
    pub variant: Option<String>,
}

impl std::fmt::Display for Platform {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.os, self.architecture)?;
        if let Some(v) = &self.variant {
            write!(f, "/{v}")?;
        }
        Ok(())
    }
}

impl Platform {
    /// Parses `os/arch[/variant]`.
    pub fn parse(s: &str) -> Option<Platform> {
        let mut it = s.split('/');
        let os = it.next().filter(|x| !x.is_empty())?;
        let architecture = it.next().filter(|x| !x.is_empty())?;
        let variant = it.next().map(str::to_owned);
        if it.next().is_some() || variant.as_deref() == Some("") {
            return None;
        }
        Some(Platform {
            os: os.to_owned(),
            architecture: architecture.to_owned(),
            variant,
        })
    }
}

/// A compiled mirror.
#[derive(Debug, Clone)]
pub struct Mirror {
    /// Origin prefix (normalized).
    pub from: String,
    /// Mirror prefix.
    pub to: String,
}

/// A compiled rule.
#[derive(Debug, Clone)]
pub struct Rule {
    /// Rule name.
    pub name: String,
    /// Patterns, in the order written.
    pub patterns: Vec<Pattern>,
    /// Failure handling.
    pub mode: Mode,
    /// What to do on match.
    pub action: Action,
    /// Free text.
    pub description: Option<String>,
    /// Signature requirement, if the rule has `verify`.
    pub verification: Option<Arc<Verification>>,
}

/// A loaded, validated policy. Cheap to share behind an `Arc`.
#[derive(Debug, Clone)]
pub struct Policy {
    /// `metadata.name`.
    pub name: String,
    /// Mirrors sorted longest `from` first.
    pub mirrors: Vec<Mirror>,
    /// Registry settings, as written.
    pub registries: Vec<RegistrySpec>,
    /// Which objects are patched.
    pub scope: Scope,
    /// Platform to pin, if any.
    pub platform: Option<Platform>,
    /// Digest cache lifetime.
    pub cache_ttl: Duration,
    /// Rules as written.
    pub rules: Vec<Rule>,
    /// (rule index, pattern index) sorted most specific first.
    order: Vec<(usize, usize)>,
    /// Namespaces that pass untouched.
    pub exempt_namespaces: Vec<String>,
}

/// What the policy says must happen to one image, before any I/O.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// The image as written in the object.
    pub written: String,
    /// Its normalized form.
    pub reference: Reference,
    /// The name rules were matched on (mirror prefix mapped back to the origin).
    pub origin: Reference,
    /// Where the image is pulled from after the mirror stage.
    pub target: Reference,
    /// Name of the rule that applied.
    pub rule: String,
    /// Failure handling of that rule.
    pub mode: Mode,
    /// Next step.
    pub step: Step,
    /// Signatures the pinned digest must carry, if the rule verifies.
    pub verify: Option<Arc<Verification>>,
}

/// The I/O, if any, a plan still needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Resolve `target`'s tag to a digest, then pin.
    Resolve,
    /// Nothing to look up; the image is final as `target` (maybe rewritten).
    Keep,
    /// Static denial by the rule.
    Deny,
}

impl Policy {
    /// Loads the embedded default policy.
    pub fn embedded_default() -> Policy {
        // The embedded text is covered by a unit test; failing here is a build bug.
        Policy::from_yaml(DEFAULT_POLICY_YAML)
            .unwrap_or_else(|e| panic!("embedded default policy is invalid: {e}"))
    }

    /// Parses and validates a policy document.
    pub fn from_yaml(text: &str) -> Result<Policy, PolicyError> {
        let doc: ImagePolicyDoc =
            serde_saphyr::from_str(text).map_err(|e| PolicyError::Syntax(e.to_string()))?;
        Policy::compile(doc)
    }

    /// Validates a policy that was already deserialized (e.g. from a KRM functionConfig).
    pub fn from_json_value(v: serde_json::Value) -> Result<Policy, PolicyError> {
        let doc: ImagePolicyDoc =
            serde_json::from_value(v).map_err(|e| PolicyError::Syntax(e.to_string()))?;
        Policy::compile(doc)
    }

    /// Turns the document into a policy, or says which value is wrong.
    pub fn compile(doc: ImagePolicyDoc) -> Result<Policy, PolicyError> {
        if doc.api_version.value != API_VERSION {
            return Err(invalid(
                &doc.api_version,
                format!(
                    "apiVersion is {:?}; this sigil reads {API_VERSION:?}",
                    doc.api_version.value
                ),
            ));
        }
        if doc.kind.value != KIND {
            return Err(invalid(
                &doc.kind,
                format!("kind is {:?}; expected {KIND:?}", doc.kind.value),
            ));
        }
        let spec = doc.spec;
        let mirrors = compile_mirrors(&spec.mirrors)?;
        let platform = match spec.pin.platform.value.trim() {
            "" => None,
            p => Some(Platform::parse(p).ok_or_else(|| {
                invalid(
                    &spec.pin.platform,
                    format!("platform {p:?} is not os/arch[/variant], e.g. linux/amd64"),
                )
            })?),
        };
        let cache_ttl =
            humantime::parse_duration(spec.pin.cache_ttl.value.trim()).map_err(|e| {
                invalid(
                    &spec.pin.cache_ttl,
                    format!(
                        "cacheTTL {:?} is not a duration like 5m or 30s: {e}",
                        spec.pin.cache_ttl.value
                    ),
                )
            })?;
        let mut seen_hosts = std::collections::HashSet::new();
        let mut registries = spec.registries;
        for r in &mut registries {
            // Names never carry the legacy Docker Hub host; settings for it
            // must apply to `docker.io` names.
            r.host = reference::canonical_domain(&r.host).to_owned();
            reference::validate_domain(&r.host).map_err(|_| PolicyError::Invalid {
                line: None,
                message: format!("registries: host {:?} is not host[:port]", r.host),
            })?;
            if !seen_hosts.insert(r.host.clone()) {
                return Err(PolicyError::Invalid {
                    line: None,
                    message: format!("registries: host {:?} is listed twice", r.host),
                });
            }
            if let Some(a) = &r.auth {
                let basic = a.username.is_some() || a.password_file.is_some();
                if basic && a.docker_config.is_some() {
                    return Err(PolicyError::Invalid {
                        line: None,
                        message: format!(
                            "registries: {}: give either username/passwordFile or dockerConfig, not both",
                            r.host
                        ),
                    });
                }
                if a.username.is_some() != a.password_file.is_some() {
                    return Err(PolicyError::Invalid {
                        line: None,
                        message: format!(
                            "registries: {}: username and passwordFile go together",
                            r.host
                        ),
                    });
                }
            }
        }
        let mut rules = Vec::with_capacity(spec.rules.len());
        let mut names = std::collections::HashSet::new();
        for r in &spec.rules {
            if r.name.value.trim().is_empty() {
                return Err(invalid(&r.name, "rule name must not be empty"));
            }
            if !names.insert(r.name.value.clone()) {
                return Err(invalid(
                    &r.name,
                    format!("rule name {:?} is used twice", r.name.value),
                ));
            }
            if r.patterns.is_empty() {
                return Err(invalid(
                    &r.name,
                    format!("rule {:?} has an empty match list", r.name.value),
                ));
            }
            let mut patterns = Vec::with_capacity(r.patterns.len());
            for p in &r.patterns {
                patterns.push(
                    Pattern::parse(&p.value)
                        .map_err(|e: PatternError| invalid(p, e.to_string()))?,
                );
            }
            let action = r.action.unwrap_or_default();
            let has_verify = !r.verify.is_empty();
            if !has_verify
                && (r.threshold.is_some() || !r.required.is_empty() || r.signatures.is_some())
            {
                return Err(invalid(
                    &r.name,
                    format!(
                        "rule {:?}: threshold, required and signatures need a verify list",
                        r.name.value
                    ),
                ));
            }
            if has_verify && action != Action::Pin {
                return Err(invalid(
                    &r.name,
                    format!(
                        "rule {:?}: verify checks the pinned digest, so it needs action: pin (the default)",
                        r.name.value
                    ),
                ));
            }
            let verification = if has_verify {
                Some(Arc::new(
                    Verification::compile(
                        &r.name.value,
                        &r.verify,
                        r.threshold,
                        &r.required,
                        r.signatures.as_ref(),
                    )
                    .map_err(|m| invalid(&r.name, m))?,
                ))
            } else {
                None
            };
            rules.push(Rule {
                name: r.name.value.clone(),
                patterns,
                mode: r.mode.unwrap_or(Mode::Enforce),
                action,
                description: r.description.clone(),
                verification,
            });
        }
        // Ties: two rules whose equally specific patterns can match one name.
        for (ri, a) in rules.iter().enumerate() {
            for b in rules.iter().skip(ri + 1) {
                for (pi, pa) in a.patterns.iter().enumerate() {
                    for pb in &b.patterns {
                        if pa.specificity() == pb.specificity() && pa.overlaps(pb) {
                            return Err(invalid(
                                &spec.rules[ri].patterns[pi],
                                format!(
                                    "rules {:?} ({}) and {:?} ({}) are equally specific and can match the same image; make one more specific",
                                    a.name,
                                    pa.normalized(),
                                    b.name,
                                    pb.normalized()
                                ),
                            ));
                        }
                    }
                }
            }
        }
        let mut order: Vec<(usize, usize)> = rules
            .iter()
            .enumerate()
            .flat_map(|(ri, r)| (0..r.patterns.len()).map(move |pi| (ri, pi)))
            .collect();
        order.sort_by(|&(ra, pa), &(rb, pb)| {
            rules[rb].patterns[pb]
                .specificity()
                .cmp(&rules[ra].patterns[pa].specificity())
        });
        Ok(Policy {
            name: doc.metadata.name,
            mirrors,
            registries,
            scope: spec.pin.scope,
            platform,
            cache_ttl,
            rules,
            order,
            exempt_namespaces: spec.exempt_namespaces,
        })
    }

    /// Whether requests in this namespace pass untouched.
    pub fn is_exempt(&self, namespace: &str) -> bool {
        self.exempt_namespaces.iter().any(|n| n == namespace)
    }

    /// The rule governing a normalized origin name, if any.
    pub fn rule_for(&self, origin: &Reference) -> Option<&Rule> {
        self.order
            .iter()
            .find(|&&(ri, pi)| self.rules[ri].patterns[pi].matches(origin))
            .map(|&(ri, _)| &self.rules[ri])
    }

    /// Maps a mirrored name back to its origin (longest `to` wins). Names not
    /// under any mirror are their own origin.
    pub fn origin_of(&self, r: &Reference) -> Reference {
        let name = r.name();
        let best = self
            .mirrors
            .iter()
            .filter(|m| under(&name, &m.to))
            .max_by_key(|m| m.to.len());
        match best {
            Some(m) => swap_prefix(r, &name, &m.to, &m.from).unwrap_or_else(|| r.clone()),
            None => r.clone(),
        }
    }

    /// Maps an origin name to where it is pulled from (longest `from` wins).
    pub fn mirror_of(&self, origin: &Reference) -> Reference {
        let name = origin.name();
        // `mirrors` is sorted longest `from` first.
        match self.mirrors.iter().find(|m| under(&name, &m.from)) {
            Some(m) => swap_prefix(origin, &name, &m.from, &m.to).unwrap_or_else(|| origin.clone()),
            None => origin.clone(),
        }
    }

    /// Decides what must happen to one image string. Pure and idempotent:
    /// planning the output of a previous plan yields `Step::Keep` with the same target.
    pub fn plan(&self, written: &str) -> Result<Plan, Denial> {
        let reference =
            Reference::parse(written.trim()).map_err(|e| Denial::InvalidReference { error: e })?;
        let origin = self.origin_of(&reference);
        let rule = self.rule_for(&origin).ok_or(Denial::NoRule)?;
        let target = self.mirror_of(&origin);
        let step = match rule.action {
            Action::Deny => Step::Deny,
            Action::Allow => Step::Keep,
            Action::Pin if target.digest().is_some() => Step::Keep,
            Action::Pin => Step::Resolve,
        };
        Ok(Plan {
            written: written.to_owned(),
            reference,
            origin,
            target,
            rule: rule.name.clone(),
            mode: rule.mode,
            step,
            verify: rule.verification.clone(),
        })
    }
}

impl Plan {
    /// Whether the mirror stage changed where the image comes from.
    pub fn rewritten(&self) -> bool {
        self.target.domain() != self.reference.domain()
            || self.target.path() != self.reference.path()
    }

    /// The image string to write back, given the digest resolved (if any).
    /// Keeps the user's spelling when only a digest is added.
    pub fn final_image(&self, digest: Option<&reference::Digest>) -> String {
        match digest {
            Some(d) if self.rewritten() => self.target.pinned(d.clone()).to_string(),
            Some(d) => {
                let w = self.written.trim();
                let base = match w.split_once('@') {
                    Some((b, _)) => b,
                    None => w,
                };
                let has_tag = base
                    .rsplit('/')
                    .next()
                    .is_some_and(|last| last.contains(':'));
                if has_tag {
                    format!("{base}@{d}")
                } else {
                    format!("{base}:latest@{d}")
                }
            }
            None if self.rewritten() => self.target.to_string(),
            None => self.written.clone(),
        }
    }
}

/// `name` is `prefix` or lies below it on a segment boundary.
fn under(name: &str, prefix: &str) -> bool {
    name.strip_prefix(prefix)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
}

fn swap_prefix(r: &Reference, name: &str, from: &str, to: &str) -> Option<Reference> {
    let new_name = format!("{to}{}", &name[from.len()..]);
    Reference::from_parts(&new_name, r.tag(), r.digest().cloned()).ok()
}

fn compile_mirrors(specs: &[MirrorSpec]) -> Result<Vec<Mirror>, PolicyError> {
    let mut out: Vec<Mirror> = Vec::with_capacity(specs.len());
    for m in specs {
        let from = normalize_prefix(&m.from.value)
            .map_err(|e| invalid(&m.from, format!("mirror from {:?}: {e}", m.from.value)))?;
        let to = normalize_prefix(&m.to.value)
            .map_err(|e| invalid(&m.to, format!("mirror to {:?}: {e}", m.to.value)))?;
        if out.iter().any(|o| o.from == from) {
            return Err(invalid(
                &m.from,
                format!("mirror from {from:?} is listed twice"),
            ));
        }
        if out.iter().any(|o| o.to == to) {
            return Err(invalid(
                &m.to,
                format!(
                    "mirror to {to:?} is used by two mirrors, so a mirrored name could not be mapped back to one origin"
                ),
            ));
        }
        out.push(Mirror { from, to });
    }
    for a in &out {
        if let Some(b) = out.iter().find(|b| under(&a.to, &b.from)) {
            let at = specs
                .iter()
                .find(|s| normalize_prefix(&s.to.value).ok().as_deref() == Some(a.to.as_str()))
                .map(|s| &s.to);
            let msg = format!(
                "mirror target {:?} lies under mirror origin {:?}; chained mirrors are not supported",
                a.to, b.from
            );
            return Err(match at {
                Some(s) => invalid(s, msg),
                None => PolicyError::Invalid {
                    line: None,
                    message: msg,
                },
            });
        }
    }
    out.sort_by_key(|m| std::cmp::Reverse(m.from.len()));
    Ok(out)
}

/// A mirror prefix is a host or host/path, validated with the reference grammar.
fn normalize_prefix(p: &str) -> Result<String, String> {
    let p = p.trim().trim_end_matches('/');
    let (host, path) = match p.split_once('/') {
        Some((h, rest)) => (h, Some(rest)),
        None => (p, None),
    };
    let host = reference::canonical_domain(host);
    reference::validate_domain(host).map_err(|e| e.to_string())?;
    if !host.contains(['.', ':']) && host != "localhost" {
        return Err(
            "the first segment must be a registry host (with a dot or a port, or localhost)".into(),
        );
    }
    if let Some(path) = path {
        if let Some(bad) = path.split('/').find(|c| !reference::is_path_component(c)) {
            return Err(format!("invalid path component {bad:?}"));
        }
        return Ok(format!("{host}/{path}"));
    }
    Ok(host.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The issue's example, verbatim: it must load and mean exactly this.
    const VERIFY_EXAMPLE: &str = r#"apiVersion: sigil.dev/v1alpha1
kind: ImagePolicy
metadata: {name: verify}
spec:
  rules:
    - name: team
      match: ["registry.example.com/team/**"]
      mode: enforce
      verify:
        - name: alice
          cosign: {key: /etc/sigil/alice.pub}      # PEM file or inline PEM: ECDSA P-256/P-384, Ed25519, RSA
        - name: bob
          cosign: {key: /etc/sigil/bob.pub}
        - name: ci
          cosign:
            keyless:
              issuer: https://token.actions.githubusercontent.com
              subjectRegex: ^https://github\.com/acme/.+$
            trustedRoot: /etc/sigil/trusted_root.json   # optional; default: Sigstore public-good root, embedded
            transparencyLog: required                   # required | optional
        - name: release
          notation:
            trustRoots: [/etc/sigil/notation-ca.pem]
            level: strict                               # strict | permissive | audit
      threshold: 2          # at least this many of the verifiers above must pass; default: all of them
      required: [alice]     # these must be among those that pass
      signatures:
        repository: registry.example.com/team/signatures   # optional; default: the repository the image is pulled from
"#;

    #[test]
    fn issue_verify_example_loads_with_its_meaning() {
        use crate::verify::{NotationLevel, TlogPolicy};
        let p = Policy::from_yaml(VERIFY_EXAMPLE).unwrap();
        let plan = p.plan("registry.example.com/team/app:v1").unwrap();
        assert_eq!(plan.step, Step::Resolve);
        let v = plan.verify.expect("rule verifies");
        assert_eq!(v.threshold, 2);
        assert_eq!(v.required, vec!["alice"]);
        assert_eq!(
            v.signatures_repository.as_deref(),
            Some("registry.example.com/team/signatures")
        );
        let names: Vec<&str> = v.verifiers.iter().map(|x| x.name.as_str()).collect();
        assert_eq!(names, ["alice", "bob", "ci", "release"]);
        let alice = v.verifiers[0].cosign.as_ref().unwrap();
        assert_eq!(alice.key.as_deref(), Some("/etc/sigil/alice.pub"));
        let ci = v.verifiers[2].cosign.as_ref().unwrap();
        let kl = ci.keyless.as_ref().unwrap();
        assert_eq!(
            kl.issuer.as_deref(),
            Some("https://token.actions.githubusercontent.com")
        );
        assert_eq!(
            kl.subject_regex.as_deref(),
            Some("^https://github\\.com/acme/.+$")
        );
        assert_eq!(
            ci.trusted_root.as_deref(),
            Some("/etc/sigil/trusted_root.json")
        );
        assert_eq!(ci.transparency_log, Some(TlogPolicy::Required));
        let n = v.verifiers[3].notation.as_ref().unwrap();
        assert_eq!(n.trust_roots, vec!["/etc/sigil/notation-ca.pem"]);
        assert_eq!(n.level, NotationLevel::Strict);
        // Images outside the rule do not verify.
        assert!(p.plan("registry.example.com/other/app:v1").is_err());
    }

    #[test]
    fn verify_settings_that_cannot_work_are_refused_with_the_line() {
        let base = |rule: &str| {
            format!("apiVersion: sigil.dev/v1alpha1\nkind: ImagePolicy\nspec:\n  rules:\n{rule}")
        };
        let cases = [
            (
                "    - name: a\n      match: [\"**\"]\n      action: allow\n      verify:\n        - {name: k, cosign: {key: k.pub}}\n",
                "needs action: pin",
            ),
            (
                "    - name: a\n      match: [\"**\"]\n      threshold: 1\n",
                "need a verify list",
            ),
            (
                "    - name: a\n      match: [\"**\"]\n      verify:\n        - {name: k, cosign: {key: k.pub}}\n      threshold: 2\n",
                "exceeds",
            ),
            (
                "    - name: a\n      match: [\"**\"]\n      verify:\n        - {name: k, cosign: {keyless: {issuer: x, subjectRegex: \"(\"}}}\n",
                "subjectRegex",
            ),
            (
                "    - name: a\n      match: [\"**\"]\n      verify:\n        - {name: k, cosign: {key: k.pub}, notation: {trustRoots: [r.pem]}}\n",
                "exactly one of cosign or notation",
            ),
            (
                "    - name: a\n      match: [\"**\"]\n      verify:\n        - {name: k, cosign: {key: k.pub, unknown: 1}}\n",
                "unknown",
            ),
        ];
        for (rule, want) in cases {
            let e = Policy::from_yaml(&base(rule)).unwrap_err().to_string();
            assert!(e.contains(want), "{want:?} not in {e:?}");
        }
    }

    /// The example from the core issue; it must load and mean exactly this.
    pub(crate) const ISSUE_EXAMPLE: &str = r#"apiVersion: sigil.dev/v1alpha1
kind: ImagePolicy
metadata: {name: default}
spec:
  mirrors:                      # rewrite stage, applied first; longest matching `from` wins
    - from: docker.io           # origin prefix on the normalized name: a host, or host/path
      to: mirror.internal:5000/dockerhub
  registries:                   # how to talk to each registry host
    - host: mirror.internal:5000
      insecure: true            # plain HTTP allowed for this host only (explicit opt-in)
      ca: /etc/sigil/mirror-ca.pem           # optional extra CA (PEM file or inline PEM)
      auth: {username: robot, passwordFile: /var/run/sigil/pw}   # or dockerConfig: FILE
  pin:
    scope: workloads            # workloads: patch every kind listed below; pods: patch only Pods
    platform: ""                # "" pins the index digest; e.g. linux/amd64 pins that platform's manifest
    cacheTTL: 5m
  rules:                        # matched on the ORIGIN name; the most specific match wins
    - name: team
      match: ["registry.example.com/team/**"]
      mode: enforce             # enforce | warn
    - name: blocked
      match: ["docker.io/library/busybox"]
      action: deny              # static deny; `action: allow` admits without pinning
    - name: everything-else
      match: ["**"]
      mode: warn
  exemptNamespaces: [kube-system]
"#;

    #[test]
    fn issue_example_loads_and_means_what_it_says() {
        let p = Policy::from_yaml(ISSUE_EXAMPLE).unwrap();
        assert_eq!(p.name, "default");
        assert_eq!(p.cache_ttl, Duration::from_secs(300));
        assert_eq!(p.scope, Scope::Workloads);
        assert_eq!(p.platform, None);
        assert!(p.is_exempt("kube-system"));
        assert_eq!(
            p.registries[0]
                .auth
                .as_ref()
                .unwrap()
                .password_file
                .as_deref(),
            Some("/var/run/sigil/pw")
        );
        assert!(p.registries[0].insecure);

        let plan = p.plan("nginx:1.25").unwrap();
        assert_eq!(plan.origin.to_string(), "docker.io/library/nginx:1.25");
        assert_eq!(
            plan.target.to_string(),
            "mirror.internal:5000/dockerhub/library/nginx:1.25"
        );
        assert_eq!(plan.rule, "everything-else");
        assert_eq!(plan.mode, Mode::Warn);
        assert_eq!(plan.step, Step::Resolve);

        let plan = p.plan("registry.example.com/team/app/api:v1").unwrap();
        assert_eq!(plan.rule, "team");
        assert_eq!(plan.mode, Mode::Enforce);
        assert!(!plan.rewritten());

        let plan = p.plan("busybox").unwrap();
        assert_eq!(plan.rule, "blocked");
        assert_eq!(plan.step, Step::Deny);
        // The mirrored spelling of busybox is still busybox.
        let plan = p
            .plan("mirror.internal:5000/dockerhub/library/busybox:1")
            .unwrap();
        assert_eq!(plan.rule, "blocked");
    }

    #[test]
    fn embedded_default_loads() {
        let p = Policy::embedded_default();
        assert_eq!(p.plan("anything/at:all").unwrap().mode, Mode::Warn);
        assert!(p.is_exempt("kube-system"));
    }

    #[test]
    fn second_pass_is_a_no_op() {
        let p = Policy::from_yaml(ISSUE_EXAMPLE).unwrap();
        let d = reference::Digest::parse(
            "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
        )
        .unwrap();
        for img in [
            "nginx",
            "nginx:1.25",
            "docker.io/bitnami/redis:7",
            "registry.example.com/team/x:1",
            "quay.io/a/b",
        ] {
            let first = p.plan(img).unwrap();
            let out = first.final_image(Some(&d));
            let second = p.plan(&out).unwrap();
            assert_eq!(second.step, Step::Keep, "{img} -> {out}");
            assert_eq!(second.final_image(None), out, "{img}");
            assert_eq!(second.rule, first.rule);
        }
    }

    #[test]
    fn final_image_keeps_spelling() {
        let p = Policy::embedded_default();
        let d = reference::Digest::parse(
            "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
        )
        .unwrap();
        assert_eq!(
            p.plan("nginx:1").unwrap().final_image(Some(&d)),
            format!("nginx:1@{d}")
        );
        assert_eq!(
            p.plan("nginx").unwrap().final_image(Some(&d)),
            format!("nginx:latest@{d}")
        );
        assert_eq!(
            p.plan("localhost:5000/x").unwrap().final_image(Some(&d)),
            format!("localhost:5000/x:latest@{d}")
        );
    }

    #[test]
    fn longest_mirror_wins_both_ways() {
        let y = r#"apiVersion: sigil.dev/v1alpha1
kind: ImagePolicy
spec:
  mirrors:
    - {from: docker.io, to: m.local/hub}
    - {from: docker.io/library, to: m.local/official}
  rules: [{name: all, match: ["**"]}]
"#;
        let p = Policy::from_yaml(y).unwrap();
        assert_eq!(
            p.plan("nginx").unwrap().target.to_string(),
            "m.local/official/nginx"
        );
        assert_eq!(
            p.plan("bitnami/redis").unwrap().target.to_string(),
            "m.local/hub/bitnami/redis"
        );
        assert_eq!(
            p.plan("m.local/official/nginx").unwrap().origin.to_string(),
            "docker.io/library/nginx"
        );
    }

    fn err(y: &str) -> String {
        Policy::from_yaml(y).unwrap_err().to_string()
    }

    #[test]
    fn errors_name_the_line() {
        let head = "apiVersion: sigil.dev/v1alpha1\nkind: ImagePolicy\nspec:\n  rules:\n";
        let e = err(&format!(
            "{head}    - name: a\n      match: [\"a.com/X\"]\n"
        ));
        assert!(e.starts_with("line 6:"), "{e}");
        let e = err(&format!(
            "{head}    - name: a\n      match: [\"a.com/**\"]\n    - name: b\n      match: [\"a.com/**\"]\n"
        ));
        assert!(e.contains("equally specific"), "{e}");
        let e = err(&format!(
            "{head}    - name: a\n      match: [\"**\"]\n      mood: warn\n"
        ));
        assert!(e.contains("mood"), "{e}");
        let e = err("apiVersion: sigil.dev/v1\nkind: ImagePolicy\nspec: {}\n");
        assert!(e.starts_with("line 1:"), "{e}");
        let e = err(
            "apiVersion: sigil.dev/v1alpha1\nkind: ImagePolicy\nspec:\n  pin:\n    cacheTTL: soon\n",
        );
        assert!(e.starts_with("line 5:"), "{e}");
        let e = err(
            "apiVersion: sigil.dev/v1alpha1\nkind: ImagePolicy\nspec:\n  mirrors:\n    - {from: docker.io, to: m.io/a}\n    - {from: quay.io, to: m.io/a}\n",
        );
        assert!(e.contains("line 6") && e.contains("mapped back"), "{e}");
    }

    #[test]
    fn docker_hub_registry_settings_apply_to_docker_io_names() {
        let p = Policy::from_yaml("apiVersion: sigil.dev/v1alpha1\nkind: ImagePolicy\nspec:\n  registries: [{host: index.docker.io, auth: {dockerConfig: /x}}]\n").unwrap();
        assert_eq!(p.registries[0].host, "docker.io");
    }

    /// A deny written for `docker.io` names cannot be side-stepped by
    /// spelling Docker Hub another way, in the image or in the rule.
    #[test]
    fn docker_hub_aliases_cannot_bypass_a_deny() {
        let p = Policy::from_yaml("apiVersion: sigil.dev/v1alpha1\nkind: ImagePolicy\nspec:\n  rules:\n  - {name: all, match: [\"**\"]}\n  - {name: bad, match: [\"registry.hub.docker.com/library/bad\"], action: deny}\n").unwrap();
        for img in [
            "bad:1",
            "docker.io/library/bad:1",
            "index.docker.io/library/bad:1",
            "registry-1.docker.io/library/bad:1",
            "registry.hub.docker.com/bad:1",
        ] {
            assert_eq!(p.plan(img).unwrap().step, Step::Deny, "{img}");
        }
    }

    #[test]
    fn no_rule_is_a_denial() {
        let p = Policy::from_yaml("apiVersion: sigil.dev/v1alpha1\nkind: ImagePolicy\nspec:\n  rules: [{name: a, match: [\"a.com/**\"]}]\n").unwrap();
        assert_eq!(p.plan("nginx").unwrap_err(), Denial::NoRule);
        assert!(matches!(
            p.plan("NGINX").unwrap_err(),
            Denial::InvalidReference { .. }
        ));
    }
}
