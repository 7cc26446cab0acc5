//! The GPU gauges' figures: a node's physical GPUs and which backend serves them now. Pure.
//!
//! A node counts by its physical GPUs whatever serves it, so a pool's total stays flat across a
//! healthy migration: a time-sliced node's replicas count as the GPUs behind them, and a node
//! between backends (its device plugin gone, the driver not publishing yet) counts under `none`
//! instead of dropping out. The physical count comes from, in order:
//!
//! 1. GPU Feature Discovery's `nvidia.com/gpu.count` label, which outlives the switch;
//! 2. the GPUs behind the DRA devices the node publishes ([`crate::pool::overlap::physical_gpus`]);
//! 3. the `nvidia.com/gpu` count recorded on the node when its drain started
//!    ([`ANNOTATION_GPUS_BEFORE`], physical GPUs already for a shared node);
//! 4. what the device plugin advertises, shared GPUs counted once
//!    ([`capacity::sharing`]), capacity included, which the kubelet keeps for minutes after the
//!    plugin leaves.
//!
//! A MIG node without GFD's label and not yet on DRA counts 0: the device plugin advertises MIG
//! devices, not the GPUs behind them.

use std::collections::{BTreeMap, HashMap};

use kube::ResourceExt;

use crate::cache::DeviceCounts;
use crate::node::slim::SlimNode;
use crate::pool::capacity::{self, LABEL_GPU_COUNT};
use crate::well_known::{ANNOTATION_GPUS_BEFORE, NVIDIA_GPU_RESOURCE};

/// What serves a node's GPUs now, the gauges' `backend` label.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Serving {
    /// The device plugin advertises GPUs (allocatable above 0).
    DevicePlugin,
    /// The node publishes DRA devices its node-wide taints do not keep out.
    Dra,
    /// Neither: between backends, or its backend is down.
    None,
}

/// GPUs by what serves them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GpusByBackend {
    pub device_plugin: u64,
    pub dra: u64,
    pub none: u64,
}

impl GpusByBackend {
    pub fn add(&mut self, serving: Serving, gpus: u64) {
        match serving {
            Serving::DevicePlugin => self.device_plugin += gpus,
            Serving::Dra => self.dra += gpus,
            Serving::None => self.none += gpus,
        }
    }
}

/// The physical GPUs of `node` (see the module), given what its DRA slices hold.
pub fn physical(node: &SlimNode, dra: DeviceCounts) -> u64 {
    if let Some(count) = node.labels().get(LABEL_GPU_COUNT).and_then(|v| v.trim().parse().ok()) {
        return count;
    }
    if dra.physical > 0 {
        return dra.physical;
    }
    let before = node
        .annotations()
        .get(ANNOTATION_GPUS_BEFORE)
        .and_then(|s| serde_json::from_str::<BTreeMap<String, u64>>(s).ok())
        .and_then(|m| m.get(NVIDIA_GPU_RESOURCE).copied())
        .filter(|n| *n > 0);
    if let Some(n) = before {
        return n;
    }
    capacity::sharing(node).map_or_else(|| capacity::advertised(node, NVIDIA_GPU_RESOURCE), |s| s.physical)
}

/// What serves `node` now: the device plugin while it advertises GPUs (`device_plugin_serves`),
/// else DRA while the node publishes devices, else neither.
pub fn serving(device_plugin_serves: bool, dra: DeviceCounts) -> Serving {
    if device_plugin_serves {
        Serving::DevicePlugin
    } else if dra.present > 0 {
        Serving::Dra
    } else {
        Serving::None
    }
}

/// Every GPU node of the cluster by what serves it, for `switchyard_cluster_gpus`: `dra` holds the
/// DRA device counts by node of the GPU drivers, `is_gpu` tells a device plugin's GPU resource.
/// A node without GPUs by any account counts for nothing.
pub fn cluster<'a>(
    nodes: impl IntoIterator<Item = &'a SlimNode>,
    dra: &HashMap<String, DeviceCounts>,
    is_gpu: impl Fn(&str) -> bool,
) -> GpusByBackend {
    let mut out = GpusByBackend::default();
    for node in nodes {
        let counts = dra.get(node.name_any().as_str()).copied().unwrap_or_default();
        let gpus = physical(node, counts);
        if gpus == 0 {
            continue;
        }
        let plugin = node.allocatable().any(|(k, q)| is_gpu(k) && q.0.trim() != "0");
        out.add(serving(plugin, counts), gpus);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pool::overlap;
    use serde_json::json;

    fn node(
        labels: serde_json::Value,
        annotations: serde_json::Value,
        capacity: serde_json::Value,
        allocatable: serde_json::Value,
    ) -> SlimNode {
        serde_json::from_value(json!({
            "metadata": {"name": "n", "labels": labels, "annotations": annotations},
            "status": {"capacity": capacity, "allocatable": allocatable},
        }))
        .unwrap()
    }

    fn dra(present: u64, physical: u64) -> DeviceCounts {
        DeviceCounts { devices: present, schedulable: present, present, physical }
    }

    #[test]
    fn a_node_counts_its_physical_gpus_at_every_step_of_its_switch() {
        let shared =
            json!({"nvidia.com/gpu.sharing-strategy": "time-slicing", "nvidia.com/gpu.replicas": "4"});
        let gpus = json!({"nvidia.com/gpu": "16"});
        let none = json!({"nvidia.com/gpu": "0"});
        let before = json!({ANNOTATION_GPUS_BEFORE: r#"{"nvidia.com/gpu":4}"#});
        // (step, node, its DRA devices, what serves it, physical GPUs)
        let steps = [
            (
                "time-sliced on the device plugin",
                node(shared.clone(), json!({}), gpus.clone(), gpus.clone()),
                dra(0, 0),
                Serving::DevicePlugin,
                4,
            ),
            (
                "draining: the count is recorded",
                node(shared.clone(), before.clone(), gpus.clone(), gpus.clone()),
                dra(0, 0),
                Serving::DevicePlugin,
                4,
            ),
            // The kubelet has dropped the plugin's capacity too, after its grace period.
            (
                "the plugin gone, the driver not yet publishing",
                node(shared.clone(), before.clone(), none.clone(), none.clone()),
                dra(0, 0),
                Serving::None,
                4,
            ),
            (
                "on DRA",
                node(shared.clone(), before.clone(), none.clone(), none.clone()),
                dra(4, 4),
                Serving::Dra,
                4,
            ),
            (
                "on DRA, the annotation gone",
                node(json!({}), json!({}), json!({}), json!({})),
                dra(4, 4),
                Serving::Dra,
                4,
            ),
            (
                "GFD's count wins",
                node(json!({LABEL_GPU_COUNT: "8"}), json!({}), none.clone(), none.clone()),
                dra(0, 0),
                Serving::None,
                8,
            ),
            (
                "a plain device-plugin node",
                node(json!({}), json!({}), json!({"nvidia.com/gpu": "2"}), json!({"nvidia.com/gpu": "2"})),
                dra(0, 0),
                Serving::DevicePlugin,
                2,
            ),
            (
                "a plugin restarting keeps its capacity",
                node(json!({}), json!({}), json!({"nvidia.com/gpu": "2"}), none.clone()),
                dra(0, 0),
                Serving::None,
                2,
            ),
        ];
        for (step, n, counts, want_serving, want) in steps {
            let plugin = overlap::allocatable_total(&n, &[NVIDIA_GPU_RESOURCE]) > 0;
            assert_eq!((serving(plugin, counts), physical(&n, counts)), (want_serving, want), "{step}");
        }
    }

    #[test]
    fn the_cluster_counts_gpu_nodes_only_each_once() {
        let mut on_dra = node(json!({}), json!({}), json!({}), json!({}));
        on_dra.metadata.name = Some("dra".into());
        let mut plugin = node(
            json!({}),
            json!({}),
            json!({"nvidia.com/mig-1g.10gb": "7"}),
            json!({"nvidia.com/mig-1g.10gb": "7"}),
        );
        plugin.metadata.name = Some("mig".into());
        plugin.labels_mut().insert(LABEL_GPU_COUNT.into(), "1".into());
        let mut cpu = node(json!({}), json!({}), json!({"cpu": "8"}), json!({"cpu": "8"}));
        cpu.metadata.name = Some("cpu".into());
        let counts = HashMap::from([("dra".to_string(), dra(8, 8))]);
        let got = cluster([&on_dra, &plugin, &cpu], &counts, |r| {
            crate::well_known::is_gpu_resource(r, &[] as &[&str])
        });
        assert_eq!(got, GpusByBackend { device_plugin: 1, dra: 8, none: 0 });
    }
}
