//! The thin API layer: gathers what the pure modules need, carries out the one step each node is
//! due, applies DeviceClasses and placement, writes status and events. Every decision is made in
//! `plan`, `node_state`, `drain`, `placement`, `device_classes`, `prerequisites` and `overlap`.

pub mod watch;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::{FutureExt, StreamExt};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::{
    DeviceClass, DeviceTaint, DeviceTaintRule, DeviceTaintRuleSpec, DeviceTaintSelector, ResourceSlice,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::core::Selector;
use kube::runtime::controller::{Action as Requeue, Controller};

use kube::runtime::finalizer::{Event as Finalizer, finalizer};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::{WatchStreamExt, reflector, watcher};
use kube::{Client, Resource, ResourceExt};
use serde::Serialize;
use tracing::{debug, info, warn};

use crate::api::v1alpha1::{Direction, GpuPoolMigration, GpuPoolMigrationSpec, NodeState, PlacementMode};
use crate::cache::str_map::{LabelQuery, StrMap};
use crate::cache::{self, Caches};
use crate::error::{Error, Result};
use crate::node::slim::SlimNode;
use crate::node::state::{self, Action};
use crate::pool::prerequisites::{self, ClusterFacts, ExtendedResourceProbe, NodeVersions, ServedApis};
use crate::pool::readers::Finding;
use crate::pool::rollout::{self, Backend, Failure, PoolNode};
use crate::reads::pod_list;
use crate::reconcile::{decide, execute, observe};
use crate::report::metrics::Metrics;
use crate::well_known::*;

/// Requeue while nodes move: short, because allocatable and slices change without a label event.
pub(crate) const REQUEUE_ACTIVE: Duration = Duration::from_secs(10);
/// Requeue when idle: a safety net; watches trigger real work.
pub(crate) const REQUEUE_IDLE: Duration = Duration::from_secs(300);
/// When a node's step failed: sooner than the backoff of a failed reconcile, since only that
/// node waits.
pub(crate) const REQUEUE_ERROR: Duration = Duration::from_secs(5);
/// How often a deletion re-checks the nodes it waits for.
const CLEANUP_POLL: Duration = Duration::from_secs(5);
/// How long discovery results are reused: versions and served kinds change only on upgrades.
pub(crate) const FACTS_TTL: Duration = Duration::from_secs(300);
/// How long an inventory is reused: it LISTs quotas, LimitRanges, HPAs and Deployments
/// cluster-wide, too much for every reconcile. A spec change refreshes it at once.
pub(crate) const INVENTORY_TTL: Duration = Duration::from_secs(300);
/// How long the candidates' GPU-pod counts are reused. They only order the pool ("fewest GPU pods
/// first"), and counting reads every bound pod of the cluster in pages, so a migration of a large
/// pool pays for it a few times a minute, not on every reconcile.
pub(crate) const POD_COUNT_TTL: Duration = Duration::from_secs(30);
/// Page size of the cluster-wide pod LISTs: bounds the memory one page takes (a few MiB).
pub const POD_PAGE: u32 = 500;
/// The name of the DeviceClass used only in the dry-run probe.
const PROBE_CLASS: &str = "switchyard-probe-extended-resource";
/// The extended resource name used only in the dry-run probe.
const PROBE_RESOURCE: &str = "probe.switchyard.dev/gpu";
/// How often the readiness check retries a failed discovery: readiness waits on it, and a
/// failure is usually the API server restarting.
const READY_DISCOVERY_RETRY: Duration = Duration::from_secs(5);

/// An inventory result: when it was read, for which generation, and its findings.
type CachedInventory = (Instant, Option<i64>, Vec<Finding>);
/// GPU-pod counts of a migration's candidates: when they were read, for which generation and
/// direction, and the count per node.
pub(crate) type CachedPodCounts = (Instant, Option<i64>, HashMap<String, u32>);

/// The candidate pod counts of every migration, and the migrations whose count is being
/// refreshed in the background now.
#[derive(Default)]
pub(crate) struct PodCounts {
    pub(crate) counts: HashMap<String, CachedPodCounts>,
    pub(crate) refreshing: HashSet<String>,
}

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
    pub events: crate::report::events::Publisher,
    pub metrics: Arc<Metrics>,
    pub config: Config,
    /// The controller's GpuPoolMigration cache, to find nodes selected by two migrations.
    pub migrations: Store<GpuPoolMigration>,
    /// Nodes, DaemonSets, DeviceClasses and ResourceSlices, fed by the controller's watches: a
    /// reconcile reads these instead of the API (see `cache` for how fresh they are).
    pub caches: Caches,
    pub(crate) facts: Mutex<Option<(Instant, ServerFacts)>>,
    failures: Mutex<HashMap<String, u32>>,
    /// The last inventory per migration: when, for which generation, and its findings.
    pub(crate) inventory: Mutex<HashMap<String, CachedInventory>>,
    /// The last candidate pod counts per migration (see [`POD_COUNT_TTL`]).
    pub(crate) pod_counts: Arc<Mutex<PodCounts>>,
    /// When each migration's status was last written (see `execute::STATUS_COALESCE`).
    pub(crate) status_writes: Mutex<HashMap<String, Instant>>,
}

impl Context {
    pub fn new(
        client: Client,
        metrics: Arc<Metrics>,
        config: Config,
        migrations: Store<GpuPoolMigration>,
        caches: Caches,
    ) -> Self {
        Self {
            events: crate::report::events::Publisher::new(
                client.clone(),
                OPERATOR_FIELD_MANAGER,
                std::env::var("POD_NAME").ok(),
            ),
            client,
            metrics,
            config,
            migrations,
            caches,
            facts: Mutex::new(None),
            failures: Mutex::new(HashMap::new()),
            inventory: Mutex::new(HashMap::new()),
            pod_counts: Arc::new(Mutex::new(PodCounts::default())),
            status_writes: Mutex::new(HashMap::new()),
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
            Finalizer::Apply(g) => crate::reconcile::apply(&g, &ctx).await,
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
        .get_or_create(&crate::report::metrics::ErrorLabels { category: err.category() })
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

pub(crate) fn resources(spec: &GpuPoolMigrationSpec) -> Vec<&str> {
    spec.resources.iter().map(|r| r.extended_resource_name.as_str()).collect()
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
    nodes: &[impl std::borrow::Borrow<SlimNode>],
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
        Direction::Forward => {
            crate::pool::capacity::check(nodes.iter().map(|n| n.borrow()), &resources(spec))
        }
        // Rollback returns nodes to the device plugin, which serves whatever it served before.
        Direction::Rollback => crate::pool::capacity::Check::default(),
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
pub fn node_versions(n: &SlimNode) -> NodeVersions {
    NodeVersions {
        name: n.name_any(),
        kubelet_version: n.kubelet_version().to_string(),
        container_runtime_version: n.container_runtime_version().to_string(),
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

/// Every pod bound to `node`, with the fields a drain reads ([`pod_list::PodFields`]).
pub async fn pods_on_node(client: &Client, node: &str) -> Result<Vec<Pod>> {
    pod_list::list_node(client, node).await.map_err(|source| Error::ListPods { node: node.into(), source })
}

/// The pods bound to any node in `nodes`, by node, from paged LISTs of every bound pod in the
/// cluster ([`POD_PAGE`] a page), each pod passed through `keep` as its page arrives: a pool of
/// thousands of nodes costs (cluster pods / page) requests, not one per node, and only what `keep`
/// returns is held. `unfinished` leaves out Succeeded and Failed pods on the server. Each pod has
/// only the fields a drain reads ([`pod_list::PodFields`]).
pub async fn pods_on_nodes<T>(
    client: &Client,
    nodes: &HashSet<&str>,
    unfinished: bool,
    mut keep: impl FnMut(Pod) -> Option<T>,
) -> Result<HashMap<String, Vec<T>>> {
    let fields = if unfinished {
        "spec.nodeName!=,status.phase!=Succeeded,status.phase!=Failed"
    } else {
        "spec.nodeName!="
    };
    let mut out: HashMap<String, Vec<T>> = HashMap::new();
    let mut lp = ListParams::default().fields(fields).limit(POD_PAGE);
    loop {
        let page =
            pod_list::list_page(client, &lp).await.map_err(|source| Error::ListBoundPods { source })?;
        for pod in page.items {
            let Some(node) = pod.node_name().filter(|n| nodes.contains(n)).map(str::to_owned) else {
                continue;
            };
            if let Some(t) = keep(pod.into_pod()) {
                out.entry(node).or_default().push(t);
            }
        }
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) => lp = lp.continue_token(&token),
            None => return Ok(out),
        }
    }
}

/// The migration as the owner of what it creates for a node (canary, DeviceTaintRule), so the
/// garbage collector removes what the operator did not. No `blockOwnerDeletion`: the migration's
/// deletion never waits on them.
pub(crate) fn owner_ref(gpm: &GpuPoolMigration) -> Option<OwnerReference> {
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
        self.annotate(ANNOTATION_MIGRATION_STATE, Some(rollout::state_str(s)));
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
    /// `placement: GpuOperator` takes the GPU Operator's device plugin off the node: the deploy
    /// label goes to `false`, and what it was is recorded once (a retried switch keeps the first
    /// record, so a rollback restores what the admin had, never our own `false`).
    fn gpu_operator_off(&mut self, node: &PoolNode) {
        if !node.annotations.contains_key(ANNOTATION_DEVICE_PLUGIN_DEPLOY_BEFORE) {
            let before = node.labels.get(LABEL_GPU_OPERATOR_DEVICE_PLUGIN);
            self.annotate(ANNOTATION_DEVICE_PLUGIN_DEPLOY_BEFORE, serde_json::to_string(&before).ok());
        }
        self.label(LABEL_GPU_OPERATOR_DEVICE_PLUGIN, Some(GPU_OPERATOR_DEPLOY_OFF.to_string()));
    }
    /// The deploy label as it was before the switch, wherever a switch recorded it (whatever the
    /// mode is now: a node switched under `GpuOperator` and rolled back under another mode still
    /// gets its device plugin back). Without a record, under `GpuOperator`, a `false` label goes,
    /// so the GPU Operator deploys its device plugin there again. `forget` drops the record.
    fn gpu_operator_restore(&mut self, node: &PoolNode, placement: PlacementMode, forget: bool) {
        let recorded = node.annotations.get(ANNOTATION_DEVICE_PLUGIN_DEPLOY_BEFORE);
        match recorded.map(serde_json::from_str::<Option<String>>) {
            Some(Ok(before)) => self.label(LABEL_GPU_OPERATOR_DEVICE_PLUGIN, before),
            // Unreadable (edited by hand): leave the label to the admin, as with no record.
            Some(Err(_)) => {}
            None if placement == PlacementMode::GpuOperator
                && node.labels.get(LABEL_GPU_OPERATOR_DEVICE_PLUGIN) == Some(GPU_OPERATOR_DEPLOY_OFF) =>
            {
                self.label(LABEL_GPU_OPERATOR_DEVICE_PLUGIN, None)
            }
            None => {}
        }
        if forget && recorded.is_some() {
            self.annotate(ANNOTATION_DEVICE_PLUGIN_DEPLOY_BEFORE, None);
        }
    }
}

/// The node patch an action makes, or `None` for actions that touch other objects. Pure.
pub fn node_patch(
    action: &Action,
    node: &PoolNode,
    migration: &str,
    placement: PlacementMode,
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
        Action::CordonAndDrain => {
            p.cordon(node);
            p.label(LABEL_MIGRATION, Some(migration.to_string()));
            p.annotate(ANNOTATION_GPUS_BEFORE, serde_json::to_string(gpus).ok());
            p.state(NodeState::Draining, now);
        }
        Action::Recordon => p.spec = Some(NodeSpecPatch { unschedulable: true }),
        Action::StartDrain => {
            p.annotate(ANNOTATION_GPUS_BEFORE, serde_json::to_string(gpus).ok());
            p.state(NodeState::Draining, now);
        }
        Action::SwitchToDra | Action::StopDevicePlugin => {
            let backend = if *action == Action::SwitchToDra { BACKEND_DRA } else { BACKEND_NONE };
            p.label(LABEL_GPU_BACKEND, Some(backend.to_string()));
            if placement == PlacementMode::GpuOperator {
                p.gpu_operator_off(node);
            }
            p.state(NodeState::Switching, now);
        }
        // Same state, same clock: the switch's timeout covers both halves.
        Action::StartDriver => p.label(LABEL_GPU_BACKEND, Some(BACKEND_DRA.to_string())),
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
            // A sequential switch that fails before the driver started goes back to the device
            // plugin: no node rests with neither backend.
            if node.backend() == Backend::None {
                p.label(LABEL_GPU_BACKEND, Some(BACKEND_DEVICE_PLUGIN.to_string()));
                p.gpu_operator_restore(node, placement, false);
            }
        }
        Action::StartRollback => {
            // A rollback may start on a node this migration never moved (an earlier migration,
            // or a hand-labelled node): it takes ownership here, so the finalizer finds it and no
            // other migration moves it meanwhile.
            p.cordon(node);
            p.label(LABEL_MIGRATION, Some(migration.to_string()));
            p.state(NodeState::RollingBack, now);
        }
        Action::SwitchToDevicePlugin => {
            p.label(LABEL_GPU_BACKEND, Some(BACKEND_DEVICE_PLUGIN.to_string()));
            p.gpu_operator_restore(node, placement, false);
        }
        Action::FinishRollback => {
            p.uncordon(node);
            p.label(LABEL_GPU_BACKEND, Some(BACKEND_DEVICE_PLUGIN.to_string()));
            p.gpu_operator_restore(node, placement, true);
            p.annotate(ANNOTATION_GPUS_BEFORE, None);
            p.state(NodeState::RolledBack, now);
        }
    }
    Some(p)
}

pub(crate) fn node_selector(spec: &GpuPoolMigrationSpec) -> Result<Selector> {
    Selector::try_from(spec.node_selector.clone())
        .map_err(|e| Error::InvalidSpec { message: format!("spec.nodeSelector: {e}") })
}

/// The nodes `spec.nodeSelector` selects, listed from the API and read as the cache reads them
/// (the CLI's read; the controller reads its cache with `cached_pool_nodes`).
pub async fn list_pool_nodes(client: &Client, spec: &GpuPoolMigrationSpec) -> Result<Vec<SlimNode>> {
    let selector = node_selector(spec)?;
    Api::<SlimNode>::all(client.clone())
        .list(&ListParams::default().labels_from(&selector))
        .await
        .map(|l| l.items)
        .map_err(|source| Error::ListNodes { source })
}

/// Before a GpuPoolMigration goes away: nodes mid-switch finish their step (nothing new starts),
/// nodes that never switched are uncordoned, and our labels and annotations come off. The backend
/// label stays: it is what keeps a migrated node on DRA. DeviceClasses stay for the same reason.
async fn cleanup(gpm: &GpuPoolMigration, ctx: &Context) -> Result<Requeue> {
    let client = &ctx.client;
    let name = gpm.name_any();
    // The nodes the migration labelled, from the node cache: a LIST would read every one whole
    // (with managed fields, about 17 KiB a node: 85 MiB at 5,000 nodes).
    let labelled = kube::core::Selector::from_iter([(LABEL_MIGRATION.to_string(), name.clone())]);
    let nodes = observe::cached_nodes(ctx, &labelled).await?;
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
                let published =
                    crate::pool::overlap::schedulable_dra_devices(&slices, &gpm.spec.driver.name, &pn.name);
                let reads = observe::node(ctx, &gpm.spec, &pn, node, published).await?;
                let step = {
                    let selectors = crate::pool::selectors::Selectors::new(&gpm.spec);
                    let view = decide::NodeView {
                        spec: &gpm.spec,
                        migration: &name,
                        owner: owner_ref(gpm),
                        canary_namespace: &ctx.config.canary_namespace,
                        hold: Some(state::Hold::Deleting),
                        selectors: &selectors,
                        now,
                    };
                    decide::node_step(&view, node, &slices, published, &reads, false, None)
                };
                let out = execute::node_step(ctx, gpm, &step).await?;
                execute::publish_node_events(ctx, gpm, node, &out.events).await;
                busy += 1;
            }
            _ => {
                let mut patch = release_patch(&pn);
                patch.metadata.resource_version = node.metadata.resource_version.clone();
                execute::patch_node(ctx, &pn.name, &patch).await?;
            }
        }
    }
    if busy > 0 {
        return Err(Error::CleanupWaiting { nodes: busy });
    }
    ctx.metrics.forget_pool(&name);
    if let Ok(mut g) = ctx.inventory.lock() {
        g.remove(&name);
    }
    if let Ok(mut g) = ctx.pod_counts.lock() {
        g.counts.remove(&name);
    }
    if let Ok(mut g) = ctx.status_writes.lock() {
        g.remove(&name);
    }
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
    labels: &StrMap,
) -> Vec<ObjectRef<GpuPoolMigration>> {
    store
        .state()
        .iter()
        .filter(|g| {
            labels.get(LABEL_MIGRATION).is_some_and(|o| o == g.name_any())
                || Selector::try_from(g.spec.node_selector.clone())
                    .is_ok_and(|s| LabelQuery::from(&s).matches(labels))
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
    // Nodes are cached in part: the reconcile reads labels, annotations, spec.unschedulable,
    // status.allocatable, status.conditions and status.nodeInfo. Read as `SlimNode` (those fields,
    // the rest skipped by the parser) a node is about 2 KiB, so thousands of nodes cost
    // megabytes; a metadata-only watch plus a LIST per reconcile was the larger cost.
    let (node_reader, node_writer) = reflector::store::<SlimNode>();
    let (ds_reader, ds_writer) = reflector::store::<DaemonSet>();
    let (dc_reader, dc_writer) = reflector::store::<DeviceClass>();
    let (slice_reader, slice_writer) = reflector::store::<cache::CachedSlice>();
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
            watch::backed_off(watcher(Api::<SlimNode>::all(client.clone()), wc())),
            node_writes,
        ),
    );
    let ds_stream = trimmed_cache("DaemonSet", &metrics, &client, ds_writer);
    let dc_stream = trimmed_cache("DeviceClass", &metrics, &client, dc_writer);
    let slice_stream = watch::errors_handled(
        "ResourceSlice",
        metrics.clone(),
        cache::slice_reflector(
            slice_writer,
            watch::backed_off(watcher(Api::<ResourceSlice>::all(client.clone()), wc())),
        ),
    );

    let s = store.clone();
    let map_node = move |n: SlimNode| migrations_for_labels(&s, n.labels());
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

    // kube-runtime holds the reconcile runner until the migration store has synced, and a
    // graceful shutdown waits for that runner. Where the store never syncs (the CRD is not served
    // yet, or the API server is unreachable), a stop would wait forever, with not one reconcile
    // to finish: stop at once instead.
    let shutdown = Box::pin(shutdown).shared();
    let unsynced = store.clone();
    let stop_unsynced = shutdown.clone().then(move |()| async move {
        // One poll: a synced store answers at once. An unsynced one keeps this task's waker in
        // place of the runner's (see `cache::ready`), which no longer matters: the runner is
        // dropped right after.
        if matches!(tokio::time::timeout(Duration::ZERO, unsynced.wait_until_ready()).await, Ok(Ok(()))) {
            // Synced: the graceful shutdown below finishes the reconciles in flight.
            std::future::pending::<()>().await;
        }
    });
    let controller = controller
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
        });
    tokio::select! {
        () = controller => {}
        () = stop_unsynced => info!("stopping before the migrations' cache synced: no reconcile to finish"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

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
        patch_json_in(PlacementMode::Managed, a, node)
    }

    fn patch_json_in(placement: PlacementMode, a: &Action, node: &PoolNode) -> serde_json::Value {
        let alloc = BTreeMap::from([("nvidia.com/gpu".to_string(), 8u64)]);
        let now = Timestamp::from_second(1_000).unwrap();
        serde_json::to_value(node_patch(a, node, "pool-a", placement, now, &alloc)).unwrap()
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
                "cordon and drain in one write: ownership, the prior cordon and the GPU count",
                Action::CordonAndDrain,
                fresh.clone(),
                json!({"metadata": {
                    "labels": {"switchyard.dev/migration": "pool-a"},
                    "annotations": {"switchyard.dev/initially-unschedulable": "false", "switchyard.dev/gpus-before": "{\"nvidia.com/gpu\":8}", "switchyard.dev/migration-state": "Draining", "switchyard.dev/state-since": NOW}},
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
            assert!(
                node_patch(&a, &ours, "pool-a", PlacementMode::Managed, Timestamp::now(), &BTreeMap::new())
                    .is_none(),
                "{a:?}"
            );
        }
    }

    #[test]
    fn gpu_operator_placement_turns_the_deploy_label_off_and_restores_it_exactly() {
        const L: &str = LABEL_GPU_OPERATOR_DEVICE_PLUGIN;
        const A: &str = ANNOTATION_DEVICE_PLUGIN_DEPLOY_BEFORE;
        let with = |labels: &[(&str, &str)], annotations: &[(&str, &str)]| PoolNode {
            labels: labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
            ..pn(&[annotations, &[(ANNOTATION_INITIALLY_UNSCHEDULABLE, "false")]].concat(), true)
        };
        let (gpu, managed) = (PlacementMode::GpuOperator, PlacementMode::Managed);
        let set = |v: &str| Some(json!(v));
        let removed = Some(Value::Null);
        // (name, mode, action, node, the label in the patch, the record in the patch); None: not
        // in the patch, Some(null): removed.
        let cases = vec![
            (
                "the GPU Operator's true is recorded",
                gpu,
                Action::SwitchToDra,
                with(&[(L, "true")], &[]),
                set("false"),
                set("\"true\""),
            ),
            (
                "an absent label is recorded as null",
                gpu,
                Action::SwitchToDra,
                with(&[], &[]),
                set("false"),
                set("null"),
            ),
            (
                "a retried switch keeps the first record",
                gpu,
                Action::SwitchToDra,
                with(&[(L, "false")], &[(A, "\"true\"")]),
                set("false"),
                None,
            ),
            (
                "Managed leaves the label alone",
                managed,
                Action::SwitchToDra,
                with(&[(L, "true")], &[]),
                None,
                None,
            ),
            (
                "back to the device plugin restores the value, keeps the record",
                gpu,
                Action::SwitchToDevicePlugin,
                with(&[(L, "false")], &[(A, "\"true\"")]),
                set("true"),
                None,
            ),
            (
                "an absent label is removed again",
                gpu,
                Action::SwitchToDevicePlugin,
                with(&[(L, "false")], &[(A, "null")]),
                removed.clone(),
                None,
            ),
            (
                "the finished rollback drops the record",
                gpu,
                Action::FinishRollback,
                with(&[(L, "true")], &[(A, "\"true\"")]),
                set("true"),
                removed.clone(),
            ),
            (
                "a record is restored under any mode",
                managed,
                Action::SwitchToDevicePlugin,
                with(&[(L, "false")], &[(A, "\"an-admin-value\"")]),
                set("an-admin-value"),
                None,
            ),
            (
                "no record under GpuOperator: false goes, the GPU Operator deploys again",
                gpu,
                Action::SwitchToDevicePlugin,
                with(&[(L, "false")], &[]),
                removed.clone(),
                None,
            ),
            (
                "no record under Managed: the label is the admin's",
                managed,
                Action::SwitchToDevicePlugin,
                with(&[(L, "false")], &[]),
                None,
                None,
            ),
            (
                "a record edited into nonsense is left to the admin",
                gpu,
                Action::FinishRollback,
                with(&[(L, "false")], &[(A, "tru")]),
                None,
                removed.clone(),
            ),
        ];
        for (name, mode, action, node, label, record) in cases {
            let v = patch_json_in(mode, &action, &node);
            let get = |m: &str, k: &str| v["metadata"][m].as_object().and_then(|o| o.get(k)).cloned();
            assert_eq!(get("labels", L), label, "{name}: label");
            assert_eq!(get("annotations", A), record, "{name}: record");
        }
    }

    #[test]
    fn a_sequential_switch_labels_none_then_dra_on_one_clock_and_a_failure_in_none_goes_back() {
        const L: &str = LABEL_GPU_OPERATOR_DEVICE_PLUGIN;
        let ours = pn(&[(ANNOTATION_INITIALLY_UNSCHEDULABLE, "false")], true);
        assert_eq!(
            patch_json(&Action::StopDevicePlugin, &ours),
            json!({"metadata": {"labels": {"switchyard.dev/gpu-backend": "none"}, "annotations": {"switchyard.dev/migration-state": "Switching", "switchyard.dev/state-since": NOW}}})
        );
        // Under GpuOperator the deploy label goes off with the first label, not the second.
        let v = patch_json_in(PlacementMode::GpuOperator, &Action::StopDevicePlugin, &ours);
        assert_eq!(v["metadata"]["labels"][L], "false", "{v}");
        let mut in_none = pn(
            &[
                (ANNOTATION_MIGRATION_STATE, "Switching"),
                (ANNOTATION_DEVICE_PLUGIN_DEPLOY_BEFORE, "\"true\""),
            ],
            true,
        );
        in_none.labels.insert(LABEL_GPU_BACKEND.into(), BACKEND_NONE.into());
        // The driver starts without a new state or clock.
        assert_eq!(
            patch_json_in(PlacementMode::GpuOperator, &Action::StartDriver, &in_none),
            json!({"metadata": {"labels": {"switchyard.dev/gpu-backend": "dra"}}})
        );
        // A switch that fails before the driver started returns the node to the device plugin
        // (and the GPU Operator's label to what it was), keeping the failure and the cordon.
        let fail = Action::Fail { reason: state::FailReason::SwitchTimeout, message: "plugin stayed".into() };
        let v = patch_json_in(PlacementMode::GpuOperator, &fail, &in_none);
        assert_eq!(v["metadata"]["labels"]["switchyard.dev/gpu-backend"], "device-plugin", "{v}");
        assert_eq!(v["metadata"]["labels"][L], "true", "{v}");
        assert_eq!(v["metadata"]["annotations"][ANNOTATION_MIGRATION_STATE], "Failed", "{v}");
        assert!(v.get("spec").is_none(), "the cordon stays: {v}");
        // After the driver started, a failure keeps the label: the rollback takes it back safely.
        let mut in_dra = in_none.clone();
        in_dra.labels.insert(LABEL_GPU_BACKEND.into(), BACKEND_DRA.into());
        let v = patch_json_in(PlacementMode::GpuOperator, &fail, &in_dra);
        assert!(v["metadata"]["labels"].get("switchyard.dev/gpu-backend").is_none(), "{v}");
    }

    #[test]
    fn failure_is_recorded_with_the_state_it_happened_in() {
        let node = pn(&[(ANNOTATION_MIGRATION_STATE, "Draining")], true);
        let v = patch_json(
            &Action::Fail { reason: state::FailReason::DrainTimeout, message: "2 pods left".into() },
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
}
