//! Test support shared by the operator's unit tests and the e2e suite: the admission cases in
//! `operator/tests/fixtures/validation-cases.yaml`, so that client-side CEL and the real API
//! server are checked against exactly the same objects.

use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_json::Value;

/// Path of the admission-case fixture in the source tree.
pub fn validation_cases_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/validation-cases.yaml")
}

#[derive(Deserialize)]
struct CaseFile {
    base: Value,
    cases: Vec<RawCase>,
}

#[derive(Deserialize)]
struct RawCase {
    name: String,
    create: Option<Value>,
    update: Option<Value>,
    error: Option<String>,
}

/// One admission case, with the merge patch already applied.
#[derive(Debug, Clone)]
pub struct AdmissionCase {
    pub name: String,
    /// The object sent to the server (created, or the new state of an update).
    pub object: Value,
    /// For update cases: the object as first created.
    pub old: Option<Value>,
    /// A substring of the rejection message; `None` when the object must be accepted.
    pub error: Option<String>,
}

/// Loads every admission case.
pub fn admission_cases() -> anyhow::Result<Vec<AdmissionCase>> {
    let text = std::fs::read_to_string(validation_cases_path())?;
    let file: CaseFile = serde_yaml::from_str(&text)?;
    file.cases
        .into_iter()
        .map(|c| {
            let (patch, old) = match (c.create, c.update) {
                (Some(p), None) => (p, None),
                (None, Some(p)) => (p, Some(file.base.clone())),
                _ => anyhow::bail!("case {} must have exactly one of create and update", c.name),
            };
            let mut object = file.base.clone();
            merge_patch(&mut object, &patch);
            Ok(AdmissionCase { name: c.name, object, old, error: c.error })
        })
        .collect()
}

/// Applies a JSON merge patch (RFC 7386): objects merge key by key, `null` removes a key, and
/// everything else replaces the target.
pub fn merge_patch(target: &mut Value, patch: &Value) {
    let Value::Object(patch) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = Value::Object(Default::default());
    }
    let target = target.as_object_mut().expect("made an object above");
    for (key, value) in patch {
        if value.is_null() {
            target.remove(key);
        } else {
            merge_patch(target.entry(key.clone()).or_insert(Value::Null), value);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn merge_patch_follows_rfc_7386() {
        let mut doc = json!({"a": {"b": 1, "c": 2}, "l": [1, 2], "keep": true});
        merge_patch(&mut doc, &json!({"a": {"b": null, "d": 3}, "l": [9], "new": "x"}));
        assert_eq!(doc, json!({"a": {"c": 2, "d": 3}, "l": [9], "keep": true, "new": "x"}));
    }
}
