//! The process lifecycle around the two listeners, in the order it happens:
//! [`bind`] (listeners and certificate, nothing served yet), [`Bound::spawn`]
//! (webhook, admin port, self-check, watchers and cluster tasks),
//! [`Signals::recv`] (SIGTERM/SIGINT), [`Running::drain`] (not ready at
//! once, keep serving for `--shutdown-delay`, stop accepting, finish what is
//! in flight).
//!
//! The webhook port is in `conn`, the admin port in `admin`, readiness in
//! `health`. It makes no admission decisions.

mod admin;
mod conn;
mod health;
pub mod limits;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::signal::unix::{Signal, SignalKind, signal};
use tokio_rustls::TlsAcceptor;

pub use health::ReadySignal;
pub use limits::Limits;

use crate::error::{Context as _, Result};
use crate::metrics::Metrics;
use crate::reload::Live;
use crate::tls::CertStore;
use sigil_kube::certs::ServingCert;

/// How often the certificate files are checked for a rotation.
const CERT_POLL: Duration = Duration::from_secs(1);
/// Upper bound on finishing in-flight requests after the drain delay.
const FINISH_TIMEOUT: Duration = Duration::from_secs(30);

/// Where the server is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Ready (once the self-check passed) and serving.
    Serving,
    /// SIGTERM received: not ready, still accepting and answering.
    Draining,
    /// Listener closed; finishing what is in flight.
    Stopping,
}

/// Everything `serve` needs, already loaded (nothing here touches the disk).
#[derive(Debug)]
pub struct ServeConfig {
    /// Webhook HTTPS address.
    pub listen: SocketAddr,
    /// Admin HTTP address.
    pub admin_listen: SocketAddr,
    /// Serving certificate.
    pub cert: ServingCert,
    /// The files it came from, watched and hot-reloaded when given.
    pub cert_files: Option<(std::path::PathBuf, std::path::PathBuf)>,
    /// The policy file and the bytes the running policy came from, watched
    /// and hot-reloaded when given.
    pub policy_file: Option<(std::path::PathBuf, Vec<u8>)>,
    /// How long to keep serving after SIGTERM before closing the listener.
    pub shutdown_delay: Duration,
    /// Started with the server (registration, self-managed certificates).
    pub tasks: Tasks,
    /// Conditions besides the self-check that must hold before Ready
    /// (why not yet, and a receiver that turns true), e.g. watches synced.
    pub ready_gates: Vec<(String, tokio::sync::watch::Receiver<bool>)>,
    /// The in-cluster audit's last report, served at `GET /audit` (when on).
    pub audit: Option<Arc<sigil_kube::audit::continuous::Latest>>,
    /// With `--watch-policies`: a reloaded policy file is combined with the
    /// policy objects instead of replacing them.
    pub combiner: Option<Arc<sigil_kube::policies::Combiner>>,
    /// Bounds on the webhook port's connections and bodies.
    pub limits: Limits,
    /// Require API-server client certificates issued by this CA (PEM).
    pub client_ca: Option<std::path::PathBuf>,
}

/// Work that runs beside the server and needs its readiness or the
/// certificate it serves. Each is spawned once the listeners are bound.
pub type Task = Box<
    dyn FnOnce(ReadySignal, Arc<CertStore>) -> futures_util::future::BoxFuture<'static, ()> + Send,
>;

/// The tasks of a [`ServeConfig`].
#[derive(Default)]
pub struct Tasks(pub Vec<Task>);

impl std::fmt::Debug for Tasks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Tasks({})", self.0.len())
    }
}

/// Listeners bound and the certificate loaded; nothing served yet.
pub struct Bound {
    listener: TcpListener,
    admin: TcpListener,
    addr: SocketAddr,
    store: Arc<CertStore>,
    acceptor: TlsAcceptor,
    cores: Arc<conn::Cores>,
    cfg: ServeConfig,
}

impl std::fmt::Debug for Bound {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bound").field("addr", &self.addr).finish()
    }
}

impl std::fmt::Debug for Running {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Running")
            .field("shutdown_delay", &self.shutdown_delay)
            .finish()
    }
}

/// Binds both listeners and loads the certificate, logging each address.
pub async fn bind(cfg: ServeConfig) -> Result<Bound> {
    let listener = TcpListener::bind(cfg.listen)
        .await
        .with_context(|| format!("binding webhook listener {}", cfg.listen))?;
    let admin = TcpListener::bind(cfg.admin_listen)
        .await
        .with_context(|| format!("binding admin listener {}", cfg.admin_listen))?;
    let addr = listener
        .local_addr()
        .context("reading the webhook address")?;
    let admin_addr = admin.local_addr().context("reading the admin address")?;
    tracing::info!(%addr, "webhook listening (HTTPS, POST /mutate)");
    tracing::info!(addr = %admin_addr, "admin listening (HTTP, /livez /readyz /metrics)");
    let store = CertStore::new(&cfg.cert, cfg.cert_files.clone())?;
    let acceptor = TlsAcceptor::from(crate::tls::server_config(
        store.clone(),
        cfg.client_ca.as_deref(),
    )?);
    let cores = Arc::new(conn::Cores::per_cpu().context("starting the connection threads")?);
    Ok(Bound {
        listener,
        admin,
        addr,
        store,
        acceptor,
        cores,
        cfg,
    })
}

/// A serving process, until [`Running::drain`].
pub struct Running {
    health: Arc<health::Health>,
    metrics: Arc<Metrics>,
    phase: tokio::sync::watch::Sender<Phase>,
    accept: tokio::task::JoinHandle<()>,
    conns: Arc<limits::Conns>,
    shutdown_delay: Duration,
}

impl Bound {
    /// Starts serving: the webhook and admin ports, the self-check that
    /// makes the server Ready, the certificate and policy watchers, and the
    /// cluster tasks.
    pub fn spawn(self, live: Arc<Live>) -> Running {
        let (webhook, metrics) = (live.webhook.clone(), live.metrics.clone());
        let Bound {
            listener,
            admin,
            addr,
            store,
            acceptor,
            cores,
            cfg,
        } = self;
        let health = Arc::new(health::Health::new(cfg.ready_gates));
        if cfg.cert_files.is_some() {
            tokio::spawn(watch_cert(store.clone(), metrics.clone()));
        }
        if let Some(leaf) = store.leaf() {
            metrics.cert_not_after.set(crate::tls::not_after(&leaf));
        }
        for task in cfg.tasks.0 {
            tokio::spawn(task(
                ReadySignal(health.ever_ready.subscribe()),
                store.clone(),
            ));
        }
        tokio::spawn(admin::admin_loop(
            admin,
            health.clone(),
            metrics.clone(),
            webhook.clone(),
            cfg.audit,
        ));
        if let Some((path, seen)) = cfg.policy_file {
            tokio::spawn(crate::reload::watch_policy(
                path,
                seen,
                live.clone(),
                cfg.combiner.clone(),
            ));
        }
        let (phase, phase_rx) = tokio::sync::watch::channel(Phase::Serving);
        let conns = limits::Conns::new(cfg.limits);
        tracing::info!(
            max_connections = conns.cap,
            body_memory = cfg.limits.body_memory,
            "webhook connection limits"
        );
        let shared = conn::Shared {
            cores,
            acceptor,
            client_auth: cfg.client_ca.is_some(),
            health: health.clone(),
            webhook,
            metrics: metrics.clone(),
            conns: conns.clone(),
        };
        let accept = tokio::spawn(conn::accept_loop(listener, shared, phase_rx));
        tokio::spawn(health::self_check_loop(
            addr,
            store,
            health.clone(),
            metrics.clone(),
        ));
        Running {
            health,
            metrics,
            phase,
            accept,
            conns,
            shutdown_delay: cfg.shutdown_delay,
        }
    }
}

/// SIGTERM (what Kubernetes sends) and SIGINT, installed before serving.
#[derive(Debug)]
pub struct Signals {
    term: Signal,
    int: Signal,
}

impl Signals {
    /// Installs the handlers.
    pub fn install() -> Result<Signals> {
        Ok(Signals {
            term: signal(SignalKind::terminate()).context("installing the SIGTERM handler")?,
            int: signal(SignalKind::interrupt()).context("installing the SIGINT handler")?,
        })
    }

    /// Waits for the next signal.
    pub async fn recv(&mut self) {
        tokio::select! {
            _ = self.term.recv() => {},
            _ = self.int.recv() => {},
        }
    }
}

impl Running {
    /// The drain: not ready at once, keep serving for `--shutdown-delay`
    /// (endpoints are removed meanwhile), then close the listener and let
    /// every connection close gracefully (HTTP/2 with GOAWAY), for at most
    /// `FINISH_TIMEOUT`. A second signal exits at once.
    pub async fn drain(self, signals: &mut Signals) {
        self.health.start_draining(&self.metrics);
        let _ = self.phase.send(Phase::Draining);
        tracing::info!(
            delay_ms = self.shutdown_delay.as_millis() as u64,
            "signal received: not ready; still serving until endpoints are removed"
        );
        tokio::select! {
            _ = tokio::time::sleep(self.shutdown_delay) => {},
            _ = signals.recv() => {
                tracing::warn!("second signal: exiting now");
                return;
            }
        }
        let _ = self.phase.send(Phase::Stopping);
        if self.accept.await.is_err() {
            tracing::warn!("accept loop ended abnormally; exiting");
            return;
        }
        tracing::info!(
            connections = self.conns.open(),
            "listener closed; finishing in-flight requests"
        );
        let finish = self.conns.all_closed();
        tokio::select! {
            () = finish => tracing::info!("drained; exiting"),
            _ = tokio::time::sleep(FINISH_TIMEOUT) => {
                tracing::warn!("connections did not finish in time; exiting");
            }
            _ = signals.recv() => tracing::warn!("second signal: exiting now"),
        }
    }
}

/// Runs the server until a signal and the drain complete.
pub async fn serve(cfg: ServeConfig, live: Arc<Live>) -> Result<()> {
    let bound = bind(cfg).await?;
    let mut signals = Signals::install()?;
    let running = bound.spawn(live);
    signals.recv().await;
    running.drain(&mut signals).await;
    Ok(())
}

/// Polls the certificate files (Secret volumes swap a symlink, so inotify on
/// the file itself misses rotations) and swaps in a new certificate.
async fn watch_cert(store: Arc<CertStore>, metrics: Arc<Metrics>) {
    loop {
        tokio::time::sleep(CERT_POLL).await;
        match store.reload_if_changed() {
            Ok(true) => {
                tracing::info!("serving certificate reloaded");
                if let Some(leaf) = store.leaf() {
                    metrics.cert_not_after.set(crate::tls::not_after(&leaf));
                }
            }
            Ok(false) => {}
            Err(e) => {
                tracing::warn!(error = %e, "certificate files changed but could not be loaded; still serving the previous certificate")
            }
        }
    }
}
