//! `sigil node check`: reads containerd's configuration (version 2 or 3)
//! and its verifier directory and says whether sigil-containerd will really
//! be called on the kubelet's pulls — the image-verifier plugin's
//! `bin_dir`, `max_verifiers` and `per_verifier_timeout`, what else is in
//! that directory, and each CRI setting that silently turns CRI pulls into
//! local pulls, which no verifier sees (containerd v2.3
//! `internal/cri/config/config.go`, `CheckLocalImagePullConfigs`). Pure:
//! the caller reads the files and lists the directory.

use std::time::Duration;

use toml_edit::{DocumentMut, Item};

/// The verifier plugin's table.
const BINDIR: &str = "io.containerd.image-verifier.v1.bindir";
/// containerd's defaults for it.
pub const DEFAULT_BIN_DIR: &str = "/opt/containerd/image-verifier/bin";
const DEFAULT_MAX_VERIFIERS: i64 = 10;
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);
/// The verifier's executable name.
pub const VERIFIER: &str = "sigil-containerd";

/// One entry of the verifier directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// File name.
    pub name: String,
    /// A regular file (or a link to one) with an execute bit.
    pub executable: bool,
}

/// What `sigil node check` found.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Report {
    /// Settings as found (one line each).
    pub settings: Vec<String>,
    /// Why sigil-containerd will not be called (or not on CRI pulls).
    pub problems: Vec<String>,
    /// What is worth knowing but does not stop it.
    pub notes: Vec<String>,
}

impl Report {
    /// Whether every pull through CRI and the transfer service runs sigil.
    pub fn will_verify(&self) -> bool {
        self.problems.is_empty()
    }
}

fn table<'a>(doc: &'a DocumentMut, path: &[&str]) -> Option<&'a Item> {
    let mut item = doc.as_item();
    for p in path {
        item = item.get(p)?;
    }
    Some(item)
}

/// A Go duration as containerd writes it (`5s`, `1m30s`, `500ms`).
pub fn go_duration(s: &str) -> Option<Duration> {
    humantime::parse_duration(s.replace("m", "m ").replace("m s", "ms").trim()).ok()
}

/// The verifier directory the configuration names.
pub fn bin_dir(config: &str) -> Result<String, String> {
    let doc: DocumentMut = config
        .parse()
        .map_err(|e| format!("containerd's configuration is not TOML: {e}"))?;
    Ok(table(&doc, &["plugins", BINDIR, "bin_dir"])
        .and_then(Item::as_str)
        .unwrap_or(DEFAULT_BIN_DIR)
        .to_owned())
}

/// Checks `config` (containerd's config.toml) with `entries` (the verifier
/// directory's listing, `None` when it does not exist) against the time the
/// verifier needs (`deadline`: `SIGIL_NODE_TIMEOUT`).
pub fn check(
    config: &str,
    entries: Option<&[Entry]>,
    deadline: Duration,
) -> Result<Report, String> {
    let doc: DocumentMut = config
        .parse()
        .map_err(|e| format!("containerd's configuration is not TOML: {e}"))?;
    let mut r = Report::default();
    let version = doc.get("version").and_then(Item::as_integer).unwrap_or(1);
    r.settings.push(format!("config version {version}"));
    if version < 2 {
        r.problems.push(format!(
            "config version {version}: containerd 2 reads versions 2 and 3 only"
        ));
    }
    let plugin = |k: &str| table(&doc, &["plugins", BINDIR, k]);
    let dir = plugin("bin_dir")
        .and_then(Item::as_str)
        .unwrap_or(DEFAULT_BIN_DIR);
    let max = plugin("max_verifiers")
        .and_then(Item::as_integer)
        .unwrap_or(DEFAULT_MAX_VERIFIERS);
    let timeout = match plugin("per_verifier_timeout").and_then(Item::as_str) {
        Some(t) => {
            go_duration(t).ok_or_else(|| format!("per_verifier_timeout {t:?} is not a duration"))?
        }
        None => DEFAULT_TIMEOUT,
    };
    r.settings.push(format!(
        "image verifier: bin_dir {dir}, max_verifiers {max}, per_verifier_timeout {}",
        humantime::format_duration(timeout)
    ));
    match entries {
        None => r.problems.push(format!(
            "bin_dir {dir} does not exist: containerd allows every pull unverified"
        )),
        Some([]) => r.problems.push(format!(
            "bin_dir {dir} is empty: containerd allows every pull unverified"
        )),
        Some(list) => {
            let mut names: Vec<&Entry> = list.iter().collect();
            names.sort_by(|a, b| a.name.cmp(&b.name));
            match names.iter().position(|e| e.name == VERIFIER) {
                None => r.problems.push(format!(
                    "{VERIFIER} is not in bin_dir {dir}: sigil is never called"
                )),
                Some(i) if max >= 0 && i as i64 >= max => r.problems.push(format!(
                    "{VERIFIER} is verifier {} in name order but max_verifiers is {max}: containerd does not call it",
                    i + 1
                )),
                Some(_) => {}
            }
            for e in names.iter().filter(|e| !e.executable) {
                r.problems.push(format!(
                    "{} in bin_dir is not an executable file: containerd fails every pull",
                    e.name
                ));
            }
            let others: Vec<&str> = names
                .iter()
                .filter(|e| e.executable && e.name != VERIFIER)
                .map(|e| e.name.as_str())
                .collect();
            if !others.is_empty() {
                r.notes.push(format!(
                    "other verifiers run too, in name order: {}",
                    others.join(", ")
                ));
            }
        }
    }
    // containerd: a negative max_verifiers is no limit; 0 calls none.
    if max == 0 {
        r.problems
            .push("max_verifiers is 0: containerd calls no verifier".to_owned());
    }
    let disabled = doc
        .get("disabled_plugins")
        .and_then(Item::as_array)
        .is_some_and(|a| a.iter().any(|v| v.as_str() == Some(BINDIR)));
    if disabled {
        r.problems.push(format!(
            "disabled_plugins lists {BINDIR}: containerd calls no verifier and allows every pull"
        ));
    }
    if timeout <= deadline {
        r.problems.push(format!(
            "per_verifier_timeout {} is not above sigil's deadline {} (SIGIL_NODE_TIMEOUT): containerd kills sigil before it answers with a reason",
            humantime::format_duration(timeout),
            humantime::format_duration(deadline)
        ));
    }
    local_pull(&doc, version, &mut r);
    Ok(r)
}

/// The file patterns containerd's `imports` names (globs, relative to the
/// configuration's directory), in order.
pub fn imports(config: &str) -> Result<Vec<String>, String> {
    let doc: DocumentMut = config
        .parse()
        .map_err(|e| format!("containerd's configuration is not TOML: {e}"))?;
    Ok(doc
        .get("imports")
        .and_then(Item::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default())
}

/// `main` with `imported` (each file's text, in the order containerd reads
/// them) merged in as containerd merges them: an imported top-level key
/// replaces the main file's, a plugin's whole table replaces that plugin's
/// (containerd merges sections, not keys), and `disabled_plugins` and
/// `required_plugins` accumulate.
pub fn merge(main: &str, imported: &[String]) -> Result<String, String> {
    let mut doc: DocumentMut = main
        .parse()
        .map_err(|e| format!("containerd's configuration is not TOML: {e}"))?;
    for text in imported {
        let other: DocumentMut = text
            .parse()
            .map_err(|e| format!("an imported configuration is not TOML: {e}"))?;
        for (k, v) in other.iter() {
            match k {
                "imports" | "version" => {}
                "plugins" => {
                    let Some(from) = v.as_table_like() else {
                        continue;
                    };
                    if doc.get("plugins").and_then(Item::as_table_like).is_none() {
                        doc.insert("plugins", toml_edit::table());
                    }
                    if let Some(to) = doc["plugins"].as_table_like_mut() {
                        for (id, t) in from.iter() {
                            to.insert(id, t.clone());
                        }
                    }
                }
                "disabled_plugins" | "required_plugins" => {
                    let mut all: Vec<String> = doc
                        .get(k)
                        .and_then(Item::as_array)
                        .map(|a| {
                            a.iter()
                                .filter_map(|x| x.as_str().map(str::to_owned))
                                .collect()
                        })
                        .unwrap_or_default();
                    for x in v.as_array().into_iter().flatten() {
                        if let Some(x) = x.as_str()
                            && !all.iter().any(|a| a == x)
                        {
                            all.push(x.to_owned());
                        }
                    }
                    doc[k] = toml_edit::value(toml_edit::Array::from_iter(all));
                }
                _ => {
                    doc.insert(k, v.clone());
                }
            }
        }
    }
    Ok(doc.to_string())
}

/// The sandbox (pause) image containerd's CRI runs every Pod with: a
/// node pulls it for itself, with no namespace a policy could exempt.
pub fn sandbox_image(config: &str) -> String {
    let doc: Option<DocumentMut> = config.parse().ok();
    let v3 = [
        "plugins",
        "io.containerd.cri.v1.images",
        "pinned_images",
        "sandbox",
    ];
    let v2 = ["plugins", "io.containerd.grpc.v1.cri", "sandbox_image"];
    doc.as_ref()
        .and_then(|d| table(d, &v3).or_else(|| table(d, &v2)))
        .and_then(Item::as_str)
        .unwrap_or(DEFAULT_SANDBOX_IMAGE)
        .to_owned()
}

/// containerd v2.3's default sandbox image.
pub const DEFAULT_SANDBOX_IMAGE: &str = "registry.k8s.io/pause:3.10.2";

/// The CRI settings under which CRI pulls bypass the transfer service (and
/// so every verifier).
fn local_pull(doc: &DocumentMut, version: i64, r: &mut Report) {
    // Version 3 splits CRI into images and runtime tables; version 2 keeps
    // one table with the runtime settings under `containerd`.
    let (images, runtime): (Vec<&str>, Vec<&str>) = if version >= 3 {
        (
            vec!["plugins", "io.containerd.cri.v1.images"],
            vec!["plugins", "io.containerd.cri.v1.images"],
        )
    } else {
        (
            vec!["plugins", "io.containerd.grpc.v1.cri"],
            vec!["plugins", "io.containerd.grpc.v1.cri", "containerd"],
        )
    };
    let get = |base: &[&str], k: &str| {
        let mut p = base.to_vec();
        p.extend(k.split('.'));
        table(doc, &p).cloned()
    };
    let why = "CRI falls back to local image pull, which no verifier sees (containerd logs \"Falling back to local image pull mode\")";
    if get(&images, "use_local_image_pull").and_then(|i| i.as_bool()) == Some(true) {
        r.problems
            .push(format!("use_local_image_pull = true: {why}"));
    }
    if get(&runtime, "disable_snapshot_annotations").and_then(|i| i.as_bool()) == Some(false) {
        r.problems
            .push(format!("disable_snapshot_annotations = false: {why}"));
    }
    if get(&runtime, "discard_unpacked_layers").and_then(|i| i.as_bool()) == Some(true) {
        r.problems
            .push(format!("discard_unpacked_layers = true: {why}"));
    }
    if let Some(n) = get(&images, "max_concurrent_downloads").and_then(|i| i.as_integer())
        && n != 3
    {
        r.problems.push(format!(
            "max_concurrent_downloads = {n} (only the default 3 keeps transfer-service pulls): {why}"
        ));
    }
    if get(&images, "image_pull_with_sync_fs").and_then(|i| i.as_bool()) == Some(true) {
        r.problems
            .push(format!("image_pull_with_sync_fs = true: {why}"));
    }
    for k in ["mirrors", "configs", "auths"] {
        let set = get(&images, &format!("registry.{k}")).is_some_and(|i| match i {
            Item::Table(t) => !t.is_empty(),
            Item::Value(v) => v.as_inline_table().is_some_and(|t| !t.is_empty()),
            _ => false,
        });
        if set {
            r.problems.push(format!(
                "registry.{k} is set (deprecated; use registry.config_path with hosts.toml): {why}"
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"version = 3
[plugins."io.containerd.image-verifier.v1.bindir"]
  bin_dir = "/opt/verifiers"
  max_verifiers = 10
  per_verifier_timeout = "10s"
[plugins."io.containerd.cri.v1.images".registry]
  config_path = "/etc/containerd/certs.d"
"#;

    fn sigil() -> Vec<Entry> {
        vec![Entry {
            name: VERIFIER.into(),
            executable: true,
        }]
    }

    #[test]
    fn a_config_that_calls_sigil_on_every_pull() {
        let r = check(GOOD, Some(&sigil()), Duration::from_secs(4)).unwrap();
        assert!(r.will_verify(), "{r:?}");
        assert!(r.settings[1].contains("/opt/verifiers"), "{r:?}");
    }

    #[test]
    fn each_setting_that_turns_it_off_is_named() {
        for (extra, says) in [
            (
                "[plugins.\"io.containerd.cri.v1.images\".registry.mirrors.\"docker.io\"]\n  endpoint = [\"https://m\"]\n",
                "registry.mirrors",
            ),
            (
                "[plugins.\"io.containerd.cri.v1.images\"]\n  max_concurrent_downloads = 5\n",
                "max_concurrent_downloads = 5",
            ),
            (
                "[plugins.\"io.containerd.cri.v1.images\"]\n  disable_snapshot_annotations = false\n",
                "disable_snapshot_annotations",
            ),
            (
                "[plugins.\"io.containerd.cri.v1.images\"]\n  discard_unpacked_layers = true\n",
                "discard_unpacked_layers",
            ),
            (
                "[plugins.\"io.containerd.cri.v1.images\"]\n  image_pull_with_sync_fs = true\n",
                "image_pull_with_sync_fs",
            ),
            (
                "[plugins.\"io.containerd.cri.v1.images\"]\n  use_local_image_pull = true\n",
                "use_local_image_pull",
            ),
        ] {
            let config = GOOD.replace(
                "[plugins.\"io.containerd.cri.v1.images\".registry]\n  config_path = \"/etc/containerd/certs.d\"\n",
                extra,
            );
            let r = check(&config, Some(&sigil()), Duration::from_secs(4)).unwrap();
            assert!(!r.will_verify(), "{extra}");
            assert!(r.problems.iter().any(|p| p.contains(says)), "{says}: {r:?}");
        }
        // Version 2 keeps them under the grpc CRI plugin.
        let v2 = "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".containerd]\n  discard_unpacked_layers = true\n[plugins.\"io.containerd.image-verifier.v1.bindir\"]\n  bin_dir = \"/v\"\n";
        let r = check(v2, Some(&sigil()), Duration::from_secs(4)).unwrap();
        assert!(
            r.problems
                .iter()
                .any(|p| p.contains("discard_unpacked_layers")),
            "{r:?}"
        );
    }

    #[test]
    fn regression_imports_and_disabled_plugins_are_read_as_containerd_reads_them() {
        let main = format!("imports = [\"/etc/containerd/conf.d/*.toml\"]\n{GOOD}");
        assert_eq!(imports(&main).unwrap(), ["/etc/containerd/conf.d/*.toml"]);
        let d = Duration::from_secs(4);
        // A drop-in that turns CRI pulls local.
        let drop_in = "version = 3\n[plugins.\"io.containerd.cri.v1.images\"]\n  use_local_image_pull = true\n".to_owned();
        let merged = merge(&main, &[drop_in]).unwrap();
        let r = check(&merged, Some(&sigil()), d).unwrap();
        assert!(
            r.problems
                .iter()
                .any(|p| p.contains("use_local_image_pull")),
            "{r:?}"
        );
        // A drop-in that disables the verifier plugin.
        let off = "disabled_plugins = [\"io.containerd.image-verifier.v1.bindir\"]\n".to_owned();
        let r = check(&merge(&main, &[off]).unwrap(), Some(&sigil()), d).unwrap();
        assert!(
            r.problems.iter().any(|p| p.contains("disabled_plugins")),
            "{r:?}"
        );
        // A drop-in's plugin table replaces the main file's whole table.
        let other_dir =
            "[plugins.\"io.containerd.image-verifier.v1.bindir\"]\n  bin_dir = \"/elsewhere\"\n"
                .to_owned();
        let merged = merge(&main, &[other_dir]).unwrap();
        assert_eq!(bin_dir(&merged).unwrap(), "/elsewhere");
        let r = check(&merged, Some(&sigil()), d).unwrap();
        assert!(r.settings[1].contains("max_verifiers 10"), "{r:?}");
    }

    #[test]
    fn regression_max_verifiers_minus_one_is_no_limit() {
        let d = Duration::from_secs(4);
        let unlimited = GOOD.replace("max_verifiers = 10", "max_verifiers = -1");
        let mut entries = sigil();
        entries.push(Entry {
            name: "a-first".into(),
            executable: true,
        });
        let r = check(&unlimited, Some(&entries), d).unwrap();
        assert!(r.will_verify(), "{r:?}");
        let none = GOOD.replace("max_verifiers = 10", "max_verifiers = 0");
        assert!(!check(&none, Some(&entries), d).unwrap().will_verify());
    }

    #[test]
    fn the_sandbox_image_is_read_from_either_version() {
        assert_eq!(sandbox_image(GOOD), DEFAULT_SANDBOX_IMAGE);
        let v3 = format!(
            "{GOOD}[plugins.\"io.containerd.cri.v1.images\".pinned_images]\n  sandbox = \"r.example.com/pause:1\"\n"
        );
        assert_eq!(sandbox_image(&v3), "r.example.com/pause:1");
        let v2 = "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\"]\n  sandbox_image = \"r.example.com/pause:2\"\n";
        assert_eq!(sandbox_image(v2), "r.example.com/pause:2");
    }

    #[test]
    fn the_verifier_directory_and_timeout_are_checked() {
        let d = Duration::from_secs(4);
        let r = check(GOOD, None, d).unwrap();
        assert!(r.problems[0].contains("does not exist"), "{r:?}");
        let r = check(GOOD, Some(&[]), d).unwrap();
        assert!(r.problems[0].contains("empty"), "{r:?}");
        let mut entries = sigil();
        entries.push(Entry {
            name: "a-dir".into(),
            executable: false,
        });
        let r = check(GOOD, Some(&entries), d).unwrap();
        assert!(r.problems[0].contains("fails every pull"), "{r:?}");
        let few = GOOD.replace("max_verifiers = 10", "max_verifiers = 1");
        let mut entries = sigil();
        entries.push(Entry {
            name: "a-first".into(),
            executable: true,
        });
        let r = check(&few, Some(&entries), d).unwrap();
        assert!(r.problems[0].contains("does not call it"), "{r:?}");
        let short = GOOD.replace("\"10s\"", "\"3s\"");
        let r = check(&short, Some(&sigil()), d).unwrap();
        assert!(r.problems[0].contains("kills sigil"), "{r:?}");
        assert_eq!(go_duration("1m30s"), Some(Duration::from_secs(90)));
        assert_eq!(go_duration("500ms"), Some(Duration::from_millis(500)));
        assert!(check("not = [toml", None, d).is_err());
    }
}
