//! The GPU node simulator: the one part of the e2e environment that stands in for the kubelet.
//! Everything else (API server, scheduler, controller manager, etcd) is the real upstream code.
//!
//! What it fakes, exactly:
//! - **Nodes.** It creates Node objects with the given labels and fills their status as a kubelet
//!   would: `Ready=True` (`Ready=False`, `KubeletNotReady`, after `set_ready(node, false)`),
//!   capacity and allocatable for cpu, memory and pods, `nodeInfo` with
//!   kubelet v1.37.2 and containerd 2.1. It renews each node's Lease in `kube-node-lease` and
//!   removes the `node.kubernetes.io/not-ready` taint that admission puts on new nodes.
//! - **Pods.** A pod bound to one of its nodes is marked `Running` and `Ready` (no container runs).
//!   A pod with `restartPolicy: Never` (a canary) is marked `Succeeded`, exit code 0, a second later
//!   (or never, on a node given to [`Simulator::hang_run_once_pods`]).
//!   A deleted pod is removed for good once its `deletionGracePeriodSeconds` have passed, as the
//!   kubelet does after stopping the containers. Like the kubelet, it retries that final DELETE
//!   and every status write until the API server takes it (a pod evicted, or bound, just before
//!   an API-server restart).
//! - **Admission.** Before it marks a pod `Running` it checks, as the kubelet does, that the pod's
//!   device-plugin resources (`nvidia.com/…` without an `extendedResourceClaimStatus`) fit what
//!   the node's plugin advertises less what admitted pods use. A pod that does not fit (one a
//!   scheduler bound from a stale view of the node) is marked `Failed` with the kubelet's
//!   `OutOf<resource>` reason and message.
//! - **The device-plugin role.** While a pod of the configured device-plugin DaemonSet runs on a
//!   node, the node's capacity and allocatable for `nvidia.com/gpu` (and `nvidia.com/mig-<profile>`
//!   for MIG devices) equal its GPUs, times the layout's time-slicing replicas, under
//!   `<name>.shared` with `renameByDefault`. Once that pod is gone, they drop to 0 after a configurable
//!   delay, as the kubelet's device manager does when a plugin unregisters.
//! - **The DRA-plugin role.** While a pod of the configured DRA-driver DaemonSet runs on a node,
//!   one real `switchyard-driver-agent` process runs for that node, with a simulated inventory
//!   written from the node's GPU layout (or, without [`AgentSettings`], a stub publisher writes
//!   one ResourceSlice). When the pod goes, the agent gets SIGTERM and, after the same delay, the
//!   node's slices of that driver are deleted, as the kubelet does when a DRA plugin unregisters.
//!
//! It does not run containers, call CDI, enforce resource limits or report pod metrics.
//!
//! **Light mode** ([`SimConfig::light`], the scale environment of `make bench`): after a node's
//! first status, its heartbeat is one Lease `renewTime` patch and its status is written again only
//! when its device-plugin resources change (a real kubelet also reports status only every few
//! minutes when nothing changes; the node lifecycle controller reads the Lease). Like the
//! kubelet, it posts a node's status again when the node shows a `Ready` other than the one it
//! reports (the node lifecycle controller marked it `Unknown`): a watch on its nodes compares. No agent
//! processes: a DRA node gets the stub slice. Heartbeats, pod status and plugin writes go out side
//! by side, a bounded number at a time, as from many kubelets.
//!
//! Each [`Simulator`] manages only the nodes it created (label [`LABEL_INSTANCE`]), so concurrent
//! tests on one cluster do not step on each other.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::Utc;
use futures::StreamExt;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::resource::v1::ResourceSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, OwnerReference};
use kube::api::{DeleteParams, ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt};
use serde_json::json;
use switchyard_driver_agent::discovery::{Gpu, MigDevice, NodeGpus};
use tokio::sync::Notify;
use tokio::task::JoinSet;

/// Label on every node a simulator creates, with the simulator's instance name.
pub const LABEL_INSTANCE: &str = "sim.switchyard.dev/instance";
/// Annotation recording a simulated node's GPU layout, so that a restarted simulator keeps it.
pub const ANNOTATION_LAYOUT: &str = "sim.switchyard.dev/gpu-layout";
/// Field manager for the simulator's writes.
const FIELD_MANAGER: &str = "switchyard-gpu-node-sim";

/// A DaemonSet whose pods run nothing: the simulator plays the role of the device plugin or the
/// DRA driver on the nodes where its pods land. `node_selector` and `affinity` decide where.
pub fn placeholder_daemon_set(
    name: &str,
    node_selector: serde_json::Value,
    affinity: serde_json::Value,
) -> anyhow::Result<k8s_openapi::api::apps::v1::DaemonSet> {
    Ok(serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "nodeSelector": node_selector,
                    "affinity": affinity,
                    // As the GPU Operator's device plugin and config/agent do: GPU nodes are
                    // often tainted.
                    "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
                    "terminationGracePeriodSeconds": 1,
                    "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10"}],
                }
            }
        }
    }))?)
}

/// How often leases and node heartbeats are renewed: the kubelet's default lease renewal
/// interval is 10s against a 40s grace period in the node lifecycle controller.
const HEARTBEAT: Duration = Duration::from_secs(10);

/// Light mode's Lease renewal interval: twice the kubelet's, still well inside the node lifecycle
/// controller's grace period (50 s; the Lease says 40 s). 5,000 nodes renewing every 10 s are 500
/// writes a second, more than half of what the 2-core scale environment's API server serves while
/// a migration runs; every 20 s they are 250.
const LIGHT_HEARTBEAT: Duration = Duration::from_secs(20);

/// A DaemonSet, by namespace and name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DaemonSetKey {
    pub namespace: String,
    pub name: String,
}

/// The GPUs of one simulated node.
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize, PartialEq, Eq)]
pub struct GpuLayout {
    /// Full GPUs, advertised as `nvidia.com/gpu` (or [`GpuLayout::gpu_resource`]).
    pub gpus: u32,
    /// GPUs in MIG mode, each with its MIG profiles (for example seven `1g.10gb`). The device
    /// plugin advertises them as `nvidia.com/mig-<profile>` (its mixed strategy).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mig_gpus: Vec<Vec<String>>,
    /// Product name published in DRA attributes.
    #[serde(default = "default_product")]
    pub product: String,
    /// Time-slicing replicas per device (0 or 1: not shared): per full GPU and per MIG device.
    /// The device plugin then advertises `devices × replicas` of each resource, as its
    /// `sharing.timeSlicing` config does; the driver still discovers the devices.
    #[serde(default, skip_serializing_if = "is_unshared")]
    pub time_slicing_replicas: u32,
    /// The device plugin's `renameByDefault`: a shared resource is advertised as `<name>.shared`
    /// (`nvidia.com/gpu.shared`). Only with `time_slicing_replicas` above 1.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub rename_by_default: bool,
    /// The name full GPUs are advertised under when not `nvidia.com/gpu`: what the device
    /// plugin's `resources.gpus[].name` config renames them to (`nvidia.com/<name>`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_resource: Option<String>,
}

fn is_unshared(replicas: &u32) -> bool {
    *replicas <= 1
}

fn default_product() -> String {
    "NVIDIA A100-SXM4-80GB".into()
}

/// Memory and multiprocessors of an A100 80GB MIG profile, for the simulated inventory.
fn mig_profile_size(profile: &str) -> (u64, u32) {
    let slices: u64 = profile.split('g').next().and_then(|n| n.parse().ok()).unwrap_or(1);
    let gib: u64 =
        profile.split('.').nth(1).and_then(|m| m.trim_end_matches("gb").parse().ok()).unwrap_or(10);
    (gib << 30, u32::try_from(slices * 14).unwrap_or(14))
}

impl GpuLayout {
    /// `n` full GPUs of the default product.
    pub fn gpus(n: u32) -> Self {
        Self {
            gpus: n,
            mig_gpus: Vec::new(),
            product: default_product(),
            time_slicing_replicas: 0,
            rename_by_default: false,
            gpu_resource: None,
        }
    }

    /// `n` GPUs in MIG mode, each split into `profiles`.
    pub fn mig(n: u32, profiles: &[&str]) -> Self {
        let per_gpu: Vec<String> = profiles.iter().map(|p| (*p).to_owned()).collect();
        Self {
            gpus: 0,
            mig_gpus: vec![per_gpu; n as usize],
            product: default_product(),
            time_slicing_replicas: 0,
            rename_by_default: false,
            gpu_resource: None,
        }
    }

    /// The extended resources the device plugin advertises for this layout.
    pub fn device_plugin_resources(&self) -> BTreeMap<String, u32> {
        let replicas = self.time_slicing_replicas.max(1);
        let name = |base: String| {
            if self.rename_by_default && replicas > 1 { format!("{base}.shared") } else { base }
        };
        let mut out = BTreeMap::new();
        if self.gpus > 0 {
            let base =
                self.gpu_resource.as_deref().unwrap_or(switchyard_operator::well_known::NVIDIA_GPU_RESOURCE);
            out.insert(name(base.to_owned()), self.gpus * replicas);
        }
        for profile in self.mig_gpus.iter().flatten() {
            *out.entry(name(format!("nvidia.com/mig-{profile}"))).or_default() += replicas;
        }
        out
    }

    /// The inventory the driver agent's simulated discovery reads for this layout on `node`.
    /// UUIDs derive from the node name, so they are stable across agent restarts.
    pub fn inventory(&self, node: &str) -> NodeGpus {
        let total = self.gpus + u32::try_from(self.mig_gpus.len()).unwrap_or(0);
        let gpus = (0..total)
            .map(|i| {
                let mig_profiles = i.checked_sub(self.gpus).and_then(|m| self.mig_gpus.get(m as usize));
                let mig = mig_profiles
                    .into_iter()
                    .flatten()
                    .enumerate()
                    .map(|(n, profile)| {
                        let (memory_bytes, multiprocessors) = mig_profile_size(profile);
                        let n = u32::try_from(n).unwrap_or(0);
                        MigDevice {
                            uuid: format!("MIG-{node}-{i}-{n}"),
                            profile: profile.clone(),
                            memory_bytes,
                            multiprocessors,
                            gi: n + 1,
                            ci: 0,
                            gi_cap_minor: None,
                            ci_cap_minor: None,
                        }
                    })
                    .collect::<Vec<_>>();
                Gpu {
                    index: i,
                    minor: i,
                    uuid: format!("GPU-{node}-{i}"),
                    product_name: self.product.clone(),
                    brand: Some("Nvidia".into()),
                    architecture: Some("Ampere".into()),
                    cuda_compute_capability: Some("8.0".into()),
                    memory_bytes: 80 << 30,
                    pci_bus_id: Some(format!("0000:{:02x}:00.0", 0x10 + i)),
                    pcie_root: Some(format!("pci0000:{:02x}", i / 4)),
                    numa_node: Some(i / 4),
                    mig_enabled: Some(!mig.is_empty()),
                    mig,
                    lost: false,
                }
            })
            .collect();
        NodeGpus { driver_version: "570.124.06".into(), cuda_driver_version: "12.8".into(), gpus }
    }
}

/// A node to create.
#[derive(Clone, Debug)]
pub struct SimNode {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub layout: GpuLayout,
}

/// What the simulator plays besides plain nodes and pods.
#[derive(Clone, Debug)]
pub struct SimConfig {
    /// Distinguishes this simulator's nodes from other simulators' on the same cluster.
    pub instance: String,
    /// The device-plugin DaemonSet whose pods make a node advertise `nvidia.com/gpu`.
    pub device_plugin: Option<DaemonSetKey>,
    /// The DRA-driver DaemonSet whose pods make a node publish ResourceSlices.
    pub dra_driver: Option<DaemonSetKey>,
    /// The DRA driver name published in slices.
    pub driver_name: String,
    /// Delay between a plugin pod going away and its resources disappearing.
    pub unregister_delay: Duration,
    /// Run the real driver agent for DRA nodes; `None` publishes a stub slice instead.
    pub agent: Option<AgentSettings>,
    /// The scale environment's light mode: after a node's first status, the heartbeat renews only
    /// its Lease (one request, as the kubelet between status reports), and the status is written
    /// again only when its GPU resources change. See [`SimConfig::light`].
    pub light: bool,
}

/// How the simulator runs `switchyard-driver-agent` for a node, in simulated-inventory mode.
#[derive(Clone, Debug)]
pub struct AgentSettings {
    /// The agent binary.
    pub bin: std::path::PathBuf,
    /// Kubeconfig the agent uses (the real agent uses its ServiceAccount).
    pub kubeconfig: std::path::PathBuf,
    /// Directory for the per-node inventory files and agent logs.
    pub work_dir: std::path::PathBuf,
    /// `--health-hold-seconds` for the agent.
    pub health_hold_seconds: u64,
    /// Run the agent with its device-plugin interlock (the default `--device-plugin-resources`).
    /// Without it (`--device-plugin-resources=`) the agent plays a driver that has none, as
    /// NVIDIA's `gpu.nvidia.com` has none: it publishes untainted devices as soon as it starts.
    pub device_plugin_interlock: bool,
    /// A name the device plugin's config renamed GPUs to, which the interlock watches besides
    /// the default names (`--device-plugin-resources`, as a user with such a config sets it).
    pub renamed_gpu_resource: Option<String>,
}

/// The agent's `--device-plugin-resources` for `settings`: none (the default names), the default
/// names and a renamed one, or empty (no interlock).
fn interlock_flag(settings: &AgentSettings) -> Option<String> {
    match (&settings.renamed_gpu_resource, settings.device_plugin_interlock) {
        (_, false) => Some("--device-plugin-resources=".to_owned()),
        (None, true) => None,
        (Some(renamed), true) => {
            let mut names: Vec<&str> = switchyard_operator::well_known::DEVICE_PLUGIN_GPU_RESOURCES.to_vec();
            names.push(renamed);
            Some(format!("--device-plugin-resources={}", names.join(",")))
        }
    }
}

/// A running agent process for one node.
struct AgentProcess {
    child: tokio::process::Child,
    fault_addr: std::net::SocketAddr,
}

impl SimConfig {
    pub fn new(instance: impl Into<String>) -> Self {
        Self {
            instance: instance.into(),
            device_plugin: None,
            dra_driver: None,
            driver_name: switchyard_operator::well_known::DEFAULT_DRIVER_NAME.to_owned(),
            unregister_delay: Duration::from_secs(1),
            agent: None,
            light: false,
        }
    }

    /// A simulator for thousands of nodes on 2 cores: light heartbeats (Lease only), stub slices
    /// instead of agent processes. What it still plays exactly: pods Running and deleted, the
    /// device-plugin resources and the slices following the plugin pods, the unregister delay.
    pub fn light(instance: impl Into<String>) -> Self {
        Self { light: true, ..Self::new(instance) }
    }
}

/// Which plugin a pod plays on its node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Role {
    DevicePlugin,
    DraDriver,
    Workload,
}

#[derive(Default)]
struct State {
    /// Managed nodes and their layouts.
    nodes: HashMap<String, GpuLayout>,
    /// Running plugin pods by uid: (node, role).
    plugins: HashMap<String, (String, Role)>,
    /// Nodes whose agent a test stopped on purpose; it is not restarted until started again.
    held_agents: std::collections::HashSet<String>,
    /// Nodes whose run-to-completion pods never exit.
    hung_run_once: std::collections::HashSet<String>,
    /// Nodes whose kubelet a test made report NotReady.
    not_ready: std::collections::HashSet<String>,
    /// Nodes whose device-plugin resources are advertised (or about to be): what the kubelet's
    /// device manager can hand out there.
    device_plugin_serving: std::collections::HashSet<String>,
    /// Nodes a device plugin has served: the kubelet's device manager keeps their resources in
    /// capacity after the plugin leaves (for its 5-minute grace period; the simulator for the
    /// node's life), and drops only allocatable.
    device_plugin_registered: std::collections::HashSet<String>,
    /// Pods admitted with device-plugin resources, by uid: (node, resources). What is in use on
    /// a node when the next one asks.
    admitted: HashMap<String, (String, BTreeMap<String, u32>)>,
}

impl State {
    fn ready(&self, node: &str) -> bool {
        !self.not_ready.contains(node)
    }

    /// The kubelet's admission of `pod` on `node` for its device-plugin resources. Admitted, the
    /// pod's resources count as used until it goes; rejected, the reason and message the kubelet
    /// gives. A pod the scheduler served through a claim (`extendedResourceClaimStatus`) is DRA's
    /// and admitted here.
    fn admit(&mut self, node: &str, pod: &Pod) -> Result<(), Rejection> {
        let uid = pod.uid().unwrap_or_default();
        if self.admitted.contains_key(&uid) {
            return Ok(());
        }
        let requested = device_plugin_requests(pod);
        if requested.is_empty() {
            return Ok(());
        }
        let capacity = match self.nodes.get(node) {
            Some(layout) if self.device_plugin_serving.contains(node) => layout.device_plugin_resources(),
            _ => BTreeMap::new(),
        };
        let mut used: BTreeMap<&str, u32> = BTreeMap::new();
        for (n, res) in self.admitted.values() {
            if n == node {
                for (r, q) in res {
                    *used.entry(r.as_str()).or_default() += q;
                }
            }
        }
        admission(&requested, &capacity, &used)?;
        self.admitted.insert(uid, (node.to_owned(), requested));
        Ok(())
    }
}

/// Why the kubelet rejected a pod at admission: the pod's status reason and message.
#[derive(Debug, PartialEq, Eq)]
struct Rejection {
    reason: String,
    message: String,
}

/// The device-plugin resources (`nvidia.com/…`) `pod` asks for, summed over its containers; none
/// when the scheduler served them through a claim.
fn device_plugin_requests(pod: &Pod) -> BTreeMap<String, u32> {
    let mut out = BTreeMap::new();
    if pod.status.as_ref().is_some_and(|s| s.extended_resource_claim_status.is_some()) {
        return out;
    }
    for c in pod.spec.iter().flat_map(|s| &s.containers) {
        let Some(r) = c.resources.as_ref() else { continue };
        // Extended resources have requests equal to limits; either may be the one given.
        for (name, q) in r.limits.iter().chain(r.requests.iter()).flatten() {
            if name.starts_with("nvidia.com/") {
                let n = q.0.parse::<u32>().unwrap_or(0);
                let e = out.entry(name.clone()).or_insert(0);
                *e = (*e).max(n);
            }
        }
    }
    out.retain(|_, n| *n > 0);
    out
}

/// The kubelet's resource check at admission (its `OutOf<resource>` rejection) for device-plugin
/// resources: each request must fit in the capacity the node's plugin advertises less what
/// admitted pods use. Pure.
fn admission(
    requested: &BTreeMap<String, u32>,
    capacity: &BTreeMap<String, u32>,
    used: &BTreeMap<&str, u32>,
) -> Result<(), Rejection> {
    for (res, &want) in requested {
        let cap = capacity.get(res).copied().unwrap_or(0);
        let in_use = used.get(res.as_str()).copied().unwrap_or(0);
        if want > cap.saturating_sub(in_use) {
            return Err(Rejection {
                reason: format!("OutOf{res}"),
                message: format!(
                    "Pod was rejected: Node didn't have enough resource: {res}, requested: {want}, used: {in_use}, capacity: {cap}"
                ),
            });
        }
    }
    Ok(())
}

type Agents = Arc<tokio::sync::Mutex<HashMap<String, AgentProcess>>>;

/// A running simulator. Dropping it stops its tasks; [`Simulator::shutdown`] also deletes its nodes.
pub struct Simulator {
    client: Client,
    config: SimConfig,
    state: Arc<Mutex<State>>,
    changed: Arc<Notify>,
    agents: Agents,
    tasks: JoinSet<()>,
}

impl Simulator {
    /// Starts the simulator's loops. Nodes left by an earlier simulator with the same instance
    /// name are adopted.
    pub async fn start(client: Client, config: SimConfig) -> anyhow::Result<Self> {
        let state = Arc::new(Mutex::new(State::default()));
        let nodes: Api<Node> = Api::all(client.clone());
        let selector = format!("{LABEL_INSTANCE}={}", config.instance);
        for node in nodes.list(&ListParams::default().labels(&selector)).await? {
            let layout = node
                .annotations()
                .get(ANNOTATION_LAYOUT)
                .and_then(|a| serde_json::from_str(a).ok())
                .unwrap_or_default();
            state.lock().unwrap().nodes.insert(node.name_any(), layout);
        }
        let agents: Agents = Default::default();
        let mut sim = Self {
            client,
            config,
            state,
            changed: Arc::new(Notify::new()),
            agents: agents.clone(),
            tasks: JoinSet::new(),
        };
        sim.tasks.spawn(heartbeat_loop(sim.client.clone(), sim.config.clone(), sim.state.clone()));
        if sim.config.light {
            sim.tasks.spawn(status_repost_loop(sim.client.clone(), sim.config.clone(), sim.state.clone()));
        }
        sim.tasks.spawn(pod_loop(
            sim.client.clone(),
            sim.config.clone(),
            sim.state.clone(),
            sim.changed.clone(),
        ));
        sim.tasks.spawn(plugin_loop(
            sim.client.clone(),
            sim.config.clone(),
            sim.state.clone(),
            sim.changed.clone(),
            agents,
        ));
        Ok(sim)
    }

    /// The simulator's configuration.
    pub fn config(&self) -> &SimConfig {
        &self.config
    }

    /// Creates a Ready node with the given GPUs.
    pub async fn add_node(&self, spec: SimNode) -> anyhow::Result<Node> {
        let nodes: Api<Node> = Api::all(self.client.clone());
        let mut labels = spec.labels.clone();
        labels.insert("kubernetes.io/hostname".into(), spec.name.clone());
        labels.insert("kubernetes.io/os".into(), "linux".into());
        labels.insert("kubernetes.io/arch".into(), "amd64".into());
        labels.insert(LABEL_INSTANCE.into(), self.config.instance.clone());
        let node = Node {
            metadata: ObjectMeta {
                name: Some(spec.name.clone()),
                labels: Some(labels),
                annotations: Some(BTreeMap::from([(
                    ANNOTATION_LAYOUT.to_owned(),
                    serde_json::to_string(&spec.layout)?,
                )])),
                ..Default::default()
            },
            ..Default::default()
        };
        let created = nodes.create(&PostParams::default(), &node).await?;
        self.state.lock().unwrap().nodes.insert(spec.name.clone(), spec.layout.clone());
        heartbeat(&self.client, &spec.name, None, true).await?;
        self.changed.notify_one();
        Ok(created)
    }

    /// The fault-injection URL (`POST /faults`) of the agent running for `node`, if one runs.
    pub async fn agent_fault_url(&self, node: &str) -> Option<String> {
        self.agents.lock().await.get(node).map(|a| format!("http://{}/faults", a.fault_addr))
    }

    /// The process id of the agent running for `node`, if one runs.
    pub async fn agent_pid(&self, node: &str) -> Option<u32> {
        self.agents.lock().await.get(node).and_then(|a| a.child.id())
    }

    /// Stops the agent for `node` with SIGTERM, as the kubelet stops a container, waits for it to
    /// exit, and keeps it stopped until [`Simulator::start_agent`]. Returns the exit status.
    pub async fn stop_agent(&self, node: &str) -> anyhow::Result<std::process::ExitStatus> {
        self.state.lock().unwrap().held_agents.insert(node.to_owned());
        let process = self.agents.lock().await.remove(node);
        let Some(process) = process else { anyhow::bail!("no agent runs for {node}") };
        terminate(process).await
    }

    /// Lets the simulator start the agent for `node` again (while its DRA pod runs).
    /// Keeps a node's agent from starting when its node turns DRA, as an agent that cannot start
    /// there (a crash loop, a missing driver) would: the node never publishes its devices.
    pub fn hold_agent(&self, node: &str) {
        self.state.lock().unwrap().held_agents.insert(node.to_owned());
    }

    /// Keeps run-to-completion pods (canaries) on `node` running forever, as a canary whose GPU
    /// job hangs would: the node's verification can only time out.
    pub fn hang_run_once_pods(&self, node: &str) {
        self.state.lock().unwrap().hung_run_once.insert(node.to_owned());
    }

    pub fn start_agent(&self, node: &str) {
        self.state.lock().unwrap().held_agents.remove(node);
        self.changed.notify_one();
    }

    /// Makes a node's kubelet report Ready=False (`KubeletNotReady`), as a kubelet whose runtime
    /// or network is down does, or Ready again. The status is written at once and on every
    /// heartbeat after.
    pub async fn set_ready(&self, node: &str, ready: bool) -> anyhow::Result<()> {
        {
            let mut st = self.state.lock().unwrap();
            if ready {
                st.not_ready.remove(node);
            } else {
                st.not_ready.insert(node.to_owned());
            }
        }
        heartbeat(&self.client, node, None, ready).await
    }

    /// Deletes a node as an admin or a cloud controller does when the machine goes away; the
    /// simulator stops writing its status.
    pub async fn delete_node(&self, node: &str) -> anyhow::Result<()> {
        {
            let mut st = self.state.lock().unwrap();
            st.nodes.remove(node);
            st.device_plugin_registered.remove(node);
        }
        Api::<Node>::all(self.client.clone()).delete(node, &DeleteParams::default()).await?;
        Ok(())
    }

    /// Stops the loops and deletes every node this simulator created (pods on them go with the
    /// garbage collector; slices go by their owner reference to the node).
    pub async fn shutdown(mut self) -> anyhow::Result<()> {
        self.tasks.shutdown().await;
        let agents: Vec<AgentProcess> = self.agents.lock().await.drain().map(|(_, a)| a).collect();
        for agent in agents {
            let _ = terminate(agent).await;
        }
        let nodes: Api<Node> = Api::all(self.client.clone());
        let names: Vec<String> = self.state.lock().unwrap().nodes.keys().cloned().collect();
        for name in names {
            let _ = nodes.delete(&name, &DeleteParams::default()).await;
        }
        Ok(())
    }
}

/// A full heartbeat: the node's status ([`write_status`]), the admission taint lifted, the Lease.
async fn heartbeat(
    client: &Client,
    name: &str,
    gpu_resources: Option<GpuStatus<'_>>,
    ready: bool,
) -> anyhow::Result<()> {
    let node = write_status(client, name, gpu_resources, ready).await?;
    // Admission puts node.kubernetes.io/not-ready on new nodes; the kubelet's Ready status makes
    // the node lifecycle controller lift it, but only on its next pass. Lift it now.
    let taints = node.spec.as_ref().and_then(|s| s.taints.clone()).unwrap_or_default();
    let kept: Vec<_> = taints.iter().filter(|t| !t.key.starts_with("node.kubernetes.io/not-ready")).collect();
    if kept.len() != taints.len() {
        let nodes: Api<Node> = Api::all(client.clone());
        nodes.patch(name, &PatchParams::default(), &Patch::Merge(json!({"spec": {"taints": kept}}))).await?;
    }
    renew_lease(client, name, Some(node.uid().unwrap_or_default())).await
}

/// A node's device-plugin resources as its status shows them.
#[derive(Clone, Copy)]
struct GpuStatus<'a> {
    capacity: &'a BTreeMap<String, u32>,
    allocatable: &'a BTreeMap<String, u32>,
}

/// Writes a node's status as the kubelet would: Ready, capacity and allocatable, nodeInfo. The
/// GPU resources are set only when `gpu_resources` is given; otherwise they are left alone.
/// Returns the node as the server answered.
async fn write_status(
    client: &Client,
    name: &str,
    gpu_resources: Option<GpuStatus<'_>>,
    ready: bool,
) -> anyhow::Result<Node> {
    let now = Utc::now();
    let mut capacity = serde_json::Map::new();
    capacity.insert("cpu".into(), json!("32"));
    capacity.insert("memory".into(), json!("256Gi"));
    capacity.insert("pods".into(), json!("110"));
    let mut allocatable = capacity.clone();
    if let Some(gpus) = gpu_resources {
        for (res, n) in gpus.capacity {
            capacity.insert(res.clone(), json!(n.to_string()));
        }
        for (res, n) in gpus.allocatable {
            allocatable.insert(res.clone(), json!(n.to_string()));
        }
    }
    let condition = |t: &str, s: &str, reason: &str| {
        json!({"type": t, "status": s, "reason": reason, "lastHeartbeatTime": now, "lastTransitionTime": now,
               "message": "simulated by switchyard gpu-node-sim"})
    };
    let status = json!({
        "status": {
            "capacity": capacity, "allocatable": allocatable,
            "conditions": [
                if ready {
                    condition("Ready", "True", "KubeletReady")
                } else {
                    condition("Ready", "False", "KubeletNotReady")
                },
                condition("MemoryPressure", "False", "KubeletHasSufficientMemory"),
                condition("DiskPressure", "False", "KubeletHasNoDiskPressure"),
                condition("PIDPressure", "False", "KubeletHasSufficientPID"),
            ],
            "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}, {"type": "Hostname", "address": name}],
            "nodeInfo": {
                "machineID": name, "systemUUID": name, "bootID": "sim", "kernelVersion": "6.1.0-sim",
                "osImage": "Simulated GPU node", "containerRuntimeVersion": "containerd://2.1.4",
                "kubeletVersion": "v1.37.2", "kubeProxyVersion": "", "operatingSystem": "linux",
                "architecture": "amd64"
            },
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}}
        }
    });
    let nodes: Api<Node> = Api::all(client.clone());
    Ok(nodes.patch_status(name, &PatchParams::default(), &Patch::Merge(&status)).await?)
}

/// Renews the node's Lease in `kube-node-lease`, as the kubelet does every 10 s. With the node's
/// uid (a full heartbeat) the whole Lease is applied, owner reference included; without it (a
/// light heartbeat) only `renewTime` is patched, one small request.
async fn renew_lease(client: &Client, name: &str, node_uid: Option<String>) -> anyhow::Result<()> {
    let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-node-lease");
    let now = MicroTime(k8s_openapi::jiff::Timestamp::now());
    let Some(uid) = node_uid else {
        let renew = json!({"spec": {"renewTime": now}});
        leases.patch(name, &PatchParams::default(), &Patch::Merge(&renew)).await?;
        return Ok(());
    };
    let lease = Lease {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            owner_references: Some(vec![OwnerReference {
                api_version: "v1".into(),
                kind: "Node".into(),
                name: name.to_owned(),
                uid,
                ..Default::default()
            }]),
            ..Default::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(name.to_owned()),
            lease_duration_seconds: Some(40),
            renew_time: Some(now),
            ..Default::default()
        }),
    };
    leases.patch(name, &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(&lease)).await?;
    Ok(())
}

async fn heartbeat_loop(client: Client, config: SimConfig, state: Arc<Mutex<State>>) {
    let period = if config.light { LIGHT_HEARTBEAT } else { HEARTBEAT };
    let mut round = tokio::time::interval(period);
    // A round that overran (a loaded API server) is followed at once by the next, not by a burst.
    round.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    round.tick().await;
    loop {
        let start = round.tick().await;
        let nodes: Vec<(String, bool)> = {
            let st = state.lock().unwrap();
            st.nodes.keys().map(|n| (n.clone(), st.ready(n))).collect()
        };
        // Nodes are independent, as kubelets are: each renews on its own period, spread over
        // the round rather than all at its start, a bounded number in flight at once. A node's
        // renewals are one period apart (a round started on the period), whatever the round's
        // size, so thousands of nodes keep their Leases well inside the 40 s grace period.
        let count = u32::try_from(nodes.len()).unwrap_or(u32::MAX).max(1);
        futures::stream::iter(nodes.into_iter().enumerate())
            .map(|(i, (name, ready))| {
                let client = client.clone();
                let slot = start
                    + period.mul_f64(f64::from(u32::try_from(i).unwrap_or(u32::MAX)) / f64::from(count));
                async move {
                    tokio::time::sleep_until(slot).await;
                    let result = if config.light {
                        renew_lease(&client, &name, None).await
                    } else {
                        heartbeat(&client, &name, None, ready).await
                    };
                    if let Err(e) = result {
                        tracing::warn!(node = %name, error = %e, "heartbeat failed");
                    }
                }
            })
            .buffer_unordered(HEARTBEAT_CONCURRENCY)
            .collect::<()>()
            .await;
    }
}

/// Light mode's answer to the node lifecycle controller: the kubelet compares the status it
/// computes with the node's, and posts it again when they differ, so a node marked `Unknown`
/// (its Lease renewed late, on a loaded API server) is `Ready` again within a heartbeat. The light
/// heartbeat writes only the Lease, so a watch on the simulator's nodes does the comparing: a node
/// whose `Ready` is not what the simulator reports gets its status written again. Its cost is the
/// watch's events, which in light mode are the node writes of the migration itself.
async fn status_repost_loop(client: Client, config: SimConfig, state: Arc<Mutex<State>>) {
    let nodes: Api<Node> = Api::all(client.clone());
    let selector = format!("{LABEL_INSTANCE}={}", config.instance);
    let mut stream =
        switchyard_api::watch::backed_off(watcher(nodes, watcher::Config::default().labels(&selector)))
            .boxed();
    let reposting: Arc<Mutex<std::collections::HashSet<String>>> = Default::default();
    while let Some(event) = stream.next().await {
        let node = match event {
            Ok(watcher::Event::Apply(n) | watcher::Event::InitApply(n)) => n,
            Ok(_) => continue,
            Err(e) => {
                tracing::debug!(error = %e, "node watch error; the watcher retries");
                continue;
            }
        };
        let name = node.name_any();
        let Some(ready) = ({
            let st = state.lock().unwrap();
            st.nodes.contains_key(&name).then(|| st.ready(&name))
        }) else {
            continue;
        };
        let shown = node
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
            .map(|c| c.status.clone());
        // No conditions yet: the node's first heartbeat is on its way.
        let Some(shown) = shown else { continue };
        if (shown == "True") == ready || !reposting.lock().unwrap().insert(name.clone()) {
            continue;
        }
        let (client, reposting) = (client.clone(), reposting.clone());
        tokio::spawn(async move {
            tracing::info!(node = %name, shown = %shown, "node status posted again");
            if let Err(e) = write_status(&client, &name, None, ready).await {
                tracing::warn!(node = %name, error = %e, "could not post the node status again");
            }
            reposting.lock().unwrap().remove(&name);
        });
    }
}

/// Heartbeats in flight at once.
const HEARTBEAT_CONCURRENCY: usize = 64;

fn role_of(pod: &Pod, config: &SimConfig) -> Role {
    let owner = pod.owner_references().iter().find(|o| o.kind == "DaemonSet").map(|o| o.name.as_str());
    let is = |key: &Option<DaemonSetKey>| {
        key.as_ref().is_some_and(|k| {
            Some(k.name.as_str()) == owner && pod.namespace().as_deref() == Some(&k.namespace)
        })
    };
    if is(&config.device_plugin) {
        Role::DevicePlugin
    } else if is(&config.dra_driver) {
        Role::DraDriver
    } else {
        Role::Workload
    }
}

/// Watches pods on managed nodes: marks new ones Running, finishes deletions, and tracks which
/// plugin pods run where.
async fn pod_loop(client: Client, config: SimConfig, state: Arc<Mutex<State>>, changed: Arc<Notify>) {
    let pods: Api<Pod> = Api::all(client.clone());
    let mut stream = switchyard_api::watch::backed_off(watcher(
        pods.clone(),
        watcher::Config::default().fields("spec.nodeName!="),
    ))
    .boxed();
    let mut finishing: HashMap<String, tokio::task::JoinHandle<()>> = HashMap::new();
    let mut completing = std::collections::HashSet::new();
    // Pods whose Running status is being written, and the writes in flight at once.
    let marking: Arc<Mutex<std::collections::HashSet<String>>> = Default::default();
    let slots = Arc::new(tokio::sync::Semaphore::new(WRITE_CONCURRENCY));
    while let Some(event) = stream.next().await {
        let pod = match event {
            Ok(watcher::Event::Apply(pod) | watcher::Event::InitApply(pod)) => pod,
            Ok(watcher::Event::Delete(pod)) => {
                let uid = pod.uid().unwrap_or_default();
                {
                    let mut st = state.lock().unwrap();
                    st.admitted.remove(&uid);
                    if st.plugins.remove(&uid).is_some() {
                        changed.notify_one();
                    }
                }
                continue;
            }
            Ok(_) => continue,
            Err(e) => {
                tracing::debug!(error = %e, "pod watch error; the watcher retries");
                continue;
            }
        };
        let node = pod.spec.as_ref().and_then(|s| s.node_name.clone()).unwrap_or_default();
        if !state.lock().unwrap().nodes.contains_key(&node) {
            continue;
        }
        let uid = pod.uid().unwrap_or_default();
        let role = role_of(&pod, &config);
        if let Some(deleted_at) = pod.metadata.deletion_timestamp.clone() {
            // The plugin stops serving, and the pod's devices are free, as soon as it is
            // terminating.
            {
                let mut st = state.lock().unwrap();
                st.admitted.remove(&uid);
                if st.plugins.remove(&uid).is_some() {
                    changed.notify_one();
                }
            }
            if !finishing.contains_key(&uid) {
                let (pods, name, ns) = (pods.clone(), pod.name_any(), pod.namespace().unwrap_or_default());
                let pods = Api::<Pod>::namespaced(pods.into_client(), &ns);
                let uid_pre = uid.clone();
                finishing.insert(
                    uid.clone(),
                    tokio::spawn(async move {
                        // deletionTimestamp is the request time plus the grace period.
                        let millis = deleted_at.0.as_millisecond()
                            - k8s_openapi::jiff::Timestamp::now().as_millisecond();
                        let wait = Duration::from_millis(u64::try_from(millis).unwrap_or(0));
                        tokio::time::sleep(wait).await;
                        let dp = DeleteParams {
                            grace_period_seconds: Some(0),
                            preconditions: Some(kube::api::Preconditions {
                                uid: Some(uid_pre),
                                resource_version: None,
                            }),
                            ..Default::default()
                        };
                        // A real kubelet keeps trying until the API server takes the final
                        // DELETE: one sent while it restarts must not leave the pod Terminating.
                        // 404: gone already; 409: a new pod of the same name (uid precondition).
                        until_taken("final delete", &name, || async {
                            pods.delete(&name, &dp).await.map(drop)
                        })
                        .await;
                    }),
                );
            }
            continue;
        }
        let phase = pod.status.as_ref().and_then(|s| s.phase.clone()).unwrap_or_default();
        if phase == "Failed" || phase == "Succeeded" {
            state.lock().unwrap().admitted.remove(&uid);
            continue;
        }
        if phase == "Pending" || phase.is_empty() {
            // Pods start side by side, as on many kubelets. A plugin serves once its pod is seen
            // Running (the next event).
            if marking.lock().unwrap().insert(uid.clone()) {
                // The kubelet admits a pod before it starts it: one bound on the strength of a
                // scheduler's stale view of the node (device-plugin GPUs the node no longer
                // advertises) is rejected, and its controller replaces it.
                let admitted = state.lock().unwrap().admit(&node, &pod);
                let (client, marking, slots) = (client.clone(), marking.clone(), slots.clone());
                tokio::spawn(async move {
                    let _slot = slots.acquire().await;
                    let status = match &admitted {
                        Ok(()) => running_status(&pod),
                        Err(rejection) => rejected_status(&pod, rejection),
                    };
                    write_pod_status(&client, &pod, &status).await;
                    marking.lock().unwrap().remove(&pod.uid().unwrap_or_default());
                });
            }
            finishing.retain(|_, h| !h.is_finished());
            continue;
        }
        // Running: a pod a restarted simulator adopts holds its devices.
        let requested = device_plugin_requests(&pod);
        if !requested.is_empty() {
            state.lock().unwrap().admitted.entry(uid.clone()).or_insert((node.clone(), requested));
        }
        // A run-to-completion pod (a canary) "exits 0" a moment after it starts.
        let run_once = pod.spec.as_ref().and_then(|s| s.restart_policy.as_deref()) == Some("Never");
        let hangs = state.lock().unwrap().hung_run_once.contains(&node);
        if run_once && phase == "Running" && !hangs && completing.insert(uid.clone()) {
            let client = client.clone();
            tokio::spawn(async move {
                tokio::time::sleep(RUN_ONCE_DURATION).await;
                write_pod_status(&client, &pod, &succeeded_status(&pod)).await;
            });
        }
        if role != Role::Workload {
            state.lock().unwrap().plugins.insert(uid, (node, role));
            changed.notify_one();
        }
        finishing.retain(|_, h| !h.is_finished());
    }
}

/// How long a simulated run-to-completion container runs before it exits 0.
const RUN_ONCE_DURATION: Duration = Duration::from_secs(1);

/// The status the kubelet writes when a pod's containers all exit 0.
fn succeeded_status(pod: &Pod) -> serde_json::Value {
    let now = Utc::now();
    let containers = pod.spec.as_ref().map(|s| s.containers.clone()).unwrap_or_default();
    let statuses: Vec<_> = containers
        .iter()
        .map(|c| {
            json!({"name": c.name, "image": c.image.clone().unwrap_or_default(), "imageID": "", "ready": false,
                   "started": false, "restartCount": 0,
                   "state": {"terminated": {"exitCode": 0, "reason": "Completed", "finishedAt": now}}})
        })
        .collect();
    json!({"status": {"phase": "Succeeded", "containerStatuses": statuses,
        "conditions": [{"type": "Ready", "status": "False", "reason": "PodCompleted", "lastTransitionTime": now},
                       {"type": "ContainersReady", "status": "False", "reason": "PodCompleted", "lastTransitionTime": now}]}})
}

/// The status the kubelet writes for a pod it rejects at admission: `Failed`, with the
/// rejection's reason and message.
fn rejected_status(pod: &Pod, rejection: &Rejection) -> serde_json::Value {
    tracing::info!(pod = %pod.name_any(), reason = %rejection.reason, "pod rejected at admission");
    json!({"status": {"phase": "Failed", "reason": rejection.reason, "message": rejection.message}})
}

/// The status the kubelet writes once a pod's containers run and are ready.
fn running_status(pod: &Pod) -> serde_json::Value {
    let now = Utc::now();
    let containers = pod.spec.as_ref().map(|s| s.containers.clone()).unwrap_or_default();
    let statuses: Vec<_> = containers
        .iter()
        .map(|c| {
            json!({"name": c.name, "image": c.image.clone().unwrap_or_default(), "imageID": "", "ready": true,
                   "started": true, "restartCount": 0, "state": {"running": {"startedAt": now}}})
        })
        .collect();
    let cond = |t: &str| json!({"type": t, "status": "True", "lastTransitionTime": now});
    json!({"status": {
        "phase": "Running", "hostIP": "127.0.0.1", "podIP": "10.244.0.1", "startTime": now,
        "conditions": [cond("PodReadyToStartContainers"), cond("Initialized"), cond("ContainersReady"), cond("Ready"), cond("PodScheduled")],
        "containerStatuses": statuses,
    }})
}

/// Writes a pod's status as the kubelet's status manager does: it keeps trying until the API
/// server takes the write, so one sent while the API server restarts does not leave the pod
/// `Pending` (no later watch event need come to ask again). Stops when the pod is gone or
/// replaced.
async fn write_pod_status(client: &Client, pod: &Pod, status: &serde_json::Value) {
    let pods: Api<Pod> = Api::namespaced(client.clone(), &pod.namespace().unwrap_or_default());
    let name = pod.name_any();
    // The uid is a precondition, as in the kubelet's status patches: a write retried after the
    // pod was replaced by one of the same name is refused (409) instead of landing on the new pod.
    let mut patch = status.clone();
    patch["metadata"] = json!({"uid": pod.uid()});
    until_taken("status write", &name, || async {
        pods.patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch)).await.map(drop)
    })
    .await;
}

/// Repeats a kubelet write, backing off from 250 ms to 2 s, until the API server takes it or
/// answers that its object is gone (404) or was replaced (409).
async fn until_taken<F, Fut>(what: &str, pod: &str, mut write: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<(), kube::Error>>,
{
    let mut retry = Duration::from_millis(250);
    loop {
        match write().await {
            Ok(()) => return,
            Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => return,
            Err(e) => {
                tracing::debug!(pod, error = %e, "{what} failed; retrying");
                tokio::time::sleep(retry).await;
                retry = (retry * 2).min(Duration::from_secs(2));
            }
        }
    }
}

/// Keeps each node's device-plugin resources and DRA slices in line with the plugin pods that
/// run on it, and supervises the agent processes.
async fn plugin_loop(
    client: Client,
    config: SimConfig,
    state: Arc<Mutex<State>>,
    changed: Arc<Notify>,
    agents: Agents,
) {
    // node -> what we last applied: (device plugin serving, DRA plugin running)
    let mut applied: HashMap<String, (bool, bool)> = HashMap::new();
    // node -> since when a plugin that served it has been gone: its resources go after the delay.
    let mut gone_since: HashMap<String, std::time::Instant> = HashMap::new();
    loop {
        let desired: Vec<(String, GpuLayout, bool, bool, bool)> = {
            let st = state.lock().unwrap();
            // One pass over the plugins, not one per node.
            let mut serving: HashMap<&str, (bool, bool)> = HashMap::new();
            for (node, role) in st.plugins.values() {
                let entry = serving.entry(node.as_str()).or_default();
                match role {
                    Role::DevicePlugin => entry.0 = true,
                    Role::DraDriver => entry.1 = true,
                    Role::Workload => {}
                }
            }
            st.nodes
                .iter()
                .map(|(node, layout)| {
                    let (dp, dra) = serving.get(node.as_str()).copied().unwrap_or_default();
                    let held = st.held_agents.contains(node);
                    (node.clone(), layout.clone(), dp, dra, held)
                })
                .collect()
        };
        let now = std::time::Instant::now();
        let mut next_due: Option<std::time::Instant> = None;
        let mut writes = Vec::new();
        for (node, layout, dp, dra, held) in desired {
            if let Some(settings) = config.agent.as_ref().filter(|_| dra && !held) {
                ensure_agent(&agents, &state, settings, &config.driver_name, &node, &layout).await;
            }
            let before = applied.get(&node).copied();
            if before == Some((dp, dra)) {
                gone_since.remove(&node);
                continue;
            }
            let (was_dp, was_dra) = before.unwrap_or((false, false));
            if was_dra
                && !dra
                && let Some(agent) = agents.lock().await.remove(&node)
            {
                let _ = terminate(agent).await;
            }
            // A plugin that goes away takes its resources with it only after the delay; each
            // node waits out its own, so many nodes switching at once do not queue behind each
            // other.
            if (was_dp && !dp) || (was_dra && !dra) {
                let due = *gone_since.entry(node.clone()).or_insert(now) + config.unregister_delay;
                if due > now {
                    next_due = Some(next_due.map_or(due, |d| d.min(due)));
                    continue;
                }
            }
            writes.push((node, layout, before, dp, dra));
        }
        let done: Vec<(String, bool, (bool, bool))> = futures::stream::iter(writes)
            .map(|(node, layout, before, dp, dra)| {
                let (client, config, state) = (client.clone(), config.clone(), state.clone());
                async move {
                    let ok = apply_plugins(&client, &config, &state, &node, &layout, before, dp, dra).await;
                    (node, ok, (dp, dra))
                }
            })
            .buffer_unordered(WRITE_CONCURRENCY)
            .collect()
            .await;
        for (node, ok, serving) in done {
            if ok {
                applied.insert(node.clone(), serving);
                gone_since.remove(&node);
            }
        }
        // Wake on pod changes or the next due removal, and retry failed writes and dead agents
        // after a short pause.
        let wait = next_due.map_or(Duration::from_secs(2), |d| {
            d.saturating_duration_since(std::time::Instant::now()).min(Duration::from_secs(2))
        });
        let _ = tokio::time::timeout(wait, changed.notified()).await;
    }
}

/// Simulator writes in flight at once (pod status, node status, slices).
const WRITE_CONCURRENCY: usize = 16;

/// Writes what a node's plugins serve: its device-plugin resources (the node status) and its stub
/// slice. Returns whether every write went through.
#[allow(clippy::too_many_arguments)]
async fn apply_plugins(
    client: &Client,
    config: &SimConfig,
    state: &Mutex<State>,
    node: &str,
    layout: &GpuLayout,
    before: Option<(bool, bool)>,
    dp: bool,
    dra: bool,
) -> bool {
    let (was_dp, was_dra) = before.unwrap_or((false, false));
    let mut ok = true;
    if before.is_none() || was_dp != dp {
        // The device manager knows before the node status says so.
        {
            let mut st = state.lock().unwrap();
            if dp {
                st.device_plugin_serving.insert(node.to_owned());
            } else {
                st.device_plugin_serving.remove(node);
            }
        }
        let (registered, ready) = {
            let mut st = state.lock().unwrap();
            if dp {
                st.device_plugin_registered.insert(node.to_owned());
            }
            (st.device_plugin_registered.contains(node), st.ready(node))
        };
        let (capacity, allocatable) = device_manager(layout, dp, registered);
        let gpus = Some(GpuStatus { capacity: &capacity, allocatable: &allocatable });
        ok &= if config.light {
            write_status(client, node, gpus, ready).await.is_ok()
        } else {
            heartbeat(client, node, gpus, ready).await.is_ok()
        };
    }
    if before.is_none() || was_dra != dra {
        let result = match (dra, config.agent.is_some()) {
            (true, true) => Ok(()),
            (true, false) => publish_slice(client, &config.driver_name, node, layout).await,
            (false, _) => delete_slices(client, &config.driver_name, node).await,
        };
        ok &= result.is_ok();
    }
    ok
}

/// The kubelet device manager's (capacity, allocatable) for `layout`'s device-plugin resources:
/// all of them while the plugin serves; once it has left, capacity kept and allocatable 0; and 0
/// for both on a node no plugin ever served. Pure.
fn device_manager(
    layout: &GpuLayout,
    serving: bool,
    registered: bool,
) -> (BTreeMap<String, u32>, BTreeMap<String, u32>) {
    let advertised = layout.device_plugin_resources();
    let zeroed: BTreeMap<String, u32> = advertised.keys().map(|k| (k.clone(), 0)).collect();
    let allocatable = if serving { advertised.clone() } else { zeroed.clone() };
    let capacity = if serving || registered { advertised } else { zeroed };
    (capacity, allocatable)
}

/// Starts the agent for `node` unless a live one runs or a test holds it stopped.
async fn ensure_agent(
    agents: &Agents,
    state: &Mutex<State>,
    settings: &AgentSettings,
    driver: &str,
    node: &str,
    layout: &GpuLayout,
) {
    let mut agents = agents.lock().await;
    // The caller read `held_agents` before taking this lock. If `stop_agent` held the node and
    // took its process away in between, starting one now would break "stays stopped until
    // `start_agent`". `stop_agent` marks the node held before it takes this lock, so checking
    // again under the lock closes that window.
    if state.lock().unwrap().held_agents.contains(node) {
        return;
    }
    if let Some(process) = agents.get_mut(node) {
        match process.child.try_wait() {
            Ok(None) => return,
            Ok(Some(status)) => tracing::warn!(%node, %status, "driver agent exited; restarting it"),
            Err(e) => tracing::warn!(%node, error = %e, "cannot poll the driver agent; restarting it"),
        }
    }
    match spawn_agent(settings, driver, node, layout) {
        Ok(process) => {
            agents.insert(node.to_owned(), process);
        }
        Err(e) => tracing::warn!(%node, error = %e, "could not start the driver agent"),
    }
}

fn spawn_agent(
    settings: &AgentSettings,
    driver: &str,
    node: &str,
    layout: &GpuLayout,
) -> anyhow::Result<AgentProcess> {
    std::fs::create_dir_all(&settings.work_dir)?;
    let inventory = settings.work_dir.join(format!("{node}.inventory.yaml"));
    // Written once: a restarted agent must see the same devices (tests may edit the file).
    if !inventory.exists() {
        std::fs::write(&inventory, serde_yaml::to_string(&layout.inventory(node))?)?;
    }
    let fault_addr = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(settings.work_dir.join(format!("{node}.agent.log")))?;
    let child = tokio::process::Command::new(&settings.bin)
        .args(["--node-name", node, "--driver-name", driver, "--inventory", "simulated"])
        .arg("--sim-config")
        .arg(&inventory)
        .args(["--fault-listen", &fault_addr.to_string(), "--listen", "127.0.0.1:0"])
        .args(["--health-hold-seconds", &settings.health_hold_seconds.to_string()])
        .args(interlock_flag(settings))
        .env("KUBECONFIG", &settings.kubeconfig)
        .stdout(log.try_clone()?)
        .stderr(log)
        .kill_on_drop(true)
        .spawn()?;
    Ok(AgentProcess { child, fault_addr })
}

/// SIGTERM, then wait up to 30 s (the agent's own shutdown publishes its taint within 20 s).
async fn terminate(mut process: AgentProcess) -> anyhow::Result<std::process::ExitStatus> {
    if let Some(pid) = process.child.id() {
        tokio::process::Command::new("kill").args(["-TERM", &pid.to_string()]).status().await?;
    }
    match tokio::time::timeout(Duration::from_secs(30), process.child.wait()).await {
        Ok(status) => Ok(status?),
        Err(_) => {
            process.child.kill().await?;
            anyhow::bail!("the driver agent ignored SIGTERM for 30s and was killed")
        }
    }
}

/// The slice a stub DRA plugin publishes for a node: one device per full GPU and per MIG device.
pub fn stub_slice(driver: &str, node: &str, node_uid: &str, layout: &GpuLayout) -> ResourceSlice {
    let mut devices = Vec::new();
    for i in 0..layout.gpus {
        devices.push(json!({
            "name": format!("gpu-{i}"),
            "attributes": {
                "type": {"string": "gpu"},
                "uuid": {"string": format!("GPU-{node}-{i}")},
                "productName": {"string": layout.product},
                "resource.kubernetes.io/numaNode": {"int": i64::from(i / 4)},
            },
            "capacity": {"memory": {"value": "80Gi"}},
        }));
    }
    for (g, profiles) in layout.mig_gpus.iter().enumerate() {
        for (n, profile) in profiles.iter().enumerate() {
            devices.push(json!({
                "name": format!("gpu-{}-mig-{}-{n}", layout.gpus as usize + g, profile.replace('.', "")),
                "attributes": {"type": {"string": "mig"}, "profile": {"string": profile}},
            }));
        }
    }
    serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": format!("{node}-{}", driver.replace('.', "-")),
                     "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": node, "uid": node_uid}]},
        "spec": {"driver": driver, "nodeName": node, "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                 "devices": devices},
    }))
    .expect("stub slice is a valid ResourceSlice")
}

async fn publish_slice(client: &Client, driver: &str, node: &str, layout: &GpuLayout) -> anyhow::Result<()> {
    let uid = Api::<Node>::all(client.clone()).get(node).await?.uid().unwrap_or_default();
    let slice = stub_slice(driver, node, &uid, layout);
    let slices: Api<ResourceSlice> = Api::all(client.clone());
    slices
        .patch(&slice.name_any(), &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(&slice))
        .await?;
    Ok(())
}

async fn delete_slices(client: &Client, driver: &str, node: &str) -> anyhow::Result<()> {
    let slices: Api<ResourceSlice> = Api::all(client.clone());
    let fields = format!("spec.nodeName={node},spec.driver={driver}");
    for s in slices.list(&ListParams::default().fields(&fields)).await? {
        slices.delete(&s.name_any(), &DeleteParams::default()).await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu_pod(limits: &[(&str, &str)], claimed: bool) -> Pod {
        let limits: BTreeMap<String, String> =
            limits.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
        let mut pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": "p", "uid": "u1"},
            "spec": {"containers": [{"name": "c", "resources": {"limits": limits}}]},
        }))
        .unwrap();
        if claimed {
            pod.status = Some(
                serde_json::from_value(json!({"extendedResourceClaimStatus": {
                    "resourceClaimName": "p-claim", "requestMappings": []}}))
                .unwrap(),
            );
        }
        pod
    }

    #[test]
    fn a_pod_served_by_a_claim_asks_nothing_of_the_device_plugin() {
        assert!(device_plugin_requests(&gpu_pod(&[("nvidia.com/gpu", "1")], true)).is_empty());
        assert!(device_plugin_requests(&gpu_pod(&[("cpu", "1")], false)).is_empty());
        assert_eq!(
            device_plugin_requests(&gpu_pod(&[("nvidia.com/gpu", "2"), ("cpu", "1")], false)),
            BTreeMap::from([("nvidia.com/gpu".to_owned(), 2)])
        );
    }

    #[test]
    fn admission_rejects_what_the_plugin_does_not_advertise_as_the_kubelet_does() {
        let want = BTreeMap::from([("nvidia.com/gpu".to_owned(), 1)]);
        let rejected = admission(&want, &BTreeMap::new(), &BTreeMap::new()).unwrap_err();
        assert_eq!(rejected.reason, "OutOfnvidia.com/gpu");
        assert_eq!(
            rejected.message,
            "Pod was rejected: Node didn't have enough resource: nvidia.com/gpu, requested: 1, used: 0, capacity: 0"
        );
        let two = BTreeMap::from([("nvidia.com/gpu".to_owned(), 2)]);
        assert_eq!(admission(&want, &two, &BTreeMap::from([("nvidia.com/gpu", 1)])), Ok(()));
        let full = admission(&want, &two, &BTreeMap::from([("nvidia.com/gpu", 2)])).unwrap_err();
        assert!(full.message.ends_with("requested: 1, used: 2, capacity: 2"), "{}", full.message);
    }

    #[test]
    fn state_counts_admitted_pods_until_they_go_and_follows_the_plugin() {
        let mut st = State::default();
        st.nodes.insert("n".into(), GpuLayout::gpus(1));
        let pod = |uid: &str| {
            let mut p = gpu_pod(&[("nvidia.com/gpu", "1")], false);
            p.metadata.uid = Some(uid.to_owned());
            p
        };
        // No plugin serving: rejected.
        assert!(st.admit("n", &pod("a")).is_err());
        st.device_plugin_serving.insert("n".into());
        assert_eq!(st.admit("n", &pod("a")), Ok(()));
        // The same pod seen again is not counted twice.
        assert_eq!(st.admit("n", &pod("a")), Ok(()));
        assert!(st.admit("n", &pod("b")).is_err(), "one GPU, already in use");
        st.admitted.remove("a");
        assert_eq!(st.admit("n", &pod("b")), Ok(()));
        // A claim-served pod is DRA's.
        let mut claimed = gpu_pod(&[("nvidia.com/gpu", "1")], true);
        claimed.metadata.uid = Some("c".into());
        assert_eq!(st.admit("n", &claimed), Ok(()));
    }

    #[test]
    fn the_device_manager_keeps_capacity_after_the_plugin_leaves() {
        let layout = GpuLayout::gpus(4);
        let gpus =
            |n: u32| BTreeMap::from([(switchyard_operator::well_known::NVIDIA_GPU_RESOURCE.to_owned(), n)]);
        // (case, plugin serving, it served before, capacity, allocatable)
        let cases = [
            ("serving", true, true, 4, 4),
            ("left: capacity kept, nothing to allocate", false, true, 4, 0),
            ("never served (joined after the plugin was removed)", false, false, 0, 0),
        ];
        for (case, serving, registered, capacity, allocatable) in cases {
            assert_eq!(
                device_manager(&layout, serving, registered),
                (gpus(capacity), gpus(allocatable)),
                "{case}"
            );
        }
    }
}
