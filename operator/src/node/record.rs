//! One node's record as the operator keeps it on the node itself: which backend its label says
//! serves it, its migration state and since when, and why it failed. A restarted operator reads
//! the same record and resumes. Pure.

use std::collections::BTreeMap;

use k8s_openapi::jiff::Timestamp;

use crate::node::slim::SlimNode;
use crate::node::str_map::{Labels, StrMap};

use crate::api::v1alpha1::NodeState;
use crate::well_known::{
    ANNOTATION_FAILURE, ANNOTATION_GPUS_BEFORE, ANNOTATION_MIGRATION_STATE, ANNOTATION_STATE_SINCE,
    BACKEND_DEVICE_PLUGIN, BACKEND_DRA, BACKEND_NONE, LABEL_GPU_BACKEND, LABEL_MIGRATION,
};

/// Which backend a node's label says serves it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    DevicePlugin,
    Dra,
    /// Neither: the first half of a sequential switch (`switchyard.dev/gpu-backend=none`), for
    /// a driver without a device-plugin interlock. The device plugin leaves; the driver has not
    /// started yet.
    None,
}

impl Backend {
    /// The `switchyard.dev/gpu-backend` value.
    pub fn as_str(self) -> &'static str {
        match self {
            Backend::DevicePlugin => BACKEND_DEVICE_PLUGIN,
            Backend::Dra => BACKEND_DRA,
            Backend::None => BACKEND_NONE,
        }
    }
}

/// A pool node as planning sees it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PoolNode {
    pub name: String,
    /// The node's, shared with the cached node.
    pub labels: StrMap,
    /// The node's (Switchyard's only), shared with the cached node.
    pub annotations: StrMap,
    pub unschedulable: bool,
    pub ready: bool,
    /// Pods on the node that consume a pool resource; only used to order candidates.
    pub consuming_pods: u32,
}

/// Reads a state annotation value (`Draining`, ...).
pub fn parse_state(s: &str) -> Option<NodeState> {
    serde_json::from_value(serde_json::Value::String(s.to_string())).ok()
}

/// The annotation value for a state.
pub fn state_str(s: NodeState) -> String {
    match serde_json::to_value(s) {
        Ok(serde_json::Value::String(v)) => v,
        _ => format!("{s:?}"),
    }
}

/// The backend a node's labels name.
fn backend_of(labels: &impl Labels) -> Backend {
    match labels.label(LABEL_GPU_BACKEND) {
        Some(BACKEND_DRA) => Backend::Dra,
        Some(BACKEND_NONE) => Backend::None,
        _ => Backend::DevicePlugin,
    }
}

/// The state a node's annotations record, or the one its labels imply (see [`PoolNode::state`]).
fn state_of(labels: &impl Labels, annotations: &impl Labels) -> NodeState {
    match annotations.label(ANNOTATION_MIGRATION_STATE).and_then(parse_state) {
        Some(s) => s,
        None if backend_of(labels) == Backend::Dra => NodeState::Migrated,
        None => NodeState::Pending,
    }
}

/// [`PoolNode::backend`] of a cached node, without making its `PoolNode`: for the checks that look
/// at every node of the pool.
pub fn node_backend(node: &SlimNode) -> Backend {
    backend_of(node.labels())
}

/// [`PoolNode::state`] of a cached node, without making its `PoolNode`.
pub fn node_state(node: &SlimNode) -> NodeState {
    state_of(node.labels(), node.annotations())
}

impl PoolNode {
    pub fn from_node(node: &SlimNode) -> Self {
        let ready = node.is_ready();
        Self {
            name: node.metadata.name.clone().unwrap_or_default(),
            labels: node.labels().clone(),
            annotations: node.annotations().clone(),
            unschedulable: node.unschedulable,
            ready,
            consuming_pods: 0,
        }
    }

    pub fn backend(&self) -> Backend {
        backend_of(&self.labels)
    }

    /// The recorded state; a node without one is Pending, or Migrated when its label already
    /// says DRA (labelled by hand or by an earlier tool).
    pub fn state(&self) -> NodeState {
        state_of(&self.labels, &self.annotations)
    }

    pub fn owner(&self) -> Option<&str> {
        self.labels.get(LABEL_MIGRATION)
    }

    /// The recorded failure, if the node failed (or failed and was rolled back).
    pub fn failure(&self) -> Option<Failure> {
        self.annotations.get(ANNOTATION_FAILURE).and_then(|s| serde_json::from_str(s).ok())
    }
}

/// When the node entered its state (`switchyard.dev/state-since`).
pub fn parse_since(pn: &PoolNode) -> Option<Timestamp> {
    pn.annotations.get(ANNOTATION_STATE_SINCE).and_then(|s| s.parse().ok())
}

/// The device-plugin GPUs per resource recorded when the drain started.
pub fn gpus_before_map(pn: &PoolNode) -> Option<BTreeMap<String, u64>> {
    pn.annotations.get(ANNOTATION_GPUS_BEFORE).and_then(|s| serde_json::from_str(s).ok())
}

/// Their sum; `None` when missing or 0.
pub fn gpus_before(pn: &PoolNode) -> Option<u64> {
    gpus_before_map(pn).map(|m| m.values().sum()).filter(|n| *n > 0)
}

/// Why a node failed; stored as JSON in `switchyard.dev/failure`.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Failure {
    pub state: NodeState,
    pub reason: String,
    pub message: String,
}

impl Failure {
    /// A failure while rolling back needs a human: rolling back again would loop.
    pub fn during_rollback(&self) -> bool {
        self.state == NodeState::RollingBack
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::well_known::ANNOTATION_MIGRATION_STATE;

    #[test]
    fn a_cached_nodes_state_and_backend_read_as_its_pool_nodes_do() {
        use NodeState::*;
        let cases = [
            // Never touched; on DRA by hand; mid-switch with the device plugin gone; recorded states.
            (serde_json::json!({}), serde_json::json!({}), (Pending, Backend::DevicePlugin)),
            (
                serde_json::json!({LABEL_GPU_BACKEND: BACKEND_DRA}),
                serde_json::json!({}),
                (Migrated, Backend::Dra),
            ),
            (
                serde_json::json!({LABEL_GPU_BACKEND: BACKEND_NONE}),
                serde_json::json!({ANNOTATION_MIGRATION_STATE: "Switching"}),
                (Switching, Backend::None),
            ),
            (
                serde_json::json!({LABEL_GPU_BACKEND: BACKEND_DRA}),
                serde_json::json!({ANNOTATION_MIGRATION_STATE: "Verifying"}),
                (Verifying, Backend::Dra),
            ),
            (
                serde_json::json!({}),
                serde_json::json!({ANNOTATION_MIGRATION_STATE: "Draining"}),
                (Draining, Backend::DevicePlugin),
            ),
            (
                serde_json::json!({}),
                serde_json::json!({ANNOTATION_MIGRATION_STATE: "not-a-state"}),
                (Pending, Backend::DevicePlugin),
            ),
        ];
        for (labels, annotations, want) in cases {
            let node: SlimNode = serde_json::from_value(serde_json::json!({
                "metadata": {"name": "n", "labels": labels, "annotations": annotations}
            }))
            .unwrap();
            let pn = PoolNode::from_node(&node);
            assert_eq!((node_state(&node), node_backend(&node)), want, "{labels} {annotations}");
            assert_eq!((pn.state(), pn.backend()), want, "{labels} {annotations}");
        }
    }

    #[test]
    fn a_pool_node_shares_the_cached_nodes_labels_and_annotations() {
        let node = crate::testing::gpu_node(
            "n",
            &serde_json::json!({"metadata": {"labels": {LABEL_MIGRATION: "pool-a"},
                "annotations": {ANNOTATION_MIGRATION_STATE: "Draining", "other.example.com/x": "y"}}}),
        );
        let pn = PoolNode::from_node(&node);
        assert!(pn.labels.is_shared_with(node.labels()) && pn.annotations.is_shared_with(node.annotations()));
        assert_eq!((pn.owner(), pn.state()), (Some("pool-a"), NodeState::Draining));
        assert_eq!(pn.annotations.len(), 1, "only Switchyard's annotations are kept: {:?}", pn.annotations);
        let rebuilt: StrMap = pn.labels.iter().collect();
        assert!(rebuilt == pn.labels && !rebuilt.is_shared_with(&pn.labels), "equal is not shared");
    }

    #[test]
    fn state_strings_round_trip() {
        for s in [NodeState::Pending, NodeState::Draining, NodeState::RollingBack, NodeState::RolledBack] {
            assert_eq!(parse_state(&state_str(s)), Some(s));
        }
        assert_eq!(state_str(NodeState::Verifying), "Verifying");
        assert_eq!(parse_state("bogus"), None);
    }
}
