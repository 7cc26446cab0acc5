//! Keeps the device plugin and the DRA driver off each other's nodes: the required node affinity
//! on `switchyard.dev/gpu-backend` that each DaemonSet's pod template must carry, the check
//! whether it already does, and the server-side-apply patch (Managed) or YAML advice (Verify).

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{
    Affinity, NodeAffinity, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Serialize;

use crate::api::v1alpha1::PlacementMode;
use crate::well_known::{BACKEND_DRA, BACKEND_NONE, LABEL_GPU_BACKEND, LABEL_GPU_OPERATOR_DEVICE_PLUGIN};

/// The `helm.sh/chart` label of the `nvidia-device-plugin` chart's objects: `<chart>-<version>`.
const DEVICE_PLUGIN_CHART_PREFIX: &str = "nvidia-device-plugin-";

/// The label the NVIDIA GPU Operator puts on its operands' DaemonSets and pods.
const GPU_OPERATOR_MANAGED_BY: (&str, &str) = ("app.kubernetes.io/managed-by", "gpu-operator");

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
pub fn requirement(role: Role, sequential: bool) -> NodeSelectorRequirement {
    NodeSelectorRequirement {
        key: LABEL_GPU_BACKEND.to_string(),
        operator: match role {
            Role::DevicePlugin => "NotIn",
            Role::Driver => "In",
        }
        .to_string(),
        values: Some(match role {
            Role::DevicePlugin if sequential => vec![BACKEND_DRA.to_string(), BACKEND_NONE.to_string()],
            _ => vec![BACKEND_DRA.to_string()],
        }),
    }
}

/// True when `r` keeps the role's pods where they belong. The device plugin needs `NotIn` with
/// `dra` among the values, and `none` too when the switch is `sequential` (`DoesNotExist` or
/// `In [device-plugin]` would also keep it off nodes that have no label yet, which are
/// device-plugin nodes). The driver needs `In` with only `dra`.
fn satisfies(role: Role, sequential: bool, r: &NodeSelectorRequirement) -> bool {
    if r.key != LABEL_GPU_BACKEND {
        return false;
    }
    let values = r.values.as_deref().unwrap_or_default();
    match role {
        Role::DevicePlugin => {
            let avoids = |b: &str| values.iter().any(|v| v == b);
            r.operator == "NotIn" && avoids(BACKEND_DRA) && (!sequential || avoids(BACKEND_NONE))
        }
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
pub fn has_placement(ds: &DaemonSet, role: Role, sequential: bool) -> bool {
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
        Some(terms) if !terms.is_empty() => terms.iter().all(|t| {
            t.match_expressions.as_deref().unwrap_or_default().iter().any(|r| satisfies(role, sequential, r))
        }),
        _ => false,
    }
}

/// Who owns the DaemonSet when the NVIDIA GPU Operator does: its `ClusterPolicy` owner, or the
/// operator's `app.kubernetes.io/managed-by: gpu-operator` label on it or its pod template. The
/// GPU Operator reconciles its DaemonSets back to what the ClusterPolicy renders, so an edit to
/// one does not last.
pub fn gpu_operator_owner(ds: &DaemonSet) -> Option<String> {
    if let Some(o) = ds
        .metadata
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.kind == "ClusterPolicy" && o.api_version.starts_with("nvidia.com/"))
    {
        return Some(format!("ClusterPolicy {}", o.name));
    }
    let (k, v) = GPU_OPERATOR_MANAGED_BY;
    let labelled = |l: Option<&std::collections::BTreeMap<String, String>>| {
        l.and_then(|l| l.get(k)).is_some_and(|x| x == v)
    };
    let template = ds.spec.template.metadata.as_ref().and_then(|m| m.labels.as_ref());
    (labelled(ds.metadata.labels.as_ref()) || labelled(template)).then(|| format!("label {k}={v}"))
}

/// True when the device plugin's pods run only where [`LABEL_GPU_OPERATOR_DEVICE_PLUGIN`] is
/// `true` (the GPU Operator's `nodeSelector`, or an `In [true]` requirement in every required
/// term), so that setting the label to `false` takes the plugin off a node.
pub fn selects_by_deploy_label(ds: &DaemonSet) -> bool {
    if ds
        .spec
        .template
        .spec
        .as_ref()
        .and_then(|p| p.node_selector.as_ref())
        .and_then(|ns| ns.get(LABEL_GPU_OPERATOR_DEVICE_PLUGIN))
        .is_some_and(|v| v == "true")
    {
        return true;
    }
    let selects = |r: &NodeSelectorRequirement| {
        r.key == LABEL_GPU_OPERATOR_DEVICE_PLUGIN
            && r.operator == "In"
            && r.values.as_deref().is_some_and(|v| !v.is_empty() && v.iter().all(|x| x == "true"))
    };
    match required_terms(ds) {
        Some(terms) if !terms.is_empty() => {
            terms.iter().all(|t| t.match_expressions.as_deref().unwrap_or_default().iter().any(selects))
        }
        _ => false,
    }
}

/// What one DaemonSet needs before the pool may start, in a placement mode.
#[derive(Clone, Debug, PartialEq)]
pub enum Need {
    /// It keeps to its backend already.
    Placed,
    /// `Managed`: the operator applies this patch.
    Patch(Box<PlacementApply>),
    /// An admin must change it; the message says how (with the YAML where there is one).
    ByHand { message: String, snippet: String },
    /// The NVIDIA GPU Operator owns the device plugin and the mode is not `GpuOperator`: an edit
    /// would be reverted, so the pool must not start.
    GpuOperatorOwned { message: String },
    /// A managed cluster's addon manager reconciles the device plugin
    /// (`addonmanager.kubernetes.io/mode: Reconcile`, as GKE's GPU device plugin): it reverts any
    /// edit and no label turns it off per node, so no placement mode can move the pool in place.
    AddonManaged { message: String },
}

/// The reason PrerequisitesMet and PlacementReady carry for [`Need::GpuOperatorOwned`].
pub const REASON_GPU_OPERATOR_OWNED: &str = "GpuOperatorOwnsDevicePlugin";
/// The reason PrerequisitesMet and PlacementReady carry for [`Need::AddonManaged`].
pub const REASON_ADDON_MANAGED: &str = "AddonManagerOwnsDevicePlugin";
/// The label Kubernetes' addon manager reads on the objects it keeps; `Reconcile` reverts edits,
/// `EnsureExists` only creates the object when it is missing.
pub const LABEL_ADDON_MANAGER_MODE: &str = "addonmanager.kubernetes.io/mode";

/// Whether the addon manager reverts edits to `ds`.
fn addon_managed(ds: &DaemonSet) -> bool {
    ds.metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(LABEL_ADDON_MANAGER_MODE))
        .is_some_and(|m| m == "Reconcile")
}

/// What `ds` in `role` needs under `mode`; `sequential` when the switch goes through backend
/// `none` (a driver without the device-plugin interlock), so the device plugin must avoid `none`
/// nodes too. Pure.
pub fn need(mode: PlacementMode, ds: &DaemonSet, role: Role, sequential: bool) -> Need {
    let id = format!(
        "{}/{}",
        ds.metadata.namespace.as_deref().unwrap_or_default(),
        ds.metadata.name.as_deref().unwrap_or_default()
    );
    let placed = has_placement(ds, role, sequential);
    if role == Role::DevicePlugin && !placed && addon_managed(ds) {
        return Need::AddonManaged {
            message: format!(
                "device plugin DaemonSet {id} is kept by the cluster's addon manager ({LABEL_ADDON_MANAGER_MODE}: Reconcile, as on a managed cluster's GPU node pools), which reverts edits to it, so no spec.placement can keep it off DRA nodes; move the workloads to a new node pool created with DRA instead (the provider's supported path), or turn the provider's device plugin off for this pool"
            ),
        };
    }
    if role == Role::DevicePlugin && mode == PlacementMode::GpuOperator {
        if placed || selects_by_deploy_label(ds) {
            return Need::Placed;
        }
        return Need::ByHand {
            message: format!(
                "device plugin DaemonSet {id} does not select nodes by {LABEL_GPU_OPERATOR_DEVICE_PLUGIN}=true, so spec.placement: GpuOperator cannot take it off a node; give it nodeSelector {LABEL_GPU_OPERATOR_DEVICE_PLUGIN}: \"true\", or use spec.placement: Managed or Verify"
            ),
            snippet: String::new(),
        };
    }
    if placed {
        return Need::Placed;
    }
    if role == Role::DevicePlugin
        && let Some(owner) = gpu_operator_owner(ds)
    {
        return Need::GpuOperatorOwned {
            message: format!(
                "device plugin DaemonSet {id} belongs to the NVIDIA GPU Operator ({owner}), which reverts edits to it, so spec.placement: {mode:?} cannot keep it off DRA nodes; set spec.placement: GpuOperator, which switches each node by its {LABEL_GPU_OPERATOR_DEVICE_PLUGIN} label and edits no DaemonSet"
            ),
        };
    }
    match mode {
        PlacementMode::Managed => Need::Patch(Box::new(apply_patch(ds, role, sequential))),
        PlacementMode::Verify | PlacementMode::GpuOperator => match device_plugin_chart_release(ds) {
            // From the chart: the change belongs in its values (or the kustomize build of it),
            // since a `helm upgrade` renders the DaemonSet anew.
            Some(release) if role == Role::DevicePlugin => {
                let advice = chart_advice(ds, role, sequential, &release);
                Need::ByHand {
                    message: format!("{}\n{advice}", verify_message(ds, role, sequential)),
                    snippet: advice,
                }
            }
            _ => Need::ByHand {
                message: verify_message(ds, role, sequential),
                snippet: yaml_snippet(ds, role, sequential),
            },
        },
    }
}

/// The Helm release of the `nvidia-device-plugin` chart that renders `ds` (its
/// `app.kubernetes.io/instance` label, empty when absent), or `None` when the chart did not.
pub fn device_plugin_chart_release(ds: &DaemonSet) -> Option<String> {
    let labels = ds.metadata.labels.as_ref()?;
    labels.get("helm.sh/chart").filter(|c| c.starts_with(DEVICE_PLUGIN_CHART_PREFIX))?;
    Some(labels.get("app.kubernetes.io/instance").cloned().unwrap_or_default())
}

/// The DaemonSet's affinity with the role's requirement in every required term: what the chart's
/// `affinity` value must hold (Helm replaces the value whole, so the chart's own terms, for
/// example its default on `feature.node.kubernetes.io/pci-10de.present`, are kept in it).
pub fn placed_affinity(ds: &DaemonSet, role: Role, sequential: bool) -> Affinity {
    let mut affinity = ds.spec.template.spec.as_ref().and_then(|p| p.affinity.clone()).unwrap_or_default();
    let node = affinity.node_affinity.get_or_insert_with(Default::default);
    node.required_during_scheduling_ignored_during_execution =
        Some(NodeSelector { node_selector_terms: merged_terms(ds, role, sequential) });
    affinity
}

/// What to add to the `nvidia-device-plugin` chart's values, and the same as a kustomize patch
/// (a strategic merge patch: `nodeSelectorTerms` is replaced whole, with the terms it had).
pub fn chart_advice(ds: &DaemonSet, role: Role, sequential: bool, release: &str) -> String {
    #[derive(Serialize)]
    struct Values {
        affinity: Affinity,
    }
    let name = ds.metadata.name.as_deref().unwrap_or_default();
    let namespace = ds.metadata.namespace.as_deref().unwrap_or_default();
    let values = serde_yaml::to_string(&Values { affinity: placed_affinity(ds, role, sequential) })
        .unwrap_or_default();
    let smp = serde_json::json!({
        "apiVersion": "apps/v1", "kind": "DaemonSet",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"template": {"spec": {"affinity": {"nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": merged_terms(ds, role, sequential)}}}}}},
    });
    let patch = serde_json::json!({"patches": [{
        "target": {"group": "apps", "version": "v1", "kind": "DaemonSet", "name": name, "namespace": namespace},
        "patch": serde_yaml::to_string(&smp).unwrap_or_default(),
    }]});
    let release = if release.is_empty() { String::new() } else { format!(" (release {release})") };
    format!(
        "# It comes from the nvidia-device-plugin Helm chart{release}: set this in its values\n# (helm upgrade --reuse-values -f this.yaml), keeping the terms it had:\n{values}# Or, where a kustomization renders the chart, add this to it:\n{}",
        serde_yaml::to_string(&patch).unwrap_or_default()
    )
}

/// The required terms after adding the role's requirement to each existing term (or one term
/// with only the requirement when there are none). Terms are ORed, so every one needs it. A
/// backend requirement that no longer suffices (`NotIn [dra]` once the switch is sequential) is
/// replaced, not kept beside the new one.
pub fn merged_terms(ds: &DaemonSet, role: Role, sequential: bool) -> Vec<NodeSelectorTerm> {
    let req = requirement(role, sequential);
    let existing = required_terms(ds).map(<[_]>::to_vec).unwrap_or_default();
    if existing.is_empty() {
        return vec![NodeSelectorTerm { match_expressions: Some(vec![req]), match_fields: None }];
    }
    existing
        .into_iter()
        .map(|mut t| {
            let exprs = t.match_expressions.get_or_insert_with(Vec::new);
            if !exprs.iter().any(|r| satisfies(role, sequential, r)) {
                exprs.retain(|r| r.key != LABEL_GPU_BACKEND);
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
pub fn apply_patch(ds: &DaemonSet, role: Role, sequential: bool) -> PlacementApply {
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
                                node_selector_terms: merged_terms(ds, role, sequential),
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
pub fn yaml_snippet(ds: &DaemonSet, role: Role, sequential: bool) -> String {
    #[derive(Serialize)]
    struct Snippet<'a> {
        spec: &'a PlacementSpec,
    }
    let patch = apply_patch(ds, role, sequential);
    serde_yaml::to_string(&Snippet { spec: &patch.spec }).unwrap_or_default()
}

/// The PlacementReady message for a DaemonSet that lacks its placement in Verify mode.
pub fn verify_message(ds: &DaemonSet, role: Role, sequential: bool) -> String {
    format!(
        "{} DaemonSet {}/{} lacks the backend node affinity; add this to it (or set spec.placement: Managed):\n{}",
        role.describe(),
        ds.metadata.namespace.as_deref().unwrap_or_default(),
        ds.metadata.name.as_deref().unwrap_or_default(),
        yaml_snippet(ds, role, sequential)
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
            assert_eq!(has_placement(&d, role, false), want, "{name}");
        }
    }

    /// The GPU Operator's device-plugin DaemonSet as it renders it: owned by the ClusterPolicy,
    /// selecting nodes by the deploy label.
    fn gpu_operator_ds(owned: bool, labelled: bool, node_selector: serde_json::Value) -> DaemonSet {
        let mut d = ds(json!({"containers": [], "nodeSelector": node_selector}));
        if owned {
            d.metadata.owner_references = Some(vec![serde_json::from_value(json!({
                "apiVersion": "nvidia.com/v1", "kind": "ClusterPolicy", "name": "cluster-policy", "uid": "u", "controller": true
            }))
            .unwrap()]);
        }
        if labelled {
            d.metadata.labels =
                Some([("app.kubernetes.io/managed-by".to_string(), "gpu-operator".to_string())].into());
        }
        d
    }

    #[test]
    fn need_table() {
        use PlacementMode::{GpuOperator, Managed, Verify};
        let deploy = json!({"nvidia.com/gpu.deploy.device-plugin": "true"});
        let owned = gpu_operator_ds(true, false, deploy.clone());
        let labelled = gpu_operator_ds(false, true, deploy.clone());
        let plain = ds(json!({"containers": []}));
        let placed =
            with_terms(json!([{"matchExpressions": [{"key": KEY, "operator": "NotIn", "values": ["dra"]}]}]));
        let by_affinity = with_terms(json!([{"matchExpressions": [
            {"key": "nvidia.com/gpu.deploy.device-plugin", "operator": "In", "values": ["true"]}]}]));
        let not_by_label = gpu_operator_ds(true, false, json!({"nvidia.com/gpu.present": "true"}));
        let mut owned_placed = placed.clone();
        owned_placed.metadata.owner_references = owned.metadata.owner_references.clone();
        let kind = |n: &Need| match n {
            Need::Placed => "Placed",
            Need::Patch(_) => "Patch",
            Need::ByHand { .. } => "ByHand",
            Need::GpuOperatorOwned { .. } => "GpuOperatorOwned",
            Need::AddonManaged { .. } => "AddonManaged",
        };
        let mut addon = plain.clone();
        addon.metadata.labels =
            Some([(LABEL_ADDON_MANAGER_MODE.to_string(), "Reconcile".to_string())].into_iter().collect());
        let mut ensure_exists = plain.clone();
        ensure_exists.metadata.labels =
            Some([(LABEL_ADDON_MANAGER_MODE.to_string(), "EnsureExists".to_string())].into_iter().collect());
        // (name, mode, daemonset, role, what it needs)
        let cases = vec![
            ("Managed refuses an addon-managed plugin", Managed, &addon, Role::DevicePlugin, "AddonManaged"),
            ("so does Verify", Verify, &addon, Role::DevicePlugin, "AddonManaged"),
            ("and GpuOperator", GpuOperator, &addon, Role::DevicePlugin, "AddonManaged"),
            (
                "EnsureExists keeps no edit from sticking",
                Managed,
                &ensure_exists,
                Role::DevicePlugin,
                "Patch",
            ),
            ("Managed patches a plain plugin", Managed, &plain, Role::DevicePlugin, "Patch"),
            ("Verify asks for it", Verify, &plain, Role::DevicePlugin, "ByHand"),
            (
                "Managed refuses the ClusterPolicy's plugin",
                Managed,
                &owned,
                Role::DevicePlugin,
                "GpuOperatorOwned",
            ),
            (
                "Verify refuses it too: the admin's edit would be reverted",
                Verify,
                &owned,
                Role::DevicePlugin,
                "GpuOperatorOwned",
            ),
            (
                "the operator's label is enough to tell",
                Managed,
                &labelled,
                Role::DevicePlugin,
                "GpuOperatorOwned",
            ),
            (
                "GpuOperator takes the ClusterPolicy's plugin",
                GpuOperator,
                &owned,
                Role::DevicePlugin,
                "Placed",
            ),
            (
                "GpuOperator: a required In [true] term selects too",
                GpuOperator,
                &by_affinity,
                Role::DevicePlugin,
                "Placed",
            ),
            (
                "GpuOperator: a plugin with the backend affinity needs nothing",
                GpuOperator,
                &placed,
                Role::DevicePlugin,
                "Placed",
            ),
            (
                "GpuOperator: a plugin the label cannot move",
                GpuOperator,
                &not_by_label,
                Role::DevicePlugin,
                "ByHand",
            ),
            ("GpuOperator edits no driver DaemonSet either", GpuOperator, &plain, Role::Driver, "ByHand"),
            (
                "a GPU Operator plugin already placed is fine under Managed",
                Managed,
                &owned_placed,
                Role::DevicePlugin,
                "Placed",
            ),
        ];
        for (name, mode, d, role, want) in cases {
            assert_eq!(kind(&need(mode, d, role, false)), want, "{name}");
        }
        let Need::GpuOperatorOwned { message } = need(Managed, &owned, Role::DevicePlugin, false) else {
            unreachable!()
        };
        assert!(message.contains("ClusterPolicy cluster-policy"), "{message}");
        assert!(message.contains("set spec.placement: GpuOperator"), "{message}");
        let Need::ByHand { message, .. } = need(GpuOperator, &not_by_label, Role::DevicePlugin, false) else {
            unreachable!()
        };
        assert!(message.contains("nvidia.com/gpu.deploy.device-plugin"), "{message}");
    }

    #[test]
    fn the_device_plugin_charts_daemonset_gets_values_and_a_kustomize_patch() {
        // As the chart renders it: its labels and its default affinity on NFD's PCI label.
        let mut d = with_terms(json!([{"matchExpressions": [
            {"key": "feature.node.kubernetes.io/pci-10de.present", "operator": "In", "values": ["true"]}]}]));
        d.metadata.labels = Some(
            [
                ("helm.sh/chart".to_string(), "nvidia-device-plugin-0.17.1".to_string()),
                ("app.kubernetes.io/instance".to_string(), "ndp".to_string()),
            ]
            .into(),
        );
        assert_eq!(device_plugin_chart_release(&d).as_deref(), Some("ndp"));
        assert_eq!(device_plugin_chart_release(&ds(json!({"containers": []}))), None);
        let Need::ByHand { message, snippet } = need(PlacementMode::Verify, &d, Role::DevicePlugin, false)
        else {
            panic!("Verify asks for it")
        };
        assert!(message.contains("nvidia-device-plugin Helm chart (release ndp)"), "{message}");
        assert!(message.ends_with(&snippet));
        // The values part: the chart's term kept, ours added; it reads back as a placed template.
        let values_part = snippet.split("# Or,").next().unwrap().to_string();
        let values: serde_json::Value = serde_yaml::from_str(&values_part).unwrap();
        let terms = &values["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"];
        assert!(has_placement(&with_terms(terms.clone()), Role::DevicePlugin, false), "{values_part}");
        assert!(values_part.contains("feature.node.kubernetes.io/pci-10de.present"), "{values_part}");
        // The kustomize part: a patches entry whose strategic merge patch carries the same terms.
        let kustomize: serde_json::Value =
            serde_yaml::from_str(snippet.split("add this to it:\n").nth(1).unwrap()).unwrap();
        let entry = &kustomize["patches"][0];
        assert_eq!(
            (entry["target"]["kind"].as_str(), entry["target"]["name"].as_str()),
            (Some("DaemonSet"), Some("nvidia-device-plugin"))
        );
        let smp: serde_json::Value = serde_yaml::from_str(entry["patch"].as_str().unwrap()).unwrap();
        let patched = &smp["spec"]["template"]["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
            ["nodeSelectorTerms"];
        assert_eq!(patched, terms);
    }

    #[test]
    fn merged_terms_keep_existing_ones() {
        let d = with_terms(json!([
            {"matchExpressions": [{"key": "nvidia.com/gpu.present", "operator": "In", "values": ["true"]}]},
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}
        ]));
        let terms = merged_terms(&d, Role::DevicePlugin, false);
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
        assert!(has_placement(&patched, Role::DevicePlugin, false));
        assert_eq!(merged_terms(&patched, Role::DevicePlugin, false), terms);
    }

    #[test]
    fn apply_patch_holds_only_the_affinity() {
        let d = ds(json!({"containers": [{"name": "c", "image": "i"}]}));
        let v = serde_json::to_value(apply_patch(&d, Role::Driver, false)).unwrap();
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
        let msg = verify_message(&d, Role::DevicePlugin, false);
        assert!(msg.starts_with("device plugin DaemonSet gpu/nvidia-device-plugin lacks"));
        let snippet = yaml_snippet(&d, Role::DevicePlugin, false);
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

    #[test]
    fn a_sequential_switch_needs_the_device_plugin_off_none_nodes_too() {
        let notin = |values: serde_json::Value| {
            with_terms(json!([{"matchExpressions": [
                {"key": "feature.node.kubernetes.io/pci-10de.present", "operator": "In", "values": ["true"]},
                {"key": KEY, "operator": "NotIn", "values": values}]}]))
        };
        let interlocked = notin(json!(["dra"]));
        assert!(has_placement(&interlocked, Role::DevicePlugin, false));
        assert!(!has_placement(&interlocked, Role::DevicePlugin, true), "none nodes would keep the plugin");
        assert!(has_placement(&notin(json!(["none", "dra"])), Role::DevicePlugin, true));
        // The driver's placement does not change: it runs on dra nodes only.
        let driver =
            with_terms(json!([{"matchExpressions": [{"key": KEY, "operator": "In", "values": ["dra"]}]}]));
        assert!(has_placement(&driver, Role::Driver, true));

        // Managed replaces the old requirement instead of adding a second one, and keeps the rest.
        let Need::Patch(patch) = need(PlacementMode::Managed, &interlocked, Role::DevicePlugin, true) else {
            panic!("expected a patch");
        };
        let v = serde_json::to_value(&patch.spec).unwrap();
        assert_eq!(
            v["template"]["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
                ["nodeSelectorTerms"],
            json!([{"matchExpressions": [
                {"key": "feature.node.kubernetes.io/pci-10de.present", "operator": "In", "values": ["true"]},
                {"key": KEY, "operator": "NotIn", "values": ["dra", "none"]}]}])
        );
        // Verify says the same, by hand.
        let Need::ByHand { snippet, .. } =
            need(PlacementMode::Verify, &interlocked, Role::DevicePlugin, true)
        else {
            panic!("expected advice");
        };
        assert!(snippet.contains("- none"), "{snippet}");
        // Once patched, it is placed.
        let mut patched = interlocked.clone();
        patched.spec.template.spec.as_mut().unwrap().affinity =
            Some(placed_affinity(&interlocked, Role::DevicePlugin, true));
        assert_eq!(need(PlacementMode::Managed, &patched, Role::DevicePlugin, true), Need::Placed);
    }
}
