//! Reading a registry's answers: distribution-spec error bodies and HTTP
//! statuses turned into typed [`ResolveFailure`]s, and the platform's
//! manifest picked out of an index. Pure functions over bytes and headers.

use std::time::Duration;

use http::{HeaderMap, StatusCode, header};
use sigil_core::{Digest, Platform, ResolveFailure};

/// `CODE: message` of the first error in a distribution-spec error body.
pub(crate) fn error_detail(body: &[u8]) -> Option<String> {
    let v: serde_json::Value = serde_json::from_slice(body).ok()?;
    let e = v.get("errors")?.get(0)?;
    let code = e.get("code").and_then(|c| c.as_str()).unwrap_or("");
    let msg = e.get("message").and_then(|c| c.as_str()).unwrap_or("");
    let mut s = format!("{code}: {msg}");
    s.truncate(200);
    Some(s)
}

/// `Retry-After` in seconds (the HTTP-date form is not used by registries).
pub(crate) fn retry_after(h: &HeaderMap) -> Option<Duration> {
    h.get(header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(|s| s.trim().parse::<u64>().ok())
        .map(Duration::from_secs)
}

/// A registry's answer, read whole (manifests and errors are small).
pub(crate) struct Resp {
    pub(crate) status: StatusCode,
    pub(crate) headers: HeaderMap,
    pub(crate) body: Vec<u8>,
}

pub(crate) fn failure_for(r: &Resp) -> ResolveFailure {
    let detail = error_detail(&r.body).unwrap_or_else(|| {
        r.status
            .canonical_reason()
            .unwrap_or("no reason given")
            .to_lowercase()
    });
    match r.status {
        StatusCode::NOT_FOUND => ResolveFailure::NotFound { detail },
        StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => ResolveFailure::Unauthorized {
            status: r.status.as_u16(),
            detail,
        },
        StatusCode::TOO_MANY_REQUESTS => ResolveFailure::RateLimited {
            retry_after: retry_after(&r.headers),
        },
        s => ResolveFailure::Status {
            status: s.as_u16(),
            detail,
        },
    }
}

/// Picks the platform's manifest from an index (its runnable entries, as
/// [`sigil_core::verify::platforms::runnable_entries`] reads them); a
/// single-platform manifest is taken as is (its platform lives in a config
/// blob sigil does not fetch).
pub fn pick_platform(body: &[u8], p: &Platform, own: Digest) -> Result<Digest, ResolveFailure> {
    let entries = sigil_core::verify::platforms::runnable_entries(body).map_err(|e| {
        ResolveFailure::BadResponse {
            detail: format!("manifest is not JSON: {e}"),
        }
    })?;
    let Some(entries) = entries else {
        return Ok(own);
    };
    let norm_variant = |arch: &str, v: Option<&str>| -> Option<String> {
        // containerd's normalization: arm64 defaults to v8, arm to v7.
        match (arch, v) {
            (_, Some(v)) if !v.is_empty() => Some(v.to_owned()),
            ("arm64", _) => Some("v8".into()),
            ("arm", _) => Some("v7".into()),
            _ => None,
        }
    };
    let want_v = norm_variant(&p.architecture, p.variant.as_deref());
    let mut seen = Vec::new();
    for e in &entries {
        let Some(ep) = &e.platform else { continue };
        seen.push(ep.to_string());
        if ep.os == p.os
            && ep.architecture == p.architecture
            && norm_variant(&ep.architecture, ep.variant.as_deref()) == want_v
        {
            return Digest::parse(&e.digest).map_err(|err| ResolveFailure::BadResponse {
                detail: format!("index entry digest {:?}: {err}", e.digest),
            });
        }
    }
    Err(ResolveFailure::PlatformNotFound {
        platform: p.to_string(),
        available: seen,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn platform_pick_normalizes_variants_and_skips_attestations() {
        let idx = br#"{"schemaVersion":2,"mediaType":"application/vnd.oci.image.index.v1+json","manifests":[
          {"digest":"sha256:1111111111111111111111111111111111111111111111111111111111111111","platform":{"os":"linux","architecture":"amd64"}},
          {"digest":"sha256:2222222222222222222222222222222222222222222222222222222222222222","platform":{"os":"linux","architecture":"arm64","variant":"v8"}},
          {"digest":"sha256:3333333333333333333333333333333333333333333333333333333333333333","platform":{"os":"unknown","architecture":"unknown"}}]}"#;
        let own = Digest::parse(
            "sha256:0000000000000000000000000000000000000000000000000000000000000000",
        )
        .unwrap();
        let arm = Platform::parse("linux/arm64").unwrap();
        assert!(
            pick_platform(idx, &arm, own.clone())
                .unwrap()
                .as_str()
                .starts_with("sha256:2222")
        );
        let s390 = Platform::parse("linux/s390x").unwrap();
        match pick_platform(idx, &s390, own.clone()) {
            Err(ResolveFailure::PlatformNotFound { available, .. }) => {
                assert_eq!(available, ["linux/amd64", "linux/arm64/v8"])
            }
            other => panic!("{other:?}"),
        }
        let single = br#"{"schemaVersion":2,"config":{}}"#;
        assert_eq!(pick_platform(single, &arm, own.clone()).unwrap(), own);
        assert!(pick_platform(b"not json", &arm, own).is_err());
    }

    #[test]
    fn error_bodies() {
        assert_eq!(
            error_detail(
                br#"{"errors":[{"code":"MANIFEST_UNKNOWN","message":"manifest unknown"}]}"#
            )
            .unwrap(),
            "MANIFEST_UNKNOWN: manifest unknown"
        );
        assert_eq!(error_detail(b"<html>"), None);
    }
}
