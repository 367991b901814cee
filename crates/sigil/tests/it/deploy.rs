//! The deploy manifests as `kubectl kustomize` renders them: every object
//! decodes into its k8s-openapi type without losing a field (a misspelled
//! field would be dropped and fail the round trip), and carries the settings
//! that keep sigil from ever being why a cluster breaks.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, PodSpec, Service, ServiceAccount};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use serde_json::{Value, json};

use crate::support::sigil::bin;

fn kubectl() -> PathBuf {
    ["/usr/bin/kubectl", "/usr/lib/google-cloud-sdk/bin/kubectl"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
        .or_else(|| crate::support::registry::which("kubectl"))
        .expect("kubectl not found: scripts/test.sh installs it (package kubectl)")
}

fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/kustomize")
}

/// Renders a kustomization and returns its objects.
pub(crate) fn render(dir: &str) -> Vec<Value> {
    let out = crate::support::sigil::run_ok(
        Command::new(kubectl())
            .arg("kustomize")
            .arg(deploy_dir().join(dir)),
    );
    objects(&String::from_utf8(out.stdout).unwrap())
}

/// The objects of a YAML stream (rendered manifests, a fixture, a
/// command's output).
pub(crate) fn objects(text: &str) -> Vec<Value> {
    sigil_core::manifest::parse_stream(text)
        .unwrap()
        .into_iter()
        .map(|d| d.to_value())
        .collect()
}

/// Decodes `v` as `T` and requires re-encoding to give back `v` exactly.
fn typed<T: serde::de::DeserializeOwned + serde::Serialize>(v: &Value) -> T {
    let t: T = serde_json::from_value(v.clone()).unwrap_or_else(|e| {
        panic!(
            "{} {} does not decode: {e}",
            v["kind"], v["metadata"]["name"]
        )
    });
    let back = serde_json::to_value(&t).unwrap();
    assert_eq!(
        &back, v,
        "{} {} lost or changed fields when decoded (misspelled or misplaced field?)",
        v["kind"], v["metadata"]["name"]
    );
    t
}

/// Every object decodes; returns them by kind/name.
fn check_all(objects: &[Value]) -> BTreeMap<String, Value> {
    let mut by = BTreeMap::new();
    for o in objects {
        let kind = o["kind"].as_str().unwrap();
        let name = o["metadata"]["name"].as_str().unwrap();
        match kind {
            "Namespace" => drop(typed::<Namespace>(o)),
            "ServiceAccount" => drop(typed::<ServiceAccount>(o)),
            "ClusterRole" => drop(typed::<ClusterRole>(o)),
            "ClusterRoleBinding" => drop(typed::<ClusterRoleBinding>(o)),
            "Role" => drop(typed::<Role>(o)),
            "RoleBinding" => drop(typed::<RoleBinding>(o)),
            "ConfigMap" => drop(typed::<ConfigMap>(o)),
            // Only the empty Secret --self-managed-certs fills in (shipped so
            // sigil needs no create on Secrets): it carries no data.
            "Secret" => {
                let s: k8s_openapi::api::core::v1::Secret = typed(o);
                assert_eq!(name, "sigil-tls", "{kind} {name}");
                assert!(s.data.is_none() && s.string_data.is_none(), "{name} ships data");
            }
            "Service" => drop(typed::<Service>(o)),
            "Deployment" => drop(typed::<Deployment>(o)),
            "PodDisruptionBudget" => drop(typed::<PodDisruptionBudget>(o)),
            "CustomResourceDefinition" => drop(typed::<
                k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
            >(o)),
            "MutatingWebhookConfiguration" => drop(typed::<
                k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration,
            >(o)),
            "Issuer" | "Certificate" => {
                assert_eq!(o["apiVersion"], "cert-manager.io/v1", "{kind} {name}");
                assert!(o["spec"].is_object(), "{kind} {name} has no spec");
            }
            other => panic!("unexpected kind {other} in the deploy manifests"),
        }
        if !matches!(
            kind,
            "Namespace" | "CustomResourceDefinition" | "MutatingWebhookConfiguration"
        ) && !kind.starts_with("Cluster")
        {
            assert_eq!(o["metadata"]["namespace"], "sigil-system", "{kind} {name}");
        }
        by.insert(format!("{kind}/{name}"), o.clone());
    }
    by
}

pub(crate) fn env_of(d: &Value) -> BTreeMap<String, String> {
    d["spec"]["template"]["spec"]["containers"][0]["env"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| {
            Some((
                e["name"].as_str()?.to_owned(),
                e["value"].as_str()?.to_owned(),
            ))
        })
        .collect()
}

fn seconds(s: &str) -> i64 {
    s.strip_suffix('s')
        .and_then(|n| n.parse().ok())
        .expect("a duration like 10s")
}

/// Pod Security "restricted" as the admission plugin checks it.
fn assert_restricted(pod: &PodSpec) {
    let psc = pod.security_context.as_ref().expect("pod securityContext");
    assert_eq!(pod.host_network, None);
    assert_eq!(pod.host_pid, None);
    assert_eq!(pod.host_ipc, None);
    for v in pod.volumes.iter().flatten() {
        assert!(
            v.config_map.is_some()
                || v.secret.is_some()
                || v.empty_dir.is_some()
                || v.projected.is_some()
                || v.downward_api.is_some(),
            "volume {} is not allowed under restricted",
            v.name
        );
    }
    for c in &pod.containers {
        let sc = c
            .security_context
            .as_ref()
            .expect("container securityContext");
        assert_eq!(sc.allow_privilege_escalation, Some(false), "{}", c.name);
        assert_eq!(sc.read_only_root_filesystem, Some(true), "{}", c.name);
        assert_eq!(
            sc.capabilities.as_ref().and_then(|c| c.drop.clone()),
            Some(vec!["ALL".to_owned()])
        );
        assert!(sc.capabilities.as_ref().unwrap().add.is_none());
        assert!(sc.run_as_non_root == Some(true) || psc.run_as_non_root == Some(true));
        let seccomp = sc
            .seccomp_profile
            .as_ref()
            .or(psc.seccomp_profile.as_ref())
            .expect("seccompProfile");
        assert_eq!(seccomp.type_, "RuntimeDefault");
        assert_ne!(sc.privileged, Some(true));
    }
}

/// The base: everything the issue lists.
#[test]
fn base_renders_and_carries_the_safe_settings() {
    let by = check_all(&render("base"));
    let ns = &by["Namespace/sigil-system"];
    assert_eq!(
        ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"],
        "restricted"
    );

    let d: Deployment = typed(&by["Deployment/sigil"]);
    let spec = d.spec.as_ref().unwrap();
    assert_eq!(spec.replicas, Some(3));
    let pod = spec.template.spec.as_ref().unwrap();
    assert_eq!(
        pod.priority_class_name.as_deref(),
        Some("system-cluster-critical")
    );
    let keys: Vec<&str> = pod
        .topology_spread_constraints
        .iter()
        .flatten()
        .map(|t| t.topology_key.as_str())
        .collect();
    assert!(
        keys.contains(&"topology.kubernetes.io/zone") && keys.contains(&"kubernetes.io/hostname")
    );
    assert_restricted(pod);
    let c = &pod.containers[0];
    let probe_path = |p: &Option<k8s_openapi::api::core::v1::Probe>| {
        p.as_ref()
            .and_then(|p| p.http_get.as_ref())
            .and_then(|h| h.path.clone())
    };
    assert_eq!(probe_path(&c.readiness_probe).as_deref(), Some("/readyz"));
    assert_eq!(probe_path(&c.liveness_probe).as_deref(), Some("/livez"));
    let requests = c
        .resources
        .as_ref()
        .and_then(|r| r.requests.as_ref())
        .expect("requests");
    assert!(requests.contains_key("cpu") && requests.contains_key("memory"));
    let args = c.args.clone().unwrap();
    let delay = args
        .iter()
        .find_map(|a| a.strip_prefix("--shutdown-delay="))
        .expect("--shutdown-delay is set explicitly");
    let grace = pod.termination_grace_period_seconds.unwrap();
    assert!(
        grace > seconds(delay) + 10,
        "grace {grace}s must exceed the shutdown delay {delay} plus the webhook timeout"
    );

    let raw = &by["Deployment/sigil"];
    let env = env_of(raw);
    assert_eq!(env["SIGIL_REGISTER"], "false");
    assert_eq!(env["SIGIL_FAILURE_POLICY"], "Fail");
    assert_eq!(env["SIGIL_SELF_MANAGED_CERTS"], "true");

    // Every flag and variable the Deployment sets is one `sigil serve` knows.
    let help = Command::new(bin())
        .args(["serve", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8(help.stdout).unwrap();
    for a in args.iter().skip(1) {
        let flag = a.split('=').next().unwrap();
        assert!(help.contains(flag), "sigil serve has no flag {flag}");
    }
    for k in env
        .keys()
        .filter(|k| k.starts_with("SIGIL_") && *k != "SIGIL_LOG")
    {
        assert!(
            help.contains(&format!("env: {k}=")),
            "sigil serve reads no {k}"
        );
    }

    // The policy in the ConfigMap loads, at the path the flag names.
    let policy_arg = args
        .iter()
        .find_map(|a| a.strip_prefix("--policy="))
        .unwrap();
    let mount = c
        .volume_mounts
        .iter()
        .flatten()
        .find(|m| policy_arg.starts_with(&m.mount_path))
        .expect("the policy path is mounted");
    let vol = pod
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name == mount.name)
        .unwrap();
    let cm_name = vol.config_map.as_ref().unwrap().name.clone();
    let cm = &by[&format!("ConfigMap/{cm_name}")];
    let key = Path::new(policy_arg).file_name().unwrap().to_str().unwrap();
    let policy = sigil_core::Policy::from_yaml(cm["data"][key].as_str().unwrap()).unwrap();
    assert!(policy.is_exempt("kube-system") && policy.is_exempt("sigil-system"));

    // Service and PDB select exactly these pods; the Service targets the webhook port.
    let pod_labels = raw["spec"]["template"]["metadata"]["labels"].clone();
    for sel in [
        &by["Service/sigil"]["spec"]["selector"],
        &by["PodDisruptionBudget/sigil"]["spec"]["selector"]["matchLabels"],
    ] {
        for (k, v) in sel.as_object().unwrap() {
            assert_eq!(&pod_labels[k], v, "selector {k}");
        }
    }
    let svc = &by["Service/sigil"]["spec"]["ports"][0];
    assert_eq!(svc["port"], 443);
    let port_names: Vec<&str> = c
        .ports
        .iter()
        .flatten()
        .filter_map(|p| p.name.as_deref())
        .collect();
    assert!(port_names.contains(&svc["targetPort"].as_str().unwrap()));
    assert_eq!(by["PodDisruptionBudget/sigil"]["spec"]["maxUnavailable"], 1);

    // Least privilege: no wildcards, no delete, names pinned where RBAC allows.
    for key in ["ClusterRole/sigil", "Role/sigil"] {
        for rule in by[key]["rules"].as_array().unwrap() {
            for field in ["verbs", "resources", "apiGroups"] {
                assert!(
                    !rule[field].to_string().contains('*'),
                    "{key} has a wildcard {field}"
                );
            }
            for verb in rule["verbs"].as_array().unwrap() {
                let verb = verb.as_str().unwrap();
                assert!(
                    ["get", "create", "update"].contains(&verb),
                    "{key} grants {verb}"
                );
                if verb != "create" {
                    assert!(
                        rule["resourceNames"].is_array(),
                        "{key}: {verb} is not limited by name"
                    );
                }
            }
        }
    }
    let cr = by["ClusterRole/sigil"].to_string();
    assert!(cr.contains("mutatingwebhookconfigurations") && cr.contains("\"sigil\""));
    assert!(by["Role/sigil"].to_string().contains("sigil-tls"));
    for b in ["ClusterRoleBinding/sigil", "RoleBinding/sigil"] {
        let s = &by[b]["subjects"][0];
        assert_eq!(
            (s["name"].as_str(), s["namespace"].as_str()),
            (Some("sigil"), Some("sigil-system"))
        );
    }
    assert_eq!(pod.service_account_name.as_deref(), Some("sigil"));
    // --pull-secrets is off: reading workloads' pull secrets means reading
    // Secrets cluster-wide (components/pull-secrets turns it on).
    assert!(!by.contains_key("ClusterRole/sigil-pull-secrets"));
    assert_eq!(env["SIGIL_PULL_SECRETS"], "false");
    // The self-managed certificates' Secret is shipped: no create on Secrets.
    assert!(by.contains_key("Secret/sigil-tls"));
    assert!(
        !by["Role/sigil"]["rules"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["resources"] == json!(["secrets"]) && r["resourceNames"].is_null()),
        "a Secret grant not limited by name"
    );
    // --audit-interval: list the audited kinds, write Events, nothing more.
    assert_eq!(env["SIGIL_AUDIT_INTERVAL"], "10m");
    let audit = &by["ClusterRole/sigil-audit"]["rules"];
    let mut listed: Vec<String> = Vec::new();
    for rule in audit.as_array().unwrap() {
        let verbs = rule["verbs"].clone();
        if rule["apiGroups"] == json!(["events.k8s.io"]) {
            assert_eq!(verbs, json!(["create", "patch"]));
            assert_eq!(rule["resources"], json!(["events"]));
        } else {
            assert_eq!(verbs, json!(["list"]), "{rule}");
            listed.extend(
                rule["resources"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|r| r.as_str().unwrap().to_owned()),
            );
        }
    }
    listed.sort();
    let mut want: Vec<String> =
        sigil_kube::audit::kinds::all(&sigil_core::walker::Extractors::defaults())
            .iter()
            .map(|k| k.plural.to_string())
            .collect();
    want.sort();
    assert_eq!(listed, want, "RBAC lists exactly the audited kinds");
    assert!(by["Role/sigil"].to_string().contains("sigil-audit"));
    // --watch-policies: read the policy kinds, patch their status, nothing more.
    assert_eq!(env["SIGIL_WATCH_POLICIES"], "true");
    let pol = by["ClusterRole/sigil-policies"]["rules"].to_string();
    assert!(pol.contains("\"list\",\"watch\"") && pol.contains("clusterimagepolicies/status"));
    assert!(
        !pol.contains("\"update\"") && !pol.contains("\"delete\""),
        "{pol}"
    );
    assert!(by["Role/sigil"].to_string().contains("sigil-policy-status"));
    assert_eq!(
        by["ClusterRoleBinding/sigil-audit"]["subjects"][0]["name"],
        "sigil"
    );
}

#[test]
fn fail_open_overlay_changes_only_the_failure_policy() {
    let base = check_all(&render("base"));
    let open = check_all(&render("overlays/fail-open"));
    assert_eq!(
        base.keys().collect::<Vec<_>>(),
        open.keys().collect::<Vec<_>>()
    );
    for (k, v) in &base {
        if k == "MutatingWebhookConfiguration/sigil" {
            let mut v = v.clone();
            v["webhooks"][0]["failurePolicy"] = json!("Ignore");
            assert_eq!(v, open[k], "{k} differs beyond its failurePolicy");
        } else if k != "Deployment/sigil" {
            assert_eq!(v, &open[k], "{k} differs");
        }
    }
    let mut env_base = env_of(&base["Deployment/sigil"]);
    let env_open = env_of(&open["Deployment/sigil"]);
    assert_eq!(env_open["SIGIL_FAILURE_POLICY"], "Ignore");
    env_base.insert("SIGIL_FAILURE_POLICY".into(), "Ignore".into());
    assert_eq!(env_base, env_open);
}

#[test]
fn cert_manager_overlay_uses_its_certificate_and_drops_secret_rights() {
    let by = check_all(&render("overlays/cert-manager"));
    let raw = &by["Deployment/sigil"];
    let env = env_of(raw);
    assert_eq!(env["SIGIL_SELF_MANAGED_CERTS"], "false");
    let d: Deployment = typed(raw);
    let pod = d.spec.unwrap().template.spec.unwrap();
    assert_restricted(&pod);
    let mount = pod.containers[0]
        .volume_mounts
        .iter()
        .flatten()
        .find(|m| env["SIGIL_TLS_CERT"].starts_with(&m.mount_path))
        .expect("the certificate path is mounted");
    let vol = pod
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name == mount.name)
        .unwrap();
    let secret = vol.secret.as_ref().unwrap().secret_name.clone().unwrap();
    let cert = by
        .values()
        .find(|o| o["kind"] == "Certificate" && o["spec"]["secretName"] == secret.as_str())
        .expect("a Certificate writes the mounted Secret");
    let dns = cert["spec"]["dnsNames"].to_string();
    assert!(dns.contains("sigil.sigil-system.svc"));
    let issuer = cert["spec"]["issuerRef"]["name"].as_str().unwrap();
    assert!(by.contains_key(&format!("Issuer/{issuer}")));
    for p in ["SIGIL_TLS_CERT", "SIGIL_TLS_KEY", "SIGIL_CA_BUNDLE"] {
        assert!(env[p].starts_with(&mount.mount_path), "{p}");
    }
    assert!(!by["Role/sigil"].to_string().contains("secrets"));
}

/// The checked-in CRDs are exactly what `sigil crds` generates from the Rust
/// types; the namespaced kind refuses loosening fields by CEL and aggregates
/// to admin/edit/view; the cluster kind aggregates to nobody.
#[test]
fn checked_in_crds_are_the_generated_ones_and_rbac_aggregates_only_the_namespaced_kind() {
    let checked_in = std::fs::read_to_string(deploy_dir().join("base/crds/policies.yaml")).unwrap();
    assert_eq!(
        checked_in,
        sigil_kube::crd::yaml().unwrap(),
        "deploy/kustomize/base/crds/policies.yaml is stale: run `sigil crds > deploy/kustomize/base/crds/policies.yaml`"
    );
    let by = check_all(&render("base"));
    let ns = &by["CustomResourceDefinition/imagepolicies.sigil.dev"];
    assert_eq!(ns["spec"]["scope"], "Namespaced");
    let v = &ns["spec"]["versions"][0];
    assert_eq!(v["subresources"]["status"], json!({}));
    let cols: Vec<&str> = v["additionalPrinterColumns"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(cols, ["Ready", "Rules", "Age"]);
    let rules = v["schema"]["openAPIV3Schema"]["properties"]["spec"]["x-kubernetes-validations"]
        .to_string();
    for field in ["mirrors", "registries", "pin", "exemptNamespaces"] {
        assert!(
            rules.contains(&format!("!has(self.{field})")),
            "{field}: {rules}"
        );
    }
    assert_eq!(
        by["CustomResourceDefinition/clusterimagepolicies.sigil.dev"]["spec"]["scope"],
        "Cluster"
    );
    let edit = &by["ClusterRole/sigil-imagepolicies-edit"];
    assert_eq!(
        edit["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-edit"],
        "true"
    );
    assert_eq!(edit["rules"][0]["resources"], json!(["imagepolicies"]));
    // Exceptions waive the platform's rules: granting them is on purpose.
    let exceptions = &by["ClusterRole/sigil-exceptions-edit"];
    assert_eq!(
        exceptions["rules"][0]["resources"],
        json!(["imagepolicyexceptions"])
    );
    assert!(
        !exceptions["metadata"]["labels"]
            .to_string()
            .contains("aggregate-to"),
        "{exceptions}"
    );
    let ipe = &by["CustomResourceDefinition/imagepolicyexceptions.sigil.dev"];
    assert_eq!(ipe["spec"]["scope"], "Namespaced");
    let rules = ipe["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
        ["x-kubernetes-validations"]
        .to_string();
    assert!(rules.contains("self.images.size() > 0"), "{rules}");
    for (key, role) in &by {
        if key.starts_with("ClusterRole/")
            && role["metadata"]["labels"]
                .to_string()
                .contains("aggregate-to")
        {
            assert!(
                !role["rules"].to_string().contains("clusterimagepolicies"),
                "{key} hands ClusterImagePolicy to namespace users"
            );
            for rule in role["rules"].as_array().unwrap() {
                let writes = rule["verbs"].to_string().contains("create");
                assert!(
                    !(writes
                        && rule["resources"]
                            .to_string()
                            .contains("imagepolicyexceptions")),
                    "{key} lets namespace users create ImagePolicyExceptions"
                );
            }
        }
    }
}

/// The image ships a stripped binary: the Dockerfile builds with
/// scripts/dist.sh, which uses a profile that strips symbols and debug info
/// (the release profile keeps line tables for profiles, 111 MiB against
/// 23.5 MiB stripped), and copies that profile's output. That profile is
/// also the one optimized across crates (fat LTO, one codegen unit) whose
/// figures docs/benchmarks.md gives; its link packs relative relocations
/// and lays out the start's code from crates/sigil/startup.order.
#[test]
fn the_image_ships_a_stripped_binary() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let dockerfile = std::fs::read_to_string(root.join("Dockerfile")).unwrap();
    assert!(
        dockerfile.lines().any(|l| l
            .trim_start()
            .starts_with("CARGO_BUILD_JOBS=2 scripts/dist.sh")),
        "the Dockerfile builds sigil with scripts/dist.sh"
    );
    let script = std::fs::read_to_string(root.join("scripts/dist.sh")).unwrap();
    let build = script
        .lines()
        .find(|l| !l.trim_start().starts_with('#') && l.contains("cargo rustc"))
        .expect("scripts/dist.sh builds sigil");
    let profile = build
        .split_whitespace()
        .skip_while(|w| *w != "--profile")
        .nth(1)
        .expect("scripts/dist.sh names a Cargo profile (--profile dist)");
    assert!(
        dockerfile.contains(&format!("target/{profile}/sigil")),
        "the Dockerfile copies another profile's binary"
    );
    let cargo: toml_like::Table =
        toml_like::parse(&std::fs::read_to_string(root.join("Cargo.toml")).unwrap());
    let p = cargo
        .get(&format!("profile.{profile}"))
        .unwrap_or_else(|| panic!("no [profile.{profile}] in Cargo.toml"));
    assert_eq!(
        p.get("strip").map(String::as_str),
        Some("\"symbols\""),
        "{p:?}"
    );
    assert_eq!(p.get("debug").map(String::as_str), Some("false"), "{p:?}");
    assert_eq!(p.get("lto").map(String::as_str), Some("\"fat\""), "{p:?}");
    assert_eq!(
        p.get("codegen-units").map(String::as_str),
        Some("1"),
        "{p:?}"
    );
    // Packed relative relocations (glibc 2.36's DT_RELR), which the
    // runtime base must load: Debian 12's glibc is 2.36.
    assert!(
        script.contains("link-arg=-Wl,-z,pack-relative-relocs"),
        "the image's binary is linked with packed relative relocations"
    );
    let runtime = dockerfile
        .lines()
        .rfind(|l| l.starts_with("FROM "))
        .expect("a runtime stage");
    assert!(
        runtime.contains("-debian12") || runtime.contains("-debian13"),
        "{runtime}: DT_RELR needs glibc 2.36 or later"
    );
    // The start's code laid out together: the order file the link names
    // exists and lists symbols, one per line (the Dockerfile copies the
    // whole tree; .dockerignore must not leave it out).
    assert!(script.contains("--symbol-ordering-file=$order"));
    assert!(script.contains("sha256sum crates/sigil/startup.order"));
    let order = std::fs::read_to_string(root.join("crates/sigil/startup.order")).unwrap();
    let symbols: Vec<&str> = order.lines().collect();
    assert!(symbols.len() > 1000, "{} symbols", symbols.len());
    assert!(
        symbols
            .iter()
            .all(|s| !s.is_empty() && !s.contains(char::is_whitespace)),
        "one symbol per line"
    );
    // Mostly Rust's mangled names (legacy `_ZN…`, v0 `_R…`), some C (aws-lc).
    let rust = symbols
        .iter()
        .filter(|s| s.starts_with("_ZN") || s.starts_with("_R"))
        .count();
    assert!(rust * 2 > symbols.len(), "{rust} of {}", symbols.len());
    let ignored = std::fs::read_to_string(root.join(".dockerignore")).unwrap_or_default();
    assert!(
        !ignored
            .lines()
            .any(|l| ["crates/", "scripts/", "*.order"].contains(&l.trim()))
    );
}

/// Just enough TOML for `[section]` / `key = value` lines (no dependency for one test).
mod toml_like {
    pub type Table = std::collections::BTreeMap<String, std::collections::BTreeMap<String, String>>;

    pub fn parse(text: &str) -> Table {
        let mut t = Table::new();
        let mut section = String::new();
        for line in text.lines().map(str::trim) {
            if let Some(s) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
                section = s.to_owned();
            } else if let Some((k, v)) = line.split_once('=')
                && !line.starts_with('#')
            {
                t.entry(section.clone())
                    .or_default()
                    .insert(k.trim().to_owned(), v.trim().to_owned());
            }
        }
        t
    }
}
