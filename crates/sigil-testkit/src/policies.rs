//! Policies of a chosen size, shaped like a large platform's: what the
//! backstop's tests and benchmark grow (rules × mirrors), and Pods whose
//! every image such a policy admits. It decides nothing; sigil-core does.

/// A digest for images nobody pulls.
pub const DIGEST: &str = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

/// A ClusterImagePolicy-shaped policy file of `rules` rules and `mirrors`
/// mirrors: per ten rules, seven team prefixes (`registry.example.com/teamN/**`,
/// pinned, one a deny, one a warn, one an allow), one tag rule, one glob in
/// the path and one wildcard registry (what no index narrows). Mirror `m`
/// sends `registry.example.com/team{m}` to `mirror{m % 3}.example.com`;
/// every fifth has a second target and falls back to the origin.
pub fn large(rules: usize, mirrors: usize) -> String {
    let mut out = String::from(
        "apiVersion: sigil.dev/v1alpha1\nkind: ImagePolicy\nmetadata: {name: cluster}\nspec:\n",
    );
    if mirrors > 0 {
        out.push_str("  mirrors:\n");
    }
    for m in 0..mirrors {
        if m % 5 == 4 {
            out.push_str(&format!(
                "    - {{from: \"registry.example.com/team{m}\", to: [\"mirror{}.example.com/team{m}\", \"backup.example.com/team{m}\"], fallback: origin}}\n",
                m % 3
            ));
        } else {
            out.push_str(&format!(
                "    - {{from: \"registry.example.com/team{m}\", to: [\"mirror{}.example.com/team{m}\"]}}\n",
                m % 3
            ));
        }
    }
    out.push_str("  rules:\n");
    for i in 0..rules {
        let line = match i % 10 {
            7 => format!("{{name: tags-{i}, match: [\"quay.io/org{i}/app:v*\"], mode: enforce}}"),
            8 => format!("{{name: svc-{i}, match: [\"ghcr.io/org{i}/*-svc\"], mode: enforce}}"),
            9 => format!("{{name: ecr-{i}, match: [\"*.ecr{i}.example.com/**\"], mode: enforce}}"),
            3 => format!(
                "{{name: team-{i}, match: [\"registry.example.com/team{i}/**\"], action: deny}}"
            ),
            5 => format!(
                "{{name: team-{i}, match: [\"registry.example.com/team{i}/**\"], mode: warn}}"
            ),
            6 => format!(
                "{{name: team-{i}, match: [\"registry.example.com/team{i}/**\"], action: allow}}"
            ),
            _ => format!(
                "{{name: team-{i}, match: [\"registry.example.com/team{i}/**\"], mode: enforce}}"
            ),
        };
        out.push_str(&format!("    - {line}\n"));
    }
    out
}

/// `n` images that [`large`]`(rules, mirrors)` admits without a registry:
/// each pinned, at its mirror where it has one, spread over every rule
/// that admits (all but the deny rules).
pub fn admitted_images(rules: usize, mirrors: usize, n: usize) -> Vec<String> {
    let admitting: Vec<usize> = (0..rules).filter(|i| i % 10 != 3).collect();
    (0..n)
        .map(|k| {
            let i = admitting[k % admitting.len()];
            match i % 10 {
                7 => format!("quay.io/org{i}/app:v{k}@{DIGEST}"),
                8 => format!("ghcr.io/org{i}/app{k}-svc:1@{DIGEST}"),
                9 => format!("a{k}.ecr{i}.example.com/app:1@{DIGEST}"),
                _ if i < mirrors => {
                    format!("mirror{}.example.com/team{i}/app{k}:1.0@{DIGEST}", i % 3)
                }
                _ => format!("registry.example.com/team{i}/app{k}:1.0@{DIGEST}"),
            }
        })
        .collect()
}

/// A Pod in `namespace` with one container per image (restricted-compliant).
pub fn pod(namespace: &str, name: &str, images: &[String]) -> serde_json::Value {
    let containers: Vec<serde_json::Value> = images
        .iter()
        .enumerate()
        .map(|(i, image)| {
            serde_json::json!({"name": format!("c{i}"), "image": image,
                "securityContext": {"allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}}})
        })
        .collect();
    serde_json::json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"securityContext": {"runAsNonRoot": true, "seccompProfile": {"type": "RuntimeDefault"}},
                 "containers": containers}})
}
