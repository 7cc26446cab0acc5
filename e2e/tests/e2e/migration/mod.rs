//! The migration engine end to end: the real `switchyard-operator` process moves simulated GPU
//! pools between the device plugin and the real driver agent, on the real control plane.
//!
//! The scenarios are in rooms by concern: [`forward`] (the forward move and what holds a node on
//! the way), [`rollback`], [`faults`] (API errors, lost nodes, a killed operator, a restarted API
//! server, bad GPUs), [`sharing`] (shared and renamed GPUs), [`replace`] (`strategy.type:
//! Replace`) and [`status`] (what the status names, and conflicts). This module holds the helpers
//! that more than one room uses; a helper of one room lives in it.
//!
//! Scenarios run side by side (run-e2e.sh runs the `migration::` scenarios in one process with
//! several test threads, and the other simulator-based modules beside it in a second process). A
//! pool's GPUs have a name of their own (`nvidia.com/gpu-<pool>`, [`GpuName::Renamed`]) unless
//! the scenario is about `nvidia.com/gpu` itself (its GPU count, sharing, GPU Feature Discovery,
//! the GPU Operator); those take [`locks::nvidia_gpu`] and run one at a time, since two
//! DeviceClasses for one name shadow each other. A scenario that restarts the API server runs
//! alone ([`locks::cluster_alone`]).

mod faults;
mod forward;
mod replace;
mod rollback;
mod sharing;
mod status;

use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::api::{ListParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::json;
use switchyard_e2e::locks;
use switchyard_e2e::pool::{GpuName, Pool, backend};
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

async fn renamed_pool<F>(prefix: &str, nodes: u32, gpus: u32, scenario: F) -> anyhow::Result<()>
where
    F: AsyncFnOnce(&mut Pool) -> anyhow::Result<()>,
{
    let pool = Pool::with_unregister_delay(prefix, nodes, gpus, UNREGISTER, GpuName::Renamed).await?;
    pool.run(scenario).await
}

/// How long a device plugin's resources outlive its pod in the default pool.
const UNREGISTER: Duration = Duration::from_secs(1);

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
