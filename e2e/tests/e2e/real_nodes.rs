//! A pool of real nodes (kubelet v1.37.2 and containerd 2.4 each, `e2e/hack/nodes-up.sh`) moves
//! from NVIDIA's device plugin (k8s-device-plugin v0.19.3, built from its module) to Switchyard's
//! DRA driver, with Switchyard installed
//! from config/ as a cluster admin installs it: the operator as its two-replica Deployment with its
//! own ServiceAccount, the agent as its DaemonSet, both from the images built by
//! `e2e/hack/build-images.sh`. A verb missing from a ClusterRole fails this scenario.
//!
//! Only the GPUs are fake: each node's driver root holds the NVML mock as libnvidia-ml.so.1 and
//! device nodes made with mknod, which NVIDIA's plugin and the agent (`--inventory nvml`) load and
//! read alike.
//!
//! What it shows, all through the real kubelet, device manager, DRA manager, containerd and runc:
//! - first: NVIDIA's plugin on a node whose driver is not loaded (NVML init fails) runs and
//!   advertises nothing, and `switchyard plan` names that node as a blocker before anything moves;
//! - before: GPU pods get their devices from NVIDIA's device plugin (`NVIDIA_VISIBLE_DEVICES` from
//!   its Allocate, /dev/nvidia<N> from its device specs, under the driver root), no claim;
//! - the leader pod is deleted mid-migration and the standby finishes the work;
//! - then, still mid-migration, `kubectl drain` of the new leader's node completes (the Ready
//!   standby lets the operator's PodDisruptionBudget allow it), the standby takes over, and the
//!   migration completes with the admin's cordon kept and not counted against maxUnavailable;
//! - after: the same pod spec runs with a claim that the scheduler generated; the kubelet called
//!   NodePrepareResources (our CDI spec is on the node while the pod runs) and the container got
//!   the UUIDs and device nodes of that spec; allocatable nvidia.com/gpu fell to 0 through the
//!   kubelet's device manager;
//! - the agent's slices carry what NVML (the mock) reports: UUIDs, product name, memory; an XID 79
//!   raised in the mock becomes a NoSchedule device taint, the lost GPU that follows another, and
//!   both go once the GPU answers again and the hold has passed;
//! - a DaemonSet pod holding a device-plugin GPU on every node (a node agent) holds each switch
//!   until the plugin has left; then, with `evictDaemonSetGpuPods`, it is evicted and its
//!   replacement gets a GPU through DRA, a different one from the trainer's on the same node
//!   (no GPU handed out twice, as the containers' UUIDs show);
//! - every GPU pod on the migrated nodes is verified by the operator (`status.pods`);
//! - a rollback of one node (a one-node migration with `direction: Rollback`) returns it to the
//!   device plugin: allocatable comes back, and a GPU pod there runs without a claim;
//! - `strategy.type: Replace`: the rolled-back node's GPU pod is drained onto the nodes on DRA, as
//!   onto a provider's new node pool, and comes back there through a claim and our CDI spec; the
//!   node is left cordoned and labelled `switchyard.dev/replaced`;
//! - no instant, sampled on every watch event, where a node was served by both backends.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::{Api, Client, ResourceExt};
use serde_json::json;
use switchyard_e2e::pool::{DRIVER_DS, Sampler, allocatable};
use switchyard_e2e::real::{self, LABEL_GPU_PRESENT, SYSTEM_NS};
use switchyard_e2e::{cluster, wait};
use switchyard_operator::api::v1alpha1::{GpuPoolMigration, Phase};

const DRIVER: &str = "gpu.switchyard.dev";
const GPU: &str = "nvidia.com/gpu";
const APP: &str = "trainer";
/// A node agent that holds a GPU on every node, as a DaemonSet.
const AGENT_APP: &str = "node-agent";

fn uuids_in_inventory() -> BTreeSet<String> {
    real::gpu_uuids()
}

#[tokio::test]
async fn real_pool_moves_from_the_device_plugin_to_dra_with_the_packaged_operator() -> anyhow::Result<()> {
    real::alone_on_real_nodes("real", scenario, diagnostics, cleanup).await
}

/// The agent discovered each node's GPUs through NVML, that is through the mock's C functions:
/// the slices carry the mock's UUIDs, product name and memory, and nothing else.
async fn slices_carry_what_nvml_reports(client: &Client, names: &[String]) -> anyhow::Result<()> {
    let slices: Api<ResourceSlice> = Api::all(client.clone());
    let want: BTreeMap<String, (String, String)> = real::node_gpus()
        .into_iter()
        .map(|g| (g.uuid, (g.name, format!("{}Ki", g.memory_bytes / 1024))))
        .collect();
    for node in names {
        let list = slices.list(&ListParams::default().fields(&format!("spec.nodeName={node}"))).await?.items;
        let mut seen = BTreeMap::new();
        for d in list
            .iter()
            .filter(|s| s.spec.driver == DRIVER)
            .flat_map(|s| s.spec.devices.clone().unwrap_or_default())
        {
            let attr = |k: &str| d.attributes.as_ref().and_then(|a| a.get(k)).and_then(|v| v.string.clone());
            let memory = d.capacity.as_ref().and_then(|c| c.get("memory")).map(|m| m.value.0.clone());
            let uuid = attr("uuid").unwrap_or_default();
            let memory = memory.map(|m| normalise_bytes(&m)).unwrap_or_default();
            seen.insert(uuid, (attr("productName").unwrap_or_default(), memory));
        }
        let want: BTreeMap<String, (String, String)> =
            want.iter().map(|(u, (n, m))| (u.clone(), (n.clone(), normalise_bytes(m)))).collect();
        assert_eq!(seen, want, "{node}: the slices' GPUs are the NVML mock's");
    }
    Ok(())
}

/// A quantity in bytes, whatever suffix it was written with (`80Gi`, `83516416Ki`).
fn normalise_bytes(q: &str) -> String {
    let (digits, unit) = q.split_at(q.find(|c: char| !c.is_ascii_digit()).unwrap_or(q.len()));
    let factor: u64 = match unit {
        "" => 1,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "Ti" => 1 << 40,
        other => panic!("unexpected quantity suffix {other} in {q}"),
    };
    (digits.parse::<u64>().unwrap_or_default() * factor).to_string()
}

/// The most an XID raised in the mock may take to become a device taint in the node's slice. The
/// agent blocks in `nvmlEventSetWait`, so it wakes at once, and the taint is one slice write;
/// measured 0.26 s on the real nodes (docs/e2e.md). The bound leaves room for a loaded 2-core
/// CI machine and this check's own 250 ms polling, and still fails a path that waits for the
/// agent's 10 s probe instead of the event.
const XID_TO_TAINT: Duration = Duration::from_secs(3);

/// An XID 79 (the GPU fell off the bus: critical) raised in the mock reaches the agent through
/// `nvmlEventSetWait`, and the device gets a NoSchedule `xid` taint in its slice; the GPU then
/// stops answering (lost), which the agent's probe finds and taints too. A critical fault holds
/// the device out until the GPU answers cleanly again: once the mock recovers it, the taints go
/// after the hold (5 s in e2e/overlays/real-nodes).
async fn an_xid_in_the_mock_taints_the_device_until_it_recovers(
    client: &Client,
    node: &str,
) -> anyhow::Result<()> {
    let slices: Api<ResourceSlice> = Api::all(client.clone());
    let uuid = real::node_gpus()[0].uuid.clone();
    let taints_of = move |list: Vec<ResourceSlice>| -> Vec<(String, String, Option<String>)> {
        list.into_iter()
            .filter(|s| s.spec.driver == DRIVER)
            .flat_map(|s| s.spec.devices.unwrap_or_default())
            .filter(|d| {
                d.attributes.as_ref().and_then(|a| a.get("uuid")).and_then(|v| v.string.as_deref())
                    == Some(uuid.as_str())
            })
            .flat_map(|d| d.taints.unwrap_or_default())
            .filter(|t| t.key.starts_with(&format!("{DRIVER}/")))
            .map(|t| (t.key, t.effect, t.value))
            .collect()
    };
    let on_node = ListParams::default().fields(&format!("spec.nodeName={node}"));
    let taints = || {
        let (slices, on_node, taints_of) = (slices.clone(), on_node.clone(), taints_of.clone());
        async move { anyhow::Ok(taints_of(slices.list(&on_node).await?.items)) }
    };
    anyhow::ensure!(taints().await?.is_empty(), "{node}: tainted before the fault: {:?}", taints().await?);
    let key = |suffix: &str| format!("{DRIVER}/{suffix}");
    let uuid = &real::node_gpus()[0].uuid;
    let raised = std::time::Instant::now();
    real::raise_gpu_fault(node, uuid, "xid", 79)?;
    let xid = key(switchyard_operator::well_known::TAINT_KEY_XID);
    let got = wait::until(&format!("{node}: the XID to taint its GPU"), Duration::from_secs(30), || async {
        Ok(taints().await?.into_iter().find(|t| t.0 == xid))
    })
    .await?;
    let took = raised.elapsed();
    eprintln!("{node}: XID 79 in the NVML mock to a device taint in {took:.2?}");
    assert_eq!(got, (xid.clone(), "NoSchedule".to_string(), Some("79".to_string())));
    assert!(
        took < XID_TO_TAINT,
        "{node}: the XID took {took:.2?} to become a taint, past the {XID_TO_TAINT:?} docs/e2e.md promises"
    );
    real::raise_gpu_fault(node, uuid, "lost", 0)?;
    let lost = key(switchyard_operator::well_known::TAINT_KEY_GPU_LOST);
    wait::until(&format!("{node}: the lost GPU to be tainted"), Duration::from_secs(60), || async {
        Ok(taints().await?.iter().any(|t| t.0 == lost && t.1 == "NoSchedule").then_some(()))
    })
    .await?;
    // Lost and XID alike hold the device out while it does not answer: beyond the hold, both stay.
    // Checked throughout 8 s, past the 5 s hold.
    wait::holds_for(&format!("{node}: the XID and lost taints to stay"), Duration::from_secs(8), || async {
        let held = taints().await?;
        anyhow::ensure!(
            held.iter().any(|t| t.0 == xid) && held.iter().any(|t| t.0 == lost),
            "{node}: {held:?}"
        );
        Ok(())
    })
    .await?;
    real::raise_gpu_fault(node, uuid, "recover", 0)?;
    wait::until(
        &format!("{node}: the taints to go once the GPU answers again"),
        Duration::from_secs(60),
        || async { Ok(taints().await?.is_empty().then_some(())) },
    )
    .await?;
    Ok(())
}

/// The migration of the scenario's pool, in place, to Switchyard's driver.
fn pool_migration(id: &str) -> anyhow::Result<GpuPoolMigration> {
    let mut m = real::pool_migration(id, DRIVER, DRIVER, (SYSTEM_NS, "switchyard-driver-agent"), "Managed");
    m["spec"]["strategy"]["drain"]["evictDaemonSetGpuPods"] = json!(true);
    Ok(serde_json::from_value(m)?)
}

/// NVIDIA's device plugin failing on one node, as on a node whose driver is not loaded: its NVML
/// init fails there (the mock without its inventory answers `NVML_ERROR_DRIVER_NOT_LOADED`), and
/// the plugin, told not to fail on init errors as NVIDIA's manifest tells it, runs and advertises
/// nothing. `switchyard plan` names the node before anything moves, rather than the migration
/// finding out as a node waiting cordoned. The driver comes back, the plugin pod is restarted, and
/// the node serves its GPUs again.
async fn a_device_plugin_without_nvml_is_named_by_the_plan(
    client: &Client,
    id: &str,
    names: &[String],
    node: &str,
) -> anyhow::Result<()> {
    // The others serve their GPUs first, so the plan judges every node as it stands.
    let node_api: Api<Node> = Api::all(client.clone());
    let gpus_per_node = uuids_in_inventory().len() as i64;
    wait::until(
        "NVIDIA's device plugin to serve the nodes whose driver is loaded",
        Duration::from_secs(120),
        || {
            let node_api = node_api.clone();
            async move {
                for n in names.iter().filter(|n| *n != node) {
                    if allocatable(&node_api.get(n).await?, GPU) != gpus_per_node {
                        return Ok(None);
                    }
                }
                Ok(Some(()))
            }
        },
    )
    .await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "kube-system");
    let on_node =
        ListParams::default().labels("name=nvidia-device-plugin-ds").fields(&format!("spec.nodeName={node}"));
    let running =
        wait::until(&format!("NVIDIA's device plugin to run on {node}"), Duration::from_secs(120), || {
            let (pods, on_node) = (pods.clone(), on_node.clone());
            async move {
                let list = pods.list(&on_node).await?.items;
                Ok(list
                    .into_iter()
                    .find(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")))
            }
        })
        .await?;
    let plugin = running.name_any();
    wait::until(&format!("{plugin} to log that it found no device"), Duration::from_secs(60), || async {
        // `kubectl logs` fails while the kubelet cannot serve the log yet: not yet, reported at the
        // timeout.
        let logs = real::kubectl(&["-n", "kube-system", "logs", &plugin]).map_err(wait::not_yet)?;
        Ok(logs.contains("No devices found").then_some(()))
    })
    .await?;
    // The plan reads the node's status: on a node a device plugin served until moments ago (the
    // scenario before this one), the kubelet reports the GPUs gone at its next status update.
    real::wait_allocatable(client, std::slice::from_ref(&node.to_string()), GPU, 0, Duration::from_secs(60))
        .await?;
    let (code, report) = real::plan_manifest(id, &pool_migration(id)?)?;
    assert_eq!(code, 2, "the plan finds a blocker (exit 2): {report}");
    let blockers: Vec<&str> =
        report["blockers"].as_array().into_iter().flatten().filter_map(|b| b.as_str()).collect();
    // On a fresh node "advertises nothing (": the plugin never registered; on a node it served
    // before, "advertises nothing allocatable (": the kubelet keeps the old capacity.
    let want = format!("the device plugin on {node} advertises nothing");
    assert!(blockers.iter().any(|b| b.starts_with(&want)), "{want}: {blockers:?}");
    let plan_node = report["nodes"].as_array().into_iter().flatten().find(|n| n["name"] == node).cloned();
    let note = plan_node.as_ref().and_then(|n| n["note"].as_str()).unwrap_or_default();
    assert!(note.contains("advertises nothing"), "{node}'s note: {plan_node:?}");
    Ok(())
}

/// What a failed run leaves to read: the migration, the pods and the operator's and agents' logs.
fn diagnostics(id: &str) -> String {
    real::diagnostics(id, &[real::AGENT_LOGS])
}

/// `kubectl cordon` of `node` by an admin who wants the cordon to outlive the migration, as the
/// README says to do it. A cordon of a node Switchyard holds cordoned mid-move changes nothing in
/// the API, so Switchyard cannot see it; the admin then also sets
/// `switchyard.dev/initially-unschedulable=true` (with the resourceVersion read, so a step that
/// lands in between is seen and decided again). A node not started yet, or already moved, needs
/// only the cordon: Switchyard records it when it starts the node, or never touches it again.
async fn admin_cordon(nodes: &Api<Node>, node: &str) -> anyhow::Result<()> {
    use switchyard_operator::well_known::{ANNOTATION_INITIALLY_UNSCHEDULABLE, ANNOTATION_MIGRATION_STATE};
    real::kubectl(&["cordon", node])?;
    for _ in 0..20 {
        let n = nodes.get(node).await?;
        if n.spec.as_ref().and_then(|s| s.unschedulable) != Some(true) {
            // Switchyard finished the node's move (and uncordoned it) in between: cordon again.
            real::kubectl(&["cordon", node])?;
            continue;
        }
        let state = n.annotations().get(ANNOTATION_MIGRATION_STATE).map(String::as_str).unwrap_or_default();
        let mid_move = ["Cordoned", "Draining", "Switching", "Verifying", "RollingBack"].contains(&state);
        if !mid_move
            || n.annotations().get(ANNOTATION_INITIALLY_UNSCHEDULABLE).map(String::as_str) == Some("true")
        {
            return Ok(());
        }
        let patch = json!({"metadata": {"resourceVersion": n.resource_version(),
            "annotations": {ANNOTATION_INITIALLY_UNSCHEDULABLE: "true"}}});
        match nodes.patch(node, &kube::api::PatchParams::default(), &kube::api::Patch::Merge(&patch)).await {
            Ok(_) => return Ok(()),
            Err(kube::Error::Api(e)) if e.code == 409 => continue,
            Err(e) => return Err(e.into()),
        }
    }
    anyhow::bail!("could not cordon {node} for good in 20 tries")
}

/// The operator's ServiceAccount, as the audit log names it.
const OPERATOR_USER: &str = "system:serviceaccount:switchyard-system:switchyard-operator";

/// Grants of the packaged operator role that this scenario does not exercise, and why each is
/// still needed. Everything else the role grants must show up in the audit log of the run.
const NOT_EXERCISED_HERE: [(&str, &str, &str, &str); 13] = [
    (
        "resource.k8s.io",
        "resourceclaims",
        "get",
        "observe::claims_held reads the claims of a rolling-back node's pods that hold one; the GPU workloads here have finished by the rollback (migration.rs's rollback scenarios read them, with admin credentials)",
    ),
    (
        "resource.k8s.io",
        "resourceclaims",
        "list",
        "observe::claims_of lists every claim when a check of migrated nodes' pods has more new claims to read than the last such LIST took pages (4 before the first); whether one check here sees that many pods at once is timing (bench-scale's wide migration lists them)",
    ),
    (
        "resource.k8s.io",
        "devicetaintrules",
        "list",
        "observe::returns lists a Replace migration's fences on its target nodes while it rolls back; this scenario's Replace migration only goes forward (migration.rs's Replace rollback lists them, with admin credentials)",
    ),
    (
        "resource.k8s.io",
        "devicetaintrules",
        "patch",
        "a rollback turns its rule NoExecute only past a PodDisruptionBudget under drain.rollbackEvictsPastBudgets, and only where the controller manager shows v1.37.2 or later (this control plane hides its version: node::state's unit tests)",
    ),
    (
        "",
        "pods",
        "delete",
        "a rollback deletes the holders past a PodDisruptionBudget under drain.rollbackEvictsPastBudgets where the controller manager's device-taint eviction may miss them (migration/rollback.rs's rollback scenario, with admin credentials)",
    ),
    (
        "events.k8s.io",
        "events",
        "patch",
        "kube's Recorder patches an event that repeats within its series window; whether one repeats is timing",
    ),
    (
        "",
        "nodes",
        "get",
        "observe::cached_pool_nodes reads a node when its cache lags the operator's own patch",
    ),
    (
        "resource.k8s.io",
        "deviceclasses",
        "create",
        "the DRAExtendedResource dry-run probe, run only against a 1.36 API server",
    ),
    (
        "",
        "configmaps",
        "get",
        "observe::plugin_config reads the device plugin's config where its DaemonSet mounts one from a ConfigMap; the device plugin here takes no config file (migration.rs's sharing_in_the_device_plugins_config_... reads one, with admin credentials)",
    ),
    ("kueue.x-k8s.io", "clusterqueues", "list", "the inventory lists Kueue objects where Kueue is installed"),
    (
        "kueue.x-k8s.io",
        "resourceflavors",
        "list",
        "the inventory lists Kueue objects where Kueue is installed",
    ),
    (
        "karpenter.sh",
        "nodepools",
        "list",
        "the inventory lists Karpenter NodePools where Karpenter is installed",
    ),
    (
        "monitoring.coreos.com",
        "prometheusrules",
        "list",
        "the inventory lists PrometheusRules where the Prometheus Operator is installed",
    ),
];

/// Least privilege, from both sides: every request the operator made with its own ServiceAccount
/// (the API server's audit log, `from` to now) is one its packaged ClusterRole or Role grants, and
/// every grant was used, or is listed in [`NOT_EXERCISED_HERE`] with the code path that needs it.
async fn operator_rbac_is_what_it_uses(client: &Client, from: &str) -> anyhow::Result<()> {
    use k8s_openapi::api::rbac::v1::{ClusterRole, PolicyRule, Role};
    let log = cluster::kubeconfig().parent().unwrap_or(std::path::Path::new(".")).join("logs/audit.log");
    let used = switchyard_e2e::measure::requests_of_user(
        &log,
        OPERATOR_USER,
        from,
        &switchyard_e2e::measure::now(),
    )?;
    let cluster_role = Api::<ClusterRole>::all(client.clone()).get("switchyard-operator").await?;
    let role = Api::<Role>::namespaced(client.clone(), SYSTEM_NS).get("switchyard-operator").await?;
    let flatten = |rules: &[PolicyRule]| -> BTreeSet<(String, String, String)> {
        let mut out = BTreeSet::new();
        for r in rules {
            for g in r.api_groups.iter().flatten() {
                for res in r.resources.iter().flatten() {
                    for v in &r.verbs {
                        out.insert((g.clone(), res.clone(), v.clone()));
                    }
                }
            }
        }
        out
    };
    let granted: BTreeSet<_> = flatten(cluster_role.rules.as_deref().unwrap_or_default())
        .into_iter()
        .chain(flatten(role.rules.as_deref().unwrap_or_default()))
        .collect();
    assert!(!used.is_empty(), "no operator request in {} since {from}", log.display());
    let ungranted: Vec<_> = used.iter().filter(|(k, _)| !granted.contains(*k)).collect();
    assert!(ungranted.is_empty(), "the operator made requests its role does not grant: {ungranted:?}");
    let exempt: BTreeSet<(String, String, String)> =
        NOT_EXERCISED_HERE.iter().map(|(g, r, v, _)| (g.to_string(), r.to_string(), v.to_string())).collect();
    let stale: Vec<_> = exempt.difference(&granted).collect();
    assert!(stale.is_empty(), "NOT_EXERCISED_HERE lists what the role no longer grants: {stale:?}");
    let unused: Vec<_> = granted.iter().filter(|k| !used.contains_key(*k) && !exempt.contains(*k)).collect();
    assert!(
        unused.is_empty(),
        "the role grants what the operator never used here: {unused:?}; used: {:?}",
        used.keys()
    );
    // A 403 on a granted request is the authorizer catching up with a new binding; say so.
    for (k, codes) in &used {
        if codes.contains(&403) {
            eprintln!("note: {k:?} was refused (403) at least once before it was allowed: {codes:?}");
        }
    }
    Ok(())
}

async fn scenario(client: &Client, id: &str, names: &[String]) -> anyhow::Result<()> {
    let started = switchyard_e2e::measure::now();
    let gpus_per_node = uuids_in_inventory().len() as i64;
    for n in names {
        real::label(client, n, json!({"pool": id, LABEL_GPU_PRESENT: "true"})).await?;
    }
    // One node's driver fails NVML until the plan has named it.
    let no_driver = &names[names.len() - 1];
    real::unload_driver(no_driver)?;
    real::install_device_plugin()?;
    real::install_switchyard(client).await?;
    a_device_plugin_without_nvml_is_named_by_the_plan(client, id, names, no_driver).await?;
    real::load_driver(no_driver)?;
    real::kubectl(&[
        "-n",
        "kube-system",
        "delete",
        "pod",
        "-l",
        "name=nvidia-device-plugin-ds",
        "--field-selector",
        &format!("spec.nodeName={no_driver}"),
    ])?;

    // The kubelet's device manager, not the test, turns the plugin's devices into allocatable.
    let node_api: Api<Node> = Api::all(client.clone());
    real::wait_allocatable(client, names, GPU, gpus_per_node, Duration::from_secs(120)).await?;

    cluster::create_namespace(client, id).await?;
    real::gpu_workload(client, id, APP, names.len() as i32, None).await?;
    real::gpu_daemon_set(client, id, AGENT_APP, id).await?;
    let before = real::wait_workload(client, id, APP, names.len(), Duration::from_secs(120)).await?;
    let agents_before =
        real::wait_workload(client, id, AGENT_APP, names.len(), Duration::from_secs(120)).await?;
    for p in &agents_before {
        let (visible, _) = real::what_the_container_saw(&real::logs(id, &p.name_any())?);
        assert!(
            uuids_in_inventory().contains(&visible),
            "{}: a device-plugin GPU, got {visible:?}",
            p.name_any()
        );
    }
    let inventory = uuids_in_inventory();
    for p in &before {
        let logs = real::logs(id, &p.name_any())?;
        let (visible, gpus) = real::what_the_container_saw(&logs);
        assert!(
            inventory.contains(&visible),
            "{}: the device plugin's Allocate sets one inventory UUID, got {visible:?}\n{logs}",
            p.name_any()
        );
        assert_eq!(
            gpus.len(),
            1,
            "{}: one GPU device node from the plugin's device specs\n{logs}",
            p.name_any()
        );
        assert!(
            p.status.as_ref().and_then(|s| s.extended_resource_claim_status.as_ref()).is_none(),
            "{}: a device-plugin pod has no generated claim",
            p.name_any()
        );
    }

    let sampler = Sampler::watch_containers(
        client.clone(),
        id.to_owned(),
        DRIVER.to_owned(),
        DRIVER_DS.to_owned(),
        id.to_owned(),
        switchyard_operator::well_known::NVIDIA_GPU_RESOURCE.to_owned(),
    );
    let migrations: Api<GpuPoolMigration> = Api::all(client.clone());
    let gpm = pool_migration(id)?;
    migrations.create(&PostParams::default(), &gpm).await?;

    // Leader loss mid-migration: once the first node has moved, delete the leader's pod (a normal,
    // graceful delete, as a rollout or a node drain does). The standby must take the Lease and
    // finish; everything it needs is in the API.
    let status = |g: &GpuPoolMigration| g.status.clone().unwrap_or_default();
    wait::until("the first node to be migrated", Duration::from_secs(300), || {
        let migrations = migrations.clone();
        async move { Ok((status(&migrations.get(id).await?).nodes.migrated >= 1).then_some(())) }
    })
    .await?;
    let old_leader = real::leader(client, Duration::from_secs(30)).await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), SYSTEM_NS);
    pods.delete(&old_leader.name_any(), &DeleteParams::default()).await?;
    let new_leader = real::leader(client, Duration::from_secs(90)).await?;
    assert_ne!(new_leader.name_any(), old_leader.name_any(), "another replica holds the Lease");

    // `kubectl drain` of the new leader's node, mid-migration, as an admin drains a node for
    // maintenance. The operator's PodDisruptionBudget (maxUnavailable 1) lets the leader go only
    // once the replacement of the deleted pod is Ready as a standby; kubectl retries until then.
    // The standby takes the Lease; the migration goes on with the node cordoned by the admin.
    let leader_node = new_leader.spec.as_ref().and_then(|s| s.node_name.clone()).unwrap_or_default();
    admin_cordon(&node_api, &leader_node).await?;
    let phase_at_cordon = status(&migrations.get(id).await?).phase;
    assert_ne!(phase_at_cordon, Some(Phase::Completed), "the drain must land mid-migration");
    real::kubectl(&[
        "drain",
        &leader_node,
        "--ignore-daemonsets",
        "--delete-emptydir-data",
        "--timeout=240s",
    ])?;
    let next = real::leader(client, Duration::from_secs(90)).await?;
    assert_ne!(next.name_any(), new_leader.name_any(), "the standby took over from the drained leader");
    assert_ne!(next.spec.as_ref().and_then(|s| s.node_name.as_deref()), Some(leader_node.as_str()));

    let done = wait::until("the migration to complete", Duration::from_secs(420), || {
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
    // The admin's cordon outlives the migration, and did not hold the budget: the pool finished.
    let drained = node_api.get(&leader_node).await?;
    assert_eq!(drained.spec.as_ref().and_then(|s| s.unschedulable), Some(true), "the admin's cordon stays");
    real::kubectl(&["uncordon", &leader_node])?;

    // Allocatable through the kubelet's own device manager: the plugin pod left each node.
    real::wait_allocatable(client, names, GPU, 0, Duration::from_secs(60)).await?;

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
            .unwrap_or_else(|| {
                panic!("{name}: the scheduler generated no claim for the plain nvidia.com/gpu limit")
            });
        let claim = claims.get(&claim_name).await?;
        let uid = claim.uid().unwrap_or_default();
        let allocation = claim.status.as_ref().and_then(|s| s.allocation.as_ref()).expect("allocated claim");
        let results = allocation.devices.as_ref().and_then(|d| d.results.clone()).unwrap_or_default();
        assert_eq!(results.len(), 1, "{name}: one device");
        assert_eq!(results[0].driver, DRIVER);
        assert_eq!(results[0].pool, node, "{name}: the device comes from its own node's slice");
        // NodePrepareResources ran on that node's kubelet: the agent wrote the claim's CDI spec
        // into the node's CDI directory, where containerd read it.
        let spec_path = real::node_dir(&node).join("cdi").join(format!("gpu-switchyard-dev-{uid}.json"));
        let spec: serde_json::Value = serde_json::from_slice(&std::fs::read(&spec_path).map_err(|e| {
            anyhow::anyhow!(
                "{name}: no CDI spec at {} ({e}): NodePrepareResources did not run",
                spec_path.display()
            )
        })?)?;
        let logs = real::logs(id, &name)?;
        let (visible, gpus) = real::what_the_container_saw(&logs);
        let spec_env = spec["containerEdits"]["env"][0].as_str().unwrap_or_default().to_owned();
        assert_eq!(
            format!("NVIDIA_VISIBLE_DEVICES={visible}"),
            spec_env,
            "{name}: the env comes from our CDI spec\n{logs}"
        );
        assert!(inventory.contains(&visible), "{name}: {visible:?} is a GPU of the inventory");
        let spec_node = &spec["devices"][0]["containerEdits"]["deviceNodes"][0];
        let path = spec_node["path"].as_str().unwrap_or_default();
        assert_eq!(gpus.len(), 1, "{name}: one GPU device node\n{logs}");
        assert!(gpus[0].ends_with(path), "{name}: the container has {path} from the spec\n{logs}");
        // The spec names the node's own device node under the driver root (--dev-root); containerd
        // read its type and numbers there: the character device 195:N that nodes-up.sh made.
        assert_eq!(
            spec_node["hostPath"].as_str(),
            Some(format!("/run/nvidia/driver{path}").as_str()),
            "{name}: {spec_node}"
        );
        assert!(gpus[0].starts_with('c') && gpus[0].contains("195,"), "{name}: {:?} is char 195:N", gpus[0]);
    }
    slices_carry_what_nvml_reports(client, names).await?;
    an_xid_in_the_mock_taints_the_device_until_it_recovers(client, &names[names.len() - 1]).await?;

    // The node agents came back through DRA, each on a GPU of its own: not the trainer's.
    let agents = real::wait_workload(client, id, AGENT_APP, names.len(), Duration::from_secs(180)).await?;
    let trainers_by_node: std::collections::BTreeMap<String, String> = after
        .iter()
        .map(|p| {
            let node = p.spec.as_ref().and_then(|s| s.node_name.clone()).unwrap_or_default();
            Ok((node, real::what_the_container_saw(&real::logs(id, &p.name_any())?).0))
        })
        .collect::<anyhow::Result<_>>()?;
    for p in &agents {
        let name = p.name_any();
        let node = p.spec.as_ref().and_then(|s| s.node_name.clone()).unwrap_or_default();
        assert!(
            p.status.as_ref().and_then(|s| s.extended_resource_claim_status.as_ref()).is_some(),
            "{name}: the DaemonSet pod on {node} was not replaced through DRA"
        );
        let (visible, _) = real::what_the_container_saw(&real::logs(id, &name)?);
        assert!(inventory.contains(&visible), "{name}: {visible:?} is a GPU of the inventory");
        if let Some(trainer) = trainers_by_node.get(&node) {
            assert_ne!(
                &visible, trainer,
                "{name}: {node} handed {visible} to the trainer and the node agent both"
            );
        }
    }
    // The operator verified every GPU pod on the migrated nodes, trainers and node agents.
    let checked = wait::until("status.pods to count every GPU pod", Duration::from_secs(120), || {
        let migrations = migrations.clone();
        let want = (after.len() + agents.len()) as i32;
        async move {
            let pods = status(&migrations.get(id).await?).pods;
            Ok(pods.filter(|p| p.verified == want))
        }
    })
    .await?;
    assert_eq!(checked.unverified, 0, "{checked:?}");

    // The node agents go before the rollback: this scenario's rollback is the trainers'.
    real::kubectl(&["-n", id, "delete", "daemonset", AGENT_APP, "--wait=true", "--timeout=120s"])?;
    wait::until("the node agents' pods to be gone", Duration::from_secs(120), || {
        let pods: Api<Pod> = Api::namespaced(client.clone(), id);
        async move {
            let left = pods.list(&ListParams::default().labels(&format!("app={AGENT_APP}"))).await?.items;
            Ok(left.is_empty().then_some(()))
        }
    })
    .await?;

    a_gpu_pod_that_cannot_start_is_reported(client, id).await?;

    // Rollback of one node: the admin hands the pool migration back (deleting it keeps the nodes
    // on DRA) and moves one node back to the device plugin with a migration of its own. Its
    // claim holders are evicted while its driver still runs; the device plugin serves it again.
    migrations.delete(id, &DeleteParams::default()).await?;
    wait::until("the pool migration to be deleted", Duration::from_secs(120), || {
        let migrations = migrations.clone();
        async move { Ok(migrations.get_opt(id).await?.is_none().then_some(())) }
    })
    .await?;
    let back = names[0].clone();
    let back_id = format!("{id}-back");
    let mut one: serde_json::Value = serde_json::to_value(&gpm)?;
    one["metadata"] = json!({"name": back_id});
    one["spec"]["nodeSelector"] = json!({"matchLabels": {"pool": id, "kubernetes.io/hostname": back}});
    one["spec"]["direction"] = json!("Rollback");
    migrations.create(&PostParams::default(), &serde_json::from_value(one)?).await?;
    let rolled = wait::until("the one-node rollback to finish", Duration::from_secs(300), || {
        let migrations = migrations.clone();
        let back_id = back_id.clone();
        async move {
            let g = migrations.get(&back_id).await?;
            let s = status(&g);
            anyhow::ensure!(s.phase != Some(Phase::Failed), "rollback failed: {:?}", s);
            Ok((s.phase == Some(Phase::RolledBack)).then_some(g))
        }
    })
    .await?;
    assert_eq!(status(&rolled).nodes.total, 1, "only {back} is selected");
    wait::until(&format!("the device plugin to serve {back} again"), Duration::from_secs(120), || {
        let node_api = node_api.clone();
        let back = back.clone();
        async move { Ok((allocatable(&node_api.get(&back).await?, GPU) == gpus_per_node).then_some(())) }
    })
    .await?;
    let n = node_api.get(&back).await?;
    assert_eq!(
        n.labels().get(switchyard_operator::well_known::LABEL_GPU_BACKEND).map(String::as_str),
        Some("device-plugin")
    );
    assert_ne!(n.spec.as_ref().and_then(|s| s.unschedulable), Some(true), "{back} is left cordoned");
    for other in names.iter().filter(|n| **n != back) {
        assert_eq!(allocatable(&node_api.get(other).await?, GPU), 0, "{other} stays on DRA");
    }
    // A GPU pod on the rolled-back node gets its device from the device plugin, with no claim.
    real::gpu_workload(client, id, "pinned", 1, Some(&back)).await?;
    let pinned = real::wait_workload(client, id, "pinned", 1, Duration::from_secs(120)).await?;
    let logs = real::logs(id, &pinned[0].name_any())?;
    let (visible, gpus) = real::what_the_container_saw(&logs);
    assert!(inventory.contains(&visible), "the device plugin's Allocate set {visible:?}\n{logs}");
    assert_eq!(gpus.len(), 1, "one GPU device node from the plugin\n{logs}");
    assert!(
        pinned[0].status.as_ref().and_then(|s| s.extended_resource_claim_status.as_ref()).is_none(),
        "a pod on the rolled-back node has no generated claim"
    );
    // Every trainer runs again, on whichever backend its node has.
    real::wait_workload(client, id, APP, names.len(), Duration::from_secs(180)).await?;

    replace_onto_the_dra_nodes(client, id, &gpm, &back, names).await?;

    let samples = sampler.stop();
    assert!(samples.events > 0, "the sampler saw the migration");
    real::assert_gpus_held_once(&samples, true);
    assert!(samples.overlaps.is_empty(), "a node was served by both backends: {:?}", samples.overlaps);
    assert!(
        samples.orphaned_claim_holders.is_empty(),
        "claims outlived their driver: {:?}",
        samples.orphaned_claim_holders
    );
    assert!(
        samples.deleted_pods.iter().all(|(_, gpu)| *gpu),
        "only GPU pods were evicted: {:?}",
        samples.deleted_pods
    );
    operator_rbac_is_what_it_uses(client, &started).await
}

/// A GPU pod scheduled onto a migrated node whose container cannot start (it reads a ConfigMap
/// that does not exist: the kubelet's `CreateContainerConfigError`, as for the kubelet's stale
/// device-plugin state of kubernetes/kubernetes#141426) stays Pending; the migration reports it,
/// quoting the kubelet, and the report clears once the pod is gone.
async fn a_gpu_pod_that_cannot_start_is_reported(client: &Client, id: &str) -> anyhow::Result<()> {
    const BROKEN: &str = "misconfigured";
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": BROKEN, "labels": {"app": BROKEN}},
        "spec": {
            "terminationGracePeriodSeconds": 5,
            "containers": [{
                "name": "cuda", "image": real::WORKLOAD_IMAGE, "imagePullPolicy": "Never",
                "resources": {"limits": {GPU: "1"}},
                "env": [{"name": "SETTING", "valueFrom": {"configMapKeyRef": {"name": "absent", "key": "k"}}}],
            }],
        },
    }))?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), id);
    pods.create(&PostParams::default(), &pod).await?;
    let migrations: Api<GpuPoolMigration> = Api::all(client.clone());
    let reported = wait::until("the pod that cannot start to be reported", Duration::from_secs(120), || {
        let migrations = migrations.clone();
        async move {
            let s = migrations.get(id).await?.status.unwrap_or_default();
            let verified = s.conditions.iter().find(|c| c.type_ == "PodsVerified").cloned();
            let pod = s.pods.and_then(|p| p.unverified_pods.into_iter().find(|u| u.name == BROKEN));
            Ok(pod.zip(verified.filter(|c| c.status == "False")))
        }
    })
    .await?;
    let (unverified, condition) = reported;
    let bound = pods.get(BROKEN).await?;
    assert_eq!(
        bound.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Pending"),
        "{BROKEN} never starts"
    );
    assert_eq!(Some(&unverified.node), bound.spec.as_ref().and_then(|s| s.node_name.as_ref()));
    assert_eq!(unverified.reason, "CannotStart", "{unverified:?}");
    assert!(
        unverified.message.starts_with("container cuda cannot start: CreateContainerConfigError: ")
            && unverified.message.contains("absent"),
        "the kubelet's words: {unverified:?}"
    );
    assert!(condition.message.contains(&format!("{id}/{BROKEN}")), "{condition:?}");
    pods.delete(BROKEN, &DeleteParams::default()).await?;
    wait::until("the report to clear once the pod is gone", Duration::from_secs(120), || {
        let migrations = migrations.clone();
        async move {
            let s = migrations.get(id).await?.status.unwrap_or_default();
            let cleared = s.pods.is_some_and(|p| p.unverified == 0)
                && s.conditions.iter().any(|c| c.type_ == "PodsVerified" && c.status == "True");
            Ok(cleared.then_some(()))
        }
    })
    .await
}

/// `strategy.type: Replace` on the real nodes: the node on the device plugin (`back`) is drained
/// onto the nodes on DRA as onto a provider's new node pool, and left cordoned for removal. Its
/// GPU pod comes back on a DRA node through a generated claim and our CDI spec.
async fn replace_onto_the_dra_nodes(
    client: &Client,
    id: &str,
    gpm: &GpuPoolMigration,
    back: &str,
    names: &[String],
) -> anyhow::Result<()> {
    let migrations: Api<GpuPoolMigration> = Api::all(client.clone());
    let node_api: Api<Node> = Api::all(client.clone());
    // The rollback's migration hands the node back; the pinned pod could go nowhere else.
    migrations.delete(&format!("{id}-back"), &DeleteParams::default()).await?;
    real::kubectl(&["-n", id, "delete", "deployment", "pinned", "--wait=true", "--timeout=120s"])?;
    // A GPU pod on the device plugin's node: the DRA nodes are cordoned while it is placed.
    let dra: Vec<&String> = names.iter().filter(|n| n.as_str() != back).collect();
    for n in &dra {
        real::kubectl(&["cordon", n])?;
    }
    real::gpu_workload(client, id, "mover", 1, None).await?;
    let mover = real::wait_workload(client, id, "mover", 1, Duration::from_secs(120)).await?;
    for n in &dra {
        real::kubectl(&["uncordon", n])?;
    }
    assert_eq!(mover[0].spec.as_ref().and_then(|s| s.node_name.as_deref()), Some(back));
    assert!(mover[0].status.as_ref().and_then(|s| s.extended_resource_claim_status.as_ref()).is_none());
    wait::until("the rollback's migration to be deleted", Duration::from_secs(120), || {
        let migrations = migrations.clone();
        async move { Ok(migrations.get_opt(&format!("{id}-back")).await?.is_none().then_some(())) }
    })
    .await?;

    let name = format!("{id}-replace");
    let mut replace: serde_json::Value = serde_json::to_value(gpm)?;
    replace["metadata"] = json!({"name": name});
    replace["spec"]["nodeSelector"] = json!({"matchLabels": {"pool": id, "kubernetes.io/hostname": back}});
    replace["spec"]["strategy"] = json!({
        "type": "Replace",
        "replace": {"targetNodeSelector": {"matchLabels": {"pool": id, switchyard_operator::well_known::LABEL_GPU_BACKEND: "dra"}}},
        "drain": {"gracePeriodSeconds": 5, "timeoutSeconds": 180},
    });
    migrations.create(&PostParams::default(), &serde_json::from_value(replace)?).await?;
    let done = wait::until("the Replace migration to complete", Duration::from_secs(300), || {
        let (migrations, name) = (migrations.clone(), name.clone());
        async move {
            let s = migrations.get(&name).await?.status.unwrap_or_default();
            anyhow::ensure!(s.phase != Some(Phase::Failed), "Replace failed: {s:?}");
            Ok((s.phase == Some(Phase::Completed)).then_some(s))
        }
    })
    .await?;
    assert_eq!(done.replace.as_ref().map(|r| r.replaced_nodes.clone()), Some(vec![back.to_owned()]));
    let n = node_api.get(back).await?;
    assert_eq!(
        n.spec.as_ref().and_then(|s| s.unschedulable),
        Some(true),
        "{back} is left cordoned for removal"
    );
    assert_eq!(n.labels().get(switchyard_operator::well_known::LABEL_REPLACED), Some(&name));
    assert_eq!(
        n.labels().get(switchyard_operator::well_known::LABEL_GPU_BACKEND).map(String::as_str),
        Some("device-plugin")
    );

    // Every GPU pod now runs on a DRA node, through a claim of our driver on that node, and the
    // container got a GPU of the inventory from our CDI spec.
    let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), id);
    let mut pods = real::wait_workload(client, id, "mover", 1, Duration::from_secs(180)).await?;
    pods.extend(real::wait_workload(client, id, APP, names.len(), Duration::from_secs(180)).await?);
    for p in &pods {
        let pod = p.name_any();
        let node = p.spec.as_ref().and_then(|s| s.node_name.clone()).unwrap_or_default();
        assert_ne!(node, back, "{pod} runs on the replaced node");
        let claim = p
            .status
            .as_ref()
            .and_then(|s| s.extended_resource_claim_status.as_ref())
            .unwrap_or_else(|| panic!("{pod} on {node} has no generated claim"));
        let claim = claims.get(&claim.resource_claim_name).await?;
        let results = claim.status.and_then(|s| s.allocation).and_then(|a| a.devices).and_then(|d| d.results);
        let results = results.unwrap_or_default();
        assert_eq!(
            (results.len(), results[0].driver.as_str(), results[0].pool.as_str()),
            (1, DRIVER, node.as_str())
        );
        let (visible, gpus) = real::what_the_container_saw(&real::logs(id, &pod)?);
        assert!(uuids_in_inventory().contains(&visible), "{pod}: {visible:?} is a GPU of the inventory");
        assert_eq!(gpus.len(), 1, "{pod}: one GPU device node");
    }
    Ok(())
}

/// Leaves the shared cluster as it found it, whatever the outcome: the migration deleted while the
/// operator still runs (it releases the finalizer), Switchyard and the device plugin removed, the
/// nodes unlabelled and uncordoned.
async fn cleanup(client: &Client, id: &str, names: &[String]) -> anyhow::Result<()> {
    // A failure between unloading a node's driver and loading it again leaves it unloaded.
    for n in names {
        real::load_driver(n)?;
    }
    for name in [id.to_owned(), format!("{id}-back"), format!("{id}-replace")] {
        real::delete_migration(client, &name).await?;
    }
    // The workload goes before the driver: a DRA plugin must outlive the pods whose claims it
    // prepared, or they hang in Terminating.
    real::delete_namespace(client, id).await?;
    real::uninstall_switchyard()?;
    real::uninstall_device_plugin()?;
    let classes: Api<k8s_openapi::api::resource::v1::DeviceClass> = Api::all(client.clone());
    let _ = classes.delete(DRIVER, &DeleteParams::default()).await;
    real::release_nodes(
        client,
        names,
        &[
            "pool",
            LABEL_GPU_PRESENT,
            switchyard_operator::well_known::LABEL_GPU_BACKEND,
            switchyard_operator::well_known::LABEL_REPLACED,
        ],
    )
    .await
}
