//! Device health: the events NVML and the simulator report, and the pure state machine that turns
//! them into device taints. Time is always passed in, never read here.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use serde::{Deserialize, Serialize};
use switchyard_api::well_known;

/// XIDs that say something went wrong in an application, not in the GPU: the device stays
/// schedulable and the taint is only informational (effect `None`). 13: graphics engine exception,
/// 31: GPU memory page fault, 43: GPU stopped processing (reset channel), 45: preemptive cleanup,
/// 68: video processor exception, 109: context switch timeout.
pub const DEFAULT_BENIGN_XIDS: [u32; 6] = [13, 31, 43, 45, 68, 109];

/// What happened to a device. The simulator's `POST /faults` body and the NVML watcher both
/// produce this; its JSON form is `{"kind":"xid","xid":79}`, `{"kind":"ecc-dbe"}`,
/// `{"kind":"gpu-lost"}` or `{"kind":"recover"}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum FaultKind {
    /// An XID error with its number.
    Xid { xid: u32 },
    /// An uncorrectable (double-bit) ECC error.
    EccDbe,
    /// The GPU fell off the bus or stopped answering.
    GpuLost,
    /// The device is known good again (the simulator says so, or NVML answers again with no
    /// uncorrected volatile ECC errors).
    Recover,
}

/// One health observation for one device, by device name (`gpu-3` or a MIG device name). A fault
/// on a whole GPU also taints its MIG devices.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HealthEvent {
    pub device: String,
    pub kind: FaultKind,
    /// When the event was observed; the event-to-taint metric measures from here.
    pub at: Timestamp,
}

/// The health events a new discovery implies for GPUs NVML reports lost (see
/// `discovery::Gpu::lost`): `GpuLost` for each GPU lost now that was not lost in `before` (or
/// that `before` lacks: the first discovery), `Recover` for each GPU that was lost and now reads
/// whole. A GPU lost after discovery is the event watcher's (its probe); this covers a GPU already
/// lost when the agent reads the node, which has no UUID to watch by.
pub fn lost_transitions(
    before: Option<&crate::discovery::NodeGpus>,
    after: &crate::discovery::NodeGpus,
    at: Timestamp,
) -> Vec<HealthEvent> {
    let was_lost = |index: u32| before.is_some_and(|b| b.gpus.iter().any(|g| g.index == index && g.lost));
    after
        .gpus
        .iter()
        .filter_map(|g| {
            let kind = match (g.lost, was_lost(g.index)) {
                (true, false) => FaultKind::GpuLost,
                (false, true) => FaultKind::Recover,
                _ => return None,
            };
            Some(HealthEvent { device: g.device_name(), kind, at })
        })
        .collect()
}

/// Taint effect as the API spells it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Effect {
    /// Informational: nothing is kept off the device.
    None,
    NoSchedule,
}

impl Effect {
    pub fn as_str(self) -> &'static str {
        match self {
            Effect::None => "None",
            Effect::NoSchedule => "NoSchedule",
        }
    }

    /// The effect of a taint read back from the API. Anything but `None` keeps the device out:
    /// we only ever write `None` and `NoSchedule`, and a stronger effect someone else wrote must
    /// not turn into a schedulable device.
    pub fn parse(s: &str) -> Self {
        match s {
            "None" => Effect::None,
            _ => Effect::NoSchedule,
        }
    }
}

/// The kinds of taint the health machine sets, each a key suffix under the driver name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum TaintKind {
    Xid,
    EccDbe,
    GpuLost,
}

impl TaintKind {
    pub fn key_suffix(self) -> &'static str {
        match self {
            TaintKind::Xid => well_known::TAINT_KEY_XID,
            TaintKind::EccDbe => well_known::TAINT_KEY_ECC_DBE,
            TaintKind::GpuLost => well_known::TAINT_KEY_GPU_LOST,
        }
    }

    /// The kind a health taint key suffix names; `None` for node-wide taints (driver-unavailable,
    /// device-plugin-active, kubelet-plugin-not-registered) and anything else that is not a health
    /// taint.
    pub fn from_key_suffix(suffix: &str) -> Option<Self> {
        [TaintKind::Xid, TaintKind::EccDbe, TaintKind::GpuLost].into_iter().find(|k| k.key_suffix() == suffix)
    }
}

/// One active taint on a device, in driver-independent form.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ActiveTaint {
    pub kind: TaintKind,
    pub value: Option<String>,
    pub effect: Effect,
    /// When this taint (with this value and effect) was first set; becomes `timeAdded`.
    pub since: Timestamp,
}

/// How health events become taints.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HealthPolicy {
    /// A device must stay fault-free (and, after a sticky fault, recovered) this long before its
    /// taints go away, so that a flapping GPU does not flip between schedulable and not.
    pub hold: Duration,
    /// XIDs that only get an informational taint.
    pub benign_xids: BTreeSet<u32>,
}

impl Default for HealthPolicy {
    fn default() -> Self {
        Self { hold: Duration::from_secs(300), benign_xids: DEFAULT_BENIGN_XIDS.into_iter().collect() }
    }
}

#[derive(Clone, Debug, Default, PartialEq)]
struct DeviceHealth {
    taints: BTreeMap<TaintKind, ActiveTaint>,
    /// A fault that does not clear on its own (fatal XID, ECC DBE, GPU lost) is outstanding until a
    /// `Recover` event.
    needs_recover: bool,
    last_fault: Option<Timestamp>,
    recovered_at: Option<Timestamp>,
}

impl DeviceHealth {
    /// Since when the device counts as healthy, if it does.
    fn healthy_since(&self) -> Option<Timestamp> {
        if self.needs_recover {
            return None;
        }
        match (self.last_fault, self.recovered_at) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        }
    }
}

/// The health of every device that has had a fault. Devices not in here are healthy.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct HealthState {
    devices: BTreeMap<String, DeviceHealth>,
}

/// What applying an event did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Applied {
    /// The device's taints changed.
    TaintsChanged,
    /// Recorded, but the taints are the same.
    NoTaintChange,
}

impl HealthState {
    /// Fold one event in.
    pub fn apply(&mut self, policy: &HealthPolicy, ev: &HealthEvent) -> Applied {
        let before = self.devices.get(&ev.device).map(|d| d.taints.clone()).unwrap_or_default();
        let dev = self.devices.entry(ev.device.clone()).or_default();
        let (kind, value, effect, sticky) = match &ev.kind {
            FaultKind::Recover => {
                if dev.needs_recover {
                    dev.needs_recover = false;
                    dev.recovered_at = Some(ev.at);
                }
                if dev.taints.is_empty() {
                    self.devices.remove(&ev.device);
                }
                return Applied::NoTaintChange;
            }
            FaultKind::Xid { xid } => {
                let benign = policy.benign_xids.contains(xid);
                let effect = if benign { Effect::None } else { Effect::NoSchedule };
                (TaintKind::Xid, Some(xid.to_string()), effect, !benign)
            }
            FaultKind::EccDbe => (TaintKind::EccDbe, None, Effect::NoSchedule, true),
            FaultKind::GpuLost => (TaintKind::GpuLost, None, Effect::NoSchedule, true),
        };
        dev.last_fault = Some(dev.last_fault.map_or(ev.at, |t| t.max(ev.at)));
        dev.needs_recover |= sticky;
        match dev.taints.get_mut(&kind) {
            // A benign XID never downgrades a fatal one: the device stays out until it recovers.
            Some(existing) if existing.effect > effect => {}
            Some(existing) if existing.effect == effect && existing.value == value => {}
            _ => {
                dev.taints.insert(kind, ActiveTaint { kind, value, effect, since: ev.at });
            }
        }
        if dev.taints == before { Applied::NoTaintChange } else { Applied::TaintsChanged }
    }

    /// Drop the taints of devices that have been healthy for the hold period. Returns whether
    /// anything changed.
    pub fn expire(&mut self, policy: &HealthPolicy, now: Timestamp) -> bool {
        let hold = k8s_openapi::jiff::SignedDuration::try_from(policy.hold).unwrap_or_default();
        let before = self.devices.len();
        self.devices.retain(|_, d| match d.healthy_since() {
            Some(since) => now < since.saturating_add(hold).unwrap_or(since),
            None => true,
        });
        self.devices.len() != before
    }

    /// When the next taint would expire, so the caller knows when to call [`Self::expire`].
    pub fn next_expiry(&self, policy: &HealthPolicy) -> Option<Timestamp> {
        let hold = k8s_openapi::jiff::SignedDuration::try_from(policy.hold).unwrap_or_default();
        self.devices
            .values()
            .filter_map(|d| d.healthy_since())
            .map(|s| s.saturating_add(hold).unwrap_or(s))
            .min()
    }

    /// Taints of one device, including its parent GPU's when it is a MIG device, sorted by kind.
    /// Where both set the same kind, the stronger effect wins.
    pub fn taints_for(&self, device: &str, parent: Option<&str>) -> Vec<ActiveTaint> {
        let mut out: BTreeMap<TaintKind, ActiveTaint> = BTreeMap::new();
        for name in parent.into_iter().chain(std::iter::once(device)) {
            if let Some(d) = self.devices.get(name) {
                for t in d.taints.values() {
                    match out.get(&t.kind) {
                        Some(old) if old.effect >= t.effect => {}
                        _ => {
                            out.insert(t.kind, t.clone());
                        }
                    }
                }
            }
        }
        out.into_values().collect()
    }

    /// Fold in the health taints a previous run of the agent published, so that a crash or restart
    /// does not make a faulty device schedulable again. `published` holds every published device
    /// by name with the health taints read back from it (see `slices::published_health`), tainted
    /// or not.
    ///
    /// The API only has what each device showed, and a whole-GPU fault is published on every MIG
    /// device of that GPU. So a taint that every published MIG device of a GPU carries alike
    /// (same kind, value, effect and `timeAdded`) is restored on the GPU itself (`gpu-1`), where
    /// the original fault and its `Recover` are reported; any other taint is restored on the
    /// device that shows it. A MIG device's own taint of the same kind hidden under its parent's
    /// stronger one is not visible and is not restored.
    ///
    /// A restored `NoSchedule` taint counts as a sticky fault that needs a `Recover` (when it was
    /// set or after a `Recover` the agent has no record of, so it fails safe); a restored `None`
    /// taint (benign XID) expires a hold period after its `since`, as if the agent had never
    /// stopped. Taints already in this state (events seen since start-up) are newer and win.
    pub fn restore(&mut self, published: Vec<(String, Vec<ActiveTaint>)>) {
        let mut migs_of: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        for (name, _) in &published {
            let parent = crate::discovery::NodeGpus::parent_name(name);
            if parent != name {
                migs_of.entry(parent).or_default().push(name);
            }
        }
        let taints_of: BTreeMap<&str, &Vec<ActiveTaint>> =
            published.iter().map(|(n, t)| (n.as_str(), t)).collect();
        let mut restored: BTreeMap<String, Vec<ActiveTaint>> = BTreeMap::new();
        let mut from_parent: BTreeSet<(&str, TaintKind)> = BTreeSet::new();
        for (parent, migs) in &migs_of {
            let first = taints_of.get(migs[0]).copied().into_iter().flatten();
            for t in first {
                let shared = migs.iter().all(|m| taints_of.get(m).is_some_and(|ts| ts.contains(t)));
                if shared {
                    restored.entry((*parent).to_string()).or_default().push(t.clone());
                    from_parent.extend(migs.iter().map(|m| (*m, t.kind)));
                }
            }
        }
        for (name, taints) in &published {
            for t in taints.iter().filter(|t| !from_parent.contains(&(name.as_str(), t.kind))) {
                restored.entry(name.clone()).or_default().push(t.clone());
            }
        }
        for (name, taints) in restored {
            let dev = self.devices.entry(name).or_default();
            for t in taints {
                if dev.taints.contains_key(&t.kind) {
                    continue;
                }
                let recovered_since = dev.recovered_at.is_some_and(|r| r >= t.since);
                dev.needs_recover |= t.effect == Effect::NoSchedule && !recovered_since;
                dev.last_fault = Some(dev.last_fault.map_or(t.since, |l| l.max(t.since)));
                dev.taints.insert(t.kind, t);
            }
        }
    }

    /// Whether a device (or its parent) has any taint with effect `NoSchedule`.
    pub fn is_unhealthy(&self, device: &str, parent: Option<&str>) -> bool {
        self.taints_for(device, parent).iter().any(|t| t.effect == Effect::NoSchedule)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(secs: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + secs).unwrap()
    }

    fn ev(device: &str, kind: FaultKind, at: i64) -> HealthEvent {
        HealthEvent { device: device.into(), kind, at: t(at) }
    }

    fn xid(x: u32) -> FaultKind {
        FaultKind::Xid { xid: x }
    }

    /// (kind, value, effect) of a device's taints, for compact expectations.
    fn summary(s: &HealthState, dev: &str) -> Vec<(TaintKind, Option<String>, Effect)> {
        s.taints_for(dev, None).into_iter().map(|t| (t.kind, t.value, t.effect)).collect()
    }

    #[test]
    fn fault_json_matches_the_documented_endpoint_body() {
        for (json, kind) in [
            (r#"{"kind":"xid","xid":79}"#, xid(79)),
            (r#"{"kind":"ecc-dbe"}"#, FaultKind::EccDbe),
            (r#"{"kind":"gpu-lost"}"#, FaultKind::GpuLost),
            (r#"{"kind":"recover"}"#, FaultKind::Recover),
        ] {
            assert_eq!(serde_json::from_str::<FaultKind>(json).unwrap(), kind, "{json}");
        }
        assert!(serde_json::from_str::<FaultKind>(r#"{"kind":"meltdown"}"#).is_err());
    }

    #[test]
    fn events_map_to_taints() {
        use Effect::*;
        use TaintKind as K;
        let hold = 60;
        // (events, check time, expected taints on gpu-0)
        #[allow(clippy::type_complexity)]
        let cases: Vec<(&str, Vec<HealthEvent>, i64, Vec<(TaintKind, Option<&str>, Effect)>)> = vec![
            (
                "fatal xid taints NoSchedule",
                vec![ev("gpu-0", xid(79), 0)],
                1,
                vec![(K::Xid, Some("79"), NoSchedule)],
            ),
            ("benign xid taints None", vec![ev("gpu-0", xid(13), 0)], 1, vec![(K::Xid, Some("13"), None)]),
            ("benign xid clears after hold", vec![ev("gpu-0", xid(31), 0)], hold, vec![]),
            (
                "benign xid kept just before hold",
                vec![ev("gpu-0", xid(31), 0)],
                hold - 1,
                vec![(K::Xid, Some("31"), None)],
            ),
            (
                "repeat benign xid restarts the hold",
                vec![ev("gpu-0", xid(31), 0), ev("gpu-0", xid(43), 30)],
                hold + 10,
                vec![(K::Xid, Some("43"), None)],
            ),
            (
                "fatal xid stays without recover",
                vec![ev("gpu-0", xid(79), 0)],
                10 * hold,
                vec![(K::Xid, Some("79"), NoSchedule)],
            ),
            (
                "benign does not downgrade fatal",
                vec![ev("gpu-0", xid(79), 0), ev("gpu-0", xid(13), 5)],
                6,
                vec![(K::Xid, Some("79"), NoSchedule)],
            ),
            (
                "fatal replaces benign",
                vec![ev("gpu-0", xid(13), 0), ev("gpu-0", xid(48), 5)],
                6,
                vec![(K::Xid, Some("48"), NoSchedule)],
            ),
            (
                "ecc dbe",
                vec![ev("gpu-0", FaultKind::EccDbe, 0)],
                1,
                vec![(K::EccDbe, Option::None, NoSchedule)],
            ),
            (
                "gpu lost",
                vec![ev("gpu-0", FaultKind::GpuLost, 0)],
                1,
                vec![(K::GpuLost, Option::None, NoSchedule)],
            ),
            (
                "recover keeps taint during hold",
                vec![ev("gpu-0", FaultKind::GpuLost, 0), ev("gpu-0", FaultKind::Recover, 100)],
                100 + hold - 1,
                vec![(K::GpuLost, Option::None, NoSchedule)],
            ),
            (
                "recover clears after hold",
                vec![ev("gpu-0", FaultKind::GpuLost, 0), ev("gpu-0", FaultKind::Recover, 100)],
                100 + hold,
                vec![],
            ),
            (
                "fault after recover restarts",
                vec![
                    ev("gpu-0", FaultKind::EccDbe, 0),
                    ev("gpu-0", FaultKind::Recover, 10),
                    ev("gpu-0", xid(79), 20),
                ],
                20 + 5 * hold,
                vec![(K::Xid, Some("79"), NoSchedule), (K::EccDbe, Option::None, NoSchedule)],
            ),
            (
                "several kinds at once, sorted",
                vec![
                    ev("gpu-0", FaultKind::GpuLost, 0),
                    ev("gpu-0", xid(79), 1),
                    ev("gpu-0", FaultKind::EccDbe, 2),
                ],
                3,
                vec![
                    (K::Xid, Some("79"), NoSchedule),
                    (K::EccDbe, Option::None, NoSchedule),
                    (K::GpuLost, Option::None, NoSchedule),
                ],
            ),
            ("recover on a healthy device is a no-op", vec![ev("gpu-0", FaultKind::Recover, 0)], 1, vec![]),
            ("other device untouched", vec![ev("gpu-1", xid(79), 0)], 1, vec![]),
        ];
        let policy = HealthPolicy { hold: Duration::from_secs(hold as u64), ..Default::default() };
        for (name, events, at, want) in cases {
            let mut s = HealthState::default();
            for e in &events {
                s.apply(&policy, e);
            }
            s.expire(&policy, t(at));
            let want: Vec<_> = want.into_iter().map(|(k, v, e)| (k, v.map(str::to_string), e)).collect();
            assert_eq!(summary(&s, "gpu-0"), want, "{name}");
        }
    }

    #[test]
    fn configured_benign_list_replaces_the_default() {
        let policy = HealthPolicy { benign_xids: [79].into_iter().collect(), ..Default::default() };
        let mut s = HealthState::default();
        s.apply(&policy, &ev("gpu-0", xid(79), 0));
        s.apply(&policy, &ev("gpu-1", xid(13), 0));
        assert_eq!(summary(&s, "gpu-0"), vec![(TaintKind::Xid, Some("79".into()), Effect::None)]);
        assert_eq!(summary(&s, "gpu-1"), vec![(TaintKind::Xid, Some("13".into()), Effect::NoSchedule)]);
    }

    #[test]
    fn apply_reports_whether_taints_changed_and_keeps_first_time() {
        let policy = HealthPolicy::default();
        let mut s = HealthState::default();
        assert_eq!(s.apply(&policy, &ev("gpu-0", xid(79), 0)), Applied::TaintsChanged);
        assert_eq!(s.apply(&policy, &ev("gpu-0", xid(79), 5)), Applied::NoTaintChange);
        assert_eq!(s.taints_for("gpu-0", None)[0].since, t(0), "a repeat keeps the original timeAdded");
        assert_eq!(s.apply(&policy, &ev("gpu-0", FaultKind::Recover, 6)), Applied::NoTaintChange);
        assert_eq!(s.apply(&policy, &ev("gpu-0", FaultKind::EccDbe, 7)), Applied::TaintsChanged);
    }

    #[test]
    fn next_expiry_tracks_the_hold() {
        let policy = HealthPolicy { hold: Duration::from_secs(60), ..Default::default() };
        let mut s = HealthState::default();
        assert_eq!(s.next_expiry(&policy), None);
        s.apply(&policy, &ev("gpu-0", FaultKind::GpuLost, 0));
        assert_eq!(s.next_expiry(&policy), None, "a sticky fault has no expiry until recovered");
        s.apply(&policy, &ev("gpu-1", xid(13), 10));
        assert_eq!(s.next_expiry(&policy), Some(t(70)));
        s.apply(&policy, &ev("gpu-0", FaultKind::Recover, 5));
        assert_eq!(s.next_expiry(&policy), Some(t(65)));
        assert!(!s.expire(&policy, t(64)));
        assert!(s.expire(&policy, t(65)));
        assert_eq!(s.next_expiry(&policy), Some(t(70)));
    }

    /// A published taint: (device, kind, value, effect, timeAdded).
    type Published = (&'static str, TaintKind, Option<&'static str>, Effect, i64);
    /// Expected taints of (device, parent) at the check time.
    type Expected = Vec<(&'static str, Option<&'static str>, Vec<(TaintKind, Option<&'static str>, Effect)>)>;
    /// (name, published taints, events after the restore, check time, expected).
    type RestoreCase = (&'static str, Vec<Published>, Vec<HealthEvent>, i64, Expected);

    /// `published` as `HealthState::restore` gets it: every device of `devices`, with its taints.
    fn published(devices: &[&str], taints: &[Published]) -> Vec<(String, Vec<ActiveTaint>)> {
        devices
            .iter()
            .map(|d| {
                let ts = taints
                    .iter()
                    .filter(|p| p.0 == *d)
                    .map(|&(_, kind, value, effect, at)| ActiveTaint {
                        kind,
                        value: value.map(str::to_string),
                        effect,
                        since: t(at),
                    })
                    .collect();
                (d.to_string(), ts)
            })
            .collect()
    }

    #[test]
    fn restored_taints_survive_and_keep_their_hold_semantics() {
        use Effect::*;
        use TaintKind as K;
        let hold = 60;
        const MIG0: &str = "gpu-1-mig-1g10gb-0";
        const MIG1: &str = "gpu-1-mig-1g10gb-1";
        let devices = ["gpu-0", MIG0, MIG1];
        let xid79 = |d| (d, K::Xid, Some("79"), NoSchedule, 0);
        let cases: Vec<RestoreCase> = vec![
            (
                "fatal xid stays until a recover",
                vec![xid79("gpu-0")],
                vec![],
                10 * hold,
                vec![("gpu-0", Option::None, vec![(K::Xid, Some("79"), NoSchedule)])],
            ),
            (
                "recover after restart holds from the recover",
                vec![xid79("gpu-0")],
                vec![ev("gpu-0", FaultKind::Recover, 100)],
                100 + hold - 1,
                vec![("gpu-0", Option::None, vec![(K::Xid, Some("79"), NoSchedule)])],
            ),
            (
                "recover after restart clears after the hold",
                vec![xid79("gpu-0")],
                vec![ev("gpu-0", FaultKind::Recover, 100)],
                100 + hold,
                vec![("gpu-0", Option::None, vec![])],
            ),
            (
                "benign xid stays informational until a hold after its timeAdded",
                vec![("gpu-0", K::Xid, Some("13"), None, 0)],
                vec![],
                hold - 1,
                vec![("gpu-0", Option::None, vec![(K::Xid, Some("13"), None)])],
            ),
            (
                "benign xid expires a hold after its timeAdded",
                vec![("gpu-0", K::Xid, Some("13"), None, 0)],
                vec![],
                hold,
                vec![("gpu-0", Option::None, vec![])],
            ),
            (
                "ecc and gpu-lost are sticky",
                vec![
                    ("gpu-0", K::EccDbe, Option::None, NoSchedule, 0),
                    ("gpu-0", K::GpuLost, Option::None, NoSchedule, 1),
                ],
                vec![],
                10 * hold,
                vec![(
                    "gpu-0",
                    Option::None,
                    vec![(K::EccDbe, Option::None, NoSchedule), (K::GpuLost, Option::None, NoSchedule)],
                )],
            ),
            (
                "a taint on every MIG device of a GPU came from the GPU: its recover clears them",
                vec![xid79(MIG0), xid79(MIG1)],
                vec![ev("gpu-1", FaultKind::Recover, 10)],
                10 + hold,
                vec![(MIG0, Some("gpu-1"), vec![]), (MIG1, Some("gpu-1"), vec![])],
            ),
            (
                "a taint on every MIG device of a GPU is restored on the GPU, not the MIG devices",
                vec![xid79(MIG0), xid79(MIG1)],
                vec![],
                10 * hold,
                vec![
                    ("gpu-1", Option::None, vec![(K::Xid, Some("79"), NoSchedule)]),
                    (MIG0, Option::None, vec![]),
                    (MIG1, Some("gpu-1"), vec![(K::Xid, Some("79"), NoSchedule)]),
                ],
            ),
            (
                "a taint on one MIG device stays with it; the GPU's recover does not clear it",
                vec![(MIG0, K::EccDbe, Option::None, NoSchedule, 0)],
                vec![ev("gpu-1", FaultKind::Recover, 10)],
                10 + hold,
                vec![
                    (MIG0, Some("gpu-1"), vec![(K::EccDbe, Option::None, NoSchedule)]),
                    (MIG1, Some("gpu-1"), vec![]),
                    ("gpu-1", Option::None, vec![]),
                ],
            ),
            (
                "the same kind set at different times on MIG devices stays per device",
                vec![xid79(MIG0), (MIG1, K::Xid, Some("79"), NoSchedule, 3)],
                vec![ev("gpu-1", FaultKind::Recover, 10)],
                10 + hold,
                vec![
                    (MIG0, Option::None, vec![(K::Xid, Some("79"), NoSchedule)]),
                    (MIG1, Option::None, vec![(K::Xid, Some("79"), NoSchedule)]),
                ],
            ),
            (
                "a fault after the restart replaces a restored benign one",
                vec![("gpu-0", K::Xid, Some("13"), None, 0)],
                vec![ev("gpu-0", xid(48), 5)],
                10 * hold,
                vec![("gpu-0", Option::None, vec![(K::Xid, Some("48"), NoSchedule)])],
            ),
        ];
        let policy = HealthPolicy { hold: Duration::from_secs(hold as u64), ..Default::default() };
        for (name, taints, events, at, want) in cases {
            let mut s = HealthState::default();
            s.restore(published(&devices, &taints));
            for e in &events {
                s.apply(&policy, e);
            }
            s.expire(&policy, t(at));
            for (device, parent, want) in want {
                let got: Vec<_> =
                    s.taints_for(device, parent).into_iter().map(|t| (t.kind, t.value, t.effect)).collect();
                let want: Vec<_> = want.into_iter().map(|(k, v, e)| (k, v.map(str::to_string), e)).collect();
                assert_eq!(got, want, "{name}: {device}");
            }
        }
    }

    #[test]
    fn restore_keeps_timeadded_and_newer_events_win() {
        let policy = HealthPolicy::default();
        let mut s = HealthState::default();
        s.apply(&policy, &ev("gpu-0", xid(48), 50));
        s.restore(published(
            &["gpu-0", "gpu-1"],
            &[
                ("gpu-0", TaintKind::Xid, Some("79"), Effect::NoSchedule, 0),
                ("gpu-0", TaintKind::GpuLost, None, Effect::NoSchedule, 7),
                ("gpu-1", TaintKind::EccDbe, None, Effect::NoSchedule, 9),
            ],
        ));
        let got: Vec<_> =
            s.taints_for("gpu-0", None).into_iter().map(|t| (t.kind, t.value, t.since)).collect();
        assert_eq!(
            got,
            vec![(TaintKind::Xid, Some("48".into()), t(50)), (TaintKind::GpuLost, None, t(7))],
            "the live xid wins over the restored one; the restored gpu-lost keeps its timeAdded"
        );
        assert_eq!(s.taints_for("gpu-1", None)[0].since, t(9));
        assert_eq!(s.next_expiry(&policy), None, "restored NoSchedule taints wait for a recover");

        // A recover seen since start-up, later than the restored fault, also covers it: the hold
        // runs from the recover.
        let mut s = HealthState::default();
        s.apply(&policy, &ev("gpu-0", FaultKind::GpuLost, 10));
        s.apply(&policy, &ev("gpu-0", FaultKind::Recover, 20));
        s.restore(published(&["gpu-0"], &[("gpu-0", TaintKind::Xid, Some("79"), Effect::NoSchedule, 0)]));
        assert!(s.is_unhealthy("gpu-0", None));
        assert_eq!(s.next_expiry(&policy), Some(t(20 + 300)));
        // A recover for a device that had nothing recorded says nothing about the restored fault.
        let mut s = HealthState::default();
        s.apply(&policy, &ev("gpu-0", FaultKind::Recover, 20));
        s.restore(published(&["gpu-0"], &[("gpu-0", TaintKind::Xid, Some("79"), Effect::NoSchedule, 0)]));
        assert_eq!(s.next_expiry(&policy), None);
    }

    #[test]
    fn taint_keys_and_effects_read_back() {
        for kind in [TaintKind::Xid, TaintKind::EccDbe, TaintKind::GpuLost] {
            assert_eq!(TaintKind::from_key_suffix(kind.key_suffix()), Some(kind));
        }
        for suffix in [
            well_known::TAINT_KEY_DRIVER_UNAVAILABLE,
            well_known::TAINT_KEY_DEVICE_PLUGIN_ACTIVE,
            well_known::TAINT_KEY_PLUGIN_NOT_REGISTERED,
            "",
        ] {
            assert_eq!(TaintKind::from_key_suffix(suffix), None, "{suffix:?}");
        }
        for (s, want) in
            [("None", Effect::None), ("NoSchedule", Effect::NoSchedule), ("NoExecute", Effect::NoSchedule)]
        {
            assert_eq!(Effect::parse(s), want, "{s}");
        }
    }

    #[test]
    fn mig_devices_inherit_parent_taints_with_stronger_effect_winning() {
        let policy = HealthPolicy::default();
        let mut s = HealthState::default();
        s.apply(&policy, &ev("gpu-1", xid(79), 0));
        s.apply(&policy, &ev("gpu-1-mig-1g10gb-0", xid(13), 1));
        s.apply(&policy, &ev("gpu-1-mig-1g10gb-0", FaultKind::EccDbe, 1));
        let got: Vec<_> = s
            .taints_for("gpu-1-mig-1g10gb-0", Some("gpu-1"))
            .into_iter()
            .map(|t| (t.kind, t.value, t.effect))
            .collect();
        assert_eq!(
            got,
            vec![
                (TaintKind::Xid, Some("79".into()), Effect::NoSchedule),
                (TaintKind::EccDbe, None, Effect::NoSchedule)
            ]
        );
        assert!(s.is_unhealthy("gpu-1-mig-3g40gb-0", Some("gpu-1")));
        assert!(!s.is_unhealthy("gpu-2", None));
    }
}
