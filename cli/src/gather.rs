//! Reads what `plan` and `inventory` need. Read-only apart from dry-run requests, which the API
//! server validates and discards.

use std::collections::{BTreeMap, HashSet};

use anyhow::Context as _;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceSlice};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::{Client, ResourceExt};
use serde::Deserialize;
use switchyard_operator::node::slim::SlimNode;

use switchyard_operator::api::v1alpha1::GpuPoolMigration;
use switchyard_operator::pool::preview::{self, Inputs, PodUse};
use switchyard_operator::pool::readers::{self, Target};
use switchyard_operator::pool::rollout::OtherMigration;
use switchyard_operator::reads::reader_objects::{self, Scope};
use switchyard_operator::well_known::NVIDIA_GPU_RESOURCE;

/// Field manager of the CLI's dry-run applies; nothing is persisted under it.
const CLI_FIELD_MANAGER: &str = "switchyard-cli";

/// Reads a GpuPoolMigration manifest (`-` is standard input). Takes the one GpuPoolMigration in
/// a multi-document file.
pub fn read_manifest(path: &std::path::Path) -> anyhow::Result<GpuPoolMigration> {
    let text = if path.as_os_str() == "-" {
        std::io::read_to_string(std::io::stdin()).context("reading standard input")?
    } else {
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?
    };
    let mut found = Vec::new();
    for doc in serde_yaml::Deserializer::from_str(&text) {
        let value =
            serde_yaml::Value::deserialize(doc).with_context(|| format!("parsing {}", path.display()))?;
        if value.get("kind").and_then(|k| k.as_str()) == Some("GpuPoolMigration") {
            found.push(value);
        }
    }
    match found.len() {
        1 => serde_yaml::from_value(found.remove(0))
            .with_context(|| format!("{} is not a valid GpuPoolMigration", path.display())),
        0 => anyhow::bail!("{} has no GpuPoolMigration", path.display()),
        n => anyhow::bail!("{} has {n} GpuPoolMigrations; plan one at a time", path.display()),
    }
}

/// What the API server makes of a manifest: a server-side apply with `dryRun=All` runs the CRD's
/// schema, defaults and CEL rules (including the immutability rules against an existing object)
/// and persists nothing. Returns the defaulted object and whether it already exists.
pub async fn dry_run_apply(
    client: &Client,
    gpm: &GpuPoolMigration,
) -> anyhow::Result<(GpuPoolMigration, bool)> {
    let api: Api<GpuPoolMigration> = Api::all(client.clone());
    let name = gpm.metadata.name.clone().context("the manifest has no metadata.name")?;
    let exists = api.get_opt(&name).await.context("reading the GpuPoolMigration")?.is_some();
    let mut body = gpm.clone();
    body.metadata.resource_version = None;
    body.metadata.managed_fields = None;
    body.status = None;
    let pp = PatchParams::apply(CLI_FIELD_MANAGER).force().dry_run();
    match api.patch(&name, &pp, &Patch::Apply(&body)).await {
        Ok(applied) => Ok((applied, exists)),
        Err(kube::Error::Api(s)) if s.code == 422 || s.code == 400 => {
            anyhow::bail!("the API server rejects this GpuPoolMigration: {}", s.message)
        }
        Err(e) => Err(e).context("dry-run apply of the GpuPoolMigration"),
    }
}

/// Reads everything the plan preview needs for `gpm`.
pub async fn plan_inputs(
    client: &Client,
    gpm: &GpuPoolMigration,
    exists: bool,
    scope: Scope,
) -> anyhow::Result<Inputs> {
    let name = gpm.name_any();
    let spec = &gpm.spec;
    let nodes = switchyard_operator::reads::nodes::list_pool_nodes(client, spec, &name).await?;
    let versions = nodes.iter().map(switchyard_operator::pool::gate::node_versions).collect::<Vec<_>>();
    let facts = switchyard_operator::reads::server::discover_server(client, &versions).await?;
    let (dn, dp) = (&spec.driver.daemon_set, &spec.device_plugin.daemon_set);
    let driver_ds =
        switchyard_operator::reads::server::get_daemonset(client, &dn.namespace, &dn.name).await?;
    let plugin_ds =
        switchyard_operator::reads::server::get_daemonset(client, &dp.namespace, &dp.name).await?;
    // One paged LIST of the cluster's bound pods, not one per node: a 5,000-node pool costs
    // (cluster pods / 500) requests. Each pod is folded in as its page arrives: the plan keeps
    // only those it judges one by one (GPU pods, mostly), each with the few fields a drain reads,
    // and counts the rest.
    let node_names: HashSet<&str> = nodes.iter().filter_map(|n| n.metadata.name.as_deref()).collect();
    let (mut pods, other_pods) = switchyard_operator::reads::pods::fold_pods_on_nodes(
        client,
        &node_names,
        false,
        (BTreeMap::<String, Vec<Pod>>::new(), BTreeMap::<String, u32>::new()),
        |(kept, counted), node, pod| match preview::pod_use(spec, &pod) {
            PodUse::Judged => kept.entry(node.to_owned()).or_default().push(pod),
            PodUse::Counted => *counted.entry(node.to_owned()).or_default() += 1,
            PodUse::Ignored => {}
        },
    )
    .await?;
    pods.values_mut().for_each(Vec::shrink_to_fit);
    let pdbs = Api::<PodDisruptionBudget>::all(client.clone())
        .list(&ListParams::default())
        .await
        .context("listing PodDisruptionBudgets")?
        .items;
    let device_classes = if facts.served.device_classes {
        Api::<DeviceClass>::all(client.clone())
            .list(&ListParams::default())
            .await
            .context("listing DeviceClasses")?
            .items
    } else {
        Vec::new()
    };
    let slices = if facts.served.resource_slices {
        reader_objects::list_all(
            Api::<ResourceSlice>::all(client.clone()),
            ListParams::default().fields(&format!("spec.driver={}", spec.driver.name)),
        )
        .await
        .context("listing ResourceSlices")?
    } else {
        Vec::new()
    };
    let others = Api::<GpuPoolMigration>::all(client.clone())
        .list(&ListParams::default())
        .await
        .context("listing GpuPoolMigrations")?
        .items
        .into_iter()
        .filter(|o| o.name_any() != name)
        .map(|o| OtherMigration { name: o.name_any(), selector: o.spec.node_selector.clone() })
        .collect();
    let observed = reader_objects::observe(
        client,
        reader_objects::targets(spec),
        Some(spec.node_selector.clone()),
        reader_objects::pool_nodes(&nodes),
        Scope { device_classes: Some(device_classes.clone()), ..scope },
    )
    .await
    .context("reading the inventory")?;
    // The device plugin's config file, where GPU Feature Discovery may not say what it shares.
    let device_plugin_config =
        match plugin_ds.as_ref().and_then(switchyard_operator::pool::plugin_config::source) {
            Some(source) => {
                let data = switchyard_operator::reads::server::config_map_data(
                    client,
                    &source.namespace,
                    &source.config_map,
                )
                .await;
                Some(switchyard_operator::pool::plugin_config::PluginConfig::new(source, data))
            }
            None => None,
        };
    let target = match spec.strategy.replace() {
        Some(r) if facts.served.resource_slices => Some(target_inputs(client, spec, r).await?),
        _ => None,
    };
    Ok(Inputs {
        uid: if exists { gpm.metadata.uid.clone().unwrap_or_default() } else { String::new() },
        name,
        spec: spec.clone(),
        exists,
        nodes,
        pods,
        other_pods,
        pdbs,
        facts,
        device_classes,
        driver_daemonset: driver_ds,
        device_plugin_daemonset: plugin_ds,
        device_plugin_config,
        others,
        slices,
        findings: readers::find(&observed),
        skipped: observed.skipped,
        now: Timestamp::now(),
        target,
    })
}

/// A Replace migration's target pool: its nodes, and what the operator's judgement reads of it
/// (`reads::target_pool`: the devices claims hold, the pending pods, the pods bound to each
/// usable target node).
async fn target_inputs(
    client: &Client,
    spec: &switchyard_operator::api::v1alpha1::GpuPoolMigrationSpec,
    r: &switchyard_operator::api::v1alpha1::ReplaceSpec,
) -> anyhow::Result<preview::TargetInputs> {
    let selector = kube::core::Selector::try_from(r.target_node_selector.clone())
        .context("spec.strategy.replace.targetNodeSelector")?;
    let nodes = Api::<SlimNode>::all(client.clone())
        .list(&ListParams::default().labels_from(&selector))
        .await
        .context("listing the target pool's nodes")?
        .items;
    switchyard_operator::reads::target_pool::target_inputs(client, &spec.driver.name, nodes)
        .await
        .context("reading the target pool")
}

/// The inventory's subject: one migration, the resources named on the command line, or every
/// migration in the cluster (`nvidia.com/gpu` when there is none).
pub async fn inventory_observed(
    client: &Client,
    migration: Option<&str>,
    resources: &[String],
    device_class: &str,
    scope: Scope,
) -> anyhow::Result<readers::Observed> {
    let api: Api<GpuPoolMigration> = Api::all(client.clone());
    let migrations = match migration {
        Some(m) => vec![api.get(m).await.with_context(|| format!("reading GpuPoolMigration {m}"))?],
        None if resources.is_empty() => {
            api.list(&ListParams::default()).await.context("listing GpuPoolMigrations")?.items
        }
        None => Vec::new(),
    };
    let mut targets: Vec<Target> = Vec::new();
    let mut nodes: BTreeMap<String, SlimNode> = BTreeMap::new();
    for m in &migrations {
        for t in reader_objects::targets(&m.spec) {
            if !targets.contains(&t) {
                targets.push(t);
            }
        }
        for n in switchyard_operator::reads::nodes::list_pool_nodes(client, &m.spec, &m.name_any()).await? {
            nodes.insert(n.name_any(), n);
        }
    }
    let named: Vec<String> = if resources.is_empty() && migrations.is_empty() {
        vec![NVIDIA_GPU_RESOURCE.to_string()]
    } else {
        resources.to_vec()
    };
    for r in named {
        targets.push(Target { extended_resource_name: r, device_class_name: device_class.to_string() });
    }
    let node_selector = match migrations.as_slice() {
        [one] => Some(one.spec.node_selector.clone()),
        _ => None,
    };
    if migrations.is_empty() {
        // No migration names the pool: every node that advertises one of the resources.
        let all = Api::<SlimNode>::all(client.clone())
            .list(&ListParams::default())
            .await
            .context("listing Nodes")?;
        for n in all.items {
            let advertises =
                n.allocatable().any(|(r, _)| targets.iter().any(|t| t.extended_resource_name == r));
            if advertises {
                nodes.insert(n.name_any(), n);
            }
        }
    }
    let nodes: Vec<SlimNode> = nodes.into_values().collect();
    reader_objects::observe(client, targets, node_selector, reader_objects::pool_nodes(&nodes), scope)
        .await
        .context("reading the inventory")
}
