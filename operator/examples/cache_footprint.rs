//! What the operator's caches cost per object: builds `N` nodes shaped as the scale simulator's
//! (and `N` ResourceSlices of 4 GPUs), runs each through the same trim and reflector store as the
//! operator's watches, and prints the resident memory they add. No API server. Nodes and slices
//! are each stored twice for comparison: as the cache holds them (nodes read as
//! `node_fields::SlimNode`, slices as `cache::CachedSlice`), and as it held them before (nodes as a
//! `Node` trimmed to the same fields, slices whole less `managedFields`). Then the nodes again with
//! the labels a GPU Operator node carries (56), in both forms.
//!
//! ```sh
//! cargo run --release -p switchyard-operator --example cache-footprint -- 5000
//! ```

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::ResourceSlice;
use kube::runtime::reflector;
use kube::runtime::watcher::Event;
use serde_json::json;
use switchyard_operator::cache;
use switchyard_operator::node::slim::SlimNode;
use switchyard_operator::runtime::alloc;

/// The operator's allocator, which gives freed pages back at once here (no decay), so that each
/// RSS reading below is the live objects' pages.
#[global_allocator]
static ALLOCATOR: alloc::Jemalloc = alloc::Jemalloc;

#[unsafe(export_name = "_rjem_malloc_conf")]
static MALLOC_CONF: alloc::Conf =
    alloc::Conf(c"background_thread:false,narenas:1,dirty_decay_ms:0,muzzy_decay_ms:0".as_ptr());

fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// jemalloc's bytes in use, as the operator's `switchyard_heap_in_use_bytes` reads them.
fn heap_kib() -> u64 {
    alloc::heap_in_use().unwrap_or(0) / 1024
}

/// A scale-simulator node; with `gpu_operator`, also the labels GPU Feature Discovery and Node
/// Feature Discovery put on a real GPU node.
fn node_json(i: usize, gpu_operator: bool) -> String {
    let name = format!("scale-n{i:05}");
    let now = "2026-12-02T10:00:00Z";
    let res = json!({"cpu": "32", "memory": "256Gi", "pods": "110", "nvidia.com/gpu": "4"});
    let cond = |t: &str, s: &str| {
        json!({"type": t, "status": s, "reason": "R", "message": "simulated",
        "lastHeartbeatTime": now, "lastTransitionTime": now})
    };
    let mut labels = json!({"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
        "e2e.switchyard.dev/pool": "scale-12345", "sim.switchyard.dev/instance": "scale-12345",
        "wave": "wide", "switchyard.dev/gpu-backend": "device-plugin"});
    if gpu_operator {
        for (k, v) in gpu_operator_labels(i) {
            labels[k] = json!(v);
        }
    }
    json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "uid": format!("0b6c3c1e-0000-4000-8000-{i:012}"), "resourceVersion": "123456",
            "creationTimestamp": now,
            "labels": labels,
            "annotations": {"sim.switchyard.dev/layout": "{\"gpus\":4,\"product\":\"NVIDIA H100 80GB HBM3\",\"mig_gpus\":[]}",
                            "node.alpha.kubernetes.io/ttl": "0"},
            "managedFields": [
                {"manager": "sim", "operation": "Update", "apiVersion": "v1", "time": now, "fieldsType": "FieldsV1",
                 "fieldsV1": {"f:metadata": {"f:labels": {".": {}, "f:kubernetes.io/hostname": {}}}}},
                {"manager": "sim", "operation": "Update", "apiVersion": "v1", "time": now, "fieldsType": "FieldsV1",
                 "subresource": "status", "fieldsV1": {"f:status": {"f:allocatable": {}, "f:capacity": {}}}}]},
        "spec": {"podCIDR": "10.0.0.0/24"},
        "status": {"capacity": res, "allocatable": res,
            "conditions": [cond("Ready", "True"), cond("MemoryPressure", "False"), cond("DiskPressure", "False"),
                           cond("PIDPressure", "False")],
            "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}, {"type": "Hostname", "address": name}],
            "nodeInfo": {"machineID": name, "systemUUID": name, "bootID": "sim", "kernelVersion": "6.1.0-sim",
                "osImage": "Simulated GPU node", "containerRuntimeVersion": "containerd://2.1.4",
                "kubeletVersion": "v1.37.2", "kubeProxyVersion": "", "operatingSystem": "linux", "architecture": "amd64"},
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}}}
    })
    .to_string()
}

/// The labels of an 8-GPU H100 node under the GPU Operator: GPU Feature Discovery's, the
/// operator's deploy labels, Node Feature Discovery's most common, and the cloud's topology. 56
/// labels, of which only the hostname, the instance id and the timestamp differ between nodes.
fn gpu_operator_labels(i: usize) -> Vec<(String, String)> {
    let mut l: Vec<(String, String)> = [
        ("nvidia.com/cuda.driver-version.full", "570.124.06"),
        ("nvidia.com/cuda.driver-version.major", "570"),
        ("nvidia.com/cuda.driver-version.minor", "124"),
        ("nvidia.com/cuda.driver-version.revision", "06"),
        ("nvidia.com/cuda.driver.major", "570"),
        ("nvidia.com/cuda.driver.minor", "124"),
        ("nvidia.com/cuda.driver.rev", "06"),
        ("nvidia.com/cuda.runtime-version.full", "12.8"),
        ("nvidia.com/cuda.runtime-version.major", "12"),
        ("nvidia.com/cuda.runtime-version.minor", "8"),
        ("nvidia.com/cuda.runtime.major", "12"),
        ("nvidia.com/cuda.runtime.minor", "8"),
        ("nvidia.com/gpu.compute.major", "9"),
        ("nvidia.com/gpu.compute.minor", "0"),
        ("nvidia.com/gpu.count", "8"),
        ("nvidia.com/gpu.family", "hopper"),
        ("nvidia.com/gpu.machine", "p5.48xlarge"),
        ("nvidia.com/gpu.memory", "81559"),
        ("nvidia.com/gpu.mode", "compute"),
        ("nvidia.com/gpu.present", "true"),
        ("nvidia.com/gpu.product", "NVIDIA-H100-80GB-HBM3"),
        ("nvidia.com/gpu.replicas", "1"),
        ("nvidia.com/gpu.sharing-strategy", "none"),
        ("nvidia.com/mig.capable", "true"),
        ("nvidia.com/mig.strategy", "single"),
        ("nvidia.com/mps.capable", "false"),
        ("nvidia.com/vgpu.present", "false"),
        ("nvidia.com/gpu.deploy.container-toolkit", "true"),
        ("nvidia.com/gpu.deploy.dcgm", "true"),
        ("nvidia.com/gpu.deploy.dcgm-exporter", "true"),
        ("nvidia.com/gpu.deploy.device-plugin", "true"),
        ("nvidia.com/gpu.deploy.driver", "true"),
        ("nvidia.com/gpu.deploy.gpu-feature-discovery", "true"),
        ("nvidia.com/gpu.deploy.mig-manager", "true"),
        ("nvidia.com/gpu.deploy.node-status-exporter", "true"),
        ("nvidia.com/gpu.deploy.operator-validator", "true"),
        ("nvidia.com/gpu-driver-upgrade-state", "upgrade-done"),
        ("feature.node.kubernetes.io/cpu-cpuid.AVX512F", "true"),
        ("feature.node.kubernetes.io/cpu-cpuid.AMXTILE", "true"),
        ("feature.node.kubernetes.io/cpu-hardware_multithreading", "true"),
        ("feature.node.kubernetes.io/cpu-model.family", "6"),
        ("feature.node.kubernetes.io/cpu-model.id", "143"),
        ("feature.node.kubernetes.io/cpu-model.vendor_id", "Intel"),
        ("feature.node.kubernetes.io/kernel-version.full", "6.1.0-28-cloud-amd64"),
        ("feature.node.kubernetes.io/kernel-version.major", "6"),
        ("feature.node.kubernetes.io/pci-10de.present", "true"),
        ("feature.node.kubernetes.io/system-os_release.ID", "ubuntu"),
        ("feature.node.kubernetes.io/system-os_release.VERSION_ID", "22.04"),
        ("node.kubernetes.io/instance-type", "p5.48xlarge"),
        ("topology.kubernetes.io/region", "us-east-1"),
        ("topology.kubernetes.io/zone", "us-east-1a"),
        ("karpenter.sh/nodepool", "gpu-h100"),
        ("karpenter.sh/capacity-type", "on-demand"),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    l.push(("nvidia.com/gfd.timestamp".into(), format!("{}", 1_764_669_600 + i)));
    l.push(("node.kubernetes.io/instance-id".into(), format!("i-0{i:016x}")));
    l.push(("alpha.eksctl.io/nodegroup-name".into(), "gpu-h100".into()));
    l
}

/// `node` with only what a `SlimNode` keeps, still a `Node`: how the cache held nodes before.
fn trimmed(node: Node) -> Node {
    use k8s_openapi::api::core::v1::{NodeCondition, NodeSpec, NodeStatus, NodeSystemInfo};
    let mut meta = node.metadata;
    meta.managed_fields = Some(Vec::new());
    if let Some(a) = meta.annotations.as_mut() {
        a.retain(|k, _| k.starts_with("switchyard.dev/"));
    }
    let spec = node.spec.unwrap_or_default();
    let status = node.status.unwrap_or_default();
    let extended = |m: Option<std::collections::BTreeMap<String, _>>| {
        m.map(|m| {
            m.into_iter().filter(|(k, _)| k.contains('/')).collect::<std::collections::BTreeMap<_, _>>()
        })
    };
    let (allocatable, capacity) = (extended(status.allocatable), extended(status.capacity));
    let info = status.node_info.unwrap_or_default();
    Node {
        metadata: meta,
        spec: Some(NodeSpec { unschedulable: spec.unschedulable, taints: spec.taints, ..Default::default() }),
        status: Some(NodeStatus {
            capacity: Some(capacity).filter(|c| *c != allocatable).flatten(),
            allocatable,
            conditions: status.conditions.map(|cs| {
                cs.into_iter()
                    .filter(|c| c.type_ == "Ready")
                    .map(|c| NodeCondition { type_: c.type_, status: c.status, ..Default::default() })
                    .collect()
            }),
            node_info: Some(NodeSystemInfo {
                kubelet_version: info.kubelet_version,
                container_runtime_version: info.container_runtime_version,
                ..Default::default()
            }),
            ..Default::default()
        }),
    }
}

fn slice_json(i: usize) -> String {
    let node = format!("scale-n{i:05}");
    let devices: Vec<_> = (0..4)
        .map(|g| json!({"name": format!("gpu-{g}"), "attributes": {
            "type": {"string": "gpu"}, "uuid": {"string": format!("GPU-{node}-{g}")},
            "productName": {"string": "NVIDIA H100 80GB HBM3"}, "resource.kubernetes.io/numaNode": {"int": 0}},
            "capacity": {"memory": {"value": "80Gi"}}}))
        .collect();
    json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": format!("{node}-gpu-switchyard-dev"), "uid": format!("1b6c3c1e-0000-4000-8000-{i:012}"),
            "resourceVersion": "123456", "creationTimestamp": "2026-12-02T10:00:00Z",
            "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": node, "uid": "0b6c3c1e-0000-4000-8000-000000000000"}],
            "managedFields": [{"manager": "sim", "operation": "Update", "apiVersion": "resource.k8s.io/v1",
                "time": "2026-12-02T10:00:00Z", "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {"f:devices": {}}}}]},
        "spec": {"driver": "gpu.switchyard.dev", "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1}, "devices": devices}})
    .to_string()
}

fn main() {
    let n: usize = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(5000);
    let start = rss_kib();
    let heap_start = heap_kib();
    let (nodes, mut writer) = reflector::store::<SlimNode>();
    writer.apply_watcher_event(&Event::Init);
    for i in 0..n {
        let node: SlimNode = serde_json::from_str(&node_json(i, false)).expect("node");
        writer.apply_watcher_event(&Event::InitApply(node));
    }
    writer.apply_watcher_event(&Event::InitDone);
    let after_nodes = rss_kib();
    let heap_nodes = heap_kib();
    let (whole_nodes, mut nwriter) = reflector::store::<Node>();
    nwriter.apply_watcher_event(&Event::Init);
    for i in 0..n {
        let node: Node = serde_json::from_str(&node_json(i, false)).expect("node");
        nwriter.apply_watcher_event(&Event::InitApply(trimmed(node)));
    }
    nwriter.apply_watcher_event(&Event::InitDone);
    let after_whole_nodes = rss_kib();
    let heap_whole_nodes = heap_kib();
    let (slices, mut swriter) = reflector::store::<cache::CachedSlice>();
    swriter.apply_watcher_event(&Event::Init);
    for i in 0..n {
        let slice: ResourceSlice = serde_json::from_str(&slice_json(i)).expect("slice");
        swriter.apply_watcher_event(&Event::InitApply(cache::CachedSlice::new(slice)));
    }
    swriter.apply_watcher_event(&Event::InitDone);
    let after_slices = rss_kib();
    let heap_slices = heap_kib();
    let (whole, mut wwriter) = reflector::store::<ResourceSlice>();
    wwriter.apply_watcher_event(&Event::Init);
    for i in 0..n {
        let mut slice: ResourceSlice = serde_json::from_str(&slice_json(i)).expect("slice");
        cache::trim(&mut slice);
        wwriter.apply_watcher_event(&Event::InitApply(slice));
    }
    wwriter.apply_watcher_event(&Event::InitDone);
    let after_whole = rss_kib();
    let heap_whole = heap_kib();
    let per = |kib: u64| (kib as f64 / 1024.0, kib as f64 * 1024.0 / n as f64);
    let (nodes_mib, node_b) = per(after_nodes - start);
    let (trimmed_mib, trimmed_b) = per(after_whole_nodes - after_nodes);
    let (slices_mib, slice_b) = per(after_slices - after_whole_nodes);
    let (whole_mib, whole_b) = per(after_whole - after_slices);
    let heap = |kib: u64| kib as f64 * 1024.0 / n as f64;
    println!(
        "{n} nodes as cached ({}): {nodes_mib:.1} MiB, {node_b:.0} B a node (heap in use {:.0} B)",
        nodes.state().len(),
        heap(heap_nodes - heap_start)
    );
    println!(
        "{n} nodes as a trimmed Node ({}): {trimmed_mib:.1} MiB, {trimmed_b:.0} B a node (heap in use {:.0} B)",
        whole_nodes.state().len(),
        heap(heap_whole_nodes - heap_nodes)
    );
    println!(
        "{n} slices as cached ({}): {slices_mib:.1} MiB, {slice_b:.0} B a slice (heap in use {:.0} B)",
        slices.state().len(),
        heap(heap_slices - heap_whole_nodes)
    );
    println!(
        "{n} slices whole ({}): {whole_mib:.1} MiB, {whole_b:.0} B a slice (heap in use {:.0} B)",
        whole.state().len(),
        heap(heap_whole - heap_slices)
    );
    // The same nodes with a GPU Operator node's labels, in both forms.
    let (before_rss, before_heap) = (rss_kib(), heap_kib());
    let (labelled, mut lwriter) = reflector::store::<SlimNode>();
    lwriter.apply_watcher_event(&Event::Init);
    for i in 0..n {
        let node: SlimNode = serde_json::from_str(&node_json(i, true)).expect("node");
        lwriter.apply_watcher_event(&Event::InitApply(node));
    }
    lwriter.apply_watcher_event(&Event::InitDone);
    let (after_labelled, heap_labelled) = (rss_kib(), heap_kib());
    let (labelled_whole, mut lwwriter) = reflector::store::<Node>();
    lwwriter.apply_watcher_event(&Event::Init);
    for i in 0..n {
        let node: Node = serde_json::from_str(&node_json(i, true)).expect("node");
        lwwriter.apply_watcher_event(&Event::InitApply(trimmed(node)));
    }
    lwwriter.apply_watcher_event(&Event::InitDone);
    let (after_labelled_whole, heap_labelled_whole) = (rss_kib(), heap_kib());
    let labels = labelled.state().first().map_or(0, |n| n.labels().len());
    let (mib, b) = per(after_labelled - before_rss);
    println!(
        "{n} nodes with {labels} labels as cached ({}): {mib:.1} MiB, {b:.0} B a node (heap in use {:.0} B)",
        labelled.state().len(),
        heap(heap_labelled - before_heap)
    );
    let (mib, b) = per(after_labelled_whole - after_labelled);
    println!(
        "{n} nodes with {labels} labels as a trimmed Node ({}): {mib:.1} MiB, {b:.0} B a node (heap in use {:.0} B)",
        labelled_whole.state().len(),
        heap(heap_labelled_whole - heap_labelled)
    );
    println!("strings interned: {}", switchyard_operator::node::str_map::interned());
    println!("process at start: {:.1} MiB", start as f64 / 1024.0);
}
