//! CRD validation rules (`x-kubernetes-validations`) on writes, as the API
//! server runs them: a custom object whose `spec` breaks a rule of its
//! stored CRD is refused with 422 Invalid and the rule's message.
//!
//! Owns only the rules on `spec` (where sigil's CRDs put theirs), evaluated
//! with the `cel` crate with `self` bound to the object's `spec`, after the
//! declared types of `spec`'s own fields: as the real API server does, a
//! field of the wrong type is refused and the rules are not run (found on
//! kube-apiserver v1.36: a namespaced ImagePolicy's `mirrors` typed as an
//! object refused a list by type, never reaching its rule's message). It
//! does not check the rest of the OpenAPI schema (nested types, required).

use serde_json::Value;

/// The messages of every rule `spec` breaks under `crd`, or why a rule
/// could not be evaluated (counted as broken, as the API server does).
pub(super) fn violations(crd: &Value, object: &Value) -> Vec<String> {
    let version = object["apiVersion"]
        .as_str()
        .and_then(|v| v.rsplit('/').next())
        .unwrap_or_default();
    let Some(v) = crd["spec"]["versions"]
        .as_array()
        .and_then(|vs| vs.iter().find(|v| v["name"] == version))
    else {
        return Vec::new();
    };
    let spec_schema = &v["schema"]["openAPIV3Schema"]["properties"]["spec"];
    let (Some(rules), Some(spec)) = (
        spec_schema["x-kubernetes-validations"].as_array(),
        object.get("spec"),
    ) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for (field, schema) in spec_schema["properties"].as_object().into_iter().flatten() {
        let (Some(want), Some(got)) = (schema["type"].as_str(), spec.get(field)) else {
            continue;
        };
        let is = match got {
            Value::Object(_) => "object",
            Value::Array(_) => "array",
            Value::String(_) => "string",
            Value::Bool(_) => "boolean",
            Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
            Value::Number(_) => "number",
            Value::Null => "null",
        };
        if is != want && !(want == "number" && is == "integer") {
            out.push(format!(
                "spec.{field}: Invalid value: \"{is}\": spec.{field} in body must be of type {want}: \"{is}\""
            ));
        }
    }
    if !out.is_empty() {
        out.push("<nil>: Invalid value: null: some validation rules were not checked because the object was invalid; correct the existing errors to complete validation".into());
        return out;
    }
    for r in rules {
        let rule = r["rule"].as_str().unwrap_or_default();
        let message = r["message"].as_str().unwrap_or(rule);
        let ok = match cel::Program::compile(rule) {
            Ok(p) => {
                let mut ctx = cel::Context::default();
                match ctx.add_variable("self", spec.clone()) {
                    Ok(()) => matches!(p.execute(&ctx), Ok(cel::Value::Bool(true))),
                    Err(_) => false,
                }
            }
            Err(_) => false,
        };
        if !ok {
            out.push(format!("spec: Invalid value: \"object\": {message}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn rules_on_spec_are_evaluated_with_self() {
        let crd = json!({"spec": {"versions": [{"name": "v1", "schema": {"openAPIV3Schema": {"properties": {"spec": {
        "x-kubernetes-validations": [
            {"rule": "self.items.size() > 0", "message": "needs items"},
            {"rule": "!has(self.forbidden)", "message": "no forbidden"},
            {"rule": "self.items.all(i, i.matches('^[a-z]+$'))", "message": "lowercase"}
        ]}}}}}]}});
        let ok = json!({"apiVersion": "x/v1", "spec": {"items": ["a"]}});
        assert!(violations(&crd, &ok).is_empty());
        let bad = json!({"apiVersion": "x/v1", "spec": {"items": [], "forbidden": 1}});
        let v = violations(&crd, &bad);
        assert_eq!(v.len(), 2, "{v:?}");
        assert!(v[0].ends_with("needs items"));
        let upper = json!({"apiVersion": "x/v1", "spec": {"items": ["A"]}});
        assert_eq!(violations(&crd, &upper).len(), 1);
    }

    /// As kube-apiserver v1.36 does: a field of the wrong declared type is
    /// refused by its type, and the rules are not run.
    #[test]
    fn a_field_of_the_wrong_type_is_refused_before_the_rules() {
        let crd = json!({"spec": {"versions": [{"name": "v1", "schema": {"openAPIV3Schema": {"properties": {"spec": {
        "properties": {"mirrors": {"type": "object"}},
        "x-kubernetes-validations": [{"rule": "!has(self.mirrors)", "message": "no mirrors"}]}}}}}]}});
        let v = violations(
            &crd,
            &json!({"apiVersion": "x/v1", "spec": {"mirrors": []}}),
        );
        assert!(
            v[0].contains("spec.mirrors in body must be of type object"),
            "{v:?}"
        );
        assert!(!v.iter().any(|m| m.contains("no mirrors")), "{v:?}");
        let v = violations(
            &crd,
            &json!({"apiVersion": "x/v1", "spec": {"mirrors": {}}}),
        );
        assert!(v[0].ends_with("no mirrors"), "{v:?}");
    }
}
