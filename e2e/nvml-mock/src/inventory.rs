//! What the mock's GPUs are (a JSON file per node) and the faults a test raises on them (a
//! second file, a JSON object per line, read as it grows).

use serde::Deserialize;

/// A node's GPUs, as NVML would report them.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Inventory {
    #[serde(default = "default_driver")]
    pub driver_version: String,
    #[serde(default = "default_nvml")]
    pub nvml_version: String,
    /// `major * 1000 + minor * 10`, as `nvmlSystemGetCudaDriverVersion` answers: 12080 is 12.8.
    #[serde(default = "default_cuda")]
    pub cuda_driver_version: i32,
    /// The faults file; by default the inventory's path with `.faults` appended.
    #[serde(default)]
    pub faults_file: Option<String>,
    pub gpus: Vec<Gpu>,
}

fn default_driver() -> String {
    "580.95.05".into()
}
fn default_nvml() -> String {
    "13.580.95.05".into()
}
fn default_cuda() -> i32 {
    13000
}

/// One physical GPU.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Gpu {
    pub uuid: String,
    /// `NVIDIA H100 80GB HBM3`.
    pub name: String,
    pub memory_bytes: u64,
    /// The `N` of `/dev/nvidiaN`; by default its index.
    #[serde(default)]
    pub minor: Option<u32>,
    /// `0000:18:00.0`.
    #[serde(default)]
    pub pci_bus_id: Option<String>,
    #[serde(default)]
    pub numa_node: Option<u32>,
    /// NVML's `nvmlDeviceArchitecture_t`: 7 Ampere, 9 Hopper, 10 Blackwell.
    #[serde(default = "default_architecture")]
    pub architecture: u32,
    #[serde(default = "default_compute_capability")]
    pub compute_capability: (i32, i32),
    /// NVML's `nvmlBrandType_t`: 2 Tesla (data-centre parts).
    #[serde(default = "default_brand")]
    pub brand: u32,
    #[serde(default = "default_multiprocessors")]
    pub multiprocessors: u32,
    /// MIG mode on, with these instances.
    #[serde(default)]
    pub mig_enabled: bool,
    #[serde(default)]
    pub mig: Vec<Mig>,
}

fn default_architecture() -> u32 {
    9
}
fn default_compute_capability() -> (i32, i32) {
    (9, 0)
}
fn default_brand() -> u32 {
    2
}
fn default_multiprocessors() -> u32 {
    132
}

/// One MIG device (a GPU instance with one compute instance).
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Mig {
    pub uuid: String,
    /// `1g.10gb`: NVML names the device `<GPU name> MIG 1g.10gb`.
    pub profile: String,
    pub memory_bytes: u64,
    pub gpu_instance_id: u32,
    #[serde(default)]
    pub compute_instance_id: u32,
    pub multiprocessors: u32,
    /// Of the GPU's slices, how many the instance takes (the `1` of `1g`).
    pub gpu_instance_slices: u32,
    /// The memory slice its placement starts at; by default the first free one of its profile
    /// ([`crate::mig::place`], which sets it when the inventory is parsed).
    #[serde(default)]
    pub placement_start: Option<u32>,
}

/// A fault a test raises: one line of the faults file.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Fault {
    pub uuid: String,
    pub kind: FaultKind,
    /// The XID of an `xid` fault.
    #[serde(default)]
    pub xid: u64,
}

#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum FaultKind {
    /// An XID error event (critical by NVML's classification, whatever the number).
    Xid,
    /// An uncorrectable (double-bit) ECC error: an event, and the volatile counter goes up.
    EccDbe,
    /// The GPU falls off the bus: calls on it answer `NVML_ERROR_GPU_IS_LOST`.
    Lost,
    /// Back to health: answers again, counters cleared.
    Recover,
}

impl Inventory {
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut inv: Inventory = serde_json::from_str(text).map_err(|e| e.to_string())?;
        let mut seen = std::collections::HashSet::new();
        for g in &mut inv.gpus {
            for uuid in std::iter::once(&g.uuid).chain(g.mig.iter().map(|m| &m.uuid)) {
                if !seen.insert(uuid.clone()) {
                    return Err(format!("uuid {uuid} appears twice"));
                }
            }
            if !g.mig_enabled && !g.mig.is_empty() {
                return Err(format!("{} lists MIG devices with migEnabled false", g.uuid));
            }
            crate::mig::place(g)?;
        }
        Ok(inv)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_inventory_is_checked_and_defaulted() {
        let ok = Inventory::parse(
            r#"{"gpus": [{"uuid": "GPU-a", "name": "NVIDIA A100-SXM4-80GB", "memoryBytes": 1}]}"#,
        )
        .expect("a minimal inventory");
        assert_eq!((ok.driver_version.as_str(), ok.cuda_driver_version), ("580.95.05", 13000));
        assert_eq!((ok.gpus[0].architecture, ok.gpus[0].compute_capability), (9, (9, 0)));
        let cases = [
            (
                r#"{"gpus": [{"uuid": "GPU-a", "name": "x", "memoryBytes": 1}, {"uuid": "GPU-a", "name": "x", "memoryBytes": 1}]}"#,
                "uuid GPU-a appears twice",
            ),
            (
                r#"{"gpus": [{"uuid": "GPU-a", "name": "x", "memoryBytes": 1, "mig": [{"uuid": "MIG-a", "profile": "1g.10gb", "memoryBytes": 1, "gpuInstanceId": 1, "multiprocessors": 1, "gpuInstanceSlices": 1}]}]}"#,
                "GPU-a lists MIG devices with migEnabled false",
            ),
            (
                r#"{"gpus": [{"uuid": "GPU-a", "name": "x", "memoryBytes": 1, "colour": "green"}]}"#,
                "unknown field `colour`",
            ),
            (r#"{"gpus": "none"}"#, "invalid type"),
        ];
        for (text, want) in cases {
            let e = Inventory::parse(text).expect_err(want);
            assert!(e.contains(want), "{want}: {e}");
        }
    }

    #[test]
    fn faults_read_as_a_test_writes_them() {
        let f: Fault = serde_json::from_str(r#"{"uuid": "GPU-a", "kind": "xid", "xid": 79}"#).unwrap();
        assert_eq!(f, Fault { uuid: "GPU-a".into(), kind: FaultKind::Xid, xid: 79 });
        let f: Fault = serde_json::from_str(r#"{"uuid": "GPU-a", "kind": "ecc-dbe"}"#).unwrap();
        assert_eq!(f.kind, FaultKind::EccDbe);
        assert!(serde_json::from_str::<Fault>(r#"{"uuid": "GPU-a", "kind": "melt"}"#).is_err());
    }
}
