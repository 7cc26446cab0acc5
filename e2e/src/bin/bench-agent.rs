//! `make bench`, driver-agent part: runs the real `switchyard-driver-agent` for one simulated node
//! (8 GPUs in MIG mode with 7 `1g.10gb` devices each by default) against the running cluster and
//! measures
//! - event to taint: from the moment `POST /faults` returns to the moment a watch on the node's
//!   ResourceSlices shows the change (taint set for `xid 79`, taint gone for `recover`), over
//!   alternating fault and recovery events on varied GPUs and MIG devices;
//! - the agent's resident memory (`VmRSS`, `VmHWM` in `/proc/<pid>/status`);
//! - the agent's CPU use while idle (`utime + stime` from `/proc/<pid>/stat` over a window with
//!   no events).
//!
//! The cluster comes from `SWITCHYARD_E2E_KUBECONFIG` (as for the e2e tests), the agent binary
//! from `SWITCHYARD_AGENT_BIN`. Everything it creates carries unique names and is deleted at the
//! end.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Parser;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::api::resource::v1::ResourceSlice;
use kube::api::{DeleteParams, ListParams, PostParams, WatchEvent, WatchParams};
use kube::{Api, Client, ResourceExt};
use serde_json::json;
use switchyard_e2e::cluster::{self, unique};
use switchyard_e2e::measure::{cpu_time, percentile, proc_status};
use switchyard_e2e::sim::{
    AgentSettings, DaemonSetKey, GpuLayout, LABEL_INSTANCE, SimConfig, SimNode, Simulator,
    placeholder_daemon_set,
};
use switchyard_e2e::wait;
use switchyard_operator::well_known;

/// From creating the DaemonSet to the agent's first publication, on a busy 2-core machine.
const AGENT_UP: Duration = Duration::from_secs(120);
/// Longest wait for one event to show in the API before the run counts as failed.
const EVENT_TIMEOUT: Duration = Duration::from_secs(30);
/// Server-side limit of the slice watch; well above the run's length (the API caps it below 300).
const WATCH_SECONDS: u32 = 290;
/// Lets the agent finish start-up work (first publication, allocator warm-up) before memory and
/// CPU are read.
const SETTLE: Duration = Duration::from_secs(5);
const DAEMONSET: &str = "gpu-driver";

#[derive(Parser)]
#[command(about = "Event-to-taint latency, memory and idle CPU of the driver agent on a simulated node")]
struct Args {
    /// Events to measure; they alternate xid 79 and recover.
    #[arg(long, default_value_t = 100)]
    events: usize,
    /// GPUs on the node, all in MIG mode.
    #[arg(long, default_value_t = 8)]
    gpus: u32,
    /// `1g.10gb` MIG devices per GPU.
    #[arg(long, default_value_t = 7)]
    mig_per_gpu: usize,
    /// Length of the idle window for the CPU figure.
    #[arg(long, default_value_t = 30)]
    idle_seconds: u64,
}

/// What one run measured.
struct Figures {
    /// (event, latency) in order.
    latencies: Vec<(&'static str, Duration)>,
    post_round_trips: Vec<Duration>,
    rss_after_start_kib: u64,
    rss_after_events_kib: u64,
    rss_after_idle_kib: u64,
    hwm_kib: u64,
    idle_cpu: Duration,
    idle_window: Duration,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    anyhow::ensure!(args.events > 0 && args.gpus > 0 && args.mig_per_gpu > 0, "counts must be positive");
    let client = cluster::client().await?;
    let id = unique("bench-agent");
    let driver = format!("gpu.{id}.example.com");
    let work_dir = std::env::temp_dir().join(format!("switchyard-bench-{id}"));
    let bin = cluster::agent_bin();
    let mut config = SimConfig::new(id.clone());
    config.dra_driver = Some(DaemonSetKey { namespace: id.clone(), name: DAEMONSET.into() });
    config.driver_name = driver.clone();
    config.agent = Some(AgentSettings {
        bin: bin.clone(),
        kubeconfig: cluster::kubeconfig().to_path_buf(),
        work_dir: work_dir.clone(),
        // No hold: a recovery clears the taint at once, so that it is an event to measure too.
        health_hold_seconds: 0,
        device_plugin_interlock: true,
        renamed_gpu_resource: None,
    });
    let sim = Simulator::start(client.clone(), config).await?;
    let node = format!("{id}-n");
    let bench = Bench { client, sim, id, driver, node, args };
    let result = bench.run().await;
    if let Ok(figures) = &result {
        report(&bench.args, &bin, figures);
    }
    bench.cleanup(&work_dir, result.is_ok()).await;
    result.map(|_| ())
}

struct Bench {
    client: Client,
    sim: Simulator,
    id: String,
    driver: String,
    node: String,
    args: Args,
}

impl Bench {
    fn slices(&self) -> Api<ResourceSlice> {
        Api::all(self.client.clone())
    }

    fn fields(&self) -> String {
        format!("spec.nodeName={},spec.driver={}", self.node, self.driver)
    }

    fn device_count(&self) -> usize {
        self.args.gpus as usize * self.args.mig_per_gpu
    }

    async fn run(&self) -> anyhow::Result<Figures> {
        self.up().await?;
        let pid = self.sim.agent_pid(&self.node).await.context("the agent runs")?;
        tokio::time::sleep(SETTLE).await;
        let rss_after_start_kib = proc_status(pid, "VmRSS")?;

        let (latencies, post_round_trips) = self.events().await?;
        let rss_after_events_kib = proc_status(pid, "VmRSS")?;

        tokio::time::sleep(SETTLE).await;
        let window = Duration::from_secs(self.args.idle_seconds);
        let (cpu0, t0) = (cpu_time(pid)?, Instant::now());
        tokio::time::sleep(window).await;
        let (cpu1, idle_window) = (cpu_time(pid)?, t0.elapsed());
        anyhow::ensure!(
            self.sim.agent_pid(&self.node).await == Some(pid),
            "the agent restarted during the run"
        );
        Ok(Figures {
            latencies,
            post_round_trips,
            rss_after_start_kib,
            rss_after_events_kib,
            rss_after_idle_kib: proc_status(pid, "VmRSS")?,
            hwm_kib: proc_status(pid, "VmHWM")?,
            idle_cpu: cpu1.saturating_sub(cpu0),
            idle_window,
        })
    }

    /// The namespace, the node, the DRA-driver DaemonSet, and the agent's first publication.
    async fn up(&self) -> anyhow::Result<()> {
        cluster::create_namespace(&self.client, &self.id).await?;
        let profiles = vec!["1g.10gb"; self.args.mig_per_gpu];
        let layout = GpuLayout::mig(self.args.gpus, &profiles);
        self.sim.add_node(SimNode { name: self.node.clone(), labels: BTreeMap::new(), layout }).await?;
        let ds = placeholder_daemon_set(DAEMONSET, json!({LABEL_INSTANCE: self.id}), json!({}))?;
        Api::<DaemonSet>::namespaced(self.client.clone(), &self.id)
            .create(&PostParams::default(), &ds)
            .await?;
        let want = self.device_count();
        wait::until(&format!("the agent to publish {want} devices"), AGENT_UP, || async move {
            let list = self.slices().list(&ListParams::default().fields(&self.fields())).await?;
            Ok(devices(list.items.iter()).len().eq(&want).then_some(()))
        })
        .await
    }

    /// Injects the events one at a time and times each until the watch shows it.
    #[allow(clippy::type_complexity)]
    async fn events(&self) -> anyhow::Result<(Vec<(&'static str, Duration)>, Vec<Duration>)> {
        let url = self.sim.agent_fault_url(&self.node).await.context("the agent runs")?;
        let slices = self.slices();
        let list = slices.list(&ListParams::default().fields(&self.fields())).await?;
        let rv = list.metadata.resource_version.clone().unwrap_or_default();
        let mut current: BTreeMap<String, ResourceSlice> =
            list.items.into_iter().map(|s| (s.name_any(), s)).collect();
        let wp = WatchParams::default().fields(&self.fields()).timeout(WATCH_SECONDS);
        let mut watch = slices.watch(&wp, &rv).await?.boxed();
        let xid_key = format!("{}/{}", self.driver, well_known::TAINT_KEY_XID);

        let mut latencies = Vec::with_capacity(self.args.events);
        let mut round_trips = Vec::with_capacity(self.args.events);
        for i in 0..self.args.events {
            let (target, affected) = self.target(i / 2);
            let fault = i.is_multiple_of(2);
            let body = if fault {
                json!({"device": target, "kind": "xid", "xid": 79})
            } else {
                json!({"device": target, "kind": "recover"})
            };
            let sent = Instant::now();
            let (status, _) = switchyard_e2e::measure::http("POST", &url, Some(&body)).await?;
            let posted = Instant::now();
            anyhow::ensure!(status == 202, "POST {body} answered {status}");
            let shows = |current: &BTreeMap<String, ResourceSlice>| {
                let devices = devices(current.values());
                affected.iter().all(|name| {
                    let tainted = devices.get(name).and_then(|d| d.taints.as_ref()).is_some_and(|ts| {
                        ts.iter().any(|t| {
                            t.key == xid_key && t.value.as_deref() == Some("79") && t.effect == "NoSchedule"
                        })
                    });
                    tainted == fault
                })
            };
            while !shows(&current) {
                let event = tokio::time::timeout(EVENT_TIMEOUT, watch.try_next())
                    .await
                    .with_context(|| format!("event {i} ({body}) did not show in {EVENT_TIMEOUT:?}"))??
                    .context("the slice watch ended")?;
                match event {
                    WatchEvent::Added(s) | WatchEvent::Modified(s) => {
                        current.insert(s.name_any(), s);
                    }
                    WatchEvent::Deleted(s) => {
                        current.remove(&s.name_any());
                    }
                    WatchEvent::Bookmark(_) => {}
                    WatchEvent::Error(e) => anyhow::bail!("the slice watch failed: {e}"),
                }
            }
            latencies.push((if fault { "xid 79" } else { "recover" }, posted.elapsed()));
            round_trips.push(posted - sent);
        }
        Ok((latencies, round_trips))
    }

    /// The device event pair `pair` goes to, and the published devices it changes: whole GPUs
    /// (all their MIG devices) and single MIG devices in turn, cycling over the GPUs.
    fn target(&self, pair: usize) -> (String, Vec<String>) {
        let gpus = self.args.gpus as usize;
        let (g, n) = (pair % gpus, pair % self.args.mig_per_gpu);
        if (pair / gpus).is_multiple_of(2) {
            let all = (0..self.args.mig_per_gpu).map(|m| format!("gpu-{g}-mig-1g10gb-{m}")).collect();
            (format!("gpu-{g}"), all)
        } else {
            let one = format!("gpu-{g}-mig-1g10gb-{n}");
            (one.clone(), vec![one])
        }
    }

    /// Deletes the namespace (the simulator stops the agent when its pod goes), then the node.
    async fn cleanup(self, work_dir: &Path, passed: bool) {
        let _ = Api::<Namespace>::all(self.client.clone()).delete(&self.id, &DeleteParams::default()).await;
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), &self.id);
        let _ = wait::until("the benchmark's pods to be gone", AGENT_UP, || {
            let pods = pods.clone();
            async move { Ok(pods.list(&ListParams::default()).await?.items.is_empty().then_some(())) }
        })
        .await;
        if let Err(e) = self.sim.shutdown().await {
            eprintln!("bench-agent: simulator shutdown: {e:#}");
        }
        if passed {
            let _ = std::fs::remove_dir_all(work_dir);
        } else {
            eprintln!("bench-agent: agent inventory and log kept in {}", work_dir.display());
        }
    }
}

fn devices<'a>(
    slices: impl Iterator<Item = &'a ResourceSlice>,
) -> BTreeMap<String, &'a k8s_openapi::api::resource::v1::Device> {
    slices.flat_map(|s| s.spec.devices.iter().flatten()).map(|d| (d.name.clone(), d)).collect()
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1000.0)
}

fn summary(name: &str, mut v: Vec<Duration>) -> String {
    v.sort();
    format!(
        "{name:<22} n={:<3} p50 {:>9}  p99 {:>9}  max {:>9}",
        v.len(),
        ms(percentile(&v, 50.0)),
        ms(percentile(&v, 99.0)),
        ms(*v.last().unwrap_or(&Duration::ZERO))
    )
}

fn report(args: &Args, bin: &Path, f: &Figures) {
    let of = |kind: &str| f.latencies.iter().filter(|(k, _)| *k == kind).map(|(_, d)| *d).collect::<Vec<_>>();
    println!(
        "driver agent {} on 1 node: {} GPUs x {} MIG 1g.10gb = {} devices, hold 0 s",
        bin.display(),
        args.gpus,
        args.mig_per_gpu,
        args.gpus as usize * args.mig_per_gpu
    );
    println!("event to taint visible (from POST return to the slice watch event):");
    println!("  {}", summary("all events", f.latencies.iter().map(|(_, d)| *d).collect()));
    println!("  {}", summary("xid 79 (taint set)", of("xid 79")));
    println!("  {}", summary("recover (taint gone)", of("recover")));
    println!("  {}", summary("POST round trip", f.post_round_trips.clone()));
    println!(
        "memory: VmRSS {} KiB after start-up, {} KiB after the events, {} KiB after idling; VmHWM {} KiB",
        f.rss_after_start_kib, f.rss_after_events_kib, f.rss_after_idle_kib, f.hwm_kib
    );
    let share = f.idle_cpu.as_secs_f64() / f.idle_window.as_secs_f64();
    println!(
        "idle CPU: {:.2} s user+system over {:.1} s = {:.3}% of one core",
        f.idle_cpu.as_secs_f64(),
        f.idle_window.as_secs_f64(),
        share * 100.0
    );
}
