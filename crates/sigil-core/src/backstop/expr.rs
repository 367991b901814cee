//! The backstop's CEL variables: what the API server computes, image by
//! image, to reach the verdict `Policy::plan` reaches without a registry.
//!
//! It owns the shape of that CEL. Its size, nesting and cost must grow
//! slowly with the policy, because kube-apiserver caps each expression's
//! length (100,000 code points), its nesting (250) and what one admission
//! may spend (its runtime cost budget). So nothing here is a chain over the
//! policy: patterns, mirror targets and mirror origins are constants
//! (maps keyed by a name's literal prefix, lists), written once and split
//! over several variables when one would be too long, and each image looks
//! up its own few candidates by its name's prefixes, as `Policy::rule_for`
//! does through its index. Only a pattern with a glob in its name costs a
//! regular expression, and only for images that share its literal start.
//! Normalization is the reference parser's, case for case (every Docker
//! Hub spelling in `dockerhub::DOCKER_HUB_ALIASES`, upper case included).
//! It does not build the objects around the variables (the parent module).
//!
//! Kubernetes types list literals strictly (one element type per list), so
//! every per-image entry is a list of lists of strings; the fields are
//! named where each variable is built.

use std::collections::BTreeMap;

use crate::denial::Mode;
use crate::dockerhub::DOCKER_HUB_ALIASES;
use crate::pattern::NameTest;
use crate::policy::schema::Action;
use crate::policy::{Policy, Rule};

/// The longest expression kube-apiserver accepts, in code points.
pub const MAX_EXPRESSION: usize = 100_000;

/// How long a constant may grow before it is split over another variable.
const CHUNK: usize = 60_000;

/// A CEL string literal (single-quoted, escaped).
pub(super) fn cel_string(s: &str) -> String {
    format!("'{}'", s.replace('\\', "\\\\").replace('\'', "\\'"))
}

/// A CEL list literal of already-written elements.
fn list(items: impl IntoIterator<Item = String>) -> String {
    format!("[{}]", items.into_iter().collect::<Vec<_>>().join(", "))
}

/// A rule's name as one word of a verdict (names are DNS-like already).
pub(super) fn word(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "._-/".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// The images of `obj` (`object` or `oldObject`): containers, init and
/// ephemeral containers, image volumes.
fn images_of(obj: &str) -> String {
    let containers = |field: &str| {
        format!(
            "(has({obj}.spec.{field}) ? {obj}.spec.{field}.filter(c, has(c.image)).map(c, c.image) : [])"
        )
    };
    format!(
        "{} + {} + {} + (has({obj}.spec.volumes) ? {obj}.spec.volumes.filter(v, has(v.image) && has(v.image.reference)).map(v, v.image.reference) : [])",
        containers("containers"),
        containers("initContainers"),
        containers("ephemeralContainers"),
    )
}

/// A constant map split into variables `{base}0`, `{base}1`, … of at most
/// [`CHUNK`] characters each: (variables, their names).
struct Chunked {
    vars: Vec<(String, String)>,
}

impl Chunked {
    fn new(base: &str, entries: &BTreeMap<String, String>) -> Chunked {
        let mut vars: Vec<(String, String)> = Vec::new();
        let mut current: Vec<String> = Vec::new();
        let mut len = 0;
        let flush = |current: &mut Vec<String>, vars: &mut Vec<(String, String)>| {
            if !current.is_empty() {
                let name = format!("{base}{}", vars.len());
                vars.push((name, format!("{{{}}}", current.join(", "))));
                current.clear();
            }
        };
        for (k, v) in entries {
            let entry = format!("{}: {v}", cel_string(k));
            if len + entry.len() > CHUNK {
                flush(&mut current, &mut vars);
                len = 0;
            }
            len += entry.len() + 2;
            current.push(entry);
        }
        flush(&mut current, &mut vars);
        Chunked { vars }
    }

    fn is_empty(&self) -> bool {
        self.vars.is_empty()
    }

    /// Whether `key` (a CEL string expression) is in any part.
    fn contains(&self, key: &str) -> String {
        let parts: Vec<String> = self
            .vars
            .iter()
            .map(|(n, _)| format!("{key} in variables.{n}"))
            .collect();
        format!("({})", parts.join(" || "))
    }

    /// The value at `key`, which is in some part.
    fn get(&self, key: &str) -> String {
        let mut out = String::new();
        let (last, rest) = self.vars.split_last().expect("a lookup in an empty map");
        for (n, _) in rest {
            out.push_str(&format!("{key} in variables.{n} ? variables.{n}[{key}] : "));
        }
        out.push_str(&format!("variables.{}[{key}]", last.0));
        format!("({out})")
    }

    /// Every part's value at `key` (lists), concatenated.
    fn all_at(&self, key: &str) -> String {
        let parts: Vec<String> = self
            .vars
            .iter()
            .map(|(n, _)| format!("({key} in variables.{n} ? variables.{n}[{key}] : [])"))
            .collect();
        parts.join(" + ")
    }
}

/// The first `k` segments of the name split in `parts`, joined by `/`.
fn prefix(parts: &str, k: usize) -> String {
    (0..k)
        .map(|i| format!("{parts}[{i}]"))
        .collect::<Vec<_>>()
        .join(" + '/' + ")
}

/// The prefixes of the name split in `parts` (up to `depth` segments) that
/// are keys of `map`, longest first.
fn hits(parts: &str, depth: usize, map: &Chunked) -> String {
    let terms: Vec<String> = (1..=depth)
        .rev()
        .map(|k| {
            let p = prefix(parts, k);
            format!(
                "(size({parts}) >= {k} && {} ? [{p}] : [])",
                map.contains(&p)
            )
        })
        .collect();
    terms.join(" + ")
}

/// The number of `/`-separated segments of `s`.
fn depth(s: &str) -> usize {
    s.split('/').count()
}

/// One pattern as the backstop's index holds it: [rank, test (`a` any,
/// `e` exact, `u` under a prefix, `r` regex), its text, tag regex (`''`:
/// any), kind (`ok`, `refuse`, `warn`), action (`deny`, `allow`, `pin`),
/// rule, text a regex's every match contains (tested first: far cheaper)].
fn entry(rank: &str, rule: &Rule, test: &NameTest, tag: Option<String>) -> String {
    let (t, text, literal) = match test {
        NameTest::Any => ("a", "", ""),
        NameTest::Exact(s) => ("e", s.as_str(), ""),
        NameTest::Under(s) => ("u", s.as_str(), ""),
        NameTest::Regex(s, l) => ("r", s.as_str(), l.as_str()),
    };
    let kind = if rule.namespace_selector.is_some() || rule.exceptions.is_some() {
        // The API server cannot see labels or exceptions: such a rule admits.
        "ok"
    } else {
        match rule.mode {
            Mode::Enforce => "refuse",
            Mode::Warn => "warn",
        }
    };
    let action = match rule.action {
        Action::Deny => "deny",
        Action::Allow => "allow",
        Action::Pin => "pin",
    };
    list(
        [
            rank,
            t,
            text,
            tag.as_deref().unwrap_or(""),
            kind,
            action,
            &word(&rule.name),
            literal,
        ]
        .iter()
        .map(|s| cel_string(s)),
    )
}

/// The most patterns one image is tested against: those no prefix
/// narrows, and the most that share a literal start with one name. The API
/// server's cost of a Pod grows with this times its images (each test is
/// a comparison, or a substring search before a regular expression).
pub fn crowd(policy: &Policy) -> usize {
    let mut buckets: BTreeMap<String, usize> = BTreeMap::new();
    for (_, pattern) in policy.patterns_in_order() {
        *buckets.entry(pattern.literal_prefix()).or_default() += 1;
    }
    let root = buckets.remove("").unwrap_or(0);
    let deepest = buckets
        .keys()
        .map(|k| {
            let segs: Vec<&str> = k.split('/').collect();
            (1..=segs.len())
                .map(|n| buckets.get(&segs[..n].join("/")).copied().unwrap_or(0))
                .sum::<usize>()
        })
        .max()
        .unwrap_or(0);
    root + deepest
}

/// The policy's variables, in order (each may use the ones before it).
pub(super) fn variables(policy: &Policy) -> Vec<(String, String)> {
    // Constants: mirror targets → origin prefix (longest target wins; of
    // two equal, the later, as `Policy::origin_of`), mirror origins →
    // [[from, the first target's domain, fallback t|f, failover t|f],
    // [alternate targets]] (longest first; of two equal, the first, as
    // `Policy::mirror_for`), and the patterns by literal prefix.
    let mut targets = BTreeMap::new();
    let mut froms = BTreeMap::new();
    for m in &policy.mirrors {
        for t in m.targets() {
            targets.insert(t.to_owned(), cel_string(&m.from));
        }
        let tf = |b: bool| if b { "t" } else { "f" };
        let head = list(
            [
                m.from.as_str(),
                m.to.split('/').next().unwrap_or_default(),
                tf(m.fallback_origin()),
                tf(m.failover.is_some()),
            ]
            .iter()
            .map(|s| cel_string(s)),
        );
        let alts = list(m.alternates().iter().map(|a| cel_string(a)));
        froms
            .entry(m.from.clone())
            .or_insert_with(|| format!("[{head}, {alts}]"));
    }
    let patterns: Vec<_> = policy.patterns_in_order().collect();
    let width = patterns.len().max(1).to_string().len();
    let (mut root, mut any) = (Vec::new(), Vec::new());
    let mut buckets: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (rank, (rule, pattern)) in patterns.iter().enumerate() {
        let rank = format!("{rank:0width$}");
        let e = entry(&rank, rule, &pattern.name_test(), pattern.to_regex().1);
        match pattern.literal_prefix() {
            key if key.is_empty() => {
                if matches!(pattern.name_test(), NameTest::Any) {
                    any.push(e)
                } else {
                    root.push(e)
                }
            }
            key => buckets.entry(key).or_default().push(e),
        }
    }
    let t_depth = targets.keys().map(|k| depth(k)).max().unwrap_or(0);
    let f_depth = froms.keys().map(|k| depth(k)).max().unwrap_or(0);
    let i_depth = buckets.keys().map(|k| depth(k)).max().unwrap_or(0);
    let targets = Chunked::new("targets", &targets);
    let froms = Chunked::new("froms", &froms);
    let index = Chunked::new(
        "index",
        &buckets
            .into_iter()
            .map(|(k, v)| (k, list(v)))
            .collect::<BTreeMap<_, _>>(),
    );
    let mut vars: Vec<(String, String)> = Vec::new();
    vars.extend(targets.vars.iter().cloned());
    vars.extend(froms.vars.iter().cloned());
    vars.extend(index.vars.iter().cloned());
    // Patterns with a glob before any literal segment (`*.corp.com/**`):
    // no prefix narrows them, so each image tests them all, the literal
    // text first. And `**` alone, which matches every name.
    let (has_root, has_any) = (!root.is_empty(), !any.is_empty());
    if has_root {
        vars.push(("unindexed".to_owned(), list(root)));
    }
    if has_any {
        vars.push(("everything".to_owned(), list(any)));
    }
    vars.push(("images".to_owned(), images_of("object")));
    vars.push((
        "previous".to_owned(),
        format!("oldObject == null ? [] : {}", images_of("oldObject")),
    ));
    // [written, without its digest, d|n (whether it has one)].
    vars.push((
        "refs".to_owned(),
        "variables.images.filter(i, !(i in variables.previous)).map(i, [string(i), string(i).split('@')[0], string(i).contains('@') ? 'd' : 'n'])".to_owned(),
    ));
    // [written, name, tag, d|n]: the tag split off; `latest` when there is
    // neither tag nor digest, empty for a digest alone (no tag to match).
    vars.push((
        "named".to_owned(),
        "variables.refs.map(r, r[1].lastIndexOf(':') > r[1].lastIndexOf('/') ? [r[0], r[1].substring(0, r[1].lastIndexOf(':')), r[1].substring(r[1].lastIndexOf(':') + 1), r[2]] : [r[0], r[1], r[2] == 'd' ? '' : 'latest', r[2]])".to_owned(),
    ));
    // [written, normalized name, tag, d|n], as `reference::split_docker_domain`:
    // no `/` is an official image; a first segment that is one of Docker
    // Hub's names (any case) is `docker.io`; one with `.` or `:`,
    // `localhost` or upper case is a registry; anything else is on Docker Hub.
    let first = "r[1].substring(0, r[1].indexOf('/'))";
    let rest = "r[1].substring(r[1].indexOf('/') + 1)";
    let hub = list(DOCKER_HUB_ALIASES.iter().map(|a| cel_string(a)));
    vars.push((
        "full".to_owned(),
        format!(
            "variables.named.map(r, [r[0], !r[1].contains('/') ? 'docker.io/library/' + r[1] : {first}.lowerAscii() in {hub} ? 'docker.io/' + ({rest}.contains('/') ? {rest} : 'library/' + {rest}) : ({first} == 'localhost' || {first}.contains('.') || {first}.contains(':') || {first} != {first}.lowerAscii()) ? r[1] : 'docker.io/' + r[1], r[2], r[3]])"
        ),
    ));
    // [[written, name, tag, d|n], the name's segments].
    vars.push((
        "split".to_owned(),
        "variables.full.map(r, [r, r[1].split('/')])".to_owned(),
    ));
    // [[written, name, tag, d|n, origin, written domain]]: mapped back from
    // the longest mirror target the name is under.
    let origins = if targets.is_empty() {
        "variables.split.map(r, [r[0] + [r[0][1], r[1][0]]])".to_owned()
    } else {
        vars.push((
            "targeted".to_owned(),
            format!(
                "variables.split.map(r, [r[0], r[1], {}])",
                hits("r[1]", t_depth, &targets)
            ),
        ));
        format!(
            "variables.targeted.map(r, [r[0] + [size(r[2]) > 0 ? {} + r[0][1].substring(size(r[2][0])) : r[0][1], r[1][0]]])",
            targets.get("r[2][0]")
        )
    };
    vars.push(("origins".to_owned(), origins));
    // [[… origin, written domain], the origin's segments].
    vars.push((
        "osplit".to_owned(),
        "variables.origins.map(r, [r[0], r[0][4].split('/')])".to_owned(),
    ));
    // [[… written domain, m|-], the origin's segments]: `m` when the
    // policy pulls it from a mirror on another host than it was written
    // at and would not fall back to it (`Plan::rewritten`, not at a
    // failover that already served it).
    let mirrored = if froms.is_empty() {
        "variables.osplit.map(r, [r[0] + ['-'], r[1]])".to_owned()
    } else {
        vars.push((
            "mirrorhits".to_owned(),
            format!(
                "variables.osplit.map(r, [r[0], r[1], {}])",
                hits("r[1]", f_depth, &froms)
            ),
        ));
        let m = froms.get("r[2][0]");
        let (head, alts) = (format!("{m}[0]"), format!("{m}[1]"));
        let kept = format!(
            "(r[0][3] == 'd' && {head}[3] == 't' && ({alts}.exists(a, r[0][1] == a + r[0][4].substring(size({head}[0]))) || ({head}[2] == 't' && r[0][1] == r[0][4])))"
        );
        format!(
            "variables.mirrorhits.map(r, [r[0] + [size(r[2]) > 0 && !{kept} && {head}[1] != r[0][5] && {head}[2] != 't' ? 'm' : '-'], r[1]])"
        )
    };
    vars.push(("mirrored".to_owned(), mirrored));
    // [[[… m|-]], the patterns that match the origin]: those indexed under
    // each of the origin's prefixes, those not indexed, and `**`.
    let mut sources: Vec<String> = Vec::new();
    if !index.is_empty() {
        for k in 1..=i_depth {
            sources.push(format!(
                "(size(r[1]) >= {k} ? {} : [])",
                index.all_at(&prefix("r[1]", k))
            ));
        }
    }
    let (o, t) = ("r[0][4]", "r[0][2]");
    let tag = format!("(e[3] == '' || ({t} != '' && {t}.matches(e[3])))");
    let mut found: Vec<String> = Vec::new();
    if !sources.is_empty() {
        found.push(format!(
            "({}).filter(e, ((e[1] == 'e' && {o} == e[2]) || (e[1] == 'u' && {o}.startsWith(e[2])) || (e[1] == 'r' && {o}.contains(e[7]) && {o}.matches(e[2]))) && {tag})",
            sources.join(" + ")
        ));
    }
    if has_root {
        found.push(format!(
            "variables.unindexed.filter(e, {o}.contains(e[7]) && {o}.matches(e[2]) && {tag})"
        ));
    }
    if has_any {
        found.push(format!("variables.everything.filter(e, {tag})"));
    }
    let found = if found.is_empty() {
        "[]".to_owned()
    } else {
        found.join(" + ")
    };
    vars.push((
        "matched".to_owned(),
        format!("variables.mirrored.map(r, [[r[0]], {found}])"),
    ));
    // [[… m|-], the most specific match (or none)].
    vars.push((
        "best".to_owned(),
        "variables.matched.map(r, [r[0][0], size(r[1]) == 0 ? [] : r[1].filter(e, r[1].all(f, f[0] >= e[0]))[0]])".to_owned(),
    ));
    // [written, ok|refuse|warn, why, rule].
    vars.push((
        "verdicts".to_owned(),
        "variables.best.map(r, [r[0][0]] + (size(r[1]) == 0 ? ['refuse', 'norule', '-'] : r[1][4] == 'ok' ? ['ok'] : r[1][5] == 'deny' ? [r[1][4], 'deny', r[1][6]] : (r[1][5] == 'pin' && r[0][3] == 'n') ? [r[1][4], 'nodigest', r[1][6]] : r[0][6] == 'm' ? [r[1][4], 'nomirror', r[1][6]] : ['ok']))".to_owned(),
    ));
    vars
}
