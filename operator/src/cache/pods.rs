//! The GPU-pod cache: one watch of the cluster's bound pods, of which it keeps the few that a
//! step or a check can read when a drain selects GPU consumers ([`watched`]). It replaces the pod
//! LISTs a node made in each moving state (evict, wait until they are gone, look for late pods
//! before the switch completes) and the paged LISTs of every bound pod behind the candidates'
//! order and the check of migrated nodes' pods: at 10% of 1,000 nodes those were 3.4 requests a
//! node, the largest share of what a node cost the API server.
//!
//! What it keeps: a pod that requests or limits an extended resource (a name with a domain, as
//! every device-plugin resource has), unless it has finished, and a pod that may hold a DRA claim
//! ([`drain::holds_dra_claim`]). Every GPU consumer of every migration is such a pod, whatever
//! its `spec.resources`, so the cache does not depend on which migrations exist. A pod's JSON is
//! read into the fields a drain judges ([`PodFields`]); the rest of every watch event is skipped
//! by the parser, and a pod the cache does not keep is dropped as its event arrives.
//!
//! What it does not serve, and the reads that stay LISTs of the node's pods:
//! - a drain with `podSelection: All`, which moves every movable pod;
//! - a switch whose driver has no device-plugin interlock, which waits for the device plugin's
//!   own pod to leave (a DaemonSet pod that holds no GPU).
//!
//! Freshness is a LIST's made a few milliseconds earlier (see the parent module): the operator
//! writes no pod, it only evicts them, and an eviction's outcome (a deletion timestamp, then a
//! deleted pod) arrives as the pod's watch events. A step that reads a copy from before one of its
//! evictions landed evicts the pod again, which the API answers as it answered the first.

use std::collections::HashMap;
use std::sync::Arc;

use futures::{Stream, TryStreamExt};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::runtime::reflector::{self, Store, store::Writer};
use kube::runtime::watcher::{self, Event};
use serde::Deserialize;

use crate::node::drain;
use crate::reads::pod_list::PodFields;

/// The field selector of the pod watch: bound pods only (a pod no node runs holds no device).
pub const BOUND: &str = "spec.nodeName!=";

/// A pod as the watch reads and the cache holds it: the fields a drain judges as they were parsed
/// ([`PodFields`], less what no step reads: [`PodFields::trim_for_cache`]), and the metadata the
/// store keys it by. A `Pod` is mostly empty structs (a `PodSpec` is 1,488 bytes before anything is
/// set, a `Container` 2,336, a `Volume` 3,280): built from the parsed fields it takes about 10 KiB,
/// several times what the fields do. A step reads the `Pod` ([`WatchedPod::pod`]), built for the
/// nodes it reads.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(from = "PodFields")]
pub struct WatchedPod {
    /// Name, namespace and resourceVersion.
    metadata: ObjectMeta,
    fields: PodFields,
}

impl From<PodFields> for WatchedPod {
    fn from(mut fields: PodFields) -> Self {
        fields.trim_for_cache();
        WatchedPod { metadata: fields.key_meta(), fields }
    }
}

impl WatchedPod {
    /// The pod, as a step reads it ([`PodFields::into_pod`]).
    pub fn pod(&self) -> Pod {
        self.fields.clone().into_pod()
    }

    /// The node the pod is bound to.
    pub fn node_name(&self) -> Option<&str> {
        self.fields.node_name()
    }

    /// Whether the kubelet reports that a container of the pod cannot start.
    pub fn cannot_start(&self) -> bool {
        self.fields.cannot_start()
    }
}

impl kube::Resource for WatchedPod {
    type DynamicType = ();
    type Scope = <Pod as kube::Resource>::Scope;

    fn kind(dt: &()) -> std::borrow::Cow<'_, str> {
        <Pod as kube::Resource>::kind(dt)
    }
    fn group(dt: &()) -> std::borrow::Cow<'_, str> {
        <Pod as kube::Resource>::group(dt)
    }
    fn version(dt: &()) -> std::borrow::Cow<'_, str> {
        <Pod as kube::Resource>::version(dt)
    }
    fn plural(dt: &()) -> std::borrow::Cow<'_, str> {
        <Pod as kube::Resource>::plural(dt)
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

/// Whether the cache keeps `pod` (see the module). Pure.
pub fn watched(pod: &Pod) -> bool {
    drain::holds_dra_claim(pod) || (!drain::is_finished(pod) && requests_extended(pod))
}

/// Whether a container or init container of `pod` requests or limits an extended resource: a
/// resource name with a domain (`nvidia.com/gpu`), where `cpu`, `memory`, `ephemeral-storage` and
/// `hugepages-*` have none.
fn requests_extended(pod: &Pod) -> bool {
    let Some(spec) = pod.spec.as_ref() else { return false };
    spec.containers.iter().chain(spec.init_containers.iter().flatten()).any(|c| {
        c.resources.as_ref().is_some_and(|r| {
            [r.requests.as_ref(), r.limits.as_ref()]
                .into_iter()
                .flatten()
                .any(|m| m.keys().any(|k| k.contains('/')))
        })
    })
}

/// A watch event as the cache applies it: a pod it does not keep is never added, and one that
/// stops being kept (it finished) is removed. `None`: nothing to apply. Pure.
pub fn kept(event: Event<WatchedPod>) -> Option<Event<WatchedPod>> {
    match event {
        Event::InitApply(p) if !watched(&p.pod()) => None,
        Event::Apply(p) if !watched(&p.pod()) => Some(Event::Delete(p)),
        e => Some(e),
    }
}

/// The pod watch as the controller consumes it: each event through [`kept`], then applied to the
/// GPU-pod store. Only a pod leaving the cache, or one that cannot start, triggers a reconcile
/// ([`triggering`]); the other steps
/// that wait on pods come back on their own (an eviction's grace period, a terminating pod's), as
/// they did when they listed them.
pub fn gpu_pod_reflector(
    writer: Writer<WatchedPod>,
    events: impl Stream<Item = watcher::Result<Event<WatchedPod>>> + Send + 'static,
) -> impl Stream<Item = watcher::Result<Event<WatchedPod>>> + Send + 'static {
    reflector::reflector(writer, events.try_filter_map(|e| futures::future::ready(Ok(kept(e)))))
}

/// The pods that leave the cache, out of its events ([`kept`]): deleted, or finished (every
/// container stopped, so the pod holds no device; the kubelet deletes it a moment later). What a
/// drain and a canary wait for: such a pod wakes the migration of its node at once (the
/// controller's pod mapper), so a drain ends when its last pod has stopped and a verification when
/// its canary has finished, not at the recheck after a grace period (which stays, for the pods the
/// cache does not hold: `podSelection: All`) or the next requeue. An update of a pod the cache
/// never held comes through too; the mapper wakes only the migrations of nodes in those steps.
///
/// And a pod whose container the kubelet cannot start ([`WatchedPod::cannot_start`]): bound to a
/// migrated node, it is one the migration reports (`CannotStart`), at once rather than at its next
/// requeue. Such a pod's status changes only as the kubelet retries it.
pub fn triggering(
    events: impl Stream<Item = watcher::Result<Event<WatchedPod>>> + Send + 'static,
) -> impl Stream<Item = watcher::Result<WatchedPod>> + Send + 'static {
    events.try_filter_map(|e| {
        futures::future::ready(Ok(match e {
            Event::Delete(pod) => Some(pod),
            Event::Apply(pod) if pod.cannot_start() => Some(pod),
            _ => None,
        }))
    })
}

/// The cached pods by the node they are bound to: grouped once per reconcile, so each node's read
/// is a lookup.
#[derive(Clone, Debug, Default)]
pub struct PodsByNode(HashMap<String, Vec<Arc<WatchedPod>>>);

impl PodsByNode {
    /// Groups the cache's pods by node.
    pub fn of(store: &Store<WatchedPod>) -> Self {
        Self::from_pods(store.state())
    }

    /// The cache's pods bound to `node` alone: one node's read, without grouping the rest.
    pub fn of_node(store: &Store<WatchedPod>, node: &str) -> Self {
        Self::from_pods(store.state().into_iter().filter(|p| p.node_name() == Some(node)))
    }

    /// Groups `pods` by node. Pure.
    pub fn from_pods(pods: impl IntoIterator<Item = Arc<WatchedPod>>) -> Self {
        let mut by_node: HashMap<String, Vec<Arc<WatchedPod>>> = HashMap::new();
        for p in pods {
            if let Some(node) = p.node_name() {
                by_node.entry(node.to_owned()).or_default().push(p);
            }
        }
        Self(by_node)
    }

    /// The pods bound to `node`, in no particular order.
    pub fn on(&self, node: &str) -> impl Iterator<Item = Pod> + '_ {
        self.0.get(node).into_iter().flatten().map(|p| p.pod())
    }

    /// The cached pods bound to `node` whose container the kubelet cannot start, without building
    /// each `Pod`.
    pub fn cannot_start_on(&self, node: &str) -> impl Iterator<Item = &WatchedPod> + '_ {
        self.0.get(node).into_iter().flatten().filter(|p| p.cannot_start()).map(|p| p.as_ref())
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::api::v1alpha1::{DrainSpec, PodSelection};

    fn pod(v: serde_json::Value) -> Pod {
        serde_json::from_value::<WatchedPod>(v).unwrap().pod()
    }

    fn gpu(phase: &str) -> serde_json::Value {
        json!({"metadata": {"name": "train", "namespace": "ml", "resourceVersion": "7"},
               "spec": {"nodeName": "n1", "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
               "status": {"phase": phase}})
    }

    /// Pods of every kind a node runs: what a step reads of each must be in the cache.
    fn zoo() -> Vec<Pod> {
        let owner = |kind: &str, name: &str| json!([{"apiVersion": "apps/v1", "kind": kind, "name": name, "uid": "o", "controller": true}]);
        let res = |r: serde_json::Value| json!([{"name": "c", "resources": r}]);
        let gpu = res(json!({"limits": {"nvidia.com/gpu": "1"}}));
        let mig = res(json!({"requests": {"nvidia.com/mig-1g.10gb": "1"}}));
        let cpu = res(
            json!({"requests": {"cpu": "1", "memory": "1Gi", "hugepages-2Mi": "1Gi", "ephemeral-storage": "1Gi"}}),
        );
        let claim = json!({"resourceClaimName": "c-1", "requests": [{"requestName": "r", "resourceClaimName": "c-1"}]});
        let gone = "2026-12-05T00:00:00Z";
        let cases = [
            json!({"metadata": {"name": "gpu", "ownerReferences": owner("ReplicaSet", "rs")}, "spec": {"containers": gpu}, "status": {"phase": "Running"}}),
            json!({"metadata": {"name": "mig-init"}, "spec": {"containers": cpu, "initContainers": mig}, "status": {"phase": "Pending"}}),
            json!({"metadata": {"name": "cpu", "ownerReferences": owner("ReplicaSet", "rs")}, "spec": {"containers": cpu}, "status": {"phase": "Running"}}),
            json!({"metadata": {"name": "bare-cpu"}, "spec": {"containers": cpu, "volumes": [{"name": "v", "emptyDir": {}}]}, "status": {"phase": "Running"}}),
            json!({"metadata": {"name": "plugin", "namespace": "gpu", "ownerReferences": owner("DaemonSet", "plugin")}, "spec": {"containers": cpu}, "status": {"phase": "Running"}}),
            json!({"metadata": {"name": "ds-gpu", "ownerReferences": owner("DaemonSet", "dcgm")}, "spec": {"containers": gpu}, "status": {"phase": "Running"}}),
            json!({"metadata": {"name": "static", "annotations": {drain::MIRROR_POD_ANNOTATION: "x"}}, "spec": {"containers": gpu}, "status": {"phase": "Running"}}),
            json!({"metadata": {"name": "done"}, "spec": {"containers": gpu}, "status": {"phase": "Succeeded"}}),
            json!({"metadata": {"name": "failed-going", "deletionTimestamp": gone}, "spec": {"containers": gpu}, "status": {"phase": "Failed", "extendedResourceClaimStatus": claim}}),
            json!({"metadata": {"name": "generated"}, "spec": {"containers": gpu}, "status": {"phase": "Running", "extendedResourceClaimStatus": claim}}),
            json!({"metadata": {"name": "explicit"}, "spec": {"containers": cpu, "resourceClaims": [{"name": "r", "resourceClaimName": "c-2"}]}, "status": {"phase": "Running"}}),
            json!({"metadata": {"name": "terminating", "deletionTimestamp": gone}, "spec": {"containers": gpu}, "status": {"phase": "Running"}}),
            json!({"metadata": {"name": "nic"}, "spec": {"containers": res(json!({"limits": {"nvidia.com/hostdev": "1"}}))}, "status": {"phase": "Running"}}),
        ];
        cases
            .into_iter()
            .map(|mut c| {
                c["metadata"]["namespace"] = json!("ml");
                c["spec"]["nodeName"] = json!("n1");
                pod(c)
            })
            .collect()
    }

    #[test]
    fn every_pod_a_step_or_check_reads_when_a_drain_moves_gpu_consumers_is_cached() {
        let resources = ["nvidia.com/gpu", "nvidia.com/mig-1g.10gb"];
        let drain = DrainSpec { pod_selection: PodSelection::ResourceConsumers, ..Default::default() };
        let plugin = ("gpu", "plugin");
        let mut read = Vec::new();
        for p in zoo() {
            let name = p.metadata.name.clone().unwrap();
            // The device plugin's own pod is read only by a switch without the interlock, which
            // lists the node's pods.
            let plugin_only =
                drain::owned_by_daemon_set(&p, plugin.0, plugin.1) && !drain::consumes_any(&p, &resources);
            let by_step = drain::read_by_step(&p, &resources, &drain, plugin) && !plugin_only;
            let by_check = crate::node::verify::is_checked(&p, &resources);
            let counted =
                !drain::is_finished(&p) && drain::consumes_any(&p, &resources) || drain::holds_dra_claim(&p);
            if by_step || by_check || counted {
                assert!(watched(&p), "{name} is read, so it must be cached");
                read.push(name);
            }
        }
        assert_eq!(
            read,
            ["gpu", "mig-init", "ds-gpu", "static", "failed-going", "generated", "explicit", "terminating"],
            "the fixture covers every way a pod is read"
        );
        let kept: Vec<String> = zoo().into_iter().filter(watched).map(|p| p.metadata.name.unwrap()).collect();
        // Beyond those, only a pod of another extended resource: bounded by the node's devices.
        assert_eq!(
            kept,
            [
                "gpu",
                "mig-init",
                "ds-gpu",
                "static",
                "failed-going",
                "generated",
                "explicit",
                "terminating",
                "nic"
            ]
        );
    }

    #[test]
    fn a_pod_that_finishes_leaves_the_cache_and_one_never_kept_is_never_added() {
        let (store, mut writer) = reflector::store::<WatchedPod>();
        let watched = |v| serde_json::from_value::<WatchedPod>(v).unwrap();
        let running = watched(gpu("Running"));
        let cpu_only = watched(json!({"metadata": {"name": "web", "namespace": "ml"},
            "spec": {"nodeName": "n1", "containers": [{"name": "c"}]}, "status": {"phase": "Running"}}));
        for e in [
            Event::Init,
            Event::InitApply(running.clone()),
            Event::InitApply(cpu_only.clone()),
            Event::InitDone,
        ] {
            if let Some(e) = kept(e) {
                writer.apply_watcher_event(&e);
            }
        }
        let names = |s: &Store<WatchedPod>| {
            let mut n: Vec<String> = s.state().iter().map(|p| p.metadata.name.clone().unwrap()).collect();
            n.sort();
            n
        };
        assert_eq!(names(&store), ["train"]);
        assert_eq!(store.state()[0].metadata.resource_version.as_deref(), Some("7"), "resumable");

        for e in [Event::Apply(cpu_only), Event::Apply(watched(gpu("Succeeded")))] {
            if let Some(e) = kept(e) {
                writer.apply_watcher_event(&e);
            }
        }
        assert!(names(&store).is_empty(), "finished, so gone; the CPU pod never came in");
        assert!(matches!(kept(Event::Apply(running.clone())), Some(Event::Apply(p)) if p == running));
    }

    #[test]
    fn a_cached_pod_keeps_what_a_step_reads_and_not_its_labels_or_other_volumes() {
        let with = |volumes: serde_json::Value| {
            let mut v = gpu("Running");
            v["spec"]["volumes"] = volumes;
            v["metadata"]["labels"] = json!({"app": "train"});
            v["metadata"]["annotations"] =
                json!({drain::MIRROR_POD_ANNOTATION: "x", "prometheus.io/scrape": "true"});
            serde_json::from_value::<WatchedPod>(v).unwrap().pod()
        };
        let token = json!({"name": "kube-api-access-x", "projected": {"sources": [{"serviceAccountToken": {"path": "token"}}]}});
        let scratch = json!({"name": "scratch", "emptyDir": {"sizeLimit": "1Gi"}});
        let both = with(json!([token.clone(), scratch]));
        let names: Vec<&str> =
            both.spec.as_ref().unwrap().volumes.iter().flatten().map(|v| v.name.as_str()).collect();
        assert_eq!(names, ["scratch"]);
        assert!(drain::uses_empty_dir(&both), "what a drain judges is kept");
        let token_only = with(json!([token]));
        assert_eq!(token_only.spec.as_ref().unwrap().volumes, None);
        assert!(!drain::uses_empty_dir(&token_only));
        assert_eq!(both.metadata.resource_version.as_deref(), Some("7"));
        assert_eq!(both.metadata.labels, None);
        assert!(drain::is_mirror_pod(&both), "the mirror-pod annotation is kept");
        assert_eq!(both.metadata.annotations.as_ref().map(|a| a.len()), Some(1));
    }

    #[test]
    fn pods_are_grouped_by_their_node() {
        let on = |name: &str, node: &str| {
            let mut v = gpu("Running");
            v["metadata"]["name"] = json!(name);
            v["spec"]["nodeName"] = json!(node);
            Arc::new(serde_json::from_value::<WatchedPod>(v).unwrap())
        };
        let by_node = PodsByNode::from_pods([on("a", "n1"), on("b", "n2"), on("c", "n1")]);
        let names = |n: &str| {
            let mut v: Vec<String> = by_node.on(n).map(|p| p.metadata.name.unwrap()).collect();
            v.sort();
            v
        };
        assert_eq!(names("n1"), ["a", "c"]);
        assert_eq!(names("n2"), ["b"]);
        assert!(names("n3").is_empty());
    }
}
