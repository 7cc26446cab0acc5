//! The controller's caches: reflector stores fed by the watches that also trigger reconciles, the
//! pure lookups a reconcile makes in them, and read-your-writes for the nodes the operator patches.
//!
//! # Freshness
//!
//! A store shows the API as of the last watch event it applied, milliseconds behind.
//!
//! - **What others write** (kubelet's allocatable and conditions, the driver's ResourceSlices, an
//!   admin's cordon or DaemonSet edit): a copy a few milliseconds old is no different from a LIST
//!   made a few milliseconds earlier, and the change itself arrives as a watch event that triggers
//!   the next reconcile, which sees it.
//! - **Nodes we patch**: a LIST (a quorum read) always showed our own last write; a store does not.
//!   A reconcile triggered by something else (the GpuPoolMigration event of our own status write, a
//!   slice event, the requeue) can start before the node's watch event has arrived. Acting on a
//!   copy older than our own last patch of it is not safe:
//!   - the plan counts unavailable nodes from their states: a node just cordoned would read as
//!     Pending and schedulable, so the maxUnavailable budget could start one more node whenever the
//!     candidate order moved (pod counts changed);
//!   - Complete deletes the canary; a copy still in Verifying finds no canary and creates a new one
//!     on a migrated node, which no later step removes;
//!   - a copy one step behind repeats that step: a second transition event, `state-since` stamped
//!     again, the drain duration observed twice.
//!
//!   (Repeating Cordon alone would be harmless: its patch writes `initially-unschedulable` only
//!   when the copy lacks it, and a copy that lacks it predates the whole cordon patch, so its
//!   `spec.unschedulable` is still the value from before, the one the first patch recorded.)
//!
//!   So [`NodeWrites`] records each node patch until the node cache shows it, and a reconcile
//!   starts by waiting for the cache to show every finished patch (normally it already does: the
//!   watch event beats the next reconcile). A node the cache still lags after
//!   [`NODE_WRITE_VISIBLE_TIMEOUT`] is read from the API for that reconcile.
//! - **DaemonSets and DeviceClasses we write** by server-side apply of a fixed intent: a stale copy
//!   can only repeat the same apply, which the server takes as a no-op. Within the reconcile that
//!   applies a DeviceClass, the server's answer replaces the cached copy, so shadowing is judged on
//!   the applied class.
//! - **Start-up**: a store is empty until its first LIST completes. A reconcile that read it then
//!   would conclude "no nodes selected" or "DaemonSet missing" and flap PrerequisitesMet, so every
//!   read first waits for its store's first sync ([`synced`]).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use futures::{Stream, TryStreamExt};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceSlice};
use kube::core::Selector;
use kube::runtime::reflector::{self, Lookup, ObjectRef, Store, store::Writer};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Resource, ResourceExt};
use tokio::sync::Notify;

use crate::error::{Error, Result};
use crate::node::slim::SlimNode;

pub mod pods;
use crate::node::str_map::LabelQuery;
use crate::well_known::{AGENT_FIELD_MANAGER, LABEL_MANAGED_BY};

/// How long a reconcile waits for a cache's first LIST before it fails and retries with backoff:
/// long enough to list every node of a large cluster, short enough that a watch which cannot list
/// (RBAC, a kind the server does not serve) shows up as a reconcile error instead of a silent hang.
pub const CACHE_SYNC_TIMEOUT: Duration = Duration::from_secs(30);

/// How long a reconcile waits for the node cache to show the node patches of earlier reconciles.
/// Watch events arrive within milliseconds, so this runs out only while the node watch reconnects
/// or relists; the nodes it still lags on are then read from the API.
pub const NODE_WRITE_VISIBLE_TIMEOUT: Duration = Duration::from_secs(3);

/// The reflector stores a reconcile reads instead of the API.
#[derive(Clone)]
pub struct Caches {
    /// Every node, as a [`SlimNode`].
    pub nodes: Store<SlimNode>,
    /// Every DaemonSet: the two a migration names are looked up by namespace and name.
    pub daemon_sets: Store<DaemonSet>,
    pub device_classes: Store<DeviceClass>,
    pub resource_slices: Store<CachedSlice>,
    /// The bound pods a step or check may read when a drain moves GPU consumers ([`pods`]).
    pub gpu_pods: Store<pods::WatchedPod>,
    /// Our node patches the node cache does not show yet.
    pub node_writes: Arc<NodeWrites>,
}

/// Waits until `store` holds its first complete LIST, at most [`CACHE_SYNC_TIMEOUT`]. Returns at
/// once after that: a store is never emptied again (a relist swaps the new list in whole).
pub async fn synced<K>(store: &Store<K>, kind: &'static str) -> Result<()>
where
    K: Lookup + Clone + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    match tokio::time::timeout(CACHE_SYNC_TIMEOUT, ready(store)).await {
        Ok(true) => Ok(()),
        Ok(false) | Err(_) => Err(Error::CacheNotSynced { kind }),
    }
}

/// How often [`ready`] looks at a store again.
const READY_POLL: Duration = Duration::from_millis(250);

/// Waits until `store` has synced; false when its writer went away first.
///
/// Not `Store::wait_until_ready` alone: in kube-runtime 5.0 it waits on a oneshot receiver shared
/// by every clone of the store, and that receiver keeps only the waker of the task that polled it
/// last. The controller's runner waits on the migration store too, so a second waiter (the
/// readiness task, or concurrent reconciles) can sleep forever after the store became ready: the
/// operator then never reported Ready. Polling again every `READY_POLL` registers this task's
/// waker anew and sees the value once it is there.
pub async fn ready<K>(store: &Store<K>) -> bool
where
    K: Lookup + Clone + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    loop {
        if let Ok(result) = tokio::time::timeout(READY_POLL, store.wait_until_ready()).await {
            return result.is_ok();
        }
    }
}

/// The node watch as the controller consumes it: applied to the node store, then shown to
/// `writes` (so a write counts as visible only once the store holds it), then the touched nodes,
/// to map to migrations.
pub fn node_reflector(
    writer: Writer<SlimNode>,
    events: impl Stream<Item = watcher::Result<watcher::Event<SlimNode>>> + Send + 'static,
    writes: Arc<NodeWrites>,
) -> impl Stream<Item = watcher::Result<SlimNode>> + Send + 'static {
    reflector::reflector(writer, events).inspect_ok(move |event| writes.observe(event)).touched_objects()
}

/// Drops what no reconcile reads from a cached object: `managedFields` is often the larger half of
/// an object, and nothing the operator decides depends on it.
pub fn trim<K: Resource>(obj: &mut K) {
    obj.managed_fields_mut().clear();
}

/// The nodes `selector` selects, by name (the order a LIST returns them in, so status messages
/// that name "the first" node stay stable between reconciles). Pure.
pub fn select_nodes<'a, N: std::borrow::Borrow<SlimNode> + Clone + 'a>(
    nodes: impl IntoIterator<Item = &'a N>,
    selector: &Selector,
) -> Vec<N> {
    let query = LabelQuery::from(selector);
    let mut out: Vec<N> = nodes.into_iter().filter(|n| query.matches(n.borrow().labels())).cloned().collect();
    out.sort_by(|a, b| a.borrow().metadata.name.cmp(&b.borrow().metadata.name));
    out
}

/// What a reconcile reads of a node's DRA devices for every node of the pool, not only the nodes
/// it steps: the devices a node's slices publish (the pool's GPU count), and those the scheduler
/// may allocate now (the backend-overlap invariant; see [`crate::pool::overlap`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DeviceCounts {
    /// Devices, tainted or not.
    pub devices: u64,
    /// Devices without a NoSchedule or NoExecute taint.
    pub schedulable: u64,
    /// Devices the node has to serve, unhealthy ones included ([`crate::pool::overlap::present`]):
    /// what a switch counts.
    pub present: u64,
    /// The physical GPUs behind the devices ([`crate::pool::overlap::physical_gpus`]): what the
    /// GPU gauges count.
    pub physical: u64,
}

impl DeviceCounts {
    /// The counts of `driver`'s devices for `node` in `slices`.
    pub fn of(slices: &[impl std::borrow::Borrow<ResourceSlice>], driver: &str, node: &str) -> Self {
        DeviceCounts {
            devices: crate::pool::overlap::dra_devices(slices, driver, node),
            schedulable: crate::pool::overlap::schedulable_dra_devices(slices, driver, node),
            present: crate::pool::overlap::present(slices, driver, node).count() as u64,
            physical: crate::pool::overlap::physical_gpus(slices, driver, node),
        }
    }
}

impl std::ops::AddAssign for DeviceCounts {
    fn add_assign(&mut self, other: Self) {
        self.devices += other.devices;
        self.schedulable += other.schedulable;
        self.present += other.present;
        self.physical += other.physical;
    }
}

/// A ResourceSlice as the slice cache holds it: the fields every reconcile reads (driver, node,
/// [`DeviceCounts`]) and the store's key, with the devices kept apart as one JSON text compressed
/// with DEFLATE. The cache holds a slice of every DRA node of the cluster, so each KiB kept is
/// 5 MiB at 5,000 nodes. Decoded, a slice of 4 GPUs is about 20 KiB (a `Device` and its attribute
/// and capacity maps are mostly empty `Option`s and B-tree leaves); as JSON its devices are about
/// 1 KiB, and a node's GPUs are alike, so compressed they are a few hundred bytes. A reconcile
/// needs the devices themselves only for the nodes it is switching, whose switch compares them
/// with the migration's selectors: [`CachedSlice::with_devices`] decodes those.
///
/// The store's keys carry no uid or resourceVersion: the reflector matches objects by name, and
/// nothing reads the two.
#[derive(Clone, Debug)]
pub struct CachedSlice {
    name: Box<str>,
    driver: Box<str>,
    node_name: Option<Box<str>>,
    /// `spec.pool.name`: a claim's allocation names a device by its driver, pool and name.
    pool: Box<str>,
    counts: DeviceCounts,
    /// Whether Switchyard's agent wrote it ([`LABEL_MANAGED_BY`]), whatever the driver's name.
    ours: bool,
    /// `spec.devices` as JSON (`null` when absent), DEFLATE-compressed.
    devices: Box<[u8]>,
}

/// The DEFLATE level of [`CachedSlice`]'s devices: 6, zlib's default, is within a few percent of
/// the best on device lists and several times faster than 9.
const DEVICES_LEVEL: u8 = 6;

impl CachedSlice {
    /// Trims `slice` for the cache (see the type).
    pub fn new(slice: ResourceSlice) -> Self {
        let node_name = slice.spec.node_name.clone();
        let counts = match node_name.as_deref() {
            Some(node) => DeviceCounts::of(std::slice::from_ref(&slice), &slice.spec.driver, node),
            // A node-less slice (a network-attached pool) counts for none.
            None => DeviceCounts::default(),
        };
        let ours = slice.labels().get(LABEL_MANAGED_BY).is_some_and(|v| v == AGENT_FIELD_MANAGER);
        let ResourceSlice { metadata, spec } = slice;
        // Decoded devices always serialize.
        let json = serde_json::to_vec(&spec.devices).unwrap_or_default();
        CachedSlice {
            name: metadata.name.unwrap_or_default().into_boxed_str(),
            driver: spec.driver.into_boxed_str(),
            node_name: node_name.map(String::into_boxed_str),
            pool: spec.pool.name.into_boxed_str(),
            counts,
            ours,
            devices: miniz_oxide::deflate::compress_to_vec(&json, DEVICES_LEVEL).into_boxed_slice(),
        }
    }

    /// The slice as a switch reads it: its name, driver, node and devices (the rest of its spec,
    /// and its metadata, are not kept).
    pub fn with_devices(&self) -> ResourceSlice {
        // Written by `new` from the same type, so it reads back.
        let devices = miniz_oxide::inflate::decompress_to_vec(&self.devices).unwrap_or_default();
        let mut slice = self.key();
        slice.spec.devices = serde_json::from_slice(&devices).unwrap_or_default();
        slice
    }

    /// The bytes the devices take in the cache.
    pub fn devices_bytes(&self) -> usize {
        self.devices.len()
    }

    /// The slice's name, driver, node and pool name, nothing else: what maps a slice event to
    /// migrations.
    pub fn key(&self) -> ResourceSlice {
        ResourceSlice {
            metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                name: Some(self.name.to_string()),
                ..Default::default()
            },
            spec: k8s_openapi::api::resource::v1::ResourceSliceSpec {
                driver: self.driver.to_string(),
                node_name: self.node_name.as_deref().map(str::to_owned),
                pool: k8s_openapi::api::resource::v1::ResourcePool {
                    name: self.pool.to_string(),
                    ..Default::default()
                },
                ..Default::default()
            },
        }
    }

    /// The slice's `metadata.name`.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The slice's `spec.driver`.
    pub fn driver(&self) -> &str {
        &self.driver
    }

    /// The slice's `spec.nodeName`, for a node-local slice.
    pub fn node_name(&self) -> Option<&str> {
        self.node_name.as_deref()
    }

    /// Its devices, counted (none for a slice that is not node-local).
    pub fn counts(&self) -> DeviceCounts {
        self.counts
    }

    /// Whether Switchyard's driver agent wrote it.
    pub fn ours(&self) -> bool {
        self.ours
    }
}

impl Lookup for CachedSlice {
    type DynamicType = ();

    fn kind(_: &()) -> std::borrow::Cow<'_, str> {
        <ResourceSlice as Resource>::kind(&())
    }

    fn group(_: &()) -> std::borrow::Cow<'_, str> {
        <ResourceSlice as Resource>::group(&())
    }

    fn version(_: &()) -> std::borrow::Cow<'_, str> {
        <ResourceSlice as Resource>::version(&())
    }

    fn plural(_: &()) -> std::borrow::Cow<'_, str> {
        <ResourceSlice as Resource>::plural(&())
    }

    fn name(&self) -> Option<std::borrow::Cow<'_, str>> {
        Some(self.name.as_ref().into())
    }

    fn namespace(&self) -> Option<std::borrow::Cow<'_, str>> {
        None
    }

    fn resource_version(&self) -> Option<std::borrow::Cow<'_, str>> {
        None
    }

    fn uid(&self) -> Option<std::borrow::Cow<'_, str>> {
        None
    }
}

/// The slice watch as the controller consumes it: each slice made a [`CachedSlice`] and applied
/// to the slice store, then the touched slices' keys ([`CachedSlice::key`]), to map to
/// migrations.
pub fn slice_reflector(
    writer: Writer<CachedSlice>,
    events: impl Stream<Item = watcher::Result<watcher::Event<ResourceSlice>>> + Send + 'static,
) -> impl Stream<Item = watcher::Result<ResourceSlice>> + Send + 'static {
    use watcher::Event;
    let cached = events.map_ok(|e| match e {
        Event::Apply(s) => Event::Apply(CachedSlice::new(s)),
        Event::Delete(s) => Event::Delete(CachedSlice::new(s)),
        Event::InitApply(s) => Event::InitApply(CachedSlice::new(s)),
        Event::Init => Event::Init,
        Event::InitDone => Event::InitDone,
    });
    reflector::reflector(writer, cached).touched_objects().map_ok(|c| c.key())
}

/// Every object of a cache, by name. Pure.
pub fn by_name<'a, K: Resource + Clone + 'a>(objs: impl IntoIterator<Item = &'a K>) -> Vec<K> {
    let mut out: Vec<K> = objs.into_iter().cloned().collect();
    out.sort_by(|a, b| a.meta().name.cmp(&b.meta().name));
    out
}

/// Puts `obj` in place of the object with its namespace and name, or adds it. Pure.
pub fn upsert<K: Resource>(list: &mut Vec<K>, obj: K) {
    let key = |o: &K| (o.meta().namespace.clone(), o.meta().name.clone());
    match list.iter_mut().find(|o| key(o) == key(&obj)) {
        Some(slot) => *slot = obj,
        None => list.push(obj),
    }
}

/// A DaemonSet from the cache, or `None` when it does not exist.
pub fn daemon_set(store: &Store<DaemonSet>, namespace: &str, name: &str) -> Option<DaemonSet> {
    store.get(&ObjectRef::new(name).within(namespace)).map(|ds| ds.as_ref().clone())
}

/// Read-your-writes for the node cache: the node patches the cache does not show yet. See the
/// module documentation for why. Fed by [`NodeWrites::observe`] with every event the node
/// reflector has applied to its store.
#[derive(Debug, Default)]
pub struct NodeWrites {
    pending: Mutex<HashMap<String, Pending>>,
    /// Woken whenever a write becomes visible (or moot).
    visible: Notify,
}

#[derive(Debug, Default)]
struct Pending {
    /// Patches of the node sent and not answered yet.
    in_flight: usize,
    /// The resourceVersion our latest answered patch produced, while the cache does not show it.
    awaiting: Option<String>,
    /// ResourceVersions the cache applied while a patch was in flight: the watch event of a write
    /// can arrive before the answer to the patch.
    seen: HashSet<String>,
}

/// One node patch being sent; see [`NodeWrites::begin`].
#[must_use = "finish the write with the patched node's resourceVersion"]
pub struct NodeWrite<'a> {
    writes: &'a NodeWrites,
    node: String,
    done: bool,
}

impl NodeWrite<'_> {
    /// The patch was answered: `resource_version` is the patched node's, `None` when it failed.
    pub fn finish(mut self, resource_version: Option<&str>) {
        self.done = true;
        self.writes.finish(&self.node, resource_version);
    }
}

impl Drop for NodeWrite<'_> {
    /// A write dropped unfinished (its reconcile was cancelled) counts as failed.
    fn drop(&mut self) {
        if !self.done {
            self.writes.finish(&self.node, None);
        }
    }
}

impl NodeWrites {
    fn lock(&self) -> MutexGuard<'_, HashMap<String, Pending>> {
        // Every update leaves the map consistent, so a panic elsewhere cannot have broken it.
        self.pending.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Call right before patching `node`, so that a watch event racing the answer is not missed.
    pub fn begin(&self, node: &str) -> NodeWrite<'_> {
        self.lock().entry(node.to_string()).or_default().in_flight += 1;
        NodeWrite { writes: self, node: node.to_string(), done: false }
    }

    fn finish(&self, node: &str, resource_version: Option<&str>) {
        let mut pending = self.lock();
        let Some(p) = pending.get_mut(node) else { return };
        p.in_flight = p.in_flight.saturating_sub(1);
        if let Some(rv) = resource_version {
            // A newer write supersedes an older one still awaited: showing it shows both.
            p.awaiting = (!p.seen.contains(rv)).then(|| rv.to_string());
        }
        self.settle_entry(&mut pending, node);
    }

    /// Drops the entry of `node` once nothing is in flight or awaited, and wakes the waiters.
    fn settle_entry(&self, pending: &mut HashMap<String, Pending>, node: &str) {
        let Some(p) = pending.get_mut(node) else { return };
        if p.in_flight == 0 {
            p.seen.clear();
        }
        if p.awaiting.is_none() {
            if p.in_flight == 0 {
                pending.remove(node);
            }
            self.visible.notify_waiters();
        }
    }

    /// Records an event the node reflector has applied to its store. Relist events
    /// (`InitApply`) are not counted: the store swaps a relist in only at `InitDone`, and a write
    /// a relist carries is caught by the API read after [`NODE_WRITE_VISIBLE_TIMEOUT`].
    pub fn observe(&self, event: &watcher::Event<SlimNode>) {
        match event {
            watcher::Event::Apply(node) => {
                let (Some(name), Some(rv)) = (&node.metadata.name, &node.metadata.resource_version) else {
                    return;
                };
                let mut pending = self.lock();
                let Some(p) = pending.get_mut(name) else { return };
                if p.awaiting.as_ref() == Some(rv) {
                    p.awaiting = None;
                } else if p.in_flight > 0 {
                    p.seen.insert(rv.clone());
                }
                self.settle_entry(&mut pending, name);
            }
            // A deleted node has nothing left to wait for.
            watcher::Event::Delete(node) => self.forget(&node.name_any()),
            watcher::Event::Init | watcher::Event::InitApply(_) | watcher::Event::InitDone => {}
        }
    }

    /// A fresh read of `node` found the cache current (or the node gone): stop awaiting its write.
    pub fn forget(&self, node: &str) {
        let mut pending = self.lock();
        if let Some(p) = pending.get_mut(node) {
            p.awaiting = None;
            self.settle_entry(&mut pending, node);
        }
    }

    /// Nodes with an answered patch the cache does not show yet, by name.
    pub fn unseen(&self) -> Vec<String> {
        let mut out: Vec<String> =
            self.lock().iter().filter(|(_, p)| p.awaiting.is_some()).map(|(n, _)| n.clone()).collect();
        out.sort();
        out
    }

    /// Waits, at most `timeout`, until the cache shows every answered node patch. Returns the
    /// nodes it still does not show.
    pub async fn settle(&self, timeout: Duration) -> Vec<String> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            // Registered before the check, so a write that becomes visible in between still wakes it.
            let notified = self.visible.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let unseen = self.unseen();
            if unseen.is_empty() {
                return unseen;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return self.unseen();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn node(name: &str, labels: serde_json::Value) -> SlimNode {
        serde_json::from_value(json!({"metadata": {"name": name, "labels": labels}})).unwrap()
    }

    fn names<K: Resource>(objs: &[K]) -> Vec<&str> {
        objs.iter().map(|o| o.meta().name.as_deref().unwrap_or("")).collect()
    }

    /// Two tasks wait for one store, as the controller's runner and the readiness task do. With
    /// `Store::wait_until_ready` alone the one that polled first is never woken; `ready` is.
    #[tokio::test]
    async fn every_waiter_sees_the_store_become_ready() {
        let (reader, mut writer) = reflector::store::<SlimNode>();
        let first = tokio::spawn({
            let reader = reader.clone();
            async move { ready(&reader).await }
        });
        let starved = tokio::spawn({
            let reader = reader.clone();
            async move { reader.wait_until_ready().await.is_ok() }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        // The last poller holds the receiver's only waker.
        let last = tokio::spawn({
            let reader = reader.clone();
            async move { reader.wait_until_ready().await.is_ok() }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        writer.apply_watcher_event(&watcher::Event::InitDone);
        let within = Duration::from_secs(2);
        assert!(tokio::time::timeout(within, last).await.expect("the last poller is woken").unwrap());
        assert!(tokio::time::timeout(within, first).await.expect("ready() sees it too").unwrap());
        assert!(
            tokio::time::timeout(Duration::from_millis(500), starved).await.is_err(),
            "kube-runtime's wait_until_ready woke an earlier waiter: cache::ready may no longer be needed"
        );
    }

    #[test]
    fn select_nodes_matches_the_selector_and_sorts_by_name() {
        let nodes = [
            node("gpu-b", json!({"pool": "a100"})),
            node("cpu-1", json!({"pool": "cpu"})),
            node("gpu-a", json!({"pool": "a100", "zone": "x"})),
            node("bare", json!(null)),
        ];
        let sel = |s: serde_json::Value| {
            Selector::try_from(
                serde_json::from_value::<k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector>(s)
                    .unwrap(),
            )
            .unwrap()
        };
        let cases = [
            (json!({"matchLabels": {"pool": "a100"}}), vec!["gpu-a", "gpu-b"]),
            (json!({"matchLabels": {"pool": "a100", "zone": "x"}}), vec!["gpu-a"]),
            (
                json!({"matchExpressions": [{"key": "pool", "operator": "NotIn", "values": ["a100"]}]}),
                vec!["bare", "cpu-1"],
            ),
            (json!({"matchLabels": {"pool": "h100"}}), vec![]),
        ];
        for (s, want) in cases {
            assert_eq!(names(&select_nodes(&nodes, &sel(s.clone()))), want, "{s}");
        }
    }

    fn gpu_slice(name: &str, driver: &str, node: &str) -> ResourceSlice {
        serde_json::from_value(json!({
            "metadata": {"name": name, "uid": format!("uid-{name}"), "resourceVersion": "7",
                         "managedFields": [{"manager": "agent", "operation": "Apply"}]},
            "spec": {"driver": driver, "nodeName": node,
                     "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                     "devices": [
                         {"name": "gpu-0", "attributes": {"type": {"string": "gpu"}, "index": {"int": 0}},
                          "capacity": {"memory": {"value": "80Gi"}}},
                         {"name": "gpu-1", "attributes": {"type": {"string": "gpu"}, "index": {"int": 1}},
                          "capacity": {"memory": {"value": "80Gi"}},
                          "taints": [{"key": "k", "effect": "NoSchedule"}]},
                         {"name": "bare"}]}
        }))
        .unwrap()
    }

    #[test]
    fn a_cached_slice_counts_its_devices_and_gives_them_back() {
        let slice = gpu_slice("s-1", "gpu.switchyard.dev", "gpu-1");
        let cached = CachedSlice::new(slice.clone());
        // gpu-1's NoSchedule taint: 3 devices, 2 the scheduler may allocate.
        assert_eq!(cached.counts(), DeviceCounts { devices: 3, schedulable: 2, present: 3, physical: 3 });
        assert_eq!(cached.counts(), DeviceCounts::of(&[&slice], "gpu.switchyard.dev", "gpu-1"));
        assert_eq!(
            (cached.name(), cached.driver(), cached.node_name()),
            ("s-1", "gpu.switchyard.dev", Some("gpu-1"))
        );
        assert!(!cached.ours(), "no managed-by label");
        let mut labelled = slice.clone();
        labelled.labels_mut().insert(LABEL_MANAGED_BY.into(), AGENT_FIELD_MANAGER.into());
        assert!(CachedSlice::new(labelled).ours(), "the agent's label, whatever the driver");
        // What a switch reads comes back as it was: name, driver, node, pool name (a claim's
        // allocation names devices by it) and every device, with its attributes, capacity and
        // taints.
        let back = cached.with_devices();
        assert_eq!(back.spec.devices, slice.spec.devices);
        assert_eq!(
            (back.metadata.name.as_deref(), back.spec.driver.as_str(), back.spec.node_name.as_deref()),
            (Some("s-1"), "gpu.switchyard.dev", Some("gpu-1"))
        );
        assert_eq!(back.spec.pool.name, "gpu-1");
        assert_eq!(
            crate::pool::overlap::schedulable(&[&back], "gpu.switchyard.dev", "gpu-1").count() as u64,
            cached.counts().schedulable
        );
        // The reflector keys by name alone.
        assert_eq!(
            (Lookup::name(&cached).as_deref(), Lookup::uid(&cached), Lookup::resource_version(&cached)),
            (Some("s-1"), None, None)
        );
        let key = cached.key();
        assert_eq!(
            (key.metadata.name.as_deref(), key.spec.driver.as_str(), key.spec.node_name.as_deref()),
            (Some("s-1"), "gpu.switchyard.dev", Some("gpu-1"))
        );
        // A slice of no node (a network-attached pool) counts for none.
        let mut shared = gpu_slice("s-2", "gpu.switchyard.dev", "gpu-1");
        shared.spec.node_name = None;
        shared.spec.all_nodes = Some(true);
        assert_eq!(CachedSlice::new(shared).counts(), DeviceCounts::default());
        // A slice without devices reads back without devices, not with an empty list.
        let mut empty = gpu_slice("s-3", "gpu.switchyard.dev", "gpu-1");
        empty.spec.devices = None;
        assert_eq!(CachedSlice::new(empty).with_devices().spec.devices, None);
    }

    #[test]
    fn a_cached_slice_keeps_a_nodes_alike_gpus_in_a_fraction_of_their_json() {
        // Eight GPUs as a GPU driver publishes them: the same attributes, a uuid and an index apart.
        let devices: Vec<_> = (0..8)
            .map(|i| {
                json!({"name": format!("gpu-{i}"), "attributes": {
                    "type": {"string": "gpu"}, "index": {"int": i}, "minor": {"int": i},
                    "uuid": {"string": format!("GPU-4f2a{i}c1e-8d3b-11ef-9a4c-0242ac12000{i}")},
                    "productName": {"string": "NVIDIA H100 80GB HBM3"}, "brand": {"string": "Nvidia"},
                    "architecture": {"string": "Hopper"}, "cudaComputeCapability": {"version": "9.0.0"},
                    "driverVersion": {"version": "570.124.6"}, "cudaDriverVersion": {"version": "12.8.0"},
                    "pcieBusID": {"string": format!("0000:{:02x}:00.0", 0x18 + i * 0x10)},
                    "resource.kubernetes.io/pcieRoot": {"string": format!("pci0000:{:02x}", i * 0x10)}},
                    "capacity": {"memory": {"value": "80Gi"}}})
            })
            .collect();
        let mut slice = gpu_slice("s-8", "gpu.nvidia.com", "gpu-8");
        slice.spec.devices = serde_json::from_value(json!(devices)).unwrap();
        let json = serde_json::to_vec(&slice.spec.devices).unwrap().len();
        let cached = CachedSlice::new(slice.clone());
        assert!(cached.devices_bytes() * 3 < json, "{} compressed bytes of {json}", cached.devices_bytes());
        assert_eq!(cached.with_devices().spec.devices, slice.spec.devices);
    }

    #[test]
    fn upsert_replaces_by_name_or_appends() {
        let dc = |name: &str, ext: &str| -> DeviceClass {
            serde_json::from_value(json!({"metadata": {"name": name}, "spec": {"extendedResourceName": ext}}))
                .unwrap()
        };
        let mut list = by_name(&[dc("b", "old"), dc("a", "x")]);
        assert_eq!(names(&list), ["a", "b"]);
        upsert(&mut list, dc("b", "new"));
        assert_eq!(names(&list), ["a", "b"]);
        assert_eq!(list[1].spec.as_ref().and_then(|s| s.extended_resource_name.as_deref()), Some("new"));
        upsert(&mut list, dc("c", "y"));
        assert_eq!(names(&list), ["a", "b", "c"]);
    }

    fn applied(name: &str, rv: &str) -> watcher::Event<SlimNode> {
        watcher::Event::Apply(
            serde_json::from_value(json!({"metadata": {"name": name, "resourceVersion": rv}})).unwrap(),
        )
    }

    #[test]
    fn a_write_is_awaited_until_the_cache_applies_its_version() {
        let w = NodeWrites::default();
        w.begin("gpu-1").finish(Some("7"));
        assert_eq!(w.unseen(), ["gpu-1"]);
        // An older event still in flight does not count.
        w.observe(&applied("gpu-1", "6"));
        w.observe(&applied("gpu-2", "7"));
        assert_eq!(w.unseen(), ["gpu-1"]);
        w.observe(&applied("gpu-1", "7"));
        assert!(w.unseen().is_empty());
    }

    #[test]
    fn an_event_that_beats_the_answer_counts() {
        let w = NodeWrites::default();
        let write = w.begin("gpu-1");
        w.observe(&applied("gpu-1", "7"));
        write.finish(Some("7"));
        assert!(w.unseen().is_empty());
    }

    #[test]
    fn failed_dropped_and_deleted_writes_are_not_awaited() {
        let w = NodeWrites::default();
        w.begin("gpu-1").finish(None);
        drop(w.begin("gpu-2"));
        assert!(w.unseen().is_empty());
        w.begin("gpu-3").finish(Some("9"));
        w.observe(&watcher::Event::Delete(
            serde_json::from_value(json!({"metadata": {"name": "gpu-3", "resourceVersion": "8"}})).unwrap(),
        ));
        assert!(w.unseen().is_empty());
    }

    #[test]
    fn a_newer_write_supersedes_and_forget_clears() {
        let w = NodeWrites::default();
        w.begin("gpu-1").finish(Some("7"));
        w.begin("gpu-1").finish(Some("9"));
        w.observe(&applied("gpu-1", "7"));
        assert_eq!(w.unseen(), ["gpu-1"], "the cache must show the latest write");
        w.forget("gpu-1");
        assert!(w.unseen().is_empty());
    }

    #[tokio::test]
    async fn node_reflector_counts_a_write_once_the_store_holds_it() {
        use futures::StreamExt;
        let (reader, writer) = reflector::store::<SlimNode>();
        let writes = Arc::new(NodeWrites::default());
        writes.begin("gpu-1").finish(Some("7"));
        let node = |rv: &str| -> SlimNode {
            serde_json::from_value(json!({
                "metadata": {"name": "gpu-1", "resourceVersion": rv,
                             "managedFields": [{"manager": "kubelet", "operation": "Update"}]},
                "status": {"images": [{"names": ["cuda:12"], "sizeBytes": 1}]}
            }))
            .unwrap()
        };
        let events = futures::stream::iter([
            Ok(watcher::Event::Init),
            Ok(watcher::Event::InitApply(node("7"))),
            Ok(watcher::Event::InitDone),
            Ok(watcher::Event::Apply(node("7"))),
        ]);
        let mut stream = std::pin::pin!(node_reflector(writer, events, writes.clone()));
        // The relist carries the write, but only the watch event after it counts (see `observe`).
        assert!(stream.next().await.is_some());
        assert!(reader.is_empty(), "a relist reaches the store at InitDone");
        assert_eq!(writes.unseen(), ["gpu-1"]);
        // InitDone yields nothing; the next item is the watch event.
        assert!(stream.next().await.is_some());
        let cached = reader.get(&ObjectRef::new("gpu-1")).unwrap();
        assert_eq!(cached.metadata.resource_version.as_deref(), Some("7"));
        assert!(cached.metadata.managed_fields.is_none(), "read slim before the store");
        assert!(writes.unseen().is_empty());
        assert!(stream.next().await.is_none());
    }

    #[tokio::test]
    async fn settle_returns_when_the_cache_catches_up_or_on_timeout() {
        let w = Arc::new(NodeWrites::default());
        assert!(w.settle(Duration::from_secs(5)).await.is_empty());

        w.begin("gpu-1").finish(Some("7"));
        let feeder = {
            let w = w.clone();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(20)).await;
                w.observe(&applied("gpu-1", "7"));
            })
        };
        let started = std::time::Instant::now();
        assert!(w.settle(Duration::from_secs(5)).await.is_empty());
        assert!(started.elapsed() < Duration::from_secs(5));
        feeder.await.unwrap();

        w.begin("gpu-2").finish(Some("3"));
        assert_eq!(w.settle(Duration::from_millis(20)).await, ["gpu-2"]);
    }
}
