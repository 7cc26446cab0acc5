//! CDI (Container Device Interface) specs for prepared claims: what a container that uses a
//! claim's GPUs gets (device nodes and environment), written where the container runtime reads it.
//!
//! One spec file per claim, `<driver with dots as dashes>-<claim uid>.json`, of kind
//! `<driver>/gpu`. Each allocated device becomes a CDI device named `<claim uid>-<device>`, so the
//! same GPU prepared for two claims (shared by share ids, or with admin access) never collides. The spec-wide edits hold what
//! every NVIDIA container needs whatever its devices are (the control and UVM nodes), and
//! `NVIDIA_VISIBLE_DEVICES` with the UUIDs of all devices of the claim: per-device values would
//! overwrite each other when a container gets more than one device.

use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::discovery::NamedDevice;

/// The CDI spec version we write: 0.6.0 is the first with the features we use everywhere (spec
/// and device annotations are unused, so any runtime that reads 0.6.0 reads ours).
pub const CDI_VERSION: &str = "0.6.0";
/// Where container runtimes (containerd, CRI-O) look for dynamic CDI specs by default.
pub const DEFAULT_CDI_DIR: &str = "/var/run/cdi";
/// Device nodes every CUDA container needs besides its GPUs.
pub const CONTROL_DEVICE_NODES: [&str; 3] = ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"];

/// A CDI spec file.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Spec {
    pub cdi_version: String,
    pub kind: String,
    pub devices: Vec<SpecDevice>,
    #[serde(default)]
    pub container_edits: ContainerEdits,
}

/// One named CDI device.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SpecDevice {
    pub name: String,
    pub container_edits: ContainerEdits,
}

/// The subset of CDI container edits we use.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerEdits {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub device_nodes: Vec<DeviceNode>,
}

/// A device node. With a path alone the runtime reads type, major and minor from the host's node
/// at that path (or at `hostPath`, where the host keeps it elsewhere); with all three given it
/// creates the node in the container without looking at the host.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DeviceNode {
    pub path: String,
    #[serde(default, rename = "hostPath", skip_serializing_if = "Option::is_none")]
    pub host_path: Option<String>,
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub node_type: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub major: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub minor: Option<u32>,
}

/// How a spec describes device nodes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DeviceNodes {
    /// Paths only: the runtime takes the rest from the host's `/dev`, where the NVIDIA driver made
    /// the nodes (NVML discovery; the UVM and capability majors are assigned at driver load).
    HostLookup,
    /// Paths only, read on the host under this root (`--dev-root`): `/dev/nvidia0` is the host's
    /// `<root>/dev/nvidia0`, as where a driver container made its device nodes inside its own
    /// root (`/run/nvidia/driver`). The container still sees `/dev/nvidia0`.
    UnderRoot(String),
    /// Character devices with their numbers, for the simulated inventory on nodes without GPUs:
    /// there is no host node to read, so the runtime creates each one inside the container.
    Described,
}

/// The NVIDIA driver's fixed character major: `/dev/nvidia<N>` is 195/N, `/dev/nvidiactl` 195/255.
const NVIDIA_MAJOR: u32 = 195;
const NVIDIACTL_MINOR: u32 = 255;
/// Majors the kernel assigns dynamically on a real node (nvidia-uvm, nvidia-caps); the simulated
/// inventory describes its nodes with these values, in the range Linux hands out dynamically.
const SIM_UVM_MAJOR: u32 = 508;
const SIM_CAPS_MAJOR: u32 = 509;

impl DeviceNode {
    fn new(path: impl Into<String>) -> Self {
        DeviceNode { path: path.into(), host_path: None, node_type: None, major: None, minor: None }
    }

    fn char_device(path: impl Into<String>, major: u32, minor: u32, mode: &DeviceNodes) -> Self {
        match mode {
            DeviceNodes::HostLookup => DeviceNode::new(path),
            DeviceNodes::UnderRoot(root) => {
                let path = path.into();
                let host_path = format!("{}{path}", root.trim_end_matches('/'));
                DeviceNode { host_path: Some(host_path), ..DeviceNode::new(path) }
            }
            DeviceNodes::Described => DeviceNode {
                path: path.into(),
                host_path: None,
                node_type: Some("c".into()),
                major: Some(major),
                minor: Some(minor),
            },
        }
    }
}

/// The nodes every CUDA container needs besides its GPUs (see [`CONTROL_DEVICE_NODES`]).
fn control_device_nodes(mode: &DeviceNodes) -> Vec<DeviceNode> {
    let [ctl, uvm, uvm_tools] = CONTROL_DEVICE_NODES;
    vec![
        DeviceNode::char_device(ctl, NVIDIA_MAJOR, NVIDIACTL_MINOR, mode),
        DeviceNode::char_device(uvm, SIM_UVM_MAJOR, 0, mode),
        DeviceNode::char_device(uvm_tools, SIM_UVM_MAJOR, 1, mode),
    ]
}

/// `<driver>/gpu`, e.g. `gpu.switchyard.dev/gpu`.
pub fn kind(driver: &str) -> String {
    format!("{driver}/gpu")
}

/// The spec file of a claim: `gpu-switchyard-dev-<uid>.json`.
pub fn spec_file_name(driver: &str, claim_uid: &str) -> String {
    format!("{}-{claim_uid}.json", driver.replace('.', "-"))
}

/// CDI device name of `device` (a device name in our pool) prepared for a claim.
pub fn device_name(claim_uid: &str, device: &str) -> String {
    format!("{claim_uid}-{device}")
}

/// Fully qualified CDI device id, `<kind>=<name>`, as the kubelet hands it to the runtime.
pub fn qualified_id(driver: &str, claim_uid: &str, device: &str) -> String {
    format!("{}={}", kind(driver), device_name(claim_uid, device))
}

/// The UUID that names `d` in `NVIDIA_VISIBLE_DEVICES`, and its own device nodes.
fn device_nodes(d: &NamedDevice<'_>, mode: &DeviceNodes) -> (String, Vec<DeviceNode>) {
    let gpu_node =
        |minor: u32| DeviceNode::char_device(format!("/dev/nvidia{minor}"), NVIDIA_MAJOR, minor, mode);
    match d {
        NamedDevice::Gpu(g) => (g.uuid.clone(), vec![gpu_node(g.minor)]),
        NamedDevice::Mig { parent, mig } => {
            let mut nodes = vec![gpu_node(parent.minor)];
            // The capability devices gate access to the GPU instance and the compute instance.
            for minor in [mig.gi_cap_minor, mig.ci_cap_minor].into_iter().flatten() {
                let path = format!("/dev/nvidia-caps/nvidia-cap{minor}");
                nodes.push(DeviceNode::char_device(path, SIM_CAPS_MAJOR, minor, mode));
            }
            (mig.uuid.clone(), nodes)
        }
    }
}

/// The spec for one claim, its devices given as (device name in our pool, device), in the order
/// of the allocation results. Pure; the same input gives the same bytes.
pub fn claim_spec(
    driver: &str,
    claim_uid: &str,
    devices: &[(String, NamedDevice<'_>)],
    mode: &DeviceNodes,
) -> Spec {
    let mut uuids = Vec::new();
    let devices = devices
        .iter()
        .map(|(name, d)| {
            let (uuid, nodes) = device_nodes(d, mode);
            uuids.push(uuid);
            SpecDevice {
                name: device_name(claim_uid, name),
                container_edits: ContainerEdits { env: Vec::new(), device_nodes: nodes },
            }
        })
        .collect();
    Spec {
        cdi_version: CDI_VERSION.into(),
        kind: kind(driver),
        devices,
        container_edits: ContainerEdits {
            env: vec![format!("NVIDIA_VISIBLE_DEVICES={}", uuids.join(","))],
            device_nodes: control_device_nodes(mode),
        },
    }
}

/// The bytes written for a spec: pretty JSON with a trailing newline.
pub fn render(spec: &Spec) -> Vec<u8> {
    // A Spec holds only strings and vectors, which always serialise.
    let mut out = serde_json::to_vec_pretty(spec).unwrap_or_default();
    out.push(b'\n');
    out
}

/// Write `bytes` to `path` so that readers see the old file or the whole new one, never a part:
/// a temporary file in the same directory, flushed, renamed over `path`, then the directory
/// flushed so the rename survives a crash.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or_else(|| Path::new("."));
    std::fs::create_dir_all(dir)?;
    let file_name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    // A leading dot, so that runtimes scanning for *.json skip the half-written file.
    let tmp = dir.join(format!(".{file_name}.tmp.{}", std::process::id()));
    let result = (|| {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)?;
        std::fs::File::open(dir)?.sync_all()
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// Write a claim's spec into `dir`; returns its path.
pub fn write_spec(dir: &Path, driver: &str, claim_uid: &str, spec: &Spec) -> std::io::Result<PathBuf> {
    let path = dir.join(spec_file_name(driver, claim_uid));
    write_atomic(&path, &render(spec))?;
    Ok(path)
}

/// Remove a claim's spec; a spec that is already gone is not an error.
pub fn remove_spec(dir: &Path, driver: &str, claim_uid: &str) -> std::io::Result<()> {
    match std::fs::remove_file(dir.join(spec_file_name(driver, claim_uid))) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::discovery::{Gpu, MigDevice};

    #[test]
    fn names_follow_the_driver_and_claim() {
        assert_eq!(kind("gpu.switchyard.dev"), "gpu.switchyard.dev/gpu");
        assert_eq!(spec_file_name("gpu.switchyard.dev", "u-1"), "gpu-switchyard-dev-u-1.json");
        assert_eq!(qualified_id("gpu.switchyard.dev", "u-1", "gpu-0"), "gpu.switchyard.dev/gpu=u-1-gpu-0");
    }

    #[test]
    fn mig_devices_get_their_parent_and_capability_nodes() {
        let parent = Gpu { index: 1, minor: 3, uuid: "GPU-p".into(), ..Default::default() };
        let with_caps = MigDevice {
            uuid: "MIG-a".into(),
            gi_cap_minor: Some(84),
            ci_cap_minor: Some(85),
            ..Default::default()
        };
        let without = MigDevice { uuid: "MIG-b".into(), ..Default::default() };
        let spec = claim_spec(
            "d.example",
            "u",
            &[
                ("gpu-1-mig-1g10gb-0".into(), NamedDevice::Mig { parent: &parent, mig: &with_caps }),
                ("gpu-1-mig-1g10gb-1".into(), NamedDevice::Mig { parent: &parent, mig: &without }),
            ],
            &DeviceNodes::HostLookup,
        );
        let paths = |i: usize| -> Vec<&str> {
            spec.devices[i].container_edits.device_nodes.iter().map(|n| n.path.as_str()).collect()
        };
        assert_eq!(
            paths(0),
            ["/dev/nvidia3", "/dev/nvidia-caps/nvidia-cap84", "/dev/nvidia-caps/nvidia-cap85"]
        );
        assert_eq!(paths(1), ["/dev/nvidia3"]);
        assert_eq!(spec.container_edits.env, ["NVIDIA_VISIBLE_DEVICES=MIG-a,MIG-b"]);
        let all = spec.devices.iter().flat_map(|d| &d.container_edits.device_nodes);
        let host_lookup = |n: &DeviceNode| n.node_type.is_none() && n.major.is_none() && n.minor.is_none();
        assert!(all.chain(&spec.container_edits.device_nodes).all(host_lookup), "NVML: paths only");
    }

    #[test]
    fn a_dev_root_puts_the_host_side_of_every_node_under_it() {
        let gpu = Gpu { index: 1, minor: 1, uuid: "GPU-r".into(), ..Default::default() };
        let spec = claim_spec(
            "d.example",
            "u",
            &[("gpu-1".into(), NamedDevice::Gpu(&gpu))],
            &DeviceNodes::UnderRoot("/run/nvidia/driver/".into()),
        );
        let pairs = |nodes: &[DeviceNode]| -> Vec<(String, Option<String>)> {
            nodes.iter().map(|n| (n.path.clone(), n.host_path.clone())).collect()
        };
        assert_eq!(
            pairs(&spec.devices[0].container_edits.device_nodes),
            [("/dev/nvidia1".into(), Some("/run/nvidia/driver/dev/nvidia1".into()))]
        );
        assert_eq!(
            pairs(&spec.container_edits.device_nodes),
            [
                ("/dev/nvidiactl".into(), Some("/run/nvidia/driver/dev/nvidiactl".into())),
                ("/dev/nvidia-uvm".into(), Some("/run/nvidia/driver/dev/nvidia-uvm".into())),
                ("/dev/nvidia-uvm-tools".into(), Some("/run/nvidia/driver/dev/nvidia-uvm-tools".into())),
            ]
        );
        // The runtime reads type and numbers from the host's node: the spec gives none.
        let json: serde_json::Value = serde_json::from_slice(&render(&spec)).unwrap();
        assert_eq!(
            json["devices"][0]["containerEdits"]["deviceNodes"][0],
            serde_json::json!({"path": "/dev/nvidia1", "hostPath": "/run/nvidia/driver/dev/nvidia1"})
        );
    }

    #[test]
    fn simulated_devices_are_fully_described_character_nodes() {
        let gpu = Gpu { index: 2, minor: 5, uuid: "GPU-s".into(), ..Default::default() };
        let mig = MigDevice { uuid: "MIG-s".into(), gi_cap_minor: Some(30), ..Default::default() };
        let spec = claim_spec(
            "d.example",
            "u",
            &[
                ("gpu-2".into(), NamedDevice::Gpu(&gpu)),
                ("gpu-2-mig-1g10gb-0".into(), NamedDevice::Mig { parent: &gpu, mig: &mig }),
            ],
            &DeviceNodes::Described,
        );
        type Described = (String, Option<String>, Option<u32>, Option<u32>);
        let described = |nodes: &[DeviceNode]| -> Vec<Described> {
            nodes.iter().map(|n| (n.path.clone(), n.node_type.clone(), n.major, n.minor)).collect()
        };
        let c = || Some("c".to_string());
        assert_eq!(
            described(&spec.devices[0].container_edits.device_nodes),
            [("/dev/nvidia5".into(), c(), Some(195), Some(5))]
        );
        assert_eq!(
            described(&spec.devices[1].container_edits.device_nodes),
            [
                ("/dev/nvidia5".into(), c(), Some(195), Some(5)),
                ("/dev/nvidia-caps/nvidia-cap30".into(), c(), Some(509), Some(30))
            ]
        );
        assert_eq!(
            described(&spec.container_edits.device_nodes),
            [
                ("/dev/nvidiactl".into(), c(), Some(195), Some(255)),
                ("/dev/nvidia-uvm".into(), c(), Some(508), Some(0)),
                ("/dev/nvidia-uvm-tools".into(), c(), Some(508), Some(1)),
            ]
        );
        // The CDI spec's own field names: `type`, `major`, `minor`.
        let json: serde_json::Value = serde_json::from_slice(&render(&spec)).unwrap();
        assert_eq!(
            json["devices"][0]["containerEdits"]["deviceNodes"][0],
            serde_json::json!({"path": "/dev/nvidia5", "type": "c", "major": 195, "minor": 5})
        );
    }

    #[test]
    fn specs_are_written_atomically_and_removed_idempotently() {
        let dir = std::env::temp_dir().join(format!("sy-cdi-{}", std::process::id()));
        let gpu = Gpu { uuid: "GPU-x".into(), ..Default::default() };
        let spec = claim_spec(
            "d.example",
            "u",
            &[("gpu-0".into(), NamedDevice::Gpu(&gpu))],
            &DeviceNodes::Described,
        );
        let path = write_spec(&dir, "d.example", "u", &spec).unwrap();
        let back: Spec = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        assert_eq!(back, spec);
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1, "no temporary file is left behind");
        remove_spec(&dir, "d.example", "u").unwrap();
        remove_spec(&dir, "d.example", "u").unwrap();
        assert!(!path.exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
