//! The thin API layer: gathers what the pure modules need, carries out the one step each node is
//! due, applies DeviceClasses and placement, writes status and events. Every decision is made in
//! `plan`, `node_state`, `drain`, `placement`, `device_classes`, `prerequisites` and `overlap`.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::resource::v1::{
    DeviceClass, DeviceTaint, DeviceTaintRule, DeviceTaintRuleSpec, DeviceTaintSelector, ResourceSlice,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::core::{Selector, SelectorExt};
use kube::runtime::controller::{Action as Requeue, Controller};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::finalizer::{Event as Finalizer, finalizer};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::{WatchStreamExt, reflector, watcher};
use kube::{Client, Resource, ResourceExt};
use serde::Serialize;
use tracing::{debug, info, warn};

use crate::api::v1alpha1::{
    Direction, FailedNode, GpuPoolMigration, GpuPoolMigrationSpec, GpuPoolMigrationStatus, NodeProgress,
    NodeState, Phase, PlacementMode,
};
use crate::cache::{self, Caches};
use crate::conditions::{self, ConditionType, Desired, Progress};
use crate::device_classes;
use crate::drain;
use crate::error::{Error, Result};
use crate::inventory::{self, Finding, Severity};
use crate::inventory_source;
use crate::metrics::Metrics;
use crate::node_state::{self, Action, Canary, DrainCounts, Observed, WaitReason};
use crate::overlap;
use crate::placement::{self, Role};
use crate::plan::{self, Backend, Failure, Halt, OtherMigration, PoolNode};
use crate::prerequisites::{self, ClusterFacts, ExtendedResourceProbe, NodeVersions, ServedApis};
use crate::watch;
use crate::well_known::*;

/// Requeue while nodes move: short, because allocatable and slices change without a label event.
const REQUEUE_ACTIVE: Duration = Duration::from_secs(10);
/// Requeue when idle: a safety net; watches trigger real work.
const REQUEUE_IDLE: Duration = Duration::from_secs(300);
/// When a node's step failed: sooner than the backoff of a failed reconcile, since only that
/// node waits.
const REQUEUE_ERROR: Duration = Duration::from_secs(5);
/// How often a deletion re-checks the nodes it waits for.
const CLEANUP_POLL: Duration = Duration::from_secs(5);
/// How long discovery results are reused: versions and served kinds change only on upgrades.
const FACTS_TTL: Duration = Duration::from_secs(300);
/// How long an inventory is reused: it LISTs quotas, LimitRanges, HPAs and Deployments
/// cluster-wide, too much for every reconcile. A spec change refreshes it at once.
const INVENTORY_TTL: Duration = Duration::from_secs(300);
/// How many findings the InventoryFindings message lists before pointing at the CLI.
const FINDINGS_IN_CONDITION: usize = 5;
/// At most this many candidate nodes get a pod count per reconcile, so ordering a large pool
/// costs a bounded number of per-node pod LISTs.
const MAX_CANDIDATES_COUNTED: usize = 32;
/// Status lists are capped by the API schema.
const STATUS_LIST_MAX: usize = 64;
/// The name of the DeviceClass used only in the dry-run probe.
const PROBE_CLASS: &str = "switchyard-probe-extended-resource";
/// The extended resource name used only in the dry-run probe.
const PROBE_RESOURCE: &str = "probe.switchyard.dev/gpu";
/// How often the readiness check retries a failed discovery: readiness waits on it, and a
/// failure is usually the API server restarting.
const READY_DISCOVERY_RETRY: Duration = Duration::from_secs(5);

/// An inventory result: when it was read, for which generation, and its findings.
type CachedInventory = (Instant, Option<i64>, Vec<Finding>);

/// What does not change between reconciles.
#[derive(Clone, Debug)]
pub struct Config {
    /// Namespace for canary pods (the operator's own).
    pub canary_namespace: String,
    /// Label selector on GpuPoolMigrations: this operator manages only the matching ones
    /// (`None`: all). Lets several operators split a cluster, or a new version be tried on one
    /// migration.
    pub migration_selector: Option<String>,
}

/// Shared by every reconcile.
pub struct Context {
    pub client: Client,
    pub recorder: Recorder,
    pub metrics: Arc<Metrics>,
    pub config: Config,
    /// The controller's GpuPoolMigration cache, to find nodes selected by two migrations.
    pub migrations: Store<GpuPoolMigration>,
    /// Nodes, DaemonSets, DeviceClasses and ResourceSlices, fed by the controller's watches: a
    /// reconcile reads these instead of the API (see `cache` for how fresh they are).
    pub caches: Caches,
    facts: Mutex<Option<(Instant, ServerFacts)>>,
    failures: Mutex<HashMap<String, u32>>,
    /// The last inventory per migration: when, for which generation, and its findings.
    inventory: Mutex<HashMap<String, CachedInventory>>,
}

impl Context {
    pub fn new(
        client: Client,
        metrics: Arc<Metrics>,
        config: Config,
        migrations: Store<GpuPoolMigration>,
        caches: Caches,
    ) -> Self {
        let reporter =
            Reporter { controller: OPERATOR_FIELD_MANAGER.into(), instance: std::env::var("POD_NAME").ok() };
        Self {
            recorder: Recorder::new(client.clone(), reporter),
            client,
            metrics,
            config,
            migrations,
            caches,
            facts: Mutex::new(None),
            failures: Mutex::new(HashMap::new()),
            inventory: Mutex::new(HashMap::new()),
        }
    }
}

/// What discovery says about the API server; cached for [`FACTS_TTL`] by the operator.
#[derive(Clone, Debug, Default)]
pub struct ServerFacts {
    pub git_version: String,
    pub served: ServedApis,
    pub probe: ExtendedResourceProbe,
}

/// Entry point for the Controller.
pub async fn reconcile(gpm: Arc<GpuPoolMigration>, ctx: Arc<Context>) -> Result<Requeue> {
    let started = Instant::now();
    ctx.metrics.reconciliations.inc();
    let api: Api<GpuPoolMigration> = Api::all(ctx.client.clone());
    let name = gpm.name_any();
    let res = finalizer(&api, FINALIZER, gpm, |event| async {
        match event {
            Finalizer::Apply(g) => apply(&g, &ctx).await,
            Finalizer::Cleanup(g) => cleanup(&g, &ctx).await,
        }
    })
    .await
    .map_err(Error::from);
    ctx.metrics.reconcile_duration.observe(started.elapsed().as_secs_f64());
    if res.is_ok()
        && let Ok(mut f) = ctx.failures.lock()
    {
        f.remove(&name);
    }
    res
}

/// Backoff: transient errors retry after 5 s, doubling per consecutive failure up to 5 min;
/// permanent ones wait for a spec change (the watch) or 10 min.
pub fn error_policy(gpm: Arc<GpuPoolMigration>, err: &Error, ctx: Arc<Context>) -> Requeue {
    if err.is_routine_wait() {
        debug!(migration = %gpm.name_any(), "{err}");
        return Requeue::requeue(CLEANUP_POLL);
    }
    ctx.metrics
        .reconcile_errors
        .get_or_create(&crate::metrics::ErrorLabels { category: err.category() })
        .inc();
    warn!(migration = %gpm.name_any(), category = err.category(), error = %err, "reconcile failed");
    if !err.is_transient() {
        return Requeue::requeue(Duration::from_secs(600));
    }
    let n = ctx
        .failures
        .lock()
        .map(|mut f| {
            let e = f.entry(gpm.name_any()).or_insert(0);
            *e = e.saturating_add(1);
            *e
        })
        .unwrap_or(1);
    Requeue::requeue(backoff(n))
}

/// 5 s, 10 s, 20 s, ... capped at 5 minutes.
pub fn backoff(consecutive_failures: u32) -> Duration {
    let secs = 5u64.saturating_mul(1u64 << consecutive_failures.saturating_sub(1).min(16));
    Duration::from_secs(secs.min(300))
}

fn resources(spec: &GpuPoolMigrationSpec) -> Vec<&str> {
    spec.resources.iter().map(|r| r.extended_resource_name.as_str()).collect()
}

async fn server_facts(ctx: &Context, nodes: &[NodeVersions]) -> Result<ServerFacts> {
    if let Ok(guard) = ctx.facts.lock()
        && let Some((at, f)) = guard.as_ref()
        && at.elapsed() < FACTS_TTL
    {
        return Ok(f.clone());
    }
    let facts = discover_server(&ctx.client, nodes).await?;
    if let Ok(mut guard) = ctx.facts.lock() {
        *guard = Some((Instant::now(), facts.clone()));
    }
    Ok(facts)
}

/// Server version, served resource.k8s.io/v1 kinds and, when a pool node or the server is older
/// than 1.37, the dry-run probe for `extendedResourceName`. Read-only.
pub async fn discover_server(client: &Client, nodes: &[NodeVersions]) -> Result<ServerFacts> {
    let info = client.apiserver_version().await.map_err(|source| Error::Discovery { source })?;
    let served = served_apis(client).await?;
    let mut facts =
        ServerFacts { git_version: info.git_version, served, probe: ExtendedResourceProbe::NotRun };
    if served.device_classes && prerequisites::probe_needed(&facts.git_version, nodes) {
        facts.probe = probe_extended_resource(client).await;
    }
    Ok(facts)
}

/// Which resource.k8s.io/v1 kinds the API server serves. Read-only.
pub async fn served_apis(client: &Client) -> Result<ServedApis> {
    match client.list_api_group_resources("resource.k8s.io/v1").await {
        Ok(list) => {
            let has = |n: &str| list.resources.iter().any(|r| r.name == n);
            Ok(ServedApis {
                device_classes: has("deviceclasses"),
                resource_slices: has("resourceslices"),
                resource_claims: has("resourceclaims"),
                device_taint_rules: has("devicetaintrules"),
            })
        }
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(ServedApis::default()),
        Err(source) => Err(Error::Discovery { source }),
    }
}

/// Creates a DeviceClass with `extendedResourceName` in dry-run mode: a server with the gate off
/// drops the field from what it returns.
/// What the prerequisite checks judge for `spec`.
/// Whether the pool may start: the cluster's prerequisites, then what its nodes advertise.
pub fn pool_verdict(
    spec: &GpuPoolMigrationSpec,
    facts: &ServerFacts,
    versions: Vec<NodeVersions>,
    nodes: &[Node],
    driver_daemonset_exists: bool,
    device_plugin_daemonset_exists: bool,
) -> prerequisites::Verdict {
    let verdict = prerequisites::check(&cluster_facts(
        spec,
        facts,
        versions,
        driver_daemonset_exists,
        device_plugin_daemonset_exists,
    ));
    let check = match spec.direction {
        Direction::Forward => crate::capacity::check(nodes, &resources(spec)),
        // Rollback returns nodes to the device plugin, which serves whatever it served before.
        Direction::Rollback => crate::capacity::Check::default(),
    };
    prerequisites::with_capacity(verdict, &check, spec.acknowledge.gpu_sharing_loss)
}

pub fn cluster_facts(
    spec: &GpuPoolMigrationSpec,
    facts: &ServerFacts,
    nodes: Vec<NodeVersions>,
    driver_daemonset_exists: bool,
    device_plugin_daemonset_exists: bool,
) -> ClusterFacts {
    let (dn, dp) = (&spec.driver.daemon_set, &spec.device_plugin.daemon_set);
    ClusterFacts {
        server_git_version: facts.git_version.clone(),
        served: facts.served,
        nodes,
        probe: facts.probe,
        rollback_possible: spec.direction == Direction::Rollback
            || spec.strategy.on_failure == crate::api::v1alpha1::FailurePolicy::Rollback,
        driver_daemonset: Some(format!("{}/{}", dn.namespace, dn.name)),
        device_plugin_daemonset: Some(format!("{}/{}", dp.namespace, dp.name)),
        driver_daemonset_exists,
        device_plugin_daemonset_exists,
    }
}

async fn probe_extended_resource(client: &Client) -> ExtendedResourceProbe {
    let api: Api<DeviceClass> = Api::all(client.clone());
    let dc = DeviceClass {
        metadata: ObjectMeta { name: Some(PROBE_CLASS.into()), ..Default::default() },
        spec: Some(k8s_openapi::api::resource::v1::DeviceClassSpec {
            extended_resource_name: Some(PROBE_RESOURCE.into()),
            ..Default::default()
        }),
    };
    match api.create(&PostParams { dry_run: true, ..Default::default() }, &dc).await {
        Ok(got) if got.spec.as_ref().and_then(|s| s.extended_resource_name.as_ref()).is_some() => {
            ExtendedResourceProbe::Kept
        }
        Ok(_) => ExtendedResourceProbe::Dropped,
        Err(e) => {
            warn!(error = %e, "DRAExtendedResource dry-run probe failed");
            ExtendedResourceProbe::NotRun
        }
    }
}

/// The versions the prerequisites judge, from a node's status.
pub fn node_versions(n: &Node) -> NodeVersions {
    let info = n.status.as_ref().and_then(|s| s.node_info.as_ref());
    NodeVersions {
        name: n.name_any(),
        kubelet_version: info.map(|i| i.kubelet_version.clone()).unwrap_or_default(),
        container_runtime_version: info.map(|i| i.container_runtime_version.clone()).unwrap_or_default(),
    }
}

/// A DaemonSet, or `None` when it does not exist.
pub async fn get_daemonset(client: &Client, ns: &str, name: &str) -> Result<Option<DaemonSet>> {
    Api::<DaemonSet>::namespaced(client.clone(), ns)
        .get_opt(name)
        .await
        .map_err(|source| Error::GetDaemonSet { namespace: ns.into(), name: name.into(), source })
}

/// SSA of one managed DeviceClass.
pub async fn apply_device_class(client: &Client, dc: &DeviceClass) -> Result<DeviceClass> {
    let name = dc.metadata.name.clone().unwrap_or_default();
    Api::<DeviceClass>::all(client.clone())
        .patch(&name, &PatchParams::apply(OPERATOR_FIELD_MANAGER).force(), &Patch::Apply(dc))
        .await
        .map_err(|source| Error::ApplyDeviceClass { name, source })
}

/// Every pod bound to `node`.
pub async fn pods_on_node(client: &Client, node: &str) -> Result<Vec<Pod>> {
    let lp = ListParams::default().fields(&format!("spec.nodeName={node}"));
    Api::<Pod>::all(client.clone())
        .list(&lp)
        .await
        .map(|l| l.items)
        .map_err(|source| Error::ListPods { node: node.into(), source })
}

/// The migration as the owner of what it creates for a node (canary, DeviceTaintRule), so the
/// garbage collector removes what the operator did not. No `blockOwnerDeletion`: the migration's
/// deletion never waits on them.
fn owner_ref(gpm: &GpuPoolMigration) -> Option<OwnerReference> {
    gpm.controller_owner_ref(&()).map(|o| OwnerReference { block_owner_deletion: None, ..o })
}

/// The DeviceTaintRule that evicts DRA claim holders from a node being rolled back.
pub fn taint_rule(node: &str, driver: &str, migration: &str) -> DeviceTaintRule {
    DeviceTaintRule {
        metadata: ObjectMeta {
            name: Some(taint_rule_name(node)),
            labels: Some(BTreeMap::from([
                (LABEL_MANAGED_BY.to_string(), OPERATOR_FIELD_MANAGER.to_string()),
                (LABEL_MIGRATION.to_string(), migration.to_string()),
            ])),
            ..Default::default()
        },
        spec: DeviceTaintRuleSpec {
            device_selector: Some(DeviceTaintSelector {
                driver: Some(driver.to_string()),
                pool: Some(node.to_string()),
                device: None,
            }),
            taint: DeviceTaint {
                key: TAINT_KEY_ROLLBACK.to_string(),
                value: Some(migration.to_string()),
                effect: "NoExecute".to_string(),
                time_added: None,
            },
        },
        status: None,
    }
}

pub fn taint_rule_name(node: &str) -> String {
    let mut n = format!("switchyard-rollback-{node}");
    n.truncate(253);
    n.trim_end_matches(['-', '.']).to_string()
}

/// A JSON merge patch of a node: labels, annotations (`None` removes) and the cordon, sent as
/// one request so the state record and the change it describes land together.
#[derive(Serialize, Debug, Default, PartialEq)]
pub struct NodePatch {
    pub metadata: NodeMetaPatch,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub spec: Option<NodeSpecPatch>,
}

#[derive(Serialize, Debug, Default, PartialEq)]
pub struct NodeMetaPatch {
    /// The resourceVersion the decision was made on: the server refuses the patch (409) when the
    /// node changed since. A write decided on a stale view, by a stale leader among others, does
    /// not land; the next reconcile decides again on the fresh node.
    #[serde(rename = "resourceVersion", skip_serializing_if = "Option::is_none")]
    pub resource_version: Option<String>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, Option<String>>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, Option<String>>,
}

#[derive(Serialize, Debug, PartialEq)]
pub struct NodeSpecPatch {
    pub unschedulable: bool,
}

impl NodePatch {
    fn annotate(&mut self, k: &str, v: Option<String>) {
        self.metadata.annotations.insert(k.to_string(), v);
    }
    fn label(&mut self, k: &str, v: Option<String>) {
        self.metadata.labels.insert(k.to_string(), v);
    }
    fn state(&mut self, s: NodeState, now: Timestamp) {
        self.annotate(ANNOTATION_MIGRATION_STATE, Some(plan::state_str(s)));
        self.annotate(ANNOTATION_STATE_SINCE, Some(now.to_string()));
    }
    fn cordon(&mut self, node: &PoolNode) {
        if !node.annotations.contains_key(ANNOTATION_INITIALLY_UNSCHEDULABLE) {
            self.annotate(ANNOTATION_INITIALLY_UNSCHEDULABLE, Some(node.unschedulable.to_string()));
        }
        self.spec = Some(NodeSpecPatch { unschedulable: true });
    }
    fn uncordon(&mut self, node: &PoolNode) {
        let admin_cordoned =
            node.annotations.get(ANNOTATION_INITIALLY_UNSCHEDULABLE).is_some_and(|v| v == "true");
        self.spec = Some(NodeSpecPatch { unschedulable: admin_cordoned });
        self.annotate(ANNOTATION_INITIALLY_UNSCHEDULABLE, None);
    }
}

/// The node patch an action makes, or `None` for actions that touch other objects. Pure.
pub fn node_patch(
    action: &Action,
    node: &PoolNode,
    migration: &str,
    now: Timestamp,
    gpus: &BTreeMap<String, u64>,
) -> Option<NodePatch> {
    let mut p = NodePatch::default();
    match action {
        Action::Nothing
        | Action::Wait { .. }
        | Action::Evict
        | Action::CreateCanary
        | Action::DeleteCanary
        | Action::CreateTaintRule
        | Action::DeleteTaintRule => return None,
        Action::RecordSince => p.annotate(ANNOTATION_STATE_SINCE, Some(now.to_string())),
        Action::Cordon => {
            p.cordon(node);
            p.label(LABEL_MIGRATION, Some(migration.to_string()));
            p.state(NodeState::Cordoned, now);
        }
        Action::Recordon => p.spec = Some(NodeSpecPatch { unschedulable: true }),
        Action::StartDrain => {
            p.annotate(ANNOTATION_GPUS_BEFORE, serde_json::to_string(gpus).ok());
            p.state(NodeState::Draining, now);
        }
        Action::SwitchToDra => {
            p.label(LABEL_GPU_BACKEND, Some(BACKEND_DRA.to_string()));
            p.state(NodeState::Switching, now);
        }
        Action::StartVerify => p.state(NodeState::Verifying, now),
        Action::Complete => {
            p.uncordon(node);
            p.annotate(ANNOTATION_FAILURE, None);
            p.state(NodeState::Migrated, now);
        }
        Action::Fail { reason, message } => {
            let f = Failure { state: node.state(), reason: reason.to_string(), message: message.clone() };
            p.annotate(ANNOTATION_FAILURE, serde_json::to_string(&f).ok());
            p.state(NodeState::Failed, now);
        }
        Action::StartRollback => {
            // A rollback may start on a node this migration never moved (an earlier migration,
            // or a hand-labelled node): it takes ownership here, so the finalizer finds it and no
            // other migration moves it meanwhile.
            p.cordon(node);
            p.label(LABEL_MIGRATION, Some(migration.to_string()));
            p.state(NodeState::RollingBack, now);
        }
        Action::SwitchToDevicePlugin => p.label(LABEL_GPU_BACKEND, Some(BACKEND_DEVICE_PLUGIN.to_string())),
        Action::FinishRollback => {
            p.uncordon(node);
            p.label(LABEL_GPU_BACKEND, Some(BACKEND_DEVICE_PLUGIN.to_string()));
            p.annotate(ANNOTATION_GPUS_BEFORE, None);
            p.state(NodeState::RolledBack, now);
        }
    }
    Some(p)
}

/// Patches a node and records the write, so the next reconcile waits until the node cache shows it
/// (see `cache::NodeWrites`).
async fn patch_node(ctx: &Context, name: &str, patch: &NodePatch) -> Result<()> {
    let write = ctx.caches.node_writes.begin(name);
    let res =
        Api::<Node>::all(ctx.client.clone()).patch(name, &PatchParams::default(), &Patch::Merge(patch)).await;
    write.finish(res.as_ref().ok().and_then(|n| n.metadata.resource_version.as_deref()));
    res.map(|_| ()).map_err(|source| Error::PatchNode { node: name.into(), source })
}

async fn publish(
    ctx: &Context,
    gpm: &GpuPoolMigration,
    node: &Node,
    type_: EventType,
    reason: &str,
    note: String,
) {
    // On the migration the node is the related object: the recorder folds repeats of one
    // (reason, regarding, related) into a series, and without it every node's event would fold
    // into the first node's.
    let node_ref = node.object_ref(&());
    let event = |secondary| Event {
        type_,
        reason: reason.to_string(),
        note: Some(note.clone()),
        action: "MigrateNode".into(),
        secondary,
    };
    let (on_migration, on_node) = (event(Some(node_ref.clone())), event(None));
    for (ev, r) in [(&on_migration, gpm.object_ref(&())), (&on_node, node_ref)] {
        if let Err(e) = ctx.recorder.publish(ev, &r).await {
            warn!(error = %e, reason, "publishing event failed");
        }
    }
}

/// How many node names an event note lists before it says "...".
const NAMES_IN_EVENT: usize = 10;

/// The events API's limit on a note, in bytes; longer notes are refused.
const EVENT_NOTE_MAX: usize = 1024;

/// One event about the migration as a whole (no related node). A failure to publish is logged:
/// the status carries the same facts.
async fn publish_on_migration(
    ctx: &Context,
    gpm: &GpuPoolMigration,
    type_: EventType,
    reason: &str,
    action: &str,
    note: &str,
) {
    let mut note = note.to_string();
    if note.len() > EVENT_NOTE_MAX {
        let mut cut = EVENT_NOTE_MAX - 3;
        while !note.is_char_boundary(cut) {
            cut -= 1;
        }
        note.truncate(cut);
        note.push_str("...");
    }
    let ev = Event { type_, reason: reason.into(), note: Some(note), action: action.into(), secondary: None };
    if let Err(e) = ctx.recorder.publish(&ev, &gpm.object_ref(&())).await {
        warn!(error = %e, reason, "publishing event failed");
    }
}

/// Everything the per-node step needs from the pool-wide observation.
struct PoolView<'a> {
    gpm: &'a GpuPoolMigration,
    slices: &'a [ResourceSlice],
    hold: Option<node_state::Hold>,
    now: Timestamp,
    /// Each in-progress node's message in the status as last written: a warning event goes out
    /// when the message changes, not on every reconcile.
    last_messages: HashMap<&'a str, &'a str>,
}

/// What one node step did, for status.
struct NodeOutcome {
    state: NodeState,
    since: Option<Timestamp>,
    message: String,
}

fn parse_since(pn: &PoolNode) -> Option<Timestamp> {
    pn.annotations.get(ANNOTATION_STATE_SINCE).and_then(|s| s.parse().ok())
}

fn gpus_before(pn: &PoolNode) -> Option<u64> {
    pn.annotations
        .get(ANNOTATION_GPUS_BEFORE)
        .and_then(|s| serde_json::from_str::<BTreeMap<String, u64>>(s).ok())
        .map(|m| m.values().sum())
        .filter(|n| *n > 0)
}

/// Observes one node, decides its step and carries it out.
async fn step_node(ctx: &Context, view: &PoolView<'_>, node: &Node, start: bool) -> Result<NodeOutcome> {
    let gpm = view.gpm;
    let spec = &gpm.spec;
    let migration = gpm.name_any();
    let res = resources(spec);
    let pn = PoolNode::from_node(node);
    let name = pn.name.clone();
    let state = pn.state();
    let failure = pn.failure();
    let client = &ctx.client;

    let mut selection = drain::Selection::default();
    let mut claim_holders = 0;
    if state == NodeState::Draining || state == NodeState::RollingBack {
        let pods = pods_on_node(client, &name).await?;
        if state == NodeState::Draining {
            selection = drain::select(&pods, &res, &spec.strategy.drain);
        } else {
            claim_holders = pods.iter().filter(|p| drain::holds_dra_claim(p)).count();
        }
    }
    let rules: Api<DeviceTaintRule> = Api::all(client.clone());
    let rule_name = taint_rule_name(&name);
    let taint_rule_exists = if matches!(state, NodeState::RollingBack | NodeState::Failed) {
        rules
            .get_opt(&rule_name)
            .await
            .map_err(|source| Error::CreateDeviceTaintRule { name: rule_name.clone(), source })?
            .is_some()
    } else {
        false
    };
    let canary_api: Api<Pod> = Api::namespaced(client.clone(), &ctx.config.canary_namespace);
    let canary_name = crate::canary::pod_name(&name);
    // The attempt is the Verifying state's start: a retry after a rollback stamps a new one.
    let attempt = parse_since(&pn).map(|t| t.as_second().to_string()).unwrap_or_default();
    let canary = match (&spec.strategy.verify.canary, state) {
        (Some(_), NodeState::Verifying) => {
            let p = canary_api
                .get_opt(&canary_name)
                .await
                .map_err(|source| Error::CreateCanary { node: name.clone(), source })?;
            match p {
                // Already going: wait for it to be gone before the new one.
                Some(p) if p.metadata.deletion_timestamp.is_some() => Canary::Running,
                p => crate::canary::outcome(p.as_ref(), &attempt),
            }
        }
        (Some(_), _) => Canary::Absent,
        (None, _) => Canary::NotConfigured,
    };

    let alloc = overlap::allocatable(node, &res);
    // What DRA must publish for the node to count as switched: a shared GPU counts once.
    let dp_gpus = crate::capacity::gpus_to_publish(node, &res);
    let observed = Observed {
        state,
        since: parse_since(&pn),
        now: view.now,
        direction: spec.direction,
        start,
        hold: view.hold,
        on_failure: spec.strategy.on_failure,
        failed_during_rollback: failure.as_ref().is_some_and(Failure::during_rollback),
        unschedulable: pn.unschedulable,
        ready: pn.ready,
        backend: pn.backend(),
        drain: DrainCounts { ..selection.counts() },
        allocatable: alloc.values().sum(),
        device_plugin_gpus: dp_gpus.values().sum(),
        gpus_before: gpus_before(&pn),
        // Only devices the scheduler can allocate count: the agent keeps them tainted until the
        // device plugin's capacity is gone.
        dra_devices: overlap::schedulable_dra_devices(view.slices, &spec.driver.name, &name),
        claim_holders,
        taint_rule_exists,
        canary,
        drain_timeout_seconds: spec.strategy.drain.timeout_seconds,
        verify_timeout_seconds: spec.strategy.verify.timeout_seconds,
    };
    let action = node_state::next_step(&observed);
    let mut message = String::new();

    match &action {
        Action::Nothing => {}
        Action::Wait { reason, message: m } => {
            message = format!("{reason}: {m}");
            let named = match *reason {
                WaitReason::EmptyDirBlocksDrain => Some(&selection.blocked_by_empty_dir),
                WaitReason::UnmanagedPodsBlockDrain => Some(&selection.unmanaged),
                _ => None,
            };
            if let Some(pods) = named {
                message = format!("{message} ({})", drain::names(pods, 5));
                // Only a person can unblock these: say so once per change, not per reconcile.
                if view.last_messages.get(name.as_str()) != Some(&message.as_str()) {
                    publish(ctx, gpm, node, EventType::Warning, reason.as_str(), message.clone()).await;
                }
            }
        }
        Action::Evict => {
            // Every pod gets its eviction; the first error is returned after the rest were tried.
            let (mut blocked, mut throttled, mut first_error) = (Vec::new(), 0, None);
            for p in &selection.evict {
                let r = drain::evict(client.clone(), p, spec.strategy.drain.grace_period_seconds).await;
                let label = match &r {
                    Ok(drain::Evicted::Yes) => "evicted",
                    Ok(drain::Evicted::Gone) => "gone",
                    Ok(drain::Evicted::Blocked(_)) => "blocked",
                    Ok(drain::Evicted::Throttled(_)) => "throttled",
                    Err(_) => "error",
                };
                ctx.metrics.evictions.get_or_create(&crate::metrics::EvictionLabels { result: label }).inc();
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
            message = format!("evicting {} pod(s)", selection.evict.len());
            if throttled > 0 {
                message = format!(
                    "{message}; the API server throttled {throttled} eviction(s) (429 without a disruption budget cause); retrying"
                );
            }
            if !blocked.is_empty() {
                message = format!("eviction blocked by a PodDisruptionBudget: {}", blocked.join("; "));
                if view.last_messages.get(name.as_str()) != Some(&message.as_str()) {
                    publish(ctx, gpm, node, EventType::Warning, "EvictionBlocked", message.clone()).await;
                }
            }
        }
        Action::CreateCanary => {
            if let Some(c) = &spec.strategy.verify.canary {
                let first = res.first().copied().unwrap_or(NVIDIA_GPU_RESOURCE);
                let taints = node.spec.as_ref().and_then(|s| s.taints.clone()).unwrap_or_default();
                let target = crate::canary::Target {
                    migration: &migration,
                    owner: owner_ref(gpm),
                    node: &name,
                    taints: &taints,
                    namespace: &ctx.config.canary_namespace,
                    resource: first,
                    attempt: &attempt,
                };
                let pod = crate::canary::pod(&target, c);
                match canary_api.create(&PostParams::default(), &pod).await {
                    Ok(_) => {}
                    Err(kube::Error::Api(s)) if s.code == 409 => {}
                    Err(source) => return Err(Error::CreateCanary { node: name.clone(), source }),
                }
                message = "canary created".into();
            }
        }
        Action::DeleteCanary => {
            match canary_api.delete(&canary_name, &DeleteParams::default()).await {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(source) => return Err(Error::CreateCanary { node: name.clone(), source }),
            }
            message = "deleting the canary of an earlier attempt".into();
        }
        Action::CreateTaintRule => {
            let mut rule = taint_rule(&name, &spec.driver.name, &migration);
            rule.metadata.owner_references = owner_ref(gpm).map(|o| vec![o]);
            match rules.create(&PostParams::default(), &rule).await {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 409 => {}
                Err(source) => return Err(Error::CreateDeviceTaintRule { name: rule_name.clone(), source }),
            }
            publish(
                ctx,
                gpm,
                node,
                EventType::Normal,
                "DeviceTaintRuleCreated",
                format!("evicting DRA claim holders from {name} with {rule_name}"),
            )
            .await;
        }
        Action::DeleteTaintRule => match rules.delete(&rule_name, &DeleteParams::default()).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(source) => return Err(Error::DeleteDeviceTaintRule { name: rule_name.clone(), source }),
        },
        _ => {}
    }

    if state == NodeState::Draining
        && action == Action::SwitchToDra
        && let Some(since) = parse_since(&pn)
    {
        let seconds = view.now.duration_since(since).as_secs_f64().max(0.0);
        ctx.metrics
            .drain_duration
            .get_or_create(&crate::metrics::MigrationLabels { migration: migration.clone() })
            .observe(seconds);
    }
    if let Some(mut patch) = node_patch(&action, &pn, &migration, view.now, &dp_gpus) {
        patch.metadata.resource_version = node.metadata.resource_version.clone();
        patch_node(ctx, &name, &patch).await?;
        if action == Action::Complete && spec.strategy.verify.canary.is_some() {
            // Best effort: the canary is finished; a leftover one is harmless.
            let _ = canary_api.delete(&canary_name, &DeleteParams::default()).await;
        }
        let (type_, reason, note) = match &action {
            Action::Fail { reason, message } => {
                (EventType::Warning, reason.as_str(), format!("node {name} failed in {state:?}: {message}"))
            }
            Action::SwitchToDevicePlugin => (
                EventType::Normal,
                "BackendDevicePlugin",
                format!("node {name} labelled back to the device plugin"),
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
        info!(node = %name, migration = %migration, from = ?state, action = ?action, "node step");
        publish(ctx, gpm, node, type_, reason, note.clone()).await;
        message = note;
    }
    let new_state = action.next_state().unwrap_or(state);
    let since = if action.next_state().is_some() { Some(view.now) } else { parse_since(&pn) };
    Ok(NodeOutcome { state: new_state, since, message })
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

fn node_selector(spec: &GpuPoolMigrationSpec) -> Result<Selector> {
    Selector::try_from(spec.node_selector.clone())
        .map_err(|e| Error::InvalidSpec { message: format!("spec.nodeSelector: {e}") })
}

/// The nodes `spec.nodeSelector` selects, listed from the API (the CLI's read; the controller
/// reads its cache with `cached_pool_nodes`).
pub async fn list_pool_nodes(client: &Client, spec: &GpuPoolMigrationSpec) -> Result<Vec<Node>> {
    let selector = node_selector(spec)?;
    Api::<Node>::all(client.clone())
        .list(&ListParams::default().labels_from(&selector))
        .await
        .map(|l| l.items)
        .map_err(|source| Error::ListNodes { source })
}

/// The nodes `spec.nodeSelector` selects, from the node cache once it has synced and shows this
/// operator's own node patches (`cache::NodeWrites`). A node whose patch the cache still lags
/// after `cache::NODE_WRITE_VISIBLE_TIMEOUT` (the watch is reconnecting or relisting) is read
/// from the API for this reconcile: a step must never be decided on a copy older than our own
/// last write of that node. A reconcile with no such node makes no request here.
async fn cached_pool_nodes(ctx: &Context, spec: &GpuPoolMigrationSpec) -> Result<Vec<Node>> {
    let selector = node_selector(spec)?;
    cache::synced(&ctx.caches.nodes, "Node").await?;
    let writes = &ctx.caches.node_writes;
    let unseen = writes.settle(cache::NODE_WRITE_VISIBLE_TIMEOUT).await;
    let mut fresh = Vec::new();
    for name in &unseen {
        let got = Api::<Node>::all(ctx.client.clone())
            .get_opt(name)
            .await
            .map_err(|source| Error::GetNode { node: name.clone(), source })?;
        let cached = ctx.caches.nodes.get(&ObjectRef::new(name));
        let cached_rv = cached.as_ref().and_then(|n| n.metadata.resource_version.as_ref());
        match got {
            Some(node) => {
                // The same version in the cache as in a read made after our write: the cache
                // shows it now.
                if cached_rv.is_some() && cached_rv == node.metadata.resource_version.as_ref() {
                    writes.forget(name);
                }
                fresh.push(node);
            }
            None => writes.forget(name),
        }
    }
    if !unseen.is_empty() {
        warn!(nodes = ?unseen, "the node cache lags this operator's node patches; read them from the API");
    }
    let cached = ctx.caches.nodes.state();
    let current = cached
        .iter()
        .map(AsRef::as_ref)
        .filter(|n| !unseen.iter().any(|u| Some(u) == n.metadata.name.as_ref()));
    Ok(cache::select_nodes(current.chain(fresh.iter()), &selector))
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

/// The capacity-reader inventory for this migration, reused for [`INVENTORY_TTL`] unless the spec
/// changed. A failed read keeps the previous findings (or none) and is logged: the inventory
/// informs, it never blocks a migration.
async fn inventory_for(ctx: &Context, gpm: &GpuPoolMigration, nodes: &[Node]) -> Vec<Finding> {
    let name = gpm.name_any();
    let generation = gpm.metadata.generation;
    let cached = ctx.inventory.lock().ok().and_then(|g| g.get(&name).cloned());
    if let Some((at, g, findings)) = &cached
        && at.elapsed() < INVENTORY_TTL
        && *g == generation
    {
        return findings.clone();
    }
    let observed = inventory_source::observe(
        &ctx.client,
        inventory_source::targets(&gpm.spec),
        Some(gpm.spec.node_selector.clone()),
        inventory_source::pool_nodes(nodes),
        inventory_source::Scope {
            config_maps: false,
            // The watch's cache; empty where the kind is not served, which is also the truth.
            device_classes: Some(ctx.caches.device_classes.state().iter().map(|c| (**c).clone()).collect()),
        },
    )
    .await;
    match observed {
        Ok(o) => {
            let findings = inventory::find(&o);
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

/// The InventoryFindings condition message: the summary, the most severe findings, and where to
/// see the rest.
pub fn inventory_message(migration: &str, findings: &[Finding], other: &[String]) -> String {
    let mut lines = vec![inventory::summary(findings)];
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

async fn apply(gpm: &GpuPoolMigration, ctx: &Context) -> Result<Requeue> {
    let client = &ctx.client;
    let spec = &gpm.spec;
    let name = gpm.name_any();
    let res = resources(spec);
    let now = Timestamp::now();

    // Nodes, DaemonSets, DeviceClasses and ResourceSlices come from the caches; see `cache` for
    // why each read is fresh enough.
    let nodes = cached_pool_nodes(ctx, spec).await?;
    let versions: Vec<NodeVersions> = nodes.iter().map(node_versions).collect();
    let facts = server_facts(ctx, &versions).await?;
    let (dn, dp) = (&spec.driver.daemon_set, &spec.device_plugin.daemon_set);
    cache::synced(&ctx.caches.daemon_sets, "DaemonSet").await?;
    let driver_ds = cache::daemon_set(&ctx.caches.daemon_sets, &dn.namespace, &dn.name);
    let plugin_ds = cache::daemon_set(&ctx.caches.daemon_sets, &dp.namespace, &dp.name);

    let verdict = pool_verdict(spec, &facts, versions, &nodes, driver_ds.is_some(), plugin_ds.is_some());

    // DeviceClasses: apply ours, then judge every class that carries one of our names.
    let mut class_statuses = Vec::new();
    if facts.served.device_classes {
        // The DeviceClass watch can only sync where the kind is served, so the wait is here.
        cache::synced(&ctx.caches.device_classes, "DeviceClass").await?;
        let mut all = cache::by_name(ctx.caches.device_classes.state().iter().map(AsRef::as_ref));
        // Apply only what is missing or differs: an apply per reconcile was a third of the
        // operator's requests per node. A cache that has not caught up with an earlier apply
        // only repeats the same apply, a no-op on the server.
        let existing: Vec<device_classes::ClassInfo> = all.iter().map(Into::into).collect();
        let uid = gpm.metadata.uid.clone().unwrap_or_default();
        for dc in device_classes::desired_all_synced(spec, &name, &uid, &existing) {
            let current = all.iter().find(|c| c.metadata.name == dc.metadata.name);
            if device_classes::needs_apply(&dc, current) {
                // The server's answer is the class as applied (with its creation time): judge
                // shadowing on it, not on the cached copy the watch has not replaced yet.
                let applied = apply_device_class(client, &dc).await?;
                cache::upsert(&mut all, applied);
            }
        }
        let infos: Vec<device_classes::ClassInfo> = all.iter().map(Into::into).collect();
        class_statuses = device_classes::statuses(spec, &infos);
    }
    let (dc_ready, dc_reason, dc_message) = if facts.served.device_classes {
        device_classes::readiness(&class_statuses)
    } else {
        (false, "ApiMissing", "resource.k8s.io/v1 deviceclasses is not served".to_string())
    };

    // Placement.
    let mut placement_problems = Vec::new();
    for (ds, role, r) in [(&plugin_ds, Role::DevicePlugin, dp), (&driver_ds, Role::Driver, dn)] {
        let Some(ds) = ds else { continue };
        if placement::has_placement(ds, role) {
            continue;
        }
        match spec.placement {
            PlacementMode::Managed => {
                let patch = placement::apply_patch(ds, role);
                Api::<DaemonSet>::namespaced(client.clone(), &r.namespace)
                    .patch(
                        &r.name,
                        &PatchParams::apply(OPERATOR_FIELD_MANAGER).force(),
                        &Patch::Apply(&patch),
                    )
                    .await
                    .map_err(|source| Error::PatchDaemonSet {
                        namespace: r.namespace.clone(),
                        name: r.name.clone(),
                        source,
                    })?;
                info!(daemonset = %format!("{}/{}", r.namespace, r.name), "added backend node affinity");
            }
            PlacementMode::Verify => placement_problems.push(placement::verify_message(ds, role)),
        }
    }
    let placement_ready = placement_problems.is_empty() && driver_ds.is_some() && plugin_ds.is_some();

    // Slices and the overlap invariant.
    let slices = if facts.served.resource_slices {
        cache::synced(&ctx.caches.resource_slices, "ResourceSlice").await?;
        cache::slices_for_driver(
            ctx.caches.resource_slices.state().iter().map(AsRef::as_ref),
            &spec.driver.name,
        )
    } else {
        Vec::new()
    };
    let overlaps: Vec<overlap::Overlap> = nodes
        .iter()
        .filter(|n| PoolNode::from_node(n).state() != NodeState::Switching)
        .filter_map(|n| overlap::check(n, &res, &slices, &spec.driver.name))
        .collect();

    // Plan.
    let others: Vec<OtherMigration> = ctx
        .migrations
        .state()
        .iter()
        .filter(|o| o.name_any() != name)
        .map(|o| OtherMigration { name: o.name_any(), selector: o.spec.node_selector.clone() })
        .collect();
    let mut pool: Vec<PoolNode> = nodes.iter().map(PoolNode::from_node).collect();
    let invalid = |m: String| Error::InvalidSpec { message: m };
    let mut p = plan::plan(&name, spec, &pool, &others).map_err(invalid)?;
    if !p.to_start.is_empty() && !p.queued.is_empty() {
        let mut counted = 0;
        for pn in pool.iter_mut() {
            if counted >= MAX_CANDIDATES_COUNTED {
                break;
            }
            if p.to_start.contains(&pn.name) || p.queued.contains(&pn.name) {
                let pods = pods_on_node(client, &pn.name).await?;
                pn.consuming_pods = match spec.direction {
                    Direction::Forward => pods.iter().filter(|x| drain::consumes_any(x, &res)).count(),
                    Direction::Rollback => pods.iter().filter(|x| drain::holds_dra_claim(x)).count(),
                } as u32;
                counted += 1;
            }
        }
        p = plan::plan(&name, spec, &pool, &others).map_err(invalid)?;
    }
    let gate_open = verdict.met && dc_ready && placement_ready && overlaps.is_empty();
    if !gate_open {
        let held: Vec<String> = std::mem::take(&mut p.to_start);
        p.queued.extend(held);
    }

    // Steps.
    let last_messages = gpm
        .status
        .iter()
        .flat_map(|s| &s.in_progress)
        .map(|p| (p.name.as_str(), p.message.as_str()))
        .collect();
    // In-flight nodes stop at their next safe point while the pool is held: paused, halted by a
    // failed node, or a gate closed (switching a node while its DeviceClass is shadowed, say,
    // would strand its pods).
    let hold = match &p.halt {
        Some(Halt::Paused) => Some(node_state::Hold::Paused),
        Some(Halt::NodeFailed(_)) => Some(node_state::Hold::NodeFailed),
        None if !gate_open => Some(node_state::Hold::GateClosed),
        None => None,
    };
    let view = PoolView { gpm, slices: &slices, hold, now, last_messages };
    let mut progress = Vec::new();
    let mut step_errors = 0;
    let by_name: HashMap<&str, &Node> =
        nodes.iter().map(|n| (n.metadata.name.as_deref().unwrap_or(""), n)).collect();
    for (node_name, start) in
        p.in_flight.iter().map(|n| (n, false)).chain(p.to_start.iter().map(|n| (n, true)))
    {
        let Some(node) = by_name.get(node_name.as_str()) else { continue };
        // One node's error stays that node's: it goes into its message and an event, and the
        // other nodes get their step.
        let out = match step_node(ctx, &view, node, start).await {
            Ok(out) => out,
            Err(e) if matches!(e, Error::PatchNode { .. }) && e.is_not_found() => {
                // Deleted mid-step: the cache drops it, and with it its status entry.
                info!(node = %node_name, migration = %name, "node deleted mid-step");
                continue;
            }
            Err(e) if e.is_conflict() => {
                // The node changed after the view this step was decided on (its kubelet wrote
                // its status, say): decide again on the fresh node, soon. Not a failure.
                debug!(node = %node_name, migration = %name, "node changed under the step; retrying");
                step_errors += 1;
                let pn = PoolNode::from_node(node);
                let message =
                    view.last_messages.get(node_name.as_str()).map(|m| m.to_string()).unwrap_or_default();
                NodeOutcome { state: pn.state(), since: parse_since(&pn), message }
            }
            Err(e) => {
                step_errors += 1;
                ctx.metrics
                    .reconcile_errors
                    .get_or_create(&crate::metrics::ErrorLabels { category: e.category() })
                    .inc();
                warn!(node = %node_name, migration = %name, category = e.category(), error = %e, "node step failed");
                let message = format!("StepError: {e}; retrying");
                if view.last_messages.get(node_name.as_str()) != Some(&message.as_str()) {
                    publish(ctx, gpm, node, EventType::Warning, "NodeStepFailed", e.to_string()).await;
                }
                let pn = PoolNode::from_node(node);
                NodeOutcome { state: pn.state(), since: parse_since(&pn), message }
            }
        };
        if out.state != NodeState::Migrated
            && out.state != NodeState::RolledBack
            && out.state != NodeState::Pending
        {
            progress.push(NodeProgress {
                name: node_name.clone(),
                state: out.state,
                since: out.since.map(Time),
                message: out.message,
            });
        }
    }

    // A node that was mid-move at the last status and is no longer in the pool was deleted (or
    // relabelled out of the selector): say so once, on the migration.
    let present: BTreeSet<&str> = nodes.iter().filter_map(|n| n.metadata.name.as_deref()).collect();
    for gone in view.last_messages.keys().filter(|n| !present.contains(*n)) {
        let ev = Event {
            type_: EventType::Warning,
            reason: "NodeRemoved".into(),
            note: Some(format!(
                "node {gone} left the pool mid-move (deleted, or no longer selected); it is dropped from the status"
            )),
            action: "MigrateNode".into(),
            secondary: Some(k8s_openapi::api::core::v1::ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Node".into()),
                name: Some(gone.to_string()),
                ..Default::default()
            }),
        };
        if let Err(e) = ctx.recorder.publish(&ev, &gpm.object_ref(&())).await {
            warn!(error = %e, "publishing the NodeRemoved event failed");
        }
    }

    // Status.
    let failed: Vec<FailedNode> = pool
        .iter()
        .filter(|n| p.failed.contains(&n.name) || n.state() == NodeState::Failed)
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
    progress.truncate(STATUS_LIST_MAX);

    let mut other_findings: Vec<String> = verdict.warnings.clone();
    other_findings.extend(device_classes::warnings(spec));
    let inventory_findings = inventory_for(ctx, gpm, &nodes).await;
    // Info findings alone say "this keeps working"; they do not make the condition True.
    let notable =
        inventory_findings.iter().any(|f| f.severity > Severity::Info) || !other_findings.is_empty();

    let mut needs_human = None;
    if let Some(Halt::NodeFailed(n)) = &p.halt {
        needs_human = Some((
            "NodeFailed".to_string(),
            format!(
                "node {n} failed and spec.strategy.onFailure is Pause; see status.failed, fix the node, then remove its switchyard.dev/migration-state annotation"
            ),
        ));
    } else if !verdict.met {
        needs_human = Some(("PrerequisitesNotMet".to_string(), verdict.message.clone()));
    } else if dc_reason == "Shadowed" {
        needs_human = Some(("DeviceClassShadowed".to_string(), dc_message.clone()));
    } else if !placement_problems.is_empty() {
        needs_human = Some(("PlacementMissing".to_string(), placement_problems.join("\n")));
    } else if let Some(o) = overlaps.first() {
        needs_human = Some(("BackendOverlap".to_string(), o.to_string()));
    } else if p.done() && !p.failed.is_empty() {
        needs_human = Some((
            "NodesFailed".to_string(),
            format!("{} node(s) failed to move; see status.failed", p.failed.len()),
        ));
    }
    let moving = p.in_flight.len() + p.to_start.len();
    let kp = Progress {
        in_flight: (moving > 0).then(|| {
            (
                "NodesMoving".to_string(),
                format!("{moving} node(s) moving, {} of {} migrated", p.counts.migrated, p.counts.total),
            )
        }),
        needs_human: needs_human.clone(),
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
    desired.push(Desired::new(ConditionType::DeviceClassesReady, dc_ready, dc_reason, dc_message));
    desired.push(if placement_ready {
        Desired::new(ConditionType::PlacementReady, true, "Placed", "both DaemonSets keep to their backend")
    } else if placement_problems.is_empty() {
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
            "NodeAffinityMissing",
            placement_problems.join("\n"),
        )
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
    let inventory_text = inventory_message(&name, &inventory_findings, &other_findings);
    desired.push(if notable {
        Desired::new(ConditionType::InventoryFindings, true, "Findings", inventory_text.clone())
    } else {
        Desired::new(ConditionType::InventoryFindings, false, "NoFindings", inventory_text.clone())
    });

    let phase = phase(spec, &p, gate_open);
    let old = gpm.status.clone().unwrap_or_default();
    let status = GpuPoolMigrationStatus {
        observed_generation: gpm.metadata.generation,
        phase: Some(phase),
        nodes: p.counts,
        in_progress: progress,
        failed,
        device_classes: class_statuses,
        conditions: conditions::merge(&old.conditions, &desired, gpm.metadata.generation, &Time(now)),
    };
    if gpm.status.as_ref() != Some(&status) {
        write_status(ctx, &name, &status).await?;
    }
    // One event when the inventory's findings change, so GitOps users see them in `kubectl describe`.
    let old_inventory = old.conditions.iter().find(|c| c.type_ == "InventoryFindings").map(|c| &c.message);
    let anything = !inventory_findings.is_empty() || !other_findings.is_empty();
    if anything && old_inventory != Some(&inventory_text) {
        let type_ = if notable { EventType::Warning } else { EventType::Normal };
        publish_on_migration(ctx, gpm, type_, "InventoryFindings", "Inventory", &inventory_text).await;
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
        publish_on_migration(ctx, gpm, EventType::Normal, "NodesJoined", "SelectNodes", &note).await;
    }
    // The acknowledged capacity change, once, under a reason of its own: the events API folds
    // events of one reason into a series that keeps the first note, so a changed
    // InventoryFindings note would not show.
    if let Some(ack) = verdict.warnings.iter().find(|w| w.contains(prerequisites::SHARING_ACKNOWLEDGED))
        && old_inventory.is_none_or(|m| !m.contains(ack.as_str()))
    {
        let reason = "GpuSharingLossAcknowledged";
        publish_on_migration(ctx, gpm, EventType::Normal, reason, "CheckPrerequisites", ack).await;
    }
    // One Warning event when the pool's nodes keep it from starting (or the reason changes).
    let old_prereq = old.conditions.iter().find(|c| c.type_ == "PrerequisitesMet");
    use crate::capacity::Block;
    if [Block::UnmappedResources.reason(), Block::GpuSharingNotAcknowledged.reason()]
        .contains(&verdict.reason)
        && old_prereq.map(|c| (c.reason.as_str(), c.message.as_str()))
            != Some((verdict.reason, verdict.message.as_str()))
    {
        let (reason, note) = (verdict.reason, &verdict.message);
        publish_on_migration(ctx, gpm, EventType::Warning, reason, "CheckPrerequisites", note).await;
    }
    // One Warning event when the conflict starts (or changes), not one per reconcile.
    let old_conflict = old.conditions.iter().find(|c| c.type_ == "NodeConflict" && c.status == "True");
    if let Some(message) = &conflict
        && old_conflict.map(|c| &c.message) != Some(message)
    {
        publish_on_migration(ctx, gpm, EventType::Warning, "NodeConflict", "SelectNodes", message).await;
    }

    // Metrics.
    let mut per_state: BTreeMap<String, (NodeState, i64)> = BTreeMap::new();
    for n in pool.iter().filter(|n| p.owned.contains(&n.name)) {
        let s = n.state();
        per_state.entry(plan::state_str(s)).or_insert((s, 0)).1 += 1;
    }
    ctx.metrics.set_nodes(&name, &per_state.into_values().collect::<Vec<_>>());
    let (mut dp_gpus, mut dra_gpus) = (0, 0);
    for n in &nodes {
        let pn = PoolNode::from_node(n);
        match pn.backend() {
            Backend::DevicePlugin => dp_gpus += overlap::allocatable_total(n, &res),
            Backend::Dra => dra_gpus += overlap::dra_devices(&slices, &spec.driver.name, &pn.name),
        }
    }
    ctx.metrics.set_gpus(&name, dp_gpus, dra_gpus);
    ctx.metrics
        .backend_overlap_nodes
        .get_or_create(&crate::metrics::MigrationLabels { migration: name.clone() })
        .set(overlaps.len() as i64);

    if step_errors > 0 {
        // Retry the failed steps soon, with the status written and the other nodes stepped.
        return Ok(Requeue::requeue(REQUEUE_ERROR));
    }
    Ok(Requeue::requeue(if moving > 0 { REQUEUE_ACTIVE } else { REQUEUE_IDLE }))
}

/// Why queued nodes do not start, when nothing else says so: the budget is used by nodes the
/// migration did not make unavailable (NotReady, failed), or the queued nodes are NotReady.
pub fn queued_message(p: &plan::Plan, gate_open: bool, moving: usize) -> Option<String> {
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

/// The phase from the plan. Pure.
pub fn phase(spec: &GpuPoolMigrationSpec, p: &plan::Plan, gate_open: bool) -> Phase {
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

/// Before a GpuPoolMigration goes away: nodes mid-switch finish their step (nothing new starts),
/// nodes that never switched are uncordoned, and our labels and annotations come off. The backend
/// label stays: it is what keeps a migrated node on DRA. DeviceClasses stay for the same reason.
async fn cleanup(gpm: &GpuPoolMigration, ctx: &Context) -> Result<Requeue> {
    let client = &ctx.client;
    let name = gpm.name_any();
    let nodes = Api::<Node>::all(client.clone())
        .list(&ListParams::default().labels(&format!("{LABEL_MIGRATION}={name}")))
        .await
        .map_err(|source| Error::ListNodes { source })?
        .items;
    let now = Timestamp::now();
    let mut busy = 0;
    for node in &nodes {
        let pn = PoolNode::from_node(node);
        match pn.state() {
            NodeState::Switching | NodeState::Verifying | NodeState::RollingBack => {
                // Slices are needed to finish a switch.
                let slices =
                    Api::<ResourceSlice>::all(client.clone())
                        .list(&ListParams::default().fields(&format!(
                            "spec.driver={},spec.nodeName={}",
                            gpm.spec.driver.name, pn.name
                        )))
                        .await
                        .map_err(|source| Error::ListResourceSlices {
                            driver: gpm.spec.driver.name.clone(),
                            source,
                        })?
                        .items;
                let view = PoolView {
                    gpm,
                    slices: &slices,
                    hold: Some(node_state::Hold::Deleting),
                    now,
                    last_messages: HashMap::new(),
                };
                step_node(ctx, &view, node, false).await?;
                busy += 1;
            }
            _ => {
                let mut patch = release_patch(&pn);
                patch.metadata.resource_version = node.metadata.resource_version.clone();
                patch_node(ctx, &pn.name, &patch).await?;
            }
        }
    }
    if busy > 0 {
        return Err(Error::CleanupWaiting { nodes: busy });
    }
    ctx.metrics.forget_pool(&name);
    Ok(Requeue::await_change())
}

/// What a migration's deletion leaves on a node that is not mid-switch. Pure.
/// - Never switched (Pending, Cordoned, Draining, or Failed before the label flip while still on
///   the device plugin): back in service, uncordoned unless an admin had cordoned it, every
///   record removed. The device plugin serves it as before.
/// - Moved (Migrated, RolledBack): the records go; the backend label stays, and says it all.
/// - Failed after the flip: the migration's ownership goes, the rest stays: cordoned, state
///   `Failed` and `switchyard.dev/failure`, so a person reads what happened and a later migration
///   reads a failed node (it waits for a person), never a Migrated one.
pub fn release_patch(pn: &PoolNode) -> NodePatch {
    let mut patch = NodePatch::default();
    patch.label(LABEL_MIGRATION, None);
    let failed_after_flip = pn.state() == NodeState::Failed
        && (pn.backend() == Backend::Dra
            || pn.failure().is_none_or(|f| !matches!(f.state, NodeState::Cordoned | NodeState::Draining)));
    if failed_after_flip {
        return patch;
    }
    if matches!(pn.state(), NodeState::Cordoned | NodeState::Draining | NodeState::Failed) {
        patch.uncordon(pn);
    }
    for a in [
        ANNOTATION_MIGRATION_STATE,
        ANNOTATION_STATE_SINCE,
        ANNOTATION_GPUS_BEFORE,
        ANNOTATION_INITIALLY_UNSCHEDULABLE,
        ANNOTATION_FAILURE,
    ] {
        patch.annotate(a, None);
    }
    patch
}

fn migrations_for_labels(
    store: &Store<GpuPoolMigration>,
    labels: &BTreeMap<String, String>,
) -> Vec<ObjectRef<GpuPoolMigration>> {
    store
        .state()
        .iter()
        .filter(|g| {
            labels.get(LABEL_MIGRATION).is_some_and(|o| *o == g.name_any())
                || Selector::try_from(g.spec.node_selector.clone()).is_ok_and(|s| s.matches(labels))
        })
        .map(|g| ObjectRef::from_obj(g.as_ref()))
        .collect()
}

/// The watch of every `K` that feeds `writer`'s store, trimmed ([`cache::trim`]), backed off on
/// its own, its errors kept out of the controller ([`watch`]); yields the objects it touched.
fn trimmed_cache<K>(
    kind: &'static str,
    metrics: &Arc<Metrics>,
    client: &Client,
    writer: reflector::store::Writer<K>,
) -> impl futures::Stream<Item = watcher::Result<K>> + Send + 'static
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone + Send + Sync,
{
    let events =
        watch::backed_off(watcher(Api::<K>::all(client.clone()), watcher::Config::default().any_semantic()));
    watch::errors_handled(
        kind,
        metrics.clone(),
        reflector(writer, events.modify(cache::trim)).touched_objects(),
    )
}

/// Runs the controller until `shutdown` resolves. `ready` flips to true once the caches synced.
pub async fn run(
    client: Client,
    metrics: Arc<Metrics>,
    config: Config,
    ready: Arc<std::sync::atomic::AtomicBool>,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    let wc = || watcher::Config::default().any_semantic();
    let gpm_watch = match &config.migration_selector {
        Some(selector) => wc().labels(selector),
        None => wc(),
    };
    // Each watch backs off alone and keeps its errors to itself (see `watch`): the controller's
    // shared trigger backoff would otherwise stop every cache while any one watch fails.
    let (store, gpm_writer) = reflector::store::<GpuPoolMigration>();
    let gpm_stream = watch::errors_handled(
        "GpuPoolMigration",
        metrics.clone(),
        reflector(
            gpm_writer,
            watch::backed_off(watcher(Api::<GpuPoolMigration>::all(client.clone()), gpm_watch)),
        )
        .applied_objects(),
    );
    let controller = Controller::for_stream(gpm_stream, store.clone());

    // Every watch feeds a store the reconcile reads (see `cache`), besides triggering reconciles.
    // Nodes are cached whole: the reconcile reads labels, annotations, spec.unschedulable,
    // status.allocatable, status.conditions and status.nodeInfo. Without managedFields and
    // status.images (`cache::trim_node`) a node is a few KiB, so thousands of nodes cost megabytes;
    // a metadata-only watch plus a LIST per reconcile was the larger cost.
    let (node_reader, node_writer) = reflector::store::<Node>();
    let (ds_reader, ds_writer) = reflector::store::<DaemonSet>();
    let (dc_reader, dc_writer) = reflector::store::<DeviceClass>();
    let (slice_reader, slice_writer) = reflector::store::<ResourceSlice>();
    let caches = Caches {
        nodes: node_reader.clone(),
        daemon_sets: ds_reader.clone(),
        device_classes: dc_reader.clone(),
        resource_slices: slice_reader.clone(),
        node_writes: Arc::new(cache::NodeWrites::default()),
    };
    let node_writes = caches.node_writes.clone();
    let node_stream = watch::errors_handled(
        "Node",
        metrics.clone(),
        cache::node_reflector(
            node_writer,
            watch::backed_off(watcher(Api::<Node>::all(client.clone()), wc())),
            node_writes,
        ),
    );
    let ds_stream = trimmed_cache("DaemonSet", &metrics, &client, ds_writer);
    let dc_stream = trimmed_cache("DeviceClass", &metrics, &client, dc_writer);
    let slice_stream = trimmed_cache("ResourceSlice", &metrics, &client, slice_writer);

    let s = store.clone();
    let map_node = move |n: Node| migrations_for_labels(&s, n.labels());
    let s = store.clone();
    let map_ds = move |ds: DaemonSet| {
        let (ns, name) = (ds.namespace().unwrap_or_default(), ds.name_any());
        s.state()
            .iter()
            .filter(|g| {
                let refs = [&g.spec.driver.daemon_set, &g.spec.device_plugin.daemon_set];
                refs.iter().any(|r| r.namespace == ns && r.name == name)
            })
            .map(|g| ObjectRef::from_obj(g.as_ref()))
            .collect::<Vec<_>>()
    };
    let s = store.clone();
    let map_dc = move |dc: DeviceClass| {
        let ext = dc.spec.as_ref().and_then(|s| s.extended_resource_name.clone());
        let dc_name = dc.name_any();
        s.state()
            .iter()
            .filter(|g| {
                g.spec.resources.iter().any(|r| {
                    Some(&r.extended_resource_name) == ext.as_ref() || r.device_class_name == dc_name
                })
            })
            .map(|g| ObjectRef::from_obj(g.as_ref()))
            .collect::<Vec<_>>()
    };
    let s = store.clone();
    let nodes_for_slices = node_reader.clone();
    let map_slice = move |rs: ResourceSlice| {
        let Some(node) = rs.spec.node_name.clone() else { return Vec::new() };
        let Some(meta) = nodes_for_slices.get(&ObjectRef::new(&node)) else { return Vec::new() };
        migrations_for_labels(&s, meta.labels())
            .into_iter()
            .filter(|r| s.get(r).is_some_and(|g| g.spec.driver.name == rs.spec.driver))
            .collect()
    };

    let ctx = Arc::new(Context::new(client.clone(), metrics, config, store.clone(), caches));
    let ready_store = store.clone();
    let ready_client = client.clone();
    tokio::spawn(async move {
        // cache::ready, not Store::wait_until_ready: the controller's runner waits on the
        // migration store too, and only one waiter is woken (see cache::ready).
        if !cache::ready(&ready_store).await
            || !cache::ready(&node_reader).await
            || !cache::ready(&ds_reader).await
        {
            return;
        }
        // The DeviceClass and ResourceSlice watches can only sync where resource.k8s.io/v1
        // serves those kinds; where it does not, the operator is still useful (it reports the
        // missing prerequisite), so readiness waits only for the caches that can sync.
        let served = loop {
            match served_apis(&ready_client).await {
                Ok(s) => break s,
                Err(e) => {
                    warn!(error = %e, "discovery for the readiness check failed; retrying");
                    tokio::time::sleep(READY_DISCOVERY_RETRY).await;
                }
            }
        };
        if served.device_classes && !cache::ready(&dc_reader).await {
            return;
        }
        if served.resource_slices && !cache::ready(&slice_reader).await {
            return;
        }
        ready.store(true, std::sync::atomic::Ordering::SeqCst);
        info!("caches synced");
    });

    controller
        .watches_stream(node_stream, map_node)
        .watches_stream(ds_stream, map_ds)
        .watches_stream(dc_stream, map_dc)
        .watches_stream(slice_stream, map_slice)
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, ctx)
        .for_each(|r| async move {
            match r {
                Ok((obj, _)) => tracing::debug!(migration = %obj.name, "reconciled"),
                Err(e) => tracing::debug!(error = %e, "controller event"),
            }
        })
        .await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pn(annotations: &[(&str, &str)], unschedulable: bool) -> PoolNode {
        PoolNode {
            name: "gpu-1".into(),
            annotations: annotations.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
            unschedulable,
            ready: true,
            ..Default::default()
        }
    }

    fn patch_json(a: &Action, node: &PoolNode) -> serde_json::Value {
        let alloc = BTreeMap::from([("nvidia.com/gpu".to_string(), 8u64)]);
        let now = Timestamp::from_second(1_000).unwrap();
        serde_json::to_value(node_patch(a, node, "pool-a", now, &alloc)).unwrap()
    }

    const NOW: &str = "1970-01-01T00:16:40Z";

    #[test]
    fn node_patch_table() {
        let fresh = pn(&[], false);
        let admin_cordoned = pn(&[(ANNOTATION_INITIALLY_UNSCHEDULABLE, "true")], true);
        let ours = pn(&[(ANNOTATION_INITIALLY_UNSCHEDULABLE, "false")], true);
        let cases = vec![
            (
                "cordon records the prior cordon state and takes ownership",
                Action::Cordon,
                fresh.clone(),
                json!({"metadata": {
                    "labels": {"switchyard.dev/migration": "pool-a"},
                    "annotations": {"switchyard.dev/initially-unschedulable": "false", "switchyard.dev/migration-state": "Cordoned", "switchyard.dev/state-since": NOW}},
                    "spec": {"unschedulable": true}}),
            ),
            (
                "re-cordon keeps the first record",
                Action::Cordon,
                admin_cordoned.clone(),
                json!({"metadata": {
                    "labels": {"switchyard.dev/migration": "pool-a"},
                    "annotations": {"switchyard.dev/migration-state": "Cordoned", "switchyard.dev/state-since": NOW}},
                    "spec": {"unschedulable": true}}),
            ),
            (
                "drain records the GPU count",
                Action::StartDrain,
                ours.clone(),
                json!({"metadata": {"annotations": {"switchyard.dev/gpus-before": "{\"nvidia.com/gpu\":8}", "switchyard.dev/migration-state": "Draining", "switchyard.dev/state-since": NOW}}}),
            ),
            (
                "switch flips the label with the state",
                Action::SwitchToDra,
                ours.clone(),
                json!({"metadata": {"labels": {"switchyard.dev/gpu-backend": "dra"}, "annotations": {"switchyard.dev/migration-state": "Switching", "switchyard.dev/state-since": NOW}}}),
            ),
            (
                "complete uncordons a node we cordoned",
                Action::Complete,
                ours.clone(),
                json!({"metadata": {"annotations": {"switchyard.dev/failure": null, "switchyard.dev/initially-unschedulable": null, "switchyard.dev/migration-state": "Migrated", "switchyard.dev/state-since": NOW}}, "spec": {"unschedulable": false}}),
            ),
            (
                "complete leaves an admin's cordon",
                Action::Complete,
                admin_cordoned.clone(),
                json!({"metadata": {"annotations": {"switchyard.dev/failure": null, "switchyard.dev/initially-unschedulable": null, "switchyard.dev/migration-state": "Migrated", "switchyard.dev/state-since": NOW}}, "spec": {"unschedulable": true}}),
            ),
            (
                "a rollback takes ownership too, on a node another migration moved",
                Action::StartRollback,
                fresh.clone(),
                json!({"metadata": {
                    "labels": {"switchyard.dev/migration": "pool-a"},
                    "annotations": {"switchyard.dev/initially-unschedulable": "false", "switchyard.dev/migration-state": "RollingBack", "switchyard.dev/state-since": NOW}},
                    "spec": {"unschedulable": true}}),
            ),
            (
                "back to the device plugin",
                Action::SwitchToDevicePlugin,
                ours.clone(),
                json!({"metadata": {"labels": {"switchyard.dev/gpu-backend": "device-plugin"}}}),
            ),
        ];
        for (name, action, node, want) in cases {
            assert_eq!(patch_json(&action, &node), want, "{name}");
        }
        for a in [
            Action::Nothing,
            Action::Evict,
            Action::CreateTaintRule,
            Action::DeleteTaintRule,
            Action::CreateCanary,
        ] {
            assert!(node_patch(&a, &ours, "pool-a", Timestamp::now(), &BTreeMap::new()).is_none(), "{a:?}");
        }
    }

    #[test]
    fn failure_is_recorded_with_the_state_it_happened_in() {
        let node = pn(&[(ANNOTATION_MIGRATION_STATE, "Draining")], true);
        let v = patch_json(
            &Action::Fail { reason: node_state::FailReason::DrainTimeout, message: "2 pods left".into() },
            &node,
        );
        let f: Failure =
            serde_json::from_str(v["metadata"]["annotations"][ANNOTATION_FAILURE].as_str().unwrap()).unwrap();
        assert_eq!(
            f,
            Failure {
                state: NodeState::Draining,
                reason: "DrainTimeout".into(),
                message: "2 pods left".into()
            }
        );
        assert_eq!(v["metadata"]["annotations"][ANNOTATION_MIGRATION_STATE], "Failed");
    }

    #[test]
    fn taint_rule_selects_the_nodes_pool_of_our_driver() {
        let v = serde_json::to_value(taint_rule("gpu-1", "gpu.switchyard.dev", "pool-a")).unwrap();
        assert_eq!(v["apiVersion"], "resource.k8s.io/v1");
        assert_eq!(v["kind"], "DeviceTaintRule");
        assert_eq!(v["metadata"]["name"], "switchyard-rollback-gpu-1");
        assert_eq!(v["spec"]["deviceSelector"], json!({"driver": "gpu.switchyard.dev", "pool": "gpu-1"}));
        assert_eq!(v["spec"]["taint"]["effect"], "NoExecute");
        assert_eq!(v["spec"]["taint"]["key"], TAINT_KEY_ROLLBACK);
    }

    #[test]
    fn backoff_doubles_and_caps() {
        let got: Vec<u64> = [1, 2, 3, 4, 7, 40].iter().map(|n| backoff(*n).as_secs()).collect();
        assert_eq!(got, [5, 10, 20, 40, 300, 300]);
    }

    #[test]
    fn release_leaves_each_node_readable() {
        let failure = |state: &str| format!(r#"{{"state":"{state}","reason":"R","message":"m"}}"#);
        let drain_failed = failure("Draining");
        let switch_failed = failure("Switching");
        let all_records = json!({"switchyard.dev/failure": null, "switchyard.dev/gpus-before": null,
            "switchyard.dev/initially-unschedulable": null, "switchyard.dev/migration-state": null,
            "switchyard.dev/state-since": null});
        let cases = vec![
            (
                "failed in the drain, still on the device plugin: back in service",
                pn(
                    &[
                        (ANNOTATION_MIGRATION_STATE, "Failed"),
                        (ANNOTATION_FAILURE, drain_failed.as_str()),
                        (ANNOTATION_INITIALLY_UNSCHEDULABLE, "false"),
                    ],
                    true,
                ),
                json!({"metadata": {"labels": {"switchyard.dev/migration": null}, "annotations": all_records},
                       "spec": {"unschedulable": false}}),
            ),
            (
                "failed after the flip: stays cordoned and Failed, only ownership goes",
                pn(
                    &[(ANNOTATION_MIGRATION_STATE, "Failed"), (ANNOTATION_FAILURE, switch_failed.as_str())],
                    true,
                ),
                json!({"metadata": {"labels": {"switchyard.dev/migration": null}}}),
            ),
            (
                "draining, an admin's cordon: the cordon stays",
                pn(
                    &[(ANNOTATION_MIGRATION_STATE, "Draining"), (ANNOTATION_INITIALLY_UNSCHEDULABLE, "true")],
                    true,
                ),
                json!({"metadata": {"labels": {"switchyard.dev/migration": null}, "annotations": all_records},
                       "spec": {"unschedulable": true}}),
            ),
            (
                "migrated: records go, the cordon is not touched",
                pn(&[(ANNOTATION_MIGRATION_STATE, "Migrated")], false),
                json!({"metadata": {"labels": {"switchyard.dev/migration": null}, "annotations": all_records}}),
            ),
        ];
        for (name, node, want) in cases {
            assert_eq!(serde_json::to_value(release_patch(&node)).unwrap(), want, "{name}");
        }
    }

    #[test]
    fn queued_message_names_what_holds_the_budget() {
        let v = |xs: &[&str]| xs.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        let held = plan::Plan {
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
        let not_ready = plan::Plan { queued: v(&["b"]), max_unavailable: 2, unavailable: 1, ..held.clone() };
        let m = queued_message(&not_ready, true, 0).expect("a message");
        assert!(m.contains("NotReady (b)"), "{m}");
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
        let p = |in_flight: &[&str], queued: &[&str], failed: &[&str], halt: Option<Halt>| plan::Plan {
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
