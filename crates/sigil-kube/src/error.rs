//! sigil-kube's one error type: what can go wrong talking to the Kubernetes
//! API or minting the certificates it keeps there — each variant keeping its
//! source, with the operation that failed in front of it.

use std::io;

/// Why a call to the cluster, or material kept there, failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The Kubernetes API refused or failed a call.
    #[error("{context}: {source}")]
    Kube {
        /// What sigil was doing.
        context: String,
        /// kube-rs' error (the API server's Status, or the transport's).
        #[source]
        source: Box<kube::Error>,
    },
    /// Reading a file (a CA bundle) failed.
    #[error("{context}: {source}")]
    Io {
        /// What sigil was doing.
        context: String,
        /// The operating system's answer.
        #[source]
        source: io::Error,
    },
    /// A PEM block holds no usable certificate or key.
    #[error("{context}: {source}")]
    Pem {
        /// What sigil was doing.
        context: String,
        /// The PEM parser's reason.
        #[source]
        source: rustls_pki_types::pem::Error,
    },
    /// A certificate or key could not be minted or encoded.
    #[error("{context}: {source}")]
    Mint {
        /// What sigil was doing.
        context: String,
        /// rcgen's reason.
        #[source]
        source: rcgen::Error,
    },
    /// Something sigil read (a certificate, a Secret, a flag's value) is unusable.
    #[error("{0}")]
    Invalid(String),
    /// A flag needs the Kubernetes API, and there is none to talk to.
    #[error(
        "{flag} needs access to the Kubernetes API, but no cluster is configured ({detail}); run sigil in a pod with a service account, or set KUBECONFIG"
    )]
    NoCluster {
        /// The flag or command that needs it.
        flag: String,
        /// kube-rs' reason.
        detail: String,
    },
}

/// An error from the other side of a seam ([`crate::InForce`], a callback),
/// kept for its message.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

impl Error {
    /// One line for a log: an API server's refusal as its message and
    /// reason (not the Status in Debug form, which `Display` of kube-rs'
    /// error carries), anything else as `Display` gives it.
    pub fn brief(&self) -> String {
        match self {
            Error::Kube { context, source } => match source.as_ref() {
                kube::Error::Api(s) => {
                    format!("{context}: {} ({} {})", s.message, s.code, s.reason)
                }
                other => format!("{context}: {other}"),
            },
            other => other.to_string(),
        }
    }

    /// The namespace the API server says does not exist, if that is the error
    /// (a create in a namespace that is not there: 404 with `details.kind: namespaces`).
    pub fn missing_namespace(&self) -> Option<&str> {
        let Error::Kube { source, .. } = self else {
            return None;
        };
        let kube::Error::Api(s) = source.as_ref() else {
            return None;
        };
        let d = s.details.as_ref()?;
        (s.code == 404 && d.kind == "namespaces").then_some(d.name.as_str())
    }
}

/// `Result` with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

sigil_core::error_context!(Error:
    io::Error => Io,
    kube::Error => Kube box,
    rcgen::Error => Mint,
    rustls_pki_types::pem::Error => Pem,
);
