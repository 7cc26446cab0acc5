//! The DRAPlugin service: prepare a claim (read its allocation, check it is ours and on this
//! node, map its devices to the inventory, write its CDI spec, checkpoint it) and unprepare it.
//!
//! Both operations are idempotent and answer per claim: one bad claim in a batch does not fail
//! the others. A claim found in the checkpoint is answered from there, so the answer survives
//! agent restarts and does not change with the API or the inventory.

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

/// A device of ours in a claim's allocation, with every request it was allocated for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Allocated {
    pub request_names: Vec<String>,
    pub device: String,
}

/// Pure: the devices `driver` must prepare on node `node` for `claim`, in allocation order.
/// Results of other drivers are left to them; a result of ours from another pool means the claim
/// was sent to the wrong node. Err carries the reason for the kubelet.
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
        match out.iter_mut().find(|a| a.device == r.device) {
            Some(a) => a.request_names.push(r.request.clone()),
            None => out.push(Allocated { request_names: vec![r.request.clone()], device: r.device.clone() }),
        }
    }
    if out.is_empty() {
        let mut others: Vec<&str> = results.iter().map(|r| r.driver.as_str()).collect();
        others.dedup();
        return Err(format!("has no devices of driver {driver} (allocated drivers: {others:?})"));
    }
    Ok(out)
}

/// Pure: the inventory device behind each allocated name.
pub fn resolve<'a>(
    inv: &'a NodeGpus,
    allocated: &[Allocated],
) -> Result<Vec<(String, NamedDevice<'a>)>, String> {
    let named = inv.named_devices();
    allocated
        .iter()
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
        share_id: None,
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

    fn claim(results: serde_json::Value) -> ResourceClaim {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": "c", "namespace": "ns", "uid": "u"},
            "spec": {},
            "status": {"allocation": {"devices": {"results": results}}}
        }))
        .unwrap()
    }

    fn r(request: &str, driver: &str, pool: &str, device: &str) -> serde_json::Value {
        serde_json::json!({"request": request, "driver": driver, "pool": pool, "device": device})
    }

    #[test]
    fn allocation_checks() {
        let d = "gpu.switchyard.dev";
        let ok = claim(serde_json::json!([
            r("a", d, "node-a", "gpu-0"),
            r("nic", "nic.example", "node-a", "eth0"),
            r("b", d, "node-a", "gpu-1"),
            r("c", d, "node-a", "gpu-0"),
        ]));
        assert_eq!(
            allocated_devices(d, "node-a", &ok).unwrap(),
            [
                Allocated { request_names: vec!["a".into(), "c".into()], device: "gpu-0".into() },
                Allocated { request_names: vec!["b".into()], device: "gpu-1".into() },
            ]
        );
        let cases = [
            (claim(serde_json::json!([r("a", d, "node-b", "gpu-0")])), "this node's pool"),
            (claim(serde_json::json!([r("a", "other.example", "node-a", "x")])), "has no devices of driver"),
            (claim(serde_json::json!([])), "has no devices of driver"),
        ];
        for (c, want) in cases {
            let e = allocated_devices(d, "node-a", &c).unwrap_err();
            assert!(e.contains(want), "{e}");
        }
        let mut unallocated = claim(serde_json::json!([]));
        unallocated.status = None;
        assert_eq!(allocated_devices(d, "node-a", &unallocated).unwrap_err(), "is not allocated");
    }

    #[test]
    fn resolve_finds_gpus_and_mig_devices_by_name() {
        let inv = crate::discovery::simulated::parse(include_str!("../../examples/sim-inventory-mig.yaml"))
            .unwrap();
        let a = |n: &str| Allocated { request_names: vec!["r".into()], device: n.into() };
        let got = resolve(&inv, &[a("gpu-0"), a("gpu-1-mig-1g10gb-1")]).unwrap();
        assert!(matches!(got[0].1, NamedDevice::Gpu(g) if g.index == 0));
        assert!(matches!(got[1].1, NamedDevice::Mig { mig, .. } if mig.gi == 10));
        assert!(resolve(&inv, &[a("gpu-1")]).unwrap_err().contains("not on this node"), "a GPU in MIG mode");
        assert!(resolve(&inv, &[a("gpu-9")]).is_err());
    }
}
