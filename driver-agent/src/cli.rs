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
use switchyard_operator::well_known;
use tokio::sync::mpsc;

use crate::agent::{Agent, Status};
use crate::error::Error;
use crate::health::{DEFAULT_BENIGN_XIDS, HealthPolicy, HealthState};
use crate::inventory::Inventory;
use crate::inventory::nvml::NvmlInventory;
use crate::inventory::simulated::{self, SimulatedInventory};
use crate::metrics::Metrics;
use crate::publish::{Backoff, Publisher};
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
}

impl Args {
    pub fn policy(&self) -> HealthPolicy {
        HealthPolicy {
            hold: Duration::from_secs(self.health_hold_seconds),
            benign_xids: self.benign_xids.iter().copied().collect(),
        }
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

/// What `--dry-run` prints: one discovery, no health events, generation 1.
pub async fn dry_run(args: &Args) -> Result<String, Error> {
    args.validate()?;
    let inv = match args.inventory {
        InventoryKind::Nvml => NvmlInventory::new(Metrics::default()).discover().await?,
        InventoryKind::Simulated => {
            let path =
                args.sim_config.as_ref().ok_or_else(|| Error::Config("--sim-config missing".into()))?;
            SimulatedInventory::load(path).await?.discover().await?
        }
    };
    let id = PoolIdentity {
        node_name: args.node_name.clone().unwrap_or_else(|| "dry-run-node".into()),
        node_uid: DRY_RUN_NODE_UID.into(),
        driver: args.driver_name.clone(),
    };
    render_yaml(&desired_slices(&id, &inv, &HealthState::default(), None, 1))
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

/// Resolves on SIGTERM or Ctrl-C.
async fn shutdown_signal() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = term => {}
        _ = tokio::signal::ctrl_c() => {}
    }
    tracing::info!("shutdown requested");
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

    let client = kube::Client::try_default().await.map_err(Error::Client)?;
    let uid = tokio::select! {
        uid = node_uid(&client, &node) => uid?,
        _ = shutdown_signal() => return Ok(()),
    };
    let id = PoolIdentity { node_name: node, node_uid: uid, driver: args.driver_name.clone() };
    let publisher = Publisher::new(client, id.clone());
    // Sized for bursts of XIDs from all GPUs at once; senders wait when it is full.
    let (tx, rx) = mpsc::channel(256);
    let policy = args.policy();
    tracing::info!(node = %id.node_name, driver = %id.driver, inventory = ?args.inventory, "starting driver agent");
    match args.inventory {
        InventoryKind::Nvml => {
            let inventory = NvmlInventory::new(metrics.clone());
            Agent { inventory, publisher, id, policy, metrics, status }.run(rx, tx, shutdown_signal()).await
        }
        InventoryKind::Simulated => {
            let path =
                args.sim_config.as_ref().ok_or_else(|| Error::Config("--sim-config missing".into()))?;
            let inventory = SimulatedInventory::load(path).await?;
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
            let r = Agent { inventory, publisher, id, policy, metrics, status }
                .run(rx, tx, shutdown_signal())
                .await;
            let _ = stop_faults.send(());
            r
        }
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
        assert!(a.validate().is_ok());
        let a = parse(&["--node-name", "n1", "--benign-xids", "13,31,999", "--health-hold-seconds", "5"])
            .unwrap();
        assert_eq!(a.policy().benign_xids.into_iter().collect::<Vec<_>>(), [13, 31, 999]);
        assert_eq!(a.policy().hold, Duration::from_secs(5));
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
        ];
        for c in cases {
            let a = parse(c).unwrap();
            assert!(matches!(a.validate(), Err(Error::Config(_))), "{c:?}");
        }
        assert!(parse(&["--inventory", "gpu"]).is_err());
        assert!(
            parse(&["--inventory", "simulated", "--sim-config", "x", "--dry-run"])
                .unwrap()
                .validate()
                .is_ok()
        );
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
