//! A pool of real nodes moves from NVIDIA's device plugin (k8s-device-plugin v0.19.3), placed as
//! the NVIDIA GPU Operator places it, to NVIDIA's DRA driver for GPUs (`sigs.k8s.io/dra-driver-nvidia-gpu` v0.5.0, its `gpu-kubelet-plugin`) and
//! back, with Switchyard's packaged operator (config/ without Switchyard's own driver agent,
//! `config/components/without-agent`). Both of NVIDIA's components are built from their modules
//! and run unchanged; NVIDIA's DRA driver is installed from its own Helm chart, rendered by
//! `e2e/hack/render-nvidia-dra.sh` with the values a cluster moving off the device plugin sets.
//! Only the GPUs are fake: the NVML mock in each node's driver root, its device nodes, and the
//! driver root's `nvidia-smi` (the mock's NVML client), which the chart's init container runs.
//!
//! What it shows, through the real kubelet, DRA manager, containerd and runc:
//! - the chart refuses to enable GPUs unless told the device plugin is kept off its nodes
//!   (`gpuResourcesEnabledOverride`), and its kubelet plugin runs on no node before Switchyard
//!   switches one (its `nodeSelector` is Switchyard's `gpu-backend=dra` label);
//! - each node switches in sequence, `device-plugin → none → dra`, because NVIDIA's driver has no
//!   device-plugin interlock; the sampler sees no instant where a node was served by both;
//! - `placement: GpuOperator`: the device plugin's DaemonSet is the GPU Operator's (managed by it,
//!   selecting `nvidia.com/gpu.deploy.device-plugin=true`); Switchyard edits no DaemonSet and moves
//!   the plugin off each node with that label (`false`), and the rollback puts it back (`true`);
//! - after: the plain `nvidia.com/gpu` pods run with claims the scheduler generated, allocated
//!   from NVIDIA's slices (driver `gpu.nvidia.com`, one pool per node named after it, the mock's
//!   UUIDs), and each container got the device node of its allocated GPU from NVIDIA's CDI spec;
//! - the assumptions Switchyard makes about a third-party driver hold for NVIDIA's: its pool names,
//!   the attributes its selector reads, its DaemonSet's placement;
//! - the chart's own DeviceClass (`gpu.nvidia.com`, with `extendedResourceName: nvidia.com/gpu`)
//!   re-created as a Helm re-install does becomes newer than Switchyard's and takes the extended
//!   resource: the migration says so (`DeviceClassesReady=False`, `Shadowed`, naming the class and
//!   what to change), and recovers once the admin does what the message says;
//! - a rollback (`direction: Rollback`) returns every node to NVIDIA's device plugin: the claim
//!   holders are evicted while NVIDIA's kubelet plugin still runs, the plugin's GPUs come back as
//!   allocatable, and the trainers run again without claims;
//! - the trainers stand behind a PDB of `minAvailable` one less than their count, and are Ready
//!   only while their container sees a GPU device node (a readiness probe): forward and back, the
//!   drains and the rollback's evictions never leave fewer Ready, at any watch event.
//!
//! And, from the same set-up, `strategy.type: Replace` onto NVIDIA's driver with a pod that asks
//! for 2 GPUs: it waits, unevicted, until one target node has both its GPUs free, and then runs
//! there through one generated claim holding both (`replace_scenario`).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceSlice};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};
use serde_json::json;
use switchyard_e2e::pool::{Sampler, Samples, allocatable};
use switchyard_e2e::real::{
    self, LABEL_DEPLOY_DEVICE_PLUGIN, LABEL_GPU_PRESENT, NVIDIA_DRA_KUBELET_PLUGIN, NVIDIA_DRA_NS,
};
use switchyard_e2e::{cluster, wait};
use switchyard_operator::api::v1alpha1::{GpuPoolMigration, Phase};

/// NVIDIA's DRA driver, and the DeviceClass its chart creates under the same name.
const DRIVER: &str = "gpu.nvidia.com";
/// Switchyard's DeviceClass for `nvidia.com/gpu` on NVIDIA's driver.
const CLASS: &str = "gpu.nvidia.switchyard.dev";
const GPU: &str = "nvidia.com/gpu";
const APP: &str = "trainer";
use switchyard_operator::well_known::ANNOTATION_DEVICE_PLUGIN_DEPLOY_BEFORE;
use switchyard_operator::well_known::LABEL_GPU_BACKEND as BACKEND;

#[tokio::test]
async fn real_pool_moves_to_nvidias_dra_driver_and_back_with_the_packaged_operator() -> anyhow::Result<()> {
    real::alone_on_real_nodes("nvdra", scenario, diagnostics, cleanup).await
}

#[tokio::test]
async fn a_two_gpu_pod_replaces_onto_nvidias_dra_driver_only_once_one_target_node_has_both_gpus_free()
-> anyhow::Result<()> {
    real::alone_on_real_nodes("nvrepl", replace_scenario, diagnostics, cleanup).await
}

/// What both scenarios start from: the nodes labelled into the pool `id` with the GPU Operator's
/// labels, NVIDIA's device plugin placed as the GPU Operator places it and serving every GPU,
/// Switchyard without its agent, NVIDIA's DRA driver (its kubelet plugin on no node yet), and the
/// namespace `id` for the workloads.
async fn set_up(client: &Client, id: &str, names: &[String]) -> anyhow::Result<()> {
    for n in names {
        real::label(
            client,
            n,
            json!({"pool": id, LABEL_GPU_PRESENT: "true", LABEL_DEPLOY_DEVICE_PLUGIN: "true"}),
        )
        .await?;
    }
    real::install_device_plugin_as_gpu_operator()?;
    real::install_switchyard_from(client, real::SWITCHYARD_WITHOUT_AGENT_OVERLAY).await?;
    real::install_nvidia_dra()?;
    let gpus_per_node = real::node_gpus().len() as i64;
    real::wait_allocatable(client, names, GPU, gpus_per_node, Duration::from_secs(120)).await?;
    cluster::create_namespace(client, id).await
}

/// The sampler of the pool `id` on NVIDIA's driver: every watch event of its nodes, slices, pods
/// and claims.
fn sample(client: &Client, id: &str) -> Sampler {
    Sampler::watch_driver(
        client.clone(),
        id.to_owned(),
        DRIVER.to_owned(),
        NVIDIA_DRA_KUBELET_PLUGIN.to_owned(),
        id.to_owned(),
        GPU.to_owned(),
    )
}

/// Stops `sampler` and asserts what held at every event it saw: no node served by both backends,
/// no claim outliving NVIDIA's kubelet plugin on its node.
fn stop_safe(sampler: Sampler) -> Samples {
    let samples = sampler.stop();
    assert!(samples.events > 0, "the sampler saw the migrations");
    assert!(samples.overlaps.is_empty(), "a node was served by both backends: {:?}", samples.overlaps);
    assert!(
        samples.orphaned_claim_holders.is_empty(),
        "claims outlived NVIDIA's kubelet plugin: {:?}",
        samples.orphaned_claim_holders
    );
    samples
}

fn pool_migration(id: &str) -> anyhow::Result<GpuPoolMigration> {
    let driver_ds = (NVIDIA_DRA_NS, NVIDIA_DRA_KUBELET_PLUGIN);
    Ok(serde_json::from_value(real::pool_migration(id, DRIVER, CLASS, driver_ds, "GpuOperator"))?)
}

fn status(g: &GpuPoolMigration) -> switchyard_operator::api::v1alpha1::GpuPoolMigrationStatus {
    g.status.clone().unwrap_or_default()
}

/// The DeviceClassesReady condition of a migration: (status, reason, message).
fn classes_ready(g: &GpuPoolMigration) -> Option<(String, String, String)> {
    status(g)
        .conditions
        .into_iter()
        .find(|c| c.type_ == "DeviceClassesReady")
        .map(|c| (c.status, c.reason, c.message))
}

/// The pods of NVIDIA's GPU kubelet plugin, by node.
async fn kubelet_plugin_pods(client: &Client) -> anyhow::Result<BTreeMap<String, Pod>> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), NVIDIA_DRA_NS);
    Ok(pods
        .list(&ListParams::default().labels("dra-driver-nvidia-gpu-component=kubelet-plugin"))
        .await?
        .items
        .into_iter()
        .filter_map(|p| Some((p.spec.as_ref()?.node_name.clone()?, p)))
        .collect())
}

async fn scenario(client: &Client, id: &str, names: &[String]) -> anyhow::Result<()> {
    let gpus_per_node = real::node_gpus().len() as i64;
    let inventory = real::node_gpus();

    // The chart will not enable GPUs beside the device plugin unless told that something keeps
    // the two apart: Switchyard's placement is that something.
    let refused = real::render_nvidia_dra(&["--set", "gpuResourcesEnabledOverride=false"])?;
    let why = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "the chart renders GPUs without gpuResourcesEnabledOverride");
    assert!(why.contains("cannot be deployed alongside the standard GPU device plugin"), "{why}");

    set_up(client, id, names).await?;
    let node_api: Api<Node> = Api::all(client.clone());
    // Switchyard's agent is not installed, and NVIDIA's kubelet plugin waits for `dra` nodes.
    let daemon_sets: Api<DaemonSet> = Api::all(client.clone());
    let plugin_ds: Api<DaemonSet> = Api::namespaced(client.clone(), "kube-system");
    let plugin_generation = plugin_ds.get("nvidia-device-plugin-daemonset").await?.metadata.generation;
    let agents = daemon_sets
        .list(&ListParams::default().labels("app.kubernetes.io/name=switchyard-driver-agent"))
        .await?;
    assert!(agents.items.is_empty(), "Switchyard's agent must not run beside NVIDIA's driver");
    assert!(kubelet_plugin_pods(client).await?.is_empty(), "NVIDIA's kubelet plugin runs before any switch");

    // The trainers behind a PDB of minAvailable one less than their count: the drains and the
    // rollback's evictions go through the eviction API one pod at a time, and the sampler holds
    // the Ready count to it at every watch event.
    real::gpu_workload(client, id, APP, names.len() as i32, None).await?;
    let min_available = names.len() - 1;
    let pdb: PodDisruptionBudget = serde_json::from_value(json!({
        "metadata": {"name": APP},
        "spec": {"minAvailable": min_available, "selector": {"matchLabels": {"app": APP}}},
    }))?;
    Api::<PodDisruptionBudget>::namespaced(client.clone(), id).create(&PostParams::default(), &pdb).await?;
    let before = real::wait_workload(client, id, APP, names.len(), Duration::from_secs(120)).await?;
    for p in &before {
        assert!(
            p.status.as_ref().and_then(|s| s.extended_resource_claim_status.as_ref()).is_none(),
            "{}: a device-plugin pod has no generated claim",
            p.name_any()
        );
    }

    let sampler = sample(client, id);
    let migrations: Api<GpuPoolMigration> = Api::all(client.clone());
    migrations.create(&PostParams::default(), &pool_migration(id)?).await?;
    let done =
        wait::until("the migration to NVIDIA's DRA driver to complete", Duration::from_secs(480), || {
            let migrations = migrations.clone();
            async move {
                let g = migrations.get(id).await?;
                let s = status(&g);
                anyhow::ensure!(s.phase != Some(Phase::Failed), "migration failed: {:?}", s);
                Ok((s.phase == Some(Phase::Completed)).then_some(g))
            }
        })
        .await?;
    assert_eq!(status(&done).nodes.migrated, names.len() as i32);
    for n in names {
        let node = node_api.get(n).await?;
        assert_eq!(node.labels().get(BACKEND).map(String::as_str), Some("dra"), "{n}");
        assert_eq!(
            node.labels().get(LABEL_DEPLOY_DEVICE_PLUGIN).map(String::as_str),
            Some("false"),
            "{n}: the GPU Operator's label takes its device plugin off the node"
        );
        assert_ne!(node.spec.as_ref().and_then(|s| s.unschedulable), Some(true), "{n} is left cordoned");
        assert_eq!(allocatable(&node, GPU), 0, "{n}: NVIDIA's device plugin left");
    }
    let plugins = kubelet_plugin_pods(client).await?;
    assert_eq!(
        plugins.keys().cloned().collect::<BTreeSet<_>>(),
        names.iter().cloned().collect(),
        "NVIDIA's kubelet plugin runs on every switched node"
    );

    // NVIDIA's slices: one pool per node, named after it (what Switchyard's per-node checks key
    // on), with the mock's GPUs and the attribute the class selector reads.
    let slices: Api<ResourceSlice> = Api::all(client.clone());
    let published = slices.list(&ListParams::default().fields(&format!("spec.driver={DRIVER}"))).await?.items;
    // Per node, device name → UUID.
    let mut devices: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
    for s in &published {
        let node = s.spec.node_name.clone().unwrap_or_default();
        assert_eq!(s.spec.pool.name, node, "{}: NVIDIA's pool is named after its node", s.name_any());
        for d in s.spec.devices.as_deref().unwrap_or_default() {
            let attr = |k: &str| d.attributes.as_ref().and_then(|a| a.get(k)).and_then(|v| v.string.clone());
            assert_eq!(attr("type").as_deref(), Some("gpu"), "{}: {d:?}", s.name_any());
            let uuid = attr("uuid").unwrap_or_default();
            let gpu = inventory.iter().find(|g| g.uuid == uuid);
            assert!(gpu.is_some(), "{node}/{}: {uuid:?} is not a GPU of the mock", d.name);
            assert_eq!(attr("productName"), gpu.map(|g| g.name.clone()), "{node}/{}", d.name);
            devices.entry(node.clone()).or_default().insert(d.name.clone(), uuid);
        }
    }
    for n in names {
        assert_eq!(
            devices.get(n).map(|d| d.values().cloned().collect::<BTreeSet<_>>()),
            Some(real::gpu_uuids()),
            "{n}: NVIDIA's driver publishes each GPU of the mock once"
        );
    }

    // The trainers run through NVIDIA's driver: a generated claim, allocated from their node's
    // pool, and the device node of that GPU (the mock's minor for its UUID) from NVIDIA's CDI spec.
    let after = real::wait_workload(client, id, APP, names.len(), Duration::from_secs(180)).await?;
    let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), id);
    for p in &after {
        let name = p.name_any();
        let node = p.spec.as_ref().and_then(|s| s.node_name.clone()).unwrap_or_default();
        let claim_name = p
            .status
            .as_ref()
            .and_then(|s| s.extended_resource_claim_status.as_ref())
            .map(|s| s.resource_claim_name.clone())
            .unwrap_or_else(|| panic!("{name}: no generated claim for the plain nvidia.com/gpu limit"));
        let results = real::allocated(&claims.get(&claim_name).await?);
        assert_eq!(results.len(), 1, "{name}: one device");
        let (driver, pool, device) = &results[0];
        assert_eq!(driver, DRIVER, "{name}");
        assert_eq!(pool, &node, "{name}: the device comes from its own node's pool");
        let uuid = devices.get(&node).and_then(|d| d.get(device)).cloned().unwrap_or_default();
        let minor = inventory.iter().position(|g| g.uuid == uuid).expect("an inventory GPU");
        let logs = real::logs(id, &name)?;
        let (_, gpus) = real::what_the_container_saw(&logs);
        assert_eq!(gpus.len(), 1, "{name}: one GPU device node from NVIDIA's CDI spec\n{logs}");
        assert!(
            gpus[0].ends_with(&format!("/dev/nvidia{minor}"))
                && gpus[0].contains(&format!("195, {minor:>3}")),
            "{name}: {uuid} ({device}) is /dev/nvidia{minor}, char 195:{minor}; the container has {:?}",
            gpus[0]
        );
    }

    // The chart's DeviceClass re-created, as a Helm re-install or a GitOps re-sync that deletes
    // it does: now the newest class with `extendedResourceName: nvidia.com/gpu`, it wins.
    let classes: Api<DeviceClass> = Api::all(client.clone());
    let chart_class = classes.get(DRIVER).await?;
    assert_eq!(
        chart_class.spec.as_ref().and_then(|s| s.extended_resource_name.as_deref()),
        Some(GPU),
        "the chart's class carries the extended resource"
    );
    classes.delete(DRIVER, &DeleteParams::default()).await?;
    wait::until("the chart's class to be gone", Duration::from_secs(30), || {
        let classes = classes.clone();
        async move { Ok(classes.get_opt(DRIVER).await?.is_none().then_some(())) }
    })
    .await?;
    // One second apart at least: creation times have second resolution.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let mut again = chart_class.clone();
    again.metadata = kube::api::ObjectMeta {
        name: Some(DRIVER.to_owned()),
        labels: chart_class.metadata.labels.clone(),
        annotations: chart_class.metadata.annotations.clone(),
        ..Default::default()
    };
    classes.create(&PostParams::default(), &again).await?;
    let (_, reason, message) =
        wait::until("the migration to see its class shadowed", Duration::from_secs(60), || {
            let migrations = migrations.clone();
            async move {
                Ok(classes_ready(&migrations.get(id).await?)
                    .filter(|(s, r, _)| s == "False" && r == "Shadowed"))
            }
        })
        .await?;
    assert!(
        message.contains(&format!("DeviceClass {DRIVER} also carries extendedResourceName {GPU}"))
            && message.contains(&format!("remove extendedResourceName from {DRIVER}")),
        "{reason}: {message}"
    );
    // What the message says to do.
    real::kubectl(&[
        "patch",
        "deviceclass",
        DRIVER,
        "--type=json",
        "-p",
        r#"[{"op":"remove","path":"/spec/extendedResourceName"}]"#,
    ])?;
    wait::until("the migration's class to be effective again", Duration::from_secs(60), || {
        let migrations = migrations.clone();
        async move { Ok(classes_ready(&migrations.get(id).await?).filter(|(s, _, _)| s == "True")) }
    })
    .await?;

    // Rollback: every node back to NVIDIA's device plugin.
    migrations
        .patch(id, &PatchParams::default(), &Patch::Merge(json!({"spec": {"direction": "Rollback"}})))
        .await?;
    wait::until("the rollback to NVIDIA's device plugin to finish", Duration::from_secs(480), || {
        let migrations = migrations.clone();
        async move {
            let s = status(&migrations.get(id).await?);
            anyhow::ensure!(s.phase != Some(Phase::Failed), "rollback failed: {:?}", s);
            // NVIDIA's slices outlive its kubelet plugin for about 30 s, untainted, while the
            // device plugin is back; Switchyard's DeviceTaintRule fences them, so no overlap.
            let overlap = s.conditions.iter().find(|c| c.type_ == "BackendOverlap" && c.status == "True");
            anyhow::ensure!(overlap.is_none(), "the rollback reported an overlap: {overlap:?}");
            Ok((s.phase == Some(Phase::RolledBack)).then_some(()))
        }
    })
    .await?;
    real::wait_allocatable(client, names, GPU, gpus_per_node, Duration::from_secs(120)).await?;
    for n in names {
        let node = node_api.get(n).await?;
        assert_eq!(node.labels().get(BACKEND).map(String::as_str), Some("device-plugin"), "{n}");
        assert_eq!(
            node.labels().get(LABEL_DEPLOY_DEVICE_PLUGIN).map(String::as_str),
            Some("true"),
            "{n}: the rollback puts the GPU Operator's label back as it was"
        );
        assert!(
            !node.annotations().contains_key(ANNOTATION_DEVICE_PLUGIN_DEPLOY_BEFORE),
            "{n}: the record of the label goes once the node is back"
        );
        assert_ne!(node.spec.as_ref().and_then(|s| s.unschedulable), Some(true), "{n} is left cordoned");
    }
    wait::until("NVIDIA's kubelet plugin to leave every node", Duration::from_secs(120), || async move {
        Ok(kubelet_plugin_pods(client).await?.is_empty().then_some(()))
    })
    .await?;
    let back = real::wait_workload(client, id, APP, names.len(), Duration::from_secs(180)).await?;
    for p in &back {
        let name = p.name_any();
        let (visible, gpus) = real::what_the_container_saw(&real::logs(id, &name)?);
        assert!(real::gpu_uuids().contains(&visible), "{name}: the device plugin's Allocate set {visible:?}");
        assert_eq!(gpus.len(), 1, "{name}: one GPU device node from the plugin");
        assert!(
            p.status.as_ref().and_then(|s| s.extended_resource_claim_status.as_ref()).is_none(),
            "{name}: a pod back on the device plugin has no generated claim"
        );
    }

    assert_eq!(
        plugin_ds.get("nvidia-device-plugin-daemonset").await?.metadata.generation,
        plugin_generation,
        "under placement: GpuOperator Switchyard edits no DaemonSet of the GPU Operator's"
    );

    let samples = stop_safe(sampler);
    let fewest = samples.min_ready.get(APP).copied();
    assert!(
        fewest.is_some_and(|f| f >= min_available),
        "Ready trainers fell below the PDB's minAvailable {min_available}: the fewest seen {fewest:?}"
    );
    for n in names {
        let history = samples.backend_history.get(n).cloned().unwrap_or_default();
        assert_eq!(
            history,
            ["device-plugin", "none", "dra", "device-plugin"],
            "{n}: a driver without the interlock switches through none, and comes straight back"
        );
    }
    Ok(())
}

/// `strategy.type: Replace` onto NVIDIA's driver, where a pod needs both GPUs of one node. Two
/// nodes move to NVIDIA's driver first (the target pool), and a one-GPU pod pinned to each leaves
/// one GPU free on both: two free GPUs in the target pool, none of its nodes with two. The third
/// node, still on NVIDIA's device plugin, runs a pod asking for 2 GPUs, and is replaced:
/// - it waits cordoned with `TargetCapacityShort` naming the pod and the most free on one target
///   node, and the pod is not evicted (the same pod, not terminating, throughout 5 s);
/// - once one target node's pinned pod goes, the pod is evicted and runs there through a claim the
///   scheduler generated, holding both GPUs of that node from NVIDIA's slices, and its container
///   sees two GPU device nodes from NVIDIA's CDI spec;
/// - the replaced node is left cordoned and labelled, on the device plugin, the other target
///   node's pod untouched, and no node served by both backends at any watch event.
async fn replace_scenario(client: &Client, id: &str, names: &[String]) -> anyhow::Result<()> {
    let [t0, t1, old] = names else { anyhow::bail!("want 3 real nodes, found {names:?}") };
    let gpus_per_node = real::node_gpus().len();
    assert_eq!(gpus_per_node, 2, "the scenario fills a 2-GPU node");
    set_up(client, id, names).await?;
    let sampler = sample(client, id);
    let migrations: Api<GpuPoolMigration> = Api::all(client.clone());
    let node_api: Api<Node> = Api::all(client.clone());
    let completed = |name: String, what: &'static str| {
        let migrations = migrations.clone();
        async move {
            wait::until(what, Duration::from_secs(300), || {
                let (migrations, name) = (migrations.clone(), name.clone());
                async move {
                    let s = status(&migrations.get(&name).await?);
                    anyhow::ensure!(s.phase != Some(Phase::Failed), "{name} failed: {s:?}");
                    Ok((s.phase == Some(Phase::Completed)).then_some(s))
                }
            })
            .await
        }
    };

    // The target pool: two nodes moved to NVIDIA's driver by a migration of their own.
    let target = format!("{id}-target");
    let mut gpm = serde_json::to_value(pool_migration(id)?)?;
    gpm["metadata"] = json!({"name": target});
    gpm["spec"]["nodeSelector"] = json!({
        "matchLabels": {"pool": id},
        "matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": [t0, t1]}],
    });
    migrations.create(&PostParams::default(), &serde_json::from_value(gpm.clone())?).await?;
    completed(target.clone(), "the target pool's move to NVIDIA's DRA driver").await?;

    // One GPU taken on each target node, through NVIDIA's driver.
    for (i, n) in [t0, t1].into_iter().enumerate() {
        real::gpu_workload(client, id, &format!("filler-{i}"), 1, Some(n)).await?;
    }
    let fillers = [
        real::wait_workload(client, id, "filler-0", 1, Duration::from_secs(180)).await?.remove(0),
        real::wait_workload(client, id, "filler-1", 1, Duration::from_secs(180)).await?.remove(0),
    ];
    // The 2-GPU pod: only the device plugin's node has two free.
    real::gpu_workload_asking(client, id, "big", 1, None, GPU, 2).await?;
    let big = real::wait_workload(client, id, "big", 1, Duration::from_secs(120)).await?.remove(0);
    assert_eq!(big.spec.as_ref().and_then(|s| s.node_name.as_deref()), Some(old.as_str()));
    let big_name = big.name_any();
    let big_uid = big.uid().unwrap_or_default();

    let replace = format!("{id}-replace");
    gpm["metadata"] = json!({"name": replace});
    gpm["spec"]["nodeSelector"] = json!({"matchLabels": {"pool": id, "kubernetes.io/hostname": old}});
    gpm["spec"]["strategy"] = json!({
        "type": "Replace",
        "replace": {"targetNodeSelector": {"matchLabels": {"pool": id, BACKEND: "dra"}}},
        "drain": {"gracePeriodSeconds": 5, "timeoutSeconds": 180},
    });
    migrations.create(&PostParams::default(), &serde_json::from_value(gpm)?).await?;
    waits_unevicted(client, id, &replace, old, &big_name, &big_uid).await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), id);

    // Both GPUs of one target node free up: the pod moves there, and the old node is replaced.
    real::kubectl(&["-n", id, "delete", "deployment", "filler-0", "--wait=true", "--timeout=120s"])?;
    let done = completed(replace.clone(), "the Replace migration to complete").await?;
    assert_eq!(done.replace.as_ref().map(|r| r.replaced_nodes.clone()), Some(vec![old.clone()]));
    let n = node_api.get(old).await?;
    assert_eq!(
        n.spec.as_ref().and_then(|s| s.unschedulable),
        Some(true),
        "{old} is left cordoned for removal"
    );
    assert_eq!(n.labels().get(switchyard_operator::well_known::LABEL_REPLACED), Some(&replace));
    // Replace switches nothing: the node was never labelled for a backend, and NVIDIA's device
    // plugin still serves it (the GPU Operator's label as it was, both GPUs allocatable).
    assert_eq!(n.labels().get(BACKEND), None, "{old}");
    assert_eq!(n.labels().get(LABEL_DEPLOY_DEVICE_PLUGIN).map(String::as_str), Some("true"), "{old}");
    assert_eq!(allocatable(&n, GPU), gpus_per_node as i64, "{old}: NVIDIA's device plugin still serves it");

    runs_on_both_gpus_of(client, id, t0, &big_uid).await?;
    let filler = pods.list(&ListParams::default().labels("app=filler-1")).await?.items;
    assert_eq!(
        filler.iter().map(|p| p.uid()).collect::<Vec<_>>(),
        vec![fillers[1].uid()],
        "the other target node's pod is untouched"
    );

    stop_safe(sampler);
    Ok(())
}

/// The Replace scenario's old node while no target node has 2 GPUs free: it waits cordoned with
/// `TargetCapacityShort` naming its 2-GPU pod and the most free on one target node (1), and that
/// pod (`big_name`, `big_uid`) is not evicted: the same pod, not terminating, throughout 5 s.
async fn waits_unevicted(
    client: &Client,
    id: &str,
    replace: &str,
    old: &str,
    big_name: &str,
    big_uid: &str,
) -> anyhow::Result<()> {
    let migrations: Api<GpuPoolMigration> = Api::all(client.clone());
    let node_api: Api<Node> = Api::all(client.clone());
    let short = format!("needs 2 {GPU} (the most free on one target node: 1, on ");
    let waiting = wait::until(
        "the old node to wait for a target node with 2 free GPUs",
        Duration::from_secs(120),
        || {
            let migrations = migrations.clone();
            let (replace, short, big_name) = (replace.to_owned(), short.clone(), big_name.to_owned());
            async move {
                let s = status(&migrations.get(&replace).await?);
                anyhow::ensure!(s.phase != Some(Phase::Failed), "{replace} failed: {s:?}");
                anyhow::ensure!(
                    s.phase != Some(Phase::Completed),
                    "{replace} completed: the 2-GPU pod had no room: {s:?}"
                );
                Ok(s.in_progress
                    .into_iter()
                    .find(|p| p.name == *old && p.message.starts_with("TargetCapacityShort:"))
                    .filter(|p| {
                        p.message.contains(&format!("{id}/{big_name}")) && p.message.contains(&short)
                    }))
            }
        },
    )
    .await?;
    assert!(waiting.message.contains(" on one node"), "{}", waiting.message);
    assert_eq!(
        node_api.get(old).await?.spec.and_then(|s| s.unschedulable),
        Some(true),
        "{old} waits cordoned"
    );
    let pods: Api<Pod> = Api::namespaced(client.clone(), id);
    wait::holds_for("the 2-GPU pod to stay on its node", Duration::from_secs(5), || async {
        let still = pods.get_opt(big_name).await?;
        anyhow::ensure!(
            still.is_some_and(
                |p| p.uid().as_deref() == Some(big_uid) && p.metadata.deletion_timestamp.is_none()
            ),
            "the 2-GPU pod was evicted with no target node that has 2 GPUs free"
        );
        Ok(())
    })
    .await?;
    Ok(())
}

/// The 2-GPU pod of the Replace scenario after its move: a new pod (not `old_uid`) on `node`,
/// through one generated claim holding two devices of NVIDIA's driver from that node's pool, its
/// container seeing two GPU device nodes from NVIDIA's CDI spec.
async fn runs_on_both_gpus_of(client: &Client, id: &str, node: &str, old_uid: &str) -> anyhow::Result<()> {
    let moved = real::wait_workload(client, id, "big", 1, Duration::from_secs(180)).await?.remove(0);
    let name = moved.name_any();
    assert_ne!(moved.uid().unwrap_or_default(), old_uid, "{name} is a new pod");
    assert_eq!(moved.spec.as_ref().and_then(|s| s.node_name.as_deref()), Some(node), "{name}");
    let claim = moved
        .status
        .as_ref()
        .and_then(|s| s.extended_resource_claim_status.as_ref())
        .map(|s| s.resource_claim_name.clone())
        .unwrap_or_else(|| panic!("{name}: no generated claim for its 2 nvidia.com/gpu"));
    let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), id);
    let results = real::allocated(&claims.get(&claim).await?);
    let held: BTreeSet<&str> = results.iter().map(|(_, _, d)| d.as_str()).collect();
    assert!(
        results.len() == 2 && held.len() == 2 && results.iter().all(|(d, p, _)| d == DRIVER && p == node),
        "{name}: both GPUs of {node} from NVIDIA's driver: {results:?}"
    );
    let logs = real::logs(id, &name)?;
    let (_, seen) = real::what_the_container_saw(&logs);
    let seen: BTreeSet<String> = seen.iter().filter_map(|l| real::device_node(l)).collect();
    assert_eq!(seen.len(), 2, "{name}: two GPU device nodes from NVIDIA's CDI spec\n{logs}");
    Ok(())
}

fn diagnostics(id: &str) -> String {
    real::diagnostics(
        id,
        &[&[
            "-n",
            NVIDIA_DRA_NS,
            "logs",
            "-l",
            "dra-driver-nvidia-gpu-component=kubelet-plugin",
            "-c",
            "gpus",
            "--tail=30",
            "--prefix",
        ]],
    )
}

async fn cleanup(client: &Client, id: &str, names: &[String]) -> anyhow::Result<()> {
    for name in [id.to_owned(), format!("{id}-target"), format!("{id}-replace")] {
        real::delete_migration(client, &name).await?;
    }
    // The workload goes before the driver: a DRA plugin must outlive the pods whose claims it
    // prepared, or they hang in Terminating.
    real::delete_namespace(client, id).await?;
    real::uninstall_nvidia_dra()?;
    real::uninstall_switchyard_from(real::SWITCHYARD_WITHOUT_AGENT_OVERLAY)?;
    real::uninstall_device_plugin()?;
    let classes: Api<DeviceClass> = Api::all(client.clone());
    let _ = classes.delete(CLASS, &DeleteParams::default()).await;
    // A node left on NVIDIA's driver keeps the record of the GPU Operator's label through the
    // migration's deletion, for a later rollback (docs/migration.md, "Deletion"): the scenario
    // is done with the nodes, so it goes too.
    let nodes: Api<Node> = Api::all(client.clone());
    let forget = json!({"metadata": {"annotations": {ANNOTATION_DEVICE_PLUGIN_DEPLOY_BEFORE: null}}});
    for n in names {
        nodes.patch(n, &PatchParams::default(), &Patch::Merge(&forget)).await?;
    }
    real::release_nodes(
        client,
        names,
        &[
            "pool",
            LABEL_GPU_PRESENT,
            LABEL_DEPLOY_DEVICE_PLUGIN,
            BACKEND,
            switchyard_operator::well_known::LABEL_REPLACED,
        ],
    )
    .await
}
