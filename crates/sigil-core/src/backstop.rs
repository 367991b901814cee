//! The in-API-server backstop: a ValidatingAdmissionPolicy (and its
//! binding) derived from the policy in force, which the API server itself
//! evaluates on every Pod, so that while the webhook is down, failing open
//! or timing out, what sigil would never admit is still refused.
//!
//! It owns turning rules, patterns and mirrors into CEL: image strings are
//! normalized in CEL as `reference` normalizes them (Docker Hub shorthand,
//! `index.docker.io`, tags and digests), mapped back from a mirror to their
//! origin as `Policy::origin_of` does, and matched against each pattern as
//! an RE2 expression (`Pattern::to_regex`), most specific first, as
//! `Policy::rule_for` does. What the API server cannot do without a
//! registry (resolve a tag, check a signature) is left to the webhook: the
//! backstop refuses an image an `enforce` rule would pin that carries no
//! digest, an image of a mirrored origin not named at one of its mirrors
//! (unless the mirror falls back to the origin), what a `deny` rule
//! refuses, and what no rule matches; `warn` rules become warnings. Only
//! the images an object adds are checked (an UPDATE that keeps its images,
//! a finalizer's removal, always passes). It does no I/O; registering the
//! objects is the caller's.

use serde_json::{Value, json};

use crate::denial::Mode;
use crate::policy::schema::Action;
use crate::policy::{Policy, Rule};

/// The generated objects' name (the warn policy adds `-warn`).
pub const NAME: &str = "sigil-backstop";

/// What the generated objects depend on besides the policy.
#[derive(Debug, Clone)]
pub struct Options {
    /// sigil's own namespace: exempt, as from the webhook.
    pub namespace: String,
}

/// The generated objects, and what the policy says that they leave to the
/// webhook.
#[derive(Debug, Clone)]
pub struct Backstop {
    /// ValidatingAdmissionPolicies and their bindings, in apply order.
    pub objects: Vec<Value>,
    /// One line per rule or feature the API server cannot check.
    pub left_to_webhook: Vec<String>,
}

/// Why the backstop refuses (or warns about) an image.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Why {
    /// An `enforce` (or `warn`) rule pins it and it carries no digest.
    NoDigest,
    /// Its origin is mirrored (without falling back) and it names the origin.
    NoMirror,
    /// A `deny` rule matches it.
    Deny,
    /// No rule matches it.
    NoRule,
}

impl Why {
    /// The word the generated CEL uses for it (and the audit reports).
    pub fn as_str(self) -> &'static str {
        match self {
            Why::NoDigest => "nodigest",
            Why::NoMirror => "nomirror",
            Why::Deny => "deny",
            Why::NoRule => "norule",
        }
    }

    /// In words, as the backstop's message says it.
    pub fn explain(self, rule: &str) -> String {
        match self {
            Why::NoDigest => format!("has no digest (rule {rule} pins it)"),
            Why::NoMirror => format!("is not pulled from its mirror (rule {rule})"),
            Why::Deny => format!("is denied by rule {rule}"),
            Why::NoRule => "matches no rule of the policy".to_owned(),
        }
    }
}

/// What the backstop decides of one image a Pod adds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Admitted (the webhook may still have more to say).
    Ok,
    /// Refused (an `enforce` rule, or no rule).
    Refuse {
        /// Why.
        why: Why,
        /// The rule (`-` when none matched).
        rule: String,
    },
    /// Admitted with a warning (a `warn` rule).
    Warn {
        /// Why.
        why: Why,
        /// The rule.
        rule: String,
    },
}

/// What the generated backstop decides of `image` written in a Pod of a
/// namespace it is not exempt in — the same answer its CEL gives (the
/// tests evaluate both), without the API server: what the audit reports.
/// `None` for a string that is no image reference (the webhook refuses
/// it; what the CEL makes of it is not specified).
pub fn decide(policy: &Policy, image: &str) -> Option<Verdict> {
    // Shared with the decision that planned the same string (the audit
    // decides every image first): no second parse or rule match.
    let plan = match policy.plan_shared(image, None) {
        Ok(plan) => plan,
        Err(crate::denial::Denial::NoRule) => {
            return Some(Verdict::Refuse {
                why: Why::NoRule,
                rule: "-".to_owned(),
            });
        }
        Err(_) => return None,
    };
    let rule = policy.rules.iter().find(|r| *r.name == *plan.rule)?;
    if rule.namespace_selector.is_some() || rule.exceptions.is_some() {
        return Some(Verdict::Ok);
    }
    let at_origin_by_policy =
        plan.rewritten() && !plan.failover.as_ref().is_some_and(|f| f.fallback);
    let why = match plan.step {
        crate::policy::Step::Deny => Why::Deny,
        crate::policy::Step::Resolve => Why::NoDigest,
        crate::policy::Step::Keep if at_origin_by_policy => Why::NoMirror,
        crate::policy::Step::Keep => return Some(Verdict::Ok),
    };
    let rule = word(&rule.name);
    Some(match plan.mode {
        Mode::Enforce => Verdict::Refuse { why, rule },
        Mode::Warn => Verdict::Warn { why, rule },
    })
}

/// Why the backstop would refuse `image` in a Pod (of a namespace it does
/// not exempt), in the words of its message; `None` when it admits it.
pub fn refusal(policy: &Policy, image: &str) -> Option<String> {
    match decide(policy, image)? {
        Verdict::Refuse { why, rule } => Some(why.explain(&rule)),
        Verdict::Ok | Verdict::Warn { .. } => None,
    }
}

/// The label a namespace opts out with (as from the webhook).
const IGNORE_LABEL: &str = "sigil.dev/ignore";

/// Generates the backstop for `policy` (the cluster's policy: team
/// ImagePolicies only tighten it, so leaving them to the webhook never
/// refuses what sigil would admit).
pub fn generate(policy: &Policy, opts: &Options) -> Backstop {
    let mut left = Vec::new();
    for r in &policy.rules {
        if r.namespace_selector.is_some() {
            left.push(format!(
                "rule {}: applies to namespaces by label (left to the webhook)",
                r.name
            ));
        } else if r.exceptions.is_some() {
            left.push(format!(
                "rule {}: allows ImagePolicyExceptions, which the API server cannot see (left to the webhook)",
                r.name
            ));
        } else if r.verification.is_some() && r.mode == Mode::Enforce {
            left.push(format!(
                "rule {}: signatures and attestations (the backstop requires the digest they are checked on)",
                r.name
            ));
        }
    }
    if !policy.namespaced.is_empty() {
        left.push("team ImagePolicies (they only tighten; left to the webhook)".to_owned());
    }
    let mut exempt = vec!["kube-system".to_owned(), opts.namespace.clone()];
    for n in &policy.exempt_namespaces {
        if !exempt.contains(n) {
            exempt.push(n.clone());
        }
    }
    let variables = variables(policy);
    let has_warn = policy.rules.iter().any(|r| r.mode == Mode::Warn);
    let mut objects = vec![
        vap(NAME, &exempt, &variables, "refuse", "Forbidden"),
        binding(NAME, "Deny"),
    ];
    if has_warn {
        let warn = format!("{NAME}-warn");
        objects.push(vap(&warn, &exempt, &variables, "warn", "Forbidden"));
        objects.push(binding(&warn, "Warn"));
    }
    Backstop {
        objects,
        left_to_webhook: left,
    }
}

fn labels() -> Value {
    json!({"app.kubernetes.io/name": "sigil", "app.kubernetes.io/part-of": "sigil",
           "app.kubernetes.io/component": "backstop"})
}

fn vap(
    name: &str,
    exempt: &[String],
    variables: &[(String, String)],
    kind: &str,
    reason: &str,
) -> Value {
    let vars: Vec<Value> = variables
        .iter()
        .map(|(n, e)| json!({"name": n, "expression": e}))
        .collect();
    let explain = "v[0] + (v[2] == 'nodigest' ? ' has no digest (rule ' + v[3] + ' pins it)' : v[2] == 'nomirror' ? ' is not pulled from its mirror (rule ' + v[3] + ')' : v[2] == 'deny' ? ' is denied by rule ' + v[3] : ' matches no rule of the policy')";
    let (what, fix) = if kind == "refuse" {
        (
            "sigil's backstop refused this Pod (the webhook images.sigil.dev did not pin and check it: sigil is down or was bypassed): ",
            ". Fix: pin the images at their mirrors in the manifests (sigil pin -w DIR), or bring sigil back (kubectl -n sigil-system get pods).",
        )
    } else {
        (
            "sigil's backstop warns (the webhook images.sigil.dev did not pin and check this Pod): ",
            ". Pin the images at their mirrors (sigil pin -w DIR).",
        )
    };
    json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": name, "labels": labels()},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {
                "resourceRules": [{
                    "apiGroups": [""], "apiVersions": ["v1"],
                    "operations": ["CREATE", "UPDATE"],
                    "resources": ["pods", "pods/ephemeralcontainers"],
                }],
                "namespaceSelector": {"matchExpressions": [
                    {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": exempt},
                    {"key": IGNORE_LABEL, "operator": "DoesNotExist"},
                ]},
            },
            "variables": vars,
            "validations": [{
                "expression": format!("variables.verdicts.all(v, v[1] != '{kind}')"),
                "messageExpression": format!(
                    "{} + variables.verdicts.filter(v, v[1] == '{kind}').map(v, {explain}).join('; ') + {}",
                    cel_string(what),
                    cel_string(fix)
                ),
                "reason": reason,
            }],
        },
    })
}

fn binding(name: &str, action: &str) -> Value {
    json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": name, "labels": labels()},
        "spec": {"policyName": name, "validationActions": [action]},
    })
}

/// A CEL string literal (single-quoted, escaped).
fn cel_string(s: &str) -> String {
    format!("'{}'", s.replace('\\', "\\\\").replace('\'', "\\'"))
}

/// A rule's name as one word of a verdict (names are DNS-like already).
fn word(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "._-/".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// The images of `obj` (`object` or `oldObject`): containers, init and
/// ephemeral containers, image volumes.
fn images_of(obj: &str) -> String {
    let containers = |field: &str| {
        format!(
            "(has({obj}.spec.{field}) ? {obj}.spec.{field}.filter(c, has(c.image)).map(c, c.image) : [])"
        )
    };
    format!(
        "{} + {} + {} + (has({obj}.spec.volumes) ? {obj}.spec.volumes.filter(v, has(v.image) && has(v.image.reference)).map(v, v.image.reference) : [])",
        containers("containers"),
        containers("initContainers"),
        containers("ephemeralContainers"),
    )
}

/// The policy's variables: after the images, each a list with one entry
/// per image the object adds, the entry a list of fields built up step by
/// step (lists, not joined strings: indexing costs the API server less than
/// splitting).
fn variables(policy: &Policy) -> Vec<(String, String)> {
    let mut vars = vec![
        ("images".to_owned(), images_of("object")),
        (
            "previous".to_owned(),
            format!("oldObject == null ? [] : {}", images_of("oldObject")),
        ),
        // [written, without its digest, whether it had one: d or n].
        (
            "refs".to_owned(),
            "variables.images.filter(i, !(i in variables.previous)).map(i, [string(i), string(i).split('@')[0], string(i).contains('@') ? 'd' : 'n'])".to_owned(),
        ),
        // [written, name, tag, d|n]: the tag split off (`latest` when there
        // is neither tag nor digest, `-` for a digest alone).
        (
            "named".to_owned(),
            "variables.refs.map(r, r[1].lastIndexOf(':') > r[1].lastIndexOf('/') ? [r[0], r[1].substring(0, r[1].lastIndexOf(':')), r[1].substring(r[1].lastIndexOf(':') + 1), r[2]] : [r[0], r[1], r[2] == 'd' ? '-' : 'latest', r[2]])".to_owned(),
        ),
        // [written, name with its domain, tag, d|n] (Docker Hub shorthand
        // expanded; `index.docker.io` is `docker.io`).
        (
            "expanded".to_owned(),
            "variables.named.map(r, [r[0], (r[1].contains('/') && (r[1].split('/')[0].contains('.') || r[1].split('/')[0].contains(':') || r[1].split('/')[0] == 'localhost')) ? (r[1].startsWith('index.docker.io/') ? 'docker.io/' + r[1].substring(16) : r[1]) : (r[1].contains('/') ? 'docker.io/' + r[1] : 'docker.io/library/' + r[1]), r[2], r[3]])".to_owned(),
        ),
        // `docker.io/nginx` is `docker.io/library/nginx`.
        (
            "full".to_owned(),
            "variables.expanded.map(r, [r[0], (r[1].startsWith('docker.io/') && r[1].split('/').size() == 2) ? 'docker.io/library/' + r[1].substring(10) : r[1], r[2], r[3]])".to_owned(),
        ),
    ];
    // [written, full, tag, d|n, origin]: mapped back from a mirror
    // (longest target first).
    let mut targets: Vec<(String, String)> = policy
        .mirrors
        .iter()
        .flat_map(|m| m.targets().map(move |t| (t.to_owned(), m.from.clone())))
        .collect();
    targets.sort_by_key(|(t, _)| std::cmp::Reverse(t.len()));
    let mut origin = "r[1]".to_owned();
    for (to, from) in targets.iter().rev() {
        origin = format!(
            "((r[1] == {to_s} || r[1].startsWith({to_slash})) ? {from_s} + r[1].substring({len}) : {origin})",
            to_s = cel_string(to),
            to_slash = cel_string(&format!("{to}/")),
            from_s = cel_string(from),
            len = to.chars().count(),
        );
    }
    vars.push((
        "origins".to_owned(),
        format!("variables.full.map(r, r + [{origin}])"),
    ));
    // [written, ok|refuse|warn, why, rule].
    vars.push((
        "verdicts".to_owned(),
        format!("variables.origins.map(r, [r[0]] + {})", verdict(policy)),
    ));
    vars
}

/// The verdict chain over an `origins` entry `r` ([written, full, tag,
/// d|n, origin]): the first pattern, most specific first, that matches the
/// origin decides.
fn verdict(policy: &Policy) -> String {
    let (full, tag, pinned, origin) = ("r[1]", "r[2]", "r[3]", "r[4]");
    // Whether the origin is under a mirror that does not fall back to it
    // (longest `from` decides, as `Policy::mirror_for`).
    let mut froms: Vec<_> = policy.mirrors.iter().collect();
    froms.sort_by_key(|m| std::cmp::Reverse(m.from.len()));
    let mut no_fallback = "false".to_owned();
    for m in froms.iter().rev() {
        no_fallback = format!(
            "(({origin} == {f} || {origin}.startsWith({fs})) ? {nf} : {no_fallback})",
            f = cel_string(&m.from),
            fs = cel_string(&format!("{}/", m.from)),
            nf = !m.fallback_origin(),
        );
    }
    let mut chain = "['refuse', 'norule', '-']".to_owned();
    let patterns: Vec<_> = policy.patterns_in_order().collect();
    for (rule, pattern) in patterns.into_iter().rev() {
        let (name_re, tag_re) = pattern.to_regex();
        let mut cond = format!("{origin}.matches({})", cel_string(&name_re));
        if let Some(t) = tag_re {
            cond = format!("({cond} && {tag}.matches({}))", cel_string(&t));
        }
        chain = format!(
            "({cond} ? {} : {chain})",
            outcome(rule, full, origin, pinned, &no_fallback)
        );
    }
    chain
}

/// What a matching rule says of an image (a CEL list: [kind, why, rule]).
fn outcome(rule: &Rule, full: &str, origin: &str, pinned: &str, no_fallback: &str) -> String {
    if rule.namespace_selector.is_some() || rule.exceptions.is_some() {
        return "['ok']".to_owned();
    }
    let kind = match rule.mode {
        Mode::Enforce => "refuse",
        Mode::Warn => "warn",
    };
    let name = word(&rule.name);
    let say = |why: &str| {
        format!(
            "[{}, {}, {}]",
            cel_string(kind),
            cel_string(why),
            cel_string(&name)
        )
    };
    let mirrored = format!("({full} == {origin} && {no_fallback})");
    match rule.action {
        Action::Deny => say("deny"),
        Action::Allow => format!("({mirrored} ? {} : ['ok'])", say("nomirror")),
        Action::Pin => format!(
            "({pinned} == 'n' ? {} : ({mirrored} ? {} : ['ok']))",
            say("nodigest"),
            say("nomirror")
        ),
    }
}

#[cfg(test)]
mod tests;
