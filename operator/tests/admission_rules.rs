//! Every CEL rule of the generated GpuPoolMigration CRD, checked client-side with kube's CEL
//! validator against the committed YAML in `crds/` (the artefact users apply), using the same
//! cases the e2e suite sends to a real API server.

use std::collections::BTreeSet;

use kube::core::cel::Validator;
use serde_json::Value;
use switchyard_operator::testing::admission_cases;

fn committed_schema() -> Value {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../crds/switchyard.dev_gpupoolmigrations.yaml");
    let crd: Value = serde_yaml::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"].clone()
}

/// Every (rule, message) pair in the schema, wherever it is nested.
fn all_rules(schema: &Value, out: &mut BTreeSet<(String, String)>) {
    match schema {
        Value::Object(map) => {
            if let Some(Value::Array(rules)) = map.get("x-kubernetes-validations") {
                for r in rules {
                    out.insert((
                        r["rule"].as_str().unwrap().to_owned(),
                        r["message"].as_str().unwrap_or_default().to_owned(),
                    ));
                }
            }
            map.values().for_each(|v| all_rules(v, out));
        }
        Value::Array(items) => items.iter().for_each(|v| all_rules(v, out)),
        _ => {}
    }
}

#[test]
fn each_case_is_accepted_or_rejected_with_a_message_naming_the_field() {
    let schema = committed_schema();
    let validator = Validator::new();
    let mut failures = Vec::new();
    for case in admission_cases().unwrap() {
        let result = validator.validate(&schema, &case.object, case.old.as_ref());
        match (&case.error, result) {
            (None, Ok(())) => {}
            (None, Err(errs)) => failures.push(format!("{}: expected accept, got {errs:?}", case.name)),
            (Some(want), Ok(())) => failures.push(format!("{}: expected rejection with {want:?}", case.name)),
            (Some(want), Err(errs)) => {
                if !errs.iter().any(|e| e.message.contains(want.as_str())) {
                    failures.push(format!("{}: no error contains {want:?}: {errs:?}", case.name));
                }
            }
        }
    }
    assert!(failures.is_empty(), "admission cases failed:\n{}", failures.join("\n"));
}

#[test]
fn every_rule_in_the_crd_has_a_rejecting_case() {
    let mut rules = BTreeSet::new();
    all_rules(&committed_schema(), &mut rules);
    assert!(rules.len() >= 15, "expected the CRD to carry its CEL rules, found {}", rules.len());
    let cases = admission_cases().unwrap();
    let untested: Vec<_> = rules
        .iter()
        .filter(|(_, message)| {
            !cases.iter().any(|c| c.error.as_deref().is_some_and(|want| message.starts_with(want)))
        })
        .collect();
    assert!(untested.is_empty(), "CEL rules without a rejecting case: {untested:#?}");
}

#[test]
fn every_rule_message_names_a_field() {
    let mut rules = BTreeSet::new();
    all_rules(&committed_schema(), &mut rules);
    for (rule, message) in rules {
        let names_field = message.starts_with("spec.") || message.starts_with("daemonSet.");
        assert!(names_field, "rule {rule:?} has message {message:?}, which names no field");
    }
}
