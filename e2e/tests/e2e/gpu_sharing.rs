//! Time-sliced GPUs on the real nodes, set up and labelled by NVIDIA's own code, move to
//! Switchyard's DRA driver with the packaged operator.
//!
//! NVIDIA's device plugin and GPU Feature Discovery (k8s-device-plugin v0.19.3) run from their own
//! Helm chart (`e2e/hack/render-nvidia-device-plugin.sh`) with its config-manager and two configs:
//! `default` time-slices each GPU 2 ways, `renamed` does the same with `renameByDefault`, picked
//! for the second node by its `nvidia.com/device-plugin.config` label. GFD publishes its labels as
//! NodeFeature objects, and Node Feature Discovery's nfd-master (v0.18.3, from its own chart,
//! `e2e/hack/render-nfd.sh`) writes them onto the nodes, as in a GPU Operator install. Only the
//! GPUs are fake: the NVML mock and device nodes in each node's driver root, which the plugin, GFD
//! and Switchyard's agent (`--inventory nvml`) all load.
//!
//! What it shows:
//! - the config-manager gives each node its config: the first advertises `nvidia.com/gpu: 4` on 2
//!   GPUs, the second `nvidia.com/gpu.shared: 4`, and GFD's labels (sharing strategy, replicas,
//!   count, product) land on the nodes through nfd-master;
//! - Switchyard reads those labels as they are written: before anything moves, the migration says
//!   what the sharing costs (`GpuSharingNotAcknowledged`, capacity 4 → 2 on each node, per
//!   resource), `switchyard plan` blocks with the same, and no node is touched;
//! - the chart's own DaemonSet, with its affinity of alternatives, is what `placement: Managed`
//!   keeps off the moved nodes;
//! - acknowledged, the pool moves; a GPU of the second node is lost (an NVML fault in the mock)
//!   while that node is in the middle of its move: the switch completes on the GPUs it has and says
//!   which device is unhealthy and why, the lost GPU is published tainted and not handed out, and
//!   once it answers again the pod that waited for it runs: no pod is lost or left on a node no
//!   backend serves, and no node is left cordoned;
//! - each node's `gpus-before` record is its physical GPUs, not the time-sliced replicas;
//! - the runbook's last step on NVIDIA's chart: its device-plugin DaemonSet deleted once it serves
//!   no node, the migration still Completed and Ready, and a third node that joins afterwards,
//!   labelled by NVIDIA's GFD and served by no device plugin, moves to DRA and runs a pod.
//!
//! A second scenario, on the same two nodes, keeps the slots instead of acknowledging their loss:
//! Switchyard's agent shares each GPU 2 ways (its per-node label `switchyard.dev/gpu-shares`, a
//! `shares` capacity with `allowMultipleAllocations`) and the migration says so
//! (`spec.driver.sharesPerDevice: 2`): nothing to acknowledge, the plan says "no loss", 4 pods on
//! each node before and after, each through a generated claim holding a share of one of the node's
//! 2 GPUs (never a third claim on one), a 5th pod left Pending by the shares, and a rollback gives
//! the device plugin's 4 slots back; the sampler sees no node served by both backends.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceSlice};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};
use serde_json::json;
use switchyard_e2e::pool::{Sampler, allocatable};
use switchyard_e2e::real::{
    self, LABEL_DEVICE_PLUGIN_CONFIG, LABEL_GPU_PRESENT, NVIDIA_DEVICE_PLUGIN_DS, NVIDIA_DEVICE_PLUGIN_NS,
    NVIDIA_DRA_KUBELET_PLUGIN, NVIDIA_DRA_NS,
};
use switchyard_e2e::{cluster, wait};
use switchyard_operator::api::v1alpha1::{GpuPoolMigration, Phase};
use switchyard_operator::well_known::{ANNOTATION_MIGRATION_STATE, LABEL_GPU_SHARES};

const DRIVER: &str = "gpu.switchyard.dev";
/// Switchyard's DeviceClass for the renamed resource.
const SHARED_CLASS: &str = "gpu-shared.switchyard.dev";
const GPU: &str = "nvidia.com/gpu";
const SHARED: &str = "nvidia.com/gpu.shared";
use switchyard_operator::well_known::LABEL_GPU_BACKEND as BACKEND;

#[tokio::test]
async fn time_sliced_gpus_labelled_by_nvidias_gfd_move_once_acknowledged() -> anyhow::Result<()> {
    real::alone_on_real_nodes("shared", scenario, diagnostics, cleanup).await
}

#[tokio::test]
async fn time_sliced_gpus_keep_their_slots_on_an_agent_that_shares_each_gpu_as_many_ways()
-> anyhow::Result<()> {
    real::alone_on_real_nodes("shares", keeps_slots, diagnostics, cleanup).await
}

#[tokio::test]
async fn time_sliced_gpus_keep_their_slots_on_nvidias_dra_driver_with_consumable_shares() -> anyhow::Result<()>
{
    real::alone_on_real_nodes("nvshares", keeps_slots_on_nvidias_driver, diagnostics, cleanup_nvidia).await
}

/// Two real nodes, `nvidia.com/gpu` and `nvidia.com/gpu.shared` each through a DeviceClass of
/// Switchyard's driver, from the chart's device-plugin DaemonSet.
fn migration(id: &str) -> anyhow::Result<GpuPoolMigration> {
    let mut m =
        real::pool_migration(id, DRIVER, DRIVER, (real::SYSTEM_NS, "switchyard-driver-agent"), "Managed");
    m["spec"]["resources"].as_array_mut().expect("resources").push(json!({
        "extendedResourceName": SHARED, "deviceClassName": SHARED_CLASS,
        "selector": format!("device.attributes['{DRIVER}'].type == 'gpu'"),
    }));
    m["spec"]["devicePlugin"] =
        json!({"daemonSet": {"namespace": NVIDIA_DEVICE_PLUGIN_NS, "name": NVIDIA_DEVICE_PLUGIN_DS}});
    Ok(serde_json::from_value(m)?)
}

fn prerequisites(g: &GpuPoolMigration) -> Option<(String, String, String)> {
    let c = g.status.as_ref()?.conditions.iter().find(|c| c.type_ == "PrerequisitesMet")?;
    Some((c.status.clone(), c.reason.clone(), c.message.clone()))
}

/// The GFD labels Switchyard judges a node by, as nfd-master wrote them.
fn gfd_labels(node: &Node) -> BTreeMap<String, String> {
    let keys = ["gpu.sharing-strategy", "gpu.replicas", "gpu.count", "gpu.product"];
    keys.iter()
        .filter_map(|k| {
            let key = format!("nvidia.com/{k}");
            node.labels().get(&key).map(|v| (key, v.clone()))
        })
        .collect()
}

/// Waits until migration `id` reads `phase`, failing at once if it reads Failed.
async fn reaches(
    migrations: &Api<GpuPoolMigration>,
    id: &str,
    phase: Phase,
) -> anyhow::Result<GpuPoolMigration> {
    wait::until(&format!("the migration to read {phase:?}"), Duration::from_secs(480), || {
        let migrations = migrations.clone();
        async move {
            let g = migrations.get(id).await?;
            let now = g.status.as_ref().and_then(|s| s.phase);
            anyhow::ensure!(now != Some(Phase::Failed), "migration failed: {:?}", g.status);
            Ok((now == Some(phase)).then_some(g))
        }
    })
    .await
}

/// `switchyard plan <id> -o json`: exit code and report.
fn plan(id: &str) -> anyhow::Result<(i32, serde_json::Value)> {
    let out = std::process::Command::new(cluster::cli_bin())
        .args(["plan", id, "-o", "json"])
        .env("KUBECONFIG", cluster::kubeconfig())
        .output()?;
    let report = serde_json::from_slice(&out.stdout)
        .map_err(|e| anyhow::anyhow!("plan -o json: {e}: {}", String::from_utf8_lossy(&out.stderr)))?;
    Ok((out.status.code().unwrap_or(-1), report))
}

/// The GPU pods of `app` in `ns` that are not terminating: (Ready, waiting to be scheduled).
async fn pods_of(client: &Client, ns: &str, app: &str) -> anyhow::Result<(Vec<Pod>, Vec<Pod>)> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let list = pods.list(&ListParams::default().labels(&format!("app={app}"))).await?.items;
    let live = list.into_iter().filter(|p| p.metadata.deletion_timestamp.is_none());
    let (ready, rest): (Vec<Pod>, Vec<Pod>) = live.partition(real::ready);
    let unscheduled =
        rest.into_iter().filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_none()).collect();
    Ok((ready, unscheduled))
}

/// The two nodes of both scenarios, as NVIDIA's chart leaves them: `sliced` advertises
/// `nvidia.com/gpu` twice per GPU, `renamed` `nvidia.com/gpu.shared` twice per GPU, and GFD's labels
/// (through nfd-master) say so. `labels` go on both nodes before anything is installed; Switchyard
/// is installed from `overlay` where one is given (without its agent, say).
struct Shared {
    sliced: String,
    renamed: String,
    pool: [String; 2],
    gpus: Vec<real::MockGpu>,
    physical: i64,
    node_api: Api<Node>,
}

async fn set_up(
    client: &Client,
    id: &str,
    names: &[String],
    labels: serde_json::Value,
    overlay: Option<&str>,
) -> anyhow::Result<Shared> {
    anyhow::ensure!(names.len() >= 2, "two real nodes needed, found {names:?}");
    let (sliced, renamed) = (names[0].clone(), names[1].clone());
    let pool = [sliced.clone(), renamed.clone()];
    let gpus = real::node_gpus();
    let physical = gpus.len() as i64;
    let node_api: Api<Node> = Api::all(client.clone());

    for n in &pool {
        real::label(client, n, json!({"pool": id, LABEL_GPU_PRESENT: "true"})).await?;
        real::label(client, n, labels.clone()).await?;
    }
    real::label(client, &renamed, json!({LABEL_DEVICE_PLUGIN_CONFIG: "renamed"})).await?;
    real::install_nfd(client).await?;
    real::install_nvidia_device_plugin_chart()?;
    match overlay {
        None => real::install_switchyard(client).await?,
        Some(o) => real::install_switchyard_from(client, o).await?,
    }

    // 1. NVIDIA's config-manager gave each node its config; the plugin advertises the replicas.
    real::wait_allocatable(
        client,
        std::slice::from_ref(&sliced),
        GPU,
        2 * physical,
        Duration::from_secs(180),
    )
    .await?;
    real::wait_allocatable(
        client,
        std::slice::from_ref(&renamed),
        SHARED,
        2 * physical,
        Duration::from_secs(180),
    )
    .await?;
    assert_eq!(allocatable(&node_api.get(&renamed).await?, GPU), 0, "renameByDefault advertises no {GPU}");

    // 2. GFD's labels, through NodeFeature objects and nfd-master. The product of a time-sliced
    //    GPU advertised under its own name says so; a renamed one does not need to.
    let product = gpus[0].name.replace(' ', "-");
    let want = |suffix: &str| {
        BTreeMap::from([
            ("nvidia.com/gpu.sharing-strategy".to_owned(), "time-slicing".to_owned()),
            ("nvidia.com/gpu.replicas".to_owned(), "2".to_owned()),
            ("nvidia.com/gpu.count".to_owned(), physical.to_string()),
            ("nvidia.com/gpu.product".to_owned(), format!("{product}{suffix}")),
        ])
    };
    for (n, want) in [(&sliced, want("-SHARED")), (&renamed, want(""))] {
        let node_api = node_api.clone();
        let labelled = wait::until(&format!("GFD's labels on {n}"), Duration::from_secs(180), || {
            let (node_api, want) = (node_api.clone(), want.clone());
            async move { Ok((gfd_labels(&node_api.get(n).await?) == want).then_some(())) }
        })
        .await;
        if labelled.is_err() {
            panic!("{n}: GFD's labels are {:?}, not {want:?}", gfd_labels(&node_api.get(n).await?));
        }
    }
    let features = real::kubectl(&["-n", NVIDIA_DEVICE_PLUGIN_NS, "get", "nodefeatures", "-o", "name"])?;
    assert_eq!(features.lines().count(), pool.len(), "one NodeFeature per node from GFD: {features}");
    Ok(Shared { sliced, renamed, pool, gpus, physical, node_api })
}

async fn scenario(client: &Client, id: &str, names: &[String]) -> anyhow::Result<()> {
    let Shared { sliced, renamed, pool, gpus, physical, node_api } =
        set_up(client, id, names, json!({}), None).await?;

    cluster::create_namespace(client, id).await?;
    real::gpu_workload_of(client, id, "sliced", physical as i32, Some(&sliced), GPU).await?;
    real::gpu_workload_of(client, id, "renamed", physical as i32, Some(&renamed), SHARED).await?;
    real::wait_workload(client, id, "sliced", physical as usize, Duration::from_secs(120)).await?;
    real::wait_workload(client, id, "renamed", physical as usize, Duration::from_secs(120)).await?;

    // 3. Before anything moves: the cost of the sharing, per resource, from GFD's labels.
    let migrations: Api<GpuPoolMigration> = Api::all(client.clone());
    migrations.create(&PostParams::default(), &migration(id)?).await?;
    let blocked =
        wait::until("PrerequisitesMet False: GpuSharingNotAcknowledged", Duration::from_secs(120), || {
            let migrations = migrations.clone();
            async move {
                let g = migrations.get(id).await?;
                Ok(prerequisites(&g).filter(|(_, reason, _)| reason == "GpuSharingNotAcknowledged"))
            }
        })
        .await?;
    let (status, _, message) = blocked;
    assert_eq!(status, "False");
    for want in [
        format!("{GPU} capacity drops from {} to {physical} on 1 node(s)", 2 * physical),
        format!("{SHARED} capacity drops from {} to {physical} on 1 node(s)", 2 * physical),
        format!("{sliced}: {} on {physical} GPU(s), time-slicing, 2 replicas per GPU", 2 * physical),
        format!("{renamed}: {} on {physical} device(s), renamed {SHARED} (renameByDefault)", 2 * physical),
        "spec.acknowledge.gpuSharingLoss: true".to_owned(),
    ] {
        assert!(message.contains(&want), "no {want:?} in {message}");
    }
    let (code, report) = plan(id)?;
    assert_eq!(code, 2, "the plan blocks: {report}");
    assert!(
        report["blockers"].to_string().contains(&format!("{SHARED} capacity drops")),
        "{}",
        report["blockers"]
    );
    for n in &pool {
        let node = node_api.get(n).await?;
        assert!(!node.annotations().contains_key(ANNOTATION_MIGRATION_STATE), "{n} was touched");
        assert_ne!(node.spec.as_ref().and_then(|s| s.unschedulable), Some(true), "{n} is cordoned");
    }

    // 4. Acknowledged: the pool moves. A GPU of the second node is lost while that node is mid-move.
    migrations
        .patch(
            id,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"acknowledge": {"gpuSharingLoss": true}}})),
        )
        .await?;
    let lost = gpus[1].uuid.clone();
    // Switching: drained, its backend label flipped, the device plugin leaving and the agent
    // coming up (a few seconds; the state is polled every 250 ms).
    wait::until(&format!("{renamed} to be Switching"), Duration::from_secs(300), || {
        let node_api = node_api.clone();
        let renamed = renamed.clone();
        async move {
            let node = node_api.get(&renamed).await?;
            let state = node.annotations().get(ANNOTATION_MIGRATION_STATE).cloned().unwrap_or_default();
            anyhow::ensure!(
                !["Verifying", "Migrated"].contains(&state.as_str()),
                "{renamed} went past Switching unseen"
            );
            Ok((state == "Switching").then_some(()))
        }
    })
    .await?;
    real::raise_gpu_fault(&renamed, &lost, "lost", 0)?;

    let done = reaches(&migrations, id, Phase::Completed).await?;
    assert_eq!(done.status.as_ref().map(|s| s.nodes.migrated), Some(pool.len() as i32));

    // The switch said which device and why.
    let events: Api<Event> = Api::all(client.clone());
    let unhealthy: Vec<String> = events
        .list(&ListParams::default().fields("reason=UnhealthyDevices"))
        .await?
        .items
        .into_iter()
        .filter_map(|e| e.note)
        .filter(|n| n.contains(&renamed))
        .collect();
    assert!(
        unhealthy.iter().any(|n| n.contains("1 unhealthy device(s)") && n.contains("gpu-lost")),
        "no UnhealthyDevices event naming the lost GPU of {renamed}: {unhealthy:?}"
    );
    // The lost GPU is published, tainted: counted as the node's, not handed out.
    let slices: Api<ResourceSlice> = Api::all(client.clone());
    let on_renamed =
        slices.list(&ListParams::default().fields(&format!("spec.nodeName={renamed}"))).await?.items;
    let tainted: Vec<String> = on_renamed
        .iter()
        .flat_map(|s| s.spec.devices.iter().flatten())
        .filter(|d| d.taints.iter().flatten().any(|t| t.key.ends_with("gpu-lost")))
        .map(|d| d.name.clone())
        .collect();
    assert_eq!(tainted.len(), 1, "{renamed}: one device tainted lost: {tainted:?}");

    for n in &pool {
        let node = node_api.get(n).await?;
        assert_eq!(node.labels().get(BACKEND).map(String::as_str), Some("dra"), "{n}");
        assert_ne!(node.spec.as_ref().and_then(|s| s.unschedulable), Some(true), "{n} is left cordoned");
        assert_eq!(allocatable(&node, GPU) + allocatable(&node, SHARED), 0, "{n}: the device plugin left");
        let before: BTreeMap<String, i64> = serde_json::from_str(
            &node.annotations()[switchyard_operator::well_known::ANNOTATION_GPUS_BEFORE],
        )?;
        // Each pool resource, counted under the name the node advertised it: the physical GPUs.
        let (gpu, shared) = if n == &sliced { (physical, 0) } else { (0, physical) };
        assert_eq!(
            before,
            BTreeMap::from([(GPU.to_owned(), gpu), (SHARED.to_owned(), shared)]),
            "{n}: the physical GPUs"
        );
    }
    // The chart's DaemonSet, with its alternatives of node terms, keeps off every moved node.
    let ds: Api<DaemonSet> = Api::namespaced(client.clone(), NVIDIA_DEVICE_PLUGIN_NS);
    let plugin = ds.get(NVIDIA_DEVICE_PLUGIN_DS).await?;
    let terms = plugin
        .spec
        .template
        .spec
        .and_then(|s| s.affinity)
        .and_then(|a| a.node_affinity)
        .and_then(|a| a.required_during_scheduling_ignored_during_execution)
        .map(|r| r.node_selector_terms)
        .unwrap_or_default();
    assert!(terms.len() >= 3, "the chart's alternatives stay: {terms:?}");
    for t in &terms {
        assert!(
            t.match_expressions.iter().flatten().any(|e| e.key == BACKEND && e.operator == "NotIn"),
            "a term that would still place the plugin on a moved node: {t:?}"
        );
    }

    // 5. Every pod of the time-sliced node runs through DRA; on the other, one waits for the lost
    //    GPU and none is lost.
    let sliced_pods =
        real::wait_workload(client, id, "sliced", physical as usize, Duration::from_secs(180)).await?;
    let (ready, waiting) =
        wait::until("the renamed pods: 1 Ready, 1 waiting", Duration::from_secs(180), || async {
            let (ready, waiting) = pods_of(client, id, "renamed").await?;
            Ok((ready.len() + waiting.len() == physical as usize && !ready.is_empty())
                .then_some((ready, waiting)))
        })
        .await?;
    assert_eq!(ready.len(), physical as usize - 1, "one GPU lost: one pod fewer runs");
    assert_eq!(waiting.len(), 1);
    // The GPU answers again; the agent's next discovery (every 60 s) recovers it, and the pod
    // that waited runs on it.
    real::raise_gpu_fault(&renamed, &lost, "recover", 0)?;
    let renamed_pods =
        real::wait_workload(client, id, "renamed", physical as usize, Duration::from_secs(240)).await?;
    for p in sliced_pods.iter().chain(&renamed_pods) {
        assert!(
            p.status.as_ref().and_then(|s| s.extended_resource_claim_status.as_ref()).is_some(),
            "{}: served through a generated claim",
            p.name_any()
        );
    }

    // 6. The runbook's last step, on NVIDIA's own objects.
    the_device_plugin_goes_and_a_node_joins(client, id, names, &migrations).await
}

/// The runbook's last step on the completed pool `id`, on NVIDIA's chart: once its device-plugin
/// DaemonSet serves no node the migration says it may go (`DevicePluginRemovable`,
/// `DevicePluginUnused`); deleted (GPU Feature Discovery's DaemonSet left running, as a GPU
/// Operator's ClusterPolicy with the plugin disabled leaves it), the migration stays Completed and
/// Ready (`DevicePluginRemoved`). Then the third node joins the pool with no device plugin on it:
/// NVIDIA's GFD labels its GPUs, and from those labels (its count, the default config's sharing)
/// the migration moves it to DRA, uncordoned, counting its physical GPUs, and a pod asking for
/// `nvidia.com/gpu` runs there through a generated claim.
async fn the_device_plugin_goes_and_a_node_joins(
    client: &Client,
    id: &str,
    names: &[String],
    migrations: &Api<GpuPoolMigration>,
) -> anyhow::Result<()> {
    let joined = names.get(2).ok_or_else(|| anyhow::anyhow!("a third real node is needed: {names:?}"))?;
    let removable = |reason: &'static str| {
        let migrations = migrations.clone();
        async move {
            let g = migrations.get(id).await?;
            let c = g
                .status
                .as_ref()
                .and_then(|s| s.conditions.iter().find(|c| c.type_ == "DevicePluginRemovable"));
            Ok(c.filter(|c| c.status == "True" && c.reason == reason).cloned().map(|c| (g.clone(), c)))
        }
    };
    let (_, unused) =
        wait::until("DevicePluginRemovable=True (DevicePluginUnused)", Duration::from_secs(60), || {
            removable("DevicePluginUnused")
        })
        .await?;
    assert!(
        unused.message.contains(NVIDIA_DEVICE_PLUGIN_DS) && unused.message.contains("runs on no node"),
        "{}",
        unused.message
    );
    let ds: Api<DaemonSet> = Api::namespaced(client.clone(), NVIDIA_DEVICE_PLUGIN_NS);
    ds.delete(NVIDIA_DEVICE_PLUGIN_DS, &DeleteParams::default()).await?;
    let (g, _) =
        wait::until("DevicePluginRemovable=True (DevicePluginRemoved)", Duration::from_secs(60), || {
            removable("DevicePluginRemoved")
        })
        .await?;
    let st = g.status.clone().unwrap_or_default();
    assert_eq!(st.phase, Some(Phase::Completed), "{st:?}");
    for (t, want) in [("Ready", "True"), ("Stalled", "False")] {
        let c = st.conditions.iter().find(|c| c.type_ == t);
        assert_eq!(c.map(|c| c.status.as_str()), Some(want), "{t}: {c:?}");
    }
    let (code, report) = plan(id)?;
    assert_eq!(code, 0, "switchyard plan after the device plugin went: {report}");

    // The node joins. Its kubelet may remember device-plugin GPUs of pods an earlier scenario ran
    // there; on v1.37.2 such a node runs no pod that asks for nvidia.com/gpu through DRA once the
    // plugin's endpoint has expired (kubernetes/kubernetes#141426: CreateContainerConfigError,
    // "endpoint not found in cache for a registered resource"). The remedy docs/operations.md gives
    // (KubeletKeepsDevicePluginGpus), as an admin applies it.
    let remembered = real::device_plugin_checkpoint(joined)?;
    if !remembered.is_empty() {
        eprintln!(
            "{joined}: the kubelet remembers device-plugin devices of {remembered:?}; restarting it without them"
        );
        real::restart_kubelet(joined, true)?;
        assert_eq!(real::device_plugin_checkpoint(joined)?, Vec::new(), "{joined}: the kubelet forgot them");
    }
    // GFD, still running, labels it.
    let physical = real::node_gpus().len();
    real::label(client, joined, json!({"pool": id, LABEL_GPU_PRESENT: "true"})).await?;
    let node_api: Api<Node> = Api::all(client.clone());
    wait::until("GFD's count on the joined node", Duration::from_secs(180), || {
        let node_api = node_api.clone();
        async move {
            let labels = gfd_labels(&node_api.get(joined).await?);
            Ok((labels.get("nvidia.com/gpu.count") == Some(&physical.to_string())).then_some(()))
        }
    })
    .await?;
    let done = wait::until("the joined node to move", Duration::from_secs(240), || {
        let migrations = migrations.clone();
        async move {
            let s = migrations.get(id).await?.status.unwrap_or_default();
            anyhow::ensure!(s.phase != Some(Phase::Failed), "migration failed: {s:?}");
            Ok((s.phase == Some(Phase::Completed) && s.nodes.migrated == 3).then_some(s))
        }
    })
    .await?;
    assert_eq!(done.nodes.total, 3, "{:?}", done.nodes);
    let node = node_api.get(joined).await?;
    assert_eq!(node.labels().get(BACKEND).map(String::as_str), Some("dra"), "{joined}");
    assert_ne!(node.spec.as_ref().and_then(|s| s.unschedulable), Some(true), "{joined} is left cordoned");
    let before: BTreeMap<String, i64> =
        serde_json::from_str(&node.annotations()[switchyard_operator::well_known::ANNOTATION_GPUS_BEFORE])?;
    assert_eq!(
        before.values().sum::<i64>(),
        physical as i64,
        "{joined}: its physical GPUs, from GFD: {before:?}"
    );
    real::gpu_workload_of(client, id, "joined", 1, Some(joined), GPU).await?;
    let pod = real::wait_workload(client, id, "joined", 1, Duration::from_secs(120)).await?.remove(0);
    assert!(
        pod.status.as_ref().and_then(|s| s.extended_resource_claim_status.as_ref()).is_some(),
        "{}: served on {joined} through a generated claim",
        pod.name_any()
    );
    Ok(())
}

/// A pool moved to `driver` sharing each GPU [`SHARES`] ways: on each node no cordon, no
/// device-plugin GPUs, `gpus-before` the physical GPUs and the driver's devices each taking
/// [`SHARES`] claims; the workloads `sliced` and `renamed` run as many pods as before on their
/// node, each through a generated claim holding a share (a share id) of one of its node's GPUs,
/// exactly [`SHARES`] claims per GPU, and each container sees one GPU, [`SHARES`] containers
/// each.
async fn moved_with_shares(
    client: &Client,
    id: &str,
    node_api: &Api<Node>,
    (sliced, renamed): (&String, &String),
    driver: &str,
    physical: i64,
) -> anyhow::Result<()> {
    let slices: Api<ResourceSlice> = Api::all(client.clone());
    for n in [sliced, renamed] {
        let node = node_api.get(n).await?;
        assert_ne!(node.spec.as_ref().and_then(|s| s.unschedulable), Some(true), "{n} is left cordoned");
        assert_eq!(allocatable(&node, GPU) + allocatable(&node, SHARED), 0, "{n}: the device plugin left");
        let before: BTreeMap<String, i64> = serde_json::from_str(
            &node.annotations()[switchyard_operator::well_known::ANNOTATION_GPUS_BEFORE],
        )?;
        assert_eq!(before.values().sum::<i64>(), physical, "{n}: gpus-before counts the physical GPUs");
        let devices: Vec<(String, u64)> = slices
            .list(&ListParams::default().fields(&format!("spec.nodeName={n},spec.driver={driver}")))
            .await?
            .items
            .iter()
            .flat_map(|s| s.spec.devices.iter().flatten())
            .map(|d| (d.name.clone(), switchyard_api::sharing::claims_per_device(d)))
            .collect();
        assert_eq!(devices.len() as i64, physical, "{n}: {devices:?}");
        assert!(
            devices.iter().all(|(_, c)| *c == SHARES as u64),
            "{n}: each GPU takes {SHARES} claims: {devices:?}"
        );
    }
    let slots = (SHARES * physical) as usize;
    let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), id);
    for (app, node) in [("sliced", sliced), ("renamed", renamed)] {
        let pods = real::wait_workload(client, id, app, slots, Duration::from_secs(180)).await?;
        let mut per_device: BTreeMap<String, Vec<String>> = BTreeMap::new();
        let mut seen: BTreeMap<String, usize> = BTreeMap::new();
        for p in &pods {
            assert_eq!(p.spec.as_ref().and_then(|s| s.node_name.as_deref()), Some(node.as_str()));
            let status = p
                .status
                .as_ref()
                .and_then(|s| s.extended_resource_claim_status.as_ref())
                .ok_or_else(|| anyhow::anyhow!("{}: no generated claim", p.name_any()))?;
            let claim = claims.get(&status.resource_claim_name).await?;
            let results = claim
                .status
                .and_then(|s| s.allocation)
                .and_then(|a| a.devices)
                .and_then(|d| d.results)
                .unwrap_or_default();
            assert_eq!(results.len(), 1, "{}: one device: {results:?}", p.name_any());
            let r = &results[0];
            assert_eq!((r.driver.as_str(), r.pool.as_str()), (driver, node.as_str()), "{}", p.name_any());
            assert!(r.share_id.is_some(), "{}: a share of {}, not the whole device", p.name_any(), r.device);
            per_device.entry(r.device.clone()).or_default().push(p.name_any());
            let (_, dev) = real::what_the_container_saw(&real::logs(id, &p.name_any())?);
            assert_eq!(dev.len(), 1, "{}: the container sees one GPU: {dev:?}", p.name_any());
            let identity = real::device_node(&dev[0])
                .ok_or_else(|| anyhow::anyhow!("{}: not a device node line: {:?}", p.name_any(), dev[0]))?;
            *seen.entry(identity).or_default() += 1;
        }
        assert_eq!(per_device.len() as i64, physical, "{app}: both GPUs serve: {per_device:?}");
        assert!(
            per_device.values().all(|c| c.len() == SHARES as usize),
            "{app}: {SHARES} claims per GPU: {per_device:?}"
        );
        assert!(
            seen.values().all(|c| *c == SHARES as usize),
            "{app}: each GPU in {SHARES} containers: {seen:?}"
        );
    }
    Ok(())
}

/// Waits until the migration's PrerequisitesMet is True, failing at once on
/// `GpuSharingNotAcknowledged`, and checks that it and `switchyard plan` say the slots of both
/// resources are kept.
async fn slots_kept(migrations: &Api<GpuPoolMigration>, id: &str, slots: usize) -> anyhow::Result<()> {
    let (status, reason, message) =
        wait::until("PrerequisitesMet judged with the pool's sharing", Duration::from_secs(120), || {
            let migrations = migrations.clone();
            async move {
                let g = migrations.get(id).await?;
                let Some(p) = prerequisites(&g) else { return Ok(None) };
                anyhow::ensure!(p.1 != "GpuSharingNotAcknowledged", "the shares were not counted: {}", p.2);
                Ok((p.0 == "True").then_some(p))
            }
        })
        .await?;
    assert_eq!(status, "True", "{reason}: {message}");
    for want in [
        format!(
            "{GPU} time-sliced 2x -> {SHARES} shares per GPU (spec.driver.sharesPerDevice): no loss, {slots} pods' slots before and after on 1 node(s)"
        ),
        format!("{SHARED} time-sliced 2x -> {SHARES} shares per GPU"),
    ] {
        assert!(message.contains(&want), "no {want:?} in {message}");
    }
    let (code, report) = plan(id)?;
    let said = report["prerequisites"]["message"].to_string();
    assert!(
        said.contains(&format!("{GPU} time-sliced 2x -> {SHARES} shares per GPU")),
        "plan ({code}): {said}"
    );
    assert!(!report["blockers"].to_string().contains("capacity drops"), "{}", report["blockers"]);
    Ok(())
}

/// How many claims per GPU the agent publishes in [`keeps_slots`]: as many as the chart's
/// time-slicing replicas.
const SHARES: i64 = 2;

/// The same two nodes, with Switchyard's agent sharing each GPU 2 ways (the node label
/// `switchyard.dev/gpu-shares`) and the migration saying so (`spec.driver.sharesPerDevice: 2`):
/// nothing to acknowledge, 4 pods on each node before and after, each through a generated claim
/// holding a share of one of the node's 2 GPUs and never a third claim on one GPU, a 5th pod left
/// Pending by the shares, no node served by both backends; a rollback gives the device plugin's 4
/// slots back.
async fn keeps_slots(client: &Client, id: &str, names: &[String]) -> anyhow::Result<()> {
    let Shared { sliced, renamed, pool, physical, node_api, .. } =
        set_up(client, id, names, json!({LABEL_GPU_SHARES: SHARES.to_string()}), None).await?;
    let slots = (SHARES * physical) as usize;
    cluster::create_namespace(client, id).await?;
    real::gpu_workload_of(client, id, "sliced", slots as i32, Some(&sliced), GPU).await?;
    real::gpu_workload_of(client, id, "renamed", slots as i32, Some(&renamed), SHARED).await?;
    real::wait_workload(client, id, "sliced", slots, Duration::from_secs(120)).await?;
    real::wait_workload(client, id, "renamed", slots, Duration::from_secs(120)).await?;

    let samplers = [GPU, SHARED].map(|r| {
        Sampler::watch(client.clone(), id.to_owned(), DRIVER.to_owned(), id.to_owned(), r.to_owned())
    });
    let mut m = migration(id)?;
    m.spec.driver.shares_per_device = Some(SHARES as i32);
    let migrations: Api<GpuPoolMigration> = Api::all(client.clone());
    migrations.create(&PostParams::default(), &m).await?;

    // 1. Nothing to acknowledge: the condition and the plan say the slots are kept.
    slots_kept(&migrations, id, slots).await?;

    let done = reaches(&migrations, id, Phase::Completed).await?;
    assert_eq!(done.status.as_ref().map(|s| s.nodes.migrated), Some(pool.len() as i32));
    assert!(!done.spec.acknowledge.gpu_sharing_loss, "nothing was acknowledged");

    // 2. The agent publishes each GPU for 2 claims; gpus-before stays the physical GPUs. 3. The
    //    same pods per node as before, each holding a share of one of its node's GPUs.
    moved_with_shares(client, id, &node_api, (&sliced, &renamed), DRIVER, physical).await?;

    // 4. A 5th pod on the time-sliced node stays Pending: the shares are the limit.
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), id);
    let scale = |n: usize| Patch::Merge(json!({"spec": {"replicas": n}}));
    deployments.patch("sliced", &PatchParams::default(), &scale(slots + 1)).await?;
    let pending = wait::until("the 5th pod to be Unschedulable", Duration::from_secs(60), || async {
        let (ready, unscheduled) = pods_of(client, id, "sliced").await?;
        anyhow::ensure!(ready.len() <= slots, "{} pods Ready on {slots} shares", ready.len());
        let unschedulable = unscheduled.into_iter().find(|p| {
            p.status.as_ref().and_then(|s| s.conditions.as_ref()).is_some_and(|c| {
                c.iter().any(|c| c.type_ == "PodScheduled" && c.reason.as_deref() == Some("Unschedulable"))
            })
        });
        Ok(unschedulable)
    })
    .await?;
    let (ready, unscheduled) = pods_of(client, id, "sliced").await?;
    assert_eq!((ready.len(), unscheduled.len()), (slots, 1), "{} stays Pending", pending.name_any());
    deployments.patch("sliced", &PatchParams::default(), &scale(slots)).await?;

    // 5. Rolled back: the device plugin's 4 slots per node, and the pods on them.
    migrations
        .patch(id, &PatchParams::default(), &Patch::Merge(json!({"spec": {"direction": "Rollback"}})))
        .await?;
    reaches(&migrations, id, Phase::RolledBack).await?;
    real::wait_allocatable(
        client,
        std::slice::from_ref(&sliced),
        GPU,
        SHARES * physical,
        Duration::from_secs(120),
    )
    .await?;
    real::wait_allocatable(
        client,
        std::slice::from_ref(&renamed),
        SHARED,
        SHARES * physical,
        Duration::from_secs(120),
    )
    .await?;
    for app in ["sliced", "renamed"] {
        for p in real::wait_workload(client, id, app, slots, Duration::from_secs(180)).await? {
            assert!(
                p.status.as_ref().and_then(|s| s.extended_resource_claim_status.as_ref()).is_none(),
                "{}: back on the device plugin",
                p.name_any()
            );
        }
    }
    for s in samplers {
        let samples = s.stop();
        assert!(samples.events > 0, "the sampler saw the migration");
        assert!(samples.overlaps.is_empty(), "a node was served by both backends: {:?}", samples.overlaps);
    }
    Ok(())
}

/// NVIDIA's DRA driver for GPUs.
const NVIDIA_DRIVER: &str = "gpu.nvidia.com";

/// The same two nodes moved to NVIDIA's DRA driver (v0.5.0, its chart with `consumableShares: 2`
/// and its `ConsumableShares` feature gate), Switchyard without its agent: nothing to acknowledge,
/// 4 pods on each node before and after, each through a generated claim holding a share of one of
/// the node's 2 GPUs as NVIDIA's kubelet plugin prepared it, never a third claim on one GPU; the
/// sampler sees no node served by both backends.
async fn keeps_slots_on_nvidias_driver(client: &Client, id: &str, names: &[String]) -> anyhow::Result<()> {
    let Shared { sliced, renamed, pool, physical, node_api, .. } =
        set_up(client, id, names, json!({}), Some(real::SWITCHYARD_WITHOUT_AGENT_OVERLAY)).await?;
    let shares = SHARES.to_string();
    real::install_nvidia_dra_with(&[
        "--set",
        &format!("consumableShares={shares}"),
        "--set",
        "featureGates.ConsumableShares=true",
    ])?;
    for n in &pool {
        real::forget_nvidia_smi_calls(n)?;
    }
    let slots = (SHARES * physical) as usize;
    cluster::create_namespace(client, id).await?;
    real::gpu_workload_of(client, id, "sliced", slots as i32, Some(&sliced), GPU).await?;
    real::gpu_workload_of(client, id, "renamed", slots as i32, Some(&renamed), SHARED).await?;
    real::wait_workload(client, id, "sliced", slots, Duration::from_secs(120)).await?;
    real::wait_workload(client, id, "renamed", slots, Duration::from_secs(120)).await?;

    let samplers = [GPU, SHARED].map(|r| {
        Sampler::watch_driver(
            client.clone(),
            id.to_owned(),
            NVIDIA_DRIVER.to_owned(),
            NVIDIA_DRA_KUBELET_PLUGIN.to_owned(),
            id.to_owned(),
            r.to_owned(),
        )
    });
    let mut m = real::pool_migration(
        id,
        NVIDIA_DRIVER,
        NVIDIA_CLASS,
        (NVIDIA_DRA_NS, NVIDIA_DRA_KUBELET_PLUGIN),
        "Managed",
    );
    m["spec"]["resources"].as_array_mut().expect("resources").push(json!({
        "extendedResourceName": SHARED, "deviceClassName": NVIDIA_SHARED_CLASS,
        "selector": format!("device.attributes['{NVIDIA_DRIVER}'].type == 'gpu'"),
    }));
    m["spec"]["devicePlugin"] =
        json!({"daemonSet": {"namespace": NVIDIA_DEVICE_PLUGIN_NS, "name": NVIDIA_DEVICE_PLUGIN_DS}});
    m["spec"]["driver"]["sharesPerDevice"] = json!(SHARES);
    let migrations: Api<GpuPoolMigration> = Api::all(client.clone());
    migrations.create(&PostParams::default(), &serde_json::from_value(m)?).await?;
    slots_kept(&migrations, id, slots).await?;
    let done = reaches(&migrations, id, Phase::Completed).await?;
    assert_eq!(done.status.as_ref().map(|s| s.nodes.migrated), Some(pool.len() as i32));
    assert!(!done.spec.acknowledge.gpu_sharing_loss, "nothing was acknowledged");
    moved_with_shares(client, id, &node_api, (&sliced, &renamed), NVIDIA_DRIVER, physical).await?;
    // What NVIDIA's kubelet plugin asked the driver root's nvidia-smi while it prepared the shared
    // claims: nothing the mock could not answer.
    for n in &pool {
        let calls = real::nvidia_smi_calls(n)?;
        assert!(calls.iter().all(|c| c.starts_with("answered ")), "{n}: nvidia-smi was asked {calls:?}");
        eprintln!("{n}: NVIDIA's kubelet plugin ran nvidia-smi {} time(s): {calls:?}", calls.len());
    }
    for s in samplers {
        let samples = s.stop();
        assert!(samples.events > 0, "the sampler saw the migration");
        assert!(samples.overlaps.is_empty(), "a node was served by both backends: {:?}", samples.overlaps);
    }
    Ok(())
}

/// Switchyard's DeviceClasses for the two resources on NVIDIA's driver.
const NVIDIA_CLASS: &str = "gpu.nvidia.switchyard.dev";
const NVIDIA_SHARED_CLASS: &str = "gpu-shared.nvidia.switchyard.dev";

/// [`cleanup`] after [`keeps_slots_on_nvidias_driver`]: the workload first (a DRA plugin must
/// outlive the pods whose claims it prepared), then NVIDIA's DRA driver and Switchyard without
/// its agent, then what [`cleanup`] removes.
async fn cleanup_nvidia(client: &Client, id: &str, names: &[String]) -> anyhow::Result<()> {
    let mut first = Ok(());
    let mut keep = |r: anyhow::Result<()>| {
        if first.is_ok() {
            first = r;
        }
    };
    keep(real::delete_migration(client, id).await);
    keep(real::delete_namespace(client, id).await);
    keep(real::uninstall_nvidia_dra());
    let classes: Api<DeviceClass> = Api::all(client.clone());
    for class in [NVIDIA_CLASS, NVIDIA_SHARED_CLASS] {
        let _ = classes.delete(class, &DeleteParams::default()).await;
    }
    // The rest as after the other scenarios: Switchyard (its whole install, the agent-less one
    // included), NVIDIA's chart, NFD, the nodes' labels.
    keep(cleanup(client, id, names).await);
    first
}

fn diagnostics(id: &str) -> String {
    real::diagnostics(
        id,
        &[
            real::AGENT_LOGS,
            &["get", "nodes", "--show-labels"],
            &["-n", NVIDIA_DEVICE_PLUGIN_NS, "get", "nodefeatures", "-o", "yaml"],
            &[
                "-n",
                NVIDIA_DEVICE_PLUGIN_NS,
                "logs",
                "-l",
                "app.kubernetes.io/name=nvidia-device-plugin",
                "--all-containers",
                "--tail=20",
                "--prefix",
            ],
            &["-n", real::NFD_NS, "logs", "deploy/node-feature-discovery-master", "--tail=30"],
            &[
                "-n",
                NVIDIA_DRA_NS,
                "logs",
                "-l",
                "dra-driver-nvidia-gpu-component=kubelet-plugin",
                "--all-containers",
                "--tail=30",
                "--prefix",
            ],
        ],
    )
}

/// Removes what the scenarios installed, every step tried even when one before it failed (the
/// next scenario needs the nodes released), and answers the first failure.
async fn cleanup(client: &Client, id: &str, names: &[String]) -> anyhow::Result<()> {
    let mut first = Ok(());
    let mut keep = |r: anyhow::Result<()>| {
        if first.is_ok() {
            first = r;
        }
    };
    keep(real::delete_migration(client, id).await);
    keep(real::delete_namespace(client, id).await);
    keep(real::uninstall_switchyard());
    // GFD's NodeFeature objects go with the chart's namespace; nfd-master, still running, then
    // takes their labels off the nodes.
    keep(real::uninstall_nvidia_device_plugin_chart());
    let node_api: Api<Node> = Api::all(client.clone());
    keep(
        wait::until("nfd-master to take GFD's labels off", Duration::from_secs(60), || {
            let node_api = node_api.clone();
            async move {
                for n in names {
                    if !gfd_labels(&node_api.get(n).await?).is_empty() {
                        return Ok(None);
                    }
                }
                Ok(Some(()))
            }
        })
        .await,
    );
    keep(real::uninstall_nfd());
    let classes: Api<DeviceClass> = Api::all(client.clone());
    for class in [DRIVER, SHARED_CLASS] {
        let _ = classes.delete(class, &DeleteParams::default()).await;
    }
    let labels = ["pool", LABEL_GPU_PRESENT, LABEL_DEVICE_PLUGIN_CONFIG, BACKEND, LABEL_GPU_SHARES];
    keep(real::release_nodes(client, names, &labels).await);
    first
}
