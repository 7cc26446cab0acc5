//! Whether a GPU pod on a migrated node is served as the migration intends (the runbook's
//! verification, for every pod and not only the canary): every GPU resource it requests is mapped
//! to a request of the claim the scheduler generated for it (`status.extendedResourceClaimStatus`),
//! and that claim exists and is allocated devices of the migration's driver on the pod's node.
//! Pure: the claims are read by the caller.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::ResourceClaim;

use crate::api::v1alpha1::{NodePods, PodVerification, UnverifiedPod};
use crate::node::drain;

/// How many nodes and unverified pods `status.pods` lists.
pub const LISTED: usize = 64;

/// Why a pod is not verified: its `UnverifiedPod.reason`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// A GPU resource the pod requests has no claim request mapped to it: the device plugin
    /// serves it on a node that DRA serves, an overlap.
    HoldsDevicePluginGpu,
    /// The claim its status names does not exist.
    ClaimMissing,
    /// The claim exists and has no allocation.
    ClaimNotAllocated,
    /// A mapped request has no device in the claim's allocation.
    RequestNotAllocated,
    /// A device comes from another driver, or from another node's pool.
    OtherDevices,
    /// `strategy.type: Replace`: the pod runs on an old node left for removal, where the device
    /// plugin serves it: it landed back on the old pool (an uncordon, a stale scheduler).
    OnReplacedNode,
    /// Bound to a migrated node and never started: the kubelet reports that a container cannot
    /// start ([`cannot_start`]).
    CannotStart,
}

impl Fault {
    pub fn reason(self) -> &'static str {
        match self {
            Fault::HoldsDevicePluginGpu => "HoldsDevicePluginGpu",
            Fault::ClaimMissing => "ClaimMissing",
            Fault::ClaimNotAllocated => "ClaimNotAllocated",
            Fault::RequestNotAllocated => "RequestNotAllocated",
            Fault::OtherDevices => "OtherDevices",
            Fault::OnReplacedNode => "OnReplacedNode",
            Fault::CannotStart => "CannotStart",
        }
    }
}

/// A pod's verdict: `Ok` when verified.
pub type Verdict = Result<(), (Fault, String)>;

/// Whether `pod` is one to verify: it runs (not finished, not being deleted) and requests one of
/// the migration's GPU resources.
pub fn is_checked(pod: &Pod, resources: &[&str]) -> bool {
    let running = pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running");
    running && pod.metadata.deletion_timestamp.is_none() && drain::consumes_any(pod, resources)
}

/// Whether `pod` will be one to verify soon: bound, not yet running (its containers start, its
/// claim is prepared), not being deleted, and requesting one of the migration's GPU resources. A
/// check that sees one is looked at again soon: the pod's start triggers no reconcile.
pub fn is_arriving(pod: &Pod, resources: &[&str]) -> bool {
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    matches!(phase, None | Some("Pending"))
        && pod.metadata.deletion_timestamp.is_none()
        && drain::consumes_any(pod, resources)
}

/// Why the kubelet says a container cannot start, when it retries that without resolving it by
/// itself (an image, the container's configuration, the runtime). Not `ContainerCreating` or
/// `PodInitializing`: those are on their way.
pub const CANNOT_START: [&str; 7] = [
    "CreateContainerConfigError",
    "CreateContainerError",
    "RunContainerError",
    "ErrImagePull",
    "ImagePullBackOff",
    "ErrImageNeverPull",
    "InvalidImageName",
];

/// What the kubelet says of the first of `p`'s containers it cannot start (`container <name>
/// cannot start: <reason>: <message>`); kubernetes/kubernetes#141426's error is named with its
/// remedy. The pod itself says nothing of it: it stays Pending.
pub fn cannot_start(p: &Pod) -> Option<String> {
    let (container, waiting) = p.status.as_ref()?.container_statuses.iter().flatten().find_map(|c| {
        let w = c.state.as_ref()?.waiting.as_ref()?;
        CANNOT_START.contains(&w.reason.as_deref()?).then_some((c.name.as_str(), w))
    })?;
    let reason = waiting.reason.as_deref().unwrap_or_default();
    let said = waiting.message.as_deref().unwrap_or_default();
    let known = if said.contains(STALE_DEVICE_PLUGIN_ENDPOINT) {
        "; the node's kubelet still holds the departed device plugin's GPUs (kubernetes/kubernetes#141426, kubelets up to v1.37.2): restart it with /var/lib/kubelet/device-plugins/kubelet_internal_checkpoint removed and it starts (docs/operations.md, KubeletKeepsDevicePluginGpus)"
    } else {
        ""
    };
    Some(format!("container {container} cannot start: {reason}: {said}{known}"))
}

/// The kubelet's error for a resource whose device-plugin endpoint it has dropped while it still
/// remembers that plugin's GPUs (`pkg/kubelet/cm/devicemanager`).
const STALE_DEVICE_PLUGIN_ENDPOINT: &str = "endpoint not found in cache for a registered resource";

/// The `namespace/name` of the claim the scheduler generated for `pod`, if its status names one.
pub fn generated_claim(pod: &Pod) -> Option<String> {
    let name = &pod.status.as_ref()?.extended_resource_claim_status.as_ref()?.resource_claim_name;
    Some(format!("{}/{name}", pod.metadata.namespace.as_deref().unwrap_or_default()))
}

/// A pod on a Replace migration's old node, left for removal: not where the migration moved it.
pub fn on_replaced_node(node: &str) -> Verdict {
    Err((
        Fault::OnReplacedNode,
        format!(
            "runs on {node}, an old node left for removal (switchyard.dev/replaced), through the device plugin: it landed back on the old pool (someone uncordoned the node, or a scheduler placed it there); delete it so that its controller re-creates it on the target pool"
        ),
    ))
}

/// Judges a pod [`is_checked`] picked, on `node`, with its generated claim as read (`None`: not
/// found). `resources` are the migration's GPU resources and `driver` its driver.
pub fn judge(
    pod: &Pod,
    claim: Option<&ResourceClaim>,
    resources: &[&str],
    driver: &str,
    node: &str,
) -> Verdict {
    let requested = requested(pod, resources);
    let status = pod.status.as_ref().and_then(|s| s.extended_resource_claim_status.as_ref());
    let mappings: Vec<(&str, &str, &str)> = status
        .map(|s| {
            s.request_mappings
                .iter()
                .map(|m| (m.container_name.as_str(), m.resource_name.as_str(), m.request_name.as_str()))
                .collect()
        })
        .unwrap_or_default();
    if let Some((container, resource)) =
        requested.iter().find(|(c, r)| !mappings.iter().any(|(mc, mr, _)| mc == c && mr == r))
    {
        return Err((
            Fault::HoldsDevicePluginGpu,
            format!(
                "container {container} requests {resource} with no DRA claim behind it: the device plugin serves it on a node DRA serves"
            ),
        ));
    }
    let Some(status) = status else { return Ok(()) };
    let Some(claim) = claim else {
        return Err((
            Fault::ClaimMissing,
            format!("its claim {} does not exist", status.resource_claim_name),
        ));
    };
    let Some(results) = claim
        .status
        .as_ref()
        .and_then(|s| s.allocation.as_ref())
        .and_then(|a| a.devices.as_ref())
        .and_then(|d| d.results.as_ref())
        .filter(|r| !r.is_empty())
    else {
        return Err((
            Fault::ClaimNotAllocated,
            format!("its claim {} has no allocation", status.resource_claim_name),
        ));
    };
    for (container, resource, request) in mappings.iter().filter(|(c, r, _)| requested.contains(&(*c, *r))) {
        // A request with subrequests is allocated as `request/subrequest`.
        let served: Vec<_> = results
            .iter()
            .filter(|r| {
                r.request == *request || r.request.strip_prefix(request).is_some_and(|s| s.starts_with('/'))
            })
            .collect();
        if served.is_empty() {
            return Err((
                Fault::RequestNotAllocated,
                format!(
                    "{resource} of container {container} (request {request} of claim {}) has no device",
                    status.resource_claim_name
                ),
            ));
        }
        if let Some(other) = served.iter().find(|r| r.driver != driver || r.pool != node) {
            return Err((
                Fault::OtherDevices,
                format!(
                    "{resource} of container {container} is allocated {}/{}/{}, not a device of {driver} on {node}",
                    other.driver, other.pool, other.device
                ),
            ));
        }
    }
    Ok(())
}

/// A pod's verdict on its node: `(node, namespace, name, verdict)`.
pub type Checked = (String, String, String, Verdict);

/// `status.pods` from every checked pod: the counts, the nodes (those with unverified pods first,
/// then by name) and the unverified pods (by node, then pod), each list capped at [`LISTED`].
pub fn summarize(checked: Vec<Checked>) -> PodVerification {
    let mut nodes: BTreeMap<String, NodePods> = BTreeMap::new();
    let mut unverified_pods = Vec::new();
    let mut out = PodVerification::default();
    for (node, namespace, name, verdict) in checked {
        let counts = nodes
            .entry(node.clone())
            .or_insert_with(|| NodePods { node: node.clone(), ..Default::default() });
        match verdict {
            Ok(()) => {
                counts.verified += 1;
                out.verified += 1;
            }
            Err((fault, message)) => {
                counts.unverified += 1;
                out.unverified += 1;
                unverified_pods.push(UnverifiedPod {
                    node,
                    namespace,
                    name,
                    reason: fault.reason().to_string(),
                    message,
                });
            }
        }
    }
    let mut nodes: Vec<NodePods> = nodes.into_values().collect();
    nodes.sort_by(|a, b| (b.unverified > 0).cmp(&(a.unverified > 0)).then_with(|| a.node.cmp(&b.node)));
    nodes.truncate(LISTED);
    unverified_pods.sort_by(|a, b| (&a.node, &a.namespace, &a.name).cmp(&(&b.node, &b.namespace, &b.name)));
    unverified_pods.truncate(LISTED);
    out.nodes = nodes;
    out.unverified_pods = unverified_pods;
    out
}

/// The `(container, resource)` pairs of `pod` that request one of `resources`, init containers
/// included.
fn requested<'a>(pod: &'a Pod, resources: &[&str]) -> Vec<(&'a str, &'a str)> {
    let Some(spec) = pod.spec.as_ref() else { return Vec::new() };
    let mut out = Vec::new();
    for c in spec.containers.iter().chain(spec.init_containers.iter().flatten()) {
        let Some(r) = c.resources.as_ref() else { continue };
        for m in [r.limits.as_ref(), r.requests.as_ref()].into_iter().flatten() {
            for key in m.keys().filter(|k| resources.contains(&k.as_str())) {
                if !out.contains(&(c.name.as_str(), key.as_str())) {
                    out.push((c.name.as_str(), key.as_str()));
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    const DRIVER: &str = "gpu.switchyard.dev";
    const RES: &[&str] = &["nvidia.com/gpu", "nvidia.com/mig-1g.10gb"];

    /// A pod as the GPU-pod cache holds it (read into `PodFields`, as the watch reads it), bound
    /// and Pending with its container waiting for `reason`.
    fn waiting(reason: &str, message: &str) -> Pod {
        let fields: crate::reads::pod_list::PodFields = serde_json::from_value(json!({
            "metadata": {"name": "train", "namespace": "ml"},
            "spec": {"nodeName": "gpu-1", "containers": [{"name": "cuda", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
            "status": {"phase": "Pending", "containerStatuses": [{
                "name": "cuda", "image": "cuda", "imageID": "", "ready": false, "restartCount": 0,
                "state": {"waiting": {"reason": reason, "message": message}},
            }]},
        }))
        .unwrap();
        fields.into_pod()
    }

    #[test]
    fn a_pod_whose_container_cannot_start_says_why_through_the_pod_cache() {
        assert!(is_arriving(&waiting("ContainerCreating", ""), RES));
        assert_eq!(cannot_start(&waiting("ContainerCreating", "")), None, "on its way");
        assert_eq!(
            cannot_start(&waiting("CreateContainerError", "no such file")).as_deref(),
            Some("container cuda cannot start: CreateContainerError: no such file")
        );
        let stale = "endpoint not found in cache for a registered resource: nvidia.com/gpu";
        let m = cannot_start(&waiting("CreateContainerConfigError", stale)).unwrap();
        assert!(
            m.starts_with(&format!("container cuda cannot start: CreateContainerConfigError: {stale}; ")),
            "{m}"
        );
        assert!(
            m.contains("kubernetes/kubernetes#141426") && m.contains("kubelet_internal_checkpoint"),
            "{m}"
        );
    }

    fn pod(limits: Value, mappings: Option<Value>) -> Pod {
        let mut status = json!({"phase": "Running"});
        if let Some(m) = mappings {
            status["extendedResourceClaimStatus"] =
                json!({"resourceClaimName": "train-extended-resources-x", "requestMappings": m});
        }
        serde_json::from_value(json!({
            "metadata": {"name": "train", "namespace": "ml"},
            "spec": {"nodeName": "n0", "containers": [{"name": "main", "resources": {"limits": limits}}]},
            "status": status,
        }))
        .unwrap()
    }

    fn mapping(resource: &str, request: &str) -> Value {
        json!({"containerName": "main", "resourceName": resource, "requestName": request})
    }

    fn claim(results: Value) -> ResourceClaim {
        serde_json::from_value(json!({
            "metadata": {"name": "train-extended-resources-x", "namespace": "ml"},
            "spec": {},
            "status": {"allocation": {"devices": {"results": results}}},
        }))
        .unwrap()
    }

    fn result(request: &str, driver: &str, pool: &str) -> Value {
        json!({"request": request, "driver": driver, "pool": pool, "device": "gpu-0"})
    }

    #[test]
    fn verdicts() {
        let gpu = json!({"nvidia.com/gpu": "1"});
        let mixed = json!({"nvidia.com/gpu": "1", "nvidia.com/mig-1g.10gb": "1"});
        let both = json!([
            mapping("nvidia.com/gpu", "container-0-request-0"),
            mapping("nvidia.com/mig-1g.10gb", "container-0-request-1")
        ]);
        let ok = claim(json!([result("container-0-request-0", DRIVER, "n0")]));
        let unallocated: ResourceClaim =
            serde_json::from_value(json!({"metadata": {"name": "x"}, "spec": {}})).unwrap();
        // (case, pod, claim, want: None for verified, else the fault)
        let cases: Vec<(&str, Pod, Option<ResourceClaim>, Option<Fault>)> = vec![
            (
                "served through its claim by our driver on its node",
                pod(gpu.clone(), Some(json!([mapping("nvidia.com/gpu", "container-0-request-0")]))),
                Some(ok.clone()),
                None,
            ),
            (
                "no claim status: the device plugin serves it",
                pod(gpu.clone(), None),
                None,
                Some(Fault::HoldsDevicePluginGpu),
            ),
            (
                "a MIG resource the scheduler did not map: the device plugin serves that one",
                pod(mixed.clone(), Some(json!([mapping("nvidia.com/gpu", "container-0-request-0")]))),
                Some(ok.clone()),
                Some(Fault::HoldsDevicePluginGpu),
            ),
            (
                "its claim is gone",
                pod(gpu.clone(), Some(json!([mapping("nvidia.com/gpu", "container-0-request-0")]))),
                None,
                Some(Fault::ClaimMissing),
            ),
            (
                "its claim is not allocated",
                pod(gpu.clone(), Some(json!([mapping("nvidia.com/gpu", "container-0-request-0")]))),
                Some(unallocated),
                Some(Fault::ClaimNotAllocated),
            ),
            (
                "every mapped request is checked, not only the first (the canary's)",
                pod(mixed.clone(), Some(both.clone())),
                Some(ok.clone()),
                Some(Fault::RequestNotAllocated),
            ),
            (
                "both requests served, one through a subrequest",
                pod(mixed.clone(), Some(both.clone())),
                Some(claim(json!([
                    result("container-0-request-0", DRIVER, "n0"),
                    result("container-0-request-1/mig", DRIVER, "n0")
                ]))),
                None,
            ),
            (
                "another driver's device",
                pod(gpu.clone(), Some(json!([mapping("nvidia.com/gpu", "container-0-request-0")]))),
                Some(claim(json!([result("container-0-request-0", "gpu.nvidia.com", "n0")]))),
                Some(Fault::OtherDevices),
            ),
            (
                "another node's device",
                pod(gpu.clone(), Some(json!([mapping("nvidia.com/gpu", "container-0-request-0")]))),
                Some(claim(json!([result("container-0-request-0", DRIVER, "n7")]))),
                Some(Fault::OtherDevices),
            ),
            (
                "a request-name prefix is not a subrequest",
                pod(gpu.clone(), Some(json!([mapping("nvidia.com/gpu", "container-0-request-0")]))),
                Some(claim(json!([result("container-0-request-01", DRIVER, "n0")]))),
                Some(Fault::RequestNotAllocated),
            ),
        ];
        for (case, p, c, want) in cases {
            assert!(is_checked(&p, RES), "{case}");
            let got = judge(&p, c.as_ref(), RES, DRIVER, "n0");
            assert_eq!(got.as_ref().err().map(|(f, _)| *f), want, "{case}: {got:?}");
        }
    }

    #[test]
    fn the_summary_counts_per_node_and_lists_the_faulty_first() {
        let ok = |node: &str, name: &str| (node.to_string(), "ml".to_string(), name.to_string(), Ok(()));
        let bad = |node: &str, name: &str| {
            (
                node.to_string(),
                "ml".to_string(),
                name.to_string(),
                Err((Fault::ClaimMissing, "gone".to_string())),
            )
        };
        let s = summarize(vec![ok("a", "p1"), ok("a", "p2"), bad("b", "p3"), ok("b", "p4"), ok("c", "p5")]);
        assert_eq!((s.verified, s.unverified), (4, 1));
        let nodes: Vec<(&str, i32, i32)> =
            s.nodes.iter().map(|n| (n.node.as_str(), n.verified, n.unverified)).collect();
        assert_eq!(nodes, [("b", 1, 1), ("a", 2, 0), ("c", 1, 0)]);
        assert_eq!(s.unverified_pods.len(), 1);
        assert_eq!(
            (s.unverified_pods[0].name.as_str(), s.unverified_pods[0].reason.as_str()),
            ("p3", "ClaimMissing")
        );
        let many = summarize((0..100).map(|i| bad(&format!("n{i:03}"), "p")).collect());
        assert_eq!((many.unverified, many.nodes.len(), many.unverified_pods.len()), (100, LISTED, LISTED));
    }

    #[test]
    fn only_running_gpu_pods_are_checked_and_their_claim_is_named() {
        let mapped = Some(json!([mapping("nvidia.com/gpu", "r")]));
        let gpu_pod = pod(json!({"nvidia.com/gpu": "1"}), mapped);
        assert_eq!(generated_claim(&gpu_pod).as_deref(), Some("ml/train-extended-resources-x"));
        assert!(!is_checked(&pod(json!({"cpu": "1"}), None), RES), "not a GPU pod");
        let mut pending = gpu_pod.clone();
        pending.status.as_mut().unwrap().phase = Some("Pending".into());
        assert!(!is_checked(&pending, RES), "holds nothing yet");
        assert!(is_arriving(&pending, RES), "checked once it runs");
        assert!(!is_arriving(&gpu_pod, RES), "it runs: checked now");
        let mut cpu_pending = pod(json!({"cpu": "1"}), None);
        cpu_pending.status.as_mut().unwrap().phase = Some("Pending".into());
        assert!(!is_arriving(&cpu_pending, RES), "not a GPU pod");
        let mut failed = gpu_pod.clone();
        failed.status.as_mut().unwrap().phase = Some("Failed".into());
        assert!(!is_arriving(&failed, RES) && !is_checked(&failed, RES), "finished");
        let deleted = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
        ));
        let mut deleting = gpu_pod.clone();
        deleting.metadata.deletion_timestamp = deleted.clone();
        assert!(!is_checked(&deleting, RES), "on its way out");
        let mut never_started = pending;
        never_started.metadata.deletion_timestamp = deleted;
        assert!(!is_arriving(&never_started, RES), "deleted before it ran");
        assert_eq!(generated_claim(&pod(json!({"nvidia.com/gpu": "1"}), None)), None);
    }
}
