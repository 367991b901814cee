//! Validating a rule's `verify` section into a [`Verification`]: names,
//! exactly one kind per verifier, keyless identities and Fulcio-extension
//! matchers, thresholds, the signatures repository, bounded regexes. Every
//! refusal names the rule and the verifier.

use super::{AttestationRequirement, CosignSpec, SignaturesSpec, Verification, VerifierSpec};

/// The Fulcio certificate extensions a keyless verifier (and a condition's
/// `signer`) can name, as Fulcio's documentation names them.
pub const FULCIO_EXTENSION_NAMES: &[&str] = &[
    "issuerV1",
    "githubWorkflowTrigger",
    "githubWorkflowSha",
    "githubWorkflowName",
    "githubWorkflowRepository",
    "githubWorkflowRef",
    "issuer",
    "buildSignerUri",
    "buildSignerDigest",
    "runnerEnvironment",
    "sourceRepositoryUri",
    "sourceRepositoryDigest",
    "sourceRepositoryRef",
    "sourceRepositoryIdentifier",
    "sourceRepositoryOwnerUri",
    "sourceRepositoryOwnerIdentifier",
    "buildConfigUri",
    "buildConfigDigest",
    "buildTrigger",
    "runInvocationUri",
    "sourceRepositoryVisibilityAtSigning",
];

impl Verification {
    /// Validates a rule's verify section. `Err` carries the message for the policy error.
    pub fn compile(
        rule: &str,
        verifiers: &[VerifierSpec],
        threshold: Option<u32>,
        required: &[String],
        signatures: Option<&SignaturesSpec>,
    ) -> Result<Verification, String> {
        let mut names = std::collections::HashSet::new();
        for v in verifiers {
            if v.name.trim().is_empty() {
                return Err(format!("rule {rule:?}: a verifier has an empty name"));
            }
            if !names.insert(v.name.as_str()) {
                return Err(format!(
                    "rule {rule:?}: verifier {:?} is listed twice",
                    v.name
                ));
            }
            match (&v.cosign, &v.notation) {
                (Some(c), None) => check_cosign(rule, &v.name, c)?,
                (None, Some(n)) => {
                    if n.trust_roots.is_empty() && n.trust_root_refs.is_empty() {
                        return Err(format!(
                            "rule {rule:?}: verifier {:?}: notation.trustRoots or trustRootRefs must name at least one certificate",
                            v.name
                        ));
                    }
                    for r in n.refs() {
                        r.validate()
                            .map_err(|e| format!("rule {rule:?}: verifier {:?}: {e}", v.name))?;
                    }
                    n.validate()
                        .map_err(|e| format!("rule {rule:?}: verifier {:?}: {e}", v.name))?;
                }
                _ => {
                    return Err(format!(
                        "rule {rule:?}: verifier {:?} must have exactly one of cosign or notation",
                        v.name
                    ));
                }
            }
        }
        let threshold = match threshold {
            None => verifiers.len(),
            Some(0) => {
                return Err(format!(
                    "rule {rule:?}: threshold must be at least 1 (remove verify to skip verification)"
                ));
            }
            Some(t) if t as usize > verifiers.len() => {
                return Err(format!(
                    "rule {rule:?}: threshold {t} exceeds the {} verifiers listed",
                    verifiers.len()
                ));
            }
            Some(t) => t as usize,
        };
        for r in required {
            if !names.contains(r.as_str()) {
                return Err(format!(
                    "rule {rule:?}: required verifier {r:?} is not in verify (have: {})",
                    verifiers
                        .iter()
                        .map(|v| v.name.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ));
            }
        }
        let signatures_repository = match signatures.and_then(|s| s.repository.as_deref()) {
            None => None,
            Some(r) => {
                let parsed = crate::Reference::parse(r.trim()).map_err(|e| {
                    format!(
                        "rule {rule:?}: signatures.repository {r:?} is not a repository name: {e}"
                    )
                })?;
                if parsed.digest().is_some() || parsed.tag().is_some() {
                    return Err(format!(
                        "rule {rule:?}: signatures.repository {r:?} must be a repository, without tag or digest"
                    ));
                }
                Some(parsed)
            }
        };
        let signed_at = signatures.and_then(|s| s.signed_at).unwrap_or_default();
        if signed_at.reads_platforms() && verifiers.is_empty() {
            return Err(format!(
                "rule {rule:?}: signatures.signedAt: {} needs a verify list (attestations are checked on the digest pinned)",
                signed_at.as_str()
            ));
        }
        Ok(Verification {
            verifiers: verifiers.to_vec(),
            threshold,
            required: required.to_vec(),
            signatures_repository,
            signed_at,
            attestations: Vec::new(),
            fingerprint: 0,
        }
        .seal())
    }

    /// The same requirement with `attestations`.
    pub fn with_attestations(mut self, attestations: Vec<AttestationRequirement>) -> Verification {
        self.attestations = attestations;
        self.seal()
    }

    /// Computes the fingerprint the cache hashes.
    fn seal(mut self) -> Verification {
        use std::hash::{Hash, Hasher};
        let mut h = std::hash::DefaultHasher::new();
        (
            &self.verifiers,
            self.threshold,
            &self.required,
            &self.signatures_repository,
            self.signed_at,
            &self.attestations,
        )
            .hash(&mut h);
        self.fingerprint = h.finish();
        self
    }
}

fn check_cosign(rule: &str, name: &str, c: &CosignSpec) -> Result<(), String> {
    if c.timestamp_threshold.is_some_and(|t| t > 10) {
        return Err(format!(
            "rule {rule:?}: verifier {name:?}: timestampThreshold must be at most 10"
        ));
    }
    if c.trusted_root.is_some() && c.trust_root.is_some() {
        return Err(format!(
            "rule {rule:?}: verifier {name:?}: give trustedRoot (a file) or trustRoot (a TrustRoot by name), not both"
        ));
    }
    if let Some(t) = &c.trust_root
        && !is_object_name(t)
    {
        return Err(format!(
            "rule {rule:?}: verifier {name:?}: trustRoot {t:?} is not a Kubernetes object name (lower case letters, digits, '-' and '.', at most 253)"
        ));
    }
    if let Some(r) = &c.key_ref {
        r.validate()
            .map_err(|e| format!("rule {rule:?}: verifier {name:?}: {e}"))?;
    }
    let key = match (&c.key, &c.key_ref) {
        (Some(_), Some(_)) => {
            return Err(format!(
                "rule {rule:?}: verifier {name:?}: give key or keyRef, not both"
            ));
        }
        (k, r) => k.is_some() || r.is_some(),
    };
    match (key, &c.keyless) {
        (true, None) => Ok(()),
        (false, Some(k)) => {
            let pairs = [
                ("issuer", &k.issuer, &k.issuer_regex),
                ("subject", &k.subject, &k.subject_regex),
            ];
            for (what, exact, re) in pairs {
                match (exact, re) {
                    (Some(_), Some(_)) => {
                        return Err(format!(
                            "rule {rule:?}: verifier {name:?}: give {what} or {what}Regex, not both"
                        ));
                    }
                    (None, None) => {
                        return Err(format!(
                            "rule {rule:?}: verifier {name:?}: keyless needs {what} or {what}Regex (an unconstrained identity would accept anyone's certificate)"
                        ));
                    }
                    (None, Some(r)) => {
                        identity_regex(r).map_err(|e| {
                            format!("rule {rule:?}: verifier {name:?}: {what}Regex: {e}")
                        })?;
                    }
                    (Some(_), None) => {}
                }
            }
            for ext in k.extensions.keys().chain(k.extensions_regex.keys()) {
                if !FULCIO_EXTENSION_NAMES.contains(&ext.as_str()) {
                    return Err(format!(
                        "rule {rule:?}: verifier {name:?}: {ext:?} is not a Fulcio certificate extension (one of {})",
                        FULCIO_EXTENSION_NAMES.join(", ")
                    ));
                }
            }
            for (ext, r) in &k.extensions_regex {
                identity_regex(r).map_err(|e| {
                    format!("rule {rule:?}: verifier {name:?}: extensionsRegex.{ext}: {e}")
                })?;
            }
            Ok(())
        }
        _ => Err(format!(
            "rule {rule:?}: verifier {name:?}: cosign needs exactly one of key, keyRef or keyless"
        )),
    }
}

/// A DNS-1123 subdomain, as Kubernetes names cluster-scoped objects.
fn is_object_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
        && s.starts_with(|c: char| c.is_ascii_alphanumeric())
        && s.ends_with(|c: char| c.is_ascii_alphanumeric())
}

/// Longest identity regex accepted (`subjectRegex`, `issuerRegex`): real
/// ones are tens of bytes; a megabyte one cost seconds and gigabytes to
/// compile on every reload before it was refused.
pub const MAX_REGEX_BYTES: usize = 4096;
/// Compiled size limit of an identity regex (the regex crate's own limits).
const MAX_REGEX_COMPILED: usize = 1 << 20;

/// Compiles an identity regex within [`MAX_REGEX_BYTES`] and a bounded
/// compiled size, refusing anything larger up front with a clear error.
pub fn identity_regex(pattern: &str) -> Result<regex::Regex, String> {
    if pattern.len() > MAX_REGEX_BYTES {
        return Err(format!(
            "the pattern is {} bytes; at most {MAX_REGEX_BYTES} are allowed",
            pattern.len()
        ));
    }
    regex::RegexBuilder::new(pattern)
        .size_limit(MAX_REGEX_COMPILED)
        .dfa_size_limit(MAX_REGEX_COMPILED)
        .build()
        .map_err(|e| e.to_string())
}
