//! Turning a policy document into a [`Policy`]: every check that refuses a
//! policy lives here, each naming the offending line when it is known.

use super::{
    API_VERSION, Action, CLUSTER_KIND, ImagePolicyDoc, KIND, Mirror, MirrorSpec, Platform, Policy,
    PolicyError, Rule, invalid,
};
use crate::denial::Mode;
use crate::pattern::{Pattern, PatternError, Specificity};
use crate::reference;

impl Policy {
    /// Turns the document into a policy, or says which value is wrong.
    pub fn compile(doc: ImagePolicyDoc) -> Result<Policy, PolicyError> {
        if doc.api_version.value != API_VERSION {
            return Err(invalid(
                &doc.api_version,
                format!(
                    "apiVersion is {:?}; this sigil reads {API_VERSION:?}",
                    doc.api_version.value
                ),
            ));
        }
        if doc.kind.value != KIND && doc.kind.value != CLUSTER_KIND {
            return Err(invalid(
                &doc.kind,
                format!(
                    "kind is {:?}; expected {KIND:?} or {CLUSTER_KIND:?}",
                    doc.kind.value
                ),
            ));
        }
        let spec = doc.spec;
        let mirrors = compile_mirrors(&spec.mirrors)?;
        let platform = match spec.pin.platform.value.trim() {
            "" => None,
            p => Some(Platform::parse(p).ok_or_else(|| {
                invalid(
                    &spec.pin.platform,
                    format!("platform {p:?} is not os/arch[/variant], e.g. linux/amd64"),
                )
            })?),
        };
        let cache_ttl =
            humantime::parse_duration(spec.pin.cache_ttl.value.trim()).map_err(|e| {
                invalid(
                    &spec.pin.cache_ttl,
                    format!(
                        "cacheTTL {:?} is not a duration like 5m or 30s: {e}",
                        spec.pin.cache_ttl.value
                    ),
                )
            })?;
        let mut seen_hosts = std::collections::HashSet::new();
        let mut registries = spec.registries;
        for r in &mut registries {
            // Names never carry the legacy Docker Hub host; settings for it
            // must apply to `docker.io` names.
            r.host = reference::canonical_domain(&r.host).to_owned();
            reference::validate_domain(&r.host).map_err(|_| PolicyError::Invalid {
                line: None,
                message: format!("registries: host {:?} is not host[:port]", r.host),
            })?;
            if !seen_hosts.insert(r.host.clone()) {
                return Err(PolicyError::Invalid {
                    line: None,
                    message: format!("registries: host {:?} is listed twice", r.host),
                });
            }
            if let Some(a) = &r.auth {
                let basic = a.username.is_some() || a.password_file.is_some();
                if basic && a.docker_config.is_some() {
                    return Err(PolicyError::Invalid {
                        line: None,
                        message: format!(
                            "registries: {}: give either username/passwordFile or dockerConfig, not both",
                            r.host
                        ),
                    });
                }
                if a.username.is_some() != a.password_file.is_some() {
                    return Err(PolicyError::Invalid {
                        line: None,
                        message: format!(
                            "registries: {}: username and passwordFile go together",
                            r.host
                        ),
                    });
                }
            }
        }
        let mut rules = Vec::with_capacity(spec.rules.len());
        let mut names = std::collections::HashSet::new();
        for r in &spec.rules {
            if r.name.value.trim().is_empty() {
                return Err(invalid(&r.name, "rule name must not be empty"));
            }
            if !names.insert(r.name.value.clone()) {
                return Err(invalid(
                    &r.name,
                    format!("rule name {:?} is used twice", r.name.value),
                ));
            }
            if r.patterns.is_empty() {
                return Err(invalid(
                    &r.name,
                    format!("rule {:?} has an empty match list", r.name.value),
                ));
            }
            let mut patterns = Vec::with_capacity(r.patterns.len());
            for p in &r.patterns {
                patterns.push(
                    Pattern::parse(&p.value)
                        .map_err(|e: PatternError| invalid(p, e.to_string()))?,
                );
            }
            let action = r.action.unwrap_or_default();
            let has_verify = !r.verify.is_empty();
            let has_attestations = !r.attestations.is_empty();
            if !has_verify && (r.threshold.is_some() || !r.required.is_empty()) {
                return Err(invalid(
                    &r.name,
                    format!(
                        "rule {:?}: threshold and required need a verify list",
                        r.name.value
                    ),
                ));
            }
            if !has_verify && !has_attestations && r.signatures.is_some() {
                return Err(invalid(
                    &r.name,
                    format!(
                        "rule {:?}: signatures needs a verify or attestations list",
                        r.name.value
                    ),
                ));
            }
            if (has_verify || has_attestations) && action != Action::Pin {
                return Err(invalid(
                    &r.name,
                    format!(
                        "rule {:?}: verify and attestations check the pinned digest, which needs action: pin (the default)",
                        r.name.value
                    ),
                ));
            }
            let verification = super::requirements::verification(r)?;
            let namespace_selector = r
                .namespace_selector
                .as_ref()
                .map(super::Selector::compile)
                .transpose()
                .map_err(|m| invalid(&r.name, format!("rule {:?}: {m}", r.name.value)))?;
            let exceptions = r
                .exceptions
                .as_ref()
                .map(super::schema::ExceptionsSpec::allowance)
                .transpose()
                .map_err(|m| invalid(&r.name, format!("rule {:?}: {m}", r.name.value)))?
                .flatten();
            rules.push(Rule {
                exceptions,
                name: r.name.value.clone(),
                patterns,
                mode: r.mode.unwrap_or(Mode::Enforce),
                action,
                description: r.description.clone(),
                verification,
                namespace_selector,
                source: (doc.kind.value == CLUSTER_KIND && !doc.metadata.name.is_empty())
                    .then(|| format!("{CLUSTER_KIND} {}", doc.metadata.name)),
            });
        }
        let order = specificity_order(
            &rules
                .iter()
                .map(|r| (r.patterns.as_slice(), r.namespace_selector.is_some()))
                .collect::<Vec<_>>(),
        )
        .map_err(|(ri, pi, b, pa, pb)| {
            invalid(
                &spec.rules[ri].patterns[pi],
                format!(
                    "rules {:?} ({pa}) and {:?} ({pb}) are equally specific and can match the same image; make one more specific",
                    rules[ri].name, rules[b].name
                ),
            )
        })?;
        let index = super::plan::index_of(&rules, &order);
        for n in &spec.exempt_namespaces {
            if let Some(why) = not_a_namespace_name(n) {
                return Err(PolicyError::Invalid {
                    line: None,
                    message: format!(
                        "exemptNamespaces: {n:?} {why}; each entry is one namespace's name (a DNS label: lowercase letters, digits and '-', starting and ending with a letter or digit, at most 63 characters). Patterns are not supported: list each namespace, or label it sigil.dev/ignore"
                    ),
                });
            }
        }
        let mut node_admits = Vec::with_capacity(spec.node_admits.len());
        for p in &spec.node_admits {
            node_admits.push(
                Pattern::parse(&p.value)
                    .map_err(|e: PatternError| invalid(p, format!("nodeAdmits: {e}")))?,
            );
        }
        let extractors = crate::walker::Extractors::defaults()
            .with(
                &spec.image_extractors,
                &format!("{} {}", doc.kind.value, doc.metadata.name),
            )
            .map_err(|message| PolicyError::Invalid {
                line: None,
                message,
            })?;
        Ok(Policy {
            plans: Default::default(),
            index,
            node_admits,
            extractors: std::sync::Arc::new(extractors),
            name: doc.metadata.name,
            mirrors,
            registries,
            scope: spec.pin.scope,
            platform,
            cache_ttl,
            rules,
            order,
            exempt_namespaces: spec.exempt_namespaces,
            namespaced: Default::default(),
            exceptions: Default::default(),
        })
    }
}

/// The first tie in rule order (what comparing every pair would find), found
/// without comparing every pair: two patterns can only meet when one's
/// literal prefix lies on or under the other's, so patterns are grouped by
/// (specificity, selector), sorted by prefix, and each is compared only with
/// the ones that follow it under its prefix. A policy of 60,000 team rules
/// (`registry/teamN/**`) loads in well under a second instead of minutes.
fn first_tie(rules: &[(&[Pattern], bool)]) -> Option<Tie> {
    // (specificity, selector, prefix, rule, pattern)
    let mut entries: Vec<(Specificity, bool, String, usize, usize)> = rules
        .iter()
        .enumerate()
        .flat_map(|(ri, (ps, sel))| {
            ps.iter()
                .enumerate()
                .map(move |(pi, p)| (p.specificity(), *sel, p.literal_prefix(), ri, pi))
        })
        .collect();
    entries.sort();
    let mut best: Option<(usize, usize, usize, usize)> = None;
    for (i, a) in entries.iter().enumerate() {
        for b in &entries[i + 1..] {
            if b.0 != a.0 || b.1 != a.1 || !b.2.starts_with(a.2.as_str()) {
                break;
            }
            if b.3 == a.3 || !super::plan::under(&b.2, &a.2) && !a.2.is_empty() {
                continue;
            }
            let (x, y) = if a.3 < b.3 { (a, b) } else { (b, a) };
            let (pa, pb) = (&rules[x.3].0[x.4], &rules[y.3].0[y.4]);
            if pa.overlaps(pb) {
                let key = (x.3, y.3, x.4, y.4);
                if best.is_none_or(|b| key < b) {
                    best = Some(key);
                }
            }
        }
    }
    best.map(|(ri, bi, pi, pbi)| {
        (
            ri,
            pi,
            bi,
            rules[ri].0[pi].normalized().to_owned(),
            rules[bi].0[pbi].normalized().to_owned(),
        )
    })
}

/// A tie: (rule a, its pattern index, rule b, pattern a, pattern b).
pub(super) type Tie = (usize, usize, usize, String, String);

/// (rule, pattern) pairs sorted most specific first, or the first tie: two
/// rules whose equally specific patterns can match one name. At equal
/// pattern specificity a rule with a namespace selector comes first (it is
/// the more specific where it applies), so only two rules that both have, or
/// both lack, a selector can tie.
pub(super) fn specificity_order(rules: &[(&[Pattern], bool)]) -> Result<Vec<(usize, usize)>, Tie> {
    if let Some(t) = first_tie(rules) {
        return Err(t);
    }
    let mut order: Vec<(usize, usize)> = rules
        .iter()
        .enumerate()
        .flat_map(|(ri, (r, _))| (0..r.len()).map(move |pi| (ri, pi)))
        .collect();
    order.sort_by(|&(ra, pa), &(rb, pb)| {
        (rules[rb].0[pb].specificity(), rules[rb].1)
            .cmp(&(rules[ra].0[pa].specificity(), rules[ra].1))
    });
    Ok(order)
}

fn compile_mirrors(specs: &[MirrorSpec]) -> Result<Vec<Mirror>, PolicyError> {
    let mut out: Vec<Mirror> = Vec::with_capacity(specs.len());
    for m in specs {
        let from = normalize_prefix(&m.from.value)
            .map_err(|e| invalid(&m.from, format!("mirror from {:?}: {e}", m.from.value)))?;
        let listed = m.to.value.list();
        if listed.is_empty() {
            return Err(invalid(
                &m.to,
                format!("mirror from {from:?}: to lists no mirror"),
            ));
        }
        let mut targets: Vec<String> = Vec::with_capacity(listed.len());
        for t in listed {
            let to =
                normalize_prefix(t).map_err(|e| invalid(&m.to, format!("mirror to {t:?}: {e}")))?;
            if targets.contains(&to) || out.iter().any(|o| o.targets().any(|x| x == to)) {
                return Err(invalid(
                    &m.to,
                    format!(
                        "mirror to {to:?} is used twice, so a mirrored name could not be mapped back to one origin"
                    ),
                ));
            }
            targets.push(to);
        }
        if out.iter().any(|o| o.from == from) {
            return Err(invalid(
                &m.from,
                format!("mirror from {from:?} is listed twice"),
            ));
        }
        let fallback = m.fallback == Some(super::schema::Fallback::Origin);
        let to = targets.remove(0);
        let failover = super::Failover {
            from: from.clone(),
            alternates: targets,
            fallback,
            require_same_digest: m.require_same_digest.unwrap_or(fallback),
            copy: m.copy,
        };
        let fails_over = !failover.alternates.is_empty() || failover.resolves_origin();
        out.push(Mirror {
            failover: fails_over.then(|| std::sync::Arc::new(failover)),
            from,
            to,
        });
    }
    for a in &out {
        for t in a.targets() {
            if let Some(b) = out.iter().find(|b| super::plan::under(t, &b.from)) {
                return Err(PolicyError::Invalid {
                    line: specs
                        .iter()
                        .find(|s| {
                            normalize_prefix(&s.from.value).ok().as_deref() == Some(a.from.as_str())
                        })
                        .map(|s| s.to.referenced.line())
                        .filter(|l| *l > 0),
                    message: format!(
                        "mirror target {t:?} lies under mirror origin {:?}; chained mirrors are not supported",
                        b.from
                    ),
                });
            }
        }
    }
    out.sort_by_key(|m| std::cmp::Reverse(m.from.len()));
    Ok(out)
}

/// A mirror prefix is a host or host/path, validated with the reference grammar.
fn normalize_prefix(p: &str) -> Result<String, String> {
    let p = p.trim().trim_end_matches('/');
    let (host, path) = match p.split_once('/') {
        Some((h, rest)) => (h, Some(rest)),
        None => (p, None),
    };
    let host = reference::canonical_domain(host);
    reference::validate_domain(host).map_err(|e| e.to_string())?;
    if !host.contains(['.', ':']) && host != "localhost" {
        return Err(
            "the first segment must be a registry host (with a dot or a port, or localhost)".into(),
        );
    }
    if let Some(path) = path {
        if let Some(bad) = path.split('/').find(|c| !reference::is_path_component(c)) {
            return Err(format!("invalid path component {bad:?}"));
        }
        return Ok(format!("{host}/{path}"));
    }
    Ok(host.to_owned())
}

/// Why `n` is no namespace name (RFC 1123 label, as the API server checks
/// it, so the backstop's namespace selector is one it takes).
fn not_a_namespace_name(n: &str) -> Option<&'static str> {
    let b = n.as_bytes();
    let ok = |c: &u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    if b.is_empty() {
        Some("is empty")
    } else if b.len() > 63 {
        Some("is longer than 63 characters")
    } else if !b.iter().all(|c| ok(c) || *c == b'-') {
        Some("has a character a namespace name cannot have")
    } else if !ok(&b[0]) || !ok(&b[b.len() - 1]) {
        Some("must start and end with a letter or digit")
    } else {
        None
    }
}
