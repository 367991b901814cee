//! An authority in a trusted root is one chain and one window — never
//! widened by what a bundle or a timestamp token brings. Each case is minted
//! offline in a scene laid out as GitHub's root is (`sigil_testkit::windows`:
//! one root, shared intermediates, per-window issuing certificates that
//! outlive their windows, overlapping windows, no log), with a valid control
//! that must still verify, and is judged by the Sigstore project's verifier
//! (`sigstore-verify`) beside sigil; a disagreement is triaged in
//! [`TRIAGED`] as `tests/oracle.rs` does.

#![allow(clippy::unwrap_used)]

use sigil_core::Policy;
use sigil_core::verify::TlogPolicy;
use sigil_testkit::conformance::{Triaged, assert_triaged, disagreement};
use sigil_testkit::pki::Ca;
use sigil_testkit::signing::Signer as Key;
use sigil_testkit::sigstore::{GITHUB_ISSUER, GITHUB_WORKFLOW, Sigstore};
use sigil_testkit::windows::{IN_A, IN_B, Windowed};
use sigil_verify::bundle::{Artifact, Matcher, Requirements, Signer, verify};
use sigil_verify::trust::TrustedRoot;
use sigstore_verify::VerificationPolicy;
use sigstore_verify::types::{Artifact as Theirs, ArtifactDigest, Bundle, HashAlgorithm};

const V01: &str = "application/vnd.dev.sigstore.bundle+json;version=0.1";
const V02: &str = "application/vnd.dev.sigstore.bundle+json;version=0.2";
const V03: &str = "application/vnd.dev.sigstore.bundle.v0.3+json";

/// The artifact every case signs: its digest and the in-toto statement
/// naming it.
fn artifact() -> ([u8; 32], Vec<u8>) {
    let digest = sigil_testkit::registry::sha256(b"the image manifest");
    let statement = sigil_testkit::intoto::statement(
        &digest,
        "https://slsa.dev/provenance/v1",
        serde_json::json!({}),
    );
    let hex = digest.strip_prefix("sha256:").unwrap();
    let mut d = [0u8; 32];
    for (i, b) in d.iter_mut().enumerate() {
        *b = u8::from_str_radix(&hex[i * 2..i * 2 + 2], 16).unwrap();
    }
    (d, statement)
}

/// sigil's verdict on `bundle` under `root` for the workflow identity.
fn ours(bundle: &[u8], root: &serde_json::Value, req: Requirements) -> Result<(), String> {
    let trust = TrustedRoot::from_json(&root.to_string()).unwrap();
    let (digest, _) = artifact();
    verify(
        bundle,
        &Artifact::Digest(digest),
        Signer::Identity {
            san: &Matcher::Exact(GITHUB_WORKFLOW.into()),
            issuer: &Matcher::Exact(GITHUB_ISSUER.into()),
            extensions: &[],
        },
        req,
        &trust,
    )
    .map(|_| ())
    .map_err(|e| e.to_string())
}

/// sigstore-verify's verdict on the same inputs (no CT log in these roots,
/// so no SCT is asked for, as sigil reads such a root).
fn theirs(bundle: &[u8], root: &serde_json::Value) -> Result<(), String> {
    let root = sigstore_verify::trust_root::TrustedRoot::from_json(&root.to_string())
        .map_err(|e| e.to_string())?;
    let parsed =
        Bundle::from_json(std::str::from_utf8(bundle).unwrap()).map_err(|e| e.to_string())?;
    let (digest, _) = artifact();
    let digest = ArtifactDigest::new(HashAlgorithm::Sha2256, digest.to_vec()).unwrap();
    sigstore_verify::verify(
        Theirs::from(digest),
        &parsed,
        &VerificationPolicy::new(GITHUB_WORKFLOW.to_owned(), GITHUB_ISSUER.to_owned()).skip_sct(),
        &root,
    )
    .map(|_| ())
    .map_err(|e| e.to_string())
}

/// One minted case: its name, the bundle, the root, and whether a correct
/// verifier accepts it.
struct Case {
    name: String,
    bundle: Vec<u8>,
    root: serde_json::Value,
    valid: bool,
}

/// A bundle of `media_type` from `leaf` (issued by `ca` at `signed`,
/// carrying `chain`), stamped at `signed + 60` by `tsa` (key, certificate)
/// with `embed` in the token.
fn minted(
    w: &Windowed,
    media_type: &str,
    ca: &Ca,
    chain: &[&[u8]],
    signed: i64,
    tsa: (&Key, &[u8]),
    embed: &[&[u8]],
) -> Vec<u8> {
    let (_, statement) = artifact();
    let (key, leaf) = Windowed::leaf(ca, signed);
    w.bundle(media_type, &key, &leaf, chain, &statement, signed, |sig| {
        vec![Windowed::stamp(tsa.0, tsa.1, sig, signed + 60, embed)]
    })
}

fn case(name: &str, bundle: Vec<u8>, root: &serde_json::Value, valid: bool) -> Case {
    Case {
        name: name.to_owned(),
        bundle,
        root: root.clone(),
        valid,
    }
}

/// Case 1: a timestamp signed by a TSA certificate the root does not list,
/// issued by a listed authority's intermediate and carried in the token.
fn unlisted_tsa(w: &Windowed) -> Vec<Case> {
    let root = w.trusted_root();
    let a = &w.windows[0];
    let rogue = Key::p256();
    let rogue_der = w.unlisted_tsa_certificate(&rogue);
    vec![
        case(
            "unlisted TSA: control (window A's own TSA)",
            minted(
                w,
                V03,
                &a.l2,
                &[],
                IN_A,
                (&a.tsa, &a.tsa_der),
                &[&a.tsa_der],
            ),
            &root,
            true,
        ),
        case(
            "unlisted TSA: its certificate in the token",
            minted(
                w,
                V03,
                &a.l2,
                &[],
                IN_A,
                (&rogue, &rogue_der),
                &[&rogue_der],
            ),
            &root,
            false,
        ),
        case(
            "unlisted TSA: its certificate and the intermediate in the token",
            minted(
                w,
                V03,
                &a.l2,
                &[],
                IN_A,
                (&rogue, &rogue_der),
                &[&rogue_der, &w.tsa_intermediate.der],
            ),
            &root,
            false,
        ),
    ]
}

/// Case 2: authority A's TSA key stamping a time after A's window, inside B's,
/// with A's certificate added to the token.
fn tsa_outside_window(w: &Windowed) -> Vec<Case> {
    let root = w.trusted_root();
    let (a, b) = (&w.windows[0], &w.windows[1]);
    vec![
        case(
            "TSA window: control (B's TSA in B's window)",
            minted(
                w,
                V03,
                &b.l2,
                &[],
                IN_B,
                (&b.tsa, &b.tsa_der),
                &[&b.tsa_der],
            ),
            &root,
            true,
        ),
        case(
            "TSA window: A's key in B's window, A's certificate in the token",
            minted(
                w,
                V03,
                &b.l2,
                &[],
                IN_B,
                (&a.tsa, &a.tsa_der),
                &[&a.tsa_der],
            ),
            &root,
            false,
        ),
        case(
            "TSA window: A's key in B's window, nothing in the token",
            minted(w, V03, &b.l2, &[], IN_B, (&a.tsa, &a.tsa_der), &[]),
            &root,
            false,
        ),
    ]
}

/// Case 3: a leaf from authority A's intermediate, signed after A's window and
/// inside B's, with A's intermediate carried in a v0.1/v0.2 bundle's chain.
fn fulcio_from_bundle(w: &Windowed) -> Vec<Case> {
    let root = w.trusted_root();
    let (a, b) = (&w.windows[0], &w.windows[1]);
    let stamp = (&b.tsa, b.tsa_der.as_slice());
    let mut out = Vec::new();
    for mt in [V01, V02] {
        let v = &mt[mt.len() - 3..];
        out.push(case(
            &format!("Fulcio window {v}: control (B's leaf, B's intermediate carried)"),
            minted(w, mt, &b.l2, &[&b.l2.der], IN_B, stamp, &[]),
            &root,
            true,
        ));
        out.push(case(
            &format!("Fulcio window {v}: A's leaf in B's window, A's intermediate carried"),
            minted(w, mt, &a.l2, &[&a.l2.der], IN_B, stamp, &[]),
            &root,
            false,
        ));
    }
    out.push(case(
        "Fulcio window 0.3: A's leaf in B's window",
        minted(w, V03, &a.l2, &[], IN_B, stamp, &[]),
        &root,
        false,
    ));
    out
}

/// Case 4: an unlisted sub-CA without an EKU extension, carried in the bundle,
/// issuing a code-signing leaf.
fn eku_less_sub_ca(w: &Windowed) -> Vec<Case> {
    let root = w.trusted_root();
    let a = &w.windows[0];
    let sub = w.unlisted_sub_ca();
    let stamp = (&a.tsa, a.tsa_der.as_slice());
    vec![
        case(
            "EKU-less sub-CA: control (the listed l2 under the listed l1, which has no EKU)",
            minted(w, V02, &a.l2, &[&a.l2.der], IN_A, stamp, &[]),
            &root,
            true,
        ),
        case(
            "EKU-less sub-CA: unlisted, carried in the chain",
            minted(w, V02, &sub, &[&sub.der], IN_A, stamp, &[]),
            &root,
            false,
        ),
        case(
            "EKU-less sub-CA: unlisted, carried with the listed l1",
            minted(w, V02, &sub, &[&sub.der, &w.l1.der], IN_A, stamp, &[]),
            &root,
            false,
        ),
    ]
}

/// Every case of the windowed scene, without a log (as GitHub's root) and
/// with one (so that a verifier that needs a log entry judges the rest).
fn scene_cases() -> Vec<Case> {
    let mut all = Vec::new();
    for (layout, w) in [("no log", Windowed::new()), ("logged", Windowed::logged())] {
        let mut cases = unlisted_tsa(&w);
        cases.extend(tsa_outside_window(&w));
        cases.extend(fulcio_from_bundle(&w));
        cases.extend(eku_less_sub_ca(&w));
        for c in &mut cases {
            c.name = format!("{layout}: {}", c.name);
        }
        all.extend(cases);
    }
    all
}

/// The four scene cases `build` makes, in both layouts, judged by sigil.
fn both_layouts(build: fn(&Windowed) -> Vec<Case>) -> Vec<Case> {
    let mut all = build(&Windowed::new());
    all.extend(build(&Windowed::logged()));
    judge(&all);
    all
}

/// Runs sigil on `cases`: each must get its correct verdict.
fn judge(cases: &[Case]) {
    let wrong: Vec<String> = cases
        .iter()
        .filter_map(|c| {
            let got = ours(&c.bundle, &c.root, Requirements::default());
            (got.is_ok() != c.valid).then(|| format!("{}: sigil {got:?}", c.name))
        })
        .collect();
    assert!(wrong.is_empty(), "wrong verdicts:\n{}", wrong.join("\n"));
}

#[test]
fn regression_a_timestamp_by_a_tsa_certificate_the_root_does_not_list_is_refused() {
    let cases = both_layouts(unlisted_tsa);
    let err = ours(&cases[1].bundle, &cases[1].root, Requirements::default()).unwrap_err();
    assert!(
        err.contains("not signed by the signing certificate"),
        "{err}"
    );
}

#[test]
fn regression_a_tsa_key_outside_its_own_window_is_refused_whatever_the_token_carries() {
    let cases = both_layouts(tsa_outside_window);
    let err = ours(&cases[1].bundle, &cases[1].root, Requirements::default()).unwrap_err();
    assert!(err.contains("outside the validity"), "{err}");
}

#[test]
fn regression_a_fulcio_intermediate_a_bundle_carries_never_takes_a_leaf_into_another_window() {
    both_layouts(fulcio_from_bundle);
}

#[test]
fn regression_an_unlisted_eku_less_sub_ca_carried_in_a_bundle_issues_no_trusted_leaf() {
    both_layouts(eku_less_sub_ca);
}

/// The Rekor v2 cases: the test Sigstore's v2 bundle, and the same with a
/// checkpoint the log's key signed naming another origin.
fn rekor_v2_cases() -> Vec<Case> {
    let ss = Sigstore::new();
    let root = ss.trusted_root();
    let (digest, _) = artifact();
    let digest = format!("sha256:{}", sigil_verify::trust::hex(&digest));
    let now = time::OffsetDateTime::now_utc().unix_timestamp();
    let good = ss.rekor_v2_bundle(
        &digest,
        GITHUB_WORKFLOW,
        GITHUB_ISSUER,
        now - 600,
        now - 500,
    );
    let mut other = good.clone();
    let proof = &mut other["verificationMaterial"]["tlogEntries"][0]["inclusionProof"];
    let rh = base64_decode(proof["rootHash"].as_str().unwrap());
    proof["checkpoint"]["envelope"] = ss
        .checkpoint_naming("log2026.elsewhere.test", 9, &rh.try_into().unwrap())
        .into();
    vec![
        case(
            "Rekor v2 origin: control",
            good.to_string().into_bytes(),
            &root,
            true,
        ),
        case(
            "Rekor v2 origin: the log's key, another origin",
            other.to_string().into_bytes(),
            &root,
            false,
        ),
    ]
}

fn base64_decode(s: &str) -> Vec<u8> {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.decode(s).unwrap()
}

#[test]
fn regression_a_rekor_v2_checkpoint_naming_another_origin_is_refused() {
    let cases = rekor_v2_cases();
    judge(&cases);
    let err = ours(&cases[1].bundle, &cases[1].root, Requirements::default()).unwrap_err();
    assert!(
        err.contains("names origin \"log2026.elsewhere.test\""),
        "{err}"
    );
}

/// A keyless cosign verifier under `root` (`trustedRoot: FILE` or
/// `trustRoot: NAME`) with `transparencyLog` as given.
fn policy(root: &str, tlog: Option<&str>) -> Policy {
    let mut cosign = serde_json::json!({
        "keyless": {"issuer": GITHUB_ISSUER, "subject": GITHUB_WORKFLOW},
    });
    if let Some(path) = root.strip_prefix("file:") {
        cosign["trustedRoot"] = path.into();
    } else {
        cosign["trustRoot"] = root.into();
    }
    if let Some(t) = tlog {
        cosign["transparencyLog"] = t.into();
    }
    Policy::from_json_value(serde_json::json!({
        "apiVersion": "sigil.dev/v1alpha1", "kind": "ImagePolicy",
        "spec": {"rules": [{"name": "r", "match": ["**"], "verify": [{"name": "ci", "cosign": cosign}]}]}
    }))
    .unwrap()
}

#[test]
fn regression_an_explicit_transparency_log_requirement_is_never_relaxed_under_a_root_without_logs()
{
    let w = Windowed::new();
    let root = w.trusted_root();
    let a = &w.windows[0];
    let b = minted(&w, V03, &a.l2, &[], IN_A, (&a.tsa, &a.tsa_der), &[]);
    // The keyless default follows the root: a signed timestamp stands in.
    assert_eq!(ours(&b, &root, Requirements::default()), Ok(()));
    // The policy's word does not: a verified log entry, which this root
    // can never give.
    let explicit = Requirements {
        tlog: TlogPolicy::Required,
        tlog_default: false,
        ..Requirements::default()
    };
    let err = ours(&b, &root, explicit).unwrap_err();
    assert!(err.contains("lists no transparency log"), "{err}");
    // And policy loading refuses it, naming the way out, for a root file
    // and for the built-in `github` root alike; unset or optional loads.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("trusted_root.json");
    std::fs::write(&file, root.to_string()).unwrap();
    let file = format!("file:{}", file.display());
    for r in [file.as_str(), "github"] {
        let e = sigil_verify::Material::load(&policy(r, Some("required"))).unwrap_err();
        let e = e.to_string();
        assert!(
            e.contains("transparencyLog: required") && e.contains("lists no transparency log"),
            "{r}: {e}"
        );
        assert!(e.contains("timestampThreshold: 1"), "{e}");
        for ok in [None, Some("optional")] {
            assert!(
                sigil_verify::Material::load(&policy(r, ok)).is_ok(),
                "{r} {ok:?}"
            );
        }
    }
    // Under a root with a log, `required` loads as before.
    assert!(sigil_verify::Material::load(&policy("public-good", Some("required"))).is_ok());
}

/// Where sigstore-verify and sigil disagree on these cases: (case, sigil
/// accepts, sigstore-verify accepts, why).
const TRIAGED: &[Triaged] = &[
    (
        "no log: unlisted TSA: control (window A's own TSA)",
        true,
        false,
        NO_LOG,
    ),
    (
        "no log: TSA window: control (B's TSA in B's window)",
        true,
        false,
        NO_LOG,
    ),
    (
        "no log: Fulcio window 0.1: control (B's leaf, B's intermediate carried)",
        true,
        false,
        NO_LOG,
    ),
    (
        "no log: Fulcio window 0.2: control (B's leaf, B's intermediate carried)",
        true,
        false,
        NO_LOG,
    ),
    (
        "no log: EKU-less sub-CA: control (the listed l2 under the listed l1, which has no EKU)",
        true,
        false,
        NO_LOG,
    ),
    (
        "logged: Fulcio window 0.1: A's leaf in B's window, A's intermediate carried",
        false,
        true,
        BUNDLE_CHAIN,
    ),
    (
        "logged: Fulcio window 0.2: A's leaf in B's window, A's intermediate carried",
        false,
        true,
        BUNDLE_CHAIN,
    ),
    (
        "Rekor v2 origin: the log's key, another origin",
        false,
        true,
        "sigil is right: a Rekor v2 checkpoint names the log it commits for, and sigstore-go checks that origin against the log's baseUrl for v2 entries; sigstore-verify 0.15.1 checks the signature by key only",
    ),
];

const NO_LOG: &str = "sigil is right: a trusted root that lists no transparency log (GitHub's own instance, whose real private-repository attestation `registry_algorithms.rs` verifies) makes signed timestamps the time source, as sigstore-go and `gh attestation verify` accept; sigstore-verify 0.15.1 requires a log entry of every bundle and so refuses every bundle of such an instance";

const BUNDLE_CHAIN: &str = "sigil is right: the client specification checks a certificate against one authority's whole chain and window, and sigstore-go builds the path from the trusted root's certificates only; sigstore-verify 0.15.1 adds the bundle's x509CertificateChain to the intermediates, so window A's intermediate takes a leaf signed after A's window into window B";

#[test]
fn sigil_and_the_sigstore_projects_verifier_on_every_authority_case() {
    let mut cases = scene_cases();
    cases.extend(rekor_v2_cases());
    judge(&cases);
    let mut found = Vec::new();
    for c in &cases {
        let (a, b) = (
            ours(&c.bundle, &c.root, Requirements::default()),
            theirs(&c.bundle, &c.root),
        );
        disagreement(&mut found, c.name.clone(), &a, &b);
    }
    assert_triaged(&found, TRIAGED);
}
