//! What the pool's nodes advertise that the move would change: resources no `spec.resources`
//! entry maps (their pods would be stranded on DRA nodes), and GPUs the device plugin shares by
//! time-slicing or MPS (after the move each GPU serves as many pods as the DRA driver lets claims
//! share it, `spec.driver.sharesPerDevice`: one unless the driver publishes shareable devices). A
//! time-sliced node keeps its pods per GPU when the driver shares each device at least as many
//! ways; MPS never counts as kept (the driver shares by time-slicing, without MPS's limits). Pure: the operator's
//! PrerequisitesMet gate and `switchyard plan` both judge a pool through [`check`] and
//! [`blocker`], so the two never disagree.
//!
//! Sharing is read from what GPU Feature Discovery (part of the device plugin and of the GPU
//! Operator) labels a node with: `nvidia.com/gpu.sharing-strategy` (`time-slicing`, `mps` or
//! `none`), `nvidia.com/gpu.replicas` (replicas per GPU) and `nvidia.com/gpu.count` (physical
//! GPUs). A node whose device plugin advertises more `nvidia.com/gpu` than its `gpu.count` shares
//! too, labels or not. A renamed shared resource (`renameByDefault` makes it `nvidia.com/gpu.shared`)
//! is an unmapped resource. Only the device plugin's GPU resources can be unmapped: the NVIDIA
//! Network Operator's `nvidia.com/*` resources are not GPUs.

use std::collections::{BTreeMap, BTreeSet};

use crate::node::slim::SlimNode;
use kube::ResourceExt;

use crate::node::record::{Backend, node_backend};
use crate::pool::overlap;
use crate::pool::plugin_config::PluginConfig;
use crate::well_known::{NVIDIA_GPU_RESOURCE, is_gpu_resource};

/// GFD: how the device plugin shares each GPU (`none`, `time-slicing`, `mps`).
pub const LABEL_SHARING_STRATEGY: &str = "nvidia.com/gpu.sharing-strategy";
/// GFD: how many `nvidia.com/gpu` the device plugin advertises per physical GPU.
pub const LABEL_REPLICAS: &str = "nvidia.com/gpu.replicas";
/// GFD: the node's physical GPUs.
pub const LABEL_GPU_COUNT: &str = "nvidia.com/gpu.count";
/// How many nodes a message names before it says "and N more".
const NAMED: usize = 5;

/// Why the operator will not start a pool; the PrerequisitesMet reason.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Block {
    /// A pool node advertises an `nvidia.com/*` resource that no `spec.resources` entry maps.
    UnmappedResources,
    /// A pool node's device plugin shares GPUs more ways than the DRA driver will
    /// (`spec.driver.sharesPerDevice`) and `spec.acknowledge.gpuSharingLoss` is not set.
    GpuSharingNotAcknowledged,
}

impl Block {
    pub fn reason(self) -> &'static str {
        match self {
            Block::UnmappedResources => "UnmappedResources",
            Block::GpuSharingNotAcknowledged => "GpuSharingNotAcknowledged",
        }
    }
}

/// A node whose device plugin advertises more GPUs than it has.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SharedNode {
    pub node: String,
    /// The shared resource: `nvidia.com/gpu`, a renamed `nvidia.com/gpu.shared`, a MIG profile.
    pub resource: String,
    /// What the device plugin advertises of `resource` (capacity or allocatable, the larger).
    pub advertised: u64,
    /// The physical GPUs (or MIG devices) behind it: what our driver will publish.
    pub physical: u64,
    /// How it was told: `time-slicing, 4 replicas per GPU`.
    pub how: String,
    /// Shared through MPS: a driver that shares by time-slicing does not keep it.
    pub mps: bool,
    /// Whether `physical` was told (GFD's `.count` or `.replicas`, the plugin's config); else it is
    /// `advertised`, and how many ways the devices are shared is unknown.
    pub known: bool,
}

impl SharedNode {
    /// The claims the DRA driver can hold on this node's devices, each shared `shares` ways.
    pub fn after(&self, shares: u64) -> u64 {
        self.physical.saturating_mul(shares)
    }

    /// Whether the driver, sharing each device `shares` ways, keeps every slot the device plugin
    /// advertises: time-slicing (not MPS), a known device count, and room for as many claims.
    pub fn kept_by(&self, shares: u64) -> bool {
        !self.mps && self.known && self.after(shares) >= self.advertised
    }
}

/// The result of [`check`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Check {
    /// Unmapped resource → the nodes that advertise it, by name.
    pub unmapped: BTreeMap<String, Vec<String>>,
    /// Shared resources whose slots the move loses: the device plugin shares them more ways than
    /// the driver will.
    pub shared: Vec<SharedNode>,
    /// Shared resources the driver shares as many ways or more (`spec.driver.sharesPerDevice`):
    /// every slot is kept.
    pub kept: Vec<SharedNode>,
    /// `spec.driver.sharesPerDevice`: what [`check`] judged against.
    pub shares: u64,
    /// Why the device plugin's config could not be judged for nodes GFD does not label, by why:
    /// the nodes. Their sharing shows only at the switch.
    pub unjudged: BTreeMap<String, Vec<String>>,
}

impl Default for Check {
    /// Nothing found, against devices that each serve one claim.
    fn default() -> Self {
        Check {
            unmapped: BTreeMap::new(),
            shared: Vec::new(),
            kept: Vec::new(),
            shares: 1,
            unjudged: BTreeMap::new(),
        }
    }
}

fn label_u64(node: &SlimNode, key: &str) -> Option<u64> {
    node.labels().get(key).and_then(|v| v.trim().parse().ok())
}

/// How many `resource` the device plugin advertises on `node`: capacity or allocatable, the
/// larger (allocatable drops to 0 while a plugin pod restarts).
pub fn advertised(node: &SlimNode, resource: &str) -> u64 {
    overlap::device_plugin_gpus(node, &[resource]).get(resource).copied().unwrap_or(0)
}

/// Whether `node`'s device plugin shares its `nvidia.com/gpu`, and how ([`sharing_of`]).
pub fn sharing(node: &SlimNode) -> Option<SharedNode> {
    sharing_of(node, NVIDIA_GPU_RESOURCE)
}

/// The suffix `renameByDefault` gives a shared resource: `nvidia.com/gpu.shared`.
const SHARED_SUFFIX: &str = ".shared";

/// Whether `node`'s device plugin shares the devices behind `resource`, and how. `None` for a
/// resource it does not share, or does not advertise.
///
/// GFD labels each resource under its name, a renamed shared one under the name it had
/// (`nvidia.com/gpu.replicas` for `nvidia.com/gpu.shared`, `nvidia.com/mig-1g.10gb.replicas` for a
/// time-sliced MIG profile): `<name>.sharing-strategy`, `<name>.replicas` and `<name>.count`, the
/// physical GPUs or MIG devices. The `.shared` suffix says the resource is shared by itself. A
/// resource advertised beyond its `.count` is shared, labels or not.
///
/// The same labels therefore stand for either name, and only one of them is advertised: GFD
/// tells which by `<name>.product`, which ends in `-SHARED` when the shared devices keep their
/// name and does not when `renameByDefault` renamed them.
pub fn sharing_of(node: &SlimNode, resource: &str) -> Option<SharedNode> {
    if stale_name(node, resource) {
        return None;
    }
    let base = resource.strip_suffix(SHARED_SUFFIX).unwrap_or(resource);
    let renamed = base != resource;
    let label = |suffix: &str| node.labels().get(&format!("{base}.{suffix}")).map(|v| v.trim().to_string());
    let number = |suffix: &str| label(suffix).and_then(|v| v.parse::<u64>().ok()).filter(|n| *n > 0);
    let now = advertised(node, resource);
    let strategy = label("sharing-strategy");
    let strategy_is_mps = strategy.as_deref() == Some("mps");
    let replicas = number("replicas");
    let count = number("count");
    // GFD's labels outlive a device-plugin restart, while the node advertises 0 for a moment
    // (Managed placement restarts every plugin pod once): judged by its labels, a shared node
    // keeps the pool closed through that window. Only in that window (the other name is not
    // advertised either), and only for the name the labels stand for: without a product label,
    // the name they are written under.
    let labelled = matches!(strategy.as_deref(), Some(s) if !s.is_empty() && s != "none")
        || replicas.is_some_and(|r| r > 1);
    let other = if renamed { base.to_string() } else { format!("{base}{SHARED_SUFFIX}") };
    let restarting = now == 0 && advertised(node, &other) == 0;
    let labels_name_it = label("product").map_or(!renamed, |p| p.ends_with("-SHARED") != renamed);
    let advertised = match (now, count, replicas) {
        (0, Some(c), Some(r)) if labelled && restarting && labels_name_it => c * r,
        (n, _, _) => n,
    };
    let over_count = count.is_some_and(|c| now > c);
    let shared = ((labelled || renamed) && advertised > 0) || over_count;
    if !shared {
        return None;
    }
    let (one, unit) = if base == NVIDIA_GPU_RESOURCE { ("GPU", "GPU(s)") } else { ("device", "device(s)") };
    let physical =
        count.or_else(|| replicas.map(|r| advertised.div_ceil(r))).unwrap_or(advertised).min(advertised);
    let mut how = Vec::new();
    if renamed {
        how.push(format!("renamed {resource} (renameByDefault)"));
    }
    if let Some(s) = strategy.filter(|s| !s.is_empty() && s != "none") {
        how.push(s);
    }
    if let Some(r) = replicas.filter(|r| *r > 1) {
        how.push(format!("{r} replicas per {one}"));
    }
    if renamed && replicas.is_none() && count.is_none() {
        how.push(format!("replicas unknown (no {base}.replicas or {base}.count label)"));
    } else if how.is_empty() {
        how.push(format!("{advertised} advertised on {physical} {unit} ({base}.count)"));
    }
    Some(SharedNode {
        node: node.name_any(),
        resource: resource.to_string(),
        advertised,
        physical,
        how: how.join(", "),
        mps: strategy_is_mps,
        known: count.is_some() || replicas.is_some(),
    })
}

/// Whether `resource`'s count on `node` is the kubelet's memory of an endpoint the device plugin
/// no longer serves, by GFD's labels: the node is labelled shared, GFD's `<base>.product` says the
/// shared devices are advertised under the other of `<base>` and `<base>.shared` (it ends in
/// `-SHARED` only where they keep their name), and that other name is advertised. NVIDIA's
/// config-manager leaves `nvidia.com/gpu` capacity beside `nvidia.com/gpu.shared` on a node whose
/// config renames its GPUs; while the plugin's pod restarts (Managed placement restarts each one
/// once) neither is allocatable, so only the labels tell the stale name from the served one.
fn stale_name(node: &SlimNode, resource: &str) -> bool {
    let base = resource.strip_suffix(SHARED_SUFFIX).unwrap_or(resource);
    let renamed = base != resource;
    let label = |suffix: &str| node.labels().get(&format!("{base}.{suffix}")).map(|v| v.trim().to_string());
    let labelled = matches!(label("sharing-strategy").as_deref(), Some(s) if !s.is_empty() && s != "none")
        || label("replicas").and_then(|r| r.parse::<u64>().ok()).is_some_and(|r| r > 1);
    let Some(product) = label("product") else { return false };
    let other = if renamed { base.to_string() } else { format!("{base}{SHARED_SUFFIX}") };
    labelled && product.ends_with("-SHARED") == renamed && advertised(node, &other) > 0
}

/// Whether GFD labels `resource` on `node` (its `.count`, `.replicas` or `.sharing-strategy`): it
/// then says whether the resource is shared, and the device plugin's config is not read.
fn gfd_labelled(node: &SlimNode, resource: &str) -> bool {
    let base = resource.strip_suffix(SHARED_SUFFIX).unwrap_or(resource);
    ["count", "replicas", "sharing-strategy"]
        .iter()
        .any(|s| node.labels().contains_key(&format!("{base}.{s}")))
}

/// Judges the pool nodes that are still to move forward (on the device plugin, not yet
/// Migrated): a node already on DRA advertises nothing through the device plugin.
///
/// Only the device plugin's GPU resources count as unmapped: its default names and
/// `gpu_resources` (`spec.devicePlugin.gpuResources`; see
/// [`crate::well_known::is_gpu_resource`]). The Network Operator's `nvidia.com/*` are not GPUs.
///
/// Where GFD does not label a resource at all, `config` (the device plugin's config file, see
/// [`crate::pool::plugin_config`]) says whether it is shared.
pub fn check<'a>(
    nodes: impl IntoIterator<Item = &'a SlimNode>,
    mapped: &[&str],
    gpu_resources: &[String],
    config: Option<&PluginConfig>,
    shares: u64,
) -> Check {
    let shares = shares.max(1);
    let mut out = Check { shares, ..Check::default() };
    for node in nodes {
        if node_backend(node) != Backend::DevicePlugin {
            continue;
        }
        let name = node.name_any();
        // Capacity and allocatable both list a resource: once per node.
        let advertised_keys: BTreeSet<&str> = node
            .capacity()
            .chain(node.allocatable())
            .filter(|(k, q)| is_gpu_resource(k, gpu_resources) && q.0.trim() != "0")
            .map(|(k, _)| k)
            .collect();
        // A name the plugin no longer serves (its capacity a stopped endpoint's) needs no entry.
        let extra: Vec<&str> = gpu_resources.iter().map(String::as_str).collect();
        let advertised_keys =
            advertised_keys.into_iter().filter(|k| !overlap::stopped_serving(node, k, &extra));
        for key in advertised_keys.filter(|k| !mapped.contains(k)) {
            out.unmapped.entry(key.to_string()).or_default().push(name.clone());
        }
        for resource in mapped.iter().filter(|r| is_gpu_resource(r, gpu_resources)) {
            match (sharing_of(node, resource), config) {
                (Some(s), _) => out.shared.push(s),
                (None, Some(c)) if !gfd_labelled(node, resource) => match c.shared_node(node, resource) {
                    Ok(s) => out.shared.extend(s),
                    Err(why) => out.unjudged.entry(why).or_default().push(name.clone()),
                },
                (None, _) => {}
            }
        }
    }
    for nodes in out.unmapped.values_mut().chain(out.unjudged.values_mut()) {
        nodes.sort();
        nodes.dedup();
    }
    let (kept, lost): (Vec<SharedNode>, Vec<SharedNode>) =
        std::mem::take(&mut out.shared).into_iter().partition(|s| s.kept_by(shares));
    (out.kept, out.shared) = (kept, lost);
    for list in [&mut out.shared, &mut out.kept] {
        list.sort_by(|a, b| (&a.resource, &a.node).cmp(&(&b.resource, &b.node)));
    }
    out
}

pub(crate) fn names(nodes: &[String]) -> String {
    let mut s = nodes.iter().take(NAMED).cloned().collect::<Vec<_>>().join(", ");
    if nodes.len() > NAMED {
        s.push_str(&format!(" and {} more", nodes.len() - NAMED));
    }
    s
}

/// The shared nodes by resource, in name order.
fn by_resource(shared: &[SharedNode]) -> BTreeMap<&str, Vec<&SharedNode>> {
    let mut out: BTreeMap<&str, Vec<&SharedNode>> = BTreeMap::new();
    for s in shared {
        out.entry(s.resource.as_str()).or_default().push(s);
    }
    out
}

/// What one device of `resource` is called: a GPU for `nvidia.com/gpu` and its renamed
/// `.shared`, else a device (a MIG profile's).
fn device_of(resource: &str) -> &'static str {
    if resource.strip_suffix(SHARED_SUFFIX).unwrap_or(resource) == NVIDIA_GPU_RESOURCE {
        "GPU"
    } else {
        "device"
    }
}

/// Up to [`NAMED`] nodes' details, `node: 16 on 4 GPU(s), time-slicing, 4 replicas per GPU`, and
/// how many more.
fn node_details(resource: &str, nodes: &[&SharedNode]) -> String {
    // As the messages have always said it: a renamed resource's devices are devices.
    let unit = if resource == NVIDIA_GPU_RESOURCE { "GPU(s)" } else { "device(s)" };
    let detail: Vec<String> = nodes
        .iter()
        .take(NAMED)
        .map(|s| format!("{}: {} on {} {unit}, {}", s.node, s.advertised, s.physical, s.how))
        .collect();
    let more =
        if nodes.len() > NAMED { format!("; and {} more", nodes.len() - NAMED) } else { String::new() };
    format!("{}{more}", detail.join("; "))
}

/// What sharing costs the pool, a clause per shared resource: `nvidia.com/gpu capacity drops
/// from 32 to 8 on 2 node(s) that share it through the device plugin (gpu-1: 16 on 4 GPU(s),
/// time-sliced, 4 replicas per device; ...)`, then what each device serves after the move
/// (`shares`, `spec.driver.sharesPerDevice`).
pub fn sharing_summary(shared: &[SharedNode], shares: u64) -> String {
    let mut clauses = Vec::new();
    for (resource, nodes) in by_resource(shared) {
        let (mps, sliced): (Vec<&SharedNode>, Vec<&SharedNode>) = nodes.into_iter().partition(|s| s.mps);
        if !sliced.is_empty() {
            let before: u64 = sliced.iter().map(|s| s.advertised).sum();
            let after: u64 = sliced.iter().map(|s| s.after(shares).min(s.advertised)).sum();
            clauses.push(format!(
                "{resource} capacity drops from {before} to {after} on {} node(s) that share it through the device plugin ({})",
                sliced.len(),
                node_details(resource, &sliced)
            ));
        }
        if !mps.is_empty() {
            let after: u64 = mps.iter().map(|s| s.after(shares).min(s.advertised)).sum();
            clauses.push(format!(
                "{resource} is shared through MPS on {} node(s) ({}): the DRA driver shares by time-slicing, without MPS's per-client memory and compute limits, so {after} claim(s) remain and MPS is lost",
                mps.len(),
                node_details(resource, &mps)
            ));
        }
    }
    let after = match shares {
        1 => "after the move each device serves one pod".to_string(),
        n => format!(
            "after the move each device serves {n} pods (spec.driver.sharesPerDevice), and MPS or sharing of unknown ways is not kept"
        ),
    };
    format!("{}: {after}", clauses.join("; "))
}

/// What the driver's shares keep, a clause per resource: `nvidia.com/gpu time-sliced 2x -> 2 shares
/// per GPU (spec.driver.sharesPerDevice): no loss, 8 pods' slots before and after on 2 node(s)
/// (...)`. `None` when nothing shared is kept.
pub fn kept_summary(c: &Check) -> Option<String> {
    let clauses: Vec<String> = by_resource(&c.kept)
        .into_iter()
        .map(|(resource, nodes)| {
            let one = device_of(resource);
            let ways = nodes.iter().map(|s| s.advertised.div_ceil(s.physical.max(1))).max().unwrap_or(1);
            let slots: u64 = nodes.iter().map(|s| s.advertised).sum();
            format!(
                "{resource} time-sliced {ways}x -> {} shares per {one} (spec.driver.sharesPerDevice): no loss, {slots} pods' slots before and after on {} node(s) ({})",
                c.shares,
                nodes.len(),
                node_details(resource, &nodes)
            )
        })
        .collect();
    (!clauses.is_empty()).then(|| clauses.join("; "))
}

/// The reason and message that keep the pool from starting, or `None`. Unmapped resources come
/// first: acknowledging the sharing does not make them servable.
pub fn blocker(c: &Check, sharing_acknowledged: bool) -> Option<(Block, String)> {
    if !c.unmapped.is_empty() {
        let listed: Vec<String> =
            c.unmapped.iter().map(|(r, nodes)| format!("{r} on {}", names(nodes))).collect();
        return Some((
            Block::UnmappedResources,
            format!(
                "pool nodes advertise resources that no spec.resources entry maps, so pods requesting them would be stranded after the move: {}. Add a spec.resources entry for each (a MIG profile gets its own DeviceClass), or take them off the nodes",
                listed.join("; ")
            ),
        ));
    }
    if !c.shared.is_empty() && !sharing_acknowledged {
        return Some((
            Block::GpuSharingNotAcknowledged,
            format!(
                "{}. Have the DRA driver share each device as many ways and set spec.driver.sharesPerDevice to that number (Switchyard's agent: --shares-per-device or the node label {}; NVIDIA's: --consumable-shares), or set spec.acknowledge.gpuSharingLoss: true to migrate anyway",
                sharing_summary(&c.shared, c.shares),
                crate::well_known::LABEL_GPU_SHARES
            ),
        ));
    }
    None
}

/// The GPUs a node must publish through DRA to count as switched, per resource: what the device
/// plugin advertises, except that a shared resource counts its physical GPUs or MIG devices
/// ([`sharing_of`], else the device plugin's `config` where GFD does not label it). A node the
/// device plugin does not serve at all (it joined after the plugin was removed) counts GFD's
/// `nvidia.com/gpu.count`, where GFD labelled it, for the full-GPU resource
/// (`full_gpu_resource`).
pub fn gpus_to_publish(
    node: &SlimNode,
    resources: &[&str],
    config: Option<&PluginConfig>,
) -> BTreeMap<String, u64> {
    let mut counts = overlap::device_plugin_gpus(node, resources);
    let unserved = counts.values().all(|&n| n == 0);
    let full_gpu = full_gpu_resource(resources);
    for (resource, n) in counts.iter_mut() {
        if stale_name(node, resource) {
            *n = 0;
            continue;
        }
        let by_config = || {
            config
                .filter(|_| !gfd_labelled(node, resource))
                .and_then(|c| c.shared_node(node, resource).ok().flatten())
        };
        if let Some(s) = sharing_of(node, resource).or_else(by_config) {
            *n = s.physical;
        } else if unserved
            && Some(resource.as_str()) == full_gpu
            && let Some(physical) = label_u64(node, LABEL_GPU_COUNT)
        {
            *n = physical;
        }
    }
    counts
}

/// The mapped resource GFD's `nvidia.com/gpu.count` counts: `nvidia.com/gpu`, else the one
/// resource a migration maps where the device plugin's config renames full GPUs (its
/// `resources.gpus[].name`). None where that is ambiguous, or the one resource is a MIG profile.
fn full_gpu_resource<'a>(resources: &[&'a str]) -> Option<&'a str> {
    if resources.contains(&NVIDIA_GPU_RESOURCE) {
        return Some(NVIDIA_GPU_RESOURCE);
    }
    match resources {
        [only] if !crate::well_known::resource_matches("nvidia.com/mig-*", only) => Some(*only),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn node(name: &str, labels: serde_json::Value, capacity: serde_json::Value) -> SlimNode {
        serde_json::from_value(json!({
            "metadata": {"name": name, "labels": labels},
            "status": {"capacity": capacity, "allocatable": capacity},
        }))
        .unwrap()
    }

    const MAPPED: &[&str] = &["nvidia.com/gpu"];

    /// (case, labels, nvidia.com/gpu advertised, expected (physical, how) or None)
    type SharingCase = (&'static str, serde_json::Value, &'static str, Option<(u64, &'static str)>);

    /// The labels NVIDIA's GPU Feature Discovery v0.19.3 wrote for two H100s of the NVML mock,
    /// whole and time-sliced 4 ways (e2e/nvml-mock/gocheck runs GFD again and keeps these files
    /// equal to what it writes).
    fn gfd_labels(file: &str) -> serde_json::Value {
        let text = std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/gfd").join(file),
        )
        .expect("a GFD fixture");
        let labels: serde_json::Map<String, serde_json::Value> =
            text.lines().filter_map(|l| l.split_once('=')).map(|(k, v)| (k.to_string(), json!(v))).collect();
        serde_json::Value::Object(labels)
    }

    #[test]
    fn what_real_gpu_feature_discovery_writes_is_read_as_it_means() {
        // Two whole GPUs: nothing shared, two to publish.
        let whole = node("n", gfd_labels("v0.19.3-two-h100.labels"), json!({"nvidia.com/gpu": "2"}));
        assert_eq!(sharing(&whole), None);
        assert!(gfd_labelled(&whole, "nvidia.com/gpu"));
        assert_eq!(
            gpus_to_publish(&whole, MAPPED, None),
            BTreeMap::from([("nvidia.com/gpu".to_string(), 2)])
        );
        // Time-sliced 4 ways: the plugin advertises 8, the driver will publish the 2 GPUs.
        let sliced =
            node("n", gfd_labels("v0.19.3-two-h100-time-sliced-4.labels"), json!({"nvidia.com/gpu": "8"}));
        let s = sharing(&sliced).expect("shared");
        assert_eq!((s.advertised, s.physical, s.how.as_str()), (8, 2, "time-slicing, 4 replicas per GPU"));
        assert_eq!(
            gpus_to_publish(&sliced, MAPPED, None),
            BTreeMap::from([("nvidia.com/gpu".to_string(), 2)])
        );
        // MIG, mixed strategy: each profile is labelled under its own name, one device each, not
        // shared.
        let mig = node(
            "n",
            gfd_labels("v0.19.3-h100-mig-mixed.labels"),
            json!({"nvidia.com/mig-1g.10gb": "1", "nvidia.com/mig-3g.40gb": "1"}),
        );
        for profile in ["nvidia.com/mig-1g.10gb", "nvidia.com/mig-3g.40gb"] {
            assert!(gfd_labelled(&mig, profile), "{profile}");
            assert_eq!(sharing_of(&mig, profile), None, "{profile}");
        }
        let mapped = ["nvidia.com/mig-1g.10gb", "nvidia.com/mig-3g.40gb"];
        assert_eq!(
            gpus_to_publish(&mig, &mapped, None),
            BTreeMap::from([
                ("nvidia.com/mig-1g.10gb".to_string(), 1),
                ("nvidia.com/mig-3g.40gb".to_string(), 1)
            ])
        );
    }

    #[test]
    fn gfds_labels_speak_for_the_name_the_plugin_advertises() {
        // Time-sliced 4 ways on two nodes, advertised under its own name on one and renamed
        // (renameByDefault) on the other: GFD labels both under nvidia.com/gpu, and only the
        // product tells them apart. A pool mapping both names judges each node once.
        let mapped = ["nvidia.com/gpu", "nvidia.com/gpu.shared"];
        let same =
            node("same", gfd_labels("v0.19.3-two-h100-time-sliced-4.labels"), json!({"nvidia.com/gpu": "8"}));
        let renamed = node(
            "renamed",
            gfd_labels("v0.19.3-two-h100-time-sliced-4-renamed.labels"),
            json!({"nvidia.com/gpu.shared": "8"}),
        );
        let c = check([&same, &renamed], &mapped, &[], None, 1);
        let judged: Vec<(&str, &str, u64, u64)> = c
            .shared
            .iter()
            .map(|s| (s.node.as_str(), s.resource.as_str(), s.advertised, s.physical))
            .collect();
        assert_eq!(
            judged,
            vec![("same", "nvidia.com/gpu", 8, 2), ("renamed", "nvidia.com/gpu.shared", 8, 2)]
        );
        assert_eq!(sharing_of(&same, "nvidia.com/gpu.shared"), None);
        assert_eq!(sharing_of(&renamed, "nvidia.com/gpu"), None);
        // While a plugin restarts (nothing advertised under either name), each node's labels
        // still keep it judged shared, under the name it advertises.
        let restarting = |n: &SlimNode, labels: &str| {
            node(
                &n.name_any(),
                gfd_labels(labels),
                json!({"nvidia.com/gpu": "0", "nvidia.com/gpu.shared": "0"}),
            )
        };
        let same0 = restarting(&same, "v0.19.3-two-h100-time-sliced-4.labels");
        let renamed0 = restarting(&renamed, "v0.19.3-two-h100-time-sliced-4-renamed.labels");
        assert_eq!(sharing_of(&same0, "nvidia.com/gpu").map(|s| s.advertised), Some(8));
        assert_eq!(sharing_of(&same0, "nvidia.com/gpu.shared"), None);
        assert_eq!(sharing_of(&renamed0, "nvidia.com/gpu.shared").map(|s| s.advertised), Some(8));
        assert_eq!(sharing_of(&renamed0, "nvidia.com/gpu"), None);
    }

    #[test]
    fn sharing_table() {
        let cases: Vec<SharingCase> = vec![
            ("plain", json!({"nvidia.com/gpu.count": "8"}), "8", None),
            ("no labels", json!({}), "8", None),
            (
                "strategy none",
                json!({"nvidia.com/gpu.sharing-strategy": "none", "nvidia.com/gpu.replicas": "1"}),
                "8",
                None,
            ),
            (
                "time-slicing",
                json!({"nvidia.com/gpu.sharing-strategy": "time-slicing", "nvidia.com/gpu.replicas": "4", "nvidia.com/gpu.count": "8"}),
                "32",
                Some((8, "time-slicing, 4 replicas per GPU")),
            ),
            (
                "mps without count",
                json!({"nvidia.com/gpu.sharing-strategy": "mps", "nvidia.com/gpu.replicas": "2"}),
                "16",
                Some((8, "mps, 2 replicas per GPU")),
            ),
            ("replicas only", json!({"nvidia.com/gpu.replicas": "3"}), "6", Some((2, "3 replicas per GPU"))),
            (
                "over count, no sharing labels",
                json!({"nvidia.com/gpu.count": "2"}),
                "8",
                Some((2, "8 advertised on 2 GPU(s) (nvidia.com/gpu.count)")),
            ),
        ];
        for (case, labels, gpus, want) in cases {
            let n = node("n", labels, json!({"nvidia.com/gpu": gpus}));
            let got = sharing(&n).map(|s| (s.physical, s.how));
            assert_eq!(got, want.map(|(p, h)| (p, h.to_string())), "{case}");
        }
        // No GPUs advertised and no count to go by: nothing to judge.
        let idle = node("n", json!({"nvidia.com/gpu.replicas": "4"}), json!({"cpu": "8"}));
        assert_eq!(sharing(&idle), None);
        // The plugin restarting (0 advertised for a moment): the labels still tell, with the
        // same figures, so the gate does not open for that moment.
        let labels = json!({"nvidia.com/gpu.sharing-strategy": "time-slicing", "nvidia.com/gpu.replicas": "4", "nvidia.com/gpu.count": "8"});
        let restarting = node("n", labels, json!({"nvidia.com/gpu": "0"}));
        let s = sharing(&restarting).expect("still shared");
        assert_eq!((s.advertised, s.physical), (32, 8));
    }

    #[test]
    fn renamed_and_mig_resources_are_judged_each_under_their_own_labels() {
        // (case, labels, advertised, resource, expected (advertised, physical, how) or None)
        type Case = (
            &'static str,
            serde_json::Value,
            serde_json::Value,
            &'static str,
            Option<(u64, u64, &'static str)>,
        );
        let cases: Vec<Case> = vec![
            (
                "renameByDefault, GFD labels under the old name",
                json!({"nvidia.com/gpu.replicas": "4", "nvidia.com/gpu.count": "2"}),
                json!({"nvidia.com/gpu.shared": "8"}),
                "nvidia.com/gpu.shared",
                Some((8, 2, "renamed nvidia.com/gpu.shared (renameByDefault), 4 replicas per GPU")),
            ),
            (
                "renameByDefault without labels: shared, replicas unknown",
                json!({}),
                json!({"nvidia.com/gpu.shared": "8"}),
                "nvidia.com/gpu.shared",
                Some((
                    8,
                    8,
                    "renamed nvidia.com/gpu.shared (renameByDefault), replicas unknown (no nvidia.com/gpu.replicas or nvidia.com/gpu.count label)",
                )),
            ),
            (
                "a time-sliced MIG profile",
                json!({"nvidia.com/mig-1g.10gb.sharing-strategy": "time-slicing", "nvidia.com/mig-1g.10gb.replicas": "2", "nvidia.com/mig-1g.10gb.count": "7"}),
                json!({"nvidia.com/mig-1g.10gb": "14"}),
                "nvidia.com/mig-1g.10gb",
                Some((14, 7, "time-slicing, 2 replicas per device")),
            ),
            (
                "a MIG profile advertised beyond its count, no sharing labels",
                json!({"nvidia.com/mig-1g.10gb.count": "7"}),
                json!({"nvidia.com/mig-1g.10gb": "14"}),
                "nvidia.com/mig-1g.10gb",
                Some((14, 7, "14 advertised on 7 device(s) (nvidia.com/mig-1g.10gb.count)")),
            ),
            (
                "the GPU's labels say nothing of a MIG profile",
                json!({"nvidia.com/gpu.replicas": "4"}),
                json!({"nvidia.com/mig-1g.10gb": "7"}),
                "nvidia.com/mig-1g.10gb",
                None,
            ),
        ];
        for (case, labels, advertised, resource, want) in cases {
            let n = node("n", labels, advertised);
            let got = sharing_of(&n, resource).map(|s| (s.advertised, s.physical, s.how));
            assert_eq!(got, want.map(|(a, p, h)| (a, p, h.to_string())), "{case}");
        }
        // Mixed MIG and sharing on one node: each resource has its clause, and the switch
        // counts each resource's physical devices.
        let mixed = node(
            "m",
            json!({"nvidia.com/gpu.replicas": "2", "nvidia.com/gpu.count": "1",
                   "nvidia.com/mig-1g.10gb.replicas": "2", "nvidia.com/mig-1g.10gb.count": "2"}),
            json!({"nvidia.com/gpu.shared": "2", "nvidia.com/mig-1g.10gb.shared": "4"}),
        );
        let mapped = ["nvidia.com/gpu.shared", "nvidia.com/mig-1g.10gb.shared"];
        let c = check([&mixed], &mapped, &[], None, 1);
        assert_eq!(c.shared.len(), 2, "{:?}", c.shared);
        let summary = sharing_summary(&c.shared, c.shares);
        assert!(
            summary.contains("nvidia.com/gpu.shared capacity drops from 2 to 1 on 1 node(s)"),
            "{summary}"
        );
        assert!(
            summary.contains("nvidia.com/mig-1g.10gb.shared capacity drops from 4 to 2 on 1 node(s)"),
            "{summary}"
        );
        let publish = gpus_to_publish(&mixed, &mapped, None);
        assert_eq!((publish["nvidia.com/gpu.shared"], publish["nvidia.com/mig-1g.10gb.shared"]), (1, 2));
    }

    #[test]
    fn only_the_device_plugins_gpu_resources_can_be_unmapped() {
        // The NVIDIA Network Operator's SR-IOV and RDMA resources beside the GPUs.
        let n = node(
            "n",
            json!({}),
            json!({"nvidia.com/gpu": "8", "nvidia.com/hostdev": "4", "nvidia.com/rdma_shared_device_a": "1k",
                   "nvidia.com/a100": "8", "nvidia.com/mig-1g.10gb.shared": "14"}),
        );
        let unmapped =
            |extra: &[String]| check([&n], MAPPED, extra, None, 1).unmapped.into_keys().collect::<Vec<_>>();
        assert_eq!(unmapped(&[]), ["nvidia.com/mig-1g.10gb.shared"], "network resources are not GPUs");
        // A GPU the device plugin's config renames is one once the spec says so.
        assert_eq!(
            unmapped(&["nvidia.com/a100*".to_string()]),
            ["nvidia.com/a100", "nvidia.com/mig-1g.10gb.shared"]
        );
    }

    #[test]
    fn unmapped_resources_name_the_nodes_and_block_before_sharing() {
        let nodes = [
            node("b", json!({}), json!({"nvidia.com/gpu": "4", "nvidia.com/mig-1g.10gb": "7"})),
            node("a", json!({}), json!({"nvidia.com/mig-1g.10gb": "7", "nvidia.com/gpu.shared": "0"})),
            node(
                "c",
                json!({"nvidia.com/gpu.replicas": "4"}),
                json!({"nvidia.com/gpu": "16", "example.com/fpga": "1"}),
            ),
        ];
        let c = check(&nodes, MAPPED, &[], None, 1);
        assert_eq!(c.unmapped.len(), 1, "zero quantities and other vendors do not count: {:?}", c.unmapped);
        assert_eq!(c.unmapped["nvidia.com/mig-1g.10gb"], ["a", "b"]);
        assert_eq!(c.shared.len(), 1);
        let (block, message) = blocker(&c, true).unwrap();
        assert_eq!(block, Block::UnmappedResources);
        assert!(message.contains("nvidia.com/mig-1g.10gb on a, b"), "{message}");
        assert!(message.contains("spec.resources"), "{message}");

        let mapped = ["nvidia.com/gpu", "nvidia.com/mig-1g.10gb"];
        let c = check(&nodes, &mapped, &[], None, 1);
        let (block, message) = blocker(&c, false).unwrap();
        assert_eq!(block, Block::GpuSharingNotAcknowledged);
        assert!(message.contains("from 16 to 4 on 1 node(s)"), "{message}");
        assert!(message.contains("c: 16 on 4 GPU(s), 4 replicas per GPU"), "{message}");
        assert!(message.contains("spec.acknowledge.gpuSharingLoss: true"), "{message}");
        assert_eq!(blocker(&c, true), None);
    }

    /// (case, labels, advertised resources, mapped, sharesPerDevice, kept, lost, the blocker's
    /// numbers or the kept line's).
    type SharesCase = (
        &'static str,
        serde_json::Value,
        serde_json::Value,
        &'static [&'static str],
        u64,
        usize,
        usize,
        &'static str,
    );

    #[test]
    fn the_drivers_shares_keep_or_lose_the_device_plugins_slots() {
        let ts = |replicas: &str, count: &str| {
            json!({"nvidia.com/gpu.sharing-strategy": "time-slicing", "nvidia.com/gpu.replicas": replicas,
                "nvidia.com/gpu.count": count})
        };
        let cases: &[SharesCase] = &[
            (
                "equal: 2 GPUs sliced 4 ways, 4 shares",
                ts("4", "2"),
                json!({"nvidia.com/gpu": "8"}),
                MAPPED,
                4,
                1,
                0,
                "nvidia.com/gpu time-sliced 4x -> 4 shares per GPU (spec.driver.sharesPerDevice): no loss, 8 pods' slots before and after on 1 node(s)",
            ),
            (
                "more shares than replicas",
                ts("2", "2"),
                json!({"nvidia.com/gpu": "4"}),
                MAPPED,
                8,
                1,
                0,
                "time-sliced 2x -> 8 shares per GPU",
            ),
            (
                "fewer: sliced 4 ways, 2 shares",
                ts("4", "2"),
                json!({"nvidia.com/gpu": "8"}),
                MAPPED,
                2,
                0,
                1,
                "capacity drops from 8 to 4 on 1 node(s)",
            ),
            (
                "no shares: today's loss",
                ts("4", "2"),
                json!({"nvidia.com/gpu": "8"}),
                MAPPED,
                1,
                0,
                1,
                "capacity drops from 8 to 2 on 1 node(s)",
            ),
            (
                "MPS is never kept by time-sliced shares",
                json!({"nvidia.com/gpu.sharing-strategy": "mps", "nvidia.com/gpu.replicas": "4", "nvidia.com/gpu.count": "2"}),
                json!({"nvidia.com/gpu": "8"}),
                MAPPED,
                4,
                0,
                1,
                "shared through MPS on 1 node(s) (n: 8 on 2 GPU(s), mps, 4 replicas per GPU): the DRA driver shares by time-slicing",
            ),
            (
                "renamed, ways unknown: not kept",
                json!({}),
                json!({"nvidia.com/gpu.shared": "8"}),
                &["nvidia.com/gpu.shared"],
                4,
                0,
                1,
                "replicas unknown",
            ),
            (
                "renamed with GFD's labels: kept under its own name",
                json!({"nvidia.com/gpu.sharing-strategy": "time-slicing", "nvidia.com/gpu.replicas": "2",
                    "nvidia.com/gpu.count": "2", "nvidia.com/gpu.product": "H100"}),
                json!({"nvidia.com/gpu.shared": "4"}),
                &["nvidia.com/gpu.shared"],
                2,
                1,
                0,
                "nvidia.com/gpu.shared time-sliced 2x -> 2 shares per GPU",
            ),
            (
                "a MIG profile sliced 2 ways, its devices shared 2 ways",
                json!({"nvidia.com/mig-1g.10gb.sharing-strategy": "time-slicing",
                    "nvidia.com/mig-1g.10gb.replicas": "2", "nvidia.com/mig-1g.10gb.count": "7"}),
                json!({"nvidia.com/mig-1g.10gb": "14"}),
                &["nvidia.com/mig-1g.10gb"],
                2,
                1,
                0,
                "nvidia.com/mig-1g.10gb time-sliced 2x -> 2 shares per device",
            ),
            (
                "a MIG profile sliced 3 ways, 2 shares",
                json!({"nvidia.com/mig-1g.10gb.sharing-strategy": "time-slicing",
                    "nvidia.com/mig-1g.10gb.replicas": "3", "nvidia.com/mig-1g.10gb.count": "7"}),
                json!({"nvidia.com/mig-1g.10gb": "21"}),
                &["nvidia.com/mig-1g.10gb"],
                2,
                0,
                1,
                "nvidia.com/mig-1g.10gb capacity drops from 21 to 14",
            ),
        ];
        for (case, labels, advertised, mapped, shares, kept, lost, text) in cases {
            let n = node("n", labels.clone(), advertised.clone());
            let c = check([&n], mapped, &[], None, *shares);
            assert_eq!((c.kept.len(), c.shared.len()), (*kept, *lost), "{case}: {c:?}");
            let said = match blocker(&c, false) {
                Some((block, message)) => {
                    assert_eq!(block, Block::GpuSharingNotAcknowledged, "{case}");
                    assert!(message.contains("spec.driver.sharesPerDevice"), "{case}: {message}");
                    message
                }
                None => kept_summary(&c).expect("a kept line"),
            };
            assert!(said.contains(text), "{case}: {said}");
            // Acknowledged, nothing blocks; kept, nothing needed acknowledging.
            assert_eq!(blocker(&c, true), None, "{case}");
        }
    }

    #[test]
    fn a_renamed_node_restarting_its_plugin_counts_only_the_name_it_serves() {
        // NVIDIA's config-manager started the plugin on the default config, then on `renamed`:
        // the kubelet keeps nvidia.com/gpu capacity for 5 minutes. While the plugin's pod restarts
        // (Managed placement), neither name is allocatable; GFD's product says which is served.
        let labels = json!({"nvidia.com/gpu.sharing-strategy": "time-slicing", "nvidia.com/gpu.replicas": "2",
            "nvidia.com/gpu.count": "2", "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"});
        let restarting: SlimNode = serde_json::from_value(json!({
            "metadata": {"name": "renamed", "labels": labels},
            "status": {"capacity": {"nvidia.com/gpu": "4", "nvidia.com/gpu.shared": "4"},
                       "allocatable": {"nvidia.com/gpu": "0", "nvidia.com/gpu.shared": "0"}},
        }))
        .unwrap();
        let mapped = ["nvidia.com/gpu", "nvidia.com/gpu.shared"];
        assert_eq!(
            gpus_to_publish(&restarting, &mapped, None),
            BTreeMap::from([("nvidia.com/gpu".to_string(), 0), ("nvidia.com/gpu.shared".to_string(), 2)])
        );
        assert_eq!(sharing_of(&restarting, "nvidia.com/gpu"), None);
        assert_eq!(sharing_of(&restarting, "nvidia.com/gpu.shared").map(|s| s.physical), Some(2));
        // The time-sliced node that keeps the name: its product says so, nothing is stale.
        let mut kept = restarting.clone();
        kept.labels_mut().insert("nvidia.com/gpu.product".into(), "NVIDIA-H100-80GB-HBM3-SHARED".into());
        assert_eq!(gpus_to_publish(&kept, &mapped, None)["nvidia.com/gpu"], 2);
    }

    #[test]
    fn nodes_already_on_dra_are_not_judged() {
        let mut moved =
            node("m", json!({"nvidia.com/gpu.replicas": "4"}), json!({"nvidia.com/mig-1g.10gb": "7"}));
        moved.labels_mut().insert(crate::well_known::LABEL_GPU_BACKEND.into(), "dra".into());
        assert_eq!(check([&moved], MAPPED, &[], None, 1), Check::default());
    }

    #[test]
    fn a_shared_node_must_publish_its_physical_gpus_only() {
        let shared = node(
            "s",
            json!({"nvidia.com/gpu.sharing-strategy": "time-slicing", "nvidia.com/gpu.replicas": "4"}),
            json!({"nvidia.com/gpu": "32"}),
        );
        assert_eq!(gpus_to_publish(&shared, MAPPED, None)["nvidia.com/gpu"], 8);
        let plain = node("p", json!({}), json!({"nvidia.com/gpu": "8"}));
        assert_eq!(gpus_to_publish(&plain, MAPPED, None)["nvidia.com/gpu"], 8);
    }

    #[test]
    fn a_node_no_device_plugin_serves_counts_what_gfd_labelled() {
        let mapped = &["nvidia.com/gpu", "nvidia.com/mig-1g.10gb"];
        // (case, labels, advertised, expected nvidia.com/gpu to publish)
        let cases = [
            (
                "joined after the plugin went, GFD labelled it",
                json!({"nvidia.com/gpu.count": "4"}),
                json!({}),
                4,
            ),
            ("no plugin and no label: unknown", json!({}), json!({}), 0),
            (
                "the plugin serves it: its count wins over the label",
                json!({"nvidia.com/gpu.count": "4"}),
                json!({"nvidia.com/gpu": "3"}),
                3,
            ),
            (
                "the plugin serves only MIG devices (mixed strategy): no full GPU to add",
                json!({"nvidia.com/gpu.count": "1"}),
                json!({"nvidia.com/mig-1g.10gb": "7"}),
                0,
            ),
        ];
        for (case, labels, advertised, want) in cases {
            let n = node("n", labels, advertised);
            assert_eq!(gpus_to_publish(&n, mapped, None)["nvidia.com/gpu"], want, "{case}");
        }
        // A device plugin config that renames full GPUs: GFD's count is still the node's GPUs.
        let joined = node("n", json!({"nvidia.com/gpu.count": "4"}), json!({}));
        // (case, mapped resources, expected counts)
        type Case<'a> = (&'a str, &'a [&'a str], &'a [(&'a str, u64)]);
        let renamed: [Case; 4] = [
            ("the one renamed resource", &["nvidia.com/a100"], &[("nvidia.com/a100", 4)]),
            (
                "nvidia.com/gpu beside a renamed one: the count is nvidia.com/gpu's",
                &["nvidia.com/a100", "nvidia.com/gpu"],
                &[("nvidia.com/a100", 0), ("nvidia.com/gpu", 4)],
            ),
            (
                "two renamed resources: which one GFD counts is unknown",
                &["nvidia.com/a100", "nvidia.com/h100"],
                &[("nvidia.com/a100", 0), ("nvidia.com/h100", 0)],
            ),
            (
                "one MIG profile: GFD counts GPUs, not MIG devices",
                &["nvidia.com/mig-1g.10gb"],
                &[("nvidia.com/mig-1g.10gb", 0)],
            ),
        ];
        for (case, mapped, want) in renamed {
            let want: BTreeMap<String, u64> = want.iter().map(|(r, n)| ((*r).to_owned(), *n)).collect();
            assert_eq!(gpus_to_publish(&joined, mapped, None), want, "{case}");
        }
    }
}
