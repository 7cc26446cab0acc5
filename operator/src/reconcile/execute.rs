//! Execute: carries a [`Decision`] out. Each node's writes are that node's: an error goes into
//! its status message and an event, and the other nodes still get their step. The status is
//! written on every reconcile that got this far, whatever failed on the way.

use std::collections::HashMap;

use futures::StreamExt;

use crate::node::slim::SlimNode;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{ObjectReference, Pod};
use k8s_openapi::api::resource::v1::{DeviceClass, DeviceTaintRule};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::Action as Requeue;
use kube::runtime::events::EventType;
use kube::{Client, Resource, ResourceExt};
use serde::Serialize;
use tracing::{debug, info, warn};

use super::decide::{
    Decision, MigrationEvent, NodeEvent, NodeStep, PoolMetrics, STATUS_LIST_MAX, parse_since,
};
use super::observe::Snapshot;
use crate::api::v1alpha1::{GpuPoolMigration, GpuPoolMigrationStatus, NodeProgress, NodeState};
use crate::error::{Error, Result};
use crate::node::drain;
use crate::node::patch::NodePatch;
use crate::node::record::PoolNode;
use crate::pool::gate::PlacementPatch;
use crate::reconcile::context::{Context, POD_VERIFY_TTL, REQUEUE_ACTIVE, REQUEUE_ERROR, REQUEUE_IDLE};
use crate::report::conditions::ConditionType;
use crate::report::events;
use crate::report::metrics::{ErrorLabels, EvictionLabels, MigrationLabels, PhaseLabels};
use crate::well_known::OPERATOR_FIELD_MANAGER;

/// How many nodes' steps run at once: a 10% budget of a large pool moves hundreds of nodes, each
/// step a request or two; 64 keeps a reconcile of 500 nodes in flight to a few round trips each,
/// well inside the API server's default 200 mutating requests in flight.
const STEP_CONCURRENCY: usize = 64;

/// How many events are published at once, after the steps: an event never holds up a node's
/// step, and a reconcile's events go out side by side.
const EVENT_CONCURRENCY: usize = 32;

/// How the status message of a node whose step failed begins.
pub(crate) const STEP_ERROR: &str = "StepError: ";

/// What one node's step did, for status.
pub struct NodeOutcome {
    pub state: NodeState,
    pub since: Option<k8s_openapi::jiff::Timestamp>,
    pub message: String,
    /// The step's `recheck_after`, unless an eviction was refused (a PDB, throttling): those are
    /// retried at the usual pace, not at the grace period.
    pub recheck_after: Option<std::time::Duration>,
    /// The step's events, published once every step has run ([`publish_node_events`]).
    pub events: Vec<NodeEvent>,
}

/// Applies the DeviceClasses and the placement the decision asks for. The gate is closed while
/// either is being applied, so a failure here holds the pool; it is counted and told in the
/// condition, and retried soon. Returns how many writes failed.
async fn apply_classes_and_placement(
    ctx: &Context,
    name: &str,
    classes: &[DeviceClass],
    placement: &[PlacementPatch],
    status: &mut GpuPoolMigrationStatus,
) -> usize {
    let mut errors = 0;
    for dc in classes {
        if let Err(e) = apply_device_class(&ctx.client, dc).await {
            errors += 1;
            report(ctx, name, &e);
            note_failure(status, ConditionType::DeviceClassesReady, &e);
        }
    }
    for p in placement {
        let res = Api::<DaemonSet>::namespaced(ctx.client.clone(), &p.namespace)
            .patch(&p.name, &PatchParams::apply(OPERATOR_FIELD_MANAGER).force(), &Patch::Apply(&p.patch))
            .await;
        match res {
            Ok(_) => info!(daemonset = %format!("{}/{}", p.namespace, p.name), "added backend node affinity"),
            Err(source) => {
                let e =
                    Error::PatchDaemonSet { namespace: p.namespace.clone(), name: p.name.clone(), source };
                errors += 1;
                report(ctx, name, &e);
                note_failure(status, ConditionType::PlacementReady, &e);
            }
        }
    }
    errors
}

/// The status's progress lines (a node at rest is not listed, unless its step failed: a failed
/// start keeps its error in the status until the retry lands), the soonest recheck a step asked
/// for, and how many steps failed.
fn progress(
    steps: &[NodeStep],
    outcomes: Vec<(Option<NodeOutcome>, bool)>,
) -> (Vec<NodeProgress>, Option<std::time::Duration>, usize) {
    let mut progress = Vec::new();
    let mut recheck: Option<std::time::Duration> = None;
    let mut errors = 0;
    for (step, (out, failed)) in steps.iter().zip(outcomes) {
        errors += usize::from(failed);
        let Some(out) = out else { continue };
        if let Some(r) = out.recheck_after {
            recheck = Some(recheck.map_or(r, |x| x.min(r)));
        }
        let at_rest = matches!(
            out.state,
            NodeState::Migrated | NodeState::RolledBack | NodeState::Pending | NodeState::Replaced
        );
        if !at_rest || out.message.starts_with(STEP_ERROR) {
            progress.push(NodeProgress {
                name: step.node.clone(),
                state: out.state,
                since: out.since.map(status_time),
                message: out.message,
                cordoned_by: step.cordoned_by,
            });
        }
    }
    progress.truncate(STATUS_LIST_MAX);
    (progress, recheck, errors)
}

/// The pool gauges, and which reason stalls the migration.
fn set_metrics(ctx: &Context, name: &str, m: &PoolMetrics, status: &GpuPoolMigrationStatus) {
    ctx.metrics.set_nodes(name, &m.per_state);
    ctx.metrics.set_gpus(name, m.gpus);
    ctx.metrics
        .backend_overlap_nodes
        .get_or_create(&MigrationLabels { migration: name.to_string() })
        .set(m.overlap_nodes);
    let stalled = status.conditions.iter().find(|c| c.type_ == "Stalled" && c.status == "True");
    ctx.metrics.set_stalled(name, stalled.map(|c| c.reason.as_str()));
}

/// Deletes the Replace rollback's fences no target node needs any more; returns how many failed
/// (logged, and tried again next reconcile).
async fn delete_fences(ctx: &Context, migration: &str, names: &[String]) -> usize {
    let rules: Api<DeviceTaintRule> = Api::all(ctx.client.clone());
    let mut failed = 0;
    for name in names {
        match rules.delete(name, &DeleteParams::default()).await {
            Ok(_) => info!(migration, rule = %name, "target fence removed"),
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => {
                warn!(migration, rule = %name, error = %e, "removing a target fence failed");
                failed += 1;
            }
        }
    }
    failed
}

/// Carries out `d`, decided on `s`.
/// `departed` are the progress lines of nodes that left the selector and still finish their step.
pub async fn pool(
    ctx: &Context,
    s: &Snapshot<'_>,
    d: Decision,
    departed: Vec<NodeProgress>,
) -> Result<Requeue> {
    let gpm = s.gpm;
    let name = gpm.name_any();
    let mut status = d.status;
    let mut errors = 0;

    errors +=
        apply_classes_and_placement(ctx, &name, &d.class_applies, &d.placement_patches, &mut status).await;
    errors += delete_fences(ctx, &name, &d.delete_fences).await;

    // Steps, up to STEP_CONCURRENCY nodes at a time, their outcomes in the decided order.
    let by_name: HashMap<&str, &SlimNode> =
        s.nodes.iter().map(|n| (n.metadata.name.as_deref().unwrap_or(""), n.as_ref())).collect();
    let mut runs = Vec::with_capacity(d.steps.len());
    for step in &d.steps {
        let node = by_name.get(step.node.as_str()).copied();
        runs.push(async move {
            match node {
                Some(node) => carry_out(ctx, s, node, step).await,
                None => (None, false),
            }
        });
    }
    let t = std::time::Instant::now();
    let mut outcomes: Vec<(Option<NodeOutcome>, bool)> =
        super::bounded_in_order(runs, STEP_CONCURRENCY).await;
    observe_part(ctx, "execute_steps", t);
    let node_events: Vec<(&SlimNode, NodeEvent)> = d
        .steps
        .iter()
        .zip(outcomes.iter_mut())
        .filter_map(|(step, (out, _))| Some((*by_name.get(step.node.as_str())?, out.as_mut()?)))
        .flat_map(|(node, out)| std::mem::take(&mut out.events).into_iter().map(move |e| (node, e)))
        .collect();
    let (progress, recheck, failed) = progress(&d.steps, outcomes);
    errors += failed;
    status.in_progress = progress;
    status.in_progress.extend(departed);
    status.in_progress.truncate(STATUS_LIST_MAX);
    // The gauges before the status: whoever reads the status reads gauges at least as new.
    set_metrics(ctx, &name, &d.metrics, &status);

    // A status that changed only in its progress lines waits for the next write (coalesced); the
    // node annotations hold the truth meanwhile, so nothing is lost.
    let warned = errors > 0
        || !d.events.is_empty()
        || d.steps.iter().flat_map(|st| &st.events).any(|e| e.type_ == EventType::Warning);
    let last = ctx.status_writes.lock().ok().and_then(|g| g.get(&name).copied());
    let mut coalesced = None;
    match status_write(gpm.status.as_ref(), &status, warned, last, std::time::Instant::now()) {
        StatusWrite::Unchanged => {}
        StatusWrite::Now => {
            let t = std::time::Instant::now();
            write_status(ctx, &name, &status).await?;
            observe_part(ctx, "execute_status", t);
            if let Ok(mut g) = ctx.status_writes.lock() {
                g.insert(name.clone(), std::time::Instant::now());
            }
        }
        StatusWrite::After(wait) => coalesced = Some(wait),
    }
    for ev in d.events.iter().chain(&arrivals(&node_events, &status.nodes)) {
        publish_on_migration(ctx, gpm, ev).await;
    }
    futures::stream::iter(node_events)
        .for_each_concurrent(
            EVENT_CONCURRENCY,
            |(node, ev)| async move { publish(ctx, gpm, node, &ev).await },
        )
        .await;

    let mut next = if errors > 0 {
        // Retry the failed writes soon, with the status written and the other nodes stepped.
        REQUEUE_ERROR
    } else if d.moving > 0 {
        REQUEUE_ACTIVE
    } else {
        REQUEUE_IDLE
    };
    let pods = d.pods_settling.then_some(POD_VERIFY_TTL);
    for wait in [coalesced, recheck, pods].into_iter().flatten() {
        next = next.min(wait);
    }
    Ok(Requeue::requeue(next))
}

/// Records how long a part of the execute phase took, under its own `phase` label.
fn observe_part(ctx: &Context, phase: &'static str, since: std::time::Instant) {
    ctx.metrics
        .reconcile_phase_duration
        .get_or_create(&PhaseLabels { phase })
        .observe(since.elapsed().as_secs_f64());
}

/// `at` as the status stores it: a `metav1.Time` has whole seconds. The node annotation keeps the
/// fraction; a status computed with it would never equal the status read back, and every
/// reconcile would write it again.
pub(crate) fn status_time(at: Timestamp) -> Time {
    Time(Timestamp::from_second(at.as_second()).unwrap_or(at))
}

/// Progress-only status changes are written at most this often per migration: the `inProgress`
/// lines, the counts, the pod verification, and a condition's message (its counts and names). A
/// change of phase, of a condition's status or reason, of the pool size or the generation, a
/// Warning or migration event, or a failed write goes out at once. Five seconds is about one
/// node's move when the device plugin's resources leave promptly, so a pool moving one node at a
/// time writes its status about once a node, not at every step; the node annotations hold each
/// step meanwhile.
pub const STATUS_COALESCE: std::time::Duration = std::time::Duration::from_secs(5);

/// What to do with the status a reconcile computed.
#[derive(Debug, PartialEq, Eq)]
pub enum StatusWrite {
    Unchanged,
    Now,
    /// Only progress changed and the last write was recent: write it once this has passed.
    After(std::time::Duration),
}

/// Whether `new` is written now. Pure. `warned`: this reconcile published a Warning or a
/// migration event, or a write failed: those are told from the status the next reconcile reads
/// (a message published once per change), so their status cannot wait.
pub fn status_write(
    old: Option<&GpuPoolMigrationStatus>,
    new: &GpuPoolMigrationStatus,
    warned: bool,
    last_write: Option<std::time::Instant>,
    now: std::time::Instant,
) -> StatusWrite {
    let Some(old) = old.filter(|o| *o != new) else {
        return if old.is_some() { StatusWrite::Unchanged } else { StatusWrite::Now };
    };
    fn headline(s: &GpuPoolMigrationStatus) -> impl PartialEq + '_ {
        let conditions: Vec<_> =
            s.conditions.iter().map(|c| (&c.type_, &c.status, &c.reason, c.observed_generation)).collect();
        (s.phase, s.observed_generation, s.nodes.total, s.failed.len(), conditions)
    }
    if warned || headline(old) != headline(new) {
        return StatusWrite::Now;
    }
    match last_write.map(|at| now.saturating_duration_since(at)) {
        Some(elapsed) if elapsed < STATUS_COALESCE => StatusWrite::After(STATUS_COALESCE - elapsed),
        _ => StatusWrite::Now,
    }
}

/// One node's step with its error kept to itself: the outcome for the status (`None` for a node
/// deleted mid-step) and whether it must be retried soon.
async fn carry_out(
    ctx: &Context,
    s: &Snapshot<'_>,
    node: &SlimNode,
    step: &NodeStep,
) -> (Option<NodeOutcome>, bool) {
    let (gpm, name) = (s.gpm, &step.node);
    let unchanged = || NodeOutcome {
        state: step.from,
        since: parse_since(&PoolNode::from_node(node)),
        message: step.last_message.clone().unwrap_or_default(),
        recheck_after: None,
        events: Vec::new(),
    };
    let step_error;
    let result = match s.read_errors.get(name) {
        Some(e) => Err(e),
        None => match node_step(ctx, gpm, step).await {
            Ok(out) => Ok(out),
            Err(e) => {
                step_error = e;
                Err(&step_error)
            }
        },
    };
    match result {
        Ok(out) => (Some(out), false),
        Err(e) if matches!(e, Error::PatchNode { .. }) && e.is_not_found() => {
            // Deleted mid-step: the cache drops it, and with it its status entry.
            info!(node = %name, migration = %gpm.name_any(), "node deleted mid-step");
            (None, false)
        }
        Err(e) if e.is_conflict() => {
            // The node changed after the snapshot this step was decided on (its kubelet wrote
            // its status, say): decide again on the fresh node, soon. Not a failure.
            debug!(node = %name, migration = %gpm.name_any(), "node changed under the step; retrying");
            (Some(unchanged()), true)
        }
        Err(e) => {
            ctx.metrics.reconcile_errors.get_or_create(&ErrorLabels { category: e.category() }).inc();
            warn!(node = %name, migration = %gpm.name_any(), category = e.category(), error = %e, "node step failed");
            let message = format!("{STEP_ERROR}{e}; retrying");
            let mut events = Vec::new();
            if step.last_message.as_deref() != Some(message.as_str()) {
                events.push(NodeEvent {
                    type_: EventType::Warning,
                    reason: "NodeStepFailed",
                    note: e.to_string(),
                });
            }
            (Some(NodeOutcome { message, events, ..unchanged() }), true)
        }
    }
}

/// A write outside the node steps failed: logged and counted under its cause.
fn report(ctx: &Context, migration: &str, e: &Error) {
    ctx.metrics.reconcile_errors.get_or_create(&ErrorLabels { category: e.category() }).inc();
    warn!(migration = %migration, category = e.category(), error = %e, "apply failed; retrying");
}

/// Adds a failed write to the message of the condition it holds closed.
fn note_failure(status: &mut GpuPoolMigrationStatus, type_: ConditionType, e: &Error) {
    if let Some(c) = status.conditions.iter_mut().find(|c| c.type_ == type_.as_str()) {
        c.message = format!("{}; the last apply failed: {e}", c.message);
    }
}

/// Carries out one node's step: the action's own writes, then the node patch. Its events are in
/// the outcome, for the caller to publish once they have all landed ([`publish_node_events`]).
pub async fn node_step(ctx: &Context, gpm: &GpuPoolMigration, step: &NodeStep) -> Result<NodeOutcome> {
    let name = &step.node;
    let canaries: Api<Pod> = Api::namespaced(ctx.client.clone(), &ctx.config.canary_namespace);
    let canary_name = crate::node::canary::pod_name(name);
    let mut out = NodeOutcome {
        state: step.state,
        since: step.since,
        message: step.message.clone(),
        recheck_after: step.recheck_after,
        events: step.events.clone(),
    };

    if !step.evict.is_empty() {
        evict_pods(ctx, gpm, step, &mut out).await?;
    }
    delete_pods(ctx, gpm, step).await?;
    canary_writes(&canaries, &canary_name, step).await?;
    taint_rule_writes(ctx, step).await?;
    if let Some(patch) = &step.patch {
        patch_node(ctx, name, patch).await?;
        info!(node = %name, migration = %gpm.name_any(), from = ?step.from, action = ?step.action, "node step");
        if step.remove_finished_canary {
            // Best effort: the canary is finished; a leftover one is harmless.
            let _ = canaries.delete(&canary_name, &DeleteParams::default()).await;
        }
        if let Some(seconds) = step.drain_seconds {
            ctx.metrics
                .drain_duration
                .get_or_create(&MigrationLabels { migration: gpm.name_any() })
                .observe(seconds);
        }
    }
    Ok(out)
}

/// Deletes the step's pods past their budgets (`Action::DeletePastBudgets`), with the drain's
/// grace period where the spec sets one, as the device-taint-eviction controller would delete
/// them. A pod already gone is fine; the first error is returned after the rest were tried.
async fn delete_pods(ctx: &Context, gpm: &GpuPoolMigration, step: &NodeStep) -> Result<()> {
    let grace = gpm.spec.strategy.drain.grace_period_seconds.and_then(|g| u32::try_from(g).ok());
    let params = DeleteParams { grace_period_seconds: grace, ..DeleteParams::default() };
    let mut first_error = None;
    for p in &step.delete {
        let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &p.namespace);
        let result = match pods.delete(&p.name, &params).await {
            Ok(_) => "deleted",
            Err(kube::Error::Api(s)) if s.code == 404 => "gone",
            Err(source) => {
                first_error.get_or_insert(Error::DeletePod {
                    namespace: p.namespace.clone(),
                    name: p.name.clone(),
                    source,
                });
                "error"
            }
        };
        ctx.metrics.evictions.get_or_create(&EvictionLabels { result }).inc();
    }
    first_error.map_or(Ok(()), Err)
}

/// Evicts the step's pods, each counted by result. Every pod gets its eviction; the first error is
/// returned after the rest were tried. A refused eviction (a PodDisruptionBudget, throttling)
/// drops the step's early recheck and says so in the outcome's message, a blocked one in an event
/// too unless the message is the node's already.
async fn evict_pods(
    ctx: &Context,
    gpm: &GpuPoolMigration,
    step: &NodeStep,
    out: &mut NodeOutcome,
) -> Result<()> {
    let grace = gpm.spec.strategy.drain.grace_period_seconds;
    let (mut blocked, mut throttled, mut first_error) = (Vec::new(), 0, None);
    for p in &step.evict {
        let r = drain::evict(ctx.client.clone(), p, grace).await;
        let result = match &r {
            Ok(drain::Evicted::Yes) => "evicted",
            Ok(drain::Evicted::Gone) => "gone",
            Ok(drain::Evicted::Blocked(_)) => "blocked",
            Ok(drain::Evicted::Throttled(_)) => "throttled",
            Err(_) => "error",
        };
        ctx.metrics.evictions.get_or_create(&EvictionLabels { result }).inc();
        match r {
            Ok(drain::Evicted::Blocked(m)) => blocked.push(format!("{p}: {m}")),
            Ok(drain::Evicted::Throttled(_)) => throttled += 1,
            Ok(_) => {}
            Err(e) => {
                first_error.get_or_insert(e);
            }
        }
    }
    if let Some(e) = first_error {
        return Err(e);
    }
    if throttled > 0 || !blocked.is_empty() {
        out.recheck_after = None;
    }
    if throttled > 0 {
        out.message = format!(
            "{}; the API server throttled {throttled} eviction(s) (429 without a disruption budget cause); retrying",
            out.message
        );
    }
    if !blocked.is_empty() {
        out.message = format!("eviction blocked by a PodDisruptionBudget: {}", blocked.join("; "));
        if step.last_message.as_deref() != Some(out.message.as_str()) {
            out.events.push(NodeEvent {
                type_: EventType::Warning,
                reason: "EvictionBlocked",
                note: out.message.clone(),
            });
        }
    }
    Ok(())
}

/// Creates the step's canary pod, or deletes an earlier attempt's; one that already exists, or is
/// already gone, is no error.
async fn canary_writes(canaries: &Api<Pod>, canary_name: &str, step: &NodeStep) -> Result<()> {
    let name = &step.node;
    if let Some(pod) = &step.create_canary {
        match canaries.create(&PostParams::default(), pod).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 409 => {}
            Err(source) => return Err(Error::CreateCanary { node: name.clone(), source }),
        }
    }
    if step.delete_canary {
        match canaries.delete(canary_name, &DeleteParams::default()).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(source) => return Err(Error::CreateCanary { node: name.clone(), source }),
        }
    }
    Ok(())
}

/// Writes the step's DeviceTaintRules: the fences of target nodes, then the node's rollback rule
/// (created, turned to NoExecute, or deleted). One that already exists, or is already gone, is no
/// error.
async fn taint_rule_writes(ctx: &Context, step: &NodeStep) -> Result<()> {
    let rules: Api<DeviceTaintRule> = Api::all(ctx.client.clone());
    for rule in &step.create_fences {
        match rules.create(&PostParams::default(), rule).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 409 => {}
            Err(source) => return Err(Error::CreateDeviceTaintRule { name: rule.name_any(), source }),
        }
    }
    let rule_name = crate::node::patch::taint_rule_name(&step.node);
    if let Some(rule) = &step.create_taint_rule {
        match rules.create(&PostParams::default(), rule).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 409 => {}
            Err(source) => return Err(Error::CreateDeviceTaintRule { name: rule_name, source }),
        }
    } else if step.escalate_taint_rule {
        let effect = serde_json::json!({"spec": {"taint": {"effect": "NoExecute"}}});
        rules
            .patch(&rule_name, &PatchParams::default(), &Patch::Merge(&effect))
            .await
            .map_err(|source| Error::CreateDeviceTaintRule { name: rule_name.clone(), source })?;
    } else if step.delete_taint_rule {
        match rules.delete(&rule_name, &DeleteParams::default()).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(source) => return Err(Error::DeleteDeviceTaintRule { name: rule_name, source }),
        }
    }
    Ok(())
}

/// Publishes a step's events (see [`node_step`]).
pub async fn publish_node_events(
    ctx: &Context,
    gpm: &GpuPoolMigration,
    node: &SlimNode,
    events: &[NodeEvent],
) {
    for ev in events {
        publish(ctx, gpm, node, ev).await;
    }
}

/// Patches a node and records the write, so the next reconcile waits until the node cache shows it
/// (see `cache::NodeWrites`).
pub async fn patch_node(ctx: &Context, name: &str, patch: &NodePatch) -> Result<()> {
    let write = ctx.caches.node_writes.begin(name);
    // The answer is read as the cache reads a node: only its resourceVersion is used.
    let res = Api::<SlimNode>::all(ctx.client.clone())
        .patch(name, &PatchParams::default(), &Patch::Merge(patch))
        .await;
    write.finish(res.as_ref().ok().and_then(|n| n.metadata.resource_version.as_deref()));
    res.map(|_| ()).map_err(|source| Error::PatchNode { node: name.into(), source })
}

/// Publishes `ev` on the node, with the migration as the related object, and, where
/// [`NodeEvent::on_migration`] (its Warnings), on the migration with the node as the related
/// object. A failure to publish is logged: the status and the node carry the same facts.
async fn publish(ctx: &Context, gpm: &GpuPoolMigration, node: &SlimNode, ev: &NodeEvent) {
    let (node_ref, gpm_ref) = (node.object_ref(&()), gpm.object_ref(&()));
    let event = |related| events::Event {
        type_: ev.type_,
        reason: ev.reason.to_string(),
        note: ev.note.clone(),
        action: "MigrateNode".into(),
        related,
    };
    let mut targets = vec![(event(Some(gpm_ref.clone())), node_ref.clone())];
    if ev.on_migration() {
        targets.push((event(Some(node_ref)), gpm_ref));
    }
    for (e, r) in &targets {
        if let Err(err) = ctx.events.publish(e, r).await {
            warn!(error = %err, reason = ev.reason, "publishing event failed");
        }
    }
}

/// One event about the migration, related to a node where it names one. A failure to publish is
/// logged: the status carries the same facts.
async fn publish_on_migration(ctx: &Context, gpm: &GpuPoolMigration, ev: &MigrationEvent) {
    let related = ev.node.as_ref().map(|n| ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Node".into()),
        name: Some(n.clone()),
        ..Default::default()
    });
    let event = events::Event {
        type_: ev.type_,
        reason: ev.reason.into(),
        note: ev.note.clone(),
        action: ev.action.into(),
        related,
    };
    if let Err(e) = ctx.events.publish(&event, &gpm.object_ref(&())).await {
        warn!(error = %e, reason = ev.reason, "publishing event failed");
    }
}

/// How many node names an arrival event on the migration lists before it says how many more.
const ARRIVALS_NAMED: usize = 10;

/// The nodes that arrived in this reconcile (their `NodeMigrated`, `NodeRolledBack` or
/// `NodeReplaced` on the node), told in one event per reason on the migration: a step of 500 nodes is one event there,
/// not 500. Pure.
pub fn arrivals(
    events: &[(&SlimNode, NodeEvent)],
    counts: &crate::api::v1alpha1::NodeCounts,
) -> Vec<MigrationEvent> {
    let mut out = Vec::new();
    for (reason, what) in [
        ("NodeMigrated", "migrated to DRA"),
        ("NodeRolledBack", "rolled back to the device plugin"),
        ("NodeReplaced", "drained onto the target pool and left cordoned for removal"),
    ] {
        let mut names: Vec<&str> = events
            .iter()
            .filter(|(_, e)| e.reason == reason)
            .filter_map(|(n, _)| n.metadata.name.as_deref())
            .collect();
        if names.is_empty() {
            continue;
        }
        names.sort_unstable();
        let shown = names.iter().take(ARRIVALS_NAMED).copied().collect::<Vec<_>>().join(", ");
        let more = names.len().saturating_sub(ARRIVALS_NAMED);
        let more = if more > 0 { format!(" and {more} more") } else { String::new() };
        out.push(MigrationEvent {
            type_: EventType::Normal,
            reason,
            action: "MigrateNode",
            note: format!(
                "{} node(s) {what}: {shown}{more} ({} of {} migrated)",
                names.len(),
                counts.migrated,
                counts.total
            ),
            node: (names.len() == 1).then(|| names[0].to_string()),
        });
    }
    out
}

#[derive(Serialize, Debug)]
#[serde(rename_all = "camelCase")]
struct StatusApply<'a> {
    api_version: String,
    kind: String,
    metadata: ObjectMeta,
    status: &'a GpuPoolMigrationStatus,
}

async fn write_status(ctx: &Context, name: &str, status: &GpuPoolMigrationStatus) -> Result<()> {
    let body = StatusApply {
        api_version: GpuPoolMigration::api_version(&()).to_string(),
        kind: GpuPoolMigration::kind(&()).to_string(),
        metadata: ObjectMeta { name: Some(name.into()), ..Default::default() },
        status,
    };
    Api::<GpuPoolMigration>::all(ctx.client.clone())
        .patch_status(name, &PatchParams::apply(OPERATOR_FIELD_MANAGER).force(), &Patch::Apply(&body))
        .await
        .map(|_| ())
        .map_err(|source| Error::PatchStatus { name: name.into(), source })
}

/// SSA of one managed DeviceClass.
pub async fn apply_device_class(client: &Client, dc: &DeviceClass) -> Result<DeviceClass> {
    let name = dc.metadata.name.clone().unwrap_or_default();
    Api::<DeviceClass>::all(client.clone())
        .patch(&name, &PatchParams::apply(OPERATOR_FIELD_MANAGER).force(), &Patch::Apply(dc))
        .await
        .map_err(|source| Error::ApplyDeviceClass { name, source })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::v1alpha1::Phase;
    use std::time::{Duration, Instant};

    #[test]
    fn long_notes_are_cut_on_a_char_boundary() {
        use crate::report::events::{NOTE_MAX, cut_note};
        let short = "node gpu-1: Pending → Cordoned";
        assert_eq!(cut_note(short), short);
        let long = "é".repeat(NOTE_MAX);
        let cut = cut_note(&long);
        assert!(cut.len() <= NOTE_MAX, "{}", cut.len());
        assert!(cut.ends_with("..."));
    }

    #[test]
    fn arrivals_are_one_event_per_reason_naming_the_nodes() {
        let node = |n: &str| -> SlimNode {
            serde_json::from_value(serde_json::json!({"metadata": {"name": n}})).unwrap()
        };
        let nodes: Vec<SlimNode> = (0..12).map(|i| node(&format!("gpu-{i:02}"))).collect();
        let ev = |reason: &'static str| NodeEvent { type_: EventType::Normal, reason, note: String::new() };
        let mut events: Vec<(&SlimNode, NodeEvent)> = nodes.iter().map(|n| (n, ev("NodeMigrated"))).collect();
        events.push((&nodes[0], ev("NodeSwitching")));
        let counts = crate::api::v1alpha1::NodeCounts { total: 40, migrated: 30, ..Default::default() };
        let out = arrivals(&events, &counts);
        assert_eq!(out.len(), 1, "{out:?}");
        assert_eq!(out[0].reason, "NodeMigrated");
        assert_eq!(
            out[0].note,
            "12 node(s) migrated to DRA: gpu-00, gpu-01, gpu-02, gpu-03, gpu-04, gpu-05, gpu-06, gpu-07, gpu-08, gpu-09 and 2 more (30 of 40 migrated)"
        );
        assert_eq!(out[0].node, None, "several nodes: no single related node");
        let one = arrivals(&[(&nodes[3], ev("NodeRolledBack"))], &counts);
        assert_eq!(one[0].node.as_deref(), Some("gpu-03"));
        assert!(
            one[0].note.starts_with("1 node(s) rolled back to the device plugin: gpu-03"),
            "{}",
            one[0].note
        );
        let replaced = arrivals(&[(&nodes[2], ev("NodeReplaced"))], &counts);
        assert!(
            replaced[0]
                .note
                .starts_with("1 node(s) drained onto the target pool and left cordoned for removal: gpu-02"),
            "{}",
            replaced[0].note
        );
        assert!(arrivals(&[(&nodes[0], ev("NodeDraining"))], &counts).is_empty());
    }

    fn status(phase: Phase, message: &str) -> GpuPoolMigrationStatus {
        GpuPoolMigrationStatus {
            phase: Some(phase),
            in_progress: vec![NodeProgress {
                name: "n1".into(),
                state: NodeState::Draining,
                since: None,
                message: message.into(),
                cordoned_by: None,
            }],
            ..Default::default()
        }
    }

    #[test]
    fn a_status_with_a_nodes_step_time_reads_back_as_it_was_written() {
        // The annotation's time has a fraction of a second; metav1.Time has none.
        let at: Timestamp = "2026-12-02T09:13:40.082123456Z".parse().unwrap();
        let mut written = status(Phase::Progressing, "Wait: DevicePluginStillAdvertising");
        written.in_progress[0].since = Some(status_time(at));
        let back: GpuPoolMigrationStatus =
            serde_json::from_value(serde_json::to_value(&written).unwrap()).unwrap();
        assert_eq!(back, written, "a status that reads back otherwise is written again by every reconcile");
        assert_eq!(back.in_progress[0].since.as_ref().map(|t| t.0.as_second()), Some(at.as_second()));
        let now = Instant::now();
        assert_eq!(status_write(Some(&back), &written, false, None, now), StatusWrite::Unchanged);
    }

    #[test]
    fn progress_only_changes_are_coalesced_and_the_rest_is_written_at_once() {
        let now = Instant::now();
        let recent = Some(now - Duration::from_millis(300));
        let old = status(Phase::Progressing, "evicting 1 pod(s)");
        let progressed = status(Phase::Progressing, "Wait: DevicePluginStillAdvertising");
        // Nothing changed: nothing to write.
        assert_eq!(status_write(Some(&old), &old, false, recent, now), StatusWrite::Unchanged);
        // A first status is written at once.
        assert_eq!(status_write(None, &old, false, recent, now), StatusWrite::Now);
        // Progress only, 300 ms after the last write: after the rest of the interval.
        assert_eq!(
            status_write(Some(&old), &progressed, false, recent, now),
            StatusWrite::After(STATUS_COALESCE - Duration::from_millis(300))
        );
        // ... at once when the last write is older than the interval, or unknown.
        assert_eq!(
            status_write(Some(&old), &progressed, false, Some(now - STATUS_COALESCE), now),
            StatusWrite::Now
        );
        assert_eq!(status_write(Some(&old), &progressed, false, None, now), StatusWrite::Now);
        // A phase change, a condition change, or a Warning never waits.
        let completed = status(Phase::Completed, "evicting 1 pod(s)");
        assert_eq!(status_write(Some(&old), &completed, false, recent, now), StatusWrite::Now);
        let condition = |type_: &str, status: &str, reason: &str, message: &str| {
            k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition {
                type_: type_.into(),
                status: status.into(),
                reason: reason.into(),
                message: message.into(),
                last_transition_time: Time(k8s_openapi::jiff::Timestamp::now()),
                observed_generation: None,
            }
        };
        let mut conditioned = progressed.clone();
        conditioned.conditions.push(condition("Stalled", "True", "NodeFailed", "n1 failed"));
        assert_eq!(status_write(Some(&old), &conditioned, false, recent, now), StatusWrite::Now);
        assert_eq!(status_write(Some(&old), &progressed, true, recent, now), StatusWrite::Now);
        // A condition whose message alone moved (a count of migrated nodes) is progress; its
        // status or reason moving is not.
        let ready = |status, reason, message| {
            let mut s = old.clone();
            s.conditions.push(condition("Ready", status, reason, message));
            s
        };
        let moving = ready("False", "NodesMoving", "1 node(s) moving, 3 of 10 migrated");
        let counted = ready("False", "NodesMoving", "1 node(s) moving, 4 of 10 migrated");
        assert_eq!(
            status_write(Some(&moving), &counted, false, recent, now),
            StatusWrite::After(STATUS_COALESCE - Duration::from_millis(300))
        );
        let waiting = ready("False", "WaitingForNodes", "1 node(s) moving, 4 of 10 migrated");
        assert_eq!(status_write(Some(&moving), &waiting, false, recent, now), StatusWrite::Now);
        let ready_now = ready("True", "NodesMoving", "1 node(s) moving, 3 of 10 migrated");
        assert_eq!(status_write(Some(&moving), &ready_now, false, recent, now), StatusWrite::Now);
    }

    #[test]
    fn a_nodes_steps_are_told_on_the_node_and_its_warnings_on_the_migration() {
        let ev = |type_, reason| NodeEvent { type_, reason, note: String::new() };
        assert!(!ev(EventType::Normal, "NodeCordoned").on_migration());
        assert!(!ev(EventType::Normal, "NodeSwitching").on_migration());
        // Arrivals reach the migration once per reconcile, for all nodes (`arrivals`).
        assert!(!ev(EventType::Normal, "NodeMigrated").on_migration());
        assert!(!ev(EventType::Normal, "NodeRolledBack").on_migration());
        assert!(ev(EventType::Warning, "UnmanagedPodsBlockDrain").on_migration());
    }
}
