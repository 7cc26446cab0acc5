//! CDI (Container Device Interface) specs for prepared claims: what a container that uses a
//! claim's GPUs gets (device nodes and environment), written where the container runtime reads it.
//!
//! One spec file per claim, `<driver with dots as dashes>-<claim uid>.json`, of kind
//! `<driver>/gpu`. Each allocated device becomes a CDI device named `<claim uid>-<device>`, so the
//! same GPU prepared for two claims (admin access) never collides. The spec-wide edits hold what
//! every NVIDIA container needs whatever its devices are (the control and UVM nodes), and
//! `NVIDIA_VISIBLE_DEVICES` with the UUIDs of all devices of the claim: per-device values would
//! overwrite each other when a container gets more than one device.

use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::inventory::NamedDevice;

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

/// A device node; the runtime reads type, major and minor from the host path.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DeviceNode {
    pub path: String,
}

impl DeviceNode {
    fn new(path: impl Into<String>) -> Self {
        DeviceNode { path: path.into() }
    }
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
fn device_nodes(d: &NamedDevice<'_>) -> (String, Vec<DeviceNode>) {
    match d {
        NamedDevice::Gpu(g) => (g.uuid.clone(), vec![DeviceNode::new(format!("/dev/nvidia{}", g.minor))]),
        NamedDevice::Mig { parent, mig } => {
            let mut nodes = vec![DeviceNode::new(format!("/dev/nvidia{}", parent.minor))];
            // The capability devices gate access to the GPU instance and the compute instance.
            for minor in [mig.gi_cap_minor, mig.ci_cap_minor].into_iter().flatten() {
                nodes.push(DeviceNode::new(format!("/dev/nvidia-caps/nvidia-cap{minor}")));
            }
            (mig.uuid.clone(), nodes)
        }
    }
}

/// The spec for one claim, its devices given as (device name in our pool, device), in the order
/// of the allocation results. Pure; the same input gives the same bytes.
pub fn claim_spec(driver: &str, claim_uid: &str, devices: &[(String, NamedDevice<'_>)]) -> Spec {
    let mut uuids = Vec::new();
    let devices = devices
        .iter()
        .map(|(name, d)| {
            let (uuid, nodes) = device_nodes(d);
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
            device_nodes: CONTROL_DEVICE_NODES.iter().map(|p| DeviceNode::new(*p)).collect(),
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
    use crate::inventory::{Gpu, MigDevice};

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
    }

    #[test]
    fn specs_are_written_atomically_and_removed_idempotently() {
        let dir = std::env::temp_dir().join(format!("sy-cdi-{}", std::process::id()));
        let gpu = Gpu { uuid: "GPU-x".into(), ..Default::default() };
        let spec = claim_spec("d.example", "u", &[("gpu-0".into(), NamedDevice::Gpu(&gpu))]);
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
