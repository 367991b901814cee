//! `sigil verify IMAGE`: the tool a user runs after a denial. Decides one
//! image exactly as the webhook would (the one per-object decision, on a Pod
//! holding it: rewrite, pin, gather, verify) and prints what each verifier
//! found. It decides nothing itself; its lines go out through `say!`, so
//! `sigil verify IMAGE | head -1` ends with an error, not a panic.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use anyhow::Result;
use serde_json::json;
use sigil_core::walker::summarize_value;
use sigil_core::{ObjectFacts, ObjectRef, Operation, Outcome, Source, VerifierOutcome};

use super::{CredentialArgs, EXIT_FINDINGS, engine_for, load_policy};

/// Flags of `sigil verify`.
#[derive(clap::Args, Debug)]
pub struct VerifyArgs {
    /// ImagePolicy file; without it, the embedded default.
    #[arg(long, env = "SIGIL_POLICY")]
    policy: Option<PathBuf>,
    /// Namespace the image would run in (exemptions).
    #[arg(short = 'n', long, default_value = sigil::pin::DEFAULT_NAMESPACE)]
    namespace: String,
    /// Time allowed for the registry lookups.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    timeout: std::time::Duration,
    #[command(flatten)]
    creds: CredentialArgs,
    /// The image, as it would be written in a Pod.
    image: String,
}

/// Runs `sigil verify`: exit 0 admitted, 1 denied (or warned), 2 error.
pub fn run(args: VerifyArgs) -> Result<ExitCode> {
    let engine = engine_for(load_policy(args.policy.as_deref())?, &args.creds.sources()?)?;
    let pod = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "sigil-verify", "namespace": args.namespace},
        "spec": {"containers": [{"name": "image", "image": args.image}]}});
    let verdict = super::runtime()?.block_on(engine.decide(
        ObjectFacts {
            operation: Operation::Create,
            source: Source::Manifest,
            kind: "Pod",
            namespace: Some(&args.namespace),
            object: Some(summarize_value(&pod)),
            old_object: None,
            namespace_labels: None,
        },
        Instant::now() + args.timeout,
    ));
    say!("image:   {}", args.image)?;
    say!("policy:  {}", engine.policy.name)?;
    if let Some(skip) = verdict.skipped {
        say!("result:  passes untouched ({})", skip.as_str())?;
        return Ok(ExitCode::SUCCESS);
    }
    let Some(f) = verdict.fields.first() else {
        anyhow::bail!("no image to decide");
    };
    let rule = match &f.outcome {
        Outcome::Unchanged { rule } | Outcome::Changed { rule, .. } => Some(rule.as_str()),
        Outcome::NeedsLookup { rule, .. } => Some(rule.as_str()),
        Outcome::Failed(_) => None,
    };
    if let Some(rule) = rule {
        say!("rule:    {rule}")?;
    }
    if let Outcome::Changed { new, .. } = &f.outcome {
        say!("runs as: {new}")?;
    }
    match &f.report {
        None => say!("verify:  the rule checks no signatures")?,
        Some(r) => {
            if let Some(e) = &r.fetch_failure {
                say!("verify:  signatures could not be fetched: {e}")?;
            } else if r.results.is_empty() {
                say!("verify:  the rule checks no signatures, only attestations")?;
            } else {
                let at = match (&r.platforms, r.signed_at) {
                    (None, _) => "",
                    (Some(_), sigil_core::verify::SignedAt::Platforms) => {
                        "at the index (not required there): "
                    }
                    (Some(_), _) => "at the index: ",
                };
                say!(
                    "verify:  {at}{} of {} verifiers passed (need {}{})",
                    r.passed_names().len(),
                    r.results.len(),
                    r.threshold,
                    if r.required.is_empty() {
                        String::new()
                    } else {
                        format!(", including {}", r.required.join(", "))
                    }
                )?;
            }
            for found in &r.found {
                say!("  found: {}", sigil_core::text::escape_controls(found))?;
            }
            for (name, o) in &r.results {
                match o {
                    VerifierOutcome::Passed { examined, logged } => {
                        say!("  {name}: passed ({examined} signature(s) examined)")?;
                        for l in logged {
                            say!("    logged: {l}")?;
                        }
                    }
                    VerifierOutcome::Failed { examined, problem } => {
                        say!("  {name}: FAILED: {problem} ({examined} signature(s) examined)")?;
                    }
                }
            }
            print_platforms(r)?;
            print_attestations(r)?;
        }
    }
    match &f.outcome {
        Outcome::Failed(finding) => {
            let object = ObjectRef::new("Pod", &args.namespace, Some("sigil-verify"), None);
            say!("result:  {} — {}", f.label(), finding.message(&object))?;
            Ok(ExitCode::from(EXIT_FINDINGS))
        }
        _ => {
            say!("result:  admitted ({})", f.label())?;
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// What each platform manifest of an index carried, when the rule's
/// `signatures.signedAt` reads them: which verifiers passed there, and why
/// the others did not.
fn print_platforms(r: &sigil_core::VerificationReport) -> Result<()> {
    use sigil_core::text::escape_controls as safe;
    let Some(ps) = &r.platforms else {
        return Ok(());
    };
    say!(
        "platforms (signatures.signedAt: {}): {} manifest(s) in the index",
        r.signed_at.as_str(),
        ps.len()
    )?;
    for p in ps {
        let verdict = match &p.fetch_failure {
            Some(e) => format!("signatures could not be fetched: {e}"),
            None if p.satisfied(r.threshold, &r.required) => "signed".into(),
            None => "NOT SIGNED as the rule requires".into(),
        };
        say!(
            "  {} {}: {verdict}",
            safe(&p.manifest.platform),
            p.manifest.digest
        )?;
        for found in &p.found {
            say!("    found: {}", safe(found))?;
        }
        for (name, o) in &p.results {
            match o {
                VerifierOutcome::Passed { .. } => say!("    {name}: passed")?,
                VerifierOutcome::Failed { problem, .. } => say!("    {name}: FAILED: {problem}")?,
            }
        }
    }
    Ok(())
}

/// Every attestation found for each entry: predicate type, who signed it,
/// and each condition, true or false.
fn print_attestations(r: &sigil_core::VerificationReport) -> Result<()> {
    use sigil_core::text::escape_controls as safe;
    for e in &r.attestations {
        say!(
            "attestation {}: {} ({}; {} found, {} of other types)",
            e.name,
            if e.passed() { "passed" } else { "FAILED" },
            e.predicate_type,
            e.seen.len(),
            e.other_types
        )?;
        for s in &e.seen {
            match &s.attestor {
                Some(a) => say!(
                    "  - {}: verified by {a}, signer {} ({})",
                    e.predicate_type,
                    safe(&s.signer),
                    safe(&s.form)
                )?,
                None => say!(
                    "  - not verified: {} ({})",
                    safe(s.problem.as_deref().unwrap_or("unverified")),
                    safe(&s.form)
                )?,
            }
            for c in &s.conditions {
                say!("      condition {}", safe(&c.describe()))?;
            }
        }
    }
    Ok(())
}
