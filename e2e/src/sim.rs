//! The GPU node simulator: the one part of the e2e environment that stands in for the kubelet.
//! Everything else (API server, scheduler, controller manager, etcd) is the real upstream code.
//!
//! What it fakes, exactly:
//! - **Nodes.** It creates Node objects with the given labels and fills their status as a kubelet
//!   would: `Ready=True`, capacity and allocatable for cpu, memory and pods, `nodeInfo` with
//!   kubelet v1.37.2 and containerd 2.1. It renews each node's Lease in `kube-node-lease` and
//!   removes the `node.kubernetes.io/not-ready` taint that admission puts on new nodes.
//! - **Pods.** A pod bound to one of its nodes is marked `Running` and `Ready` (no container runs).
//!   A deleted pod is removed for good once its `deletionGracePeriodSeconds` have passed, as the
//!   kubelet does after stopping the containers.
//! - **The device-plugin role.** While a pod of the configured device-plugin DaemonSet runs on a
//!   node, the node's capacity and allocatable for `nvidia.com/gpu` (and `nvidia.com/mig-<profile>`
//!   for MIG devices) equal its GPUs. Once that pod is gone, they drop to 0 after a configurable
//!   delay, as the kubelet's device manager does when a plugin unregisters.
//! - **The DRA-plugin role.** While a pod of the configured DRA-driver DaemonSet runs on a node, a
//!   ResourceSlice publisher for that node runs, publishing the node's GPUs for the driver. When
//!   the pod goes, the node's slices of that driver are deleted after the same delay, as the
//!   kubelet does when a DRA plugin unregisters.
//!
//! It does not run containers, call CDI, enforce resource limits or report pod metrics.
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
use tokio::sync::Notify;
use tokio::task::JoinSet;

/// Label on every node a simulator creates, with the simulator's instance name.
pub const LABEL_INSTANCE: &str = "sim.switchyard.dev/instance";
/// Annotation recording a simulated node's GPU layout, so that a restarted simulator keeps it.
pub const ANNOTATION_LAYOUT: &str = "sim.switchyard.dev/gpu-layout";
/// Field manager for the simulator's writes.
const FIELD_MANAGER: &str = "switchyard-gpu-node-sim";
/// How often leases and node heartbeats are renewed: the kubelet's default lease renewal
/// interval is 10s against a 40s grace period in the node lifecycle controller.
const HEARTBEAT: Duration = Duration::from_secs(10);

/// A DaemonSet, by namespace and name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DaemonSetKey {
    pub namespace: String,
    pub name: String,
}

/// The GPUs of one simulated node.
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize, PartialEq, Eq)]
pub struct GpuLayout {
    /// Full GPUs, advertised as `nvidia.com/gpu`.
    pub gpus: u32,
    /// MIG devices by profile (for example `1g.10gb` → 7), advertised as `nvidia.com/mig-<profile>`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub mig: BTreeMap<String, u32>,
    /// Product name published in DRA attributes.
    #[serde(default = "default_product")]
    pub product: String,
}

fn default_product() -> String {
    "NVIDIA A100-SXM4-80GB".into()
}

impl GpuLayout {
    /// `n` full GPUs of the default product.
    pub fn gpus(n: u32) -> Self {
        Self { gpus: n, mig: BTreeMap::new(), product: default_product() }
    }

    /// The extended resources the device plugin advertises for this layout.
    pub fn device_plugin_resources(&self) -> BTreeMap<String, u32> {
        let mut out = BTreeMap::new();
        if self.gpus > 0 {
            out.insert(switchyard_operator::well_known::NVIDIA_GPU_RESOURCE.to_owned(), self.gpus);
        }
        for (profile, count) in &self.mig {
            out.insert(format!("nvidia.com/mig-{profile}"), *count);
        }
        out
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
}

impl SimConfig {
    pub fn new(instance: impl Into<String>) -> Self {
        Self {
            instance: instance.into(),
            device_plugin: None,
            dra_driver: None,
            driver_name: switchyard_operator::well_known::DEFAULT_DRIVER_NAME.to_owned(),
            unregister_delay: Duration::from_secs(1),
        }
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
}

/// A running simulator. Dropping it stops its tasks; [`Simulator::shutdown`] also deletes its nodes.
pub struct Simulator {
    client: Client,
    config: SimConfig,
    state: Arc<Mutex<State>>,
    changed: Arc<Notify>,
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
        let mut sim = Self { client, config, state, changed: Arc::new(Notify::new()), tasks: JoinSet::new() };
        sim.tasks.spawn(heartbeat_loop(sim.client.clone(), sim.state.clone()));
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
        heartbeat(&self.client, &spec.name, None).await?;
        self.changed.notify_one();
        Ok(created)
    }

    /// Stops the loops and deletes every node this simulator created (pods on them go with the
    /// garbage collector; slices go by their owner reference to the node).
    pub async fn shutdown(mut self) -> anyhow::Result<()> {
        self.tasks.shutdown().await;
        let nodes: Api<Node> = Api::all(self.client.clone());
        let names: Vec<String> = self.state.lock().unwrap().nodes.keys().cloned().collect();
        for name in names {
            let _ = nodes.delete(&name, &DeleteParams::default()).await;
        }
        Ok(())
    }
}

/// Writes a node's status as the kubelet would: Ready, capacity and allocatable, nodeInfo. The
/// GPU resources are set only when `gpu_resources` is given; otherwise they are left alone.
async fn heartbeat(
    client: &Client,
    name: &str,
    gpu_resources: Option<&BTreeMap<String, u32>>,
) -> anyhow::Result<()> {
    let now = Utc::now();
    let mut resources = serde_json::Map::new();
    resources.insert("cpu".into(), json!("32"));
    resources.insert("memory".into(), json!("256Gi"));
    resources.insert("pods".into(), json!("110"));
    if let Some(gpus) = gpu_resources {
        for (res, n) in gpus {
            resources.insert(res.clone(), json!(n.to_string()));
        }
    }
    let ready = |t: &str, s: &str, reason: &str| {
        json!({"type": t, "status": s, "reason": reason, "lastHeartbeatTime": now, "lastTransitionTime": now,
               "message": "simulated by switchyard gpu-node-sim"})
    };
    let status = json!({
        "status": {
            "capacity": resources, "allocatable": resources,
            "conditions": [
                ready("Ready", "True", "KubeletReady"),
                ready("MemoryPressure", "False", "KubeletHasSufficientMemory"),
                ready("DiskPressure", "False", "KubeletHasNoDiskPressure"),
                ready("PIDPressure", "False", "KubeletHasSufficientPID"),
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
    nodes.patch_status(name, &PatchParams::default(), &Patch::Merge(&status)).await?;

    // Admission puts node.kubernetes.io/not-ready on new nodes; the kubelet's Ready status makes
    // the node lifecycle controller lift it, but only on its next pass. Lift it now.
    let node = nodes.get(name).await?;
    let taints = node.spec.as_ref().and_then(|s| s.taints.clone()).unwrap_or_default();
    let kept: Vec<_> = taints.iter().filter(|t| !t.key.starts_with("node.kubernetes.io/not-ready")).collect();
    if kept.len() != taints.len() {
        nodes.patch(name, &PatchParams::default(), &Patch::Merge(json!({"spec": {"taints": kept}}))).await?;
    }

    let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-node-lease");
    let lease = Lease {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            owner_references: Some(vec![OwnerReference {
                api_version: "v1".into(),
                kind: "Node".into(),
                name: name.to_owned(),
                uid: node.uid().unwrap_or_default(),
                ..Default::default()
            }]),
            ..Default::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(name.to_owned()),
            lease_duration_seconds: Some(40),
            renew_time: Some(MicroTime(k8s_openapi::jiff::Timestamp::now())),
            ..Default::default()
        }),
    };
    leases.patch(name, &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(&lease)).await?;
    Ok(())
}

async fn heartbeat_loop(client: Client, state: Arc<Mutex<State>>) {
    loop {
        tokio::time::sleep(HEARTBEAT).await;
        let nodes: Vec<String> = state.lock().unwrap().nodes.keys().cloned().collect();
        for name in nodes {
            if let Err(e) = heartbeat(&client, &name, None).await {
                tracing::warn!(node = %name, error = %e, "heartbeat failed");
            }
        }
    }
}

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
    let mut stream = watcher(pods.clone(), watcher::Config::default().fields("spec.nodeName!=")).boxed();
    let mut finishing: HashMap<String, tokio::task::JoinHandle<()>> = HashMap::new();
    while let Some(event) = stream.next().await {
        let pod = match event {
            Ok(watcher::Event::Apply(pod) | watcher::Event::InitApply(pod)) => pod,
            Ok(watcher::Event::Delete(pod)) => {
                let uid = pod.uid().unwrap_or_default();
                if state.lock().unwrap().plugins.remove(&uid).is_some() {
                    changed.notify_one();
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
            // The plugin stops serving as soon as its pod is terminating.
            if state.lock().unwrap().plugins.remove(&uid).is_some() {
                changed.notify_one();
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
                        let _ = pods.delete(&name, &dp).await;
                    }),
                );
            }
            continue;
        }
        let phase = pod.status.as_ref().and_then(|s| s.phase.clone()).unwrap_or_default();
        if (phase == "Pending" || phase.is_empty())
            && let Err(e) = mark_running(&client, &pod).await
        {
            tracing::warn!(pod = %pod.name_any(), error = %e, "could not mark pod running");
            continue;
        }
        if role != Role::Workload {
            state.lock().unwrap().plugins.insert(uid, (node, role));
            changed.notify_one();
        }
        finishing.retain(|_, h| !h.is_finished());
    }
}

async fn mark_running(client: &Client, pod: &Pod) -> anyhow::Result<()> {
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
    let status = json!({"status": {
        "phase": "Running", "hostIP": "127.0.0.1", "podIP": "10.244.0.1", "startTime": now,
        "conditions": [cond("PodReadyToStartContainers"), cond("Initialized"), cond("ContainersReady"), cond("Ready"), cond("PodScheduled")],
        "containerStatuses": statuses,
    }});
    let pods: Api<Pod> = Api::namespaced(client.clone(), &pod.namespace().unwrap_or_default());
    pods.patch_status(&pod.name_any(), &PatchParams::default(), &Patch::Merge(&status)).await?;
    Ok(())
}

/// Keeps each node's device-plugin resources and DRA slices in line with the plugin pods that
/// run on it.
async fn plugin_loop(client: Client, config: SimConfig, state: Arc<Mutex<State>>, changed: Arc<Notify>) {
    // node -> what we last applied: (device plugin serving, DRA serving)
    let mut applied: HashMap<String, (bool, bool)> = HashMap::new();
    loop {
        let desired: Vec<(String, GpuLayout, bool, bool)> = {
            let st = state.lock().unwrap();
            st.nodes
                .iter()
                .map(|(node, layout)| {
                    let has = |r: Role| st.plugins.values().any(|(n, role)| n == node && *role == r);
                    (node.clone(), layout.clone(), has(Role::DevicePlugin), has(Role::DraDriver))
                })
                .collect()
        };
        for (node, layout, dp, dra) in desired {
            let before = applied.get(&node).copied();
            if before == Some((dp, dra)) {
                continue;
            }
            let (was_dp, was_dra) = before.unwrap_or((false, false));
            // A plugin that goes away takes its resources with it only after the delay.
            if (was_dp && !dp) || (was_dra && !dra) {
                tokio::time::sleep(config.unregister_delay).await;
            }
            let mut ok = true;
            if before.is_none() || was_dp != dp {
                let zeroed: BTreeMap<String, u32> =
                    layout.device_plugin_resources().into_keys().map(|k| (k, 0)).collect();
                let gpus = if dp { layout.device_plugin_resources() } else { zeroed };
                ok &= heartbeat(&client, &node, Some(&gpus)).await.is_ok();
            }
            if before.is_none() || was_dra != dra {
                let result = if dra {
                    publish_slice(&client, &config.driver_name, &node, &layout).await
                } else {
                    delete_slices(&client, &config.driver_name, &node).await
                };
                ok &= result.is_ok();
            }
            if ok {
                applied.insert(node, (dp, dra));
            }
        }
        // Wake on pod changes, and retry failed writes after a short pause.
        let _ = tokio::time::timeout(Duration::from_secs(2), changed.notified()).await;
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
    for (profile, count) in &layout.mig {
        for n in 0..*count {
            devices.push(json!({
                "name": format!("mig-{}-{n}", profile.replace('.', "")),
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
