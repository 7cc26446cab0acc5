//! Prometheus metrics, all prefixed `switchyard_agent_`. Counter names carry no `_total`:
//! prometheus-client appends it (and panics in debug builds when it is already there).

use std::sync::Arc;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Registry, Unit};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DeviceLabels {
    /// `gpu` or `mig`.
    pub r#type: String,
    /// `healthy`, `degraded` (informational taint only) or `unhealthy` (a NoSchedule taint).
    pub health: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CategoryLabels {
    pub category: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OpLabels {
    pub op: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabels {
    /// `ok` or `failed`.
    pub result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ClaimOpLabels {
    /// `prepare` or `unprepare`.
    pub op: String,
    /// `ok`, or the error category.
    pub result: String,
}

/// Cheap to clone: every field shares its value.
#[derive(Clone)]
pub struct Metrics {
    registry: Arc<Registry>,
    pub devices: Family<DeviceLabels, Gauge>,
    pub publishes: Counter,
    pub publish_failures: Family<CategoryLabels, Counter>,
    pub event_to_taint: Histogram,
    pub nvml_errors: Family<OpLabels, Counter>,
    pub driver_present: Gauge,
    pub plugin_registrations: Family<ResultLabels, Counter>,
    pub claim_operations: Family<ClaimOpLabels, Counter>,
    pub prepared_claims: Gauge,
}

impl Default for Metrics {
    fn default() -> Self {
        let devices = Family::<DeviceLabels, Gauge>::default();
        let publishes = Counter::default();
        let publish_failures = Family::<CategoryLabels, Counter>::default();
        // 10 ms .. ~80 s: an apply normally lands in well under a second; the tail shows backoff.
        let event_to_taint =
            Histogram::new(prometheus_client::metrics::histogram::exponential_buckets(0.01, 2.0, 14));
        let nvml_errors = Family::<OpLabels, Counter>::default();
        let driver_present = Gauge::default();
        let mut r = Registry::with_prefix("switchyard_agent");
        r.register("devices", "Devices this agent publishes, by type and health", devices.clone());
        r.register("publishes", "Successful publications of the node's ResourceSlices", publishes.clone());
        r.register(
            "publish_failures",
            "Failed publication attempts (each is retried with backoff), by error category",
            publish_failures.clone(),
        );
        r.register_with_unit(
            "event_to_taint",
            "Time from a health event to the API server accepting the slices that show it",
            Unit::Seconds,
            event_to_taint.clone(),
        );
        r.register("nvml_errors", "NVML calls that failed, by operation", nvml_errors.clone());
        r.register(
            "driver_present",
            "1 when NVML (the NVIDIA driver) is loaded or simulated, else 0",
            driver_present.clone(),
        );
        let plugin_registrations = Family::<ResultLabels, Counter>::default();
        let claim_operations = Family::<ClaimOpLabels, Counter>::default();
        let prepared_claims = Gauge::default();
        r.register(
            "plugin_registrations",
            "Registration verdicts the kubelet reported for the DRA plugin, by result",
            plugin_registrations.clone(),
        );
        r.register(
            "claim_operations",
            "Claims the kubelet asked the DRA plugin to prepare or unprepare, by operation and result",
            claim_operations.clone(),
        );
        r.register(
            "prepared_claims",
            "Claims prepared on this node (in the checkpoint)",
            prepared_claims.clone(),
        );
        Metrics {
            registry: Arc::new(r),
            devices,
            publishes,
            publish_failures,
            event_to_taint,
            nvml_errors,
            driver_present,
            plugin_registrations,
            claim_operations,
            prepared_claims,
        }
    }
}

impl Metrics {
    pub fn nvml_error(&self, op: &str) {
        self.nvml_errors.get_or_create(&OpLabels { op: op.to_string() }).inc();
    }

    /// Set the device gauges from (type, health) pairs, zeroing the combinations not present.
    pub fn set_devices<'a>(&self, devices: impl IntoIterator<Item = (&'a str, &'a str)>) {
        for t in ["gpu", "mig"] {
            for h in ["healthy", "degraded", "unhealthy"] {
                self.devices.get_or_create(&DeviceLabels { r#type: t.into(), health: h.into() }).set(0);
            }
        }
        for (t, h) in devices {
            self.devices.get_or_create(&DeviceLabels { r#type: t.into(), health: h.into() }).inc();
        }
    }

    /// The text exposition format.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_carry_the_prefix_and_units() {
        let m = Metrics::default();
        m.publishes.inc();
        m.publish_failures.get_or_create(&CategoryLabels { category: "publish_slice".into() }).inc();
        m.event_to_taint.observe(0.2);
        m.nvml_error("uuid");
        m.set_devices([("gpu", "healthy"), ("gpu", "healthy"), ("mig", "unhealthy")]);
        let text = m.encode();
        for needle in [
            "switchyard_agent_publishes_total 1",
            "switchyard_agent_publish_failures_total{category=\"publish_slice\"} 1",
            "switchyard_agent_event_to_taint_seconds_count 1",
            "switchyard_agent_nvml_errors_total{op=\"uuid\"} 1",
            "switchyard_agent_devices{type=\"gpu\",health=\"healthy\"} 2",
            "switchyard_agent_devices{type=\"mig\",health=\"unhealthy\"} 1",
            "switchyard_agent_devices{type=\"mig\",health=\"healthy\"} 0",
        ] {
            assert!(text.contains(needle), "missing {needle} in\n{text}");
        }
    }
}
