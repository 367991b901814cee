//! Policies for teams: a policy file holding a ClusterImagePolicy and
//! namespaced ImagePolicies, through the webhook, `sigil pin` and
//! `sigil policy check` — a team may add its own keys and allow-list in its
//! namespace, never loosen the platform's rules.

use std::io::Write as _;
use std::process::{Command, Stdio};

use crate::support::registry::{Mode, TestRegistry};
use crate::support::sigil::{Sigil, bin};
use crate::support::signing::{Signer, push_signed};

fn policy(h: &str, platform_key: &str, team_key: &str) -> String {
    format!(
        r#"apiVersion: sigil.dev/v1alpha1
kind: ClusterImagePolicy
metadata: {{name: platform}}
spec:
  registries: [{{host: "{h}", insecure: true}}]
  rules:
    - name: signed
      match: ["{h}/**"]
      verify: [{{name: platform, cosign: {{key: "{platform_key}"}}}}]
---
apiVersion: sigil.dev/v1alpha1
kind: ImagePolicy
metadata: {{name: signed-only, namespace: team-b}}
spec:
  rules:
    - name: team-keys
      match: ["{h}/**"]
      verify: [{{name: team, cosign: {{key: "{team_key}"}}}}]
---
apiVersion: sigil.dev/v1alpha1
kind: ImagePolicy
metadata: {{name: allow-list, namespace: team-c}}
spec:
  defaultAction: deny
  rules:
    - {{name: ours, match: ["{h}/team-c/**"]}}
"#
    )
}

fn pin(policy: &std::path::Path, namespace: &str, image: &str) -> (Option<i32>, String) {
    let manifest = format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: p, namespace: {namespace}}}\nspec:\n  containers:\n    - name: app\n      image: {image}\n"
    );
    let mut child = Command::new(bin())
        .args(["pin", "--policy"])
        .arg(policy)
        .arg("-")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(manifest.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    (
        out.status.code(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

#[tokio::test]
async fn team_policies_tighten_in_their_namespace_only_through_webhook_and_pin() {
    let reg = TestRegistry::start(Mode::Plain).await;
    let h = reg.host();
    let dir = tempfile::tempdir().unwrap();
    let (platform, team) = (Signer::p256(), Signer::p256());
    let pk = dir.path().join("platform.pub");
    let tk = dir.path().join("team.pub");
    std::fs::write(&pk, platform.public_pem()).unwrap();
    std::fs::write(&tk, team.public_pem()).unwrap();
    // Signed by the platform key only; and one signed by both.
    push_signed(&reg, "apps/web", "v1", "apps/web", &platform).await;
    push_signed(&reg, "apps/both", "v1", "apps/both", &platform).await;
    let both = reg.push_image("apps/both", "v1").await;
    let payload = crate::support::signing::simple_signing(&format!("{h}/apps/both"), &both);
    crate::support::signing::push_legacy(
        &reg,
        "apps/both",
        &both,
        vec![
            crate::support::signing::Layer::new(payload.clone(), &platform.sign(&payload)),
            crate::support::signing::Layer::new(payload.clone(), &team.sign(&payload)),
        ],
    )
    .await;
    let text = policy(&h, &pk.display().to_string(), &tk.display().to_string());
    let file = dir.path().join("policies.yaml");
    std::fs::write(&file, &text).unwrap();

    let s = Sigil::start(Some(&text), &[]).await;
    let api = s.apiserver();
    let web = format!("{h}/apps/web:v1");
    // Signed by the cluster key only: admitted in team-a, denied in team-b.
    let a = api.create_pod("team-a", &[&web]).await;
    assert!(a.allowed, "{}", a.message);
    let b = api.create_pod("team-b", &[&web]).await;
    assert!(!b.allowed);
    assert!(
        b.message
            .contains("ImagePolicy team-b/signed-only, rule team-keys")
            && b.message.contains("team: wrong key"),
        "{}",
        b.message
    );
    // Signed by both: admitted in team-b too.
    let b = api
        .create_pod("team-b", &[&format!("{h}/apps/both:v1")])
        .await;
    assert!(b.allowed, "{}", b.message);
    // The allow-list in team-c: only team-c's own images.
    let c = api.create_pod("team-c", &[&web]).await;
    assert!(!c.allowed);
    assert!(
        c.message
            .contains("is not on the allow-list of ImagePolicy team-c/allow-list"),
        "{}",
        c.message
    );

    // sigil pin applies the same policies by the manifest's namespace.
    let (code, out) = pin(&file, "team-a", &web);
    assert_eq!(code, Some(0), "{out}");
    let (code, out) = pin(&file, "team-b", &web);
    assert_eq!(code, Some(1), "{out}");
    assert!(
        out.contains("ImagePolicy team-b/signed-only, rule team-keys"),
        "{out}"
    );

    // sigil policy check describes both kinds.
    let out = Command::new(bin())
        .args(["policy", "check", "--schema-only"])
        .arg(&file)
        .output()
        .unwrap();
    let text_out = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text_out}");
    assert!(
        text_out.contains("ImagePolicy team-b/signed-only (objects in namespace team-b only")
            && text_out.contains("refused (defaultAction: deny, an allow-list)"),
        "{text_out}"
    );
    // A loosening field in a team policy is refused, naming it.
    let loose = text.replace(
        "metadata: {name: allow-list, namespace: team-c}\nspec:\n",
        "metadata: {name: allow-list, namespace: team-c}\nspec:\n  exemptNamespaces: [team-c]\n",
    );
    std::fs::write(&file, &loose).unwrap();
    let out = Command::new(bin())
        .args(["policy", "check", "--schema-only"])
        .arg(&file)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("spec.exemptNamespaces is not allowed in a namespaced ImagePolicy"),
        "{err}"
    );
}
