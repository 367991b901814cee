use super::*;

fn ring(keys: &[&str]) -> Keyring {
    let mut k = Keyring::default();
    let entries: Vec<(String, Credential)> = keys
        .iter()
        .map(|k| ((*k).to_owned(), Credential::basic(*k, "pw")))
        .collect();
    k.add(&entries, &CredentialSource::DockerConfig);
    k
}

fn users(k: &Keyring, image: &str) -> Vec<String> {
    k.lookup(image)
        .into_iter()
        .map(|c| {
            c.credential
                .map(|c| c.username().to_owned())
                .unwrap_or_default()
        })
        .collect()
}

#[test]
fn kubelet_key_matching() {
    let k = ring(&[
        "quay.io",
        "https://quay.io/team",
        "*.azurecr.io",
        "registry.local:5000",
        "http://other.io/v2/",
        "https://index.docker.io/v1/",
    ]);
    // Most specific first, then the next.
    assert_eq!(
        users(&k, "quay.io/team/app"),
        ["https://quay.io/team", "quay.io"]
    );
    assert_eq!(users(&k, "quay.io/other/app"), ["quay.io"]);
    // `*` matches one DNS label, not more.
    assert_eq!(users(&k, "acme.azurecr.io/app"), ["*.azurecr.io"]);
    assert!(users(&k, "a.b.azurecr.io/app").is_empty());
    assert!(users(&k, "azurecr.io/app").is_empty());
    // The port must be equal.
    assert_eq!(users(&k, "registry.local:5000/x"), ["registry.local:5000"]);
    assert!(users(&k, "registry.local/x").is_empty());
    assert!(users(&k, "registry.local:5001/x").is_empty());
    // /v1/ and /v2/ mean the host.
    assert_eq!(users(&k, "other.io/a/b"), ["http://other.io/v2/"]);
    // Docker Hub's legacy key serves docker.io names.
    assert_eq!(
        users(&k, "docker.io/library/nginx"),
        ["https://index.docker.io/v1/"]
    );
}

#[test]
fn provider_match_images() {
    assert!(key_matches(
        "*.dkr.ecr.*.amazonaws.com",
        "123.dkr.ecr.eu-west-1.amazonaws.com/app"
    ));
    assert!(!key_matches(
        "*.dkr.ecr.*.amazonaws.com",
        "123.dkr.ecr.amazonaws.com/app"
    ));
    assert!(key_matches(
        "*-docker.pkg.dev",
        "europe-docker.pkg.dev/p/r/app"
    ));
    assert!(key_matches("docker.io", "docker.io/library/nginx"));
    assert_eq!(registry_of("r.io:5000/a/b"), "r.io:5000");
}

#[test]
fn docker_config_forms() {
    let auth = base64::engine::general_purpose::STANDARD.encode("alice:s3cret");
    let json = format!(
        r#"{{"auths":{{"a.io":{{"auth":"{auth}"}},"b.io":{{"username":"bob","password":"pw"}},"c.io":{{"identitytoken":"tok"}},"d.io":{{}}}}}}"#
    );
    let e = parse_docker_config(json.as_bytes(), false).unwrap();
    assert_eq!(e.len(), 3);
    assert_eq!(e[0].1, Credential::basic("alice", "s3cret"));
    assert_eq!(e[1].1, Credential::basic("bob", "pw"));
    assert!(e[2].1.is_identity_token());
    let legacy = format!(r#"{{"a.io":{{"auth":"{auth}","email":"x@y"}}}}"#);
    assert_eq!(
        parse_docker_config(legacy.as_bytes(), true).unwrap()[0].1,
        Credential::basic("alice", "s3cret")
    );
    assert!(matches!(
        parse_docker_config(br#"{"auths":{"a.io":{"auth":"!!"}}}"#, false),
        Err(CredentialError::BadAuth { .. })
    ));
    assert!(parse_docker_config(b"nope", false).is_err());
}

#[test]
fn secrets_never_print_and_identities_do_not_reveal_them() {
    let c = Credential::basic("alice", "hunter2");
    let shown = format!("{c:?}");
    assert!(!shown.contains("hunter2"), "{shown}");
    assert_eq!(
        c.identity(),
        Credential::basic("alice", "hunter2").identity()
    );
    assert_ne!(c.identity(), Credential::basic("alice", "other").identity());
    assert_eq!(c.identity().len(), 16);
}

#[test]
fn pods_use_their_own_secrets_workloads_fall_back_to_the_service_account() {
    let pod = PullContext::of("shop", "Pod", &[], Some("builder"));
    assert_eq!(pod.service_account, None);
    let d = PullContext::of("shop", "Deployment", &[], None);
    assert_eq!(d.service_account.as_deref(), Some("default"));
    let d = PullContext::of("shop", "Deployment", &["own".into()], Some("builder"));
    assert_eq!(
        d.service_account, None,
        "the SA's secrets would not reach the Pod"
    );
    let mut store = StaticStore::default();
    let auths: SecretAuths = Arc::new(Auths::new(&[("r.io".into(), Credential::basic("u", "p"))]));
    store.add_secret("shop", "regcred", auths);
    store.add_service_account("shop", "default", vec!["regcred".into(), "gone".into()]);
    let d = PullContext::of("shop", "Deployment", &[], None);
    let found = d.candidates(&store, "r.io/app");
    assert_eq!(found.len(), 1);
    assert_eq!(
        found[0].source.to_string(),
        "serviceaccount shop/default (secret shop/regcred)"
    );
    assert_eq!(d.sources(), ["serviceaccount shop/default"]);
}
