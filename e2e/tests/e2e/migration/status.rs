//! Status, membership and conflicts: a GPU pod on a migrated node served by another driver named,
//! a shadowed DeviceClass naming the winner, two migrations selecting the same nodes, and a
//! migrated node that loses only GPU Feature Discovery's labels staying in its pool.

use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::resource::v1::DeviceClass;
use kube::api::{DeleteParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::json;
use switchyard_e2e::pool::{Pool, node_states, patch_spec};
use switchyard_e2e::wait::holds_for;
use switchyard_operator::api::v1alpha1::Phase;

use super::{MIGRATION, condition, event_reasons, object_events, record_state, with_pool};

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

        // Stalled means nothing moves: no node starts (its state stays unset or Pending), checked
        // throughout 3 s.
        holds_for("no node to move under the shadowed class", Duration::from_secs(3), || async {
            for (node, state) in node_states(&pool.client, pool).await? {
                anyhow::ensure!(
                    state.is_empty() || state == "Pending",
                    "{node} moved under a shadowed class: {state}"
                );
            }
            Ok(())
        })
        .await?;

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
        // Neither migration moves a node, checked throughout 3 s.
        holds_for("no node to move under two migrations", Duration::from_secs(3), || async {
            for (node, state) in node_states(&pool.client, pool).await? {
                anyhow::ensure!(
                    state.is_empty(),
                    "{node} was moved although two migrations select it: {state}"
                );
            }
            Ok(())
        })
        .await?;
        // Deleting one lets the other move the pool.
        pool.migrations().delete(&b, &DeleteParams::default()).await?;
        pool.wait_phase(&a, Phase::Completed, MIGRATION).await?;
        Ok(())
    })
    .await
}

/// A pool selected by a label GPU Feature Discovery writes: the selector is warned of before
/// anything moves, and once a migrated node loses that label (NVIDIA stops GFD where its DRA
/// driver serves the node) it stays in the pool, on DRA, its record kept; a node whose label
/// changes to another GPU leaves it, as any relabelled node does.
#[tokio::test]
async fn a_migrated_node_that_loses_only_gfd_labels_stays_in_the_pool() -> anyhow::Result<()> {
    use kube::api::{Patch, PatchParams};
    use switchyard_operator::well_known::LABEL_MIGRATION;
    const PRODUCT: &str = "nvidia.com/gpu.product";
    with_pool("gfdgone", 2, 1, async |pool| {
        let name = pool.id.clone();
        let nodes: Api<Node> = Api::all(pool.client.clone());
        let label = |value: Option<&str>| json!({"metadata": {"labels": {PRODUCT: value}}});
        for n in &pool.nodes {
            nodes
                .patch(n, &PatchParams::default(), &Patch::Merge(label(Some("NVIDIA-H100-80GB-HBM3"))))
                .await?;
        }
        let selector =
            json!({"nodeSelector": {"matchLabels": {"pool": pool.id, PRODUCT: "NVIDIA-H100-80GB-HBM3"}}});
        pool.migrations().create(&PostParams::default(), &pool.migration(&name, selector)?).await?;
        pool.start_operator()?;
        let done = pool.wait_phase(&name, Phase::Completed, MIGRATION).await?;
        let findings = condition(&done, "InventoryFindings").map(|c| c.message.clone()).unwrap_or_default();
        assert!(
            findings.contains(&format!("spec.nodeSelector uses {PRODUCT}, written by GPU Feature Discovery")),
            "the selector is warned of: {findings}"
        );

        // GFD stops on the first node: its product label goes. The node stays a member.
        let (kept, changed) = (pool.nodes[0].clone(), pool.nodes[1].clone());
        nodes.patch(&kept, &PatchParams::default(), &Patch::Merge(label(None))).await?;
        holds_for(&format!("{kept} to stay in the pool without GFD's label"), Duration::from_secs(5), || {
            let (nodes, kept, shared, name) = (nodes.clone(), kept.clone(), &*pool, name.clone());
            async move {
                let n = nodes.get(&kept).await?;
                anyhow::ensure!(
                    n.labels().get(LABEL_MIGRATION) == Some(&name),
                    "{kept} was let go: {:?}",
                    n.labels()
                );
                let gpm = shared.migrations().get(&name).await?;
                let total = gpm.status.as_ref().map_or(0, |s| s.nodes.total);
                anyhow::ensure!(total == 2, "{kept} left the status: {total} node(s)");
                Ok(())
            }
        })
        .await?;
        let events = object_events(pool, "Node", &kept).await?;
        assert!(events.iter().all(|(r, _)| r != "NodeLeftPool"), "{events:?}");

        // A product label that changes is not GFD going away: that node leaves the pool.
        nodes
            .patch(&changed, &PatchParams::default(), &Patch::Merge(label(Some("NVIDIA-A100-SXM4-80GB"))))
            .await?;
        pool.wait_status(&name, &format!("{changed} out of the pool"), MIGRATION, |g| {
            g.status.as_ref().is_some_and(|s| s.nodes.total == 1)
        })
        .await?;
        let released = nodes.get(&changed).await?;
        assert!(!released.labels().contains_key(LABEL_MIGRATION), "{changed} is let go");
        Ok(())
    })
    .await
}
