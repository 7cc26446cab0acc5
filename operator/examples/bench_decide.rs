//! `make bench`: the pure part of one reconcile (`reconcile::decide::pool`) on pools of 100, 1,000
//! and 5,000 nodes, to show that its cost per node stays flat as pools grow. No API server: the
//! snapshot is built in memory as the caches would hold it, one node in ten moving (a 10% budget)
//! spread over every forward state, a quarter of the pool already migrated with its ResourceSlice,
//! the rest pending.
//!
//! ```sh
//! cargo run --release -p switchyard-operator --example bench-decide -- --nodes 100,1000,5000
//! ```

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::resource::v1::{DeviceClass, ResourceSlice};
use serde_json::json;
use switchyard_operator::api::v1alpha1::GpuPoolMigration;
use switchyard_operator::pool::device_classes;
use switchyard_operator::pool::placement::Role;
use switchyard_operator::reconcile::{decide, observe};
use switchyard_operator::testing;

const DRIVER: &str = "gpu.switchyard.dev";
const NOW: i64 = 1_000_000;

fn migration() -> GpuPoolMigration {
    serde_json::from_value(json!({
        "apiVersion": "switchyard.dev/v1alpha1", "kind": "GpuPoolMigration",
        "metadata": {"name": "pool", "uid": "uid-1", "generation": 1},
        "spec": {
            "nodeSelector": {"matchLabels": {"pool": "a100"}},
            "resources": [{"extendedResourceName": "nvidia.com/gpu", "deviceClassName": "gpu.switchyard.dev",
                           "selector": "device.attributes['gpu.switchyard.dev'].type == 'gpu'"}],
            "driver": {"name": DRIVER, "daemonSet": {"namespace": "switchyard", "name": "driver"}},
            "devicePlugin": {"daemonSet": {"namespace": "gpu", "name": "plugin"}},
            "strategy": {"maxUnavailable": "10%"}
        }
    }))
    .expect("a valid migration")
}

fn slice(node: &str) -> ResourceSlice {
    let devices: Vec<_> = (0..4)
        .map(|i| {
            json!({"name": format!("gpu-{i}"), "attributes": {"type": {"string": "gpu"}, "uuid": {"string": format!("GPU-{node}-{i}")}},
                   "capacity": {"memory": {"value": "80Gi"}}})
        })
        .collect();
    serde_json::from_value(json!({
        "metadata": {"name": format!("{node}-gpu")},
        "spec": {"driver": DRIVER, "nodeName": node, "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                 "devices": devices}
    }))
    .expect("a valid slice")
}

/// The pool: per node its name and state (None: pending), slices for the nodes on DRA.
fn pool(
    n: usize,
) -> (Vec<switchyard_operator::node::slim::SlimNode>, HashMap<String, Vec<Arc<ResourceSlice>>>) {
    let moving = ["Draining", "Switching", "Switching", "Draining"];
    let mut nodes = Vec::with_capacity(n);
    let mut slices = HashMap::new();
    for i in 0..n {
        let name = format!("gpu-{i:05}");
        let (state, dra) = match i % 10 {
            0 => (Some(moving[(i / 10) % moving.len()]), (i / 10) % moving.len() == 1),
            1..=3 => (Some("Migrated"), true),
            _ => (None, false),
        };
        let mut extra = json!({"metadata": {"labels": {"pool": "a100"}}});
        if let Some(s) = state {
            extra["metadata"]["labels"]["switchyard.dev/migration"] = json!("pool");
            extra["metadata"]["annotations"] = json!({"switchyard.dev/migration-state": s,
                "switchyard.dev/state-since": "1970-01-12T13:46:00Z", "switchyard.dev/gpus-before": "{\"nvidia.com/gpu\":4}"});
            extra["spec"] = json!({"unschedulable": s != "Migrated"});
        }
        if dra {
            extra["metadata"]["labels"]["switchyard.dev/gpu-backend"] = json!("dra");
            extra["status"] =
                json!({"allocatable": {"nvidia.com/gpu": "0"}, "capacity": {"nvidia.com/gpu": "0"}});
            slices.insert(name.clone(), vec![Arc::new(slice(&name))]);
        }
        nodes.push(testing::gpu_node(&name, &extra));
    }
    (nodes, slices)
}

fn main() {
    let sizes: Vec<usize> = std::env::args()
        .skip_while(|a| a != "--nodes")
        .nth(1)
        .unwrap_or_else(|| "100,1000,5000".into())
        .split(',')
        .map(|s| s.parse().expect("--nodes takes a comma-separated list of sizes"))
        .collect();
    let gpm = migration();
    let mut classes: Vec<DeviceClass> = device_classes::desired_all_synced(&gpm.spec, "pool", "uid-1", &[]);
    for c in &mut classes {
        c.metadata.creation_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            k8s_openapi::jiff::Timestamp::from_second(1).unwrap(),
        ));
    }
    println!("| nodes | moving | decide, median | per node | steps decided |");
    println!("| --- | --- | --- | --- | --- |");
    for n in sizes {
        let (nodes, slices) = pool(n);
        let snapshot = observe::Snapshot {
            facts: testing::server_v1_37(),
            driver_ds: Some(testing::placed_daemon_set("switchyard", "driver", Role::Driver)),
            plugin_ds: Some(testing::placed_daemon_set("gpu", "plugin", Role::DevicePlugin)),
            device_classes: Some(classes.clone()),
            slices,
            ..testing::snapshot(&gpm, nodes, NOW)
        };
        // Enough runs for a stable median, fewer for the large pools.
        let runs = (200_000 / n).clamp(5, 200);
        let mut times: Vec<Duration> = Vec::with_capacity(runs);
        let mut steps = 0;
        for _ in 0..runs {
            let t = Instant::now();
            let d = decide::pool(&snapshot).expect("a decision");
            times.push(t.elapsed());
            steps = d.steps.len();
        }
        times.sort();
        let median = times[times.len() / 2];
        println!(
            "| {n} | {} | {:.2} ms | {:.1} µs | {steps} |",
            n / 10,
            median.as_secs_f64() * 1e3,
            median.as_secs_f64() * 1e6 / n as f64
        );
    }
}
