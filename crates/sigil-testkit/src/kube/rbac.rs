//! Who a request is and whether RBAC lets it through, as kube-apiserver
//! decides it: bearer tokens name a user (the stand-in's admin token is in
//! `system:masters`; ServiceAccount tokens are
//! `system:serviceaccount:<ns>:<name>` in the groups `system:serviceaccounts`,
//! `system:serviceaccounts:<ns>` and `system:authenticated`, and stop working
//! when their ServiceAccount is deleted); requests become attributes (verb,
//! API group, resource, subresource, namespace, name); the Roles,
//! ClusterRoles and bindings stored in the stand-in grant them — aggregated
//! ClusterRoles included, `resourceNames` never matching create or an
//! unnamed list/watch, a list/watch named by a `metadata.name` field
//! selector — and a refusal is the 403 Status kube-apiserver sends.
//! Discovery paths are open to every authenticated user (`system:discovery`).
//! It holds no state of its own: it reads the stand-in's store.

use serde_json::{Value, json};

use super::route::query_param;
use super::store::State;

const RBAC: &str = "/apis/rbac.authorization.k8s.io/v1";

/// An authenticated user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct User {
    pub name: String,
    pub groups: Vec<String>,
    /// (namespace, name) for a ServiceAccount token.
    pub service_account: Option<(String, String)>,
}

impl User {
    pub fn admin() -> User {
        User {
            name: "kubernetes-admin".into(),
            groups: vec!["system:masters".into(), "system:authenticated".into()],
            service_account: None,
        }
    }

    pub fn service_account(namespace: &str, name: &str) -> User {
        User {
            name: format!("system:serviceaccount:{namespace}:{name}"),
            groups: vec![
                "system:serviceaccounts".into(),
                format!("system:serviceaccounts:{namespace}"),
                "system:authenticated".into(),
            ],
            service_account: Some((namespace.to_owned(), name.to_owned())),
        }
    }
}

/// What a request asks to do, in RBAC's terms.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attributes {
    pub verb: String,
    /// `None` for a non-resource request (`path` then says what).
    pub resource: Option<ResourceAttributes>,
    pub path: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResourceAttributes {
    pub group: String,
    pub resource: String,
    pub subresource: String,
    pub namespace: String,
    pub name: String,
}

/// Reads a request as kube-apiserver's request-info resolver does.
pub fn attributes(method: &str, path: &str, query: &str) -> Attributes {
    let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
    let rest = match segs.as_slice() {
        ["api", "v1", rest @ ..] if !rest.is_empty() => Some(("", rest)),
        ["apis", group, _version, rest @ ..] if !rest.is_empty() => Some((*group, rest)),
        _ => None,
    };
    let non_resource = |verb: &str| Attributes {
        verb: verb.to_owned(),
        resource: None,
        path: path.to_owned(),
    };
    let Some((group, rest)) = rest else {
        return non_resource(&method.to_ascii_lowercase());
    };
    // `namespaces/x` (and `namespaces/x/status`) name the Namespace itself;
    // `namespaces/x/<resource>/…` a resource inside it.
    let (namespace, resource, name, subresource) = match rest {
        ["namespaces", ns, res, tail @ ..] if !matches!(*res, "status" | "finalize") => (
            *ns,
            *res,
            tail.first().copied().unwrap_or_default(),
            tail.get(1).copied().unwrap_or_default(),
        ),
        [res, tail @ ..] => (
            "",
            *res,
            tail.first().copied().unwrap_or_default(),
            tail.get(1).copied().unwrap_or_default(),
        ),
        [] => ("", "", "", ""),
    };
    let watch = matches!(
        query_param(query, "watch").as_deref(),
        Some("true") | Some("1")
    );
    let verb = match (method, name.is_empty()) {
        ("GET" | "HEAD", false) => "get",
        ("GET" | "HEAD", true) if watch => "watch",
        ("GET" | "HEAD", true) => "list",
        ("POST", _) => "create",
        ("PUT", _) => "update",
        ("PATCH", _) => "patch",
        ("DELETE", false) => "delete",
        ("DELETE", true) => "deletecollection",
        (m, _) => return non_resource(&m.to_ascii_lowercase()),
    };
    // A list or watch of one object by `metadata.name` is authorized by name.
    let name = if name.is_empty() && matches!(verb, "list" | "watch") {
        query_param(query, "fieldSelector")
            .and_then(|f| {
                f.split(',').find_map(|t| {
                    t.strip_prefix("metadata.name==")
                        .or_else(|| t.strip_prefix("metadata.name="))
                        .map(str::to_owned)
                })
            })
            .unwrap_or_default()
    } else {
        name.to_owned()
    };
    Attributes {
        verb: verb.to_owned(),
        resource: Some(ResourceAttributes {
            group: group.to_owned(),
            resource: resource.to_owned(),
            subresource: subresource.to_owned(),
            namespace: namespace.to_owned(),
            name,
        }),
        path: path.to_owned(),
    }
}

/// Paths `system:discovery` and `system:public-info-viewer` open to everyone authenticated.
fn discovery(path: &str) -> bool {
    let p = path.trim_end_matches('/');
    [
        "/api", "/apis", "/version", "/healthz", "/livez", "/readyz", "/openapi",
    ]
    .iter()
    .any(|d| p == *d || p.starts_with(&format!("{d}/")))
}

fn strings(v: &Value) -> Vec<&str> {
    v.as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

fn has(list: &[&str], want: &str) -> bool {
    list.iter().any(|x| *x == "*" || *x == want)
}

/// Whether one PolicyRule allows the request (rbac/v1 `RuleAllows`).
fn rule_allows(rule: &Value, a: &Attributes) -> bool {
    if !has(&strings(&rule["verbs"]), &a.verb) {
        return false;
    }
    let Some(r) = &a.resource else {
        return strings(&rule["nonResourceURLs"]).iter().any(|u| {
            *u == "*" || *u == a.path || u.strip_suffix('*').is_some_and(|p| a.path.starts_with(p))
        });
    };
    if !has(&strings(&rule["apiGroups"]), &r.group) {
        return false;
    }
    let combined = if r.subresource.is_empty() {
        r.resource.clone()
    } else {
        format!("{}/{}", r.resource, r.subresource)
    };
    let resources = strings(&rule["resources"]);
    let resource_ok = resources.iter().any(|x| {
        *x == "*"
            || *x == combined
            || (!r.subresource.is_empty() && *x == format!("*/{}", r.subresource))
    });
    if !resource_ok {
        return false;
    }
    let names = strings(&rule["resourceNames"]);
    names.is_empty() || (!r.name.is_empty() && names.contains(&r.name.as_str()))
}

fn label_selector_matches(sel: &Value, labels: &Value) -> bool {
    let ml = sel["matchLabels"].as_object();
    let labels_ok = ml.is_none_or(|m| m.iter().all(|(k, v)| &labels[k] == v));
    let exprs_ok = sel["matchExpressions"].as_array().is_none_or(|es| {
        es.iter().all(|e| {
            let key = e["key"].as_str().unwrap_or_default();
            let values = strings(&e["values"]);
            let got = labels[key].as_str();
            match e["operator"].as_str().unwrap_or_default() {
                "In" => got.is_some_and(|g| values.contains(&g)),
                "NotIn" => got.is_none_or(|g| !values.contains(&g)),
                "Exists" => got.is_some(),
                "DoesNotExist" => got.is_none(),
                _ => false,
            }
        })
    });
    labels_ok && exprs_ok
}

impl State {
    /// The rules of a ClusterRole, with those of the ClusterRoles its
    /// aggregationRule selects (what the aggregation controller writes).
    fn cluster_role_rules(&self, name: &str) -> Vec<Value> {
        let Some(role) = self.get(&format!("{RBAC}/clusterroles"), name) else {
            return Vec::new();
        };
        let mut rules = role["rules"].as_array().cloned().unwrap_or_default();
        if let Some(selectors) = role["aggregationRule"]["clusterRoleSelectors"].as_array() {
            for other in self.list(&format!("{RBAC}/clusterroles")) {
                if other["metadata"]["name"] == role["metadata"]["name"] {
                    continue;
                }
                let labels = &other["metadata"]["labels"];
                if selectors.iter().any(|s| label_selector_matches(s, labels)) {
                    rules.extend(other["rules"].as_array().cloned().unwrap_or_default());
                }
            }
        }
        rules
    }

    fn binds(subjects: &Value, user: &User) -> bool {
        subjects.as_array().is_some_and(|subs| {
            subs.iter().any(|s| {
                let name = s["name"].as_str().unwrap_or_default();
                match s["kind"].as_str().unwrap_or_default() {
                    "ServiceAccount" => user.service_account.as_ref().is_some_and(|(ns, n)| {
                        n == name && Some(ns.as_str()) == s["namespace"].as_str()
                    }),
                    "User" => user.name == name,
                    "Group" => user.groups.iter().any(|g| g == name),
                    _ => false,
                }
            })
        })
    }

    /// Whether RBAC allows `user` to do `a`.
    pub fn authorize(&self, user: &User, a: &Attributes) -> bool {
        if user.groups.iter().any(|g| g == "system:masters") {
            return true;
        }
        if a.resource.is_none() && a.verb == "get" && discovery(&a.path) {
            return true;
        }
        let granted = |role_ref: &Value, namespace: Option<&str>| -> bool {
            let name = role_ref["name"].as_str().unwrap_or_default();
            let rules = match (role_ref["kind"].as_str(), namespace) {
                (Some("ClusterRole"), _) => self.cluster_role_rules(name),
                (Some("Role"), Some(ns)) => self
                    .get(&format!("{RBAC}/namespaces/{ns}/roles"), name)
                    .and_then(|r| r["rules"].as_array().cloned())
                    .unwrap_or_default(),
                _ => Vec::new(),
            };
            rules.iter().any(|r| rule_allows(r, a))
        };
        let cluster = self
            .list(&format!("{RBAC}/clusterrolebindings"))
            .into_iter()
            .any(|b| Self::binds(&b["subjects"], user) && granted(&b["roleRef"], None));
        if cluster {
            return true;
        }
        // RoleBindings grant only inside their own namespace.
        let Some(ns) = a
            .resource
            .as_ref()
            .map(|r| r.namespace.as_str())
            .filter(|ns| !ns.is_empty())
        else {
            return false;
        };
        self.list(&format!("{RBAC}/namespaces/{ns}/rolebindings"))
            .into_iter()
            .any(|b| Self::binds(&b["subjects"], user) && granted(&b["roleRef"], Some(ns)))
    }
}

/// The 403 kube-apiserver answers (`NewForbidden` with the RBAC message).
pub fn forbidden(user: &User, a: &Attributes) -> (u16, Value) {
    let Some(r) = &a.resource else {
        let message = format!(
            "forbidden: User \"{}\" cannot {} path \"{}\"",
            user.name, a.verb, a.path
        );
        return (
            403,
            json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                   "message": message, "reason": "Forbidden", "details": {}, "code": 403}),
        );
    };
    let resource = if r.subresource.is_empty() {
        r.resource.clone()
    } else {
        format!("{}/{}", r.resource, r.subresource)
    };
    let why = if r.namespace.is_empty() {
        format!(
            "User \"{}\" cannot {} resource \"{resource}\" in API group \"{}\" at the cluster scope",
            user.name, a.verb, r.group
        )
    } else {
        format!(
            "User \"{}\" cannot {} resource \"{resource}\" in API group \"{}\" in the namespace \"{}\"",
            user.name, a.verb, r.group, r.namespace
        )
    };
    let qualified = if r.group.is_empty() {
        r.resource.clone()
    } else {
        format!("{}.{}", r.resource, r.group)
    };
    let message = if r.name.is_empty() {
        format!("{qualified} is forbidden: {why}")
    } else {
        format!("{qualified} \"{}\" is forbidden: {why}", r.name)
    };
    let mut details = json!({"group": r.group, "kind": r.resource});
    if !r.name.is_empty() {
        details["name"] = json!(r.name);
    }
    (
        403,
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
               "message": message, "reason": "Forbidden", "details": details, "code": 403}),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state_with(objects: &[(&str, Value)]) -> State {
        let mut s = State::default();
        for (c, o) in objects {
            s.insert(c, o.clone());
        }
        s
    }

    fn sa() -> User {
        User::service_account("sigil-system", "sigil")
    }

    fn bound_cluster_role(rules: Value, labels: Value) -> State {
        state_with(&[
            (
                "/apis/rbac.authorization.k8s.io/v1/clusterroles",
                json!({"metadata": {"name": "r", "labels": labels}, "rules": rules}),
            ),
            (
                "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
                json!({"metadata": {"name": "b"},
                       "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "r"},
                       "subjects": [{"kind": "ServiceAccount", "name": "sigil", "namespace": "sigil-system"}]}),
            ),
        ])
    }

    #[test]
    fn requests_read_as_the_apiserver_reads_them() {
        let a = attributes("GET", "/api/v1/namespaces/a/pods", "watch=true");
        assert_eq!(a.verb, "watch");
        let r = a.resource.unwrap();
        assert_eq!(
            (r.group.as_str(), r.namespace.as_str(), r.resource.as_str()),
            ("", "a", "pods")
        );
        let a = attributes(
            "PATCH",
            "/apis/sigil.dev/v1alpha1/clusterimagepolicies/x/status",
            "",
        );
        let r = a.resource.unwrap();
        assert_eq!(
            (
                a.verb.as_str(),
                r.group.as_str(),
                r.resource.as_str(),
                r.name.as_str(),
                r.subresource.as_str()
            ),
            ("patch", "sigil.dev", "clusterimagepolicies", "x", "status")
        );
        let a = attributes("GET", "/api/v1/namespaces/sigil-system", "");
        let r = a.resource.unwrap();
        assert_eq!(
            (r.resource.as_str(), r.name.as_str(), r.namespace.as_str()),
            ("namespaces", "sigil-system", "")
        );
        let a = attributes(
            "GET",
            "/api/v1/namespaces/s/configmaps",
            "fieldSelector=metadata.name%3Dsigil-state",
        );
        assert_eq!(
            (a.verb.as_str(), a.resource.unwrap().name.as_str()),
            ("list", "sigil-state")
        );
        assert_eq!(
            attributes("DELETE", "/api/v1/namespaces/s/pods", "").verb,
            "deletecollection"
        );
        assert!(attributes("GET", "/version", "").resource.is_none());
    }

    #[test]
    fn rules_grant_by_verb_group_resource_subresource_and_name() {
        let s = bound_cluster_role(
            json!([
                {"apiGroups": [""], "resources": ["secrets"], "verbs": ["list", "watch"]},
                {"apiGroups": [""], "resources": ["configmaps"], "resourceNames": ["state"], "verbs": ["get", "list"]},
                {"apiGroups": ["sigil.dev"], "resources": ["imagepolicies/status"], "verbs": ["patch"]},
            ]),
            json!({}),
        );
        let ok = |m, p, q| s.authorize(&sa(), &attributes(m, p, q));
        assert!(ok("GET", "/api/v1/secrets", "watch=1"));
        assert!(
            !ok("GET", "/api/v1/namespaces/a/secrets/x", ""),
            "get is not list"
        );
        assert!(ok("GET", "/api/v1/namespaces/a/configmaps/state", ""));
        assert!(!ok("GET", "/api/v1/namespaces/a/configmaps/other", ""));
        assert!(
            !ok("GET", "/api/v1/namespaces/a/configmaps", ""),
            "an unnamed list is not named"
        );
        assert!(ok(
            "GET",
            "/api/v1/namespaces/a/configmaps",
            "fieldSelector=metadata.name=state"
        ));
        assert!(ok(
            "PATCH",
            "/apis/sigil.dev/v1/namespaces/a/imagepolicies/p/status",
            ""
        ));
        assert!(
            !ok(
                "PATCH",
                "/apis/sigil.dev/v1/namespaces/a/imagepolicies/p",
                ""
            ),
            "status is not the object"
        );
        assert!(
            !ok("GET", "/apis/other.dev/v1/secrets", ""),
            "another group"
        );
        assert!(ok("GET", "/version", ""), "discovery is open");
        assert!(!s.authorize(
            &User::service_account("other", "sigil"),
            &attributes("GET", "/api/v1/secrets", "")
        ));
        assert!(s.authorize(
            &User::admin(),
            &attributes("DELETE", "/api/v1/namespaces/a/secrets/x", "")
        ));
    }

    #[test]
    fn role_bindings_grant_only_in_their_namespace_and_aggregation_counts() {
        let mut s = state_with(&[
            (
                "/apis/rbac.authorization.k8s.io/v1/namespaces/a/roles",
                json!({"metadata": {"name": "r", "namespace": "a"},
                       "rules": [{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]}]}),
            ),
            (
                "/apis/rbac.authorization.k8s.io/v1/namespaces/a/rolebindings",
                json!({"metadata": {"name": "b", "namespace": "a"},
                       "roleRef": {"kind": "Role", "name": "r"},
                       "subjects": [{"kind": "Group", "name": "system:serviceaccounts:sigil-system"}]}),
            ),
        ]);
        assert!(s.authorize(
            &sa(),
            &attributes(
                "POST",
                "/apis/coordination.k8s.io/v1/namespaces/a/leases",
                ""
            )
        ));
        assert!(!s.authorize(
            &sa(),
            &attributes(
                "POST",
                "/apis/coordination.k8s.io/v1/namespaces/b/leases",
                ""
            )
        ));
        // An aggregated ClusterRole collects the rules of the roles its selector matches.
        for (c, o) in [
            (
                "/apis/rbac.authorization.k8s.io/v1/clusterroles",
                json!({"metadata": {"name": "edit"}, "rules": [],
                    "aggregationRule": {"clusterRoleSelectors": [{"matchLabels": {"aggregate-to-edit": "true"}}]}}),
            ),
            (
                "/apis/rbac.authorization.k8s.io/v1/clusterroles",
                json!({"metadata": {"name": "extra", "labels": {"aggregate-to-edit": "true"}},
                    "rules": [{"apiGroups": ["sigil.dev"], "resources": ["imagepolicies"], "verbs": ["create"]}]}),
            ),
            (
                "/apis/rbac.authorization.k8s.io/v1/namespaces/t/rolebindings",
                json!({"metadata": {"name": "dev", "namespace": "t"},
                    "roleRef": {"kind": "ClusterRole", "name": "edit"},
                    "subjects": [{"kind": "User", "name": "dev"}]}),
            ),
        ] {
            s.insert(c, o);
        }
        let dev = User {
            name: "dev".into(),
            groups: vec!["system:authenticated".into()],
            service_account: None,
        };
        assert!(s.authorize(
            &dev,
            &attributes(
                "POST",
                "/apis/sigil.dev/v1alpha1/namespaces/t/imagepolicies",
                ""
            )
        ));
        assert!(!s.authorize(
            &dev,
            &attributes("POST", "/apis/sigil.dev/v1alpha1/clusterimagepolicies", "")
        ));
    }

    #[test]
    fn refusals_carry_the_apiserver_status() {
        let a = attributes("GET", "/api/v1/namespaces/s/secrets/sigil-tls", "");
        let (code, v) = forbidden(&sa(), &a);
        assert_eq!(code, 403);
        assert_eq!(
            v["message"],
            "secrets \"sigil-tls\" is forbidden: User \"system:serviceaccount:sigil-system:sigil\" cannot get resource \"secrets\" in API group \"\" in the namespace \"s\""
        );
        assert_eq!(
            v["details"],
            json!({"name": "sigil-tls", "group": "", "kind": "secrets"})
        );
        let (_, v) = forbidden(&sa(), &attributes("GET", "/apis/apps/v1/deployments", ""));
        assert_eq!(
            v["message"],
            "deployments.apps is forbidden: User \"system:serviceaccount:sigil-system:sigil\" cannot list resource \"deployments\" in API group \"apps\" at the cluster scope"
        );
    }
}
