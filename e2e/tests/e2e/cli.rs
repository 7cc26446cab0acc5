//! The `switchyard` CLI against the real control plane: `plan` and `inventory` on a cluster seeded
//! with one object of every kind the inventory looks for, the operator's InventoryFindings
//! condition and event, `status` following a real migration to the end, and the ResourceQuota
//! double charge the inventory warns about, observed on the real quota controller.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use futures::FutureExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Node, Pod, ResourceQuota};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::resource::v1::DeviceClass;
use kube::Api;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use switchyard_e2e::cluster::{self, repo_root};
use switchyard_e2e::locks;
use switchyard_e2e::pool::Pool;
use switchyard_e2e::wait;
use switchyard_operator::api::v1alpha1::Phase;

struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

/// Runs the CLI with the shared cluster's kubeconfig.
async fn switchyard(args: &[&str]) -> anyhow::Result<Run> {
    let out = tokio::process::Command::new(cluster::cli_bin())
        .arg("--kubeconfig")
        .arg(cluster::kubeconfig())
        .args(args)
        .stdin(Stdio::null())
        .output()
        .await?;
    Ok(Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    })
}

fn kubectl(args: &[&str], stdin: Option<&str>) -> anyhow::Result<()> {
    use std::io::Write as _;
    let mut child = std::process::Command::new(cluster::bin_dir().join("kubectl"))
        .arg("--kubeconfig")
        .arg(cluster::kubeconfig())
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    if let (Some(text), Some(mut pipe)) = (stdin, child.stdin.take()) {
        pipe.write_all(text.as_bytes())?;
    }
    drop(child.stdin.take());
    let out = child.wait_with_output()?;
    anyhow::ensure!(
        out.status.success(),
        "kubectl {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

fn apply(objects: &[Value]) -> anyhow::Result<()> {
    let list = json!({"apiVersion": "v1", "kind": "List", "items": objects});
    kubectl(&["apply", "--server-side", "-f", "-"], Some(&list.to_string()))
}

fn fixture(name: &str) -> PathBuf {
    repo_root().join("e2e/tests/fixtures").join(name)
}

fn write_manifest(dir: &Path, name: &str, gpm: &impl serde::Serialize) -> anyhow::Result<PathBuf> {
    std::fs::create_dir_all(dir)?;
    let path = dir.join(name);
    std::fs::write(&path, serde_yaml::to_string(gpm)?)?;
    Ok(path)
}

/// Findings about this scenario's objects (the shared cluster may hold others), by kind and
/// object, with severity and message.
fn findings_for(report: &Value, id: &str) -> BTreeMap<(String, String), (String, String)> {
    report["findings"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|f| f["object"].as_str().is_some_and(|o| o.contains(id)))
        .map(|f| {
            (
                (
                    f["kind"].as_str().unwrap_or_default().to_owned(),
                    f["object"].as_str().unwrap_or_default().to_owned(),
                ),
                (
                    f["severity"].as_str().unwrap_or_default().to_owned(),
                    f["message"].as_str().unwrap_or_default().to_owned(),
                ),
            )
        })
        .collect()
}

/// One object of every kind the inventory reads, all named after the pool.
fn seed(pool: &Pool, quota_ns: &str) -> Vec<Value> {
    let (id, ns) = (pool.id.as_str(), pool.apps_ns.as_str());
    let class = format!("{id}.gpu");
    vec![
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": quota_ns,
            "labels": {"e2e.switchyard.dev/scenario": "true"}}}),
        json!({"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "gpus", "namespace": ns},
            "spec": {"hard": {"requests.nvidia.com/gpu": "16", format!("{class}.deviceclass.resource.k8s.io/devices"): "16"}}}),
        json!({"apiVersion": "v1", "kind": "LimitRange", "metadata": {"name": "gpu-default", "namespace": quota_ns},
            "spec": {"limits": [{"type": "Container", "default": {"nvidia.com/gpu": "1"}}]}}),
        json!({"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler", "metadata": {"name": "by-gpu", "namespace": ns},
            "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"}, "maxReplicas": 4,
                "metrics": [{"type": "External", "external": {
                    "metric": {"name": "kube_node_status_allocatable", "selector": {"matchLabels": {"resource": "nvidia_com_gpu"}}},
                    "target": {"type": "Value", "value": "8"}}}]}}),
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "gpu-dashboard", "namespace": ns},
            "data": {"gpus.json": "{\"expr\": \"sum(kube_node_status_allocatable{resource=\\\"nvidia_com_gpu\\\"})\"}"}}),
        json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "cluster-autoscaler", "namespace": ns},
            "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "cluster-autoscaler"}},
                "template": {"metadata": {"labels": {"app": "cluster-autoscaler"}}, "spec": {
                    "nodeSelector": {"e2e.switchyard.dev/no-such-node": "true"},
                    "containers": [{"name": "cluster-autoscaler",
                        "image": "registry.k8s.io/autoscaling/cluster-autoscaler:v1.33.1",
                        "args": ["--cloud-provider=aws", "--node-group-auto-discovery=asg:tag=k8s.io/cluster-autoscaler/enabled"]}]}}}}),
        json!({"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "ClusterQueue", "metadata": {"name": format!("{id}-cq")},
            "spec": {"resourceGroups": [{"coveredResources": ["cpu", "nvidia.com/gpu", class],
                "flavors": [{"name": format!("{id}-rf"), "resources": [
                    {"name": "cpu", "nominalQuota": 64}, {"name": "nvidia.com/gpu", "nominalQuota": 12}, {"name": class, "nominalQuota": 12}]}]}]}}),
        json!({"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "ResourceFlavor", "metadata": {"name": format!("{id}-rf")},
            "spec": {"nodeLabels": {"pool": id}}}),
        json!({"apiVersion": "karpenter.sh/v1", "kind": "NodePool", "metadata": {"name": format!("{id}-np")},
            "spec": {"template": {"metadata": {"labels": {"pool": id}}, "spec": {"nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "gpu"}}}}}),
        json!({"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": format!("{id}.vendor"), "labels": {"pool": id}},
            "spec": {"extendedResourceName": "nvidia.com/gpu",
                "selectors": [{"cel": {"expression": "device.driver == 'vendor.example.com'"}}]}}),
    ]
}

/// Removes what `seed` created outside the pool's namespaces (the pool's cleanup removes those,
/// and its DeviceClasses).
fn unseed(quota_ns: &str) {
    let _ = kubectl(&["delete", "namespace", quota_ns, "--ignore-not-found", "--wait=false"], None);
    let _ = kubectl(
        &["delete", "-f", &fixture("inventory-crds.yaml").to_string_lossy(), "--ignore-not-found"],
        None,
    );
}

#[tokio::test]
async fn plan_inventory_and_status_against_a_seeded_cluster() -> anyhow::Result<()> {
    let _cluster = locks::cluster_shared().await?;
    // The pool and a vendor DeviceClass use nvidia.com/gpu itself.
    let _nvidia = locks::nvidia_gpu().await?;
    kubectl(&["apply", "--server-side", "-f", &fixture("inventory-crds.yaml").to_string_lossy()], None)?;
    kubectl(
        &[
            "wait",
            "--for=condition=Established",
            "--timeout=60s",
            "crd/clusterqueues.kueue.x-k8s.io",
            "crd/resourceflavors.kueue.x-k8s.io",
            "crd/nodepools.karpenter.sh",
        ],
        None,
    )?;
    let pool = Pool::new("cli", 3, 4).await?;
    let quota_ns = format!("{}-quota", pool.id);
    let outcome =
        std::panic::AssertUnwindSafe(pool.run(async |pool| scenario(pool).await)).catch_unwind().await;
    unseed(&quota_ns);
    match outcome {
        Ok(result) => result,
        Err(panic) => std::panic::resume_unwind(panic),
    }
}

async fn scenario(pool: &mut Pool) -> anyhow::Result<()> {
    let client = pool.client.clone();
    let (id, ns) = (pool.id.clone(), pool.apps_ns.clone());
    let quota_ns = format!("{id}-quota");
    let node_group = format!("eks.amazonaws.com/nodegroup={id}-gpu");
    let nodes: Api<Node> = Api::all(client.clone());
    for n in &pool.nodes {
        let patch = json!({"metadata": {"labels": {"eks.amazonaws.com/nodegroup": format!("{id}-gpu")}}});
        nodes.patch(n, &PatchParams::default(), &Patch::Merge(&patch)).await?;
    }

    // Workloads: GPU pods behind a PDB that allows no disruption, a bare GPU pod with emptyDir
    // data, and pods without GPUs.
    pool.deployment("trainer", 2, 1).await?;
    pool.pdb("trainer", "trainer", 2).await?;
    pool.deployment("web", 2, 0).await?;
    let bare: Pod = serde_json::from_value(json!({
        "metadata": {"name": "notebook", "labels": {"app": "notebook"}},
        "spec": {"nodeSelector": {"pool": id}, "terminationGracePeriodSeconds": 1,
            "volumes": [{"name": "scratch", "emptyDir": {}}],
            "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10",
                "resources": {"limits": {"nvidia.com/gpu": "1"}}, "volumeMounts": [{"name": "scratch", "mountPath": "/scratch"}]}]}
    }))?;
    Api::<Pod>::namespaced(client.clone(), &ns).create(&PostParams::default(), &bare).await?;
    pool.wait_running(5).await?;
    apply(&seed(pool, &quota_ns))?;
    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(client.clone(), &ns);
    wait::until("the PDB to allow no disruption", Duration::from_secs(60), || {
        let pdbs = pdbs.clone();
        async move {
            let p = pdbs.get("trainer").await?;
            Ok(p.status
                .filter(|s| s.current_healthy == Some(2) && s.disruptions_allowed.unwrap_or(0) == 0)
                .map(|_| ()))
        }
    })
    .await?;

    let name = id.clone();
    let gpm = pool.migration(&name, json!({}))?;
    let manifest = write_manifest(pool.log_dir(), "migration.yaml", &gpm)?;
    let manifest_arg = manifest.to_string_lossy().into_owned();

    // plan -f, JSON.
    let run = switchyard(&["plan", "-f", &manifest_arg, "-o", "json"]).await?;
    assert_eq!(run.code, 2, "a critical finding blocks: {}\n{}", run.stderr, run.stdout);
    let plan: Value = serde_json::from_str(&run.stdout)?;
    assert_eq!(plan["exists"], false);
    assert_eq!(plan["prerequisites"]["met"], true, "{}", plan["prerequisites"]);
    // This control plane runs its components as processes, not pods. Its scheduler runs with
    // coordinated leader election, so its LeaseCandidate in kube-system shows the version it runs
    // (binary 1.37.2, emulation 1.37.0: the binary's patch counts); its controller manager runs
    // without leader election and, as on a managed control plane, shows none.
    let control_plane: Vec<&str> =
        plan["prerequisites"]["controlPlane"].as_array().unwrap().iter().filter_map(Value::as_str).collect();
    assert_eq!(
        control_plane,
        [
            "kube-apiserver v1.37.2",
            "kube-controller-manager unknown (no pod or LeaseCandidate in kube-system shows it; a managed control plane hides it)",
            "kube-scheduler 1.37.2 (its LeaseCandidate)",
        ]
    );
    let planned: Vec<(&str, u64, u64, &str)> = plan["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| {
            (
                n["action"].as_str().unwrap(),
                n["order"].as_u64().unwrap(),
                n["wave"].as_u64().unwrap(),
                n["name"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(planned.len(), 3, "{planned:?}");
    for (i, (action, order, wave, _)) in planned.iter().enumerate() {
        assert_eq!(
            (*action, *order, *wave),
            ("Moves", i as u64 + 1, i as u64 + 1),
            "maxUnavailable 1: a wave per node"
        );
    }
    assert!(plan["nodes"].as_array().unwrap().iter().all(|n| n["gpus"] == 4));
    let evicted: BTreeMap<String, (bool, Vec<Value>)> = plan["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|n| n["evict"].as_array().unwrap().clone())
        .map(|p| {
            (
                p["name"].as_str().unwrap().to_owned(),
                (p["usesGpu"] == true, p["flags"].as_array().unwrap().clone()),
            )
        })
        .collect();
    assert_eq!(evicted.len(), 3, "two trainers and the notebook, not the web pods: {evicted:?}");
    assert_eq!(
        evicted["notebook"],
        (true, vec![json!({"flag": "noController"}), json!({"flag": "emptyDir", "deleted": false})])
    );
    for (pod, (gpu, flags)) in evicted.iter().filter(|(k, _)| k.starts_with("trainer")) {
        assert!(gpu, "{pod}");
        assert_eq!(flags, &vec![json!({"flag": "pdbBlocks", "pdb": format!("{ns}/trainer")})], "{pod}");
    }
    let stay: u64 = plan["nodes"].as_array().unwrap().iter().map(|n| n["stay"].as_u64().unwrap()).sum();
    assert_eq!(stay, 2, "the two web pods stay");
    let summary = &plan["summary"];
    assert_eq!(
        (
            &summary["podsToEvict"],
            &summary["gpuPodsToEvict"],
            &summary["podsBlockedByPdb"],
            &summary["barePods"],
            &summary["emptyDirPods"]
        ),
        (&json!(3), &json!(3), &json!(2), &json!(1), &json!(1))
    );
    assert_eq!(plan["deviceClasses"][0]["action"], "Create");
    assert_eq!(plan["deviceClasses"][0]["effective"], true, "{}", plan["deviceClasses"]);
    let placement: Vec<&str> =
        plan["placement"].as_array().unwrap().iter().map(|p| p["action"].as_str().unwrap()).collect();
    assert_eq!(
        placement,
        ["AddNodeAffinity", "AlreadyPlaced"],
        "device plugin gets the affinity; the driver has it"
    );

    let found = findings_for(&plan["inventory"], &id);
    let sev = |kind: &str, object: &str| -> (String, String) {
        found
            .get(&(kind.to_owned(), object.to_owned()))
            .cloned()
            .unwrap_or_else(|| panic!("no {kind} {object} in {found:#?}"))
    };
    let quota = sev("ResourceQuota", &format!("{ns}/gpus"));
    assert_eq!(quota.0, "Warning");
    assert!(quota.1.contains("twice"), "{}", quota.1);
    assert_eq!(sev("LimitRange", &format!("{quota_ns}/gpu-default")).0, "Warning");
    assert_eq!(sev("HorizontalPodAutoscaler", &format!("{ns}/by-gpu")).0, "Warning");
    assert_eq!(sev("ConfigMap", &format!("{ns}/gpu-dashboard")).0, "Warning");
    let ca = sev("ClusterAutoscaler", &format!("{ns}/cluster-autoscaler"));
    assert_eq!(ca.0, "Critical");
    assert!(ca.1.contains(&node_group), "{}", ca.1);
    let cq = sev("ClusterQueue", &format!("{id}-cq"));
    assert_eq!(cq.0, "Warning");
    assert!(cq.1.contains("again"), "{}", cq.1);
    assert_eq!(sev("ResourceFlavor", &format!("{id}-rf")).0, "Info");
    assert_eq!(sev("NodePool", &format!("{id}-np")).0, "Warning");
    let vendor = sev("DeviceClass", &format!("{id}.vendor"));
    assert_eq!(vendor.0, "Warning");
    assert!(vendor.1.contains("take the name over"), "{}", vendor.1);
    assert_eq!(found.len(), 9, "{found:#?}");
    assert!(
        plan["blockers"]
            .as_array()
            .unwrap()
            .iter()
            .any(|b| b.as_str().unwrap().contains("critical inventory finding"))
    );

    let blockers: Vec<&str> =
        plan["blockers"].as_array().unwrap().iter().map(|b| b.as_str().unwrap()).collect();
    assert!(
        blockers.iter().any(|b| b.contains(&format!("{ns}/notebook")) && b.contains("drain.force")),
        "the bare notebook blocks its node's drain, as in the operator: {blockers:?}"
    );

    // plan -f, for people.
    let human = switchyard(&["plan", "-f", &manifest_arg]).await?;
    assert_eq!(human.code, 2);
    for want in [
        "NODES  3 selected, 3 to move in 3 wave(s), 12 GPU(s)",
        "  control plane: kube-apiserver v1.37.2; kube-controller-manager unknown",
        &format!("PDB {ns}/trainer allows no disruption now"),
        "no controller: nothing recreates it",
        &format!("create  {id}.gpu"),
        "CRITICAL  ClusterAutoscaler",
        "BLOCKED:",
    ] {
        assert!(human.stdout.contains(want), "missing {want:?} in:\n{}", human.stdout);
    }

    // inventory on its own, by resource name.
    let inv = switchyard(&[
        "inventory",
        "--resource",
        "nvidia.com/gpu",
        "--device-class",
        &format!("{id}.gpu"),
        "-o",
        "json",
    ])
    .await?;
    assert_eq!(inv.code, 2, "{}", inv.stderr);
    let inv: Value = serde_json::from_str(&inv.stdout)?;
    let inv_found = findings_for(&inv, &id);
    assert_eq!(
        inv_found
            .get(&("ClusterAutoscaler".into(), format!("{ns}/cluster-autoscaler")))
            .map(|f| f.0.as_str()),
        Some("Critical")
    );
    assert!(inv_found.contains_key(&("ResourceQuota".into(), format!("{ns}/gpus"))));
    assert!(
        inv_found.contains_key(&("ResourceFlavor".into(), format!("{id}-rf"))),
        "pool nodes found by their allocatable GPUs"
    );

    // The same tool as a kubectl plugin: kubectl finds kubectl-switchyard on PATH.
    let plugin_dir = cluster::cli_bin().parent().expect("a bin dir").to_path_buf();
    assert!(
        plugin_dir.join("kubectl-switchyard").is_file(),
        "kubectl-switchyard is built next to switchyard"
    );
    let path = format!("{}:{}", plugin_dir.display(), std::env::var("PATH").unwrap_or_default());
    let via_kubectl = tokio::process::Command::new(cluster::bin_dir().join("kubectl"))
        .args(["switchyard", "plan", "-f", &manifest_arg, "-o", "json"])
        .env("PATH", path)
        .env("KUBECONFIG", cluster::kubeconfig())
        .stdin(Stdio::null())
        .output()
        .await?;
    assert_eq!(via_kubectl.status.code(), Some(2), "{}", String::from_utf8_lossy(&via_kubectl.stderr));
    let via_kubectl: Value = serde_json::from_slice(&via_kubectl.stdout)?;
    assert_eq!(via_kubectl["nodes"], plan["nodes"], "kubectl switchyard plan is the same plan");

    // Bad input: the API server's CEL message names the field; nothing is created.
    let mut bad = gpm.clone();
    bad.spec.strategy.max_unavailable =
        k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::String("0%".into());
    let bad_path = write_manifest(pool.log_dir(), "bad.yaml", &bad)?;
    let rejected = switchyard(&["plan", "-f", &bad_path.to_string_lossy()]).await?;
    assert_eq!(rejected.code, 1);
    assert!(rejected.stderr.contains("spec.strategy.maxUnavailable"), "{}", rejected.stderr);
    assert!(pool.migrations().get_opt(&name).await?.is_none(), "plan never creates the migration");

    // The migration itself: let the drain through (the PDB allows one, the bare notebook and its
    // scratch data may go), then follow it with `status`.
    pdbs.patch("trainer", &PatchParams::default(), &Patch::Merge(&json!({"spec": {"minAvailable": 1}})))
        .await?;
    let gpm =
        pool.migration(&name, json!({"strategy": {"drain": {"deleteEmptyDirData": true, "force": true}}}))?;
    pool.start_operator()?;
    pool.migrations().create(&PostParams::default(), &gpm).await?;
    let status = switchyard(&["status", &name, "--view", "lines", "--timeout", "300"]).await?;
    assert_eq!(
        status.code, 0,
        "status exits 0 when the migration completes:\n{}\n{}",
        status.stdout, status.stderr
    );
    assert!(status.stdout.contains("Draining"), "{}", status.stdout);
    assert!(status.stdout.contains("Completed"), "{}", status.stdout);
    let done = pool.wait_phase(&name, Phase::Completed, Duration::from_secs(10)).await?;

    // The operator's own inventory, for GitOps users: a condition and an event.
    let cond = done
        .status
        .as_ref()
        .unwrap()
        .conditions
        .iter()
        .find(|c| c.type_ == "InventoryFindings")
        .cloned()
        .unwrap();
    assert_eq!((cond.status.as_str(), cond.reason.as_str()), ("True", "Findings"), "{}", cond.message);
    // The five most severe findings are listed; on a cluster with nothing else seeded, this
    // scenario's cluster-autoscaler is the critical one.
    assert!(cond.message.lines().next().unwrap().contains(" critical"), "{}", cond.message);
    assert!(cond.message.contains("critical ClusterAutoscaler "), "{}", cond.message);
    assert!(cond.message.contains(&format!("switchyard inventory --migration {name}")), "{}", cond.message);
    assert!(!cond.message.contains("ConfigMap"), "the operator does not read ConfigMaps: {}", cond.message);
    let events: Api<Event> = Api::namespaced(client.clone(), "default");
    let ours = events.list(&ListParams::default()).await?.items.into_iter().any(|e| {
        e.reason.as_deref() == Some("InventoryFindings")
            && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name.as_str())
            && e.type_.as_deref() == Some("Warning")
    });
    assert!(ours, "an InventoryFindings Warning event on the migration");

    // The double charge the inventory warned about, on the real quota controller: each GPU pod now
    // on DRA is counted under requests.nvidia.com/gpu and under the class's device quota.
    let quotas: Api<ResourceQuota> = Api::namespaced(client.clone(), &ns);
    let key = format!("{id}.gpu.deviceclass.resource.k8s.io/devices");
    let used = wait::until("the quota to count the generated claims", Duration::from_secs(60), || {
        let (quotas, key) = (quotas.clone(), key.clone());
        async move {
            let q = quotas.get("gpus").await?;
            let used = q.status.and_then(|s| s.used).unwrap_or_default();
            let get = |k: &str| used.get(k).map(|v| v.0.clone()).unwrap_or_default();
            let pair = (get("requests.nvidia.com/gpu"), get(&key));
            Ok((pair.1 == "2").then_some(pair))
        }
    })
    .await?;
    assert_eq!(used, ("2".to_owned(), "2".to_owned()), "two trainer GPUs, charged under both keys");

    // The kube-scheduler v1.37.2 forgets an extended resource name whenever any DeviceClass that
    // carries it is deleted, even one that did not win the name. With the operator stopped, new
    // GPU pods are refused; the operator, once back, sees the peer class gone and re-applies ours,
    // which makes the scheduler map the name again, and new GPU pods are scheduled.
    if let Some(op) = pool.operator.take() {
        op.kill().await?;
    }
    let classes: Api<DeviceClass> = Api::all(client.clone());
    classes.delete(&format!("{id}.vendor"), &Default::default()).await?;
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns);
    deployments
        .patch("trainer", &PatchParams::default(), &Patch::Merge(&json!({"spec": {"replicas": 3}})))
        .await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let stuck =
        wait::until("the third trainer to be refused by the scheduler", Duration::from_secs(60), || {
            let pods = pods.clone();
            async move {
                let list = pods.list(&ListParams::default().labels("app=trainer")).await?;
                Ok(list.items.into_iter().find_map(|p| {
                    let c = p
                        .status?
                        .conditions?
                        .into_iter()
                        .find(|c| c.type_ == "PodScheduled" && c.status == "False")?;
                    Some(c.message.unwrap_or_default())
                }))
            }
        })
        .await?;
    assert!(stuck.contains("Insufficient nvidia.com/gpu"), "{stuck}");
    pool.start_operator()?;
    let ours = format!("{id}.gpu");
    let uid = done.metadata.uid.clone().unwrap_or_default();
    wait::until("the operator to re-apply its DeviceClass", Duration::from_secs(60), || {
        let (classes, ours, want) = (classes.clone(), ours.clone(), format!("{uid};"));
        async move {
            let dc = classes.get(&ours).await?;
            let sync = dc
                .metadata
                .annotations
                .and_then(|a| a.get(switchyard_operator::well_known::ANNOTATION_SCHEDULER_SYNC).cloned());
            Ok((sync.as_deref() == Some(want.as_str())).then_some(()))
        }
    })
    .await?;
    // The scheduler retries a pod it already refused only on events its plugins register for, or
    // at the periodic flush of unschedulable pods (5 minutes); a DeviceClass update is not such an
    // event for NodeResourcesFit. A pod created now is scheduled at once: replace the refused one.
    // (Another scenario's DeviceClass, created meanwhile, is such an event for the DRA plugin: then
    // the refused pod was retried after the re-apply and is bound already.)
    let refused: Vec<String> = pods
        .list(&ListParams::default().labels("app=trainer"))
        .await?
        .items
        .into_iter()
        .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_none())
        .filter_map(|p| p.metadata.name)
        .collect();
    assert!(refused.len() <= 1, "{refused:?}");
    if let Some(p) = refused.first() {
        pods.delete(p, &Default::default()).await?;
    }
    let running = pool.wait_running(5).await?;
    let trainers: Vec<&Pod> = running
        .iter()
        .filter(|p| p.metadata.labels.as_ref().is_some_and(|l| l["app"] == "trainer"))
        .collect();
    assert_eq!(trainers.len(), 3);
    assert!(
        trainers.iter().all(|p| p
            .status
            .as_ref()
            .and_then(|s| s.extended_resource_claim_status.as_ref())
            .is_some()),
        "every trainer runs on a DRA node through a generated claim"
    );

    // plan <name> on the finished migration: every node is done.
    let after = switchyard(&["plan", &name, "-o", "json"]).await?;
    let after: Value = serde_json::from_str(&after.stdout)?;
    assert_eq!(after["exists"], true);
    assert!(after["nodes"].as_array().unwrap().iter().all(|n| n["action"] == "Done"), "{}", after["nodes"]);
    assert_eq!(after["deviceClasses"][0]["action"], "Unchanged");
    Ok(())
}
