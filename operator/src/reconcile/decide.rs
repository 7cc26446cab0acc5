//! Decide: pure. From one [`Snapshot`] it says everything a reconcile does: the DeviceClasses
//! and DaemonSet placement to apply, whether the gate is open and what holds the pool, each
//! moving node's one action with the node patch and events it makes, the status, the
//! migration's events and the metrics. `execute` carries it out; nothing here reads the API.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use crate::node::slim::SlimNode;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::{DeviceClass, DeviceTaintRule, ResourceSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{OwnerReference, Time};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::runtime::events::EventType;

use super::observe::{NodeReads, Snapshot};
use crate::api::v1alpha1::{
    Direction, FailedNode, GpuPoolMigrationSpec, GpuPoolMigrationStatus, NodeState, Phase,
};
use crate::cache::DeviceCounts;
use crate::error::{Error, Result};
use crate::node::drain::{self, PodRef};
use crate::node::patch::{NodePatch, node_patch, owner_ref, taint_rule};
use crate::node::record::{self, Backend, Failure, PoolNode};
use crate::node::state::{self, Action, Canary, DrainCounts, Hold, Observed, WaitReason};
use crate::pool::capacity::Block;
use crate::pool::device_classes::{self};
use crate::pool::gate::{self, PlacementPatch, resources};
use crate::pool::overlap;
use crate::pool::prerequisites;
use crate::pool::readers::{self, Finding, Severity};
use crate::pool::rollout::{self};
use crate::pool::selectors::{Selected, Selectors};
use crate::report::conditions::{self, ConditionType, Desired, Progress};
use crate::well_known::*;

/// How many findings the InventoryFindings message lists before pointing at the CLI.
const FINDINGS_IN_CONDITION: usize = 5;
/// Status lists are capped by the API schema.
pub const STATUS_LIST_MAX: usize = 64;
/// How many node names an event note lists before it says "...".
const NAMES_IN_EVENT: usize = 10;

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
    pub device_plugin_gpus: u64,
    pub dra_gpus: u64,
    pub overlap_nodes: i64,
}

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
    /// When to look at this node again: pods are not watched, so nothing else says when the
    /// evicted or terminating ones are gone. Set for an eviction (its grace period) and for pods
    /// terminating (their deletionTimestamp), each plus [`POD_GONE_SLACK`].
    pub recheck_after: Option<std::time::Duration>,
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

pub fn parse_since(pn: &PoolNode) -> Option<Timestamp> {
    pn.annotations.get(ANNOTATION_STATE_SINCE).and_then(|s| s.parse().ok())
}

/// The device-plugin GPUs per resource recorded when the drain started.
fn gpus_before_map(pn: &PoolNode) -> Option<BTreeMap<String, u64>> {
    pn.annotations.get(ANNOTATION_GPUS_BEFORE).and_then(|s| serde_json::from_str(s).ok())
}

pub(crate) fn gpus_before(pn: &PoolNode) -> Option<u64> {
    gpus_before_map(pn).map(|m| m.values().sum()).filter(|n| *n > 0)
}

/// Decides the whole reconcile.
pub fn pool(s: &Snapshot<'_>) -> Result<Decision> {
    let gpm = s.gpm;
    let spec = &gpm.spec;
    let name = gpm.name_any();
    let res = resources(spec);
    let now = s.now;
    let consuming = |n: &str| s.consuming_pods.get(n).copied();
    let schedulable = |n: &SlimNode| node_counts(s, n).schedulable;
    let gate = gate::judge(&gate::Inputs {
        name: &name,
        uid: gpm.metadata.uid.as_deref().unwrap_or_default(),
        spec,
        facts: &s.facts,
        nodes: &s.nodes,
        device_classes: s.device_classes.as_deref(),
        driver_ds: s.driver_ds.as_ref(),
        plugin_ds: s.plugin_ds.as_ref(),
        schedulable: &schedulable,
        consuming_pods: &consuming,
        others: &s.others,
    })
    .map_err(|message| Error::InvalidSpec { message })?;
    let hold = gate.hold();
    let needs_human = gate.needs_human();
    let gate::Gate {
        verdict,
        class_applies,
        class_statuses,
        classes: dc_readiness,
        classes_message: dc_message,
        placement_patches,
        placement_problems,
        placement_ready,
        placement_reason,
        overlaps,
        plan: mut p,
        open: gate_open,
        ..
    } = gate;
    // A closed gate starts no node: those that would start wait in the queue.
    if !gate_open {
        let held: Vec<String> = std::mem::take(&mut p.to_start);
        p.queued.extend(held);
    }
    let pool: Vec<PoolNode> = s
        .nodes
        .iter()
        .map(|n| {
            let mut pn = PoolNode::from_node(n);
            pn.consuming_pods = s.consuming_pods.get(&pn.name).copied().unwrap_or_default();
            pn
        })
        .collect();

    // Steps.
    let last_messages: HashMap<&str, &str> = gpm
        .status
        .iter()
        .flat_map(|s| &s.in_progress)
        .map(|p| (p.name.as_str(), p.message.as_str()))
        .collect();
    let selectors = Selectors::new(spec);
    let view = NodeView {
        spec,
        migration: &name,
        owner: owner_ref(gpm),
        canary_namespace: &s.canary_namespace,
        hold,
        selectors: &selectors,
        now,
    };
    let by_name: HashMap<&str, &SlimNode> =
        s.nodes.iter().map(|n| (n.metadata.name.as_deref().unwrap_or(""), n.as_ref())).collect();
    let no_reads = NodeReads::default();
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
        let published = node_counts(s, node).schedulable;
        steps.push(node_step(&view, node, node_slices(s, node), published, reads, start, last));
    }

    let mut events = Vec::new();
    // A node that was mid-move at the last status and is no longer in the pool was deleted (or
    // relabelled out of the selector): say so once, on the migration.
    let mut gone: Vec<&str> = last_messages.keys().copied().filter(|n| !by_name.contains_key(n)).collect();
    gone.sort_unstable();
    for g in gone {
        events.push(MigrationEvent {
            type_: EventType::Warning,
            reason: "NodeRemoved",
            action: "MigrateNode",
            note: format!(
                "node {g} left the pool mid-move (deleted, or no longer selected); it is dropped from the status"
            ),
            node: Some(g.to_string()),
        });
    }

    // Status.
    let failed_names: BTreeSet<&str> = p.failed.iter().map(String::as_str).collect();
    let failed: Vec<FailedNode> = pool
        .iter()
        .filter(|n| failed_names.contains(n.name.as_str()) || n.state() == NodeState::Failed)
        .filter_map(|n| {
            n.failure().map(|f| FailedNode {
                name: n.name.clone(),
                state: f.state,
                reason: f.reason,
                message: f.message,
            })
        })
        .take(STATUS_LIST_MAX)
        .collect();

    let mut other_findings: Vec<String> = verdict.warnings.clone();
    other_findings.extend(device_classes::warnings(spec));
    // Info findings alone say "this keeps working"; they do not make the condition True.
    let notable = s.inventory.iter().any(|f| f.severity > Severity::Info) || !other_findings.is_empty();

    let moving = p.in_flight.len() + p.to_start.len();
    let kp = Progress {
        in_flight: (moving > 0).then(|| {
            (
                "NodesMoving".to_string(),
                format!("{moving} node(s) moving, {} of {} migrated", p.counts.migrated, p.counts.total),
            )
        }),
        needs_human: needs_human.map(|(r, m)| (r.to_string(), m)),
        waiting: if spec.paused {
            Some(("Paused".to_string(), "spec.paused is true".to_string()))
        } else {
            queued_message(&p, gate_open, moving).map(|m| ("WaitingForNodes".to_string(), m))
        },
        done: p.done() && !p.owned.is_empty(),
    };
    let mut desired: Vec<Desired> = conditions::kstatus(&kp).into();
    desired.push(Desired::new(
        ConditionType::PrerequisitesMet,
        verdict.met,
        verdict.reason,
        verdict.message.clone(),
    ));
    desired.push(Desired::new(
        ConditionType::DeviceClassesReady,
        dc_readiness.ready(),
        dc_readiness.as_str(),
        dc_message,
    ));
    desired.push(if placement_ready {
        Desired::new(ConditionType::PlacementReady, true, "Placed", "both DaemonSets keep to their backend")
    } else if !placement_patches.is_empty() {
        let names: Vec<String> =
            placement_patches.iter().map(|p| format!("{}/{}", p.namespace, p.name)).collect();
        Desired::new(
            ConditionType::PlacementReady,
            false,
            "Applying",
            format!(
                "adding the backend node affinity to DaemonSet {} (spec.placement: Managed)",
                names.join(", ")
            ),
        )
    } else if placement_problems.is_empty() {
        Desired::new(
            ConditionType::PlacementReady,
            false,
            "DaemonSetMissing",
            "a DaemonSet is missing; see PrerequisitesMet",
        )
    } else {
        Desired::new(ConditionType::PlacementReady, false, placement_reason, placement_problems.join("\n"))
    });
    desired.push(match overlaps.first() {
        Some(o) => Desired::new(
            ConditionType::BackendOverlap,
            true,
            "BothBackends",
            format!("{o} ({} node(s) in total)", overlaps.len()),
        ),
        None => Desired::new(ConditionType::BackendOverlap, false, "NoOverlap", "every node has one backend"),
    });
    let conflict = (!p.refused.is_empty()).then(|| {
        let mut lines: Vec<String> = p.refused.iter().take(10).map(|r| r.message.clone()).collect();
        if p.refused.len() > 10 {
            lines.push(format!("and {} more", p.refused.len() - 10));
        }
        lines.join("\n")
    });
    desired.push(match &conflict {
        Some(m) => Desired::new(ConditionType::NodeConflict, true, "NodesRefused", m.clone()),
        None => Desired::new(
            ConditionType::NodeConflict,
            false,
            "NoConflict",
            "no other migration selects these nodes",
        ),
    });
    let inventory_text = inventory_message(&name, &s.inventory, &other_findings);
    desired.push(if notable {
        Desired::new(ConditionType::InventoryFindings, true, "Findings", inventory_text.clone())
    } else {
        Desired::new(ConditionType::InventoryFindings, false, "NoFindings", inventory_text.clone())
    });

    let old = gpm.status.clone().unwrap_or_default();
    let status = GpuPoolMigrationStatus {
        observed_generation: gpm.metadata.generation,
        phase: Some(phase(spec, &p, gate_open)),
        nodes: p.counts,
        in_progress: Vec::new(),
        failed,
        device_classes: class_statuses,
        conditions: conditions::merge(&old.conditions, &desired, gpm.metadata.generation, &Time(now)),
    };

    // One event when the inventory's findings change, so GitOps users see them in `kubectl describe`.
    let old_inventory = old.conditions.iter().find(|c| c.type_ == "InventoryFindings").map(|c| &c.message);
    let anything = !s.inventory.is_empty() || !other_findings.is_empty();
    if anything && old_inventory != Some(&inventory_text) {
        let type_ = if notable { EventType::Warning } else { EventType::Normal };
        events.push(on_migration(type_, "InventoryFindings", "Inventory", inventory_text.clone()));
    }
    // A Forward migration keeps its pool on DRA: nodes that join after Completed (an autoscaled
    // node group, a relabelled node) move too, and the phase says so until they have.
    if old.phase == Some(Phase::Completed) && p.counts.total > old.nodes.total {
        let joined: Vec<&String> = p.to_start.iter().chain(&p.queued).collect();
        let shown: Vec<&str> = joined.iter().take(NAMES_IN_EVENT).map(|n| n.as_str()).collect();
        let note = format!(
            "{} node(s) joined the pool after it completed ({}{}); they migrate now, and the phase reads Progressing (or Pending while a gate is closed) until they have",
            joined.len(),
            shown.join(", "),
            if joined.len() > shown.len() { ", ..." } else { "" }
        );
        events.push(on_migration(EventType::Normal, "NodesJoined", "SelectNodes", note));
    }
    // The acknowledged capacity change, once, under a reason of its own: the events API folds
    // events of one reason into a series that keeps the first note, so a changed
    // InventoryFindings note would not show.
    if let Some(ack) = verdict.warnings.iter().find(|w| w.contains(prerequisites::SHARING_ACKNOWLEDGED))
        && old_inventory.is_none_or(|m| !m.contains(ack.as_str()))
    {
        events.push(on_migration(
            EventType::Normal,
            "GpuSharingLossAcknowledged",
            "CheckPrerequisites",
            ack.clone(),
        ));
    }
    // One Warning event when the pool's nodes keep it from starting (or the reason changes).
    let old_prereq = old.conditions.iter().find(|c| c.type_ == "PrerequisitesMet");
    if [Block::UnmappedResources.reason(), Block::GpuSharingNotAcknowledged.reason()]
        .contains(&verdict.reason)
        && old_prereq.map(|c| (c.reason.as_str(), c.message.as_str()))
            != Some((verdict.reason, verdict.message.as_str()))
    {
        events.push(on_migration(
            EventType::Warning,
            verdict.reason,
            "CheckPrerequisites",
            verdict.message.clone(),
        ));
    }
    // One Warning event when the conflict starts (or changes), not one per reconcile.
    let old_conflict = old.conditions.iter().find(|c| c.type_ == "NodeConflict" && c.status == "True");
    if let Some(message) = &conflict
        && old_conflict.map(|c| &c.message) != Some(message)
    {
        events.push(on_migration(EventType::Warning, "NodeConflict", "SelectNodes", message.clone()));
    }

    // Metrics.
    let owned: BTreeSet<&str> = p.owned.iter().map(String::as_str).collect();
    let mut per_state: BTreeMap<String, (NodeState, i64)> = BTreeMap::new();
    for n in pool.iter().filter(|n| owned.contains(n.name.as_str())) {
        let st = n.state();
        per_state.entry(record::state_str(st)).or_insert((st, 0)).1 += 1;
    }
    let mut metrics = PoolMetrics {
        per_state: per_state.into_values().collect(),
        overlap_nodes: overlaps.len() as i64,
        ..Default::default()
    };
    for (n, pn) in s.nodes.iter().zip(&pool) {
        match pn.backend() {
            Backend::DevicePlugin => metrics.device_plugin_gpus += overlap::allocatable_total(n, &res),
            Backend::Dra => metrics.dra_gpus += node_counts(s, n).devices,
            // Mid-switch: the device plugin has left and the driver has not started.
            Backend::None => {}
        }
    }

    Ok(Decision { class_applies, placement_patches, gate_open, hold, steps, status, events, metrics, moving })
}

fn on_migration(
    type_: EventType,
    reason: &'static str,
    action: &'static str,
    note: String,
) -> MigrationEvent {
    MigrationEvent { type_, reason, action, note, node: None }
}

/// The devices of the migration's driver on `node`.
fn node_counts(s: &Snapshot<'_>, node: &SlimNode) -> DeviceCounts {
    node.metadata.name.as_deref().and_then(|n| s.dra_counts.get(n)).copied().unwrap_or_default()
}

/// The node-local slices of the migration's driver for `node`, with their devices where the
/// reconcile may switch it.
fn node_slices<'a>(s: &'a Snapshot<'_>, node: &SlimNode) -> &'a [Arc<ResourceSlice>] {
    node.metadata.name.as_deref().and_then(|n| s.slices.get(n)).map_or(&[], Vec::as_slice)
}

/// Decides one node's step from the node, its driver's slices for it (read only by a switch), the
/// devices of those the scheduler may allocate, its reads and the pool's view.
pub fn node_step(
    v: &NodeView<'_>,
    node: &SlimNode,
    slices: &[impl std::borrow::Borrow<ResourceSlice>],
    published: u64,
    reads: &NodeReads,
    start: bool,
    last_message: Option<&str>,
) -> NodeStep {
    let spec = v.spec;
    let res = resources(spec);
    let pn = PoolNode::from_node(node);
    let name = pn.name.clone();
    let state = pn.state();
    let failure = pn.failure();

    let mut selection = drain::Selection::default();
    let mut claim_holders = 0;
    match state {
        NodeState::Draining => selection = drain::select(&reads.pods, &res, &spec.strategy.drain),
        NodeState::Switching => {
            // Late arrivals only: a pod the scheduler served through a claim is DRA's.
            let late: Vec<Pod> = reads
                .pods
                .iter()
                .filter(|p| p.status.as_ref().is_none_or(|s| s.extended_resource_claim_status.is_none()))
                .cloned()
                .collect();
            selection = drain::select(&late, &res, &spec.strategy.drain);
        }
        NodeState::RollingBack => {
            claim_holders = reads.pods.iter().filter(|p| drain::holds_dra_claim(p)).count()
        }
        _ => {}
    }
    // The attempt is the Verifying state's start: a retry after a rollback stamps a new one.
    let attempt = parse_since(&pn).map(|t| t.as_second().to_string()).unwrap_or_default();
    let canary = match (&spec.strategy.verify.canary, state) {
        (Some(_), NodeState::Verifying) => match &reads.canary {
            // Already going: wait for it to be gone before the new one.
            Some(p) if p.metadata.deletion_timestamp.is_some() => Canary::Running,
            p => crate::node::canary::outcome(p.as_ref(), &attempt),
        },
        (Some(_), _) => Canary::Absent,
        (None, _) => Canary::NotConfigured,
    };

    let alloc = overlap::allocatable(node, &res);
    // What the pool's classes select of the node's DRA devices: only a switch waiting on its
    // slices needs it.
    let selected = match (state, pn.backend(), gpus_before_map(&pn)) {
        (NodeState::Switching, Backend::Dra, Some(before)) => {
            v.selectors.for_switch(overlap::schedulable(slices, &spec.driver.name, &name), &before)
        }
        _ => Selected::default(),
    };
    // What DRA must publish for the node to count as switched: a shared GPU counts once.
    let dp_gpus = crate::pool::capacity::gpus_to_publish(node, &res);
    let observed = Observed {
        state,
        since: parse_since(&pn),
        now: v.now,
        direction: spec.direction,
        start,
        hold: v.hold,
        on_failure: spec.strategy.on_failure,
        failed_during_rollback: failure.as_ref().is_some_and(Failure::during_rollback),
        unschedulable: pn.unschedulable,
        ready: pn.ready,
        backend: pn.backend(),
        interlock: spec.driver.interlocked(),
        device_plugin_pods: reads.pods_read.then(|| {
            let dp = &spec.device_plugin.daemon_set;
            reads.pods.iter().filter(|p| drain::owned_by_daemon_set(p, &dp.namespace, &dp.name)).count()
        }),
        drain: DrainCounts { ..selection.counts() },
        allocatable: alloc.values().sum(),
        device_plugin_gpus: dp_gpus.values().sum(),
        gpus_before: gpus_before(&pn),
        // Only devices the scheduler can allocate count: the agent keeps them tainted until the
        // device plugin's capacity is gone.
        dra_devices: published,
        dra_selected: selected.counted,
        selection_note: selected.note,
        claim_holders,
        taint_rule_exists: reads.taint_rule_exists,
        canary,
        drain_timeout_seconds: spec.strategy.drain.timeout_seconds,
        verify_timeout_seconds: spec.strategy.verify.timeout_seconds,
    };
    let action = state::next_step(&observed);
    let mut step = NodeStep {
        action: action.clone(),
        message: String::new(),
        state: action.next_state().unwrap_or(state),
        since: if action.next_state().is_some() { Some(v.now) } else { parse_since(&pn) },
        ..NodeStep::at_rest(&pn, last_message)
    };

    match &action {
        Action::Wait { reason, message } => {
            step.message = format!("{reason}: {message}");
            let named = match *reason {
                WaitReason::EmptyDirBlocksDrain => Some(&selection.blocked_by_empty_dir),
                WaitReason::UnmanagedPodsBlockDrain => Some(&selection.unmanaged),
                _ => None,
            };
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
        Action::Evict => {
            step.evict = selection.evict.clone();
            step.message = format!("evicting {} pod(s)", step.evict.len());
        }
        Action::CreateCanary => {
            if let Some(c) = &spec.strategy.verify.canary {
                let target = crate::node::canary::Target {
                    migration: v.migration,
                    owner: v.owner.clone(),
                    node: &name,
                    taints: &node.taints,
                    namespace: v.canary_namespace,
                    resource: res.first().copied().unwrap_or(NVIDIA_GPU_RESOURCE),
                    attempt: &attempt,
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
            let mut rule = taint_rule(&name, &spec.driver.name, v.migration);
            rule.metadata.owner_references = v.owner.clone().map(|o| vec![o]);
            step.events.push(NodeEvent {
                type_: EventType::Normal,
                reason: "DeviceTaintRuleCreated",
                note: format!(
                    "evicting DRA claim holders from {name} with {}",
                    rule.metadata.name.as_deref().unwrap_or_default()
                ),
            });
            step.create_taint_rule = Some(rule);
        }
        Action::DeleteTaintRule => step.delete_taint_rule = true,
        _ => {}
    }

    if matches!(action, Action::Evict | Action::Wait { reason: WaitReason::PodsTerminating, .. }) {
        step.recheck_after = recheck_after(
            &reads.pods,
            &selection.evict,
            &selection.terminating,
            spec.strategy.drain.grace_period_seconds,
            v.now,
        );
    }
    if state == NodeState::Draining
        && matches!(action, Action::SwitchToDra | Action::StopDevicePlugin)
        && let Some(since) = parse_since(&pn)
    {
        step.drain_seconds = Some(v.now.duration_since(since).as_secs_f64().max(0.0));
    }
    if let Some(mut patch) = node_patch(&action, &pn, v.migration, spec.placement, v.now, &dp_gpus) {
        // The patch lands only on the node as observed (see `NodeMetaPatch::resource_version`).
        patch.metadata.resource_version = node.metadata.resource_version.clone();
        step.patch = Some(patch);
        step.remove_finished_canary = action == Action::Complete && spec.strategy.verify.canary.is_some();
        let (type_, reason, note) = match &action {
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
                    spec.driver.name
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
            Action::RecordSince => (
                EventType::Normal,
                "StateStamped",
                format!("node {name}: state-since was missing; stamped now"),
            ),
            a => {
                let to = a.next_state().unwrap_or(state);
                (EventType::Normal, transition_reason(to), format!("node {name}: {state:?} → {to:?}"))
            }
        };
        step.events.push(NodeEvent { type_, reason, note: note.clone() });
        step.message = note;
    }
    step
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
    }
}

/// The InventoryFindings condition message: the summary, the most severe findings, and where to
/// see the rest.
pub fn inventory_message(migration: &str, findings: &[Finding], other: &[String]) -> String {
    let mut lines = vec![readers::summary(findings)];
    lines.extend(findings.iter().take(FINDINGS_IN_CONDITION).map(Finding::headline));
    if findings.len() > FINDINGS_IN_CONDITION {
        lines.push(format!("and {} more", findings.len() - FINDINGS_IN_CONDITION));
    }
    lines.extend(other.iter().cloned());
    if !findings.is_empty() {
        lines.push(format!("details and advice: switchyard inventory --migration {migration}"));
    }
    lines.join("\n")
}

/// Why queued nodes do not start, when nothing else says so: the budget is used by nodes the
/// migration did not make unavailable (NotReady, failed), or the queued nodes are NotReady.
pub fn queued_message(p: &rollout::Plan, gate_open: bool, moving: usize) -> Option<String> {
    if p.queued.is_empty() || p.halt.is_some() || !gate_open || moving > 0 {
        return None;
    }
    let names = |v: &[String]| {
        let mut s = v.iter().take(5).cloned().collect::<Vec<_>>().join(", ");
        if v.len() > 5 {
            s.push_str(&format!(" and {} more", v.len() - 5));
        }
        s
    };
    Some(if p.unavailable >= p.max_unavailable {
        format!(
            "{} node(s) queued: maxUnavailable is {} and {} pool node(s) are unavailable ({}); a node counts while it is NotReady or failed and cordoned",
            p.queued.len(),
            p.max_unavailable,
            p.unavailable,
            names(&p.unavailable_nodes)
        )
    } else {
        format!(
            "{} node(s) queued and NotReady ({}); each starts when its kubelet reports Ready",
            p.queued.len(),
            names(&p.queued)
        )
    })
}

/// The phase from the plan.
pub fn phase(spec: &GpuPoolMigrationSpec, p: &rollout::Plan, gate_open: bool) -> Phase {
    let moving = !p.in_flight.is_empty() || !p.to_start.is_empty();
    if p.halt.is_some() {
        return Phase::Paused;
    }
    if !gate_open && !moving && !p.done() {
        return Phase::Pending;
    }
    match (spec.direction, p.done(), p.failed.is_empty()) {
        (_, true, false) => Phase::Failed,
        (Direction::Forward, true, true) => Phase::Completed,
        (Direction::Forward, false, _) => Phase::Progressing,
        (Direction::Rollback, true, true) => Phase::RolledBack,
        (Direction::Rollback, false, _) => Phase::RollingBack,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::v1alpha1::{GpuPoolMigration, PlacementMode};
    use crate::pool::placement::Role;
    use crate::pool::rollout::{Halt, OtherMigration};
    use k8s_openapi::api::apps::v1::DaemonSet;
    use k8s_openapi::api::core::v1::Pod;
    use k8s_openapi::api::resource::v1::ResourceSlice;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
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

    fn slice(node: &str, devices: usize) -> ResourceSlice {
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
        assert_eq!(d.metrics.dra_gpus, 8);
        assert_eq!(d.metrics.overlap_nodes, 0, "a node mid-switch is not an overlap");
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
