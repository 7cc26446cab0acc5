//! `switchyard.dev/v1alpha1`: the `GpuPoolMigration` resource.
//!
//! Every doc comment on a field here becomes `kubectl explain` text, so it is written for the
//! cluster admin who declares a migration in Git, not for Rust readers. Validation that the API
//! server can do at admission is declared here as CEL rules whose messages name the field.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector, Time};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A DNS-1123 subdomain (RFC 1123): lower-case alphanumerics, '-' and '.', starting and ending
/// with an alphanumeric. `[.]` avoids backslash escapes that differ between YAML, CEL and Rust.
const DNS_SUBDOMAIN_RE: &str = "^[a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*$";

/// Declares that the GPU nodes selected by `nodeSelector` move from the NVIDIA device plugin to
/// Switchyard's DRA driver (or back), node by node, without changing any workload.
///
/// Pods keep asking for `nvidia.com/gpu: 1`; once a node is on DRA, the scheduler serves that
/// request through a DeviceClass with `extendedResourceName` and a generated ResourceClaim.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "switchyard.dev",
    version = "v1alpha1",
    kind = "GpuPoolMigration",
    plural = "gpupoolmigrations",
    shortname = "gpm",
    category = "switchyard",
    status = "GpuPoolMigrationStatus",
    doc = "Moves the GPU nodes that spec.nodeSelector selects from the NVIDIA device plugin to a DRA driver, node by node, or back.",
    printcolumn = r#"{"name": "Phase", "type": "string", "jsonPath": ".status.phase", "description": "Where the migration stands"}"#,
    printcolumn = r#"{"name": "Direction", "type": "string", "jsonPath": ".spec.direction", "description": "Forward (to DRA) or Rollback (to the device plugin)"}"#,
    printcolumn = r#"{"name": "Migrated", "type": "integer", "jsonPath": ".status.nodes.migrated", "description": "Nodes served by the DRA driver"}"#,
    printcolumn = r#"{"name": "Total", "type": "integer", "jsonPath": ".status.nodes.total", "description": "Nodes in the pool"}"#,
    printcolumn = r#"{"name": "Moving", "type": "integer", "jsonPath": ".status.nodes.inProgress", "description": "Nodes moving now"}"#,
    printcolumn = r#"{"name": "Failed", "type": "integer", "jsonPath": ".status.nodes.failed", "description": "Nodes that failed to move"}"#,
    printcolumn = r#"{"name": "Reason", "type": "string", "jsonPath": ".status.conditions[?(@.type==\"Ready\")].reason", "description": "Why the migration is not Ready: what it waits for, or what stalls it (Stalled has the same reason and the message)"}"#,
    printcolumn = r#"{"name": "Paused", "type": "boolean", "priority": 1, "jsonPath": ".spec.paused", "description": "spec.paused"}"#,
    printcolumn = r#"{"name": "Refused", "type": "integer", "jsonPath": ".status.nodes.refused", "description": "Selected nodes this migration will not move: another migration owns or also selects them"}"#,
    printcolumn = r#"{"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct GpuPoolMigrationSpec {
    /// Selects the GPU nodes of the pool. Required and must select something: set matchLabels or
    /// matchExpressions. Immutable: to migrate a different set of nodes, create another
    /// GpuPoolMigration. A node selected by two migrations is moved by neither.
    #[x_kube(
        validation = Rule::new("(has(self.matchLabels) && size(self.matchLabels) > 0) || (has(self.matchExpressions) && size(self.matchExpressions) > 0)")
            .message("spec.nodeSelector must not be empty: set matchLabels or matchExpressions to select the pool's nodes"),
        validation = Rule::new("self == oldSelf")
            .message("spec.nodeSelector is immutable: create a new GpuPoolMigration to migrate a different pool")
    )]
    pub node_selector: LabelSelector,

    /// The extended resources that move to DRA, 1 to 16 entries. For each entry Switchyard
    /// manages a DeviceClass that serves the extended resource name through the DRA driver, so
    /// that `resources.limits: {nvidia.com/gpu: 1}` keeps working on migrated nodes.
    #[schemars(length(min = 1, max = 16))]
    #[x_kube(
        validation = Rule::new("self.all(r, self.exists_one(o, o.extendedResourceName == r.extendedResourceName))")
            .message("spec.resources[].extendedResourceName must be unique"),
        validation = Rule::new("self.all(r, self.exists_one(o, o.deviceClassName == r.deviceClassName))")
            .message("spec.resources[].deviceClassName must be unique")
    )]
    pub resources: Vec<ResourceMapping>,

    /// The DRA driver that serves migrated nodes.
    pub driver: DriverSpec,

    /// The NVIDIA device plugin that serves nodes until they move.
    pub device_plugin: DevicePluginSpec,

    /// Who keeps the two DaemonSets off each other's nodes. `Managed` (default): Switchyard adds
    /// a required node affinity on `switchyard.dev/gpu-backend` to both pod templates, once.
    /// `Verify`: Switchyard only checks them and reports the exact YAML to add, for DaemonSets
    /// that Helm or a GitOps tool owns. `GpuOperator`: for a device plugin the NVIDIA GPU
    /// Operator deploys; Switchyard edits no DaemonSet and turns the plugin off per node with the
    /// `nvidia.com/gpu.deploy.device-plugin` label, restoring it as it was on rollback.
    #[serde(default)]
    pub placement: PlacementMode,

    /// How fast and how carefully nodes move.
    #[serde(default)]
    pub strategy: Strategy,

    /// `Forward` (default) moves the pool to DRA. `Rollback` moves every migrated node back to
    /// the device plugin, evicting DRA claim holders first.
    #[serde(default)]
    pub direction: Direction,

    /// When true, no new node starts moving. A node in flight finishes its current step and stops
    /// in a consistent state; set it back to false to resume.
    #[serde(default)]
    pub paused: bool,

    /// Capacity changes the move makes that Switchyard will not make unasked.
    #[serde(default)]
    pub acknowledge: Acknowledge,
}

/// Consequences of the move that the user accepts by name.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Acknowledge {
    /// The pool's device plugin shares GPUs or MIG devices (time-slicing or MPS: it advertises
    /// more of a resource than the node has devices, `nvidia.com/gpu`, a MIG profile, or a
    /// resource renamed `<name>.shared` by `renameByDefault`). DRA allocates whole devices, so
    /// after the move each serves one pod and each shared resource's capacity drops to its
    /// physical devices. Until this is true, such a pool does not start: `PrerequisitesMet` is
    /// False with reason `GpuSharingNotAcknowledged` and names, per resource, the nodes and the
    /// capacity before and after.
    #[serde(default)]
    pub gpu_sharing_loss: bool,
}

/// One extended resource that moves to DRA, and the DeviceClass that serves it.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ResourceMapping {
    /// The extended resource name that workloads request, for example `nvidia.com/gpu` or
    /// `nvidia.com/mig-1g.10gb`. Must be `<domain>/<name>`, outside the kubernetes.io domain, and
    /// must not start with `requests.`.
    #[schemars(length(min = 1, max = 253))]
    #[x_kube(
        validation = Rule::new("self.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*/[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$')")
            .message("spec.resources[].extendedResourceName must be an extended resource name of the form <domain>/<name>, for example nvidia.com/gpu"),
        validation = Rule::new("!self.contains('kubernetes.io/')")
            .message("spec.resources[].extendedResourceName must not be in the kubernetes.io domain"),
        validation = Rule::new("!self.startsWith('requests.')")
            .message("spec.resources[].extendedResourceName must not start with \"requests.\"")
    )]
    pub extended_resource_name: String,

    /// Name of the cluster-scoped DeviceClass that Switchyard creates and keeps for this
    /// resource. A DNS subdomain, for example `gpu.switchyard.dev`. If it is also a valid extended
    /// resource name, pods can request it as `deviceclass.resource.kubernetes.io/<name>` too.
    #[schemars(length(min = 1, max = 253))]
    #[x_kube(validation = Rule::new(format!("self.matches('{DNS_SUBDOMAIN_RE}')"))
        .message("spec.resources[].deviceClassName must be a DNS subdomain: lower-case letters, digits, '-' and '.'"))]
    pub device_class_name: String,

    /// Optional CEL expression over `device`, ANDed with the match on the driver name, that picks
    /// which devices of the driver serve this resource. Example:
    /// `device.attributes['gpu.switchyard.dev'].type == 'gpu'`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 10240))]
    pub selector: Option<String>,
}

/// The DRA driver that serves migrated nodes.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!(self.name == 'gpu.nvidia.com' && has(self.devicePluginInterlock) && self.devicePluginInterlock)")
    .message("spec.driver.devicePluginInterlock must not be true for gpu.nvidia.com: that driver does not taint its devices while the device plugin still serves the node; leave it unset so that the switch runs in sequence"))]
pub struct DriverSpec {
    /// The DRA driver name, as published in ResourceSlices (`spec.driver`). A DNS subdomain of at
    /// most 63 characters. Immutable, because DeviceClasses and published slices depend on it.
    #[schemars(length(min = 1, max = 63))]
    #[x_kube(
        validation = Rule::new(format!("self.matches('{DNS_SUBDOMAIN_RE}')"))
            .message("spec.driver.name must be a DNS subdomain of at most 63 characters, for example gpu.switchyard.dev"),
        validation = Rule::new("self == oldSelf")
            .message("spec.driver.name is immutable: create a new GpuPoolMigration to use another driver")
    )]
    pub name: String,

    /// The DaemonSet that runs the DRA driver's kubelet plugin. It must run only on nodes labelled
    /// `switchyard.dev/gpu-backend=dra`.
    pub daemon_set: DaemonSetRef,

    /// Whether the driver keeps its own devices unschedulable while the node still advertises
    /// device-plugin GPUs (its GPU resources in `status.allocatable`). Switchyard's driver does: it
    /// taints every device `<driver>/device-plugin-active` until the device plugin's resources are
    /// gone (`--device-plugin-resources`). With it, a node's switch starts the driver while the device
    /// plugin leaves. Without it (any other driver, such as NVIDIA's `gpu.nvidia.com`), Switchyard
    /// switches in sequence: it first labels the node `switchyard.dev/gpu-backend=none`, so that
    /// neither DaemonSet runs there, waits until the device plugin's pod is gone and allocatable
    /// is 0, and only then labels it `dra`; the device plugin must then also avoid `none` nodes
    /// (PlacementReady says so). Unset: true for `gpu.switchyard.dev`, false for every other
    /// driver name. Setting it true for a driver that has no such interlock lets the scheduler
    /// see the node's GPUs through both backends during the switch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_plugin_interlock: Option<bool>,

    /// How many claims the driver lets share each device it publishes on this pool's nodes, as it
    /// is configured to: Switchyard's agent by `--shares-per-device` (the chart's
    /// `agent.sharesPerDevice`) or a node's `switchyard.dev/gpu-shares` label, NVIDIA's DRA driver
    /// by `--consumable-shares=<N>` (its `ConsumableShares` feature gate). A device published that
    /// way (`allowMultipleAllocations` with a `shares` capacity) takes one claim per share, so a
    /// pool whose device plugin time-slices each GPU this many ways or fewer keeps its pods per GPU
    /// and moves without `spec.acknowledge.gpuSharingLoss`; one sliced more ways shows the loss
    /// with both numbers. Each node's switch checks it: until the node's devices that the pool's
    /// classes select can each be allocated to this many claims, the switch waits and then fails
    /// with `SwitchTimeout` saying what the driver publishes. Unset: 1, each device serves one
    /// claim. An MPS source is never counted as kept: the driver shares by time-slicing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self >= 1 && self <= 1024")
        .message("spec.driver.sharesPerDevice must be between 1 and 1024"))]
    pub shares_per_device: Option<i32>,
}

impl DriverSpec {
    /// True when the switch may start the driver while the device plugin leaves, because the
    /// driver taints its devices until the plugin's resources are gone (see
    /// `devicePluginInterlock`).
    pub fn interlocked(&self) -> bool {
        self.device_plugin_interlock.unwrap_or(self.name == crate::well_known::DEFAULT_DRIVER_NAME)
    }

    /// `sharesPerDevice`, 1 where unset.
    pub fn shares(&self) -> u64 {
        self.shares_per_device.map_or(1, |n| n.max(1) as u64)
    }
}

/// The device plugin that serves nodes before they move.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct DevicePluginSpec {
    /// The DaemonSet that runs the NVIDIA device plugin. It must not run on nodes labelled
    /// `switchyard.dev/gpu-backend=dra`.
    pub daemon_set: DaemonSetRef,

    /// Extended resources the device plugin advertises for GPUs besides the names it uses by
    /// default (`nvidia.com/gpu`, `nvidia.com/gpu.shared` and `nvidia.com/mig-*`): a name its
    /// `resources` config renames a GPU or a MIG profile to. Each is an exact name, or a prefix
    /// ending in `*`. A pool node that advertises one of these, or a default name, that no
    /// `spec.resources` entry maps does not start (`UnmappedResources`). Other `nvidia.com/*`
    /// resources, such as the NVIDIA Network Operator's SR-IOV and RDMA devices, are not GPUs
    /// and are left alone. Give Switchyard's agent the same names (`--device-plugin-resources`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16), inner(length(min = 1, max = 253)))]
    #[x_kube(validation = Rule::new("self.all(r, r.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*/[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$') || r.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*/([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[*]$'))")
        .message("spec.devicePlugin.gpuResources[] must be an extended resource name such as nvidia.com/a100, or a prefix of one ending in *, such as nvidia.com/a100-*"))]
    pub gpu_resources: Vec<String>,
}

/// A reference to a DaemonSet.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct DaemonSetRef {
    /// Namespace of the DaemonSet.
    #[schemars(length(min = 1, max = 63))]
    #[x_kube(validation = Rule::new("self.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$')")
        .message("daemonSet.namespace must be a DNS label: lower-case letters, digits and '-'"))]
    pub namespace: String,

    /// Name of the DaemonSet.
    #[schemars(length(min = 1, max = 253))]
    #[x_kube(validation = Rule::new(format!("self.matches('{DNS_SUBDOMAIN_RE}')"))
        .message("daemonSet.name must be a DNS subdomain: lower-case letters, digits, '-' and '.'"))]
    pub name: String,
}

/// Who keeps the device plugin and the DRA driver off each other's nodes.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PlacementMode {
    /// Switchyard adds the backend node affinity to both DaemonSets' pod templates, once.
    #[default]
    Managed,
    /// Switchyard only checks the DaemonSets and reports the YAML to add.
    Verify,
    /// For a device plugin that the NVIDIA GPU Operator deploys: Switchyard edits no DaemonSet and
    /// switches each node by its `nvidia.com/gpu.deploy.device-plugin` label (`false` while the
    /// node is on DRA, restored as it was on rollback). The driver's DaemonSet must already run
    /// only on `switchyard.dev/gpu-backend=dra` nodes; PlacementReady says what to add if not.
    GpuOperator,
}

/// Which way the pool moves.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Direction {
    /// Move nodes from the device plugin to DRA.
    #[default]
    Forward,
    /// Move every migrated node back to the device plugin.
    Rollback,
}

/// How fast and how carefully nodes move.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new("(has(self.type) && self.type == 'Replace') == has(self.replace)")
        .message("spec.strategy.replace is required when spec.strategy.type is Replace, and must be unset otherwise"),
    validation = Rule::new("(has(self.type) ? self.type : 'InPlace') == (has(oldSelf.type) ? oldSelf.type : 'InPlace')")
        .message("spec.strategy.type is immutable: create a new GpuPoolMigration to move the pool another way")
)]
pub struct Strategy {
    /// `InPlace` (default): each node of the pool switches from the device plugin to the DRA
    /// driver where it stands. `Replace`: the pool's nodes stay on the device plugin; their GPU
    /// pods are drained onto a target node pool that the DRA driver already serves
    /// (`replace.targetNodeSelector`), and the drained nodes are left cordoned and marked for
    /// the provider to remove. Replace is for managed clusters whose provider owns the device
    /// plugin (GKE, AKS, EKS Auto Mode), where the supported path is a new node pool. Immutable.
    #[serde(default, rename = "type")]
    pub type_: StrategyType,

    /// The target pool of a Replace migration. Required when `type` is Replace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replace: Option<ReplaceSpec>,

    /// How many pool nodes may be unavailable at once, counting nodes that were already cordoned
    /// or NotReady: an integer of at least 1, or a percentage from "1%" to "100%" of the pool
    /// (rounded down, at least 1). Default 1.
    #[serde(default = "default_max_unavailable")]
    #[x_kube(validation = Rule::new("string(self).matches('^([1-9][0-9]*|(100|[1-9][0-9]?)%)$')")
        .message("spec.strategy.maxUnavailable must be an integer >= 1 or a percentage from \"1%\" to \"100%\""))]
    pub max_unavailable: IntOrString,

    /// How GPU pods leave a node before it switches.
    #[serde(default)]
    pub drain: DrainSpec,

    /// How a switched node proves it serves GPUs through DRA before it is uncordoned.
    #[serde(default)]
    pub verify: VerifySpec,

    /// What happens when a node fails to move. `Pause` (default): the migration pauses and the
    /// node stays cordoned on a consistent backend for a human to look at. `Rollback`: that node
    /// goes back to the device plugin and the migration goes on with the next node.
    #[serde(default)]
    pub on_failure: FailurePolicy,
}

impl Default for Strategy {
    fn default() -> Self {
        Self {
            type_: StrategyType::default(),
            replace: None,
            max_unavailable: default_max_unavailable(),
            drain: DrainSpec::default(),
            verify: VerifySpec::default(),
            on_failure: FailurePolicy::default(),
        }
    }
}

fn default_max_unavailable() -> IntOrString {
    IntOrString::Int(1)
}

impl Strategy {
    /// The target pool, when the migration replaces its nodes rather than switching them.
    pub fn replace(&self) -> Option<&ReplaceSpec> {
        match self.type_ {
            StrategyType::Replace => self.replace.as_ref(),
            StrategyType::InPlace => None,
        }
    }
}

/// How the pool's nodes come to be served by DRA.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum StrategyType {
    /// Each node switches backends where it stands: cordon, drain, switch, verify, uncordon.
    #[default]
    InPlace,
    /// Each node is drained onto a target pool the DRA driver already serves, then left
    /// cordoned for removal.
    Replace,
}

/// The target pool of a Replace migration, and how the drain waits for room there.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ReplaceSpec {
    /// Selects the nodes of the target pool: nodes that `spec.driver` serves (its ResourceSlices
    /// publish their GPUs) and where the pool's GPU pods go. Required and must select something.
    /// It must not select a node that `spec.nodeSelector` selects: such a pool does not start
    /// (`PrerequisitesMet` False, reason `TargetOverlapsPool`).
    #[x_kube(
        validation = Rule::new("(has(self.matchLabels) && size(self.matchLabels) > 0) || (has(self.matchExpressions) && size(self.matchExpressions) > 0)")
            .message("spec.strategy.replace.targetNodeSelector must not be empty: set matchLabels or matchExpressions to select the target pool's nodes")
    )]
    pub target_node_selector: LabelSelector,

    /// Before a node drains, and before each eviction while it drains, Switchyard checks that the
    /// target pool has free DRA devices for the node's GPU pods, per `spec.resources` entry: devices its DeviceClass selects on the target
    /// nodes that are Ready and schedulable, less the devices allocated to ResourceClaims and
    /// those that pending GPU pods and nodes already draining still need. Short of that, the node
    /// waits cordoned (`TargetCapacityShort`, saying how many of which resource are missing; a
    /// node already draining waits within `drain.timeoutSeconds`) until target nodes are added. An autoscaler adds nodes only for Pending pods, which this wait
    /// never makes: raise the target pool's minimum size instead. When true, the node drains
    /// anyway and its pods wait Pending, where an autoscaler of the target pool sees them.
    /// Default false.
    #[serde(default)]
    pub evict_without_capacity: bool,
}

/// How GPU pods leave a node before it switches.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct DrainSpec {
    /// Which pods are evicted. `ResourceConsumers` (default): only pods that request one of
    /// `spec.resources`. `All`: every pod except DaemonSet and mirror pods.
    #[serde(default)]
    pub pod_selection: PodSelection,

    /// How long the drain may take before the node fails, in seconds. Default 600. Keep it well
    /// above 120: an eviction cut off mid-request counts against its PodDisruptionBudget for 2
    /// minutes without deleting the pod.
    #[serde(default = "default_timeout_seconds")]
    #[x_kube(validation = Rule::new("self > 0").message("spec.strategy.drain.timeoutSeconds must be greater than 0"))]
    pub timeout_seconds: i64,

    /// Grace period for evicted pods, in seconds. Unset: each pod's own
    /// terminationGracePeriodSeconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self >= 0").message("spec.strategy.drain.gracePeriodSeconds must be 0 or more"))]
    pub grace_period_seconds: Option<i64>,

    /// Evict pods that use emptyDir volumes, losing that data. When false (default), such pods
    /// block the drain and are named in the node's status message.
    #[serde(default)]
    pub delete_empty_dir_data: bool,

    /// Evict pods that no controller manages (no ownerReference with `controller: true`).
    /// Nothing re-creates such a pod: its eviction deletes it for good. When false (default),
    /// such pods block the drain, are named in the node's status message and in an event, as
    /// `kubectl drain` refuses them without `--force`.
    #[serde(default)]
    pub force: bool,

    /// Rolling a node back drains the pods that hold the driver's devices through the eviction
    /// API, as the forward drain does: PodDisruptionBudgets are honoured, and a DeviceTaintRule
    /// with effect NoSchedule keeps new claims off the node's devices meanwhile. When pods are
    /// still left after `timeoutSeconds` (a budget that allows no eviction), the node fails with
    /// `RollbackTimeout` and keeps them, unless this is true: then they go without consulting
    /// their PodDisruptionBudgets. Where the controller manager shows v1.37.2 or later, the rule's
    /// effect becomes NoExecute and the device-taint-eviction controller evicts them; before
    /// v1.37.2 that controller misses pods whose claim the scheduler generated
    /// (kubernetes/kubernetes#141290), and a managed control plane hides its version, so there
    /// the operator deletes them itself, as that controller would. Default false.
    #[serde(default)]
    pub rollback_evicts_past_budgets: bool,

    /// A DaemonSet's pod that holds one of the node's device-plugin GPUs (a monitoring or
    /// inference agent that requests `nvidia.com/gpu`) is not drained, as `kubectl drain` leaves
    /// DaemonSet pods; but once the driver publishes that GPU, the scheduler could hand it out a
    /// second time. So the switch waits for such pods, names them in the node's status and an
    /// event, and the node stays on the device plugin until they are gone. When true, Switchyard
    /// evicts them itself once the device plugin has left the node: the DaemonSet's new pod then
    /// gets its GPU through DRA. A static pod holding one always waits for a person. Rolling
    /// back, the same holds for a DaemonSet pod holding one of the driver's devices: it is named,
    /// or, when true, evicted once the node's other holders are gone, and its new pod gets its GPU
    /// from the device plugin.
    #[serde(default)]
    pub evict_daemon_set_gpu_pods: bool,
}

impl Default for DrainSpec {
    fn default() -> Self {
        Self {
            pod_selection: PodSelection::default(),
            timeout_seconds: default_timeout_seconds(),
            grace_period_seconds: None,
            delete_empty_dir_data: false,
            force: false,
            rollback_evicts_past_budgets: false,
            evict_daemon_set_gpu_pods: false,
        }
    }
}

/// Ten minutes: long enough for a training job's checkpoint-on-SIGTERM, short enough that a stuck
/// node is reported within one coffee break.
fn default_timeout_seconds() -> i64 {
    600
}

/// Which pods a drain evicts.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PodSelection {
    /// Only pods that request one of `spec.resources`.
    #[default]
    ResourceConsumers,
    /// Every pod except DaemonSet and mirror pods.
    All,
}

/// What happens when a node fails to move.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum FailurePolicy {
    /// Pause the whole migration and leave the node for a human.
    #[default]
    Pause,
    /// Move that node back to the device plugin and carry on.
    Rollback,
}

/// How a switched node proves it serves GPUs through DRA.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct VerifySpec {
    /// How long the switch and its verification may take before the node fails, in seconds.
    /// Default 600.
    #[serde(default = "default_timeout_seconds")]
    #[x_kube(validation = Rule::new("self > 0").message("spec.strategy.verify.timeoutSeconds must be greater than 0"))]
    pub timeout_seconds: i64,

    /// Optional canary: a pod that requests 1 of the first resource, pinned to the migrated node.
    /// The node passes when the scheduler binds it there through a generated ResourceClaim
    /// allocated from this node's DRA devices (and, with a real kubelet, when it succeeds).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub canary: Option<CanarySpec>,
}

impl Default for VerifySpec {
    fn default() -> Self {
        Self { timeout_seconds: default_timeout_seconds(), canary: None }
    }
}

/// The canary pod run on each migrated node.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.image) && size(self.image) > 0")
    .message("spec.strategy.verify.canary.image is required when canary is set"))]
pub struct CanarySpec {
    /// Container image of the canary, for example `registry.k8s.io/pause:3.10` with `command:
    /// [/pause, -v]`. Required. The canary must exit by itself: pause without `-v` runs until it
    /// is stopped, so the node would end in VerifyTimeout.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(length(max = 512))]
    pub image: String,

    /// Command of the canary container. Empty: the image's entrypoint. The canary passes when
    /// the command exits 0 and the scheduler served it through a generated ResourceClaim.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub command: Vec<String>,
}

/// What the operator observed and did. Per-node state lives on the Node objects
/// (`switchyard.dev/migration-state`), so this stays small for a pool of thousands of nodes.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct GpuPoolMigrationStatus {
    /// The `metadata.generation` this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,

    /// Where the migration stands.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<Phase>,

    /// Node counts by state.
    #[serde(default)]
    pub nodes: NodeCounts,

    /// The nodes in flight right now, at most `maxUnavailable` of them (capped at 64).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub in_progress: Vec<NodeProgress>,

    /// Nodes that failed to move, with the reason (capped at 64; `nodes.failed` has the count).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub failed: Vec<FailedNode>,

    /// One entry per `spec.resources` entry: the DeviceClass and whether the scheduler uses it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub device_classes: Vec<DeviceClassStatus>,

    /// Going forward: the GPU pods running on migrated nodes, each checked against the devices
    /// that serve it (the runbook's verification step, for every pod and not only the canary).
    /// Absent until a node has migrated; read at most every 30 seconds. Under `strategy.type:
    /// Replace`: the GPU pods on the target pool's nodes, and any on an old node left for removal
    /// (reported: the device plugin serves it), once a node is Replaced.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pods: Option<PodVerification>,

    /// Under `strategy.type: Replace`: the target pool's free devices and the old nodes left for
    /// removal.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replace: Option<ReplaceStatus>,

    /// Ready, Reconciling and Stalled (kstatus), and PrerequisitesMet, DeviceClassesReady,
    /// PlacementReady, BackendOverlap (True is a fault), NodeConflict (nodes another migration
    /// also selects), InventoryFindings (warnings that do not block) and, going forward,
    /// DevicePluginRemovable (the device plugin serves no node any more and may be deleted) and
    /// PodsVerified (every GPU pod on a migrated node runs on the driver's devices).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

/// Where a migration stands.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Waiting for prerequisites, DeviceClasses or placement.
    Pending,
    /// Nodes are moving to DRA.
    Progressing,
    /// `spec.paused` is set, or a node failed with `onFailure: Pause`.
    Paused,
    /// Every pool node is served by DRA.
    Completed,
    /// The migration cannot go on without a human.
    Failed,
    /// Nodes are moving back to the device plugin.
    RollingBack,
    /// Every pool node is served by the device plugin again.
    RolledBack,
}

/// Node counts by state.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct NodeCounts {
    /// Nodes selected by `spec.nodeSelector` and owned by this migration.
    pub total: i32,
    /// Nodes that have not started moving.
    pub pending: i32,
    /// Nodes moving now.
    pub in_progress: i32,
    /// Nodes served by the DRA driver. Under `strategy.type: Replace`, old nodes whose GPU pods
    /// have moved to the target pool (state Replaced).
    pub migrated: i32,
    /// Nodes that failed to move.
    pub failed: i32,
    /// Selected nodes this migration will not move: another GpuPoolMigration owns them, or also
    /// selects them (a node two migrations select is moved by neither). While any is refused the
    /// migration is neither Completed nor RolledBack; the NodeConflict condition names them.
    #[serde(default)]
    pub refused: i32,
}

/// The per-node state machine, recorded on each Node in `switchyard.dev/migration-state`.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum NodeState {
    /// Not started.
    Pending,
    /// Cordoned; whether it was unschedulable before is remembered on the node.
    Cordoned,
    /// Evicting the pods that use the pool's resources.
    Draining,
    /// Backend label flipped; waiting for the device plugin to leave and DRA slices to appear.
    Switching,
    /// Checking that the scheduler allocates this node's DRA devices.
    Verifying,
    /// Served by DRA and uncordoned (unless an admin had cordoned it).
    Migrated,
    /// Failed to move; see the reason in status and events.
    Failed,
    /// Moving back to the device plugin.
    RollingBack,
    /// Served by the device plugin again.
    RolledBack,
    /// `strategy.type: Replace`: drained onto the target pool, left cordoned and marked
    /// `switchyard.dev/replaced` for the provider (or a person) to remove.
    Replaced,
}

/// The GPU pods on migrated nodes, checked (see `status.pods`). A pod is verified when every GPU
/// resource it requests is served through the claim the scheduler generated for it
/// (`status.extendedResourceClaimStatus`), and that claim exists and is allocated devices of
/// `spec.driver.name` on the pod's node.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct PodVerification {
    /// Running GPU pods on migrated nodes that are verified.
    pub verified: i32,
    /// Running GPU pods on migrated nodes that are not; `unverifiedPods` says why.
    pub unverified: i32,
    /// Per migrated node with GPU pods, how many were verified and how many not: nodes with
    /// unverified pods first, then by name (capped at 64).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub nodes: Vec<NodePods>,
    /// The pods that are not verified, with the reason (capped at 64; `unverified` has the count).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub unverified_pods: Vec<UnverifiedPod>,
}

/// One migrated node's GPU pods, checked.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct NodePods {
    /// Node name.
    pub node: String,
    pub verified: i32,
    pub unverified: i32,
}

/// A GPU pod on a migrated node that is not served as the migration intends.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct UnverifiedPod {
    /// The node it runs on.
    pub node: String,
    pub namespace: String,
    pub name: String,
    /// `HoldsDevicePluginGpu` (it runs without a claim for a GPU resource: the device plugin
    /// serves it, an overlap), `ClaimMissing`, `ClaimNotAllocated`, `RequestNotAllocated`,
    /// `OtherDevices` (allocated from another driver, or another node's devices), `CannotStart`
    /// (bound there and never started: the message quotes the kubelet) or, under
    /// `strategy.type: Replace`, `OnReplacedNode` (it runs on an old node left for removal).
    pub reason: String,
    /// What was found, naming the resource, claim and devices.
    pub message: String,
}

/// A node in flight.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct NodeProgress {
    /// Node name.
    pub name: String,
    /// The step the node is in.
    pub state: NodeState,
    /// When the node entered this step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since: Option<Time>,
    /// What the step is doing or waiting for.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    /// Who holds the node's cordon; absent while the node is schedulable. `Switchyard` uncordons
    /// the node once it has moved (or gone back); an `Admin` cordon stays.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cordoned_by: Option<CordonHolder>,
}

/// Who holds a moving node's cordon, and so whether the node is schedulable once it has moved.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum CordonHolder {
    /// The migration cordoned a schedulable node and uncordons it once the node has moved. A
    /// `kubectl cordon` meanwhile changes nothing in the API (the node is cordoned already), so
    /// Switchyard cannot see it: to keep the node cordoned afterwards, annotate it
    /// `switchyard.dev/initially-unschedulable=true`, and this turns to `Admin`.
    Switchyard,
    /// The node was cordoned before it started, or is annotated
    /// `switchyard.dev/initially-unschedulable=true`: it stays cordoned after it moves.
    Admin,
}

/// A node that failed to move.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct FailedNode {
    /// Node name.
    pub name: String,
    /// The step in which it failed.
    pub state: NodeState,
    /// A CamelCase reason, also used for the event.
    pub reason: String,
    /// What went wrong and what to do about it.
    pub message: String,
}

/// A DeviceClass managed for one `spec.resources` entry.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct DeviceClassStatus {
    /// DeviceClass name.
    pub name: String,
    /// The extended resource name it serves.
    pub extended_resource_name: String,
    /// True when the scheduler uses this class for the extended resource name.
    pub effective: bool,
    /// The DeviceClass that wins the extended resource name instead of ours, if any.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub shadowed_by: String,
}

/// A Replace migration's target pool and the old nodes it has emptied.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ReplaceStatus {
    /// Target nodes that are Ready and schedulable: the nodes whose devices count.
    pub target_nodes: i32,
    /// Per `spec.resources` entry, the target pool's free devices as last checked. Read only while
    /// a node waits for room or is about to start.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub capacity: Vec<TargetCapacity>,
    /// Old nodes drained and left cordoned for removal (state Replaced), by name (capped at 64;
    /// `nodes.migrated` has the count). Each carries the label `switchyard.dev/replaced`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub replaced_nodes: Vec<String>,
}

/// One resource's room on the target pool.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct TargetCapacity {
    /// The extended resource name (`spec.resources[].extendedResourceName`).
    pub resource: String,
    /// Devices its DeviceClass selects on the target pool's Ready, schedulable nodes, untainted.
    pub devices: i32,
    /// Of those, the devices no ResourceClaim holds and no pending pod or draining node needs.
    pub free: i32,
}
