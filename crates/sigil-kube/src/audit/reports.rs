//! Writing the in-cluster audit's policy reports (`--policy-reports`): after
//! each audit the Lease holder puts one report per namespace in place (the
//! objects [`super::policyreport`] builds, merge-patched in place with
//! their results replaced whole, so results of deleted objects disappear)
//! and deletes its reports in namespaces with
//! nothing left to report. Which API: the one asked for, or (`auto`) the
//! first whose CRD is installed — wgpolicyk8s.io, then openreports.io —
//! looked up again before each write, so installing a CRD later needs no
//! restart; with neither, one log line says how to install one and the
//! audit goes on. A failed write is logged and counted, never fatal.

use kube::Client;
use kube::api::{Api as KubeApi, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, DynamicObject, GroupVersionKind};
use serde_json::Value;

use super::Report;
use super::policyreport::{Api, NAME, reports};
use crate::metrics::Metrics;

/// `--policy-reports`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// The first installed of wgpolicyk8s.io and openreports.io.
    Auto,
    /// This API (its CRDs must be installed).
    Only(Api),
    /// No reports.
    Off,
}

/// The label every report sigil writes carries (and stale ones are found by).
pub const MANAGED: &str = "app.kubernetes.io/managed-by=sigil";

fn group(api: Api) -> &'static str {
    match api {
        Api::Wgpolicyk8s => "wgpolicyk8s.io",
        Api::OpenReports => "openreports.io",
    }
}

fn resource(api: Api, cluster: bool) -> ApiResource {
    let (kind, cluster_kind) = api.kinds();
    let kind = if cluster { cluster_kind } else { kind };
    let version = api.api_version().rsplit('/').next().unwrap_or_default();
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(group(api), version, kind),
        &format!("{}s", kind.to_ascii_lowercase()),
    )
}

/// The CRD names of an API's two kinds.
pub fn crd_names(api: Api) -> [String; 2] {
    let (kind, cluster_kind) = api.kinds();
    [kind, cluster_kind].map(|k| format!("{}s.{}", k.to_ascii_lowercase(), group(api)))
}

/// Puts policy reports in place after each audit.
pub struct Writer {
    client: Client,
    mode: Mode,
    /// What the last write used (to log a change once).
    last: Option<Option<Api>>,
}

impl std::fmt::Debug for Writer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Writer").field("mode", &self.mode).finish()
    }
}

impl Writer {
    /// A writer in `mode`.
    pub fn new(client: Client, mode: Mode) -> Writer {
        Writer {
            client,
            mode,
            last: None,
        }
    }

    async fn installed(&self, api: Api) -> bool {
        let crds: KubeApi<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition> =
            KubeApi::all(self.client.clone());
        matches!(crds.get_opt(&crd_names(api)[0]).await, Ok(Some(_)))
    }

    async fn api(&mut self) -> Option<Api> {
        let chosen = match self.mode {
            Mode::Off => None,
            Mode::Only(api) => Some(api),
            Mode::Auto => {
                let mut found = None;
                for api in [Api::Wgpolicyk8s, Api::OpenReports] {
                    if self.installed(api).await {
                        found = Some(api);
                        break;
                    }
                }
                found
            }
        };
        if self.last != Some(chosen) {
            match (self.mode, chosen) {
                (Mode::Off, _) => {}
                (_, Some(api)) => tracing::info!(api = api.api_version(), "writing policy reports"),
                (_, None) => tracing::info!(
                    "no policy report CRD is installed (wgpolicyk8s.io or openreports.io): the audit writes no reports; install the PolicyReport CRDs (for example with Policy Reporter's or Kyverno's chart) or the OpenReports CRDs, or set --policy-reports off"
                ),
            }
            self.last = Some(chosen);
        }
        chosen
    }

    /// Writes `report`'s policy reports (see the module docs).
    pub async fn write(&mut self, report: &Report, metrics: &Metrics) {
        let Some(api) = self.api().await else {
            return;
        };
        let objects = reports(report, api);
        let mut written = std::collections::HashSet::new();
        for obj in objects {
            let ns = obj["metadata"]["namespace"].as_str().map(str::to_owned);
            written.insert(ns.clone().unwrap_or_default());
            let result = self.put(api, ns.as_deref(), obj).await;
            match result {
                Ok(r) => metrics.policy_report(r),
                Err(e) => {
                    metrics.policy_report("error");
                    tracing::warn!(namespace = ns.as_deref().unwrap_or("(cluster)"), error = %e, "writing a policy report failed");
                }
            }
        }
        // Reports in namespaces with nothing left to report.
        for cluster in [false, true] {
            let all: KubeApi<DynamicObject> =
                KubeApi::all_with(self.client.clone(), &resource(api, cluster));
            let Ok(list) = all.list(&ListParams::default().labels(MANAGED)).await else {
                continue;
            };
            for stale in list.items.iter().filter(|o| {
                o.metadata.name.as_deref() == Some(NAME)
                    && !written.contains(o.metadata.namespace.as_deref().unwrap_or_default())
            }) {
                let scoped = self.scoped(api, stale.metadata.namespace.as_deref());
                match scoped.delete(NAME, &DeleteParams::default()).await {
                    Ok(_) => metrics.policy_report("deleted"),
                    Err(e) => {
                        metrics.policy_report("error");
                        tracing::warn!(error = %e, "deleting a stale policy report failed");
                    }
                }
            }
        }
    }

    fn scoped(&self, api: Api, ns: Option<&str>) -> KubeApi<DynamicObject> {
        match ns {
            Some(ns) => KubeApi::namespaced_with(self.client.clone(), ns, &resource(api, false)),
            None => KubeApi::all_with(self.client.clone(), &resource(api, true)),
        }
    }

    /// Updates one report in place by a JSON merge patch (its `results`
    /// list is replaced whole, a note no longer true is removed), or
    /// creates it when it is not there yet.
    async fn put(
        &self,
        api: Api,
        ns: Option<&str>,
        obj: Value,
    ) -> Result<&'static str, kube::Error> {
        let scoped = self.scoped(api, ns);
        let mut patch = obj.clone();
        if patch["metadata"]["annotations"][super::policyreport::TRUNCATED].is_null() {
            // Merge patch keeps what it is not told: say the note is gone.
            patch["metadata"]["annotations"] =
                serde_json::json!({ super::policyreport::TRUNCATED: null });
        }
        match scoped
            .patch(NAME, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => Ok("updated"),
            Err(kube::Error::Api(e)) if e.code == 404 => {
                let fresh: DynamicObject =
                    serde_json::from_value(obj).map_err(kube::Error::SerdeError)?;
                match scoped.create(&PostParams::default(), &fresh).await {
                    Ok(_) => Ok("created"),
                    // Created meanwhile (another writer): the next audit patches it.
                    Err(kube::Error::Api(e)) if e.code == 409 => Ok("updated"),
                    Err(e) => Err(e),
                }
            }
            Err(e) => Err(e),
        }
    }
}
