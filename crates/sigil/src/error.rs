//! The binary crate's one error type: what can go wrong while wiring sigil
//! up — files, sockets, TLS material, the engine a policy needs, and (as
//! sigil-kube's error) the Kubernetes API — each variant keeping its source,
//! with the operation that failed in front of it.
//!
//! Library modules of this crate return [`Error`]; only `main.rs` and
//! `cmd/` turn errors into `anyhow` for the user. Admission decisions never
//! produce an `Error`: a decision that fails is a typed denial in sigil-core.

use std::io;

/// Why sigil could not set something up or talk to the cluster.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Reading, writing, binding or connecting failed.
    #[error("{context}: {source}")]
    Io {
        /// What sigil was doing.
        context: String,
        /// The operating system's answer.
        #[source]
        source: io::Error,
    },
    /// rustls refused the TLS material or settings.
    #[error("{context}: {source}")]
    Tls {
        /// What sigil was doing.
        context: String,
        /// rustls' reason.
        #[source]
        source: rustls::Error,
    },
    /// A PEM file holds no usable certificate or key.
    #[error("{context}: {source}")]
    Pem {
        /// What sigil was doing.
        context: String,
        /// The PEM parser's reason.
        #[source]
        source: rustls::pki_types::pem::Error,
    },
    /// An HTTP exchange failed (the readiness self-check).
    #[error("{context}: {source}")]
    Http {
        /// What sigil was doing.
        context: String,
        /// hyper's reason.
        #[source]
        source: hyper::Error,
    },
    /// Something sigil read (a certificate, a Secret, an answer) is unusable.
    #[error("{0}")]
    Invalid(String),
    /// The policy's registry settings or signature material cannot be used.
    #[error(transparent)]
    Engine(#[from] crate::engine::EngineError),
    /// The Kubernetes API, or material kept there, failed (sigil-kube).
    #[error(transparent)]
    Kube(#[from] sigil_kube::Error),
}

/// `Result` with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

sigil_core::error_context!(Error:
    io::Error => Io,
    rustls::Error => Tls,
    rustls::pki_types::pem::Error => Pem,
    hyper::Error => Http,
);
