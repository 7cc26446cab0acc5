//! `make demo` completes: the script runs end to end on the shared e2e cluster (it reuses a
//! running control plane and removes what it created), and its summary reports a full migration.

use std::process::Stdio;

use switchyard_e2e::cluster;

#[tokio::test]
async fn make_demo_completes_on_the_shared_cluster() -> anyhow::Result<()> {
    // Starts (or reuses) the cluster the demo will find at e2e/.cluster/kubeconfig.
    let _ = cluster::client().await?;
    let bin_dir = std::path::Path::new(env!("CARGO_BIN_EXE_gpu-node-sim")).parent().expect("a target dir");
    for needed in ["switchyard", "switchyard-operator", "switchyard-driver-agent"] {
        assert!(
            bin_dir.join(needed).is_file(),
            "{needed} is missing in {}: run `make e2e` (it builds the binaries first)",
            bin_dir.display()
        );
    }
    let out = tokio::process::Command::new("bash")
        .arg(cluster::repo_root().join("e2e/hack/demo.sh"))
        .env("SWITCHYARD_DEMO_BIN_DIR", bin_dir)
        .env("DEMO_KEEP", "0")
        .stdin(Stdio::null())
        .output()
        .await?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "make demo failed ({}):\n{stdout}\n{stderr}", out.status);
    for want in [
        "READY: nothing blocks this migration.",
        "WARNING   ResourceQuota ml/gpus",
        "migration a100-pool Completed: 6/6",
        "nodes moved:            6 of 6",
        "GPUs after:             48 DRA devices in ResourceSlices, 0 through the device plugin",
        "non-GPU pods evicted:   0",
    ] {
        assert!(stdout.contains(want), "the demo output lacks {want:?}:\n{stdout}");
    }
    Ok(())
}
