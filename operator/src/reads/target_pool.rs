//! What a Replace migration's judgement reads of its target pool that no cache holds, read alike
//! by the operator and `switchyard plan` ([`crate::pool::replace::TargetInputs`]): the devices
//! allocated claims hold, the pending pods on their way, and the pods bound to each usable target
//! node (what they request of its CPU, memory and pod slots).

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::api::ListParams;
use kube::{Api, Client};

use crate::error::{Error, Result};
use crate::node::slim::SlimNode;
use crate::pool::replace::{self, TargetInputs};
use crate::reads::{pods, reader_objects};

/// Target nodes whose pods are LISTed at once: a target pool is tens of nodes, each LIST a
/// field-selected read the API server answers from its watch cache.
const NODE_LISTS_IN_FLIGHT: usize = 8;

/// The target pool's inputs for `nodes` (the nodes `targetNodeSelector` selects): one LIST of
/// the cluster's ResourceClaims, one of the pending pods not yet bound, and one of the pods bound
/// to each Ready, schedulable target node.
pub async fn target_inputs(client: &Client, driver: &str, nodes: Vec<SlimNode>) -> Result<TargetInputs> {
    let claims = reader_objects::list_all(Api::<ResourceClaim>::all(client.clone()), ListParams::default())
        .await
        .map_err(|source| Error::ListResourceClaims { source })?;
    let held = replace::allocated(&claims, driver);
    drop(claims);
    let pending = reader_objects::list_all(
        Api::<Pod>::all(client.clone()),
        ListParams::default().fields("spec.nodeName=,status.phase=Pending"),
    )
    .await
    .map_err(|source| Error::ListPendingPods { source })?;
    let usable: Vec<String> =
        nodes.iter().filter(|n| n.is_ready() && !n.unschedulable).map(|n| n.name().to_string()).collect();
    let bound: Vec<Vec<Pod>> = futures::stream::iter(usable)
        .map(|n| async move { pods::pods_on_node(client, &n).await })
        .buffer_unordered(NODE_LISTS_IN_FLIGHT)
        .try_collect()
        .await?;
    Ok(TargetInputs { nodes, held, pending, bound: bound.into_iter().flatten().collect() })
}
