//! The agent's main loop: discover, fold health events in, publish on change with backoff, and
//! taint everything on the way out.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use k8s_openapi::api::resource::v1::ResourceSlice;
use k8s_openapi::jiff::Timestamp;
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::coexistence::Guard;
use crate::discovery::{Discovery, EventSource, NamedDevice, NodeGpus};
use crate::error::Error;
use crate::health::{Applied, Effect, HealthEvent, HealthPolicy, HealthState};
use crate::metrics::Metrics;
use crate::node_events::NodeEvents;
use crate::node_watch::SharesPerDevice;
use crate::plugin::registration::RegistrationWatch;
use crate::publish::{Backoff, Publisher, SliceWatch};
use crate::slices::{NodeTaint, PoolIdentity, desired_slices, published_health};

/// How often the inventory is read again, to pick up MIG re-configuration and a driver that
/// appeared after start-up.
pub const REDISCOVER_INTERVAL: Duration = Duration::from_secs(60);
/// How long the agent keeps trying to publish the driver-unavailable taint on SIGTERM; below the
/// default 30 s termination grace period so the pod exits on its own.
pub const SHUTDOWN_PUBLISH_DEADLINE: Duration = Duration::from_secs(20);

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
    /// Whether the node still advertises device-plugin GPUs; see `coexistence`.
    pub coexistence: Guard,
    /// How many claims may share each device: `--shares-per-device`, or the node's
    /// `switchyard.dev/gpu-shares` label (see `node_watch`). A change publishes the devices again.
    pub shares: SharesPerDevice,
    /// The kubelet's verdict on our kubelet plugin, where one runs: until it registers the plugin
    /// every device carries the kubelet-plugin-not-registered taint. `None`: no plugin, no taint.
    pub registration: Option<RegistrationWatch>,
    /// Our slices as the API has them, so that a deleted or changed slice is written again.
    pub slices: SliceWatch,
    /// Events on the Node when the driver's library cannot be loaded (NVML inventory only).
    pub node_events: Option<NodeEvents>,
}

/// Waits for the kubelet's next verdict on our plugin; forever when no plugin runs.
async fn registration_changed(registration: &mut Option<RegistrationWatch>) {
    match registration {
        Some(r) => r.changed().await,
        None => std::future::pending().await,
    }
}

/// Record device counts by type and health.
fn record_devices(metrics: &Metrics, inv: &NodeGpus, health: &HealthState) {
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

impl<I: Discovery + EventSource> Agent<I> {
    async fn discover(&self) -> Option<NodeGpus> {
        match self.inventory.discover().await {
            Ok(inv) => {
                self.metrics.driver_present.set(1);
                if let Some(events) = &self.node_events {
                    events.driver_loaded().await;
                }
                Some(inv)
            }
            Err(Error::NoDriver(e)) => {
                self.metrics.driver_present.set(0);
                tracing::warn!(error = %e, "no NVIDIA driver on this node; publishing an empty pool");
                if let Some(events) = &self.node_events {
                    events.driver_unavailable(&e.to_string()).await;
                }
                Some(NodeGpus::default())
            }
            Err(e) => {
                tracing::error!(error = %e, category = e.category(), "discovery failed; keeping the last inventory");
                None
            }
        }
    }

    /// Run until `shutdown` resolves, then publish the driver-unavailable taint and return. A
    /// `shutdown` that has already resolved is seen before anything else: the agent then only
    /// publishes driver-unavailable if it already has an inventory, and otherwise returns at once.
    ///
    /// Before the first publication the health taints our slices already carry are restored (see
    /// `HealthState::restore`), so that a restart does not make a faulty device schedulable.
    ///
    /// Kept whole although it is a little over 100 lines: it is the one `select!` over every event
    /// the agent answers (rediscovery, health events, slice changes, the coexistence guard, the
    /// shares per device, the kubelet's registration verdict, the stop), and each arm is a call;
    /// split, the loop's state would travel through every piece.
    pub async fn run(
        mut self,
        mut events: mpsc::Receiver<HealthEvent>,
        events_tx: mpsc::Sender<HealthEvent>,
        shutdown: impl std::future::Future<Output = ()>,
    ) -> Result<(), Error> {
        let stop = Arc::new(AtomicBool::new(false));
        let mut shutdown = std::pin::pin!(shutdown);
        let mut health = HealthState::default();
        let mut inventory: Option<NodeGpus> = None;
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
                biased;
                _ = &mut shutdown => break,
                _ = rediscover.tick() => {
                    if let Some(inv) = self.discover().await {
                        for ev in crate::health::lost_transitions(inventory.as_ref(), &inv, Timestamp::now()) {
                            if self.policy_apply(&mut health, &ev) == Applied::TaintsChanged {
                                pending.push(ev.at);
                            }
                        }
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
                _ = self.coexistence.changed() => {}
                _ = self.shares.changed() => {}
                _ = registration_changed(&mut self.registration) => {}
                ev = self.slices.next() => {
                    if let Some(reason) = self.publisher.observe(&ev) {
                        tracing::warn!(reason, "our ResourceSlices differ from what we published; writing them again");
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
                let existing = match self.publisher.init().await {
                    Ok(existing) => existing,
                    Err(e) => {
                        retry_at = Some(self.failed(&mut backoff, &e));
                        continue;
                    }
                };
                self.restore(&mut health, &existing);
                record_devices(&self.metrics, inv, &health);
                initialised = true;
            }
            let not_registered = self.registration.as_mut().and_then(RegistrationWatch::not_registered);
            let node_taints: Vec<NodeTaint> = [
                self.coexistence.active_since().map(NodeTaint::device_plugin_active),
                not_registered.map(|(since, value)| NodeTaint::kubelet_plugin_not_registered(since, value)),
            ]
            .into_iter()
            .flatten()
            .collect();
            let desired = desired_slices(&self.id, inv, &health, &node_taints, self.shares.get(), 0);
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
        self.publish_unavailable(&inv, health, initialised).await
    }

    /// Fold the health taints of our existing slices (what a previous run published) into
    /// `health`, and drop those whose hold has already passed.
    fn restore(&self, health: &mut HealthState, existing: &[ResourceSlice]) {
        let now = Timestamp::now();
        let published = published_health(existing, &self.id.driver, now);
        let restored: Vec<&str> =
            published.iter().filter(|(_, t)| !t.is_empty()).map(|(d, _)| d.as_str()).collect();
        if !restored.is_empty() {
            tracing::info!(devices = ?restored, "restoring health taints from our existing slices");
        }
        health.restore(published);
        health.expire(&self.policy, now);
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
    /// Health taints are kept; when the loop never got to restore them (`restored` is false), they
    /// are restored here first, so that shutting down early does not erase them from the API.
    async fn publish_unavailable(
        mut self,
        inv: &NodeGpus,
        mut health: HealthState,
        mut restored: bool,
    ) -> Result<(), Error> {
        let since = Timestamp::now();
        let deadline = Instant::now() + SHUTDOWN_PUBLISH_DEADLINE;
        let mut backoff = Backoff::new(Duration::from_millis(200), Duration::from_secs(2));
        loop {
            let attempt = async {
                let existing = self.publisher.init().await?;
                if !restored {
                    self.restore(&mut health, &existing);
                    restored = true;
                }
                let unavailable = [NodeTaint::driver_unavailable(since)];
                let desired = desired_slices(&self.id, inv, &health, &unavailable, self.shares.get(), 0);
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
    use crate::discovery::simulated::SimulatedDiscovery;
    use crate::health::FaultKind;
    use crate::publish::{SliceEvent, SliceRef};
    use http::{Method, Request, Response};
    use kube::client::Body;
    use serde_json::json;

    const DRIVER: &str = "gpu.switchyard.dev";
    const SLICE: &str = "node-a-gpu-switchyard-dev-0";

    fn ok(v: serde_json::Value) -> Response<Body> {
        Response::builder().status(200).body(Body::from(serde_json::to_vec(&v).unwrap())).unwrap()
    }

    /// A fake API server: lists answer `existing`, applies answer their body as the API would
    /// (uid `uid-<name>`, `metadata.generation` following the pool generation), the first request
    /// with method `fail_first` fails with 500, and every apply body is handed to the test.
    fn fake_api(
        existing: Vec<serde_json::Value>,
        fail_first: Option<Method>,
    ) -> (kube::Client, mpsc::UnboundedReceiver<serde_json::Value>) {
        let (svc, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            let mut fail_first = fail_first;
            while let Some((req, send)) = handle.next_request().await {
                if fail_first.as_ref() == Some(req.method()) {
                    fail_first = None;
                    send.send_response(Response::builder().status(500).body(Body::from(
                        serde_json::to_vec(&json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": "boom", "reason": "InternalError", "code": 500, "metadata": {}})).unwrap(),
                    )).unwrap());
                    continue;
                }
                match *req.method() {
                    Method::GET => send.send_response(ok(json!({
                        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSliceList", "metadata": {},
                        "items": existing
                    }))),
                    Method::PATCH => {
                        let mut body: serde_json::Value =
                            serde_json::from_slice(&req.into_body().collect_bytes().await.unwrap()).unwrap();
                        let _ = tx.send(body.clone());
                        let name = body["metadata"]["name"].as_str().unwrap().to_string();
                        body["metadata"]["uid"] = json!(format!("uid-{name}"));
                        body["metadata"]["generation"] = body["spec"]["pool"]["generation"].clone();
                        send.send_response(ok(body));
                    }
                    ref m => panic!("unexpected {m} {}", req.uri()),
                }
            }
        });
        (kube::Client::new(svc, "default"), rx)
    }

    /// The next apply body; fails the test instead of hanging when none comes.
    async fn next_apply(applied: &mut mpsc::UnboundedReceiver<serde_json::Value>) -> serde_json::Value {
        tokio::time::timeout(Duration::from_secs(10), applied.recv())
            .await
            .expect("an apply within 10 s")
            .expect("the fake API runs")
    }

    fn taints(slice: &serde_json::Value, device: &str) -> Vec<(String, String)> {
        taint_details(slice, device).into_iter().map(|(k, _, e, _)| (k, e)).collect()
    }

    /// (key, value, effect, timeAdded) of a device's taints.
    fn taint_details(
        slice: &serde_json::Value,
        device: &str,
    ) -> Vec<(String, Option<String>, String, String)> {
        let devices = slice["spec"]["devices"].as_array().unwrap();
        let d = devices.iter().find(|d| d["name"] == device).unwrap();
        d["taints"]
            .as_array()
            .map(|ts| {
                ts.iter()
                    .map(|t| {
                        (
                            t["key"].as_str().unwrap().to_string(),
                            t["value"].as_str().map(str::to_string),
                            t["effect"].as_str().unwrap().to_string(),
                            t["timeAdded"].as_str().unwrap_or_default().to_string(),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    fn id() -> PoolIdentity {
        PoolIdentity { node_name: "node-a".into(), node_uid: "uid-1".into(), driver: DRIVER.into() }
    }

    /// The simulated example inventory (gpu-0 .. gpu-7), loaded from a fresh file.
    async fn inventory(test: &str) -> (Arc<SimulatedDiscovery>, std::path::PathBuf) {
        let dir = std::env::temp_dir().join(format!("sy-agent-{test}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("inv.yaml");
        std::fs::write(&path, include_str!("../examples/sim-inventory.yaml")).unwrap();
        (SimulatedDiscovery::load(&path).await.unwrap(), dir)
    }

    fn agent(
        inventory: Arc<SimulatedDiscovery>,
        client: kube::Client,
        slices: SliceWatch,
    ) -> (Agent<Arc<SimulatedDiscovery>>, Metrics, Status) {
        let metrics = Metrics::default();
        let status = Status::default();
        let agent = Agent {
            inventory,
            publisher: Publisher::new(client, id()),
            id: id(),
            policy: HealthPolicy::default(),
            metrics: metrics.clone(),
            status: status.clone(),
            coexistence: Guard::disabled(),
            shares: SharesPerDevice::fixed(1),
            registration: None,
            slices,
            node_events: None,
        };
        (agent, metrics, status)
    }

    /// The loop publishes the inventory (retrying a failed write), republishes at a new generation
    /// when a fault arrives, and on shutdown taints every device driver-unavailable.
    #[tokio::test]
    async fn loop_publishes_retries_taints_and_marks_shutdown() {
        let (inventory, dir) = inventory("loop").await;
        let (client, mut applied) = fake_api(vec![], Some(Method::PATCH));
        let (agent, metrics, status) = agent(inventory, client, SliceWatch::disabled());
        let (tx, rx) = mpsc::channel(8);
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(agent.run(rx, tx.clone(), async {
            let _ = stopped.await;
        }));

        let first = next_apply(&mut applied).await;
        assert_eq!(first["spec"]["pool"]["generation"], 2, "generation 1 went to the failed attempt");
        assert_eq!(first["spec"]["devices"].as_array().unwrap().len(), 8);
        for d in first["spec"]["devices"].as_array().unwrap() {
            assert!(d.get("taints").is_none(), "no plugin, no node-wide taint: {d}");
        }
        assert!(status.ready.load(Ordering::Relaxed));

        tx.send(HealthEvent {
            device: "gpu-3".into(),
            kind: FaultKind::Xid { xid: 79 },
            at: Timestamp::now(),
        })
        .await
        .unwrap();
        let second = next_apply(&mut applied).await;
        assert_eq!(second["spec"]["pool"]["generation"], 3);
        assert_eq!(
            taints(&second, "gpu-3"),
            [("gpu.switchyard.dev/xid".to_string(), "NoSchedule".to_string())]
        );
        assert!(taints(&second, "gpu-2").is_empty());

        stop.send(()).unwrap();
        let last = next_apply(&mut applied).await;
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

    /// What a crashed agent left in the API: gpu-3 with a fatal XID, gpu-1 with a fresh benign
    /// one, gpu-2 with a benign one whose hold has long passed, every device driver-unavailable
    /// and device-plugin-active (node-wide, recomputed), and another driver's key on gpu-4.
    fn crashed_slice(fresh: &str) -> serde_json::Value {
        let old = "2020-01-01T00:00:00Z";
        let taint = |suffix: &str, value: Option<&str>, effect: &str, at: &str| json!({"key": format!("{DRIVER}/{suffix}"), "value": value, "effect": effect, "timeAdded": at});
        let node_wide = [
            taint("driver-unavailable", None, "NoSchedule", old),
            taint("device-plugin-active", None, "NoSchedule", old),
        ];
        let devices: Vec<serde_json::Value> = (0..8)
            .map(|i| {
                let mut ts: Vec<serde_json::Value> = node_wide.to_vec();
                match i {
                    1 => ts.push(taint("xid", Some("13"), "None", fresh)),
                    2 => ts.push(taint("xid", Some("31"), "None", old)),
                    3 => ts.push(taint("xid", Some("79"), "NoSchedule", old)),
                    4 => ts.push(json!({"key": "other.example.com/xid", "value": "79", "effect": "NoSchedule", "timeAdded": old})),
                    _ => {}
                }
                json!({"name": format!("gpu-{i}"), "taints": ts})
            })
            .collect();
        json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": SLICE, "labels": {"switchyard.dev/managed-by": "switchyard-driver-agent"}},
            "spec": {"driver": DRIVER, "nodeName": "node-a", "pool": {"name": "node-a", "generation": 7, "resourceSliceCount": 1}, "devices": devices}
        })
    }

    /// A restarted agent's first publication keeps the health taints its slices carried, with
    /// their timeAdded, drops what the hold has expired and every node-wide taint, and a later
    /// shutdown keeps them too.
    #[tokio::test]
    async fn restart_restores_health_taints_from_our_slices() {
        let (inventory, dir) = inventory("restore").await;
        let fresh = Timestamp::from_second(Timestamp::now().as_second() - 10).unwrap().to_string();
        let (client, mut applied) = fake_api(vec![crashed_slice(&fresh)], None);
        let (agent, metrics, _) = agent(inventory, client, SliceWatch::disabled());
        let (tx, rx) = mpsc::channel(8);
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(agent.run(rx, tx, async {
            let _ = stopped.await;
        }));

        let first = next_apply(&mut applied).await;
        assert_eq!(first["spec"]["pool"]["generation"], 8, "continues from the API's generation");
        let xid = |v: &str, effect: &str, at: &str| {
            vec![(format!("{DRIVER}/xid"), Some(v.to_string()), effect.to_string(), at.to_string())]
        };
        assert_eq!(taint_details(&first, "gpu-3"), xid("79", "NoSchedule", "2020-01-01T00:00:00Z"));
        assert_eq!(taint_details(&first, "gpu-1"), xid("13", "None", &fresh));
        for d in ["gpu-0", "gpu-2", "gpu-4", "gpu-7"] {
            assert_eq!(taint_details(&first, d), [], "{d}");
        }
        assert!(metrics.encode().contains("switchyard_agent_devices{type=\"gpu\",health=\"unhealthy\"} 1"));

        stop.send(()).unwrap();
        let last = next_apply(&mut applied).await;
        assert_eq!(
            taints(&last, "gpu-3"),
            [
                (format!("{DRIVER}/xid"), "NoSchedule".to_string()),
                (format!("{DRIVER}/driver-unavailable"), "NoSchedule".to_string())
            ]
        );
        task.await.unwrap().unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Shutting down before the loop ever published still keeps the health taints: the
    /// driver-unavailable publication restores them first.
    #[tokio::test]
    async fn early_shutdown_keeps_restored_taints() {
        let (inventory, dir) = inventory("early").await;
        let (client, mut applied) = fake_api(vec![crashed_slice("2020-01-01T00:00:00Z")], Some(Method::GET));
        let (agent, _, status) = agent(inventory, client, SliceWatch::disabled());
        let (tx, rx) = mpsc::channel(8);
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(agent.run(rx, tx, async {
            let _ = stopped.await;
        }));
        // The first list fails, so the loop has not restored anything yet, and waits to retry.
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(!status.ready.load(Ordering::Relaxed));
        stop.send(()).unwrap();
        let last = next_apply(&mut applied).await;
        assert_eq!(taints(&last, "gpu-3")[0], (format!("{DRIVER}/xid"), "NoSchedule".to_string()));
        task.await.unwrap().unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A slice that the watch reports deleted or missing is written again at a new generation,
    /// although nothing the agent knows changed; events that lag behind our own write are not
    /// taken for a change.
    #[tokio::test]
    async fn deleted_slices_are_published_again() {
        let (inventory, dir) = inventory("drift").await;
        let (client, mut applied) = fake_api(vec![], None);
        let (events, watch) = mpsc::channel(8);
        let (agent, metrics, _) = agent(inventory, client, SliceWatch::from_channel(watch));
        let (tx, rx) = mpsc::channel(8);
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(agent.run(rx, tx, async {
            let _ = stopped.await;
        }));
        let ours = |generation: i64| SliceRef {
            name: SLICE.into(),
            uid: Some(format!("uid-{SLICE}")),
            generation: Some(generation),
        };

        let first = next_apply(&mut applied).await;
        assert_eq!(first["spec"]["pool"]["generation"], 1);
        // Our own write echoed late, and a list that has it: nothing to do.
        events.send(SliceEvent::Applied(ours(1))).await.unwrap();
        events.send(SliceEvent::Listed(vec![ours(1)])).await.unwrap();
        // Deleted (the kubelet at start-up, an admin): written again, same content.
        events.send(SliceEvent::Deleted(ours(1))).await.unwrap();
        let again = next_apply(&mut applied).await;
        assert_eq!(again["spec"]["pool"]["generation"], 2);
        assert_eq!(again["spec"]["devices"], first["spec"]["devices"]);
        // A relist that no longer has it (deleted while the watch was down).
        events.send(SliceEvent::Listed(vec![])).await.unwrap();
        let third = next_apply(&mut applied).await;
        assert_eq!(third["spec"]["pool"]["generation"], 3);
        // Changed by someone else: the API bumped metadata.generation past our write.
        events.send(SliceEvent::Applied(ours(4))).await.unwrap();
        let fourth = next_apply(&mut applied).await;
        assert_eq!(fourth["spec"]["pool"]["generation"], 4);
        assert!(taints(&fourth, "gpu-0").is_empty());

        // The next write is the shutdown one: the events above caused exactly one write each.
        stop.send(()).unwrap();
        let last = next_apply(&mut applied).await;
        assert_eq!(last["spec"]["pool"]["generation"], 5);
        assert_eq!(
            taints(&last, "gpu-0"),
            [(format!("{DRIVER}/driver-unavailable"), "NoSchedule".to_string())]
        );
        task.await.unwrap().unwrap();
        assert!(metrics.encode().contains("switchyard_agent_publishes_total 5"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// While the kubelet has not registered the plugin every device carries the not-registered
    /// taint (value `pending`, then `refused` with the same timeAdded); once it has, the devices
    /// are published again without it, one write per verdict.
    #[tokio::test]
    async fn devices_wait_for_the_kubelet_to_register_the_plugin() {
        use crate::plugin::registration::RegistrationState;
        let (inventory, dir) = inventory("registration").await;
        let (client, mut applied) = fake_api(vec![], None);
        let (mut agent, metrics, status) = agent(inventory, client, SliceWatch::disabled());
        let (verdict, rx) = tokio::sync::watch::channel(RegistrationState::Pending);
        agent.registration = Some(RegistrationWatch::new(rx));
        let (tx, rx) = mpsc::channel(8);
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(agent.run(rx, tx, async {
            let _ = stopped.await;
        }));
        let key = format!("{DRIVER}/kubelet-plugin-not-registered");

        let first = next_apply(&mut applied).await;
        assert_eq!(first["spec"]["pool"]["generation"], 1);
        let since = taint_details(&first, "gpu-0")[0].3.clone();
        for d in ["gpu-0", "gpu-7"] {
            assert_eq!(
                taint_details(&first, d),
                [(key.clone(), Some("pending".to_string()), "NoSchedule".to_string(), since.clone())],
                "{d}"
            );
        }
        assert!(status.ready.load(Ordering::Relaxed), "published, if not yet allocatable");

        verdict.send_replace(RegistrationState::Failed("plugin name already registered".into()));
        let refused = next_apply(&mut applied).await;
        assert_eq!(refused["spec"]["pool"]["generation"], 2);
        assert_eq!(
            taint_details(&refused, "gpu-3"),
            [(key.clone(), Some("refused".to_string()), "NoSchedule".to_string(), since)],
            "still the condition that began at start"
        );

        verdict.send_replace(RegistrationState::Registered);
        let registered = next_apply(&mut applied).await;
        assert_eq!(registered["spec"]["pool"]["generation"], 3);
        assert_eq!(registered["spec"]["devices"].as_array().unwrap().len(), 8);
        for d in registered["spec"]["devices"].as_array().unwrap() {
            assert!(d.get("taints").is_none(), "{d}");
        }

        // The plugin gone (its sender dropped) is no verdict: the next write is the shutdown one.
        drop(verdict);
        stop.send(()).unwrap();
        let last = next_apply(&mut applied).await;
        assert_eq!(last["spec"]["pool"]["generation"], 4);
        assert_eq!(
            taints(&last, "gpu-0"),
            [(format!("{DRIVER}/driver-unavailable"), "NoSchedule".to_string())]
        );
        task.await.unwrap().unwrap();
        assert!(metrics.encode().contains("switchyard_agent_publishes_total 4"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A change of the shares per device (the node's label changed) publishes the devices again,
    /// each shareable by that many claims; a value that does not change the devices writes
    /// nothing, and the shutdown keeps them shared.
    #[tokio::test]
    async fn a_shares_change_publishes_the_devices_again() {
        let (inventory, dir) = inventory("shares").await;
        let (client, mut applied) = fake_api(vec![], None);
        let (mut agent, _, _) = agent(inventory, client, SliceWatch::disabled());
        let (shares, rx) = SharesPerDevice::channel(1);
        agent.shares = rx;
        let (tx, rx) = mpsc::channel(8);
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(agent.run(rx, tx, async {
            let _ = stopped.await;
        }));
        let claims = |slice: serde_json::Value| -> Vec<u64> {
            let slice: ResourceSlice = serde_json::from_value(slice).unwrap();
            slice.spec.devices.iter().flatten().map(switchyard_api::sharing::claims_per_device).collect()
        };

        let first = next_apply(&mut applied).await;
        assert_eq!(first["spec"]["pool"]["generation"], 1);
        assert_eq!(claims(first), [1; 8]);
        shares.send_replace(4);
        let shared = next_apply(&mut applied).await;
        assert_eq!(shared["spec"]["pool"]["generation"], 2);
        assert_eq!(claims(shared), [4; 8]);
        shares.send_replace(4);

        stop.send(()).unwrap();
        let last = next_apply(&mut applied).await;
        assert_eq!(last["spec"]["pool"]["generation"], 3, "the same value again wrote nothing");
        assert_eq!(
            taints(&last, "gpu-0"),
            [(format!("{DRIVER}/driver-unavailable"), "NoSchedule".to_string())]
        );
        assert_eq!(claims(last), [4; 8]);
        task.await.unwrap().unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A shutdown requested before the loop starts is seen first: no discovery, no API request
    /// (the fake API panics on any), a prompt return.
    #[tokio::test]
    async fn shutdown_before_start_exits_at_once() {
        let (inventory, dir) = inventory("before").await;
        let (svc, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let (agent, metrics, _) = agent(inventory, kube::Client::new(svc, "default"), SliceWatch::disabled());
        let (tx, rx) = mpsc::channel(8);
        let run = agent.run(rx, tx, std::future::ready(()));
        tokio::time::timeout(Duration::from_secs(5), run).await.expect("returns promptly").unwrap();
        assert!(handle.next_request().await.is_none(), "no request was made");
        assert!(metrics.encode().contains("switchyard_agent_publishes_total 0"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
