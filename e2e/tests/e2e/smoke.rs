//! Smoke scenarios that prove the e2e environment is real: the upstream v1.37.2 API server,
//! scheduler and controller manager do what Switchyard relies on. Each test uses its own names
//! (driver, extended resource, nodes, namespace), so tests can share one cluster concurrently.

use std::collections::BTreeMap;
use std::process::Command;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use k8s_openapi::api::resource::v1::{DeviceClass, DeviceTaintRule, ResourceClaim, ResourceSlice};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::core::DynamicObject;
use kube::discovery::ApiResource;
use kube::{Api, Client, ResourceExt};
use serde_json::json;
use switchyard_e2e::cluster::{self, unique};
use switchyard_e2e::locks;
use switchyard_e2e::sim::{GpuLayout, SimConfig, SimNode, Simulator};
use switchyard_e2e::wait;
use switchyard_operator::testing::admission_cases;

const SCHEDULING: Duration = Duration::from_secs(60);

#[tokio::test]
async fn server_is_v1_37_and_serves_dra_v1() -> anyhow::Result<()> {
    let _cluster = locks::cluster_shared().await?;
    let out = Command::new(cluster::bin_dir().join("kubectl"))
        .arg("--kubeconfig")
        .arg(cluster::kubeconfig())
        .args(["version", "-o", "json"])
        .output()?;
    assert!(out.status.success(), "kubectl version failed: {}", String::from_utf8_lossy(&out.stderr));
    let version: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    assert_eq!(version["serverVersion"]["gitVersion"], "v1.37.2");
    assert_eq!(version["serverVersion"]["minor"], "37");

    let client = cluster::client().await?;
    let resources = client.list_api_group_resources("resource.k8s.io/v1").await?;
    let served: Vec<&str> = resources.resources.iter().map(|r| r.name.as_str()).collect();
    for want in ["deviceclasses", "resourceslices", "resourceclaims", "devicetaintrules"] {
        assert!(served.contains(&want), "resource.k8s.io/v1 does not serve {want}: {served:?}");
    }
    Ok(())
}

/// Names shared by one DRA scenario.
struct Scenario {
    client: Client,
    sim: Option<Simulator>,
    id: String,
    driver: String,
    resource: String,
    namespace: String,
}

impl Scenario {
    async fn new(prefix: &str) -> anyhow::Result<Self> {
        let client = cluster::client().await?;
        let id = unique(prefix);
        let sim = Simulator::start(client.clone(), SimConfig::new(id.clone())).await?;
        let namespace = id.clone();
        cluster::create_namespace(&client, &namespace).await?;
        Ok(Self {
            driver: format!("gpu.{id}.example.com"),
            resource: format!("{id}.example.com/gpu"),
            client,
            sim: Some(sim),
            id,
            namespace,
        })
    }

    fn sim(&self) -> &Simulator {
        self.sim.as_ref().expect("simulator runs until cleanup")
    }

    async fn node(&self, suffix: &str) -> anyhow::Result<Node> {
        let spec = SimNode {
            name: format!("{}-{suffix}", self.id),
            labels: BTreeMap::new(),
            layout: GpuLayout::gpus(2),
        };
        self.sim().add_node(spec).await
    }

    /// A DeviceClass that serves `self.resource` from `self.driver`'s devices.
    async fn device_class(&self) -> anyhow::Result<()> {
        let class: DeviceClass = serde_json::from_value(json!({
            "metadata": {"name": format!("{}.example.com", self.id), "labels": {"e2e.switchyard.dev/scenario": "true"}},
            "spec": {
                "selectors": [{"cel": {"expression": format!("device.driver == '{}'", self.driver)}}],
                "extendedResourceName": self.resource,
            }
        }))?;
        Api::<DeviceClass>::all(self.client.clone()).create(&PostParams::default(), &class).await?;
        Ok(())
    }

    /// Plays the DRA driver on `node`: one slice with `n` devices.
    async fn publish(&self, node: &Node, n: u32) -> anyhow::Result<()> {
        let mut slice = switchyard_e2e::sim::stub_slice(
            &self.driver,
            &node.name_any(),
            &node.uid().unwrap_or_default(),
            &GpuLayout::gpus(n),
        );
        slice.metadata.name = Some(format!("{}-slice", node.name_any()));
        Api::<ResourceSlice>::all(self.client.clone()).create(&PostParams::default(), &slice).await?;
        Ok(())
    }

    /// Plays the device plugin on `node`: allocatable `self.resource` = `n`.
    async fn advertise(&self, node: &Node, n: u32) -> anyhow::Result<()> {
        let patch = json!({"status": {"capacity": {&self.resource: n.to_string()}, "allocatable": {&self.resource: n.to_string()}}});
        Api::<Node>::all(self.client.clone())
            .patch_status(&node.name_any(), &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
        Ok(())
    }

    /// A pod that asks for one `self.resource` the device-plugin way, pinned to `node`.
    async fn gpu_pod(&self, name: &str, node: &Node) -> anyhow::Result<Pod> {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {
                "nodeSelector": {"kubernetes.io/hostname": node.name_any()},
                "terminationGracePeriodSeconds": 1,
                "containers": [{"name": "cuda", "image": "registry.k8s.io/pause:3.10",
                                "resources": {"limits": {&self.resource: "1"}}}],
            }
        }))?;
        Ok(self.pods().create(&PostParams::default(), &pod).await?)
    }

    fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    async fn bound(&self, name: &str) -> anyhow::Result<Pod> {
        let pods = self.pods();
        wait::until(&format!("pod {name} to be bound and running"), SCHEDULING, || {
            let pods = pods.clone();
            async move {
                let pod = pods.get(name).await?;
                let running = pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running");
                Ok(running.then_some(pod))
            }
        })
        .await
    }

    async fn cleanup(mut self) -> anyhow::Result<()> {
        let dp = DeleteParams::default();
        let _ = Api::<Namespace>::all(self.client.clone()).delete(&self.namespace, &dp).await;
        let _ = Api::<DeviceClass>::all(self.client.clone())
            .delete(&format!("{}.example.com", self.id), &dp)
            .await;
        if let Some(sim) = self.sim.take() {
            sim.shutdown().await?;
        }
        Ok(())
    }
}

fn claim_status(pod: &Pod) -> Option<String> {
    pod.status.as_ref()?.extended_resource_claim_status.as_ref().map(|s| s.resource_claim_name.clone())
}

#[tokio::test]
async fn extended_resource_is_served_by_dra_on_one_node_and_by_the_device_plugin_on_another()
-> anyhow::Result<()> {
    let _cluster = locks::cluster_shared().await?;
    let s = Scenario::new("smoke-ext").await?;
    let dra_node = s.node("dra").await?;
    let dp_node = s.node("dp").await?;
    s.device_class().await?;
    s.publish(&dra_node, 2).await?;
    s.advertise(&dp_node, 2).await?;

    // On the DRA node the real scheduler creates and allocates a claim for the plain request.
    s.gpu_pod("on-dra", &dra_node).await?;
    let pod = s.bound("on-dra").await?;
    assert_eq!(pod.spec.as_ref().unwrap().node_name.as_deref(), Some(dra_node.name_any().as_str()));
    let status = pod.status.as_ref().unwrap().extended_resource_claim_status.clone();
    let status = status.expect("the scheduler records pod.status.extendedResourceClaimStatus");
    assert!(
        status.resource_claim_name.starts_with("on-dra-extended-resources-"),
        "generated claim name {:?}",
        status.resource_claim_name
    );
    assert_eq!(status.request_mappings.len(), 1);
    assert_eq!(status.request_mappings[0].container_name, "cuda");
    assert_eq!(status.request_mappings[0].resource_name, s.resource);

    let claims: Api<ResourceClaim> = Api::namespaced(s.client.clone(), &s.namespace);
    let claim = claims.get(&status.resource_claim_name).await?;
    let allocation = claim.status.as_ref().and_then(|st| st.allocation.clone()).expect("claim is allocated");
    let results = allocation.devices.unwrap().results.unwrap_or_default();
    assert_eq!(results.len(), 1);
    assert_eq!(results[0].driver, s.driver);
    assert_eq!(results[0].pool, dra_node.name_any());
    assert!(["gpu-0", "gpu-1"].contains(&results[0].device.as_str()), "device {}", results[0].device);
    let owner = claim.owner_references().first().map(|o| (o.kind.clone(), o.name.clone()));
    assert_eq!(owner, Some(("Pod".to_owned(), "on-dra".to_owned())));

    // The same pod spec on the device-plugin node binds without any claim.
    s.gpu_pod("on-dp", &dp_node).await?;
    let pod = s.bound("on-dp").await?;
    assert_eq!(pod.spec.as_ref().unwrap().node_name.as_deref(), Some(dp_node.name_any().as_str()));
    assert_eq!(claim_status(&pod), None);
    let all_claims = claims.list(&ListParams::default()).await?;
    assert_eq!(
        all_claims.items.len(),
        1,
        "only the DRA pod has a claim: {:?}",
        all_claims.items.iter().map(|c| c.name_any()).collect::<Vec<_>>()
    );

    s.cleanup().await
}

#[tokio::test]
async fn device_taint_rule_no_execute_evicts_the_claim_holder() -> anyhow::Result<()> {
    let _cluster = locks::cluster_shared().await?;
    let s = Scenario::new("smoke-taint").await?;
    let node = s.node("dra").await?;
    s.device_class().await?;
    s.publish(&node, 2).await?;
    s.gpu_pod("holder", &node).await?;
    let pod = s.bound("holder").await?;
    let claim_name = claim_status(&pod).expect("holder has a generated claim");
    let claim = Api::<ResourceClaim>::namespaced(s.client.clone(), &s.namespace).get(&claim_name).await?;
    let device = claim.status.unwrap().allocation.unwrap().devices.unwrap().results.unwrap_or_default()[0]
        .device
        .clone();

    let rule_name = format!("{}-evict", s.id);
    let rule: DeviceTaintRule = serde_json::from_value(json!({
        "metadata": {"name": rule_name},
        "spec": {
            "deviceSelector": {"driver": s.driver, "pool": node.name_any(), "device": device},
            "taint": {"key": "switchyard.dev/smoke", "value": "evict", "effect": "NoExecute"},
        }
    }))?;
    let rules: Api<DeviceTaintRule> = Api::all(s.client.clone());
    rules.create(&PostParams::default(), &rule).await?;

    // The real device-taint-eviction controller deletes the pod; the simulator finishes it.
    let pods = s.pods();
    wait::until("the claim holder to be evicted", SCHEDULING, || {
        let pods = pods.clone();
        async move { Ok(pods.get_opt("holder").await?.is_none().then_some(())) }
    })
    .await?;

    // The rule's status reports the eviction it drove.
    let conditions = wait::until("the DeviceTaintRule to report its evictions", SCHEDULING, || {
        let rules = rules.clone();
        let rule_name = rule_name.clone();
        async move {
            let rule = rules.get(&rule_name).await?;
            let conds = rule.status.and_then(|s| s.conditions).unwrap_or_default();
            let settled = conds.iter().any(|c| c.type_ == "EvictionInProgress" && c.status == "False");
            Ok(settled.then_some(conds))
        }
    })
    .await?;
    let eviction = conditions.iter().find(|c| c.type_ == "EvictionInProgress").unwrap();
    assert_eq!(eviction.reason, "Completed", "{eviction:?}");
    assert!(
        eviction.message.starts_with("1 pod evicted"),
        "the rule should count the one evicted pod: {eviction:?}"
    );
    rules.delete(&rule_name, &DeleteParams::default()).await?;
    s.cleanup().await
}

#[tokio::test]
async fn every_cel_rule_of_the_crd_is_enforced_by_the_real_api_server() -> anyhow::Result<()> {
    let _cluster = locks::cluster_shared().await?;
    let client = cluster::client().await?;
    let resource = ApiResource::from_gvk_with_plural(
        &kube::core::GroupVersionKind::gvk("switchyard.dev", "v1alpha1", "GpuPoolMigration"),
        "gpupoolmigrations",
    );
    let api: Api<DynamicObject> = Api::all_with(client, &resource);
    let dry_run = PostParams { dry_run: true, ..Default::default() };
    let mut failures = Vec::new();
    for case in admission_cases()? {
        let name = unique(&format!("cel-{}", case.name));
        let mut object = case.object.clone();
        object["metadata"]["name"] = json!(name);
        let result = match &case.old {
            None => api.create(&dry_run, &serde_json::from_value(object)?).await.map(|_| ()),
            Some(old) => {
                let mut old = old.clone();
                old["metadata"]["name"] = json!(name);
                api.create(&PostParams::default(), &serde_json::from_value(old)?).await?;
                let patch = PatchParams { dry_run: true, ..Default::default() };
                let r = api.patch(&name, &patch, &Patch::Merge(&object)).await.map(|_| ());
                api.delete(&name, &DeleteParams::default()).await?;
                r
            }
        };
        match (&case.error, result) {
            (None, Ok(())) => {}
            (None, Err(e)) => failures.push(format!("{}: expected accept, got {e}", case.name)),
            (Some(want), Ok(())) => failures.push(format!("{}: accepted, expected {want:?}", case.name)),
            (Some(want), Err(e)) if e.to_string().contains(want.as_str()) => {}
            (Some(want), Err(e)) => failures.push(format!("{}: expected {want:?}, got {e}", case.name)),
        }
    }
    assert!(
        failures.is_empty(),
        "the API server disagreed with the admission cases:\n{}",
        failures.join("\n")
    );
    Ok(())
}

/// The simulator plays the kubelet's side of a node's `Ready`: in light mode (the scale bench)
/// it writes only Leases, and still posts the status again when the node lifecycle controller has
/// marked the node `Unknown`, as a kubelet whose status sync sees the change does.
#[tokio::test]
async fn light_simulator_posts_ready_again_after_its_node_is_marked_unknown() -> anyhow::Result<()> {
    let _cluster = locks::cluster_shared().await?;
    let client = cluster::client().await?;
    let id = unique("lightsim");
    let sim = Simulator::start(client.clone(), SimConfig::light(id.clone())).await?;
    let name = format!("{id}-n0");
    let outcome = async {
        sim.add_node(SimNode { name: name.clone(), labels: BTreeMap::new(), layout: GpuLayout::gpus(1) })
            .await?;
        let nodes: Api<Node> = Api::all(client.clone());
        let ready = |n: &Node| {
            n.status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
                .map(|c| c.status.clone())
        };
        wait::until("the node Ready", SCHEDULING, || {
            let nodes = nodes.clone();
            let name = name.clone();
            async move { Ok((ready(&nodes.get(&name).await?).as_deref() == Some("True")).then_some(())) }
        })
        .await?;
        // What the node lifecycle controller writes when a Lease is late.
        let unknown = json!({"status": {"conditions": [{"type": "Ready", "status": "Unknown",
            "reason": "NodeStatusUnknown", "message": "Kubelet stopped posting node status."}]}});
        nodes.patch_status(&name, &PatchParams::default(), &Patch::Merge(&unknown)).await?;
        wait::until("the node Ready again", Duration::from_secs(30), || {
            let nodes = nodes.clone();
            let name = name.clone();
            async move { Ok((ready(&nodes.get(&name).await?).as_deref() == Some("True")).then_some(())) }
        })
        .await
    }
    .await;
    sim.shutdown().await?;
    outcome
}

/// The simulator admits pods as the kubelet does: a pod bound to a node for device-plugin GPUs the
/// node does not advertise (here no device plugin runs at all) fails with the kubelet's reason,
/// and a pod without GPUs on the same node runs.
#[tokio::test]
async fn simulator_rejects_a_pod_bound_for_gpus_its_node_does_not_advertise() -> anyhow::Result<()> {
    let _cluster = locks::cluster_shared().await?;
    let s = Scenario::new("admit").await?;
    let outcome = async {
        let node = s.node("n0").await?;
        let pods: Api<Pod> = Api::namespaced(s.client.clone(), &s.namespace);
        for (name, limits) in [("gpu", json!({"nvidia.com/gpu": "1"})), ("plain", json!({"cpu": "100m"}))] {
            let pod: Pod = serde_json::from_value(json!({
                "metadata": {"name": name},
                "spec": {"nodeName": node.name_any(), "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10",
                         "resources": {"limits": limits}}]}
            }))?;
            pods.create(&PostParams::default(), &pod).await?;
        }
        let phase = |p: &Pod| p.status.as_ref().and_then(|s| s.phase.clone()).unwrap_or_default();
        let gpu = wait::until("the GPU pod rejected", SCHEDULING, || {
            let pods = pods.clone();
            async move { Ok(Some(pods.get("gpu").await?).filter(|p| phase(p) == "Failed")) }
        })
        .await?;
        let status = gpu.status.unwrap();
        assert_eq!(status.reason.as_deref(), Some("OutOfnvidia.com/gpu"));
        assert_eq!(
            status.message.as_deref(),
            Some("Pod was rejected: Node didn't have enough resource: nvidia.com/gpu, requested: 1, used: 0, capacity: 0")
        );
        wait::until("the plain pod Running", SCHEDULING, || {
            let pods = pods.clone();
            async move { Ok(Some(pods.get("plain").await?).filter(|p| phase(p) == "Running").map(|_| ())) }
        })
        .await
    }
    .await;
    s.cleanup().await?;
    outcome
}
