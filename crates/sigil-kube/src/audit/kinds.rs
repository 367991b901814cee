//! The kinds an audit lists: Pods, every built-in workload kind whose Pod
//! template the walker reads, and the custom resources the policy's image
//! extractors name (listed when the API server serves them, at the version
//! discovery recommends). `--kinds` names them as kubectl does (plural,
//! singular, kind or short name, case-insensitive).

use std::borrow::Cow;

use kube::discovery::ApiResource;
use sigil_core::walker::Extractors;

use crate::error::{Error, Result};

/// One audited kind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Kind {
    /// `Deployment`.
    pub kind: Cow<'static, str>,
    /// `deployments` (what `--kinds` and RBAC say).
    pub plural: Cow<'static, str>,
    /// `apps` (empty for core).
    pub group: Cow<'static, str>,
    /// `v1`; empty for a custom resource listed at the version discovery
    /// recommends.
    pub version: Cow<'static, str>,
    /// kubectl's short name.
    pub short: Cow<'static, str>,
    /// Listed only if the API server serves it (a custom resource the
    /// audit was not asked for by name: its CRD may not be installed).
    pub optional: bool,
}

/// Every kind sigil audits, Pods first (they are what runs).
pub const ALL: &[Kind] = &[
    Kind {
        kind: Cow::Borrowed("Pod"),
        plural: Cow::Borrowed("pods"),
        group: Cow::Borrowed(""),
        version: Cow::Borrowed("v1"),
        short: Cow::Borrowed("po"),
        optional: false,
    },
    Kind {
        kind: Cow::Borrowed("Deployment"),
        plural: Cow::Borrowed("deployments"),
        group: Cow::Borrowed("apps"),
        version: Cow::Borrowed("v1"),
        short: Cow::Borrowed("deploy"),
        optional: false,
    },
    Kind {
        kind: Cow::Borrowed("StatefulSet"),
        plural: Cow::Borrowed("statefulsets"),
        group: Cow::Borrowed("apps"),
        version: Cow::Borrowed("v1"),
        short: Cow::Borrowed("sts"),
        optional: false,
    },
    Kind {
        kind: Cow::Borrowed("DaemonSet"),
        plural: Cow::Borrowed("daemonsets"),
        group: Cow::Borrowed("apps"),
        version: Cow::Borrowed("v1"),
        short: Cow::Borrowed("ds"),
        optional: false,
    },
    Kind {
        kind: Cow::Borrowed("ReplicaSet"),
        plural: Cow::Borrowed("replicasets"),
        group: Cow::Borrowed("apps"),
        version: Cow::Borrowed("v1"),
        short: Cow::Borrowed("rs"),
        optional: false,
    },
    Kind {
        kind: Cow::Borrowed("Job"),
        plural: Cow::Borrowed("jobs"),
        group: Cow::Borrowed("batch"),
        version: Cow::Borrowed("v1"),
        short: Cow::Borrowed("job"),
        optional: false,
    },
    Kind {
        kind: Cow::Borrowed("CronJob"),
        plural: Cow::Borrowed("cronjobs"),
        group: Cow::Borrowed("batch"),
        version: Cow::Borrowed("v1"),
        short: Cow::Borrowed("cj"),
        optional: false,
    },
    Kind {
        kind: Cow::Borrowed("ReplicationController"),
        plural: Cow::Borrowed("replicationcontrollers"),
        group: Cow::Borrowed(""),
        version: Cow::Borrowed("v1"),
        short: Cow::Borrowed("rc"),
        optional: false,
    },
];

impl Kind {
    /// A custom resource an image extractor names.
    pub fn custom(e: &sigil_core::walker::Extractor, optional: bool) -> Kind {
        Kind {
            kind: Cow::Owned(e.kind.clone()),
            plural: Cow::Owned(e.resource.clone()),
            group: Cow::Owned(e.group.clone()),
            version: Cow::Owned(e.version.clone().unwrap_or_default()),
            short: Cow::Borrowed(""),
            optional,
        }
    }

    /// What kube-rs needs to list it as a dynamic object.
    pub fn api_resource(&self) -> ApiResource {
        ApiResource {
            group: self.group.to_string(),
            version: self.version.to_string(),
            api_version: self.api_version(),
            kind: self.kind.to_string(),
            plural: self.plural.to_string(),
        }
    }

    /// `apiVersion` (`v1`, `apps/v1`): what each audited object's report
    /// entry names, without the rest of [`Kind::api_resource`].
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.to_string()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    fn named(&self, s: &str) -> bool {
        let s = s.trim().to_ascii_lowercase();
        let singular = self.plural.trim_end_matches('s');
        s == self.plural
            || s == singular
            || (!self.short.is_empty() && s == self.short)
            || s == self.kind.to_ascii_lowercase()
    }
}

/// Every kind sigil audits under `extractors`: the built-in ones, then
/// each custom resource with at least one image path (optional: listed
/// when served).
pub fn all(extractors: &Extractors) -> Vec<Kind> {
    let mut out = ALL.to_vec();
    out.extend(
        extractors
            .list()
            .iter()
            .filter(|e| !e.paths.is_empty())
            .map(|e| Kind::custom(e, true)),
    );
    out
}

/// Reads `--kinds` (comma-separated); empty means [`all`]. A custom kind
/// named here must be served.
pub fn parse(list: &[String], extractors: &Extractors) -> Result<Vec<Kind>> {
    let every = all(extractors);
    if list.is_empty() {
        return Ok(every);
    }
    let mut out: Vec<Kind> = Vec::new();
    for name in list
        .iter()
        .flat_map(|s| s.split(','))
        .filter(|s| !s.trim().is_empty())
    {
        let k = every.iter().find(|k| k.named(name)).ok_or_else(|| {
            Error::Invalid(format!(
                "--kinds: {name:?} is not a kind sigil audits (one of: {})",
                every
                    .iter()
                    .map(|k| k.plural.as_ref())
                    .collect::<Vec<_>>()
                    .join(", ")
            ))
        })?;
        let k = Kind {
            optional: false,
            ..k.clone()
        };
        if !out.contains(&k) {
            out.push(k);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_are_named_as_kubectl_names_them() {
        let ex = Extractors::defaults();
        let got = parse(
            &[
                "pods,Deployment".into(),
                "sts".into(),
                "cronjob".into(),
                "Workflow".into(),
            ],
            &ex,
        )
        .expect("kinds");
        let names: Vec<&str> = got.iter().map(|k| k.plural.as_ref()).collect();
        assert_eq!(
            names,
            [
                "pods",
                "deployments",
                "statefulsets",
                "cronjobs",
                "workflows"
            ]
        );
        assert!(!got[4].optional && got[4].version.is_empty());
        let every = parse(&[], &ex).expect("all");
        assert!(every.len() > ALL.len() && every[ALL.len()..].iter().all(|k| k.optional));
        assert!(parse(&["services".into()], &ex).is_err());
        assert_eq!(ALL[4].api_resource().api_version, "apps/v1");
        assert_eq!(ALL[0].api_resource().api_version, "v1");
        assert_eq!(ALL[4].api_version(), "apps/v1");
    }
}
