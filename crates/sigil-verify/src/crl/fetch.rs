//! Fetching one CRL over HTTP, within the bounds a signer's certificate
//! must never lift: only `http://` distribution points, never an address
//! the platform did not allow (loopback, link-local, private and other
//! cluster-internal ranges are refused unless `--crl-allow-networks` names
//! them — checked on the URL's literal address and on every address its
//! host resolves to, at connect time), redirects only within the same host
//! (at most three), a time limit and a size limit. What went wrong on the
//! network is returned for the logs; the words a verification shows a
//! tenant are [`super`]'s and carry none of it.

use crate::FetchError;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use ipnet::IpNet;

/// The networks CRL fetches may reach beyond public addresses, for every
/// cache made after it is set (`sigil --crl-allow-networks`).
static ALLOWED: OnceLock<Vec<IpNet>> = OnceLock::new();

/// Sets the process-wide allow-list (once; the first call wins).
pub fn allow_networks(nets: Vec<IpNet>) {
    let _ = ALLOWED.set(nets);
}

/// The process-wide allow-list.
pub(super) fn allowed_by_default() -> Vec<IpNet> {
    ALLOWED.get().cloned().unwrap_or_default()
}

/// Whether `ip` is an address no CRL is fetched from unless allowed:
/// loopback, unspecified, link-local, private (RFC 1918, unique local),
/// carrier-grade NAT, benchmarking, multicast, broadcast, documentation.
pub fn is_internal(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => {
            let o = v4.octets();
            v4.is_loopback()
                || v4.is_unspecified()
                || v4.is_link_local()
                || v4.is_private()
                || v4.is_multicast()
                || v4.is_broadcast()
                || v4.is_documentation()
                || (o[0] == 100 && (o[1] & 0xc0) == 64)
                || (o[0] == 198 && (o[1] & 0xfe) == 18)
                || o[0] == 0
                || o[0] >= 240
        }
        IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return is_internal(IpAddr::V4(v4));
            }
            let s = v6.segments();
            v6.is_loopback()
                || v6.is_unspecified()
                || v6.is_multicast()
                || (s[0] & 0xfe00) == 0xfc00
                || (s[0] & 0xffc0) == 0xfe80
                || (s[0] == 0x2001 && s[1] == 0x0db8)
        }
    }
}

/// Whether a fetch may connect to `ip` under `allowed`.
pub fn may_connect(ip: IpAddr, allowed: &[IpNet]) -> bool {
    !is_internal(ip) || allowed.iter().any(|n| n.contains(&ip))
}

/// Resolves hosts for CRL fetches, keeping only addresses a fetch may reach.
struct Guarded {
    allowed: Arc<Vec<IpNet>>,
}

impl reqwest::dns::Resolve for Guarded {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let allowed = self.allowed.clone();
        Box::pin(async move {
            let host = name.as_str().to_owned();
            let all: Vec<SocketAddr> = tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            let kept: Vec<SocketAddr> = all
                .iter()
                .copied()
                .filter(|a| may_connect(a.ip(), &allowed))
                .collect();
            if kept.is_empty() && !all.is_empty() {
                return Err(format!(
                    "{host} resolves only to internal addresses ({}), which CRL fetches do not reach unless --crl-allow-networks names them",
                    all.iter().map(|a| a.ip().to_string()).collect::<Vec<_>>().join(", ")
                )
                .into());
            }
            let addrs: reqwest::dns::Addrs = Box::new(kept.into_iter());
            Ok(addrs)
        })
    }
}

/// The HTTP client CRL fetches use.
pub(super) fn client(allowed: Arc<Vec<IpNet>>, timeout: Duration) -> reqwest::Client {
    let for_redirects = allowed.clone();
    let redirects = reqwest::redirect::Policy::custom(move |attempt| {
        let first = attempt
            .previous()
            .first()
            .and_then(|u| u.host_str().map(str::to_owned));
        let next = attempt.url().clone();
        if attempt.previous().len() > 3 {
            return attempt.error("more than 3 redirects");
        }
        if next.scheme() != "http" || next.host_str().map(str::to_owned) != first {
            return attempt.error(format!(
                "redirected to another host or scheme ({next}); CRL fetches follow redirects only within the distribution point's host"
            ));
        }
        if let Some(ip) = literal_ip(&next)
            && !may_connect(ip, &for_redirects)
        {
            return attempt.error("redirected to an internal address");
        }
        attempt.follow()
    });
    reqwest::Client::builder()
        .timeout(timeout)
        .connect_timeout(timeout)
        .redirect(redirects)
        .dns_resolver(Arc::new(Guarded { allowed }))
        .build()
        .unwrap_or_default()
}

/// The URL's host, when it is an IP address (no resolver is asked then).
fn literal_ip(url: &reqwest::Url) -> Option<IpAddr> {
    match url.host()? {
        url::Host::Ipv4(v4) => Some(IpAddr::V4(v4)),
        url::Host::Ipv6(v6) => Some(IpAddr::V6(v6)),
        url::Host::Domain(_) => None,
    }
}

/// Fetches `url` (at most `max` bytes) with `client`, refusing what
/// [`may_connect`] refuses. The error is for the logs.
pub(super) async fn get(
    client: &reqwest::Client,
    allowed: &[IpNet],
    url: &str,
    max: usize,
) -> Result<Vec<u8>, FetchError> {
    let parsed = reqwest::Url::parse(url).map_err(|e| FetchError::Url {
        url: url.to_owned(),
        detail: e.to_string(),
    })?;
    if parsed.scheme() != "http" {
        return Err(FetchError::Scheme);
    }
    if let Some(ip) = literal_ip(&parsed)
        && !may_connect(ip, allowed)
    {
        return Err(FetchError::Internal(ip));
    }
    let resp = client
        .get(parsed)
        .send()
        .await
        .map_err(|e| FetchError::Transport {
            url: url.to_owned(),
            detail: crate::error_chain(&e),
        })?;
    if !resp.status().is_success() {
        return Err(FetchError::Status {
            url: url.to_owned(),
            status: resp.status().as_u16(),
        });
    }
    crate::read_capped(resp, max)
        .await
        .map_err(|e| FetchError::Transport {
            url: url.to_owned(),
            detail: e.to_string(),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn internal_ranges_are_refused_and_public_ones_allowed() {
        for ip in [
            "127.0.0.1",
            "10.1.2.3",
            "172.16.0.1",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "0.0.0.0",
            "::1",
            "fe80::1",
            "fd00::1",
            "::ffff:127.0.0.1",
        ] {
            assert!(is_internal(ip.parse().unwrap()), "{ip}");
        }
        for ip in ["8.8.8.8", "151.101.1.1", "2606:4700::1"] {
            assert!(!is_internal(ip.parse().unwrap()), "{ip}");
        }
        let lo: IpNet = "127.0.0.0/8".parse().unwrap();
        assert!(may_connect("127.0.0.1".parse().unwrap(), &[lo]));
        assert!(!may_connect("10.0.0.1".parse().unwrap(), &[lo]));
    }

    #[tokio::test]
    async fn each_refusal_is_its_own_variant() {
        let client = reqwest::Client::new();
        let none: &[IpNet] = &[];
        assert!(matches!(
            get(&client, none, "not a url", 10).await,
            Err(FetchError::Url { .. })
        ));
        assert_eq!(
            get(&client, none, "https://crl.example.com/a.crl", 10).await,
            Err(FetchError::Scheme)
        );
        assert_eq!(
            get(&client, none, "http://127.0.0.1:9/a.crl", 10).await,
            Err(FetchError::Internal("127.0.0.1".parse().unwrap()))
        );
    }
}
