//! The walker's unit tests: every image location, odd shapes, and the
//! one-pass walk inside an enclosing document.

use super::*;
use serde_json::json;

#[test]
fn finds_every_location() {
    let pod = json!({"kind":"Pod","spec":{
        "initContainers":[{"name":"i","image":"busybox"}],
        "containers":[{"name":"a","image":"nginx"},{"name":"b","image":"redis"}],
        "ephemeralContainers":[{"name":"e","image":"debug"}],
        "volumes":[{"name":"v","image":{"reference":"data:1"}},{"name":"cm","configMap":{}}]}});
    let f = image_fields(&pod);
    let ptrs: Vec<_> = f.iter().map(|x| x.pointer.as_str()).collect();
    assert_eq!(
        ptrs,
        [
            "/spec/initContainers/0/image",
            "/spec/containers/0/image",
            "/spec/containers/1/image",
            "/spec/ephemeralContainers/0/image",
            "/spec/volumes/0/image/reference"
        ]
    );
    for x in &f {
        // The pointer and the path name the same field, and it holds the image.
        assert_eq!(
            pod.pointer(&x.pointer).and_then(Value::as_str),
            Some(x.value.as_str())
        );
        let joined: String = x
            .path
            .iter()
            .map(|s| format!("/{}", escape_token(s)))
            .collect();
        assert_eq!(joined, x.pointer);
    }
    assert_eq!(f[4].describe(), "image volume \"v\"");
    assert_eq!(f[2].dotted(), "spec.containers[1].image");

    let cron = json!({"kind":"CronJob","spec":{"jobTemplate":{"spec":{"template":{"spec":{"containers":[{"name":"c","image":"x"}]}}}}}});
    assert_eq!(
        image_fields(&cron)[0].pointer,
        "/spec/jobTemplate/spec/template/spec/containers/0/image"
    );
    let pt =
        json!({"kind":"PodTemplate","template":{"spec":{"containers":[{"name":"c","image":"x"}]}}});
    assert_eq!(
        image_fields(&pt)[0].pointer,
        "/template/spec/containers/0/image"
    );
    let ks = json!({"kind":"ContainerSource","spec":{"template":{"spec":{"containers":[{"image":"x"}]}}}});
    assert_eq!(
        image_fields(&ks)[0].describe(),
        "container at spec.template.spec.containers[0].image"
    );
}

#[test]
fn ignores_odd_shapes() {
    for v in [
        json!(null),
        json!([]),
        json!({"spec": 3}),
        json!({"spec":{"containers": {"a": 1}}}),
        json!({"spec":{"containers":[{"image": 5}, 7]}}),
    ] {
        assert!(image_fields(&v).is_empty());
    }
}

/// The streaming walk over raw JSON and the walk over a parsed tree must
/// agree on every captured AdmissionReview.
#[test]
fn raw_and_tree_walks_agree_on_fixtures() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../sigil/tests/fixtures/admission_requests");
    let mut n = 0;
    for e in std::fs::read_dir(dir).unwrap() {
        let text = std::fs::read_to_string(e.unwrap().path()).unwrap();
        let Ok(v) = serde_json::from_str::<Value>(&text) else {
            continue;
        };
        for key in ["object", "oldObject"] {
            let obj = &v["request"][key];
            let raw = serde_json::to_string(obj).unwrap();
            assert_eq!(summarize_json(&raw).unwrap(), summarize_value(obj));
            n += summarize_value(obj).fields.len();
        }
    }
    assert!(n > 20, "fixtures have images");
}

#[test]
fn summary_reads_metadata_and_survives_escapes() {
    let raw = r#"{"kind":"Pod","metadata":{"generateName":"web-","deletionTimestamp":"2026-01-01T00:00:00Z"},"spec":{"containers":[{"name":"a\"b","image":"nginx\u003a1"}]}}"#;
    let s = summarize_json(raw).unwrap();
    assert_eq!(s.kind.as_deref(), Some("Pod"));
    assert_eq!(s.generate_name.as_deref(), Some("web-"));
    assert_eq!(s.namespace, None);
    let d = summarize_value(
        &serde_json::json!({"kind": "Deployment", "spec": {"template": {"spec": {
        "serviceAccount": "old", "serviceAccountName": "builder",
        "imagePullSecrets": [{"name": "a"}, {"name": ""}, {"x": 1}, {"name": "b"}],
        "containers": [{"image": "x"}]}}}}),
    );
    assert_eq!(d.pull_secrets, ["a", "b"]);
    assert_eq!(d.service_account.as_deref(), Some("builder"));
    assert!(s.terminating);
    assert_eq!(s.fields[0].value, "nginx:1");
    assert_eq!(s.fields[0].name.as_deref(), Some("a\"b"));
    assert!(
        !summarize_json(r#"{"metadata":{"deletionTimestamp":null}}"#)
            .unwrap()
            .terminating
    );
    assert!(summarize_json("{").is_err());
}

#[test]
fn escapes_pointer_tokens() {
    assert_eq!(escape_token("a/b~c"), "a~1b~0c");
    assert_eq!(escape_token("plain"), "plain");
    let mut s = "/x/".to_owned();
    push_escaped(&mut s, "~/é");
    assert_eq!(s, "/x/~0~1é");
}

/// The one-pass walk inside an enclosing document finds what the two-pass
/// walk finds, and anything but an object is no object.
#[test]
fn walked_inside_a_document_matches_the_separate_walk() {
    #[derive(serde::Deserialize)]
    struct Outer {
        #[serde(default)]
        object: Option<Walked>,
    }
    let obj = r#"{"kind":"Pod","metadata":{"name":"a","namespace":"n"},"spec":{"containers":[{"name":"c","image":"nginx:1"}],"volumes":[{"name":"v","image":{"reference":"r.io/x:1"}}]}}"#;
    let outer: Outer = serde_json::from_str(&format!(r#"{{"object":{obj}}}"#)).unwrap();
    let one = outer.object.and_then(|w| w.0).expect("an object");
    assert_eq!(*one, summarize_json(obj).unwrap());
    for other in ["null", "[1,{}]", "\"x\"", "3", "true"] {
        let outer: Outer = serde_json::from_str(&format!(r#"{{"object":{other}}}"#)).unwrap();
        assert!(outer.object.and_then(|w| w.0).is_none(), "{other}");
    }
}
