//! The per-node state machine. `next_step` is pure: it looks at what the controller observed
//! about one node and returns the one action to take now. Every state lives in the node's labels
//! and annotations, so a restarted operator computes the same step and resumes.
//!
//! ```text
//! Pending → (Cordoned) → Draining → Switching → (Verifying) → Migrated
//!                                      │ (a driver without the device-plugin interlock: backend
//!                                      │  `none` until the plugin has left, then `dra`)
//!              │           │           │           │
//!              └───────────┴───────────┴───────────┴──→ Failed ──(onFailure: Rollback)──┐
//! Migrated / Switching / Verifying ──(direction: Rollback)──→ RollingBack → RolledBack ←─┘
//! Cordoned / Draining ──(direction: Rollback)──→ RolledBack (never switched: just uncordon)
//!
//! strategy.type: Replace (the node never switches; its pods move to the target pool):
//! Pending → Cordoned (waits while the target lacks room) → Draining → Replaced
//! Cordoned ──(direction: Rollback)──→ RolledBack (uncordon)
//! Replaced / Draining ──(direction: Rollback)──→ RollingBack (uncordoned; the pods that left
//!                                               come back from the target) → RolledBack
//! ```
//!
//! A node whose device-plugin GPU count is known is cordoned and starts draining in one write;
//! it rests in Cordoned only while that count is unknown or the pool is held. Verifying is the
//! canary's state: without a canary a switched node completes from Switching. Each state a node
//! skips is a node patch, an event and a status write fewer.

use k8s_openapi::jiff::Timestamp;

use crate::api::v1alpha1::{Direction, FailurePolicy, GpuPoolMigrationSpec, NodeState};
use crate::node::record::{self, Backend, Failure, PoolNode};

/// What the drain selection found on the node (see `drain::select`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DrainCounts {
    /// Pods to evict now.
    pub to_evict: usize,
    /// Pods that would be evicted but use emptyDir and `deleteEmptyDirData` is false.
    pub blocked: usize,
    /// Selected pods already terminating; they still hold devices.
    pub terminating: usize,
    /// Pods no controller manages, kept because `force` is false: evicting one loses it.
    pub unmanaged: usize,
    /// DaemonSet pods holding device-plugin GPUs (`drain::gpu_holders_left`).
    pub daemon_set_holders: usize,
    /// Static pods holding them.
    pub static_holders: usize,
}

/// Where the optional canary pod stands.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Canary {
    /// `spec.strategy.verify.canary` is not set.
    #[default]
    NotConfigured,
    /// Configured, no canary pod on the node yet.
    Absent,
    /// Created, not finished.
    Running,
    /// Created, and the kubelet reports that its container cannot start (what it says): an error
    /// it retries without resolving by itself, such as `CreateContainerConfigError`.
    CannotStart(String),
    /// Bound through a generated ResourceClaim and succeeded.
    Succeeded,
    /// Failed, with what went wrong.
    Failed(String),
    /// Left by an earlier attempt at this node: deleted, then created anew.
    Stale,
}

/// Why a node waits: the reason part of its status message (`<reason>: <message>`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WaitReason {
    /// The kubelet reports NotReady; the step resumes when it is Ready.
    NodeNotReady,
    /// `spec.paused` holds the node at a safe point.
    Paused,
    /// Another node failed under `onFailure: Pause`.
    HeldByFailedNode,
    /// A gate of the migration is closed.
    GateClosed,
    /// The migration is being deleted.
    Deleting,
    /// The node's GPU count, which the switch is verified against, is not known yet.
    GpuCountUnknown,
    /// Pods without a controller block the drain until `drain.force`.
    UnmanagedPodsBlockDrain,
    /// emptyDir pods block the drain until `drain.deleteEmptyDirData`.
    EmptyDirBlocksDrain,
    /// Evicted pods are still terminating.
    PodsTerminating,
    /// The node still advertises device-plugin resources.
    DevicePluginStillAdvertising,
    /// The driver publishes fewer devices than the node had.
    WaitingForResourceSlices,
    /// The canary pod has not finished.
    CanaryRunning,
    /// The kubelet reports that the canary's container cannot start.
    CanaryCannotStart,
    /// The node failed and waits for a person.
    NeedsHuman,
    /// The DeviceTaintRule is evicting DRA claim holders.
    EvictingClaimHolders,
    /// The device plugin does not advertise the GPUs again yet.
    WaitingForDevicePlugin,
    /// The device plugin's pod still runs on a node whose switch waits for it to be gone.
    DevicePluginPodRunning,
    /// The driver still offers allocatable devices on the node.
    WaitingForDriverToLeave,
    /// A DaemonSet's pod holds a device-plugin GPU the switch would publish again.
    GpuHeldByDaemonSetPod,
    /// A static pod holds a device-plugin GPU the switch would publish again.
    GpuHeldByStaticPod,
    /// Replace: the target pool lacks free devices for the node's GPU pods.
    TargetCapacityShort,
    /// Replace, rolling back: pods evicted from the target pool are on their way back.
    PodsReturning,
    /// Replace, rolling back: the returning old nodes lack room for the pods still on the target.
    ReturnRoomShort,
}

impl WaitReason {
    /// The reason as it reads in status messages, failure records and events.
    pub fn as_str(self) -> &'static str {
        match self {
            WaitReason::NodeNotReady => "NodeNotReady",
            WaitReason::Paused => "Paused",
            WaitReason::HeldByFailedNode => "HeldByFailedNode",
            WaitReason::GateClosed => "GateClosed",
            WaitReason::Deleting => "Deleting",
            WaitReason::GpuCountUnknown => "GpuCountUnknown",
            WaitReason::UnmanagedPodsBlockDrain => "UnmanagedPodsBlockDrain",
            WaitReason::EmptyDirBlocksDrain => "EmptyDirBlocksDrain",
            WaitReason::PodsTerminating => "PodsTerminating",
            WaitReason::DevicePluginStillAdvertising => "DevicePluginStillAdvertising",
            WaitReason::WaitingForResourceSlices => "WaitingForResourceSlices",
            WaitReason::CanaryRunning => "CanaryRunning",
            WaitReason::CanaryCannotStart => "CanaryCannotStart",
            WaitReason::NeedsHuman => "NeedsHuman",
            WaitReason::EvictingClaimHolders => "EvictingClaimHolders",
            WaitReason::WaitingForDevicePlugin => "WaitingForDevicePlugin",
            WaitReason::DevicePluginPodRunning => "DevicePluginPodRunning",
            WaitReason::WaitingForDriverToLeave => "WaitingForDriverToLeave",
            WaitReason::GpuHeldByDaemonSetPod => "GpuHeldByDaemonSetPod",
            WaitReason::GpuHeldByStaticPod => "GpuHeldByStaticPod",
            WaitReason::TargetCapacityShort => "TargetCapacityShort",
            WaitReason::PodsReturning => "PodsReturning",
            WaitReason::ReturnRoomShort => "ReturnRoomShort",
        }
    }
}

impl std::fmt::Display for WaitReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a node failed: the `reason` of its `switchyard.dev/failure` record and its Warning event.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FailReason {
    /// The drain did not finish within `drain.timeoutSeconds`.
    DrainTimeout,
    /// The node did not switch backends within `verify.timeoutSeconds`.
    SwitchTimeout,
    /// The device plugin advertises GPUs again on a switched node.
    BackendOverlap,
    /// The canary did not succeed within `verify.timeoutSeconds`.
    VerifyTimeout,
    /// The canary pod failed.
    CanaryFailed,
    /// The rollback did not finish in time.
    RollbackTimeout,
}

impl FailReason {
    /// The reason as it reads in status messages, failure records and events.
    pub fn as_str(self) -> &'static str {
        match self {
            FailReason::DrainTimeout => "DrainTimeout",
            FailReason::SwitchTimeout => "SwitchTimeout",
            FailReason::BackendOverlap => "BackendOverlap",
            FailReason::VerifyTimeout => "VerifyTimeout",
            FailReason::CanaryFailed => "CanaryFailed",
            FailReason::RollbackTimeout => "RollbackTimeout",
        }
    }
}

impl std::fmt::Display for FailReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What holds a pool at its safe points.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hold {
    /// `spec.paused` is true.
    Paused,
    /// A node failed and `spec.strategy.onFailure` is Pause.
    NodeFailed,
    /// A gate is closed: PrerequisitesMet, DeviceClassesReady or PlacementReady is False, or a
    /// node is served by both backends. Switching a node then could strand its pods.
    GateClosed,
    /// The migration is being deleted: in-flight nodes finish their step, then are released.
    Deleting,
}

impl Hold {
    /// The wait of a node held at `point` (`cordoned`, `drained`).
    fn wait(self, point: &str) -> Action {
        match self {
            Hold::Paused => wait(WaitReason::Paused, format!("{point}; the migration is paused")),
            Hold::NodeFailed => wait(
                WaitReason::HeldByFailedNode,
                format!("{point}; another node failed and spec.strategy.onFailure is Pause"),
            ),
            Hold::GateClosed => wait(
                WaitReason::GateClosed,
                format!(
                    "{point}; held until the migration's gates hold again (see PrerequisitesMet, DeviceClassesReady, PlacementReady and BackendOverlap)"
                ),
            ),
            Hold::Deleting => wait(WaitReason::Deleting, format!("{point}; the migration is being deleted")),
        }
    }
}

/// What a node of a Replace migration (`spec.strategy.type: Replace`) knows of its target pool.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Replace {
    /// What the target pool lacks for the node's GPU pods (`pool::replace::Shortfall`), when it
    /// does; `None` when they fit, or when the check does not apply to the node's state.
    pub short: Option<String>,
    /// `spec.strategy.replace.evictWithoutCapacity`.
    pub evict_without_capacity: bool,
    /// Rolling back: the return of the pods that left the node.
    pub returning: Option<Returning>,
}

/// What a node of a Replace migration rolling back knows of the return of the pods that left it
/// (`pool::replace::return_plan`, computed for the returning nodes together).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Returning {
    /// The node recorded the pods that left it as its drain started (`switchyard.dev/moved`).
    pub recorded: bool,
    /// Pods of the returning nodes' controllers still to come back from the target pool.
    pub left: usize,
    /// Every target node that holds some of them has its devices fenced.
    pub fenced: bool,
    /// Target pods this node's step evicts now: one returning node's step carries the return's
    /// evictions each reconcile.
    pub evict: usize,
    /// Why pods still to come back are not evicted now: no room on the returning nodes.
    pub room_short: Option<String>,
}

impl Replace {
    /// Whether the node must wait for room before it drains.
    fn waits(&self) -> bool {
        self.short.is_some() && !self.evict_without_capacity
    }

    /// Whether a rollback brings pods back to the node.
    fn returns(&self) -> bool {
        self.returning.as_ref().is_some_and(|r| r.recorded)
    }
}

/// Everything `next_step` looks at for one node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Observed {
    pub state: NodeState,
    /// From `switchyard.dev/state-since`.
    pub since: Option<Timestamp>,
    pub now: Timestamp,
    pub direction: Direction,
    /// The pool plan picked this node to start moving (forward from Pending, or back from
    /// Migrated) this reconcile.
    pub start: bool,
    /// Why nothing new begins, if something holds the pool: a node then only finishes a step it
    /// cannot stop in the middle of (Switching, Verifying, RollingBack) and waits at the next safe
    /// point (cordoned, or drained on the device plugin).
    pub hold: Option<Hold>,
    pub on_failure: FailurePolicy,
    /// The node's recorded failure happened while rolling back.
    pub failed_during_rollback: bool,
    pub unschedulable: bool,
    /// The node's Ready condition is True.
    pub ready: bool,
    pub backend: Backend,
    /// The driver keeps its devices unschedulable while the device plugin still serves the node
    /// (`spec.driver.devicePluginInterlock`): the switch may start it while the plugin leaves.
    /// Without it the switch goes through backend `none` first.
    pub interlock: bool,
    /// Pods of the device plugin's DaemonSet on the node; observed while Switching once
    /// allocatable is 0 (`None`: not read).
    pub device_plugin_pods: Option<usize>,
    /// Only observed while Draining.
    pub drain: DrainCounts,
    /// Sum of the pool resources in `status.allocatable`: what the device plugin advertises.
    pub allocatable: u64,
    /// The device plugin's GPUs on the node, from capacity as well as allocatable: allocatable
    /// drops to 0 for the seconds a plugin pod restarts (a Managed placement rolls the plugin
    /// DaemonSet), capacity stays. Recorded as `gpus-before` when the drain starts.
    pub device_plugin_gpus: u64,
    /// Device-plugin GPUs recorded before the switch (`switchyard.dev/gpus-before`).
    pub gpus_before: Option<u64>,
    /// Devices the driver publishes for the node that the scheduler may allocate (no NoSchedule
    /// or NoExecute taint).
    pub dra_devices: u64,
    /// Of those, the ones the pool's DeviceClasses select, counted per resource up to what the
    /// resource had before the switch (see `selectors::Selected`): the switch is done when this
    /// reaches `gpus_before`.
    pub dra_selected: u64,
    /// What the DeviceClass selectors found short, for the wait message (empty when nothing is).
    pub selection_note: String,
    /// Pods on the node holding devices of the migration's driver; only observed while
    /// RollingBack (`drain` then counts them as a drain would: to evict, blocked, terminating).
    pub claim_holders: usize,
    pub taint_rule_exists: bool,
    /// The rollback's DeviceTaintRule has effect NoExecute: it evicts the holders itself.
    pub taint_rule_evicts: bool,
    /// The controller manager's device-taint-eviction controller evicts pods whose claim is in
    /// `status.extendedResourceClaimStatus`: its version is known and at least v1.37.2
    /// (`prerequisites::taint_eviction_reaches_extended_claims`, kubernetes/kubernetes#141290).
    pub taint_eviction_reliable: bool,
    /// `spec.strategy.drain.rollbackEvictsPastBudgets`.
    pub evict_past_budgets: bool,
    /// `spec.strategy.drain.evictDaemonSetGpuPods`.
    pub evict_daemon_set_gpu_pods: bool,
    pub canary: Canary,
    pub drain_timeout_seconds: i64,
    pub verify_timeout_seconds: i64,
    /// `spec.strategy.type: Replace`: the node drains onto the target pool and never switches.
    pub replace: Option<Replace>,
}

impl Observed {
    /// What the node and the spec say, before any other read: the node's state, its record, its
    /// kubelet and backend, the device plugin's GPUs on it (`allocatable` from
    /// `pool::overlap::allocatable`, `device_plugin_gpus` from `pool::capacity::gpus_to_publish`,
    /// each summed over the pool's resources), and the spec's direction, failure policy,
    /// interlock, drain and timeouts. What the operator reads beside the node (the pool's plan and
    /// hold, pods, slices, the canary, the taint rule, the target pool) is left as nothing read;
    /// its step fills it in. `switchyard plan` asks the state machine about the same node
    /// ([`crate::node::forecast`]).
    pub fn of_node(
        spec: &GpuPoolMigrationSpec,
        pn: &PoolNode,
        now: Timestamp,
        allocatable: u64,
        device_plugin_gpus: u64,
    ) -> Observed {
        let drain = &spec.strategy.drain;
        Observed {
            state: pn.state(),
            since: record::parse_since(pn),
            now,
            direction: spec.direction,
            start: false,
            hold: None,
            on_failure: spec.strategy.on_failure,
            failed_during_rollback: pn.failure().as_ref().is_some_and(Failure::during_rollback),
            unschedulable: pn.unschedulable,
            ready: pn.ready,
            backend: pn.backend(),
            interlock: spec.driver.interlocked(),
            device_plugin_pods: None,
            drain: DrainCounts::default(),
            allocatable,
            device_plugin_gpus,
            gpus_before: record::gpus_before(pn),
            dra_devices: 0,
            dra_selected: 0,
            selection_note: String::new(),
            claim_holders: 0,
            taint_rule_exists: false,
            taint_rule_evicts: false,
            taint_eviction_reliable: false,
            evict_past_budgets: drain.rollback_evicts_past_budgets,
            evict_daemon_set_gpu_pods: drain.evict_daemon_set_gpu_pods,
            canary: Canary::NotConfigured,
            drain_timeout_seconds: drain.timeout_seconds,
            verify_timeout_seconds: spec.strategy.verify.timeout_seconds,
            replace: spec
                .strategy
                .replace()
                .map(|r| Replace { evict_without_capacity: r.evict_without_capacity, ..Replace::default() }),
        }
    }
}

/// The one thing to do for a node now. Each action that changes state names the new state; the
/// controller writes it together with the action's label/cordon change in one node patch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// The node is where the direction wants it.
    Nothing,
    /// Nothing to do until something changes; requeue.
    Wait { reason: WaitReason, message: String },
    /// The node is in a timed state without `state-since` (edited by hand): stamp it now.
    RecordSince,
    /// Cordon, remember whether it was already unschedulable, take ownership; → Cordoned.
    Cordon,
    /// [`Action::Cordon`] and [`Action::StartDrain`] in one write, when the node's GPU count is
    /// known; → Draining.
    CordonAndDrain,
    /// Someone uncordoned a node mid-move: cordon it again, state unchanged.
    Recordon,
    /// Record the device-plugin GPU count; → Draining.
    StartDrain,
    /// Evict the selected pods.
    Evict,
    /// Evict the DaemonSet pods that hold device-plugin GPUs, once the plugin has left
    /// (`evictDaemonSetGpuPods`).
    EvictGpuHolders,
    /// Set `switchyard.dev/gpu-backend=dra`; → Switching.
    SwitchToDra,
    /// Set `switchyard.dev/gpu-backend=none`, so that the device plugin leaves while the driver
    /// does not start yet; → Switching. For drivers without the device-plugin interlock.
    StopDevicePlugin,
    /// The device plugin has left a node in backend `none`: set `switchyard.dev/gpu-backend=dra`
    /// so the driver starts. The node stays Switching, on the same clock.
    StartDriver,
    /// → Verifying.
    StartVerify,
    /// Create the canary pod.
    CreateCanary,
    /// Delete a canary left by an earlier attempt.
    DeleteCanary,
    /// Uncordon unless an admin had cordoned it, remove the canary; → Migrated.
    Complete,
    /// → Failed, recording reason and message.
    Fail { reason: FailReason, message: String },
    /// Cordon if needed; → RollingBack.
    StartRollback,
    /// Create the DeviceTaintRule for the node's DRA devices, NoSchedule: a fence while the
    /// eviction API drains the holders.
    CreateTaintRule,
    /// Turn the rule's effect to NoExecute, so the device-taint-eviction controller evicts the
    /// holders that PodDisruptionBudgets kept (`rollbackEvictsPastBudgets`).
    EscalateTaintRule,
    /// Delete the holders that PodDisruptionBudgets kept, as the device-taint-eviction controller
    /// would (`rollbackEvictsPastBudgets`), where that controller cannot be relied on to
    /// (`Observed::taint_eviction_reliable` is false).
    DeletePastBudgets,
    /// Set `switchyard.dev/gpu-backend=device-plugin`.
    SwitchToDevicePlugin,
    /// Delete the DeviceTaintRule.
    DeleteTaintRule,
    /// Uncordon unless an admin had cordoned it; → RolledBack.
    FinishRollback,
    /// Replace: the node is drained; leave it cordoned and label it `switchyard.dev/replaced`
    /// for removal; → Replaced.
    Retire,
    /// Replace, rolling back a node whose pods left for the target: uncordon it (unless an admin
    /// had cordoned it) so they can come back; → RollingBack.
    StartReturn,
    /// Replace, rolling back: fence the devices of the target nodes that hold pods to come back
    /// (a NoSchedule DeviceTaintRule each), so that an evicted pod lands on the old pool.
    CreateFences,
}

impl Action {
    /// The state the node is in after the action succeeds, when it changes.
    pub fn next_state(&self) -> Option<NodeState> {
        match self {
            Action::Cordon => Some(NodeState::Cordoned),
            Action::StartDrain | Action::CordonAndDrain => Some(NodeState::Draining),
            Action::SwitchToDra | Action::StopDevicePlugin => Some(NodeState::Switching),
            Action::StartVerify => Some(NodeState::Verifying),
            Action::Complete => Some(NodeState::Migrated),
            Action::Fail { .. } => Some(NodeState::Failed),
            Action::StartRollback | Action::StartReturn => Some(NodeState::RollingBack),
            Action::FinishRollback => Some(NodeState::RolledBack),
            Action::Retire => Some(NodeState::Replaced),
            _ => None,
        }
    }
}

/// Seconds since the node entered its state; `None` when the stamp is missing.
pub fn elapsed_seconds(o: &Observed) -> Option<i64> {
    o.since.map(|s| o.now.as_second() - s.as_second())
}

/// The timeout of a timed state. Switching and Verifying each get the verify timeout; a
/// rollback gets both budgets, since it drains claim holders and then waits for the plugin.
pub fn timeout_seconds(o: &Observed) -> Option<i64> {
    match o.state {
        NodeState::Draining => Some(o.drain_timeout_seconds),
        NodeState::Switching | NodeState::Verifying => Some(o.verify_timeout_seconds),
        NodeState::RollingBack => Some(o.drain_timeout_seconds + o.verify_timeout_seconds),
        _ => None,
    }
}

fn timed_out(o: &Observed) -> bool {
    matches!((elapsed_seconds(o), timeout_seconds(o)), (Some(e), Some(t)) if e > t)
}

/// The Switching step, time aside: what moves the node on, or what it waits for.
fn switching(o: &Observed) -> Action {
    if o.backend == Backend::DevicePlugin {
        // Labelled back by someone mid-switch: label it again.
        switch_action(o)
    } else if o.backend == Backend::None {
        // Sequential: the driver starts only once the device plugin is gone, so the
        // scheduler never sees the node's GPUs through both.
        if let Some(late) = undrained(o) {
            late
        } else if o.allocatable > 0 {
            wait(
                WaitReason::DevicePluginStillAdvertising,
                format!(
                    "allocatable is still {}; the driver starts once the device plugin has left",
                    o.allocatable
                ),
            )
        } else if let Some(held) = gpus_held(o, true) {
            held
        } else {
            match o.device_plugin_pods {
                Some(0) => Action::StartDriver,
                Some(n) => wait(
                    WaitReason::DevicePluginPodRunning,
                    format!(
                        "{n} device-plugin pod(s) still on the node; the driver starts once they are gone"
                    ),
                ),
                None => wait(
                    WaitReason::DevicePluginPodRunning,
                    "the node's pods are not read yet; the driver starts once no device-plugin pod is left",
                ),
            }
        }
    } else if let Some(late) = undrained(o) {
        // A pod the scheduler bound before it saw the cordon can land after the drain's
        // last LIST, on a GPU the device plugin handed out and the driver is about to
        // publish. It goes before the switch counts as done.
        late
    } else if o.allocatable > 0 {
        wait(
            WaitReason::DevicePluginStillAdvertising,
            format!("allocatable is still {}; waiting for the device plugin to leave", o.allocatable),
        )
    } else if let Some(held) = gpus_held(o, true) {
        // A GPU a DaemonSet or static pod holds would be published again: not before it goes.
        held
    } else if o.gpus_before.is_none() {
        wait(
            WaitReason::GpuCountUnknown,
            "switchyard.dev/gpus-before is missing or 0, so the switch cannot be verified; set it to the node's GPU count as JSON, for example {\"nvidia.com/gpu\":8}",
        )
    } else if slices_ready(o) && o.canary == Canary::NotConfigured {
        // Nothing left to verify: the checks Verifying makes without a canary (allocatable
        // 0, the devices published) hold now.
        Action::Complete
    } else if !slices_ready(o) {
        let mut message = format!(
            "driver publishes {} device(s), the pool's DeviceClasses select {}, need {}",
            o.dra_devices,
            o.dra_selected,
            o.gpus_before.unwrap_or(0)
        );
        if !o.selection_note.is_empty() {
            message = format!("{message}; {}", o.selection_note);
        }
        wait(WaitReason::WaitingForResourceSlices, message)
    } else {
        Action::StartVerify
    }
}

/// The Switching step past its timeout, while it still waits: the failure and what is missing.
fn switch_timeout(o: &Observed) -> Action {
    let mut message = format!(
        "within {}s the node did not switch: allocatable still {} (device plugin must report 0), DRA devices {}, selected by the pool's DeviceClasses {} (need {})",
        o.verify_timeout_seconds,
        o.allocatable,
        o.dra_devices,
        o.dra_selected,
        o.gpus_before.map_or("the count in switchyard.dev/gpus-before".to_string(), |b| b.to_string())
    );
    if o.backend == Backend::None {
        message.push_str(
                "; the driver never started, so the node goes back to the device plugin (switchyard.dev/gpu-backend=device-plugin)",
            );
    } else if !o.selection_note.is_empty() {
        message = format!("{message}; {}", o.selection_note);
    }
    Action::Fail { reason: FailReason::SwitchTimeout, message }
}

fn wait(reason: WaitReason, message: impl Into<String>) -> Action {
    Action::Wait { reason, message: message.into() }
}

/// Enough DRA devices for the node to count as switched: the pool's DeviceClasses select at
/// least as many as the device plugin had before, per resource. Unknown is never enough.
fn slices_ready(o: &Observed) -> bool {
    o.gpus_before.is_some_and(|b| o.dra_selected > 0 && o.dra_selected >= b)
}

/// The first label of the switch: `dra` for a driver with the interlock, `none` otherwise.
fn switch_action(o: &Observed) -> Action {
    if o.interlock { Action::SwitchToDra } else { Action::StopDevicePlugin }
}

/// What a node does about the pods a drain leaves that hold its device-plugin GPUs (DaemonSet and
/// static pods): the switch never finishes while one is left, or the GPU it holds would be
/// published again. A static pod waits for a person; a DaemonSet's waits too, unless
/// `evictDaemonSetGpuPods`: then it is evicted once the plugin has left (`plugin_gone`), so the
/// DaemonSet's new pod gets its GPU through DRA, and before that the switch goes ahead. `None`
/// when none holds one, or when the switch may go ahead.
fn gpus_held(o: &Observed, plugin_gone: bool) -> Option<Action> {
    let d = &o.drain;
    Some(if d.static_holders > 0 {
        wait(
            WaitReason::GpuHeldByStaticPod,
            format!(
                "{} static pod(s) hold device-plugin GPUs the switch would publish again; remove their manifests from the node, or take the node out of spec.nodeSelector",
                d.static_holders
            ),
        )
    } else if d.daemon_set_holders > 0 && !o.evict_daemon_set_gpu_pods {
        wait(
            WaitReason::GpuHeldByDaemonSetPod,
            format!(
                "{} DaemonSet pod(s) hold device-plugin GPUs the switch would publish again; move their GPU request to DRA, take the node out of spec.nodeSelector, or set spec.strategy.drain.evictDaemonSetGpuPods: true",
                d.daemon_set_holders
            ),
        )
    } else if d.daemon_set_holders > 0 && plugin_gone {
        Action::EvictGpuHolders
    } else {
        return None;
    })
}

/// What a node with selected pods left does: evict them, or wait for what only a person (or the
/// pods' own termination) resolves. `None` once nothing is left.
fn undrained(o: &Observed) -> Option<Action> {
    let d = &o.drain;
    Some(if d.to_evict > 0 {
        Action::Evict
    } else if d.unmanaged > 0 {
        wait(
            WaitReason::UnmanagedPodsBlockDrain,
            format!(
                "{} pod(s) have no controller, so nothing would re-create them after an eviction; re-create them under a controller, delete them, or set spec.strategy.drain.force: true",
                d.unmanaged
            ),
        )
    } else if d.blocked > 0 {
        wait(
            WaitReason::EmptyDirBlocksDrain,
            format!(
                "{} pod(s) use emptyDir volumes; delete them or set spec.strategy.drain.deleteEmptyDirData: true",
                d.blocked
            ),
        )
    } else if d.terminating > 0 {
        wait(WaitReason::PodsTerminating, format!("{} pod(s) still terminating", d.terminating))
    } else {
        return None;
    })
}

/// Cordoned: drain once the device plugin's GPU count shows, unless the pool is held.
fn cordoned(o: &Observed) -> Action {
    if let Some(h) = o.hold {
        h.wait("cordoned")
    } else if !o.unschedulable {
        Action::Cordon
    } else if o.device_plugin_gpus == 0 {
        // The switch is verified against this count; a guess would let a node with one
        // DRA device out of eight pass.
        wait(
            WaitReason::GpuCountUnknown,
            "the device plugin reports no GPUs in this node's capacity or allocatable, and GPU Feature Discovery's nvidia.com/gpu.count label is absent or the migration maps no single full-GPU resource it would count; waiting until one of them says, since the switch is verified against that count",
        )
    } else {
        Action::StartDrain
    }
}

/// Replace, Cordoned: drain once the target pool has room for the node's GPU pods.
fn replace_cordoned(o: &Observed, r: &Replace) -> Action {
    if let Some(h) = o.hold {
        h.wait("cordoned")
    } else if !o.unschedulable {
        Action::Cordon
    } else if r.waits() {
        wait(WaitReason::TargetCapacityShort, r.short.clone().unwrap_or_default())
    } else {
        Action::StartDrain
    }
}

/// Draining: evict or wait until the drain is done, then switch (or, replacing the node, retire
/// it: nothing is left to switch, so a hold does not keep it); fail at the drain timeout.
fn draining(o: &Observed) -> Action {
    // A finished drain is never late: the timeout is for the drain, not for a pause.
    let Some(undrained) = undrained(o) else {
        return if o.replace.is_some() {
            Action::Retire
        } else if let Some(h) = o.hold {
            h.wait("drained, before the switch")
        } else if let Some(held) = gpus_held(o, false) {
            held
        } else {
            switch_action(o)
        };
    };
    if timed_out(o) {
        return Action::Fail {
            reason: FailReason::DrainTimeout,
            message: format!(
                "drain did not finish within {}s: {} pod(s) left to evict, {} without a controller, {} blocked by emptyDir, {} terminating",
                o.drain_timeout_seconds,
                o.drain.to_evict,
                o.drain.unmanaged,
                o.drain.blocked,
                o.drain.terminating
            ),
        };
    }
    // Replace: a pod is evicted only when the target has room for it; the drain's clock runs on.
    match &o.replace {
        Some(r) if r.waits() && undrained == Action::Evict => {
            wait(WaitReason::TargetCapacityShort, r.short.clone().unwrap_or_default())
        }
        _ => undrained,
    }
}

/// Verifying: no device-plugin GPU may come back; the canary, where configured, must succeed.
fn verifying(o: &Observed) -> Action {
    if o.allocatable > 0 {
        return Action::Fail {
            reason: FailReason::BackendOverlap,
            message: format!(
                "the node advertises {} device-plugin GPU(s) again while the driver publishes {}; check that the device plugin DaemonSet avoids switchyard.dev/gpu-backend=dra",
                o.allocatable, o.dra_devices
            ),
        };
    }
    // A canary that succeeded is a pass even when this reconcile sees it after the
    // timeout: the operator learns of it on its next reconcile, not when it happened.
    if matches!(o.canary, Canary::NotConfigured | Canary::Succeeded) {
        return Action::Complete;
    }
    // (A node Verifying without a canary is one that entered it before Switching could
    // complete directly; it completes above.)
    if timed_out(o) {
        let why = match &o.canary {
            Canary::CannotStart(m) => format!(": {m}"),
            _ => String::new(),
        };
        return Action::Fail {
            reason: FailReason::VerifyTimeout,
            message: format!("the canary did not succeed within {}s{why}", o.verify_timeout_seconds),
        };
    }
    match &o.canary {
        Canary::NotConfigured | Canary::Succeeded => Action::Complete,
        Canary::Absent => Action::CreateCanary,
        Canary::Stale => Action::DeleteCanary,
        Canary::Running => wait(WaitReason::CanaryRunning, "waiting for the canary pod"),
        Canary::CannotStart(m) => wait(WaitReason::CanaryCannotStart, m.clone()),
        Canary::Failed(m) => Action::Fail { reason: FailReason::CanaryFailed, message: m.clone() },
    }
}

/// Failed: a person looks, or the node rolls back when the direction or `onFailure` says so.
fn failed(o: &Observed) -> Action {
    let rollback = o.direction == Direction::Rollback;
    let roll = (rollback || o.on_failure == FailurePolicy::Rollback) && !o.failed_during_rollback;
    if !roll {
        wait(WaitReason::NeedsHuman, "the node failed; see status.failed and its events")
    } else if o.replace.as_ref().is_some_and(Replace::returns) {
        // A Replace drain that timed out had moved some pods: they come back.
        Action::StartReturn
    } else if o.backend != Backend::DevicePlugin || o.taint_rule_exists {
        Action::StartRollback
    } else {
        // Failed before the switch: the device plugin never left.
        Action::FinishRollback
    }
}

/// RollingBack: fence the node's DRA devices with a NoSchedule rule, drain the pods that hold
/// them through the eviction API (PodDisruptionBudgets honoured, as forward), hand the node back
/// to the device plugin, and wait until the driver has left. Past the drain timeout with holders
/// left, the rule turns NoExecute if the spec allows it, or the node fails; it fails at the drain
/// and verify timeouts together in any case.
fn rolling_back(o: &Observed) -> Action {
    if timed_out(o) {
        return Action::Fail {
            reason: FailReason::RollbackTimeout,
            message: format!(
                "rollback did not finish within {}s: {} pod(s) still hold the driver's devices, allocatable {}",
                o.drain_timeout_seconds + o.verify_timeout_seconds,
                o.claim_holders,
                o.allocatable
            ),
        };
    }
    let drain_over = elapsed_seconds(o).is_some_and(|e| e > o.drain_timeout_seconds);
    if !o.unschedulable {
        Action::StartRollback
    } else if o.backend == Backend::Dra && !o.taint_rule_exists {
        Action::CreateTaintRule
    } else if o.claim_holders > 0 && drain_over && !o.taint_rule_evicts {
        if o.evict_past_budgets && o.taint_eviction_reliable {
            Action::EscalateTaintRule
        } else if o.evict_past_budgets {
            // The controller would miss the pods with a generated claim: delete them as it would.
            if o.claim_holders > o.drain.terminating {
                Action::DeletePastBudgets
            } else {
                wait(WaitReason::PodsTerminating, format!("{} pod(s) still terminating", o.drain.terminating))
            }
        } else {
            let daemon_set = match o.drain.daemon_set_holders {
                0 => String::new(),
                n if o.evict_daemon_set_gpu_pods => format!(" ({n} of them DaemonSet pods)"),
                n => format!(
                    " ({n} of them DaemonSet pods, which spec.strategy.drain.evictDaemonSetGpuPods would evict)"
                ),
            };
            Action::Fail {
                reason: FailReason::RollbackTimeout,
                message: format!(
                    "within spec.strategy.drain.timeoutSeconds ({}s) {} pod(s) holding the driver's devices could not be evicted{daemon_set} (see the node's EvictionBlocked events); the node keeps them. Let their PodDisruptionBudgets allow it, or set spec.strategy.drain.rollbackEvictsPastBudgets: true to evict them with a NoExecute DeviceTaintRule",
                    o.drain_timeout_seconds, o.claim_holders
                ),
            }
        }
    } else if o.claim_holders > 0 {
        match undrained(o) {
            // The rule evicts what is left once it is NoExecute; the eviction API does before.
            Some(Action::Evict) if o.taint_rule_evicts => wait(
                WaitReason::EvictingClaimHolders,
                format!("{} pod(s) still hold the driver's devices on the node", o.claim_holders),
            ),
            Some(action) => action,
            // A drain leaves DaemonSet pods; these hold devices the device plugin is about to
            // serve again, so they go as forward (`gpus_held`): evicted when the spec says so,
            // their new pods waiting for the device plugin, or named for a person.
            None if o.drain.daemon_set_holders > 0 && !o.taint_rule_evicts => {
                if o.evict_daemon_set_gpu_pods {
                    Action::EvictGpuHolders
                } else {
                    wait(
                        WaitReason::GpuHeldByDaemonSetPod,
                        format!(
                            "{} DaemonSet pod(s) hold the driver's devices, which the device plugin would serve again; set spec.strategy.drain.evictDaemonSetGpuPods: true (their new pods get GPUs from the device plugin), delete them, or set spec.strategy.drain.rollbackEvictsPastBudgets: true to evict them after spec.strategy.drain.timeoutSeconds",
                            o.drain.daemon_set_holders
                        ),
                    )
                }
            }
            None => wait(
                WaitReason::EvictingClaimHolders,
                format!("{} pod(s) still hold the driver's devices on the node", o.claim_holders),
            ),
        }
    } else if o.backend != Backend::DevicePlugin {
        // From `dra`, or from `none` (a sequential switch that never started the driver).
        Action::SwitchToDevicePlugin
    } else if o.allocatable == 0 {
        wait(WaitReason::WaitingForDevicePlugin, "waiting for the device plugin to advertise the GPUs again")
    } else if o.taint_rule_exists && o.dra_devices > 0 {
        // The rule is what keeps the scheduler off the DRA devices now that the device
        // plugin serves the node again; it goes only once the driver has withdrawn them.
        wait(
            WaitReason::WaitingForDriverToLeave,
            format!(
                "{} DRA device(s) still published without a taint; waiting for the driver to leave",
                o.dra_devices
            ),
        )
    } else if o.taint_rule_exists {
        Action::DeleteTaintRule
    } else {
        Action::FinishRollback
    }
}

/// RollingBack under Replace: the node is uncordoned; fence the target nodes that hold pods to
/// come back, evict those pods through the eviction API (PodDisruptionBudgets honoured) as far as
/// the returning nodes have room, and finish once none is left to come back. It fails at the
/// drain and verify timeouts together; the pods left keep running on the target.
fn returning(o: &Observed, r: &Returning) -> Action {
    if r.left == 0 {
        return Action::FinishRollback;
    }
    if timed_out(o) {
        return Action::Fail {
            reason: FailReason::RollbackTimeout,
            message: format!(
                "within {}s {} pod(s) that had left the node did not come back from the target pool (see the node's EvictionBlocked events); they keep running there. Let their PodDisruptionBudgets allow it, make room on the old nodes, or delete the pods",
                o.drain_timeout_seconds + o.verify_timeout_seconds,
                r.left
            ),
        };
    }
    if !r.fenced {
        Action::CreateFences
    } else if r.evict > 0 {
        Action::Evict
    } else if let Some(short) = &r.room_short {
        wait(WaitReason::ReturnRoomShort, short.clone())
    } else {
        wait(WaitReason::PodsReturning, format!("{} pod(s) still to come back from the target pool", r.left))
    }
}

/// The next step for one node.
pub fn next_step(o: &Observed) -> Action {
    use NodeState::*;
    if timeout_seconds(o).is_some() && o.since.is_none() {
        return Action::RecordSince;
    }
    let rollback = o.direction == Direction::Rollback;
    // Uncordoned by someone mid-move: new pods would land on a node that is about to lose its
    // backend. Cordon again first, whatever else is due. (A rollback re-cordons through
    // StartRollback.)
    if matches!(o.state, Draining | Switching | Verifying) && !o.unschedulable && !rollback {
        return Action::Recordon;
    }
    // A NotReady kubelet can neither finish evictions nor start a plugin: a timeout now would
    // blame the drain or the switch. Wait for it; the step's clock keeps running.
    if matches!(o.state, Draining | Switching | Verifying | RollingBack) && !o.ready {
        return wait(
            WaitReason::NodeNotReady,
            format!("the kubelet reports NotReady; the {:?} step resumes when it is Ready", o.state),
        );
    }
    match o.state {
        Pending | RolledBack if rollback => Action::Nothing,
        Pending | RolledBack => {
            if !o.start || o.hold.is_some() {
                Action::Nothing
            } else if let Some(r) = &o.replace {
                // Cordoned first either way: no new GPU pod lands on a node about to empty.
                if r.waits() { Action::Cordon } else { Action::CordonAndDrain }
            } else if o.device_plugin_gpus == 0 {
                // Cordoned, it waits there until the count the switch is verified against shows.
                Action::Cordon
            } else {
                Action::CordonAndDrain
            }
        }
        // Replace: pods left the node; they come back from the target.
        Draining if rollback && o.replace.as_ref().is_some_and(Replace::returns) => Action::StartReturn,
        // Never switched: going back is just letting the node schedule again.
        Cordoned | Draining if rollback => Action::FinishRollback,
        Cordoned => match &o.replace {
            Some(r) => replace_cordoned(o, r),
            None => cordoned(o),
        },
        Draining => draining(o),
        Switching | Verifying if rollback => Action::StartRollback,
        Switching => {
            let next = switching(o);
            // A finished switch is never late: the timeout is for a node that does not switch,
            // not for a reconcile that sees the switch done after it (a loaded API server,
            // hundreds of nodes in flight). Anything short of done fails at the timeout.
            let done = matches!(next, Action::Complete | Action::StartVerify);
            if timed_out(o) && !done { switch_timeout(o) } else { next }
        }
        Verifying => verifying(o),
        Migrated => {
            if rollback && o.start && o.hold.is_none() {
                Action::StartRollback
            } else {
                Action::Nothing
            }
        }
        // Drained onto the target: going back is letting it schedule again, and bringing its pods
        // back while the target stands.
        Replaced if rollback && o.start && o.hold.is_none() => {
            if o.replace.as_ref().is_some_and(Replace::returns) {
                Action::StartReturn
            } else {
                Action::FinishRollback
            }
        }
        Replaced => Action::Nothing,
        Failed => failed(o),
        // Replace: nothing switched; without a return to make (a deletion finishing its nodes),
        // the node is done.
        RollingBack => match &o.replace {
            Some(r) => returning(o, &r.returning.clone().unwrap_or_default()),
            None => rolling_back(o),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_verify_timeout_says_why_the_canary_could_not_start() {
        let mut o = base(NodeState::Verifying);
        o.canary = Canary::CannotStart("CreateContainerConfigError: endpoint not found".into());
        o.now = Timestamp::from_second(1_301).unwrap();
        let Action::Fail { reason, message } = next_step(&o) else { panic!("{:?}", next_step(&o)) };
        assert_eq!(reason, FailReason::VerifyTimeout);
        assert!(message.ends_with(": CreateContainerConfigError: endpoint not found"), "{message}");
    }

    fn base(state: NodeState) -> Observed {
        Observed {
            state,
            since: Some(Timestamp::from_second(1_000).unwrap()),
            now: Timestamp::from_second(1_010).unwrap(),
            direction: Direction::Forward,
            start: false,
            hold: None,
            on_failure: FailurePolicy::Pause,
            failed_during_rollback: false,
            unschedulable: true,
            ready: true,
            backend: Backend::DevicePlugin,
            interlock: true,
            device_plugin_pods: None,
            drain: DrainCounts::default(),
            allocatable: 0,
            device_plugin_gpus: 8,
            gpus_before: Some(8),
            dra_devices: 0,
            dra_selected: 0,
            selection_note: String::new(),
            claim_holders: 0,
            taint_rule_exists: false,
            taint_rule_evicts: false,
            taint_eviction_reliable: true,
            evict_past_budgets: false,
            evict_daemon_set_gpu_pods: false,
            canary: Canary::NotConfigured,
            drain_timeout_seconds: 600,
            verify_timeout_seconds: 300,
            replace: None,
        }
    }

    fn kind(a: &Action) -> String {
        match a {
            Action::Wait { reason, .. } => format!("Wait:{reason}"),
            Action::Fail { reason, .. } => format!("Fail:{reason}"),
            other => format!("{other:?}"),
        }
    }

    #[test]
    fn replace_transitions_table() {
        use NodeState::*;
        type Edit = fn(&mut Observed);
        /// Rolling back, with a return of `left` pods (recorded), fenced or not, evicting `evict`.
        fn back(o: &mut Observed, left: usize, fenced: bool, evict: usize) {
            o.direction = Direction::Rollback;
            o.unschedulable = false;
            let returning = Returning { recorded: true, left, fenced, evict, room_short: None };
            o.replace = Some(Replace { returning: Some(returning), ..Replace::default() });
        }
        fn short(o: &mut Observed) {
            o.replace = Some(Replace {
                short: Some("2 nvidia.com/gpu missing".into()),
                evict_without_capacity: false,
                returning: None,
            });
        }
        // (name, state, edit, expected action); every case replaces the node.
        let cases: Vec<(&str, NodeState, Edit, &str)> = vec![
            ("pending picked, room on the target", Pending, |o| o.start = true, "CordonAndDrain"),
            (
                "pending picked, no room: cordoned, to wait",
                Pending,
                |o| {
                    o.start = true;
                    short(o)
                },
                "Cordon",
            ),
            (
                "pending picked, no room, but the spec drains anyway",
                Pending,
                |o| {
                    o.start = true;
                    o.replace = Some(Replace {
                        short: Some("x".into()),
                        evict_without_capacity: true,
                        returning: None,
                    })
                },
                "CordonAndDrain",
            ),
            (
                "pending picked, its device-plugin GPU count unknown: nothing is verified against it",
                Pending,
                |o| {
                    o.start = true;
                    o.device_plugin_gpus = 0
                },
                "CordonAndDrain",
            ),
            (
                "pending picked while paused",
                Pending,
                |o| {
                    o.start = true;
                    o.hold = Some(Hold::Paused)
                },
                "Nothing",
            ),
            ("cordoned, no room", Cordoned, short, "Wait:TargetCapacityShort"),
            ("cordoned, room", Cordoned, |_| {}, "StartDrain"),
            ("cordoned, paused", Cordoned, |o| o.hold = Some(Hold::Paused), "Wait:Paused"),
            ("cordoned, uncordoned by someone", Cordoned, |o| o.unschedulable = false, "Cordon"),
            ("draining with pods", Draining, |o| o.drain.to_evict = 2, "Evict"),
            ("draining, a PDB holds the last pod", Draining, |o| o.drain.to_evict = 1, "Evict"),
            (
                "draining, the target's room taken meanwhile: no eviction",
                Draining,
                |o| {
                    o.drain.to_evict = 1;
                    short(o)
                },
                "Wait:TargetCapacityShort",
            ),
            (
                "draining, no room, but the spec drains anyway",
                Draining,
                |o| {
                    o.drain.to_evict = 1;
                    o.replace = Some(Replace {
                        short: Some("x".into()),
                        evict_without_capacity: true,
                        returning: None,
                    })
                },
                "Evict",
            ),
            (
                "draining, no room, past the drain timeout",
                Draining,
                |o| {
                    o.drain.to_evict = 1;
                    short(o);
                    o.since = Some(Timestamp::from_second(0).unwrap())
                },
                "Fail:DrainTimeout",
            ),
            (
                "draining, no room, only terminating pods left: nothing to evict",
                Draining,
                |o| {
                    o.drain.terminating = 1;
                    short(o)
                },
                "Wait:PodsTerminating",
            ),
            (
                "draining past the timeout",
                Draining,
                |o| {
                    o.drain.to_evict = 1;
                    o.since = Some(Timestamp::from_second(0).unwrap())
                },
                "Fail:DrainTimeout",
            ),
            ("draining, a bare pod", Draining, |o| o.drain.unmanaged = 1, "Wait:UnmanagedPodsBlockDrain"),
            ("draining, an emptyDir pod", Draining, |o| o.drain.blocked = 1, "Wait:EmptyDirBlocksDrain"),
            ("draining, uncordoned by someone", Draining, |o| o.unschedulable = false, "Recordon"),
            ("draining on a NotReady node", Draining, |o| o.ready = false, "Wait:NodeNotReady"),
            ("drained", Draining, |_| {}, "Retire"),
            (
                "drained while paused: nothing left to stop at",
                Draining,
                |o| o.hold = Some(Hold::Paused),
                "Retire",
            ),
            (
                "drained, a DaemonSet pod holds a GPU: it stays, as kubectl drain leaves it",
                Draining,
                |o| o.drain.daemon_set_holders = 1,
                "Retire",
            ),
            ("replaced", Replaced, |_| {}, "Nothing"),
            (
                "replaced, rolling back, not picked",
                Replaced,
                |o| o.direction = Direction::Rollback,
                "Nothing",
            ),
            (
                "replaced, rolling back, picked",
                Replaced,
                |o| {
                    o.direction = Direction::Rollback;
                    o.start = true
                },
                "FinishRollback",
            ),
            (
                "replaced, rolling back, picked, pods left it: uncordoned so they come back",
                Replaced,
                |o| {
                    back(o, 2, false, 0);
                    o.unschedulable = true;
                    o.start = true
                },
                "StartReturn",
            ),
            (
                "replaced, rolling back, picked while paused",
                Replaced,
                |o| {
                    back(o, 2, false, 0);
                    o.start = true;
                    o.hold = Some(Hold::Paused)
                },
                "Nothing",
            ),
            ("cordoned, rolling back", Cordoned, |o| o.direction = Direction::Rollback, "FinishRollback"),
            ("draining, rolling back", Draining, |o| o.direction = Direction::Rollback, "FinishRollback"),
            (
                "draining, rolling back, some pods had left",
                Draining,
                |o| {
                    back(o, 1, false, 0);
                    o.drain.to_evict = 1
                },
                "StartReturn",
            ),
            ("returning: the target is fenced first", RollingBack, |o| back(o, 2, false, 0), "CreateFences"),
            ("returning, fenced: this step evicts", RollingBack, |o| back(o, 2, true, 2), "Evict"),
            (
                "returning, fenced: another returning node's step evicts",
                RollingBack,
                |o| back(o, 2, true, 0),
                "Wait:PodsReturning",
            ),
            (
                "returning, no room on the old nodes",
                RollingBack,
                |o| {
                    back(o, 2, true, 0);
                    if let Some(r) = o.replace.as_mut().and_then(|r| r.returning.as_mut()) {
                        r.room_short = Some("no room".into());
                    }
                },
                "Wait:ReturnRoomShort",
            ),
            ("returning, all back", RollingBack, |o| back(o, 0, true, 0), "FinishRollback"),
            (
                "returning past the timeout: the pods left keep running on the target",
                RollingBack,
                |o| {
                    back(o, 1, true, 1);
                    o.since = Some(Timestamp::from_second(0).unwrap())
                },
                "Fail:RollbackTimeout",
            ),
            (
                "returning, all back past the timeout: done, not failed",
                RollingBack,
                |o| {
                    back(o, 0, true, 0);
                    o.since = Some(Timestamp::from_second(0).unwrap())
                },
                "FinishRollback",
            ),
            (
                "returning on a NotReady node: nothing lands there",
                RollingBack,
                |o| {
                    back(o, 2, true, 2);
                    o.ready = false
                },
                "Wait:NodeNotReady",
            ),
            (
                "rolling back while the migration is deleted: nothing to bring back",
                RollingBack,
                |o| {
                    o.hold = Some(Hold::Deleting);
                    o.unschedulable = false
                },
                "FinishRollback",
            ),
            (
                "failed (drain timeout) after pods left, onFailure Rollback: they come back",
                Failed,
                |o| {
                    back(o, 1, false, 0);
                    o.direction = Direction::Forward;
                    o.on_failure = FailurePolicy::Rollback
                },
                "StartReturn",
            ),
            (
                "failed (drain timeout), onFailure Rollback: uncordoned",
                Failed,
                |o| o.on_failure = FailurePolicy::Rollback,
                "FinishRollback",
            ),
            ("failed, onFailure Pause", Failed, |_| {}, "Wait:NeedsHuman"),
        ];
        for (name, state, edit, want) in cases {
            let mut o = base(state);
            o.replace = Some(Replace::default());
            edit(&mut o);
            assert_eq!(kind(&next_step(&o)), want, "{name}");
        }
        let mut o = base(Cordoned);
        short(&mut o);
        match next_step(&o) {
            Action::Wait { message, .. } => assert_eq!(message, "2 nvidia.com/gpu missing"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn transitions_table() {
        use NodeState::*;
        type Edit = fn(&mut Observed);
        // (name, state, edit, expected action)
        let cases: Vec<(&str, NodeState, Edit, &str)> = vec![
            // Forward
            ("pending not picked", Pending, |o| o.unschedulable = false, "Nothing"),
            ("pending picked", Pending, |o| o.start = true, "CordonAndDrain"),
            (
                "pending picked, its GPU count unknown: cordoned only",
                Pending,
                |o| {
                    o.start = true;
                    o.device_plugin_gpus = 0
                },
                "Cordon",
            ),
            (
                "pending picked but paused",
                Pending,
                |o| {
                    o.start = true;
                    o.hold = Some(Hold::Paused)
                },
                "Nothing",
            ),
            ("cordoned", Cordoned, |_| {}, "StartDrain"),
            ("cordoned, uncordoned by someone", Cordoned, |o| o.unschedulable = false, "Cordon"),
            ("cordoned while paused", Cordoned, |o| o.hold = Some(Hold::Paused), "Wait:Paused"),
            ("draining with pods", Draining, |o| o.drain.to_evict = 2, "Evict"),
            ("draining, uncordoned by someone", Draining, |o| o.unschedulable = false, "Recordon"),
            (
                "switching, uncordoned by someone",
                Switching,
                |o| {
                    o.unschedulable = false;
                    o.backend = Backend::Dra
                },
                "Recordon",
            ),
            ("verifying, uncordoned by someone", Verifying, |o| o.unschedulable = false, "Recordon"),
            ("draining on a NotReady node", Draining, |o| o.ready = false, "Wait:NodeNotReady"),
            (
                "switching on a NotReady node, past the timeout: no misleading failure",
                Switching,
                |o| {
                    o.ready = false;
                    o.since = Some(Timestamp::from_second(0).unwrap())
                },
                "Wait:NodeNotReady",
            ),
            (
                "drained, a DaemonSet pod holds a device-plugin GPU",
                Draining,
                |o| o.drain.daemon_set_holders = 1,
                "Wait:GpuHeldByDaemonSetPod",
            ),
            (
                "drained, a static pod holds one: whatever the spec says",
                Draining,
                |o| {
                    o.drain.static_holders = 1;
                    o.evict_daemon_set_gpu_pods = true
                },
                "Wait:GpuHeldByStaticPod",
            ),
            (
                "drained, the spec evicts DaemonSet holders: the switch goes ahead",
                Draining,
                |o| {
                    o.drain.daemon_set_holders = 1;
                    o.evict_daemon_set_gpu_pods = true
                },
                "SwitchToDra",
            ),
            (
                "switching, the plugin gone, a DaemonSet pod still holds a GPU: evicted now",
                Switching,
                |o| {
                    o.backend = Backend::Dra;
                    o.drain.daemon_set_holders = 1;
                    o.evict_daemon_set_gpu_pods = true;
                    o.dra_devices = 8;
                    o.dra_selected = 8
                },
                "EvictGpuHolders",
            ),
            (
                "switching, a late DaemonSet pod holds a GPU: never completes while it does",
                Switching,
                |o| {
                    o.backend = Backend::Dra;
                    o.drain.daemon_set_holders = 1;
                    o.dra_devices = 8;
                    o.dra_selected = 8
                },
                "Wait:GpuHeldByDaemonSetPod",
            ),
            (
                "switching in sequence: the driver does not start while one holds a GPU",
                Switching,
                |o| {
                    o.backend = Backend::None;
                    o.interlock = false;
                    o.drain.daemon_set_holders = 1;
                    o.device_plugin_pods = Some(0)
                },
                "Wait:GpuHeldByDaemonSetPod",
            ),
            ("draining emptyDir", Draining, |o| o.drain.blocked = 1, "Wait:EmptyDirBlocksDrain"),
            ("draining a bare pod", Draining, |o| o.drain.unmanaged = 1, "Wait:UnmanagedPodsBlockDrain"),
            (
                "draining a bare pod evicts the others first",
                Draining,
                |o| {
                    o.drain.unmanaged = 1;
                    o.drain.to_evict = 1
                },
                "Evict",
            ),
            ("draining terminating", Draining, |o| o.drain.terminating = 1, "Wait:PodsTerminating"),
            ("drained", Draining, |_| {}, "SwitchToDra"),
            ("drained but paused", Draining, |o| o.hold = Some(Hold::Paused), "Wait:Paused"),
            ("drained, a gate closed", Draining, |o| o.hold = Some(Hold::GateClosed), "Wait:GateClosed"),
            (
                "cordoned, another node failed",
                Cordoned,
                |o| o.hold = Some(Hold::NodeFailed),
                "Wait:HeldByFailedNode",
            ),
            (
                "switching, a gate closed: the switch finishes",
                Switching,
                |o| {
                    o.canary = Canary::Absent;
                    o.hold = Some(Hold::GateClosed);
                    o.backend = Backend::Dra;
                    o.allocatable = 0;
                    o.dra_devices = 8;
                    o.dra_selected = 8
                },
                "StartVerify",
            ),
            (
                "drained and paused past the drain timeout",
                Draining,
                |o| {
                    o.hold = Some(Hold::Paused);
                    o.now = Timestamp::from_second(5_000).unwrap()
                },
                "Wait:Paused",
            ),
            (
                "drained, resumed after a pause longer than the drain timeout",
                Draining,
                |o| o.now = Timestamp::from_second(5_000).unwrap(),
                "SwitchToDra",
            ),
            (
                "drain timeout",
                Draining,
                |o| {
                    o.drain.to_evict = 1;
                    o.now = Timestamp::from_second(1_601).unwrap()
                },
                "Fail:DrainTimeout",
            ),
            (
                "drain exactly at timeout",
                Draining,
                |o| {
                    o.drain.to_evict = 1;
                    o.now = Timestamp::from_second(1_600).unwrap()
                },
                "Evict",
            ),
            ("switching label missing", Switching, |_| {}, "SwitchToDra"),
            (
                "switching plugin still there",
                Switching,
                |o| {
                    o.backend = Backend::Dra;
                    o.allocatable = 8
                },
                "Wait:DevicePluginStillAdvertising",
            ),
            ("switching no slices", Switching, |o| o.backend = Backend::Dra, "Wait:WaitingForResourceSlices"),
            (
                "switching too few devices",
                Switching,
                |o| {
                    o.backend = Backend::Dra;
                    o.dra_devices = 4;
                    o.dra_selected = 4
                },
                "Wait:WaitingForResourceSlices",
            ),
            (
                "switched",
                Switching,
                |o| {
                    o.canary = Canary::Absent;
                    o.backend = Backend::Dra;
                    o.dra_devices = 8;
                    o.dra_selected = 8
                },
                "StartVerify",
            ),
            (
                "switched, but a device-plugin pod landed after the drain",
                Switching,
                |o| {
                    o.backend = Backend::Dra;
                    o.dra_devices = 8;
                    o.dra_selected = 8;
                    o.drain.to_evict = 1
                },
                "Evict",
            ),
            (
                "switched, a late pod still terminating",
                Switching,
                |o| {
                    o.backend = Backend::Dra;
                    o.dra_devices = 8;
                    o.dra_selected = 8;
                    o.drain.terminating = 1
                },
                "Wait:PodsTerminating",
            ),
            (
                "switched, count unknown: never a guess",
                Switching,
                |o| {
                    o.backend = Backend::Dra;
                    o.dra_devices = 1;
                    o.gpus_before = None
                },
                "Wait:GpuCountUnknown",
            ),
            (
                "cordoned while the plugin reports no GPUs",
                Cordoned,
                |o| o.device_plugin_gpus = 0,
                "Wait:GpuCountUnknown",
            ),
            (
                "switched while paused still finishes",
                Switching,
                |o| {
                    o.canary = Canary::Absent;
                    o.backend = Backend::Dra;
                    o.dra_devices = 8;
                    o.dra_selected = 8;
                    o.hold = Some(Hold::Paused)
                },
                "StartVerify",
            ),
            (
                "switch timeout",
                Switching,
                |o| {
                    o.backend = Backend::Dra;
                    o.now = Timestamp::from_second(1_301).unwrap()
                },
                "Fail:SwitchTimeout",
            ),
            (
                "a switch seen done after its timeout completes",
                Switching,
                |o| {
                    o.backend = Backend::Dra;
                    o.dra_devices = 8;
                    o.dra_selected = 8;
                    o.now = Timestamp::from_second(1_301).unwrap()
                },
                "Complete",
            ),
            (
                "a switch seen done after its timeout still verifies its canary",
                Switching,
                |o| {
                    o.canary = Canary::Absent;
                    o.backend = Backend::Dra;
                    o.dra_devices = 8;
                    o.dra_selected = 8;
                    o.now = Timestamp::from_second(1_301).unwrap()
                },
                "StartVerify",
            ),
            (
                "a late pod at the timeout fails the switch",
                Switching,
                |o| {
                    o.backend = Backend::Dra;
                    o.dra_devices = 8;
                    o.dra_selected = 8;
                    o.drain.to_evict = 1;
                    o.now = Timestamp::from_second(1_301).unwrap()
                },
                "Fail:SwitchTimeout",
            ),
            (
                "verify no canary",
                Verifying,
                |o| {
                    o.backend = Backend::Dra;
                    o.dra_devices = 8;
                    o.dra_selected = 8
                },
                "Complete",
            ),
            ("verify canary absent", Verifying, |o| o.canary = Canary::Absent, "CreateCanary"),
            ("verify with a stale canary", Verifying, |o| o.canary = Canary::Stale, "DeleteCanary"),
            ("verify canary running", Verifying, |o| o.canary = Canary::Running, "Wait:CanaryRunning"),
            (
                "verify canary that cannot start",
                Verifying,
                |o| o.canary = Canary::CannotStart("CreateContainerConfigError".into()),
                "Wait:CanaryCannotStart",
            ),
            ("verify canary ok", Verifying, |o| o.canary = Canary::Succeeded, "Complete"),
            (
                "verify canary failed",
                Verifying,
                |o| o.canary = Canary::Failed("exit 1".into()),
                "Fail:CanaryFailed",
            ),
            (
                "verify overlap",
                Verifying,
                |o| {
                    o.allocatable = 8;
                    o.dra_devices = 8;
                    o.dra_selected = 8
                },
                "Fail:BackendOverlap",
            ),
            (
                "verify timeout",
                Verifying,
                |o| {
                    o.canary = Canary::Running;
                    o.now = Timestamp::from_second(1_301).unwrap()
                },
                "Fail:VerifyTimeout",
            ),
            (
                "a canary seen succeeded after the timeout still passes",
                Verifying,
                |o| {
                    o.canary = Canary::Succeeded;
                    o.now = Timestamp::from_second(1_301).unwrap()
                },
                "Complete",
            ),
            (
                "no canary, past the timeout: nothing left to wait for",
                Verifying,
                |o| o.now = Timestamp::from_second(1_301).unwrap(),
                "Complete",
            ),
            ("migrated", Migrated, |o| o.unschedulable = false, "Nothing"),
            ("failed, pause", Failed, |_| {}, "Wait:NeedsHuman"),
            (
                "failed, rollback policy, switched",
                Failed,
                |o| {
                    o.on_failure = FailurePolicy::Rollback;
                    o.backend = Backend::Dra
                },
                "StartRollback",
            ),
            (
                "failed, rollback policy, not switched",
                Failed,
                |o| o.on_failure = FailurePolicy::Rollback,
                "FinishRollback",
            ),
            (
                "failed during rollback",
                Failed,
                |o| {
                    o.on_failure = FailurePolicy::Rollback;
                    o.failed_during_rollback = true
                },
                "Wait:NeedsHuman",
            ),
            ("missing since", Draining, |o| o.since = None, "RecordSince"),
            // Rollback direction
            (
                "rb pending",
                Pending,
                |o| {
                    o.direction = Direction::Rollback;
                    o.start = true
                },
                "Nothing",
            ),
            ("rb cordoned", Cordoned, |o| o.direction = Direction::Rollback, "FinishRollback"),
            ("rb draining", Draining, |o| o.direction = Direction::Rollback, "FinishRollback"),
            ("rb switching", Switching, |o| o.direction = Direction::Rollback, "StartRollback"),
            ("rb migrated not picked", Migrated, |o| o.direction = Direction::Rollback, "Nothing"),
            (
                "rb migrated picked",
                Migrated,
                |o| {
                    o.direction = Direction::Rollback;
                    o.start = true
                },
                "StartRollback",
            ),
            (
                "rb migrated picked but paused",
                Migrated,
                |o| {
                    o.direction = Direction::Rollback;
                    o.start = true;
                    o.hold = Some(Hold::Paused)
                },
                "Nothing",
            ),
            (
                "rb failed forward",
                Failed,
                |o| {
                    o.direction = Direction::Rollback;
                    o.backend = Backend::Dra
                },
                "StartRollback",
            ),
            (
                "rolling back, uncordoned",
                RollingBack,
                |o| {
                    o.backend = Backend::Dra;
                    o.unschedulable = false
                },
                "StartRollback",
            ),
            (
                "rolling back, no rule",
                RollingBack,
                |o| {
                    o.backend = Backend::Dra;
                    o.claim_holders = 2
                },
                "CreateTaintRule",
            ),
            (
                "rolling back, holders",
                RollingBack,
                |o| {
                    o.backend = Backend::Dra;
                    o.taint_rule_exists = true;
                    o.claim_holders = 2
                },
                "Wait:EvictingClaimHolders",
            ),
            (
                "rolling back, holders the eviction API can move: evicted, PDBs honoured",
                RollingBack,
                |o| {
                    o.backend = Backend::Dra;
                    o.taint_rule_exists = true;
                    o.claim_holders = 2;
                    o.drain.to_evict = 2
                },
                "Evict",
            ),
            (
                "rolling back, a holder without a controller waits for a person",
                RollingBack,
                |o| {
                    o.backend = Backend::Dra;
                    o.taint_rule_exists = true;
                    o.claim_holders = 1;
                    o.drain.unmanaged = 1
                },
                "Wait:UnmanagedPodsBlockDrain",
            ),
            (
                "rolling back, holders a PDB keeps past the drain timeout: the node fails, keeping them",
                RollingBack,
                |o| {
                    o.backend = Backend::Dra;
                    o.taint_rule_exists = true;
                    o.claim_holders = 2;
                    o.drain.to_evict = 2;
                    o.now = Timestamp::from_second(1_601).unwrap()
                },
                "Fail:RollbackTimeout",
            ),
            (
                "rolling back, past the drain timeout, the spec allows the rule to evict",
                RollingBack,
                |o| {
                    o.backend = Backend::Dra;
                    o.taint_rule_exists = true;
                    o.claim_holders = 2;
                    o.drain.to_evict = 2;
                    o.evict_past_budgets = true;
                    o.taint_eviction_reliable = true;
                    o.now = Timestamp::from_second(1_601).unwrap()
                },
                "EscalateTaintRule",
            ),
            (
                "rolling back past the budgets where the rule may miss pods with a generated claim: deleted",
                RollingBack,
                |o| {
                    o.backend = Backend::Dra;
                    o.taint_rule_exists = true;
                    o.claim_holders = 2;
                    o.drain.to_evict = 2;
                    o.evict_past_budgets = true;
                    o.taint_eviction_reliable = false;
                    o.now = Timestamp::from_second(1_601).unwrap()
                },
                "DeletePastBudgets",
            ),
            (
                "rolling back past the budgets, the deleted holders terminating: it waits, deletes nothing twice",
                RollingBack,
                |o| {
                    o.backend = Backend::Dra;
                    o.taint_rule_exists = true;
                    o.claim_holders = 2;
                    o.drain.terminating = 2;
                    o.evict_past_budgets = true;
                    o.taint_eviction_reliable = false;
                    o.now = Timestamp::from_second(1_601).unwrap()
                },
                "Wait:PodsTerminating",
            ),
            (
                "rolling back, the NoExecute rule evicts: no eviction API call on top",
                RollingBack,
                |o| {
                    o.backend = Backend::Dra;
                    o.taint_rule_exists = true;
                    o.taint_rule_evicts = true;
                    o.claim_holders = 2;
                    o.drain.to_evict = 2;
                    o.evict_past_budgets = true;
                    o.now = Timestamp::from_second(1_601).unwrap()
                },
                "Wait:EvictingClaimHolders",
            ),
            (
                "rolling back, a DaemonSet pod holds a driver device: named, never left to the timeout unsaid",
                RollingBack,
                |o| {
                    o.backend = Backend::Dra;
                    o.taint_rule_exists = true;
                    o.claim_holders = 1;
                    o.drain.daemon_set_holders = 1
                },
                "Wait:GpuHeldByDaemonSetPod",
            ),
            (
                "rolling back, a DaemonSet pod holds a driver device, the spec evicts such pods",
                RollingBack,
                |o| {
                    o.backend = Backend::Dra;
                    o.taint_rule_exists = true;
                    o.claim_holders = 1;
                    o.drain.daemon_set_holders = 1;
                    o.evict_daemon_set_gpu_pods = true
                },
                "EvictGpuHolders",
            ),
            (
                "rolling back, other holders first: the eviction API before the DaemonSet's",
                RollingBack,
                |o| {
                    o.backend = Backend::Dra;
                    o.taint_rule_exists = true;
                    o.claim_holders = 3;
                    o.drain.to_evict = 2;
                    o.drain.daemon_set_holders = 1;
                    o.evict_daemon_set_gpu_pods = true
                },
                "Evict",
            ),
            (
                "rolling back, evicted",
                RollingBack,
                |o| {
                    o.backend = Backend::Dra;
                    o.taint_rule_exists = true
                },
                "SwitchToDevicePlugin",
            ),
            (
                "rolling back, plugin not back",
                RollingBack,
                |o| o.taint_rule_exists = true,
                "Wait:WaitingForDevicePlugin",
            ),
            (
                "rolling back, plugin back",
                RollingBack,
                |o| {
                    o.taint_rule_exists = true;
                    o.allocatable = 8
                },
                "DeleteTaintRule",
            ),
            (
                "rolling back, plugin back, driver still publishing untainted devices",
                RollingBack,
                |o| {
                    o.taint_rule_exists = true;
                    o.allocatable = 8;
                    o.dra_devices = 8;
                    o.dra_selected = 8
                },
                "Wait:WaitingForDriverToLeave",
            ),
            ("rolling back, done", RollingBack, |o| o.allocatable = 8, "FinishRollback"),
            (
                "rolling back timeout",
                RollingBack,
                |o| {
                    o.claim_holders = 1;
                    o.taint_rule_exists = true;
                    o.backend = Backend::Dra;
                    o.now = Timestamp::from_second(1_901).unwrap()
                },
                "Fail:RollbackTimeout",
            ),
            ("rolled back, forward, picked", RolledBack, |o| o.start = true, "CordonAndDrain"),
            (
                "switched, no canary: completes without Verifying",
                Switching,
                |o| {
                    o.backend = Backend::Dra;
                    o.dra_devices = 8;
                    o.dra_selected = 8
                },
                "Complete",
            ),
            // DeviceClass selectors
            (
                "switching, devices published but the classes select too few",
                Switching,
                |o| {
                    o.backend = Backend::Dra;
                    o.dra_devices = 8;
                    o.dra_selected = 4
                },
                "Wait:WaitingForResourceSlices",
            ),
            // A driver without the device-plugin interlock: the switch goes through `none`.
            ("drained, no interlock", Draining, |o| o.interlock = false, "StopDevicePlugin"),
            (
                "switching, labelled back by someone, no interlock",
                Switching,
                |o| o.interlock = false,
                "StopDevicePlugin",
            ),
            (
                "none: the plugin still advertises",
                Switching,
                |o| {
                    o.interlock = false;
                    o.backend = Backend::None;
                    o.allocatable = 8
                },
                "Wait:DevicePluginStillAdvertising",
            ),
            (
                "none: allocatable 0, its pod still there",
                Switching,
                |o| {
                    o.interlock = false;
                    o.backend = Backend::None;
                    o.device_plugin_pods = Some(1)
                },
                "Wait:DevicePluginPodRunning",
            ),
            (
                "none: allocatable 0, pods not read",
                Switching,
                |o| {
                    o.interlock = false;
                    o.backend = Backend::None
                },
                "Wait:DevicePluginPodRunning",
            ),
            (
                "none: a late GPU pod goes first",
                Switching,
                |o| {
                    o.interlock = false;
                    o.backend = Backend::None;
                    o.device_plugin_pods = Some(0);
                    o.drain.to_evict = 1
                },
                "Evict",
            ),
            (
                "none: the plugin is gone, the driver starts",
                Switching,
                |o| {
                    o.interlock = false;
                    o.backend = Backend::None;
                    o.device_plugin_pods = Some(0)
                },
                "StartDriver",
            ),
            (
                "none: paused mid-switch still starts the driver",
                Switching,
                |o| {
                    o.interlock = false;
                    o.backend = Backend::None;
                    o.device_plugin_pods = Some(0);
                    o.hold = Some(Hold::Paused)
                },
                "StartDriver",
            ),
            (
                "none: the plugin never leaves",
                Switching,
                |o| {
                    o.interlock = false;
                    o.backend = Backend::None;
                    o.allocatable = 8;
                    o.now = Timestamp::from_second(1_301).unwrap()
                },
                "Fail:SwitchTimeout",
            ),
            (
                "none, direction Rollback",
                Switching,
                |o| {
                    o.backend = Backend::None;
                    o.direction = Direction::Rollback
                },
                "StartRollback",
            ),
            (
                "failed in none, rollback policy",
                Failed,
                |o| {
                    o.backend = Backend::None;
                    o.on_failure = FailurePolicy::Rollback
                },
                "StartRollback",
            ),
            (
                "rolling back from none: no driver ran, no rule needed",
                RollingBack,
                |o| o.backend = Backend::None,
                "SwitchToDevicePlugin",
            ),
        ];
        for (name, state, edit, want) in cases {
            let mut o = base(state);
            edit(&mut o);
            let got = next_step(&o);
            assert_eq!(kind(&got), want, "{name}: {got:?}");
        }
    }

    #[test]
    fn next_state_of_actions() {
        let cases = [
            (Action::Cordon, Some(NodeState::Cordoned)),
            (Action::StartDrain, Some(NodeState::Draining)),
            (Action::CordonAndDrain, Some(NodeState::Draining)),
            (Action::SwitchToDra, Some(NodeState::Switching)),
            (Action::StopDevicePlugin, Some(NodeState::Switching)),
            (Action::StartDriver, None),
            (Action::StartVerify, Some(NodeState::Verifying)),
            (Action::Complete, Some(NodeState::Migrated)),
            (
                Action::Fail { reason: FailReason::DrainTimeout, message: String::new() },
                Some(NodeState::Failed),
            ),
            (Action::StartRollback, Some(NodeState::RollingBack)),
            (Action::FinishRollback, Some(NodeState::RolledBack)),
            (Action::Evict, None),
            (Action::CreateTaintRule, None),
            (Action::SwitchToDevicePlugin, None),
        ];
        for (a, want) in cases {
            assert_eq!(a.next_state(), want, "{a:?}");
        }
    }

    #[test]
    fn timeouts_survive_restarts_because_they_come_from_the_annotation() {
        // Same observation twice, as after an operator restart: same decision.
        let mut o = base(NodeState::Draining);
        o.drain.to_evict = 1;
        o.now = Timestamp::from_second(5_000).unwrap();
        assert_eq!(kind(&next_step(&o)), "Fail:DrainTimeout");
        assert_eq!(kind(&next_step(&o.clone())), "Fail:DrainTimeout");
        assert_eq!(elapsed_seconds(&o), Some(4_000));
        let msg = match next_step(&o) {
            Action::Fail { message, .. } => message,
            _ => unreachable!(),
        };
        assert!(msg.contains("1 pod(s) left to evict"), "{msg}");
    }
}
