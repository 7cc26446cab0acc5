//! `switchyard plan`: what a migration would do, judged by the operator's own gate
//! ([`gate::judge`]: prerequisites, DeviceClasses, placement, overlap and the rollout plan) and
//! drain, without changing anything. Pure: the CLI gathers [`Inputs`], [`build`] returns the
//! [`Report`].
//!
//! The node order is the order the operator starts nodes in today: nodes already in flight, then
//! candidates with the fewest GPU pods first. Waves assume each wave finishes before the next one
//! starts; pods that move in the meantime can reorder later waves.

use std::collections::{BTreeMap, HashSet};

use crate::node::slim::SlimNode;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::resource::v1::{Device, DeviceClass, ResourceSlice};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::core::{Selector, SelectorExt};
use serde::Serialize;

use crate::api::v1alpha1::{Direction, GpuPoolMigrationSpec, NodeState, PlacementMode, PodSelection};
use crate::node::drain;
use crate::node::forecast::{self, Forecast};
use crate::node::record::{self, Backend, PoolNode};
use crate::node::state::Observed;
use crate::pool::capacity;
use crate::pool::device_classes::{self, ClassInfo};
use crate::pool::gate;
use crate::pool::overlap;
use crate::pool::placement::{self, Need, Role};
use crate::pool::prerequisites::ServerFacts;
use crate::pool::readers::{self, Finding, Severity};
use crate::pool::replace;
use crate::pool::rollout::{Halt, OtherMigration, Plan};
use crate::pool::selectors;
use crate::well_known::LABEL_GPU_OPERATOR_DEVICE_PLUGIN;

/// Everything the preview reads.
#[derive(Clone, Debug)]
pub struct Inputs {
    pub name: String,
    pub spec: GpuPoolMigrationSpec,
    /// True when the GpuPoolMigration already exists in the cluster.
    pub exists: bool,
    /// Its uid when it exists (empty for a manifest not applied yet).
    pub uid: String,
    /// The nodes `spec.nodeSelector` selects.
    pub nodes: Vec<SlimNode>,
    /// Pods per node name (only nodes that may move need an entry): those the plan judges one by
    /// one. A caller may keep only the pods [`pod_use`] calls [`PodUse::Judged`] and count the
    /// [`PodUse::Counted`] ones in `other_pods`; the report is the same as with every pod here.
    pub pods: BTreeMap<String, Vec<Pod>>,
    /// Per node name, the pods left out of `pods` that a drain would leave running on the node.
    pub other_pods: BTreeMap<String, u32>,
    pub pdbs: Vec<PodDisruptionBudget>,
    /// What discovery says about the API server (the prerequisites judge it).
    pub facts: ServerFacts,
    pub device_classes: Vec<DeviceClass>,
    pub driver_daemonset: Option<DaemonSet>,
    pub device_plugin_daemonset: Option<DaemonSet>,
    /// The device plugin's config, where its DaemonSet takes one from a ConfigMap.
    pub device_plugin_config: Option<crate::pool::plugin_config::PluginConfig>,
    pub others: Vec<OtherMigration>,
    pub slices: Vec<ResourceSlice>,
    pub findings: Vec<Finding>,
    pub skipped: Vec<String>,
    pub now: Timestamp,
    /// Replace: the target pool as read (`None` for an in-place migration, or when not read).
    pub target: Option<TargetInputs>,
}

pub use replace::TargetInputs;

/// A Replace migration's plan on its target pool: the room before anything moves, and whether
/// each node's GPU pods fit when its turn comes (judged in the move order, each on what the nodes
/// before it leave, as the operator judges them).
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ReplacePlan {
    /// Target nodes that are Ready and schedulable.
    pub target_nodes: u64,
    /// Per resource, the target's devices and what is free of them now.
    pub capacity: Vec<replace::ResourceRoom>,
    /// What the GPU pods of every node left to move ask for, per resource.
    pub needed: replace::Demand,
    /// Each node left to move, in order.
    pub nodes: Vec<ReplaceNode>,
}

#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ReplaceNode {
    pub name: String,
    /// What the node's GPU pods ask for.
    pub needs: replace::Demand,
    /// Whether they fit on what the target has left when the node's turn comes.
    pub fits: bool,
    /// What is missing when they do not.
    pub short: String,
}

#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    pub migration: String,
    pub exists: bool,
    pub direction: Direction,
    pub max_unavailable: u32,
    pub prerequisites: Prerequisites,
    pub nodes: Vec<NodePlan>,
    pub device_classes: Vec<ClassPlan>,
    pub placement: Vec<PlacementPlan>,
    pub inventory: InventoryReport,
    pub summary: Summary,
    /// Why the migration would not start (or would stop) now; empty when it can go.
    pub blockers: Vec<String>,
    /// `strategy.type: Replace`: the target pool's room and what each node needs of it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replace: Option<ReplacePlan>,
}

#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Prerequisites {
    pub met: bool,
    pub reason: String,
    pub message: String,
    pub warnings: Vec<String>,
    /// The control plane's versions as the cluster shows them, the API server first:
    /// `kube-scheduler v1.37.2 (its pod's image)`, or `kube-scheduler unknown (...)`.
    pub control_plane: Vec<String>,
}

/// What happens to one node.
#[derive(Clone, Copy, Debug, Serialize, PartialEq, Eq)]
pub enum NodeAction {
    /// Will move, in `wave`.
    Moves,
    /// Already moving; the operator continues it first.
    InFlight,
    /// Already where the direction wants it.
    Done,
    /// Selected, but another migration owns or selects it.
    Refused,
    /// Failed earlier; a human re-queues it.
    Failed,
}

#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct NodePlan {
    /// 1-based position in the move order; `None` for nodes that do not move.
    pub order: Option<u32>,
    /// 0 for nodes already in flight, 1 for those that may start beside them now, then groups
    /// of `maxUnavailable`.
    pub wave: Option<u32>,
    pub name: String,
    pub action: NodeAction,
    pub state: NodeState,
    pub backend: String,
    pub ready: bool,
    pub cordoned: bool,
    /// GPUs the node serves now (device-plugin allocatable, or DRA devices).
    pub gpus: u64,
    /// Pods the drain evicts (or, rolling back, the DRA claim holders the taint rule evicts).
    pub evict: Vec<PodPlan>,
    /// Pods that stay on the node (DaemonSet and mirror pods not counted).
    pub stay: u32,
    pub note: String,
}

/// Something about a pod that makes its eviction worth a look.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
#[serde(tag = "flag", rename_all = "camelCase")]
pub enum PodFlag {
    /// A PodDisruptionBudget covering the pod allows no disruption now: the eviction waits.
    PdbBlocks { pdb: String },
    /// No controller owns the pod: once evicted, nothing recreates it.
    NoController,
    /// Uses emptyDir; `deleted` says whether the drain deletes the data (deleteEmptyDirData) or
    /// waits for the pod to go.
    EmptyDir { deleted: bool },
    /// Already terminating; the drain waits for it.
    Terminating,
}

#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct PodPlan {
    pub namespace: String,
    pub name: String,
    /// Requests one of the migration's resources (or, rolling back, holds a DRA claim).
    pub uses_gpu: bool,
    pub flags: Vec<PodFlag>,
}

#[derive(Clone, Copy, Debug, Serialize, PartialEq, Eq)]
pub enum ClassAction {
    Create,
    Update,
    Unchanged,
}

#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ClassPlan {
    pub name: String,
    pub extended_resource_name: String,
    pub action: ClassAction,
    /// Whether the scheduler will use this class for the name once it is applied.
    pub effective: bool,
    pub shadowed_by: String,
    /// What the class's selector selects of the driver's devices.
    pub selector: SelectorCheck,
}

/// What a class's selector was checked against.
#[derive(Clone, Copy, Debug, Serialize, PartialEq, Eq)]
pub enum SelectorBasis {
    /// Evaluated on the devices the driver publishes now (its ResourceSlices, on any node).
    PublishedDevices,
    /// The driver publishes nothing yet (its DaemonSet runs only on `dra` nodes): the attributes
    /// the selector reads were checked against those the driver is known to publish.
    KnownAttributes,
    /// The driver publishes nothing yet and is not one whose attributes are known: the first
    /// node's switch waits until the class selects its devices.
    NotChecked,
}

/// A DeviceClass selector against the driver's devices.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct SelectorCheck {
    pub checked_against: SelectorBasis,
    /// Devices the driver publishes, and on how many nodes.
    pub devices: u64,
    pub nodes: u64,
    /// Of those, the ones the selector selects.
    pub selected: u64,
    /// What would keep the class from serving pods; each is also a blocker.
    pub problems: Vec<String>,
}

#[derive(Clone, Copy, Debug, Serialize, PartialEq, Eq)]
pub enum PlacementAction {
    /// The DaemonSet already keeps to its backend.
    AlreadyPlaced,
    /// The operator adds the node affinity (placement: Managed).
    AddNodeAffinity,
    /// An admin must add it (placement: Verify); `snippet` has the YAML, `message` says how.
    AddByHand,
    /// The GPU Operator's device plugin under `placement: GpuOperator`: nodes switch by their
    /// `nvidia.com/gpu.deploy.device-plugin` label and no DaemonSet is edited.
    SwitchByNodeLabel,
    /// The GPU Operator owns the device plugin and the mode would edit it: use
    /// `placement: GpuOperator` (`message` says why).
    UseGpuOperatorPlacement,
    /// A managed cluster's addon manager keeps the device plugin (`addonmanager.kubernetes.io/mode:
    /// Reconcile`): no mode can move the pool in place (`message` says what to do instead).
    AddonManaged,
    /// The DaemonSet does not exist.
    Missing,
    /// The device plugin's DaemonSet is gone and the migration no longer needs it: it serves no
    /// node the migration has still to move (the runbook's last step deleted it).
    Removed,
}

#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct PlacementPlan {
    pub daemon_set: String,
    pub role: String,
    pub action: PlacementAction,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub snippet: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub message: String,
}

#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct InventoryReport {
    pub summary: String,
    pub findings: Vec<Finding>,
    pub skipped: Vec<String>,
}

#[derive(Clone, Debug, Default, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Summary {
    pub nodes_selected: u32,
    pub nodes_to_move: u32,
    pub waves: u32,
    pub gpus_to_move: u64,
    pub pods_to_evict: u32,
    pub gpu_pods_to_evict: u32,
    pub pods_blocked_by_pdb: u32,
    pub bare_pods: u32,
    pub empty_dir_pods: u32,
}

fn role_name(role: Role) -> &'static str {
    match role {
        Role::DevicePlugin => "device plugin",
        Role::Driver => "DRA driver",
    }
}

fn pdb_blocking(pdbs: &[PodDisruptionBudget], pod: &Pod) -> Option<String> {
    let ns = pod.namespace().unwrap_or_default();
    let labels = pod.labels();
    pdbs.iter()
        .filter(|p| p.namespace().as_deref() == Some(ns.as_str()))
        .filter(|p| p.status.as_ref().is_some_and(|s| s.disruptions_allowed.unwrap_or(0) <= 0))
        .find(|p| {
            p.spec
                .as_ref()
                .and_then(|s| s.selector.clone())
                .and_then(|s| Selector::try_from(s).ok())
                .is_some_and(|s| s.matches(labels))
        })
        .map(|p| format!("{ns}/{}", p.name_any()))
}

fn pod_plan(pod: &Pod, uses_gpu: bool, pdbs: &[PodDisruptionBudget], delete_empty_dir: bool) -> PodPlan {
    let mut flags = Vec::new();
    if let Some(pdb) = pdb_blocking(pdbs, pod) {
        flags.push(PodFlag::PdbBlocks { pdb });
    }
    if drain::is_unmanaged(pod) {
        flags.push(PodFlag::NoController);
    }
    if drain::uses_empty_dir(pod) {
        flags.push(PodFlag::EmptyDir { deleted: delete_empty_dir });
    }
    if pod.metadata.deletion_timestamp.is_some() {
        flags.push(PodFlag::Terminating);
    }
    PodPlan { namespace: pod.namespace().unwrap_or_default(), name: pod.name_any(), uses_gpu, flags }
}

/// How a plan reads a pod of a pool node (see [`Inputs::pods`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PodUse {
    /// Judged one by one: it may be evicted, hold a GPU or block a drain.
    Judged,
    /// Only counted among the pods a drain leaves running on the node.
    Counted,
    /// Not read at all (finished, or a DaemonSet or mirror pod holding no GPU).
    Ignored,
}

/// How the plan of `spec` reads `pod`: a pool of 5,000 nodes and 50,000 pods holds only the
/// few thousand it judges, not every pod.
pub fn pod_use(spec: &GpuPoolMigrationSpec, pod: &Pod) -> PodUse {
    let res: Vec<&str> = spec.resources.iter().map(|r| r.extended_resource_name.as_str()).collect();
    let every_pod = spec.direction == Direction::Forward
        && spec.strategy.drain.pod_selection != PodSelection::ResourceConsumers;
    if drain::consumes_any(pod, &res) || drain::holds_dra_claim(pod) || (every_pod && movable(pod)) {
        PodUse::Judged
    } else if movable(pod) {
        PodUse::Counted
    } else {
        PodUse::Ignored
    }
}

/// A pod a drain either moves or leaves running: not finished, not a DaemonSet or mirror pod.
fn movable(pod: &Pod) -> bool {
    !drain::is_finished(pod) && !drain::is_daemonset_pod(pod) && !drain::is_mirror_pod(pod)
}

/// The pods a node's move evicts, and how many stay.
fn evictions(inputs: &Inputs, node: &str) -> (Vec<PodPlan>, u32) {
    let spec = &inputs.spec;
    let res: Vec<&str> = spec.resources.iter().map(|r| r.extended_resource_name.as_str()).collect();
    let pods = inputs.pods.get(node).map(Vec::as_slice).unwrap_or_default();
    let drain = &spec.strategy.drain;
    let mut evict = Vec::new();
    match spec.direction {
        Direction::Forward => {
            let sel = drain::select(pods, &res, drain);
            for p in pods {
                let key = drain::PodRef { namespace: p.namespace().unwrap_or_default(), name: p.name_any() };
                if sel.evict.contains(&key)
                    || sel.unmanaged.contains(&key)
                    || sel.blocked_by_empty_dir.contains(&key)
                    || sel.terminating.contains(&key)
                {
                    evict.push(pod_plan(
                        p,
                        drain::consumes_any(p, &res),
                        &inputs.pdbs,
                        drain.delete_empty_dir_data,
                    ));
                }
            }
        }
        Direction::Rollback => {
            for p in pods.iter().filter(|p| drain::holds_dra_claim(p)) {
                evict.push(pod_plan(p, true, &inputs.pdbs, true));
            }
        }
    }
    evict.sort_by(|a, b| (b.uses_gpu, &a.namespace, &a.name).cmp(&(a.uses_gpu, &b.namespace, &b.name)));
    // DaemonSet and mirror pods neither move nor stay in the drain's sense; finished pods hold nothing.
    let movable = pods.iter().filter(|p| movable(p)).count() as u32
        + inputs.other_pods.get(node).copied().unwrap_or_default();
    let stay = movable.saturating_sub(evict.len() as u32);
    (evict, stay)
}

fn gpus(inputs: &Inputs, node: &SlimNode) -> u64 {
    let res: Vec<&str> = inputs.spec.resources.iter().map(|r| r.extended_resource_name.as_str()).collect();
    let pn = PoolNode::from_node(node);
    match pn.backend() {
        Backend::DevicePlugin => overlap::allocatable_total(node, &res),
        Backend::Dra => overlap::dra_devices(&inputs.slices, &inputs.spec.driver.name, &pn.name),
        Backend::None => 0,
    }
}

fn class_plans(inputs: &Inputs) -> Vec<ClassPlan> {
    let spec = &inputs.spec;
    let mut after: Vec<ClassInfo> = inputs.device_classes.iter().map(Into::into).collect();
    let mut actions = BTreeMap::new();
    let existing: Vec<ClassInfo> = inputs.device_classes.iter().map(Into::into).collect();
    for dc in device_classes::desired_all_synced(spec, &inputs.name, &inputs.uid, &existing) {
        let name = dc.metadata.name.clone().unwrap_or_default();
        let current =
            inputs.device_classes.iter().find(|c| c.metadata.name.as_deref() == Some(name.as_str()));
        let action = match (current, device_classes::needs_apply(&dc, current)) {
            (None, _) => ClassAction::Create,
            (Some(_), true) => ClassAction::Update,
            (Some(_), false) => ClassAction::Unchanged,
        };
        if current.is_none() {
            // Created now: the newest class for its name, as the scheduler will see it.
            let mut info = ClassInfo::from(&dc);
            info.created = Some(inputs.now);
            after.push(info);
        } else if let Some(i) = after.iter_mut().find(|i| i.name == name) {
            i.extended_resource_name = dc.spec.as_ref().and_then(|s| s.extended_resource_name.clone());
        }
        actions.insert(name, action);
    }
    let mut checks = selector_checks(inputs).into_iter();
    device_classes::statuses(spec, &after)
        .into_iter()
        .map(|s| ClassPlan {
            selector: checks.next().expect("one check per spec.resources entry, as statuses"),
            action: actions.get(&s.name).copied().unwrap_or(ClassAction::Unchanged),
            name: s.name,
            extended_resource_name: s.extended_resource_name,
            effective: s.effective,
            shadowed_by: s.shadowed_by,
        })
        .collect()
}

/// Each `spec.resources` entry's selector against what the driver publishes, in entry order.
fn selector_checks(inputs: &Inputs) -> Vec<SelectorCheck> {
    let spec = &inputs.spec;
    let driver = spec.driver.name.as_str();
    let slices: Vec<ResourceSlice> = inputs
        .slices
        .iter()
        .filter(|s| s.spec.driver == driver && s.spec.node_name.is_some())
        .cloned()
        .collect();
    let devices: Vec<&Device> = slices.iter().flat_map(|s| s.spec.devices.iter().flatten()).collect();
    let nodes = slices
        .iter()
        .filter_map(|s| s.spec.node_name.as_deref())
        .collect::<std::collections::BTreeSet<_>>()
        .len() as u64;
    let published = selectors::published_attributes(driver, &slices);
    let matches = selectors::Selectors::new(spec).evaluate(devices.iter().copied());
    spec.resources
        .iter()
        .zip(matches)
        .map(|(r, m)| {
            let expression = r.selector.clone().unwrap_or_default();
            let unknown = selectors::unknown_attributes(driver, &expression, &published);
            let mut problems: Vec<String> = unknown.clone().unwrap_or_default();
            let checked_against = if !devices.is_empty() {
                if m.selected == 0 && m.uncompiled.is_none() {
                    let mut p = format!(
                        "selects none of the {} device(s) {driver} publishes on {nodes} node(s)",
                        m.devices
                    );
                    if let Some(e) = &m.first_error {
                        p.push_str(&format!("; the selector fails {e}"));
                    }
                    problems.push(p);
                }
                SelectorBasis::PublishedDevices
            } else if unknown.is_some() {
                SelectorBasis::KnownAttributes
            } else {
                SelectorBasis::NotChecked
            };
            SelectorCheck { checked_against, devices: m.devices, nodes, selected: m.selected, problems }
        })
        .collect()
}

fn placement_plans(inputs: &Inputs, judged: &gate::Gate) -> Vec<PlacementPlan> {
    let spec = &inputs.spec;
    let ds_of = |role: Role| match role {
        Role::DevicePlugin => inputs.device_plugin_daemonset.as_ref(),
        Role::Driver => inputs.driver_daemonset.as_ref(),
    };
    judged
        .placement
        .iter()
        .map(|(role, r, need)| {
            let role = *role;
            let by_label = role == Role::DevicePlugin && spec.placement == PlacementMode::GpuOperator;
            let (action, snippet, message) = match (ds_of(role), need) {
                (Some(_), Some(Need::Placed)) if by_label => (
                    PlacementAction::SwitchByNodeLabel,
                    String::new(),
                    format!(
                        "each node switches by its {LABEL_GPU_OPERATOR_DEVICE_PLUGIN} label, restored on rollback"
                    ),
                ),
                (Some(_), Some(Need::Placed)) => (PlacementAction::AlreadyPlaced, String::new(), String::new()),
                (Some(ds), Some(Need::Patch(_))) => (
                    PlacementAction::AddNodeAffinity,
                    placement::yaml_snippet(ds, role, !spec.driver.interlocked()),
                    String::new(),
                ),
                (Some(_), Some(Need::ByHand { message, snippet })) => (
                    PlacementAction::AddByHand,
                    snippet.clone(),
                    message.lines().next().unwrap_or_default().to_owned(),
                ),
                (Some(_), Some(Need::GpuOperatorOwned { message })) => {
                    (PlacementAction::UseGpuOperatorPlacement, String::new(), message.clone())
                }
                (Some(_), Some(Need::AddonManaged { message })) => {
                    (PlacementAction::AddonManaged, String::new(), message.clone())
                }
                (None, _) if role == Role::DevicePlugin && !judged.device_plugin_needed => (
                    PlacementAction::Removed,
                    String::new(),
                    "no node left to move is on the device plugin, so the migration does not need it".to_owned(),
                ),
                (None, _) | (_, None) => (PlacementAction::Missing, String::new(), String::new()),
            };
            PlacementPlan {
                daemon_set: format!("{}/{}", r.namespace, r.name),
                role: role_name(role).into(),
                action,
                snippet,
                message,
            }
        })
        .collect()
}

/// The operator's own gate. Its plan is the order nodes start in once the gate opens: the
/// preview shows every block, and the operator's first reconcile applies the DeviceClasses and
/// the placement it manages.
fn judge(inputs: &Inputs) -> Result<gate::Gate, String> {
    let spec = &inputs.spec;
    let res: Vec<&str> = spec.resources.iter().map(|r| r.extended_resource_name.as_str()).collect();
    let consuming = |node: &str| {
        let pods = inputs.pods.get(node).map(Vec::as_slice).unwrap_or_default();
        Some(crate::pool::rollout::consuming_pods(spec.direction, pods, &res))
    };
    let schedulable =
        |n: &SlimNode| overlap::schedulable_dra_devices(&inputs.slices, &spec.driver.name, &n.name_any());
    gate::judge(&gate::Inputs {
        name: &inputs.name,
        uid: &inputs.uid,
        spec,
        facts: &inputs.facts,
        nodes: &inputs.nodes,
        target_nodes: inputs.target.as_ref().map(|t| t.nodes.as_slice()).unwrap_or_default(),
        device_classes: inputs.facts.served.device_classes.then_some(inputs.device_classes.as_slice()),
        driver_ds: inputs.driver_daemonset.as_ref(),
        plugin_ds: inputs.device_plugin_daemonset.as_ref(),
        plugin_config: inputs.device_plugin_config.as_ref(),
        schedulable: &schedulable,
        consuming_pods: &consuming,
        others: &inputs.others,
    })
}

/// The pods a plan names beside the node plans: those without a controller an eviction would
/// lose, and the DaemonSet and static pods that hold device-plugin GPUs the switch would publish
/// again.
#[derive(Default)]
struct Named {
    bare: Vec<String>,
    gpu_held_by_daemon_sets: Vec<String>,
    gpu_held_by_static_pods: Vec<String>,
    /// Nodes to move whose device plugin advertises none of the pool's resources, with no GFD
    /// count either: the switch has nothing to verify against.
    advertise_nothing: Vec<String>,
    /// Nodes to move whose device plugin advertised GPUs once (capacity, which the kubelet keeps)
    /// but has none allocatable now: its pod serves nothing, as when NVML fails under its driver
    /// root, which the agent would load too.
    serve_nothing: Vec<String>,
}

/// Each selected node's part: the nodes that move, in the order and waves the operator starts
/// them, with the pods each evicts; then those that stay (failed, refused, done). Also the
/// summary, and the pods the plan names ([`Named`]).
fn node_plans(inputs: &Inputs, p: &Plan) -> (Vec<NodePlan>, Summary, Named) {
    let by_name: BTreeMap<&str, &SlimNode> =
        inputs.nodes.iter().map(|n| (n.metadata.name.as_deref().unwrap_or(""), n)).collect();
    let mut nodes = Vec::new();
    let mut summary = Summary { nodes_selected: inputs.nodes.len() as u32, ..Default::default() };
    let mut named = Named::default();
    for (order, (name, in_flight, wave)) in moving_order(p).enumerate() {
        let Some(node) = by_name.get(name.as_str()) else { continue };
        let pn = PoolNode::from_node(node);
        let (evict, stay) = evictions(inputs, name);
        name_gpu_holders(inputs, name, &mut named);
        let forecast = node_forecast(inputs, node, &pn, in_flight);
        let advertises_nothing = forecast.as_ref().is_some_and(Forecast::waits_for_gpu_count);
        if advertises_nothing {
            named.advertise_nothing.push(name.clone());
        }
        let serves_nothing = forecast.as_ref().is_some_and(Forecast::switch_times_out);
        if serves_nothing {
            named.serve_nothing.push(name.clone());
        }
        let g = gpus(inputs, node);
        count_moving(&mut summary, &mut named, wave, g, &evict);
        nodes.push(NodePlan {
            order: Some(order as u32 + 1),
            wave: Some(wave),
            name: name.clone(),
            action: if in_flight { NodeAction::InFlight } else { NodeAction::Moves },
            state: pn.state(),
            backend: pn.backend().as_str().into(),
            ready: pn.ready,
            cordoned: pn.unschedulable,
            gpus: g,
            evict,
            stay,
            note: moving_note(&pn, in_flight, advertises_nothing, serves_nothing)
                .or_else(|| held_back_note(inputs, node))
                .unwrap_or_default(),
        });
    }
    add_staying(inputs, p, &by_name, &mut nodes);
    (nodes, summary, named)
}

/// The nodes that move, in the order the operator starts them, each with whether it is in flight
/// and its wave. Wave 0: in flight. Wave 1: what may start now, next to the nodes in flight. Then
/// the queue in groups of maxUnavailable.
fn moving_order(p: &Plan) -> impl Iterator<Item = (&String, bool, u32)> {
    let max = p.max_unavailable.max(1);
    let first_queued_wave = if p.to_start.is_empty() { 1 } else { 2 };
    p.in_flight
        .iter()
        .map(|n| (n, true, 0))
        .chain(p.to_start.iter().map(|n| (n, false, 1)))
        .chain(p.queued.iter().enumerate().map(move |(i, n)| (n, false, first_queued_wave + i as u32 / max)))
}

/// Going forward, names the DaemonSet and static pods on the node that hold device-plugin GPUs
/// the switch would publish again.
fn name_gpu_holders(inputs: &Inputs, name: &str, named: &mut Named) {
    if inputs.spec.direction != Direction::Forward {
        return;
    }
    let res = crate::pool::gate::resources(&inputs.spec);
    let pods = inputs.pods.get(name).map(Vec::as_slice).unwrap_or_default();
    let (daemon_set, mirror) = drain::gpu_holders_left(pods, &res);
    named.gpu_held_by_daemon_sets.extend(daemon_set.iter().map(|p| format!("{p} on {name}")));
    named.gpu_held_by_static_pods.extend(mirror.iter().map(|p| format!("{p} on {name}")));
}

/// What the operator's state machine says of a node still to start going forward on the device
/// plugin ([`forecast::forecast`]): whether it would wait cordoned for its GPU count
/// (`GpuCountUnknown`: the device plugin advertises none of the pool's resources and no GFD count
/// says how many), and whether its switch would time out (`SwitchTimeout`). `None` for the nodes
/// the plan predicts neither for: in flight, rolling back, or off the device plugin.
fn node_forecast(inputs: &Inputs, node: &SlimNode, pn: &PoolNode, in_flight: bool) -> Option<Forecast> {
    let spec = &inputs.spec;
    if spec.direction != Direction::Forward || in_flight || pn.backend() != Backend::DevicePlugin {
        return None;
    }
    let res = crate::pool::gate::resources(spec);
    // As the operator observes the node (`reconcile::decide::step::node_step`).
    let allocatable = overlap::allocatable(node, &res).values().sum();
    let gpus = capacity::gpus_to_publish(node, &res, inputs.device_plugin_config.as_ref()).values().sum();
    let observed = Observed::of_node(spec, pn, inputs.now, allocatable, gpus);
    // The agent loads the NVML library the device plugin loads: where the plugin advertised GPUs
    // once (capacity, which the kubelet keeps) and serves none now, as when NVML fails under its
    // driver root, the agent would find none either. Elsewhere it finds the node's GPUs.
    let registered = overlap::device_plugin_gpus(node, &res).values().any(|&n| n > 0);
    let agent_finds = if allocatable == 0 && registered { 0 } else { gpus };
    Some(forecast::forecast(&observed, agent_finds))
}

/// Adds one moving node to the summary (its wave, GPUs and the pods it evicts, by flag), and
/// names the pods without a controller that its drain would lose.
fn count_moving(summary: &mut Summary, named: &mut Named, wave: u32, gpus: u64, evict: &[PodPlan]) {
    summary.nodes_to_move += 1;
    summary.waves = summary.waves.max(wave);
    summary.gpus_to_move += gpus;
    summary.pods_to_evict += evict.len() as u32;
    summary.gpu_pods_to_evict += evict.iter().filter(|e| e.uses_gpu).count() as u32;
    for e in evict {
        for f in &e.flags {
            match f {
                PodFlag::PdbBlocks { .. } => summary.pods_blocked_by_pdb += 1,
                PodFlag::NoController => {
                    summary.bare_pods += 1;
                    named.bare.push(format!("{}/{}", e.namespace, e.name));
                }
                PodFlag::EmptyDir { .. } => summary.empty_dir_pods += 1,
                PodFlag::Terminating => {}
            }
        }
    }
}

/// The note on a moving node: what it waits for, that it is in flight, or what its device plugin
/// lacks; empty when it simply moves.
fn moving_note(
    pn: &PoolNode,
    in_flight: bool,
    advertises_nothing: bool,
    serves_nothing: bool,
) -> Option<String> {
    if !pn.ready {
        Some("NotReady: waits until its kubelet reports Ready".to_string())
    } else if in_flight {
        Some(format!("in flight ({}); the operator continues it first", record::state_str(pn.state())))
    } else if advertises_nothing {
        Some(
            "the device plugin advertises nothing here: it would wait cordoned (GpuCountUnknown)".to_string(),
        )
    } else if serves_nothing {
        Some("the device plugin advertises nothing allocatable here: its switch would wait for GPUs the agent may not find (SwitchTimeout)".to_string())
    } else {
        None
    }
}

/// What the plan says of a node whose device plugin holds GPUs back as unhealthy (capacity above
/// allocatable): the switch counts them and warns of them (`DevicePluginUnhealthyGpus`).
fn held_back_note(inputs: &Inputs, node: &SlimNode) -> Option<String> {
    let res = crate::pool::gate::resources(&inputs.spec);
    let (what, all) = crate::pool::overlap::held_back_words(node, &res)?;
    Some(if all {
        format!(
            "the device plugin serves none of {what} now: its pod is restarting, or it holds every GPU back as unhealthy; the switch counts them and warns (DevicePluginUnhealthyGpus)"
        )
    } else {
        format!(
            "the device plugin holds back {what} as unhealthy: the switch counts them and warns (DevicePluginUnhealthyGpus); check those GPUs before it moves"
        )
    })
}

/// Adds the nodes that stay after those that move: the failed with their failure, the refused
/// with why, then the other nodes the migration owns and no line lists yet (done).
fn add_staying(inputs: &Inputs, p: &Plan, by_name: &BTreeMap<&str, &SlimNode>, nodes: &mut Vec<NodePlan>) {
    for f in &p.failed {
        let note = PoolNode::from_node(by_name[f.as_str()])
            .failure()
            .map(|x| format!("{}: {}", x.reason, x.message))
            .unwrap_or_default();
        nodes.extend(staying_plan(inputs, by_name, f, NodeAction::Failed, note));
    }
    for r in &p.refused {
        nodes.extend(staying_plan(inputs, by_name, &r.node, NodeAction::Refused, r.message.clone()));
    }
    let listed: std::collections::HashSet<String> = nodes.iter().map(|n| n.name.clone()).collect();
    for name in p.owned.iter().filter(|n| !listed.contains(*n)) {
        nodes.extend(staying_plan(inputs, by_name, name, NodeAction::Done, String::new()));
    }
}

/// The plan of a node that stays: no order, wave or evictions. `None` for a node not selected.
fn staying_plan(
    inputs: &Inputs,
    by_name: &BTreeMap<&str, &SlimNode>,
    name: &str,
    action: NodeAction,
    note: String,
) -> Option<NodePlan> {
    let node = by_name.get(name)?;
    let pn = PoolNode::from_node(node);
    Some(NodePlan {
        order: None,
        wave: None,
        name: name.to_string(),
        action,
        state: pn.state(),
        backend: pn.backend().as_str().into(),
        ready: pn.ready,
        cordoned: pn.unschedulable,
        gpus: gpus(inputs, node),
        evict: Vec::new(),
        stay: 0,
        note,
    })
}

/// What keeps the pool from moving, each said as what to change: the gate's blocks, the class
/// selectors' problems, a pause, pods an eviction would lose, no node to move, critical findings.
fn blockers(
    inputs: &Inputs,
    judged: &gate::Gate,
    device_classes: &[ClassPlan],
    placement: &[PlacementPlan],
    named: &Named,
) -> Vec<String> {
    let spec = &inputs.spec;
    let (p, verdict) = (&judged.plan, &judged.verdict);
    let mut blockers = Vec::new();
    // A device plugin the GPU Operator or an addon manager keeps is a prerequisite too; its
    // placement line says it.
    if !verdict.met
        && verdict.reason != placement::REASON_GPU_OPERATOR_OWNED
        && verdict.reason != placement::REASON_ADDON_MANAGED
    {
        blockers.push(format!("prerequisites: {}", verdict.message));
    }
    for c in device_classes {
        for problem in &c.selector.problems {
            blockers.push(format!("DeviceClass {} ({}): {problem}", c.name, c.extended_resource_name));
        }
    }
    for c in device_classes.iter().filter(|c| !c.shadowed_by.is_empty()) {
        blockers.push(format!(
            "DeviceClass {} would be shadowed by {} for {}: remove extendedResourceName from {}",
            c.name, c.shadowed_by, c.extended_resource_name, c.shadowed_by
        ));
    }
    for pl in placement {
        match pl.action {
            // A missing DaemonSet is already a failed prerequisite.
            PlacementAction::Missing | PlacementAction::Removed => {}
            PlacementAction::AddByHand
            | PlacementAction::UseGpuOperatorPlacement
            | PlacementAction::AddonManaged => {
                blockers.push(format!("placement: {}", pl.message.lines().next().unwrap_or_default()))
            }
            PlacementAction::AlreadyPlaced
            | PlacementAction::AddNodeAffinity
            | PlacementAction::SwitchByNodeLabel => {}
        }
    }
    for o in &judged.overlaps {
        blockers.push(format!("{o}: no node starts while one is served by both backends"));
    }
    if let Some(Halt::NodeFailed(n)) = &p.halt {
        blockers.push(format!(
            "node {n} failed and spec.strategy.onFailure is Pause: fix it and remove its switchyard.dev/migration-state annotation"
        ));
    }
    if spec.paused {
        blockers.push("spec.paused is true".into());
    }
    blockers.extend(named_blockers(spec, named));
    if p.owned.is_empty() {
        blockers.push("spec.nodeSelector selects no node this migration may move".into());
    }
    let critical = inputs.findings.iter().filter(|f| f.severity == Severity::Critical).count();
    if critical > 0 {
        blockers.push(format!(
            "{critical} critical inventory finding(s): fix them first (the operator does not wait for them)"
        ));
    }
    blockers
}

/// The blockers the plan's named pods and nodes make ([`Named`]): pods an eviction would lose,
/// and, switching in place, GPUs held by static or DaemonSet pods and device plugins that
/// advertise or serve nothing.
fn named_blockers(spec: &GpuPoolMigrationSpec, named: &Named) -> Vec<String> {
    let bare = &named.bare;
    let mut blockers = Vec::new();
    // The operator's drain keeps these (drain::select): their nodes would wait for a person.
    if !bare.is_empty() && spec.direction == Direction::Forward && !spec.strategy.drain.force {
        let shown = bare.iter().take(5).cloned().collect::<Vec<_>>().join(", ");
        let more = if bare.len() > 5 { format!(" and {} more", bare.len() - 5) } else { String::new() };
        blockers.push(format!(
            "{} pod(s) have no controller and would be lost by an eviction ({shown}{more}): re-create them under a controller, delete them, or set spec.strategy.drain.force: true",
            bare.len()
        ));
    }
    // The switch never finishes while these hold a GPU it would publish again.
    let list = |pods: &[String]| {
        let shown = pods.iter().take(5).cloned().collect::<Vec<_>>().join(", ");
        if pods.len() > 5 { format!("{shown} and {} more", pods.len() - 5) } else { shown }
    };
    // Replace switches no node: pods a drain leaves keep their device-plugin GPUs on a node that
    // is only cordoned, and the node's GPU count is not what anything is verified against.
    let in_place = spec.strategy.replace().is_none();
    if in_place && !named.gpu_held_by_static_pods.is_empty() {
        blockers.push(format!(
            "{} static pod(s) hold device-plugin GPUs ({}): their nodes wait until the manifests are removed, or leave them out of spec.nodeSelector",
            named.gpu_held_by_static_pods.len(),
            list(&named.gpu_held_by_static_pods)
        ));
    }
    if in_place && !named.gpu_held_by_daemon_sets.is_empty() && !spec.strategy.drain.evict_daemon_set_gpu_pods
    {
        blockers.push(format!(
            "{} DaemonSet pod(s) hold device-plugin GPUs ({}): move their GPU request to DRA, leave their nodes out of spec.nodeSelector, or set spec.strategy.drain.evictDaemonSetGpuPods: true",
            named.gpu_held_by_daemon_sets.len(),
            list(&named.gpu_held_by_daemon_sets)
        ));
    }
    if in_place && !named.advertise_nothing.is_empty() {
        blockers.push(format!(
            "the device plugin on {} advertises nothing ({} is 0 in capacity and allocatable, and no nvidia.com/gpu.count label says how many GPUs there are): its pod found no GPU (see its log: the NVML library, the driver root), or the node has none. Such a node would wait cordoned until a count shows: fix the device plugin, label the count, or leave the node out of spec.nodeSelector",
            list(&named.advertise_nothing),
            crate::pool::gate::resources(spec).join(", ")
        ));
    }
    if in_place && !named.serve_nothing.is_empty() {
        blockers.push(format!(
            "the device plugin on {} advertises nothing allocatable ({} is 0 in allocatable; the capacity the kubelet kept is from an earlier registration): its pod serves no GPU now (see its log: the NVML library, the driver root), or every GPU is unhealthy. The agent loads the same NVML library, so such a node would wait in its switch until SwitchTimeout: fix the driver or the device plugin first, or leave the node out of spec.nodeSelector",
            list(&named.serve_nothing),
            crate::pool::gate::resources(spec).join(", ")
        ));
    }
    blockers
}

/// Builds the report: the operator's gate on the pool, then each node's part in the plan, then
/// what blocks it.
pub fn build(inputs: &Inputs) -> Result<Report, String> {
    let spec = &inputs.spec;
    let judged = judge(inputs)?;
    let p = &judged.plan;
    let verdict = &judged.verdict;
    let (nodes, summary, named) = node_plans(inputs, p);
    let device_classes = class_plans(inputs);
    let placement = placement_plans(inputs, &judged);
    let mut blockers = blockers(inputs, &judged, &device_classes, &placement, &named);
    let replace = replace_plan(inputs, &nodes);
    // The first node to move waits for room: nothing moves until target nodes are added.
    if let Some(first) = replace.as_ref().and_then(|r| r.nodes.first()).filter(|n| !n.fits)
        && !spec.strategy.replace.as_ref().is_some_and(|r| r.evict_without_capacity)
    {
        blockers.push(format!(
            "node {} would wait cordoned for room on the target pool: {}",
            first.name, first.short
        ));
    }
    Ok(Report {
        migration: inputs.name.clone(),
        exists: inputs.exists,
        direction: spec.direction,
        max_unavailable: p.max_unavailable,
        prerequisites: Prerequisites {
            met: verdict.met,
            reason: verdict.reason.to_string(),
            message: verdict.message.clone(),
            warnings: verdict.warnings.clone(),
            control_plane: std::iter::once(format!("kube-apiserver {}", inputs.facts.git_version))
                .chain(inputs.facts.control_plane.iter().map(|c| c.describe()))
                .collect(),
        },
        nodes,
        device_classes,
        placement,
        inventory: InventoryReport {
            summary: readers::summary(&inputs.findings),
            findings: inputs.findings.clone(),
            skipped: inputs.skipped.clone(),
        },
        summary,
        blockers,
        replace,
    })
}

/// The target pool's part in a Replace plan: the operator's judgement ([`replace::judge`]) of the
/// nodes in flight that drain or wait cordoned, and of each node that moves, in order.
fn replace_plan(inputs: &Inputs, nodes: &[NodePlan]) -> Option<ReplacePlan> {
    let spec = &inputs.spec;
    let r = spec.strategy.replace()?;
    let t = inputs.target.as_ref()?;
    let res = crate::pool::gate::resources(spec);
    let selectors = selectors::Selectors::new(spec);
    let target = replace::target(&res, &selectors, &spec.driver.name, t, &inputs.slices);
    let (capacity, target_nodes) = (target.room(), target.target_nodes());
    let judged_now = |n: &&NodePlan| {
        n.action == NodeAction::Moves
            || (n.action == NodeAction::InFlight
                && matches!(n.state, NodeState::Cordoned | NodeState::Draining))
    };
    let candidates: Vec<replace::Candidate<'_>> = nodes
        .iter()
        .filter(judged_now)
        .map(|n| replace::Candidate {
            name: &n.name,
            pods: inputs.pods.get(&n.name).map(Vec::as_slice).unwrap_or_default(),
            draining: n.state == NodeState::Draining,
        })
        .collect();
    let judged = replace::judge(target, &candidates, &spec.strategy.drain, r.evict_without_capacity);
    let mut needed = replace::Demand::new();
    let mut out = Vec::new();
    // A draining node is shown by its state; its pods only take their room first.
    let draining: HashSet<&str> = candidates.iter().filter(|c| c.draining).map(|c| c.name).collect();
    for j in judged.into_iter().filter(|j| !draining.contains(j.node.as_str())) {
        replace::add(&mut needed, &j.needs);
        out.push(ReplaceNode {
            name: j.node,
            needs: j.needs,
            fits: j.short.is_none(),
            short: j.short.unwrap_or_default(),
        });
    }
    Some(ReplacePlan { target_nodes, capacity, needed, nodes: out })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn from<T: serde::de::DeserializeOwned>(v: serde_json::Value) -> T {
        serde_json::from_value(v).expect("test object")
    }

    fn spec(extra: serde_json::Value) -> GpuPoolMigrationSpec {
        let mut base = json!({
            "nodeSelector": {"matchLabels": {"pool": "a100"}},
            "resources": [{"extendedResourceName": "nvidia.com/gpu", "deviceClassName": "gpu.switchyard.dev"}],
            "driver": {"name": "gpu.switchyard.dev", "daemonSet": {"namespace": "switchyard", "name": "driver"}},
            "devicePlugin": {"daemonSet": {"namespace": "gpu", "name": "plugin"}},
            // The fixture's bare pod may go, unless a test says otherwise.
            "strategy": {"maxUnavailable": 2, "drain": {"force": true}}
        });
        if let (Some(b), Some(e)) = (base.as_object_mut(), extra.as_object()) {
            for (k, v) in e {
                b.insert(k.clone(), v.clone());
            }
        }
        from(base)
    }

    fn node(name: &str, gpus: u32, annotations: serde_json::Value) -> SlimNode {
        from(json!({
            "metadata": {"name": name, "labels": {"pool": "a100"}, "annotations": annotations},
            "status": {"allocatable": {"nvidia.com/gpu": gpus.to_string()},
                "conditions": [{"type": "Ready", "status": "True"}],
                "nodeInfo": {"kubeletVersion": "v1.37.2", "containerRuntimeVersion": "containerd://2.1.0"}}
        }))
    }

    fn pod(ns: &str, name: &str, gpu: bool, owned: bool, empty_dir: bool) -> Pod {
        let limits = if gpu { json!({"nvidia.com/gpu": "1"}) } else { json!({}) };
        let owners = if owned {
            json!([{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs", "uid": "u", "controller": true}])
        } else {
            json!([])
        };
        let volumes = if empty_dir { json!([{"name": "scratch", "emptyDir": {}}]) } else { json!([]) };
        from(json!({
            "metadata": {"namespace": ns, "name": name, "labels": {"app": name}, "ownerReferences": owners},
            "spec": {"containers": [{"name": "c", "resources": {"limits": limits}}], "volumes": volumes},
            "status": {"phase": "Running"}
        }))
    }

    fn ds(ns: &str, name: &str) -> DaemonSet {
        from(json!({"metadata": {"namespace": ns, "name": name},
            "spec": {"selector": {}, "template": {"spec": {"containers": []}}}}))
    }

    fn inputs(spec: GpuPoolMigrationSpec) -> Inputs {
        let now: Timestamp = "2026-11-29T12:00:00Z".parse().expect("time");
        Inputs {
            name: "a100".into(),
            spec,
            exists: false,
            uid: String::new(),
            nodes: vec![
                node("n1", 8, json!({})),
                node("n2", 8, json!({})),
                node("n3", 4, json!({})),
                node("n4", 8, json!({"switchyard.dev/migration-state": "Draining"})),
            ],
            pods: BTreeMap::from([
                (
                    "n1".to_string(),
                    vec![pod("ml", "train-0", true, true, false), pod("ml", "web", false, true, false)],
                ),
                (
                    "n2".to_string(),
                    vec![
                        pod("ml", "train-1", true, true, false),
                        pod("ml", "bare", true, false, true),
                        pod("ml", "train-2", true, true, false),
                    ],
                ),
                ("n3".to_string(), vec![]),
            ]),
            other_pods: BTreeMap::new(),
            pdbs: vec![from(json!({"metadata": {"namespace": "ml", "name": "train"},
                "spec": {"selector": {"matchLabels": {"app": "train-1"}}},
                "status": {"disruptionsAllowed": 0, "currentHealthy": 1, "desiredHealthy": 1, "expectedPods": 1}}))],
            facts: crate::testing::server_v1_37(),
            device_classes: vec![],
            driver_daemonset: Some(ds("switchyard", "driver")),
            device_plugin_daemonset: Some(ds("gpu", "plugin")),
            device_plugin_config: None,
            others: vec![],
            slices: vec![],
            findings: vec![],
            skipped: vec![],
            now,
            target: None,
        }
    }

    /// A target pool of `nodes` nodes, each publishing `gpus` devices of the driver.
    fn target_pool(i: &mut Inputs, nodes: usize, gpus: usize, held: usize) {
        let mut t = TargetInputs::default();
        for k in 0..nodes {
            let name = format!("dra-{k}");
            t.nodes.push(from(json!({
                "metadata": {"name": name, "labels": {"pool": "dra"}},
                "status": {"conditions": [{"type": "Ready", "status": "True"}],
                           "allocatable": {"cpu": "32", "memory": "256Gi", "pods": "110"}}
            })));
            let devices: Vec<serde_json::Value> = (0..gpus)
                .map(|g| json!({"name": format!("gpu-{g}"), "attributes": {"type": {"string": "gpu"}}}))
                .collect();
            i.slices.push(from(json!({
                "metadata": {"name": format!("{name}-slice")},
                "spec": {"driver": "gpu.switchyard.dev", "nodeName": name,
                    "pool": {"name": name, "generation": 1, "resourceSliceCount": 1}, "devices": devices}
            })));
            for g in 0..held.min(gpus) {
                t.held.insert((name.clone(), format!("gpu-{g}")));
            }
        }
        i.target = Some(t);
    }

    #[test]
    fn a_replace_plan_shows_the_order_and_the_room_each_node_needs_on_the_target() {
        let replace = json!({"maxUnavailable": 1, "drain": {"force": true}, "type": "Replace",
            "replace": {"targetNodeSelector": {"matchLabels": {"pool": "dra"}}}});
        // Two target nodes of 2 GPUs, one held by a claim: 3 free. n4 drains (1 GPU pod left
        // on it? none in the fixture), then n3 (0), n1 (1), n2 (3: train-1, bare, train-2).
        let mut i = inputs(spec(json!({"strategy": replace})));
        target_pool(&mut i, 2, 2, 1);
        let r = build(&i).expect("report");
        let plan = r.replace.as_ref().expect("a replace plan");
        assert_eq!(plan.target_nodes, 2);
        assert_eq!(
            plan.capacity,
            vec![replace::ResourceRoom { resource: "nvidia.com/gpu".into(), devices: 4, free: 2 }]
        );
        let rows: Vec<(&str, u64, bool)> = plan
            .nodes
            .iter()
            .map(|n| (n.name.as_str(), n.needs.get("nvidia.com/gpu").copied().unwrap_or(0), n.fits))
            .collect();
        assert_eq!(rows, [("n3", 0, true), ("n1", 1, true), ("n2", 3, false)]);
        assert!(
            plan.nodes[2].short.contains("2 nvidia.com/gpu missing (the node's pods need 3, 1 free)"),
            "{}",
            plan.nodes[2].short
        );
        assert_eq!(plan.needed.get("nvidia.com/gpu"), Some(&4));
        // The first node fits: the migration starts, and n2 will wait for room.
        assert!(r.blockers.iter().all(|b| !b.contains("room on the target")), "{:?}", r.blockers);

        // A pod pinned to the old pool by its nodeSelector has nowhere to go: its node waits,
        // whatever is free, and leaves the room to the next.
        let mut i = inputs(spec(json!({"strategy": replace})));
        target_pool(&mut i, 2, 2, 1);
        let pinned = i.pods.get_mut("n1").and_then(|p| p.first_mut()).expect("a pod on n1");
        let pinned_name = pinned.metadata.name.clone().unwrap_or_default();
        pinned.spec.as_mut().unwrap().node_selector = Some([("pool".to_string(), "a100".to_string())].into());
        let r = build(&i).expect("report");
        let plan = r.replace.as_ref().expect("a replace plan");
        let rows: Vec<(&str, bool)> = plan.nodes.iter().map(|n| (n.name.as_str(), n.fits)).collect();
        assert_eq!(rows, [("n3", true), ("n1", false), ("n2", false)]);
        assert!(
            plan.nodes[1].short.contains("nodeSelector pool=a100, the node has pool=dra")
                && plan.nodes[1].short.contains(&pinned_name),
            "{}",
            plan.nodes[1].short
        );
        assert!(
            plan.nodes[2].short.contains("1 nvidia.com/gpu missing (the node's pods need 3, 2 free)"),
            "n1 took no room: {}",
            plan.nodes[2].short
        );

        // No room at all for the first node that needs any: it blocks.
        let mut i = inputs(spec(json!({"strategy": replace})));
        i.nodes
            .retain(|n| n.metadata.name.as_deref() != Some("n3") && n.metadata.name.as_deref() != Some("n4"));
        target_pool(&mut i, 1, 1, 1);
        let r = build(&i).expect("report");
        assert!(
            r.blockers.iter().any(|b| b.contains("node n1 would wait cordoned for room on the target pool")),
            "{:?}",
            r.blockers
        );
    }

    #[test]
    fn nodes_in_flight_first_then_fewest_gpu_pods_in_waves() {
        let r = build(&inputs(spec(json!({})))).expect("report");
        let order: Vec<(&str, Option<u32>, NodeAction)> =
            r.nodes.iter().map(|n| (n.name.as_str(), n.wave, n.action)).collect();
        assert_eq!(
            order,
            [
                ("n4", Some(0), NodeAction::InFlight),
                ("n3", Some(1), NodeAction::Moves),
                ("n1", Some(2), NodeAction::Moves),
                ("n2", Some(2), NodeAction::Moves),
            ]
        );
        assert_eq!(r.summary.nodes_to_move, 4);
        assert_eq!(r.summary.gpus_to_move, 28);
        assert_eq!(r.summary.waves, 2);
        assert!(r.blockers.is_empty(), "{:?}", r.blockers);

        // Finished GPU pods disturb nothing: the operator does not count them
        // (`rollout::consuming_pods`, which its observe calls too), so neither does the plan. n3
        // with two of them still moves before n1 with one running.
        let mut i = inputs(spec(json!({})));
        let mut done = vec![pod("ml", "job-0", true, true, false), pod("ml", "job-1", true, true, false)];
        for p in &mut done {
            p.status.as_mut().unwrap().phase = Some("Succeeded".into());
        }
        assert_eq!(crate::pool::rollout::consuming_pods(Direction::Forward, &done, &["nvidia.com/gpu"]), 0);
        i.pods.insert("n3".into(), done);
        let r = build(&i).expect("report");
        let order: Vec<&str> = r.nodes.iter().map(|n| n.name.as_str()).collect();
        assert_eq!(order, ["n4", "n3", "n1", "n2"], "the operator's order");
    }

    #[test]
    fn gpus_the_device_plugin_holds_back_as_unhealthy_are_named_as_the_switch_will() {
        let mut i = inputs(spec(json!({})));
        // n3's plugin took one GPU out after an XID: capacity 4, allocatable 3.
        i.nodes[2] = from(json!({
            "metadata": {"name": "n3", "labels": {"pool": "a100"}},
            "status": {"capacity": {"nvidia.com/gpu": "4"}, "allocatable": {"nvidia.com/gpu": "3"},
                "conditions": [{"type": "Ready", "status": "True"}],
                "nodeInfo": {"kubeletVersion": "v1.37.2", "containerRuntimeVersion": "containerd://2.1.0"}}
        }));
        let r = build(&i).expect("report");
        let n3 = r.nodes.iter().find(|n| n.name == "n3").expect("n3");
        assert!(
            n3.note.starts_with("the device plugin holds back 1 of its 4 nvidia.com/gpu as unhealthy"),
            "{}",
            n3.note
        );
        assert!(r.blockers.is_empty(), "a warning, not a blocker: {:?}", r.blockers);
        let others: Vec<&str> = r.nodes.iter().filter(|n| n.name != "n3").map(|n| n.note.as_str()).collect();
        assert!(
            others.iter().all(|n| !n.contains("holds back")),
            "only n3's plugin holds GPUs back: {others:?}"
        );
    }

    #[test]
    fn a_device_plugin_that_advertises_nothing_is_named_before_the_node_waits_cordoned() {
        let mut i = inputs(spec(json!({})));
        // n3's plugin pod found no GPU (NVML missing under its driver root): capacity 0.
        i.nodes[2] = node("n3", 0, json!({}));
        let r = build(&i).expect("report");
        let n3 = r.nodes.iter().find(|n| n.name == "n3").expect("n3");
        assert!(n3.note.contains("advertises nothing"), "{}", n3.note);
        let b = r.blockers.iter().find(|b| b.contains("advertises nothing")).expect("a blocker");
        assert!(b.starts_with("the device plugin on n3 advertises nothing (nvidia.com/gpu is 0"), "{b}");
        // GFD's count is enough to verify the switch against (a node the plugin no longer serves).
        i.nodes[2] = from(json!({
            "metadata": {"name": "n3", "labels": {"pool": "a100", "nvidia.com/gpu.count": "4"}},
            "status": {"allocatable": {"nvidia.com/gpu": "0"}, "conditions": [{"type": "Ready", "status": "True"}],
                "nodeInfo": {"kubeletVersion": "v1.37.2", "containerRuntimeVersion": "containerd://2.1.0"}}
        }));
        let r = build(&i).expect("report");
        assert!(r.blockers.iter().all(|b| !b.contains("advertises nothing")), "{:?}", r.blockers);
        // A plugin that served the node once and serves nothing now (NVML fails under its driver
        // root since): the kubelet keeps the capacity, allocatable is 0.
        i.nodes[2] = from(json!({
            "metadata": {"name": "n3", "labels": {"pool": "a100"}},
            "status": {"capacity": {"nvidia.com/gpu": "4"}, "allocatable": {"nvidia.com/gpu": "0"},
                "conditions": [{"type": "Ready", "status": "True"}],
                "nodeInfo": {"kubeletVersion": "v1.37.2", "containerRuntimeVersion": "containerd://2.1.0"}}
        }));
        let r = build(&i).expect("report");
        let n3 = r.nodes.iter().find(|n| n.name == "n3").expect("n3");
        assert!(n3.note.contains("advertises nothing allocatable"), "{}", n3.note);
        let b = r.blockers.iter().find(|b| b.contains("advertises nothing")).expect("a blocker");
        assert!(
            b.starts_with("the device plugin on n3 advertises nothing allocatable (nvidia.com/gpu is 0"),
            "{b}"
        );
        assert!(b.contains("SwitchTimeout"), "{b}");
        // Serving again: nothing to say.
        i.nodes[2] = node("n3", 4, json!({}));
        let r = build(&i).expect("report");
        assert!(r.blockers.iter().all(|b| !b.contains("advertises nothing")), "{:?}", r.blockers);
    }

    /// `inputs` with only the pods [`pod_use`] judges kept, the ones it counts counted.
    fn folded(i: &Inputs) -> Inputs {
        let mut f = i.clone();
        f.pods.clear();
        for (node, pods) in &i.pods {
            let kept = f.pods.entry(node.clone()).or_default();
            for p in pods {
                match pod_use(&i.spec, p) {
                    PodUse::Judged => kept.push(p.clone()),
                    PodUse::Counted => *f.other_pods.entry(node.clone()).or_default() += 1,
                    PodUse::Ignored => {}
                }
            }
        }
        f
    }

    #[test]
    fn a_plan_of_the_judged_pods_and_a_count_of_the_rest_is_the_plan_of_every_pod() {
        let mut i = inputs(spec(json!({})));
        let with = |mut p: Pod, patch: serde_json::Value| {
            let mut v = serde_json::to_value(&p).expect("json");
            merge(&mut v, patch);
            p = serde_json::from_value(v).expect("pod");
            p
        };
        let ds_owner = json!({"metadata": {"ownerReferences": [
            {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "ds", "uid": "d", "controller": true}]}});
        let n1 = i.pods.get_mut("n1").unwrap();
        n1.push(with(pod("ml", "done", true, true, false), json!({"status": {"phase": "Succeeded"}})));
        n1.push(with(pod("kube-system", "proxy", false, false, false), ds_owner.clone()));
        n1.push(with(pod("monitoring", "exporter", true, false, false), ds_owner));
        n1.push(with(
            pod("kube-system", "static", false, false, false),
            json!({"metadata": {"annotations": {"kubernetes.io/config.mirror": "x"}}}),
        ));
        let n2 = i.pods.get_mut("n2").unwrap();
        n2.push(with(
            pod("ml", "claimed", false, true, false),
            json!({"spec": {"resourceClaims": [{"name": "gpu", "resourceClaimName": "c"}]}}),
        ));
        n2.push(pod("ml", "scratch", false, false, true));
        n2.push(with(
            pod("ml", "leaving", false, true, false),
            json!({"metadata": {"deletionTimestamp": "2026-11-29T11:59:00Z"}}),
        ));
        let drains = [
            json!({}),
            json!({"podSelection": "All"}),
            json!({"podSelection": "All", "force": true, "deleteEmptyDirData": true}),
        ];
        for (direction, drain) in [
            ("Forward", &drains[0]),
            ("Forward", &drains[1]),
            ("Forward", &drains[2]),
            ("Rollback", &drains[0]),
        ] {
            i.spec = spec(json!({"direction": direction, "strategy": {"maxUnavailable": 2, "drain": drain}}));
            let f = folded(&i);
            let kept: usize = f.pods.values().map(Vec::len).sum();
            let all: usize = i.pods.values().map(Vec::len).sum();
            assert!(kept < all, "{direction} {drain}: the fold keeps {kept} of {all} pods");
            let (a, b) = (build(&i).expect("every pod"), build(&f).expect("folded"));
            assert_eq!(
                serde_json::to_value(&a).expect("json"),
                serde_json::to_value(&b).expect("json"),
                "{direction} {drain}"
            );
        }
    }

    fn merge(a: &mut serde_json::Value, b: serde_json::Value) {
        match (a, b) {
            (serde_json::Value::Object(a), serde_json::Value::Object(b)) => {
                for (k, v) in b {
                    merge(a.entry(k).or_insert(serde_json::Value::Null), v);
                }
            }
            (a, b) => *a = b,
        }
    }

    #[test]
    fn daemon_set_and_static_pods_holding_gpus_are_named_as_blockers() {
        let mut i = inputs(spec(json!({})));
        let mut exporter = pod("monitoring", "dcgm-exporter", true, false, false);
        exporter.metadata.owner_references = Some(vec![from(json!(
            {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "dcgm-exporter", "uid": "u", "controller": true}
        ))]);
        let mut static_pod = pod("kube-system", "gpu-burn", true, false, false);
        static_pod.metadata.annotations =
            Some([("kubernetes.io/config.mirror".to_string(), "x".to_string())].into_iter().collect());
        i.pods.get_mut("n1").unwrap().push(exporter);
        i.pods.get_mut("n3").unwrap().push(static_pod);
        let r = build(&i).expect("report");
        let ds = r.blockers.iter().find(|b| b.contains("DaemonSet pod(s) hold")).expect("the DaemonSet pod");
        assert!(
            ds.contains("monitoring/dcgm-exporter on n1") && ds.contains("evictDaemonSetGpuPods"),
            "{ds}"
        );
        let st = r.blockers.iter().find(|b| b.contains("static pod(s) hold")).expect("the static pod");
        assert!(st.contains("kube-system/gpu-burn on n3"), "{st}");
        // Evicting DaemonSet pods is allowed: only the static pod still needs a person.
        i.spec.strategy.drain.evict_daemon_set_gpu_pods = true;
        let r = build(&i).expect("report");
        assert!(r.blockers.iter().all(|b| !b.contains("DaemonSet pod(s) hold")), "{:?}", r.blockers);
        assert!(r.blockers.iter().any(|b| b.contains("static pod(s) hold")));
    }

    #[test]
    fn evictions_separate_gpu_pods_and_flag_pdb_bare_and_empty_dir() {
        let r = build(&inputs(spec(json!({})))).expect("report");
        let n1 = r.nodes.iter().find(|n| n.name == "n1").expect("n1");
        assert_eq!(n1.evict.iter().map(|p| p.name.as_str()).collect::<Vec<_>>(), ["train-0"]);
        assert_eq!(n1.stay, 1, "the non-GPU pod stays with podSelection ResourceConsumers");
        let n2 = r.nodes.iter().find(|n| n.name == "n2").expect("n2");
        let flags: BTreeMap<&str, &Vec<PodFlag>> =
            n2.evict.iter().map(|p| (p.name.as_str(), &p.flags)).collect();
        assert_eq!(flags["train-1"], &vec![PodFlag::PdbBlocks { pdb: "ml/train".into() }]);
        assert_eq!(flags["bare"], &vec![PodFlag::NoController, PodFlag::EmptyDir { deleted: false }]);
        assert!(flags["train-2"].is_empty());
        assert_eq!(
            (
                r.summary.pods_to_evict,
                r.summary.pods_blocked_by_pdb,
                r.summary.bare_pods,
                r.summary.empty_dir_pods
            ),
            (4, 1, 1, 1)
        );
    }

    #[test]
    fn bare_pods_block_unless_forced() {
        let r = build(&inputs(spec(json!({"strategy": {"maxUnavailable": 2}})))).expect("report");
        assert_eq!(r.blockers.len(), 1, "{:?}", r.blockers);
        assert!(
            r.blockers[0].contains("ml/bare") && r.blockers[0].contains("drain.force"),
            "{:?}",
            r.blockers
        );
        let forced = build(&inputs(spec(json!({})))).expect("report");
        assert!(forced.blockers.is_empty(), "{:?}", forced.blockers);
        assert_eq!(forced.summary.bare_pods, 1, "still flagged when forced");
    }

    #[test]
    fn pod_selection_all_evicts_non_gpu_pods_too() {
        let r = build(&inputs(spec(
            json!({"strategy": {"maxUnavailable": 2, "drain": {"podSelection": "All"}}}),
        )))
        .expect("report");
        let n1 = r.nodes.iter().find(|n| n.name == "n1").expect("n1");
        assert_eq!(n1.evict.len(), 2);
        assert_eq!((n1.evict[0].uses_gpu, n1.evict[1].uses_gpu), (true, false), "GPU pods listed first");
        assert_eq!(n1.stay, 0);
    }

    #[test]
    fn device_class_plan_creates_and_sees_shadowing() {
        let mut i = inputs(spec(json!({})));
        let r = build(&i).expect("report");
        assert_eq!(r.device_classes[0].action, ClassAction::Create);
        assert!(r.device_classes[0].effective, "a new class is the newest, so it wins");
        // A class created in the future (clock skew or created after ours) shadows ours.
        i.device_classes =
            vec![from(json!({"metadata": {"name": "vendor", "creationTimestamp": "2026-11-29T13:00:00Z"},
            "spec": {"extendedResourceName": "nvidia.com/gpu"}}))];
        let r = build(&i).expect("report");
        assert_eq!(r.device_classes[0].shadowed_by, "vendor");
        assert!(r.blockers.iter().any(|b| b.contains("shadowed by vendor")), "{:?}", r.blockers);
    }

    #[test]
    fn selectors_are_checked_against_published_devices_or_the_known_attributes() {
        let nvidia = |selector: &str| {
            spec(json!({
                "resources": [{"extendedResourceName": "nvidia.com/gpu", "deviceClassName": "gpu.nvidia.switchyard.dev", "selector": selector}],
                "driver": {"name": "gpu.nvidia.com", "daemonSet": {"namespace": "nvidia", "name": "kubelet-plugin"}},
            }))
        };
        // Nothing published yet: the attributes it reads against what gpu.nvidia.com publishes.
        let good =
            build(&inputs(nvidia("device.attributes['gpu.nvidia.com'].type == 'gpu'"))).expect("report");
        let check = &good.device_classes[0].selector;
        assert_eq!((check.checked_against, check.problems.len()), (SelectorBasis::KnownAttributes, 0));
        assert!(!good.blockers.iter().any(|b| b.contains("DeviceClass")), "{:?}", good.blockers);
        let wrong_domain =
            build(&inputs(nvidia("device.attributes['gpu.switchyard.dev'].type == 'gpu'"))).expect("report");
        assert!(
            wrong_domain.blockers.iter().any(|b| b.starts_with("DeviceClass gpu.nvidia.switchyard.dev (nvidia.com/gpu): reads device.attributes['gpu.switchyard.dev'].type, but gpu.nvidia.com publishes its attributes under 'gpu.nvidia.com'")),
            "{:?}",
            wrong_domain.blockers
        );
        // An unknown driver with nothing published: not checked, and not a blocker.
        let unknown = build(&inputs(spec(json!({
            "resources": [{"extendedResourceName": "nvidia.com/gpu", "deviceClassName": "c", "selector": "device.attributes['x.example.com'].model == 'a'"}],
            "driver": {"name": "x.example.com", "daemonSet": {"namespace": "x", "name": "x"}},
        }))))
        .expect("report");
        assert_eq!(unknown.device_classes[0].selector.checked_against, SelectorBasis::NotChecked);
        // Published: evaluated on the devices, across the driver's nodes.
        let mut i = inputs(nvidia("device.attributes['gpu.nvidia.com'].type == 'gpu'"));
        i.slices = ["n4", "other-pool-node"]
            .iter()
            .map(|n| {
                from(json!({"metadata": {"name": format!("{n}-s")}, "spec": {"driver": "gpu.nvidia.com", "nodeName": n,
                    "pool": {"name": n, "generation": 1, "resourceSliceCount": 1},
                    "devices": [{"name": "gpu-0", "attributes": {"type": {"string": "gpu"}}},
                                {"name": "mig-0", "attributes": {"type": {"string": "mig"}, "profile": {"string": "1g.10gb"}}}]}}))
            })
            .collect();
        let r = build(&i).expect("report");
        let check = &r.device_classes[0].selector;
        assert_eq!(
            (check.checked_against, check.devices, check.nodes, check.selected),
            (SelectorBasis::PublishedDevices, 4, 2, 2)
        );
        assert!(check.problems.is_empty(), "{:?}", check.problems);
        i.spec.resources[0].selector = Some("device.attributes['gpu.nvidia.com'].type == 'GPU'".into());
        let r = build(&i).expect("report");
        assert!(
            r.blockers
                .iter()
                .any(|b| b.contains("selects none of the 4 device(s) gpu.nvidia.com publishes on 2 node(s)")),
            "{:?}",
            r.blockers
        );
    }

    #[test]
    fn placement_managed_adds_affinity_verify_and_missing_block() {
        let r = build(&inputs(spec(json!({})))).expect("report");
        assert!(r.placement.iter().all(|p| p.action == PlacementAction::AddNodeAffinity));
        assert!(r.placement[0].snippet.contains("switchyard.dev/gpu-backend"), "{}", r.placement[0].snippet);
        let mut i = inputs(spec(json!({"placement": "Verify"})));
        i.driver_daemonset = None;
        let r = build(&i).expect("report");
        assert_eq!(r.placement[0].action, PlacementAction::AddByHand);
        assert_eq!(r.placement[1].action, PlacementAction::Missing);
        // The missing DaemonSet is a prerequisite, as the operator's PrerequisitesMet says; only
        // the one that exists gets a placement line.
        assert_eq!(r.blockers.len(), 2, "{:?}", r.blockers);
        assert!(
            r.blockers[0].starts_with("prerequisites: the DRA driver DaemonSet switchyard/driver"),
            "{:?}",
            r.blockers
        );
        assert!(
            r.blockers[1].starts_with("placement: device plugin DaemonSet gpu/plugin"),
            "{:?}",
            r.blockers
        );
    }

    #[test]
    fn refused_failed_and_done_nodes_do_not_move() {
        let mut i = inputs(spec(json!({})));
        i.nodes = vec![
            node("n1", 8, json!({})),
            node("n2", 0, json!({"switchyard.dev/migration-state": "Migrated"})),
            node(
                "n3",
                8,
                json!({"switchyard.dev/migration-state": "Failed",
                "switchyard.dev/failure": "{\"state\":\"Draining\",\"reason\":\"DrainTimeout\",\"message\":\"pods stayed\"}"}),
            ),
        ];
        i.others = vec![OtherMigration {
            name: "other".into(),
            selector: from(json!({"matchLabels": {"pool": "a100"}})),
        }];
        let r = build(&i).expect("report");
        assert!(r.nodes.iter().all(|n| n.action == NodeAction::Refused), "{:#?}", r.nodes);
        assert!(r.blockers.iter().any(|b| b.contains("selects no node")));
        i.others.clear();
        let r = build(&i).expect("report");
        let actions: BTreeMap<&str, (NodeAction, &str)> =
            r.nodes.iter().map(|n| (n.name.as_str(), (n.action, n.note.as_str()))).collect();
        assert_eq!(actions["n1"].0, NodeAction::Moves);
        assert_eq!(actions["n2"].0, NodeAction::Done);
        assert_eq!(actions["n3"], (NodeAction::Failed, "DrainTimeout: pods stayed"));
    }

    #[test]
    fn unmet_prerequisites_and_critical_findings_are_blockers() {
        let mut i = inputs(spec(json!({})));
        i.facts.git_version = "v1.35.0".into();
        i.findings = vec![Finding {
            severity: Severity::Critical,
            kind: "DeviceClass".into(),
            object: "vendor".into(),
            message: "m".into(),
            advice: "a".into(),
        }];
        let r = build(&i).expect("report");
        assert_eq!(r.blockers.len(), 2, "{:?}", r.blockers);
        assert_eq!(r.inventory.summary, "1 finding(s): 1 critical");
    }
}
