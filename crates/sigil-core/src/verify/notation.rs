//! A `notation:` verifier as the Notary Project trust policy defines one.
//!
//! Owns the schema (trust stores of type `ca`/`signingAuthority` and `tsa`,
//! `trustedIdentities`, the verification level and its per-check
//! overrides, `verifyTimestamp`), its validation, what each check's failure
//! does under the level ([`NotationActions`]), and the meaning of an
//! `x509.subject:` identity: parsed as the Notary Project specifies it and
//! matched against a signing certificate's subject attributes the way
//! notation-go matches them (every attribute the identity names must be
//! present with that exact value). It reads no certificate: `sigil-verify`
//! reads the subject out of the certificate and asks [`TrustedIdentity::matches`].

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::KeyRef;

/// `notation:`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NotationSpec {
    /// PEM files (or inline PEM) of the CA or signing certificates to trust.
    #[serde(default)]
    pub trust_roots: Vec<String>,
    /// Trust-store certificates from ConfigMaps or Secrets (watched).
    #[serde(default)]
    pub trust_root_refs: Vec<KeyRef>,
    /// Notary Project verification level (default `strict`).
    #[serde(default)]
    pub level: NotationLevel,
    /// Per-check overrides of the level (`override` in notation's trust
    /// policy): `authenticity`, `authenticTimestamp`, `expiry` take
    /// `enforce`/`log`; `revocation` also `skip`. Integrity is never
    /// overridden.
    #[serde(default, rename = "override")]
    pub overrides: NotationOverride,
    /// What `trustRoots` are, as notation types its trust stores: `ca`
    /// (default) verifies `notary.x509` signatures only; `signingAuthority`
    /// verifies only `notary.x509.signingAuthority` signatures, whose
    /// authentic signing time a signing authority vouches for. A `ca` root
    /// never validates a signingAuthority signature (it would let an expired
    /// key keep signing by naming its own signing time).
    #[serde(default)]
    pub trust_store_type: NotationStoreType,
    /// The `tsa` trust store: roots of the timestamp authorities whose
    /// RFC 3161 countersignatures (`notation sign --timestamp-url`) prove
    /// when a signature was made (PEM files or inline PEM).
    #[serde(default)]
    pub tsa_roots: Vec<String>,
    /// `tsa` trust-store certificates from ConfigMaps or Secrets (watched).
    #[serde(default)]
    pub tsa_root_refs: Vec<KeyRef>,
    /// Who may have signed: `["*"]` (any certificate the trust store
    /// issued, the default when empty) or `x509.subject: C=…, ST=…, O=…[, …]`
    /// entries, matched as notation matches them.
    #[serde(default)]
    pub trusted_identities: Vec<String>,
    /// When a timestamp countersignature is verified: `always` (default,
    /// as notation) or `afterCertExpiry` (only once the signing chain has
    /// expired; until then the chain valid now is enough).
    #[serde(default)]
    pub verify_timestamp: VerifyTimestamp,
}

impl NotationSpec {
    /// Every `keyRef` the verifier names (trust store and tsa store).
    pub fn refs(&self) -> impl Iterator<Item = &KeyRef> {
        self.trust_root_refs.iter().chain(self.tsa_root_refs.iter())
    }

    /// [`NotationSpec::refs`], to resolve namespaces.
    pub fn refs_mut(&mut self) -> impl Iterator<Item = &mut KeyRef> {
        self.trust_root_refs
            .iter_mut()
            .chain(self.tsa_root_refs.iter_mut())
    }

    /// What each check's failure does: the level's table with the overrides.
    pub fn actions(&self) -> NotationActions {
        let base = match self.level {
            NotationLevel::Strict => NotationActions {
                authenticity: Action::Enforce,
                authentic_timestamp: Action::Enforce,
                expiry: Action::Enforce,
                revocation: Action::Enforce,
            },
            NotationLevel::Permissive => NotationActions {
                authenticity: Action::Enforce,
                authentic_timestamp: Action::Log,
                expiry: Action::Log,
                revocation: Action::Log,
            },
            NotationLevel::Audit => NotationActions {
                authenticity: Action::Log,
                authentic_timestamp: Action::Log,
                expiry: Action::Log,
                revocation: Action::Log,
            },
        };
        let o = &self.overrides;
        NotationActions {
            authenticity: o.authenticity.unwrap_or(base.authenticity),
            authentic_timestamp: o.authentic_timestamp.unwrap_or(base.authentic_timestamp),
            expiry: o.expiry.unwrap_or(base.expiry),
            revocation: o.revocation.unwrap_or(base.revocation),
        }
    }

    /// The parsed `trustedIdentities` (empty: anyone the store issued).
    pub fn identities(&self) -> Result<Vec<TrustedIdentity>, String> {
        if self.trusted_identities.is_empty() {
            return Ok(vec![TrustedIdentity::Any]);
        }
        let parsed = self
            .trusted_identities
            .iter()
            .map(|s| TrustedIdentity::parse(s))
            .collect::<Result<Vec<_>, _>>()?;
        if parsed.len() > 1 && parsed.contains(&TrustedIdentity::Any) {
            return Err("trustedIdentities: \"*\" must be the only entry".into());
        }
        for (i, a) in parsed.iter().enumerate() {
            for b in &parsed[i + 1..] {
                if let (TrustedIdentity::Subject(x), TrustedIdentity::Subject(y)) = (a, b)
                    && (subset(x, y) || subset(y, x))
                {
                    return Err(format!(
                        "trustedIdentities: {} and {} overlap (one certificate could match both; notation refuses such a policy)",
                        a, b
                    ));
                }
            }
        }
        Ok(parsed)
    }

    /// Checks the overrides and identities (the trust stores are checked
    /// where they are loaded).
    pub fn validate(&self) -> Result<(), String> {
        let o = &self.overrides;
        for (name, a) in [
            ("authenticity", o.authenticity),
            ("authenticTimestamp", o.authentic_timestamp),
            ("expiry", o.expiry),
        ] {
            if a == Some(Action::Skip) {
                return Err(format!(
                    "override.{name}: skip is not allowed (only enforce or log; revocation alone may be skipped)"
                ));
            }
        }
        self.identities().map(|_| ())
    }
}

/// notation's trust store types, as far as `trustRoots` can be one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum NotationStoreType {
    /// Certificate authorities: `notary.x509` signatures.
    #[default]
    Ca,
    /// Signing authorities: `notary.x509.signingAuthority` signatures.
    SigningAuthority,
}

/// Verification levels as the Notary Project trust policy defines them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum NotationLevel {
    /// Every check enforced.
    #[default]
    Strict,
    /// Integrity and authenticity enforced; timestamp, expiry and revocation only logged.
    Permissive,
    /// Only integrity enforced; everything else logged.
    Audit,
}

/// What a failed check does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Action {
    /// The signature does not count.
    Enforce,
    /// The signature counts; the failure is logged (and shown as a warning).
    Log,
    /// Not checked at all (revocation only).
    Skip,
}

/// `override:` — per-check actions replacing the level's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NotationOverride {
    /// The chain to the trust store and the trusted identities.
    #[serde(default)]
    pub authenticity: Option<Action>,
    /// The signing chain valid at the (authentic) signing time.
    #[serde(default)]
    pub authentic_timestamp: Option<Action>,
    /// The signature's own expiry.
    #[serde(default)]
    pub expiry: Option<Action>,
    /// The signing chain's revocation status (CRLs).
    #[serde(default)]
    pub revocation: Option<Action>,
}

/// The action for each check of a verifier, after the overrides.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NotationActions {
    /// Chain to the trust store, trusted identities.
    pub authenticity: Action,
    /// Chain valid at the authentic signing time.
    pub authentic_timestamp: Action,
    /// Signature expiry.
    pub expiry: Action,
    /// Revocation of the signing chain.
    pub revocation: Action,
}

/// `verifyTimestamp:`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum VerifyTimestamp {
    /// A timestamp countersignature is verified whenever present.
    #[default]
    Always,
    /// Only when the signing chain is no longer valid now.
    AfterCertExpiry,
}

/// One `trustedIdentities` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TrustedIdentity {
    /// `*`: any signing certificate the trust store issued.
    Any,
    /// `x509.subject: …`: these attributes of the subject, by short name
    /// (`C`, `ST`, `O`, `OU`, `CN`, …, or a dotted OID), with these values.
    Subject(BTreeMap<String, String>),
}

impl std::fmt::Display for TrustedIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TrustedIdentity::Any => f.write_str("*"),
            TrustedIdentity::Subject(m) => {
                f.write_str("x509.subject: ")?;
                let parts: Vec<String> = m.iter().map(|(k, v)| format!("{k}={v}")).collect();
                f.write_str(&parts.join(", "))
            }
        }
    }
}

/// Whether every attribute of `a` is in `b` with the same value.
fn subset(a: &BTreeMap<String, String>, b: &BTreeMap<String, String>) -> bool {
    a.iter().all(|(k, v)| b.get(k) == Some(v))
}

const SUBJECT_PREFIX: &str = "x509.subject:";

impl TrustedIdentity {
    /// Parses `*` or `x509.subject: C=US, ST=WA, O=acme[, …]` (RFC 4514
    /// escapes; `C`, `ST` and `O` required; one value per attribute).
    pub fn parse(s: &str) -> Result<TrustedIdentity, String> {
        let t = s.trim();
        if t == "*" {
            return Ok(TrustedIdentity::Any);
        }
        let Some(dn) = t.strip_prefix(SUBJECT_PREFIX) else {
            return Err(format!(
                "trustedIdentities: {t:?} is neither \"*\" nor \"{SUBJECT_PREFIX} C=…, ST=…, O=…\""
            ));
        };
        let attrs = parse_dn(dn).map_err(|e| format!("trustedIdentities: {t:?}: {e}"))?;
        for need in ["C", "ST", "O"] {
            if !attrs.contains_key(need) {
                return Err(format!(
                    "trustedIdentities: {t:?} must name C, ST and O (the Notary Project's minimum); {need} is missing"
                ));
            }
        }
        Ok(TrustedIdentity::Subject(attrs))
    }

    /// Whether a signing certificate with these subject attributes matches.
    pub fn matches(&self, subject: &BTreeMap<String, String>) -> bool {
        match self {
            TrustedIdentity::Any => true,
            TrustedIdentity::Subject(want) => subset(want, subject),
        }
    }
}

/// An RFC 4514 distinguished name as notation reads one: comma-separated
/// `TYPE=value` pairs, no multi-valued RDNs, no attribute twice. Types are
/// compared case-insensitively (kept upper-case); values exactly.
pub fn parse_dn(dn: &str) -> Result<BTreeMap<String, String>, String> {
    let mut out = BTreeMap::new();
    let mut chars = dn.chars().peekable();
    loop {
        // Attribute type.
        let mut ty = String::new();
        for c in chars.by_ref() {
            if c == '=' {
                break;
            }
            ty.push(c);
        }
        let ty = ty.trim().to_ascii_uppercase();
        if ty.is_empty()
            || !ty
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '.' || c == '-')
        {
            return Err(format!("attribute type {ty:?} is not valid"));
        }
        // Value, with escapes; ends at an unescaped ',' or ';'.
        let mut value = String::new();
        let mut trailing_escaped = 0usize;
        let mut ended = false;
        while let Some(c) = chars.next() {
            match c {
                '\\' => {
                    let n = chars.next().ok_or("a value ends with a lone backslash")?;
                    if n.is_ascii_hexdigit() {
                        let m = chars
                            .next()
                            .filter(char::is_ascii_hexdigit)
                            .ok_or("a \\XX escape needs two hex digits")?;
                        let byte = u8::from_str_radix(&format!("{n}{m}"), 16)
                            .map_err(|e| e.to_string())?;
                        value.push(char::from(byte));
                    } else {
                        value.push(n);
                    }
                    trailing_escaped = value.len();
                }
                ',' | ';' => {
                    ended = true;
                    break;
                }
                '+' => return Err(format!("multi-valued RDNs ({ty}+…) are not supported")),
                // Unescaped leading spaces are not part of the value.
                ' ' if value.is_empty() => {}
                c => value.push(c),
            }
        }
        // Unescaped surrounding spaces are not part of the value.
        let keep = value.trim_end().len().max(trailing_escaped);
        value.truncate(keep);
        if out.insert(ty.clone(), value).is_some() {
            return Err(format!("attribute {ty} appears twice"));
        }
        if !ended {
            break;
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dn(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn subjects_parse_as_notation_writes_them() {
        let id = TrustedIdentity::parse(
            "x509.subject: C=US, ST=WA, L=Seattle, O=wabbit-networks.io, OU=Finance\\, Ops, CN=SecureBuilder",
        )
        .unwrap();
        let TrustedIdentity::Subject(m) = &id else {
            panic!()
        };
        assert_eq!(m["OU"], "Finance, Ops");
        assert_eq!(m["L"], "Seattle");
        assert!(id.matches(&dn(&[
            ("C", "US"),
            ("ST", "WA"),
            ("L", "Seattle"),
            ("O", "wabbit-networks.io"),
            ("OU", "Finance, Ops"),
            ("CN", "SecureBuilder"),
            ("SERIALNUMBER", "7"),
        ])));
        assert_eq!(parse_dn("c=US,st=\\ WA ,o=x").unwrap()["ST"], " WA");
        assert_eq!(parse_dn("C=U\\53").unwrap()["C"], "US");
    }

    #[test]
    fn a_subject_matches_only_with_every_attribute_it_names() {
        let id = TrustedIdentity::parse("x509.subject: C=US, ST=WA, O=acme, CN=release").unwrap();
        assert!(!id.matches(&dn(&[("C", "US"), ("ST", "WA"), ("O", "acme")])));
        assert!(!id.matches(&dn(&[
            ("C", "US"),
            ("ST", "WA"),
            ("O", "acme"),
            ("CN", "Release")
        ])));
        assert!(TrustedIdentity::Any.matches(&BTreeMap::new()));
    }

    #[test]
    fn identities_notation_refuses_are_refused() {
        for (bad, why) in [
            ("x509.subject: C=US, O=acme", "ST is missing"),
            ("x509.subject: C=US, ST=WA, O=a, O=b", "appears twice"),
            ("x509.subject: C=US+ST=WA, O=a", "multi-valued"),
            ("subject: C=US, ST=WA, O=a", "neither"),
            ("x509.subject: C=US, ST=WA, O=a\\", "lone backslash"),
            ("x509.subject: =US, ST=WA, O=a", "not valid"),
        ] {
            let e = TrustedIdentity::parse(bad).unwrap_err();
            assert!(e.contains(why), "{bad}: {e}");
        }
        let spec = |ids: &[&str]| NotationSpec {
            trusted_identities: ids.iter().map(|s| (*s).to_owned()).collect(),
            ..NotationSpec::default()
        };
        let e = spec(&["*", "x509.subject: C=US, ST=WA, O=a"])
            .validate()
            .unwrap_err();
        assert!(e.contains("only entry"), "{e}");
        let e = spec(&[
            "x509.subject: C=US, ST=WA, O=a",
            "x509.subject: C=US, ST=WA, O=a, OU=b",
        ])
        .validate()
        .unwrap_err();
        assert!(e.contains("overlap"), "{e}");
        assert_eq!(spec(&[]).identities().unwrap(), vec![TrustedIdentity::Any]);
    }

    #[test]
    fn a_team_verifiers_tsa_store_refs_are_confined_to_its_namespace_too() {
        let r = |ns: Option<&str>| KeyRef {
            config_map: Some("tsa".into()),
            secret: None,
            key: "root.crt".into(),
            namespace: ns.map(str::to_owned),
        };
        let mut v = crate::verify::VerifierSpec {
            name: "release".into(),
            cosign: None,
            notation: Some(NotationSpec {
                tsa_root_refs: vec![r(None)],
                ..NotationSpec::default()
            }),
        };
        crate::verify::keyref::confine(&mut v, "team-a").unwrap();
        let n = v.notation.as_ref().unwrap();
        assert_eq!(n.tsa_root_refs[0].namespace.as_deref(), Some("team-a"));
        assert_eq!(n.refs().count(), 1);
        v.notation.as_mut().unwrap().tsa_root_refs = vec![r(Some("kube-system"))];
        let e = crate::verify::keyref::confine(&mut v, "team-a").unwrap_err();
        assert!(e.contains("kube-system"), "{e}");
    }

    #[test]
    fn levels_and_overrides_give_each_check_its_action() {
        let mut s = NotationSpec::default();
        assert_eq!(s.actions().revocation, Action::Enforce);
        s.level = NotationLevel::Permissive;
        assert_eq!(s.actions().authenticity, Action::Enforce);
        assert_eq!(s.actions().revocation, Action::Log);
        s.overrides.revocation = Some(Action::Skip);
        s.overrides.expiry = Some(Action::Enforce);
        assert_eq!(s.actions().revocation, Action::Skip);
        assert_eq!(s.actions().expiry, Action::Enforce);
        assert!(s.validate().is_ok());
        s.overrides.authenticity = Some(Action::Skip);
        assert!(s.validate().unwrap_err().contains("authenticity"));
        let e = serde_json::from_str::<NotationSpec>(
            r#"{"trustRoots":["x"],"override":{"integrity":"log"}}"#,
        )
        .unwrap_err();
        assert!(e.to_string().contains("integrity"), "{e}");
    }
}
