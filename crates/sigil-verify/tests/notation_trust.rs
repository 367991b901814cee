//! notation's trust policy as the Notary Project specifies it: trusted
//! identities, RFC 3161 timestamp countersignatures against a `tsa` store,
//! and revocation by CRLs (from a cache, then from a CA's CRL server on
//! loopback: a revoked leaf, a revoked intermediate, a stale CRL, an
//! unreachable distribution point), each under the levels and overrides.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use rcgen::DnType;
use serde_json::json;
use sigil_core::SignatureProblem;
use sigil_core::verify::{Action, NotationLevel, NotationSpec, VerifyTimestamp};
use sigil_testkit::pki::{Ca, Issued};
use sigil_testkit::signing::{Countersign, notation_jws_chain};
use sigil_testkit::sigstore::Sigstore;
use sigil_testkit::tuf::StaticServer;
use sigil_verify::crl::{Crl, Crls, Lookup};
use sigil_verify::notation::{Envelope, NotationCheck};

const DIGEST: &str = "sha256:a136cc4e785798e5e8483047cf621cf0a0300a93d47703a3f066c340c070f5cf";
const NOW: i64 = 1_795_000_000;
/// 2020-01-01 .. 2021-01-01.
const Y2020: (i64, i64) = (1_577_836_800, 1_609_459_200);
const JUNE_2020: i64 = 1_590_969_600;

const SUBJECT: &[(DnType, &str)] = &[
    (DnType::CountryName, "US"),
    (DnType::StateOrProvinceName, "WA"),
    (DnType::OrganizationName, "acme"),
    (DnType::CommonName, "release"),
];

/// A root, an intermediate naming the root's CRL, and a signer naming the
/// intermediate's CRL.
struct Pki {
    root: Ca,
    inter: Ca,
    leaf: Issued,
    root_crl: String,
    inter_crl: String,
}

impl Pki {
    fn new(base: &str, validity: Option<(i64, i64)>) -> Pki {
        let root_crl = format!("{base}root.crl");
        let inter_crl = format!("{base}inter.crl");
        let root = Ca::root("test root");
        let inter = root.intermediate("test intermediate", Some(&root_crl));
        let leaf = inter.leaf(SUBJECT, Some(&inter_crl), validity);
        Pki {
            root,
            inter,
            leaf,
            root_crl,
            inter_crl,
        }
    }

    fn envelope(&self, signing_time: &str, stamp: Option<Countersign<'_>>) -> Envelope {
        let bytes = notation_jws_chain(
            &self.leaf.key,
            "ES256",
            &[self.leaf.der.clone(), self.inter.der.clone()],
            DIGEST,
            1,
            json!({"io.cncf.notary.signingTime": signing_time}),
            stamp,
        );
        Envelope::from_jws(&bytes).unwrap()
    }

    fn check(
        &self,
        spec: &NotationSpec,
        tsa: Vec<Vec<u8>>,
        crls: Option<Arc<Crls>>,
    ) -> NotationCheck {
        NotationCheck::from_spec(spec, vec![self.root.der.clone()], tsa, crls).unwrap()
    }

    /// CRLs for both CAs, listing `revoked`, valid from `from` to `until`.
    fn crls(&self, revoked: &[u64], from: i64, until: i64) -> (Vec<u8>, Vec<u8>) {
        (
            self.root.crl(revoked, from, until),
            self.inter.crl(revoked, from, until),
        )
    }

    fn cache(&self, revoked: &[u64], from: i64, until: i64) -> Arc<Crls> {
        let c = Arc::new(loopback_crls());
        let (r, i) = self.crls(revoked, from, until);
        c.insert(&self.root_crl, Crl::parse(&r).unwrap(), NOW);
        c.insert(&self.inter_crl, Crl::parse(&i).unwrap(), NOW);
        c
    }
}

/// A CRL cache whose fetches may reach the test's CRL servers on loopback
/// (refused by default: docs/security.md).
fn loopback_crls() -> Crls {
    Crls::with_allowed(vec!["127.0.0.0/8".parse().unwrap()])
}

fn spec(level: NotationLevel) -> NotationSpec {
    NotationSpec {
        level,
        trust_roots: vec!["(loaded by the test)".into()],
        ..NotationSpec::default()
    }
}

fn fresh(pki: &Pki, revoked: &[u64]) -> Arc<Crls> {
    pki.cache(revoked, NOW - 3600, NOW + 86_400)
}

const NOW_RFC3339: &str = "2026-11-19T03:06:40Z";

#[test]
fn trusted_identities_match_the_signing_certificates_subject_as_notation_does() {
    let pki = Pki::new("http://ca.test/", None);
    let env = pki.envelope(NOW_RFC3339, None);
    let crls = Some(fresh(&pki, &[]));
    let mut s = spec(NotationLevel::Strict);
    for ok in [
        vec!["*"],
        vec!["x509.subject: C=US, ST=WA, O=acme"],
        vec![
            "x509.subject: C=US, ST=WA, O=other",
            "x509.subject: O=acme, ST=WA, C=US, CN=release",
        ],
    ] {
        s.trusted_identities = ok.iter().map(|x| (*x).to_owned()).collect();
        assert_eq!(
            pki.check(&s, vec![], crls.clone()).check(&env, DIGEST, NOW),
            Ok(vec![]),
            "{ok:?}"
        );
    }
    s.trusted_identities = vec!["x509.subject: C=US, ST=WA, O=acme, CN=nightly".into()];
    let e = pki
        .check(&s, vec![], crls.clone())
        .check(&env, DIGEST, NOW)
        .unwrap_err();
    assert!(
        matches!(&e, SignatureProblem::IdentityMismatch { found } if found.contains("CN=release")),
        "{e}"
    );
    // Authenticity logged (audit, or an override): the mismatch is logged.
    s.overrides.authenticity = Some(Action::Log);
    let logged = pki
        .check(&s, vec![], crls)
        .check(&env, DIGEST, NOW)
        .unwrap();
    assert!(logged[0].contains("identity mismatch"), "{logged:?}");
}

#[test]
fn a_timestamp_countersignature_keeps_a_signature_whose_certificate_expired_valid() {
    let pki = Pki::new("http://ca.test/", Some(Y2020));
    let tsa = Sigstore::new();
    let tsa = &tsa;
    let stamp_at = |at: i64| move |sig: &[u8]| tsa.timestamp(sig, at, true, None);
    let crls = Some(fresh(&pki, &[]));
    let strict = spec(NotationLevel::Strict);
    let stores = vec![tsa.tsa_root.clone()];
    // Countersigned in June 2020, while the certificate was valid.
    let june = stamp_at(JUNE_2020);
    let env = pki.envelope("2020-06-01T00:00:00Z", Some(&june));
    assert_eq!(
        pki.check(&strict, stores.clone(), crls.clone())
            .check(&env, DIGEST, NOW),
        Ok(vec![])
    );
    // Without a tsa store the countersignature cannot be verified.
    let e = pki
        .check(&strict, vec![], crls.clone())
        .check(&env, DIGEST, NOW)
        .unwrap_err();
    assert!(e.to_string().contains("no tsa trust store"), "{e}");
    // Countersigned after the certificate expired.
    let late = stamp_at(Y2020.1 + 86_400);
    let env_late = pki.envelope("2020-06-01T00:00:00Z", Some(&late));
    let e = pki
        .check(&strict, stores.clone(), crls.clone())
        .check(&env_late, DIGEST, NOW)
        .unwrap_err();
    assert!(
        e.to_string()
            .contains("not valid at the countersigned time"),
        "{e}"
    );
    // No countersignature: the claimed signing time proves nothing.
    let bare = pki.envelope("2020-06-01T00:00:00Z", None);
    let e = pki
        .check(&strict, stores.clone(), crls.clone())
        .check(&bare, DIGEST, NOW)
        .unwrap_err();
    assert!(e.to_string().starts_with("authentic timestamp"), "{e}");
    // A countersignature by an untrusted TSA, or over another signature.
    let other = Sigstore::new();
    let forged = move |sig: &[u8]| other.timestamp(sig, JUNE_2020, true, None);
    let env_forged = pki.envelope("2020-06-01T00:00:00Z", Some(&forged));
    let e = pki
        .check(&strict, stores.clone(), crls.clone())
        .check(&env_forged, DIGEST, NOW)
        .unwrap_err();
    assert!(e.to_string().contains("RFC 3161"), "{e}");
    let elsewhere = |_: &[u8]| tsa.timestamp(b"another signature", JUNE_2020, true, None);
    let env_moved = pki.envelope("2020-06-01T00:00:00Z", Some(&elsewhere));
    let e = pki
        .check(&strict, stores.clone(), crls.clone())
        .check(&env_moved, DIGEST, NOW)
        .unwrap_err();
    assert!(e.to_string().contains("not over this signature"), "{e}");
    // Permissive logs the timestamp failure.
    let logged = pki
        .check(&spec(NotationLevel::Permissive), stores, crls)
        .check(&env_late, DIGEST, NOW)
        .unwrap();
    assert!(logged[0].starts_with("authentic timestamp"), "{logged:?}");
}

#[test]
fn after_cert_expiry_verifies_the_timestamp_only_once_the_chain_has_expired() {
    let pki = Pki::new("http://ca.test/", None);
    let crls = Some(fresh(&pki, &[]));
    let other = Sigstore::new();
    let untrusted = move |sig: &[u8]| other.timestamp(sig, JUNE_2020, true, None);
    let env = pki.envelope(NOW_RFC3339, Some(&untrusted));
    let mut s = spec(NotationLevel::Strict);
    assert!(
        pki.check(&s, vec![], crls.clone())
            .check(&env, DIGEST, NOW)
            .is_err()
    );
    s.verify_timestamp = VerifyTimestamp::AfterCertExpiry;
    assert_eq!(
        pki.check(&s, vec![], crls).check(&env, DIGEST, NOW),
        Ok(vec![])
    );
}

#[test]
fn revocation_follows_the_crls_of_the_signing_chain() {
    let pki = Pki::new("http://ca.test/", None);
    let env = pki.envelope(NOW_RFC3339, None);
    let strict = spec(NotationLevel::Strict);
    // Not revoked.
    assert_eq!(
        pki.check(&strict, vec![], Some(fresh(&pki, &[])))
            .check(&env, DIGEST, NOW),
        Ok(vec![])
    );
    // A revoked leaf, a revoked intermediate.
    for (serial, who) in [
        (pki.leaf.serial, "CN=release"),
        (pki.inter.serial, "CN=test intermediate"),
    ] {
        let e = pki
            .check(&strict, vec![], Some(fresh(&pki, &[serial])))
            .check(&env, DIGEST, NOW)
            .unwrap_err();
        assert!(
            matches!(&e, SignatureProblem::Revoked { detail } if detail.contains(who) && detail.contains("KeyCompromise")),
            "{e}"
        );
        // Permissive logs it; an override skips it.
        let logged = pki
            .check(
                &spec(NotationLevel::Permissive),
                vec![],
                Some(fresh(&pki, &[serial])),
            )
            .check(&env, DIGEST, NOW)
            .unwrap();
        assert!(logged[0].starts_with("revoked:"), "{logged:?}");
        let mut skip = spec(NotationLevel::Strict);
        skip.overrides.revocation = Some(Action::Skip);
        assert_eq!(
            pki.check(&skip, vec![], Some(fresh(&pki, &[serial])))
                .check(&env, DIGEST, NOW),
            Ok(vec![])
        );
    }
}

#[test]
fn a_stale_or_missing_or_foreign_crl_leaves_revocation_unknown() {
    let pki = Pki::new("http://ca.test/", None);
    let env = pki.envelope(NOW_RFC3339, None);
    let strict = spec(NotationLevel::Strict);
    // Past its nextUpdate: unknown, unless it lists the certificate.
    let stale = pki.cache(&[], NOW - 7200, NOW - 3600);
    let e = pki
        .check(&strict, vec![], Some(stale))
        .check(&env, DIGEST, NOW)
        .unwrap_err();
    assert!(
        matches!(&e, SignatureProblem::RevocationUnknown { detail } if detail.contains("past its nextUpdate")),
        "{e}"
    );
    let stale_listing = pki.cache(&[pki.leaf.serial], NOW - 7200, NOW - 3600);
    let e = pki
        .check(&strict, vec![], Some(stale_listing))
        .check(&env, DIGEST, NOW)
        .unwrap_err();
    assert!(matches!(e, SignatureProblem::Revoked { .. }), "{e}");
    // Never fetched: unknown, and the URL is now wanted.
    let empty = Arc::new(loopback_crls());
    let e = pki
        .check(&strict, vec![], Some(empty.clone()))
        .check(&env, DIGEST, NOW)
        .unwrap_err();
    assert!(e.to_string().contains("not fetched yet"), "{e}");
    assert!(matches!(
        empty.lookup(&pki.inter_crl, NOW),
        Lookup::Missing(_)
    ));
    // A CRL at the distribution point from another CA speaks for nobody here.
    let foreign = Arc::new(loopback_crls());
    let other = Ca::root("someone else");
    foreign.insert(
        &pki.inter_crl,
        Crl::parse(&other.crl(&[], NOW - 60, NOW + 3600)).unwrap(),
        NOW,
    );
    let (root_crl, _) = pki.crls(&[], NOW - 60, NOW + 3600);
    foreign.insert(&pki.root_crl, Crl::parse(&root_crl).unwrap(), NOW);
    let e = pki
        .check(&strict, vec![], Some(foreign))
        .check(&env, DIGEST, NOW)
        .unwrap_err();
    assert!(e.to_string().contains("issued by another CA"), "{e}");
    // A report with unknown revocation is never cached as definite.
    let unknown = SignatureProblem::RevocationUnknown {
        detail: String::new(),
    };
    assert_eq!(unknown.kind(), "revocation_unknown");
}

#[tokio::test]
async fn crls_come_from_the_distribution_points_and_outages_keep_the_last_one() {
    let dir = tempfile::tempdir().unwrap();
    let server = StaticServer::start(dir.path().to_path_buf()).await;
    let pki = Pki::new(&server.url(), None);
    let now = time::OffsetDateTime::now_utc().unix_timestamp();
    let env = pki.envelope(NOW_RFC3339, None);
    let strict = spec(NotationLevel::Strict);
    let write = |revoked: &[u64], until: i64| {
        let (r, i) = pki.crls(revoked, now - 60, until);
        std::fs::write(dir.path().join("root.crl"), r).unwrap();
        std::fs::write(dir.path().join("inter.crl"), i).unwrap();
    };
    write(&[], now + 3600);
    // The background fetcher: a lookup wakes it; the CRLs are in within seconds.
    let crls = Arc::new(loopback_crls());
    crls.start(Duration::from_secs(3600));
    let check = pki.check(&strict, vec![], Some(crls.clone()));
    assert!(
        check.check(&env, DIGEST, now).is_err(),
        "nothing fetched yet"
    );
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while check.check(&env, DIGEST, now).is_err() {
        assert!(tokio::time::Instant::now() < deadline, "CRLs never fetched");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The server goes dark: the CRLs fetched stay in force.
    drop(server);
    let one_shot = loopback_crls();
    for url in [&pki.root_crl, &pki.inter_crl] {
        assert!(matches!(one_shot.lookup(url, now), Lookup::Missing(_)));
    }
    assert_eq!(one_shot.fetch_due(now).await, 2);
    let Lookup::Missing(why) = one_shot.lookup(&pki.inter_crl, now) else {
        panic!("fetched from a closed port")
    };
    assert!(why.contains("not available"), "{why}");
    assert!(
        crls.fetch_due(now + 86_400 * 2).await >= 1,
        "due again after a day"
    );
    assert_eq!(
        check.check(&env, DIGEST, now),
        Ok(vec![]),
        "last good CRL kept"
    );
}

#[tokio::test]
async fn an_unreachable_distribution_point_follows_the_level() {
    // A port nothing listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let pki = Pki::new(&format!("http://127.0.0.1:{port}/"), None);
    let env = pki.envelope(NOW_RFC3339, None);
    let crls = Arc::new(loopback_crls());
    let strict = pki.check(&spec(NotationLevel::Strict), vec![], Some(crls.clone()));
    assert!(strict.check(&env, DIGEST, NOW).is_err());
    crls.fetch_due(NOW).await;
    let e = strict.check(&env, DIGEST, NOW).unwrap_err();
    assert!(
        matches!(&e, SignatureProblem::RevocationUnknown { detail } if detail.contains("127.0.0.1")),
        "{e}"
    );
    let logged = pki
        .check(&spec(NotationLevel::Permissive), vec![], Some(crls.clone()))
        .check(&env, DIGEST, NOW)
        .unwrap();
    assert!(
        logged[0].starts_with("revocation status unknown"),
        "{logged:?}"
    );
    let mut skip = spec(NotationLevel::Strict);
    skip.overrides.revocation = Some(Action::Skip);
    assert_eq!(
        pki.check(&skip, vec![], Some(crls))
            .check(&env, DIGEST, NOW),
        Ok(vec![])
    );
}

#[test]
fn a_cose_envelope_carries_its_countersignature_in_the_unprotected_header() {
    use sigil_testkit::signing::{Signer, notation_cert_with, notation_cose_stamped};
    let key = Signer::p256();
    let (cert, _) = notation_cert_with(&key, "cose-signer", Some(Y2020), true);
    let tsa = Sigstore::new();
    let june = |sig: &[u8]| tsa.timestamp(sig, JUNE_2020, true, None);
    let check = NotationCheck::from_spec(
        &spec(NotationLevel::Strict),
        vec![cert.clone()],
        vec![tsa.tsa_root.clone()],
        None,
    )
    .unwrap();
    let stamped = Envelope::parse(
        "application/cose",
        &notation_cose_stamped(&key, &cert, DIGEST, 1, Some(&june)),
    )
    .unwrap();
    assert!(stamped.timestamp.is_some());
    assert_eq!(check.check(&stamped, DIGEST, NOW), Ok(vec![]));
    let bare = Envelope::parse(
        "application/cose",
        &notation_cose_stamped(&key, &cert, DIGEST, 1, None),
    )
    .unwrap();
    let e = check.check(&bare, DIGEST, NOW).unwrap_err();
    assert!(e.to_string().starts_with("authentic timestamp"), "{e}");
}

/// Regression: a subject with an attribute twice failed the identity check
/// outright, even where authenticity is only logged.
#[test]
fn a_subject_with_an_attribute_twice_follows_the_authenticity_action() {
    let (key, cert) = sigil_testkit::pki::twice_named_signer();
    let env = Envelope::from_jws(&sigil_testkit::signing::notation_jws_with(
        &key,
        "ES256",
        &cert,
        DIGEST,
        1,
        json!({}),
    ))
    .unwrap();
    let mut s = spec(NotationLevel::Strict);
    s.trusted_identities = vec!["x509.subject: C=US, ST=WA, O=acme".into()];
    let check = |s: &NotationSpec| {
        NotationCheck::from_spec(s, vec![cert.clone()], vec![], None)
            .unwrap()
            .check(&env, DIGEST, NOW)
    };
    let e = check(&s).unwrap_err();
    assert!(e.to_string().contains("OU twice"), "{e}");
    s.level = NotationLevel::Audit;
    let logged = check(&s).unwrap();
    assert!(logged.iter().any(|l| l.contains("OU twice")), "{logged:?}");
    s.trusted_identities.clear();
    assert_eq!(check(&s), Ok(vec![]), "with \"*\" the subject is not read");
}
