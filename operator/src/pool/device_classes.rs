//! The DeviceClasses that serve each `spec.resources` entry through DRA, and which DeviceClass the
//! scheduler really uses for an extended resource name when several carry it.

use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1::{CELDeviceSelector, DeviceClass, DeviceClassSpec, DeviceSelector};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;

use crate::api::v1alpha1::{DeviceClassStatus, GpuPoolMigrationSpec, ResourceMapping};
use crate::well_known::{
    ANNOTATION_SCHEDULER_SYNC, LABEL_MANAGED_BY, LABEL_MIGRATION, OPERATOR_FIELD_MANAGER,
};

/// The CEL selector of a managed class: the driver match, ANDed with the entry's own selector.
pub fn selector_expression(driver: &str, entry: &ResourceMapping) -> String {
    let driver_match = format!("device.driver == '{driver}'");
    match entry.selector.as_deref().map(str::trim).filter(|s| !s.is_empty()) {
        Some(sel) => format!("{driver_match} && ({sel})"),
        None => driver_match,
    }
}

/// The DeviceClass Switchyard applies for one entry.
pub fn desired(spec: &GpuPoolMigrationSpec, migration: &str, entry: &ResourceMapping) -> DeviceClass {
    DeviceClass {
        metadata: ObjectMeta {
            name: Some(entry.device_class_name.clone()),
            labels: Some(BTreeMap::from([
                (LABEL_MANAGED_BY.to_string(), OPERATOR_FIELD_MANAGER.to_string()),
                (LABEL_MIGRATION.to_string(), migration.to_string()),
            ])),
            ..Default::default()
        },
        spec: Some(DeviceClassSpec {
            selectors: Some(vec![DeviceSelector {
                cel: Some(CELDeviceSelector { expression: selector_expression(&spec.driver.name, entry) }),
            }]),
            extended_resource_name: Some(entry.extended_resource_name.clone()),
            ..Default::default()
        }),
    }
}

/// Every DeviceClass Switchyard applies for a migration.
pub fn desired_all(spec: &GpuPoolMigrationSpec, migration: &str) -> Vec<DeviceClass> {
    spec.resources.iter().map(|e| desired(spec, migration, e)).collect()
}

/// The other classes that carry `extended_resource_name`, sorted.
pub fn peers(existing: &[ClassInfo], ours: &str, extended_resource_name: &str) -> Vec<String> {
    let mut names: Vec<String> = existing
        .iter()
        .filter(|c| c.name != ours && c.extended_resource_name.as_deref() == Some(extended_resource_name))
        .map(|c| c.name.clone())
        .collect();
    names.sort();
    names
}

/// The [`ANNOTATION_SCHEDULER_SYNC`] value: the migration's uid and the peers of the class.
pub fn scheduler_sync(migration_uid: &str, peers: &[String]) -> String {
    format!("{migration_uid};{}", peers.join(","))
}

/// Like [`desired_all`], each class annotated with [`ANNOTATION_SCHEDULER_SYNC`], so that a new
/// owner, or a peer class appearing or going away, re-applies it and the scheduler maps the
/// extended resource name to it again (see the annotation's docs for the scheduler behaviour).
pub fn desired_all_synced(
    spec: &GpuPoolMigrationSpec,
    migration: &str,
    migration_uid: &str,
    existing: &[ClassInfo],
) -> Vec<DeviceClass> {
    spec.resources
        .iter()
        .map(|e| {
            let mut dc = desired(spec, migration, e);
            let value = scheduler_sync(
                migration_uid,
                &peers(existing, &e.device_class_name, &e.extended_resource_name),
            );
            dc.metadata.annotations = Some(BTreeMap::from([(ANNOTATION_SCHEDULER_SYNC.to_string(), value)]));
            dc
        })
        .collect()
}

/// The parts of an existing DeviceClass the scheduler's choice depends on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClassInfo {
    pub name: String,
    pub extended_resource_name: Option<String>,
    pub created: Option<Timestamp>,
}

impl From<&DeviceClass> for ClassInfo {
    fn from(dc: &DeviceClass) -> Self {
        Self {
            name: dc.metadata.name.clone().unwrap_or_default(),
            extended_resource_name: dc.spec.as_ref().and_then(|s| s.extended_resource_name.clone()),
            created: dc.metadata.creation_timestamp.as_ref().map(|t| t.0),
        }
    }
}

/// The class the scheduler uses for `extended_resource_name`, exactly as it picks: the most
/// recently created class wins, and among classes created in the same second the name that
/// sorts first wins. Classes without a creation time (not yet persisted) do not compete.
pub fn winner<'a>(classes: &'a [ClassInfo], extended_resource_name: &str) -> Option<&'a ClassInfo> {
    classes
        .iter()
        .filter(|c| c.extended_resource_name.as_deref() == Some(extended_resource_name))
        .filter(|c| c.created.is_some())
        .max_by(|a, b| a.created.cmp(&b.created).then_with(|| b.name.cmp(&a.name)))
}

/// `status.deviceClasses`: for each entry, whether our class exists and wins its name.
pub fn statuses(spec: &GpuPoolMigrationSpec, existing: &[ClassInfo]) -> Vec<DeviceClassStatus> {
    spec.resources
        .iter()
        .map(|e| {
            let ours_exists = existing.iter().any(|c| {
                c.name == e.device_class_name
                    && c.extended_resource_name.as_deref() == Some(e.extended_resource_name.as_str())
            });
            let win = winner(existing, &e.extended_resource_name);
            let effective = ours_exists && win.is_some_and(|w| w.name == e.device_class_name);
            let shadowed_by = match win {
                Some(w) if w.name != e.device_class_name => w.name.clone(),
                _ => String::new(),
            };
            DeviceClassStatus {
                name: e.device_class_name.clone(),
                extended_resource_name: e.extended_resource_name.clone(),
                effective,
                shadowed_by,
            }
        })
        .collect()
}

/// The Kubernetes qualified-name part limit: `deviceclass.resource.kubernetes.io/<class>` is only
/// a valid resource name while `<class>` fits in it.
const QUALIFIED_NAME_MAX: usize = 63;

/// True when `class` can be requested as `deviceclass.resource.kubernetes.io/<class>`: the
/// name part of an extended resource name is at most 63 characters of `[A-Za-z0-9_.-]`,
/// starting and ending alphanumeric.
pub fn is_valid_implicit_name(class: &str) -> bool {
    let b = class.as_bytes();
    !b.is_empty()
        && b.len() <= QUALIFIED_NAME_MAX
        && b.first().is_some_and(u8::is_ascii_alphanumeric)
        && b.last().is_some_and(u8::is_ascii_alphanumeric)
        && b.iter().all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
}

/// Findings about the classes that do not block the migration.
pub fn warnings(spec: &GpuPoolMigrationSpec) -> Vec<String> {
    spec.resources
        .iter()
        .filter(|e| !is_valid_implicit_name(&e.device_class_name))
        .map(|e| {
            format!(
                "DeviceClass {} is longer than 63 characters, so pods cannot request it as deviceclass.resource.kubernetes.io/{}; {} still works",
                e.device_class_name, e.device_class_name, e.extended_resource_name
            )
        })
        .collect()
}

/// The DeviceClassesReady reason.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Readiness {
    /// Every class exists as the migration wants it and wins its extended resource name.
    Effective,
    /// A class is missing, or differs from the migration's and is being applied.
    Applying,
    /// A class created later carries the same extended resource name: the scheduler uses it.
    Shadowed,
    /// resource.k8s.io/v1 does not serve DeviceClasses.
    ApiMissing,
}

impl Readiness {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Effective => "Effective",
            Self::Applying => "Applying",
            Self::Shadowed => "Shadowed",
            Self::ApiMissing => "ApiMissing",
        }
    }

    pub fn ready(self) -> bool {
        self == Self::Effective
    }
}

/// The DeviceClassesReady verdict, with its message. `applying` names the classes whose apply
/// this reconcile sends: the gate opens once the DeviceClass cache shows them as applied.
pub fn readiness(statuses: &[DeviceClassStatus], applying: &[String]) -> (Readiness, String) {
    if let Some(s) = statuses.iter().find(|s| !s.shadowed_by.is_empty()) {
        return (
            Readiness::Shadowed,
            format!(
                "DeviceClass {} also carries extendedResourceName {} and was created later, so the scheduler uses it instead of {}: remove extendedResourceName from {} or delete it",
                s.shadowed_by, s.extended_resource_name, s.name, s.shadowed_by
            ),
        );
    }
    if let Some(s) = statuses.iter().find(|s| !s.effective) {
        return (Readiness::Applying, format!("DeviceClass {} does not exist yet", s.name));
    }
    if !applying.is_empty() {
        return (
            Readiness::Applying,
            format!(
                "applying DeviceClass {}: its spec, labels or annotations differ from the migration's",
                applying.join(", ")
            ),
        );
    }
    (Readiness::Effective, format!("{} DeviceClass(es) serve their extended resources", statuses.len()))
}

/// Whether `desired` must be applied: the class is missing, its spec differs, or it lacks one of
/// our labels or annotations (or has another value for one). Pure.
pub fn needs_apply(desired: &DeviceClass, current: Option<&DeviceClass>) -> bool {
    let Some(current) = current else { return true };
    let present = |want: &Option<BTreeMap<String, String>>, have: &Option<BTreeMap<String, String>>| {
        want.iter().flatten().all(|(k, v)| have.as_ref().and_then(|l| l.get(k)) == Some(v))
    };
    current.spec != desired.spec
        || !present(&desired.metadata.labels, &current.metadata.labels)
        || !present(&desired.metadata.annotations, &current.metadata.annotations)
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn spec() -> GpuPoolMigrationSpec {
        serde_json::from_value(serde_json::json!({
            "nodeSelector": {"matchLabels": {"pool": "a100"}},
            "resources": [
                {"extendedResourceName": "nvidia.com/gpu", "deviceClassName": "gpu.switchyard.dev",
                 "selector": "device.attributes['gpu.switchyard.dev'].type == 'gpu'"},
                {"extendedResourceName": "nvidia.com/mig-1g.10gb", "deviceClassName": "mig-1g.switchyard.dev"}
            ],
            "driver": {"name": "gpu.switchyard.dev", "daemonSet": {"namespace": "switchyard", "name": "driver"}},
            "devicePlugin": {"daemonSet": {"namespace": "gpu", "name": "nvidia-device-plugin"}}
        }))
        .unwrap()
    }

    fn class(name: &str, ext: Option<&str>, created: Option<i64>) -> ClassInfo {
        ClassInfo {
            name: name.into(),
            extended_resource_name: ext.map(String::from),
            created: created.map(|s| Timestamp::from_second(s).unwrap()),
        }
    }

    #[test]
    fn desired_class_ands_driver_and_entry_selector() {
        let s = spec();
        let dcs = desired_all(&s, "pool-a");
        assert_eq!(dcs.len(), 2);
        let dc = &dcs[0];
        assert_eq!(dc.metadata.name.as_deref(), Some("gpu.switchyard.dev"));
        assert_eq!(dc.spec.as_ref().unwrap().extended_resource_name.as_deref(), Some("nvidia.com/gpu"));
        let expr = &dc.spec.as_ref().unwrap().selectors.as_ref().unwrap()[0].cel.as_ref().unwrap().expression;
        assert_eq!(
            expr,
            "device.driver == 'gpu.switchyard.dev' && (device.attributes['gpu.switchyard.dev'].type == 'gpu')"
        );
        let labels = dc.metadata.labels.as_ref().unwrap();
        assert_eq!(labels.get(LABEL_MIGRATION).map(String::as_str), Some("pool-a"));
        assert_eq!(labels.get(LABEL_MANAGED_BY).map(String::as_str), Some(OPERATOR_FIELD_MANAGER));
        let expr2 =
            &dcs[1].spec.as_ref().unwrap().selectors.as_ref().unwrap()[0].cel.as_ref().unwrap().expression;
        assert_eq!(expr2, "device.driver == 'gpu.switchyard.dev'");
        // The serialised object is what SSA sends: apiVersion and kind must be there.
        let v = serde_json::to_value(dc).unwrap();
        assert_eq!(v["apiVersion"], "resource.k8s.io/v1");
        assert_eq!(v["kind"], "DeviceClass");
    }

    #[test]
    fn winner_table() {
        // (classes, extended resource name, winner)
        let cases: Vec<(Vec<ClassInfo>, &str, Option<&str>)> = vec![
            (vec![], "nvidia.com/gpu", None),
            (vec![class("a", Some("nvidia.com/gpu"), Some(10))], "nvidia.com/gpu", Some("a")),
            (vec![class("a", Some("other.com/x"), Some(10))], "nvidia.com/gpu", None),
            (
                vec![
                    class("old", Some("nvidia.com/gpu"), Some(10)),
                    class("new", Some("nvidia.com/gpu"), Some(20)),
                ],
                "nvidia.com/gpu",
                Some("new"),
            ),
            (
                vec![
                    class("zeta", Some("nvidia.com/gpu"), Some(10)),
                    class("alpha", Some("nvidia.com/gpu"), Some(10)),
                ],
                "nvidia.com/gpu",
                Some("alpha"),
            ),
            (
                vec![
                    class("alpha", Some("nvidia.com/gpu"), Some(10)),
                    class("zeta", Some("nvidia.com/gpu"), Some(10)),
                ],
                "nvidia.com/gpu",
                Some("alpha"),
            ),
            (
                vec![
                    class("ours", Some("nvidia.com/gpu"), Some(10)),
                    class("pending", Some("nvidia.com/gpu"), None),
                ],
                "nvidia.com/gpu",
                Some("ours"),
            ),
        ];
        for (classes, ext, want) in cases {
            assert_eq!(winner(&classes, ext).map(|c| c.name.as_str()), want, "{classes:?}");
        }
    }

    #[test]
    fn statuses_report_shadowing() {
        let s = spec();
        let existing = vec![
            class("gpu.switchyard.dev", Some("nvidia.com/gpu"), Some(100)),
            class("gpu.nvidia.com", Some("nvidia.com/gpu"), Some(200)),
            class("mig-1g.switchyard.dev", Some("nvidia.com/mig-1g.10gb"), Some(100)),
        ];
        let st = statuses(&s, &existing);
        assert_eq!(st[0].name, "gpu.switchyard.dev");
        assert!(!st[0].effective);
        assert_eq!(st[0].shadowed_by, "gpu.nvidia.com");
        assert!(st[1].effective);
        assert_eq!(st[1].shadowed_by, "");
        let (reason, msg) = readiness(&st, &[]);
        assert!(!reason.ready());
        assert_eq!(reason, Readiness::Shadowed);
        assert!(msg.contains("remove extendedResourceName from gpu.nvidia.com"), "{msg}");
    }

    #[test]
    fn missing_class_is_not_effective() {
        let s = spec();
        let st = statuses(&s, &[class("mig-1g.switchyard.dev", Some("nvidia.com/mig-1g.10gb"), Some(1))]);
        assert!(!st[0].effective);
        assert_eq!(st[0].shadowed_by, "");
        assert_eq!(readiness(&st, &[]).0, Readiness::Applying);
        let all = statuses(
            &s,
            &[
                class("gpu.switchyard.dev", Some("nvidia.com/gpu"), Some(1)),
                class("mig-1g.switchyard.dev", Some("nvidia.com/mig-1g.10gb"), Some(1)),
            ],
        );
        assert!(readiness(&all, &[]).0.ready());
        let (reason, msg) = readiness(&all, &["gpu.switchyard.dev".to_string()]);
        assert_eq!(reason, Readiness::Applying, "an apply in flight keeps the gate closed");
        assert!(msg.contains("applying DeviceClass gpu.switchyard.dev"), "{msg}");
    }

    #[test]
    fn our_class_without_the_field_is_not_effective() {
        // Someone (or a 1.36 server with the gate off) dropped extendedResourceName.
        let s = spec();
        let st = statuses(&s, &[class("gpu.switchyard.dev", None, Some(1))]);
        assert!(!st[0].effective);
    }

    #[test]
    fn implicit_name_validity() {
        let long = "a".repeat(64);
        let exact = "a".repeat(63);
        let cases = [
            ("gpu.switchyard.dev", true),
            ("gpu", true),
            (exact.as_str(), true),
            (long.as_str(), false),
            ("-gpu", false),
            ("gpu-", false),
            ("", false),
        ];
        for (name, want) in cases {
            assert_eq!(is_valid_implicit_name(name), want, "{name}");
        }
        let mut s = spec();
        s.resources[1].device_class_name = format!("{long}.example.com");
        let w = warnings(&s);
        assert_eq!(w.len(), 1);
        assert!(w[0].contains("deviceclass.resource.kubernetes.io/"));
    }

    #[test]
    fn apply_only_when_missing_or_different() {
        let desired = serde_json::from_value::<DeviceClass>(serde_json::json!({
            "metadata": {"name": "gpu.switchyard.dev", "labels": {"switchyard.dev/managed-by": "switchyard-operator"}},
            "spec": {"selectors": [{"cel": {"expression": "device.driver == 'd'"}}], "extendedResourceName": "nvidia.com/gpu"}
        }))
        .unwrap();
        let mut same = desired.clone();
        same.metadata.labels.as_mut().unwrap().insert("extra".into(), "kept".into());
        let mut other_spec = desired.clone();
        other_spec.spec.as_mut().unwrap().extended_resource_name = Some("nvidia.com/other".into());
        let mut no_label = desired.clone();
        no_label.metadata.labels = None;
        assert!(needs_apply(&desired, None), "missing");
        assert!(!needs_apply(&desired, Some(&same)), "same spec, our labels present");
        assert!(needs_apply(&desired, Some(&other_spec)), "spec differs");
        assert!(needs_apply(&desired, Some(&no_label)), "label missing");
    }

    #[test]
    fn scheduler_sync_changes_with_the_owner_and_the_peer_set() {
        let mut s = spec();
        s.resources.truncate(1);
        s.resources[0].device_class_name = "ours".into();
        let info = |name: &str, ext: Option<&str>| ClassInfo {
            name: name.into(),
            extended_resource_name: ext.map(String::from),
            created: Some("2026-01-01T00:00:00Z".parse().expect("time")),
        };
        let with_vendor =
            [info("ours", Some("nvidia.com/gpu")), info("vendor", Some("nvidia.com/gpu")), info("x", None)];
        let alone = [info("ours", Some("nvidia.com/gpu")), info("vendor", None)];
        assert_eq!(peers(&with_vendor, "ours", "nvidia.com/gpu"), ["vendor"]);
        assert!(peers(&alone, "ours", "nvidia.com/gpu").is_empty());

        let before = desired_all_synced(&s, "pool", "uid-1", &with_vendor).remove(0);
        let annotation = |dc: &DeviceClass| {
            dc.metadata.annotations.as_ref().expect("annotated")[ANNOTATION_SCHEDULER_SYNC].clone()
        };
        assert_eq!(annotation(&before), "uid-1;vendor");
        // The vendor class dropped the name: the scheduler forgot it, so ours is applied again.
        let after = desired_all_synced(&s, "pool", "uid-1", &alone).remove(0);
        assert_eq!(annotation(&after), "uid-1;");
        assert!(needs_apply(&after, Some(&before)));
        assert!(!needs_apply(&after, Some(&after)));
        // A new owner (a recreated migration) applies it too.
        let new_owner = desired_all_synced(&s, "pool", "uid-2", &alone).remove(0);
        assert!(needs_apply(&new_owner, Some(&after)));
    }
}
