//! Signing inside the tests, the way cosign and notation sign: keys of each
//! family, simple-signing payloads, a Fulcio-like CA with ten-minute leaves,
//! a Rekor-like log key producing SETs, Sigstore bundles, and notation JWS
//! envelopes. Everything is pushed into the real registry through its API.

use crate::intoto;
use aws_lc_rs::encoding::AsDer;
use aws_lc_rs::rand::SystemRandom;
use aws_lc_rs::signature::{self, EcdsaKeyPair, Ed25519KeyPair, KeyPair as _};
use base64::Engine as _;
use rcgen::{CertificateParams, ExtendedKeyUsagePurpose, KeyPair};
use serde_json::{Value, json};

use crate::registry::{TestRegistry, sha256};

pub fn b64(d: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(d)
}

/// DER as PEM with `label` (CERTIFICATE, PUBLIC KEY, X509 CRL, …).
pub fn pem(label: &str, der: &[u8]) -> String {
    let body = b64(der);
    let lines: Vec<&str> = body
        .as_bytes()
        .chunks(64)
        .map(|c| std::str::from_utf8(c).unwrap())
        .collect();
    format!(
        "-----BEGIN {label}-----\n{}\n-----END {label}-----\n",
        lines.join("\n")
    )
}

/// A signing key of one family.
pub enum Signer {
    P256(EcdsaKeyPair),
    Ed25519(Ed25519KeyPair),
    Rsa(aws_lc_rs::rsa::KeyPair),
}

impl Signer {
    pub fn p256() -> Signer {
        Signer::P256(EcdsaKeyPair::generate(&signature::ECDSA_P256_SHA256_ASN1_SIGNING).unwrap())
    }
    pub fn ed25519() -> Signer {
        Signer::Ed25519(Ed25519KeyPair::generate().unwrap())
    }
    pub fn rsa() -> Signer {
        Signer::Rsa(aws_lc_rs::rsa::KeyPair::generate(aws_lc_rs::rsa::KeySize::Rsa2048).unwrap())
    }

    /// SubjectPublicKeyInfo DER.
    pub fn spki(&self) -> Vec<u8> {
        match self {
            Signer::P256(k) => k.public_key().as_der().unwrap().as_ref().to_vec(),
            Signer::Ed25519(k) => k.public_key().as_der().unwrap().as_ref().to_vec(),
            Signer::Rsa(k) => k.public_key().as_der().unwrap().as_ref().to_vec(),
        }
    }

    pub fn public_pem(&self) -> String {
        pem("PUBLIC KEY", &self.spki())
    }

    /// The signature cosign would make (ASN.1 ECDSA, pure Ed25519, RSA PKCS#1 v1.5 SHA-256).
    pub fn sign(&self, msg: &[u8]) -> Vec<u8> {
        let rng = SystemRandom::new();
        match self {
            Signer::P256(k) => k.sign(&rng, msg).unwrap().as_ref().to_vec(),
            Signer::Ed25519(k) => k.sign(msg).as_ref().to_vec(),
            Signer::Rsa(k) => {
                let mut sig = vec![0; k.public_modulus_len()];
                k.sign(&signature::RSA_PKCS1_SHA256, &rng, msg, &mut sig)
                    .unwrap();
                sig
            }
        }
    }

    /// JWS PS256 / ES256 signature (fixed-width ECDSA).
    pub fn sign_jose(&self, msg: &[u8]) -> Vec<u8> {
        let rng = SystemRandom::new();
        match self {
            Signer::Rsa(k) => {
                let mut sig = vec![0; k.public_modulus_len()];
                k.sign(&signature::RSA_PSS_SHA256, &rng, msg, &mut sig)
                    .unwrap();
                sig
            }
            Signer::P256(k) => {
                let pkcs8 = k.to_pkcs8v1().unwrap();
                let fixed = EcdsaKeyPair::from_pkcs8(
                    &signature::ECDSA_P256_SHA256_FIXED_SIGNING,
                    pkcs8.as_ref(),
                )
                .unwrap();
                fixed.sign(&rng, msg).unwrap().as_ref().to_vec()
            }
            Signer::Ed25519(_) => unreachable!("notation does not use Ed25519"),
        }
    }

    /// The key as rcgen sees it, to put it in a certificate.
    pub fn rcgen(&self) -> KeyPair {
        let der = match self {
            Signer::P256(k) => k.to_pkcs8v1().unwrap().as_ref().to_vec(),
            Signer::Rsa(k) => k.as_der().unwrap().as_ref().to_vec(),
            Signer::Ed25519(_) => unreachable!(),
        };
        let der = rustls::pki_types::PrivatePkcs8KeyDer::from(der);
        match self {
            Signer::Rsa(_) => {
                KeyPair::from_pkcs8_der_and_sign_algo(&der, &rcgen::PKCS_RSA_SHA256).unwrap()
            }
            _ => KeyPair::try_from(&der).unwrap(),
        }
    }
}

/// cosign's simple-signing payload for `digest`.
pub fn simple_signing(reference: &str, digest: &str) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "critical": {
            "identity": {"docker-reference": reference},
            "image": {"docker-manifest-digest": digest},
            "type": "cosign container image signature"
        },
        "optional": null
    }))
    .unwrap()
}

/// One layer of a legacy `.sig` manifest.
pub struct Layer {
    pub payload: Vec<u8>,
    pub annotations: serde_json::Map<String, Value>,
}

impl Layer {
    pub fn new(payload: Vec<u8>, signature: &[u8]) -> Layer {
        let mut annotations = serde_json::Map::new();
        annotations.insert(
            "dev.cosignproject.cosign/signature".into(),
            json!(b64(signature)),
        );
        Layer {
            payload,
            annotations,
        }
    }
}

/// Pushes a legacy cosign signature manifest at `sha256-<hex>.sig` of `repo`.
pub async fn push_legacy(reg: &TestRegistry, repo: &str, image_digest: &str, layers: Vec<Layer>) {
    // One config blob per signature: concurrent uploads of one shared blob
    // race in distribution 2.x.
    let config = serde_json::to_vec(&json!({"architecture": "", "config": {}, "created": "0001-01-01T00:00:00Z", "os": "", "rootfs": {"type": "layers", "diff_ids": []}, "signs": image_digest})).unwrap();
    let cd = reg.push_blob(repo, &config).await;
    let mut pushed = Vec::new();
    for l in &layers {
        pushed.push((reg.push_blob(repo, &l.payload).await, l));
    }
    let m = legacy_manifest((&cd, config.len()), &pushed);
    let tag = format!("{}.sig", image_digest.replace(':', "-"));
    reg.push_manifest(repo, &tag, "application/vnd.oci.image.manifest.v1+json", &m)
        .await;
}

/// A legacy cosign `.sig` manifest over config (digest, size): one
/// simple-signing layer per (payload digest, layer), with its annotations.
pub fn legacy_manifest(config: (&str, usize), layers: &[(String, &Layer)]) -> Vec<u8> {
    let ls: Vec<Value> = layers
        .iter()
        .map(|(d, l)| {
            json!({
                "mediaType": "application/vnd.dev.cosign.simplesigning.v1+json",
                "size": l.payload.len(), "digest": d, "annotations": l.annotations
            })
        })
        .collect();
    serde_json::to_vec(&json!({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "size": config.1, "digest": config.0},
        "layers": ls
    }))
    .unwrap()
}

/// Pushes an image and a legacy cosign signature of it by `key`, stored in
/// `sig_repo` (the simple-signing payload names `<registry>/<repo>`);
/// returns the image digest.
pub async fn push_signed(
    reg: &TestRegistry,
    repo: &str,
    tag: &str,
    sig_repo: &str,
    key: &Signer,
) -> String {
    let digest = reg.push_image(repo, tag).await;
    let payload = simple_signing(&format!("{}/{repo}", reg.host()), &digest);
    let sig = key.sign(&payload);
    push_legacy(reg, sig_repo, &digest, vec![Layer::new(payload, &sig)]).await;
    digest
}

/// Pushes `blob` as a referrer of `subject` (manifest with `artifactType`,
/// one layer) and records it in the referrers tag-schema index, which is
/// where clients look on registries without the referrers API.
pub async fn push_referrer(
    reg: &TestRegistry,
    repo: &str,
    subject: &str,
    subject_size: usize,
    artifact_type: &str,
    layer_media_type: &str,
    blob: &[u8],
) {
    push_referrers(
        reg,
        repo,
        subject,
        subject_size,
        &[(artifact_type, layer_media_type, blob)],
    )
    .await;
}

/// Pushes each (artifactType, layer media type, blob) as a referrer of
/// `subject` and writes one referrers tag-schema index listing them all.
pub async fn push_referrers(
    reg: &TestRegistry,
    repo: &str,
    subject: &str,
    subject_size: usize,
    referrers: &[(&str, &str, &[u8])],
) {
    let empty = reg.push_blob(repo, b"{}").await;
    let mut listed = Vec::new();
    for (artifact_type, layer_media_type, blob) in referrers {
        let bd = reg.push_blob(repo, blob).await;
        let m = serde_json::to_vec(&json!({
            "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "artifactType": artifact_type,
            "config": {"mediaType": "application/vnd.oci.empty.v1+json", "size": 2, "digest": empty},
            "layers": [{"mediaType": layer_media_type, "size": blob.len(), "digest": bd}],
            "subject": {"mediaType": "application/vnd.oci.image.manifest.v1+json", "size": subject_size, "digest": subject}
        }))
        .unwrap();
        let md = sha256(&m);
        reg.push_manifest(repo, &md, "application/vnd.oci.image.manifest.v1+json", &m)
            .await;
        listed.push(json!({"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": md, "size": m.len(), "artifactType": artifact_type}));
    }
    let index = serde_json::to_vec(&json!({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json", "manifests": listed
    }))
    .unwrap();
    reg.push_manifest(
        repo,
        &subject.replace(':', "-"),
        "application/vnd.oci.image.index.v1+json",
        &index,
    )
    .await;
}

pub use crate::sigstore::{Keyless, Sigstore};

/// A Sigstore bundle v0.3 as `cosign sign --new-bundle-format --key` writes
/// it: DSSE envelope over an in-toto statement naming `digest`.
pub fn dsse_bundle(key: &Signer, digest: &str) -> Vec<u8> {
    let statement = intoto::statement(digest, intoto::COSIGN_SIGN, json!({}));
    let pt = intoto::PAYLOAD_TYPE;
    let pae = intoto::pae(pt, &statement);
    let sig = key.sign(&pae);
    serde_json::to_vec(&json!({
        "mediaType": "application/vnd.dev.sigstore.bundle.v0.3+json",
        "verificationMaterial": {"publicKey": {"hint": "test"}, "tlogEntries": []},
        "dsseEnvelope": {"payload": b64(&statement), "payloadType": pt, "signatures": [{"sig": b64(&sig), "keyid": ""}]}
    }))
    .unwrap()
}

/// A self-signed notation signing certificate for `key` (a trust root).
pub fn notation_cert(key: &Signer, name: &str) -> (Vec<u8>, String) {
    notation_cert_with(key, name, None, true)
}

/// [`notation_cert`] valid only between `validity` (Unix seconds), and
/// without the digitalSignature key usage when `digital_signature` is false.
pub fn notation_cert_with(
    key: &Signer,
    name: &str,
    validity: Option<(i64, i64)>,
    digital_signature: bool,
) -> (Vec<u8>, String) {
    let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
    p.distinguished_name.push(rcgen::DnType::CommonName, name);
    p.key_usages = if digital_signature {
        vec![rcgen::KeyUsagePurpose::DigitalSignature]
    } else {
        vec![rcgen::KeyUsagePurpose::KeyEncipherment]
    };
    p.extended_key_usages = vec![ExtendedKeyUsagePurpose::CodeSigning];
    if let Some((from, until)) = validity {
        p.not_before = time::OffsetDateTime::from_unix_timestamp(from).unwrap();
        p.not_after = time::OffsetDateTime::from_unix_timestamp(until).unwrap();
    }
    let c = p.self_signed(&key.rcgen()).unwrap();
    (c.der().to_vec(), c.pem())
}

/// A notation JWS envelope over `digest`, signed by `key` with certificate `cert_der`.
pub fn notation_jws(
    key: &Signer,
    alg: &str,
    cert_der: &[u8],
    digest: &str,
    size: usize,
) -> Vec<u8> {
    notation_jws_with(key, alg, cert_der, digest, size, json!({}))
}

/// [`notation_jws`] with protected-header fields set (or, given `null`,
/// removed) by `header`, signed after the change — a signer that wrote
/// those headers, not a tampered envelope.
pub fn notation_jws_with(
    key: &Signer,
    alg: &str,
    cert_der: &[u8],
    digest: &str,
    size: usize,
    header: Value,
) -> Vec<u8> {
    notation_jws_chain(key, alg, &[cert_der.to_vec()], digest, size, header, None)
}

/// A timestamp authority's countersignature over a signature (`notation
/// sign --timestamp-url`): given the signature bytes, the RFC 3161 token.
pub type Countersign<'a> = &'a dyn Fn(&[u8]) -> Vec<u8>;

/// [`notation_jws_with`] carrying the whole `chain` (signing certificate
/// first) and, given `stamp`, an RFC 3161 timestamp countersignature in the
/// unprotected header.
pub fn notation_jws_chain(
    key: &Signer,
    alg: &str,
    chain: &[Vec<u8>],
    digest: &str,
    size: usize,
    header: Value,
    stamp: Option<Countersign<'_>>,
) -> Vec<u8> {
    let url = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let payload = serde_json::to_vec(&json!({"targetArtifact": {"digest": digest, "mediaType": "application/vnd.oci.image.manifest.v1+json", "size": size}})).unwrap();
    let mut protected = json!({
        "alg": alg, "crit": ["io.cncf.notary.signingScheme"],
        "cty": "application/vnd.cncf.notary.payload.v1+json",
        "io.cncf.notary.signingScheme": "notary.x509",
        "io.cncf.notary.signingTime": time::OffsetDateTime::now_utc().format(&time::format_description::well_known::Rfc3339).unwrap()
    });
    for (k, v) in header.as_object().into_iter().flatten() {
        match v {
            Value::Null => drop(protected.as_object_mut().unwrap().remove(k)),
            v => protected[k] = v.clone(),
        }
    }
    let protected = serde_json::to_vec(&protected).unwrap();
    let (p64, pl64) = (url.encode(&protected), url.encode(&payload));
    let sig = key.sign_jose(format!("{p64}.{pl64}").as_bytes());
    let x5c: Vec<String> = chain.iter().map(|c| b64(c)).collect();
    let mut unprotected = json!({"x5c": x5c});
    if let Some(stamp) = stamp {
        unprotected["io.cncf.notary.timestampSignature"] = b64(&stamp(&sig)).into();
    }
    serde_json::to_vec(&json!({"payload": pl64, "protected": p64, "header": unprotected, "signature": url.encode(sig)})).unwrap()
}

/// The same notation signature as a COSE_Sign1 envelope (`notation sign
/// --signature-format cose`), ES256 with a P-256 key.
pub fn notation_cose(key: &Signer, cert_der: &[u8], digest: &str, size: usize) -> Vec<u8> {
    notation_cose_stamped(key, cert_der, digest, size, None)
}

/// [`notation_cose`] with, given `stamp`, an RFC 3161 countersignature in
/// the unprotected header.
pub fn notation_cose_stamped(
    key: &Signer,
    cert_der: &[u8],
    digest: &str,
    size: usize,
    stamp: Option<Countersign<'_>>,
) -> Vec<u8> {
    use coset::{CoseSign1Builder, HeaderBuilder, TaggedCborSerializable, iana};
    let payload = serde_json::to_vec(&json!({"targetArtifact": {"digest": digest, "mediaType": "application/vnd.oci.image.manifest.v1+json", "size": size}})).unwrap();
    let now = time::OffsetDateTime::now_utc().unix_timestamp();
    let protected = HeaderBuilder::new()
        .algorithm(iana::Algorithm::ES256)
        .content_type("application/vnd.cncf.notary.payload.v1+json".into())
        .add_critical_label(coset::RegisteredLabel::Text(
            "io.cncf.notary.signingScheme".into(),
        ))
        .text_value(
            "io.cncf.notary.signingScheme".into(),
            ciborium::Value::Text("notary.x509".into()),
        )
        .text_value(
            "io.cncf.notary.signingTime".into(),
            ciborium::Value::Tag(1, Box::new(ciborium::Value::Integer(now.into()))),
        )
        .build();
    let unprotected = HeaderBuilder::new()
        .value(
            33,
            ciborium::Value::Array(vec![ciborium::Value::Bytes(cert_der.to_vec())]),
        )
        .build();
    let mut sign1 = CoseSign1Builder::new()
        .protected(protected)
        .unprotected(unprotected)
        .payload(payload)
        .create_signature(b"", |m| key.sign_jose(m))
        .build();
    if let Some(stamp) = stamp {
        let token = stamp(&sign1.signature);
        sign1.unprotected.rest.push((
            coset::Label::Text("io.cncf.notary.timestampSignature".into()),
            ciborium::Value::Bytes(token),
        ));
    }
    sign1.to_tagged_vec().unwrap()
}
