//! `make bench`: the 4-node migration scenario of the e2e suite, timed, with the operator's API
//! requests counted from the API server's audit log (its user agent is `switchyard-operator/…`).
//! Before each migration, `switchyard plan -f` of the same manifest is timed and its requests
//! (user agent `switchyard-cli/…`) counted the same way.
//!
//! Pool: 4 simulated nodes × 4 GPUs; a GPU Deployment of 2 with a PDB (minAvailable 1), a GPU
//! Deployment of 3 and a non-GPU Deployment of 3; `maxUnavailable: 2`. Wall time runs from the
//! GpuPoolMigration's creation (operator already running and synced) to phase Completed.

use std::time::{Duration, Instant};

use clap::Parser;
use kube::api::PostParams;
use serde_json::json;
use switchyard_e2e::cluster;
use switchyard_e2e::measure::{now, requests_by};
use switchyard_e2e::pool::Pool;
use switchyard_operator::api::v1alpha1::Phase;

#[derive(Parser)]
struct Args {
    /// How many times to run the scenario.
    #[arg(long, default_value_t = 3)]
    runs: u32,
    /// The API server's audit log (default: next to the e2e cluster's kubeconfig).
    #[arg(long, env = "SWITCHYARD_E2E_AUDIT_LOG")]
    audit_log: Option<std::path::PathBuf>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let audit =
        args.audit_log.unwrap_or_else(|| cluster::kubeconfig().parent().unwrap().join("logs/audit.log"));
    for run in 1..=args.runs {
        let mut pool = Pool::new("bench-mig", 4, 4).await?;
        pool.deployment("trainer", 2, 1).await?;
        pool.pdb("trainer", "trainer", 1).await?;
        pool.deployment("inference", 3, 1).await?;
        pool.deployment("web", 3, 0).await?;
        pool.wait_running(8).await?;
        pool.start_operator()?;
        // Let the operator sync its caches before the clock starts.
        tokio::time::sleep(Duration::from_secs(2)).await;

        let name = pool.id.clone();
        let gpm = pool.migration(&name, json!({"strategy": {"maxUnavailable": 2}}))?;

        // The plan of the same manifest, as a user would run it first.
        let manifest = pool.log_dir().join("bench-plan.yaml");
        std::fs::create_dir_all(pool.log_dir())?;
        std::fs::write(&manifest, serde_yaml::to_string(&gpm)?)?;
        let plan_from = now();
        let plan_start = Instant::now();
        let plan = tokio::process::Command::new(cluster::cli_bin())
            .arg("--kubeconfig")
            .arg(cluster::kubeconfig())
            .args(["plan", "-o", "json", "-f"])
            .arg(&manifest)
            .output()
            .await?;
        let plan_wall = plan_start.elapsed();
        let plan_to = now();
        anyhow::ensure!(
            plan.status.success(),
            "switchyard plan failed: {}",
            String::from_utf8_lossy(&plan.stderr)
        );

        let from = now();
        let start = Instant::now();
        pool.migrations().create(&PostParams::default(), &gpm).await?;
        let done = pool.wait_phase(&name, Phase::Completed, Duration::from_secs(600)).await?;
        let wall = start.elapsed();
        let to = now();
        let migrated = done.status.as_ref().map_or(0, |s| s.nodes.migrated).max(1) as u64;
        // The audit log is written asynchronously; give it a moment.
        tokio::time::sleep(Duration::from_secs(2)).await;
        let plan_requests = requests_by(&audit, "switchyard-cli/", &plan_from, &plan_to)?;
        println!(
            "run {run}: switchyard plan -f (4 nodes, 11 pods) in {:.0} ms; API requests: {}",
            plan_wall.as_secs_f64() * 1000.0,
            plan_requests.values().sum::<u64>()
        );
        for (kind, n) in &plan_requests {
            println!("    {kind:<40} {n:>5}");
        }
        let requests = requests_by(&audit, "switchyard-operator/", &from, &to)?;
        let total: u64 = requests.values().sum();
        println!(
            "run {run}: 4 nodes migrated in {:.1} s; operator API requests: {total} ({:.1} per migrated node)",
            wall.as_secs_f64(),
            total as f64 / migrated as f64
        );
        for (kind, n) in &requests {
            println!("    {kind:<40} {n:>5}  ({:.1}/node)", *n as f64 / migrated as f64);
        }
        pool.cleanup().await?;
    }
    Ok(())
}
