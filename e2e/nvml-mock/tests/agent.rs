//! The driver agent's NVML path, the production default, against the mock: the agent loads the
//! mock as it loads NVIDIA's library (by path, through nvml-wrapper), discovers the inventory the
//! file describes, and turns the faults a test raises into health events.
//!
//! One process, one test: the mock's state is the process's, as NVML's is.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use switchyard_driver_agent::discovery::nvml::{Library, NvmlDiscovery};
use switchyard_driver_agent::discovery::{Discovery, EventSource};
use switchyard_driver_agent::health::FaultKind;
use switchyard_driver_agent::metrics::Metrics;

mod common;
use common::mock_library;

const INVENTORY: &str = r#"{
  "driverVersion": "580.95.05",
  "cudaDriverVersion": 13000,
  "gpus": [
    {"uuid": "GPU-0c4e6f41-6a2c-4b39-9a62-000000000000", "name": "NVIDIA H100 80GB HBM3",
     "memoryBytes": 85520809984, "pciBusId": "0000:18:00.0", "numaNode": 0},
    {"uuid": "GPU-0c4e6f41-6a2c-4b39-9a62-000000000001", "name": "NVIDIA H100 80GB HBM3",
     "memoryBytes": 85520809984, "pciBusId": "0000:2a:00.0", "minor": 3,
     "migEnabled": true, "mig": [
       {"uuid": "MIG-8f1d2c3b-0000-4000-8000-000000000001", "profile": "1g.10gb", "memoryBytes": 10200547328,
        "gpuInstanceId": 9, "multiprocessors": 16, "gpuInstanceSlices": 1},
       {"uuid": "MIG-8f1d2c3b-0000-4000-8000-000000000002", "profile": "3g.40gb", "memoryBytes": 42580574208,
        "gpuInstanceId": 2, "multiprocessors": 60, "gpuInstanceSlices": 3}
     ]}
  ]
}"#;

#[tokio::test]
async fn the_agent_discovers_the_mocks_gpus_and_turns_its_faults_into_health_events() {
    let dir = std::env::temp_dir().join(format!("nvml-mock-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();

    // A driver root laid out as a real one, the library where the agent looks for it: with no
    // inventory beside it, nvmlInit fails as on a host without a driver, and the agent reports no
    // driver (a state it retries) instead of failing; with one, it reads that node's GPUs.
    let root = dir.join("driver-root");
    let lib_dir = root.join("usr/lib/x86_64-linux-gnu");
    std::fs::create_dir_all(&lib_dir).unwrap();
    std::fs::copy(mock_library(), lib_dir.join("libnvidia-ml.so.1")).unwrap();
    let from_root = NvmlDiscovery::new(Metrics::default(), Library::resolve(None, Some(&root)));
    match from_root.discover().await {
        Err(switchyard_driver_agent::Error::NoDriver(e)) => {
            assert!(matches!(e, nvml_wrapper::error::NvmlError::DriverNotLoaded), "{e:?}")
        }
        other => panic!("no inventory: want NoDriver, got {other:?}"),
    }
    std::fs::write(lib_dir.join("nvml-mock.json"), INVENTORY).unwrap();
    let inv = from_root.discover().await.expect("the inventory beside the library");
    assert_eq!(inv.gpus.len(), 2);

    let inventory = dir.join("inventory.json");
    std::fs::write(&inventory, INVENTORY).unwrap();
    // SAFETY: set once the driver-root part is done; this binary runs one test, and nothing else
    // reads the environment now.
    unsafe { std::env::set_var(nvidia_ml_mock::INVENTORY_ENV, &inventory) };

    let discovery = NvmlDiscovery::new(Metrics::default(), Library::resolve(Some(&mock_library()), None));
    let inv = discovery.discover().await.expect("the agent's discovery reads the mock");
    assert_eq!((inv.driver_version.as_str(), inv.cuda_driver_version.as_str()), ("580.95.05", "13.0"));
    assert_eq!(inv.gpus.len(), 2);
    let (whole, split) = (&inv.gpus[0], &inv.gpus[1]);
    assert_eq!(
        (whole.index, whole.minor, whole.uuid.as_str(), whole.product_name.as_str()),
        (0, 0, "GPU-0c4e6f41-6a2c-4b39-9a62-000000000000", "NVIDIA H100 80GB HBM3")
    );
    assert_eq!(whole.memory_bytes, 85_520_809_984);
    assert_eq!(whole.pci_bus_id.as_deref(), Some("0000:18:00.0"));
    assert_eq!(whole.numa_node, Some(0));
    assert_eq!(whole.cuda_compute_capability.as_deref(), Some("9.0"));
    assert_eq!(whole.architecture.as_deref(), Some("Hopper"));
    assert_eq!(whole.mig_enabled, Some(false));
    assert!(whole.mig.is_empty());
    assert_eq!((split.minor, split.mig_enabled), (3, Some(true)));
    let migs: Vec<(&str, &str, u64, u32, u32, u32)> = split
        .mig
        .iter()
        .map(|m| (m.uuid.as_str(), m.profile.as_str(), m.memory_bytes, m.multiprocessors, m.gi, m.ci))
        .collect();
    assert_eq!(
        migs,
        [
            ("MIG-8f1d2c3b-0000-4000-8000-000000000001", "1g.10gb", 10_200_547_328, 16, 9, 0),
            ("MIG-8f1d2c3b-0000-4000-8000-000000000002", "3g.40gb", 42_580_574_208, 60, 2, 0),
        ]
    );

    // Faults, as a test raises them: each reaches the agent's health channel.
    let (tx, mut rx) = tokio::sync::mpsc::channel(16);
    let stop = Arc::new(AtomicBool::new(false));
    discovery.start_events(&inv, tx, stop.clone());
    let faults = dir.join("inventory.json.faults");
    let raise = |line: &str| common::raise(&faults, line);
    let mut next = async || {
        tokio::time::timeout(Duration::from_secs(30), rx.recv())
            .await
            .expect("a health event in time")
            .expect("open")
    };
    raise(r#"{"uuid": "GPU-0c4e6f41-6a2c-4b39-9a62-000000000000", "kind": "xid", "xid": 79}"#);
    let e = next().await;
    assert_eq!((e.device.as_str(), e.kind), ("gpu-0", FaultKind::Xid { xid: 79 }));
    raise(r#"{"uuid": "GPU-0c4e6f41-6a2c-4b39-9a62-000000000001", "kind": "ecc-dbe"}"#);
    let e = next().await;
    assert_eq!((e.device.as_str(), e.kind), ("gpu-1", FaultKind::EccDbe));
    raise(r#"{"uuid": "GPU-0c4e6f41-6a2c-4b39-9a62-000000000000", "kind": "lost"}"#);
    let e = next().await;
    assert_eq!((e.device.as_str(), e.kind), ("gpu-0", FaultKind::GpuLost));
    raise(r#"{"uuid": "GPU-0c4e6f41-6a2c-4b39-9a62-000000000000", "kind": "recover"}"#);
    raise(r#"{"uuid": "GPU-0c4e6f41-6a2c-4b39-9a62-000000000001", "kind": "recover"}"#);
    let mut recovered: Vec<String> = vec![next().await, next().await]
        .into_iter()
        .map(|e| {
            assert_eq!(e.kind, FaultKind::Recover, "{e:?}");
            e.device
        })
        .collect();
    recovered.sort();
    assert_eq!(recovered, ["gpu-0", "gpu-1"]);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let _ = std::fs::remove_dir_all(&dir);
}
