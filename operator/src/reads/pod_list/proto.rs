//! Pod LIST pages in the API server's protobuf encoding, read into the same [`PodFields`] as the
//! JSON ones.
//!
//! Why: at 50,000 pods a cluster-wide LIST is the API server's largest piece of work for the
//! operator and `switchyard plan`. Measured on the e2e control plane with 10,000 simulated pods
//! and a 1,000-node pool, a page of 500 pods is 3.9 MB of JSON and 1.2 MB of protobuf, and the
//! whole LIST took 7.0 s as JSON and 1.7 s as protobuf, most of it the server's encoding. Every
//! core kind is served as protobuf; the reader asks for it and takes JSON when the answer is JSON.
//!
//! The messages below declare only the fields a drain reads (see the parent module), with the
//! field numbers of `k8s.io/api/core/v1/generated.proto` and
//! `k8s.io/apimachinery/pkg/apis/meta/v1/generated.proto`; the decoder skips every other field
//! without allocating it. A response is the 4-byte magic `k8s\0` and a `runtime.Unknown` whose
//! `raw` is the encoded object. The test reads a PodList the e2e API server encoded both ways.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    ContainerExtendedResourceRequest, ContainerStateWaiting, EmptyDirVolumeSource, NodeSelector,
    NodeSelectorRequirement, NodeSelectorTerm, PodExtendedResourceClaimStatus, PodResourceClaim,
    ResourceClaim, ResourceRequirements, Toleration,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ListMeta, OwnerReference, Time};
use prost::Message;

use super::{
    AffinityFields, ContainerFields, ContainerWaiting, Meta, NodeAffinityFields, PodFields, PodPage, Spec,
    Status, VolumeFields, WaitingState,
};

/// The media type of the API server's protobuf encoding.
pub const MEDIA_TYPE: &str = "application/vnd.kubernetes.protobuf";

/// The magic number before every protobuf-encoded object.
const MAGIC: &[u8] = b"k8s\0";

/// Why a body could not be read as a protobuf object.
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    #[error("the body does not start with the protobuf magic number")]
    NoMagic,
    #[error("the envelope is a {kind:?}, not a {expected}")]
    Kind { kind: String, expected: &'static str },
    #[error("the body is not valid protobuf: {0}")]
    Protobuf(#[from] prost::DecodeError),
}

/// A page of a pod LIST, from its protobuf body.
pub fn page(body: &[u8]) -> Result<PodPage, DecodeError> {
    let raw = unwrap(body, "PodList")?;
    let list = PodList::decode(raw.as_slice())?;
    Ok(PodPage {
        metadata: ListMeta { continue_: list.metadata.and_then(|m| m.continue_), ..Default::default() },
        items: list.items.into_iter().map(PodFields::from).collect(),
    })
}

/// The `Status` of a failed request, from its protobuf body.
pub fn status(body: &[u8]) -> Result<kube::core::Status, DecodeError> {
    let s = StatusMessage::decode(unwrap(body, "Status")?.as_slice())?;
    let mut status = kube::core::Status::failure(
        s.message.as_deref().unwrap_or_default(),
        s.reason.as_deref().unwrap_or_default(),
    );
    status.code = s.code.and_then(|c| u16::try_from(c).ok()).unwrap_or_default();
    Ok(status)
}

/// The encoded object inside the envelope, checked to be a `kind`.
fn unwrap(body: &[u8], kind: &'static str) -> Result<Vec<u8>, DecodeError> {
    let envelope = body.strip_prefix(MAGIC).ok_or(DecodeError::NoMagic)?;
    let unknown = Unknown::decode(envelope)?;
    let got = unknown.type_meta.and_then(|t| t.kind).unwrap_or_default();
    if got != kind {
        return Err(DecodeError::Kind { kind: got, expected: kind });
    }
    Ok(unknown.raw.unwrap_or_default())
}

#[derive(Clone, PartialEq, Message)]
struct Unknown {
    #[prost(message, optional, tag = "1")]
    type_meta: Option<TypeMeta>,
    #[prost(bytes = "vec", optional, tag = "2")]
    raw: Option<Vec<u8>>,
}

#[derive(Clone, PartialEq, Message)]
struct TypeMeta {
    #[prost(string, optional, tag = "2")]
    kind: Option<String>,
}

#[derive(Clone, PartialEq, Message)]
struct StatusMessage {
    #[prost(string, optional, tag = "3")]
    message: Option<String>,
    #[prost(string, optional, tag = "4")]
    reason: Option<String>,
    #[prost(int32, optional, tag = "6")]
    code: Option<i32>,
}

#[derive(Clone, PartialEq, Message)]
struct PodList {
    #[prost(message, optional, tag = "1")]
    metadata: Option<ListMetaMessage>,
    #[prost(message, repeated, tag = "2")]
    items: Vec<PodMessage>,
}

#[derive(Clone, PartialEq, Message)]
struct ListMetaMessage {
    #[prost(string, optional, tag = "3")]
    continue_: Option<String>,
}

#[derive(Clone, PartialEq, Message)]
struct PodMessage {
    #[prost(message, optional, tag = "1")]
    metadata: Option<ObjectMeta>,
    #[prost(message, optional, tag = "2")]
    spec: Option<PodSpec>,
    #[prost(message, optional, tag = "3")]
    status: Option<PodStatus>,
}

#[derive(Clone, PartialEq, Message)]
struct ObjectMeta {
    #[prost(string, optional, tag = "1")]
    name: Option<String>,
    #[prost(string, optional, tag = "3")]
    namespace: Option<String>,
    #[prost(string, optional, tag = "5")]
    uid: Option<String>,
    #[prost(string, optional, tag = "6")]
    resource_version: Option<String>,
    #[prost(message, optional, tag = "9")]
    deletion_timestamp: Option<TimeMessage>,
    #[prost(btree_map = "string, string", tag = "11")]
    labels: BTreeMap<String, String>,
    #[prost(btree_map = "string, string", tag = "12")]
    annotations: BTreeMap<String, String>,
    #[prost(message, repeated, tag = "13")]
    owner_references: Vec<OwnerReferenceMessage>,
}

#[derive(Clone, PartialEq, Message)]
struct TimeMessage {
    #[prost(int64, optional, tag = "1")]
    seconds: Option<i64>,
    #[prost(int32, optional, tag = "2")]
    nanos: Option<i32>,
}

#[derive(Clone, PartialEq, Message)]
struct OwnerReferenceMessage {
    #[prost(string, optional, tag = "1")]
    kind: Option<String>,
    #[prost(string, optional, tag = "3")]
    name: Option<String>,
    #[prost(string, optional, tag = "4")]
    uid: Option<String>,
    #[prost(string, optional, tag = "5")]
    api_version: Option<String>,
    #[prost(bool, optional, tag = "6")]
    controller: Option<bool>,
    #[prost(bool, optional, tag = "7")]
    block_owner_deletion: Option<bool>,
}

#[derive(Clone, PartialEq, Message)]
struct PodSpec {
    #[prost(message, repeated, tag = "1")]
    volumes: Vec<VolumeMessage>,
    #[prost(message, repeated, tag = "2")]
    containers: Vec<ContainerMessage>,
    #[prost(int64, optional, tag = "4")]
    termination_grace_period_seconds: Option<i64>,
    #[prost(string, optional, tag = "10")]
    node_name: Option<String>,
    #[prost(message, repeated, tag = "20")]
    init_containers: Vec<ContainerMessage>,
    #[prost(message, repeated, tag = "39")]
    resource_claims: Vec<PodResourceClaimMessage>,
    #[prost(btree_map = "string, string", tag = "7")]
    node_selector: BTreeMap<String, String>,
    #[prost(message, optional, tag = "18")]
    affinity: Option<AffinityMessage>,
    #[prost(message, repeated, tag = "22")]
    tolerations: Vec<TolerationMessage>,
}

#[derive(Clone, PartialEq, Message)]
struct AffinityMessage {
    #[prost(message, optional, tag = "1")]
    node_affinity: Option<NodeAffinityMessage>,
}

#[derive(Clone, PartialEq, Message)]
struct NodeAffinityMessage {
    #[prost(message, optional, tag = "1")]
    required: Option<NodeSelectorMessage>,
}

#[derive(Clone, PartialEq, Message)]
struct NodeSelectorMessage {
    #[prost(message, repeated, tag = "1")]
    terms: Vec<NodeSelectorTermMessage>,
}

#[derive(Clone, PartialEq, Message)]
struct NodeSelectorTermMessage {
    #[prost(message, repeated, tag = "1")]
    match_expressions: Vec<RequirementMessage>,
    #[prost(message, repeated, tag = "2")]
    match_fields: Vec<RequirementMessage>,
}

#[derive(Clone, PartialEq, Message)]
struct RequirementMessage {
    #[prost(string, optional, tag = "1")]
    key: Option<String>,
    #[prost(string, optional, tag = "2")]
    operator: Option<String>,
    #[prost(string, repeated, tag = "3")]
    values: Vec<String>,
}

#[derive(Clone, PartialEq, Message)]
struct TolerationMessage {
    #[prost(string, optional, tag = "1")]
    key: Option<String>,
    #[prost(string, optional, tag = "2")]
    operator: Option<String>,
    #[prost(string, optional, tag = "3")]
    value: Option<String>,
    #[prost(string, optional, tag = "4")]
    effect: Option<String>,
    #[prost(int64, optional, tag = "5")]
    toleration_seconds: Option<i64>,
}

#[derive(Clone, PartialEq, Message)]
struct ContainerMessage {
    #[prost(string, optional, tag = "1")]
    name: Option<String>,
    #[prost(message, optional, tag = "8")]
    resources: Option<ResourceRequirementsMessage>,
}

#[derive(Clone, PartialEq, Message)]
struct ResourceRequirementsMessage {
    #[prost(btree_map = "string, message", tag = "1")]
    limits: BTreeMap<String, QuantityMessage>,
    #[prost(btree_map = "string, message", tag = "2")]
    requests: BTreeMap<String, QuantityMessage>,
    #[prost(message, repeated, tag = "3")]
    claims: Vec<ResourceClaimMessage>,
}

#[derive(Clone, PartialEq, Message)]
struct QuantityMessage {
    #[prost(string, optional, tag = "1")]
    string: Option<String>,
}

#[derive(Clone, PartialEq, Message)]
struct ResourceClaimMessage {
    #[prost(string, optional, tag = "1")]
    name: Option<String>,
    #[prost(string, optional, tag = "2")]
    request: Option<String>,
}

#[derive(Clone, PartialEq, Message)]
struct VolumeMessage {
    #[prost(string, optional, tag = "1")]
    name: Option<String>,
    #[prost(message, optional, tag = "2")]
    source: Option<VolumeSource>,
}

#[derive(Clone, PartialEq, Message)]
struct VolumeSource {
    #[prost(message, optional, tag = "2")]
    empty_dir: Option<EmptyDirMessage>,
}

#[derive(Clone, PartialEq, Message)]
struct EmptyDirMessage {
    #[prost(string, optional, tag = "1")]
    medium: Option<String>,
    #[prost(message, optional, tag = "2")]
    size_limit: Option<QuantityMessage>,
    #[prost(int32, optional, tag = "3")]
    mode: Option<i32>,
}

#[derive(Clone, PartialEq, Message)]
struct PodResourceClaimMessage {
    #[prost(string, optional, tag = "1")]
    name: Option<String>,
    #[prost(string, optional, tag = "3")]
    resource_claim_name: Option<String>,
    #[prost(string, optional, tag = "4")]
    resource_claim_template_name: Option<String>,
}

#[derive(Clone, PartialEq, Message)]
struct PodStatus {
    #[prost(string, optional, tag = "1")]
    phase: Option<String>,
    #[prost(message, optional, tag = "18")]
    extended_resource_claim_status: Option<ExtendedResourceClaimStatusMessage>,
    #[prost(message, repeated, tag = "8")]
    container_statuses: Vec<ContainerStatusMessage>,
}

/// Of a `ContainerStatus`, its name and why it waits (k8s.io/api core/v1 `generated.proto`:
/// `ContainerStatus.name = 1`, `.state = 2`; `ContainerState.waiting = 1`;
/// `ContainerStateWaiting.reason = 1`, `.message = 2`).
#[derive(Clone, PartialEq, Message)]
struct ContainerStatusMessage {
    #[prost(string, optional, tag = "1")]
    name: Option<String>,
    #[prost(message, optional, tag = "2")]
    state: Option<ContainerStateMessage>,
}

#[derive(Clone, PartialEq, Message)]
struct ContainerStateMessage {
    #[prost(message, optional, tag = "1")]
    waiting: Option<WaitingMessage>,
}

#[derive(Clone, PartialEq, Message)]
struct WaitingMessage {
    #[prost(string, optional, tag = "1")]
    reason: Option<String>,
    #[prost(string, optional, tag = "2")]
    message: Option<String>,
}

#[derive(Clone, PartialEq, Message)]
struct ExtendedResourceClaimStatusMessage {
    #[prost(message, repeated, tag = "1")]
    request_mappings: Vec<ContainerExtendedResourceRequestMessage>,
    #[prost(string, optional, tag = "2")]
    resource_claim_name: Option<String>,
}

#[derive(Clone, PartialEq, Message)]
struct ContainerExtendedResourceRequestMessage {
    #[prost(string, optional, tag = "1")]
    container_name: Option<String>,
    #[prost(string, optional, tag = "2")]
    resource_name: Option<String>,
    #[prost(string, optional, tag = "3")]
    request_name: Option<String>,
}

/// A protobuf map or list as JSON decodes it: absent when empty (the API server omits empty maps
/// and lists from JSON, and protobuf cannot tell an empty one from none).
fn non_empty<C: IntoIterator + Default + PartialEq>(c: C) -> Option<C> {
    (c != C::default()).then_some(c)
}

fn quantities(m: BTreeMap<String, QuantityMessage>) -> Option<BTreeMap<String, Quantity>> {
    non_empty(m.into_iter().map(|(k, q)| (k, Quantity(q.string.unwrap_or_default()))).collect())
}

impl From<PodMessage> for PodFields {
    fn from(p: PodMessage) -> Self {
        let m = p.metadata.unwrap_or_default();
        let owner = |o: OwnerReferenceMessage| OwnerReference {
            api_version: o.api_version.unwrap_or_default(),
            kind: o.kind.unwrap_or_default(),
            name: o.name.unwrap_or_default(),
            uid: o.uid.unwrap_or_default(),
            controller: o.controller,
            block_owner_deletion: o.block_owner_deletion,
        };
        let time = |t: TimeMessage| {
            k8s_openapi::jiff::Timestamp::new(t.seconds.unwrap_or_default(), t.nanos.unwrap_or_default())
                .ok()
                .map(Time)
        };
        PodFields {
            metadata: Meta {
                name: m.name,
                namespace: m.namespace,
                uid: m.uid,
                resource_version: m.resource_version,
                labels: non_empty(m.labels),
                annotations: non_empty(m.annotations),
                owner_references: non_empty(m.owner_references.into_iter().map(owner).collect()),
                deletion_timestamp: m.deletion_timestamp.and_then(time),
            },
            spec: p.spec.map(spec),
            status: p.status.map(|s| Status {
                container_statuses: super::only_waiting(
                    s.container_statuses
                        .into_iter()
                        .map(|c| ContainerWaiting {
                            name: c.name.unwrap_or_default(),
                            state: c.state.map(|st| WaitingState {
                                waiting: st.waiting.map(|w| ContainerStateWaiting {
                                    // Protobuf sends an empty string where JSON omits the field.
                                    reason: w.reason.filter(|r| !r.is_empty()),
                                    message: w.message.filter(|m| !m.is_empty()),
                                }),
                            }),
                        })
                        .collect(),
                ),
                phase: s.phase,
                extended_resource_claim_status: s.extended_resource_claim_status.map(|e| {
                    PodExtendedResourceClaimStatus {
                        request_mappings: e
                            .request_mappings
                            .into_iter()
                            .map(|r| ContainerExtendedResourceRequest {
                                container_name: r.container_name.unwrap_or_default(),
                                resource_name: r.resource_name.unwrap_or_default(),
                                request_name: r.request_name.unwrap_or_default(),
                            })
                            .collect(),
                        resource_claim_name: e.resource_claim_name.unwrap_or_default(),
                    }
                }),
            }),
        }
    }
}

fn spec(s: PodSpec) -> Spec {
    let container = |c: ContainerMessage| ContainerFields {
        name: c.name.unwrap_or_default(),
        resources: c.resources.map(|r| ResourceRequirements {
            limits: quantities(r.limits),
            requests: quantities(r.requests),
            claims: non_empty(
                r.claims
                    .into_iter()
                    .map(|c| ResourceClaim { name: c.name.unwrap_or_default(), request: c.request })
                    .collect(),
            ),
        }),
    };
    let volume = |v: VolumeMessage| VolumeFields {
        name: v.name.unwrap_or_default(),
        empty_dir: v.source.and_then(|s| s.empty_dir).map(|e| EmptyDirVolumeSource {
            medium: e.medium,
            mode: e.mode,
            size_limit: e.size_limit.map(|q| Quantity(q.string.unwrap_or_default())),
        }),
    };
    let requirement = |r: RequirementMessage| NodeSelectorRequirement {
        key: r.key.unwrap_or_default(),
        operator: r.operator.unwrap_or_default(),
        values: non_empty(r.values),
    };
    let term = |t: NodeSelectorTermMessage| NodeSelectorTerm {
        match_expressions: non_empty(t.match_expressions.into_iter().map(requirement).collect()),
        match_fields: non_empty(t.match_fields.into_iter().map(requirement).collect()),
    };
    // Protobuf sends an empty string where JSON omits the field.
    let set = |s: Option<String>| s.filter(|s| !s.is_empty());
    let toleration = |t: TolerationMessage| Toleration {
        key: set(t.key),
        operator: set(t.operator),
        value: set(t.value),
        effect: set(t.effect),
        toleration_seconds: t.toleration_seconds,
    };
    Spec {
        node_selector: non_empty(s.node_selector),
        affinity: s.affinity.map(|a| AffinityFields {
            node_affinity: a.node_affinity.map(|n| NodeAffinityFields {
                required_during_scheduling_ignored_during_execution: n
                    .required
                    .map(|r| NodeSelector { node_selector_terms: r.terms.into_iter().map(term).collect() }),
            }),
        }),
        tolerations: super::without_defaults(s.tolerations.into_iter().map(toleration).collect()),
        node_name: s.node_name,
        termination_grace_period_seconds: s.termination_grace_period_seconds,
        containers: s.containers.into_iter().map(container).collect(),
        init_containers: non_empty(s.init_containers.into_iter().map(container).collect()),
        volumes: non_empty(s.volumes.into_iter().map(volume).collect()),
        resource_claims: non_empty(
            s.resource_claims
                .into_iter()
                .map(|c| PodResourceClaim {
                    name: c.name.unwrap_or_default(),
                    resource_claim_name: c.resource_claim_name,
                    resource_claim_template_name: c.resource_claim_template_name,
                })
                .collect(),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A PodList the e2e API server (v1.37.2) encoded both ways for one LIST of a namespace: a pod
    /// of a ReplicaSet with init and two app containers, GPU limits, a claim, an emptyDir and a
    /// ConfigMap volume, its extended-resource claim status, deleted behind a finalizer; and a
    /// mirror pod.
    const LIST_PB: &[u8] = include_bytes!("../../../testdata/pod-list.pb");
    const LIST_JSON: &str = include_str!("../../../testdata/pod-list.json");
    /// The API server's answer to a LIST with a field selector it does not support.
    const BAD_REQUEST_PB: &[u8] = include_bytes!("../../../testdata/status-bad-request.pb");

    #[test]
    fn a_protobuf_page_reads_as_the_same_pods_as_its_json() {
        let from_pb = page(LIST_PB).unwrap();
        let from_json: PodPage = serde_json::from_str(LIST_JSON).unwrap();
        assert_eq!(from_pb.items.len(), 2);
        assert_eq!(from_pb.items, from_json.items);

        // The fields the judgements turn on are there, not only equal.
        let trainer = from_pb.items.iter().find(|p| p.metadata.name.as_deref() == Some("trainer-0")).unwrap();
        assert_eq!(trainer.node_name(), Some("fx-node"));
        let pod = trainer.clone().into_pod();
        let spec = pod.spec.as_ref().unwrap();
        assert_eq!(spec.termination_grace_period_seconds, Some(45));
        assert_eq!(
            spec.containers[0]
                .resources
                .as_ref()
                .and_then(|r| r.limits.as_ref())
                .and_then(|l| l.get("nvidia.com/gpu")),
            Some(&Quantity("2".into()))
        );
        assert_eq!(
            spec.volumes.as_ref().map(|v| v.iter().filter(|v| v.empty_dir.is_some()).count()),
            Some(1)
        );
        assert!(pod.metadata.deletion_timestamp.is_some());
        assert_eq!(pod.metadata.owner_references.as_ref().map(|o| o[0].kind.as_str()), Some("ReplicaSet"));
        let status = pod.status.as_ref().unwrap();
        assert_eq!(
            status.extended_resource_claim_status.as_ref().map(|s| s.resource_claim_name.as_str()),
            Some("trainer-0-extended-resources-x7k2p")
        );
        let mirror = from_pb.items.iter().find(|p| p.metadata.name.as_deref() != Some("trainer-0")).unwrap();
        assert!(crate::node::drain::is_mirror_pod(&mirror.clone().into_pod()));
    }

    #[test]
    fn a_waiting_container_reads_alike_from_protobuf_and_json() {
        let waiting = |reason: &str, message: &str| ContainerStatusMessage {
            name: Some("cuda".into()),
            state: Some(ContainerStateMessage {
                waiting: Some(WaitingMessage { reason: Some(reason.into()), message: Some(message.into()) }),
            }),
        };
        let running = ContainerStatusMessage {
            name: Some("sidecar".into()),
            state: Some(ContainerStateMessage { waiting: None }),
        };
        let list = PodList {
            metadata: None,
            items: vec![PodMessage {
                metadata: None,
                spec: None,
                status: Some(PodStatus {
                    phase: Some("Pending".into()),
                    extended_resource_claim_status: None,
                    container_statuses: vec![
                        running,
                        waiting("CreateContainerConfigError", "endpoint not found"),
                    ],
                }),
            }],
        };
        let mut body = MAGIC.to_vec();
        body.extend(
            Unknown {
                type_meta: Some(TypeMeta { kind: Some("PodList".into()) }),
                raw: Some(list.encode_to_vec()),
            }
            .encode_to_vec(),
        );
        let from_pb = page(&body).unwrap();
        let from_json: PodPage = serde_json::from_value(serde_json::json!({"items": [{"status": {
            "phase": "Pending",
            "containerStatuses": [
                {"name": "sidecar", "state": {"running": {"startedAt": "2026-12-08T00:00:00Z"}}},
                {"name": "cuda", "state": {"waiting": {"reason": "CreateContainerConfigError", "message": "endpoint not found"}}},
            ],
        }}]}))
        .unwrap();
        assert_eq!(from_pb.items, from_json.items);
        let pod = from_pb.items[0].clone().into_pod();
        let statuses = pod.status.and_then(|s| s.container_statuses).unwrap();
        assert_eq!(statuses.len(), 1, "only the waiting container is kept");
        let w = statuses[0].state.as_ref().and_then(|s| s.waiting.as_ref()).unwrap();
        assert_eq!(
            (statuses[0].name.as_str(), w.reason.as_deref()),
            ("cuda", Some("CreateContainerConfigError"))
        );
    }

    #[test]
    fn a_protobuf_status_reads_its_code_reason_and_message() {
        let s = status(BAD_REQUEST_PB).unwrap();
        assert_eq!(s.code, 400);
        assert_eq!(s.reason, "BadRequest");
        assert!(s.message.contains("field label not supported: spec.bogus"), "{}", s.message);
    }

    #[test]
    fn a_body_of_another_kind_or_without_the_magic_is_an_error() {
        assert!(matches!(page(b"{\"kind\":\"PodList\"}"), Err(DecodeError::NoMagic)));
        assert!(matches!(page(BAD_REQUEST_PB), Err(DecodeError::Kind { expected: "PodList", .. })));
        assert!(matches!(status(LIST_PB), Err(DecodeError::Kind { expected: "Status", .. })));
        let mut cut = LIST_PB.to_vec();
        cut.truncate(LIST_PB.len() / 2);
        assert!(matches!(page(&cut), Err(DecodeError::Protobuf(_))));
    }
}
