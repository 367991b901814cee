//! The policy in plain words, as `sigil policy check` prints it: what each
//! mirror, registry setting and rule means, in the order they apply.

use std::fmt::Write as _;

use super::{Action, Policy, Scope};
use crate::denial::Mode;
use crate::pattern::Pattern;

impl Policy {
    /// Plain-words rendering: one line per mirror and registry, one per rule
    /// (and its signature requirement), and what happens to everything else.
    pub fn describe(&self) -> String {
        let p = self;
        let mut s = String::new();
        let name = if p.name.is_empty() {
            "(unnamed)"
        } else {
            &p.name
        };
        let _ = writeln!(s, "policy {name:?} is valid.\n");
        if p.mirrors.is_empty() {
            let _ = writeln!(s, "mirrors: none; images are pulled from where they name.");
        } else {
            let _ = writeln!(
                s,
                "mirrors (applied first; the longest matching origin wins):"
            );
            for m in &p.mirrors {
                let _ = writeln!(
                    s,
                    "  {}/… is pulled from {}/… (and {}/… is read back as {}/… for rule matching)",
                    m.from, m.to, m.to, m.from
                );
                for a in m.alternates() {
                    let _ = writeln!(
                        s,
                        "    else from {a}/…, when the mirrors before it lack the image or fail"
                    );
                }
                if m.fallback_origin() {
                    let _ = writeln!(
                        s,
                        "    else from {}/… itself, with a warning (fallback: origin)",
                        m.from
                    );
                }
                if m.copy() {
                    let _ = writeln!(
                        s,
                        "    an image {} lacks is copied into it from {} on admission (copy: true)",
                        m.to, m.from
                    );
                }
                if m.require_same_digest() {
                    let _ = writeln!(
                        s,
                        "    a mirror whose digest for a tag differs from {}'s is refused (requireSameDigest)",
                        m.from
                    );
                }
            }
        }
        if !p.registries.is_empty() {
            let _ = writeln!(s, "registries:");
            for r in &p.registries {
                let mut parts = vec![if r.insecure {
                    "plain HTTP (insecure: true)".to_owned()
                } else {
                    "HTTPS".to_owned()
                }];
                if let Some(ca) = &r.ca {
                    parts.push(format!(
                        "extra CA {}",
                        if ca.contains("-----BEGIN") {
                            "(inline PEM)"
                        } else {
                            ca
                        }
                    ));
                }
                parts.push(match &r.auth {
                    Some(a) => credentials(a),
                    None => "anonymous".into(),
                });
                if let Some(a) = &r.push_auth {
                    parts.push(format!(
                        "pushes (copies into mirrors) as {}",
                        credentials(a)
                    ));
                }
                let _ = writeln!(s, "  {}: {}", r.host, parts.join(", "));
            }
        }
        let scope = match p.scope {
            Scope::Workloads => "every object with pod-spec image fields is patched",
            Scope::Pods => "only Pods are patched; other workloads are checked but left as written",
        };
        let platform = p
            .platform
            .as_ref()
            .map(|x| format!("the {x} manifest's digest"))
            .unwrap_or_else(|| "the index digest (all platforms)".into());
        let _ = writeln!(
            s,
            "pinning: {scope}; tags are pinned to {platform}; digests are cached for {}.",
            humantime::format_duration(p.cache_ttl)
        );
        let _ = writeln!(s, "rules (the most specific matching pattern wins):");
        for r in &p.rules {
            let pats: Vec<&str> = r.patterns.iter().map(|x| x.normalized()).collect();
            let what = match r.action {
                Action::Deny => "are denied".to_owned(),
                Action::Allow => "are admitted as written, without pinning".to_owned(),
                Action::Pin => format!(
                    "are pinned to a digest; if that fails they are {}",
                    if r.mode == Mode::Enforce {
                        "denied (enforce)"
                    } else {
                        "admitted unchanged with a warning (warn)"
                    }
                ),
            };
            let _ = writeln!(
                s,
                "  {}: images matching {} {what}",
                r.name,
                pats.join(", ")
            );
            if let Some(v) = r.verification.as_ref().filter(|v| !v.verifiers.is_empty()) {
                let names: Vec<&str> = v.verifiers.iter().map(|x| x.name.as_str()).collect();
                let _ = writeln!(
                    s,
                    "    and their pinned digest must be signed: at least {} of {}{}; signatures are read from {}",
                    v.threshold,
                    names.join(", "),
                    if v.required.is_empty() {
                        String::new()
                    } else {
                        format!(", including {}", v.required.join(", "))
                    },
                    v.signatures_repository.as_ref().map_or_else(
                        || "the repository the image is pulled from".into(),
                        |r| r.to_string()
                    )
                );
                let at = match v.signed_at {
                    crate::verify::SignedAt::Index => None,
                    crate::verify::SignedAt::Platforms => {
                        Some("on each platform's manifest (the index's own are not needed)")
                    }
                    crate::verify::SignedAt::Both => {
                        Some("on the index and on each platform's manifest")
                    }
                    crate::verify::SignedAt::Either => {
                        Some("on the index, or else on each platform's manifest")
                    }
                };
                if let Some(at) = at {
                    let _ = writeln!(s, "    for a multi-platform index, signed {at}");
                }
            }
            for a in r.verification.iter().flat_map(|v| &v.attestations) {
                let _ = writeln!(
                    s,
                    "    and it must carry {}",
                    crate::verify::attestations::describe(a)
                );
            }
            if let Some(max) = r.exceptions {
                let _ = writeln!(
                    s,
                    "    a team may waive it with an ImagePolicyException lasting at most {}",
                    humantime::format_duration(max)
                );
            }
            if let Some(d) = &r.description {
                let _ = writeln!(s, "    {d}");
            }
        }
        let _ = writeln!(s, "  any other image is denied: no rule matches it.");
        if p.exempt_namespaces.is_empty() {
            let _ = writeln!(s, "exempt namespaces: none");
        } else {
            let _ = writeln!(
                s,
                "exempt namespaces (requests pass untouched): {}",
                p.exempt_namespaces.join(", ")
            );
        }
        if !p.node_admits.is_empty() {
            let _ = writeln!(
                s,
                "admitted at every node's pull without a check (nodeAdmits; admission still applies the rules): {}",
                p.node_admits
                    .iter()
                    .map(Pattern::source)
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
        let _ = writeln!(
            s,
            "images in custom resources (imageExtractors; pod-shaped fields of every kind are found by shape):"
        );
        for e in p.extractors.list() {
            let paths = if e.paths.is_empty() {
                "off".to_owned()
            } else {
                e.paths
                    .iter()
                    .map(|x| x.text.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            let _ = writeln!(
                s,
                "  {} {} ({}; {}): {paths}",
                e.api_version(),
                e.kind,
                e.resource,
                e.source
            );
        }
        for t in p.namespaced.values().flatten() {
            let _ = writeln!(
                s,
                "\n{} (objects in namespace {} only; it can only refuse more, never admit what the rules above refuse; mode {}):",
                t.display_name(),
                t.namespace,
                t.mode.as_str()
            );
            for r in &t.rules {
                let what = if r.deny {
                    "refused".to_owned()
                } else if let Some(v) = r.verification.as_ref().filter(|v| !v.verifiers.is_empty())
                {
                    let names: Vec<&str> = v.verifiers.iter().map(|x| x.name.as_str()).collect();
                    format!(
                        "admitted only if signed: at least {} of {}",
                        v.threshold,
                        names.join(", ")
                    )
                } else {
                    "left to the cluster policy".to_owned()
                };
                let pats: Vec<&str> = r.patterns.iter().map(|x| x.normalized()).collect();
                let _ = writeln!(s, "  rule {:?}: {} is {what}", r.name, pats.join(", "));
                for a in r.verification.iter().flat_map(|v| &v.attestations) {
                    let _ = writeln!(
                        s,
                        "    and it must carry {}",
                        crate::verify::attestations::describe(a)
                    );
                }
            }
            let _ = writeln!(
                s,
                "  any other image: {}",
                match t.default_action {
                    super::DefaultAction::Allow => "left to the cluster policy",
                    super::DefaultAction::Deny => "refused (defaultAction: deny, an allow-list)",
                }
            );
        }
        for e in p.exceptions.values().flatten() {
            let rules: Vec<String> = e
                .rules
                .iter()
                .map(|r| format!("{} rule {}", r.policy, r.rule))
                .collect();
            let _ = writeln!(
                s,
                "\n{}: waives {} for its namespace's images until {} ({}{})",
                e.display_name(),
                rules.join(", "),
                e.expires_text,
                e.reason,
                e.ticket
                    .as_deref()
                    .map(|t| format!(", ticket {t}"))
                    .unwrap_or_default()
            );
        }
        s
    }
}

/// Where an `auth` or `pushAuth` block takes its credentials from (never
/// the secret itself).
fn credentials(a: &super::schema::AuthSpec) -> String {
    match &a.docker_config {
        Some(path) => format!("credentials from docker config {path}"),
        None => format!(
            "user {} with password from {}",
            a.username.as_deref().unwrap_or_default(),
            a.password_file.as_deref().unwrap_or_default()
        ),
    }
}
