//! The optional verification canary: a pod that asks for one unit of the first pool resource the
//! ordinary way, pinned to the switched node, and how its outcome reads. Pure.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Affinity, Container, NodeAffinity, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm, Pod, PodSpec,
    ResourceRequirements, Taint, Toleration,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

use crate::api::v1alpha1::CanarySpec;
use crate::node::state::Canary;
use crate::node::verify;
use crate::well_known::{
    LABEL_CANARY_ATTEMPT, LABEL_CANARY_NODE, LABEL_MANAGED_BY, LABEL_MIGRATION, OPERATOR_FIELD_MANAGER,
};

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

/// Where the canary goes and what it carries besides its spec.
pub struct Target<'a> {
    pub migration: &'a str,
    /// The migration as the canary's owner: the garbage collector removes a canary the operator
    /// did not (a migration deleted mid-verify).
    pub owner: Option<OwnerReference>,
    pub node: &'a str,
    /// The node's taints: the canary tolerates each NoSchedule and NoExecute one (GPU nodes are
    /// commonly tainted `nvidia.com/gpu:NoSchedule`), since it must run exactly there.
    pub taints: &'a [Taint],
    pub namespace: &'a str,
    pub resource: &'a str,
    /// See [`LABEL_CANARY_ATTEMPT`].
    pub attempt: &'a str,
}

/// The tolerations for a node: the cordon, and every scheduling or execution taint it has.
fn tolerations(taints: &[Taint]) -> Vec<Toleration> {
    let mut out = vec![Toleration {
        key: Some(UNSCHEDULABLE_TAINT.into()),
        operator: Some("Exists".into()),
        effect: Some("NoSchedule".into()),
        ..Default::default()
    }];
    for t in taints.iter().filter(|t| t.effect == "NoSchedule" || t.effect == "NoExecute") {
        let tol = Toleration {
            key: Some(t.key.clone()),
            operator: Some("Exists".into()),
            effect: Some(t.effect.clone()),
            ..Default::default()
        };
        if !out.contains(&tol) {
            out.push(tol);
        }
    }
    out
}

/// The canary pod. It goes through the scheduler (no `nodeName`), so passing proves the
/// scheduler serves the extended resource from this node's DRA devices.
pub fn pod(t: &Target<'_>, spec: &CanarySpec) -> Pod {
    let node = t.node;
    Pod {
        metadata: ObjectMeta {
            name: Some(pod_name(node)),
            namespace: Some(t.namespace.to_string()),
            labels: Some(BTreeMap::from([
                (LABEL_MANAGED_BY.to_string(), OPERATOR_FIELD_MANAGER.to_string()),
                (LABEL_MIGRATION.to_string(), t.migration.to_string()),
                (LABEL_CANARY_NODE.to_string(), node.to_string()),
                (LABEL_CANARY_ATTEMPT.to_string(), t.attempt.to_string()),
            ])),
            owner_references: t.owner.clone().map(|o| vec![o]),
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
            tolerations: Some(tolerations(t.taints)),
            containers: vec![Container {
                name: "canary".into(),
                image: Some(spec.image.clone()),
                command: (!spec.command.is_empty()).then(|| spec.command.clone()),
                resources: Some(ResourceRequirements {
                    limits: Some(BTreeMap::from([(t.resource.to_string(), Quantity("1".into()))])),
                    ..Default::default()
                }),
                ..Default::default()
            }],
            ..Default::default()
        }),
        status: None,
    }
}

/// Reads the canary's outcome for `attempt`. It passes only when it succeeded and the scheduler
/// served it through a generated ResourceClaim; a success without one means the device plugin
/// served it. A canary of another attempt (a leftover of a retry) is [`Canary::Stale`].
pub fn outcome(p: Option<&Pod>, attempt: &str) -> Canary {
    let Some(p) = p else {
        return Canary::Absent;
    };
    if p.metadata.labels.as_ref().and_then(|l| l.get(LABEL_CANARY_ATTEMPT)).map(String::as_str)
        != Some(attempt)
    {
        return Canary::Stale;
    }
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
        _ => verify::cannot_start(p).map_or(Canary::Running, |m| Canary::CannotStart(format!("the canary's {m}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn target<'a>(taints: &'a [Taint]) -> Target<'a> {
        Target {
            migration: "pool-a",
            owner: None,
            node: "gpu-1",
            taints,
            namespace: "switchyard-system",
            resource: "nvidia.com/gpu",
            attempt: "1764590000",
        }
    }

    #[test]
    fn canary_tolerates_the_nodes_taints_and_belongs_to_its_migration() {
        let taints: Vec<Taint> = serde_json::from_value(json!([
            {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"},
            {"key": "dedicated", "value": "ml", "effect": "NoExecute"},
            {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"},
            {"key": "soft", "effect": "PreferNoSchedule"}
        ]))
        .unwrap();
        let owner = OwnerReference {
            api_version: "switchyard.dev/v1alpha1".into(),
            kind: "GpuPoolMigration".into(),
            name: "pool-a".into(),
            uid: "u-1".into(),
            controller: Some(true),
            ..Default::default()
        };
        let spec = CanarySpec { image: "registry.k8s.io/pause:3.10".into(), command: vec![] };
        let p = pod(&Target { owner: Some(owner), ..target(&taints) }, &spec);
        let v = serde_json::to_value(&p).unwrap();
        let keys: Vec<(&str, &str)> = v["spec"]["tolerations"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| (t["key"].as_str().unwrap(), t["effect"].as_str().unwrap()))
            .collect();
        assert_eq!(
            keys,
            [
                ("node.kubernetes.io/unschedulable", "NoSchedule"),
                ("nvidia.com/gpu", "NoSchedule"),
                ("dedicated", "NoExecute")
            ]
        );
        assert_eq!(v["metadata"]["ownerReferences"][0]["uid"], "u-1");
        assert_eq!(v["metadata"]["labels"][LABEL_CANARY_ATTEMPT], "1764590000");
    }

    #[test]
    fn canary_pod_is_pinned_and_tolerates_the_cordon() {
        let spec = CanarySpec { image: "registry.k8s.io/pause:3.10".into(), command: vec![] };
        let p = pod(&target(&[]), &spec);
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
            serde_json::from_value(
                json!({"metadata": {"name": "c", "labels": {LABEL_CANARY_ATTEMPT: "7"}}, "status": status}),
            )
            .unwrap()
        };
        let claim = json!({"resourceClaimName": "c-extended-resources-x", "requestMappings": []});
        let cases = [
            (Some(p(json!({"phase": "Pending"}))), "Running"),
            (Some(p(json!({"phase": "Succeeded", "extendedResourceClaimStatus": claim}))), "Succeeded"),
            (Some(p(json!({"phase": "Succeeded"}))), "Failed"),
            (Some(p(json!({"phase": "Failed", "message": "OOM"}))), "Failed"),
        ];
        for (pod, want) in cases {
            let got = outcome(pod.as_ref(), "7");
            let kind = match got {
                Canary::Running => "Running",
                Canary::Succeeded => "Succeeded",
                Canary::Failed(_) => "Failed",
                _ => "other",
            };
            assert_eq!(kind, want, "{pod:?}");
        }
        assert_eq!(outcome(None, "7"), Canary::Absent);
        // Pulling or creating is on its way; a configuration error is not.
        let waiting = |reason: &str, message: &str| {
            p(json!({"phase": "Pending", "containerStatuses": [{
                "name": "canary", "image": "pause", "imageID": "", "ready": false, "restartCount": 0,
                "state": {"waiting": {"reason": reason, "message": message}},
            }]}))
        };
        assert_eq!(outcome(Some(&waiting("ContainerCreating", "")), "7"), Canary::Running);
        let Canary::CannotStart(m) = outcome(Some(&waiting("ErrImageNeverPull", "not present")), "7") else {
            panic!("an image the node lacks is reported")
        };
        assert_eq!(m, "the canary's container canary cannot start: ErrImageNeverPull: not present");
        let stale = "endpoint not found in cache for a registered resource: nvidia.com/gpu";
        let Canary::CannotStart(m) = outcome(Some(&waiting("CreateContainerConfigError", stale)), "7") else {
            panic!("the kubelet's stale device-plugin state is reported")
        };
        assert!(
            m.contains(stale) && m.contains("#141426") && m.contains("kubelet_internal_checkpoint"),
            "{m}"
        );
        // A leftover of an earlier attempt neither fails nor passes this one.
        for phase in ["Succeeded", "Failed"] {
            let old = p(json!({"phase": phase, "extendedResourceClaimStatus": claim}));
            assert_eq!(outcome(Some(&old), "8"), Canary::Stale, "{phase}");
        }
        assert_eq!(pod_name(&"n".repeat(300)).len(), POD_NAME_MAX);
    }
}
