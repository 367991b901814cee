//! What sigil's node commands read from containerd's environment: the
//! flags of `sigil-containerd` (containerd gives its verifiers its own whole
//! environment; set these in its service's unit), shared by the verifier
//! and `sigil node check`, which reads them off the running containerd.

use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use sigil::node::cache;

use super::CredentialArgs;

/// What the verifier reads from containerd's environment (containerd gives
/// it its own whole environment; set these in its service's unit).
#[derive(Parser, Debug)]
#[command(name = "sigil-containerd", no_binary_name = true)]
pub struct NodeEnv {
    /// The policy file (the same schema as `sigil serve --policy`), written
    /// on the node from the cluster's policy (docs/node.md); unset, the
    /// file `sigil node sync` writes (`/etc/sigil/node-policy.yaml`).
    #[arg(long, env = "SIGIL_NODE_POLICY")]
    pub policy: Option<PathBuf>,
    /// What a pull gets while there is no policy file: deny (default: fail
    /// closed, as containerd does at the verifier's timeout) or allow. A
    /// file that is there but unreadable, too large or invalid always
    /// refuses.
    #[arg(long, env = "SIGIL_NODE_ON_MISSING_POLICY", default_value = "deny", value_parser = ["deny", "allow"])]
    pub on_missing_policy: String,
    /// The verification cache's directory; none without.
    #[arg(long, env = "SIGIL_NODE_CACHE")]
    pub cache: Option<PathBuf>,
    /// How long an admission stays in the cache.
    #[arg(long, env = "SIGIL_NODE_CACHE_TTL", default_value = "10m", value_parser = humantime::parse_duration)]
    pub cache_ttl: Duration,
    /// Answers kept in the cache at most.
    #[arg(long, env = "SIGIL_NODE_CACHE_ENTRIES", default_value_t = cache::DEFAULT_MAX_ENTRIES)]
    pub cache_entries: usize,
    /// The time sigil gives its lookups; keep it below containerd's
    /// per_verifier_timeout, so a dark registry is refused with a reason.
    #[arg(long, env = "SIGIL_NODE_TIMEOUT", default_value = "4s", value_parser = humantime::parse_duration)]
    pub timeout: Duration,
    #[command(flatten)]
    pub creds: CredentialArgs,
}
