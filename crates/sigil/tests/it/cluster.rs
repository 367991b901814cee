//! Registration, self-managed certificates and break-glass, against a
//! stand-in for kube-apiserver's storage (support::kube) and a
//! kube-apiserver-like admission client that trusts exactly the registered
//! caBundle.

use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine as _;
use serde_json::Value;

use crate::support::kube::FakeKube;
use crate::support::registry::free_port;
use crate::support::review::{pod, review};
use crate::support::sigil::{Sigil, bin};

fn listen_args(port: u16, admin: u16) -> (String, String) {
    (format!("127.0.0.1:{port}"), format!("127.0.0.1:{admin}"))
}

/// `sigil break-glass …` against the fake API server.
fn break_glass(kube: &FakeKube, args: &[&str]) -> std::process::Output {
    std::process::Command::new(bin())
        .arg("break-glass")
        .args(["--namespace", "sigil-system"])
        .args(args)
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env("KUBECONFIG", &kube.kubeconfig)
        .output()
        .unwrap()
}

/// The certificate a TLS server presents, whatever signed it.
async fn served_leaf(addr: std::net::SocketAddr) -> Vec<u8> {
    use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
    #[derive(Debug)]
    struct Record(std::sync::Mutex<Vec<u8>>);
    impl ServerCertVerifier for Record {
        fn verify_server_cert(
            &self,
            end_entity: &rustls::pki_types::CertificateDer<'_>,
            _: &[rustls::pki_types::CertificateDer<'_>],
            _: &rustls::pki_types::ServerName<'_>,
            _: &[u8],
            _: rustls::pki_types::UnixTime,
        ) -> Result<ServerCertVerified, rustls::Error> {
            *self.0.lock().unwrap() = end_entity.to_vec();
            Ok(ServerCertVerified::assertion())
        }
        fn verify_tls12_signature(
            &self,
            _: &[u8],
            _: &rustls::pki_types::CertificateDer<'_>,
            _: &rustls::DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, rustls::Error> {
            Ok(HandshakeSignatureValid::assertion())
        }
        fn verify_tls13_signature(
            &self,
            _: &[u8],
            _: &rustls::pki_types::CertificateDer<'_>,
            _: &rustls::DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, rustls::Error> {
            Ok(HandshakeSignatureValid::assertion())
        }
        fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
            rustls::crypto::aws_lc_rs::default_provider()
                .signature_verification_algorithms
                .supported_schemes()
        }
    }
    let rec = Arc::new(Record(std::sync::Mutex::new(Vec::new())));
    let cfg = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::aws_lc_rs::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .dangerous()
    .with_custom_certificate_verifier(rec.clone())
    .with_no_client_auth();
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
    let _tls = tokio_rustls::TlsConnector::from(Arc::new(cfg))
        .connect(name, tcp)
        .await
        .unwrap();
    rec.0.lock().unwrap().clone()
}

fn b64(v: &Value) -> Vec<u8> {
    base64::engine::general_purpose::STANDARD
        .decode(v.as_str().unwrap_or_default())
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn register_happens_only_after_ready_with_the_safe_settings() {
    let kube = FakeKube::start().await;
    let (port, admin) = (free_port(), free_port());
    kube.state.lock().unwrap().probe = Some(format!("http://127.0.0.1:{admin}/readyz"));
    let (listen, admin_listen) = listen_args(port, admin);
    let url = format!("https://127.0.0.1:{port}/mutate");
    let sigil = Sigil::start_env(
        None,
        &[
            "--listen",
            &listen,
            "--admin-listen",
            &admin_listen,
            "--register",
            "--webhook-url",
            &url,
            "--namespace",
            "sigil-system",
        ],
        &kube.env(),
    )
    .await;
    let c = kube
        .wait_config("sigil", Duration::from_secs(10), |c| c.is_some())
        .await
        .unwrap();
    // kube-apiserver would have called a Ready replica, never one still starting.
    let probes = kube.state.lock().unwrap().probe_results.clone();
    assert_eq!(probes, vec![200], "registered before /readyz was 200");
    let w = &c["webhooks"][0];
    assert_eq!(w["failurePolicy"], "Fail");
    assert_eq!(w["reinvocationPolicy"], "IfNeeded");
    assert_eq!(w["sideEffects"], "NoneOnDryRun");
    assert_eq!(w["timeoutSeconds"], 10);
    assert_eq!(w["clientConfig"]["url"], url.as_str());
    let resources: Vec<String> = w["rules"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|r| r["resources"].as_array().unwrap().clone())
        .map(|r| r.as_str().unwrap().to_owned())
        .collect();
    assert!(resources.contains(&"pods/ephemeralcontainers".to_owned()));
    for r in w["rules"].as_array().unwrap() {
        assert_eq!(r["operations"], serde_json::json!(["CREATE", "UPDATE"]));
    }
    let exprs = w["namespaceSelector"]["matchExpressions"].to_string();
    assert!(exprs.contains("kube-system") && exprs.contains("sigil-system"));
    assert!(exprs.contains("sigil.dev/ignore"));
    // Owned by the namespace: deleting sigil's namespace garbage-collects it.
    let ns_uid = kube.get("/api/v1/namespaces", "sigil-system").unwrap()["metadata"]["uid"].clone();
    assert_eq!(c["metadata"]["ownerReferences"][0]["uid"], ns_uid);
    // The API server can call what was registered, verifying the caBundle.
    let api = kube.webhook_client("sigil");
    let a = api
        .admit(
            &review("CREATE", "default", pod("p", &["127.0.0.1:9/app:1"])),
            Duration::from_secs(10),
        )
        .await;
    assert!(a.allowed, "{a:?}");
    // A steady state writes nothing more.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let writes = |k: &FakeKube| {
        k.requests()
            .iter()
            .filter(|(m, p, _)| m != "GET" && p.contains("mutatingwebhook"))
            .count()
    };
    assert_eq!(writes(&kube), 1);
    drop(sigil);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_register_sigil_never_contacts_the_api_server() {
    let kube = FakeKube::start().await;
    let sigil = Sigil::start_env(None, &[], &kube.env()).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(kube.requests().is_empty(), "{:?}", kube.requests());
    drop(sigil);
}

#[test]
fn register_without_api_access_fails_with_a_clear_message() {
    let dir = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(bin())
        .args([
            "serve",
            "--register",
            "--listen",
            "127.0.0.1:0",
            "--admin-listen",
            "127.0.0.1:0",
        ])
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env("KUBECONFIG", dir.path().join("missing"))
        .env("HOME", dir.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--register needs access to the Kubernetes API") && err.contains("KUBECONFIG"),
        "{err}"
    );
    let out = std::process::Command::new(bin())
        .args(["break-glass"])
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env("KUBECONFIG", dir.path().join("missing"))
        .env("HOME", dir.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("sigil break-glass needs access"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn break_glass_deletes_the_webhook_and_replicas_stay_off_until_end() {
    let kube = FakeKube::start().await;
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let url = format!("https://127.0.0.1:{port}/mutate");
    let args = [
        "--listen",
        &listen,
        "--register",
        "--webhook-url",
        &url,
        "--namespace",
        "sigil-system",
        "--reconcile-interval",
        "100ms",
    ];
    let a = Sigil::start_env(None, &args, &kube.env()).await;
    kube.wait_config("sigil", Duration::from_secs(10), |c| c.is_some())
        .await;

    let out = break_glass(&kube, &["--reason", "registry outage drill"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("break-glass ON") && stdout.contains("UNCHECKED"),
        "{stdout}"
    );
    assert!(kube.webhook_configuration("sigil").is_none());
    let cm = kube
        .get("/api/v1/namespaces/sigil-system/configmaps", "sigil-state")
        .unwrap();
    let marker = cm["metadata"]["annotations"]["sigil.dev/break-glass"]
        .as_str()
        .unwrap();
    assert!(marker.contains("reason=registry outage drill"), "{marker}");
    // Ten reconcile intervals later the replica still has not re-registered.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(kube.webhook_configuration("sigil").is_none());
    assert_eq!(a.counter("sigil_break_glass", &[]).await, 1.0);

    let out = break_glass(&kube, &["--end"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert!(
        stdout.contains("break-glass ended")
            && stdout.contains("sigil audit -A --since-break-glass"),
        "{stdout}"
    );
    kube.wait_config("sigil", Duration::from_secs(5), |c| c.is_some())
        .await;
    let cm = kube
        .get("/api/v1/namespaces/sigil-system/configmaps", "sigil-state")
        .unwrap();
    assert!(cm["metadata"]["annotations"]["sigil.dev/break-glass"].is_null());
    let last = cm["metadata"]["annotations"]["sigil.dev/last-break-glass"]
        .as_str()
        .unwrap();
    assert!(last.contains("since=") && last.contains("ended="), "{last}");
    assert_eq!(a.counter("sigil_break_glass", &[]).await, 0.0);
}

/// Two replicas share one Secret; the CA and serving certificate rotate
/// (seconds-long lifetimes) while a kube-apiserver-like client, trusting only
/// the caBundle registered at that moment, calls both replicas: no call fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn self_managed_certs_are_shared_and_rotate_with_overlap_without_failed_calls() {
    let kube = FakeKube::start().await;
    let (pa, pb) = (free_port(), free_port());
    let url = format!("https://127.0.0.1:{pa}/mutate");
    let start = |port: u16| {
        let listen = format!("127.0.0.1:{port}");
        let url = url.clone();
        let env = kube.env();
        async move {
            Sigil::start_env(
                None,
                &[
                    "--listen",
                    &listen,
                    "--self-managed-certs",
                    "--register",
                    "--webhook-url",
                    &url,
                    "--extra-san",
                    "127.0.0.1",
                    "--namespace",
                    "sigil-system",
                    "--ca-validity",
                    "12s",
                    "--cert-validity",
                    "6s",
                    "--reconcile-interval",
                    "300ms",
                ],
                &env,
            )
            .await
        }
    };
    let a = start(pa).await;
    let b = start(pb).await;
    kube.wait_config("sigil", Duration::from_secs(10), |c| c.is_some())
        .await;
    let secret = kube
        .get("/api/v1/namespaces/sigil-system/secrets", "sigil-tls")
        .unwrap();
    assert_eq!(secret["type"], "kubernetes.io/tls");
    // Both replicas serve the Secret's one certificate (give B one poll).
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert_eq!(served_leaf(a.addr).await, served_leaf(b.addr).await);

    let until = Instant::now() + Duration::from_secs(16);
    let (mut calls, mut failures) = (0, Vec::new());
    let mut leaves = std::collections::BTreeSet::new();
    let mut cas = std::collections::BTreeSet::new();
    while Instant::now() < until {
        let cfg = kube.webhook_configuration("sigil").unwrap();
        let bundle = b64(&cfg["webhooks"][0]["clientConfig"]["caBundle"]);
        cas.insert(bundle.clone());
        let api = kube.webhook_client("sigil");
        for port in [pa, pb] {
            let client = crate::support::sigil::ApiServer {
                client: api.client.clone(),
                url: format!("https://127.0.0.1:{port}/mutate"),
            };
            calls += 1;
            let r = client
                .client
                .post(format!("{}?timeout=5s", client.url))
                .header("content-type", "application/json")
                .timeout(Duration::from_secs(5))
                .body(review("CREATE", "default", pod("p", &["127.0.0.1:9/a:1"])).to_string())
                .send()
                .await;
            match r {
                Ok(r) if r.status() == 200 => {}
                Ok(r) => failures.push(format!("{port}: HTTP {}", r.status())),
                Err(e) => failures.push(format!("{port}: {e:?}")),
            }
        }
        leaves.insert(served_leaf(a.addr).await);
        tokio::time::sleep(Duration::from_millis(80)).await;
    }
    assert!(
        failures.is_empty(),
        "{} of {calls} calls failed: {failures:#?}",
        failures.len()
    );
    assert!(
        leaves.len() >= 3,
        "serving certificate rotated only {} times",
        leaves.len() - 1
    );
    assert!(
        cas.len() >= 3,
        "CA bundle went through {} states; expected add-new then drop-old; logs:\n{}",
        cas.len(),
        a.logs() + "\n---- b\n" + &b.logs()
    );
    drop((a, b));
}
