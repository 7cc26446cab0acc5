//! Publication: the thin layer that writes the node's ResourceSlices with server-side apply,
//! bumps the pool generation on every change, deletes our stale slices, and backs off on failure.

use std::time::Duration;

use k8s_openapi::api::resource::v1::ResourceSlice;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use switchyard_operator::well_known;

use crate::error::Error;
use crate::slices::PoolIdentity;

/// Writes one node's pool. Remembers what it last wrote so that it writes only on change.
pub struct Publisher {
    api: Api<ResourceSlice>,
    id: PoolIdentity,
    generation: i64,
    /// The last slices written successfully, with generation 0 (content only).
    last: Option<Vec<ResourceSlice>>,
}

impl Publisher {
    pub fn new(client: kube::Client, id: PoolIdentity) -> Self {
        Publisher { api: Api::all(client), id, generation: 0, last: None }
    }

    /// Selects exactly our slices: our label, our node, our driver.
    fn ours(&self) -> ListParams {
        ListParams::default()
            .labels(&format!("{}={}", well_known::LABEL_MANAGED_BY, well_known::AGENT_FIELD_MANAGER))
            .fields(&format!("spec.nodeName={},spec.driver={}", self.id.node_name, self.id.driver))
    }

    /// Continue from the highest pool generation already in the API (a restarted agent must not
    /// publish a generation consumers would ignore as older).
    pub async fn init(&mut self) -> Result<(), Error> {
        let existing = self.api.list(&self.ours()).await.map_err(Error::ListSlices)?;
        self.generation =
            existing.items.iter().map(|s| s.spec.pool.generation).max().unwrap_or(0).max(self.generation);
        Ok(())
    }

    /// Whether `desired` (built with generation 0) is what was last written.
    pub fn is_current(&self, desired: &[ResourceSlice]) -> bool {
        self.last.as_deref() == Some(desired)
    }

    pub fn generation(&self) -> i64 {
        self.generation
    }

    /// Write `desired` (built with generation 0) if it differs from the last successful write:
    /// every slice at a new generation, then delete our slices that are no longer desired. Returns
    /// whether anything was written. On error nothing is remembered, so the caller's next attempt
    /// writes again.
    pub async fn publish(&mut self, desired: &[ResourceSlice]) -> Result<bool, Error> {
        if self.is_current(desired) {
            return Ok(false);
        }
        self.generation += 1;
        let pp = PatchParams::apply(well_known::AGENT_FIELD_MANAGER).force();
        let mut names = Vec::with_capacity(desired.len());
        for slice in desired {
            let mut slice = slice.clone();
            slice.spec.pool.generation = self.generation;
            let name = slice.metadata.name.clone().unwrap_or_default();
            self.api
                .patch(&name, &pp, &Patch::Apply(&slice))
                .await
                .map_err(|source| Error::PublishSlice { name: name.clone(), source })?;
            names.push(name);
        }
        let existing = self.api.list_metadata(&self.ours()).await.map_err(Error::ListSlices)?;
        for stale in
            existing.items.iter().filter_map(|s| s.metadata.name.as_ref()).filter(|n| !names.contains(n))
        {
            match self.api.delete(stale, &DeleteParams::default()).await {
                Ok(_) => tracing::info!(slice = %stale, "deleted stale ResourceSlice"),
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(source) => return Err(Error::DeleteSlice { name: stale.clone(), source }),
            }
        }
        self.last = Some(desired.to_vec());
        Ok(true)
    }
}

/// Exponential backoff for failed publications: transient errors start at `base` and double up to
/// `cap`; other errors wait `cap` straight away (they need a human or a new state, but the desired
/// state is still retried so it is never lost).
#[derive(Clone, Debug)]
pub struct Backoff {
    base: Duration,
    cap: Duration,
    attempt: u32,
}

impl Default for Backoff {
    /// 200 ms first retry keeps event-to-taint low on a blip; 30 s cap keeps a broken API server
    /// from being hammered by every node.
    fn default() -> Self {
        Backoff { base: Duration::from_millis(200), cap: Duration::from_secs(30), attempt: 0 }
    }
}

impl Backoff {
    pub fn new(base: Duration, cap: Duration) -> Self {
        Backoff { base, cap, attempt: 0 }
    }

    /// Delay before the next attempt after a failure.
    pub fn next(&mut self, transient: bool) -> Duration {
        let d = if transient {
            self.base.saturating_mul(1u32.checked_shl(self.attempt.min(31)).unwrap_or(u32::MAX)).min(self.cap)
        } else {
            self.cap
        };
        self.attempt = self.attempt.saturating_add(1);
        d
    }

    pub fn reset(&mut self) {
        self.attempt = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::health::HealthState;
    use crate::inventory::{Gpu, NodeInventory};
    use crate::slices::desired_slices;
    use http::{Method, Request, Response};
    use kube::client::Body;

    #[test]
    fn backoff_doubles_to_the_cap_and_resets() {
        let mut b = Backoff::new(Duration::from_millis(100), Duration::from_secs(1));
        let got: Vec<u128> = (0..6).map(|_| b.next(true).as_millis()).collect();
        assert_eq!(got, [100, 200, 400, 800, 1000, 1000]);
        assert_eq!(b.next(false), Duration::from_secs(1), "non-transient waits the cap");
        b.reset();
        assert_eq!(b.next(true), Duration::from_millis(100));
        let mut b = Backoff::default();
        for _ in 0..100 {
            b.next(true);
        }
        assert_eq!(b.next(true), Duration::from_secs(30), "no overflow after many attempts");
    }

    fn id() -> PoolIdentity {
        PoolIdentity {
            node_name: "node-a".into(),
            node_uid: "uid-1".into(),
            driver: "gpu.switchyard.dev".into(),
        }
    }

    fn inventory(n: u32) -> NodeInventory {
        NodeInventory {
            driver_version: "570.124.06".into(),
            cuda_driver_version: "12.8".into(),
            gpus: (0..n)
                .map(|i| Gpu {
                    index: i,
                    uuid: format!("GPU-{i}"),
                    product_name: "X".into(),
                    ..Default::default()
                })
                .collect(),
        }
    }

    fn json(v: serde_json::Value) -> Response<Body> {
        Response::builder().status(200).body(Body::from(serde_json::to_vec(&v).unwrap())).unwrap()
    }

    fn slice_list(items: Vec<(&str, i64)>) -> serde_json::Value {
        serde_json::json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSliceList", "metadata": {},
            "items": items.into_iter().map(|(n, g)| serde_json::json!({
                "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": n},
                "spec": {"driver": "gpu.switchyard.dev", "nodeName": "node-a", "pool": {"name": "node-a", "generation": g, "resourceSliceCount": 1}}
            })).collect::<Vec<_>>()
        })
    }

    async fn body_json(req: Request<Body>) -> serde_json::Value {
        let bytes = req.into_body().collect_bytes().await.unwrap();
        serde_json::from_slice(&bytes).unwrap()
    }

    /// init continues from the API's generation, a change applies every slice at the next
    /// generation with our field manager and deletes our stale slice, and an unchanged state
    /// writes nothing.
    #[tokio::test]
    async fn publish_applies_bumps_generation_and_deletes_stale() {
        let (svc, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let client = kube::Client::new(svc, "default");
        let server = tokio::spawn(async move {
            // init: list ours
            let (req, send) = handle.next_request().await.unwrap();
            assert_eq!(req.method(), Method::GET);
            let q = req.uri().query().unwrap().to_string();
            assert!(q.contains("labelSelector=switchyard.dev%2Fmanaged-by%3Dswitchyard-driver-agent"), "{q}");
            assert!(
                q.contains("fieldSelector=spec.nodeName%3Dnode-a%2Cspec.driver%3Dgpu.switchyard.dev"),
                "{q}"
            );
            send.send_response(json(slice_list(vec![
                ("node-a-gpu-switchyard-dev-0", 4),
                ("node-a-gpu-switchyard-dev-1", 4),
            ])));
            // publish: one apply
            let (req, send) = handle.next_request().await.unwrap();
            assert_eq!(req.method(), Method::PATCH);
            assert_eq!(
                req.uri().path(),
                "/apis/resource.k8s.io/v1/resourceslices/node-a-gpu-switchyard-dev-0"
            );
            let q = req.uri().query().unwrap().to_string();
            assert!(q.contains("fieldManager=switchyard-driver-agent") && q.contains("force=true"), "{q}");
            assert_eq!(req.headers()["content-type"], "application/apply-patch+yaml");
            let body = body_json(req).await;
            assert_eq!(body["spec"]["pool"]["generation"], 5);
            assert_eq!(body["spec"]["devices"].as_array().unwrap().len(), 2);
            send.send_response(json(body));
            // stale cleanup: list, then delete slice 1 which is no longer desired
            let (req, send) = handle.next_request().await.unwrap();
            assert_eq!(req.method(), Method::GET);
            send.send_response(json(slice_list(vec![
                ("node-a-gpu-switchyard-dev-0", 5),
                ("node-a-gpu-switchyard-dev-1", 4),
            ])));
            let (req, send) = handle.next_request().await.unwrap();
            assert_eq!(req.method(), Method::DELETE);
            assert_eq!(
                req.uri().path(),
                "/apis/resource.k8s.io/v1/resourceslices/node-a-gpu-switchyard-dev-1"
            );
            send.send_response(json(serde_json::json!({"kind": "Status", "apiVersion": "v1", "status": "Success", "metadata": {}})));
            handle
        });
        let mut p = Publisher::new(client, id());
        p.init().await.unwrap();
        assert_eq!(p.generation(), 4);
        let desired = desired_slices(&id(), &inventory(2), &HealthState::default(), None, 0);
        assert!(p.publish(&desired).await.unwrap());
        assert_eq!(p.generation(), 5);
        let mut handle = server.await.unwrap();
        // Unchanged: no request at all (the mock would hang the test if one were made).
        assert!(p.is_current(&desired));
        assert!(!p.publish(&desired).await.unwrap());
        drop(p);
        assert!(handle.next_request().await.is_none());
    }

    /// A failed apply is not remembered: the next attempt writes again, at a higher generation.
    #[tokio::test]
    async fn failed_publish_is_retried_not_lost() {
        let (svc, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let client = kube::Client::new(svc, "default");
        let server = tokio::spawn(async move {
            let (_, send) = handle.next_request().await.unwrap();
            send.send_response(
                Response::builder()
                    .status(503)
                    .body(Body::from(
                        serde_json::to_vec(&serde_json::json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": "etcd", "reason": "ServiceUnavailable", "code": 503, "metadata": {}})).unwrap(),
                    ))
                    .unwrap(),
            );
            let (req, send) = handle.next_request().await.unwrap();
            assert_eq!(req.method(), Method::PATCH);
            let body = body_json(req).await;
            assert_eq!(body["spec"]["pool"]["generation"], 2);
            send.send_response(json(body));
            let (_, send) = handle.next_request().await.unwrap();
            send.send_response(json(slice_list(vec![("node-a-gpu-switchyard-dev-0", 2)])));
        });
        let mut p = Publisher::new(client, id());
        let desired = desired_slices(&id(), &inventory(1), &HealthState::default(), None, 0);
        let err = p.publish(&desired).await.unwrap_err();
        assert!(matches!(err, Error::PublishSlice { .. }) && err.is_transient(), "{err}");
        assert!(!p.is_current(&desired));
        assert!(p.publish(&desired).await.unwrap());
        assert!(p.is_current(&desired));
        server.await.unwrap();
    }
}
