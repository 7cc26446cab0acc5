//! The optional verification canary: a pod that asks for one unit of the first pool resource the
//! ordinary way, pinned to the switched node, and how its outcome reads. Pure.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Affinity, Container, NodeAffinity, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm, Pod, PodSpec,
    ResourceRequirements, Toleration,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::api::v1alpha1::CanarySpec;
use crate::node_state::Canary;
use crate::well_known::{LABEL_CANARY_NODE, LABEL_MANAGED_BY, LABEL_MIGRATION, OPERATOR_FIELD_MANAGER};

/// The taint a cordoned node carries; the canary tolerates it because the node stays cordoned
/// until it passes.
const UNSCHEDULABLE_TAINT: &str = "node.kubernetes.io/unschedulable";

/// Pod names are DNS subdomains (253), and node names can be that long too.
const POD_NAME_MAX: usize = 253;

pub fn pod_name(node: &str) -> String {
    let mut n = format!("switchyard-canary-{node}");
    n.truncate(POD_NAME_MAX);
    n.trim_end_matches(['-', '.']).to_string()
}

/// The canary pod. It goes through the scheduler (no `nodeName`), so passing proves the
/// scheduler serves the extended resource from this node's DRA devices.
pub fn pod(migration: &str, node: &str, namespace: &str, resource: &str, spec: &CanarySpec) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some(pod_name(node)),
            namespace: Some(namespace.to_string()),
            labels: Some(BTreeMap::from([
                (LABEL_MANAGED_BY.to_string(), OPERATOR_FIELD_MANAGER.to_string()),
                (LABEL_MIGRATION.to_string(), migration.to_string()),
                (LABEL_CANARY_NODE.to_string(), node.to_string()),
            ])),
            ..Default::default()
        },
        spec: Some(PodSpec {
            restart_policy: Some("Never".into()),
            affinity: Some(Affinity {
                node_affinity: Some(NodeAffinity {
                    required_during_scheduling_ignored_during_execution: Some(NodeSelector {
                        node_selector_terms: vec![NodeSelectorTerm {
                            match_fields: Some(vec![NodeSelectorRequirement {
                                key: "metadata.name".into(),
                                operator: "In".into(),
                                values: Some(vec![node.to_string()]),
                            }]),
                            match_expressions: None,
                        }],
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            tolerations: Some(vec![Toleration {
                key: Some(UNSCHEDULABLE_TAINT.into()),
                operator: Some("Exists".into()),
                effect: Some("NoSchedule".into()),
                ..Default::default()
            }]),
            containers: vec![Container {
                name: "canary".into(),
                image: Some(spec.image.clone()),
                command: (!spec.command.is_empty()).then(|| spec.command.clone()),
                resources: Some(ResourceRequirements {
                    limits: Some(BTreeMap::from([(resource.to_string(), Quantity("1".into()))])),
                    ..Default::default()
                }),
                ..Default::default()
            }],
            ..Default::default()
        }),
        status: None,
    }
}

/// Reads the canary's outcome. It passes only when it succeeded and the scheduler served it
/// through a generated ResourceClaim; a success without one means the device plugin served it.
pub fn outcome(p: Option<&Pod>) -> Canary {
    let Some(p) = p else {
        return Canary::Absent;
    };
    let status = p.status.as_ref();
    let claimed = status.is_some_and(|s| s.extended_resource_claim_status.is_some());
    match status.and_then(|s| s.phase.as_deref()) {
        Some("Succeeded") if claimed => Canary::Succeeded,
        Some("Succeeded") => Canary::Failed(
            "the canary ran without a generated ResourceClaim (status.extendedResourceClaimStatus is empty), so DRA did not serve it".into(),
        ),
        Some("Failed") => Canary::Failed(format!(
            "the canary pod failed: {}",
            status.and_then(|s| s.message.clone()).unwrap_or_else(|| "see its logs".into())
        )),
        _ => Canary::Running,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn canary_pod_is_pinned_and_tolerates_the_cordon() {
        let spec = CanarySpec { image: "registry.k8s.io/pause:3.10".into(), command: vec![] };
        let p = pod("pool-a", "gpu-1", "switchyard-system", "nvidia.com/gpu", &spec);
        let v = serde_json::to_value(&p).unwrap();
        assert_eq!(v["metadata"]["name"], "switchyard-canary-gpu-1");
        assert_eq!(
            v["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
                [0]["matchFields"][0],
            json!({"key": "metadata.name", "operator": "In", "values": ["gpu-1"]})
        );
        assert!(v["spec"].get("nodeName").is_none(), "the scheduler must place it");
        assert_eq!(v["spec"]["tolerations"][0]["key"], UNSCHEDULABLE_TAINT);
        assert_eq!(v["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"], "1");
        assert!(v["spec"]["containers"][0].get("command").is_none());
    }

    #[test]
    fn outcome_table() {
        let p = |status: serde_json::Value| -> Pod {
            serde_json::from_value(json!({"metadata": {"name": "c"}, "status": status})).unwrap()
        };
        let claim = json!({"resourceClaimName": "c-extended-resources-x", "requestMappings": []});
        let cases = [
            (Some(p(json!({"phase": "Pending"}))), "Running"),
            (Some(p(json!({"phase": "Succeeded", "extendedResourceClaimStatus": claim}))), "Succeeded"),
            (Some(p(json!({"phase": "Succeeded"}))), "Failed"),
            (Some(p(json!({"phase": "Failed", "message": "OOM"}))), "Failed"),
        ];
        for (pod, want) in cases {
            let got = outcome(pod.as_ref());
            let kind = match got {
                Canary::Running => "Running",
                Canary::Succeeded => "Succeeded",
                Canary::Failed(_) => "Failed",
                _ => "other",
            };
            assert_eq!(kind, want, "{pod:?}");
        }
        assert_eq!(outcome(None), Canary::Absent);
        assert_eq!(pod_name(&"n".repeat(300)).len(), POD_NAME_MAX);
    }
}
