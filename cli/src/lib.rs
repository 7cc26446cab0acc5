//! The `switchyard` command-line tool (also installed as the kubectl plugin `kubectl-switchyard`):
//! `plan` shows what a migration would do without changing anything, `inventory` lists what in the
//! cluster still reads GPU capacity the device-plugin way, `status` follows a migration live.
//!
//! Decisions live in the pure modules (`switchyard_operator::pool::preview`, `switchyard_operator::pool::readers`, `switchyard_operator::pool::rollout`, ...);
//! this module gathers from the API, renders and sets the exit code.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};

mod gather;
pub mod inventory;
pub mod plan;
pub mod status;

/// Exit code for "ran, and what it found needs a human": `plan` with a blocker, `inventory` with a
/// critical finding, `status` of a failed migration. Errors (the cluster unreachable, a manifest
/// the API server rejects) exit 1.
pub const EXIT_FINDINGS: u8 = 2;

#[derive(Parser, Debug)]
#[command(
    name = "switchyard",
    version,
    about = "Plan, check and watch GPU pool migrations from the NVIDIA device plugin to DRA",
    long_about = None
)]
pub struct Cli {
    /// Path to the kubeconfig file (default: $KUBECONFIG, then ~/.kube/config, then in-cluster).
    #[arg(long, global = true)]
    pub kubeconfig: Option<PathBuf>,
    /// The kubeconfig context to use.
    #[arg(long, global = true)]
    pub context: Option<String>,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Show what a migration would do, changing nothing: prerequisites, node order and the pods
    /// each node evicts, DeviceClasses, placement and the capacity-reader inventory.
    Plan(PlanArgs),
    /// List what in the cluster reads GPU capacity the device-plugin way (quotas, LimitRanges,
    /// Kueue, autoscalers, HPAs, dashboards, other DeviceClasses), with severity and advice.
    Inventory(InventoryArgs),
    /// Follow a migration live until it ends (Completed, RolledBack or Failed), Ctrl-C or
    /// `--timeout`. Exit code: 0 done, 2 failed, 1 timed out or deleted, 130 interrupted.
    Status(StatusArgs),
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Output {
    /// Text for people.
    #[default]
    Human,
    /// One JSON document, stable field names, for scripts.
    Json,
}

#[derive(clap::Args, Debug)]
pub struct PlanArgs {
    /// Name of an existing GpuPoolMigration.
    #[arg(conflicts_with = "filename", required_unless_present = "filename")]
    pub name: Option<String>,
    /// A GpuPoolMigration manifest to plan before it is applied (`-` reads standard input).
    #[arg(short = 'f', long = "filename")]
    pub filename: Option<PathBuf>,
    /// Output format.
    #[arg(short = 'o', long, value_enum, default_value_t)]
    pub output: Output,
    /// Also read ConfigMaps in every namespace when looking for dashboards and rules that count
    /// GPU capacity from node status (needs list on configmaps cluster-wide).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub scan_config_maps: bool,
}

#[derive(clap::Args, Debug)]
pub struct InventoryArgs {
    /// Extended resource names to look for (default: those of every GpuPoolMigration in the
    /// cluster, or nvidia.com/gpu when there is none).
    #[arg(long = "resource")]
    pub resources: Vec<String>,
    /// The DeviceClass that serves the `--resource` names (its quota keys are checked too).
    #[arg(long, default_value = switchyard_operator::well_known::DEFAULT_DRIVER_NAME)]
    pub device_class: String,
    /// Only this migration's resources, DeviceClasses and pool nodes.
    #[arg(long, conflicts_with = "resources")]
    pub migration: Option<String>,
    /// Output format.
    #[arg(short = 'o', long, value_enum, default_value_t)]
    pub output: Output,
    /// Also read ConfigMaps in every namespace (dashboards, recording rules).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub scan_config_maps: bool,
}

#[derive(clap::Args, Debug)]
pub struct StatusArgs {
    /// Name of the GpuPoolMigration.
    pub name: String,
    /// Print the current state once and exit instead of following it.
    #[arg(long)]
    pub once: bool,
    /// Output for a terminal (progress bars) or plain lines, one per change. `auto` draws bars
    /// only when standard output is a terminal.
    #[arg(long, value_enum, default_value_t)]
    pub view: View,
    /// Give up after this many seconds (0: follow until the migration ends).
    #[arg(long, default_value_t = 0)]
    pub timeout: u64,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum View {
    #[default]
    Auto,
    Bars,
    Lines,
}

/// The API client for the CLI: the chosen kubeconfig and context, a User-Agent that names the
/// tool, and no client-side retry of 429s (an answer now beats a silent wait).
pub async fn client(cli: &Cli) -> anyhow::Result<kube::Client> {
    use kube::config::{KubeConfigOptions, Kubeconfig};
    let options = KubeConfigOptions { context: cli.context.clone(), ..Default::default() };
    let mut config = match &cli.kubeconfig {
        Some(path) => kube::Config::from_custom_kubeconfig(Kubeconfig::read_from(path)?, &options).await?,
        None if cli.context.is_some() => kube::Config::from_kubeconfig(&options).await?,
        None => kube::Config::infer().await?,
    };
    config.default_retry = false;
    config.headers.push((
        http::header::USER_AGENT,
        http::HeaderValue::from_static(concat!("switchyard-cli/", env!("CARGO_PKG_VERSION"))),
    ));
    Ok(kube::Client::try_from(config)?)
}

/// Entry point of both binaries.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    // One thread: the CLI waits on the API server and decodes what it sends, one page at a time.
    // Worker threads only handed each response from one to the other; on a busy 2-core control
    // plane that cost a third of `plan`'s CPU in futex wake-ups and context switches.
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: starting the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> anyhow::Result<u8> {
    let client = client(&cli).await?;
    match &cli.command {
        Command::Plan(args) => plan::run(client, args).await,
        Command::Inventory(args) => inventory::run(client, args).await,
        Command::Status(args) => status::run(client, args).await,
    }
}
