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

/// What discovery says about a v1.37.2 API server that serves every resource.k8s.io/v1 kind.
pub fn server_v1_37() -> crate::pool::prerequisites::ServerFacts {
    use crate::pool::prerequisites::{ExtendedResourceProbe, ServedApis};
    crate::pool::prerequisites::ServerFacts {
        git_version: "v1.37.2".into(),
        control_plane: Vec::new(),
        served: ServedApis {
            device_classes: true,
            resource_slices: true,
            resource_claims: true,
            device_taint_rules: true,
        },
        probe: ExtendedResourceProbe::NotRun,
    }
}

/// A Ready v1.37.2 node with containerd 2.1, labelled `pool: a100`, whose device plugin
/// advertises 8 `nvidia.com/gpu`; `extra` is merged in (RFC 7386).
pub fn gpu_node(name: &str, extra: &Value) -> crate::node::slim::SlimNode {
    let mut v = serde_json::json!({
        "metadata": {"name": name, "resourceVersion": "7", "labels": {"pool": "a100"}},
        "status": {
            "allocatable": {"nvidia.com/gpu": "8"}, "capacity": {"nvidia.com/gpu": "8"},
            "conditions": [{"type": "Ready", "status": "True"}],
            "nodeInfo": {"kubeletVersion": "v1.37.2", "containerRuntimeVersion": "containerd://2.1.4",
                "architecture": "amd64", "bootID": "b", "kernelVersion": "6.8", "kubeProxyVersion": "",
                "machineID": "m", "operatingSystem": "linux", "osImage": "x", "systemUUID": "s"}
        }
    });
    merge_patch(&mut v, extra);
    serde_json::from_value(v).expect("a valid Node")
}

/// A DaemonSet whose pod template keeps to `role`'s backend (the affinity Managed placement
/// adds).
pub fn placed_daemon_set(
    namespace: &str,
    name: &str,
    role: crate::pool::placement::Role,
) -> k8s_openapi::api::apps::v1::DaemonSet {
    let mut ds: k8s_openapi::api::apps::v1::DaemonSet = serde_json::from_value(serde_json::json!({
        "metadata": {"namespace": namespace, "name": name},
        "spec": {"selector": {}, "template": {"spec": {"containers": []}}}
    }))
    .expect("a valid DaemonSet");
    // Placed for either switch: off `dra` and `none` nodes.
    let terms = crate::pool::placement::merged_terms(&ds, role, true);
    if let Some(pod) = ds.spec.template.spec.as_mut() {
        pod.affinity = serde_json::from_value(serde_json::json!({"nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}}))
        .ok();
    }
    ds
}

/// A snapshot of `gpm`'s pool with only `nodes` in it, taken at `now` seconds: no DaemonSets,
/// DeviceClasses, slices, other migrations or reads.
pub fn snapshot(
    gpm: &crate::api::v1alpha1::GpuPoolMigration,
    nodes: Vec<crate::node::slim::SlimNode>,
    now: i64,
) -> crate::reconcile::observe::Snapshot<'_> {
    crate::reconcile::observe::Snapshot {
        gpm,
        now: k8s_openapi::jiff::Timestamp::from_second(now).expect("a valid time"),
        nodes: nodes.into_iter().map(std::sync::Arc::new).collect(),
        facts: Default::default(),
        driver_ds: None,
        plugin_ds: None,
        plugin_config: None,
        device_classes: None,
        slices: Default::default(),
        dra_counts: Default::default(),
        others: Vec::new(),
        consuming_pods: Default::default(),
        node_reads: Default::default(),
        read_errors: Default::default(),
        inventory: Vec::new(),
        canary_namespace: "switchyard-system".into(),
        departed: Vec::new(),
        pods: None,
        replace: None,
        targets: Vec::new(),
        returns: None,
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
