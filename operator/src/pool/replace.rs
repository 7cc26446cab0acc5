//! The Replace strategy's capacity check: whether each GPU pod an old node's drain would move has
//! a target node with room for it, judged before the node drains. Pure: the operator and
//! `switchyard plan` read the target pool alike (`reads::target_pool`: [`TargetInputs`]),
//! [`target`] builds its room node by node, and [`judge`] (the one judgement both call) spends it
//! on the nodes in the order their turns come, so that the next node of the same reconcile is
//! judged on what is left.
//!
//! A pod fits a target node only when that one node has, at once: the devices it asks for free,
//! of its classes (a device counts for a resource when the resource's DeviceClass selects it, it
//! has no NoSchedule or NoExecute taint, and no allocated ResourceClaim holds it); the CPU,
//! memory and a pod slot NodeResourcesFit would find (allocatable less what the pods bound there
//! request); and nothing that keeps the pod off it (nodeSelector, required affinity, taints:
//! [`crate::pool::fits`]). Free devices in sum are not room: a pod asking for 4 GPUs does not fit
//! two nodes with 2 free each. The pods of a node are placed largest first, each on the node it
//! fills best; pending pods that ask for the pool's resources are placed before any node, since
//! they are ahead in the scheduler's queue. A device several classes select (a GPU a broad class
//! and a narrower one both match) serves one pod: the resources with the fewest candidate devices
//! choose first, each taking the devices that serve the fewest other resources.
//!
//! What it does not model: the scheduler places evicted pods itself, spreading them by its
//! scores, so a placement that fits here can still meet a node another pod filled first; the pod
//! LISTs keep neither init containers' `restartPolicy` nor `overhead`, so a sidecar counts as an
//! init container and a RuntimeClass's overhead is not counted.

use std::borrow::Borrow;
use std::collections::{BTreeMap, BTreeSet, HashSet};

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use crate::api::v1alpha1::DrainSpec;
use crate::node::drain;
use crate::node::resources::{self, Core};
use crate::node::slim::SlimNode;
use crate::pool::overlap::keeps_out;
use crate::pool::selectors::Selectors;

/// A device as a ResourceClaim's allocation names it: `(pool, device)` of one driver.
pub type DeviceKey = (String, String);

/// The devices of `driver` that allocated claims hold.
pub fn allocated(claims: &[ResourceClaim], driver: &str) -> HashSet<DeviceKey> {
    claims
        .iter()
        .filter_map(|c| c.status.as_ref()?.allocation.as_ref()?.devices.as_ref()?.results.as_ref())
        .flatten()
        .filter(|r| r.driver == driver)
        .map(|r| (r.pool.clone(), r.device.clone()))
        .collect()
}

/// What the pods a drain of the node would move ask for: those it evicts, and those it waits on
/// (bare pods, emptyDir) that need a place too once they go. Pods already terminating are not
/// counted: their replacements are pending pods, counted as such.
pub fn moving_demand(pods: &[Pod], resources: &[&str], drain_spec: &DrainSpec) -> Demand {
    let mut out = Demand::new();
    for p in moving(pods, resources, drain_spec) {
        add(&mut out, &pod_demand(p, resources));
    }
    out
}

/// The pods of `moving` (those a drain of the node would move) that no usable target node
/// accepts ([`crate::pool::fits::refusal`]): each with why, in words. A pod pinned to the old pool
/// by a nodeSelector or a required node affinity, or one that does not tolerate the target's
/// taints, would stay Pending once evicted, whatever devices are free. Pure.
pub fn homeless(
    pods: &[Pod],
    resources: &[&str],
    drain_spec: &DrainSpec,
    targets: &[impl Borrow<SlimNode>],
) -> Vec<String> {
    let usable: Vec<&SlimNode> =
        targets.iter().map(Borrow::borrow).filter(|n| n.is_ready() && !n.unschedulable).collect();
    if usable.is_empty() {
        return Vec::new();
    }
    let mut out = Vec::new();
    for p in moving(pods, resources, drain_spec) {
        let (namespace, name) =
            (p.metadata.namespace.as_deref().unwrap_or(""), p.metadata.name.as_deref().unwrap_or(""));
        let refusals: Vec<String> = usable
            .iter()
            .map(|n| crate::pool::fits::refusal(p, n).map(|why| format!("{}: {why}", n.name())))
            .collect::<Option<_>>()
            .unwrap_or_default();
        if !refusals.is_empty() {
            let mut why: Vec<String> = refusals.into_iter().take(2).collect();
            if usable.len() > 2 {
                why.push(format!("and {} more", usable.len() - 2));
            }
            out.push(format!("{namespace}/{name} ({})", why.join("; ")));
        }
    }
    out
}

/// What keeps an autoscaler from removing a node left for removal: the annotations with which
/// cluster-autoscaler or Karpenter never remove it, set to `"true"`. Pure.
pub fn removal_blockers(node: &SlimNode) -> Vec<String> {
    use crate::well_known::{ANNOTATION_CA_SCALE_DOWN_DISABLED, ANNOTATION_KARPENTER_DO_NOT_DISRUPT};
    [
        (ANNOTATION_CA_SCALE_DOWN_DISABLED, "cluster-autoscaler"),
        (ANNOTATION_KARPENTER_DO_NOT_DISRUPT, "Karpenter"),
    ]
    .into_iter()
    .filter(|(key, _)| node.annotations().get(key) == Some("true"))
    .map(|(key, who)| format!("{key}=true ({who} will not remove it)"))
    .collect()
}

/// The wait message of a node whose pods `homeless` found no target node for.
pub fn homeless_message(homeless: &[String]) -> String {
    let mut named: Vec<&str> = homeless.iter().take(3).map(String::as_str).collect();
    let more = homeless.len().saturating_sub(3);
    let tail = if more > 0 { format!(", and {more} more") } else { String::new() };
    named.sort_unstable();
    format!(
        "no Ready, schedulable target node accepts {} of this node's GPU pods, so evicted they would stay Pending: {}{tail}; let them run on the target pool (their nodeSelector, required node affinity or tolerations), or set spec.strategy.replace.evictWithoutCapacity: true to drain anyway",
        homeless.len(),
        named.join(", ")
    )
}

/// The pods that leave an old node for the target pool, recorded on the node as its drain starts
/// (`switchyard.dev/moved`): per controller uid, how many. A rollback brings as many of each
/// controller's pods back ([`return_plan`]). Pods without a controller are not recorded: nothing
/// re-creates them, so nothing comes back.
pub type Moved = BTreeMap<String, u64>;

/// What a drain of the node would move, per controller ([`Moved`]). Pure.
pub fn moved(pods: &[Pod], resources: &[&str], drain_spec: &DrainSpec) -> Moved {
    by_controller(moving(pods, resources, drain_spec))
        .into_iter()
        .map(|(uid, n)| (uid.to_string(), n))
        .collect()
}

/// The uid of the pod's controller, if it has one.
pub fn controller_uid(pod: &Pod) -> Option<&str> {
    pod.metadata
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.controller == Some(true))
        .map(|o| o.uid.as_str())
}

/// What a rollback of a Replace migration reads to bring the moved pods back while the target
/// pool still stands.
pub struct ReturnInputs<'a> {
    /// The records of the old nodes returning now, summed.
    pub moved: &'a Moved,
    /// The GPU pods bound to those nodes.
    pub back: &'a [Pod],
    /// The target nodes.
    pub targets: &'a [String],
    /// The GPU pods on the target nodes, each with its node.
    pub on_target: &'a [(String, Pod)],
    /// Pending pods not yet bound to a node.
    pub pending: &'a [Pod],
    /// What the returning old nodes have free for the pods: the device plugin's allocatable on
    /// those that are Ready and schedulable, less what the pods bound there and the pending pods
    /// ask for.
    pub room: Demand,
    pub resources: &'a [&'a str],
}

/// A Replace rollback's return, for one reconcile: what to evict from the target, and what it
/// waits for.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReturnPlan {
    /// Pods of the recorded controllers still to come back: on the target, or on their way
    /// (evicted, not bound again yet). The return is over at 0.
    pub left: usize,
    /// The target pods to evict now, `(node, namespace, name)`, sorted: as many of each
    /// controller's as are still to come back and not on their way, as the room allows.
    pub evict: Vec<(String, String, String)>,
    /// While pods are still to come back, every target node: their devices are fenced (a
    /// NoSchedule DeviceTaintRule each), so that a pod evicted from one lands on the old pool, not
    /// on another target node.
    pub fence: BTreeSet<String>,
    /// Pods to come back that the room on the returning nodes cannot take now, when some could
    /// have been evicted otherwise.
    pub room_short: Option<String>,
}

/// Plans the return. Per recorded controller: `moved` of its pods left; those bound to the
/// returning nodes are back; unbound pending ones, and target pods being deleted, are on their
/// way; the rest still to come are evicted from the target. Pure.
pub fn return_plan(i: &ReturnInputs<'_>) -> ReturnPlan {
    let live = |p: &&Pod| !drain::is_finished(p);
    let back = by_controller(i.back.iter().filter(live).filter(|p| p.metadata.deletion_timestamp.is_none()));
    let unbound = |p: &&Pod| p.spec.as_ref().is_none_or(|s| s.node_name.as_deref().unwrap_or("").is_empty());
    let mut on_the_way = by_controller(i.pending.iter().filter(unbound).filter(live));
    let leaving = by_controller(
        i.on_target.iter().map(|(_, p)| p).filter(live).filter(|p| p.metadata.deletion_timestamp.is_some()),
    );
    for (uid, n) in leaving {
        *on_the_way.entry(uid).or_default() += n;
    }
    let mut plan = ReturnPlan::default();
    let mut room = i.room.clone();
    let mut short = Demand::new();
    let mut sorted: Vec<&(String, Pod)> = i.on_target.iter().collect();
    sorted.sort_by_key(|(node, p)| (node.clone(), p.metadata.namespace.clone(), p.metadata.name.clone()));
    for (uid, moved) in i.moved {
        let want = moved.saturating_sub(back.get(uid.as_str()).copied().unwrap_or(0));
        let coming = on_the_way.get(uid.as_str()).copied().unwrap_or(0);
        let staying: Vec<&&(String, Pod)> = sorted
            .iter()
            .filter(|(_, p)| controller_uid(p) == Some(uid.as_str()))
            .filter(|(_, p)| live(&p) && p.metadata.deletion_timestamp.is_none())
            .collect();
        let left = want.min(coming + staying.len() as u64);
        plan.left += left as usize;
        for (node, p) in staying.into_iter().take(want.saturating_sub(coming) as usize) {
            let need = pod_demand(p, i.resources);
            if fits(&room, &need) {
                for (r, n) in &need {
                    *room.entry(r.clone()).or_default() -= n;
                }
                let ns = p.metadata.namespace.clone().unwrap_or_default();
                plan.evict.push((node.clone(), ns, p.metadata.name.clone().unwrap_or_default()));
            } else {
                add(&mut short, &need);
            }
        }
    }
    plan.evict.sort();
    plan.fence = fence(i.targets, plan.left, false);
    if !short.is_empty() {
        let parts: Vec<String> = short
            .iter()
            .map(|(r, n)| format!("{n} {r} beyond the {} free", i.room.get(r).copied().unwrap_or(0)))
            .collect();
        plan.room_short = Some(format!(
            "the returning old nodes lack room for the pods still on the target pool: they need {}; a pod is evicted from the target only when it has room to land; free GPUs on the old nodes, or delete pods",
            parts.join(", ")
        ));
    }
    plan
}

/// The target nodes a Replace rollback fences (a NoSchedule DeviceTaintRule each): every one while
/// pods of the returning nodes are `left` to come back, or while `still_to_return` (rolling
/// back, a pool node that recorded pods leaving it has not finished its return). The second keeps
/// the fences standing between one node's finish and the next one's start: without it they went
/// for a moment, and a pending pod could be allocated a target device in that gap. Pure.
pub fn fence(targets: &[String], left: usize, still_to_return: bool) -> BTreeSet<String> {
    if left > 0 || still_to_return { targets.iter().cloned().collect() } else { BTreeSet::new() }
}

/// How many of `pods` each controller has.
fn by_controller<'a>(pods: impl Iterator<Item = &'a Pod>) -> BTreeMap<&'a str, u64> {
    let mut by = BTreeMap::new();
    for uid in pods.filter_map(controller_uid) {
        *by.entry(uid).or_default() += 1;
    }
    by
}

/// Whether `room` holds `need`.
fn fits(room: &Demand, need: &Demand) -> bool {
    need.iter().all(|(r, n)| room.get(r).copied().unwrap_or(0) >= *n)
}

/// The pods of `pods` a drain moves: those it evicts, and those it waits on (bare pods, emptyDir)
/// that need a place too once they go.
fn moving<'a>(pods: &'a [Pod], resources: &[&str], drain_spec: &DrainSpec) -> impl Iterator<Item = &'a Pod> {
    let s = drain::select(pods, resources, drain_spec);
    let keys: HashSet<(String, String)> = s
        .evict
        .into_iter()
        .chain(s.blocked_by_empty_dir)
        .chain(s.unmanaged)
        .map(|r| (r.namespace, r.name))
        .collect();
    pods.iter().filter(move |p| {
        let key =
            (p.metadata.namespace.clone().unwrap_or_default(), p.metadata.name.clone().unwrap_or_default());
        keys.contains(&key)
    })
}

/// What pending pods not yet bound to a node ask for: each will take a device wherever the
/// scheduler places it, so a node that drains now waits behind them.
pub fn pending_demand<'p>(pods: impl IntoIterator<Item = &'p Pod>, resources: &[&str]) -> Demand {
    let mut out = Demand::new();
    for p in pods {
        let unbound = p.spec.as_ref().is_none_or(|s| s.node_name.as_deref().unwrap_or("").is_empty());
        if unbound && !drain::is_finished(p) && p.metadata.deletion_timestamp.is_none() {
            add(&mut out, &pod_demand(p, resources));
        }
    }
    out
}

/// What the Replace judgement reads of the target pool besides its slices, read alike by the
/// operator and `switchyard plan` (`reads::target_pool`).
#[derive(Clone, Debug, Default)]
pub struct TargetInputs {
    /// The nodes `spec.strategy.replace.targetNodeSelector` selects.
    pub nodes: Vec<SlimNode>,
    /// The driver's devices allocated claims hold ([`allocated`]).
    pub held: HashSet<DeviceKey>,
    /// Pending pods not yet bound to a node: each takes a device wherever the scheduler places it.
    pub pending: Vec<Pod>,
    /// The unfinished pods bound to the target nodes that have a free device: what they request
    /// of CPU, memory and pod slots is not free for another pod.
    pub bound: Vec<Pod>,
}

/// The target pool as the scheduler can use it now, node by node: the devices of `driver` on the
/// target nodes that are Ready and schedulable, without a NoSchedule or NoExecute taint, each with
/// the resources the pool's classes serve through it (those `held` by claims are taken), and each
/// node's CPU, memory and pod slots less what its bound pods request. The pending pods that ask
/// for the pool's resources are then placed where they fit, as the scheduler would place them.
pub fn target(
    resources: &[&str],
    selectors: &Selectors,
    driver: &str,
    inputs: &TargetInputs,
    slices: &[impl Borrow<ResourceSlice>],
) -> Target {
    let mut nodes: BTreeMap<&str, TargetNode> = inputs
        .nodes
        .iter()
        .filter(|n| n.is_ready() && !n.unschedulable)
        .map(|n| {
            let node = TargetNode { node: n.clone(), free: Vec::new(), core: n.core_allocatable() };
            (n.name(), node)
        })
        .collect();
    let mut devices = vec![0; resources.len()];
    for s in slices.iter().map(Borrow::borrow) {
        let Some(node) = s.spec.node_name.as_deref().and_then(|n| nodes.get_mut(n)) else {
            continue;
        };
        if s.spec.driver != driver {
            continue;
        }
        for d in s.spec.devices.iter().flatten() {
            if d.taints.iter().flatten().any(keeps_out) {
                continue;
            }
            let device = TargetDevice { serves: selectors.serves(d) };
            for (i, serves) in device.serves.iter().enumerate() {
                if *serves && let Some(n) = devices.get_mut(i) {
                    *n += 1;
                }
            }
            if !inputs.held.contains(&(s.spec.pool.name.clone(), d.name.clone())) {
                node.free.push(device);
            }
        }
    }
    for p in inputs.bound.iter().filter(|p| !drain::is_finished(p)) {
        if let Some(node) =
            p.spec.as_ref().and_then(|s| s.node_name.as_deref()).and_then(|n| nodes.get_mut(n))
        {
            node.core = node.core.less(&resources::pod_requests(p));
        }
    }
    let mut t = Target {
        resources: resources.iter().map(|r| r.to_string()).collect(),
        nodes: nodes.into_values().collect(),
        devices,
    };
    // What is on its way and finds no node takes nothing: the scheduler leaves it Pending too.
    let unbound = |p: &&Pod| p.spec.as_ref().is_none_or(|s| s.node_name.as_deref().unwrap_or("").is_empty());
    let mut pending: Vec<PodNeeds> = inputs
        .pending
        .iter()
        .filter(unbound)
        .filter(|p| !drain::is_finished(p) && p.metadata.deletion_timestamp.is_none())
        .map(|p| PodNeeds::of(p, resources))
        .filter(|n| !n.devices.is_empty())
        .collect();
    sort_largest_first(&mut pending);
    for p in &pending {
        let _ = t.place(p);
    }
    t
}

/// What a set of pods asks for, per extended resource name.
pub type Demand = BTreeMap<String, u64>;

/// The units of `resources` one pod needs while it runs: its containers' requests (or limits,
/// where only those are set) summed, or its largest init container's, whichever is more.
pub fn pod_demand(pod: &Pod, resources: &[&str]) -> Demand {
    let mut out = Demand::new();
    let Some(spec) = pod.spec.as_ref() else {
        return out;
    };
    let units = |c: &k8s_openapi::api::core::v1::Container, r: &str| -> u64 {
        let Some(res) = c.resources.as_ref() else {
            return 0;
        };
        let q = res
            .requests
            .as_ref()
            .and_then(|m| m.get(r))
            .or_else(|| res.limits.as_ref().and_then(|m| m.get(r)));
        q.map_or(0, whole_units)
    };
    for r in resources {
        let running: u64 = spec.containers.iter().map(|c| units(c, r)).sum();
        let init: u64 = spec.init_containers.iter().flatten().map(|c| units(c, r)).max().unwrap_or(0);
        let n = running.max(init);
        if n > 0 {
            out.insert(r.to_string(), n);
        }
    }
    out
}

/// An extended resource's quantity as whole units (they are integers by API validation).
fn whole_units(q: &Quantity) -> u64 {
    q.0.trim().parse::<u64>().unwrap_or(0)
}

/// Adds `b` into `a`.
pub fn add(a: &mut Demand, b: &Demand) {
    for (r, n) in b {
        *a.entry(r.clone()).or_default() += n;
    }
}

/// One device of the target pool the scheduler may allocate now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TargetDevice {
    /// For each `spec.resources` entry, in order: whether its DeviceClass selects the device.
    pub serves: Vec<bool>,
}

/// One resource's standing on the target pool, for the status and the plan.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ResourceRoom {
    pub resource: String,
    /// Devices its class selects on usable target nodes, untainted.
    pub devices: u64,
    /// Of those, the ones nothing holds or is about to take.
    pub free: u64,
}

/// What one pod of a node that drains needs on a single target node: the devices of each
/// resource, and the CPU, memory and pod slot NodeResourcesFit counts.
#[derive(Clone, Debug)]
pub struct PodNeeds {
    pod: Pod,
    /// `namespace/name`.
    name: String,
    devices: Demand,
    core: Core,
}

impl PodNeeds {
    fn of(pod: &Pod, resources: &[&str]) -> Self {
        let ns = pod.metadata.namespace.as_deref().unwrap_or_default();
        let name = format!("{ns}/{}", pod.metadata.name.as_deref().unwrap_or_default());
        PodNeeds {
            pod: pod.clone(),
            name,
            devices: pod_demand(pod, resources),
            core: resources::pod_requests(pod),
        }
    }

    fn device_count(&self) -> u64 {
        self.devices.values().sum()
    }
}

/// The largest pods first (devices, then CPU, then memory), by name among equals: a large pod
/// placed after small ones may find every node's room split.
fn sort_largest_first(pods: &mut [PodNeeds]) {
    pods.sort_by(|a, b| {
        (b.device_count(), b.core.cpu_milli, b.core.memory, &a.name).cmp(&(
            a.device_count(),
            a.core.cpu_milli,
            a.core.memory,
            &b.name,
        ))
    });
}

/// A pod of the node that no target node has room for, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unplaced {
    /// `namespace/name`.
    pub pod: String,
    pub why: String,
}

/// What a node's pods need that the target pool lacks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Shortfall {
    /// Per resource short over the whole pool: (resource, needed by the node's pods, free on the
    /// target).
    pub short: Vec<(String, u64, u64)>,
    /// The pods no single target node has room for, when the pool's free devices would be enough
    /// in sum.
    pub unplaced: Vec<Unplaced>,
    /// Target nodes whose devices counted.
    pub target_nodes: u64,
}

impl std::fmt::Display for Shortfall {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut parts: Vec<String> = self
            .short
            .iter()
            .map(|(r, need, free)| {
                format!("{} {r} missing (the node's pods need {need}, {free} free)", need - free)
            })
            .collect();
        parts.extend(self.unplaced.iter().take(3).map(|u| format!("{} {}", u.pod, u.why)));
        if self.unplaced.len() > 3 {
            parts.push(format!("and {} more pod(s)", self.unplaced.len() - 3));
        }
        write!(
            f,
            "the target pool ({} Ready, schedulable node(s)) lacks room for this node's GPU pods: {}; add target nodes, or set spec.strategy.replace.evictWithoutCapacity: true to drain anyway",
            self.target_nodes,
            parts.join("; ")
        )
    }
}

/// One usable target node: its free devices and its CPU, memory and pod slots left.
#[derive(Clone, Debug, PartialEq)]
struct TargetNode {
    /// The node (its labels and taints: where a pod may run at all, [`crate::pool::fits`]).
    node: SlimNode,
    /// Devices no claim holds and nothing has taken yet.
    free: Vec<TargetDevice>,
    /// Allocatable CPU, memory and pod slots less what its bound pods and the pods placed on it
    /// request.
    core: Core,
}

impl TargetNode {
    /// Takes devices for `demand`, most constrained resource first; returns what found none.
    fn spend(&mut self, demand: &Demand, resources: &[String]) -> Demand {
        let mut order: Vec<(usize, u64)> = demand
            .iter()
            .filter(|(_, n)| **n > 0)
            .map(|(r, n)| (resources.iter().position(|x| x == r).unwrap_or(usize::MAX), *n))
            .collect();
        let candidates =
            |free: &[TargetDevice], i: usize| free.iter().filter(|d| d.serves.get(i) == Some(&true)).count();
        order.sort_by_key(|(i, _)| candidates(&self.free, *i));
        let mut missing = Demand::new();
        for (i, need) in order {
            for _ in 0..need {
                // The device that serves the fewest other resources.
                let pick = self
                    .free
                    .iter()
                    .enumerate()
                    .filter(|(_, d)| d.serves.get(i) == Some(&true))
                    .min_by_key(|(_, d)| d.serves.iter().filter(|s| **s).count())
                    .map(|(k, _)| k);
                match pick {
                    Some(k) => {
                        self.free.swap_remove(k);
                    }
                    None => {
                        let name = resources.get(i).cloned().unwrap_or_default();
                        *missing.entry(name).or_default() += 1;
                    }
                }
            }
        }
        missing
    }

    fn free_for(&self, i: usize) -> u64 {
        self.free.iter().filter(|d| d.serves.get(i) == Some(&true)).count() as u64
    }
}

/// The target pool's free room, node by node, as a reconcile spends it on the nodes it starts.
#[derive(Clone, Debug, PartialEq)]
pub struct Target {
    resources: Vec<String>,
    nodes: Vec<TargetNode>,
    /// Per resource, the devices its class selects on usable nodes, held or not.
    devices: Vec<u64>,
}

impl Target {
    /// Whether every pod of `pods` (those a drain of one node moves) that asks for the pool's
    /// resources finds one target node with room for it: its devices of their classes free, its
    /// CPU, memory and a pod slot as NodeResourcesFit counts them, and a node it may run on at all
    /// (nodeSelector, required affinity, taints). Several pods spend the room node by node, the
    /// largest first, each on the node it fills best. When all fit, their room is taken, so the
    /// next node is judged on what is left; otherwise nothing is taken. Pure.
    pub fn take(&mut self, pods: &[Pod]) -> Result<(), Shortfall> {
        let res: Vec<&str> = self.resources.iter().map(String::as_str).collect();
        let mut needs: Vec<PodNeeds> =
            pods.iter().map(|p| PodNeeds::of(p, &res)).filter(|n| !n.devices.is_empty()).collect();
        sort_largest_first(&mut needs);
        let mut trial = self.clone();
        let unplaced: Vec<Unplaced> = needs
            .iter()
            .filter_map(|p| trial.place(p).err().map(|why| Unplaced { pod: p.name.clone(), why }))
            .collect();
        if unplaced.is_empty() {
            *self = trial;
            return Ok(());
        }
        // In sum, per resource: what the node's pods need against what is free.
        let mut total = Demand::new();
        for p in &needs {
            add(&mut total, &p.devices);
        }
        let short: Vec<(String, u64, u64)> = total
            .iter()
            .filter_map(|(r, need)| {
                let i = self.resources.iter().position(|x| x == r);
                let free = i.map_or(0, |i| self.nodes.iter().map(|n| n.free_for(i)).sum());
                (free < *need).then(|| (r.clone(), *need, free))
            })
            .collect();
        // Where the sum already says it, each pod's own line would only repeat it.
        let unplaced = if short.is_empty() { unplaced } else { Vec::new() };
        Err(Shortfall { short, unplaced, target_nodes: self.nodes.len() as u64 })
    }

    /// Places one pod on the node it fills best (fewest free devices left, then least CPU), and
    /// takes its room there; otherwise says why no node has room for it.
    fn place(&mut self, p: &PodNeeds) -> Result<(), String> {
        let mut best: Option<(usize, TargetNode)> = None;
        for (k, n) in self.nodes.iter().enumerate() {
            if crate::pool::fits::refusal(&p.pod, &n.node).is_some() || !n.core.holds(&p.core) {
                continue;
            }
            let mut after = n.clone();
            if !after.spend(&p.devices, &self.resources).is_empty() {
                continue;
            }
            after.core = after.core.less(&p.core);
            let tighter = |b: &TargetNode| (after.free.len(), after.core) < (b.free.len(), b.core);
            if best.as_ref().is_none_or(|(_, b)| tighter(b)) {
                best = Some((k, after));
            }
        }
        match best {
            Some((k, after)) => {
                self.nodes[k] = after;
                Ok(())
            }
            None => Err(self.why_not(p)),
        }
    }

    /// Why no target node has room for `p`: the most of each resource free on one node, or the
    /// CPU, memory or pod slot a node with its devices free lacks.
    fn why_not(&self, p: &PodNeeds) -> String {
        let accepting: Vec<&TargetNode> =
            self.nodes.iter().filter(|n| crate::pool::fits::refusal(&p.pod, &n.node).is_none()).collect();
        let with_devices = accepting.iter().find(|n| {
            let mut trial: TargetNode = (**n).clone();
            trial.spend(&p.devices, &self.resources).is_empty()
        });
        if let Some(n) = with_devices {
            return format!(
                "fits no single target node: {} has its devices free but not {}",
                n.node.name(),
                n.core.lacking(&p.core).join(", ")
            );
        }
        let parts: Vec<String> = p
            .devices
            .iter()
            .map(|(r, need)| {
                let i = self.resources.iter().position(|x| x == r);
                let most = accepting
                    .iter()
                    .map(|n| (i.map_or(0, |i| n.free_for(i)), n.node.name()))
                    .max_by_key(|(free, name)| (*free, std::cmp::Reverse(*name)));
                match most {
                    Some((free, node)) if free > 0 => {
                        format!("{need} {r} (the most free on one target node: {free}, on {node})")
                    }
                    _ => format!("{need} {r} (none free on a target node it may run on)"),
                }
            })
            .collect();
        format!("needs {} on one node", parts.join(" and "))
    }

    /// Per resource, its devices and what is free now (for the status).
    pub fn room(&self) -> Vec<ResourceRoom> {
        self.resources
            .iter()
            .enumerate()
            .map(|(i, r)| {
                let free = self.nodes.iter().map(|n| n.free_for(i)).sum();
                ResourceRoom { resource: r.clone(), devices: self.devices[i], free }
            })
            .collect()
    }

    pub fn target_nodes(&self) -> u64 {
        self.nodes.len() as u64
    }

    /// A target pool of usable `nodes`, each with its free devices; its CPU, memory and pod slots
    /// are the node's allocatable (tests build a pool this way).
    pub fn from_nodes(resources: Vec<String>, nodes: Vec<(SlimNode, Vec<TargetDevice>)>) -> Target {
        let devices = (0..resources.len())
            .map(|i| {
                nodes.iter().flat_map(|(_, d)| d).filter(|d| d.serves.get(i) == Some(&true)).count() as u64
            })
            .collect();
        let nodes = nodes
            .into_iter()
            .map(|(node, free)| TargetNode { core: node.core_allocatable(), node, free })
            .collect();
        Target { resources, nodes, devices }
    }
}

/// One node whose GPU pods a Replace migration judges against the target pool, in the order its
/// turn comes.
pub struct Candidate<'a> {
    pub name: &'a str,
    /// The GPU pods bound to it (the drain's selection is made here).
    pub pods: &'a [Pod],
    /// It drains already: the pods it has left to move are on their way, so it takes its room
    /// before the nodes that have not started.
    pub draining: bool,
}

/// What a node's turn on the target pool comes to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Judged {
    pub node: String,
    /// What the pods its drain moves ask for, per resource.
    pub needs: Demand,
    /// Why it waits: its pods do not fit, or some have no target node that accepts them at all
    /// ([`homeless_message`]); `None` when they fit.
    pub short: Option<String>,
}

/// The Replace judgement, the one the operator decides with and `switchyard plan` shows: the
/// nodes that drain take their room first, then the others in the order given, each on what the
/// nodes before it left, so that no two nodes count the same free device. A node with pods no
/// usable target node accepts waits and takes no room, unless `drain_anyway`
/// (`evictWithoutCapacity`): then its other pods take theirs. Pure.
pub fn judge(
    mut target: Target,
    candidates: &[Candidate<'_>],
    drain_spec: &DrainSpec,
    drain_anyway: bool,
) -> Vec<Judged> {
    let resources: Vec<String> = target.resources.clone();
    let resources: Vec<&str> = resources.iter().map(String::as_str).collect();
    let resources = resources.as_slice();
    let targets: Vec<SlimNode> = target.nodes.iter().map(|n| n.node.clone()).collect();
    let order = candidates.iter().filter(|c| c.draining).chain(candidates.iter().filter(|c| !c.draining));
    order
        .map(|c| {
            let moving: Vec<Pod> = moving(c.pods, resources, drain_spec).cloned().collect();
            let needs = moving_demand(c.pods, resources, drain_spec);
            let homeless = homeless(c.pods, resources, drain_spec, &targets);
            let short = if homeless.is_empty() {
                target.take(&moving).err().map(|s| s.to_string())
            } else {
                if drain_anyway {
                    let accepted: Vec<Pod> = moving
                        .into_iter()
                        .filter(|p| targets.iter().any(|t| crate::pool::fits::refusal(p, t).is_none()))
                        .collect();
                    let _ = target.take(&accepted);
                }
                Some(homeless_message(&homeless))
            };
            Judged { node: c.name.to_string(), needs, short }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn gpu() -> TargetDevice {
        TargetDevice { serves: vec![true, false] }
    }
    fn mig() -> TargetDevice {
        TargetDevice { serves: vec![false, true] }
    }
    fn both() -> TargetDevice {
        TargetDevice { serves: vec![true, true] }
    }
    fn res() -> Vec<String> {
        vec!["nvidia.com/gpu".into(), "nvidia.com/mig-1g.10gb".into()]
    }
    fn d(pairs: &[(&str, u64)]) -> Demand {
        pairs.iter().map(|(r, n)| (r.to_string(), *n)).collect()
    }

    #[test]
    fn pod_demand_sums_containers_and_takes_the_larger_init() {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": "p"},
            "spec": {
                "initContainers": [{"name": "i", "resources": {"limits": {"nvidia.com/gpu": "3"}}}],
                "containers": [
                    {"name": "a", "resources": {"limits": {"nvidia.com/gpu": "1"}}},
                    {"name": "b", "resources": {"requests": {"nvidia.com/gpu": "1"}, "limits": {"nvidia.com/gpu": "1"}}},
                    {"name": "c", "resources": {"limits": {"nvidia.com/mig-1g.10gb": "2", "cpu": "1"}}}
                ]
            }
        }))
        .unwrap();
        let r = res();
        let r: Vec<&str> = r.iter().map(String::as_str).collect();
        assert_eq!(pod_demand(&pod, &r), d(&[("nvidia.com/gpu", 3), ("nvidia.com/mig-1g.10gb", 2)]));
        let cpu_only: Pod = serde_json::from_value(json!({"spec": {"containers": [{"name": "a"}]}})).unwrap();
        assert!(pod_demand(&cpu_only, &r).is_empty());
    }

    #[test]
    fn a_pod_no_usable_target_node_accepts_has_nowhere_to_go() {
        let target = |name: &str, pool: &str, ready: &str, unschedulable: bool| -> SlimNode {
            serde_json::from_value(json!({
                "metadata": {"name": name, "labels": {"pool": pool}},
                "spec": {"unschedulable": unschedulable,
                         "taints": [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]},
                "status": {"conditions": [{"type": "Ready", "status": ready}]}
            }))
            .unwrap()
        };
        let pod = |name: &str, extra: serde_json::Value| -> Pod {
            let mut spec = json!({"nodeName": "old-0", "containers": [
                {"name": "main", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]});
            for (k, v) in extra.as_object().unwrap() {
                spec[k] = v.clone();
            }
            serde_json::from_value(json!({
                "metadata": {"name": name, "namespace": "ml",
                    "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs",
                                         "uid": "u", "controller": true}]},
                "spec": spec,
                "status": {"phase": "Running"}
            }))
            .unwrap()
        };
        let tolerant = json!([{"key": "nvidia.com/gpu", "operator": "Exists"}]);
        let pods = vec![
            pod("free", json!({"tolerations": tolerant})),
            pod("pinned", json!({"tolerations": tolerant, "nodeSelector": {"pool": "old"}})),
            pod("intolerant", json!({})),
            pod("b-zone", json!({"tolerations": tolerant, "nodeSelector": {"pool": "dra-b"}})),
        ];
        let r = ["nvidia.com/gpu"];
        let drain = DrainSpec::default();
        let targets = vec![
            target("t-a", "dra-a", "True", false),
            target("t-b", "dra-b", "True", false),
            // Neither counts: not Ready, and cordoned. They would accept "pinned".
            target("t-down", "old", "False", false),
            target("t-cordoned", "old", "True", true),
        ];
        let got = homeless(&pods, &r, &drain, &targets);
        assert_eq!(
            got,
            [
                "ml/pinned (t-a: nodeSelector pool=old, the node has pool=dra-a; t-b: nodeSelector pool=old, the node has pool=dra-b)",
                "ml/intolerant (t-a: the node's taint nvidia.com/gpu=present:NoSchedule is not tolerated; t-b: the node's taint nvidia.com/gpu=present:NoSchedule is not tolerated)",
            ],
            "one accepting target node is enough (b-zone)"
        );
        assert!(
            homeless_message(&got)
                .starts_with("no Ready, schedulable target node accepts 2 of this node's GPU pods")
        );
        // Without a usable target node the devices are what is short: the capacity check says so.
        assert!(homeless(&pods, &r, &drain, &targets[2..]).is_empty());
        // A pod the drain does not move (not a GPU pod) is not judged.
        let cpu: Pod = serde_json::from_value(json!({"metadata": {"name": "cpu", "namespace": "ml"},
            "spec": {"nodeSelector": {"pool": "old"}, "containers": [{"name": "c"}]}, "status": {"phase": "Running"}}))
        .unwrap();
        assert!(homeless(&[cpu], &r, &drain, &targets).is_empty());
    }

    #[test]
    fn a_rollback_brings_back_as_many_of_each_controllers_pods_as_left_as_room_allows() {
        let r = ["nvidia.com/gpu"];
        // A pod of controller `owner` on `node` ("" unbound), needing `gpus`, in `phase`.
        let pod = |name: &str, owner: &str, node: &str, gpus: u32, phase: &str, deleting: bool| -> Pod {
            let mut v = json!({
                "metadata": {"name": name, "namespace": "ml",
                    "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": owner,
                                         "uid": owner, "controller": true}]},
                "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": gpus.to_string()}}}]},
                "status": {"phase": phase}
            });
            if !node.is_empty() {
                v["spec"]["nodeName"] = json!(node);
            }
            if deleting {
                v["metadata"]["deletionTimestamp"] = json!("2026-12-06T00:00:00Z");
            }
            serde_json::from_value(v).unwrap()
        };
        let on = |node: &str, p: Pod| (node.to_string(), p);
        let moved: Moved = [("a".to_string(), 2), ("b".to_string(), 1)].into();
        let target = vec![
            on("t1", pod("a-1", "a", "t1", 1, "Running", false)),
            on("t1", pod("a-2", "a", "t1", 1, "Running", false)),
            // Controller a had a pod on the target before the migration: two left, two come back.
            on("t2", pod("a-3", "a", "t2", 1, "Running", false)),
            on("t2", pod("b-1", "b", "t2", 2, "Running", false)),
            // Not a controller that left: it stays.
            on("t3", pod("other-1", "other", "t3", 1, "Running", false)),
        ];
        let room = |n: u64| Demand::from([("nvidia.com/gpu".to_string(), n)]);
        let targets = ["t1".to_string(), "t2".into(), "t3".into()];
        let plan = |back: &[Pod], on_target: &[(String, Pod)], pending: &[Pod], free: u64| {
            return_plan(&ReturnInputs {
                moved: &moved,
                back,
                targets: &targets,
                on_target,
                pending,
                room: room(free),
                resources: &r,
            })
        };
        let names = |p: &ReturnPlan| p.evict.iter().map(|(_, _, n)| n.clone()).collect::<Vec<_>>();

        // Room for everything: two of a and the one of b. Every target node is fenced, so that
        // none of them lands on another target node.
        let p = plan(&[], &target, &[], 8);
        assert_eq!((p.left, names(&p)), (3, vec!["a-1".to_string(), "a-2".into(), "b-1".into()]));
        assert_eq!(p.fence.iter().map(String::as_str).collect::<Vec<_>>(), ["t1", "t2", "t3"]);
        assert_eq!(p.room_short, None);

        // Room for 2 GPUs: a's two, not b's pod of two; the plan says what is short.
        let p = plan(&[], &target, &[], 2);
        assert_eq!(names(&p), ["a-1", "a-2"]);
        let short = p.room_short.expect("short");
        assert!(short.contains("they need 2 nvidia.com/gpu beyond the 2 free"), "{short}");

        // One of a is back, one on its way (evicted, pending): nothing more of a is evicted.
        let back = [pod("a-4", "a", "old-1", 1, "Running", false)];
        let pending = [pod("a-5", "a", "", 1, "Pending", false)];
        let p = plan(&back, &target, &pending, 8);
        assert_eq!((p.left, names(&p)), (2, vec!["b-1".to_string()]), "a: 1 on its way; b: 1");

        // A target pod being deleted is on its way too; one being deleted on a node that is back
        // does not count as back.
        let mut leaving = target.clone();
        leaving[3] = on("t2", pod("b-1", "b", "t2", 2, "Running", true));
        let back =
            [pod("a-4", "a", "old-1", 1, "Running", false), pod("a-6", "a", "old-1", 1, "Running", true)];
        let p = plan(&back, &leaving, &[], 8);
        assert_eq!((p.left, names(&p)), (2, vec!["a-1".to_string()]), "a: 1 more; b: on its way");

        // All back: nothing left, nothing to fence.
        let back = [
            pod("a-4", "a", "old-1", 1, "Running", false),
            pod("a-5", "a", "old-1", 1, "Running", false),
            pod("b-2", "b", "old-1", 2, "Running", false),
        ];
        let p = plan(&back, &target, &[], 8);
        assert_eq!((p.left, p.evict.len(), p.fence.len()), (0, 0, 0));

        // The target pool removed: nothing is left there to bring back.
        let p = return_plan(&ReturnInputs {
            moved: &moved,
            back: &[],
            targets: &[],
            on_target: &[],
            pending: &[],
            room: room(8),
            resources: &r,
        });
        assert_eq!(p, ReturnPlan::default());
    }

    #[test]
    fn what_leaves_a_node_is_recorded_per_controller() {
        let pod = |name: &str, owner: Option<&str>| -> Pod {
            let owners = owner.map(|o| {
                json!([{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": o, "uid": o, "controller": true}])
            });
            serde_json::from_value(json!({
                "metadata": {"name": name, "namespace": "ml", "ownerReferences": owners},
                "spec": {"nodeName": "old-1", "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
                "status": {"phase": "Running"}
            }))
            .unwrap()
        };
        let pods = [pod("a-1", Some("a")), pod("a-2", Some("a")), pod("b-1", Some("b")), pod("bare", None)];
        let force = DrainSpec { force: true, ..DrainSpec::default() };
        let m = moved(&pods, &["nvidia.com/gpu"], &force);
        assert_eq!(
            m,
            Moved::from([("a".to_string(), 2), ("b".to_string(), 1)]),
            "a bare pod never comes back"
        );
    }

    #[test]
    fn a_node_left_for_removal_says_what_keeps_an_autoscaler_from_removing_it() {
        let node = |annotations: serde_json::Value| -> SlimNode {
            serde_json::from_value(json!({"metadata": {"name": "old-1", "annotations": annotations}}))
                .unwrap()
        };
        assert!(removal_blockers(&node(json!({"other.io/x": "true"}))).is_empty());
        assert!(
            removal_blockers(&node(json!({"cluster-autoscaler.kubernetes.io/scale-down-disabled": "false"})))
                .is_empty()
        );
        assert_eq!(
            removal_blockers(&node(json!({
                "cluster-autoscaler.kubernetes.io/scale-down-disabled": "true",
                "karpenter.sh/do-not-disrupt": "true"
            }))),
            [
                "cluster-autoscaler.kubernetes.io/scale-down-disabled=true (cluster-autoscaler will not remove it)",
                "karpenter.sh/do-not-disrupt=true (Karpenter will not remove it)",
            ]
        );
    }

    /// A Ready, schedulable target node with `cpu` allocatable and room for 110 pods.
    fn tnode(name: &str, cpu: &str) -> SlimNode {
        serde_json::from_value(json!({
            "metadata": {"name": name, "labels": {"pool": "dra"}},
            "status": {"conditions": [{"type": "Ready", "status": "True"}],
                       "allocatable": {"cpu": cpu, "memory": "256Gi", "pods": "110"}}
        }))
        .unwrap()
    }

    /// A pod of a ReplicaSet bound to `old-0` asking for `gpus` whole GPUs, `migs` MIG devices
    /// and `cpu`.
    fn gpod(name: &str, gpus: u32, migs: u32, cpu: &str) -> Pod {
        let mut limits = serde_json::Map::new();
        if gpus > 0 {
            limits.insert("nvidia.com/gpu".into(), json!(gpus.to_string()));
        }
        if migs > 0 {
            limits.insert("nvidia.com/mig-1g.10gb".into(), json!(migs.to_string()));
        }
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "ml",
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs", "uid": "u", "controller": true}]},
            "spec": {"nodeName": "old-0", "containers": [{"name": "c",
                "resources": {"limits": limits, "requests": {"cpu": cpu}}}]},
            "status": {"phase": "Running"}
        }))
        .unwrap()
    }

    fn pool(nodes: &[(&str, &str, Vec<TargetDevice>)]) -> Target {
        Target::from_nodes(res(), nodes.iter().map(|(n, cpu, d)| (tnode(n, cpu), d.clone())).collect())
    }

    fn gpus(n: usize) -> Vec<TargetDevice> {
        (0..n).map(|_| gpu()).collect()
    }

    /// Free whole GPUs per target node, in name order.
    fn free_gpus(t: &Target) -> Vec<u64> {
        t.nodes.iter().map(|n| n.free_for(0)).collect()
    }

    #[test]
    fn capacity_table() {
        struct Case {
            name: &'static str,
            target: Target,
            /// Each drained node's pods, in turn.
            nodes: Vec<Vec<Pod>>,
            /// Per drained node: fits, or a piece of the shortfall's message.
            want: Vec<Result<(), &'static str>>,
            /// Free whole GPUs per target node after the nodes.
            free_after: Vec<u64>,
        }
        let cases = vec![
            Case {
                name: "a node that fits takes its devices; the next one is judged on what is left",
                target: pool(&[("t-1", "32", gpus(3))]),
                nodes: vec![vec![gpod("a", 2, 0, "1")], vec![gpod("b", 2, 0, "1")]],
                want: vec![Ok(()), Err("1 nvidia.com/gpu missing (the node's pods need 2, 1 free)")],
                free_after: vec![1],
            },
            Case {
                name: "a 4-GPU pod does not fit two nodes with 2 free each",
                target: pool(&[("t-1", "32", gpus(2)), ("t-2", "32", gpus(2))]),
                nodes: vec![vec![gpod("big", 4, 0, "1")]],
                want: vec![Err(
                    "ml/big needs 4 nvidia.com/gpu (the most free on one target node: 2, on t-1) on one node",
                )],
                free_after: vec![2, 2],
            },
            Case {
                name: "a 4-GPU target node joins: the pod goes there, the others keep their room",
                target: pool(&[("t-1", "32", gpus(2)), ("t-2", "32", gpus(2)), ("t-3", "32", gpus(4))]),
                nodes: vec![vec![gpod("big", 4, 0, "1")]],
                want: vec![Ok(())],
                free_after: vec![2, 2, 0],
            },
            Case {
                name: "the devices are free but the node's CPU is not",
                target: pool(&[("t-1", "2", gpus(4))]),
                nodes: vec![vec![gpod("cpu-heavy", 2, 0, "4")]],
                want: vec![Err(
                    "ml/cpu-heavy fits no single target node: t-1 has its devices free but not cpu 4 (2 free)",
                )],
                free_after: vec![4],
            },
            Case {
                name: "several pods of one node spend the room node by node",
                target: pool(&[("t-1", "32", gpus(3)), ("t-2", "32", gpus(1))]),
                nodes: vec![vec![gpod("a", 2, 0, "1"), gpod("b", 2, 0, "1")]],
                want: vec![Err(
                    "ml/b needs 2 nvidia.com/gpu (the most free on one target node: 1, on t-1) on one node",
                )],
                free_after: vec![3, 1],
            },
            Case {
                name: "the largest pod is placed first, the small ones fill what is left",
                target: pool(&[("t-1", "32", gpus(3)), ("t-2", "32", gpus(1))]),
                nodes: vec![vec![gpod("s1", 1, 0, "1"), gpod("s2", 1, 0, "1"), gpod("big", 2, 0, "1")]],
                want: vec![Ok(())],
                free_after: vec![0, 0],
            },
            Case {
                name: "CPU spent by one pod is not there for the next on the same node",
                target: pool(&[("t-1", "3", gpus(4))]),
                nodes: vec![vec![gpod("a", 1, 0, "2")], vec![gpod("b", 1, 0, "2")]],
                want: vec![Ok(()), Err("t-1 has its devices free but not cpu 2 (1 free)")],
                free_after: vec![3],
            },
            Case {
                name: "counted per resource: MIG devices do not serve whole-GPU pods",
                target: pool(&[("t-1", "32", vec![mig(), mig(), mig(), gpu()])]),
                nodes: vec![vec![gpod("m", 2, 3, "1")]],
                want: vec![Err("1 nvidia.com/gpu missing (the node's pods need 2, 1 free)")],
                free_after: vec![1],
            },
            Case {
                name: "a device two classes select serves one pod; the narrow resource chooses first",
                target: pool(&[("t-1", "32", vec![both(), gpu()])]),
                nodes: vec![vec![gpod("m", 1, 1, "1")], vec![gpod("g", 1, 0, "1")]],
                want: vec![Ok(()), Err("1 nvidia.com/gpu missing (the node's pods need 1, 0 free)")],
                free_after: vec![0],
            },
            Case {
                name: "a node without GPU pods always fits",
                target: pool(&[]),
                nodes: vec![vec![], vec![gpod("cpu-only", 0, 0, "64")]],
                want: vec![Ok(()), Ok(())],
                free_after: vec![],
            },
            Case {
                name: "a resource no class serves on the target is short by all of it",
                target: pool(&[("t-1", "32", gpus(1))]),
                nodes: vec![vec![gpod("m", 0, 2, "1")]],
                want: vec![Err("2 nvidia.com/mig-1g.10gb missing (the node's pods need 2, 0 free)")],
                free_after: vec![1],
            },
        ];
        for mut c in cases {
            for (i, (pods, want)) in c.nodes.iter().zip(&c.want).enumerate() {
                let got = c.target.take(pods).map_err(|s| s.to_string());
                match (want, &got) {
                    (Ok(()), Ok(())) => {}
                    (Err(piece), Err(m)) => assert!(m.contains(piece), "{}: node {i}: {m}", c.name),
                    _ => panic!("{}: node {i}: want {want:?}, got {got:?}", c.name),
                }
            }
            assert_eq!(free_gpus(&c.target), c.free_after, "{}: free after", c.name);
        }
    }

    #[test]
    fn the_target_read_counts_held_devices_pending_pods_and_bound_pods_cpu_per_node() {
        let spec: crate::api::v1alpha1::GpuPoolMigrationSpec = serde_json::from_value(json!({
            "nodeSelector": {"matchLabels": {"pool": "old"}},
            "resources": [{"extendedResourceName": "nvidia.com/gpu", "deviceClassName": "gpu.switchyard.dev"}],
            "driver": {"name": "gpu.switchyard.dev", "daemonSet": {"namespace": "switchyard", "name": "driver"}},
            "devicePlugin": {"daemonSet": {"namespace": "gpu", "name": "plugin"}}
        }))
        .unwrap();
        let slice = |node: &str, n: usize| -> ResourceSlice {
            let devices: Vec<serde_json::Value> = (0..n)
                .map(|g| json!({"name": format!("gpu-{g}"), "attributes": {"type": {"string": "gpu"}}}))
                .collect();
            serde_json::from_value(json!({
                "metadata": {"name": format!("{node}-slice")},
                "spec": {"driver": "gpu.switchyard.dev", "nodeName": node,
                    "pool": {"name": node, "generation": 1, "resourceSliceCount": 1}, "devices": devices}
            }))
            .unwrap()
        };
        let mut cordoned = tnode("t-3", "32");
        cordoned.unschedulable = true;
        let mut pending = gpod("pending", 2, 0, "1");
        pending.spec.as_mut().unwrap().node_name = None;
        pending.status.as_mut().unwrap().phase = Some("Pending".into());
        let mut busy = gpod("cpu-hog", 0, 0, "30");
        busy.spec.as_mut().unwrap().node_name = Some("t-2".into());
        let inputs = TargetInputs {
            nodes: vec![tnode("t-1", "32"), tnode("t-2", "32"), cordoned],
            // One of t-1's 4 GPUs is held by a claim.
            held: [("t-1".to_string(), "gpu-0".to_string())].into(),
            pending: vec![pending],
            bound: vec![busy],
        };
        let slices = [slice("t-1", 4), slice("t-2", 2), slice("t-3", 8)];
        let mut t =
            target(&["nvidia.com/gpu"], &Selectors::new(&spec), "gpu.switchyard.dev", &inputs, &slices);
        // The cordoned node counts nothing; the held GPU counts among the devices, not the free;
        // the pending 2-GPU pod takes t-2 (it fills it best).
        assert_eq!(t.target_nodes(), 2);
        assert_eq!(t.room(), vec![ResourceRoom { resource: "nvidia.com/gpu".into(), devices: 6, free: 3 }]);
        // t-2's CPU is spent by its bound pod: a GPU pod needing 4 CPUs goes to t-1.
        assert!(t.take(&[gpod("a", 1, 0, "4")]).is_ok());
        assert_eq!(t.room()[0].free, 2);
        // Two free GPUs left on t-1, none on t-2: a 3-GPU pod fits nowhere.
        let short = t.take(&[gpod("b", 3, 0, "1")]).unwrap_err();
        assert_eq!(short.short, vec![("nvidia.com/gpu".to_string(), 3, 2)]);
    }

    #[test]
    fn the_shortfall_says_how_many_of_which_resource_are_missing_and_what_to_do() {
        let s = Shortfall { short: vec![("nvidia.com/gpu".into(), 4, 1)], unplaced: vec![], target_nodes: 2 };
        let m = s.to_string();
        assert!(m.contains("3 nvidia.com/gpu missing (the node's pods need 4, 1 free)"), "{m}");
        assert!(m.contains("2 Ready, schedulable node(s)"), "{m}");
        assert!(m.contains("spec.strategy.replace.evictWithoutCapacity"), "{m}");
    }

    #[test]
    fn the_judgement_takes_draining_nodes_first_and_holds_a_node_with_pods_nowhere_accepts() {
        let target = pool(&[("t-1", "32", gpus(2))]);
        let pods_n1 = [gpod("n1-a", 2, 0, "1")];
        let pods_n2 = [gpod("n2-a", 2, 0, "1")];
        let mut pinned = gpod("n3-pinned", 1, 0, "1");
        pinned.spec.as_mut().unwrap().node_selector = Some([("pool".to_string(), "old".to_string())].into());
        let pods_n3 = [pinned];
        let drain = DrainSpec::default();
        let c = |name, pods, draining| Candidate { name, pods, draining };
        let judged = judge(
            target.clone(),
            &[c("n3", &pods_n3, false), c("n1", &pods_n1, false), c("n2", &pods_n2, true)],
            &drain,
            false,
        );
        let rows: Vec<(&str, bool)> = judged.iter().map(|j| (j.node.as_str(), j.short.is_none())).collect();
        // n2 drains: its pods are on their way and take the room; n3 waits and takes none; n1 waits.
        assert_eq!(rows, [("n2", true), ("n3", false), ("n1", false)]);
        assert!(judged[1].short.as_deref().unwrap().contains("no Ready, schedulable target node accepts 1"));
        assert_eq!(judged[0].needs, d(&[("nvidia.com/gpu", 2)]));
    }

    #[test]
    fn fences_stand_while_any_node_is_still_to_return() {
        let targets = ["t-1".to_string(), "t-2".into()];
        assert_eq!(fence(&targets, 2, false).len(), 2, "pods left to come back");
        assert_eq!(fence(&targets, 0, true).len(), 2, "between one node's finish and the next one's start");
        assert!(fence(&targets, 0, false).is_empty(), "the last node is back");
        assert!(fence(&[], 3, true).is_empty(), "no target pool left");
    }
}
