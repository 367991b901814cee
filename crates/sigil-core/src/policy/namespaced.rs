//! Namespaced `ImagePolicy`: a team's rules for its own namespace, which may
//! only tighten what the cluster policy admits.
//!
//! Owns the namespaced document (rules with `allow` or `deny`, optional
//! `verify` on allowed images, `defaultAction: deny` for an allow-list, a
//! `mode`), refusing every field that could loosen the platform's rules
//! (mirrors, registries, pinning, exemptions) with a message that says so,
//! and matching an image against it. The verdict is combined with the
//! cluster's by AND in `object`: a team policy can refuse what the cluster
//! admits, never admit what the cluster refuses.

use std::sync::Arc;

use serde::Deserialize;
use serde_saphyr::Spanned;

use super::{API_VERSION, KIND, PolicyError, RuleSpec, invalid};
use crate::denial::Mode;
use crate::pattern::Pattern;
use crate::reference::Reference;
use crate::verify::Verification;

/// Fields a namespaced ImagePolicy may not set, and why.
const PLATFORM_ONLY: &[(&str, &str)] = &[
    ("mirrors", "mirrors redirect every namespace's pulls"),
    (
        "registries",
        "registry settings and credentials are the platform's",
    ),
    ("pin", "pinning scope and platform are the platform's"),
    ("exemptNamespaces", "exemptions switch the policy off"),
    (
        "nodeAdmits",
        "what every node admits unchecked is the platform's",
    ),
];

/// What an image no rule of the policy matches gets.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DefaultAction {
    /// Left to the cluster policy (the default).
    #[default]
    Allow,
    /// Refused: the policy is an allow-list.
    Deny,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct NamespacedSpec {
    #[serde(default)]
    mode: Option<Mode>,
    #[serde(default)]
    default_action: DefaultAction,
    #[serde(default)]
    rules: Vec<RuleSpec>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Doc {
    api_version: Spanned<String>,
    kind: Spanned<String>,
    metadata: Meta,
    spec: serde_json::Value,
}

#[derive(Deserialize)]
struct Meta {
    name: String,
    namespace: String,
}

/// One rule of a namespaced policy.
#[derive(Debug, Clone)]
pub struct TeamRule {
    /// Rule name.
    pub name: String,
    /// Patterns on the origin name.
    pub patterns: Vec<Pattern>,
    /// Refuse matching images (else admit them, subject to `verification`).
    pub deny: bool,
    /// The team's own signature requirement on the digest that will run.
    pub verification: Option<Arc<Verification>>,
    /// The longest `ImagePolicyException` it accepts (`None`: none).
    pub exceptions: Option<std::time::Duration>,
}

/// A namespaced ImagePolicy, compiled.
#[derive(Debug, Clone)]
pub struct NamespacePolicy {
    /// Its namespace: it applies to objects there only.
    pub namespace: String,
    /// `metadata.name`.
    pub name: String,
    /// How its refusals count: `enforce` (default) also makes the cluster's
    /// warn-mode failures in this namespace block; `warn` only warns.
    pub mode: Mode,
    /// What images no rule matches get.
    pub default_action: DefaultAction,
    /// Rules, as written.
    pub rules: Vec<TeamRule>,
    /// (rule, pattern) most specific first.
    order: Vec<(usize, usize)>,
    /// [`Self::display_name`], made once: every image it judges names it.
    display: std::sync::Arc<str>,
}

/// What a namespaced policy says about one image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TeamVerdict {
    /// Nothing to add.
    Pass,
    /// A deny rule matched.
    Denied {
        /// The rule.
        rule: String,
    },
    /// No rule matched and the policy is an allow-list.
    NotAllowed,
    /// Admitted if this requirement holds on the digest that will run.
    Verify {
        /// The rule.
        rule: String,
        /// What it requires.
        verification: Arc<Verification>,
    },
}

impl NamespacePolicy {
    /// `ImagePolicy team-a/signed-only`, as messages name it.
    pub fn display_name(&self) -> String {
        self.display.to_string()
    }

    /// [`Self::display_name`], shared.
    pub fn display_shared(&self) -> std::sync::Arc<str> {
        self.display.clone()
    }

    /// Compiles one namespaced ImagePolicy document (already parsed).
    pub fn from_value(v: serde_json::Value) -> Result<NamespacePolicy, PolicyError> {
        let doc: Doc = serde_json::from_value(v).map_err(|e| PolicyError::Syntax(e.to_string()))?;
        NamespacePolicy::compile(doc)
    }

    /// Compiles one namespaced ImagePolicy from YAML.
    pub fn from_yaml(text: &str) -> Result<NamespacePolicy, PolicyError> {
        let doc: Doc = serde_saphyr::from_str_with_options(text, crate::yaml::options(text))
            .map_err(|e| PolicyError::Syntax(e.to_string()))?;
        NamespacePolicy::compile(doc)
    }

    fn compile(doc: Doc) -> Result<NamespacePolicy, PolicyError> {
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
        let who = format!(
            "ImagePolicy {}/{}",
            doc.metadata.namespace, doc.metadata.name
        );
        for (field, why) in PLATFORM_ONLY {
            if doc.spec.get(field).is_some() {
                return Err(PolicyError::Invalid {
                    line: None,
                    message: format!(
                        "{who}: spec.{field} is not allowed in a namespaced ImagePolicy ({why}); a namespaced policy may only tighten: set it in a ClusterImagePolicy"
                    ),
                });
            }
        }
        let mut spec: NamespacedSpec = serde_json::from_value(doc.spec)
            .map_err(|e| PolicyError::Syntax(format!("{who}: spec: {e}")))?;
        // A team's keyRefs read its own namespace, whatever they say.
        for r in &mut spec.rules {
            let inline = r.attestations.iter_mut().flat_map(|a| {
                a.attestors.iter_mut().filter_map(|x| match x {
                    super::schema::AttestorSpec::Inline(v) => Some(v.as_mut()),
                    super::schema::AttestorSpec::Name(_) => None,
                })
            });
            for v in r.verify.iter_mut().chain(inline) {
                crate::verify::keyref::confine(v, &doc.metadata.namespace).map_err(|e| {
                    PolicyError::Invalid {
                        line: None,
                        message: format!("{who}: rule {:?}: {e}", r.name.value),
                    }
                })?;
                // Files on sigil's filesystem are the platform's: a team that
                // could name one could make every replica read /dev/zero, or
                // learn which files exist there from the error.
                if let Some((field, _)) = v.files().first() {
                    return Err(PolicyError::Invalid {
                        line: None,
                        message: format!(
                            "{who}: rule {:?}: verifier {:?}: {field} names a file; a namespaced ImagePolicy gives keys and certificates inline (PEM) or by keyRef (a ConfigMap or Secret in its namespace); files on sigil's filesystem are the platform's (ClusterImagePolicy)",
                            r.name.value, v.name
                        ),
                    });
                }
            }
        }
        let mut rules = Vec::with_capacity(spec.rules.len());
        let mut names = std::collections::HashSet::new();
        for r in &spec.rules {
            let name = r.name.value.trim().to_owned();
            if name.is_empty() || !names.insert(name.clone()) {
                return Err(invalid(
                    &r.name,
                    format!("{who}: rule names must be set and unique ({name:?})"),
                ));
            }
            if r.patterns.is_empty() {
                return Err(invalid(
                    &r.name,
                    format!("{who}: rule {name:?} has an empty match list"),
                ));
            }
            let patterns = r
                .patterns
                .iter()
                .map(|p| Pattern::parse(&p.value).map_err(|e| invalid(p, e.to_string())))
                .collect::<Result<Vec<_>, _>>()?;
            let deny = match r.action {
                Some(super::Action::Deny) => true,
                Some(super::Action::Allow) | None => false,
                Some(super::Action::Pin) => {
                    return Err(invalid(
                        &r.name,
                        format!(
                            "{who}: rule {name:?}: action is allow or deny here (pinning is the platform's)"
                        ),
                    ));
                }
            };
            if r.namespace_selector.is_some() {
                return Err(invalid(
                    &r.name,
                    format!(
                        "{who}: rule {name:?}: a namespaced policy applies to its own namespace only (no namespaceSelector)"
                    ),
                ));
            }
            if r.mode.is_some() {
                return Err(invalid(
                    &r.name,
                    format!(
                        "{who}: rule {name:?}: set mode once for the whole namespaced policy (spec.mode)"
                    ),
                ));
            }
            if deny && (!r.verify.is_empty() || !r.attestations.is_empty()) {
                return Err(invalid(
                    &r.name,
                    format!("{who}: rule {name:?}: a deny rule verifies nothing"),
                ));
            }
            if r.verify.is_empty() && (r.threshold.is_some() || !r.required.is_empty()) {
                return Err(invalid(
                    &r.name,
                    format!("{who}: rule {name:?}: threshold and required need a verify list"),
                ));
            }
            if r.verify.is_empty() && r.attestations.is_empty() && r.signatures.is_some() {
                return Err(invalid(
                    &r.name,
                    format!("{who}: rule {name:?}: signatures needs a verify or attestations list"),
                ));
            }
            let verification = super::requirements::verification(r).map_err(|e| match e {
                PolicyError::Invalid { line, message } if !message.starts_with(&who) => {
                    PolicyError::Invalid {
                        line,
                        message: format!("{who}: {message}"),
                    }
                }
                other => other,
            })?;
            let exceptions = r
                .exceptions
                .as_ref()
                .map(super::schema::ExceptionsSpec::allowance)
                .transpose()
                .map_err(|m| invalid(&r.name, format!("{who}: rule {name:?}: {m}")))?
                .flatten();
            rules.push(TeamRule {
                name,
                patterns,
                deny,
                verification,
                exceptions,
            });
        }
        let order = super::compile::specificity_order(
            &rules
                .iter()
                .map(|r| (r.patterns.as_slice(), false))
                .collect::<Vec<_>>(),
        )
        .map_err(|(a, _, b, pa, pb)| PolicyError::Invalid {
            line: None,
            message: format!(
                "{who}: rules {:?} ({pa}) and {:?} ({pb}) are equally specific and can match the same image; make one more specific",
                rules[a].name, rules[b].name
            ),
        })?;
        Ok(NamespacePolicy {
            display: format!(
                "ImagePolicy {}/{}",
                doc.metadata.namespace, doc.metadata.name
            )
            .into(),
            namespace: doc.metadata.namespace,
            name: doc.metadata.name,
            mode: spec.mode.unwrap_or(Mode::Enforce),
            default_action: spec.default_action,
            rules,
            order,
        })
    }

    /// What this policy says about an image whose origin name is `origin`.
    pub fn judge(&self, origin: &Reference) -> TeamVerdict {
        let pattern = |&(ri, pi): &(usize, usize)| &self.rules[ri].patterns[pi];
        let found = if self.order.iter().all(|o| pattern(o).is_literal()) {
            // Plain-text patterns (nearly all) compare the name as it is.
            self.order.iter().find(|o| pattern(o).matches(origin))
        } else {
            crate::pattern::with_segments(origin, |segs| {
                self.order
                    .iter()
                    .find(|o| pattern(o).matches_segments(origin, segs))
            })
        };
        let rule = found.map(|&(ri, _)| &self.rules[ri]);
        match rule {
            None if self.default_action == DefaultAction::Deny => TeamVerdict::NotAllowed,
            None => TeamVerdict::Pass,
            Some(r) if r.deny => TeamVerdict::Denied {
                rule: r.name.clone(),
            },
            Some(r) => match &r.verification {
                Some(v) => TeamVerdict::Verify {
                    rule: r.name.clone(),
                    verification: v.clone(),
                },
                None => TeamVerdict::Pass,
            },
        }
    }
}
