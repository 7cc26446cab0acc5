//! The capacity-reader inventory: who in the cluster still counts GPUs the device-plugin way, and
//! what happens to them when nodes move to DRA. Step 2 of the migration runbook.
//!
//! Pure: [`Observed`] holds what was read from the API (see `crate::reads::reader_objects`), [`find`]
//! turns it into [`Finding`]s, each with a severity and one line of advice. The CLI prints them;
//! the operator summarises them in the `InventoryFindings` condition.
//!
//! What a DRA-served extended resource does to each reader (Kubernetes v1.37):
//! - `node.status.capacity`/`allocatable` no longer list the resource on migrated nodes: the DRA
//!   driver advertises through ResourceSlices. Dashboards and rules built on
//!   `kube_node_status_allocatable{resource="nvidia_com_gpu"}` see the pool shrink to zero.
//! - ResourceQuota: the pod still requests `nvidia.com/gpu`, so `requests.nvidia.com/gpu` keeps
//!   counting it once. Its generated ResourceClaim is also charged to
//!   `<class>.deviceclass.resource.k8s.io/devices`. A namespace with both keys pays for one GPU in
//!   both, so two budgets meant to add up (device plugin + DRA) end up limiting the same GPUs.
//! - Kueue counts what pods request; the extended resource name is the quota key that counts a
//!   GPU once whichever backend serves it. A DRA key beside it counts the generated claim again.

use crate::node::str_map::StrMap;
use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use k8s_openapi::api::core::v1::{ConfigMap, LimitRange, ResourceQuota};
use k8s_openapi::api::resource::v1::DeviceClass;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::ResourceExt;
use kube::api::DynamicObject;
use kube::core::{Selector, SelectorExt};
use serde::Serialize;

use crate::pool::device_classes::{self, ClassInfo};

/// How much a finding matters.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub enum Severity {
    /// Keeps working; worth knowing.
    Info,
    /// Will read wrong numbers or behave differently once nodes move.
    Warning,
    /// Breaks scheduling, quota or scaling for the pool; fix before migrating.
    Critical,
}

impl std::fmt::Display for Severity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Severity::Info => "info",
            Severity::Warning => "warning",
            Severity::Critical => "critical",
        })
    }
}

/// One thing that reads GPU capacity, and what to do about it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Finding {
    pub severity: Severity,
    /// The object's kind, for example `ResourceQuota` or `ClusterQueue`.
    pub kind: String,
    /// `namespace/name`, or `name` for cluster-scoped objects.
    pub object: String,
    /// What it does with the resource and what the migration changes.
    pub message: String,
    /// One line on what to do.
    pub advice: String,
}

impl Finding {
    /// `critical ResourceQuota team-a/gpu: message`; the short form the condition lists.
    pub fn headline(&self) -> String {
        format!("{} {} {}: {}", self.severity, self.kind, self.object, self.message)
    }
}

/// A resource the migration moves: the extended resource name and the DeviceClass that serves it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    pub extended_resource_name: String,
    pub device_class_name: String,
}

/// A pool node: its name and labels, to see which node groups and NodePools cover the pool.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PoolNodeLabels {
    pub name: String,
    pub labels: StrMap,
}

/// What the inventory looks at. `None` for a kind means it was not read (its API is not served,
/// or reading it was not asked for); the inventory says so instead of pretending it found nothing.
#[derive(Clone, Debug, Default)]
pub struct Observed {
    pub targets: Vec<Target>,
    /// The pool's node selector, to match NodePool templates that would create pool nodes.
    pub node_selector: Option<LabelSelector>,
    pub pool_nodes: Vec<PoolNodeLabels>,
    pub resource_quotas: Vec<ResourceQuota>,
    pub limit_ranges: Vec<LimitRange>,
    pub device_classes: Vec<DeviceClass>,
    pub hpas: Vec<HorizontalPodAutoscaler>,
    /// Deployments whose containers run cluster-autoscaler.
    pub cluster_autoscalers: Vec<Deployment>,
    /// Kueue ClusterQueues, when Kueue's CRDs are installed.
    pub kueue_cluster_queues: Option<Vec<DynamicObject>>,
    /// Kueue ResourceFlavors, when Kueue's CRDs are installed.
    pub kueue_resource_flavors: Option<Vec<DynamicObject>>,
    /// Karpenter NodePools, when Karpenter's CRDs are installed.
    pub karpenter_node_pools: Option<Vec<DynamicObject>>,
    /// Prometheus Operator PrometheusRules, when its CRDs are installed.
    pub prometheus_rules: Option<Vec<DynamicObject>>,
    /// ConfigMaps (dashboards, rule files), when asked to scan them.
    pub config_maps: Option<Vec<ConfigMap>>,
    /// What was not looked at, and why (`Kueue: CRDs not installed`, `ConfigMaps: forbidden`).
    pub skipped: Vec<String>,
}

/// Node labels cloud providers put on nodes to name their node group, as cluster-autoscaler
/// knows them.
pub const NODE_GROUP_LABELS: &[&str] = &[
    "eks.amazonaws.com/nodegroup",
    "alpha.eksctl.io/nodegroup-name",
    "cloud.google.com/gke-nodepool",
    "kubernetes.azure.com/agentpool",
    "node.kubernetes.io/instance-group",
    "topology.kubernetes.io/node-group",
];
/// The label Karpenter puts on the nodes it launches, naming their NodePool.
pub const KARPENTER_NODEPOOL_LABEL: &str = "karpenter.sh/nodepool";
/// The cluster-autoscaler flag that turns on DRA handling; locked on from 1.35.
const CA_DRA_FLAG: &str = "--enable-dynamic-resource-allocation";
/// The first cluster-autoscaler minor release where DRA handling is always on.
const CA_DRA_ALWAYS_MINOR: u32 = 35;
/// Metric names that read node capacity (kube-state-metrics).
const CAPACITY_METRICS: &[&str] = &["kube_node_status_capacity", "kube_node_status_allocatable"];

/// `nvidia.com/gpu` → `nvidia_com_gpu`, the form kube-state-metrics uses in its `resource` label.
pub fn metric_form(resource: &str) -> String {
    resource.chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '_' }).collect()
}

/// `<class>.deviceclass.resource.k8s.io/devices`: the quota key a claim for `class` is charged to.
pub fn device_class_quota_key(class: &str) -> String {
    format!("{class}.deviceclass.resource.k8s.io/devices")
}

/// `requests.deviceclass.resource.kubernetes.io/<class>`: the implicit extended resource's key.
pub fn implicit_quota_key(class: &str) -> String {
    format!("requests.deviceclass.resource.kubernetes.io/{class}")
}

fn ns_name(namespace: Option<&str>, name: &str) -> String {
    match namespace {
        Some(ns) if !ns.is_empty() => format!("{ns}/{name}"),
        _ => name.to_string(),
    }
}

fn object_name<K: kube::Resource>(o: &K) -> String {
    ns_name(o.meta().namespace.as_deref(), o.meta().name.as_deref().unwrap_or_default())
}

fn finding(severity: Severity, kind: &str, object: String, message: String, advice: &str) -> Finding {
    Finding { severity, kind: kind.into(), object, message, advice: advice.into() }
}

/// Every finding, most severe first, then by kind and object.
pub fn find(o: &Observed) -> Vec<Finding> {
    let mut out = Vec::new();
    out.extend(device_class_findings(o));
    out.extend(quota_findings(o));
    out.extend(limit_range_findings(o));
    out.extend(kueue_findings(o));
    out.extend(autoscaler_findings(o));
    out.extend(karpenter_findings(o));
    out.extend(hpa_findings(o));
    out.extend(text_findings(o));
    out.sort_by(|a, b| {
        b.severity.cmp(&a.severity).then_with(|| a.kind.cmp(&b.kind)).then_with(|| a.object.cmp(&b.object))
    });
    out
}

/// Counts by severity, for a one-line summary.
pub fn summary(findings: &[Finding]) -> String {
    if findings.is_empty() {
        return "no findings".into();
    }
    let count = |s| findings.iter().filter(|f| f.severity == s).count();
    let parts: Vec<String> = [Severity::Critical, Severity::Warning, Severity::Info]
        .into_iter()
        .map(|s| (s, count(s)))
        .filter(|(_, n)| *n > 0)
        .map(|(s, n)| format!("{n} {s}"))
        .collect();
    format!("{} finding(s): {}", findings.len(), parts.join(", "))
}

fn device_class_findings(o: &Observed) -> Vec<Finding> {
    let infos: Vec<ClassInfo> = o.device_classes.iter().map(Into::into).collect();
    let ours: BTreeSet<&str> = o.targets.iter().map(|t| t.device_class_name.as_str()).collect();
    let mut out = Vec::new();
    for t in &o.targets {
        let winner = device_classes::winner(&infos, &t.extended_resource_name);
        for c in infos.iter().filter(|c| {
            c.extended_resource_name.as_deref() == Some(t.extended_resource_name.as_str())
                && !ours.contains(c.name.as_str())
        }) {
            let wins = winner.is_some_and(|w| w.name == c.name);
            let ours_exists = infos.iter().any(|x| x.name == t.device_class_name);
            out.push(if wins && !ours_exists {
                finding(
                    Severity::Warning,
                    "DeviceClass",
                    c.name.clone(),
                    format!(
                        "maps {} today; the DeviceClass {} that the migration creates will be newer and take the name over",
                        t.extended_resource_name, t.device_class_name
                    ),
                    "remove spec.extendedResourceName from it so one class owns the name; claims already allocated from it keep their devices",
                )
            } else if wins {
                finding(
                    Severity::Critical,
                    "DeviceClass",
                    c.name.clone(),
                    format!(
                        "also maps {} and is the newest such class, so the scheduler allocates {} pods from it instead of {}",
                        t.extended_resource_name, t.extended_resource_name, t.device_class_name
                    ),
                    "remove spec.extendedResourceName from it (or delete it) before migrating; the migration waits until it is gone, then re-applies its own class so the scheduler maps the name to it",
                )
            } else {
                finding(
                    Severity::Warning,
                    "DeviceClass",
                    c.name.clone(),
                    format!(
                        "also maps {}; {} is newer and wins today, but recreating {} would take the name over",
                        t.extended_resource_name, t.device_class_name, c.name
                    ),
                    "remove spec.extendedResourceName from it so one class owns the name",
                )
            });
        }
    }
    out
}

fn quota_findings(o: &Observed) -> Vec<Finding> {
    let mut out = Vec::new();
    for q in &o.resource_quotas {
        let hard = q.spec.as_ref().and_then(|s| s.hard.as_ref());
        let Some(hard) = hard else { continue };
        let used = q.status.as_ref().and_then(|s| s.used.as_ref());
        let show = |key: &str| {
            let h = hard.get(key).map(|v| v.0.as_str()).unwrap_or("?");
            match used.and_then(|u| u.get(key)) {
                Some(u) => format!("{key} (used {}/{h})", u.0),
                None => format!("{key} (hard {h})"),
            }
        };
        for t in &o.targets {
            let ext = t.extended_resource_name.as_str();
            let requests_key = format!("requests.{ext}");
            let limits_key = format!("limits.{ext}");
            let class_key = device_class_quota_key(&t.device_class_name);
            let implicit_key = implicit_quota_key(&t.device_class_name);
            let has = |k: &str| hard.contains_key(k);
            let object = object_name(q);
            if has(&limits_key) {
                out.push(finding(
                    Severity::Warning,
                    "ResourceQuota",
                    object.clone(),
                    format!(
                        "sets {limits_key}, which quota never counts for extended resources (only requests.{ext} is)"
                    ),
                    "replace it with requests.<resource>; it limits nothing on either backend",
                ));
            }
            let dra_keys: Vec<&String> = [&class_key, &implicit_key].into_iter().filter(|k| has(k)).collect();
            match (has(&requests_key), dra_keys.is_empty()) {
                (true, false) => out.push(finding(
                    Severity::Warning,
                    "ResourceQuota",
                    object.clone(),
                    format!(
                        "charges a pod on a migrated node twice: {} by the pod, and {} by its generated ResourceClaim; the same GPUs count against both budgets",
                        show(&requests_key),
                        dra_keys.iter().map(|k| show(k)).collect::<Vec<_>>().join(" and ")
                    ),
                    "keep one GPU budget per namespace: requests.<resource> counts pods on both backends once",
                )),
                (false, false) => out.push(finding(
                    Severity::Warning,
                    "ResourceQuota",
                    object.clone(),
                    format!(
                        "limits DRA devices with {} but not {requests_key}: GPU pods count against it only once their node is migrated, and a pod whose generated claim exceeds it stays Pending",
                        dra_keys.iter().map(|k| show(k)).collect::<Vec<_>>().join(" and ")
                    ),
                    "size it for every GPU pod in the namespace, or quota requests.<resource> instead",
                )),
                (true, true) => out.push(finding(
                    Severity::Info,
                    "ResourceQuota",
                    object.clone(),
                    format!(
                        "{} keeps counting: pods still request {ext} on both backends, and generated claims are not charged again",
                        show(&requests_key)
                    ),
                    "nothing to change; ResourceClaims that name the class directly are charged to it too",
                )),
                (false, true) => {}
            }
        }
    }
    out
}

fn limit_range_findings(o: &Observed) -> Vec<Finding> {
    let mut out = Vec::new();
    for lr in &o.limit_ranges {
        let Some(spec) = lr.spec.as_ref() else { continue };
        for t in &o.targets {
            let ext = t.extended_resource_name.as_str();
            let mut fields = BTreeSet::new();
            for item in &spec.limits {
                for (field, map) in [
                    ("default", &item.default),
                    ("defaultRequest", &item.default_request),
                    ("max", &item.max),
                    ("min", &item.min),
                    ("maxLimitRequestRatio", &item.max_limit_request_ratio),
                ] {
                    if map.as_ref().is_some_and(|m| m.contains_key(ext)) {
                        fields.insert(format!("{}.{field}", item.type_));
                    }
                }
            }
            if fields.is_empty() {
                continue;
            }
            let injects = fields.iter().any(|f| f.ends_with(".default") || f.ends_with(".defaultRequest"));
            let fields: Vec<String> = fields.into_iter().collect();
            out.push(if injects {
                finding(
                    Severity::Warning,
                    "LimitRange",
                    object_name(lr),
                    format!(
                        "sets a default {ext} ({}): every container without its own gets one, and on migrated nodes each such pod also gets a generated ResourceClaim",
                        fields.join(", ")
                    ),
                    "remove the default unless every pod in the namespace really needs a GPU",
                )
            } else {
                finding(
                    Severity::Info,
                    "LimitRange",
                    object_name(lr),
                    format!(
                        "bounds {ext} ({}); still enforced, since pods keep the same resources.limits",
                        fields.join(", ")
                    ),
                    "nothing to change; it does not bound ResourceClaims written by hand",
                )
            });
        }
    }
    out
}

fn strings_at<'a>(v: &'a serde_json::Value, path: &[&str]) -> Vec<&'a serde_json::Value> {
    let mut cur = vec![v];
    for key in path {
        let mut next = Vec::new();
        for c in cur {
            match c.get(*key) {
                Some(serde_json::Value::Array(items)) => next.extend(items.iter()),
                Some(x) => next.push(x),
                None => {}
            }
        }
        cur = next;
    }
    cur
}

fn kueue_findings(o: &Observed) -> Vec<Finding> {
    let mut out = Vec::new();
    let Some(queues) = &o.kueue_cluster_queues else { return out };
    let classes: BTreeSet<&str> = o.targets.iter().map(|t| t.device_class_name.as_str()).collect();
    for cq in queues {
        let covered: BTreeSet<String> = strings_at(&cq.data, &["spec", "resourceGroups", "coveredResources"])
            .into_iter()
            .filter_map(|v| v.as_str().map(String::from))
            .collect();
        for t in &o.targets {
            let ext = t.extended_resource_name.as_str();
            // Keys that name the DRA side of the same GPUs: a DeviceClass-derived quota name or
            // a logical resource named after the class.
            let dra_keys: Vec<&String> = covered
                .iter()
                .filter(|k| {
                    k.as_str() != ext
                        && (classes.contains(k.as_str())
                            || k.contains(".deviceclass.resource.k8s.io")
                            || k.starts_with("deviceclass.resource.kubernetes.io/"))
                })
                .collect();
            let object = cq.name_any();
            match (covered.contains(ext), dra_keys.is_empty()) {
                (true, true) => out.push(finding(
                    Severity::Info,
                    "ClusterQueue",
                    object,
                    format!("uses {ext} as its quota key, which counts a GPU once on either backend"),
                    "nothing to change",
                )),
                (true, false) => out.push(finding(
                    Severity::Warning,
                    "ClusterQueue",
                    object,
                    format!(
                        "covers {ext} and also {}: a pod on a migrated node is counted for {ext} and again for its generated claim",
                        dra_keys.iter().map(|k| k.as_str()).collect::<Vec<_>>().join(", ")
                    ),
                    "use the extended resource name as the only GPU quota key (drop the DeviceClass mapping for this class)",
                )),
                (false, false) => out.push(finding(
                    Severity::Warning,
                    "ClusterQueue",
                    object,
                    format!(
                        "counts GPUs as {} but pods request {ext}, so their GPUs are not counted by that key",
                        dra_keys.iter().map(|k| k.as_str()).collect::<Vec<_>>().join(", ")
                    ),
                    "make the extended resource name the quota key",
                )),
                (false, true) => {}
            }
        }
    }
    for rf in o.kueue_resource_flavors.iter().flatten() {
        let labels: BTreeMap<String, String> = rf
            .data
            .get("spec")
            .and_then(|s| s.get("nodeLabels"))
            .and_then(|l| serde_json::from_value(l.clone()).ok())
            .unwrap_or_default();
        if labels.is_empty() {
            continue;
        }
        let covered = o
            .pool_nodes
            .iter()
            .filter(|n| labels.iter().all(|(k, v)| n.labels.get(k) == Some(v.as_str())))
            .count();
        if covered > 0 {
            out.push(finding(
                Severity::Info,
                "ResourceFlavor",
                rf.name_any(),
                format!(
                    "its nodeLabels select {covered} pool node(s); Kueue admits against quota, not node capacity, so migrating them does not change admission"
                ),
                "nothing to change",
            ));
        }
    }
    out
}

/// The minor version of a cluster-autoscaler image tag: `.../cluster-autoscaler:v1.34.2` → 34.
fn image_minor(image: &str) -> Option<u32> {
    let tag = image.rsplit_once(':')?.1;
    let v = tag.trim_start_matches('v');
    let mut parts = v.split('.');
    let major: u32 = parts.next()?.parse().ok()?;
    let minor: u32 = parts.next()?.parse().ok()?;
    (major == 1).then_some(minor)
}

/// Whether a cluster-autoscaler container handles DRA objects: always from 1.35, else only with
/// the flag set to true.
fn ca_handles_dra(image: &str, args: &[String]) -> Option<bool> {
    let flag = args.iter().find_map(|a| {
        a.strip_prefix(CA_DRA_FLAG).map(|rest| match rest.strip_prefix('=') {
            Some(v) => v == "true",
            None => rest.is_empty(),
        })
    });
    match (image_minor(image), flag) {
        (Some(m), _) if m >= CA_DRA_ALWAYS_MINOR => Some(true),
        (_, Some(f)) => Some(f),
        (Some(_), None) => Some(false),
        (None, None) => None,
    }
}

fn pool_node_groups(o: &Observed) -> BTreeSet<String> {
    o.pool_nodes
        .iter()
        .flat_map(|n| NODE_GROUP_LABELS.iter().filter_map(|l| n.labels.get(l).map(|v| format!("{l}={v}"))))
        .collect()
}

fn autoscaler_findings(o: &Observed) -> Vec<Finding> {
    let groups = pool_node_groups(o);
    let mut out = Vec::new();
    for d in &o.cluster_autoscalers {
        let containers = d.spec.template.spec.as_ref().map(|s| &s.containers);
        let Some(c) = containers.into_iter().flatten().find(|c| {
            c.image.as_deref().is_some_and(|i| i.contains("cluster-autoscaler"))
                || c.name.contains("cluster-autoscaler")
        }) else {
            continue;
        };
        let image = c.image.clone().unwrap_or_default();
        let args: Vec<String> = c.command.iter().flatten().chain(c.args.iter().flatten()).cloned().collect();
        let scope = if groups.is_empty() {
            "no pool node carries a node-group label it could scale".to_string()
        } else {
            format!(
                "the pool's nodes are in node group(s) {}",
                groups.iter().cloned().collect::<Vec<_>>().join(", ")
            )
        };
        let covered = !groups.is_empty();
        out.push(match ca_handles_dra(&image, &args) {
            Some(false) => finding(
                if covered { Severity::Critical } else { Severity::Warning },
                "ClusterAutoscaler",
                object_name(d),
                format!(
                    "{image} runs without DRA handling ({CA_DRA_FLAG} is off): it cannot see DRA devices, so pending GPU pods do not scale up migrated node groups; {scope}"
                ),
                "upgrade to cluster-autoscaler 1.35+ or set --enable-dynamic-resource-allocation=true before migrating pools it scales",
            ),
            Some(true) => finding(
                Severity::Info,
                "ClusterAutoscaler",
                object_name(d),
                format!("{image} handles DRA; it models new nodes from the ResourceSlices of existing ones; {scope}"),
                "keep at least one node per migrated group, or check that scale-from-zero templates carry DRA devices in its release notes",
            ),
            None => finding(
                Severity::Warning,
                "ClusterAutoscaler",
                object_name(d),
                format!("cannot tell from the image tag {image:?} whether it handles DRA; {scope}"),
                "check that it runs with --enable-dynamic-resource-allocation or is 1.35+",
            ),
        });
    }
    out
}

fn karpenter_findings(o: &Observed) -> Vec<Finding> {
    let mut out = Vec::new();
    let selector = o.node_selector.clone().and_then(|s| Selector::try_from(s).ok());
    for np in o.karpenter_node_pools.iter().flatten() {
        let name = np.name_any();
        let launched = o
            .pool_nodes
            .iter()
            .filter(|n| n.labels.get(KARPENTER_NODEPOOL_LABEL) == Some(name.as_str()))
            .count();
        let template_labels: BTreeMap<String, String> = np
            .data
            .get("spec")
            .and_then(|s| s.get("template"))
            .and_then(|t| t.get("metadata"))
            .and_then(|m| m.get("labels"))
            .and_then(|l| serde_json::from_value(l.clone()).ok())
            .unwrap_or_default();
        let joins_pool = selector.as_ref().is_some_and(|s| s.matches(&template_labels));
        if launched == 0 && !joins_pool {
            continue;
        }
        let mut why = Vec::new();
        if launched > 0 {
            why.push(format!("launched {launched} pool node(s)"));
        }
        if joins_pool {
            why.push("its template labels match the pool's nodeSelector, so new nodes join the pool".into());
        }
        out.push(finding(
            Severity::Warning,
            "NodePool",
            name,
            format!(
                "{}; Karpenter provisions for GPU pods from instance-type capacity, and new nodes start on the device plugin until the migration moves them",
                why.join("; ")
            ),
            "check your Karpenter release's DRA support; label the template switchyard.dev/gpu-backend=dra once the pool is migrated so new nodes start on DRA",
        ));
    }
    out
}

fn hpa_findings(o: &Observed) -> Vec<Finding> {
    let mut out = Vec::new();
    for hpa in &o.hpas {
        let Ok(body) = serde_json::to_string(&hpa.spec) else { continue };
        for t in &o.targets {
            let ext = &t.extended_resource_name;
            let metric = metric_form(ext);
            if !body.contains(ext.as_str()) && !body.contains(&metric) {
                continue;
            }
            out.push(finding(
                Severity::Warning,
                "HorizontalPodAutoscaler",
                object_name(hpa),
                format!(
                    "scales on a metric that names {ext}; metrics derived from node capacity drop to zero on migrated nodes"
                ),
                "scale on pod-level GPU metrics (DCGM) or on switchyard_cluster_gpus, which counts both backends and outlives the migration",
            ));
        }
    }
    out
}

/// Dashboards, recording rules and alerts that read node capacity for the resource.
fn text_findings(o: &Observed) -> Vec<Finding> {
    let mut out = Vec::new();
    let mut scan = |kind: &str, object: String, text: &str| {
        for t in &o.targets {
            let ext = &t.extended_resource_name;
            let metric = metric_form(ext);
            let reads_capacity = CAPACITY_METRICS.iter().any(|m| text.contains(m)) && text.contains(&metric);
            let reads_status = text.contains(ext.as_str())
                && (text.contains("status.capacity") || text.contains("status.allocatable"));
            if reads_capacity || reads_status {
                out.push(finding(
                    Severity::Warning,
                    kind,
                    object.clone(),
                    format!("reads {ext} from node capacity or allocatable; migrated nodes report 0 there"),
                    "count GPUs from ResourceSlices, or use switchyard_cluster_gpus{backend=...}, which covers both backends and outlives the migration",
                ));
            }
        }
    };
    for cm in o.config_maps.iter().flatten() {
        let text: String = cm.data.iter().flatten().map(|(_, v)| v.as_str()).collect::<Vec<_>>().join("\n");
        scan("ConfigMap", object_name(cm), &text);
    }
    for r in o.prometheus_rules.iter().flatten() {
        scan("PrometheusRule", ns_name(r.namespace().as_deref(), &r.name_any()), &r.data.to_string());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn target() -> Target {
        Target {
            extended_resource_name: "nvidia.com/gpu".into(),
            device_class_name: "gpu.switchyard.dev".into(),
        }
    }

    fn observed() -> Observed {
        Observed { targets: vec![target()], ..Default::default() }
    }

    fn from<T: serde::de::DeserializeOwned>(v: serde_json::Value) -> T {
        serde_json::from_value(v).expect("test object")
    }

    fn quota(ns: &str, name: &str, hard: serde_json::Value) -> ResourceQuota {
        from(json!({"metadata": {"namespace": ns, "name": name}, "spec": {"hard": hard}}))
    }

    fn pool_node(name: &str, labels: &[(&str, &str)]) -> PoolNodeLabels {
        PoolNodeLabels { name: name.into(), labels: labels.iter().copied().collect() }
    }

    fn only(o: &Observed) -> Finding {
        let f = find(o);
        assert_eq!(f.len(), 1, "{f:#?}");
        f.into_iter().next().expect("one finding")
    }

    #[test]
    fn quota_with_both_keys_explains_the_double_charge() {
        let mut o = observed();
        let mut q = quota(
            "team-a",
            "gpus",
            json!({"requests.nvidia.com/gpu": "8", "gpu.switchyard.dev.deviceclass.resource.k8s.io/devices": "8"}),
        );
        q.status = Some(from(json!({"used": {"requests.nvidia.com/gpu": "3"}})));
        o.resource_quotas = vec![q];
        let f = only(&o);
        assert_eq!(f.severity, Severity::Warning);
        assert_eq!(f.object, "team-a/gpus");
        assert!(f.message.contains("twice"), "{}", f.message);
        assert!(f.message.contains("requests.nvidia.com/gpu (used 3/8)"), "{}", f.message);
        assert!(f.message.contains("gpu.switchyard.dev.deviceclass.resource.k8s.io/devices (hard 8)"));
    }

    #[test]
    fn quota_on_requests_only_keeps_working() {
        let mut o = observed();
        o.resource_quotas = vec![quota("team-a", "gpus", json!({"requests.nvidia.com/gpu": "4"}))];
        let f = only(&o);
        assert_eq!(f.severity, Severity::Info);
        assert!(f.message.contains("keeps counting"));
    }

    #[test]
    fn quota_on_dra_key_only_counts_migrated_nodes_only() {
        let mut o = observed();
        o.resource_quotas = vec![quota(
            "team-b",
            "dra",
            json!({"requests.deviceclass.resource.kubernetes.io/gpu.switchyard.dev": "2"}),
        )];
        let f = only(&o);
        assert_eq!(f.severity, Severity::Warning);
        assert!(f.message.contains("only once their node is migrated"), "{}", f.message);
    }

    #[test]
    fn quota_limits_key_limits_nothing_and_unrelated_quota_is_silent() {
        let mut o = observed();
        o.resource_quotas = vec![
            quota("a", "limits", json!({"limits.nvidia.com/gpu": "2"})),
            quota("b", "cpu", json!({"requests.cpu": "20"})),
        ];
        let f = only(&o);
        assert!(f.message.contains("never counts"));
    }

    #[test]
    fn limit_range_default_injects_gpus_and_max_is_info() {
        let mut o = observed();
        o.limit_ranges = vec![
            from(json!({"metadata": {"namespace": "a", "name": "d"}, "spec": {"limits": [
                {"type": "Container", "default": {"nvidia.com/gpu": "1"}}]}})),
            from(json!({"metadata": {"namespace": "b", "name": "m"}, "spec": {"limits": [
                {"type": "Container", "max": {"nvidia.com/gpu": "2"}}, {"type": "Pod", "max": {"cpu": "4"}}]}})),
        ];
        let f = find(&o);
        assert_eq!(f.len(), 2);
        assert_eq!((f[0].severity, f[0].object.as_str()), (Severity::Warning, "a/d"));
        assert!(f[0].message.contains("Container.default"));
        assert_eq!((f[1].severity, f[1].object.as_str()), (Severity::Info, "b/m"));
        assert!(f[1].message.contains("Container.max"));
    }

    #[test]
    fn shadowing_device_class_is_critical_and_older_one_a_warning() {
        let class = |name: &str, created: &str| -> DeviceClass {
            from(json!({"metadata": {"name": name, "creationTimestamp": created},
                "spec": {"extendedResourceName": "nvidia.com/gpu"}}))
        };
        let mut o = observed();
        o.device_classes = vec![
            class("gpu.switchyard.dev", "2026-01-01T00:00:00Z"),
            class("vendor", "2026-02-01T00:00:00Z"),
        ];
        let f = only(&o);
        assert_eq!((f.severity, f.object.as_str()), (Severity::Critical, "vendor"));
        o.device_classes = vec![
            class("gpu.switchyard.dev", "2026-03-01T00:00:00Z"),
            class("vendor", "2026-02-01T00:00:00Z"),
        ];
        assert_eq!(only(&o).severity, Severity::Warning);
        o.device_classes = vec![class("gpu.switchyard.dev", "2026-03-01T00:00:00Z")];
        assert!(find(&o).is_empty());
        // Ours does not exist yet: the vendor class wins today, ours will win once created.
        o.device_classes = vec![class("vendor", "2026-02-01T00:00:00Z")];
        let f = only(&o);
        assert_eq!(f.severity, Severity::Warning);
        assert!(f.message.contains("take the name over"), "{}", f.message);
    }

    #[test]
    fn kueue_quota_key_is_checked_against_the_extended_resource_name() {
        let cq = |name: &str, keys: serde_json::Value| -> DynamicObject {
            from(
                json!({"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "ClusterQueue", "metadata": {"name": name},
                "spec": {"resourceGroups": [{"coveredResources": keys, "flavors": []}]}}),
            )
        };
        let mut o = observed();
        o.kueue_cluster_queues = Some(vec![
            cq("good", json!(["cpu", "nvidia.com/gpu"])),
            cq("double", json!(["nvidia.com/gpu", "gpu.switchyard.dev"])),
            cq("dra-only", json!(["gpu.switchyard.dev.deviceclass.resource.k8s.io/devices"])),
            cq("cpu", json!(["cpu"])),
        ]);
        let f = find(&o);
        let by: BTreeMap<&str, (Severity, &str)> =
            f.iter().map(|x| (x.object.as_str(), (x.severity, x.message.as_str()))).collect();
        assert_eq!(by.len(), 3, "{f:#?}");
        assert_eq!(by["good"].0, Severity::Info);
        assert!(by["double"].1.contains("again"));
        assert!(by["dra-only"].1.contains("not counted"));
    }

    #[test]
    fn kueue_flavor_covering_pool_nodes_is_reported() {
        let mut o = observed();
        o.pool_nodes = vec![pool_node("n1", &[("gpu", "a100")]), pool_node("n2", &[("gpu", "h100")])];
        o.kueue_cluster_queues = Some(vec![]);
        o.kueue_resource_flavors = Some(vec![
            from(
                json!({"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "ResourceFlavor", "metadata": {"name": "a100"},
                "spec": {"nodeLabels": {"gpu": "a100"}}}),
            ),
            from(
                json!({"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "ResourceFlavor", "metadata": {"name": "t4"},
                "spec": {"nodeLabels": {"gpu": "t4"}}}),
            ),
        ]);
        let f = only(&o);
        assert_eq!(f.object, "a100");
        assert!(f.message.contains("1 pool node"));
    }

    #[test]
    fn cluster_autoscaler_dra_support_by_version_and_flag() {
        assert_eq!(ca_handles_dra("registry.k8s.io/autoscaling/cluster-autoscaler:v1.35.0", &[]), Some(true));
        assert_eq!(
            ca_handles_dra("registry.k8s.io/autoscaling/cluster-autoscaler:v1.33.1", &[]),
            Some(false)
        );
        let on = vec![format!("{CA_DRA_FLAG}=true")];
        assert_eq!(ca_handles_dra("x/cluster-autoscaler:v1.33.1", &on), Some(true));
        assert_eq!(ca_handles_dra("x/cluster-autoscaler:v1.33.1", &[CA_DRA_FLAG.to_string()]), Some(true));
        assert_eq!(ca_handles_dra("x/cluster-autoscaler:latest", &[]), None);
    }

    #[test]
    fn cluster_autoscaler_without_dra_over_pool_node_groups_is_critical() {
        let mut o = observed();
        o.pool_nodes = vec![pool_node("n1", &[("eks.amazonaws.com/nodegroup", "gpu-a")])];
        o.cluster_autoscalers = vec![from(json!({"metadata": {"namespace": "kube-system", "name": "ca"},
            "spec": {"selector": {}, "template": {"spec": {"containers": [
                {"name": "ca", "image": "registry.k8s.io/autoscaling/cluster-autoscaler:v1.33.1"}]}}}}))];
        let f = only(&o);
        assert_eq!(f.severity, Severity::Critical);
        assert!(f.message.contains("eks.amazonaws.com/nodegroup=gpu-a"), "{}", f.message);
        o.pool_nodes.clear();
        assert_eq!(only(&o).severity, Severity::Warning);
    }

    #[test]
    fn karpenter_nodepool_by_launched_nodes_or_template_labels() {
        let np = |name: &str, labels: serde_json::Value| -> DynamicObject {
            from(json!({"apiVersion": "karpenter.sh/v1", "kind": "NodePool", "metadata": {"name": name},
                "spec": {"template": {"metadata": {"labels": labels}}}}))
        };
        let mut o = observed();
        o.node_selector = Some(from(json!({"matchLabels": {"pool": "a100"}})));
        o.pool_nodes = vec![pool_node("n1", &[("pool", "a100"), (KARPENTER_NODEPOOL_LABEL, "launched")])];
        o.karpenter_node_pools = Some(vec![
            np("launched", json!({})),
            np("joins", json!({"pool": "a100"})),
            np("elsewhere", json!({"pool": "t4"})),
        ]);
        let f = find(&o);
        let names: Vec<&str> = f.iter().map(|x| x.object.as_str()).collect();
        assert_eq!(names, ["joins", "launched"]);
        assert!(f[0].message.contains("new nodes join the pool"));
        assert!(f[1].message.contains("launched 1 pool node"));
    }

    #[test]
    fn hpa_and_dashboards_reading_capacity() {
        let mut o = observed();
        o.hpas = vec![
            from(json!({"metadata": {"namespace": "ml", "name": "by-gpu"}, "spec": {"maxReplicas": 4,
                "scaleTargetRef": {"kind": "Deployment", "name": "x"},
                "metrics": [{"type": "External", "external": {"metric": {"name": "kube_node_status_allocatable",
                    "selector": {"matchLabels": {"resource": "nvidia_com_gpu"}}}, "target": {"type": "Value", "value": "1"}}}]}})),
            from(json!({"metadata": {"namespace": "ml", "name": "by-cpu"}, "spec": {"maxReplicas": 4,
                "scaleTargetRef": {"kind": "Deployment", "name": "x"}}})),
        ];
        o.config_maps = Some(vec![
            from(json!({"metadata": {"namespace": "monitoring", "name": "dash"},
                "data": {"gpu.json": "sum(kube_node_status_allocatable{resource=\"nvidia_com_gpu\"})"}})),
            from(json!({"metadata": {"namespace": "monitoring", "name": "other"}, "data": {"x": "up"}})),
        ]);
        o.prometheus_rules = Some(vec![from(
            json!({"apiVersion": "monitoring.coreos.com/v1", "kind": "PrometheusRule",
            "metadata": {"namespace": "monitoring", "name": "gpu-capacity"},
            "spec": {"groups": [{"name": "g", "rules": [{"record": "x", "expr": "kube_node_status_capacity{resource=\"nvidia_com_gpu\"}"}]}]}}),
        )]);
        let f = find(&o);
        let objects: Vec<(&str, &str)> = f.iter().map(|x| (x.kind.as_str(), x.object.as_str())).collect();
        assert_eq!(
            objects,
            [
                ("ConfigMap", "monitoring/dash"),
                ("HorizontalPodAutoscaler", "ml/by-gpu"),
                ("PrometheusRule", "monitoring/gpu-capacity")
            ]
        );
        assert!(f.iter().all(|x| x.severity == Severity::Warning));
    }

    #[test]
    fn findings_sort_most_severe_first_and_summary_counts() {
        let mut o = observed();
        o.resource_quotas = vec![quota("a", "q", json!({"requests.nvidia.com/gpu": "1"}))];
        let class = |name: &str, created: &str| -> DeviceClass {
            from(json!({"metadata": {"name": name, "creationTimestamp": created},
                "spec": {"extendedResourceName": "nvidia.com/gpu"}}))
        };
        o.device_classes = vec![
            class("gpu.switchyard.dev", "2026-01-01T00:00:00Z"),
            class("vendor", "2026-02-01T00:00:00Z"),
        ];
        let f = find(&o);
        assert_eq!(f[0].severity, Severity::Critical);
        assert_eq!(summary(&f), "2 finding(s): 1 critical, 1 info");
        assert_eq!(summary(&[]), "no findings");
    }

    #[test]
    fn metric_and_quota_key_forms() {
        assert_eq!(metric_form("nvidia.com/mig-1g.10gb"), "nvidia_com_mig_1g_10gb");
        assert_eq!(device_class_quota_key("gpu.x"), "gpu.x.deviceclass.resource.k8s.io/devices");
        assert_eq!(implicit_quota_key("gpu.x"), "requests.deviceclass.resource.kubernetes.io/gpu.x");
    }
}
