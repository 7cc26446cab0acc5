//! The device plugin's own config file, where GPU Feature Discovery does not label a node.
//!
//! NVIDIA's device plugin shares GPUs as its config file says (`sharing.timeSlicing` or
//! `sharing.mps`: each listed resource advertised `replicas` times, under a new name with
//! `rename` or `renameByDefault`). GFD turns that into the node labels [`crate::pool::capacity`]
//! reads; the device plugin's Helm chart does not run GFD by default, so a pool can share its GPUs
//! with no label saying so. This module reads the config where the DaemonSet takes it from, as
//! NVIDIA's chart and the GPU Operator render it:
//!
//! - a `config-manager` container (env `CONFIG_FILE_SRCDIR`) picks one key of a ConfigMap mounted
//!   at that directory for each node: the value of the node's label `NODE_LABEL`
//!   (`nvidia.com/device-plugin.config` by default), else `DEFAULT_CONFIG`, else
//!   `FALLBACK_STRATEGIES` in order (`named`: the key `default`; `single`: the only key; `empty`:
//!   no config);
//! - else a container's `--config-file` (or env `CONFIG_FILE`) names a file in a mounted ConfigMap.
//!
//! Pure: the caller reads the ConfigMap.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Container, PodSpec};
use kube::ResourceExt;
use serde::Deserialize;

use crate::node::slim::SlimNode;
use crate::pool::capacity::{SharedNode, advertised};
use crate::well_known::NVIDIA_GPU_RESOURCE;

/// The node label the config-manager reads by default.
pub const DEFAULT_NODE_LABEL: &str = "nvidia.com/device-plugin.config";
/// The key the `named` fallback looks for.
const NAMED_FALLBACK: &str = "default";

/// Where a device-plugin DaemonSet takes its config from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigSource {
    pub namespace: String,
    pub config_map: String,
    pub pick: Pick,
}

/// How a node's key of the ConfigMap is chosen.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Pick {
    /// NVIDIA's config-manager: by node label, then a default, then fallbacks.
    PerNode { node_label: String, default: Option<String>, fallbacks: Vec<String> },
    /// One file of the ConfigMap, for every node.
    Key(String),
}

/// Where `ds` takes the device plugin's config from, or `None` when it takes none from a
/// ConfigMap (flags and environment only: nothing shared by config).
pub fn source(ds: &DaemonSet) -> Option<ConfigSource> {
    let spec = ds.spec.template.spec.as_ref()?;
    let namespace = ds.namespace().unwrap_or_default();
    let containers = || spec.init_containers.iter().flatten().chain(&spec.containers);
    // The config-manager (an init container and a sidecar, both the same).
    let manager = containers().find_map(|c| env(c, "CONFIG_FILE_SRCDIR").map(|dir| (c, dir)));
    if let Some((c, dir)) = manager {
        let (config_map, _) = config_map_at(spec, c, &dir)?;
        let fallbacks = env(c, "FALLBACK_STRATEGIES")
            .map(|v| v.split(',').map(|s| s.trim().to_string()).filter(|s| !s.is_empty()).collect())
            .unwrap_or_default();
        return Some(ConfigSource {
            namespace,
            config_map,
            pick: Pick::PerNode {
                node_label: env(c, "NODE_LABEL").unwrap_or_else(|| DEFAULT_NODE_LABEL.to_string()),
                default: env(c, "DEFAULT_CONFIG").filter(|d| !d.is_empty()),
                fallbacks,
            },
        });
    }
    // A config file named on the device plugin itself.
    containers().find_map(|c| {
        let path = config_file_arg(c).or_else(|| env(c, "CONFIG_FILE"))?;
        let (config_map, key) = config_map_at(spec, c, &path)?;
        Some(ConfigSource { namespace: namespace.clone(), config_map, pick: Pick::Key(key?) })
    })
}

/// A container's literal env value (`valueFrom` is not followed).
fn env(c: &Container, name: &str) -> Option<String> {
    c.env.iter().flatten().find(|e| e.name == name).and_then(|e| e.value.clone())
}

/// `--config-file=PATH` or `--config-file PATH` in a container's command or args.
fn config_file_arg(c: &Container) -> Option<String> {
    let words: Vec<&String> = c.command.iter().flatten().chain(c.args.iter().flatten()).collect();
    words.iter().enumerate().find_map(|(i, w)| {
        let w = w.trim_start_matches('-');
        match w.strip_prefix("config-file") {
            Some(rest) if rest.starts_with('=') => Some(rest[1..].to_string()),
            Some("") => words.get(i + 1).map(|v| v.to_string()),
            _ => None,
        }
    })
}

/// The ConfigMap mounted in `c` at or above `path`, and the key `path` names in it (`None` for a
/// directory). `subPath` and `items` mounts are followed.
fn config_map_at(spec: &PodSpec, c: &Container, path: &str) -> Option<(String, Option<String>)> {
    let path = path.trim_end_matches('/');
    let mount = c
        .volume_mounts
        .iter()
        .flatten()
        .filter(|m| {
            let at = m.mount_path.trim_end_matches('/');
            path == at || path.starts_with(&format!("{at}/"))
        })
        .max_by_key(|m| m.mount_path.len())?;
    let volume = spec.volumes.iter().flatten().find(|v| v.name == mount.name)?;
    let cm = volume.config_map.as_ref()?;
    let at = mount.mount_path.trim_end_matches('/');
    let file = path.strip_prefix(at).unwrap_or("").trim_start_matches('/');
    let file = match mount.sub_path.as_deref().filter(|s| !s.is_empty()) {
        Some(sub) if file.is_empty() => sub.to_string(),
        Some(sub) => format!("{sub}/{file}"),
        None => file.to_string(),
    };
    let key = (!file.is_empty())
        .then(|| cm.items.iter().flatten().find(|i| i.path == file).map(|i| i.key.clone()).unwrap_or(file));
    Some((cm.name.clone(), key))
}

/// One resource the config shares.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Shared {
    /// The name the device plugin advertises it under: `rename`, `<name>.shared` under
    /// `renameByDefault`, else `name`.
    pub resource: String,
    /// `time-slicing` or `mps`.
    pub strategy: &'static str,
    pub replicas: u64,
    /// How many of the node's devices are shared: `None` for all of them.
    pub devices: Option<u64>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct File {
    sharing: SharingSection,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct SharingSection {
    time_slicing: Option<Replicated>,
    mps: Option<Replicated>,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct Replicated {
    rename_by_default: bool,
    resources: Vec<ReplicatedResource>,
}

#[derive(Deserialize)]
struct ReplicatedResource {
    name: String,
    #[serde(default)]
    rename: Option<String>,
    replicas: u64,
    #[serde(default)]
    devices: Option<serde_yaml::Value>,
}

/// The resources one config file shares. An error says what could not be read.
pub fn parse(text: &str) -> Result<Vec<Shared>, String> {
    let file: File = if text.trim().is_empty() {
        File::default()
    } else {
        serde_yaml::from_str(text).map_err(|e| e.to_string())?
    };
    let mut out = Vec::new();
    for (strategy, section) in [("time-slicing", file.sharing.time_slicing), ("mps", file.sharing.mps)] {
        let Some(section) = section else { continue };
        for r in section.resources {
            if r.replicas <= 1 {
                continue;
            }
            let resource = match r.rename.filter(|n| !n.is_empty()) {
                Some(n) => n,
                None if section.rename_by_default => format!("{}.shared", r.name),
                None => r.name.clone(),
            };
            let devices = match &r.devices {
                None => None,
                Some(serde_yaml::Value::String(s)) if s == "all" => None,
                Some(serde_yaml::Value::Sequence(list)) => Some(list.len() as u64),
                Some(serde_yaml::Value::Number(n)) => n.as_u64(),
                Some(other) => {
                    return Err(format!("{}: devices {other:?} is neither all, a count nor a list", r.name));
                }
            };
            out.push(Shared { resource, strategy, replicas: r.replicas, devices });
        }
    }
    Ok(out)
}

/// The device plugin's config as the cluster has it: its source and, per key of the ConfigMap,
/// what that file shares.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PluginConfig {
    pub source: ConfigSource,
    /// `Err` when the ConfigMap could not be read (missing, refused).
    pub files: Result<BTreeMap<String, Result<Vec<Shared>, String>>, String>,
}

impl PluginConfig {
    /// From the ConfigMap's data (`None`: it could not be read, with why).
    pub fn new(source: ConfigSource, data: Result<BTreeMap<String, String>, String>) -> Self {
        let files = data.map(|d| d.into_iter().map(|(k, v)| (k.clone(), parse(&v))).collect());
        Self { source, files }
    }

    /// The key the device plugin on `node` runs with: `Ok(None)` for no config at all (the
    /// `empty` fallback), `Err` when the config-manager would fail too.
    pub fn key_for(&self, node: &SlimNode) -> Result<Option<String>, String> {
        let files = self.files.as_ref().map_err(Clone::clone)?;
        let present = |k: &str| files.contains_key(k);
        match &self.source.pick {
            Pick::Key(k) if present(k) => Ok(Some(k.clone())),
            Pick::Key(k) => Err(format!("it has no key {k}")),
            Pick::PerNode { node_label, default, fallbacks } => {
                if let Some(v) = node.labels().get(node_label).filter(|v| !v.is_empty()) {
                    return if present(v) {
                        Ok(Some(v.to_string()))
                    } else {
                        Err(format!("it has no key {v} ({node_label})"))
                    };
                }
                if let Some(d) = default {
                    return if present(d) {
                        Ok(Some(d.clone()))
                    } else {
                        Err(format!("it has no key {d} (DEFAULT_CONFIG)"))
                    };
                }
                for f in fallbacks {
                    match f.as_str() {
                        "named" if present(NAMED_FALLBACK) => return Ok(Some(NAMED_FALLBACK.to_string())),
                        "single" if files.len() == 1 => return Ok(files.keys().next().cloned()),
                        "empty" => return Ok(None),
                        _ => {}
                    }
                }
                Err("no node label, DEFAULT_CONFIG or fallback picks one of its keys".to_string())
            }
        }
    }

    /// `gpu-operator/time-slicing-config`, key `a100`.
    fn named(&self, key: &str) -> String {
        format!("the device plugin's config {}/{}, key {key}", self.source.namespace, self.source.config_map)
    }

    /// How the device plugin on `node` shares `resource` by its config, as [`SharedNode`], or
    /// `Ok(None)` when it does not. `Err` says why the config could not be judged for this node.
    pub fn shared_node(&self, node: &SlimNode, resource: &str) -> Result<Option<SharedNode>, String> {
        let Some(key) = self.key_for(node)? else { return Ok(None) };
        let files = self.files.as_ref().map_err(Clone::clone)?;
        let shared = files[&key].as_ref().map_err(|e| format!("{}: {e}", self.named(&key)))?;
        let now = advertised(node, resource);
        let Some(s) = shared.iter().find(|s| s.resource == resource) else { return Ok(None) };
        if now == 0 {
            return Ok(None);
        }
        let (one, unit) =
            if resource.starts_with(NVIDIA_GPU_RESOURCE) { ("GPU", "GPUs") } else { ("device", "devices") };
        // Each shared device is advertised `replicas` times, the others once.
        let physical = match s.devices {
            None => now.div_ceil(s.replicas),
            Some(k) => now.saturating_sub(k.saturating_mul(s.replicas - 1)).max(1),
        };
        let subset = s.devices.map(|k| format!(" on {k} of its {unit}")).unwrap_or_default();
        Ok(Some(SharedNode {
            node: node.name_any(),
            resource: resource.to_string(),
            advertised: now,
            physical: physical.min(now),
            how: format!("{}, {} replicas per {one}{subset} ({})", s.strategy, s.replicas, self.named(&key)),
            mps: s.strategy == "mps",
            known: true,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ds(template_spec: serde_json::Value) -> DaemonSet {
        serde_json::from_value(json!({
            "metadata": {"name": "nvdp", "namespace": "gpu"},
            "spec": {"selector": {}, "template": {"spec": template_spec}},
        }))
        .unwrap()
    }

    /// The pod template NVIDIA's chart renders with `config.map` (trimmed to what matters).
    fn chart(default: &str, fallbacks: &str) -> DaemonSet {
        let env = json!([
            {"name": "NODE_LABEL", "value": "nvidia.com/device-plugin.config"},
            {"name": "CONFIG_FILE_SRCDIR", "value": "/available-configs"},
            {"name": "CONFIG_FILE_DST", "value": "/config/config.yaml"},
            {"name": "DEFAULT_CONFIG", "value": default},
            {"name": "FALLBACK_STRATEGIES", "value": fallbacks},
        ]);
        let mounts = json!([{"name": "available-configs", "mountPath": "/available-configs"}, {"name": "config", "mountPath": "/config"}]);
        ds(json!({
            "initContainers": [{"name": "init", "command": ["config-manager"], "env": env, "volumeMounts": mounts}],
            "containers": [
                {"name": "sidecar", "command": ["config-manager"], "env": env, "volumeMounts": mounts},
                {"name": "plugin", "command": ["nvidia-device-plugin"], "env": [{"name": "CONFIG_FILE", "value": "/config/config.yaml"}], "volumeMounts": [{"name": "config", "mountPath": "/config"}]},
            ],
            "volumes": [{"name": "available-configs", "configMap": {"name": "nvdp-configs"}}, {"name": "config", "emptyDir": {}}],
        }))
    }

    #[test]
    fn the_source_is_found_where_nvidias_chart_and_a_plain_manifest_put_it() {
        let per_node = |default: Option<&str>, fallbacks: &[&str]| ConfigSource {
            namespace: "gpu".into(),
            config_map: "nvdp-configs".into(),
            pick: Pick::PerNode {
                node_label: DEFAULT_NODE_LABEL.into(),
                default: default.map(Into::into),
                fallbacks: fallbacks.iter().map(|s| s.to_string()).collect(),
            },
        };
        assert_eq!(source(&chart("", "named,single")), Some(per_node(None, &["named", "single"])));
        assert_eq!(source(&chart("a100", "")), Some(per_node(Some("a100"), &[])));
        let key = |k: &str| ConfigSource {
            namespace: "gpu".into(),
            config_map: "cfg".into(),
            pick: Pick::Key(k.into()),
        };
        let plain = |container: serde_json::Value, volume: serde_json::Value| {
            let mut c = container;
            c["name"] = json!("plugin");
            source(&ds(json!({"containers": [c], "volumes": [volume]})))
        };
        let cm = json!({"name": "v", "configMap": {"name": "cfg"}});
        let cases = [
            (
                "--config-file=PATH in a directory mount",
                json!({"args": ["--config-file=/etc/nvdp/config.yaml"], "volumeMounts": [{"name": "v", "mountPath": "/etc/nvdp"}]}),
                cm.clone(),
                Some(key("config.yaml")),
            ),
            (
                "--config-file PATH through subPath",
                json!({"args": ["--config-file", "/etc/config.yaml"], "volumeMounts": [{"name": "v", "mountPath": "/etc/config.yaml", "subPath": "ts"}]}),
                cm.clone(),
                Some(key("ts")),
            ),
            (
                "CONFIG_FILE through items",
                json!({"env": [{"name": "CONFIG_FILE", "value": "/cfg/file.yaml"}], "volumeMounts": [{"name": "v", "mountPath": "/cfg"}]}),
                json!({"name": "v", "configMap": {"name": "cfg", "items": [{"key": "time-slicing", "path": "file.yaml"}]}}),
                Some(key("time-slicing")),
            ),
            ("flags only", json!({"args": ["--mig-strategy=none"]}), cm.clone(), None),
            (
                "a config file on a host path",
                json!({"args": ["--config-file=/host/c.yaml"], "volumeMounts": [{"name": "h", "mountPath": "/host"}]}),
                json!({"name": "h", "hostPath": {"path": "/etc"}}),
                None,
            ),
        ];
        for (case, container, volume, want) in cases {
            assert_eq!(plain(container, volume), want, "{case}");
        }
    }

    #[test]
    fn parse_table() {
        type Case = (&'static str, &'static str, Result<Vec<Shared>, &'static str>);
        let cases: Vec<Case> = vec![
            ("empty", "", Ok(vec![])),
            ("flags only", "version: v1\nflags:\n  migStrategy: none\n", Ok(vec![])),
            (
                "time-slicing all GPUs",
                "version: v1\nsharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 4\n",
                Ok(vec![Shared {
                    resource: "nvidia.com/gpu".into(),
                    strategy: "time-slicing",
                    replicas: 4,
                    devices: None,
                }]),
            ),
            (
                "renameByDefault, a MIG profile, some devices",
                "sharing:\n  timeSlicing:\n    renameByDefault: true\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 2\n      devices: [0, 1]\n    - name: nvidia.com/mig-1g.10gb\n      replicas: 3\n      devices: all\n",
                Ok(vec![
                    Shared {
                        resource: "nvidia.com/gpu.shared".into(),
                        strategy: "time-slicing",
                        replicas: 2,
                        devices: Some(2),
                    },
                    Shared {
                        resource: "nvidia.com/mig-1g.10gb.shared".into(),
                        strategy: "time-slicing",
                        replicas: 3,
                        devices: None,
                    },
                ]),
            ),
            (
                "mps with an explicit rename; replicas 1 shares nothing",
                "sharing:\n  mps:\n    resources:\n    - name: nvidia.com/gpu\n      rename: nvidia.com/gpu.mps\n      replicas: 10\n  timeSlicing:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 1\n",
                Ok(vec![Shared {
                    resource: "nvidia.com/gpu.mps".into(),
                    strategy: "mps",
                    replicas: 10,
                    devices: None,
                }]),
            ),
            ("not YAML of a config", "sharing: [1, 2]", Err("sharing")),
        ];
        for (case, text, want) in cases {
            match (parse(text), want) {
                (Ok(got), Ok(want)) => assert_eq!(got, want, "{case}"),
                (Err(e), Err(fragment)) => assert!(e.contains(fragment), "{case}: {e}"),
                (got, want) => panic!("{case}: got {got:?}, want {want:?}"),
            }
        }
    }

    fn node(labels: serde_json::Value, capacity: serde_json::Value) -> SlimNode {
        serde_json::from_value(json!({
            "metadata": {"name": "gpu-1", "labels": labels},
            "status": {"capacity": capacity, "allocatable": capacity},
        }))
        .unwrap()
    }

    const TS4: &str =
        "sharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 4\n";
    const TS2_OF_2: &str = "sharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 2\n      devices: [0, 1]\n";

    #[test]
    fn each_node_is_judged_by_the_key_the_config_manager_picks_for_it() {
        let configs = |pick: Pick, data: &[(&str, &str)]| {
            PluginConfig::new(
                ConfigSource { namespace: "gpu".into(), config_map: "nvdp".into(), pick },
                Ok(data.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()),
            )
        };
        let per_node = |default: Option<&str>, fallbacks: &[&str]| Pick::PerNode {
            node_label: DEFAULT_NODE_LABEL.into(),
            default: default.map(Into::into),
            fallbacks: fallbacks.iter().map(|s| s.to_string()).collect(),
        };
        let labelled = |v: &str| node(json!({DEFAULT_NODE_LABEL: v}), json!({"nvidia.com/gpu": "32"}));
        let plain = node(json!({}), json!({"nvidia.com/gpu": "32"}));
        let two_configs = [("default", "version: v1\n"), ("ts", TS4)];
        // (case, config, node, want (advertised, physical, how fragment) | None | Err fragment)
        type Case =
            (&'static str, PluginConfig, SlimNode, Result<Option<(u64, u64, &'static str)>, &'static str>);
        let cases: Vec<Case> = vec![
            (
                "the node's label picks ts",
                configs(per_node(None, &["named"]), &two_configs),
                labelled("ts"),
                Ok(Some((
                    32,
                    8,
                    "time-slicing, 4 replicas per GPU (the device plugin's config gpu/nvdp, key ts)",
                ))),
            ),
            (
                "no label: the named fallback",
                configs(per_node(None, &["named"]), &two_configs),
                plain.clone(),
                Ok(None),
            ),
            (
                "no label: DEFAULT_CONFIG",
                configs(per_node(Some("ts"), &[]), &two_configs),
                plain.clone(),
                Ok(Some((32, 8, "key ts"))),
            ),
            (
                "single",
                configs(per_node(None, &["named", "single"]), &[("ts", TS4)]),
                plain.clone(),
                Ok(Some((32, 8, "4 replicas"))),
            ),
            ("empty", configs(per_node(None, &["empty"]), &two_configs), plain.clone(), Ok(None)),
            (
                "nothing picks",
                configs(per_node(None, &["named"]), &[("ts", TS4)]),
                plain.clone(),
                Err("no node label, DEFAULT_CONFIG or fallback"),
            ),
            (
                "a label naming a missing key",
                configs(per_node(None, &["named"]), &two_configs),
                labelled("h100"),
                Err("no key h100"),
            ),
            (
                "a fixed key",
                configs(Pick::Key("ts".into()), &two_configs),
                plain.clone(),
                Ok(Some((32, 8, "key ts"))),
            ),
            (
                "2 of 4 GPUs shared 2 ways: 6 advertised",
                configs(Pick::Key("p".into()), &[("p", TS2_OF_2)]),
                node(json!({}), json!({"nvidia.com/gpu": "6"})),
                Ok(Some((6, 4, "2 replicas per GPU on 2 of its GPUs"))),
            ),
            (
                "a file that does not parse",
                configs(Pick::Key("p".into()), &[("p", "sharing: [1]")]),
                plain.clone(),
                Err("the device plugin's config gpu/nvdp, key p"),
            ),
        ];
        for (case, config, node, want) in cases {
            let got = config.shared_node(&node, "nvidia.com/gpu");
            match (got, want) {
                (Ok(None), Ok(None)) => {}
                (Ok(Some(s)), Ok(Some((advertised, physical, how)))) => {
                    assert_eq!((s.advertised, s.physical), (advertised, physical), "{case}");
                    assert!(s.how.contains(how), "{case}: {}", s.how);
                }
                (Err(e), Err(fragment)) => assert!(e.contains(fragment), "{case}: {e}"),
                (got, want) => panic!("{case}: got {got:?}, want {want:?}"),
            }
        }
        // The switch waits for the physical GPUs the config implies, unless GFD labels the node.
        let ts = configs(Pick::Key("ts".into()), &two_configs);
        let publish =
            |n: &SlimNode| crate::pool::capacity::gpus_to_publish(n, &["nvidia.com/gpu"], Some(&ts));
        assert_eq!(publish(&plain)["nvidia.com/gpu"], 8);
        let gfd = node(json!({"nvidia.com/gpu.count": "32"}), json!({"nvidia.com/gpu": "32"}));
        assert_eq!(publish(&gfd)["nvidia.com/gpu"], 32, "GFD's labels say it is not shared");
        let unreadable = PluginConfig::new(
            ConfigSource { namespace: "gpu".into(), config_map: "nvdp".into(), pick: Pick::Key("k".into()) },
            Err("configmaps \"nvdp\" is forbidden".into()),
        );
        assert_eq!(
            unreadable.shared_node(&plain, "nvidia.com/gpu"),
            Err("configmaps \"nvdp\" is forbidden".into())
        );
    }
}
