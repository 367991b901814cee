//! The mutating admission webhook's wire format: AdmissionReview in,
//! AdmissionReview out.
//!
//! Owns reading the request leniently (the objects are walked by sigil-core's
//! streaming walker while the review is parsed — one pass over the bytes —
//! so unknown or oddly-typed metadata never turns into a rejection), the deadline taken from `?timeout=`, and
//! rendering sigil-core's `ObjectVerdict` as the answer: base64 JSONPatch
//! built against the raw object, warnings, audit annotations, denial status,
//! metrics and the decision log line. It decides nothing: which requests pass
//! untouched (DELETE, CONNECT, finalizer removal, exempt namespaces), the
//! UPDATE downgrade and the scope are the one per-object decision in
//! `sigil_core::object`, run by [`crate::engine`].

use std::sync::Arc;
use std::time::{Duration, Instant};

use sigil_core::{
    DigestResolver, FieldVerdict, Mode, ObjectFacts, ObjectVerdict, Operation, Outcome, Source,
    effective_namespace,
};

pub use crate::decisionlog::Verdict;
use crate::engine::Engine;
use crate::metrics::Metrics;

mod input;
mod out;
pub mod reuse;
use input::{ReviewIn, object_ref};
use out::{JsonPatch, ResponseOut, ReviewOut, StatusOut};

/// Bodies larger than this are refused (kube-apiserver's own request limit is 3 MiB).
pub const MAX_BODY_BYTES: usize = 3 << 20;
/// Timeout assumed when the API server does not send `?timeout=`.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);
/// Largest timeout the API server allows for a webhook.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(30);

/// Why a body is not an AdmissionReview sigil can answer (HTTP 400).
#[derive(Debug, thiserror::Error)]
pub enum BadReview {
    /// Not JSON, or not the AdmissionReview shape.
    #[error("body is not an AdmissionReview: {0}")]
    Malformed(String),
    /// `apiVersion` other than admission.k8s.io/v1 or v1beta1.
    #[error(
        "unsupported AdmissionReview apiVersion {0:?} (sigil speaks admission.k8s.io/v1 and v1beta1)"
    )]
    Version(String),
    /// No `request`, or a request without `uid` or `operation`.
    #[error("AdmissionReview has no request{0}")]
    MissingRequest(&'static str),
}

/// The webhook handler. One per process, shared by every connection.
#[derive(Debug)]
pub struct Webhook<R> {
    /// Swapped whole when the policy file changes; a request keeps the
    /// engine it started with. Its reused answers go with it.
    current: arc_swap::ArcSwap<Current<R>>,
    metrics: Arc<Metrics>,
    /// Where the decision line is written by hand (`sigil serve`, JSON
    /// logs); without it the line goes through tracing.
    decision_log: Option<crate::decisionlog::DecisionLog>,
}

/// The engine in force and the answers reused under it ([`reuse`]).
#[derive(Debug)]
struct Current<R> {
    engine: Arc<Engine<R>>,
    answers: reuse::Answers,
}

impl<R> Current<R> {
    fn new(engine: Engine<R>) -> Self {
        Current {
            answers: reuse::Answers::new(engine.policy.cache_ttl),
            engine: Arc::new(engine),
        }
    }
}

/// Takes `?timeout=10s` (a Go duration) from a request query string.
pub fn timeout_from_query(query: Option<&str>) -> Duration {
    let t = query
        .into_iter()
        .flat_map(|q| q.split('&'))
        .find_map(|kv| kv.strip_prefix("timeout="))
        .and_then(sigil_core::duration::parse_go)
        .unwrap_or(DEFAULT_TIMEOUT);
    t.min(MAX_TIMEOUT)
}

/// When to stop waiting for registries: the API server's timeout minus a
/// margin for our own answer to travel back (10 %, between 100 ms and 1 s).
pub fn deadline_for(timeout: Duration, start: Instant) -> Instant {
    let margin = (timeout / 10).clamp(Duration::from_millis(100), Duration::from_secs(1));
    start + timeout.saturating_sub(margin)
}

impl<R: DigestResolver> Webhook<R> {
    /// Creates the handler.
    pub fn new(engine: Engine<R>, metrics: Arc<Metrics>) -> Self {
        Webhook {
            current: arc_swap::ArcSwap::from_pointee(Current::new(engine)),
            metrics,
            decision_log: None,
        }
    }

    /// Writes the decision line by hand into `log` (same bytes as the JSON
    /// formatter's; `SIGIL_LOG` still decides whether it is written).
    pub fn with_decision_log(mut self, log: crate::decisionlog::DecisionLog) -> Self {
        self.decision_log = Some(log);
        self
    }

    /// The engine in force now.
    pub fn engine(&self) -> Arc<Engine<R>> {
        self.current.load().engine.clone()
    }

    /// Puts a new engine (policy and resolver) in force for new requests.
    pub fn replace(&self, engine: Engine<R>) {
        self.current.store(Arc::new(Current::new(engine)));
    }

    /// The policy in force now.
    pub fn policy(&self) -> Arc<sigil_core::Policy> {
        self.current.load().engine.policy.clone()
    }

    /// Answers one AdmissionReview body. `Err` means HTTP 400.
    pub async fn review(
        &self,
        body: &[u8],
        deadline: Instant,
    ) -> Result<(Vec<u8>, Verdict), BadReview> {
        // The body is checked as UTF-8 once (JSON is UTF-8, RFC 8259),
        // then parsed as text: parsing bytes checked each string on its own.
        let text = std::str::from_utf8(body).map_err(|e| BadReview::Malformed(e.to_string()))?;
        let review: ReviewIn =
            serde_json::from_str(text).map_err(|e| BadReview::Malformed(e.to_string()))?;
        let api_version = review.api_version.unwrap_or_default();
        if api_version != "admission.k8s.io/v1" && api_version != "admission.k8s.io/v1beta1" {
            return Err(BadReview::Version(api_version.into_owned()));
        }
        if review
            .kind
            .as_deref()
            .is_some_and(|k| k != "AdmissionReview")
        {
            return Err(BadReview::Malformed(format!(
                "kind is {:?}, expected AdmissionReview",
                review.kind.unwrap_or_default()
            )));
        }
        let mut req = review.request.ok_or(BadReview::MissingRequest(""))?;
        let uid = req
            .uid
            .take()
            .filter(|u| !u.is_empty())
            .ok_or(BadReview::MissingRequest(" uid"))?;
        let operation = req
            .operation
            .take()
            .filter(|o| !o.is_empty())
            .ok_or(BadReview::MissingRequest(" operation"))?;
        let kind = req
            .kind
            .take()
            .map(|k| k.kind.into_owned())
            .unwrap_or_default();
        let current = self.current.load_full();
        let engine = &current.engine;
        let object = req.object.as_mut().and_then(|w| w.0.take()).map(|b| *b);
        let old = req.old_object.as_mut().and_then(|w| w.0.take());
        let object_ref = object_ref(&req, object.as_ref(), &kind);
        let mut verdict = Verdict {
            decision: "allowed",
            operation: operation.into_owned(),
            kind,
            object: object_ref,
            skipped: None,
            images: String::new(),
        };
        let metadata_ns = object.as_ref().and_then(|o| o.namespace.clone());
        let namespace = effective_namespace(req.namespace.as_deref(), metadata_ns.as_deref(), None);
        let dry_run = req.dry_run == Some(true);
        let now = Instant::now();
        let key = match (&object, reuse::generations(engine)) {
            (Some(o), Some(generations)) if verdict.operation == "CREATE" => {
                let r = reuse::Request {
                    api_version: &api_version,
                    kind: &verdict.kind,
                    namespace,
                    dry_run,
                    generations,
                };
                reuse::key(r, o)
            }
            _ => None,
        };
        if let Some(hit) = key.as_ref().and_then(|k| current.answers.get(k, now)) {
            for outcome in &hit.outcomes {
                self.metrics.image(outcome);
            }
            self.metrics.answers_reused.inc();
            verdict.decision = hit.decision;
            verdict.images.clone_from(&hit.images);
            return Ok((hit.answer(&api_version, &uid), verdict));
        }
        let mut resp = ResponseOut {
            uid: uid.into_owned(),
            allowed: true,
            patch_type: None,
            patch: None,
            warnings: Vec::new(),
            audit_annotations: Default::default(),
            status: None,
        };
        let facts = ObjectFacts {
            operation: Operation::parse(&verdict.operation),
            source: Source::Admission,
            kind: &verdict.kind,
            namespace,
            object,
            old_object: old.as_deref(),
            namespace_labels: None,
        };
        let effects = if dry_run {
            crate::engine::Effects::DryRun
        } else {
            crate::engine::Effects::Allowed
        };
        let decision = engine.decide_with(facts, deadline, effects).await;
        match decision.skipped {
            Some(why) => {
                verdict.decision = "skipped";
                verdict.skipped = Some(why.as_str());
            }
            None => self.render(&decision, &mut resp, &mut verdict)?,
        }
        let clean = key.and_then(|k| Some((k, reuse::clean_outcomes(&decision, &resp)?)));
        let out = ReviewOut {
            api_version: &api_version,
            kind: "AdmissionReview",
            response: resp,
        };
        // Sized once: the answer is the patch plus a few hundred bytes.
        let mut bytes = Vec::with_capacity(out::size_hint(&out));
        let head = out::write_review(&mut bytes, &out);
        if let Some((k, outcomes)) = clean {
            let answer = reuse::Reused {
                tail: bytes[head..].to_vec(),
                decision: verdict.decision,
                images: verdict.images.clone(),
                outcomes,
            };
            current.answers.put(k, answer, now);
        }
        Ok((bytes, verdict))
    }

    /// Renders a verdict as the AdmissionReview response, metrics and the log detail.
    fn render(
        &self,
        d: &ObjectVerdict,
        resp: &mut ResponseOut,
        verdict: &mut Verdict,
    ) -> Result<(), BadReview> {
        // Per-image log detail is built only when the decision line is logged.
        let detail = tracing::enabled!(tracing::Level::INFO);
        let object = &verdict.object;
        let mut denials: Vec<String> = Vec::new();
        // `field: from -> to` per change, `; `-separated: greppable in audit
        // logs, and cheap to embed (no JSON-in-JSON escaping).
        let mut audit = String::new();
        // `field: verifier, verifier` per verified image: who vouched for what runs.
        let mut verified = String::new();
        // Room for a line per image (path, label, image, new image) in the
        // log detail and the audit and verified annotations, made once:
        // growing them as they were written moved them several times per
        // admission.
        let room: usize = d.fields.iter().map(|v| 160 + 2 * v.field.value.len()).sum();
        if detail {
            verdict.images.reserve(room);
        }
        for v in &d.fields {
            let field = &v.field;
            if let Some(report) = v.vouched_by() {
                if verified.is_empty() {
                    verified.reserve(room);
                } else {
                    verified.push_str("; ");
                }
                field.write_dotted(&mut verified);
                verified.push_str(": ");
                report.write_vouched(&mut verified);
            }
            if detail {
                log_entry(&mut verdict.images, v);
            }
            match &v.outcome {
                Outcome::Unchanged { .. } | Outcome::NeedsLookup { .. } => {
                    self.metrics.image("unchanged");
                }
                Outcome::Changed { new, rewritten, .. } => {
                    self.metrics
                        .image(if *rewritten { "rewritten" } else { "pinned" });
                    if let Some(fb) = &v.fallback {
                        self.metrics.mirror_fallback(&fb.from);
                        resp.warnings
                            .push(sigil_core::text::admission_warning(&format!(
                                "sigil: image {:?} in {}: {}",
                                field.value,
                                field.describe(),
                                fb.why
                            )));
                        let note = format!("{}: {}", field.dotted(), fb.why);
                        resp.audit_annotations
                            .entry("mirror-fallback".into())
                            .and_modify(|a| {
                                a.push_str("; ");
                                a.push_str(&note);
                            })
                            .or_insert(note);
                    }
                    if audit.is_empty() {
                        audit.reserve(room);
                    } else {
                        audit.push_str("; ");
                    }
                    field.write_dotted(&mut audit);
                    audit.push_str(": ");
                    audit.push_str(&field.value);
                    audit.push_str(" -> ");
                    audit.push_str(new);
                }
                Outcome::Failed(f) => match f.mode {
                    Mode::Enforce => {
                        self.metrics.image("denied");
                        denials.push(f.message(object));
                    }
                    Mode::Warn => {
                        self.metrics.image("warned");
                        resp.warnings.push(f.warning());
                    }
                },
            }
        }
        if !denials.is_empty() {
            resp.allowed = false;
            resp.status = Some(StatusOut {
                code: 403,
                reason: "Forbidden",
                message: format!("sigil denied the request: {}", denials.join("; ")),
            });
            verdict.decision = "denied";
            return Ok(());
        }
        if !verified.is_empty() {
            resp.audit_annotations.insert("verified".into(), verified);
        }
        let changes = d.changes();
        if d.patchable && !changes.is_empty() {
            let mut bytes = Vec::new();
            sigil_core::patch::write_patch(&mut bytes, &changes);
            resp.patch_type = Some("JSONPatch");
            resp.patch = Some(JsonPatch(bytes));
            resp.audit_annotations.insert("images".into(), audit);
            verdict.decision = "patched";
        } else if !changes.is_empty() {
            resp.warnings.push(format!("sigil: {} image(s) would be pinned or rewritten, but spec.pin.scope is pods: {} is checked, not patched", changes.len(), object.kind));
        }
        if verdict.decision == "allowed" && !resp.warnings.is_empty() {
            verdict.decision = "warned";
        }
        Ok(())
    }

    /// Records the verdict in metrics and the decision log (one line per review).
    /// The readiness self-check is neither logged nor counted.
    pub fn record(&self, v: &Verdict, elapsed: Duration) {
        if v.object.namespace == SELF_CHECK_NAMESPACE {
            return;
        }
        self.metrics
            .admission(&v.operation, &v.kind, v.decision, elapsed);
        match &self.decision_log {
            Some(log) if tracing::enabled!(target: crate::decisionlog::TARGET, tracing::Level::INFO) =>
            {
                log.write(v, elapsed);
            }
            Some(_) => {}
            None => crate::decisionlog::via_tracing(v, elapsed),
        }
    }
}

/// One image in the decision log line, appended `; `-separated:
/// `field verdict: image[ -> new]`, the verdict being the label every front
/// end reports for it.
fn log_entry(out: &mut String, v: &FieldVerdict) {
    if !out.is_empty() {
        out.push_str("; ");
    }
    v.field.write_dotted(out);
    out.push(' ');
    out.push_str(&v.label());
    out.push_str(": ");
    out.push_str(&v.field.value);
    if let Outcome::Changed { new, .. } = &v.outcome {
        out.push_str(" -> ");
        out.push_str(new);
    }
}

/// Namespace of the synthetic self-check review (not a real namespace).
pub const SELF_CHECK_NAMESPACE: &str = "sigil-self-check";

/// Builds the AdmissionReview `request` for a synthetic self-check.
pub fn synthetic_review(uid: &str) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": "", "version": "v1", "kind": "ConfigMap"},
            "resource": {"group": "", "version": "v1", "resource": "configmaps"},
            "operation": "CREATE",
            "namespace": SELF_CHECK_NAMESPACE,
            "object": {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "self-check"}},
            "dryRun": true
        }
    }))
    .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_durations() {
        assert_eq!(
            timeout_from_query(Some("timeout=5s")),
            Duration::from_secs(5)
        );
        assert_eq!(timeout_from_query(Some("timeout=99s")), MAX_TIMEOUT);
        assert_eq!(timeout_from_query(None), DEFAULT_TIMEOUT);
    }

    #[test]
    fn deadline_keeps_a_margin() {
        let t0 = Instant::now();
        assert_eq!(
            deadline_for(Duration::from_secs(10), t0),
            t0 + Duration::from_secs(9)
        );
        assert_eq!(
            deadline_for(Duration::from_secs(1), t0),
            t0 + Duration::from_millis(900)
        );
        assert_eq!(
            deadline_for(Duration::from_secs(30), t0),
            t0 + Duration::from_secs(29)
        );
    }
}

#[cfg(test)]
mod proptests {
    use super::*;
    use crate::engine::Engine;
    use proptest::prelude::*;
    use sigil_core::Policy;
    use sigil_testkit::resolver::FakeResolver;

    fn hook() -> Webhook<FakeResolver> {
        let p = Policy::from_yaml(
            "apiVersion: sigil.dev/v1alpha1\nkind: ImagePolicy\nspec:\n  mirrors: [{from: docker.io, to: m.local/hub}]\n  rules:\n    - {name: e, match: [\"a.io/**\"], mode: enforce}\n    - {name: w, match: [\"**\"], mode: warn}\n",
        )
        .unwrap();
        Webhook::new(
            Engine::new(Arc::new(p), FakeResolver::new().missing_when("x")),
            Arc::new(Metrics::default()),
        )
    }

    fn review_json(op: &str, images: &[String], junk: &str) -> Vec<u8> {
        let containers: Vec<serde_json::Value> = images
            .iter()
            .map(|i| serde_json::json!({"name": junk, "image": i}))
            .collect();
        let object = serde_json::json!({"kind": "Pod", "metadata": {"name": junk},
            "spec": {"containers": containers, "volumes": [{"name": junk, "image": {"reference": images.first()}}]}});
        let mut review = sigil_testkit::review::review(op, junk, object);
        review["request"]["uid"] = junk.into();
        serde_json::to_vec(&review).unwrap()
    }

    /// The review's strings are read borrowed where they can be: one with
    /// a JSON escape is read all the same, null is no value, and a value of
    /// another type is a malformed review, as when they were copied.
    #[test]
    fn review_strings_with_escapes_nulls_and_odd_types() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        let answer = |body: &str| {
            rt.block_on(hook().review(body.as_bytes(), Instant::now() + Duration::from_secs(1)))
                .map(|(out, v)| {
                    (
                        serde_json::from_slice::<serde_json::Value>(&out).unwrap(),
                        v,
                    )
                })
        };
        let (out, v) = answer(
            r#"{"apiVersion":"admission.k8s.io\/v1","kind":"AdmissionReview","request":{"uid":"u\u0041\"1","kind":{"kind":"P\u006fd"},"operation":"CREATE","namespace":"t\u0065am","name":null,"object":{"kind":"Pod","metadata":{"name":"p"},"spec":{"containers":[]}}}}"#,
        )
        .expect("escaped strings are strings");
        assert_eq!(out["response"]["uid"], "uA\"1");
        assert_eq!(out["apiVersion"], "admission.k8s.io/v1");
        assert_eq!(
            (v.kind.as_str(), v.object.namespace.as_str()),
            ("Pod", "team")
        );
        assert_eq!(v.object.name, "p", "a null name falls back to the object's");
        for odd in [
            r#"{"apiVersion":"admission.k8s.io/v1","request":{"uid":7,"operation":"CREATE"}}"#,
            r#"{"apiVersion":"admission.k8s.io/v1","request":{"uid":"u","operation":["CREATE"]}}"#,
            r#"{"apiVersion":"admission.k8s.io/v1","request":{"uid":"u","operation":"CREATE","namespace":{}}}"#,
            r#"{"apiVersion":1,"request":{"uid":"u","operation":"CREATE"}}"#,
        ] {
            assert!(matches!(answer(odd), Err(BadReview::Malformed(_))), "{odd}");
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// Any bytes: an answer or a 400, never a panic.
        #[test]
        fn arbitrary_bytes_never_panic(body in proptest::collection::vec(any::<u8>(), 0..2048)) {
            let rt = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
            let _ = rt.block_on(hook().review(&body, Instant::now() + Duration::from_secs(1)));
        }

        /// Well-formed reviews with arbitrary image strings: always answered,
        /// uid echoed, and a second pass over the patched object is a no-op.
        #[test]
        fn reviews_are_answered_and_idempotent(
            op in prop::sample::select(vec!["CREATE", "UPDATE", "DELETE", "CONNECT", "PATCH"]),
            images in proptest::collection::vec("[a-zA-Z0-9./:@_-]{0,40}", 0..4),
            junk in "\\PC{1,12}",
        ) {
            let rt = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
            let h = hook();
            let body = review_json(op, &images, &junk);
            let (out, _) = rt.block_on(h.review(&body, Instant::now() + Duration::from_secs(1))).expect("well-formed review");
            let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
            prop_assert_eq!(v["response"]["uid"].as_str(), Some(junk.as_str()));
            if let Some(p) = v["response"]["patch"].as_str() {
                let patch: json_patch::Patch = serde_json::from_slice(&base64::Engine::decode(&base64::engine::general_purpose::STANDARD, p).unwrap()).unwrap();
                let mut req: serde_json::Value = serde_json::from_slice(&body).unwrap();
                json_patch::patch(&mut req["request"]["object"], &patch).unwrap();
                let again = serde_json::to_vec(&req).unwrap();
                let (out2, _) = rt.block_on(h.review(&again, Instant::now() + Duration::from_secs(1))).unwrap();
                let v2: serde_json::Value = serde_json::from_slice(&out2).unwrap();
                prop_assert!(v2["response"]["patch"].is_null(), "second pass patched again: {}", v2);
            }
        }
    }
}
