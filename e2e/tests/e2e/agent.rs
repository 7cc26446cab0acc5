//! The real driver agent against the real control plane: the simulator runs one
//! `switchyard-driver-agent` process per node while a pod of our DRA-driver DaemonSet runs there,
//! and the upstream scheduler allocates from the slices it publishes. Each test uses its own
//! names (nodes, namespace, driver, DeviceClass, extended resource), so tests can share one cluster
//! concurrently.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context;
use futures::{FutureExt, StreamExt, TryStreamExt};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use k8s_openapi::api::resource::v1::{
    Device, DeviceClass, DeviceRequestAllocationResult, ResourceClaim, ResourceSlice,
};
use kube::api::{DeleteParams, ListParams, PostParams, WatchEvent, WatchParams};
use kube::{Api, Client, ResourceExt};
use serde_json::{Value, json};
use switchyard_e2e::cluster::{self, unique};
use switchyard_e2e::locks;
use switchyard_e2e::sim::{
    AgentSettings, DaemonSetKey, GpuLayout, LABEL_INSTANCE, SimConfig, SimNode, Simulator,
    placeholder_daemon_set,
};
use switchyard_e2e::wait;
use switchyard_operator::well_known;

/// Scheduling, binding and the simulator marking pods Running: seconds on an idle cluster, but the
/// suite shares two cores with other concurrent tests.
const SCHEDULING: Duration = Duration::from_secs(90);
/// From creating the DaemonSet to every agent's first publication: the DaemonSet controller, the
/// scheduler, the simulator's pod loop (2 s tick) and the agent's start-up.
const AGENT_UP: Duration = Duration::from_secs(120);
/// The agent's `--health-hold-seconds` in these tests: long enough to tell "cleared after the
/// hold" from "cleared at once", short enough to keep the suite fast.
const HOLD: Duration = Duration::from_secs(2);
const H100: &str = "NVIDIA H100 80GB HBM3";
const A100: &str = "NVIDIA A100-SXM4-80GB";
const DAEMONSET: &str = "gpu-driver";

/// One scenario's names and simulator, with the DRA-driver DaemonSet and a DeviceClass for full
/// GPUs of its driver already created.
struct Fixture {
    client: Client,
    sim: Option<Simulator>,
    id: String,
    driver: String,
    resource: String,
    class: String,
    namespace: String,
    work_dir: PathBuf,
}

impl Fixture {
    /// Starts a simulator that runs the real agent for our DaemonSet's pods, with our driver
    /// name. Nothing is created in the cluster yet (see [`Fixture::up`]), so that a failure from
    /// here on is cleaned up.
    async fn new(prefix: &str) -> anyhow::Result<Self> {
        let client = cluster::client().await?;
        let id = unique(prefix);
        let driver = format!("gpu.{id}.example.com");
        let work_dir = std::env::temp_dir().join(format!("switchyard-e2e-{id}"));
        let mut config = SimConfig::new(id.clone());
        config.dra_driver = Some(DaemonSetKey { namespace: id.clone(), name: DAEMONSET.into() });
        config.driver_name = driver.clone();
        config.agent = Some(AgentSettings {
            bin: cluster::agent_bin(),
            kubeconfig: cluster::kubeconfig().to_path_buf(),
            work_dir: work_dir.clone(),
            health_hold_seconds: HOLD.as_secs(),
            device_plugin_interlock: true,
            renamed_gpu_resource: None,
        });
        let sim = Simulator::start(client.clone(), config).await?;
        Ok(Fixture {
            resource: format!("{id}.example.com/gpu"),
            class: format!("{id}.example.com"),
            namespace: id.clone(),
            client,
            sim: Some(sim),
            id,
            driver,
            work_dir,
        })
    }

    /// Creates the namespace, `nodes` (name suffix, layout), the DaemonSet and the DeviceClass,
    /// and waits until every node's agent has published all its devices.
    async fn up(&self, nodes: Vec<(&str, GpuLayout)>) -> anyhow::Result<()> {
        cluster::create_namespace(&self.client, &self.namespace).await?;
        let mut expected = Vec::new();
        for (suffix, layout) in nodes {
            let name = self.node(suffix);
            let devices = layout.gpus as usize + layout.mig_gpus.iter().map(Vec::len).sum::<usize>();
            self.sim().add_node(SimNode { name: name.clone(), labels: BTreeMap::new(), layout }).await?;
            expected.push((name, devices));
        }
        self.daemonset().await?;
        self.device_class().await?;
        for (node, n) in expected {
            self.wait_pool(&format!("the agent on {node} to publish {n} devices"), &node, AGENT_UP, |p| {
                p.devices().len() == n
            })
            .await?;
        }
        Ok(())
    }

    fn sim(&self) -> &Simulator {
        self.sim.as_ref().expect("simulator runs until cleanup")
    }

    fn node(&self, suffix: &str) -> String {
        format!("{}-{suffix}", self.id)
    }

    /// The DRA-driver DaemonSet, on this scenario's nodes only. Its pods run nothing (the
    /// simulator runs the agent process for them).
    async fn daemonset(&self) -> anyhow::Result<()> {
        let ds = placeholder_daemon_set(DAEMONSET, json!({LABEL_INSTANCE: self.id}), json!({}))?;
        Api::<DaemonSet>::namespaced(self.client.clone(), &self.namespace)
            .create(&PostParams::default(), &ds)
            .await?;
        Ok(())
    }

    /// Full GPUs of our driver, also requestable as the extended resource `self.resource`.
    async fn device_class(&self) -> anyhow::Result<()> {
        let class: DeviceClass = serde_json::from_value(json!({
            "metadata": {"name": self.class},
            "spec": {
                "selectors": [{"cel": {"expression": format!(
                    "device.driver == '{0}' && device.attributes['{0}'].type == 'gpu'", self.driver
                )}}],
                "extendedResourceName": self.resource,
            }
        }))?;
        Api::<DeviceClass>::all(self.client.clone()).create(&PostParams::default(), &class).await?;
        Ok(())
    }

    fn slices_api(&self) -> Api<ResourceSlice> {
        Api::all(self.client.clone())
    }

    fn pool_fields(&self, node: &str) -> String {
        format!("spec.nodeName={node},spec.driver={}", self.driver)
    }

    /// Our driver's slices on `node`, as the API has them now.
    async fn pool(&self, node: &str) -> anyhow::Result<Pool> {
        let list = self.slices_api().list(&ListParams::default().fields(&self.pool_fields(node))).await?;
        Ok(Pool { slices: list.items })
    }

    async fn wait_pool(
        &self,
        what: &str,
        node: &str,
        timeout: Duration,
        ready: impl Fn(&Pool) -> bool,
    ) -> anyhow::Result<Pool> {
        let ready = &ready;
        wait::until(what, timeout, || async move {
            let pool = self.pool(node).await?;
            Ok(ready(&pool).then_some(pool))
        })
        .await
    }

    /// Injects a fault through the agent's endpoint; the agent must accept it (202).
    async fn fault(&self, node: &str, body: Value) -> anyhow::Result<()> {
        let url =
            self.sim().agent_fault_url(node).await.with_context(|| format!("no agent runs for {node}"))?;
        let (status, _) = switchyard_e2e::measure::http("POST", &url, Some(&body)).await?;
        anyhow::ensure!(status == 202, "POST {url} {body} answered {status}, want 202");
        Ok(())
    }

    fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    fn claims(&self) -> Api<ResourceClaim> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    /// A pod that asks for one `self.resource` the device-plugin way.
    async fn gpu_pod(&self, name: &str) -> anyhow::Result<()> {
        self.create_pod(name, json!({"limits": {&self.resource: "1"}}), json!([])).await
    }

    /// A pod that holds the ResourceClaim `claim`.
    async fn claim_pod(&self, name: &str, claim: &str) -> anyhow::Result<()> {
        self.create_pod(
            name,
            json!({"claims": [{"name": "gpus"}]}),
            json!([{"name": "gpus", "resourceClaimName": claim}]),
        )
        .await
    }

    async fn create_pod(&self, name: &str, resources: Value, claims: Value) -> anyhow::Result<()> {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {
                "nodeSelector": {LABEL_INSTANCE: self.id},
                "terminationGracePeriodSeconds": 1,
                "resourceClaims": claims,
                "containers": [{"name": "cuda", "image": "registry.k8s.io/pause:3.10", "resources": resources}],
            }
        }))?;
        self.pods().create(&PostParams::default(), &pod).await?;
        Ok(())
    }

    /// A ResourceClaim for `count` devices of our class, with extra CEL `selectors` and
    /// `constraints`.
    async fn claim(
        &self,
        name: &str,
        count: u32,
        selectors: &[String],
        constraints: Value,
    ) -> anyhow::Result<()> {
        let selectors: Vec<Value> = selectors.iter().map(|s| json!({"cel": {"expression": s}})).collect();
        let claim: ResourceClaim = serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {"devices": {
                "requests": [{"name": "gpus", "exactly": {
                    "deviceClassName": self.class, "allocationMode": "ExactCount", "count": count,
                    "selectors": selectors,
                }}],
                "constraints": constraints,
            }},
        }))?;
        self.claims().create(&PostParams::default(), &claim).await?;
        Ok(())
    }

    /// Waits until pod `name` is bound and Running.
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

    /// Waits until the scheduler has reported pod `name` unschedulable, and returns its message.
    async fn unschedulable(&self, name: &str) -> anyhow::Result<(Pod, String)> {
        let pods = self.pods();
        wait::until(&format!("the scheduler to report pod {name} unschedulable"), SCHEDULING, || {
            let pods = pods.clone();
            async move {
                let pod = pods.get(name).await?;
                let cond = pod
                    .status
                    .as_ref()
                    .and_then(|s| s.conditions.as_ref())
                    .and_then(|cs| cs.iter().find(|c| c.type_ == "PodScheduled"))
                    .filter(|c| c.status == "False" && c.reason.as_deref() == Some("Unschedulable"))
                    .map(|c| c.message.clone().unwrap_or_default());
                Ok(cond.map(|m| (pod, m)))
            }
        })
        .await
    }

    /// The devices allocated to claim `name`.
    async fn allocated(&self, claim: &str) -> anyhow::Result<Vec<DeviceRequestAllocationResult>> {
        let claim = self.claims().get(claim).await?;
        let allocation = claim.status.and_then(|s| s.allocation).context("claim is not allocated")?;
        Ok(allocation.devices.and_then(|d| d.results).unwrap_or_default())
    }

    /// The single device the generated claim of a plain `limits` pod got, as (pool, device).
    async fn generated_claim_device(&self, pod: &Pod) -> anyhow::Result<(String, String)> {
        let status = pod
            .status
            .as_ref()
            .and_then(|s| s.extended_resource_claim_status.clone())
            .context("the scheduler records pod.status.extendedResourceClaimStatus")?;
        assert!(
            status.resource_claim_name.starts_with(&format!("{}-extended-resources-", pod.name_any())),
            "generated claim name {:?}",
            status.resource_claim_name
        );
        assert_eq!(status.request_mappings.len(), 1);
        assert_eq!(status.request_mappings[0].resource_name, self.resource);
        let results = self.allocated(&status.resource_claim_name).await?;
        assert_eq!(results.len(), 1, "{results:?}");
        assert_eq!(results[0].driver, self.driver);
        Ok((results[0].pool.clone(), results[0].device.clone()))
    }

    /// Deletes what the scenario created. The namespace goes first, so that the simulator still
    /// finishes the pods' deletion (and stops the agents) before it shuts down and deletes the
    /// nodes. The agents' work directory (inventories and logs) is kept when the scenario failed.
    async fn cleanup(mut self, passed: bool) -> anyhow::Result<()> {
        let dp = DeleteParams::default();
        let _ = Api::<Namespace>::all(self.client.clone()).delete(&self.namespace, &dp).await;
        let pods = self.pods();
        let _ = wait::until("the scenario's pods to be gone", SCHEDULING, || {
            let pods = pods.clone();
            async move { Ok(pods.list(&ListParams::default()).await?.items.is_empty().then_some(())) }
        })
        .await;
        let _ = Api::<DeviceClass>::all(self.client.clone()).delete(&self.class, &dp).await;
        if let Some(sim) = self.sim.take() {
            sim.shutdown().await?;
        }
        if passed {
            let _ = std::fs::remove_dir_all(&self.work_dir);
        } else {
            eprintln!("agent inventories and logs kept in {}", self.work_dir.display());
        }
        Ok(())
    }
}

/// Runs a scenario, then cleans up whether it passed, failed or panicked (a failed assertion),
/// and reports the outcome.
macro_rules! scenario {
    ($fixture:expr, |$f:ident| $body:block) => {{
        let $f = $fixture;
        let outcome = std::panic::AssertUnwindSafe(async {
            let result: anyhow::Result<()> = async { $body }.await;
            result
        })
        .catch_unwind()
        .await;
        $f.cleanup(matches!(outcome, Ok(Ok(())))).await?;
        match outcome {
            Ok(result) => result,
            Err(panic) => std::panic::resume_unwind(panic),
        }
    }};
}

/// One node's pool as read from the API.
struct Pool {
    slices: Vec<ResourceSlice>,
}

impl Pool {
    /// Every device of the pool by name, across its slices.
    fn devices(&self) -> BTreeMap<String, Device> {
        self.slices
            .iter()
            .flat_map(|s| s.spec.devices.clone().unwrap_or_default())
            .map(|d| (d.name.clone(), d))
            .collect()
    }

    /// Taints of `device` as (key, value, effect); every one must carry a timeAdded.
    fn taints(&self, device: &str) -> Vec<(String, Option<String>, String)> {
        let devices = self.devices();
        let d = devices.get(device).unwrap_or_else(|| panic!("device {device} is not published"));
        d.taints
            .iter()
            .flatten()
            .map(|t| {
                assert!(t.time_added.is_some(), "taint {} on {device} has no timeAdded", t.key);
                (t.key.clone(), t.value.clone(), t.effect.clone())
            })
            .collect()
    }

    fn names(&self) -> Vec<String> {
        self.slices.iter().map(|s| s.name_any()).collect()
    }

    fn generation(&self) -> i64 {
        self.slices.iter().map(|s| s.spec.pool.generation).max().unwrap_or(0)
    }
}

fn string(v: impl Into<String>) -> Value {
    json!({"string": v.into()})
}

fn version(v: &str) -> Value {
    json!({"version": v})
}

/// What the agent must publish for whole GPU `i` of a simulated node (see
/// `GpuLayout::inventory`: A100-class Ampere GPUs, driver 570.124.06 with CUDA 12.8, bus
/// `0000:<0x10+i>:00.0`, four GPUs per PCIe root and NUMA node), with `ty` and `uuid` for the
/// device itself.
fn gpu_attributes(i: u32, product: &str, ty: &str, uuid: &str) -> serde_json::Map<String, Value> {
    let v = json!({
        "type": string(ty),
        "uuid": string(uuid),
        "productName": string(product),
        "brand": string("Nvidia"),
        "architecture": string("Ampere"),
        "cudaComputeCapability": version("8.0.0"),
        "driverVersion": version("570.124.6"),
        "cudaDriverVersion": version("12.8.0"),
        "resource.kubernetes.io/pciBusID": string(format!("0000:{:02x}:00.0", 0x10 + i)),
        "resource.kubernetes.io/pcieRoot": string(format!("pci0000:{:02x}", i / 4)),
        "resource.kubernetes.io/numaNode": {"int": i / 4},
    });
    v.as_object().cloned().unwrap_or_default()
}

/// Checks one node's pool: a single slice with the agent's name, pool, owner, label and summary
/// annotations, holding exactly `expected` (name -> (attributes, capacity)) in that order, none
/// tainted.
fn assert_pool(
    f: &Fixture,
    pool: &Pool,
    node: &str,
    node_uid: &str,
    mig_profiles: &str,
    expected: &[(String, Value, Value)],
) {
    assert_eq!(pool.names(), [format!("{node}-{}-0", f.driver.replace('.', "-"))], "slices of {node}");
    let slice = &pool.slices[0];
    assert_eq!(slice.spec.driver, f.driver);
    assert_eq!(slice.spec.node_name.as_deref(), Some(node));
    assert_eq!(slice.spec.pool.name, node);
    assert_eq!(slice.spec.pool.resource_slice_count, 1);
    assert!(slice.spec.pool.generation >= 1);
    assert_eq!(
        slice.labels().get(well_known::LABEL_MANAGED_BY).map(String::as_str),
        Some(well_known::AGENT_FIELD_MANAGER)
    );
    let annotations = slice.annotations();
    assert_eq!(annotations.get(well_known::ANNOTATION_SLICE_GPU_COUNT).map(String::as_str), Some("8"));
    assert_eq!(
        annotations.get(well_known::ANNOTATION_SLICE_MIG_PROFILES).map(String::as_str),
        Some(mig_profiles)
    );
    let owner = &slice.owner_references()[0];
    assert_eq!((owner.kind.as_str(), owner.name.as_str(), owner.uid.as_str()), ("Node", node, node_uid));
    assert_eq!(owner.controller, Some(true));

    let devices = slice.spec.devices.clone().unwrap_or_default();
    let names: Vec<&str> = devices.iter().map(|d| d.name.as_str()).collect();
    let want: Vec<&str> = expected.iter().map(|(n, _, _)| n.as_str()).collect();
    assert_eq!(names, want, "devices of {node}");
    for (d, (name, attributes, capacity)) in devices.iter().zip(expected) {
        assert_eq!(&serde_json::to_value(&d.attributes).unwrap(), attributes, "attributes of {node}/{name}");
        assert_eq!(&serde_json::to_value(&d.capacity).unwrap(), capacity, "capacity of {node}/{name}");
        assert!(d.taints.is_none(), "{node}/{name} is tainted: {:?}", d.taints);
    }
}

/// Three nodes with 8 GPUs each, one in MIG mode (8 x 7 `1g.10gb`): the agents publish every
/// device with its attributes and capacities, and the real scheduler allocates from them for a
/// plain extended-resource request and for a claim with a CEL selector and a NUMA constraint.
#[tokio::test]
async fn agent_slices_carry_attributes_and_the_scheduler_allocates_from_them() -> anyhow::Result<()> {
    let _cluster = locks::cluster_shared().await?;
    let h100 = GpuLayout { product: H100.into(), ..GpuLayout::gpus(8) };
    let nodes =
        vec![("h100", h100), ("a100", GpuLayout::gpus(8)), ("mig", GpuLayout::mig(8, &["1g.10gb"; 7]))];
    scenario!(Fixture::new("agent-attrs").await?, |f| {
        f.up(nodes).await?;
        let nodes: Api<Node> = Api::all(f.client.clone());

        // Whole GPUs on the two plain nodes.
        for (suffix, product) in [("h100", H100), ("a100", A100)] {
            let node = f.node(suffix);
            let uid = nodes.get(&node).await?.uid().unwrap_or_default();
            let expected: Vec<_> = (0..8)
                .map(|i| {
                    let attrs = gpu_attributes(i, product, "gpu", &format!("GPU-{node}-{i}"));
                    (format!("gpu-{i}"), Value::Object(attrs), json!({"memory": {"value": "80Gi"}}))
                })
                .collect();
            assert_pool(&f, &f.pool(&node).await?, &node, &uid, "{}", &expected);
        }

        // The MIG node publishes only its 56 MIG devices, each with its parent's attributes.
        let node = f.node("mig");
        let uid = nodes.get(&node).await?.uid().unwrap_or_default();
        let mut expected = Vec::new();
        for i in 0..8 {
            for n in 0..7 {
                let mut attrs = gpu_attributes(i, A100, "mig", &format!("MIG-{node}-{i}-{n}"));
                attrs.insert("parentUUID".into(), string(format!("GPU-{node}-{i}")));
                attrs.insert("profile".into(), string("1g.10gb"));
                let capacity = json!({"memory": {"value": "10Gi"}, "multiprocessors": {"value": "14"}});
                expected.push((format!("gpu-{i}-mig-1g10gb-{n}"), Value::Object(attrs), capacity));
            }
        }
        assert_pool(&f, &f.pool(&node).await?, &node, &uid, r#"{"1g.10gb":56}"#, &expected);

        // A CEL selector on productName (only the H100 node matches) and a matchAttribute
        // constraint on the NUMA node. First take gpu-0..2 (NUMA 0) and gpu-4..5 (NUMA 1) on the
        // H100 node, so that the free devices there are gpu-3 (NUMA 0), gpu-6 and gpu-7 (NUMA 1):
        // the constraint leaves exactly one answer, and the first two free devices would be wrong.
        let h100_node = f.node("h100");
        let taken = [0, 1, 2, 4, 5];
        let uuids: Vec<String> = taken.iter().map(|i| format!("'GPU-{h100_node}-{i}'")).collect();
        let by_uuid = format!("device.attributes['{}'].uuid in [{}]", f.driver, uuids.join(", "));
        f.claim("blocker", 5, &[by_uuid], json!([])).await?;
        f.claim_pod("blocker", "blocker").await?;
        f.bound("blocker").await?;
        let got: BTreeSet<(String, String)> =
            f.allocated("blocker").await?.into_iter().map(|r| (r.pool, r.device)).collect();
        let want: BTreeSet<_> = taken.iter().map(|i| (h100_node.clone(), format!("gpu-{i}"))).collect();
        assert_eq!(got, want);

        let by_product = format!("device.attributes['{}'].productName == '{H100}'", f.driver);
        let same_numa = json!([{"requests": ["gpus"], "matchAttribute": "resource.kubernetes.io/numaNode"}]);
        f.claim("numa-pair", 2, &[by_product], same_numa).await?;
        f.claim_pod("numa-pair", "numa-pair").await?;
        let pod = f.bound("numa-pair").await?;
        assert_eq!(pod.spec.as_ref().and_then(|s| s.node_name.as_deref()), Some(h100_node.as_str()));
        let results = f.allocated("numa-pair").await?;
        let got: Vec<(&str, &str, &str)> =
            results.iter().map(|r| (r.driver.as_str(), r.pool.as_str(), r.device.as_str())).collect();
        assert_eq!(
            got.iter().map(|g| (g.1, g.2)).collect::<BTreeSet<_>>(),
            BTreeSet::from([(h100_node.as_str(), "gpu-6"), (h100_node.as_str(), "gpu-7")]),
            "the only same-NUMA pair left on the H100 node: {got:?}"
        );
        assert!(got.iter().all(|g| g.0 == f.driver));
        let devices = f.pool(&h100_node).await?.devices();
        for r in &results {
            let numa =
                devices[&r.device].attributes.as_ref().and_then(|a| a.get("resource.kubernetes.io/numaNode"));
            assert_eq!(numa.and_then(|a| a.int), Some(1), "{}", r.device);
        }

        // A plain `limits: {<resource>: 1}` pod gets a generated claim for one whole GPU of our
        // driver: gpu-3 of the H100 node or any GPU of the A100 node (never a MIG device).
        f.gpu_pod("plain").await?;
        let pod = f.bound("plain").await?;
        let (pool, device) = f.generated_claim_device(&pod).await?;
        assert_eq!(pod.spec.as_ref().and_then(|s| s.node_name.clone()), Some(pool.clone()));
        let a100_node = f.node("a100");
        let free: BTreeSet<(String, String)> = std::iter::once((h100_node.clone(), "gpu-3".to_string()))
            .chain((0..8).map(|i| (a100_node.clone(), format!("gpu-{i}"))))
            .collect();
        assert!(free.contains(&(pool.clone(), device.clone())), "{pool}/{device} is not a free whole GPU");
        Ok(())
    })
}

fn xid_taint(f: &Fixture, xid: u32, effect: &str) -> Vec<(String, Option<String>, String)> {
    vec![(format!("{}/{}", f.driver, well_known::TAINT_KEY_XID), Some(xid.to_string()), effect.into())]
}

/// A fatal XID taints the device NoSchedule and the real scheduler stops allocating it; recovery
/// clears the taint only after the hold period and the device is allocated again; a benign XID
/// gives an informational (effect None) taint that expires on its own.
#[tokio::test]
async fn xid_taints_keep_the_scheduler_off_the_device_until_recovery() -> anyhow::Result<()> {
    let _cluster = locks::cluster_shared().await?;
    scenario!(Fixture::new("agent-xid").await?, |f| {
        f.up(vec![("n", GpuLayout::gpus(2))]).await?;
        let node = f.node("n");
        // Taint gpu-0, the device an allocator would pick first.
        f.fault(&node, json!({"device": "gpu-0", "kind": "xid", "xid": 79})).await?;
        let pool = f
            .wait_pool("the xid 79 taint on gpu-0", &node, SCHEDULING, |p| !p.taints("gpu-0").is_empty())
            .await?;
        assert_eq!(pool.taints("gpu-0"), xid_taint(&f, 79, "NoSchedule"));
        assert_eq!(pool.taints("gpu-1"), []);

        // The first pod gets the healthy gpu-1; the second has nothing left but the tainted gpu-0.
        f.gpu_pod("first").await?;
        let first = f.bound("first").await?;
        assert_eq!(f.generated_claim_device(&first).await?, (node.clone(), "gpu-1".to_string()));
        f.gpu_pod("second").await?;
        let (second, message) = f.unschedulable("second").await?;
        assert_eq!(second.spec.as_ref().and_then(|s| s.node_name.clone()), None);
        assert!(
            second.status.as_ref().and_then(|s| s.extended_resource_claim_status.as_ref()).is_none(),
            "an unschedulable pod has no allocated claim"
        );
        assert!(message.contains("cannot allocate all claims"), "scheduler message: {message}");
        assert_eq!(f.pool(&node).await?.taints("gpu-0"), xid_taint(&f, 79, "NoSchedule"));

        // Recovery: the taint stays for the hold period, then goes, and the pending pod gets gpu-0.
        let recovered_at = Instant::now();
        f.fault(&node, json!({"device": "gpu-0", "kind": "recover"})).await?;
        f.wait_pool("gpu-0's taint to clear after recovery", &node, SCHEDULING, |p| {
            p.taints("gpu-0").is_empty()
        })
        .await?;
        let held = recovered_at.elapsed();
        assert!(held >= HOLD, "the taint cleared {held:?} after recovery, before the {HOLD:?} hold");
        let second = f.bound("second").await?;
        assert_eq!(f.generated_claim_device(&second).await?, (node.clone(), "gpu-0".to_string()));

        // A benign XID: an informational taint (effect None), gone after the hold. Watched, not
        // polled, so that the short-lived state cannot be missed.
        let slices = f.slices_api();
        let rv = slices
            .list(&ListParams::default().fields(&f.pool_fields(&node)))
            .await?
            .metadata
            .resource_version
            .unwrap_or_default();
        let wp = WatchParams::default().fields(&f.pool_fields(&node)).timeout(60);
        let mut events = slices.watch(&wp, &rv).await?.boxed();
        let injected_at = Instant::now();
        f.fault(&node, json!({"device": "gpu-1", "kind": "xid", "xid": 13})).await?;
        let mut seen: Vec<Vec<(String, Option<String>, String)>> = Vec::new();
        let deadline = tokio::time::Instant::now() + SCHEDULING;
        while seen.last().is_none_or(|t| !t.is_empty()) || seen.len() < 2 {
            let event = tokio::time::timeout_at(deadline, events.try_next())
                .await
                .context("the benign taint did not come and go in time")??
                .context("the watch ended")?;
            let slice = match event {
                WatchEvent::Modified(slice) => slice,
                WatchEvent::Error(e) => anyhow::bail!("the slice watch failed: {e}"),
                _ => continue,
            };
            let taints = Pool { slices: vec![slice] }.taints("gpu-1");
            if seen.last() != Some(&taints) {
                seen.push(taints);
            }
        }
        let benign_for = injected_at.elapsed();
        assert_eq!(seen, [xid_taint(&f, 13, "None"), vec![]], "gpu-1's taints over time");
        assert!(benign_for >= HOLD, "the benign taint went after {benign_for:?}, before the {HOLD:?} hold");
        assert_eq!(f.pool(&node).await?.taints("gpu-0"), []);
        Ok(())
    })
}

/// SIGTERM makes the agent taint every device driver-unavailable before it exits; a new agent
/// clears the taint and takes over the same slices.
#[tokio::test]
async fn sigterm_taints_every_device_and_a_restart_takes_over_the_same_slices() -> anyhow::Result<()> {
    let _cluster = locks::cluster_shared().await?;
    let mixed = GpuLayout { gpus: 2, ..GpuLayout::mig(1, &["1g.10gb"; 7]) };
    scenario!(Fixture::new("agent-term").await?, |f| {
        f.up(vec![("n", mixed)]).await?;
        let node = f.node("n");
        let before = f.pool(&node).await?;
        let names = before.names();
        let devices: Vec<String> = before.devices().into_keys().collect();
        assert_eq!(devices.len(), 9, "2 whole GPUs and 7 MIG devices: {devices:?}");
        let pid = f.sim().agent_pid(&node).await.context("an agent runs")?;

        let status = f.sim().stop_agent(&node).await?;
        assert!(status.success(), "the agent exits cleanly on SIGTERM: {status}");
        // The agent published before exiting: no waiting needed.
        let stopped = f.pool(&node).await?;
        assert_eq!(stopped.names(), names);
        assert!(stopped.generation() > before.generation());
        let unavailable = vec![(
            format!("{}/{}", f.driver, well_known::TAINT_KEY_DRIVER_UNAVAILABLE),
            None,
            "NoSchedule".to_string(),
        )];
        for d in &devices {
            assert_eq!(stopped.taints(d), unavailable, "{d}");
        }
        assert_eq!(f.sim().agent_pid(&node).await, None);

        f.sim().start_agent(&node);
        let after = f
            .wait_pool("the restarted agent to clear driver-unavailable", &node, AGENT_UP, |p| {
                p.devices().values().all(|d| d.taints.is_none())
            })
            .await?;
        let new_pid = f.sim().agent_pid(&node).await.context("the agent runs again")?;
        assert_ne!(new_pid, pid);
        assert_eq!(after.names(), names, "the same slices, no duplicates");
        assert!(after.generation() > stopped.generation());
        let mut listed: Vec<String> = after
            .slices
            .iter()
            .flat_map(|s| s.spec.devices.iter().flatten().map(|d| d.name.clone()))
            .collect();
        listed.sort();
        assert_eq!(listed, devices, "every device exactly once");
        Ok(())
    })
}

/// When `device`'s taint with `key` was added, as the API has it.
fn time_added(pool: &Pool, device: &str, key: &str) -> Option<String> {
    let devices = pool.devices();
    let d = devices.get(device)?;
    d.taints
        .iter()
        .flatten()
        .find(|t| t.key == key)
        .and_then(|t| t.time_added.as_ref())
        .map(|t| t.0.to_string())
}

/// Health taints live in the API, not only in the agent's memory: after a restart a fatal XID on
/// a whole GPU and an ECC fault on a GPU in MIG mode are published again with their original
/// timeAdded, instead of the devices becoming schedulable. The ECC fault is restored on the
/// physical GPU, so that GPU's recovery clears its MIG devices after the hold.
#[tokio::test]
async fn health_taints_survive_an_agent_restart() -> anyhow::Result<()> {
    let _cluster = locks::cluster_shared().await?;
    let mixed = GpuLayout { gpus: 1, ..GpuLayout::mig(1, &["1g.10gb"; 2]) };
    scenario!(Fixture::new("agent-restore").await?, |f| {
        f.up(vec![("n", mixed)]).await?;
        let node = f.node("n");
        let migs = ["gpu-1-mig-1g10gb-0", "gpu-1-mig-1g10gb-1"];
        let ecc =
            vec![(format!("{}/{}", f.driver, well_known::TAINT_KEY_ECC_DBE), None, "NoSchedule".to_string())];
        f.fault(&node, json!({"device": "gpu-0", "kind": "xid", "xid": 79})).await?;
        f.fault(&node, json!({"device": "gpu-1", "kind": "ecc-dbe"})).await?;
        let tainted = f
            .wait_pool("the xid and ecc taints", &node, SCHEDULING, |p| {
                !p.taints("gpu-0").is_empty() && migs.iter().all(|m| !p.taints(m).is_empty())
            })
            .await?;
        let xid_key = format!("{}/{}", f.driver, well_known::TAINT_KEY_XID);
        let xid_added = time_added(&tainted, "gpu-0", &xid_key).context("xid timeAdded")?;

        let status = f.sim().stop_agent(&node).await?;
        assert!(status.success(), "the agent exits cleanly on SIGTERM: {status}");
        let stopped = f.pool(&node).await?;
        f.sim().start_agent(&node);
        let unavailable = format!("{}/{}", f.driver, well_known::TAINT_KEY_DRIVER_UNAVAILABLE);
        let after = f
            .wait_pool("the restarted agent to publish", &node, AGENT_UP, |p| {
                p.generation() > stopped.generation()
                    && p.devices().values().all(|d| d.taints.iter().flatten().all(|t| t.key != unavailable))
            })
            .await?;
        assert_eq!(after.taints("gpu-0"), xid_taint(&f, 79, "NoSchedule"), "the fatal xid survived");
        assert_eq!(time_added(&after, "gpu-0", &xid_key), Some(xid_added), "with its original timeAdded");
        for m in migs {
            assert_eq!(after.taints(m), ecc, "{m}");
        }

        // The GPU's recovery clears both MIG devices after the hold; the fatal xid stays.
        f.fault(&node, json!({"device": "gpu-1", "kind": "recover"})).await?;
        let recovered = f
            .wait_pool("the MIG devices' taints to clear after recovery", &node, SCHEDULING, |p| {
                migs.iter().all(|m| p.taints(m).is_empty())
            })
            .await?;
        assert_eq!(recovered.taints("gpu-0"), xid_taint(&f, 79, "NoSchedule"));
        Ok(())
    })
}

/// Slices deleted behind the agent's back (the kubelet deletes a node's slices when it starts; an
/// admin may too) or changed by someone else are published again, at a higher pool generation.
#[tokio::test]
async fn deleted_or_changed_slices_are_published_again() -> anyhow::Result<()> {
    let _cluster = locks::cluster_shared().await?;
    scenario!(Fixture::new("agent-drift").await?, |f| {
        f.up(vec![("n", GpuLayout::gpus(2))]).await?;
        let node = f.node("n");
        let slices = f.slices_api();
        let before = f.pool(&node).await?;
        for name in before.names() {
            slices.delete(&name, &DeleteParams::default()).await?;
        }
        let again = f
            .wait_pool("the agent to publish its deleted slices again", &node, SCHEDULING, |p| {
                p.devices().len() == 2
            })
            .await?;
        assert_eq!(again.names(), before.names());
        assert!(again.generation() > before.generation());

        let name = again.names()[0].clone();
        slices
            .patch(
                &name,
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(json!({"spec": {"devices": []}})),
            )
            .await?;
        let restored = f
            .wait_pool("the agent to undo a foreign change", &node, SCHEDULING, |p| {
                p.devices().len() == 2 && p.generation() > again.generation()
            })
            .await?;
        assert_eq!(restored.names(), before.names());
        Ok(())
    })
}

/// A GPU node whose NVIDIA driver library the agent cannot load (this machine has none): the
/// agent stays up, says so once on the Node with a Warning event that names where it looked,
/// reports `switchyard_agent_driver_present 0`, publishes an empty pool, and keeps retrying.
#[tokio::test]
async fn a_node_without_the_nvidia_library_gets_one_warning_and_no_crash_loop() -> anyhow::Result<()> {
    let _cluster = locks::cluster_shared().await?;
    let client = cluster::client().await?;
    let id = unique("nolib");
    let node = format!("{id}-n0");
    let nodes: Api<Node> = Api::all(client.clone());
    nodes
        .create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": node}}))?)
        .await?;
    let driver_root = std::env::temp_dir().join(format!("switchyard-e2e-{id}-driver-root"));
    std::fs::create_dir_all(&driver_root)?;
    let listen = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
    let log = std::env::temp_dir().join(format!("switchyard-e2e-{id}.agent.log"));
    let mut agent = tokio::process::Command::new(cluster::agent_bin())
        .args([
            "--node-name",
            &node,
            "--driver-name",
            &format!("{id}.gpu.switchyard.dev"),
            "--inventory",
            "nvml",
        ])
        .args(["--kubelet-plugin=false", "--listen", &listen.to_string()])
        .arg("--driver-root")
        .arg(&driver_root)
        .env("KUBECONFIG", cluster::kubeconfig())
        .stdout(std::fs::File::create(&log)?)
        .stderr(std::fs::File::options().append(true).open(&log)?)
        .kill_on_drop(true)
        .spawn()?;
    let outcome = async {
        let events: Api<k8s_openapi::api::events::v1::Event> = Api::all(client.clone());
        let warnings = || {
            let events = events.clone();
            let node = node.clone();
            async move {
                let all =
                    events.list(&ListParams::default().fields(&format!("regarding.name={node}"))).await?;
                anyhow::Ok(
                    all.items
                        .into_iter()
                        .filter(|e| e.reason.as_deref() == Some("NvidiaDriverUnavailable"))
                        .collect::<Vec<_>>(),
                )
            }
        };
        let first = wait::until("the agent's Warning event on its Node", AGENT_UP, || async move {
            Ok(warnings().await?.into_iter().next())
        })
        .await?;
        assert_eq!(first.type_.as_deref(), Some("Warning"));
        assert_eq!(first.regarding.as_ref().and_then(|r| r.kind.as_deref()), Some("Node"));
        let note = first.note.clone().unwrap_or_default();
        assert!(note.contains(&format!("{}/usr/lib64/libnvidia-ml.so.1", driver_root.display())), "{note}");
        assert!(note.contains("agent.driverRoot"), "the note says what to change: {note}");
        let (_, metrics) =
            switchyard_e2e::measure::http("GET", &format!("http://{listen}/metrics"), None).await?;
        assert!(metrics.lines().any(|l| l == "switchyard_agent_driver_present 0"), "{metrics}");
        // The pool is published, empty: the scheduler sees a driver without devices, not a stale pool.
        let slices: Api<ResourceSlice> = Api::all(client.clone());
        let ours = wait::until("the agent's empty pool", AGENT_UP, || {
            let slices = slices.clone();
            let node = node.clone();
            async move {
                let l = slices.list(&ListParams::default().fields(&format!("spec.nodeName={node}"))).await?;
                Ok((!l.items.is_empty()).then_some(l.items))
            }
        })
        .await?;
        assert!(ours.iter().all(|s| s.spec.devices.as_ref().is_none_or(Vec::is_empty)), "{ours:?}");
        // Up and retrying: the next discovery (a minute on) fails the same way, with no second
        // Warning.
        let tries = || {
            std::fs::read_to_string(&log).unwrap_or_default().matches("no NVIDIA driver on this node").count()
        };
        wait::until("the agent's next discovery", Duration::from_secs(100), || async {
            Ok((tries() >= 2).then_some(()))
        })
        .await?;
        assert!(
            agent.try_wait()?.is_none(),
            "the agent exited without a driver: {}",
            std::fs::read_to_string(&log)?
        );
        let all = warnings().await?;
        assert_eq!(all.len(), 1, "one Warning per change, not per retry: {all:?}");
        assert_eq!(all[0].series.as_ref().map(|s| s.count), None, "{all:?}");
        anyhow::Ok(())
    }
    .await;
    let _ = agent.kill().await;
    let _ = nodes.delete(&node, &DeleteParams::default()).await;
    let _ = std::fs::remove_dir_all(&driver_root);
    if outcome.is_err() {
        eprintln!("agent log:\n{}", std::fs::read_to_string(&log).unwrap_or_default());
    }
    outcome
}
