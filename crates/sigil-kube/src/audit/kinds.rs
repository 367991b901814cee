//! The kinds an audit lists: Pods and every built-in workload kind whose
//! Pod template the walker reads. `--kinds` names them as kubectl does
//! (plural, singular, kind or short name, case-insensitive).

use kube::discovery::ApiResource;

use crate::error::{Error, Result};

/// One audited kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Kind {
    /// `Deployment`.
    pub kind: &'static str,
    /// `deployments` (what `--kinds` and RBAC say).
    pub plural: &'static str,
    /// `apps` (empty for core).
    pub group: &'static str,
    /// `v1`.
    pub version: &'static str,
    /// kubectl's short name.
    pub short: &'static str,
}

/// Every kind sigil audits, Pods first (they are what runs).
pub const ALL: &[Kind] = &[
    Kind {
        kind: "Pod",
        plural: "pods",
        group: "",
        version: "v1",
        short: "po",
    },
    Kind {
        kind: "Deployment",
        plural: "deployments",
        group: "apps",
        version: "v1",
        short: "deploy",
    },
    Kind {
        kind: "StatefulSet",
        plural: "statefulsets",
        group: "apps",
        version: "v1",
        short: "sts",
    },
    Kind {
        kind: "DaemonSet",
        plural: "daemonsets",
        group: "apps",
        version: "v1",
        short: "ds",
    },
    Kind {
        kind: "ReplicaSet",
        plural: "replicasets",
        group: "apps",
        version: "v1",
        short: "rs",
    },
    Kind {
        kind: "Job",
        plural: "jobs",
        group: "batch",
        version: "v1",
        short: "job",
    },
    Kind {
        kind: "CronJob",
        plural: "cronjobs",
        group: "batch",
        version: "v1",
        short: "cj",
    },
    Kind {
        kind: "ReplicationController",
        plural: "replicationcontrollers",
        group: "",
        version: "v1",
        short: "rc",
    },
];

impl Kind {
    /// What kube-rs needs to list it as a dynamic object.
    pub fn api_resource(&self) -> ApiResource {
        ApiResource {
            group: self.group.to_owned(),
            version: self.version.to_owned(),
            api_version: self.api_version(),
            kind: self.kind.to_owned(),
            plural: self.plural.to_owned(),
        }
    }

    /// `apiVersion` (`v1`, `apps/v1`): what each audited object's report
    /// entry names, without the rest of [`Kind::api_resource`].
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.to_owned()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    fn named(&self, s: &str) -> bool {
        let s = s.trim().to_ascii_lowercase();
        let singular = self.plural.trim_end_matches('s');
        s == self.plural || s == singular || s == self.short || s == self.kind.to_ascii_lowercase()
    }
}

/// Reads `--kinds` (comma-separated); empty means all.
pub fn parse(list: &[String]) -> Result<Vec<Kind>> {
    if list.is_empty() {
        return Ok(ALL.to_vec());
    }
    let mut out: Vec<Kind> = Vec::new();
    for name in list
        .iter()
        .flat_map(|s| s.split(','))
        .filter(|s| !s.trim().is_empty())
    {
        let k = ALL.iter().find(|k| k.named(name)).ok_or_else(|| {
            Error::Invalid(format!(
                "--kinds: {name:?} is not a kind sigil audits (one of: {})",
                ALL.iter().map(|k| k.plural).collect::<Vec<_>>().join(", ")
            ))
        })?;
        if !out.contains(k) {
            out.push(*k);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_are_named_as_kubectl_names_them() {
        let got =
            parse(&["pods,Deployment".into(), "sts".into(), "cronjob".into()]).expect("kinds");
        let names: Vec<&str> = got.iter().map(|k| k.plural).collect();
        assert_eq!(names, ["pods", "deployments", "statefulsets", "cronjobs"]);
        assert_eq!(parse(&[]).expect("all").len(), ALL.len());
        assert!(parse(&["services".into()]).is_err());
        assert_eq!(ALL[4].api_resource().api_version, "apps/v1");
        assert_eq!(ALL[0].api_resource().api_version, "v1");
        assert_eq!(ALL[4].api_version(), "apps/v1");
    }
}
