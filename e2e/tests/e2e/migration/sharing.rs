//! Shared and renamed GPUs: unmapped, time-sliced and MIG resources that hold a pool until mapped
//! and acknowledged, found before the move or at the switch, and counted on their physical GPUs.

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::json;
use switchyard_e2e::locks;
use switchyard_e2e::pool::{self, Pool, patch_spec};
use switchyard_operator::api::v1alpha1::Phase;

use super::{MIGRATION, assert_gpu_pods_on_dra, condition, event_reasons, object_events, plan_json};

/// Waits for PrerequisitesMet False with reason GpuSharingNotAcknowledged; its message.
async fn sharing_not_acknowledged(pool: &Pool, name: &str) -> anyhow::Result<String> {
    let blocked = pool
        .wait_status(name, "PrerequisitesMet False: GpuSharingNotAcknowledged", MIGRATION, |g| {
            condition(g, "PrerequisitesMet").is_some_and(|c| c.reason == "GpuSharingNotAcknowledged")
        })
        .await?;
    Ok(condition(&blocked, "PrerequisitesMet").map(|c| c.message.clone()).unwrap_or_default())
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
            serde_json::from_str(&n.annotations()[switchyard_operator::well_known::ANNOTATION_GPUS_BEFORE])?;
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
        let before: BTreeMap<String, u64> = serde_json::from_str(&n.annotations()[switchyard_operator::well_known::ANNOTATION_GPUS_BEFORE])?;
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
        let before: BTreeMap<String, u64> = serde_json::from_str(&n.annotations()[switchyard_operator::well_known::ANNOTATION_GPUS_BEFORE])?;
        assert_eq!(before, BTreeMap::from([("nvidia.com/gpu".to_string(), 2)]));
        Ok(())
    })
    .await
}
