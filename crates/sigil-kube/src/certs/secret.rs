//! The self-managed Secret on the API server: read it, advance the rotation
//! one step, write it back guarded by its resourceVersion (so of several
//! replicas exactly one wins each step), and keep the served certificate
//! equal to it. [`initial`] is the bootstrap before serving starts.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Client;
use kube::api::{Api, PostParams};

use super::ServingCert;
use super::{CertSettings, Material, Step, facts, next_step, one};
use crate::BoxError;
use crate::error::{Context as _, Error, Result};
use crate::metrics::Metrics;

/// Whether the webhook configuration's caBundle holds the signing CA.
async fn bundle_trusted(client: &Client, config: &str, signing_pem: &str) -> Result<Option<bool>> {
    let api: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    let Some(c) = api
        .get_opt(config)
        .await
        .with_context(|| format!("reading MutatingWebhookConfiguration {config}"))?
    else {
        return Ok(None);
    };
    let want = one(signing_pem, "ca-signing.crt")?.subject;
    let all = c.webhooks.iter().flatten().all(|w| {
        w.client_config.ca_bundle.as_ref().is_some_and(|b| {
            std::str::from_utf8(&b.0)
                .ok()
                .and_then(|p| facts(p).ok())
                .is_some_and(|fs| fs.iter().any(|f| f.subject == want))
        })
    });
    Ok(Some(all))
}

/// One reconcile: read the Secret, advance one step, write it back guarded by
/// its resourceVersion. Returns what is in the Secret afterwards.
pub async fn reconcile(
    client: &Client,
    namespace: &str,
    config: &str,
    cfg: &CertSettings,
) -> Result<Material> {
    let api: Api<Secret> = Api::namespaced(client.clone(), namespace);
    for _ in 0..5 {
        let existing = api
            .get_opt(&cfg.secret)
            .await
            .with_context(|| format!("reading Secret {namespace}/{}", cfg.secret))?;
        let current = existing.as_ref().and_then(Material::from_secret);
        let trusted = match &current {
            Some(m) => bundle_trusted(client, config, &m.signing_crt).await?,
            None => None,
        };
        let step = next_step(current.as_ref(), SystemTime::now(), cfg, trusted)?;
        let (next, why) = match step {
            Step::Keep | Step::WaitForBundle => {
                return current.ok_or_else(|| {
                    Error::Invalid("unreachable: no Secret and nothing to write".into())
                });
            }
            Step::Write(m, why) => (m, why),
        };
        let result = match existing {
            Some(mut s) => {
                s.data = Some(next.data());
                api.replace(&cfg.secret, &PostParams::default(), &s).await
            }
            None => {
                let s = Secret {
                    metadata: ObjectMeta {
                        name: Some(cfg.secret.clone()),
                        namespace: Some(namespace.to_owned()),
                        labels: Some(BTreeMap::from([(
                            crate::cluster::MANAGED_BY.0.to_owned(),
                            crate::cluster::MANAGED_BY.1.to_owned(),
                        )])),
                        ..ObjectMeta::default()
                    },
                    type_: Some("kubernetes.io/tls".into()),
                    data: Some(next.data()),
                    ..Secret::default()
                };
                api.create(&PostParams::default(), &s).await
            }
        };
        match result {
            Ok(_) => {
                tracing::info!(secret = %format!("{namespace}/{}", cfg.secret), step = why, "self-managed certificates");
                return Ok(next);
            }
            // Another replica wrote first: re-read and continue from its state.
            Err(kube::Error::Api(st)) if st.is_conflict() || st.is_already_exists() => continue,
            Err(e) => {
                return Err(e)
                    .with_context(|| format!("writing Secret {namespace}/{}", cfg.secret));
            }
        }
    }
    Err(Error::Invalid(format!(
        "Secret {namespace}/{} kept changing under us",
        cfg.secret
    )))
}

/// Keeps the served certificate equal to the Secret's and rotation moving:
/// `serve` is handed each new certificate (the binary swaps it into its TLS
/// acceptor); when it refuses one, the current one stays.
pub async fn run(
    client: Client,
    namespace: String,
    config: String,
    cfg: CertSettings,
    serve: impl Fn(&ServingCert) -> Result<(), BoxError>,
    metrics: Arc<Metrics>,
) {
    let mut served = String::new();
    loop {
        match reconcile(&client, &namespace, &config, &cfg).await {
            Ok(m) => {
                metrics.cluster("certificate_secret", "ok");
                if m.tls_crt != served {
                    let served_now = m
                        .serving_cert()
                        .map_err(BoxError::from)
                        .and_then(|c| serve(&c));
                    match served_now {
                        Ok(()) => {
                            tracing::info!(
                                not_after = m.not_after(),
                                "serving the Secret's certificate"
                            );
                            served = m.tls_crt;
                        }
                        Err(e) => {
                            tracing::error!(error = %e, "the Secret's certificate cannot be served; keeping the current one")
                        }
                    }
                }
            }
            Err(e) => {
                metrics.cluster("certificate_secret", "error");
                tracing::warn!(error = %e, "self-managed certificates: reconcile failed; retrying");
            }
        }
        tokio::time::sleep(cfg.interval).await;
    }
}

/// The Secret's certificate before serving starts: retried for a minute
/// (the API server may be coming up with the cluster), then a clear error.
pub async fn initial(
    client: &Client,
    namespace: &str,
    config: &str,
    cfg: &CertSettings,
) -> Result<Material> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let mut pause = Duration::from_millis(200);
    loop {
        match reconcile(client, namespace, config, cfg).await {
            Ok(m) => return Ok(m),
            Err(e) if tokio::time::Instant::now() + pause < deadline => {
                tracing::warn!(error = %e, "self-managed certificates: cannot read or create the Secret yet; retrying");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(5));
            }
            Err(e) => {
                return Err(Error::Invalid(format!(
                    "--self-managed-certs: no certificate after 60 s: {e}"
                )));
            }
        }
    }
}
