//! The README's "try the webhook by hand" commands, run as written: the
//! `serve` arguments after `cargo run … --`, and the `curl` line's CA file,
//! body file and path. What a loopback test must change: the listen
//! addresses (free ports on 127.0.0.1 instead of 8443/8080) and the CA file's
//! directory (a temporary one).

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::registry::free_port;
use crate::support::sigil::bin;

fn readme() -> String {
    std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../README.md")).unwrap()
}

/// The README's try-it block: the serve line and the curl command (joined).
fn try_it() -> (Vec<String>, String) {
    let text = readme();
    let serve = text
        .lines()
        .find(|l| l.starts_with("cargo run --release -p sigil -- serve --ca-bundle-out"))
        .expect("the README shows how to serve");
    let args: Vec<String> = serve
        .split(" -- ")
        .nth(1)
        .unwrap()
        .trim_end_matches('&')
        .split_whitespace()
        .map(str::to_owned)
        .collect();
    let start = text
        .find("curl -s --cacert")
        .expect("the README shows a curl");
    let curl: String = text[start..]
        .lines()
        .take(2)
        .collect::<Vec<_>>()
        .join(" ")
        .replace('\\', " ");
    (args, curl)
}

fn flag<'a>(words: &'a [&'a str], name: &str) -> &'a str {
    let i = words.iter().position(|w| *w == name).unwrap();
    words[i + 1].trim_matches('\'')
}

#[tokio::test]
async fn the_readme_try_it_commands_answer_an_admission_review() {
    let (mut args, curl) = try_it();
    let dir = tempfile::tempdir().unwrap();
    let words: Vec<&str> = curl.split_whitespace().collect();
    let ca_in_readme = flag(&words, "--cacert");
    let data = flag(&words, "--data").trim_start_matches('@');
    let url = words.iter().find(|w| w.starts_with("https://")).unwrap();
    assert!(url.starts_with("https://localhost:8443/"), "{url}");
    let ca = dir.path().join("sigil-ca.pem");
    for a in &mut args {
        *a = a.replace(ca_in_readme, ca.to_str().unwrap());
    }
    let port = free_port();
    let mut child = Command::new(bin())
        .args(&args)
        .args([
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--admin-listen",
            "127.0.0.1:0",
        ])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.path().join("serve.log")).unwrap())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while !ca.exists() || std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            Instant::now() < deadline,
            "sigil serve {args:?} never listened: {}",
            std::fs::read_to_string(dir.path().join("serve.log")).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let pem = std::fs::read(&ca).unwrap();
    let client = reqwest::Client::builder()
        .tls_certs_only([reqwest::Certificate::from_pem(&pem).unwrap()])
        .resolve("localhost", ([127, 0, 0, 1], port).into())
        .build()
        .unwrap();
    let body = std::fs::read(format!("{}/../../{data}", env!("CARGO_MANIFEST_DIR"))).unwrap();
    let url = url.replace(":8443", &format!(":{port}"));
    let resp = client
        .post(&url)
        .header("Content-Type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap();
    let _ = child.kill();
    let _ = child.wait();
    assert!(resp.status().is_success());
    let review: serde_json::Value = serde_json::from_slice(&resp.bytes().await.unwrap()).unwrap();
    assert_eq!(review["kind"], "AdmissionReview");
    assert_eq!(review["response"]["allowed"], true);
    assert_eq!(
        review["response"]["uid"],
        "3a3a7b38-5512-4a85-94bb-3562269e0a6a"
    );
    // Offline here: the README says what then comes back.
    let warning = review["response"]["warnings"][0]
        .as_str()
        .unwrap_or_default();
    assert!(
        review["response"]["patch"].is_string()
            || warning.contains("securesystemsengineering/alice-image:test"),
        "{review}"
    );
}
