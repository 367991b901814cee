//! How a registry lookup failed, as the I/O edge reports it: the one
//! vocabulary for "the registry said no" that verification reports,
//! denials and the audit share, with the words each failure is shown in.
//! No I/O: the registry client builds these values, this module only
//! names and explains them.

use std::fmt;
use std::time::Duration;

/// How a registry lookup failed, as reported by the I/O edge.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ResolveFailure {
    /// The registry answered 404 / MANIFEST_UNKNOWN / NAME_UNKNOWN.
    NotFound {
        /// The registry's own words, trimmed.
        detail: String,
    },
    /// 401/403 even after authenticating (or no credentials configured).
    Unauthorized {
        /// HTTP status.
        status: u16,
        /// The registry's own words, trimmed.
        detail: String,
    },
    /// 429 with no time left to honour Retry-After.
    RateLimited {
        /// What the registry asked us to wait.
        retry_after: Option<Duration>,
    },
    /// Any other non-success status.
    Status {
        /// HTTP status.
        status: u16,
        /// The registry's own words, trimmed.
        detail: String,
    },
    /// Connection refused, DNS, TLS handshake and other transport errors.
    Unreachable {
        /// Transport error text.
        detail: String,
    },
    /// The admission deadline passed before the registry answered.
    Timeout {
        /// Time that was available.
        budget: Duration,
    },
    /// The registry answered something that is not a usable manifest.
    BadResponse {
        /// What was wrong.
        detail: String,
    },
    /// The index has no manifest for the policy's platform.
    PlatformNotFound {
        /// Wanted platform.
        platform: String,
        /// Platforms the index offers.
        available: Vec<String>,
    },
    /// Local configuration prevented the request (unreadable password file, bad CA).
    Config {
        /// What was wrong.
        detail: String,
    },
}

impl ResolveFailure {
    /// Short label for metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            ResolveFailure::NotFound { .. } => "not_found",
            ResolveFailure::Unauthorized { .. } => "unauthorized",
            ResolveFailure::RateLimited { .. } => "rate_limited",
            ResolveFailure::Status { .. } => "status",
            ResolveFailure::Unreachable { .. } => "unreachable",
            ResolveFailure::Timeout { .. } => "timeout",
            ResolveFailure::BadResponse { .. } => "bad_response",
            ResolveFailure::PlatformNotFound { .. } => "platform_not_found",
            ResolveFailure::Config { .. } => "config",
        }
    }

    /// Whether the failure may go away by itself (worth caching only briefly).
    pub fn is_transient(&self) -> bool {
        !matches!(
            self,
            ResolveFailure::NotFound { .. } | ResolveFailure::PlatformNotFound { .. }
        )
    }

    pub(crate) fn hint(&self) -> &'static str {
        match self {
            ResolveFailure::NotFound { .. } => {
                "check the image name and tag, or push the image (and mirror it, if a mirror is configured)"
            }
            ResolveFailure::Unauthorized { .. } => {
                "give the workload an imagePullSecret for this registry (on the Pod spec or its ServiceAccount), or give sigil node-level credentials (spec.registries[].auth, --docker-config, a credential provider); see docs/credentials.md"
            }
            ResolveFailure::RateLimited { .. } => {
                "use a mirror or authenticated pulls, or retry later"
            }
            ResolveFailure::Status { .. } | ResolveFailure::BadResponse { .. } => {
                "check the registry's health, or retry later"
            }
            ResolveFailure::Unreachable { .. } => {
                "check that sigil can reach the registry (network policy, DNS, TLS: spec.registries[].ca or insecure)"
            }
            ResolveFailure::Timeout { .. } => {
                "the registry is slow; retry, raise the webhook's timeoutSeconds, or pin the image by digest"
            }
            ResolveFailure::PlatformNotFound { .. } => {
                "publish the image for this platform or change spec.pin.platform"
            }
            ResolveFailure::Config { .. } => "fix sigil's registry configuration",
        }
    }
}

impl fmt::Display for ResolveFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ResolveFailure::NotFound { detail } => {
                write!(f, "registry answered 404 not found ({detail})")
            }
            ResolveFailure::Unauthorized { status, detail } => {
                write!(f, "registry refused access: {status} ({detail})")
            }
            ResolveFailure::RateLimited {
                retry_after: Some(d),
            } => write!(
                f,
                "registry rate-limited the lookup (429, Retry-After {}s exceeds the deadline)",
                d.as_secs()
            ),
            ResolveFailure::RateLimited { retry_after: None } => {
                write!(f, "registry rate-limited the lookup (429)")
            }
            ResolveFailure::Status { status, detail } => {
                write!(f, "registry answered {status} ({detail})")
            }
            ResolveFailure::Unreachable { detail } => write!(f, "registry unreachable: {detail}"),
            ResolveFailure::Timeout { budget } => write!(
                f,
                "no answer from the registry within the admission deadline ({} ms)",
                budget.as_millis()
            ),
            ResolveFailure::BadResponse { detail } => {
                write!(f, "registry sent an unusable manifest: {detail}")
            }
            ResolveFailure::PlatformNotFound {
                platform,
                available,
            } => write!(
                f,
                "index has no manifest for {platform} (has: {})",
                available.join(", ")
            ),
            ResolveFailure::Config { detail } => {
                write!(f, "registry configuration error: {detail}")
            }
        }
    }
}
