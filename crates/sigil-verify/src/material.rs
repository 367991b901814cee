//! The trust material a policy names, loaded once per policy load: each
//! rule's verifiers and each attestation entry's attestors (keys, keyless
//! identities with their Fulcio-extension matchers, trusted roots shared
//! between verifiers, notation roots), and the files they read so a
//! watcher can notice a rotation. It checks nothing itself.

use std::collections::HashMap;
use std::sync::Arc;

use sigil_core::Policy;
use sigil_core::Verification;
use sigil_core::verify::{KeyRef, KeySource, NoKeySource, TlogPolicy, VerifierSpec};

use crate::bundle::{self, Matcher};
use crate::cosign::CosignCheck;
use crate::notation::NotationCheck;
use crate::roots::TrustRoots;
use crate::trust::TrustedRoot;
use crate::{VerifyError, keys, x509};

/// One verifier, ready to check signatures.
#[derive(Debug)]
pub enum Check {
    /// A cosign verifier.
    Cosign(CosignCheck),
    /// A notation verifier.
    Notation(NotationCheck),
    /// Trust material named by the policy that is not in force (a
    /// `TrustRoot` not loaded yet, or refused): every check fails with
    /// this reason, and the rest of the policy stays in force.
    Unavailable(String),
}

/// A verifier with its name.
#[derive(Debug)]
pub struct Loaded {
    /// Name from the policy.
    pub name: String,
    /// The check.
    pub check: Check,
}

/// One rule's verifiers and each attestation entry's attestors, loaded.
#[derive(Debug, Default)]
pub struct LoadedSet {
    /// The `verify` entries, in order.
    pub verifiers: Vec<Loaded>,
    /// Per attestation entry, its attestors, in order.
    pub attestors: Vec<Vec<Loaded>>,
}

/// The material of every verifying rule of a policy, loaded once.
#[derive(Debug, Default)]
pub struct Material {
    sets: HashMap<Verification, Arc<LoadedSet>>,
    /// (rule, verifier, why) for every verifier whose material is unavailable.
    unavailable: Vec<(String, String, String)>,
    /// The CRLs its notation verifiers look revocation up in.
    revocation: Arc<crate::crl::Crls>,
}

fn matcher(exact: &Option<String>, re: &Option<String>) -> Result<Matcher, VerifyError> {
    match (exact, re) {
        (Some(e), _) => Ok(Matcher::Exact(e.clone())),
        (None, Some(r)) => sigil_core::verify::identity_regex(r)
            .map(Matcher::Regex)
            .map_err(|e| {
                let shown: String = r.chars().take(64).collect();
                VerifyError::Identity(format!("regex {shown:?}…: {e}"))
            }),
        // Policy validation refuses this; never match anything if it slips through.
        (None, None) => Ok(Matcher::Exact(String::from("\u{0}unset"))),
    }
}

impl Material {
    /// Loads what every rule's `verify` names, with the embedded
    /// public-good root as the default. Fails on the first unreadable file.
    pub fn load(policy: &Policy) -> Result<Material, VerifyError> {
        Material::load_with(policy, &TrustRoots::embedded(), &NoKeySource)
    }

    /// [`Material::load`] with the trusted roots in force (`trust`'s
    /// default is what a verifier naming no trusted root uses) and the
    /// cluster's keys (`keyRef`s: one missing or malformed fails only the
    /// verifiers naming it, with the reason).
    pub fn load_with(
        policy: &Policy,
        trust: &TrustRoots,
        keys: &dyn KeySource,
    ) -> Result<Material, VerifyError> {
        let mut roots: HashMap<Option<String>, Arc<TrustedRoot>> = HashMap::new();
        roots.insert(None, trust.default_root());
        let mut sets = HashMap::new();
        let mut unavailable = Vec::new();
        for (rule, v) in policy.verifications() {
            if sets.contains_key(v.as_ref()) {
                continue;
            }
            let mut load = |specs: &[VerifierSpec]| -> Result<Vec<Loaded>, VerifyError> {
                let mut loaded = Vec::with_capacity(specs.len());
                for spec in specs {
                    let check = load_one(spec, &mut roots, trust, keys).map_err(|e| {
                        VerifyError::Verifier {
                            rule: rule.clone(),
                            verifier: spec.name.clone(),
                            source: Box::new(e),
                        }
                    })?;
                    if let Check::Unavailable(why) = &check {
                        let entry = (rule.clone(), spec.name.clone(), why.clone());
                        if !unavailable.contains(&entry) {
                            unavailable.push(entry);
                        }
                    }
                    loaded.push(Loaded {
                        name: spec.name.clone(),
                        check,
                    });
                }
                Ok(loaded)
            };
            let set = LoadedSet {
                verifiers: load(&v.verifiers)?,
                attestors: v
                    .attestations
                    .iter()
                    .map(|a| load(&a.attestors))
                    .collect::<Result<_, _>>()?,
            };
            sets.insert(v.as_ref().clone(), Arc::new(set));
        }
        Ok(Material {
            sets,
            unavailable,
            revocation: trust.revocation(),
        })
    }

    /// The files the policy's verifiers read (inline PEM excluded), so a
    /// watcher can notice a rotated key or trust root.
    pub fn files(policy: &Policy) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for (_, v) in policy.verifications() {
            let attestors = v.attestations.iter().flat_map(|a| &a.attestors);
            for spec in v.verifiers.iter().chain(attestors) {
                for (_, path) in spec.files() {
                    if !out.iter().any(|o| o == path) {
                        out.push(path.to_owned());
                    }
                }
            }
        }
        out
    }

    /// The `keyRef`s the policy's verifiers name (to watch exactly those).
    pub fn key_refs(policy: &Policy) -> Vec<KeyRef> {
        sigil_core::verify::node_keys::refs_of(policy)
    }

    /// (rule, verifier, why) for each verifier whose trust material is not
    /// available (a `keyRef` or `trustRoot`): they fail every check.
    pub fn unavailable(&self) -> &[(String, String, String)] {
        &self.unavailable
    }

    /// The CRL cache its notation verifiers use.
    pub fn revocation(&self) -> &Arc<crate::crl::Crls> {
        &self.revocation
    }

    /// How many distinct verification requirements were loaded.
    pub fn len(&self) -> usize {
        self.sets.len()
    }

    /// Whether any rule verifies.
    pub fn is_empty(&self) -> bool {
        self.sets.is_empty()
    }

    /// The loaded verifiers and attestors of a rule's verification.
    pub fn get(&self, v: &Verification) -> Option<&Arc<LoadedSet>> {
        self.sets.get(v)
    }
}

/// Why a notation trust store named by `keyRef` is not available now (the
/// verifier fails with it until the object changes).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreUnavailable {
    /// The ConfigMap or Secret is not there, or not readable (the key
    /// source's reason).
    #[error("{0}")]
    KeyRef(String),
    /// It is there and holds no PEM certificate.
    #[error("{0} holds no PEM certificate")]
    NoCertificate(String),
}

/// The certificates of one notation trust store: from `keyRef`s (`Ok(Err)`
/// when one is unavailable: the verifier fails with that reason) and from
/// files or inline PEM (an error: the policy cannot load).
fn store_certs(
    pems: &[String],
    refs: &[KeyRef],
    keys: &dyn KeySource,
) -> Result<Result<Vec<Vec<u8>>, StoreUnavailable>, VerifyError> {
    let mut certs = Vec::new();
    for r in refs {
        let found = match keys.pem(r) {
            Ok(pem) => x509::certs_from_pem(&pem),
            Err(why) => return Ok(Err(StoreUnavailable::KeyRef(why))),
        };
        if found.is_empty() {
            return Ok(Err(StoreUnavailable::NoCertificate(r.to_string())));
        }
        certs.extend(found);
    }
    for r in pems {
        let found = x509::certs_from_pem(&keys::pem_text(r)?);
        if found.is_empty() {
            return Err(VerifyError::Certificate(format!(
                "{} holds no PEM certificate",
                if r.contains("-----BEGIN") {
                    "inline PEM"
                } else {
                    r.as_str()
                }
            )));
        }
        certs.extend(found);
    }
    Ok(Ok(certs))
}

fn load_one(
    spec: &VerifierSpec,
    roots: &mut HashMap<Option<String>, Arc<TrustedRoot>>,
    in_force: &TrustRoots,
    keys: &dyn KeySource,
) -> Result<Check, VerifyError> {
    if let Some(n) = &spec.notation {
        let roots = match store_certs(&n.trust_roots, &n.trust_root_refs, keys)? {
            Ok(c) => c,
            Err(why) => return Ok(Check::Unavailable(why.to_string())),
        };
        let tsa = match store_certs(&n.tsa_roots, &n.tsa_root_refs, keys)? {
            Ok(c) => c,
            Err(why) => return Ok(Check::Unavailable(why.to_string())),
        };
        return NotationCheck::from_spec(n, roots, tsa, Some(in_force.revocation()))
            .map(Check::Notation);
    }
    let Some(c) = &spec.cosign else {
        return Err(VerifyError::Key(
            "verifier has neither cosign nor notation".into(),
        ));
    };
    let named = match &c.trust_root {
        Some(name) => match in_force.get(name) {
            Some(r) => Some(r.root.clone()),
            None => return Ok(Check::Unavailable(in_force.why_not(name))),
        },
        None => None,
    };
    let trust = match (named, roots.get(&c.trusted_root).cloned()) {
        (Some(t), _) | (None, Some(t)) => t,
        (None, None) => {
            let t = Arc::new(match &c.trusted_root {
                Some(path) => TrustedRoot::from_json(
                    &sigil_registry::file::read_text(
                        std::path::Path::new(path.trim()),
                        sigil_registry::file::MAX_CONFIG_BYTES,
                    )
                    .map_err(|e| VerifyError::File {
                        path: path.clone(),
                        detail: e.to_string(),
                    })?,
                )?,
                // Pre-seeded with the roots in force; never reached.
                None => TrustedRoot::public_good()?,
            });
            roots.insert(c.trusted_root.clone(), t.clone());
            t
        }
    };
    // An explicit `transparencyLog: required` means a verified log entry,
    // which a root listing no log can never give: refused here, where the
    // policy author reads it, not at every admission.
    if c.transparency_log == Some(TlogPolicy::Required) && trust.logs.is_empty() {
        return Err(VerifyError::Unsatisfiable(format!(
            "transparencyLog: required, but the trusted root {} lists no transparency log, so no signature could ever satisfy it; leave transparencyLog unset (keyless then requires a signed timestamp from one of the root's timestamp authorities) or set transparencyLog: optional with timestampThreshold: 1",
            match (&c.trust_root, &c.trusted_root) {
                (Some(n), _) => format!("{n:?}"),
                (None, Some(p)) => p.clone(),
                (None, None) => format!("{:?}", crate::roots::DEFAULT),
            }
        )));
    }
    if let Some(r) = &c.key_ref {
        let key = keys.pem(r).and_then(|pem| {
            crate::keys::PublicKey::from_pem(&pem).map_err(|e| format!("{r}: {e}"))
        });
        return Ok(match key {
            Ok(key) => Check::Cosign(CosignCheck::Key {
                key,
                req: requirements(c, TlogPolicy::Optional),
                trust,
            }),
            Err(why) => Check::Unavailable(why),
        });
    }
    Ok(Check::Cosign(match (&c.key, &c.keyless) {
        (Some(k), _) => CosignCheck::Key {
            key: keys::PublicKey::from_pem(&keys::pem_text(k)?)?,
            req: requirements(c, TlogPolicy::Optional),
            trust,
        },
        (None, Some(kl)) => CosignCheck::Keyless {
            issuer: matcher(&kl.issuer, &kl.issuer_regex)?,
            subject: matcher(&kl.subject, &kl.subject_regex)?,
            extensions: kl
                .extensions
                .iter()
                .map(|(n, v)| Ok((n.clone(), Matcher::Exact(v.clone()))))
                .chain(
                    kl.extensions_regex
                        .iter()
                        .map(|(n, r)| Ok((n.clone(), matcher(&None, &Some(r.clone()))?))),
                )
                .collect::<Result<_, VerifyError>>()?,
            req: requirements(c, TlogPolicy::Required),
            trust,
        },
        (None, None) => return Err(VerifyError::Key("cosign needs key or keyless".into())),
    }))
}

/// A cosign verifier's log and timestamp requirements, with cosign's
/// defaults (a log entry for keyless, none for keys; a SET or an inclusion
/// proof; no timestamp authority).
fn requirements(c: &sigil_core::verify::CosignSpec, tlog: TlogPolicy) -> bundle::Requirements {
    bundle::Requirements {
        tlog: c.transparency_log.unwrap_or(tlog),
        inclusion_proof: c.inclusion_proof.unwrap_or(TlogPolicy::Optional),
        timestamps: c.timestamp_threshold.unwrap_or(0),
        tlog_default: c.transparency_log.is_none(),
    }
}
