//! What users install, checked against the real API server: every object that `kubectl kustomize
//! config/` (with and without the monitoring component) and `helm template` render is applied with
//! server-side dry-run, so schema, defaulting, validation and admission (CEL included) all run. The
//! CRDs and the Namespace are applied for real first, because the dry-run of the objects that
//! depend on them needs them; so are the Prometheus Operator's ServiceMonitor and PrometheusRule
//! CRDs, from its module (`e2e/hack/prometheus-crds.sh`), where the monitoring objects are rendered. Also: kustomize and Helm install the same objects with the same
//! rules, the agent's admission policy really confines it to its own node's ResourceSlices, and the
//! operator's lets it change nothing in a DaemonSet but the backend node affinity.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde::Deserialize;
use serde_json::Value;
use switchyard_e2e::cluster::{self, repo_root, unique};
use switchyard_e2e::locks;

/// The Prometheus Operator's API group, whose CRDs a cluster has only where that operator is
/// installed; the e2e cluster gets them from its module (`e2e/hack/prometheus-crds.sh`).
const MONITORING_GROUP: &str = "monitoring.coreos.com/";
/// The CRDs of that group the monitoring objects use, by their file name's plural.
const MONITORING_CRDS: [&str; 2] = ["servicemonitors", "prometheusrules"];
const AGENT_USER: &str = "system:serviceaccount:switchyard-system:switchyard-driver-agent";
const OPERATOR_USER: &str = "system:serviceaccount:switchyard-system:switchyard-operator";
const FIELD_MANAGER: &str = "switchyard-e2e-manifests";

fn kubectl() -> Command {
    let mut cmd = Command::new(cluster::bin_dir().join("kubectl"));
    cmd.arg("--kubeconfig").arg(cluster::kubeconfig());
    cmd
}

/// Runs `cmd`, feeding `stdin`; returns (success, stdout, stderr).
fn run(mut cmd: Command, stdin: &str) -> (bool, String, String) {
    let mut child = cmd
        .current_dir(repo_root())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    child.stdin.take().expect("piped stdin").write_all(stdin.as_bytes()).expect("write stdin");
    let out = child.wait_with_output().expect("wait");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn run_ok(cmd: Command, stdin: &str) -> String {
    let shown = format!("{cmd:?}");
    let (ok, out, err) = run(cmd, stdin);
    assert!(ok, "{shown} failed:\n{out}{err}");
    out
}

fn helm() -> PathBuf {
    let mut cmd = Command::new("bash");
    cmd.arg(repo_root().join("e2e/hack/build-helm.sh"));
    PathBuf::from(run_ok(cmd, "").trim())
}

fn kustomize(dir: &str) -> Vec<Value> {
    let mut cmd = kubectl();
    cmd.args(["kustomize", dir]);
    parse(&run_ok(cmd, ""))
}

/// The chart with every optional toggle on, and its CRDs.
fn helm_template() -> Vec<Value> {
    let mut cmd = Command::new(helm());
    cmd.args(["template", "switchyard", "config/helm/switchyard", "--namespace", "switchyard-system", "--include-crds"])
        .args(["--set", "serviceMonitor.enabled=true,prometheusRule.enabled=true,dashboard.enabled=true,networkPolicy.enabled=true"]);
    parse(&run_ok(cmd, ""))
}

fn parse(yaml: &str) -> Vec<Value> {
    serde_yaml::Deserializer::from_str(yaml)
        .map(|doc| Value::deserialize(doc).expect("rendered manifests are YAML"))
        .filter(|v| !v.is_null())
        .collect()
}

fn kind(obj: &Value) -> &str {
    obj["kind"].as_str().unwrap_or_default()
}

fn id(obj: &Value) -> String {
    format!(
        "{} {}/{}",
        kind(obj),
        obj["metadata"]["namespace"].as_str().unwrap_or(""),
        obj["metadata"]["name"].as_str().unwrap_or("")
    )
}

fn to_yaml(objs: &[&Value]) -> String {
    objs.iter().map(|o| format!("---\n{}", serde_yaml::to_string(o).expect("serializes"))).collect()
}

/// The Prometheus Operator's ServiceMonitor and PrometheusRule CRDs, as its repository ships them
/// at the version `e2e/hack/prometheus-crds.sh` pins.
fn monitoring_crds() -> Vec<Value> {
    let mut cmd = Command::new("bash");
    cmd.arg(repo_root().join("e2e/hack/prometheus-crds.sh"));
    let dir = PathBuf::from(run_ok(cmd, "").trim());
    let crds: Vec<Value> = MONITORING_CRDS
        .iter()
        .flat_map(|plural| {
            let file = dir.join(format!("monitoring.coreos.com_{plural}.yaml"));
            parse(&std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display())))
        })
        .collect();
    assert_eq!(crds.len(), MONITORING_CRDS.len(), "one CRD per file in {}", dir.display());
    assert!(crds.iter().all(|c| kind(c) == "CustomResourceDefinition"), "{} holds CRDs only", dir.display());
    crds
}

/// Applies the CRDs and Namespaces for real (with the Prometheus Operator's where a monitoring
/// object is among them), then everything else with server-side dry-run: every object, none
/// skipped.
fn dry_run_all(source: &str, mut objs: Vec<Value>) {
    assert!(!objs.is_empty(), "{source} rendered nothing");
    if objs.iter().any(|o| o["apiVersion"].as_str().is_some_and(|v| v.starts_with(MONITORING_GROUP))) {
        objs.extend(monitoring_crds());
    }
    let (setup, checked): (Vec<&Value>, Vec<&Value>) =
        objs.iter().partition(|o| matches!(kind(o), "CustomResourceDefinition" | "Namespace"));
    let mut apply = kubectl();
    apply.args(["apply", "--server-side", "--force-conflicts", "--field-manager", FIELD_MANAGER, "-f", "-"]);
    run_ok(apply, &to_yaml(&setup));
    for o in setup.iter().filter(|o| kind(o) == "CustomResourceDefinition") {
        let mut wait = kubectl();
        wait.args(["wait", "--for=condition=Established", "--timeout=60s"])
            .arg(format!("crd/{}", o["metadata"]["name"].as_str().expect("named")));
        run_ok(wait, "");
    }

    // --force-conflicts: on the shared cluster `make demo` may have applied config/ already under
    // another field manager; ownership conflicts say nothing about whether the manifests are valid.
    let mut dry = kubectl();
    dry.args([
        "apply",
        "--server-side",
        "--force-conflicts",
        "--dry-run=server",
        "--field-manager",
        FIELD_MANAGER,
        "-f",
        "-",
    ]);
    let out = run_ok(dry, &to_yaml(&checked));
    print!("{source}: server-side dry-run of {} objects:\n{out}", checked.len());
    for o in &checked {
        let name = o["metadata"]["name"].as_str().unwrap_or_default();
        assert!(
            out.contains(&format!("/{name} serverside-applied (server dry run)")),
            "{source}: no dry-run result for {}",
            id(o)
        );
    }
}

#[test]
fn kustomize_config_passes_server_side_dry_run() {
    let _cluster = locks::cluster_shared_blocking().expect("the cluster lock");
    dry_run_all("kubectl kustomize config/", kustomize("config/"));
}

/// Names the Prometheus Operator kinds among `objs`, each once: what the dry-run checks of them.
fn monitoring_kinds(objs: &[Value]) -> BTreeSet<&str> {
    objs.iter()
        .filter(|o| o["apiVersion"].as_str().is_some_and(|v| v.starts_with(MONITORING_GROUP)))
        .map(kind)
        .collect()
}

/// The monitoring component's ServiceMonitors and PrometheusRule, against the Prometheus
/// Operator's own CRDs.
#[test]
fn kustomize_with_monitoring_component_passes_server_side_dry_run() {
    let _cluster = locks::cluster_shared_blocking().expect("the cluster lock");
    let objs = kustomize("e2e/overlays/monitoring");
    assert_eq!(monitoring_kinds(&objs), BTreeSet::from(["PrometheusRule", "ServiceMonitor"]));
    dry_run_all("kubectl kustomize e2e/overlays/monitoring", objs);
}

/// The simulated-gpus component (clusters without GPUs), with its inventory ConfigMap.
#[test]
fn kustomize_with_simulated_gpus_component_passes_server_side_dry_run() {
    let _cluster = locks::cluster_shared_blocking().expect("the cluster lock");
    dry_run_all("kubectl kustomize e2e/overlays/simulated-gpus", kustomize("e2e/overlays/simulated-gpus"));
}

/// The without-agent component (clusters whose DRA driver is another vendor's): the operator
/// alone, accepted by the API server.
#[test]
fn kustomize_without_agent_component_passes_server_side_dry_run() {
    let _cluster = locks::cluster_shared_blocking().expect("the cluster lock");
    dry_run_all("kubectl kustomize e2e/overlays/nvidia-dra", kustomize("e2e/overlays/nvidia-dra"));
}

/// The samples in config/samples/ are valid GpuPoolMigrations: the CRD's schema and CEL rules take
/// them (NVIDIA's driver without the interlock among them).
#[test]
fn samples_pass_server_side_dry_run() {
    let _cluster = locks::cluster_shared_blocking().expect("the cluster lock");
    let mut objs = parse(
        &std::fs::read_to_string(repo_root().join("crds/switchyard.dev_gpupoolmigrations.yaml"))
            .expect("the CRD"),
    );
    let mut samples: Vec<PathBuf> = std::fs::read_dir(repo_root().join("config/samples"))
        .expect("config/samples")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    samples.sort();
    assert!(samples.len() >= 3, "{samples:?}");
    for path in &samples {
        objs.extend(parse(&std::fs::read_to_string(path).expect("a sample")));
    }
    dry_run_all("config/samples", objs);
}

#[test]
fn helm_chart_passes_server_side_dry_run() {
    let _cluster = locks::cluster_shared_blocking().expect("the cluster lock");
    let objs = helm_template();
    assert_eq!(monitoring_kinds(&objs), BTreeSet::from(["PrometheusRule", "ServiceMonitor"]));
    dry_run_all("helm template (every toggle on)", objs);
}

/// The two install paths must not drift apart: same objects, same RBAC rules, same admission
/// policy, same pod specs. Helm adds its NetworkPolicies (a toggle kustomize does not have);
/// kustomize adds the Namespace (Helm installs into an existing one).
#[test]
fn kustomize_and_helm_install_the_same_objects() {
    let by_id = |objs: Vec<Value>| -> BTreeMap<String, Value> {
        objs.into_iter()
            .filter(|o| !matches!(kind(o), "Namespace" | "NetworkPolicy"))
            .map(|o| (id(&o), o))
            .collect()
    };
    let kust = by_id(kustomize("e2e/overlays/monitoring"));
    let helm = by_id(helm_template());
    let (k_ids, h_ids): (BTreeSet<_>, BTreeSet<_>) = (kust.keys().collect(), helm.keys().collect());
    assert_eq!(k_ids, h_ids, "kustomize and Helm install different objects");

    let same = |what: &str, pick: &dyn Fn(&Value) -> Value| {
        for (id, k) in &kust {
            let (kv, hv) = (pick(k), pick(&helm[id]));
            if kv != hv {
                let (k, h) = (kv.to_string(), hv.to_string());
                let at = k.chars().zip(h.chars()).take_while(|(a, b)| a == b).count().saturating_sub(40);
                let clip = |s: &str| s.chars().skip(at).take(160).collect::<String>();
                panic!(
                    "{what} of {id} differs between kustomize and Helm, from character {at}:\n  kustomize: {}\n  helm:      {}",
                    clip(&k),
                    clip(&h)
                );
            }
        }
    };
    same("rules", &|o| o["rules"].clone());
    same("roleRef and subjects", &|o| serde_json::json!([o["roleRef"], o["subjects"]]));
    same("spec", &|o| match kind(o) {
        "Deployment" | "DaemonSet" => {
            let mut spec = o["spec"].clone();
            spec["template"]["metadata"] = Value::Null; // Helm adds its release labels there
            spec
        }
        "ConfigMap" => o["data"].clone(),
        _ => o["spec"].clone(),
    });
}

/// The kustomize components for real GPU nodes mount the same driver root as the chart's
/// `agent.driverRoot`: the agent's pod spec is the same either way, and passes dry-run.
#[test]
fn driver_root_components_equal_the_charts_driver_root() {
    let _cluster = locks::cluster_shared_blocking().expect("the cluster lock");
    for (component, root) in [("host", "/"), ("gpu-operator", "/run/nvidia/driver")] {
        let overlay = format!("e2e/overlays/driver-root-{component}");
        let kust = kustomize(&overlay);
        let mut cmd = Command::new(helm());
        cmd.args(["template", "switchyard", "config/helm/switchyard", "--namespace", "switchyard-system"])
            .args(["--set", &format!("agent.driverRoot={root}")]);
        let helm = parse(&run_ok(cmd, ""));
        let agent = |objs: &[Value]| -> Value {
            objs.iter()
                .find(|o| kind(o) == "DaemonSet" && o["metadata"]["name"] == "switchyard-driver-agent")
                .map(|o| o["spec"]["template"]["spec"].clone())
                .expect("the agent DaemonSet")
        };
        let pod = agent(&kust);
        assert_eq!(pod, agent(&helm), "{overlay} and agent.driverRoot={root} render different agents");
        assert!(pod["containers"][0]["args"].to_string().contains("--driver-root=/driver-root"), "{pod}");
        assert!(pod["volumes"].to_string().contains(&format!("\"path\":\"{root}\"")), "{pod}");
        dry_run_all(&overlay, kust);
    }
}

/// The ValidatingAdmissionPolicy lets the agent's service account write only the ResourceSlices of
/// the node its token is bound to. Requests impersonate that account with the node-name extra the
/// API server puts in pod-bound tokens.
#[test]
fn agent_admission_policy_confines_slices_to_the_agents_node() {
    let _cluster = locks::cluster_shared_blocking().expect("the cluster lock");
    let objs = kustomize("config/");
    let wanted: Vec<&Value> = objs
        .iter()
        .filter(|o| {
            matches!(
                kind(o),
                "Namespace"
                    | "ServiceAccount"
                    | "ValidatingAdmissionPolicy"
                    | "ValidatingAdmissionPolicyBinding"
            ) || o["metadata"]["name"] == "switchyard-driver-agent"
                && matches!(kind(o), "ClusterRole" | "ClusterRoleBinding")
        })
        .collect();
    let mut apply = kubectl();
    apply.args(["apply", "--server-side", "--force-conflicts", "--field-manager", FIELD_MANAGER, "-f", "-"]);
    run_ok(apply, &to_yaml(&wanted));

    let id = unique("vap");
    let (mine, other) = (format!("{id}-node-a"), format!("{id}-node-b"));
    let slice = |name: &str, node: &str| {
        format!(
            "apiVersion: resource.k8s.io/v1\nkind: ResourceSlice\nmetadata: {{name: {name}}}\n\
             spec: {{driver: {id}.switchyard.dev, nodeName: {node}, pool: {{name: {node}, generation: 1, resourceSliceCount: 1}}, devices: [{{name: gpu-0}}]}}\n"
        )
    };
    let as_agent = |node: Option<&str>, args: &[&str], stdin: &str| {
        let mut cmd = kubectl();
        cmd.arg(format!("--as={AGENT_USER}"))
            .args(["--as-group=system:serviceaccounts", "--as-group=system:authenticated"]);
        if let Some(node) = node {
            cmd.arg(format!("--as-user-extra=authentication.kubernetes.io/node-name={node}"));
        }
        cmd.args(args);
        run(cmd, stdin)
    };

    // A new policy takes effect once the API server's policy informer has it: wait for the first deny.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (ok, _, err) = as_agent(
            Some(&mine),
            &["create", "--dry-run=server", "-f", "-"],
            &slice(&format!("{id}-x"), &other),
        );
        if !ok {
            assert!(
                err.contains("may only write ResourceSlices with spec.nodeName"),
                "denied for another reason: {err}"
            );
            break;
        }
        assert!(Instant::now() < deadline, "the agent could still write another node's slice after 30s");
        std::thread::sleep(Duration::from_millis(500));
    }

    // Its own node: allowed, for create and delete.
    let (ok, out, err) = as_agent(Some(&mine), &["create", "-f", "-"], &slice(&format!("{id}-a"), &mine));
    assert!(ok, "the agent on {mine} could not create its own slice: {out}{err}");
    // No node in the token (not a pod-bound token): denied.
    let (ok, _, err) =
        as_agent(None, &["create", "--dry-run=server", "-f", "-"], &slice(&format!("{id}-n"), &mine));
    assert!(
        !ok && err.contains("must use a node-bound ServiceAccount token"),
        "a token without a node was not refused: {err}"
    );
    // Another node's existing slice: the agent may not delete it.
    let mut create = kubectl();
    create.args(["create", "-f", "-"]);
    run_ok(create, &slice(&format!("{id}-b"), &other));
    let (ok, _, err) = as_agent(Some(&mine), &["delete", "resourceslice", &format!("{id}-b")], "");
    assert!(
        !ok && err.contains("may only change or delete ResourceSlices of that node"),
        "the agent deleted another node's slice: {err}"
    );
    let (ok, out, err) = as_agent(Some(&mine), &["delete", "resourceslice", &format!("{id}-a")], "");
    assert!(ok, "the agent could not delete its own slice: {out}{err}");
    // Not the agent: the policy does not apply.
    let mut delete = kubectl();
    delete.args(["delete", "resourceslice", &format!("{id}-b")]);
    run_ok(delete, "");
}

/// The operator's admission policy: as its ServiceAccount (impersonated, with the RBAC of
/// config/), the operator's own placement apply goes through, and any other change to a DaemonSet
/// is refused with a message that says what it may change. The cluster admin is not affected.
#[tokio::test]
async fn operator_admission_policy_lets_it_change_only_the_backend_node_affinity() -> anyhow::Result<()> {
    let _cluster = locks::cluster_shared().await?;
    use k8s_openapi::api::apps::v1::DaemonSet;
    use kube::api::{Api, Patch, PatchParams, PostParams};
    use switchyard_operator::pool::placement::{self, Role};
    use switchyard_operator::well_known::OPERATOR_FIELD_MANAGER;

    let objs = kustomize("config/");
    let wanted: Vec<&Value> = objs
        .iter()
        .filter(|o| {
            matches!(
                kind(o),
                "Namespace"
                    | "ServiceAccount"
                    | "ValidatingAdmissionPolicy"
                    | "ValidatingAdmissionPolicyBinding"
            ) || o["metadata"]["name"] == "switchyard-operator"
                && matches!(kind(o), "ClusterRole" | "ClusterRoleBinding")
        })
        .collect();
    let mut apply = kubectl();
    apply.args(["apply", "--server-side", "--force-conflicts", "--field-manager", FIELD_MANAGER, "-f", "-"]);
    run_ok(apply, &to_yaml(&wanted));

    let admin = cluster::client().await?;
    let ns = unique("opvap");
    let mut create_ns = kubectl();
    create_ns.args(["create", "namespace", &ns]);
    run_ok(create_ns, "");
    let as_operator = {
        let kubeconfig = kube::config::Kubeconfig::read_from(cluster::kubeconfig())?;
        let mut config =
            kube::Config::from_custom_kubeconfig(kubeconfig, &kube::config::KubeConfigOptions::default())
                .await?;
        config.auth_info.impersonate = Some(OPERATOR_USER.to_string());
        config.auth_info.impersonate_groups =
            Some(vec!["system:serviceaccounts".into(), "system:authenticated".into()]);
        kube::Client::try_from(config)?
    };
    // A device plugin as a chart renders it: its own GPU-node affinity term, no backend one.
    let ds: DaemonSet = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "nvidia-device-plugin", "namespace": ns},
        "spec": {
            "selector": {"matchLabels": {"app": "dp"}},
            "template": {"metadata": {"labels": {"app": "dp"}}, "spec": {
                "containers": [{"name": "dp", "image": "nvcr.io/nvidia/k8s-device-plugin:v0.17.0"}],
                "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "feature.node.kubernetes.io/pci-10de.present", "operator": "In", "values": ["true"]}]}]}}}
            }}
        }
    }))?;
    let by_admin: Api<DaemonSet> = Api::namespaced(admin, &ns);
    let created = by_admin.create(&PostParams::default(), &ds).await?;
    let by_operator: Api<DaemonSet> = Api::namespaced(as_operator, &ns);
    let merge = |patch: Value| Patch::Merge(patch);
    let refused = |r: Result<DaemonSet, kube::Error>| match r {
        Err(kube::Error::Api(s)) if s.code == 422 || s.code == 403 => s.message,
        other => panic!("expected the policy to refuse, got {other:?}"),
    };

    // A new policy takes effect once the API server's policy informer has it: wait for the first deny.
    let image = serde_json::json!({"spec": {"template": {"spec": {"containers": [{"name": "dp", "image": "registry.example.com/anything:1"}]}}}});
    let deadline = Instant::now() + Duration::from_secs(30);
    let message = loop {
        match by_operator
            .patch("nvidia-device-plugin", &PatchParams::default().dry_run(), &merge(image.clone()))
            .await
        {
            Err(kube::Error::Api(s)) if s.code == 422 || s.code == 403 => {
                if s.message.contains("may change only the switchyard.dev/gpu-backend") {
                    break s.message;
                }
                // RBAC or the informer: not the policy yet.
                assert!(Instant::now() < deadline, "refused, but not by the policy: {}", s.message);
            }
            other => {
                assert!(
                    Instant::now() < deadline,
                    "the operator could change the image after 30s: {other:?}"
                );
            }
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    assert!(message.contains("not what its pods run"), "{message}");

    // The operator's own write, exactly as placement: Managed sends it (sequential: dra and none).
    let patch = placement::apply_patch(&created, Role::DevicePlugin, true);
    let placed = by_operator
        .patch(
            "nvidia-device-plugin",
            &PatchParams::apply(OPERATOR_FIELD_MANAGER).force(),
            &Patch::Apply(&patch),
        )
        .await?;
    assert!(placement::has_placement(&placed, Role::DevicePlugin, true), "{:?}", placed.spec.template);
    // Its requirement only: the chart's term is still there.
    let terms = serde_json::to_value(&placed.spec.template.spec.as_ref().unwrap().affinity)?;
    assert!(terms.to_string().contains("pci-10de.present"), "{terms}");

    // Anything else, even a privilege or a placement term of another key, is refused.
    let privileged = serde_json::json!({"spec": {"template": {"spec": {"hostNetwork": true}}}});
    let m =
        refused(by_operator.patch("nvidia-device-plugin", &PatchParams::default(), &merge(privileged)).await);
    assert!(m.contains("identity, privileges or host access"), "{m}");
    let other_term = serde_json::json!({"spec": {"template": {"spec": {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": ["one-node"]}]}]}}}}}}});
    let m =
        refused(by_operator.patch("nvidia-device-plugin", &PatchParams::default(), &merge(other_term)).await);
    assert!(m.contains("its other placement"), "{m}");
    let selector = serde_json::json!({"spec": {"template": {"spec": {"nodeSelector": {"gpu": "yes"}}}}});
    let m =
        refused(by_operator.patch("nvidia-device-plugin", &PatchParams::default(), &merge(selector)).await);
    assert!(m.contains("its other placement"), "{m}");

    // The policy binds the operator only: the admin may change the image.
    by_admin.patch("nvidia-device-plugin", &PatchParams::default().dry_run(), &merge(image)).await?;
    let mut delete_ns = kubectl();
    delete_ns.args(["delete", "namespace", &ns, "--wait=false"]);
    run_ok(delete_ns, "");
    Ok(())
}
