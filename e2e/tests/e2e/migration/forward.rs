//! Forward moves: a pool going from the device plugin to DRA, how its nodes drain and switch, and
//! what holds a node or the pool on the way (admin cordons, bare pods, a pause, other devices and
//! drivers, the GPU Operator's placement, DaemonSet pods holding GPUs).

use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::json;
use switchyard_e2e::locks;
use switchyard_e2e::pool::{self, GpuName, Pool, backend, node_states, patch_spec};
use switchyard_e2e::wait::holds_for;
use switchyard_operator::api::v1alpha1::{CordonHolder, GpuPoolMigration, Phase};
use switchyard_operator::well_known::ANNOTATION_INITIALLY_UNSCHEDULABLE;

use super::{
    MIGRATION, assert_gpu_pods_on_dra, bare_notebook, condition, event_reasons, migrate_forward,
    object_events, plan_json, record_state, with_pool,
};

#[tokio::test]
async fn four_node_pool_migrates_to_dra_without_overlap_and_within_the_pdb() -> anyhow::Result<()> {
    // On nvidia.com/gpu: the GPU gauges count physical GPUs by that name.
    let _cluster = locks::cluster_shared().await?;
    let _nvidia = locks::nvidia_gpu().await?;
    let pool = Pool::new("mig4", 4, 4).await?;
    pool.run(async |pool| forward_migration(pool).await).await
}

async fn forward_migration(pool: &mut Pool) -> anyhow::Result<()> {
    let name = pool.id.clone();
    pool.deployment("trainer", 2, 1).await?;
    pool.pdb("trainer", "trainer", 1).await?;
    pool.deployment("inference", 3, 1).await?;
    pool.deployment("web", 3, 0).await?;
    let before = pool.wait_running(8).await?;
    let web_before: BTreeSet<String> =
        before.iter().filter(|p| p.labels()["app"] == "web").map(|p| p.uid().unwrap()).collect();
    let sampler = pool.sample();
    let nodes: Api<Node> = Api::all(pool.client.clone());
    let mut gpus = 0;
    for n in &pool.nodes {
        gpus += pool::allocatable(&nodes.get(n).await?, &pool.resource) as u64;
    }

    let gpm = pool.migration(&name, json!({"strategy": {"maxUnavailable": 2}}))?;
    pool.migrations().create(&PostParams::default(), &gpm).await?;
    pool.start_operator()?;
    let metrics = pool.operator_metrics_url().expect("the pool started the operator");
    let (stop_scraping, stopped) = tokio::sync::watch::channel(false);
    let scraper = tokio::spawn(scrape_pool_gpus(metrics.clone(), name.clone(), stopped));
    let done = pool.wait_phase(&name, Phase::Completed, MIGRATION).await?;

    // Every node is Migrated, on DRA and schedulable again.
    let status = done.status.clone().unwrap();
    assert_eq!((status.nodes.total, status.nodes.migrated, status.nodes.failed), (4, 4, 0));
    assert!(status.in_progress.is_empty() && status.failed.is_empty());
    for (node, state) in node_states(&pool.client, pool).await? {
        assert_eq!(state, "Migrated", "{node}");
    }
    let nodes: Api<Node> = Api::all(pool.client.clone());
    for name in &pool.nodes {
        let n = nodes.get(name).await?;
        assert_eq!(backend(&n), "dra", "{name}");
        assert_ne!(n.spec.as_ref().unwrap().unschedulable, Some(true), "{name} is left cordoned");
        assert_eq!(pool::allocatable(&n, &pool.resource), 0, "{name} still advertises device-plugin GPUs");
    }
    for type_ in ["Ready", "PrerequisitesMet", "DeviceClassesReady", "PlacementReady"] {
        assert_eq!(
            condition(&done, type_).map(|c| c.status.as_str()),
            Some("True"),
            "{type_}: {:?}",
            condition(&done, type_)
        );
    }
    for type_ in ["Reconciling", "Stalled", "BackendOverlap"] {
        assert_eq!(
            condition(&done, type_).map(|c| c.status.as_str()),
            Some("False"),
            "{type_}: {:?}",
            condition(&done, type_)
        );
    }
    assert_eq!(status.observed_generation, done.metadata.generation);
    assert!(status.device_classes.iter().all(|d| d.effective && d.shadowed_by.is_empty()));

    // The workloads: GPU pods run on DRA through generated claims, non-GPU pods never moved.
    let after = pool.wait_running(8).await?;
    assert_gpu_pods_on_dra(pool, &after).await?;
    // The operator checked every one of them, not only a canary: 2 trainers and 3 inference pods.
    let verified = pool
        .wait_status(&name, "PodsVerified=True for the 5 GPU pods", MIGRATION, |g| {
            let pods = g.status.as_ref().and_then(|s| s.pods.as_ref());
            condition(g, "PodsVerified").is_some_and(|c| c.status == "True")
                && pods.is_some_and(|p| p.verified == 5 && p.unverified == 0)
        })
        .await?;
    let per_node: i32 = verified.status.unwrap().pods.unwrap().nodes.iter().map(|n| n.verified).sum();
    assert_eq!(per_node, 5, "the per-node counts add up");
    let web_after: BTreeSet<String> =
        after.iter().filter(|p| p.labels()["app"] == "web").map(|p| p.uid().unwrap()).collect();
    assert_eq!(web_before, web_after, "non-GPU pods were evicted");

    let samples = sampler.stop();
    assert!(samples.events > 50, "the sampler saw too few events to mean anything: {}", samples.events);
    assert!(samples.overlaps.is_empty(), "nodes served by both backends: {:?}", samples.overlaps);
    assert!(samples.orphaned_claim_holders.is_empty(), "{:?}", samples.orphaned_claim_holders);
    assert!(
        samples.deleted_pods.iter().all(|(_, gpu)| *gpu),
        "a non-GPU pod was deleted: {:?}",
        samples.deleted_pods
    );
    assert!(samples.deleted_pods.len() >= 5, "every GPU pod was moved: {:?}", samples.deleted_pods);
    assert!(
        samples.max_in_flight.0 <= 2,
        "more nodes in flight than maxUnavailable 2: {:?}",
        samples.max_in_flight
    );
    assert_eq!(
        samples.min_ready.get("trainer"),
        Some(&1),
        "the trainer PDB (minAvailable 1) was violated or never tested"
    );

    // The GPU gauges: the pool's physical GPUs stayed flat through the move, every node counted
    // by what served it at each scrape, and the cluster's figure outlives the migration.
    let _ = stop_scraping.send(true);
    let figures = scraper.await?;
    assert!(figures.len() >= 10, "too few scrapes of switchyard_pool_gpus to judge: {figures:?}");
    let off: Vec<_> = figures.iter().filter(|f| f.iter().sum::<u64>() != gpus).collect();
    assert!(off.is_empty(), "the pool's GPUs were not flat at {gpus}: {off:?} of {figures:?}");
    assert!(
        figures.iter().any(|[plugin, dra, _]| *plugin > 0 && *dra > 0),
        "no scrape caught the pool mid-move: {figures:?}"
    );
    assert_eq!(figures.last(), Some(&[0, gpus, 0]), "device-plugin, dra, none at the end");
    let recorded = record_state("completed", &done);
    pool.migrations().delete(&name, &DeleteParams::default()).await?;
    let cluster = switchyard_e2e::wait::until(
        "the pool's GPU gauges gone with the migration",
        Duration::from_secs(60),
        || {
            let metrics = metrics.clone();
            let name = name.clone();
            async move {
                let (_, text) = switchyard_e2e::measure::http("GET", &metrics, None).await?;
                let pool_series =
                    switchyard_e2e::measure::labelled(&text, "switchyard_pool_gpus", &[("migration", &name)]);
                let cluster = switchyard_e2e::measure::labelled(
                    &text,
                    "switchyard_cluster_gpus",
                    &[("backend", "dra")],
                );
                Ok(pool_series.is_none().then_some(cluster))
            }
        },
    )
    .await?;
    // Other GPU nodes of the shared cluster may count too; this pool's are on DRA.
    assert!(
        cluster.is_some_and(|dra| dra >= gpus as f64),
        "switchyard_cluster_gpus{{backend=\"dra\"}} after the migration was deleted: {cluster:?}, want at least {gpus}"
    );
    recorded
}

/// Scrapes the pool's `switchyard_pool_gpus` every 200 ms until `stop`, and once after it: each
/// scrape's `[device-plugin, dra, none]`, once the operator has set all three.
async fn scrape_pool_gpus(
    url: String,
    migration: String,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> Vec<[u64; 3]> {
    let mut figures = Vec::new();
    loop {
        // Once stopped, one more scrape: the last figure is then one taken after the stop.
        let stopping = *stop.borrow_and_update();
        if let Ok((200, text)) = switchyard_e2e::measure::http("GET", &url, None).await {
            let of = |backend| {
                switchyard_e2e::measure::labelled(
                    &text,
                    "switchyard_pool_gpus",
                    &[("migration", &migration), ("backend", backend)],
                )
            };
            if let (Some(plugin), Some(dra), Some(none)) = (of("device-plugin"), of("dra"), of("none")) {
                figures.push([plugin as u64, dra as u64, none as u64]);
            }
        }
        if stopping {
            return figures;
        }
        tokio::select! {
            // The sender gone without a stop: the test ended early.
            changed = stop.changed() => if changed.is_err() { return figures },
            () = tokio::time::sleep(Duration::from_millis(200)) => {}
        }
    }
}

#[tokio::test]
async fn admin_cordoned_nodes_stay_cordoned_take_budget_only_while_moving_and_never_stop_the_pool()
-> anyhow::Result<()> {
    with_pool("cordon", 4, 2, async |pool| {
        let name = pool.id.clone();
        // An admin cordoned two nodes before the migration (maintenance, a bad GPU, ...).
        let nodes: Api<Node> = Api::all(pool.client.clone());
        let admin = [pool.nodes[0].clone(), pool.nodes[2].clone()];
        for n in &admin {
            nodes
                .patch(n, &PatchParams::default(), &Patch::Merge(json!({"spec": {"unschedulable": true}})))
                .await?;
        }
        let sampler = pool.sample();
        // maxUnavailable 1: the cordoned nodes go first, one at a time, and once migrated they
        // stay cordoned without holding the budget, so the other two follow.
        let done = migrate_forward(pool, &name, json!({"strategy": {"maxUnavailable": 1}})).await?;
        assert_eq!(done.status.as_ref().unwrap().nodes.migrated, 4);
        for n in &pool.nodes {
            let node = nodes.get(n).await?;
            let cordoned = node.spec.as_ref().unwrap().unschedulable == Some(true);
            assert_eq!(cordoned, admin.contains(n), "{n}: the admin's cordon, and only it, stays");
            assert_eq!(backend(&node), "dra", "{n}");
        }
        let samples = sampler.stop();
        assert_eq!(samples.max_in_flight.0, 1, "maxUnavailable 1 was exceeded: {:?}", samples.max_in_flight);
        assert!(samples.overlaps.is_empty(), "nodes served by both backends: {:?}", samples.overlaps);
        Ok(())
    })
    .await
}

#[tokio::test]
async fn a_bare_gpu_pod_blocks_its_node_by_name_until_the_spec_forces_its_eviction() -> anyhow::Result<()> {
    with_pool("bare", 2, 2, async |pool| {
        let name = pool.id.clone();
        // A GPU pod no controller manages, as `kubectl run` makes: an eviction would lose it.
        let pods = bare_notebook(pool).await?;
        let running = pool.wait_running(1).await?;
        let bare_uid = running[0].uid().unwrap();
        let bare_node = running[0].spec.as_ref().unwrap().node_name.clone().unwrap();
        let gpm = pool.migration(&name, json!({"strategy": {"maxUnavailable": 2}}))?;
        pool.migrations().create(&PostParams::default(), &gpm).await?;
        pool.start_operator()?;

        // The other node moves; this one waits in Draining, naming the pod, and says so once in
        // an event.
        let waiting = pool
            .wait_status(&name, "the bare pod's node waiting, the other migrated", MIGRATION, |g| {
                g.status.as_ref().is_some_and(|s| {
                    s.nodes.migrated == 1
                        && s.in_progress.iter().any(|p| {
                            p.name == bare_node
                                && p.message.starts_with("UnmanagedPodsBlockDrain:")
                                && p.message.contains(&format!("{}/notebook", pool.apps_ns))
                        })
                })
            })
            .await?;
        let line = waiting.status.unwrap().in_progress.into_iter().find(|p| p.name == bare_node).unwrap();
        assert!(line.message.contains("spec.strategy.drain.force"), "{}", line.message);
        // The cordon is Switchyard's, and the status says so: it is lifted once the node moves.
        assert_eq!(line.cordoned_by, Some(CordonHolder::Switchyard), "{line:?}");
        assert_eq!(pool::node_state(&pool.client, &bare_node).await?, "Draining");
        let events = object_events(pool, "Node", &bare_node).await?;
        assert!(
            events.iter().any(|(r, n)| r == "UnmanagedPodsBlockDrain" && n.contains("notebook")),
            "{events:?}"
        );
        // Someone uncordons the waiting node: the operator cordons it again, with an event.
        let nodes: Api<Node> = Api::all(pool.client.clone());
        nodes
            .patch(
                &bare_node,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"unschedulable": false}})),
            )
            .await?;
        switchyard_e2e::wait::until("the node cordoned again", MIGRATION, || async {
            let n = nodes.get(&bare_node).await?;
            Ok((n.spec.as_ref().and_then(|s| s.unschedulable) == Some(true)).then_some(()))
        })
        .await?;
        let events = object_events(pool, "Node", &bare_node).await?;
        assert!(events.iter().any(|(r, _)| r == "Recordoned"), "{events:?}");
        assert_eq!(pool::node_state(&pool.client, &bare_node).await?, "Draining");
        // The drain keeps the bare pod: the same pod, not terminating, checked throughout 12 s. A
        // pod that is gone is read as `None` (a 404 from `get` would only be retried).
        holds_for("the bare pod to be kept", Duration::from_secs(12), || async {
            let still = pods.get_opt("notebook").await?;
            let still_uid = still.as_ref().and_then(|p| p.uid());
            anyhow::ensure!(
                still_uid.as_deref() == Some(bare_uid.as_str()),
                "the bare pod was evicted: notebook has uid {still_uid:?}, not {bare_uid}"
            );
            let terminating = still.and_then(|p| p.metadata.deletion_timestamp);
            anyhow::ensure!(terminating.is_none(), "the bare pod is terminating since {terminating:?}");
            Ok(())
        })
        .await?;

        // An admin wants the node kept cordoned after it moves. A `kubectl cordon` of a node that
        // is cordoned already changes nothing, so the status's rule is what they follow: the
        // annotation turns the cordon into theirs, and the status says so.
        nodes
            .patch(
                &bare_node,
                &PatchParams::default(),
                &Patch::Merge(
                    json!({"metadata": {"annotations": {ANNOTATION_INITIALLY_UNSCHEDULABLE: "true"}}}),
                ),
            )
            .await?;
        pool.wait_status(&name, "the status naming the admin's cordon", MIGRATION, |g| {
            g.status.as_ref().is_some_and(|s| {
                s.in_progress
                    .iter()
                    .any(|p| p.name == bare_node && p.cordoned_by == Some(CordonHolder::Admin))
            })
        })
        .await?;

        // The user accepts the loss: the pod goes, the node moves.
        patch_spec(&pool.migrations(), &name, json!({"strategy": {"drain": {"force": true}}})).await?;
        pool.wait_phase(&name, Phase::Completed, MIGRATION).await?;
        assert!(pods.get_opt("notebook").await?.is_none(), "forced: the bare pod was evicted");
        let moved = nodes.get(&bare_node).await?;
        assert_eq!(backend(&moved), "dra");
        assert_eq!(moved.spec.unwrap().unschedulable, Some(true), "the admin's cordon stays after the move");
        for other in pool.nodes.iter().filter(|n| **n != bare_node) {
            let n = nodes.get(other).await?;
            assert_ne!(
                n.spec.unwrap().unschedulable,
                Some(true),
                "{other}: Switchyard's own cordon is lifted"
            );
        }
        Ok(())
    })
    .await
}

#[tokio::test]
async fn the_canary_passes_on_tainted_gpu_nodes_and_a_leftover_canary_does_not_decide() -> anyhow::Result<()>
{
    with_pool("canary", 2, 2, async |pool| {
        let name = pool.id.clone();
        // GPU nodes tainted as many clusters taint them; the canary must still land there.
        let nodes: Api<Node> = Api::all(pool.client.clone());
        for n in &pool.nodes {
            let taint = json!({"spec": {"taints": [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]}});
            nodes.patch(n, &PatchParams::default(), &Patch::Merge(taint)).await?;
        }
        // A canary left by an earlier attempt on the first node: it finished without a claim,
        // which would fail the node if it were taken for this attempt's.
        let leftover: Pod = serde_json::from_value(json!({
            "metadata": {"name": format!("switchyard-canary-{}", pool.nodes[0]),
                         "labels": {switchyard_operator::well_known::LABEL_CANARY_ATTEMPT: "1", switchyard_operator::well_known::LABEL_CANARY_NODE: pool.nodes[0]}},
            "spec": {"nodeName": pool.nodes[0], "restartPolicy": "Never", "terminationGracePeriodSeconds": 1,
                     "tolerations": [{"operator": "Exists"}],
                     "containers": [{"name": "canary", "image": "registry.k8s.io/pause:3.10"}]}
        }))?;
        let canaries: Api<Pod> = Api::namespaced(pool.client.clone(), &pool.system_ns);
        canaries.create(&PostParams::default(), &leftover).await?;
        switchyard_e2e::wait::until("the leftover canary to finish", MIGRATION, || async {
            let p = canaries.get(&leftover.name_any()).await?;
            Ok((p.status.and_then(|s| s.phase).as_deref() == Some("Succeeded")).then_some(()))
        })
        .await?;

        let canary = json!({"image": "registry.k8s.io/pause:3.10"});
        let overrides = json!({"strategy": {"maxUnavailable": 2, "verify": {"timeoutSeconds": 120, "canary": canary}}});
        let done = migrate_forward(pool, &name, overrides).await?;
        let status = done.status.unwrap();
        assert_eq!((status.nodes.migrated, status.nodes.failed), (2, 0), "{:?}", status.failed);
        let left = canaries.list(&ListParams::default().labels(switchyard_operator::well_known::LABEL_CANARY_NODE)).await?;
        assert!(left.items.is_empty(), "canaries are deleted once their node passed: {:?}", left.items);
        Ok(())
    })
    .await
}

#[tokio::test]
async fn a_gpu_operator_device_plugin_is_refused_under_managed_and_switched_by_its_deploy_label()
-> anyhow::Result<()> {
    use switchyard_operator::well_known::{
        ANNOTATION_DEVICE_PLUGIN_DEPLOY_BEFORE as RECORD, LABEL_GPU_OPERATOR_DEVICE_PLUGIN as DEPLOY,
    };
    let _cluster = locks::cluster_shared().await?;
    let _nvidia = locks::nvidia_gpu().await?;
    let pool = Pool::gpu_operator("gpuop", 3, 2).await?;
    pool.run(async |pool| {
        let name = pool.id.clone();
        pool.deployment("trainer", 3, 1).await?;
        pool.wait_running(3).await?;
        let daemonsets: Api<DaemonSet> = Api::namespaced(pool.client.clone(), &pool.system_ns);
        let plugin_before = daemonsets.get(pool::DEVICE_PLUGIN_DS).await?;

        // Managed (the default) would edit a DaemonSet the GPU Operator reverts: refused, with
        // the mode to use, before any node is touched.
        let gpm = pool.migration(&name, json!({"strategy": {"maxUnavailable": 1}}))?;
        pool.migrations().create(&PostParams::default(), &gpm).await?;
        pool.start_operator()?;
        let refused = pool
            .wait_status(&name, "PrerequisitesMet False for the GPU Operator", MIGRATION, |g| {
                condition(g, "PrerequisitesMet").is_some_and(|c| c.reason == "GpuOperatorOwnsDevicePlugin")
            })
            .await?;
        let prereq = condition(&refused, "PrerequisitesMet").unwrap();
        assert_eq!(prereq.status, "False");
        assert!(prereq.message.contains(&format!("ClusterPolicy {}", pool.id)), "{}", prereq.message);
        assert!(prereq.message.contains("set spec.placement: GpuOperator"), "{}", prereq.message);
        assert_eq!(
            condition(&refused, "PlacementReady").map(|c| c.reason.as_str()),
            Some("GpuOperatorOwnsDevicePlugin")
        );
        // The printer columns say the same at a glance.
        let table = switchyard_e2e::real::kubectl(&["get", "gpm", &name, "-o", "wide"])?;
        let mut lines = table.lines().map(|l| l.split_whitespace().collect::<Vec<_>>());
        let header = lines.next().unwrap_or_default();
        assert_eq!(
            header,
            [
                "NAME",
                "PHASE",
                "DIRECTION",
                "MIGRATED",
                "TOTAL",
                "MOVING",
                "FAILED",
                "REASON",
                "PAUSED",
                "REFUSED",
                "AGE"
            ],
            "{table}"
        );
        let row = lines.next().unwrap_or_default();
        assert_eq!(
            &row[..row.len().min(10)],
            [name.as_str(), "Pending", "Forward", "0", "3", "0", "0", "PrerequisitesNotMet", "false", "0"],
            "{table}"
        );
        let (code, plan) = plan_json(&name).await?;
        assert_eq!(code, 2, "plan blocks: {plan}");
        assert_eq!(plan["placement"][0]["action"], "UseGpuOperatorPlacement", "{plan}");
        assert!(
            plan["blockers"].to_string().contains("set spec.placement: GpuOperator"),
            "{}",
            plan["blockers"]
        );
        let nodes: Api<Node> = Api::all(pool.client.clone());
        for node in &pool.nodes {
            let n = nodes.get(node).await?;
            assert_ne!(
                n.spec.as_ref().unwrap().unschedulable,
                Some(true),
                "{node} was cordoned while refused"
            );
            assert_eq!(backend(&n), "device-plugin", "{node}");
        }

        // GpuOperator: each node switches by the label the GPU Operator's DaemonSet selects.
        let sampler = pool.sample();
        patch_spec(&pool.migrations(), &name, json!({"placement": "GpuOperator"})).await?;
        let done = pool.wait_phase(&name, Phase::Completed, MIGRATION).await?;
        assert_eq!(done.status.as_ref().unwrap().nodes.migrated, 3);
        for node in &pool.nodes {
            let n = nodes.get(node).await?;
            assert_eq!(backend(&n), "dra", "{node}");
            assert_eq!(n.labels().get(DEPLOY).map(String::as_str), Some("false"), "{node}");
            assert_eq!(
                n.annotations().get(RECORD).map(String::as_str),
                Some("\"true\""),
                "{node}: the record"
            );
            assert_eq!(pool::allocatable(&n, "nvidia.com/gpu"), 0, "{node}: the GPU Operator's plugin left");
        }
        let on_dra = pool.wait_running(3).await?;
        assert_gpu_pods_on_dra(pool, &on_dra).await?;
        let plugin_after = daemonsets.get(pool::DEVICE_PLUGIN_DS).await?;
        assert_eq!(
            (plugin_after.metadata.generation, &plugin_after.spec.template),
            (plugin_before.metadata.generation, &plugin_before.spec.template),
            "the GPU Operator's DaemonSet was edited"
        );

        // Rollback puts the label back as it was; the GPU Operator's plugin serves again.
        patch_spec(&pool.migrations(), &name, json!({"direction": "Rollback"})).await?;
        pool.wait_phase(&name, Phase::RolledBack, MIGRATION).await?;
        for node in &pool.nodes {
            let n = nodes.get(node).await?;
            assert_eq!(n.labels().get(DEPLOY).map(String::as_str), Some("true"), "{node}: restored");
            assert!(!n.annotations().contains_key(RECORD), "{node}: the record is dropped");
            assert_eq!(backend(&n), "device-plugin", "{node}");
            assert_eq!(
                pool::allocatable(&n, "nvidia.com/gpu"),
                2,
                "{node}: served by the device plugin again"
            );
            assert_ne!(n.spec.as_ref().unwrap().unschedulable, Some(true), "{node} is left cordoned");
        }
        let samples = sampler.stop();
        assert!(samples.events > 0, "the sampler saw the migration");
        assert!(samples.overlaps.is_empty(), "nodes served by both backends: {:?}", samples.overlaps);
        assert!(samples.orphaned_claim_holders.is_empty(), "{:?}", samples.orphaned_claim_holders);
        assert!(
            samples.deleted_pods.iter().all(|(_, gpu)| *gpu),
            "only GPU pods were evicted: {:?}",
            samples.deleted_pods
        );
        assert_eq!(samples.max_in_flight.0, 1, "maxUnavailable 1: {:?}", samples.max_in_flight);
        Ok(())
    })
    .await
}

#[tokio::test]
async fn paused_migration_stops_at_a_safe_point_and_resumes() -> anyhow::Result<()> {
    with_pool("pause", 5, 2, async |pool| {
        let name = pool.id.clone();
        let gpm = pool.migration(&name, json!({"strategy": {"maxUnavailable": 1}}))?;
        pool.migrations().create(&PostParams::default(), &gpm).await?;
        pool.start_operator()?;
        let moving = pool
            .wait_status(&name, "one node migrated", MIGRATION, |g| {
                g.status.as_ref().is_some_and(|s| s.nodes.migrated >= 1)
            })
            .await?;
        record_state("progressing", &moving)?;
        patch_spec(&pool.migrations(), &name, json!({"paused": true})).await?;
        // A node in flight finishes its step and waits at a safe point (cordoned, or drained,
        // still on the device plugin), saying so in its message.
        let paused = pool
            .wait_status(&name, "paused, every node in flight waiting at a safe point", MIGRATION, |g| {
                g.status.as_ref().is_some_and(|s| {
                    s.phase == Some(Phase::Paused)
                        && s.in_progress.iter().all(|p| p.message.starts_with("Paused:"))
                })
            })
            .await?;
        record_state("paused", &paused)?;
        assert_eq!(condition(&paused, "Ready").map(|c| c.status.as_str()), Some("False"));

        // Paused means nothing moves: watch the nodes for a while. Each node keeps its state and
        // its backend (DRA once Migrated, the device plugin before), checked throughout 5 s.
        let before = node_states(&pool.client, pool).await?;
        let nodes: Api<Node> = Api::all(pool.client.clone());
        holds_for("nothing to move while paused", Duration::from_secs(5), || async {
            let after = node_states(&pool.client, pool).await?;
            anyhow::ensure!(before == after, "nodes moved while paused: {before:?}, then {after:?}");
            for (node, state) in &after {
                let served_by = backend(&nodes.get(node).await?);
                let expected = if state == "Migrated" { "dra" } else { "device-plugin" };
                anyhow::ensure!(
                    served_by == expected,
                    "{node} in {state:?}: served by {served_by}, not {expected}"
                );
            }
            Ok(())
        })
        .await?;
        // What the nodes were throughout the window, its end included.
        let after = before;
        let migrated = after.values().filter(|s| *s == "Migrated").count();
        assert!((1..5).contains(&migrated), "pause should land mid-migration: {after:?}");
        for (node, state) in &after {
            assert!(
                !["Switching", "Verifying", "RollingBack"].contains(&state.as_str()),
                "{node} stopped mid-switch in {state}"
            );
        }

        patch_spec(&pool.migrations(), &name, json!({"paused": false})).await?;
        let done = pool.wait_phase(&name, Phase::Completed, MIGRATION).await?;
        assert_eq!(done.status.unwrap().nodes.migrated, 5);
        Ok(())
    })
    .await
}

/// The runbook's last step: once the device plugin serves no node the migration says it may go;
/// deleting it leaves the completed migration Completed and Ready, `switchyard plan` passes, and a
/// node that joins the pool afterwards, with no device plugin on it, moves to DRA and serves pods.
#[tokio::test]
async fn deleting_the_device_plugin_after_completion_keeps_the_pool_ready_and_a_new_node_moves()
-> anyhow::Result<()> {
    with_pool("dpgone", 2, 2, async |pool| {
        let name = pool.id.clone();
        pool.deployment("trainer", 2, 1).await?;
        pool.wait_running(2).await?;
        migrate_forward(pool, &name, json!({})).await?;
        let removable = |g: &GpuPoolMigration, reason: &str| {
            condition(g, "DevicePluginRemovable").is_some_and(|c| c.status == "True" && c.reason == reason)
        };
        let g = pool
            .wait_status(&name, "DevicePluginRemovable=True (DevicePluginUnused)", MIGRATION, |g| {
                removable(g, "DevicePluginUnused")
            })
            .await?;
        let message = &condition(&g, "DevicePluginRemovable").unwrap().message;
        assert!(message.contains(pool::DEVICE_PLUGIN_DS) && message.contains("runs on no node"), "{message}");
        assert!(
            event_reasons(pool, &name).await?.iter().any(|(r, _)| r == "DevicePluginRemovable"),
            "no DevicePluginRemovable event"
        );

        // The runbook's last step.
        let daemon_sets: Api<DaemonSet> = Api::namespaced(pool.client.clone(), &pool.system_ns);
        daemon_sets.delete(pool::DEVICE_PLUGIN_DS, &DeleteParams::default()).await?;
        let g = pool
            .wait_status(&name, "DevicePluginRemovable=True (DevicePluginRemoved)", MIGRATION, |g| {
                removable(g, "DevicePluginRemoved")
            })
            .await?;
        let st = g.status.as_ref().unwrap();
        assert_eq!(st.phase, Some(Phase::Completed));
        for (t, want) in [("Ready", "True"), ("Stalled", "False"), ("PrerequisitesMet", "True")] {
            let c = condition(&g, t).unwrap();
            assert_eq!(c.status, want, "{t}: {} {}", c.reason, c.message);
        }
        let (code, report) = plan_json(&name).await?;
        assert_eq!(code, 0, "switchyard plan after the device plugin went: {report}");

        // A node joins with no device plugin; GPU Feature Discovery labelled its 2 GPUs.
        let gfd = std::collections::BTreeMap::from([("nvidia.com/gpu.count".to_owned(), "2".to_owned())]);
        let joined = pool.add_unserved_node(2, gfd).await?;
        pool.wait_status(&name, "the joined node migrated", MIGRATION, |g| {
            g.status.as_ref().is_some_and(|s| s.phase == Some(Phase::Completed) && s.nodes.migrated == 3)
        })
        .await?;
        let node = Api::<Node>::all(pool.client.clone()).get(&joined).await?;
        assert_eq!(backend(&node), "dra");
        assert_ne!(node.spec.as_ref().and_then(|s| s.unschedulable), Some(true), "{joined} left cordoned");
        // Its GPUs serve pods through DRA: six one-GPU replicas fit only with its two.
        let deployments: Api<k8s_openapi::api::apps::v1::Deployment> =
            Api::namespaced(pool.client.clone(), &pool.apps_ns);
        deployments
            .patch("trainer", &PatchParams::default(), &Patch::Merge(json!({"spec": {"replicas": 6}})))
            .await?;
        let pods = pool.wait_running(6).await?;
        assert_gpu_pods_on_dra(pool, &pods).await?;
        assert!(
            pods.iter()
                .any(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(joined.as_str())),
            "no pod runs on {joined}"
        );
        Ok(())
    })
    .await
}

/// The NVIDIA Network Operator's SR-IOV device plugin advertises `nvidia.com/hostdev` on a GPU
/// node. It is not a GPU: it neither blocks the pool as an unmapped resource nor keeps the
/// agent's `device-plugin-active` taint on the node's GPUs after the switch.
#[tokio::test]
async fn a_network_operator_resource_beside_the_gpus_neither_blocks_the_pool_nor_holds_the_interlock()
-> anyhow::Result<()> {
    with_pool("hostdev", 2, 2, async |pool| {
        let name = pool.id.clone();
        let nic_node = pool.nodes[0].clone();
        let hostdev = json!({"status": {"capacity": {"nvidia.com/hostdev": "4"}, "allocatable": {"nvidia.com/hostdev": "4"}}});
        Api::<Node>::all(pool.client.clone())
            .patch_status(&nic_node, &PatchParams::default(), &Patch::Merge(&hostdev))
            .await?;
        pool.deployment("trainer", 4, 1).await?;
        pool.wait_running(4).await?;
        let done = migrate_forward(pool, &name, json!({})).await?;
        let prerequisites = condition(&done, "PrerequisitesMet").unwrap();
        assert_eq!((prerequisites.status.as_str(), prerequisites.reason.as_str()), ("True", "AllMet"));
        let node = Api::<Node>::all(pool.client.clone()).get(&nic_node).await?;
        assert_eq!(pool::allocatable(&node, "nvidia.com/hostdev"), 4, "the NIC resource is still there");
        // Every GPU of the node is allocatable through DRA: four pods fit on the pool's four GPUs.
        let pods = pool.wait_running(4).await?;
        assert_gpu_pods_on_dra(pool, &pods).await?;
        assert_eq!(
            pods.iter().filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(nic_node.as_str())).count(),
            2,
            "both GPUs of {nic_node} serve pods"
        );
        Ok(())
    })
    .await
}

/// A DaemonSet whose pods each hold one device-plugin GPU (a monitoring agent): the drain leaves
/// DaemonSet pods, so the switch waits for them, names them, and never publishes the GPU they hold;
/// once the spec lets Switchyard evict them, it does so after the device plugin has left, and the
/// DaemonSet's new pods get their GPUs through DRA claims. No pod on a DRA node holds a GPU
/// without a claim, and no device is allocated twice. Rolled back, the same holds the other way:
/// the pods that now hold the driver's devices are named, then evicted, and come back on the
/// device plugin.
#[tokio::test]
async fn a_daemon_set_pod_holding_a_gpu_holds_the_switch_until_evicted_and_comes_back_through_dra()
-> anyhow::Result<()> {
    with_pool("dsgpu", 2, 2, async |pool| {
        let name = pool.id.clone();
        let ds: k8s_openapi::api::apps::v1::DaemonSet = serde_json::from_value(json!({
            "metadata": {"name": "gpu-agent"},
            "spec": {
                "selector": {"matchLabels": {"app": "gpu-agent"}},
                "template": {
                    "metadata": {"labels": {"app": "gpu-agent"}},
                    "spec": {
                        "nodeSelector": {"pool": pool.id},
                        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
                        "terminationGracePeriodSeconds": 1,
                        "containers": [{"name": "agent", "image": "registry.k8s.io/pause:3.10",
                                        "resources": {"limits": {&pool.resource: "1"}}}]
                    }
                }
            }
        }))?;
        let daemon_sets: Api<DaemonSet> = Api::namespaced(pool.client.clone(), &pool.system_ns);
        daemon_sets.create(&PostParams::default(), &ds).await?;
        let agents: Api<Pod> = Api::namespaced(pool.client.clone(), &pool.system_ns);
        let running_agents = || {
            let agents = agents.clone();
            async move {
                let list = agents.list(&ListParams::default().labels("app=gpu-agent")).await?;
                anyhow::Ok(pool::running(list.items))
            }
        };
        switchyard_e2e::wait::until("a gpu-agent on each node", Duration::from_secs(60), || async {
            Ok((running_agents().await?.len() == 2).then_some(()))
        })
        .await?;

        let sampler = pool.sample();
        let gpm = pool.migration(&name, json!({"strategy": {"maxUnavailable": 1}}))?;
        pool.migrations().create(&PostParams::default(), &gpm).await?;
        pool.start_operator()?;
        let held = pool
            .wait_status(&name, "a node waiting on the DaemonSet pod", MIGRATION, |g| {
                g.status.as_ref().is_some_and(|s| {
                    s.in_progress.iter().any(|p| p.message.starts_with("GpuHeldByDaemonSetPod"))
                })
            })
            .await?;
        let line = held.status.as_ref().unwrap().in_progress.iter().find(|p| p.message.starts_with("GpuHeldByDaemonSetPod")).unwrap().clone();
        assert!(line.message.contains("gpu-agent-") && line.message.contains("evictDaemonSetGpuPods"), "{}", line.message);
        let node = Api::<Node>::all(pool.client.clone()).get(&line.name).await?;
        assert_eq!(backend(&node), "device-plugin", "the node stays on the device plugin while its GPU is held");
        let events = object_events(pool, "Node", &line.name).await?;
        assert!(events.iter().any(|(r, _)| r == "GpuHeldByDaemonSetPod"), "{events:?}");
        let (code, report) = plan_json(&name).await?;
        let blockers = report["blockers"].to_string();
        assert!(blockers.contains("DaemonSet pod(s) hold device-plugin GPUs"), "exit {code}: {blockers}");

        patch_spec(&pool.migrations(), &name, json!({"strategy": {"drain": {"evictDaemonSetGpuPods": true}}})).await?;
        let done = pool.wait_phase(&name, Phase::Completed, MIGRATION).await?;
        assert_eq!(done.status.as_ref().unwrap().nodes.migrated, 2);
        let agents_now = switchyard_e2e::wait::until("the gpu-agents back through DRA", MIGRATION, || async {
            let running = running_agents().await?;
            let all_claimed = running.iter().all(|p| {
                p.status.as_ref().and_then(|s| s.extended_resource_claim_status.as_ref()).is_some()
            });
            Ok((running.len() == 2 && all_claimed).then_some(running))
        })
        .await?;
        // Each holds its own device: no device allocated twice on a node.
        let mut devices = BTreeSet::new();
        for p in &agents_now {
            let claim_name = &p.status.as_ref().unwrap().extended_resource_claim_status.as_ref().unwrap().resource_claim_name;
            let claim = Api::<ResourceClaim>::namespaced(pool.client.clone(), &pool.system_ns).get(claim_name).await?;
            for r in claim.status.unwrap().allocation.unwrap().devices.unwrap().results.unwrap_or_default() {
                assert!(devices.insert((r.pool.clone(), r.device.clone())), "{}/{} allocated twice", r.pool, r.device);
            }
        }

        // Rolling back, the DaemonSet's pods now hold the driver's devices, and a drain leaves
        // DaemonSet pods: the node names them instead of waiting out its timeout in silence.
        patch_spec(
            &pool.migrations(),
            &name,
            json!({"direction": "Rollback", "strategy": {"drain": {"evictDaemonSetGpuPods": false}}}),
        )
        .await?;
        let held = pool
            .wait_status(&name, "a node rolling back waiting on a DaemonSet pod", MIGRATION, |g| {
                g.status.as_ref().is_some_and(|s| {
                    s.in_progress.iter().any(|p| p.message.starts_with("GpuHeldByDaemonSetPod"))
                })
            })
            .await?;
        let line = held.status.as_ref().unwrap().in_progress.iter().find(|p| p.message.starts_with("GpuHeldByDaemonSetPod")).unwrap().clone();
        assert!(
            line.message.contains("hold the driver's devices") && line.message.contains("gpu-agent-"),
            "{}",
            line.message
        );
        assert_eq!(pool::node_state(&pool.client, &line.name).await?, "RollingBack");
        // Allowed to evict them: each comes back on the device plugin, without a claim.
        patch_spec(&pool.migrations(), &name, json!({"strategy": {"drain": {"evictDaemonSetGpuPods": true}}})).await?;
        let done = pool.wait_phase(&name, Phase::RolledBack, MIGRATION).await?;
        assert_eq!(done.status.as_ref().unwrap().nodes.failed, 0);
        switchyard_e2e::wait::until("the gpu-agents back on the device plugin", MIGRATION, || async {
            let running = running_agents().await?;
            let unclaimed = running.iter().all(|p| {
                p.status.as_ref().and_then(|s| s.extended_resource_claim_status.as_ref()).is_none()
            });
            Ok((running.len() == 2 && unclaimed).then_some(()))
        })
        .await?;
        let events = object_events(pool, "Node", &line.name).await?;
        assert!(
            events.iter().any(|(r, note)| r == "GpuHeldByDaemonSetPod" && note.contains("hold the driver's devices")),
            "{events:?}"
        );
        let samples = sampler.stop();
        assert!(samples.overlaps.is_empty(), "nodes served by both backends: {:?}", samples.overlaps);
        assert!(
            samples.orphaned_claim_holders.is_empty(),
            "pods held DRA claims after their node's driver left: {:?}",
            samples.orphaned_claim_holders
        );
        Ok(())
    })
    .await
}

/// `switchyard plan -f <manifest> -o json` for a GpuPoolMigration not applied (or as changed).
async fn plan_manifest_json(gpm: &GpuPoolMigration) -> anyhow::Result<(i32, serde_json::Value)> {
    use tokio::io::AsyncWriteExt;
    let mut child = tokio::process::Command::new(switchyard_e2e::cluster::cli_bin())
        .args(["plan", "-f", "-", "-o", "json"])
        .env("KUBECONFIG", switchyard_e2e::cluster::kubeconfig())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()?;
    let mut stdin = child.stdin.take().expect("piped");
    stdin.write_all(serde_yaml::to_string(gpm)?.as_bytes()).await?;
    drop(stdin);
    let out = child.wait_with_output().await?;
    let report = serde_json::from_slice(&out.stdout)
        .map_err(|e| anyhow::anyhow!("plan -f - -o json: {e}: {}", String::from_utf8_lossy(&out.stderr)))?;
    Ok((out.status.code().unwrap_or(-1), report))
}

/// A driver without the device-plugin interlock (NVIDIA's `gpu.nvidia.com` has none) is played
/// by the real agent under another name with the interlock off. Its nodes switch in sequence
/// (device-plugin → none → dra) and no instant has both backends. With `devicePluginInterlock:
/// true` set wrongly for the same driver, the sampler does see both backends: the sequence is what
/// prevents it. `plan` checks the classes' selectors against what the driver publishes.
#[tokio::test]
async fn a_driver_without_the_interlock_switches_in_sequence_and_never_overlaps() -> anyhow::Result<()> {
    let _cluster = locks::cluster_shared().await?;
    // 3 s between the plugin's pod leaving and its resources going: long enough that a driver
    // started beside the leaving plugin publishes while the node still advertises its GPUs.
    let pool =
        Pool::third_party_driver("nointerlock", 2, 2, Duration::from_secs(3), GpuName::Renamed).await?;
    pool.run(async |pool| {
        let name = pool.id.clone();
        assert!(pool.driver.ends_with(".gpu.example.com"), "{}", pool.driver);
        pool.deployment("trainer", 2, 1).await?;
        pool.deployment("web", 2, 0).await?;
        pool.wait_running(4).await?;
        let nodes: Api<Node> = Api::all(pool.client.clone());
        let daemonsets: Api<DaemonSet> = Api::namespaced(pool.client.clone(), &pool.system_ns);

        // Before any node runs the driver, plan has nothing published to judge the selectors by.
        let gpm = pool.migration(&name, json!({"strategy": {"maxUnavailable": 1}}))?;
        assert_eq!(gpm.spec.driver.device_plugin_interlock, None);
        let (code, plan) = plan_manifest_json(&gpm).await?;
        assert_eq!(code, 0, "{plan}");
        assert_eq!(plan["deviceClasses"][0]["selector"]["checkedAgainst"], "NotChecked", "{plan}");

        let sampler = pool.sample();
        pool.migrations().create(&PostParams::default(), &gpm).await?;
        pool.start_operator()?;
        let done = pool.wait_phase(&name, Phase::Completed, MIGRATION).await?;
        assert_eq!(done.status.as_ref().unwrap().nodes.migrated, 2);

        // Managed placement keeps the device plugin off `none` nodes as well as `dra` ones.
        let plugin = daemonsets.get(pool::DEVICE_PLUGIN_DS).await?;
        let affinity = serde_json::to_value(&plugin.spec.template.spec.as_ref().unwrap().affinity)?;
        let terms =
            &affinity["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"];
        assert_eq!(
            terms[0]["matchExpressions"],
            json!([{"key": switchyard_operator::well_known::LABEL_GPU_BACKEND, "operator": "NotIn", "values": ["dra", "none"]}]),
            "{affinity}"
        );
        for node in &pool.nodes {
            let n = nodes.get(node).await?;
            assert_eq!(backend(&n), "dra", "{node}");
            assert_eq!(pool::allocatable(&n, &pool.resource), 0, "{node}");
            assert_ne!(n.spec.as_ref().unwrap().unschedulable, Some(true), "{node} is left cordoned");
            let reasons: Vec<String> =
                object_events(pool, "Node", node).await?.into_iter().map(|(r, _)| r).collect();
            assert!(reasons.iter().any(|r| r == "DriverStarting"), "{node}: {reasons:?}");
        }
        let on_dra = pool.wait_running(4).await?;
        assert_gpu_pods_on_dra(pool, &on_dra).await?;
        let samples = sampler.stop();
        assert!(samples.events > 0, "the sampler saw the migration");
        assert!(samples.overlaps.is_empty(), "nodes served by both backends: {:?}", samples.overlaps);
        assert!(samples.orphaned_claim_holders.is_empty(), "{:?}", samples.orphaned_claim_holders);
        assert_eq!(samples.max_in_flight.0, 1, "{:?}", samples.max_in_flight);
        for node in &pool.nodes {
            assert_eq!(
                samples.backend_history.get(node).map(Vec::as_slice),
                Some(&["device-plugin".to_string(), "none".into(), "dra".into()][..]),
                "{node}: every switch went through none"
            );
        }

        // Now the driver publishes: plan evaluates the selectors on its devices.
        let (code, plan) = plan_json(&name).await?;
        assert_eq!(code, 0, "{plan}");
        let check = &plan["deviceClasses"][0]["selector"];
        assert_eq!(check["checkedAgainst"], "PublishedDevices", "{plan}");
        assert_eq!((check["devices"].as_u64(), check["selected"].as_u64()), (Some(4), Some(4)), "{check}");
        // A misspelt attribute and a value that matches nothing are named before any node moves.
        let selector = |s: String| {
            json!({"resources": [{"extendedResourceName": pool.resource,
            "deviceClassName": format!("{}.gpu", pool.id), "selector": s}]})
        };
        let typo = pool.migration(
            &format!("{name}-typo"),
            selector(format!("device.attributes['{}'].typ == 'gpu'", pool.driver)),
        )?;
        let (code, plan) = plan_manifest_json(&typo).await?;
        assert_eq!(code, 2, "{plan}");
        let blockers = plan["blockers"].to_string();
        assert!(blockers.contains(".typ, which") && blockers.contains("does not publish"), "{blockers}");
        let nothing = pool.migration(
            &format!("{name}-none"),
            selector(format!("device.attributes['{}'].type == 'GPU'", pool.driver)),
        )?;
        let (code, plan) = plan_manifest_json(&nothing).await?;
        assert_eq!(code, 2, "{plan}");
        assert!(
            plan["blockers"].to_string().contains("selects none of the 4 device(s)"),
            "{}",
            plan["blockers"]
        );

        // Back to the device plugin: the DeviceTaintRule evicts claim holders while the driver
        // still runs, whatever the driver.
        let sampler = pool.sample();
        patch_spec(&pool.migrations(), &name, json!({"direction": "Rollback"})).await?;
        pool.wait_phase(&name, Phase::RolledBack, MIGRATION).await?;
        for node in &pool.nodes {
            let n = nodes.get(node).await?;
            assert_eq!(backend(&n), "device-plugin", "{node}");
            assert_eq!(pool::allocatable(&n, &pool.resource), 2, "{node}");
        }
        let samples = sampler.stop();
        assert!(samples.overlaps.is_empty(), "rollback: {:?}", samples.overlaps);
        assert!(samples.orphaned_claim_holders.is_empty(), "{:?}", samples.orphaned_claim_holders);

        // The control: told wrongly that this driver has the interlock, the operator starts it
        // beside the leaving device plugin, and the sampler sees a node served by both.
        let sampler = pool.sample();
        patch_spec(
            &pool.migrations(),
            &name,
            json!({"direction": "Forward", "driver": {"devicePluginInterlock": true}}),
        )
        .await?;
        pool.wait_phase(&name, Phase::Completed, MIGRATION).await?;
        let samples = sampler.stop();
        assert!(
            !samples.overlaps.is_empty(),
            "with the interlock assumed, the driver published beside the device plugin: {:?}",
            samples.backend_history
        );
        Ok(())
    })
    .await
}
