//! Prepare and unprepare latency of the DRA kubelet plugin, for `docs/benchmarks.md` (`make bench`).
//!
//! Starts the real plugin servers ([`plugin::start`]) on Unix sockets in a fresh directory, with a
//! simulated inventory, and plays the kubelet: one NodePrepareResources call per claim, each claim
//! allocated one device of this node, then the same claims prepared again (answered from the
//! checkpoint), then one NodeUnprepareResources call per claim. Each gRPC round trip is timed on
//! the client side, calls one at a time.
//!
//! The claims are served from memory, not from an API server: the figures exclude the
//! `GET resourceclaims` that a real prepare makes (once per new claim). Everything else is what
//! the agent does: the inventory file is read on each new claim, the CDI spec and the checkpoint
//! are written with fsync, and the log lines are formatted (to a sink) at the agent's default
//! level.
//!
//! ```sh
//! cargo run --release -p switchyard-driver-agent --example bench-prepare -- --claims 100
//! ```

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, ensure};
use clap::Parser;
use futures::FutureExt;
use futures::future::BoxFuture;
use k8s_openapi::api::resource::v1::ResourceClaim;
use switchyard_driver_agent::discovery::Discovery;
use switchyard_driver_agent::discovery::simulated::SimulatedDiscovery;
use switchyard_driver_agent::metrics::Metrics;
use switchyard_driver_agent::plugin::dra::{ClaimSource, DraService};
use switchyard_driver_agent::plugin::pb::dra::dra_plugin_client::DraPluginClient;
use switchyard_driver_agent::plugin::pb::dra::{
    Claim, NodePrepareResourcesRequest, NodeUnprepareResourcesRequest,
};
use switchyard_driver_agent::plugin::{self, PluginConfig};

const DRIVER: &str = "gpu.switchyard.dev";
const NODE: &str = "bench-node";
const NAMESPACE: &str = "bench";

#[derive(Parser)]
#[command(about = "Time NodePrepareResources / NodeUnprepareResources against the real plugin server")]
struct Args {
    /// Number of claims, each prepared, prepared again and unprepared once.
    #[arg(long, default_value_t = 100)]
    claims: usize,
    /// Simulated inventory; claim i gets device i modulo the number of devices.
    #[arg(long, default_value = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/sim-inventory.yaml"))]
    inventory: PathBuf,
    /// Working directory (kubelet root, CDI specs); fsync costs depend on its file system.
    /// Default: a fresh directory under the system temporary directory, removed at the end.
    #[arg(long)]
    dir: Option<PathBuf>,
}

/// ResourceClaims by `namespace/name`, answered without any API call.
struct MemoryClaims(HashMap<String, ResourceClaim>);

impl ClaimSource for MemoryClaims {
    fn get<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<ResourceClaim>, kube::Error>> {
        let c = self.0.get(&format!("{namespace}/{name}")).cloned();
        async move { Ok(c) }.boxed()
    }
}

/// A claim as the scheduler leaves it: allocated one device of ours from this node's pool.
fn allocated_claim(name: &str, uid: &str, device: &str) -> anyhow::Result<ResourceClaim> {
    Ok(serde_json::from_value(serde_json::json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": NAMESPACE, "uid": uid},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.switchyard.dev"}}]}},
        "status": {"allocation": {"devices": {"results": [
            {"request": "gpu", "driver": DRIVER, "pool": NODE, "device": device}
        ]}}}
    }))?)
}

/// The claims of the run: name, uid and device.
struct BenchClaim {
    wire: Claim,
    device: String,
}

async fn channel(path: PathBuf) -> anyhow::Result<tonic::transport::Channel> {
    let channel = tonic::transport::Endpoint::from_static("http://localhost")
        .connect_with_connector(tower::service_fn(move |_: tonic::transport::Uri| {
            let path = path.clone();
            async move {
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(
                    tokio::net::UnixStream::connect(path).await?,
                ))
            }
        }))
        .await?;
    Ok(channel)
}

/// Nearest-rank percentile of sorted samples.
fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1e3)
}

/// One line of the result table; `wall` is the whole phase, calls back to back.
fn report(what: &str, mut samples: Vec<Duration>, wall: Duration) {
    samples.sort();
    println!(
        "{what:<34} n={:<4} p50 {:>9}  p99 {:>9}  max {:>9}  {:>7.0} claims/s",
        samples.len(),
        ms(percentile(&samples, 50.0)),
        ms(percentile(&samples, 99.0)),
        ms(samples[samples.len() - 1]),
        samples.len() as f64 / wall.as_secs_f64(),
    );
}

fn spec_files(cdi_dir: &Path) -> anyhow::Result<usize> {
    Ok(std::fs::read_dir(cdi_dir)?
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().ends_with(".json"))
        .count())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    ensure!(args.claims > 0, "--claims must be at least 1");
    // The agent logs each prepare and unprepare at info; format them as it does, then drop them.
    tracing_subscriber::fmt().with_env_filter("info").with_writer(std::io::sink).init();

    let owned_dir = args.dir.is_none();
    let dir = args
        .dir
        .unwrap_or_else(|| std::env::temp_dir().join(format!("sy-bench-prepare-{}", std::process::id())));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;

    let inventory = SimulatedDiscovery::load(&args.inventory)
        .await
        .with_context(|| format!("loading {}", args.inventory.display()))?;
    let devices: Vec<String> =
        inventory.discover().await?.named_devices().into_iter().map(|(name, _)| name).collect();
    ensure!(!devices.is_empty(), "{} has no devices", args.inventory.display());

    // Claim 0 warms the connection and the server up and is not counted.
    let claims: Vec<BenchClaim> = (0..=args.claims)
        .map(|i| BenchClaim {
            wire: Claim {
                namespace: NAMESPACE.into(),
                uid: format!("b0000000-0000-4000-8000-{i:012}"),
                name: format!("claim-{i:03}"),
            },
            device: devices[i % devices.len()].clone(),
        })
        .collect();
    let mut source = HashMap::new();
    for c in &claims {
        let rc = allocated_claim(&c.wire.name, &c.wire.uid, &c.device)?;
        source.insert(format!("{NAMESPACE}/{}", c.wire.name), rc);
    }

    let config = PluginConfig {
        driver: DRIVER.into(),
        node_name: NODE.into(),
        kubelet_root: dir.join("kubelet"),
        cdi_dir: dir.join("cdi"),
        drain_timeout: Duration::from_secs(10),
        dev_root: None,
    };
    let service = Arc::new(DraService::new(
        config.dra_config(),
        Arc::new(MemoryClaims(source)),
        Arc::new(inventory),
        Metrics::default(),
    )?);
    let running = plugin::start(config.clone(), service.clone(), Metrics::default())?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(running.run_until(async {
        let _ = stopped.await;
    }));
    let mut dra = DraPluginClient::new(channel(config.dra_socket()).await?);

    let prepare = |c: &BenchClaim| NodePrepareResourcesRequest { claims: vec![c.wire.clone()] };
    let unprepare = |c: &BenchClaim| NodeUnprepareResourcesRequest { claims: vec![c.wire.clone()] };

    let (warm, measured) = claims.split_first().context("no claims")?;
    dra.node_prepare_resources(prepare(warm)).await?;
    dra.node_unprepare_resources(unprepare(warm)).await?;

    let mut answers = Vec::with_capacity(measured.len());
    let mut first = Vec::with_capacity(measured.len());
    let phase = Instant::now();
    for c in measured {
        let t = Instant::now();
        let resp = dra.node_prepare_resources(prepare(c)).await?.into_inner();
        first.push(t.elapsed());
        let answer = resp.claims.get(&c.wire.uid).context("no answer for the claim")?;
        ensure!(answer.error.is_empty(), "prepare {}: {}", c.wire.name, answer.error);
        ensure!(
            answer.devices.len() == 1 && answer.devices[0].device_name == c.device,
            "prepare {}: unexpected devices {:?}",
            c.wire.name,
            answer.devices
        );
        answers.push(answer.clone());
    }
    let first_wall = phase.elapsed();
    let checkpoint_bytes = std::fs::metadata(config.checkpoint_path())?.len();
    let specs = spec_files(&config.cdi_dir)?;
    ensure!(specs == measured.len(), "{specs} CDI specs for {} prepared claims", measured.len());

    let mut again = Vec::with_capacity(measured.len());
    let phase = Instant::now();
    for (c, before) in measured.iter().zip(&answers) {
        let t = Instant::now();
        let resp = dra.node_prepare_resources(prepare(c)).await?.into_inner();
        again.push(t.elapsed());
        ensure!(
            resp.claims.get(&c.wire.uid) == Some(before),
            "prepare {} again changed its answer",
            c.wire.name
        );
    }
    let again_wall = phase.elapsed();

    let mut gone = Vec::with_capacity(measured.len());
    let phase = Instant::now();
    for c in measured {
        let t = Instant::now();
        let resp = dra.node_unprepare_resources(unprepare(c)).await?.into_inner();
        gone.push(t.elapsed());
        let error =
            resp.claims.get(&c.wire.uid).map(|a| a.error.as_str()).context("no answer for the claim")?;
        ensure!(error.is_empty(), "unprepare {}: {error}", c.wire.name);
    }
    let gone_wall = phase.elapsed();
    ensure!(service.prepared_claims().await.is_empty(), "claims left prepared");
    ensure!(spec_files(&config.cdi_dir)? == 0, "CDI specs left behind");

    drop(dra);
    let _ = stop.send(());
    server.await??;

    println!(
        "DRA kubelet plugin, release build: {} claims, one device each, over {} devices of {}",
        measured.len(),
        devices.len(),
        args.inventory.display()
    );
    println!("  gRPC over a Unix socket in {}; calls one at a time, one claim per call", dir.display());
    println!("  claims served from memory: API-server latency (the GET of each new claim) is excluded");
    report("NodePrepareResources (new claim)", first, first_wall);
    report("NodePrepareResources (again)", again, again_wall);
    report("NodeUnprepareResources", gone, gone_wall);
    println!("  checkpoint with all claims prepared: {checkpoint_bytes} bytes");
    if owned_dir {
        std::fs::remove_dir_all(&dir).with_context(|| format!("removing {}", dir.display()))?;
    }
    Ok(())
}
