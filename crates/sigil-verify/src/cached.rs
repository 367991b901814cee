//! The verification cache's key and entries: what a cached report is found
//! by, how long it is kept, and the check that it was made for the request
//! asking. The table itself is sigil-registry's cache (the one digests live
//! in); the verifier in `lib.rs` decides when to look and when to verify.

use std::hash::{BuildHasher, Hasher};
use std::sync::Arc;
use std::time::Duration;

use sigil_core::credentials::PullCredentials;
use sigil_core::{CacheConfig, Digest, Freshness, Reference, Verification, VerificationReport};
use sigil_registry::cache::Key;

/// Makes the cache keys: a seeded 64-bit hash (seed random per verifier)
/// of (repository, digest, verifier set, the cluster credentials'
/// identities), each part prefixed by its length — a report fetched with
/// one namespace's pull secrets is only served to requests holding the same
/// ones; node-level credentials are the same for every request, so they
/// need no place in it — followed by the start of the digest's hex text.
/// The key only finds an entry: the entry holds every part it was made from
/// and [`made_for`] compares them all on each hit, so two requests that
/// share a key by chance (or by an attacker's design) are a miss, never
/// each other's report. That is what lets the key be a fast hash instead
/// of the SHA-256 it was (a third of a cached attested image's verification
/// cost in the server's profile).
#[derive(Default)]
pub(crate) struct Keyer(foldhash::quality::RandomState);

impl Keyer {
    /// The key of one check. Made without allocating, once per image of
    /// every verified admission.
    pub(crate) fn key(
        &self,
        repo: &Reference,
        digest: &Digest,
        v: &Verification,
        creds: &PullCredentials,
    ) -> Key {
        let mut h = self.0.build_hasher();
        for part in [repo.domain(), repo.path(), digest.as_str()] {
            h.write_usize(part.len());
            h.write(part.as_bytes());
        }
        h.write_u64(v.fingerprint());
        h.write_usize(creds.candidates.len());
        for c in &creds.candidates {
            h.write_usize(c.identity().len());
            h.write(c.identity().as_bytes());
        }
        let mut k: Key = [0; 32];
        k[..8].copy_from_slice(&h.finish().to_le_bytes());
        // The rest: the start of the digest's hex text, as it is (the table
        // compares whole keys; only the first bytes need to be uniform).
        let hex = digest.hex().as_bytes();
        let n = hex.len().min(24);
        k[8..8 + n].copy_from_slice(&hex[..n]);
        k
    }
}

/// A cached report, with everything its key was made from.
#[derive(Debug)]
pub(crate) struct Stored {
    /// The verifier set it was made for.
    made_for: Arc<Verification>,
    /// The signature repository (its name; the tag is not a part).
    repository: Reference,
    digest: Digest,
    /// The identities of the cluster credentials it was fetched with.
    identities: Box<[Box<str>]>,
    pub(crate) report: Arc<VerificationReport>,
}

/// What the table holds (shared: a hit clones a pointer).
pub(crate) type Entry = Arc<Stored>;

/// The entry of a report made for this check.
pub(crate) fn entry(
    repo: &Reference,
    digest: &Digest,
    v: &Arc<Verification>,
    creds: &PullCredentials,
    report: VerificationReport,
) -> Entry {
    Arc::new(Stored {
        made_for: v.clone(),
        repository: repo.clone(),
        digest: digest.clone(),
        identities: creds
            .candidates
            .iter()
            .map(|c| c.identity().into())
            .collect(),
        report: Arc::new(report),
    })
}

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

/// The entry's report, if it was made for this very check: the same
/// repository, digest and credentials, and the same verifier set (a
/// pointer comparison when it comes from the same policy load, as it
/// nearly always does).
pub(crate) fn made_for(
    e: &Entry,
    repo: &Reference,
    digest: &Digest,
    v: &Arc<Verification>,
    creds: &PullCredentials,
) -> Option<Arc<VerificationReport>> {
    let same = e.digest == *digest
        && e.repository.name_str() == repo.name_str()
        && e.identities.len() == creds.candidates.len()
        && e.identities
            .iter()
            .zip(&creds.candidates)
            .all(|(a, c)| **a == *c.identity())
        && (Arc::ptr_eq(&e.made_for, v) || *e.made_for == **v);
    same.then(|| e.report.clone())
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

    fn report(v: &Verification) -> VerificationReport {
        VerificationReport::unfetched(
            v,
            ResolveFailure::Timeout {
                budget: Duration::from_secs(1),
            },
        )
    }

    #[test]
    fn keys_differ_in_every_part_and_where_parts_meet() {
        let v = rules();
        let keys = Keyer::default();
        let key =
            |r: &Reference, d: &Digest, v: &Verification, c: &PullCredentials| keys.key(r, d, v, c);
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
            key(&r("a.example.com/bc"), &d1, &v[0], &creds(&[])),
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
        // Another verifier's seeds: other keys, same distinctions.
        let other = Keyer::default();
        assert_ne!(
            base,
            other.key(&r("a.example.com/b/c"), &d1, &v[0], &creds(&[]))
        );
    }

    #[test]
    fn a_cached_report_is_served_only_to_the_check_it_was_made_for() {
        let v = rules();
        let r = |s: &str| Reference::parse(s).expect("ref");
        let (repo, d) = (r("a.example.com/b/c:1"), Digest::from_sha256(&[1; 32]));
        let e = entry(&repo, &d, &v[0], &creds(&["robot"]), report(&v[0]));
        let hit = made_for(&e, &r("a.example.com/b/c:2"), &d, &v[0], &creds(&["robot"]));
        assert!(
            hit.is_some_and(|h| Arc::ptr_eq(&h, &e.report)),
            "the tag is no part"
        );
        let same = Arc::new(Verification::clone(&v[0]));
        assert!(
            made_for(&e, &repo, &d, &same, &creds(&["robot"])).is_some(),
            "an equal rule from another load"
        );
        // Whatever the key, an entry answers only the check it was made
        // for: a key two checks share by chance finds a miss.
        for (why, miss) in [
            (
                "another rule",
                made_for(&e, &repo, &d, &v[1], &creds(&["robot"])),
            ),
            (
                "another digest",
                made_for(
                    &e,
                    &repo,
                    &Digest::from_sha256(&[2; 32]),
                    &v[0],
                    &creds(&["robot"]),
                ),
            ),
            (
                "another repository",
                made_for(&e, &r("a.example.com/b/d:1"), &d, &v[0], &creds(&["robot"])),
            ),
            (
                "another registry",
                made_for(&e, &r("b.example.com/b/c:1"), &d, &v[0], &creds(&["robot"])),
            ),
            (
                "other credentials",
                made_for(&e, &repo, &d, &v[0], &creds(&["intruder"])),
            ),
            (
                "no credentials",
                made_for(&e, &repo, &d, &v[0], &creds(&[])),
            ),
            (
                "more credentials",
                made_for(&e, &repo, &d, &v[0], &creds(&["robot", "x"])),
            ),
        ] {
            assert!(miss.is_none(), "{why}");
        }
    }

    #[test]
    fn reports_live_by_what_they_say() {
        let v = rules();
        let cfg = CacheConfig {
            ttl: Duration::from_secs(300),
            negative_ttl: Duration::from_secs(10),
            capacity: 10,
        };
        let transient = report(&v[0]);
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
