//! CPU, memory and pod slots as the scheduler's NodeResourcesFit filter counts them: a node's
//! allocatable, and a pod's effective requests (its containers' and sidecars' sum, or its largest
//! init container's with the sidecars started before it, whichever is more, plus its overhead).
//! Kubernetes quantities are read exactly, in integer arithmetic. Pure.

use k8s_openapi::api::core::v1::{Container, Pod};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

/// CPU in millicores, memory in bytes, and pod slots: what NodeResourcesFit compares besides
/// extended resources.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct Core {
    pub cpu_milli: i64,
    pub memory: i64,
    pub pods: i64,
}

impl Core {
    /// Whether `need` fits in `self`.
    pub fn holds(&self, need: &Core) -> bool {
        need.cpu_milli <= self.cpu_milli && need.memory <= self.memory && need.pods <= self.pods
    }

    /// `self` less `other`, never below zero.
    pub fn less(&self, other: &Core) -> Core {
        Core {
            cpu_milli: (self.cpu_milli - other.cpu_milli).max(0),
            memory: (self.memory - other.memory).max(0),
            pods: (self.pods - other.pods).max(0),
        }
    }

    fn plus(&self, other: &Core) -> Core {
        Core {
            cpu_milli: self.cpu_milli + other.cpu_milli,
            memory: self.memory + other.memory,
            pods: self.pods + other.pods,
        }
    }

    /// Each of the three, the larger of `self`'s and `other`'s.
    fn each_max(&self, other: &Core) -> Core {
        Core {
            cpu_milli: self.cpu_milli.max(other.cpu_milli),
            memory: self.memory.max(other.memory),
            pods: self.pods.max(other.pods),
        }
    }

    /// What of `need` does not fit in `self`, in words (`"cpu 4 (1500m free)"`); empty when it fits.
    pub fn lacking(&self, need: &Core) -> Vec<String> {
        let mut out = Vec::new();
        if need.cpu_milli > self.cpu_milli {
            out.push(format!("cpu {} ({} free)", milli(need.cpu_milli), milli(self.cpu_milli)));
        }
        if need.memory > self.memory {
            out.push(format!("memory {} ({} free)", bytes(need.memory), bytes(self.memory)));
        }
        if need.pods > self.pods {
            out.push("a pod slot (none free)".to_string());
        }
        out
    }
}

fn milli(m: i64) -> String {
    if m % 1000 == 0 { (m / 1000).to_string() } else { format!("{m}m") }
}

fn bytes(b: i64) -> String {
    const GI: i64 = 1 << 30;
    const MI: i64 = 1 << 20;
    if b % GI == 0 {
        format!("{}Gi", b / GI)
    } else if b % MI == 0 {
        format!("{}Mi", b / MI)
    } else {
        b.to_string()
    }
}

/// A node's allocatable CPU, memory and pod slots from `status.allocatable`; a name it lacks
/// counts zero, as NodeResourcesFit counts it.
pub fn allocatable<'a>(allocatable: impl IntoIterator<Item = (&'a str, &'a Quantity)>) -> Core {
    let mut c = Core::default();
    for (name, q) in allocatable {
        match name {
            "cpu" => c.cpu_milli = milli_units(q).unwrap_or(0),
            "memory" => c.memory = units(q).unwrap_or(0),
            "pods" => c.pods = units(q).unwrap_or(0),
            _ => {}
        }
    }
    c
}

/// A pod's effective requests as NodeResourcesFit computes them: the regular containers and the
/// sidecars (init containers with `restartPolicy: Always`) summed, or, when more, each regular
/// init container with the sidecars declared before it; plus `spec.overhead`; one pod slot.
/// A container with limits and no requests requests its limits (API defaulting).
pub fn pod_requests(pod: &Pod) -> Core {
    let Some(spec) = pod.spec.as_ref() else {
        return Core { pods: 1, ..Core::default() };
    };
    let mut running = Core::default();
    for c in &spec.containers {
        running = running.plus(&container(c));
    }
    let mut sidecars = Core::default();
    let mut init = Core::default();
    for c in spec.init_containers.iter().flatten() {
        if c.restart_policy.as_deref() == Some("Always") {
            sidecars = sidecars.plus(&container(c));
            init = init.each_max(&sidecars);
        } else {
            init = init.each_max(&sidecars.plus(&container(c)));
        }
    }
    let running = running.plus(&sidecars);
    let overhead = spec.overhead.as_ref().map(|o| allocatable(o.iter().map(|(k, v)| (k.as_str(), v))));
    let mut total = running.each_max(&init).plus(&overhead.unwrap_or_default());
    total.pods = 1;
    total
}

fn container(c: &Container) -> Core {
    let Some(r) = c.resources.as_ref() else {
        return Core::default();
    };
    let get =
        |name: &str| r.requests.as_ref().and_then(|m| m.get(name)).or_else(|| r.limits.as_ref()?.get(name));
    Core {
        cpu_milli: get("cpu").and_then(milli_units).unwrap_or(0),
        memory: get("memory").and_then(units).unwrap_or(0),
        pods: 0,
    }
}

pub use switchyard_api::quantity::{milli_units, units};

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn q(s: &str) -> Quantity {
        Quantity(s.to_string())
    }

    #[test]
    fn a_pods_requests_are_what_node_resources_fit_counts() {
        let pod: Pod = serde_json::from_value(json!({
            "spec": {
                "overhead": {"cpu": "100m"},
                "initContainers": [
                    {"name": "big-init", "resources": {"requests": {"cpu": "3", "memory": "1Gi"}}},
                    {"name": "sidecar", "restartPolicy": "Always", "resources": {"requests": {"cpu": "500m"}}},
                    {"name": "late-init", "resources": {"requests": {"cpu": "2"}}}
                ],
                "containers": [
                    {"name": "a", "resources": {"requests": {"cpu": "1", "memory": "2Gi"}}},
                    {"name": "b", "resources": {"limits": {"cpu": "250m", "memory": "512Mi"}}},
                    {"name": "c"}
                ]
            }
        }))
        .unwrap();
        // Running: 1 + 0.25 + the sidecar's 0.5 = 1.75 CPU; init: max(3, 0.5 + 2) = 3 CPU.
        // Memory: running 2.5Gi, init 1Gi. Plus 100m overhead.
        assert_eq!(pod_requests(&pod), Core { cpu_milli: 3100, memory: (2 << 30) + (512 << 20), pods: 1 });
        let empty: Pod = serde_json::from_value(json!({"spec": {"containers": [{"name": "a"}]}})).unwrap();
        assert_eq!(pod_requests(&empty), Core { cpu_milli: 0, memory: 0, pods: 1 });
    }

    #[test]
    fn a_node_lacking_a_name_has_none_of_it() {
        let a = [
            ("cpu".to_string(), q("7500m")),
            ("memory".into(), q("30Gi")),
            ("nvidia.com/gpu".into(), q("2")),
        ];
        let c = allocatable(a.iter().map(|(k, v)| (k.as_str(), v)));
        assert_eq!(c, Core { cpu_milli: 7500, memory: 30 << 30, pods: 0 });
        let need = Core { cpu_milli: 8000, memory: 1 << 30, pods: 1 };
        assert!(!c.holds(&need));
        assert_eq!(c.lacking(&need), ["cpu 8 (7500m free)", "a pod slot (none free)"]);
    }
}
