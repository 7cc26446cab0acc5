//! What discovery says about the API server: its version, the resource.k8s.io/v1 kinds it
//! serves, and (only where a node or the server is older than 1.37) a dry-run probe of
//! `extendedResourceName`; and the DaemonSets a migration names. Read-only.

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::coordination::v1beta1::LeaseCandidate;
use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use k8s_openapi::api::resource::v1::DeviceClass;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, ListParams, PostParams};
use kube::{Client, ResourceExt};
use tracing::warn;

use crate::error::{Error, Result};
use crate::pool::prerequisites::{
    self, CONTROL_PLANE_COMPONENTS, ComponentVersion, ExtendedResourceProbe, NodeVersions, ServedApis,
    ServerFacts, VersionSource,
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

/// The controller manager's and the scheduler's versions, where the cluster shows them: the
/// image tags of their pods in kube-system (`component=<name>`, as kubeadm labels its static
/// pods), else their LeaseCandidates in kube-system, which each instance writes where
/// coordinated leader election is on. Of several instances (an HA control plane, mid-upgrade) the
/// oldest counts: it may be the one that serves. A component neither shows is unknown; so is
/// every one when the reads are refused or the API is not served (a managed control plane hides
/// them anyway).
///
/// Their `/metrics` (`kubernetes_build_info`) is not scraped: it takes a bearer token, and their
/// serving certificates are self-signed by default, so the operator would hand its token to an
/// endpoint it cannot verify. Read-only.
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
    let mut versions: Vec<ComponentVersion> =
        CONTROL_PLANE_COMPONENTS.iter().map(|&component| from_pods(component, &pods)).collect();
    if versions.iter().any(|v| v.version.is_none()) {
        let candidates = match Api::<LeaseCandidate>::namespaced(client.clone(), "kube-system")
            .list(&ListParams::default())
            .await
        {
            Ok(list) => list.items,
            // Not served: coordinated leader election is off, as it is by default.
            Err(kube::Error::Api(s)) if s.code == 404 => Vec::new(),
            Err(e) => {
                warn!(error = %e, "listing kube-system's LeaseCandidates failed");
                Vec::new()
            }
        };
        for v in versions.iter_mut().filter(|v| v.version.is_none()) {
            *v = from_lease_candidates(v.component, &candidates);
        }
    }
    versions
}

/// `component`'s version from its pods' image tags, the oldest of them. Pure.
pub fn from_pods(component: &'static str, pods: &[Pod]) -> ComponentVersion {
    let version = pods
        .iter()
        .filter(|p| p.labels().get("component").map(String::as_str) == Some(component))
        .filter_map(image_version)
        .min_by_key(|v| version_key(v));
    let source = version.as_ref().map(|_| VersionSource::PodImage);
    ComponentVersion { component, version, source }
}

/// `component`'s version from the LeaseCandidates that name its lease: the version each runs,
/// the oldest of them. Pure. That is its `emulationVersion` where it emulates an older minor,
/// else its `binaryVersion`: a component that emulates nothing writes its own minor with patch 0
/// (`binaryVersion: 1.37.2`, `emulationVersion: 1.37.0`), and the patch that decides
/// kubernetes/kubernetes#141290 is the binary's.
pub fn from_lease_candidates(component: &'static str, candidates: &[LeaseCandidate]) -> ComponentVersion {
    let oldest = candidates
        .iter()
        .map(|c| &c.spec)
        .filter(|s| s.lease_name == component)
        .filter_map(|s| {
            let binary = s.binary_version.trim();
            let emulation = s.emulation_version.as_deref().map(str::trim).filter(|e| !e.is_empty());
            let emulated = emulation
                .filter(|e| prerequisites::parse_major_minor(e) != prerequisites::parse_major_minor(binary));
            let runs = emulated.unwrap_or(binary);
            prerequisites::parse_major_minor(runs)?;
            Some((runs.to_string(), binary.to_string(), emulated.is_some()))
        })
        .min_by_key(|(runs, _, _)| version_key(runs));
    match oldest {
        Some((runs, binary, emulating)) => ComponentVersion {
            component,
            version: Some(runs),
            source: Some(VersionSource::LeaseCandidate { binary, emulating }),
        },
        None => ComponentVersion { component, version: None, source: None },
    }
}

/// Orders versions by major, minor and patch (`v1.36.10` after `v1.36.9`); an unparsed part is 0.
fn version_key(v: &str) -> (u32, u32, u32) {
    let mut parts = v.trim().trim_start_matches('v').split(['.', '-', '+']).map(|p| p.parse().unwrap_or(0));
    (parts.next().unwrap_or(0), parts.next().unwrap_or(0), parts.next().unwrap_or(0))
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

/// A ConfigMap's `data`: `Err` says why it could not be read (missing, refused), in words for a
/// condition's message. Read-only.
pub async fn config_map_data(
    client: &Client,
    ns: &str,
    name: &str,
) -> std::result::Result<BTreeMap<String, String>, String> {
    match Api::<ConfigMap>::namespaced(client.clone(), ns).get_opt(name).await {
        Ok(Some(cm)) => Ok(cm.data.unwrap_or_default()),
        Ok(None) => Err(format!("ConfigMap {ns}/{name} does not exist")),
        Err(kube::Error::Api(s)) if s.code == 403 => Err(format!(
            "the operator may not read ConfigMap {ns}/{name} (grant get on configmaps, as the packaged ClusterRole does)"
        )),
        Err(e) => Err(format!("reading ConfigMap {ns}/{name}: {e}")),
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

    #[test]
    fn of_several_instances_the_oldest_counts() {
        let pod = |component: &str, image: &str| -> Pod {
            serde_json::from_value(serde_json::json!({
                "metadata": {"labels": {"component": component}},
                "spec": {"containers": [{"name": "c", "image": image}]},
            }))
            .unwrap()
        };
        let pods = [
            pod("kube-scheduler", "registry.k8s.io/kube-scheduler:v1.37.10"),
            pod("kube-scheduler", "registry.k8s.io/kube-scheduler:v1.37.9"),
            pod("kube-controller-manager", "registry.k8s.io/kube-controller-manager:v1.36.1"),
            pod("kube-scheduler", "registry.k8s.io/kube-scheduler@sha256:abc"),
        ];
        let s = from_pods("kube-scheduler", &pods);
        assert_eq!((s.version.as_deref(), s.source), (Some("v1.37.9"), Some(VersionSource::PodImage)));
        assert_eq!(from_pods("kube-controller-manager", &pods).version.as_deref(), Some("v1.36.1"));
        let none = from_pods("kube-scheduler", &pods[2..3]);
        assert_eq!((none.version, none.source), (None, None));
    }

    #[test]
    fn lease_candidates_give_the_version_a_component_runs() {
        let candidate = |lease: &str, binary: &str, emulation: Option<&str>| -> LeaseCandidate {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": format!("{lease}-x"), "namespace": "kube-system"},
                "spec": {
                    "leaseName": lease,
                    "binaryVersion": binary,
                    "emulationVersion": emulation,
                    "strategy": "OldestEmulationVersion",
                },
            }))
            .unwrap()
        };
        // (case, candidates, component, want version, want source)
        type Case =
            (&'static str, Vec<LeaseCandidate>, &'static str, Option<&'static str>, Option<VersionSource>);
        let lc = |binary: &str, emulating| {
            Some(VersionSource::LeaseCandidate { binary: binary.into(), emulating })
        };
        let cases: Vec<Case> = vec![
            (
                "its binary's version",
                vec![candidate("kube-scheduler", "1.37.2", None)],
                "kube-scheduler",
                Some("1.37.2"),
                lc("1.37.2", false),
            ),
            (
                "a 1.37 binary emulating 1.36 runs 1.36's defaults",
                vec![candidate("kube-scheduler", "1.37.2", Some("1.36"))],
                "kube-scheduler",
                Some("1.36"),
                lc("1.37.2", true),
            ),
            (
                "an emulation version of its binary's minor is no emulation: the binary's patch counts",
                vec![candidate("kube-controller-manager", "1.37.2", Some("1.37"))],
                "kube-controller-manager",
                Some("1.37.2"),
                lc("1.37.2", false),
            ),
            (
                // What kube-scheduler v1.37.2 writes with coordinated leader election on (the e2e
                // control plane's): its emulation version is its own minor, patch 0.
                "a component that emulates nothing writes patch 0",
                vec![candidate("kube-scheduler", "1.37.2", Some("1.37.0"))],
                "kube-scheduler",
                Some("1.37.2"),
                lc("1.37.2", false),
            ),
            (
                "HA mid-upgrade: the oldest instance",
                vec![
                    candidate("kube-controller-manager", "1.37.2", None),
                    candidate("kube-controller-manager", "1.36.4", None),
                    candidate("kube-scheduler", "1.35.0", None),
                ],
                "kube-controller-manager",
                Some("1.36.4"),
                lc("1.36.4", false),
            ),
            (
                "another component's lease, or a version that does not parse",
                vec![candidate("other-controller", "1.30.0", None), candidate("kube-scheduler", "dev", None)],
                "kube-scheduler",
                None,
                None,
            ),
        ];
        for (case, candidates, component, version, source) in cases {
            let got = from_lease_candidates(component, &candidates);
            assert_eq!((got.version.as_deref(), got.source), (version, source), "{case}");
        }
        let emulating =
            from_lease_candidates("kube-scheduler", &[candidate("kube-scheduler", "1.37.2", Some("1.36"))]);
        assert_eq!(emulating.describe(), "kube-scheduler 1.37.2 emulating 1.36 (its LeaseCandidate)");
        // A v1.37.2 controller manager that emulates nothing has the fix for
        // kubernetes/kubernetes#141290, though its emulation version reads 1.37.0.
        let kcm = from_lease_candidates(
            "kube-controller-manager",
            &[candidate("kube-controller-manager", "1.37.2", Some("1.37.0"))],
        );
        assert_eq!(kcm.describe(), "kube-controller-manager 1.37.2 (its LeaseCandidate)");
        assert_eq!(prerequisites::taint_eviction_reaches_extended_claims(&[kcm]), Ok(()));
    }
}
