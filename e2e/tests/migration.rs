//! The migration engine end to end: the real `switchyard-operator` process moves simulated GPU
//! pools between the device plugin and the real driver agent, on the real control plane. The
//! scenarios share the `nvidia.com/gpu` name, so they run one at a time (`pool::SERIAL`).

use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::api::{ListParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::json;
use switchyard_e2e::pool::{self, Pool, backend, node_states, patch_spec};
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
            .is_some_and(|l| l.contains_key("nvidia.com/gpu"));
        let node = p.spec.as_ref().unwrap().node_name.clone().unwrap();
        let claim = p.status.as_ref().unwrap().extended_resource_claim_status.as_ref();
        if !wants_gpu {
            assert!(claim.is_none(), "non-GPU pod {} has a claim", p.name_any());
            continue;
        }
        assert_eq!(backend(&nodes.get(&node).await?), "dra", "GPU pod {} runs on {node}", p.name_any());
        let claim =
            claim.unwrap_or_else(|| panic!("GPU pod {} has no extendedResourceClaimStatus", p.name_any()));
        let claim = claims.get(&claim.resource_claim_name).await?;
        let results = claim.status.unwrap().allocation.unwrap().devices.unwrap().results.unwrap_or_default();
        assert_eq!(results.len(), 1);
        assert_eq!(results[0].driver, pool.driver);
        assert_eq!(results[0].pool, node);
    }
    Ok(())
}

/// Runs `scenario` on a fresh pool and cleans the pool up whatever the outcome, so a failed
/// scenario leaves nothing behind on the shared cluster.
async fn with_pool<F>(prefix: &str, nodes: u32, gpus: u32, scenario: F) -> anyhow::Result<()>
where
    F: AsyncFnOnce(&mut Pool) -> anyhow::Result<()>,
{
    let _serial = pool::SERIAL.lock().await;
    let mut pool = Pool::new(prefix, nodes, gpus).await?;
    let result = scenario(&mut pool).await;
    if result.is_err() {
        eprintln!("scenario failed; operator and agent logs are in {}", pool.log_dir().display());
    }
    let cleaned = pool.cleanup().await;
    result.and(cleaned)
}

#[tokio::test]
async fn four_node_pool_migrates_to_dra_without_overlap_and_within_the_pdb() -> anyhow::Result<()> {
    with_pool("mig4", 4, 4, async |pool| forward_migration(pool).await).await
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

    let gpm = pool.migration(&name, json!({"strategy": {"maxUnavailable": 2}}))?;
    pool.migrations().create(&PostParams::default(), &gpm).await?;
    pool.start_operator()?;
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
        assert_eq!(pool::allocatable(&n, "nvidia.com/gpu"), 0, "{name} still advertises device-plugin GPUs");
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
    assert_eq!(
        samples.min_ready.get("trainer"),
        Some(&1),
        "the trainer PDB (minAvailable 1) was violated or never tested"
    );

    // The state of a completed migration, kept for the Argo CD and kstatus fixtures.
    record_state("completed", &done)
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
            std::path::Path::new(&dir).join(format!("{name}.yaml")),
            serde_yaml::to_string(&value)?,
        )?;
    }
    Ok(())
}

#[allow(dead_code)]
async fn list_pods(pool: &Pool) -> anyhow::Result<Vec<Pod>> {
    Ok(Api::<Pod>::namespaced(pool.client.clone(), &pool.apps_ns).list(&ListParams::default()).await?.items)
}

#[allow(dead_code)]
async fn unused(api: &Api<GpuPoolMigration>) -> anyhow::Result<()> {
    patch_spec(api, "x", json!({})).await
}
