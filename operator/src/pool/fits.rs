//! Whether a pod may run on a node as the scheduler's node filters judge it, devices aside: its
//! `nodeSelector`, its required node affinity, and the node's NoSchedule and NoExecute taints
//! it must tolerate. Pure. The Replace strategy asks it of each pod a drain would move, before
//! the pod is evicted: a pod no target node accepts has nowhere to go.

use k8s_openapi::api::core::v1::{NodeSelector, NodeSelectorRequirement, Pod, Taint, Toleration};

use crate::node::slim::SlimNode;

/// Why `pod` may not run on `node`, in words; `None` when it may.
pub fn refusal(pod: &Pod, node: &SlimNode) -> Option<String> {
    let spec = pod.spec.as_ref()?;
    let labels = |key: &str| node.labels().get(key).map(str::to_string);
    for (key, want) in spec.node_selector.iter().flatten() {
        let have = labels(key);
        if have.as_deref() != Some(want.as_str()) {
            return Some(match have {
                Some(v) => format!("nodeSelector {key}={want}, the node has {key}={v}"),
                None => format!("nodeSelector {key}={want}, the node has no {key} label"),
            });
        }
    }
    let required = spec
        .affinity
        .as_ref()
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|a| a.required_during_scheduling_ignored_during_execution.as_ref());
    if let Some(selector) = required
        && !selector_matches(selector, node)
    {
        return Some("its required node affinity matches no term of the node".to_string());
    }
    let tolerations = spec.tolerations.as_deref().unwrap_or_default();
    node.taints
        .iter()
        .filter(|t| matches!(t.effect.as_str(), "NoSchedule" | "NoExecute"))
        .find(|t| !tolerations.iter().any(|tol| tolerates(tol, t)))
        .map(|t| {
            let value = t.value.as_deref().map(|v| format!("={v}")).unwrap_or_default();
            format!("the node's taint {}{value}:{} is not tolerated", t.key, t.effect)
        })
}

/// A node selector's terms are ORed; a term's requirements are ANDed, and a term with none
/// matches nothing, as the scheduler reads them.
fn selector_matches(selector: &NodeSelector, node: &SlimNode) -> bool {
    selector.node_selector_terms.iter().any(|term| {
        let expressions = term.match_expressions.as_deref().unwrap_or_default();
        let fields = term.match_fields.as_deref().unwrap_or_default();
        if expressions.is_empty() && fields.is_empty() {
            return false;
        }
        expressions.iter().all(|r| requirement_matches(r, node.labels().get(&r.key)))
            && fields.iter().all(|r| {
                let value = (r.key == "metadata.name").then(|| node.name());
                requirement_matches(r, value)
            })
    })
}

fn requirement_matches(r: &NodeSelectorRequirement, value: Option<&str>) -> bool {
    let values = r.values.as_deref().unwrap_or_default();
    let number = |s: &str| s.parse::<i64>().ok();
    match r.operator.as_str() {
        "In" => value.is_some_and(|v| values.iter().any(|w| w == v)),
        "NotIn" => value.is_none_or(|v| !values.iter().any(|w| w == v)),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        "Gt" | "Lt" => {
            let (Some(v), Some(bound)) = (value.and_then(number), values.first().and_then(|w| number(w)))
            else {
                return false;
            };
            if r.operator == "Gt" { v > bound } else { v < bound }
        }
        _ => false,
    }
}

/// Whether `tol` tolerates `taint`: an empty key with `Exists` tolerates every taint; otherwise
/// the keys match, the effect matches (or the toleration names none), and the value matches under
/// `Equal` (the default operator).
fn tolerates(tol: &Toleration, taint: &Taint) -> bool {
    let effect_ok = tol.effect.as_deref().is_none_or(|e| e.is_empty() || e == taint.effect);
    let exists = tol.operator.as_deref() == Some("Exists");
    let key = tol.key.as_deref().unwrap_or_default();
    if key.is_empty() {
        return exists && effect_ok;
    }
    key == taint.key
        && effect_ok
        && (exists || tol.value.as_deref().unwrap_or_default() == taint.value.as_deref().unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    fn node(labels: Value, taints: Value) -> SlimNode {
        serde_json::from_value(json!({
            "metadata": {"name": "t0", "labels": labels},
            "spec": {"taints": taints},
        }))
        .unwrap()
    }

    fn pod(spec: Value) -> Pod {
        let mut spec = spec;
        spec["containers"] = json!([{"name": "main"}]);
        serde_json::from_value(json!({"metadata": {"name": "p", "namespace": "ml"}, "spec": spec})).unwrap()
    }

    #[test]
    fn a_pod_may_run_where_its_selector_affinity_and_tolerations_allow() {
        let target = node(
            json!({"pool": "dra", "gpu.count": "8", "zone": "a"}),
            json!([{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"},
                   {"key": "soft", "effect": "PreferNoSchedule"}]),
        );
        let tolerant = json!([{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]);
        let affinity = |exprs: Value| json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": exprs}}});
        let cases: Vec<(&str, Value, Option<&str>)> = vec![
            ("tolerates the GPU taint, no pin", json!({"tolerations": tolerant}), None),
            (
                "pinned to the old pool",
                json!({"tolerations": tolerant, "nodeSelector": {"pool": "old"}}),
                Some("nodeSelector pool=old, the node has pool=dra"),
            ),
            (
                "a label the target lacks",
                json!({"tolerations": tolerant, "nodeSelector": {"cloud.google.com/gke-nodepool": "gpu-old"}}),
                Some(
                    "nodeSelector cloud.google.com/gke-nodepool=gpu-old, the node has no cloud.google.com/gke-nodepool label",
                ),
            ),
            (
                "does not tolerate the GPU taint (PreferNoSchedule never refuses)",
                json!({}),
                Some("the node's taint nvidia.com/gpu=present:NoSchedule is not tolerated"),
            ),
            (
                "an empty key with Exists tolerates everything",
                json!({"tolerations": [{"operator": "Exists"}]}),
                None,
            ),
            (
                "Equal needs the value",
                json!({"tolerations": [{"key": "nvidia.com/gpu", "value": "other"}]}),
                Some("the node's taint nvidia.com/gpu=present:NoSchedule is not tolerated"),
            ),
            (
                "affinity: a second term matches (terms are ORed)",
                json!({"tolerations": tolerant, "affinity": affinity(json!([
                    {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["old"]}]},
                    {"matchExpressions": [{"key": "pool", "operator": "NotIn", "values": ["old"]},
                                          {"key": "gpu.count", "operator": "Gt", "values": ["4"]}]}
                ]))}),
                None,
            ),
            (
                "affinity: one requirement of the only term fails (requirements are ANDed)",
                json!({"tolerations": tolerant, "affinity": affinity(json!([
                    {"matchExpressions": [{"key": "zone", "operator": "Exists"},
                                          {"key": "gpu.count", "operator": "Lt", "values": ["4"]}]}
                ]))}),
                Some("its required node affinity matches no term of the node"),
            ),
            (
                "affinity: DoesNotExist and matchFields on the node's name",
                json!({"tolerations": tolerant, "affinity": affinity(json!([
                    {"matchExpressions": [{"key": "legacy", "operator": "DoesNotExist"}],
                     "matchFields": [{"key": "metadata.name", "operator": "In", "values": ["t0"]}]}
                ]))}),
                None,
            ),
            (
                "affinity: an empty term matches nothing",
                json!({"tolerations": tolerant, "affinity": affinity(json!([{}]))}),
                Some("its required node affinity matches no term of the node"),
            ),
        ];
        for (name, spec, want) in cases {
            assert_eq!(refusal(&pod(spec), &target).as_deref(), want, "{name}");
        }
    }
}
