//! `sigil node`: sigil on a node, beside containerd (docs/node.md).
//! `sigil node verify` is containerd's image verifier — what runs when sigil
//! is invoked as `sigil-containerd` from containerd's `bin_dir` — and
//! `sigil node check` says whether containerd will call it. Flags and glue:
//! the protocol, the cache, the config reading and the pull decision
//! (`sigil::node::pull`: the engine's, on a Pod holding the pulled image)
//! are `sigil::node`; containerd's environment is [`super::node_env`].

use std::io::Read as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use anyhow::Result;
use clap::{Parser as _, Subcommand};
use sigil::node::cache::{self, Cache};
use sigil::node::{MAX_STDIN, Request, Verdict, pull};

use super::EXIT_FINDINGS;
use super::node_env::NodeEnv;

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
    /// Prints the Roles the node DaemonSet needs for a policy: the policy
    /// ConfigMap and exactly the ConfigMaps and Secrets its keyRefs name,
    /// each by name (what the Kustomize component ships; docs/node.md).
    Rbac(super::node_rbac::RbacArgs),
}

/// Runs `sigil node …`.
pub fn run(command: NodeCommand) -> Result<ExitCode> {
    match command {
        NodeCommand::Verify { args } => Ok(verify(&args)),
        NodeCommand::Check { config, images } => super::node_check::run(&config, &images),
        NodeCommand::Sync(args) => super::node_sync::run(*args),
        NodeCommand::Rbac(args) => super::node_rbac::run(args),
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
    let loaded = match pull::load(
        env.policy.as_deref(),
        env.on_missing_policy == "allow",
        &image,
    ) {
        Ok(p) => p,
        Err(v) => return v,
    };
    if let Some(v) = pull::node_admits(&loaded.policy, &image) {
        return v;
    }
    let cache = env.cache.as_deref().and_then(|dir| {
        let files = sigil_verify::Material::files(&loaded.policy);
        let fp = cache::fingerprint(&loaded.bytes, &files);
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
    let verdict = match env
        .creds
        .sources()
        .and_then(|s| Ok(pull::decide(loaded, &s, &image, deadline)?))
    {
        Ok(v) => v,
        Err(e) => Verdict::Deny(format!("sigil refused {image} at pull: {e:#}")),
    };
    if let (Verdict::Allow(_), Some(c)) = (&verdict, &cache) {
        c.remember(&image, &req.digest);
    }
    verdict
}
