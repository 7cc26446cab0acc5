//! The operator's Prometheus metrics, all prefixed `switchyard_`. Label values are bounded: an
//! error category, a node state, a backend, and the GpuPoolMigration name (a handful per cluster,
//! never a node or pod name).

use std::collections::HashMap;
use std::sync::Mutex;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Registry, Unit};

use crate::api::v1alpha1::NodeState;
use crate::report::gpus::GpusByBackend;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ErrorLabels {
    pub category: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NodeLabels {
    pub migration: String,
    pub state: &'static str,
}

/// `backend` label values.
pub const BACKEND_LABEL_DEVICE_PLUGIN: &str = "device-plugin";
pub const BACKEND_LABEL_DRA: &str = "dra";
/// GPUs no backend serves at the moment: a node between backends, or one whose backend is down.
pub const BACKEND_LABEL_NONE: &str = "none";
const BACKEND_LABELS: [&str; 3] = [BACKEND_LABEL_DEVICE_PLUGIN, BACKEND_LABEL_DRA, BACKEND_LABEL_NONE];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BackendLabels {
    pub backend: &'static str,
}

/// Computes the cluster's GPUs by backend at each scrape, from the caches of the replica that leads.
pub type ClusterGpusSource = Box<dyn Fn() -> Option<GpusByBackend> + Send + Sync>;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct GpuLabels {
    pub migration: String,
    pub backend: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct MigrationLabels {
    pub migration: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StalledLabels {
    pub migration: String,
    /// The Stalled condition's reason (`NodeFailed`, `PrerequisitesNotMet`, ...): a short fixed set.
    pub reason: String,
}

/// Histogram constructor for per-pool drain durations: 1 s to ~68 min, since a drain waits for
/// pods' own termination grace periods and for PodDisruptionBudgets.
fn drain_histogram() -> Histogram {
    Histogram::new(exponential_buckets(1.0, 2.0, 13))
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PhaseLabels {
    /// `observe` (caches and the moving nodes' reads), `decide` (pure) or `execute` (the writes);
    /// and two parts of `execute`: `execute_steps` (the nodes' steps) and `execute_status` (the
    /// status write, when there is one).
    pub phase: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WatchLabels {
    /// The kind the watch lists: `GpuPoolMigration`, `Node`, `DaemonSet`, `DeviceClass`,
    /// `ResourceSlice`.
    pub kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EvictionLabels {
    pub result: &'static str,
}

/// Every metric the operator exports.
pub struct Metrics {
    pub registry: Registry,
    pub reconciliations: Counter,
    pub reconcile_errors: Family<ErrorLabels, Counter>,
    pub reconcile_duration: Histogram,
    /// The same time by part of the reconcile, to tell waiting on the API from deciding.
    pub reconcile_phase_duration: Family<PhaseLabels, Histogram, fn() -> Histogram>,
    pub nodes: Family<NodeLabels, Gauge>,
    /// A pool's physical GPUs by what serves them; the sum is the pool's GPUs.
    pub pool_gpus: Family<GpuLabels, Gauge>,
    /// Every GPU node's physical GPUs by what serves them, migrations or not. Only the leader,
    /// whose caches hold the cluster, exports it.
    pub cluster_gpus: Family<BackendLabels, Gauge>,
    cluster_source: Mutex<Option<ClusterGpusSource>>,
    pub evictions: Family<EvictionLabels, Counter>,
    pub backend_overlap_nodes: Family<MigrationLabels, Gauge>,
    pub drain_duration: Family<MigrationLabels, Histogram, fn() -> Histogram>,
    pub watch_errors: Family<WatchLabels, Counter>,
    /// 1 while this replica holds the leader Lease (or runs without leader election).
    pub leader: Gauge,
    /// 1 per migration whose Stalled condition is True, labelled with its reason; no series
    /// otherwise. See [`Metrics::set_stalled`].
    pub migration_stalled: Family<StalledLabels, Gauge>,
    /// Bytes the allocator has handed out and not had back, read at each scrape
    /// (`runtime::alloc::heap_in_use`, set by the process at each scrape): beside the process's RSS it tells live data from what the
    /// allocator holds free.
    pub heap_in_use: Gauge,
    stalled_reasons: Mutex<HashMap<String, String>>,
    /// Held while a group of series that belong together is written (a pool's GPUs by backend,
    /// its nodes by state, the cluster's GPUs) and while the registry is encoded, so a scrape
    /// never reads half an update: a pool's GPUs summing to less than the pool mid-switch.
    whole: Mutex<()>,
}

/// Every node state, so a gauge drops to 0 when the last node leaves a state.
pub const ALL_STATES: [NodeState; 10] = [
    NodeState::Pending,
    NodeState::Cordoned,
    NodeState::Draining,
    NodeState::Switching,
    NodeState::Verifying,
    NodeState::Migrated,
    NodeState::Failed,
    NodeState::RollingBack,
    NodeState::RolledBack,
    NodeState::Replaced,
];

pub fn state_label(s: NodeState) -> &'static str {
    match s {
        NodeState::Pending => "Pending",
        NodeState::Cordoned => "Cordoned",
        NodeState::Draining => "Draining",
        NodeState::Switching => "Switching",
        NodeState::Verifying => "Verifying",
        NodeState::Migrated => "Migrated",
        NodeState::Failed => "Failed",
        NodeState::RollingBack => "RollingBack",
        NodeState::RolledBack => "RolledBack",
        NodeState::Replaced => "Replaced",
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Registers every metric under the `switchyard_` prefix.
    ///
    /// Kept whole although it is over 100 lines: a table of registrations, one metric's name,
    /// help and type per entry, read best in one place.
    #[allow(clippy::too_many_lines)]
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("switchyard");
        // Counter names carry no `_total`: prometheus-client appends it (and panics in debug
        // builds when the name already ends with it).
        let reconciliations = Counter::default();
        registry.register("reconciliations", "GpuPoolMigration reconciles started", reconciliations.clone());
        let reconcile_errors = Family::<ErrorLabels, Counter>::default();
        registry.register(
            "reconcile_errors",
            "Reconciles that failed, by error category",
            reconcile_errors.clone(),
        );
        // 1 ms to ~33 s: most reconciles read only caches and take milliseconds; one that lists a
        // large cluster's pods or evicts a page of them takes seconds.
        let reconcile_duration = Histogram::new(exponential_buckets(0.001, 2.0, 16));
        registry.register_with_unit(
            "reconcile_duration",
            "Time one reconcile took",
            Unit::Seconds,
            reconcile_duration.clone(),
        );
        let reconcile_phase_duration =
            Family::<PhaseLabels, Histogram, fn() -> Histogram>::new_with_constructor(|| {
                Histogram::new(exponential_buckets(0.001, 2.0, 16))
            });
        registry.register_with_unit(
            "reconcile_phase_duration",
            "Time one part of a reconcile took: observe, decide or execute (execute_steps and execute_status are parts of execute)",
            Unit::Seconds,
            reconcile_phase_duration.clone(),
        );
        let nodes = Family::<NodeLabels, Gauge>::default();
        registry.register("nodes", "Pool nodes by migration state", nodes.clone());
        let pool_gpus = Family::<GpuLabels, Gauge>::default();
        registry.register(
            "pool_gpus",
            "Physical GPUs of the pool's nodes by what serves them now (device-plugin, dra, or none between backends); the sum is flat across a healthy migration",
            pool_gpus.clone(),
        );
        let cluster_gpus = Family::<BackendLabels, Gauge>::default();
        registry.register(
            "cluster_gpus",
            "Physical GPUs of every GPU node of the cluster by what serves them now (device-plugin, dra, or none), whether or not a migration selects it",
            cluster_gpus.clone(),
        );
        let evictions = Family::<EvictionLabels, Counter>::default();
        registry.register(
            "evictions",
            "Pod evictions sent, by result (deleted: a rolling-back holder deleted past its budget where no NoExecute rule can evict it)",
            evictions.clone(),
        );
        let backend_overlap_nodes = Family::<MigrationLabels, Gauge>::default();
        registry.register(
            "backend_overlap_nodes",
            "Pool nodes served by the device plugin and the DRA driver at once; must be 0",
            backend_overlap_nodes.clone(),
        );
        let drain_duration =
            Family::<MigrationLabels, Histogram, fn() -> Histogram>::new_with_constructor(drain_histogram);
        registry.register_with_unit(
            "drain_duration",
            "Time from the start of a node's drain to its switch",
            Unit::Seconds,
            drain_duration.clone(),
        );
        let watch_errors = Family::<WatchLabels, Counter>::default();
        registry.register(
            "watch_errors",
            "Watch failures by watched kind; each watch retries on its own within 5 s",
            watch_errors.clone(),
        );
        let leader = Gauge::default();
        registry.register(
            "leader",
            "1 while this replica holds the leader Lease and moves the pools, else 0",
            leader.clone(),
        );
        let migration_stalled = Family::<StalledLabels, Gauge>::default();
        registry.register(
            "migration_stalled",
            "1 while a GpuPoolMigration's Stalled condition is True (only a person can unblock it), by the condition's reason",
            migration_stalled.clone(),
        );
        let heap_in_use = Gauge::default();
        registry.register_with_unit(
            "heap_in_use",
            "Heap memory allocated and not freed (jemalloc stats.allocated), read at each scrape",
            Unit::Bytes,
            heap_in_use.clone(),
        );
        Self {
            registry,
            reconciliations,
            reconcile_errors,
            reconcile_duration,
            reconcile_phase_duration,
            nodes,
            pool_gpus,
            cluster_gpus,
            cluster_source: Mutex::new(None),
            evictions,
            backend_overlap_nodes,
            drain_duration,
            watch_errors,
            leader,
            migration_stalled,
            heap_in_use,
            stalled_reasons: Mutex::new(HashMap::new()),
            whole: Mutex::new(()),
        }
    }

    /// Records a pool's stall: `Some(reason)` while its Stalled condition is True. A changed or
    /// cleared reason removes the old series, so an alert on it resolves.
    pub fn set_stalled(&self, pool: &str, reason: Option<&str>) {
        let Ok(mut reasons) = self.stalled_reasons.lock() else { return };
        let previous = match reason {
            Some(r) => reasons.insert(pool.to_string(), r.to_string()),
            None => reasons.remove(pool),
        };
        if let Some(old) = previous.filter(|old| Some(old.as_str()) != reason) {
            self.migration_stalled.remove(&StalledLabels { migration: pool.to_string(), reason: old });
        }
        if let Some(r) = reason {
            self.migration_stalled
                .get_or_create(&StalledLabels { migration: pool.to_string(), reason: r.to_string() })
                .set(1);
        }
    }

    /// Sets the per-state node gauge for a pool, zeroing states with no node.
    pub fn set_nodes(&self, pool: &str, counts: &[(NodeState, i64)]) {
        let _whole = self.whole();
        for s in ALL_STATES {
            let n = counts.iter().filter(|(st, _)| *st == s).map(|(_, n)| *n).sum();
            self.nodes
                .get_or_create(&NodeLabels { migration: pool.to_string(), state: state_label(s) })
                .set(n);
        }
    }

    pub fn set_gpus(&self, pool: &str, gpus: GpusByBackend) {
        let _whole = self.whole();
        for (backend, n) in BACKEND_LABELS.into_iter().zip(by_label(gpus)) {
            self.pool_gpus.get_or_create(&GpuLabels { migration: pool.to_string(), backend }).set(n);
        }
    }

    /// Sets where [`Metrics::refresh_cluster`] reads the cluster's GPUs: the controller's caches,
    /// once this replica leads.
    pub fn set_cluster_source(&self, source: ClusterGpusSource) {
        if let Ok(mut s) = self.cluster_source.lock() {
            *s = Some(source);
        }
    }

    /// Recomputes `switchyard_cluster_gpus` from its source, at a scrape. No source, or caches
    /// not synced yet: no series, rather than zeros that read as GPUs lost.
    pub fn refresh_cluster(&self) {
        let Ok(source) = self.cluster_source.lock() else { return };
        let gpus = source.as_ref().and_then(|f| f());
        let _whole = self.whole();
        match gpus {
            Some(gpus) => {
                for (backend, n) in BACKEND_LABELS.into_iter().zip(by_label(gpus)) {
                    self.cluster_gpus.get_or_create(&BackendLabels { backend }).set(n);
                }
            }
            None => self.cluster_gpus.clear(),
        }
    }

    /// Drops a deleted pool's series.
    pub fn forget_pool(&self, pool: &str) {
        let _whole = self.whole();
        for s in ALL_STATES {
            self.nodes.remove(&NodeLabels { migration: pool.to_string(), state: state_label(s) });
        }
        for backend in BACKEND_LABELS {
            self.pool_gpus.remove(&GpuLabels { migration: pool.to_string(), backend });
        }
        self.backend_overlap_nodes.remove(&MigrationLabels { migration: pool.to_string() });
        self.drain_duration.remove(&MigrationLabels { migration: pool.to_string() });
        self.set_stalled(pool, None);
    }

    /// Records the allocator's heap in use, read by the process at each scrape (the allocator is
    /// the process's, not this module's).
    pub fn set_heap_in_use(&self, bytes: u64) {
        self.heap_in_use.set(i64::try_from(bytes).unwrap_or(i64::MAX));
    }

    /// The lock of [`Metrics::whole`]; a writer that panicked left no half-written gauge worth
    /// refusing a scrape for, so a poisoned lock is taken all the same.
    fn whole(&self) -> std::sync::MutexGuard<'_, ()> {
        self.whole.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The OpenMetrics text for `/metrics`.
    pub fn encode(&self) -> String {
        let _whole = self.whole();
        let mut out = String::new();
        if prometheus_client::encoding::text::encode(&mut out, &self.registry).is_err() {
            out.clear();
        }
        out
    }
}

/// `gpus` in the order of [`BACKEND_LABELS`].
fn by_label(gpus: GpusByBackend) -> [i64; 3] {
    [gpus.device_plugin, gpus.dra, gpus.none].map(|n| i64::try_from(n).unwrap_or(i64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_units_and_labels() {
        let m = Metrics::new();
        m.reconciliations.inc();
        m.reconcile_errors.get_or_create(&ErrorLabels { category: "EvictPod" }).inc();
        m.reconcile_duration.observe(0.2);
        m.set_nodes("pool-a", &[(NodeState::Migrated, 3), (NodeState::Draining, 1)]);
        m.set_gpus("pool-a", GpusByBackend { device_plugin: 16, dra: 24, none: 4 });
        m.refresh_cluster();
        assert!(!m.encode().contains("switchyard_cluster_gpus{"), "no source, no series");
        m.set_cluster_source(Box::new(|| Some(GpusByBackend { device_plugin: 2, dra: 40, none: 0 })));
        m.refresh_cluster();
        m.evictions.get_or_create(&EvictionLabels { result: "blocked" }).inc();
        m.backend_overlap_nodes.get_or_create(&MigrationLabels { migration: "pool-a".into() }).set(1);
        m.drain_duration.get_or_create(&MigrationLabels { migration: "pool-a".into() }).observe(42.0);
        m.watch_errors.get_or_create(&WatchLabels { kind: "Node" }).inc();
        m.leader.set(1);
        m.set_stalled("pool-a", Some("NodeFailed"));
        let text = m.encode();
        for want in [
            "switchyard_reconciliations_total 1",
            "switchyard_reconcile_errors_total{category=\"EvictPod\"} 1",
            "# UNIT switchyard_reconcile_duration_seconds seconds",
            "switchyard_reconcile_duration_seconds_count 1",
            "switchyard_nodes{migration=\"pool-a\",state=\"Migrated\"} 3",
            "switchyard_nodes{migration=\"pool-a\",state=\"Pending\"} 0",
            "switchyard_pool_gpus{migration=\"pool-a\",backend=\"device-plugin\"} 16",
            "switchyard_pool_gpus{migration=\"pool-a\",backend=\"dra\"} 24",
            "switchyard_pool_gpus{migration=\"pool-a\",backend=\"none\"} 4",
            "switchyard_cluster_gpus{backend=\"dra\"} 40",
            "switchyard_cluster_gpus{backend=\"none\"} 0",
            "switchyard_evictions_total{result=\"blocked\"} 1",
            "switchyard_backend_overlap_nodes{migration=\"pool-a\"} 1",
            "# UNIT switchyard_drain_duration_seconds seconds",
            "switchyard_drain_duration_seconds_bucket{le=\"64.0\",migration=\"pool-a\"} 1",
            "switchyard_watch_errors_total{kind=\"Node\"} 1",
            "switchyard_leader 1",
            "switchyard_migration_stalled{migration=\"pool-a\",reason=\"NodeFailed\"} 1",
        ] {
            assert!(text.contains(want), "missing {want:?} in\n{text}");
        }
        assert!(!text.contains("_total_total"));
        m.forget_pool("pool-a");
        let text = m.encode();
        assert!(!text.contains("pool-a"));
        assert!(
            text.contains("switchyard_cluster_gpus{backend=\"dra\"} 40"),
            "the cluster's outlive the pool's"
        );
    }

    #[test]
    fn a_scrape_never_reads_half_of_a_pools_gpu_update() {
        let m = std::sync::Arc::new(Metrics::new());
        let figures = [
            GpusByBackend { device_plugin: 16, dra: 0, none: 0 },
            GpusByBackend { device_plugin: 8, dra: 4, none: 4 },
            GpusByBackend { device_plugin: 0, dra: 16, none: 0 },
        ];
        m.set_gpus("pool-a", figures[0]);
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let writer = {
            let (m, stop) = (m.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut writes = 0usize;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    m.set_gpus("pool-a", figures[writes % figures.len()]);
                    writes += 1;
                }
                writes
            })
        };
        let mut sums = std::collections::BTreeSet::new();
        for _ in 0..2_000 {
            let text = m.encode();
            let sum: i64 = text
                .lines()
                .filter(|l| l.starts_with("switchyard_pool_gpus{migration=\"pool-a\""))
                .map(|l| l.rsplit(' ').next().unwrap().parse::<i64>().unwrap())
                .sum();
            sums.insert(sum);
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let writes = writer.join().unwrap();
        assert!(writes > figures.len(), "the writer ran alongside the scrapes: {writes} writes");
        assert_eq!(sums, [16].into(), "every scrape read one whole update");
    }

    #[test]
    fn a_stall_keeps_one_series_per_pool_with_the_current_reason() {
        let m = Metrics::new();
        let series = |m: &Metrics| {
            m.encode()
                .lines()
                .filter(|l| l.starts_with("switchyard_migration_stalled{"))
                .map(str::to_owned)
                .collect::<Vec<_>>()
        };
        m.set_stalled("a", Some("PrerequisitesNotMet"));
        m.set_stalled("b", Some("NodeFailed"));
        m.set_stalled("a", Some("DeviceClassShadowed"));
        let mut got = series(&m);
        got.sort();
        assert_eq!(
            got,
            [
                "switchyard_migration_stalled{migration=\"a\",reason=\"DeviceClassShadowed\"} 1",
                "switchyard_migration_stalled{migration=\"b\",reason=\"NodeFailed\"} 1",
            ]
        );
        m.set_stalled("a", None);
        assert_eq!(series(&m), ["switchyard_migration_stalled{migration=\"b\",reason=\"NodeFailed\"} 1"]);
    }
}
