//! `strategy.type: Replace`: a pool drained onto a target pool of DRA nodes, what holds it (room on
//! one target node, CPU, pinned pods, bare pods, NotReady targets), and its rollback with the
//! target standing and fenced from the first return to the last.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::resource::v1::{DeviceTaintRule, ResourceClaim};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::json;
use switchyard_e2e::pool::{self, Pool, backend, patch_spec};
use switchyard_e2e::wait::holds_for;
use switchyard_operator::api::v1alpha1::Phase;
use switchyard_operator::well_known::{ANNOTATION_MIGRATION_STATE, LABEL_FENCED_NODE, LABEL_MIGRATION};

use super::{MIGRATION, bare_notebook, condition, event_reasons, object_events, plan_json, with_pool};

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
                {"key": switchyard_operator::well_known::LABEL_GPU_BACKEND, "operator": "NotIn", "values": ["dra"]}]}]}}}}}}});
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
        let labels = [
            ("pool", pool.id.as_str()),
            ("tier", "dra"),
            (switchyard_operator::well_known::LABEL_GPU_BACKEND, "dra"),
        ]
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

/// Every GPU pod runs on a target node through a generated claim the driver allocated there, one
/// device of that node for each GPU its limit asks for.
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
        let gpus: usize = p.spec.as_ref().unwrap().containers[0]
            .resources
            .as_ref()
            .and_then(|r| r.limits.as_ref())
            .and_then(|l| l.get(&pool.resource))
            .and_then(|q| q.0.parse().ok())
            .unwrap_or(0);
        assert_eq!(results.len(), gpus, "{}: one device per GPU of its limit", p.name_any());
        for r in &results {
            assert_eq!((r.driver.as_str(), r.pool.as_str()), (pool.driver.as_str(), node.as_str()));
        }
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
            assert_eq!(
                node.labels().get(switchyard_operator::well_known::LABEL_REPLACED),
                Some(&name),
                "{n}"
            );
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
        let timeline = FenceTimeline::watch(pool, &name, &pools.targets);
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
            assert!(!node.labels().contains_key(switchyard_operator::well_known::LABEL_REPLACED), "{n}");
            assert!(
                !node.annotations().contains_key(switchyard_operator::well_known::ANNOTATION_MOVED),
                "{n}: the record goes"
            );
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
            let (rules, selector) = (rules.clone(), format!("{LABEL_MIGRATION}={name}"));
            async move {
                Ok(rules.list(&ListParams::default().labels(&selector)).await?.items.is_empty().then_some(()))
            }
        })
        .await?;
        for t in &pools.targets {
            let target = nodes.get(t).await?;
            assert_ne!(target.spec.as_ref().unwrap().unschedulable, Some(true), "{t}: never cordoned");
        }
        // The fences stood from the first node's return to the last one's, in the API server's
        // order: each target fenced once, none unfenced before every old node was back (the old
        // nodes returned one at a time, so there was a moment between two returns), and no
        // pod allocated a target device in between.
        let seen = timeline.stop();
        let first = seen.iter().position(|s| matches!(s, Seen::Fenced(_))).expect("a fence");
        let back = seen.iter().position(|s| *s == Seen::AllBack).expect("every old node back");
        let fences: Vec<&Seen> = seen.iter().filter(|s| matches!(s, Seen::Fenced(_))).collect();
        assert_eq!(fences.len(), pools.targets.len(), "each target fenced once, never again: {seen:?}");
        assert!(seen[..back].iter().all(|s| !matches!(s, Seen::Unfenced(_))), "a fence went early: {seen:?}");
        assert!(
            seen[first..back].iter().all(|s| !matches!(s, Seen::Allocated { .. })),
            "a pod was allocated a fenced target's device: {seen:?}"
        );
        assert!(
            seen[back..].iter().any(|s| matches!(s, Seen::Unfenced(_))),
            "the fences went after: {seen:?}"
        );
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

/// What a Replace rollback did to its fences, as the watches saw it: a fence created or deleted, a
/// claim allocated a device on a target node, and every old node back.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Seen {
    Fenced(String),
    Unfenced(String),
    Allocated { claim: String, node: String },
    AllBack,
}

/// Watches the migration's fences (DeviceTaintRules), the apps' ResourceClaims and the pool's
/// nodes until stopped. Each [`Seen`] carries the resourceVersion (the etcd revision) of the
/// change that showed it, so the timeline is in the API server's order, not in the order the
/// three watches happened to deliver.
struct FenceTimeline {
    seen: std::sync::Arc<std::sync::Mutex<Vec<(u64, Seen)>>>,
    task: tokio::task::JoinHandle<()>,
}

enum Watched {
    Rule(kube::runtime::watcher::Event<DeviceTaintRule>),
    Claim(kube::runtime::watcher::Event<ResourceClaim>),
    Node(Box<kube::runtime::watcher::Event<Node>>),
}

impl FenceTimeline {
    fn watch(pool: &Pool, migration: &str, targets: &[String]) -> Self {
        use futures::StreamExt;
        use kube::runtime::watcher::{self, Event};
        let labels = |l: String| watcher::Config::default().labels(&l);
        let rules = watcher::watcher(
            Api::<DeviceTaintRule>::all(pool.client.clone()),
            labels(format!("{LABEL_MIGRATION}={migration}")),
        )
        .map(|e| e.map(Watched::Rule));
        let claims = watcher::watcher(
            Api::<ResourceClaim>::namespaced(pool.client.clone(), &pool.apps_ns),
            watcher::Config::default(),
        )
        .map(|e| e.map(Watched::Claim));
        let nodes =
            watcher::watcher(Api::<Node>::all(pool.client.clone()), labels(format!("pool={}", pool.id)))
                .map(|e| e.map(|n| Watched::Node(Box::new(n))));
        let mut events = futures::stream::select_all([rules.boxed(), claims.boxed(), nodes.boxed()]);
        let (old, targets) = (pool.nodes.clone(), targets.to_vec());
        let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let record = seen.clone();
        let task = tokio::spawn(async move {
            let rv = |m: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta| {
                m.resource_version.as_deref().and_then(|v| v.parse::<u64>().ok()).unwrap_or(0)
            };
            let fenced_node =
                |r: &DeviceTaintRule| r.labels().get(LABEL_FENCED_NODE).cloned().unwrap_or_default();
            let (mut standing, mut allocated) = (BTreeSet::new(), BTreeSet::new());
            let mut states: BTreeMap<String, String> = BTreeMap::new();
            let mut back = false;
            while let Some(event) = events.next().await {
                let Ok(event) = event else { continue };
                let push = |at: u64, s: Seen| record.lock().unwrap().push((at, s));
                match event {
                    Watched::Rule(Event::Apply(r) | Event::InitApply(r)) if standing.insert(r.name_any()) => {
                        push(rv(&r.metadata), Seen::Fenced(fenced_node(&r)));
                    }
                    Watched::Rule(Event::Delete(r)) => {
                        standing.remove(&r.name_any());
                        push(rv(&r.metadata), Seen::Unfenced(fenced_node(&r)));
                    }
                    // Claims allocated before the watch began are not news.
                    Watched::Claim(Event::InitApply(c)) => {
                        allocated.insert(c.name_any());
                    }
                    Watched::Claim(Event::Apply(c)) => {
                        let results = c
                            .status
                            .as_ref()
                            .and_then(|s| s.allocation.as_ref())
                            .and_then(|a| a.devices.as_ref())
                            .and_then(|d| d.results.clone())
                            .unwrap_or_default();
                        if let Some(r) = results.iter().find(|r| targets.contains(&r.pool))
                            && allocated.insert(c.name_any())
                        {
                            push(
                                rv(&c.metadata),
                                Seen::Allocated { claim: c.name_any(), node: r.pool.clone() },
                            );
                        }
                    }
                    Watched::Node(node) => {
                        let (Event::Apply(n) | Event::InitApply(n)) = *node else { continue };
                        let state =
                            n.annotations().get(ANNOTATION_MIGRATION_STATE).cloned().unwrap_or_default();
                        states.insert(n.name_any(), state);
                        if !back
                            && old.iter().all(|o| states.get(o).map(String::as_str) == Some("RolledBack"))
                        {
                            back = true;
                            push(rv(&n.metadata), Seen::AllBack);
                        }
                    }
                    _ => {}
                }
            }
        });
        FenceTimeline { seen, task }
    }

    /// Stops the watches; the timeline in the API server's order.
    fn stop(self) -> Vec<Seen> {
        self.task.abort();
        let mut seen = self.seen.lock().unwrap().clone();
        seen.sort_by_key(|(rv, _)| *rv);
        seen.into_iter().map(|(_, s)| s).collect()
    }
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
        // With nowhere to go, the pinned pod is not evicted: the same pod, not terminating,
        // checked throughout 5 s. A pod that is gone is read as `None` (a 404 would be retried).
        let pods: Api<Pod> = Api::namespaced(pool.client.clone(), &pool.apps_ns);
        holds_for("the pinned pod to stay", Duration::from_secs(5), || async {
            let still = pods.get_opt(&pod).await?;
            anyhow::ensure!(
                still.is_some_and(|p| p.uid() == uid && p.metadata.deletion_timestamp.is_none()),
                "the pinned pod was evicted with nowhere to go"
            );
            Ok(())
        })
        .await?;

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
        assert!(!node.labels().contains_key(switchyard_operator::well_known::LABEL_REPLACED));
        assert!(!node.annotations().contains_key(switchyard_operator::well_known::ANNOTATION_MOVED));
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
        // Until the spec forces it, the drain keeps the bare pod: there and not terminating,
        // checked throughout 5 s. A pod that is gone is read as `None` (a 404 would be retried).
        holds_for("the bare pod to be kept", Duration::from_secs(5), || async {
            let notebook = pods.get_opt("notebook").await?;
            anyhow::ensure!(
                notebook.is_some_and(|p| p.metadata.deletion_timestamp.is_none()),
                "the bare pod was evicted"
            );
            Ok(())
        })
        .await?;
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
        assert_eq!(node.labels().get(switchyard_operator::well_known::LABEL_REPLACED), Some(&name));
        Ok(())
    })
    .await
}

/// A Deployment of one pod asking for `gpus` of the pool's GPUs and `cpu`.
async fn gpu_and_cpu_deployment(pool: &Pool, name: &str, gpus: u32, cpu: &str) -> anyhow::Result<()> {
    let d: Deployment = serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "nodeSelector": {"pool": pool.id},
                    "terminationGracePeriodSeconds": 1,
                    "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10", "resources": {
                        "limits": {&pool.resource: gpus.to_string()}, "requests": {"cpu": cpu}}}]
                }
            }
        }
    }))?;
    Api::<Deployment>::namespaced(pool.client.clone(), &pool.apps_ns)
        .create(&PostParams::default(), &d)
        .await?;
    Ok(())
}

/// A pod bound to `node` that requests `cpu` and no GPU: what a DaemonSet or a CPU workload
/// already running on a target node leaves of its CPU.
async fn cpu_hog(pool: &Pool, node: &str, cpu: &str) -> anyhow::Result<String> {
    let name = format!("hog-{node}");
    let p: Pod = serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"nodeName": node, "terminationGracePeriodSeconds": 0,
            "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10",
                "resources": {"requests": {"cpu": cpu}}}]}
    }))?;
    Api::<Pod>::namespaced(pool.client.clone(), &pool.system_ns).create(&PostParams::default(), &p).await?;
    Ok(name)
}

/// The pod of the Deployment `app`: its uid and node.
async fn app_pod(pool: &Pool, app: &str) -> anyhow::Result<(String, String)> {
    let pods: Api<Pod> = Api::namespaced(pool.client.clone(), &pool.apps_ns);
    let list = pods.list(&ListParams::default().labels(&format!("app={app}"))).await?.items;
    let [p] = list.as_slice() else { anyhow::bail!("want one pod of {app}, found {}", list.len()) };
    let node = p.spec.as_ref().and_then(|s| s.node_name.clone()).unwrap_or_default();
    Ok((p.uid().unwrap_or_default(), node))
}

#[tokio::test]
async fn replace_fits_each_pod_on_one_target_node_a_four_gpu_pod_and_a_cpu_bound_one_wait_until_one_has_room()
-> anyhow::Result<()> {
    with_pool("replfit", 2, 4, async |pool| {
        let name = pool.id.clone();
        let mut pools = ReplacePools::new(pool, json!({"strategy": {"maxUnavailable": 2}})).await?;
        let t0 = pools.add_target(pool, 2).await?;
        let t1 = pools.add_target(pool, 2).await?;
        // The target has 4 free GPUs in sum, 2 on each node, and almost no CPU left on either.
        let hogs = [cpu_hog(pool, &t0, "30").await?, cpu_hog(pool, &t1, "30").await?];
        // One old node runs a 4-GPU pod, the other a 2-GPU pod that requests 4 CPUs.
        pool.deployment("big", 1, 4).await?;
        pool.wait_running(1).await?;
        gpu_and_cpu_deployment(pool, "cpu", 2, "4").await?;
        pool.wait_running(2).await?;
        let (big_uid, big_node) = app_pod(pool, "big").await?;
        let (cpu_uid, cpu_node) = app_pod(pool, "cpu").await?;
        assert!(pool.nodes.contains(&big_node) && pool.nodes.contains(&cpu_node) && big_node != cpu_node);

        let gpm = pool.migration(&name, pools.overrides.clone())?;
        pool.migrations().create(&PostParams::default(), &gpm).await?;
        let big_short = format!("{}/big-", pool.apps_ns);
        let big_why =
            format!("needs 4 {} (the most free on one target node: 2, on {t0}) on one node", pool.resource);
        let cpu_why = format!("fits no single target node: {t0} has its devices free but not cpu 4 (2 free)");
        // The plan says it before anything moves: neither node fits, each for its pod.
        let (_, plan) = plan_json(&name).await?;
        let rows = &plan["replace"]["nodes"];
        let short_of = |node: &str| -> String {
            rows.as_array()
                .into_iter()
                .flatten()
                .find(|n| n["name"] == node)
                .map(|n| n["short"].as_str().unwrap_or_default().to_owned())
                .unwrap_or_default()
        };
        assert!(short_of(&big_node).contains(&big_short) && short_of(&big_node).contains(&big_why), "{rows}");
        assert!(short_of(&cpu_node).contains(&cpu_why), "{rows}");

        let sampler = pool.sample();
        pool.start_operator()?;
        let waiting = pool
            .wait_status(&name, "both old nodes waiting for a target node with room", MIGRATION, |g| {
                g.status.as_ref().is_some_and(|s| {
                    let waits = |node: &str, why: &str| {
                        s.in_progress.iter().any(|p| {
                            p.name == node
                                && p.message.starts_with("TargetCapacityShort:")
                                && p.message.contains(why)
                        })
                    };
                    waits(&big_node, &big_why) && waits(&cpu_node, &cpu_why)
                })
            })
            .await?;
        assert_eq!(condition(&waiting, "Ready").map(|c| c.reason.as_str()), Some("TargetCapacityShort"));
        // Nothing was evicted: each pod is the one that ran before, on its old node.
        for (app, uid, node) in [("big", &big_uid, &big_node), ("cpu", &cpu_uid, &cpu_node)] {
            assert_eq!(&app_pod(pool, app).await?, &(uid.clone(), node.clone()), "{app} was not evicted");
            assert_eq!(pool::node_state(&pool.client, node).await?, "Cordoned", "{node} waits cordoned");
        }

        // CPU frees up on one target node: the CPU-bound pod moves there, the 4-GPU pod still waits.
        Api::<Pod>::namespaced(pool.client.clone(), &pool.system_ns)
            .delete(&hogs[0], &DeleteParams::default())
            .await?;
        pool.wait_status(&name, "the CPU-bound pod's node replaced", MIGRATION, |g| {
            g.status
                .as_ref()
                .and_then(|s| s.replace.as_ref())
                .is_some_and(|r| r.replaced_nodes.contains(&cpu_node))
        })
        .await?;
        let (moved_uid, on) = app_pod(pool, "cpu").await?;
        assert!(moved_uid != cpu_uid && on == t0, "the CPU-bound pod runs on {on}, want {t0}");
        assert_eq!(app_pod(pool, "big").await?, (big_uid.clone(), big_node.clone()), "big still waits");

        // A target node with 4 free GPUs joins: the 4-GPU pod moves there.
        let t2 = pools.add_target(pool, 4).await?;
        pool.wait_phase(&name, Phase::Completed, MIGRATION).await?;
        let (_, on) = app_pod(pool, "big").await?;
        assert_eq!(on, t2);
        assert_gpu_pods_on_targets(pool, &pools.targets, 2).await?;
        let samples = sampler.stop();
        assert!(samples.overlaps.is_empty(), "nodes served by both backends: {:?}", samples.overlaps);
        assert!(samples.events > 10, "the sampler saw too few events to mean anything: {}", samples.events);
        Ok(())
    })
    .await
}
