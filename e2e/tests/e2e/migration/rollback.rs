//! Rollback: a migrated pool back on the device plugin within its budgets or past them, and a
//! failed drain or switch giving its node back.

use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::resource::v1::{DeviceClass, DeviceTaintRule, ResourceClaim};
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::json;
use switchyard_e2e::pool::{self, Pool, backend, node_states, patch_spec};
use switchyard_operator::api::v1alpha1::Phase;

use super::{
    MIGRATION, assert_gpu_pods_on_dra, condition, migrate_forward, object_events, record_state, with_pool,
};

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
/// holders go past it: here by deletion, since this control plane does not show its controller
/// manager's version (a NoExecute DeviceTaintRule where it shows v1.37.2 or later).
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

        // The spec allows it: past the drain timeout the holders go without their budget, and the
        // rollback finishes, two nodes at a time. This control plane runs its controller manager
        // as a process, so no pod or LeaseCandidate in kube-system shows its version, and the
        // operator cannot rely on the rule's NoExecute to evict pods with a generated claim
        // (kubernetes/kubernetes#141290, fixed in v1.37.2): it deletes them itself, as that
        // controller would, and the rule stays NoSchedule.
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
        let node = f.name.clone();
        let shared: &Pool = pool;
        let deleted = switchyard_e2e::wait::until("a RollbackDeletesPastBudgets event on the node", MIGRATION, || {
            let node = node.clone();
            async move {
                let events = object_events(shared, "Node", &node).await?;
                Ok(events.into_iter().find(|(r, _)| r == "RollbackDeletesPastBudgets").map(|(_, note)| note))
            }
        })
        .await?;
        assert!(deleted.contains("kubernetes/kubernetes#141290"), "{deleted}");
        let held_names: BTreeSet<String> = held.iter().map(|p| p.name_any()).collect();
        assert!(
            held_names.iter().any(|n| deleted.contains(n.as_str())),
            "the event names the pods it deleted: {deleted}"
        );
        let rules: Api<DeviceTaintRule> = Api::all(pool.client.clone());
        if let Some(r) = rules.get_opt(&rule).await? {
            assert_eq!(r.spec.taint.effect, "NoSchedule", "the rule is not relied on to evict");
        }
        let events = object_events(pool, "Node", &f.name).await?;
        assert!(events.iter().all(|(r, _)| r != "RollbackEvictsPastBudgets"), "{events:?}");
        // Each node's holder goes past the budget at its drain timeout; the pool rolls back.
        let done = pool.wait_phase(&name, Phase::RolledBack, MIGRATION).await?;
        assert_eq!(done.status.as_ref().unwrap().nodes.failed, 0);
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
        let left: Vec<&String> = n.annotations().keys().filter(|k| k.starts_with(switchyard_operator::well_known::SWITCHYARD_PREFIX)).collect();
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
