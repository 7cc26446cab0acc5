//! Kueue v0.19.2, built from its module and installed from its own Helm chart
//! (`e2e/hack/render-kueue.sh`), admits GPU Jobs on the real nodes before, during and after
//! Switchyard moves them from NVIDIA's device plugin to DRA, with the packaged operator and agent.
//! Kueue is set up as its DRA guide says: the ClusterQueue's quota key is the extended resource
//! name (`nvidia.com/gpu` in `coveredResources`), no DeviceClass mapping; its webhooks and its
//! visibility API run in its pod, which the API server calls at the pod's address.
//!
//! What it shows:
//! - before: 5 of 6 Jobs admitted against a quota of 5 GPUs, the sixth waiting for quota, each
//!   admitted Job's pod on NVIDIA's device plugin; the ClusterQueue's usage is 5 `nvidia.com/gpu`;
//! - half migrated (a first migration moved one node of three): the admitted Jobs run on both
//!   backends at once, some pods with a generated claim on a DRA node, some on the device plugin,
//!   and Kueue's usage is still 5 `nvidia.com/gpu` and nothing else: each GPU counted once, under
//!   the extended resource name; a Job deleted there lets the waiting one in;
//! - after: every admitted Job's pod runs through DRA, the usage is the same;
//! - Switchyard's inventory says of that ClusterQueue what Kueue did: it counts a GPU once on either
//!   backend.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::{Api, Client, ResourceExt};
use serde_json::json;
use switchyard_e2e::real::{self, LABEL_GPU_PRESENT};
use switchyard_e2e::{cluster, wait};
use switchyard_operator::api::v1alpha1::{GpuPoolMigration, Phase};

const DRIVER: &str = "gpu.switchyard.dev";
const GPU: &str = "nvidia.com/gpu";
/// GPUs in the ClusterQueue's quota: one more than the device plugin's GPUs left once one of the
/// three 2-GPU nodes has moved, so half migrated at least one admitted Job must run on DRA.
const QUOTA: i64 = 5;
/// One Job more than the quota: it waits.
const JOBS: usize = 6;
const QUEUE_LABEL: &str = "kueue.x-k8s.io/queue-name";
/// The node the first, one-node migration selects.
const FIRST: &str = "e2e.switchyard.dev/first";

#[tokio::test]
async fn kueue_admits_gpu_jobs_before_during_and_after_a_migration_and_counts_each_gpu_once()
-> anyhow::Result<()> {
    real::alone_on_real_nodes("kueue", scenario, diagnostics, cleanup).await
}

fn pool_migration(id: &str) -> anyhow::Result<GpuPoolMigration> {
    let driver_ds = (real::SYSTEM_NS, "switchyard-driver-agent");
    Ok(serde_json::from_value(real::pool_migration(id, DRIVER, DRIVER, driver_ds, "Managed"))?)
}

/// A Job of one pod asking for one `nvidia.com/gpu` the plain way, queued in `queue`. A pod evicted
/// by a drain is replaced without counting as a failure, as a training Job's policy says.
fn gpu_job(name: &str, queue: &str) -> anyhow::Result<Job> {
    Ok(serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {QUEUE_LABEL: queue}},
        "spec": {
            "parallelism": 1, "completions": 1, "backoffLimit": 0,
            "podFailurePolicy": {"rules": [{"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]}]},
            "template": {
                "metadata": {"labels": {"app": "kueue-job", "job": name}},
                "spec": {
                    "restartPolicy": "Never",
                    "terminationGracePeriodSeconds": 5,
                    "containers": [{
                        "name": "cuda", "image": real::WORKLOAD_IMAGE, "imagePullPolicy": "Never",
                        // A training step stopped by SIGTERM has not finished: it exits 143, so
                        // an evicted pod fails (and the policy above replaces it) rather than
                        // completing the Job as the workload's own exit 0 would.
                        "command": ["/bin/sh", "-c", "trap 'exit 143' TERM; /workload.sh & wait $!"],
                        "resources": {"limits": {GPU: "1"}},
                    }],
                },
            },
        },
    }))?)
}

/// `kubectl get -o json` of a Kueue object.
fn kueue_object(kind: &str, name: &str, ns: Option<&str>) -> anyhow::Result<serde_json::Value> {
    let mut args = vec!["get", kind, name, "-o", "json"];
    if let Some(ns) = ns {
        args.extend(["-n", ns]);
    }
    Ok(serde_json::from_str(&real::kubectl(&args)?)?)
}

/// The ClusterQueue's usage per resource, from `status.flavorsUsage`, summed over its flavors.
fn usage(id: &str) -> anyhow::Result<BTreeMap<String, i64>> {
    let cq = kueue_object("clusterqueues.kueue.x-k8s.io", id, None)?;
    let mut out = BTreeMap::new();
    for flavor in cq["status"]["flavorsUsage"].as_array().into_iter().flatten() {
        for r in flavor["resources"].as_array().into_iter().flatten() {
            let total = r["total"].as_str().and_then(|t| t.parse::<i64>().ok()).unwrap_or(0);
            *out.entry(r["name"].as_str().unwrap_or_default().to_owned()).or_default() += total;
        }
    }
    Ok(out)
}

/// Kueue's usage once its ClusterQueue's status has caught up: Kueue writes it after an admission
/// or a finished Job, asynchronously. `QUOTA` GPUs under `nvidia.com/gpu` as soon as it reads so,
/// else what it reads after 30 s, for the caller's assertion to show.
async fn usage_when(id: &str, gpus: i64) -> anyhow::Result<BTreeMap<String, i64>> {
    let want = BTreeMap::from([(GPU.to_owned(), gpus)]);
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let now = usage(id)?;
        if now == want || std::time::Instant::now() >= deadline {
            return Ok(now);
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// The Jobs Kueue let run (not suspended), by name.
async fn admitted(client: &Client, ns: &str) -> anyhow::Result<Vec<String>> {
    let jobs: Api<Job> = Api::namespaced(client.clone(), ns);
    Ok(jobs
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|j| j.spec.as_ref().and_then(|s| s.suspend) == Some(false))
        .map(|j| j.name_any())
        .collect())
}

/// The running, Ready pods of the Jobs, each with whether it holds a generated claim.
async fn running_job_pods(client: &Client, ns: &str) -> anyhow::Result<Vec<(Pod, bool)>> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    Ok(pods
        .list(&ListParams::default().labels("app=kueue-job"))
        .await?
        .items
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none() && real::ready(p))
        .map(|p| {
            let claim = p.status.as_ref().and_then(|s| s.extended_resource_claim_status.as_ref()).is_some();
            (p, claim)
        })
        .collect())
}

/// Waits until exactly `want` admitted Jobs each have a Ready pod that printed its GPU, and
/// returns those pods with whether each holds a claim.
async fn wait_admitted_running(client: &Client, ns: &str, want: usize) -> anyhow::Result<Vec<(Pod, bool)>> {
    wait::until(&format!("{want} admitted Jobs running"), Duration::from_secs(240), || async move {
        let admitted = admitted(client, ns).await?;
        let running = running_job_pods(client, ns).await?;
        let ready = running
            .iter()
            .filter(|(p, _)| real::logs(ns, &p.name_any()).is_ok_and(|l| l.contains("workload: ready")))
            .count();
        Ok((admitted.len() == want && running.len() == want && ready == want).then_some(running))
    })
    .await
}

/// Waits until the migration `name` has completed over `nodes` nodes.
async fn wait_completed(migrations: &Api<GpuPoolMigration>, name: &str, nodes: i32) -> anyhow::Result<()> {
    wait::until(&format!("migration {name} to complete"), Duration::from_secs(420), || async move {
        let s = migrations.get(name).await?.status.unwrap_or_default();
        anyhow::ensure!(s.phase != Some(Phase::Failed), "migration {name} failed: {s:?}");
        Ok((s.phase == Some(Phase::Completed) && s.nodes.total == nodes).then_some(()))
    })
    .await
}

async fn scenario(client: &Client, id: &str, names: &[String]) -> anyhow::Result<()> {
    let gpus_per_node = real::node_gpus().len() as i64;
    for n in names {
        real::label(client, n, json!({"pool": id, LABEL_GPU_PRESENT: "true"})).await?;
    }
    real::label(client, &names[0], json!({FIRST: id})).await?;
    real::install_device_plugin()?;
    real::install_switchyard(client).await?;
    real::install_kueue(client).await?;
    real::wait_allocatable(client, names, GPU, gpus_per_node, Duration::from_secs(120)).await?;

    // As Kueue's DRA guide sets it up: the extended resource name is the quota key.
    cluster::create_namespace(client, id).await?;
    real::kubectl_apply_json(&json!({"apiVersion": "v1", "kind": "List", "items": [
        {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor", "metadata": {"name": id}},
        {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue", "metadata": {"name": id},
         "spec": {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": id}},
                  "resourceGroups": [{"coveredResources": [GPU],
                                      "flavors": [{"name": id, "resources": [{"name": GPU, "nominalQuota": QUOTA}]}]}]}},
        {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue", "metadata": {"name": "gpus", "namespace": id},
         "spec": {"clusterQueue": id}},
    ]}))?;

    let jobs: Api<Job> = Api::namespaced(client.clone(), id);
    for i in 0..JOBS {
        jobs.create(&PostParams::default(), &gpu_job(&format!("train-{i}"), "gpus")?).await?;
    }
    // Kueue's webhook suspended each Job; Kueue admits as many as the quota holds.
    let before = wait_admitted_running(client, id, QUOTA as usize).await?;
    assert!(before.iter().all(|(_, claim)| !claim), "before the move every GPU comes from the device plugin");
    let waiting: Vec<String> = jobs
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .filter(|j| j.spec.as_ref().and_then(|s| s.suspend) == Some(true))
        .map(|j| j.name_any())
        .collect();
    assert_eq!(waiting.len(), JOBS - QUOTA as usize, "the quota holds {QUOTA} GPUs: {waiting:?}");
    assert_eq!(
        usage_when(id, QUOTA).await?,
        BTreeMap::from([(GPU.to_owned(), QUOTA)]),
        "Kueue's usage before the move"
    );

    // Half migrated: a first migration moves one node and completes; the pool's other two stay
    // on the device plugin until the second.
    let migrations: Api<GpuPoolMigration> = Api::all(client.clone());
    let first = format!("{id}-first");
    let mut one = pool_migration(id)?;
    one.metadata.name = Some(first.clone());
    one.spec.node_selector = serde_json::from_value(json!({"matchLabels": {"pool": id, FIRST: id}}))?;
    migrations.create(&PostParams::default(), &one).await?;
    wait_completed(&migrations, &first, 1).await?;

    // Kueue keeps counting each GPU once while the admitted Jobs run on both backends: the two
    // nodes left on the device plugin hold 4 GPUs, so of the 5 admitted Jobs one at least runs on
    // the migrated node, through a claim.
    let half = wait_admitted_running(client, id, QUOTA as usize).await?;
    let on_dra = half.iter().filter(|(_, claim)| *claim).count();
    assert!(
        on_dra >= 1 && on_dra < half.len(),
        "half migrated, the admitted Jobs run on both backends: {on_dra} of {} with a claim",
        half.len()
    );
    assert_eq!(
        usage_when(id, QUOTA).await?,
        BTreeMap::from([(GPU.to_owned(), QUOTA)]),
        "half migrated, Kueue counts each admitted GPU once, under {GPU}"
    );
    // A Job deleted there lets the waiting one in, on whichever backend has room.
    let finished = half[0].0.labels().get("job").cloned().unwrap_or_default();
    jobs.delete(&finished, &DeleteParams::foreground()).await?;
    let finished = &finished;
    wait::until("the waiting Job to be admitted", Duration::from_secs(120), || async move {
        let admitted = admitted(client, id).await?;
        Ok((admitted.len() == QUOTA as usize && !admitted.contains(finished)).then_some(()))
    })
    .await?;
    wait_admitted_running(client, id, QUOTA as usize).await?;
    assert_eq!(
        usage_when(id, QUOTA).await?,
        BTreeMap::from([(GPU.to_owned(), QUOTA)]),
        "after a Job swapped in, half migrated"
    );

    // The rest of the pool: the first migration is deleted (its node stays on DRA) and one over
    // the whole pool moves the other two.
    real::delete_migration(client, &first).await?;
    migrations.create(&PostParams::default(), &pool_migration(id)?).await?;
    wait_completed(&migrations, id, names.len() as i32).await?;
    let after = wait_admitted_running(client, id, QUOTA as usize).await?;
    assert!(after.iter().all(|(_, claim)| *claim), "after the move every admitted Job runs through DRA");
    assert_eq!(
        usage_when(id, QUOTA).await?,
        BTreeMap::from([(GPU.to_owned(), QUOTA)]),
        "Kueue's usage after the move"
    );

    // Switchyard's inventory says of the queue what Kueue did.
    let out = std::process::Command::new(cluster::cli_bin())
        .arg("--kubeconfig")
        .arg(cluster::kubeconfig())
        .args(["inventory", "--migration", id, "-o", "json"])
        .output()?;
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).map_err(|e| {
        anyhow::anyhow!("switchyard inventory -o json: {e}\n{}", String::from_utf8_lossy(&out.stderr))
    })?;
    let findings = report["findings"].as_array().or_else(|| report["inventory"]["findings"].as_array());
    let on_queue: Vec<&serde_json::Value> =
        findings.into_iter().flatten().filter(|f| f.to_string().contains(&format!("\"{id}\""))).collect();
    assert!(
        on_queue.iter().any(|f| f
            .to_string()
            .contains(&format!("uses {GPU} as its quota key, which counts a GPU once on either backend"))),
        "the inventory's finding on ClusterQueue {id}: {on_queue:?}\n{report}"
    );
    Ok(())
}

fn diagnostics(id: &str) -> String {
    real::diagnostics(
        id,
        &[
            &["get", "clusterqueues.kueue.x-k8s.io", id, "-o", "yaml"],
            &["-n", id, "get", "jobs,workloads.kueue.x-k8s.io,pods", "-o", "wide"],
            &["-n", "kueue-system", "logs", "deploy/kueue-controller-manager", "--tail=40"],
        ],
    )
}

async fn cleanup(client: &Client, id: &str, names: &[String]) -> anyhow::Result<()> {
    real::delete_migration(client, &format!("{id}-first")).await?;
    real::delete_migration(client, id).await?;
    // The Jobs go before the driver that prepared their claims, and before Kueue.
    real::delete_namespace(client, id).await?;
    for kind in ["clusterqueues.kueue.x-k8s.io", "resourceflavors.kueue.x-k8s.io"] {
        let _ = real::kubectl(&["delete", kind, id, "--ignore-not-found", "--wait=true", "--timeout=60s"]);
    }
    real::uninstall_kueue()?;
    real::uninstall_switchyard()?;
    real::uninstall_device_plugin()?;
    let classes: Api<k8s_openapi::api::resource::v1::DeviceClass> = Api::all(client.clone());
    let _ = classes.delete(DRIVER, &DeleteParams::default()).await;
    real::release_nodes(
        client,
        names,
        &["pool", FIRST, LABEL_GPU_PRESENT, switchyard_operator::well_known::LABEL_GPU_BACKEND],
    )
    .await
}
