//! The policy kinds as Kubernetes objects (group `sigil.dev`, `v1alpha1`):
//! `ClusterImagePolicy` (cluster-scoped, the platform's), `ImagePolicy`
//! (namespaced, a team's, tighten-only) and `TrustRoot` (cluster-scoped, a
//! Sigstore trusted root verifiers name).
//!
//! Owns the Rust types the CRDs are generated from (`sigil crds`, checked in
//! under `deploy/kustomize/base/crds/`), their printer columns and the CEL
//! rules that refuse, at admission, the fields a namespaced policy may not
//! set. It does not own what a policy means: an object's spec is handed to
//! sigil-core's parser as the same document a file holds, so files and
//! objects can never mean different things. Signature verifiers are kept
//! schemaless here (`x-kubernetes-preserve-unknown-fields`) and validated by
//! that parser, which reports problems in `status.conditions`.

use std::collections::BTreeMap;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::{CustomResource, CustomResourceExt, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Any JSON, kept as written (verifier specs), for the API server's schema.
fn free_form(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": true
    })
}

/// A list of strings.
fn string_list(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "array",
        "items": {"type": "string"}
    })
}

/// A list of free-form objects.
fn free_form_list(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "array",
        "items": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}
    })
}

/// A string or a list of strings (`spec.mirrors[].to`), checked by sigil.
fn string_or_list(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "description": "Mirror prefix that replaces it, or a list of them tried in order.",
        "x-kubernetes-preserve-unknown-fields": true
    })
}

/// `spec.mirrors[]`.
#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Mirror {
    /// Origin prefix on the normalized name: a host, or host/path.
    pub from: String,
    /// Mirror prefix that replaces it, or several tried in order.
    #[schemars(schema_with = "string_or_list")]
    pub to: serde_json::Value,
    /// `origin`: pin at the origin (with a warning) when no mirror has the image.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("enum" = ["origin"]))]
    pub fallback: Option<String>,
    /// Refuse a mirror whose digest for a tag differs from the origin's
    /// (default: true with `fallback`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub require_same_digest: Option<bool>,
    /// Copy an image the first mirror lacks into it from the origin (with
    /// its signatures and attestations); needs push credentials.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub copy: bool,
}

/// `spec.pin`.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Pin {
    /// `workloads` (default) or `pods`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<String>,
    /// `""` pins the index; `os/arch[/variant]` pins that platform.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub platform: Option<String>,
    /// How long a resolved digest is trusted (`5m`).
    #[serde(default, rename = "cacheTTL", skip_serializing_if = "Option::is_none")]
    pub cache_ttl: Option<String>,
}

/// One rule.
#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PolicyRule {
    /// Named in denials, metrics and status.
    pub name: String,
    /// Name patterns matched on the origin name; the most specific wins.
    #[serde(rename = "match")]
    pub patterns: Vec<String>,
    /// `enforce` (default) or `warn` (cluster policies only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<String>,
    /// `pin` (default), `allow` or `deny`; namespaced: `allow` (default) or `deny`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub action: Option<String>,
    /// For humans.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// Signature verifiers (cosign, notation), as in a policy file.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "free_form_list")]
    pub verify: Vec<serde_json::Value>,
    /// At least this many verifiers must pass.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub threshold: Option<i64>,
    /// Verifiers that must pass.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub required: Vec<String>,
    /// Where signatures are read from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "free_form")]
    pub signatures: Option<serde_json::Value>,
    /// In-toto attestations the pinned digest must carry (predicate type,
    /// attestors, CEL conditions), as in a policy file.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "free_form_list")]
    pub attestations: Vec<serde_json::Value>,
    /// Cluster policies only: the rule applies to objects in namespaces
    /// whose labels match (a label selector).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace_selector: Option<LabelSelector>,
    /// Whether `ImagePolicyException`s may waive this rule, and for how long
    /// at most (default: none may).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exceptions: Option<RuleExceptions>,
}

/// A rule's `exceptions`.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RuleExceptions {
    /// Exceptions may waive this rule.
    #[serde(default)]
    pub allowed: bool,
    /// The longest an exception may last from its creation (Go duration,
    /// default `720h`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_duration: Option<String>,
}

/// A Kubernetes label selector.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LabelSelector {
    /// Labels that must be present with these values.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub match_labels: BTreeMap<String, String>,
    /// `In`, `NotIn`, `Exists`, `DoesNotExist` expressions.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub match_expressions: Vec<LabelExpression>,
}

/// One `matchExpressions` entry.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema)]
pub struct LabelExpression {
    /// Label key.
    pub key: String,
    /// `In`, `NotIn`, `Exists` or `DoesNotExist`.
    #[schemars(extend("enum" = ["In", "NotIn", "Exists", "DoesNotExist"]))]
    pub operator: String,
    /// Values for `In` and `NotIn`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub values: Vec<String>,
}

/// The platform's policy: the same spec as a policy file.
#[derive(CustomResource, Clone, Debug, Deserialize, Serialize, JsonSchema)]
#[kube(
    group = "sigil.dev",
    version = "v1alpha1",
    kind = "ClusterImagePolicy",
    status = "PolicyStatus",
    shortname = "cip",
    category = "sigil",
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Rules","type":"integer","jsonPath":".status.rules"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct ClusterImagePolicySpec {
    /// Rewrite stage, applied first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mirrors: Vec<Mirror>,
    /// Per-host connection settings (as in a policy file).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "free_form_list")]
    pub registries: Vec<serde_json::Value>,
    /// How tags become digests.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pin: Option<Pin>,
    /// Rules; with every other ClusterImagePolicy they act as one policy.
    #[serde(default)]
    pub rules: Vec<PolicyRule>,
    /// Namespaces whose requests pass untouched.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub exempt_namespaces: Vec<String>,
    /// Images every node admits at pull without a check (the sandbox
    /// image, CNI's, kube-proxy's): a pull has no namespace to exempt.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub node_admits: Vec<String>,
}

/// A team's policy for its namespace: it may only tighten.
#[derive(CustomResource, KubeSchema, Clone, Debug, Deserialize, Serialize)]
#[kube(
    group = "sigil.dev",
    version = "v1alpha1",
    kind = "ImagePolicy",
    namespaced,
    status = "PolicyStatus",
    shortname = "ip",
    category = "sigil",
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Rules","type":"integer","jsonPath":".status.rules"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[x_kube(validation = Rule::new("!has(self.mirrors)").message("a namespaced ImagePolicy may only tighten: mirrors belong in a ClusterImagePolicy"))]
#[x_kube(validation = Rule::new("!has(self.registries)").message("a namespaced ImagePolicy may only tighten: registry settings and credentials belong in a ClusterImagePolicy"))]
#[x_kube(validation = Rule::new("!has(self.pin)").message("a namespaced ImagePolicy may only tighten: pinning belongs in a ClusterImagePolicy"))]
#[x_kube(validation = Rule::new("!has(self.exemptNamespaces)").message("a namespaced ImagePolicy may only tighten: exemptions belong in a ClusterImagePolicy"))]
#[x_kube(validation = Rule::new("!has(self.rules) || self.rules.all(r, !has(r.action) || r.action in ['allow', 'deny'])").message("a namespaced rule's action is allow or deny"))]
#[x_kube(validation = Rule::new("!has(self.rules) || self.rules.all(r, !has(r.mode))").message("set mode once for the whole namespaced ImagePolicy (spec.mode)"))]
#[x_kube(validation = Rule::new("!has(self.rules) || self.rules.all(r, !has(r.namespaceSelector))").message("a namespaced ImagePolicy applies to its own namespace only (no namespaceSelector)"))]
#[serde(rename_all = "camelCase")]
pub struct ImagePolicySpec {
    /// `enforce` (default): refusals block, and so do the cluster's warn-mode
    /// failures here; `warn`: refusals only warn.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("enum" = ["enforce", "warn"]))]
    pub mode: Option<String>,
    /// `allow` (default) or `deny` (an allow-list).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("enum" = ["allow", "deny"]))]
    pub default_action: Option<String>,
    /// Deny rules, allow-list entries, the team's own signature requirements.
    #[serde(default)]
    pub rules: Vec<PolicyRule>,
    /// Not allowed here (declared so the CEL rule can refuse it rather than
    /// the API server silently dropping it; typed as in a ClusterImagePolicy,
    /// so a copy from one reaches the rule and its message: a real API server
    /// checks types first, and CEL cannot name an untyped field).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "free_form_list")]
    pub mirrors: Option<serde_json::Value>,
    /// Not allowed here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "free_form_list")]
    pub registries: Option<serde_json::Value>,
    /// Not allowed here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "free_form")]
    pub pin: Option<serde_json::Value>,
    /// Not allowed here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "string_list")]
    pub exempt_namespaces: Option<serde_json::Value>,
}

/// `status` of both kinds, written by one replica.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PolicyStatus {
    /// The generation this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Rules in force from this object.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rules: Option<i64>,
    /// `Ready`: True when in force, False with the reason and message.
    #[serde(default)]
    pub conditions: Vec<Condition>,
}

/// A status condition (the standard shape).
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    /// `Ready`.
    #[serde(rename = "type")]
    pub type_: String,
    /// `True`, `False` or `Unknown`.
    pub status: String,
    /// CamelCase reason.
    pub reason: String,
    /// What is wrong (the field or line) or what is in force.
    pub message: String,
    /// The generation it was computed from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// When the status last changed.
    pub last_transition_time: String,
}

/// A Sigstore trusted root sigil keeps in force by name, for verifiers
/// that say `trustRoot: NAME` (policy-controller's TrustRoot, in sigil's
/// group). Exactly one source.
#[derive(CustomResource, KubeSchema, Clone, Debug, Deserialize, Serialize)]
#[kube(
    group = "sigil.dev",
    version = "v1alpha1",
    kind = "TrustRoot",
    status = "TrustRootStatus",
    shortname = "tr",
    category = "sigil",
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Source","type":"string","jsonPath":".status.source"}"#,
    printcolumn = r#"{"name":"Expires","type":"string","jsonPath":".status.expires"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[x_kube(validation = Rule::new("[has(self.remote), has(self.repository), has(self.sigstoreKeys)].filter(x, x).size() == 1").message("give exactly one of remote, repository or sigstoreKeys"))]
#[serde(rename_all = "camelCase")]
pub struct TrustRootSpec {
    /// A TUF repository sigil refreshes the root from (a mirror of
    /// Sigstore's, or a private instance's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remote: Option<TufRemote>,
    /// A TUF repository shipped in the object (air-gapped clusters).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repository: Option<TufRepository>,
    /// A `trusted_root.json`, inline (a private Sigstore without TUF).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "free_form")]
    pub sigstore_keys: Option<serde_json::Value>,
}

/// `spec.remote`.
#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema, PartialEq)]
pub struct TufRemote {
    /// The repository's URL (https://, http:// or file://): metadata at its
    /// root, targets under `targets/`.
    pub mirror: String,
    /// Its `root.json` to start from, base64.
    pub root: String,
}

/// `spec.repository`.
#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema, PartialEq)]
pub struct TufRepository {
    /// Its `root.json` to start from, base64.
    pub root: String,
    /// The repository's files by relative path (`timestamp.json`,
    /// `1.root.json`, `targets/<sha256>.trusted_root.json`, ...), base64.
    pub files: BTreeMap<String, String>,
}

/// `status` of a TrustRoot, written by one replica.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct TrustRootStatus {
    /// The generation this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Where the root in force came from (`tuf <mirror>`, `inline`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    /// TUF root metadata version in force.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub root_version: Option<i64>,
    /// When the TUF metadata in force expires (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires: Option<String>,
    /// Last successful refresh (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_refresh: Option<String>,
    /// Why the last refresh failed (the root in force, if any, stays).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// `Ready`: True while a root is in force.
    #[serde(default)]
    pub conditions: Vec<Condition>,
}

/// A team's waiver of named rules for named images in its namespace, until
/// `expires`. Rules accept exceptions only where the platform's policy says
/// so (`exceptions: {allowed: true, maxDuration}`); what the API server
/// cannot know (the rule's allowance) sigil checks and writes to `status`.
#[derive(CustomResource, KubeSchema, Clone, Debug, Deserialize, Serialize)]
#[kube(
    group = "sigil.dev",
    version = "v1alpha1",
    kind = "ImagePolicyException",
    namespaced,
    status = "ExceptionStatus",
    shortname = "ipe",
    category = "sigil",
    printcolumn = r#"{"name":"State","type":"string","jsonPath":".status.state"}"#,
    printcolumn = r#"{"name":"Expires","type":"string","jsonPath":".spec.expires"}"#,
    printcolumn = r#"{"name":"Ticket","type":"string","jsonPath":".spec.ticket"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[x_kube(validation = Rule::new("self.images.size() > 0").message("name at least one image (a pattern or name@sha256:…)"))]
#[x_kube(validation = Rule::new("self.rules.size() > 0").message("name at least one rule it waives"))]
#[x_kube(validation = Rule::new("self.rules.all(r, r.policy.matches('^(ClusterImagePolicy/[^/]+|ImagePolicy/[^/]+(/[^/]+)?)$'))").message("a rule's policy is ClusterImagePolicy/NAME or ImagePolicy/NAMESPACE/NAME"))]
#[x_kube(validation = Rule::new("self.reason.size() > 0").message("say why the exception is needed (reason)"))]
#[x_kube(validation = Rule::new("self.expires.matches('^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}([.][0-9]+)?(Z|[+-][0-9]{2}:[0-9]{2})$')").message("expires is an RFC 3339 time (2026-12-31T00:00:00Z)"))]
#[serde(rename_all = "camelCase")]
pub struct ImagePolicyExceptionSpec {
    /// Image patterns (as in a rule's `match`) or exact `name@sha256:…`.
    /// (Bounded, as every list and string here, so the API server's CEL
    /// cost estimate stays within its budget.)
    #[schemars(length(max = 64), inner(length(max = 512)))]
    pub images: Vec<String>,
    /// The rules it waives.
    #[schemars(length(max = 32))]
    pub rules: Vec<ExceptedRule>,
    /// When it stops applying (RFC 3339); required.
    #[schemars(length(max = 64))]
    pub expires: String,
    /// Why; shown in warnings, the audit and policy reports.
    #[schemars(length(max = 1024))]
    pub reason: String,
    /// A tracking reference.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 256))]
    pub ticket: Option<String>,
}

/// One rule an exception waives.
#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema)]
pub struct ExceptedRule {
    /// `ClusterImagePolicy/NAME`, `ImagePolicy/NAMESPACE/NAME`, or
    /// `ImagePolicy/NAME` (a policy file's single cluster document).
    #[schemars(length(max = 512))]
    pub policy: String,
    /// The rule's name.
    #[schemars(length(max = 253))]
    pub rule: String,
}

/// `status` of an ImagePolicyException, written by one replica.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ExceptionStatus {
    /// The generation this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `Active`, `Expired` or `Invalid`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<String>,
    /// `Ready`: True while it waives, False (Expired, Refused) otherwise.
    #[serde(default)]
    pub conditions: Vec<Condition>,
}

/// The CRDs, as `sigil crds` prints them: labelled as the kustomize base
/// labels everything it ships, so the Helm chart's `crds/` (which Helm does
/// not template) holds the very same objects.
pub fn all() -> Vec<CustomResourceDefinition> {
    let mut crds = vec![
        ClusterImagePolicy::crd(),
        ImagePolicy::crd(),
        TrustRoot::crd(),
        ImagePolicyException::crd(),
    ];
    for c in &mut crds {
        let labels = c.metadata.labels.get_or_insert_with(BTreeMap::new);
        labels.insert("app.kubernetes.io/name".into(), "sigil".into());
        labels.insert("app.kubernetes.io/part-of".into(), "sigil".into());
    }
    crds
}

/// The CRDs as one multi-document YAML stream.
pub fn yaml() -> Result<String, serde_saphyr::ser::Error> {
    let mut out = String::from(
        "# Generated by `sigil crds` from crates/sigil/src/crd.rs; do not edit by hand.\n",
    );
    for c in all() {
        out.push_str("---\n");
        out.push_str(&serde_saphyr::to_string(&c)?);
    }
    Ok(out)
}
