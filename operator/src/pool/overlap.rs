//! The backend-overlap invariant: on one node a resource comes from the device plugin or from
//! DRA, never both. The scheduler treats a node as device-plugin backed while its allocatable for
//! the name is above zero, so a node with allocatable > 0 and allocatable devices in our
//! ResourceSlices is served twice. A device with a NoSchedule or NoExecute taint cannot take a new
//! claim, so it does not serve the node (Switchyard's agent publishes every device with a
//! `device-plugin-active` taint until the device plugin's capacity is gone).

use std::borrow::Borrow;
use std::collections::{BTreeMap, BTreeSet};

use crate::node::slim::SlimNode;
use k8s_openapi::api::resource::v1::{Device, DeviceTaint, ResourceSlice};

use crate::well_known::{
    TAINT_KEY_DEVICE_PLUGIN_ACTIVE, TAINT_KEY_DRIVER_UNAVAILABLE, TAINT_KEY_PLUGIN_NOT_REGISTERED,
    is_gpu_resource,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

/// Pool resources in the node's `status.allocatable`, by name. Unparsable or fractional
/// quantities count as 0: extended resources are whole numbers.
pub fn allocatable(node: &SlimNode, resources: &[&str]) -> BTreeMap<String, u64> {
    resources.iter().map(|r| (r.to_string(), quantity(node.allocatable(), r))).collect()
}

/// Per pool resource, the larger of capacity and allocatable: the device plugin's GPUs on the
/// node even while its pod restarts (allocatable drops within seconds, the kubelet keeps capacity
/// for minutes after a plugin leaves).
///
/// Except a resource the plugin has stopped serving while it serves another GPU resource on the
/// node: its capacity is the kubelet's memory of a stopped endpoint (kept 5 minutes), not GPUs.
/// NVIDIA's config-manager leaves one on every node whose config renames or re-partitions its
/// GPUs: it starts the plugin on the default config before it has read the node's label, then
/// restarts it on the node's own (`nvidia.com/gpu` capacity stays beside
/// `nvidia.com/gpu.shared`).
pub fn device_plugin_gpus(node: &SlimNode, resources: &[&str]) -> BTreeMap<String, u64> {
    let mut counts = allocatable(node, resources);
    for (r, n) in counts.iter_mut() {
        if !stopped_serving(node, r, resources) {
            *n = (*n).max(quantity(node.capacity(), r));
        }
    }
    counts
}

/// Per pool resource, the devices the device plugin holds back as unhealthy on a node it serves:
/// capacity above allocatable (NVIDIA's device plugin marks a GPU unhealthy on a critical XID, and
/// every GPU of the node when its health check's event wait fails), where it still serves some of
/// them. Resources with none held back are left out. Only meaningful while the plugin runs: once
/// it stops, allocatable drops to 0 while the kubelet keeps capacity.
pub fn held_back(node: &SlimNode, resources: &[&str]) -> BTreeMap<String, (u64, u64)> {
    resources
        .iter()
        .filter(|r| !stopped_serving(node, r, resources))
        .filter_map(|r| {
            let (cap, alloc) = (quantity(node.capacity(), r), quantity(node.allocatable(), r));
            (cap > alloc).then(|| (r.to_string(), (cap - alloc, cap)))
        })
        .collect()
}

/// [`held_back`] in words, if the device plugin holds any GPU back, and whether it holds back
/// every one: `2 of its 8 nvidia.com/gpu` (false), or `its 8 nvidia.com/gpu` (true) where it
/// serves none. What the switch's `DevicePluginUnhealthyGpus` event and `switchyard plan` say.
/// None allocatable is also how a device plugin that is restarting reads (the kubelet marks its
/// devices unhealthy when its connection ends, until it registers again, as when its DaemonSet
/// rolls), so it need not mean unhealthy GPUs; some of them held back does.
pub fn held_back_words(node: &SlimNode, resources: &[&str]) -> Option<(String, bool)> {
    let held_back = held_back(node, resources);
    let all = held_back.values().all(|(n, of)| n == of);
    let what: Vec<String> = held_back
        .iter()
        .map(|(r, (n, of))| if all { format!("its {of} {r}") } else { format!("{n} of its {of} {r}") })
        .collect();
    (!what.is_empty()).then(|| (what.join(", "), all))
}

/// Whether the device plugin stopped serving `resource` on `node` while it serves another GPU
/// resource there (one of the defaults or of `gpu_resources`): nothing allocatable under it, and
/// something allocatable under another. See [`device_plugin_gpus`].
pub fn stopped_serving(node: &SlimNode, resource: &str, gpu_resources: &[&str]) -> bool {
    quantity(node.allocatable(), resource) == 0
        && node.allocatable().any(|(k, _)| {
            k != resource && is_gpu_resource(k, gpu_resources) && quantity(node.allocatable(), k) > 0
        })
}

/// The whole-number quantity of `resource` in `list`; 0 when absent, unparsable or fractional.
fn quantity<'a>(mut list: impl Iterator<Item = (&'a str, &'a Quantity)>, resource: &str) -> u64 {
    list.find(|(k, _)| *k == resource).and_then(|(_, q)| q.0.trim().parse::<u64>().ok()).unwrap_or(0)
}

/// The sum of [`allocatable`].
pub fn allocatable_total(node: &SlimNode, resources: &[&str]) -> u64 {
    allocatable(node, resources).values().sum()
}

/// Devices our driver publishes for `node` in its node-local ResourceSlices, tainted or not
/// (the pool's GPU count for dashboards).
pub fn dra_devices(slices: &[impl Borrow<ResourceSlice>], driver: &str, node: &str) -> u64 {
    node_slices(slices, driver, node).map(|s| s.spec.devices.as_ref().map_or(0, Vec::len) as u64).sum()
}

/// Devices our driver publishes for `node` that the scheduler may allocate now: those without a
/// NoSchedule or NoExecute taint.
pub fn schedulable_dra_devices(slices: &[impl Borrow<ResourceSlice>], driver: &str, node: &str) -> u64 {
    schedulable(slices, driver, node).count() as u64
}

/// The devices [`schedulable_dra_devices`] counts.
pub fn schedulable<'a>(
    slices: &'a [impl Borrow<ResourceSlice>],
    driver: &'a str,
    node: &'a str,
) -> impl Iterator<Item = &'a Device> {
    devices(slices, driver, node).filter(|d| !d.taints.iter().flatten().any(keeps_out))
}

/// Every device our driver publishes for `node`, in its node-local slices.
fn devices<'a>(
    slices: &'a [impl Borrow<ResourceSlice>],
    driver: &'a str,
    node: &'a str,
) -> impl Iterator<Item = &'a Device> {
    node_slices(slices, driver, node).flat_map(|s| s.spec.devices.iter().flatten())
}

/// Whether `t` keeps a device out of scheduling.
pub(crate) fn keeps_out(t: &DeviceTaint) -> bool {
    t.effect == "NoSchedule" || t.effect == "NoExecute"
}

/// Whether `t` is one of Switchyard's agent's node-wide taints: the device-plugin interlock, the
/// driver shutting down, or its kubelet plugin not (yet) registered with the kubelet. They say
/// nothing of the GPU itself: a switching node waits for them to go instead of counting its
/// devices as unhealthy and completing while the kubelet cannot prepare a claim.
fn node_wide(t: &DeviceTaint, driver: &str) -> bool {
    t.key.strip_prefix(driver).and_then(|k| k.strip_prefix('/')).is_some_and(|k| {
        k == TAINT_KEY_DEVICE_PLUGIN_ACTIVE
            || k == TAINT_KEY_DRIVER_UNAVAILABLE
            || k == TAINT_KEY_PLUGIN_NOT_REGISTERED
    })
}

/// Devices our driver publishes for `node` that are the node's to serve: every device but those a
/// node-wide taint keeps out (the interlock, a driver shutting down, a kubelet plugin the kubelet
/// has not registered). A device tainted unhealthy
/// (an XID, an ECC error, a GPU lost) is still one of the node's GPUs: a switch counts it against
/// the GPUs the device plugin had, which counted it too, and reports it ([`unhealthy`]) instead of
/// waiting for a GPU that will not come back.
pub fn present<'a>(
    slices: &'a [impl Borrow<ResourceSlice>],
    driver: &'a str,
    node: &'a str,
) -> impl Iterator<Item = &'a Device> {
    devices(slices, driver, node)
        .filter(move |d| !d.taints.iter().flatten().any(|t| keeps_out(t) && node_wide(t, driver)))
}

/// The physical GPUs behind the devices our driver publishes for `node`, each counted once: a
/// GPU by its `uuid` attribute, a MIG device by its GPU's (`parentUUID`), so a GPU published whole
/// and as MIG devices at once still counts once. A device without those attributes counts by its
/// name. Tainted devices count: an unhealthy GPU is still in the node.
pub fn physical_gpus(slices: &[impl Borrow<ResourceSlice>], driver: &str, node: &str) -> u64 {
    let text =
        |d: &Device, key: &str| d.attributes.as_ref().and_then(|a| a.get(key)).and_then(|v| v.string.clone());
    let gpus: BTreeSet<String> = devices(slices, driver, node)
        .map(|d| {
            let key = if text(d, "type").as_deref() == Some("mig") { "parentUUID" } else { "uuid" };
            text(d, key).unwrap_or_else(|| format!("name:{}", d.name))
        })
        .collect();
    gpus.len() as u64
}

/// The [`present`] devices that a taint keeps out, by name, with the taint's key and value:
/// `gpu-3 (gpu.switchyard.dev/xid=79)`.
pub fn unhealthy(slices: &[impl Borrow<ResourceSlice>], driver: &str, node: &str) -> Vec<String> {
    present(slices, driver, node)
        .filter_map(|d| {
            let t = d.taints.iter().flatten().find(|t| keeps_out(t))?;
            let value = t.value.as_deref().map(|v| format!("={v}")).unwrap_or_default();
            Some(format!("{} ({}{value})", d.name, t.key))
        })
        .collect()
}

/// Whether every slice of `node`'s pools of `driver` is published: for each pool, its newest
/// generation has as many slices as its `resourceSliceCount` says. False with no slice at all.
pub fn pool_complete(slices: &[impl Borrow<ResourceSlice>], driver: &str, node: &str) -> bool {
    let mut pools: BTreeMap<&str, (i64, i64, i64)> = BTreeMap::new();
    for s in node_slices(slices, driver, node) {
        let p = &s.spec.pool;
        let e = pools.entry(p.name.as_str()).or_insert((p.generation, p.resource_slice_count, 0));
        if p.generation > e.0 {
            *e = (p.generation, p.resource_slice_count, 0);
        }
        if p.generation == e.0 {
            e.2 += 1;
        }
    }
    !pools.is_empty() && pools.values().all(|(_, want, got)| got >= want)
}

fn node_slices<'a>(
    slices: &'a [impl Borrow<ResourceSlice>],
    driver: &'a str,
    node: &'a str,
) -> impl Iterator<Item = &'a ResourceSlice> {
    slices.iter().map(Borrow::borrow).filter(move |s: &&ResourceSlice| {
        s.spec.driver == driver && s.spec.node_name.as_deref() == Some(node)
    })
}

/// A node served by both backends.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Overlap {
    pub node: String,
    /// Pool resources with allocatable > 0.
    pub allocatable: BTreeMap<String, u64>,
    pub dra_devices: u64,
}

impl std::fmt::Display for Overlap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let res: Vec<String> = self.allocatable.iter().map(|(k, v)| format!("{k}={v}")).collect();
        write!(
            f,
            "node {} advertises {} through the device plugin and {} DRA device(s)",
            self.node,
            res.join(", "),
            self.dra_devices
        )
    }
}

/// Checks the invariant for one node, given the DRA devices the scheduler may allocate on it
/// ([`schedulable_dra_devices`]).
pub fn check(node: &SlimNode, resources: &[&str], dra_schedulable: u64) -> Option<Overlap> {
    let alloc: BTreeMap<String, u64> =
        allocatable(node, resources).into_iter().filter(|(_, v)| *v > 0).collect();
    (!alloc.is_empty() && dra_schedulable > 0).then(|| Overlap {
        node: node.metadata.name.clone().unwrap_or_default(),
        allocatable: alloc,
        dra_devices: dra_schedulable,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn node(name: &str, alloc: serde_json::Value) -> SlimNode {
        serde_json::from_value(json!({"metadata": {"name": name}, "status": {"allocatable": alloc}})).unwrap()
    }

    fn slice(driver: &str, node: &str, devices: usize) -> ResourceSlice {
        let devs: Vec<_> = (0..devices).map(|i| json!({"name": format!("gpu-{i}")})).collect();
        serde_json::from_value(json!({
            "metadata": {"name": format!("{node}-{driver}")},
            "spec": {"driver": driver, "nodeName": node, "pool": {"name": node, "generation": 1, "resourceSliceCount": 1}, "devices": devs}
        }))
        .unwrap()
    }

    const DRIVER: &str = "gpu.switchyard.dev";

    /// A slice whose devices all carry a taint with `effect`.
    fn tainted(node: &str, devices: usize, effect: &str) -> ResourceSlice {
        let mut s = slice(DRIVER, node, devices);
        for d in s.spec.devices.iter_mut().flatten() {
            d.taints = Some(vec![
                serde_json::from_value(
                    json!({"key": "gpu.switchyard.dev/device-plugin-active", "effect": effect}),
                )
                .unwrap(),
            ]);
        }
        s
    }

    /// Only our agent's node-wide taints, and only those that keep a device out, make a device
    /// absent; a health taint leaves it present and reported unhealthy.
    #[test]
    fn node_wide_taints_keep_devices_from_being_present() {
        // (case, taint key, effect, present?)
        let cases = [
            ("device plugin active", "gpu.switchyard.dev/device-plugin-active", "NoSchedule", false),
            ("driver unavailable", "gpu.switchyard.dev/driver-unavailable", "NoSchedule", false),
            (
                "plugin not registered",
                "gpu.switchyard.dev/kubelet-plugin-not-registered",
                "NoSchedule",
                false,
            ),
            (
                "plugin not registered, NoExecute",
                "gpu.switchyard.dev/kubelet-plugin-not-registered",
                "NoExecute",
                false,
            ),
            ("informational", "gpu.switchyard.dev/kubelet-plugin-not-registered", "None", true),
            ("another driver's key", "other.example.com/kubelet-plugin-not-registered", "NoSchedule", true),
            ("a longer driver name", "gpu.switchyard.dev.x/driver-unavailable", "NoSchedule", true),
            ("unhealthy", "gpu.switchyard.dev/xid", "NoSchedule", true),
        ];
        for (case, key, effect, want) in cases {
            let mut s = slice(DRIVER, "n", 2);
            s.spec.devices.as_mut().unwrap()[1].taints = Some(vec![
                serde_json::from_value(json!({"key": key, "value": "v", "effect": effect})).unwrap(),
            ]);
            let names: Vec<&str> =
                present(std::slice::from_ref(&s), DRIVER, "n").map(|d| d.name.as_str()).collect();
            let want_names: &[&str] = if want { &["gpu-0", "gpu-1"] } else { &["gpu-0"] };
            assert_eq!(names, want_names, "{case}");
            let reported = unhealthy(&[s], DRIVER, "n");
            let keeps_out = want && effect != "None";
            assert_eq!(reported, if keeps_out { vec![format!("gpu-1 ({key}=v)")] } else { vec![] }, "{case}");
        }
    }

    #[test]
    fn a_pool_is_complete_when_its_newest_generation_has_every_slice() {
        let part = |generation: i64, count: i64, name: &str| {
            let mut s = slice(DRIVER, "n", 1);
            s.metadata.name = Some(name.into());
            s.spec.pool.generation = generation;
            s.spec.pool.resource_slice_count = count;
            s
        };
        assert!(!pool_complete(&[] as &[ResourceSlice], DRIVER, "n"), "nothing published");
        assert!(pool_complete(&[part(1, 1, "a")], DRIVER, "n"));
        assert!(!pool_complete(&[part(2, 2, "a")], DRIVER, "n"), "one of two");
        assert!(pool_complete(&[part(2, 2, "a"), part(2, 2, "b")], DRIVER, "n"));
        assert!(
            !pool_complete(&[part(1, 2, "a"), part(1, 2, "b"), part(2, 2, "c")], DRIVER, "n"),
            "the old generation does not count"
        );
    }

    #[test]
    fn physical_gpus_count_each_gpu_once_whole_or_partitioned() {
        let dev = |name: &str, attrs: serde_json::Value| {
            let attrs: serde_json::Map<String, serde_json::Value> =
                attrs.as_object().unwrap().iter().map(|(k, v)| (k.clone(), json!({"string": v}))).collect();
            json!({"name": name, "attributes": attrs})
        };
        let with = |devices: Vec<serde_json::Value>| {
            let mut s = slice(DRIVER, "n", 0);
            s.spec.devices = serde_json::from_value(json!(devices)).unwrap();
            s
        };
        // (case, devices, physical GPUs)
        let cases = [
            (
                "whole GPUs",
                vec![
                    dev("gpu-0", json!({"type": "gpu", "uuid": "GPU-a"})),
                    dev("gpu-1", json!({"type": "gpu", "uuid": "GPU-b"})),
                ],
                2,
            ),
            (
                "seven MIG devices of one GPU beside a whole one",
                (0..7)
                    .map(|i| {
                        dev(
                            &format!("gpu-0-mig-{i}"),
                            json!({"type": "mig", "parentUUID": "GPU-a", "uuid": format!("MIG-{i}")}),
                        )
                    })
                    .chain([dev("gpu-1", json!({"type": "gpu", "uuid": "GPU-b"}))])
                    .collect(),
                2,
            ),
            (
                "one GPU published whole and as MIG devices (dynamic MIG)",
                vec![
                    dev("gpu-0", json!({"type": "gpu", "uuid": "GPU-a"})),
                    dev("gpu-0-mig-0", json!({"type": "mig", "parentUUID": "GPU-a"})),
                ],
                1,
            ),
            ("devices without attributes count by name", vec![dev("a", json!({})), dev("b", json!({}))], 2),
        ];
        for (case, devices, want) in cases {
            assert_eq!(physical_gpus(&[with(devices)], DRIVER, "n"), want, "{case}");
        }
        assert_eq!(
            physical_gpus(&[slice("other.example.com", "n", 3)], DRIVER, "n"),
            0,
            "another driver's devices"
        );
    }

    #[test]
    fn device_plugin_gpus_keep_the_capacity_while_allocatable_drops() {
        // The plugin pod restarts: the kubelet drops allocatable at once and keeps capacity.
        let restarting: SlimNode = serde_json::from_value(json!({"metadata": {"name": "n"}, "status": {
            "capacity": {"nvidia.com/gpu": "8"}, "allocatable": {"nvidia.com/gpu": "0"}}}))
        .unwrap();
        let res = ["nvidia.com/gpu", "nvidia.com/mig-1g.10gb"];
        assert_eq!(allocatable_total(&restarting, &res), 0);
        let counts = device_plugin_gpus(&restarting, &res);
        assert_eq!(counts["nvidia.com/gpu"], 8);
        assert_eq!(counts["nvidia.com/mig-1g.10gb"], 0);
        assert_eq!(device_plugin_gpus(&node("m", json!({"nvidia.com/gpu": "4"})), &res)["nvidia.com/gpu"], 4);
    }

    #[test]
    fn a_resource_the_plugin_stopped_serving_beside_another_counts_nothing() {
        // NVIDIA's config-manager started the plugin on the default config, then renamed its
        // GPUs: the kubelet keeps the first name's capacity, at allocatable 0.
        let relabelled: SlimNode = serde_json::from_value(json!({"metadata": {"name": "n"}, "status": {
            "capacity": {"nvidia.com/gpu": "4", "nvidia.com/gpu.shared": "4"},
            "allocatable": {"nvidia.com/gpu": "0", "nvidia.com/gpu.shared": "4"}}}))
        .unwrap();
        let res = ["nvidia.com/gpu", "nvidia.com/gpu.shared"];
        let counts = device_plugin_gpus(&relabelled, &res);
        assert_eq!((counts["nvidia.com/gpu"], counts["nvidia.com/gpu.shared"]), (0, 4));
        // Asked about the stopped name alone, the same: the node's other GPU resource tells.
        assert_eq!(device_plugin_gpus(&relabelled, &["nvidia.com/gpu"])["nvidia.com/gpu"], 0);
        // The whole plugin restarting (nothing allocatable): capacity still counts, both names.
        let restarting: SlimNode = serde_json::from_value(json!({"metadata": {"name": "n"}, "status": {
            "capacity": {"nvidia.com/gpu": "4", "nvidia.com/gpu.shared": "4"},
            "allocatable": {"nvidia.com/gpu": "0", "nvidia.com/gpu.shared": "0"}}}))
        .unwrap();
        let counts = device_plugin_gpus(&restarting, &res);
        assert_eq!((counts["nvidia.com/gpu"], counts["nvidia.com/gpu.shared"]), (4, 4));
    }

    #[test]
    fn overlap_table() {
        // (name, allocatable, slices, overlap?)
        let cases = vec![
            ("plugin only", json!({"nvidia.com/gpu": "8"}), vec![], false),
            ("dra only", json!({"nvidia.com/gpu": "0"}), vec![slice(DRIVER, "n1", 8)], false),
            ("absent allocatable, dra", json!({"cpu": "64"}), vec![slice(DRIVER, "n1", 8)], false),
            ("both", json!({"nvidia.com/gpu": "8"}), vec![slice(DRIVER, "n1", 8)], true),
            (
                "mig resource and dra",
                json!({"nvidia.com/mig-1g.10gb": "7"}),
                vec![slice(DRIVER, "n1", 1)],
                true,
            ),
            (
                "other driver's slice",
                json!({"nvidia.com/gpu": "8"}),
                vec![slice("gpu.nvidia.com", "n1", 8)],
                false,
            ),
            ("other node's slice", json!({"nvidia.com/gpu": "8"}), vec![slice(DRIVER, "n2", 8)], false),
            ("empty slice", json!({"nvidia.com/gpu": "8"}), vec![slice(DRIVER, "n1", 0)], false),
            (
                "dra devices tainted NoSchedule",
                json!({"nvidia.com/gpu": "8"}),
                vec![tainted("n1", 8, "NoSchedule")],
                false,
            ),
            (
                "dra devices tainted NoExecute",
                json!({"nvidia.com/gpu": "8"}),
                vec![tainted("n1", 8, "NoExecute")],
                false,
            ),
            (
                "informational taint still serves",
                json!({"nvidia.com/gpu": "8"}),
                vec![tainted("n1", 8, "None")],
                true,
            ),
        ];
        for (name, alloc, slices, want) in cases {
            let devices = schedulable_dra_devices(&slices, DRIVER, "n1");
            let got = check(&node("n1", alloc), &["nvidia.com/gpu", "nvidia.com/mig-1g.10gb"], devices);
            assert_eq!(got.is_some(), want, "{name}: {got:?}");
        }
    }

    #[test]
    fn schedulable_devices_exclude_blocking_taints() {
        let slices = vec![slice(DRIVER, "n1", 3), tainted("n1", 2, "NoSchedule"), tainted("n1", 4, "None")];
        assert_eq!(dra_devices(&slices, DRIVER, "n1"), 9);
        assert_eq!(schedulable_dra_devices(&slices, DRIVER, "n1"), 7);
    }

    #[test]
    fn overlap_message_names_node_and_counts() {
        let devices =
            schedulable_dra_devices(&[slice(DRIVER, "n1", 4), slice(DRIVER, "n1", 4)], DRIVER, "n1");
        let o = check(&node("n1", json!({"nvidia.com/gpu": "8"})), &["nvidia.com/gpu"], devices).unwrap();
        assert_eq!(o.dra_devices, 8);
        assert_eq!(
            o.to_string(),
            "node n1 advertises nvidia.com/gpu=8 through the device plugin and 8 DRA device(s)"
        );
    }
}
