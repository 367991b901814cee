//! The backstop's CEL against the policy: a policy built from the input
//! (patterns over Docker Hub and other registries, globs, tag patterns,
//! mirrors with and without fallback, every action and mode) and 64
//! image references in every spelling the reference parser accepts (Docker
//! Hub's names in any case, ports, digest-only, tags) — the generated CEL,
//! evaluated by the `cel` crate, gives each image exactly the verdict
//! `backstop::decide` (what `Policy::plan` decides without a registry)
//! gives. `scripts/fuzz.sh run backstop 15625` is 1,000,000 cases.
#![no_main]

use libfuzzer_sys::fuzz_target;
use serde_json::json;
use sigil_core::Policy;
use sigil_core::backstop::{Options, Verdict, decide, eval, generate};

const DIGEST: &str = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

const DOMAINS: &[&str] = &[
    "registry.example.com", "docker.io", "quay.io", "*.corp.io", "127.0.0.1:*", "localhost:5000",
    "mirror.example.com", "ghcr.io",
];
const PATHS: &[&str] = &["team", "*", "**", "app", "a-*", "library", "team/*", "x/**/y"];
const TAGS: &[&str] = &["", ":v*", ":*", ":*-*", ":latest", ":1.*"];
const WRITTEN_DOMAINS: &[&str] = &[
    "", "docker.io/", "index.docker.io/", "Registry-1.Docker.IO/", "REGISTRY.HUB.DOCKER.COM/",
    "registry.example.com/", "mirror.example.com/", "backup.example.com/", "hub.example.com/",
    "Quay.io/", "quay.io/", "127.0.0.1:5000/", "localhost:5000/", "a.corp.io/", "ghcr.io/",
    "registry-1.docker.io/",
];
const WRITTEN_PATHS: &[&str] = &[
    "team/app", "library/nginx", "nginx", "app", "team/a-b/c", "x/q/y", "team/tools/k", "a-1",
];
const WRITTEN_TAGS: &[&str] = &["", ":v1", ":latest", ":1-2", ":1.0"];
const MIRRORS: &[&str] = &[
    "{from: \"registry.example.com/team\", to: [\"mirror.example.com/team\", \"backup.example.com/team\"]}",
    "{from: \"docker.io/library\", to: [\"hub.example.com/library\"], fallback: origin}",
    "{from: \"quay.io\", to: [\"mirror.example.com/quay\"]}",
    "{from: \"registry.example.com/team/tools\", to: [\"mirror.example.com/tools\"], fallback: origin}",
];

fn pick<'a>(list: &[&'a str], b: u8) -> &'a str {
    list[b as usize % list.len()]
}

fuzz_target!(|data: &[u8]| {
    if data.len() < 4 {
        return;
    }
    let (head, rest) = data.split_at(4);
    let rules = 1 + head[0] as usize % 6;
    let mut text = String::from("apiVersion: sigil.dev/v1alpha1\nkind: ImagePolicy\nmetadata: {name: f}\nspec:\n");
    let mirrors: Vec<&str> = MIRRORS.iter().enumerate().filter(|(i, _)| head[1] >> i & 1 == 1).map(|(_, m)| *m).collect();
    if !mirrors.is_empty() {
        text.push_str("  mirrors:\n");
        for m in mirrors {
            text.push_str(&format!("    - {m}\n"));
        }
    }
    text.push_str("  rules:\n");
    let mut bytes = rest.iter().copied().chain(std::iter::repeat(0));
    let mut next = || bytes.next().unwrap_or(0);
    for i in 0..rules {
        let (d, p, t, a) = (next(), next(), next(), next());
        let pattern = match d % 9 {
            8 => "**".to_owned(),
            _ => format!("{}/{}{}", pick(DOMAINS, d), pick(PATHS, p), pick(TAGS, t)),
        };
        let action = ["pin", "allow", "deny"][a as usize % 3];
        let mode = if a & 8 == 0 { "enforce" } else { "warn" };
        text.push_str(&format!("    - {{name: r{i}, match: [\"{pattern}\"], action: {action}, mode: {mode}}}\n"));
    }
    let Ok(policy) = Policy::from_documents_at(&text, None) else { return };
    let mut images = Vec::new();
    for _ in 0..64 {
        let (d, p, t, g) = (next(), next(), next(), next());
        let mut image = format!("{}{}{}", pick(WRITTEN_DOMAINS, d), pick(WRITTEN_PATHS, p), pick(WRITTEN_TAGS, t));
        if g & 1 == 1 {
            image.push('@');
            image.push_str(DIGEST);
        }
        images.push(image);
    }
    // The input itself, where it is a reference.
    if let Ok(s) = std::str::from_utf8(rest)
        && s.len() < 200
        && sigil_core::Reference::parse(s).is_ok()
        && !s.trim().is_empty()
        && s.trim() == s
    {
        images.push(s.to_owned());
    }
    let decided: Vec<(String, String)> = images
        .iter()
        .filter_map(|i| {
            let v = match decide(&policy, i)? {
                Verdict::Ok => "ok".to_owned(),
                Verdict::Refuse { why, rule } => format!("refuse {} {rule}", why.as_str()),
                Verdict::Warn { why, rule } => format!("warn {} {rule}", why.as_str()),
            };
            Some((i.clone(), v))
        })
        .collect();
    if decided.is_empty() {
        return;
    }
    let containers: Vec<_> = decided
        .iter()
        .enumerate()
        .map(|(n, (i, _))| json!({"name": format!("c{n}"), "image": i}))
        .collect();
    let pod = json!({"spec": {"containers": containers}});
    let b = generate(
        &policy,
        &Options {
            namespace: "sigil".into(),
            node_namespace: None,
        },
    );
    let got = eval::verdicts(&b.objects[0], &pod, None).unwrap_or_else(|e| panic!("{e}\n{text}"));
    // Images written twice in one Pod are checked once each (as listed).
    assert_eq!(got.len(), decided.len(), "{text}");
    for ((image, want), row) in decided.iter().zip(&got) {
        assert_eq!(&row[0], image);
        assert_eq!(&row[1..].join(" "), want, "{image}\n{text}");
    }
});
