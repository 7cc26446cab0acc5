//! Real nodes: the kubelets and containerds that `e2e/hack/nodes-up.sh` starts beside the control
//! plane, and Switchyard installed on them the way a cluster admin installs it: `config/` applied
//! with kubectl (through `e2e/overlays/real-nodes`, which adds only the GPU Operator's driver root
//! and a short health hold), the operator as its two-replica Deployment and the agent as its
//! DaemonSet, each with its own ServiceAccount and RBAC, from the images that
//! `e2e/hack/build-images.sh` built.
//!
//! Only the GPUs are fake, at the lowest layer: each node's driver root (`/run/nvidia/driver`)
//! holds the NVML mock as `libnvidia-ml.so.1` and device nodes made with mknod
//! (`e2e/hack/nodes-up.sh`). NVIDIA's device plugin (k8s-device-plugin v0.19.3, built from its
//! module) and Switchyard's agent (`--inventory nvml`, the production default) both load that
//! library and discover the same GPUs. Everything between them and the workload is real: the
//! kubelet's device manager, its DRA manager calling NodePrepareResources, containerd's CDI
//! injection, runc.

use std::collections::BTreeSet;
use std::io::Write;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};
use serde::Deserialize;
use serde_json::json;

use crate::pool::Samples;
use crate::{cluster, wait};

/// Label nodes-up.sh gives every real node.
pub const LABEL_REAL_NODE: &str = "e2e.switchyard.dev/real-node";
/// Where config/ installs Switchyard.
pub const SYSTEM_NS: &str = "switchyard-system";
/// The operator's Deployment and leader-election Lease.
pub const OPERATOR: &str = "switchyard-operator";
/// The NVML mock's inventory of every real node (nodes-up.sh's default), which NVIDIA's device
/// plugin and the agent both discover through the mock.
pub const NODE_GPUS: &str = include_str!("../nvml-mock/nodes/h100x2.json");
/// The device-plugin DaemonSet: NVIDIA's, as its static manifest names it.
pub const DEVICE_PLUGIN_MANIFEST: &str = "e2e/manifests/nvidia-device-plugin.yaml";
/// The label the device-plugin DaemonSet selects GPU nodes by.
pub const LABEL_GPU_PRESENT: &str = "nvidia.com/gpu.present";
/// The image that prints what the container was given (`NVIDIA_VISIBLE_DEVICES`, /dev/nvidia*).
pub const WORKLOAD_IMAGE: &str = concat!("switchyard.dev/e2e/gpu-workload:", env!("CARGO_PKG_VERSION"));

/// One GPU of [`NODE_GPUS`].
#[derive(Clone, Debug, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MockGpu {
    pub uuid: String,
    pub name: String,
    pub memory_bytes: u64,
}

/// The GPUs of every real node.
pub fn node_gpus() -> Vec<MockGpu> {
    #[derive(serde::Deserialize)]
    struct Inventory {
        gpus: Vec<MockGpu>,
    }
    serde_json::from_str::<Inventory>(NODE_GPUS).expect("e2e/nvml-mock/nodes/h100x2.json parses").gpus
}

/// The UUIDs of every real node's GPUs.
pub fn gpu_uuids() -> BTreeSet<String> {
    node_gpus().into_iter().map(|g| g.uuid).collect()
}

/// A fault the NVML mock delivers on a node's GPU, as the driver would: appended to the faults
/// file beside the mock in the node's driver root, which every process that loaded the mock there
/// (NVIDIA's device plugin, the agent) reads. `kind`: `xid` (with `xid`), `ecc-dbe`, `lost`,
/// `recover`.
pub fn raise_gpu_fault(node: &str, uuid: &str, kind: &str, xid: u64) -> anyhow::Result<()> {
    let path = node_dir(node).join("driver-root/usr/lib64/nvml-mock.json.faults");
    let mut f = std::fs::OpenOptions::new().append(true).open(&path)?;
    writeln!(f, "{}", json!({"uuid": uuid, "kind": kind, "xid": xid}))?;
    Ok(())
}

/// What the driver root's `nvidia-smi` (the mock's) was asked on `node` since the last
/// [`forget_nvidia_smi_calls`], where the caller could write to the driver root: one line per call,
/// `answered <args>` or `refused <args>`.
pub fn nvidia_smi_calls(node: &str) -> anyhow::Result<Vec<String>> {
    let path = node_dir(node).join(NVIDIA_SMI_CALLS);
    match std::fs::read_to_string(&path) {
        Ok(text) => Ok(text.lines().map(str::to_owned).collect()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(anyhow::anyhow!("{}: {e}", path.display())),
    }
}

/// Starts a new record of [`nvidia_smi_calls`] on `node`.
pub fn forget_nvidia_smi_calls(node: &str) -> anyhow::Result<()> {
    let path = node_dir(node).join(NVIDIA_SMI_CALLS);
    match std::fs::remove_file(&path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(anyhow::anyhow!("{}: {e}", path.display())),
        _ => Ok(()),
    }
}

/// Where the mock's `nvidia-smi` records its calls, under a node's directory.
const NVIDIA_SMI_CALLS: &str = "driver-root/usr/lib64/nvidia-smi.calls";

/// Every GPU of `nodes` answers again: a fault a failed scenario raised and did not clear (a lost
/// GPU) would otherwise stay in the mock's state for the next one, and NVIDIA's components exit on
/// a lost GPU at start.
pub fn recover_gpus(nodes: &[String]) -> anyhow::Result<()> {
    for node in nodes {
        for gpu in node_gpus() {
            raise_gpu_fault(node, &gpu.uuid, "recover", 0)?;
        }
    }
    Ok(())
}

/// The real nodes, Ready. Fails, never skips, when there are none: the scenarios on real nodes do
/// not fall back to the simulator.
pub async fn nodes(client: &Client) -> anyhow::Result<Vec<Node>> {
    let api: Api<Node> = Api::all(client.clone());
    let nodes = api.list(&ListParams::default().labels(&format!("{LABEL_REAL_NODE}=true"))).await?.items;
    let ready = |n: &Node| {
        n.status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
    };
    anyhow::ensure!(
        !nodes.is_empty() && nodes.iter().all(ready),
        "no Ready real nodes (found {}): `make cluster-up` starts them (SWITCHYARD_NODES, default 3); \
         see e2e/.cluster/logs/real-node-*.log",
        nodes.len()
    );
    Ok(nodes)
}

/// The per-node state directory of a real node (`real-node-<N>` → `e2e/.cluster/nodes/node<N>`).
pub fn node_dir(node: &str) -> PathBuf {
    let index = node.rsplit('-').next().unwrap_or_default();
    cluster::repo_root().join("e2e/.cluster/nodes").join(format!("node{index}"))
}

/// Runs the cached kubectl against the shared cluster and returns its stdout.
pub fn kubectl(args: &[&str]) -> anyhow::Result<String> {
    let out = Command::new(cluster::bin_dir().join("kubectl"))
        .arg("--kubeconfig")
        .arg(cluster::kubeconfig())
        .args(args)
        .current_dir(cluster::repo_root())
        .output()?;
    anyhow::ensure!(
        out.status.success(),
        "kubectl {}: {}{}",
        args.join(" "),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Sets (Some) or removes (None) labels on a node.
pub async fn label(client: &Client, node: &str, labels: serde_json::Value) -> anyhow::Result<()> {
    let api: Api<Node> = Api::all(client.clone());
    api.patch(node, &PatchParams::default(), &Patch::Merge(json!({"metadata": {"labels": labels}}))).await?;
    Ok(())
}

/// The overlay of config/ that the real-node scenarios install: Switchyard's operator and agent.
pub const SWITCHYARD_OVERLAY: &str = "e2e/overlays/real-nodes";
/// The overlay for a cluster that moves to NVIDIA's DRA driver: the operator without the agent.
pub const SWITCHYARD_WITHOUT_AGENT_OVERLAY: &str = "e2e/overlays/nvidia-dra";

/// Installs Switchyard as a user does: `kubectl apply --server-side -k` of config/ (through the
/// real-nodes overlay), then waits until the operator Deployment has a Ready replica and the
/// leader holds its Lease.
pub async fn install_switchyard(client: &Client) -> anyhow::Result<()> {
    install_switchyard_from(client, SWITCHYARD_OVERLAY).await
}

/// [`install_switchyard`] through another overlay of config/.
pub async fn install_switchyard_from(client: &Client, overlay: &str) -> anyhow::Result<()> {
    kubectl(&["apply", "--server-side", "--force-conflicts", "-k", overlay])?;
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), SYSTEM_NS);
    wait::until("the operator Deployment to have a Ready replica", Duration::from_secs(120), || {
        let deployments = deployments.clone();
        async move {
            let d = deployments.get(OPERATOR).await?;
            Ok(d.status.and_then(|s| s.ready_replicas).is_some_and(|r| r >= 1).then_some(()))
        }
    })
    .await?;
    leader(client, Duration::from_secs(60)).await.map(|_| ())
}

/// The operator pod holding the leader-election Lease, once one does.
pub async fn leader(client: &Client, timeout: Duration) -> anyhow::Result<Pod> {
    use k8s_openapi::api::coordination::v1::Lease;
    let leases: Api<Lease> = Api::namespaced(client.clone(), SYSTEM_NS);
    let pods: Api<Pod> = Api::namespaced(client.clone(), SYSTEM_NS);
    wait::until("an operator pod to hold the leader Lease", timeout, || {
        let (leases, pods) = (leases.clone(), pods.clone());
        async move {
            let Some(holder) = leases.get_opt(OPERATOR).await?.and_then(|l| l.spec?.holder_identity) else {
                return Ok(None);
            };
            Ok(pods.get_opt(&holder).await?.filter(|p| p.metadata.deletion_timestamp.is_none()))
        }
    })
    .await
}

/// Removes what [`install_switchyard`] applied. Migrations must be gone first (the operator
/// releases their finalizers).
pub fn uninstall_switchyard() -> anyhow::Result<()> {
    uninstall_switchyard_from(SWITCHYARD_OVERLAY)
}

/// Removes what [`install_switchyard_from`] applied from `overlay`.
pub fn uninstall_switchyard_from(overlay: &str) -> anyhow::Result<()> {
    kubectl(&["delete", "--ignore-not-found", "--wait=true", "--timeout=120s", "-k", overlay]).map(|_| ())
}

/// The namespace NVIDIA's DRA driver is installed in, as its chart's docs install it.
pub const NVIDIA_DRA_NS: &str = "nvidia-dra-driver-gpu";
/// The DaemonSet of NVIDIA's GPU kubelet plugin, as its chart names it.
pub const NVIDIA_DRA_KUBELET_PLUGIN: &str = "dra-driver-nvidia-gpu-kubelet-plugin";

/// NVIDIA's DRA driver rendered by its own chart (`e2e/hack/render-nvidia-dra.sh`, with `extra`
/// arguments for `helm template`): the command's output, whether or not it succeeded.
pub fn render_nvidia_dra(extra: &[&str]) -> anyhow::Result<std::process::Output> {
    Ok(Command::new("bash")
        .arg(cluster::repo_root().join("e2e/hack/render-nvidia-dra.sh"))
        .args(extra)
        .current_dir(cluster::repo_root())
        .output()?)
}

/// Where an install keeps the chart it rendered and applied (`e2e/.cluster/<name>.yaml`), for its
/// uninstall.
fn rendered(name: &str) -> PathBuf {
    cluster::repo_root().join("e2e/.cluster").join(format!("{name}.yaml"))
}

/// Installs what a render script (`e2e/hack/render-<name>.sh`) prints, as `helm install
/// --create-namespace` of the chart would: the namespace `ns`, then every object, applied with
/// `edit` applied to them (`Ok` unchanged). The objects are kept at [`rendered`]`(name)`.
fn install_rendered(
    name: &str,
    ns: &str,
    args: &[&str],
    edit: impl FnOnce(Vec<serde_json::Value>) -> anyhow::Result<Vec<serde_json::Value>>,
) -> anyhow::Result<()> {
    let script = format!("e2e/hack/render-{name}.sh");
    let out = Command::new("bash")
        .arg(cluster::repo_root().join(&script))
        .args(args)
        .current_dir(cluster::repo_root())
        .output()?;
    anyhow::ensure!(out.status.success(), "{script}: {}", String::from_utf8_lossy(&out.stderr));
    let mut objects = Vec::new();
    for doc in serde_yaml::Deserializer::from_slice(&out.stdout) {
        let object = serde_json::Value::deserialize(doc)?;
        if !object.is_null() {
            objects.push(object);
        }
    }
    let list = json!({"apiVersion": "v1", "kind": "List", "items": edit(objects)?});
    std::fs::write(rendered(name), serde_yaml::to_string(&list)?)?;
    kubectl_apply_json(&json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}))?;
    kubectl(&["apply", "--server-side", "--force-conflicts", "-f", &rendered(name).to_string_lossy()])
        .map(|_| ())
}

/// Removes what [`install_rendered`] applied under `name`, then the namespace `ns`.
fn uninstall_rendered(name: &str, ns: &str) -> anyhow::Result<()> {
    if rendered(name).exists() {
        delete_file(&rendered(name))?;
    }
    kubectl(&["delete", "namespace", "--ignore-not-found", "--wait=true", "--timeout=120s", ns]).map(|_| ())
}

/// Installs NVIDIA's DRA driver as `helm install` of its chart would: its namespace, then every
/// object the chart renders (e2e/hack/render-nvidia-dra.sh), applied unchanged.
pub fn install_nvidia_dra() -> anyhow::Result<()> {
    install_nvidia_dra_with(&[])
}

/// [`install_nvidia_dra`] with `extra` values for its chart (`--set consumableShares=2`, ...).
pub fn install_nvidia_dra_with(extra: &[&str]) -> anyhow::Result<()> {
    install_rendered("nvidia-dra", NVIDIA_DRA_NS, extra, Ok)
}

/// Removes NVIDIA's DRA driver: the chart's objects, its namespace, and the ResourceSlices its
/// kubelet plugins published (a plugin that stops leaves them to the kubelet to remove).
pub fn uninstall_nvidia_dra() -> anyhow::Result<()> {
    uninstall_rendered("nvidia-dra", NVIDIA_DRA_NS)?;
    kubectl(&["delete", "resourceslices", "--field-selector", "spec.driver=gpu.nvidia.com"]).map(|_| ())
}

/// The namespace Node Feature Discovery is installed in.
pub const NFD_NS: &str = "node-feature-discovery";

/// Installs Node Feature Discovery's master from its own chart (e2e/hack/render-nfd.sh: CRDs
/// included, applied unchanged) and waits until it is Ready.
pub async fn install_nfd(client: &Client) -> anyhow::Result<()> {
    install_rendered("nfd", NFD_NS, &[], Ok)?;
    wait_deployment_ready(client, NFD_NS, "node-feature-discovery-master", Duration::from_secs(120)).await
}

/// Removes Node Feature Discovery, its CRDs (and so every NodeFeature) included. The labels it
/// wrote stay on the nodes, as after `helm uninstall` without its prune hook.
pub fn uninstall_nfd() -> anyhow::Result<()> {
    uninstall_rendered("nfd", NFD_NS)
}

/// The namespace NVIDIA's device-plugin chart is installed in.
pub const NVIDIA_DEVICE_PLUGIN_NS: &str = "nvidia-device-plugin";
/// The chart's device-plugin DaemonSet; GPU Feature Discovery's is `<this>-gpu-feature-discovery`.
pub const NVIDIA_DEVICE_PLUGIN_DS: &str = "nvidia-device-plugin";
/// The node label NVIDIA's config-manager picks a node's device-plugin config by.
pub const LABEL_DEVICE_PLUGIN_CONFIG: &str = "nvidia.com/device-plugin.config";

/// Installs NVIDIA's device plugin and GPU Feature Discovery from their Helm chart
/// (e2e/hack/render-nvidia-device-plugin.sh: the config-manager, time-slicing configs, GFD).
///
/// One change to what the chart renders: GPU Feature Discovery loads `libnvidia-ml.so.1` from the
/// library path, where the NVIDIA Container Toolkit (the GPU Operator installs it as the nodes'
/// container runtime) injects the driver's library into every container that asks for GPUs. These
/// nodes run plain containerd, so the GFD container mounts the chart's own `driver-root` volume and
/// finds the library there through `LD_LIBRARY_PATH`, as the toolkit would have put it. The device
/// plugin needs no such change: it opens the library under its mounted driver root itself.
pub fn install_nvidia_device_plugin_chart() -> anyhow::Result<()> {
    install_rendered("nvidia-device-plugin", NVIDIA_DEVICE_PLUGIN_NS, &[], |mut objects| {
        let gfd = format!("{NVIDIA_DEVICE_PLUGIN_DS}-gpu-feature-discovery");
        let ds = objects
            .iter_mut()
            .find(|o| o["kind"] == "DaemonSet" && o["metadata"]["name"] == gfd.as_str())
            .ok_or_else(|| anyhow::anyhow!("the chart rendered no DaemonSet {gfd}"))?;
        let containers = ds["spec"]["template"]["spec"]["containers"]
            .as_array_mut()
            .ok_or_else(|| anyhow::anyhow!("{gfd} has no containers"))?;
        let ctr = containers
            .iter_mut()
            .find(|c| c["name"] == "gpu-feature-discovery-ctr")
            .ok_or_else(|| anyhow::anyhow!("{gfd} has no gpu-feature-discovery-ctr"))?;
        ctr["volumeMounts"]
            .as_array_mut()
            .ok_or_else(|| anyhow::anyhow!("gpu-feature-discovery-ctr has no volumeMounts"))?
            .push(json!({"name": "driver-root", "mountPath": "/driver-root", "readOnly": true}));
        ctr["env"]
            .as_array_mut()
            .ok_or_else(|| anyhow::anyhow!("gpu-feature-discovery-ctr has no env"))?
            .push(json!({"name": "LD_LIBRARY_PATH", "value": "/driver-root/usr/lib64"}));
        Ok(objects)
    })
}

/// Removes what [`install_nvidia_device_plugin_chart`] applied and its namespace, GFD's
/// NodeFeature objects with it.
pub fn uninstall_nvidia_device_plugin_chart() -> anyhow::Result<()> {
    uninstall_rendered("nvidia-device-plugin", NVIDIA_DEVICE_PLUGIN_NS)
}

/// Waits until the Deployment `ns/name` has a Ready replica.
pub async fn wait_deployment_ready(
    client: &Client,
    ns: &str,
    name: &str,
    timeout: Duration,
) -> anyhow::Result<()> {
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), ns);
    wait::until(&format!("Deployment {ns}/{name} to be Ready"), timeout, || {
        let deployments = deployments.clone();
        async move {
            let d = deployments.get(name).await?;
            Ok(d.status.and_then(|s| s.ready_replicas).is_some_and(|r| r >= 1).then_some(()))
        }
    })
    .await
}

/// The mock's inventory in a node's driver root.
fn mock_inventory(node: &str) -> PathBuf {
    node_dir(node).join("driver-root/usr/lib64/nvml-mock.json")
}

/// Makes `node` a node whose NVIDIA driver is not loaded: its NVML init fails
/// (`NVML_ERROR_DRIVER_NOT_LOADED`, the mock without its inventory) for every process that
/// initialises it from now on. [`load_driver`] undoes it.
pub fn unload_driver(node: &str) -> anyhow::Result<()> {
    let inv = mock_inventory(node);
    std::fs::rename(&inv, inv.with_extension("json.unloaded"))?;
    Ok(())
}

/// Undoes [`unload_driver`]; a no-op where the driver is loaded.
pub fn load_driver(node: &str) -> anyhow::Result<()> {
    let inv = mock_inventory(node);
    let unloaded = inv.with_extension("json.unloaded");
    if unloaded.exists() {
        std::fs::rename(&unloaded, &inv)?;
    }
    Ok(())
}

/// One MIG device a repartitioned GPU holds: a GPU instance spanned by its compute instance 0.
#[derive(Clone, Debug)]
pub struct MigInstance {
    pub uuid: String,
    /// `1g.10gb`: one of an H100 80GB's profiles (`e2e/nvml-mock/src/mig.rs`).
    pub profile: &'static str,
    pub gpu_instance_id: u32,
    /// The memory slice its placement starts at.
    pub placement_start: u32,
    pub slices: u32,
    pub memory_bytes: u64,
    pub multiprocessors: u32,
}

/// Puts GPU `gpu` (its index in [`NODE_GPUS`]) of `node` in MIG mode with `instances`, as the GPU
/// Operator's MIG manager repartitions a node's GPU (`nvidia-smi mig -cgi ... -C`): the mock's
/// inventory in the node's driver root, which every process that initialises NVML from now on
/// reads. The mock refuses (NVML init fails) an instance that an H100 could not hold there.
/// [`restore_inventory`] undoes it.
pub fn partition_gpu(node: &str, gpu: usize, instances: &[MigInstance]) -> anyhow::Result<()> {
    let mut inv: serde_json::Value = serde_json::from_str(NODE_GPUS)?;
    let g = inv["gpus"].get_mut(gpu).ok_or_else(|| anyhow::anyhow!("{node} has no GPU {gpu}"))?;
    g["migEnabled"] = json!(true);
    g["mig"] = instances
        .iter()
        .map(|m| {
            json!({
                "uuid": m.uuid, "profile": m.profile, "memoryBytes": m.memory_bytes,
                "gpuInstanceId": m.gpu_instance_id, "computeInstanceId": 0,
                "multiprocessors": m.multiprocessors, "gpuInstanceSlices": m.slices,
                "placementStart": m.placement_start,
            })
        })
        .collect();
    std::fs::write(mock_inventory(node), serde_json::to_vec_pretty(&inv)?)?;
    Ok(())
}

/// Gives `node` the inventory every real node starts with ([`NODE_GPUS`]) again.
pub fn restore_inventory(node: &str) -> anyhow::Result<()> {
    std::fs::write(mock_inventory(node), NODE_GPUS)?;
    Ok(())
}

/// The minor NVIDIA's kernel module gives the capability device of a MIG GPU instance (`ci`
/// `None`) or of one of its compute instances, as `/proc/driver/nvidia-caps/mig-minors` lists them:
/// `config` 1, `monitor` 2, then per GPU 15 GPU instances of 9 entries each (the instance's
/// `access`, then its compute instances 0-7).
pub fn mig_cap_minor(gpu_minor: u32, gpu_instance: u32, compute_instance: Option<u32>) -> u32 {
    3 + gpu_minor * 15 * 9 + gpu_instance * 9 + compute_instance.map_or(0, |c| 1 + c)
}

/// The process of NVIDIA's GPU kubelet plugin on `node` (its container's `NODE_NAME`).
fn nvidia_kubelet_plugin_pid(node: &str) -> anyhow::Result<u32> {
    let env = format!("NODE_NAME={node}");
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc")?.flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else { continue };
        let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else { continue };
        let argv0 = cmdline.split(|b| *b == 0).next().unwrap_or_default();
        if !argv0.ends_with(b"gpu-kubelet-plugin") {
            continue;
        }
        let Ok(environ) = std::fs::read(format!("/proc/{pid}/environ")) else { continue };
        if environ.split(|b| *b == 0).any(|v| v == env.as_bytes()) {
            found.push(pid);
        }
    }
    match found[..] {
        [pid] => Ok(pid),
        _ => anyhow::bail!("want one gpu-kubelet-plugin process on {node}, found {found:?}"),
    }
}

/// Gives the container of NVIDIA's GPU kubelet plugin on `node` what NVIDIA's kernel module
/// publishes for the MIG devices of its GPU `gpu_minor`, which NVIDIA's driver reads to build a
/// MIG device's CDI spec and which no node here has without the module: the
/// `/proc/driver/nvidia/capabilities/gpu<N>/mig/gi<G>[/ci<C>]/access` files (their
/// `DeviceFileMinor` as [`mig_cap_minor`] numbers them) and an `nvidia-caps` line in
/// `/proc/devices` with a major from the range Linux reserves for local use that this machine does
/// not use. Bind-mounted over the container's own `/proc` entries, as NVIDIA's chart itself does to
/// `/proc/driver/nvidia/params` under nvkind; they last as long as that container. Returns the
/// major.
pub fn fake_mig_capabilities(node: &str, gpu_minor: u32, gpu_instances: &[u32]) -> anyhow::Result<u32> {
    let pid = nvidia_kubelet_plugin_pid(node)?;
    let devices = std::fs::read_to_string("/proc/devices")?;
    let (chars, blocks) =
        devices.split_once("\nBlock devices:").ok_or_else(|| anyhow::anyhow!("/proc/devices: {devices}"))?;
    let used: BTreeSet<u32> =
        chars.lines().filter_map(|l| l.split_whitespace().next()?.parse().ok()).collect();
    let major =
        (240..=254).find(|m| !used.contains(m)).ok_or_else(|| anyhow::anyhow!("no free local major"))?;
    // Staged in the container's own filesystem, from this side, then mounted from inside.
    let staged = "/tmp/switchyard-nvidia-procfs";
    let host = PathBuf::from(format!("/proc/{pid}/root{staged}"));
    let caps = host.join(format!("driver/nvidia/capabilities/gpu{gpu_minor}/mig"));
    let access = |minor: u32| format!("DeviceFileMinor: {minor}\nDeviceFileMode: 292\nDeviceFileModify: 1\n");
    for &gi in gpu_instances {
        let dir = caps.join(format!("gi{gi}"));
        std::fs::create_dir_all(dir.join("ci0"))?;
        std::fs::write(dir.join("access"), access(mig_cap_minor(gpu_minor, gi, None)))?;
        std::fs::write(dir.join("ci0/access"), access(mig_cap_minor(gpu_minor, gi, Some(0))))?;
    }
    std::fs::write(host.join("devices"), format!("{chars}\n{major} nvidia-caps\n\nBlock devices:{blocks}"))?;
    for (from, onto) in
        [(format!("{staged}/driver"), "/proc/driver"), (format!("{staged}/devices"), "/proc/devices")]
    {
        let out = Command::new("nsenter")
            .args(["-t", &pid.to_string(), "-m", "--", "mount", "--bind", &from, onto])
            .output()?;
        anyhow::ensure!(
            out.status.success(),
            "mount {from} on {onto} in pid {pid}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // What the plugin now reads, through its own mounts.
    let seen = std::fs::read_to_string(format!("/proc/{pid}/root/proc/devices"))?;
    anyhow::ensure!(seen.contains(&format!("\n{major} nvidia-caps\n")), "the plugin's /proc/devices: {seen}");
    Ok(major)
}

/// The pods a node's kubelet remembers device-plugin devices for, from its device-manager
/// checkpoint (`/var/lib/kubelet/device-plugins/kubelet_internal_checkpoint`): (pod UID, resource).
/// A pod listed here that runs no more is what kubernetes/kubernetes#141426 trips on.
pub fn device_plugin_checkpoint(node: &str) -> anyhow::Result<Vec<(String, String)>> {
    let path = node_dir(node).join("kubelet/device-plugins/kubelet_internal_checkpoint");
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e.into()),
    };
    let v: serde_json::Value = serde_json::from_str(&text)?;
    Ok(v["Data"]["PodDeviceEntries"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|e| {
            (
                e["PodUID"].as_str().unwrap_or_default().to_owned(),
                e["ResourceName"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect())
}

/// Restarts `node`'s kubelet (`e2e/hack/restart-kubelet.sh`), first removing its device-manager
/// checkpoint where `forget_device_plugin_state`; returns once the node is Ready again.
pub fn restart_kubelet(node: &str, forget_device_plugin_state: bool) -> anyhow::Result<()> {
    let mut cmd = Command::new("bash");
    cmd.arg(cluster::repo_root().join("e2e/hack/restart-kubelet.sh")).arg(node);
    if forget_device_plugin_state {
        cmd.arg("--forget-device-plugin-state");
    }
    let out = cmd.current_dir(cluster::repo_root()).output()?;
    anyhow::ensure!(
        out.status.success(),
        "restart-kubelet.sh {node}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

/// NVIDIA's device plugin as the cluster's device-plugin DaemonSet.
pub fn install_device_plugin() -> anyhow::Result<()> {
    kubectl(&["apply", "--server-side", "--force-conflicts", "-f", DEVICE_PLUGIN_MANIFEST]).map(|_| ())
}

/// The label the NVIDIA GPU Operator's device-plugin DaemonSet selects nodes by.
pub const LABEL_DEPLOY_DEVICE_PLUGIN: &str = "nvidia.com/gpu.deploy.device-plugin";

/// Installs NVIDIA's device plugin as the NVIDIA GPU Operator places it: the same DaemonSet,
/// marked `app.kubernetes.io/managed-by: gpu-operator` and selecting nodes by
/// `nvidia.com/gpu.deploy.device-plugin=true`, as the GPU Operator renders it from its
/// ClusterPolicy. [`uninstall_device_plugin`] removes it.
pub fn install_device_plugin_as_gpu_operator() -> anyhow::Result<()> {
    let manifest = std::fs::read_to_string(cluster::repo_root().join(DEVICE_PLUGIN_MANIFEST))?;
    let mut ds: serde_json::Value = serde_yaml::from_str(&manifest)?;
    ds["metadata"]["labels"]["app.kubernetes.io/managed-by"] = json!("gpu-operator");
    ds["spec"]["template"]["spec"]["nodeSelector"] = json!({LABEL_DEPLOY_DEVICE_PLUGIN: "true"});
    let path = cluster::repo_root().join("e2e/.cluster/nvidia-device-plugin-gpu-operator.json");
    std::fs::write(&path, ds.to_string())?;
    kubectl(&["apply", "--server-side", "--force-conflicts", "-f", &path.to_string_lossy()]).map(|_| ())
}

/// Removes the device plugin DaemonSet.
pub fn uninstall_device_plugin() -> anyhow::Result<()> {
    kubectl(&["delete", "--ignore-not-found", "--wait=true", "--timeout=60s", "-f", DEVICE_PLUGIN_MANIFEST])
        .map(|_| ())
}

/// A Deployment of `replicas` workload pods, each with a plain `nvidia.com/gpu: 1` limit and
/// nothing else GPU-specific: the same spec before and after the move. On `node` when given.
pub async fn gpu_workload(
    client: &Client,
    ns: &str,
    name: &str,
    replicas: i32,
    node: Option<&str>,
) -> anyhow::Result<()> {
    gpu_workload_of(client, ns, name, replicas, node, "nvidia.com/gpu").await
}

/// [`gpu_workload`] asking for one `resource` (`nvidia.com/gpu.shared`, a MIG profile) instead.
pub async fn gpu_workload_of(
    client: &Client,
    ns: &str,
    name: &str,
    replicas: i32,
    node: Option<&str>,
    resource: &str,
) -> anyhow::Result<()> {
    gpu_workload_asking(client, ns, name, replicas, node, resource, 1).await
}

/// [`gpu_workload_of`] whose pods each ask for `count` of `resource`.
pub async fn gpu_workload_asking(
    client: &Client,
    ns: &str,
    name: &str,
    replicas: i32,
    node: Option<&str>,
    resource: &str,
    count: u32,
) -> anyhow::Result<()> {
    let api: Api<Deployment> = Api::namespaced(client.clone(), ns);
    let node_selector = node.map(|n| json!({"kubernetes.io/hostname": n})).unwrap_or(json!({}));
    let d: Deployment = serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": gpu_pod_template(name, node_selector, resource, count),
        },
    }))?;
    api.create(&PostParams::default(), &d).await?;
    Ok(())
}

/// The pod template of a GPU workload labelled `app: <app>`: the workload image asking for
/// `count` of `resource` the plain way (a limit), on the nodes `node_selector` selects. It is
/// Ready only while the container sees a GPU device node (`/dev/nvidia<N>`), checked every second
/// through the runtime, so a PDB and the sampler's Ready count are about containers that have
/// their GPU.
fn gpu_pod_template(
    app: &str,
    node_selector: serde_json::Value,
    resource: &str,
    count: u32,
) -> serde_json::Value {
    json!({
        "metadata": {"labels": {"app": app}},
        "spec": {
            "terminationGracePeriodSeconds": 5,
            "nodeSelector": node_selector,
            "containers": [{
                "name": "cuda", "image": WORKLOAD_IMAGE, "imagePullPolicy": "Never",
                "resources": {"limits": {resource: count.to_string()}},
                "readinessProbe": {
                    "exec": {"command": ["sh", "-c", "ls /dev/nvidia[0-9]*"]},
                    "periodSeconds": 1,
                },
            }],
        },
    })
}

/// A DaemonSet of the workload image on every node labelled `pool=<pool>`, each pod asking for
/// one `nvidia.com/gpu` the plain way: a node agent (a monitoring or health DaemonSet) that holds
/// a GPU through the device plugin.
pub async fn gpu_daemon_set(client: &Client, ns: &str, name: &str, pool: &str) -> anyhow::Result<()> {
    let api: Api<DaemonSet> = Api::namespaced(client.clone(), ns);
    let ds: DaemonSet = serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {
            "selector": {"matchLabels": {"app": name}},
            "template": gpu_pod_template(name, json!({"pool": pool}), "nvidia.com/gpu", 1),
        },
    }))?;
    api.create(&PostParams::default(), &ds).await?;
    Ok(())
}

/// `NVIDIA_VISIBLE_DEVICES` and the `/dev/nvidia<N>` GPU nodes (not nvidiactl or uvm) the workload
/// printed.
pub fn what_the_container_saw(logs: &str) -> (String, Vec<String>) {
    let visible = logs
        .lines()
        .find_map(|l| l.strip_prefix("workload: NVIDIA_VISIBLE_DEVICES="))
        .unwrap_or_default()
        .to_owned();
    let gpus = logs
        .lines()
        .filter_map(|l| l.strip_prefix("workload: dev "))
        .filter(|l| {
            l.split_whitespace()
                .last()
                .is_some_and(|p| p.trim_start_matches("/dev/nvidia").parse::<u32>().is_ok())
        })
        .map(str::to_owned)
        .collect();
    (visible, gpus)
}

/// `switchyard plan -o json -f <manifest>` of `migration` (not created): its exit code and report.
pub fn plan_manifest(
    id: &str,
    migration: &impl serde::Serialize,
) -> anyhow::Result<(i32, serde_json::Value)> {
    let manifest = std::env::temp_dir().join(format!("{id}-plan.json"));
    std::fs::write(&manifest, serde_json::to_vec(migration)?)?;
    let out = Command::new(cluster::cli_bin())
        .arg("--kubeconfig")
        .arg(cluster::kubeconfig())
        .args(["plan", "-o", "json", "-f"])
        .arg(&manifest)
        .output()?;
    let _ = std::fs::remove_file(&manifest);
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).map_err(|e| {
        anyhow::anyhow!("switchyard plan -o json: {e}\n{}", String::from_utf8_lossy(&out.stderr))
    })?;
    Ok((out.status.code().unwrap_or(-1), report))
}

/// Asserts what [`crate::pool::Sampler::watch_containers`] saw of the workload's containers: no GPU
/// inside two running containers of one node at any pod event, and every running container's GPUs
/// read; with `workload`, at least one container read (where a scenario runs GPU pods, a check
/// that read none would prove nothing).
pub fn assert_gpus_held_once(samples: &Samples, workload: bool) {
    assert!(samples.shared_gpus.is_empty(), "a GPU was inside two containers: {:?}", samples.shared_gpus);
    assert!(samples.unread_containers.is_empty(), "containers' GPUs unread: {:?}", samples.unread_containers);
    assert!(!workload || samples.containers_read > 0, "the sampler read no workload container's GPUs");
}

/// The identity of a device node from the workload's `ls -l` line: `195:1 /dev/nvidia1`. The
/// line's time is when the runtime created the node in that container, so two containers that share
/// one GPU can print different lines for it.
pub fn device_node(ls_line: &str) -> Option<String> {
    let fields: Vec<&str> = ls_line.split_whitespace().collect();
    let at =
        fields.iter().position(|f| f.ends_with(',') && f.trim_end_matches(',').parse::<u32>().is_ok())?;
    let major = fields[at].trim_end_matches(',');
    let minor: u32 = fields.get(at + 1)?.parse().ok()?;
    Some(format!("{major}:{minor} {}", fields.last()?))
}

/// `kubectl logs` of a pod: through the API server to the kubelet on its node.
pub fn logs(ns: &str, pod: &str) -> anyhow::Result<String> {
    kubectl(&["-n", ns, "logs", pod])
}

/// Waits until `count` pods of `app` in `ns` run Ready, not terminating, and their logs say the
/// workload started; returns them.
pub async fn wait_workload(
    client: &Client,
    ns: &str,
    app: &str,
    count: usize,
    timeout: Duration,
) -> anyhow::Result<Vec<Pod>> {
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    let lp = ListParams::default().labels(&format!("app={app}"));
    wait::until(&format!("{count} Ready {app} pods in {ns}"), timeout, || {
        let (api, lp) = (api.clone(), lp.clone());
        async move {
            let pods: Vec<Pod> = api
                .list(&lp)
                .await?
                .items
                .into_iter()
                .filter(|p| p.metadata.deletion_timestamp.is_none() && ready(p))
                .collect();
            if pods.len() != count {
                return Ok(None);
            }
            for p in &pods {
                if !logs(ns, &p.name_any()).is_ok_and(|l| l.contains("workload: ready")) {
                    return Ok(None);
                }
            }
            Ok(Some(pods))
        }
    })
    .await
}

/// Waits until every node of `names` has `want` allocatable `resource` (the kubelet's device
/// manager's figure, from the device plugin that serves the node).
pub async fn wait_allocatable(
    client: &Client,
    names: &[String],
    resource: &str,
    want: i64,
    timeout: Duration,
) -> anyhow::Result<()> {
    let nodes: Api<Node> = Api::all(client.clone());
    wait::until(&format!("allocatable {resource} {want} on {}", names.join(", ")), timeout, || {
        let nodes = nodes.clone();
        async move {
            for n in names {
                if crate::pool::allocatable(&nodes.get(n).await?, resource) != want {
                    return Ok(None);
                }
            }
            Ok(Some(()))
        }
    })
    .await
}

/// The devices allocated to a claim: (driver, pool, device) of each result.
pub fn allocated(claim: &k8s_openapi::api::resource::v1::ResourceClaim) -> Vec<(String, String, String)> {
    claim
        .status
        .as_ref()
        .and_then(|s| s.allocation.as_ref())
        .and_then(|a| a.devices.as_ref())
        .and_then(|d| d.results.as_ref())
        .map(|r| r.iter().map(|r| (r.driver.clone(), r.pool.clone(), r.device.clone())).collect())
        .unwrap_or_default()
}

/// Deletes the GpuPoolMigration `name` if it exists, and waits until it is gone (the operator
/// releases its finalizer).
pub async fn delete_migration(client: &Client, name: &str) -> anyhow::Result<()> {
    use switchyard_operator::api::v1alpha1::GpuPoolMigration;
    let migrations: Api<GpuPoolMigration> = Api::all(client.clone());
    if migrations.get_opt(name).await?.is_none() {
        return Ok(());
    }
    migrations.delete(name, &kube::api::DeleteParams::default()).await?;
    wait::until(&format!("migration {name} to be deleted"), Duration::from_secs(120), || {
        let migrations = migrations.clone();
        async move { Ok(migrations.get_opt(name).await?.is_none().then_some(())) }
    })
    .await
}

/// Deletes the namespace `ns` if it exists, and waits until it is gone.
pub async fn delete_namespace(client: &Client, ns: &str) -> anyhow::Result<()> {
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    if namespaces.get_opt(ns).await?.is_none() {
        return Ok(());
    }
    let _ = namespaces.delete(ns, &kube::api::DeleteParams::default()).await;
    wait::until(&format!("namespace {ns} to be deleted"), Duration::from_secs(120), || {
        let namespaces = namespaces.clone();
        async move { Ok(namespaces.get_opt(ns).await?.is_none().then_some(())) }
    })
    .await
}

/// Removes `labels` from each node of `names` and uncordons it, then fails if any real node still
/// carries a `switchyard.dev/` annotation: a migration's state left behind.
pub async fn release_nodes(client: &Client, names: &[String], labels: &[&str]) -> anyhow::Result<()> {
    let nodes: Api<Node> = Api::all(client.clone());
    let unset: serde_json::Map<String, serde_json::Value> =
        labels.iter().map(|l| (l.to_string(), serde_json::Value::Null)).collect();
    for n in names {
        label(client, n, serde_json::Value::Object(unset.clone())).await?;
        nodes
            .patch(n, &PatchParams::default(), &Patch::Merge(json!({"spec": {"unschedulable": null}})))
            .await?;
    }
    let left: Vec<String> = nodes
        .list(&ListParams::default().labels(&format!("{LABEL_REAL_NODE}=true")))
        .await?
        .items
        .iter()
        .flat_map(|n| {
            n.annotations()
                .keys()
                .filter(|k| k.starts_with(switchyard_operator::well_known::SWITCHYARD_PREFIX))
                .map(|k| format!("{}: {k}", n.name_any()))
        })
        .collect();
    anyhow::ensure!(left.is_empty(), "migration state left on real nodes: {left:?}");
    Ok(())
}

/// Runs a scenario that installs the packaged operator, with the cluster to itself (the operator
/// manages every GpuPoolMigration of the cluster, so no other scenario may run beside it), on the
/// real nodes, under a fresh id that starts with `prefix`. `cleanup`, then [`recover_gpus`], runs
/// whatever the outcome, a failed assertion (a panic) included, so the operator never outlives the
/// scenario on the shared cluster; `diagnostics` is printed first when the scenario failed.
pub async fn alone_on_real_nodes(
    prefix: &str,
    scenario: impl AsyncFnOnce(&Client, &str, &[String]) -> anyhow::Result<()>,
    diagnostics: fn(&str) -> String,
    cleanup: impl AsyncFnOnce(&Client, &str, &[String]) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    use futures::FutureExt;
    let _cluster = crate::locks::cluster_alone().await?;
    let client = cluster::client().await?;
    let names: Vec<String> = nodes(&client).await?.iter().map(|n| n.name_any()).collect();
    let id = cluster::unique(prefix);
    let outcome = std::panic::AssertUnwindSafe(scenario(&client, &id, &names)).catch_unwind().await;
    if !matches!(outcome, Ok(Ok(()))) {
        eprintln!("{}", diagnostics(&id));
    }
    let cleaned = cleanup(&client, &id, &names).await;
    let cleaned = cleaned.and(recover_gpus(&names));
    match outcome {
        Err(panic) => std::panic::resume_unwind(panic),
        Ok(result) => result.and(cleaned),
    }
}

/// What a failed scenario on the real nodes prints: the migration `id`, every pod, the
/// ResourceSlices, the operator's log, then `more`, each a kubectl command line whose output (or
/// error) is added.
pub fn diagnostics(id: &str, more: &[&[&str]]) -> String {
    let run = |args: &[&str]| kubectl(args).unwrap_or_else(|e| format!("{e:#}"));
    let operator_logs = [
        "-n",
        SYSTEM_NS,
        "logs",
        "-l",
        "app.kubernetes.io/name=switchyard-operator",
        "--tail=60",
        "--prefix",
    ];
    let mut out = vec![
        run(&["get", "gpm", id, "-o", "yaml"]),
        run(&["get", "pods", "-A", "-o", "wide"]),
        run(&["get", "resourceslices", "-o", "wide"]),
        run(&operator_logs),
    ];
    out.extend(more.iter().map(|args| run(args)));
    out.join("\n")
}

/// The last lines of the Switchyard agents' logs, for [`diagnostics`].
pub const AGENT_LOGS: &[&str] = &[
    "-n",
    SYSTEM_NS,
    "logs",
    "-l",
    "app.kubernetes.io/name=switchyard-driver-agent",
    "--tail=30",
    "--prefix",
];

/// `kubectl apply --server-side` of one object (or a `List`) given as JSON.
pub fn kubectl_apply_json(object: &serde_json::Value) -> anyhow::Result<()> {
    let path = std::env::temp_dir().join(format!("switchyard-e2e-apply-{}.json", std::process::id()));
    std::fs::write(&path, object.to_string())?;
    let applied = kubectl(&["apply", "--server-side", "--force-conflicts", "-f", &path.to_string_lossy()]);
    let _ = std::fs::remove_file(&path);
    applied.map(|_| ())
}

/// The namespace Kueue is installed in, as its docs install it.
pub const KUEUE_NS: &str = "kueue-system";

/// Installs Kueue as `helm install` of its chart would (e2e/hack/render-kueue.sh, applied
/// unchanged), then waits until its manager is Ready and the API server gets answers from its
/// webhooks: a server-side dry run of a ResourceFlavor passes Kueue's validating webhook.
pub async fn install_kueue(client: &Client) -> anyhow::Result<()> {
    install_rendered("kueue", KUEUE_NS, &[], Ok)?;
    wait_deployment_ready(client, KUEUE_NS, "kueue-controller-manager", Duration::from_secs(180)).await?;
    let probe = json!({"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor",
                       "metadata": {"name": "switchyard-e2e-webhook-probe"}});
    let path = cluster::repo_root().join("e2e/.cluster/kueue-probe.json");
    std::fs::write(&path, probe.to_string())?;
    wait::until("the API server to reach Kueue's webhooks", Duration::from_secs(120), || {
        let path = path.clone();
        async move {
            // Refused while the webhooks' Service has no endpoint: not yet, and the last refusal
            // is what the timeout reports.
            kubectl(&["create", "--dry-run=server", "-f", &path.to_string_lossy()]).map_err(wait::not_yet)?;
            Ok(Some(()))
        }
    })
    .await
}

/// Removes what [`install_kueue`] applied, its aggregated APIs and webhooks first (an aggregated
/// API left without its server would stall namespace deletion), then its namespace.
pub fn uninstall_kueue() -> anyhow::Result<()> {
    if rendered("kueue").exists() {
        for kind in ["apiservices", "mutatingwebhookconfigurations", "validatingwebhookconfigurations"] {
            kubectl(&["delete", kind, "-l", "app.kubernetes.io/name=kueue", "--ignore-not-found"])?;
        }
    }
    uninstall_rendered("kueue", KUEUE_NS)
}

/// Whether the pod's Ready condition is True.
pub fn ready(p: &Pod) -> bool {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// A GpuPoolMigration of the real nodes labelled `pool=<name>` from NVIDIA's device plugin
/// (`kube-system/nvidia-device-plugin-daemonset`) to `driver`, whose kubelet plugin is the
/// DaemonSet `driver_ds` (namespace, name): `nvidia.com/gpu` through the DeviceClass `class`
/// selecting the driver's `type: gpu` devices, one node at a time, a 5 s grace period and a pause
/// canary. `placement` is Managed or GpuOperator. Scenarios add what they test to the JSON.
pub fn pool_migration(
    name: &str,
    driver: &str,
    class: &str,
    driver_ds: (&str, &str),
    placement: &str,
) -> serde_json::Value {
    json!({
        "apiVersion": "switchyard.dev/v1alpha1", "kind": "GpuPoolMigration",
        "metadata": {"name": name},
        "spec": {
            "nodeSelector": {"matchLabels": {"pool": name}},
            "resources": [{"extendedResourceName": "nvidia.com/gpu", "deviceClassName": class,
                           "selector": format!("device.attributes['{driver}'].type == 'gpu'")}],
            "driver": {"name": driver, "daemonSet": {"namespace": driver_ds.0, "name": driver_ds.1}},
            "devicePlugin": {"daemonSet": {"namespace": "kube-system", "name": "nvidia-device-plugin-daemonset"}},
            "placement": placement,
            "strategy": {
                "maxUnavailable": 1,
                "drain": {"gracePeriodSeconds": 5, "timeoutSeconds": 180},
                "verify": {"timeoutSeconds": 180, "canary": {"image": "registry.k8s.io/pause:3.10", "command": ["/pause", "-v"]}},
            },
        },
    })
}

/// `kubectl delete -f` of a manifest, waiting up to 2 minutes for its objects to go.
fn delete_file(path: &std::path::Path) -> anyhow::Result<()> {
    kubectl(&["delete", "--ignore-not-found", "--wait=true", "--timeout=120s", "-f", &path.to_string_lossy()])
        .map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::device_node;

    #[test]
    fn a_device_node_is_its_numbers_and_path_whatever_its_time() {
        let a = "crw-rw-rw-    1 0        0         195,   1 Dec  7 14:58 /dev/nvidia1";
        let b = "crw-rw-rw-    1 0        0         195,   1 Dec  7 14:59 /dev/nvidia1";
        assert_eq!(device_node(a).as_deref(), Some("195:1 /dev/nvidia1"));
        assert_eq!(device_node(a), device_node(b));
        assert_ne!(device_node(a), device_node("crw-rw-rw- 1 0 0 195, 0 Dec  7 14:58 /dev/nvidia0"));
        assert_eq!(device_node("-rw-r--r-- 1 0 0 12 Dec  7 14:58 /dev/nvidia1"), None);
    }
}
