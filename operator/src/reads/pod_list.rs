//! Paged LISTs of every bound pod in the cluster, read into the few fields a drain judges a pod
//! by. At 50,000 pods the LIST is the largest read the operator and `switchyard plan` make: read
//! into `Pod`, every field of every pod is allocated (a few KiB a pod) and freed again; read
//! into [`PodFields`], the parser skips the rest of each pod without allocating it.
//!
//! What is kept is what [`crate::node::drain`] and [`crate::pool::preview`] read: the pod's
//! namespace, name, uid, resourceVersion (where the pod watch resumes), labels
//! (PodDisruptionBudget selectors), the mirror-pod annotation, owner references,
//! deletion timestamp; its node, termination grace period, its containers' and init containers'
//! names and resources, its volumes' names and emptyDir, its resource claims, its nodeSelector,
//! required node affinity and tolerations (where a Replace migration may move it); its phase and
//! extended-resource claim status, and why each of its containers that waits to start waits. A pod made by [`PodFields::into_pod`] has nothing else set.
//! The drain's own per-node LIST ([`list_node`]) and the GPU-pod watch (`cache::pods`) read pods
//! the same way. Pages are asked for in the API server's protobuf encoding and read into the same
//! fields (`pod_list::proto`); the watch reads JSON.

use std::collections::BTreeMap;

use http_body_util::BodyExt;
use k8s_openapi::api::core::v1::{
    Affinity, Container, ContainerState, ContainerStateWaiting, ContainerStatus, EmptyDirVolumeSource,
    NodeAffinity, NodeSelector, Pod, PodExtendedResourceClaimStatus, PodResourceClaim, PodSpec, PodStatus,
    ResourceRequirements, Toleration, Volume,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ListMeta, ObjectMeta, OwnerReference, Time};
use kube::Client;
use kube::api::ListParams;
use kube::core::Request;
use serde::Deserialize;

use crate::node::drain::MIRROR_POD_ANNOTATION;

mod proto;

/// A page of a pod LIST, as [`list_page`] reads it.
#[derive(Deserialize)]
pub struct PodPage {
    #[serde(default)]
    pub metadata: ListMeta,
    #[serde(default)]
    pub items: Vec<PodFields>,
}

/// The fields of a pod a drain reads (see the module).
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
pub struct PodFields {
    #[serde(default)]
    metadata: Meta,
    #[serde(default)]
    spec: Option<Spec>,
    #[serde(default)]
    status: Option<Status>,
}

#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
struct Meta {
    name: Option<String>,
    namespace: Option<String>,
    uid: Option<String>,
    resource_version: Option<String>,
    labels: Option<BTreeMap<String, String>>,
    annotations: Option<BTreeMap<String, String>>,
    owner_references: Option<Vec<OwnerReference>>,
    deletion_timestamp: Option<Time>,
}

#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
struct Spec {
    node_name: Option<String>,
    termination_grace_period_seconds: Option<i64>,
    #[serde(default)]
    containers: Vec<ContainerFields>,
    init_containers: Option<Vec<ContainerFields>>,
    volumes: Option<Vec<VolumeFields>>,
    resource_claims: Option<Vec<PodResourceClaim>>,
    node_selector: Option<BTreeMap<String, String>>,
    affinity: Option<AffinityFields>,
    /// Without the defaults every pod gets ([`is_default_toleration`]).
    #[serde(default, deserialize_with = "placing_tolerations")]
    tolerations: Option<Vec<Toleration>>,
}

/// A pod's tolerations less [`is_default_toleration`]'s; `None` when none is left.
fn placing_tolerations<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Vec<Toleration>>, D::Error> {
    let all: Option<Vec<Toleration>> = Deserialize::deserialize(d)?;
    Ok(without_defaults(all.unwrap_or_default()))
}

/// `tolerations` less [`is_default_toleration`]'s; `None` when none is left.
fn without_defaults(mut tolerations: Vec<Toleration>) -> Option<Vec<Toleration>> {
    tolerations.retain(|t| !is_default_toleration(t));
    (!tolerations.is_empty()).then_some(tolerations)
}

/// Of a pod's affinity, what a Replace migration's placement check reads: the required node
/// affinity.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
struct AffinityFields {
    node_affinity: Option<NodeAffinityFields>,
}

#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
struct NodeAffinityFields {
    required_during_scheduling_ignored_during_execution: Option<NodeSelector>,
}

#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
struct ContainerFields {
    #[serde(default)]
    name: String,
    resources: Option<ResourceRequirements>,
}

#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
struct VolumeFields {
    #[serde(default)]
    name: String,
    empty_dir: Option<EmptyDirVolumeSource>,
}

#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
struct Status {
    phase: Option<String>,
    extended_resource_claim_status: Option<PodExtendedResourceClaimStatus>,
    /// Only the containers that wait, and only why: what [`crate::node::verify::cannot_start`]
    /// reads of a pod bound to a migrated node that never starts.
    #[serde(default, deserialize_with = "waiting_containers")]
    container_statuses: Option<Vec<ContainerWaiting>>,
}

/// A container that waits to start, and why (its `state.waiting`).
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
struct ContainerWaiting {
    #[serde(default)]
    name: String,
    #[serde(default)]
    state: Option<WaitingState>,
}

#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
struct WaitingState {
    waiting: Option<ContainerStateWaiting>,
}

/// A pod's container statuses, only those that wait; `None` when none does.
fn waiting_containers<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Option<Vec<ContainerWaiting>>, D::Error> {
    let all: Option<Vec<ContainerWaiting>> = Deserialize::deserialize(d)?;
    Ok(only_waiting(all.unwrap_or_default()))
}

/// `containers` less those that do not wait; `None` when none is left.
fn only_waiting(mut containers: Vec<ContainerWaiting>) -> Option<Vec<ContainerWaiting>> {
    containers.retain(|c| c.state.as_ref().is_some_and(|s| s.waiting.is_some()));
    (!containers.is_empty()).then_some(containers)
}

impl PodFields {
    /// The node the pod is bound to.
    pub fn node_name(&self) -> Option<&str> {
        self.spec.as_ref().and_then(|s| s.node_name.as_deref())
    }

    /// Whether the kubelet reports that a container of this pod cannot start
    /// ([`crate::node::verify::cannot_start`]'s reasons), read without building the `Pod`.
    pub fn cannot_start(&self) -> bool {
        self.metadata.deletion_timestamp.is_none()
            && self.status.as_ref().is_some_and(|s| {
                s.container_statuses.iter().flatten().any(|c| {
                    c.state
                        .as_ref()
                        .and_then(|st| st.waiting.as_ref())
                        .and_then(|w| w.reason.as_deref())
                        .is_some_and(|r| crate::node::verify::CANNOT_START.contains(&r))
                })
            })
    }

    /// Drops what the operator's steps never read of a pod it caches: its labels (only
    /// `switchyard plan` matches PodDisruptionBudgets by them), its annotations other than the
    /// mirror-pod one, and its volumes other than emptyDir ones (each pod's service-account token
    /// volume among them).
    pub fn trim_for_cache(&mut self) {
        self.metadata.labels = None;
        if let Some(a) = self.metadata.annotations.as_mut() {
            a.retain(|k, _| k == MIRROR_POD_ANNOTATION);
        }
        if self.metadata.annotations.as_ref().is_some_and(BTreeMap::is_empty) {
            self.metadata.annotations = None;
        }
        if let Some(spec) = self.spec.as_mut() {
            if let Some(vs) = spec.volumes.as_mut() {
                vs.retain(|v| v.empty_dir.is_some());
            }
            if spec.volumes.as_ref().is_some_and(Vec::is_empty) {
                spec.volumes = None;
            }
            if spec.affinity.as_ref().is_some_and(|a| {
                a.node_affinity
                    .as_ref()
                    .is_none_or(|n| n.required_during_scheduling_ignored_during_execution.is_none())
            }) {
                spec.affinity = None;
            }
        }
    }

    /// The metadata a store keys the pod by: its name, namespace and resourceVersion.
    pub fn key_meta(&self) -> ObjectMeta {
        ObjectMeta {
            name: self.metadata.name.clone(),
            namespace: self.metadata.namespace.clone(),
            resource_version: self.metadata.resource_version.clone(),
            ..Default::default()
        }
    }

    /// The pod with these fields and nothing else.
    pub fn into_pod(self) -> Pod {
        let Meta {
            name,
            namespace,
            uid,
            resource_version,
            labels,
            annotations,
            owner_references,
            deletion_timestamp,
        } = self.metadata;
        let annotations = annotations
            .map(|a| a.into_iter().filter(|(k, _)| k == MIRROR_POD_ANNOTATION).collect::<BTreeMap<_, _>>())
            .filter(|a| !a.is_empty());
        let container =
            |c: ContainerFields| Container { name: c.name, resources: c.resources, ..Default::default() };
        Pod {
            metadata: ObjectMeta {
                name,
                namespace,
                uid,
                resource_version,
                labels,
                annotations,
                owner_references,
                deletion_timestamp,
                ..Default::default()
            },
            spec: self.spec.map(|s| PodSpec {
                node_name: s.node_name,
                termination_grace_period_seconds: s.termination_grace_period_seconds,
                containers: s.containers.into_iter().map(container).collect(),
                init_containers: s.init_containers.map(|cs| cs.into_iter().map(container).collect()),
                volumes: s.volumes.map(|vs| {
                    vs.into_iter()
                        .map(|v| Volume { name: v.name, empty_dir: v.empty_dir, ..Default::default() })
                        .collect()
                }),
                resource_claims: s.resource_claims,
                node_selector: s.node_selector,
                affinity: s.affinity.map(|a| Affinity {
                    node_affinity: a.node_affinity.map(|n| NodeAffinity {
                        required_during_scheduling_ignored_during_execution: n
                            .required_during_scheduling_ignored_during_execution,
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                tolerations: s.tolerations,
                ..Default::default()
            }),
            status: self.status.map(|s| PodStatus {
                phase: s.phase,
                extended_resource_claim_status: s.extended_resource_claim_status,
                container_statuses: s.container_statuses.map(|cs| {
                    cs.into_iter()
                        .map(|c| ContainerStatus {
                            name: c.name,
                            state: Some(ContainerState {
                                waiting: c.state.and_then(|s| s.waiting),
                                ..Default::default()
                            }),
                            ..Default::default()
                        })
                        .collect()
                }),
                ..Default::default()
            }),
        }
    }
}

/// The NoExecute tolerations of `node.kubernetes.io/not-ready` and `unreachable` the API server's
/// DefaultTolerationSeconds admission adds to every pod: they matter only on a NotReady node,
/// where no judgement places a pod, so they are not kept.
fn is_default_toleration(t: &Toleration) -> bool {
    matches!(t.key.as_deref(), Some("node.kubernetes.io/not-ready" | "node.kubernetes.io/unreachable"))
        && t.effect.as_deref() == Some("NoExecute")
        && t.operator.as_deref() == Some("Exists")
}

/// One page of a cluster-wide pod LIST with `lp` (its field selector, limit and continue token),
/// asked for in protobuf (`proto`: a quarter of the bytes, and far less of the API server's
/// time than JSON); a JSON answer is read as JSON.
pub async fn list_page(client: &Client, lp: &ListParams) -> Result<PodPage, kube::Error> {
    let mut request = Request::new("/api/v1/pods").list(lp).map_err(kube::Error::BuildRequest)?;
    request.headers_mut().insert(http::header::ACCEPT, http::HeaderValue::from_static(ACCEPT));
    let response = client.send(request.map(kube::client::Body::from)).await?;
    let code = response.status();
    let protobuf = response
        .headers()
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|t| t.starts_with(proto::MEDIA_TYPE));
    let body = response.into_body().collect().await?.to_bytes();
    read_page(code, protobuf, &body)
}

/// What a pod LIST asks for: protobuf, else JSON.
const ACCEPT: &str = "application/vnd.kubernetes.protobuf, application/json;q=0.9";

/// A pod LIST's answer: its page, or the API's error (a `Status` in either encoding, else the
/// body as the message, as the client reads other errors).
fn read_page(code: http::StatusCode, protobuf: bool, body: &[u8]) -> Result<PodPage, kube::Error> {
    let unreadable = |reason: &str| {
        kube::Error::Api(
            kube::core::Status::failure(String::from_utf8_lossy(body).trim(), reason)
                .with_code(code.as_u16())
                .boxed(),
        )
    };
    if code.is_client_error() || code.is_server_error() {
        let status = if protobuf {
            proto::status(body).ok()
        } else {
            serde_json::from_slice::<kube::core::Status>(body).ok()
        };
        return Err(
            status.map_or_else(|| unreadable("Failed to parse error data"), |s| kube::Error::Api(s.boxed()))
        );
    }
    if protobuf {
        proto::page(body).map_err(|e| kube::Error::Service(Box::new(e)))
    } else {
        serde_json::from_slice(body).map_err(kube::Error::SerdeError)
    }
}

/// Every pod bound to `node`, with the fields a drain reads.
pub async fn list_node(client: &Client, node: &str) -> Result<Vec<Pod>, kube::Error> {
    let lp = ListParams::default().fields(&format!("spec.nodeName={node}"));
    Ok(list_page(client, &lp).await?.items.into_iter().map(PodFields::into_pod).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A pod as the API server returns it, with the fields a drain never reads.
    fn served_pod() -> serde_json::Value {
        json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {
                "name": "train-0", "namespace": "ml", "uid": "u-1", "resourceVersion": "42",
                "labels": {"app": "train"},
                "annotations": {"kubernetes.io/config.mirror": "x", "other": "y"},
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "train-abc",
                                     "uid": "rs-1", "controller": true}],
                "deletionTimestamp": "2026-12-02T10:00:00Z",
                "managedFields": [{"manager": "kubelet", "operation": "Update"}]
            },
            "spec": {
                "nodeName": "gpu-1", "schedulerName": "default-scheduler", "terminationGracePeriodSeconds": 45,
                "tolerations": [
                    {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
                    {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
                ],
                "nodeSelector": {"pool": "a"},
                "affinity": {
                    "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["x"]}]}]}},
                    "podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                        {"topologyKey": "kubernetes.io/hostname", "labelSelector": {"matchLabels": {"app": "train"}}}]}
                },
                "containers": [{"name": "main", "image": "cuda:12", "command": ["python"],
                                "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
                "initContainers": [{"name": "fetch", "image": "busybox", "resources": {"requests": {"cpu": "1"}}}],
                "volumes": [{"name": "scratch", "emptyDir": {}},
                            {"name": "token", "projected": {"sources": [{"serviceAccountToken": {"path": "token"}}]}}],
                "resourceClaims": [{"name": "gpu", "resourceClaimName": "c-1"}]
            },
            "status": {
                "phase": "Running", "podIP": "10.0.0.5",
                "conditions": [{"type": "Ready", "status": "True"}],
                "containerStatuses": [{"name": "main", "ready": true, "restartCount": 0, "image": "cuda:12", "imageID": ""}],
                "extendedResourceClaimStatus": {"resourceClaimName": "train-0-extended-resources-x",
                    "requestMappings": [{"containerName": "main", "resourceName": "nvidia.com/gpu", "requestName": "container-0-request-0"}]}
            }
        })
    }

    #[test]
    fn a_pod_read_into_its_fields_keeps_what_a_drain_reads_and_drops_the_rest() {
        let fields: PodFields = serde_json::from_value(served_pod()).unwrap();
        assert_eq!(fields.node_name(), Some("gpu-1"));
        let got = fields.into_pod();
        let full: Pod = serde_json::from_value(served_pod()).unwrap();

        let (m, fm) = (&got.metadata, &full.metadata);
        assert_eq!(
            (&m.name, &m.namespace, &m.uid, &m.labels),
            (&fm.name, &fm.namespace, &fm.uid, &fm.labels)
        );
        assert_eq!(
            (&m.owner_references, &m.deletion_timestamp),
            (&fm.owner_references, &fm.deletion_timestamp)
        );
        assert_eq!(
            m.annotations,
            Some(BTreeMap::from([(MIRROR_POD_ANNOTATION.to_string(), "x".to_string())])),
            "only the mirror-pod annotation"
        );
        assert_eq!(m.resource_version, fm.resource_version, "the pod watch resumes from it");
        assert!(m.managed_fields.is_none());

        let (s, fs) = (got.spec.as_ref().unwrap(), full.spec.as_ref().unwrap());
        assert_eq!(s.node_name, fs.node_name);
        assert_eq!(s.termination_grace_period_seconds, Some(45), "the drain's recheck reads it");
        assert_eq!(s.resource_claims, fs.resource_claims);
        assert_eq!(s.containers[0].resources, fs.containers[0].resources);
        assert_eq!(
            s.init_containers.as_ref().unwrap()[0].resources,
            fs.init_containers.as_ref().unwrap()[0].resources
        );
        assert!(s.containers[0].image.is_none() && s.scheduler_name.is_none());
        // Where a Replace migration may move it: the default NoExecute toleration goes.
        assert_eq!(s.tolerations, Some(vec![fs.tolerations.as_ref().unwrap()[1].clone()]));
        assert_eq!(s.node_selector, fs.node_selector);
        let node_affinity = |s: &PodSpec| s.affinity.as_ref().and_then(|a| a.node_affinity.clone());
        assert_eq!(node_affinity(s), node_affinity(fs));
        assert!(s.affinity.as_ref().unwrap().pod_anti_affinity.is_none());
        let volumes = s.volumes.as_ref().unwrap();
        assert_eq!(
            volumes.iter().map(|v| (v.name.as_str(), v.empty_dir.is_some())).collect::<Vec<_>>(),
            [("scratch", true), ("token", false)]
        );
        assert!(volumes[1].projected.is_none());

        let (st, fst) = (got.status.as_ref().unwrap(), full.status.as_ref().unwrap());
        assert_eq!(
            (&st.phase, &st.extended_resource_claim_status),
            (&fst.phase, &fst.extended_resource_claim_status)
        );
        assert!(st.conditions.is_none() && st.container_statuses.is_none() && st.pod_ip.is_none());
    }

    /// Every judgement of `drain` and of the plan's preview comes out the same on the fields as on
    /// the whole pod.
    #[test]
    fn drain_judges_the_fields_as_it_judges_the_whole_pod() {
        use crate::node::drain;
        let variants = [
            served_pod(),
            json!({"metadata": {"name": "bare", "namespace": "ml"}, "spec": {"nodeName": "n", "containers": [{"name": "c"}]},
                   "status": {"phase": "Succeeded"}}),
            json!({"metadata": {"name": "ds", "namespace": "gpu",
                                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "plugin", "uid": "d", "controller": true}]},
                   "spec": {"nodeName": "n", "containers": [{"name": "c", "resources": {"requests": {"nvidia.com/gpu": "1"}}}]},
                   "status": {"phase": "Running"}}),
            json!({"metadata": {"name": "empty"}}),
        ];
        for v in variants {
            let full: Pod = serde_json::from_value(v.clone()).unwrap();
            let slim = serde_json::from_value::<PodFields>(v).unwrap().into_pod();
            let res = ["nvidia.com/gpu"];
            assert_eq!(drain::consumes_any(&slim, &res), drain::consumes_any(&full, &res));
            assert_eq!(drain::is_daemonset_pod(&slim), drain::is_daemonset_pod(&full));
            assert_eq!(
                drain::owned_by_daemon_set(&slim, "gpu", "plugin"),
                drain::owned_by_daemon_set(&full, "gpu", "plugin")
            );
            assert_eq!(drain::is_unmanaged(&slim), drain::is_unmanaged(&full));
            assert_eq!(drain::is_mirror_pod(&slim), drain::is_mirror_pod(&full));
            assert_eq!(drain::is_finished(&slim), drain::is_finished(&full));
            assert_eq!(drain::uses_empty_dir(&slim), drain::uses_empty_dir(&full));
            assert_eq!(drain::holds_dra_claim(&slim), drain::holds_dra_claim(&full));
            let policy = crate::api::v1alpha1::DrainSpec {
                pod_selection: crate::api::v1alpha1::PodSelection::All,
                ..Default::default()
            };
            let (sel_slim, sel_full) = (
                drain::select(std::slice::from_ref(&slim), &res, &policy),
                drain::select(std::slice::from_ref(&full), &res, &policy),
            );
            assert_eq!(sel_slim, sel_full);
            let now = "2026-12-02T09:59:00Z".parse().unwrap();
            let recheck = |p: &Pod| {
                crate::reconcile::decide::recheck_after(
                    std::slice::from_ref(p),
                    &sel_full.evict,
                    &sel_full.terminating,
                    None,
                    now,
                )
            };
            assert_eq!(recheck(&slim), recheck(&full));
        }
    }

    /// A failed LIST is the API's error whatever its encoding: the Status's code, reason and
    /// message when the body is one, else the HTTP code with the body as the message.
    #[test]
    fn a_failed_list_reads_as_the_api_error_in_either_encoding() {
        let code = |e: kube::Error| match e {
            kube::Error::Api(s) => (s.code, s.reason, s.message),
            other => panic!("not an API error: {other}"),
        };
        let bad = http::StatusCode::BAD_REQUEST;
        let pb = read_page(bad, true, include_bytes!("../../testdata/status-bad-request.pb")).err().unwrap();
        let (c, reason, message) = code(pb);
        assert_eq!((c, reason.as_str()), (400, "BadRequest"));
        assert!(message.contains("spec.bogus"), "{message}");
        let json = serde_json::to_vec(&json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
            "message": "pods is forbidden", "reason": "Forbidden", "code": 403}))
        .unwrap();
        let (c, reason, _) = code(read_page(http::StatusCode::FORBIDDEN, false, &json).err().unwrap());
        assert_eq!((c, reason.as_str()), (403, "Forbidden"));
        let (c, _, message) =
            code(read_page(http::StatusCode::BAD_GATEWAY, false, b"upstream went away\n").err().unwrap());
        assert_eq!((c, message.as_str()), (502, "upstream went away"));
        // A success whose body is not what its content type says is an error, not an empty page.
        assert!(read_page(http::StatusCode::OK, true, b"{}").is_err());
        assert!(read_page(http::StatusCode::OK, false, b"k8s\0").is_err());
    }

    #[test]
    fn a_page_reads_its_continue_token_and_items() {
        let page: PodPage = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "PodList",
            "metadata": {"resourceVersion": "9", "continue": "tok"},
            "items": [served_pod()]
        }))
        .unwrap();
        assert_eq!(page.metadata.continue_.as_deref(), Some("tok"));
        assert_eq!(page.items.len(), 1);
    }
}
