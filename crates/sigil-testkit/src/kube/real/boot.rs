//! Starting the control plane: a fresh PKI (cluster CA, serving, admin and
//! controller-manager certificates, the ServiceAccount signing key), etcd,
//! kube-apiserver with the flags v1.36 needs here, kube-controller-manager
//! when asked, each under a watchdog; kubeconfigs; a restart of the API
//! server, and of everything at once. With a [`NodeLayout`] the plane is
//! the one a real node joins (`crate::node`): the API server on the node's
//! address with a Service range, the scheduler, the kubelet's certificate.
//! What it does not own: talking to the API (the parent module), the node.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use base64::Engine as _;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};

use super::RealKube;

/// Where kube-apiserver is in [`RealKube`]'s processes (etcd is first).
const API: usize = 1;

pub(super) use crate::ports::free_port;

/// A CA, and certificates it issues (PEM).
struct Pki {
    ca_pem: String,
    issuer: Issuer<'static, KeyPair>,
}

impl Pki {
    fn new() -> Pki {
        let key = KeyPair::generate().unwrap();
        let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
        p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        p.distinguished_name
            .push(DnType::CommonName, "sigil-test-kube-ca");
        p.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let cert = p.self_signed(&key).unwrap();
        Pki {
            ca_pem: cert.pem(),
            issuer: Issuer::new(p, key),
        }
    }

    /// (certificate, key) PEM for `cn`/`org`, serving `sans` or a client.
    fn issue(&self, cn: &str, org: Option<&str>, sans: &[&str], client: bool) -> (String, String) {
        let key = KeyPair::generate().unwrap();
        let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
        p.distinguished_name.push(DnType::CommonName, cn);
        if let Some(o) = org {
            p.distinguished_name.push(DnType::OrganizationName, o);
        }
        for s in sans {
            p.subject_alt_names.push(match s.parse() {
                Ok(ip) => SanType::IpAddress(ip),
                Err(_) => SanType::DnsName((*s).try_into().unwrap()),
            });
        }
        p.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        p.extended_key_usages = vec![if client {
            ExtendedKeyUsagePurpose::ClientAuth
        } else {
            ExtendedKeyUsagePurpose::ServerAuth
        }];
        let cert = p.signed_by(&key, &self.issuer).unwrap();
        (cert.pem(), key.serialize_pem())
    }
}

/// Where a control plane for a real node listens (`crate::node` owns the
/// addresses; they exist only on this machine).
#[derive(Clone, Debug)]
pub struct NodeLayout {
    /// The node's address: the API server binds and advertises it.
    pub address: String,
    /// The Service range (`--service-cluster-ip-range`).
    pub service_range: String,
    /// The first address of the range: the `kubernetes` Service.
    pub service_ip: String,
    /// The node's name (its kubelet certificate's `system:node:<name>`).
    pub node_name: String,
}

/// Starts `program` under a watchdog that stops it once this test process
/// is gone, with its output in `log`.
pub(crate) fn spawn_watched(program: &Path, args: &[String], log: &Path) -> Child {
    // Appended: a restarted process keeps its earlier lines.
    let out = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .unwrap();
    let err = out.try_clone().unwrap();
    // `exec` keeps the PID the program's: Drop signals it directly; the
    // watchdog subshell signals it if the test process dies first.
    let script = r#"parent=$1; shift
( while kill -0 "$parent" 2>/dev/null && kill -0 $$ 2>/dev/null; do sleep 1; done
  kill -0 $$ 2>/dev/null || exit 0; kill -TERM $$; sleep 5; kill -KILL $$ 2>/dev/null ) &
exec "$@""#;
    Command::new("sh")
        .arg("-c")
        .arg(script)
        .arg("sh")
        .arg(std::process::id().to_string())
        .arg(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .unwrap_or_else(|e| panic!("starting {}: {e}", program.display()))
}

/// How a kubeconfig's user authenticates.
pub(super) enum Credential<'a> {
    /// A bearer token, in a default namespace.
    Token { token: &'a str, namespace: &'a str },
    /// A client certificate and key (PEM).
    Client { cert: &'a str, key: &'a str },
}

/// A kubeconfig for `server` trusting `ca_pem`, as user `user`.
pub(super) fn kubeconfig(
    server: &str,
    ca_pem: &str,
    user: &str,
    credential: Credential<'_>,
) -> String {
    let b64 = |t: &str| base64::engine::general_purpose::STANDARD.encode(t);
    let (auth, namespace) = match credential {
        Credential::Token { token, namespace } => (
            format!("    token: {token}\n"),
            format!("    namespace: {namespace}\n"),
        ),
        Credential::Client { cert, key } => (
            format!(
                "    client-certificate-data: {}\n    client-key-data: {}\n",
                b64(cert),
                b64(key)
            ),
            String::new(),
        ),
    };
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: real\n  cluster:\n    server: {server}\n    certificate-authority-data: {}\nusers:\n- name: {user}\n  user:\n{auth}contexts:\n- name: real\n  context:\n    cluster: real\n    user: {user}\n{namespace}current-context: real\n",
        b64(ca_pem)
    )
}

fn write(dir: &Path, name: &str, text: &str) -> String {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p.display().to_string()
}

impl RealKube {
    /// Starts etcd and kube-apiserver from [`assets`] and waits until the
    /// API server is ready (`/readyz`). Panics with the logs if it is not
    /// within a minute.
    pub async fn start(assets: &(PathBuf, PathBuf)) -> RealKube {
        RealKube::start_with(assets, false).await
    }

    /// [`RealKube::start`], with kube-controller-manager too when
    /// `controllers` (Deployments → ReplicaSets → Pods, every namespace's
    /// `default` ServiceAccount, namespace deletion).
    pub async fn start_with(assets: &(PathBuf, PathBuf), controllers: bool) -> RealKube {
        RealKube::boot(assets, controllers, None).await
    }

    /// The control plane a real node joins (`crate::node`): the API server on
    /// `layout.address` with its Service range, Endpoints for `kubernetes`,
    /// the Node authorizer and NodeRestriction, privileged Pods allowed (the
    /// node DaemonSet's hostPath), the controllers with their own
    /// ServiceAccounts, and kube-scheduler from `scheduler`. The kubelet's
    /// client certificate and kubeconfig are in [`RealKube::dir`]
    /// (`kubelet.kubeconfig`), as is `admin.kubeconfig`.
    pub async fn start_for_node(
        assets: &(PathBuf, PathBuf),
        layout: &NodeLayout,
        scheduler: &Path,
    ) -> RealKube {
        let kube = RealKube::boot(assets, true, Some(layout)).await;
        let d = kube.dir.path();
        let sched_args: Vec<String> = vec![
            format!("--kubeconfig={}", d.join("admin.kubeconfig").display()),
            "--leader-elect=false".into(),
            "--bind-address=127.0.0.1".into(),
            format!("--secure-port={}", free_port()),
        ];
        kube.spawn(scheduler, sched_args, "kube-scheduler.log");
        kube
    }

    async fn boot(
        (assets, etcd): &(PathBuf, PathBuf),
        controllers: bool,
        node: Option<&NodeLayout>,
    ) -> RealKube {
        let dir = tempfile::tempdir().unwrap();
        let d = &dir.path().to_path_buf();
        let pki = Pki::new();
        let mut sans = vec![
            "127.0.0.1",
            "localhost",
            "kubernetes",
            "kubernetes.default",
            "kubernetes.default.svc",
        ];
        if let Some(n) = node {
            sans.extend([n.address.as_str(), n.service_ip.as_str()]);
        }
        let (serving, serving_key) = pki.issue("kube-apiserver", None, &sans, false);
        let sa_pair = KeyPair::generate().unwrap();
        let (sa_key, sa_pub) = (sa_pair.serialize_pem(), sa_pair.public_key_pem());
        let ca = write(d, "ca.crt", &pki.ca_pem);
        let tls_crt = write(d, "apiserver.crt", &serving);
        let tls_key = write(d, "apiserver.key", &serving_key);
        let sa = write(d, "sa.key", &sa_key);
        let sa_pub = write(d, "sa.pub", &sa_pub);
        let (client, peer, secure) = (free_port(), free_port(), free_port());
        let etcd_args: Vec<String> = vec![
            "--name=default".into(),
            format!("--data-dir={}", d.join("etcd").display()),
            format!("--listen-client-urls=http://127.0.0.1:{client}"),
            format!("--advertise-client-urls=http://127.0.0.1:{client}"),
            format!("--listen-peer-urls=http://127.0.0.1:{peer}"),
            format!("--initial-advertise-peer-urls=http://127.0.0.1:{peer}"),
            format!("--initial-cluster=default=http://127.0.0.1:{peer}"),
        ];
        let etcd_proc = spawn_watched(etcd, &etcd_args, &d.join("etcd.log"));
        let address = node.map_or("127.0.0.1", |n| n.address.as_str());
        let mut api_args: Vec<String> = vec![
            format!("--etcd-servers=http://127.0.0.1:{client}"),
            format!("--secure-port={secure}"),
            format!("--bind-address={address}"),
            format!("--advertise-address={address}"),
            format!(
                "--service-cluster-ip-range={}",
                node.map_or("10.0.0.0/24", |n| n.service_range.as_str())
            ),
            "--authorization-mode=Node,RBAC".into(),
            format!("--client-ca-file={ca}"),
            format!("--tls-cert-file={tls_crt}"),
            format!("--tls-private-key-file={tls_key}"),
            format!("--service-account-key-file={sa_pub}"),
            format!("--service-account-signing-key-file={sa}"),
            "--service-account-issuer=https://kubernetes.default.svc".into(),
            // A webhook registered by Service (as the chart and the base ship
            // it) is resolved through its Endpoints, never dialled at its
            // ClusterIP: 10.0.0.x is off this machine, and with no Endpoints
            // the API server answers at once "no endpoints available".
            "--enable-aggregator-routing=true".into(),
            "--feature-gates=SizeBasedListCostEstimate=false".into(),
        ];
        let (admin_cert, admin_key) = pki.issue("admin", Some("system:masters"), &[], true);
        let admin_crt_path = write(d, "admin.crt", &admin_cert);
        let admin_key_path = write(d, "admin.key", &admin_key);
        match node {
            None => api_args.extend([
                // No node: the `kubernetes` Service has no endpoints to keep.
                "--endpoint-reconciler-type=none".into(),
                "--enable-admission-plugins=NamespaceLifecycle,ServiceAccount,MutatingAdmissionPolicy,MutatingAdmissionWebhook,ValidatingAdmissionPolicy,ValidatingAdmissionWebhook".into(),
            ]),
            Some(n) => {
                api_args.extend([
                    "--enable-admission-plugins=NamespaceLifecycle,NodeRestriction,ServiceAccount,MutatingAdmissionPolicy,MutatingAdmissionWebhook,ValidatingAdmissionPolicy,ValidatingAdmissionWebhook".into(),
                    "--allow-privileged=true".into(),
                    format!("--kubelet-client-certificate={admin_crt_path}"),
                    format!("--kubelet-client-key={admin_key_path}"),
                    "--kubelet-preferred-address-types=InternalIP".into(),
                ]);
                let (crt, key) = pki.issue(
                    &format!("system:node:{}", n.node_name),
                    Some("system:nodes"),
                    &[],
                    true,
                );
                let url = format!("https://{address}:{secure}");
                for (name, cert, key) in [
                    ("kubelet", &crt, &key),
                    ("admin", &admin_cert, &admin_key),
                ] {
                    let text = kubeconfig(&url, &pki.ca_pem, name, Credential::Client { cert, key });
                    write(d, &format!("{name}.kubeconfig"), &text);
                }
            }
        }
        let api_program = assets.join("kube-apiserver");
        let api_proc = spawn_watched(&api_program, &api_args, &d.join("kube-apiserver.log"));
        let identity = reqwest::Identity::from_pem(format!("{admin_cert}{admin_key}").as_bytes())
            .expect("admin identity");
        let admin = reqwest::Client::builder()
            .tls_certs_only([reqwest::Certificate::from_pem(pki.ca_pem.as_bytes()).unwrap()])
            .identity(identity)
            .timeout(Duration::from_secs(30))
            .build()
            .unwrap();
        let kube = RealKube {
            url: format!("https://{address}:{secure}"),
            ca_pem: pki.ca_pem.clone(),
            admin_pem: (admin_cert.clone(), admin_key.clone()),
            dir,
            procs: Mutex::new(vec![etcd_proc, api_proc]),
            commands: Mutex::new(vec![
                (etcd.clone(), etcd_args, "etcd.log".into()),
                (api_program, api_args, "kube-apiserver.log".into()),
            ]),
            admin,
            discovery: Mutex::default(),
        };
        if controllers {
            let (cm_cert, cm_key) = pki.issue(
                "system:kube-controller-manager",
                Some("system:masters"),
                &[],
                true,
            );
            let kubeconfig = write(
                d,
                "controller-manager.kubeconfig",
                &kubeconfig(
                    &kube.url,
                    &pki.ca_pem,
                    "cm",
                    Credential::Client {
                        cert: &cm_cert,
                        key: &cm_key,
                    },
                ),
            );
            let ca_key = write(d, "ca.key", &pki.issuer.key().serialize_pem());
            let cm_args: Vec<String> = vec![
                format!("--kubeconfig={kubeconfig}"),
                format!("--service-account-private-key-file={sa}"),
                format!("--root-ca-file={ca}"),
                format!("--cluster-signing-cert-file={ca}"),
                format!("--cluster-signing-key-file={ca_key}"),
                // With a node, each controller under its own ServiceAccount
                // (else kube-root-ca.crt may never be published, and every
                // Pod with a projected token waits for it).
                format!("--use-service-account-credentials={}", node.is_some()),
                "--leader-elect=false".into(),
                "--bind-address=127.0.0.1".into(),
                format!("--secure-port={}", free_port()),
                "--controllers=*,bootstrap-signer-controller,token-cleaner-controller,-node-ipam-controller,-service-ca-certificate-publisher-controller".into(),
            ];
            kube.spawn(
                &assets.join("kube-controller-manager"),
                cm_args,
                "kube-controller-manager.log",
            );
        }
        kube.wait_ready().await;
        kube
    }

    /// Stops kube-apiserver (SIGTERM, as a control-plane upgrade does; killed
    /// if it has not exited within 10 s, as its graceful drain of
    /// long-running requests can take much longer) and starts it again with
    /// the same flags, port and etcd: every client's connections and watches
    /// are cut, the stored objects stay. Returns once it is ready again.
    pub async fn restart_apiserver(&self) {
        {
            let mut procs = self.procs.lock().unwrap();
            let api = &mut procs[API];
            let _ = Command::new("kill")
                .args(["-TERM", &api.id().to_string()])
                .status();
            let until = Instant::now() + Duration::from_secs(10);
            while Instant::now() < until && matches!(api.try_wait(), Ok(None)) {
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = api.kill();
            let _ = api.wait();
            let (program, args, log) = &self.commands.lock().unwrap()[API];
            procs[API] = spawn_watched(program, args, &self.dir.path().join(log));
        }
        self.wait_ready().await;
    }

    /// Starts one more control-plane process (stopped with the others).
    fn spawn(&self, program: &Path, args: Vec<String>, log: &str) {
        let child = spawn_watched(program, &args, &self.dir.path().join(log));
        self.procs.lock().unwrap().push(child);
        self.commands
            .lock()
            .unwrap()
            .push((program.to_owned(), args, log.into()));
    }

    /// A power cut: every process of the control plane killed at once
    /// (SIGKILL, no drain); etcd's data stays. [`RealKube::start_again`]
    /// brings it back.
    pub fn kill_all(&self) {
        for c in self.procs.lock().unwrap().iter_mut() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts every process again with the flags, ports and data it had,
    /// and waits until the API server is ready.
    pub async fn start_again(&self) {
        {
            let commands = self.commands.lock().unwrap();
            let mut procs = self.procs.lock().unwrap();
            for (i, (program, args, log)) in commands.iter().enumerate() {
                procs[i] = spawn_watched(program, args, &self.dir.path().join(log));
            }
        }
        self.wait_ready().await;
    }

    /// The directory with the PKI, kubeconfigs and logs.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// kube-apiserver's process id (its sockets: [`crate::sockets`]).
    pub fn apiserver_pid(&self) -> u32 {
        self.procs.lock().unwrap()[API].id()
    }

    /// Waits until `/readyz` answers 200; panics with the logs if a process
    /// exits or a minute passes.
    async fn wait_ready(&self) {
        let until = Instant::now() + Duration::from_secs(60);
        loop {
            let ready = self
                .admin
                .get(format!("{}/readyz", self.url))
                .send()
                .await
                .is_ok_and(|r| r.status() == 200);
            if ready {
                return;
            }
            let exited = self
                .procs
                .lock()
                .unwrap()
                .iter_mut()
                .any(|c| !matches!(c.try_wait(), Ok(None)));
            assert!(!exited, "etcd or kube-apiserver exited:\n{}", self.logs());
            assert!(
                Instant::now() < until,
                "kube-apiserver was not ready within 60 s:\n{}",
                self.logs()
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
}
