//! The generated backstop's CEL evaluated in process with the `cel` crate
//! and CEL's strings extension (the functions kube-apiserver's CEL offers
//! for what the backstop uses), variable by variable as the API server
//! evaluates them: what the tests and the fuzz target hold to
//! `Policy::plan`, and the real API server to both. It decides nothing of
//! its own and is not on any admission path.

use std::collections::HashMap;
use std::sync::Arc;

use serde_json::Value;

/// The `verdicts` of the ValidatingAdmissionPolicy `vap` (as generated:
/// its `spec.variables`) for `object` (and `old`, for an UPDATE): one list
/// per image the object adds, `[written, ok|refuse|warn, why, rule]`.
/// `Err` says which variable failed and why.
pub fn verdicts(
    vap: &Value,
    object: &Value,
    old: Option<&Value>,
) -> Result<Vec<Vec<String>>, String> {
    let mut env = cel::Env::stdlib();
    env.add_extension(cel::extensions::strings)
        .map_err(|e| format!("the strings extension: {e:?}"))?;
    let env = Arc::new(env);
    let key = |n: &str| cel::objects::Key::String(Arc::new(n.to_owned()));
    let mut computed: HashMap<cel::objects::Key, cel::Value> = HashMap::new();
    let object = cel::to_value(object).map_err(|e| format!("object: {e:?}"))?;
    let old =
        cel::to_value(old.unwrap_or(&Value::Null)).map_err(|e| format!("oldObject: {e:?}"))?;
    for v in vap["spec"]["variables"].as_array().into_iter().flatten() {
        let (name, expr) = (
            v["name"].as_str().unwrap_or_default(),
            v["expression"].as_str().unwrap_or_default(),
        );
        let program = env.compile(expr).map_err(|e| format!("{name}: {e:?}"))?;
        let mut ctx = cel::Context::with_env(env.clone());
        ctx.add_variable_from_value("object", object.clone());
        ctx.add_variable_from_value("oldObject", old.clone());
        ctx.add_variable_from_value(
            "variables",
            cel::Value::Map(cel::objects::Map {
                map: Arc::new(computed.clone()),
            }),
        );
        let value = program
            .execute(&ctx)
            .map_err(|e| format!("{name}: {e:?}"))?;
        computed.insert(key(name), value);
    }
    let verdicts = computed
        .get(&key("verdicts"))
        .ok_or("the policy has no verdicts variable")?;
    strings(verdicts)
}

/// A list of lists of strings, as Rust.
fn strings(v: &cel::Value) -> Result<Vec<Vec<String>>, String> {
    let cel::Value::List(rows) = v else {
        return Err(format!("verdicts is not a list: {v:?}"));
    };
    rows.iter()
        .map(|row| match row {
            cel::Value::List(cells) => cells
                .iter()
                .map(|c| match c {
                    cel::Value::String(s) => Ok(s.to_string()),
                    other => Err(format!("a verdict field of an unexpected type: {other:?}")),
                })
                .collect(),
            other => Err(format!("a verdict of an unexpected type: {other:?}")),
        })
        .collect()
}
