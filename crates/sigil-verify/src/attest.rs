//! Attestations of one digest: reading them in both layouts and checking a
//! rule's attestation entries against them.
//!
//! Owns the two forms an attestation arrives in — a layer of cosign's
//! `sha256-<hex>.att` manifest (a DSSE envelope, with the certificate, chain
//! and Rekor bundle in the layer's annotations) and a Sigstore bundle found
//! through referrers whose statement is not cosign's signature predicate —
//! and, for each entry, verifying every attestation of its predicate type
//! with the entry's attestors (the same checks as a signature: key or
//! certificate, chain at the verified time, log entries, timestamps), binding
//! its in-toto subject to the pinned digest, and evaluating the entry's
//! conditions over what verified. What passes is decided in sigil-core
//! ([`EntryOutcome::passed`]); nothing here fetches.

use std::collections::BTreeMap;
use std::sync::Arc;

use base64::Engine as _;
use serde_json::Value;
use sigil_core::SignatureProblem;
use sigil_core::attest::{Evidence, Statement};
use sigil_core::verify::attestations::{AttestationRequirement, EntryOutcome, Seen};

use crate::cosign::{CosignCheck, Item};
use crate::rekor::Entry;
use crate::{ArtifactError, Check, Loaded, x509};

/// Media type of a `.att` layer: a DSSE envelope.
pub const DSSE_MEDIA_TYPE: &str = "application/vnd.dsse.envelope.v1+json";
/// The DSSE payload type of an in-toto statement.
pub const INTOTO_PAYLOAD_TYPE: &str = "application/vnd.in-toto+json";

/// One attestation, read but not yet verified.
#[derive(Debug, Clone)]
pub struct Attestation {
    /// The statement's `predicateType`, as it claims (verified before use).
    pub predicate_type: String,
    /// The signed statement's bytes.
    pub payload: Vec<u8>,
    /// How it is signed.
    pub form: Form,
}

/// The layout an attestation came in.
#[derive(Debug, Clone)]
pub enum Form {
    /// A `.att` layer: checked like a legacy signature over the DSSE PAE.
    Legacy(Box<Item>),
    /// A Sigstore bundle: verified as a whole.
    Bundle(Arc<[u8]>),
}

/// The `predicateType` of an in-toto statement, reading nothing else into memory.
pub fn peek_predicate_type(payload: &[u8]) -> Result<String, ArtifactError> {
    #[derive(serde::Deserialize)]
    struct Peek {
        #[serde(rename = "predicateType", default)]
        predicate_type: Option<String>,
    }
    let p: Peek = serde_json::from_slice(payload)
        .map_err(|e| ArtifactError::Malformed(format!("the attestation's statement: {e}")))?;
    p.predicate_type.filter(|t| !t.is_empty()).ok_or_else(|| {
        ArtifactError::Malformed("the attestation's statement has no predicateType".into())
    })
}

/// A layer of a `.att` manifest: the DSSE envelope and the layer's annotations.
pub fn from_att_layer(
    envelope: &[u8],
    annotations: &serde_json::Map<String, Value>,
) -> Result<Attestation, ArtifactError> {
    let bad = |m: String| ArtifactError::Malformed(format!("attestation envelope: {m}"));
    let v: Value = serde_json::from_slice(envelope).map_err(|e| bad(e.to_string()))?;
    let std = base64::engine::general_purpose::STANDARD;
    let field = |p: &str| {
        v.pointer(p)
            .and_then(Value::as_str)
            .ok_or_else(|| bad(format!("no {p}")))
    };
    let payload_type = field("/payloadType")?;
    if payload_type != INTOTO_PAYLOAD_TYPE {
        return Err(bad(format!(
            "payload type {payload_type:?} is not an in-toto statement"
        )));
    }
    let sigs = v
        .get("signatures")
        .and_then(Value::as_array)
        .map_or(0, Vec::len);
    if sigs != 1 {
        return Err(bad(format!("{sigs} signatures; exactly one is required")));
    }
    let payload = std
        .decode(field("/payload")?.trim())
        .map_err(|e| bad(format!("payload: {e}")))?;
    let signature = std
        .decode(field("/signatures/0/sig")?.trim())
        .map_err(|e| bad(format!("signature: {e}")))?;
    let ann = |k: &str| annotations.get(k).and_then(Value::as_str);
    let cert = match ann(crate::cosign::CERT_ANNOTATION).filter(|s| !s.trim().is_empty()) {
        Some(pem) => Some(
            x509::certs_from_pem(pem)
                .into_iter()
                .next()
                .ok_or_else(|| bad("certificate annotation holds no certificate".into()))?,
        ),
        None => None,
    };
    let predicate_type = peek_predicate_type(&payload)?;
    let item = Item {
        message: crate::pae(payload_type, &payload),
        payload_sha256: crate::sha256(&payload),
        signature,
        cert,
        entries: ann(crate::cosign::BUNDLE_ANNOTATION)
            .map(|b| vec![Entry::from_legacy_annotation(b)])
            .unwrap_or_default(),
        signed_digest: Err(ArtifactError::Malformed(
            "an attestation is bound by its subject".into(),
        )),
        bundle: None,
        envelope_sha256: Some(crate::sha256(envelope)),
    };
    Ok(Attestation {
        predicate_type,
        payload,
        form: Form::Legacy(Box::new(item)),
    })
}

/// A Sigstore bundle from a referrer, if its DSSE statement is an
/// attestation (`Ok(None)`: it is cosign's image signature, or signs a message).
pub fn from_bundle(bytes: &[u8]) -> Result<Option<Attestation>, ArtifactError> {
    #[derive(serde::Deserialize)]
    struct Envelope {
        #[serde(rename = "dsseEnvelope", default)]
        dsse: Option<Dsse>,
    }
    #[derive(serde::Deserialize)]
    struct Dsse {
        #[serde(rename = "payloadType", default)]
        payload_type: String,
        #[serde(default)]
        payload: String,
    }
    let b: Envelope = serde_json::from_slice(bytes)
        .map_err(|e| ArtifactError::Malformed(format!("bundle: {e}")))?;
    let Some(d) = b.dsse.filter(|d| d.payload_type == INTOTO_PAYLOAD_TYPE) else {
        return Ok(None);
    };
    let payload = base64::engine::general_purpose::STANDARD
        .decode(d.payload.trim())
        .map_err(|e| ArtifactError::Malformed(format!("bundle payload: {e}")))?;
    let predicate_type = peek_predicate_type(&payload)?;
    if predicate_type == crate::cosign::SIGN_PREDICATE {
        return Ok(None);
    }
    Ok(Some(Attestation {
        predicate_type,
        payload,
        form: Form::Bundle(bytes.into()),
    }))
}

/// What a condition's `signer` holds: the verifier's name, the certificate's
/// subject and issuer, and every Fulcio extension present, by name.
pub fn signer_vars(verifier: &str, id: Option<&x509::Identity>) -> BTreeMap<String, String> {
    let mut out = id.map(|i| i.extensions.clone()).unwrap_or_default();
    out.insert("verifier".into(), verifier.to_owned());
    if let Some(i) = id {
        if let Some(s) = i.subjects.first() {
            out.insert("subject".into(), s.clone());
        }
        if let Some(iss) = &i.issuer {
            out.insert("issuer".into(), iss.clone());
        }
    }
    out
}

impl CosignCheck {
    /// Verifies one attestation as a signature is verified, and binds its
    /// statement's subject to `digest`: (verified times, certificate identity).
    pub fn verify_attestation(
        &self,
        a: &Attestation,
        digest: &str,
        now: i64,
    ) -> Result<crate::cosign::Checked, SignatureProblem> {
        match &a.form {
            Form::Bundle(b) => self
                .verify_bundle(b, digest)
                .map(|v| crate::cosign::Checked {
                    times: v.times,
                    identity: v.identity,
                }),
            Form::Legacy(item) => {
                let checked = self.check_signed(item, now)?;
                let d = crate::bundle::Artifact::Digest(crate::cosign::sha256_bytes(digest)?);
                crate::bundle::subject_binds(&a.payload, &d)?;
                Ok(checked)
            }
        }
    }
}

/// Checks every entry of a rule against the attestations found for
/// `digest` in `repository`, each entry with its loaded attestors.
pub fn entries(
    requirements: &[AttestationRequirement],
    attestors: &[Vec<Loaded>],
    found: &[Result<Attestation, ArtifactError>],
    repository: &str,
    digest: &str,
    now: i64,
) -> Vec<EntryOutcome> {
    let image = BTreeMap::from([
        ("repository".to_owned(), repository.to_owned()),
        ("digest".to_owned(), digest.to_owned()),
        ("reference".to_owned(), format!("{repository}@{digest}")),
    ]);
    requirements
        .iter()
        .zip(attestors)
        .map(|(req, loaded)| entry(req, loaded, found, &image, digest, now))
        .collect()
}

/// At most this many attestation checks (CEL conditions) run at once, on
/// threads of their own: however many Pods a team sends with costly
/// conditions, the server's async workers keep answering everyone else.
fn cel_slots() -> &'static tokio::sync::Semaphore {
    static SLOTS: std::sync::OnceLock<tokio::sync::Semaphore> = std::sync::OnceLock::new();
    SLOTS.get_or_init(|| {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        tokio::sync::Semaphore::new(cores.div_ceil(2).max(1))
    })
}

/// [`entries`] off the async workers (a blocking thread, one of a bounded
/// few), answered by `deadline`: past it, the admission gets a timeout
/// (transient, so not cached) while the evaluation finishes on its own —
/// its cost is bounded by the conditions' budget ([`sigil_core::attest::cost`]).
#[allow(clippy::too_many_arguments)]
pub async fn entries_off_workers(
    requirements: Vec<AttestationRequirement>,
    set: std::sync::Arc<crate::material::LoadedSet>,
    found: Vec<Result<Attestation, ArtifactError>>,
    repository: String,
    digest: String,
    now: i64,
    deadline: std::time::Instant,
) -> Result<Vec<EntryOutcome>, sigil_core::ResolveFailure> {
    if requirements.is_empty() {
        return Ok(Vec::new());
    }
    let budget = deadline.saturating_duration_since(std::time::Instant::now());
    let timeout = || sigil_core::ResolveFailure::Timeout { budget };
    let run = async {
        let permit = cel_slots().acquire().await.map_err(|_| timeout())?;
        let task = tokio::task::spawn_blocking(move || {
            let _permit = permit;
            entries(
                &requirements,
                &set.attestors,
                &found,
                &repository,
                &digest,
                now,
            )
        });
        task.await
            .map_err(|_| sigil_core::ResolveFailure::Unreachable {
                detail: "the attestation check failed unexpectedly".into(),
            })
    };
    tokio::time::timeout_at(deadline.into(), run)
        .await
        .unwrap_or_else(|_| Err(timeout()))
}

fn entry(
    req: &AttestationRequirement,
    loaded: &[Loaded],
    found: &[Result<Attestation, ArtifactError>],
    image: &BTreeMap<String, String>,
    digest: &str,
    now: i64,
) -> EntryOutcome {
    let mut seen = Vec::new();
    let mut other_types = 0;
    for a in found {
        let a = match a {
            Ok(a) if a.predicate_type == req.predicate_type => a,
            Ok(_) => {
                other_types += 1;
                continue;
            }
            Err(e) => {
                seen.push(unverified(
                    SignatureProblem::from(e.clone()).to_string(),
                    "unreadable".into(),
                ));
                continue;
            }
        };
        // Every one is checked (not only up to the first that passes), so
        // `sigil verify IMAGE` can list them all; they are few and cached.
        seen.push(one(req, loaded, a, image, digest, now));
    }
    EntryOutcome {
        name: req.name.clone(),
        predicate_type: req.predicate_type.clone(),
        seen,
        other_types,
    }
}

fn unverified(problem: String, form: String) -> Seen {
    Seen {
        attestor: None,
        signer: String::new(),
        problem: Some(problem),
        conditions: Vec::new(),
        form,
    }
}

impl Attestation {
    /// Its form and log entry kind, for reports.
    pub fn describe(&self) -> String {
        match &self.form {
            Form::Legacy(item) => item.describe(),
            Form::Bundle(b) => {
                let v: Value = serde_json::from_slice(b).unwrap_or_default();
                let kinds: Vec<String> = v
                    .pointer("/verificationMaterial/tlogEntries")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                    .map(|e| {
                        format!(
                            "{}/{}",
                            e.pointer("/kindVersion/kind")
                                .and_then(Value::as_str)
                                .unwrap_or("?"),
                            e.pointer("/kindVersion/version")
                                .and_then(Value::as_str)
                                .unwrap_or("?")
                        )
                    })
                    .collect();
                let signer = if v.pointer("/verificationMaterial/publicKey").is_some() {
                    "key"
                } else {
                    "keyless"
                };
                if kinds.is_empty() {
                    format!("Sigstore bundle, {signer}, no log entry")
                } else {
                    format!("Sigstore bundle, {signer}, Rekor {}", kinds.join(", "))
                }
            }
        }
    }
}

/// One attestation under one entry: the first attestor that verifies it,
/// then the size limit, then the conditions.
fn one(
    req: &AttestationRequirement,
    loaded: &[Loaded],
    a: &Attestation,
    image: &BTreeMap<String, String>,
    digest: &str,
    now: i64,
) -> Seen {
    let mut problems = Vec::new();
    let mut verified = None;
    for l in loaded {
        let c = match &l.check {
            Check::Cosign(c) => c,
            Check::Unavailable(why) => {
                problems.push(format!("{}: trust material unavailable: {why}", l.name));
                continue;
            }
            Check::Notation(_) => continue,
        };
        match c.verify_attestation(a, digest, now) {
            Ok(checked) => {
                verified = Some((l.name.as_str(), checked));
                break;
            }
            Err(p) => problems.push(format!("{}: {p}", l.name)),
        }
    }
    let Some((attestor, checked)) = verified else {
        // Each attestor's own reason: which one was meant to sign it is
        // for the reader to know.
        return unverified(problems.join("; "), a.describe());
    };
    let signer = signer_vars(attestor, checked.identity.as_ref());
    let who = checked
        .identity
        .as_ref()
        .map_or_else(|| "a key".to_owned(), ToString::to_string);
    let mut seen = Seen {
        attestor: Some(attestor.to_owned()),
        signer: who,
        problem: None,
        conditions: Vec::new(),
        form: a.describe(),
    };
    let statement = match Statement::parse_for(&a.payload, req.max_bytes, &req.conditions) {
        Ok(s) => s,
        Err(e) => {
            seen.attestor = None;
            seen.problem = Some(format!("signed by {attestor}, but {e}"));
            return seen;
        }
    };
    // Conditions are evaluated by the CEL interpreter: a panic in it is a
    // failed condition with the reason, never a crashed server.
    let results = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        sigil_core::attest::evaluate(
            &req.conditions,
            &Evidence {
                statement: &statement,
                digest,
                signer: &signer,
                image: Some(image),
                timestamps: &checked.times,
            },
            now,
        )
    }));
    seen.conditions = results.unwrap_or_else(|_| {
        req.conditions
            .iter()
            .map(|c| sigil_core::attest::ConditionResult {
                expression: c.expression.clone(),
                message: c.message.clone(),
                outcome: Err("the CEL interpreter failed on this statement".into()),
                saw: None,
            })
            .collect()
    });
    seen
}

#[cfg(test)]
mod tests {
    //! The attestation path through the verifier's cache.

    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use sigil_core::{Digest, Policy, PullCredentials, Reference, SignatureVerifier};
    use sigil_testkit::artifacts::{MemorySource, Shared};
    use sigil_testkit::attestations::{SLSA_V1, keyed_layer, predicate};
    use sigil_testkit::registry::sha256;
    use sigil_testkit::signing::Signer;

    /// Concurrent admissions of one attested digest verify it once: the
    /// `.att` manifest and its envelope are fetched once, and every caller
    /// gets the same report (no stampede on the registry).
    #[tokio::test]
    async fn concurrent_attested_lookups_coalesce_into_one_fetch() {
        let d = Digest::parse(&format!("sha256:{}", "cd".repeat(32))).unwrap();
        let key = Signer::p256();
        let st = sigil_testkit::intoto::statement(
            d.as_str(),
            SLSA_V1,
            predicate(SLSA_V1, "https://github.com/acme/api", 1_700_000_000),
        );
        let layer = keyed_layer(&key, &st);
        let ed = sha256(&layer.envelope);
        let m = serde_json::to_vec(&serde_json::json!({"schemaVersion": 2, "layers": [
            {"mediaType": super::DSSE_MEDIA_TYPE, "size": layer.envelope.len(), "digest": ed, "annotations": layer.annotations}
        ]}))
        .unwrap();
        let source = Arc::new(MemorySource {
            manifests: [(format!("sha256-{}.att", "cd".repeat(32)), m)]
                .into_iter()
                .collect(),
            blobs: [(ed, layer.envelope)].into_iter().collect(),
            ..MemorySource::default()
        });
        let policy = Policy::from_yaml(&format!(
            "apiVersion: sigil.dev/v1alpha1\nkind: ImagePolicy\nspec:\n  rules:\n    - name: r\n      match: [\"**\"]\n      attestations:\n        - {{name: prov, predicateType: slsaprovenance1, attestors: [{{name: ci, cosign: {{key: {:?}}}}}], conditions: [{{expression: 'predicate.buildDefinition.externalParameters.workflow.ref == \"refs/heads/main\"'}}]}}\n",
            key.public_pem()
        ))
        .unwrap();
        let v = policy.rules[0].verification.clone().unwrap();
        let verifier = crate::Verifier::new(
            Shared(source.clone()),
            crate::Material::load(&policy).unwrap(),
            Default::default(),
            Arc::new(crate::NoObserver),
        );
        let repo = Reference::parse("r.example/app").unwrap();
        let creds = PullCredentials::default();
        let deadline = Instant::now() + Duration::from_secs(5);
        let reports = futures_util::future::join_all(
            (0..16).map(|_| verifier.verify(&repo, &d, &v, &creds, None, deadline)),
        )
        .await;
        assert!(reports.iter().all(|r| r.satisfied()), "{}", reports[0]);
        assert!(reports.iter().all(|r| Arc::ptr_eq(r, &reports[0])));
        let calls = source.calls();
        assert_eq!(
            calls.iter().filter(|c| c.ends_with(".att")).count(),
            1,
            "{calls:?}"
        );
        assert_eq!(
            calls.iter().filter(|c| c.starts_with("blob")).count(),
            1,
            "{calls:?}"
        );
        assert!(
            !calls.iter().any(|c| c.ends_with(".sig")),
            "a rule without verify reads no .sig: {calls:?}"
        );
    }

    /// An image listing many large attestations costs bounded reads: past
    /// twice the largest allowed, listed layers are reported, not fetched.
    #[tokio::test]
    async fn attestations_past_the_per_digest_budget_are_not_fetched() {
        let d = Digest::parse(&format!("sha256:{}", "ef".repeat(32))).unwrap();
        let key = Signer::p256();
        let st = sigil_testkit::intoto::statement(d.as_str(), SLSA_V1, serde_json::json!({}));
        let layer = keyed_layer(&key, &st);
        let ed = sha256(&layer.envelope);
        // Three layers each declared at 900 KiB (the envelope itself is
        // small): the budget for a 1 MiB limit is 2 MiB, so two are read.
        let l = serde_json::json!({"mediaType": super::DSSE_MEDIA_TYPE, "size": 900 << 10, "digest": ed, "annotations": layer.annotations});
        let m = serde_json::to_vec(&serde_json::json!({"schemaVersion": 2, "layers": [l, l, l]}))
            .unwrap();
        let source = Arc::new(MemorySource {
            manifests: [(format!("sha256-{}.att", "ef".repeat(32)), m)]
                .into_iter()
                .collect(),
            blobs: [(ed, layer.envelope)].into_iter().collect(),
            ..MemorySource::default()
        });
        let wanted = crate::gather::Wanted {
            signatures: false,
            attestation_bytes: Some(1 << 10),
        };
        let a = crate::gather::gather(
            &Shared(source.clone()),
            &Reference::parse("r.example/app").unwrap(),
            &d,
            &PullCredentials::default(),
            wanted,
            Instant::now() + Duration::from_secs(5),
        )
        .await
        .unwrap();
        assert_eq!(a.attestations.len(), 3);
        assert_eq!(a.attestations.iter().filter(|x| x.is_ok()).count(), 2);
        let e = a
            .attestations
            .iter()
            .find_map(|x| x.as_ref().err())
            .unwrap()
            .to_string();
        assert!(e.contains("exceed the 2097152-byte budget"), "{e}");
        // The two in budget share one blob, fetched once; the third is not fetched.
        let blobs = source
            .calls()
            .iter()
            .filter(|c| c.starts_with("blob"))
            .count();
        assert_eq!(blobs, 1);
    }
}
