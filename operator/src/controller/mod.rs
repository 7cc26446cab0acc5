//! The controller's wiring: the watches that feed the caches and trigger reconciles, which
//! migrations a changed Node, DaemonSet, DeviceClass or ResourceSlice concerns, the entry point
//! the Controller calls for each migration (apply or, on deletion, cleanup), and its error
//! policy. Every decision is made below, in `reconcile`, `node` and `pool`.

pub mod watch;

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::{FutureExt, StreamExt};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceSlice};
use kube::api::Api;
use kube::core::Selector;
use kube::runtime::controller::{Action as Requeue, Controller};
use kube::runtime::finalizer::{Event as Finalizer, finalizer};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::{WatchStreamExt, reflector, watcher};
use kube::{Client, ResourceExt};
use tracing::{debug, info, warn};

use crate::api::v1alpha1::GpuPoolMigration;
use crate::cache::{self, Caches};
use crate::error::{Error, Result};
use crate::node::slim::SlimNode;
use crate::node::str_map::{LabelQuery, StrMap};
use crate::reads::server::served_apis;
use crate::reconcile::cleanup::cleanup;
use crate::reconcile::context::{Config, Context};
use crate::report::metrics::Metrics;
use crate::well_known::*;

const CLEANUP_POLL: Duration = Duration::from_secs(5);
/// How often the readiness check retries a failed discovery: readiness waits on it, and a
/// failure is usually the API server restarting.
const READY_DISCOVERY_RETRY: Duration = Duration::from_secs(5);

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

/// The migrations a DaemonSet concerns: those that name it as their driver or device plugin.
fn migrations_for_daemon_set(
    store: &Store<GpuPoolMigration>,
    ds: &DaemonSet,
) -> Vec<ObjectRef<GpuPoolMigration>> {
    let (ns, name) = (ds.namespace().unwrap_or_default(), ds.name_any());
    store
        .state()
        .iter()
        .filter(|g| {
            let refs = [&g.spec.driver.daemon_set, &g.spec.device_plugin.daemon_set];
            refs.iter().any(|r| r.namespace == ns && r.name == name)
        })
        .map(|g| ObjectRef::from_obj(g.as_ref()))
        .collect()
}

/// The migrations a DeviceClass concerns: those with an entry of its name or its extended
/// resource name (a class that would shadow theirs), and those whose status names it as the class
/// that shadows theirs: once it stops carrying the name (an admin removes its
/// `extendedResourceName`), only that status still ties it to them.
fn migrations_for_device_class(
    store: &Store<GpuPoolMigration>,
    dc: &DeviceClass,
) -> Vec<ObjectRef<GpuPoolMigration>> {
    store.state().iter().filter(|g| concerns(g, dc)).map(|g| ObjectRef::from_obj(g.as_ref())).collect()
}

fn concerns(g: &GpuPoolMigration, dc: &DeviceClass) -> bool {
    let ext = dc.spec.as_ref().and_then(|s| s.extended_resource_name.as_ref());
    let dc_name = dc.name_any();
    let entry = g
        .spec
        .resources
        .iter()
        .any(|r| Some(&r.extended_resource_name) == ext || r.device_class_name == dc_name);
    let shadows =
        g.status.as_ref().is_some_and(|s| s.device_classes.iter().any(|c| c.shadowed_by == dc_name));
    entry || shadows
}

/// The migrations a ResourceSlice concerns: those of its node, with its driver.
fn migrations_for_slice(
    store: &Store<GpuPoolMigration>,
    nodes: &Store<SlimNode>,
    rs: &ResourceSlice,
) -> Vec<ObjectRef<GpuPoolMigration>> {
    let Some(node) = rs.spec.node_name.as_deref() else { return Vec::new() };
    let Some(meta) = nodes.get(&ObjectRef::new(node)) else { return Vec::new() };
    migrations_for_labels(store, meta.labels())
        .into_iter()
        .filter(|r| store.get(r).is_some_and(|g| g.spec.driver.name == rs.spec.driver))
        .collect()
}

/// The migrations of the node a pod the pod watch triggers with (`cache::pods::triggering`) is
/// bound to:
/// - one that left the GPU-pod cache (deleted, or finished), while that node's step waits for a
///   pod to go or to finish (Draining, RollingBack: the pods it drains; Verifying: its canary,
///   which finishes): its going may end the wait, so the step goes on at once instead of at its
///   recheck or requeue;
/// - one whose container the kubelet cannot start, on a node that has migrated: the migration
///   reports it (PodsVerified, `CannotStart`) at once, not at its idle requeue.
///
/// A pod on any other node triggers nothing, so the pods of a busy cluster do not reconcile every
/// migration.
fn migrations_for_pod(
    store: &Store<GpuPoolMigration>,
    nodes: &Store<SlimNode>,
    pod: &cache::pods::WatchedPod,
) -> Vec<ObjectRef<GpuPoolMigration>> {
    let Some(node) = pod.node_name().and_then(|n| nodes.get(&ObjectRef::new(n))) else { return Vec::new() };
    let wakes = waits_for_pods(&node) || (pod.cannot_start() && has_migrated(&node));
    if !wakes {
        return Vec::new();
    }
    migrations_for_labels(store, node.labels())
}

/// Whether `node` has moved: where a pod that cannot start is one its migration reports.
fn has_migrated(node: &SlimNode) -> bool {
    let migrated = crate::node::record::state_str(crate::api::v1alpha1::NodeState::Migrated);
    node.annotations().get(ANNOTATION_MIGRATION_STATE).is_some_and(|s| s == migrated)
}

/// Whether `node` is in a step that waits for a pod to leave it or to finish.
fn waits_for_pods(node: &SlimNode) -> bool {
    use crate::api::v1alpha1::NodeState;
    let waiting = [NodeState::Draining, NodeState::RollingBack, NodeState::Verifying]
        .map(crate::node::record::state_str);
    node.annotations().get(ANNOTATION_MIGRATION_STATE).is_some_and(|s| waiting.iter().any(|w| w == s))
}

/// Flips `ready` once the caches a reconcile reads have synced: the migrations, nodes, DaemonSets
/// and GPU pods always, the DeviceClasses and ResourceSlices where resource.k8s.io/v1 serves them.
async fn readiness(
    ready: Arc<std::sync::atomic::AtomicBool>,
    client: Client,
    store: Store<GpuPoolMigration>,
    caches: Caches,
) {
    // cache::ready, not Store::wait_until_ready: the controller's runner waits on the
    // migration store too, and only one waiter is woken (see cache::ready).
    if !cache::ready(&store).await
        || !cache::ready(&caches.nodes).await
        || !cache::ready(&caches.daemon_sets).await
        || !cache::ready(&caches.gpu_pods).await
    {
        return;
    }
    // The DeviceClass and ResourceSlice watches can only sync where resource.k8s.io/v1
    // serves those kinds; where it does not, the operator is still useful (it reports the
    // missing prerequisite), so readiness waits only for the caches that can sync.
    let served = loop {
        match served_apis(&client).await {
            Ok(s) => break s,
            Err(e) => {
                warn!(error = %e, "discovery for the readiness check failed; retrying");
                tokio::time::sleep(READY_DISCOVERY_RETRY).await;
            }
        }
    };
    if served.device_classes && !cache::ready(&caches.device_classes).await {
        return;
    }
    if served.resource_slices && !cache::ready(&caches.resource_slices).await {
        return;
    }
    ready.store(true, std::sync::atomic::Ordering::SeqCst);
    info!("caches synced");
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
///
/// Kept whole although it is over 100 lines: each watch stream's type is an unnameable chain of
/// adapters, so the streams are built where the Controller consumes them. What can be named (the
/// trimmed caches, the watch mappers, the readiness wait) is a function of its own.
#[allow(clippy::too_many_lines)]
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
    let (pod_reader, pod_writer) = reflector::store::<cache::pods::WatchedPod>();
    let caches = Caches {
        nodes: node_reader.clone(),
        daemon_sets: ds_reader,
        device_classes: dc_reader,
        resource_slices: slice_reader.clone(),
        gpu_pods: pod_reader,
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
    // Bound pods, paged (not `any_semantic`: served from the watch cache, the first LIST of a
    // cluster's pods comes whole, tens of MiB of JSON at 50,000 pods).
    let pod_stream = watch::errors_handled(
        "Pod",
        metrics.clone(),
        cache::pods::triggering(cache::pods::gpu_pod_reflector(
            pod_writer,
            watch::backed_off(watcher(
                Api::<cache::pods::WatchedPod>::all(client.clone()),
                watcher::Config::default().fields(cache::pods::BOUND),
            )),
        )),
    );

    let s = store.clone();
    let map_node = move |n: SlimNode| migrations_for_labels(&s, n.labels());
    let s = store.clone();
    let map_ds = move |ds: DaemonSet| migrations_for_daemon_set(&s, &ds);
    let s = store.clone();
    let map_dc = move |dc: DeviceClass| migrations_for_device_class(&s, &dc);
    let (s, nodes) = (store.clone(), node_reader.clone());
    let map_slice = move |rs: ResourceSlice| migrations_for_slice(&s, &nodes, &rs);
    let (s, nodes) = (store.clone(), node_reader.clone());
    let map_pod = move |p: cache::pods::WatchedPod| migrations_for_pod(&s, &nodes, &p);

    metrics.set_cluster_source(cluster_gpus(
        ready.clone(),
        node_reader.clone(),
        slice_reader.clone(),
        store.clone(),
    ));
    tokio::spawn(readiness(ready, client.clone(), store.clone(), caches.clone()));
    let ctx = Arc::new(Context::new(client.clone(), metrics, config, store.clone(), caches));

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
        // Feeds the GPU-pod cache; only a pod leaving it from a draining node, or one that cannot
        // start on a migrated node, triggers (`cache::pods`).
        .watches_stream(pod_stream, map_pod)
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

/// `switchyard_cluster_gpus` from the caches: every node, with the DRA devices of the GPU drivers
/// (every slice Switchyard's agent wrote, whatever its driver name, and NVIDIA's driver's and each
/// migration's) and the device plugin's GPU resources (the defaults and each migration's
/// `spec.devicePlugin.gpuResources`). Nothing until the caches have
/// synced (`ready`): an empty cache would read as every GPU gone.
fn cluster_gpus(
    ready: Arc<std::sync::atomic::AtomicBool>,
    nodes: Store<SlimNode>,
    slices: Store<cache::CachedSlice>,
    migrations: Store<GpuPoolMigration>,
) -> crate::report::metrics::ClusterGpusSource {
    Box::new(move || {
        if !ready.load(std::sync::atomic::Ordering::SeqCst) {
            return None;
        }
        let migrations = migrations.state();
        let mut drivers = vec![DEFAULT_DRIVER_NAME, NVIDIA_DRA_DRIVER];
        drivers.extend(migrations.iter().map(|m| m.spec.driver.name.as_str()));
        let extra: Vec<&str> = migrations
            .iter()
            .flat_map(|m| m.spec.device_plugin.gpu_resources.iter().map(String::as_str))
            .collect();
        let mut counts: std::collections::HashMap<String, cache::DeviceCounts> = Default::default();
        for slice in slices.state() {
            if let Some(node) =
                slice.node_name().filter(|_| slice.ours() || drivers.contains(&slice.driver()))
            {
                *counts.entry(node.to_string()).or_default() += slice.counts();
            }
        }
        let nodes = nodes.state();
        Some(crate::report::gpus::cluster(nodes.iter().map(AsRef::as_ref), &counts, |r| {
            is_gpu_resource(r, &extra)
        }))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn migration(status_shadowed_by: &str) -> GpuPoolMigration {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "switchyard.dev/v1alpha1", "kind": "GpuPoolMigration",
            "metadata": {"name": "m"},
            "spec": {
                "nodeSelector": {"matchLabels": {"pool": "a"}},
                "resources": [{"extendedResourceName": "nvidia.com/gpu", "deviceClassName": "gpu.nvidia.switchyard.dev"}],
                "driver": {"name": "gpu.nvidia.com",
                           "daemonSet": {"namespace": "nvidia-dra-driver-gpu", "name": "dra-driver-nvidia-gpu-kubelet-plugin"}},
                "devicePlugin": {"daemonSet": {"namespace": "kube-system", "name": "nvidia-device-plugin-daemonset"}},
            },
            "status": {"deviceClasses": [{
                "name": "gpu.nvidia.switchyard.dev", "extendedResourceName": "nvidia.com/gpu",
                "effective": status_shadowed_by.is_empty(), "shadowedBy": status_shadowed_by,
            }]},
        }))
        .expect("a migration")
    }

    fn class(name: &str, ext: Option<&str>) -> DeviceClass {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name},
            "spec": {"extendedResourceName": ext},
        }))
        .expect("a class")
    }

    #[test]
    fn a_class_concerns_the_migrations_of_its_name_or_extended_resource() {
        let g = migration("");
        assert!(concerns(&g, &class("gpu.nvidia.switchyard.dev", None)), "its own class");
        assert!(concerns(&g, &class("gpu.nvidia.com", Some("nvidia.com/gpu"))), "a class that may shadow it");
        assert!(!concerns(&g, &class("gpu.nvidia.com", Some("nvidia.com/mig-1g.10gb"))), "another resource");
        assert!(!concerns(&g, &class("gpu.nvidia.com", None)), "unrelated");
    }

    #[test]
    fn the_class_that_shadowed_a_migration_concerns_it_after_it_drops_the_name() {
        // NVIDIA's chart class re-created newer than ours, then the admin removes its
        // extendedResourceName as the Shadowed message says: that update must reach the migration.
        let g = migration("gpu.nvidia.com");
        assert!(concerns(&g, &class("gpu.nvidia.com", None)));
        assert!(!concerns(&g, &class("mig.nvidia.com", None)));
    }

    /// A pod leaving the cache on a draining, rolling-back or verifying node wakes the node's
    /// migration (by its label or its selector); one on a node at rest or switching, or on a node
    /// the cache does not know, wakes nothing. A pod that cannot start wakes the migration of a
    /// migrated node. Only what leaves the cache, or cannot start, reaches the mapper.
    #[tokio::test]
    async fn a_deleted_pod_wakes_the_migration_of_its_node_only_while_the_node_waits_for_pods() {
        use futures::TryStreamExt;
        let (migrations, mut w) = reflector::store::<GpuPoolMigration>();
        w.apply_watcher_event(&watcher::Event::Apply(migration("")));
        let (nodes, mut w) = reflector::store::<SlimNode>();
        let node = |name: &str, state: Option<&str>| -> SlimNode {
            let annotations = state.map(|s| serde_json::json!({ANNOTATION_MIGRATION_STATE: s}));
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": name, "labels": {"pool": "a"}, "annotations": annotations},
            }))
            .expect("a node")
        };
        for n in [
            node("draining", Some("Draining")),
            node("back", Some("RollingBack")),
            node("switching", Some("Switching")),
            node("verifying", Some("Verifying")),
            node("rest", None),
            node("migrated", Some("Migrated")),
        ] {
            w.apply_watcher_event(&watcher::Event::Apply(n));
        }
        let pod = |on: &str| -> cache::pods::WatchedPod {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": format!("train-{on}"), "namespace": "ml"},
                "spec": {"nodeName": on, "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
                "status": {"phase": "Running"},
            }))
            .expect("a pod")
        };
        let woken = |on: &str| -> Vec<String> {
            migrations_for_pod(&migrations, &nodes, &pod(on)).into_iter().map(|r| r.name).collect()
        };
        let stuck = |on: &str| -> cache::pods::WatchedPod {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": format!("stuck-{on}"), "namespace": "ml"},
                "spec": {"nodeName": on, "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
                "status": {"phase": "Pending", "containerStatuses": [{"name": "c", "image": "c", "imageID": "",
                    "ready": false, "restartCount": 0, "state": {"waiting": {"reason": "CreateContainerConfigError"}}}]},
            }))
            .expect("a pod")
        };
        let woken_by_stuck = |on: &str| -> Vec<String> {
            migrations_for_pod(&migrations, &nodes, &stuck(on)).into_iter().map(|r| r.name).collect()
        };
        assert_eq!(woken_by_stuck("migrated"), ["m"], "a pod that cannot start on a migrated node");
        assert!(woken_by_stuck("rest").is_empty(), "not a node that has moved");
        assert!(woken("migrated").is_empty(), "a pod leaving a migrated node");
        assert_eq!(woken("draining"), ["m"]);
        assert_eq!(woken("back"), ["m"]);
        assert_eq!(woken("verifying"), ["m"], "its canary finished");
        assert!(woken("switching").is_empty());
        assert!(woken("rest").is_empty());
        assert!(woken("unknown").is_empty());

        let events = futures::stream::iter([
            Ok(watcher::Event::Apply(pod("draining"))),
            Ok(watcher::Event::Delete(pod("back"))),
            Ok(watcher::Event::InitApply(pod("rest"))),
            Ok(watcher::Event::Apply(stuck("migrated"))),
        ]);
        let triggering: Vec<_> = cache::pods::triggering(events).try_collect().await.expect("no error");
        assert_eq!(
            triggering,
            [pod("back"), stuck("migrated")],
            "the deletion and the pod that cannot start"
        );
    }

    #[test]
    fn backoff_doubles_and_caps() {
        let got: Vec<u64> = [1, 2, 3, 4, 7, 40].iter().map(|n| backoff(*n).as_secs()).collect();
        assert_eq!(got, [5, 10, 20, 40, 300, 300]);
    }
}
