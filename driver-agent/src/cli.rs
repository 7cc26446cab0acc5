//! Command-line contract and start-up wiring: flags, logging, the HTTP endpoints, dry-run.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::time::Duration;

use axum::Router;
use axum::http::StatusCode;
use axum::routing::get;
use clap::{Parser, ValueEnum};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::ResourceSlice;
use switchyard_api::well_known;
use tokio::sync::{mpsc, watch};

use crate::agent::{Agent, Status};
use crate::cdi;
use crate::coexistence;
use crate::discovery::Discovery;
use crate::discovery::nvml::{Library, NvmlDiscovery};
use crate::discovery::simulated::{self, SimulatedDiscovery};
use crate::error::Error;
use crate::health::{DEFAULT_BENIGN_XIDS, HealthPolicy, HealthState};
use crate::metrics::Metrics;
use crate::node_events::NodeEvents;
use crate::node_watch;
use crate::plugin::registration::RegistrationWatch;
use crate::plugin::{self, PluginConfig, RunningPlugin};
use crate::publish::{Backoff, Publisher, SliceWatch};
use crate::slices::{PoolIdentity, desired_slices};

/// Node uid printed by `--dry-run`, which has no API server to ask.
pub const DRY_RUN_NODE_UID: &str = "00000000-0000-0000-0000-000000000000";

/// Where the GPUs come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum InventoryKind {
    /// The NVIDIA driver, through NVML.
    Nvml,
    /// A YAML file (`--sim-config`), with fault injection (`--fault-listen`).
    Simulated,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// Switchyard driver agent: publishes this node's GPUs as DRA ResourceSlices and taints unhealthy
/// devices.
#[derive(Clone, Debug, Parser)]
#[command(name = "switchyard-driver-agent", version)]
pub struct Args {
    /// Name of the node this agent runs on (the pool name and spec.nodeName of its slices).
    /// Required unless --dry-run.
    #[arg(long, env = "NODE_NAME")]
    pub node_name: Option<String>,
    /// DRA driver name in the slices and the taint-key prefix.
    #[arg(long, default_value = well_known::DEFAULT_DRIVER_NAME)]
    pub driver_name: String,
    /// Where the GPUs come from.
    #[arg(long, value_enum, default_value_t = InventoryKind::Nvml)]
    pub inventory: InventoryKind,
    /// Simulated-inventory YAML (required with --inventory simulated).
    #[arg(long)]
    pub sim_config: Option<PathBuf>,
    /// Loopback address for the fault-injection endpoint (POST /faults); simulated only.
    #[arg(long)]
    pub fault_listen: Option<SocketAddr>,
    /// Address for /metrics, /healthz and /readyz.
    #[arg(long, default_value = "0.0.0.0:8081")]
    pub listen: SocketAddr,
    /// The GPU resources of the device plugin this driver replaces: exact names, or prefixes
    /// ending in `*`. While the node advertises any of them as allocatable, every device is
    /// published with a `<driver>/device-plugin-active` NoSchedule taint, so no node is served
    /// by both backends. Add the names the device plugin's config renames GPUs to (as in the
    /// migration's `spec.devicePlugin.gpuResources`); leave out resources that are not GPUs.
    /// Pass an empty value to turn the interlock off.
    #[arg(long, value_delimiter = ',', default_value = coexistence::DEFAULT_RESOURCES)]
    pub device_plugin_resources: Vec<String>,
    /// How many claims may share each GPU and MIG device this agent publishes, as the device
    /// plugin's time-slicing replicas, except that every claim is a DRA allocation the scheduler
    /// counts: each device is published with `allowMultipleAllocations` and a `shares` capacity of
    /// this many, one per claim (NVIDIA's DRA driver's `--consumable-shares=<N>`). 1 publishes
    /// devices that one claim holds whole. The node label `switchyard.dev/gpu-shares` overrides
    /// it per node.
    #[arg(long, env = "SHARES_PER_DEVICE", default_value_t = 1)]
    pub shares_per_device: u32,
    /// Seconds a device must stay healthy before its health taints are removed.
    #[arg(long, default_value_t = 300)]
    pub health_hold_seconds: u64,
    /// XIDs that only get an informational (effect None) taint; replaces the default list.
    #[arg(long, value_delimiter = ',', default_values_t = DEFAULT_BENIGN_XIDS)]
    pub benign_xids: Vec<u32>,
    /// Discover once, print the ResourceSlices that would be published as YAML, and exit. Needs no
    /// API server; the node uid is a placeholder.
    #[arg(long)]
    pub dry_run: bool,
    /// Log format.
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// Serve the DRA kubelet plugin (registration and DRAPlugin sockets, CDI specs). Default: on
    /// with --inventory nvml, off with --inventory simulated. `--kubelet-plugin=false` turns it off.
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    pub kubelet_plugin: Option<bool>,
    /// The kubelet's root directory; the plugin sockets and checkpoint go under it.
    #[arg(long, default_value = plugin::DEFAULT_KUBELET_ROOT)]
    pub kubelet_root: PathBuf,
    /// Where CDI specs for prepared claims are written (the container runtime's CDI spec dir).
    #[arg(long, default_value = cdi::DEFAULT_CDI_DIR)]
    pub cdi_dir: PathBuf,
    /// The NVML library to load (`--inventory nvml`), for example
    /// `/run/nvidia/driver/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1`. Default: found under
    /// --driver-root, else the loader's search path.
    #[arg(long)]
    pub nvml_library: Option<PathBuf>,
    /// Where the host's NVIDIA driver files are mounted in the container (the host's `/`, or the
    /// GPU Operator's `/run/nvidia/driver`): libnvidia-ml.so.1 is looked for in its library
    /// directories. Not needed when a runtime class (`nvidia`) mounts the library.
    #[arg(long)]
    pub driver_root: Option<PathBuf>,
    /// The host directory whose `dev/` holds the driver's device nodes (`/dev/nvidia0`,
    /// `/dev/nvidiactl`, ...): `/` (the default) where the driver made them in the host's `/dev`,
    /// or a driver container's root such as `/run/nvidia/driver` where it made them there. A host
    /// path, as NVIDIA's device plugin's `--dev-root`: the CDI specs name the nodes under it.
    #[arg(long, default_value = "/")]
    pub dev_root: String,
    /// Seconds shutdown keeps the kubelet plugin serving while claims are still prepared.
    #[arg(long, default_value_t = plugin::DEFAULT_DRAIN_TIMEOUT.as_secs())]
    pub plugin_drain_seconds: u64,
}

impl Args {
    /// Which libnvidia-ml to load, from --nvml-library and --driver-root.
    pub fn library(&self) -> Library {
        Library::resolve(self.nvml_library.as_deref(), self.driver_root.as_deref())
    }

    /// `--dev-root` where it is not the host's `/`: the CDI specs then name device nodes under it.
    pub fn dev_root(&self) -> Option<String> {
        Some(self.dev_root.clone()).filter(|r| !r.trim_end_matches('/').is_empty())
    }

    pub fn policy(&self) -> HealthPolicy {
        HealthPolicy {
            hold: Duration::from_secs(self.health_hold_seconds),
            benign_xids: self.benign_xids.iter().copied().collect(),
        }
    }

    /// Whether the kubelet plugin runs (see `--kubelet-plugin`).
    pub fn kubelet_plugin_enabled(&self) -> bool {
        self.kubelet_plugin.unwrap_or(self.inventory == InventoryKind::Nvml)
    }

    fn validate(&self) -> Result<(), Error> {
        if self.inventory == InventoryKind::Simulated && self.sim_config.is_none() {
            return Err(Error::Config("--inventory simulated needs --sim-config".into()));
        }
        if self.inventory != InventoryKind::Simulated
            && (self.sim_config.is_some() || self.fault_listen.is_some())
        {
            return Err(Error::Config("--sim-config and --fault-listen need --inventory simulated".into()));
        }
        if let Some(a) = self.fault_listen
            && !a.ip().is_loopback()
        {
            return Err(Error::Config(format!("--fault-listen must be a loopback address, got {a}")));
        }
        if self.shares_per_device == 0 {
            return Err(Error::Config(
                "--shares-per-device must be at least 1 (1: each device goes whole to one claim)".into(),
            ));
        }
        if !self.dry_run && self.node_name.as_deref().is_none_or(str::is_empty) {
            return Err(Error::Config("--node-name (or NODE_NAME) is required".into()));
        }
        Ok(())
    }
}

/// Set up tracing; `RUST_LOG` filters (default `info`).
pub fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into());
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder =
        tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_ansi(ansi);
    let _ = match format {
        LogFormat::Json => builder.json().try_init(),
        LogFormat::Text => builder.try_init(),
    };
}

/// Render ResourceSlices as a multi-document YAML stream.
pub fn render_yaml(slices: &[ResourceSlice]) -> Result<String, Error> {
    let mut out = String::new();
    for s in slices {
        out.push_str("---\n");
        out.push_str(&serde_yaml::to_string(s).map_err(Error::Render)?);
    }
    Ok(out)
}

/// What `--dry-run` prints: one discovery, no health events, `--shares-per-device` (there is no
/// Node to read the label from), generation 1.
pub async fn dry_run(args: &Args) -> Result<String, Error> {
    args.validate()?;
    let inv = match args.inventory {
        InventoryKind::Nvml => NvmlDiscovery::new(Metrics::default(), args.library()).discover().await?,
        InventoryKind::Simulated => {
            let path =
                args.sim_config.as_ref().ok_or_else(|| Error::Config("--sim-config missing".into()))?;
            SimulatedDiscovery::load(path).await?.discover().await?
        }
    };
    let id = PoolIdentity {
        node_name: args.node_name.clone().unwrap_or_else(|| "dry-run-node".into()),
        node_uid: DRY_RUN_NODE_UID.into(),
        driver: args.driver_name.clone(),
    };
    render_yaml(&desired_slices(&id, &inv, &HealthState::default(), &[], args.shares_per_device, 1))
}

fn http_router(metrics: Metrics, status: Status) -> Router {
    Router::new()
        .route("/metrics", get(move || async move { metrics.encode() }))
        .route("/healthz", get(|| async { "ok" }))
        .route(
            "/readyz",
            get(move || async move {
                if status.ready.load(Ordering::Relaxed) {
                    (StatusCode::OK, "ready")
                } else {
                    (StatusCode::SERVICE_UNAVAILABLE, "not published yet")
                }
            }),
        )
}

/// Whether shutdown was requested, shared by every part of the agent. The flag stays set, so a
/// request made before anyone waits (during start-up) is not lost.
#[derive(Clone, Debug)]
pub struct Shutdown {
    rx: watch::Receiver<bool>,
}

impl Shutdown {
    /// Registers the SIGTERM and SIGINT handlers now, before this returns, and sets the flag on
    /// the first of them. Call once, at process start: a signal that arrives while nothing
    /// listens is then still seen, and the process is never killed by the default action.
    pub fn install() -> Result<Self, Error> {
        use tokio::signal::unix::{SignalKind, signal};
        // Registration only fails when the process cannot install signal handlers at all.
        let register = |kind: SignalKind| {
            signal(kind).map_err(|e| Error::Config(format!("cannot install the signal handlers: {e}")))
        };
        let (mut term, mut int) = (register(SignalKind::terminate())?, register(SignalKind::interrupt())?);
        let (tx, shutdown) = Self::channel();
        tokio::spawn(async move {
            let name = tokio::select! {
                _ = term.recv() => "SIGTERM",
                _ = int.recv() => "SIGINT",
            };
            tracing::info!(signal = name, "shutdown requested");
            let _ = tx.send(true);
        });
        Ok(shutdown)
    }

    /// A flag set through the returned sender, for tests.
    pub fn channel() -> (watch::Sender<bool>, Self) {
        let (tx, rx) = watch::channel(false);
        (tx, Shutdown { rx })
    }

    /// Resolves once shutdown is requested, at once if it already was.
    pub fn wait(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let mut rx = self.rx.clone();
        async move {
            if rx.wait_for(|requested| *requested).await.is_err() {
                // Nobody can request shutdown any more.
                std::future::pending::<()>().await;
            }
        }
    }
}

/// The Node's uid, retried with backoff: the owner reference cannot be written without it.
async fn node_uid(client: &kube::Client, node: &str) -> Result<String, Error> {
    let api: kube::Api<Node> = kube::Api::all(client.clone());
    let mut backoff = Backoff::default();
    loop {
        match api.get(node).await {
            Ok(n) => return n.metadata.uid.ok_or_else(|| Error::Config(format!("node {node} has no uid"))),
            Err(source) => {
                let e = Error::GetNode { node: node.into(), source };
                let d = backoff.next(e.is_transient());
                tracing::warn!(error = %e, retry_in = ?d, "cannot read the Node");
                tokio::time::sleep(d).await;
            }
        }
    }
}

/// Run the agent until SIGTERM.
pub async fn run(args: Args) -> Result<(), Error> {
    args.validate()?;
    let shutdown = Shutdown::install()?;
    let node = args.node_name.clone().unwrap_or_default();
    let metrics = Metrics::default();
    let status = Status::default();
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .map_err(|source| Error::Serve { addr: args.listen.to_string(), source })?;
    let router = http_router(metrics.clone(), status.clone());
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, router).await {
            tracing::error!(error = %e, "metrics server stopped");
        }
    });

    // kube's default retry layer is off: it retries 429 up to 15 times with a backoff growing
    // to minutes, which would hold a health taint back; the agent's own backoff retries writes.
    let mut config = kube::Config::infer().await.map_err(|e| Error::Config(format!("kubeconfig: {e}")))?;
    config.default_retry = false;
    config.headers.push((
        http::header::USER_AGENT,
        http::HeaderValue::from_static(concat!("switchyard-driver-agent/", env!("CARGO_PKG_VERSION"))),
    ));
    let client = kube::Client::try_from(config).map_err(Error::Client)?;
    let uid = tokio::select! {
        uid = node_uid(&client, &node) => uid?,
        _ = shutdown.wait() => return Ok(()),
    };
    let id = PoolIdentity { node_name: node, node_uid: uid, driver: args.driver_name.clone() };
    let plugin = match args.kubelet_plugin_enabled() {
        true => Some(start_plugin(&args, &client, &metrics).await?),
        false => None,
    };
    // Follow the kubelet's verdict from before it can have one: the devices wait for it.
    let registration = plugin.as_ref().map(|p| RegistrationWatch::new(p.registration().state()));
    let plugin = plugin.map(|p| tokio::spawn(p.run_until(shutdown.wait())));
    let result = run_agent(&args, client, id, metrics, status, registration, &shutdown).await;
    if let Some(p) = plugin {
        match p.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::error!(error = %e.chain(), "kubelet plugin failed"),
            Err(e) => tracing::error!(error = %e, "kubelet plugin task failed"),
        }
    }
    result
}

/// Bind the kubelet plugin's sockets, with its own inventory reader (it discovers on each new
/// claim, so a MIG layout change is seen at once).
async fn start_plugin(args: &Args, client: &kube::Client, metrics: &Metrics) -> Result<RunningPlugin, Error> {
    let inventory: std::sync::Arc<dyn Discovery> = match args.inventory {
        InventoryKind::Nvml => std::sync::Arc::new(NvmlDiscovery::new(metrics.clone(), args.library())),
        InventoryKind::Simulated => {
            let path =
                args.sim_config.as_ref().ok_or_else(|| Error::Config("--sim-config missing".into()))?;
            std::sync::Arc::new(SimulatedDiscovery::load(path).await?)
        }
    };
    let config = PluginConfig {
        driver: args.driver_name.clone(),
        node_name: args.node_name.clone().unwrap_or_default(),
        kubelet_root: args.kubelet_root.clone(),
        cdi_dir: args.cdi_dir.clone(),
        drain_timeout: Duration::from_secs(args.plugin_drain_seconds),
        dev_root: args.dev_root(),
    };
    let service = plugin::dra::DraService::new(
        config.dra_config(),
        std::sync::Arc::new(client.clone()),
        inventory,
        metrics.clone(),
    )?;
    plugin::start(config, std::sync::Arc::new(service), metrics.clone())
}

/// The publication loop with the configured inventory, until SIGTERM. `registration` follows the
/// kubelet plugin's registration, where one runs.
async fn run_agent(
    args: &Args,
    client: kube::Client,
    id: PoolIdentity,
    metrics: Metrics,
    status: Status,
    registration: Option<RegistrationWatch>,
    shutdown: &Shutdown,
) -> Result<(), Error> {
    let patterns = args.device_plugin_resource_patterns();
    let (coexistence, shares) =
        node_watch::watch(client.clone(), id.node_name.clone(), patterns, args.shares_per_device);
    let slices = SliceWatch::watch(client.clone(), &id);
    let client_for_events = client.clone();
    let publisher = Publisher::new(client, id.clone());
    // Sized for bursts of XIDs from all GPUs at once; senders wait when it is full.
    let (tx, rx) = mpsc::channel(256);
    let policy = args.policy();
    tracing::info!(node = %id.node_name, driver = %id.driver, inventory = ?args.inventory, "starting driver agent");
    match args.inventory {
        InventoryKind::Nvml => {
            let inventory = NvmlDiscovery::new(metrics.clone(), args.library());
            let node_events = Some(NodeEvents::new(client_for_events, &id, inventory.library().describe()));
            Agent {
                inventory,
                publisher,
                id,
                policy,
                metrics,
                status,
                coexistence,
                shares,
                registration,
                slices,
                node_events,
            }
            .run(rx, tx, shutdown.wait())
            .await
        }
        InventoryKind::Simulated => {
            let path =
                args.sim_config.as_ref().ok_or_else(|| Error::Config("--sim-config missing".into()))?;
            let inventory = SimulatedDiscovery::load(path).await?;
            metrics.driver_present.set(1);
            let (stop_faults, faults_stopped) = tokio::sync::oneshot::channel::<()>();
            if let Some(addr) = args.fault_listen {
                let (inv, tx) = (inventory.clone(), tx.clone());
                tokio::spawn(async move {
                    let stopped = async {
                        let _ = faults_stopped.await;
                    };
                    if let Err(e) = simulated::serve_faults(addr, inv, tx, stopped).await {
                        tracing::error!(error = %e, "fault endpoint stopped");
                    }
                });
            }
            let r = Agent {
                inventory,
                publisher,
                id,
                policy,
                metrics,
                status,
                coexistence,
                shares,
                registration,
                slices,
                node_events: None,
            }
            .run(rx, tx, shutdown.wait())
            .await;
            let _ = stop_faults.send(());
            r
        }
    }
}

impl Args {
    /// The device-plugin resources of the interlock; empty (`--device-plugin-resources=`) turns
    /// it off.
    pub fn device_plugin_resource_patterns(&self) -> Vec<String> {
        self.device_plugin_resources
            .iter()
            .map(|p| p.trim())
            .filter(|p| !p.is_empty())
            .map(str::to_owned)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Args, clap::Error> {
        Args::try_parse_from(std::iter::once("switchyard-driver-agent").chain(args.iter().copied()))
    }

    #[test]
    fn defaults_and_flags() {
        let a = parse(&["--node-name", "n1"]).unwrap();
        assert_eq!(a.driver_name, "gpu.switchyard.dev");
        assert_eq!(a.inventory, InventoryKind::Nvml);
        assert_eq!(a.policy().hold, Duration::from_secs(300));
        assert_eq!(a.benign_xids, DEFAULT_BENIGN_XIDS);
        assert_eq!(a.dev_root(), None, "device nodes in the host's /dev");
        assert_eq!(a.shares_per_device, 1, "devices go whole to one claim");
        assert!(a.validate().is_ok());
        assert_eq!(parse(&["--node-name", "n1", "--shares-per-device=4"]).unwrap().shares_per_device, 4);
        for (flag, want) in [("/", None), ("//", None), ("/run/nvidia/driver", Some("/run/nvidia/driver"))] {
            let a = parse(&["--node-name", "n1", "--dev-root", flag]).unwrap();
            assert_eq!(a.dev_root().as_deref(), want, "--dev-root {flag}");
        }
        let a = parse(&["--node-name", "n1", "--benign-xids", "13,31,999", "--health-hold-seconds", "5"])
            .unwrap();
        assert_eq!(a.policy().benign_xids.into_iter().collect::<Vec<_>>(), [13, 31, 999]);
        assert_eq!(a.policy().hold, Duration::from_secs(5));
    }

    #[test]
    fn an_empty_device_plugin_resource_list_turns_the_interlock_off() {
        let on = parse(&["--node-name", "n1"]).unwrap();
        assert_eq!(
            on.device_plugin_resource_patterns(),
            switchyard_api::well_known::DEVICE_PLUGIN_GPU_RESOURCES,
            "the default is the device plugin's GPU names"
        );
        let off = parse(&["--node-name", "n1", "--device-plugin-resources="]).unwrap();
        assert!(off.device_plugin_resource_patterns().is_empty(), "{:?}", off.device_plugin_resources);
        let two =
            parse(&["--node-name", "n1", "--device-plugin-resources", "nvidia.com/gpu, nvidia.com/a100-*"])
                .unwrap();
        assert_eq!(two.device_plugin_resource_patterns(), ["nvidia.com/gpu", "nvidia.com/a100-*"]);
    }

    #[test]
    fn kubelet_plugin_defaults_follow_the_inventory() {
        let sim = ["--node-name", "n1", "--inventory", "simulated", "--sim-config", "x"];
        let a = parse(&["--node-name", "n1"]).unwrap();
        assert!(a.kubelet_plugin_enabled());
        assert_eq!(a.kubelet_root, PathBuf::from("/var/lib/kubelet"));
        assert_eq!(a.cdi_dir, PathBuf::from("/var/run/cdi"));
        assert!(!parse(&sim).unwrap().kubelet_plugin_enabled());
        assert!(parse(&[&sim[..], &["--kubelet-plugin"]].concat()).unwrap().kubelet_plugin_enabled());
        assert!(!parse(&["--node-name", "n1", "--kubelet-plugin=false"]).unwrap().kubelet_plugin_enabled());
    }

    #[test]
    fn inconsistent_flags_are_rejected() {
        let cases: &[&[&str]] = &[
            &["--node-name", "n1", "--inventory", "simulated"],
            &["--node-name", "n1", "--fault-listen", "127.0.0.1:9000"],
            &[
                "--node-name",
                "n1",
                "--inventory",
                "simulated",
                "--sim-config",
                "x",
                "--fault-listen",
                "10.0.0.1:9000",
            ],
            &["--node-name", "", "--inventory", "simulated", "--sim-config", "x"],
            &["--node-name", "n1", "--shares-per-device", "0"],
        ];
        for c in cases {
            let a = parse(c).unwrap();
            assert!(matches!(a.validate(), Err(Error::Config(_))), "{c:?}");
        }
        assert!(parse(&["--inventory", "gpu"]).is_err());
        assert!(parse(&["--node-name", "n1", "--shares-per-device", "-1"]).is_err());
        assert!(
            parse(&["--inventory", "simulated", "--sim-config", "x", "--dry-run"])
                .unwrap()
                .validate()
                .is_ok()
        );
    }

    /// A request made before anyone waits is kept: every waiter, earlier or later, sees it.
    #[tokio::test]
    async fn shutdown_flag_is_kept_for_later_waiters() {
        let (tx, shutdown) = Shutdown::channel();
        let early = tokio::spawn(shutdown.wait());
        let pending = tokio::time::timeout(Duration::from_millis(50), shutdown.wait()).await;
        assert!(pending.is_err(), "nothing requested yet");
        tx.send(true).unwrap();
        drop(tx);
        tokio::time::timeout(Duration::from_secs(5), early).await.expect("the early waiter wakes").unwrap();
        let late = shutdown.clone();
        tokio::time::timeout(Duration::from_secs(5), late.wait())
            .await
            .expect("a later waiter returns at once");
    }

    /// The start-up race: SIGTERM arrives after the handler is installed but while nothing waits
    /// on it (the agent is still looking up its Node). It is still honoured, and the process is
    /// not killed by the default action.
    #[tokio::test]
    async fn sigterm_before_anyone_waits_is_honoured() {
        let shutdown = Shutdown::install().unwrap();
        let status = std::process::Command::new("kill")
            .args(["-TERM", &std::process::id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
        tokio::time::sleep(Duration::from_millis(100)).await;
        tokio::time::timeout(Duration::from_secs(5), shutdown.wait()).await.expect("the signal was kept");
    }

    #[tokio::test]
    async fn health_and_metrics_endpoints() {
        use tower::ServiceExt;
        let metrics = Metrics::default();
        metrics.publishes.inc();
        let status = Status::default();
        let r = http_router(metrics, status.clone());
        let get = |path: &str| axum::http::Request::get(path).body(axum::body::Body::empty()).unwrap();
        assert_eq!(r.clone().oneshot(get("/healthz")).await.unwrap().status(), StatusCode::OK);
        assert_eq!(
            r.clone().oneshot(get("/readyz")).await.unwrap().status(),
            StatusCode::SERVICE_UNAVAILABLE
        );
        status.ready.store(true, Ordering::Relaxed);
        assert_eq!(r.clone().oneshot(get("/readyz")).await.unwrap().status(), StatusCode::OK);
        let resp = r.oneshot(get("/metrics")).await.unwrap();
        let body = axum::body::to_bytes(resp.into_body(), 1 << 20).await.unwrap();
        assert!(String::from_utf8_lossy(&body).contains("switchyard_agent_publishes_total 1"));
    }
}
