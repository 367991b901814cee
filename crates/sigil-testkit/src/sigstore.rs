//! A test Sigstore: a Fulcio-like CA, a Rekor v1 log (SETs), a Rekor v2
//! tile log (Ed25519-signed checkpoints, inclusion proofs, no SETs) and an
//! RFC 3161 timestamp authority, written out as one trusted_root.json — so
//! tests can make every kind of bundle the verifier must accept, and tamper
//! with each part.

use rcgen::{
    BasicConstraints, CertificateParams, CustomExtension, ExtendedKeyUsagePurpose, IsCa, Issuer,
    KeyPair, SanType,
};
use serde_json::{Value, json};

use crate::signing::{Layer, Signer, b64, pem};
use crate::timestamp::rfc3161;
pub use crate::timestamp::{der, der_oid, seq};

/// A Fulcio-like CA and a Rekor-like log, written out as a trusted_root.json.
pub struct Sigstore {
    ca: Issuer<'static, KeyPair>,
    pub ca_der: Vec<u8>,
    pub(crate) log: Signer,
    /// The Rekor v2 log's key (Ed25519).
    pub log_v2: Signer,
    /// The timestamp authority's signing key, certificate and root.
    tsa_key: Signer,
    pub tsa_cert: Vec<u8>,
    pub tsa_root: Vec<u8>,
}

/// Fulcio's OIDC-issuer extension (v2) OID.
const ISSUER_V2: &[u64] = &[1, 3, 6, 1, 4, 1, 57264, 1, 8];

/// A GitHub Actions workflow identity, as Fulcio writes it in a certificate's SAN.
pub const GITHUB_WORKFLOW: &str =
    "https://github.com/acme/app/.github/workflows/release.yml@refs/heads/main";
/// GitHub Actions' OIDC issuer.
pub const GITHUB_ISSUER: &str = "https://token.actions.githubusercontent.com";

/// What a keyless test starts from: a real registry, a Sigstore instance
/// and its trusted root written to a temporary directory.
pub struct KeylessWorld {
    pub registry: crate::registry::TestRegistry,
    pub sigstore: Sigstore,
    pub dir: tempfile::TempDir,
    /// `dir/trusted_root.json`.
    pub root: std::path::PathBuf,
}

impl KeylessWorld {
    /// Starts the registry and writes the trusted root.
    pub async fn start() -> KeylessWorld {
        let registry = crate::registry::TestRegistry::start(crate::registry::Mode::Plain).await;
        let sigstore = Sigstore::new();
        let dir = tempfile::tempdir().unwrap();
        let root = sigstore.write_trusted_root(dir.path());
        KeylessWorld {
            registry,
            sigstore,
            dir,
            root,
        }
    }
}

fn der_utf8(s: &str) -> Vec<u8> {
    der(0x0c, s.as_bytes())
}

/// A signature made with a short-lived certificate, and its log entry.
pub struct Keyless {
    pub cert_pem: String,
    pub chain_pem: String,
    pub signature: Vec<u8>,
    pub bundle_annotation: String,
}

impl Sigstore {
    pub fn new() -> Sigstore {
        let ca_key = KeyPair::generate().unwrap();
        let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
        p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        p.distinguished_name
            .push(rcgen::DnType::CommonName, "test-fulcio");
        let ca_cert = p.self_signed(&ca_key).unwrap();
        // A timestamp authority: a root and a signing leaf (timeStamping EKU).
        let tsa_root_key = KeyPair::generate().unwrap();
        let mut rp = CertificateParams::new(Vec::<String>::new()).unwrap();
        rp.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        rp.distinguished_name
            .push(rcgen::DnType::CommonName, "test-tsa-root");
        let tsa_root = rp.self_signed(&tsa_root_key).unwrap();
        let tsa_issuer = Issuer::new(rp, tsa_root_key);
        let tsa_key = Signer::p256();
        let mut lp = CertificateParams::new(Vec::<String>::new()).unwrap();
        lp.distinguished_name
            .push(rcgen::DnType::CommonName, "test-tsa");
        lp.extended_key_usages = vec![ExtendedKeyUsagePurpose::TimeStamping];
        lp.key_usages = vec![rcgen::KeyUsagePurpose::DigitalSignature];
        lp.not_before = time::OffsetDateTime::from_unix_timestamp(1_577_836_800).unwrap();
        lp.not_after = time::OffsetDateTime::from_unix_timestamp(4_102_444_800).unwrap();
        let tsa_cert = lp.signed_by(&tsa_key.rcgen(), &tsa_issuer).unwrap();
        Sigstore {
            ca_der: ca_cert.der().to_vec(),
            ca: Issuer::new(p, ca_key),
            log: Signer::p256(),
            log_v2: Signer::ed25519(),
            tsa_key,
            tsa_cert: tsa_cert.der().to_vec(),
            tsa_root: tsa_root.der().to_vec(),
        }
    }

    /// Writes [`Sigstore::trusted_root`] to `dir/trusted_root.json`; returns its path.
    pub fn write_trusted_root(&self, dir: &std::path::Path) -> std::path::PathBuf {
        let root = dir.join("trusted_root.json");
        std::fs::write(&root, serde_json::to_vec(&self.trusted_root()).unwrap()).unwrap();
        root
    }

    /// The trusted root (Fulcio CA, both logs, the TSA) as `trusted_root.json`.
    pub fn trusted_root(&self) -> Value {
        let spki = self.log.spki();
        let spki_v2 = self.log_v2.spki();
        json!({
            "mediaType": "application/vnd.dev.sigstore.trustedroot+json;version=0.1",
            "tlogs": [{
                "baseUrl": "https://rekor.test", "hashAlgorithm": "SHA2_256",
                "publicKey": {"rawBytes": b64(&spki), "keyDetails": "PKIX_ECDSA_P256_SHA_256", "validFor": {"start": "2020-01-01T00:00:00Z"}},
                "logId": {"keyId": b64(&hex_sha(&spki))}
            }, {
                "baseUrl": "https://log2026.rekor.test", "hashAlgorithm": "SHA2_256",
                "publicKey": {"rawBytes": b64(&spki_v2), "keyDetails": "PKIX_ED25519", "validFor": {"start": "2020-01-01T00:00:00Z"}},
                "logId": {"keyId": b64(&hex_sha(&spki_v2))}
            }],
            "timestampAuthorities": [{
                "subject": {"organization": "test", "commonName": "test-tsa"},
                "uri": "https://tsa.test",
                "certChain": {"certificates": [{"rawBytes": b64(&self.tsa_cert)}, {"rawBytes": b64(&self.tsa_root)}]},
                "validFor": {"start": "2020-01-01T00:00:00Z"}
            }],
            "certificateAuthorities": [{
                "subject": {"organization": "test", "commonName": "test-fulcio"},
                "uri": "https://fulcio.test",
                "certChain": {"certificates": [{"rawBytes": b64(&self.ca_der)}]},
                "validFor": {"start": "2020-01-01T00:00:00Z"}
            }],
            "ctlogs": []
        })
    }

    /// Signs `payload` with a fresh ten-minute leaf for `subject`/`issuer`,
    /// valid from `not_before` (Unix seconds), logged at `integrated_time`.
    /// `log` signs the SET (pass another key to forge one).
    pub fn sign(
        &self,
        payload: &[u8],
        subject: &str,
        issuer: &str,
        not_before: i64,
        integrated_time: i64,
        log: Option<&Signer>,
    ) -> Keyless {
        self.sign_as(
            crate::entries::LogKind::HashedRekord,
            payload,
            subject,
            issuer,
            not_before,
            integrated_time,
            log,
        )
    }

    /// [`Sigstore::sign`] logged as `kind` (`hashedrekord` or, as cosign
    /// before 1.5 logged it, `rekord`).
    #[allow(clippy::too_many_arguments)]
    pub fn sign_as(
        &self,
        kind: crate::entries::LogKind,
        payload: &[u8],
        subject: &str,
        issuer: &str,
        not_before: i64,
        integrated_time: i64,
        log: Option<&Signer>,
    ) -> Keyless {
        let (leaf_key, cert) = self.leaf(subject, issuer, not_before);
        let cert_pem = pem("CERTIFICATE", &cert);
        let signature = leaf_key.sign(payload);
        let body = crate::entries::signature_body(kind, payload, &signature, &cert_pem);
        let bundle_annotation = self.set_annotation(&body, integrated_time, 7, log);
        Keyless {
            cert_pem,
            chain_pem: pem("CERTIFICATE", &self.ca_der),
            signature,
            bundle_annotation,
        }
    }
}

impl Sigstore {
    /// A ten-minute Fulcio leaf for `subject`/`issuer` from `not_before`: (key, DER).
    fn leaf(&self, subject: &str, issuer: &str, not_before: i64) -> (Signer, Vec<u8>) {
        self.leaf_with(subject, issuer, not_before, &[])
    }

    /// [`Sigstore::leaf`] carrying Fulcio v2 extensions: (OID arc number
    /// under 1.3.6.1.4.1.57264.1, value), each a DER UTF8String.
    pub(crate) fn leaf_with(
        &self,
        subject: &str,
        issuer: &str,
        not_before: i64,
        extensions: &[(u64, &str)],
    ) -> (Signer, Vec<u8>) {
        let leaf_key = Signer::p256();
        let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
        p.subject_alt_names = vec![SanType::URI(subject.try_into().unwrap())];
        p.extended_key_usages = vec![ExtendedKeyUsagePurpose::CodeSigning];
        p.key_usages = vec![rcgen::KeyUsagePurpose::DigitalSignature];
        p.not_before = time::OffsetDateTime::from_unix_timestamp(not_before).unwrap();
        p.not_after = time::OffsetDateTime::from_unix_timestamp(not_before + 600).unwrap();
        p.custom_extensions = vec![CustomExtension::from_oid_content(
            ISSUER_V2,
            der_utf8(issuer),
        )];
        for (n, v) in extensions {
            p.custom_extensions.push(CustomExtension::from_oid_content(
                &[1, 3, 6, 1, 4, 1, 57264, 1, *n],
                der_utf8(v),
            ));
        }
        let cert = p.signed_by(&leaf_key.rcgen(), &self.ca).unwrap();
        (leaf_key, cert.der().to_vec())
    }

    /// An RFC 3161 TimeStampResp over `signature` at `at` (Unix seconds),
    /// signed by this TSA, or by `forger` (an untrusted TSA); the TSA's
    /// certificate is embedded when `embed` is set.
    pub fn timestamp(
        &self,
        signature: &[u8],
        at: i64,
        embed: bool,
        forger: Option<&Signer>,
    ) -> Vec<u8> {
        self.timestamp_naming(signature, at, embed, forger, Some(self.tsa_cert.as_slice()))
    }

    /// [`Sigstore::timestamp`] whose signed signing-certificate attribute
    /// (ESSCertIDv2) names `ess_cert` — or is left out, given `None`.
    pub fn timestamp_naming(
        &self,
        signature: &[u8],
        at: i64,
        embed: bool,
        forger: Option<&Signer>,
        ess_cert: Option<&[u8]>,
    ) -> Vec<u8> {
        let embedded: &[&[u8]] = if embed { &[&self.tsa_cert] } else { &[] };
        rfc3161(
            signature,
            at,
            forger.unwrap_or(&self.tsa_key),
            embedded,
            ess_cert,
        )
    }

    /// A checkpoint for (`size`, `root`) of the Rekor v2 log, signed by it
    /// (or by `forger`), with a witness cosignature line before it.
    pub fn checkpoint(&self, size: u64, root: &[u8; 32], forger: Option<&Signer>) -> String {
        let origin = "log2026.rekor.test";
        let key = forger.unwrap_or(&self.log_v2);
        signed_note(origin, origin, size, root, (key, &self.log_v2), true)
    }

    /// A checkpoint of the Rekor v2 log, signed by its key, naming `origin`
    /// (a log's key used for another log's name).
    pub fn checkpoint_naming(&self, origin: &str, size: u64, root: &[u8; 32]) -> String {
        signed_note(
            origin,
            origin,
            size,
            root,
            (&self.log_v2, &self.log_v2),
            false,
        )
    }

    /// A checkpoint of the Rekor v1 log (origin `rekor.test - <tree id>`,
    /// signed as `rekor.test`, as rekor.sigstore.dev names its shards and
    /// itself).
    pub(crate) fn checkpoint_v1(&self, size: u64, root: &[u8; 32]) -> String {
        let origin = "rekor.test - 1193050959916656506";
        signed_note(
            origin,
            "rekor.test",
            size,
            root,
            (&self.log, &self.log),
            false,
        )
    }

    /// A keyless bundle as cosign writes it against Rekor v2: a DSSE
    /// envelope (cosign's sign predicate over `digest`) signed with a fresh
    /// leaf for `subject`/`issuer` valid from `not_before`, logged as a
    /// `hashedrekord` 0.0.2 entry at index 5 of a 9-entry tree with an
    /// inclusion proof and a signed checkpoint, and stamped by the TSA at
    /// `stamp_at`. No SET and no integrated time: the timestamp is the only
    /// signing time.
    pub fn rekor_v2_bundle(
        &self,
        digest: &str,
        subject: &str,
        issuer: &str,
        not_before: i64,
        stamp_at: i64,
    ) -> Value {
        let statement = crate::intoto::statement(digest, crate::intoto::COSIGN_SIGN, json!({}));
        let pt = crate::intoto::PAYLOAD_TYPE;
        let pae = crate::intoto::pae(pt, &statement);
        let (key, cert) = self.leaf(subject, issuer, not_before);
        let sig = key.sign(&pae);
        let body = serde_json::to_vec(&json!({
            "apiVersion": "0.0.2", "kind": "hashedrekord",
            "spec": {"hashedRekordV002": {
                "data": {"algorithm": "SHA2_256", "digest": b64(&hex_sha(&pae))},
                "signature": {"content": b64(&sig), "verifier": {"keyDetails": "PKIX_ECDSA_P256_SHA_256", "x509Certificate": {"rawBytes": b64(&cert)}}}
            }}
        }))
        .unwrap();
        let mut leaves: Vec<[u8; 32]> = (0..9u8).map(|i| leaf_hash(&[i])).collect();
        leaves[5] = leaf_hash(&body);
        let root = tree_root(&leaves);
        let proof: Vec<String> = inclusion_proof(&leaves, 5).iter().map(|h| b64(h)).collect();
        json!({
            "mediaType": "application/vnd.dev.sigstore.bundle.v0.3+json",
            "verificationMaterial": {
                "certificate": {"rawBytes": b64(&cert)},
                "tlogEntries": [{
                    "logIndex": "5",
                    "logId": {"keyId": b64(&hex_sha(&self.log_v2.spki()))},
                    "kindVersion": {"kind": "hashedrekord", "version": "0.0.2"},
                    "inclusionProof": {
                        "logIndex": "5", "rootHash": b64(&root), "treeSize": "9", "hashes": proof,
                        "checkpoint": {"envelope": self.checkpoint(9, &root, None)}
                    },
                    "canonicalizedBody": b64(&body)
                }],
                "timestampVerificationData": {"rfc3161Timestamps": [{"signedTimestamp": b64(&self.timestamp(&sig, stamp_at, false, None))}]}
            },
            "dsseEnvelope": {"payload": b64(&statement), "payloadType": pt, "signatures": [{"sig": b64(&sig), "keyid": ""}]}
        })
    }
}

/// A signed note (`origin\nsize\nbase64(root)\n`) with `name`'s
/// signature by `key` under the key hint of `hint` (the log's; a forger
/// signs under it), after a witness's cosignature when `witness`.
fn signed_note(
    origin: &str,
    name: &str,
    size: u64,
    root: &[u8; 32],
    (key, hint): (&Signer, &Signer),
    witness: bool,
) -> String {
    let note = format!("{origin}\n{size}\n{}\n", b64(root));
    let mut sig = hex_sha(&hint.spki())[..4].to_vec();
    sig.extend(key.sign(note.as_bytes()));
    let mut out = format!("{note}\n");
    if witness {
        let w = Signer::ed25519();
        let mut wsig = hex_sha(&w.spki())[..4].to_vec();
        wsig.extend(w.sign(note.as_bytes()));
        out.push_str(&format!("\u{2014} witness.test {}\n", b64(&wsig)));
    }
    out.push_str(&format!("\u{2014} {name} {}\n", b64(&sig)));
    out
}

/// RFC 6962 leaf hash.
pub fn leaf_hash(entry: &[u8]) -> [u8; 32] {
    let mut m = vec![0u8];
    m.extend_from_slice(entry);
    hex_sha(&m).try_into().unwrap()
}

fn node(l: &[u8; 32], r: &[u8; 32]) -> [u8; 32] {
    hex_sha(&[&[1u8][..], l, r].concat()).try_into().unwrap()
}

fn split(n: usize) -> usize {
    let k = n.next_power_of_two() / 2;
    if k == n { n / 2 } else { k }
}

/// The RFC 6962 tree head of `leaves` (the test oracle).
pub fn tree_root(leaves: &[[u8; 32]]) -> [u8; 32] {
    match leaves.len() {
        1 => leaves[0],
        n => {
            let k = split(n);
            node(&tree_root(&leaves[..k]), &tree_root(&leaves[k..]))
        }
    }
}

/// The RFC 6962 audit path of leaf `m` (the test oracle).
pub fn inclusion_proof(leaves: &[[u8; 32]], m: usize) -> Vec<[u8; 32]> {
    let n = leaves.len();
    if n == 1 {
        return Vec::new();
    }
    let k = split(n);
    if m < k {
        let mut p = inclusion_proof(&leaves[..k], m);
        p.push(tree_root(&leaves[k..]));
        p
    } else {
        let mut p = inclusion_proof(&leaves[k..], m - k);
        p.push(tree_root(&leaves[..k]));
        p
    }
}

impl Keyless {
    pub fn layer(&self, payload: Vec<u8>) -> Layer {
        let mut l = Layer::new(payload, &self.signature);
        l.annotations.insert(
            "dev.sigstore.cosign/certificate".into(),
            json!(self.cert_pem),
        );
        l.annotations
            .insert("dev.sigstore.cosign/chain".into(), json!(self.chain_pem));
        l.annotations.insert(
            "dev.sigstore.cosign/bundle".into(),
            json!(self.bundle_annotation),
        );
        l
    }
}

pub(crate) fn hex_sha(d: &[u8]) -> Vec<u8> {
    use sha2::Digest;
    sha2::Sha256::digest(d).to_vec()
}

pub(crate) fn hex(d: &[u8]) -> String {
    d.iter().map(|b| format!("{b:02x}")).collect()
}

impl Sigstore {
    /// The Rekor v1 log's SET over `body` at `integrated_time`,
    /// `log_index` (signed by `log` instead, to forge one).
    pub(crate) fn signed_entry_timestamp(
        &self,
        body: &[u8],
        integrated_time: i64,
        log_index: u64,
        log: Option<&Signer>,
    ) -> Vec<u8> {
        let log_id = hex(&hex_sha(&self.log.spki()));
        let msg = format!(
            "{{\"body\":\"{}\",\"integratedTime\":{integrated_time},\"logID\":\"{log_id}\",\"logIndex\":{log_index}}}",
            b64(body)
        );
        log.unwrap_or(&self.log).sign(msg.as_bytes())
    }

    /// cosign's bundle annotation for `body` logged at `integrated_time`
    /// (a SET by this log's key, or by `log` to forge one).
    pub fn set_annotation(
        &self,
        body: &[u8],
        integrated_time: i64,
        log_index: u64,
        log: Option<&Signer>,
    ) -> String {
        let log_id = hex(&hex_sha(&self.log.spki()));
        let body_b64 = b64(body);
        let set = self.signed_entry_timestamp(body, integrated_time, log_index, log);
        serde_json::to_string(&json!({
            "SignedEntryTimestamp": b64(&set),
            "Payload": {"body": body_b64, "integratedTime": integrated_time, "logIndex": log_index, "logID": log_id}
        }))
        .unwrap()
    }
}
