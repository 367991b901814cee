//! The real-API tier never sends traffic off this machine. Its API server
//! runs with `--enable-aggregator-routing=true`, so a webhook registered by
//! Service (as the chart and the base ship it) is resolved through the
//! Service's Endpoints, never dialled at its ClusterIP (10.0.0.x, which no
//! kube-proxy here would catch): a test that forgets to point the webhook at
//! loopback fails at once with the API server's own message.

use std::time::{Duration, Instant};

use super::{namespaces_with_accounts, pod};
use crate::support::kube::real::{RealKube, assets_or_skip};
use crate::support::sockets::{is_local, tcp_peers};

/// The base applied exactly as shipped (`clientConfig.service`, not
/// rewritten), then a Pod in a namespace sigil guards: refused within 10 s
/// with "no endpoints available for service \"sigil\"", the API server's
/// log names no 10.x address and every socket it holds is on loopback.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regression_a_service_referenced_webhook_is_refused_at_once_without_leaving_the_machine() {
    let test =
        "regression_a_service_referenced_webhook_is_refused_at_once_without_leaving_the_machine";
    let Some(assets) = assets_or_skip(test) else {
        return;
    };
    let kube = RealKube::start(&assets).await;
    let base = crate::deploy::render("base");
    let mwc = base
        .iter()
        .find(|o| o["kind"] == "MutatingWebhookConfiguration")
        .expect("the base registers a webhook");
    assert!(
        mwc["webhooks"][0]["clientConfig"]["service"].is_object(),
        "the base registers its webhook by Service: {mwc}"
    );
    kube.apply(&base).await;
    namespaces_with_accounts(&kube, &["shop"]).await;
    let started = Instant::now();
    let (status, refused) = kube
        .request(
            "POST",
            "/api/v1/namespaces/shop/pods",
            Some(&pod("shop", "web", "registry.example.com/shop/app:1.0")),
        )
        .await;
    let took = started.elapsed();
    let message = refused["message"].as_str().unwrap_or_default();
    assert_ne!(status, 201, "admitted without sigil: {refused}");
    assert!(
        message.contains(r#"no endpoints available for service "sigil""#),
        "{status} {refused}\n{}",
        kube.logs()
    );
    assert!(
        took < Duration::from_secs(10),
        "refused only after {took:?}"
    );
    // An address it dialled would be logged as `10.0.0.N:PORT` (the
    // Service range itself, `10.0.0.0/24`, is logged at start).
    let log = kube.apiserver_log();
    let dialled = |l: &&str| {
        l.match_indices("10.0.0.").any(|(at, m)| {
            let rest = &l[at + m.len()..];
            let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
            digits > 0 && rest[digits..].starts_with(':')
        })
    };
    let off = log.lines().find(dialled);
    assert!(
        off.is_none(),
        "the API server dialled a Service address: {off:?}"
    );
    let peers = tcp_peers(kube.apiserver_pid());
    assert!(!peers.is_empty(), "no sockets read for the API server");
    let away: Vec<_> = peers.iter().filter(|p| !is_local(p)).collect();
    assert!(
        away.is_empty(),
        "the API server holds sockets off the machine: {away:?}"
    );
}
