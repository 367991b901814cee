//! `sigil verify-bundle`: one Sigstore bundle, verified offline, speaking the
//! Sigstore conformance suite's CLI protocol. The checks are
//! `sigil_verify::bundle`; this reads the files and reports.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context as _, Result, bail};
use sigil_verify::bundle::Matcher;
use sigil_verify::bundle::{Artifact, Requirements, Signer};
use sigil_verify::keys::PublicKey;
use sigil_verify::trust::TrustedRoot;

/// Flags of `sigil verify-bundle`.
#[derive(clap::Args, Debug)]
pub struct VerifyBundleArgs {
    /// The Sigstore bundle (JSON).
    #[arg(long)]
    bundle: PathBuf,
    /// Expected certificate identity (SAN), exactly.
    #[arg(long, requires = "certificate_oidc_issuer", conflicts_with = "key")]
    certificate_identity: Option<String>,
    /// Expected OIDC issuer, exactly.
    #[arg(long, requires = "certificate_identity")]
    certificate_oidc_issuer: Option<String>,
    /// Verify with this PEM public key instead of an identity.
    #[arg(long)]
    key: Option<PathBuf>,
    /// trusted_root.json (default: the embedded Sigstore public-good root).
    #[arg(long)]
    trusted_root: Option<PathBuf>,
    /// The artifact: a file, or `sha256:<hex>` (when no such file exists).
    file_or_digest: String,
}

fn artifact(arg: &str) -> Result<Artifact> {
    let path = std::path::Path::new(arg);
    if !path.exists()
        && let Some(hex) = arg.strip_prefix("sha256:")
    {
        if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            bail!("{arg:?} is neither a file nor a sha256:<64 hex> digest");
        }
        let mut d = [0u8; 32];
        for (i, b) in d.iter_mut().enumerate() {
            *b = u8::from_str_radix(&hex[i * 2..i * 2 + 2], 16).context("hex digest")?;
        }
        return Ok(Artifact::Digest(d));
    }
    Ok(Artifact::Bytes(
        std::fs::read(path).with_context(|| format!("reading artifact {arg}"))?,
    ))
}

/// Runs `sigil verify-bundle`: exit 0 verified, 1 not verified, 2 bad input.
pub fn run(args: VerifyBundleArgs) -> Result<ExitCode> {
    let bundle = std::fs::read(&args.bundle)
        .with_context(|| format!("reading bundle {}", args.bundle.display()))?;
    let trust = match &args.trusted_root {
        Some(p) => TrustedRoot::from_json(
            &std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?,
        )
        .with_context(|| format!("trusted root {}", p.display()))?,
        None => TrustedRoot::public_good().context("the embedded trusted root")?,
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
    let identity = args
        .certificate_identity
        .zip(args.certificate_oidc_issuer)
        .map(|(san, issuer)| (Matcher::Exact(san), Matcher::Exact(issuer)));
    let signer = match (&key, &identity) {
        (Some(k), _) => Signer::Key(k),
        (None, Some((san, issuer))) => Signer::Identity { san, issuer },
        _ => bail!("give --key FILE, or --certificate-identity and --certificate-oidc-issuer"),
    };
    let artifact = artifact(&args.file_or_digest)?;
    match sigil_verify::bundle::verify(&bundle, &artifact, signer, Requirements::default(), &trust)
    {
        Ok(v) => {
            let times: Vec<String> = v
                .times
                .iter()
                .map(|t| {
                    let at = std::time::UNIX_EPOCH
                        + std::time::Duration::from_secs(u64::try_from(*t).unwrap_or(0));
                    humantime::format_rfc3339_seconds(at).to_string()
                })
                .collect();
            println!(
                "verified: {} inclusion proof(s) against signed checkpoints, {} RFC 3161 timestamp(s); verified signing time(s): {}",
                v.inclusion_proofs,
                v.timestamps,
                times.join(", ")
            );
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => {
            eprintln!("verification failed: {e}");
            Ok(ExitCode::from(super::EXIT_FINDINGS))
        }
    }
}
