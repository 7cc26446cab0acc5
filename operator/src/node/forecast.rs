//! What the state machine ([`state::next_step`]) says of a node that has not started, at the two
//! points where `switchyard plan` names a node for a wait or a failure to come: once cordoned,
//! and in its switch past the verify timeout. The plan asks here; it never guesses the answer.

use k8s_openapi::jiff::Timestamp;

use crate::api::v1alpha1::NodeState;
use crate::node::record::Backend;
use crate::node::state::{self, Action, FailReason, Observed, WaitReason};

/// The state machine's answers for one node that has not started.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Forecast {
    /// Its step once cordoned.
    pub cordoned: Action,
    /// Its step in the switch, the device plugin gone, past `verify.timeoutSeconds`; `None` for a
    /// node that never gets there: it waits cordoned, or drains onto a Replace target instead.
    pub switching: Option<Action>,
}

impl Forecast {
    /// It would wait cordoned until its GPU count shows (`GpuCountUnknown`).
    pub fn waits_for_gpu_count(&self) -> bool {
        matches!(self.cordoned, Action::Wait { reason: WaitReason::GpuCountUnknown, .. })
    }

    /// Its switch would fail at the verify timeout (`SwitchTimeout`).
    pub fn switch_times_out(&self) -> bool {
        matches!(self.switching, Some(Action::Fail { reason: FailReason::SwitchTimeout, .. }))
    }
}

/// Asks [`state::next_step`] about `o`, a node at rest as [`Observed::of_node`] makes it, at each
/// point, as the operator would observe the node there with nothing else in the way (no hold, no
/// pod left to drain). `agent_finds`: the GPUs the driver would publish for the node once the
/// device plugin has gone, which only the caller can guess.
pub fn forecast(o: &Observed, agent_finds: u64) -> Forecast {
    let at = |state: NodeState| Observed {
        state,
        since: Some(o.now),
        start: false,
        hold: None,
        unschedulable: true,
        ..o.clone()
    };
    let cordoned = state::next_step(&at(NodeState::Cordoned));
    if cordoned != Action::StartDrain {
        return Forecast { cordoned, switching: None };
    }
    // The drain records the device plugin's count as the one the switch is verified against; a
    // NotReady kubelet only delays these steps (`NodeNotReady`).
    let drained = Observed {
        gpus_before: Some(o.device_plugin_gpus).filter(|&n| n > 0),
        ready: true,
        ..at(NodeState::Draining)
    };
    let backend = match state::next_step(&drained) {
        Action::SwitchToDra => Backend::Dra,
        Action::StopDevicePlugin => Backend::None,
        _ => return Forecast { cordoned, switching: None },
    };
    let mut switching = Observed {
        state: NodeState::Switching,
        backend,
        allocatable: 0,
        device_plugin_pods: Some(0),
        dra_devices: agent_finds,
        dra_selected: agent_finds,
        ..drained
    };
    // A switch without the interlock starts the driver once the plugin has left, on one clock.
    if state::next_step(&switching) == Action::StartDriver {
        switching.backend = Backend::Dra;
    }
    let past = o.now.as_second().saturating_add(o.verify_timeout_seconds.max(0)).saturating_add(1);
    switching.now = Timestamp::from_second(past).unwrap_or(Timestamp::MAX);
    Forecast { cordoned, switching: Some(state::next_step(&switching)) }
}
