//! The DRA kubelet plugin against a fake API (claims from a map) and the simulated MIG inventory:
//! CDI specs against golden files, idempotence, restart between prepare and unprepare, per-claim
//! errors, and the real gRPC services over Unix sockets.
//!
//! `SWITCHYARD_UPDATE_GOLDEN=1 cargo test -p switchyard-driver-agent --test kubelet_plugin`
//! rewrites the golden files; review the diff.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::FutureExt;
use futures::future::BoxFuture;
use k8s_openapi::api::resource::v1::ResourceClaim;
use switchyard_driver_agent::Error;
use switchyard_driver_agent::discovery::simulated::SimulatedDiscovery;
use switchyard_driver_agent::metrics::Metrics;
use switchyard_driver_agent::plugin::dra::{ClaimSource, DraConfig, DraGrpc, DraService};
use switchyard_driver_agent::plugin::pb::dra::dra_plugin_client::DraPluginClient;
use switchyard_driver_agent::plugin::pb::dra::dra_plugin_server::DraPlugin;
use switchyard_driver_agent::plugin::pb::dra::{
    Claim, NodePrepareResourcesRequest, NodePrepareResourcesResponse, NodeUnprepareResourcesRequest,
};
use switchyard_driver_agent::plugin::pb::registration::registration_client::RegistrationClient;
use switchyard_driver_agent::plugin::pb::registration::{InfoRequest, RegistrationStatus};
use switchyard_driver_agent::plugin::registration::RegistrationState;
use switchyard_driver_agent::plugin::{self, PluginConfig};

const DRIVER: &str = "gpu.switchyard.dev";
const NODE: &str = "node-a";
const GPU_UID: &str = "6f1c2a1e-0000-4000-8000-000000000001";
const MIG_UID: &str = "6f1c2a1e-0000-4000-8000-000000000002";

/// Claims by namespace/name; tests remove them to show the answer no longer needs the API.
#[derive(Clone, Default)]
struct FakeClaims(Arc<Mutex<HashMap<String, ResourceClaim>>>);

impl FakeClaims {
    fn add(&self, c: ResourceClaim) {
        let key =
            format!("{}/{}", c.metadata.namespace.as_deref().unwrap(), c.metadata.name.as_deref().unwrap());
        self.0.lock().unwrap().insert(key, c);
    }
    fn clear(&self) {
        self.0.lock().unwrap().clear();
    }
}

impl ClaimSource for FakeClaims {
    fn get<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<ResourceClaim>, kube::Error>> {
        let c = self.0.lock().unwrap().get(&format!("{namespace}/{name}")).cloned();
        async move { Ok(c) }.boxed()
    }
}

/// A claim allocated `(request, driver, pool, device)`.
fn claim(name: &str, uid: &str, results: &[(&str, &str, &str, &str)]) -> ResourceClaim {
    let results: Vec<_> = results
        .iter()
        .map(|(request, driver, pool, device)| {
            serde_json::json!({"request": request, "driver": driver, "pool": pool, "device": device})
        })
        .collect();
    serde_json::from_value(serde_json::json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "team-a", "uid": uid},
        "spec": {},
        "status": {"allocation": {"devices": {"results": results}}}
    }))
    .unwrap()
}

fn wire(name: &str, uid: &str) -> Claim {
    Claim { namespace: "team-a".into(), uid: uid.into(), name: name.into() }
}

struct Env {
    dir: PathBuf,
    claims: FakeClaims,
    inventory: Arc<SimulatedDiscovery>,
}

impl Env {
    async fn new(test: &str) -> Env {
        let dir = std::env::temp_dir().join(format!("sy-kp-{test}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let inv = dir.join("inventory.yaml");
        std::fs::write(&inv, include_str!("../examples/sim-inventory-mig.yaml")).unwrap();
        let claims = FakeClaims::default();
        claims.add(claim("gpu", GPU_UID, &[("gpu", DRIVER, NODE, "gpu-0")]));
        claims.add(claim(
            "mig",
            MIG_UID,
            &[
                ("small", DRIVER, NODE, "gpu-1-mig-1g10gb-0"),
                ("nic", "nic.example.com", NODE, "eth0"),
                ("large", DRIVER, NODE, "gpu-1-mig-3g40gb-0"),
            ],
        ));
        Env { claims, inventory: SimulatedDiscovery::load(&inv).await.unwrap(), dir }
    }

    fn cdi_dir(&self) -> PathBuf {
        self.dir.join("cdi")
    }

    fn plugin_config(&self) -> PluginConfig {
        PluginConfig {
            driver: DRIVER.into(),
            node_name: NODE.into(),
            kubelet_root: self.dir.join("kubelet"),
            cdi_dir: self.cdi_dir(),
            drain_timeout: Duration::from_secs(10),
            dev_root: None,
        }
    }

    /// A service as a fresh agent process would build it.
    fn service(&self) -> Arc<DraService> {
        let config: DraConfig = self.plugin_config().dra_config();
        Arc::new(
            DraService::new(
                config,
                Arc::new(self.claims.clone()),
                Arc::new(self.inventory.clone()),
                Metrics::default(),
            )
            .unwrap(),
        )
    }

    fn spec_path(&self, uid: &str) -> PathBuf {
        self.cdi_dir().join(format!("gpu-switchyard-dev-{uid}.json"))
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

async fn prepare(svc: &Arc<DraService>, claims: Vec<Claim>) -> NodePrepareResourcesResponse {
    DraGrpc(svc.clone())
        .node_prepare_resources(tonic::Request::new(NodePrepareResourcesRequest { claims }))
        .await
        .unwrap()
        .into_inner()
}

fn assert_golden(actual: &Path, golden: &str) {
    let golden = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden").join(golden);
    let got = std::fs::read_to_string(actual).unwrap();
    if std::env::var_os("SWITCHYARD_UPDATE_GOLDEN").is_some() {
        std::fs::write(&golden, &got).unwrap();
    }
    let want = std::fs::read_to_string(&golden).unwrap_or_default();
    assert_eq!(got, want, "{} differs from {}", actual.display(), golden.display());
}

#[tokio::test]
async fn gpu_and_mig_claims_give_the_golden_cdi_specs() {
    let env = Env::new("golden").await;
    let svc = env.service();
    let resp = prepare(&svc, vec![wire("gpu", GPU_UID), wire("mig", MIG_UID)]).await;

    let gpu = &resp.claims[GPU_UID];
    assert_eq!(gpu.error, "");
    assert_eq!(gpu.devices.len(), 1);
    assert_eq!(gpu.devices[0].request_names, ["gpu"]);
    assert_eq!(gpu.devices[0].pool_name, NODE);
    assert_eq!(gpu.devices[0].device_name, "gpu-0");
    assert_eq!(gpu.devices[0].cdi_device_ids, [format!("gpu.switchyard.dev/gpu={GPU_UID}-gpu-0")]);
    assert_golden(&env.spec_path(GPU_UID), "cdi-gpu-claim.json");

    let mig = &resp.claims[MIG_UID];
    assert_eq!(mig.error, "");
    let names: Vec<_> =
        mig.devices.iter().map(|d| (d.request_names[0].as_str(), d.device_name.as_str())).collect();
    assert_eq!(
        names,
        [("small", "gpu-1-mig-1g10gb-0"), ("large", "gpu-1-mig-3g40gb-0")],
        "the NIC is not ours"
    );
    assert_eq!(
        mig.devices[1].cdi_device_ids,
        [format!("gpu.switchyard.dev/gpu={MIG_UID}-gpu-1-mig-3g40gb-0")]
    );
    assert_golden(&env.spec_path(MIG_UID), "cdi-mig-claim.json");
}

#[tokio::test]
async fn prepare_and_unprepare_are_idempotent() {
    let env = Env::new("idem").await;
    let svc = env.service();
    let first = prepare(&svc, vec![wire("gpu", GPU_UID)]).await;
    let spec = std::fs::read(env.spec_path(GPU_UID)).unwrap();
    // The spec vanishing (an admin cleaning up) is repaired by the next prepare.
    std::fs::remove_file(env.spec_path(GPU_UID)).unwrap();
    let second = prepare(&svc, vec![wire("gpu", GPU_UID)]).await;
    assert_eq!(first, second);
    assert_eq!(std::fs::read(env.spec_path(GPU_UID)).unwrap(), spec);
    assert_eq!(svc.prepared_claims().await, [GPU_UID]);

    for _ in 0..2 {
        svc.unprepare(&wire("gpu", GPU_UID)).await.unwrap();
        assert!(!env.spec_path(GPU_UID).exists());
        assert!(svc.prepared_claims().await.is_empty());
    }
    svc.unprepare(&wire("never-prepared", "uid-x")).await.unwrap();
}

#[tokio::test]
async fn a_restart_between_prepare_and_unprepare_loses_nothing() {
    let env = Env::new("restart").await;
    let before = prepare(&env.service(), vec![wire("gpu", GPU_UID), wire("mig", MIG_UID)]).await;

    // A new agent process; the API no longer has the claims and the MIG layout is gone. The
    // answer comes from the checkpoint, unchanged.
    env.claims.clear();
    let svc = env.service();
    assert_eq!(svc.prepared_claims().await.len(), 2);
    let after = prepare(&svc, vec![wire("gpu", GPU_UID), wire("mig", MIG_UID)]).await;
    assert_eq!(before, after);

    let resp = DraGrpc(svc.clone())
        .node_unprepare_resources(tonic::Request::new(NodeUnprepareResourcesRequest {
            claims: vec![wire("gpu", GPU_UID), wire("mig", MIG_UID)],
        }))
        .await
        .unwrap()
        .into_inner();
    assert!(resp.claims.values().all(|r| r.error.is_empty()), "{resp:?}");
    assert!(!env.spec_path(GPU_UID).exists() && !env.spec_path(MIG_UID).exists());
    assert!(env.service().prepared_claims().await.is_empty(), "the checkpoint is empty on disk too");
}

#[tokio::test]
async fn errors_are_per_claim() {
    let env = Env::new("errors").await;
    env.claims.add(claim("elsewhere", "uid-node", &[("gpu", DRIVER, "node-b", "gpu-0")]));
    env.claims.add(claim("other-driver", "uid-drv", &[("gpu", "other.example.com", NODE, "gpu-0")]));
    env.claims.add(claim("unknown", "uid-dev", &[("gpu", DRIVER, NODE, "gpu-7")]));
    env.claims.add(claim("mig-parent", "uid-mig", &[("gpu", DRIVER, NODE, "gpu-1")]));
    let svc = env.service();
    let resp = prepare(
        &svc,
        vec![
            wire("missing", "uid-missing"),
            wire("gpu", "uid-recreated"),
            wire("elsewhere", "uid-node"),
            wire("other-driver", "uid-drv"),
            wire("unknown", "uid-dev"),
            wire("mig-parent", "uid-mig"),
            wire("gpu", GPU_UID),
        ],
    )
    .await;
    let err = |uid: &str| resp.claims[uid].error.clone();
    for (uid, want) in [
        ("uid-missing", "not found"),
        ("uid-recreated", "not found"),
        ("uid-node", "this node's pool is \"node-a\""),
        ("uid-drv", "has no devices of driver gpu.switchyard.dev"),
        ("uid-dev", "device gpu-7 is not on this node"),
        ("uid-mig", "device gpu-1 is not on this node"),
    ] {
        assert!(err(uid).contains(want), "{uid}: {:?}", err(uid));
        assert!(resp.claims[uid].devices.is_empty());
        assert!(!env.spec_path(uid).exists());
    }
    assert_eq!(err(GPU_UID), "", "one bad claim does not fail the batch");
    assert_eq!(svc.prepared_claims().await, [GPU_UID]);
}

async fn channel(path: PathBuf) -> tonic::transport::Channel {
    tonic::transport::Endpoint::from_static("http://localhost")
        .connect_with_connector(tower::service_fn(move |_: tonic::transport::Uri| {
            let path = path.clone();
            async move {
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(
                    tokio::net::UnixStream::connect(path).await?,
                ))
            }
        }))
        .await
        .unwrap()
}

/// The real servers on real sockets, as the kubelet sees them: registration (including a refusal
/// that leaves the plugin serving), prepare and unprepare, then a shutdown that keeps serving
/// unprepare until the last claim is gone and then removes both sockets.
#[tokio::test]
async fn grpc_over_unix_sockets() {
    let env = Env::new("grpc").await;
    let config = env.plugin_config();
    // Sockets a crashed predecessor left behind.
    for s in [config.registration_socket(), config.dra_socket()] {
        std::fs::create_dir_all(s.parent().unwrap()).unwrap();
        drop(std::os::unix::net::UnixListener::bind(&s).unwrap());
    }
    let running = plugin::start(config.clone(), env.service(), Metrics::default()).unwrap();
    let mut state = running.registration().state();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(running.run_until(async {
        let _ = stopped.await;
    }));

    let mut reg = RegistrationClient::new(channel(config.registration_socket()).await);
    let info = reg.get_info(InfoRequest {}).await.unwrap().into_inner();
    assert_eq!(info.r#type, "DRAPlugin");
    assert_eq!(info.name, DRIVER);
    assert_eq!(info.endpoint, config.dra_socket().display().to_string());
    assert_eq!(info.supported_versions, ["v1.DRAPlugin"]);
    reg.notify_registration_status(RegistrationStatus { plugin_registered: false, error: "no".into() })
        .await
        .unwrap();
    assert_eq!(*state.borrow_and_update(), RegistrationState::Failed("no".into()));
    reg.notify_registration_status(RegistrationStatus { plugin_registered: true, error: String::new() })
        .await
        .unwrap();
    assert_eq!(*state.borrow_and_update(), RegistrationState::Registered);

    let mut dra = DraPluginClient::new(channel(config.dra_socket()).await);
    let resp = dra
        .node_prepare_resources(NodePrepareResourcesRequest { claims: vec![wire("gpu", GPU_UID)] })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        resp.claims[GPU_UID].devices[0].cdi_device_ids,
        [format!("gpu.switchyard.dev/gpu={GPU_UID}-gpu-0")]
    );

    // Shutdown with a prepared claim: new claims are refused, unprepare still works, and the
    // plugin stops right after the last claim goes (well before the 10 s drain timeout).
    let started = std::time::Instant::now();
    stop.send(()).unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!task.is_finished(), "draining while a claim is prepared");
    assert!(config.registration_socket().exists());
    let refused = dra
        .node_prepare_resources(NodePrepareResourcesRequest { claims: vec![wire("mig", MIG_UID)] })
        .await
        .unwrap()
        .into_inner();
    assert!(refused.claims[MIG_UID].error.contains("shutting down"), "{refused:?}");
    let resp = dra
        .node_unprepare_resources(NodeUnprepareResourcesRequest { claims: vec![wire("gpu", GPU_UID)] })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(resp.claims[GPU_UID].error, "");
    tokio::time::timeout(Duration::from_secs(8), task).await.expect("stops once drained").unwrap().unwrap();
    assert!(started.elapsed() < Duration::from_secs(8));
    assert!(!config.registration_socket().exists() && !config.dra_socket().exists());
    assert!(!env.spec_path(GPU_UID).exists());
}

#[tokio::test]
async fn a_corrupt_checkpoint_stops_the_start() {
    let dir = std::env::temp_dir().join(format!("sy-kp-corrupt-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let config = DraConfig {
        driver: DRIVER.into(),
        node_name: NODE.into(),
        cdi_dir: dir.join("cdi"),
        checkpoint: dir.join("checkpoint.json"),
        dev_root: None,
    };
    std::fs::write(&config.checkpoint, "garbage").unwrap();
    let inv =
        SimulatedDiscovery::load(Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/sim-inventory.yaml"))
            .await
            .unwrap();
    let r = DraService::new(config, Arc::new(FakeClaims::default()), Arc::new(inv), Metrics::default());
    assert!(matches!(r, Err(Error::InvalidCheckpoint { .. })));
    std::fs::remove_dir_all(&dir).unwrap();
}
