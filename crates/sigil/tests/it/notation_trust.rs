//! notation's trust policy through the webhook and `sigil verify`, against
//! a real registry and a CA's CRL server on loopback: trusted identities, a
//! countersigned signature whose certificate has expired, a revoked signer,
//! and CRLs fetched in the background (the first admission that needs a CRL
//! not fetched yet is denied as "unknown", never held up by the fetch).

use std::time::Duration;

use rcgen::DnType;
use serde_json::json;

use crate::support::pki::{Ca, Issued};
use crate::support::registry::{Mode, TestRegistry};
use crate::support::sigil::{Sigil, run_sigil};
use crate::support::signing::{self, notation_jws_chain, pem};
use crate::support::sigstore::Sigstore;
use crate::support::tuf::StaticServer;

const ACME: &[(DnType, &str)] = &[
    (DnType::CountryName, "US"),
    (DnType::StateOrProvinceName, "WA"),
    (DnType::OrganizationName, "acme"),
    (DnType::CommonName, "release"),
];
const EVIL: &[(DnType, &str)] = &[
    (DnType::CountryName, "US"),
    (DnType::StateOrProvinceName, "WA"),
    (DnType::OrganizationName, "evil"),
];
const Y2020: (i64, i64) = (1_577_836_800, 1_609_459_200);
const JUNE_2020: i64 = 1_590_969_600;

async fn sign(
    reg: &TestRegistry,
    repo: &str,
    signer: &Issued,
    inter: &Ca,
    stamp: Option<signing::Countersign<'_>>,
    signing_time: &str,
) {
    let digest = reg.push_image(repo, "v1").await;
    let size = reg.manifest_size(repo, &digest).await;
    let env = notation_jws_chain(
        &signer.key,
        "ES256",
        &[signer.der.clone(), inter.der.clone()],
        &digest,
        size,
        json!({"io.cncf.notary.signingTime": signing_time}),
        stamp,
    );
    signing::push_referrer(
        reg,
        repo,
        &digest,
        size,
        "application/vnd.cncf.notary.signature",
        "application/jose+json",
        &env,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn notation_trust_policy_with_timestamps_and_crls_through_the_webhook_and_the_cli() {
    let reg = TestRegistry::start(Mode::Plain).await;
    let h = reg.host();
    let dir = tempfile::tempdir().unwrap();
    let crl_dir = dir.path().join("crl");
    std::fs::create_dir(&crl_dir).unwrap();
    let cdp = StaticServer::start(crl_dir.clone()).await;
    let root = Ca::root("corp root");
    let inter = root.intermediate("corp signing CA", Some(&format!("{}root.crl", cdp.url())));
    let inter_crl = format!("{}inter.crl", cdp.url());
    let release = inter.leaf(ACME, Some(&inter_crl), None);
    let expired = inter.leaf(ACME, Some(&inter_crl), Some(Y2020));
    let stranger = inter.leaf(EVIL, Some(&inter_crl), None);
    let revoked = inter.leaf(ACME, Some(&inter_crl), None);
    let now = time::OffsetDateTime::now_utc().unix_timestamp();
    std::fs::write(
        crl_dir.join("root.crl"),
        root.crl(&[], now - 60, now + 3600),
    )
    .unwrap();
    std::fs::write(
        crl_dir.join("inter.crl"),
        inter.crl(&[revoked.serial], now - 60, now + 3600),
    )
    .unwrap();
    let tsa = Sigstore::new();
    let countersign = |sig: &[u8]| tsa.timestamp(sig, JUNE_2020, true, None);
    let today = time::OffsetDateTime::now_utc()
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap();
    sign(&reg, "n/app", &release, &inter, None, &today).await;
    sign(
        &reg,
        "n/old",
        &expired,
        &inter,
        Some(&countersign),
        "2020-06-01T00:00:00Z",
    )
    .await;
    sign(&reg, "n/stranger", &stranger, &inter, None, &today).await;
    sign(&reg, "n/revoked", &revoked, &inter, None, &today).await;

    let root_pem = dir.path().join("root.pem");
    std::fs::write(&root_pem, pem("CERTIFICATE", &root.der)).unwrap();
    let tsa_pem = dir.path().join("tsa.pem");
    std::fs::write(&tsa_pem, pem("CERTIFICATE", &tsa.tsa_root)).unwrap();
    let policy = format!(
        "apiVersion: sigil.dev/v1alpha1\nkind: ImagePolicy\nmetadata: {{name: notation-trust}}\nspec:\n  registries:\n    - {{host: \"{h}\", insecure: true}}\n  rules:\n    - name: signed\n      match: [\"{h}/n/**\"]\n      verify:\n        - name: release\n          notation:\n            trustRoots: [\"{}\"]\n            tsaRoots: [\"{}\"]\n            trustedIdentities: [\"x509.subject: C=US, ST=WA, O=acme\"]\n",
        root_pem.display(),
        tsa_pem.display()
    );
    // The CA's CRL server is on loopback: allowed here, as a platform
    // would allow its own internal CA (refused by default).
    let sigil = Sigil::start(Some(&policy), &["--crl-allow-networks", "127.0.0.0/8"]).await;
    let api = sigil.apiserver();
    // The first admission asks for CRLs nobody fetched yet: denied as
    // unknown at once (no fetch on the admission path), then admitted
    // when the background fetcher has them.
    let first = api.create_pod("team", &[&format!("{h}/n/app:v1")]).await;
    assert!(!first.allowed);
    assert!(
        first.message.contains("revocation status unknown")
            && first.message.contains("not fetched yet"),
        "{}",
        first.message
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let a = api.create_pod("team", &[&format!("{h}/n/app:v1")]).await;
        if a.allowed {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "never admitted: {}",
            a.message
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(cdp.hits.load(std::sync::atomic::Ordering::Relaxed) >= 2);
    // Expired certificate, countersigned while it was valid.
    let a = api.create_pod("team", &[&format!("{h}/n/old:v1")]).await;
    assert!(a.allowed, "{}", a.message);
    // Another organisation under the same CA.
    let a = api
        .create_pod("team", &[&format!("{h}/n/stranger:v1")])
        .await;
    assert!(!a.allowed);
    assert!(
        a.message.contains("identity mismatch") && a.message.contains("O=evil"),
        "{}",
        a.message
    );
    // A revoked signer.
    let a = api
        .create_pod("team", &[&format!("{h}/n/revoked:v1")])
        .await;
    assert!(!a.allowed);
    assert!(
        a.message.contains("revoked:") && a.message.contains("inter.crl"),
        "{}",
        a.message
    );
    let m = sigil.metrics().await;
    assert!(m.contains("sigil_crl_fetch_total{result=\"ok\"}"), "{m}");
    assert!(
        m.contains("sigil_crl_next_update_timestamp_seconds{url="),
        "{m}"
    );

    // The CLI has no background fetcher: it fetches what the check asked for.
    let policy_path = dir.path().join("policy.yaml");
    std::fs::write(&policy_path, &policy).unwrap();
    let p = policy_path.display().to_string();
    let out = tokio::task::spawn_blocking(move || {
        let verify = |image: String| {
            run_sigil(
                &[
                    "verify",
                    "--policy",
                    &p,
                    &image,
                    "--crl-allow-networks",
                    "127.0.0.0/8",
                ],
                None,
            )
        };
        let ok = verify(format!("{h}/n/app:v1"));
        let bad = verify(format!("{h}/n/revoked:v1"));
        (ok, bad)
    })
    .await
    .unwrap();
    let text = String::from_utf8_lossy(&out.0.stdout);
    assert!(
        out.0.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.0.stderr)
    );
    let text = String::from_utf8_lossy(&out.1.stdout);
    assert_eq!(out.1.status.code(), Some(1), "{text}");
    assert!(text.contains("revoked:"), "{text}");
}
