//! Draining a node: which pods leave (pure), the policy/v1 Eviction body we build ourselves, and
//! the one API call that sends it.
//!
//! The body is a typed `Eviction` with `deleteOptions.gracePeriodSeconds`: kube-core's
//! `EvictParams` serialises its delete options under the wrong key, so a grace period passed
//! that way is silently ignored.

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::Eviction;
use k8s_openapi::api::resource::v1::ResourceClaim;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{DeleteOptions, ObjectMeta};
use kube::api::{Api, PostParams};

use crate::api::v1alpha1::{DrainSpec, PodSelection};
use crate::error::{Error, Result};
use crate::node::state::DrainCounts;

/// Annotation the kubelet puts on mirror pods of static pods; the API cannot evict those.
pub const MIRROR_POD_ANNOTATION: &str = "kubernetes.io/config.mirror";

/// `namespace/name` of a pod, for messages and eviction.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct PodRef {
    pub namespace: String,
    pub name: String,
}

impl std::fmt::Display for PodRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// Up to `max` pods as `ns/name, ...`, with the count of the rest.
pub fn names(pods: &[PodRef], max: usize) -> String {
    let mut s = pods.iter().take(max).map(ToString::to_string).collect::<Vec<_>>().join(", ");
    if pods.len() > max {
        s.push_str(&format!(" and {} more", pods.len() - max));
    }
    s
}

fn pod_ref(p: &Pod) -> PodRef {
    PodRef {
        namespace: p.metadata.namespace.clone().unwrap_or_default(),
        name: p.metadata.name.clone().unwrap_or_default(),
    }
}

/// The drain's verdict on the pods of one node.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Selection {
    pub evict: Vec<PodRef>,
    /// Would be evicted, but use emptyDir and `deleteEmptyDirData` is false.
    pub blocked_by_empty_dir: Vec<PodRef>,
    /// Would be evicted, but no controller manages them and `force` is false.
    pub unmanaged: Vec<PodRef>,
    /// Selected and already terminating: the drain waits for them.
    pub terminating: Vec<PodRef>,
    /// DaemonSet pods that hold the node's device-plugin GPUs ([`gpu_holders_left`]).
    pub daemon_set_gpu_holders: Vec<PodRef>,
    /// Static (mirror) pods that hold them.
    pub static_gpu_holders: Vec<PodRef>,
    /// RollingBack: the pods that hold a device of the migration's driver
    /// ([`driver_device_holders`]).
    pub claim_holders: Vec<PodRef>,
    /// The claim holders whose device is in a pool the rollback's DeviceTaintRule does not select.
    pub claim_holders_out_of_reach: Vec<PodRef>,
}

impl Selection {
    pub fn counts(&self) -> DrainCounts {
        DrainCounts {
            to_evict: self.evict.len(),
            blocked: self.blocked_by_empty_dir.len(),
            terminating: self.terminating.len(),
            unmanaged: self.unmanaged.len(),
            daemon_set_holders: self.daemon_set_gpu_holders.len(),
            static_holders: self.static_gpu_holders.len(),
        }
    }
}

/// True when a container or init container of the pod requests or limits one of `resources`.
pub fn consumes_any(pod: &Pod, resources: &[&str]) -> bool {
    let Some(spec) = pod.spec.as_ref() else {
        return false;
    };
    spec.containers.iter().chain(spec.init_containers.iter().flatten()).any(|c| {
        c.resources.as_ref().is_some_and(|r| {
            [r.requests.as_ref(), r.limits.as_ref()]
                .into_iter()
                .flatten()
                .any(|m| resources.iter().any(|name| m.contains_key(*name)))
        })
    })
}

/// True for pods a DaemonSet controls; a drain leaves them (the backend label moves them).
pub fn is_daemonset_pod(pod: &Pod) -> bool {
    pod.metadata
        .owner_references
        .iter()
        .flatten()
        .any(|o| o.kind == "DaemonSet" && o.controller == Some(true))
}

/// True when the pod belongs to the DaemonSet `namespace/name` (its controller owner) and has not
/// finished: a device plugin's pod still on a node it is leaving.
pub fn owned_by_daemon_set(pod: &Pod, namespace: &str, name: &str) -> bool {
    pod.metadata.namespace.as_deref() == Some(namespace)
        && !is_finished(pod)
        && pod
            .metadata
            .owner_references
            .iter()
            .flatten()
            .any(|o| o.kind == "DaemonSet" && o.name == name && o.controller == Some(true))
}

/// True when no controller manages the pod (no ownerReference with `controller: true`): an
/// eviction deletes it for good.
pub fn is_unmanaged(pod: &Pod) -> bool {
    !pod.metadata.owner_references.iter().flatten().any(|o| o.controller == Some(true))
}

/// True for mirror pods of static pods, which the API cannot evict.
pub fn is_mirror_pod(pod: &Pod) -> bool {
    pod.metadata.annotations.as_ref().is_some_and(|a| a.contains_key(MIRROR_POD_ANNOTATION))
}

/// Succeeded and Failed pods hold no devices and need no eviction.
pub fn is_finished(pod: &Pod) -> bool {
    matches!(pod.status.as_ref().and_then(|s| s.phase.as_deref()), Some("Succeeded" | "Failed"))
}

/// True when the pod mounts an emptyDir volume, whose data an eviction loses.
pub fn uses_empty_dir(pod: &Pod) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.volumes.as_ref())
        .is_some_and(|vs| vs.iter().any(|v| v.empty_dir.is_some()))
}

/// Sorts the pods of one node for a drain. DaemonSet pods and mirror pods are never evicted (the
/// device plugin and the driver are DaemonSets: the label flip moves them).
pub fn select(pods: &[Pod], resources: &[&str], drain: &DrainSpec) -> Selection {
    let mut s = Selection::default();
    for p in pods {
        if is_daemonset_pod(p) || is_mirror_pod(p) || is_finished(p) {
            continue;
        }
        if drain.pod_selection == PodSelection::ResourceConsumers && !consumes_any(p, resources) {
            continue;
        }
        if p.metadata.deletion_timestamp.is_some() {
            s.terminating.push(pod_ref(p));
        } else if is_unmanaged(p) && !drain.force {
            s.unmanaged.push(pod_ref(p));
        } else if uses_empty_dir(p) && !drain.delete_empty_dir_data {
            s.blocked_by_empty_dir.push(pod_ref(p));
        } else {
            s.evict.push(pod_ref(p));
        }
    }
    s.evict.sort();
    s.blocked_by_empty_dir.sort();
    s.unmanaged.sort();
    s.terminating.sort();
    s
}

/// The pods a drain leaves that still hold the node's device-plugin GPUs: DaemonSet and static
/// (mirror) pods that request one of `resources` and were not served through DRA (no
/// `extendedResourceClaimStatus`). Once the driver publishes that GPU the scheduler could hand it
/// out again, so the switch must not finish while any is left. `(daemon set, static)`. Pure.
pub fn gpu_holders_left(pods: &[Pod], resources: &[&str]) -> (Vec<PodRef>, Vec<PodRef>) {
    let holds = |p: &&Pod| {
        !is_finished(p)
            && consumes_any(p, resources)
            && p.status.as_ref().is_none_or(|s| s.extended_resource_claim_status.is_none())
    };
    let mut daemon_set: Vec<PodRef> =
        pods.iter().filter(|p| is_daemonset_pod(p)).filter(holds).map(pod_ref).collect();
    let mut mirror: Vec<PodRef> =
        pods.iter().filter(|p| is_mirror_pod(p)).filter(holds).map(pod_ref).collect();
    daemon_set.sort();
    mirror.sort();
    (daemon_set, mirror)
}

/// The DaemonSet pods of `pods`, sorted: a drain leaves them, so a rollback names or evicts the
/// ones that hold the driver's devices itself. Pure.
pub fn daemon_set_pods(pods: &[Pod]) -> Vec<PodRef> {
    let mut out: Vec<PodRef> = pods.iter().filter(|p| is_daemonset_pod(p)).map(pod_ref).collect();
    out.sort();
    out
}

/// Whether any step of a moving node reads `pod`: one [`select`] could pick, one of the device
/// plugin's DaemonSet `plugin` (`namespace`, `name`), or one that may hold a DRA claim. A node's
/// pods are read through this (`reconcile::observe::node`), so a reconcile of hundreds of moving
/// nodes holds their GPU pods, not every pod they run. Pure.
pub fn read_by_step(pod: &Pod, resources: &[&str], drain: &DrainSpec, plugin: (&str, &str)) -> bool {
    let selectable = !is_daemonset_pod(pod)
        && !is_mirror_pod(pod)
        && !is_finished(pod)
        && (drain.pod_selection != PodSelection::ResourceConsumers || consumes_any(pod, resources));
    let left_holding = (is_daemonset_pod(pod) || is_mirror_pod(pod)) && consumes_any(pod, resources);
    selectable || left_holding || owned_by_daemon_set(pod, plugin.0, plugin.1) || holds_dra_claim(pod)
}

/// True while a pod may still hold a prepared DRA claim: a generated one for an extended
/// resource, or one from `spec.resourceClaims`. Rollback waits until no pod on the node does,
/// since the driver must outlive every claim it prepared.
///
/// A pod being deleted holds its claim until it is gone, even once its phase is terminal: the
/// kubelet removes it only after reclaiming its node resources, claims unprepared included, and a
/// terminal phase can come first (the kubelet's own eviction, a deadline). A finished pod nobody
/// deletes (a completed Job's) was unprepared when the kubelet terminated it.
pub fn holds_dra_claim(pod: &Pod) -> bool {
    if is_finished(pod) && pod.metadata.deletion_timestamp.is_none() {
        return false;
    }
    let generated = pod.status.as_ref().is_some_and(|s| s.extended_resource_claim_status.is_some());
    let explicit = pod.spec.as_ref().and_then(|s| s.resource_claims.as_ref()).is_some_and(|c| !c.is_empty());
    generated || explicit
}

/// The ResourceClaims a pod's status names, as `namespace/name`: its extended-resource claim and
/// the one of each `spec.resourceClaims` entry (the scheduler records them before it binds).
pub fn claim_names(pod: &Pod) -> Vec<String> {
    let ns = pod.metadata.namespace.as_deref().unwrap_or_default();
    let Some(status) = pod.status.as_ref() else { return Vec::new() };
    let extended = status.extended_resource_claim_status.iter().map(|e| e.resource_claim_name.as_str());
    let listed =
        status.resource_claim_statuses.iter().flatten().filter_map(|c| c.resource_claim_name.as_deref());
    extended.chain(listed).map(|name| format!("{ns}/{name}")).collect()
}

/// The devices a read claim is allocated, as `(driver, pool)`, by `namespace/name`; a claim
/// without an allocation has none. What a rollback reads to tell which pods hold its driver's
/// devices.
pub type ClaimDevices = std::collections::HashMap<String, Vec<(String, String)>>;

/// The `(driver, pool)` of each device allocated to `claim`.
pub fn allocated_devices(claim: &ResourceClaim) -> Vec<(String, String)> {
    claim
        .status
        .as_ref()
        .and_then(|s| s.allocation.as_ref())
        .and_then(|a| a.devices.as_ref())
        .and_then(|d| d.results.as_ref())
        .map(|results| results.iter().map(|r| (r.driver.clone(), r.pool.clone())).collect())
        .unwrap_or_default()
}

/// Whether `pod` holds a device of `driver` while it [`holds_dra_claim`] at all: one of its
/// claims, as `claims` read them, is allocated a device of that driver. A claim that was not
/// found is gone and holds nothing. Devices of other drivers (a NIC's) do not count: the
/// rollback's DeviceTaintRule does not evict them, and the device plugin does not need them
/// back. Pure.
pub fn holds_driver_device(pod: &Pod, claims: &ClaimDevices, driver: &str) -> bool {
    holds_dra_claim(pod)
        && claim_names(pod).iter().filter_map(|c| claims.get(c)).flatten().any(|(d, _)| d == driver)
}

/// Whether `pod` is on its way out with claims that no longer name a device: finished or
/// terminating, being deleted, every claim it names deallocated or gone. The claim controller
/// deallocates a terminated pod's claims while the kubelet may still have to unprepare them, and
/// the kubelet keeps the pod until the driver that prepared them answers; a rollback that takes
/// the driver away first leaves the pod stuck in deletion. Which driver prepared them can no longer
/// be read, so any such pod counts, for the seconds until the kubelet has removed it. Pure.
pub fn unpreparing(pod: &Pod, claims: &ClaimDevices) -> bool {
    holds_dra_claim(pod)
        && pod.metadata.deletion_timestamp.is_some()
        && claim_names(pod).iter().all(|c| claims.get(c).is_none_or(Vec::is_empty))
}

/// The pods of `pods` that [`holds_driver_device`], with those whose device is in a pool other
/// than `node` (the rollback's DeviceTaintRule selects the pool named after the node, so it cannot
/// evict them) said apart: `(holders, out of the rule's reach)`.
pub fn driver_device_holders(
    pods: &[Pod],
    claims: &ClaimDevices,
    driver: &str,
    node: &str,
) -> (Vec<PodRef>, Vec<PodRef>) {
    let mut holders = Vec::new();
    let mut unreachable = Vec::new();
    for p in pods.iter().filter(|p| holds_driver_device(p, claims, driver)) {
        let elsewhere = claim_names(p)
            .iter()
            .filter_map(|c| claims.get(c))
            .flatten()
            .any(|(d, pool)| d == driver && pool != node);
        holders.push(pod_ref(p));
        if elsewhere {
            unreachable.push(pod_ref(p));
        }
    }
    (holders, unreachable)
}

/// The policy/v1 Eviction for a pod, with the grace period in `deleteOptions`.
pub fn eviction(pod: &PodRef, grace_period_seconds: Option<i64>) -> Eviction {
    Eviction {
        metadata: ObjectMeta {
            name: Some(pod.name.clone()),
            namespace: Some(pod.namespace.clone()),
            ..Default::default()
        },
        delete_options: grace_period_seconds
            .map(|g| DeleteOptions { grace_period_seconds: Some(g), ..Default::default() }),
    }
}

/// What happened to one eviction request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Evicted {
    /// Accepted: the pod is terminating.
    Yes,
    /// Already gone.
    Gone,
    /// Refused with 429: a PodDisruptionBudget does not allow it now. The message is the
    /// server's, which names the budget.
    Blocked(String),
    /// Refused with 429 for another reason: API priority and fairness throttled the request.
    Throttled(String),
}

/// The eviction API marks a budget refusal with a `DisruptionBudget` cause; a 429 without it is
/// throttling (API priority and fairness, a rate limit in front of the server).
fn refused(s: &kube::core::Status) -> Evicted {
    let causes = s.details.as_ref().map(|d| d.causes.as_slice()).unwrap_or_default();
    let budget = causes.iter().find(|c| c.reason == "DisruptionBudget");
    match budget {
        Some(c) if !c.message.is_empty() => Evicted::Blocked(format!("{} ({})", s.message, c.message)),
        Some(_) => Evicted::Blocked(s.message.clone()),
        None if s.message.contains("disruption budget") => Evicted::Blocked(s.message.clone()),
        None => Evicted::Throttled(s.message.clone()),
    }
}

/// Sends one eviction. 429 is not an error: the caller backs off and reports the budget.
pub async fn evict(client: kube::Client, pod: &PodRef, grace_period_seconds: Option<i64>) -> Result<Evicted> {
    let api: Api<Pod> = Api::namespaced(client, &pod.namespace);
    let body = eviction(pod, grace_period_seconds);
    match api
        .create_subresource::<_, serde_json::Value>("eviction", &pod.name, &PostParams::default(), &body)
        .await
    {
        Ok(_) => Ok(Evicted::Yes),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(Evicted::Gone),
        Err(kube::Error::Api(s)) if s.code == 429 => Ok(refused(&s)),
        Err(source) => {
            Err(Error::EvictPod { namespace: pod.namespace.clone(), name: pod.name.clone(), source })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(name: &str, extra: serde_json::Value) -> Pod {
        // A ReplicaSet's pod unless `extra` says otherwise.
        let mut v = json!({
            "metadata": {"name": name, "namespace": "ml", "ownerReferences": [
                {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs", "uid": "u", "controller": true}]},
            "spec": {"containers": [{"name": "c", "image": "i"}]},
            "status": {"phase": "Running"}
        });
        crate::testing::merge_patch(&mut v, &extra);
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn a_429_is_a_budget_only_with_the_budget_cause() {
        let status = |causes: serde_json::Value, message: &str| -> kube::core::Status {
            serde_json::from_value(json!({"code": 429, "reason": "TooManyRequests", "message": message,
                                          "details": {"causes": causes}}))
            .unwrap()
        };
        let pdb = status(
            json!([{"reason": "DisruptionBudget", "message": "The disruption budget web needs 2 healthy pods and has 2 currently"}]),
            "Cannot evict pod as it would violate the pod's disruption budget.",
        );
        match refused(&pdb) {
            Evicted::Blocked(m) => assert!(m.contains("budget web needs 2"), "{m}"),
            other => panic!("{other:?}"),
        }
        let apf = status(json!([]), "Too many requests, please try again later.");
        assert!(matches!(refused(&apf), Evicted::Throttled(_)));
    }

    #[test]
    fn a_rollback_counts_only_the_pods_that_hold_the_drivers_devices() {
        const DRIVER: &str = "gpu.switchyard.dev";
        let with_claim = |name: &str, claim: &str| {
            pod(
                name,
                json!({"status": {"extendedResourceClaimStatus": {"resourceClaimName": claim, "requestMappings": []}}}),
            )
        };
        let with_listed = |name: &str, claim: &str| {
            pod(
                name,
                json!({"spec": {"resourceClaims": [{"name": "nic", "resourceClaimTemplateName": "nic"}]},
                       "status": {"resourceClaimStatuses": [{"name": "nic", "resourceClaimName": claim}]}}),
            )
        };
        let devices = |driver: &str, pool: &str| vec![(driver.to_string(), pool.to_string())];
        let claims = ClaimDevices::from([
            ("ml/gpu-claim".to_string(), devices(DRIVER, "n1")),
            ("ml/nic-claim".to_string(), devices("nic.example.com", "n1")),
            ("ml/odd-pool".to_string(), devices(DRIVER, "rack-7")),
            ("ml/unallocated".to_string(), vec![]),
        ]);
        let pods = vec![
            with_claim("trainer", "gpu-claim"),
            with_listed("nic-user", "nic-claim"),
            with_claim("claim-gone", "deleted-claim"),
            with_claim("pending", "unallocated"),
            with_listed("other-pool", "odd-pool"),
            pod("cpu-only", json!({})),
        ];
        let (holders, out_of_reach) = driver_device_holders(&pods, &claims, DRIVER, "n1");
        let names = |v: &[PodRef]| v.iter().map(|p| p.name.clone()).collect::<Vec<_>>();
        assert_eq!(names(&holders), ["trainer", "other-pool"]);
        assert_eq!(names(&out_of_reach), ["other-pool"], "the rule selects the pool named after the node");
        // A finished pod nobody deletes was unprepared: it holds nothing, whatever its claim says.
        let done = pod(
            "done",
            json!({"status": {"phase": "Succeeded", "extendedResourceClaimStatus": {"resourceClaimName": "gpu-claim", "requestMappings": []}}}),
        );
        assert!(!holds_driver_device(&done, &claims, DRIVER));
        assert!(!unpreparing(&done, &claims), "nobody deletes it: the kubelet unprepared it");
        assert_eq!(claim_names(&with_listed("x", "c")), ["ml/c"]);
        // Evicted: finished and being deleted, its claim already deallocated by the claim
        // controller while the kubelet may still unprepare it: it holds no device any more, but
        // the driver must stay until the pod is gone.
        let leaving = |claim: &str| {
            pod(
                "leaving",
                json!({"metadata": {"deletionTimestamp": "2026-12-07T13:00:00Z"},
                       "status": {"phase": "Succeeded", "extendedResourceClaimStatus": {"resourceClaimName": claim, "requestMappings": []}}}),
            )
        };
        for claim in ["unallocated", "deleted-claim"] {
            assert!(!holds_driver_device(&leaving(claim), &claims, DRIVER), "{claim}");
            assert!(unpreparing(&leaving(claim), &claims), "{claim}");
        }
        // Still allocated: a holder as before (of this driver), or another driver's pod.
        assert!(holds_driver_device(&leaving("gpu-claim"), &claims, DRIVER));
        assert!(!unpreparing(&leaving("gpu-claim"), &claims));
        assert!(!unpreparing(&with_claim("pending", "unallocated"), &claims), "not being deleted");
    }

    #[test]
    fn daemon_set_and_static_pods_that_hold_device_plugin_gpus_are_found() {
        let ds_owner = json!([{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "dcgm", "uid": "u", "controller": true}]);
        let gpu = |extra: serde_json::Value| {
            let mut v = gpu_limits();
            crate::testing::merge_patch(&mut v, &extra);
            v
        };
        let pods = vec![
            pod("exporter", gpu(json!({"metadata": {"ownerReferences": ds_owner}}))),
            pod("static", gpu(json!({"metadata": {"annotations": {MIRROR_POD_ANNOTATION: "x"}}}))),
            pod(
                "exporter-on-dra",
                gpu(json!({"metadata": {"ownerReferences": ds_owner},
                           "status": {"extendedResourceClaimStatus": {"resourceClaimName": "c", "requestMappings": []}}})),
            ),
            pod("logger", json!({"metadata": {"ownerReferences": ds_owner}})),
            pod(
                "done",
                gpu(json!({"metadata": {"ownerReferences": ds_owner}, "status": {"phase": "Succeeded"}})),
            ),
            pod("trainer", gpu_limits()),
        ];
        let (ds, mirror) = gpu_holders_left(&pods, &["nvidia.com/gpu"]);
        let names = |v: &[PodRef]| v.iter().map(|p| p.name.clone()).collect::<Vec<_>>();
        assert_eq!(
            names(&ds),
            ["exporter"],
            "not the one served through DRA, the one without a GPU, nor a finished one"
        );
        assert_eq!(names(&mirror), ["static"]);
        // The step reads them, or it could not see them.
        let spec = drain(PodSelection::ResourceConsumers, false);
        assert!(read_by_step(&pods[0], &["nvidia.com/gpu"], &spec, ("gpu", "plugin")));
        assert!(read_by_step(&pods[1], &["nvidia.com/gpu"], &spec, ("gpu", "plugin")));
    }

    fn gpu_limits() -> serde_json::Value {
        json!({"spec": {"containers": [{"name": "c", "image": "i", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}})
    }

    fn drain(sel: PodSelection, empty_dir: bool) -> DrainSpec {
        DrainSpec { pod_selection: sel, delete_empty_dir_data: empty_dir, ..Default::default() }
    }

    #[test]
    fn consumes_table() {
        let cases = [
            ("limits", gpu_limits(), true),
            (
                "requests",
                json!({"spec": {"containers": [{"name": "c", "image": "i", "resources": {"requests": {"nvidia.com/mig-1g.10gb": "1"}}}]}}),
                true,
            ),
            (
                "init container",
                json!({"spec": {"initContainers": [{"name": "init", "image": "i", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}),
                true,
            ),
            (
                "other resource",
                json!({"spec": {"containers": [{"name": "c", "image": "i", "resources": {"limits": {"cpu": "1"}}}]}}),
                false,
            ),
            ("nothing", json!({}), false),
        ];
        for (name, extra, want) in cases {
            assert_eq!(
                consumes_any(&pod("p", extra), &["nvidia.com/gpu", "nvidia.com/mig-1g.10gb"]),
                want,
                "{name}"
            );
        }
    }

    /// One pod of each kind a drain tells apart.
    fn sample_pods() -> Vec<Pod> {
        let ds_owner = json!({"metadata": {"ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "dp", "uid": "u", "controller": true}]}});
        vec![
            pod("gpu-a", gpu_limits()),
            pod("cpu-b", json!({})),
            pod("gpu-ds", {
                let mut v = gpu_limits();
                crate::testing::merge_patch(&mut v, &ds_owner);
                v
            }),
            pod("mirror", json!({"metadata": {"annotations": {"kubernetes.io/config.mirror": "x"}}})),
            pod("gpu-done", {
                let mut v = gpu_limits();
                crate::testing::merge_patch(&mut v, &json!({"status": {"phase": "Succeeded"}}));
                v
            }),
            pod("gpu-scratch", {
                let mut v = gpu_limits();
                crate::testing::merge_patch(
                    &mut v,
                    &json!({"spec": {"volumes": [{"name": "s", "emptyDir": {}}]}}),
                );
                v
            }),
            {
                let mut bare = pod("gpu-bare", gpu_limits());
                bare.metadata.owner_references = None;
                bare
            },
            pod("gpu-leaving", {
                let mut v = gpu_limits();
                crate::testing::merge_patch(
                    &mut v,
                    &json!({"metadata": {"deletionTimestamp": "2026-01-01T00:00:00Z"}}),
                );
                v
            }),
        ]
    }

    #[test]
    fn select_table() {
        let pods = sample_pods();
        let names = |v: &[PodRef]| v.iter().map(|p| p.name.clone()).collect::<Vec<_>>();
        // (selection, deleteEmptyDirData, force, evict, blocked, unmanaged, terminating)
        let rc = PodSelection::ResourceConsumers;
        let cases = [
            (rc, false, false, vec!["gpu-a"], vec!["gpu-scratch"], vec!["gpu-bare"], vec!["gpu-leaving"]),
            (rc, true, false, vec!["gpu-a", "gpu-scratch"], vec![], vec!["gpu-bare"], vec!["gpu-leaving"]),
            (rc, false, true, vec!["gpu-a", "gpu-bare"], vec!["gpu-scratch"], vec![], vec!["gpu-leaving"]),
            (
                PodSelection::All,
                false,
                false,
                vec!["cpu-b", "gpu-a"],
                vec!["gpu-scratch"],
                vec!["gpu-bare"],
                vec!["gpu-leaving"],
            ),
        ];
        for (sel, ed, force, evict, blocked, unmanaged, terminating) in cases {
            let spec = DrainSpec { force, ..drain(sel, ed) };
            let s = select(&pods, &["nvidia.com/gpu"], &spec);
            assert_eq!(names(&s.evict), evict, "{sel:?} {ed} {force}");
            assert_eq!(names(&s.blocked_by_empty_dir), blocked, "{sel:?} {ed} {force}");
            assert_eq!(names(&s.unmanaged), unmanaged, "{sel:?} {ed} {force}");
            assert_eq!(names(&s.terminating), terminating, "{sel:?} {ed} {force}");
        }
    }

    #[test]
    fn the_pods_a_step_reads_decide_as_all_the_nodes_pods_do() {
        let plugin = |ns: &str| {
            json!({"metadata": {"namespace": ns, "ownerReferences": [
                {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "nvidia-device-plugin", "uid": "u", "controller": true}]}})
        };
        let mut pods = sample_pods();
        pods.extend([
            pod("plugin", plugin("gpu-operator")),
            pod("plugin-done", {
                let mut v = plugin("gpu-operator");
                crate::testing::merge_patch(&mut v, &json!({"status": {"phase": "Succeeded"}}));
                v
            }),
            pod("same-name-other-namespace", plugin("monitoring")),
            pod("cpu-with-claim", json!({"spec": {"resourceClaims": [{"name": "fpga", "resourceClaimName": "x"}]}})),
            pod(
                "gpu-through-dra",
                json!({"spec": {"containers": [{"name": "c", "image": "i", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
                       "status": {"extendedResourceClaimStatus": {"resourceClaimName": "g", "requestMappings": []}}}),
            ),
            pod(
                "cpu-leaving",
                json!({"metadata": {"deletionTimestamp": "2026-01-01T00:00:00Z"}, "spec": {"terminationGracePeriodSeconds": 5}}),
            ),
        ]);
        let res = ["nvidia.com/gpu"];
        let dp = ("gpu-operator", "nvidia-device-plugin");
        let now: k8s_openapi::jiff::Timestamp = "2025-12-31T23:59:50Z".parse().unwrap();
        for sel in [PodSelection::ResourceConsumers, PodSelection::All] {
            for (ed, force) in [(false, false), (true, false), (false, true), (true, true)] {
                let spec = DrainSpec { force, ..drain(sel, ed) };
                let read: Vec<Pod> =
                    pods.iter().filter(|p| read_by_step(p, &res, &spec, dp)).cloned().collect();
                let case = format!("{sel:?} deleteEmptyDirData={ed} force={force}");
                // Draining: what to evict, and when to look again.
                let (all, kept) = (select(&pods, &res, &spec), select(&read, &res, &spec));
                assert_eq!(all, kept, "{case}");
                let recheck = |ps: &[Pod]| {
                    crate::reconcile::decide::recheck_after(ps, &all.evict, &all.terminating, None, now)
                };
                assert_eq!(recheck(&pods), recheck(&read), "{case}");
                // Switching: the late arrivals, and the device plugin's pods.
                let late = |ps: &[Pod]| -> Vec<Pod> {
                    ps.iter()
                        .filter(|p| {
                            p.status.as_ref().is_none_or(|s| s.extended_resource_claim_status.is_none())
                        })
                        .cloned()
                        .collect()
                };
                assert_eq!(select(&late(&pods), &res, &spec), select(&late(&read), &res, &spec), "{case}");
                let plugin_pods =
                    |ps: &[Pod]| ps.iter().filter(|p| owned_by_daemon_set(p, dp.0, dp.1)).count();
                assert_eq!((plugin_pods(&pods), plugin_pods(&read)), (1, 1), "{case}");
                // Draining and Switching: the DaemonSet and static pods that hold GPUs.
                assert_eq!(gpu_holders_left(&pods, &res), gpu_holders_left(&read, &res), "{case}");
                // RollingBack: the claim holders.
                let holders = |ps: &[Pod]| ps.iter().filter(|p| holds_dra_claim(p)).count();
                assert_eq!((holders(&pods), holders(&read)), (2, 2), "{case}");
                // And something is left out, or the filter saves nothing.
                assert!(read.len() < pods.len(), "{case}: read {} of {}", read.len(), pods.len());
            }
        }
        // Resource consumers only: the CPU pods a drain leaves are not held.
        let spec = drain(PodSelection::ResourceConsumers, false);
        let dropped: Vec<&str> = pods
            .iter()
            .filter(|p| !read_by_step(p, &res, &spec, dp))
            .filter_map(|p| p.metadata.name.as_deref())
            .collect();
        assert_eq!(
            dropped,
            ["cpu-b", "mirror", "gpu-done", "plugin-done", "same-name-other-namespace", "cpu-leaving"]
        );
    }

    #[test]
    fn claim_holders() {
        let generated = pod(
            "g",
            json!({"status": {"extendedResourceClaimStatus": {"resourceClaimName": "g-extended-resources-abc", "requestMappings": [
                {"containerName": "c", "resourceName": "nvidia.com/gpu", "requestName": "container-0-request-0"}]}}}),
        );
        let explicit =
            pod("e", json!({"spec": {"resourceClaims": [{"name": "gpu", "resourceClaimName": "x"}]}}));
        let finished = pod(
            "f",
            json!({"status": {"phase": "Failed", "extendedResourceClaimStatus": {"resourceClaimName": "x", "requestMappings": []}}}),
        );
        let leaving = pod(
            "l",
            json!({"metadata": {"deletionTimestamp": "2026-01-01T00:00:00Z"},
                   "status": {"phase": "Failed", "extendedResourceClaimStatus": {"resourceClaimName": "y", "requestMappings": []}}}),
        );
        assert!(holds_dra_claim(&generated));
        assert!(holds_dra_claim(&explicit));
        assert!(!holds_dra_claim(&finished));
        assert!(holds_dra_claim(&leaving), "a finished pod being deleted holds its claim until it is gone");
        assert!(!holds_dra_claim(&pod("plain", gpu_limits())));
    }

    #[test]
    fn eviction_body_carries_grace_period_in_delete_options() {
        let p = PodRef { namespace: "ml".into(), name: "trainer-0".into() };
        let v = serde_json::to_value(eviction(&p, Some(30))).unwrap();
        assert_eq!(
            v,
            json!({
                "apiVersion": "policy/v1", "kind": "Eviction",
                "metadata": {"name": "trainer-0", "namespace": "ml"},
                "deleteOptions": {"gracePeriodSeconds": 30}
            })
        );
        let v = serde_json::to_value(eviction(&p, None)).unwrap();
        assert!(v.get("deleteOptions").is_none());
    }
}
