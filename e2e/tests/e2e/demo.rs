//! `make demo` completes: the script runs end to end on the shared e2e cluster (it reuses the
//! running control plane and its real nodes, and removes what it created), and its summary reports
//! a full migration of the three real nodes, with NVIDIA's device plugin's log, and the trainer's
//! logs showing its GPU from that plugin before and from our CDI spec, through a generated claim,
//! after.

use std::process::Stdio;

use std::time::Duration;

use switchyard_e2e::cluster;
use switchyard_e2e::locks;

/// The demo on a running cluster with everything built: about 2 minutes (docs/benchmarks.md);
/// its own waits are bounded too, so this only stops a demo that hangs past them all.
const DEMO: Duration = Duration::from_secs(600);

#[tokio::test]
async fn make_demo_completes_on_the_shared_cluster() -> anyhow::Result<()> {
    // The packaged operator manages every GpuPoolMigration of the cluster, so no other
    // scenario may run beside it.
    let _cluster = locks::cluster_alone().await?;
    // Starts (or reuses) the cluster the demo will find at e2e/.cluster/kubeconfig.
    let _ = cluster::client().await?;
    let bin_dir = std::path::Path::new(env!("CARGO_BIN_EXE_gpu-node-sim")).parent().expect("a target dir");
    assert!(
        bin_dir.join("switchyard").is_file(),
        "switchyard is missing in {}: run `make e2e` (it builds the binaries first)",
        bin_dir.display()
    );
    let demo = tokio::process::Command::new("bash")
        .arg(cluster::repo_root().join("e2e/hack/demo.sh"))
        .env("SWITCHYARD_DEMO_BIN_DIR", bin_dir)
        .env("DEMO_KEEP", "0")
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(DEMO, demo).await.map_err(|_| {
        anyhow::anyhow!(
            "make demo did not finish within {DEMO:?} (it was stopped); its own waits are bounded"
        )
    })??;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "make demo failed ({}):\n{stdout}\n{stderr}", out.status);
    for want in [
        "READY: nothing blocks this migration.",
        "WARNING   ResourceQuota ml/gpus",
        "migration a100-pool Completed: 3/3",
        "nodes moved:            3 of 3 real nodes in ",
        "s, 3 on DRA (set-up before it: ",
        "GPU pods evicted:       3 (each came back with a generated ResourceClaim: 3 of 3)",
        "GPUs before:            6 through the device plugin",
        "GPUs after:             6 DRA devices in ResourceSlices, 0 through the device plugin",
        "non-GPU pods evicted:   0",
        // NVIDIA's device plugin's own log, found the mock's GPUs through NVML and registered.
        "Registered device plugin for 'nvidia.com/gpu' with Kubelet",
    ] {
        assert!(stdout.contains(want), "the demo output lacks {want:?}:\n{stdout}");
    }
    // The trainer's own logs, before and after: the same GPU UUIDs of the inventory, first with no
    // claim (device plugin), then with a generated one (DRA, CDI).
    let claims: Vec<&str> =
        stdout.lines().filter_map(|l| l.trim().strip_prefix("generated claim: ")).collect();
    assert_eq!(claims.len(), 2, "the demo shows the trainer's claim before and after:\n{stdout}");
    assert_eq!(claims[0], "(none)", "before the move the pod has no claim");
    assert!(
        claims[1].contains("-extended-resources-"),
        "after the move the scheduler generated one: {}",
        claims[1]
    );
    let visible =
        stdout.lines().filter(|l| l.trim().starts_with("workload: NVIDIA_VISIBLE_DEVICES=GPU-")).count();
    assert_eq!(visible, 2, "the trainer's logs show a GPU UUID before and after:\n{stdout}");
    Ok(())
}
