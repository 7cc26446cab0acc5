//! The reconcile of a migration being deleted, beside `apply`: nodes mid-switch finish their
//! step (nothing new starts), nodes that never switched go back into service, and the
//! migration's labels and annotations come off.

use k8s_openapi::api::resource::v1::ResourceSlice;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Api, ListParams};
use kube::runtime::controller::Action as Requeue;
use kube::runtime::events::EventType;

use crate::api::v1alpha1::{GpuPoolMigration, NodeProgress, NodeState};
use crate::error::{Error, Result};
use crate::node::patch::{owner_ref, release_patch};
use crate::node::record::PoolNode;
use crate::node::slim::SlimNode;
use crate::node::state;
use crate::reconcile::context::Context;
use crate::reconcile::decide::NodeEvent;
use crate::reconcile::{decide, execute, observe};
use crate::well_known::*;

/// Lets go of one node the migration holds, as a deleted migration does: a node mid-switch
/// (Switching, Verifying, RollingBack) finishes its step, and nothing new starts on it; any other
/// node is released ([`release_patch`]). Returns the busy node's step outcome, or `None` once it
/// is released. Also what happens to a node that leaves `spec.nodeSelector` mid-move
/// ([`departed`]).
pub(crate) async fn settle_node(
    gpm: &GpuPoolMigration,
    ctx: &Context,
    node: &SlimNode,
    now: Timestamp,
) -> Result<Option<execute::NodeOutcome>> {
    let client = &ctx.client;
    let name = gpm.name_any();
    let pn = PoolNode::from_node(node);
    match pn.state() {
        NodeState::Switching | NodeState::Verifying | NodeState::RollingBack => {
            // Slices are needed to finish a switch.
            let slices = Api::<ResourceSlice>::all(client.clone())
                .list(
                    &ListParams::default()
                        .fields(&format!("spec.driver={},spec.nodeName={}", gpm.spec.driver.name, pn.name)),
                )
                .await
                .map_err(|source| Error::ListResourceSlices { driver: gpm.spec.driver.name.clone(), source })?
                .items;
            let published =
                crate::pool::overlap::present(&slices, &gpm.spec.driver.name, &pn.name).count() as u64;
            crate::cache::synced(&ctx.caches.gpu_pods, "Pod").await?;
            let pods = crate::cache::pods::PodsByNode::of_node(&ctx.caches.gpu_pods, &pn.name);
            let reads = observe::node(ctx, &gpm.spec, &pn, node, published, &pods).await?;
            let step = {
                let selectors = crate::pool::selectors::Selectors::new(&gpm.spec);
                let view = decide::NodeView {
                    spec: &gpm.spec,
                    migration: &name,
                    owner: owner_ref(gpm),
                    canary_namespace: &ctx.config.canary_namespace,
                    hold: Some(state::Hold::Deleting),
                    selectors: &selectors,
                    now,
                    // A deletion starts no node: what a node publishes was stamped when it did.
                    plugin_config: None,
                    taint_eviction_reliable: ctx.facts.lock().ok().and_then(|f| f.clone()).is_some_and(
                        |(_, f)| {
                            crate::pool::prerequisites::taint_eviction_reaches_extended_claims(
                                &f.control_plane,
                            )
                            .is_ok()
                        },
                    ),
                };
                let replace = gpm.spec.strategy.replace().map(|r| state::Replace {
                    short: None,
                    evict_without_capacity: r.evict_without_capacity,
                    // A deletion brings nothing back: a returning node finishes as it stands.
                    returning: None,
                });
                let turn = decide::Turn { start: false, last_message: None, replace };
                decide::node_step(&view, node, &slices, published, &reads, turn)
            };
            let out = execute::node_step(ctx, gpm, &step).await?;
            execute::publish_node_events(ctx, gpm, node, &out.events).await;
            Ok(Some(out))
        }
        _ => {
            let mut patch = release_patch(&pn);
            patch.metadata.resource_version = node.metadata.resource_version.clone();
            execute::patch_node(ctx, &pn.name, &patch).await?;
            Ok(None)
        }
    }
}

/// The nodes a migration holds (labelled `switchyard.dev/migration=<name>`) that its
/// `spec.nodeSelector` no longer selects: an admin fixed a label, or GPU Feature Discovery rewrote
/// one the selector uses, mid-move. The snapshot holds only the nodes that match, so each is let
/// go here ([`settle_node`]): a node mid-switch finishes its step, any other goes back to service,
/// with a `NodeLeftPool` Warning event. Returns the busy ones' progress lines for the status.
pub(crate) async fn departed(gpm: &GpuPoolMigration, ctx: &Context) -> Result<Vec<NodeProgress>> {
    let name = gpm.name_any();
    let labelled = kube::core::Selector::from_iter([(LABEL_MIGRATION.to_string(), name.clone())]);
    let held = observe::cached_nodes(ctx, &labelled).await?;
    let selector = crate::reads::nodes::node_selector(&gpm.spec)?;
    let now = Timestamp::now();
    let mut progress = Vec::new();
    for node in unselected(&held, &selector, &name) {
        let pn = PoolNode::from_node(node);
        let was = pn.state();
        // An error stays on its node, as a moving node's does: the pool goes on.
        let settled = match settle_node(gpm, ctx, node, now).await {
            Ok(settled) => settled,
            Err(e) => {
                tracing::warn!(node = %pn.name, error = %e, "letting go of a node that left the pool failed; retrying");
                progress.push(NodeProgress {
                    name: pn.name.clone(),
                    state: was,
                    since: None,
                    message: format!(
                        "{}{e}; it left spec.nodeSelector mid-move, retrying",
                        execute::STEP_ERROR
                    ),
                    cordoned_by: crate::node::patch::cordoned_by(&pn, None),
                });
                continue;
            }
        };
        match settled {
            Some(out) => progress.push(NodeProgress {
                name: pn.name.clone(),
                state: out.state,
                since: out.since.map(execute::status_time),
                message: format!(
                    "left spec.nodeSelector mid-move: it finishes its {was:?} step, then goes back to service; {}",
                    out.message
                ),
                cordoned_by: crate::node::patch::cordoned_by(&pn, None),
            }),
            None => {
                let note = format!(
                    "node {} no longer matches spec.nodeSelector; it was {was:?}: Switchyard let go of it (uncordoned unless it failed after its switch or was cordoned before; its {LABEL_GPU_BACKEND} label stays)",
                    pn.name
                );
                let ev = NodeEvent { type_: EventType::Warning, reason: "NodeLeftPool", note };
                execute::publish_node_events(ctx, gpm, node, std::slice::from_ref(&ev)).await;
            }
        }
    }
    Ok(progress)
}

/// The nodes of `held` that `selector` does not select. Pure.
fn unselected<'a, N: std::ops::Deref<Target = SlimNode>>(
    held: &'a [N],
    selector: &kube::core::Selector,
    migration: &'a str,
) -> impl Iterator<Item = &'a SlimNode> {
    let query = crate::node::str_map::LabelQuery::from(selector);
    held.iter().map(|n| &**n).filter(move |n| {
        !query.matches(n.labels()) && !crate::pool::rollout::kept_member(&query, n, migration)
    })
}

/// Before a GpuPoolMigration goes away: nodes mid-switch finish their step (nothing new starts),
/// nodes that never switched are uncordoned, and our labels and annotations come off. The backend
/// label stays: it is what keeps a migrated node on DRA. DeviceClasses stay for the same reason.
pub(crate) async fn cleanup(gpm: &GpuPoolMigration, ctx: &Context) -> Result<Requeue> {
    let name = gpm.name_any();
    // The nodes the migration labelled, from the node cache: a LIST would read every one whole
    // (with managed fields, about 17 KiB a node: 85 MiB at 5,000 nodes).
    let labelled = kube::core::Selector::from_iter([(LABEL_MIGRATION.to_string(), name.clone())]);
    let nodes = observe::cached_nodes(ctx, &labelled).await?;
    let now = Timestamp::now();
    let mut busy = 0;
    for node in &nodes {
        if settle_node(gpm, ctx, node, now).await?.is_some() {
            busy += 1;
        }
    }
    if busy > 0 {
        return Err(Error::CleanupWaiting { nodes: busy });
    }
    ctx.metrics.forget_pool(&name);
    if let Ok(mut g) = ctx.inventory.lock() {
        g.remove(&name);
    }
    if let Ok(mut g) = ctx.status_writes.lock() {
        g.remove(&name);
    }
    if let Ok(mut g) = ctx.pod_checks.lock() {
        g.remove(&name);
    }
    Ok(Requeue::await_change())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::gpu_node;
    use serde_json::json;

    #[test]
    fn a_held_node_relabelled_out_of_the_selector_is_let_go_and_only_it() {
        let held = |name: &str, pool: &str| {
            std::sync::Arc::new(gpu_node(
                name,
                &json!({"metadata": {"labels": {"pool": pool, LABEL_MIGRATION: "m"}}}),
            ))
        };
        let nodes = vec![held("stays", "a100"), held("fixed-label", "a100-spare"), held("also", "a100")];
        let spec: crate::api::v1alpha1::GpuPoolMigrationSpec = serde_json::from_value(json!({
            "nodeSelector": {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["a100"]}]},
            "resources": [{"extendedResourceName": "nvidia.com/gpu", "deviceClassName": "gpu"}],
            "driver": {"name": "gpu.switchyard.dev", "daemonSet": {"namespace": "s", "name": "d"}},
            "devicePlugin": {"daemonSet": {"namespace": "g", "name": "p"}}
        }))
        .unwrap();
        let selector = crate::reads::nodes::node_selector(&spec).unwrap();
        let gone: Vec<&str> = unselected(&nodes, &selector, "m").map(SlimNode::name).collect();
        assert_eq!(gone, ["fixed-label"]);
    }

    #[test]
    fn a_migrated_node_that_lost_only_gfd_labels_stays_in_the_pool() {
        let node = |name: &str, labels: serde_json::Value| -> std::sync::Arc<SlimNode> {
            std::sync::Arc::new(
                serde_json::from_value(json!({"metadata": {"name": name, "labels": labels}})).unwrap(),
            )
        };
        let spec: crate::api::v1alpha1::GpuPoolMigrationSpec = serde_json::from_value(json!({
            "nodeSelector": {"matchLabels": {"pool": "a100", "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}},
            "resources": [{"extendedResourceName": "nvidia.com/gpu", "deviceClassName": "gpu"}],
            "driver": {"name": "gpu.switchyard.dev", "daemonSet": {"namespace": "s", "name": "d"}},
            "devicePlugin": {"daemonSet": {"namespace": "g", "name": "p"}}
        }))
        .unwrap();
        let selector = crate::reads::nodes::node_selector(&spec).unwrap();
        let held = vec![
            // GFD stopped on it once NVIDIA's DRA driver served it: the product label went.
            node("gfd-gone", json!({"pool": "a100", LABEL_MIGRATION: "m"})),
            // A product label with another value: not the pool's GPU any more.
            node(
                "other-gpu",
                json!({"pool": "a100", "nvidia.com/gpu.product": "NVIDIA-A100", LABEL_MIGRATION: "m"}),
            ),
            // The pool label went: that is an admin's change, not GFD's.
            node(
                "pool-gone",
                json!({"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", LABEL_MIGRATION: "m"}),
            ),
        ];
        let gone: Vec<&str> = unselected(&held, &selector, "m").map(SlimNode::name).collect();
        assert_eq!(gone, ["other-gpu", "pool-gone"]);
        // Another migration's node that lost the label is no member of this one.
        let theirs = vec![node("theirs", json!({"pool": "a100", LABEL_MIGRATION: "other"}))];
        let members = crate::pool::rollout::pool_members(Vec::new(), &theirs, &selector, "m");
        assert!(members.is_empty());
        let members = crate::pool::rollout::pool_members(Vec::new(), &held, &selector, "m");
        assert_eq!(members.iter().map(|n| n.name()).collect::<Vec<_>>(), ["gfd-gone"]);
    }
}
