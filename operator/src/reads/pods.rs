//! The pods bound to one node, or to any node of a set, read through the paged pod LISTs of
//! [`super::pod_list`] into the fields a drain judges.

use std::collections::HashSet;

use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use kube::api::ListParams;

use crate::error::{Error, Result};
use crate::reads::pod_list;

/// Page size of the cluster-wide pod LISTs: bounds the memory one page takes (a few MiB).
pub const POD_PAGE: u32 = 500;

/// Every pod bound to `node`, with the fields a drain reads ([`pod_list::PodFields`]).
pub async fn pods_on_node(client: &Client, node: &str) -> Result<Vec<Pod>> {
    pod_list::list_node(client, node).await.map_err(|source| Error::ListPods { node: node.into(), source })
}

/// The pods bound to any node in `nodes`, from paged LISTs of every bound pod in the cluster
/// ([`POD_PAGE`] a page), each folded into `acc` with its node's name as its page arrives: a pool of
/// thousands of nodes costs (cluster pods / page) requests, not one per node, and only what the
/// fold keeps is held (`switchyard plan` keeps the pods it judges and counts the rest).
/// `unfinished` leaves out Succeeded and Failed pods on the server. Each pod has only the fields a
/// drain reads ([`pod_list::PodFields`]).
pub async fn fold_pods_on_nodes<A>(
    client: &Client,
    nodes: &HashSet<&str>,
    unfinished: bool,
    mut acc: A,
    mut fold: impl FnMut(&mut A, &str, Pod),
) -> Result<A> {
    let fields = if unfinished {
        "spec.nodeName!=,status.phase!=Succeeded,status.phase!=Failed"
    } else {
        "spec.nodeName!="
    };
    let mut lp = ListParams::default().fields(fields).limit(POD_PAGE);
    loop {
        let page =
            pod_list::list_page(client, &lp).await.map_err(|source| Error::ListBoundPods { source })?;
        for pod in page.items {
            // The set's own `&str`, so the pod can be moved.
            let Some(node) = pod.node_name().and_then(|n| nodes.get(n)).copied() else {
                continue;
            };
            fold(&mut acc, node, pod.into_pod());
        }
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) => lp = lp.continue_token(&token),
            None => return Ok(acc),
        }
    }
}
