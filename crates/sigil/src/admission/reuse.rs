//! Answers reused between identical admissions in the same second.
//!
//! A rollout's Pods reach the webhook as the same object: a ReplicaSet's
//! Pods carry its template, `generateName` and no name, and what differs
//! between them at admission (the request's uid, the service-account token
//! volume's random name) is not in the walker's summary, which is all the
//! decision reads of the object. So the second and later Pods of a batch
//! can be answered with the first one's answer, their own uid in it,
//! without planning, looking up and rendering again. This module owns that
//! table and when an entry may be used; it decides nothing — the answer is
//! `Engine::decide_with`'s, rendered by `admission.rs`.
//!
//! An answer is reused only when every one of these holds:
//! - the request is a CREATE (an UPDATE also depends on the old object);
//! - the review's apiVersion, the kind, the effective namespace, dryRun and
//!   the object's summary are the same (the key is all of them, each
//!   length-prefixed, compared whole: the map's seeded hash only finds it);
//! - the same engine: the table lives beside it, so a policy, key or trust
//!   root reload starts with an empty one;
//! - the namespace labels and pull secrets the decision read are unchanged:
//!   their stores' generations are part of the key, and a store that
//!   cannot tell its generation turns reuse off;
//! - the same second: the table is emptied when a second (the policy's
//!   `cacheTTL`, if shorter; never kept with `0s`) has passed since it was
//!   started, so an answer outlives the cached digests and verification
//!   outcomes it came from by less than that;
//! - the answer was clean: allowed, every image unchanged, pinned or
//!   rewritten with no mirror fallback, no warning. A denial, a warning or
//!   anything that came from a registry's failure is decided afresh.
//!
//! The table holds at most [`MAX_ENTRIES`] answers and [`MAX_BYTES`] of
//! them per second; beyond that, answers are simply not kept.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use sigil_core::walker::ObjectSummary;
use sigil_core::{ObjectVerdict, Outcome};

use crate::engine::Engine;

/// Answers kept per second at most.
pub const MAX_ENTRIES: usize = 1024;
/// Bytes of answers kept per second at most.
pub const MAX_BYTES: usize = 4 << 20;
/// How long a table is used before it is emptied, at most: less when the
/// policy's `cacheTTL` is shorter, never with `cacheTTL: 0s`.
pub const WINDOW: Duration = Duration::from_secs(1);

/// What a later identical admission is answered with.
#[derive(Debug)]
pub struct Reused {
    /// The answer's bytes after its uid ([`super::out::write_head`]).
    pub tail: Vec<u8>,
    /// The decision, for the log line and metrics.
    pub decision: &'static str,
    /// The decision line's per-image detail.
    pub images: String,
    /// Each image's outcome, for `sigil_images_total`.
    pub outcomes: Vec<&'static str>,
}

impl Reused {
    /// The answer to a review whose uid is `uid`.
    pub fn answer(&self, api_version: &str, uid: &str) -> Vec<u8> {
        let mut bytes = Vec::with_capacity(self.tail.len() + api_version.len() + uid.len() + 80);
        super::out::write_head(&mut bytes, api_version, "AdmissionReview", uid);
        bytes.extend_from_slice(&self.tail);
        bytes
    }
}

/// Each image's metric label when `d` may be reused: allowed, decided,
/// every image unchanged, pinned or rewritten where it was planned, and
/// nothing to warn about; `None` otherwise.
pub(super) fn clean_outcomes(
    d: &ObjectVerdict,
    resp: &super::out::ResponseOut,
) -> Option<Vec<&'static str>> {
    if d.skipped.is_some() || !resp.allowed || !resp.warnings.is_empty() || resp.status.is_some() {
        return None;
    }
    d.fields
        .iter()
        .map(|v| match (&v.outcome, &v.fallback) {
            (Outcome::Unchanged { .. }, None) => Some("unchanged"),
            (Outcome::Changed { rewritten, .. }, None) => {
                Some(if *rewritten { "rewritten" } else { "pinned" })
            }
            _ => None,
        })
        .collect()
}

/// The generations of the stores `e`'s decisions read, 0 for a store they
/// do not read; `None` when a store they read cannot tell.
pub fn generations<R>(e: &Engine<R>) -> Option<[u64; 2]> {
    let labels = match &e.namespaces {
        Some(s) if e.policy.has_namespace_selectors() => s.generation()?,
        _ => 0,
    };
    let secrets = match &e.pull_secrets {
        Some(s) => s.generation()?,
        None => 0,
    };
    Some([labels, secrets])
}

/// The table of one engine.
#[derive(Debug)]
pub struct Answers {
    window: Duration,
    slot: Mutex<Slot>,
}

#[derive(Debug)]
struct Slot {
    started: Instant,
    bytes: usize,
    map: HashMap<Box<[u8]>, Arc<Reused>, foldhash::fast::RandomState>,
}

impl Answers {
    /// A table emptied every `window` (at most [`WINDOW`]; zero keeps nothing).
    pub fn new(window: Duration) -> Self {
        Answers {
            window: window.min(WINDOW),
            slot: Mutex::new(Slot {
                started: Instant::now(),
                bytes: 0,
                map: HashMap::default(),
            }),
        }
    }

    /// The answer kept for `key`, if it was kept this window.
    pub fn get(&self, key: &[u8], now: Instant) -> Option<Arc<Reused>> {
        if self.window.is_zero() {
            return None;
        }
        let mut slot = self.slot.lock().unwrap_or_else(PoisonError::into_inner);
        slot.expire(now, self.window);
        slot.map.get(key).cloned()
    }

    /// Keeps `answer` for the rest of this window, if there is room.
    pub fn put(&self, key: Vec<u8>, answer: Reused, now: Instant) {
        if self.window.is_zero() {
            return;
        }
        let size = key.len() + answer.tail.len() + answer.images.len() + 64;
        let mut slot = self.slot.lock().unwrap_or_else(PoisonError::into_inner);
        slot.expire(now, self.window);
        if slot.map.len() >= MAX_ENTRIES || slot.bytes + size > MAX_BYTES {
            return;
        }
        slot.bytes += size;
        slot.map.insert(key.into_boxed_slice(), Arc::new(answer));
    }
}

impl Slot {
    fn expire(&mut self, now: Instant, window: Duration) {
        if now.saturating_duration_since(self.started) >= window {
            self.map.clear();
            self.bytes = 0;
            self.started = now;
        }
    }
}

/// What identifies an admission's answer beside the engine.
#[derive(Debug, Clone, Copy)]
pub struct Request<'a> {
    /// The review's apiVersion (the answer repeats it).
    pub api_version: &'a str,
    /// The request's kind.
    pub kind: &'a str,
    /// The namespace the decision used.
    pub namespace: Option<&'a str>,
    /// dryRun.
    pub dry_run: bool,
    /// The namespace-label and pull-secret stores' generations (0 where the
    /// decision reads no store).
    pub generations: [u64; 2],
}

/// The key of `req` for `object`; `None` when the object carries what the
/// summary does not describe exactly (a custom kind's fields, extractor
/// problems), which is then never reused.
pub fn key(req: Request<'_>, object: &ObjectSummary) -> Option<Vec<u8>> {
    if object.custom.is_some() || !object.problems.is_empty() {
        return None;
    }
    let mut k = Builder(Vec::with_capacity(512));
    k.part(req.api_version.as_bytes())
        .part(req.kind.as_bytes())
        .opt(req.namespace)
        .part(&[u8::from(req.dry_run)])
        .part(&req.generations[0].to_le_bytes())
        .part(&req.generations[1].to_le_bytes())
        .opt(object.kind.as_deref())
        .opt(object.api_version.as_deref())
        .opt(object.name.as_deref())
        .opt(object.generate_name.as_deref())
        .opt(object.namespace.as_deref())
        .opt(object.service_account.as_deref())
        .part(&[u8::from(object.terminating)])
        .part(&(object.pull_secrets.len() as u64).to_le_bytes());
    for s in &object.pull_secrets {
        k.part(s.as_bytes());
    }
    k.part(&(object.fields.len() as u64).to_le_bytes());
    for f in &object.fields {
        k.part(f.pointer.as_bytes())
            .part(&[f.kind as u8])
            .opt(f.name.as_deref())
            .part(f.value.as_bytes());
    }
    Some(k.0)
}

/// Length-prefixed parts, so no two lists of parts read alike.
struct Builder(Vec<u8>);

impl Builder {
    fn part(&mut self, b: &[u8]) -> &mut Builder {
        self.0.extend_from_slice(&(b.len() as u64).to_le_bytes());
        self.0.extend_from_slice(b);
        self
    }

    fn opt(&mut self, s: Option<&str>) -> &mut Builder {
        match s {
            None => self.part(&[0]),
            Some(s) => self.part(&[1]).part(s.as_bytes()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sigil_core::walker::summarize_json;

    fn summary(json: &str) -> ObjectSummary {
        summarize_json(json).expect("object")
    }

    fn req() -> Request<'static> {
        Request {
            api_version: "admission.k8s.io/v1",
            kind: "Pod",
            namespace: Some("team"),
            dry_run: false,
            generations: [0, 0],
        }
    }

    const POD: &str = r#"{"apiVersion":"v1","kind":"Pod","metadata":{"generateName":"web-1-"},"spec":{"containers":[{"name":"a","image":"r.io/a:1"}],"volumes":[{"name":"kube-api-access-x7k2p"}]}}"#;

    fn answer(n: usize) -> Reused {
        Reused {
            tail: vec![b'x'; n],
            decision: "patched",
            images: String::new(),
            outcomes: vec!["pinned"],
        }
    }

    /// What differs between a ReplicaSet's Pods at admission (the token
    /// volume's random name) is not in the key; what the decision reads is.
    #[test]
    fn the_key_is_what_the_decision_reads() {
        let base = key(req(), &summary(POD)).unwrap();
        let base = Some(base);
        let other_volume = POD.replace("x7k2p", "q9z4m");
        assert_eq!(key(req(), &summary(&other_volume)), base);
        for changed in [
            POD.replace("r.io/a:1", "r.io/a:2"),
            POD.replace("\"name\":\"a\"", "\"name\":\"b\""),
            POD.replace("generateName\":\"web-1-", "name\":\"web-1-"),
            POD.replace("\"spec\":{", "\"spec\":{\"serviceAccountName\":\"s\","),
            POD.replace(
                "\"spec\":{",
                "\"spec\":{\"imagePullSecrets\":[{\"name\":\"r\"}],",
            ),
            POD.replace("\"containers\"", "\"initContainers\""),
        ] {
            assert_ne!(key(req(), &summary(&changed)), base, "{changed}");
        }
        let s = summary(POD);
        for r in [
            Request {
                namespace: Some("other"),
                ..req()
            },
            Request {
                namespace: None,
                ..req()
            },
            Request {
                dry_run: true,
                ..req()
            },
            Request {
                kind: "Deployment",
                ..req()
            },
            Request {
                api_version: "admission.k8s.io/v1beta1",
                ..req()
            },
            Request {
                generations: [1, 0],
                ..req()
            },
            Request {
                generations: [0, 1],
                ..req()
            },
        ] {
            assert_ne!(key(r, &s), base, "{r:?}");
        }
    }

    #[test]
    fn a_summary_with_problems_or_custom_fields_has_no_key() {
        let mut s = summary(POD);
        s.custom = Some(Default::default());
        assert_eq!(key(req(), &s), None);
    }

    #[test]
    fn an_answer_lives_one_second() {
        let t0 = Instant::now();
        let a = Answers::new(WINDOW);
        a.put(vec![1; 32], answer(10), t0);
        assert!(a.get(&[1; 32], t0 + Duration::from_millis(500)).is_some());
        assert!(a.get(&[2; 32], t0).is_none());
        assert!(a.get(&[1; 32], t0 + Duration::from_millis(1500)).is_none());
        let short = Answers::new(Duration::from_millis(100));
        short.put(vec![1; 32], answer(10), t0);
        assert!(
            short
                .get(&[1; 32], t0 + Duration::from_millis(150))
                .is_none(),
            "cacheTTL 100ms"
        );
        let off = Answers::new(Duration::ZERO);
        off.put(vec![1; 32], answer(10), t0);
        assert!(off.get(&[1; 32], t0).is_none(), "cacheTTL 0s keeps nothing");
    }

    #[test]
    fn the_table_is_bounded_in_entries_and_bytes() {
        let t0 = Instant::now();
        let a = Answers::new(WINDOW);
        for i in 0..MAX_ENTRIES + 10 {
            a.put((i as u64).to_le_bytes().to_vec(), answer(1), t0);
        }
        assert_eq!(a.slot.lock().unwrap().map.len(), MAX_ENTRIES);
        let b = Answers::new(WINDOW);
        b.put(vec![1; 32], answer(MAX_BYTES), t0);
        assert!(
            b.get(&[1; 32], t0).is_none(),
            "one answer over the byte bound is not kept"
        );
    }
}

/// The table as the webhook uses it: what is answered from it, and what
/// never is.
#[cfg(test)]
mod webhook {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::time::{Duration, Instant};

    use serde_json::{Value, json};
    use sigil_core::Policy;
    use sigil_core::credentials::{PullSecretStore, SecretAuths, StaticStore};
    use sigil_testkit::resolver::FakeResolver;

    use super::super::Webhook;
    use crate::engine::Engine;
    use crate::metrics::Metrics;

    fn engine() -> Engine<FakeResolver> {
        let p = Policy::from_yaml(
            "apiVersion: sigil.dev/v1alpha1\nkind: ImagePolicy\nspec:\n  rules:\n    - {name: all, match: [\"**\"], mode: enforce}\n",
        )
        .unwrap();
        Engine::new(Arc::new(p), FakeResolver::new().missing_when("gone"))
    }

    /// A ReplicaSet's Pod as the API server sends it: its own uid and its
    /// own random token-volume name; `name` for a named Pod instead.
    fn body(op: &str, image: &str, name: Option<&str>) -> Vec<u8> {
        let n = sigil_testkit::registry::uniq();
        let mut metadata = json!({"generateName": "web-5d8f-"});
        if let Some(name) = name {
            metadata = json!({"name": name});
        }
        let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": metadata,
            "spec": {"containers": [{"name": "app", "image": image,
                "volumeMounts": [{"name": format!("kube-api-access-{n}"), "mountPath": "/var/run"}]}],
                "volumes": [{"name": format!("kube-api-access-{n}"), "projected": {"sources": []}}]}});
        let mut review = sigil_testkit::review::review(op, "team", pod.clone());
        if op == "UPDATE" {
            review["request"]["oldObject"] = pod;
        }
        serde_json::to_vec(&review).unwrap()
    }

    fn answer(h: &Webhook<FakeResolver>, body: &[u8]) -> Value {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        let (out, _) = rt.block_on(h.review(body, deadline)).expect("review");
        serde_json::from_slice(&out).unwrap()
    }

    fn reused(h: &Webhook<FakeResolver>) -> u64 {
        h.metrics.answers_reused.get()
    }

    #[test]
    fn a_replicasets_pods_are_decided_once_and_each_answered_with_its_own_uid() {
        let h = Webhook::new(engine(), Arc::new(Metrics::default()));
        let (a, b) = (
            body("CREATE", "r.io/app:1", None),
            body("CREATE", "r.io/app:1", None),
        );
        let (mut first, mut second) = (answer(&h, &a), answer(&h, &b));
        assert_eq!(reused(&h), 1);
        assert_eq!(
            h.engine().resolver.calls(),
            1,
            "the second Pod looked nothing up"
        );
        let uid = |b: &[u8]| serde_json::from_slice::<Value>(b).unwrap()["request"]["uid"].clone();
        assert_eq!(first["response"]["uid"], uid(&a));
        assert_eq!(second["response"]["uid"], uid(&b));
        assert_eq!(first["response"]["patchType"], "JSONPatch", "{first}");
        first["response"]["uid"] = Value::Null;
        second["response"]["uid"] = Value::Null;
        assert_eq!(first, second);
    }

    #[test]
    fn denials_updates_and_other_objects_are_decided_afresh() {
        let h = Webhook::new(engine(), Arc::new(Metrics::default()));
        for b in [
            [
                body("CREATE", "r.io/gone:1", None),
                body("CREATE", "r.io/gone:1", None),
            ],
            [
                body("UPDATE", "r.io/app:1", None),
                body("UPDATE", "r.io/app:1", None),
            ],
            [
                body("CREATE", "r.io/app:2", Some("a")),
                body("CREATE", "r.io/app:2", Some("b")),
            ],
        ] {
            let first = answer(&h, &b[0]);
            let second = answer(&h, &b[1]);
            assert_eq!(first["response"]["allowed"], second["response"]["allowed"]);
        }
        assert_eq!(reused(&h), 0);
        assert_eq!(h.engine().resolver.calls(), 2 + 2 + 2);
    }

    /// A pull-secret store whose generation the test moves.
    #[derive(Default)]
    struct Moving(AtomicU64);

    impl PullSecretStore for Moving {
        fn secret(&self, _: &str, _: &str) -> Option<SecretAuths> {
            None
        }
        fn service_account(&self, _: &str, _: &str) -> Option<Vec<String>> {
            None
        }
        fn generation(&self) -> Option<u64> {
            Some(self.0.load(Ordering::SeqCst))
        }
    }

    #[test]
    fn nothing_decided_before_a_store_change_or_a_reload_is_reused_after_it() {
        let store = Arc::new(Moving::default());
        let h = Webhook::new(
            engine().with_pull_secrets(store.clone()),
            Arc::new(Metrics::default()),
        );
        answer(&h, &body("CREATE", "r.io/app:1", None));
        store.0.fetch_add(1, Ordering::SeqCst);
        answer(&h, &body("CREATE", "r.io/app:1", None));
        assert_eq!(reused(&h), 0, "a Secret changed in between");
        answer(&h, &body("CREATE", "r.io/app:1", None));
        assert_eq!(reused(&h), 1);
        h.replace(engine().with_pull_secrets(store));
        answer(&h, &body("CREATE", "r.io/app:1", None));
        assert_eq!(reused(&h), 1, "a new policy starts with no answers");
    }

    #[test]
    fn a_store_that_cannot_tell_its_generation_turns_reuse_off() {
        let h = Webhook::new(
            engine().with_pull_secrets(Arc::new(StaticStore::default())),
            Arc::new(Metrics::default()),
        );
        for _ in 0..3 {
            answer(&h, &body("CREATE", "r.io/app:1", None));
        }
        assert_eq!(reused(&h), 0);
    }
}
