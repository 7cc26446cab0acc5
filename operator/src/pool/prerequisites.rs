//! Whether the cluster can serve `nvidia.com/gpu` through DRA at all: API server and kubelet
//! versions, the resource.k8s.io/v1 kinds, CDI-capable container runtimes, and both DaemonSets.
//! Pure: the controller gathers [`ClusterFacts`], this module judges them.

use std::fmt::Write as _;

/// What the dry-run probe found out: create a DeviceClass with `spec.extendedResourceName` using
/// `dryRun=All` and see whether the server keeps the field. A server with the DRAExtendedResource
/// gate off silently drops it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum ExtendedResourceProbe {
    /// The probe was not needed (every component is on 1.37+) or could not run.
    #[default]
    NotRun,
    /// The server kept `extendedResourceName`: the gate is on.
    Kept,
    /// The server dropped `extendedResourceName`: the gate is off.
    Dropped,
}

/// Which resource.k8s.io/v1 kinds the API server serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct ServedApis {
    pub device_classes: bool,
    pub resource_slices: bool,
    pub resource_claims: bool,
    pub device_taint_rules: bool,
}

/// One pool node as the prerequisites see it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeVersions {
    pub name: String,
    /// `status.nodeInfo.kubeletVersion`, for example `v1.37.2`.
    pub kubelet_version: String,
    /// `status.nodeInfo.containerRuntimeVersion`, for example `containerd://2.1.4`.
    pub container_runtime_version: String,
}

/// The version of a control-plane component besides the API server, as the cluster shows it
/// ([`VersionSource`]). `None` where nothing shows it: a managed control plane (EKS, AKS, GKE)
/// runs it out of sight.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ComponentVersion {
    /// `kube-controller-manager` or `kube-scheduler`.
    pub component: &'static str,
    /// The version whose feature defaults it runs: its binary's, or the one it emulates.
    pub version: Option<String>,
    /// Where `version` was read; `None` with it.
    pub source: Option<VersionSource>,
}

/// Where a control-plane component's version shows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum VersionSource {
    /// The image tag of its pod in kube-system (`component=<name>`, as kubeadm labels its static
    /// pods; kops and most self-managed clusters run it so too).
    PodImage,
    /// Its LeaseCandidate in kube-system (coordination.k8s.io/v1beta1), which each instance
    /// writes where coordinated leader election is on. `emulating` is set when the binary
    /// (`binary`) emulates an older version, whose feature defaults it then runs.
    LeaseCandidate { binary: String, emulating: bool },
}

impl ComponentVersion {
    /// `kube-scheduler v1.36.3`, or `kube-scheduler v1.37.2 emulating 1.36` where it emulates.
    fn named(&self) -> String {
        match (&self.version, &self.source) {
            (Some(v), Some(VersionSource::LeaseCandidate { binary, emulating: true })) => {
                format!("{} {binary} emulating {v}", self.component)
            }
            (Some(v), _) => format!("{} {v}", self.component),
            (None, _) => format!("{} (version unknown)", self.component),
        }
    }

    /// `kube-scheduler v1.37.2 (its pod's image)`, or `kube-scheduler unknown (...)`.
    pub fn describe(&self) -> String {
        match &self.source {
            _ if self.version.is_none() => format!(
                "{} unknown (no pod or LeaseCandidate in kube-system shows it; a managed control plane hides it)",
                self.component
            ),
            Some(VersionSource::PodImage) => format!("{} (its pod's image)", self.named()),
            Some(VersionSource::LeaseCandidate { .. }) => format!("{} (its LeaseCandidate)", self.named()),
            None => self.named(),
        }
    }
}

/// The components whose versions [`ComponentVersion`] reads: the scheduler creates a pod's
/// generated ResourceClaim, and the controller manager's device-taint-eviction controller serves
/// a rollback.
pub const CONTROL_PLANE_COMPONENTS: [&str; 2] = ["kube-controller-manager", "kube-scheduler"];

/// Everything the checks look at.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClusterFacts {
    /// The API server's `gitVersion`, for example `v1.37.2`.
    pub server_git_version: String,
    /// The controller manager's and the scheduler's versions, where visible.
    pub control_plane: Vec<ComponentVersion>,
    pub served: ServedApis,
    pub nodes: Vec<NodeVersions>,
    pub probe: ExtendedResourceProbe,
    /// True when the migration may roll nodes back (direction Rollback or onFailure Rollback),
    /// which needs DeviceTaintRule.
    pub rollback_possible: bool,
    pub driver_daemonset: Option<String>,
    pub device_plugin_daemonset: Option<String>,
    pub driver_daemonset_exists: bool,
    pub device_plugin_daemonset_exists: bool,
    /// Whether the migration needs the device plugin's DaemonSet at all: a forward migration
    /// whose nodes the plugin no longer serves does not (see `pool::gate::device_plugin_needed`).
    pub device_plugin_daemonset_needed: bool,
    /// `spec.strategy.drain.rollbackEvictsPastBudgets`.
    pub rollback_evicts_past_budgets: bool,
    /// The label keys `spec.nodeSelector` uses that GPU Feature Discovery writes ([`gfd_written`]).
    pub selector_gfd_labels: Vec<String>,
}

/// The verdict: `met` drives the PrerequisitesMet condition, `reason` and `message` are its
/// reason and message, `warnings` go to InventoryFindings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verdict {
    pub met: bool,
    pub reason: &'static str,
    pub message: String,
    pub warnings: Vec<String>,
}

/// The first minor version where DRA extended resources are GA and locked on.
const GA_MINOR: u32 = 37;
/// The minor version where the feature is beta and on by default, so it works unless someone
/// switched the gate off, which the probe detects.
const BETA_MINOR: u32 = 36;
/// The first CRI-O release that enables CDI by default.
const CRIO_MIN: (u32, u32) = (1, 28);
/// How many node names a message lists before it says "and N more".
const NAMES_IN_MESSAGE: usize = 5;

/// `v1.37.2-gke.100` → `(1, 37)`.
pub fn parse_major_minor(v: &str) -> Option<(u32, u32)> {
    let v = v.trim().trim_start_matches('v');
    let mut parts = v.split(['.', '-', '+']);
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some((major, minor))
}

/// `v1.37.2-gke.100` → `(1, 37, 2)`; a version without a patch number reads as patch 0.
pub fn parse_version(v: &str) -> Option<(u32, u32, u32)> {
    let (major, minor) = parse_major_minor(v)?;
    let patch = v.trim().trim_start_matches('v').split(['.', '-', '+']).nth(2).and_then(|p| p.parse().ok());
    Some((major, minor, patch.unwrap_or(0)))
}

/// The first kube-controller-manager whose device-taint-eviction controller evicts a pod whose
/// claim is recorded in `status.extendedResourceClaimStatus` (kubernetes/kubernetes#141290: on
/// 1.37.0 and 1.37.1 it looks only at `spec.resourceClaims`).
pub const TAINT_EVICTION_FIXED: (u32, u32, u32) = (1, 37, 2);

/// Whether a NoExecute DeviceTaintRule can be relied on to evict the pods that got their device
/// through a generated claim (a plain `nvidia.com/gpu` limit): only where the controller
/// manager's version is known and at least [`TAINT_EVICTION_FIXED`]. `Err` says which version
/// it is (or that none shows), for the message.
pub fn taint_eviction_reaches_extended_claims(control_plane: &[ComponentVersion]) -> Result<(), String> {
    let kcm = control_plane.iter().find(|c| c.component == "kube-controller-manager");
    match kcm.and_then(|c| c.version.as_deref()).and_then(|v| parse_version(v).map(|p| (v, p))) {
        Some((_, version)) if version >= TAINT_EVICTION_FIXED => Ok(()),
        Some((v, _)) => Err(format!("kube-controller-manager {v}")),
        None => Err("kube-controller-manager (version unknown)".to_string()),
    }
}

/// `rollbackEvictsPastBudgets` on a controller manager whose device-taint-eviction controller
/// misses pods with a generated claim ([`taint_eviction_reaches_extended_claims`]): the rollback
/// deletes those pods itself past the drain timeout (`node::state`), and the warning says so.
fn rollback_eviction(f: &ClusterFacts, warnings: &mut Vec<String>) -> Result<(), Blocked> {
    if !(f.rollback_possible && f.rollback_evicts_past_budgets) {
        return Ok(());
    }
    if let Err(which) = taint_eviction_reaches_extended_claims(&f.control_plane) {
        warnings.push(format!(
            "{which}: before v1.37.2 the device-taint-eviction controller does not evict pods whose claim is in status.extendedResourceClaimStatus (kubernetes/kubernetes#141290), so spec.strategy.drain.rollbackEvictsPastBudgets does not rely on a NoExecute DeviceTaintRule here: past spec.strategy.drain.timeoutSeconds a rolling-back node deletes the pods that still hold the driver's devices itself, as that controller would; upgrade the control plane to v1.37.2 or later to have the rule evict them"
        ));
    }
    Ok(())
}

/// Whether GPU Feature Discovery writes the node label `key`: the `nvidia.com/` labels it derives
/// from NVML (the GPU's product, count, memory, family, architecture, compute capability, its
/// sharing, MIG and MPS, vGPU and CUDA versions, and its own timestamp). Not the GPU Operator's
/// (`nvidia.com/gpu.present`, `nvidia.com/gpu.deploy.*`, `nvidia.com/gpu.workload.config`), nor
/// those a person or the MIG manager set (`nvidia.com/mig.config`, `nvidia.com/device-plugin.config`).
pub fn gfd_written(key: &str) -> bool {
    let Some(name) = key.strip_prefix("nvidia.com/") else {
        return false;
    };
    const GPU: [&str; 12] = [
        "product",
        "count",
        "memory",
        "family",
        "machine",
        "mode",
        "replicas",
        "sharing-strategy",
        "compute.major",
        "compute.minor",
        "clique",
        "imex-domain",
    ];
    match name.split_once('.') {
        Some(("gpu", rest)) => GPU.contains(&rest),
        Some(("cuda" | "gfd" | "vgpu", _)) => true,
        Some(("mig", rest)) => matches!(rest, "capable" | "strategy"),
        Some(("mps", rest)) => rest == "capable",
        // A MIG profile's own labels: nvidia.com/mig-1g.10gb.count and the like.
        Some((profile, _)) => profile.starts_with("mig-"),
        None => false,
    }
}

/// A pool selected by labels GPU Feature Discovery writes: NVIDIA plans to stop running GFD where
/// its DRA driver serves the node (dra-driver-nvidia-gpu #1244; the GPU Operator's GPUCluster
/// already leaves it out), and a migrated node that lost them would leave the pool.
fn selector_labels(f: &ClusterFacts, warnings: &mut Vec<String>) -> Result<(), Blocked> {
    if !f.selector_gfd_labels.is_empty() {
        warnings.push(format!(
            "spec.nodeSelector uses {}, written by GPU Feature Discovery, which NVIDIA plans to stop running on nodes its DRA driver serves (dra-driver-nvidia-gpu #1244): a migrated node that loses only such labels stays in the pool, but a node that never had them is not selected; select the pool by a node-pool label (the provider's, or one you set)",
            f.selector_gfd_labels.join(", ")
        ));
    }
    Ok(())
}

/// How a container runtime stands with CDI, which DRA needs to hand devices to containers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RuntimeSupport {
    Ok,
    Warn(String),
    Block(String),
}

/// Judges `status.nodeInfo.containerRuntimeVersion`.
pub fn runtime_support(runtime_version: &str) -> RuntimeSupport {
    let (kind, version) = runtime_version.split_once("://").unwrap_or(("", runtime_version));
    let parsed = parse_major_minor(version);
    match (kind, parsed) {
        ("containerd", Some((major, _))) if major >= 2 => RuntimeSupport::Ok,
        ("containerd", Some((1, 7))) => RuntimeSupport::Warn(format!(
            "{runtime_version}: CDI must be enabled (enable_cdi = true in the CRI plugin config); containerd 2.x enables it by default"
        )),
        ("containerd", Some(_)) => RuntimeSupport::Block(format!(
            "{runtime_version} has no CDI support: upgrade containerd to 2.x (or 1.7 with enable_cdi = true)"
        )),
        ("cri-o", Some(v)) if v >= CRIO_MIN => RuntimeSupport::Ok,
        ("cri-o", Some(_)) => RuntimeSupport::Block(format!(
            "{runtime_version} does not enable CDI by default: upgrade CRI-O to 1.28 or later"
        )),
        _ => RuntimeSupport::Warn(format!(
            "{runtime_version}: unknown container runtime; make sure it supports CDI"
        )),
    }
}

fn list_names(names: &[String]) -> String {
    let mut s = names.iter().take(NAMES_IN_MESSAGE).cloned().collect::<Vec<_>>().join(", ");
    if names.len() > NAMES_IN_MESSAGE {
        let _ = write!(s, " and {} more", names.len() - NAMES_IN_MESSAGE);
    }
    s
}

fn block(reason: &'static str, message: String, warnings: Vec<String>) -> Verdict {
    Verdict { met: false, reason, message, warnings }
}

/// A blocking check's reason and message.
type Blocked = (&'static str, String);
/// One check: it blocks, or passes and may add warnings.
type Check = fn(&ClusterFacts, &mut Vec<String>) -> Result<(), Blocked>;

/// Runs every check; the first blocking one decides reason and message.
pub fn check(f: &ClusterFacts) -> Verdict {
    let mut warnings = Vec::new();
    let checks: [Check; 7] = [
        server_version,
        control_plane,
        resource_apis,
        nodes,
        daemon_sets,
        rollback_eviction,
        selector_labels,
    ];
    for check in checks {
        if let Err((reason, message)) = check(f, &mut warnings) {
            return block(reason, message, warnings);
        }
    }
    Verdict {
        met: true,
        reason: "AllMet",
        message: "the cluster can serve extended resources through DRA".into(),
        warnings,
    }
}

/// The API server serves DRA extended resources: 1.37, or 1.36 with the gate on (probed).
fn server_version(f: &ClusterFacts, warnings: &mut Vec<String>) -> Result<(), Blocked> {
    match parse_major_minor(&f.server_git_version) {
        None => {
            return Err((
                "UnknownServerVersion",
                format!("could not parse the API server version {:?}", f.server_git_version),
            ));
        }
        Some((1, minor)) if minor >= GA_MINOR => {}
        Some((1, BETA_MINOR)) => match f.probe {
            ExtendedResourceProbe::Kept => warnings.push(format!(
                "API server {} runs DRA extended resources as beta; upgrade to 1.37 where it is GA",
                f.server_git_version
            )),
            ExtendedResourceProbe::Dropped => {
                return Err((
                    "ExtendedResourceGateOff",
                    format!(
                        "API server {} drops DeviceClass spec.extendedResourceName: enable the DRAExtendedResource feature gate on kube-apiserver, kube-controller-manager, kube-scheduler and every kubelet, or upgrade to 1.37",
                        f.server_git_version
                    ),
                ));
            }
            ExtendedResourceProbe::NotRun => {
                return Err((
                    "ExtendedResourceUnverified",
                    format!(
                        "API server {} is 1.36 and the DRAExtendedResource dry-run probe could not run: grant the operator create on deviceclasses, or upgrade to 1.37",
                        f.server_git_version
                    ),
                ));
            }
        },
        Some(_) => {
            return Err((
                "ServerTooOld",
                format!(
                    "API server {} does not serve DRA extended resources: upgrade the control plane to 1.37 (or 1.36 with the DRAExtendedResource gate on)",
                    f.server_git_version
                ),
            ));
        }
    }
    Ok(())
}

/// The scheduler (which creates a pod's generated ResourceClaim) and the controller manager
/// (whose device-taint-eviction controller serves a rollback) serve DRA extended resources too.
/// A visible one older than 1.36 blocks; on a 1.36 API server, where the feature is a gate, a 1.36
/// or unknown one is a warning, since the dry-run probe reaches only the API server. Where a
/// managed control plane hides them on 1.37, they follow the API server and nothing is said.
fn control_plane(f: &ClusterFacts, warnings: &mut Vec<String>) -> Result<(), Blocked> {
    let server_beta = parse_major_minor(&f.server_git_version) == Some((1, BETA_MINOR));
    let mut too_old = Vec::new();
    for c in &f.control_plane {
        match c.version.as_deref().map(|v| (v, parse_major_minor(v))) {
            Some((_, Some((1, m)))) if m < BETA_MINOR => too_old.push(c.named()),
            Some((_, Some((1, BETA_MINOR)))) => warnings.push(format!(
                "{} runs DRA extended resources as beta: make sure its DRAExtendedResource gate is on (the dry-run probe checks only the API server), or upgrade it to 1.37",
                c.named()
            )),
            Some(_) => {}
            None if server_beta => warnings.push(format!(
                "{} version unknown (a managed control plane does not show it): on 1.36 its DRAExtendedResource gate must be on too",
                c.component
            )),
            None => {}
        }
    }
    if !too_old.is_empty() {
        return Err((
            "ControlPlaneTooOld",
            format!(
                "{} cannot serve DRA extended resources: upgrade the control plane to 1.37",
                too_old.join(" and ")
            ),
        ));
    }
    Ok(())
}

/// The resource.k8s.io/v1 kinds the move needs, and DeviceTaintRules where a rollback may run.
fn resource_apis(f: &ClusterFacts, warnings: &mut Vec<String>) -> Result<(), Blocked> {
    let mut missing_apis = Vec::new();
    if !f.served.device_classes {
        missing_apis.push("deviceclasses");
    }
    if !f.served.resource_slices {
        missing_apis.push("resourceslices");
    }
    if !f.served.resource_claims {
        missing_apis.push("resourceclaims");
    }
    if !missing_apis.is_empty() {
        return Err((
            "ResourceApiMissing",
            format!(
                "the API server does not serve resource.k8s.io/v1 {}: enable the resource.k8s.io/v1 API group (--runtime-config=resource.k8s.io/v1=true)",
                missing_apis.join(", ")
            ),
        ));
    }
    if !f.served.device_taint_rules {
        let msg = "the API server does not serve resource.k8s.io/v1 devicetaintrules, which rolling a node back uses to evict DRA claim holders";
        if f.rollback_possible {
            return Err((
                "DeviceTaintRuleMissing",
                format!(
                    "{msg}: upgrade to 1.37, or set spec.strategy.onFailure: Pause and spec.direction: Forward"
                ),
            ));
        }
        warnings.push(msg.to_string());
    }
    Ok(())
}

/// Every pool node's kubelet serves DRA extended resources and its runtime does CDI.
fn nodes(f: &ClusterFacts, warnings: &mut Vec<String>) -> Result<(), Blocked> {
    let mut old_kubelets = Vec::new();
    let mut beta_kubelets = Vec::new();
    let mut blocked_runtimes = Vec::new();
    for n in &f.nodes {
        match parse_major_minor(&n.kubelet_version) {
            Some((1, m)) if m >= GA_MINOR => {}
            Some((1, BETA_MINOR)) => beta_kubelets.push(n.name.clone()),
            _ => old_kubelets.push(format!("{} ({})", n.name, n.kubelet_version)),
        }
        match runtime_support(&n.container_runtime_version) {
            RuntimeSupport::Ok => {}
            RuntimeSupport::Warn(w) => warnings.push(format!("node {}: {w}", n.name)),
            RuntimeSupport::Block(b) => blocked_runtimes.push(format!("{}: {b}", n.name)),
        }
    }
    if !old_kubelets.is_empty() {
        return Err((
            "KubeletTooOld",
            format!(
                "kubelets older than 1.36 cannot hand DRA devices to extended-resource pods: upgrade {} to 1.37",
                list_names(&old_kubelets)
            ),
        ));
    }
    if !beta_kubelets.is_empty() {
        if f.probe != ExtendedResourceProbe::Kept {
            return Err((
                "KubeletGateUnverified",
                format!(
                    "kubelets on 1.36 need the DRAExtendedResource gate on and the dry-run probe did not confirm it: upgrade {} to 1.37",
                    list_names(&beta_kubelets)
                ),
            ));
        }
        warnings
            .push(format!("kubelets on 1.36 (beta): {}; upgrade them to 1.37", list_names(&beta_kubelets)));
    }
    if !blocked_runtimes.is_empty() {
        return Err(("RuntimeWithoutCdi", list_names(&blocked_runtimes)));
    }
    let stale: Vec<String> = f
        .nodes
        .iter()
        .filter(|n| parse_version(&n.kubelet_version).is_some_and(|v| v <= STALE_DEVICE_PLUGIN_STATE_LAST))
        .map(|n| format!("{} ({})", n.name, n.kubelet_version))
        .collect();
    if !stale.is_empty() {
        warnings.push(format!(
            "kubelets at v1.37.2 or older on {}: kubernetes/kubernetes#141426: a kubelet keeps the device-plugin GPUs of the pods the drain evicted, and once the device plugin has been gone 5 minutes a new pod asking for its resource through DRA fails to start (CreateContainerConfigError: endpoint not found in cache for a registered resource). Upgrade those kubelets to a release with the fix, or after each node moves restart its kubelet with /var/lib/kubelet/device-plugins/kubelet_internal_checkpoint removed (docs/operations.md, KubeletKeepsDevicePluginGpus)",
            list_names(&stale)
        ));
    }
    Ok(())
}

/// The newest kubelet known to keep a departed device plugin's allocations in a way that breaks
/// DRA-backed extended resources (kubernetes/kubernetes#141426, fixed upstream in August 2026:
/// `GetDeviceRunContainerOptions` treats a resource it once allocated as a device-plugin resource
/// even where the pod's claim serves it, and fails once that plugin's endpoint has expired). The
/// fix is in no release this project can test, so every kubelet up to this one is warned of.
const STALE_DEVICE_PLUGIN_STATE_LAST: (u32, u32, u32) = (1, 37, 2);

/// Both DaemonSets the spec names exist; the device plugin's only while the migration needs it.
fn daemon_sets(f: &ClusterFacts, _warnings: &mut Vec<String>) -> Result<(), Blocked> {
    let mut missing_ds = Vec::new();
    if !f.driver_daemonset_exists {
        missing_ds.push(format!(
            "the DRA driver DaemonSet {} (spec.driver.daemonSet)",
            f.driver_daemonset.as_deref().unwrap_or("?")
        ));
    }
    if !f.device_plugin_daemonset_exists && f.device_plugin_daemonset_needed {
        missing_ds.push(format!(
            "the device plugin DaemonSet {} (spec.devicePlugin.daemonSet)",
            f.device_plugin_daemonset.as_deref().unwrap_or("?")
        ));
    }
    if !missing_ds.is_empty() {
        return Err((
            "DaemonSetMissing",
            format!("{} not found: install it or fix the reference", missing_ds.join(" and ")),
        ));
    }
    Ok(())
}

/// Marks the warning [`with_capacity`] leaves for an acknowledged capacity change.
pub const SHARING_ACKNOWLEDGED: &str = "acknowledged by spec.acknowledge.gpuSharingLoss";

/// `v` (the cluster's verdict), then what the pool's nodes advertise ([`crate::pool::capacity`]): the
/// one judgement of "may this pool start" that the operator's gate and `switchyard plan` share.
/// An acknowledged capacity change stays visible as a warning (InventoryFindings).
pub fn with_capacity(v: Verdict, c: &crate::pool::capacity::Check, sharing_acknowledged: bool) -> Verdict {
    if !v.met {
        return v;
    }
    if let Some((block, message)) = crate::pool::capacity::blocker(c, sharing_acknowledged) {
        return Verdict { met: false, reason: block.reason(), message, warnings: v.warnings };
    }
    let mut v = v;
    for (why, nodes) in &c.unjudged {
        v.warnings.push(format!(
            "whether the device plugin shares GPUs on {} is unknown until their switch (no GPU Feature Discovery labels, and its config could not be judged: {why})",
            crate::pool::capacity::names(nodes)
        ));
    }
    if !c.shared.is_empty() {
        v.warnings.push(format!(
            "{} ({SHARING_ACKNOWLEDGED})",
            crate::pool::capacity::sharing_summary(&c.shared, c.shares)
        ));
    }
    if let Some(kept) = crate::pool::capacity::kept_summary(c) {
        v.message = format!("{}; {kept}", v.message);
    }
    v
}

/// True when the dry-run probe is worth running: only 1.36 components depend on it.
pub fn probe_needed(server_git_version: &str, nodes: &[NodeVersions]) -> bool {
    let is_beta = |v: &str| parse_major_minor(v) == Some((1, BETA_MINOR));
    is_beta(server_git_version) || nodes.iter().any(|n| is_beta(&n.kubelet_version))
}

/// What discovery says about the API server; cached for a while by the operator (`reconcile::context::FACTS_TTL`).
#[derive(Clone, Debug, Default)]
pub struct ServerFacts {
    pub git_version: String,
    /// The controller manager's and the scheduler's versions, where visible.
    pub control_plane: Vec<ComponentVersion>,
    pub served: ServedApis,
    pub probe: ExtendedResourceProbe,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: &str, kubelet: &str, runtime: &str) -> NodeVersions {
        NodeVersions {
            name: name.into(),
            kubelet_version: kubelet.into(),
            container_runtime_version: runtime.into(),
        }
    }

    fn good() -> ClusterFacts {
        ClusterFacts {
            server_git_version: "v1.37.2".into(),
            served: ServedApis {
                device_classes: true,
                resource_slices: true,
                resource_claims: true,
                device_taint_rules: true,
            },
            // Newer than the kubelets kubernetes/kubernetes#141426 is warned of on.
            nodes: vec![node("gpu-1", "v1.38.0", "containerd://2.1.4")],
            probe: ExtendedResourceProbe::NotRun,
            rollback_possible: false,
            driver_daemonset: Some("switchyard/driver".into()),
            device_plugin_daemonset: Some("gpu/nvidia-device-plugin".into()),
            driver_daemonset_exists: true,
            device_plugin_daemonset_exists: true,
            device_plugin_daemonset_needed: true,
            control_plane: Vec::new(),
            rollback_evicts_past_budgets: false,
            selector_gfd_labels: Vec::new(),
        }
    }

    fn kcm(version: Option<&str>) -> Vec<ComponentVersion> {
        vec![ComponentVersion {
            component: "kube-controller-manager",
            version: version.map(str::to_owned),
            source: version.map(|_| VersionSource::PodImage),
        }]
    }

    #[test]
    fn rollback_past_budgets_does_not_rely_on_no_execute_before_v1_37_2_or_where_unknown() {
        let past = |version: Option<&str>| ClusterFacts {
            rollback_possible: true,
            rollback_evicts_past_budgets: true,
            control_plane: kcm(version),
            ..good()
        };
        for (version, warned) in [
            (Some("v1.37.0"), true),
            (Some("v1.37.1-eks-abc"), true),
            (Some("v1.36.4"), true),
            (None, true),
            (Some("v1.37.2"), false),
            (Some("v1.37.3-gke.100"), false),
            (Some("v1.38.0"), false),
        ] {
            let v = check(&past(version));
            assert!(v.met, "{version:?}: a warning, never a block");
            let w = v.warnings.iter().find(|w| w.contains("kubernetes/kubernetes#141290"));
            assert_eq!(w.is_some(), warned, "{version:?}: {:?}", v.warnings);
            if let Some(w) = w {
                assert!(w.contains("deletes the pods that still hold the driver's devices itself"), "{w}");
            }
        }
        assert!(
            check(&ClusterFacts { rollback_evicts_past_budgets: false, ..past(Some("v1.37.1")) })
                .warnings
                .is_empty()
        );
        assert!(
            check(&ClusterFacts { rollback_possible: false, ..past(Some("v1.37.1")) }).warnings.is_empty()
        );
        assert_eq!(parse_version("v1.37.1-eks-abc"), Some((1, 37, 1)));
        assert_eq!(parse_version("v1.37"), Some((1, 37, 0)));
    }

    #[test]
    fn a_selector_on_labels_gfd_writes_is_warned_of() {
        for (key, gfd) in [
            ("nvidia.com/gpu.product", true),
            ("nvidia.com/gpu.count", true),
            ("nvidia.com/mig.capable", true),
            ("nvidia.com/mig-1g.10gb.count", true),
            ("nvidia.com/cuda.driver.major", true),
            ("nvidia.com/gfd.timestamp", true),
            ("nvidia.com/mps.capable", true),
            ("nvidia.com/gpu.present", false),
            ("nvidia.com/gpu.deploy.device-plugin", false),
            ("nvidia.com/mig.config", false),
            ("nvidia.com/device-plugin.config", false),
            ("cloud.google.com/gke-nodepool", false),
            ("gpu.product", false),
        ] {
            assert_eq!(gfd_written(key), gfd, "{key}");
        }
        let v = check(&ClusterFacts { selector_gfd_labels: vec!["nvidia.com/gpu.product".into()], ..good() });
        assert!(v.met);
        assert!(
            v.warnings.iter().any(|w| w.starts_with("spec.nodeSelector uses nvidia.com/gpu.product")
                && w.contains("dra-driver-nvidia-gpu #1244")
                && w.contains("select the pool by a node-pool label")),
            "{:?}",
            v.warnings
        );
    }

    #[test]
    fn the_control_plane_is_judged_where_it_shows() {
        let cp = |scheduler: Option<&str>, cm: Option<&str>| {
            vec![
                ComponentVersion {
                    component: "kube-controller-manager",
                    version: cm.map(str::to_owned),
                    source: cm.map(|_| VersionSource::PodImage),
                },
                ComponentVersion {
                    component: "kube-scheduler",
                    version: scheduler.map(str::to_owned),
                    source: scheduler.map(|_| VersionSource::PodImage),
                },
            ]
        };
        // (case, server, probe, control plane, met, reason, warning fragment)
        type Case =
            (&'static str, &'static str, Vec<ComponentVersion>, bool, &'static str, Option<&'static str>);
        let cases: Vec<Case> = vec![
            ("managed 1.37: hidden, follows the server", "v1.37.2", cp(None, None), true, "AllMet", None),
            ("visible and current", "v1.37.2", cp(Some("v1.37.2"), Some("v1.37.1")), true, "AllMet", None),
            (
                "a scheduler left behind at 1.35",
                "v1.37.2",
                cp(Some("v1.35.9"), Some("v1.37.2")),
                false,
                "ControlPlaneTooOld",
                None,
            ),
            (
                "a 1.36 scheduler mid-upgrade: its gate",
                "v1.37.2",
                cp(Some("v1.36.3"), Some("v1.37.2")),
                true,
                "AllMet",
                Some("kube-scheduler v1.36.3 runs DRA extended resources as beta"),
            ),
            (
                "managed 1.36: unknown, and the gate matters",
                "v1.36.5",
                cp(None, None),
                true,
                "AllMet",
                Some("kube-scheduler version unknown"),
            ),
        ];
        for (case, server, control_plane, met, reason, warning) in cases {
            let f = ClusterFacts {
                server_git_version: server.into(),
                probe: ExtendedResourceProbe::Kept,
                control_plane,
                ..good()
            };
            let v = check(&f);
            assert_eq!((v.met, v.reason), (met, reason), "{case}: {}", v.message);
            match warning {
                Some(w) => assert!(v.warnings.iter().any(|x| x.contains(w)), "{case}: {:?}", v.warnings),
                None if server == "v1.37.2" => assert!(v.warnings.is_empty(), "{case}: {:?}", v.warnings),
                None => {}
            }
        }
        // A 1.37 binary emulating 1.36 (its LeaseCandidate says so) runs 1.36's feature defaults.
        let emulating = ComponentVersion {
            component: "kube-scheduler",
            version: Some("1.36".into()),
            source: Some(VersionSource::LeaseCandidate { binary: "1.37.2".into(), emulating: true }),
        };
        let v = check(&ClusterFacts { control_plane: vec![emulating], ..good() });
        assert!(v.met, "{v:?}");
        assert_eq!(
            v.warnings,
            [
                "kube-scheduler 1.37.2 emulating 1.36 runs DRA extended resources as beta: make sure its DRAExtendedResource gate is on (the dry-run probe checks only the API server), or upgrade it to 1.37"
            ]
        );
        let v = check(&ClusterFacts { control_plane: cp(Some("v1.34.0"), Some("v1.35.1")), ..good() });
        assert_eq!(
            v.message,
            "kube-controller-manager v1.35.1 and kube-scheduler v1.34.0 cannot serve DRA extended resources: upgrade the control plane to 1.37"
        );
    }

    #[test]
    fn capacity_blocks_only_a_cluster_that_is_otherwise_ready() {
        use crate::pool::capacity::{Check, SharedNode};
        let shared = Check {
            shared: vec![SharedNode {
                node: "g".into(),
                resource: "nvidia.com/gpu".into(),
                advertised: 32,
                physical: 8,
                how: "time-slicing".into(),
                mps: false,
                known: true,
            }],
            shares: 1,
            ..Default::default()
        };
        let v = with_capacity(check(&good()), &shared, false);
        assert_eq!((v.met, v.reason), (false, "GpuSharingNotAcknowledged"));
        let v = with_capacity(check(&good()), &shared, true);
        assert!(v.met, "{v:?}");
        assert!(v.warnings.iter().any(|w| w.contains("from 32 to 8") && w.contains("acknowledged")), "{v:?}");
        // A cluster problem is reported first: fixing it is needed anyway.
        let old = ClusterFacts { server_git_version: "v1.35.0".into(), ..good() };
        assert_ne!(with_capacity(check(&old), &shared, false).reason, "GpuSharingNotAcknowledged");
        assert_eq!(with_capacity(check(&good()), &Check::default(), false), check(&good()));
        // A driver that shares each GPU as many ways keeps the slots: met, and the message says so.
        let kept = Check { kept: shared.shared.clone(), shares: 4, ..Default::default() };
        let v = with_capacity(check(&good()), &kept, false);
        assert!(v.met, "{v:?}");
        assert!(v.message.contains("time-sliced 4x -> 4 shares per GPU"), "{}", v.message);
        assert!(v.message.contains("no loss"), "{}", v.message);
    }

    #[test]
    fn version_parsing() {
        let cases = [
            ("v1.37.2", Some((1, 37))),
            ("v1.36.0-gke.1200", Some((1, 36))),
            ("1.38.0+k3s1", Some((1, 38))),
            ("2.0.4", Some((2, 0))),
            ("garbage", None),
            ("", None),
        ];
        for (v, want) in cases {
            assert_eq!(parse_major_minor(v), want, "{v}");
        }
    }

    #[test]
    fn runtime_table() {
        let cases = [
            ("containerd://2.1.4", "ok"),
            ("containerd://2.0.0", "ok"),
            ("containerd://1.7.22", "warn"),
            ("containerd://1.6.30", "block"),
            ("cri-o://1.30.1", "ok"),
            ("cri-o://1.28.0", "ok"),
            ("cri-o://1.27.4", "block"),
            ("docker://24.0.7", "warn"),
            ("", "warn"),
        ];
        for (v, want) in cases {
            let got = match runtime_support(v) {
                RuntimeSupport::Ok => "ok",
                RuntimeSupport::Warn(_) => "warn",
                RuntimeSupport::Block(_) => "block",
            };
            assert_eq!(got, want, "{v}");
        }
    }

    #[test]
    fn check_table() {
        type Edit = fn(&mut ClusterFacts);
        // (name, edit, met, reason, message fragment)
        let cases: Vec<(&str, Edit, bool, &str, &str)> = vec![
            ("all good", |_| {}, true, "AllMet", ""),
            (
                "server 1.35",
                |f| f.server_git_version = "v1.35.4".into(),
                false,
                "ServerTooOld",
                "upgrade the control plane to 1.37",
            ),
            (
                "server 1.36 probe kept",
                |f| {
                    f.server_git_version = "v1.36.3".into();
                    f.probe = ExtendedResourceProbe::Kept;
                },
                true,
                "AllMet",
                "",
            ),
            (
                "server 1.36 probe dropped",
                |f| {
                    f.server_git_version = "v1.36.3".into();
                    f.probe = ExtendedResourceProbe::Dropped;
                },
                false,
                "ExtendedResourceGateOff",
                "enable the DRAExtendedResource feature gate",
            ),
            (
                "server 1.36 no probe",
                |f| f.server_git_version = "v1.36.3".into(),
                false,
                "ExtendedResourceUnverified",
                "dry-run probe",
            ),
            (
                "unparsable server",
                |f| f.server_git_version = "dev".into(),
                false,
                "UnknownServerVersion",
                "\"dev\"",
            ),
            (
                "no deviceclasses",
                |f| f.served.device_classes = false,
                false,
                "ResourceApiMissing",
                "deviceclasses",
            ),
            ("no taint rules, forward only", |f| f.served.device_taint_rules = false, true, "AllMet", ""),
            (
                "no taint rules, rollback",
                |f| {
                    f.served.device_taint_rules = false;
                    f.rollback_possible = true;
                },
                false,
                "DeviceTaintRuleMissing",
                "onFailure: Pause",
            ),
            (
                "kubelet 1.35",
                |f| f.nodes.push(node("gpu-2", "v1.35.1", "containerd://2.1.4")),
                false,
                "KubeletTooOld",
                "gpu-2 (v1.35.1)",
            ),
            (
                "kubelet 1.36 without probe",
                |f| f.nodes.push(node("gpu-2", "v1.36.1", "containerd://2.1.4")),
                false,
                "KubeletGateUnverified",
                "gpu-2",
            ),
            (
                "kubelet 1.36 with probe",
                |f| {
                    f.nodes.push(node("gpu-2", "v1.36.1", "containerd://2.1.4"));
                    f.probe = ExtendedResourceProbe::Kept;
                },
                true,
                "AllMet",
                "",
            ),
            (
                "containerd 1.6",
                |f| f.nodes.push(node("gpu-3", "v1.37.0", "containerd://1.6.9")),
                false,
                "RuntimeWithoutCdi",
                "gpu-3: containerd://1.6.9",
            ),
            (
                "containerd 1.7 only warns",
                |f| f.nodes.push(node("gpu-3", "v1.37.0", "containerd://1.7.2")),
                true,
                "AllMet",
                "",
            ),
            (
                "driver ds missing",
                |f| f.driver_daemonset_exists = false,
                false,
                "DaemonSetMissing",
                "switchyard/driver (spec.driver.daemonSet)",
            ),
            (
                "the device plugin is gone and nothing needs it (the runbook's last step)",
                |f| {
                    f.device_plugin_daemonset_exists = false;
                    f.device_plugin_daemonset_needed = false;
                },
                true,
                "AllMet",
                "",
            ),
            (
                "the device plugin is gone while nodes still need it",
                |f| f.device_plugin_daemonset_exists = false,
                false,
                "DaemonSetMissing",
                "gpu/nvidia-device-plugin (spec.devicePlugin.daemonSet)",
            ),
            (
                "both ds missing",
                |f| {
                    f.driver_daemonset_exists = false;
                    f.device_plugin_daemonset_exists = false;
                },
                false,
                "DaemonSetMissing",
                "gpu/nvidia-device-plugin",
            ),
        ];
        for (name, edit, met, reason, fragment) in cases {
            let mut f = good();
            edit(&mut f);
            let v = check(&f);
            assert_eq!((v.met, v.reason), (met, reason), "{name}: {}", v.message);
            assert!(v.message.contains(fragment), "{name}: {:?} lacks {fragment:?}", v.message);
        }
    }

    #[test]
    fn warnings_are_collected() {
        let mut f = good();
        f.nodes =
            vec![node("gpu-3", "v1.38.0", "containerd://1.7.2"), node("gpu-4", "v1.38.0", "docker://24.0.7")];
        let v = check(&f);
        assert!(v.met);
        assert_eq!(v.warnings.len(), 2);
        assert!(v.warnings[0].contains("gpu-3") && v.warnings[0].contains("enable_cdi"));
        assert!(v.warnings[1].contains("unknown container runtime"));
    }

    /// kubernetes/kubernetes#141426: kubelets up to v1.37.2 (provider suffixes included) are
    /// warned of by name, with the symptom and the remedy; a newer one is not; nothing blocks.
    #[test]
    fn kubelets_that_keep_a_departed_device_plugins_gpus_are_warned_of() {
        let mut f = good();
        f.nodes = vec![
            node("a", "v1.37.2", "containerd://2.1.4"),
            node("b", "v1.37.1-eks-1a2b3c", "containerd://2.1.4"),
            node("c", "v1.37.3", "containerd://2.1.4"),
            node("d", "v1.38.0", "containerd://2.1.4"),
        ];
        let v = check(&f);
        assert!(v.met, "{}", v.message);
        let w: Vec<&String> = v.warnings.iter().filter(|w| w.contains("#141426")).collect();
        assert_eq!(w.len(), 1, "{:?}", v.warnings);
        assert!(w[0].contains("on a (v1.37.2), b (v1.37.1-eks-1a2b3c): "), "{}", w[0]);
        assert!(!w[0].contains("v1.37.3") && !w[0].contains("v1.38.0"), "{}", w[0]);
        assert!(
            w[0].contains("endpoint not found in cache") && w[0].contains("kubelet_internal_checkpoint"),
            "{}",
            w[0]
        );
        f.nodes = vec![node("d", "v1.38.0", "containerd://2.1.4")];
        assert!(check(&f).warnings.iter().all(|w| !w.contains("#141426")));
    }

    #[test]
    fn long_node_lists_are_cut() {
        let mut f = good();
        for i in 0..8 {
            f.nodes.push(node(&format!("old-{i}"), "v1.34.0", "containerd://2.0.0"));
        }
        let v = check(&f);
        assert!(v.message.contains("and 3 more"), "{}", v.message);
        assert!(!v.message.contains("old-7"));
    }

    #[test]
    fn probe_needed_only_for_1_36() {
        assert!(!probe_needed("v1.37.0", &[node("a", "v1.37.0", "")]));
        assert!(probe_needed("v1.36.0", &[]));
        assert!(probe_needed("v1.37.0", &[node("a", "v1.36.9", "")]));
    }
}
