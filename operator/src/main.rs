//! `switchyard-operator`: parses flags and runs the operator.

// As in the library (lib.rs): no function over 100 lines without a reason; tests exempt.
#![cfg_attr(not(test), warn(clippy::too_many_lines))]

use std::net::SocketAddr;

use clap::Parser;
use switchyard_operator::runtime::alloc;
use switchyard_operator::runtime::{Settings, run};

#[global_allocator]
static ALLOCATOR: alloc::Jemalloc = alloc::Jemalloc;

/// jemalloc reads its options from this symbol (the crate prefixes jemalloc's names with `_rjem_`).
#[unsafe(export_name = "_rjem_malloc_conf")]
static MALLOC_CONF: alloc::Conf = alloc::CONF;

#[derive(Parser, Debug)]
#[command(about = "Moves GPU node pools from the NVIDIA device plugin to a DRA driver")]
struct Args {
    /// Address for /metrics, /readyz and /livez.
    #[arg(long, env = "SWITCHYARD_METRICS_ADDR", default_value = "0.0.0.0:8080")]
    metrics_addr: SocketAddr,
    /// Namespace of the leader-election Lease and of canary pods (the operator's own).
    #[arg(long, env = "POD_NAMESPACE", default_value = "switchyard-system")]
    namespace: String,
    /// Name of the leader-election Lease.
    #[arg(long, env = "SWITCHYARD_LEASE_NAME", default_value = "switchyard-operator")]
    lease_name: String,
    /// This replica's identity in the Lease (the pod name).
    #[arg(long, env = "POD_NAME")]
    identity: Option<String>,
    /// Run without leader election (one replica only, or local development).
    #[arg(long, env = "SWITCHYARD_NO_LEADER_ELECTION")]
    no_leader_election: bool,
    /// Manage only the GpuPoolMigrations that match this label selector (for example
    /// `switchyard.dev/shard=a`). Default: all of them.
    #[arg(long, env = "SWITCHYARD_MIGRATION_SELECTOR")]
    selector: Option<String>,
    /// Log format: text or json.
    #[arg(long, env = "SWITCHYARD_LOG_FORMAT", default_value = "text")]
    log_format: String,
}

fn main() -> anyhow::Result<()> {
    tokio::runtime::Builder::new_multi_thread().enable_all().build()?.block_on(operator())
}

async fn operator() -> anyhow::Result<()> {
    let args = Args::parse();
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let fmt = tracing_subscriber::fmt().with_env_filter(filter);
    if args.log_format == "json" {
        fmt.json().init();
    } else {
        fmt.init();
    }
    tracing::info!(options = alloc::options().as_deref().unwrap_or("unknown"), "allocator: jemalloc");
    let identity = args
        .identity
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| format!("switchyard-operator-{}", std::process::id()));
    run(Settings {
        metrics_addr: args.metrics_addr,
        namespace: args.namespace,
        lease_name: args.lease_name,
        identity,
        leader_election: !args.no_leader_election,
        migration_selector: args.selector,
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jemalloc_runs_with_the_options_the_binary_exports() {
        // Keeps the symbol referenced in the test binary as in the operator's.
        assert!(!MALLOC_CONF.0.is_null());
        assert_eq!(
            alloc::options().as_deref(),
            Some("background_thread=true narenas=2 dirty_decay_ms=1000 muzzy_decay_ms=0")
        );
    }
}
