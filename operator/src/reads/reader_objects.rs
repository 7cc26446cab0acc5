//! Reads what [`crate::pool::readers`] judges. Read-only: every call is a LIST (paged) or discovery.
//! Optional kinds (Kueue, Karpenter, Prometheus Operator) are looked up by API group; a group that
//! is not served, or a kind the caller may not list, is recorded in `Observed::skipped` instead of
//! failing the whole inventory.

use crate::node::slim::SlimNode;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use k8s_openapi::api::core::v1::{ConfigMap, LimitRange, ResourceQuota};
use k8s_openapi::api::resource::v1::DeviceClass;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::api::{Api, DynamicObject, ListParams};
use kube::{Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;

use crate::api::v1alpha1::GpuPoolMigrationSpec;
use crate::pool::readers::{Observed, PoolNodeLabels, Target};

/// Items per LIST page.
const PAGE: u32 = 500;

/// What to read beyond the always-read kinds, and what the caller already holds.
#[derive(Clone, Debug, Default)]
pub struct Scope {
    /// Read ConfigMaps in every namespace, looking for dashboards and rule files. The CLI does by
    /// default (with the user's rights); the operator does not, so it needs no cluster-wide read
    /// of ConfigMaps.
    pub config_maps: bool,
    /// Every DeviceClass, when the caller has them already (the operator's cache, the plan's
    /// own LIST); `None` lists them.
    pub device_classes: Option<Vec<DeviceClass>>,
}

/// The targets of a migration spec.
pub fn targets(spec: &GpuPoolMigrationSpec) -> Vec<Target> {
    spec.resources
        .iter()
        .map(|r| Target {
            extended_resource_name: r.extended_resource_name.clone(),
            device_class_name: r.device_class_name.clone(),
        })
        .collect()
}

/// Pool nodes as the inventory sees them.
pub fn pool_nodes(nodes: &[impl std::borrow::Borrow<SlimNode>]) -> Vec<PoolNodeLabels> {
    nodes
        .iter()
        .map(|n| n.borrow())
        .map(|n| PoolNodeLabels { name: n.name_any(), labels: n.labels().clone() })
        .collect()
}

/// Why a LIST yielded nothing usable: the kind is not served, or not readable by us.
enum Missing {
    NotServed,
    Forbidden,
}

/// Lists every object `lp` selects, page by page (500 a page), so that no one response holds
/// a whole large collection.
pub async fn list_all<K>(api: Api<K>, lp: ListParams) -> Result<Vec<K>, kube::Error>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug,
{
    let mut out = Vec::new();
    let mut lp = lp.limit(PAGE);
    loop {
        let page = api.list(&lp).await?;
        out.extend(page.items);
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(c) => lp = lp.continue_token(&c),
            None => return Ok(out),
        }
    }
}

/// Lists, turning 403 and 404 into a reason to skip.
async fn list_or_skip<K>(api: Api<K>) -> Result<Result<Vec<K>, Missing>, kube::Error>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug,
{
    match list_all(api, ListParams::default()).await {
        Ok(v) => Ok(Ok(v)),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(Err(Missing::NotServed)),
        Err(kube::Error::Api(s)) if s.code == 403 => Ok(Err(Missing::Forbidden)),
        Err(e) => Err(e),
    }
}

fn skip_reason(what: &str, m: Missing) -> String {
    match m {
        Missing::NotServed => format!("{what}: not served by this cluster"),
        Missing::Forbidden => format!("{what}: forbidden (no list permission)"),
    }
}

/// Lists the custom resources of `kind` in `group` when the group is served; `None` (with a
/// reason in `skipped`) when it is not.
async fn list_custom(
    client: &Client,
    group: &str,
    kind: &str,
    label: &str,
    skipped: &mut Vec<String>,
) -> Result<Option<Vec<DynamicObject>>, kube::Error> {
    let discovered = match kube::discovery::group(client, group).await {
        Ok(g) => g,
        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 403 => {
            skipped.push(format!("{label}: CRDs not installed"));
            return Ok(None);
        }
        // kube reports an unknown group as a discovery error rather than a 404 status.
        Err(kube::Error::Discovery(_)) => {
            skipped.push(format!("{label}: CRDs not installed"));
            return Ok(None);
        }
        Err(e) => return Err(e),
    };
    let Some((ar, _caps)) = discovered.recommended_kind(kind) else {
        skipped.push(format!("{label}: group {group} serves no {kind}"));
        return Ok(None);
    };
    match list_or_skip(Api::<DynamicObject>::all_with(client.clone(), &ar)).await? {
        Ok(v) => Ok(Some(v)),
        Err(m) => {
            skipped.push(skip_reason(label, m));
            Ok(None)
        }
    }
}

/// True for a Deployment whose containers run cluster-autoscaler.
fn runs_cluster_autoscaler(d: &Deployment) -> bool {
    d.spec.template.spec.as_ref().is_some_and(|s| {
        s.containers.iter().any(|c| c.image.as_deref().is_some_and(|i| i.contains("cluster-autoscaler")))
    })
}

/// Reads everything the inventory looks at for `targets` and the pool's nodes.
pub async fn observe(
    client: &Client,
    targets: Vec<Target>,
    node_selector: Option<LabelSelector>,
    pool_nodes: Vec<PoolNodeLabels>,
    scope: Scope,
) -> Result<Observed, kube::Error> {
    let mut skipped = Vec::new();
    let mut o = Observed { targets, node_selector, pool_nodes, ..Default::default() };
    macro_rules! core_list {
        ($field:ident, $ty:ty, $label:expr) => {
            match list_or_skip(Api::<$ty>::all(client.clone())).await? {
                Ok(v) => o.$field = v,
                Err(m) => skipped.push(skip_reason($label, m)),
            }
        };
    }
    core_list!(resource_quotas, ResourceQuota, "ResourceQuotas");
    core_list!(limit_ranges, LimitRange, "LimitRanges");
    match scope.device_classes {
        Some(known) => o.device_classes = known,
        None => core_list!(device_classes, DeviceClass, "DeviceClasses"),
    }
    core_list!(hpas, HorizontalPodAutoscaler, "HorizontalPodAutoscalers");
    match list_or_skip(Api::<Deployment>::all(client.clone())).await? {
        Ok(v) => o.cluster_autoscalers = v.into_iter().filter(runs_cluster_autoscaler).collect(),
        Err(m) => skipped.push(skip_reason("Deployments (cluster-autoscaler)", m)),
    }
    o.kueue_cluster_queues =
        list_custom(client, "kueue.x-k8s.io", "ClusterQueue", "Kueue", &mut skipped).await?;
    if o.kueue_cluster_queues.is_some() {
        o.kueue_resource_flavors =
            list_custom(client, "kueue.x-k8s.io", "ResourceFlavor", "Kueue ResourceFlavors", &mut skipped)
                .await?;
    }
    o.karpenter_node_pools =
        list_custom(client, "karpenter.sh", "NodePool", "Karpenter NodePools", &mut skipped).await?;
    o.prometheus_rules =
        list_custom(client, "monitoring.coreos.com", "PrometheusRule", "PrometheusRules", &mut skipped)
            .await?;
    if scope.config_maps {
        match list_or_skip(Api::<ConfigMap>::all(client.clone())).await? {
            Ok(v) => o.config_maps = Some(v),
            Err(m) => skipped.push(skip_reason("ConfigMaps", m)),
        }
    } else {
        skipped.push("ConfigMaps: not scanned (the operator leaves them to `switchyard inventory`)".into());
    }
    o.skipped = skipped;
    Ok(o)
}
