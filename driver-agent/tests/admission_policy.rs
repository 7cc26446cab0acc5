//! Evaluates config/agent/validating-admission-policy.yaml the way the API server does: match
//! conditions first, then the variables in order, then every validation. The CEL runs in kube's
//! client-side CEL engine with the Kubernetes extension functions. kube's `VapEvaluator` cannot
//! bind `request.userInfo.extra` or `variables`, which this policy needs, so the evaluation order
//! is driven here with the same engine.

use std::collections::HashMap;

use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use kube::core::cel::KubeCelExt;
use kube::core::cel::cel::{Context, Program, Value};
use serde::Deserialize;
use serde_json::json;

const POLICY: &str = include_str!("../../config/agent/validating-admission-policy.yaml");
const AGENT: &str = "system:serviceaccount:switchyard-system:switchyard-driver-agent";

fn load() -> (ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding) {
    let mut docs = serde_yaml::Deserializer::from_str(POLICY);
    let policy = ValidatingAdmissionPolicy::deserialize(docs.next().unwrap()).unwrap();
    let binding = ValidatingAdmissionPolicyBinding::deserialize(docs.next().unwrap()).unwrap();
    (policy, binding)
}

fn eval(ctx: &Context, expr: &str) -> Value {
    let program = Program::compile(expr).unwrap_or_else(|e| panic!("{expr} does not compile: {e}"));
    program.execute(ctx).unwrap_or_else(|e| panic!("{expr} failed: {e}"))
}

/// `Ok(true)` admitted after checking, `Ok(false)` not matched (policy does not apply),
/// `Err(message)` denied.
fn admit(
    op: &str,
    user: &str,
    token_node: Option<&str>,
    object: Option<&str>,
    old: Option<&str>,
) -> Result<bool, String> {
    let (policy, _) = load();
    let spec = policy.spec.unwrap();
    let slice = |node: Option<&str>| match node {
        Some(n) => {
            json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": format!("{n}-gpu-0")},
                          "spec": {"driver": "gpu.switchyard.dev", "nodeName": n, "pool": {"name": n, "generation": 1, "resourceSliceCount": 1}}})
        }
        None => serde_json::Value::Null,
    };
    let mut user_info = json!({"username": user, "groups": ["system:serviceaccounts"]});
    if let Some(n) = token_node {
        user_info["extra"] = json!({"authentication.kubernetes.io/node-name": [n], "authentication.kubernetes.io/pod-name": ["agent-x"]});
    }
    let mut ctx = Context::default();
    ctx.register_all();
    ctx.add_variable("request", json!({"operation": op, "userInfo": user_info})).unwrap();
    ctx.add_variable("object", slice(object)).unwrap();
    ctx.add_variable("oldObject", slice(old)).unwrap();

    for mc in spec.match_conditions.unwrap_or_default() {
        match eval(&ctx, &mc.expression) {
            Value::Bool(true) => {}
            Value::Bool(false) => return Ok(false),
            other => panic!("match condition {} returned {other:?}", mc.name),
        }
    }
    let mut vars: HashMap<String, Value> = HashMap::new();
    for v in spec.variables.unwrap_or_default() {
        let value = eval(&ctx, &v.expression);
        vars.insert(v.name, value);
        ctx.add_variable_from_value("variables", vars.clone());
    }
    for v in spec.validations.unwrap_or_default() {
        match eval(&ctx, &v.expression) {
            Value::Bool(true) => {}
            Value::Bool(false) => {
                let msg = match v.message_expression.as_deref().map(|m| eval(&ctx, m)) {
                    Some(Value::String(s)) => s.to_string(),
                    _ => v.message.unwrap_or_default(),
                };
                return Err(msg);
            }
            other => panic!("validation {} returned {other:?}", v.expression),
        }
    }
    Ok(true)
}

#[test]
fn policy_and_binding_fit_together() {
    let (policy, binding) = load();
    let spec = binding.spec;
    assert_eq!(spec.policy_name, policy.metadata.name.unwrap());
    assert_eq!(spec.validation_actions, ["Deny"]);
    let rules = policy.spec.unwrap().match_constraints.unwrap().resource_rules.unwrap();
    assert_eq!(rules[0].resources.as_deref().unwrap(), ["resourceslices"]);
    assert_eq!(rules[0].operations.as_deref().unwrap(), ["CREATE", "UPDATE", "DELETE"]);
}

#[test]
fn agent_may_only_touch_its_own_nodes_slices() {
    let a = Some("node-a");
    let b = Some("node-b");
    // (operation, user, node in token, object node, old object node, expected)
    #[allow(clippy::type_complexity)]
    let cases: Vec<(&str, &str, Option<&str>, Option<&str>, Option<&str>, Result<bool, &str>)> = vec![
        ("CREATE", AGENT, a, a, None, Ok(true)),
        ("CREATE", AGENT, a, b, None, Err("may only write ResourceSlices with spec.nodeName node-a")),
        ("UPDATE", AGENT, a, a, a, Ok(true)),
        ("UPDATE", AGENT, a, a, b, Err("may only change or delete")),
        ("UPDATE", AGENT, a, b, a, Err("may only write")),
        ("DELETE", AGENT, a, None, a, Ok(true)),
        ("DELETE", AGENT, a, None, b, Err("may only change or delete")),
        ("CREATE", AGENT, None, a, None, Err("node-bound ServiceAccount token")),
        // Anyone else is outside this policy.
        ("CREATE", "system:serviceaccount:kube-system:other", a, b, None, Ok(false)),
        ("DELETE", "admin", None, None, b, Ok(false)),
    ];
    for (op, user, token, obj, old, want) in cases {
        let got = admit(op, user, token, obj, old);
        match (&got, &want) {
            (Ok(g), Ok(w)) => assert_eq!(g, w, "{op} {user} token={token:?} obj={obj:?} old={old:?}"),
            (Err(msg), Err(needle)) => assert!(msg.contains(needle), "{op} obj={obj:?} old={old:?}: {msg}"),
            _ => panic!("{op} {user} token={token:?} obj={obj:?} old={old:?}: got {got:?}, want {want:?}"),
        }
    }
}
