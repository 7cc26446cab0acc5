//! What a reconcile reports about the migration: its conditions (kstatus and Switchyard's own),
//! its status, the events that say what changed, and the pool gauges. Pure.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::runtime::events::EventType;

use crate::api::v1alpha1::{
    Direction, FailedNode, GpuPoolMigrationSpec, GpuPoolMigrationStatus, NodeState, Phase, ReplaceStatus,
    TargetCapacity, UnverifiedPod,
};
use crate::node::record::{self, PoolNode};
use crate::node::verify;
use crate::pool::capacity::Block;
use crate::pool::device_classes::{self};
use crate::pool::gate::resources;
use crate::pool::overlap;
use crate::pool::prerequisites;
use crate::pool::readers::{self, Finding, Severity};
use crate::pool::rollout::{self};
use crate::reconcile::observe::Snapshot;
use crate::report::conditions::{self, ConditionType, Desired, Progress};
use crate::report::gpus;
use crate::well_known::NVIDIA_DRA_DRIVER;

use std::collections::HashSet;

use super::{MigrationEvent, PoolMetrics, STATUS_LIST_MAX, node_counts};
use crate::pool::gate::Gate;
use crate::pool::rollout::Plan;

/// How many findings the InventoryFindings message lists before pointing at the CLI.
const FINDINGS_IN_CONDITION: usize = 5;
/// How many node names an event note lists before it says "...".
const NAMES_IN_EVENT: usize = 10;

/// What a reconcile reports: the status, the migration's events and the pool gauges.
pub(super) struct Report {
    pub status: GpuPoolMigrationStatus,
    pub events: Vec<MigrationEvent>,
    pub metrics: PoolMetrics,
}

/// The status (conditions, counts, failed nodes), the migration's events and the metrics, from
/// the gate's judgement and the plan as held (`p`).
pub(super) fn report(
    s: &Snapshot<'_>,
    name: &str,
    gate: &Gate,
    needs_human: Option<(&'static str, String)>,
    p: &Plan,
    short_of_room: Option<String>,
) -> Report {
    let spec = &s.gpm.spec;
    let pool = &gate.pool;
    let findings = Findings::new(s, name, gate);
    let conflict = conflict(p);
    let moving = Moving { conflict: conflict.as_deref(), short_of_room };
    let desired = conditions(s, gate, needs_human, p, &findings, moving);
    let old = s.gpm.status.clone().unwrap_or_default();
    let status = GpuPoolMigrationStatus {
        observed_generation: s.gpm.metadata.generation,
        phase: Some(phase(spec, p, gate.open)),
        nodes: p.counts,
        in_progress: Vec::new(),
        failed: failed(pool, p),
        device_classes: gate.class_statuses.clone(),
        pods: s.pods.as_ref().map(|(pods, _)| pods.clone()),
        replace: replace_status(s, pool, old.replace.as_ref()),
        conditions: conditions::merge(&old.conditions, &desired, s.gpm.metadata.generation, &Time(s.now)),
    };
    let mut events = removed_nodes(s);
    let removable = desired.iter().find(|d| d.type_ == ConditionType::DevicePluginRemovable);
    events.extend(changes(&old, gate, p, &findings, conflict, removable));
    // One Warning event when the pods that fail verification change, not one per check.
    let old_pods = old.conditions.iter().find(|c| c.type_ == "PodsVerified").map(|c| &c.message);
    if let Some(now) = desired.iter().find(|d| d.type_ == ConditionType::PodsVerified && !d.status)
        && old_pods != Some(&now.message)
    {
        events.push(on_migration(EventType::Warning, "PodsNotVerified", "VerifyPods", now.message.clone()));
    }
    Report { status, events, metrics: metrics(s, pool, p, gate) }
}

/// A node that was mid-move at the last status and is no longer in the pool was deleted (or
/// relabelled out of the selector): say so once, on the migration.
fn removed_nodes(s: &Snapshot<'_>) -> Vec<MigrationEvent> {
    let pool: HashSet<&str> = s
        .nodes
        .iter()
        .filter_map(|n| n.metadata.name.as_deref())
        .chain(s.departed.iter().map(String::as_str))
        .collect();
    let mut gone: Vec<&str> = s
        .gpm
        .status
        .iter()
        .flat_map(|st| &st.in_progress)
        .map(|p| p.name.as_str())
        .filter(|n| !pool.contains(n))
        .collect();
    gone.sort_unstable();
    gone.dedup();
    gone.into_iter()
        .map(|g| MigrationEvent {
            type_: EventType::Warning,
            reason: "NodeRemoved",
            action: "MigrateNode",
            note: format!(
                "node {g} left the pool mid-move (deleted, or no longer selected); it is dropped from the status"
            ),
            node: Some(g.to_string()),
        })
        .collect()
}

/// `status.failed`: the nodes the plan counts failed, and any node whose record says Failed.
/// A Replace migration's status: the target's room as this reconcile read it (as last read when it
/// read none), and the old nodes left for removal.
fn replace_status(s: &Snapshot<'_>, pool: &[PoolNode], old: Option<&ReplaceStatus>) -> Option<ReplaceStatus> {
    s.gpm.spec.strategy.replace()?;
    let mut replaced_nodes: Vec<String> =
        pool.iter().filter(|n| n.state() == NodeState::Replaced).map(|n| n.name.clone()).collect();
    replaced_nodes.sort();
    replaced_nodes.truncate(STATUS_LIST_MAX);
    let (target_nodes, capacity) = match &s.replace {
        Some(r) => (
            r.target.target_nodes() as i32,
            r.target
                .room()
                .into_iter()
                .map(|x| TargetCapacity {
                    resource: x.resource,
                    devices: x.devices as i32,
                    free: x.free as i32,
                })
                .collect(),
        ),
        None => old.map(|o| (o.target_nodes, o.capacity.clone())).unwrap_or_default(),
    };
    Some(ReplaceStatus { target_nodes, capacity, replaced_nodes })
}

fn failed(pool: &[PoolNode], p: &Plan) -> Vec<FailedNode> {
    let failed_names: BTreeSet<&str> = p.failed.iter().map(String::as_str).collect();
    pool.iter()
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
        .collect()
}

/// What the InventoryFindings condition and event say: the capacity-reader findings, and the
/// warnings about the pool that block nothing.
struct Findings {
    /// Whether there is anything to say at all.
    any: bool,
    /// Whether anything above Info was found: Info findings alone say "this keeps working".
    notable: bool,
    /// The condition's message.
    text: String,
}

impl Findings {
    fn new(s: &Snapshot<'_>, name: &str, gate: &Gate) -> Self {
        // Beside the capacity readers' findings: the prerequisites' and the DeviceClass names'.
        let mut other: Vec<String> = gate.verdict.warnings.clone();
        other.extend(device_classes::warnings(&s.gpm.spec));
        let notable = s.inventory.iter().any(|f| f.severity > Severity::Info) || !other.is_empty();
        let text = inventory_message(name, &s.inventory, &other);
        Findings { any: !s.inventory.is_empty() || !other.is_empty(), notable, text }
    }
}

/// The NodeConflict message: the nodes refused because another migration owns or selects them.
fn conflict(p: &Plan) -> Option<String> {
    (!p.refused.is_empty()).then(|| {
        let mut lines: Vec<String> = p.refused.iter().take(10).map(|r| r.message.clone()).collect();
        if p.refused.len() > 10 {
            lines.push(format!("and {} more", p.refused.len() - 10));
        }
        lines.join("\n")
    })
}

/// What the conditions say of the nodes in flight besides their count.
struct Moving<'a> {
    /// Nodes another migration also selects (the NodeConflict message).
    conflict: Option<&'a str>,
    /// Replace: a node waits cordoned for room on the target pool (`node <name>: <message>`).
    short_of_room: Option<String>,
}

/// Every condition, as this reconcile decides it: kstatus's three, then Switchyard's own.
fn conditions(
    s: &Snapshot<'_>,
    gate: &Gate,
    needs_human: Option<(&'static str, String)>,
    p: &Plan,
    findings: &Findings,
    Moving { conflict, short_of_room }: Moving<'_>,
) -> Vec<Desired> {
    let spec = &s.gpm.spec;
    let moving = p.in_flight.len() + p.to_start.len();
    let kp = Progress {
        in_flight: (moving > 0).then(|| {
            let counts =
                format!("{moving} node(s) moving, {} of {} migrated", p.counts.migrated, p.counts.total);
            // Waiting for room is what `kubectl get gpm` should say: someone must add target
            // nodes, and nothing else will.
            match &short_of_room {
                Some(m) => ("TargetCapacityShort".to_string(), format!("{counts}; {m}")),
                None => ("NodesMoving".to_string(), counts),
            }
        }),
        needs_human: needs_human.map(|(r, m)| (r.to_string(), m)),
        waiting: if spec.paused {
            Some(("Paused".to_string(), "spec.paused is true".to_string()))
        } else {
            queued_message(p, gate.open, moving).map(|m| ("WaitingForNodes".to_string(), m))
        },
        done: p.done() && !p.owned.is_empty() && p.refused.is_empty(),
    };
    let mut desired: Vec<Desired> = conditions::kstatus(&kp).into();
    desired.push(Desired::new(
        ConditionType::PrerequisitesMet,
        gate.verdict.met,
        gate.verdict.reason,
        gate.verdict.message.clone(),
    ));
    desired.push(Desired::new(
        ConditionType::DeviceClassesReady,
        gate.classes.ready(),
        gate.classes.as_str(),
        gate.classes_message.clone(),
    ));
    desired.push(if gate.placement_ready {
        Desired::new(ConditionType::PlacementReady, true, "Placed", "both DaemonSets keep to their backend")
    } else if !gate.placement_patches.is_empty() {
        let names: Vec<String> =
            gate.placement_patches.iter().map(|p| format!("{}/{}", p.namespace, p.name)).collect();
        Desired::new(
            ConditionType::PlacementReady,
            false,
            "Applying",
            format!(
                "adding the backend node affinity to DaemonSet {} (spec.placement: Managed)",
                names.join(", ")
            ),
        )
    } else if gate.placement_problems.is_empty() {
        Desired::new(
            ConditionType::PlacementReady,
            false,
            "DaemonSetMissing",
            "a DaemonSet is missing; see PrerequisitesMet",
        )
    } else {
        Desired::new(
            ConditionType::PlacementReady,
            false,
            gate.placement_reason,
            gate.placement_problems.join("\n"),
        )
    });
    desired.push(match (gate.overlaps.first(), &gate.pod_overlap) {
        (Some(o), _) => Desired::new(
            ConditionType::BackendOverlap,
            true,
            "BothBackends",
            format!("{o} ({} node(s) in total)", gate.overlaps.len()),
        ),
        (None, Some(message)) => {
            Desired::new(ConditionType::BackendOverlap, true, "PodOnDevicePlugin", message.clone())
        }
        (None, None) => {
            Desired::new(ConditionType::BackendOverlap, false, "NoOverlap", "every node has one backend")
        }
    });
    desired.push(match conflict {
        Some(m) => Desired::new(ConditionType::NodeConflict, true, "NodesRefused", m.to_string()),
        None => Desired::new(
            ConditionType::NodeConflict,
            false,
            "NoConflict",
            "no other migration selects these nodes",
        ),
    });
    desired.push(if findings.notable {
        Desired::new(ConditionType::InventoryFindings, true, "Findings", findings.text.clone())
    } else {
        Desired::new(ConditionType::InventoryFindings, false, "NoFindings", findings.text.clone())
    });
    desired.extend(device_plugin_removable(s, gate, p));
    desired.extend(pods_verified(s));
    desired
}

/// How many unverified pods the PodsVerified message names.
const PODS_IN_CONDITION: usize = 5;

/// The PodsVerified condition, once the pods of migrated nodes have been checked.
fn pods_verified(s: &Snapshot<'_>) -> Option<Desired> {
    let (pods, _) = s.pods.as_ref()?;
    let driver = &s.gpm.spec.driver.name;
    if pods.unverified == 0 {
        return Some(Desired::new(
            ConditionType::PodsVerified,
            true,
            "PodsOnDriver",
            format!(
                "{} running GPU pod(s) on migrated nodes, each served through its claim by {driver}'s devices on its node",
                pods.verified
            ),
        ));
    }
    let mut lines = vec![format!(
        "{} of {} running GPU pod(s) on migrated nodes are not served by {driver}'s devices on their node:",
        pods.unverified,
        pods.verified + pods.unverified
    )];
    lines.extend(
        pods.unverified_pods
            .iter()
            .take(PODS_IN_CONDITION)
            .map(|p| format!("{}/{} on {}: {}: {}", p.namespace, p.name, p.node, p.reason, p.message)),
    );
    if pods.unverified as usize > PODS_IN_CONDITION {
        lines.push(format!("and {} more (status.pods)", pods.unverified as usize - PODS_IN_CONDITION));
    }
    Some(Desired::new(ConditionType::PodsVerified, false, "PodsNotVerified", lines.join("\n")))
}

/// The BackendOverlap message for the checked pods that hold a device-plugin GPU on a migrated
/// node, if any: the first one, and how many.
pub(super) fn pod_overlap(s: &Snapshot<'_>) -> Option<String> {
    let pods = device_plugin_pods(s);
    let pod = pods.first()?;
    Some(format!(
        "pod {}/{} on migrated node {}: {} ({} pod(s) in total)",
        pod.namespace,
        pod.name,
        pod.node,
        pod.message,
        pods.len()
    ))
}

/// The checked pods that hold a device-plugin GPU on a migrated node: an overlap.
fn device_plugin_pods<'a>(s: &'a Snapshot<'_>) -> Vec<&'a UnverifiedPod> {
    let reason = verify::Fault::HoldsDevicePluginGpu.reason();
    s.pods.iter().flat_map(|(p, _)| &p.unverified_pods).filter(|p| p.reason == reason).collect()
}

/// What NVIDIA's DRA driver chart still needs once the device plugin is gone. Its override reads
/// as a coexistence waiver, so a values clean-up after the runbook's last step would drop it; but
/// the chart (`templates/validation.yaml`, v0.5.0) refuses `resources.gpus.enabled` without it
/// whether or not a device plugin runs, so the release's next upgrade or sync would fail.
const NVIDIA_CHART_OVERRIDE: &str = "; keep gpuResourcesEnabledOverride=true in NVIDIA's DRA driver chart's values: the chart refuses to enable GPUs without it even with no device plugin left, so a release upgraded or synced without it fails to render";

/// The DevicePluginRemovable condition of a forward migration: whether the runbook's last step
/// may delete the device plugin now. A rollback returns nodes to it, so it says nothing there.
fn device_plugin_removable(s: &Snapshot<'_>, gate: &Gate, p: &Plan) -> Option<Desired> {
    let spec = &s.gpm.spec;
    if spec.direction != Direction::Forward {
        return None;
    }
    let dp = &spec.device_plugin.daemon_set;
    let name = format!("{}/{}", dp.namespace, dp.name);
    let nvidia = if spec.driver.name == NVIDIA_DRA_DRIVER { NVIDIA_CHART_OVERRIDE } else { "" };
    let to_move = p.counts.total.saturating_sub(p.counts.migrated);
    let still = |reason: &str, message: String| {
        Desired::new(ConditionType::DevicePluginRemovable, false, reason, message)
    };
    let Some(ds) = &s.plugin_ds else {
        return Some(if gate.device_plugin_needed {
            still("DevicePluginMissing", format!("DaemonSet {name} is missing; see PrerequisitesMet"))
        } else {
            Desired::new(
                ConditionType::DevicePluginRemovable,
                true,
                "DevicePluginRemoved",
                format!(
                    "DaemonSet {name} is gone and no node left to move needs it; nodes that join the pool move to DRA{nvidia}"
                ),
            )
        });
    };
    // The DaemonSet controller's count, once it has seen the DaemonSet's current generation.
    let scheduled = ds
        .status
        .as_ref()
        .filter(|st| st.observed_generation.is_some_and(|g| Some(g) >= ds.metadata.generation))
        .map(|st| st.desired_number_scheduled);
    Some(match scheduled {
        None => still(
            "DevicePluginInUse",
            format!("the DaemonSet controller has not reported where DaemonSet {name} runs yet"),
        ),
        Some(0) if !gate.device_plugin_needed => Desired::new(
            ConditionType::DevicePluginRemovable,
            true,
            "DevicePluginUnused",
            format!("DaemonSet {name} runs on no node: delete it (the runbook's last step){nvidia}"),
        ),
        Some(n) if to_move > 0 => still(
            "DevicePluginInUse",
            format!("DaemonSet {name} runs on {n} node(s); {to_move} node(s) of this pool are still to move"),
        ),
        Some(0) => still("DevicePluginInUse", format!("nodes left to move still need DaemonSet {name}")),
        Some(n) => still(
            "DevicePluginInUse",
            format!(
                "DaemonSet {name} still runs on {n} node(s) outside this pool; move them (a GpuPoolMigration that selects them) before deleting it"
            ),
        ),
    })
}

/// The migration's events that say what changed since the last status: the findings, nodes that
/// joined a completed pool, an acknowledged capacity change, a pool its nodes keep from
/// starting, a device plugin that may go, a conflict with another migration. Each once, not once
/// per reconcile.
fn changes(
    old: &GpuPoolMigrationStatus,
    gate: &Gate,
    p: &Plan,
    findings: &Findings,
    conflict: Option<String>,
    removable: Option<&Desired>,
) -> Vec<MigrationEvent> {
    let mut events = Vec::new();
    // One event when the inventory's findings change, so GitOps users see them in `kubectl describe`.
    let old_inventory = old.conditions.iter().find(|c| c.type_ == "InventoryFindings").map(|c| &c.message);
    if findings.any && old_inventory != Some(&findings.text) {
        let type_ = if findings.notable { EventType::Warning } else { EventType::Normal };
        events.push(on_migration(type_, "InventoryFindings", "Inventory", findings.text.clone()));
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
    if let Some(ack) = gate.verdict.warnings.iter().find(|w| w.contains(prerequisites::SHARING_ACKNOWLEDGED))
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
        .contains(&gate.verdict.reason)
        && old_prereq.map(|c| (c.reason.as_str(), c.message.as_str()))
            != Some((gate.verdict.reason, gate.verdict.message.as_str()))
    {
        events.push(on_migration(
            EventType::Warning,
            gate.verdict.reason,
            "CheckPrerequisites",
            gate.verdict.message.clone(),
        ));
    }
    // One event when the device plugin becomes removable, so the runbook's last step is announced.
    let was_removable =
        old.conditions.iter().any(|c| c.type_ == "DevicePluginRemovable" && c.status == "True");
    if let Some(now) = removable.filter(|d| d.status && !was_removable) {
        events.push(on_migration(
            EventType::Normal,
            "DevicePluginRemovable",
            "CheckDevicePlugin",
            now.message.clone(),
        ));
    }
    // One Warning event when the conflict starts (or changes), not one per reconcile.
    let old_conflict = old.conditions.iter().find(|c| c.type_ == "NodeConflict" && c.status == "True");
    if let Some(message) = &conflict
        && old_conflict.map(|c| &c.message) != Some(message)
    {
        events.push(on_migration(EventType::Warning, "NodeConflict", "SelectNodes", message.clone()));
    }
    events
}

/// The pool gauges: owned nodes by state, nodes served by both backends, and the GPUs each
/// backend serves.
fn metrics(s: &Snapshot<'_>, pool: &[PoolNode], p: &Plan, gate: &Gate) -> PoolMetrics {
    let res = resources(&s.gpm.spec);
    let owned: BTreeSet<&str> = p.owned.iter().map(String::as_str).collect();
    let mut per_state: BTreeMap<String, (NodeState, i64)> = BTreeMap::new();
    for n in pool.iter().filter(|n| owned.contains(n.name.as_str())) {
        let st = n.state();
        per_state.entry(record::state_str(st)).or_insert((st, 0)).1 += 1;
    }
    // A node whose pod holds a device-plugin GPU after it migrated is served by both too.
    let mut overlapping: BTreeSet<&str> = gate.overlaps.iter().map(|o| o.node.as_str()).collect();
    overlapping.extend(device_plugin_pods(s).into_iter().map(|p| p.node.as_str()));
    let mut metrics = PoolMetrics {
        per_state: per_state.into_values().collect(),
        overlap_nodes: overlapping.len() as i64,
        ..Default::default()
    };
    // Every GPU by what serves it now, counted as the physical GPU it is (see `report::gpus`).
    for n in s.nodes.iter() {
        let dra = node_counts(s, n);
        let serving = gpus::serving(overlap::allocatable_total(n, &res) > 0, dra);
        metrics.gpus.add(serving, gpus::physical(n, dra));
    }
    metrics
}

fn on_migration(
    type_: EventType,
    reason: &'static str,
    action: &'static str,
    note: String,
) -> MigrationEvent {
    MigrationEvent { type_, reason, action, note, node: None }
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
    // Refused nodes are never moved: a pool with any cannot reach its goal without a person.
    match (spec.direction, p.done(), p.failed.is_empty() && p.refused.is_empty()) {
        (_, true, false) => Phase::Failed,
        (Direction::Forward, true, true) => Phase::Completed,
        (Direction::Forward, false, _) => Phase::Progressing,
        (Direction::Rollback, true, true) => Phase::RolledBack,
        (Direction::Rollback, false, _) => Phase::RollingBack,
    }
}
