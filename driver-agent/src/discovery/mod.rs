//! GPU discovery: the [`Discovery`] trait, the plain data it returns, device naming, and the
//! sysfs/procfs helpers both implementations share.

pub mod nvml;
pub mod simulated;

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;

use crate::error::Error;
use crate::health::HealthEvent;

/// What a node has: owned plain data, so that slice building never touches NVML.
///
/// The same shape (camelCase) is the simulated inventory's YAML format; see
/// [`simulated::SimulatedDiscovery`].
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NodeGpus {
    /// Kernel driver version as NVML reports it, e.g. `570.124.06`.
    pub driver_version: String,
    /// Highest CUDA version the driver supports, `major.minor`, e.g. `12.8`.
    pub cuda_driver_version: String,
    /// The node's GPUs, in index order.
    #[serde(default)]
    pub gpus: Vec<Gpu>,
}

/// One physical GPU. Fields NVML cannot report on this GPU are `None` and are left out of the
/// published attributes.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Gpu {
    /// NVML index; the device name is `gpu-<index>`.
    pub index: u32,
    /// Minor number of `/dev/nvidia<minor>`.
    pub minor: u32,
    /// `GPU-xxxxxxxx-...`.
    pub uuid: String,
    pub product_name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub brand: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub architecture: Option<String>,
    /// `major.minor`, e.g. `9.0`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cuda_compute_capability: Option<String>,
    /// Total framebuffer memory in bytes.
    pub memory_bytes: u64,
    /// PCI address in sysfs form, `dddd:bb:dd.f` (lower case).
    #[serde(default, skip_serializing_if = "Option::is_none", rename = "pciBusID")]
    pub pci_bus_id: Option<String>,
    /// PCIe root complex, `pciDDDD:BB`, from the sysfs path of the device.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pcie_root: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub numa_node: Option<u32>,
    /// Whether MIG mode is on. A GPU in MIG mode is published only through its MIG devices,
    /// because it can no longer be handed out whole. Defaults to "true when `mig` is not empty".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mig_enabled: Option<bool>,
    /// MIG devices that are configured now.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mig: Vec<MigDevice>,
    /// NVML answered `GPU_IS_LOST` for this index (the GPU fell off the bus): nothing but the
    /// index is known. It is published under its name with only its type, tainted `gpu-lost`,
    /// and never prepared, until a later discovery reads it whole.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub lost: bool,
}

impl Gpu {
    /// The GPU at `index` that NVML reports lost.
    pub fn lost(index: u32) -> Self {
        Gpu { index, minor: index, lost: true, ..Default::default() }
    }

    /// Device name: `gpu-<index>`, a DNS label.
    pub fn device_name(&self) -> String {
        format!("gpu-{}", self.index)
    }

    pub fn is_mig_enabled(&self) -> bool {
        self.mig_enabled.unwrap_or(!self.mig.is_empty())
    }
}

/// One configured MIG device (a compute instance inside a GPU instance).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MigDevice {
    /// `MIG-xxxxxxxx-...`.
    pub uuid: String,
    /// Profile as NVIDIA names it, e.g. `1g.10gb` or `1c.3g.40gb`.
    pub profile: String,
    pub memory_bytes: u64,
    pub multiprocessors: u32,
    /// GPU instance id.
    pub gi: u32,
    /// Compute instance id inside the GPU instance.
    pub ci: u32,
    /// Minor of the `nvidia-cap` device that grants access to the GPU instance, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gi_cap_minor: Option<u32>,
    /// Minor of the `nvidia-cap` device that grants access to the compute instance, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ci_cap_minor: Option<u32>,
}

/// A discovered device with its stable name, in publication order.
#[derive(Clone, Copy, Debug)]
pub enum NamedDevice<'a> {
    Gpu(&'a Gpu),
    Mig { parent: &'a Gpu, mig: &'a MigDevice },
}

impl NodeGpus {
    /// Every publishable device with its name: a whole GPU when MIG is off, else its MIG devices.
    /// MIG devices are numbered per (GPU, profile) in (gi, ci) order, so a name does not change
    /// while the MIG layout stays the same.
    pub fn named_devices(&self) -> Vec<(String, NamedDevice<'_>)> {
        let mut out = Vec::new();
        let mut gpus: Vec<&Gpu> = self.gpus.iter().collect();
        gpus.sort_by_key(|g| g.index);
        for gpu in gpus {
            if !gpu.is_mig_enabled() {
                out.push((gpu.device_name(), NamedDevice::Gpu(gpu)));
                continue;
            }
            let mut migs: Vec<&MigDevice> = gpu.mig.iter().collect();
            migs.sort_by_key(|m| (m.gi, m.ci));
            let mut per_profile: std::collections::BTreeMap<String, u32> = Default::default();
            for mig in migs {
                let slug = profile_slug(&mig.profile);
                let n = per_profile.entry(slug.clone()).or_default();
                out.push((
                    format!("gpu-{}-mig-{slug}-{n}", gpu.index),
                    NamedDevice::Mig { parent: gpu, mig },
                ));
                *n += 1;
            }
        }
        out
    }

    /// Name of the whole-GPU device that `name` belongs to (`gpu-3-mig-1g10gb-0` -> `gpu-3`).
    pub fn parent_name(name: &str) -> &str {
        match name.find("-mig-") {
            Some(i) => &name[..i],
            None => name,
        }
    }

    /// Whether `name` is a GPU or MIG device of this inventory, or the `gpu-<index>` of a GPU in
    /// MIG mode (faults are reported against the physical GPU).
    pub fn knows_device(&self, name: &str) -> bool {
        self.gpus.iter().any(|g| g.device_name() == name)
            || self.named_devices().iter().any(|(n, _)| n == name)
    }
}

/// A MIG profile in DNS-label form: lower case, dots and other non-alphanumerics dropped
/// (`1g.10gb` -> `1g10gb`, `1g.10gb+me` -> `1g10gbme`).
pub fn profile_slug(profile: &str) -> String {
    profile.chars().filter(|c| c.is_ascii_alphanumeric()).map(|c| c.to_ascii_lowercase()).collect()
}

/// Source of a node's inventory. Implementations return owned data and do their blocking work off
/// the async runtime.
pub trait Discovery: Send + Sync {
    /// Read what the node has now.
    fn discover(&self) -> BoxFuture<'_, Result<NodeGpus, Error>>;

    /// Whether the driver made the GPUs' device nodes (`/dev/nvidia<N>`, `/dev/nvidiactl`, ...) on
    /// the host, as a real NVIDIA driver does (the default). Without them, whoever hands the
    /// devices to a container must describe each node in full.
    fn host_has_device_nodes(&self) -> bool {
        true
    }
}

/// Hooks a discovery source may offer beyond discovery: hardware health events.
pub trait EventSource: Send + Sync {
    /// Start feeding `tx` with hardware health events for the devices in `inv`, until `stop` is
    /// set. Called once, after the first successful discovery.
    fn start_events(&self, _inv: &NodeGpus, _tx: mpsc::Sender<HealthEvent>, _stop: Arc<AtomicBool>) {}
}

/// Turn NVML's `00000000:18:00.0` into the sysfs form `0000:18:00.0`.
pub fn normalize_bus_id(bus_id: &str) -> String {
    let lower = bus_id.trim().to_ascii_lowercase();
    match lower.split_once(':') {
        Some((domain, rest)) if domain.len() > 4 => format!("{}:{rest}", &domain[domain.len() - 4..]),
        _ => lower,
    }
}

/// The PCIe root complex (`pci0000:00`) from the target of a `/sys/bus/pci/devices/<bus id>`
/// link, e.g. `../../../devices/pci0000:00/0000:00:01.0/0000:01:00.0`.
pub fn pcie_root_from_link(target: &str) -> Option<String> {
    target
        .split('/')
        .find(|c| c.starts_with("pci") && c.len() > 3 && c[3..].contains(':'))
        .map(str::to_string)
}

/// PCIe root of a device from sysfs; `None` when sysfs does not know it.
pub fn pcie_root_from_sysfs(sysfs: &Path, bus_id: &str) -> Option<String> {
    let link = std::fs::read_link(sysfs.join("bus/pci/devices").join(bus_id)).ok()?;
    pcie_root_from_link(&link.to_string_lossy())
}

/// NUMA node of a PCI device from sysfs (`-1` means none).
pub fn numa_node_from_sysfs(sysfs: &Path, bus_id: &str) -> Option<u32> {
    let text = std::fs::read_to_string(sysfs.join("bus/pci/devices").join(bus_id).join("numa_node")).ok()?;
    text.trim().parse::<i64>().ok().and_then(|n| u32::try_from(n).ok())
}

/// `DeviceFileMinor` from an `/proc/driver/nvidia/capabilities/.../access` file.
pub fn parse_cap_minor(text: &str) -> Option<u32> {
    text.lines().find_map(|l| l.trim().strip_prefix("DeviceFileMinor:")).and_then(|v| v.trim().parse().ok())
}

/// Minors of the capability devices for a MIG GPU instance and compute instance, when the driver
/// exposes them under `proc_root` (normally `/proc/driver/nvidia/capabilities`).
pub fn mig_cap_minors(proc_root: &Path, gpu_minor: u32, gi: u32, ci: u32) -> (Option<u32>, Option<u32>) {
    let gi_dir = proc_root.join(format!("gpu{gpu_minor}/mig/gi{gi}"));
    let read = |p: std::path::PathBuf| std::fs::read_to_string(p).ok().as_deref().and_then(parse_cap_minor);
    (read(gi_dir.join("access")), read(gi_dir.join(format!("ci{ci}/access"))))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu(index: u32, mig: Vec<MigDevice>) -> Gpu {
        Gpu { index, uuid: format!("GPU-{index}"), mig, ..Default::default() }
    }

    fn mig(profile: &str, gi: u32, ci: u32) -> MigDevice {
        MigDevice { uuid: format!("MIG-{gi}-{ci}"), profile: profile.into(), gi, ci, ..Default::default() }
    }

    #[test]
    fn profile_slugs_are_dns_label_fragments() {
        for (profile, slug) in [
            ("1g.10gb", "1g10gb"),
            ("3g.40gb", "3g40gb"),
            ("1c.3g.40gb", "1c3g40gb"),
            ("1g.10gb+me", "1g10gbme"),
        ] {
            assert_eq!(profile_slug(profile), slug, "{profile}");
        }
    }

    #[test]
    fn device_names_are_stable_and_numbered_per_profile() {
        let inv = NodeGpus {
            gpus: vec![
                // Out of order on purpose: names follow gi/ci, not the order NVML listed them in.
                gpu(1, vec![mig("1g.10gb", 9, 0), mig("3g.40gb", 1, 0), mig("1g.10gb", 7, 0)]),
                gpu(0, vec![]),
            ],
            ..Default::default()
        };
        let names: Vec<String> = inv.named_devices().into_iter().map(|(n, _)| n).collect();
        assert_eq!(names, ["gpu-0", "gpu-1-mig-3g40gb-0", "gpu-1-mig-1g10gb-0", "gpu-1-mig-1g10gb-1"]);
        let (_, d) = &inv.named_devices()[3];
        assert!(matches!(d, NamedDevice::Mig { mig, .. } if mig.gi == 9));
        assert_eq!(NodeGpus::parent_name("gpu-1-mig-1g10gb-1"), "gpu-1");
        assert_eq!(NodeGpus::parent_name("gpu-12"), "gpu-12");
        assert!(inv.knows_device("gpu-1"), "a GPU in MIG mode still takes faults by its own name");
        assert!(inv.knows_device("gpu-1-mig-1g10gb-1"));
        assert!(!inv.knows_device("gpu-7"));
    }

    #[test]
    fn mig_mode_without_instances_publishes_nothing_for_that_gpu() {
        let mut g = gpu(0, vec![]);
        g.mig_enabled = Some(true);
        let inv = NodeGpus { gpus: vec![g], ..Default::default() };
        assert!(inv.named_devices().is_empty());
    }

    #[test]
    fn bus_ids_normalize_to_sysfs_form() {
        for (nvml, sysfs) in [
            ("00000000:18:00.0", "0000:18:00.0"),
            ("00000001:AB:00.0", "0001:ab:00.0"),
            ("0000:3b:00.0", "0000:3b:00.0"),
        ] {
            assert_eq!(normalize_bus_id(nvml), sysfs);
        }
    }

    #[test]
    fn pcie_root_is_the_pci_component_of_the_sysfs_link() {
        for (target, root) in [
            ("../../../devices/pci0000:00/0000:00:01.0/0000:01:00.0", Some("pci0000:00")),
            ("../../../devices/pci0001:80/0001:80:02.0/0001:81:00.0/0001:82:00.0", Some("pci0001:80")),
            ("../../../devices/platform/foo", None),
        ] {
            assert_eq!(pcie_root_from_link(target).as_deref(), root, "{target}");
        }
    }

    #[test]
    fn sysfs_lookups_follow_the_link_and_read_numa_node() {
        let dir = std::env::temp_dir().join(format!("sy-sysfs-{}", std::process::id()));
        let devdir = dir.join("devices/pci0000:16/0000:16:02.0/0000:18:00.0");
        std::fs::create_dir_all(&devdir).unwrap();
        std::fs::create_dir_all(dir.join("bus/pci/devices")).unwrap();
        std::fs::write(devdir.join("numa_node"), "1\n").unwrap();
        let link = dir.join("bus/pci/devices/0000:18:00.0");
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink("../../../devices/pci0000:16/0000:16:02.0/0000:18:00.0", &link).unwrap();
        assert_eq!(pcie_root_from_sysfs(&dir, "0000:18:00.0").as_deref(), Some("pci0000:16"));
        assert_eq!(numa_node_from_sysfs(&dir, "0000:18:00.0"), Some(1));
        assert_eq!(pcie_root_from_sysfs(&dir, "0000:99:00.0"), None);
        std::fs::write(devdir.join("numa_node"), "-1\n").unwrap();
        assert_eq!(numa_node_from_sysfs(&dir, "0000:18:00.0"), None);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn capability_minor_parses_from_access_file() {
        assert_eq!(
            parse_cap_minor("DeviceFileMinor: 24\nDeviceFileMode: 292\nDeviceFileModify: 1\n"),
            Some(24)
        );
        assert_eq!(parse_cap_minor("DeviceFileMode: 292\n"), None);
    }
}
