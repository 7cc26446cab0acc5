//! What discovery says about the API server: its version, the resource.k8s.io/v1 kinds it
//! serves, and (only where a node or the server is older than 1.37) a dry-run probe of
//! `extendedResourceName`; and the DaemonSets a migration names. Read-only.

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::DeviceClass;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, ListParams, PostParams};
use kube::{Client, ResourceExt};
use tracing::warn;

use crate::error::{Error, Result};
use crate::pool::prerequisites::{
    self, CONTROL_PLANE_COMPONENTS, ComponentVersion, ExtendedResourceProbe, NodeVersions, ServedApis,
    ServerFacts,
};

/// The name of the DeviceClass used only in the dry-run probe.
const PROBE_CLASS: &str = "switchyard-probe-extended-resource";
/// The extended resource name used only in the dry-run probe.
const PROBE_RESOURCE: &str = "probe.switchyard.dev/gpu";

/// Server version, served resource.k8s.io/v1 kinds and, when a pool node or the server is older
/// than 1.37, the dry-run probe for `extendedResourceName`. Read-only.
pub async fn discover_server(client: &Client, nodes: &[NodeVersions]) -> Result<ServerFacts> {
    let info = client.apiserver_version().await.map_err(|source| Error::Discovery { source })?;
    let served = served_apis(client).await?;
    let control_plane = control_plane_versions(client).await;
    let mut facts = ServerFacts {
        git_version: info.git_version,
        control_plane,
        served,
        probe: ExtendedResourceProbe::NotRun,
    };
    if served.device_classes && prerequisites::probe_needed(&facts.git_version, nodes) {
        facts.probe = probe_extended_resource(client).await;
    }
    Ok(facts)
}

/// The controller manager's and the scheduler's versions, from their pods in kube-system where
/// they run as pods (`component=<name>`, as kubeadm labels its static pods). A component with no
/// such pod, or one whose image tag is no version, is unknown; so is every one when the LIST is
/// refused (a managed control plane hides them anyway). Read-only.
pub async fn control_plane_versions(client: &Client) -> Vec<ComponentVersion> {
    let selector = format!("component in ({})", CONTROL_PLANE_COMPONENTS.join(","));
    let pods = match Api::<Pod>::namespaced(client.clone(), "kube-system")
        .list(&ListParams::default().labels(&selector))
        .await
    {
        Ok(list) => list.items,
        Err(e) => {
            warn!(error = %e, "listing the control plane's pods failed; their versions are unknown");
            Vec::new()
        }
    };
    CONTROL_PLANE_COMPONENTS
        .iter()
        .map(|&component| ComponentVersion {
            component,
            version: pods
                .iter()
                .filter(|p| p.labels().get("component").map(String::as_str) == Some(component))
                .find_map(image_version),
        })
        .collect()
}

/// The version in a pod's first container's image tag: `registry.k8s.io/kube-scheduler:v1.37.2`
/// gives `v1.37.2`; a tag that is no version (`latest`, a digest) gives `None`. Pure.
pub fn image_version(pod: &Pod) -> Option<String> {
    let image = pod.spec.as_ref()?.containers.first()?.image.as_deref()?;
    let image = image.split('@').next()?;
    let (_, tag) = image.rsplit_once(':').filter(|(repo, _)| !repo.is_empty())?;
    prerequisites::parse_major_minor(tag).map(|_| tag.to_string())
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_version_is_the_image_tag_when_it_is_one() {
        let pod = |image: &str| -> Pod {
            serde_json::from_value(
                serde_json::json!({"spec": {"containers": [{"name": "c", "image": image}]}}),
            )
            .unwrap()
        };
        let cases = [
            ("registry.k8s.io/kube-scheduler:v1.37.2", Some("v1.37.2")),
            ("my-registry:5000/kube-controller-manager:v1.36.4-eks-1", Some("v1.36.4-eks-1")),
            ("registry.k8s.io/kube-scheduler:v1.37.2@sha256:abc", Some("v1.37.2")),
            ("my-registry:5000/kube-scheduler", None),
            ("kube-scheduler:latest", None),
            ("kube-scheduler", None),
        ];
        for (image, want) in cases {
            assert_eq!(image_version(&pod(image)).as_deref(), want, "{image}");
        }
    }
}
