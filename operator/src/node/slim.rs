//! The node watch, read into the fields a reconcile reads. The operator caches every node of the
//! cluster, and a node's status changes often (conditions, allocatable, images). Read into `Node`,
//! each LIST page and each watch event allocates the whole node (images, `managedFields`, every
//! condition and annotation: 10 to 20 KiB) and most of it is then freed; at 5,000 nodes that churn
//! leaves the heap fragmented around the parts that are kept. Read into [`SlimNode`], the parser
//! skips what is not kept without allocating it.
//!
//! Kept, and nothing else: the metadata less `managedFields` and less the annotations of others
//! (any label may be in a selector), `spec.unschedulable` and `spec.taints`, the extended resources
//! of `status.capacity` and `status.allocatable`, the allocatable CPU, memory and pod slots, the `Ready` condition's status, and the kubelet's
//! and the runtime's versions. Even trimmed, a `Node` costs about 4 KiB: the struct is 1,552 bytes
//! before anything is set (its status alone 920), and a map of one allocatable resource is a
//! B-tree leaf of eleven. The cache holds every node of the cluster, so each KiB is 5 MiB at 5,000
//! nodes; a [`SlimNode`] keeps the same facts in flat fields.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Node, NodeCondition, Taint};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
use serde::{Deserialize, Deserializer};

use crate::node::resources::{self, Core};
use crate::node::str_map::StrMap;
use crate::well_known::SWITCHYARD_PREFIX;

/// Extended resources and their quantities, sorted by name.
type Resources = Box<[(Box<str>, Quantity)]>;

/// A node as the operator caches and reads it (see the module). It is also the node watch's type,
/// and it reads a `Node`'s JSON: a LIST page or a watch event, and any `Node` through
/// `From<Node>`. Cached nodes are only read, never written back (node writes are merge patches
/// built from scratch), so nothing left out here can be lost on the server.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(from = "Fields")]
pub struct SlimNode {
    /// Without `managedFields`, and without labels and annotations: those are [`SlimNode::labels`]
    /// and [`SlimNode::annotations`].
    pub metadata: ObjectMeta,
    /// `metadata.labels`, interned.
    labels: StrMap,
    /// `metadata.annotations`, only Switchyard's, interned.
    annotations: StrMap,
    /// `spec.unschedulable`.
    pub unschedulable: bool,
    /// `spec.taints`.
    pub taints: Box<[Taint]>,
    /// The extended resources (a name with a domain: the pool's always are) of
    /// `status.allocatable`, without `cpu`, `memory`, `pods` and the like.
    allocatable: Resources,
    /// `cpu`, `memory` and `pods` of `status.allocatable`, as NodeResourcesFit reads them.
    core: Core,
    /// The same of `status.capacity`, only where it differs from allocatable: its readers take the
    /// larger of the two per resource, or the names of both, so a capacity equal to allocatable
    /// says nothing more. Most nodes keep one list instead of two.
    capacity: Option<Resources>,
    /// The `Ready` condition's status (`True`, `False`, `Unknown`); `None` without one.
    ready: Option<Box<str>>,
    /// `status.nodeInfo.kubeletVersion`.
    kubelet_version: Box<str>,
    /// `status.nodeInfo.containerRuntimeVersion`.
    container_runtime_version: Box<str>,
}

impl SlimNode {
    /// `metadata.labels`. (Not `ResourceExt::labels`: `metadata` holds none.)
    pub fn labels(&self) -> &StrMap {
        &self.labels
    }

    /// To set a label on a node built by hand (a test's).
    pub fn labels_mut(&mut self) -> &mut StrMap {
        &mut self.labels
    }

    /// Switchyard's annotations of `metadata.annotations`, the only ones kept.
    pub fn annotations(&self) -> &StrMap {
        &self.annotations
    }

    /// `metadata.name`; empty when unset.
    pub fn name(&self) -> &str {
        self.metadata.name.as_deref().unwrap_or_default()
    }

    /// The `Ready` condition says `True`.
    pub fn is_ready(&self) -> bool {
        self.ready.as_deref() == Some("True")
    }

    /// The extended resources of `status.allocatable`, by name.
    pub fn allocatable(&self) -> impl Iterator<Item = (&str, &Quantity)> {
        self.allocatable.iter().map(|(k, v)| (&**k, v))
    }

    /// The CPU, memory and pod slots of `status.allocatable` (zero where a name is missing, as
    /// the scheduler counts it).
    pub fn core_allocatable(&self) -> Core {
        self.core
    }

    /// The extended resources of `status.capacity`, by name.
    pub fn capacity(&self) -> impl Iterator<Item = (&str, &Quantity)> {
        self.capacity.as_deref().unwrap_or(&self.allocatable).iter().map(|(k, v)| (&**k, v))
    }

    /// `status.nodeInfo.kubeletVersion`; empty when unset.
    pub fn kubelet_version(&self) -> &str {
        &self.kubelet_version
    }

    /// `status.nodeInfo.containerRuntimeVersion`; empty when unset.
    pub fn container_runtime_version(&self) -> &str {
        &self.container_runtime_version
    }
}

impl kube::Resource for SlimNode {
    type DynamicType = ();
    type Scope = <Node as kube::Resource>::Scope;

    fn kind(dt: &()) -> std::borrow::Cow<'_, str> {
        <Node as kube::Resource>::kind(dt)
    }
    fn group(dt: &()) -> std::borrow::Cow<'_, str> {
        <Node as kube::Resource>::group(dt)
    }
    fn version(dt: &()) -> std::borrow::Cow<'_, str> {
        <Node as kube::Resource>::version(dt)
    }
    fn plural(dt: &()) -> std::borrow::Cow<'_, str> {
        <Node as kube::Resource>::plural(dt)
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

/// A node read from the API whole (a GET, or the CLI's LIST), kept as the cache keeps it.
impl From<Node> for SlimNode {
    fn from(node: Node) -> Self {
        let mut metadata = node.metadata;
        metadata.managed_fields = None;
        let labels = metadata.labels.take().map(StrMap::from).unwrap_or_default();
        let annotations = metadata
            .annotations
            .take()
            .unwrap_or_default()
            .into_iter()
            .filter(|(k, _)| switchyard_annotation(k))
            .collect();
        let (spec, status) = (node.spec.unwrap_or_default(), node.status.unwrap_or_default());
        let info = status.node_info.unwrap_or_default();
        assemble(
            metadata,
            labels,
            annotations,
            Spec { unschedulable: spec.unschedulable, taints: spec.taints },
            Status {
                capacity: status.capacity,
                allocatable: status.allocatable,
                conditions: status.conditions,
                node_info: Some(Info {
                    kubelet_version: info.kubelet_version,
                    container_runtime_version: info.container_runtime_version,
                }),
            },
        )
    }
}

#[derive(Default, Deserialize)]
struct Fields {
    #[serde(default)]
    metadata: Meta,
    spec: Option<Spec>,
    status: Option<Status>,
}

/// `ObjectMeta` without `managedFields`, and with only Switchyard's annotations.
#[derive(Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Meta {
    name: Option<String>,
    generate_name: Option<String>,
    namespace: Option<String>,
    uid: Option<String>,
    resource_version: Option<String>,
    self_link: Option<String>,
    generation: Option<i64>,
    creation_timestamp: Option<Time>,
    deletion_timestamp: Option<Time>,
    deletion_grace_period_seconds: Option<i64>,
    #[serde(default)]
    labels: StrMap,
    #[serde(default, deserialize_with = "switchyard_annotations")]
    annotations: StrMap,
    owner_references: Option<Vec<OwnerReference>>,
    finalizers: Option<Vec<String>>,
}

#[derive(Deserialize)]
struct Spec {
    unschedulable: Option<bool>,
    taints: Option<Vec<Taint>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Status {
    capacity: Option<BTreeMap<String, Quantity>>,
    allocatable: Option<BTreeMap<String, Quantity>>,
    conditions: Option<Vec<NodeCondition>>,
    node_info: Option<Info>,
}

#[derive(Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
struct Info {
    kubelet_version: String,
    container_runtime_version: String,
}

/// The extended resources of `m`: a name with a domain.
fn extended(m: Option<BTreeMap<String, Quantity>>) -> Resources {
    m.unwrap_or_default().into_iter().filter(|(k, _)| k.contains('/')).map(|(k, v)| (k.into(), v)).collect()
}

impl From<Fields> for SlimNode {
    fn from(f: Fields) -> Self {
        let m = f.metadata;
        let metadata = ObjectMeta {
            name: m.name,
            generate_name: m.generate_name,
            namespace: m.namespace,
            uid: m.uid,
            resource_version: m.resource_version,
            self_link: m.self_link,
            generation: m.generation,
            creation_timestamp: m.creation_timestamp,
            deletion_timestamp: m.deletion_timestamp,
            deletion_grace_period_seconds: m.deletion_grace_period_seconds,
            labels: None,
            annotations: None,
            owner_references: m.owner_references,
            finalizers: m.finalizers,
            managed_fields: None,
        };
        let spec = f.spec.unwrap_or(Spec { unschedulable: None, taints: None });
        let status = f.status.unwrap_or(Status {
            capacity: None,
            allocatable: None,
            conditions: None,
            node_info: None,
        });
        assemble(metadata, m.labels, m.annotations, spec, status)
    }
}

/// The slim node of `metadata` (already slim, without labels and annotations), the labels and
/// annotations, and what was read of the spec and the status.
fn assemble(
    metadata: ObjectMeta,
    labels: StrMap,
    annotations: StrMap,
    spec: Spec,
    status: Status,
) -> SlimNode {
    let core = resources::allocatable(status.allocatable.iter().flatten().map(|(k, v)| (k.as_str(), v)));
    let allocatable = extended(status.allocatable);
    let capacity = Some(extended(status.capacity)).filter(|c| *c != allocatable);
    let ready = status.conditions.unwrap_or_default().into_iter().find(|c| c.type_ == "Ready");
    let info = status.node_info.unwrap_or_default();
    SlimNode {
        metadata,
        labels,
        annotations,
        unschedulable: spec.unschedulable.unwrap_or(false),
        taints: spec.taints.unwrap_or_default().into(),
        allocatable,
        core,
        capacity,
        ready: ready.map(|c| c.status.into()),
        kubelet_version: info.kubelet_version.into(),
        container_runtime_version: info.container_runtime_version.into(),
    }
}

/// Whether the cache keeps a node annotation: Switchyard's, and the two with which an autoscaler
/// never removes the node (a Replace migration says so of the nodes it leaves for removal).
fn switchyard_annotation(key: &str) -> bool {
    key.starts_with(SWITCHYARD_PREFIX)
        || key == crate::well_known::ANNOTATION_CA_SCALE_DOWN_DISABLED
        || key == crate::well_known::ANNOTATION_KARPENTER_DO_NOT_DISRUPT
}

/// A node's annotations, only those [`switchyard_annotation`] keeps; the values of the others are
/// skipped unread.
fn switchyard_annotations<'de, D: Deserializer<'de>>(d: D) -> Result<StrMap, D::Error> {
    StrMap::deserialize_filtered(d, switchyard_annotation)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const NOW: &str = "2026-12-02T10:00:00Z";

    fn cond(t: &str, s: &str) -> serde_json::Value {
        json!({"type": t, "status": s, "reason": "R", "message": "m", "lastHeartbeatTime": NOW, "lastTransitionTime": NOW})
    }

    /// A node as a kubelet with GPU Feature Discovery leaves it: most of it is never read.
    fn full_node() -> serde_json::Value {
        json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": "gpu-1", "uid": "u-1", "resourceVersion": "42", "creationTimestamp": NOW,
                "generation": 3, "finalizers": ["f"], "deletionTimestamp": NOW, "deletionGracePeriodSeconds": 0,
                "ownerReferences": [{"apiVersion": "v1", "kind": "X", "name": "x", "uid": "ux"}],
                "labels": {"pool": "a100", "nvidia.com/gpu.count": "8"},
                "annotations": {"node.alpha.kubernetes.io/ttl": "0", "switchyard.dev/migration-state": "Draining",
                                "nested.example.com/json": "{\"a\": [1, 2]}", "switchyard.dev/since": "2026-12-02T10:00:00.5Z"},
                "managedFields": [{"manager": "kubelet", "operation": "Update", "fieldsType": "FieldsV1",
                                   "fieldsV1": {"f:status": {"f:conditions": {}}}}]},
            "spec": {"unschedulable": true, "podCIDR": "10.0.0.0/24", "providerID": "aws:///i-1",
                     "taints": [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}]},
            "status": {"allocatable": {"nvidia.com/gpu": "8", "cpu": "32"}, "capacity": {"nvidia.com/gpu": "8", "cpu": "64"},
                       "conditions": [cond("MemoryPressure", "False"), cond("Ready", "True"), cond("DiskPressure", "False")],
                       "addresses": [{"type": "InternalIP", "address": "10.0.0.1"}],
                       "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
                       "nodeInfo": {"kubeletVersion": "v1.37.2", "containerRuntimeVersion": "containerd://2.1",
                                    "architecture": "amd64", "bootID": "b", "kernelVersion": "6.1", "kubeProxyVersion": "",
                                    "machineID": "m", "operatingSystem": "linux", "osImage": "x", "systemUUID": "s"},
                       "images": [{"names": ["registry.example.com/cuda:12"], "sizeBytes": 1}]}
        })
    }

    #[test]
    fn a_slim_node_keeps_what_the_reconcile_reads() {
        let n: SlimNode = serde_json::from_value(full_node()).unwrap();
        assert_eq!(n.name(), "gpu-1");
        assert!(n.metadata.managed_fields.is_none());
        assert_eq!(
            n.labels().to_btree(),
            BTreeMap::from([
                ("pool".to_string(), "a100".to_string()),
                ("nvidia.com/gpu.count".to_string(), "8".to_string())
            ]),
            "any label may be in a selector"
        );
        assert_eq!(
            n.annotations().to_btree(),
            BTreeMap::from([
                ("switchyard.dev/migration-state".to_string(), "Draining".to_string()),
                ("switchyard.dev/since".to_string(), "2026-12-02T10:00:00.5Z".to_string())
            ])
        );
        assert!(n.metadata.labels.is_none() && n.metadata.annotations.is_none(), "kept once, interned");
        assert_eq!(
            (n.metadata.uid.as_deref(), n.metadata.resource_version.as_deref(), n.metadata.generation),
            (Some("u-1"), Some("42"), Some(3))
        );
        assert!(n.metadata.deletion_timestamp.is_some() && n.metadata.owner_references.is_some());
        assert!(n.unschedulable);
        assert_eq!(
            n.taints.iter().map(|t| (t.key.as_str(), t.effect.as_str())).collect::<Vec<_>>(),
            [("nvidia.com/gpu", "NoSchedule")]
        );
        let gpus = |it: &mut dyn Iterator<Item = (&str, &Quantity)>| {
            it.map(|(k, q)| (k.to_string(), q.0.clone())).collect::<Vec<_>>()
        };
        let eight = vec![("nvidia.com/gpu".to_string(), "8".to_string())];
        assert_eq!(gpus(&mut n.allocatable()), eight, "extended resources only");
        assert_eq!(gpus(&mut n.capacity()), eight);
        assert!(n.capacity.is_none(), "no capacity kept where it equals allocatable: {:?}", n.capacity);
        assert!(n.is_ready());
        assert_eq!((n.kubelet_version(), n.container_runtime_version()), ("v1.37.2", "containerd://2.1"));
    }

    #[test]
    fn a_node_read_slim_equals_the_whole_node_made_slim() {
        let cases = [
            full_node(),
            // Nothing optional: no spec, no status, no annotations.
            json!({"metadata": {"name": "bare"}}),
            // Annotations none of which are Switchyard's; a status without conditions or nodeInfo.
            json!({"metadata": {"name": "n", "annotations": {"a": "b"}}, "spec": {}, "status": {"allocatable": {}}}),
            json!({"metadata": {"name": "n", "annotations": null, "labels": null}, "status": {"conditions": []}}),
            // Not ready, and a capacity that differs: the plugin's pod restarts.
            json!({"metadata": {"name": "n"}, "status": {"conditions": [cond("Ready", "Unknown")],
                "capacity": {"nvidia.com/gpu": "8"}, "allocatable": {"nvidia.com/gpu": "0"}}}),
        ];
        for case in cases {
            let slim: SlimNode = serde_json::from_value(case.clone()).unwrap();
            let whole: Node = serde_json::from_value(case.clone()).unwrap();
            assert_eq!(slim, SlimNode::from(whole), "{case}");
        }
        let bare: SlimNode = serde_json::from_value(json!({"metadata": {"name": "bare"}})).unwrap();
        assert!(!bare.is_ready() && !bare.unschedulable && bare.taints.is_empty());
        assert_eq!((bare.allocatable().count(), bare.capacity().count()), (0, 0));
        assert_eq!((bare.kubelet_version(), bare.container_runtime_version()), ("", ""));
    }

    /// What the device plugin's GPUs and the capacity check read of capacity and allocatable.
    #[test]
    fn a_slim_node_counts_the_device_plugins_gpus() {
        let res = ["nvidia.com/gpu", "nvidia.com/mig-1g.10gb"];
        // Status; device-plugin GPUs per resource (the larger of capacity and allocatable);
        // allocatable in all; resources the capacity check finds unmapped when only
        // nvidia.com/gpu is mapped.
        let cases = [
            // At rest: capacity equals allocatable.
            (
                json!({"capacity": {"nvidia.com/gpu": "8", "cpu": "32"}, "allocatable": {"nvidia.com/gpu": "8", "cpu": "31"}}),
                [8, 0],
                8,
                vec![],
            ),
            // The plugin's pod restarts: allocatable drops, capacity stays.
            (
                json!({"capacity": {"nvidia.com/gpu": "8"}, "allocatable": {"nvidia.com/gpu": "0"}}),
                [8, 0],
                0,
                vec![],
            ),
            // A resource in capacity only beside one the plugin serves: an endpoint that stopped
            // (a config that re-partitioned the GPUs), not GPUs, and nothing to map.
            (
                json!({"capacity": {"nvidia.com/mig-1g.10gb": "7"}, "allocatable": {"nvidia.com/gpu": "1"}}),
                [1, 0],
                1,
                vec![],
            ),
            // In capacity only, with nothing served: the plugin restarting, so still its GPUs.
            (json!({"capacity": {"nvidia.com/mig-1g.10gb": "7"}}), [0, 7], 0, vec!["nvidia.com/mig-1g.10gb"]),
            (json!({"allocatable": {"nvidia.com/gpu": "2"}}), [2, 0], 2, vec![]),
            (json!({"capacity": {"nvidia.com/gpu": "2"}}), [2, 0], 0, vec![]),
            // Not whole numbers: no GPUs, though the check still sees a resource it cannot map.
            (
                json!({"allocatable": {"nvidia.com/gpu": "1.5", "nvidia.com/mig-1g.10gb": "x"}}),
                [0, 0],
                0,
                vec!["nvidia.com/mig-1g.10gb"],
            ),
            (json!({}), [0, 0], 0, vec![]),
        ];
        for (status, dp, alloc, unmapped) in cases {
            let n: SlimNode =
                serde_json::from_value(json!({"metadata": {"name": "n"}, "status": status})).unwrap();
            let got = crate::pool::overlap::device_plugin_gpus(&n, &res);
            assert_eq!([got[res[0]], got[res[1]]], dp, "{status}");
            assert_eq!(crate::pool::overlap::allocatable_total(&n, &res), alloc, "{status}");
            let check = crate::pool::capacity::check([&n], &res[..1], &[], None, 1);
            assert_eq!(check.unmapped.keys().map(String::as_str).collect::<Vec<_>>(), unmapped, "{status}");
        }
    }

    #[test]
    fn a_node_list_and_a_watch_event_read_into_slim_nodes() {
        let list: kube::core::ObjectList<SlimNode> = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "NodeList", "metadata": {"resourceVersion": "7"},
            "items": [{"metadata": {"name": "a", "annotations": {"x": "y", "switchyard.dev/migration": "m"}}},
                      {"metadata": {"name": "b"}}]
        }))
        .unwrap();
        let names: Vec<_> = list.items.iter().map(SlimNode::name).collect();
        assert_eq!(names, ["a", "b"]);
        assert_eq!(
            list.items[0].annotations().to_btree(),
            BTreeMap::from([("switchyard.dev/migration".to_string(), "m".to_string())])
        );
        let ev: kube::core::WatchEvent<SlimNode> = serde_json::from_value(json!({
            "type": "MODIFIED", "object": {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "a"},
                "status": {"allocatable": {"nvidia.com/gpu": "0"}}}
        }))
        .unwrap();
        let kube::core::WatchEvent::Modified(n) = ev else { panic!("modified") };
        assert_eq!(n.allocatable().collect::<Vec<_>>(), [("nvidia.com/gpu", &Quantity("0".into()))]);
    }
}
