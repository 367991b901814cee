//! `sigil node check`: whether containerd will call sigil-containerd on
//! every pull, and what sigil will answer there. Glue: reading
//! containerd's configuration (its `imports` merged as containerd merges
//! them) is `sigil::node::check`; the environment containerd gives its
//! verifiers is read from the running containerd (`/proc/PID/environ`);
//! the node-critical images are decided as the verifier decides a pull.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{Context as _, Result};
use clap::{CommandFactory as _, Parser as _};
use sigil::node::check::{self, Entry};
use sigil::node::{Verdict, pull};

use super::EXIT_FINDINGS;
use super::node_env::NodeEnv;

/// Runs `sigil node check`.
pub fn run(config: &Path, images: &[String]) -> Result<ExitCode> {
    let main = std::fs::read_to_string(config)
        .with_context(|| format!("reading containerd's configuration {}", config.display()))?;
    let (text, imported) = with_imports(config, &main)?;
    let dir = check::bin_dir(&text).map_err(anyhow::Error::msg)?;
    let entries = list(Path::new(&dir));
    let running = containerd_env(config);
    let env = match &running {
        Some((_, vars)) => NodeEnv::try_parse_from(env_args(vars)),
        None => NodeEnv::try_parse_from(Vec::<String>::new()),
    }
    .map_err(|e| anyhow::anyhow!("containerd's environment: {}", e.to_string().trim()))?;
    let mut report =
        check::check(&text, entries.as_deref(), env.timeout).map_err(anyhow::Error::msg)?;
    if !imported.is_empty() {
        report.settings.push(format!(
            "imports merged: {}",
            imported
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    match &running {
        Some((pid, _)) => report.settings.push(format!(
            "containerd (pid {pid}) gives its verifiers SIGIL_NODE_POLICY={}",
            env.policy
                .as_deref()
                .map_or("(unset: the file sigil node sync writes)".to_owned(), |p| p
                    .display()
                    .to_string())
        )),
        None => report.notes.push(
            "no running containerd uses this configuration here: the verifier's environment is taken from this shell's".to_owned(),
        ),
    }
    answers(&env, &text, images, &mut report);
    for s in &report.settings {
        say!("{s}")?;
    }
    for n in &report.notes {
        say!("note: {n}")?;
    }
    for p in &report.problems {
        say!("problem: {p}")?;
    }
    if report.will_verify() {
        say!(
            "ok: containerd calls {} on every pull it makes through its transfer service, CRI pulls included (not: ctr --local, ctr import, images already on the node)",
            check::VERIFIER
        )?;
        Ok(ExitCode::SUCCESS)
    } else {
        say!("NOT verified: see the problems above (docs/node.md)")?;
        Ok(ExitCode::from(EXIT_FINDINGS))
    }
}

/// What the verifier will answer: whether its policy loads, and its
/// verdict on the sandbox image and each `--image` (a node pulls them for
/// itself; no namespace can exempt them).
fn answers(env: &NodeEnv, config: &str, images: &[String], report: &mut check::Report) {
    let sandbox = check::sandbox_image(config);
    let loaded = match pull::load(
        env.policy.as_deref(),
        env.on_missing_policy == "allow",
        &sandbox,
    ) {
        Ok(l) => l,
        Err(Verdict::Deny(why)) => {
            report
                .problems
                .push(format!("every pull is refused: {why}"));
            return;
        }
        Err(Verdict::Allow(why)) => {
            report.problems.push(format!(
                "every pull is allowed unverified: {}",
                why.unwrap_or_default()
            ));
            return;
        }
    };
    let policy = &loaded.policy;
    report.settings.push(format!(
        "node policy: {} rule(s), nodeAdmits [{}]",
        policy.rules.len(),
        policy
            .node_admits
            .iter()
            .map(|p| p.source())
            .collect::<Vec<_>>()
            .join(", ")
    ));
    for k in &loaded.keys.keys {
        match (&k.from, &k.error) {
            (Some(o), _) => report.settings.push(format!(
                "keyRef {}: from {}/{} (uid {}, resourceVersion {}, sha256 {})",
                k.key_ref,
                o.namespace,
                k.key_ref.object().1,
                o.uid,
                o.resource_version,
                o.sha256
            )),
            (None, Some(e)) => report.problems.push(format!(
                "keyRef {} could not be read by sigil node sync, so its verifiers refuse every image: {e}",
                k.key_ref
            )),
            (None, None) => {}
        }
    }
    for image in std::iter::once(&sandbox).chain(images) {
        let verdict = pull::node_admits(policy, image).unwrap_or_else(|| {
            let deadline = Instant::now() + env.timeout;
            env.creds
                .sources()
                .and_then(|s| Ok(pull::decide(loaded.clone(), &s, image, deadline)?))
                .unwrap_or_else(|e| Verdict::Deny(format!("{e:#}")))
        });
        match verdict {
            Verdict::Allow(_) => report
                .settings
                .push(format!("{image}: admitted at pull")),
            Verdict::Deny(why) => report.problems.push(format!(
                "{image}, which this node pulls for itself, would be refused: {why} (list it in the policy's nodeAdmits, docs/node.md)"
            )),
        }
    }
}

/// The configuration with its imports merged (globs relative to its
/// directory, each expanded in name order, imports of imports followed),
/// and the files merged.
fn with_imports(config: &Path, main: &str) -> Result<(String, Vec<PathBuf>)> {
    let base = config.parent().unwrap_or(Path::new("/"));
    let mut files: Vec<PathBuf> = Vec::new();
    let mut texts = Vec::new();
    let mut queue: Vec<String> = check::imports(main).map_err(anyhow::Error::msg)?;
    // containerd follows imports of imports; bound the walk.
    let mut budget = 64usize;
    while let Some(pattern) = (!queue.is_empty()).then(|| queue.remove(0)) {
        for path in expand(base, &pattern) {
            if files.contains(&path) {
                continue;
            }
            budget = budget
                .checked_sub(1)
                .context("more than 64 imported files")?;
            let text = std::fs::read_to_string(&path)
                .with_context(|| format!("reading imported {}", path.display()))?;
            queue.extend(check::imports(&text).map_err(anyhow::Error::msg)?);
            files.push(path);
            texts.push(text);
        }
    }
    Ok((
        check::merge(main, &texts).map_err(anyhow::Error::msg)?,
        files,
    ))
}

/// The files `pattern` names: a path, or a `*` glob in its file name.
fn expand(base: &Path, pattern: &str) -> Vec<PathBuf> {
    let p = base.join(pattern);
    let name = p
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    if !name.contains('*') {
        return if p.exists() { vec![p] } else { Vec::new() };
    }
    let dir = p.parent().unwrap_or(Path::new("/"));
    let mut out: Vec<PathBuf> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| glob(&name, &e.file_name().to_string_lossy()))
        .map(|e| e.path())
        .collect();
    out.sort();
    out
}

/// `*` matches any run of characters.
fn glob(pattern: &str, name: &str) -> bool {
    let parts: Vec<&str> = pattern.split('*').collect();
    if parts.len() == 1 {
        return pattern == name;
    }
    let (first, last) = (parts[0], parts[parts.len() - 1]);
    if !name.starts_with(first) || name.len() < first.len() + last.len() {
        return false;
    }
    let mut rest = &name[first.len()..];
    for mid in &parts[1..parts.len() - 1] {
        match rest.find(mid) {
            Some(i) => rest = &rest[i + mid.len()..],
            None => return false,
        }
    }
    rest.ends_with(last)
}

/// The environment of the running containerd that reads `config` (its
/// `--config`, or the default path when it names none).
fn containerd_env(config: &Path) -> Option<(u32, BTreeMap<String, String>)> {
    let want = std::fs::canonicalize(config).ok()?;
    for e in std::fs::read_dir("/proc").ok()?.flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let exe = std::fs::read_link(e.path().join("exe")).ok();
        if exe.as_deref().and_then(Path::file_name) != Some("containerd".as_ref()) {
            continue;
        }
        let Ok(cmdline) = std::fs::read(e.path().join("cmdline")) else {
            continue;
        };
        let args: Vec<String> = cmdline
            .split(|b| *b == 0)
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        let named = args
            .iter()
            .position(|a| a == "--config" || a == "-c")
            .and_then(|i| args.get(i + 1).cloned())
            .or_else(|| {
                args.iter()
                    .find_map(|a| a.strip_prefix("--config=").map(str::to_owned))
            })
            .unwrap_or_else(|| "/etc/containerd/config.toml".to_owned());
        if std::fs::canonicalize(&named).ok().as_deref() != Some(want.as_path()) {
            continue;
        }
        let environ = std::fs::read(e.path().join("environ")).ok()?;
        let vars = environ
            .split(|b| *b == 0)
            .filter_map(|kv| {
                let kv = String::from_utf8_lossy(kv);
                let (k, v) = kv.split_once('=')?;
                Some((k.to_owned(), v.to_owned()))
            })
            .collect();
        return Some((pid, vars));
    }
    None
}

/// `vars` (containerd's environment) as the verifier's flags: each
/// variable one of its arguments reads, as `--flag=value`.
fn env_args(vars: &BTreeMap<String, String>) -> Vec<String> {
    NodeEnv::command()
        .get_arguments()
        .filter_map(|a| {
            let var = a.get_env()?.to_str()?;
            let value = vars.get(var)?;
            Some(format!("--{}={value}", a.get_long()?))
        })
        .collect()
}

/// The verifier directory's entries, `None` when it does not exist.
fn list(dir: &Path) -> Option<Vec<Entry>> {
    use std::os::unix::fs::PermissionsExt as _;
    let rd = std::fs::read_dir(dir).ok()?;
    Some(
        rd.flatten()
            .map(|e| {
                let meta = std::fs::metadata(e.path()).ok();
                Entry {
                    name: e.file_name().to_string_lossy().into_owned(),
                    executable: meta
                        .is_some_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0),
                }
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::glob;

    #[test]
    fn globs_match_as_containerd_imports_do() {
        assert!(glob("*.toml", "10-sigil.toml"));
        assert!(!glob("*.toml", "10-sigil.toml.bak"));
        assert!(glob("a*b*c", "aXbYc"));
        assert!(!glob("a*b*c", "ac"));
        assert!(glob("exact", "exact"));
    }
}
