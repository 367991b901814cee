//! The TUF conformance suite's client-under-test CLI
//! (theupdateframework/tuf-conformance, `CLIENT-CLI.md`) over sigil's TUF
//! client, so the suite judges the workflow sigil runs. Not shipped: built
//! with `cargo build -p sigil-verify --example tuf_conformance`, run by the
//! suite as its entrypoint (docs/trust.md says how, and what it found).
//!
//! ```text
//! tuf_conformance --metadata-dir DIR init TRUSTED_ROOT
//! tuf_conformance --metadata-dir DIR --metadata-url URL refresh
//! tuf_conformance --metadata-dir DIR --metadata-url URL --target-name PATH…
//!                 --target-base-url URL --target-dir DIR download
//! ```
//! Exit 0 on success, 1 on any failure (the reason on stderr).

use std::path::PathBuf;
use std::process::ExitCode;

use sigil_verify::tuf::Repository;

#[derive(Default)]
struct Args {
    metadata_dir: Option<PathBuf>,
    metadata_url: Option<String>,
    target_names: Vec<String>,
    target_base_url: Option<String>,
    target_dir: Option<PathBuf>,
    command: Vec<String>,
}

fn parse() -> Result<Args, String> {
    let mut a = Args::default();
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut value = || it.next().ok_or(format!("{arg} needs a value"));
        match arg.as_str() {
            "--metadata-dir" => a.metadata_dir = Some(value()?.into()),
            "--metadata-url" => a.metadata_url = Some(value()?),
            "--target-name" => a.target_names.push(value()?),
            "--target-base-url" => a.target_base_url = Some(value()?),
            "--target-dir" => a.target_dir = Some(value()?.into()),
            _ => a.command.push(arg),
        }
    }
    Ok(a)
}

/// A file name for a target path (its path, each `/` escaped).
fn file_name(path: &str) -> String {
    path.replace('%', "%25").replace('/', "%2F")
}

fn run(a: Args) -> Result<(), String> {
    let dir = a.metadata_dir.ok_or("--metadata-dir is required")?;
    let http = reqwest::Client::new();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    match a.command.iter().map(String::as_str).collect::<Vec<_>>()[..] {
        ["init", root] => std::fs::copy(root, dir.join("root.json"))
            .map(|_| ())
            .map_err(|e| format!("{root}: {e}")),
        ["refresh"] => {
            let url = a.metadata_url.ok_or("--metadata-url is required")?;
            let repo = Repository::new(&url, &url, http, dir).map_err(|e| e.to_string())?;
            runtime.block_on(repo.refresh()).map_err(|e| e.to_string())
        }
        ["download"] => {
            let url = a.metadata_url.ok_or("--metadata-url is required")?;
            let targets = a.target_base_url.ok_or("--target-base-url is required")?;
            let out = a.target_dir.ok_or("--target-dir is required")?;
            let repo = Repository::new(&url, &targets, http, dir).map_err(|e| e.to_string())?;
            // A target downloaded before is used again when it still has
            // the length and hashes the metadata gives.
            let cached = |name: &str| std::fs::read(out.join(file_name(name))).ok();
            let got = runtime
                .block_on(repo.targets(&a.target_names, cached))
                .map_err(|e| e.to_string())?;
            for (name, bytes) in a.target_names.iter().zip(got) {
                let path = out.join(file_name(name));
                // A cached target is left as it is.
                if std::fs::read(&path).ok().as_deref() != Some(&bytes[..]) {
                    std::fs::write(&path, bytes).map_err(|e| format!("{name}: {e}"))?;
                }
            }
            Ok(())
        }
        _ => Err(format!("unknown command {:?}", a.command)),
    }
}

fn main() -> ExitCode {
    match parse().and_then(run) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("tuf_conformance: {e}");
            ExitCode::FAILURE
        }
    }
}
