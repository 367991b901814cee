//! `sigil crds`: the ClusterImagePolicy and ImagePolicy CRDs, generated from
//! the Rust types in `sigil::crd`, as YAML on stdout (what
//! `deploy/kustomize/base/crds/policies.yaml` and the chart's
//! `deploy/helm/sigil/crds/policies.yaml` hold).

use std::process::ExitCode;

use anyhow::{Context as _, Result};

/// Runs `sigil crds`.
pub fn run() -> Result<ExitCode> {
    super::write_out(&sigil_kube::crd::yaml().context("rendering the CRDs")?)?;
    Ok(ExitCode::SUCCESS)
}
