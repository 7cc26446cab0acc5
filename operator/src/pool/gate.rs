//! The pool's gate, the one judgement the operator decides with and `switchyard plan` shows:
//! whether the cluster's prerequisites hold, whether the DeviceClasses exist and win their names,
//! whether both DaemonSets keep to their backend, whether any node is served by both, and the
//! rollout plan of the pool. [`judge`] strings them together; the reconcile's decide and the
//! preview both call it, so what the CLI shows cannot drift from what the operator does. Pure.

use std::borrow::Borrow;

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::resource::v1::DeviceClass;
use kube::ResourceExt;

use crate::api::v1alpha1::{
    DaemonSetRef, DeviceClassStatus, Direction, FailurePolicy, GpuPoolMigrationSpec, NodeState,
};
use crate::node::record::{self, PoolNode};
use crate::node::slim::SlimNode;
use crate::node::state::Hold;
use crate::pool::device_classes::{self, ClassInfo, Readiness};
use crate::pool::overlap::{self, Overlap};
use crate::pool::placement::{self, Need, PlacementApply, Role};
use crate::pool::plugin_config::PluginConfig;
use crate::pool::prerequisites::ServerFacts;
use crate::pool::prerequisites::{self, ClusterFacts, NodeVersions, Verdict};
use crate::pool::rollout::{self, Halt, OtherMigration, Plan};

pub(crate) fn resources(spec: &GpuPoolMigrationSpec) -> Vec<&str> {
    spec.resources.iter().map(|r| r.extended_resource_name.as_str()).collect()
}

/// Whether the migration still needs the device plugin's DaemonSet.
///
/// A rollback returns nodes to it, and so may a failure under `onFailure: Rollback` while a node
/// is left to move. A forward migration needs it while a node it has not moved yet advertises
/// device-plugin GPUs: the DaemonSet it names must then be the one that serves them, or the switch
/// would leave another plugin running beside the driver. Once no such node is left (the runbook's
/// last step deletes the device plugin), the migration does not need it: a node that joins the
/// pool afterwards, with no plugin on it, moves to DRA.
pub fn device_plugin_needed(spec: &GpuPoolMigrationSpec, nodes: &[impl Borrow<SlimNode>]) -> bool {
    // Replace moves no node off the device plugin: it keeps serving the old nodes as it is,
    // whoever runs it (often the provider, under a name of its own).
    if spec.strategy.replace().is_some() {
        return false;
    }
    let res = resources(spec);
    let mut unmoved =
        nodes.iter().map(Borrow::borrow).filter(|n| record::node_state(n) != NodeState::Migrated);
    match spec.direction {
        Direction::Rollback => true,
        Direction::Forward if spec.strategy.on_failure == FailurePolicy::Rollback => unmoved.next().is_some(),
        Direction::Forward => {
            unmoved.any(|n| crate::pool::overlap::device_plugin_gpus(n, &res).values().any(|&g| g > 0))
        }
    }
}

/// Whether the pool may start: the cluster's prerequisites, then what its nodes advertise.
pub fn pool_verdict(
    spec: &GpuPoolMigrationSpec,
    facts: &ServerFacts,
    versions: Vec<NodeVersions>,
    nodes: &[impl std::borrow::Borrow<SlimNode>],
    driver_daemonset_exists: bool,
    device_plugin: DevicePluginFacts,
    plugin_config: Option<&PluginConfig>,
) -> prerequisites::Verdict {
    let verdict =
        prerequisites::check(&cluster_facts(spec, facts, versions, driver_daemonset_exists, device_plugin));
    let check = match spec.direction {
        Direction::Forward => crate::pool::capacity::check(
            nodes.iter().map(|n| n.borrow()),
            &resources(spec),
            &spec.device_plugin.gpu_resources,
            plugin_config,
            spec.driver.shares(),
        ),
        // Rollback returns nodes to the device plugin, which serves whatever it served before.
        Direction::Rollback => crate::pool::capacity::Check::default(),
    };
    prerequisites::with_capacity(verdict, &check, spec.acknowledge.gpu_sharing_loss)
}

/// What the prerequisites know of the device plugin's DaemonSet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DevicePluginFacts {
    pub exists: bool,
    /// See [`device_plugin_needed`].
    pub needed: bool,
}

pub fn cluster_facts(
    spec: &GpuPoolMigrationSpec,
    facts: &ServerFacts,
    nodes: Vec<NodeVersions>,
    driver_daemonset_exists: bool,
    device_plugin: DevicePluginFacts,
) -> ClusterFacts {
    let (dn, dp) = (&spec.driver.daemon_set, &spec.device_plugin.daemon_set);
    ClusterFacts {
        server_git_version: facts.git_version.clone(),
        control_plane: facts.control_plane.clone(),
        served: facts.served,
        nodes,
        probe: facts.probe,
        rollback_possible: spec.direction == Direction::Rollback
            || spec.strategy.on_failure == FailurePolicy::Rollback,
        driver_daemonset: Some(format!("{}/{}", dn.namespace, dn.name)),
        device_plugin_daemonset: Some(format!("{}/{}", dp.namespace, dp.name)),
        driver_daemonset_exists,
        device_plugin_daemonset_exists: device_plugin.exists,
        device_plugin_daemonset_needed: device_plugin.needed,
        rollback_evicts_past_budgets: spec.strategy.drain.rollback_evicts_past_budgets,
        selector_gfd_labels: selector_keys(&spec.node_selector)
            .into_iter()
            .filter(|k| prerequisites::gfd_written(k))
            .collect(),
    }
}

/// The label keys a label selector names, each once, in order.
fn selector_keys(s: &k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector) -> Vec<String> {
    let mut keys: Vec<String> = s.match_labels.iter().flatten().map(|(k, _)| k.clone()).collect();
    keys.extend(s.match_expressions.iter().flatten().map(|e| e.key.clone()));
    let mut seen = std::collections::HashSet::new();
    keys.retain(|k| seen.insert(k.clone()));
    keys
}

/// The versions the prerequisites judge, from a node's status.
pub fn node_versions(n: &SlimNode) -> NodeVersions {
    NodeVersions {
        name: n.name_any(),
        kubelet_version: n.kubelet_version().to_string(),
        container_runtime_version: n.container_runtime_version().to_string(),
    }
}

/// What the gate reads: the pool as one reconcile, or `switchyard plan`, sees it.
pub struct Inputs<'a, N> {
    /// The migration's name and uid (empty for a manifest not applied yet).
    pub name: &'a str,
    pub uid: &'a str,
    pub spec: &'a GpuPoolMigrationSpec,
    pub facts: &'a ServerFacts,
    /// The nodes `spec.nodeSelector` selects.
    pub nodes: &'a [N],
    /// Replace: the target pool's nodes, whose kubelets and runtimes the prerequisites judge
    /// instead of the old nodes' (which never serve DRA).
    pub target_nodes: &'a [N],
    /// Every DeviceClass of the cluster; `None` where resource.k8s.io/v1 does not serve them.
    pub device_classes: Option<&'a [DeviceClass]>,
    pub driver_ds: Option<&'a DaemonSet>,
    pub plugin_ds: Option<&'a DaemonSet>,
    /// The device plugin's config file, where its DaemonSet takes one from a ConfigMap
    /// ([`crate::pool::plugin_config::source`]).
    pub plugin_config: Option<&'a PluginConfig>,
    /// A node's devices in the driver's ResourceSlices that the scheduler may allocate now.
    pub schedulable: &'a dyn Fn(&SlimNode) -> u64,
    /// A node's pods that hold what the move takes away (they order the pool: fewest first).
    pub consuming_pods: &'a dyn Fn(&str) -> Option<u32>,
    /// The other GpuPoolMigrations, for nodes two of them select.
    pub others: &'a [OtherMigration],
}

/// A DaemonSet to patch with its backend placement.
#[derive(Debug)]
pub struct PlacementPatch {
    pub namespace: String,
    pub name: String,
    pub patch: PlacementApply,
}

/// The gate's judgement of a pool.
#[derive(Debug)]
pub struct Gate {
    /// The prerequisites, with a device plugin the GPU Operator owns under a mode that would edit
    /// it counted as one (it is a prerequisite the admin must change).
    pub verdict: Verdict,
    /// The DeviceClasses to apply: missing, or differing from what the spec asks.
    pub class_applies: Vec<DeviceClass>,
    /// Each `spec.resources` entry's class as the cluster has it now.
    pub class_statuses: Vec<DeviceClassStatus>,
    pub classes: Readiness,
    pub classes_message: String,
    /// Each DaemonSet the migration names, with what its placement needs (`None`: missing).
    pub placement: Vec<(Role, DaemonSetRef, Option<Need>)>,
    /// The placement the operator applies itself (`placement: Managed`).
    pub placement_patches: Vec<PlacementPatch>,
    /// What a person must change in a DaemonSet's placement.
    pub placement_problems: Vec<String>,
    /// Both DaemonSets exist and keep to their backend (the device plugin's need not exist once
    /// nothing needs it: [`device_plugin_needed`]).
    pub placement_ready: bool,
    /// See [`device_plugin_needed`].
    pub device_plugin_needed: bool,
    /// The condition reason of a placement a person must change.
    pub placement_reason: &'static str,
    /// Nodes served by both backends (a node mid-switch is allowed both for the seconds it takes).
    pub overlaps: Vec<Overlap>,
    /// A pod on a migrated node that holds a device-plugin GPU, as the pods' check found it (the
    /// reconcile sets it, see [`Gate::hold_for_pod_overlap`]): an overlap too.
    pub pod_overlap: Option<String>,
    /// The pool's nodes as the plan read them, with their consuming pods.
    pub pool: Vec<PoolNode>,
    /// The rollout plan of the pool, as if the gate were open.
    pub plan: Plan,
    /// Whether new nodes may start: every check above passes.
    pub open: bool,
}

impl Gate {
    /// Closes the gate for a pod that holds a device-plugin GPU on a migrated node (`message`
    /// names it): no new node starts while the device plugin still serves a migrated one.
    pub fn hold_for_pod_overlap(&mut self, message: String) {
        self.pod_overlap = Some(message);
        self.open = false;
    }

    /// What stops nodes in flight at their next safe point: a pause, a failed node, or a closed
    /// gate (switching a node while its DeviceClass is shadowed, say, would strand its pods).
    pub fn hold(&self) -> Option<Hold> {
        match &self.plan.halt {
            Some(Halt::Paused) => Some(Hold::Paused),
            Some(Halt::NodeFailed(_)) => Some(Hold::NodeFailed),
            None if !self.open => Some(Hold::GateClosed),
            None => None,
        }
    }

    /// The first thing only a person can mend, as the `Stalled` condition's reason and message,
    /// in the order the operator reports them.
    pub fn needs_human(&self) -> Option<(&'static str, String)> {
        let p = &self.plan;
        if let Some(Halt::NodeFailed(n)) = &p.halt {
            Some((
                "NodeFailed",
                format!(
                    "node {n} failed and spec.strategy.onFailure is Pause; see status.failed, fix the node, then remove its switchyard.dev/migration-state annotation"
                ),
            ))
        } else if !self.verdict.met {
            Some(("PrerequisitesNotMet", self.verdict.message.clone()))
        } else if self.classes == Readiness::Shadowed {
            Some(("DeviceClassShadowed", self.classes_message.clone()))
        } else if !self.placement_problems.is_empty() {
            Some(("PlacementMissing", self.placement_problems.join("\n")))
        } else if let Some(o) = self.overlaps.first() {
            Some(("BackendOverlap", o.to_string()))
        } else if let Some(m) = &self.pod_overlap {
            Some(("BackendOverlap", m.clone()))
        } else if p.done() && !p.failed.is_empty() {
            Some(("NodesFailed", format!("{} node(s) failed to move; see status.failed", p.failed.len())))
        } else if p.done() && !p.refused.is_empty() {
            Some((
                "NodesRefused",
                format!(
                    "{} selected node(s) are refused: another GpuPoolMigration owns them or also selects them, so this migration cannot finish; see the NodeConflict condition, then delete one of the migrations or create one whose selector leaves them out",
                    p.refused.len()
                ),
            ))
        } else {
            None
        }
    }
}

/// The DeviceClasses to apply, each entry's class as the cluster has it now, and whether they are
/// ready: all exist and win their names, and none is being applied.
fn device_class_gate<N>(
    i: &Inputs<'_, N>,
) -> (Vec<DeviceClass>, Vec<DeviceClassStatus>, (Readiness, String)) {
    match i.device_classes {
        Some(all) => {
            let existing: Vec<ClassInfo> = all.iter().map(Into::into).collect();
            let applies: Vec<DeviceClass> =
                device_classes::desired_all_synced(i.spec, i.name, i.uid, &existing)
                    .into_iter()
                    .filter(|dc| {
                        let current = all.iter().find(|c| c.metadata.name == dc.metadata.name);
                        device_classes::needs_apply(dc, current)
                    })
                    .collect();
            let statuses = device_classes::statuses(i.spec, &existing);
            let applying: Vec<String> = applies.iter().filter_map(|c| c.metadata.name.clone()).collect();
            let readiness = device_classes::readiness(&statuses, &applying);
            (applies, statuses, readiness)
        }
        None => (
            Vec::new(),
            Vec::new(),
            (Readiness::ApiMissing, "resource.k8s.io/v1 deviceclasses is not served".to_string()),
        ),
    }
}

/// The PrerequisitesMet reason of a Replace migration whose target selector selects pool nodes.
pub const REASON_TARGET_OVERLAPS_POOL: &str = "TargetOverlapsPool";

/// Replace: the pool's nodes that `spec.strategy.replace.targetNodeSelector` selects too, said as
/// the problem to fix. A node in both pools would be drained onto itself.
fn target_overlap<N: Borrow<SlimNode>>(spec: &GpuPoolMigrationSpec, nodes: &[N]) -> Option<String> {
    let r = spec.strategy.replace()?;
    let query = match kube::core::Selector::try_from(r.target_node_selector.clone()) {
        Ok(s) => crate::node::str_map::LabelQuery::from(&s),
        Err(e) => return Some(format!("spec.strategy.replace.targetNodeSelector does not parse: {e}")),
    };
    let both: Vec<&str> = nodes
        .iter()
        .map(Borrow::borrow)
        .filter(|n| query.matches(n.labels()))
        .filter_map(|n| n.metadata.name.as_deref())
        .collect();
    (!both.is_empty()).then(|| {
        let shown: Vec<&str> = both.iter().take(5).copied().collect();
        let more = if both.len() > 5 { format!(" and {} more", both.len() - 5) } else { String::new() };
        format!(
            "spec.strategy.replace.targetNodeSelector also selects {} node(s) of spec.nodeSelector ({}{more}): a node cannot be drained onto itself; make the two selectors disjoint",
            both.len(),
            shown.join(", ")
        )
    })
}

/// Judges the pool: prerequisites, DeviceClasses, placement, overlap and the rollout plan. An
/// error is a spec the plan cannot be made from (`maxUnavailable`), said as the field's problem.
///
/// The DeviceClasses are judged as the cluster has them now: while an apply is in flight the
/// gate stays closed, and the DeviceClass watch brings the applied class and the next reconcile.
pub fn judge<N: Borrow<SlimNode>>(i: &Inputs<'_, N>) -> Result<Gate, String> {
    let spec = i.spec;
    let res = resources(spec);
    let judged = if spec.strategy.replace().is_some() { i.target_nodes } else { i.nodes };
    let versions = judged.iter().map(|n| node_versions(n.borrow())).collect();
    let device_plugin =
        DevicePluginFacts { exists: i.plugin_ds.is_some(), needed: device_plugin_needed(spec, i.nodes) };
    let verdict =
        pool_verdict(spec, i.facts, versions, i.nodes, i.driver_ds.is_some(), device_plugin, i.plugin_config);

    let (class_applies, class_statuses, (classes, classes_message)) = device_class_gate(i);

    let sequential = !spec.driver.interlocked();
    let mut placement = Vec::new();
    let mut placement_patches = Vec::new();
    let mut placement_problems = Vec::new();
    // A device plugin someone else keeps (reason, message): no edit of ours would stick.
    let mut kept_by_other: Option<(&'static str, String)> = None;
    let (dn, dp) = (&spec.driver.daemon_set, &spec.device_plugin.daemon_set);
    // Replace switches no node, so neither DaemonSet needs the backend affinity: the target pool
    // is the driver's and the old pool the device plugin's, as the provider set them up.
    let daemon_sets = if spec.strategy.replace().is_some() {
        vec![]
    } else {
        vec![(i.plugin_ds, Role::DevicePlugin, dp), (i.driver_ds, Role::Driver, dn)]
    };
    for (ds, role, r) in daemon_sets {
        let need = ds.map(|ds| placement::need(spec.placement, ds, role, sequential));
        match &need {
            None | Some(Need::Placed) => {}
            Some(Need::Patch(patch)) => placement_patches.push(PlacementPatch {
                namespace: r.namespace.clone(),
                name: r.name.clone(),
                patch: (**patch).clone(),
            }),
            Some(Need::ByHand { message, .. }) => placement_problems.push(message.clone()),
            Some(Need::GpuOperatorOwned { message }) => {
                placement_problems.push(message.clone());
                kept_by_other = Some((placement::REASON_GPU_OPERATOR_OWNED, message.clone()));
            }
            Some(Need::AddonManaged { message }) => {
                placement_problems.push(message.clone());
                kept_by_other = Some((placement::REASON_ADDON_MANAGED, message.clone()));
            }
        }
        placement.push((role, r.clone(), need));
    }
    let placement_ready = placement_problems.is_empty()
        && placement_patches.is_empty()
        && i.driver_ds.is_some()
        && (i.plugin_ds.is_some() || !device_plugin.needed);
    // A device plugin the GPU Operator or an addon manager keeps, under a mode that would edit
    // it, is a prerequisite the admin must change, and says so where admins look first; an
    // earlier block stays the one shown.
    let placement_reason = kept_by_other.as_ref().map_or("NodeAffinityMissing", |(reason, _)| reason);
    let verdict = match kept_by_other {
        Some((reason, message)) if verdict.met => Verdict { met: false, reason, message, ..verdict },
        _ => verdict,
    };
    let verdict = match target_overlap(spec, i.nodes) {
        Some(message) if verdict.met => {
            Verdict { met: false, reason: REASON_TARGET_OVERLAPS_POOL, message, ..verdict }
        }
        _ => verdict,
    };

    // Not a node mid-switch, nor one rolling back: a rolling-back node that held DRA devices
    // goes back to the device plugin only under Switchyard's NoSchedule DeviceTaintRule on its
    // devices, kept until the driver has withdrawn them. A third-party driver's kubelet plugin
    // (NVIDIA's) leaves its slices untainted for the kubelet to remove about 30 s after it stops;
    // the rule, not the slices, keeps the scheduler off them then.
    let overlaps: Vec<Overlap> = i
        .nodes
        .iter()
        .map(Borrow::borrow)
        .filter(|n| !matches!(record::node_state(n), NodeState::Switching | NodeState::RollingBack))
        .filter_map(|n| overlap::check(n, &res, (i.schedulable)(n)))
        .collect();

    let mut pool: Vec<PoolNode> = i.nodes.iter().map(|n| PoolNode::from_node(n.borrow())).collect();
    for pn in pool.iter_mut() {
        if let Some(c) = (i.consuming_pods)(&pn.name) {
            pn.consuming_pods = c;
        }
    }
    let plan = rollout::plan(i.name, spec, &pool, i.others)?;
    let open = verdict.met && classes.ready() && placement_ready && overlaps.is_empty();
    Ok(Gate {
        verdict,
        class_applies,
        class_statuses,
        classes,
        classes_message,
        placement,
        placement_patches,
        placement_problems,
        placement_ready,
        device_plugin_needed: device_plugin.needed,
        placement_reason,
        overlaps,
        pod_overlap: None,
        pool,
        plan,
        open,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{gpu_node, merge_patch, placed_daemon_set, server_v1_37};
    use crate::well_known::{ANNOTATION_FAILURE, ANNOTATION_MIGRATION_STATE, LABEL_MIGRATION};
    use serde_json::{Value, json};

    const DRIVER: &str = "gpu.switchyard.dev";

    fn spec(patch: Value) -> GpuPoolMigrationSpec {
        let mut v = json!({
            "nodeSelector": {"matchLabels": {"pool": "a100"}},
            "resources": [{"extendedResourceName": "nvidia.com/gpu", "deviceClassName": DRIVER}],
            "driver": {"name": DRIVER, "daemonSet": {"namespace": "switchyard", "name": "driver"}},
            "devicePlugin": {"daemonSet": {"namespace": "gpu", "name": "plugin"}},
            "strategy": {"maxUnavailable": 1, "onFailure": "Pause"}
        });
        merge_patch(&mut v, &patch);
        serde_json::from_value(v).expect("a valid spec")
    }

    /// The pool as it stands once the operator's first reconcile has applied what it applies:
    /// both DaemonSets placed, the classes it asks for present, two nodes on the device plugin.
    struct Pool {
        spec: GpuPoolMigrationSpec,
        nodes: Vec<SlimNode>,
        classes: Vec<DeviceClass>,
        driver: Option<DaemonSet>,
        plugin: Option<DaemonSet>,
        plugin_config: Option<PluginConfig>,
        schedulable: u64,
        targets: Vec<SlimNode>,
    }

    impl Pool {
        fn ready(patch: Value) -> Self {
            let spec = spec(patch);
            // As the API server persists them: with a creation time, so they compete for their name.
            let mut classes = device_classes::desired_all_synced(&spec, "pool-a", "uid-1", &[]);
            for c in &mut classes {
                c.metadata.creation_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                    "2026-12-01T00:00:00Z".parse().unwrap(),
                ));
            }
            Pool {
                nodes: vec![gpu_node("n1", &json!({})), gpu_node("n2", &json!({}))],
                classes,
                driver: Some(placed_daemon_set("switchyard", "driver", Role::Driver)),
                plugin: Some(placed_daemon_set("gpu", "plugin", Role::DevicePlugin)),
                plugin_config: None,
                schedulable: 0,
                targets: Vec::new(),
                spec,
            }
        }

        fn judge(&self) -> Gate {
            let schedulable = |_: &SlimNode| self.schedulable;
            let consuming = |_: &str| None;
            judge(&Inputs {
                name: "pool-a",
                uid: "uid-1",
                spec: &self.spec,
                facts: &server_v1_37(),
                nodes: &self.nodes,
                target_nodes: &self.targets,
                device_classes: Some(&self.classes),
                driver_ds: self.driver.as_ref(),
                plugin_ds: self.plugin.as_ref(),
                plugin_config: self.plugin_config.as_ref(),
                schedulable: &schedulable,
                consuming_pods: &consuming,
                others: &[],
            })
            .expect("a plan")
        }
    }

    #[test]
    fn the_gate_opens_only_when_every_check_passes_and_names_the_first_that_needs_a_person() {
        let ready = Pool::ready(json!({})).judge();
        assert!(ready.open, "{ready:?}");
        assert_eq!((ready.hold(), ready.needs_human()), (None, None));
        assert_eq!(ready.plan.to_start, ["n1"], "maxUnavailable 1: one node starts");

        type Case = (&'static str, fn(&mut Pool), Option<&'static str>, Option<Hold>);
        let cases: Vec<Case> = vec![
            (
                "the driver's DaemonSet is missing",
                |p| p.driver = None,
                Some("PrerequisitesNotMet"),
                Some(Hold::GateClosed),
            ),
            (
                "a DeviceClass is still to be applied: the operator applies it, nobody is needed",
                |p| p.classes.clear(),
                None,
                Some(Hold::GateClosed),
            ),
            (
                "the device plugin lacks its placement under Managed: the operator patches it",
                |p| {
                    p.plugin = Some(
                        serde_json::from_value(json!({"metadata": {"namespace": "gpu", "name": "plugin"},
                    "spec": {"selector": {}, "template": {"spec": {"containers": []}}}}))
                        .unwrap(),
                    )
                },
                None,
                Some(Hold::GateClosed),
            ),
            (
                "a node on the device plugin also has schedulable DRA devices",
                |p| p.schedulable = 8,
                Some("BackendOverlap"),
                Some(Hold::GateClosed),
            ),
            (
                "a node rolling back, on the device plugin again, its DRA devices under the rule",
                |p| {
                    p.schedulable = 2;
                    for (i, n) in ["n1", "n2"].iter().enumerate() {
                        p.nodes[i] = gpu_node(
                            n,
                            &json!({"metadata": {"labels": {LABEL_MIGRATION: "pool-a"},
                                "annotations": {ANNOTATION_MIGRATION_STATE: "RollingBack"}}}),
                        );
                    }
                },
                None,
                None,
            ),
            (
                "no GFD labels, and the device plugin's config time-slices the GPUs of n2",
                |p| {
                    use crate::pool::plugin_config::{ConfigSource, DEFAULT_NODE_LABEL, Pick};
                    let ts = "sharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 4\n";
                    p.plugin_config = Some(PluginConfig::new(
                        ConfigSource {
                            namespace: "gpu".into(),
                            config_map: "plugin-configs".into(),
                            pick: Pick::PerNode {
                                node_label: DEFAULT_NODE_LABEL.into(),
                                default: None,
                                fallbacks: vec!["named".into()],
                            },
                        },
                        Ok([
                            ("default".to_string(), "version: v1\n".to_string()),
                            ("ts".to_string(), ts.to_string()),
                        ]
                        .into()),
                    ));
                    p.nodes[1] = gpu_node("n2", &json!({"metadata": {"labels": {DEFAULT_NODE_LABEL: "ts"}}}));
                },
                Some("PrerequisitesNotMet"),
                Some(Hold::GateClosed),
            ),
            ("spec.paused", |p| p.spec.paused = true, None, Some(Hold::Paused)),
            (
                "a node failed under onFailure: Pause",
                |p| {
                    p.nodes[1] = gpu_node(
                        "n2",
                        &json!({"metadata": {"labels": {LABEL_MIGRATION: "pool-a"}, "annotations": {
                            ANNOTATION_MIGRATION_STATE: "Failed",
                            ANNOTATION_FAILURE: r#"{"state":"Draining","reason":"DrainTimeout","message":"m"}"#}}}),
                    )
                },
                Some("NodeFailed"),
                Some(Hold::NodeFailed),
            ),
        ];
        for (name, change, human, hold) in cases {
            let mut pool = Pool::ready(json!({}));
            change(&mut pool);
            let g = pool.judge();
            assert_eq!(g.needs_human().map(|(r, _)| r), human, "{name}");
            assert_eq!(g.hold(), hold, "{name}");
            assert_eq!(g.open, hold != Some(Hold::GateClosed), "{name}: {g:?}");
            if name.contains("config time-slices") {
                assert_eq!(g.verdict.reason, "GpuSharingNotAcknowledged");
                assert!(
                    g.verdict.message.starts_with("nvidia.com/gpu capacity drops from 8 to 2 on 1 node(s) that share it through the device plugin (n2: 8 on 2 GPU(s), time-slicing, 4 replicas per GPU (the device plugin's config gpu/plugin-configs, key ts))"),
                    "{}",
                    g.verdict.message
                );
            }
        }
    }

    #[test]
    fn the_device_plugin_is_needed_while_a_node_left_to_move_is_on_it() {
        let moved = || {
            gpu_node(
                "m",
                &json!({"metadata": {"labels": {"switchyard.dev/gpu-backend": "dra"},
                    "annotations": {ANNOTATION_MIGRATION_STATE: "Migrated"}}}),
            )
        };
        let unserved = || {
            gpu_node(
                "u",
                &json!({"status": {"capacity": {"nvidia.com/gpu": "0"}, "allocatable": {"nvidia.com/gpu": "0"}}}),
            )
        };
        let served = || gpu_node("s", &json!({}));
        // (case, spec patch, nodes, needed)
        let cases: Vec<(&str, Value, Vec<SlimNode>, bool)> = vec![
            ("every node moved", json!({}), vec![moved(), moved()], false),
            ("a node left on the device plugin", json!({}), vec![moved(), served()], true),
            ("a node left that no plugin serves", json!({}), vec![moved(), unserved()], false),
            ("a rollback returns nodes to it", json!({"direction": "Rollback"}), vec![moved()], true),
            (
                "onFailure: Rollback with a node left to move",
                json!({"strategy": {"onFailure": "Rollback"}}),
                vec![moved(), unserved()],
                true,
            ),
            (
                "onFailure: Rollback with every node moved",
                json!({"strategy": {"onFailure": "Rollback"}}),
                vec![moved()],
                false,
            ),
        ];
        for (case, patch, nodes, want) in cases {
            assert_eq!(device_plugin_needed(&spec(patch), &nodes), want, "{case}");
        }
    }

    #[test]
    fn replace_edits_no_daemon_set_and_refuses_a_target_that_overlaps_the_pool() {
        let replace = json!({"strategy": {"type": "Replace", "replace": {"targetNodeSelector": {"matchLabels": {"pool": "dra"}}}}});
        // A provider's device plugin, an addon manager keeping it, no affinity on either
        // DaemonSet: nothing for a Replace migration to patch or to ask for.
        let mut pool = Pool::ready(replace.clone());
        pool.plugin = Some(
            serde_json::from_value(json!({
                "metadata": {"namespace": "kube-system", "name": "nvidia-gpu-device-plugin",
                    "labels": {placement::LABEL_ADDON_MANAGER_MODE: "Reconcile"}},
                "spec": {"selector": {}, "template": {"spec": {"containers": []}}}
            }))
            .unwrap(),
        );
        pool.driver = Some(
            serde_json::from_value(json!({
                "metadata": {"namespace": "switchyard", "name": "driver"},
                "spec": {"selector": {}, "template": {"spec": {"containers": []}}}
            }))
            .unwrap(),
        );
        let g = pool.judge();
        assert!(g.placement.is_empty() && g.placement_patches.is_empty(), "{:?}", g.placement);
        assert!(g.placement_ready && g.verdict.met && g.open, "{:?}", g.verdict);
        assert!(!g.device_plugin_needed);

        // The old nodes never serve DRA: their kubelets may be older. The target's may not.
        let old_kubelet = json!({"status": {"nodeInfo": {"kubeletVersion": "v1.33.4"}}});
        pool.nodes = vec![gpu_node("n1", &old_kubelet)];
        assert!(pool.judge().verdict.met, "{:?}", pool.judge().verdict);
        pool.targets = vec![gpu_node("t1", &old_kubelet)];
        let g = pool.judge();
        assert_eq!((g.verdict.met, g.verdict.reason), (false, "KubeletTooOld"), "{}", g.verdict.message);
        assert!(g.verdict.message.contains("t1"), "{}", g.verdict.message);
        pool.targets = vec![gpu_node("t1", &json!({}))];

        // Without the driver's DaemonSet, the target pool has nothing to serve it.
        pool.driver = None;
        assert!(!pool.judge().placement_ready);

        // A pool node the target selector selects too.
        let mut pool = Pool::ready(replace);
        pool.nodes.push(gpu_node("n3", &json!({"metadata": {"labels": {"pool": "dra"}}})));
        let g = pool.judge();
        assert!(!g.verdict.met && !g.open);
        assert_eq!(g.verdict.reason, REASON_TARGET_OVERLAPS_POOL);
        assert!(
            g.verdict.message.contains("selects 1 node(s) of spec.nodeSelector (n3)"),
            "{}",
            g.verdict.message
        );
        assert!(
            g.verdict.message.contains("spec.strategy.replace.targetNodeSelector"),
            "{}",
            g.verdict.message
        );
    }

    #[test]
    fn a_device_plugin_an_addon_manager_keeps_is_a_prerequisite_whatever_the_mode() {
        for mode in ["Managed", "Verify", "GpuOperator"] {
            let mut pool = Pool::ready(json!({"placement": mode}));
            pool.plugin = Some(
                serde_json::from_value(
                    json!({"metadata": {"namespace": "kube-system", "name": "nvidia-gpu-device-plugin",
                    "labels": {placement::LABEL_ADDON_MANAGER_MODE: "Reconcile"}},
                    "spec": {"selector": {}, "template": {"spec": {"containers": []}}}}),
                )
                .unwrap(),
            );
            let g = pool.judge();
            assert!(!g.open, "{mode}");
            assert_eq!(g.verdict.reason, placement::REASON_ADDON_MANAGED, "{mode}: {:?}", g.verdict);
            assert!(g.verdict.message.contains("new node pool"), "{mode}: {}", g.verdict.message);
            assert_eq!(g.placement_reason, placement::REASON_ADDON_MANAGED, "{mode}");
            assert!(g.placement_patches.is_empty(), "{mode}: nothing is patched");
            assert_eq!(g.needs_human().map(|(r, _)| r), Some("PrerequisitesNotMet"), "{mode}");
        }
    }

    #[test]
    fn a_device_plugin_the_gpu_operator_owns_is_a_prerequisite_under_managed() {
        let mut pool = Pool::ready(json!({}));
        pool.plugin = Some(
            serde_json::from_value(json!({"metadata": {"namespace": "gpu", "name": "plugin",
                "ownerReferences": [{"apiVersion": "nvidia.com/v1", "kind": "ClusterPolicy", "name": "cluster-policy",
                    "uid": "u", "controller": true}]},
                "spec": {"selector": {}, "template": {"spec": {"containers": []}}}}))
            .unwrap(),
        );
        let g = pool.judge();
        assert!(!g.open);
        assert_eq!(g.verdict.reason, placement::REASON_GPU_OPERATOR_OWNED, "{:?}", g.verdict);
        assert_eq!(g.placement_reason, placement::REASON_GPU_OPERATOR_OWNED);
        assert!(matches!(g.placement[0], (Role::DevicePlugin, _, Some(Need::GpuOperatorOwned { .. }))));
        assert_eq!(g.needs_human().map(|(r, _)| r), Some("PrerequisitesNotMet"));
    }
}
