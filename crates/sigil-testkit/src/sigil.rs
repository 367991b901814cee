//! `sigil serve` as a real child process on 127.0.0.1:0, and a client that
//! behaves like kube-apiserver: HTTPS verified against the caBundle,
//! AdmissionReview v1, a timeout, applies the returned JSONPatch, checks the
//! result still decodes into its Kubernetes type, and reinvokes once
//! (reinvocationPolicy IfNeeded).

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine as _;
use serde_json::{Value, json};

pub use crate::process::{
    KillOnDrop, audit_command, bin, into_closed_pipe, run_bounded, run_ok, run_sigil, static_bin,
    wait_http,
};
use crate::review::{assert_decodes, decodes, pod, review};

pub struct Sigil {
    child: Child,
    pub addr: SocketAddr,
    pub admin: SocketAddr,
    pub ca_pem: String,
    pub logs: Arc<Mutex<Vec<String>>>,
    _dir: tempfile::TempDir,
    /// The container this process runs in (`podman run`), removed on drop:
    /// killing the podman client does not stop it.
    container: Option<String>,
}

impl Drop for Sigil {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Some(name) = &self.container {
            crate::process::remove_container(name);
        }
    }
}

impl Sigil {
    /// Starts `sigil serve` with `policy` (None = embedded default) and waits for /readyz.
    pub async fn start(policy: Option<&str>, extra: &[&str]) -> Sigil {
        Sigil::start_env(policy, extra, &[]).await
    }

    /// [`Sigil::start`] with extra environment variables (KUBECONFIG).
    pub async fn start_env(
        policy: Option<&str>,
        extra: &[&str],
        env: &[(String, String)],
    ) -> Sigil {
        let s = Sigil::spawn_env(policy, extra, env).await;
        s.wait_ready().await;
        s
    }

    /// [`Sigil::start_env`] without waiting for Ready (once it listens).
    pub async fn spawn_env(
        policy: Option<&str>,
        extra: &[&str],
        env: &[(String, String)],
    ) -> Sigil {
        Sigil::spawn_wrapped(&[], policy, extra, env).await
    }

    /// [`Sigil::start`] under a lowered open-files limit (`prlimit`), as a
    /// container runtime may set it.
    pub async fn start_with_nofile(limit: u64, extra: &[&str]) -> Sigil {
        let nofile = format!("--nofile={limit}:{limit}");
        let s = Sigil::spawn_wrapped(&["prlimit", &nofile, "--"], None, extra, &[]).await;
        s.wait_ready().await;
        s
    }

    /// [`Sigil::spawn_env`], run through `wrapper` (a command and its
    /// arguments that then exec sigil) when one is given.
    pub async fn spawn_wrapped(
        wrapper: &[&str],
        policy: Option<&str>,
        extra: &[&str],
        env: &[(String, String)],
    ) -> Sigil {
        let dir = tempfile::tempdir().unwrap();
        let ca_out = dir.path().join("ca.pem");
        let mut cmd = match wrapper.split_first() {
            Some((w, args)) => {
                let mut c = Command::new(w);
                c.args(args).arg(bin());
                c
            }
            None => Command::new(bin()),
        };
        cmd.args(["serve", "--log-format", "json"]);
        if !extra.contains(&"--listen") {
            cmd.args(["--listen", "127.0.0.1:0"]);
        }
        if !extra.contains(&"--admin-listen") {
            cmd.args(["--admin-listen", "127.0.0.1:0"]);
        }
        cmd.env_remove("KUBERNETES_SERVICE_HOST");
        cmd.env_remove("KUBECONFIG");
        // Tests reach nothing beyond loopback: no refresh from Sigstore's
        // TUF repository unless a test points one at its own (flags win).
        cmd.env("SIGIL_TRUST_ROOT_REFRESH", "0s");
        // And should one turn it on, the built-in roots' mirrors are a
        // closed loopback port until the test names its own.
        cmd.env("SIGIL_TUF_MIRROR", "http://127.0.0.1:9/");
        cmd.env("SIGIL_GITHUB_TUF_MIRROR", "http://127.0.0.1:9/");
        // What sigil puts in a temporary directory (the built-in roots' TUF
        // metadata without `--tuf-cache-dir`) goes with the test's directory:
        // a process killed at the end of a test never removes its own.
        cmd.env("TMPDIR", dir.path());
        for (k, v) in env {
            cmd.env(k, v);
        }
        if !extra.contains(&"--shutdown-delay") {
            cmd.args(["--shutdown-delay", "0s"]);
        }
        cmd.arg("--ca-bundle-out").arg(&ca_out);
        if let Some(p) = policy {
            let path = dir.path().join("policy.yaml");
            std::fs::write(&path, p).unwrap();
            cmd.arg("--policy").arg(path);
        }
        cmd.args(extra);
        cmd.env("SIGIL_LOG", "info");
        Sigil::launch(cmd, dir).unwrap_or_else(|e| panic!("{e}"))
    }

    /// `sigil ARGS` with exactly these arguments and this environment (and
    /// `PATH`, nothing else of the test's), as a kubelet starts a container;
    /// an error with sigil's output when it exits or logs no listen
    /// addresses within 20 s.
    pub fn spawn_exact(args: &[String], env: &[(String, String)]) -> Result<Sigil, String> {
        let mut cmd = Command::new(bin());
        cmd.args(args).env_clear();
        if let Ok(path) = std::env::var("PATH") {
            cmd.env("PATH", path);
        }
        cmd.envs(env.iter().map(|(k, v)| (k, v)));
        Sigil::launch(cmd, tempfile::tempdir().unwrap())
    }

    /// `cmd` runs sigil in the container `name` (`podman run`, in the
    /// foreground: its stderr is sigil's); the container is removed when
    /// this is dropped.
    pub fn spawn_container(cmd: Command, name: String) -> Result<Sigil, String> {
        let mut sigil = Sigil::launch(cmd, tempfile::tempdir().unwrap());
        match &mut sigil {
            Ok(s) => s.container = Some(name),
            Err(_) => crate::process::remove_container(&name),
        }
        sigil
    }

    fn launch(mut cmd: Command, dir: tempfile::TempDir) -> Result<Sigil, String> {
        let mut child = cmd
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("spawning sigil: {e}"))?;
        let stderr = child.stderr.take().unwrap();
        let logs = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = std::sync::mpsc::channel::<(String, SocketAddr)>();
        {
            let logs = logs.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                    if let Ok(v) = serde_json::from_str::<Value>(&line) {
                        let msg = v["message"].as_str().unwrap_or_default();
                        if let Some(a) = v["addr"].as_str().and_then(|a| a.parse().ok()) {
                            let _ = tx.send((msg.to_string(), a));
                        }
                    }
                    logs.lock().unwrap().push(line);
                }
            });
        }
        let (mut addr, mut admin) = (None, None);
        let until = Instant::now() + Duration::from_secs(20);
        while addr.is_none() || admin.is_none() {
            if let Ok(Some(status)) = child.try_wait() {
                // Let the reader thread take the last lines.
                std::thread::sleep(Duration::from_millis(100));
                return Err(format!(
                    "sigil exited with {status} before listening; output:\n{}",
                    logs.lock().unwrap().join("\n")
                ));
            }
            match rx.recv_timeout(Duration::from_millis(100)) {
                Ok((m, a)) if m.starts_with("webhook") => addr = Some(a),
                Ok((m, a)) if m.starts_with("admin") => admin = Some(a),
                Ok(_) | Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {}
            }
            if Instant::now() > until {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!(
                    "sigil did not log its listen addresses within 20 s; logs:\n{}",
                    logs.lock().unwrap().join("\n")
                ));
            }
        }
        // With --tls-cert or --self-managed-certs there is no minted CA.
        let ca_pem = std::fs::read_to_string(dir.path().join("ca.pem")).unwrap_or_default();
        Ok(Sigil {
            child,
            addr: addr.unwrap(),
            admin: admin.unwrap(),
            ca_pem,
            logs,
            _dir: dir,
            container: None,
        })
    }

    /// The container sigil runs in, when it was started from the image.
    pub fn container(&self) -> Option<&str> {
        self.container.as_deref()
    }

    /// The process id (for /proc readings).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends SIGTERM, as the kubelet does.
    pub fn terminate(&self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
    }

    /// Whether the process has exited.
    pub fn exited(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(Some(_)))
    }

    /// Waits for a terminated process and asserts it exited 0.
    pub fn wait_exit(&mut self, limit: Duration) {
        let until = Instant::now() + limit;
        loop {
            if let Ok(Some(st)) = self.child.try_wait() {
                assert!(
                    st.success(),
                    "sigil exited with {st}; logs: {}",
                    self.logs()
                );
                return;
            }
            assert!(Instant::now() < until, "sigil did not exit after SIGTERM");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits (up to `limit`) for /readyz to answer 200; the last answer otherwise.
    pub async fn try_wait_ready(&mut self, limit: Duration) -> Result<(), String> {
        let until = Instant::now() + limit;
        let mut last;
        loop {
            match reqwest::get(format!("http://{}/readyz", self.admin)).await {
                Ok(r) if r.status() == 200 => return Ok(()),
                Ok(r) => last = format!("{}: {}", r.status(), r.text().await.unwrap_or_default()),
                Err(e) => last = e.to_string(),
            }
            if self.exited() {
                return Err(format!("sigil exited; logs:\n{}", self.logs()));
            }
            if Instant::now() > until {
                return Err(format!(
                    "sigil never became Ready (last /readyz: {last}); logs:\n{}",
                    self.logs()
                ));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub async fn wait_ready(&self) {
        let until = Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok(r) = reqwest::get(format!("http://{}/readyz", self.admin)).await
                && r.status() == 200
            {
                return;
            }
            assert!(Instant::now() < until, "sigil never became ready");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub async fn metrics(&self) -> String {
        reqwest::get(format!("http://{}/metrics", self.admin))
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }

    /// Sum of a counter's samples whose labels contain every `filter` pair.
    pub async fn counter(&self, name: &str, filter: &[(&str, &str)]) -> f64 {
        let text = self.metrics().await;
        text.lines()
            .filter(|l| l.starts_with(name) && !l.starts_with('#'))
            .filter(|l| {
                filter
                    .iter()
                    .all(|(k, v)| l.contains(&format!("{k}=\"{v}\"")))
            })
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }

    /// Where the policy given to `start` was written.
    pub fn policy_path(&self) -> std::path::PathBuf {
        self._dir.path().join("policy.yaml")
    }

    pub fn logs(&self) -> String {
        self.logs.lock().unwrap().join("\n")
    }

    /// The logs once every admission counted in the metrics has its
    /// decision line (those are batched and may be written up to 20 ms
    /// after the answer): for checks that something is *absent* from the
    /// logs, which must not pass by reading them too early.
    pub async fn settled_logs(&self) -> String {
        let until = Instant::now() + Duration::from_secs(5);
        loop {
            let decided = self.counter("sigil_admission_requests_total", &[]).await
                - self
                    .counter(
                        "sigil_admission_requests_total",
                        &[("decision", "bad_request")],
                    )
                    .await;
            let logs = self.logs();
            let logged = logs
                .lines()
                .filter(|l| l.contains("\"message\":\"admission\""))
                .count();
            if logged as f64 >= decided {
                return logs;
            }
            assert!(
                Instant::now() < until,
                "{decided} admissions counted, {logged} decision lines logged"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    pub fn api(&self, ca_pem: &str) -> ApiServer {
        let client = reqwest::Client::builder()
            .tls_certs_only([reqwest::Certificate::from_pem(ca_pem.as_bytes()).unwrap()])
            .build()
            .unwrap();
        ApiServer {
            client,
            url: format!("https://localhost:{}/mutate", self.addr.port()),
        }
    }

    pub fn apiserver(&self) -> ApiServer {
        self.api(&self.ca_pem)
    }
}

pub struct ApiServer {
    pub client: reqwest::Client,
    pub url: String,
}

/// What the API server ends up with after calling the webhook.
#[derive(Debug)]
pub struct Admitted {
    pub response: Value,
    pub allowed: bool,
    pub object: Value,
    pub patched: bool,
    pub warnings: Vec<String>,
    pub message: String,
    /// The answer to the reinvocation, if the first call patched.
    pub reinvoked: Option<Box<Admitted>>,
}

impl ApiServer {
    pub async fn raw(&self, body: Vec<u8>, timeout: Duration) -> reqwest::Response {
        self.client
            .post(format!("{}?timeout={}s", self.url, timeout.as_secs()))
            .header("content-type", "application/json")
            .timeout(timeout)
            .body(body)
            .send()
            .await
            .expect("webhook call failed (kube-apiserver would apply failurePolicy)")
    }

    /// CREATE of a Pod named `p` with these container images, 10 s timeout.
    pub async fn create_pod(&self, namespace: &str, images: &[&str]) -> Admitted {
        self.admit(
            &review("CREATE", namespace, pod("p", images)),
            Duration::from_secs(10),
        )
        .await
    }

    /// Sends `review` like kube-apiserver and applies the answer.
    pub async fn admit(&self, review: &Value, timeout: Duration) -> Admitted {
        self.admit_inner(review, timeout, true).await
    }

    fn admit_inner<'a>(
        &'a self,
        review: &'a Value,
        timeout: Duration,
        reinvoke: bool,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Admitted> + Send + 'a>> {
        Box::pin(async move {
            let resp = self.raw(serde_json::to_vec(review).unwrap(), timeout).await;
            assert_eq!(resp.status(), 200, "webhook answered {}", resp.status());
            let out: Value =
                serde_json::from_slice(&resp.bytes().await.expect("body")).expect("answer is JSON");
            assert_eq!(
                out["apiVersion"], review["apiVersion"],
                "answer must use the request's AdmissionReview version"
            );
            assert_eq!(out["kind"], "AdmissionReview");
            let r = &out["response"];
            assert_eq!(r["uid"], review["request"]["uid"], "uid must be echoed");
            let allowed = r["allowed"].as_bool().expect("allowed is a bool");
            let mut object = review["request"]["object"].clone();
            let mut patched = false;
            if let Some(p) = r.get("patch").and_then(Value::as_str) {
                assert_eq!(r["patchType"], "JSONPatch");
                let bytes = base64::engine::general_purpose::STANDARD
                    .decode(p)
                    .expect("patch is base64");
                let patch: json_patch::Patch =
                    serde_json::from_slice(&bytes).expect("patch is a JSONPatch");
                let decoded_before = decodes(&object).is_ok();
                json_patch::patch(&mut object, &patch).expect("patch applies");
                patched = true;
                if decoded_before {
                    assert_decodes(&object);
                }
            }
            let warnings = r["warnings"]
                .as_array()
                .map(|w| {
                    w.iter()
                        .filter_map(|x| x.as_str().map(String::from))
                        .collect()
                })
                .unwrap_or_default();
            let message = r["status"]["message"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            let reinvoked = if patched && reinvoke && allowed {
                let mut again = review.clone();
                again["request"]["uid"] = json!(format!(
                    "{}-reinvoke",
                    review["request"]["uid"].as_str().unwrap_or("x")
                ));
                again["request"]["object"] = object.clone();
                Some(Box::new(self.admit_inner(&again, timeout, false).await))
            } else {
                None
            };
            Admitted {
                response: out,
                allowed,
                object,
                patched,
                warnings,
                message,
                reinvoked,
            }
        })
    }
}
