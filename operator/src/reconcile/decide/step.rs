//! One node's step: the pool-wide view a step is decided on, the step itself (its action, the
//! node patch, the objects beside the node and the events it makes), and which nodes get one.

use std::collections::HashMap;

use crate::node::slim::SlimNode;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::{DeviceTaintRule, ResourceSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use k8s_openapi::jiff::Timestamp;
use kube::runtime::events::EventType;

use crate::api::v1alpha1::{CordonHolder, DrainSpec, GpuPoolMigrationSpec, NodeState, PodSelection};
use crate::node::drain::{self, PodRef};
use crate::node::patch::{self, NodePatch, fence_rule, node_patch, owner_ref, taint_rule};
pub(crate) use crate::node::record::gpus_before;
pub use crate::node::record::parse_since;
use crate::node::record::{Backend, PoolNode, gpus_before_map};
use crate::node::state::{self, Action, Canary, DrainCounts, Hold, Observed, WaitReason};
use crate::pool::gate::resources;
use crate::pool::overlap;
use crate::pool::selectors::{Published, Selected, Selectors};
use crate::reconcile::observe::{NodeReads, Snapshot};
use crate::well_known::*;

use super::{NodeEvent, node_counts, node_slices};
use crate::pool::rollout::Plan;

/// The pool-wide facts one node's step is decided on.
pub struct NodeView<'a> {
    pub spec: &'a GpuPoolMigrationSpec,
    pub migration: &'a str,
    pub owner: Option<OwnerReference>,
    pub canary_namespace: &'a str,
    pub hold: Option<Hold>,
    /// The pool's DeviceClass selectors, compiled once per reconcile.
    pub selectors: &'a Selectors,
    pub now: Timestamp,
    /// The device plugin's config, for what it shares where GPU Feature Discovery does not say.
    pub plugin_config: Option<&'a crate::pool::plugin_config::PluginConfig>,
    /// A NoExecute DeviceTaintRule evicts the pods with a generated claim on this control plane
    /// (`prerequisites::taint_eviction_reaches_extended_claims`).
    pub taint_eviction_reliable: bool,
}

/// One node's step: the action and every write it makes.
#[derive(Debug)]
pub struct NodeStep {
    pub node: String,
    pub from: NodeState,
    pub action: Action,
    /// Pods to evict (`Action::Evict`).
    pub evict: Vec<PodRef>,
    /// The canary to create (`Action::CreateCanary`).
    pub create_canary: Option<Pod>,
    /// Delete the canary of an earlier attempt (`Action::DeleteCanary`).
    pub delete_canary: bool,
    /// The rollback DeviceTaintRule to create (`Action::CreateTaintRule`).
    pub create_taint_rule: Option<DeviceTaintRule>,
    /// Turn the rule's effect to NoExecute (`Action::EscalateTaintRule`).
    pub escalate_taint_rule: bool,
    /// Pods to delete (`Action::DeletePastBudgets`).
    pub delete: Vec<PodRef>,
    /// Replace, rolling back: the fences of target nodes to create (`Action::CreateFences`).
    pub create_fences: Vec<DeviceTaintRule>,
    pub delete_taint_rule: bool,
    /// The node patch, conditional on the resourceVersion the step was decided on.
    pub patch: Option<NodePatch>,
    /// The canary is done with once the patch lands (`Action::Complete`): remove it, best effort.
    pub remove_finished_canary: bool,
    /// Published once the step's writes have landed.
    pub events: Vec<NodeEvent>,
    /// The node's status message once the step's writes have landed.
    pub message: String,
    /// The message in the status as last written: a warning goes out when it changes, not on
    /// every reconcile.
    pub last_message: Option<String>,
    /// The node's state and state-since once the step's writes have landed.
    pub state: NodeState,
    pub since: Option<Timestamp>,
    /// How long the drain took, when this step ends it.
    pub drain_seconds: Option<f64>,
    /// When to look at this node again at the latest: a GPU pod's deletion wakes the migration
    /// at once (the controller's pod mapper), but a pod the GPU-pod cache does not hold
    /// (`podSelection: All`) says nothing when it is gone. Set for an eviction (its grace period)
    /// and for pods terminating (their deletionTimestamp), each plus [`POD_GONE_SLACK`].
    pub recheck_after: Option<std::time::Duration>,
    /// Who holds the node's cordon once the step's writes have landed.
    pub cordoned_by: Option<CordonHolder>,
}

/// How long after a pod's grace period its kubelet has usually removed it.
pub const POD_GONE_SLACK: std::time::Duration = std::time::Duration::from_millis(250);
/// The grace period a pod without `terminationGracePeriodSeconds` gets (the API's default).
const DEFAULT_GRACE_SECONDS: i64 = 30;

impl NodeStep {
    /// A step that does nothing and changes nothing: the base of every step, and the whole step
    /// of a node whose reads failed.
    fn at_rest(pn: &PoolNode, last_message: Option<&str>) -> Self {
        NodeStep {
            node: pn.name.clone(),
            from: pn.state(),
            action: Action::Nothing,
            evict: Vec::new(),
            create_canary: None,
            delete_canary: false,
            create_taint_rule: None,
            escalate_taint_rule: false,
            delete: Vec::new(),
            create_fences: Vec::new(),
            delete_taint_rule: false,
            patch: None,
            remove_finished_canary: false,
            events: Vec::new(),
            message: last_message.unwrap_or_default().to_string(),
            last_message: last_message.map(str::to_string),
            state: pn.state(),
            since: parse_since(pn),
            drain_seconds: None,
            recheck_after: None,
            cordoned_by: patch::cordoned_by(pn, None),
        }
    }
}

/// When the pods a draining step evicts, or waits on, should be gone. Pure. An eviction takes
/// `spec.strategy.drain.gracePeriodSeconds`, else each pod's own grace period; a terminating pod
/// goes at its deletionTimestamp. The longest wait wins, plus [`POD_GONE_SLACK`].
pub fn recheck_after(
    pods: &[Pod],
    evict: &[PodRef],
    terminating: &[PodRef],
    grace_override: Option<i64>,
    now: Timestamp,
) -> Option<std::time::Duration> {
    let named = |refs: &[PodRef], p: &Pod| {
        refs.iter().any(|r| {
            Some(&r.name) == p.metadata.name.as_ref() && Some(&r.namespace) == p.metadata.namespace.as_ref()
        })
    };
    let evicted = pods.iter().filter(|p| named(evict, p)).map(|p| {
        let grace = grace_override
            .or_else(|| p.spec.as_ref().and_then(|s| s.termination_grace_period_seconds))
            .unwrap_or(DEFAULT_GRACE_SECONDS);
        std::time::Duration::from_secs(grace.max(0) as u64)
    });
    let going = pods.iter().filter(|p| named(terminating, p)).filter_map(|p| {
        let at = p.metadata.deletion_timestamp.as_ref()?.0;
        Some(std::time::Duration::from_millis(at.duration_since(now).as_millis().max(0) as u64))
    });
    evicted.chain(going).max().map(|d| d + POD_GONE_SLACK)
}

/// Each node in flight, then each node that starts now, decided on its own reads: a node whose
/// reads failed is not decided (it keeps its state, and execute reports its error).
pub(super) fn steps(s: &Snapshot<'_>, name: &str, p: &Plan, hold: Option<Hold>) -> Vec<NodeStep> {
    let gpm = s.gpm;
    let spec = &gpm.spec;
    let last_messages: HashMap<&str, &str> = gpm
        .status
        .iter()
        .flat_map(|s| &s.in_progress)
        .map(|p| (p.name.as_str(), p.message.as_str()))
        .collect();
    let selectors = Selectors::new(spec);
    let view = NodeView {
        spec,
        migration: name,
        owner: owner_ref(gpm),
        canary_namespace: &s.canary_namespace,
        hold,
        selectors: &selectors,
        now: s.now,
        plugin_config: s.plugin_config.as_ref(),
        taint_eviction_reliable: crate::pool::prerequisites::taint_eviction_reaches_extended_claims(
            &s.facts.control_plane,
        )
        .is_ok(),
    };
    let by_name: HashMap<&str, &SlimNode> =
        s.nodes.iter().map(|n| (n.metadata.name.as_deref().unwrap_or(""), n.as_ref())).collect();
    let no_reads = NodeReads::default();
    let shorts = room_by_node(s, p, &by_name);
    // Replace, rolling back: one returning node's step carries the return's evictions.
    let carrier = p.in_flight.iter().filter(|n| {
        by_name
            .get(n.as_str())
            .is_some_and(|node| crate::node::record::node_state(node) == NodeState::RollingBack)
            && s.returns.as_ref().is_some_and(|r| r.recorded.contains(n.as_str()))
    });
    let carrier = carrier.min().cloned();
    let mut steps = Vec::new();
    for (n, start) in p.in_flight.iter().map(|n| (n, false)).chain(p.to_start.iter().map(|n| (n, true))) {
        let Some(node) = by_name.get(n.as_str()) else { continue };
        let last = last_messages.get(n.as_str()).copied();
        if s.read_errors.contains_key(n) {
            // Not observed, so not decided: the node keeps its state, and execute reports the
            // error as this node's.
            steps.push(NodeStep::at_rest(&PoolNode::from_node(node), last));
            continue;
        }
        let reads = s.node_reads.get(n).unwrap_or(&no_reads);
        let published = node_counts(s, node).present;
        let carries = carrier.as_ref() == Some(n);
        let replace = spec.strategy.replace().map(|r| state::Replace {
            short: shorts.get(n).cloned().flatten(),
            evict_without_capacity: r.evict_without_capacity,
            returning: s.returns.as_ref().map(|ret| returning(ret, n, carries)),
        });
        let turn = Turn { start, last_message: last, replace };
        let mut step = node_step(&view, node, node_slices(s, node), published, reads, turn);
        if spec.strategy.replace().is_some() {
            replace_writes(&mut step, s, &view, node);
        }
        steps.push(step);
    }
    steps
}

/// What a node of a Replace rollback knows of the return ([`state::Returning`]); `carries`: its
/// step makes the return's evictions.
fn returning(r: &crate::reconcile::observe::Returns, node: &str, carries: bool) -> state::Returning {
    state::Returning {
        recorded: r.recorded.contains(node),
        left: r.plan.left,
        fenced: r.plan.fence.iter().all(|t| r.fences.contains_key(t)),
        evict: if carries { r.plan.evict.len() } else { 0 },
        room_short: r.plan.room_short.clone(),
    }
}

/// A Replace step's writes beside the state machine's: the record of what leaves a node as its
/// drain starts, a returning node's fences and evictions, and a warning when a node left for
/// removal carries an annotation with which its autoscaler never removes it.
fn replace_writes(step: &mut NodeStep, s: &Snapshot<'_>, v: &NodeView<'_>, node: &SlimNode) {
    match &step.action {
        Action::Retire => {
            let blockers = crate::pool::replace::removal_blockers(node);
            if !blockers.is_empty() {
                let note = format!(
                    "node {} is left cordoned for removal, but it carries {}; remove the annotation (kubectl annotate node {} <key>-), or delete the node yourself",
                    step.node,
                    blockers.join(" and "),
                    step.node
                );
                step.events.push(NodeEvent {
                    type_: EventType::Warning,
                    reason: "RemovalBlocked",
                    note: note.clone(),
                });
                step.message = format!("{}; {note}", step.message);
            }
        }
        Action::CordonAndDrain | Action::StartDrain => {
            let moved = s.replace.as_ref().and_then(|r| r.moved.get(&step.node)).filter(|m| !m.is_empty());
            if let (Some(moved), Some(patch)) = (moved, step.patch.as_mut()) {
                patch.annotate(ANNOTATION_MOVED, serde_json::to_string(moved).ok());
            }
        }
        Action::CreateFences => {
            let Some(r) = &s.returns else { return };
            for target in r.plan.fence.iter().filter(|t| !r.fences.contains_key(*t)) {
                let mut rule = fence_rule(target, &v.spec.driver.name, v.migration);
                rule.metadata.owner_references = v.owner.clone().map(|o| vec![o]);
                step.create_fences.push(rule);
            }
            let mut names: Vec<&str> = r.plan.fence.iter().take(5).map(String::as_str).collect();
            let more = r.plan.fence.len().saturating_sub(5);
            let more = format!("and {more} more");
            if r.plan.fence.len() > 5 {
                names.push(&more);
            }
            step.message = format!(
                "fencing the devices of {} on the {} target node(s) ({}) with NoSchedule DeviceTaintRules while pods come back from the target pool",
                v.spec.driver.name,
                r.plan.fence.len(),
                names.join(", ")
            );
            step.events.push(NodeEvent {
                type_: EventType::Normal,
                reason: "TargetFenced",
                note: step.message.clone(),
            });
        }
        Action::Evict if step.from == NodeState::RollingBack => {
            let Some(r) = &s.returns else { return };
            step.evict = r
                .plan
                .evict
                .iter()
                .map(|(_, namespace, name)| PodRef { namespace: namespace.clone(), name: name.clone() })
                .collect();
            step.message = format!(
                "evicting {} pod(s) from the target pool so that they come back to the old pool ({})",
                step.evict.len(),
                drain::names(&step.evict, 5)
            );
        }
        _ => {}
    }
}

/// What a node brings to its step besides itself and its reads.
pub struct Turn<'a> {
    /// The pool plan starts the node now.
    pub start: bool,
    /// Its status message as last written.
    pub last_message: Option<&'a str>,
    /// Replace: what it knows of the target pool (`replace_view`).
    pub replace: Option<state::Replace>,
}

/// Replace: what each node that drains, waits for room or starts lacks on the target pool
/// (`None` when its pods fit), judged by [`crate::pool::replace::judge`] (as `switchyard plan`
/// judges it): the nodes already draining take their room first (the pods they have left are on
/// their way), then the others in the order the steps run, so that no two nodes count the same
/// free device.
fn room_by_node(
    s: &Snapshot<'_>,
    p: &Plan,
    by_name: &HashMap<&str, &SlimNode>,
) -> HashMap<String, Option<String>> {
    let Some(r) = &s.replace else {
        return HashMap::new();
    };
    let spec = &s.gpm.spec;
    let drain_anyway = spec.strategy.replace().is_some_and(|r| r.evict_without_capacity);
    let candidates: Vec<crate::pool::replace::Candidate<'_>> = p
        .in_flight
        .iter()
        .chain(&p.to_start)
        .filter_map(|n| {
            let pods = r.pods.get(n)?;
            let draining = by_name
                .get(n.as_str())
                .is_some_and(|node| crate::node::record::node_state(node) == NodeState::Draining);
            Some(crate::pool::replace::Candidate { name: n, pods, draining })
        })
        .collect();
    crate::pool::replace::judge(r.target.clone(), &candidates, &spec.strategy.drain, drain_anyway)
        .into_iter()
        .map(|j| (j.node, j.short))
        .collect()
}

/// Decides one node's step from the node, its driver's slices for it (read only by a switch), the
/// devices of those the scheduler may allocate, its reads and the pool's view.
pub fn node_step(
    v: &NodeView<'_>,
    node: &SlimNode,
    slices: &[impl std::borrow::Borrow<ResourceSlice>],
    published: u64,
    reads: &NodeReads,
    turn: Turn<'_>,
) -> NodeStep {
    let Turn { start, last_message, replace } = turn;
    let spec = v.spec;
    let res = resources(spec);
    let pn = PoolNode::from_node(node);
    let name = pn.name.clone();
    let state = pn.state();

    let (selection, claim_holders) = pods_in_play(spec, &name, state, reads, &res);
    // The attempt is the Verifying state's start: a retry after a rollback stamps a new one.
    let attempt = parse_since(&pn).map(|t| t.as_second().to_string()).unwrap_or_default();
    let canary = canary(spec, state, reads, &attempt);

    let alloc = overlap::allocatable(node, &res);
    let (selected, unhealthy) = switch_devices(v, &pn, slices);
    // What DRA must publish for the node to count as switched: a shared GPU counts once.
    let dp_gpus = crate::pool::capacity::gpus_to_publish(node, &res, v.plugin_config);
    let observed = Observed {
        start,
        hold: v.hold,
        device_plugin_pods: reads.pods_read.then(|| {
            let dp = &spec.device_plugin.daemon_set;
            reads.pods.iter().filter(|p| drain::owned_by_daemon_set(p, &dp.namespace, &dp.name)).count()
        }),
        drain: DrainCounts { ..selection.counts() },
        // The node's devices, unhealthy ones included: the agent's interlock keeps them all out
        // until the device plugin's capacity is gone, and those do not count.
        dra_devices: published,
        dra_selected: selected.counted,
        selection_note: selected.note,
        claim_holders,
        taint_rule_exists: reads.taint_rule_exists,
        taint_rule_evicts: reads.taint_rule_evicts,
        taint_eviction_reliable: v.taint_eviction_reliable,
        canary,
        replace,
        ..Observed::of_node(spec, &pn, v.now, alloc.values().sum(), dp_gpus.values().sum())
    };
    let action = state::next_step(&observed);
    let mut step = NodeStep {
        action: action.clone(),
        message: String::new(),
        state: action.next_state().unwrap_or(state),
        since: if action.next_state().is_some() { Some(v.now) } else { parse_since(&pn) },
        ..NodeStep::at_rest(&pn, last_message)
    };

    beside_the_node(&mut step, v, node, &action, &selection, &attempt, last_message);
    drain_timing(&mut step, v, &pn, &action, reads, &selection);
    if let Some(mut patch) = node_patch(&action, &pn, v.migration, spec.placement, v.now, &dp_gpus) {
        // The patch lands only on the node as observed (see `NodeMetaPatch::resource_version`).
        patch.metadata.resource_version = node.metadata.resource_version.clone();
        step.cordoned_by = patch::cordoned_by(&pn, Some(&patch));
        step.patch = Some(patch);
        step.remove_finished_canary = action == Action::Complete && spec.strategy.verify.canary.is_some();
        let (type_, reason, note) = transition_event(&action, &name, state, &spec.driver.name);
        step.events.push(NodeEvent { type_, reason, note: note.clone() });
        step.message = note;
    }
    note_switch_done(&mut step, &name, state, &action, &unhealthy, &selected.shared);
    note_held_back(&mut step, node, &res, state, &action);
    step
}

/// A warning a step gives once: an event, and the same words appended to the node's message.
fn warn(step: &mut NodeStep, reason: &'static str, note: String) {
    step.message = format!("{}; {note}", step.message);
    step.events.push(NodeEvent { type_: EventType::Warning, reason, note });
}

/// What the switch says once, as it begins (the first backend label, from Draining): the GPUs the
/// device plugin held back as unhealthy then (capacity above allocatable), as a warning event and
/// in the node's message. The switch counts them (`gpus-before` is the larger of the two), and the
/// driver publishes them as its own health checks find them, which need not see what the plugin
/// saw (an XID is an event, delivered once): someone should look at those GPUs before workloads
/// land on them.
fn note_held_back(
    step: &mut NodeStep,
    node: &SlimNode,
    resources: &[&str],
    state: NodeState,
    action: &Action,
) {
    if state != NodeState::Draining || !matches!(action, Action::SwitchToDra | Action::StopDevicePlugin) {
        return;
    }
    let Some((what, all)) = overlap::held_back_words(node, resources) else { return };
    let name = node.name();
    let note = if all {
        format!(
            "node {name}: the device plugin served none of {what} when the switch began: its pod was restarting (its DaemonSet rolling, say), or it held every GPU back as unhealthy; the switch counts them, and the driver publishes them as its own health checks find them: unless it was a restart, check those GPUs (an XID in the node's kernel log, nvidia-smi) before workloads land on them"
        )
    } else {
        format!(
            "node {name}: the device plugin held back {what} as unhealthy when the switch began; the switch counts them, and the driver publishes them as its own health checks find them: check those GPUs (an XID in the node's kernel log, nvidia-smi) before workloads land on them"
        )
    };
    warn(step, "DevicePluginUnhealthyGpus", note);
}

/// What the pool's classes select of the node's DRA devices, and which of them are unhealthy:
/// only a switch waiting on its slices (Switching, on DRA, with its `gpus-before` recorded)
/// needs them; every other step gets nothing.
fn switch_devices(
    v: &NodeView<'_>,
    pn: &PoolNode,
    slices: &[impl std::borrow::Borrow<ResourceSlice>],
) -> (Selected, Vec<String>) {
    let (spec, name) = (v.spec, &pn.name);
    match (pn.state(), pn.backend(), gpus_before_map(pn)) {
        (NodeState::Switching, Backend::Dra, Some(before)) => (
            v.selectors.for_switch(
                overlap::present(slices, &spec.driver.name, name),
                &before,
                Published {
                    complete: overlap::pool_complete(slices, &spec.driver.name, name),
                    sharing_acknowledged: spec.acknowledge.gpu_sharing_loss,
                    shares: spec.driver.shares(),
                },
            ),
            overlap::unhealthy(slices, &spec.driver.name, name),
        ),
        _ => (Selected::default(), Vec::new()),
    }
}

/// A drain's timings: an eviction or a wait for terminating pods looks again as their grace
/// periods end, and a drain that ends in the switch records how long it took.
fn drain_timing(
    step: &mut NodeStep,
    v: &NodeView<'_>,
    pn: &PoolNode,
    action: &Action,
    reads: &NodeReads,
    selection: &drain::Selection,
) {
    if matches!(action, Action::Evict | Action::Wait { reason: WaitReason::PodsTerminating, .. }) {
        step.recheck_after = recheck_after(
            &reads.pods,
            &selection.evict,
            &selection.terminating,
            v.spec.strategy.drain.grace_period_seconds,
            v.now,
        );
    }
    if pn.state() == NodeState::Draining
        && matches!(action, Action::SwitchToDra | Action::StopDevicePlugin)
        && let Some(since) = parse_since(pn)
    {
        step.drain_seconds = Some(v.now.duration_since(since).as_secs_f64().max(0.0));
    }
}

/// What a switch says once, as it completes (Complete or StartVerify from Switching): the
/// unhealthy devices it counted, and the GPU sharing found at the switch, each as a warning event
/// and appended to the node's message.
fn note_switch_done(
    step: &mut NodeStep,
    name: &str,
    state: NodeState,
    action: &Action,
    unhealthy: &[String],
    shared: &[String],
) {
    if state != NodeState::Switching || !matches!(action, Action::Complete | Action::StartVerify) {
        return;
    }
    // Unhealthy devices counted: they are the node's GPUs, and the driver keeps them out of
    // scheduling until they recover.
    if !unhealthy.is_empty() {
        let note = format!(
            "node {name} switched with {} unhealthy device(s), counted and kept out of scheduling by their taints: {}",
            unhealthy.len(),
            unhealthy.join(", ")
        );
        warn(step, "UnhealthyDevices", note);
    }
    // Sharing found at the switch (no labels said so before the move), acknowledged.
    if !shared.is_empty() {
        let note = format!("node {name} switched on its physical devices: {}", shared.join("; "));
        warn(step, "GpuSharingFound", note);
    }
}

/// The pods a step judges: those a drain moves (a switch looks only at late arrivals; a pod
/// the scheduler served through a claim is DRA's), or, rolling back, those that hold a device of
/// the migration's driver on `node`, and how many.
fn pods_in_play(
    spec: &GpuPoolMigrationSpec,
    node: &str,
    state: NodeState,
    reads: &NodeReads,
    res: &[&str],
) -> (drain::Selection, usize) {
    let with_holders = |mut selection: drain::Selection| {
        let (daemon_set, mirror) = drain::gpu_holders_left(&reads.pods, res);
        selection.daemon_set_gpu_holders = daemon_set;
        selection.static_gpu_holders = mirror;
        selection
    };
    match state {
        NodeState::Draining => (with_holders(drain::select(&reads.pods, res, &spec.strategy.drain)), 0),
        NodeState::Switching => {
            let late: Vec<Pod> = reads
                .pods
                .iter()
                .filter(|p| p.status.as_ref().is_none_or(|s| s.extended_resource_claim_status.is_none()))
                .cloned()
                .collect();
            (with_holders(drain::select(&late, res, &spec.strategy.drain)), 0)
        }
        NodeState::RollingBack => {
            // The holders drain as a forward drain would, whatever pods it selects: each holds
            // a device the device plugin is about to serve again. A pod still being deleted
            // after its claims were deallocated counts too: the kubelet may still have to ask
            // the driver to unprepare them, and the driver must not leave before.
            let holding: Vec<Pod> = reads
                .pods
                .iter()
                .filter(|p| {
                    drain::holds_driver_device(p, &reads.claims, &spec.driver.name)
                        || drain::unpreparing(p, &reads.claims)
                })
                .cloned()
                .collect();
            let every_pod = DrainSpec { pod_selection: PodSelection::All, ..spec.strategy.drain.clone() };
            let mut selection = drain::select(&holding, res, &every_pod);
            selection.daemon_set_gpu_holders = drain::daemon_set_pods(&holding);
            let (holders, out_of_reach) =
                drain::driver_device_holders(&holding, &reads.claims, &spec.driver.name, node);
            let count =
                holders.len() + holding.iter().filter(|p| drain::unpreparing(p, &reads.claims)).count();
            selection.claim_holders = holders;
            selection.claim_holders_out_of_reach = out_of_reach;
            (selection, count)
        }
        _ => (drain::Selection::default(), 0),
    }
}

/// The canary of this verification attempt, as its pod reads.
fn canary(spec: &GpuPoolMigrationSpec, state: NodeState, reads: &NodeReads, attempt: &str) -> Canary {
    match (&spec.strategy.verify.canary, state) {
        (Some(_), NodeState::Verifying) => match &reads.canary {
            // Already going: wait for it to be gone before the new one.
            Some(p) if p.metadata.deletion_timestamp.is_some() => Canary::Running,
            p => crate::node::canary::outcome(p.as_ref(), attempt),
        },
        (Some(_), _) => Canary::Absent,
        (None, _) => Canary::NotConfigured,
    }
}

/// What an action does beside the node patch: the pods it evicts, the canary or the rollback's
/// DeviceTaintRule it creates or deletes, and the message and event of a wait only a person can
/// end.
fn beside_the_node(
    step: &mut NodeStep,
    v: &NodeView<'_>,
    node: &SlimNode,
    action: &Action,
    selection: &drain::Selection,
    attempt: &str,
    last_message: Option<&str>,
) {
    let spec = v.spec;
    let name = node.metadata.name.clone().unwrap_or_default();
    match action {
        Action::Wait { reason, message } => {
            wait_message(step, spec, *reason, message, selection, last_message)
        }
        Action::Evict => {
            step.evict = selection.evict.clone();
            step.message = format!("evicting {} pod(s)", step.evict.len());
        }
        Action::EvictGpuHolders => {
            step.evict = selection.daemon_set_gpu_holders.clone();
            let (held, through) = if step.from == NodeState::RollingBack {
                ("the driver's devices", "the device plugin")
            } else {
                ("device-plugin GPUs", "DRA")
            };
            step.message = format!(
                "evicting {} DaemonSet pod(s) that hold {held} ({}); spec.strategy.drain.evictDaemonSetGpuPods is set, and their new pods get GPUs through {through}",
                step.evict.len(),
                drain::names(&step.evict, 5)
            );
        }
        Action::CreateCanary => {
            if let Some(c) = &spec.strategy.verify.canary {
                let target = crate::node::canary::Target {
                    migration: v.migration,
                    owner: v.owner.clone(),
                    node: &name,
                    taints: &node.taints,
                    namespace: v.canary_namespace,
                    resource: resources(spec).first().copied().unwrap_or(NVIDIA_GPU_RESOURCE),
                    attempt,
                };
                step.create_canary = Some(crate::node::canary::pod(&target, c));
                step.message = "canary created".into();
            }
        }
        Action::DeleteCanary => {
            step.delete_canary = true;
            step.message = "deleting the canary of an earlier attempt".into();
        }
        Action::CreateTaintRule => {
            let mut rule = taint_rule(&name, &spec.driver.name, v.migration, "NoSchedule");
            rule.metadata.owner_references = v.owner.clone().map(|o| vec![o]);
            step.events.push(NodeEvent {
                type_: EventType::Normal,
                reason: "DeviceTaintRuleCreated",
                note: format!(
                    "fencing the devices of {} on {name} with {} (NoSchedule) while the eviction API drains their holders",
                    spec.driver.name,
                    rule.metadata.name.as_deref().unwrap_or_default()
                ),
            });
            step.create_taint_rule = Some(rule);
        }
        Action::EscalateTaintRule => {
            step.escalate_taint_rule = true;
            step.events.push(NodeEvent {
                type_: EventType::Warning,
                reason: "RollbackEvictsPastBudgets",
                note: format!(
                    "{} pod(s) on {name} still hold the devices of {} after spec.strategy.drain.timeoutSeconds; rollbackEvictsPastBudgets is set, so the rollback's DeviceTaintRule turns NoExecute and evicts them without consulting their PodDisruptionBudgets",
                    selection.claim_holders.len(),
                    spec.driver.name
                ),
            });
        }
        Action::DeletePastBudgets => {
            // What the rule would reach and evict: the holders not already terminating.
            step.delete = selection
                .claim_holders
                .iter()
                .filter(|p| {
                    !selection.terminating.contains(p) && !selection.claim_holders_out_of_reach.contains(p)
                })
                .cloned()
                .collect();
            if step.delete.is_empty() {
                // Only holders the rule would not reach are left: the wait names them.
                return;
            }
            step.events.push(NodeEvent {
                type_: EventType::Warning,
                reason: "RollbackDeletesPastBudgets",
                note: format!(
                    "{} pod(s) on {name} still hold the devices of {} after spec.strategy.drain.timeoutSeconds; rollbackEvictsPastBudgets is set, and this control plane's device-taint-eviction controller may not evict pods whose claim is in status.extendedResourceClaimStatus (before v1.37.2, or its version unknown: kubernetes/kubernetes#141290), so they are deleted as that controller would, without consulting their PodDisruptionBudgets: {}",
                    step.delete.len(),
                    spec.driver.name,
                    drain::names(&step.delete, 5)
                ),
            });
        }
        Action::DeleteTaintRule => step.delete_taint_rule = true,
        _ => {}
    }
}

/// A wait's message, with the pods it waits on. A wait only a person can end (pods a drain may
/// not evict, GPUs held by DaemonSet or static pods) is also a warning event, once per change.
fn wait_message(
    step: &mut NodeStep,
    spec: &GpuPoolMigrationSpec,
    reason: WaitReason,
    message: &str,
    selection: &drain::Selection,
    last_message: Option<&str>,
) {
    step.message = format!("{reason}: {message}");
    let named = match reason {
        WaitReason::EmptyDirBlocksDrain => Some(&selection.blocked_by_empty_dir),
        WaitReason::UnmanagedPodsBlockDrain => Some(&selection.unmanaged),
        WaitReason::GpuHeldByDaemonSetPod => Some(&selection.daemon_set_gpu_holders),
        WaitReason::GpuHeldByStaticPod => Some(&selection.static_gpu_holders),
        _ => None,
    };
    if reason == WaitReason::EvictingClaimHolders {
        // The rule evicts them; those it cannot reach only a person can move.
        step.message = format!("{} ({})", step.message, drain::names(&selection.claim_holders, 5));
        let stuck = &selection.claim_holders_out_of_reach;
        if !stuck.is_empty() {
            step.message = format!(
                "{}; {} hold devices of {} in a pool not named after the node, which the rollback's DeviceTaintRule does not select: delete them",
                step.message,
                drain::names(stuck, 5),
                spec.driver.name
            );
        }
    }
    if let Some(pods) = named {
        step.message = format!("{} ({})", step.message, drain::names(pods, 5));
        // Only a person can unblock these: say so once per change, not per reconcile.
        if last_message != Some(step.message.as_str()) {
            step.events.push(NodeEvent {
                type_: EventType::Warning,
                reason: reason.as_str(),
                note: step.message.clone(),
            });
        }
    }
}

/// The event a node patch makes: what the node went through, in words.
fn transition_event(
    action: &Action,
    name: &str,
    state: NodeState,
    driver: &str,
) -> (EventType, &'static str, String) {
    match action {
        Action::Fail { reason, message } => {
            (EventType::Warning, reason.as_str(), format!("node {name} failed in {state:?}: {message}"))
        }
        Action::SwitchToDevicePlugin => (
            EventType::Normal,
            "BackendDevicePlugin",
            format!("node {name} labelled back to the device plugin"),
        ),
        Action::CordonAndDrain => {
            (EventType::Normal, "NodeDraining", format!("node {name}: {state:?} → Draining (cordoned)"))
        }
        Action::StopDevicePlugin => (
            EventType::Normal,
            "NodeSwitching",
            format!(
                "node {name}: {state:?} → Switching; labelled {LABEL_GPU_BACKEND}={BACKEND_NONE}: the device plugin leaves first, the driver ({}) starts once it has gone",
                driver
            ),
        ),
        Action::StartDriver => (
            EventType::Normal,
            "DriverStarting",
            format!(
                "node {name}: the device plugin has left (allocatable 0, no plugin pod); labelled {LABEL_GPU_BACKEND}={BACKEND_DRA} so the driver starts"
            ),
        ),
        Action::Recordon => (
            EventType::Warning,
            "Recordoned",
            format!(
                "node {name} was uncordoned while {state:?}; cordoned again (the migration holds the cordon until the node has moved; deleting the migration hands a node that has not switched back, uncordoned)"
            ),
        ),
        Action::StartReturn => (
            EventType::Normal,
            "NodeRollingBack",
            format!(
                "node {name}: {state:?} → RollingBack; schedulable again, so that the pods that left it for the target pool come back"
            ),
        ),
        Action::RecordSince => {
            (EventType::Normal, "StateStamped", format!("node {name}: state-since was missing; stamped now"))
        }
        a => {
            let to = a.next_state().unwrap_or(state);
            (EventType::Normal, transition_reason(to), format!("node {name}: {state:?} → {to:?}"))
        }
    }
}

fn transition_reason(to: NodeState) -> &'static str {
    match to {
        NodeState::Pending => "NodePending",
        NodeState::Cordoned => "NodeCordoned",
        NodeState::Draining => "NodeDraining",
        NodeState::Switching => "NodeSwitching",
        NodeState::Verifying => "NodeVerifying",
        NodeState::Migrated => "NodeMigrated",
        NodeState::Failed => "NodeFailed",
        NodeState::RollingBack => "NodeRollingBack",
        NodeState::RolledBack => "NodeRolledBack",
        NodeState::Replaced => "NodeReplaced",
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::slice;
    use super::*;
    use crate::node::state::FailReason;
    use crate::pool::plugin_config::{ConfigSource, Pick, PluginConfig};
    use crate::pool::preview;
    use serde_json::{Value, json};

    const NOW: i64 = 1_000_000;
    const DRIVER: &str = "gpu.switchyard.dev";

    fn from<T: serde::de::DeserializeOwned>(v: Value) -> T {
        serde_json::from_value(v).expect("fixture")
    }

    fn spec(patch: &Value) -> GpuPoolMigrationSpec {
        let mut v = json!({
            "nodeSelector": {"matchLabels": {"pool": "a100"}},
            "resources": [{"extendedResourceName": "nvidia.com/gpu", "deviceClassName": DRIVER}],
            "driver": {"name": DRIVER, "daemonSet": {"namespace": "switchyard", "name": "driver"}},
            "devicePlugin": {"daemonSet": {"namespace": "gpu", "name": "plugin"}},
            "strategy": {"maxUnavailable": 1}
        });
        crate::testing::merge_patch(&mut v, patch);
        from(v)
    }

    /// A Ready pool node `n1` on the device plugin with 8 `nvidia.com/gpu`, `patch` merged in.
    fn node_json(patch: &Value) -> Value {
        let mut v = json!({
            "metadata": {"name": "n1", "resourceVersion": "7", "labels": {"pool": "a100"}},
            "status": {
                "allocatable": {"nvidia.com/gpu": "8"}, "capacity": {"nvidia.com/gpu": "8"},
                "conditions": [{"type": "Ready", "status": "True"}],
                "nodeInfo": {"kubeletVersion": "v1.37.2", "containerRuntimeVersion": "containerd://2.1.4"}
            }
        });
        crate::testing::merge_patch(&mut v, patch);
        v
    }

    /// The operator's step for `node` at `now`, nothing holding the pool, its pods read (none),
    /// `slices` its driver's.
    fn operator_step(
        spec: &GpuPoolMigrationSpec,
        config: Option<&PluginConfig>,
        node: &Value,
        slices: &[ResourceSlice],
        now: i64,
    ) -> NodeStep {
        let selectors = Selectors::new(spec);
        let view = NodeView {
            spec,
            migration: "a100",
            owner: None,
            canary_namespace: "switchyard-system",
            hold: None,
            selectors: &selectors,
            now: Timestamp::from_second(now).expect("a time"),
            plugin_config: config,
            taint_eviction_reliable: true,
        };
        let published = crate::cache::DeviceCounts::of(slices, DRIVER, "n1").present;
        let reads = NodeReads { pods_read: true, ..NodeReads::default() };
        let replace = spec.strategy.replace().map(|r| state::Replace {
            evict_without_capacity: r.evict_without_capacity,
            ..state::Replace::default()
        });
        let turn = Turn { start: false, last_message: None, replace };
        node_step(&view, &from(node.clone()), slices, published, &reads, turn)
    }

    /// `node` once `step`'s patch has landed.
    fn landed(mut node: Value, step: &NodeStep) -> Value {
        let patch = serde_json::to_value(step.patch.as_ref().expect("a patch")).expect("json");
        crate::testing::merge_patch(&mut node, &patch);
        node
    }

    /// What the operator's steps do to `node` (as the plan finds it) from the cordon on, each
    /// step's patch landing in turn: its step once cordoned and, where it goes on to switch, its
    /// step in the switch once the device plugin has left and the driver publishes `agent`
    /// devices, past the verify timeout.
    fn operator_walk(
        spec: &GpuPoolMigrationSpec,
        config: Option<&PluginConfig>,
        node: &Value,
        agent: usize,
    ) -> (Action, Option<Action>) {
        let mut n = node.clone();
        let cordon = json!({"metadata": {"annotations": {ANNOTATION_MIGRATION_STATE: "Cordoned"}},
            "spec": {"unschedulable": true}});
        crate::testing::merge_patch(&mut n, &cordon);
        let cordoned = operator_step(spec, config, &n, &[], NOW);
        if cordoned.action != Action::StartDrain {
            return (cordoned.action, None);
        }
        n = landed(n, &cordoned);
        let drained = operator_step(spec, config, &n, &[], NOW);
        if !matches!(drained.action, Action::SwitchToDra | Action::StopDevicePlugin) {
            return (cordoned.action, None);
        }
        n = landed(n, &drained);
        for r in resources(spec) {
            crate::testing::merge_patch(&mut n, &json!({"status": {"allocatable": {r: "0"}}}));
        }
        let slices = [slice("n1", agent)];
        let gone = operator_step(spec, config, &n, &slices, NOW);
        if gone.action == Action::StartDriver {
            n = landed(n, &gone);
        }
        let late = NOW + spec.strategy.verify.timeout_seconds + 1;
        (cordoned.action, Some(operator_step(spec, config, &n, &slices, late).action))
    }

    /// The plan's note on `node`, and whether a blocker names it.
    fn planned(spec: &GpuPoolMigrationSpec, config: Option<&PluginConfig>, node: &Value) -> (String, bool) {
        let ds = |ns: &str, name: &str| {
            from(json!({"metadata": {"namespace": ns, "name": name},
                "spec": {"selector": {}, "template": {"spec": {"containers": []}}}}))
        };
        let inputs = preview::Inputs {
            name: "a100".into(),
            spec: spec.clone(),
            exists: false,
            uid: String::new(),
            nodes: vec![from(node.clone())],
            pods: Default::default(),
            other_pods: Default::default(),
            pdbs: Vec::new(),
            facts: crate::testing::server_v1_37(),
            device_classes: Vec::new(),
            driver_daemonset: Some(ds("switchyard", "driver")),
            device_plugin_daemonset: Some(ds("gpu", "plugin")),
            device_plugin_config: config.cloned(),
            others: Vec::new(),
            slices: Vec::new(),
            findings: Vec::new(),
            skipped: Vec::new(),
            now: Timestamp::from_second(NOW).expect("a time"),
            target: None,
        };
        let r = preview::build(&inputs).expect("a plan");
        let n1 = r.nodes.iter().find(|n| n.name == "n1").expect("n1 in the plan");
        let named = r.blockers.iter().any(|b| b.starts_with("the device plugin on n1 advertises nothing"));
        (n1.note.clone(), named)
    }

    /// Shares `nvidia.com/gpu` 4 ways, advertised as `nvidia.com/gpu-ts` (a name GFD's labels do
    /// not speak for, so the config says how many GPUs are behind it).
    fn shared_config() -> PluginConfig {
        let source = ConfigSource {
            namespace: "gpu".into(),
            config_map: "plugin-config".into(),
            pick: Pick::Key("any".into()),
        };
        let file = "sharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/gpu\n      rename: nvidia.com/gpu-ts\n      replicas: 4\n";
        PluginConfig::new(source, Ok([("any".to_string(), file.to_string())].into()))
    }

    #[test]
    fn the_plan_names_a_node_for_what_the_operators_steps_do_to_it() {
        let in_place = json!({});
        let no_interlock = json!({"driver": {"devicePluginInterlock": false}});
        let replace = json!({"strategy": {"type": "Replace",
            "replace": {"targetNodeSelector": {"matchLabels": {"pool": "dra"}}}}});
        let shared =
            json!({"resources": [{"extendedResourceName": "nvidia.com/gpu-ts", "deviceClassName": DRIVER}]});
        let nothing = json!({"status": {"capacity": null, "allocatable": {"nvidia.com/gpu": "0"}}});
        let left =
            json!({"status": {"capacity": {"nvidia.com/gpu": "4"}, "allocatable": {"nvidia.com/gpu": "0"}}});
        let gfd = json!({"metadata": {"labels": {"nvidia.com/gpu.count": "4"}},
            "status": {"capacity": null, "allocatable": {"nvidia.com/gpu": "0"}}});
        let unhealthy = json!({"status": {"allocatable": {"nvidia.com/gpu": "6"}}});
        let renamed = |n: &str| {
            json!({"status": {"capacity": {"nvidia.com/gpu": null, "nvidia.com/gpu-ts": "16"},
                "allocatable": {"nvidia.com/gpu": null, "nvidia.com/gpu-ts": n}}})
        };
        // (shape, spec, the device plugin's config, node, devices the agent publishes, what the plan says)
        let cases: [(&str, &Value, bool, Value, usize, &str); 10] = [
            ("the device plugin advertises 8", &in_place, false, json!({}), 8, ""),
            ("the same, no interlock", &no_interlock, false, json!({}), 8, ""),
            ("two of 8 unhealthy: the agent counts them", &in_place, false, unhealthy, 8, ""),
            ("nothing at all", &in_place, false, nothing.clone(), 0, "GpuCountUnknown"),
            ("GFD's count only", &in_place, false, gfd, 4, ""),
            ("capacity, nothing allocatable", &in_place, false, left.clone(), 0, "SwitchTimeout"),
            ("the same, no interlock", &no_interlock, false, left, 0, "SwitchTimeout"),
            ("renamed and shared by the config", &shared, true, renamed("16"), 4, ""),
            ("the same, nothing allocatable", &shared, true, renamed("0"), 0, "SwitchTimeout"),
            ("nothing at all, Replace: the node never switches", &replace, false, nothing, 0, ""),
        ];
        for (shape, spec_patch, configured, patch, agent, want) in cases {
            let spec = spec(spec_patch);
            let config = configured.then(shared_config);
            let node = node_json(&patch);
            let (note, named) = planned(&spec, config.as_ref(), &node);
            let (cordoned, switching) = operator_walk(&spec, config.as_ref(), &node, agent);
            let operator = match (&cordoned, &switching) {
                (Action::Wait { reason: WaitReason::GpuCountUnknown, .. }, _) => "GpuCountUnknown",
                (_, Some(Action::Fail { reason: FailReason::SwitchTimeout, .. })) => "SwitchTimeout",
                _ => "",
            };
            let plan = ["GpuCountUnknown", "SwitchTimeout"]
                .into_iter()
                .find(|r| note.contains(&format!("({r})")))
                .unwrap_or_default();
            let why = format!("{shape}: plan {note:?}, operator {cordoned:?} then {switching:?}");
            assert_eq!(plan, operator, "{why}");
            assert_eq!(plan, want, "{why}");
            assert_eq!(named, !want.is_empty(), "{why}");
        }
    }
}
