//! The driver agent as a DRA kubelet plugin, driven by the kubelet's own code on the real control
//! plane: the agent's devices stay tainted, and a plain extended-resource pod unbound, until the Go
//! harness (`e2e/kubeletplugin`: the kubelet's plugin manager and DRA manager) has registered the
//! agent through its registration socket; then the real scheduler allocates a claim for the pod
//! from the slices our agent publishes, and the harness prepares the pod's claim, as the kubelet
//! does before starting the pod. The agent is then killed and restarted, prepared
//! again (same CDI ids, answered from its checkpoint) and unprepared (CDI spec gone).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceSlice};
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::{Api, Client, ResourceExt};
use serde_json::{Value, json};
use switchyard_e2e::cluster::{self, unique};
use switchyard_e2e::locks;
use switchyard_e2e::sim::{GpuLayout, SimConfig, SimNode, Simulator};
use switchyard_e2e::wait;
use switchyard_operator::well_known::TAINT_KEY_PLUGIN_NOT_REGISTERED;

const SCHEDULING: Duration = Duration::from_secs(60);

/// The harness binary: `SWITCHYARD_KUBELETPLUGIN_BIN` (set by `e2e/hack/run-e2e.sh`), else built
/// (or taken from the cache) by `e2e/hack/build-kubeletplugin.sh`.
fn harness_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("SWITCHYARD_KUBELETPLUGIN_BIN") {
        return PathBuf::from(p);
    }
    let out = std::process::Command::new("bash")
        .arg(cluster::repo_root().join("e2e/hack/build-kubeletplugin.sh"))
        .stderr(Stdio::inherit())
        .output()
        .expect("run build-kubeletplugin.sh");
    assert!(out.status.success(), "build-kubeletplugin.sh failed");
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}

/// One node's agent, run as a process with its own kubelet root and CDI dir.
struct Agent {
    dir: PathBuf,
    node: String,
    driver: String,
    child: Option<tokio::process::Child>,
    starts: u32,
}

impl Agent {
    fn kubelet_root(&self) -> PathBuf {
        self.dir.join("kubelet")
    }

    fn cdi_dir(&self) -> PathBuf {
        self.dir.join("cdi")
    }

    fn registration_socket(&self) -> PathBuf {
        self.kubelet_root().join("plugins_registry").join(format!("{}-reg.sock", self.driver))
    }

    fn spec_path(&self, claim_uid: &str) -> PathBuf {
        self.cdi_dir().join(format!("{}-{claim_uid}.json", self.driver.replace('.', "-")))
    }

    fn start(&mut self) -> anyhow::Result<()> {
        self.starts += 1;
        let log = std::fs::File::create(self.dir.join(format!("agent-{}.log", self.starts)))?;
        let child = tokio::process::Command::new(cluster::agent_bin())
            .env("KUBECONFIG", cluster::kubeconfig())
            .env("RUST_LOG", "info")
            .arg("--node-name")
            .arg(&self.node)
            .arg("--driver-name")
            .arg(&self.driver)
            .args(["--inventory", "simulated", "--sim-config"])
            .arg(self.dir.join("inventory.yaml"))
            .args(["--listen", "127.0.0.1:0", "--kubelet-plugin", "--kubelet-root"])
            .arg(self.kubelet_root())
            .arg("--cdi-dir")
            .arg(self.cdi_dir())
            .stdout(Stdio::null())
            .stderr(log)
            .kill_on_drop(true)
            .spawn()?;
        self.child = Some(child);
        Ok(())
    }

    /// SIGKILL, as a crash or an OOM kill: nothing is cleaned up.
    async fn kill(&mut self) -> anyhow::Result<()> {
        if let Some(mut c) = self.child.take() {
            c.kill().await?;
        }
        Ok(())
    }

    /// SIGTERM, as the kubelet stops a container, and wait for the exit.
    async fn terminate(&mut self) -> anyhow::Result<std::process::ExitStatus> {
        let mut c = self.child.take().ok_or_else(|| anyhow::anyhow!("agent not running"))?;
        let pid = c.id().ok_or_else(|| anyhow::anyhow!("agent already exited"))?;
        std::process::Command::new("kill").arg("-TERM").arg(pid.to_string()).status()?;
        Ok(tokio::time::timeout(Duration::from_secs(40), c.wait()).await??)
    }

    /// The harness, as the kubelet would run the operation for `pod`; its JSON answer.
    async fn kubelet(&self, op: &str, pod: &str, state_dir: &Path) -> anyhow::Result<Value> {
        std::fs::create_dir_all(state_dir)?;
        let out = tokio::process::Command::new(harness_bin())
            .arg("--kubeconfig")
            .arg(cluster::kubeconfig())
            .arg("--node")
            .arg(&self.node)
            .arg("--registry-dir")
            .arg(self.kubelet_root().join("plugins_registry"))
            .arg("--state-dir")
            .arg(state_dir)
            .arg("--driver")
            .arg(&self.driver)
            .arg("--pod")
            .arg(pod)
            .arg(op)
            .output()
            .await?;
        let stderr = String::from_utf8_lossy(&out.stderr);
        std::fs::write(self.dir.join(format!("harness-{op}-{}.log", self.starts)), stderr.as_bytes())?;
        anyhow::ensure!(out.status.success(), "harness {op} failed: {stderr}");
        Ok(serde_json::from_slice(&out.stdout)?)
    }
}

#[tokio::test]
async fn the_kubelets_dra_code_prepares_and_unprepares_through_our_plugin() -> anyhow::Result<()> {
    let _cluster = locks::cluster_shared().await?;
    let client = cluster::client().await?;
    let id = unique("kplug");
    let sim = Simulator::start(client.clone(), SimConfig::new(id.clone())).await?;
    let dir = std::env::temp_dir().join(format!("sy-e2e-{id}"));
    std::fs::create_dir_all(&dir)?;
    let mut agent = Agent {
        dir: dir.clone(),
        node: format!("{id}-n0"),
        driver: format!("gpu.{id}.example.com"),
        child: None,
        starts: 0,
    };
    let result = scenario(&client, &sim, &id, &mut agent).await;

    // Cleanup whatever happened; keep the logs of a failure.
    let _ = agent.kill().await;
    let dp = DeleteParams::default();
    let _ = Api::<Namespace>::all(client.clone()).delete(&id, &dp).await;
    let _ = Api::<DeviceClass>::all(client.clone()).delete(&format!("{id}.example.com"), &dp).await;
    sim.shutdown().await?;
    match &result {
        Ok(()) => std::fs::remove_dir_all(&dir)?,
        Err(_) => eprintln!("agent and harness logs are in {}", dir.display()),
    }
    result
}

async fn scenario(client: &Client, sim: &Simulator, id: &str, agent: &mut Agent) -> anyhow::Result<()> {
    let layout = GpuLayout::gpus(2);
    let node = sim
        .add_node(SimNode { name: agent.node.clone(), labels: BTreeMap::new(), layout: layout.clone() })
        .await?;
    let inventory = layout.inventory(&agent.node);
    std::fs::write(agent.dir.join("inventory.yaml"), serde_yaml::to_string(&inventory)?)?;
    let resource = format!("{id}.example.com/gpu");
    let class: DeviceClass = serde_json::from_value(json!({
        "metadata": {"name": format!("{id}.example.com")},
        "spec": {
            "selectors": [{"cel": {"expression": format!("device.driver == '{}'", agent.driver)}}],
            "extendedResourceName": resource,
        }
    }))?;
    Api::<DeviceClass>::all(client.clone()).create(&PostParams::default(), &class).await?;
    cluster::create_namespace(client, id).await?;

    // Our agent publishes the node's slices and serves the kubelet plugin.
    agent.start()?;
    let slices: Api<ResourceSlice> = Api::all(client.clone());
    let driver = agent.driver.clone();
    wait::until("the agent's ResourceSlices", SCHEDULING, || {
        let (slices, driver) = (slices.clone(), driver.clone());
        async move {
            let list = slices.list(&ListParams::default()).await?;
            Ok(list
                .items
                .iter()
                .any(|s| s.spec.driver == driver && s.spec.devices.as_ref().is_some_and(|d| !d.is_empty()))
                .then_some(()))
        }
    })
    .await?;

    // The real scheduler allocates a claim for a plain `limits: {<resource>: 1}` pod.
    let pods: Api<Pod> = Api::namespaced(client.clone(), id);
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "cuda"},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node.name_any()},
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "cuda", "image": "registry.k8s.io/pause:3.10",
                            "resources": {"limits": {&resource: "1"}}}],
        }
    }))?;
    pods.create(&PostParams::default(), &pod).await?;
    // Until the kubelet has registered the plugin, every device carries the agent's
    // not-registered taint, and the scheduler allocates none of them: the pod stays unbound.
    let key = format!("{}/{TAINT_KEY_PLUGIN_NOT_REGISTERED}", agent.driver);
    let taints: Vec<(String, Option<String>)> = slices
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .filter(|s| s.spec.driver == agent.driver)
        .flat_map(|s| s.spec.devices.iter().flatten())
        .map(|d| {
            let t = d.taints.iter().flatten().find(|t| t.key == key);
            (d.name.clone(), t.map(|t| format!("{}={}", t.effect, t.value.clone().unwrap_or_default())))
        })
        .collect();
    assert!(!taints.is_empty());
    for (device, taint) in &taints {
        assert_eq!(taint.as_deref(), Some("NoSchedule=pending"), "{device}: {taints:?}");
    }
    wait::holds_for(
        "the pod to stay unbound while the plugin is not registered",
        Duration::from_secs(3),
        || {
            let pods = pods.clone();
            async move {
                let p = pods.get("cuda").await?;
                let bound = p.spec.as_ref().and_then(|s| s.node_name.clone());
                anyhow::ensure!(
                    bound.is_none(),
                    "pod cuda was bound to {bound:?} before the kubelet registered the plugin"
                );
                Ok(())
            }
        },
    )
    .await?;
    // The kubelet's plugin manager registers it (and waits until the agent has lifted the taint).
    let registered = agent.kubelet("register", "", &agent.dir.join("kubelet-state-0")).await?;
    assert_eq!(registered["registered"], true);
    let pod = wait::until("pod cuda to be bound with its claim", SCHEDULING, || {
        let pods = pods.clone();
        async move {
            let p = pods.get("cuda").await?;
            let bound = p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_some();
            let claimed = p.status.as_ref().and_then(|s| s.extended_resource_claim_status.as_ref()).is_some();
            Ok((bound && claimed).then_some(p))
        }
    })
    .await?;
    let claim_name = pod
        .status
        .as_ref()
        .unwrap()
        .extended_resource_claim_status
        .as_ref()
        .unwrap()
        .resource_claim_name
        .clone();
    let claim = Api::<ResourceClaim>::namespaced(client.clone(), id).get(&claim_name).await?;
    let claim_uid = claim.uid().unwrap();
    let results = claim
        .status
        .as_ref()
        .and_then(|s| s.allocation.as_ref())
        .and_then(|a| a.devices.as_ref())
        .and_then(|d| d.results.clone())
        .unwrap_or_default();
    assert_eq!(results.len(), 1, "{results:?}");
    let device = results[0].device.clone();
    assert_eq!(results[0].pool, agent.node);
    let want_id = format!("{}/gpu={claim_uid}-{device}", agent.driver);

    // The kubelet prepares the claim before starting the pod.
    let pod_ref = format!("{id}/cuda");
    let first = agent.kubelet("prepare", &pod_ref, &agent.dir.join("kubelet-state-1")).await?;
    assert_eq!(first["registered"], true);
    assert_eq!(first["containers"]["cuda"], json!([want_id]), "{first}");
    assert_eq!(first["claims"][0]["uid"], claim_uid.as_str());
    assert_eq!(first["claims"][0]["devices"][0]["pool"], agent.node.as_str());
    assert_eq!(first["claims"][0]["devices"][0]["device"], device.as_str());

    let spec: Value = serde_json::from_slice(&std::fs::read(agent.spec_path(&claim_uid))?)?;
    assert_eq!(spec["kind"], format!("{}/gpu", agent.driver));
    assert_eq!(spec["devices"][0]["name"], format!("{claim_uid}-{device}"));
    let gpu = inventory
        .gpus
        .iter()
        .find(|g| g.device_name() == device)
        .expect("allocated device is in the inventory");
    assert_eq!(spec["containerEdits"]["env"], json!([format!("NVIDIA_VISIBLE_DEVICES={}", gpu.uuid)]));
    // Simulated GPUs have no host nodes: the spec describes each one (NVIDIA's char major 195).
    assert_eq!(
        spec["devices"][0]["containerEdits"]["deviceNodes"],
        json!([{"path": format!("/dev/nvidia{}", gpu.minor), "type": "c", "major": 195, "minor": gpu.minor}])
    );

    // The agent crashes (sockets left behind) and comes back. A kubelet without its own state
    // asks again and gets the same answer, from the agent's checkpoint.
    agent.kill().await?;
    assert!(agent.registration_socket().exists(), "a killed agent leaves its socket");
    agent.start()?;
    let state2 = agent.dir.join("kubelet-state-2");
    let again = agent.kubelet("prepare", &pod_ref, &state2).await?;
    assert_eq!(again["containers"], first["containers"]);
    assert_eq!(again["claims"], first["claims"]);
    assert!(agent.spec_path(&claim_uid).exists());

    // The pod ends: the kubelet unprepares, and the spec is gone.
    let done = agent.kubelet("unprepare", &pod_ref, &state2).await?;
    assert_eq!(done["op"], "unprepare");
    assert!(!agent.spec_path(&claim_uid).exists(), "the CDI spec is removed on unprepare");
    let checkpoint: Value = serde_json::from_slice(&std::fs::read(
        agent.kubelet_root().join("plugins").join(&agent.driver).join("checkpoint.json"),
    )?)?;
    assert_eq!(checkpoint["claims"], json!({}));

    // A clean stop with nothing prepared exits at once and removes both sockets.
    let status = agent.terminate().await?;
    assert!(status.success(), "agent exit status {status}");
    assert!(!agent.registration_socket().exists());
    assert!(!agent.kubelet_root().join("plugins").join(&agent.driver).join("dra.sock").exists());
    Ok(())
}
