//! One notation verifier's checks of one envelope, in the Notary Project's
//! order: integrity (always enforced), authenticity (the chain to the trust
//! store of the type the signing scheme needs, and `trustedIdentities`),
//! expiry, authentic timestamp (an RFC 3161 countersignature verified
//! against the `tsa` store, or the chain valid now) and revocation (CRLs
//! from [`crate::crl`], never fetched here). Each failure is enforced,
//! logged or skipped as the verifier's level and overrides say. The binding
//! of the signed digest to the pinned digest is sigil's own rule, always
//! enforced. It does not parse envelopes (the parent module does) or fetch.

use std::sync::Arc;

use sigil_core::SignatureProblem;
use sigil_core::verify::{
    Action, NotationActions, NotationLevel, NotationSpec, NotationStoreType, TrustedIdentity,
    VerifyTimestamp,
};

use super::{Envelope, SIGNING_AUTHORITY};
use crate::crl::{Crls, Lookup};
use crate::keys::{KeyType, PublicKey};
use crate::tsa;
use crate::x509::{self, Eku, RevocationFailure};

/// Distribution points tried per certificate.
const MAX_CDPS: usize = 4;

/// A loaded notation verifier.
#[derive(Debug)]
pub struct NotationCheck {
    /// The trust store (DER): CAs, or signing authorities.
    pub roots: Vec<Vec<u8>>,
    /// What kind of trust store `roots` are.
    pub store: NotationStoreType,
    /// The `tsa` trust store (DER).
    pub tsa_roots: Vec<Vec<u8>>,
    /// Who may have signed.
    pub identities: Vec<TrustedIdentity>,
    /// What each check's failure does.
    pub actions: NotationActions,
    /// When a timestamp countersignature is verified.
    pub verify_timestamp: VerifyTimestamp,
    /// Where CRLs come from (`None`: revocation cannot be known here).
    pub revocation: Option<Arc<Crls>>,
}

impl NotationCheck {
    /// A verifier of `level` over `roots`, trusting any identity, without
    /// a tsa store and with the given CRL source.
    pub fn new(
        roots: Vec<Vec<u8>>,
        level: NotationLevel,
        store: NotationStoreType,
        revocation: Option<Arc<Crls>>,
    ) -> NotationCheck {
        let spec = NotationSpec {
            level,
            ..NotationSpec::default()
        };
        NotationCheck {
            roots,
            store,
            tsa_roots: Vec::new(),
            identities: vec![TrustedIdentity::Any],
            actions: spec.actions(),
            verify_timestamp: VerifyTimestamp::Always,
            revocation,
        }
    }

    /// The verifier a policy's `notation:` entry describes, with its stores loaded.
    pub fn from_spec(
        spec: &NotationSpec,
        roots: Vec<Vec<u8>>,
        tsa_roots: Vec<Vec<u8>>,
        revocation: Option<Arc<Crls>>,
    ) -> Result<NotationCheck, crate::VerifyError> {
        Ok(NotationCheck {
            roots,
            store: spec.trust_store_type,
            tsa_roots,
            identities: spec
                .identities()
                .map_err(crate::VerifyError::NotationIdentity)?,
            actions: spec.actions(),
            verify_timestamp: spec.verify_timestamp,
            revocation,
        })
    }
}

/// The leaf's keyUsage must include digitalSignature (the Notary Project's
/// certificate requirements for signing certificates).
fn digital_signature_usage(leaf: &[u8]) -> Result<(), SignatureProblem> {
    use x509_parser::prelude::{FromDer, X509Certificate};
    let (_, cert) = X509Certificate::from_der(leaf).map_err(|e| SignatureProblem::Malformed {
        detail: format!("signing certificate: {e}"),
    })?;
    let ku = cert.key_usage().map_err(|e| SignatureProblem::Malformed {
        detail: format!("signing certificate keyUsage: {e}"),
    })?;
    match ku {
        Some(ku) if ku.value.digital_signature() => Ok(()),
        Some(_) => Err(SignatureProblem::ChainInvalid {
            detail: "the signing certificate's keyUsage does not include digitalSignature".into(),
        }),
        None => Err(SignatureProblem::ChainInvalid {
            detail: "the signing certificate has no keyUsage (notation requires digitalSignature)"
                .into(),
        }),
    }
}

fn key_fits(alg: &str, kind: KeyType) -> bool {
    matches!(
        (alg, kind),
        ("PS256" | "PS384" | "PS512", KeyType::Rsa)
            | ("ES256", KeyType::P256)
            | ("ES384", KeyType::P384)
            | ("ES512", KeyType::P521)
    )
}

/// The failures the level only logs, collected while the enforced ones stop.
struct Outcome {
    logged: Vec<String>,
}

impl Outcome {
    fn apply(&mut self, action: Action, problem: SignatureProblem) -> Result<(), SignatureProblem> {
        match action {
            Action::Enforce => Err(problem),
            Action::Log => {
                self.logged.push(problem.to_string());
                Ok(())
            }
            Action::Skip => Ok(()),
        }
    }
}

fn timestamp_problem(detail: String) -> SignatureProblem {
    SignatureProblem::LevelCheck {
        detail: format!("authentic timestamp: {detail}"),
    }
}

impl NotationCheck {
    /// Checks one envelope for `digest` at time `now`. `Ok` carries the
    /// failed checks the level only logs.
    pub fn check(
        &self,
        env: &Envelope,
        digest: &str,
        now: i64,
    ) -> Result<Vec<String>, SignatureProblem> {
        // Integrity: always enforced.
        let leaf = env.certs.first().ok_or(SignatureProblem::Malformed {
            detail: "envelope carries no certificate".into(),
        })?;
        let spki = x509::spki(leaf).map_err(SignatureProblem::from)?;
        let key = PublicKey::from_spki(&spki).map_err(|e| SignatureProblem::Malformed {
            detail: e.to_string(),
        })?;
        if !key_fits(&env.alg, key.kind) {
            return Err(SignatureProblem::Malformed {
                detail: format!(
                    "algorithm {} does not fit the certificate's {:?} key",
                    env.alg, key.kind
                ),
            });
        }
        if !key.verify_jose(&env.alg, &env.message, &env.signature) {
            return Err(SignatureProblem::WrongKey);
        }
        if !matches!(env.scheme.as_str(), "notary.x509" | SIGNING_AUTHORITY) {
            return Err(SignatureProblem::Malformed {
                detail: format!("signing scheme {:?} is not supported", env.scheme),
            });
        }
        digital_signature_usage(leaf)?;
        // Binding: sigil's rule, at every level.
        let target = env.target_digest().map_err(SignatureProblem::from)?;
        let a = self.actions;
        let mut out = Outcome { logged: Vec::new() };
        let chain = &env.certs[1..];
        let authority = env.scheme == SIGNING_AUTHORITY;
        // The timestamp countersignature, when it is to be verified: its
        // time is the one the chain must be valid at.
        let valid_now = || x509::verify_chain(leaf, chain, &self.roots, now, Eku::IfPresent);
        let stamp = match (&env.timestamp, authority, self.verify_timestamp) {
            (None, _, _) | (Some(_), true, _) => None,
            (Some(_), false, VerifyTimestamp::AfterCertExpiry) if valid_now().is_ok() => None,
            (Some(t), false, _) => Some(
                tsa::verify_with_store(t, &env.signature, &self.tsa_roots)
                    .map_err(|e| format!("RFC 3161 countersignature: {e}")),
            ),
        };
        let at = match &stamp {
            Some(Ok(s)) => s.time,
            _ => env.signing_time.unwrap_or(now),
        };
        // Authenticity: the store's type, the chain, the identity.
        let store_fits = match self.store {
            NotationStoreType::Ca => !authority,
            NotationStoreType::SigningAuthority => authority,
        };
        let mut trusted = false;
        let mut path_time = at;
        if !store_fits {
            let (need, have) = if authority {
                ("signingAuthority", "ca")
            } else {
                ("ca", "signingAuthority")
            };
            out.apply(
                a.authenticity,
                SignatureProblem::ChainInvalid {
                    detail: format!(
                        "a {} signature is verified only by a trust store of type {need}; these trustRoots are of type {have} (trustStoreType)",
                        env.scheme
                    ),
                },
            )?;
        } else if let Err(e) = x509::verify_chain(leaf, chain, &self.roots, at, Eku::IfPresent) {
            // Authenticity is the chain to the store; whether it was valid
            // when signing is the authentic-timestamp check's. So a chain
            // that leads to the store at a time all its certificates are
            // valid is authentic, and the time is judged below.
            let shape = x509::latest_not_before(&env.certs);
            if x509::verify_chain(leaf, chain, &self.roots, shape, Eku::IfPresent).is_ok() {
                trusted = true;
                path_time = shape;
            } else {
                out.apply(a.authenticity, e.into())?;
            }
        } else {
            trusted = true;
        }
        if !self.identities.contains(&TrustedIdentity::Any) {
            // A subject notation cannot read as identities (an attribute
            // twice) is an authenticity failure like a mismatch.
            let subject = match x509::subject_attributes(leaf) {
                Ok(s) => s,
                Err(e) => {
                    out.apply(a.authenticity, e.into())?;
                    Default::default()
                }
            };
            if !subject.is_empty() && !self.identities.iter().any(|i| i.matches(&subject)) {
                let found: Vec<String> = subject.iter().map(|(k, v)| format!("{k}={v}")).collect();
                out.apply(
                    a.authenticity,
                    SignatureProblem::IdentityMismatch {
                        found: format!(
                            "subject {}, which no trustedIdentities entry matches",
                            found.join(", ")
                        ),
                    },
                )?;
            }
        }
        // Expiry.
        if let Some(exp) = env.expiry
            && now >= exp
        {
            out.apply(
                a.expiry,
                SignatureProblem::LevelCheck {
                    detail: format!("signature expired at Unix time {exp}"),
                },
            )?;
        }
        // Authentic timestamp: the signing authority's authentic signing
        // time, the countersigned time, or (neither) now.
        if trusted && authority {
            if let Err(e) = x509::verify_chain(leaf, chain, &self.roots, at, Eku::IfPresent) {
                out.apply(a.authentic_timestamp, timestamp_problem(e.to_string()))?;
            }
        } else if trusted {
            match &stamp {
                Some(Err(e)) => out.apply(a.authentic_timestamp, timestamp_problem(e.clone()))?,
                Some(Ok(s)) => {
                    for t in [s.time - s.accuracy, s.time + s.accuracy] {
                        if let Err(e) =
                            x509::verify_chain(leaf, chain, &self.roots, t, Eku::IfPresent)
                        {
                            out.apply(
                                a.authentic_timestamp,
                                timestamp_problem(format!(
                                    "the signing chain is not valid at the countersigned time: {e}"
                                )),
                            )?;
                            break;
                        }
                    }
                }
                // Without a countersignature the signing time is only a
                // claim: the chain must still be valid now.
                None => {
                    if let Err(e) = valid_now() {
                        out.apply(a.authentic_timestamp, timestamp_problem(e.to_string()))?;
                    }
                }
            }
        }
        // Revocation: only of a chain that leads to the trust store, so a
        // signer cannot make sigil fetch URLs of its choosing.
        // An untrusted chain's failure is already logged; it fails here
        // only when revocation is enforced.
        if trusted && a.revocation != Action::Skip {
            if let Err(p) = self.revocation(&env.certs, path_time, now) {
                out.apply(a.revocation, p)?;
            }
        } else if a.revocation == Action::Enforce {
            return Err(SignatureProblem::RevocationUnknown {
                detail: "not checked: the chain does not lead to the trust store".into(),
            });
        }
        if target != digest {
            return Err(SignatureProblem::DigestMismatch { signed: target });
        }
        Ok(out.logged)
    }

    /// The signing chain's revocation status from the cached CRLs: every
    /// certificate of the path that verified to the trust store (never
    /// another certificate the envelope carries) with distribution points
    /// needs its issuer's CRL, signed by that issuer.
    fn revocation(&self, certs: &[Vec<u8>], at: i64, now: i64) -> Result<(), SignatureProblem> {
        let unknown = |detail: String| SignatureProblem::RevocationUnknown { detail };
        let path = x509::verified_path(&certs[0], &certs[1..], &self.roots, at).map_err(|e| {
            unknown(format!(
                "the signing chain's path could not be rebuilt: {e}"
            ))
        })?;
        let mut used: Vec<(String, Arc<crate::crl::Crl>)> = Vec::new();
        let mut stale = None;
        // Every certificate's CRLs are looked up (so all are wanted and
        // fetched together), the first unknown reported.
        let mut missing = None;
        for (cert, issuer_key) in &path {
            let urls = x509::crl_urls(cert);
            if urls.is_empty() {
                continue;
            }
            let (issuer, subject) = x509::names(cert).map_err(SignatureProblem::from)?;
            let Some(source) = &self.revocation else {
                return Err(unknown(format!(
                    "{subject} names CRL distribution points and there is no CRL source here"
                )));
            };
            let mut why = Vec::new();
            let mut found = false;
            for url in urls.iter().take(MAX_CDPS) {
                let (crl, is_stale) = match source.lookup_for(url, Some(issuer_key), now) {
                    Lookup::Fresh(c) => (c, false),
                    Lookup::Stale(c) => (c, true),
                    Lookup::Missing(w) => {
                        why.push(format!("CRL {url}: {w}"));
                        continue;
                    }
                };
                if crl.issuer != issuer {
                    why.push(format!(
                        "CRL {url} is issued by another CA than {subject}'s"
                    ));
                    continue;
                }
                if is_stale {
                    stale = Some(format!(
                        "the CRL {url} for {subject} is past its nextUpdate (Unix time {})",
                        crl.next_update
                    ));
                }
                used.push((url.clone(), crl));
                found = true;
                break;
            }
            if !found && missing.is_none() {
                missing = Some(format!("{subject}: {}", why.join("; ")));
            }
        }
        if let Some(m) = missing {
            return Err(unknown(m));
        }
        if used.is_empty() {
            return Ok(());
        }
        let lists: Vec<&webpki::CertRevocationList<'_>> =
            used.iter().map(|(_, c)| &c.list).collect();
        let on_path: Vec<Vec<u8>> = path.iter().skip(1).map(|(c, _)| c.clone()).collect();
        match x509::verify_chain_revocation(&certs[0], &on_path, &self.roots, at, &lists) {
            Ok(()) => stale.map_or(Ok(()), |s| Err(unknown(s))),
            Err(RevocationFailure::Revoked(generic)) => {
                // Name the certificate and the CRL.
                for (cert, _) in &path {
                    let Ok(serial) = x509::serial(cert) else {
                        continue;
                    };
                    for (url, crl) in &used {
                        if let Some(reason) = crl.revoked(&serial) {
                            let subject = x509::names(cert).map(|n| n.1).unwrap_or_default();
                            return Err(SignatureProblem::Revoked {
                                detail: format!(
                                    "{subject} is listed in the CRL {url} (reason: {reason})"
                                ),
                            });
                        }
                    }
                }
                Err(SignatureProblem::Revoked { detail: generic })
            }
            Err(RevocationFailure::Unknown(d)) => Err(unknown(d)),
        }
    }
}
