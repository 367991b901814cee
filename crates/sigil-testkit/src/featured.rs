//! The policy of the benchmarks' features row: every feature of the round
//! at once — two mirrors, an attestation rule (a keyed SLSA v1 provenance
//! with two conditions), a team ImagePolicy and an active exception — over
//! an origin prefix the caller names. The load benchmark serves it from a
//! file to a second `sigil serve`; the handler benchmark decides it
//! in-process. It only writes the policy; pushing or minting what it
//! requires is the caller's.

use std::path::Path;
use std::time::{Duration, UNIX_EPOCH};

/// The repository the provenance names (the first condition's).
pub const REPOSITORY: &str = "https://github.com/acme/api";

/// Where the featured policy applies.
#[derive(Debug, Clone, Copy)]
pub struct Featured<'a> {
    /// `spec.registries` entries (YAML list items, indented four), or "".
    pub registries: &'a str,
    /// The mirrored origin prefix (`host/path`); its images match the rules.
    pub origin: &'a str,
    /// The two mirror prefixes, tried in order.
    pub mirrors: [&'a str; 2],
    /// The namespace of the team policy and the exception.
    pub namespace: &'a str,
    /// The attestor's public key file.
    pub key: &'a Path,
    /// The instant the policy is loaded at (the exception expires a week on).
    pub now: i64,
}

/// The featured policy's documents: ClusterImagePolicy, ImagePolicy,
/// ImagePolicyException.
pub fn featured_policy(f: &Featured) -> String {
    let expires = humantime::format_rfc3339_seconds(
        UNIX_EPOCH + Duration::from_secs((f.now + 7 * 86_400) as u64),
    );
    let Featured {
        registries,
        origin,
        mirrors: [a, b],
        namespace,
        ..
    } = *f;
    let registries = if registries.is_empty() {
        String::new()
    } else {
        format!("  registries:\n{registries}")
    };
    format!(
        r#"apiVersion: sigil.dev/v1alpha1
kind: ClusterImagePolicy
metadata: {{name: platform}}
spec:
{registries}  mirrors:
    - from: "{origin}"
      to: ["{a}", "{b}"]
  rules:
    - {{name: all, match: ["**"], mode: enforce}}
    - name: built-by-ci
      match: ["{origin}/*"]
      exceptions: {{allowed: true, maxDuration: 720h}}
      attestations:
        - name: provenance
          predicateType: slsaprovenance1
          attestors: [{{name: ci, cosign: {{key: "{key}"}}}}]
          conditions:
            - expression: predicate.buildDefinition.externalParameters.workflow.repository == "{REPOSITORY}"
              message: built from acme/api
            - expression: predicate.runDetails.builder.id.startsWith("https://github.com/actions/")
              message: built on GitHub Actions
---
apiVersion: sigil.dev/v1alpha1
kind: ImagePolicy
metadata: {{name: strict, namespace: {namespace}}}
spec:
  defaultAction: deny
  rules:
    - {{name: allow-list, match: ["{origin}/**"]}}
---
apiVersion: sigil.dev/v1alpha1
kind: ImagePolicyException
metadata: {{name: legacy, namespace: {namespace}}}
spec:
  images: ["{origin}/legacy-*"]
  rules: [{{policy: ClusterImagePolicy/platform, rule: built-by-ci}}]
  expires: "{expires}"
  reason: vendor image, provenance pending
"#,
        key = f.key.display()
    )
}
