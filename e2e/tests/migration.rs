//! The migration engine end to end: the real `switchyard-operator` process moves simulated GPU
//! pools between the device plugin and the real driver agent, on the real control plane.
//!
//! Scenarios run side by side (run-e2e.sh gives this binary several test threads, and runs other
//! test binaries beside it). A pool's GPUs have a name of their own (`nvidia.com/gpu-<pool>`,
//! [`GpuName::Renamed`]) unless the scenario is about `nvidia.com/gpu` itself (its GPU count,
//! sharing, GPU Feature Discovery, the GPU Operator); those take [`locks::nvidia_gpu`] and run one
//! at a time, since two DeviceClasses for one name shadow each other. A scenario that restarts the
//! API server runs alone ([`locks::cluster_alone`]).

use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::resource::v1::{DeviceClass, DeviceTaintRule, ResourceClaim};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::json;
use switchyard_e2e::locks;
use switchyard_e2e::pool::{self, GpuName, Pool, backend, node_states, patch_spec};
use switchyard_operator::api::v1alpha1::{GpuPoolMigration, Phase};

const MIGRATION: Duration = Duration::from_secs(300);

fn condition<'a>(
    gpm: &'a GpuPoolMigration,
    type_: &str,
) -> Option<&'a k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition> {
    gpm.status.as_ref()?.conditions.iter().find(|c| c.type_ == type_)
}

/// Every workload pod that asks for a GPU runs on a DRA node through a generated claim allocated
/// by our driver on that node; the others run anywhere without a claim.
async fn assert_gpu_pods_on_dra(pool: &Pool, pods: &[Pod]) -> anyhow::Result<()> {
    let nodes: Api<Node> = Api::all(pool.client.clone());
    let claims: Api<ResourceClaim> = Api::namespaced(pool.client.clone(), &pool.apps_ns);
    for p in pods {
        let wants_gpu = p.spec.as_ref().unwrap().containers[0]
            .resources
            .as_ref()
            .and_then(|r| r.limits.as_ref())
            .is_some_and(|l| l.contains_key(&pool.resource));
        let node = p.spec.as_ref().unwrap().node_name.clone().unwrap();
        let claim = p.status.as_ref().unwrap().extended_resource_claim_status.as_ref();
        if !wants_gpu {
            assert!(claim.is_none(), "non-GPU pod {} has a claim", p.name_any());
            continue;
        }
        let n = nodes.get(&node).await?;
        assert_eq!(backend(&n), "dra", "GPU pod {} runs on {node}", p.name_any());
        let claim = claim.unwrap_or_else(|| {
            // When it landed, against when its node moved: a device-plugin pod on a DRA node.
            panic!(
                "GPU pod {} on {node} has no extendedResourceClaimStatus: created {:?}, started {:?}; node annotations {:?}",
                p.name_any(),
                p.metadata.creation_timestamp,
                p.status.as_ref().and_then(|s| s.start_time.clone()),
                n.metadata.annotations
            )
        });
        let claim = claims.get(&claim.resource_claim_name).await?;
        let results = claim.status.unwrap().allocation.unwrap().devices.unwrap().results.unwrap_or_default();
        assert_eq!(results.len(), 1);
        assert_eq!(results[0].driver, pool.driver);
        assert_eq!(results[0].pool, node);
    }
    Ok(())
}

/// Runs `scenario` on a fresh pool with GPUs of its own name, beside other scenarios, and cleans
/// the pool up whatever the outcome, so a failed scenario leaves nothing behind on the shared
/// cluster.
async fn with_pool<F>(prefix: &str, nodes: u32, gpus: u32, scenario: F) -> anyhow::Result<()>
where
    F: AsyncFnOnce(&mut Pool) -> anyhow::Result<()>,
{
    let _cluster = locks::cluster_shared().await?;
    renamed_pool(prefix, nodes, gpus, scenario).await
}

/// [`with_pool`] with the cluster to itself, for a scenario that restarts the API server: no
/// other scenario runs through the outage.
async fn with_pool_alone<F>(prefix: &str, nodes: u32, gpus: u32, scenario: F) -> anyhow::Result<()>
where
    F: AsyncFnOnce(&mut Pool) -> anyhow::Result<()>,
{
    let _cluster = locks::cluster_alone().await?;
    renamed_pool(prefix, nodes, gpus, scenario).await
}

async fn renamed_pool<F>(prefix: &str, nodes: u32, gpus: u32, scenario: F) -> anyhow::Result<()>
where
    F: AsyncFnOnce(&mut Pool) -> anyhow::Result<()>,
{
    let pool = Pool::with_unregister_delay(prefix, nodes, gpus, UNREGISTER, GpuName::Renamed).await?;
    pool.run(scenario).await
}

/// How long a device plugin's resources outlive its pod in the default pool.
const UNREGISTER: Duration = Duration::from_secs(1);

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

/// Writes a real CR state for the packaging checks (config/argocd testdata, e2e/kstatus) when
/// SWITCHYARD_RECORD_STATES names a directory.
fn record_state(name: &str, gpm: &GpuPoolMigration) -> anyhow::Result<()> {
    if let Some(dir) = std::env::var_os("SWITCHYARD_RECORD_STATES") {
        let mut value = serde_json::to_value(gpm)?;
        if let Some(meta) = value["metadata"].as_object_mut() {
            for k in ["managedFields", "uid", "resourceVersion"] {
                meta.remove(k);
            }
        }
        std::fs::write(
            std::path::Path::new(&dir).join(format!("recorded-{name}.yaml")),
            serde_yaml::to_string(&value)?,
        )?;
    }
    Ok(())
}

/// The events about one GpuPoolMigration, by reason and note. A node's events on the migration
/// name the node as the related object, so each node has its own series.
async fn event_reasons(pool: &Pool, migration: &str) -> anyhow::Result<Vec<(String, String)>> {
    object_events(pool, "GpuPoolMigration", migration).await
}

async fn object_events(pool: &Pool, kind: &str, name: &str) -> anyhow::Result<Vec<(String, String)>> {
    let events: Api<Event> = Api::namespaced(pool.client.clone(), "default");
    let fields = format!("regarding.kind={kind},regarding.name={name}");
    Ok(events
        .list(&ListParams::default().fields(&fields))
        .await?
        .items
        .into_iter()
        .map(|e| (e.reason.unwrap_or_default(), e.note.unwrap_or_default()))
        .collect())
}

async fn migrate_forward(
    pool: &mut Pool,
    name: &str,
    overrides: serde_json::Value,
) -> anyhow::Result<GpuPoolMigration> {
    let gpm = pool.migration(name, overrides)?;
    pool.migrations().create(&PostParams::default(), &gpm).await?;
    if pool.operator.is_none() {
        pool.start_operator()?;
    }
    pool.wait_phase(name, Phase::Completed, MIGRATION).await
}

#[tokio::test]
async fn migrated_pool_rolls_back_with_claim_holders_evicted_before_the_driver_leaves_and_other_drivers_claims_kept()
-> anyhow::Result<()> {
    with_pool("rollback", 3, 2, async |pool| {
        let name = pool.id.clone();
        pool.deployment("trainer", 3, 1).await?;
        pool.wait_running(3).await?;
        migrate_forward(pool, &name, json!({})).await?;
        let on_dra = pool.wait_running(3).await?;
        assert_gpu_pods_on_dra(pool, &on_dra).await?;

        // A pod on a migrated node holds a second driver's device (a NIC): the rollback's rule
        // does not evict it, and the rollback must not wait for it.
        let nic_user = nic_claim_holder(pool, &pool.nodes[0].clone()).await?;

        let sampler = pool.sample();
        patch_spec(&pool.migrations(), &name, json!({"direction": "Rollback"})).await?;
        let progressing = pool
            .wait_status(&name, "rolling back", MIGRATION, |g| {
                g.status.as_ref().and_then(|s| s.phase) == Some(Phase::RollingBack)
                    || g.status.as_ref().and_then(|s| s.phase) == Some(Phase::RolledBack)
            })
            .await?;
        record_state("rollingback", &progressing)?;
        let done = pool.wait_phase(&name, Phase::RolledBack, MIGRATION).await?;
        let status = done.status.clone().unwrap();
        assert_eq!((status.nodes.total, status.nodes.failed), (3, 0));
        assert_eq!(condition(&done, "Ready").map(|c| c.status.as_str()), Some("True"));

        let nodes: Api<Node> = Api::all(pool.client.clone());
        let rules: Api<DeviceTaintRule> = Api::all(pool.client.clone());
        for (node, state) in node_states(&pool.client, pool).await? {
            assert_eq!(state, "RolledBack", "{node}");
            let n = nodes.get(&node).await?;
            assert_eq!(backend(&n), "device-plugin", "{node}");
            assert_eq!(pool::allocatable(&n, &pool.resource), 2, "{node}: the device plugin serves it again");
            assert_ne!(n.spec.as_ref().unwrap().unschedulable, Some(true), "{node} is left cordoned");
            let leftover = switchyard_operator::node::patch::taint_rule_name(&node);
            assert!(rules.get_opt(&leftover).await?.is_none(), "DeviceTaintRule {leftover} was not deleted");
        }
        // The claim holders were evicted through the DeviceTaintRule while the driver still ran,
        // and came back on the device plugin without claims.
        let samples = sampler.stop();
        assert!(samples.overlaps.is_empty(), "nodes served by both backends: {:?}", samples.overlaps);
        assert!(
            samples.orphaned_claim_holders.is_empty(),
            "pods held DRA claims after their node's driver left: {:?}",
            samples.orphaned_claim_holders
        );
        assert!(
            samples.deleted_pods.len() >= 3,
            "the DRA claim holders were not evicted: {:?}",
            samples.deleted_pods
        );
        let pods: Api<Pod> = Api::namespaced(pool.client.clone(), &pool.system_ns);
        let still = pods.get(&nic_user.name_any()).await?;
        assert_eq!(still.uid(), nic_user.uid(), "the NIC claim holder was replaced");
        assert_eq!(still.status.as_ref().and_then(|s| s.phase.as_deref()), Some("Running"));
        assert!(still.metadata.deletion_timestamp.is_none(), "the NIC claim holder was evicted");
        let back = pool.wait_running(3).await?;
        for p in &back {
            assert!(
                p.status.as_ref().unwrap().extended_resource_claim_status.is_none(),
                "{} still has a claim",
                p.name_any()
            );
        }
        for node in &pool.nodes {
            let events = object_events(pool, "Node", node).await?;
            for reason in
                ["NodeRollingBack", "DeviceTaintRuleCreated", "BackendDevicePlugin", "NodeRolledBack"]
            {
                assert!(events.iter().any(|(r, _)| r == reason), "{node}: no {reason} event: {events:?}");
            }
        }
        record_state("rolledback", &done)
    })
    .await
}

/// Rolling back drains the pods that hold the driver's devices through the eviction API, as the
/// forward drain does: a PodDisruptionBudget with `minAvailable: 3` of 4 replicas holds, on every
/// watch event, while two nodes roll back at once. A budget that allows no eviction fails the
/// node at the drain timeout and keeps its pod, unless `rollbackEvictsPastBudgets` lets the
/// DeviceTaintRule turn NoExecute.
#[tokio::test]
async fn rollback_honours_pod_disruption_budgets_and_evicts_past_them_only_when_the_spec_says_so()
-> anyhow::Result<()> {
    with_pool("rbpdb", 4, 1, async |pool| {
        let name = pool.id.clone();
        pool.deployment("trainer", 4, 1).await?;
        pool.pdb("trainer", "trainer", 3).await?;
        pool.wait_running(4).await?;
        migrate_forward(pool, &name, json!({"strategy": {"maxUnavailable": 2}})).await?;
        pool.wait_running(4).await?;

        let sampler = pool.sample();
        patch_spec(&pool.migrations(), &name, json!({"direction": "Rollback"})).await?;
        let done = pool.wait_phase(&name, Phase::RolledBack, MIGRATION).await?;
        assert_eq!(done.status.as_ref().unwrap().nodes.failed, 0);
        let samples = sampler.stop();
        let min_ready = samples.min_ready.get("trainer").copied();
        assert!(min_ready.is_some_and(|m| m >= 3), "the trainer PDB (minAvailable 3) was violated: {min_ready:?}");
        assert!(samples.overlaps.is_empty(), "{:?}", samples.overlaps);
        assert!(samples.orphaned_claim_holders.is_empty(), "{:?}", samples.orphaned_claim_holders);
        pool.wait_running(4).await?;

        // Forward again, then a budget that allows nothing: the rollback fails the node at the
        // drain timeout and leaves the pod where it runs.
        patch_spec(&pool.migrations(), &name, json!({"direction": "Forward"})).await?;
        pool.wait_phase(&name, Phase::Completed, MIGRATION).await?;
        let pdbs: Api<PodDisruptionBudget> = Api::namespaced(pool.client.clone(), &pool.apps_ns);
        pdbs.patch("trainer", &PatchParams::default(), &Patch::Merge(json!({"spec": {"minAvailable": 4}})))
            .await?;
        let held = pool.wait_running(4).await?;
        patch_spec(
            &pool.migrations(),
            &name,
            json!({"direction": "Rollback", "strategy": {"maxUnavailable": 1, "drain": {"timeoutSeconds": 10}}}),
        )
        .await?;
        let failed = pool
            .wait_status(&name, "a node failed its rollback on the budget", MIGRATION, |g| {
                g.status.as_ref().is_some_and(|s| s.failed.iter().any(|f| f.reason == "RollbackTimeout"))
            })
            .await?;
        let f = failed.status.as_ref().unwrap().failed.iter().find(|f| f.reason == "RollbackTimeout").unwrap();
        assert!(f.message.contains("rollbackEvictsPastBudgets"), "{}", f.message);
        let events = object_events(pool, "Node", &f.name).await?;
        assert!(events.iter().any(|(r, _)| r == "EvictionBlocked"), "{events:?}");
        let now = pool.wait_running(4).await?;
        let uids = |ps: &[Pod]| ps.iter().map(|p| p.uid().unwrap()).collect::<BTreeSet<_>>();
        assert_eq!(uids(&now), uids(&held), "a pod was evicted past its budget");

        // The spec allows it: the rule turns NoExecute and the rollback finishes, two nodes at a
        // time.
        let rule = switchyard_operator::node::patch::taint_rule_name(&f.name);
        let past_budgets = json!({"strategy": {"maxUnavailable": 2, "drain": {"rollbackEvictsPastBudgets": true}}});
        patch_spec(&pool.migrations(), &name, past_budgets).await?;
        Api::<Node>::all(pool.client.clone())
            .patch(
                &f.name,
                &PatchParams::default(),
                // What the runbook says to do for a failed node once it is mended.
                &Patch::Merge(json!({"metadata": {"annotations": {switchyard_operator::well_known::ANNOTATION_MIGRATION_STATE: null, switchyard_operator::well_known::ANNOTATION_FAILURE: null}}})),
            )
            .await?;
        let escalated = switchyard_e2e::wait::until("the rule to turn NoExecute", MIGRATION, || {
            let rules: Api<DeviceTaintRule> = Api::all(pool.client.clone());
            let rule = rule.clone();
            async move {
                Ok(rules.get_opt(&rule).await?.filter(|r| r.spec.taint.effect == "NoExecute").map(|_| ()))
            }
        })
        .await;
        escalated?;
        // The operator publishes a step's events once all its writes have landed: the rule can
        // read NoExecute a moment before its event exists.
        let node = f.name.clone();
        let shared: &Pool = pool;
        switchyard_e2e::wait::until("a RollbackEvictsPastBudgets event on the node", MIGRATION, || {
            let node = node.clone();
            async move {
                let events = object_events(shared, "Node", &node).await?;
                Ok(events.iter().any(|(r, _)| r == "RollbackEvictsPastBudgets").then_some(()))
            }
        })
        .await?;
        // Each node's holder goes past the budget at its drain timeout; the pool rolls back.
        let done = pool.wait_phase(&name, Phase::RolledBack, MIGRATION).await?;
        assert_eq!(done.status.as_ref().unwrap().nodes.failed, 0);
        Ok(())
    })
    .await
}

#[tokio::test]
async fn a_gpu_pod_on_a_migrated_node_served_by_another_driver_is_named() -> anyhow::Result<()> {
    use k8s_openapi::api::resource::v1::ResourceSlice;
    with_pool("verify", 2, 2, async |pool| {
        let name = pool.id.clone();
        pool.deployment("train", 2, 1).await?;
        pool.wait_running(2).await?;
        pool.migrations().create(&PostParams::default(), &pool.migration(&name, json!({}))?).await?;
        pool.start_operator()?;
        pool.wait_phase(&name, Phase::Completed, MIGRATION).await?;
        pool.wait_status(&name, "PodsVerified=True for both trainers", MIGRATION, |g| {
            let pods = g.status.as_ref().and_then(|s| s.pods.as_ref());
            condition(g, "PodsVerified").is_some_and(|c| c.status == "True")
                && pods.is_some_and(|p| p.verified == 2)
        })
        .await?;

        // Another driver publishes a GPU on a migrated node, and a newer DeviceClass for it takes
        // nvidia.com/gpu: the next GPU pod there gets that driver's device.
        let node = pool.nodes[0].clone();
        let other = format!("{}.other-gpu.example.com", pool.id);
        let owner = Api::<Node>::all(pool.client.clone()).get(&node).await?;
        let slice: ResourceSlice = serde_json::from_value(json!({
            "metadata": {"name": format!("{node}-other-gpu"), "ownerReferences": [
                {"apiVersion": "v1", "kind": "Node", "name": node, "uid": owner.uid()}]},
            "spec": {"driver": other, "nodeName": node,
                     "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                     "devices": [{"name": "gpu-0"}]}
        }))?;
        let slices: Api<ResourceSlice> = Api::all(pool.client.clone());
        slices.create(&PostParams::default(), &slice).await?;
        let class: DeviceClass = serde_json::from_value(json!({
            "metadata": {"name": format!("aaa-{}-other", pool.id), "labels": {"pool": pool.id}},
            "spec": {"selectors": [{"cel": {"expression": format!("device.driver == '{other}'")}}],
                     "extendedResourceName": pool.resource}
        }))?;
        Api::<DeviceClass>::all(pool.client.clone()).create(&PostParams::default(), &class).await?;
        let stray: Pod = serde_json::from_value(json!({
            "metadata": {"name": "stray"},
            "spec": {
                "nodeSelector": {"kubernetes.io/hostname": node},
                "terminationGracePeriodSeconds": 1,
                "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10",
                                "resources": {"limits": {&pool.resource: "1"}}}]
            }
        }))?;
        let pods: Api<Pod> = Api::namespaced(pool.client.clone(), &pool.apps_ns);
        pods.create(&PostParams::default(), &stray).await?;

        let flagged = pool
            .wait_status(&name, "PodsVerified=False naming the stray pod", MIGRATION, |g| {
                condition(g, "PodsVerified")
                    .is_some_and(|c| c.status == "False" && c.message.contains("/stray on"))
            })
            .await?;
        let checked = flagged.status.as_ref().unwrap().pods.clone().unwrap();
        assert_eq!((checked.verified, checked.unverified), (2, 1), "{checked:?}");
        let bad = &checked.unverified_pods[0];
        assert_eq!(
            (bad.name.as_str(), bad.node.as_str(), bad.reason.as_str()),
            ("stray", node.as_str(), "OtherDevices")
        );
        assert!(bad.message.contains(&other), "{}", bad.message);
        assert_eq!(checked.nodes[0].node, node, "the node with an unverified pod comes first");
        assert_eq!(checked.nodes[0].unverified, 1);
        assert_eq!(
            condition(&flagged, "BackendOverlap").map(|c| c.status.as_str()),
            Some("False"),
            "another DRA driver's device is not the device plugin"
        );
        let events = event_reasons(pool, &name).await?;
        assert!(
            events.iter().any(|(r, note)| r == "PodsNotVerified" && note.contains("/stray on")),
            "{events:?}"
        );
        pods.delete("stray", &DeleteParams::default()).await?;
        Api::<DeviceClass>::all(pool.client.clone())
            .delete(&format!("aaa-{}-other", pool.id), &DeleteParams::default())
            .await?;
        slices.delete(&format!("{node}-other-gpu"), &DeleteParams::default()).await?;
        Ok(())
    })
    .await
}

/// A second DRA driver's device on `node` (a NIC, published here as its driver would), its
/// DeviceClass, and a pod in the pool's system namespace pinned to `node` that holds the device
/// through a claim of its own, once Running.
async fn nic_claim_holder(pool: &Pool, node: &str) -> anyhow::Result<Pod> {
    use k8s_openapi::api::resource::v1::ResourceSlice;
    let nic_driver = format!("{}.nic.example.com", pool.id);
    let class_name = format!("{}-nic", pool.id);
    let owner = Api::<Node>::all(pool.client.clone()).get(node).await?;
    let slice: ResourceSlice = serde_json::from_value(json!({
        "metadata": {"name": format!("{node}-nic"), "ownerReferences": [
            {"apiVersion": "v1", "kind": "Node", "name": node, "uid": owner.uid()}]},
        "spec": {"driver": nic_driver, "nodeName": node,
                 "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                 "devices": [{"name": "nic-0"}]}
    }))?;
    Api::<ResourceSlice>::all(pool.client.clone()).create(&PostParams::default(), &slice).await?;
    let class: DeviceClass = serde_json::from_value(json!({
        "metadata": {"name": class_name, "labels": {"pool": pool.id}},
        "spec": {"selectors": [{"cel": {"expression": format!("device.driver == '{nic_driver}'")}}]}
    }))?;
    Api::<DeviceClass>::all(pool.client.clone()).create(&PostParams::default(), &class).await?;
    let claim: ResourceClaim = serde_json::from_value(json!({
        "metadata": {"name": "nic"},
        "spec": {"devices": {"requests": [{"name": "nic", "exactly": {"deviceClassName": class_name}}]}}
    }))?;
    Api::<ResourceClaim>::namespaced(pool.client.clone(), &pool.system_ns)
        .create(&PostParams::default(), &claim)
        .await?;
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "nic-user"},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "resourceClaims": [{"name": "nic", "resourceClaimName": "nic"}],
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10", "resources": {"claims": [{"name": "nic"}]}}]
        }
    }))?;
    let pods: Api<Pod> = Api::namespaced(pool.client.clone(), &pool.system_ns);
    pods.create(&PostParams::default(), &pod).await?;
    switchyard_e2e::wait::until("the NIC claim holder to run", Duration::from_secs(60), || {
        let pods = pods.clone();
        async move {
            let p = pods.get("nic-user").await?;
            Ok((p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")).then_some(p))
        }
    })
    .await
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

/// Creates `notebook`, a GPU pod on the pool that no controller manages (as `kubectl run` makes:
/// an eviction would lose it); returns the workload namespace's pods.
async fn bare_notebook(pool: &Pool) -> anyhow::Result<Api<Pod>> {
    let bare: Pod = serde_json::from_value(json!({
        "metadata": {"name": "notebook", "labels": {"app": "notebook"}},
        "spec": {"nodeSelector": {"pool": pool.id}, "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10",
                "resources": {"limits": {&pool.resource: "1"}}}]}
    }))?;
    let pods: Api<Pod> = Api::namespaced(pool.client.clone(), &pool.apps_ns);
    pods.create(&PostParams::default(), &bare).await?;
    Ok(pods)
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
        assert!(waiting.status.unwrap().in_progress[0].message.contains("spec.strategy.drain.force"));
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
        tokio::time::sleep(Duration::from_secs(12)).await;
        let still = pods.get("notebook").await?;
        assert_eq!(still.uid().as_deref(), Some(bare_uid.as_str()), "the bare pod was evicted");
        assert!(still.metadata.deletion_timestamp.is_none(), "the bare pod is terminating");

        // The user accepts the loss: the pod goes, the node moves.
        patch_spec(&pool.migrations(), &name, json!({"strategy": {"drain": {"force": true}}})).await?;
        pool.wait_phase(&name, Phase::Completed, MIGRATION).await?;
        assert!(pods.get_opt("notebook").await?.is_none(), "forced: the bare pod was evicted");
        Ok(())
    })
    .await
}

#[tokio::test]
async fn an_api_error_on_one_node_stays_on_that_node_and_the_others_move() -> anyhow::Result<()> {
    with_pool("apierr", 3, 2, async |pool| {
        let name = pool.id.clone();
        let broken = pool.nodes[0].clone();
        // A real API error on one node: an admission policy denies recording Draining on it.
        let policy = format!("{}-deny-draining", pool.id);
        let policies: Api<ValidatingAdmissionPolicy> = Api::all(pool.client.clone());
        let bindings: Api<ValidatingAdmissionPolicyBinding> = Api::all(pool.client.clone());
        policies
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({
                    "metadata": {"name": policy},
                    "spec": {
                        "failurePolicy": "Fail",
                        "matchConstraints": {"resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"],
                            "operations": ["UPDATE"], "resources": ["nodes"]}]},
                        "matchConditions": [{"name": "the-broken-node", "expression": format!("object.metadata.name == '{broken}'")}],
                        "validations": [{
                            "expression": "!has(object.metadata.annotations) || object.metadata.annotations[?'switchyard.dev/migration-state'].orValue('') != 'Draining'",
                            "message": "e2e: this node refuses Draining"}]
                    }
                }))?,
            )
            .await?;
        bindings
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({
                    "metadata": {"name": policy},
                    "spec": {"policyName": policy, "validationActions": ["Deny"]}
                }))?,
            )
            .await?;
        // The policy takes effect once the API server has compiled it: wait until a dry run of
        // the very write is denied.
        let nodes: Api<Node> = Api::all(pool.client.clone());
        let draining = json!({"metadata": {"annotations": {"switchyard.dev/migration-state": "Draining"}}});
        switchyard_e2e::wait::until("the admission policy to deny Draining on one node", MIGRATION, || async {
            let dry = PatchParams { dry_run: true, ..Default::default() };
            Ok(nodes.patch(&broken, &dry, &Patch::Merge(&draining)).await.is_err().then_some(()))
        })
        .await?;
        let lift = async || -> anyhow::Result<()> {
            bindings.delete(&policy, &DeleteParams::default()).await?;
            policies.delete(&policy, &DeleteParams::default()).await?;
            Ok(())
        };

        let gpm = pool.migration(&name, json!({"strategy": {"maxUnavailable": 3}}))?;
        pool.migrations().create(&PostParams::default(), &gpm).await?;
        pool.start_operator()?;
        let outcome = pool
            .wait_status(&name, "two nodes migrated, the broken one reporting its error", MIGRATION, |g| {
                g.status.as_ref().is_some_and(|s| {
                    s.nodes.migrated == 2
                        && s.in_progress
                            .iter()
                            .any(|p| p.name == broken && p.message.contains("this node refuses Draining"))
                })
            })
            .await;
        let outcome = match outcome {
            Ok(g) => g,
            Err(e) => {
                lift().await?;
                return Err(e);
            }
        };
        let entry = outcome.status.unwrap().in_progress.into_iter().find(|p| p.name == broken).unwrap();
        assert!(entry.message.starts_with("StepError: patching node"), "{}", entry.message);
        // The refused write was the node's whole start (cordon, ownership, Draining): none of it
        // landed, so the node is neither half-started nor left cordoned.
        assert_eq!(pool::node_state(&pool.client, &broken).await?, "");
        let b = nodes.get(&broken).await?;
        assert_ne!(b.spec.as_ref().unwrap().unschedulable, Some(true), "{broken} is cordoned by a refused write");
        let events = object_events(pool, "Node", &broken).await?;
        assert!(events.iter().any(|(r, _)| r == "NodeStepFailed"), "{events:?}");

        // Once the API accepts the write again, the node catches up.
        lift().await?;
        let done = pool.wait_phase(&name, Phase::Completed, MIGRATION).await?;
        assert_eq!(done.status.unwrap().nodes.migrated, 3);
        Ok(())
    })
    .await
}

#[tokio::test]
async fn nodes_that_go_not_ready_or_are_deleted_mid_step_wait_or_leave_the_status() -> anyhow::Result<()> {
    let _cluster = locks::cluster_shared().await?;
    // The device plugin's capacity lingers 8 s after its pod leaves, holding nodes in Switching.
    let pool = Pool::with_unregister_delay("flaky", 3, 2, Duration::from_secs(8), GpuName::Renamed).await?;
    pool.run(async |pool| {
        let name = pool.id.clone();
        let (sick, doomed) = (pool.nodes[0].clone(), pool.nodes[1].clone());
        let gpm = pool.migration(&name, json!({"strategy": {"maxUnavailable": 3}}))?;
        pool.migrations().create(&PostParams::default(), &gpm).await?;
        pool.start_operator()?;
        let client = pool.client.clone();
        switchyard_e2e::wait::until("both nodes in Switching", MIGRATION, || async {
            let (a, b) = (pool::node_state(&client, &sick).await?, pool::node_state(&client, &doomed).await?);
            Ok((a == "Switching" && b == "Switching").then_some(()))
        })
        .await?;
        pool.sim().set_ready(&sick, false).await?;
        pool.sim().delete_node(&doomed).await?;

        // The NotReady node waits in Switching with the reason, the deleted one leaves the status
        // with an event, the third completes.
        let held = pool
            .wait_status(&name, "the NotReady node waiting, the deleted one gone", MIGRATION, |g| {
                g.status.as_ref().is_some_and(|s| {
                    s.nodes.total == 2
                        && s.nodes.migrated == 1
                        && s.in_progress.iter().all(|p| p.name != doomed)
                        && s.in_progress
                            .iter()
                            .any(|p| p.name == sick && p.message.starts_with("NodeNotReady:"))
                })
            })
            .await?;
        assert_eq!(held.status.unwrap().nodes.failed, 0);
        tokio::time::sleep(Duration::from_secs(10)).await;
        assert_eq!(
            pool::node_state(&client, &sick).await?,
            "Switching",
            "NotReady is waited out, not failed"
        );
        let events = event_reasons(pool, &name).await?;
        assert!(events.iter().any(|(r, n)| r == "NodeRemoved" && n.contains(&doomed)), "{events:?}");

        // Ready again: the step resumes and the pool completes without the deleted node.
        pool.sim().set_ready(&sick, true).await?;
        let done = pool.wait_phase(&name, Phase::Completed, MIGRATION).await?;
        assert_eq!(done.status.unwrap().nodes.migrated, 2);
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
                         "labels": {"switchyard.dev/canary-attempt": "1", "switchyard.dev/canary-node": pool.nodes[0]}},
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
        let left = canaries.list(&ListParams::default().labels("switchyard.dev/canary-node")).await?;
        assert!(left.items.is_empty(), "canaries are deleted once their node passed: {:?}", left.items);
        Ok(())
    })
    .await
}

#[tokio::test]
async fn a_leader_that_loses_its_lease_stops_at_once_and_the_standby_finishes() -> anyhow::Result<()> {
    let _cluster = locks::cluster_shared().await?;
    let pool = Pool::with_unregister_delay("lease", 2, 2, Duration::from_secs(8), GpuName::Renamed).await?;
    pool.run(async |pool| {
        let name = pool.id.clone();
        let lease_name = format!("{}-operator", pool.id);
        let mut replicas = std::collections::BTreeMap::new();
        for id in ["replica-a", "replica-b"] {
            let args = ["--lease-name", &lease_name, "--identity", id];
            replicas.insert(id.to_owned(), pool.spawn_operator(&args, &format!("{id}.log"))?);
        }
        let gpm = pool.migration(&name, json!({"strategy": {"maxUnavailable": 1}}))?;
        pool.migrations().create(&PostParams::default(), &gpm).await?;
        let leases: Api<Lease> = Api::namespaced(pool.client.clone(), &pool.system_ns);
        let client = pool.client.clone();
        let first = pool.nodes.clone();
        let leader = switchyard_e2e::wait::until("a leader with a node in Switching", MIGRATION, || async {
            let holder = leases.get_opt(&lease_name).await?.and_then(|l| l.spec?.holder_identity);
            for n in &first {
                if pool::node_state(&client, n).await? == "Switching" {
                    return Ok(holder.clone());
                }
            }
            Ok(None)
        })
        .await?;

        // Another holder takes the Lease (a partition, a replica whose clock ran ahead): the
        // leader must stop within one renewal, not finish its reconcile.
        let mut lease = leases.get(&lease_name).await?;
        let spec = lease.spec.as_mut().unwrap();
        spec.holder_identity = Some("someone-else".into());
        spec.renew_time = Some(MicroTime(k8s_openapi::jiff::Timestamp::now()));
        leases.replace(&lease_name, &PostParams::default(), &lease).await?;
        let mut old = replicas.remove(&leader).unwrap();
        let exited = tokio::time::timeout(Duration::from_secs(15), old.wait()).await;
        let status =
            exited.map_err(|_| anyhow::anyhow!("{leader} kept running after losing its lease"))??;
        assert!(!status.success(), "{leader} exits non-zero on lost leadership: {status}");
        let log = std::fs::read_to_string(pool.log_dir().join(format!("{leader}.log")))?;
        assert!(log.contains("lost leadership: stopping at once"), "{log}");

        // The intruder never renews: the standby takes the expired Lease and finishes the pool.
        let done = pool.wait_phase(&name, Phase::Completed, MIGRATION).await?;
        assert_eq!(done.status.unwrap().nodes.migrated, 2);
        let standby = replicas.keys().next().unwrap().clone();
        let holder = leases.get(&lease_name).await?.spec.and_then(|s| s.holder_identity);
        assert_eq!(holder.as_deref(), Some(standby.as_str()));
        // The pool's cleanup deletes the migration through an operator of its own.
        drop(replicas);
        pool.start_operator()?;
        Ok(())
    })
    .await
}

#[tokio::test]
async fn a_pdb_that_never_allows_eviction_fails_the_drain_and_deleting_the_migration_returns_the_node()
-> anyhow::Result<()> {
    with_pool("drainto", 2, 1, async |pool| {
        let name = pool.id.clone();
        pool.deployment("pinned", 1, 1).await?;
        pool.pdb("pinned", "pinned", 1).await?;
        let pinned = pool.wait_running(1).await?;
        let blocked = pinned[0].spec.as_ref().unwrap().node_name.clone().unwrap();
        let overrides = json!({"strategy": {"maxUnavailable": 2, "drain": {"gracePeriodSeconds": 1, "timeoutSeconds": 10}}});
        let gpm = pool.migration(&name, overrides)?;
        pool.migrations().create(&PostParams::default(), &gpm).await?;
        pool.start_operator()?;

        // onFailure Pause: the node fails with DrainTimeout and the migration stalls on it.
        let failed = pool
            .wait_status(&name, "the drain timed out and the other node moved", MIGRATION, |g| {
                g.status.as_ref().is_some_and(|s| {
                    s.nodes.migrated == 1 && s.failed.iter().any(|f| f.name == blocked && f.reason == "DrainTimeout")
                })
            })
            .await?;
        assert_eq!(failed.status.as_ref().unwrap().phase, Some(Phase::Paused));
        let stalled = condition(&failed, "Stalled").unwrap();
        assert_eq!((stalled.status.as_str(), stalled.reason.as_str()), ("True", "NodeFailed"), "{}", stalled.message);
        let nodes: Api<Node> = Api::all(pool.client.clone());
        let n = nodes.get(&blocked).await?;
        assert_eq!(pool::node_state(&pool.client, &blocked).await?, "Failed");
        assert_eq!(n.spec.as_ref().unwrap().unschedulable, Some(true), "a failed node stays cordoned");
        assert_eq!(backend(&n), "device-plugin", "a drain failure never flips the node");
        let still = pool.wait_running(1).await?;
        assert_eq!(still[0].uid(), pinned[0].uid(), "the PDB-protected pod was never evicted");

        // Deleting the migration returns the node, which never switched, to service as it was.
        pool.migrations().delete(&name, &DeleteParams::default()).await?;
        switchyard_e2e::wait::until("the migration to be deleted", MIGRATION, || async {
            Ok(pool.migrations().get_opt(&name).await?.is_none().then_some(()))
        })
        .await?;
        let n = nodes.get(&blocked).await?;
        assert_ne!(n.spec.as_ref().unwrap().unschedulable, Some(true), "{blocked} is left cordoned");
        assert_eq!(backend(&n), "device-plugin");
        let left: Vec<&String> = n.annotations().keys().filter(|k| k.starts_with("switchyard.dev/")).collect();
        assert!(left.is_empty(), "records left on a node that never switched: {left:?}");
        Ok(())
    })
    .await
}

#[tokio::test]
async fn a_node_whose_driver_never_publishes_times_out_and_rolls_back_under_on_failure_rollback()
-> anyhow::Result<()> {
    with_pool("switchto", 2, 2, async |pool| {
        let name = pool.id.clone();
        let broken = pool.nodes[0].clone();
        pool.sim().hold_agent(&broken);
        let sampler = pool.sample();
        let overrides = json!({"strategy": {"maxUnavailable": 2, "onFailure": "Rollback", "verify": {"timeoutSeconds": 10}}});
        let gpm = pool.migration(&name, overrides)?;
        pool.migrations().create(&PostParams::default(), &gpm).await?;
        pool.start_operator()?;

        // The switch times out, the node goes back to the device plugin, the other one moves.
        let done = pool
            .wait_status(&name, "the broken node rolled back, the other migrated", MIGRATION, |g| {
                g.status.as_ref().is_some_and(|s| s.phase == Some(Phase::Failed))
            })
            .await?;
        let status = done.status.as_ref().unwrap();
        assert_eq!((status.nodes.migrated, status.nodes.failed), (1, 1));
        let f = status.failed.iter().find(|f| f.name == broken).expect("the broken node is listed");
        assert_eq!((f.reason.as_str(), f.state), ("SwitchTimeout", switchyard_operator::api::v1alpha1::NodeState::Switching));
        assert!(f.message.contains("DRA devices 0, selected by the pool's DeviceClasses 0 (need 2)"), "{}", f.message);
        assert_eq!(condition(&done, "Stalled").map(|c| c.reason.as_str()), Some("NodesFailed"));
        assert_eq!(pool::node_state(&pool.client, &broken).await?, "RolledBack");
        let nodes: Api<Node> = Api::all(pool.client.clone());
        let n = nodes.get(&broken).await?;
        assert_eq!(backend(&n), "device-plugin");
        assert_ne!(n.spec.as_ref().unwrap().unschedulable, Some(true), "a rolled-back node is uncordoned");
        switchyard_e2e::wait::until("the device plugin to serve the node again", MIGRATION, || async {
            Ok((pool::allocatable(&nodes.get(&broken).await?, &pool.resource) == 2).then_some(()))
        })
        .await?;
        let samples = sampler.stop();
        assert!(samples.overlaps.is_empty(), "nodes served by both backends: {:?}", samples.overlaps);
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

        // Paused means nothing moves: watch the nodes for a while.
        let before = node_states(&pool.client, pool).await?;
        tokio::time::sleep(Duration::from_secs(5)).await;
        let after = node_states(&pool.client, pool).await?;
        assert_eq!(before, after, "nodes moved while paused");
        let migrated = after.values().filter(|s| *s == "Migrated").count();
        assert!((1..5).contains(&migrated), "pause should land mid-migration: {after:?}");
        let nodes: Api<Node> = Api::all(pool.client.clone());
        for (node, state) in &after {
            assert!(
                !["Switching", "Verifying", "RollingBack"].contains(&state.as_str()),
                "{node} stopped mid-switch in {state}"
            );
            let n = nodes.get(node).await?;
            let expected = if state == "Migrated" { "dra" } else { "device-plugin" };
            assert_eq!(backend(&n), expected, "{node} in {state:?}");
        }

        patch_spec(&pool.migrations(), &name, json!({"paused": false})).await?;
        let done = pool.wait_phase(&name, Phase::Completed, MIGRATION).await?;
        assert_eq!(done.status.unwrap().nodes.migrated, 5);
        Ok(())
    })
    .await
}

#[tokio::test]
async fn shadowed_device_class_blocks_the_migration_and_names_the_winner() -> anyhow::Result<()> {
    with_pool("shadow", 2, 2, async |pool| {
        let name = pool.id.clone();
        let gpm = pool.migration(&name, json!({"paused": true}))?;
        pool.migrations().create(&PostParams::default(), &gpm).await?;
        pool.start_operator()?;
        pool.wait_status(&name, "its DeviceClass in place", MIGRATION, |g| {
            condition(g, "DeviceClassesReady").is_some_and(|c| c.status == "True")
        })
        .await?;

        // A newer class with the same extendedResourceName wins in the scheduler (and this name
        // sorts first, so it wins a same-second tie too).
        let winner = format!("aaa-{}-shadow", pool.id);
        let class: DeviceClass = serde_json::from_value(json!({
            "metadata": {"name": winner, "labels": {"pool": pool.id}},
            "spec": {"selectors": [{"cel": {"expression": "device.driver == 'nobody.example.com'"}}],
                     "extendedResourceName": pool.resource}
        }))?;
        let classes: Api<DeviceClass> = Api::all(pool.client.clone());
        classes.create(&PostParams::default(), &class).await?;
        patch_spec(&pool.migrations(), &name, json!({"paused": false})).await?;

        let stalled = pool
            .wait_status(&name, "DeviceClassesReady=False naming the winner", MIGRATION, |g| {
                condition(g, "DeviceClassesReady")
                    .is_some_and(|c| c.status == "False" && c.message.contains(&winner))
            })
            .await?;
        record_state("stalled", &stalled)?;
        let dc = condition(&stalled, "DeviceClassesReady").unwrap();
        assert_eq!(dc.reason, "Shadowed", "{dc:?}");
        assert_eq!(condition(&stalled, "Stalled").map(|c| c.status.as_str()), Some("True"));
        let entry = &stalled.status.as_ref().unwrap().device_classes[0];
        assert!(!entry.effective);
        assert_eq!(entry.shadowed_by, winner);

        tokio::time::sleep(Duration::from_secs(3)).await;
        for (node, state) in node_states(&pool.client, pool).await? {
            assert!(state.is_empty() || state == "Pending", "{node} moved under a shadowed class: {state}");
        }

        // Removing the shadowing class unblocks it.
        classes.delete(&winner, &DeleteParams::default()).await?;
        pool.wait_phase(&name, Phase::Completed, MIGRATION).await?;
        Ok(())
    })
    .await
}

#[tokio::test]
async fn two_migrations_selecting_the_same_nodes_conflict_and_move_nothing() -> anyhow::Result<()> {
    with_pool("conflict", 2, 2, async |pool| {
        let a = pool.id.clone();
        let b = format!("{}-b", pool.id);
        pool.migrations().create(&PostParams::default(), &pool.migration(&a, json!({}))?).await?;
        pool.migrations().create(&PostParams::default(), &pool.migration(&b, json!({}))?).await?;
        pool.start_operator()?;
        for (me, other) in [(&a, &b), (&b, &a)] {
            let g = pool
                .wait_status(me, "NodeConflict=True", MIGRATION, |g| {
                    condition(g, "NodeConflict").is_some_and(|c| c.status == "True")
                })
                .await?;
            let c = condition(&g, "NodeConflict").unwrap();
            assert!(c.message.contains(other.as_str()), "{me}: the conflict should name {other}: {c:?}");
            for n in &pool.nodes {
                assert!(c.message.contains(n.as_str()), "{me}: the conflict should name {n}: {c:?}");
            }
            // The operator publishes a step's events after its status write has landed.
            let shared: &Pool = pool;
            switchyard_e2e::wait::until(&format!("a NodeConflict event on {me}"), MIGRATION, || async move {
                let reasons = event_reasons(shared, me).await?;
                Ok(reasons.iter().any(|(r, _)| r == "NodeConflict").then_some(()))
            })
            .await?;
            // Moving nothing is not success: the refused nodes are counted, and kstatus (Stalled),
            // the phase and Argo CD's health say a person must act.
            let g = pool
                .wait_status(me, "Stalled=True (NodesRefused)", MIGRATION, |g| {
                    condition(g, "Stalled").is_some_and(|c| c.status == "True" && c.reason == "NodesRefused")
                })
                .await?;
            let st = g.status.as_ref().unwrap();
            assert_eq!(st.phase, Some(Phase::Failed), "{me}: {st:?}");
            assert_eq!(
                (st.nodes.total, st.nodes.refused),
                (0, pool.nodes.len() as i32),
                "{me}: {:?}",
                st.nodes
            );
            let ready = condition(&g, "Ready").unwrap();
            assert_eq!((ready.status.as_str(), ready.reason.as_str()), ("False", "NodesRefused"), "{me}");
        }
        tokio::time::sleep(Duration::from_secs(3)).await;
        for (node, state) in node_states(&pool.client, pool).await? {
            assert!(state.is_empty(), "{node} was moved although two migrations select it: {state}");
        }
        // Deleting one lets the other move the pool.
        pool.migrations().delete(&b, &DeleteParams::default()).await?;
        pool.wait_phase(&a, Phase::Completed, MIGRATION).await?;
        Ok(())
    })
    .await
}

#[tokio::test]
async fn operator_killed_while_switching_and_while_draining_resumes_and_completes() -> anyhow::Result<()> {
    let _cluster = locks::cluster_shared().await?;
    // The device plugin's capacity lingers 8 s after its pod leaves, holding nodes in Switching.
    let pool = Pool::with_unregister_delay("sigkill", 2, 2, Duration::from_secs(8), GpuName::Renamed).await?;
    pool.run(async |pool| killed_mid_step(pool).await).await
}

async fn killed_mid_step(pool: &mut Pool) -> anyhow::Result<()> {
    let name = pool.id.clone();
    // One GPU pod whose PDB allows no disruption: its node's drain blocks until the PDB goes.
    pool.deployment("pinned", 1, 1).await?;
    pool.pdb("pinned", "pinned", 1).await?;
    let pinned = pool.wait_running(1).await?;
    let blocked_node = pinned[0].spec.as_ref().unwrap().node_name.clone().unwrap();
    let free_node = pool.nodes.iter().find(|n| **n != blocked_node).unwrap().clone();
    let sampler = pool.sample();

    // The node without GPU pods goes first (cheapest first) and sits in Switching.
    let gpm = pool.migration(&name, json!({"strategy": {"maxUnavailable": 1}}))?;
    pool.migrations().create(&PostParams::default(), &gpm).await?;
    pool.start_operator()?;
    let client = pool.client.clone();
    let state_of = async |node: &str| pool::node_state(&client, node).await;
    switchyard_e2e::wait::until(&format!("{free_node} in Switching"), MIGRATION, || async {
        Ok((state_of(&free_node).await? == "Switching").then_some(()))
    })
    .await?;
    pool.operator.take().unwrap().kill().await?;
    assert_eq!(state_of(&free_node).await?, "Switching", "the state survives the crash on the Node");
    pool.start_operator()?;
    switchyard_e2e::wait::until(&format!("{free_node} Migrated after the restart"), MIGRATION, || async {
        Ok((state_of(&free_node).await? == "Migrated").then_some(()))
    })
    .await?;

    // The pinned pod's node drains into the PDB and waits there.
    let blocked = pool
        .wait_status(&name, "the drain blocked by the PDB", MIGRATION, |g| {
            g.status.as_ref().is_some_and(|s| {
                s.in_progress
                    .iter()
                    .any(|p| p.name == blocked_node && p.message.contains("PodDisruptionBudget"))
            })
        })
        .await?;
    assert_eq!(state_of(&blocked_node).await?, "Draining");
    let since = blocked.status.as_ref().unwrap().in_progress[0].since.clone();
    pool.operator.take().unwrap().kill().await?;
    pool.start_operator()?;
    // The new process picks the node up where it was: still Draining, still cordoned, same start.
    let resumed = pool
        .wait_status(&name, "the new operator reporting the blocked drain", MIGRATION, |g| {
            g.status
                .as_ref()
                .is_some_and(|s| s.in_progress.iter().any(|p| p.name == blocked_node && p.since == since))
        })
        .await?;
    assert_eq!(state_of(&blocked_node).await?, "Draining");
    let node = Api::<Node>::all(pool.client.clone()).get(&blocked_node).await?;
    assert_eq!(node.spec.as_ref().unwrap().unschedulable, Some(true));
    assert_eq!(resumed.status.unwrap().nodes.migrated, 1);

    // Lifting the PDB lets the drain finish and the migration complete.
    Api::<PodDisruptionBudget>::namespaced(pool.client.clone(), &pool.apps_ns)
        .delete("pinned", &DeleteParams::default())
        .await?;
    pool.wait_phase(&name, Phase::Completed, MIGRATION).await?;
    let after = pool.wait_running(1).await?;
    assert_gpu_pods_on_dra(pool, &after).await?;
    let samples = sampler.stop();
    assert!(samples.overlaps.is_empty(), "nodes served by both backends: {:?}", samples.overlaps);
    Ok(())
}

/// How long the API server stays down in the restart scenario: longer than a watch's longest
/// backoff, short enough that no node's Lease (40 s) expires.
const API_SERVER_DOWN_SECONDS: u32 = 10;
/// The restart scenario's bound from the API server's return to Completed. Three sim nodes take
/// about 25 s at `maxUnavailable: 1`; an operator whose caches froze took 250 to 300 s.
const AFTER_API_SERVER_RETURN: Duration = Duration::from_secs(90);

#[tokio::test]
async fn an_api_server_restart_mid_migration_delays_it_by_the_downtime_only() -> anyhow::Result<()> {
    with_pool_alone("apirestart", 4, 2, async |pool| {
        let name = pool.id.clone();
        pool.deployment("trainer", 4, 1).await?;
        pool.wait_running(4).await?;
        let sampler = pool.sample();
        let gpm = pool.migration(&name, json!({"strategy": {"maxUnavailable": 1}}))?;
        pool.migrations().create(&PostParams::default(), &gpm).await?;
        pool.start_operator()?;
        pool.wait_status(&name, "one node migrated and the next in flight", MIGRATION, |g| {
            g.status.as_ref().is_some_and(|s| s.nodes.migrated >= 1 && !s.in_progress.is_empty())
        })
        .await?;

        let script = switchyard_e2e::cluster::repo_root().join("e2e/hack/restart-apiserver.sh");
        let out = tokio::process::Command::new("bash")
            .arg(&script)
            .arg(API_SERVER_DOWN_SECONDS.to_string())
            .env("SWITCHYARD_CLUSTER_STATE", switchyard_e2e::cluster::kubeconfig().parent().unwrap())
            .output()
            .await?;
        anyhow::ensure!(
            out.status.success(),
            "restart-apiserver.sh failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let back = std::time::Instant::now();
        let done = pool.wait_phase(&name, Phase::Completed, AFTER_API_SERVER_RETURN).await?;
        eprintln!(
            "api-server restart: Completed {:.1}s after /readyz answered again",
            back.elapsed().as_secs_f64()
        );
        assert_eq!(done.status.as_ref().unwrap().nodes.migrated, 4);

        // The operator saw the outage (its watches failed) and got over it by itself.
        let log = std::fs::read_to_string(pool.log_dir().join("operator.log"))?;
        assert!(
            log.contains("watch failed; it retries on its own"),
            "no watch failure logged; did the API server go away?"
        );
        let after = pool.wait_running(4).await?;
        assert_gpu_pods_on_dra(pool, &after).await?;
        let samples = sampler.stop();
        assert!(samples.overlaps.is_empty(), "nodes served by both backends: {:?}", samples.overlaps);
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

/// One GPU takes a critical XID while its node switches: the device plugin counted it, the
/// driver publishes it tainted. The node switches on all its GPUs, the unhealthy one counted and
/// named in an UnhealthyDevices event, instead of failing with SwitchTimeout and pausing the pool.
#[tokio::test]
async fn a_gpu_with_an_xid_during_the_switch_is_counted_and_reported_and_the_pool_completes()
-> anyhow::Result<()> {
    let _cluster = locks::cluster_shared().await?;
    // The device plugin's GPUs stay 10 s after its pod leaves, so the fault lands while the
    // driver's devices still wait on the interlock.
    let pool = Pool::with_unregister_delay("xid", 2, 4, Duration::from_secs(10), GpuName::Renamed).await?;
    pool.run(async |pool| {
        let name = pool.id.clone();
        let overrides = json!({"strategy": {"maxUnavailable": 1, "onFailure": "Pause", "verify": {"timeoutSeconds": 60}}});
        let gpm = pool.migration(&name, overrides)?;
        pool.migrations().create(&PostParams::default(), &gpm).await?;
        pool.start_operator()?;
        // The first switching node's agent takes the fault as soon as it listens.
        let xid = json!({"device": "gpu-1", "kind": "xid", "xid": 79});
        let node = switchyard_e2e::wait::until("an agent to take the XID", Duration::from_secs(60), || async {
            for n in &pool.nodes {
                let Some(url) = pool.sim().agent_fault_url(n).await else { continue };
                match switchyard_e2e::measure::http("POST", &url, Some(&xid)).await {
                    Ok((202, _)) => return Ok(Some(n.clone())),
                    Ok((code, body)) => anyhow::bail!("POST {url} {xid} answered {code}: {body:?}"),
                    // Not listening yet.
                    Err(_) => {}
                }
            }
            Ok(None)
        })
        .await?;

        let done = pool.wait_phase(&name, Phase::Completed, MIGRATION).await?;
        let st = done.status.as_ref().unwrap();
        assert_eq!((st.nodes.migrated, st.nodes.failed), (2, 0), "{:?}", st.failed);
        let events = object_events(pool, "Node", &node).await?;
        let unhealthy = events.iter().find(|(r, _)| r == "UnhealthyDevices");
        assert!(
            unhealthy.is_some_and(|(_, note)| note.contains("1 unhealthy device(s)") && note.contains("gpu-1")),
            "{node}: {events:?}"
        );
        // The driver still keeps it out of scheduling.
        let slices = Api::<k8s_openapi::api::resource::v1::ResourceSlice>::all(pool.client.clone())
            .list(&ListParams::default())
            .await?;
        let tainted = slices
            .items
            .iter()
            .filter(|s| s.spec.driver == pool.driver && s.spec.node_name.as_deref() == Some(node.as_str()))
            .flat_map(|s| s.spec.devices.iter().flatten())
            .find(|d| d.name == "gpu-1")
            .and_then(|d| d.taints.clone())
            .unwrap_or_default();
        assert!(tainted.iter().any(|t| t.key.ends_with("/xid") && t.value.as_deref() == Some("79")), "{tainted:?}");
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

/// A node relabelled out of `spec.nodeSelector` while Draining (an admin fixing a label, GFD
/// rewriting one the selector uses) is not abandoned cordoned: the migration lets go of it (back
/// in service, its records removed, a NodeLeftPool event), drops it from the status, and the
/// other nodes move.
#[tokio::test]
async fn a_node_relabelled_out_of_the_pool_while_draining_goes_back_to_service() -> anyhow::Result<()> {
    with_pool("leaves", 2, 1, async |pool| {
        let name = pool.id.clone();
        // A pod its PDB never lets go holds its node in Draining.
        pool.deployment("pinned", 1, 1).await?;
        pool.pdb("pinned", "pinned", 1).await?;
        let pinned = pool.wait_running(1).await?;
        let leaving = pinned[0].spec.as_ref().unwrap().node_name.clone().unwrap();
        let gpm = pool.migration(&name, json!({"strategy": {"maxUnavailable": 2}}))?;
        pool.migrations().create(&PostParams::default(), &gpm).await?;
        pool.start_operator()?;
        pool.wait_status(&name, &format!("{leaving} Draining"), MIGRATION, |g| {
            g.status.as_ref().is_some_and(|s| {
                s.in_progress.iter().any(|p| p.name == leaving && p.message.contains("PodDisruptionBudget"))
            })
        })
        .await?;

        let nodes: Api<Node> = Api::all(pool.client.clone());
        let relabel = json!({"metadata": {"labels": {"pool": format!("{}-elsewhere", pool.id)}}});
        nodes.patch(&leaving, &PatchParams::default(), &Patch::Merge(&relabel)).await?;
        let released = switchyard_e2e::wait::until("the relabelled node to be let go", MIGRATION, || {
            let nodes = nodes.clone();
            let leaving = leaving.clone();
            async move {
                let n = nodes.get(&leaving).await?;
                Ok((!n.labels().contains_key(switchyard_operator::well_known::LABEL_MIGRATION)).then_some(n))
            }
        })
        .await?;
        assert_ne!(released.spec.as_ref().unwrap().unschedulable, Some(true), "{leaving} left cordoned");
        assert!(
            !released.annotations().contains_key(switchyard_operator::well_known::ANNOTATION_MIGRATION_STATE),
            "{leaving} keeps its migration state: {:?}",
            released.annotations()
        );
        assert_eq!(backend(&released), "device-plugin", "it never switched");
        let events = object_events(pool, "Node", &leaving).await?;
        assert!(events.iter().any(|(r, n)| r == "NodeLeftPool" && n.contains("Draining")), "{events:?}");
        // The pinned pod was never evicted, and the rest of the pool moves.
        let still = pool.wait_running(1).await?;
        assert_eq!(still[0].uid(), pinned[0].uid());
        let done = pool.wait_phase(&name, Phase::Completed, MIGRATION).await?;
        let st = done.status.as_ref().unwrap();
        assert_eq!((st.nodes.total, st.nodes.migrated), (1, 1));
        assert!(st.in_progress.iter().all(|p| p.name != leaving), "{:?}", st.in_progress);
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

/// Waits for PrerequisitesMet False with reason GpuSharingNotAcknowledged; its message.
async fn sharing_not_acknowledged(pool: &Pool, name: &str) -> anyhow::Result<String> {
    let blocked = pool
        .wait_status(name, "PrerequisitesMet False: GpuSharingNotAcknowledged", MIGRATION, |g| {
            condition(g, "PrerequisitesMet").is_some_and(|c| c.reason == "GpuSharingNotAcknowledged")
        })
        .await?;
    Ok(condition(&blocked, "PrerequisitesMet").map(|c| c.message.clone()).unwrap_or_default())
}

/// `switchyard plan <name> -o json` against the shared cluster: (exit code, report).
async fn plan_json(name: &str) -> anyhow::Result<(i32, serde_json::Value)> {
    let out = tokio::process::Command::new(switchyard_e2e::cluster::cli_bin())
        .args(["plan", name, "-o", "json"])
        .env("KUBECONFIG", switchyard_e2e::cluster::kubeconfig())
        .stdin(std::process::Stdio::null())
        .output()
        .await?;
    let report = serde_json::from_slice(&out.stdout)
        .map_err(|e| anyhow::anyhow!("plan -o json: {e}: {}", String::from_utf8_lossy(&out.stderr)))?;
    Ok((out.status.code().unwrap_or(-1), report))
}

#[tokio::test]
async fn unmapped_resources_and_shared_gpus_block_until_mapped_and_acknowledged() -> anyhow::Result<()> {
    use std::collections::BTreeMap;
    use switchyard_e2e::sim::GpuLayout;
    let _cluster = locks::cluster_shared().await?;
    let _nvidia = locks::nvidia_gpu().await?;
    // n0: 2 GPUs time-sliced 2 ways, labelled as GPU Feature Discovery labels such a node.
    // n1: 1 full GPU and 1 in MIG mode with two 1g.10gb instances.
    let gfd = BTreeMap::from([
        ("nvidia.com/gpu.sharing-strategy".to_owned(), "time-slicing".to_owned()),
        ("nvidia.com/gpu.replicas".to_owned(), "2".to_owned()),
        ("nvidia.com/gpu.count".to_owned(), "2".to_owned()),
    ]);
    let shared = GpuLayout { time_slicing_replicas: 2, ..GpuLayout::gpus(2) };
    let mixed = GpuLayout { gpus: 1, ..GpuLayout::mig(1, &["1g.10gb", "1g.10gb"]) };
    let pool = Pool::with_layouts("capacity", vec![(shared, gfd), (mixed, BTreeMap::new())]).await?;
    pool.run(async |pool| {
        let name = pool.id.clone();
        let (sliced, mig) = (pool.nodes[0].clone(), pool.nodes[1].clone());
        pool.deployment("trainer", 2, 1).await?;
        pool.wait_running(2).await?;
        let gpm = pool.migration(&name, json!({"strategy": {"maxUnavailable": 2}}))?;
        pool.migrations().create(&PostParams::default(), &gpm).await?;
        pool.start_operator()?;

        // 1. The MIG resource has no spec.resources entry: nothing starts, the condition, an
        //    event and the plan name the resource and the node.
        let blocked = pool
            .wait_status(&name, "PrerequisitesMet False: UnmappedResources", MIGRATION, |g| {
                condition(g, "PrerequisitesMet").is_some_and(|c| c.reason == "UnmappedResources")
            })
            .await?;
        let c = condition(&blocked, "PrerequisitesMet").unwrap();
        assert_eq!(c.status, "False");
        assert!(c.message.contains(&format!("nvidia.com/mig-1g.10gb on {mig}")), "{}", c.message);
        assert!(!c.message.contains(&sliced), "only the node that advertises it is named: {}", c.message);
        let (code, plan) = plan_json(&name).await?;
        assert_eq!(code, 2, "plan blocks: {plan}");
        let blockers = plan["blockers"].to_string();
        assert!(blockers.contains("nvidia.com/mig-1g.10gb"), "{blockers}");
        // Untouched: no migration state, not cordoned.
        let nodes: Api<Node> = Api::all(pool.client.clone());
        for n in [&mig, &sliced] {
            assert_eq!(pool::node_state(&pool.client, n).await?, "", "{n} was touched");
            assert_ne!(nodes.get(n).await?.spec.unwrap().unschedulable, Some(true), "{n} is cordoned");
        }

        // 2. Mapped: the shared GPUs block next, with the capacity before and after.
        let mig_entry = json!({"extendedResourceName": "nvidia.com/mig-1g.10gb", "deviceClassName": format!("{}.mig-1g10gb", pool.id),
            "selector": format!("device.attributes['{}'].type == 'mig' && device.attributes['{}'].profile == '1g.10gb'", pool.driver, pool.driver)});
        let mut resources = serde_json::to_value(&gpm.spec.resources)?;
        resources.as_array_mut().unwrap().push(mig_entry);
        patch_spec(&pool.migrations(), &name, json!({"resources": resources})).await?;
        let message = &sharing_not_acknowledged(pool, &name).await?;
        assert!(message.contains("capacity drops from 4 to 2 on 1 node(s)"), "{message}");
        assert!(message.contains(&format!("{sliced}: 4 on 2 GPU(s), time-slicing, 2 replicas per GPU")), "{message}");
        assert!(message.contains("spec.acknowledge.gpuSharingLoss: true"), "{message}");
        let (code, plan) = plan_json(&name).await?;
        assert_eq!(code, 2);
        assert!(plan["blockers"].to_string().contains("capacity drops from 4 to 2"), "{}", plan["blockers"]);
        let reasons: Vec<String> = event_reasons(pool, &name).await?.into_iter().map(|(r, _)| r).collect();
        for want in ["UnmappedResources", "GpuSharingNotAcknowledged"] {
            assert!(reasons.iter().any(|r| r == want), "no {want} event: {reasons:?}");
        }
        assert_eq!(pool::node_state(&pool.client, &sliced).await?, "", "{sliced} was touched");

        // 3. Acknowledged: the pool moves, the shared node counts as switched once its 2
        //    physical GPUs are published (not 4), and the change stays on record.
        patch_spec(&pool.migrations(), &name, json!({"acknowledge": {"gpuSharingLoss": true}})).await?;
        let done = pool.wait_phase(&name, Phase::Completed, MIGRATION).await?;
        assert_eq!(done.status.as_ref().unwrap().nodes.migrated, 2);
        // The acknowledged change was on record while the shared node waited to move.
        let events = event_reasons(pool, &name).await?;
        assert!(
            events.iter().any(|(r, note)| r == "GpuSharingLossAcknowledged"
                && note.contains("capacity drops from 4 to 2")
                && note.contains("acknowledged by spec.acknowledge.gpuSharingLoss")),
            "{events:?}"
        );
        let n = Api::<Node>::all(pool.client.clone()).get(&sliced).await?;
        let before: BTreeMap<String, u64> =
            serde_json::from_str(&n.annotations()["switchyard.dev/gpus-before"])?;
        assert_eq!(before["nvidia.com/gpu"], 2, "{before:?}");
        let after = pool.wait_running(2).await?;
        assert_gpu_pods_on_dra(pool, &after).await?;
        Ok(())
    })
    .await
}

#[tokio::test]
async fn renamed_and_time_sliced_mig_resources_show_their_capacity_loss_and_switch_on_physical_counts()
-> anyhow::Result<()> {
    use std::collections::BTreeMap;
    use switchyard_e2e::sim::GpuLayout;
    let _cluster = locks::cluster_shared().await?;
    let _nvidia = locks::nvidia_gpu().await?;
    // One full GPU and one MIG GPU with two 1g.10gb instances, every device time-sliced 2 ways
    // with renameByDefault: the device plugin advertises nvidia.com/gpu.shared: 2 and
    // nvidia.com/mig-1g.10gb.shared: 4. GFD labels each under the name it had.
    let gfd = BTreeMap::from([
        ("nvidia.com/gpu.sharing-strategy".to_owned(), "time-slicing".to_owned()),
        ("nvidia.com/gpu.replicas".to_owned(), "2".to_owned()),
        ("nvidia.com/gpu.count".to_owned(), "1".to_owned()),
        ("nvidia.com/mig-1g.10gb.sharing-strategy".to_owned(), "time-slicing".to_owned()),
        ("nvidia.com/mig-1g.10gb.replicas".to_owned(), "2".to_owned()),
        ("nvidia.com/mig-1g.10gb.count".to_owned(), "2".to_owned()),
    ]);
    let layout = GpuLayout {
        gpus: 1,
        time_slicing_replicas: 2,
        rename_by_default: true,
        ..GpuLayout::mig(1, &["1g.10gb", "1g.10gb"])
    };
    let pool = Pool::with_layouts("shared", vec![(layout, gfd)]).await?;
    pool.run(async |pool| {
        let name = pool.id.clone();
        let node = pool.nodes[0].clone();
        let d = &pool.driver;
        let resources = json!([
            {"extendedResourceName": "nvidia.com/gpu.shared", "deviceClassName": format!("{}.gpu-shared", pool.id),
             "selector": format!("device.attributes['{d}'].type == 'gpu'")},
            {"extendedResourceName": "nvidia.com/mig-1g.10gb.shared", "deviceClassName": format!("{}.mig-shared", pool.id),
             "selector": format!("device.attributes['{d}'].type == 'mig' && device.attributes['{d}'].profile == '1g.10gb'")},
        ]);
        let gpm = pool.migration(&name, json!({"resources": resources}))?;
        pool.migrations().create(&PostParams::default(), &gpm).await?;
        pool.start_operator()?;

        // Before the move: the condition, the plan and an event give each resource's loss.
        let message = &sharing_not_acknowledged(pool, &name).await?;
        for want in [
            "nvidia.com/gpu.shared capacity drops from 2 to 1 on 1 node(s)".to_string(),
            "nvidia.com/mig-1g.10gb.shared capacity drops from 4 to 2 on 1 node(s)".to_string(),
            format!("{node}: 4 on 2 device(s), renamed nvidia.com/mig-1g.10gb.shared (renameByDefault), time-slicing, 2 replicas per device"),
        ] {
            assert!(message.contains(&want), "no {want:?} in {message}");
        }
        let (code, plan) = plan_json(&name).await?;
        assert_eq!(code, 2, "plan blocks: {plan}");
        assert!(plan["blockers"].to_string().contains("nvidia.com/mig-1g.10gb.shared capacity drops from 4 to 2"), "{}", plan["blockers"]);
        let events = event_reasons(pool, &name).await?;
        assert!(
            events.iter().any(|(r, note)| r == "GpuSharingNotAcknowledged" && note.contains("nvidia.com/gpu.shared capacity drops from 2 to 1")),
            "{events:?}"
        );
        assert_eq!(pool::node_state(&pool.client, &node).await?, "", "{node} was touched");

        // Acknowledged: the switch counts the physical devices, so it completes instead of
        // waiting for replicas DRA never publishes.
        patch_spec(&pool.migrations(), &name, json!({"acknowledge": {"gpuSharingLoss": true}})).await?;
        pool.wait_phase(&name, Phase::Completed, MIGRATION).await?;
        let n = Api::<Node>::all(pool.client.clone()).get(&node).await?;
        let before: BTreeMap<String, u64> = serde_json::from_str(&n.annotations()["switchyard.dev/gpus-before"])?;
        assert_eq!(
            before,
            BTreeMap::from([("nvidia.com/gpu.shared".to_string(), 1), ("nvidia.com/mig-1g.10gb.shared".to_string(), 2)])
        );
        Ok(())
    })
    .await
}

#[tokio::test]
async fn sharing_without_labels_is_found_at_the_switch_and_counted_once_acknowledged() -> anyhow::Result<()> {
    use std::collections::BTreeMap;
    use switchyard_e2e::sim::GpuLayout;
    let _cluster = locks::cluster_shared().await?;
    let _nvidia = locks::nvidia_gpu().await?;
    // 2 GPUs time-sliced 2 ways (nvidia.com/gpu: 4) and no GPU Feature Discovery: nothing says
    // so before the move.
    let layout = GpuLayout { time_slicing_replicas: 2, ..GpuLayout::gpus(2) };
    let pool = Pool::with_layouts("nolabels", vec![(layout, BTreeMap::new())]).await?;
    pool.run(async |pool| {
        let name = pool.id.clone();
        let node = pool.nodes[0].clone();
        pool.migrations().create(&PostParams::default(), &pool.migration(&name, json!({}))?).await?;
        pool.start_operator()?;
        // The switch finds 2 GPUs for the 4 advertised and asks, instead of timing out silently.
        let waiting = pool
            .wait_status(&name, "the switch naming the sharing it found", MIGRATION, |g| {
                g.status.as_ref().is_some_and(|s| {
                    s.in_progress.iter().any(|p| p.name == node && p.message.contains("shared 2 ways"))
                })
            })
            .await?;
        let line = waiting.status.unwrap().in_progress.into_iter().find(|p| p.name == node).unwrap();
        assert!(line.message.contains("set spec.acknowledge.gpuSharingLoss: true"), "{}", line.message);
        patch_spec(&pool.migrations(), &name, json!({"acknowledge": {"gpuSharingLoss": true}})).await?;
        pool.wait_phase(&name, Phase::Completed, MIGRATION).await?;
        let events = object_events(pool, "Node", &node).await?;
        assert!(
            events.iter().any(|(r, note)| r == "GpuSharingFound" && note.contains("counted as 2")),
            "{events:?}"
        );
        Ok(())
    })
    .await
}

#[tokio::test]
async fn sharing_in_the_device_plugins_config_shows_before_the_move_without_labels() -> anyhow::Result<()> {
    use k8s_openapi::api::core::v1::ConfigMap;
    use std::collections::BTreeMap;
    use switchyard_e2e::sim::GpuLayout;
    let _cluster = locks::cluster_shared().await?;
    let _nvidia = locks::nvidia_gpu().await?;
    // No GPU Feature Discovery (the device plugin's chart leaves it off by default). n0 runs the
    // config its node label picks, time-slicing 2 ways (nvidia.com/gpu: 4 on 2 GPUs); n1 has no
    // label and runs the `default` config, which shares nothing.
    let picked = BTreeMap::from([("nvidia.com/device-plugin.config".to_owned(), "ts".to_owned())]);
    let layouts = vec![
        (GpuLayout { time_slicing_replicas: 2, ..GpuLayout::gpus(2) }, picked),
        (GpuLayout::gpus(2), BTreeMap::new()),
    ];
    let pool = Pool::with_layouts("dpconfig", layouts).await?;
    pool.run(async |pool| {
        let name = pool.id.clone();
        let (shared, plain) = (pool.nodes[0].clone(), pool.nodes[1].clone());
        let ns = &pool.system_ns.clone();
        // The ConfigMap and the pod template NVIDIA's device-plugin chart renders with `config.map`
        // and `config.fallbackStrategies: [named, single]`: its config-manager picks a key per node.
        let configs: ConfigMap = serde_json::from_value(json!({
            "metadata": {"name": "nvdp-configs"},
            "data": {
                "default": "version: v1\nflags:\n  migStrategy: none\n",
                "ts": "version: v1\nflags:\n  migStrategy: none\nsharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 2\n",
            },
        }))?;
        Api::<ConfigMap>::namespaced(pool.client.clone(), ns).create(&PostParams::default(), &configs).await?;
        let manager_env = json!([
            {"name": "NODE_LABEL", "value": "nvidia.com/device-plugin.config"},
            {"name": "CONFIG_FILE_SRCDIR", "value": "/available-configs"},
            {"name": "CONFIG_FILE_DST", "value": "/config/config.yaml"},
            {"name": "DEFAULT_CONFIG", "value": ""},
            {"name": "FALLBACK_STRATEGIES", "value": "named,single"},
        ]);
        let mounts = json!([{"name": "available-configs", "mountPath": "/available-configs"}, {"name": "config", "mountPath": "/config"}]);
        let template = json!({"spec": {"template": {"spec": {
            "containers": [
                {"name": "main", "image": "registry.k8s.io/pause:3.10",
                 "env": [{"name": "CONFIG_FILE", "value": "/config/config.yaml"}],
                 "volumeMounts": [{"name": "config", "mountPath": "/config"}]},
                {"name": "nvidia-device-plugin-sidecar", "image": "registry.k8s.io/pause:3.10",
                 "env": manager_env, "volumeMounts": mounts},
            ],
            "volumes": [{"name": "available-configs", "configMap": {"name": "nvdp-configs"}}, {"name": "config", "emptyDir": {}}],
        }}}});
        Api::<DaemonSet>::namespaced(pool.client.clone(), ns)
            .patch(pool::DEVICE_PLUGIN_DS, &PatchParams::default(), &Patch::Strategic(&template))
            .await?;
        pool.migrations().create(&PostParams::default(), &pool.migration(&name, json!({}))?).await?;
        pool.start_operator()?;

        // Before anything moves: the condition, the plan and an event name the config and the loss.
        let message = &sharing_not_acknowledged(pool, &name).await?;
        let want = format!(
            "nvidia.com/gpu capacity drops from 4 to 2 on 1 node(s) that share it through the device plugin ({shared}: 4 on 2 GPU(s), time-slicing, 2 replicas per GPU (the device plugin's config {ns}/nvdp-configs, key ts))"
        );
        assert!(message.starts_with(&want), "want {want:?}, got {message}");
        assert!(!message.contains(&plain), "{plain} runs the default config, which shares nothing: {message}");
        let (code, plan) = plan_json(&name).await?;
        assert_eq!(code, 2, "plan blocks: {plan}");
        assert!(plan["blockers"].to_string().contains(&format!("{ns}/nvdp-configs, key ts")), "{}", plan["blockers"]);
        let events = event_reasons(pool, &name).await?;
        assert!(
            events.iter().any(|(r, note)| r == "GpuSharingNotAcknowledged" && note.contains("key ts")),
            "{events:?}"
        );
        for n in [&shared, &plain] {
            assert_eq!(pool::node_state(&pool.client, n).await?, "", "{n} was touched");
        }

        // Acknowledged, both move: the time-sliced node counts its 2 GPUs.
        patch_spec(&pool.migrations(), &name, json!({"acknowledge": {"gpuSharingLoss": true}})).await?;
        pool.wait_phase(&name, Phase::Completed, MIGRATION).await?;
        let n = Api::<Node>::all(pool.client.clone()).get(&shared).await?;
        let before: BTreeMap<String, u64> = serde_json::from_str(&n.annotations()["switchyard.dev/gpus-before"])?;
        assert_eq!(before, BTreeMap::from([("nvidia.com/gpu".to_string(), 2)]));
        Ok(())
    })
    .await
}

#[tokio::test]
async fn a_canary_that_never_finishes_fails_its_node_with_verify_timeout_and_the_other_moves()
-> anyhow::Result<()> {
    with_pool("verifyto", 2, 2, async |pool| {
        let name = pool.id.clone();
        let hung = pool.nodes[0].clone();
        pool.sim().hang_run_once_pods(&hung);
        let sampler = pool.sample();
        let canary = json!({"image": "registry.k8s.io/pause:3.10"});
        let overrides =
            json!({"strategy": {"maxUnavailable": 2, "verify": {"timeoutSeconds": 10, "canary": canary}}});
        let gpm = pool.migration(&name, overrides)?;
        pool.migrations().create(&PostParams::default(), &gpm).await?;
        pool.start_operator()?;

        // onFailure: Pause (the default): the node stops where it failed, the other completes.
        let done = pool
            .wait_status(&name, "one node failed in Verifying, the other migrated", MIGRATION, |g| {
                g.status.as_ref().is_some_and(|s| s.nodes.failed == 1 && s.nodes.migrated == 1)
            })
            .await?;
        let status = done.status.as_ref().unwrap();
        let f = status.failed.iter().find(|f| f.name == hung).expect("the hung node is listed");
        assert_eq!(
            (f.reason.as_str(), f.state),
            ("VerifyTimeout", switchyard_operator::api::v1alpha1::NodeState::Verifying)
        );
        assert!(f.message.contains("canary did not succeed within 10s"), "{}", f.message);
        assert_eq!(pool::node_state(&pool.client, &hung).await?, "Failed");
        // It failed after the switch: it stays cordoned on DRA for a person to look at, and the
        // pool says it needs one.
        let n = Api::<Node>::all(pool.client.clone()).get(&hung).await?;
        assert_eq!(backend(&n), "dra");
        assert_eq!(
            n.spec.as_ref().unwrap().unschedulable,
            Some(true),
            "a node that failed verification stays cordoned"
        );
        let stalled = condition(&done, "Stalled").expect("Stalled is set");
        assert_eq!(stalled.status, "True", "{stalled:?}");
        let events = event_reasons(pool, &name).await?;
        assert!(
            events.iter().any(|(r, note)| r == "VerifyTimeout" && note.contains(&hung)),
            "no VerifyTimeout event naming {hung}: {events:?}"
        );
        let samples = sampler.stop();
        assert!(samples.overlaps.is_empty(), "nodes served by both backends: {:?}", samples.overlaps);
        Ok(())
    })
    .await
}

/// SIGKILLs in the chaos scenario: at random instants, 0.2 to 2 s apart.
const CHAOS_KILLS: u32 = 20;

/// xorshift64: the chaos scenario's instants, reproducible from the printed seed.
fn next_random(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

// libtest starts a binary's tests in the order of their names. This one can take two minutes
// more than usual (a kill that cuts an eviction off holds its PDB's budget for 2 minutes, see
// below), so its name sorts it right after the API-server restart, which runs alone: started
// there, that wait overlaps the scenarios still to come instead of ending the run.
#[tokio::test]
async fn an_operator_killed_twenty_times_at_random_instants_of_a_six_node_migration_breaks_no_invariant()
-> anyhow::Result<()> {
    let _cluster = locks::cluster_shared().await?;
    // A 5 s device-plugin unregister delay makes each switch take seconds, so the kills land in
    // every step, not after the migration is over.
    let pool = Pool::with_unregister_delay("chaos", 6, 2, Duration::from_secs(5), GpuName::Renamed).await?;
    pool.run(async |pool| {
        let name = pool.id.clone();
        pool.deployment("trainer", 4, 1).await?;
        pool.pdb("trainer", "trainer", 3).await?;
        pool.deployment("web", 3, 0).await?;
        let before = pool.wait_running(7).await?;
        let web_before: BTreeSet<String> =
            before.iter().filter(|p| p.labels()["app"] == "web").map(|p| p.uid().unwrap()).collect();
        let sampler = pool.sample();
        // A kill that lands while an eviction is in flight can leave the eviction half done: the
        // API server has counted it against the PDB (status.disruptedPods) but the pod's delete
        // was cancelled with the request. The disruption controller forgets that entry only after
        // 2 minutes, and until then every eviction under this PDB answers 429. The drain timeout
        // must outlast that window, as it must in production (see README, "Drain").
        let gpm = pool
            .migration(&name, json!({"strategy": {"maxUnavailable": 1, "drain": {"timeoutSeconds": 200}}}))?;
        pool.migrations().create(&PostParams::default(), &gpm).await?;
        pool.start_operator()?;

        let seed = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_nanos() as u64 | 1;
        eprintln!("chaos: seed {seed}");
        let mut rng = seed;
        let mut kills = Vec::new();
        while kills.len() < CHAOS_KILLS as usize {
            tokio::time::sleep(Duration::from_millis(200 + next_random(&mut rng) % 1800)).await;
            let states = node_states(&pool.client, pool).await?;
            let moving: Vec<String> = states
                .iter()
                .filter(|(_, s)| !["", "Pending", "Migrated"].contains(&s.as_str()))
                .map(|(n, s)| format!("{n}={s}"))
                .collect();
            let migrated = states.values().filter(|s| *s == "Migrated").count();
            anyhow::ensure!(
                migrated < states.len(),
                "the migration completed after {} kill(s) of {CHAOS_KILLS} (seed {seed}): slow the pool down",
                kills.len()
            );
            pool.operator.take().unwrap().kill().await?;
            kills.push(format!("{migrated} migrated, {}", moving.join(" ")));
            pool.start_operator()?;
        }
        eprintln!("chaos: killed at\n  {}", kills.join("\n  "));

        let done = pool.wait_phase(&name, Phase::Completed, MIGRATION).await?;
        let status = done.status.as_ref().unwrap();
        assert_eq!((status.nodes.migrated, status.nodes.failed), (6, 0), "{:?}", status.failed);
        let nodes: Api<Node> = Api::all(pool.client.clone());
        for n in &pool.nodes {
            let node = nodes.get(n).await?;
            assert_eq!(backend(&node), "dra", "{n}");
            assert_ne!(node.spec.as_ref().unwrap().unschedulable, Some(true), "{n} is left cordoned");
        }
        let after = pool.wait_running(7).await?;
        assert_gpu_pods_on_dra(pool, &after).await?;
        let web_after: BTreeSet<String> =
            after.iter().filter(|p| p.labels()["app"] == "web").map(|p| p.uid().unwrap()).collect();
        assert_eq!(web_before, web_after, "non-GPU pods were evicted");

        let samples = sampler.stop();
        assert!(
            samples.overlaps.is_empty(),
            "nodes served by both backends (seed {seed}): {:?}",
            samples.overlaps
        );
        assert!(samples.orphaned_claim_holders.is_empty(), "{:?}", samples.orphaned_claim_holders);
        assert!(
            samples.deleted_pods.iter().all(|(_, gpu)| *gpu),
            "a non-GPU pod was deleted: {:?}",
            samples.deleted_pods
        );
        assert!(
            samples.max_in_flight.0 <= 1,
            "more nodes in flight than maxUnavailable 1 (seed {seed}): {:?}",
            samples.max_in_flight
        );
        let min_ready = samples.min_ready.get("trainer").copied();
        assert!(
            min_ready.is_some_and(|m| m >= 3),
            "the trainer PDB (minAvailable 3) was violated: {min_ready:?}"
        );
        Ok(())
    })
    .await
}

#[tokio::test]
async fn a_gate_that_closes_mid_migration_holds_the_drained_node_before_its_switch() -> anyhow::Result<()> {
    with_pool("gatehold", 2, 2, async |pool| {
        let name = pool.id.clone();
        // One GPU pod whose PDB allows no disruption keeps its node in Draining.
        pool.deployment("pinned", 1, 1).await?;
        pool.pdb("pinned", "pinned", 1).await?;
        let pinned = pool.wait_running(1).await?;
        let node = pinned[0].spec.as_ref().unwrap().node_name.clone().unwrap();
        let sampler = pool.sample();
        let gpm = pool.migration(&name, json!({"strategy": {"maxUnavailable": 2}}))?;
        pool.migrations().create(&PostParams::default(), &gpm).await?;
        pool.start_operator()?;
        pool.wait_status(&name, "the drain blocked by the PDB", MIGRATION, |g| {
            g.status.as_ref().is_some_and(|s| {
                s.in_progress.iter().any(|p| p.name == node && p.message.contains("PodDisruptionBudget"))
            })
        })
        .await?;

        // The gate closes mid-drain: a newer class takes nvidia.com/gpu from ours. Then the PDB
        // goes, the drain finishes, and the node must wait drained on the device plugin.
        let winner = format!("aaa-{}-shadow", pool.id);
        let class: DeviceClass = serde_json::from_value(json!({
            "metadata": {"name": winner, "labels": {"pool": pool.id}},
            "spec": {"selectors": [{"cel": {"expression": "device.driver == 'nobody.example.com'"}}],
                     "extendedResourceName": pool.resource}
        }))?;
        let classes: Api<DeviceClass> = Api::all(pool.client.clone());
        classes.create(&PostParams::default(), &class).await?;
        pool.wait_status(&name, "DeviceClassesReady=False", MIGRATION, |g| {
            condition(g, "DeviceClassesReady").is_some_and(|c| c.status == "False")
        })
        .await?;
        Api::<PodDisruptionBudget>::namespaced(pool.client.clone(), &pool.apps_ns)
            .delete("pinned", &DeleteParams::default())
            .await?;
        pool.wait_status(&name, "the drained node held by the closed gate", MIGRATION, |g| {
            g.status.as_ref().is_some_and(|s| {
                s.in_progress.iter().any(|p| p.name == node && p.message.starts_with("GateClosed:"))
            })
        })
        .await?;
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert_eq!(pool::node_state(&pool.client, &node).await?, "Draining", "held before the switch");
        let n = Api::<Node>::all(pool.client.clone()).get(&node).await?;
        assert_eq!(backend(&n), "device-plugin", "{node} switched under a shadowed class");
        assert_eq!(n.spec.as_ref().unwrap().unschedulable, Some(true), "held cordoned");

        // The gate opens again: the node switches and the pool completes.
        classes.delete(&winner, &DeleteParams::default()).await?;
        let done = pool.wait_phase(&name, Phase::Completed, MIGRATION).await?;
        assert_eq!(done.status.unwrap().nodes.migrated, 2);
        let after = pool.wait_running(1).await?;
        assert_gpu_pods_on_dra(pool, &after).await?;

        // A node that joins the completed pool moves too, and says so.
        let joined = pool.add_node(2).await?;
        let done = pool
            .wait_status(&name, "Completed with the joined node", MIGRATION, |g| {
                g.status.as_ref().is_some_and(|s| s.phase == Some(Phase::Completed) && s.nodes.migrated == 3)
            })
            .await?;
        assert_eq!(done.status.unwrap().nodes.total, 3);
        assert_eq!(backend(&Api::<Node>::all(pool.client.clone()).get(&joined).await?), "dra");
        let events = event_reasons(pool, &name).await?;
        assert!(
            events.iter().any(|(r, note)| r == "NodesJoined" && note.contains(&joined)),
            "no NodesJoined event naming {joined}: {events:?}"
        );
        let samples = sampler.stop();
        assert!(samples.overlaps.is_empty(), "nodes served by both backends: {:?}", samples.overlaps);
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
            json!([{"key": "switchyard.dev/gpu-backend", "operator": "NotIn", "values": ["dra", "none"]}]),
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

/// A Replace migration's old pool (the pool's nodes, on the device plugin) and its target: nodes
/// labelled `tier: dra` that only the DRA driver serves, as a provider's new node pool is. The
/// device plugin's DaemonSet keeps off them as the provider keeps its plugin off a DRA pool.
struct ReplacePools {
    /// The GpuPoolMigration overrides that select the old pool and name the target.
    overrides: serde_json::Value,
    targets: Vec<String>,
}

impl ReplacePools {
    async fn new(pool: &Pool, extra: serde_json::Value) -> anyhow::Result<Self> {
        let plugins: Api<DaemonSet> = Api::namespaced(pool.client.clone(), &pool.system_ns);
        let off_dra = json!({"spec": {"template": {"spec": {"affinity": {"nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": [
                {"key": "switchyard.dev/gpu-backend", "operator": "NotIn", "values": ["dra"]}]}]}}}}}}});
        plugins.patch(pool::DEVICE_PLUGIN_DS, &PatchParams::default(), &Patch::Merge(&off_dra)).await?;
        let mut overrides = json!({
            "nodeSelector": {"matchExpressions": [{"key": "tier", "operator": "DoesNotExist"}]},
            "strategy": {"type": "Replace", "maxUnavailable": 1,
                "replace": {"targetNodeSelector": {"matchLabels": {"pool": pool.id, "tier": "dra"}}}}
        });
        switchyard_operator::testing::merge_patch(&mut overrides, &extra);
        Ok(Self { overrides, targets: Vec::new() })
    }

    /// Adds a target node of `gpus` GPUs and waits until the driver publishes them.
    async fn add_target(&mut self, pool: &Pool, gpus: u32) -> anyhow::Result<String> {
        use switchyard_e2e::sim::{GpuLayout, SimNode};
        let name = format!("{}-t{}", pool.id, self.targets.len());
        let labels = [("pool", pool.id.as_str()), ("tier", "dra"), ("switchyard.dev/gpu-backend", "dra")]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect();
        let layout = GpuLayout { gpu_resource: Some(pool.resource.clone()), ..GpuLayout::gpus(gpus) };
        pool.sim().add_node(SimNode { name: name.clone(), labels, layout }).await?;
        let slices: Api<k8s_openapi::api::resource::v1::ResourceSlice> = Api::all(pool.client.clone());
        let fields = format!("spec.nodeName={name},spec.driver={}", pool.driver);
        switchyard_e2e::wait::until(&format!("the driver to publish {name}'s GPUs"), MIGRATION, || {
            let (slices, fields) = (slices.clone(), fields.clone());
            async move {
                let devices: usize = slices
                    .list(&ListParams::default().fields(&fields))
                    .await?
                    .items
                    .iter()
                    .map(|s| s.spec.devices.as_ref().map_or(0, Vec::len))
                    .sum();
                Ok((devices == gpus as usize).then_some(()))
            }
        })
        .await?;
        self.targets.push(name.clone());
        Ok(name)
    }
}

/// Every GPU pod runs on a target node through a generated claim the driver allocated there.
async fn assert_gpu_pods_on_targets(pool: &Pool, targets: &[String], count: usize) -> anyhow::Result<()> {
    let pods = pool.wait_running(count).await?;
    let claims: Api<ResourceClaim> = Api::namespaced(pool.client.clone(), &pool.apps_ns);
    for p in &pods {
        let node = p.spec.as_ref().and_then(|s| s.node_name.clone()).unwrap_or_default();
        assert!(targets.contains(&node), "GPU pod {} runs on {node}, not on the target pool", p.name_any());
        let status = p.status.as_ref().and_then(|s| s.extended_resource_claim_status.as_ref());
        let claim =
            status.unwrap_or_else(|| panic!("GPU pod {} on {node} has no generated claim", p.name_any()));
        let claim = claims.get(&claim.resource_claim_name).await?;
        let results = claim.status.unwrap().allocation.unwrap().devices.unwrap().results.unwrap_or_default();
        assert_eq!(results.len(), 1, "{}", p.name_any());
        assert_eq!(
            (results[0].driver.as_str(), results[0].pool.as_str()),
            (pool.driver.as_str(), node.as_str())
        );
    }
    Ok(())
}

#[tokio::test]
async fn replace_moves_a_pool_onto_a_dra_pool_within_its_pdb_waits_for_room_and_rolls_back()
-> anyhow::Result<()> {
    with_pool("replace", 2, 2, async |pool| {
        let name = pool.id.clone();
        let mut pools = ReplacePools::new(pool, json!({})).await?;
        pools.add_target(pool, 2).await?;
        // Four GPU pods fill the two old nodes; the budget lets one go at a time.
        pool.deployment("trainer", 4, 1).await?;
        pool.pdb("trainer", "trainer", 3).await?;
        let before = pool.wait_running(4).await?;
        assert!(
            before.iter().all(|p| pool.nodes.contains(p.spec.as_ref().unwrap().node_name.as_ref().unwrap()))
        );
        let gpm = pool.migration(&name, pools.overrides.clone())?;
        pool.migrations().create(&PostParams::default(), &gpm).await?;

        // The plan, before anything moves: the first node fits, the second waits for room.
        let (_, plan) = plan_json(&name).await?;
        let replace = &plan["replace"];
        assert_eq!(replace["targetNodes"], 1, "{replace}");
        assert_eq!(replace["capacity"][0]["free"], 2, "{replace}");
        assert_eq!(replace["needed"][&pool.resource], 4, "{replace}");
        let fits: Vec<(String, bool)> = replace["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| (n["name"].as_str().unwrap().to_owned(), n["fits"].as_bool().unwrap()))
            .collect();
        assert_eq!(fits, [(pool.nodes[0].clone(), true), (pool.nodes[1].clone(), false)], "{replace}");
        assert!(
            replace["nodes"][1]["short"].as_str().unwrap().contains(&format!("2 {} missing", pool.resource))
        );

        let sampler = pool.sample();
        pool.start_operator()?;
        let short = format!("2 {} missing (the node's pods need 2, 0 free)", pool.resource);
        let waiting = pool
            .wait_status(&name, "the first node replaced, the second waiting for room", MIGRATION, |g| {
                g.status.as_ref().is_some_and(|s| {
                    s.nodes.migrated == 1
                        && s.in_progress.iter().any(|p| {
                            p.name == pool.nodes[1]
                                && p.message.starts_with("TargetCapacityShort:")
                                && p.message.contains(&short)
                        })
                })
            })
            .await?;
        let ready = condition(&waiting, "Ready").expect("Ready");
        assert_eq!(
            ready.reason, "TargetCapacityShort",
            "kubectl get gpm says what it waits for: {}",
            ready.message
        );
        assert!(
            ready.message.contains(&pool.nodes[1]) && ready.message.contains(&short),
            "{}",
            ready.message
        );
        let status = waiting.status.unwrap();
        let room = status.replace.as_ref().expect("status.replace");
        assert_eq!(room.replaced_nodes, [pool.nodes[0].clone()]);
        assert_eq!(
            (room.target_nodes, room.capacity[0].devices, room.capacity[0].free),
            (1, 2, 0),
            "{room:?}"
        );
        assert_eq!(status.phase, Some(Phase::Progressing));
        let nodes: Api<Node> = Api::all(pool.client.clone());
        let waiting_node = nodes.get(&pool.nodes[1]).await?;
        assert_eq!(
            waiting_node.spec.as_ref().unwrap().unschedulable,
            Some(true),
            "the waiting node is cordoned"
        );
        assert_eq!(pool::node_state(&pool.client, &pool.nodes[1]).await?, "Cordoned");
        // Nothing was evicted that had nowhere to go: the waiting node keeps its two pods.
        let on_waiting = pool
            .wait_running(4)
            .await?
            .iter()
            .filter(|p| p.spec.as_ref().unwrap().node_name.as_deref() == Some(pool.nodes[1].as_str()))
            .count();
        assert_eq!(on_waiting, 2);

        // A node joins the target pool: the second node drains onto it.
        pools.add_target(pool, 2).await?;
        let done = pool.wait_phase(&name, Phase::Completed, MIGRATION).await?;
        assert_gpu_pods_on_targets(pool, &pools.targets, 4).await?;
        let samples = sampler.stop();
        assert!(samples.events > 20, "the sampler saw too few events to mean anything: {}", samples.events);
        assert!(samples.overlaps.is_empty(), "nodes served by both backends: {:?}", samples.overlaps);
        assert!(
            samples.min_ready.get("trainer").is_some_and(|m| *m >= 3),
            "the PDB: {:?}",
            samples.min_ready
        );
        assert!(samples.max_in_flight.0 <= 1, "maxUnavailable 1: {:?}", samples.max_in_flight);
        for n in &pool.nodes {
            assert_eq!(
                samples.backend_history.get(n).map(Vec::as_slice),
                Some(&["device-plugin".to_owned()][..]),
                "{n}"
            );
        }
        let replaced = done.status.as_ref().unwrap().replace.as_ref().unwrap().replaced_nodes.clone();
        assert_eq!(replaced, pool.nodes);
        for n in &pool.nodes {
            let node = nodes.get(n).await?;
            assert_eq!(
                node.spec.as_ref().unwrap().unschedulable,
                Some(true),
                "{n} is left cordoned for removal"
            );
            assert_eq!(node.labels().get("switchyard.dev/replaced"), Some(&name), "{n}");
            assert_eq!(backend(&node), "device-plugin", "{n} never switched");
            assert_eq!(pool::node_state(&pool.client, n).await?, "Replaced");
        }
        let verified = pool
            .wait_status(&name, "the moved pods verified on the target", MIGRATION, |g| {
                g.status
                    .as_ref()
                    .and_then(|s| s.pods.as_ref())
                    .is_some_and(|p| p.verified == 4 && p.unverified == 0)
            })
            .await?;
        assert_eq!(condition(&verified, "Ready").map(|c| c.status.as_str()), Some("True"));
        let events = object_events(pool, "Node", &pool.nodes[0]).await?;
        assert!(events.iter().any(|(r, _)| r == "NodeReplaced"), "{events:?}");

        // Rolling back while the target pool stands: each old node is schedulable again, the
        // target's devices are fenced, and the pods that left come back through the eviction API,
        // within their budget, onto the device plugin.
        let sampler = pool.sample();
        patch_spec(&pool.migrations(), &name, json!({"direction": "Rollback"})).await?;
        pool.wait_phase(&name, Phase::RolledBack, MIGRATION).await?;
        // RolledBack once every pod that left is bound to an old node again: they start there.
        let pods: Api<Pod> = Api::namespaced(pool.client.clone(), &pool.apps_ns);
        switchyard_e2e::wait::until(
            "the pods running on the old nodes, on the device plugin",
            MIGRATION,
            || {
                let pods = pods.clone();
                let old = pool.nodes.clone();
                async move {
                    let running = pool::running(pods.list(&ListParams::default()).await?.items);
                    let back = running.len() == 4
                        && running.iter().all(|p| {
                            old.contains(p.spec.as_ref().unwrap().node_name.as_ref().unwrap())
                                && p.status.as_ref().unwrap().extended_resource_claim_status.is_none()
                        });
                    Ok(back.then_some(()))
                }
            },
        )
        .await?;
        let samples = sampler.stop();
        assert!(
            samples.min_ready.get("trainer").is_some_and(|m| *m >= 3),
            "the PDB held while the pods came back: {:?}",
            samples.min_ready
        );
        assert!(samples.overlaps.is_empty(), "nodes served by both backends: {:?}", samples.overlaps);
        for n in &pool.nodes {
            let node = nodes.get(n).await?;
            assert_ne!(node.spec.as_ref().unwrap().unschedulable, Some(true), "{n} is uncordoned");
            assert!(!node.labels().contains_key("switchyard.dev/replaced"), "{n}");
            assert!(!node.annotations().contains_key("switchyard.dev/moved"), "{n}: the record goes");
            assert_eq!(pool::node_state(&pool.client, n).await?, "RolledBack");
        }
        let fenced = fence_notes(pool).await?;
        assert!(
            pools.targets.iter().all(|t| fenced.iter().any(|note| note.contains(t.as_str()))),
            "each target node was fenced while pods came back from it: {fenced:?}"
        );
        // The fences go once nothing is left to come back; the target pool stands, untouched.
        let rules: Api<DeviceTaintRule> = Api::all(pool.client.clone());
        switchyard_e2e::wait::until("the target fences to go", MIGRATION, || {
            let (rules, selector) = (rules.clone(), format!("switchyard.dev/migration={name}"));
            async move {
                Ok(rules.list(&ListParams::default().labels(&selector)).await?.items.is_empty().then_some(()))
            }
        })
        .await?;
        for t in &pools.targets {
            let target = nodes.get(t).await?;
            assert_ne!(target.spec.as_ref().unwrap().unschedulable, Some(true), "{t}: never cordoned");
        }
        Ok(())
    })
    .await
}

/// The notes of the `TargetFenced` events of the pool's nodes.
async fn fence_notes(pool: &Pool) -> anyhow::Result<Vec<String>> {
    let mut notes = Vec::new();
    for n in &pool.nodes {
        let events = object_events(pool, "Node", n).await?;
        notes.extend(events.into_iter().filter(|(reason, _)| reason == "TargetFenced").map(|(_, note)| note));
    }
    Ok(notes)
}

#[tokio::test]
async fn replace_counts_only_ready_target_nodes_and_an_old_node_deleted_while_it_waits_leaves_the_pool()
-> anyhow::Result<()> {
    with_pool("replsick", 2, 1, async |pool| {
        let name = pool.id.clone();
        let mut pools = ReplacePools::new(pool, json!({"strategy": {"maxUnavailable": 2}})).await?;
        let target = pools.add_target(pool, 2).await?;
        pool.deployment("trainer", 2, 1).await?;
        let before = pool.wait_running(2).await?;
        assert!(
            before.iter().all(|p| pool.nodes.contains(p.spec.as_ref().unwrap().node_name.as_ref().unwrap()))
        );
        // The target's kubelet is down: its devices are published, but nothing can land there.
        pool.sim().set_ready(&target, false).await?;
        let gpm = pool.migration(&name, pools.overrides.clone())?;
        pool.migrations().create(&PostParams::default(), &gpm).await?;
        pool.start_operator()?;
        let waiting = pool
            .wait_status(&name, "both old nodes waiting for a Ready target", MIGRATION, |g| {
                g.status.as_ref().is_some_and(|s| {
                    s.in_progress.len() == 2
                        && s.in_progress.iter().all(|p| {
                            p.message.starts_with(
                                "TargetCapacityShort: the target pool (0 Ready, schedulable node(s))",
                            )
                        })
                })
            })
            .await?;
        let room = waiting.status.as_ref().unwrap().replace.clone().expect("status.replace");
        assert_eq!((room.target_nodes, room.capacity[0].devices), (0, 0), "{room:?}");
        for n in &pool.nodes {
            assert_eq!(pool::node_state(&pool.client, n).await?, "Cordoned", "{n} waits, nothing evicted");
        }

        // An old node goes away while it waits: it leaves the pool, and its pod, re-created by
        // its ReplicaSet, waits Pending for the target like the rest.
        let doomed = pool.nodes[1].clone();
        pool.sim().delete_node(&doomed).await?;
        pool.wait_status(&name, "the deleted node out of the pool", MIGRATION, |g| {
            g.status
                .as_ref()
                .is_some_and(|s| s.nodes.total == 1 && s.in_progress.iter().all(|p| p.name != doomed))
        })
        .await?;
        let events = event_reasons(pool, &name).await?;
        assert!(events.iter().any(|(r, n)| r == "NodeRemoved" && n.contains(&doomed)), "{events:?}");
        let pods: Api<Pod> = Api::namespaced(pool.client.clone(), &pool.apps_ns);
        switchyard_e2e::wait::until("the deleted node's pod re-created, Pending", MIGRATION, || {
            let (pods, doomed) = (pods.clone(), doomed.clone());
            async move {
                let all = pods.list(&ListParams::default()).await?.items;
                let on_doomed = all
                    .iter()
                    .any(|p| p.spec.as_ref().unwrap().node_name.as_deref() == Some(doomed.as_str()));
                let pending =
                    all.iter().any(|p| p.status.as_ref().unwrap().phase.as_deref() == Some("Pending"));
                Ok((!on_doomed && pending).then_some(()))
            }
        })
        .await?;
        assert_eq!(pool::node_state(&pool.client, &pool.nodes[0]).await?, "Cordoned", "still waiting");

        // The target's kubelet is back: the pending pod takes one device, the last old node's
        // pod the other, and the pool completes.
        pool.sim().set_ready(&target, true).await?;
        let done = pool.wait_phase(&name, Phase::Completed, MIGRATION).await?;
        let nodes = done.status.as_ref().unwrap().nodes;
        assert_eq!((nodes.total, nodes.migrated, nodes.failed), (1, 1, 0));
        assert_gpu_pods_on_targets(pool, &pools.targets, 2).await?;
        Ok(())
    })
    .await
}

#[tokio::test]
async fn replace_never_evicts_a_pod_pinned_to_the_old_pool_and_a_removed_target_gives_its_pod_back()
-> anyhow::Result<()> {
    with_pool("replpin", 1, 1, async |pool| {
        let name = pool.id.clone();
        let old = pool.nodes[0].clone();
        let mut pools = ReplacePools::new(pool, json!({})).await?;
        let target = pools.add_target(pool, 1).await?;
        // A Deployment whose pod may run only on the old node: the target has a free GPU, but
        // evicted, the pod would stay Pending.
        let deployments: Api<Deployment> = Api::namespaced(pool.client.clone(), &pool.apps_ns);
        let pinned: Deployment = serde_json::from_value(json!({
            "metadata": {"name": "pinned"},
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": {"app": "pinned"}},
                "template": {
                    "metadata": {"labels": {"app": "pinned"}},
                    "spec": {
                        "nodeSelector": {"pool": pool.id, "kubernetes.io/hostname": old},
                        "terminationGracePeriodSeconds": 1,
                        "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10",
                            "resources": {"limits": {&pool.resource: "1"}}}]
                    }
                }
            }
        }))?;
        deployments.create(&PostParams::default(), &pinned).await?;
        let before = pool.wait_running(1).await?;
        let (pod, uid) = (before[0].name_any(), before[0].uid());
        let gpm = pool.migration(&name, pools.overrides.clone())?;
        pool.migrations().create(&PostParams::default(), &gpm).await?;
        let why = format!("nodeSelector kubernetes.io/hostname={old}, the node has kubernetes.io/hostname={target}");

        // The plan says so before anything moves, and blocks: the only node cannot move.
        let (code, plan) = plan_json(&name).await?;
        let node = &plan["replace"]["nodes"][0];
        assert_eq!(node["fits"], false, "{plan}");
        let short = node["short"].as_str().unwrap_or_default();
        assert!(short.contains(&pod) && short.contains(&why), "{short}");
        assert_eq!(code, 2, "a blocker: {}", plan["blockers"]);
        let text = tokio::process::Command::new(switchyard_e2e::cluster::cli_bin())
            .args(["plan", &name])
            .env("KUBECONFIG", switchyard_e2e::cluster::kubeconfig())
            .stdin(std::process::Stdio::null())
            .output()
            .await?;
        let text = String::from_utf8_lossy(&text.stdout);
        assert!(text.contains(&format!("{old}  needs 1 {}: waits: no Ready, schedulable target node accepts 1", pool.resource)), "{text}");
        assert!(text.contains("nothing to place (strategy Replace)"), "{text}");

        pool.start_operator()?;
        let waiting = pool
            .wait_status(&name, "the node waiting for a target node that accepts its pod", MIGRATION, |g| {
                g.status.as_ref().is_some_and(|s| {
                    s.in_progress.iter().any(|p| {
                        p.message.starts_with(
                            "TargetCapacityShort: no Ready, schedulable target node accepts 1 of this node's GPU pods",
                        ) && p.message.contains(&pod)
                    })
                })
            })
            .await?;
        let message = &waiting.status.as_ref().unwrap().in_progress[0].message;
        assert!(message.contains(&why) && message.contains("evictWithoutCapacity"), "{message}");
        assert_eq!(condition(&waiting, "Ready").map(|c| c.reason.as_str()), Some("TargetCapacityShort"));
        let nodes: Api<Node> = Api::all(pool.client.clone());
        let cordoned = nodes.get(&old).await?.spec.and_then(|s| s.unschedulable);
        assert_eq!(cordoned, Some(true), "cordoned while it waits: nothing new lands there");
        tokio::time::sleep(Duration::from_secs(5)).await;
        let pods: Api<Pod> = Api::namespaced(pool.client.clone(), &pool.apps_ns);
        let still = pods.get(&pod).await?;
        assert!(
            still.uid() == uid && still.metadata.deletion_timestamp.is_none(),
            "the pinned pod was evicted with nowhere to go"
        );

        // The pin goes: the Deployment rolls its pod onto the target, and the node is replaced.
        let unpin = json!({"spec": {"template": {"spec": {"nodeSelector": {"kubernetes.io/hostname": null}}}}});
        deployments.patch("pinned", &PatchParams::default(), &Patch::Merge(&unpin)).await?;
        pool.wait_phase(&name, Phase::Completed, MIGRATION).await?;
        assert_gpu_pods_on_targets(pool, &pools.targets, 1).await?;
        assert_eq!(pool::node_state(&pool.client, &old).await?, "Replaced");

        // The target pool is removed, and the migration rolls back: the pod the target took with
        // it comes back to the old node, on the device plugin.
        pool.sim().delete_node(&target).await?;
        patch_spec(&pool.migrations(), &name, json!({"direction": "Rollback"})).await?;
        pool.wait_phase(&name, Phase::RolledBack, MIGRATION).await?;
        switchyard_e2e::wait::until("the pod back on the old node", MIGRATION, || {
            let (pods, old) = (pods.clone(), old.clone());
            async move {
                let running = pool::running(pods.list(&ListParams::default()).await?.items);
                let back = running.len() == 1
                    && running.iter().all(|p| {
                        p.spec.as_ref().unwrap().node_name.as_deref() == Some(old.as_str())
                            && p.status.as_ref().unwrap().extended_resource_claim_status.is_none()
                    });
                Ok(back.then_some(()))
            }
        })
        .await?;
        let node = nodes.get(&old).await?;
        assert_ne!(node.spec.as_ref().unwrap().unschedulable, Some(true), "uncordoned");
        assert!(!node.labels().contains_key("switchyard.dev/replaced"));
        assert!(!node.annotations().contains_key("switchyard.dev/moved"));
        Ok(())
    })
    .await
}

#[tokio::test]
async fn replace_drains_as_kubectl_drain_does_and_a_target_overlapping_the_pool_is_refused()
-> anyhow::Result<()> {
    with_pool("replbare", 1, 1, async |pool| {
        let name = pool.id.clone();
        let mut pools = ReplacePools::new(pool, json!({})).await?;
        pools.add_target(pool, 1).await?;
        // The old node is one an admin kept cluster-autoscaler from removing.
        let nodes: Api<Node> = Api::all(pool.client.clone());
        let keep = json!({"metadata": {"annotations": {"cluster-autoscaler.kubernetes.io/scale-down-disabled": "true"}}});
        nodes.patch(&pool.nodes[0], &PatchParams::default(), &Patch::Merge(&keep)).await?;
        // A bare GPU pod, as `kubectl run` makes: the drain keeps it until the spec forces it.
        let pods = bare_notebook(pool).await?;
        pool.wait_running(1).await?;

        // First a target selector that also selects the old node: nothing starts, and the
        // condition says which node and what to change.
        let mut overrides = pools.overrides.clone();
        overrides["strategy"]["replace"]["targetNodeSelector"] = json!({"matchLabels": {"pool": pool.id}});
        let gpm = pool.migration(&name, overrides)?;
        pool.migrations().create(&PostParams::default(), &gpm).await?;
        pool.start_operator()?;
        let refused = pool
            .wait_status(&name, "PrerequisitesMet False: TargetOverlapsPool", MIGRATION, |g| {
                condition(g, "PrerequisitesMet").is_some_and(|c| c.reason == "TargetOverlapsPool")
            })
            .await?;
        let message = &condition(&refused, "PrerequisitesMet").unwrap().message;
        assert!(
            message.contains(&pool.nodes[0]) && message.contains("make the two selectors disjoint"),
            "{message}"
        );
        assert_eq!(pool::node_state(&pool.client, &pool.nodes[0]).await?, "", "the node never started");
        // The type cannot change, but the target can: a new migration with the right one.
        pool.migrations().delete(&name, &DeleteParams::default()).await?;
        switchyard_e2e::wait::until("the refused migration to go", MIGRATION, || async {
            Ok(pool.migrations().get_opt(&name).await?.is_none().then_some(()))
        })
        .await?;
        let gpm = pool.migration(&name, pools.overrides.clone())?;
        pool.migrations().create(&PostParams::default(), &gpm).await?;
        let waiting = pool
            .wait_status(&name, "the bare pod named", MIGRATION, |g| {
                g.status.as_ref().is_some_and(|s| {
                    s.in_progress.iter().any(|p| {
                        p.message.starts_with("UnmanagedPodsBlockDrain:") && p.message.contains("notebook")
                    })
                })
            })
            .await?;
        assert!(waiting.status.unwrap().in_progress[0].message.contains("spec.strategy.drain.force"));
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert!(
            pods.get("notebook").await?.metadata.deletion_timestamp.is_none(),
            "the bare pod was evicted"
        );
        patch_spec(&pool.migrations(), &name, json!({"strategy": {"drain": {"force": true}}})).await?;
        pool.wait_phase(&name, Phase::Completed, MIGRATION).await?;
        assert!(pods.get_opt("notebook").await?.is_none(), "forced: the bare pod was evicted");
        // Left for removal, and the migration says what keeps the autoscaler from removing it.
        let events = object_events(pool, "Node", &pool.nodes[0]).await?;
        let blocked = events.iter().find(|(r, _)| r == "RemovalBlocked").map(|(_, n)| n.as_str());
        assert!(
            blocked.is_some_and(|n| n.contains("cluster-autoscaler.kubernetes.io/scale-down-disabled=true")),
            "{events:?}"
        );

        // Someone uncordons the replaced node and a GPU pod lands there, on the device plugin:
        // the migration reports it rather than counting it as moved.
        let uncordon = |to: bool| Patch::Merge(json!({"spec": {"unschedulable": to}}));
        nodes.patch(&pool.nodes[0], &PatchParams::default(), &uncordon(false)).await?;
        let stray: Pod = serde_json::from_value(json!({
            "metadata": {"name": "stray"},
            "spec": {"nodeSelector": {"kubernetes.io/hostname": pool.nodes[0]}, "terminationGracePeriodSeconds": 1,
                "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10",
                    "resources": {"limits": {&pool.resource: "1"}}}]}
        }))?;
        pods.create(&PostParams::default(), &stray).await?;
        let reported = pool
            .wait_status(&name, "the pod on the replaced node reported", MIGRATION, |g| {
                g.status.as_ref().and_then(|s| s.pods.as_ref()).is_some_and(|p| {
                    p.unverified_pods.iter().any(|u| u.name == "stray" && u.reason == "OnReplacedNode")
                })
            })
            .await?;
        let stray = reported.status.unwrap().pods.unwrap().unverified_pods.into_iter().find(|u| u.name == "stray");
        let stray = stray.expect("the stray pod named");
        assert_eq!(stray.node, pool.nodes[0]);
        assert!(stray.message.contains("left for removal"), "{}", stray.message);
        pods.delete("stray", &DeleteParams::default()).await?;
        nodes.patch(&pool.nodes[0], &PatchParams::default(), &uncordon(true)).await?;

        // Deleting the finished migration leaves the replaced node cordoned for removal.
        pool.migrations().delete(&name, &DeleteParams::default()).await?;
        switchyard_e2e::wait::until("the migration to be deleted", MIGRATION, || async {
            Ok(pool.migrations().get_opt(&name).await?.is_none().then_some(()))
        })
        .await?;
        let node = nodes.get(&pool.nodes[0]).await?;
        assert_eq!(node.spec.as_ref().unwrap().unschedulable, Some(true));
        assert_eq!(node.labels().get("switchyard.dev/replaced"), Some(&name));
        Ok(())
    })
    .await
}
