//! Observe: one snapshot of the pool, read from the controller's caches, plus the few reads a
//! node's step needs that no cache holds (its pods while it drains, its rollback taint rule, its
//! canary). Nothing here writes.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Instant;

use crate::node::slim::SlimNode;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::{DeviceClass, DeviceTaintRule, ResourceClaim, ResourceSlice};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ListParams};
use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt};
use tracing::warn;

use crate::api::v1alpha1::{
    Direction, GpuPoolMigration, GpuPoolMigrationSpec, NodeState, PodSelection, PodVerification,
};
use crate::cache::pods::PodsByNode;
use crate::cache::{self, DeviceCounts};
use crate::error::{Error, Result};
use crate::node::drain;
use crate::node::patch::taint_rule_name;
use crate::node::record::{Backend, PoolNode};
use crate::node::verify;
use crate::pool::gate::device_plugin_needed;
use crate::pool::gate::resources;
use crate::pool::plugin_config::PluginConfig;
use crate::pool::prerequisites::ServerFacts;
use crate::pool::readers::{self, Finding};
use crate::pool::replace;
use crate::pool::rollout::{self, OtherMigration};
use crate::reads::pods::pods_on_node;
use crate::reads::reader_objects;
use crate::reconcile::context::{Context, INVENTORY_TTL, PLUGIN_CONFIG_TTL, POD_VERIFY_TTL, PodCheck};
use crate::well_known::{ANNOTATION_MOVED, LABEL_FENCED_NODE, LABEL_MIGRATION};

/// Moving nodes whose reads (pods, taint rule, canary) are in flight at once: as many as their
/// steps (`execute::STEP_CONCURRENCY`).
const NODE_READ_CONCURRENCY: usize = 64;

/// Everything one reconcile of a migration decides on.
pub struct Snapshot<'a> {
    pub gpm: &'a GpuPoolMigration,
    pub now: Timestamp,
    /// The pool's nodes, by name: the cache's own copies, shared, not cloned per reconcile.
    pub nodes: Vec<Arc<SlimNode>>,
    pub facts: ServerFacts,
    pub driver_ds: Option<DaemonSet>,
    pub plugin_ds: Option<DaemonSet>,
    /// The device plugin's config, where its DaemonSet takes one from a ConfigMap and the pool
    /// still has nodes to move forward (see `pool::plugin_config`).
    pub plugin_config: Option<PluginConfig>,
    /// Every DeviceClass; `None` where resource.k8s.io/v1 does not serve the kind.
    pub device_classes: Option<Vec<DeviceClass>>,
    /// The node-local ResourceSlices of the migration's driver, with their devices, for the
    /// nodes this reconcile may switch, by node: grouped once, so no per-node judgement scans
    /// every slice.
    pub slices: WholeSlices,
    /// The devices of the migration's driver on every node of the cluster that has any, by node:
    /// the overlap invariant and the GPU counts read these for the whole pool.
    pub dra_counts: HashMap<String, DeviceCounts>,
    /// The other migrations, to find nodes that two select.
    pub others: Vec<OtherMigration>,
    /// GPU consumers per candidate node, every candidate of the pool, so the cheapest start first
    /// (counted in the GPU-pod cache).
    pub consuming_pods: HashMap<String, u32>,
    /// What each moving node's step reads besides the node itself.
    pub node_reads: HashMap<String, NodeReads>,
    /// The moving nodes whose reads failed: they get no step this reconcile, and the error is
    /// theirs alone (their status message, an event); the other nodes carry on.
    pub read_errors: HashMap<String, Error>,
    /// The capacity-reader inventory (cached for `INVENTORY_TTL`).
    pub inventory: Vec<Finding>,
    /// Where canary pods run (the operator's namespace).
    pub canary_namespace: String,
    /// Nodes the migration holds that left `spec.nodeSelector` and are still finishing their
    /// step (`reconcile::cleanup::departed`): not in `nodes`, and not gone.
    pub departed: Vec<String>,
    /// Going forward, the last check of the GPU pods on the pool's migrated nodes, and whether it
    /// is still settling (see `pods_verified`).
    pub pods: Option<(PodVerification, bool)>,
    /// Replace, going forward: the target pool's room and what each node that may start or waits
    /// for room would move onto it. `None` where no node needs the check.
    pub replace: Option<ReplaceRoom>,
    /// Replace: the target pool's nodes (the prerequisites judge their kubelets and runtimes).
    pub targets: Vec<Arc<SlimNode>>,
    /// Replace, rolling back: the return of the pods that left the old nodes.
    pub returns: Option<Returns>,
}

/// What a Replace migration's capacity check reads ([`crate::pool::replace`]).
#[derive(Clone, Debug)]
pub struct ReplaceRoom {
    /// The target pool's free room node by node, less what pending pods will take.
    pub target: replace::Target,
    /// Per node that drains, may start or waits cordoned for room: its GPU pods, of which
    /// [`replace::judge`] takes those its drain would move (has left to move).
    pub pods: HashMap<String, Vec<Pod>>,
    /// Of those nodes, what their drain would move, per controller ([`replace::moved`]): recorded
    /// on the node as its drain starts.
    pub moved: HashMap<String, replace::Moved>,
}

/// Replace: the return of the pods that left the old nodes, read when the migration rolls back
/// (or a node still returns): the plan for the nodes returning now, and the fences that stand.
#[derive(Clone, Debug, Default)]
pub struct Returns {
    pub plan: replace::ReturnPlan,
    /// Pool nodes that recorded the pods that left them (`switchyard.dev/moved`).
    pub recorded: HashSet<String>,
    /// The fences of this migration that stand: target node → DeviceTaintRule name.
    pub fences: BTreeMap<String, String>,
}

impl Snapshot<'_> {
    /// Frees what only the decision reads: the moving nodes' pods, the slices and device counts,
    /// the DeviceClasses, the pod counts and the inventory. The execute phase, the longest
    /// part of a reconcile of hundreds of moving nodes, reads only the migration, the nodes and
    /// the read errors, and need not hold the rest meanwhile.
    pub fn release_decided(&mut self) {
        self.node_reads = HashMap::new();
        self.slices = HashMap::new();
        self.dra_counts = HashMap::new();
        self.device_classes = None;
        self.consuming_pods = HashMap::new();
        self.inventory = Vec::new();
    }
}

/// The reads one node's step needs, by its state.
#[derive(Clone, Debug, Default)]
pub struct NodeReads {
    /// The node's pods that a step reads ([`drain::read_by_step`]): read while Draining (what to
    /// evict), Switching (device-plugin pods that landed after the drain) and RollingBack (DRA
    /// claim holders).
    pub pods: Vec<Pod>,
    /// Whether `pods` was read this reconcile (an empty list read from the API says the node has
    /// no pods; an unread one says nothing).
    pub pods_read: bool,
    /// The allocations of the claims the node's pods hold, by `namespace/name`: read while
    /// RollingBack, to tell the pods that hold the driver's devices from those that hold another
    /// driver's. A claim that is gone is absent.
    pub claims: drain::ClaimDevices,
    /// The node's rollback DeviceTaintRule exists: read while RollingBack or Failed.
    pub taint_rule_exists: bool,
    /// That rule's effect is NoExecute: it evicts the holders itself.
    pub taint_rule_evicts: bool,
    /// The node's canary pod, if any: read while Verifying with a canary configured.
    pub canary: Option<Pod>,
}

/// Reads the pool. The caches serve nodes, DaemonSets, DeviceClasses, ResourceSlices and GPU pods
/// (see `cache` for why each is fresh enough); a node's pods are listed only where the GPU-pod
/// cache does not hold every pod its step reads ([`pods_cached`]).
pub async fn pool<'a>(ctx: &Context, gpm: &'a GpuPoolMigration) -> Result<Snapshot<'a>> {
    let spec = &gpm.spec;
    let name = gpm.name_any();
    let now = Timestamp::now();

    let nodes = cached_pool_nodes(ctx, spec, &name).await?;
    let targets = target_nodes(ctx, spec).await?;
    // Replace: the old nodes never serve DRA; the target's kubelets and runtimes must.
    let judged = if spec.strategy.replace().is_some() { &targets } else { &nodes };
    let versions: Vec<_> = judged.iter().map(|n| crate::pool::gate::node_versions(n)).collect();
    let facts = server_facts(ctx, &versions).await?;
    let (dn, dp) = (&spec.driver.daemon_set, &spec.device_plugin.daemon_set);
    cache::synced(&ctx.caches.daemon_sets, "DaemonSet").await?;
    let driver_ds = cache::daemon_set(&ctx.caches.daemon_sets, &dn.namespace, &dn.name);
    let plugin_ds = cache::daemon_set(&ctx.caches.daemon_sets, &dp.namespace, &dp.name);

    let plugin_config = match &plugin_ds {
        Some(ds) if spec.direction == Direction::Forward && device_plugin_needed(spec, &nodes) => {
            plugin_config(ctx, ds).await
        }
        _ => None,
    };

    let device_classes = device_classes(ctx, &facts).await?;
    let others = other_migrations(ctx, &name);

    // Which nodes need more than the node: a first plan (pure) says which are moving and which
    // may start. An invalid spec fails here, with the message the decision would give.
    let pool: Vec<PoolNode> = nodes.iter().map(|n| PoolNode::from_node(n)).collect();
    let first =
        rollout::plan(&name, spec, &pool, &others).map_err(|message| Error::InvalidSpec { message })?;
    let (slices, dra_counts) = if facts.served.resource_slices {
        cached_slices(ctx, spec, &first, &pool).await?
    } else {
        Default::default()
    };
    cache::synced(&ctx.caches.gpu_pods, "Pod").await?;
    let gpu_pods = PodsByNode::of(&ctx.caches.gpu_pods);
    let consuming_pods = if !first.to_start.is_empty() && !first.queued.is_empty() {
        candidate_counts(spec, &gpu_pods, first.to_start.iter().chain(&first.queued))
    } else {
        HashMap::new()
    };
    let (node_reads, read_errors) =
        moving_reads(ctx, spec, &first, &pool, &nodes, &dra_counts, &gpu_pods).await;

    let replace = if facts.served.resource_slices {
        replace_room(ctx, spec, &first, &pool, &targets, &gpu_pods).await?
    } else {
        None
    };
    let returns = if facts.served.resource_slices {
        returns(ctx, gpm, &pool, &nodes, &targets, &gpu_pods).await?
    } else {
        None
    };
    let inventory = inventory_for(ctx, gpm, &nodes).await;
    let pods = pods_verified(ctx, gpm, &pool, &targets, &gpu_pods).await;
    Ok(Snapshot {
        gpm,
        now,
        nodes,
        facts,
        driver_ds,
        plugin_ds,
        plugin_config,
        device_classes,
        slices,
        dra_counts,
        others,
        consuming_pods,
        node_reads,
        read_errors,
        inventory,
        canary_namespace: ctx.config.canary_namespace.clone(),
        departed: Vec::new(),
        pods,
        replace,
        targets,
        returns,
    })
}

/// The cluster's DeviceClasses, where the kind is served (`None` where it is not).
async fn device_classes(ctx: &Context, facts: &ServerFacts) -> Result<Option<Vec<DeviceClass>>> {
    if !facts.served.device_classes {
        return Ok(None);
    }
    // The DeviceClass watch can only sync where the kind is served, so the wait is here.
    cache::synced(&ctx.caches.device_classes, "DeviceClass").await?;
    Ok(Some(ctx.caches.device_classes.state().iter().map(|c| (**c).clone()).collect()))
}

/// The migrations other than `name`, with their node selectors, to find nodes that two select.
fn other_migrations(ctx: &Context, name: &str) -> Vec<OtherMigration> {
    ctx.migrations
        .state()
        .iter()
        .filter(|o| o.name_any() != name)
        .map(|o| OtherMigration { name: o.name_any(), selector: o.spec.node_selector.clone() })
        .collect()
}

/// The driver's slices from the cache, once it synced: whole only for the nodes in flight that
/// are Switching (only a switch compares devices with the selectors); every other step reads the
/// counts.
async fn cached_slices(
    ctx: &Context,
    spec: &GpuPoolMigrationSpec,
    first: &rollout::Plan,
    pool: &[PoolNode],
) -> Result<(WholeSlices, HashMap<String, DeviceCounts>)> {
    cache::synced(&ctx.caches.resource_slices, "ResourceSlice").await?;
    let in_flight: HashSet<&str> = first.in_flight.iter().map(String::as_str).collect();
    let switching: HashSet<&str> = pool
        .iter()
        .filter(|p| in_flight.contains(p.name.as_str()) && p.state() == NodeState::Switching)
        .map(|p| p.name.as_str())
        .collect();
    Ok(slices_by_node(&ctx.caches.resource_slices.state(), &spec.driver.name, &switching))
}

/// What each node in flight reads besides itself ([`node`]), and the errors of those whose reads
/// failed. Only moving nodes read more: a node that starts is Pending (or Migrated, rolling back),
/// and those states read nothing. Nodes read side by side, a bounded number at a time.
async fn moving_reads(
    ctx: &Context,
    spec: &GpuPoolMigrationSpec,
    first: &rollout::Plan,
    pool: &[PoolNode],
    nodes: &[Arc<SlimNode>],
    dra_counts: &HashMap<String, DeviceCounts>,
    gpu_pods: &PodsByNode,
) -> (HashMap<String, NodeReads>, HashMap<String, Error>) {
    let by_name: HashMap<&str, (&PoolNode, &SlimNode)> =
        pool.iter().zip(nodes).map(|(p, n)| (p.name.as_str(), (p, n.as_ref()))).collect();
    let mut runs = Vec::new();
    for (pn, n) in first.in_flight.iter().filter_map(|n| by_name.get(n.as_str()).copied()) {
        let published = dra_counts.get(&pn.name).map_or(0, |c| c.present);
        runs.push(async move { (pn.name.clone(), node(ctx, spec, pn, n, published, gpu_pods).await) });
    }
    let reads: Vec<(String, Result<NodeReads>)> = super::bounded_in_order(runs, NODE_READ_CONCURRENCY).await;
    let (mut node_reads, mut read_errors) = (HashMap::new(), HashMap::new());
    for (n, r) in reads {
        match r {
            Ok(r) => {
                node_reads.insert(n, r);
            }
            Err(e) => {
                read_errors.insert(n, e);
            }
        }
    }
    (node_reads, read_errors)
}

/// Replace: the return of the pods that left the old nodes, while the migration rolls back or a
/// node still returns. The returning nodes (RollingBack, with a record), their pods and the target
/// nodes' come from the caches; the unbound pending pods are LISTed while a node returns, and the
/// migration's fences (DeviceTaintRules) are LISTed by label.
async fn returns(
    ctx: &Context,
    gpm: &GpuPoolMigration,
    pool: &[PoolNode],
    nodes: &[Arc<SlimNode>],
    targets: &[Arc<SlimNode>],
    gpu_pods: &PodsByNode,
) -> Result<Option<Returns>> {
    let spec = &gpm.spec;
    let returning_now = pool.iter().any(|p| p.state() == NodeState::RollingBack);
    if spec.strategy.replace().is_none() || (spec.direction != Direction::Rollback && !returning_now) {
        return Ok(None);
    }
    let name = gpm.name_any();
    let record = |p: &PoolNode| {
        p.annotations.get(ANNOTATION_MOVED).and_then(|m| serde_json::from_str::<replace::Moved>(m).ok())
    };
    let recorded: HashSet<String> =
        pool.iter().filter(|p| record(p).is_some()).map(|p| p.name.clone()).collect();
    let returning: Vec<(&PoolNode, &SlimNode)> = pool
        .iter()
        .zip(nodes)
        .filter(|(p, _)| p.state() == NodeState::RollingBack && recorded.contains(&p.name))
        .map(|(p, n)| (p, n.as_ref()))
        .collect();
    let selector = format!("{LABEL_MIGRATION}={name},{LABEL_FENCED_NODE}");
    let rules = Api::<DeviceTaintRule>::all(ctx.client.clone())
        .list(&ListParams::default().labels(&selector))
        .await
        .map_err(|source| Error::ListDeviceTaintRules { selector: selector.clone(), source })?;
    let fences = rules
        .items
        .iter()
        .filter_map(|r| Some((r.labels().get(LABEL_FENCED_NODE)?.clone(), r.name_any())))
        .collect();
    // Rolling back, every node still to bring its pods back keeps the fences standing, so that
    // they stand from the first node's return to the last one's ([`replace::fence`]).
    let will_return = |p: &&PoolNode| {
        recorded.contains(&p.name)
            && matches!(
                p.state(),
                NodeState::Cordoned | NodeState::Draining | NodeState::Replaced | NodeState::RollingBack
            )
    };
    let still_to_return = spec.direction == Direction::Rollback && pool.iter().any(|p| will_return(&p));
    let target_names: Vec<String> = targets.iter().map(|t| t.name().to_string()).collect();
    if returning.is_empty() {
        let fence = replace::fence(&target_names, 0, still_to_return);
        return Ok(Some(Returns {
            plan: replace::ReturnPlan { fence, ..Default::default() },
            recorded,
            fences,
        }));
    }
    let res = resources(spec);
    let mut moved = replace::Moved::new();
    for (p, _) in &returning {
        for (uid, n) in record(p).unwrap_or_default() {
            *moved.entry(uid).or_default() += n;
        }
    }
    let back: Vec<Pod> = returning.iter().flat_map(|(p, _)| gpu_pods.on(&p.name)).collect();
    let on_target: Vec<(String, Pod)> = targets
        .iter()
        .map(|t| t.name())
        .flat_map(|t| gpu_pods.on(t).map(move |p| (t.to_string(), p)))
        .collect();
    let pending = reader_objects::list_all(
        Api::<Pod>::all(ctx.client.clone()),
        kube::api::ListParams::default().fields("spec.nodeName=,status.phase=Pending"),
    )
    .await
    .map_err(|source| Error::ListPendingPods { source })?;
    // The room the returning nodes have: what the device plugin advertises on those that take
    // pods, less what the pods bound there and the pending pods ask for.
    let mut room = replace::Demand::new();
    for (p, n) in &returning {
        if !n.is_ready() || n.unschedulable {
            continue;
        }
        for (r, q) in crate::pool::overlap::allocatable(n, &res) {
            *room.entry(r).or_default() += q;
        }
        for pod in gpu_pods.on(&p.name).filter(|pod| !drain::is_finished(pod)) {
            for (r, q) in replace::pod_demand(&pod, &res) {
                let left = room.entry(r).or_default();
                *left = left.saturating_sub(q);
            }
        }
    }
    for (r, q) in replace::pending_demand(&pending, &res) {
        let left = room.entry(r).or_default();
        *left = left.saturating_sub(q);
    }
    let mut plan = replace::return_plan(&replace::ReturnInputs {
        moved: &moved,
        back: &back,
        targets: &target_names,
        on_target: &on_target,
        pending: &pending,
        room,
        resources: &res,
    });
    plan.fence = replace::fence(&target_names, plan.left, still_to_return);
    Ok(Some(Returns { plan, recorded, fences }))
}

/// Replace: the nodes `spec.strategy.replace.targetNodeSelector` selects, from the node cache
/// (none for an in-place migration).
async fn target_nodes(ctx: &Context, spec: &GpuPoolMigrationSpec) -> Result<Vec<Arc<SlimNode>>> {
    let Some(r) = spec.strategy.replace() else {
        return Ok(Vec::new());
    };
    let selector = kube::core::Selector::try_from(r.target_node_selector.clone()).map_err(|e| {
        Error::InvalidSpec { message: format!("spec.strategy.replace.targetNodeSelector: {e}") }
    })?;
    cached_nodes(ctx, &selector).await
}

/// Replace, going forward: the target pool's room, read only when a node drains, may start or
/// waits cordoned for room. The target's nodes and slices come from the caches; the claims that hold
/// devices and the pending pods that will take some are LISTed (paged), since no cache holds them.
async fn replace_room(
    ctx: &Context,
    spec: &GpuPoolMigrationSpec,
    first: &rollout::Plan,
    pool: &[PoolNode],
    targets: &[Arc<SlimNode>],
    gpu_pods: &PodsByNode,
) -> Result<Option<ReplaceRoom>> {
    if spec.strategy.replace().is_none() || spec.direction != Direction::Forward {
        return Ok(None);
    }
    let in_flight: HashSet<&str> = first.in_flight.iter().map(String::as_str).collect();
    let in_flight = &in_flight;
    let state_of = |s: NodeState| {
        pool.iter()
            .filter(move |p| in_flight.contains(p.name.as_str()) && p.state() == s)
            .map(|p| p.name.as_str())
    };
    // Draining nodes too: each eviction needs room for the pod it sends away.
    let checked: Vec<&str> = first
        .to_start
        .iter()
        .map(String::as_str)
        .chain(state_of(NodeState::Cordoned))
        .chain(state_of(NodeState::Draining))
        .collect();
    if checked.is_empty() {
        return Ok(None);
    }
    let res = resources(spec);
    let drain_spec = &spec.strategy.drain;
    let names: HashSet<&str> = targets.iter().filter_map(|n| n.metadata.name.as_deref()).collect();
    let slices: Vec<ResourceSlice> = ctx
        .caches
        .resource_slices
        .state()
        .iter()
        .filter(|s| s.driver() == spec.driver.name && s.node_name().is_some_and(|n| names.contains(n)))
        .map(|s| s.with_devices())
        .collect();
    let nodes: Vec<SlimNode> = targets.iter().map(|n| n.as_ref().clone()).collect();
    let inputs = crate::reads::target_pool::target_inputs(&ctx.client, &spec.driver.name, nodes).await?;
    let selectors = crate::pool::selectors::Selectors::new(spec);
    let target = replace::target(&res, &selectors, &spec.driver.name, &inputs, &slices);
    let pods: HashMap<String, Vec<Pod>> =
        checked.iter().map(|n| (n.to_string(), gpu_pods.on(n).collect())).collect();
    let moved = pods
        .iter()
        .map(|(n, p)| (n.clone(), replace::moved(p, &res, drain_spec)))
        .filter(|(_, m)| !m.is_empty())
        .collect();
    Ok(Some(ReplaceRoom { target, pods, moved }))
}

/// Checks the running GPU pods on the pool's migrated nodes ([`verify`]): the GPU-pod cache's, and
/// the generated claim of each pod not verified before (once in a pod's life, [`claims_of`]), at
/// most every [`POD_VERIFY_TTL`] (at once when the spec changed, or the pool's last node has
/// migrated). Forward migrations only. The check settles once its result holds still and no GPU
/// pod bound to those nodes is still starting; until then the reconcile comes back at the TTL.
/// A failed read keeps the last result and is logged: the check reports, it moves nothing.
async fn pods_verified(
    ctx: &Context,
    gpm: &GpuPoolMigration,
    pool: &[PoolNode],
    targets: &[Arc<SlimNode>],
    gpu_pods: &PodsByNode,
) -> Option<(PodVerification, bool)> {
    let spec = &gpm.spec;
    if spec.direction != Direction::Forward {
        return None;
    }
    // Replace: the pods that moved run on the target pool, and a GPU pod on an old node left for
    // removal (an uncordon, a stale scheduler) is reported there: it is served by the device
    // plugin, not by a claim.
    let arrived = if spec.strategy.replace().is_some() { NodeState::Replaced } else { NodeState::Migrated };
    let mut migrated: HashSet<&str> =
        pool.iter().filter(|p| p.state() == arrived).map(|p| p.name.as_str()).collect();
    if migrated.is_empty() {
        return None;
    }
    let arrivals = migrated.len();
    // Replace: the old nodes checked are the replaced ones, where no GPU pod belongs.
    let replaced: HashSet<String> = match spec.strategy.replace() {
        Some(_) => migrated.iter().map(|n| n.to_string()).collect(),
        None => HashSet::new(),
    };
    migrated.extend(targets.iter().filter_map(|n| n.metadata.name.as_deref()));
    let name = gpm.name_any();
    let last = ctx.pod_checks.lock().ok().and_then(|g| g.get(&name).cloned()).unwrap_or_default();
    // Every TTL, not on each newly migrated node: a reconcile of a pool moving at 10% sees a new
    // one nearly every time, and a check reads new pods' claims. The last node's arrival checks
    // at once, so a finished pool reports its pods without waiting out the TTL.
    let fresh = last.at.is_some_and(|at| at.elapsed() < POD_VERIFY_TTL);
    let all_arrived = arrivals == pool.len() && last.migrated != arrivals;
    let stuck = newly_stuck(gpu_pods, &migrated, &last.result);
    if fresh && last.generation == gpm.metadata.generation && !all_arrived && !stuck {
        return Some((last.result, last.settling));
    }
    let previous = last.at.map(|_| (last.result.clone(), last.settling));
    // A pod verified under another spec (other resources, other classes) is judged again.
    let known = if last.generation == gpm.metadata.generation { last.verified } else { HashSet::new() };
    let res = resources(spec);
    // A GPU pod bound here that has not started yet is checked once it runs; its start triggers
    // no reconcile, so the check comes back for it.
    let arriving = migrated.iter().any(|node| gpu_pods.on(node).any(|p| verify::is_arriving(&p, &res)));
    let pods: Vec<(&str, Vec<Pod>)> = migrated
        .iter()
        .map(|node| (*node, gpu_pods.on(node).filter(|p| verify::is_checked(p, &res)).collect::<Vec<_>>()))
        .filter(|(_, pods)| !pods.is_empty())
        .collect();
    let uid = |p: &Pod| p.metadata.uid.clone().unwrap_or_default();
    let mut to_read: Vec<String> = pods
        .iter()
        .flat_map(|(_, pods)| pods.iter())
        .filter(|p| !known.contains(&uid(p)))
        .filter_map(verify::generated_claim)
        .collect();
    to_read.sort();
    to_read.dedup();
    let claims = match claims_of(ctx, to_read).await {
        Ok(claims) => claims,
        Err(e) => {
            warn!(migration = %name, error = %e, "reading the GPU pods' claims failed");
            return previous;
        }
    };
    let mut verified = HashSet::new();
    let mut checked = Vec::new();
    for (node, pods) in pods {
        for pod in pods {
            let id = uid(&pod);
            let verdict = if replaced.contains(node) {
                verify::on_replaced_node(node)
            } else if known.contains(&id) {
                Ok(())
            } else {
                let claim = verify::generated_claim(&pod).and_then(|k| claims.get(&k).cloned().flatten());
                verify::judge(&pod, claim.as_ref(), &res, &spec.driver.name, node)
            };
            if verdict.is_ok() {
                verified.insert(id);
            }
            checked.push((node.to_owned(), pod.namespace().unwrap_or_default(), pod.name_any(), verdict));
        }
    }
    checked.extend(cannot_start(gpu_pods, migrated.iter().filter(|n| !replaced.contains(**n)), &res));
    let result = verify::summarize(checked);
    let settling = settling(previous.as_ref().map(|(r, _)| r), &result, arriving);
    if let Ok(mut g) = ctx.pod_checks.lock() {
        g.insert(
            name,
            PodCheck {
                at: Some(Instant::now()),
                generation: gpm.metadata.generation,
                migrated: arrivals,
                result: result.clone(),
                verified,
                settling,
            },
        );
    }
    Some((result, settling))
}

/// The GPU pods bound to `nodes` that never start (they stay Pending; the kubelet says why in
/// their container status, kubernetes/kubernetes#141426's stale device-plugin state among the
/// causes), each with its verdict.
fn cannot_start<'a>(
    gpu_pods: &PodsByNode,
    nodes: impl Iterator<Item = &'a &'a str>,
    res: &[&str],
) -> Vec<verify::Checked> {
    let mut out = Vec::new();
    for node in nodes {
        for pod in gpu_pods.on(node).filter(|p| verify::is_arriving(p, res)) {
            if let Some(why) = verify::cannot_start(&pod) {
                let (namespace, name) = (pod.namespace().unwrap_or_default(), pod.name_any());
                out.push(((*node).to_owned(), namespace, name, Err((verify::Fault::CannotStart, why))));
            }
        }
    }
    out
}

/// Whether a pod bound to `nodes` cannot start and `last` does not report it yet: checked at once,
/// since the pod watch woke this reconcile for it (`controller::migrations_for_pod`).
fn newly_stuck(gpu_pods: &PodsByNode, nodes: &HashSet<&str>, last: &PodVerification) -> bool {
    let reported = |p: &crate::cache::pods::WatchedPod| {
        last.unverified_pods.iter().any(|u| {
            u.reason == verify::Fault::CannotStart.reason()
                && Some(&u.namespace) == p.namespace().as_ref()
                && u.name == p.name_any()
        })
    };
    nodes.iter().any(|n| gpu_pods.cannot_start_on(n).any(|p| !reported(p)))
}

/// Whether a pod check is still settling: its result differs from the check before (or there was
/// none), or a GPU pod on the checked nodes had not started yet. Pure.
fn settling(previous: Option<&PodVerification>, result: &PodVerification, arriving: bool) -> bool {
    arriving || previous.is_none_or(|r| r != result)
}

/// The claims `keys` name (`namespace/name`), each `None` where it is gone: a GET each while they
/// are no more than the pages of a LIST of every claim in the cluster, else that LIST, each page
/// kept only for the claims asked for. The last LIST's page count is the estimate; before the
/// first, [`CLAIM_PAGES_GUESS`]. A pool moving at 10% checks a hundred new pods at a time, whose
/// claims come in a page or two rather than a hundred GETs.
async fn claims_of(ctx: &Context, keys: Vec<String>) -> Result<HashMap<String, Option<ResourceClaim>>> {
    let pages = ctx.claim_pages.load(std::sync::atomic::Ordering::Relaxed);
    if !claims_listed(keys.len(), pages) {
        let reads = keys.into_iter().map(|key| {
            let client = ctx.client.clone();
            async move {
                let (namespace, claim) = key.split_once('/').unwrap_or_default();
                let got = Api::<ResourceClaim>::namespaced(client, namespace).get_opt(claim).await;
                (key, got)
            }
        });
        let mut claims = HashMap::new();
        for (key, got) in super::bounded_in_order(reads, NODE_READ_CONCURRENCY).await {
            let (namespace, name) = key.split_once('/').unwrap_or_default();
            let got = got.map_err(|source| Error::GetResourceClaim {
                namespace: namespace.to_string(),
                name: name.to_string(),
                source,
            })?;
            claims.insert(key, got);
        }
        return Ok(claims);
    }
    let mut claims: HashMap<String, Option<ResourceClaim>> = keys.into_iter().map(|k| (k, None)).collect();
    let api = Api::<ResourceClaim>::all(ctx.client.clone());
    let mut lp = kube::api::ListParams::default().limit(crate::reads::pods::POD_PAGE);
    let mut pages = 0;
    loop {
        let page = api.list(&lp).await.map_err(|source| Error::ListResourceClaims { source })?;
        pages += 1;
        for claim in page.items {
            let key = format!("{}/{}", claim.namespace().unwrap_or_default(), claim.name_any());
            if let Some(slot) = claims.get_mut(&key) {
                *slot = Some(claim);
            }
        }
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) => lp = lp.continue_token(&token),
            None => break,
        }
    }
    ctx.claim_pages.store(pages, std::sync::atomic::Ordering::Relaxed);
    Ok(claims)
}

/// The pages a LIST of every claim is guessed to take before one has been made.
pub const CLAIM_PAGES_GUESS: usize = 4;

/// Whether `wanted` claims are read by a LIST of every claim, which took `pages` pages last time
/// (0: never listed yet): when it is fewer requests than a GET each. Pure.
pub fn claims_listed(wanted: usize, pages: usize) -> bool {
    let pages = if pages == 0 { CLAIM_PAGES_GUESS } else { pages };
    wanted > pages
}

/// A node's slices with their devices, by node.
pub type WholeSlices = HashMap<String, Vec<Arc<ResourceSlice>>>;

/// The node-local slices of `driver`: with their devices for the nodes in `switching`, by node and
/// then by name (their switch compares devices with the selectors), and counted for every node.
pub fn slices_by_node(
    cached: &[Arc<cache::CachedSlice>],
    driver: &str,
    switching: &HashSet<&str>,
) -> (WholeSlices, HashMap<String, DeviceCounts>) {
    let mut stepped_slices: HashMap<&str, Vec<&cache::CachedSlice>> = HashMap::new();
    let mut counts: HashMap<String, DeviceCounts> = HashMap::new();
    for c in cached.iter().filter(|c| c.driver() == driver) {
        let Some(node) = c.node_name() else { continue };
        *counts.entry(node.to_owned()).or_default() += c.counts();
        if switching.contains(node) {
            stepped_slices.entry(node).or_default().push(c);
        }
    }
    let slices = stepped_slices
        .into_iter()
        .map(|(node, mut ours)| {
            ours.sort_by(|a, b| a.name().cmp(b.name()));
            (node.to_owned(), ours.into_iter().map(|c| Arc::new(c.with_devices())).collect())
        })
        .collect();
    (slices, counts)
}

/// GPU consumers on each candidate, so the whole pool starts cheapest first: its unfinished pods
/// that request a migrated resource going forward, or that hold a DRA claim rolling back, counted
/// in the GPU-pod cache. A candidate with none counts 0, the cheapest. Pure.
fn candidate_counts<'n>(
    spec: &GpuPoolMigrationSpec,
    gpu_pods: &PodsByNode,
    candidates: impl Iterator<Item = &'n String>,
) -> HashMap<String, u32> {
    let res = resources(spec);
    candidates
        .map(|n| {
            (n.clone(), rollout::consuming_pods(spec.direction, &gpu_pods.on(n).collect::<Vec<_>>(), &res))
        })
        .collect()
}

/// Whether the GPU-pod cache holds every pod a step of a node in `state` reads (see
/// `cache::pods`): not where a drain moves every pod, nor where a switch without the device-plugin
/// interlock waits for the device plugin's own pod. A rollback reads only the pods that may hold
/// a claim, whatever the drain selects. Pure.
pub fn pods_cached(selection: PodSelection, state: NodeState, backend: Backend) -> bool {
    match state {
        NodeState::RollingBack => true,
        NodeState::Switching if backend == Backend::None => false,
        _ => selection == PodSelection::ResourceConsumers,
    }
}

/// The reads `pn`'s step needs in its state. A node in a state that needs none costs no request.
/// A Switching node's pods are read only when they can decide something (see [`switch_reads_pods`]);
/// `published` is how many devices the driver publishes for it that it has to serve, unhealthy ones
/// included ([`DeviceCounts::present`]).
pub async fn node(
    ctx: &Context,
    spec: &GpuPoolMigrationSpec,
    pn: &PoolNode,
    node: &SlimNode,
    published: u64,
    gpu_pods: &PodsByNode,
) -> Result<NodeReads> {
    let client = &ctx.client;
    let state = pn.state();
    let mut reads = NodeReads::default();
    // Replace: nothing switched, so a returning node's own pods and devices decide nothing: the
    // return reads the pool and the target (`returns`).
    if spec.strategy.replace().is_some() && state == NodeState::RollingBack {
        return Ok(reads);
    }
    let plugin_gone = || crate::pool::overlap::allocatable_total(node, &resources(spec)) == 0;
    if matches!(state, NodeState::Draining | NodeState::RollingBack)
        || (state == NodeState::Switching
            && switch_reads_pods(pn.backend(), plugin_gone(), published, super::decide::gpus_before(pn)))
    {
        // Only the pods a step can read are kept (most of a GPU node's pods are not its GPU
        // consumers); the reconcile holds them for every moving node at once.
        let (res, dp) = (resources(spec), &spec.device_plugin.daemon_set);
        let read = |p: &Pod| drain::read_by_step(p, &res, &spec.strategy.drain, (&dp.namespace, &dp.name));
        if pods_cached(spec.strategy.drain.pod_selection, state, pn.backend()) {
            reads.pods = gpu_pods.on(&pn.name).filter(|p| read(p)).collect();
        } else {
            reads.pods = pods_on_node(client, &pn.name).await?;
            reads.pods.retain(|p| read(p));
        }
        reads.pods.shrink_to_fit();
        reads.pods_read = true;
        if state == NodeState::RollingBack {
            reads.claims = claims_held(client, &reads.pods).await?;
        }
    }
    if matches!(state, NodeState::RollingBack | NodeState::Failed) {
        let rule_name = taint_rule_name(&pn.name);
        let rule = Api::<DeviceTaintRule>::all(client.clone())
            .get_opt(&rule_name)
            .await
            .map_err(|source| Error::CreateDeviceTaintRule { name: rule_name.clone(), source })?;
        reads.taint_rule_exists = rule.is_some();
        reads.taint_rule_evicts = rule.is_some_and(|r| r.spec.taint.effect == "NoExecute");
    }
    if spec.strategy.verify.canary.is_some() && state == NodeState::Verifying {
        reads.canary = Api::<Pod>::namespaced(client.clone(), &ctx.config.canary_namespace)
            .get_opt(&crate::node::canary::pod_name(&pn.name))
            .await
            .map_err(|source| Error::CreateCanary { node: pn.name.clone(), source })?;
    }
    Ok(reads)
}

/// The allocated devices of each claim `pods` hold (one GET per claim: a rolling-back node's
/// pods hold a handful). A claim that is gone is left out.
async fn claims_held(client: &kube::Client, pods: &[Pod]) -> Result<drain::ClaimDevices> {
    let mut claims = drain::ClaimDevices::new();
    for key in pods.iter().filter(|p| drain::holds_dra_claim(p)).flat_map(drain::claim_names) {
        if claims.contains_key(&key) {
            continue;
        }
        let (namespace, name) = key.split_once('/').unwrap_or_default();
        let got = Api::<ResourceClaim>::namespaced(client.clone(), namespace).get_opt(name).await.map_err(
            |source| Error::GetResourceClaim {
                namespace: namespace.to_string(),
                name: name.to_string(),
                source,
            },
        )?;
        if let Some(claim) = got {
            claims.insert(key, drain::allocated_devices(&claim));
        }
    }
    Ok(claims)
}

/// Whether a Switching node's pods are read. Before the device plugin has left (allocatable 0) the
/// switch waits on that whatever the pods are. After it, a node in `none` needs them to see that no
/// device-plugin pod is left before its driver starts; a node labelled `dra` needs them only once
/// its driver publishes the node's GPUs (`before`), when the switch could complete: a late pod is
/// evicted then, before the node is uncordoned, and no reconcile that must wait for the slices
/// anyway lists the node's pods. Pure.
pub fn switch_reads_pods(backend: Backend, plugin_gone: bool, published: u64, before: Option<u64>) -> bool {
    match backend {
        _ if !plugin_gone => false,
        Backend::None => true,
        _ => before.is_some_and(|b| published > 0 && published >= b),
    }
}

/// The device plugin's config, where `ds` takes one from a ConfigMap: read at most every
/// `PLUGIN_CONFIG_TTL`.
async fn plugin_config(ctx: &Context, ds: &DaemonSet) -> Option<PluginConfig> {
    let source = crate::pool::plugin_config::source(ds)?;
    let key = format!("{}/{}", source.namespace, source.config_map);
    let cached = ctx.plugin_configs.lock().ok().and_then(|g| {
        g.get(&key).filter(|(at, _)| at.elapsed() < PLUGIN_CONFIG_TTL).map(|(_, data)| data.clone())
    });
    let data = match cached {
        Some(data) => data,
        None => {
            let data =
                crate::reads::server::config_map_data(&ctx.client, &source.namespace, &source.config_map)
                    .await;
            if let Ok(mut g) = ctx.plugin_configs.lock() {
                g.insert(key, (Instant::now(), data.clone()));
            }
            data
        }
    };
    Some(PluginConfig::new(source, data))
}

async fn server_facts(
    ctx: &Context,
    nodes: &[crate::pool::prerequisites::NodeVersions],
) -> Result<ServerFacts> {
    if let Ok(guard) = ctx.facts.lock()
        && let Some((at, f)) = guard.as_ref()
        && at.elapsed() < crate::reconcile::context::FACTS_TTL
    {
        return Ok(f.clone());
    }
    let facts = crate::reads::server::discover_server(&ctx.client, nodes).await?;
    if let Ok(mut guard) = ctx.facts.lock() {
        *guard = Some((Instant::now(), facts.clone()));
    }
    Ok(facts)
}

/// The nodes `spec.nodeSelector` selects, from the node cache once it has synced and shows this
/// operator's own node patches (`cache::NodeWrites`). A node whose patch the cache still lags
/// after `cache::NODE_WRITE_VISIBLE_TIMEOUT` (the watch is reconnecting or relisting) is read
/// from the API for this reconcile: a step must never be decided on a copy older than our own
/// last write of that node. A reconcile with no such node makes no request here.
/// The nodes the migration owns that only lost labels GPU Feature Discovery writes stay in its
/// pool too ([`rollout::pool_members`]).
async fn cached_pool_nodes(
    ctx: &Context,
    spec: &GpuPoolMigrationSpec,
    migration: &str,
) -> Result<Vec<Arc<SlimNode>>> {
    let selector = crate::reads::nodes::node_selector(spec)?;
    let selected = cached_nodes(ctx, &selector).await?;
    let owned = cached_nodes(ctx, &crate::reads::nodes::owned_by(migration)).await?;
    Ok(rollout::pool_members(selected, &owned, &selector, migration))
}

/// The nodes `selector` selects, by name, from the node cache once it shows this operator's
/// finished node patches; a node it still lags on is read from the API.
pub(crate) async fn cached_nodes(
    ctx: &Context,
    selector: &kube::core::Selector,
) -> Result<Vec<Arc<SlimNode>>> {
    cache::synced(&ctx.caches.nodes, "Node").await?;
    let writes = &ctx.caches.node_writes;
    let unseen = writes.settle(cache::NODE_WRITE_VISIBLE_TIMEOUT).await;
    let mut fresh = Vec::new();
    for name in &unseen {
        let got = Api::<SlimNode>::all(ctx.client.clone())
            .get_opt(name)
            .await
            .map_err(|source| Error::GetNode { node: name.clone(), source })?;
        let cached = ctx.caches.nodes.get(&ObjectRef::new(name));
        let cached_rv = cached.as_ref().and_then(|n| n.meta().resource_version.as_ref());
        match got {
            Some(node) => {
                // The same version in the cache as in a read made after our write: the cache
                // shows it now.
                if cached_rv.is_some() && cached_rv == node.metadata.resource_version.as_ref() {
                    writes.forget(name);
                }
                fresh.push(Arc::new(node));
            }
            None => writes.forget(name),
        }
    }
    if !unseen.is_empty() {
        warn!(nodes = ?unseen, "the node cache lags this operator's node patches; read them from the API");
    }
    let cached = ctx.caches.nodes.state();
    let unseen: HashSet<&str> = unseen.iter().map(String::as_str).collect();
    let current = cached.iter().filter(|n| !unseen.contains(n.name()));
    Ok(cache::select_nodes(current.chain(fresh.iter()), selector))
}

/// The capacity-reader inventory for this migration, reused for [`INVENTORY_TTL`] unless the spec
/// changed. A failed read keeps the previous findings (or none) and is logged: the inventory
/// informs, it never blocks a migration.
async fn inventory_for(ctx: &Context, gpm: &GpuPoolMigration, nodes: &[Arc<SlimNode>]) -> Vec<Finding> {
    let name = gpm.name_any();
    let generation = gpm.metadata.generation;
    let cached = ctx.inventory.lock().ok().and_then(|g| g.get(&name).cloned());
    if let Some((at, g, findings)) = &cached
        && at.elapsed() < INVENTORY_TTL
        && *g == generation
    {
        return findings.clone();
    }
    let observed = reader_objects::observe(
        &ctx.client,
        reader_objects::targets(&gpm.spec),
        Some(gpm.spec.node_selector.clone()),
        reader_objects::pool_nodes(nodes),
        reader_objects::Scope {
            config_maps: false,
            // The watch's cache; empty where the kind is not served, which is also the truth.
            device_classes: Some(ctx.caches.device_classes.state().iter().map(|c| (**c).clone()).collect()),
        },
    )
    .await;
    match observed {
        Ok(o) => {
            let findings = readers::find(&o);
            if let Ok(mut g) = ctx.inventory.lock() {
                g.insert(name, (Instant::now(), generation, findings.clone()));
            }
            findings
        }
        Err(e) => {
            warn!(migration = %name, error = %e, "reading the capacity-reader inventory failed");
            cached.map(|(_, _, f)| f).unwrap_or_default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_switching_node_lists_its_pods_only_when_they_decide_something() {
        // The device plugin has not left: the switch waits on that, pods or not.
        assert!(!switch_reads_pods(Backend::Dra, false, 8, Some(8)));
        assert!(!switch_reads_pods(Backend::None, false, 0, Some(8)));
        // Sequential switch: no driver until no device-plugin pod is left, so they are read.
        assert!(switch_reads_pods(Backend::None, true, 0, Some(8)));
        // Labelled dra: only once the driver publishes the node's GPUs, when the switch could end.
        assert!(!switch_reads_pods(Backend::Dra, true, 0, Some(8)));
        assert!(!switch_reads_pods(Backend::Dra, true, 7, Some(8)));
        assert!(switch_reads_pods(Backend::Dra, true, 8, Some(8)));
        assert!(switch_reads_pods(Backend::Dra, true, 16, Some(8)));
        // Without a GPU count the switch cannot complete, so there is nothing to read for.
        assert!(!switch_reads_pods(Backend::Dra, true, 8, None));
    }

    #[test]
    fn claims_are_listed_when_a_list_takes_fewer_requests_than_a_get_each() {
        // Before the first LIST, the guess.
        assert!(!claims_listed(CLAIM_PAGES_GUESS, 0));
        assert!(claims_listed(CLAIM_PAGES_GUESS + 1, 0));
        // After it, its page count: a cluster of 20,000 claims (40 pages) reads 30 by GETs.
        assert!(!claims_listed(30, 40));
        assert!(claims_listed(41, 40));
        assert!(claims_listed(2, 1));
        assert!(!claims_listed(1, 1));
    }

    #[test]
    fn a_node_lists_its_pods_only_where_the_gpu_pod_cache_lacks_some_its_step_reads() {
        use NodeState::*;
        let (consumers, all) = (PodSelection::ResourceConsumers, PodSelection::All);
        for state in [Draining, Switching] {
            assert!(pods_cached(consumers, state, Backend::Dra), "{state:?}: GPU consumers are cached");
            assert!(!pods_cached(all, state, Backend::Dra), "{state:?}: every movable pod is not");
        }
        // Without the interlock the switch waits for the device plugin's own pod, not a GPU pod.
        assert!(!pods_cached(consumers, Switching, Backend::None));
        // A drain before that switch still moves only GPU consumers.
        assert!(pods_cached(consumers, Draining, Backend::None));
        // A rollback reads the pods that may hold a claim, cached whatever the drain selects.
        assert!(pods_cached(all, RollingBack, Backend::Dra));
        assert!(pods_cached(consumers, RollingBack, Backend::None));
    }

    #[test]
    fn candidates_count_their_unfinished_gpu_consumers_from_the_cache() {
        let pod = |name: &str, node: &str, res: &str, phase: &str, claim: bool| {
            let mut v = serde_json::json!({
                "metadata": {"name": name, "namespace": "ml"},
                "spec": {"nodeName": node, "containers": [{"name": "c", "resources": {"limits": {res: "1"}}}]},
                "status": {"phase": phase}
            });
            if claim {
                v["status"]["extendedResourceClaimStatus"] =
                    serde_json::json!({"resourceClaimName": "c", "requestMappings": []});
            }
            Arc::new(serde_json::from_value::<cache::pods::WatchedPod>(v).unwrap())
        };
        let cached = PodsByNode::from_pods([
            pod("a", "n1", "nvidia.com/gpu", "Running", false),
            pod("b", "n1", "nvidia.com/gpu", "Pending", false),
            pod("c", "n1", "example.com/nic", "Running", false),
            pod("d", "n2", "nvidia.com/gpu", "Succeeded", false),
            pod("e", "n2", "nvidia.com/gpu", "Running", true),
        ]);
        let mut spec: GpuPoolMigrationSpec = serde_json::from_value(serde_json::json!({
            "nodeSelector": {"matchLabels": {"pool": "a100"}},
            "resources": [{"extendedResourceName": "nvidia.com/gpu", "deviceClassName": "gpu.switchyard.dev"}],
            "driver": {"name": "gpu.switchyard.dev", "daemonSet": {"namespace": "s", "name": "d"}},
            "devicePlugin": {"daemonSet": {"namespace": "g", "name": "p"}}
        }))
        .unwrap();
        let names = ["n1".to_string(), "n2".to_string(), "n3".to_string()];
        let counts = candidate_counts(&spec, &cached, names.iter());
        let expected = |n1, n2| HashMap::from([("n1".into(), n1), ("n2".into(), n2), ("n3".into(), 0)]);
        assert_eq!(counts, expected(2, 1), "forward: the migrated resource's unfinished pods");
        spec.direction = Direction::Rollback;
        assert_eq!(candidate_counts(&spec, &cached, names.iter()), expected(0, 1), "rollback: claim holders");
    }

    #[test]
    fn slices_come_whole_for_the_stepped_nodes_and_counted_for_every_node() {
        let slice = |name: &str, driver: &str, node: &str, taint: bool| {
            let taints = if taint {
                serde_json::json!([{"key": "k", "effect": "NoExecute"}])
            } else {
                serde_json::json!([])
            };
            cache::CachedSlice::new(
                serde_json::from_value(serde_json::json!({
                    "metadata": {"name": name},
                    "spec": {"driver": driver, "nodeName": node,
                             "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                             "devices": [{"name": "gpu-0", "attributes": {"type": {"string": "gpu"}}},
                                         {"name": "gpu-1", "taints": taints}]}
                }))
                .unwrap(),
            )
        };
        let cached: Vec<Arc<cache::CachedSlice>> = [
            slice("n1-b", "gpu.switchyard.dev", "n1", false),
            slice("n1-a", "gpu.switchyard.dev", "n1", true),
            slice("n2", "gpu.switchyard.dev", "n2", true),
            slice("n2-other", "gpu.example.com", "n2", false),
            slice("n3-other", "gpu.example.com", "n3", false),
        ]
        .into_iter()
        .map(Arc::new)
        .collect();
        let (whole, counts) = slices_by_node(&cached, "gpu.switchyard.dev", &HashSet::from(["n1", "n3"]));
        let names = |n: &str| whole[n].iter().map(|s| s.metadata.name.clone().unwrap()).collect::<Vec<_>>();
        assert_eq!(names("n1"), ["n1-a", "n1-b"], "by name");
        assert!(whole["n1"][0].spec.devices.as_ref().unwrap()[0].attributes.is_some(), "whole");
        assert_eq!(whole.len(), 1, "only stepped nodes with our driver's slices: {:?}", whole.keys());
        assert_eq!(
            counts,
            HashMap::from([
                ("n1".to_string(), DeviceCounts { devices: 4, schedulable: 3, present: 4, physical: 4 }),
                ("n2".to_string(), DeviceCounts { devices: 2, schedulable: 1, present: 2, physical: 2 }),
            ]),
            "every node with our driver's slices, other drivers not counted"
        );
    }

    #[test]
    fn a_pod_check_settles_once_it_holds_still_and_nothing_is_starting() {
        let three = PodVerification { verified: 3, ..Default::default() };
        let six = PodVerification { verified: 6, ..Default::default() };
        assert!(settling(None, &three, false), "the first check is looked at again");
        assert!(settling(Some(&three), &six, false), "changed");
        assert!(!settling(Some(&six), &six, false), "held still, nothing starting");
        assert!(
            settling(Some(&three), &three, true),
            "held still, but pods bound to the nodes have not started: their start triggers no reconcile"
        );
    }
}
