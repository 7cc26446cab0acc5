//! `--dry-run` through the real binary: the CLI contract, end to end, without an API server.

use std::process::Command;

use k8s_openapi::api::resource::v1::ResourceSlice;
use serde::Deserialize;

fn agent(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_switchyard-driver-agent"))
        .args(args)
        .env_remove("NODE_NAME")
        .output()
        .expect("run the agent binary")
}

fn parse(stdout: &[u8]) -> Vec<ResourceSlice> {
    let text = std::str::from_utf8(stdout).unwrap();
    serde_yaml::Deserializer::from_str(text).map(|d| ResourceSlice::deserialize(d).unwrap()).collect()
}

fn example(name: &str) -> String {
    format!("{}/examples/{name}", env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn dry_run_prints_the_simulated_nodes_slices() {
    let out = agent(&[
        "--dry-run",
        "--inventory",
        "simulated",
        "--sim-config",
        &example("sim-inventory.yaml"),
        "--node-name",
        "gpu-node-1",
    ]);
    assert!(out.status.success(), "stderr: {}", String::from_utf8_lossy(&out.stderr));
    let slices = parse(&out.stdout);
    assert_eq!(slices.len(), 1);
    let s = &slices[0];
    assert_eq!(s.metadata.name.as_deref(), Some("gpu-node-1-gpu-switchyard-dev-0"));
    assert_eq!(s.spec.node_name.as_deref(), Some("gpu-node-1"));
    assert_eq!(s.spec.driver, "gpu.switchyard.dev");
    assert_eq!((s.spec.pool.generation, s.spec.pool.resource_slice_count), (1, 1));
    assert_eq!(s.metadata.owner_references.as_ref().unwrap()[0].uid, "00000000-0000-0000-0000-000000000000");
    let names: Vec<&str> = s.spec.devices.as_ref().unwrap().iter().map(|d| d.name.as_str()).collect();
    assert_eq!(names, (0..8).map(|i| format!("gpu-{i}")).collect::<Vec<_>>());
}

#[test]
fn dry_run_names_mig_devices_and_honours_the_driver_name() {
    let out = agent(&[
        "--dry-run",
        "--inventory",
        "simulated",
        "--sim-config",
        &example("sim-inventory-mig.yaml"),
        "--driver-name",
        "gpu.example.com",
    ]);
    assert!(out.status.success(), "stderr: {}", String::from_utf8_lossy(&out.stderr));
    let s = &parse(&out.stdout)[0];
    assert_eq!(s.metadata.name.as_deref(), Some("dry-run-node-gpu-example-com-0"));
    let names: Vec<&str> = s.spec.devices.as_ref().unwrap().iter().map(|d| d.name.as_str()).collect();
    assert_eq!(
        names,
        ["gpu-0", "gpu-1-mig-3g40gb-0", "gpu-1-mig-2g20gb-0", "gpu-1-mig-1g10gb-0", "gpu-1-mig-1g10gb-1"]
    );
    let ann = s.metadata.annotations.as_ref().unwrap();
    assert_eq!(ann["switchyard.dev/mig-profiles"], r#"{"1g.10gb":2,"2g.20gb":1,"3g.40gb":1}"#);
    assert_eq!(ann["switchyard.dev/gpu-count"], "2");
}

/// `--shares-per-device` reaches the printed slices: every device takes that many claims, as the
/// scheduler's allocator reads it; the default publishes devices one claim holds whole.
#[test]
fn dry_run_honours_shares_per_device() {
    let sim = example("sim-inventory-mig.yaml");
    let args = ["--dry-run", "--inventory", "simulated", "--sim-config", sim.as_str()];
    for (extra, want) in [(None, 1), (Some("--shares-per-device=3"), 3)] {
        let out = agent(&[&args[..], extra.as_slice()].concat());
        assert!(out.status.success(), "stderr: {}", String::from_utf8_lossy(&out.stderr));
        let devices = parse(&out.stdout).remove(0).spec.devices.unwrap();
        let claims: Vec<u64> = devices.iter().map(switchyard_api::sharing::claims_per_device).collect();
        assert_eq!(claims, [want; 5], "{extra:?}");
    }
    let out = agent(&[&args[..], &["--shares-per-device=0"]].concat());
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--shares-per-device must be at least 1"));
}

#[test]
fn dry_run_fails_clearly_on_a_bad_sim_file() {
    let out = agent(&["--dry-run", "--inventory", "simulated", "--sim-config", "/nonexistent/inv.yaml"]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("reading simulated inventory /nonexistent/inv.yaml")
    );
}

#[test]
#[ignore = "needs an NVIDIA driver (libnvidia-ml.so.1 and at least one GPU); run with `cargo test -- --ignored` on a GPU node"]
fn dry_run_on_real_nvml() {
    let out = agent(&["--dry-run", "--inventory", "nvml", "--node-name", "gpu-host"]);
    assert!(out.status.success(), "stderr: {}", String::from_utf8_lossy(&out.stderr));
    let slices = parse(&out.stdout);
    let devices: Vec<_> = slices.iter().flat_map(|s| s.spec.devices.clone().unwrap_or_default()).collect();
    assert!(!devices.is_empty(), "a GPU node publishes at least one device");
    for d in &devices {
        let attrs = d.attributes.as_ref().unwrap();
        let uuid = attrs["uuid"].string.as_deref().unwrap();
        assert!(uuid.starts_with("GPU-") || uuid.starts_with("MIG-"), "{uuid}");
        assert!(attrs["driverVersion"].version.is_some(), "driver version must be valid semver");
        assert!(d.capacity.as_ref().unwrap().contains_key("memory"));
    }
}
