//! Docker Hub's many names, in one place. Image references, patterns,
//! mirror prefixes, registry settings and credentials all fold these
//! spellings into `docker.io` here, so no rule can be side-stepped by
//! writing Docker Hub another way, and the registry client knows where its
//! API really answers.

use crate::reference::DEFAULT_DOMAIN;

/// Every host name Docker Hub's registry goes by. This is the one list:
/// image names, patterns, mirror prefixes, registry settings and
/// credentials all fold these into [`DEFAULT_DOMAIN`] through
/// [`canonical_domain`], so no spelling of Docker Hub slips past a rule.
/// (Go's grammar folds only `index.docker.io`; sigil folds them all,
/// because a policy must match what is pulled, however it is spelled.)
pub const DOCKER_HUB_ALIASES: &[&str] = &[
    DEFAULT_DOMAIN,
    "index.docker.io",
    "registry-1.docker.io",
    "registry.hub.docker.com",
];
/// Where Docker Hub's registry API answers.
pub const DOCKER_HUB_API_HOST: &str = "registry-1.docker.io";

/// Whether `host` is one of Docker Hub's names (case-insensitive, as DNS is).
pub fn is_docker_hub(host: &str) -> bool {
    DOCKER_HUB_ALIASES
        .iter()
        .any(|a| a.eq_ignore_ascii_case(host))
}

/// `host`, with any Docker Hub alias folded into [`DEFAULT_DOMAIN`].
pub fn canonical_domain(host: &str) -> &str {
    if is_docker_hub(host) {
        DEFAULT_DOMAIN
    } else {
        host
    }
}

/// The host that serves the registry API for a (canonical) domain.
pub fn api_host(domain: &str) -> &str {
    if is_docker_hub(domain) {
        DOCKER_HUB_API_HOST
    } else {
        domain
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reference::Reference;

    #[test]
    fn every_docker_hub_alias_is_one_name() {
        for alias in DOCKER_HUB_ALIASES {
            let r = Reference::parse(&format!("{alias}/library/nginx:1")).unwrap();
            assert_eq!(r.to_string(), "docker.io/library/nginx:1", "{alias}");
            let r = Reference::parse(&format!("{alias}/nginx")).unwrap();
            assert_eq!(r.name(), "docker.io/library/nginx", "{alias}");
            assert_eq!(canonical_domain(alias), DEFAULT_DOMAIN);
            assert_eq!(api_host(alias), DOCKER_HUB_API_HOST);
        }
        assert!(is_docker_hub("Registry-1.Docker.IO"));
        assert_eq!(canonical_domain("ghcr.io"), "ghcr.io");
        assert_eq!(api_host("ghcr.io"), "ghcr.io");
    }
}
