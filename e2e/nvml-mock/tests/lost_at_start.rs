//! A GPU already lost when the agent reads the node (it fell off the bus before the agent
//! started, as when a node switches to DRA with a broken GPU): NVML answers `GPU_IS_LOST` for its
//! index. The agent still publishes the node's other GPUs, and that one under its name, tainted
//! lost and never prepared; once NVML reads it whole again, the agent recovers it.
//!
//! A binary of its own: the mock's state is the process's, as NVML's is.

mod common;

use k8s_openapi::jiff::Timestamp;
use switchyard_driver_agent::discovery::Discovery;
use switchyard_driver_agent::discovery::nvml::{Library, NvmlDiscovery};
use switchyard_driver_agent::health::{FaultKind, HealthPolicy, HealthState, lost_transitions};
use switchyard_driver_agent::metrics::Metrics;
use switchyard_driver_agent::plugin::dra::{Allocated, resolve};
use switchyard_driver_agent::slices::build_devices;

const INVENTORY: &str = r#"{
  "gpus": [
    {"uuid": "GPU-5d1e0000-0000-4000-8000-000000000000", "name": "NVIDIA H100 80GB HBM3", "memoryBytes": 85520809984},
    {"uuid": "GPU-5d1e0000-0000-4000-8000-000000000001", "name": "NVIDIA H100 80GB HBM3", "memoryBytes": 85520809984}
  ]
}"#;

#[tokio::test]
async fn a_gpu_lost_before_the_agent_starts_is_published_tainted_and_recovers() {
    let dir = std::env::temp_dir().join(format!("nvml-mock-lost-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let inventory = dir.join("inventory.json");
    std::fs::write(&inventory, INVENTORY).unwrap();
    let faults = dir.join("inventory.json.faults");
    let raise = |line: &str| common::raise(&faults, line);
    // Lost before any process loaded the library.
    raise(r#"{"uuid": "GPU-5d1e0000-0000-4000-8000-000000000001", "kind": "lost"}"#);
    // SAFETY: set before anything reads the environment; this binary runs one test.
    unsafe { std::env::set_var(nvidia_ml_mock::INVENTORY_ENV, &inventory) };

    let discovery =
        NvmlDiscovery::new(Metrics::default(), Library::resolve(Some(&common::mock_library()), None));
    let inv = discovery.discover().await.expect("one lost GPU does not fail the node's discovery");
    let seen: Vec<(u32, bool, &str)> = inv.gpus.iter().map(|g| (g.index, g.lost, g.uuid.as_str())).collect();
    assert_eq!(seen, [(0, false, "GPU-5d1e0000-0000-4000-8000-000000000000"), (1, true, "")]);

    // The agent taints it lost at once, and publishes it by name with its type alone.
    let now = Timestamp::now();
    let events = lost_transitions(None, &inv, now);
    assert_eq!(
        events.iter().map(|e| (e.device.as_str(), e.kind.clone())).collect::<Vec<_>>(),
        [("gpu-1", FaultKind::GpuLost)]
    );
    let policy = HealthPolicy::default();
    let mut health = HealthState::default();
    for e in &events {
        health.apply(&policy, e);
    }
    let devices = build_devices(&inv, &health, "gpu.example.com", &[], 1);
    let lost = devices.iter().find(|d| d.name == "gpu-1").expect("gpu-1 is published");
    let attributes: Vec<&String> = lost.attributes.as_ref().unwrap().keys().collect();
    assert_eq!(attributes, ["type"], "nothing but its type is known");
    let taints: Vec<(&str, &str)> =
        lost.taints.iter().flatten().map(|t| (t.key.as_str(), t.effect.as_str())).collect();
    assert_eq!(taints, [("gpu.example.com/gpu-lost", "NoSchedule")]);
    let whole = devices.iter().find(|d| d.name == "gpu-0").expect("gpu-0 is published");
    assert!(whole.taints.is_none(), "{whole:?}");
    // A claim that tolerates the taint still cannot have it prepared.
    let a = |d: &str| Allocated {
        request_names: vec!["r".into()],
        device: d.into(),
        share_id: None,
        admin_access: false,
    };
    let err = resolve(&inv, &[a("gpu-1")]).map(|_| ()).unwrap_err();
    assert!(err.contains("gpu-1 is lost"), "{err}");
    assert!(resolve(&inv, &[a("gpu-0")]).is_ok());

    // Back on the bus: the next discovery reads it whole, and the agent recovers it.
    raise(r#"{"uuid": "GPU-5d1e0000-0000-4000-8000-000000000001", "kind": "recover"}"#);
    let again = discovery.discover().await.expect("discovery");
    assert!(again.gpus.iter().all(|g| !g.lost && !g.uuid.is_empty()), "{again:?}");
    let events = lost_transitions(Some(&inv), &again, now);
    assert_eq!(
        events.iter().map(|e| (e.device.as_str(), e.kind.clone())).collect::<Vec<_>>(),
        [("gpu-1", FaultKind::Recover)]
    );
    assert!(lost_transitions(Some(&again), &again, now).is_empty(), "nothing more to say");
    std::fs::remove_dir_all(&dir).unwrap();
}
