//! A trusted root laid out as GitHub's (`sigil-verify/trust/github-trusted_root.json`):
//! one root; for Fulcio a shared intermediate `l1` and, per window, its own
//! `l2` (all named alike, as GitHub's are) issuing the leaves; `l1` has no
//! extended key usage, each `l2` codeSigning, the TSA intermediate
//! timeStamping, as GitHub's have; for
//! timestamps a shared intermediate and, per window, its own signing
//! certificate — every certificate outliving its window, the windows
//! overlapping, no CT log and no transparency log — or, for verifiers that
//! cannot judge a root without one, the test Sigstore's Rekor v1 log
//! ([`Windowed::logged`]). Tests ask of it whether a
//! leaf, a timestamp or a key is judged by its own authority's chain and
//! window only, and mint what an attacker holding a key of it would bring:
//! a timestamp certificate the root does not list, a sub-CA without an
//! extended key usage, another window's intermediate. It checks nothing.

use rcgen::{CertificateParams, CustomExtension, ExtendedKeyUsagePurpose, KeyUsagePurpose};
use serde_json::{Value, json};

use crate::intoto::{PAYLOAD_TYPE, pae};
use crate::pki::Ca;
use crate::signing::{Signer, b64};
use crate::sigstore::{GITHUB_ISSUER, GITHUB_WORKFLOW, Sigstore, der};
use crate::timestamp::rfc3161;

/// The windows (Unix seconds, inclusive): A from 2024-01-01 to
/// 2024-07-01, B from 2024-06-01 to 2025-01-01 — a month of overlap.
pub const WINDOWS: [(i64, i64); 2] = [
    (1_704_067_200, 1_719_792_000),
    (1_717_200_000, 1_735_689_600),
];

/// A moment inside window A only (2024-03-01).
pub const IN_A: i64 = 1_709_251_200;
/// A moment inside window B only, after A ended (2024-09-01).
pub const IN_B: i64 = 1_725_148_800;

/// One window's authorities: a Fulcio intermediate and a TSA signing key
/// with its certificate.
pub struct Window {
    pub start: i64,
    pub end: i64,
    pub l2: Ca,
    pub tsa: Signer,
    pub tsa_der: Vec<u8>,
}

/// The whole scene.
pub struct Windowed {
    pub root: Ca,
    pub l1: Ca,
    pub tsa_intermediate: Ca,
    pub windows: Vec<Window>,
    /// A Rekor v1 log the root lists and every bundle is logged in, if any.
    log: Option<Sigstore>,
}

fn rfc3339(unix: i64) -> String {
    time::OffsetDateTime::from_unix_timestamp(unix)
        .unwrap()
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap()
}

impl Windowed {
    /// Mints the root, the shared intermediates and both windows.
    pub fn new() -> Windowed {
        let root = Ca::root("Internal Services Root");
        let l1 = root.intermediate("Fulcio Intermediate l1", None);
        let tsa_intermediate = root.intermediate_for(
            "TSA intermediate",
            None,
            Some(ExtendedKeyUsagePurpose::TimeStamping),
        );
        let windows = WINDOWS
            .iter()
            .map(|&(start, end)| {
                let tsa = Signer::p256();
                let tsa_der = Windowed::tsa_certificate(&tsa_intermediate, &tsa);
                Window {
                    start,
                    end,
                    l2: l1.intermediate_for(
                        "Fulcio Intermediate l2",
                        None,
                        Some(ExtendedKeyUsagePurpose::CodeSigning),
                    ),
                    tsa,
                    tsa_der,
                }
            })
            .collect();
        Windowed {
            root,
            l1,
            tsa_intermediate,
            windows,
            log: None,
        }
    }

    /// [`Windowed::new`] with a Rekor v1 log in the root, every bundle
    /// logged in it (SET, inclusion proof, checkpoint) 30 s after signing.
    pub fn logged() -> Windowed {
        Windowed {
            log: Some(Sigstore::new()),
            ..Windowed::new()
        }
    }

    /// A timestamp signing certificate for `key` issued by `ca`
    /// (timeStamping, valid 2020–2100: it outlives any window).
    fn tsa_certificate(ca: &Ca, key: &Signer) -> Vec<u8> {
        let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
        p.distinguished_name
            .push(rcgen::DnType::CommonName, "TSA Timestamping");
        p.extended_key_usages = vec![ExtendedKeyUsagePurpose::TimeStamping];
        p.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        ca.sign(&p, key)
    }

    /// A timestamp certificate for `key` from the shared TSA intermediate
    /// that no authority of the root lists.
    pub fn unlisted_tsa_certificate(&self, key: &Signer) -> Vec<u8> {
        Windowed::tsa_certificate(&self.tsa_intermediate, key)
    }

    /// A sub-CA under the shared `l1` without an extended key usage, that
    /// no authority of the root lists.
    pub fn unlisted_sub_ca(&self) -> Ca {
        self.l1.intermediate("Fulcio Intermediate l2", None)
    }

    /// The trusted root: per window a Fulcio authority `[l2, l1, root]` and a
    /// timestamp authority `[signing certificate, intermediate, root]`.
    pub fn trusted_root(&self) -> Value {
        let chain = |certs: &[&[u8]]| json!({"certificates": certs.iter().map(|c| json!({"rawBytes": b64(c)})).collect::<Vec<_>>()});
        let valid = |w: &Window| json!({"start": rfc3339(w.start), "end": rfc3339(w.end)});
        json!({
            "mediaType": "application/vnd.dev.sigstore.trustedroot+json;version=0.1",
            "tlogs": self.log.as_ref().map_or_else(Vec::new, |l| vec![l.trusted_root()["tlogs"][0].clone()]),
            "certificateAuthorities": self.windows.iter().map(|w| json!({
                "subject": {"organization": "GitHub, Inc.", "commonName": "Internal Services Root"},
                "uri": "https://fulcio.githubapp.test",
                "certChain": chain(&[&w.l2.der, &self.l1.der, &self.root.der]),
                "validFor": valid(w),
            })).collect::<Vec<_>>(),
            "timestampAuthorities": self.windows.iter().map(|w| json!({
                "subject": {"organization": "GitHub, Inc.", "commonName": "Internal Services Root"},
                "uri": "https://timestamp.githubapp.test",
                "certChain": chain(&[&w.tsa_der, &self.tsa_intermediate.der, &self.root.der]),
                "validFor": valid(w),
            })).collect::<Vec<_>>(),
            "ctlogs": [],
        })
    }

    /// A ten-minute Fulcio leaf from `ca` for [`GITHUB_WORKFLOW`] /
    /// [`GITHUB_ISSUER`], valid from `not_before`: (key, DER).
    pub fn leaf(ca: &Ca, not_before: i64) -> (Signer, Vec<u8>) {
        let key = Signer::p256();
        let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
        p.subject_alt_names = vec![rcgen::SanType::URI(GITHUB_WORKFLOW.try_into().unwrap())];
        p.extended_key_usages = vec![ExtendedKeyUsagePurpose::CodeSigning];
        p.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        p.not_before = time::OffsetDateTime::from_unix_timestamp(not_before).unwrap();
        p.not_after = time::OffsetDateTime::from_unix_timestamp(not_before + 600).unwrap();
        p.custom_extensions = vec![CustomExtension::from_oid_content(
            &[1, 3, 6, 1, 4, 1, 57264, 1, 8],
            der(0x0c, GITHUB_ISSUER.as_bytes()),
        )];
        let der = ca.sign(&p, &key);
        (key, der)
    }

    /// An RFC 3161 timestamp over `signature` at `at`, signed by `key`
    /// whose certificate is `cert` (named in the signed attributes), the
    /// token carrying `embed`.
    pub fn stamp(key: &Signer, cert: &[u8], signature: &[u8], at: i64, embed: &[&[u8]]) -> Vec<u8> {
        rfc3161(signature, at, key, embed, Some(cert))
    }
}

impl Windowed {
    /// A bundle signed at `signed_at` by `key` (whose certificate is
    /// `leaf`) over the DSSE envelope of `statement`, with the timestamps
    /// `stamp` makes over its signature and, in a [`Windowed::logged`]
    /// scene, its log entry — else none, as GitHub's instance writes them.
    /// v0.1 and v0.2 carry `leaf` and `chain` in `x509CertificateChain`
    /// (what a bundle may bring), v0.3 the leaf alone.
    #[allow(clippy::too_many_arguments)]
    pub fn bundle(
        &self,
        media_type: &str,
        key: &Signer,
        leaf: &[u8],
        chain: &[&[u8]],
        statement: &[u8],
        signed_at: i64,
        stamp: impl Fn(&[u8]) -> Vec<Vec<u8>>,
    ) -> Vec<u8> {
        let sig = key.sign(&pae(PAYLOAD_TYPE, statement));
        let stamps: Vec<Value> = stamp(&sig)
            .iter()
            .map(|t| json!({"signedTimestamp": b64(t)}))
            .collect();
        let envelope = json!({"payload": b64(statement), "payloadType": PAYLOAD_TYPE, "signatures": [{"sig": b64(&sig)}]});
        let entries: Vec<Value> = self
            .log
            .iter()
            .map(|log| {
                let e = log.log_dsse(
                    &serde_json::to_vec(&envelope).unwrap(),
                    statement,
                    &sig,
                    leaf,
                    signed_at + 30,
                    7,
                );
                json!({
                    "logIndex": "7", "logId": {"keyId": b64(&e.log_id)},
                    "kindVersion": {"kind": "dsse", "version": "0.0.1"},
                    "integratedTime": (signed_at + 30).to_string(),
                    "inclusionPromise": {"signedEntryTimestamp": b64(&e.set)},
                    "inclusionProof": {
                        "logIndex": "3", "rootHash": b64(&e.root), "treeSize": "5",
                        "hashes": e.hashes.iter().map(|h| b64(h)).collect::<Vec<_>>(),
                        "checkpoint": {"envelope": e.checkpoint}
                    },
                    "canonicalizedBody": b64(&e.body)
                })
            })
            .collect();
        let mut material = json!({
            "tlogEntries": entries,
            "timestampVerificationData": {"rfc3161Timestamps": stamps},
        });
        if media_type.contains("0.3") {
            material["certificate"] = json!({"rawBytes": b64(leaf)});
        } else {
            let certs: Vec<Value> = std::iter::once(leaf)
                .chain(chain.iter().copied())
                .map(|c| json!({"rawBytes": b64(c)}))
                .collect();
            material["x509CertificateChain"] = json!({"certificates": certs});
        }
        serde_json::to_vec(&json!({
            "mediaType": media_type,
            "verificationMaterial": material,
            "dsseEnvelope": envelope,
        }))
        .unwrap()
    }
}
