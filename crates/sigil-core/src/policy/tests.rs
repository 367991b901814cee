//! Unit tests of the policy: loading, errors with lines, and meaning.

use super::*;
use crate::denial::Denial;
use crate::reference;

/// The issue's example, verbatim: it must load and mean exactly this.
const VERIFY_EXAMPLE: &str = r#"apiVersion: sigil.dev/v1alpha1
kind: ImagePolicy
metadata: {name: verify}
spec:
  rules:
    - name: team
      match: ["registry.example.com/team/**"]
      mode: enforce
      verify:
        - name: alice
          cosign: {key: /etc/sigil/alice.pub}      # PEM file or inline PEM: ECDSA P-256/P-384, Ed25519, RSA
        - name: bob
          cosign: {key: /etc/sigil/bob.pub}
        - name: ci
          cosign:
            keyless:
              issuer: https://token.actions.githubusercontent.com
              subjectRegex: ^https://github\.com/acme/.+$
            trustedRoot: /etc/sigil/trusted_root.json   # optional; default: Sigstore public-good root, embedded
            transparencyLog: required                   # required | optional
        - name: release
          notation:
            trustRoots: [/etc/sigil/notation-ca.pem]
            level: strict                               # strict | permissive | audit
      threshold: 2          # at least this many of the verifiers above must pass; default: all of them
      required: [alice]     # these must be among those that pass
      signatures:
        repository: registry.example.com/team/signatures   # optional; default: the repository the image is pulled from
"#;

#[test]
fn issue_verify_example_loads_with_its_meaning() {
    use crate::verify::{NotationLevel, TlogPolicy};
    let p = Policy::from_yaml(VERIFY_EXAMPLE).unwrap();
    let plan = p.plan("registry.example.com/team/app:v1").unwrap();
    assert_eq!(plan.step, Step::Resolve);
    let v = plan.verify.expect("rule verifies");
    assert_eq!(v.threshold, 2);
    assert_eq!(v.required, vec!["alice"]);
    assert_eq!(
        v.signatures_repository
            .as_ref()
            .map(|r| r.to_string())
            .as_deref(),
        Some("registry.example.com/team/signatures")
    );
    let names: Vec<&str> = v.verifiers.iter().map(|x| x.name.as_str()).collect();
    assert_eq!(names, ["alice", "bob", "ci", "release"]);
    let alice = v.verifiers[0].cosign.as_ref().unwrap();
    assert_eq!(alice.key.as_deref(), Some("/etc/sigil/alice.pub"));
    let ci = v.verifiers[2].cosign.as_ref().unwrap();
    let kl = ci.keyless.as_ref().unwrap();
    assert_eq!(
        kl.issuer.as_deref(),
        Some("https://token.actions.githubusercontent.com")
    );
    assert_eq!(
        kl.subject_regex.as_deref(),
        Some("^https://github\\.com/acme/.+$")
    );
    assert_eq!(
        ci.trusted_root.as_deref(),
        Some("/etc/sigil/trusted_root.json")
    );
    assert_eq!(ci.transparency_log, Some(TlogPolicy::Required));
    let n = v.verifiers[3].notation.as_ref().unwrap();
    assert_eq!(n.trust_roots, vec!["/etc/sigil/notation-ca.pem"]);
    assert_eq!(n.level, NotationLevel::Strict);
    // Images outside the rule do not verify.
    assert!(p.plan("registry.example.com/other/app:v1").is_err());
}

#[test]
fn verify_settings_that_cannot_work_are_refused_with_the_line() {
    let base = |rule: &str| {
        format!("apiVersion: sigil.dev/v1alpha1\nkind: ImagePolicy\nspec:\n  rules:\n{rule}")
    };
    let cases = [
        (
            "    - name: a\n      match: [\"**\"]\n      action: allow\n      verify:\n        - {name: k, cosign: {key: k.pub}}\n",
            "needs action: pin",
        ),
        (
            "    - name: a\n      match: [\"**\"]\n      threshold: 1\n",
            "need a verify list",
        ),
        (
            "    - name: a\n      match: [\"**\"]\n      verify:\n        - {name: k, cosign: {key: k.pub}}\n      threshold: 2\n",
            "exceeds",
        ),
        (
            "    - name: a\n      match: [\"**\"]\n      verify:\n        - {name: k, cosign: {keyless: {issuer: x, subjectRegex: \"(\"}}}\n",
            "subjectRegex",
        ),
        (
            "    - name: a\n      match: [\"**\"]\n      verify:\n        - {name: k, cosign: {key: k.pub}, notation: {trustRoots: [r.pem]}}\n",
            "exactly one of cosign or notation",
        ),
        (
            "    - name: a\n      match: [\"**\"]\n      verify:\n        - {name: k, cosign: {key: k.pub, unknown: 1}}\n",
            "unknown",
        ),
    ];
    for (rule, want) in cases {
        let e = Policy::from_yaml(&base(rule)).unwrap_err().to_string();
        assert!(e.contains(want), "{want:?} not in {e:?}");
    }
}

/// The example from the core issue; it must load and mean exactly this.
pub(crate) const ISSUE_EXAMPLE: &str = r#"apiVersion: sigil.dev/v1alpha1
kind: ImagePolicy
metadata: {name: default}
spec:
  mirrors:                      # rewrite stage, applied first; longest matching `from` wins
    - from: docker.io           # origin prefix on the normalized name: a host, or host/path
      to: mirror.internal:5000/dockerhub
  registries:                   # how to talk to each registry host
    - host: mirror.internal:5000
      insecure: true            # plain HTTP allowed for this host only (explicit opt-in)
      ca: /etc/sigil/mirror-ca.pem           # optional extra CA (PEM file or inline PEM)
      auth: {username: robot, passwordFile: /var/run/sigil/pw}   # or dockerConfig: FILE
  pin:
    scope: workloads            # workloads: patch every kind listed below; pods: patch only Pods
    platform: ""                # "" pins the index digest; e.g. linux/amd64 pins that platform's manifest
    cacheTTL: 5m
  rules:                        # matched on the ORIGIN name; the most specific match wins
    - name: team
      match: ["registry.example.com/team/**"]
      mode: enforce             # enforce | warn
    - name: blocked
      match: ["docker.io/library/busybox"]
      action: deny              # static deny; `action: allow` admits without pinning
    - name: everything-else
      match: ["**"]
      mode: warn
  exemptNamespaces: [kube-system]
"#;

#[test]
fn issue_example_loads_and_means_what_it_says() {
    let p = Policy::from_yaml(ISSUE_EXAMPLE).unwrap();
    assert_eq!(p.name, "default");
    assert_eq!(p.cache_ttl, Duration::from_secs(300));
    assert_eq!(p.scope, Scope::Workloads);
    assert_eq!(p.platform, None);
    assert!(p.is_exempt("kube-system"));
    assert_eq!(
        p.registries[0]
            .auth
            .as_ref()
            .unwrap()
            .password_file
            .as_deref(),
        Some("/var/run/sigil/pw")
    );
    assert!(p.registries[0].insecure);

    let plan = p.plan("nginx:1.25").unwrap();
    assert_eq!(plan.origin.to_string(), "docker.io/library/nginx:1.25");
    assert_eq!(
        plan.target.to_string(),
        "mirror.internal:5000/dockerhub/library/nginx:1.25"
    );
    assert_eq!(&*plan.rule, "everything-else");
    assert_eq!(plan.mode, Mode::Warn);
    assert_eq!(plan.step, Step::Resolve);

    let plan = p.plan("registry.example.com/team/app/api:v1").unwrap();
    assert_eq!(&*plan.rule, "team");
    assert_eq!(plan.mode, Mode::Enforce);
    assert!(!plan.rewritten());

    let plan = p.plan("busybox").unwrap();
    assert_eq!(&*plan.rule, "blocked");
    assert_eq!(plan.step, Step::Deny);
    // The mirrored spelling of busybox is still busybox.
    let plan = p
        .plan("mirror.internal:5000/dockerhub/library/busybox:1")
        .unwrap();
    assert_eq!(&*plan.rule, "blocked");
}

#[test]
fn embedded_default_loads() {
    let p = Policy::embedded_default();
    assert_eq!(p.plan("anything/at:all").unwrap().mode, Mode::Warn);
    assert!(p.is_exempt("kube-system"));
}

#[test]
fn second_pass_is_a_no_op() {
    let p = Policy::from_yaml(ISSUE_EXAMPLE).unwrap();
    let d = reference::Digest::parse(
        "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
    )
    .unwrap();
    for img in [
        "nginx",
        "nginx:1.25",
        "docker.io/bitnami/redis:7",
        "registry.example.com/team/x:1",
        "quay.io/a/b",
    ] {
        let first = p.plan(img).unwrap();
        let out = first.final_image(Some(&d));
        let second = p.plan(&out).unwrap();
        assert_eq!(second.step, Step::Keep, "{img} -> {out}");
        assert_eq!(second.final_image(None), out, "{img}");
        assert_eq!(second.rule, first.rule);
    }
}

#[test]
fn final_image_keeps_spelling() {
    let p = Policy::embedded_default();
    let d = reference::Digest::parse(
        "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
    )
    .unwrap();
    assert_eq!(
        p.plan("nginx:1").unwrap().final_image(Some(&d)),
        format!("nginx:1@{d}")
    );
    assert_eq!(
        p.plan("nginx").unwrap().final_image(Some(&d)),
        format!("nginx:latest@{d}")
    );
    assert_eq!(
        p.plan("localhost:5000/x").unwrap().final_image(Some(&d)),
        format!("localhost:5000/x:latest@{d}")
    );
}

#[test]
fn longest_mirror_wins_both_ways() {
    let y = r#"apiVersion: sigil.dev/v1alpha1
kind: ImagePolicy
spec:
  mirrors:
    - {from: docker.io, to: m.local/hub}
    - {from: docker.io/library, to: m.local/official}
  rules: [{name: all, match: ["**"]}]
"#;
    let p = Policy::from_yaml(y).unwrap();
    assert_eq!(
        p.plan("nginx").unwrap().target.to_string(),
        "m.local/official/nginx"
    );
    assert_eq!(
        p.plan("bitnami/redis").unwrap().target.to_string(),
        "m.local/hub/bitnami/redis"
    );
    assert_eq!(
        p.plan("m.local/official/nginx").unwrap().origin.to_string(),
        "docker.io/library/nginx"
    );
}

fn err(y: &str) -> String {
    Policy::from_yaml(y).unwrap_err().to_string()
}

#[test]
fn errors_name_the_line() {
    let head = "apiVersion: sigil.dev/v1alpha1\nkind: ImagePolicy\nspec:\n  rules:\n";
    let e = err(&format!(
        "{head}    - name: a\n      match: [\"a.com/X\"]\n"
    ));
    assert!(e.starts_with("line 6:"), "{e}");
    let e = err(&format!(
        "{head}    - name: a\n      match: [\"a.com/**\"]\n    - name: b\n      match: [\"a.com/**\"]\n"
    ));
    assert!(e.contains("equally specific"), "{e}");
    let e = err(&format!(
        "{head}    - name: a\n      match: [\"**\"]\n      mood: warn\n"
    ));
    assert!(e.contains("mood"), "{e}");
    let e = err("apiVersion: sigil.dev/v1\nkind: ImagePolicy\nspec: {}\n");
    assert!(e.starts_with("line 1:"), "{e}");
    let e = err(
        "apiVersion: sigil.dev/v1alpha1\nkind: ImagePolicy\nspec:\n  pin:\n    cacheTTL: soon\n",
    );
    assert!(e.starts_with("line 5:"), "{e}");
    let e = err(
        "apiVersion: sigil.dev/v1alpha1\nkind: ImagePolicy\nspec:\n  mirrors:\n    - {from: docker.io, to: m.io/a}\n    - {from: quay.io, to: m.io/a}\n",
    );
    assert!(e.contains("line 6") && e.contains("mapped back"), "{e}");
}

#[test]
fn docker_hub_registry_settings_apply_to_docker_io_names() {
    let p = Policy::from_yaml("apiVersion: sigil.dev/v1alpha1\nkind: ImagePolicy\nspec:\n  registries: [{host: index.docker.io, auth: {dockerConfig: /x}}]\n").unwrap();
    assert_eq!(p.registries[0].host, "docker.io");
}

/// A deny written for `docker.io` names cannot be side-stepped by
/// spelling Docker Hub another way, in the image or in the rule.
#[test]
fn docker_hub_aliases_cannot_bypass_a_deny() {
    let p = Policy::from_yaml("apiVersion: sigil.dev/v1alpha1\nkind: ImagePolicy\nspec:\n  rules:\n  - {name: all, match: [\"**\"]}\n  - {name: bad, match: [\"registry.hub.docker.com/library/bad\"], action: deny}\n").unwrap();
    for img in [
        "bad:1",
        "docker.io/library/bad:1",
        "index.docker.io/library/bad:1",
        "registry-1.docker.io/library/bad:1",
        "registry.hub.docker.com/bad:1",
    ] {
        assert_eq!(p.plan(img).unwrap().step, Step::Deny, "{img}");
    }
}

#[test]
fn no_rule_is_a_denial() {
    let p = Policy::from_yaml("apiVersion: sigil.dev/v1alpha1\nkind: ImagePolicy\nspec:\n  rules: [{name: a, match: [\"a.com/**\"]}]\n").unwrap();
    assert_eq!(p.plan("nginx").unwrap_err(), Denial::NoRule);
    assert!(matches!(
        p.plan("NGINX").unwrap_err(),
        Denial::InvalidReference { .. }
    ));
}

#[test]
fn trust_root_names_an_object_and_excludes_a_trusted_root_file() {
    let doc = |extra: &str| {
        format!(
            "apiVersion: sigil.dev/v1alpha1\nkind: ImagePolicy\nspec:\n  rules:\n    - name: r\n      match: [\"**\"]\n      verify:\n        - name: ci\n          cosign:\n            keyless: {{issuer: https://i.example, subject: me@example.com}}\n{extra}"
        )
    };
    let p = Policy::from_yaml(&doc("            trustRoot: corp\n")).unwrap();
    let v = p.rules[0].verification.as_ref().unwrap();
    assert_eq!(
        v.verifiers[0]
            .cosign
            .as_ref()
            .unwrap()
            .trust_root
            .as_deref(),
        Some("corp")
    );
    let err = Policy::from_yaml(&doc(
        "            trustRoot: corp\n            trustedRoot: /etc/sigil/root.json\n",
    ))
    .unwrap_err()
    .to_string();
    assert!(err.contains("trustedRoot (a file) or trustRoot"), "{err}");
    let err = Policy::from_yaml(&doc("            trustRoot: Corp_Root\n"))
        .unwrap_err()
        .to_string();
    assert!(err.contains("is not a Kubernetes object name"), "{err}");
}

#[test]
fn inclusion_proof_and_timestamp_threshold_are_read_and_bounded() {
    let doc = |extra: &str| {
        format!(
            "apiVersion: sigil.dev/v1alpha1\nkind: ImagePolicy\nspec:\n  rules:\n    - name: r\n      match: [\"**\"]\n      verify:\n        - name: ci\n          cosign:\n            key: \"-----BEGIN PUBLIC KEY-----\\nAA==\\n-----END PUBLIC KEY-----\"\n{extra}"
        )
    };
    let p = Policy::from_yaml(&doc(
        "            inclusionProof: required\n            timestampThreshold: 2\n",
    ))
    .unwrap();
    let v = p.rules[0].verification.as_ref().unwrap();
    let c = v.verifiers[0].cosign.as_ref().unwrap();
    assert_eq!(c.inclusion_proof, Some(crate::verify::TlogPolicy::Required));
    assert_eq!(c.timestamp_threshold, Some(2));
    let err = Policy::from_yaml(&doc("            timestampThreshold: 11\n"))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("timestampThreshold must be at most 10"),
        "{err}"
    );
    let err = Policy::from_yaml(&doc("            inclusionProof: sometimes\n"))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("inclusionProof") || err.contains("sometimes"),
        "{err}"
    );
}

#[test]
fn namespace_selectors_limit_a_rule_and_win_ties_where_they_apply() {
    let p = Policy::from_yaml("apiVersion: sigil.dev/v1alpha1\nkind: ImagePolicy\nspec:\n  rules:\n    - {name: all, match: ['**']}\n    - name: prod\n      match: ['**']\n      action: deny\n      namespaceSelector:\n        matchLabels: {tier: prod}\n        matchExpressions: [{key: team, operator: NotIn, values: [sre]}]\n").unwrap();
    let labels = |pairs: &[(&str, &str)]| -> Labels {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    let prod = labels(&[("tier", "prod"), ("team", "web")]);
    let sre = labels(&[("tier", "prod"), ("team", "sre")]);
    let dev = labels(&[("tier", "dev")]);
    assert_eq!(&*p.plan_in("nginx:1", Some(&prod)).unwrap().rule, "prod");
    assert_eq!(&*p.plan_in("nginx:1", Some(&sre)).unwrap().rule, "all");
    assert_eq!(&*p.plan_in("nginx:1", Some(&dev)).unwrap().rule, "all");
    assert_eq!(&*p.plan_in("nginx:1", None).unwrap().rule, "all");
    let bad = "apiVersion: sigil.dev/v1alpha1\nkind: ImagePolicy\nspec:\n  rules:\n    - name: x\n      match: ['**']\n      namespaceSelector: {matchExpressions: [{key: a, operator: Near}]}\n";
    let err = Policy::from_yaml(bad).unwrap_err().to_string();
    assert!(err.contains("operator \"Near\""), "{err}");
}

/// A policy with 60,000 rules once hit the YAML node cap; the budget now
/// grows with the input.
#[test]
fn a_policy_with_60000_rules_parses() {
    let mut text =
        String::from("apiVersion: sigil.dev/v1alpha1\nkind: ImagePolicy\nspec:\n  rules:\n");
    for i in 0..60_000 {
        text.push_str(&format!(
            "    - {{name: r{i}, match: [\"registry.example.com/team{i}/**\"], mode: warn}}\n"
        ));
    }
    let p = Policy::from_documents(&text).expect("parses");
    assert_eq!(p.rules.len(), 60_000);
}

/// A megabyte-long identity regex cost seconds and gigabytes to compile on
/// every reload before it was refused: now it is refused up front.
#[test]
fn an_oversized_identity_regex_is_refused_up_front() {
    let big = "a".repeat(1_400_000);
    let text = format!(
        "apiVersion: sigil.dev/v1alpha1\nkind: ImagePolicy\nspec:\n  rules:\n    - name: r\n      match: [\"**\"]\n      verify:\n        - name: k\n          cosign:\n            keyless: {{issuer: https://i, subjectRegex: \"{big}\"}}\n"
    );
    let e = Policy::from_documents(&text)
        .expect_err("refused")
        .to_string();
    assert!(
        e.contains("subjectRegex") && e.contains("at most 4096"),
        "{}",
        &e[..e.len().min(300)]
    );
    assert!(e.len() < 1000, "the error does not echo the pattern");
    // A pattern within the length limit that compiles too large is refused too.
    let wide = format!("({})", "\\w{100}".repeat(40));
    assert!(crate::verify::identity_regex(&wide).is_err());
}

/// The issue's attestation example, verbatim: it loads and means this.
const ATTEST_EXAMPLE: &str = r#"apiVersion: sigil.dev/v1alpha1
kind: ImagePolicy
metadata: {name: attest}
spec:
  rules:
    - name: api
      match: ["registry.example.com/acme/**"]
      verify:
        - name: scanner
          cosign: {key: /etc/sigil/scanner.pub}
      attestations:
        - name: built-by-ci
          predicateType: https://slsa.dev/provenance/v1   # exact URI; cosign's short names too
          attestors:
            - name: gha
              cosign:
                keyless: {issuer: https://token.actions.githubusercontent.com, subjectRegex: ^https://github\.com/acme/}
          conditions:
            - expression: predicate.buildDefinition.externalParameters.workflow.repository == "https://github.com/acme/api"
              message: built from acme/api
            - expression: signer.sourceRepositoryRef in ["refs/heads/main"] || signer.sourceRepositoryRef.startsWith("refs/tags/v")
        - name: fresh-scan
          predicateType: vuln
          attestors: [scanner]
          maxAttestationSize: 16Mi
          conditions:
            - expression: now - timestamp(predicate.metadata.scanFinishedOn) < duration("168h")
            - expression: predicate.scanner.result.summary.critical == 0
"#;

#[test]
fn the_attestation_example_loads_with_short_names_attestors_and_sizes() {
    let p = Policy::from_documents(ATTEST_EXAMPLE).unwrap();
    let v = p.rules[0].verification.as_ref().unwrap();
    assert_eq!(v.verifiers.len(), 1);
    assert_eq!(v.attestations.len(), 2);
    let (a, b) = (&v.attestations[0], &v.attestations[1]);
    assert_eq!(a.predicate_type, "https://slsa.dev/provenance/v1");
    assert_eq!(a.attestors[0].name, "gha");
    assert_eq!(a.conditions.len(), 2);
    assert_eq!(
        a.conditions[0].message.as_deref(),
        Some("built from acme/api")
    );
    assert_eq!(a.max_bytes, 8 << 20);
    assert_eq!(
        b.predicate_type,
        "https://cosign.sigstore.dev/attestation/vuln/v1"
    );
    assert_eq!(
        b.attestors[0].cosign.as_ref().unwrap().key.as_deref(),
        Some("/etc/sigil/scanner.pub")
    );
    assert_eq!(b.max_bytes, 16 << 20);
    let words = p.describe();
    assert!(words.contains("it must carry attestation \"built-by-ci\": a https://slsa.dev/provenance/v1 statement about the pinned digest, signed by gha (keyless /^https://github\\.com/acme//"), "{words}");
    assert!(
        words.contains("where built from acme/api (predicate.buildDefinition"),
        "{words}"
    );
}

#[test]
fn a_rule_with_attestations_only_requires_no_signature() {
    let text = "apiVersion: sigil.dev/v1alpha1\nkind: ImagePolicy\nspec:\n  rules:\n    - name: a\n      match: [\"**\"]\n      attestations:\n        - name: sbom\n          predicateType: spdx\n          attestors: [{name: k, cosign: {key: /k.pub}}]\n";
    let p = Policy::from_documents(text).unwrap();
    let v = p.rules[0].verification.as_ref().unwrap();
    assert!(v.verifiers.is_empty());
    assert_eq!(v.threshold, 0);
    assert_eq!(
        v.attestations[0].predicate_type,
        "https://spdx.dev/Document"
    );
}

/// Each mistake in an attestation entry refuses the policy naming the line
/// and the reason (a bad CEL expression: its own line and the compiler's words).
#[test]
fn bad_attestation_entries_are_refused_with_their_line() {
    let base = |entry: &str| {
        format!(
            "apiVersion: sigil.dev/v1alpha1\nkind: ImagePolicy\nspec:\n  rules:\n    - name: a\n      match: [\"**\"]\n      verify: [{{name: k, cosign: {{key: /k.pub}}}}]\n      attestations:\n{entry}"
        )
    };
    let cases = [
        (
            "        - name: x\n          predicateType: slsa\n          attestors: [k]\n",
            "line 10",
            "neither a URI nor one of cosign's short names",
        ),
        (
            "        - name: x\n          predicateType: spdx\n",
            "line 9",
            "list at least one attestor",
        ),
        (
            "        - name: x\n          predicateType: spdx\n          attestors: [nobody]\n",
            "line 9",
            "attestor \"nobody\" is not one of the rule's verify entries (have: k)",
        ),
        (
            "        - name: x\n          predicateType: spdx\n          attestors: [k]\n          conditions:\n            - expression: predicate.a ==\n",
            "line 13",
            "condition \"predicate.a ==\"",
        ),
        (
            "        - name: x\n          predicateType: spdx\n          attestors: [k]\n          conditions:\n            - expression: predicate.a.all(x, x.b.all(y, y))\n",
            "line 13",
            "comprehensions",
        ),
        (
            "        - name: x\n          predicateType: spdx\n          attestors: [k]\n          maxAttestationSize: 100Gi\n",
            "",
            "100Gi",
        ),
        (
            "        - name: x\n          predicateType: spdx\n          attestors: [k]\n          maxAttestationSize: 128Mi\n",
            "line 12",
            "between 1Ki and 64Mi",
        ),
        (
            "        - name: x\n          predicateType: spdx\n          attestors: [{name: n, notation: {trustRoots: [/ca.pem]}}]\n",
            "line 9",
            "notation verifier",
        ),
        (
            "        - name: x\n          predicateType: spdx\n          attestors: [{name: kl, cosign: {keyless: {issuer: x}}}]\n",
            "line 9",
            "keyless needs subject or subjectRegex",
        ),
        (
            "        - name: x\n          predicateType: spdx\n          attestors: [k]\n        - name: x\n          predicateType: spdx\n          attestors: [k]\n",
            "line 12",
            "listed twice",
        ),
    ];
    for (entry, line, want) in cases {
        let err = Policy::from_documents(&base(entry))
            .unwrap_err()
            .to_string();
        assert!(err.contains(want), "{entry}: {err}");
        assert!(err.contains(line), "{entry}: {err}");
    }
}

/// A team's ImagePolicy may add attestation requirements for its own
/// namespace (never remove the cluster's): they reach the team verdict.
#[test]
fn a_team_policy_adds_attestation_requirements() {
    let text = "apiVersion: sigil.dev/v1alpha1\nkind: ClusterImagePolicy\nmetadata: {name: base}\nspec:\n  rules:\n    - {name: all, match: [\"**\"]}\n---\napiVersion: sigil.dev/v1alpha1\nkind: ImagePolicy\nmetadata: {name: provenance, namespace: team-a}\nspec:\n  rules:\n    - name: ours\n      match: [\"registry.example.com/team-a/**\"]\n      attestations:\n        - name: built-by-ci\n          predicateType: slsaprovenance1\n          attestors: [{name: ci, cosign: {keyRef: {configMap: ci, key: cosign.pub}}}]\n          conditions: [{expression: 'predicate.buildDefinition.externalParameters.workflow.ref == \"refs/heads/main\"'}]\n";
    let p = Policy::from_documents(text).unwrap();
    let team = &p.namespaced["team-a"][0];
    let origin = reference::Reference::parse("registry.example.com/team-a/api:v1").unwrap();
    match team.judge(&origin) {
        TeamVerdict::Verify { rule, verification } => {
            assert_eq!(rule, "ours");
            assert!(verification.verifiers.is_empty());
            assert_eq!(verification.attestations[0].name, "built-by-ci");
        }
        other => panic!("{other:?}"),
    }
    // A deny rule that asks for attestations makes no sense and is refused.
    let bad = text.replace(
        "    - name: ours\n",
        "    - name: ours\n      action: deny\n",
    );
    let err = Policy::from_documents(&bad).unwrap_err().to_string();
    assert!(err.contains("a deny rule verifies nothing"), "{err}");
}
