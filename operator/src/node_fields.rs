//! The node watch, read into the fields a reconcile reads. The operator caches every node of the
//! cluster, and a node's status changes often (conditions, allocatable, images). Read into `Node`,
//! each LIST page and each watch event allocates the whole node (images, `managedFields`, every
//! condition and annotation: 10 to 20 KiB) and [`crate::cache::trim_node`] then frees most of it;
//! at 5,000 nodes that churn leaves the heap fragmented around the parts that are kept. Read into
//! [`SlimNode`], the parser skips what is not kept without allocating it, and the node it makes is
//! exactly what `trim_node` would have left (a unit test holds the two equal).

use std::collections::BTreeMap;
use std::fmt;

use k8s_openapi::api::core::v1::{Node, NodeCondition, NodeSpec, NodeStatus, NodeSystemInfo, Taint};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
use kube::runtime::watcher;
use serde::de::{IgnoredAny, MapAccess, Visitor};
use serde::{Deserialize, Deserializer};

use crate::cache::{SWITCHYARD_PREFIX, keep_read_status};

/// A node as the node watch reads it: the kept fields (see [`crate::cache::trim_node`]) in a
/// `Node`, nothing else set. The watch's type; the store holds the `Node`.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(from = "Fields")]
pub struct SlimNode(pub Node);

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
        &self.0.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.0.metadata
    }
}

/// A watch event of [`SlimNode`]s as one of the `Node`s they hold.
pub fn into_nodes(e: watcher::Event<SlimNode>) -> watcher::Event<Node> {
    use watcher::Event as E;
    match e {
        E::Apply(n) => E::Apply(n.0),
        E::Delete(n) => E::Delete(n.0),
        E::InitApply(n) => E::InitApply(n.0),
        E::Init => E::Init,
        E::InitDone => E::InitDone,
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
    labels: Option<BTreeMap<String, String>>,
    #[serde(default, deserialize_with = "switchyard_annotations")]
    annotations: Option<BTreeMap<String, String>>,
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

impl From<Fields> for SlimNode {
    fn from(f: Fields) -> Self {
        let m = f.metadata;
        SlimNode(Node {
            metadata: ObjectMeta {
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
                labels: m.labels,
                annotations: m.annotations,
                owner_references: m.owner_references,
                finalizers: m.finalizers,
                // As `cache::trim` leaves it.
                managed_fields: Some(Vec::new()),
            },
            spec: f.spec.map(|s| NodeSpec {
                unschedulable: s.unschedulable,
                taints: s.taints,
                ..Default::default()
            }),
            status: f.status.map(|s| {
                let mut status = NodeStatus {
                    capacity: s.capacity,
                    allocatable: s.allocatable,
                    conditions: s.conditions,
                    node_info: s.node_info.map(|i| NodeSystemInfo {
                        kubelet_version: i.kubelet_version,
                        container_runtime_version: i.container_runtime_version,
                        ..Default::default()
                    }),
                    ..Default::default()
                };
                keep_read_status(&mut status);
                status
            }),
        })
    }
}

/// A node's annotations, only those under Switchyard's prefix kept; the values of the others are
/// skipped unread.
fn switchyard_annotations<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<Option<BTreeMap<String, String>>, D::Error> {
    struct Own;
    impl<'de> Visitor<'de> for Own {
        type Value = Option<BTreeMap<String, String>>;
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("a map of annotations or null")
        }
        fn visit_none<E>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_unit<E>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
            d.deserialize_map(self)
        }
        fn visit_map<M: MapAccess<'de>>(self, mut m: M) -> Result<Self::Value, M::Error> {
            let mut kept = BTreeMap::new();
            while let Some(k) = m.next_key::<String>()? {
                if k.starts_with(SWITCHYARD_PREFIX) {
                    kept.insert(k, m.next_value::<String>()?);
                } else {
                    m.next_value::<IgnoredAny>()?;
                }
            }
            Ok(Some(kept))
        }
    }
    d.deserialize_option(Own)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::trim_node;
    use serde_json::json;

    fn node(v: serde_json::Value) -> (SlimNode, Node) {
        let text = v.to_string();
        let slim: SlimNode = serde_json::from_str(&text).unwrap();
        let mut full: Node = serde_json::from_str(&text).unwrap();
        trim_node(&mut full);
        (slim, full)
    }

    #[test]
    fn a_slim_node_is_exactly_what_trim_node_leaves() {
        let now = "2026-12-02T10:00:00Z";
        let cond = |t: &str, s: &str| json!({"type": t, "status": s, "reason": "R", "message": "m", "lastHeartbeatTime": now, "lastTransitionTime": now});
        let cases = [
            json!({
                "apiVersion": "v1", "kind": "Node",
                "metadata": {"name": "gpu-1", "uid": "u-1", "resourceVersion": "42", "creationTimestamp": now,
                    "generation": 3, "finalizers": ["f"], "deletionTimestamp": now, "deletionGracePeriodSeconds": 0,
                    "ownerReferences": [{"apiVersion": "v1", "kind": "X", "name": "x", "uid": "ux"}],
                    "labels": {"pool": "a100", "nvidia.com/gpu.count": "8"},
                    "annotations": {"node.alpha.kubernetes.io/ttl": "0", "switchyard.dev/migration-state": "Draining",
                                    "nested.example.com/json": "{\"a\": [1, 2]}", "switchyard.dev/since": "2026-12-02T10:00:00.5Z"},
                    "managedFields": [{"manager": "kubelet", "operation": "Update", "fieldsType": "FieldsV1",
                                       "fieldsV1": {"f:status": {"f:conditions": {}}}}]},
                "spec": {"unschedulable": true, "podCIDR": "10.0.0.0/24", "providerID": "aws:///i-1",
                         "taints": [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}]},
                "status": {"allocatable": {"nvidia.com/gpu": "8", "cpu": "32"}, "capacity": {"nvidia.com/gpu": "8"},
                           "conditions": [cond("MemoryPressure", "False"), cond("Ready", "True"), cond("DiskPressure", "False")],
                           "addresses": [{"type": "InternalIP", "address": "10.0.0.1"}],
                           "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
                           "nodeInfo": {"kubeletVersion": "v1.37.2", "containerRuntimeVersion": "containerd://2.1",
                                        "architecture": "amd64", "bootID": "b", "kernelVersion": "6.1", "kubeProxyVersion": "",
                                        "machineID": "m", "operatingSystem": "linux", "osImage": "x", "systemUUID": "s"},
                           "images": [{"names": ["registry.example.com/cuda:12"], "sizeBytes": 1}]}
            }),
            // Nothing optional: no spec, no status, no annotations.
            json!({"metadata": {"name": "bare"}}),
            // Annotations none of which are Switchyard's; a status without conditions or nodeInfo.
            json!({"metadata": {"name": "n", "annotations": {"a": "b"}}, "spec": {}, "status": {"allocatable": {}}}),
            json!({"metadata": {"name": "n", "annotations": null, "labels": null}, "status": {"conditions": []}}),
        ];
        for case in cases {
            let (slim, full) = node(case.clone());
            assert_eq!(slim.0, full, "{case}");
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
        let names: Vec<_> = list.items.iter().map(|n| n.0.metadata.name.as_deref().unwrap()).collect();
        assert_eq!(names, ["a", "b"]);
        assert_eq!(
            list.items[0].0.metadata.annotations,
            Some(BTreeMap::from([("switchyard.dev/migration".to_string(), "m".to_string())]))
        );
        let ev: kube::core::WatchEvent<SlimNode> = serde_json::from_value(json!({
            "type": "MODIFIED", "object": {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "a"},
                "status": {"allocatable": {"nvidia.com/gpu": "0"}}}
        }))
        .unwrap();
        let kube::core::WatchEvent::Modified(n) = ev else { panic!("modified") };
        let alloc = n.0.status.unwrap().allocatable.unwrap();
        assert_eq!(alloc.get("nvidia.com/gpu"), Some(&Quantity("0".into())));
    }
}
