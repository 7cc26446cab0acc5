//! A GPU pool on the shared cluster for migration scenarios: simulated nodes served by a
//! device-plugin DaemonSet, a DRA-driver DaemonSet whose pods run the real driver agent, GPU and
//! non-GPU workloads, and the real `switchyard-operator` as a separate process (so tests can
//! SIGKILL it). Also the invariant sampler that checks, on every watch event, that no node is
//! served by both backends.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::resource::v1::{DeviceTaintRule, ResourceSlice};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt};
use serde_json::{Value, json};
use switchyard_operator::api::v1alpha1::{GpuPoolMigration, Phase};
use switchyard_operator::well_known::{
    ANNOTATION_MIGRATION_STATE, LABEL_GPU_BACKEND, LABEL_GPU_OPERATOR_DEVICE_PLUGIN, NVIDIA_GPU_RESOURCE,
};
use tokio::task::JoinHandle;

use crate::cluster::{self, unique};
use crate::containers::{Containers, Shared};
use crate::sim::{
    AgentSettings, DaemonSetKey, GpuLayout, SimConfig, SimNode, Simulator, placeholder_daemon_set,
};
use crate::wait;

/// Name of the device-plugin DaemonSet in the pool's system namespace.
pub const DEVICE_PLUGIN_DS: &str = "nvidia-device-plugin-daemonset";
/// Name of the DRA-driver DaemonSet in the pool's system namespace.
pub const DRIVER_DS: &str = "switchyard-driver-agent";

/// `nodes` layouts of `gpus` whole GPUs, without extra labels.
fn uniform(nodes: u32, gpus: u32) -> Vec<(GpuLayout, BTreeMap<String, String>)> {
    (0..nodes).map(|_| (GpuLayout::gpus(gpus), BTreeMap::new())).collect()
}

/// How the pool's device plugin is deployed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DevicePluginFlavor {
    /// From a manifest or the Helm chart: on every pool node, no backend affinity.
    #[default]
    Plain,
    /// As the NVIDIA GPU Operator renders it: owned by a ClusterPolicy (a stand-in object of a
    /// stand-in CRD; what matters is what its DaemonSet does with labels), on the nodes labelled
    /// `nvidia.com/gpu.deploy.device-plugin=true`, which the pool's nodes are, as the GPU
    /// Operator labels GPU nodes.
    GpuOperator,
}

/// Which DRA driver identity serves the pool's migrated nodes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DriverFlavor {
    /// Switchyard's driver: the agent under `<pool>.gpu.switchyard.dev`, with its device-plugin
    /// interlock; migrations say so (`devicePluginInterlock: true`).
    #[default]
    Switchyard,
    /// A driver without the interlock, as NVIDIA's `gpu.nvidia.com` is: the same agent under
    /// `<pool>.gpu.example.com`, started with `--device-plugin-resources=`, so it publishes
    /// untainted devices as soon as it runs. Migrations leave `devicePluginInterlock` unset, so
    /// the operator switches such nodes in sequence.
    ThirdParty,
}

/// The name a pool's device plugin advertises its full GPUs under.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum GpuName {
    /// `nvidia.com/gpu`. One such pool at a time on the shared cluster
    /// ([`crate::locks::nvidia_gpu`]): two pools' DeviceClasses for one extended resource name
    /// shadow each other.
    #[default]
    Nvidia,
    /// `nvidia.com/gpu-<pool id>`, as the device plugin's `resources.gpus[].name` config renames
    /// GPUs. The migration lists it in `spec.devicePlugin.gpuResources` and the agent in
    /// `--device-plugin-resources`, as a user with that config sets them. Such pools run side
    /// by side.
    Renamed,
}

/// The GPU Operator's ClusterPolicy kind.
fn cluster_policy_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &kube::core::GroupVersionKind::gvk("nvidia.com", "v1", "ClusterPolicy"),
        "clusterpolicies",
    )
}

/// Nodes created at once when a pool is built.
const NODE_CREATE_CONCURRENCY: usize = 16;

/// A running `switchyard-operator` process.
pub struct Operator {
    child: tokio::process::Child,
    /// Where it serves `/metrics`, when the pool started it.
    metrics: Option<std::net::SocketAddr>,
}

impl Operator {
    /// An operator process started with [`Pool::spawn_operator_with`], handed to the pool so
    /// that its cleanup waits for the finalizers with an operator running.
    pub fn from_child(child: tokio::process::Child) -> Self {
        Self { child, metrics: None }
    }

    /// Kills the process with SIGKILL, as a node failure or OOM would, and waits for it.
    pub async fn kill(mut self) -> anyhow::Result<()> {
        self.child.kill().await?;
        Ok(())
    }
}

/// One pool scenario's objects.
pub struct Pool {
    pub client: Client,
    pub id: String,
    /// Namespace of both DaemonSets, the operator's Lease and canary pods.
    pub system_ns: String,
    /// Namespace of the workloads.
    pub apps_ns: String,
    pub driver: String,
    pub nodes: Vec<String>,
    pub sim: Option<Simulator>,
    pub operator: Option<Operator>,
    pub flavor: DevicePluginFlavor,
    pub driver_flavor: DriverFlavor,
    /// The extended resource the device plugin advertises full GPUs under and the pool's
    /// workloads ask for ([`GpuName`]).
    pub resource: String,
    work_dir: std::path::PathBuf,
}

impl Pool {
    /// Creates `nodes` simulated nodes with `gpus` GPUs each, both DaemonSets, and starts the
    /// simulator. The operator is not started yet.
    pub async fn new(prefix: &str, nodes: u32, gpus: u32) -> anyhow::Result<Self> {
        Self::with_unregister_delay(prefix, nodes, gpus, Duration::from_secs(1), GpuName::Nvidia).await
    }

    /// Like [`Pool::new`], with the delay between a plugin pod leaving a node and its resources
    /// disappearing (a long one holds nodes in Switching), and the GPUs' resource name.
    pub async fn with_unregister_delay(
        prefix: &str,
        nodes: u32,
        gpus: u32,
        unregister_delay: Duration,
        name: GpuName,
    ) -> anyhow::Result<Self> {
        let flavors = (DevicePluginFlavor::Plain, DriverFlavor::Switchyard, name);
        Self::build_with(prefix, uniform(nodes, gpus), unregister_delay, false, flavors).await
    }

    /// A pool of one node per entry of `layouts`, each with that GPU layout and those extra
    /// labels (GPU Feature Discovery's, say).
    pub async fn with_layouts(
        prefix: &str,
        layouts: Vec<(GpuLayout, BTreeMap<String, String>)>,
    ) -> anyhow::Result<Self> {
        let flavors = (DevicePluginFlavor::Plain, DriverFlavor::Switchyard, GpuName::Nvidia);
        Self::build_with(prefix, layouts, Duration::from_secs(1), false, flavors).await
    }

    /// The scale environment's pool: `nodes` nodes with `gpus` GPUs each on the light simulator
    /// ([`SimConfig::light`]: Lease-only heartbeats, stub slices, no agent processes), created
    /// side by side.
    pub async fn scale(
        prefix: &str,
        nodes: u32,
        gpus: u32,
        unregister_delay: Duration,
    ) -> anyhow::Result<Self> {
        let flavors = (DevicePluginFlavor::Plain, DriverFlavor::Switchyard, GpuName::Nvidia);
        Self::build_with(prefix, uniform(nodes, gpus), unregister_delay, true, flavors).await
    }

    /// A pool whose DRA driver has no device-plugin interlock ([`DriverFlavor::ThirdParty`]).
    pub async fn third_party_driver(
        prefix: &str,
        nodes: u32,
        gpus: u32,
        unregister_delay: Duration,
        name: GpuName,
    ) -> anyhow::Result<Self> {
        let flavors = (DevicePluginFlavor::Plain, DriverFlavor::ThirdParty, name);
        Self::build_with(prefix, uniform(nodes, gpus), unregister_delay, false, flavors).await
    }

    /// A pool whose device plugin the GPU Operator deploys ([`DevicePluginFlavor::GpuOperator`]).
    pub async fn gpu_operator(prefix: &str, nodes: u32, gpus: u32) -> anyhow::Result<Self> {
        let flavors = (DevicePluginFlavor::GpuOperator, DriverFlavor::Switchyard, GpuName::Nvidia);
        Self::build_with(prefix, uniform(nodes, gpus), Duration::from_secs(1), false, flavors).await
    }

    async fn build_with(
        prefix: &str,
        layouts: Vec<(GpuLayout, BTreeMap<String, String>)>,
        unregister_delay: Duration,
        light: bool,
        (flavor, driver_flavor, name): (DevicePluginFlavor, DriverFlavor, GpuName),
    ) -> anyhow::Result<Self> {
        let client = cluster::client().await?;
        let id = unique(prefix);
        let resource = match name {
            GpuName::Nvidia => NVIDIA_GPU_RESOURCE.to_owned(),
            GpuName::Renamed => format!("{NVIDIA_GPU_RESOURCE}-{id}"),
        };
        let renamed = (name == GpuName::Renamed).then(|| resource.clone());
        let system_ns = format!("{id}-system");
        let apps_ns = format!("{id}-apps");
        cluster::create_namespace(&client, &system_ns).await?;
        cluster::create_namespace(&client, &apps_ns).await?;
        let driver = match driver_flavor {
            DriverFlavor::Switchyard => format!("{id}.gpu.switchyard.dev"),
            DriverFlavor::ThirdParty => format!("{id}.gpu.example.com"),
        };
        let work_dir = std::env::temp_dir().join(format!("switchyard-e2e-{id}"));

        let mut config = if light { SimConfig::light(id.clone()) } else { SimConfig::new(id.clone()) };
        config.device_plugin =
            Some(DaemonSetKey { namespace: system_ns.clone(), name: DEVICE_PLUGIN_DS.into() });
        config.dra_driver = Some(DaemonSetKey { namespace: system_ns.clone(), name: DRIVER_DS.into() });
        config.driver_name = driver.clone();
        config.unregister_delay = unregister_delay;
        config.agent = (!light).then(|| AgentSettings {
            bin: cluster::agent_bin(),
            kubeconfig: cluster::kubeconfig().to_path_buf(),
            work_dir: work_dir.clone(),
            health_hold_seconds: 5,
            device_plugin_interlock: driver_flavor == DriverFlavor::Switchyard,
            renamed_gpu_resource: renamed.clone(),
        });
        let sim = Simulator::start(client.clone(), config).await?;
        let mut specs = Vec::new();
        let mut advertised = Vec::new();
        for (i, (mut layout, mut labels)) in layouts.into_iter().enumerate() {
            layout.gpu_resource.clone_from(&renamed);
            let name = format!("{id}-n{i}");
            labels.insert("pool".to_owned(), id.clone());
            if flavor == DevicePluginFlavor::GpuOperator {
                labels.insert(LABEL_GPU_OPERATOR_DEVICE_PLUGIN.to_owned(), "true".to_owned());
            }
            let gpus = layout.device_plugin_resources().get(&resource).copied().unwrap_or(0);
            advertised.push((name.clone(), gpus));
            specs.push(SimNode { name, labels, layout });
        }
        let names: Vec<String> = specs.iter().map(|s| s.name.clone()).collect();
        // Side by side, as machines join a cluster; a few at a time for the small pools.
        futures::stream::iter(specs)
            .map(|spec| sim.add_node(spec))
            .buffer_unordered(NODE_CREATE_CONCURRENCY)
            .try_collect::<Vec<_>>()
            .await?;
        let pool = Self {
            client,
            id,
            system_ns,
            apps_ns,
            driver,
            nodes: names,
            sim: Some(sim),
            operator: None,
            flavor,
            driver_flavor,
            resource,
            work_dir,
        };
        pool.create_daemonsets().await?;
        pool.wait_device_plugin_serving(&advertised).await?;
        Ok(pool)
    }

    /// Adds one more node to the pool (labelled into it, `gpus` GPUs) and waits until the device
    /// plugin serves it; returns its name.
    pub async fn add_node(&mut self, gpus: u32) -> anyhow::Result<String> {
        let name = format!("{}-n{}", self.id, self.nodes.len());
        let labels = BTreeMap::from([("pool".to_owned(), self.id.clone())]);
        self.sim().add_node(SimNode { name: name.clone(), labels, layout: self.layout(gpus) }).await?;
        self.nodes.push(name.clone());
        self.wait_device_plugin_serving(&[(name.clone(), gpus)]).await?;
        Ok(name)
    }

    /// Adds one more node to the pool, `gpus` GPUs and `labels` (GPU Feature Discovery's, say)
    /// besides the pool's, without waiting for a device plugin: for a node that joins after the
    /// device plugin was removed. Returns its name.
    pub async fn add_unserved_node(
        &mut self,
        gpus: u32,
        labels: BTreeMap<String, String>,
    ) -> anyhow::Result<String> {
        let name = format!("{}-n{}", self.id, self.nodes.len());
        let mut labels = labels;
        labels.insert("pool".to_owned(), self.id.clone());
        self.sim().add_node(SimNode { name: name.clone(), labels, layout: self.layout(gpus) }).await?;
        self.nodes.push(name.clone());
        Ok(name)
    }

    /// `gpus` full GPUs under the pool's resource name.
    fn layout(&self, gpus: u32) -> GpuLayout {
        let renamed = (self.resource != NVIDIA_GPU_RESOURCE).then(|| self.resource.clone());
        GpuLayout { gpu_resource: renamed, ..GpuLayout::gpus(gpus) }
    }

    pub fn sim(&self) -> &Simulator {
        self.sim.as_ref().expect("simulator runs until cleanup")
    }

    /// The device plugin as users run it today: on every pool node, with no backend affinity
    /// (Managed placement adds it). The driver as shipped in config/agent: only on `dra` nodes.
    async fn create_daemonsets(&self) -> anyhow::Result<()> {
        let dra_only = json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": LABEL_GPU_BACKEND, "operator": "In", "values": ["dra"]}]}]}}});
        let api: Api<DaemonSet> = Api::namespaced(self.client.clone(), &self.system_ns);
        let on_pool = json!({"pool": self.id});
        let plugin = match self.flavor {
            DevicePluginFlavor::Plain => {
                placeholder_daemon_set(DEVICE_PLUGIN_DS, on_pool.clone(), json!({}))?
            }
            DevicePluginFlavor::GpuOperator => {
                let owner = self.cluster_policy().await?;
                let mut ds = placeholder_daemon_set(
                    DEVICE_PLUGIN_DS,
                    json!({"pool": self.id, LABEL_GPU_OPERATOR_DEVICE_PLUGIN: "true"}),
                    json!({}),
                )?;
                ds.metadata.owner_references = Some(vec![owner]);
                ds
            }
        };
        api.create(&PostParams::default(), &plugin).await?;
        api.create(&PostParams::default(), &placeholder_daemon_set(DRIVER_DS, on_pool, dra_only)?).await?;
        Ok(())
    }

    /// The pool's stand-in ClusterPolicy (named after the pool; its CRD is created once for the
    /// shared cluster), as the controller owner reference the GPU Operator puts on its DaemonSets.
    async fn cluster_policy(&self) -> anyhow::Result<OwnerReference> {
        let crds: Api<CustomResourceDefinition> = Api::all(self.client.clone());
        let crd: CustomResourceDefinition = serde_json::from_value(json!({
            "metadata": {"name": "clusterpolicies.nvidia.com"},
            "spec": {
                "group": "nvidia.com", "scope": "Cluster",
                "names": {"plural": "clusterpolicies", "singular": "clusterpolicy", "kind": "ClusterPolicy", "listKind": "ClusterPolicyList"},
                "versions": [{"name": "v1", "served": true, "storage": true,
                              "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}]
            }
        }))?;
        match crds.create(&PostParams::default(), &crd).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            Err(e) => return Err(e.into()),
        }
        let resource = cluster_policy_resource();
        let policies: Api<DynamicObject> = Api::all_with(self.client.clone(), &resource);
        let policy = DynamicObject::new(&self.id, &resource)
            .data(json!({"spec": {"devicePlugin": {"enabled": true}}}));
        // The CRD may be seconds from Established on a fresh cluster.
        let created =
            wait::until("the stand-in ClusterPolicy to be created", Duration::from_secs(30), || {
                let (policies, policy) = (policies.clone(), policy.clone());
                async move {
                    match policies.create(&PostParams::default(), &policy).await {
                        Ok(p) => Ok(Some(p)),
                        Err(kube::Error::Api(e)) if e.code == 404 => Ok(None),
                        Err(e) => Err(e.into()),
                    }
                }
            })
            .await?;
        Ok(OwnerReference {
            api_version: resource.api_version,
            kind: resource.kind,
            name: created.name_any(),
            uid: created.uid().unwrap_or_default(),
            controller: Some(true),
            block_owner_deletion: None,
        })
    }

    /// Waits until each node advertises its GPU count (one LIST of the pool a try).
    async fn wait_device_plugin_serving(&self, advertised: &[(String, u32)]) -> anyhow::Result<()> {
        let nodes: Api<Node> = Api::all(self.client.clone());
        let lp = ListParams::default().labels(&format!("pool={}", self.id));
        let resource = self.resource.as_str();
        // 5,000 light nodes take minutes on 2 cores: the DaemonSet controller makes a pod for each.
        let timeout = Duration::from_secs(90 + advertised.len() as u64 / 4);
        wait::until("the device plugin to serve every pool node", timeout, || {
            let (nodes, lp) = (nodes.clone(), lp.clone());
            async move {
                let listed: HashMap<String, i64> = nodes
                    .list(&lp)
                    .await?
                    .items
                    .iter()
                    .map(|n| (n.name_any(), allocatable(n, resource)))
                    .collect();
                let serving = advertised.iter().all(|(n, gpus)| listed.get(n) == Some(&i64::from(*gpus)));
                Ok(serving.then_some(()))
            }
        })
        .await
    }

    /// A GpuPoolMigration for this pool, with `overrides` merged into its spec.
    pub fn migration(&self, name: &str, overrides: Value) -> anyhow::Result<GpuPoolMigration> {
        let mut object = json!({
            "apiVersion": "switchyard.dev/v1alpha1", "kind": "GpuPoolMigration",
            "metadata": {"name": name, "labels": {"e2e.switchyard.dev/pool": self.id}},
            "spec": {
                "nodeSelector": {"matchLabels": {"pool": self.id}},
                "resources": [{"extendedResourceName": self.resource, "deviceClassName": format!("{}.gpu", self.id),
                               "selector": format!("device.attributes['{}'].type == 'gpu'", self.driver)}],
                "driver": {"name": self.driver, "daemonSet": {"namespace": self.system_ns, "name": DRIVER_DS}},
                "devicePlugin": {"daemonSet": {"namespace": self.system_ns, "name": DEVICE_PLUGIN_DS}},
                "strategy": {"drain": {"gracePeriodSeconds": 1, "timeoutSeconds": 120}, "verify": {"timeoutSeconds": 120}},
            }
        });
        if self.resource != NVIDIA_GPU_RESOURCE {
            object["spec"]["devicePlugin"]["gpuResources"] = json!([self.resource]);
        }
        if self.driver_flavor == DriverFlavor::Switchyard {
            // Switchyard's agent under a name of the pool's own: it has the interlock, which the
            // operator assumes only for `gpu.switchyard.dev` unless told.
            object["spec"]["driver"]["devicePluginInterlock"] = json!(true);
        }
        switchyard_operator::testing::merge_patch(&mut object["spec"], &overrides);
        Ok(serde_json::from_value(object)?)
    }

    pub fn migrations(&self) -> Api<GpuPoolMigration> {
        Api::all(self.client.clone())
    }

    /// Starts the real operator binary against the shared cluster, without leader election.
    pub fn start_operator(&mut self) -> anyhow::Result<()> {
        let (child, metrics) = self.spawn_operator_with(
            &["--no-leader-election"],
            "operator.log",
            "info,switchyard_operator=debug",
        )?;
        self.operator = Some(Operator { child, metrics: Some(metrics) });
        Ok(())
    }

    /// The `/metrics` URL of the operator [`Pool::start_operator`] started.
    pub fn operator_metrics_url(&self) -> Option<String> {
        let addr = self.operator.as_ref()?.metrics?;
        Some(format!("http://{addr}/metrics"))
    }

    /// Starts one more operator process with `args`, logging to `log` in the pool's work dir;
    /// the caller owns it (it is killed when dropped).
    pub fn spawn_operator(&self, args: &[&str], log: &str) -> anyhow::Result<tokio::process::Child> {
        Ok(self.spawn_operator_with(args, log, "info,switchyard_operator=debug")?.0)
    }

    /// Like [`Pool::spawn_operator`], with `RUST_LOG` set to `rust_log`; also returns the address
    /// its metrics are served on.
    pub fn spawn_operator_with(
        &self,
        args: &[&str],
        log: &str,
        rust_log: &str,
    ) -> anyhow::Result<(tokio::process::Child, std::net::SocketAddr)> {
        std::fs::create_dir_all(&self.work_dir)?;
        let log = std::fs::OpenOptions::new().create(true).append(true).open(self.work_dir.join(log))?;
        let metrics = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
        let child = tokio::process::Command::new(cluster::operator_bin())
            .args(args)
            .args(["--namespace", &self.system_ns])
            // Only this pool's migrations: a leftover from another scenario is not ours to touch.
            .args(["--selector", &format!("e2e.switchyard.dev/pool={}", self.id)])
            .args(["--metrics-addr", &metrics.to_string()])
            .env("KUBECONFIG", cluster::kubeconfig())
            .env("RUST_LOG", rust_log)
            .stdout(log.try_clone()?)
            .stderr(log)
            .kill_on_drop(true)
            .spawn()?;
        Ok((child, metrics))
    }

    /// Where the operator and agents of this pool log.
    pub fn log_dir(&self) -> &std::path::Path {
        &self.work_dir
    }

    /// Waits until the migration's status satisfies `pred`, returning it.
    pub async fn wait_status(
        &self,
        name: &str,
        what: &str,
        timeout: Duration,
        pred: impl Fn(&GpuPoolMigration) -> bool,
    ) -> anyhow::Result<GpuPoolMigration> {
        let api = self.migrations();
        let pred = &pred;
        wait::until(&format!("{name}: {what}"), timeout, || {
            let api = api.clone();
            async move {
                let gpm = api.get(name).await?;
                Ok(pred(&gpm).then_some(gpm))
            }
        })
        .await
        .map_err(|e| anyhow::anyhow!("{e}\n(logs in {})", self.work_dir.display()))
    }

    pub async fn wait_phase(
        &self,
        name: &str,
        phase: Phase,
        timeout: Duration,
    ) -> anyhow::Result<GpuPoolMigration> {
        self.wait_status(name, &format!("phase {phase:?}"), timeout, |g| {
            g.status.as_ref().and_then(|s| s.phase) == Some(phase)
        })
        .await
    }

    /// A Deployment of `replicas` pods, each asking for `gpus` of the pool's GPUs (0: no GPU).
    pub async fn deployment(&self, name: &str, replicas: i32, gpus: u32) -> anyhow::Result<()> {
        let resources =
            if gpus > 0 { json!({"limits": {&self.resource: gpus.to_string()}}) } else { json!({}) };
        let d: Deployment = serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {
                "replicas": replicas,
                "selector": {"matchLabels": {"app": name}},
                "template": {
                    "metadata": {"labels": {"app": name}},
                    "spec": {
                        "nodeSelector": {"pool": self.id},
                        "terminationGracePeriodSeconds": 1,
                        "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10", "resources": resources}],
                    }
                }
            }
        }))?;
        Api::<Deployment>::namespaced(self.client.clone(), &self.apps_ns)
            .create(&PostParams::default(), &d)
            .await?;
        Ok(())
    }

    pub async fn pdb(&self, name: &str, app: &str, min_available: i32) -> anyhow::Result<()> {
        let pdb: PodDisruptionBudget = serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {"minAvailable": min_available, "selector": {"matchLabels": {"app": app}}}
        }))?;
        Api::<PodDisruptionBudget>::namespaced(self.client.clone(), &self.apps_ns)
            .create(&PostParams::default(), &pdb)
            .await?;
        Ok(())
    }

    /// Waits until `count` pods in the apps namespace are Running.
    pub async fn wait_running(&self, count: usize) -> anyhow::Result<Vec<Pod>> {
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), &self.apps_ns);
        wait::until(&format!("{count} running workload pods"), Duration::from_secs(90), || {
            let pods = pods.clone();
            async move {
                let running = running(pods.list(&ListParams::default()).await?.items);
                Ok((running.len() == count).then_some(running))
            }
        })
        .await
    }

    /// Starts the invariant sampler for this pool.
    pub fn sample(&self) -> Sampler {
        let (pool, driver, apps_ns) = (self.id.clone(), self.driver.clone(), self.apps_ns.clone());
        Sampler::watch(self.client.clone(), pool, driver, apps_ns, self.resource.clone())
    }

    /// Runs `scenario` on this pool and then cleans the pool up whatever the outcome, a failed
    /// assertion (a panic) included, so a failed scenario leaves nothing on the shared cluster.
    pub async fn run<F>(mut self, scenario: F) -> anyhow::Result<()>
    where
        F: AsyncFnOnce(&mut Pool) -> anyhow::Result<()>,
    {
        use futures::FutureExt;
        let outcome = std::panic::AssertUnwindSafe(scenario(&mut self)).catch_unwind().await;
        let failed = !matches!(outcome, Ok(Ok(())));
        if failed {
            eprintln!("scenario failed; operator and agent logs are in {}", self.log_dir().display());
            self.print_workloads().await;
        }
        let cleaned = self.cleanup().await;
        match outcome {
            Err(panic) => std::panic::resume_unwind(panic),
            Ok(result) => result.and(cleaned),
        }
    }

    /// Prints the workload pods (node, phase, readiness, terminating) for a failed scenario.
    async fn print_workloads(&self) {
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), &self.apps_ns);
        match pods.list(&ListParams::default()).await {
            Ok(list) => {
                for p in list.items {
                    let status = p.status.as_ref();
                    let ready = status
                        .and_then(|s| s.conditions.as_ref())
                        .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
                        .map_or("-", |c| c.status.as_str());
                    eprintln!(
                        "  pod {} node={} phase={} ready={ready} terminating={} claim={}",
                        p.name_any(),
                        p.spec.as_ref().and_then(|s| s.node_name.as_deref()).unwrap_or("-"),
                        status.and_then(|s| s.phase.as_deref()).unwrap_or("-"),
                        p.metadata.deletion_timestamp.is_some(),
                        status.is_some_and(|s| s.extended_resource_claim_status.is_some()),
                    );
                }
            }
            Err(e) => eprintln!("  (listing the workload pods failed: {e})"),
        }
    }

    /// Deletes the migrations of this pool (waiting for the operator's finalizer), stops the
    /// operator and the simulator, and deletes the namespaces.
    pub async fn cleanup(mut self) -> anyhow::Result<()> {
        let api = self.migrations();
        let ours: Vec<String> = api
            .list(&ListParams::default())
            .await?
            .items
            .iter()
            .filter(|g| {
                g.spec.node_selector.match_labels.as_ref().and_then(|l| l.get("pool")) == Some(&self.id)
            })
            .map(|g| g.name_any())
            .collect();
        for name in &ours {
            let _ = api.delete(name, &DeleteParams::default()).await;
        }
        if self.operator.is_some() {
            // The operator's clean-up patches every pool node, one after the other.
            let timeout = Duration::from_secs(60 + self.nodes.len() as u64 / 10);
            for name in &ours {
                let api = api.clone();
                wait::until(&format!("{name} to be deleted"), timeout, || {
                    let api = api.clone();
                    async move { Ok(api.get_opt(name).await?.is_none().then_some(())) }
                })
                .await?;
            }
        }
        if let Some(op) = self.operator.take() {
            op.kill().await?;
        }
        if let Some(sim) = self.sim.take() {
            sim.shutdown().await?;
        }
        let dp = DeleteParams::default();
        let namespaces: Api<Namespace> = Api::all(self.client.clone());
        let _ = namespaces.delete(&self.system_ns, &dp).await;
        let _ = namespaces.delete(&self.apps_ns, &dp).await;
        // Our DeviceClass, and any class a scenario labelled with the pool (a shadowing one).
        let classes: Api<k8s_openapi::api::resource::v1::DeviceClass> = Api::all(self.client.clone());
        let _ = classes.delete(&format!("{}.gpu", self.id), &dp).await;
        let _ =
            classes.delete_collection(&dp, &ListParams::default().labels(&format!("pool={}", self.id))).await;
        if self.flavor == DevicePluginFlavor::GpuOperator {
            let policies = Api::<DynamicObject>::all_with(self.client.clone(), &cluster_policy_resource());
            let _ = policies.delete(&self.id, &dp).await;
        }
        Ok(())
    }
}

/// Allocatable `resource` on a node (0 when absent).
pub fn allocatable(node: &Node, resource: &str) -> i64 {
    node.status
        .as_ref()
        .and_then(|s| s.allocatable.as_ref())
        .and_then(|a| a.get(resource))
        .and_then(|q| q.0.parse().ok())
        .unwrap_or(0)
}

fn blocks(effect: &str) -> bool {
    effect == "NoSchedule" || effect == "NoExecute"
}

/// Devices in `slice` that the scheduler may allocate: those without a NoSchedule or NoExecute
/// taint, in the slice or from a DeviceTaintRule that selects them (a tainted device cannot take
/// a new claim, so it does not serve the node).
pub fn schedulable_devices(slice: &ResourceSlice, rules: &[&DeviceTaintRule]) -> usize {
    let ruled = |device: &str| {
        rules.iter().any(|r| {
            let sel = r.spec.device_selector.as_ref();
            let field = |f: Option<&String>, v: &str| f.is_none_or(|f| f == v);
            blocks(&r.spec.taint.effect)
                && field(sel.and_then(|s| s.driver.as_ref()), &slice.spec.driver)
                && field(sel.and_then(|s| s.pool.as_ref()), &slice.spec.pool.name)
                && field(sel.and_then(|s| s.device.as_ref()), device)
        })
    };
    slice
        .spec
        .devices
        .iter()
        .flatten()
        .filter(|d| !d.taints.iter().flatten().any(|t| blocks(&t.effect)) && !ruled(&d.name))
        .count()
}

/// What the sampler saw.
#[derive(Debug, Default, Clone)]
pub struct Samples {
    /// Watch events evaluated.
    pub events: u64,
    /// Every instant a node was served by both backends: (node, allocatable, schedulable devices),
    /// once per pair of node and slice versions. The watches of nodes and of slices are separate
    /// streams, so one may deliver a change later than the other: a pair is dropped once the
    /// resourceVersions show the two versions never held at the same instant.
    pub overlaps: Vec<(String, i64, usize)>,
    /// Every instant a pod held a DRA claim on a node where no DRA-driver pod was running:
    /// (pod, node, its phase and whether it was being deleted).
    pub orphaned_claim_holders: Vec<(String, String, String)>,
    /// UIDs of workload pods that were ever deleted, with whether they requested a GPU.
    pub deleted_pods: Vec<(String, bool)>,
    /// Per PDB-protected app: the fewest Ready pods seen while at least one existed.
    pub min_ready: BTreeMap<String, usize>,
    /// The most pool nodes seen mid-move at one instant (state Cordoned, Draining, Switching,
    /// Verifying or RollingBack), with their names then: what `maxUnavailable` bounds.
    pub max_in_flight: (usize, Vec<String>),
    /// Per node, every `switchyard.dev/gpu-backend` value it took, in order (absent reads as
    /// `device-plugin`); consecutive repeats are folded.
    pub backend_history: BTreeMap<String, Vec<String>>,
    /// With [`Sampler::watch_containers`]: the workload containers whose GPUs were read, every
    /// instant a GPU was inside two running containers of one node, and the running containers
    /// whose GPUs could not be read.
    pub containers_read: usize,
    pub shared_gpus: Vec<Shared>,
    pub unread_containers: Vec<String>,
}

#[derive(Default)]
struct View {
    /// The DaemonSet whose pods are the DRA driver's kubelet plugins.
    driver_ds: String,
    nodes: HashMap<String, Node>,
    /// Per node, the resourceVersion of the node object held, and of the last change to its
    /// slices.
    node_rv: HashMap<String, Option<u64>>,
    slices_rv: HashMap<String, Option<u64>>,
    /// Overlaps seen and not refuted.
    overlaps: Vec<Overlap>,
    slices: HashMap<String, ResourceSlice>,
    rules: HashMap<String, DeviceTaintRule>,
    driver_pods: HashMap<String, String>,
    claim_holders: HashMap<String, (String, String, String)>,
    ready_by_app: HashMap<String, BTreeSet<String>>,
}

/// A node seen served by both backends, with the resourceVersions of the node and slice versions
/// that showed it. Each version holds from its resourceVersion until the next one's (etcd
/// revisions, which the API server orders). The overlap existed iff the two spans meet.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Overlap {
    node: String,
    allocatable: i64,
    devices: usize,
    node_rv: Option<u64>,
    slices_rv: Option<u64>,
    node_next: Option<u64>,
    slices_next: Option<u64>,
}

impl Overlap {
    /// True once the versions' spans are known not to meet: one was replaced before the other
    /// began. Unknown resourceVersions never refute.
    fn refuted(&self) -> bool {
        let (Some(n), Some(s)) = (self.node_rv, self.slices_rv) else { return false };
        let end = self.node_next.unwrap_or(u64::MAX).min(self.slices_next.unwrap_or(u64::MAX));
        n.max(s) >= end
    }
}

/// The resourceVersion of `meta` as the etcd revision it is on this API server.
fn revision(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> Option<u64> {
    meta.resource_version.as_deref().and_then(|v| v.parse().ok())
}

/// Watches the pool's nodes, its driver's slices and all pods, and checks the invariants on
/// every event: no node served by both backends, no DRA claim holder outliving its node's
/// driver, no non-GPU pod deleted, and Ready counts per app for PDB checks.
pub struct Sampler {
    samples: Arc<Mutex<Samples>>,
    task: JoinHandle<()>,
}

/// A watch event as (object, still exists), or the end of the initial list; restarts and
/// errors are skipped (the watcher re-lists by itself).
fn lift<T>(event: Result<watcher::Event<T>, watcher::Error>, wrap: fn(T, bool) -> Update) -> Option<Update> {
    match event {
        Ok(watcher::Event::Apply(o) | watcher::Event::InitApply(o)) => Some(wrap(o, true)),
        Ok(watcher::Event::Delete(o)) => Some(wrap(o, false)),
        Ok(watcher::Event::InitDone) => Some(Update::Listed),
        _ => None,
    }
}

/// The watches the sampler merges; it checks nothing until each has delivered its initial list,
/// since a half-listed cluster (a claim holder seen before its node's driver pod) is no instant
/// that ever existed.
const SAMPLED_WATCHES: usize = 4;

enum Update {
    Listed,
    Node(Box<Node>, bool),
    Slice(Box<ResourceSlice>, bool),
    Pod(Box<Pod>, bool),
    Rule(Box<DeviceTaintRule>, bool),
}

impl Sampler {
    /// Starts sampling the nodes labelled `pool=<pool>`, the slices of `driver`, every pod (with
    /// the PDB and deletion bookkeeping for pods in `apps_ns`) and every DeviceTaintRule; the
    /// device plugin serves a node while it advertises `resource`.
    pub fn watch(client: Client, pool: String, driver: String, apps_ns: String, resource: String) -> Self {
        Self::watch_driver(client, pool, driver, DRIVER_DS.to_owned(), apps_ns, resource)
    }

    /// [`Sampler::watch`] of another DRA driver, whose kubelet-plugin pods belong to the
    /// DaemonSet named `driver_ds` (NVIDIA's, say).
    pub fn watch_driver(
        client: Client,
        pool: String,
        driver: String,
        driver_ds: String,
        apps_ns: String,
        resource: String,
    ) -> Self {
        Self::spawn(client, pool, driver, driver_ds, apps_ns, resource, false)
    }

    /// [`Sampler::watch_driver`] on the real nodes, where the pods in `apps_ns` are the workload
    /// image's real containers: it also reads each running container's GPUs and checks at every
    /// event that no GPU is inside two of them on one node ([`Samples::shared_gpus`]). Not for
    /// GPUs shared on purpose (time-slicing), where that is the point.
    pub fn watch_containers(
        client: Client,
        pool: String,
        driver: String,
        driver_ds: String,
        apps_ns: String,
        resource: String,
    ) -> Self {
        Self::spawn(client, pool, driver, driver_ds, apps_ns, resource, true)
    }

    fn spawn(
        client: Client,
        pool: String,
        driver: String,
        driver_ds: String,
        apps_ns: String,
        resource: String,
        read_containers: bool,
    ) -> Self {
        let samples = Arc::new(Mutex::new(Samples::default()));
        let out = samples.clone();
        let task = tokio::spawn(async move {
            // Each watch with a short backoff of its own: through an API-server restart the
            // sampler relists within seconds, without spinning.
            use switchyard_api::watch::backed_off;
            let nodes = backed_off(watcher(
                Api::<Node>::all(client.clone()),
                watcher::Config::default().labels(&format!("pool={pool}")),
            ))
            .map(|e| lift(e, |n, live| Update::Node(Box::new(n), live)));
            let slices = backed_off(watcher(
                Api::<ResourceSlice>::all(client.clone()),
                watcher::Config::default().fields(&format!("spec.driver={driver}")),
            ))
            .map(|e| lift(e, |s, live| Update::Slice(Box::new(s), live)));
            let pods = backed_off(watcher(Api::<Pod>::all(client.clone()), watcher::Config::default()))
                .map(|e| lift(e, |p, live| Update::Pod(Box::new(p), live)));
            let rules =
                backed_off(watcher(Api::<DeviceTaintRule>::all(client.clone()), watcher::Config::default()))
                    .map(|e| lift(e, |r, live| Update::Rule(Box::new(r), live)));
            let mut all =
                futures::stream::select_all([nodes.boxed(), slices.boxed(), pods.boxed(), rules.boxed()]);
            let mut view = View { driver_ds, ..View::default() };
            let mut containers = read_containers.then(|| Containers::new(client.clone(), &apps_ns));
            let mut listed = 0;
            while let Some(update) = all.next().await {
                match update {
                    None => continue,
                    Some(Update::Listed) => listed += 1,
                    Some(update) => {
                        if let (Some(c), Update::Pod(p, live)) = (containers.as_mut(), &update)
                            && let Err(e) = c.observe(p, *live).await
                        {
                            out.lock().unwrap().unread_containers.push(e);
                        }
                        view.apply(update, &apps_ns, &out)
                    }
                }
                if listed >= SAMPLED_WATCHES {
                    view.check(&pool, &resource, &out);
                    if let Some(c) = &containers {
                        let mut samples = out.lock().unwrap();
                        samples.containers_read = c.read_count;
                        for s in c.shared() {
                            if !samples.shared_gpus.contains(&s) {
                                samples.shared_gpus.push(s);
                            }
                        }
                    }
                }
            }
        });
        Self { samples, task }
    }

    /// What was seen so far.
    pub fn samples(&self) -> Samples {
        self.samples.lock().unwrap().clone()
    }

    pub fn stop(self) -> Samples {
        self.task.abort();
        self.samples()
    }
}

impl View {
    fn apply(&mut self, update: Update, apps_ns: &str, out: &Mutex<Samples>) {
        match update {
            Update::Listed => {}
            Update::Node(n, live) => {
                let rv = revision(&n.metadata);
                let old = self.node_rv.insert(n.name_any(), rv).flatten();
                for o in self.overlaps.iter_mut().filter(|o| o.node == n.name_any() && o.node_next.is_none())
                {
                    if o.node_rv == old {
                        o.node_next = rv;
                    }
                }
                if live {
                    let mut samples = out.lock().unwrap();
                    let history = samples.backend_history.entry(n.name_any()).or_default();
                    let now = backend(&n);
                    if history.last() != Some(&now) {
                        history.push(now);
                    }
                    drop(samples);
                    self.nodes.insert(n.name_any(), *n);
                } else {
                    self.nodes.remove(&n.name_any());
                }
            }
            Update::Rule(r, live) => {
                if live {
                    self.rules.insert(r.name_any(), *r);
                } else {
                    self.rules.remove(&r.name_any());
                }
            }
            Update::Slice(s, live) => {
                if let Some(node) = s.spec.node_name.clone() {
                    let rv = revision(&s.metadata);
                    let old = self.slices_rv.insert(node.clone(), rv).flatten();
                    for o in self.overlaps.iter_mut().filter(|o| o.node == node && o.slices_next.is_none()) {
                        if o.slices_rv == old {
                            o.slices_next = rv;
                        }
                    }
                }
                if live {
                    self.slices.insert(s.name_any(), *s);
                } else {
                    self.slices.remove(&s.name_any());
                }
            }
            Update::Pod(p, live) => {
                let uid = p.uid().unwrap_or_default();
                let node = p.spec.as_ref().and_then(|s| s.node_name.clone()).unwrap_or_default();
                let is_driver =
                    p.owner_references().iter().any(|o| o.kind == "DaemonSet" && o.name == self.driver_ds);
                if is_driver {
                    if live && p.metadata.deletion_timestamp.is_none() {
                        self.driver_pods.insert(uid.clone(), node.clone());
                    } else {
                        self.driver_pods.remove(&uid);
                    }
                }
                let holds_claim =
                    p.status.as_ref().and_then(|s| s.extended_resource_claim_status.as_ref()).is_some();
                if live && holds_claim && !node.is_empty() {
                    let phase = p.status.as_ref().and_then(|s| s.phase.clone()).unwrap_or_default();
                    let how = match p.metadata.deletion_timestamp {
                        Some(_) => format!("{phase}, deleting"),
                        None => phase,
                    };
                    self.claim_holders.insert(uid.clone(), (p.name_any(), node.clone(), how));
                } else {
                    self.claim_holders.remove(&uid);
                }
                if p.namespace().as_deref() == Some(apps_ns) {
                    let app = p.labels().get("app").cloned().unwrap_or_default();
                    let ready = live
                        && p.metadata.deletion_timestamp.is_none()
                        && p.status
                            .as_ref()
                            .and_then(|s| s.conditions.as_ref())
                            .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
                    let set = self.ready_by_app.entry(app.clone()).or_default();
                    if ready {
                        set.insert(uid.clone());
                    } else {
                        set.remove(&uid);
                    }
                    // The fewest Ready is taken in `check`, once every watch has listed: during
                    // the initial list the pods arrive one by one, which no instant ever had.
                    if !live {
                        let gpu = p.spec.as_ref().is_some_and(|s| {
                            s.containers.iter().any(|c| {
                                c.resources
                                    .as_ref()
                                    .and_then(|r| r.limits.as_ref())
                                    .is_some_and(|l| l.keys().any(|k| k.starts_with("nvidia.com/")))
                            })
                        });
                        out.lock().unwrap().deleted_pods.push((uid, gpu));
                    }
                }
            }
        }
    }

    fn check(&mut self, pool: &str, resource: &str, out: &Mutex<Samples>) {
        let mut samples = out.lock().unwrap();
        let mut new_overlaps = Vec::new();
        samples.events += 1;
        for (app, ready) in &self.ready_by_app {
            let seen = samples.min_ready.entry(app.clone()).or_insert(usize::MAX);
            *seen = (*seen).min(ready.len());
        }
        let rules: Vec<&DeviceTaintRule> = self.rules.values().collect();
        for (name, node) in &self.nodes {
            let alloc = allocatable(node, resource);
            let devices: usize = self
                .slices
                .values()
                .filter(|s| s.spec.node_name.as_deref() == Some(name.as_str()))
                .map(|s| schedulable_devices(s, &rules))
                .sum();
            if alloc > 0 && devices > 0 {
                let seen = Overlap {
                    node: name.clone(),
                    allocatable: alloc,
                    devices,
                    node_rv: self.node_rv.get(name).copied().flatten(),
                    slices_rv: self.slices_rv.get(name).copied().flatten(),
                    node_next: None,
                    slices_next: None,
                };
                if !self.overlaps.contains(&seen) {
                    new_overlaps.push(seen);
                }
            }
        }
        self.overlaps.extend(new_overlaps);
        self.overlaps.retain(|o| !o.refuted());
        samples.overlaps = self.overlaps.iter().map(|o| (o.node.clone(), o.allocatable, o.devices)).collect();
        let mut in_flight: Vec<String> = self
            .nodes
            .iter()
            .filter(|(_, n)| {
                n.annotations().get(ANNOTATION_MIGRATION_STATE).is_some_and(|s| {
                    ["Cordoned", "Draining", "Switching", "Verifying", "RollingBack"].contains(&s.as_str())
                })
            })
            .map(|(name, _)| name.clone())
            .collect();
        if in_flight.len() > samples.max_in_flight.0 {
            in_flight.sort();
            samples.max_in_flight = (in_flight.len(), in_flight);
        }
        let driver_nodes: BTreeSet<&String> = self.driver_pods.values().collect();
        for (pod, node, how) in self.claim_holders.values() {
            let in_pool = self
                .nodes
                .get(node)
                .is_some_and(|n| n.labels().get("pool").map(String::as_str) == Some(pool));
            if in_pool && !driver_nodes.contains(node) {
                samples.orphaned_claim_holders.push((pod.clone(), node.clone(), how.clone()));
            }
        }
    }
}

/// The pods of `pods` that run and are not being deleted.
pub fn running(pods: Vec<Pod>) -> Vec<Pod> {
    pods.into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
        .collect()
}

/// Backend label of a node ("device-plugin" when absent).
pub fn backend(node: &Node) -> String {
    node.labels().get(LABEL_GPU_BACKEND).cloned().unwrap_or_else(|| "device-plugin".into())
}

/// The `switchyard.dev/migration-state` annotation of one node ("" when absent).
pub async fn node_state(client: &Client, node: &str) -> anyhow::Result<String> {
    let n = Api::<Node>::all(client.clone()).get(node).await?;
    Ok(n.annotations().get(ANNOTATION_MIGRATION_STATE).cloned().unwrap_or_default())
}

/// The `switchyard.dev/migration-state` annotation of each pool node.
pub async fn node_states(client: &Client, pool: &Pool) -> anyhow::Result<BTreeMap<String, String>> {
    let nodes: Api<Node> = Api::all(client.clone());
    let mut out = BTreeMap::new();
    for name in &pool.nodes {
        let n = nodes.get(name).await?;
        let state = n.annotations().get(ANNOTATION_MIGRATION_STATE).cloned().unwrap_or_default();
        out.insert(name.clone(), state);
    }
    Ok(out)
}

/// Patches the migration's spec.
pub async fn patch_spec(api: &Api<GpuPoolMigration>, name: &str, spec: Value) -> anyhow::Result<()> {
    api.patch(name, &PatchParams::default(), &Patch::Merge(json!({"spec": spec}))).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(rv: u64, gpus: u32) -> Update {
        let n: Node = serde_json::from_value(json!({
            "metadata": {"name": "n0", "resourceVersion": rv.to_string(), "labels": {"pool": "p"}},
            "status": {"allocatable": {NVIDIA_GPU_RESOURCE: gpus.to_string()}},
        }))
        .unwrap();
        Update::Node(Box::new(n), true)
    }

    fn slice(rv: u64, devices: usize) -> Update {
        let devices: Vec<Value> = (0..devices).map(|i| json!({"name": format!("gpu-{i}")})).collect();
        let s: ResourceSlice = serde_json::from_value(json!({
            "metadata": {"name": "n0-slice", "resourceVersion": rv.to_string()},
            "spec": {"driver": "d", "nodeName": "n0", "pool": {"name": "n0", "generation": 1, "resourceSliceCount": 1},
                     "devices": devices},
        }))
        .unwrap();
        Update::Slice(Box::new(s), true)
    }

    /// Applies `updates` in the order the sampler receives them, checking after each.
    fn overlaps(updates: Vec<Update>) -> Vec<(String, i64, usize)> {
        let (mut view, out) = (View::default(), Mutex::new(Samples::default()));
        for u in updates {
            view.apply(u, "apps", &out);
            view.check("p", NVIDIA_GPU_RESOURCE, &out);
        }
        out.into_inner().unwrap().overlaps
    }

    #[test]
    fn an_overlap_counts_only_where_the_versions_held_at_one_instant() {
        let both = vec![("n0".to_owned(), 4, 4)];
        // (case, updates as received, overlaps left)
        let cases = [
            // The plugin left (rv 3) before the driver's devices came (rv 5), and the node watch
            // delivered it last: never both at once.
            (
                "the node's change arrives late",
                vec![node(1, 4), slice(2, 0), slice(5, 4), node(3, 0)],
                vec![],
            ),
            (
                "both at once, then the plugin leaves",
                vec![node(1, 4), slice(2, 0), slice(5, 4), node(7, 0)],
                both.clone(),
            ),
            ("both at once, never resolved", vec![node(1, 4), slice(5, 4)], both.clone()),
            // A heartbeat (rv 3, GPUs still there) is a new version that still overlaps.
            (
                "a new node version that still serves",
                vec![node(1, 4), slice(5, 4), node(3, 4), node(9, 0)],
                both,
            ),
            (
                "in order: the plugin leaves first",
                vec![node(1, 4), slice(2, 0), node(3, 0), slice(5, 4)],
                vec![],
            ),
        ];
        for (case, updates, want) in cases {
            assert_eq!(overlaps(updates), want, "{case}");
        }
    }
}
