//! The `ImagePolicy`: what a policy *means*.
//!
//! Owns the compiled policy ([`Policy`], [`Rule`], [`Mirror`]) and the
//! per-image [`Plan`]; the document as written lives in [`schema`], turning
//! it into a policy (with line-numbered errors) in `compile`, mirror
//! rewrites and rule matching in `plan`, and the plain-words rendering
//! `sigil policy check` prints in `describe`. It reads no files and talks
//! to no registry: paths in the policy (CA files, password files) are handed
//! to the I/O crates as written.

mod compile;
mod describe;
mod documents;
mod memo;
pub mod namespaced;
mod plan;
pub use plan::RuleRef;
mod requirements;
pub mod schema;

pub use namespaced::{DefaultAction, NamespacePolicy, TeamVerdict};

pub use schema::{
    Action, AuthSpec, ImagePolicyDoc, Metadata, MirrorSpec, PinSpec, RegistrySpec, RuleSpec, Scope,
    Spec,
};

use std::time::Duration;

use std::sync::Arc;

use serde_saphyr::Spanned;

use crate::denial::Mode;
use crate::pattern::Pattern;
use crate::reference::Reference;
use crate::verify::Verification;

/// The only `apiVersion` this build understands (every sigil kind's).
pub const API_VERSION: &str = crate::exception::API_VERSION;
/// The policy's `kind`: cluster-wide in a file without a namespace (as it
/// always was), a team's tighten-only policy with `metadata.namespace`.
pub const KIND: &str = "ImagePolicy";
/// The platform's cluster-wide policy kind.
pub const CLUSTER_KIND: &str = "ClusterImagePolicy";

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

impl From<crate::exception::ExceptionError> for PolicyError {
    fn from(e: crate::exception::ExceptionError) -> PolicyError {
        match e {
            crate::exception::ExceptionError::Syntax(m) => PolicyError::Syntax(m),
            crate::exception::ExceptionError::Invalid(message) => PolicyError::Invalid {
                line: None,
                message,
            },
        }
    }
}

fn fmt_line(line: Option<u64>) -> String {
    line.map(|l| format!("line {l}: ")).unwrap_or_default()
}

pub(crate) fn invalid<T>(at: &Spanned<T>, message: impl Into<String>) -> PolicyError {
    let l = at.referenced.line();
    PolicyError::Invalid {
        line: (l > 0).then_some(l),
        message: message.into(),
    }
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

/// A compiled mirror. What lies beyond its first mirror (further mirrors,
/// fallback, digest check, copy) is held once, in its [`Failover`], which
/// every plan under it shares; the accessors read through it.
#[derive(Debug, Clone)]
pub struct Mirror {
    /// Origin prefix (normalized).
    pub from: String,
    /// The first mirror prefix: where images are pulled from when it has them.
    pub to: String,
    /// What its images fail over to (`None`: nothing beyond the one mirror
    /// is tried).
    pub failover: Option<Arc<Failover>>,
}

impl Mirror {
    /// Every mirror prefix, in the order they are tried.
    pub fn targets(&self) -> impl Iterator<Item = &str> {
        std::iter::once(self.to.as_str()).chain(self.alternates().iter().map(String::as_str))
    }

    /// Further mirror prefixes, tried in order when the first lacks the
    /// image or fails.
    pub fn alternates(&self) -> &[String] {
        self.failover.as_deref().map_or(&[], |f| &f.alternates)
    }

    /// Pin at the origin when no mirror has the image (`fallback: origin`).
    pub fn fallback_origin(&self) -> bool {
        self.failover.as_deref().is_some_and(|f| f.fallback)
    }

    /// A mirror whose digest for a tag differs from the origin's is refused.
    pub fn require_same_digest(&self) -> bool {
        self.failover
            .as_deref()
            .is_some_and(|f| f.require_same_digest)
    }

    /// An image the first mirror lacks is copied into it from the origin.
    pub fn copy(&self) -> bool {
        self.failover.as_deref().is_some_and(|f| f.copy)
    }
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
    /// Namespaces the rule applies to (all when `None`).
    pub namespace_selector: Option<Selector>,
    /// The policy object that states it (`ClusterImagePolicy base`), for
    /// denials; `None` for a policy file's classic single document.
    pub source: Option<String>,
    /// The longest `ImagePolicyException` it accepts (`None`: none).
    pub exceptions: Option<Duration>,
}

/// Namespace labels, as a selector reads them.
pub type Labels = std::collections::BTreeMap<String, String>;

/// A compiled label selector.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Selector {
    /// `matchLabels`.
    pub labels: Vec<(String, String)>,
    /// (key, operator, values) with operator one of `In`, `NotIn`, `Exists`, `DoesNotExist`.
    pub expressions: Vec<(String, String, Vec<String>)>,
}

impl Selector {
    /// Compiles a selector, refusing operators Kubernetes does not define.
    pub fn compile(s: &schema::SelectorSpec) -> Result<Selector, String> {
        for e in &s.match_expressions {
            match (e.operator.as_str(), e.values.is_empty()) {
                ("In" | "NotIn", false) | ("Exists" | "DoesNotExist", true) => {}
                ("In" | "NotIn", true) => {
                    return Err(format!(
                        "namespaceSelector: {} {} needs values",
                        e.key, e.operator
                    ));
                }
                ("Exists" | "DoesNotExist", false) => {
                    return Err(format!(
                        "namespaceSelector: {} {} takes no values",
                        e.key, e.operator
                    ));
                }
                (op, _) => {
                    return Err(format!(
                        "namespaceSelector: operator {op:?} is not In, NotIn, Exists or DoesNotExist"
                    ));
                }
            }
        }
        Ok(Selector {
            labels: s.match_labels.clone().into_iter().collect(),
            expressions: s
                .match_expressions
                .iter()
                .map(|e| (e.key.clone(), e.operator.clone(), e.values.clone()))
                .collect(),
        })
    }

    /// Whether a namespace with `labels` is selected.
    pub fn matches(&self, labels: &Labels) -> bool {
        self.labels.iter().all(|(k, v)| labels.get(k) == Some(v))
            && self.expressions.iter().all(|(k, op, values)| {
                let got = labels.get(k);
                match op.as_str() {
                    "In" => got.is_some_and(|g| values.contains(g)),
                    "NotIn" => got.is_none_or(|g| !values.contains(g)),
                    "Exists" => got.is_some(),
                    _ => got.is_none(),
                }
            })
    }
}

/// The labels a namespace is known to have when its object is not at hand:
/// `kubernetes.io/metadata.name`, which the API server sets on every namespace.
pub fn default_labels(namespace: &str) -> Labels {
    Labels::from([(
        "kubernetes.io/metadata.name".to_owned(),
        namespace.to_owned(),
    )])
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
    /// Positions in `order` by the pattern's literal prefix, so an image is
    /// matched only against patterns whose literal start it shares.
    index: std::collections::HashMap<String, Vec<usize>>,
    /// Namespaces that pass untouched.
    pub exempt_namespaces: Vec<String>,
    /// Images a node admits at pull without a check (`nodeAdmits`): the
    /// sandbox image, CNI's, kube-proxy's, static Pods'. A node has no
    /// namespace, so `exemptNamespaces` cannot say this for it.
    pub node_admits: Vec<Pattern>,
    /// Image fields in custom resources: the defaults and the policy's.
    pub extractors: Arc<crate::walker::Extractors>,
    /// Teams' namespaced ImagePolicies, by namespace (tighten only).
    pub namespaced: std::collections::BTreeMap<String, Vec<Arc<NamespacePolicy>>>,
    /// Accepted `ImagePolicyException`s, by namespace (expired ones too:
    /// expiry is checked at each decision).
    pub exceptions: std::collections::BTreeMap<String, Vec<Arc<crate::exception::Exception>>>,
    /// The plans made under this policy, by image string (see
    /// [`Policy::plan_shared`]).
    plans: memo::PlanMemo,
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
    /// Name of the rule that applied (shared: every signature check and
    /// verdict of the image names it).
    pub rule: Arc<str>,
    /// Failure handling of that rule.
    pub mode: Mode,
    /// Next step.
    pub step: Step,
    /// Signatures the pinned digest must carry, if the rule verifies.
    pub verify: Option<Arc<Verification>>,
    /// The policy object the rule comes from, if named.
    pub source: Option<String>,
    /// Other mirrors and the origin, when the mirror fails over.
    pub failover: Option<Arc<Failover>>,
    /// Set when no mirror had the image and it was resolved at the origin
    /// instead (for the warning, the audit annotation and the metric).
    pub fallback: Option<Arc<FellBack>>,
}

/// What a mirror's images fall back on (see [`Policy::plan_in`]): made once
/// per mirror when the policy is compiled, shared by every plan under it;
/// the images themselves are derived from a plan's origin only when a
/// lookup needs them (a cached lookup of the first mirror never does).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failover {
    /// The mirror's origin prefix (`sigil_mirror_fallbacks_total{from}`).
    pub from: String,
    /// The further mirrors' prefixes, in the order tried.
    pub alternates: Vec<String>,
    /// Pin at the origin when no mirror has the image.
    pub fallback: bool,
    /// Refuse a mirror whose digest differs from the origin's.
    pub require_same_digest: bool,
    /// Copy the image from the origin into the first mirror when it lacks it.
    pub copy: bool,
}

impl Failover {
    /// The image (whose origin is `origin`) under each further mirror, in
    /// the order tried.
    pub fn alternates_of<'a>(
        &'a self,
        origin: &'a Reference,
    ) -> impl Iterator<Item = Reference> + 'a {
        self.alternates
            .iter()
            .filter_map(move |to| origin.with_prefix(self.from.len(), to))
    }

    /// Whether the image's origin is resolved too: to fall back on, to
    /// compare digests with, or to copy from.
    pub fn resolves_origin(&self) -> bool {
        self.fallback || self.require_same_digest || self.copy
    }
}

/// An image no mirror could serve, resolved at its origin instead.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FellBack {
    /// The mirror's origin prefix.
    pub from: String,
    /// What each mirror answered.
    pub why: String,
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
    /// The same policy with every signature requirement dropped
    /// (`sigil audit --no-verify`: rules, mirrors and pinning only).
    pub fn without_verification(mut self) -> Policy {
        for r in &mut self.rules {
            r.verification = None;
        }
        // Plans made before name the verifications just dropped.
        self.plans = memo::PlanMemo::default();
        self
    }

    /// Loads the embedded default policy.
    pub fn embedded_default() -> Policy {
        // The embedded text is covered by a unit test; failing here is a build bug.
        Policy::from_yaml(DEFAULT_POLICY_YAML)
            .unwrap_or_else(|e| panic!("embedded default policy is invalid: {e}"))
    }

    /// Parses and validates a policy document.
    pub fn from_yaml(text: &str) -> Result<Policy, PolicyError> {
        let doc: ImagePolicyDoc =
            serde_saphyr::from_str_with_options(text, crate::yaml::options(text))
                .map_err(|e| PolicyError::Syntax(e.to_string()))?;
        Policy::compile(doc)
    }

    /// Validates a policy that was already deserialized (e.g. from a KRM functionConfig).
    pub fn from_json_value(v: serde_json::Value) -> Result<Policy, PolicyError> {
        let doc: ImagePolicyDoc =
            serde_json::from_value(v).map_err(|e| PolicyError::Syntax(e.to_string()))?;
        Policy::compile(doc)
    }

    /// Every signature requirement in force, with the rule that states it:
    /// the cluster's rules and every namespace ImagePolicy's.
    pub fn verifications(&self) -> Vec<(String, &Arc<Verification>)> {
        let cluster = self
            .rules
            .iter()
            .filter_map(|r| r.verification.as_ref().map(|v| (r.name.clone(), v)));
        let teams = self.namespaced.values().flatten().flat_map(|t| {
            t.rules.iter().filter_map(move |r| {
                r.verification
                    .as_ref()
                    .map(|v| (format!("{}, rule {}", t.display_name(), r.name), v))
            })
        });
        cluster.chain(teams).collect()
    }

    /// Every (rule, pattern), most specific first: the order an image is
    /// matched in (the first that matches decides).
    pub fn patterns_in_order(&self) -> impl Iterator<Item = (&Rule, &Pattern)> {
        self.order
            .iter()
            .map(|&(ri, pi)| (&self.rules[ri], &self.rules[ri].patterns[pi]))
    }

    /// Whether any rule is limited to some namespaces (then a decision needs
    /// the namespace's labels).
    pub fn has_namespace_selectors(&self) -> bool {
        self.rules.iter().any(|r| r.namespace_selector.is_some())
    }

    /// Whether requests in this namespace pass untouched.
    pub fn is_exempt(&self, namespace: &str) -> bool {
        self.exempt_namespaces.iter().any(|n| n == namespace)
    }

    /// The `nodeAdmits` pattern a node admits `image` by at pull, if any
    /// (matched on the normalized name, as rules are).
    pub fn node_admits(&self, image: &Reference) -> Option<&Pattern> {
        self.node_admits.iter().find(|p| p.matches(image))
    }
}

#[cfg(test)]
mod failover_tests;
#[cfg(test)]
mod tests;
