//! Names that the operator, the driver agent, the CLI and users share: node labels and
//! annotations, field managers, finalizers and taint keys. Both binaries read them from here, so a
//! rename cannot split them.

/// The prefix of every Switchyard label and annotation; a reconcile reads only the node
/// annotations that carry it.
pub const SWITCHYARD_PREFIX: &str = "switchyard.dev/";

/// Node label that says which backend serves the node's GPUs: [`BACKEND_DEVICE_PLUGIN`] or
/// [`BACKEND_DRA`] ([`BACKEND_NONE`] for the moment of a sequential switch). Absent means the
/// device plugin. Both DaemonSets select on it, so flipping it is
/// what moves a node from one backend to the other.
pub const LABEL_GPU_BACKEND: &str = "switchyard.dev/gpu-backend";
/// Value of [`LABEL_GPU_BACKEND`] for nodes served by the NVIDIA device plugin.
pub const BACKEND_DEVICE_PLUGIN: &str = "device-plugin";
/// Value of [`LABEL_GPU_BACKEND`] for nodes served by the DRA driver.
pub const BACKEND_DRA: &str = "dra";
/// Value of [`LABEL_GPU_BACKEND`] for a node in the middle of a sequential switch: neither the
/// device plugin nor the DRA driver runs there. Switchyard sets it for drivers without a
/// device-plugin interlock, until the device plugin's resources are gone, then sets
/// [`BACKEND_DRA`]; a node never rests in it.
pub const BACKEND_NONE: &str = "none";

/// Node label naming the GpuPoolMigration that owns the node. A node owned by one migration is
/// refused by every other, so two CRs never move the same node.
pub const LABEL_MIGRATION: &str = "switchyard.dev/migration";

/// Node label a Replace migration (`spec.strategy.type: Replace`) puts on each old node it has
/// drained onto the target pool, naming the migration: the node is cordoned and empty of GPU
/// pods, for the provider's autoscaler or a person to remove (`kubectl delete node -l
/// switchyard.dev/replaced`). A rollback removes it with the cordon.
pub const LABEL_REPLACED: &str = "switchyard.dev/replaced";

/// Node annotation a Replace migration writes on an old node as its drain starts: the pods that
/// leave it for the target pool, as JSON, per controller uid how many (`{"<uid>": 2}`). A rollback
/// while the target pool stands brings as many of each controller's pods back, and removes it.
pub const ANNOTATION_MOVED: &str = "switchyard.dev/moved";

/// Node annotation with which cluster-autoscaler never removes the node (`"true"`). The operator
/// reads it on the old nodes of a Replace migration: a node left for removal that carries it stays.
pub const ANNOTATION_CA_SCALE_DOWN_DISABLED: &str = "cluster-autoscaler.kubernetes.io/scale-down-disabled";

/// Node (or pod) annotation with which Karpenter never disrupts the node (`"true"`); read as
/// [`ANNOTATION_CA_SCALE_DOWN_DISABLED`] is.
pub const ANNOTATION_KARPENTER_DO_NOT_DISRUPT: &str = "karpenter.sh/do-not-disrupt";

/// Label of the DeviceTaintRules that fence a target node's devices while a Replace rollback
/// brings pods back from it: the node's name.
pub const LABEL_FENCED_NODE: &str = "switchyard.dev/fenced-node";

/// Node annotation with the node's migration state (see `NodeState`). It is the durable record a
/// restarted operator resumes from.
pub const ANNOTATION_MIGRATION_STATE: &str = "switchyard.dev/migration-state";
/// Node annotation set to "true" when the node was already unschedulable before Switchyard cordoned
/// it, so that Switchyard never uncordons a node an admin cordoned.
pub const ANNOTATION_INITIALLY_UNSCHEDULABLE: &str = "switchyard.dev/initially-unschedulable";
/// Node annotation with the RFC 3339 time the node entered its current state, so that timeouts
/// survive an operator restart.
pub const ANNOTATION_STATE_SINCE: &str = "switchyard.dev/state-since";
/// Node annotation with the number of device-plugin GPUs per resource the node had before the
/// switch (JSON object), which the DRA side must at least match before the node counts as switched.
pub const ANNOTATION_GPUS_BEFORE: &str = "switchyard.dev/gpus-before";

/// Node label through which the NVIDIA GPU Operator deploys its device plugin on a node: its
/// device-plugin DaemonSet selects `true`, and it honours any other value an admin sets
/// (`placement: GpuOperator` sets `false` to take the plugin off a node).
pub const LABEL_GPU_OPERATOR_DEVICE_PLUGIN: &str = "nvidia.com/gpu.deploy.device-plugin";
/// Value of [`LABEL_GPU_OPERATOR_DEVICE_PLUGIN`] that keeps the GPU Operator's device plugin off
/// a node.
pub const GPU_OPERATOR_DEPLOY_OFF: &str = "false";
/// Node annotation with [`LABEL_GPU_OPERATOR_DEVICE_PLUGIN`] as it was before Switchyard set it,
/// as JSON: the string value, or `null` when the label was absent. A rollback puts it back exactly.
pub const ANNOTATION_DEVICE_PLUGIN_DEPLOY_BEFORE: &str = "switchyard.dev/device-plugin-deploy-before";

/// Field manager for every object the operator writes with server-side apply.
pub const OPERATOR_FIELD_MANAGER: &str = "switchyard-operator";
/// Field manager for every ResourceSlice the driver agent writes with server-side apply.
pub const AGENT_FIELD_MANAGER: &str = "switchyard-driver-agent";

/// Finalizer that lets the operator bring in-flight nodes to a consistent state and remove its node
/// labels before a GpuPoolMigration goes away.
pub const FINALIZER: &str = "switchyard.dev/cleanup";

/// Default DRA driver name: the driver name in ResourceSlices and the CDI vendor.
pub const DEFAULT_DRIVER_NAME: &str = "gpu.switchyard.dev";

/// Prefix of the device-taint keys the agent sets on unhealthy devices (`<driver>/xid`, ...).
pub const TAINT_KEY_XID: &str = "xid";
/// Device-taint key suffix for a GPU that fell off the bus.
pub const TAINT_KEY_GPU_LOST: &str = "gpu-lost";
/// Device-taint key suffix the agent sets on all its devices while it is shutting down, so that the
/// scheduler stops placing claims nobody can prepare.
pub const TAINT_KEY_DRIVER_UNAVAILABLE: &str = "driver-unavailable";
/// Device-taint key suffix the agent sets on all its devices while its node still advertises
/// device-plugin GPUs in `status.allocatable`: the scheduler treats such a node as device-plugin
/// backed, so the DRA devices must not be allocatable at the same time.
pub const TAINT_KEY_DEVICE_PLUGIN_ACTIVE: &str = "device-plugin-active";
/// Device-taint key suffix the agent sets on all its devices while the kubelet has not (yet)
/// registered its DRA kubelet plugin (value `pending`, or `refused` after the kubelet refused it):
/// the scheduler must not allocate a device the kubelet cannot prepare yet. A pod bound then fails
/// with "DRA driver ... is not registered" and waits for the kubelet's next pod resync, about a
/// minute and a half.
pub const TAINT_KEY_PLUGIN_NOT_REGISTERED: &str = "kubelet-plugin-not-registered";

/// Node label that sets, for one node, how many claims the driver agent lets share each device it
/// publishes there (a positive integer; overrides the agent's `--shares-per-device`). The way
/// NVIDIA's device plugin picks a sharing config per node by `nvidia.com/device-plugin.config`.
pub const LABEL_GPU_SHARES: &str = "switchyard.dev/gpu-shares";
/// The device capacity that counts a shareable device's claims: a claim that names no capacity
/// takes one (its request policy's default). NVIDIA's DRA driver publishes the same name with
/// `--consumable-shares=<N>`.
pub const CAPACITY_SHARES: &str = "shares";

/// The extended resource the NVIDIA device plugin advertises for a full GPU.
pub const NVIDIA_GPU_RESOURCE: &str = "nvidia.com/gpu";
/// The extended resources NVIDIA's device plugin advertises for GPUs by default: whole GPUs,
/// their shared rename (`renameByDefault`), and MIG profiles (`nvidia.com/mig-1g.10gb`, shared or
/// not). Exact names, or prefixes ending in `*` ([`resource_matches`]). The NVIDIA Network
/// Operator's `nvidia.com/*` resources (SR-IOV VFs, RDMA devices) are not GPUs.
pub const DEVICE_PLUGIN_GPU_RESOURCES: [&str; 3] =
    ["nvidia.com/gpu", "nvidia.com/gpu.shared", "nvidia.com/mig-*"];

/// Whether the extended resource `name` matches `pattern`: the same name, or, for a pattern
/// ending in `*`, a name that starts with what comes before it.
pub fn resource_matches(pattern: &str, name: &str) -> bool {
    match pattern.strip_suffix('*') {
        Some(prefix) => name.starts_with(prefix),
        None => name == pattern,
    }
}

/// Whether the device plugin's resource `name` is a GPU: one of [`DEVICE_PLUGIN_GPU_RESOURCES`]
/// or of `extra` (a migration's `spec.devicePlugin.gpuResources`, the agent's
/// `--device-plugin-resources`).
pub fn is_gpu_resource(name: &str, extra: &[impl AsRef<str>]) -> bool {
    DEVICE_PLUGIN_GPU_RESOURCES.iter().any(|p| resource_matches(p, name))
        || extra.iter().any(|p| resource_matches(p.as_ref(), name))
}

/// The driver name of NVIDIA's DRA driver for GPUs (`k8s-dra-driver-gpu`).
pub const NVIDIA_DRA_DRIVER: &str = "gpu.nvidia.com";

/// Label on every ResourceSlice the driver agent writes, valued [`AGENT_FIELD_MANAGER`]. The agent
/// lists by it (plus node name and driver) to find and delete its own stale slices, and never touches
/// a slice without it.
pub const LABEL_MANAGED_BY: &str = "switchyard.dev/managed-by";
/// ResourceSlice annotation with the number of physical GPUs in the node's pool (decimal). Every
/// slice of the pool carries the same value, so the operator can read any one of them.
pub const ANNOTATION_SLICE_GPU_COUNT: &str = "switchyard.dev/gpu-count";
/// ResourceSlice annotation with the MIG devices in the node's pool as a JSON object from profile to
/// count, e.g. `{"1g.10gb":7}`; `{}` when no GPU is partitioned. Same value on every slice of the pool.
pub const ANNOTATION_SLICE_MIG_PROFILES: &str = "switchyard.dev/mig-profiles";
/// Device-taint key suffix for a GPU that reported an uncorrectable (double-bit) ECC error.
pub const TAINT_KEY_ECC_DBE: &str = "ecc-dbe";

/// Node annotation with why a node failed, as JSON `{"state", "reason", "message"}`, so that
/// `status.failed` and the decision whether to roll the node back survive an operator restart.
pub const ANNOTATION_FAILURE: &str = "switchyard.dev/failure";

/// Key of the device taint the operator puts on a node's DRA devices while rolling it back, so
/// that pods holding claims on them are evicted before the device plugin returns.
pub const TAINT_KEY_ROLLBACK: &str = "switchyard.dev/rollback";

/// Label on canary pods, naming the node they verify.
pub const LABEL_CANARY_NODE: &str = "switchyard.dev/canary-node";

/// Label on canary pods: the attempt they verify, the node's Verifying `state-since` in Unix
/// seconds. A canary of another attempt neither passes nor fails this one.
pub const LABEL_CANARY_ATTEMPT: &str = "switchyard.dev/canary-attempt";

/// DeviceClass annotation the operator keeps on its classes: the owning migration's uid and the
/// other DeviceClasses that carry the same `extendedResourceName` (`<uid>;<class>,<class>`).
/// When either changes the operator re-applies the class. The kube-scheduler v1.37 maps an
/// extended resource name to a class in a cache that forgets the name whenever any class carrying
/// it is deleted or drops it, even a class that did not win the name; an update of the remaining
/// class is what makes the scheduler map the name again.
pub const ANNOTATION_SCHEDULER_SYNC: &str = "switchyard.dev/scheduler-sync";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpu_resources_are_the_device_plugins_names_and_the_extra_ones() {
        let none: [&str; 0] = [];
        let cases = [
            ("nvidia.com/gpu", true),
            ("nvidia.com/gpu.shared", true),
            ("nvidia.com/mig-1g.10gb", true),
            ("nvidia.com/mig-3g.40gb.shared", true),
            ("nvidia.com/gpus", false),
            ("nvidia.com/hostdev", false),
            ("nvidia.com/rdma_shared_device_a", false),
            ("amd.com/gpu", false),
        ];
        for (name, want) in cases {
            assert_eq!(is_gpu_resource(name, &none), want, "{name}");
        }
        assert!(is_gpu_resource("nvidia.com/a100", &["nvidia.com/a100"]));
        assert!(is_gpu_resource("nvidia.com/a100-80gb", &["nvidia.com/a100*"]));
        assert!(!is_gpu_resource("nvidia.com/h100", &["nvidia.com/a100*"]));
    }
}
