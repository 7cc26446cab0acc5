//! The interlock that keeps a node from being served by two backends at once.
//!
//! The scheduler treats a node as device-plugin backed for a resource while its
//! `status.allocatable` for that name is above zero. During a switch the device plugin's pod is
//! stopping while this agent is starting, and the kubelet only drops the plugin's capacity a
//! moment later; on a misconfigured node both may run for good. So the agent watches its own
//! Node (`node_watch`) and, while any of the device plugin's GPU resources (by default `nvidia.com/gpu`,
//! `nvidia.com/gpu.shared` and `nvidia.com/mig-*`) is still allocatable, publishes every device
//! with a `<driver>/device-plugin-active` NoSchedule taint. The scheduler then allocates nothing
//! from the DRA side until the device plugin is gone. Other `nvidia.com/*` resources, such as the
//! NVIDIA Network Operator's SR-IOV and RDMA devices, stay on their node for good and are not
//! GPUs: they do not hold the taint.

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::jiff::Timestamp;
use tokio::sync::watch;

/// The device plugin's GPU resources the interlock watches by default, comma-separated.
pub const DEFAULT_RESOURCES: &str = "nvidia.com/gpu,nvidia.com/gpu.shared,nvidia.com/mig-*";

/// The device-plugin resources `node` advertises as allocatable (non-zero), by name: those that
/// match one of `patterns` (exact names, or prefixes ending in `*`). Pure.
pub fn active_resources(node: &Node, patterns: &[String]) -> Vec<String> {
    let Some(alloc) = node.status.as_ref().and_then(|s| s.allocatable.as_ref()) else { return Vec::new() };
    alloc
        .iter()
        .filter(|(name, _)| patterns.iter().any(|p| switchyard_api::well_known::resource_matches(p, name)))
        .filter(|(_, q)| !is_zero(&q.0))
        .map(|(name, _)| name.clone())
        .collect()
}

/// Extended resources are whole numbers; anything that does not parse as 0 counts as present.
fn is_zero(quantity: &str) -> bool {
    quantity.trim().parse::<i64>().is_ok_and(|n| n == 0)
}

/// Whether the device plugin is active on the node, and since when, as the agent loop reads it.
#[derive(Clone)]
pub struct Guard {
    rx: watch::Receiver<Option<Timestamp>>,
}

impl Guard {
    /// A guard that never reports the device plugin (the interlock is off).
    pub fn disabled() -> Self {
        let (tx, rx) = watch::channel(None);
        // Keep the sender alive so `changed()` waits forever instead of failing.
        std::mem::forget(tx);
        Self { rx }
    }

    /// Since when the node has advertised device-plugin resources, if it does now.
    pub fn active_since(&self) -> Option<Timestamp> {
        *self.rx.borrow()
    }

    /// Waits for the next change.
    pub async fn changed(&mut self) {
        if self.rx.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

/// The watching side of a [`Guard`]: the agent's one watch of its Node (`node_watch::watch`)
/// hands it every observation.
pub struct Interlock {
    tx: watch::Sender<Option<Timestamp>>,
    patterns: Vec<String>,
}

impl Interlock {
    /// An interlock on the device plugin's resources `patterns`, and the guard that reads it.
    /// Until the first observation the device plugin is assumed active: publishing allocatable
    /// devices before knowing is what the interlock exists to prevent.
    pub fn new(patterns: Vec<String>) -> (Self, Guard) {
        let (tx, rx) = watch::channel(Some(Timestamp::now()));
        (Interlock { tx, patterns }, Guard { rx })
    }

    /// Fold one observation of the Node in; the guard changes (and a line is logged) only when
    /// the device plugin comes or goes.
    pub fn observe(&self, node: &Node) {
        let active = active_resources(node, &self.patterns);
        let was = *self.tx.borrow();
        let now = match (active.is_empty(), was) {
            (true, _) => None,
            (false, Some(since)) => Some(since),
            (false, None) => Some(Timestamp::now()),
        };
        if now == was {
            return;
        }
        if active.is_empty() {
            tracing::info!("no device-plugin resources on the node; devices are allocatable");
        } else {
            tracing::warn!(resources = ?active, "the node advertises device-plugin resources; devices stay tainted");
        }
        self.tx.send_replace(now);
    }

    /// Whether no guard reads it any more.
    pub fn is_closed(&self) -> bool {
        self.tx.is_closed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(alloc: &[(&str, &str)]) -> Node {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "n"},
            "status": {"allocatable": alloc.iter().map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<std::collections::BTreeMap<_, _>>()}
        }))
        .unwrap()
    }

    /// Allocatable (name, quantity) pairs, and the resources expected to count as active.
    type Case = (&'static [(&'static str, &'static str)], &'static [&'static str]);

    #[test]
    fn only_non_zero_device_plugin_gpu_resources_count() {
        let patterns: Vec<String> = DEFAULT_RESOURCES.split(',').map(str::to_owned).collect();
        let cases: &[Case] = &[
            (&[], &[]),
            (&[("cpu", "32"), ("memory", "256Gi")], &[]),
            (&[("nvidia.com/gpu", "8")], &["nvidia.com/gpu"]),
            (&[("nvidia.com/gpu", "0")], &[]),
            (&[("nvidia.com/gpu", "0"), ("nvidia.com/mig-1g.10gb", "7")], &["nvidia.com/mig-1g.10gb"]),
            (&[("example.com/gpu", "2")], &[]),
            (
                &[("nvidia.com/gpu.shared", "32"), ("nvidia.com/mig-2g.20gb.shared", "6")],
                &["nvidia.com/gpu.shared", "nvidia.com/mig-2g.20gb.shared"],
            ),
            // The NVIDIA Network Operator's resources are not GPUs: they never go away.
            (&[("nvidia.com/hostdev", "4"), ("nvidia.com/rdma_shared_device_a", "1k")], &[]),
            // A quantity we cannot read is treated as present: failing safe keeps the taint.
            (&[("nvidia.com/gpu", "1k")], &["nvidia.com/gpu"]),
        ];
        for (alloc, want) in cases {
            assert_eq!(active_resources(&node(alloc), &patterns), *want, "{alloc:?}");
        }
    }

    /// Active until the first observation says otherwise; the start of a device-plugin period is
    /// kept while it lasts, and a new one begins after a gap.
    #[test]
    fn the_interlock_keeps_when_the_device_plugin_appeared() {
        let (interlock, guard) = Interlock::new(vec!["nvidia.com/gpu".to_owned()]);
        let assumed = guard.active_since().expect("active until the Node is seen");
        interlock.observe(&node(&[("nvidia.com/gpu", "8")]));
        assert_eq!(guard.active_since(), Some(assumed), "still the same period");
        interlock.observe(&node(&[("nvidia.com/gpu", "0")]));
        assert_eq!(guard.active_since(), None);
        interlock.observe(&node(&[("nvidia.com/gpu", "8")]));
        assert!(guard.active_since().is_some_and(|since| since >= assumed));
        assert!(!interlock.is_closed());
        drop(guard);
        assert!(interlock.is_closed());
    }

    #[test]
    fn no_status_means_nothing_active() {
        let n: Node = serde_json::from_value(serde_json::json!({"metadata": {"name": "n"}})).unwrap();
        assert!(active_resources(&n, &["nvidia.com/gpu".to_owned()]).is_empty());
    }
}
