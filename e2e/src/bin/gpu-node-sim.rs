//! Runs the GPU node simulator (see `switchyard_e2e::sim` for exactly what it fakes) against the
//! cluster in KUBECONFIG, for manual experiments with pools larger than the real nodes. (`make
//! demo` runs on the three real nodes, not on it; the e2e scenarios and `make bench` drive the
//! simulator as a library.)

use std::collections::BTreeMap;
use std::time::Duration;

use clap::Parser;
use switchyard_e2e::sim::{DaemonSetKey, GpuLayout, SimConfig, SimNode, Simulator};

#[derive(Parser)]
#[command(about = "Simulated GPU nodes for a real Kubernetes control plane (stands in for the kubelet)")]
struct Args {
    /// Instance name; nodes are labelled sim.switchyard.dev/instance=`<instance>`.
    #[arg(long, default_value = "demo")]
    instance: String,
    /// Node name prefix; nodes are `<prefix>-0` .. `<prefix>-(N-1)`.
    #[arg(long, default_value = "gpu-node")]
    prefix: String,
    /// Number of nodes to create (0: only adopt existing ones).
    #[arg(long, default_value_t = 0)]
    nodes: u32,
    /// Full GPUs per node.
    #[arg(long, default_value_t = 8)]
    gpus: u32,
    /// Labels for created nodes, key=value.
    #[arg(long = "label", value_parser = parse_kv)]
    labels: Vec<(String, String)>,
    /// Device-plugin DaemonSet, namespace/name.
    #[arg(long, value_parser = parse_ds)]
    device_plugin: Option<DaemonSetKey>,
    /// DRA-driver DaemonSet, namespace/name.
    #[arg(long, value_parser = parse_ds)]
    dra_driver: Option<DaemonSetKey>,
    /// Seconds between a plugin pod leaving and its resources disappearing.
    #[arg(long, default_value_t = 1.0)]
    unregister_delay: f64,
    /// Run this `switchyard-driver-agent` binary for DRA nodes (simulated inventory); without
    /// it, a stub publisher writes one ResourceSlice per DRA node.
    #[arg(long)]
    agent_bin: Option<std::path::PathBuf>,
    /// DRA driver name the agents publish.
    #[arg(long, default_value = switchyard_operator::well_known::DEFAULT_DRIVER_NAME)]
    driver_name: String,
    /// Where agent inventories and logs go.
    #[arg(long, default_value = "/tmp/switchyard-gpu-node-sim")]
    work_dir: std::path::PathBuf,
}

fn parse_kv(s: &str) -> Result<(String, String), String> {
    s.split_once('=').map(|(k, v)| (k.to_owned(), v.to_owned())).ok_or_else(|| format!("{s}: want key=value"))
}

fn parse_ds(s: &str) -> Result<DaemonSetKey, String> {
    s.split_once('/')
        .map(|(ns, n)| DaemonSetKey { namespace: ns.to_owned(), name: n.to_owned() })
        .ok_or_else(|| format!("{s}: want namespace/name"))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt().with_env_filter(tracing_subscriber::EnvFilter::from_default_env()).init();
    let args = Args::parse();
    let client = kube::Client::try_default().await?;
    let mut config = SimConfig::new(args.instance);
    config.device_plugin = args.device_plugin;
    config.dra_driver = args.dra_driver;
    config.unregister_delay = Duration::from_secs_f64(args.unregister_delay);
    config.driver_name = args.driver_name;
    if let Some(bin) = args.agent_bin {
        let kubeconfig = std::env::var_os("KUBECONFIG")
            .map(std::path::PathBuf::from)
            .ok_or_else(|| anyhow::anyhow!("--agent-bin needs KUBECONFIG for the agents"))?;
        config.agent = Some(switchyard_e2e::sim::AgentSettings {
            bin,
            kubeconfig,
            work_dir: args.work_dir,
            health_hold_seconds: 30,
            device_plugin_interlock: true,
            renamed_gpu_resource: None,
        });
    }
    let sim = Simulator::start(client, config).await?;
    let labels: BTreeMap<String, String> = args.labels.into_iter().collect();
    for i in 0..args.nodes {
        let name = format!("{}-{i}", args.prefix);
        let spec = SimNode { name: name.clone(), labels: labels.clone(), layout: GpuLayout::gpus(args.gpus) };
        match sim.add_node(spec).await {
            Ok(_) => eprintln!("gpu-node-sim: node {name} ready with {} GPUs", args.gpus),
            Err(e) if e.to_string().contains("AlreadyExists") => eprintln!("gpu-node-sim: adopted {name}"),
            Err(e) => return Err(e),
        }
    }
    // SIGINT or SIGTERM: stop the agents and delete the simulated nodes, so no agent process
    // outlives the simulator that started it.
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        r = tokio::signal::ctrl_c() => r?,
        _ = term.recv() => {}
    }
    eprintln!("gpu-node-sim: stopping agents and deleting the simulated nodes");
    sim.shutdown().await
}
