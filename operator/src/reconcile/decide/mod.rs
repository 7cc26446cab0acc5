//! Decide: pure. From one [`Snapshot`] it says everything a reconcile does: the DeviceClasses
//! and DaemonSet placement to apply, whether the gate is open and what holds the pool
//! ([`gate::judge`], the same judgement `switchyard plan` shows), each moving node's one action
//! with the node patch and events it makes (`step`), the status, the migration's events and the
//! metrics (`report`). `execute` carries it out; nothing here reads the API.

mod report;
mod step;

pub use report::{inventory_message, phase, queued_message};
pub(crate) use step::gpus_before;
pub use step::{NodeStep, NodeView, POD_GONE_SLACK, Turn, node_step, parse_since, recheck_after};

use std::sync::Arc;

use crate::node::slim::SlimNode;
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceSlice};
use kube::ResourceExt;
use kube::runtime::events::EventType;

use super::observe::Snapshot;
use crate::api::v1alpha1::{GpuPoolMigrationStatus, NodeState};
use crate::cache::DeviceCounts;
use crate::error::{Error, Result};
use crate::node::state::{Action, Hold, WaitReason};
use crate::pool::gate::{self, PlacementPatch};
use crate::report::gpus::GpusByBackend;

/// Status lists are capped by the API schema.
pub const STATUS_LIST_MAX: usize = 64;

/// What one reconcile does.
#[derive(Debug)]
pub struct Decision {
    /// DeviceClasses to apply: missing, or not as the migration wants them.
    pub class_applies: Vec<DeviceClass>,
    /// DaemonSets to give their backend node affinity (`spec.placement: Managed`).
    pub placement_patches: Vec<PlacementPatch>,
    /// The gates: prerequisites, DeviceClasses, placement and no overlap.
    pub gate_open: bool,
    /// What holds the moving nodes at their next safe point, if anything.
    pub hold: Option<Hold>,
    /// Each moving node's step, in the order they run: nodes in flight, then the nodes that start.
    pub steps: Vec<NodeStep>,
    /// The status to write; `execute` fills `in_progress` from the steps' outcomes.
    pub status: GpuPoolMigrationStatus,
    /// Events about the migration, published once the status is written.
    pub events: Vec<MigrationEvent>,
    pub metrics: PoolMetrics,
    /// Nodes in flight or starting: the requeue is short while there are any.
    pub moving: usize,
    /// The last check of the pods on migrated nodes changed, or saw a GPU pod there not started
    /// yet: check again soon.
    pub pods_settling: bool,
    /// Replace: the rollback's fences (DeviceTaintRule names) that no target node needs any more.
    pub delete_fences: Vec<String>,
}

/// An event on the migration, about a node where `node` names one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigrationEvent {
    pub type_: EventType,
    pub reason: &'static str,
    pub action: &'static str,
    pub note: String,
    pub node: Option<String>,
}

/// An event on the node (the migration its related object), published once the node's writes
/// have landed; also on the migration when [`NodeEvent::on_migration`] says so.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeEvent {
    pub type_: EventType,
    pub reason: &'static str,
    pub note: String,
}

impl NodeEvent {
    /// Whether the migration's own events show it too: every Warning (what needs a person). The
    /// steps are told on the node and in the status, and arrivals once per reconcile for all the
    /// nodes that arrived (`execute::arrivals`), so a pool of thousands does not cost an event
    /// per node on the migration.
    pub fn on_migration(&self) -> bool {
        self.type_ == EventType::Warning
    }
}

/// The pool gauges.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct PoolMetrics {
    pub per_state: Vec<(NodeState, i64)>,
    pub gpus: GpusByBackend,
    pub overlap_nodes: i64,
}

/// Decides the whole reconcile: the gate, then each moving node's step, then what the
/// migration reports.
pub fn pool(s: &Snapshot<'_>) -> Result<Decision> {
    let name = s.gpm.name_any();
    let mut gate = judge(s, &name)?;
    if let Some(message) = report::pod_overlap(s) {
        gate.hold_for_pod_overlap(message);
    }
    let hold = gate.hold();
    let needs_human = gate.needs_human();
    let mut p = std::mem::take(&mut gate.plan);
    // A closed gate starts no node: those that would start wait in the queue.
    if !gate.open {
        let held: Vec<String> = std::mem::take(&mut p.to_start);
        p.queued.extend(held);
    }
    let steps = step::steps(s, &name, &p, hold);
    let short_of_room = steps.iter().find_map(|st| match &st.action {
        Action::Wait { reason: WaitReason::TargetCapacityShort, message } => {
            Some(format!("node {}: {message}", st.node))
        }
        _ => None,
    });
    let report = report::report(s, &name, &gate, needs_human, &p, short_of_room);
    Ok(Decision {
        class_applies: gate.class_applies,
        placement_patches: gate.placement_patches,
        gate_open: gate.open,
        hold,
        steps,
        status: report.status,
        events: report.events,
        metrics: report.metrics,
        moving: p.in_flight.len() + p.to_start.len(),
        pods_settling: s.pods.as_ref().is_some_and(|(_, settling)| *settling),
        delete_fences: s
            .returns
            .iter()
            .flat_map(|r| r.fences.iter().filter(|(target, _)| !r.plan.fence.contains(*target)))
            .map(|(_, rule)| rule.clone())
            .collect(),
    })
}

/// The gate, judged on what the snapshot holds.
fn judge(s: &Snapshot<'_>, name: &str) -> Result<gate::Gate> {
    let consuming = |n: &str| s.consuming_pods.get(n).copied();
    let schedulable = |n: &SlimNode| node_counts(s, n).schedulable;
    gate::judge(&gate::Inputs {
        name,
        uid: s.gpm.metadata.uid.as_deref().unwrap_or_default(),
        spec: &s.gpm.spec,
        facts: &s.facts,
        nodes: &s.nodes,
        target_nodes: &s.targets,
        device_classes: s.device_classes.as_deref(),
        driver_ds: s.driver_ds.as_ref(),
        plugin_ds: s.plugin_ds.as_ref(),
        plugin_config: s.plugin_config.as_ref(),
        schedulable: &schedulable,
        consuming_pods: &consuming,
        others: &s.others,
    })
    .map_err(|message| Error::InvalidSpec { message })
}

/// The devices of the migration's driver on `node`.
pub(super) fn node_counts(s: &Snapshot<'_>, node: &SlimNode) -> DeviceCounts {
    node.metadata.name.as_deref().and_then(|n| s.dra_counts.get(n)).copied().unwrap_or_default()
}

/// The node-local slices of the migration's driver for `node`, with their devices where the
/// reconcile may switch it.
pub(super) fn node_slices<'a>(s: &'a Snapshot<'_>, node: &SlimNode) -> &'a [Arc<ResourceSlice>] {
    node.metadata.name.as_deref().and_then(|n| s.slices.get(n)).map_or(&[], Vec::as_slice)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    use crate::api::v1alpha1::{Direction, GpuPoolMigration, GpuPoolMigrationSpec, Phase, PlacementMode};
    use crate::node::drain::PodRef;
    use crate::node::state::{Action, WaitReason};
    use crate::pool::device_classes;
    use crate::pool::placement::Role;
    use crate::pool::readers::{Finding, Severity};
    use crate::pool::rollout;
    use crate::pool::rollout::{Halt, OtherMigration};
    use crate::reconcile::observe::NodeReads;
    use crate::report::conditions::ConditionType;
    use crate::well_known::*;
    use k8s_openapi::api::apps::v1::DaemonSet;
    use k8s_openapi::api::core::v1::Pod;
    use k8s_openapi::api::resource::v1::ResourceSlice;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use k8s_openapi::jiff::Timestamp;
    use serde_json::{Value, json};

    fn from<T: serde::de::DeserializeOwned>(v: Value) -> T {
        serde_json::from_value(v).expect("fixture")
    }

    const DRIVER: &str = "gpu.switchyard.dev";

    fn gpm(spec_patch: Value) -> GpuPoolMigration {
        let mut v = json!({
            "apiVersion": "switchyard.dev/v1alpha1", "kind": "GpuPoolMigration",
            "metadata": {"name": "pool-a", "uid": "uid-1", "generation": 1},
            "spec": {
                "nodeSelector": {"matchLabels": {"pool": "a100"}},
                "resources": [{"extendedResourceName": "nvidia.com/gpu", "deviceClassName": DRIVER}],
                "driver": {"name": DRIVER, "daemonSet": {"namespace": "switchyard", "name": "driver"}},
                "devicePlugin": {"daemonSet": {"namespace": "gpu", "name": "plugin"}},
                "strategy": {"maxUnavailable": 1}
            }
        });
        crate::testing::merge_patch(&mut v["spec"], &spec_patch);
        from(v)
    }

    /// A Ready pool node on the device plugin with 8 GPUs, in `state` (cordoned, owned) if given.
    fn node(name: &str, state: Option<&str>, extra: Value) -> SlimNode {
        let mut n = match state {
            Some(s) => json!({
                "metadata": {"labels": {LABEL_MIGRATION: "pool-a"},
                    "annotations": {ANNOTATION_MIGRATION_STATE: s, ANNOTATION_STATE_SINCE: "1970-01-12T13:46:00Z"}},
                "spec": {"unschedulable": true}
            }),
            None => json!({}),
        };
        crate::testing::merge_patch(&mut n, &extra);
        crate::testing::gpu_node(name, &n)
    }

    fn daemon_set(ns: &str, name: &str, role: Role) -> DaemonSet {
        crate::testing::placed_daemon_set(ns, name, role)
    }

    /// A pool node the migration moved: on DRA, uncordoned, state Migrated.
    fn migrated(name: &str) -> SlimNode {
        let on_dra = json!({"metadata": {"labels": {LABEL_GPU_BACKEND: BACKEND_DRA}}, "spec": {"unschedulable": false}});
        node(name, Some("Migrated"), on_dra)
    }

    /// A ResourceSlice of `node` with `devices` devices of the pool's driver.
    pub(super) fn slice(node: &str, devices: usize) -> ResourceSlice {
        let devs: Vec<_> = (0..devices).map(|i| json!({"name": format!("gpu-{i}")})).collect();
        from(json!({
            "metadata": {"name": format!("{node}-slice")},
            "spec": {"driver": DRIVER, "nodeName": node,
                "pool": {"name": node, "generation": 1, "resourceSliceCount": 1}, "devices": devs}
        }))
    }

    fn pod(name: &str, owned: bool) -> Pod {
        let owners = if owned {
            json!([{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs", "uid": "u", "controller": true}])
        } else {
            json!([])
        };
        from(json!({
            "metadata": {"namespace": "ml", "name": name, "ownerReferences": owners},
            "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
            "status": {"phase": "Running"}
        }))
    }

    /// The classes the migration wants, as the server would hold them.
    fn classes(g: &GpuPoolMigration) -> Vec<DeviceClass> {
        let mut all = device_classes::desired_all_synced(&g.spec, "pool-a", "uid-1", &[]);
        for c in &mut all {
            c.metadata.creation_timestamp = Some(Time(Timestamp::from_second(1_000).unwrap()));
        }
        all
    }

    struct World {
        gpm: GpuPoolMigration,
        nodes: Vec<SlimNode>,
        classes: Option<Vec<DeviceClass>>,
        driver_ds: Option<DaemonSet>,
        plugin_ds: Option<DaemonSet>,
        slices: Vec<ResourceSlice>,
        reads: HashMap<String, NodeReads>,
        consuming: HashMap<String, u32>,
        others: Vec<OtherMigration>,
        read_errors: Vec<String>,
        pods: Option<(crate::api::v1alpha1::PodVerification, bool)>,
    }

    /// Two fresh nodes, every gate open.
    fn world(spec_patch: Value) -> World {
        let g = gpm(spec_patch);
        World {
            classes: Some(classes(&g)),
            gpm: g,
            nodes: vec![node("n1", None, json!({})), node("n2", None, json!({}))],
            driver_ds: Some(daemon_set("switchyard", "driver", Role::Driver)),
            plugin_ds: Some(daemon_set("gpu", "plugin", Role::DevicePlugin)),
            slices: Vec::new(),
            reads: HashMap::new(),
            consuming: HashMap::new(),
            others: Vec::new(),
            read_errors: Vec::new(),
            pods: None,
        }
    }

    const NOW: i64 = 1_000_000;

    fn decide(w: &World) -> Decision {
        let s = Snapshot {
            facts: crate::testing::server_v1_37(),
            driver_ds: w.driver_ds.clone(),
            plugin_ds: w.plugin_ds.clone(),
            device_classes: w.classes.clone(),
            slices: w.slices.iter().fold(
                HashMap::new(),
                |mut m: HashMap<String, Vec<Arc<ResourceSlice>>>, sl| {
                    m.entry(sl.spec.node_name.clone().unwrap_or_default())
                        .or_default()
                        .push(Arc::new(sl.clone()));
                    m
                },
            ),
            dra_counts: w
                .nodes
                .iter()
                .map(|n| {
                    let name = n.metadata.name.clone().unwrap_or_default();
                    let counts = DeviceCounts::of(&w.slices, &w.gpm.spec.driver.name, &name);
                    (name, counts)
                })
                .collect(),
            others: w.others.clone(),
            pods: w.pods.clone(),
            consuming_pods: w.consuming.clone(),
            node_reads: w.reads.clone(),
            read_errors: w
                .read_errors
                .iter()
                .map(|n| (n.clone(), Error::CleanupWaiting { nodes: 1 }))
                .collect(),
            ..crate::testing::snapshot(&w.gpm, w.nodes.clone(), NOW)
        };
        pool(&s).expect("a decision")
    }

    fn condition(d: &Decision, t: ConditionType) -> &Condition {
        d.status.conditions.iter().find(|c| c.type_ == t.as_str()).expect("condition")
    }

    fn actions(d: &Decision) -> Vec<(&str, &Action)> {
        d.steps.iter().map(|s| (s.node.as_str(), &s.action)).collect()
    }

    fn waits(d: &Decision, node: &str) -> Option<WaitReason> {
        d.steps.iter().find(|s| s.node == node).and_then(|s| match &s.action {
            Action::Wait { reason, .. } => Some(*reason),
            _ => None,
        })
    }

    /// [`replace_decide`] with the world's node reads.
    fn replace_decide_with(w: &World, free: usize, needs: &[&str]) -> Decision {
        replace_decide_reads(w, free, needs, w.reads.clone())
    }

    fn replace_decide(w: &World, free: usize, needs: &[&str]) -> Decision {
        replace_decide_reads(w, free, needs, HashMap::new())
    }

    /// A Replace migration whose target has `free` free GPUs, each node's pods needing one.
    fn replace_decide_reads(
        w: &World,
        free: usize,
        needs: &[&str],
        reads: HashMap<String, NodeReads>,
    ) -> Decision {
        replace_decide_homeless(w, free, needs, reads, &[])
    }

    /// [`replace_decide_reads`], with the GPU pod of each node of `pinned` pinned to the old pool
    /// by its nodeSelector (no target node accepts it).
    fn replace_decide_homeless(
        w: &World,
        free: usize,
        needs: &[&str],
        reads: HashMap<String, NodeReads>,
        pinned: &[&str],
    ) -> Decision {
        use crate::pool::replace::{Target, TargetDevice};
        let devices = (0..free).map(|_| TargetDevice { serves: vec![true] }).collect();
        let t0: SlimNode = from(json!({
            "metadata": {"name": "t0", "labels": {"pool": "dra"}},
            "status": {"conditions": [{"type": "Ready", "status": "True"}],
                       "allocatable": {"cpu": "32", "memory": "256Gi", "pods": "110"}}
        }));
        let target = Target::from_nodes(vec!["nvidia.com/gpu".into()], vec![(t0, devices)]);
        let pods = needs
            .iter()
            .map(|n| {
                let mut p = pod(&format!("{n}-train-0"), true);
                p.spec.as_mut().unwrap().node_name = Some(n.to_string());
                if pinned.contains(n) {
                    p.spec.as_mut().unwrap().node_selector =
                        Some([("pool".to_string(), "old".to_string())].into());
                }
                (n.to_string(), vec![p])
            })
            .collect();
        let s = Snapshot {
            facts: crate::testing::server_v1_37(),
            driver_ds: w.driver_ds.clone(),
            plugin_ds: w.plugin_ds.clone(),
            device_classes: w.classes.clone(),
            replace: Some(crate::reconcile::observe::ReplaceRoom { target, pods, moved: HashMap::new() }),
            node_reads: reads,
            ..crate::testing::snapshot(&w.gpm, w.nodes.clone(), NOW)
        };
        pool(&s).expect("a decision")
    }

    #[test]
    fn replace_spends_the_target_room_node_by_node_and_says_what_it_waits_for() {
        let replace = json!({"strategy": {"type": "Replace", "maxUnavailable": 2,
            "replace": {"targetNodeSelector": {"matchLabels": {"pool": "dra"}}}}});
        // Two nodes start in one reconcile; the target has room for one node's pods: the first
        // drains, the second is only cordoned.
        let w = world(replace.clone());
        let d = replace_decide(&w, 1, &["n1", "n2"]);
        assert_eq!(actions(&d), vec![("n1", &Action::CordonAndDrain), ("n2", &Action::Cordon)]);
        let room = d.status.replace.as_ref().expect("status.replace");
        assert_eq!((room.target_nodes, room.capacity[0].devices, room.capacity[0].free), (1, 1, 1));

        // Next reconcile: the cordoned node waits, and the migration's Ready reason says so.
        let mut w = world(replace);
        w.nodes = vec![node("n1", Some("Draining"), json!({})), node("n2", Some("Cordoned"), json!({}))];
        let d = replace_decide(&w, 0, &["n2"]);
        assert_eq!(waits(&d, "n2"), Some(WaitReason::TargetCapacityShort));
        let ready = condition(&d, ConditionType::Ready);
        assert_eq!(ready.reason, "TargetCapacityShort");
        assert!(
            ready.message.contains("node n2: the target pool (1 Ready, schedulable node(s)) lacks room"),
            "{}",
            ready.message
        );
        assert!(
            ready.message.contains("1 nvidia.com/gpu missing (the node's pods need 1, 0 free)"),
            "{}",
            ready.message
        );
        // Room appears: it drains.
        let d = replace_decide(&w, 1, &["n2"]);
        assert_eq!(d.steps.iter().find(|s| s.node == "n2").map(|s| &s.action), Some(&Action::StartDrain));
        assert_eq!(condition(&d, ConditionType::Ready).reason, "NodesMoving");

        // A node already draining takes the room first, though another sorts before it: its
        // pods are on their way. Its next eviction waits when nothing is left for it.
        w.nodes = vec![node("n1", Some("Cordoned"), json!({})), node("n2", Some("Draining"), json!({}))];
        w.reads.insert(
            "n2".into(),
            NodeReads { pods: vec![pod("train-0", true)], pods_read: true, ..Default::default() },
        );
        let d = replace_decide_with(&w, 1, &["n1", "n2"]);
        assert_eq!(waits(&d, "n1"), Some(WaitReason::TargetCapacityShort));
        assert_eq!(d.steps.iter().find(|s| s.node == "n2").map(|s| &s.action), Some(&Action::Evict));
        let d = replace_decide_with(&w, 0, &["n1", "n2"]);
        assert_eq!(waits(&d, "n2"), Some(WaitReason::TargetCapacityShort), "no eviction without room");
    }

    #[test]
    fn replace_holds_a_node_whose_pods_no_target_node_accepts_and_gives_its_room_to_the_next() {
        let spec = |anyway: bool| {
            json!({"strategy": {"type": "Replace", "maxUnavailable": 2,
                "replace": {"targetNodeSelector": {"matchLabels": {"pool": "dra"}}, "evictWithoutCapacity": anyway}}})
        };
        let pinned = ["n1"];
        // One free device: n1's pod could not go anywhere, so n1 waits cordoned and n2 takes it.
        let w = world(spec(false));
        let d = replace_decide_homeless(&w, 1, &["n1", "n2"], HashMap::new(), &pinned);
        assert_eq!(actions(&d), vec![("n1", &Action::Cordon), ("n2", &Action::CordonAndDrain)]);

        let mut w = world(spec(false));
        w.nodes = vec![node("n1", Some("Cordoned"), json!({})), node("n2", Some("Draining"), json!({}))];
        let d = replace_decide_homeless(&w, 1, &["n1"], HashMap::new(), &pinned);
        assert_eq!(waits(&d, "n1"), Some(WaitReason::TargetCapacityShort));
        let message = &d.steps.iter().find(|s| s.node == "n1").unwrap().message;
        assert!(
            message.contains("no Ready, schedulable target node accepts 1 of this node's GPU pods")
                && message.contains("ml/n1-train-0 (t0: nodeSelector pool=old, the node has pool=dra)"),
            "{message}"
        );
        assert_eq!(condition(&d, ConditionType::Ready).reason, "TargetCapacityShort");

        // evictWithoutCapacity: the spec says drain anyway.
        let mut w = world(spec(true));
        w.nodes = vec![node("n1", Some("Cordoned"), json!({}))];
        let d = replace_decide_homeless(&w, 1, &["n1"], HashMap::new(), &pinned);
        assert_eq!(d.steps.iter().find(|s| s.node == "n1").map(|s| &s.action), Some(&Action::StartDrain));
    }

    #[test]
    fn an_open_gate_starts_the_budget_and_queues_the_rest() {
        let d = decide(&world(json!({})));
        assert!(d.gate_open);
        assert!(d.class_applies.is_empty() && d.placement_patches.is_empty());
        assert_eq!(actions(&d), vec![("n1", &Action::CordonAndDrain)]);
        let step = &d.steps[0];
        let patch = serde_json::to_value(step.patch.as_ref().expect("a cordon patches")).unwrap();
        assert_eq!(patch["metadata"]["resourceVersion"], "7", "the patch is fenced by the observed version");
        assert_eq!(patch["spec"]["unschedulable"], true);
        assert_eq!(
            patch["metadata"]["annotations"][ANNOTATION_MIGRATION_STATE], "Draining",
            "cordoned and draining in one write"
        );
        assert_eq!(step.events[0].reason, "NodeDraining");
        assert_eq!(d.status.phase, Some(Phase::Progressing));
        assert_eq!(d.moving, 1);
        assert_eq!(condition(&d, ConditionType::DeviceClassesReady).reason, "Effective");
        assert_eq!(condition(&d, ConditionType::PlacementReady).reason, "Placed");
    }

    #[test]
    fn the_cheapest_candidate_starts_first() {
        let mut w = world(json!({}));
        w.consuming = HashMap::from([("n1".to_string(), 3), ("n2".to_string(), 0)]);
        assert_eq!(actions(&decide(&w)), vec![("n2", &Action::CordonAndDrain)]);
    }

    /// Each closed gate: what it reports, that no node starts, and that a node mid-drain waits
    /// at its safe point instead of switching.
    #[test]
    fn gate_table() {
        type Edit = fn(&mut World);
        let cases: Vec<(&str, Edit, ConditionType, &str)> = vec![
            (
                "a missing DeviceClass is applied, and the gate waits for the cache to show it",
                |w| w.classes = Some(Vec::new()),
                ConditionType::DeviceClassesReady,
                "Applying",
            ),
            (
                "a DeviceClass that differs is applied again",
                |w| {
                    for c in w.classes.iter_mut().flatten() {
                        c.metadata.annotations = None;
                    }
                },
                ConditionType::DeviceClassesReady,
                "Applying",
            ),
            (
                "a later class with the same extendedResourceName shadows ours",
                |w| {
                    let mut other = classes(&w.gpm).remove(0);
                    other.metadata.name = Some("gpu.nvidia.com".into());
                    other.metadata.creation_timestamp = Some(Time(Timestamp::from_second(2_000).unwrap()));
                    w.classes.get_or_insert_with(Vec::new).push(other);
                },
                ConditionType::DeviceClassesReady,
                "Shadowed",
            ),
            (
                "Managed placement patches the device plugin",
                |w| {
                    w.plugin_ds = Some(from(json!({"metadata": {"namespace": "gpu", "name": "plugin"},
                    "spec": {"selector": {}, "template": {"spec": {"containers": []}}}})))
                },
                ConditionType::PlacementReady,
                "Applying",
            ),
            (
                "Verify placement says what to add",
                |w| {
                    w.gpm.spec.placement = PlacementMode::Verify;
                    w.driver_ds =
                        Some(from(json!({"metadata": {"namespace": "switchyard", "name": "driver"},
                        "spec": {"selector": {}, "template": {"spec": {"containers": []}}}})));
                },
                ConditionType::PlacementReady,
                "NodeAffinityMissing",
            ),
            (
                "the GPU Operator's device plugin under Managed is a prerequisite to change",
                |w| w.plugin_ds = Some(gpu_operator_plugin()),
                ConditionType::PrerequisitesMet,
                "GpuOperatorOwnsDevicePlugin",
            ),
            (
                "and PlacementReady says the same",
                |w| w.plugin_ds = Some(gpu_operator_plugin()),
                ConditionType::PlacementReady,
                "GpuOperatorOwnsDevicePlugin",
            ),
            (
                "GpuOperator placement with a plugin the label cannot move",
                |w| {
                    w.gpm.spec.placement = PlacementMode::GpuOperator;
                    w.plugin_ds = Some(from(json!({"metadata": {"namespace": "gpu", "name": "plugin"},
                    "spec": {"selector": {}, "template": {"spec": {"containers": []}}}})));
                },
                ConditionType::PlacementReady,
                "NodeAffinityMissing",
            ),
            (
                "a missing DaemonSet",
                |w| w.driver_ds = None,
                ConditionType::PrerequisitesMet,
                "DaemonSetMissing",
            ),
            (
                "a node both backends serve",
                |w| w.slices = vec![slice("n2", 8)],
                ConditionType::BackendOverlap,
                "BothBackends",
            ),
        ];
        for (name, edit, cond, reason) in cases {
            let mut w = world(json!({}));
            w.nodes.push(node("n0", Some("Draining"), json!({})));
            w.reads.insert("n0".into(), NodeReads::default());
            edit(&mut w);
            let d = decide(&w);
            assert!(!d.gate_open, "{name}");
            assert_eq!(d.hold, Some(Hold::GateClosed), "{name}");
            assert_eq!(condition(&d, cond).reason, reason, "{name}: {:?}", condition(&d, cond));
            assert_eq!(actions(&d).len(), 1, "{name}: nothing starts: {:?}", actions(&d));
            assert_eq!(waits(&d, "n0"), Some(WaitReason::GateClosed), "{name}: {:?}", actions(&d));
            let applies = (d.class_applies.len(), d.placement_patches.len());
            let want = match (cond, reason) {
                (ConditionType::DeviceClassesReady, "Applying") => (1, 0),
                // A new peer class changes ours' scheduler-sync annotation: applied again, so the
                // scheduler maps the name anew once the peer goes.
                (ConditionType::DeviceClassesReady, "Shadowed") => (1, 0),
                (ConditionType::PlacementReady, "Applying") => (0, 1),
                _ => (0, 0),
            };
            assert_eq!(applies, want, "{name}");
        }
    }

    /// The device plugin as the GPU Operator renders it.
    fn gpu_operator_plugin() -> DaemonSet {
        from(json!({"metadata": {"namespace": "gpu-operator", "name": "nvidia-device-plugin-daemonset",
            "ownerReferences": [{"apiVersion": "nvidia.com/v1", "kind": "ClusterPolicy", "name": "cluster-policy", "uid": "u", "controller": true}]},
            "spec": {"selector": {}, "template": {"spec": {"containers": [],
                "nodeSelector": {"nvidia.com/gpu.deploy.device-plugin": "true"}}}}}))
    }

    #[test]
    fn gpu_operator_placement_opens_the_gate_and_its_switch_turns_the_deploy_label_off() {
        let mut w = world(json!({"placement": "GpuOperator"}));
        w.plugin_ds = Some(gpu_operator_plugin());
        let mut labels = json!({});
        labels["metadata"]["labels"] = json!({"nvidia.com/gpu.deploy.device-plugin": "true"});
        w.nodes.push(node("n0", Some("Draining"), labels));
        w.reads.insert("n0".into(), NodeReads::default());
        let d = decide(&w);
        assert!(d.gate_open, "{:?}", d.status.conditions);
        assert!(d.placement_patches.is_empty(), "GpuOperator edits no DaemonSet");
        assert_eq!(condition(&d, ConditionType::PlacementReady).reason, "Placed");
        let step = d.steps.iter().find(|s| s.node == "n0").expect("a step for n0");
        assert_eq!(step.action, Action::SwitchToDra);
        let patch = serde_json::to_value(step.patch.as_ref().expect("the switch patch")).unwrap();
        assert_eq!(patch["metadata"]["labels"]["nvidia.com/gpu.deploy.device-plugin"], "false", "{patch}");
        assert_eq!(patch["metadata"]["labels"]["switchyard.dev/gpu-backend"], "dra", "{patch}");
        assert_eq!(
            patch["metadata"]["annotations"]["switchyard.dev/device-plugin-deploy-before"], "\"true\"",
            "{patch}"
        );
    }

    #[test]
    fn a_shadowed_class_needs_a_human_and_says_so() {
        let mut w = world(json!({}));
        let mut other = classes(&w.gpm).remove(0);
        other.metadata.name = Some("gpu.nvidia.com".into());
        other.metadata.creation_timestamp = Some(Time(Timestamp::from_second(2_000).unwrap()));
        w.classes.get_or_insert_with(Vec::new).push(other);
        let d = decide(&w);
        let stalled = condition(&d, ConditionType::Stalled);
        assert_eq!((stalled.status.as_str(), stalled.reason.as_str()), ("True", "DeviceClassShadowed"));
        assert_eq!(d.status.phase, Some(Phase::Pending));
    }

    #[test]
    fn hold_table() {
        // (spec patch, failed node present, hold, wait of the node mid-drain)
        let cases = [
            (json!({"paused": true}), false, Some(Hold::Paused), Some(WaitReason::Paused)),
            (
                json!({"strategy": {"onFailure": "Pause"}}),
                true,
                Some(Hold::NodeFailed),
                Some(WaitReason::HeldByFailedNode),
            ),
            (json!({}), false, None, None),
        ];
        for (patch, failed, hold, wait) in cases {
            let mut w = world(patch.clone());
            w.nodes.push(node("n0", Some("Draining"), json!({})));
            w.reads.insert("n0".into(), NodeReads::default());
            if failed {
                w.nodes.push(node(
                    "n9",
                    Some("Failed"),
                    json!({"metadata": {"annotations": {
                    ANNOTATION_FAILURE: r#"{"state":"Draining","reason":"DrainTimeout","message":"m"}"#}}}),
                ));
            }
            let d = decide(&w);
            assert_eq!(d.hold, hold, "{patch}");
            assert_eq!(waits(&d, "n0"), wait, "{patch}: {:?}", actions(&d));
            if hold.is_some() {
                assert_eq!(d.status.phase, Some(Phase::Paused), "{patch}");
                assert!(d.steps.iter().all(|s| s.node == "n0"), "{patch}: nothing starts");
            } else {
                // Drained (no pods left): the switch.
                assert_eq!(d.steps[0].action, Action::SwitchToDra, "{patch}");
                assert!(d.steps[0].drain_seconds.is_some());
            }
        }
    }

    /// NVIDIA's device plugin held two of 8 GPUs back as unhealthy (an XID): when the switch
    /// begins it says so once, as a warning naming the count, and still switches; a node whose
    /// plugin serves every GPU says nothing, nor does a step other than the switch's first.
    #[test]
    fn a_switch_that_begins_with_gpus_the_device_plugin_held_back_names_them() {
        let drained = |allocatable: &str, state: &str| {
            let mut w = world(json!({}));
            let status = json!({"status": {"capacity": {"nvidia.com/gpu": "8"}, "allocatable": {"nvidia.com/gpu": allocatable}}});
            w.nodes.push(node("n0", Some(state), status));
            w.reads.insert("n0".into(), NodeReads::default());
            let d = decide(&w);
            d.steps.into_iter().find(|s| s.node == "n0").expect("a step for n0")
        };
        let step = drained("6", "Draining");
        assert_eq!(step.action, Action::SwitchToDra, "{}", step.message);
        let held: Vec<_> = step.events.iter().filter(|e| e.reason == "DevicePluginUnhealthyGpus").collect();
        assert_eq!(held.len(), 1, "{:?}", step.events);
        assert_eq!(held[0].type_, EventType::Warning);
        assert!(
            held[0].note.contains("held back 2 of its 8 nvidia.com/gpu as unhealthy"),
            "{}",
            held[0].note
        );
        assert!(step.message.contains("2 of its 8 nvidia.com/gpu"), "{}", step.message);

        let step = drained("8", "Draining");
        assert_eq!(step.action, Action::SwitchToDra);
        assert!(step.events.iter().all(|e| e.reason != "DevicePluginUnhealthyGpus"), "{:?}", step.events);

        let step = drained("6", "Cordoned");
        assert!(step.events.iter().all(|e| e.reason != "DevicePluginUnhealthyGpus"), "{:?}", step.events);

        // None allocatable is also how a restarting plugin reads (its DaemonSet rolling): said so,
        // not called unhealthy.
        let step = drained("0", "Draining");
        let held: Vec<_> = step.events.iter().filter(|e| e.reason == "DevicePluginUnhealthyGpus").collect();
        assert_eq!(held.len(), 1, "{:?}", step.events);
        assert!(
            held[0].note.contains(
                "served none of its 8 nvidia.com/gpu when the switch began: its pod was restarting"
            ),
            "{}",
            held[0].note
        );
    }

    #[test]
    fn a_drain_evicts_managed_pods_and_names_the_bare_ones_once() {
        let mut w = world(json!({}));
        w.nodes.push(node("n0", Some("Draining"), json!({})));
        w.reads.insert("n0".into(), NodeReads { pods: vec![pod("train-0", true)], ..Default::default() });
        let d = decide(&w);
        let step = d.steps.iter().find(|s| s.node == "n0").unwrap();
        assert_eq!(step.action, Action::Evict);
        assert_eq!(step.evict.iter().map(ToString::to_string).collect::<Vec<_>>(), vec!["ml/train-0"]);
        assert!(step.patch.is_none(), "an eviction does not touch the node");

        w.reads.insert("n0".into(), NodeReads { pods: vec![pod("bare", false)], ..Default::default() });
        let d = decide(&w);
        let step = d.steps.iter().find(|s| s.node == "n0").unwrap();
        assert_eq!(waits(&d, "n0"), Some(WaitReason::UnmanagedPodsBlockDrain));
        assert!(step.message.contains("ml/bare"), "{}", step.message);
        assert_eq!(step.events.len(), 1, "the first time, an event");
        assert_eq!(step.events[0].type_, EventType::Warning);

        let said = step.message.clone();
        w.gpm.status = Some(GpuPoolMigrationStatus {
            in_progress: vec![crate::api::v1alpha1::NodeProgress {
                name: "n0".into(),
                state: NodeState::Draining,
                since: None,
                message: said,
                cordoned_by: None,
            }],
            ..Default::default()
        });
        let d = decide(&w);
        let step = d.steps.iter().find(|s| s.node == "n0").unwrap();
        assert!(step.events.is_empty(), "the same message again: no second event");
    }

    /// n0 labelled for DRA mid-switch: the device plugin gone and its 8 GPUs published; the pool
    /// verifies with a canary.
    fn switched_world() -> World {
        let mut w =
            world(json!({"strategy": {"verify": {"canary": {"image": "registry.k8s.io/pause:3.10"}}}}));
        w.nodes.push(node(
            "n0",
            Some("Switching"),
            json!({
                "metadata": {"labels": {LABEL_GPU_BACKEND: BACKEND_DRA},
                    "annotations": {ANNOTATION_GPUS_BEFORE: r#"{"nvidia.com/gpu":8}"#}},
                "status": {"allocatable": {"nvidia.com/gpu": "0"}}
            }),
        ));
        w.slices = vec![slice("n0", 8)];
        w
    }

    #[test]
    fn a_switch_with_its_devices_published_moves_on_to_verify() {
        let w = switched_world();
        let d = decide(&w);
        let step = d.steps.iter().find(|s| s.node == "n0").unwrap();
        assert_eq!(step.action, Action::StartVerify);
        assert_eq!(step.state, NodeState::Verifying);
        assert_eq!(step.since, Some(Timestamp::from_second(NOW).unwrap()));
        assert_eq!(step.events[0].reason, "NodeVerifying");
        // n1 and n2 are still on the device plugin, 8 GPUs each.
        assert_eq!(d.metrics.gpus, GpusByBackend { device_plugin: 16, dra: 8, none: 0 });
        assert_eq!(d.metrics.overlap_nodes, 0, "a node mid-switch is not an overlap");
    }

    #[test]
    fn the_pods_of_migrated_nodes_are_reported_and_a_device_plugin_holder_is_an_overlap() {
        use crate::node::verify::{Fault, summarize};
        let mut w = world(json!({}));
        let moved = |name: &str| {
            node(
                name,
                Some("Migrated"),
                json!({"metadata": {"labels": {LABEL_GPU_BACKEND: BACKEND_DRA}}, "spec": {"unschedulable": false},
                       "status": {"allocatable": {"nvidia.com/gpu": "0"}}}),
            )
        };
        w.nodes = vec![moved("n1"), moved("n2")];
        w.slices = vec![slice("n1", 8), slice("n2", 8)];
        let pod = |node: &str, name: &str| (node.to_string(), "ml".to_string(), name.to_string(), Ok(()));
        w.pods = Some((summarize(vec![pod("n1", "a"), pod("n2", "b")]), false));
        let d = decide(&w);
        let c = condition(&d, ConditionType::PodsVerified);
        assert_eq!((c.status.as_str(), c.reason.as_str()), ("True", "PodsOnDriver"), "{}", c.message);
        assert!(c.message.starts_with("2 running GPU pod(s)"), "{}", c.message);
        assert_eq!(d.status.pods.as_ref().map(|p| (p.verified, p.unverified)), Some((2, 0)));
        assert_eq!(condition(&d, ConditionType::BackendOverlap).status, "False");
        assert!(!d.pods_settling);

        let holder = (
            "n2".to_string(),
            "ml".to_string(),
            "late".to_string(),
            Err((
                Fault::HoldsDevicePluginGpu,
                "container main requests nvidia.com/gpu with no DRA claim behind it".to_string(),
            )),
        );
        w.pods = Some((summarize(vec![pod("n1", "a"), pod("n2", "b"), holder]), true));
        let d = decide(&w);
        let c = condition(&d, ConditionType::PodsVerified);
        assert_eq!((c.status.as_str(), c.reason.as_str()), ("False", "PodsNotVerified"));
        assert!(
            c.message.contains("1 of 3 running GPU pod(s)")
                && c.message.contains("ml/late on n2: HoldsDevicePluginGpu"),
            "{}",
            c.message
        );
        let overlap = condition(&d, ConditionType::BackendOverlap);
        assert_eq!(
            (overlap.status.as_str(), overlap.reason.as_str()),
            ("True", "PodOnDevicePlugin"),
            "{}",
            overlap.message
        );
        assert_eq!(d.metrics.overlap_nodes, 1, "n2 is served by both");
        assert!(!d.gate_open, "no node starts while a migrated node's pod holds a device-plugin GPU");
        let stalled = condition(&d, ConditionType::Stalled);
        assert_eq!((stalled.status.as_str(), stalled.reason.as_str()), ("True", "BackendOverlap"));
        assert!(!d.gate_open, "no node starts while a migrated node's pod holds a device-plugin GPU");
        let stalled = condition(&d, ConditionType::Stalled);
        assert_eq!((stalled.status.as_str(), stalled.reason.as_str()), ("True", "BackendOverlap"));
        assert!(d.events.iter().any(|e| e.reason == "PodsNotVerified"), "{:?}", d.events);
        assert!(d.pods_settling, "a changed check is looked at again soon");
        // Rolling back: not checked, not reported.
        w.pods = None;
        let d = decide(&w);
        assert!(d.status.conditions.iter().all(|c| c.type_ != "PodsVerified"));
        assert_eq!(d.status.pods, None);
    }

    #[test]
    fn a_node_between_backends_keeps_its_gpus_in_the_pool_figure() {
        let mut w = switched_world();
        w.slices.clear();
        let d = decide(&w);
        assert_eq!(
            d.metrics.gpus,
            GpusByBackend { device_plugin: 16, dra: 0, none: 8 },
            "the plugin gone, the driver not publishing yet: its 8 GPUs count under none"
        );
    }

    #[test]
    fn without_a_canary_a_switched_node_completes_in_the_same_step() {
        let mut w = switched_world();
        w.gpm.spec.strategy.verify.canary = None;
        let d = decide(&w);
        let step = d.steps.iter().find(|s| s.node == "n0").unwrap();
        assert_eq!(step.action, Action::Complete);
        assert_eq!(step.state, NodeState::Migrated);
        assert_eq!(step.events[0].reason, "NodeMigrated");
        let patch = serde_json::to_value(step.patch.as_ref().unwrap()).unwrap();
        assert_eq!(patch["spec"]["unschedulable"], false, "uncordoned: {patch}");
        assert!(!step.remove_finished_canary);
    }

    /// One GPU with an XID on an 8-GPU node: the device plugin counted it (capacity 8), the
    /// driver publishes it tainted. The switch counts it and says so; it does not wait for it.
    #[test]
    fn a_switch_counts_an_unhealthy_gpu_and_reports_it_but_not_a_device_the_interlock_holds() {
        let taint =
            |key: &str, value: Option<&str>| json!([{"key": key, "value": value, "effect": "NoSchedule"}]);
        let with_taint = |i: usize, taints: Value| {
            let mut s = slice("n0", 8);
            let mut devices = serde_json::to_value(&s.spec.devices).unwrap();
            devices[i]["taints"] = taints;
            s.spec.devices = serde_json::from_value(devices).unwrap();
            s
        };
        let mut w = switched_world();
        w.slices = vec![with_taint(3, taint(&format!("{DRIVER}/xid"), Some("79")))];
        let d = decide(&w);
        let step = d.steps.iter().find(|s| s.node == "n0").unwrap();
        assert_eq!(step.action, Action::StartVerify, "{}", step.message);
        let event =
            step.events.iter().find(|e| e.reason == "UnhealthyDevices").expect("an UnhealthyDevices event");
        assert_eq!(event.type_, EventType::Warning);
        assert!(
            event.note.contains("1 unhealthy device(s)")
                && event.note.contains(&format!("gpu-3 ({DRIVER}/xid=79)")),
            "{}",
            event.note
        );
        assert!(step.message.contains("gpu-3"), "{}", step.message);

        // The interlock's taint holds a device back for a node-wide reason: not counted yet.
        let mut w = switched_world();
        w.slices = vec![with_taint(3, taint(&format!("{DRIVER}/device-plugin-active"), None))];
        let d = decide(&w);
        let step = d.steps.iter().find(|s| s.node == "n0").unwrap();
        assert_eq!(waits(&d, "n0"), Some(WaitReason::WaitingForResourceSlices), "{}", step.message);
        assert!(step.events.iter().all(|e| e.reason != "UnhealthyDevices"));
    }

    #[test]
    fn a_switch_counts_only_the_devices_the_pool_classes_select() {
        let mut w = switched_world();
        w.gpm.spec.resources[0].selector = Some(format!("device.attributes['{DRIVER}'].type == 'gpu'"));
        // Eight devices, none with the attribute the class reads.
        let d = decide(&w);
        let step = d.steps.iter().find(|s| s.node == "n0").unwrap();
        assert_eq!(waits(&d, "n0"), Some(WaitReason::WaitingForResourceSlices), "{step:?}");
        assert!(
            step.message.contains("driver publishes 8 device(s), the pool's DeviceClasses select 0, need 8"),
            "{}",
            step.message
        );
        assert!(
            step.message.contains(&format!("DeviceClass {DRIVER} selects 0 of them")),
            "{}",
            step.message
        );
        // The same devices as the driver publishes them: typed.
        let devs: Vec<_> = (0..8)
            .map(|i| json!({"name": format!("gpu-{i}"), "attributes": {"type": {"string": "gpu"}}}))
            .collect();
        w.slices[0].spec.devices = Some(from(json!(devs)));
        let d = decide(&w);
        assert_eq!(d.steps.iter().find(|s| s.node == "n0").unwrap().action, Action::StartVerify);
    }

    #[test]
    fn a_driver_without_the_interlock_switches_through_none_once_the_plugin_is_gone() {
        let mut w = world(json!({"driver": {"name": "gpu.example.com"}}));
        assert!(!w.gpm.spec.driver.interlocked(), "unset: only gpu.switchyard.dev has the interlock");
        w.nodes = vec![
            node("drained", Some("Draining"), json!({})),
            node(
                "in-none",
                Some("Switching"),
                json!({"metadata": {"labels": {LABEL_GPU_BACKEND: BACKEND_NONE},
                    "annotations": {ANNOTATION_GPUS_BEFORE: r#"{"nvidia.com/gpu":8}"#}},
                    "status": {"allocatable": {"nvidia.com/gpu": "0"}}}),
            ),
        ];
        let plugin_pod: Pod = from(json!({
            "metadata": {"namespace": "gpu", "name": "plugin-x", "ownerReferences": [
                {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "plugin", "uid": "u", "controller": true}]},
            "spec": {"containers": [{"name": "c"}]},
            "status": {"phase": "Running"}
        }));
        w.reads.insert("drained".into(), NodeReads { pods_read: true, ..Default::default() });
        w.reads.insert(
            "in-none".into(),
            NodeReads { pods: vec![plugin_pod], pods_read: true, ..Default::default() },
        );
        let d = decide(&w);
        let drained = d.steps.iter().find(|s| s.node == "drained").unwrap();
        assert_eq!(drained.action, Action::StopDevicePlugin);
        assert_eq!(drained.state, NodeState::Switching);
        let label = |s: &NodeStep| {
            serde_json::to_value(&s.patch).unwrap()["metadata"]["labels"][LABEL_GPU_BACKEND].clone()
        };
        assert_eq!(label(drained), json!("none"));
        assert!(drained.events[0].note.contains("the device plugin leaves first"), "{:?}", drained.events);
        assert_eq!(waits(&d, "in-none"), Some(WaitReason::DevicePluginPodRunning));

        // Its pod gone: the driver starts, on the same state and clock.
        w.reads.insert("in-none".into(), NodeReads { pods_read: true, ..Default::default() });
        let d = decide(&w);
        let started = d.steps.iter().find(|s| s.node == "in-none").unwrap();
        assert_eq!(started.action, Action::StartDriver);
        assert_eq!(started.state, NodeState::Switching);
        assert_eq!(started.since, "1970-01-12T13:46:00Z".parse().ok(), "the switch keeps its clock");
        assert_eq!(label(started), json!("dra"));
        assert_eq!(started.events[0].reason, "DriverStarting");
        // The device plugin must also avoid `none` nodes: the interlock-only placement is not enough.
        let mut w = world(json!({"driver": {"name": "gpu.example.com"}}));
        let mut interlock_only = daemon_set("gpu", "plugin", Role::DevicePlugin);
        interlock_only.spec.template.spec.as_mut().unwrap().affinity = from(json!({"nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": [
                {"key": LABEL_GPU_BACKEND, "operator": "NotIn", "values": ["dra"]}]}]}}}));
        w.plugin_ds = Some(interlock_only);
        let d = decide(&w);
        assert_eq!(d.placement_patches.len(), 1, "Managed adds `none` to the device plugin's affinity");
        assert!(!d.gate_open);
    }

    #[test]
    fn a_node_whose_reads_failed_is_left_as_it_is_and_the_others_step() {
        let mut w = world(json!({"strategy": {"maxUnavailable": 3}}));
        w.nodes.push(node("n0", Some("Draining"), json!({})));
        w.read_errors = vec!["n0".into()];
        let d = decide(&w);
        let n0 = d.steps.iter().find(|s| s.node == "n0").unwrap();
        assert_eq!(n0.action, Action::Nothing);
        assert!(n0.patch.is_none() && n0.evict.is_empty() && n0.events.is_empty());
        assert_eq!(n0.state, NodeState::Draining);
        let started: Vec<_> =
            d.steps.iter().filter(|s| s.action == Action::CordonAndDrain).map(|s| &s.node).collect();
        assert_eq!(started, vec!["n1", "n2"], "the other nodes still start");
    }

    #[test]
    fn a_device_plugin_pod_that_lands_after_the_drain_is_evicted_before_the_switch_counts() {
        let mut w = switched_world();
        let mut on_dra = pod("served-by-dra", true);
        on_dra.status.get_or_insert_with(Default::default).extended_resource_claim_status =
            Some(from(json!({"resourceClaimName": "c", "requestMappings": []})));
        w.reads.insert(
            "n0".into(),
            NodeReads { pods: vec![pod("late", true), on_dra.clone()], ..Default::default() },
        );
        let d = decide(&w);
        let step = d.steps.iter().find(|s| s.node == "n0").unwrap();
        assert_eq!(step.action, Action::Evict);
        assert_eq!(step.evict.iter().map(ToString::to_string).collect::<Vec<_>>(), vec!["ml/late"]);

        w.reads.insert("n0".into(), NodeReads { pods: vec![on_dra], ..Default::default() });
        let d = decide(&w);
        assert_eq!(d.steps.iter().find(|s| s.node == "n0").unwrap().action, Action::StartVerify);
    }

    #[test]
    fn a_node_gone_from_the_pool_mid_move_is_told_once_on_the_migration() {
        let mut w = world(json!({}));
        w.gpm.status = Some(GpuPoolMigrationStatus {
            in_progress: vec![crate::api::v1alpha1::NodeProgress {
                name: "gone".into(),
                state: NodeState::Draining,
                since: None,
                message: "evicting 1 pod(s)".into(),
                cordoned_by: None,
            }],
            ..Default::default()
        });
        let d = decide(&w);
        let removed: Vec<_> = d.events.iter().filter(|e| e.reason == "NodeRemoved").collect();
        assert_eq!(removed.len(), 1);
        assert_eq!(removed[0].node.as_deref(), Some("gone"));
        assert!(d.steps.iter().all(|s| s.node != "gone"));
    }

    #[test]
    fn a_node_another_migration_selects_is_refused_with_one_event() {
        let mut w = world(json!({}));
        w.others = vec![OtherMigration {
            name: "pool-b".into(),
            selector: from(json!({"matchLabels": {"pool": "a100"}})),
        }];
        let d = decide(&w);
        assert!(d.steps.is_empty());
        assert_eq!(condition(&d, ConditionType::NodeConflict).status, "True");
        assert_eq!(d.events.iter().filter(|e| e.reason == "NodeConflict").count(), 1);
    }

    #[test]
    fn a_pool_with_refused_nodes_is_never_completed() {
        let other = || OtherMigration {
            name: "pool-b".into(),
            selector: from(json!({"matchLabels": {"pool": "a100"}})),
        };
        // Every selected node is refused: nothing to move, and nothing moved.
        let mut w = world(json!({}));
        w.others = vec![other()];
        let d = decide(&w);
        assert_eq!(d.status.phase, Some(Phase::Failed), "{:?}", d.status.phase);
        assert_eq!((d.status.nodes.total, d.status.nodes.refused), (0, 2));
        let stalled = condition(&d, ConditionType::Stalled);
        assert_eq!((stalled.status.as_str(), stalled.reason.as_str()), ("True", "NodesRefused"));
        assert!(stalled.message.starts_with("2 selected node(s) are refused"), "{}", stalled.message);
        let ready = condition(&d, ConditionType::Ready);
        assert_eq!((ready.status.as_str(), ready.reason.as_str()), ("False", "NodesRefused"));

        // One node moved, the other belongs to another migration: not Completed either.
        let mut w = world(json!({}));
        w.nodes = vec![
            migrated("n1"),
            node("n2", None, json!({"metadata": {"labels": {LABEL_MIGRATION: "pool-b"}}})),
        ];
        let d = decide(&w);
        assert_eq!((d.status.nodes.migrated, d.status.nodes.refused), (1, 1));
        assert_eq!(d.status.phase, Some(Phase::Failed));
        assert_eq!(condition(&d, ConditionType::Stalled).reason, "NodesRefused");
        assert_eq!(condition(&d, ConditionType::Ready).status, "False");

        // Without the other migration the same pool completes.
        let mut w = world(json!({}));
        w.nodes = vec![migrated("n1"), migrated("n2")];
        let d = decide(&w);
        assert_eq!((d.status.phase, d.status.nodes.refused), (Some(Phase::Completed), 0));
        assert_eq!(condition(&d, ConditionType::Ready).status, "True");
    }

    /// The runbook's last step deletes the device plugin once it serves no node: a completed
    /// forward migration does not need it, says when it may go, and moves a node that joins later.
    #[test]
    fn a_completed_pool_does_not_need_the_device_plugin_and_says_when_it_may_go() {
        let removable = |d: &Decision| {
            let c = condition(d, ConditionType::DevicePluginRemovable);
            (c.status.clone(), c.reason.clone(), c.message.clone())
        };
        let announced =
            |d: &Decision| d.events.iter().filter(|e| e.reason == "DevicePluginRemovable").count();
        let scheduled_on = |n: i32| {
            let mut ds = daemon_set("gpu", "plugin", Role::DevicePlugin);
            ds.metadata.generation = Some(2);
            ds.status = Some(from(json!({"observedGeneration": 2, "desiredNumberScheduled": n,
                "currentNumberScheduled": n, "numberMisscheduled": 0, "numberReady": n})));
            ds
        };

        // Completed, the plugin scheduled on no node: it may go, and one event says so.
        let mut w = world(json!({}));
        w.nodes = vec![migrated("n1"), migrated("n2")];
        w.plugin_ds = Some(scheduled_on(0));
        let d = decide(&w);
        let (status, reason, message) = removable(&d);
        assert_eq!((status.as_str(), reason.as_str()), ("True", "DevicePluginUnused"), "{message}");
        assert!(message.contains("gpu/plugin runs on no node"), "{message}");
        assert!(!message.contains("gpuResourcesEnabledOverride"), "not NVIDIA's driver: {message}");
        assert_eq!(announced(&d), 1);
        w.gpm.status = Some(d.status.clone());
        assert_eq!(announced(&decide(&w)), 0, "announced once, not once per reconcile");

        // Deleted: still Completed and Ready, nothing Stalled, the prerequisites and placement met.
        w.plugin_ds = None;
        let d = decide(&w);
        assert_eq!(d.status.phase, Some(Phase::Completed));
        for (t, want, why) in [
            (ConditionType::Ready, "True", "Complete"),
            (ConditionType::Stalled, "False", "NoHumanNeeded"),
            (ConditionType::PrerequisitesMet, "True", "AllMet"),
            (ConditionType::PlacementReady, "True", "Placed"),
        ] {
            let c = condition(&d, t);
            assert_eq!((c.status.as_str(), c.reason.as_str()), (want, why), "{t:?}: {}", c.message);
        }
        assert_eq!(removable(&d).1, "DevicePluginRemoved");

        // A node that joins afterwards has no device plugin; GFD labelled its 8 GPUs. It moves,
        // and the switch is verified against those 8.
        let unserved = json!({"metadata": {"labels": {"nvidia.com/gpu.count": "8"}},
            "status": {"allocatable": {"nvidia.com/gpu": "0"}, "capacity": {"nvidia.com/gpu": "0"}}});
        w.nodes.push(node("n3", None, unserved));
        let d = decide(&w);
        assert!(d.gate_open, "{:?}", condition(&d, ConditionType::Stalled));
        assert_eq!(actions(&d), vec![("n3", &Action::CordonAndDrain)]);
        let patch = serde_json::to_value(d.steps[0].patch.as_ref().unwrap()).unwrap();
        assert_eq!(patch["metadata"]["annotations"][ANNOTATION_GPUS_BEFORE], r#"{"nvidia.com/gpu":8}"#);

        // A node still on the device plugin needs it: the missing DaemonSet blocks then.
        w.nodes = vec![migrated("n1"), node("n2", None, json!({}))];
        let d = decide(&w);
        assert_eq!(condition(&d, ConditionType::PrerequisitesMet).reason, "DaemonSetMissing");
        assert_eq!(removable(&d).1, "DevicePluginMissing");
        // So does onFailure: Rollback, while a node is left to move: a rollback returns it there.
        let mut w = world(json!({"strategy": {"onFailure": "Rollback"}}));
        w.nodes = vec![
            migrated("n1"),
            node(
                "n3",
                None,
                json!({"metadata": {"labels": {"nvidia.com/gpu.count": "8"}},
            "status": {"allocatable": {"nvidia.com/gpu": "0"}, "capacity": {"nvidia.com/gpu": "0"}}}),
            ),
        ];
        w.plugin_ds = None;
        assert_eq!(condition(&decide(&w), ConditionType::PrerequisitesMet).reason, "DaemonSetMissing");

        // Still running elsewhere: not yet, and the message says where.
        let mut w = world(json!({}));
        w.nodes = vec![migrated("n1"), node("n2", None, json!({}))];
        w.plugin_ds = Some(scheduled_on(3));
        let (status, reason, message) = removable(&decide(&w));
        assert_eq!((status.as_str(), reason.as_str()), ("False", "DevicePluginInUse"));
        assert!(message.contains("runs on 3 node(s); 1 node(s) of this pool are still to move"), "{message}");
        w.nodes = vec![migrated("n1"), migrated("n2")];
        let message = removable(&decide(&w)).2;
        assert!(message.contains("still runs on 3 node(s) outside this pool"), "{message}");

        // NVIDIA's DRA driver: its chart's override, which reads as a coexistence waiver, is to
        // be kept (the chart refuses GPUs without it, device plugin or not).
        let mut w = world(json!({"driver": {"name": NVIDIA_DRA_DRIVER}}));
        w.nodes = vec![migrated("n1"), migrated("n2")];
        w.plugin_ds = Some(scheduled_on(0));
        let message = removable(&decide(&w)).2;
        assert!(
            message.contains("; keep gpuResourcesEnabledOverride=true in NVIDIA's DRA driver chart's values"),
            "{message}"
        );

        // A rollback returns nodes to the device plugin: no such condition.
        let d = decide(&world(json!({"direction": "Rollback"})));
        assert!(d.status.conditions.iter().all(|c| c.type_ != "DevicePluginRemovable"));
    }

    #[test]
    fn an_invalid_budget_is_an_invalid_spec() {
        let w = world(json!({"strategy": {"maxUnavailable": "150%"}}));
        let s = crate::testing::snapshot(&w.gpm, w.nodes.clone(), NOW);
        assert!(matches!(pool(&s), Err(Error::InvalidSpec { .. })));
    }

    #[test]
    fn queued_message_names_what_holds_the_budget() {
        let v = |xs: &[&str]| xs.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        let held = rollout::Plan {
            queued: v(&["b", "c"]),
            max_unavailable: 1,
            unavailable: 1,
            unavailable_nodes: v(&["a"]),
            ..Default::default()
        };
        let m = queued_message(&held, true, 0).expect("a message");
        assert!(m.contains("maxUnavailable is 1") && m.contains("(a)"), "{m}");
        assert_eq!(queued_message(&held, true, 1), None, "nodes moving say it themselves");
        assert_eq!(queued_message(&held, false, 0), None, "a closed gate has its own condition");
        let not_ready =
            rollout::Plan { queued: v(&["b"]), max_unavailable: 2, unavailable: 1, ..held.clone() };
        let m = queued_message(&not_ready, true, 0).expect("a message");
        assert!(m.contains("NotReady (b)"), "{m}");
    }

    #[test]
    fn a_drain_looks_again_when_its_pods_should_be_gone() {
        let now: Timestamp = "2026-12-01T10:00:00Z".parse().unwrap();
        let pod = |name: &str, grace: Option<i64>, deleting_at: Option<&str>| -> Pod {
            from(json!({
                "metadata": {"name": name, "namespace": "ml", "deletionTimestamp": deleting_at},
                "spec": {"containers": [], "terminationGracePeriodSeconds": grace}
            }))
        };
        let r = |n: &str| PodRef { namespace: "ml".into(), name: n.into() };
        let pods =
            vec![pod("a", Some(5), None), pod("b", None, None), pod("c", None, Some("2026-12-01T10:00:02Z"))];
        let ms = |m: u64| Some(std::time::Duration::from_millis(m) + POD_GONE_SLACK);
        // An eviction takes the pod's own grace period, the API's 30 s default without one.
        assert_eq!(recheck_after(&pods, &[r("a")], &[], None, now), ms(5000));
        assert_eq!(recheck_after(&pods, &[r("a"), r("b")], &[], None, now), ms(30_000));
        // The spec's grace period overrides the pods'.
        assert_eq!(recheck_after(&pods, &[r("a"), r("b")], &[], Some(0), now), ms(0));
        // A terminating pod goes at its deletionTimestamp; the longest wait wins.
        assert_eq!(recheck_after(&pods, &[], &[r("c")], None, now), ms(2000));
        assert_eq!(recheck_after(&pods, &[r("a")], &[r("c")], Some(1), now), ms(2000));
        // Nothing evicted or terminating: nothing to look at.
        assert_eq!(recheck_after(&pods, &[], &[], None, now), None);
    }

    #[test]
    fn phase_table() {
        let spec: GpuPoolMigrationSpec = serde_json::from_value(json!({
            "nodeSelector": {"matchLabels": {"pool": "a100"}},
            "resources": [{"extendedResourceName": "nvidia.com/gpu", "deviceClassName": "gpu.switchyard.dev"}],
            "driver": {"name": "gpu.switchyard.dev", "daemonSet": {"namespace": "s", "name": "d"}},
            "devicePlugin": {"daemonSet": {"namespace": "g", "name": "p"}}
        }))
        .unwrap();
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        let p = |in_flight: &[&str], queued: &[&str], failed: &[&str], halt: Option<Halt>| rollout::Plan {
            in_flight: s(in_flight),
            queued: s(queued),
            failed: s(failed),
            halt,
            ..Default::default()
        };
        let mut rb = spec.clone();
        rb.direction = Direction::Rollback;
        let cases = [
            (&spec, p(&[], &["a"], &[], None), false, Phase::Pending),
            (&spec, p(&["a"], &["b"], &[], None), false, Phase::Progressing),
            (&spec, p(&["a"], &[], &[], None), true, Phase::Progressing),
            (&spec, p(&[], &[], &[], None), true, Phase::Completed),
            (&spec, p(&[], &[], &["a"], None), true, Phase::Failed),
            (&spec, p(&[], &["b"], &["a"], Some(Halt::NodeFailed("a".into()))), true, Phase::Paused),
            (&spec, p(&[], &["b"], &[], Some(Halt::Paused)), true, Phase::Paused),
            (&rb, p(&["a"], &[], &[], None), true, Phase::RollingBack),
            (&rb, p(&[], &[], &[], None), true, Phase::RolledBack),
        ];
        for (sp, pl, gate, want) in cases {
            assert_eq!(phase(sp, &pl, gate), want, "{pl:?}");
        }
    }

    #[test]
    fn inventory_message_lists_the_worst_findings_and_points_at_the_cli() {
        let f = |severity, object: &str| Finding {
            severity,
            kind: "ResourceQuota".into(),
            object: object.into(),
            message: "m".into(),
            advice: "a".into(),
        };
        let findings: Vec<Finding> = (0..7).map(|i| f(Severity::Warning, &format!("ns/q{i}"))).collect();
        let msg = inventory_message("pool", &findings, &["kubelet warning".to_string()]);
        let lines: Vec<&str> = msg.lines().collect();
        assert_eq!(lines[0], "7 finding(s): 7 warning");
        assert_eq!(lines[1], "warning ResourceQuota ns/q0: m");
        assert_eq!(lines[6], "and 2 more");
        assert_eq!(lines[7], "kubelet warning");
        assert_eq!(lines[8], "details and advice: switchyard inventory --migration pool");
        assert_eq!(inventory_message("pool", &[], &[]), "no findings");
    }
}
