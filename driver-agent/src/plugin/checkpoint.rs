//! The prepared-claims checkpoint: what this node prepared, on disk, so that an agent restarted
//! between NodePrepareResources and NodeUnprepareResources answers as its predecessor did.
//!
//! The kubelet keeps a claim prepared across agent restarts and expects the same CDI ids back when
//! it asks again; the answer therefore comes from here, never from a fresh look at the API (the
//! claim may be gone, or the inventory may have changed). One JSON file, replaced atomically.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::cdi;
use crate::error::Error;

/// Format version of the file; a reader refuses files of a newer version.
pub const CHECKPOINT_VERSION: u32 = 1;

/// The whole file.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Checkpoint {
    pub version: u32,
    /// Prepared claims by claim uid.
    #[serde(default)]
    pub claims: BTreeMap<String, PreparedClaim>,
}

impl Default for Checkpoint {
    fn default() -> Self {
        Checkpoint { version: CHECKPOINT_VERSION, claims: BTreeMap::new() }
    }
}

/// One prepared claim: the answer given to the kubelet and the spec written for the runtime.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PreparedClaim {
    pub namespace: String,
    pub name: String,
    pub devices: Vec<PreparedDevice>,
    /// Kept so that a spec deleted behind our back is written again on the next prepare.
    pub spec: cdi::Spec,
}

/// One prepared device, as returned in NodePrepareResourceResponse.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PreparedDevice {
    pub request_names: Vec<String>,
    pub pool_name: String,
    pub device_name: String,
    pub cdi_device_ids: Vec<String>,
    /// The allocation's share id, where the device is shared. Absent from checkpoints written
    /// before devices could be shared: those allocations were exclusive.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub share_id: Option<String>,
    /// Whether the allocation has admin access (it keeps no device busy). Absent: it has not.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub admin_access: bool,
}

/// The checkpoint at a path.
#[derive(Clone, Debug)]
pub struct CheckpointFile {
    path: PathBuf,
}

impl CheckpointFile {
    pub fn new(path: impl Into<PathBuf>) -> Self {
        CheckpointFile { path: path.into() }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn err(&self, source: std::io::Error) -> Error {
        Error::Checkpoint { path: self.path.display().to_string(), source }
    }

    /// Read the file; a missing file is an empty checkpoint (first start on this node).
    pub fn load(&self) -> Result<Checkpoint, Error> {
        let bytes = match std::fs::read(&self.path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Checkpoint::default()),
            Err(e) => return Err(self.err(e)),
        };
        let cp: Checkpoint = serde_json::from_slice(&bytes)
            .map_err(|source| Error::InvalidCheckpoint { path: self.path.display().to_string(), source })?;
        if cp.version > CHECKPOINT_VERSION {
            return Err(self.err(std::io::Error::other(format!(
                "version {} is newer than this agent understands ({CHECKPOINT_VERSION})",
                cp.version
            ))));
        }
        Ok(cp)
    }

    /// Replace the file atomically (temporary file, fsync, rename, fsync of the directory).
    pub fn store(&self, cp: &Checkpoint) -> Result<(), Error> {
        let bytes = serde_json::to_vec_pretty(cp).map_err(|e| self.err(std::io::Error::other(e)))?;
        cdi::write_atomic(&self.path, &bytes).map_err(|e| self.err(e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_missing_and_corrupt_files() {
        let dir = std::env::temp_dir().join(format!("sy-checkpoint-{}", std::process::id()));
        let file = CheckpointFile::new(dir.join("sub/checkpoint.json"));
        assert_eq!(file.load().unwrap(), Checkpoint::default(), "missing file: empty");
        let mut cp = Checkpoint::default();
        cp.claims.insert(
            "uid-1".into(),
            PreparedClaim {
                namespace: "ns".into(),
                name: "c".into(),
                devices: vec![PreparedDevice {
                    request_names: vec!["gpu".into()],
                    pool_name: "node-a".into(),
                    device_name: "gpu-0".into(),
                    cdi_device_ids: vec!["d/gpu=uid-1-gpu-0".into()],
                    share_id: Some("9f0e3c1a-0000-4000-8000-000000000001".into()),
                    admin_access: false,
                }],
                spec: cdi::claim_spec("d", "uid-1", &[], &cdi::DeviceNodes::HostLookup),
            },
        );
        file.store(&cp).unwrap();
        assert_eq!(file.load().unwrap(), cp);
        std::fs::write(file.path(), "{not json").unwrap();
        assert!(matches!(file.load(), Err(Error::InvalidCheckpoint { .. })));
        std::fs::write(file.path(), r#"{"version": 9, "claims": {}}"#).unwrap();
        assert!(matches!(file.load(), Err(Error::Checkpoint { .. })));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A checkpoint written before devices could be shared loads unchanged: no share id, no admin
    /// access, and it is written back in the same form.
    #[test]
    fn a_checkpoint_from_before_sharing_loads_unchanged() {
        let old = r#"{
  "version": 1,
  "claims": {
    "uid-1": {
      "namespace": "ns",
      "name": "c",
      "devices": [
        {
          "requestNames": ["gpu"],
          "poolName": "node-a",
          "deviceName": "gpu-0",
          "cdiDeviceIds": ["gpu.switchyard.dev/gpu=uid-1-gpu-0"]
        }
      ],
      "spec": {"cdiVersion": "0.6.0", "kind": "gpu.switchyard.dev/gpu", "devices": []}
    }
  }
}"#;
        let cp: Checkpoint = serde_json::from_str(old).unwrap();
        let d = &cp.claims["uid-1"].devices[0];
        assert_eq!((d.device_name.as_str(), d.share_id.as_deref(), d.admin_access), ("gpu-0", None, false));
        let written = serde_json::to_value(&cp).unwrap();
        let mut want: serde_json::Value = serde_json::from_str(old).unwrap();
        want["claims"]["uid-1"]["spec"]["containerEdits"] = serde_json::json!({});
        assert_eq!(written, want);
    }
}
