//! Keeps the device plugin and the DRA driver off each other's nodes: the required node affinity
//! on `switchyard.dev/gpu-backend` that each DaemonSet's pod template must carry, the check
//! whether it already does, and the server-side-apply patch (Managed) or YAML advice (Verify).

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{
    Affinity, NodeAffinity, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Serialize;

use crate::well_known::{BACKEND_DRA, LABEL_GPU_BACKEND};

/// Which of the two DaemonSets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// The NVIDIA device plugin: must not run where the backend is `dra`.
    DevicePlugin,
    /// The DRA driver's kubelet plugin: must run only where the backend is `dra`.
    Driver,
}

impl Role {
    pub fn describe(self) -> &'static str {
        match self {
            Role::DevicePlugin => "device plugin",
            Role::Driver => "DRA driver",
        }
    }
}

/// The node-selector requirement a role's pod template needs in every required term.
pub fn requirement(role: Role) -> NodeSelectorRequirement {
    NodeSelectorRequirement {
        key: LABEL_GPU_BACKEND.to_string(),
        operator: match role {
            Role::DevicePlugin => "NotIn",
            Role::Driver => "In",
        }
        .to_string(),
        values: Some(vec![BACKEND_DRA.to_string()]),
    }
}

/// True when `r` keeps the role's pods where they belong. The device plugin needs `NotIn` with
/// `dra` among the values (`DoesNotExist` or `In [device-plugin]` would also keep it off nodes
/// that have no label yet, which are device-plugin nodes). The driver needs `In` with only `dra`.
fn satisfies(role: Role, r: &NodeSelectorRequirement) -> bool {
    if r.key != LABEL_GPU_BACKEND {
        return false;
    }
    let values = r.values.as_deref().unwrap_or_default();
    match role {
        Role::DevicePlugin => r.operator == "NotIn" && values.iter().any(|v| v == BACKEND_DRA),
        Role::Driver => r.operator == "In" && !values.is_empty() && values.iter().all(|v| v == BACKEND_DRA),
    }
}

fn required_terms(ds: &DaemonSet) -> Option<&[NodeSelectorTerm]> {
    ds.spec
        .template
        .spec
        .as_ref()?
        .affinity
        .as_ref()?
        .node_affinity
        .as_ref()?
        .required_during_scheduling_ignored_during_execution
        .as_ref()
        .map(|s| s.node_selector_terms.as_slice())
}

/// True when the DaemonSet's pod template already keeps it where the role belongs: through
/// `nodeSelector` (driver only: `switchyard.dev/gpu-backend: dra`), or because every required
/// node-affinity term (terms are ORed) carries a satisfying requirement.
pub fn has_placement(ds: &DaemonSet, role: Role) -> bool {
    let pod_spec = ds.spec.template.spec.as_ref();
    if role == Role::Driver
        && pod_spec
            .and_then(|p| p.node_selector.as_ref())
            .and_then(|ns| ns.get(LABEL_GPU_BACKEND))
            .is_some_and(|v| v == BACKEND_DRA)
    {
        return true;
    }
    match required_terms(ds) {
        Some(terms) if !terms.is_empty() => terms
            .iter()
            .all(|t| t.match_expressions.as_deref().unwrap_or_default().iter().any(|r| satisfies(role, r))),
        _ => false,
    }
}

/// The required terms after adding the role's requirement to each existing term (or one term
/// with only the requirement when there are none). Terms are ORed, so every one needs it.
pub fn merged_terms(ds: &DaemonSet, role: Role) -> Vec<NodeSelectorTerm> {
    let req = requirement(role);
    let existing = required_terms(ds).map(<[_]>::to_vec).unwrap_or_default();
    if existing.is_empty() {
        return vec![NodeSelectorTerm { match_expressions: Some(vec![req]), match_fields: None }];
    }
    existing
        .into_iter()
        .map(|mut t| {
            let exprs = t.match_expressions.get_or_insert_with(Vec::new);
            if !exprs.iter().any(|r| satisfies(role, r)) {
                exprs.push(req.clone());
            }
            t
        })
        .collect()
}

/// The server-side-apply body for the placement: a DaemonSet holding only the pod template's
/// required node affinity. Typed, and narrower than `DaemonSet`, whose required `selector` and
/// `containers` fields would otherwise be applied as empty values.
#[derive(Serialize, Debug, Clone, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PlacementApply {
    pub api_version: &'static str,
    pub kind: &'static str,
    pub metadata: ObjectMeta,
    pub spec: PlacementSpec,
}

#[derive(Serialize, Debug, Clone, PartialEq)]
pub struct PlacementSpec {
    pub template: PlacementTemplate,
}

#[derive(Serialize, Debug, Clone, PartialEq)]
pub struct PlacementTemplate {
    pub spec: PlacementPodSpec,
}

#[derive(Serialize, Debug, Clone, PartialEq)]
pub struct PlacementPodSpec {
    pub affinity: Affinity,
}

/// The SSA patch (apply it with field manager `switchyard-operator`, forced, because
/// `nodeSelectorTerms` is an atomic list that the chart's manager owns).
pub fn apply_patch(ds: &DaemonSet, role: Role) -> PlacementApply {
    PlacementApply {
        api_version: "apps/v1",
        kind: "DaemonSet",
        metadata: ObjectMeta {
            name: ds.metadata.name.clone(),
            namespace: ds.metadata.namespace.clone(),
            ..Default::default()
        },
        spec: PlacementSpec {
            template: PlacementTemplate {
                spec: PlacementPodSpec {
                    affinity: Affinity {
                        node_affinity: Some(NodeAffinity {
                            required_during_scheduling_ignored_during_execution: Some(NodeSelector {
                                node_selector_terms: merged_terms(ds, role),
                            }),
                            ..Default::default()
                        }),
                        ..Default::default()
                    },
                },
            },
        },
    }
}

/// The YAML an admin adds to the DaemonSet (Verify mode): the `spec` part of [`apply_patch`].
pub fn yaml_snippet(ds: &DaemonSet, role: Role) -> String {
    #[derive(Serialize)]
    struct Snippet<'a> {
        spec: &'a PlacementSpec,
    }
    let patch = apply_patch(ds, role);
    serde_yaml::to_string(&Snippet { spec: &patch.spec }).unwrap_or_default()
}

/// The PlacementReady message for a DaemonSet that lacks its placement in Verify mode.
pub fn verify_message(ds: &DaemonSet, role: Role) -> String {
    format!(
        "{} DaemonSet {}/{} lacks the backend node affinity; add this to it (or set spec.placement: Managed):\n{}",
        role.describe(),
        ds.metadata.namespace.as_deref().unwrap_or_default(),
        ds.metadata.name.as_deref().unwrap_or_default(),
        yaml_snippet(ds, role)
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ds(pod_spec: serde_json::Value) -> DaemonSet {
        serde_json::from_value(json!({
            "apiVersion": "apps/v1", "kind": "DaemonSet",
            "metadata": {"name": "nvidia-device-plugin", "namespace": "gpu"},
            "spec": {
                "selector": {"matchLabels": {"app": "dp"}},
                "template": {"metadata": {"labels": {"app": "dp"}}, "spec": pod_spec}
            }
        }))
        .unwrap()
    }

    fn with_terms(terms: serde_json::Value) -> DaemonSet {
        ds(json!({
            "containers": [{"name": "c", "image": "i"}],
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}}
        }))
    }

    const KEY: &str = "switchyard.dev/gpu-backend";

    #[test]
    fn has_placement_table() {
        // (name, daemonset, role, expected)
        let cases = vec![
            ("no affinity", ds(json!({"containers": []})), Role::DevicePlugin, false),
            ("no affinity driver", ds(json!({"containers": []})), Role::Driver, false),
            (
                "notin dra",
                with_terms(
                    json!([{"matchExpressions": [{"key": KEY, "operator": "NotIn", "values": ["dra"]}]}]),
                ),
                Role::DevicePlugin,
                true,
            ),
            (
                "notin dra is wrong for driver",
                with_terms(
                    json!([{"matchExpressions": [{"key": KEY, "operator": "NotIn", "values": ["dra"]}]}]),
                ),
                Role::Driver,
                false,
            ),
            (
                "in dra",
                with_terms(
                    json!([{"matchExpressions": [{"key": KEY, "operator": "In", "values": ["dra"]}]}]),
                ),
                Role::Driver,
                true,
            ),
            (
                "in dra or device-plugin is not enough for driver",
                with_terms(
                    json!([{"matchExpressions": [{"key": KEY, "operator": "In", "values": ["dra", "device-plugin"]}]}]),
                ),
                Role::Driver,
                false,
            ),
            (
                "DoesNotExist would strand unlabelled nodes",
                with_terms(json!([{"matchExpressions": [{"key": KEY, "operator": "DoesNotExist"}]}])),
                Role::DevicePlugin,
                false,
            ),
            (
                "one of two ORed terms lacks it",
                with_terms(json!([
                    {"matchExpressions": [{"key": "gpu", "operator": "Exists"}, {"key": KEY, "operator": "NotIn", "values": ["dra"]}]},
                    {"matchExpressions": [{"key": "other", "operator": "Exists"}]}
                ])),
                Role::DevicePlugin,
                false,
            ),
            (
                "driver via nodeSelector",
                ds(json!({"containers": [], "nodeSelector": {KEY: "dra"}})),
                Role::Driver,
                true,
            ),
            (
                "nodeSelector does not place the device plugin",
                ds(json!({"containers": [], "nodeSelector": {KEY: "dra"}})),
                Role::DevicePlugin,
                false,
            ),
        ];
        for (name, d, role, want) in cases {
            assert_eq!(has_placement(&d, role), want, "{name}");
        }
    }

    #[test]
    fn merged_terms_keep_existing_ones() {
        let d = with_terms(json!([
            {"matchExpressions": [{"key": "nvidia.com/gpu.present", "operator": "In", "values": ["true"]}]},
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}
        ]));
        let terms = merged_terms(&d, Role::DevicePlugin);
        let v = serde_json::to_value(&terms).unwrap();
        assert_eq!(
            v,
            json!([
                {"matchExpressions": [
                    {"key": "nvidia.com/gpu.present", "operator": "In", "values": ["true"]},
                    {"key": KEY, "operator": "NotIn", "values": ["dra"]}
                ]},
                {"matchExpressions": [{"key": KEY, "operator": "NotIn", "values": ["dra"]}],
                 "matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}
            ])
        );
        // After the patch the check passes, so the operator never touches the DaemonSet again.
        let patched = with_terms(v);
        assert!(has_placement(&patched, Role::DevicePlugin));
        assert_eq!(merged_terms(&patched, Role::DevicePlugin), terms);
    }

    #[test]
    fn apply_patch_holds_only_the_affinity() {
        let d = ds(json!({"containers": [{"name": "c", "image": "i"}]}));
        let v = serde_json::to_value(apply_patch(&d, Role::Driver)).unwrap();
        assert_eq!(
            v,
            json!({
                "apiVersion": "apps/v1", "kind": "DaemonSet",
                "metadata": {"name": "nvidia-device-plugin", "namespace": "gpu"},
                "spec": {"template": {"spec": {"affinity": {"nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                        {"matchExpressions": [{"key": KEY, "operator": "In", "values": ["dra"]}]}
                    ]}
                }}}}}
            })
        );
    }

    #[test]
    fn verify_snippet_is_pasteable_yaml() {
        let d = ds(json!({"containers": []}));
        let msg = verify_message(&d, Role::DevicePlugin);
        assert!(msg.starts_with("device plugin DaemonSet gpu/nvidia-device-plugin lacks"));
        let snippet = yaml_snippet(&d, Role::DevicePlugin);
        let expected = "\
spec:
  template:
    spec:
      affinity:
        nodeAffinity:
          requiredDuringSchedulingIgnoredDuringExecution:
            nodeSelectorTerms:
            - matchExpressions:
              - key: switchyard.dev/gpu-backend
                operator: NotIn
                values:
                - dra
";
        assert_eq!(snippet, expected);
    }
}
