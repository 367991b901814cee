//! The policy document as written: field names are the YAML's, values keep
//! their source position (`Spanned`) so errors can name the line. Nothing
//! here is validated; `compile` does that.

use std::fmt;

use serde::{Deserialize, Serialize};
use serde_saphyr::Spanned;

use crate::denial::Mode;
use crate::verify::{SignaturesSpec, VerifierSpec};

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
    /// Images a node always admits at pull (docs/node.md): what a node
    /// pulls for itself, which no namespace can exempt. Ignored by
    /// admission.
    #[serde(default)]
    pub node_admits: Vec<Spanned<String>>,
    /// Where images live in custom resources, per kind, beside the shipped
    /// defaults (docs/pin.md).
    #[serde(default)]
    pub image_extractors: Vec<crate::walker::ExtractorSpec>,
}

/// One origin → mirror mapping.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct MirrorSpec {
    /// Origin prefix on the normalized name: a host, or host/path.
    pub from: Spanned<String>,
    /// Mirror prefix that replaces it, or several, tried in order: the first
    /// that has the image wins.
    pub to: Spanned<MirrorTargets>,
    /// `origin`: when no mirror has the image, pin it at the origin (with a
    /// warning). Default: the failure, as for one mirror.
    #[serde(default)]
    pub fallback: Option<Fallback>,
    /// Refuse a mirror whose digest for a tag differs from the origin's
    /// (when the origin answers). Default: true with `fallback`, else false.
    #[serde(default, rename = "requireSameDigest")]
    pub require_same_digest: Option<bool>,
    /// Copy an image the first mirror lacks into it from the origin, with
    /// its signatures, attestations and referrers (needs push credentials
    /// for the mirror: the registry's `pushAuth`, else its `auth`).
    #[serde(default)]
    pub copy: bool,
}

/// `to`: one mirror prefix, or several in order.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, Eq)]
#[serde(untagged)]
pub enum MirrorTargets {
    /// `to: mirror.example.com/hub`
    One(String),
    /// `to: [mirror-a.example.com/hub, mirror-b.example.com/hub]`
    Many(Vec<String>),
}

impl MirrorTargets {
    /// The prefixes, in order.
    pub fn list(&self) -> Vec<&str> {
        match self {
            MirrorTargets::One(s) => vec![s.as_str()],
            MirrorTargets::Many(v) => v.iter().map(String::as_str).collect(),
        }
    }
}

/// A mirror's `fallback`.
#[derive(Debug, Clone, Copy, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Fallback {
    /// Pin the image at its origin when no mirror has it.
    Origin,
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
    /// Credentials to push with (copy on admission into a mirror on this
    /// host); `auth` when absent.
    #[serde(default)]
    pub push_auth: Option<AuthSpec>,
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
    /// In-toto attestations (provenance, SBOMs, scans) the pinned digest
    /// must carry, with conditions.
    #[serde(default)]
    pub attestations: Vec<AttestationSpec>,
    /// Only for objects in namespaces whose labels match (a Kubernetes label
    /// selector; every namespace has `kubernetes.io/metadata.name`).
    #[serde(default)]
    pub namespace_selector: Option<SelectorSpec>,
    /// Whether teams may waive this rule with an `ImagePolicyException`,
    /// and for how long at most (default: no exceptions).
    #[serde(default)]
    pub exceptions: Option<ExceptionsSpec>,
}

/// How long an `ImagePolicyException` may last when a rule allows
/// exceptions without saying `maxDuration`: 30 days.
pub const DEFAULT_MAX_DURATION: std::time::Duration = std::time::Duration::from_secs(720 * 3600);

/// A rule's `exceptions:`.
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ExceptionsSpec {
    /// Exceptions may waive this rule.
    #[serde(default)]
    pub allowed: bool,
    /// The longest an exception may last from its creation (`720h`, the default).
    #[serde(default)]
    pub max_duration: Option<String>,
}

impl ExceptionsSpec {
    /// The longest exception allowed, `None` when none are; or why
    /// `maxDuration` is malformed.
    pub fn allowance(&self) -> Result<Option<std::time::Duration>, String> {
        if !self.allowed {
            return match self.max_duration {
                Some(_) => {
                    Err("exceptions.maxDuration is set but exceptions.allowed is not true".into())
                }
                None => Ok(None),
            };
        }
        match self.max_duration.as_deref() {
            None => Ok(Some(DEFAULT_MAX_DURATION)),
            Some(s) => match crate::duration::parse_go(s) {
                Some(d) if !d.is_zero() => Ok(Some(d)),
                _ => Err(format!(
                    "exceptions.maxDuration {s:?} is not a positive duration (720h)"
                )),
            },
        }
    }
}

/// A label selector, as Kubernetes writes one.
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SelectorSpec {
    /// Labels that must be present with these values.
    #[serde(default)]
    pub match_labels: std::collections::BTreeMap<String, String>,
    /// `In`, `NotIn`, `Exists`, `DoesNotExist` expressions.
    #[serde(default)]
    pub match_expressions: Vec<ExpressionSpec>,
}

/// One `matchExpressions` entry.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct ExpressionSpec {
    /// Label key.
    pub key: String,
    /// `In`, `NotIn`, `Exists` or `DoesNotExist`.
    pub operator: String,
    /// Values for `In` and `NotIn`.
    #[serde(default)]
    pub values: Vec<String>,
}

/// One entry of a rule's `attestations:`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AttestationSpec {
    /// Named in denials, reports and the audit annotation.
    pub name: Spanned<String>,
    /// An exact URI, or one of cosign's short names (`slsaprovenance1`, `spdx`, `vuln`, …).
    pub predicate_type: Spanned<String>,
    /// Who may have signed it: inline verifiers, or names of the rule's `verify` entries.
    #[serde(default)]
    pub attestors: Vec<AttestorSpec>,
    /// CEL expressions that must all hold for one attestation.
    #[serde(default)]
    pub conditions: Vec<ConditionSpec>,
    /// Largest statement read (bytes, or `Ki`/`Mi` units); default 8 MiB.
    #[serde(default)]
    pub max_attestation_size: Option<Spanned<ByteSize>>,
}

/// An attestor: the name of one of the rule's `verify` entries, or a verifier inline.
#[derive(Debug, Clone, Serialize)]
#[serde(untagged)]
pub enum AttestorSpec {
    /// `attestors: [scanner]`.
    Name(String),
    /// `attestors: [{name: gha, cosign: {...}}]`.
    Inline(Box<VerifierSpec>),
}

impl<'de> Deserialize<'de> for AttestorSpec {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = AttestorSpec;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(
                    "the name of one of the rule's verify entries, or a verifier (name and cosign)",
                )
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<AttestorSpec, E> {
                Ok(AttestorSpec::Name(v.to_owned()))
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                m: A,
            ) -> Result<AttestorSpec, A::Error> {
                VerifierSpec::deserialize(serde::de::value::MapAccessDeserializer::new(m))
                    .map(|v| AttestorSpec::Inline(Box::new(v)))
            }
        }
        d.deserialize_any(V)
    }
}

/// One condition as written.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ConditionSpec {
    /// A CEL expression over `predicate`, `signer`, `image`, … that must be true.
    pub expression: Spanned<String>,
    /// What a denial says when it is false.
    #[serde(default)]
    pub message: Option<String>,
}

/// A size in bytes, written as a number or with a binary unit (`512Ki`, `8Mi`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct ByteSize(pub u64);

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = ByteSize;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a size in bytes, or with Ki or Mi (e.g. 8Mi)")
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<ByteSize, E> {
                Ok(ByteSize(v))
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<ByteSize, E> {
                u64::try_from(v)
                    .map(ByteSize)
                    .map_err(|_| E::custom("a size cannot be negative"))
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<ByteSize, E> {
                let t = v.trim();
                let (num, mul) = if let Some(n) = t.strip_suffix("Mi") {
                    (n, 1 << 20)
                } else if let Some(n) = t.strip_suffix("Ki") {
                    (n, 1 << 10)
                } else {
                    (t, 1)
                };
                num.trim()
                    .parse::<u64>()
                    .ok()
                    .and_then(|n| n.checked_mul(mul))
                    .map(ByteSize)
                    .ok_or_else(|| {
                        E::custom(format!("{v:?} is not a size like 8388608, 512Ki or 8Mi"))
                    })
            }
        }
        d.deserialize_any(V)
    }
}
