//! `make bench SCALE=<nodes>`: pools of simulated GPU nodes migrated three ways on the real
//! control plane, in one run:
//!
//! 1. a pool of 2 × `--serial-nodes` nodes: half of it migrated by **Switchyard at
//!    `maxUnavailable: 1`** (label `wave=serial`), then the other half by **the kubectl runbook**
//!    (`e2e/hack/runbook-kubectl.sh`, `wave=kubectl`), one node at a time, with the DeviceClass
//!    and the DaemonSets' placement the first half left in place;
//!    and then, in the same pool, `--nodes` more nodes (`wave=kubectl-wide`) by **the kubectl
//!    runbook in parallel**: one script per node under `xargs -P k`, k being the wide migration's
//!    `maxUnavailable` (left out with `--no-parallel-runbook`);
//! 2. a pool of `--nodes` nodes migrated by **Switchyard at `maxUnavailable: 10%`**.
//!
//! `--plan-only` builds and populates the wide pool, times `switchyard plan -f` of it (and, with
//! `SWITCHYARD_CLI_BASELINE_BIN`, another CLI build alternating with it) and migrates nothing.
//!
//! The pool: light simulated nodes (Lease heartbeats, stub ResourceSlices, no agent processes; see
//! `sim::SimConfig::light`) with `--gpus` GPUs each; per node one GPU pod (a Deployment with one
//! replica per node, `nvidia.com/gpu: 1`) and `--pods-per-node - 1` bare non-GPU pods bound to it.
//! Pods terminate at once (grace 0).
//!
//! Intrinsic time: the only wait the environment imposes per node is the plugin's unregister
//! delay (`--unregister-delay-ms`: the device plugin's resources leave that long after its pod
//! does). A serial migration's intrinsic time is nodes × delay; one at `maxUnavailable: k` is
//! ceil(nodes / k) × delay. Everything above it is the tool's overhead plus the control plane's
//! own work (DaemonSet controller, scheduler) on this machine's 2 cores.
//!
//! Also measured: the operator's RSS after its caches synced and at the end, its CPU seconds per
//! migrated node (`/proc/<pid>/stat`), reconcile duration p50/p99 (its own histogram, between
//! scrapes), and its API requests per migrated node from the audit log. In the wide pool, before
//! the migration: `switchyard plan -f` of it (wall time and the CLI's requests); during it:
//! `switchyard status --view lines` following it (its CPU time, peak RSS and lines printed, from
//! `/proc` sampled every 500 ms) and the largest status the migration had (JSON bytes, from a
//! watch).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use clap::Parser;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::json;
use switchyard_e2e::cluster;
use switchyard_e2e::measure::{
    self, MachineCpu, cpu_by_name, cpu_time, histogram, histogram_quantile, now, proc_status, processes_cpu,
    requests_by,
};
use switchyard_e2e::pool::Pool;
use switchyard_operator::api::v1alpha1::Phase;
use switchyard_operator::well_known::{LABEL_GPU_BACKEND, NVIDIA_GPU_RESOURCE};

#[derive(Parser)]
struct Args {
    /// Pool size.
    #[arg(long, default_value_t = 100)]
    nodes: u32,
    /// Pods per node: one GPU pod, the rest bare non-GPU pods.
    #[arg(long, default_value_t = 10)]
    pods_per_node: u32,
    /// GPUs per node.
    #[arg(long, default_value_t = 4)]
    gpus: u32,
    /// Nodes migrated one at a time by Switchyard, and as many by the kubectl runbook.
    #[arg(long, default_value_t = 10)]
    serial_nodes: u32,
    /// The plugin unregister delay, the intrinsic wait per node, in milliseconds.
    #[arg(long, default_value_t = 5000)]
    unregister_delay_ms: u64,
    /// `maxUnavailable` of the wide migration, in percent of its pool.
    #[arg(long, default_value_t = 10)]
    percent: u32,
    /// Stop following the wide migration after this many seconds and report it as partial: the
    /// figures per node are then per node migrated by that time, and the RSS "at the end" is the
    /// RSS mid-migration. For pools whose whole migration outlasts the time at hand (5,000 nodes
    /// on 2 cores); without it, the bench waits for Completed.
    #[arg(long)]
    wide_deadline_s: Option<u64>,
    /// Leave out the wide peer: the kubectl runbook on another `--nodes` nodes, as many at once as
    /// the wide migration's `maxUnavailable` (`xargs -P`). It runs in the one-at-a-time pool
    /// (which then has 2 × `--serial-nodes` + `--nodes` nodes), after the runbook one at a time.
    #[arg(long)]
    no_parallel_runbook: bool,
    /// Only `switchyard plan -f` of the wide pool (`--nodes`, populated): its wall time, peak RSS
    /// and requests, without migrating anything. For the plan's own goal at 5,000 nodes, whose
    /// whole migration outlasts the time at hand.
    #[arg(long)]
    plan_only: bool,
    /// Append the figures as one JSON line to this file (for `e2e/hack/plot-scale.py`).
    #[arg(long)]
    json: Option<std::path::PathBuf>,
    /// The API server's audit log (default: next to the e2e cluster's kubeconfig).
    #[arg(long, env = "SWITCHYARD_E2E_AUDIT_LOG")]
    audit_log: Option<std::path::PathBuf>,
}

const RECONCILE_HISTOGRAM: &str = "switchyard_reconcile_duration_seconds";
const GPU_POD_LABEL: &str = "bench.switchyard.dev/gpu";

/// What one measured migration cost.
struct Measured {
    what: String,
    nodes: u32,
    wall: Duration,
    intrinsic: Duration,
    /// The most nodes in flight at once: `maxUnavailable`.
    in_flight: u32,
    /// Operator CPU time over the window, and requests (`None` for the runbook).
    operator: Option<OperatorCost>,
    /// The wide runbook's CPU: its own and the machine's (`None` for the others).
    runbook: Option<RunbookCost>,
}

/// What the kubectl runbook run in parallel cost the machine.
struct RunbookCost {
    /// The runbook's own CPU time: xargs, bash and every kubectl, from `getrusage(RUSAGE_CHILDREN)`
    /// (they exit inside the window, so `/proc` cannot see them).
    own: Duration,
    machine: MachineCpu,
    by_process: BTreeMap<String, Duration>,
}

struct OperatorCost {
    cpu: Duration,
    requests: BTreeMap<String, u64>,
    p50: Option<f64>,
    p99: Option<f64>,
    /// The mean reconcile duration, from the histogram's sum and count.
    mean: Option<f64>,
    reconciles: f64,
    /// Per part of the reconcile (observe, decide, execute and execute's parts): p50 and p99.
    phases: Vec<(&'static str, Option<f64>, Option<f64>)>,
    /// The control plane's pod writes in the window (`measure::control_plane_writes`).
    control_plane: BTreeMap<String, u64>,
    /// The machine's CPU time in the window, and the part of it each of [`CPU_USERS`] spent.
    machine: MachineCpu,
    by_process: BTreeMap<String, Duration>,
}

/// The processes whose CPU time the bench reports (by command name): the control plane, this
/// process (which runs the node simulator) and the operator. All share the machine's cores; what
/// they leave of the busy time is everything else: the CLI and kubectl (which exit inside the
/// window, so their time is not read per process), the kernel's own threads.
const CPU_USERS: [&str; 6] = [
    "kube-apiserver",
    "etcd",
    "kube-controller-manager",
    "kube-scheduler",
    "bench-scale",
    "switchyard-operator",
];

const PHASE_HISTOGRAM: &str = "switchyard_reconcile_phase_duration_seconds";

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    anyhow::ensure!(
        args.serial_nodes >= 1 && args.nodes >= 1,
        "--nodes and --serial-nodes must be at least 1"
    );
    let audit = args
        .audit_log
        .clone()
        .unwrap_or_else(|| cluster::kubeconfig().parent().unwrap().join("logs/audit.log"));
    let delay = Duration::from_millis(args.unregister_delay_ms);
    let mut results = Vec::new();
    if args.plan_only {
        anyhow::ensure!(
            std::env::var_os("SWITCHYARD_CLI_BIN").is_some(),
            "--plan-only needs SWITCHYARD_CLI_BIN"
        );
        let pool = Pool::scale("scale", args.nodes, args.gpus, delay).await?;
        let outcome = plan_only(&args, &pool, &audit).await;
        return finish(pool, outcome).await;
    }

    let peer = if args.no_parallel_runbook { 0 } else { args.nodes };
    let mut serial = Pool::scale("scale-serial", 2 * args.serial_nodes + peer, args.gpus, delay).await?;
    let outcome = one_at_a_time(&args, &mut serial, &audit, delay, &mut results).await;
    let outcome = finish(serial, outcome).await;

    match outcome {
        Ok(()) => {
            let t = Instant::now();
            let mut pool = Pool::scale("scale", args.nodes, args.gpus, delay).await?;
            println!(
                "pool: {} light nodes x {} GPUs in {:.1} s",
                args.nodes,
                args.gpus,
                t.elapsed().as_secs_f64()
            );
            let outcome = at_a_percentage(&args, &mut pool, &audit, delay, &mut results).await;
            // The figures go out before the clean-up, which takes minutes at 5,000 nodes.
            let written = match &outcome {
                Ok(memory) => {
                    report(&args, &results, memory);
                    write_json(&args, &results, memory)
                }
                Err(_) => Ok(()),
            };
            finish(pool, outcome).await.and(written)
        }
        Err(e) => Err(e),
    }
}

/// `--plan-only`: the wide pool populated, then `switchyard plan -f` of its migration, printed.
async fn plan_only(args: &Args, pool: &Pool, audit: &std::path::Path) -> anyhow::Result<()> {
    populate(args, pool, &[("wide", &pool.nodes)]).await?;
    let gpm = pool.migration(
        &pool.id,
        json!({"strategy": {"maxUnavailable": format!("{}%", args.percent), "drain": {"gracePeriodSeconds": 0}}}),
    )?;
    // With a baseline CLI, the two alternate on the same pool, three runs each.
    let baseline = std::env::var_os("SWITCHYARD_CLI_BASELINE_BIN").map(std::path::PathBuf::from);
    let mut clis = vec![("switchyard", cluster::cli_bin())];
    if let Some(b) = baseline {
        clis.push(("baseline", b));
    }
    let runs = if clis.len() > 1 { 3 } else { 1 };
    for run in 1..=runs {
        for (what, cli) in &clis {
            let p = plan_cost(cli.clone(), &gpm, audit).await?;
            let total: u64 = p.requests.values().sum();
            println!(
                "{what} plan -f of the {}-node pool ({} pods), run {run}: {:.2} s, exit {}, peak RSS {:.1} MiB, {total} API requests",
                args.nodes,
                args.nodes * args.pods_per_node,
                p.wall.as_secs_f64(),
                p.exit,
                p.peak_rss_kib as f64 / 1024.0
            );
            if run == 1 {
                for (what, n) in &p.requests {
                    println!("  {n:>5}  {what}");
                }
            }
            println!("machine CPU while it ran: {}", machine_line(&p.machine, &p.by_process));
        }
    }
    Ok(())
}

/// Appends the run to `--json`, one line.
fn write_json(args: &Args, results: &[Measured], memory: &Memory) -> anyhow::Result<()> {
    if let Some(path) = &args.json {
        use std::io::Write as _;
        let line = json!({
            "nodes": args.nodes, "pods": args.nodes * args.pods_per_node,
            "unregister_delay_ms": args.unregister_delay_ms,
            "rss_synced_kib": memory.synced, "rss_end_kib": memory.end, "rss_peak_kib": memory.peak,
            "rss_settled_kib": memory.settled,
            "heap_synced_bytes": memory.heap[0], "heap_end_bytes": memory.heap[1],
            "heap_settled_bytes": memory.heap[2],
            "partial": memory.partial,
            "status_bytes": memory.status_bytes,
            "plan_s": memory.plan.as_ref().map(|p| p.wall.as_secs_f64()),
            "plan_requests": memory.plan.as_ref().map(|p| p.requests.values().sum::<u64>()),
            "plan_peak_rss_mib": memory.plan.as_ref().map(|p| p.peak_rss_kib as f64 / 1024.0),
            "plan_machine_cpu": memory.plan.as_ref().map(|p| machine_json(&p.machine, &p.by_process)),
            "status_cli_cpu_s": memory.status.as_ref().map(|f| f.cpu.as_secs_f64()),
            "migrations": results.iter().map(|r| json!({
                "what": r.what, "nodes": r.nodes, "wall_s": r.wall.as_secs_f64(),
                "intrinsic_s": r.intrinsic.as_secs_f64(),
                "cpu_s": r.operator.as_ref().map(|o| o.cpu.as_secs_f64()),
                "reconcile_p50_s": r.operator.as_ref().and_then(|o| o.p50),
                "reconcile_p99_s": r.operator.as_ref().and_then(|o| o.p99),
                "reconcile_mean_s": r.operator.as_ref().and_then(|o| o.mean),
                "in_flight": r.in_flight,
                "reconciles": r.operator.as_ref().map(|o| o.reconciles),
                "requests": r.operator.as_ref().map(|o| o.requests.values().sum::<u64>()),
                "phases": r.operator.as_ref().map(|o| o.phases.iter().map(|(p, a, b)| json!({
                    "phase": p, "p50_s": a, "p99_s": b,
                })).collect::<Vec<_>>()),
                "control_plane_writes": r.operator.as_ref().map(|o| &o.control_plane),
                "machine_cpu": r.operator.as_ref().map(|o| machine_json(&o.machine, &o.by_process))
                    .or_else(|| r.runbook.as_ref().map(|c| machine_json(&c.machine, &c.by_process))),
                "runbook_own_cpu_s": r.runbook.as_ref().map(|c| c.own.as_secs_f64()),
            })).collect::<Vec<_>>(),
        });
        let mut f = std::fs::OpenOptions::new().create(true).append(true).open(path)?;
        writeln!(f, "{line}")?;
    }
    Ok(())
}

fn machine_json(m: &MachineCpu, by_process: &BTreeMap<String, Duration>) -> serde_json::Value {
    json!({
        "busy_s": m.busy.as_secs_f64(), "total_s": m.total.as_secs_f64(), "cpus": m.cpus,
        "by_process_s": by_process.iter().map(|(k, v)| (k.clone(), v.as_secs_f64())).collect::<BTreeMap<_, _>>(),
    })
}

/// Cleans the pool up whatever the outcome.
async fn finish<T>(pool: Pool, outcome: anyhow::Result<T>) -> anyhow::Result<T> {
    if outcome.is_err() {
        eprintln!("bench-scale failed; operator log in {}", pool.log_dir().display());
    }
    let cleaned = pool.cleanup().await;
    let value = outcome?;
    cleaned?;
    Ok(value)
}

/// Labels the pool's nodes `wave=<name>` as `waves` says, and starts the workloads.
async fn populate(args: &Args, pool: &Pool, waves: &[(&str, &[String])]) -> anyhow::Result<()> {
    let nodes: Api<Node> = Api::all(pool.client.clone());
    let labels: Vec<(String, &str)> =
        waves.iter().flat_map(|(w, ns)| ns.iter().map(move |n| (n.clone(), *w))).collect();
    futures::stream::iter(labels)
        .map(|(n, w)| {
            let nodes = nodes.clone();
            async move {
                let patch = json!({"metadata": {"labels": {"wave": w}}});
                nodes.patch(&n, &PatchParams::default(), &Patch::Merge(&patch)).await
            }
        })
        .buffer_unordered(16)
        .try_collect::<Vec<_>>()
        .await?;

    // One GPU pod per node through a Deployment, the rest bare and bound.
    let t = Instant::now();
    let count = pool.nodes.len() as u32;
    gpu_deployment(pool, count).await?;
    let fillers: Vec<(String, u32)> =
        pool.nodes.iter().flat_map(|n| (1..args.pods_per_node).map(move |i| (n.clone(), i))).collect();
    let pods: Api<Pod> = Api::namespaced(pool.client.clone(), &pool.apps_ns);
    futures::stream::iter(fillers)
        .map(|(node, i)| {
            let pods = pods.clone();
            async move {
                let pod: Pod = serde_json::from_value(json!({
                    "metadata": {"name": format!("{node}-filler-{i}"), "labels": {"app": "filler"}},
                    "spec": {"nodeName": node, "terminationGracePeriodSeconds": 0,
                             "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10"}]}
                }))?;
                pods.create(&PostParams::default(), &pod).await?;
                anyhow::Ok(())
            }
        })
        .buffer_unordered(32)
        .try_collect::<Vec<_>>()
        .await?;
    let total = (count * args.pods_per_node) as usize;
    wait_running(pool, total).await?;
    println!("{}: {total} pods Running in {:.1} s", pool.id, t.elapsed().as_secs_f64());
    Ok(())
}

/// The operator as shipped (release, at the caller's `SWITCHYARD_OPERATOR_BIN`), logging at info;
/// handed to the pool (whose cleanup needs it for the finalizers); returns its pid and metrics URL
/// once its caches have synced.
async fn operator(pool: &mut Pool) -> anyhow::Result<(u32, String)> {
    let (child, metrics) = pool.spawn_operator_with(&["--no-leader-election"], "operator.log", "info")?;
    let pid = child.id().context("the operator exited at once")?;
    pool.operator = Some(switchyard_e2e::pool::Operator::from_child(child));
    let metrics_url = format!("http://{metrics}/metrics");
    switchyard_e2e::wait::until("the operator's /metrics", Duration::from_secs(30), || {
        let url = metrics_url.clone();
        // Not listening yet: an io::Error, retried, and the last one reported at the timeout.
        async move { measure::http("GET", &url, None).await.map(|_| Some(())) }
    })
    .await?;
    // The caches list every node and slice first: wait until the operator says they synced
    // (`/readyz`), and a little more for the first reconciles' memory to settle.
    let readyz = format!("http://{metrics}/readyz");
    switchyard_e2e::wait::until("the operator's caches synced (/readyz)", Duration::from_secs(300), || {
        let url = readyz.clone();
        async move {
            let (code, _) = measure::http("GET", &url, None).await?;
            Ok((code == 200).then_some(()))
        }
    })
    .await?;
    tokio::time::sleep(Duration::from_secs(5)).await;
    Ok((pid, metrics_url))
}

/// Switchyard at `maxUnavailable: 1` on one half of the pool, then the kubectl runbook on the
/// other half.
async fn one_at_a_time(
    args: &Args,
    pool: &mut Pool,
    audit: &std::path::Path,
    delay: Duration,
    results: &mut Vec<Measured>,
) -> anyhow::Result<()> {
    let s = args.serial_nodes as usize;
    let (ours, theirs, wide) =
        (pool.nodes[..s].to_vec(), pool.nodes[s..2 * s].to_vec(), pool.nodes[2 * s..].to_vec());
    populate(args, pool, &[("serial", &ours), ("kubectl", &theirs), ("kubectl-wide", &wide)]).await?;
    let (pid, metrics_url) = operator(pool).await?;
    let name = pool.id.clone();
    let gpm = pool.migration(
        &name,
        json!({"nodeSelector": {"matchLabels": {"wave": "serial"}},
               "strategy": {"maxUnavailable": 1, "drain": {"gracePeriodSeconds": 0}}}),
    )?;
    let (wall, cost) = measured(pid, &metrics_url, audit, || async {
        pool.migrations().create(&PostParams::default(), &gpm).await?;
        pool.wait_phase(&name, Phase::Completed, Duration::from_secs(60 + 60 * args.serial_nodes as u64))
            .await?;
        Ok(())
    })
    .await?;
    results.push(Measured {
        what: "Switchyard, maxUnavailable 1".into(),
        nodes: args.serial_nodes,
        wall,
        intrinsic: delay * args.serial_nodes,
        in_flight: 1,
        operator: Some(cost),
        runbook: None,
    });

    let t = Instant::now();
    let retried = runbook(pool, &theirs, 1).await?;
    results.push(Measured {
        what: format!("kubectl runbook, one at a time{}", retries(retried)),
        nodes: args.serial_nodes,
        wall: t.elapsed(),
        intrinsic: delay * args.serial_nodes,
        in_flight: 1,
        operator: None,
        runbook: None,
    });
    if !wide.is_empty() {
        let k = (args.nodes * args.percent / 100).max(1);
        let (machine0, procs0, own0) = (MachineCpu::now()?, processes_cpu(&CPU_USERS), children_cpu());
        let t = Instant::now();
        let retried = runbook(pool, &wide, k).await?;
        let wall = t.elapsed();
        let runbook = RunbookCost {
            own: children_cpu().saturating_sub(own0),
            machine: MachineCpu::now()?.since(&machine0),
            by_process: cpu_by_name(&procs0, &processes_cpu(&CPU_USERS)),
        };
        results.push(Measured {
            what: format!("kubectl runbook, {k} at a time (xargs -P {k}){}", retries(retried)),
            nodes: args.nodes,
            wall,
            intrinsic: delay * args.nodes.div_ceil(k),
            in_flight: k,
            operator: None,
            runbook: Some(runbook),
        });
    }
    all_on_dra(pool).await?;
    Ok(())
}

/// `e2e/hack/runbook-kubectl.sh` on `nodes`, `at_once` of them at a time: one script per node
/// under `xargs -P`, as a platform team would parallelise it. Returns how many kubectl commands
/// the script tried again after the API server failed them.
async fn runbook(pool: &Pool, nodes: &[String], at_once: u32) -> anyhow::Result<usize> {
    use tokio::io::AsyncWriteExt as _;
    let mut child = tokio::process::Command::new("xargs")
        .args(["-P", &at_once.to_string(), "-n", "1", "bash"])
        .arg(cluster::repo_root().join("e2e/hack/runbook-kubectl.sh"))
        .env("KUBECTL", cluster::bin_dir().join("kubectl"))
        .env("KUBECONFIG", cluster::kubeconfig())
        .env("DRIVER", &pool.driver)
        .env("GPU_POD_SELECTOR", format!("{GPU_POD_LABEL}=true"))
        .env("BACKEND_LABEL", format!("{LABEL_GPU_BACKEND}=dra"))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()?;
    let mut stdin = child.stdin.take().context("piped")?;
    stdin.write_all(nodes.join("\n").as_bytes()).await?;
    drop(stdin);
    let out = child.wait_with_output().await?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    let failed: Vec<&str> =
        stderr.lines().filter(|l| l.starts_with("runbook: ") && !l.starts_with("runbook: retry")).collect();
    anyhow::ensure!(
        out.status.success(),
        "the kubectl runbook failed: {}",
        if failed.is_empty() { stderr.to_string() } else { failed.join("\n") }
    );
    Ok(stderr.lines().filter(|l| l.starts_with("runbook: retry")).count())
}

/// `", N kubectl commands retried"` where the runbook retried any.
fn retries(n: usize) -> String {
    if n == 0 { String::new() } else { format!(", {n} kubectl commands retried") }
}

/// The CPU time (user + system) of this process's children that have been waited for, and of
/// theirs: what short-lived processes like kubectl used, which `/proc` no longer shows.
fn children_cpu() -> Duration {
    // SAFETY: an all-zero rusage is a valid value of that plain C struct.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `usage` is a live local; RUSAGE_CHILDREN is a valid `who`.
    if unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut usage) } != 0 {
        return Duration::ZERO;
    }
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, (t.tv_usec * 1000) as u32);
    tv(usage.ru_utime) + tv(usage.ru_stime)
}

/// How long after the end the operator's memory is read again: the last reconciles' requeues are
/// seconds apart, and jemalloc gives freed pages back after 1 s.
const SETTLE: Duration = Duration::from_secs(5);

/// Operator memory in the wide pool: after its caches synced, at the end, and the peak (KiB); and
/// what the CLI cost there.
struct Memory {
    synced: u64,
    end: u64,
    /// [`SETTLE`] after `end`: the last reconciles have run, and the allocator has given back
    /// what they freed.
    settled: u64,
    peak: u64,
    /// The operator's heap in use (bytes, its `switchyard_heap_in_use_bytes`) at `synced`, `end`
    /// and `settled`: the live data inside the RSS.
    heap: [Option<f64>; 3],
    plan: Option<CliCost>,
    status: Option<Following>,
    /// The largest `.status` of the wide migration seen by a watch, in JSON bytes.
    status_bytes: usize,
    /// The wide migration was stopped at `--wide-deadline-s`: `end` is mid-migration.
    partial: bool,
}

/// `switchyard plan -f` of the wide pool before it moves.
struct CliCost {
    wall: Duration,
    exit: i32,
    requests: BTreeMap<String, u64>,
    /// The machine's CPU time while it ran, and the part of it each of [`CPU_USERS`] spent.
    machine: MachineCpu,
    by_process: BTreeMap<String, Duration>,
    /// The CLI's peak resident set (GNU time's `%M`), in KiB.
    peak_rss_kib: u64,
}

/// Runs `switchyard plan -f - -o json` on `manifest` under GNU time, which reports the CLI's peak
/// resident set. Not this process's own `wait4`: a child forked from it inherits its address
/// space until `exec`, and the kernel keeps that space's high-water mark (this process's, with
/// the simulator's thousands of nodes) as the child's `ru_maxrss`. `(exit, peak RSS in KiB,
/// stderr)`. Blocking.
fn run_measured(cli: &std::path::Path, manifest: &str) -> anyhow::Result<(i32, u64, String)> {
    use std::io::Write as _;
    let rss = tempfile_path("plan-rss");
    let mut child = std::process::Command::new("/usr/bin/time")
        .args(["-f", "%M", "-o"])
        .arg(&rss)
        .arg(cli)
        .args(["plan", "-f", "-", "-o", "json"])
        .env("KUBECONFIG", cluster::kubeconfig())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .context("running /usr/bin/time (Debian's time package; make deps installs it)")?;
    child.stdin.take().context("piped")?.write_all(manifest.as_bytes())?;
    let out = child.wait_with_output()?;
    let text = std::fs::read_to_string(&rss).unwrap_or_default();
    let _ = std::fs::remove_file(&rss);
    // GNU time writes "Command exited with non-zero status N" before the figure when it fails.
    let peak = text
        .lines()
        .last()
        .and_then(|l| l.trim().parse::<u64>().ok())
        .with_context(|| format!("GNU time wrote no peak RSS: {text:?}"))?;
    Ok((out.status.code().unwrap_or(-1), peak, String::from_utf8_lossy(&out.stderr).into_owned()))
}

/// A path for a scratch file of this process.
fn tempfile_path(what: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("bench-scale-{}-{what}", std::process::id()))
}

/// `switchyard status --view lines` following the wide migration.
struct Following {
    exit: Option<i32>,
    cpu: Duration,
    peak_rss_kib: u64,
    lines: usize,
}

/// Times `switchyard plan -f` of `gpm` (the CLI at `SWITCHYARD_CLI_BIN`), with its requests from
/// the audit log.
async fn plan_cost(
    cli: std::path::PathBuf,
    gpm: &switchyard_operator::api::v1alpha1::GpuPoolMigration,
    audit: &std::path::Path,
) -> anyhow::Result<CliCost> {
    let manifest = serde_yaml::to_string(gpm)?;
    let (machine0, procs0) = (MachineCpu::now()?, processes_cpu(&CPU_USERS));
    let (from, t) = (now(), Instant::now());
    let run = tokio::task::spawn_blocking(move || run_measured(&cli, &manifest));
    let (exit, peak_rss_kib, stderr) = run.await??;
    let wall = t.elapsed();
    let to = now();
    let machine = MachineCpu::now()?.since(&machine0);
    let by_process = cpu_by_name(&procs0, &processes_cpu(&CPU_USERS));
    tokio::time::sleep(Duration::from_secs(2)).await;
    anyhow::ensure!(exit == 0 || exit == 2, "switchyard plan failed: {stderr}");
    let requests = requests_by(audit, "switchyard-cli/", &from, &to)?;
    Ok(CliCost { wall, exit, requests, machine, by_process, peak_rss_kib })
}

/// Starts `switchyard status <name> --view lines` and samples it until it exits.
fn follow_status(name: &str) -> anyhow::Result<tokio::task::JoinHandle<anyhow::Result<Following>>> {
    use tokio::io::AsyncBufReadExt as _;
    let mut child = tokio::process::Command::new(cluster::cli_bin())
        .args(["status", name, "--view", "lines", "--timeout", "3600"])
        .env("KUBECONFIG", cluster::kubeconfig())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()?;
    let pid = child.id().context("the CLI exited at once")?;
    let stdout = child.stdout.take().context("piped")?;
    Ok(tokio::spawn(async move {
        let mut lines = tokio::io::BufReader::new(stdout).lines();
        let mut f = Following { exit: None, cpu: Duration::ZERO, peak_rss_kib: 0, lines: 0 };
        let mut tick = tokio::time::interval(Duration::from_millis(500));
        loop {
            tokio::select! {
                line = lines.next_line() => match line? {
                    Some(_) => f.lines += 1,
                    None => break,
                },
                _ = tick.tick() => {
                    if let (Ok(cpu), Ok(rss)) = (cpu_time(pid), proc_status(pid, "VmHWM")) {
                        f.cpu = cpu;
                        f.peak_rss_kib = rss;
                    }
                }
            }
        }
        f.exit = child.wait().await?.code();
        Ok(f)
    }))
}

/// Watches the migration and keeps the size of the largest status it had.
fn largest_status(
    pool: &Pool,
    name: &str,
) -> (tokio::task::JoinHandle<()>, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    use kube::runtime::{WatchStreamExt as _, watcher};
    let max = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let seen = max.clone();
    let stream =
        watcher(pool.migrations(), watcher::Config::default().fields(&format!("metadata.name={name}")))
            .default_backoff()
            .applied_objects();
    let task = tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        while let Some(Ok(g)) = stream.next().await {
            let bytes = serde_json::to_vec(&g.status).map_or(0, |v| v.len());
            seen.fetch_max(bytes, std::sync::atomic::Ordering::Relaxed);
        }
    });
    (task, max)
}

/// Switchyard at `maxUnavailable: <percent>%` on the whole pool.
async fn at_a_percentage(
    args: &Args,
    pool: &mut Pool,
    audit: &std::path::Path,
    delay: Duration,
    results: &mut Vec<Measured>,
) -> anyhow::Result<Memory> {
    let nodes = pool.nodes.clone();
    populate(args, pool, &[("wide", &nodes)]).await?;
    let (pid, metrics_url) = operator(pool).await?;
    let synced = proc_status(pid, "VmRSS")?;
    let heap_synced = heap_in_use(&metrics_url).await;
    let name = pool.id.clone();
    let k = (args.nodes * args.percent / 100).max(1);
    let gpm = pool.migration(
        &name,
        json!({"strategy": {"maxUnavailable": format!("{}%", args.percent), "drain": {"gracePeriodSeconds": 0}}}),
    )?;
    // The CLI where it is built (make bench builds it); without it, its figures are left out.
    let cli = std::env::var_os("SWITCHYARD_CLI_BIN").is_some();
    let plan = if cli { Some(plan_cost(cluster::cli_bin(), &gpm, audit).await?) } else { None };
    let (watch, status_bytes) = largest_status(pool, &name);
    let mut status = None;
    let mut partial = false;
    let (wall, cost) = measured(pid, &metrics_url, audit, || async {
        pool.migrations().create(&PostParams::default(), &gpm).await?;
        if cli {
            status = Some(follow_status(&name)?);
        }
        let completed =
            pool.wait_phase(&name, Phase::Completed, Duration::from_secs(600 + 2 * args.nodes as u64));
        match args.wide_deadline_s.map(Duration::from_secs) {
            None => {
                completed.await?;
            }
            Some(deadline) => match tokio::time::timeout(deadline, completed).await {
                Ok(done) => {
                    done?;
                }
                Err(_) => partial = true,
            },
        }
        Ok(())
    })
    .await?;
    let status = match status {
        Some(task) if !partial => Some(tokio::time::timeout(Duration::from_secs(60), task).await???),
        Some(task) => {
            task.abort();
            None
        }
        None => None,
    };
    watch.abort();
    // Nodes migrated in the window: all of them, or as many as the status counts at the deadline.
    let migrated = if partial {
        let counts = pool.migrations().get(&name).await?.status.map(|s| s.nodes).unwrap_or_default();
        println!(
            "{name}: stopped following after {:.0} s: {} of {} nodes migrated, {} in progress, {} failed",
            wall.as_secs_f64(),
            counts.migrated,
            counts.total,
            counts.in_progress,
            counts.failed
        );
        anyhow::ensure!(counts.migrated > 0, "no node migrated before the deadline");
        counts.migrated as u32
    } else {
        args.nodes
    };
    results.push(Measured {
        what: if partial {
            format!(
                "Switchyard, maxUnavailable {}% ({k} nodes), partial: {migrated} of {} nodes in {:.0} s",
                args.percent,
                args.nodes,
                wall.as_secs_f64()
            )
        } else {
            format!("Switchyard, maxUnavailable {}% ({k} nodes)", args.percent)
        },
        nodes: migrated,
        wall,
        // What the migrated nodes needed at best: their waves, back to back.
        intrinsic: delay * migrated.div_ceil(k),
        in_flight: k,
        operator: Some(cost),
        runbook: None,
    });
    let end = proc_status(pid, "VmRSS")?;
    let heap_end = heap_in_use(&metrics_url).await;
    tokio::time::sleep(SETTLE).await;
    let memory = Memory {
        synced,
        end,
        settled: proc_status(pid, "VmRSS")?,
        peak: proc_status(pid, "VmHWM")?,
        heap: [heap_synced, heap_end, heap_in_use(&metrics_url).await],
        plan,
        status,
        status_bytes: status_bytes.load(std::sync::atomic::Ordering::Relaxed),
        partial,
    };
    if !partial {
        all_on_dra(pool).await?;
    }
    Ok(memory)
}

/// The operator's heap in use, from its `/metrics` (`None` if it does not say).
async fn heap_in_use(metrics_url: &str) -> Option<f64> {
    let (_, text) = measure::http("GET", metrics_url, None).await.ok()?;
    measure::sample(&text, "switchyard_heap_in_use_bytes")
}

/// Every node of the pool is on DRA: labelled so, advertising no `nvidia.com/gpu`.
async fn all_on_dra(pool: &Pool) -> anyhow::Result<()> {
    let nodes: Api<Node> = Api::all(pool.client.clone());
    let listed = nodes.list(&ListParams::default().labels(&format!("pool={}", pool.id))).await?.items;
    let on_dra = listed
        .iter()
        .filter(|n| n.labels().get(LABEL_GPU_BACKEND).map(String::as_str) == Some("dra"))
        .filter(|n| switchyard_e2e::pool::allocatable(n, NVIDIA_GPU_RESOURCE) == 0)
        .count();
    anyhow::ensure!(
        on_dra == pool.nodes.len(),
        "{on_dra} of {} nodes of {} ended on DRA",
        pool.nodes.len(),
        pool.id
    );
    Ok(())
}

fn report(args: &Args, results: &[Measured], memory: &Memory) {
    println!();
    println!(
        "SCALE={} ({} pods, {} ms unregister delay): operator RSS {:.1} MiB synced, {:.1} MiB {} ({:.1} MiB {} s later), peak {:.1} MiB",
        args.nodes,
        args.nodes * args.pods_per_node,
        args.unregister_delay_ms,
        memory.synced as f64 / 1024.0,
        memory.end as f64 / 1024.0,
        if memory.partial { "mid-migration (at the deadline)" } else { "at the end" },
        memory.settled as f64 / 1024.0,
        SETTLE.as_secs(),
        memory.peak as f64 / 1024.0
    );
    let mib = |b: Option<f64>| b.map_or("-".to_string(), |b| format!("{:.1} MiB", b / 1048576.0));
    println!(
        "operator heap in use (switchyard_heap_in_use_bytes): {} synced, {} {} ({} {} s later)",
        mib(memory.heap[0]),
        mib(memory.heap[1]),
        if memory.partial { "mid-migration" } else { "at the end" },
        mib(memory.heap[2]),
        SETTLE.as_secs()
    );
    println!(
        "| migration | nodes | wall | intrinsic | wall / intrinsic | overhead per node | CPU s per node | reconcile p50 / p99 | requests per node |"
    );
    println!("| --- | --- | --- | --- | --- | --- | --- | --- | --- |");
    for r in results {
        let over = (r.wall.as_secs_f64() - r.intrinsic.as_secs_f64()) / f64::from(r.nodes);
        let (cpu, quantiles, reqs) = match &r.operator {
            Some(o) => (
                format!("{:.3}", o.cpu.as_secs_f64() / f64::from(r.nodes)),
                format!("{} / {} ms ({} reconciles)", ms(o.p50), ms(o.p99), o.reconciles),
                format!("{:.1}", o.requests.values().sum::<u64>() as f64 / f64::from(r.nodes)),
            ),
            None => ("-".into(), "-".into(), "-".into()),
        };
        println!(
            "| {} | {} | {:.1} s | {:.1} s | {:.2} | {:.2} s | {cpu} | {quantiles} | {reqs} |",
            r.what,
            r.nodes,
            r.wall.as_secs_f64(),
            r.intrinsic.as_secs_f64(),
            r.wall.as_secs_f64() / r.intrinsic.as_secs_f64(),
            over
        );
    }
    println!("largest status of the wide migration: {} bytes of JSON", memory.status_bytes);
    if let Some(p) = &memory.plan {
        let total: u64 = p.requests.values().sum();
        let pods = p.requests.iter().filter(|(k, _)| k.ends_with(" pods")).map(|(_, n)| n).sum::<u64>();
        println!(
            "switchyard plan -f of the {}-node pool: {:.2} s, exit {}, peak RSS {:.1} MiB, {total} API requests ({pods} of them pod LISTs)",
            args.nodes,
            p.wall.as_secs_f64(),
            p.exit,
            p.peak_rss_kib as f64 / 1024.0
        );
    }
    if let Some(f) = &memory.status {
        println!(
            "switchyard status --view lines following it: exit {:?}, {:.2} s CPU, peak RSS {:.1} MiB, {} lines",
            f.exit,
            f.cpu.as_secs_f64(),
            f.peak_rss_kib as f64 / 1024.0,
            f.lines
        );
    }
    let (sw, kc) = (&results[0], &results[1]);
    println!(
        "maxUnavailable 1: Switchyard {:.1} s, kubectl runbook {:.1} s, ratio {:.2}",
        sw.wall.as_secs_f64(),
        kc.wall.as_secs_f64(),
        sw.wall.as_secs_f64() / kc.wall.as_secs_f64()
    );
    let peer = results.iter().find(|r| r.runbook.is_some());
    if let (Some(peer), Some(wide)) = (peer, results.iter().find(|r| r.what.contains('%'))) {
        println!(
            "maxUnavailable {}% of {} nodes: Switchyard {:.1} s, kubectl runbook {} at a time {:.1} s, ratio {:.2}",
            args.percent,
            args.nodes,
            wide.wall.as_secs_f64(),
            peer.in_flight,
            peer.wall.as_secs_f64(),
            wide.wall.as_secs_f64() / peer.wall.as_secs_f64()
        );
    }
    for r in results {
        if let Some(o) = &r.operator {
            let phases: Vec<String> =
                o.phases.iter().map(|(p, a, b)| format!("{p} {} / {} ms", ms(*a), ms(*b))).collect();
            println!("reconcile parts, p50 / p99, {}: {}", r.what, phases.join(", "));
            let per = |v: Option<f64>| ms(v.map(|v| v / f64::from(r.in_flight)));
            println!(
                "reconcile mean {} ms; per node in flight ({}): mean {} / p50 {} / p99 {} ms",
                ms(o.mean),
                r.in_flight,
                per(o.mean),
                per(o.p50),
                per(o.p99)
            );
        }
    }
    if let Some(p) = &memory.plan {
        println!("machine CPU while switchyard plan ran: {}", machine_line(&p.machine, &p.by_process));
    }
    for r in results {
        if let Some(o) = &r.operator {
            println!("machine CPU in the window, {}: {}", r.what, machine_line(&o.machine, &o.by_process));
        }
        if let Some(c) = &r.runbook {
            println!(
                "machine CPU in the window, {}: {}; the runbook's own processes (xargs, bash, kubectl) {:.1}",
                r.what,
                machine_line(&c.machine, &c.by_process),
                c.own.as_secs_f64()
            );
        }
    }
    let limits = control_plane_limits();
    for r in results {
        if let Some(o) = &r.operator {
            println!("control plane's pod writes in the window, {}:", r.what);
            for (_, writer) in measure::CONTROL_PLANE_WRITERS {
                let mine: Vec<(&String, &u64)> =
                    o.control_plane.iter().filter(|(k, _)| k.starts_with(&format!("{writer} "))).collect();
                let total: u64 = mine.iter().map(|(_, n)| **n).sum();
                let parts: Vec<String> =
                    mine.iter().map(|(k, n)| format!("{} {n}", &k[writer.len() + 1..])).collect();
                // The scheduler has its own client; the two controllers share the manager's flags.
                let limit =
                    limits.map(|l| if writer == "kube-scheduler" { (l[2], l[3]) } else { (l[0], l[1]) });
                let floor = match limit {
                    Some((qps, burst)) if qps > 0 => format!(
                        "; at {qps} requests a second after a burst of {burst}, at least {:.1} s",
                        total.saturating_sub(burst) as f64 / qps as f64
                    ),
                    _ => String::new(),
                };
                println!("    {writer:<24} {total:>7}  ({}){floor}", parts.join(", "));
            }
        }
    }
    for r in results {
        if let Some(o) = &r.operator {
            println!("operator API requests, {} ({} nodes):", r.what, r.nodes);
            for (kind, n) in &o.requests {
                println!("    {kind:<40} {n:>7}  ({:.2}/node)", *n as f64 / f64::from(r.nodes));
            }
        }
    }
}

/// `busy 251.4 of 258.5 CPU s (97% of 2 CPUs); by process, CPU s: kube-apiserver 120.7, …, other 1.3`.
fn machine_line(m: &MachineCpu, by_process: &BTreeMap<String, Duration>) -> String {
    let named: Duration = by_process.values().sum();
    let parts: Vec<String> = CPU_USERS
        .iter()
        .map(|n| format!("{n} {:.1}", by_process.get(*n).copied().unwrap_or_default().as_secs_f64()))
        .chain([format!("other {:.1}", m.busy.saturating_sub(named).as_secs_f64())])
        .collect();
    format!(
        "busy {:.1} of {:.1} CPU s ({:.0}% of {} CPUs); by process, CPU s: {}",
        m.busy.as_secs_f64(),
        m.total.as_secs_f64(),
        100.0 * m.busy.as_secs_f64() / m.total.as_secs_f64().max(f64::EPSILON),
        m.cpus,
        parts.join(", ")
    )
}

/// The controller manager's and the scheduler's client limits (requests a second, burst) as
/// `cluster-up.sh` set them, where it wrote them.
fn control_plane_limits() -> Option<[u64; 4]> {
    let path = cluster::kubeconfig().parent()?.join("control-plane-qps");
    let text = std::fs::read_to_string(path).ok()?;
    let v: Vec<u64> = text.split_whitespace().filter_map(|x| x.parse().ok()).collect();
    v.try_into().ok()
}

fn ms(v: Option<f64>) -> String {
    v.map_or("-".into(), |s| format!("{:.1}", s * 1000.0))
}

/// Runs `what` and measures the operator over it: wall time, CPU, reconcile quantiles, requests.
async fn measured<F, Fut>(
    pid: u32,
    metrics_url: &str,
    audit: &std::path::Path,
    what: F,
) -> anyhow::Result<(Duration, OperatorCost)>
where
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<()>>,
{
    let (_, before) = measure::http("GET", metrics_url, None).await?;
    let (machine0, procs0) = (MachineCpu::now()?, processes_cpu(&CPU_USERS));
    let (cpu0, from, t) = (cpu_time(pid)?, now(), Instant::now());
    what().await?;
    let wall = t.elapsed();
    let (cpu1, to) = (cpu_time(pid)?, now());
    let machine = MachineCpu::now()?.since(&machine0);
    let by_process = cpu_by_name(&procs0, &processes_cpu(&CPU_USERS));
    let (_, after) = measure::http("GET", metrics_url, None).await?;
    // The audit log is written asynchronously; give it a moment.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let requests = requests_by(audit, "switchyard-operator/", &from, &to)?;
    let control_plane = measure::control_plane_writes(audit, &from, &to)?;
    let (b, _) = histogram(&before, RECONCILE_HISTOGRAM);
    let (a, total) = histogram(&after, RECONCILE_HISTOGRAM);
    let reconciles = total - b.last().map_or(0.0, |x| x.1);
    let sum = |text: &str| measure::sample(text, &format!("{RECONCILE_HISTOGRAM}_sum"));
    let mean = match (sum(&before), sum(&after)) {
        (Some(s0), Some(s1)) if reconciles > 0.0 => Some((s1 - s0) / reconciles),
        _ => None,
    };
    let phases = ["observe", "decide", "execute", "execute_steps", "execute_status"]
        .into_iter()
        .map(|phase| {
            let only = |text: &str| -> String {
                text.lines()
                    .filter(|l| l.contains(&format!("phase=\"{phase}\"")))
                    .collect::<Vec<_>>()
                    .join("\n")
            };
            let (pb, _) = histogram(&only(&before), PHASE_HISTOGRAM);
            let (pa, _) = histogram(&only(&after), PHASE_HISTOGRAM);
            (phase, histogram_quantile(&pb, &pa, 0.5), histogram_quantile(&pb, &pa, 0.99))
        })
        .collect();
    Ok((
        wall,
        OperatorCost {
            cpu: cpu1.saturating_sub(cpu0),
            requests,
            p50: histogram_quantile(&b, &a, 0.5),
            p99: histogram_quantile(&b, &a, 0.99),
            mean,
            reconciles,
            phases,
            control_plane,
            machine,
            by_process,
        },
    ))
}

/// One GPU pod per node: a Deployment of `replicas`, each pod asking for one `nvidia.com/gpu`,
/// spread one per node.
async fn gpu_deployment(pool: &Pool, replicas: u32) -> anyhow::Result<()> {
    let d: Deployment = serde_json::from_value(json!({
        "metadata": {"name": "trainer"},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": "trainer"}},
            "template": {
                "metadata": {"labels": {"app": "trainer", GPU_POD_LABEL: "true"}},
                "spec": {
                    "nodeSelector": {"pool": pool.id},
                    "terminationGracePeriodSeconds": 0,
                    "topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "kubernetes.io/hostname",
                        "whenUnsatisfiable": "ScheduleAnyway", "labelSelector": {"matchLabels": {"app": "trainer"}}}],
                    "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10",
                                    "resources": {"limits": {NVIDIA_GPU_RESOURCE: "1"}}}],
                }
            }
        }
    }))?;
    Api::<Deployment>::namespaced(pool.client.clone(), &pool.apps_ns)
        .create(&PostParams::default(), &d)
        .await?;
    Ok(())
}

/// Waits until `count` pods of the apps namespace are Running (one paged LIST a try).
async fn wait_running(pool: &Pool, count: usize) -> anyhow::Result<()> {
    let pods: Api<Pod> = Api::namespaced(pool.client.clone(), &pool.apps_ns);
    let timeout = Duration::from_secs(120 + count as u64 / 20);
    switchyard_e2e::wait::until(&format!("{count} running workload pods"), timeout, || {
        let pods = pods.clone();
        async move {
            let mut running = 0;
            let mut lp = ListParams::default().fields("status.phase=Running").limit(500);
            loop {
                let page = pods.list(&lp).await?;
                running += page.items.iter().filter(|p| p.metadata.deletion_timestamp.is_none()).count();
                match page.metadata.continue_.filter(|c| !c.is_empty()) {
                    Some(c) => lp = lp.continue_token(&c),
                    None => break,
                }
            }
            if running < count {
                // A paged LIST of the whole namespace is work for the API server the pool is
                // sharing: at 50,000 pods, one every 10 s, not one every poll.
                tokio::time::sleep(Duration::from_millis(count as u64 / 5)).await;
            }
            Ok((running >= count).then_some(()))
        }
    })
    .await
}
