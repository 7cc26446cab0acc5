//! What discovery says about the API server: its version, the resource.k8s.io/v1 kinds it
//! serves, and (only where a node or the server is older than 1.37) a dry-run probe of
//! `extendedResourceName`; and the DaemonSets a migration names. Read-only.

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::resource::v1::DeviceClass;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Client;
use kube::api::{Api, PostParams};
use tracing::warn;

use crate::error::{Error, Result};
use crate::pool::prerequisites::{self, ExtendedResourceProbe, NodeVersions, ServedApis, ServerFacts};

/// The name of the DeviceClass used only in the dry-run probe.
const PROBE_CLASS: &str = "switchyard-probe-extended-resource";
/// The extended resource name used only in the dry-run probe.
const PROBE_RESOURCE: &str = "probe.switchyard.dev/gpu";

/// Server version, served resource.k8s.io/v1 kinds and, when a pool node or the server is older
/// than 1.37, the dry-run probe for `extendedResourceName`. Read-only.
pub async fn discover_server(client: &Client, nodes: &[NodeVersions]) -> Result<ServerFacts> {
    let info = client.apiserver_version().await.map_err(|source| Error::Discovery { source })?;
    let served = served_apis(client).await?;
    let mut facts =
        ServerFacts { git_version: info.git_version, served, probe: ExtendedResourceProbe::NotRun };
    if served.device_classes && prerequisites::probe_needed(&facts.git_version, nodes) {
        facts.probe = probe_extended_resource(client).await;
    }
    Ok(facts)
}

/// Which resource.k8s.io/v1 kinds the API server serves. Read-only.
pub async fn served_apis(client: &Client) -> Result<ServedApis> {
    match client.list_api_group_resources("resource.k8s.io/v1").await {
        Ok(list) => {
            let has = |n: &str| list.resources.iter().any(|r| r.name == n);
            Ok(ServedApis {
                device_classes: has("deviceclasses"),
                resource_slices: has("resourceslices"),
                resource_claims: has("resourceclaims"),
                device_taint_rules: has("devicetaintrules"),
            })
        }
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(ServedApis::default()),
        Err(source) => Err(Error::Discovery { source }),
    }
}

async fn probe_extended_resource(client: &Client) -> ExtendedResourceProbe {
    let api: Api<DeviceClass> = Api::all(client.clone());
    let dc = DeviceClass {
        metadata: ObjectMeta { name: Some(PROBE_CLASS.into()), ..Default::default() },
        spec: Some(k8s_openapi::api::resource::v1::DeviceClassSpec {
            extended_resource_name: Some(PROBE_RESOURCE.into()),
            ..Default::default()
        }),
    };
    match api.create(&PostParams { dry_run: true, ..Default::default() }, &dc).await {
        Ok(got) if got.spec.as_ref().and_then(|s| s.extended_resource_name.as_ref()).is_some() => {
            ExtendedResourceProbe::Kept
        }
        Ok(_) => ExtendedResourceProbe::Dropped,
        Err(e) => {
            warn!(error = %e, "DRAExtendedResource dry-run probe failed");
            ExtendedResourceProbe::NotRun
        }
    }
}

/// A DaemonSet, or `None` when it does not exist.
pub async fn get_daemonset(client: &Client, ns: &str, name: &str) -> Result<Option<DaemonSet>> {
    Api::<DaemonSet>::namespaced(client.clone(), ns)
        .get_opt(name)
        .await
        .map_err(|source| Error::GetDaemonSet { namespace: ns.into(), name: name.into(), source })
}
