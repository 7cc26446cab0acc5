//! The agent's main loop: discover, fold health events in, publish on change with backoff, and
//! taint everything on the way out.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::error::Error;
use crate::health::{Applied, Effect, HealthEvent, HealthPolicy, HealthState};
use crate::inventory::{Inventory, NamedDevice, NodeInventory};
use crate::metrics::Metrics;
use crate::publish::{Backoff, Publisher};
use crate::slices::{PoolIdentity, desired_slices};

/// How often the inventory is read again, to pick up MIG re-configuration and a driver that
/// appeared after start-up.
pub const REDISCOVER_INTERVAL: Duration = Duration::from_secs(60);
/// How long the agent keeps trying to publish the driver-unavailable taint on SIGTERM; below the
/// default 30 s termination grace period so the pod exits on its own.
pub const SHUTDOWN_PUBLISH_DEADLINE: Duration = Duration::from_secs(20);

/// Hooks an inventory may offer beyond discovery.
pub trait EventSource: Send + Sync {
    /// Start feeding `tx` with hardware health events for the devices in `inv`, until `stop` is
    /// set. Called once, after the first successful discovery.
    fn start_events(&self, _inv: &NodeInventory, _tx: mpsc::Sender<HealthEvent>, _stop: Arc<AtomicBool>) {}
}

/// Shared flags the HTTP endpoints read.
#[derive(Clone, Default)]
pub struct Status {
    /// Set after the first successful publication.
    pub ready: Arc<AtomicBool>,
}

/// Everything the loop needs.
pub struct Agent<I> {
    pub inventory: I,
    pub publisher: Publisher,
    pub id: PoolIdentity,
    pub policy: HealthPolicy,
    pub metrics: Metrics,
    pub status: Status,
}

/// Record device counts by type and health.
fn record_devices(metrics: &Metrics, inv: &NodeInventory, health: &HealthState) {
    let rows: Vec<(&str, &str)> = inv
        .named_devices()
        .into_iter()
        .map(|(name, d)| {
            let (ty, parent) = match d {
                NamedDevice::Gpu(_) => ("gpu", None),
                NamedDevice::Mig { parent, .. } => ("mig", Some(parent.device_name())),
            };
            let taints = health.taints_for(&name, parent.as_deref());
            let h = if taints.iter().any(|t| t.effect == Effect::NoSchedule) {
                "unhealthy"
            } else if taints.is_empty() {
                "healthy"
            } else {
                "degraded"
            };
            (ty, h)
        })
        .collect();
    metrics.set_devices(rows);
}

impl<I: Inventory + EventSource> Agent<I> {
    async fn discover(&self) -> Option<NodeInventory> {
        match self.inventory.discover().await {
            Ok(inv) => {
                self.metrics.driver_present.set(1);
                Some(inv)
            }
            Err(e @ Error::NoDriver(_)) => {
                self.metrics.driver_present.set(0);
                tracing::warn!(error = %e, "no NVIDIA driver on this node; publishing an empty pool");
                Some(NodeInventory::default())
            }
            Err(e) => {
                tracing::error!(error = %e, category = e.category(), "discovery failed; keeping the last inventory");
                None
            }
        }
    }

    /// Run until `shutdown` resolves, then publish the driver-unavailable taint and return.
    pub async fn run(
        mut self,
        mut events: mpsc::Receiver<HealthEvent>,
        events_tx: mpsc::Sender<HealthEvent>,
        shutdown: impl std::future::Future<Output = ()>,
    ) -> Result<(), Error> {
        let stop = Arc::new(AtomicBool::new(false));
        let mut shutdown = std::pin::pin!(shutdown);
        let mut health = HealthState::default();
        let mut inventory: Option<NodeInventory> = None;
        let mut watching = false;
        // Observation times of events whose taints are not yet in the API.
        let mut pending: Vec<Timestamp> = Vec::new();
        let mut backoff = Backoff::default();
        let mut retry_at: Option<Instant> = None;
        let mut initialised = false;
        let mut rediscover = tokio::time::interval(REDISCOVER_INTERVAL);
        rediscover.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);

        loop {
            let expiry = health.next_expiry(&self.policy).map(|t| {
                let wait = t.duration_since(Timestamp::now());
                Instant::now() + if wait.is_negative() { Duration::ZERO } else { wait.unsigned_abs() }
            });
            let sleep_until = |at: Option<Instant>| -> Pin<Box<tokio::time::Sleep>> {
                Box::pin(tokio::time::sleep_until(
                    at.unwrap_or_else(|| Instant::now() + Duration::from_secs(3600)),
                ))
            };
            tokio::select! {
                _ = &mut shutdown => break,
                _ = rediscover.tick() => {
                    if let Some(inv) = self.discover().await {
                        if !watching && !inv.gpus.is_empty() {
                            self.inventory.start_events(&inv, events_tx.clone(), stop.clone());
                            watching = true;
                        }
                        inventory = Some(inv);
                    }
                }
                Some(ev) = events.recv() => {
                    if self.policy_apply(&mut health, &ev) == Applied::TaintsChanged && ev.kind != crate::health::FaultKind::Recover {
                        pending.push(ev.at);
                    }
                }
                _ = sleep_until(expiry), if expiry.is_some() => {}
                _ = sleep_until(retry_at), if retry_at.is_some() => { retry_at = None; }
            }
            if health.expire(&self.policy, Timestamp::now()) {
                tracing::info!("device taints expired after the hold period");
            }
            let Some(inv) = &inventory else { continue };
            record_devices(&self.metrics, inv, &health);
            if retry_at.is_some() {
                continue;
            }
            if !initialised {
                if let Err(e) = self.publisher.init().await {
                    retry_at = Some(self.failed(&mut backoff, &e));
                    continue;
                }
                initialised = true;
            }
            let desired = desired_slices(&self.id, inv, &health, None, 0);
            if self.publisher.is_current(&desired) {
                continue;
            }
            match self.publisher.publish(&desired).await {
                Ok(_) => {
                    backoff.reset();
                    self.metrics.publishes.inc();
                    self.status.ready.store(true, Ordering::Relaxed);
                    let now = Timestamp::now();
                    for at in pending.drain(..) {
                        self.metrics.event_to_taint.observe(now.duration_since(at).as_secs_f64().max(0.0));
                    }
                    tracing::info!(
                        generation = self.publisher.generation(),
                        slices = desired.len(),
                        "published ResourceSlices"
                    );
                }
                Err(e) => retry_at = Some(self.failed(&mut backoff, &e)),
            }
        }

        stop.store(true, Ordering::Relaxed);
        self.status.ready.store(false, Ordering::Relaxed);
        let Some(inv) = inventory else { return Ok(()) };
        self.publish_unavailable(&inv, &health).await
    }

    fn policy_apply(&self, health: &mut HealthState, ev: &HealthEvent) -> Applied {
        tracing::info!(device = %ev.device, kind = ?ev.kind, "health event");
        health.apply(&self.policy, ev)
    }

    fn failed(&self, backoff: &mut Backoff, e: &Error) -> Instant {
        let delay = backoff.next(e.is_transient());
        self.metrics
            .publish_failures
            .get_or_create(&crate::metrics::CategoryLabels { category: e.category().into() })
            .inc();
        tracing::warn!(error = %e, category = e.category(), retry_in = ?delay, "publishing ResourceSlices failed");
        Instant::now() + delay
    }

    /// Taint every device `driver-unavailable`, retrying until it lands or the deadline passes.
    async fn publish_unavailable(mut self, inv: &NodeInventory, health: &HealthState) -> Result<(), Error> {
        let desired = desired_slices(&self.id, inv, health, Some(Timestamp::now()), 0);
        let deadline = Instant::now() + SHUTDOWN_PUBLISH_DEADLINE;
        let mut backoff = Backoff::new(Duration::from_millis(200), Duration::from_secs(2));
        loop {
            let attempt = async {
                self.publisher.init().await?;
                self.publisher.publish(&desired).await
            };
            match attempt.await {
                Ok(_) => {
                    self.metrics.publishes.inc();
                    tracing::info!("published driver-unavailable taints; exiting");
                    return Ok(());
                }
                Err(e) => {
                    let at = self.failed(&mut backoff, &e);
                    if at >= deadline {
                        tracing::error!(error = %e, "could not publish driver-unavailable taints before the deadline");
                        return Err(e);
                    }
                    tokio::time::sleep_until(at).await;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::health::FaultKind;
    use crate::inventory::simulated::SimulatedInventory;
    use http::{Method, Request, Response};
    use kube::client::Body;

    fn ok(v: serde_json::Value) -> Response<Body> {
        Response::builder().status(200).body(Body::from(serde_json::to_vec(&v).unwrap())).unwrap()
    }

    /// A fake API server: lists are empty, applies echo their body (the first one fails with
    /// 500), and every apply body is handed to the test.
    fn fake_api() -> (kube::Client, mpsc::UnboundedReceiver<serde_json::Value>) {
        let (svc, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            let mut failed_once = false;
            while let Some((req, send)) = handle.next_request().await {
                match *req.method() {
                    Method::GET => send.send_response(ok(serde_json::json!({
                        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSliceList", "metadata": {}, "items": []
                    }))),
                    Method::PATCH if !failed_once => {
                        failed_once = true;
                        send.send_response(Response::builder().status(500).body(Body::from(
                            serde_json::to_vec(&serde_json::json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": "boom", "reason": "InternalError", "code": 500, "metadata": {}})).unwrap(),
                        )).unwrap());
                    }
                    Method::PATCH => {
                        let body: serde_json::Value =
                            serde_json::from_slice(&req.into_body().collect_bytes().await.unwrap()).unwrap();
                        let _ = tx.send(body.clone());
                        send.send_response(ok(body));
                    }
                    ref m => panic!("unexpected {m} {}", req.uri()),
                }
            }
        });
        (kube::Client::new(svc, "default"), rx)
    }

    fn taints(slice: &serde_json::Value, device: &str) -> Vec<(String, String)> {
        let devices = slice["spec"]["devices"].as_array().unwrap();
        let d = devices.iter().find(|d| d["name"] == device).unwrap();
        d["taints"]
            .as_array()
            .map(|ts| {
                ts.iter()
                    .map(|t| {
                        (t["key"].as_str().unwrap().to_string(), t["effect"].as_str().unwrap().to_string())
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The loop publishes the inventory (retrying a failed write), republishes at a new generation
    /// when a fault arrives, and on shutdown taints every device driver-unavailable.
    #[tokio::test]
    async fn loop_publishes_retries_taints_and_marks_shutdown() {
        let dir = std::env::temp_dir().join(format!("sy-agent-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("inv.yaml");
        std::fs::write(&path, include_str!("../examples/sim-inventory.yaml")).unwrap();
        let inventory = SimulatedInventory::load(&path).await.unwrap();
        let (client, mut applied) = fake_api();
        let id = PoolIdentity {
            node_name: "node-a".into(),
            node_uid: "uid-1".into(),
            driver: "gpu.switchyard.dev".into(),
        };
        let metrics = Metrics::default();
        let status = Status::default();
        let agent = Agent {
            inventory,
            publisher: Publisher::new(client, id.clone()),
            id,
            policy: HealthPolicy::default(),
            metrics: metrics.clone(),
            status: status.clone(),
        };
        let (tx, rx) = mpsc::channel(8);
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(agent.run(rx, tx.clone(), async {
            let _ = stopped.await;
        }));

        let first = applied.recv().await.unwrap();
        assert_eq!(first["spec"]["pool"]["generation"], 2, "generation 1 went to the failed attempt");
        assert_eq!(first["spec"]["devices"].as_array().unwrap().len(), 8);
        assert!(taints(&first, "gpu-3").is_empty());
        assert!(status.ready.load(Ordering::Relaxed));

        tx.send(HealthEvent {
            device: "gpu-3".into(),
            kind: FaultKind::Xid { xid: 79 },
            at: Timestamp::now(),
        })
        .await
        .unwrap();
        let second = applied.recv().await.unwrap();
        assert_eq!(second["spec"]["pool"]["generation"], 3);
        assert_eq!(
            taints(&second, "gpu-3"),
            [("gpu.switchyard.dev/xid".to_string(), "NoSchedule".to_string())]
        );
        assert!(taints(&second, "gpu-2").is_empty());

        stop.send(()).unwrap();
        let last = applied.recv().await.unwrap();
        for d in ["gpu-0", "gpu-3", "gpu-7"] {
            assert!(
                taints(&last, d)
                    .contains(&("gpu.switchyard.dev/driver-unavailable".into(), "NoSchedule".into())),
                "{d}"
            );
        }
        task.await.unwrap().unwrap();

        let text = metrics.encode();
        for needle in [
            "switchyard_agent_publishes_total 3",
            "switchyard_agent_publish_failures_total{category=\"publish_slice\"} 1",
            "switchyard_agent_event_to_taint_seconds_count 1",
            "switchyard_agent_devices{type=\"gpu\",health=\"unhealthy\"} 1",
            "switchyard_agent_devices{type=\"gpu\",health=\"healthy\"} 7",
        ] {
            assert!(text.contains(needle), "missing {needle} in\n{text}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
