//! GitHub artifact attestations as `actions/attest` (and
//! `actions/attest-build-provenance`, which wraps it) push them to a
//! registry with `push-to-registry: true`, minted here byte for byte in the
//! shape that tool writes:
//!
//! - **The bundle** is shaped like the real ones GitHub Actions made for
//!   public repositories (the two in `sigil-verify/tests/vectors/attestations`,
//!   from cli/cli's test data, 2024): a Sigstore bundle v0.3 (or v0.2 as
//!   `actions/attest` v1.0 wrote it, the certificate in `x509CertificateChain`)
//!   over a DSSE envelope whose signature has no `keyid`; one Rekor v1 `dsse`
//!   0.0.1 entry with its SET (`inclusionPromise`), an inclusion proof whose
//!   `logIndex` is the shard's (not the global one) and a signed checkpoint;
//!   `timestampVerificationData: {}`; keys in sigstore-js's order, compact
//!   as `JSON.stringify` writes them.
//! - **The attachment** is what sigstore-js's `@sigstore/oci`
//!   (`OCIImage.addArtifact`, read at sigstore/sigstore-js commit `002a7a0`)
//!   uploads: the bundle blob, the empty blob `{}`, and a manifest with
//!   `artifactType` = the bundle's media type, the empty config, one layer,
//!   `subject` (the image's HEAD answer: media type, digest, size) and the
//!   annotations `org.opencontainers.image.created`,
//!   `dev.sigstore.bundle.content: dsse-envelope` and
//!   `dev.sigstore.bundle.predicateType`, as `actions/attest` passes them.
//!   A registry without the referrers API (no `OCI-Subject` answer, such as
//!   distribution 2.x) gets the referrers tag-schema index `sha256-<hex>`
//!   written by hand: `{mediaType, schemaVersion, manifests}` with the
//!   manifest's descriptor, `artifactType` and annotations.
//! - **On Docker Hub and ECR** ([`Registry::Downgraded`]) the same library
//!   deletes `subject` and `artifactType`, strips the layer's media-type
//!   parameters and gives the config the image-config media type; the tag
//!   index still names the artifact type.

use crate::entries::{LogKind, attestation_body};
use crate::intoto::{PAYLOAD_TYPE, pae};
use crate::registry::{TestRegistry, sha256};
use crate::signing::{b64, pem};
use crate::sigstore::{Sigstore, hex_sha, inclusion_proof, leaf_hash, tree_root};

/// The bundle media type `actions/attest` v1.0 wrote.
pub const BUNDLE_V02: &str = "application/vnd.dev.sigstore.bundle+json;version=0.2";
/// The bundle media type `actions/attest` writes since v1.1.
pub const BUNDLE_V03: &str = "application/vnd.dev.sigstore.bundle.v0.3+json";

/// How `@sigstore/oci` treats the registry it pushes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Registry {
    /// An OCI 1.1 manifest with `subject` and `artifactType`.
    Oci,
    /// docker.io and amazonaws.com: no `subject`, no `artifactType`.
    Downgraded,
}

impl Sigstore {
    /// The bundle `actions/attest` gets from the public-good Sigstore for
    /// `statement`: signed by a fresh leaf for `workflow`/`issuer` with the
    /// Fulcio `extensions`, logged at `integrated_time` as global index
    /// 129601213 (shard index 3 of a 5-entry tree). `media_type` is
    /// [`BUNDLE_V03`] or [`BUNDLE_V02`].
    #[allow(clippy::too_many_arguments)]
    pub fn github_attestation(
        &self,
        media_type: &str,
        statement: &[u8],
        workflow: &str,
        issuer: &str,
        extensions: &[(&str, &str)],
        not_before: i64,
        integrated_time: i64,
    ) -> Vec<u8> {
        let ext: Vec<(u64, &str)> = extensions
            .iter()
            .map(|(n, v)| (crate::attestations::extension(n), *v))
            .collect();
        let (key, cert) = self.leaf_with(workflow, issuer, not_before, &ext);
        let sig = key.sign(&pae(PAYLOAD_TYPE, statement));
        let envelope = format!(
            r#"{{"payload":"{}","payloadType":"{PAYLOAD_TYPE}","signatures":[{{"sig":"{}"}}]}}"#,
            b64(statement),
            b64(&sig)
        );
        let global_index = 129_601_213u64;
        let LoggedDsse {
            body,
            set,
            root,
            hashes,
            checkpoint,
            log_id,
        } = self.log_dsse(
            envelope.as_bytes(),
            statement,
            &sig,
            &cert,
            integrated_time,
            global_index,
        );
        let hashes: Vec<String> = hashes.iter().map(|h| format!("\"{}\"", b64(h))).collect();
        let checkpoint = serde_json::to_string(&checkpoint).unwrap();
        let log_id = b64(&log_id);
        let tlog = format!(
            r#"{{"logIndex":"{global_index}","logId":{{"keyId":"{log_id}"}},"kindVersion":{{"kind":"dsse","version":"0.0.1"}},"integratedTime":"{integrated_time}","inclusionPromise":{{"signedEntryTimestamp":"{}"}},"inclusionProof":{{"logIndex":"3","rootHash":"{}","treeSize":"5","hashes":[{}],"checkpoint":{{"envelope":{checkpoint}}}}},"canonicalizedBody":"{}"}}"#,
            b64(&set),
            b64(&root),
            hashes.join(","),
            b64(&body)
        );
        let signer = match media_type {
            BUNDLE_V02 => format!(
                r#""x509CertificateChain":{{"certificates":[{{"rawBytes":"{}"}}]}}"#,
                b64(&cert)
            ),
            _ => format!(r#""certificate":{{"rawBytes":"{}"}}"#, b64(&cert)),
        };
        format!(
            r#"{{"mediaType":"{media_type}","verificationMaterial":{{"tlogEntries":[{tlog}],"timestampVerificationData":{{}},{signer}}},"dsseEnvelope":{envelope}}}"#
        )
        .into_bytes()
    }

    /// A DSSE envelope's Rekor v1 `dsse` 0.0.1 entry in this log, as
    /// rekor.sigstore.dev logs one: its body, its SET at `integrated_time`
    /// and `global_index`, and its inclusion proof (shard index 3 of a
    /// 5-entry tree) with the signed checkpoint.
    pub(crate) fn log_dsse(
        &self,
        envelope: &[u8],
        statement: &[u8],
        sig: &[u8],
        cert: &[u8],
        integrated_time: i64,
        global_index: u64,
    ) -> LoggedDsse {
        let body = attestation_body(
            LogKind::Dsse001,
            envelope,
            statement,
            sig,
            &pem("CERTIFICATE", cert),
        );
        let set = self.signed_entry_timestamp(&body, integrated_time, global_index, None);
        let mut leaves: Vec<[u8; 32]> = (0..5u8).map(|i| leaf_hash(&[i])).collect();
        leaves[3] = leaf_hash(&body);
        let root = tree_root(&leaves);
        LoggedDsse {
            hashes: inclusion_proof(&leaves, 3),
            checkpoint: self.checkpoint_v1(5, &root),
            log_id: hex_sha(&self.log.spki()),
            body,
            set,
            root,
        }
    }

    /// What GitHub's own Sigstore instance signs for a private repository
    /// (`actions/attest` there): a v0.3 bundle of `statement` with no
    /// transparency-log entry, its only trusted time an RFC 3161 timestamp
    /// of the signature at `signed_at` from this TSA (certificate embedded),
    /// by a leaf for `workflow` valid from `not_before`.
    #[allow(clippy::too_many_arguments)]
    pub fn github_private_attestation(
        &self,
        statement: &[u8],
        workflow: &str,
        issuer: &str,
        extensions: &[(&str, &str)],
        not_before: i64,
        signed_at: i64,
    ) -> Vec<u8> {
        let ext: Vec<(u64, &str)> = extensions
            .iter()
            .map(|(n, v)| (crate::attestations::extension(n), *v))
            .collect();
        let (key, cert) = self.leaf_with(workflow, issuer, not_before, &ext);
        let sig = key.sign(&pae(PAYLOAD_TYPE, statement));
        let ts = self.timestamp(&sig, signed_at, true, None);
        format!(
            r#"{{"mediaType":"{BUNDLE_V03}","verificationMaterial":{{"certificate":{{"rawBytes":"{}"}},"tlogEntries":[],"timestampVerificationData":{{"rfc3161Timestamps":[{{"signedTimestamp":"{}"}}]}}}},"dsseEnvelope":{{"payload":"{}","payloadType":"{PAYLOAD_TYPE}","signatures":[{{"sig":"{}"}}]}}}}"#,
            b64(&cert),
            b64(&ts),
            b64(statement),
            b64(&sig)
        )
        .into_bytes()
    }

    /// The trusted root of an instance like GitHub's own: this Fulcio CA and
    /// TSA, no transparency log, no CT log.
    pub fn trusted_root_without_logs(&self) -> serde_json::Value {
        let mut root = self.trusted_root();
        root["tlogs"] = serde_json::json!([]);
        root
    }
}

/// A `dsse` entry of the test Rekor v1 log (see [`Sigstore::log_dsse`]).
pub(crate) struct LoggedDsse {
    pub body: Vec<u8>,
    pub set: Vec<u8>,
    /// The tree's root hash, its audit path and the checkpoint over it
    /// (index 3 of 5).
    pub root: [u8; 32],
    pub hashes: Vec<[u8; 32]>,
    pub checkpoint: String,
    /// The log's id (SHA-256 of its key).
    pub log_id: Vec<u8>,
}

/// Pushes `bundle` to `repo` as `actions/attest` with `push-to-registry`
/// attaches it to `subject` (an image manifest or index of `repo`, of
/// `subject_media_type`), on a registry without the referrers API; returns
/// the attestation manifest's digest. `created` is the
/// `org.opencontainers.image.created` annotation (`new Date().toISOString()`).
#[allow(clippy::too_many_arguments)]
pub async fn push_to_registry(
    reg: &TestRegistry,
    repo: &str,
    subject: &str,
    subject_media_type: &str,
    bundle: &[u8],
    predicate_type: &str,
    created: &str,
    registry: Registry,
) -> String {
    let media_type: String =
        serde_json::from_slice::<serde_json::Value>(bundle).unwrap()["mediaType"]
            .as_str()
            .unwrap()
            .to_owned();
    let subject_size = reg.manifest_size(repo, subject).await;
    let bundle_digest = reg.push_blob(repo, bundle).await;
    let empty = reg.push_blob(repo, b"{}").await;
    let annotations = format!(
        r#"{{"org.opencontainers.image.created":"{created}","dev.sigstore.bundle.content":"dsse-envelope","dev.sigstore.bundle.predicateType":"{predicate_type}"}}"#
    );
    let manifest = match registry {
        Registry::Oci => format!(
            r#"{{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","artifactType":"{media_type}","config":{{"mediaType":"application/vnd.oci.empty.v1+json","digest":"{empty}","size":2}},"layers":[{{"mediaType":"{media_type}","digest":"{bundle_digest}","size":{}}}],"subject":{{"mediaType":"{subject_media_type}","digest":"{subject}","size":{subject_size}}},"annotations":{annotations}}}"#,
            bundle.len()
        ),
        Registry::Downgraded => format!(
            r#"{{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"{empty}","size":2}},"layers":[{{"mediaType":"{}","digest":"{bundle_digest}","size":{}}}],"annotations":{annotations}}}"#,
            media_type.split(';').next().unwrap_or_default(),
            bundle.len()
        ),
    };
    let digest = sha256(manifest.as_bytes());
    reg.push_manifest(
        repo,
        &digest,
        "application/vnd.oci.image.manifest.v1+json",
        manifest.as_bytes(),
    )
    .await;
    let index = format!(
        r#"{{"mediaType":"application/vnd.oci.image.index.v1+json","schemaVersion":2,"manifests":[{{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"{digest}","size":{},"artifactType":"{media_type}","annotations":{annotations}}}]}}"#,
        manifest.len()
    );
    reg.push_manifest(
        repo,
        &subject.replace(':', "-"),
        "application/vnd.oci.image.index.v1+json",
        index.as_bytes(),
    )
    .await;
    digest
}
