//! `sigil node`: sigil on a node, beside containerd (docs/node.md).
//! `sigil node verify` is containerd's image verifier — what runs when sigil
//! is invoked as `sigil-containerd` from containerd's `bin_dir` — and
//! `sigil node check` says whether containerd will call it. Flags and glue:
//! the protocol, the cache and the config reading are `sigil::node`; the
//! decision is the engine's, on a Pod holding the pulled image.

use std::io::Read as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result};
use clap::{Parser, Subcommand};
use serde_json::json;
use sigil::node::cache::{self, Cache};
use sigil::node::{MAX_STDIN, Request, Verdict};
use sigil_core::walker::summarize_value;
use sigil_core::{ObjectFacts, Operation, Policy, Source};

use super::{CredentialArgs, EXIT_FINDINGS};

/// `sigil node …`.
#[derive(Subcommand, Debug)]
pub enum NodeCommand {
    /// containerd's image verifier: `-name REF -digest D
    /// -stdin-media-type T` and the descriptor on stdin, as containerd
    /// passes them (sigil-containerd runs this). Exit 0 allows the pull;
    /// 1 refuses it, the reason on stdout. Configured by containerd's
    /// environment: SIGIL_NODE_POLICY (required), SIGIL_NODE_CACHE, …
    Verify {
        /// What containerd passes.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Whether containerd will call sigil-containerd on every pull (its
    /// configuration with its imports, verifier directory, limits, the CRI
    /// settings that bypass it) and what it will answer: the policy named
    /// by containerd's running environment, and the images the node pulls
    /// for itself. Exit 0 yes; 1 no (each reason printed); 2 unreadable
    /// config.
    Check {
        /// containerd's configuration.
        #[arg(long, default_value = "/etc/containerd/config.toml")]
        config: PathBuf,
        /// Another image the node pulls for itself (a static Pod's, CNI's,
        /// kube-proxy's): checked as the sandbox image is. Repeatable.
        #[arg(long = "image")]
        images: Vec<String>,
    },
    /// What the node DaemonSet runs: keeps the node policy file equal to
    /// the cluster's policy and installs sigil-containerd (docs/node.md).
    Sync(Box<super::node_sync::SyncArgs>),
}

/// What the verifier reads from containerd's environment (containerd gives
/// it its own whole environment; set these in its service's unit).
#[derive(Parser, Debug)]
#[command(name = "sigil-containerd", no_binary_name = true)]
pub(super) struct NodeEnv {
    /// The policy file (the same schema as `sigil serve --policy`), written
    /// on the node from the cluster's policy (docs/node.md); unset, the
    /// file `sigil node sync` writes (`/etc/sigil/node-policy.yaml`).
    #[arg(long, env = "SIGIL_NODE_POLICY")]
    pub(super) policy: Option<PathBuf>,
    /// What a pull gets while there is no policy file: deny (default: fail
    /// closed, as containerd does at the verifier's timeout) or allow. A
    /// file that is there but unreadable, too large or invalid always
    /// refuses.
    #[arg(long, env = "SIGIL_NODE_ON_MISSING_POLICY", default_value = "deny", value_parser = ["deny", "allow"])]
    pub(super) on_missing_policy: String,
    /// The verification cache's directory; none without.
    #[arg(long, env = "SIGIL_NODE_CACHE")]
    pub(super) cache: Option<PathBuf>,
    /// How long an admission stays in the cache.
    #[arg(long, env = "SIGIL_NODE_CACHE_TTL", default_value = "10m", value_parser = humantime::parse_duration)]
    pub(super) cache_ttl: Duration,
    /// Answers kept in the cache at most.
    #[arg(long, env = "SIGIL_NODE_CACHE_ENTRIES", default_value_t = cache::DEFAULT_MAX_ENTRIES)]
    pub(super) cache_entries: usize,
    /// The time sigil gives its lookups; keep it below containerd's
    /// per_verifier_timeout, so a dark registry is refused with a reason.
    #[arg(long, env = "SIGIL_NODE_TIMEOUT", default_value = "4s", value_parser = humantime::parse_duration)]
    pub(super) timeout: Duration,
    #[command(flatten)]
    pub(super) creds: CredentialArgs,
}

/// Runs `sigil node …`.
pub fn run(command: NodeCommand) -> Result<ExitCode> {
    match command {
        NodeCommand::Verify { args } => Ok(verify(&args)),
        NodeCommand::Check { config, images } => super::node_check::run(&config, &images),
        NodeCommand::Sync(args) => super::node_sync::run(*args),
    }
}

/// The verifier: never an error exit with the reason on stderr, which
/// containerd would not show; every refusal says why on stdout.
pub fn verify(args: &[String]) -> ExitCode {
    let started = Instant::now();
    let verdict = decide_pull(args, started);
    match verdict {
        Verdict::Allow(note) => {
            if let Some(n) = note {
                eprintln!("{n}");
            }
            ExitCode::SUCCESS
        }
        Verdict::Deny(reason) => {
            print!("{reason}");
            ExitCode::from(EXIT_FINDINGS)
        }
    }
}

fn decide_pull(args: &[String], started: Instant) -> Verdict {
    // containerd writes the descriptor; a person at a terminal may not.
    let mut stdin = Vec::new();
    if !std::io::IsTerminal::is_terminal(&std::io::stdin()) {
        let _ = std::io::stdin()
            .take(MAX_STDIN as u64)
            .read_to_end(&mut stdin);
    }
    let req = match Request::parse(args, &stdin) {
        Ok(r) => r,
        Err(e) => return Verdict::Deny(format!("sigil-containerd: {e}")),
    };
    if !req.ignored.is_empty() {
        eprintln!(
            "sigil-containerd: ignoring arguments this version does not know: {:?}",
            req.ignored
        );
    }
    let env = match NodeEnv::try_parse_from(Vec::<String>::new()) {
        Ok(e) => e,
        Err(e) => {
            return Verdict::Deny(format!(
                "sigil-containerd: containerd's environment: {}",
                e.to_string().trim()
            ));
        }
    };
    let deadline = started + env.timeout;
    let image = req.image();
    let (policy, bytes) = match load(&env, &image) {
        Ok(p) => p,
        Err(v) => return v,
    };
    if let Some(v) = node_admits(&policy, &image) {
        return v;
    }
    let cache = env.cache.as_deref().and_then(|dir| {
        let fp = cache::fingerprint(&bytes, &sigil_verify::Material::files(&policy));
        Cache::open(dir, fp, env.cache_ttl, env.cache_entries)
            .map_err(|e| eprintln!("sigil-containerd: cache {}: {e}", dir.display()))
            .ok()
    });
    let _held = cache
        .as_ref()
        .map(|c| c.lock(&image, &req.digest, deadline));
    if cache
        .as_ref()
        .is_some_and(|c| c.admitted(&image, &req.digest))
    {
        eprintln!("sigil-containerd: {image} admitted (cached)");
        return Verdict::Allow(None);
    }
    let verdict = match decide(policy, &env.creds, &image, deadline) {
        Ok(v) => v,
        Err(e) => Verdict::Deny(format!("sigil refused {image} at pull: {e:#}")),
    };
    if let (Verdict::Allow(_), Some(c)) = (&verdict, &cache) {
        c.remember(&image, &req.digest);
    }
    verdict
}

/// The node policy the verifier decides by, as containerd's environment
/// names it (or the file sync writes), or the verdict every pull gets
/// without one.
pub(super) fn load(env: &NodeEnv, image: &str) -> Result<(Policy, Vec<u8>), Verdict> {
    let (path, named) = match env.policy.as_deref() {
        Some(p) => (p.to_owned(), "SIGIL_NODE_POLICY"),
        None => (
            PathBuf::from(sigil::node::DEFAULT_POLICY),
            "SIGIL_NODE_POLICY is unset: the file sigil node sync writes",
        ),
    };
    let bytes = match sigil_registry::file::read(&path, sigil_registry::file::MAX_CONFIG_BYTES) {
        Ok(b) => b,
        Err(e) if is_not_found(&e) => {
            return Err(missing(
                env,
                image,
                &format!("no node policy at {} ({named})", path.display()),
            ));
        }
        // Not "missing": a file that is there and cannot be used refuses,
        // whatever SIGIL_NODE_ON_MISSING_POLICY says.
        Err(e) => {
            return Err(Verdict::Deny(format!(
                "sigil refused {image} at pull: the node policy {} cannot be read: {e}; to fix: see sigil node sync's log and /readyz (docs/node.md)",
                path.display()
            )));
        }
    };
    match std::str::from_utf8(&bytes)
        .map_err(|e| e.to_string())
        .and_then(|t| {
            Policy::from_documents_at(t, Some(sigil::engine::unix_now())).map_err(|e| e.to_string())
        }) {
        Ok(p) => Ok((p, bytes)),
        Err(e) => Err(Verdict::Deny(format!(
            "sigil refused {image} at pull: the node policy {} is invalid: {e}",
            path.display()
        ))),
    }
}

/// What a node pulls for itself (`nodeAdmits`): no namespace can exempt it.
pub(super) fn node_admits(policy: &Policy, image: &str) -> Option<Verdict> {
    let p = sigil_core::Reference::parse(image)
        .ok()
        .and_then(|r| policy.node_admits(&r).map(|p| p.source().to_owned()))?;
    Some(Verdict::Allow(Some(format!(
        "sigil-containerd: {image} admitted by nodeAdmits {p:?}"
    ))))
}

fn is_not_found(e: &sigil_registry::file::FileError) -> bool {
    matches!(e, sigil_registry::file::FileError::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound)
}

/// The documented fail mode when there is no policy to decide by.
fn missing(env: &NodeEnv, image: &str, why: &str) -> Verdict {
    if env.on_missing_policy == "allow" {
        Verdict::Allow(Some(format!(
            "sigil-containerd: {why}; {image} allowed unverified (SIGIL_NODE_ON_MISSING_POLICY=allow)"
        )))
    } else {
        Verdict::Deny(format!(
            "sigil refused {image} at pull: {why}; to fix: write the node policy (docs/node.md), or set SIGIL_NODE_ON_MISSING_POLICY=allow"
        ))
    }
}

/// The one decision, on a Pod holding the image (no namespace: rules that
/// select namespaces cannot apply at the node).
pub(super) fn decide(
    policy: sigil_core::Policy,
    creds: &CredentialArgs,
    image: &str,
    deadline: Instant,
) -> Result<Verdict> {
    let engine = super::engine_for(policy, &creds.sources()?)?;
    let pod = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "sigil-containerd"},
        "spec": {"containers": [{"name": "pull", "image": image}]}});
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting runtime")?;
    let verdict = rt.block_on(engine.decide(
        ObjectFacts {
            operation: Operation::Create,
            source: Source::Manifest,
            kind: "Pod",
            namespace: None,
            object: Some(summarize_value(&pod)),
            old_object: None,
            namespace_labels: None,
        },
        deadline,
    ));
    Ok(Verdict::of(image, &verdict))
}
