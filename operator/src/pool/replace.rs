//! The Replace strategy's capacity check: whether the target pool has free DRA devices for the
//! GPU pods of an old node before that node drains. Pure: the controller gathers the target's
//! devices ([`TargetDevice`]), what ResourceClaims hold and what is already on its way
//! ([`Target::new`]); [`Target::take`] says whether a node's pods fit, and takes their devices
//! when they do, so that the next node of the same reconcile is judged on what is left.
//!
//! A device counts for a resource when the resource's DeviceClass selects it (the pool's
//! selectors, as the switch uses them), it has no NoSchedule or NoExecute taint, its node is Ready
//! and schedulable, and no allocated ResourceClaim holds it. A device several classes select (a
//! GPU a broad class and a narrower one both match) serves one pod: the resources with the fewest
//! candidate devices choose first, each taking the devices that serve the fewest other resources.

use std::borrow::Borrow;
use std::collections::{BTreeMap, HashSet};

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use crate::api::v1alpha1::DrainSpec;
use crate::node::drain;
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
    pub fence: std::collections::BTreeSet<String>,
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
    if plan.left > 0 {
        plan.fence.extend(i.targets.iter().cloned());
    }
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

/// The target pool as the scheduler can use it now: the devices of `driver` on `nodes` that are
/// Ready and schedulable, without a NoSchedule or NoExecute taint, each with the resources the
/// pool's classes serve through it; those in `held` are taken by claims.
pub fn target(
    resources: &[&str],
    selectors: &Selectors,
    driver: &str,
    nodes: &[impl Borrow<SlimNode>],
    slices: &[impl Borrow<ResourceSlice>],
    held: &HashSet<DeviceKey>,
    on_the_way: &Demand,
) -> Target {
    let usable: HashSet<&str> = nodes
        .iter()
        .map(Borrow::borrow)
        .filter(|n| n.is_ready() && !n.unschedulable)
        .filter_map(|n| n.metadata.name.as_deref())
        .collect();
    let (mut free, mut taken) = (Vec::new(), Vec::new());
    for s in slices.iter().map(Borrow::borrow) {
        let on_usable = s.spec.node_name.as_deref().is_some_and(|n| usable.contains(n));
        if s.spec.driver != driver || !on_usable {
            continue;
        }
        for d in s.spec.devices.iter().flatten() {
            if d.taints.iter().flatten().any(keeps_out) {
                continue;
            }
            let device = TargetDevice { serves: selectors.serves(d) };
            if held.contains(&(s.spec.pool.name.clone(), d.name.clone())) {
                taken.push(device);
            } else {
                free.push(device);
            }
        }
    }
    Target::new(
        resources.iter().map(|r| r.to_string()).collect(),
        usable.len() as u64,
        free,
        &taken,
        on_the_way,
    )
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

/// What a node's pods need that the target pool lacks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Shortfall {
    /// Per resource short: (resource, needed by the node's pods, free on the target).
    pub short: Vec<(String, u64, u64)>,
    /// Target nodes whose devices counted.
    pub target_nodes: u64,
}

impl std::fmt::Display for Shortfall {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let parts: Vec<String> = self
            .short
            .iter()
            .map(|(r, need, free)| {
                format!("{} {r} missing (the node's pods need {need}, {free} free)", need - free)
            })
            .collect();
        write!(
            f,
            "the target pool ({} Ready, schedulable node(s)) lacks room for this node's GPU pods: {}; add target nodes, or set spec.strategy.replace.evictWithoutCapacity: true to drain anyway",
            self.target_nodes,
            parts.join(", ")
        )
    }
}

/// The target pool's free devices, as a reconcile spends them on the nodes it starts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    resources: Vec<String>,
    /// Devices no claim holds and nothing has taken yet.
    free: Vec<TargetDevice>,
    /// Per resource, the devices its class selects, held or not.
    devices: Vec<u64>,
    target_nodes: u64,
}

impl Target {
    /// The target pool: `resources` in `spec.resources` order; `free` the usable devices no
    /// allocated claim holds; `held` how many usable devices per resource claims hold (for the
    /// totals); `on_the_way` what pending GPU pods and nodes already draining will take.
    pub fn new(
        resources: Vec<String>,
        target_nodes: u64,
        free: Vec<TargetDevice>,
        held: &[TargetDevice],
        on_the_way: &Demand,
    ) -> Self {
        let devices = (0..resources.len())
            .map(|i| free.iter().chain(held).filter(|d| d.serves.get(i) == Some(&true)).count() as u64)
            .collect();
        let mut t = Target { resources, free, devices, target_nodes };
        // What is on its way and finds no device leaves nothing of its resources for a node.
        t.spend(on_the_way);
        t
    }

    /// Whether `demand` fits what is free; when it does, its devices are taken. Demand already
    /// on its way was served first ([`Target::new`]): a node never jumps the queue of pods
    /// already pending.
    pub fn take(&mut self, demand: &Demand) -> Result<(), Shortfall> {
        let mut trial = self.clone();
        let missing = trial.spend(demand);
        let short: Vec<(String, u64, u64)> = demand
            .iter()
            .filter_map(|(r, need)| {
                let m = missing.get(r).copied().unwrap_or(0);
                (m > 0).then(|| (r.clone(), *need, need - m))
            })
            .collect();
        if short.is_empty() {
            *self = trial;
            Ok(())
        } else {
            Err(Shortfall { short, target_nodes: self.target_nodes })
        }
    }

    /// Per resource, its devices and what is free now (for the status).
    pub fn room(&self) -> Vec<ResourceRoom> {
        self.resources
            .iter()
            .enumerate()
            .map(|(i, r)| {
                let free = self.free.iter().filter(|d| d.serves.get(i) == Some(&true)).count() as u64;
                ResourceRoom { resource: r.clone(), devices: self.devices[i], free }
            })
            .collect()
    }

    pub fn target_nodes(&self) -> u64 {
        self.target_nodes
    }

    /// Takes devices for `demand`, most constrained resource first; returns what found none.
    fn spend(&mut self, demand: &Demand) -> Demand {
        let mut order: Vec<(usize, u64)> = demand
            .iter()
            .filter(|(_, n)| **n > 0)
            .map(|(r, n)| (self.resources.iter().position(|x| x == r).unwrap_or(usize::MAX), *n))
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
                        let name = self.resources.get(i).cloned().unwrap_or_default();
                        *missing.entry(name).or_default() += 1;
                    }
                }
            }
        }
        missing
    }
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

    /// What a node lacks: (resource, needed, free).
    type Short = Vec<(&'static str, u64, u64)>;

    #[test]
    fn capacity_table() {
        struct Case {
            name: &'static str,
            free: Vec<TargetDevice>,
            held: Vec<TargetDevice>,
            on_the_way: Demand,
            nodes: Vec<Demand>,
            /// Per node: Ok, or the (resource, need, free) that is short.
            want: Vec<Result<(), Short>>,
            /// Free per resource after the nodes.
            free_after: [u64; 2],
        }
        let cases = vec![
            Case {
                name: "a node that fits takes its devices; the next one is judged on what is left",
                free: vec![gpu(), gpu(), gpu()],
                held: vec![],
                on_the_way: d(&[]),
                nodes: vec![d(&[("nvidia.com/gpu", 2)]), d(&[("nvidia.com/gpu", 2)])],
                want: vec![Ok(()), Err(vec![("nvidia.com/gpu", 2, 1)])],
                free_after: [1, 0],
            },
            Case {
                name: "devices claims hold are not free, but count among the devices",
                free: vec![gpu()],
                held: vec![gpu(), gpu(), gpu()],
                on_the_way: d(&[]),
                nodes: vec![d(&[("nvidia.com/gpu", 2)])],
                want: vec![Err(vec![("nvidia.com/gpu", 2, 1)])],
                free_after: [1, 0],
            },
            Case {
                name: "pending pods and draining nodes are served before a new node",
                free: vec![gpu(), gpu(), gpu(), gpu()],
                held: vec![],
                on_the_way: d(&[("nvidia.com/gpu", 3)]),
                nodes: vec![d(&[("nvidia.com/gpu", 2)])],
                want: vec![Err(vec![("nvidia.com/gpu", 2, 1)])],
                free_after: [1, 0],
            },
            Case {
                name: "demand on its way beyond the pool leaves nothing for a node",
                free: vec![gpu()],
                held: vec![],
                on_the_way: d(&[("nvidia.com/gpu", 3)]),
                nodes: vec![d(&[("nvidia.com/gpu", 1)])],
                want: vec![Err(vec![("nvidia.com/gpu", 1, 0)])],
                free_after: [0, 0],
            },
            Case {
                name: "counted per resource: MIG devices do not serve whole-GPU pods",
                free: vec![mig(), mig(), mig(), gpu()],
                held: vec![],
                on_the_way: d(&[]),
                nodes: vec![d(&[("nvidia.com/gpu", 2), ("nvidia.com/mig-1g.10gb", 3)])],
                want: vec![Err(vec![("nvidia.com/gpu", 2, 1)])],
                free_after: [1, 3],
            },
            Case {
                name: "a device two classes select serves one pod; the narrow resource chooses first",
                free: vec![both(), gpu()],
                held: vec![],
                on_the_way: d(&[]),
                nodes: vec![
                    d(&[("nvidia.com/gpu", 1), ("nvidia.com/mig-1g.10gb", 1)]),
                    d(&[("nvidia.com/gpu", 1)]),
                ],
                want: vec![Ok(()), Err(vec![("nvidia.com/gpu", 1, 0)])],
                free_after: [0, 0],
            },
            Case {
                name: "a node without GPU pods always fits",
                free: vec![],
                held: vec![],
                on_the_way: d(&[]),
                nodes: vec![d(&[])],
                want: vec![Ok(())],
                free_after: [0, 0],
            },
            Case {
                name: "a resource no class serves on the target is short by all of it",
                free: vec![gpu()],
                held: vec![],
                on_the_way: d(&[]),
                nodes: vec![d(&[("nvidia.com/mig-1g.10gb", 2)])],
                want: vec![Err(vec![("nvidia.com/mig-1g.10gb", 2, 0)])],
                free_after: [1, 0],
            },
        ];
        for c in cases {
            let held = c.held.clone();
            let mut t = Target::new(res(), 2, c.free.clone(), &held, &c.on_the_way);
            for (i, (node, want)) in c.nodes.iter().zip(&c.want).enumerate() {
                let got = t.take(node).map_err(|s| s.short);
                let want = want
                    .clone()
                    .map_err(|v| v.into_iter().map(|(r, n, f)| (r.to_string(), n, f)).collect::<Vec<_>>());
                assert_eq!(got, want, "{}: node {i}", c.name);
            }
            let free: Vec<u64> = t.room().iter().map(|r| r.free).collect();
            assert_eq!(free, c.free_after.to_vec(), "{}: free after", c.name);
        }
    }

    #[test]
    fn room_counts_held_devices_among_the_devices() {
        let t = Target::new(res(), 1, vec![gpu(), mig()], &[gpu(), gpu()], &d(&[]));
        assert_eq!(
            t.room(),
            vec![
                ResourceRoom { resource: "nvidia.com/gpu".into(), devices: 3, free: 1 },
                ResourceRoom { resource: "nvidia.com/mig-1g.10gb".into(), devices: 1, free: 1 },
            ]
        );
    }

    #[test]
    fn the_shortfall_says_how_many_of_which_resource_are_missing_and_what_to_do() {
        let s = Shortfall { short: vec![("nvidia.com/gpu".into(), 4, 1)], target_nodes: 2 };
        let m = s.to_string();
        assert!(m.contains("3 nvidia.com/gpu missing (the node's pods need 4, 1 free)"), "{m}");
        assert!(m.contains("2 Ready, schedulable node(s)"), "{m}");
        assert!(m.contains("spec.strategy.replace.evictWithoutCapacity"), "{m}");
    }
}
