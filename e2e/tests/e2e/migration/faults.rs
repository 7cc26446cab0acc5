//! Faults mid-migration: API errors, nodes lost or relabelled, the operator killed or its lease
//! taken, the API server restarted, a GPU XID, a canary that never finishes, a gate that closes.

use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::resource::v1::DeviceClass;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::json;
use switchyard_e2e::locks;
use switchyard_e2e::pool::{self, GpuName, Pool, backend, node_states};
use switchyard_e2e::wait::holds_for;
use switchyard_operator::api::v1alpha1::Phase;

use super::{
    MIGRATION, assert_gpu_pods_on_dra, condition, event_reasons, object_events, renamed_pool, with_pool,
};

/// [`with_pool`] with the cluster to itself, for a scenario that restarts the API server: no
/// other scenario runs through the outage.
async fn with_pool_alone<F>(prefix: &str, nodes: u32, gpus: u32, scenario: F) -> anyhow::Result<()>
where
    F: AsyncFnOnce(&mut Pool) -> anyhow::Result<()>,
{
    let _cluster = locks::cluster_alone().await?;
    renamed_pool(prefix, nodes, gpus, scenario).await
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
        let draining = json!({"metadata": {"annotations": {switchyard_operator::well_known::ANNOTATION_MIGRATION_STATE: "Draining"}}});
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
        // NotReady is waited out, not failed: the step's clock keeps running, but the node stays in
        // Switching, checked throughout the 10 s.
        holds_for("the NotReady node to wait in Switching", Duration::from_secs(10), || async {
            let state = pool::node_state(&client, &sick).await?;
            anyhow::ensure!(
                state == "Switching",
                "NotReady is waited out, not failed: {sick} is in {state:?}"
            );
            Ok(())
        })
        .await?;
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
                    // An agent shutting down (its node rolled back, its pod replaced): another
                    // one, or this one once restarted, takes the fault.
                    Ok((503, _)) => {}
                    // 400 (the body) or 404 (no gpu-1 in its inventory): wrong, fails at once.
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
        // The event is written after the node's patch lands: wait for it rather than read once.
        switchyard_e2e::wait::until("the NodeLeftPool event", MIGRATION, || async {
            let events = object_events(pool, "Node", &leaving).await?;
            Ok(events.iter().any(|(r, n)| r == "NodeLeftPool" && n.contains("Draining")).then_some(()))
        })
        .await?;
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
        // Held before the switch for as long as the gate stays closed: drained, cordoned, still on
        // the device plugin, checked throughout 3 s.
        let nodes: Api<Node> = Api::all(pool.client.clone());
        holds_for("the drained node held by the closed gate", Duration::from_secs(3), || async {
            let state = pool::node_state(&pool.client, &node).await?;
            anyhow::ensure!(state == "Draining", "held before the switch: {node} is in {state:?}");
            let n = nodes.get(&node).await?;
            let served_by = backend(&n);
            anyhow::ensure!(
                served_by == "device-plugin",
                "{node} switched under a shadowed class: served by {served_by}"
            );
            let unschedulable = n.spec.as_ref().and_then(|s| s.unschedulable);
            anyhow::ensure!(
                unschedulable == Some(true),
                "held cordoned: {node} has unschedulable {unschedulable:?}"
            );
            Ok(())
        })
        .await?;

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
