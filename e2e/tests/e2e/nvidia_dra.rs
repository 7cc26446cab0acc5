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
//! - a second migration over the same nodes, created once the first has started a node, moves
//!   nothing and never reads Completed; the first finishes what it started, starts nothing else
//!   until the second is deleted, and says so; one created after the first completed is refused
//!   every node, and the first stays Completed;
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
//! - the runbook's last step: once every node moved, the GPU Operator's device-plugin DaemonSet
//!   runs on no node, `DevicePluginRemovable` says it may go and that NVIDIA's chart keeps
//!   `gpuResourcesEnabledOverride=true`, which the chart still requires without a device plugin;
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
//!
//! And the DRA half of a MIG migration (`mig_scenario`): a node moved with its GPUs whole under a
//! migration that also maps `nvidia.com/mig-1g.10gb`, one GPU then repartitioned as the GPU
//! Operator's MIG manager does, NVIDIA's driver publishing its MIG devices from the mock's H100
//! profiles and placements, and pods asking for `nvidia.com/mig-1g.10gb: 1` running on them
//! through the migration's class. The device-plugin half of a MIG migration runs on the simulator
//! (docs/e2e.md, "Real nodes", says why).
//!
//! And nodes relabelled out of the pool mid-step (`relabel_scenario`): one while Switching, one
//! while rolling back, each let go on exactly one backend, schedulable. And an XID that NVIDIA's
//! device plugin took a GPU out for before the switch (`xid_scenario`): counted, reported, and
//! stopping nothing.

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
use switchyard_operator::well_known::{ANNOTATION_MIGRATION_STATE, LABEL_MIGRATION};

/// A MIG profile's extended resource, the migration's class for it on NVIDIA's driver, and that
/// class's selector (config/samples/gpupoolmigration-nvidia-dra.yaml's).
const MIG: &str = "nvidia.com/mig-1g.10gb";
const MIG_CLASS: &str = "mig-1g.10gb.nvidia.switchyard.dev";
const MIG_SELECTOR: &str = "device.attributes['gpu.nvidia.com'].type == 'mig' && device.attributes['gpu.nvidia.com'].profile == '1g.10gb'";

#[tokio::test]
async fn real_pool_moves_to_nvidias_dra_driver_and_back_with_the_packaged_operator() -> anyhow::Result<()> {
    real::alone_on_real_nodes("nvdra", scenario, diagnostics, cleanup).await
}

#[tokio::test]
async fn a_two_gpu_pod_replaces_onto_nvidias_dra_driver_only_once_one_target_node_has_both_gpus_free()
-> anyhow::Result<()> {
    real::alone_on_real_nodes("nvrepl", replace_scenario, diagnostics, cleanup).await
}

#[tokio::test]
async fn a_mig_pod_runs_on_nvidias_dra_driver_through_the_migrations_mig_class() -> anyhow::Result<()> {
    real::alone_on_real_nodes("nvmig", mig_scenario, diagnostics, cleanup).await
}

#[tokio::test]
async fn a_node_relabelled_out_of_the_pool_mid_switch_and_another_mid_rollback_each_end_on_one_backend()
-> anyhow::Result<()> {
    real::alone_on_real_nodes("nvleft", relabel_scenario, diagnostics, cleanup).await
}

#[tokio::test]
async fn an_xid_under_nvidias_device_plugin_before_the_switch_is_counted_reported_and_stops_nothing()
-> anyhow::Result<()> {
    real::alone_on_real_nodes("nvxid", xid_scenario, diagnostics, cleanup).await
}

/// What every scenario starts from: the nodes labelled into the pool `id` with the GPU Operator's
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
    // The migration's class must be created in a later second than the chart's own (the
    // scheduler takes the newest class for a name, and creation times have second resolution):
    // one created in the same second reads as shadowed, as it would for a user.
    let classes: Api<DeviceClass> = Api::all(client.clone());
    let chart_class = classes.get(DRIVER).await?.metadata.creation_timestamp;
    let created =
        chart_class.map(|t| t.0).ok_or_else(|| anyhow::anyhow!("the chart's class has no creation time"))?;
    wait::until("a second after the chart's class was created", Duration::from_secs(5), || async move {
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_secs() as i64;
        Ok((now > created.as_second()).then_some(()))
    })
    .await?;
    cluster::create_namespace(client, id).await
}

/// The sampler of the pool `id` on NVIDIA's driver: every watch event of its nodes, slices, pods
/// and claims, and the GPUs inside the workload's containers.
fn sample(client: &Client, id: &str) -> Sampler {
    Sampler::watch_containers(
        client.clone(),
        id.to_owned(),
        DRIVER.to_owned(),
        NVIDIA_DRA_KUBELET_PLUGIN.to_owned(),
        id.to_owned(),
        GPU.to_owned(),
    )
}

/// Stops `sampler` and asserts what held at every event it saw: no node served by both backends,
/// no GPU inside two running containers (of which it read some, where the scenario runs a
/// `workload`), no claim outliving NVIDIA's kubelet plugin on its node.
fn stop_safe(sampler: Sampler, workload: bool) -> Samples {
    let samples = sampler.stop();
    assert!(samples.events > 0, "the sampler saw the migrations");
    assert!(samples.overlaps.is_empty(), "a node was served by both backends: {:?}", samples.overlaps);
    real::assert_gpus_held_once(&samples, workload);
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

/// Waits until GpuPoolMigration `name` reads Completed (`what` names the wait), failing at once if
/// it reads Failed; returns it.
async fn completes(
    client: &Client,
    name: &str,
    what: &str,
    timeout: Duration,
) -> anyhow::Result<GpuPoolMigration> {
    let migrations: Api<GpuPoolMigration> = Api::all(client.clone());
    wait::until(what, timeout, || {
        let migrations = migrations.clone();
        async move {
            let g = migrations.get(name).await?;
            let s = status(&g);
            anyhow::ensure!(s.phase != Some(Phase::Failed), "{name} failed: {s:?}");
            Ok((s.phase == Some(Phase::Completed)).then_some(g))
        }
    })
    .await
}

fn status(g: &GpuPoolMigration) -> switchyard_operator::api::v1alpha1::GpuPoolMigrationStatus {
    g.status.clone().unwrap_or_default()
}

/// The DeviceClassesReady condition of a migration: (status, reason, message).
fn classes_ready(g: &GpuPoolMigration) -> Option<(String, String, String)> {
    condition(g, "DeviceClassesReady")
}

/// The runbook's last step where NVIDIA's driver is the target: with every node moved, the GPU
/// Operator's device-plugin DaemonSet runs on no node, and the migration says it may go and that
/// NVIDIA's chart keeps `gpuResourcesEnabledOverride=true`; the chart, rendered without it now,
/// still refuses GPUs, as the message says.
async fn chart_override_kept(client: &Client, id: &str) -> anyhow::Result<()> {
    let migrations: Api<GpuPoolMigration> = Api::all(client.clone());
    let (_, _, message) = wait::until("the device plugin to read removable", Duration::from_secs(60), || {
        let migrations = migrations.clone();
        async move {
            Ok(condition(&migrations.get(id).await?, "DevicePluginRemovable")
                .filter(|(s, r, _)| s == "True" && r == "DevicePluginUnused"))
        }
    })
    .await?;
    assert!(
        message.contains("DaemonSet kube-system/nvidia-device-plugin-daemonset runs on no node")
            && message
                .contains("keep gpuResourcesEnabledOverride=true in NVIDIA's DRA driver chart's values"),
        "{message}"
    );
    let dropped = real::render_nvidia_dra(&["--set", "gpuResourcesEnabledOverride=false"])?;
    let why = String::from_utf8_lossy(&dropped.stderr);
    assert!(!dropped.status.success(), "the chart renders GPUs without its override once the plugin is gone");
    assert!(why.contains("cannot be deployed alongside the standard GPU device plugin"), "{why}");
    let kept = real::render_nvidia_dra(&[])?;
    assert!(kept.status.success(), "{}", String::from_utf8_lossy(&kept.stderr));
    Ok(())
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
    overlapped_while_it_runs(client, id, names).await?;
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
    overlapped_once_completed(client, id, names).await?;
    chart_override_kept(client, id).await?;
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

    let samples = stop_safe(sampler, true);
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

/// A condition of a migration: (status, reason, message).
fn condition(g: &GpuPoolMigration, type_: &str) -> Option<(String, String, String)> {
    status(g).conditions.into_iter().find(|c| c.type_ == type_).map(|c| (c.status, c.reason, c.message))
}

/// The nodes of `names` that GpuPoolMigration `id` owns (`switchyard.dev/migration`).
async fn owned_by(client: &Client, id: &str, names: &[String]) -> anyhow::Result<BTreeSet<String>> {
    let nodes: Api<Node> = Api::all(client.clone());
    let mut owned = BTreeSet::new();
    for n in names {
        if nodes.get(n).await?.labels().get(LABEL_MIGRATION).map(String::as_str) == Some(id) {
            owned.insert(n.clone());
        }
    }
    Ok(owned)
}

/// A second migration over the same nodes, created once the first (`id`) has started a node:
/// - the second owns nothing and moves nothing: every node refused (`NodeConflict` naming `id`),
///   `Stalled`/`NodesRefused`, never Completed;
/// - `id` finishes the nodes it had started (Migrated, on NVIDIA's driver, uncordoned: none is left
///   half-switched) and starts no other: those are refused by both, untouched (no state, not
///   cordoned, NVIDIA's device plugin still serving them), and `id` reads `NodesRefused`, not
///   Completed, with its counts saying so;
/// - the second deleted, `id` goes on.
async fn overlapped_while_it_runs(client: &Client, id: &str, names: &[String]) -> anyhow::Result<()> {
    let migrations: Api<GpuPoolMigration> = Api::all(client.clone());
    let node_api: Api<Node> = Api::all(client.clone());
    wait::until("the first node to start", Duration::from_secs(60), || async {
        Ok((!owned_by(client, id, names).await?.is_empty()).then_some(()))
    })
    .await?;
    let second = format!("{id}-overlap");
    let mut gpm = serde_json::to_value(pool_migration(id)?)?;
    gpm["metadata"] = json!({"name": second});
    migrations.create(&PostParams::default(), &serde_json::from_value(gpm)?).await?;
    let mine = wait::until("the first migration to see the conflict", Duration::from_secs(60), || {
        let migrations = migrations.clone();
        async move {
            let g = migrations.get(id).await?;
            Ok(condition(&g, "NodeConflict").filter(|(s, _, _)| s == "True").map(|_| g))
        }
    })
    .await?;
    let (_, _, message) = condition(&mine, "NodeConflict").unwrap_or_default();
    assert!(message.contains(&second), "{id}: the conflict names {second}: {message}");
    // From here on the first moves only what it owns.
    let owned = owned_by(client, id, names).await?;
    let refused: Vec<&String> = names.iter().filter(|n| !owned.contains(*n)).collect();
    assert!(!refused.is_empty(), "the first migration owned every node before the second came: {owned:?}");
    let stalled = |name: String| {
        let migrations = migrations.clone();
        async move {
            let g = migrations.get(&name).await?;
            let s = status(&g);
            anyhow::ensure!(
                s.phase != Some(Phase::Completed),
                "{name} reads Completed under a conflict: {s:?}"
            );
            Ok(condition(&g, "Stalled").filter(|(s, r, _)| s == "True" && r == "NodesRefused").map(|_| s))
        }
    };
    let theirs =
        wait::until("the second migration to stall on refused nodes", Duration::from_secs(60), || {
            stalled(second.clone())
        })
        .await?;
    assert_eq!(
        (theirs.nodes.total, theirs.nodes.refused, theirs.nodes.migrated),
        (0, names.len() as i32, 0),
        "{second} owns and moves nothing: {:?}",
        theirs.nodes
    );
    let mine = wait::until("the first migration to finish what it started", Duration::from_secs(180), || {
        stalled(id.to_owned())
    })
    .await?;
    assert_eq!(
        (mine.nodes.migrated, mine.nodes.refused),
        (owned.len() as i32, refused.len() as i32),
        "{id}: {:?}",
        mine.nodes
    );
    assert_eq!(owned_by(client, id, names).await?, owned, "{id} took a refused node");
    for n in &owned {
        let node = node_api.get(n).await?;
        assert_eq!(
            node.annotations().get(ANNOTATION_MIGRATION_STATE).map(String::as_str),
            Some("Migrated"),
            "{n}"
        );
        assert_eq!(node.labels().get(BACKEND).map(String::as_str), Some("dra"), "{n}");
        assert_ne!(node.spec.as_ref().and_then(|s| s.unschedulable), Some(true), "{n} is left cordoned");
    }
    for n in &refused {
        let node = node_api.get(n).await?;
        assert_eq!(node.annotations().get(ANNOTATION_MIGRATION_STATE), None, "{n} was touched");
        assert_ne!(node.spec.as_ref().and_then(|s| s.unschedulable), Some(true), "{n} was cordoned");
        assert_eq!(
            allocatable(&node, GPU),
            real::node_gpus().len() as i64,
            "{n}: the device plugin serves it"
        );
    }
    real::delete_migration(client, &second).await?;
    wait::until("the first migration to go on", Duration::from_secs(60), || {
        let migrations = migrations.clone();
        async move {
            let g = migrations.get(id).await?;
            let conflict = condition(&g, "NodeConflict").is_some_and(|(s, _, _)| s == "True");
            Ok((!conflict && status(&g).phase != Some(Phase::Failed)).then_some(()))
        }
    })
    .await
}

/// A second migration over the same nodes, created after the first (`id`) completed: it refuses
/// every node (each belongs to `id`), stalls and moves nothing, and `id` still reads Completed with
/// every node migrated. Then it is deleted.
async fn overlapped_once_completed(client: &Client, id: &str, names: &[String]) -> anyhow::Result<()> {
    let migrations: Api<GpuPoolMigration> = Api::all(client.clone());
    let late = format!("{id}-late");
    let mut gpm = serde_json::to_value(pool_migration(id)?)?;
    gpm["metadata"] = json!({"name": late});
    migrations.create(&PostParams::default(), &serde_json::from_value(gpm)?).await?;
    let g = wait::until("the late migration to stall on refused nodes", Duration::from_secs(60), || {
        let migrations = migrations.clone();
        let late = late.clone();
        async move {
            let g = migrations.get(&late).await?;
            anyhow::ensure!(
                status(&g).phase != Some(Phase::Completed),
                "{late} reads Completed: {:?}",
                status(&g)
            );
            Ok(condition(&g, "Stalled").filter(|(s, r, _)| s == "True" && r == "NodesRefused").map(|_| g))
        }
    })
    .await?;
    let s = status(&g);
    assert_eq!(
        (s.nodes.total, s.nodes.refused, s.nodes.migrated),
        (0, names.len() as i32, 0),
        "{late}: {:?}",
        s.nodes
    );
    let (_, _, message) = condition(&g, "NodeConflict").unwrap_or_default();
    // Each node named with the migration that has it (it owns them, and selects them still).
    for n in names {
        let line = message.lines().find(|l| l.starts_with(&format!("node {n} ")));
        assert!(line.is_some_and(|l| l.ends_with(&format!("GpuPoolMigration {id}"))), "{late}: {message}");
    }
    let first = status(&migrations.get(id).await?);
    assert_eq!(first.phase, Some(Phase::Completed), "{id}: {first:?}");
    assert_eq!(
        (first.nodes.migrated, first.nodes.refused),
        (names.len() as i32, 0),
        "{id}: {:?}",
        first.nodes
    );
    real::delete_migration(client, &late).await
}

/// The Switchyard state of `node` (`switchyard.dev/migration-state`), if any.
async fn state_of(client: &Client, node: &str) -> anyhow::Result<Option<String>> {
    let nodes: Api<Node> = Api::all(client.clone());
    Ok(nodes.get(node).await?.annotations().get(ANNOTATION_MIGRATION_STATE).cloned())
}

/// The label the relabel scenario's migration selects its nodes by; the sampler keeps watching them
/// by `pool` after they lose it.
const MEMBER: &str = "e2e.switchyard.dev/member";

/// Waits until `node` is in `state`, then takes it out of its migration's pool (its [`MEMBER`]
/// label removed), as an admin fixing a label does mid-move. Fails at once if the node reaches one
/// of `past` (a state after `state`) first.
async fn relabel_out_when(client: &Client, node: &str, state: &str, past: &[&str]) -> anyhow::Result<()> {
    wait::until(&format!("{node} to be {state}"), Duration::from_secs(180), || async {
        let now = state_of(client, node).await?;
        anyhow::ensure!(
            !now.as_deref().is_some_and(|s| past.contains(&s)),
            "{node} went past {state} before it was seen there: {now:?}"
        );
        Ok((now.as_deref() == Some(state)).then_some(()))
    })
    .await?;
    real::label(client, node, json!({MEMBER: null})).await
}

/// Waits until `node`, relabelled out of the pool, is let go: no Switchyard state left on it,
/// schedulable, and served by `backend` alone (`dra`: NVIDIA's slices for it and no device-plugin
/// GPU; `device-plugin`: its GPUs allocatable again and NVIDIA's kubelet plugin gone from it); and
/// a `NodeLeftPool` Warning event names it.
async fn let_go_on(client: &Client, node: &str, backend: &str) -> anyhow::Result<()> {
    let nodes: Api<Node> = Api::all(client.clone());
    let slices: Api<ResourceSlice> = Api::all(client.clone());
    let gpus = real::node_gpus().len() as i64;
    let fields = format!("spec.driver={DRIVER},spec.nodeName={node}");
    wait::until(&format!("{node} to be let go on {backend}"), Duration::from_secs(180), || {
        let (nodes, slices, fields) = (nodes.clone(), slices.clone(), fields.clone());
        async move {
            let n = nodes.get(node).await?;
            let held = n.annotations().contains_key(ANNOTATION_MIGRATION_STATE)
                || n.labels().contains_key(LABEL_MIGRATION);
            let cordoned = n.spec.as_ref().and_then(|s| s.unschedulable) == Some(true);
            let published = !slices.list(&ListParams::default().fields(&fields)).await?.items.is_empty();
            let plugin = kubelet_plugin_pods(client).await?.contains_key(node);
            let served = match backend {
                "dra" => published && plugin && allocatable(&n, GPU) == 0,
                _ => allocatable(&n, GPU) == gpus && !plugin,
            };
            let labelled = n.labels().get(BACKEND).map(String::as_str) == Some(backend);
            Ok((!held && !cordoned && served && labelled).then_some(()))
        }
    })
    .await?;
    // The event is published after the node's patch lands: looked for until it is there.
    wait::until(&format!("a NodeLeftPool Warning event naming {node}"), Duration::from_secs(30), || async {
        let events =
            real::kubectl(&["get", "events", "-A", "--field-selector", "reason=NodeLeftPool", "-o", "json"])?;
        let events: serde_json::Value = serde_json::from_str(&events)?;
        let named = events["items"].as_array().into_iter().flatten().any(|e| {
            e["type"] == "Warning"
                && e["message"].as_str().is_some_and(|m| m.contains(&format!("node {node} ")))
        });
        Ok(named.then_some(()))
    })
    .await?;
    Ok(())
}

/// Two nodes on NVIDIA's device plugin move to NVIDIA's driver one at a time, and each leaves the
/// pool mid-step (the label its selector reads removed, as an admin fixing a label does; the
/// sampler still watches them):
/// - the first while Switching: it finishes its switch and is let go on NVIDIA's driver alone
///   (NVIDIA's slices and kubelet plugin on it, no device-plugin GPU), uncordoned, no Switchyard
///   state left, with a `NodeLeftPool` event; the other moves and the migration completes with it
///   alone;
/// - the other while rolling back to the device plugin: it finishes the rollback and is let go on
///   the device plugin alone (its GPUs allocatable, NVIDIA's kubelet plugin gone), uncordoned, with
///   a `NodeLeftPool` event; the first, no member any more, stays on NVIDIA's driver;
/// - no node served by both backends at any watch event.
async fn relabel_scenario(client: &Client, id: &str, names: &[String]) -> anyhow::Result<()> {
    let pool = names.get(..2).ok_or_else(|| anyhow::anyhow!("want 2 real nodes, found {names:?}"))?;
    set_up(client, id, pool).await?;
    for n in pool {
        real::label(client, n, json!({MEMBER: id})).await?;
    }
    let sampler = sample(client, id);
    let migrations: Api<GpuPoolMigration> = Api::all(client.clone());
    let mut gpm = serde_json::to_value(pool_migration(id)?)?;
    gpm["spec"]["nodeSelector"] = json!({"matchLabels": {MEMBER: id}});
    migrations.create(&PostParams::default(), &serde_json::from_value(gpm)?).await?;
    let leaver = wait::until("a node to start", Duration::from_secs(60), || async {
        let owned = owned_by(client, id, pool).await?;
        Ok((owned.len() == 1).then(|| owned.into_iter().next()).flatten())
    })
    .await?;
    let stayer = pool.iter().find(|n| **n != leaver).cloned().unwrap_or_default();
    relabel_out_when(client, &leaver, "Switching", &["Verifying", "Migrated"]).await?;
    let_go_on(client, &leaver, "dra").await?;
    let done = status(
        &completes(client, id, "the migration to complete with the other node", Duration::from_secs(240))
            .await?,
    );
    assert_eq!((done.nodes.total, done.nodes.migrated), (1, 1), "{:?}", done.nodes);

    migrations
        .patch(id, &PatchParams::default(), &Patch::Merge(json!({"spec": {"direction": "Rollback"}})))
        .await?;
    relabel_out_when(client, &stayer, "RollingBack", &["RolledBack"]).await?;
    let_go_on(client, &stayer, "device-plugin").await?;
    let nodes: Api<Node> = Api::all(client.clone());
    let first = nodes.get(&leaver).await?;
    assert_eq!(
        first.labels().get(BACKEND).map(String::as_str),
        Some("dra"),
        "{leaver}: no member, not rolled back"
    );
    stop_safe(sampler, false);
    Ok(())
}

/// An XID 79 on GPU 0 of a node on NVIDIA's device plugin, raised through the mock before its
/// move: NVIDIA's plugin marks that GPU unhealthy (`internal/rm/health.go`), so the node
/// advertises 1 of its 2 GPUs, and one of two trainers runs while the other waits Pending. Then
/// the node moves to NVIDIA's driver:
/// - Switchyard counts both GPUs (`gpus-before` is the capacity, 2), waits for nothing more, and
///   reports the GPU the plugin held back: a `DevicePluginUnhealthyGpus` Warning event naming
///   "1 of its 2 nvidia.com/gpu", since NVIDIA's driver, started after the XID's event, publishes
///   both GPUs as healthy;
/// - the migration completes, and both trainers run through generated claims on the node's two
///   GPUs, the one that waited included: what the event warns of;
/// - no node served by both backends at any watch event.
async fn xid_scenario(client: &Client, id: &str, names: &[String]) -> anyhow::Result<()> {
    let node = names.first().ok_or_else(|| anyhow::anyhow!("no real node"))?.clone();
    let pool = std::slice::from_ref(&node);
    set_up(client, id, pool).await?;
    let gpus = real::node_gpus();
    real::raise_gpu_fault(&node, &gpus[0].uuid, "xid", 79)?;
    let node_api: Api<Node> = Api::all(client.clone());
    let held = wait::until("NVIDIA's device plugin to hold the GPU back", Duration::from_secs(60), || {
        let node_api = node_api.clone();
        let node = node.clone();
        async move { Ok(Some(node_api.get(&node).await?).filter(|n| allocatable(n, GPU) == 1)) }
    })
    .await?;
    let capacity = held.status.as_ref().and_then(|s| s.capacity.as_ref()).and_then(|c| c.get(GPU)).cloned();
    assert_eq!(
        capacity.map(|q| q.0),
        Some("2".to_owned()),
        "{node}: the kubelet keeps the unhealthy GPU's capacity"
    );
    real::gpu_workload(client, id, APP, 2, Some(&node)).await?;
    real::wait_workload(client, id, APP, 1, Duration::from_secs(120)).await?;
    // The plan says it before anything moves, as the switch's event will.
    let (_, report) = real::plan_manifest(id, &pool_migration(id)?)?;
    let planned =
        report["nodes"].as_array().into_iter().flatten().find(|n| n["name"] == node.as_str()).cloned();
    let note = planned.as_ref().and_then(|n| n["note"].as_str()).unwrap_or_default();
    assert!(
        note.starts_with("the device plugin holds back 1 of its 2 nvidia.com/gpu as unhealthy"),
        "{planned:?}"
    );

    let sampler = sample(client, id);
    let migrations: Api<GpuPoolMigration> = Api::all(client.clone());
    migrations.create(&PostParams::default(), &pool_migration(id)?).await?;
    let done = status(
        &completes(client, id, "the node's move to NVIDIA's DRA driver", Duration::from_secs(300)).await?,
    );
    assert_eq!(done.nodes.migrated, 1, "{:?}", done.nodes);
    let events = real::kubectl(&[
        "get",
        "events",
        "-A",
        "--field-selector",
        "reason=DevicePluginUnhealthyGpus",
        "-o",
        "json",
    ])?;
    let events: serde_json::Value = serde_json::from_str(&events)?;
    // This migration's, on the migration or on the node: an earlier scenario's migration may have
    // warned of the same node.
    let notes: Vec<&str> = events["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|e| e["type"] == "Warning")
        .filter(|e| e["involvedObject"]["name"] == id || e["related"]["name"] == id)
        .filter_map(|e| e["message"].as_str())
        .filter(|m| m.starts_with(&format!("node {node}: ")))
        .collect();
    assert!(
        !notes.is_empty()
            && notes.iter().all(|m| m.contains("held back 1 of its 2 nvidia.com/gpu as unhealthy")),
        "a DevicePluginUnhealthyGpus event names the GPU NVIDIA's device plugin held back on {node}: {events}"
    );

    // Both trainers now run through NVIDIA's driver, on the node's two GPUs.
    let after = real::wait_workload(client, id, APP, 2, Duration::from_secs(180)).await?;
    let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), id);
    let mut devices = BTreeSet::new();
    for p in &after {
        let name = p.name_any();
        let claim = p
            .status
            .as_ref()
            .and_then(|s| s.extended_resource_claim_status.as_ref())
            .map(|s| s.resource_claim_name.clone())
            .unwrap_or_else(|| panic!("{name}: no generated claim"));
        for (driver, from, device) in real::allocated(&claims.get(&claim).await?) {
            assert!(driver == DRIVER && from == node, "{name}: {driver} {from} {device}");
            devices.insert(device);
        }
    }
    assert_eq!(devices.len(), 2, "both GPUs of {node} hold a trainer: {devices:?}");
    stop_safe(sampler, true);
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

    stop_safe(sampler, true);
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

/// GPU 1 of a node repartitioned as the GPU Operator's MIG manager would: two 1g.10gb instances
/// (memory slices 0 and 1) and a 3g.40gb (slices 4-7), each with its compute instance 0.
fn mig_instances() -> Vec<real::MigInstance> {
    let one = |n: u32, start: u32| real::MigInstance {
        uuid: format!("MIG-5c1e0a2d-0000-4000-8000-00000000000{n}"),
        profile: "1g.10gb",
        gpu_instance_id: 8 + n,
        placement_start: start,
        slices: 1,
        memory_bytes: 10_200_547_328,
        multiprocessors: 16,
    };
    let three = real::MigInstance {
        uuid: "MIG-5c1e0a2d-0000-4000-8000-000000000003".into(),
        profile: "3g.40gb",
        gpu_instance_id: 2,
        placement_start: 4,
        slices: 3,
        memory_bytes: 42_580_574_208,
        multiprocessors: 60,
    };
    vec![one(1, 0), one(2, 1), three]
}

/// NVIDIA's name for a static MIG device: `gpu-<parent minor>-mig-<profile>-<profile id>-<start>`
/// (its `MigSpecTuple`), with an H100's profile ids.
fn nvidia_mig_device_name(parent_minor: u32, m: &real::MigInstance) -> String {
    let id = match m.profile {
        "1g.10gb" => 19,
        "3g.40gb" => 9,
        other => panic!("no H100 profile id for {other} here"),
    };
    format!("gpu-{parent_minor}-mig-{}-{id}-{}", m.profile.replace('.', ""), m.placement_start)
}

/// The DRA half of a MIG migration onto NVIDIA's driver, on one real node. The node moves with
/// its GPUs whole (NVIDIA's device plugin cannot serve MIG devices here: it needs the kernel
/// module's procfs at start, docs/e2e.md) under a migration that also maps `nvidia.com/mig-1g.10gb`
/// to a class of its own. Then GPU 1 is repartitioned as the GPU Operator's MIG manager does (the
/// mock's inventory, NVIDIA's kubelet plugin restarted), and:
/// - NVIDIA's driver publishes GPU 0 whole and GPU 1 only as its MIG devices, each under NVIDIA's
///   name for its profile and placement, with the mock's UUID, its profile and the memory slices
///   of its placement: the placements the mock answers are an H100's;
/// - three pods asking for `nvidia.com/mig-1g.10gb: 1` the plain way: two run, each through a
///   claim the scheduler generated with the migration's MIG class, on a different 1g.10gb device,
///   their containers seeing the parent GPU's device node and the two capability device nodes of
///   their own instance from NVIDIA's CDI spec; the third waits Unschedulable (the class selects
///   no 3g.40gb);
/// - the migration stays Completed, and no node was served by both backends at any watch event.
async fn mig_scenario(client: &Client, id: &str, names: &[String]) -> anyhow::Result<()> {
    let node = names.first().ok_or_else(|| anyhow::anyhow!("no real node"))?.clone();
    let pool = std::slice::from_ref(&node);
    set_up(client, id, pool).await?;
    let sampler = sample(client, id);
    let migrations: Api<GpuPoolMigration> = Api::all(client.clone());
    let mut gpm = serde_json::to_value(pool_migration(id)?)?;
    gpm["spec"]["resources"]
        .as_array_mut()
        .ok_or_else(|| anyhow::anyhow!("a migration without resources"))?
        .push(json!({"extendedResourceName": MIG, "deviceClassName": MIG_CLASS, "selector": MIG_SELECTOR}));
    migrations.create(&PostParams::default(), &serde_json::from_value(gpm)?).await?;
    completes(client, id, "the node's move to NVIDIA's DRA driver", Duration::from_secs(300)).await?;

    // GPU 1 repartitioned; NVIDIA's kubelet plugin restarted to read it, as the MIG manager
    // restarts the GPU clients of the node.
    let instances = mig_instances();
    real::partition_gpu(&node, 1, &instances)?;
    let old = kubelet_plugin_pods(client)
        .await?
        .remove(&node)
        .ok_or_else(|| anyhow::anyhow!("no plugin on {node}"))?;
    let plugin_pods: Api<Pod> = Api::namespaced(client.clone(), NVIDIA_DRA_NS);
    plugin_pods.delete(&old.name_any(), &DeleteParams::default()).await?;
    wait::until("NVIDIA's kubelet plugin to restart on the node", Duration::from_secs(120), || {
        let (plugin_pods, node, old) = (plugin_pods.clone(), node.clone(), old.clone());
        async move {
            let gone = plugin_pods.get_opt(&old.name_any()).await?.is_none();
            let new = kubelet_plugin_pods(client).await?.remove(&node);
            Ok((gone && new.as_ref().is_some_and(|p| p.uid() != old.uid() && real::ready(p))).then_some(()))
        }
    })
    .await?;

    // What NVIDIA's driver publishes for the node now.
    let slices: Api<ResourceSlice> = Api::all(client.clone());
    let fields = format!("spec.driver={DRIVER},spec.nodeName={node}");
    let published =
        wait::until("NVIDIA's driver to publish the MIG devices", Duration::from_secs(120), || {
            let (slices, fields) = (slices.clone(), fields.clone());
            async move {
                let devices: BTreeMap<String, k8s_openapi::api::resource::v1::Device> = slices
                    .list(&ListParams::default().fields(&fields))
                    .await?
                    .items
                    .into_iter()
                    .flat_map(|s| s.spec.devices.unwrap_or_default())
                    .map(|d| (d.name.clone(), d))
                    .collect();
                Ok(devices.keys().any(|k| k.contains("-mig-")).then_some(devices))
            }
        })
        .await?;
    let inventory = real::node_gpus();
    let by_name: BTreeMap<String, &real::MigInstance> =
        instances.iter().map(|m| (nvidia_mig_device_name(1, m), m)).collect();
    let mut want: BTreeSet<String> = by_name.keys().cloned().collect();
    want.insert("gpu-0".into());
    assert_eq!(
        published.keys().cloned().collect::<BTreeSet<_>>(),
        want,
        "GPU 0 whole, GPU 1 only as its MIG devices, named by profile and placement"
    );
    for (name, d) in &published {
        let attr = |k: &str| d.attributes.as_ref().and_then(|a| a.get(k)).and_then(|v| v.string.clone());
        let slices_held: BTreeSet<String> = d
            .capacity
            .as_ref()
            .map(|c| c.keys().filter(|k| k.starts_with("memorySlice")).cloned().collect())
            .unwrap_or_default();
        match by_name.get(name) {
            None => {
                assert_eq!(attr("type").as_deref(), Some("gpu"), "{name}");
                assert_eq!(attr("uuid"), Some(inventory[0].uuid.clone()), "{name}");
            }
            Some(m) => {
                assert_eq!(attr("type").as_deref(), Some("mig"), "{name}");
                assert_eq!(attr("profile").as_deref(), Some(m.profile), "{name}");
                assert_eq!(attr("uuid"), Some(m.uuid.clone()), "{name}");
                let size = if m.profile == "3g.40gb" { 4 } else { 1 };
                let placement: BTreeSet<String> = (m.placement_start..m.placement_start + size)
                    .map(|i| format!("memorySlice{i}"))
                    .collect();
                assert_eq!(slices_held, placement, "{name}: the memory slices of its placement");
            }
        }
    }

    // The kernel module's MIG capability files in the plugin's container; then the pods.
    let gis: Vec<u32> = instances.iter().map(|m| m.gpu_instance_id).collect();
    let major = real::fake_mig_capabilities(&node, 1, &gis)?;
    real::gpu_workload_asking(client, id, "mig", 3, Some(&node), MIG, 1).await?;
    let running = real::wait_workload(client, id, "mig", 2, Duration::from_secs(180)).await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), id);
    wait::until("the third 1g.10gb pod to be Unschedulable", Duration::from_secs(60), || {
        let pods = pods.clone();
        async move {
            let all = pods.list(&ListParams::default().labels("app=mig")).await?.items;
            Ok(all.iter().find_map(|p| {
                let c = p.status.as_ref()?.conditions.as_ref()?;
                c.iter()
                    .find(|c| c.type_ == "PodScheduled" && c.reason.as_deref() == Some("Unschedulable"))?;
                Some(())
            }))
        }
    })
    .await?;
    let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), id);
    let mut held = BTreeSet::new();
    for p in &running {
        let name = p.name_any();
        let claim_name = p
            .status
            .as_ref()
            .and_then(|s| s.extended_resource_claim_status.as_ref())
            .map(|s| s.resource_claim_name.clone())
            .unwrap_or_else(|| panic!("{name}: no generated claim for its {MIG} limit"));
        let claim = claims.get(&claim_name).await?;
        let classes: Vec<String> = claim
            .spec
            .as_ref()
            .and_then(|s| s.devices.as_ref())
            .and_then(|d| d.requests.as_ref())
            .map(|r| r.iter().filter_map(|r| Some(r.exactly.as_ref()?.device_class_name.clone())).collect())
            .unwrap_or_default();
        assert_eq!(classes, [MIG_CLASS], "{name}: the migration's MIG class maps {MIG}");
        let results = real::allocated(&claim);
        let [(driver, from, device)] = &results[..] else { panic!("{name}: one device, got {results:?}") };
        assert!(driver == DRIVER && from == &node, "{name}: {results:?}");
        let m = by_name.get(device).filter(|m| m.profile == "1g.10gb");
        let m = m.unwrap_or_else(|| panic!("{name}: {device} is not a 1g.10gb device of GPU 1"));
        assert!(held.insert(device.clone()), "{name}: {device} allocated twice");
        let logs = real::logs(id, &name)?;
        let (_, gpus) = real::what_the_container_saw(&logs);
        let parent: Vec<String> = gpus.iter().filter_map(|l| real::device_node(l)).collect();
        assert_eq!(parent, ["195:1 /dev/nvidia1"], "{name}: the parent GPU's device node\n{logs}");
        let caps: BTreeSet<String> = logs
            .lines()
            .filter_map(|l| l.strip_prefix("workload: dev "))
            .filter_map(real::device_node)
            .filter(|d| d.contains("nvidia-cap"))
            .collect();
        let want: BTreeSet<String> = [None, Some(0)]
            .into_iter()
            .map(|ci| real::mig_cap_minor(1, m.gpu_instance_id, ci))
            .map(|minor| format!("{major}:{minor} nvidia-cap{minor}"))
            .collect();
        assert_eq!(caps, want, "{name}: the capability device nodes of {device}'s instances\n{logs}");
    }
    completes(client, id, "the migration to read Completed still", Duration::from_secs(10)).await?;
    stop_safe(sampler, true);
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
    for name in ["", "-target", "-replace", "-overlap", "-late"].map(|suffix| format!("{id}{suffix}")) {
        real::delete_migration(client, &name).await?;
    }
    // The workload goes before the driver: a DRA plugin must outlive the pods whose claims it
    // prepared, or they hang in Terminating.
    real::delete_namespace(client, id).await?;
    real::uninstall_nvidia_dra()?;
    for n in names {
        real::restore_inventory(n)?;
    }
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
            MEMBER,
        ],
    )
    .await
}
