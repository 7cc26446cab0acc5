//! DeviceClass selectors against the devices a driver publishes. Each `spec.resources` entry's
//! selector (ANDed with the driver match, as its DeviceClass carries it) is evaluated on the
//! devices of the driver's ResourceSlices with the Kubernetes CEL library, the way the scheduler
//! evaluates a class: a device that makes the expression fail does not match. A switch counts only
//! the devices the pool's classes select, and `switchyard plan` reports what each class would
//! select, or, before the driver publishes anything, which of the attributes a selector reads the
//! driver is known to publish.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use k8s_openapi::api::resource::v1::{Device, ResourceSlice};
use kube::core::cel::KubeCelExt;
use kube::core::cel::cel::{Context, Program, Value};
use switchyard_api::sharing::{claims_per_device, describe};

use crate::api::v1alpha1::GpuPoolMigrationSpec;
use crate::pool::device_classes::selector_expression;
use crate::well_known::DEFAULT_DRIVER_NAME;

/// The domain of the standard attributes every driver may publish (`resource.kubernetes.io/...`).
pub const STANDARD_DOMAIN: &str = "resource.kubernetes.io";

/// The attributes a known GPU driver publishes, for selectors checked before it publishes any
/// slice. NVIDIA's `gpu.nvidia.com` (kubernetes-sigs/dra-driver-nvidia-gpu) and Switchyard's driver
/// publish the same names for full GPUs and MIG devices; NVIDIA's adds `addressingMode` on some
/// GPUs. The standard ones are `resource.kubernetes.io/pciBusID`, `pcieRoot` and `numaNode`.
fn known_attributes(driver: &str) -> Option<BTreeSet<(String, String)>> {
    const GPU_AND_MIG: [&str; 10] = [
        "type",
        "uuid",
        "productName",
        "brand",
        "architecture",
        "cudaComputeCapability",
        "driverVersion",
        "cudaDriverVersion",
        "parentUUID",
        "profile",
    ];
    let extra: &[&str] = match driver {
        DEFAULT_DRIVER_NAME => &[],
        "gpu.nvidia.com" => &["addressingMode"],
        _ => return None,
    };
    let own = GPU_AND_MIG.iter().chain(extra).map(|n| (driver.to_string(), n.to_string()));
    let standard =
        ["pciBusID", "pcieRoot", "numaNode"].iter().map(|n| (STANDARD_DOMAIN.to_string(), n.to_string()));
    Some(own.chain(standard).collect())
}

/// One class's compiled selector.
struct Class {
    resource: String,
    class: String,
    /// `Err` when this CEL engine cannot compile what the API server accepted: the switch then
    /// counts every device of the driver, as before classes were evaluated here.
    program: Result<Program, String>,
}

/// The pool's class selectors, compiled once per reconcile.
pub struct Selectors {
    driver: String,
    classes: Vec<Class>,
    root: Context<'static>,
    /// `semver(v)` and `quantity(v)`, compiled once: a version attribute or a capacity of every
    /// device goes through one of them.
    semver: Option<Program>,
    quantity: Option<Program>,
}

/// What one class makes of a set of devices.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClassMatch {
    /// Devices looked at.
    pub devices: u64,
    /// Devices the selector selects.
    pub selected: u64,
    /// The first evaluation error, with the device it came from: such devices do not match.
    pub first_error: Option<String>,
    /// The selector could not be compiled here; every device counts as selected.
    pub uncompiled: Option<String>,
    /// The fewest claims one selected device can be allocated to
    /// ([`switchyard_api::sharing::claims_per_device`]); `None` when none is selected.
    pub fewest_claims: Option<u64>,
}

/// What a switching node's DRA devices give the pool, for [`crate::node::state::Observed`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Selected {
    /// Per resource, the devices its class selects, capped at what the resource had before the
    /// switch, summed: the switch is done when it reaches the sum of `gpus-before`.
    pub counted: u64,
    /// What is short, and why, for the node's message; empty when nothing is.
    pub note: String,
    /// Resources found shared at the switch and counted as complete (acknowledged), one line
    /// each, for the node's event.
    pub shared: Vec<String>,
}

/// What a switch knows of the node's publication besides its devices.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Published {
    /// Every slice of the node's pool is there (as many as `resourceSliceCount`, one generation).
    pub complete: bool,
    /// `spec.acknowledge.gpuSharingLoss`.
    pub sharing_acknowledged: bool,
    /// `spec.driver.sharesPerDevice`: each selected device must take this many claims.
    pub shares: u64,
}

impl Selectors {
    pub fn new(spec: &GpuPoolMigrationSpec) -> Self {
        let classes = spec
            .resources
            .iter()
            .map(|r| Class {
                resource: r.extended_resource_name.clone(),
                class: r.device_class_name.clone(),
                program: Program::compile(&selector_expression(&spec.driver.name, r))
                    .map_err(|e| e.to_string()),
            })
            .collect();
        Self {
            driver: spec.driver.name.clone(),
            classes,
            root: Context::default().with_all(),
            semver: Program::compile("semver(v)").ok(),
            quantity: Program::compile("quantity(v)").ok(),
        }
    }

    /// Evaluates every class on `devices`, in `spec.resources` order.
    pub fn evaluate<'d>(&self, devices: impl IntoIterator<Item = &'d Device>) -> Vec<ClassMatch> {
        let (values, claims): (Vec<(&str, Value)>, Vec<u64>) = devices
            .into_iter()
            .map(|d| ((d.name.as_str(), self.device_value(d)), claims_per_device(d)))
            .unzip();
        self.classes
            .iter()
            .map(|c| {
                let mut m = ClassMatch { devices: values.len() as u64, ..Default::default() };
                let program = match &c.program {
                    Ok(p) => p,
                    Err(e) => {
                        m.selected = m.devices;
                        m.fewest_claims = claims.iter().copied().min();
                        m.uncompiled = Some(e.clone());
                        return m;
                    }
                };
                for ((name, device), claims) in values.iter().zip(&claims) {
                    let mut scope = self.root.new_inner_scope();
                    scope.add_variable_from_value("device", device.clone());
                    match program.execute(&scope) {
                        Ok(Value::Bool(true)) => {
                            m.selected += 1;
                            m.fewest_claims = Some(m.fewest_claims.map_or(*claims, |f| f.min(*claims)));
                        }
                        Ok(Value::Bool(false)) => {}
                        Ok(other) => {
                            m.first_error.get_or_insert_with(|| {
                                format!("on device {name} it gives {other:?}, not a bool")
                            });
                        }
                        Err(e) => {
                            m.first_error.get_or_insert_with(|| format!("on device {name}: {e}"));
                        }
                    }
                }
                m
            })
            .collect()
    }

    /// For each class, in `spec.resources` order, whether it selects `device`: what a device of a
    /// Replace migration's target pool can serve. A selector this engine cannot compile selects
    /// every device, as [`Selectors::evaluate`] counts it; one that fails on the device does not.
    pub fn serves(&self, device: &Device) -> Vec<bool> {
        let value = self.device_value(device);
        self.classes
            .iter()
            .map(|c| match &c.program {
                Err(_) => true,
                Ok(p) => {
                    let mut scope = self.root.new_inner_scope();
                    scope.add_variable_from_value("device", value.clone());
                    matches!(p.execute(&scope), Ok(Value::Bool(true)))
                }
            })
            .collect()
    }

    /// The devices of a switching node that the pool's classes select, against `before` (the
    /// node's `gpus-before`, per resource). Only devices the scheduler may allocate are passed in.
    ///
    /// A resource the device plugin advertised an exact multiple (2 or more) of the devices its
    /// class selects, on a node whose slices are all published, was shared without the labels
    /// that would have said so before the move (no GPU Feature Discovery). `sharing_acknowledged`
    /// (`spec.acknowledge.gpuSharingLoss`) lets it count as complete; otherwise the note asks.
    pub fn for_switch<'d>(
        &self,
        devices: impl IntoIterator<Item = &'d Device>,
        before: &BTreeMap<String, u64>,
        published: Published,
    ) -> Selected {
        let matches = self.evaluate(devices);
        let mut out = Selected::default();
        let mut short = Vec::new();
        for (c, m) in self.classes.iter().zip(&matches) {
            let need = before.get(&c.resource).copied().unwrap_or(0);
            let claims = m.fewest_claims.unwrap_or(1);
            if published.shares > 1 && m.selected > 0 && claims < published.shares {
                // Devices that share fewer ways than the pool was judged by would lose slots the
                // capacity check counted as kept: they do not count until the driver shares more.
                short.push(format!(
                    "DeviceClass {} selects {} device(s) for {}, but one of them can be allocated to only {}, and spec.driver.sharesPerDevice is {}: configure the driver to share each device {} ways (Switchyard's agent: --shares-per-device or the node label {}; NVIDIA's: --consumable-shares)",
                    c.class,
                    m.selected,
                    c.resource,
                    describe(claims),
                    published.shares,
                    published.shares,
                    crate::well_known::LABEL_GPU_SHARES
                ));
                continue;
            }
            let ways = (published.complete && m.selected > 0 && m.selected < need && need % m.selected == 0)
                .then(|| need / m.selected);
            if let Some(k) = ways.filter(|k| claims >= *k) {
                // Shared without labels to say so, and the driver shares each device as many ways.
                out.counted += need;
                out.shared.push(format!(
                    "{} was advertised {need} times on the {} device(s) DeviceClass {} selects, each of which can be allocated to {}: the {k}-way sharing is kept",
                    c.resource,
                    m.selected,
                    c.class,
                    describe(claims)
                ));
                continue;
            }
            if let Some(k) = ways {
                let line = format!(
                    "{} was advertised {need} times on the {} device(s) DeviceClass {} selects: shared {k} ways without labels to say so (or {} device(s) are missing)",
                    c.resource,
                    m.selected,
                    c.class,
                    need - m.selected
                );
                if published.sharing_acknowledged {
                    out.counted += need;
                    out.shared
                        .push(format!("{line}; counted as {} (spec.acknowledge.gpuSharingLoss)", m.selected));
                } else {
                    out.counted += m.selected;
                    short.push(format!("{line}; set spec.acknowledge.gpuSharingLoss: true if it was shared"));
                }
                continue;
            }
            out.counted += m.selected.min(need);
            if m.selected < need {
                let mut line = format!(
                    "DeviceClass {} selects {} of them for {} (need {need})",
                    c.class, m.selected, c.resource
                );
                if let Some(e) = &m.first_error {
                    line.push_str(&format!(", its selector fails {e}"));
                }
                short.push(line);
            }
        }
        out.note = short.join("; ");
        out
    }

    /// The device as the scheduler's CEL sees it: `device.driver`, `device.attributes[domain][name]`
    /// (unqualified names in the driver's domain; versions as `semver`), `device.capacity[domain][name]`
    /// (as `quantity`) and `device.allowMultipleAllocations`. The driver's domain and the standard one
    /// are always present, so `has()` on an attribute of theirs is false rather than an error.
    fn device_value(&self, d: &Device) -> Value {
        let mut attributes: HashMap<String, HashMap<String, Value>> = HashMap::new();
        attributes.entry(self.driver.clone()).or_default();
        attributes.entry(STANDARD_DOMAIN.to_string()).or_default();
        for (qualified, a) in d.attributes.iter().flatten() {
            let (domain, name) = self.split(qualified);
            let value = if let Some(v) = &a.string {
                Value::from(v.clone())
            } else if let Some(v) = a.int {
                Value::Int(v)
            } else if let Some(v) = a.bool {
                Value::Bool(v)
            } else if let Some(v) = &a.version {
                self.convert(self.semver.as_ref(), v)
            } else {
                continue;
            };
            attributes.entry(domain).or_default().insert(name, value);
        }
        let mut capacity: HashMap<String, HashMap<String, Value>> = HashMap::new();
        capacity.entry(self.driver.clone()).or_default();
        for (qualified, c) in d.capacity.iter().flatten() {
            let (domain, name) = self.split(qualified);
            capacity
                .entry(domain)
                .or_default()
                .insert(name, self.convert(self.quantity.as_ref(), &c.value.0));
        }
        let to_map = |m: HashMap<String, HashMap<String, Value>>| -> Value {
            Value::from(m.into_iter().map(|(k, v)| (k, Value::from(v))).collect::<HashMap<String, Value>>())
        };
        Value::from(HashMap::from([
            ("driver".to_string(), Value::from(self.driver.clone())),
            ("attributes".to_string(), to_map(attributes)),
            ("capacity".to_string(), to_map(capacity)),
            (
                "allowMultipleAllocations".to_string(),
                Value::Bool(d.allow_multiple_allocations.unwrap_or(false)),
            ),
        ]))
    }

    /// `domain/name` → (domain, name); an unqualified name is in the driver's domain.
    fn split(&self, qualified: &str) -> (String, String) {
        match qualified.rsplit_once('/') {
            Some((domain, name)) => (domain.to_string(), name.to_string()),
            None => (self.driver.clone(), qualified.to_string()),
        }
    }

    /// `semver('1.2.3')` or `quantity('80Gi')` as the CEL library builds it; the plain string when
    /// it does not parse (a selector comparing it then fails, as on the API server).
    fn convert(&self, program: Option<&Program>, raw: &str) -> Value {
        let Some(program) = program else {
            return Value::from(raw.to_string());
        };
        let mut scope = self.root.new_inner_scope();
        scope.add_variable_from_value("v", Value::from(raw.to_string()));
        program.execute(&scope).unwrap_or_else(|_| Value::from(raw.to_string()))
    }
}

/// The `(domain, name)` attribute references in a CEL expression: `device.attributes['d'].n`,
/// `device.attributes["d"]["n"]`, and the same with `has(...)`. A plain scanner, not a CEL
/// parser: it finds what selectors are written with and misses what they are not.
pub fn attribute_refs(expression: &str) -> Vec<(String, String)> {
    const HEAD: &str = "device.attributes";
    let mut out = Vec::new();
    let mut rest = expression;
    while let Some(at) = rest.find(HEAD) {
        rest = &rest[at + HEAD.len()..];
        let Some((domain, after)) = quoted_index(rest) else { continue };
        let after = after.trim_start();
        let name = if let Some(field) = after.strip_prefix('.') {
            let field = field.trim_start();
            let end = field.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(field.len());
            (end > 0).then(|| field[..end].to_string())
        } else {
            quoted_index(after).map(|(n, _)| n)
        };
        if let Some(name) = name {
            out.push((domain, name));
        }
    }
    out.sort();
    out.dedup();
    out
}

/// `['x']` or `["x"]` at the start of `s` (after spaces): the string and what follows.
fn quoted_index(s: &str) -> Option<(String, &str)> {
    let s = s.trim_start().strip_prefix('[')?.trim_start();
    let quote = s.chars().next().filter(|c| *c == '\'' || *c == '"')?;
    let body = &s[1..];
    let end = body.find(quote)?;
    let after = body[end + 1..].trim_start().strip_prefix(']')?;
    Some((body[..end].to_string(), after))
}

/// A selector's attribute references judged against what the driver publishes (`published`:
/// every `(domain, name)` seen on its devices) or, when it publishes nothing yet, against what a
/// known driver publishes. Returns the problems; `None` when there is nothing to judge against.
pub fn unknown_attributes(
    driver: &str,
    expression: &str,
    published: &BTreeSet<(String, String)>,
) -> Option<Vec<String>> {
    let known = if published.is_empty() { known_attributes(driver)? } else { published.clone() };
    let refs = attribute_refs(expression);
    let domains: BTreeSet<&str> = known.iter().map(|(d, _)| d.as_str()).collect();
    Some(
        refs.iter()
            .filter(|r| !known.contains(r))
            .map(|(d, n)| {
                if !domains.contains(d.as_str()) {
                    format!(
                        "reads device.attributes['{d}'].{n}, but {driver} publishes its attributes under '{driver}' (and the standard '{STANDARD_DOMAIN}'), not '{d}'"
                    )
                } else {
                    let names: Vec<&str> =
                        known.iter().filter(|(kd, _)| kd == d).map(|(_, kn)| kn.as_str()).collect();
                    format!("reads device.attributes['{d}'].{n}, which {driver} does not publish (it publishes {})", names.join(", "))
                }
            })
            .collect(),
    )
}

/// Every `(domain, name)` attribute on the devices of `slices`.
pub fn published_attributes(driver: &str, slices: &[ResourceSlice]) -> BTreeSet<(String, String)> {
    slices
        .iter()
        .filter(|s| s.spec.driver == driver)
        .flat_map(|s| s.spec.devices.iter().flatten())
        .flat_map(|d| d.attributes.iter().flatten().map(|(k, _)| k))
        .map(|k| match k.rsplit_once('/') {
            Some((d, n)) => (d.to_string(), n.to_string()),
            None => (driver.to_string(), k.clone()),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn spec(driver: &str, selectors: &[(&str, &str, Option<&str>)]) -> GpuPoolMigrationSpec {
        let resources: Vec<_> = selectors
            .iter()
            .map(|(r, c, s)| json!({"extendedResourceName": r, "deviceClassName": c, "selector": s}))
            .collect();
        serde_json::from_value(json!({
            "nodeSelector": {"matchLabels": {"pool": "a"}},
            "resources": resources,
            "driver": {"name": driver, "daemonSet": {"namespace": "d", "name": "d"}},
            "devicePlugin": {"daemonSet": {"namespace": "p", "name": "p"}},
        }))
        .unwrap()
    }

    fn gpu(name: &str, driver_version: &str) -> Device {
        serde_json::from_value(json!({
            "name": name,
            "attributes": {
                "type": {"string": "gpu"},
                "productName": {"string": "NVIDIA H100 80GB HBM3"},
                "driverVersion": {"version": driver_version},
                "resource.kubernetes.io/numaNode": {"int": 1},
            },
            "capacity": {"memory": {"value": "80Gi"}},
        }))
        .unwrap()
    }

    fn mig(name: &str, profile: &str) -> Device {
        serde_json::from_value(json!({
            "name": name,
            "attributes": {"type": {"string": "mig"}, "profile": {"string": profile}},
        }))
        .unwrap()
    }

    const NV: &str = "gpu.nvidia.com";

    #[test]
    fn classes_select_what_the_scheduler_would() {
        let s = spec(
            NV,
            &[
                ("nvidia.com/gpu", "gpu", Some("device.attributes['gpu.nvidia.com'].type == 'gpu'")),
                (
                    "nvidia.com/mig-1g.10gb",
                    "mig",
                    Some(
                        "device.attributes['gpu.nvidia.com'].type == 'mig' && device.attributes['gpu.nvidia.com'].profile == '1g.10gb'",
                    ),
                ),
                (
                    "example.com/new-driver",
                    "new",
                    Some(
                        "device.attributes['gpu.nvidia.com'].driverVersion.isGreaterThan(semver('570.0.0')) && device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('40Gi')) > 0 && device.attributes['resource.kubernetes.io'].numaNode == 1",
                    ),
                ),
            ],
        );
        let devices = [
            gpu("gpu-0", "570.124.6"),
            gpu("gpu-1", "550.1.0"),
            mig("mig-0", "1g.10gb"),
            mig("mig-1", "3g.40gb"),
        ];
        let got = Selectors::new(&s).evaluate(devices.iter());
        let selected: Vec<u64> = got.iter().map(|m| m.selected).collect();
        assert_eq!(selected, [2, 1, 1], "{got:?}");
        // The MIG devices have no driverVersion: the third selector fails on them, as on the API
        // server, and they do not match.
        assert!(got[2].first_error.as_deref().is_some_and(|e| e.contains("mig-0")), "{got:?}");
        assert!(got.iter().all(|m| m.uncompiled.is_none() && m.devices == 4));
    }

    #[test]
    fn a_selector_for_another_driver_selects_nothing() {
        // The class ANDs the driver match: devices of gpu.nvidia.com never match a class for
        // gpu.switchyard.dev's attributes.
        let s = spec(
            NV,
            &[("nvidia.com/gpu", "gpu", Some("device.attributes['gpu.switchyard.dev'].type == 'gpu'"))],
        );
        let got = Selectors::new(&s).evaluate([gpu("gpu-0", "570.1.0")].iter());
        assert_eq!(got[0].selected, 0);
        assert!(got[0].first_error.is_some(), "a missing domain is an evaluation error: {got:?}");
    }

    #[test]
    fn the_switch_counts_selected_devices_per_resource_up_to_what_it_had() {
        let s = spec(
            NV,
            &[
                ("nvidia.com/gpu", "gpu", Some("device.attributes['gpu.nvidia.com'].type == 'gpu'")),
                (
                    "nvidia.com/mig-1g.10gb",
                    "mig",
                    Some("device.attributes['gpu.nvidia.com'].profile == '1g.10gb'"),
                ),
            ],
        );
        let devices = [gpu("a", "570.1.0"), gpu("b", "570.1.0"), gpu("c", "570.1.0"), mig("m", "1g.10gb")];
        let sel = Selectors::new(&s);
        let before =
            BTreeMap::from([("nvidia.com/gpu".to_string(), 2), ("nvidia.com/mig-1g.10gb".to_string(), 2)]);
        let got = sel.for_switch(devices.iter(), &before, Published::default());
        // Three GPUs count as the two it had; one MIG device of two.
        assert_eq!(got.counted, 3);
        assert!(
            got.note.contains("DeviceClass mig selects 1 of them for nvidia.com/mig-1g.10gb (need 2)"),
            "{}",
            got.note
        );
        assert!(got.note.contains("its selector fails on device"), "the GPUs have no profile: {}", got.note);
        let enough =
            BTreeMap::from([("nvidia.com/gpu".to_string(), 3), ("nvidia.com/mig-1g.10gb".to_string(), 1)]);
        assert_eq!(
            sel.for_switch(devices.iter(), &enough, Published::default()),
            Selected { counted: 4, ..Default::default() }
        );
    }

    /// `gpu(name)` published the way `--consumable-shares=<n>` publishes it.
    fn shared_gpu(name: &str, n: &str) -> Device {
        let mut d = gpu(name, "570.1.0");
        d.allow_multiple_allocations = Some(true);
        d.capacity = Some(serde_json::from_value(json!({
            "shares": {"value": n, "requestPolicy": {"default": "1", "validRange": {"min": "1", "max": n, "step": "1"}}},
            "memory": {"value": "80Gi", "requestPolicy": {"default": "0", "validRange": {"min": "0", "max": "80Gi", "step": "1Mi"}}},
        })).unwrap());
        d
    }

    #[test]
    fn the_switch_counts_devices_only_when_they_share_as_many_ways_as_declared() {
        let s =
            spec(NV, &[("nvidia.com/gpu", "gpu", Some("device.attributes['gpu.nvidia.com'].type == 'gpu'"))]);
        let sel = Selectors::new(&s);
        // GFD said 2 GPUs time-sliced 2 ways: gpus-before is the physical 2.
        let before = BTreeMap::from([("nvidia.com/gpu".to_string(), 2)]);
        let shares = |shares| Published { complete: true, sharing_acknowledged: false, shares };
        let two = [shared_gpu("a", "2"), shared_gpu("b", "2")];
        assert_eq!(
            sel.for_switch(two.iter(), &before, shares(2)),
            Selected { counted: 2, ..Default::default() }
        );
        assert_eq!(sel.evaluate(two.iter())[0].fewest_claims, Some(2));
        // One device shares fewer ways than declared: none counts, and the note says what to set.
        let mixed = [shared_gpu("a", "2"), gpu("b", "570.1.0")];
        let got = sel.for_switch(mixed.iter(), &before, shares(2));
        assert_eq!(got.counted, 0);
        assert!(
            got.note.contains("can be allocated to only 1 claim, and spec.driver.sharesPerDevice is 2"),
            "{}",
            got.note
        );
        assert!(got.note.contains("--shares-per-device"), "{}", got.note);
        // Nothing declared: whole devices count as they always did.
        assert_eq!(sel.for_switch(mixed.iter(), &before, shares(1)).counted, 2);
        // Sharing found only at the switch (no labels: the plugin advertised 4 on 2 GPUs) is kept
        // when the devices take as many claims each.
        let four = BTreeMap::from([("nvidia.com/gpu".to_string(), 4)]);
        let kept = sel.for_switch(two.iter(), &four, shares(1));
        assert_eq!((kept.counted, kept.note.as_str()), (4, ""));
        assert!(kept.shared[0].contains("the 2-way sharing is kept"), "{:?}", kept.shared);
    }

    #[test]
    fn sharing_without_labels_is_found_at_the_switch_and_counts_only_when_acknowledged() {
        let s =
            spec(NV, &[("nvidia.com/gpu", "gpu", Some("device.attributes['gpu.nvidia.com'].type == 'gpu'"))]);
        let devices = [gpu("a", "570.1.0"), gpu("b", "570.1.0")];
        let sel = Selectors::new(&s);
        // The device plugin advertised 4 on these 2 GPUs: time-sliced 2 ways, no GFD labels.
        let before = BTreeMap::from([("nvidia.com/gpu".to_string(), 4)]);
        let published =
            |complete, sharing_acknowledged| Published { complete, sharing_acknowledged, shares: 1 };
        let waiting = sel.for_switch(devices.iter(), &before, published(true, false));
        assert_eq!(waiting.counted, 2);
        assert!(
            waiting
                .note
                .contains("advertised 4 times on the 2 device(s) DeviceClass gpu selects: shared 2 ways"),
            "{}",
            waiting.note
        );
        assert!(waiting.note.contains("set spec.acknowledge.gpuSharingLoss: true"), "{}", waiting.note);
        let acknowledged = sel.for_switch(devices.iter(), &before, published(true, true));
        assert_eq!((acknowledged.counted, acknowledged.note.as_str()), (4, ""));
        assert_eq!(acknowledged.shared.len(), 1);
        // Slices still to come: nothing is concluded.
        let partial = sel.for_switch(devices.iter(), &before, published(false, true));
        assert_eq!(partial.counted, 2);
        assert!(partial.note.contains("selects 2 of them for nvidia.com/gpu (need 4)"), "{}", partial.note);
        // Not a whole multiple: devices are missing, not shared.
        let odd = BTreeMap::from([("nvidia.com/gpu".to_string(), 3)]);
        assert_eq!(sel.for_switch(devices.iter(), &odd, published(true, true)).counted, 2);
    }

    #[test]
    fn a_selector_this_engine_cannot_compile_counts_every_device() {
        let s = spec(NV, &[("nvidia.com/gpu", "gpu", Some("device.attributes[[["))]);
        let got = Selectors::new(&s).evaluate([gpu("a", "1.0.0")].iter());
        assert!(got[0].uncompiled.is_some());
        assert_eq!(got[0].selected, 1);
    }

    #[test]
    fn attribute_references_are_found_in_the_ways_selectors_write_them() {
        let refs = attribute_refs(
            "device.attributes['gpu.nvidia.com'].type == 'mig' && has(device.attributes[\"gpu.nvidia.com\"].profile) && device.attributes['resource.kubernetes.io']['numaNode'] == 0 && device.driver == 'x'",
        );
        let want: Vec<(String, String)> = [
            ("gpu.nvidia.com", "profile"),
            ("gpu.nvidia.com", "type"),
            ("resource.kubernetes.io", "numaNode"),
        ]
        .iter()
        .map(|(d, n)| (d.to_string(), n.to_string()))
        .collect();
        assert_eq!(refs, want);
    }

    #[test]
    fn unknown_attributes_are_named_with_what_the_driver_publishes() {
        let none = BTreeSet::new();
        // Before any slice: a known driver's catalog.
        let typo = unknown_attributes(NV, "device.attributes['gpu.nvidia.com'].typ == 'gpu'", &none).unwrap();
        assert_eq!(typo.len(), 1);
        assert!(typo[0].contains(".typ, which gpu.nvidia.com does not publish (it publishes"), "{typo:?}");
        let domain =
            unknown_attributes(NV, "device.attributes['gpu.switchyard.dev'].type == 'gpu'", &none).unwrap();
        assert!(domain[0].contains("publishes its attributes under 'gpu.nvidia.com'"), "{domain:?}");
        assert_eq!(
            unknown_attributes(NV, "device.attributes['gpu.nvidia.com'].addressingMode == 'x'", &none),
            Some(vec![])
        );
        // An unknown driver with nothing published: nothing to judge against.
        assert_eq!(
            unknown_attributes("gpu.example.com", "device.attributes['gpu.example.com'].x", &none),
            None
        );
        // Published attributes win over the catalog.
        let published = published_attributes(
            "gpu.example.com",
            &[serde_json::from_value(json!({
                "metadata": {"name": "s"},
                "spec": {"driver": "gpu.example.com", "nodeName": "n", "pool": {"name": "n", "generation": 1, "resourceSliceCount": 1},
                         "devices": [{"name": "d", "attributes": {"model": {"string": "x"}, "resource.kubernetes.io/numaNode": {"int": 0}}}]}
            }))
            .unwrap()],
        );
        assert_eq!(
            unknown_attributes(
                "gpu.example.com",
                "device.attributes['gpu.example.com'].model == 'x'",
                &published
            ),
            Some(vec![])
        );
        assert_eq!(
            unknown_attributes(
                "gpu.example.com",
                "device.attributes['gpu.example.com'].type == 'x'",
                &published
            )
            .map(|v| v.len()),
            Some(1)
        );
    }
}
