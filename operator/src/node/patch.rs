//! What the operator writes on a node and beside it, built from the one action a node is due:
//! the JSON merge patch of its labels, annotations and cordon ([`node_patch`]), what a
//! migration's deletion leaves on it ([`release_patch`]), and the DeviceTaintRule that evicts DRA
//! claim holders when it rolls back ([`taint_rule`]). Pure.

use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1::{
    DeviceTaint, DeviceTaintRule, DeviceTaintRuleSpec, DeviceTaintSelector,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use k8s_openapi::jiff::Timestamp;
use kube::Resource;
use serde::Serialize;

use crate::api::v1alpha1::{CordonHolder, GpuPoolMigration, NodeState, PlacementMode};
use crate::node::record::{self, Backend, Failure, PoolNode};
use crate::node::state::Action;
use crate::well_known::*;

/// The migration as the owner of what it creates for a node (canary, DeviceTaintRule), so the
/// garbage collector removes what the operator did not. No `blockOwnerDeletion`: the migration's
/// deletion never waits on them.
pub(crate) fn owner_ref(gpm: &GpuPoolMigration) -> Option<OwnerReference> {
    gpm.controller_owner_ref(&()).map(|o| OwnerReference { block_owner_deletion: None, ..o })
}

/// The rollback's DeviceTaintRule for `node`'s devices of `driver`, with `effect`: `NoSchedule`
/// fences them while the eviction API drains their holders; `NoExecute` evicts what is left.
pub fn taint_rule(node: &str, driver: &str, migration: &str, effect: &str) -> DeviceTaintRule {
    DeviceTaintRule {
        metadata: ObjectMeta {
            name: Some(taint_rule_name(node)),
            labels: Some(BTreeMap::from([
                (LABEL_MANAGED_BY.to_string(), OPERATOR_FIELD_MANAGER.to_string()),
                (LABEL_MIGRATION.to_string(), migration.to_string()),
            ])),
            ..Default::default()
        },
        spec: DeviceTaintRuleSpec {
            device_selector: Some(DeviceTaintSelector {
                driver: Some(driver.to_string()),
                pool: Some(node.to_string()),
                device: None,
            }),
            taint: DeviceTaint {
                key: TAINT_KEY_ROLLBACK.to_string(),
                value: Some(migration.to_string()),
                effect: effect.to_string(),
                time_added: None,
            },
        },
        status: None,
    }
}

/// A Replace rollback's fence on target node `target`: a NoSchedule DeviceTaintRule on the
/// devices of `driver` in the pool named after the node, so that the pods evicted from it to come
/// back cannot be allocated a device there again. Labelled with the migration and the node.
pub fn fence_rule(target: &str, driver: &str, migration: &str) -> DeviceTaintRule {
    let mut rule = taint_rule(target, driver, migration, "NoSchedule");
    let mut name = format!("switchyard-fence-{migration}-{target}");
    name.truncate(253);
    rule.metadata.name = Some(name.trim_end_matches(['-', '.']).to_string());
    if let Some(labels) = rule.metadata.labels.as_mut() {
        labels.insert(LABEL_FENCED_NODE.to_string(), target.to_string());
    }
    rule
}

pub fn taint_rule_name(node: &str) -> String {
    let mut n = format!("switchyard-rollback-{node}");
    n.truncate(253);
    n.trim_end_matches(['-', '.']).to_string()
}

/// A JSON merge patch of a node: labels, annotations (`None` removes) and the cordon, sent as
/// one request so the state record and the change it describes land together.
#[derive(Serialize, Debug, Default, PartialEq)]
pub struct NodePatch {
    pub metadata: NodeMetaPatch,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub spec: Option<NodeSpecPatch>,
}

#[derive(Serialize, Debug, Default, PartialEq)]
pub struct NodeMetaPatch {
    /// The resourceVersion the decision was made on: the server refuses the patch (409) when the
    /// node changed since. A write decided on a stale view, by a stale leader among others, does
    /// not land; the next reconcile decides again on the fresh node.
    #[serde(rename = "resourceVersion", skip_serializing_if = "Option::is_none")]
    pub resource_version: Option<String>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, Option<String>>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, Option<String>>,
}

#[derive(Serialize, Debug, PartialEq)]
pub struct NodeSpecPatch {
    pub unschedulable: bool,
}

impl NodePatch {
    pub(crate) fn annotate(&mut self, k: &str, v: Option<String>) {
        self.metadata.annotations.insert(k.to_string(), v);
    }
    fn label(&mut self, k: &str, v: Option<String>) {
        self.metadata.labels.insert(k.to_string(), v);
    }
    fn state(&mut self, s: NodeState, now: Timestamp) {
        self.annotate(ANNOTATION_MIGRATION_STATE, Some(record::state_str(s)));
        self.annotate(ANNOTATION_STATE_SINCE, Some(now.to_string()));
    }
    fn cordon(&mut self, node: &PoolNode) {
        if !node.annotations.contains_key(ANNOTATION_INITIALLY_UNSCHEDULABLE) {
            self.annotate(ANNOTATION_INITIALLY_UNSCHEDULABLE, Some(node.unschedulable.to_string()));
        }
        self.spec = Some(NodeSpecPatch { unschedulable: true });
    }
    fn uncordon(&mut self, node: &PoolNode) {
        let admin_cordoned =
            node.annotations.get(ANNOTATION_INITIALLY_UNSCHEDULABLE).is_some_and(|v| v == "true");
        self.spec = Some(NodeSpecPatch { unschedulable: admin_cordoned });
        self.annotate(ANNOTATION_INITIALLY_UNSCHEDULABLE, None);
    }
    /// `placement: GpuOperator` takes the GPU Operator's device plugin off the node: the deploy
    /// label goes to `false`, and what it was is recorded once (a retried switch keeps the first
    /// record, so a rollback restores what the admin had, never our own `false`).
    fn gpu_operator_off(&mut self, node: &PoolNode) {
        if !node.annotations.contains_key(ANNOTATION_DEVICE_PLUGIN_DEPLOY_BEFORE) {
            let before = node.labels.get(LABEL_GPU_OPERATOR_DEVICE_PLUGIN);
            self.annotate(ANNOTATION_DEVICE_PLUGIN_DEPLOY_BEFORE, serde_json::to_string(&before).ok());
        }
        self.label(LABEL_GPU_OPERATOR_DEVICE_PLUGIN, Some(GPU_OPERATOR_DEPLOY_OFF.to_string()));
    }
    /// The deploy label as it was before the switch, wherever a switch recorded it (whatever the
    /// mode is now: a node switched under `GpuOperator` and rolled back under another mode still
    /// gets its device plugin back). Without a record, under `GpuOperator`, a `false` label goes,
    /// so the GPU Operator deploys its device plugin there again. `forget` drops the record.
    fn gpu_operator_restore(&mut self, node: &PoolNode, placement: PlacementMode, forget: bool) {
        let recorded = node.annotations.get(ANNOTATION_DEVICE_PLUGIN_DEPLOY_BEFORE);
        match recorded.map(serde_json::from_str::<Option<String>>) {
            Some(Ok(before)) => self.label(LABEL_GPU_OPERATOR_DEVICE_PLUGIN, before),
            // Unreadable (edited by hand): leave the label to the admin, as with no record.
            Some(Err(_)) => {}
            None if placement == PlacementMode::GpuOperator
                && node.labels.get(LABEL_GPU_OPERATOR_DEVICE_PLUGIN) == Some(GPU_OPERATOR_DEPLOY_OFF) =>
            {
                self.label(LABEL_GPU_OPERATOR_DEVICE_PLUGIN, None)
            }
            None => {}
        }
        if forget && recorded.is_some() {
            self.annotate(ANNOTATION_DEVICE_PLUGIN_DEPLOY_BEFORE, None);
        }
    }
}

/// The node patch an action makes, or `None` for actions that touch other objects. Pure.
pub fn node_patch(
    action: &Action,
    node: &PoolNode,
    migration: &str,
    placement: PlacementMode,
    now: Timestamp,
    gpus: &BTreeMap<String, u64>,
) -> Option<NodePatch> {
    let mut p = NodePatch::default();
    match action {
        Action::Nothing
        | Action::Wait { .. }
        | Action::Evict
        | Action::EvictGpuHolders
        | Action::CreateCanary
        | Action::DeleteCanary
        | Action::CreateTaintRule
        | Action::EscalateTaintRule
        | Action::DeletePastBudgets
        | Action::DeleteTaintRule
        | Action::CreateFences => return None,
        Action::RecordSince => p.annotate(ANNOTATION_STATE_SINCE, Some(now.to_string())),
        Action::Cordon => {
            p.cordon(node);
            p.label(LABEL_MIGRATION, Some(migration.to_string()));
            p.state(NodeState::Cordoned, now);
        }
        Action::CordonAndDrain => {
            p.cordon(node);
            p.label(LABEL_MIGRATION, Some(migration.to_string()));
            p.annotate(ANNOTATION_GPUS_BEFORE, serde_json::to_string(gpus).ok());
            p.state(NodeState::Draining, now);
        }
        Action::Recordon => p.spec = Some(NodeSpecPatch { unschedulable: true }),
        Action::StartDrain => {
            p.annotate(ANNOTATION_GPUS_BEFORE, serde_json::to_string(gpus).ok());
            p.state(NodeState::Draining, now);
        }
        Action::SwitchToDra | Action::StopDevicePlugin => {
            let backend = if *action == Action::SwitchToDra { BACKEND_DRA } else { BACKEND_NONE };
            p.label(LABEL_GPU_BACKEND, Some(backend.to_string()));
            if placement == PlacementMode::GpuOperator {
                p.gpu_operator_off(node);
            }
            p.state(NodeState::Switching, now);
        }
        // Same state, same clock: the switch's timeout covers both halves.
        Action::StartDriver => p.label(LABEL_GPU_BACKEND, Some(BACKEND_DRA.to_string())),
        Action::StartVerify => p.state(NodeState::Verifying, now),
        Action::Complete => {
            p.uncordon(node);
            p.annotate(ANNOTATION_FAILURE, None);
            p.state(NodeState::Migrated, now);
        }
        Action::Fail { reason, message } => {
            let f = Failure { state: node.state(), reason: reason.to_string(), message: message.clone() };
            p.annotate(ANNOTATION_FAILURE, serde_json::to_string(&f).ok());
            p.state(NodeState::Failed, now);
            // A sequential switch that fails before the driver started goes back to the device
            // plugin: no node rests with neither backend.
            if node.backend() == Backend::None {
                p.label(LABEL_GPU_BACKEND, Some(BACKEND_DEVICE_PLUGIN.to_string()));
                p.gpu_operator_restore(node, placement, false);
            }
        }
        Action::StartRollback => {
            // A rollback may start on a node this migration never moved (an earlier migration,
            // or a hand-labelled node): it takes ownership here, so the finalizer finds it and no
            // other migration moves it meanwhile.
            p.cordon(node);
            p.label(LABEL_MIGRATION, Some(migration.to_string()));
            p.state(NodeState::RollingBack, now);
        }
        Action::StartReturn => {
            // Schedulable again (unless an admin had cordoned it), so the pods can come back.
            p.uncordon(node);
            p.label(LABEL_MIGRATION, Some(migration.to_string()));
            p.state(NodeState::RollingBack, now);
        }
        Action::SwitchToDevicePlugin => {
            p.label(LABEL_GPU_BACKEND, Some(BACKEND_DEVICE_PLUGIN.to_string()));
            p.gpu_operator_restore(node, placement, false);
        }
        Action::Retire => {
            p.label(LABEL_REPLACED, Some(migration.to_string()));
            p.annotate(ANNOTATION_FAILURE, None);
            p.state(NodeState::Replaced, now);
        }
        Action::FinishRollback => {
            p.uncordon(node);
            if node.labels.contains_key(LABEL_REPLACED) {
                p.label(LABEL_REPLACED, None);
            }
            if node.annotations.contains_key(ANNOTATION_MOVED) {
                p.annotate(ANNOTATION_MOVED, None);
            }
            p.label(LABEL_GPU_BACKEND, Some(BACKEND_DEVICE_PLUGIN.to_string()));
            p.gpu_operator_restore(node, placement, true);
            p.annotate(ANNOTATION_GPUS_BEFORE, None);
            p.state(NodeState::RolledBack, now);
        }
    }
    Some(p)
}

/// What a migration's deletion leaves on a node that is not mid-switch. Pure.
/// - Never switched (Pending, Cordoned, Draining, or Failed before the label flip while still on
///   the device plugin): back in service, uncordoned unless an admin had cordoned it, every
///   record removed. The device plugin serves it as before.
/// - Moved (Migrated, RolledBack): the records go; the backend label stays, and says it all.
/// - Replaced: the records go; the node stays cordoned with its `switchyard.dev/replaced` label,
///   empty of GPU pods, for removal.
/// - Failed after the flip: the migration's ownership goes, the rest stays: cordoned, state
///   `Failed` and `switchyard.dev/failure`, so a person reads what happened and a later migration
///   reads a failed node (it waits for a person), never a Migrated one.
pub fn release_patch(pn: &PoolNode) -> NodePatch {
    let mut patch = NodePatch::default();
    patch.label(LABEL_MIGRATION, None);
    let failed_after_flip = pn.state() == NodeState::Failed
        && (pn.backend() == Backend::Dra
            || pn.failure().is_none_or(|f| !matches!(f.state, NodeState::Cordoned | NodeState::Draining)));
    if failed_after_flip {
        return patch;
    }
    if matches!(pn.state(), NodeState::Cordoned | NodeState::Draining | NodeState::Failed) {
        patch.uncordon(pn);
    }
    for a in [
        ANNOTATION_MIGRATION_STATE,
        ANNOTATION_STATE_SINCE,
        ANNOTATION_GPUS_BEFORE,
        ANNOTATION_INITIALLY_UNSCHEDULABLE,
        ANNOTATION_FAILURE,
        ANNOTATION_MOVED,
    ] {
        patch.annotate(a, None);
    }
    patch
}

/// Who holds `node`'s cordon once `patch` (if any) has landed; `None` while it is schedulable.
/// Switchyard records, when it cordons a node, whether the node was cordoned already
/// (`switchyard.dev/initially-unschedulable`): `false` is its own cordon, which it lifts once the
/// node has moved. A cordon without that record, or with `true`, is an admin's and stays.
pub fn cordoned_by(node: &PoolNode, patch: Option<&NodePatch>) -> Option<CordonHolder> {
    let unschedulable = patch.and_then(|p| p.spec.as_ref()).map_or(node.unschedulable, |s| s.unschedulable);
    if !unschedulable {
        return None;
    }
    let recorded = match patch.and_then(|p| p.metadata.annotations.get(ANNOTATION_INITIALLY_UNSCHEDULABLE)) {
        Some(written) => written.as_deref(),
        None => node.annotations.get(ANNOTATION_INITIALLY_UNSCHEDULABLE).map(AsRef::as_ref),
    };
    Some(if recorded == Some("false") { CordonHolder::Switchyard } else { CordonHolder::Admin })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::state;
    use serde_json::{Value, json};

    fn pn(annotations: &[(&str, &str)], unschedulable: bool) -> PoolNode {
        PoolNode {
            name: "gpu-1".into(),
            annotations: annotations.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
            unschedulable,
            ready: true,
            ..Default::default()
        }
    }

    fn patch_json(a: &Action, node: &PoolNode) -> serde_json::Value {
        patch_json_in(PlacementMode::Managed, a, node)
    }

    fn patch_json_in(placement: PlacementMode, a: &Action, node: &PoolNode) -> serde_json::Value {
        let alloc = BTreeMap::from([("nvidia.com/gpu".to_string(), 8u64)]);
        let now = Timestamp::from_second(1_000).unwrap();
        serde_json::to_value(node_patch(a, node, "pool-a", placement, now, &alloc)).unwrap()
    }

    const NOW: &str = "1970-01-01T00:16:40Z";

    #[test]
    fn node_patch_table() {
        let fresh = pn(&[], false);
        let admin_cordoned = pn(&[(ANNOTATION_INITIALLY_UNSCHEDULABLE, "true")], true);
        let ours = pn(&[(ANNOTATION_INITIALLY_UNSCHEDULABLE, "false")], true);
        let cases = vec![
            (
                "cordon records the prior cordon state and takes ownership",
                Action::Cordon,
                fresh.clone(),
                json!({"metadata": {
                    "labels": {"switchyard.dev/migration": "pool-a"},
                    "annotations": {"switchyard.dev/initially-unschedulable": "false", "switchyard.dev/migration-state": "Cordoned", "switchyard.dev/state-since": NOW}},
                    "spec": {"unschedulable": true}}),
            ),
            (
                "re-cordon keeps the first record",
                Action::Cordon,
                admin_cordoned.clone(),
                json!({"metadata": {
                    "labels": {"switchyard.dev/migration": "pool-a"},
                    "annotations": {"switchyard.dev/migration-state": "Cordoned", "switchyard.dev/state-since": NOW}},
                    "spec": {"unschedulable": true}}),
            ),
            (
                "cordon and drain in one write: ownership, the prior cordon and the GPU count",
                Action::CordonAndDrain,
                fresh.clone(),
                json!({"metadata": {
                    "labels": {"switchyard.dev/migration": "pool-a"},
                    "annotations": {"switchyard.dev/initially-unschedulable": "false", "switchyard.dev/gpus-before": "{\"nvidia.com/gpu\":8}", "switchyard.dev/migration-state": "Draining", "switchyard.dev/state-since": NOW}},
                    "spec": {"unschedulable": true}}),
            ),
            (
                "drain records the GPU count",
                Action::StartDrain,
                ours.clone(),
                json!({"metadata": {"annotations": {"switchyard.dev/gpus-before": "{\"nvidia.com/gpu\":8}", "switchyard.dev/migration-state": "Draining", "switchyard.dev/state-since": NOW}}}),
            ),
            (
                "switch flips the label with the state",
                Action::SwitchToDra,
                ours.clone(),
                json!({"metadata": {"labels": {"switchyard.dev/gpu-backend": "dra"}, "annotations": {"switchyard.dev/migration-state": "Switching", "switchyard.dev/state-since": NOW}}}),
            ),
            (
                "complete uncordons a node we cordoned",
                Action::Complete,
                ours.clone(),
                json!({"metadata": {"annotations": {"switchyard.dev/failure": null, "switchyard.dev/initially-unschedulable": null, "switchyard.dev/migration-state": "Migrated", "switchyard.dev/state-since": NOW}}, "spec": {"unschedulable": false}}),
            ),
            (
                "complete leaves an admin's cordon",
                Action::Complete,
                admin_cordoned.clone(),
                json!({"metadata": {"annotations": {"switchyard.dev/failure": null, "switchyard.dev/initially-unschedulable": null, "switchyard.dev/migration-state": "Migrated", "switchyard.dev/state-since": NOW}}, "spec": {"unschedulable": true}}),
            ),
            (
                "retire leaves the node cordoned and marks it for removal",
                Action::Retire,
                ours.clone(),
                json!({"metadata": {"labels": {"switchyard.dev/replaced": "pool-a"}, "annotations": {"switchyard.dev/failure": null, "switchyard.dev/migration-state": "Replaced", "switchyard.dev/state-since": NOW}}}),
            ),
            (
                "rolling a replaced node back uncordons it and takes the mark off",
                Action::FinishRollback,
                PoolNode {
                    labels: [("switchyard.dev/replaced", "pool-a")]
                        .into_iter()
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .collect(),
                    ..ours.clone()
                },
                json!({"metadata": {"labels": {"switchyard.dev/gpu-backend": "device-plugin", "switchyard.dev/replaced": null},
                    "annotations": {"switchyard.dev/gpus-before": null, "switchyard.dev/initially-unschedulable": null, "switchyard.dev/migration-state": "RolledBack", "switchyard.dev/state-since": NOW}},
                    "spec": {"unschedulable": false}}),
            ),
            (
                "a replaced node returning: schedulable again, the record of what left it kept",
                Action::StartReturn,
                pn(
                    &[(ANNOTATION_INITIALLY_UNSCHEDULABLE, "false"), (ANNOTATION_MOVED, r#"{"rs-1":2}"#)],
                    true,
                ),
                json!({"metadata": {"labels": {"switchyard.dev/migration": "pool-a"},
                    "annotations": {"switchyard.dev/initially-unschedulable": null, "switchyard.dev/migration-state": "RollingBack", "switchyard.dev/state-since": NOW}},
                    "spec": {"unschedulable": false}}),
            ),
            (
                "a returning node an admin had cordoned keeps the cordon",
                Action::StartReturn,
                admin_cordoned.clone(),
                json!({"metadata": {"labels": {"switchyard.dev/migration": "pool-a"},
                    "annotations": {"switchyard.dev/initially-unschedulable": null, "switchyard.dev/migration-state": "RollingBack", "switchyard.dev/state-since": NOW}},
                    "spec": {"unschedulable": true}}),
            ),
            (
                "a returned node loses the record of what had left it",
                Action::FinishRollback,
                pn(
                    &[(ANNOTATION_INITIALLY_UNSCHEDULABLE, "false"), (ANNOTATION_MOVED, r#"{"rs-1":2}"#)],
                    true,
                ),
                json!({"metadata": {"labels": {"switchyard.dev/gpu-backend": "device-plugin"},
                    "annotations": {"switchyard.dev/gpus-before": null, "switchyard.dev/initially-unschedulable": null, "switchyard.dev/migration-state": "RolledBack", "switchyard.dev/moved": null, "switchyard.dev/state-since": NOW}},
                    "spec": {"unschedulable": false}}),
            ),
            (
                "a rollback takes ownership too, on a node another migration moved",
                Action::StartRollback,
                fresh.clone(),
                json!({"metadata": {
                    "labels": {"switchyard.dev/migration": "pool-a"},
                    "annotations": {"switchyard.dev/initially-unschedulable": "false", "switchyard.dev/migration-state": "RollingBack", "switchyard.dev/state-since": NOW}},
                    "spec": {"unschedulable": true}}),
            ),
            (
                "back to the device plugin",
                Action::SwitchToDevicePlugin,
                ours.clone(),
                json!({"metadata": {"labels": {"switchyard.dev/gpu-backend": "device-plugin"}}}),
            ),
        ];
        for (name, action, node, want) in cases {
            assert_eq!(patch_json(&action, &node), want, "{name}");
        }
        for a in [
            Action::Nothing,
            Action::Evict,
            Action::CreateTaintRule,
            Action::DeleteTaintRule,
            Action::CreateCanary,
        ] {
            assert!(
                node_patch(&a, &ours, "pool-a", PlacementMode::Managed, Timestamp::now(), &BTreeMap::new())
                    .is_none(),
                "{a:?}"
            );
        }
    }

    #[test]
    fn gpu_operator_placement_turns_the_deploy_label_off_and_restores_it_exactly() {
        const L: &str = LABEL_GPU_OPERATOR_DEVICE_PLUGIN;
        const A: &str = ANNOTATION_DEVICE_PLUGIN_DEPLOY_BEFORE;
        let with = |labels: &[(&str, &str)], annotations: &[(&str, &str)]| PoolNode {
            labels: labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
            ..pn(&[annotations, &[(ANNOTATION_INITIALLY_UNSCHEDULABLE, "false")]].concat(), true)
        };
        let (gpu, managed) = (PlacementMode::GpuOperator, PlacementMode::Managed);
        let set = |v: &str| Some(json!(v));
        let removed = Some(Value::Null);
        // (name, mode, action, node, the label in the patch, the record in the patch); None: not
        // in the patch, Some(null): removed.
        let cases = vec![
            (
                "the GPU Operator's true is recorded",
                gpu,
                Action::SwitchToDra,
                with(&[(L, "true")], &[]),
                set("false"),
                set("\"true\""),
            ),
            (
                "an absent label is recorded as null",
                gpu,
                Action::SwitchToDra,
                with(&[], &[]),
                set("false"),
                set("null"),
            ),
            (
                "a retried switch keeps the first record",
                gpu,
                Action::SwitchToDra,
                with(&[(L, "false")], &[(A, "\"true\"")]),
                set("false"),
                None,
            ),
            (
                "Managed leaves the label alone",
                managed,
                Action::SwitchToDra,
                with(&[(L, "true")], &[]),
                None,
                None,
            ),
            (
                "back to the device plugin restores the value, keeps the record",
                gpu,
                Action::SwitchToDevicePlugin,
                with(&[(L, "false")], &[(A, "\"true\"")]),
                set("true"),
                None,
            ),
            (
                "an absent label is removed again",
                gpu,
                Action::SwitchToDevicePlugin,
                with(&[(L, "false")], &[(A, "null")]),
                removed.clone(),
                None,
            ),
            (
                "the finished rollback drops the record",
                gpu,
                Action::FinishRollback,
                with(&[(L, "true")], &[(A, "\"true\"")]),
                set("true"),
                removed.clone(),
            ),
            (
                "a record is restored under any mode",
                managed,
                Action::SwitchToDevicePlugin,
                with(&[(L, "false")], &[(A, "\"an-admin-value\"")]),
                set("an-admin-value"),
                None,
            ),
            (
                "no record under GpuOperator: false goes, the GPU Operator deploys again",
                gpu,
                Action::SwitchToDevicePlugin,
                with(&[(L, "false")], &[]),
                removed.clone(),
                None,
            ),
            (
                "no record under Managed: the label is the admin's",
                managed,
                Action::SwitchToDevicePlugin,
                with(&[(L, "false")], &[]),
                None,
                None,
            ),
            (
                "a record edited into nonsense is left to the admin",
                gpu,
                Action::FinishRollback,
                with(&[(L, "false")], &[(A, "tru")]),
                None,
                removed.clone(),
            ),
        ];
        for (name, mode, action, node, label, record) in cases {
            let v = patch_json_in(mode, &action, &node);
            let get = |m: &str, k: &str| v["metadata"][m].as_object().and_then(|o| o.get(k)).cloned();
            assert_eq!(get("labels", L), label, "{name}: label");
            assert_eq!(get("annotations", A), record, "{name}: record");
        }
    }

    #[test]
    fn a_sequential_switch_labels_none_then_dra_on_one_clock_and_a_failure_in_none_goes_back() {
        const L: &str = LABEL_GPU_OPERATOR_DEVICE_PLUGIN;
        let ours = pn(&[(ANNOTATION_INITIALLY_UNSCHEDULABLE, "false")], true);
        assert_eq!(
            patch_json(&Action::StopDevicePlugin, &ours),
            json!({"metadata": {"labels": {"switchyard.dev/gpu-backend": "none"}, "annotations": {"switchyard.dev/migration-state": "Switching", "switchyard.dev/state-since": NOW}}})
        );
        // Under GpuOperator the deploy label goes off with the first label, not the second.
        let v = patch_json_in(PlacementMode::GpuOperator, &Action::StopDevicePlugin, &ours);
        assert_eq!(v["metadata"]["labels"][L], "false", "{v}");
        let mut in_none = pn(
            &[
                (ANNOTATION_MIGRATION_STATE, "Switching"),
                (ANNOTATION_DEVICE_PLUGIN_DEPLOY_BEFORE, "\"true\""),
            ],
            true,
        );
        in_none.labels.insert(LABEL_GPU_BACKEND.into(), BACKEND_NONE.into());
        // The driver starts without a new state or clock.
        assert_eq!(
            patch_json_in(PlacementMode::GpuOperator, &Action::StartDriver, &in_none),
            json!({"metadata": {"labels": {"switchyard.dev/gpu-backend": "dra"}}})
        );
        // A switch that fails before the driver started returns the node to the device plugin
        // (and the GPU Operator's label to what it was), keeping the failure and the cordon.
        let fail = Action::Fail { reason: state::FailReason::SwitchTimeout, message: "plugin stayed".into() };
        let v = patch_json_in(PlacementMode::GpuOperator, &fail, &in_none);
        assert_eq!(v["metadata"]["labels"]["switchyard.dev/gpu-backend"], "device-plugin", "{v}");
        assert_eq!(v["metadata"]["labels"][L], "true", "{v}");
        assert_eq!(v["metadata"]["annotations"][ANNOTATION_MIGRATION_STATE], "Failed", "{v}");
        assert!(v.get("spec").is_none(), "the cordon stays: {v}");
        // After the driver started, a failure keeps the label: the rollback takes it back safely.
        let mut in_dra = in_none.clone();
        in_dra.labels.insert(LABEL_GPU_BACKEND.into(), BACKEND_DRA.into());
        let v = patch_json_in(PlacementMode::GpuOperator, &fail, &in_dra);
        assert!(v["metadata"]["labels"].get("switchyard.dev/gpu-backend").is_none(), "{v}");
    }

    #[test]
    fn failure_is_recorded_with_the_state_it_happened_in() {
        let node = pn(&[(ANNOTATION_MIGRATION_STATE, "Draining")], true);
        let v = patch_json(
            &Action::Fail { reason: state::FailReason::DrainTimeout, message: "2 pods left".into() },
            &node,
        );
        let f: Failure =
            serde_json::from_str(v["metadata"]["annotations"][ANNOTATION_FAILURE].as_str().unwrap()).unwrap();
        assert_eq!(
            f,
            Failure {
                state: NodeState::Draining,
                reason: "DrainTimeout".into(),
                message: "2 pods left".into()
            }
        );
        assert_eq!(v["metadata"]["annotations"][ANNOTATION_MIGRATION_STATE], "Failed");
    }

    #[test]
    fn taint_rule_selects_the_nodes_pool_of_our_driver() {
        let v =
            serde_json::to_value(taint_rule("gpu-1", "gpu.switchyard.dev", "pool-a", "NoExecute")).unwrap();
        assert_eq!(v["apiVersion"], "resource.k8s.io/v1");
        assert_eq!(v["kind"], "DeviceTaintRule");
        assert_eq!(v["metadata"]["name"], "switchyard-rollback-gpu-1");
        assert_eq!(v["spec"]["deviceSelector"], json!({"driver": "gpu.switchyard.dev", "pool": "gpu-1"}));
        assert_eq!(v["spec"]["taint"]["effect"], "NoExecute");
        assert_eq!(v["spec"]["taint"]["key"], TAINT_KEY_ROLLBACK);
    }

    #[test]
    fn release_leaves_each_node_readable() {
        let failure = |state: &str| format!(r#"{{"state":"{state}","reason":"R","message":"m"}}"#);
        let drain_failed = failure("Draining");
        let switch_failed = failure("Switching");
        let all_records = json!({"switchyard.dev/failure": null, "switchyard.dev/gpus-before": null,
            "switchyard.dev/initially-unschedulable": null, "switchyard.dev/migration-state": null,
            "switchyard.dev/moved": null, "switchyard.dev/state-since": null});
        let cases = vec![
            (
                "failed in the drain, still on the device plugin: back in service",
                pn(
                    &[
                        (ANNOTATION_MIGRATION_STATE, "Failed"),
                        (ANNOTATION_FAILURE, drain_failed.as_str()),
                        (ANNOTATION_INITIALLY_UNSCHEDULABLE, "false"),
                    ],
                    true,
                ),
                json!({"metadata": {"labels": {"switchyard.dev/migration": null}, "annotations": all_records},
                       "spec": {"unschedulable": false}}),
            ),
            (
                "failed after the flip: stays cordoned and Failed, only ownership goes",
                pn(
                    &[(ANNOTATION_MIGRATION_STATE, "Failed"), (ANNOTATION_FAILURE, switch_failed.as_str())],
                    true,
                ),
                json!({"metadata": {"labels": {"switchyard.dev/migration": null}}}),
            ),
            (
                "draining, an admin's cordon: the cordon stays",
                pn(
                    &[(ANNOTATION_MIGRATION_STATE, "Draining"), (ANNOTATION_INITIALLY_UNSCHEDULABLE, "true")],
                    true,
                ),
                json!({"metadata": {"labels": {"switchyard.dev/migration": null}, "annotations": all_records},
                       "spec": {"unschedulable": true}}),
            ),
            (
                "migrated: records go, the cordon is not touched",
                pn(&[(ANNOTATION_MIGRATION_STATE, "Migrated")], false),
                json!({"metadata": {"labels": {"switchyard.dev/migration": null}, "annotations": all_records}}),
            ),
        ];
        for (name, node, want) in cases {
            assert_eq!(serde_json::to_value(release_patch(&node)).unwrap(), want, "{name}");
        }
    }

    /// Who holds the cordon, before and after the patches that cordon and uncordon: an admin's
    /// cordon, seen when the node starts or annotated later, stays the admin's.
    #[test]
    fn cordoned_by_follows_the_record_of_the_cordon_before() {
        use CordonHolder::{Admin, Switchyard};
        let fresh = pn(&[], false);
        let admin_before = pn(&[], true);
        let ours = pn(&[(ANNOTATION_INITIALLY_UNSCHEDULABLE, "false")], true);
        let admin_annotated = pn(&[(ANNOTATION_INITIALLY_UNSCHEDULABLE, "true")], true);
        let alloc = BTreeMap::from([("nvidia.com/gpu".to_string(), 8u64)]);
        let now = Timestamp::from_second(1_000).unwrap();
        let after = |a: &Action, n: &PoolNode| {
            cordoned_by(n, node_patch(a, n, "pool-a", PlacementMode::Managed, now, &alloc).as_ref())
        };
        assert_eq!(cordoned_by(&fresh, None), None);
        assert_eq!(after(&Action::Cordon, &fresh), Some(Switchyard));
        assert_eq!(after(&Action::Cordon, &admin_before), Some(Admin));
        assert_eq!(cordoned_by(&ours, None), Some(Switchyard));
        assert_eq!(cordoned_by(&admin_annotated, None), Some(Admin));
        // A cordon no record explains (a node at rest an admin cordoned) is the admin's.
        assert_eq!(cordoned_by(&admin_before, None), Some(Admin));
        let ours_draining = pn(
            &[(ANNOTATION_INITIALLY_UNSCHEDULABLE, "false"), (ANNOTATION_MIGRATION_STATE, "Verifying")],
            true,
        );
        assert_eq!(after(&Action::Complete, &ours_draining), None, "the node is uncordoned once it moved");
        let admin_verifying = pn(
            &[(ANNOTATION_INITIALLY_UNSCHEDULABLE, "true"), (ANNOTATION_MIGRATION_STATE, "Verifying")],
            true,
        );
        assert_eq!(after(&Action::Complete, &admin_verifying), Some(Admin), "the admin's cordon stays");
    }
}
