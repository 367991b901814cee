//! Image-name patterns used in policy `match` lists.
//!
//! Owns the pattern language (`*` within a path segment, `**` across one or
//! more segments, optional `:TAGGLOB`), its specificity order, and the overlap
//! test that turns ambiguous rules into a load error. It matches normalized
//! names only; normalizing images is [`crate::reference`]'s job.

use std::cmp::Ordering;

use crate::reference::{DEFAULT_DOMAIN, Reference, is_docker_hub};

/// A compiled `match` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pattern {
    source: String,
    normalized: String,
    segments: Vec<Segment>,
    tag: Option<Glob>,
    specificity: Specificity,
    /// The name part as plain text, when it is (nearly every pattern is).
    literal: Option<Literal>,
}

/// A pattern's name part that is plain text, or plain text followed by one
/// `**`: matched by comparing the image's domain and path as they are,
/// without splitting the name into segments (a team policy's or an
/// exception's check runs per image per admission).
#[derive(Debug, Clone, PartialEq, Eq)]
enum Literal {
    /// Exactly `domain/path`.
    Exact { domain: String, path: String },
    /// `domain/prefix/**` (`prefix` may be empty), or `**` alone (no domain).
    Under {
        domain: Option<String>,
        prefix: String,
    },
}

impl Literal {
    /// The name part of `segments`, if plain text (then one `**` at most, last).
    fn of(segments: &[Segment]) -> Option<Literal> {
        let (any, lits) = match segments.split_last()? {
            (Segment::Any, lits) => (true, lits),
            _ => (false, segments),
        };
        let mut texts = Vec::with_capacity(lits.len());
        for s in lits {
            match s {
                Segment::Glob(g) if !g.wild => texts.push(g.text.as_str()),
                _ => return None,
            }
        }
        let domain = texts.first().map(|d| (*d).to_owned());
        let path = texts.get(1..).unwrap_or_default().join("/");
        match (any, domain) {
            (true, domain) => Some(Literal::Under {
                domain,
                prefix: path,
            }),
            (false, Some(domain)) => Some(Literal::Exact { domain, path }),
            (false, None) => None,
        }
    }

    /// What `match_segments` says of `r`'s name (domain, then the path's
    /// segments, each non-empty by the reference grammar).
    fn matches(&self, r: &Reference) -> bool {
        match self {
            Literal::Exact { domain, path } => r.domain() == domain && r.path() == path,
            // `**` is one or more segments: every name has a domain and a path.
            Literal::Under { domain: None, .. } => true,
            Literal::Under {
                domain: Some(domain),
                prefix,
            } => {
                r.domain() == domain
                    && (prefix.is_empty()
                        || r.path()
                            .strip_prefix(prefix.as_str())
                            .is_some_and(|rest| rest.len() > 1 && rest.starts_with('/')))
            }
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Segment {
    /// `**`: one or more whole segments.
    Any,
    Glob(Glob),
}

/// A single-segment glob where `*` matches any run of characters.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Glob {
    text: String,
    wild: bool,
}

/// Ordering key: more literal segments first, then the longer literal
/// prefix, then more literal characters overall (so `*.corp.com/**` beats `**`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Specificity {
    literal_segments: usize,
    literal_prefix: usize,
    literal_chars: usize,
}

/// Why a pattern is malformed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PatternError {
    /// Empty pattern or empty segment (`a//b`).
    #[error("pattern {0:?} has an empty segment")]
    Empty(String),
    /// `**` must stand alone in its segment.
    #[error("pattern {0:?}: `**` must be a whole path segment")]
    BadDoubleStar(String),
    /// Characters that can never occur in a normalized name.
    #[error(
        "pattern {0:?} contains {1:?}, which never appears in a normalized image name (names are lowercase; the domain may have uppercase)"
    )]
    BadChar(String, char),
}

impl Pattern {
    /// Compiles a pattern, normalizing a literal Docker Hub shorthand the same
    /// way image names are normalized (`nginx` → `docker.io/library/nginx`).
    pub fn parse(src: &str) -> Result<Pattern, PatternError> {
        let raw = src.trim();
        if raw.is_empty() {
            return Err(PatternError::Empty(src.to_owned()));
        }
        let last_slash = raw.rfind('/').map_or(0, |i| i + 1);
        let (name, tag) = match raw[last_slash..].find(':') {
            // A colon in the first and only segment with digits after it is
            // ambiguous; we follow the reference grammar: it is a tag.
            Some(i) => (&raw[..last_slash + i], Some(&raw[last_slash + i + 1..])),
            None => (raw, None),
        };
        let name = normalize_pattern_name(name);
        let mut segments = Vec::new();
        for (i, seg) in name.split('/').enumerate() {
            if seg.is_empty() {
                return Err(PatternError::Empty(src.to_owned()));
            }
            if seg == "**" {
                segments.push(Segment::Any);
                continue;
            }
            if seg.contains("**") {
                return Err(PatternError::BadDoubleStar(src.to_owned()));
            }
            let allowed = |c: char| {
                c.is_ascii_lowercase()
                    || c.is_ascii_digit()
                    || matches!(c, '.' | '_' | '-' | '*')
                    || (i == 0 && (c.is_ascii_uppercase() || matches!(c, ':' | '[' | ']')))
            };
            if let Some(c) = seg.chars().find(|c| !allowed(*c)) {
                return Err(PatternError::BadChar(src.to_owned(), c));
            }
            segments.push(Segment::Glob(Glob {
                text: seg.to_owned(),
                wild: seg.contains('*'),
            }));
        }
        let tag = match tag {
            None => None,
            Some("") => return Err(PatternError::Empty(src.to_owned())),
            Some(t) => {
                if let Some(c) = t
                    .chars()
                    .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-' | '*')))
                {
                    return Err(PatternError::BadChar(src.to_owned(), c));
                }
                Some(Glob {
                    text: t.to_owned(),
                    wild: t.contains('*'),
                })
            }
        };
        let normalized = match &tag {
            Some(t) => format!("{name}:{}", t.text),
            None => name.clone(),
        };
        let literal_segments = segments
            .iter()
            .filter(|s| matches!(s, Segment::Glob(g) if !g.wild))
            .count()
            + usize::from(tag.as_ref().is_some_and(|t| !t.wild));
        let literal_prefix = normalized.find('*').unwrap_or(normalized.len() + 1);
        let literal_chars = normalized.chars().filter(|c| *c != '*').count();
        Ok(Pattern {
            source: src.to_owned(),
            normalized,
            literal: Literal::of(&segments),
            segments,
            tag,
            specificity: Specificity {
                literal_segments,
                literal_prefix,
                literal_chars,
            },
        })
    }

    /// The pattern as written in the policy.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// The pattern after Docker Hub shorthand expansion.
    pub fn normalized(&self) -> &str {
        &self.normalized
    }

    /// How specific the pattern is; higher wins.
    pub fn specificity(&self) -> Specificity {
        self.specificity
    }

    /// Whether a normalized reference matches. A tag constraint requires a tag
    /// (an image with neither tag nor digest counts as `latest`).
    pub fn matches(&self, r: &Reference) -> bool {
        match &self.literal {
            Some(l) => self.tag_matches(r) && l.matches(r),
            None => with_segments(r, |segs| self.matches_segments(r, segs)),
        }
    }

    /// Whether [`Self::matches`] needs no split name: the name part is
    /// plain text (then `**` at most), compared as it is.
    pub fn is_literal(&self) -> bool {
        self.literal.is_some()
    }

    /// [`Self::matches`] with the name already split by [`segments_of`], so
    /// a policy of many rules splits each image name once, not once per pattern.
    pub fn matches_segments(&self, r: &Reference, segs: &[&str]) -> bool {
        self.tag_matches(r) && match_segments(&self.segments, segs)
    }

    /// The tag constraint, if any (an image with neither tag nor digest
    /// counts as `latest`; one by digest alone has no tag to match).
    fn tag_matches(&self, r: &Reference) -> bool {
        let Some(tg) = &self.tag else { return true };
        let tag = match (r.tag(), r.digest()) {
            (Some(t), _) => t,
            (None, None) => "latest",
            (None, Some(_)) => return false,
        };
        tg.matches(tag)
    }

    /// The literal segments a matching name must start with, joined by `/`
    /// (`registry.example.com/team` for `registry.example.com/team/**`, empty
    /// for `**` or `*.corp.com/**`): the key a policy indexes its rules by.
    pub fn literal_prefix(&self) -> String {
        let mut out = String::new();
        for s in &self.segments {
            match s {
                Segment::Glob(g) if !g.wild => {
                    if !out.is_empty() {
                        out.push('/');
                    }
                    out.push_str(&g.text);
                }
                _ => break,
            }
        }
        out
    }

    /// How the backstop's CEL tests a name against this pattern's name part,
    /// as cheaply as [`Self::matches`] does: by comparison where it is
    /// plain text, by regular expression only where it has a glob.
    pub fn name_test(&self) -> NameTest {
        match &self.literal {
            Some(Literal::Under { domain: None, .. }) => NameTest::Any,
            Some(Literal::Exact { domain, path }) => NameTest::Exact(format!("{domain}/{path}")),
            Some(Literal::Under { .. }) => NameTest::Under(format!("{}/", self.literal_prefix())),
            None => {
                // Every run of literal text between globs appears in a
                // matching name: the longest is a cheap test before the
                // expression.
                let name: Vec<&str> = self
                    .segments
                    .iter()
                    .map(|s| match s {
                        Segment::Any => "*",
                        Segment::Glob(g) => g.text.as_str(),
                    })
                    .collect();
                let name = name.join("/");
                let literal = name.split('*').max_by_key(|p| p.len()).unwrap_or_default();
                NameTest::Regex(self.to_regex().0, literal.to_owned())
            }
        }
    }

    /// The pattern as RE2 regular expressions over a normalized name and,
    /// when it constrains one, its tag (anchored; `*` within a segment,
    /// `**` one or more segments): what an in-API-server policy evaluates
    /// where this crate's matcher cannot run (`crate::backstop`).
    pub fn to_regex(&self) -> (String, Option<String>) {
        let glob = |text: &str| {
            let mut re = String::new();
            for c in text.chars() {
                match c {
                    '*' => re.push_str("[^/]*"),
                    c if c.is_ascii_alphanumeric() || c == '_' || c == '-' => re.push(c),
                    c => {
                        re.push('\\');
                        re.push(c);
                    }
                }
            }
            re
        };
        let mut name = String::from("^");
        for (i, seg) in self.segments.iter().enumerate() {
            match seg {
                Segment::Any if i == 0 => name.push_str("[^/]+(/[^/]+)*"),
                Segment::Any => name.push_str("(/[^/]+)+"),
                Segment::Glob(g) => {
                    if i > 0 {
                        name.push('/');
                    }
                    name.push_str(&glob(&g.text));
                }
            }
        }
        name.push('$');
        let tag = self.tag.as_ref().map(|t| format!("^{}$", glob(&t.text)));
        (name, tag)
    }

    /// Whether some name could match both patterns. Conservative: it may say
    /// yes for globs that cannot really meet, never no for ones that can.
    pub fn overlaps(&self, other: &Pattern) -> bool {
        let tags = match (&self.tag, &other.tag) {
            (Some(a), Some(b)) => a.may_overlap(b),
            _ => true,
        };
        tags && segments_overlap(&self.segments, &other.segments)
    }
}

/// How a name is tested against a pattern's name part ([`Pattern::name_test`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NameTest {
    /// Every name (`**`).
    Any,
    /// Exactly this name.
    Exact(String),
    /// Names that start with this text (a literal prefix and `/`).
    Under(String),
    /// Names this anchored RE2 expression matches (each contains the text
    /// that follows).
    Regex(String, String),
}

/// A normalized name's segments: the domain, then each path component.
pub fn segments_of(r: &Reference) -> Vec<&str> {
    let mut segs: Vec<&str> = Vec::with_capacity(8);
    segs.push(r.domain());
    segs.extend(r.path().split('/'));
    segs
}

/// [`segments_of`] handed to `f` from the stack: a name of up to 16
/// segments (every real one) is split without allocating, for the checks
/// made per image per admission (a team policy's, an exception's).
pub fn with_segments<T>(r: &Reference, f: impl FnOnce(&[&str]) -> T) -> T {
    let mut segs = [""; 16];
    segs[0] = r.domain();
    let mut n = 1;
    for part in r.path().split('/') {
        let Some(slot) = segs.get_mut(n) else {
            return f(&segments_of(r));
        };
        *slot = part;
        n += 1;
    }
    f(&segs[..n])
}

impl PartialOrd for Specificity {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Specificity {
    fn cmp(&self, other: &Self) -> Ordering {
        (
            self.literal_segments,
            self.literal_prefix,
            self.literal_chars,
        )
            .cmp(&(
                other.literal_segments,
                other.literal_prefix,
                other.literal_chars,
            ))
    }
}

/// Expands `nginx` and `team/app` to their Docker Hub names, like image names.
/// Patterns whose first segment is a wildcard, or already a domain, are kept.
fn normalize_pattern_name(name: &str) -> String {
    let first = name.split('/').next().unwrap_or_default();
    if first.contains('*') {
        return name.to_owned();
    }
    let is_domain = name.contains('/')
        && (first == "localhost"
            || first.contains(['.', ':'])
            || first.bytes().any(|b| b.is_ascii_uppercase()));
    if is_domain {
        if is_docker_hub(first) {
            return format!("{DEFAULT_DOMAIN}{}", &name[first.len()..]);
        }
        return name.to_owned();
    }
    if name.contains('/') {
        format!("{DEFAULT_DOMAIN}/{name}")
    } else {
        format!("{DEFAULT_DOMAIN}/library/{name}")
    }
}

fn match_segments(pat: &[Segment], name: &[&str]) -> bool {
    match pat.split_first() {
        None => name.is_empty(),
        Some((Segment::Any, rest)) => {
            // One or more segments; try every split.
            (1..=name.len()).any(|n| match_segments(rest, &name[n..]))
        }
        Some((Segment::Glob(g), rest)) => match name.split_first() {
            Some((first, tail)) => g.matches(first) && match_segments(rest, tail),
            None => false,
        },
    }
}

fn segments_overlap(a: &[Segment], b: &[Segment]) -> bool {
    match (a.split_first(), b.split_first()) {
        (None, None) => true,
        (None, Some(_)) | (Some(_), None) => false,
        (Some((Segment::Any, ra)), Some((Segment::Any, rb))) => {
            segments_overlap(ra, rb) || segments_overlap(a, rb) || segments_overlap(ra, b)
        }
        (Some((Segment::Any, ra)), Some((_, rb))) => {
            segments_overlap(ra, rb) || segments_overlap(a, rb)
        }
        (Some((_, ra)), Some((Segment::Any, rb))) => {
            segments_overlap(ra, rb) || segments_overlap(ra, b)
        }
        (Some((Segment::Glob(x), ra)), Some((Segment::Glob(y), rb))) => {
            x.may_overlap(y) && segments_overlap(ra, rb)
        }
    }
}

impl Glob {
    fn matches(&self, s: &str) -> bool {
        if !self.wild {
            return self.text == s;
        }
        glob_match(self.text.as_bytes(), s.as_bytes())
    }

    fn may_overlap(&self, other: &Glob) -> bool {
        match (self.wild, other.wild) {
            (false, false) => self.text == other.text,
            (true, false) => self.matches(&other.text),
            (false, true) => other.matches(&self.text),
            (true, true) => {
                let (pa, sa) = literal_ends(&self.text);
                let (pb, sb) = literal_ends(&other.text);
                (pa.starts_with(pb) || pb.starts_with(pa)) && (sa.ends_with(sb) || sb.ends_with(sa))
            }
        }
    }
}

fn literal_ends(t: &str) -> (&str, &str) {
    let p = t.find('*').map_or(t, |i| &t[..i]);
    let s = t.rfind('*').map_or(t, |i| &t[i + 1..]);
    (p, s)
}

/// Iterative `*` glob with single backtrack point: linear for typical patterns.
fn glob_match(p: &[u8], s: &[u8]) -> bool {
    let (mut pi, mut si) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while si < s.len() {
        if pi < p.len() && p[pi] == b'*' {
            star = Some((pi, si));
            pi += 1;
        } else if pi < p.len() && p[pi] == s[si] {
            pi += 1;
            si += 1;
        } else if let Some((sp, ss)) = star {
            pi = sp + 1;
            si = ss + 1;
            star = Some((sp, ss + 1));
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|&c| c == b'*')
}

#[cfg(test)]
mod tests;
