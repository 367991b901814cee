//! The verification cache's key and entries: what a cached report is found
//! by, how long it is kept, and the check that it was made for the rule
//! asking. The table itself is sigil-registry's cache (the one digests live
//! in); the verifier in `lib.rs` decides when to look and when to verify.

use std::sync::Arc;
use std::time::Duration;

use sigil_core::credentials::PullCredentials;
use sigil_core::{CacheConfig, Digest, Freshness, Reference, Verification, VerificationReport};
use sigil_registry::cache::{Key, KeyBuilder};

/// The cache key: the SHA-256 of (repository, digest, verifier set, the
/// cluster credentials' identities), each part prefixed by its length — a
/// report fetched with one namespace's pull secrets is only served to
/// requests holding the same ones; node-level credentials are the same for
/// every request, so they need no place in it. Made without allocating (the
/// key it replaced held the repository name and the identities as strings,
/// hashed again by the map), once per image of every verified admission.
/// The verifier set enters as its fingerprint; the entry holds the set
/// itself, compared on every hit, so a fingerprint collision is a miss,
/// never another rule's report.
pub(crate) fn key(
    repo: &Reference,
    digest: &Digest,
    v: &Verification,
    creds: &PullCredentials,
) -> Key {
    let mut k = KeyBuilder::new();
    k.part(repo.domain())
        .part(repo.path())
        .part(digest.as_str())
        .bytes(&v.fingerprint().to_le_bytes());
    k.bytes(&(creds.candidates.len() as u64).to_le_bytes());
    for c in &creds.candidates {
        k.part(c.identity());
    }
    k.finish()
}

/// A cached report, with the verifier set it was made for.
pub(crate) type Entry = (Arc<Verification>, Arc<VerificationReport>);

/// How long a report is kept: by what it says.
pub(crate) fn lifetime(cfg: &CacheConfig, r: &VerificationReport) -> Duration {
    cfg.lifetime(if r.satisfied() {
        Freshness::Good
    } else if r.is_transient() {
        Freshness::Transient
    } else {
        Freshness::Definite
    })
}

/// The entry's report, if it was made for `v` (a pointer comparison when it
/// comes from the same policy load, as it nearly always does).
pub(crate) fn made_for(e: &Entry, v: &Arc<Verification>) -> Option<Arc<VerificationReport>> {
    (Arc::ptr_eq(&e.0, v) || *e.0 == **v).then(|| e.1.clone())
}

#[cfg(test)]
mod tests {
    use super::*;
    use sigil_core::credentials::{Candidate, Credential, CredentialSource};
    use sigil_core::{Policy, ResolveFailure};

    fn rules() -> Vec<Arc<Verification>> {
        let dir = tempfile::tempdir().expect("tmp");
        let mut yaml =
            String::from("apiVersion: sigil.dev/v1alpha1\nkind: ImagePolicy\nspec:\n  rules:\n");
        for (i, pem) in [
            sigil_testkit::signing::Signer::p256(),
            sigil_testkit::signing::Signer::p256(),
        ]
        .iter()
        .enumerate()
        {
            let path = dir.path().join(format!("k{i}.pub"));
            std::fs::write(&path, pem.public_pem()).expect("key");
            yaml.push_str(&format!(
                "    - {{name: r{i}, match: [\"r{i}.example.com/**\"], verify: [{{name: ci, cosign: {{key: \"{}\"}}}}]}}\n",
                path.display()
            ));
        }
        let p = Policy::from_yaml(&yaml).expect("policy");
        p.rules
            .iter()
            .map(|r| r.verification.clone().expect("verify rule"))
            .collect()
    }

    fn creds(ids: &[&str]) -> PullCredentials {
        PullCredentials {
            candidates: ids
                .iter()
                .map(|u| Candidate {
                    credential: Some(Credential::basic(*u, "pw")),
                    source: CredentialSource::Secret {
                        namespace: "ns".into(),
                        name: "s".into(),
                    },
                })
                .collect(),
            ..PullCredentials::default()
        }
    }

    #[test]
    fn keys_differ_in_every_part_and_where_parts_meet() {
        let v = rules();
        let r = |s: &str| Reference::parse(s).expect("ref");
        let d1 = Digest::from_sha256(&[1; 32]);
        let d2 = Digest::from_sha256(&[2; 32]);
        let base = key(&r("a.example.com/b/c"), &d1, &v[0], &creds(&[]));
        assert_eq!(
            base,
            key(&r("a.example.com/b/c:other-tag"), &d1, &v[0], &creds(&[])),
            "tag is not a part"
        );
        for other in [
            key(&r("a.example.com/b/d"), &d1, &v[0], &creds(&[])),
            key(&r("a.example.com/b/c"), &d2, &v[0], &creds(&[])),
            key(&r("a.example.com/b/c"), &d1, &v[1], &creds(&[])),
            key(&r("a.example.com/b/c"), &d1, &v[0], &creds(&["robot"])),
        ] {
            assert_ne!(base, other);
        }
        // Length prefixes: parts that concatenate alike stay apart.
        assert_ne!(
            key(&r("a.example.com/b/c"), &d1, &v[0], &creds(&["x", "y"])),
            key(&r("a.example.com/b/c"), &d1, &v[0], &creds(&["xy"])),
        );
        assert_ne!(
            key(&r("a.example.com/b/c"), &d1, &v[0], &creds(&["x", "y"])),
            key(&r("a.example.com/b/c"), &d1, &v[0], &creds(&["y", "x"])),
        );
    }

    #[test]
    fn a_cached_report_is_served_only_to_the_rule_it_was_made_for() {
        let v = rules();
        let report = Arc::new(VerificationReport::unfetched(
            &v[0],
            ResolveFailure::Timeout {
                budget: Duration::from_secs(1),
            },
        ));
        let e: Entry = (v[0].clone(), report.clone());
        assert!(made_for(&e, &v[0]).is_some_and(|r| Arc::ptr_eq(&r, &report)));
        let same = Arc::new(Verification::clone(&v[0]));
        assert!(
            made_for(&e, &same).is_some(),
            "an equal rule from another load"
        );
        assert!(
            made_for(&e, &v[1]).is_none(),
            "another rule under the same key"
        );
    }

    #[test]
    fn reports_live_by_what_they_say() {
        let v = rules();
        let cfg = CacheConfig {
            ttl: Duration::from_secs(300),
            negative_ttl: Duration::from_secs(10),
            capacity: 10,
        };
        let transient = VerificationReport::unfetched(
            &v[0],
            ResolveFailure::Timeout {
                budget: Duration::from_secs(1),
            },
        );
        assert_eq!(
            lifetime(&cfg, &transient),
            cfg.lifetime(Freshness::Transient)
        );
        let definite = VerificationReport::unfetched(
            &v[0],
            ResolveFailure::NotFound {
                detail: "gone".into(),
            },
        );
        assert_eq!(lifetime(&cfg, &definite), cfg.lifetime(Freshness::Definite));
    }
}
