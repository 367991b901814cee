//! The in-API-server backstop: a ValidatingAdmissionPolicy (and its
//! binding) derived from the policy in force, which the API server itself
//! evaluates on every Pod, so that while the webhook is down, failing open
//! or timing out, what sigil would never admit is still refused.
//!
//! It owns the objects and their verdicts: what the backstop refuses is
//! what `Policy::plan` refuses without a registry — an image an `enforce`
//! rule would pin that carries no digest, an image of a mirrored origin
//! not named at one of its mirrors (unless the mirror falls back to the
//! origin), what a `deny` rule refuses, and what no rule matches; `warn`
//! rules become warnings. What the API server cannot do without a
//! registry (resolve a tag, check a signature) is left to the webhook, and
//! so are rules it cannot see the inputs of (namespace labels,
//! exceptions): there it admits. Only the images an object adds are
//! checked (an UPDATE that keeps its images, a finalizer's removal, always
//! passes). The CEL itself, and why it stays small and cheap for large
//! policies, is [`expr`]'s. Whether the API server can take what it
//! generates is said in [`Backstop::unfit`]. It does no I/O; registering
//! the objects is the caller's.

pub mod eval;
mod expr;

use serde_json::{Value, json};

use crate::denial::Mode;
use crate::policy::Policy;

pub use expr::{MAX_EXPRESSION, crowd};

/// The envelope inside which the API server never refuses a Pod for the
/// backstop's cost (measured on kube-apiserver v1.36, docs/benchmarks.md):
/// at most this many patterns tested per image ([`crowd`]) …
pub const MAX_CROWD: usize = 100;
/// … for Pods of at most this many images, each at most
/// [`MAX_IMAGE_CHARS`] characters long.
pub const ENVELOPE_IMAGES: usize = 250;
/// The longest image reference the envelope is measured with.
pub const MAX_IMAGE_CHARS: usize = 128;
use expr::{cel_string, word};

/// The generated objects' name (the warn policy adds `-warn`).
pub const NAME: &str = "sigil-backstop";

/// What the generated objects depend on besides the policy.
#[derive(Debug, Clone)]
pub struct Options {
    /// sigil's own namespace: exempt, as from the webhook.
    pub namespace: String,
    /// The node tier's namespace (its DaemonSet, by tag, must start while
    /// the webhook is down): exempt too, when the node tier is installed.
    pub node_namespace: Option<String>,
}

/// The generated objects, and what the policy says that they leave to the
/// webhook.
#[derive(Debug, Clone)]
pub struct Backstop {
    /// ValidatingAdmissionPolicies and their bindings, in apply order.
    pub objects: Vec<Value>,
    /// One line per rule or feature the API server cannot check.
    pub left_to_webhook: Vec<String>,
    /// Why the API server would refuse to register these objects (a limit
    /// it enforces, named with the figures); empty when it takes them.
    pub unfit: Vec<String>,
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
            // Unless a rule that selects namespaces matches: it admits here.
            let reference = crate::reference::Reference::parse(image.trim()).ok()?;
            let selected = policy
                .rule_in_any_namespace(&policy.origin_of(&reference))
                .is_some();
            return Some(if selected {
                Verdict::Ok
            } else {
                Verdict::Refuse {
                    why: Why::NoRule,
                    rule: "-".to_owned(),
                }
            });
        }
        Err(_) => return None,
    };
    // The API server sees no labels or exceptions: the first pattern that
    // matches decides, and a rule that selects namespaces or takes
    // exceptions admits (where it applies, sigil may admit).
    let rule = policy.rule_in_any_namespace(&plan.origin)?;
    if rule.namespace_selector.is_some() || rule.exceptions.is_some() {
        return Some(Verdict::Ok);
    }
    let at_origin_by_policy =
        plan.rewritten() && !plan.failover.as_ref().is_some_and(|f| f.fallback);
    let why = match plan.step {
        crate::policy::Step::Deny => Why::Deny,
        // Pinned already, at the origin where the policy says a mirror:
        // only its place is wrong (sigil asks the mirror for the digest).
        crate::policy::Step::Resolve if plan.target.digest().is_some() => Why::NoMirror,
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
    if let Some(n) = &opts.node_namespace
        && !exempt.contains(n)
    {
        exempt.push(n.clone());
    }
    for n in &policy.exempt_namespaces {
        if !exempt.contains(n) {
            exempt.push(n.clone());
        }
    }
    let variables = expr::variables(policy);
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
    let mut unfit = unfit(&variables, &objects);
    let crowd = crowd(policy);
    if crowd > MAX_CROWD {
        unfit.push(format!(
            "an image can be tested against {crowd} patterns (patterns that begin with a glob, plus the most that share a literal start); the API server's cost budget holds at most {MAX_CROWD} for Pods of {ENVELOPE_IMAGES} images: start patterns with their registry (and path) where you can"
        ));
    }
    Backstop {
        objects,
        left_to_webhook: left,
        unfit,
    }
}

/// The largest object etcd stores by default (`--max-request-bytes`,
/// 1.5 MiB), less room for what the API server adds.
pub const MAX_OBJECT_BYTES: usize = 1_400_000;

/// Which limits of the API server the generated objects break.
fn unfit(variables: &[(String, String)], objects: &[Value]) -> Vec<String> {
    let mut out = Vec::new();
    for (name, e) in variables {
        let n = e.chars().count();
        if n > MAX_EXPRESSION {
            out.push(format!(
                "variable {name} is {n} code points long; the API server takes at most {MAX_EXPRESSION} in one expression"
            ));
        }
    }
    for o in objects {
        let n = o.to_string().len();
        if n > MAX_OBJECT_BYTES {
            out.push(format!(
                "{} {} is {n} bytes; the API server stores at most about {MAX_OBJECT_BYTES} in one object",
                o["kind"].as_str().unwrap_or_default(),
                o["metadata"]["name"].as_str().unwrap_or_default()
            ));
        }
    }
    out
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
            "sigil's backstop refused this Pod: the API server itself checked its images against sigil's policy, without a registry (ValidatingAdmissionPolicy sigil-backstop, evaluated whether or not the webhook images.sigil.dev is healthy): ",
            ". The webhook runs first and pins images at their mirrors, so either it did not see this Pod (sigil down, failing open or bypassed) or the two disagree (sigil policy check). Fix: pin the images at their mirrors in the manifests (sigil pin -w DIR), or check sigil (kubectl -n sigil-system get pods).",
        )
    } else {
        (
            "sigil's backstop warns: the API server itself checked this Pod's images against sigil's policy, without a registry (ValidatingAdmissionPolicy sigil-backstop-warn, whether or not the webhook images.sigil.dev is healthy): ",
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

#[cfg(test)]
mod tests;
