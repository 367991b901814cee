//! The attestations platform teams require, minted and signed here in each
//! layout a registry holds them: SLSA provenance v0.2 and v1, SPDX and
//! CycloneDX SBOMs, a vulnerability scan (cosign's vuln predicate) and an
//! OpenVEX document; as cosign `.att` layers (DSSE envelope, key-signed, or
//! keyless with a Rekor v1 SET over an `intoto` entry) and as referrer
//! Sigstore bundles (key-signed, or keyless against Rekor v2 with an RFC 3161
//! timestamp). Tampering is the test's to do on what these return.

use serde_json::{Value, json};

use crate::entries::LogKind;
use crate::intoto::{self, PAYLOAD_TYPE};
use crate::registry::TestRegistry;
use crate::signing::{Signer, b64, pem};
use crate::sigstore::{Sigstore, hex_sha, inclusion_proof, leaf_hash, tree_root};

/// The predicate types minted here.
pub const SLSA_V02: &str = "https://slsa.dev/provenance/v0.2";
pub const SLSA_V1: &str = "https://slsa.dev/provenance/v1";
pub const SPDX: &str = "https://spdx.dev/Document";
pub const CYCLONEDX: &str = "https://cyclonedx.org/bom";
pub const VULN: &str = "https://cosign.sigstore.dev/attestation/vuln/v1";
pub const OPENVEX: &str = "https://openvex.dev/ns";
/// The artifactType (and layer media type) of a Sigstore bundle v0.3.
pub const BUNDLE_V03: &str = "application/vnd.dev.sigstore.bundle.v0.3+json";

/// A realistic predicate of `predicate_type`, made at `now` (Unix seconds)
/// by the workflow of `repository` (`https://github.com/acme/api`).
pub fn predicate(predicate_type: &str, repository: &str, now: i64) -> Value {
    let at = rfc3339(now);
    match predicate_type {
        SLSA_V02 => json!({
            "builder": {"id": "https://github.com/slsa-framework/slsa-github-generator/.github/workflows/generator_container_slsa3.yml@refs/tags/v2.0.0"},
            "buildType": "https://github.com/slsa-framework/slsa-github-generator/container@v1",
            "invocation": {"configSource": {"uri": format!("git+{repository}@refs/heads/main"), "entryPoint": ".github/workflows/release.yml"}},
            "metadata": {"buildStartedOn": at, "buildFinishedOn": at, "completeness": {"parameters": true}},
            "materials": [{"uri": format!("git+{repository}@refs/heads/main"), "digest": {"sha1": "a".repeat(40)}}]
        }),
        SLSA_V1 => json!({
            "buildDefinition": {
                "buildType": "https://actions.github.io/buildtypes/workflow/v1",
                "externalParameters": {"workflow": {"ref": "refs/heads/main", "repository": repository, "path": ".github/workflows/release.yml"}},
                "resolvedDependencies": [{"uri": format!("git+{repository}@refs/heads/main"), "digest": {"gitCommit": "a".repeat(40)}}]
            },
            "runDetails": {
                "builder": {"id": "https://github.com/actions/runner/github-hosted"},
                "metadata": {"invocationId": format!("{repository}/actions/runs/1/attempts/1"), "startedOn": at}
            }
        }),
        SPDX => json!({
            "spdxVersion": "SPDX-2.3", "dataLicense": "CC0-1.0", "SPDXID": "SPDXRef-DOCUMENT",
            "name": "app", "documentNamespace": "https://example.test/spdx/app",
            "creationInfo": {"created": at, "creators": ["Tool: syft-1.0.0"]},
            "packages": [{"name": "openssl", "SPDXID": "SPDXRef-Package-openssl", "versionInfo": "3.3.2", "licenseConcluded": "Apache-2.0"}]
        }),
        CYCLONEDX => json!({
            "bomFormat": "CycloneDX", "specVersion": "1.5", "version": 1,
            "metadata": {"timestamp": at},
            "components": [{"type": "library", "name": "openssl", "version": "3.3.2", "purl": "pkg:apk/alpine/openssl@3.3.2"}]
        }),
        VULN => json!({
            "invocation": {"uri": "https://github.com/acme/api/actions/runs/1"},
            "scanner": {"uri": "pkg:github/aquasecurity/trivy@0.57.0", "version": "0.57.0",
                "result": {"summary": {"critical": 0, "high": 1}, "vulnerabilities": [{"id": "CVE-2024-0001", "severity": "HIGH"}]}},
            "metadata": {"scanStartedOn": at, "scanFinishedOn": at}
        }),
        OPENVEX => json!({
            "@context": "https://openvex.dev/ns/v0.2.0", "@id": "https://example.test/vex/1",
            "author": "acme security", "timestamp": at, "version": 1,
            "statements": [{"vulnerability": {"name": "CVE-2024-0001"}, "status": "not_affected", "justification": "vulnerable_code_not_in_execute_path"}]
        }),
        other => json!({"note": format!("custom predicate {other}")}),
    }
}

fn rfc3339(t: i64) -> String {
    time::OffsetDateTime::from_unix_timestamp(t)
        .unwrap()
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap()
}

/// A DSSE envelope over `statement` with one signature.
pub fn envelope(statement: &[u8], signature: &[u8]) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "payloadType": PAYLOAD_TYPE, "payload": b64(statement),
        "signatures": [{"keyid": "", "sig": b64(signature)}]
    }))
    .unwrap()
}

/// One layer of a `.att` manifest: the envelope and its annotations.
pub struct AttLayer {
    pub envelope: Vec<u8>,
    pub annotations: serde_json::Map<String, Value>,
}

fn annotations(statement: &[u8]) -> serde_json::Map<String, Value> {
    let pt = serde_json::from_slice::<Value>(statement)
        .ok()
        .and_then(|v| v["predicateType"].as_str().map(str::to_owned))
        .unwrap_or_default();
    let mut a = serde_json::Map::new();
    a.insert("dev.cosignproject.cosign/signature".into(), json!(""));
    a.insert("predicateType".into(), json!(pt));
    a
}

/// `cosign attest --key`: the envelope signed over its PAE, no log entry.
pub fn keyed_layer(key: &Signer, statement: &[u8]) -> AttLayer {
    let sig = key.sign(&intoto::pae(PAYLOAD_TYPE, statement));
    AttLayer {
        envelope: envelope(statement, &sig),
        annotations: annotations(statement),
    }
}

/// Pushes cosign's attestation manifest at `sha256-<hex>.att` of `repo`.
pub async fn push_att(reg: &TestRegistry, repo: &str, image_digest: &str, layers: &[AttLayer]) {
    let config = serde_json::to_vec(&json!({"architecture": "", "os": "", "config": {}, "rootfs": {"type": "layers", "diff_ids": []}, "attests": image_digest})).unwrap();
    let cd = reg.push_blob(repo, &config).await;
    let mut ls = Vec::new();
    for l in layers {
        let d = reg.push_blob(repo, &l.envelope).await;
        ls.push(json!({"mediaType": "application/vnd.dsse.envelope.v1+json", "size": l.envelope.len(), "digest": d, "annotations": l.annotations}));
    }
    let m = serde_json::to_vec(&json!({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "size": config.len(), "digest": cd},
        "layers": ls
    }))
    .unwrap();
    let tag = format!("{}.att", image_digest.replace(':', "-"));
    reg.push_manifest(repo, &tag, "application/vnd.oci.image.manifest.v1+json", &m)
        .await;
}

/// `cosign attest --key --new-bundle-format`: a bundle v0.3 with a key hint.
pub fn keyed_bundle(key: &Signer, statement: &[u8]) -> Vec<u8> {
    let sig = key.sign(&intoto::pae(PAYLOAD_TYPE, statement));
    serde_json::to_vec(&json!({
        "mediaType": BUNDLE_V03,
        "verificationMaterial": {"publicKey": {"hint": "test"}, "tlogEntries": []},
        "dsseEnvelope": {"payload": b64(statement), "payloadType": PAYLOAD_TYPE, "signatures": [{"sig": b64(&sig), "keyid": ""}]}
    }))
    .unwrap()
}

/// Pushes each bundle as a referrer of `subject` and writes one referrers
/// tag-schema index listing them all (as registries without the referrers
/// API are read).
pub async fn push_bundles(reg: &TestRegistry, repo: &str, subject: &str, bundles: &[Vec<u8>]) {
    let size = reg.manifest_size(repo, subject).await;
    let referrers: Vec<(&str, &str, &[u8])> = bundles
        .iter()
        .map(|b| (BUNDLE_V03, BUNDLE_V03, b.as_slice()))
        .collect();
    crate::signing::push_referrers(reg, repo, subject, size, &referrers).await;
}

/// Fulcio extension numbers (1.3.6.1.4.1.57264.1.N) by name, for certificates minted here.
pub fn extension(name: &str) -> u64 {
    match name {
        "buildSignerUri" => 9,
        "runnerEnvironment" => 11,
        "sourceRepositoryUri" => 12,
        "sourceRepositoryRef" => 14,
        "buildConfigUri" => 18,
        "buildTrigger" => 20,
        other => panic!("no Fulcio extension {other} here"),
    }
}

impl Sigstore {
    /// `cosign attest` keyless, legacy layout: the envelope signed by a
    /// fresh leaf for `subject`/`issuer` (with the named Fulcio
    /// extensions), logged in the Rekor v1 log as an `intoto` 0.0.2 entry
    /// at `integrated_time`, its SET in the layer's bundle annotation.
    pub fn attest_layer(
        &self,
        statement: &[u8],
        subject: &str,
        issuer: &str,
        extensions: &[(&str, &str)],
        not_before: i64,
        integrated_time: i64,
    ) -> AttLayer {
        self.attest_layer_as(
            LogKind::Intoto002,
            statement,
            subject,
            issuer,
            extensions,
            not_before,
            integrated_time,
        )
    }

    /// [`Sigstore::attest_layer`] logged as `kind` (`intoto` 0.0.1 as cosign
    /// before 2.0 logged attestations, `intoto` 0.0.2, or `dsse` 0.0.1).
    #[allow(clippy::too_many_arguments)]
    pub fn attest_layer_as(
        &self,
        kind: LogKind,
        statement: &[u8],
        subject: &str,
        issuer: &str,
        extensions: &[(&str, &str)],
        not_before: i64,
        integrated_time: i64,
    ) -> AttLayer {
        let ext: Vec<(u64, &str)> = extensions.iter().map(|(n, v)| (extension(n), *v)).collect();
        let (key, cert) = self.leaf_with(subject, issuer, not_before, &ext);
        let cert_pem = pem("CERTIFICATE", &cert);
        let sig = key.sign(&intoto::pae(PAYLOAD_TYPE, statement));
        let envelope = envelope(statement, &sig);
        let body = crate::entries::attestation_body(kind, &envelope, statement, &sig, &cert_pem);
        let mut annotations = annotations(statement);
        annotations.insert("dev.sigstore.cosign/certificate".into(), json!(cert_pem));
        annotations.insert(
            "dev.sigstore.cosign/chain".into(),
            json!(pem("CERTIFICATE", &self.ca_der)),
        );
        annotations.insert(
            "dev.sigstore.cosign/bundle".into(),
            json!(self.set_annotation(&body, integrated_time, 11, None)),
        );
        AttLayer {
            envelope,
            annotations,
        }
    }

    /// `cosign attest --new-bundle-format` (or GitHub's attest action)
    /// against Rekor v2: a keyless bundle over `statement` with a `dsse`
    /// 0.0.2 entry, an inclusion proof and signed checkpoint, and an RFC
    /// 3161 timestamp at `stamp_at` — no SET.
    pub fn attest_bundle(
        &self,
        statement: &[u8],
        subject: &str,
        issuer: &str,
        extensions: &[(&str, &str)],
        not_before: i64,
        stamp_at: i64,
    ) -> Vec<u8> {
        let ext: Vec<(u64, &str)> = extensions.iter().map(|(n, v)| (extension(n), *v)).collect();
        let (key, cert) = self.leaf_with(subject, issuer, not_before, &ext);
        let sig = key.sign(&intoto::pae(PAYLOAD_TYPE, statement));
        let body = serde_json::to_vec(&json!({
            "apiVersion": "0.0.2", "kind": "dsse",
            "spec": {"dsseV002": {
                "payloadHash": {"algorithm": "SHA2_256", "digest": b64(&hex_sha(statement))},
                "signatures": [{"content": b64(&sig), "verifier": {"keyDetails": "PKIX_ECDSA_P256_SHA_256", "x509Certificate": {"rawBytes": b64(&cert)}}}]
            }}
        }))
        .unwrap();
        let mut leaves: Vec<[u8; 32]> = (0..5u8).map(|i| leaf_hash(&[i])).collect();
        leaves[3] = leaf_hash(&body);
        let root = tree_root(&leaves);
        let proof: Vec<String> = inclusion_proof(&leaves, 3).iter().map(|h| b64(h)).collect();
        serde_json::to_vec(&json!({
            "mediaType": BUNDLE_V03,
            "verificationMaterial": {
                "certificate": {"rawBytes": b64(&cert)},
                "tlogEntries": [{
                    "logIndex": "3",
                    "logId": {"keyId": b64(&hex_sha(&self.log_v2.spki()))},
                    "kindVersion": {"kind": "dsse", "version": "0.0.2"},
                    "inclusionProof": {
                        "logIndex": "3", "rootHash": b64(&root), "treeSize": "5", "hashes": proof,
                        "checkpoint": {"envelope": self.checkpoint(5, &root, None)}
                    },
                    "canonicalizedBody": b64(&body)
                }],
                "timestampVerificationData": {"rfc3161Timestamps": [{"signedTimestamp": b64(&self.timestamp(&sig, stamp_at, false, None))}]}
            },
            "dsseEnvelope": {"payload": b64(statement), "payloadType": PAYLOAD_TYPE, "signatures": [{"sig": b64(&sig), "keyid": ""}]}
        }))
        .unwrap()
    }
}
