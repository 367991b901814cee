//! `sigil verify-bundle`: Sigstore bundles (v0.1–v0.3), files of one bundle
//! per line (`.intoto.jsonl`, `gh attestation download`), and bare DSSE
//! envelopes (with `--key`), verified offline against a file or a digest.
//! Without `--predicate-type`/`--condition` it speaks the Sigstore
//! conformance suite's CLI protocol; with them it verifies attestations:
//! a statement of that type about the artifact, signed as required, whose
//! every condition holds. The checks are `sigil_verify::{bundle, envelope}`
//! and `sigil_core::attest`; this reads the files and reports.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context as _, Result, bail};
use sigil_core::attest::{Condition, DEFAULT_MAX_ATTESTATION_BYTES, Evidence, Statement};
use sigil_verify::bundle::{Artifact, Matcher, Requirements, Signer, Verified};
use sigil_verify::keys::PublicKey;
use sigil_verify::trust::TrustedRoot;

/// Flags of `sigil verify-bundle`.
#[derive(clap::Args, Debug)]
pub struct VerifyBundleArgs {
    /// A Sigstore bundle (JSON), a file of one bundle or envelope per line,
    /// or a bare DSSE envelope (with --key).
    #[arg(long)]
    bundle: PathBuf,
    /// Expected certificate identity (SAN), exactly.
    #[arg(long, conflicts_with_all = ["key", "certificate_identity_regexp"])]
    certificate_identity: Option<String>,
    /// Expected certificate identity (SAN), as a regular expression.
    #[arg(long, conflicts_with = "key")]
    certificate_identity_regexp: Option<String>,
    /// Expected OIDC issuer, exactly.
    #[arg(long, conflicts_with = "certificate_oidc_issuer_regexp")]
    certificate_oidc_issuer: Option<String>,
    /// Expected OIDC issuer, as a regular expression.
    #[arg(long)]
    certificate_oidc_issuer_regexp: Option<String>,
    /// The certificate's GitHub workflow trigger extension must be this.
    #[arg(long)]
    certificate_github_workflow_trigger: Option<String>,
    /// The certificate's GitHub workflow SHA extension must be this.
    #[arg(long)]
    certificate_github_workflow_sha: Option<String>,
    /// The certificate's GitHub workflow name extension must be this.
    #[arg(long)]
    certificate_github_workflow_name: Option<String>,
    /// The certificate's GitHub workflow repository extension must be this (`owner/repo`).
    #[arg(long)]
    certificate_github_workflow_repository: Option<String>,
    /// The certificate's GitHub workflow ref extension must be this.
    #[arg(long)]
    certificate_github_workflow_ref: Option<String>,
    /// Verify with this PEM public key instead of an identity.
    #[arg(long)]
    key: Option<PathBuf>,
    /// trusted_root.json, or a built-in root's name: `public-good` (the
    /// default) or `github` (GitHub's own instance: private repositories'
    /// attestations).
    #[arg(long)]
    trusted_root: Option<PathBuf>,
    /// Verify an attestation of this predicate type (a URI, or cosign's
    /// short names: slsaprovenance, slsaprovenance1, spdx, cyclonedx, vuln, openvex, custom).
    #[arg(long)]
    predicate_type: Option<String>,
    /// A CEL condition over the statement that must hold (repeatable);
    /// variables: predicateType, predicate, statement, subject, signer, timestamps, now.
    #[arg(long = "condition")]
    conditions: Vec<String>,
    /// The artifact: a file, or `sha256:<hex>` / `sha512:<hex>` (when no such file exists).
    file_or_digest: String,
}

fn hex_bytes<const N: usize>(arg: &str, hex: &str) -> Result<[u8; N]> {
    if hex.len() != N * 2 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        bail!(
            "{arg:?} is neither a file nor a digest of {} hex digits",
            N * 2
        );
    }
    let mut d = [0u8; N];
    for (i, b) in d.iter_mut().enumerate() {
        *b = u8::from_str_radix(&hex[i * 2..i * 2 + 2], 16).context("hex digest")?;
    }
    Ok(d)
}

fn artifact(arg: &str) -> Result<Artifact> {
    let path = std::path::Path::new(arg);
    if !path.exists() {
        if let Some(hex) = arg.strip_prefix("sha256:") {
            return Ok(Artifact::Digest(hex_bytes(arg, hex)?));
        }
        if let Some(hex) = arg.strip_prefix("sha512:") {
            return Ok(Artifact::Sha512(hex_bytes(arg, hex)?));
        }
    }
    Ok(Artifact::Bytes(
        std::fs::read(path).with_context(|| format!("reading artifact {arg}"))?,
    ))
}

fn matcher(exact: Option<String>, regex: Option<String>, what: &str) -> Result<Option<Matcher>> {
    Ok(match (exact, regex) {
        (Some(e), _) => Some(Matcher::Exact(e)),
        (None, Some(r)) => Some(Matcher::Regex(
            sigil_core::verify::identity_regex(&r).map_err(|e| anyhow::anyhow!("{what}: {e}"))?,
        )),
        (None, None) => None,
    })
}

/// The documents in the bundle file: the whole file when it is one JSON
/// value, else each non-empty line.
fn documents(bytes: &[u8]) -> Vec<&[u8]> {
    if serde_json::from_slice::<serde::de::IgnoredAny>(bytes).is_ok() {
        return vec![bytes];
    }
    bytes
        .split(|b| *b == b'\n')
        .filter(|l| l.iter().any(|b| !b.is_ascii_whitespace()))
        .collect()
}

/// What attestation mode demands beyond a valid signature.
struct Attestation {
    predicate_type: Option<String>,
    conditions: Vec<Condition>,
}

/// Runs `sigil verify-bundle`: exit 0 verified, 1 not verified, 2 bad input.
pub fn run(args: VerifyBundleArgs) -> Result<ExitCode> {
    let bytes = std::fs::read(&args.bundle)
        .with_context(|| format!("reading bundle {}", args.bundle.display()))?;
    // A built-in root's name (`github`, `public-good`) when no such file.
    let built_in = args.trusted_root.as_ref().and_then(|p| {
        let name = p.to_str()?;
        (!p.exists())
            .then(|| {
                sigil_verify::roots::BUILT_IN
                    .iter()
                    .find(|(n, _)| *n == name)
            })
            .flatten()
    });
    let trust = match (&args.trusted_root, built_in) {
        (_, Some((name, json))) => {
            TrustedRoot::from_json(json).with_context(|| format!("the embedded {name} root"))?
        }
        (Some(p), None) => TrustedRoot::from_json(
            &std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?,
        )
        .with_context(|| format!("trusted root {}", p.display()))?,
        (None, None) => TrustedRoot::public_good().context("the embedded trusted root")?,
    };
    let key = args
        .key
        .as_ref()
        .map(|k| {
            let pem =
                std::fs::read_to_string(k).with_context(|| format!("reading {}", k.display()))?;
            PublicKey::from_pem(&pem).with_context(|| format!("key {}", k.display()))
        })
        .transpose()?;
    let san = matcher(
        args.certificate_identity,
        args.certificate_identity_regexp,
        "--certificate-identity-regexp",
    )?;
    let issuer = matcher(
        args.certificate_oidc_issuer,
        args.certificate_oidc_issuer_regexp,
        "--certificate-oidc-issuer-regexp",
    )?;
    // Matched on the certificate by the verifier, as cosign's flags are.
    let extensions: Vec<(String, Matcher)> = [
        (
            "githubWorkflowTrigger",
            args.certificate_github_workflow_trigger,
        ),
        ("githubWorkflowSha", args.certificate_github_workflow_sha),
        ("githubWorkflowName", args.certificate_github_workflow_name),
        (
            "githubWorkflowRepository",
            args.certificate_github_workflow_repository,
        ),
        ("githubWorkflowRef", args.certificate_github_workflow_ref),
    ]
    .into_iter()
    .filter_map(|(n, v)| Some((n.to_owned(), Matcher::Exact(v?))))
    .collect();
    let signer = match (&key, &san, &issuer) {
        (Some(_), _, _) if !extensions.is_empty() => bail!(
            "--certificate-github-workflow-* check a certificate; a key-signed bundle has none"
        ),
        (Some(k), _, _) => Signer::Key(k),
        (None, Some(san), Some(issuer)) => Signer::Identity {
            san,
            issuer,
            extensions: &extensions,
        },
        _ => bail!(
            "give --key FILE, or a certificate identity (--certificate-identity[-regexp]) and issuer (--certificate-oidc-issuer[-regexp])"
        ),
    };
    let want = Attestation {
        predicate_type: args
            .predicate_type
            .map(|p| sigil_core::attest::predicate_type_uri(&p).to_owned()),
        conditions: args
            .conditions
            .iter()
            .map(|c| Condition::compile(c, None))
            .collect::<Result<_, _>>()?,
    };
    let attesting = want.predicate_type.is_some() || !want.conditions.is_empty();
    let artifact = artifact(&args.file_or_digest)?;
    let docs = documents(&bytes);
    let mut failures = Vec::new();
    for (i, doc) in docs.iter().enumerate() {
        let at = if docs.len() > 1 {
            format!("line {}: ", i + 1)
        } else {
            String::new()
        };
        let verified = match (serde_json::from_slice(doc), &key) {
            (Ok(v), Some(k)) if sigil_verify::envelope::is_envelope(&v) => {
                sigil_verify::envelope::verify(doc, &artifact, k)
            }
            _ => sigil_verify::bundle::verify(
                doc,
                &artifact,
                signer,
                Requirements::default(),
                &trust,
            ),
        };
        let v = match verified {
            Ok(v) => v,
            Err(e) => {
                failures.push(format!("{at}{e}"));
                continue;
            }
        };
        report_signature(&at, &v)?;
        // What the judgment printed goes out before its verdict is read.
        let mut said = String::new();
        let judged = judge(
            &v,
            &want,
            &args.file_or_digest,
            &artifact,
            attesting,
            &mut said,
        );
        super::write_out(&said)?;
        match judged {
            Ok(()) => return Ok(ExitCode::SUCCESS),
            Err(why) => failures.push(format!("{at}{why}")),
        }
    }
    for f in &failures {
        eprintln!("verification failed: {f}");
    }
    if failures.is_empty() {
        eprintln!(
            "verification failed: {} holds no bundle",
            args.bundle.display()
        );
    }
    Ok(ExitCode::from(super::EXIT_FINDINGS))
}

fn report_signature(at: &str, v: &Verified) -> Result<()> {
    let times: Vec<String> = v
        .times
        .iter()
        .map(|t| {
            let at = std::time::UNIX_EPOCH
                + std::time::Duration::from_secs(u64::try_from(*t).unwrap_or(0));
            humantime::format_rfc3339_seconds(at).to_string()
        })
        .collect();
    say!(
        "{at}signature verified: {} inclusion proof(s) against signed checkpoints, {} RFC 3161 timestamp(s); verified signing time(s): {}",
        v.inclusion_proofs,
        v.timestamps,
        if times.is_empty() {
            "none (a key-signed envelope carries none)".to_owned()
        } else {
            times.join(", ")
        }
    )
}

/// Whether a verified bundle is the attestation asked for; writes what it
/// judged (statement, signer, each condition) to `said`.
fn judge(
    v: &Verified,
    want: &Attestation,
    artifact_arg: &str,
    artifact: &Artifact,
    attesting: bool,
    said: &mut String,
) -> Result<(), String> {
    use std::fmt::Write as _;
    let id = v.identity.clone().unwrap_or_default();
    if !attesting {
        return Ok(());
    }
    let payload = v
        .statement
        .as_deref()
        .ok_or("the bundle signs a message, not an in-toto statement")?;
    let statement =
        Statement::parse(payload, DEFAULT_MAX_ATTESTATION_BYTES).map_err(|e| e.to_string())?;
    let _ = writeln!(
        said,
        "statement: predicateType {}, signer {}",
        statement.predicate_type,
        if v.identity.is_some() {
            id.to_string()
        } else {
            "the key".to_owned()
        }
    );
    if let Some(p) = &want.predicate_type
        && statement.predicate_type != *p
    {
        return Err(format!(
            "the statement's predicate type is {}, not {p}",
            statement.predicate_type
        ));
    }
    let signer = sigil_verify::attest::signer_vars(
        if v.identity.is_some() {
            "certificate"
        } else {
            "key"
        },
        v.identity.as_ref(),
    );
    let digest = artifact
        .subject_digests()
        .into_iter()
        .find(|(alg, hex)| statement.names(&format!("{alg}:{hex}")))
        .map(|(alg, hex)| format!("{alg}:{hex}"))
        .unwrap_or_else(|| artifact_arg.to_owned());
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX));
    let results = sigil_core::attest::evaluate(
        &want.conditions,
        &Evidence {
            statement: &statement,
            digest: &digest,
            signer: &signer,
            image: None,
            timestamps: &v.times,
        },
        now,
    );
    for r in &results {
        let _ = writeln!(
            said,
            "  condition {}",
            sigil_core::text::escape_controls(&r.describe())
        );
    }
    match results.iter().find(|r| !r.holds()) {
        Some(r) => Err(format!("condition not met: {}", r.describe())),
        None => Ok(()),
    }
}
