//! What the operator's caches cost per object: builds `N` nodes shaped as the scale simulator's
//! (and `N` ResourceSlices of 4 GPUs), runs each through the same trim and reflector store as the
//! operator's watches, and prints the resident memory they add. No API server. Nodes and slices
//! are each stored twice for comparison: as the cache holds them (nodes read as
//! `node_fields::SlimNode`, slices as `cache::CachedSlice`), and as it held them before (nodes as a
//! `Node` trimmed to the same fields, slices whole less `managedFields`).
//!
//! ```sh
//! cargo run --release -p switchyard-operator --example cache-footprint -- 5000
//! ```

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::ResourceSlice;
use kube::runtime::reflector;
use kube::runtime::watcher::Event;
use serde_json::json;
use switchyard_operator::alloc;
use switchyard_operator::cache;
use switchyard_operator::node_fields::SlimNode;

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

fn node_json(i: usize) -> String {
    let name = format!("scale-n{i:05}");
    let now = "2026-12-02T10:00:00Z";
    let res = json!({"cpu": "32", "memory": "256Gi", "pods": "110", "nvidia.com/gpu": "4"});
    let cond = |t: &str, s: &str| {
        json!({"type": t, "status": s, "reason": "R", "message": "simulated",
        "lastHeartbeatTime": now, "lastTransitionTime": now})
    };
    json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "uid": format!("0b6c3c1e-0000-4000-8000-{i:012}"), "resourceVersion": "123456",
            "creationTimestamp": now,
            "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
                       "e2e.switchyard.dev/pool": "scale-12345", "sim.switchyard.dev/instance": "scale-12345",
                       "wave": "wide", "switchyard.dev/gpu-backend": "device-plugin"},
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
        let node: SlimNode = serde_json::from_str(&node_json(i)).expect("node");
        writer.apply_watcher_event(&Event::InitApply(node));
    }
    writer.apply_watcher_event(&Event::InitDone);
    let after_nodes = rss_kib();
    let heap_nodes = heap_kib();
    let (whole_nodes, mut nwriter) = reflector::store::<Node>();
    nwriter.apply_watcher_event(&Event::Init);
    for i in 0..n {
        let node: Node = serde_json::from_str(&node_json(i)).expect("node");
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
    println!("process at start: {:.1} MiB", start as f64 / 1024.0);
}
