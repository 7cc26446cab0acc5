//! The reconcile of a migration being deleted, beside `apply`: nodes mid-switch finish their
//! step (nothing new starts), nodes that never switched go back into service, and the
//! migration's labels and annotations come off.

use k8s_openapi::api::resource::v1::ResourceSlice;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Api, ListParams};
use kube::runtime::controller::Action as Requeue;

use crate::api::v1alpha1::{GpuPoolMigration, NodeState};
use crate::error::{Error, Result};
use crate::node::patch::{owner_ref, release_patch};
use crate::node::record::PoolNode;
use crate::node::state;
use crate::reconcile::context::Context;
use crate::reconcile::{decide, execute, observe};
use crate::well_known::*;

/// Before a GpuPoolMigration goes away: nodes mid-switch finish their step (nothing new starts),
/// nodes that never switched are uncordoned, and our labels and annotations come off. The backend
/// label stays: it is what keeps a migrated node on DRA. DeviceClasses stay for the same reason.
pub(crate) async fn cleanup(gpm: &GpuPoolMigration, ctx: &Context) -> Result<Requeue> {
    let client = &ctx.client;
    let name = gpm.name_any();
    // The nodes the migration labelled, from the node cache: a LIST would read every one whole
    // (with managed fields, about 17 KiB a node: 85 MiB at 5,000 nodes).
    let labelled = kube::core::Selector::from_iter([(LABEL_MIGRATION.to_string(), name.clone())]);
    let nodes = observe::cached_nodes(ctx, &labelled).await?;
    let now = Timestamp::now();
    let mut busy = 0;
    for node in &nodes {
        let pn = PoolNode::from_node(node);
        match pn.state() {
            NodeState::Switching | NodeState::Verifying | NodeState::RollingBack => {
                // Slices are needed to finish a switch.
                let slices =
                    Api::<ResourceSlice>::all(client.clone())
                        .list(&ListParams::default().fields(&format!(
                            "spec.driver={},spec.nodeName={}",
                            gpm.spec.driver.name, pn.name
                        )))
                        .await
                        .map_err(|source| Error::ListResourceSlices {
                            driver: gpm.spec.driver.name.clone(),
                            source,
                        })?
                        .items;
                let published =
                    crate::pool::overlap::schedulable_dra_devices(&slices, &gpm.spec.driver.name, &pn.name);
                let reads = observe::node(ctx, &gpm.spec, &pn, node, published).await?;
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
                    };
                    decide::node_step(&view, node, &slices, published, &reads, false, None)
                };
                let out = execute::node_step(ctx, gpm, &step).await?;
                execute::publish_node_events(ctx, gpm, node, &out.events).await;
                busy += 1;
            }
            _ => {
                let mut patch = release_patch(&pn);
                patch.metadata.resource_version = node.metadata.resource_version.clone();
                execute::patch_node(ctx, &pn.name, &patch).await?;
            }
        }
    }
    if busy > 0 {
        return Err(Error::CleanupWaiting { nodes: busy });
    }
    ctx.metrics.forget_pool(&name);
    if let Ok(mut g) = ctx.inventory.lock() {
        g.remove(&name);
    }
    if let Ok(mut g) = ctx.pod_counts.lock() {
        g.counts.remove(&name);
    }
    if let Ok(mut g) = ctx.status_writes.lock() {
        g.remove(&name);
    }
    Ok(Requeue::await_change())
}
