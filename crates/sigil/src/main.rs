//! `sigil`: the command line. Flags and glue only: each subcommand lives in
//! its own module under `cmd/`, which parses its flags, calls the library
//! crates and renders the answer. Errors become `error: …` on stderr and
//! exit code 2.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod cmd;

#[derive(Parser, Debug)]
#[command(
    name = "sigil",
    version,
    about = "Rewrite, pin and verify every container image that enters a Kubernetes cluster"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// Internal networks (CIDR, comma-separated) that notation CRL fetches
    /// may reach. By default a CRL distribution point on a loopback,
    /// link-local, private or other internal address is refused, so a
    /// certificate cannot point sigil at the cluster's own services.
    #[arg(
        long,
        global = true,
        env = "SIGIL_CRL_ALLOW_NETWORKS",
        value_delimiter = ','
    )]
    crl_allow_networks: Vec<ipnet::IpNet>,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run the mutating admission webhook.
    Serve(Box<cmd::serve::ServeArgs>),
    /// Pin (and rewrite) every image in manifests before they go into Git.
    ///
    /// Exit codes: 0 done; 1 an image is denied by the policy, or (--check)
    /// not pinned / not rewritten / failing policy; 2 bad input or usage.
    Pin(cmd::pin::PinArgs),
    /// Run as a KRM function: ResourceList on stdin, pinned ResourceList on stdout.
    ///
    /// Invoked as `sigil-krm` (a symlink), sigil runs this mode with no
    /// arguments, for orchestrators whose exec spec takes none (kustomize).
    Krm(cmd::krm::KrmArgs),
    /// Find what runs that the policy would not admit now (current kubeconfig).
    ///
    /// Lists Pods and workloads (paginated), decides each as the webhook
    /// would, and reports per image: compliant, not pinned, would be
    /// rewritten, denied, signature problem, unresolvable, exempt, or running
    /// digest drift. Exit codes: 0 compliant; 1 violations; 2 error.
    Audit(Box<cmd::audit::AuditArgs>),
    /// Decide one image as the webhook would and show what each signature verifier found.
    ///
    /// The tool to run after a denial. Exit codes: 0 admitted; 1 denied or
    /// warned; 2 bad input.
    Verify(Box<cmd::verify::VerifyArgs>),
    /// Verify one Sigstore bundle offline (the Sigstore conformance CLI protocol).
    ///
    /// Exit codes: 0 verified; 1 not verified (the reason on stderr); 2 bad input.
    VerifyBundle(cmd::verify_bundle::VerifyBundleArgs),
    /// Emergency switch: delete sigil's webhook configurations and keep every
    /// replica from registering them again, until `--end`.
    ///
    /// While it is on, images are NOT checked (the cluster runs fail-open).
    /// Afterwards, audit what was admitted: see docs/operations.md.
    BreakGlass(cmd::break_glass::BreakGlassArgs),
    /// Sigstore trusted roots: what is in force and where it comes from.
    TrustRoot {
        #[command(subcommand)]
        command: cmd::trust_root::TrustRootCommand,
    },
    /// Print the ClusterImagePolicy, ImagePolicy, TrustRoot and ImagePolicyException CRDs (YAML).
    Crds,
    /// Print the in-API-server backstop for a policy: a ValidatingAdmissionPolicy
    /// and binding that refuse, while the webhook does not answer, Pods whose
    /// images sigil would never admit (no digest where a rule pins, not at the
    /// mirror, denied, matching no rule).
    Backstop(cmd::backstop::BackstopArgs),
    /// sigil on a node: containerd's image verifier (`sigil node verify`,
    /// which `sigil-containerd` in containerd's bin_dir runs) and `sigil
    /// node check` (will containerd call it?). docs/node.md.
    Node {
        #[command(subcommand)]
        command: cmd::node::NodeCommand,
    },
    /// Run policy test suites (`sigil-test.yaml`): policies, resources, an
    /// offline registry of OCI layouts, and the results they must give.
    ///
    /// Exit codes: 0 every expected result holds; 1 one does not; 2 bad input.
    Test(cmd::test::TestArgs),
    /// Copy images from their origin into the mirror the policy maps them
    /// to (with signatures, attestations and referrers), for pre-seeding.
    ///
    /// Exit codes: 0 every image copied; 1 a copy failed; 2 bad input.
    Mirror(cmd::mirror::MirrorArgs),
    /// Work with policy files.
    Policy {
        #[command(subcommand)]
        command: cmd::policy::PolicyCommand,
    },
}

fn main() -> ExitCode {
    if cmd::invoked_as("sigil-containerd") {
        let args: Vec<String> = std::env::args_os()
            .skip(1)
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        return cmd::node::verify(&args);
    }
    let cli = if cmd::invoked_as("sigil-krm") {
        let mut args = vec![std::ffi::OsString::from("sigil"), "krm".into()];
        args.extend(std::env::args_os().skip(1));
        Cli::parse_from(args)
    } else {
        Cli::parse()
    };
    sigil_verify::crl::fetch::allow_networks(cli.crl_allow_networks);
    let result = match cli.command {
        Command::Serve(args) => cmd::serve::run(*args),
        Command::Pin(args) => cmd::pin::run(args),
        Command::Krm(args) => cmd::krm::run(args),
        Command::Audit(args) => cmd::audit::run(*args),
        Command::Verify(args) => cmd::verify::run(*args),
        Command::VerifyBundle(args) => cmd::verify_bundle::run(args),
        Command::BreakGlass(args) => cmd::break_glass::run(args),
        Command::TrustRoot { command } => cmd::trust_root::run(command),
        Command::Crds => cmd::crds::run(),
        Command::Backstop(args) => cmd::backstop::run(args),
        Command::Node { command } => cmd::node::run(command),
        Command::Policy { command } => cmd::policy::run(command),
        Command::Test(args) => cmd::test::run(args),
        Command::Mirror(args) => cmd::mirror::run(args),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {}", one_line(&e));
            ExitCode::from(cmd::EXIT_ERROR)
        }
    }
}

/// An error and its causes on one line, each cause once: a cause whose text
/// an outer error already carries (`{context}: {source}`) is not repeated.
fn one_line(e: &anyhow::Error) -> String {
    let mut s = String::new();
    for cause in e.chain() {
        let t = cause.to_string();
        if s.contains(&t) {
            continue;
        }
        if !s.is_empty() {
            s.push_str(": ");
        }
        s.push_str(&t);
    }
    s
}
