//! Events on the agent's own Node: what an admin reads in `kubectl describe node` when the agent
//! cannot serve the node's GPUs. One event per change of state, not one per retry.

use std::sync::atomic::{AtomicBool, Ordering};

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};

use crate::slices::PoolIdentity;
use switchyard_api::well_known::AGENT_FIELD_MANAGER;

/// Event reason while the NVIDIA driver's library cannot be loaded on the node.
pub const REASON_DRIVER_UNAVAILABLE: &str = "NvidiaDriverUnavailable";
/// Event reason once it loads after having been unavailable.
pub const REASON_DRIVER_LOADED: &str = "NvidiaDriverLoaded";

/// Publishes the agent's events about its Node.
pub struct NodeEvents {
    recorder: Recorder,
    node: ObjectReference,
    /// Where the library was looked for, for the note.
    library: String,
    /// A `NvidiaDriverUnavailable` event was published and no `NvidiaDriverLoaded` since.
    reported_missing: AtomicBool,
}

impl NodeEvents {
    pub fn new(client: kube::Client, id: &PoolIdentity, library: String) -> Self {
        let reporter =
            Reporter { controller: AGENT_FIELD_MANAGER.into(), instance: Some(id.node_name.clone()) };
        let node = ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Node".into()),
            name: Some(id.node_name.clone()),
            uid: Some(id.node_uid.clone()),
            ..Default::default()
        };
        Self {
            recorder: Recorder::new(client, reporter),
            node,
            library,
            reported_missing: AtomicBool::new(false),
        }
    }

    /// The driver library cannot be loaded (`error`): a Warning, once until it loads.
    pub async fn driver_unavailable(&self, error: &str) {
        if self.reported_missing.swap(true, Ordering::SeqCst) {
            return;
        }
        let note = format!(
            "the DRA driver agent cannot load NVML ({error}); it looked for {}. It publishes no GPUs for this node and retries every minute. Mount the host's driver files (the chart's agent.driverRoot, passed as --driver-root), point --nvml-library at the file, or run the agent under the nvidia runtime class (agent.runtimeClassName)",
            self.library
        );
        self.publish(EventType::Warning, REASON_DRIVER_UNAVAILABLE, note).await;
    }

    /// The library loaded: a Normal event, only after a Warning.
    pub async fn driver_loaded(&self) {
        if !self.reported_missing.swap(false, Ordering::SeqCst) {
            return;
        }
        let note = "the DRA driver agent loaded NVML; it publishes this node's GPUs".to_string();
        self.publish(EventType::Normal, REASON_DRIVER_LOADED, note).await;
    }

    async fn publish(&self, type_: EventType, reason: &str, note: String) {
        let event = Event {
            type_,
            reason: reason.into(),
            note: Some(note),
            action: "LoadNVML".into(),
            secondary: None,
        };
        if let Err(e) = self.recorder.publish(&event, &self.node).await {
            // The log line says the same; the next state change tries again.
            tracing::warn!(error = %e, reason, "publishing the Node event failed");
            if type_ == EventType::Warning {
                self.reported_missing.store(false, Ordering::SeqCst);
            }
        }
    }
}
