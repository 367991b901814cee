//! The kubelet's part of running what we ship: starts the `sigil` container
//! of a rendered Deployment exactly as its manifest says — its `args`, its
//! `env` (literal values, and `fieldRef`s resolved as the downward API
//! does), its ConfigMap, Secret and emptyDir volumes written where it mounts
//! them, its ServiceAccount's kubeconfig — either as a process of the test's
//! own binary ([`Runtime::Process`]) or as the shipped container image
//! ([`Runtime::Image`]: pushed to the test registry, pulled and run by podman
//! with the container's securityContext, its volumes mounted at their real
//! paths). What it does not own: which API server (the stand-in or the real
//! one) and what is checked afterwards (`shipped`, `real_kube`).

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use base64::Engine as _;
use serde_json::Value;

use crate::shipped::find;
use crate::support::image;
use crate::support::registry::{Mode, TestRegistry};
use crate::support::sigil::Sigil;
use crate::support::tuf::{StaticServer, TufRepo};

pub(crate) const POD_NAME: &str = "sigil-5d8f7c9b6-x2k4q";

/// How the container is started.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Runtime<'a> {
    /// The test's own `sigil` binary as a child process, mount paths
    /// remapped under a temporary root.
    Process,
    /// This local image (built by `scripts/image.sh`), pushed to the test
    /// registry and run from there by podman, as a node would.
    Image(&'a str),
}

/// sigil started as the shipped Deployment says, and what it uses.
pub(crate) struct Launched {
    pub(crate) sigil: Sigil,
    pub(crate) registry: TestRegistry,
    _root: tempfile::TempDir,
    /// Stands in for Sigstore's TUF CDN (the only thing the harness adds
    /// to the shipped configuration besides where the API server is).
    _tuf: (TufRepo, StaticServer),
}

/// The kubelet's part for volumes: writes each mounted volume under `root`
/// and returns (mountPath, host path), longest mount first.
fn mount_volumes(
    lookup: &dyn Fn(&str, &str) -> Option<Value>,
    ns: &str,
    pod: &Value,
    root: &Path,
) -> Vec<(String, PathBuf)> {
    let container = &pod["containers"][0];
    let mut mounts = Vec::new();
    for m in container["volumeMounts"].as_array().into_iter().flatten() {
        let path = m["mountPath"].as_str().unwrap();
        let host = root.join(path.trim_start_matches('/'));
        std::fs::create_dir_all(&host).unwrap();
        let vol = pod["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["name"] == m["name"])
            .expect("every mount names a volume");
        let files: BTreeMap<String, Vec<u8>> = if let Some(cm) = vol["configMap"]["name"].as_str() {
            let o = lookup(&format!("/api/v1/namespaces/{ns}/configmaps"), cm)
                .unwrap_or_else(|| panic!("ConfigMap {cm} is not in the manifests"));
            o["data"]
                .as_object()
                .into_iter()
                .flatten()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap().as_bytes().to_vec()))
                .collect()
        } else if let Some(s) = vol["secret"]["secretName"].as_str() {
            let o = lookup(&format!("/api/v1/namespaces/{ns}/secrets"), s)
                .unwrap_or_else(|| panic!("Secret {s} does not exist"));
            o["data"]
                .as_object()
                .into_iter()
                .flatten()
                .map(|(k, v)| {
                    let d = base64::engine::general_purpose::STANDARD
                        .decode(v.as_str().unwrap())
                        .unwrap();
                    (k.clone(), d)
                })
                .collect()
        } else if vol["emptyDir"].is_object() {
            BTreeMap::new()
        } else {
            panic!("volume kind the test cannot mount: {vol}");
        };
        for (k, v) in files {
            std::fs::write(host.join(k), v).unwrap();
        }
        mounts.push((path.to_owned(), host));
    }
    mounts.sort_by_key(|(p, _)| std::cmp::Reverse(p.len()));
    mounts
}

/// A path inside a mount, as seen from the host.
fn remap(value: &str, mounts: &[(String, PathBuf)]) -> String {
    for (path, host) in mounts {
        if let Some(rest) = value.strip_prefix(path.as_str())
            && (rest.is_empty() || rest.starts_with('/'))
        {
            return format!("{}{rest}", host.display());
        }
    }
    value.to_owned()
}

/// Starts the sigil container of the shipped Deployment in `objects` as a
/// kubelet would (see the module docs) in `runtime`, listening on `ports`
/// (webhook, admin): its volumes from `lookup` (a collection path and a
/// name), its ServiceAccount's kubeconfig from `kubeconfig`; Ready within
/// 30 s.
pub(crate) async fn launch(
    objects: &[Value],
    (port, admin): (u16, u16),
    lookup: &dyn Fn(&str, &str) -> Option<Value>,
    kubeconfig: &dyn Fn(&str, &str) -> PathBuf,
    runtime: Runtime<'_>,
) -> Result<Launched, String> {
    let url = format!("https://127.0.0.1:{port}/mutate");
    let d = find(objects, "Deployment", "sigil").clone();
    let ns = d["metadata"]["namespace"].as_str().unwrap().to_owned();
    let pod = &d["spec"]["template"]["spec"];
    let container = pod["containers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "sigil")
        .expect("a container named sigil")
        .clone();
    let root = tempfile::tempdir().unwrap();
    let mounts = mount_volumes(lookup, &ns, pod, root.path());
    let registry = TestRegistry::start(Mode::Tls).await;
    let ca_file = root.path().join("registry-ca.pem");
    std::fs::write(&ca_file, registry.ca_pem.clone().unwrap()).unwrap();

    let tuf = TufRepo::new(sigil_verify::trust::PUBLIC_GOOD.as_bytes());
    let cdn = tuf.serve().await;
    let tuf_root = root.path().join("tuf-root.json");
    std::fs::write(&tuf_root, tuf.bootstrap_root()).unwrap();
    // In the image the volumes are at their real paths: nothing to remap.
    let place = |v: &str| match runtime {
        Runtime::Process => remap(v, &mounts),
        Runtime::Image(_) => v.to_owned(),
    };

    let mut args = Vec::new();
    for a in container["args"].as_array().unwrap() {
        let a = a.as_str().unwrap();
        args.push(match a.split_once('=') {
            Some(("--listen", _)) => format!("--listen=127.0.0.1:{port}"),
            Some(("--admin-listen", _)) => format!("--admin-listen=127.0.0.1:{admin}"),
            Some((flag, value)) => format!("{flag}={}", place(value)),
            None => a.to_owned(),
        });
    }
    for flag in ["--listen=", "--admin-listen="] {
        if !args.iter().any(|a| a.starts_with(flag)) {
            return Err(format!("the Deployment does not set {flag} explicitly"));
        }
    }
    let mut env = Vec::new();
    for e in container["env"].as_array().into_iter().flatten() {
        let name = e["name"].as_str().unwrap().to_owned();
        let value = if let Some(v) = e["value"].as_str() {
            place(v)
        } else {
            match e["valueFrom"]["fieldRef"]["fieldPath"].as_str() {
                Some("metadata.namespace") => ns.clone(),
                Some("metadata.name") => POD_NAME.to_owned(),
                other => return Err(format!("env {name}: valueFrom {other:?} is not emulated")),
            }
        };
        env.push((name, value));
    }
    let sa = pod["serviceAccountName"].as_str().unwrap_or("default");
    // The kubeconfig lives beside the registry CA: one read-only mount.
    let kube_file = root.path().join("kubeconfig");
    std::fs::copy(kubeconfig(&ns, sa), &kube_file).unwrap();
    env.extend([
        ("HOSTNAME".to_owned(), POD_NAME.to_owned()),
        ("KUBECONFIG".to_owned(), kube_file.display().to_string()),
        ("SIGIL_WEBHOOK_URL".to_owned(), url),
        (
            "SIGIL_EXTRA_SANS".to_owned(),
            "127.0.0.1,localhost".to_owned(),
        ),
        ("SSL_CERT_FILE".to_owned(), ca_file.display().to_string()),
        ("SIGIL_TUF_MIRROR".to_owned(), cdn.url()),
        ("SIGIL_TUF_ROOT".to_owned(), tuf_root.display().to_string()),
        // GitHub's root is refreshed only for a policy naming it; never off the machine.
        (
            "SIGIL_GITHUB_TUF_MIRROR".to_owned(),
            "http://127.0.0.1:9/".to_owned(),
        ),
    ]);
    let mut sigil = match runtime {
        Runtime::Process => {
            env.push(("TMPDIR".to_owned(), remap("/tmp", &mounts)));
            Sigil::spawn_exact(&args, &env)?
        }
        Runtime::Image(local) => {
            let pushed = format!("{}/sigil:shipped", registry.host());
            image::push(local, &pushed)?;
            let run = container_run(pod, &container, root.path(), &mounts, args, env);
            image::run(&pushed, &run)?
        }
    };
    sigil.try_wait_ready(Duration::from_secs(30)).await?;
    Ok(Launched {
        sigil,
        registry,
        _root: root,
        _tuf: (tuf, cdn),
    })
}

/// What a kubelet makes of the container's securityContext (over the
/// Pod's) and volume mounts. The test's own files (kubeconfig, registry CA,
/// TUF root) are mounted read-only at their host paths; everything is made
/// readable by the container's user, emptyDirs writable.
fn container_run(
    pod: &Value,
    container: &Value,
    root: &Path,
    mounts: &[(String, PathBuf)],
    args: Vec<String>,
    env: Vec<(String, String)>,
) -> image::Run {
    let sc = |field: &str| {
        let c = &container["securityContext"][field];
        if c.is_null() {
            pod["securityContext"][field].clone()
        } else {
            c.clone()
        }
    };
    let user = sc("runAsUser").as_u64().map(|u| {
        let g = sc("runAsGroup").as_u64().unwrap_or(u);
        format!("{u}:{g}")
    });
    let read_only_mount = |path: &str| {
        container["volumeMounts"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|m| m["mountPath"] == path && m["readOnly"] == true)
    };
    open_up(root);
    let mut run_mounts = vec![(root.to_path_buf(), root.display().to_string(), true)];
    for (path, host) in mounts {
        let ro = read_only_mount(path);
        if !ro {
            std::fs::set_permissions(host, std::fs::Permissions::from_mode(0o1777)).unwrap();
        }
        run_mounts.push((host.clone(), path.clone(), ro));
    }
    image::Run {
        user,
        read_only: sc("readOnlyRootFilesystem") == true,
        drop_all_caps: sc("capabilities")["drop"]
            .as_array()
            .is_some_and(|d| d.iter().any(|c| c == "ALL")),
        no_new_privileges: sc("allowPrivilegeEscalation") == false,
        mounts: run_mounts,
        env,
        args,
    }
}

/// Directories 0755 and files 0644 under `dir`: the container's user is
/// not the test's.
fn open_up(dir: &Path) {
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let path = e.path();
        if path.is_dir() {
            open_up(&path);
        } else {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        }
    }
}
