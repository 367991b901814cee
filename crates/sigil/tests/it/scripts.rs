//! The repository's scripts, run where they can be: each parses as bash
//! (`bash -n`), and the start-up order filter (`scripts/startup-order.awk`,
//! which `scripts/startup-order.sh` runs over a callgrind profile of `sigil
//! serve`) is run over a profile in callgrind's format. The whole
//! `startup-order.sh` takes valgrind and twelve minutes, so CI runs its
//! parts; docs/operations.md says when to run it.

use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Caught an apostrophe in a comment inside the single-quoted awk program
/// of scripts/startup-order.sh, which ended the program early: the script
/// failed after its twelve minutes of profiling.
#[test]
fn every_script_parses_as_bash() {
    let mut checked = 0;
    for entry in std::fs::read_dir(root().join("scripts")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "sh") {
            let out = Command::new("bash").arg("-n").arg(&path).output().unwrap();
            assert!(
                out.status.success(),
                "{}: {}",
                path.display(),
                String::from_utf8_lossy(&out.stderr)
            );
            checked += 1;
        }
    }
    assert!(checked >= 3, "{checked} scripts");
}

/// The order file lists the profiled binary's own functions, each once,
/// first seen first; not other objects' functions, addresses without a
/// symbol, or callgrind's pseudo-functions. Names are given once as
/// `(id) name` and by `(id)` afterwards, for objects and functions alike.
#[test]
fn the_startup_order_keeps_the_binarys_named_functions_first_seen_first() {
    let profile = "\
version: 1
creator: callgrind-3.19.0
events: Ir
ob=(1) /work/sigil
fl=(1) ???
fn=(1) _ZN5sigil4main17h0123456789abcdefE
1 5
cob=(2) /usr/lib/x86_64-linux-gnu/libc.so.6
cfn=(2) memcpy
calls=1 0
1 3
fn=(3) 0x0000000000012345
1 1
fn=(4) (below main)
1 1
ob=(2)
fn=(2)
1 2
fn=(5) _ZN5tokio7runtime5enter17hfedcba9876543210E
1 4
ob=(1)
fn=(6) aws_lc_0_47_0_sha256_init
1 2
fn=(1)
1 1
";
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("callgrind.out");
    std::fs::write(&file, profile).unwrap();
    let out = crate::support::sigil::run_ok(
        Command::new("awk")
            .args(["-v", "bin=/work/sigil", "-f"])
            .arg(root().join("scripts/startup-order.awk"))
            .arg(&file),
    );
    assert_eq!(
        String::from_utf8(out.stdout).unwrap(),
        "_ZN5sigil4main17h0123456789abcdefE\naws_lc_0_47_0_sha256_init\n",
    );
}
