//! How the stand-in reads a request: which collection and object a path
//! names (core `/api/v1` and every `/apis/<group>/<version>`, namespaced and
//! cluster-scoped, with subresources), label and field selectors, and query
//! parameters. No state.

use serde_json::Value;

/// Resources that live outside namespaces (the ones sigil and its tests touch).
pub(super) const CLUSTER_SCOPED: &[&str] = &[
    "namespaces",
    "nodes",
    "mutatingwebhookconfigurations",
    "validatingwebhookconfigurations",
    "customresourcedefinitions",
    "clusterroles",
    "clusterrolebindings",
    "clusterimagepolicies",
    "trustroots",
    "clusterpolicyreports",
    "clusterreports",
    "priorityclasses",
    "storageclasses",
    "persistentvolumes",
    "apiservices",
];

/// Resources stored without a status subresource: a write replaces all of it.
const NO_STATUS: &[&str] = &[
    "configmaps",
    "secrets",
    "serviceaccounts",
    "leases",
    "events",
    "mutatingwebhookconfigurations",
    "validatingwebhookconfigurations",
    "clusterroles",
    "clusterrolebindings",
];

/// What a path names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    /// Collection key: `/api/v1/namespaces/ns/pods`, `/api/v1/namespaces`,
    /// or with `*` for every namespace (`/api/v1/namespaces/*/pods`).
    pub coll: String,
    /// The object's name, for object paths.
    pub name: Option<String>,
    /// `status` (or another subresource), for subresource paths.
    pub sub: Option<String>,
    /// The plural resource name.
    pub resource: String,
}

impl Route {
    /// Whether writes to the main resource leave `.status` alone.
    pub fn has_status(&self) -> bool {
        !NO_STATUS.contains(&self.resource.as_str())
    }
}

/// Reads a request path, or `None` for paths the stand-in does not serve.
pub fn classify(path: &str) -> Option<Route> {
    let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (base, rest) = match segs.as_slice() {
        ["api", "v1", rest @ ..] => ("/api/v1".to_owned(), rest),
        ["apis", group, version, rest @ ..] => (format!("/apis/{group}/{version}"), rest),
        _ => return None,
    };
    let cluster = |r: &str| CLUSTER_SCOPED.contains(&r);
    let route = |coll: String, res: &str, name: Option<&&str>, sub: Option<&&str>| Route {
        coll,
        name: name.map(|n| (*n).to_owned()),
        sub: sub.map(|s| (*s).to_owned()),
        resource: res.to_owned(),
    };
    Some(match rest {
        ["namespaces", ns, res, tail @ ..] if !matches!(*res, "status" | "finalize") => {
            if tail.len() > 2 {
                return None;
            }
            route(
                format!("{base}/namespaces/{ns}/{res}"),
                res,
                tail.first(),
                tail.get(1),
            )
        }
        [res] if cluster(res) => route(format!("{base}/{res}"), res, None, None),
        [res] => route(format!("{base}/namespaces/*/{res}"), res, None, None),
        [res, name] if cluster(res) => route(format!("{base}/{res}"), res, Some(name), None),
        [res, name, sub] if cluster(res) => {
            route(format!("{base}/{res}"), res, Some(name), Some(sub))
        }
        _ => return None,
    })
}

/// Whether objects stored under `stored` belong to the requested `coll`
/// (`…/namespaces/*/secrets` covers every namespace).
pub fn in_collection(coll: &str, stored: &str) -> bool {
    match coll.split_once("/*/") {
        Some((prefix, res)) => {
            stored.starts_with(prefix)
                && stored.ends_with(&format!("/{res}"))
                && stored[prefix.len()..]
                    .trim_start_matches('/')
                    .split('/')
                    .count()
                    == 2
        }
        None => coll == stored,
    }
}

/// Label selectors: `k=v`, `k==v`, `k!=v`, `k` (exists), `!k`, `k in (a,b)`,
/// `k notin (a,b)`, comma-separated (commas inside parentheses belong to the set).
pub fn labels_match(obj: &Value, selector: Option<&str>) -> bool {
    let Some(sel) = selector else { return true };
    let labels = &obj["metadata"]["labels"];
    split_terms(sel).into_iter().all(|term| {
        let term = term.trim();
        let get = |k: &str| labels[k.trim()].as_str();
        if let Some((k, set)) = term.split_once(" notin ") {
            return !set_of(set).contains(&get(k).unwrap_or("\u{0}"));
        }
        if let Some((k, set)) = term.split_once(" in ") {
            return get(k).is_some_and(|v| set_of(set).contains(&v));
        }
        if let Some((k, v)) = term.split_once("!=") {
            return get(k) != Some(v.trim());
        }
        if let Some((k, v)) = term.split_once("==").or_else(|| term.split_once('=')) {
            return get(k) == Some(v.trim());
        }
        if let Some(k) = term.strip_prefix('!') {
            return get(k).is_none();
        }
        get(term).is_some()
    })
}

fn split_terms(sel: &str) -> Vec<&str> {
    let (mut out, mut depth, mut start) = (Vec::new(), 0i32, 0);
    for (i, c) in sel.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                out.push(&sel[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&sel[start..]);
    out.into_iter().filter(|t| !t.trim().is_empty()).collect()
}

fn set_of(s: &str) -> Vec<&str> {
    s.trim()
        .trim_start_matches('(')
        .trim_end_matches(')')
        .split(',')
        .map(str::trim)
        .collect()
}

/// Field selectors kube-apiserver supports for the kinds served here:
/// `type` (Secrets), `metadata.name`, `metadata.namespace`, `spec.nodeName`
/// and `status.phase` (Pods); `=`, `==`, `!=`.
pub fn fields_match(obj: &Value, selector: Option<&str>) -> bool {
    let Some(sel) = selector else { return true };
    sel.split(',').filter(|s| !s.is_empty()).all(|term| {
        let (k, v, negate) = if let Some((k, v)) = term.split_once("!=") {
            (k, v, true)
        } else if let Some((k, v)) = term.split_once("==") {
            (k, v, false)
        } else {
            let (k, v) = term.split_once('=').unwrap_or((term, ""));
            (k, v, false)
        };
        let got = match k {
            "type" => obj["type"].as_str(),
            "metadata.name" => obj["metadata"]["name"].as_str(),
            "metadata.namespace" => obj["metadata"]["namespace"].as_str(),
            "spec.nodeName" => obj["spec"]["nodeName"].as_str(),
            "status.phase" => obj["status"]["phase"].as_str(),
            _ => return false,
        };
        (got.unwrap_or_default() == v) != negate
    })
}

/// One query parameter, percent-decoded.
pub fn query_param(q: &str, key: &str) -> Option<String> {
    q.split('&').find_map(|kv| {
        let (k, v) = kv.split_once('=')?;
        (k == key).then(|| percent_decode(v))
    })
}

fn percent_decode(v: &str) -> String {
    let b = v.as_bytes();
    let hex = |c: u8| (c as char).to_digit(16);
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%'
            && let (Some(h), Some(l)) = (
                b.get(i + 1).and_then(|c| hex(*c)),
                b.get(i + 2).and_then(|c| hex(*c)),
            )
        {
            out.push((h * 16 + l) as u8);
            i += 3;
            continue;
        }
        out.push(if b[i] == b'+' { b' ' } else { b[i] });
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn paths_name_collections_objects_and_subresources() {
        let r = classify("/api/v1/namespaces/a/pods/p").unwrap();
        assert_eq!(
            (r.coll.as_str(), r.name.as_deref()),
            ("/api/v1/namespaces/a/pods", Some("p"))
        );
        assert_eq!(
            classify("/api/v1/pods").unwrap().coll,
            "/api/v1/namespaces/*/pods"
        );
        let ns = classify("/api/v1/namespaces/a").unwrap();
        assert_eq!(
            (ns.coll.as_str(), ns.name.as_deref()),
            ("/api/v1/namespaces", Some("a"))
        );
        let s = classify("/apis/sigil.dev/v1alpha1/clusterimagepolicies/x/status").unwrap();
        assert_eq!(
            (s.coll.as_str(), s.name.as_deref(), s.sub.as_deref()),
            (
                "/apis/sigil.dev/v1alpha1/clusterimagepolicies",
                Some("x"),
                Some("status")
            )
        );
        let l = classify("/apis/coordination.k8s.io/v1/namespaces/s/leases/l").unwrap();
        assert_eq!(l.coll, "/apis/coordination.k8s.io/v1/namespaces/s/leases");
        assert!(!l.has_status());
        assert_eq!(
            classify("/apis/apps/v1/deployments").unwrap().coll,
            "/apis/apps/v1/namespaces/*/deployments"
        );
    }

    #[test]
    fn selectors() {
        let o = json!({"metadata": {"labels": {"app": "web", "tier": "fe"}}});
        assert!(labels_match(&o, Some("app=web,tier")));
        assert!(labels_match(&o, Some("app in (web,db),!missing")));
        assert!(!labels_match(&o, Some("app notin (web)")));
        assert!(!labels_match(&o, Some("app!=web")));
        assert_eq!(
            query_param("labelSelector=app%3Dweb%2Cx", "labelSelector").as_deref(),
            Some("app=web,x")
        );
    }
}
