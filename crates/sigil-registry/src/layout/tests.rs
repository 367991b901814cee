use super::*;
use sigil_testkit::oci_layout::Layout;
use sigil_testkit::signing::Signer;

fn far() -> Instant {
    Instant::now() + std::time::Duration::from_secs(5)
}

#[tokio::test]
async fn tags_digests_signatures_and_referrers_come_from_the_layouts() {
    let root = tempfile::tempdir().unwrap();
    let mut l = Layout::create(root.path(), "registry.example.com/team/app");
    let d = l.image("v1", "hello");
    l.sign(&d, "registry.example.com/team/app", &Signer::p256());
    let subject = serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "artifactType": "application/vnd.example.sbom",
        "config": {"mediaType": "application/vnd.oci.empty.v1+json", "digest": "sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a", "size": 2},
        "layers": [],
        "subject": {"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": d, "size": 1}
    }))
    .unwrap();
    let referrer = l.manifest(&subject, "application/vnd.oci.image.manifest.v1+json", None);
    let layouts = Layouts::new(root.path());
    let creds = PullCredentials::default();
    let app = Reference::parse("registry.example.com/team/app:v1").unwrap();
    let got = layouts.resolve(&app, None, &creds, far()).await.unwrap();
    assert_eq!(got.to_string(), d);
    let by_tag = layouts
        .manifest(&app, "v1", &creds, far())
        .await
        .unwrap()
        .unwrap();
    let by_digest = layouts
        .manifest(&app, &d, &creds, far())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(by_tag, by_digest);
    let sig_tag = format!("{}.sig", d.replace(':', "-"));
    assert!(
        layouts
            .manifest(&app, &sig_tag, &creds, far())
            .await
            .unwrap()
            .is_some()
    );
    assert!(
        layouts
            .manifest(&app, "nope", &creds, far())
            .await
            .unwrap()
            .is_none()
    );
    let refs = layouts
        .referrers(&app, &Digest::parse(&d).unwrap(), &creds, far())
        .await
        .unwrap()
        .unwrap();
    let refs: serde_json::Value = serde_json::from_slice(&refs).unwrap();
    assert_eq!(refs["manifests"][0]["digest"], referrer);
    assert_eq!(
        refs["manifests"][0]["artifactType"],
        "application/vnd.example.sbom"
    );

    // Missing tags and repositories are NotFound, with where it looked.
    let v2 = Reference::parse("registry.example.com/team/app:v2").unwrap();
    let e = layouts.resolve(&v2, None, &creds, far()).await.unwrap_err();
    assert_eq!(e.kind(), "not_found", "{e:?}");
    let other = Reference::parse("registry.example.com/other:v1").unwrap();
    let e = layouts
        .resolve(&other, None, &creds, far())
        .await
        .unwrap_err();
    assert!(
        format!("{e:?}").contains("not in the offline registry"),
        "{e:?}"
    );

    // A blob that does not match its digest is refused, never served.
    let hex = d.trim_start_matches("sha256:");
    let path = root
        .path()
        .join("registry.example.com/team/app/blobs/sha256")
        .join(hex);
    std::fs::write(&path, b"tampered").unwrap();
    let e = layouts.manifest(&app, &d, &creds, far()).await.unwrap_err();
    assert!(
        format!("{e:?}").contains("does not match its digest"),
        "{e:?}"
    );
}

#[tokio::test]
async fn a_full_reference_as_ref_name_names_the_tag() {
    let root = tempfile::tempdir().unwrap();
    let mut l = Layout::create(root.path(), "docker.io/library/nginx");
    let m = br#"{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"x","digest":"sha256:00","size":0},"layers":[]}"#;
    let d = l.manifest(
        m,
        "application/vnd.oci.image.manifest.v1+json",
        Some("docker.io/library/nginx:1.27"),
    );
    let layouts = Layouts::new(root.path());
    let r = Reference::parse("nginx:1.27").unwrap();
    let got = layouts
        .resolve(&r, None, &PullCredentials::default(), far())
        .await
        .unwrap();
    assert_eq!(got.to_string(), d);
}
