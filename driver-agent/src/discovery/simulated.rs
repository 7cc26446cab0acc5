//! Simulated GPUs from a YAML file, with fault injection over a loopback HTTP endpoint. Used by the
//! demo, the e2e tests and `--dry-run` on machines without GPUs.
//!
//! # File format
//!
//! The file is a [`NodeGpus`] in YAML (camelCase keys; unknown keys are rejected):
//!
//! ```yaml
//! driverVersion: "570.124.06"      # becomes the semver attribute driverVersion (570.124.6)
//! cudaDriverVersion: "12.8"        # becomes cudaDriverVersion (12.8.0)
//! gpus:
//!   - index: 0                     # device name gpu-0; indexes must be unique
//!     minor: 0                     # /dev/nvidia0
//!     uuid: GPU-5a1c...            # unique
//!     productName: NVIDIA H100 80GB HBM3
//!     brand: Nvidia                # optional
//!     architecture: Hopper         # optional
//!     cudaComputeCapability: "9.0" # optional, major.minor
//!     memoryBytes: 85899345920
//!     pciBusID: "0000:18:00.0"     # optional
//!     pcieRoot: pci0000:15         # optional
//!     numaNode: 0                  # optional
//!     migEnabled: true             # optional; defaults to "mig is not empty"
//!     mig:                         # optional; configured MIG devices
//!       - uuid: MIG-0c1d...
//!         profile: 1g.10gb         # published as gpu-0-mig-1g10gb-<n>
//!         memoryBytes: 10334765056
//!         multiprocessors: 16
//!         gi: 9                    # GPU instance id
//!         ci: 0                    # compute instance id
//!         giCapMinor: 84           # optional nvidia-cap minors
//!         ciCapMinor: 85
//! ```
//!
//! The file is read again on every discovery, so editing it changes the published devices (e.g. a
//! new MIG layout) without a restart. See `examples/sim-inventory.yaml` and
//! `examples/sim-inventory-mig.yaml`.
//!
//! # Fault injection
//!
//! With `--fault-listen 127.0.0.1:PORT`, `POST /faults` takes a JSON body naming a device and a
//! fault: `{"device":"gpu-3","kind":"xid","xid":79}`, `{"device":"gpu-3","kind":"ecc-dbe"}`,
//! `{"device":"gpu-3","kind":"gpu-lost"}` or `{"device":"gpu-3","kind":"recover"}`. The device is
//! a GPU name (`gpu-<index>`, which also hits its MIG devices) or a MIG device name. Answers: 202
//! when queued, 400 for a body that does not parse, 404 for an unknown device, 503 when the agent
//! is shutting down.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::post;
use futures::FutureExt;
use futures::future::BoxFuture;
use k8s_openapi::jiff::Timestamp;
use serde::Deserialize;
use tokio::sync::mpsc;

use super::{Discovery, EventSource, NodeGpus};
use crate::error::Error;
use crate::health::{FaultKind, HealthEvent};

/// GPUs read from a YAML file (see the module docs for the format).
#[derive(Debug)]
pub struct SimulatedDiscovery {
    path: PathBuf,
    /// The last inventory read, for validating fault requests.
    last: Mutex<NodeGpus>,
}

impl SimulatedDiscovery {
    /// Load and validate the file once, so that a broken file fails at start-up.
    pub async fn load(path: impl AsRef<Path>) -> Result<Arc<Self>, Error> {
        let path = path.as_ref().to_path_buf();
        let inv = read(&path).await?;
        Ok(Arc::new(SimulatedDiscovery { path, last: Mutex::new(inv) }))
    }

    fn knows(&self, device: &str) -> bool {
        self.last.lock().map(|inv| inv.knows_device(device)).unwrap_or(false)
    }
}

/// Parse and validate simulated-inventory YAML.
pub fn parse(text: &str) -> Result<NodeGpus, Error> {
    let inv: NodeGpus = serde_yaml::from_str(text).map_err(|e| Error::InvalidSimConfig(e.to_string()))?;
    let mut indexes = std::collections::BTreeSet::new();
    let mut uuids = std::collections::BTreeSet::new();
    for g in &inv.gpus {
        if !indexes.insert(g.index) {
            return Err(Error::InvalidSimConfig(format!("GPU index {} appears twice", g.index)));
        }
        for uuid in std::iter::once(&g.uuid).chain(g.mig.iter().map(|m| &m.uuid)) {
            if uuid.is_empty() || !uuids.insert(uuid.clone()) {
                return Err(Error::InvalidSimConfig(format!("uuid {uuid:?} is empty or appears twice")));
            }
        }
        if !g.is_mig_enabled() && !g.mig.is_empty() {
            return Err(Error::InvalidSimConfig(format!(
                "gpu-{} has MIG devices but migEnabled: false",
                g.index
            )));
        }
        for m in &g.mig {
            if super::profile_slug(&m.profile).is_empty() {
                return Err(Error::InvalidSimConfig(format!("MIG device {} has no profile", m.uuid)));
            }
        }
    }
    Ok(inv)
}

async fn read(path: &Path) -> Result<NodeGpus, Error> {
    let text = tokio::fs::read_to_string(path)
        .await
        .map_err(|source| Error::ReadSimConfig { path: path.display().to_string(), source })?;
    parse(&text)
}

impl Discovery for Arc<SimulatedDiscovery> {
    fn discover(&self) -> BoxFuture<'_, Result<NodeGpus, Error>> {
        async move {
            let inv = read(&self.path).await?;
            if let Ok(mut last) = self.last.lock() {
                *last = inv.clone();
            }
            Ok(inv)
        }
        .boxed()
    }

    /// Simulated GPUs have no device nodes on the host; the runtime creates them in the container.
    fn host_has_device_nodes(&self) -> bool {
        false
    }
}

/// Faults arrive over HTTP ([`serve_faults`]), not from the inventory.
impl EventSource for Arc<SimulatedDiscovery> {}

/// Body of `POST /faults`.
#[derive(Debug, Deserialize)]
struct FaultRequest {
    device: String,
    #[serde(flatten)]
    kind: FaultKind,
}

#[derive(Clone)]
struct FaultState {
    inventory: Arc<SimulatedDiscovery>,
    events: mpsc::Sender<HealthEvent>,
}

/// The `POST /faults` router, feeding `events` (the same channel the NVML watcher feeds).
pub fn fault_router(inventory: Arc<SimulatedDiscovery>, events: mpsc::Sender<HealthEvent>) -> Router {
    Router::new().route("/faults", post(post_fault)).with_state(FaultState { inventory, events })
}

async fn post_fault(State(st): State<FaultState>, body: Bytes) -> (StatusCode, String) {
    let req: FaultRequest = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => return (StatusCode::BAD_REQUEST, format!("invalid fault: {e}\n")),
    };
    if !st.inventory.knows(&req.device) {
        return (StatusCode::NOT_FOUND, format!("unknown device {:?}\n", req.device));
    }
    tracing::info!(device = %req.device, kind = ?req.kind, "injected fault");
    let ev = HealthEvent { device: req.device, kind: req.kind, at: Timestamp::now() };
    match st.events.send(ev).await {
        Ok(()) => (StatusCode::ACCEPTED, "queued\n".into()),
        Err(_) => (StatusCode::SERVICE_UNAVAILABLE, "agent is shutting down\n".into()),
    }
}

/// Serve the fault endpoint on a loopback address until `shutdown` resolves. Refuses other
/// addresses: fault injection must never be reachable from the network.
pub async fn serve_faults(
    addr: SocketAddr,
    inventory: Arc<SimulatedDiscovery>,
    events: mpsc::Sender<HealthEvent>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), Error> {
    if !addr.ip().is_loopback() {
        return Err(Error::Config(format!("--fault-listen must be a loopback address, got {addr}")));
    }
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| Error::Serve { addr: addr.to_string(), source })?;
    tracing::info!(%addr, "fault injection endpoint listening");
    axum::serve(listener, fault_router(inventory, events))
        .with_graceful_shutdown(shutdown)
        .await
        .map_err(|source| Error::Serve { addr: addr.to_string(), source })
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXAMPLE: &str = include_str!("../../examples/sim-inventory.yaml");
    const EXAMPLE_MIG: &str = include_str!("../../examples/sim-inventory-mig.yaml");

    #[test]
    fn shipped_examples_parse() {
        let inv = parse(EXAMPLE).unwrap();
        assert_eq!(inv.gpus.len(), 8);
        assert!(inv.gpus.iter().all(|g| !g.is_mig_enabled()));
        let mig = parse(EXAMPLE_MIG).unwrap();
        assert!(mig.gpus.iter().any(|g| g.is_mig_enabled() && !g.mig.is_empty()));
    }

    #[test]
    fn invalid_files_are_rejected_with_a_reason() {
        let gpu = |i: u32, uuid: &str| {
            format!("  - {{index: {i}, minor: {i}, uuid: {uuid}, productName: X, memoryBytes: 1}}\n")
        };
        let head = "driverVersion: '1.0'\ncudaDriverVersion: '12.0'\ngpus:\n";
        for (text, needle) in [
            (format!("{head}{}{}", gpu(0, "A"), gpu(0, "B")), "index 0"),
            (format!("{head}{}{}", gpu(0, "A"), gpu(1, "A")), "\"A\""),
            (
                format!(
                    "{head}  - {{index: 0, minor: 0, uuid: A, productName: X, memoryBytes: 1, colour: red}}\n"
                ),
                "colour",
            ),
            (
                format!(
                    "{head}  - {{index: 0, minor: 0, uuid: A, productName: X, memoryBytes: 1, migEnabled: false, mig: [{{uuid: M, profile: 1g.10gb, memoryBytes: 1, multiprocessors: 1, gi: 1, ci: 0}}]}}\n"
                ),
                "migEnabled",
            ),
        ] {
            let err = parse(&text).unwrap_err().to_string();
            assert!(err.contains(needle), "{err} should mention {needle}");
        }
    }

    async fn post(router: Router, body: &str) -> StatusCode {
        use tower::ServiceExt;
        let req =
            axum::http::Request::post("/faults").body(axum::body::Body::from(body.to_string())).unwrap();
        router.oneshot(req).await.unwrap().status()
    }

    #[tokio::test]
    async fn fault_endpoint_queues_known_devices_and_rejects_the_rest() {
        let dir = std::env::temp_dir().join(format!("sy-sim-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("inv.yaml");
        std::fs::write(&path, EXAMPLE).unwrap();
        let inv = SimulatedDiscovery::load(&path).await.unwrap();
        let (tx, mut rx) = mpsc::channel(8);
        let router = fault_router(inv.clone(), tx);

        assert_eq!(
            post(router.clone(), r#"{"device":"gpu-3","kind":"xid","xid":79}"#).await,
            StatusCode::ACCEPTED
        );
        let ev = rx.recv().await.unwrap();
        assert_eq!((ev.device.as_str(), ev.kind), ("gpu-3", FaultKind::Xid { xid: 79 }));
        assert_eq!(
            post(router.clone(), r#"{"device":"gpu-7","kind":"gpu-lost"}"#).await,
            StatusCode::ACCEPTED
        );
        assert_eq!(rx.recv().await.unwrap().kind, FaultKind::GpuLost);
        assert_eq!(
            post(router.clone(), r#"{"device":"gpu-9","kind":"ecc-dbe"}"#).await,
            StatusCode::NOT_FOUND
        );
        assert_eq!(
            post(router.clone(), r#"{"device":"gpu-1","kind":"melt"}"#).await,
            StatusCode::BAD_REQUEST
        );
        assert_eq!(post(router.clone(), r#"{"kind":"recover"}"#).await, StatusCode::BAD_REQUEST);
        drop(rx);
        assert_eq!(
            post(router, r#"{"device":"gpu-1","kind":"recover"}"#).await,
            StatusCode::SERVICE_UNAVAILABLE
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[tokio::test]
    async fn fault_endpoint_refuses_non_loopback_addresses() {
        let dir = std::env::temp_dir().join(format!("sy-sim2-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("inv.yaml");
        std::fs::write(&path, EXAMPLE).unwrap();
        let inv = SimulatedDiscovery::load(&path).await.unwrap();
        let (tx, _rx) = mpsc::channel(1);
        let err = serve_faults("0.0.0.0:0".parse().unwrap(), inv, tx, async {}).await.unwrap_err();
        assert!(matches!(err, Error::Config(_)), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
