//! Policy files with several documents, and how they add up.
//!
//! Owns telling the kinds apart — `ClusterImagePolicy`, and `ImagePolicy`
//! without `metadata.namespace` (its meaning since the first release), are
//! cluster policies; an `ImagePolicy` with `metadata.namespace` is a team's
//! tighten-only policy — and merging cluster policies into one: rules,
//! mirrors and registries add up, exemptions unite, and anything two of them
//! would decide differently (a rule name used twice, two equally specific
//! rules for one image, a mirror or registry set twice, different pinning
//! settings) is a conflict. In a file a conflict is an error; for policy
//! objects the caller keeps the older one in force (see [`Policy::merge`]).

use std::sync::Arc;

use super::{CLUSTER_KIND, KIND, NamespacePolicy, Policy, PolicyError};
use crate::exception::Exception;

/// One document of a file: its text and the line it starts on.
fn documents(text: &str) -> Vec<(u64, String)> {
    let mut out = Vec::new();
    let (mut start, mut cur) = (1u64, String::new());
    for (i, line) in text.lines().enumerate() {
        if line.trim_end() == "---" || line.starts_with("--- ") {
            out.push((start, std::mem::take(&mut cur)));
            start = i as u64 + 2;
            continue;
        }
        cur.push_str(line);
        cur.push('\n');
    }
    out.push((start, cur));
    out.into_iter()
        .filter(|(_, d)| {
            d.lines()
                .any(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#'))
        })
        .collect()
}

/// Moves an error's line by the document's offset in the file.
fn shift(e: PolicyError, first_line: u64) -> PolicyError {
    match e {
        PolicyError::Invalid {
            line: Some(l),
            message,
        } => PolicyError::Invalid {
            line: Some(l + first_line - 1),
            message,
        },
        PolicyError::Invalid {
            line: None,
            message,
        } if first_line > 1 => PolicyError::Invalid {
            line: None,
            message: format!("document starting at line {first_line}: {message}"),
        },
        PolicyError::Syntax(m) if first_line > 1 => {
            PolicyError::Syntax(format!("document starting at line {first_line}: {m}"))
        }
        other => other,
    }
}

impl Policy {
    /// Reads a policy file of one or more documents: the cluster policies
    /// merged into one, the namespaced ImagePolicies attached to it. An
    /// `ImagePolicyException` here needs `metadata.creationTimestamp` (its
    /// `maxDuration` is measured from it); see [`Self::from_documents_at`].
    pub fn from_documents(text: &str) -> Result<Policy, PolicyError> {
        Policy::from_documents_at(text, None)
    }

    /// [`Self::from_documents`], loaded at `now` (unix seconds): an
    /// `ImagePolicyException` without `metadata.creationTimestamp` counts as
    /// created now. Each exception must be accepted by the policy (its rules
    /// exist, allow exceptions, and it lasts no longer than they allow), else
    /// the file does not load — as a conflict between documents does not.
    pub fn from_documents_at(text: &str, now: Option<i64>) -> Result<Policy, PolicyError> {
        Policy::load_documents(text, now, None)
    }

    /// A node policy (what `sigil node sync` writes): [`Self::from_documents_at`]
    /// plus the `NodeKeys` documents that answer its `keyRef`s on a node
    /// (empty when it names none).
    pub fn from_node_documents_at(
        text: &str,
        now: Option<i64>,
    ) -> Result<(Policy, crate::verify::node_keys::NodeKeys), PolicyError> {
        let mut keys = crate::verify::node_keys::NodeKeys::default();
        let policy = Policy::load_documents(text, now, Some(&mut keys))?;
        Ok((policy, keys))
    }

    fn load_documents(
        text: &str,
        now: Option<i64>,
        mut keys: Option<&mut crate::verify::node_keys::NodeKeys>,
    ) -> Result<Policy, PolicyError> {
        let mut cluster: Vec<Policy> = Vec::new();
        let mut teams: Vec<NamespacePolicy> = Vec::new();
        let mut exceptions: Vec<(u64, crate::exception::Exception)> = Vec::new();
        for (line, doc) in documents(text) {
            let head: serde_json::Value =
                serde_saphyr::from_str_with_options(&doc, crate::yaml::options(&doc))
                    .map_err(|e| shift(PolicyError::Syntax(e.to_string()), line))?;
            let kind = head["kind"].as_str().unwrap_or_default();
            let namespace = head["metadata"]["namespace"].as_str().unwrap_or_default();
            match kind {
                KIND if !namespace.is_empty() => {
                    teams.push(NamespacePolicy::from_yaml(&doc).map_err(|e| shift(e, line))?)
                }
                KIND | CLUSTER_KIND => {
                    cluster.push(Policy::from_yaml(&doc).map_err(|e| shift(e, line))?)
                }
                crate::verify::node_keys::KIND => {
                    let invalid = |message: String| {
                        shift(
                            PolicyError::Invalid {
                                line: None,
                                message,
                            },
                            line,
                        )
                    };
                    let Some(keys) = keys.as_deref_mut() else {
                        return Err(invalid(format!(
                            "kind {kind} is written by sigil node sync into a node policy; a policy file names keys by keyRef (docs/trust.md)"
                        )));
                    };
                    let more =
                        crate::verify::node_keys::NodeKeys::from_yaml(&doc).map_err(invalid)?;
                    keys.keys.extend(more.keys);
                }
                crate::exception::KIND => exceptions.push((
                    line,
                    Exception::from_yaml(&doc).map_err(|e| shift(e.into(), line))?,
                )),
                other => {
                    return Err(shift(
                        PolicyError::Invalid {
                            line: None,
                            message: format!(
                                "kind {other:?} is not a sigil policy ({KIND}, {CLUSTER_KIND} or {})",
                                crate::exception::KIND
                            ),
                        },
                        line,
                    ));
                }
            }
        }
        let mut policies = cluster.into_iter();
        let Some(first) = policies.next() else {
            return Err(PolicyError::Invalid {
                line: None,
                message: format!(
                    "the file holds no cluster policy ({CLUSTER_KIND}, or {KIND} without metadata.namespace)"
                ),
            });
        };
        let mut merged = first;
        for p in policies {
            merged = merged.merge(p)?;
        }
        for t in teams {
            merged.add_namespaced(t)?;
        }
        for (line, e) in exceptions {
            let Some(created) = e.created.or(now) else {
                return Err(shift(
                    PolicyError::Invalid {
                        line: None,
                        message: format!(
                            "{} needs metadata.creationTimestamp here: its rules' maxDuration is measured from it",
                            e.display_name()
                        ),
                    },
                    line,
                ));
            };
            merged.accepts(&e, created).map_err(|m| {
                shift(
                    PolicyError::Invalid {
                        line: None,
                        message: format!("{} is refused: {m}", e.display_name()),
                    },
                    line,
                )
            })?;
            merged.add_exception(e)?;
        }
        Ok(merged)
    }

    /// Whether this policy accepts exception `e`, created at `created`
    /// (unix seconds; the object's creation, else the moment it was first
    /// seen): every rule it names exists, allows exceptions, and `expires` is
    /// within that rule's `maxDuration` of `created`. The error says which
    /// rule refuses and why.
    pub fn accepts(&self, e: &Exception, created: i64) -> Result<(), String> {
        let policy = self;
        for (t, source) in e.targets() {
            let allowance = match source.and_then(|s| s.strip_prefix("ImagePolicy ")) {
                Some(team) => {
                    let (ns, name) = team.split_once('/').unwrap_or_default();
                    let p = policy
                        .namespaced
                        .get(ns)
                        .and_then(|l| l.iter().find(|p| p.name == name))
                        .ok_or_else(|| format!("{:?} is not a policy in force", t.policy))?;
                    p.rules
                        .iter()
                        .find(|r| r.name == t.rule)
                        .ok_or_else(|| format!("{} has no rule {:?}", t.policy, t.rule))?
                        .exceptions
                }
                None => {
                    policy
                        .rules
                        .iter()
                        .find(|r| r.name == t.rule && r.source.as_deref() == source)
                        .ok_or_else(|| format!("no rule {:?} of {} is in force", t.rule, t.policy))?
                        .exceptions
                }
            };
            let Some(max) = allowance else {
                return Err(format!(
                    "rule {:?} of {} allows no exceptions (the platform sets exceptions: {{allowed: true, maxDuration: …}} on the rule)",
                    t.rule, t.policy
                ));
            };
            let lasts = e.expires.saturating_sub(created);
            let max_secs = i64::try_from(max.as_secs()).unwrap_or(i64::MAX);
            if lasts > max_secs {
                return Err(format!(
                    "expires {} is {} after its creation; rule {:?} of {} allows at most {}",
                    e.expires_text,
                    humantime::format_duration(std::time::Duration::from_secs(
                        lasts.unsigned_abs()
                    )),
                    t.rule,
                    t.policy,
                    humantime::format_duration(max)
                ));
            }
        }
        Ok(())
    }

    /// Puts an accepted exception in force for its namespace; its name must
    /// be new there. (Whether the policy accepts it is
    /// [`Self::accepts`]'s.)
    pub fn add_exception(&mut self, e: Exception) -> Result<(), PolicyError> {
        let list = self.exceptions.entry(e.namespace.clone()).or_default();
        if list.iter().any(|o| o.name == e.name) {
            return Err(PolicyError::Invalid {
                line: None,
                message: format!("{} is defined twice", e.display_name()),
            });
        }
        list.push(Arc::new(e));
        Ok(())
    }

    /// Adds a team's policy for its namespace; its name must be new there.
    pub fn add_namespaced(&mut self, t: NamespacePolicy) -> Result<(), PolicyError> {
        let list = self.namespaced.entry(t.namespace.clone()).or_default();
        if list.iter().any(|o| o.name == t.name) {
            return Err(PolicyError::Invalid {
                line: None,
                message: format!("{} is defined twice", t.display_name()),
            });
        }
        list.push(Arc::new(t));
        Ok(())
    }

    /// This cluster policy and `other` acting as one, or why they cannot:
    /// the conflict names both. Callers that hold policy objects keep `self`
    /// (the older) in force and report `other` as not Ready.
    pub fn merge(self, other: Policy) -> Result<Policy, PolicyError> {
        let conflict = |what: String| PolicyError::Invalid {
            line: None,
            message: format!(
                "policies {:?} and {:?} conflict: {what}",
                self.name, other.name
            ),
        };
        for m in &other.mirrors {
            if self.mirrors.iter().any(|o| o.from == m.from) {
                return Err(conflict(format!("both map mirror {:?}", m.from)));
            }
            if let Some(t) = m
                .targets()
                .find(|t| self.mirrors.iter().any(|o| o.targets().any(|u| u == *t)))
            {
                return Err(conflict(format!("both mirror to {t:?}")));
            }
        }
        for r in &other.registries {
            if self.registries.iter().any(|o| o.host == r.host) {
                return Err(conflict(format!("both configure registry {:?}", r.host)));
            }
        }
        for r in &other.rules {
            if self.rules.iter().any(|o| o.name == r.name) {
                return Err(conflict(format!("both define rule {:?}", r.name)));
            }
        }
        if self.scope != other.scope
            || self.platform != other.platform
            || self.cache_ttl != other.cache_ttl
        {
            return Err(conflict(
                "their spec.pin settings differ (set pinning in one policy)".into(),
            ));
        }
        let mut rules = self.rules;
        rules.extend(other.rules);
        let order = super::compile::specificity_order(
            &rules
                .iter()
                .map(|r| (r.patterns.as_slice(), r.namespace_selector.is_some()))
                .collect::<Vec<_>>(),
        )
        .map_err(|(a, _, b, pa, pb)| {
            PolicyError::Invalid {
                line: None,
                message: format!(
                    "policies {:?} and {:?} conflict: rules {:?} ({pa}) and {:?} ({pb}) are equally specific and can match the same image",
                    self.name, other.name, rules[a].name, rules[b].name
                ),
            }
        })?;
        let mut mirrors = self.mirrors;
        mirrors.extend(other.mirrors);
        mirrors.sort_by_key(|m| std::cmp::Reverse(m.from.len()));
        let mut registries = self.registries;
        registries.extend(other.registries);
        let mut exempt = self.exempt_namespaces;
        for n in other.exempt_namespaces {
            if !exempt.contains(&n) {
                exempt.push(n);
            }
        }
        let mut node_admits = self.node_admits;
        for p in other.node_admits {
            if !node_admits.contains(&p) {
                node_admits.push(p);
            }
        }
        let mut namespaced = self.namespaced;
        for (ns, list) in other.namespaced {
            namespaced.entry(ns).or_default().extend(list);
        }
        let mut exceptions = self.exceptions;
        for (ns, list) in other.exceptions {
            exceptions.entry(ns).or_default().extend(list);
        }
        let extractors = self
            .extractors
            .merged(&other.extractors)
            .map_err(|message| PolicyError::Invalid {
                line: None,
                message,
            })?;
        let index = super::plan::index_of(&rules, &order);
        Ok(Policy {
            plans: Default::default(),
            extractors: Arc::new(extractors),
            exceptions,
            index,
            name: format!("{}+{}", self.name, other.name),
            mirrors,
            registries,
            scope: self.scope,
            platform: self.platform,
            cache_ttl: self.cache_ttl,
            rules,
            order,
            exempt_namespaces: exempt,
            node_admits,
            namespaced,
        })
    }
}
