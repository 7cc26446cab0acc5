//! The DRAPlugin service: prepare a claim (read its allocation, check it is ours and on this
//! node, map its devices to the inventory, write its CDI spec, checkpoint it) and unprepare it.
//!
//! Both operations are idempotent and answer per claim: one bad claim in a batch does not fail
//! the others. A claim found in the checkpoint is answered from there, so the answer survives
//! agent restarts and does not change with the API or the inventory.
//!
//! A device published shareable (`--shares-per-device`) is prepared for every claim the
//! scheduler allocated it to: each such allocation carries a share id. One that does not, while
//! another claim has the device prepared, is refused until that claim is unprepared (see
//! [`conflicts`]); the kubelet retries.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures::FutureExt;
use futures::future::BoxFuture;
use k8s_openapi::api::resource::v1::ResourceClaim;
use tokio::sync::{Mutex, watch};
use tonic::{Request, Response, Status};

use super::checkpoint::{Checkpoint, CheckpointFile, PreparedClaim, PreparedDevice};
use super::pb::dra as pb;
use crate::cdi;
use crate::discovery::{Discovery, NamedDevice, NodeGpus};
use crate::error::Error;
use crate::metrics::{ClaimOpLabels, Metrics};

/// Where prepare reads ResourceClaims: the API in production, a map in tests.
pub trait ClaimSource: Send + Sync {
    /// The claim, or `None` when it does not exist.
    fn get<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<ResourceClaim>, kube::Error>>;
}

impl ClaimSource for kube::Client {
    fn get<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<ResourceClaim>, kube::Error>> {
        let api: kube::Api<ResourceClaim> = kube::Api::namespaced(self.clone(), namespace);
        async move { api.get_opt(name).await }.boxed()
    }
}

/// A device of ours in a claim's allocation, with every request it was allocated for under one
/// share id.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Allocated {
    pub request_names: Vec<String>,
    pub device: String,
    /// The allocation's `shareID`: set where the device allows multiple allocations (it is
    /// shared), one per allocation of it.
    pub share_id: Option<String>,
    /// The allocation's `adminAccess`: access to a device whatever else holds it (monitoring),
    /// which never makes the device busy nor waits for it.
    pub admin_access: bool,
}

/// Pure: the devices `driver` must prepare on node `node` for `claim`, in allocation order, one
/// per (device, share id). Results of other drivers are left to them; a result of ours from
/// another pool means the claim was sent to the wrong node. Err carries the reason for the
/// kubelet.
pub fn allocated_devices(driver: &str, node: &str, claim: &ResourceClaim) -> Result<Vec<Allocated>, String> {
    let results = claim
        .status
        .as_ref()
        .and_then(|s| s.allocation.as_ref())
        .ok_or_else(|| "is not allocated".to_string())?
        .devices
        .as_ref()
        .and_then(|d| d.results.as_deref())
        .unwrap_or_default();
    let mut out: Vec<Allocated> = Vec::new();
    for r in results.iter().filter(|r| r.driver == driver) {
        if r.pool != node {
            return Err(format!(
                "device {} is allocated from pool {:?}, but this node's pool is {node:?}",
                r.device, r.pool
            ));
        }
        match out.iter_mut().find(|a| a.device == r.device && a.share_id == r.share_id) {
            Some(a) => {
                a.request_names.push(r.request.clone());
                a.admin_access |= r.admin_access == Some(true);
            }
            None => out.push(Allocated {
                request_names: vec![r.request.clone()],
                device: r.device.clone(),
                share_id: r.share_id.clone(),
                admin_access: r.admin_access == Some(true),
            }),
        }
    }
    if out.is_empty() {
        let mut others: Vec<&str> = results.iter().map(|r| r.driver.as_str()).collect();
        others.dedup();
        return Err(format!("has no devices of driver {driver} (allocated drivers: {others:?})"));
    }
    Ok(out)
}

/// Pure: Err when a device of `allocated` (claim `uid`'s devices) is prepared in `state` for
/// another claim and the two may not share it. A device may be prepared for several claims only
/// when it is shared: both allocations carry a share id. An allocation with admin access neither
/// waits for a device nor keeps one busy. Err carries the reason for the kubelet, which retries.
pub fn conflicts(state: &Checkpoint, uid: &str, allocated: &[Allocated]) -> Result<(), String> {
    for a in allocated.iter().filter(|a| !a.admin_access) {
        let holders = state.claims.iter().filter(|(other, _)| *other != uid);
        for (_, claim) in holders {
            let exclusive = claim
                .devices
                .iter()
                .filter(|p| p.device_name == a.device && !p.admin_access)
                .any(|p| p.share_id.is_none() || a.share_id.is_none());
            if exclusive {
                return Err(format!(
                    "device {} is prepared for claim {}/{} and is not shared (an allocation without a shareID)",
                    a.device, claim.namespace, claim.name
                ));
            }
        }
    }
    Ok(())
}

/// Pure: the inventory device behind each allocated name, each device once (a shared device may
/// be allocated to one claim more than once), in allocation order.
pub fn resolve<'a>(
    inv: &'a NodeGpus,
    allocated: &[Allocated],
) -> Result<Vec<(String, NamedDevice<'a>)>, String> {
    let named = inv.named_devices();
    let mut seen = std::collections::BTreeSet::new();
    allocated
        .iter()
        .filter(|a| seen.insert(a.device.as_str()))
        .map(|a| {
            let (n, d) = named
                .iter()
                .find(|(n, _)| *n == a.device)
                .ok_or_else(|| format!("device {} is not on this node (MIG layout changed?)", a.device))?;
            match d {
                NamedDevice::Gpu(g) if g.lost => Err(format!(
                    "device {n} is lost (NVML: GPU is lost); it cannot be prepared until it answers again"
                )),
                _ => Ok((n.clone(), *d)),
            }
        })
        .collect()
}

/// What the DRA service is configured with.
#[derive(Clone, Debug)]
pub struct DraConfig {
    pub driver: String,
    /// This node, which is also our pool name.
    pub node_name: String,
    pub cdi_dir: PathBuf,
    pub checkpoint: PathBuf,
    /// The host directory holding the driver's `dev/` (`--dev-root`), where that is not `/`.
    pub dev_root: Option<String>,
}

/// Prepare and unprepare, shared by the gRPC handlers and the shutdown logic.
pub struct DraService {
    config: DraConfig,
    claims: Arc<dyn ClaimSource>,
    inventory: Arc<dyn Discovery>,
    file: CheckpointFile,
    state: Mutex<Checkpoint>,
    draining: AtomicBool,
    /// Number of prepared claims, for waiting until the node has none.
    prepared: watch::Sender<usize>,
    metrics: Metrics,
}

impl DraService {
    /// Load the checkpoint; a corrupt one stops the agent rather than forgetting prepared claims.
    pub fn new(
        config: DraConfig,
        claims: Arc<dyn ClaimSource>,
        inventory: Arc<dyn Discovery>,
        metrics: Metrics,
    ) -> Result<Self, Error> {
        let file = CheckpointFile::new(&config.checkpoint);
        let cp = file.load()?;
        let n = cp.claims.len();
        metrics.prepared_claims.set(n as i64);
        if n > 0 {
            tracing::info!(claims = n, path = %file.path().display(), "restored prepared claims from the checkpoint");
        }
        Ok(DraService {
            config,
            claims,
            inventory,
            file,
            state: Mutex::new(cp),
            draining: AtomicBool::new(false),
            prepared: watch::Sender::new(n),
            metrics,
        })
    }

    pub fn config(&self) -> &DraConfig {
        &self.config
    }

    fn cdi_err(&self, uid: &str, source: std::io::Error) -> Error {
        let path = self.config.cdi_dir.join(cdi::spec_file_name(&self.config.driver, uid));
        Error::CdiSpec { path: path.display().to_string(), source }
    }

    fn record(&self, op: &str, r: &Result<impl Sized, Error>) {
        let result = match r {
            Ok(_) => "ok",
            Err(e) => e.category(),
        };
        self.metrics
            .claim_operations
            .get_or_create(&ClaimOpLabels { op: op.into(), result: result.into() })
            .inc();
    }

    fn set_prepared(&self, cp: &Checkpoint) {
        self.metrics.prepared_claims.set(cp.claims.len() as i64);
        self.prepared.send_replace(cp.claims.len());
    }

    /// Prepare one claim; the same claim always gets the same answer until it is unprepared.
    pub async fn prepare(&self, claim: &pb::Claim) -> Result<Vec<pb::Device>, Error> {
        let r = self.prepare_inner(claim).await;
        self.record("prepare", &r);
        match &r {
            Ok(d) => {
                tracing::info!(claim = %format!("{}/{}", claim.namespace, claim.name), uid = %claim.uid, devices = d.len(), "prepared claim")
            }
            Err(e) => {
                tracing::warn!(claim = %format!("{}/{}", claim.namespace, claim.name), uid = %claim.uid, error = %e.chain(), "preparing claim failed")
            }
        }
        r
    }

    async fn prepare_inner(&self, claim: &pb::Claim) -> Result<Vec<pb::Device>, Error> {
        let key = format!("{}/{}", claim.namespace, claim.name);
        // One claim operation at a time: prepare and unprepare of one claim must not interleave,
        // and the checkpoint is one file.
        let mut state = self.state.lock().await;
        if let Some(p) = state.claims.get(&claim.uid) {
            // Already prepared: restore the spec if someone removed it, answer as before.
            let path = self.config.cdi_dir.join(cdi::spec_file_name(&self.config.driver, &claim.uid));
            if !path.exists() {
                cdi::write_spec(&self.config.cdi_dir, &self.config.driver, &claim.uid, &p.spec)
                    .map_err(|e| self.cdi_err(&claim.uid, e))?;
            }
            return Ok(p.devices.iter().map(to_pb).collect());
        }
        if self.draining.load(Ordering::Relaxed) {
            return Err(Error::ShuttingDown);
        }
        let rc = self
            .claims
            .get(&claim.namespace, &claim.name)
            .await
            .map_err(|source| Error::GetClaim { claim: key.clone(), source })?
            .filter(|rc| rc.metadata.uid.as_deref() == Some(claim.uid.as_str()))
            .ok_or_else(|| Error::ClaimNotFound { claim: format!("{key} (uid {})", claim.uid) })?;
        let invalid = |reason: String| Error::InvalidClaim { claim: key.clone(), reason };
        let allocated =
            allocated_devices(&self.config.driver, &self.config.node_name, &rc).map_err(invalid)?;
        conflicts(&state, &claim.uid, &allocated).map_err(invalid)?;
        let inv = self.inventory.discover().await?;
        let devices = resolve(&inv, &allocated).map_err(invalid)?;
        // Real device nodes are looked up on the host (under --dev-root where the driver made them
        // there); simulated GPUs have none, so the spec describes each node and the runtime
        // creates it in the container.
        let nodes = match (&self.config.dev_root, self.inventory.host_has_device_nodes()) {
            (_, false) => cdi::DeviceNodes::Described,
            (Some(root), true) => cdi::DeviceNodes::UnderRoot(root.clone()),
            (None, true) => cdi::DeviceNodes::HostLookup,
        };
        let spec = cdi::claim_spec(&self.config.driver, &claim.uid, &devices, &nodes);
        let prepared = PreparedClaim {
            namespace: claim.namespace.clone(),
            name: claim.name.clone(),
            devices: allocated
                .iter()
                .map(|a| PreparedDevice {
                    request_names: a.request_names.clone(),
                    pool_name: self.config.node_name.clone(),
                    device_name: a.device.clone(),
                    cdi_device_ids: vec![cdi::qualified_id(&self.config.driver, &claim.uid, &a.device)],
                    share_id: a.share_id.clone(),
                    admin_access: a.admin_access,
                })
                .collect(),
            spec,
        };
        // Spec first, then the checkpoint: a crash in between leaves a spec that the kubelet's
        // retry overwrites, or that unprepare removes by name.
        cdi::write_spec(&self.config.cdi_dir, &self.config.driver, &claim.uid, &prepared.spec)
            .map_err(|e| self.cdi_err(&claim.uid, e))?;
        let answer = prepared.devices.iter().map(to_pb).collect();
        state.claims.insert(claim.uid.clone(), prepared);
        if let Err(e) = self.file.store(&state) {
            state.claims.remove(&claim.uid);
            let _ = cdi::remove_spec(&self.config.cdi_dir, &self.config.driver, &claim.uid);
            return Err(e);
        }
        self.set_prepared(&state);
        Ok(answer)
    }

    /// Unprepare one claim: remove its spec and forget it. Unknown claims succeed.
    pub async fn unprepare(&self, claim: &pb::Claim) -> Result<(), Error> {
        let r = self.unprepare_inner(claim).await;
        self.record("unprepare", &r);
        match &r {
            Ok(()) => {
                tracing::info!(claim = %format!("{}/{}", claim.namespace, claim.name), uid = %claim.uid, "unprepared claim")
            }
            Err(e) => tracing::warn!(uid = %claim.uid, error = %e.chain(), "unpreparing claim failed"),
        }
        r
    }

    async fn unprepare_inner(&self, claim: &pb::Claim) -> Result<(), Error> {
        let mut state = self.state.lock().await;
        cdi::remove_spec(&self.config.cdi_dir, &self.config.driver, &claim.uid)
            .map_err(|e| self.cdi_err(&claim.uid, e))?;
        if let Some(old) = state.claims.remove(&claim.uid) {
            if let Err(e) = self.file.store(&state) {
                state.claims.insert(claim.uid.clone(), old);
                return Err(e);
            }
            self.set_prepared(&state);
        }
        Ok(())
    }

    /// Claims prepared now, by uid.
    pub async fn prepared_claims(&self) -> Vec<String> {
        self.state.lock().await.claims.keys().cloned().collect()
    }

    /// Refuse new claims from now on (already prepared ones are still answered).
    pub fn start_draining(&self) {
        self.draining.store(true, Ordering::Relaxed);
    }

    /// Wait until no claim is prepared, at most `limit`; true when none is left.
    pub async fn wait_drained(&self, limit: Duration) -> bool {
        let mut rx = self.prepared.subscribe();
        tokio::time::timeout(limit, rx.wait_for(|n| *n == 0)).await.is_ok()
    }
}

fn to_pb(d: &PreparedDevice) -> pb::Device {
    pb::Device {
        request_names: d.request_names.clone(),
        pool_name: d.pool_name.clone(),
        device_name: d.device_name.clone(),
        cdi_device_ids: d.cdi_device_ids.clone(),
        share_id: d.share_id.clone(),
    }
}

/// The gRPC face of [`DraService`].
#[derive(Clone)]
pub struct DraGrpc(pub Arc<DraService>);

#[tonic::async_trait]
impl pb::dra_plugin_server::DraPlugin for DraGrpc {
    async fn node_prepare_resources(
        &self,
        request: Request<pb::NodePrepareResourcesRequest>,
    ) -> Result<Response<pb::NodePrepareResourcesResponse>, Status> {
        let mut claims = HashMap::new();
        for c in request.into_inner().claims {
            let answer = match self.0.prepare(&c).await {
                Ok(devices) => pb::NodePrepareResourceResponse { devices, error: String::new() },
                Err(e) => pb::NodePrepareResourceResponse { devices: Vec::new(), error: e.chain() },
            };
            claims.insert(c.uid, answer);
        }
        Ok(Response::new(pb::NodePrepareResourcesResponse { claims }))
    }

    async fn node_unprepare_resources(
        &self,
        request: Request<pb::NodeUnprepareResourcesRequest>,
    ) -> Result<Response<pb::NodeUnprepareResourcesResponse>, Status> {
        let mut claims = HashMap::new();
        for c in request.into_inner().claims {
            let error = self.0.unprepare(&c).await.err().map(|e| e.chain()).unwrap_or_default();
            claims.insert(c.uid, pb::NodeUnprepareResourceResponse { error });
        }
        Ok(Response::new(pb::NodeUnprepareResourcesResponse { claims }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const DRIVER: &str = "gpu.switchyard.dev";

    fn named_claim(name: &str, uid: &str, results: serde_json::Value) -> ResourceClaim {
        serde_json::from_value(json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": "ns", "uid": uid},
            "spec": {},
            "status": {"allocation": {"devices": {"results": results}}}
        }))
        .unwrap()
    }

    fn claim(results: serde_json::Value) -> ResourceClaim {
        named_claim("c", "u", results)
    }

    fn r(request: &str, driver: &str, pool: &str, device: &str) -> serde_json::Value {
        json!({"request": request, "driver": driver, "pool": pool, "device": device})
    }

    /// A result of ours on node-a, with a share id where `share` is given.
    fn ours(request: &str, device: &str, share: Option<&str>) -> serde_json::Value {
        let mut v = r(request, DRIVER, "node-a", device);
        if let Some(s) = share {
            v["shareID"] = json!(s);
        }
        v
    }

    fn allocated(device: &str, share: Option<&str>) -> Allocated {
        Allocated {
            request_names: vec!["r".into()],
            device: device.into(),
            share_id: share.map(str::to_owned),
            admin_access: false,
        }
    }

    #[test]
    fn allocation_checks() {
        let d = DRIVER;
        let ok = claim(json!([
            r("a", d, "node-a", "gpu-0"),
            r("nic", "nic.example", "node-a", "eth0"),
            r("b", d, "node-a", "gpu-1"),
            r("c", d, "node-a", "gpu-0"),
        ]));
        let whole = |requests: &[&str], device: &str| Allocated {
            request_names: requests.iter().map(|r| r.to_string()).collect(),
            ..allocated(device, None)
        };
        assert_eq!(
            allocated_devices(d, "node-a", &ok).unwrap(),
            [whole(&["a", "c"], "gpu-0"), whole(&["b"], "gpu-1")]
        );
        let cases = [
            (claim(json!([r("a", d, "node-b", "gpu-0")])), "this node's pool"),
            (claim(json!([r("a", "other.example", "node-a", "x")])), "has no devices of driver"),
            (claim(json!([])), "has no devices of driver"),
        ];
        for (c, want) in cases {
            let e = allocated_devices(d, "node-a", &c).unwrap_err();
            assert!(e.contains(want), "{e}");
        }
        let mut unallocated = claim(json!([]));
        unallocated.status = None;
        assert_eq!(allocated_devices(d, "node-a", &unallocated).unwrap_err(), "is not allocated");
    }

    /// A shared device allocated to one claim twice (two requests, two share ids) is two
    /// prepared devices; requests under one share id are one.
    #[test]
    fn allocations_group_by_device_and_share_id() {
        let mut admin = r("watch", DRIVER, "node-a", "gpu-1");
        admin["adminAccess"] = json!(true);
        let c = claim(json!([
            ours("a", "gpu-0", Some("s1")),
            ours("b", "gpu-0", Some("s2")),
            ours("c", "gpu-0", Some("s1")),
            admin,
        ]));
        let got: Vec<(Vec<String>, String, Option<String>, bool)> = allocated_devices(DRIVER, "node-a", &c)
            .unwrap()
            .into_iter()
            .map(|a| (a.request_names, a.device, a.share_id, a.admin_access))
            .collect();
        let row = |requests: &[&str], device: &str, share: Option<&str>, admin: bool| {
            (
                requests.iter().map(|r| r.to_string()).collect(),
                device.to_string(),
                share.map(str::to_owned),
                admin,
            )
        };
        assert_eq!(
            got,
            [
                row(&["a", "c"], "gpu-0", Some("s1"), false),
                row(&["b"], "gpu-0", Some("s2"), false),
                row(&["watch"], "gpu-1", None, true),
            ]
        );
    }

    /// Claims already prepared: `ns/a` on gpu-0 and `ns/m` on gpu-1-mig-1g10gb-0, by share id or
    /// whole, and `ns/watch` with admin access on gpu-1-mig-3g40gb-0.
    fn prepared(a_share: Option<&str>) -> Checkpoint {
        let device = |name: &str, share: Option<&str>, admin_access: bool| PreparedDevice {
            request_names: vec!["r".into()],
            pool_name: "node-a".into(),
            device_name: name.into(),
            cdi_device_ids: vec![],
            share_id: share.map(str::to_owned),
            admin_access,
        };
        let claim = |name: &str, devices| PreparedClaim {
            namespace: "ns".into(),
            name: name.into(),
            devices,
            spec: cdi::claim_spec(DRIVER, name, &[], &cdi::DeviceNodes::Described),
        };
        let mut cp = Checkpoint::default();
        cp.claims.insert("uid-a".into(), claim("a", vec![device("gpu-0", a_share, false)]));
        cp.claims.insert("uid-m".into(), claim("m", vec![device("gpu-1-mig-1g10gb-0", None, false)]));
        cp.claims.insert("uid-w".into(), claim("watch", vec![device("gpu-1-mig-3g40gb-0", None, true)]));
        cp
    }

    /// The share id ns/a was prepared with, the uid of the claim being prepared, its allocation,
    /// and the claim the refusal names (none: prepared).
    type ConflictCase = (Option<&'static str>, &'static str, Vec<Allocated>, Option<&'static str>);

    #[test]
    fn a_device_is_prepared_for_several_claims_only_when_every_allocation_is_shared() {
        let admin = |device: &str| Allocated { admin_access: true, ..allocated(device, None) };
        let cases: Vec<ConflictCase> = vec![
            (Some("s1"), "uid-b", vec![allocated("gpu-0", Some("s2"))], None),
            (Some("s1"), "uid-b", vec![allocated("gpu-0", None)], Some("ns/a")),
            (None, "uid-b", vec![allocated("gpu-0", Some("s2"))], Some("ns/a")),
            (None, "uid-b", vec![allocated("gpu-0", None)], Some("ns/a")),
            (None, "uid-b", vec![allocated("gpu-1-mig-1g10gb-1", None)], None),
            (
                None,
                "uid-b",
                vec![allocated("gpu-1-mig-2g20gb-0", None), allocated("gpu-1-mig-1g10gb-0", None)],
                Some("ns/m"),
            ),
            (None, "uid-a", vec![allocated("gpu-0", None)], None),
            (None, "uid-b", vec![admin("gpu-0")], None),
            (None, "uid-b", vec![allocated("gpu-1-mig-3g40gb-0", None)], None),
        ];
        for (a_share, uid, allocation, want) in cases {
            let got = conflicts(&prepared(a_share), uid, &allocation);
            let case = format!("ns/a shared as {a_share:?}, {uid} allocated {allocation:?}");
            match want {
                None => assert_eq!(got, Ok(()), "{case}"),
                Some(holder) => {
                    let e = got.unwrap_err();
                    let device = &allocation.last().unwrap().device;
                    let want = format!(
                        "device {device} is prepared for claim {holder} and is not shared (an allocation without a shareID)"
                    );
                    assert_eq!(e, want, "{case}");
                }
            }
        }
    }

    #[test]
    fn resolve_finds_gpus_and_mig_devices_by_name() {
        let inv = crate::discovery::simulated::parse(include_str!("../../examples/sim-inventory-mig.yaml"))
            .unwrap();
        let a = |n: &str| allocated(n, None);
        let got = resolve(&inv, &[a("gpu-0"), a("gpu-1-mig-1g10gb-1")]).unwrap();
        assert!(matches!(got[0].1, NamedDevice::Gpu(g) if g.index == 0));
        assert!(matches!(got[1].1, NamedDevice::Mig { mig, .. } if mig.gi == 10));
        assert!(resolve(&inv, &[a("gpu-1")]).unwrap_err().contains("not on this node"), "a GPU in MIG mode");
        assert!(resolve(&inv, &[a("gpu-9")]).is_err());
        let twice = resolve(&inv, &[allocated("gpu-0", Some("s1")), allocated("gpu-0", Some("s2"))]).unwrap();
        assert_eq!(twice.len(), 1, "one CDI device for one GPU, however often the claim has it");
    }

    /// Claims by namespace/name.
    #[derive(Default)]
    struct Claims(std::sync::Mutex<HashMap<String, ResourceClaim>>);

    impl Claims {
        fn add(&self, c: ResourceClaim) {
            let key = format!(
                "{}/{}",
                c.metadata.namespace.as_deref().unwrap(),
                c.metadata.name.as_deref().unwrap()
            );
            self.0.lock().unwrap().insert(key, c);
        }
    }

    impl ClaimSource for Claims {
        fn get<'a>(
            &'a self,
            namespace: &'a str,
            name: &'a str,
        ) -> BoxFuture<'a, Result<Option<ResourceClaim>, kube::Error>> {
            let c = self.0.lock().unwrap().get(&format!("{namespace}/{name}")).cloned();
            async move { Ok(c) }.boxed()
        }
    }

    /// The simulated MIG node (gpu-0 whole, gpu-1 in MIG mode), the same on every discovery.
    struct Inventory(NodeGpus);

    impl Discovery for Inventory {
        fn discover(&self) -> BoxFuture<'_, Result<NodeGpus, Error>> {
            let inv = self.0.clone();
            async move { Ok(inv) }.boxed()
        }
    }

    /// A service over `claims` with its CDI specs and checkpoint in a fresh directory.
    fn service(test: &str, claims: Arc<Claims>) -> (DraService, PathBuf) {
        let dir = std::env::temp_dir().join(format!("sy-dra-{test}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let config = DraConfig {
            driver: DRIVER.into(),
            node_name: "node-a".into(),
            cdi_dir: dir.join("cdi"),
            checkpoint: dir.join("checkpoint.json"),
            dev_root: None,
        };
        let inv = crate::discovery::simulated::parse(include_str!("../../examples/sim-inventory-mig.yaml"))
            .unwrap();
        let svc = DraService::new(config, claims, Arc::new(Inventory(inv)), Metrics::default()).unwrap();
        (svc, dir)
    }

    fn wire(name: &str) -> pb::Claim {
        pb::Claim { namespace: "ns".into(), uid: format!("uid-{name}"), name: name.into() }
    }

    /// Two claims that the scheduler allocated gpu-0 to with share ids both prepare, each with its
    /// own CDI spec that hands the container that GPU; a claim that holds gpu-0 whole waits until
    /// both are unprepared.
    #[tokio::test]
    async fn a_shared_gpu_is_prepared_for_each_claim_and_an_exclusive_one_waits() {
        let claims = Arc::new(Claims::default());
        claims.add(named_claim("a", "uid-a", json!([ours("gpu", "gpu-0", Some("share-a"))])));
        claims.add(named_claim("b", "uid-b", json!([ours("gpu", "gpu-0", Some("share-b"))])));
        claims.add(named_claim("x", "uid-x", json!([ours("gpu", "gpu-0", None)])));
        let (svc, dir) = service("shared", claims);

        for (name, share) in [("a", "share-a"), ("b", "share-b")] {
            let devices = svc.prepare(&wire(name)).await.unwrap();
            assert_eq!(devices.len(), 1);
            assert_eq!(devices[0].device_name, "gpu-0");
            assert_eq!(devices[0].share_id.as_deref(), Some(share));
            assert_eq!(devices[0].cdi_device_ids, [format!("{DRIVER}/gpu=uid-{name}-gpu-0")]);
            let path = svc.config().cdi_dir.join(cdi::spec_file_name(DRIVER, &format!("uid-{name}")));
            let spec: cdi::Spec = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
            let nodes: Vec<&str> =
                spec.devices[0].container_edits.device_nodes.iter().map(|n| n.path.as_str()).collect();
            assert_eq!(nodes, ["/dev/nvidia0"], "{name}");
            assert_eq!(
                spec.container_edits.env,
                ["NVIDIA_VISIBLE_DEVICES=GPU-ee5f6d81-849d-5d95-8688-ce03f2fa8c81"]
            );
        }
        let again = svc.prepare(&wire("a")).await.unwrap();
        assert_eq!(again[0].share_id.as_deref(), Some("share-a"), "answered from the checkpoint");

        for holder in ["a", "b"] {
            let e = svc.prepare(&wire("x")).await.unwrap_err();
            assert!(matches!(e, Error::InvalidClaim { .. }), "{e:?}");
            assert!(
                e.chain()
                    .contains(&format!("device gpu-0 is prepared for claim ns/{holder} and is not shared")),
                "{}",
                e.chain()
            );
            svc.unprepare(&wire(holder)).await.unwrap();
        }
        let devices = svc.prepare(&wire("x")).await.unwrap();
        assert_eq!((devices[0].device_name.as_str(), devices[0].share_id.as_deref()), ("gpu-0", None));
        assert_eq!(svc.prepared_claims().await, ["uid-x"]);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
