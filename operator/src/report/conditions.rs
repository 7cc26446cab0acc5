//! The conditions a GpuPoolMigration reports, as a closed set, and the merge that keeps
//! `lastTransitionTime` still unless a condition's status really changes.
//!
//! Ready, Reconciling and Stalled follow kstatus, so `kubectl wait`, Flux and Argo CD read a
//! migration the same way they read a Deployment.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

/// Every condition type Switchyard writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ConditionType {
    /// True when the migration reached its goal: every pool node is served by the backend that
    /// `spec.direction` asks for, with nothing in flight, nothing failed and no selected node
    /// refused (another migration owns it or also selects it).
    Ready,
    /// True only while Switchyard is actively moving nodes or applying objects and expects to
    /// make progress without help.
    Reconciling,
    /// True only when the migration cannot go on without a human: a failed node with
    /// `onFailure: Pause`, a shadowed DeviceClass, a DaemonSet without placement in Verify mode,
    /// or unmet prerequisites.
    Stalled,
    /// True when the API server, the kubelets, the container runtimes and both DaemonSets are
    /// able to run DRA extended resources.
    PrerequisitesMet,
    /// True when every DeviceClass in `status.deviceClasses` exists and wins its extended
    /// resource name.
    DeviceClassesReady,
    /// True when the device plugin DaemonSet avoids `switchyard.dev/gpu-backend=dra` nodes and
    /// the DRA driver DaemonSet runs only there.
    PlacementReady,
    /// True when some pool node is served by both backends at once: it advertises a pool
    /// resource in `status.allocatable` and the driver publishes devices for it. This is the
    /// fault the migration exists to avoid; no new node starts while it is True.
    BackendOverlap,
    /// True when the operator has warnings about the pool that do not block it (older container
    /// runtimes, DeviceClass names that cannot be requested as
    /// `deviceclass.resource.kubernetes.io/<name>`).
    InventoryFindings,
    /// True when some selected nodes are refused because another GpuPoolMigration owns them or
    /// also selects them; the message names the nodes and the other migrations. The other
    /// nodes of the pool still move.
    NodeConflict,
    /// Forward migrations only: True when the device plugin's DaemonSet serves no node any more
    /// (it schedules on none, or it is gone), so the runbook's last step may delete it. False
    /// names how many nodes it still runs on.
    DevicePluginRemovable,
    /// Forward migrations, once a node has migrated: True when every running GPU pod on a
    /// migrated node is served through its generated claim by the driver's devices on its node
    /// (`status.pods`); False names the pods that are not.
    PodsVerified,
}

impl ConditionType {
    pub const ALL: [ConditionType; 11] = [
        ConditionType::Ready,
        ConditionType::Reconciling,
        ConditionType::Stalled,
        ConditionType::PrerequisitesMet,
        ConditionType::DeviceClassesReady,
        ConditionType::PlacementReady,
        ConditionType::BackendOverlap,
        ConditionType::InventoryFindings,
        ConditionType::NodeConflict,
        ConditionType::DevicePluginRemovable,
        ConditionType::PodsVerified,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            ConditionType::Ready => "Ready",
            ConditionType::Reconciling => "Reconciling",
            ConditionType::Stalled => "Stalled",
            ConditionType::PrerequisitesMet => "PrerequisitesMet",
            ConditionType::DeviceClassesReady => "DeviceClassesReady",
            ConditionType::PlacementReady => "PlacementReady",
            ConditionType::BackendOverlap => "BackendOverlap",
            ConditionType::InventoryFindings => "InventoryFindings",
            ConditionType::NodeConflict => "NodeConflict",
            ConditionType::DevicePluginRemovable => "DevicePluginRemovable",
            ConditionType::PodsVerified => "PodsVerified",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|t| t.as_str() == s)
    }
}

/// The page of the manual that says what to do for each reason `Ready` or `Stalled` carries.
pub const RUNBOOK: &str = "https://github.com/switchyard-dev/switchyard/blob/main/docs/operations.md";

/// The reasons with a section of their own under "What to do, by reason" in the runbook (its
/// heading is the reason itself). The healthy reasons (`Complete`, `NoHumanNeeded`, ...) share
/// "Nothing to do".
const RUNBOOK_REASONS: [&str; 15] = [
    "NodeFailed",
    "NodesFailed",
    "PrerequisitesNotMet",
    "UnmappedResources",
    "GpuSharingNotAcknowledged",
    "GpuOperatorOwnsDevicePlugin",
    "DeviceClassShadowed",
    "PlacementMissing",
    "BackendOverlap",
    "NodesRefused",
    "Findings",
    "Paused",
    "WaitingForNodes",
    "NodesMoving",
    "Applying",
];

/// Where the runbook says what to do about a condition with `reason`: its own section, or the
/// list of reasons for one the runbook does not name.
pub fn runbook(reason: &str) -> String {
    match RUNBOOK_REASONS.iter().find(|r| **r == reason) {
        Some(r) => format!("{RUNBOOK}#{}", r.to_ascii_lowercase()),
        None => format!("{RUNBOOK}#what-to-do-by-reason"),
    }
}

/// A condition as the reconciler decides it, before merging with what the object already says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Desired {
    pub type_: ConditionType,
    pub status: bool,
    pub reason: String,
    pub message: String,
}

impl Desired {
    pub fn new(type_: ConditionType, status: bool, reason: &str, message: impl Into<String>) -> Self {
        Self { type_, status, reason: reason.to_string(), message: message.into() }
    }
}

fn status_str(b: bool) -> &'static str {
    if b { "True" } else { "False" }
}

/// Merges `desired` into `old`: a condition keeps its `lastTransitionTime` when its status did not
/// change, and takes `now` when it did or is new. Conditions that Switchyard does not own are kept
/// as they are; the output lists ours first, in [`ConditionType::ALL`] order.
pub fn merge(old: &[Condition], desired: &[Desired], generation: Option<i64>, now: &Time) -> Vec<Condition> {
    let mut out: Vec<Condition> = Vec::new();
    for t in ConditionType::ALL {
        let Some(d) = desired.iter().find(|d| d.type_ == t) else {
            continue;
        };
        let previous = old.iter().find(|c| c.type_ == t.as_str());
        let status = status_str(d.status).to_string();
        let last_transition_time = match previous {
            Some(p) if p.status == status => p.last_transition_time.clone(),
            _ => now.clone(),
        };
        out.push(Condition {
            type_: t.as_str().to_string(),
            status,
            reason: d.reason.clone(),
            message: d.message.clone(),
            observed_generation: generation,
            last_transition_time,
        });
    }
    out.extend(old.iter().filter(|c| ConditionType::parse(&c.type_).is_none()).cloned());
    out
}

/// What the reconciler found, boiled down to what kstatus needs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Progress {
    /// `(reason, message)` when nodes are moving or objects are being applied.
    pub in_flight: Option<(String, String)>,
    /// `(reason, message)` when only a human can unblock the migration.
    pub needs_human: Option<(String, String)>,
    /// `(reason, message)` when the migration is deliberately waiting (spec.paused) or waiting
    /// for something outside it that will come by itself.
    pub waiting: Option<(String, String)>,
    /// Every pool node is on the target backend.
    pub done: bool,
}

/// Ready, Reconciling and Stalled from [`Progress`]. Stalled wins over Reconciling: a migration
/// that needs a human is not making progress, even if nodes are assigned to it.
pub fn kstatus(p: &Progress) -> [Desired; 3] {
    let stalled = match &p.needs_human {
        Some((r, m)) => Desired::new(ConditionType::Stalled, true, r, m.clone()),
        None => Desired::new(ConditionType::Stalled, false, "NoHumanNeeded", ""),
    };
    let reconciling = match (&p.needs_human, &p.in_flight) {
        (None, Some((r, m))) => Desired::new(ConditionType::Reconciling, true, r, m.clone()),
        _ => Desired::new(ConditionType::Reconciling, false, "Idle", ""),
    };
    let ready = if p.done && p.needs_human.is_none() && p.in_flight.is_none() {
        Desired::new(ConditionType::Ready, true, "Complete", "every pool node is on the target backend")
    } else if let Some((r, m)) = p.needs_human.as_ref().or(p.waiting.as_ref()).or(p.in_flight.as_ref()) {
        Desired::new(ConditionType::Ready, false, r, m.clone())
    } else {
        Desired::new(ConditionType::Ready, false, "NotStarted", "no pool node has moved yet")
    };
    [ready, reconciling, stalled]
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::jiff::Timestamp;

    fn t(secs: i64) -> Time {
        Time(Timestamp::from_second(secs).unwrap())
    }

    fn cond(type_: &str, status: &str, at: i64) -> Condition {
        Condition {
            type_: type_.into(),
            status: status.into(),
            reason: "Old".into(),
            message: "old".into(),
            observed_generation: Some(1),
            last_transition_time: t(at),
        }
    }

    #[test]
    fn merge_keeps_transition_time_only_when_status_is_unchanged() {
        let old = vec![cond("Ready", "False", 100), cond("Stalled", "False", 100)];
        let desired = vec![
            Desired::new(ConditionType::Ready, false, "Progressing", "2 of 4 nodes"),
            Desired::new(ConditionType::Stalled, true, "NodeFailed", "node n1 failed"),
            Desired::new(ConditionType::BackendOverlap, false, "NoOverlap", ""),
        ];
        let merged = merge(&old, &desired, Some(2), &t(500));
        let by = |ty: &str| merged.iter().find(|c| c.type_ == ty).unwrap().clone();
        // (type, lastTransitionTime, reason)
        let cases = [
            ("Ready", 100, "Progressing"),
            ("Stalled", 500, "NodeFailed"),
            ("BackendOverlap", 500, "NoOverlap"),
        ];
        for (ty, at, reason) in cases {
            let c = by(ty);
            assert_eq!(c.last_transition_time, t(at), "{ty}");
            assert_eq!(c.reason, reason, "{ty}");
            assert_eq!(c.observed_generation, Some(2), "{ty}");
        }
        assert_eq!(by("Ready").message, "2 of 4 nodes");
    }

    #[test]
    fn merge_keeps_foreign_conditions_and_orders_ours() {
        let old = vec![cond("SomeoneElses", "True", 5)];
        let desired = vec![
            Desired::new(ConditionType::Stalled, false, "NoHumanNeeded", ""),
            Desired::new(ConditionType::Ready, true, "Complete", ""),
        ];
        let merged = merge(&old, &desired, None, &t(9));
        let types: Vec<_> = merged.iter().map(|c| c.type_.as_str()).collect();
        assert_eq!(types, ["Ready", "Stalled", "SomeoneElses"]);
        assert_eq!(merged[2].last_transition_time, t(5));
    }

    #[test]
    fn kstatus_table() {
        let s = |r: &str| Some((r.to_string(), format!("{r} message")));
        // (progress, ready, reconciling, stalled, ready reason)
        let cases = [
            (Progress { done: true, ..Default::default() }, true, false, false, "Complete"),
            (
                Progress { in_flight: s("NodesMoving"), ..Default::default() },
                false,
                true,
                false,
                "NodesMoving",
            ),
            (
                Progress { in_flight: s("NodesMoving"), needs_human: s("NodeFailed"), ..Default::default() },
                false,
                false,
                true,
                "NodeFailed",
            ),
            (Progress { waiting: s("Paused"), ..Default::default() }, false, false, false, "Paused"),
            (
                Progress { done: true, needs_human: s("Shadowed"), ..Default::default() },
                false,
                false,
                true,
                "Shadowed",
            ),
            (Progress::default(), false, false, false, "NotStarted"),
        ];
        for (p, ready, reconciling, stalled, reason) in cases {
            let [r, rec, st] = kstatus(&p);
            assert_eq!((r.status, rec.status, st.status), (ready, reconciling, stalled), "{p:?}");
            assert_eq!(r.reason, reason, "{p:?}");
        }
    }

    #[test]
    fn type_names_round_trip() {
        for t in ConditionType::ALL {
            assert_eq!(ConditionType::parse(t.as_str()), Some(t));
        }
        assert_eq!(ConditionType::parse("Available"), None);
    }

    #[test]
    fn each_reason_the_runbook_names_has_its_section_and_others_link_to_the_list() {
        let manual = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/operations.md");
        let text = std::fs::read_to_string(&manual).unwrap();
        let headings: Vec<&str> = text.lines().filter_map(|l| l.strip_prefix("### ")).collect();
        for reason in RUNBOOK_REASONS {
            assert!(headings.contains(&reason), "docs/operations.md has no section {reason}");
            assert_eq!(runbook(reason), format!("{RUNBOOK}#{}", reason.to_ascii_lowercase()));
        }
        assert!(text.lines().any(|l| l == "## What to do, by reason"));
        assert_eq!(runbook("SomethingNew"), format!("{RUNBOOK}#what-to-do-by-reason"));
    }
}
