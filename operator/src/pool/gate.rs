//! The pool's gate: whether the cluster's prerequisites hold and what the pool's nodes
//! advertise allows the move. Pure.

use kube::ResourceExt;

use crate::api::v1alpha1::{Direction, GpuPoolMigrationSpec};
use crate::node::slim::SlimNode;
use crate::pool::prerequisites::ServerFacts;
use crate::pool::prerequisites::{self, ClusterFacts, NodeVersions};

pub(crate) fn resources(spec: &GpuPoolMigrationSpec) -> Vec<&str> {
    spec.resources.iter().map(|r| r.extended_resource_name.as_str()).collect()
}

/// What the prerequisite checks judge for `spec`.
/// Whether the pool may start: the cluster's prerequisites, then what its nodes advertise.
pub fn pool_verdict(
    spec: &GpuPoolMigrationSpec,
    facts: &ServerFacts,
    versions: Vec<NodeVersions>,
    nodes: &[impl std::borrow::Borrow<SlimNode>],
    driver_daemonset_exists: bool,
    device_plugin_daemonset_exists: bool,
) -> prerequisites::Verdict {
    let verdict = prerequisites::check(&cluster_facts(
        spec,
        facts,
        versions,
        driver_daemonset_exists,
        device_plugin_daemonset_exists,
    ));
    let check = match spec.direction {
        Direction::Forward => {
            crate::pool::capacity::check(nodes.iter().map(|n| n.borrow()), &resources(spec))
        }
        // Rollback returns nodes to the device plugin, which serves whatever it served before.
        Direction::Rollback => crate::pool::capacity::Check::default(),
    };
    prerequisites::with_capacity(verdict, &check, spec.acknowledge.gpu_sharing_loss)
}

pub fn cluster_facts(
    spec: &GpuPoolMigrationSpec,
    facts: &ServerFacts,
    nodes: Vec<NodeVersions>,
    driver_daemonset_exists: bool,
    device_plugin_daemonset_exists: bool,
) -> ClusterFacts {
    let (dn, dp) = (&spec.driver.daemon_set, &spec.device_plugin.daemon_set);
    ClusterFacts {
        server_git_version: facts.git_version.clone(),
        served: facts.served,
        nodes,
        probe: facts.probe,
        rollback_possible: spec.direction == Direction::Rollback
            || spec.strategy.on_failure == crate::api::v1alpha1::FailurePolicy::Rollback,
        driver_daemonset: Some(format!("{}/{}", dn.namespace, dn.name)),
        device_plugin_daemonset: Some(format!("{}/{}", dp.namespace, dp.name)),
        driver_daemonset_exists,
        device_plugin_daemonset_exists,
    }
}

/// The versions the prerequisites judge, from a node's status.
pub fn node_versions(n: &SlimNode) -> NodeVersions {
    NodeVersions {
        name: n.name_any(),
        kubelet_version: n.kubelet_version().to_string(),
        container_runtime_version: n.container_runtime_version().to_string(),
    }
}
