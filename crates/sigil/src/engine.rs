//! The I/O half of the one decision path every front end shares.
//!
//! Owns running the lookups a [`sigil_core::ObjectPlan`] names — each
//! distinct tag resolved once and each distinct (digest, rule) verified once,
//! all concurrently under one deadline — and handing the answers back to
//! sigil-core, which makes the decision. It decides nothing itself, does not
//! know whether the object came from an AdmissionReview, a YAML file or a
//! cluster listing, and renders nothing. It also builds the engine a policy
//! needs ([`engine_for`]: registry clients and digest cache kept when the
//! policy's registry settings and cache TTL did not change, so editing a
//! rule does not cool the cache; trust material loaded up front).

use std::sync::Arc;
use std::time::Instant;

use futures_util::future::{BoxFuture, join_all};
use sigil_core::credentials::{PullContext, PullSecretStore};
use sigil_core::{
    AnswerMap, Answers, Digest, DigestResolver, NamespaceLabels, ObjectFacts, ObjectVerdict,
    Policy, PullCredentials, Reference, ResolveFailure, SignatureVerifier, VerificationReport,
    VerifyJob, VerifyKey, plan_object,
};
use sigil_registry::keychain::Keychain;
use sigil_registry::{CacheConfig, Registry, RegistryError};

use crate::metrics::Metrics;

/// The clock, in unix seconds (0 before 1970, which no clock here reads).
pub fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

/// Distinct lookups one object may need by default (`--max-lookups-per-object`).
pub const DEFAULT_MAX_LOOKUPS: usize = 64;

/// A policy plus the resolver and signature verifier that feed it.
pub struct Engine<R> {
    /// The loaded policy.
    pub policy: Arc<Policy>,
    /// Where digests come from.
    pub resolver: R,
    /// Checks signatures for rules with `verify`; `None` when no rule verifies.
    pub verifier: Option<Arc<dyn SignatureVerifier>>,
    /// The cluster's pull secrets and ServiceAccounts (kept by watches);
    /// `None` when sigil does not read them (client side, `--pull-secrets` off).
    pub pull_secrets: Option<Arc<dyn PullSecretStore>>,
    /// Namespace labels (kept by a watch), for rules with a `namespaceSelector`.
    pub namespaces: Option<Arc<dyn NamespaceLabels>>,
    /// Beyond this many distinct lookups an object is denied, unlooked-up.
    pub max_lookups: usize,
    /// (rule, verifier, why) for verifiers whose trust material is not
    /// available; policy status reports them.
    pub unavailable: Vec<(String, String, String)>,
    /// The instant decisions are made at (unix seconds), for exceptions'
    /// expiry; `None` reads the clock at each decision (`sigil test` fixes it).
    pub now: Option<i64>,
    /// Copies images into mirrors that lack them (`mirrors[].copy`), in the
    /// webhook; `None` elsewhere, where such a mirror's miss is a failure.
    pub copier: Option<Arc<dyn crate::failover::MirrorCopier>>,
}

impl<R: std::fmt::Debug> std::fmt::Debug for Engine<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("policy", &self.policy.name)
            .field("resolver", &self.resolver)
            .field("verifier", &self.verifier.is_some())
            .field("pull_secrets", &self.pull_secrets.is_some())
            .finish()
    }
}

impl<R: DigestResolver> Engine<R> {
    /// Creates an engine without a signature verifier.
    pub fn new(policy: Arc<Policy>, resolver: R) -> Self {
        Engine {
            policy,
            resolver,
            verifier: None,
            pull_secrets: None,
            namespaces: None,
            max_lookups: DEFAULT_MAX_LOOKUPS,
            unavailable: Vec::new(),
            now: None,
            copier: None,
        }
    }

    /// The instant of a decision: the fixed one, else the clock's.
    fn now(&self) -> i64 {
        self.now.unwrap_or_else(unix_now)
    }

    /// Reads namespace labels from `store`.
    pub fn with_namespaces(mut self, store: Arc<dyn NamespaceLabels>) -> Self {
        self.namespaces = Some(store);
        self
    }

    /// Reads pull secrets and ServiceAccounts from `store`.
    pub fn with_pull_secrets(mut self, store: Arc<dyn PullSecretStore>) -> Self {
        self.pull_secrets = Some(store);
        self
    }

    /// Adds the verifier rules with `verify` need.
    pub fn with_verifier(mut self, verifier: Arc<dyn SignatureVerifier>) -> Self {
        self.verifier = Some(verifier);
        self
    }

    /// Decides one object: sigil-core plans it, the lookups run here
    /// (concurrently, so latency tracks the slowest, not the sum), and
    /// sigil-core turns the answers into the verdict.
    pub async fn decide(&self, facts: ObjectFacts<'_>, deadline: Instant) -> ObjectVerdict {
        self.decide_with(facts, deadline, Effects::Allowed).await
    }

    /// [`Engine::decide`] for a review that may or may not have side
    /// effects (a dry run has none: no copy into a mirror).
    pub async fn decide_with(
        &self,
        facts: ObjectFacts<'_>,
        deadline: Instant,
        effects: Effects,
    ) -> ObjectVerdict {
        // Labels are looked up only when a rule is limited to some namespaces.
        let looked_up = match (&self.namespaces, facts.namespace, facts.namespace_labels) {
            (Some(store), Some(ns), None) if self.policy.has_namespace_selectors() => {
                store.labels(ns)
            }
            _ => None,
        };
        let plan = plan_object(
            &self.policy,
            ObjectFacts {
                namespace_labels: looked_up.as_ref().or(facts.namespace_labels),
                ..facts
            },
        )
        .limit_lookups(self.max_lookups);
        let creds = self.cluster_credentials(plan.pull_context());
        let (digests, served) = self.resolve_all(&plan, &creds, deadline, effects).await;
        let (plan, reports) = if served.is_empty() {
            let reports = self
                .verify_all(plan.verifications(&digests), &creds, deadline)
                .await;
            drop(creds);
            (plan, reports)
        } else {
            // Served by another mirror or the origin: signatures are read
            // where the image will be pulled from.
            drop(creds);
            let plan = plan.served_by(&served);
            let creds = self.cluster_credentials(plan.pull_context());
            let reports = self
                .verify_all(plan.verifications(&digests), &creds, deadline)
                .await;
            drop(creds);
            (plan, reports)
        };
        plan.decide(&Answers {
            offline: false,
            digests,
            reports,
            now: Some(self.now()),
        })
    }

    /// Decides without any registry call (`--offline`): what needs a lookup
    /// is reported as such.
    pub fn decide_offline(&self, facts: ObjectFacts<'_>) -> ObjectVerdict {
        plan_object(&self.policy, facts).decide(&Answers {
            offline: true,
            now: Some(self.now()),
            ..Answers::default()
        })
    }

    /// The object's cluster credentials: its Secrets (or its
    /// ServiceAccount's) as one keyring, read from the watches.
    fn cluster_credentials<'a>(&'a self, pull: Option<&'a PullContext>) -> ClusterCredentials<'a> {
        match (pull, &self.pull_secrets) {
            (Some(ctx), Some(store)) if !ctx.namespace.is_empty() => ClusterCredentials {
                of: Some((ctx, store.as_ref())),
                named: ctx.sources().into(),
            },
            _ => ClusterCredentials {
                of: None,
                named: Arc::from([]),
            },
        }
    }

    /// Verifies each job, all concurrently under the same deadline as the lookups.
    async fn verify_all(
        &self,
        jobs: Vec<VerifyJob<'_>>,
        creds: &ClusterCredentials<'_>,
        deadline: Instant,
    ) -> AnswerMap<VerifyKey, Arc<VerificationReport>> {
        if jobs.is_empty() {
            return AnswerMap::default();
        }
        let Some(verifier) = &self.verifier else {
            // A policy with verify rules always gets a verifier; without one,
            // nothing can pass (fail closed, with a reason).
            return jobs
                .into_iter()
                .map(|j| {
                    let r = VerificationReport::unfetched(
                        j.verification,
                        ResolveFailure::Config {
                            detail: "no signature verifier is configured in this process".into(),
                        },
                    );
                    (j.key, Arc::new(r))
                })
                .collect();
        };
        // What the verifier holds is answered at once; only the rest (none,
        // on a cached admission) becomes futures, run concurrently.
        let mut reports = AnswerMap::with_capacity_and_hasher(jobs.len(), Default::default());
        let mut misses = Vec::new();
        for j in jobs {
            let c = creds.for_target(j.repository);
            match verifier.cached(j.repository, &j.key.digest, j.verification, &c) {
                Some(r) => {
                    reports.insert(j.key, r);
                }
                None => {
                    // The image's own credentials, when its signatures live
                    // elsewhere and the rule reads its index (`signedAt`).
                    let ic = (j.verification.signed_at.reads_platforms()
                        && j.image != j.repository)
                        .then(|| creds.for_target(j.image));
                    misses.push((j, c, ic));
                }
            }
        }
        if misses.is_empty() {
            return reports;
        }
        let verified = join_all(misses.iter().map(|(j, c, ic)| {
            let image = ic.as_ref().map(|ic| (j.image, ic));
            verifier.verify(
                j.repository,
                &j.key.digest,
                j.verification,
                c,
                image,
                deadline,
            )
        }))
        .await;
        reports.extend(misses.into_iter().map(|(j, ..)| j.key).zip(verified));
        reports
    }

    /// Resolves every lookup of `plan` (a mirror that fails over through
    /// [`crate::failover`]): the answers by where they were served, and the
    /// lookups served elsewhere than planned.
    async fn resolve_all(
        &self,
        plan: &sigil_core::ObjectPlan,
        creds: &ClusterCredentials<'_>,
        deadline: Instant,
        effects: Effects,
    ) -> (AnswerMap<Reference, Result<Digest, ResolveFailure>>, Served) {
        let targets = plan.lookups();
        if targets.is_empty() {
            return Default::default();
        }
        let platform = self.policy.platform.as_ref();
        let answers = join_all(targets.iter().map(|t| {
            let failover = plan.failover_of(t);
            async move {
                match failover {
                    // Boxed: the failover's state (its copy gate, the
                    // verification it may run) stays out of every plain
                    // lookup's future, which `join_all` moves.
                    Some((f, origin)) => {
                        Box::pin(self.resolve_failing_over(
                            plan,
                            t,
                            (f, origin),
                            creds,
                            deadline,
                            effects,
                        ))
                        .await
                    }
                    None => crate::failover::Resolved {
                        by: (*t).clone(),
                        result: self
                            .resolver
                            .resolve(t, platform, &creds.for_target(t), deadline)
                            .await,
                        fallback: None,
                    },
                }
            }
        }))
        .await;
        let mut digests = AnswerMap::with_capacity_and_hasher(answers.len(), Default::default());
        let mut served = Served::default();
        for (t, a) in targets.into_iter().zip(answers) {
            if a.by != *t || a.fallback.is_some() {
                served.insert(t.clone(), (a.by.clone(), a.fallback));
            }
            digests.insert(a.by, a.result);
        }
        (digests, served)
    }
}

impl<R: DigestResolver> Engine<R> {
    /// Resolves `target`, a mirror's image that fails over under `f`
    /// ([`crate::failover`]), with its copy gate.
    async fn resolve_failing_over(
        &self,
        plan: &sigil_core::ObjectPlan,
        t: &Reference,
        (f, origin): (&Arc<sigil_core::policy::Failover>, &Reference),
        creds: &ClusterCredentials<'_>,
        deadline: Instant,
        effects: Effects,
    ) -> crate::failover::Resolved {
        let workload = creds.for_target(origin);
        let vet = |o: Reference, d: Digest| -> BoxFuture<'_, Result<(), String>> {
            Box::pin(self.vet_origin(plan, t, o, d, creds, deadline))
        };
        let gate = crate::failover::CopyGate {
            dry_run: effects == Effects::DryRun,
            workload: &workload,
            vet: &vet,
        };
        let for_target = |t: &Reference| creds.for_target(t);
        crate::failover::resolve(
            &self.resolver,
            self.copier.as_deref().map(|c| (c, &gate)),
            t,
            (f.as_ref(), origin),
            self.policy.platform.as_ref(),
            &for_target,
            deadline,
        )
        .await
    }

    /// Verifies `origin@digest` as the image planned at `target` would be
    /// verified were it served from the origin: every requirement of this
    /// admission on it (the rule's, the namespace's teams'), before a copy
    /// may put it in a shared mirror.
    async fn vet_origin(
        &self,
        plan: &sigil_core::ObjectPlan,
        target: &Reference,
        origin: Reference,
        digest: Digest,
        creds: &ClusterCredentials<'_>,
        deadline: Instant,
    ) -> Result<(), String> {
        let mut served = Served::default();
        served.insert(target.clone(), (origin.clone(), None));
        let plan = plan.clone().served_by(&served);
        let mut digests = AnswerMap::default();
        digests.insert(origin, Ok(digest.clone()));
        let jobs: Vec<_> = plan
            .verifications(&digests)
            .into_iter()
            .filter(|j| j.key.digest == digest)
            .collect();
        let reports = self.verify_all(jobs, creds, deadline).await;
        let failed: Vec<String> = reports
            .iter()
            .filter(|(_, r)| !r.satisfied())
            .map(|(k, r)| format!("rule {:?}: {r}", k.rule))
            .collect();
        if failed.is_empty() {
            Ok(())
        } else {
            Err(failed.join("; "))
        }
    }
}

/// Whether a review may have side effects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Effects {
    /// A review that is carried out.
    Allowed,
    /// `dryRun: true`: nothing outside sigil's caches may change.
    DryRun,
}

/// Lookups served elsewhere than planned: planned target → (where, fallback).
type Served = AnswerMap<Reference, (Reference, Option<Arc<sigil_core::policy::FellBack>>)>;

impl<R: DigestResolver> sigil_kube::Decide for Engine<R> {
    fn policy(&self) -> &Arc<Policy> {
        &self.policy
    }

    fn decide<'a>(
        &'a self,
        facts: ObjectFacts<'a>,
        deadline: Instant,
    ) -> BoxFuture<'a, ObjectVerdict> {
        Box::pin(Engine::decide(self, facts, deadline))
    }

    fn resolve<'a>(
        &'a self,
        target: &'a Reference,
        deadline: Instant,
    ) -> BoxFuture<'a, Result<Digest, ResolveFailure>> {
        Box::pin(async move {
            self.resolver
                .resolve(
                    target,
                    self.policy.platform.as_ref(),
                    &PullCredentials::default(),
                    deadline,
                )
                .await
        })
    }
}

/// Where credentials come from besides the policy: set once from flags and
/// kept across policy reloads.
#[derive(Clone)]
pub struct Sources {
    /// `--docker-config`, credential helpers, credential-provider plugins.
    pub keychain: Arc<Keychain>,
    /// Pull secrets and ServiceAccounts from watches (`--pull-secrets`).
    pub pull_secrets: Option<Arc<dyn PullSecretStore>>,
    /// Namespace labels from a watch (`--watch-policies`).
    pub namespaces: Option<Arc<dyn sigil_core::NamespaceLabels>>,
    /// Distinct lookups one object may need (`--max-lookups-per-object`).
    pub max_lookups: usize,
    /// The Sigstore trusted roots in force (the default kept current by TUF).
    pub trust: Arc<sigil_verify::roots::TrustRoots>,
    /// ConfigMaps and Secrets verifiers name by `keyRef` (watched in `serve`).
    pub keys: Arc<dyn sigil_core::verify::KeySource>,
    /// When a registry host's circuit breaker opens (`--registry-breaker-*`).
    pub breaker: sigil_registry::breaker::Settings,
    /// The limits of copies into mirrors (`--mirror-copy-*`).
    pub copy: sigil_registry::copy::Settings,
    /// Whether admissions copy images into mirrors (`mirrors[].copy`): the
    /// webhook only; `sigil pin` never pushes (`sigil mirror` does, asked).
    pub copy_on_admission: bool,
}

impl Default for Sources {
    fn default() -> Self {
        Sources {
            keychain: Arc::default(),
            pull_secrets: None,
            namespaces: None,
            max_lookups: DEFAULT_MAX_LOOKUPS,
            trust: Arc::default(),
            keys: Arc::new(sigil_core::verify::NoKeySource),
            breaker: Default::default(),
            copy: Default::default(),
            copy_on_admission: false,
        }
    }
}

impl std::fmt::Debug for Sources {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sources")
            .field("keychain", &self.keychain)
            .field("pull_secrets", &self.pull_secrets.is_some())
            .finish()
    }
}

/// The registry client a policy needs, reusing `current` when nothing it
/// depends on changed.
pub fn registry_for(
    policy: &Policy,
    current: Option<(&Policy, &Registry)>,
    sources: &Sources,
    metrics: &Arc<Metrics>,
) -> Result<Registry, RegistryError> {
    if let Some((old, reg)) = current
        && old.registries == policy.registries
        && old.cache_ttl == policy.cache_ttl
    {
        return Ok(reg.clone());
    }
    let cache = CacheConfig {
        ttl: policy.cache_ttl,
        ..CacheConfig::default()
    };
    Registry::new(
        &policy.registries,
        cache,
        metrics.clone(),
        sources.keychain.clone(),
        sources.breaker,
        sources.copy,
    )
}

/// Why a policy could not be put in force.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// Its registry settings cannot be used.
    #[error(transparent)]
    Registry(#[from] RegistryError),
    /// A key, certificate or trust root it names cannot be loaded.
    #[error("signature verification: {0}")]
    Verify(#[from] sigil_verify::VerifyError),
}

/// Builds the engine for a policy: registry clients (reused from `current`
/// when unchanged) and, if any rule verifies, the signature verifier with its
/// trust material loaded now, so a bad key file fails the load, not a request.
pub fn engine_for(
    policy: Arc<Policy>,
    current: Option<&Engine<Registry>>,
    sources: &Sources,
    metrics: &Arc<Metrics>,
) -> Result<Engine<Registry>, EngineError> {
    let registry = registry_for(
        &policy,
        current.map(|e| (e.policy.as_ref(), &e.resolver)),
        sources,
        metrics,
    )?;
    let copier: Option<Arc<dyn crate::failover::MirrorCopier>> = sources
        .copy_on_admission
        .then(|| Arc::new(registry.clone()) as _);
    let mut engine = engine_over(policy, registry, sources, metrics)?;
    engine.copier = copier;
    Ok(engine)
}

/// [`engine_for`] over any source of digests and artifacts (the registry
/// client, or OCI layouts on disk for `sigil test` and air-gapped pinning).
pub fn engine_over<S>(
    policy: Arc<Policy>,
    source: S,
    sources: &Sources,
    metrics: &Arc<Metrics>,
) -> Result<Engine<S>, EngineError>
where
    S: DigestResolver + sigil_core::ArtifactSource + Clone + 'static,
{
    sources
        .keys
        .want(&sigil_verify::Material::key_refs(&policy));
    let material =
        sigil_verify::Material::load_with(&policy, &sources.trust, sources.keys.as_ref())?;
    let mut engine = Engine::new(policy.clone(), source.clone());
    engine.max_lookups = sources.max_lookups;
    engine.unavailable = material.unavailable().to_vec();
    if !material.is_empty() {
        let cache = sigil_verify::CacheConfig {
            ttl: policy.cache_ttl,
            capacity: sigil_verify::DEFAULT_CAPACITY,
            ..Default::default()
        };
        let verifier = sigil_verify::Verifier::new(source, material, cache, metrics.clone());
        engine = engine.with_verifier(Arc::new(verifier));
    }
    if let Some(store) = &sources.pull_secrets {
        engine = engine.with_pull_secrets(store.clone());
    }
    if let Some(store) = &sources.namespaces {
        engine = engine.with_namespaces(store.clone());
    }
    Ok(engine)
}

/// One object's cluster credentials, looked up per image.
struct ClusterCredentials<'a> {
    of: Option<(&'a PullContext, &'a dyn PullSecretStore)>,
    named: Arc<[String]>,
}

impl ClusterCredentials<'_> {
    /// The candidates for one image, most specific key first.
    fn for_target(&self, target: &Reference) -> PullCredentials {
        match self.of {
            None => PullCredentials::default(),
            Some((ctx, store)) => PullCredentials {
                candidates: ctx.candidates(store, target.name_str()),
                named: self.named.clone(),
            },
        }
    }
}
