//! Pure slice building: inventory + health -> the node's ResourceSlices, and the pool summary the
//! operator reads from their annotations.
//!
//! Summary contract: every slice of the pool carries the same two annotations,
//! [`well_known::ANNOTATION_SLICE_GPU_COUNT`] (physical GPUs on the node, decimal) and
//! [`well_known::ANNOTATION_SLICE_MIG_PROFILES`] (JSON object from MIG profile to count). They
//! describe what exists, not what is healthy: health is in the device taints.

use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1::{
    CapacityRequestPolicy, CapacityRequestPolicyRange, Device, DeviceAttribute, DeviceCapacity, DeviceTaint,
    ResourcePool, ResourceSlice, ResourceSliceSpec,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
use k8s_openapi::jiff::Timestamp;
use switchyard_api::well_known;

use crate::discovery::{Gpu, NamedDevice, NodeGpus};
use crate::health::{ActiveTaint, Effect, HealthState, TaintKind};

/// Most devices the API accepts in one ResourceSlice.
pub const MAX_DEVICES_PER_SLICE: usize = 128;
/// Most devices the API accepts in one ResourceSlice once any device in it has taints.
pub const MAX_TAINTED_DEVICES_PER_SLICE: usize = 64;

/// Standard attribute names shared by DRA drivers (KEP-4381 / KEP-5491), used for alignment with
/// NICs and CPUs.
pub const ATTR_PCI_BUS_ID: &str = "resource.kubernetes.io/pciBusID";
pub const ATTR_PCIE_ROOT: &str = "resource.kubernetes.io/pcieRoot";
pub const ATTR_NUMA_NODE: &str = "resource.kubernetes.io/numaNode";

/// Who the slices belong to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PoolIdentity {
    pub node_name: String,
    /// The Node's uid, for the owner reference (the slices go away with the Node).
    pub node_uid: String,
    pub driver: String,
}

impl PoolIdentity {
    /// Name of slice `i`: `<node>-<driver with dots as dashes>-<i>`.
    pub fn slice_name(&self, i: usize) -> String {
        format!("{}-{}-{i}", self.node_name, self.driver.replace('.', "-"))
    }
}

/// Physical GPUs and MIG devices by profile on one node.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PoolSummary {
    pub gpus: u32,
    pub mig_profiles: BTreeMap<String, u32>,
}

impl PoolSummary {
    pub fn of(inv: &NodeGpus) -> Self {
        let mut mig_profiles = BTreeMap::new();
        for (_, d) in inv.named_devices() {
            if let NamedDevice::Mig { mig, .. } = d {
                *mig_profiles.entry(mig.profile.clone()).or_insert(0) += 1;
            }
        }
        PoolSummary { gpus: inv.gpus.len() as u32, mig_profiles }
    }

    pub fn to_annotations(&self) -> BTreeMap<String, String> {
        BTreeMap::from([
            (well_known::ANNOTATION_SLICE_GPU_COUNT.to_string(), self.gpus.to_string()),
            (
                well_known::ANNOTATION_SLICE_MIG_PROFILES.to_string(),
                serde_json::to_string(&self.mig_profiles).unwrap_or_else(|_| "{}".into()),
            ),
        ])
    }

    /// Read the summary back from a slice's annotations; `None` when they are missing or invalid.
    pub fn from_annotations(annotations: &BTreeMap<String, String>) -> Option<Self> {
        Some(PoolSummary {
            gpus: annotations.get(well_known::ANNOTATION_SLICE_GPU_COUNT)?.parse().ok()?,
            mig_profiles: serde_json::from_str(annotations.get(well_known::ANNOTATION_SLICE_MIG_PROFILES)?)
                .ok()?,
        })
    }
}

/// A version string NVML reports, as the semantic version a `version` attribute requires:
/// leading zeros dropped and missing parts filled with 0 (`570.124.06` -> `570.124.6`, `9.0` ->
/// `9.0.0`). `None` when it is not numeric.
pub fn to_semver(v: &str) -> Option<String> {
    let parts: Vec<u64> = v.trim().split('.').map(|p| p.parse::<u64>()).collect::<Result<_, _>>().ok()?;
    if parts.is_empty() || parts.len() > 3 {
        return None;
    }
    let get = |i: usize| parts.get(i).copied().unwrap_or(0);
    Some(format!("{}.{}.{}", get(0), get(1), get(2)))
}

/// Bytes as the shortest exact binary quantity (`85899345920` -> `80Gi`).
pub fn bytes_quantity(bytes: u64) -> Quantity {
    for (suffix, unit) in [("Ti", 1u64 << 40), ("Gi", 1 << 30), ("Mi", 1 << 20), ("Ki", 1 << 10)] {
        if bytes >= unit && bytes.is_multiple_of(unit) {
            return Quantity(format!("{}{suffix}", bytes / unit));
        }
    }
    Quantity(bytes.to_string())
}

fn string(v: impl Into<String>) -> DeviceAttribute {
    DeviceAttribute { string: Some(v.into()), ..Default::default() }
}

fn version(v: &str) -> Option<DeviceAttribute> {
    to_semver(v).map(|s| DeviceAttribute { version: Some(s), ..Default::default() })
}

fn gpu_attributes(inv: &NodeGpus, gpu: &Gpu) -> BTreeMap<String, DeviceAttribute> {
    let mut a = BTreeMap::new();
    a.insert("productName".into(), string(&gpu.product_name));
    if let Some(b) = &gpu.brand {
        a.insert("brand".into(), string(b));
    }
    if let Some(arch) = &gpu.architecture {
        a.insert("architecture".into(), string(arch));
    }
    if let Some(v) = gpu.cuda_compute_capability.as_deref().and_then(version) {
        a.insert("cudaComputeCapability".into(), v);
    }
    if let Some(v) = version(&inv.driver_version) {
        a.insert("driverVersion".into(), v);
    }
    if let Some(v) = version(&inv.cuda_driver_version) {
        a.insert("cudaDriverVersion".into(), v);
    }
    if let Some(bus) = &gpu.pci_bus_id {
        a.insert(ATTR_PCI_BUS_ID.into(), string(bus));
    }
    if let Some(root) = &gpu.pcie_root {
        a.insert(ATTR_PCIE_ROOT.into(), string(root));
    }
    if let Some(numa) = gpu.numa_node {
        a.insert(ATTR_NUMA_NODE.into(), DeviceAttribute { int: Some(numa.into()), ..Default::default() });
    }
    a
}

fn capacity(q: Quantity) -> DeviceCapacity {
    DeviceCapacity { value: q, ..Default::default() }
}

/// The step in which claims on a shared device ask for its `memory`, as NVIDIA's DRA driver
/// publishes it. The API requires a range's max to be a multiple of its step, so a shared
/// device's memory is published rounded down to it.
pub const SHARED_MEMORY_STEP_BYTES: u64 = 1 << 20;

/// A capacity of `value` on a device that allows multiple allocations: a claim takes `default`
/// of it unless it asks for more, and may ask for `min` up to all of it, in steps of `step`.
fn consumable(value: Quantity, default: Quantity, min: Quantity, step: Quantity) -> DeviceCapacity {
    DeviceCapacity {
        request_policy: Some(CapacityRequestPolicy {
            default: Some(default),
            valid_range: Some(CapacityRequestPolicyRange { min, max: Some(value.clone()), step: Some(step) }),
            valid_values: None,
        }),
        value,
    }
}

/// `memory` of `bytes`. Shared, it is rounded down to whole MiB, and a claim takes none of it
/// unless it asks (in MiB). Less than 1 MiB gets no policy: the API refuses a range whose first
/// step is above the capacity, and a claim then takes all of a capacity that is zero.
fn memory_capacity(bytes: u64, shared: bool) -> DeviceCapacity {
    let rounded = bytes - bytes % SHARED_MEMORY_STEP_BYTES;
    match shared {
        false => capacity(bytes_quantity(bytes)),
        true if rounded == 0 => capacity(bytes_quantity(0)),
        true => consumable(
            bytes_quantity(rounded),
            Quantity("0".into()),
            Quantity("0".into()),
            bytes_quantity(SHARED_MEMORY_STEP_BYTES),
        ),
    }
}

/// A MIG device's `multiprocessors`. Shared, a claim takes none of them unless it asks (a whole
/// number); none at all gets no policy, as in [`memory_capacity`].
fn multiprocessors_capacity(count: u32, shared: bool) -> DeviceCapacity {
    let value = Quantity(count.to_string());
    match shared && count > 0 {
        false => capacity(value),
        true => consumable(value, Quantity("0".into()), Quantity("0".into()), Quantity("1".into())),
    }
}

/// The [`well_known::CAPACITY_SHARES`] capacity of a device shared by `shares` claims (at least 2):
/// each claim takes 1 unless it asks for more, up to all of them. NVIDIA's DRA driver's
/// `--consumable-shares=<N>` publishes the same.
fn shares_capacity(shares: u32) -> DeviceCapacity {
    let one = || Quantity("1".into());
    consumable(Quantity(shares.to_string()), one(), one(), one())
}

/// `time_added` is kept to whole seconds, the precision the API stores.
fn whole_seconds(t: Timestamp) -> Time {
    Time(Timestamp::from_second(t.as_second()).unwrap_or(t))
}

/// A NoSchedule taint the agent puts on every device of the node, for a node-wide reason.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NodeTaint {
    /// Key suffix after `<driver>/`, one of the `well_known::TAINT_KEY_*` names.
    pub key_suffix: &'static str,
    /// A fixed word (a taint value must be a label value), or none.
    pub value: Option<&'static str>,
    /// When the condition began.
    pub since: Timestamp,
}

impl NodeTaint {
    /// The agent is shutting down: nobody will prepare new claims on this node.
    pub fn driver_unavailable(since: Timestamp) -> Self {
        Self { key_suffix: well_known::TAINT_KEY_DRIVER_UNAVAILABLE, value: None, since }
    }

    /// The node still advertises device-plugin GPUs (see `coexistence`).
    pub fn device_plugin_active(since: Timestamp) -> Self {
        Self { key_suffix: well_known::TAINT_KEY_DEVICE_PLUGIN_ACTIVE, value: None, since }
    }

    /// The kubelet has not registered our kubelet plugin (`value` `pending`), or refused it
    /// (`refused`): it could not prepare a claim on these devices yet (see
    /// `plugin::registration::RegistrationWatch`).
    pub fn kubelet_plugin_not_registered(since: Timestamp, value: &'static str) -> Self {
        Self { key_suffix: well_known::TAINT_KEY_PLUGIN_NOT_REGISTERED, value: Some(value), since }
    }
}

/// Devices of the node, in name order of the inventory, with health taints, plus every node-wide
/// taint on every device.
///
/// `shares` is how many claims may share each device (`--shares-per-device`, or the node's
/// [`well_known::LABEL_GPU_SHARES`]). 0 or 1: each device goes whole to one claim. Above 1, every
/// device but a lost GPU is published as NVIDIA's DRA driver's `--consumable-shares=<N>` publishes
/// it: `allowMultipleAllocations`, a `shares` capacity of N that each claim takes 1 of by default,
/// and `memory` (rounded down to whole MiB) and a MIG device's `multiprocessors` that a claim takes
/// none of unless it asks. [`switchyard_api::sharing::claims_per_device`] then reads N.
pub fn build_devices(
    inv: &NodeGpus,
    health: &HealthState,
    driver: &str,
    node_taints: &[NodeTaint],
    shares: u32,
) -> Vec<Device> {
    inv.named_devices()
        .into_iter()
        .map(|(name, d)| {
            let (gpu, parent_name) = match d {
                NamedDevice::Gpu(g) => (g, None),
                NamedDevice::Mig { parent, .. } => (parent, Some(parent.device_name())),
            };
            let mut attributes = gpu_attributes(inv, gpu);
            let mut caps = BTreeMap::new();
            let shared = shares > 1 && !gpu.lost;
            match d {
                // Lost: only its type is known (see `Gpu::lost`); its taint keeps it out.
                NamedDevice::Gpu(g) if g.lost => {
                    attributes = BTreeMap::from([("type".into(), string("gpu"))]);
                }
                NamedDevice::Gpu(g) => {
                    attributes.insert("type".into(), string("gpu"));
                    attributes.insert("uuid".into(), string(&g.uuid));
                    caps.insert("memory".into(), memory_capacity(g.memory_bytes, shared));
                }
                NamedDevice::Mig { parent, mig } => {
                    attributes.insert("type".into(), string("mig"));
                    attributes.insert("uuid".into(), string(&mig.uuid));
                    attributes.insert("parentUUID".into(), string(&parent.uuid));
                    attributes.insert("profile".into(), string(&mig.profile));
                    caps.insert("memory".into(), memory_capacity(mig.memory_bytes, shared));
                    caps.insert(
                        "multiprocessors".into(),
                        multiprocessors_capacity(mig.multiprocessors, shared),
                    );
                }
            }
            if shared {
                caps.insert(well_known::CAPACITY_SHARES.into(), shares_capacity(shares));
            }
            let mut taints: Vec<DeviceTaint> = health
                .taints_for(&name, parent_name.as_deref())
                .into_iter()
                .map(|t| DeviceTaint {
                    key: format!("{driver}/{}", t.kind.key_suffix()),
                    value: t.value,
                    effect: t.effect.as_str().into(),
                    time_added: Some(whole_seconds(t.since)),
                })
                .collect();
            for t in node_taints {
                taints.push(DeviceTaint {
                    key: format!("{driver}/{}", t.key_suffix),
                    value: t.value.map(str::to_owned),
                    effect: Effect::NoSchedule.as_str().into(),
                    time_added: Some(whole_seconds(t.since)),
                });
            }
            Device {
                name,
                attributes: Some(attributes),
                capacity: Some(caps),
                taints: (!taints.is_empty()).then_some(taints),
                allow_multiple_allocations: shared.then_some(true),
                ..Default::default()
            }
        })
        .collect()
}

/// Split devices into the pool's slices. Every slice names the same pool (the node), carries
/// `generation` and the slice count, the managed-by label, the summary annotations and an owner
/// reference to the Node. Slices hold up to 128 devices, or 64 once any device of the pool has
/// taints (the API's limit for slices with taints). A node without devices still gets one empty
/// slice, so that consumers see the pool and its generation.
pub fn build_slices(
    id: &PoolIdentity,
    devices: Vec<Device>,
    summary: &PoolSummary,
    generation: i64,
) -> Vec<ResourceSlice> {
    let per_slice = if devices.iter().any(|d| d.taints.is_some()) {
        MAX_TAINTED_DEVICES_PER_SLICE
    } else {
        MAX_DEVICES_PER_SLICE
    };
    let mut chunks: Vec<Vec<Device>> = Vec::new();
    let mut it = devices.into_iter().peekable();
    while it.peek().is_some() {
        chunks.push(it.by_ref().take(per_slice).collect());
    }
    if chunks.is_empty() {
        chunks.push(Vec::new());
    }
    let count = chunks.len() as i64;
    chunks
        .into_iter()
        .enumerate()
        .map(|(i, devices)| ResourceSlice {
            metadata: ObjectMeta {
                name: Some(id.slice_name(i)),
                labels: Some(BTreeMap::from([(
                    well_known::LABEL_MANAGED_BY.to_string(),
                    well_known::AGENT_FIELD_MANAGER.to_string(),
                )])),
                annotations: Some(summary.to_annotations()),
                owner_references: Some(vec![OwnerReference {
                    api_version: "v1".into(),
                    kind: "Node".into(),
                    name: id.node_name.clone(),
                    uid: id.node_uid.clone(),
                    controller: Some(true),
                    block_owner_deletion: None,
                }]),
                ..Default::default()
            },
            spec: ResourceSliceSpec {
                driver: id.driver.clone(),
                node_name: Some(id.node_name.clone()),
                pool: ResourcePool { name: id.node_name.clone(), generation, resource_slice_count: count },
                devices: Some(devices),
                ..Default::default()
            },
        })
        .collect()
}

/// Everything the agent would publish for this inventory and health, each device shared by
/// `shares` claims (see [`build_devices`]), at `generation`.
pub fn desired_slices(
    id: &PoolIdentity,
    inv: &NodeGpus,
    health: &HealthState,
    node_taints: &[NodeTaint],
    shares: u32,
    generation: i64,
) -> Vec<ResourceSlice> {
    let devices = build_devices(inv, health, &id.driver, node_taints, shares);
    build_slices(id, devices, &PoolSummary::of(inv), generation)
}

/// The inverse of the health part of [`build_devices`]: every device in `slices` by name, with the
/// health taints (`<driver>/xid`, `<driver>/ecc-dbe`, `<driver>/gpu-lost`) it carries. Node-wide
/// taints (driver-unavailable, device-plugin-active, kubelet-plugin-not-registered) and other
/// drivers' keys are left out: they are recomputed, not restored. A taint without `timeAdded` (we always write one) counts from `now`.
/// Feeds [`HealthState::restore`].
pub fn published_health(
    slices: &[ResourceSlice],
    driver: &str,
    now: Timestamp,
) -> Vec<(String, Vec<ActiveTaint>)> {
    let prefix = format!("{driver}/");
    slices
        .iter()
        .flat_map(|s| s.spec.devices.iter().flatten())
        .map(|d| {
            let taints = d
                .taints
                .iter()
                .flatten()
                .filter_map(|t| {
                    let kind = TaintKind::from_key_suffix(t.key.strip_prefix(&prefix)?)?;
                    Some(ActiveTaint {
                        kind,
                        value: t.value.clone(),
                        effect: Effect::parse(&t.effect),
                        since: t.time_added.as_ref().map_or(now, |t| t.0),
                    })
                })
                .collect();
            (d.name.clone(), taints)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::discovery::MigDevice;
    use crate::health::{FaultKind, HealthEvent, HealthPolicy};
    use switchyard_api::sharing::claims_per_device;

    fn id() -> PoolIdentity {
        PoolIdentity {
            node_name: "node-a".into(),
            node_uid: "uid-1".into(),
            driver: "gpu.switchyard.dev".into(),
        }
    }

    fn h100(index: u32) -> Gpu {
        Gpu {
            index,
            minor: index,
            uuid: format!("GPU-{index:08}"),
            product_name: "NVIDIA H100 80GB HBM3".into(),
            brand: Some("Nvidia".into()),
            architecture: Some("Hopper".into()),
            cuda_compute_capability: Some("9.0".into()),
            memory_bytes: 80 << 30,
            pci_bus_id: Some(format!("0000:{:02x}:00.0", 0x18 + index)),
            pcie_root: Some("pci0000:15".into()),
            numa_node: Some(0),
            mig_enabled: None,
            mig: vec![],
            lost: false,
        }
    }

    fn inv(gpus: Vec<Gpu>) -> NodeGpus {
        NodeGpus { driver_version: "570.124.06".into(), cuda_driver_version: "12.8".into(), gpus }
    }

    fn attr<'a>(d: &'a Device, k: &str) -> &'a DeviceAttribute {
        d.attributes.as_ref().unwrap().get(k).unwrap_or_else(|| panic!("missing attribute {k}"))
    }

    #[test]
    fn semver_normalisation() {
        for (input, want) in [
            ("570.124.06", Some("570.124.6")),
            ("12.8", Some("12.8.0")),
            ("9.0", Some("9.0.0")),
            ("535", Some("535.0.0")),
            ("1.2.3.4", None),
            ("r570", None),
            ("", None),
        ] {
            assert_eq!(to_semver(input).as_deref(), want, "{input:?}");
        }
    }

    #[test]
    fn quantities_use_the_largest_exact_binary_unit() {
        for (bytes, want) in [
            (80u64 << 30, "80Gi"),
            (10240 << 20, "10Gi"),
            (9856 << 20, "9856Mi"),
            (1 << 40, "1Ti"),
            (1000, "1000"),
            (0, "0"),
        ] {
            assert_eq!(bytes_quantity(bytes).0, want, "{bytes}");
        }
    }

    #[test]
    fn full_gpu_device_carries_attributes_and_capacity() {
        let devices =
            build_devices(&inv(vec![h100(0)]), &HealthState::default(), "gpu.switchyard.dev", &[], 1);
        assert_eq!(devices.len(), 1);
        let d = &devices[0];
        assert_eq!(d.name, "gpu-0");
        assert_eq!(attr(d, "type").string.as_deref(), Some("gpu"));
        assert_eq!(attr(d, "uuid").string.as_deref(), Some("GPU-00000000"));
        assert_eq!(attr(d, "productName").string.as_deref(), Some("NVIDIA H100 80GB HBM3"));
        assert_eq!(attr(d, "brand").string.as_deref(), Some("Nvidia"));
        assert_eq!(attr(d, "architecture").string.as_deref(), Some("Hopper"));
        assert_eq!(attr(d, "cudaComputeCapability").version.as_deref(), Some("9.0.0"));
        assert_eq!(attr(d, "driverVersion").version.as_deref(), Some("570.124.6"));
        assert_eq!(attr(d, "cudaDriverVersion").version.as_deref(), Some("12.8.0"));
        assert_eq!(attr(d, ATTR_PCI_BUS_ID).string.as_deref(), Some("0000:18:00.0"));
        assert_eq!(attr(d, ATTR_PCIE_ROOT).string.as_deref(), Some("pci0000:15"));
        assert_eq!(attr(d, ATTR_NUMA_NODE).int, Some(0));
        assert_eq!(d.capacity.as_ref().unwrap()["memory"].value.0, "80Gi");
        assert!(d.taints.is_none());
        // The API allows at most 32 attributes and capacities together.
        assert!(d.attributes.as_ref().unwrap().len() + d.capacity.as_ref().unwrap().len() <= 32);
    }

    #[test]
    fn unknown_fields_are_omitted() {
        let mut g = h100(0);
        g.brand = None;
        g.architecture = None;
        g.cuda_compute_capability = None;
        g.pci_bus_id = None;
        g.pcie_root = None;
        g.numa_node = None;
        let d = &build_devices(&inv(vec![g]), &HealthState::default(), "d", &[], 1)[0];
        let keys: Vec<&str> = d.attributes.as_ref().unwrap().keys().map(String::as_str).collect();
        assert_eq!(keys, ["cudaDriverVersion", "driverVersion", "productName", "type", "uuid"]);
    }

    #[test]
    fn mig_devices_replace_their_parent_and_inherit_its_attributes() {
        let mut g = h100(1);
        g.mig = vec![
            MigDevice {
                uuid: "MIG-a".into(),
                profile: "1g.10gb".into(),
                memory_bytes: 9856 << 20,
                multiprocessors: 16,
                gi: 9,
                ci: 0,
                ..Default::default()
            },
            MigDevice {
                uuid: "MIG-b".into(),
                profile: "3g.40gb".into(),
                memory_bytes: 40 << 30,
                multiprocessors: 60,
                gi: 2,
                ci: 0,
                ..Default::default()
            },
        ];
        let devices = build_devices(&inv(vec![h100(0), g]), &HealthState::default(), "d", &[], 1);
        let names: Vec<&str> = devices.iter().map(|d| d.name.as_str()).collect();
        assert_eq!(names, ["gpu-0", "gpu-1-mig-3g40gb-0", "gpu-1-mig-1g10gb-0"]);
        let m = &devices[2];
        assert_eq!(attr(m, "type").string.as_deref(), Some("mig"));
        assert_eq!(attr(m, "uuid").string.as_deref(), Some("MIG-a"));
        assert_eq!(attr(m, "parentUUID").string.as_deref(), Some("GPU-00000001"));
        assert_eq!(attr(m, "profile").string.as_deref(), Some("1g.10gb"));
        assert_eq!(attr(m, ATTR_PCI_BUS_ID).string.as_deref(), Some("0000:19:00.0"));
        assert_eq!(attr(m, "productName").string.as_deref(), Some("NVIDIA H100 80GB HBM3"));
        let caps = m.capacity.as_ref().unwrap();
        assert_eq!(caps["memory"].value.0, "9856Mi");
        assert_eq!(caps["multiprocessors"].value.0, "16");
    }

    /// (capacity, value, and the policy's default, min, max, step), "-" where there is none.
    fn capacity_rows(d: &Device) -> Vec<[String; 6]> {
        let q = |q: Option<&Quantity>| q.map_or("-".to_string(), |q| q.0.clone());
        d.capacity
            .iter()
            .flatten()
            .map(|(name, c)| {
                let p = c.request_policy.as_ref();
                let r = p.and_then(|p| p.valid_range.as_ref());
                [
                    name.clone(),
                    c.value.0.clone(),
                    q(p.and_then(|p| p.default.as_ref())),
                    q(r.map(|r| &r.min)),
                    q(r.and_then(|r| r.max.as_ref())),
                    q(r.and_then(|r| r.step.as_ref())),
                ]
            })
            .collect()
    }

    /// Shared by N claims, every device of the simulated MIG node is published as NVIDIA's
    /// `--consumable-shares=<N>` publishes it, and the allocator reads N claims per device; with 1
    /// nothing of sharing is published. A lost GPU never gets sharing fields.
    #[test]
    fn shared_devices_take_n_claims_as_nvidias_consumable_shares() {
        let mut inventory =
            crate::discovery::simulated::parse(include_str!("../examples/sim-inventory-mig.yaml")).unwrap();
        inventory.gpus.push(Gpu::lost(2));
        let row = |cells: [&str; 6]| cells.map(str::to_owned);
        for n in [1u32, 2, 4] {
            let ns = n.to_string();
            let shares = row(["shares", &ns, "1", "1", &ns, "1"]);
            let memory = |v: &str| match n {
                1 => row(["memory", v, "-", "-", "-", "-"]),
                _ => row(["memory", v, "0", "0", v, "1Mi"]),
            };
            let sms = |v: &str| match n {
                1 => row(["multiprocessors", v, "-", "-", "-", "-"]),
                _ => row(["multiprocessors", v, "0", "0", v, "1"]),
            };
            let with_shares = |mut rows: Vec<[String; 6]>| {
                if n > 1 {
                    rows.push(shares.clone());
                }
                rows
            };
            let want: Vec<(&str, Vec<[String; 6]>)> = vec![
                ("gpu-0", with_shares(vec![memory("80Gi")])),
                ("gpu-1-mig-3g40gb-0", with_shares(vec![memory("40Gi"), sms("42")])),
                ("gpu-1-mig-2g20gb-0", with_shares(vec![memory("20Gi"), sms("28")])),
                ("gpu-1-mig-1g10gb-0", with_shares(vec![memory("10Gi"), sms("14")])),
                ("gpu-1-mig-1g10gb-1", with_shares(vec![memory("10Gi"), sms("14")])),
                ("gpu-2", vec![]),
            ];
            let devices = build_devices(&inventory, &HealthState::default(), "gpu.switchyard.dev", &[], n);
            let got: Vec<(&str, Vec<[String; 6]>)> =
                devices.iter().map(|d| (d.name.as_str(), capacity_rows(d))).collect();
            assert_eq!(got, want, "{n} shares");
            for d in &devices {
                let lost = d.name == "gpu-2";
                let want = if lost { 1 } else { u64::from(n) };
                assert_eq!(claims_per_device(d), want, "{} with {n} shares", d.name);
                let multiple = (n > 1 && !lost).then_some(true);
                assert_eq!(d.allow_multiple_allocations, multiple, "{} with {n} shares", d.name);
            }
        }
    }

    /// The API's rules for a consumable capacity's validRange (Kubernetes 1.37,
    /// `validateRequestPolicyRange`), on whole numbers: every shared capacity passes them, also
    /// for memory that is no whole number of MiB, and one too small for a single step has no
    /// policy (which the API accepts on any capacity of a shareable device).
    #[test]
    fn shared_capacities_pass_the_apis_range_rules() {
        use switchyard_api::quantity::units;
        let mut g = h100(1);
        g.memory_bytes = (80 << 30) + 123;
        g.mig = vec![
            MigDevice {
                uuid: "MIG-a".into(),
                profile: "1g.10gb".into(),
                memory_bytes: (9856 << 20) + 512,
                multiprocessors: 16,
                gi: 1,
                ..Default::default()
            },
            MigDevice {
                uuid: "MIG-b".into(),
                profile: "1g.10gb".into(),
                memory_bytes: 1000,
                multiprocessors: 0,
                gi: 2,
                ..Default::default()
            },
        ];
        let mut whole = h100(0);
        whole.memory_bytes = (80 << 30) + 123;
        let devices = build_devices(&inv(vec![whole, g]), &HealthState::default(), "d", &[], 3);
        let caps = |name: &str| -> Vec<(String, String)> {
            let d = devices.iter().find(|d| d.name == name).unwrap();
            d.capacity.iter().flatten().map(|(k, c)| (k.clone(), c.value.0.clone())).collect()
        };
        assert_eq!(caps("gpu-0"), [("memory".into(), "80Gi".into()), ("shares".into(), "3".into())]);
        assert_eq!(caps("gpu-1-mig-1g10gb-0")[0], ("memory".into(), "9856Mi".into()));
        assert_eq!(
            caps("gpu-1-mig-1g10gb-1"),
            [
                ("memory".into(), "0".into()),
                ("multiprocessors".into(), "0".into()),
                ("shares".into(), "3".into())
            ]
        );
        let mut policies = 0;
        for d in &devices {
            assert_eq!(d.allow_multiple_allocations, Some(true), "{}", d.name);
            for (name, c) in d.capacity.iter().flatten() {
                let Some(p) = &c.request_policy else {
                    assert_eq!(
                        units(&c.value),
                        Some(0),
                        "{} {name}: only a zero capacity has no policy",
                        d.name
                    );
                    continue;
                };
                policies += 1;
                let r = p.valid_range.as_ref().unwrap();
                let n = |q: &Quantity| units(q).unwrap();
                let (value, default, min) = (n(&c.value), n(p.default.as_ref().unwrap()), n(&r.min));
                let (max, step) = (n(r.max.as_ref().unwrap()), n(r.step.as_ref().unwrap()));
                let at = format!("{} {name}", d.name);
                assert!(p.valid_values.is_none(), "{at}");
                assert!(step > 0 && min + step <= value, "{at}: one step fits");
                assert!(
                    min <= default && default <= max && max <= value,
                    "{at}: min <= default <= max <= value"
                );
                assert_eq!(((default - min) % step, (max - min) % step), (0, 0), "{at}: multiples of step");
            }
        }
        assert_eq!(
            policies, 6,
            "the GPU's memory and shares, the first MIG device's three, the second's shares"
        );
    }

    #[test]
    fn health_becomes_device_taints_and_shutdown_taints_everything() {
        let mut g = h100(1);
        g.mig =
            vec![MigDevice { uuid: "MIG-a".into(), profile: "1g.10gb".into(), gi: 1, ..Default::default() }];
        let inventory = inv(vec![h100(0), g]);
        let mut health = HealthState::default();
        let at = Timestamp::from_second(1_800_000_000).unwrap();
        health.apply(
            &HealthPolicy::default(),
            &HealthEvent { device: "gpu-1".into(), kind: FaultKind::Xid { xid: 79 }, at },
        );
        let devices = build_devices(&inventory, &health, "gpu.switchyard.dev", &[], 1);
        assert!(devices[0].taints.is_none());
        let t = devices[1].taints.as_ref().expect("MIG device inherits the parent's fault");
        assert_eq!(t.len(), 1);
        assert_eq!(t[0].key, "gpu.switchyard.dev/xid");
        assert_eq!(t[0].value.as_deref(), Some("79"));
        assert_eq!(t[0].effect, "NoSchedule");
        assert_eq!(t[0].time_added, Some(Time(at)));

        let down = at.checked_add(k8s_openapi::jiff::SignedDuration::from_millis(1500)).unwrap();
        let devices = build_devices(
            &inventory,
            &health,
            "gpu.switchyard.dev",
            &[NodeTaint::driver_unavailable(down)],
            1,
        );
        for d in &devices {
            let last = d.taints.as_ref().unwrap().last().unwrap();
            assert_eq!(last.key, "gpu.switchyard.dev/driver-unavailable", "{}", d.name);
            assert_eq!(last.effect, "NoSchedule");
            assert_eq!(last.time_added.as_ref().unwrap().0.as_second(), down.as_second());
            assert_eq!(last.time_added.as_ref().unwrap().0.subsec_nanosecond(), 0);
        }
        assert_eq!(devices[1].taints.as_ref().unwrap().len(), 2);
    }

    /// Every node-wide taint goes on every device, after its health taints, with its value (the
    /// not-registered taint's fixed word) and timeAdded; none without node-wide taints.
    #[test]
    fn node_wide_taints_go_on_every_device_with_their_value() {
        let mut g = h100(1);
        g.mig =
            vec![MigDevice { uuid: "MIG-a".into(), profile: "1g.10gb".into(), gi: 1, ..Default::default() }];
        let inventory = inv(vec![h100(0), g]);
        let at = |s: i64| Timestamp::from_second(1_800_000_000 + s).unwrap();
        let mut health = HealthState::default();
        health.apply(
            &HealthPolicy::default(),
            &HealthEvent { device: "gpu-0".into(), kind: FaultKind::Xid { xid: 79 }, at: at(0) },
        );
        let node_taints = [
            NodeTaint::device_plugin_active(at(1)),
            NodeTaint::kubelet_plugin_not_registered(at(2), "pending"),
        ];
        let devices = build_devices(&inventory, &health, "gpu.switchyard.dev", &node_taints, 1);
        let row = |t: &DeviceTaint| {
            (t.key.clone(), t.value.clone(), t.effect.clone(), t.time_added.as_ref().map(|t| t.0))
        };
        let node_wide = [
            (
                "gpu.switchyard.dev/device-plugin-active".to_string(),
                None,
                "NoSchedule".to_string(),
                Some(at(1)),
            ),
            (
                "gpu.switchyard.dev/kubelet-plugin-not-registered".to_string(),
                Some("pending".to_string()),
                "NoSchedule".to_string(),
                Some(at(2)),
            ),
        ];
        let got: Vec<_> = devices[0].taints.as_ref().unwrap().iter().map(row).collect();
        let xid = (
            "gpu.switchyard.dev/xid".to_string(),
            Some("79".to_string()),
            "NoSchedule".to_string(),
            Some(at(0)),
        );
        assert_eq!(got, [&[xid][..], &node_wide[..]].concat());
        let got: Vec<_> = devices[1].taints.as_ref().unwrap().iter().map(row).collect();
        assert_eq!(got, node_wide, "the MIG device of a healthy GPU");

        let slices = desired_slices(&id(), &inventory, &HealthState::default(), &[], 1, 1);
        assert!(slices[0].spec.devices.iter().flatten().all(|d| d.taints.is_none()));
    }

    /// What a restarted agent reads back from its slices rebuilds the health it published: the
    /// same slices come out, node-wide and foreign taints are not taken for health taints, and a
    /// whole-GPU fault shown on its MIG devices is restored on the GPU.
    #[test]
    fn published_health_round_trips_through_restore() {
        let mut g = h100(1);
        g.mig = (0..2)
            .map(|i| MigDevice {
                uuid: format!("MIG-{i}"),
                profile: "1g.10gb".into(),
                gi: i,
                ..Default::default()
            })
            .collect();
        let inventory = inv(vec![h100(0), g, h100(2)]);
        let policy = HealthPolicy::default();
        let at = |s: i64| Timestamp::from_second(1_800_000_000 + s).unwrap();
        let mut health = HealthState::default();
        for (device, kind, t) in [
            ("gpu-0", FaultKind::Xid { xid: 13 }, 0),
            ("gpu-1", FaultKind::EccDbe, 1),
            ("gpu-1-mig-1g10gb-1", FaultKind::Xid { xid: 79 }, 2),
        ] {
            health.apply(&policy, &HealthEvent { device: device.into(), kind, at: at(t) });
        }
        let node_taints = [
            NodeTaint::driver_unavailable(at(5)),
            NodeTaint::device_plugin_active(at(6)),
            NodeTaint::kubelet_plugin_not_registered(at(7), "refused"),
        ];
        let mut published = desired_slices(&id(), &inventory, &health, &node_taints, 1, 3);
        published[0].spec.devices.as_mut().unwrap()[0].taints.as_mut().unwrap().push(DeviceTaint {
            key: "other.example.com/xid".into(),
            value: Some("79".into()),
            effect: "NoSchedule".into(),
            time_added: None,
        });

        let read = published_health(&published, "gpu.switchyard.dev", at(100));
        let names: Vec<&str> = read.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["gpu-0", "gpu-1-mig-1g10gb-0", "gpu-1-mig-1g10gb-1", "gpu-2"]);
        let kinds: Vec<Vec<TaintKind>> =
            read.iter().map(|(_, t)| t.iter().map(|t| t.kind).collect()).collect();
        assert_eq!(
            kinds,
            [vec![TaintKind::Xid], vec![TaintKind::EccDbe], vec![TaintKind::Xid, TaintKind::EccDbe], vec![]]
        );
        assert_eq!(read[0].1[0].effect, Effect::None);
        assert_eq!(read[0].1[0].since, at(0));

        let mut restored = HealthState::default();
        restored.restore(read);
        assert_eq!(
            desired_slices(&id(), &inventory, &restored, &[], 1, 0),
            desired_slices(&id(), &inventory, &health, &[], 1, 0)
        );
        assert_eq!(restored.taints_for("gpu-1", None).len(), 1, "the ECC fault is the GPU's");
        assert_eq!(restored.taints_for("gpu-1-mig-1g10gb-0", None), []);
    }

    #[test]
    fn slices_chunk_and_carry_pool_metadata() {
        let dev = |i: usize, tainted: bool| Device {
            name: format!("gpu-{i}"),
            taints: tainted
                .then(|| vec![DeviceTaint { key: "k".into(), effect: "None".into(), ..Default::default() }]),
            ..Default::default()
        };
        // (devices, any tainted, expected device counts per slice)
        let cases: Vec<(usize, bool, Vec<usize>)> = vec![
            (0, false, vec![0]),
            (8, false, vec![8]),
            (128, false, vec![128]),
            (129, false, vec![128, 1]),
            (300, false, vec![128, 128, 44]),
            (100, true, vec![64, 36]),
            (64, true, vec![64]),
        ];
        for (n, tainted, want) in cases {
            let devices: Vec<Device> = (0..n).map(|i| dev(i, tainted && i == n - 1)).collect();
            let slices = build_slices(&id(), devices, &PoolSummary::default(), 7);
            let got: Vec<usize> = slices.iter().map(|s| s.spec.devices.as_ref().unwrap().len()).collect();
            assert_eq!(got, want, "{n} devices, tainted={tainted}");
            for (i, s) in slices.iter().enumerate() {
                assert_eq!(
                    s.metadata.name.as_deref(),
                    Some(format!("node-a-gpu-switchyard-dev-{i}").as_str())
                );
                assert_eq!(s.spec.node_name.as_deref(), Some("node-a"));
                assert_eq!(s.spec.driver, "gpu.switchyard.dev");
                assert_eq!(s.spec.pool.name, "node-a");
                assert_eq!(s.spec.pool.generation, 7);
                assert_eq!(s.spec.pool.resource_slice_count, want.len() as i64);
                let owner = &s.metadata.owner_references.as_ref().unwrap()[0];
                assert_eq!(
                    (owner.kind.as_str(), owner.name.as_str(), owner.uid.as_str()),
                    ("Node", "node-a", "uid-1")
                );
                assert_eq!(
                    s.metadata.labels.as_ref().unwrap().get(well_known::LABEL_MANAGED_BY).map(String::as_str),
                    Some(well_known::AGENT_FIELD_MANAGER)
                );
            }
        }
    }

    #[test]
    fn summary_counts_gpus_and_mig_profiles_and_round_trips_through_annotations() {
        let mut g = h100(1);
        g.mig = (0..3)
            .map(|i| MigDevice {
                uuid: format!("MIG-{i}"),
                profile: if i < 2 { "1g.10gb" } else { "2g.20gb" }.into(),
                gi: i,
                ..Default::default()
            })
            .collect();
        let inventory = inv(vec![h100(0), g]);
        let s = PoolSummary::of(&inventory);
        assert_eq!(s.gpus, 2);
        assert_eq!(s.mig_profiles, BTreeMap::from([("1g.10gb".to_string(), 2), ("2g.20gb".to_string(), 1)]));
        let ann = s.to_annotations();
        assert_eq!(ann[well_known::ANNOTATION_SLICE_MIG_PROFILES], r#"{"1g.10gb":2,"2g.20gb":1}"#);
        assert_eq!(ann[well_known::ANNOTATION_SLICE_GPU_COUNT], "2");
        assert_eq!(PoolSummary::from_annotations(&ann), Some(s));
        let slices = desired_slices(&id(), &inventory, &HealthState::default(), &[], 1, 1);
        assert_eq!(slices[0].metadata.annotations.as_ref(), Some(&ann));
        assert_eq!(PoolSummary::from_annotations(&BTreeMap::new()), None);
    }
}
