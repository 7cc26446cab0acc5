//! What every reconcile shares: the client, the caches, the event publisher and metrics, and
//! the memo tables that keep a reconcile from reading the same slow thing again (discovery, the
//! capacity-reader audit, the candidates' pod counts), with how long each is reused.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kube::Client;
use kube::runtime::reflector::Store;

use crate::api::v1alpha1::GpuPoolMigration;
use crate::cache::Caches;
use crate::pool::prerequisites::ServerFacts;
use crate::pool::readers::Finding;
use crate::report::metrics::Metrics;
use crate::well_known::*;

/// Requeue while nodes move: short, because allocatable and slices change without a label event.
pub(crate) const REQUEUE_ACTIVE: Duration = Duration::from_secs(10);
/// Requeue when idle: a safety net; watches trigger real work.
pub(crate) const REQUEUE_IDLE: Duration = Duration::from_secs(300);
/// When a node's step failed: sooner than the backoff of a failed reconcile, since only that
/// node waits.
pub(crate) const REQUEUE_ERROR: Duration = Duration::from_secs(5);
/// How long discovery results are reused: versions and served kinds change only on upgrades.
pub(crate) const FACTS_TTL: Duration = Duration::from_secs(300);
/// How long an inventory is reused: it LISTs quotas, LimitRanges, HPAs and Deployments
/// cluster-wide, too much for every reconcile. A spec change refreshes it at once.
pub(crate) const INVENTORY_TTL: Duration = Duration::from_secs(300);
/// How long a check of the GPU pods on migrated nodes is reused (`status.pods`). A check reads the
/// GPU-pod cache, and the claims of the pods not verified before: at most every TTL, their GETs
/// come in batches and the status does not change on every reconcile. A new spec, or the pool's
/// last node migrating, checks again at once.
pub(crate) const POD_VERIFY_TTL: Duration = Duration::from_secs(30);

/// How long the device plugin's config (a ConfigMap) is reused: it matters only before a pool
/// starts, where GPU Feature Discovery does not label its nodes, and an edit to it shows within
/// this long.
pub(crate) const PLUGIN_CONFIG_TTL: Duration = Duration::from_secs(30);

/// A device-plugin ConfigMap's data as last read (`Err`: why it could not be).
pub(crate) type CachedConfigMap = (Instant, Result<std::collections::BTreeMap<String, String>, String>);

/// The last check of a migration's GPU pods on migrated nodes.
#[derive(Clone, Debug, Default)]
pub(crate) struct PodCheck {
    pub(crate) at: Option<Instant>,
    pub(crate) generation: Option<i64>,
    /// How many migrated nodes it covered.
    pub(crate) migrated: usize,
    pub(crate) result: crate::api::v1alpha1::PodVerification,
    /// The pods found verified, by uid: a verified pod's claim does not change, so it is not
    /// read again.
    pub(crate) verified: HashSet<String>,
    /// The result differed from the check before, or a GPU pod bound to a checked node had not
    /// started yet: the reconcile comes back at the TTL until it holds still (pods evicted from
    /// the last nodes land, and start, a while after the migration ends, and a pod's start
    /// triggers no reconcile).
    pub(crate) settling: bool,
}

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
    pub events: crate::report::events::Publisher,
    pub metrics: Arc<Metrics>,
    pub config: Config,
    /// The controller's GpuPoolMigration cache, to find nodes selected by two migrations.
    pub migrations: Store<GpuPoolMigration>,
    /// Nodes, DaemonSets, DeviceClasses and ResourceSlices, fed by the controller's watches: a
    /// reconcile reads these instead of the API (see `cache` for how fresh they are).
    pub caches: Caches,
    pub(crate) facts: Mutex<Option<(Instant, ServerFacts)>>,
    /// Consecutive failed reconciles per migration, for the error policy's backoff.
    pub(crate) failures: Mutex<HashMap<String, u32>>,
    /// The last inventory per migration: when, for which generation, and its findings.
    pub(crate) inventory: Mutex<HashMap<String, CachedInventory>>,
    /// When each migration's status was last written (see `execute::STATUS_COALESCE`).
    pub(crate) status_writes: Mutex<HashMap<String, Instant>>,
    /// The last check of each migration's GPU pods on migrated nodes (see [`POD_VERIFY_TTL`]).
    pub(crate) pod_checks: Mutex<HashMap<String, PodCheck>>,
    /// The device plugins' config ConfigMaps, by `namespace/name` (see [`PLUGIN_CONFIG_TTL`]).
    pub(crate) plugin_configs: Mutex<HashMap<String, CachedConfigMap>>,
    /// The pages the last LIST of every ResourceClaim took; 0 before the first (see
    /// `observe::claims_of`).
    pub(crate) claim_pages: std::sync::atomic::AtomicUsize,
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
            status_writes: Mutex::new(HashMap::new()),
            pod_checks: Mutex::new(HashMap::new()),
            plugin_configs: Mutex::new(HashMap::new()),
            claim_pages: std::sync::atomic::AtomicUsize::new(0),
        }
    }
}
