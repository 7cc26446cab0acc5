//! Publication: the thin layer that writes the node's ResourceSlices with server-side apply,
//! bumps the pool generation on every change, deletes our stale slices, backs off on failure, and
//! watches our slices so that one deleted or changed by someone else is written again.

use std::collections::BTreeMap;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::resource::v1::ResourceSlice;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use kube::runtime::watcher;
use switchyard_api::well_known;
use tokio::sync::mpsc;

use crate::error::Error;
use crate::slices::PoolIdentity;

/// The API's identity of one slice we wrote, from the apply response: `uid` tells our object from
/// one recreated under the same name, `metadata.generation` (which the API server bumps on every
/// spec change, and only then) tells our write from a later one by someone else. Either is `None`
/// when the response lacks it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SliceRef {
    pub name: String,
    pub uid: Option<String>,
    pub generation: Option<i64>,
}

impl SliceRef {
    pub fn of(s: &ResourceSlice) -> Self {
        SliceRef {
            name: s.metadata.name.clone().unwrap_or_default(),
            uid: s.metadata.uid.clone(),
            generation: s.metadata.generation,
        }
    }
}

/// What the watch on our slices saw.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SliceEvent {
    /// A slice was created or changed.
    Applied(SliceRef),
    /// A slice was deleted (or stopped matching the selector, e.g. lost our label).
    Deleted(SliceRef),
    /// A full (re)list: every slice of ours that exists.
    Listed(Vec<SliceRef>),
}

/// Why the API no longer holds what we last wrote, or `None` when it does as far as `event`
/// tells. Pure. Events about objects older than what we wrote (the watch lags behind our own
/// writes) are not drift: a lower generation, or on `Applied`/`Deleted` another uid, means the
/// event predates our write. Slices we did not write (stale ones we deleted) are not drift either.
pub fn drift(written: &BTreeMap<String, SliceRef>, event: &SliceEvent) -> Option<&'static str> {
    let same_object = |w: &SliceRef, r: &SliceRef| match (&w.uid, &r.uid) {
        (Some(a), Some(b)) => a == b,
        _ => true,
    };
    let newer =
        |w: &SliceRef, r: &SliceRef| matches!((w.generation, r.generation), (Some(a), Some(b)) if b > a);
    match event {
        SliceEvent::Deleted(r) => {
            written.get(&r.name).filter(|w| same_object(w, r)).map(|_| "a slice was deleted")
        }
        SliceEvent::Applied(r) => written
            .get(&r.name)
            .filter(|w| same_object(w, r) && newer(w, r))
            .map(|_| "a slice was changed by someone else"),
        SliceEvent::Listed(items) => {
            let by_name: BTreeMap<&str, &SliceRef> = items.iter().map(|r| (r.name.as_str(), r)).collect();
            written.values().find_map(|w| match by_name.get(w.name.as_str()) {
                None => Some("a slice is missing"),
                Some(r) if !same_object(w, r) => Some("a slice was replaced"),
                Some(r) if newer(w, r) => Some("a slice was changed by someone else"),
                Some(_) => None,
            })
        }
    }
}

/// Label and field selectors of exactly our slices: our label, our node, our driver.
fn our_selectors(id: &PoolIdentity) -> (String, String) {
    (
        format!("{}={}", well_known::LABEL_MANAGED_BY, well_known::AGENT_FIELD_MANAGER),
        format!("spec.nodeName={},spec.driver={}", id.node_name, id.driver),
    )
}

/// Writes one node's pool. Remembers what it last wrote so that it writes only on change, and
/// forgets it when the API no longer holds it (see [`Publisher::observe`]).
pub struct Publisher {
    api: Api<ResourceSlice>,
    id: PoolIdentity,
    generation: i64,
    /// The last slices written successfully, with generation 0 (content only).
    last: Option<Vec<ResourceSlice>>,
    /// The slices of the last write as the API answered, by name.
    written: BTreeMap<String, SliceRef>,
}

impl Publisher {
    pub fn new(client: kube::Client, id: PoolIdentity) -> Self {
        Publisher { api: Api::all(client), id, generation: 0, last: None, written: BTreeMap::new() }
    }

    /// Selects exactly our slices: our label, our node, our driver.
    fn ours(&self) -> ListParams {
        let (labels, fields) = our_selectors(&self.id);
        ListParams::default().labels(&labels).fields(&fields)
    }

    /// Continue from the highest pool generation already in the API (a restarted agent must not
    /// publish a generation consumers would ignore as older). Returns our slices as the API has
    /// them, the state a previous run left (see `HealthState::restore`).
    pub async fn init(&mut self) -> Result<Vec<ResourceSlice>, Error> {
        let existing = self.api.list(&self.ours()).await.map_err(Error::ListSlices)?;
        self.generation =
            existing.items.iter().map(|s| s.spec.pool.generation).max().unwrap_or(0).max(self.generation);
        Ok(existing.items)
    }

    /// Take in what the watch on our slices saw. When the API no longer holds what we last wrote
    /// (deleted by the kubelet or an admin, or changed by someone else), forget the last write so
    /// that the next [`Publisher::publish`] writes again, at a new generation. Returns the reason
    /// when it did.
    pub fn observe(&mut self, event: &SliceEvent) -> Option<&'static str> {
        let reason = drift(&self.written, event)?;
        self.last = None;
        self.written.clear();
        Some(reason)
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
            let applied = self
                .api
                .patch(&name, &pp, &Patch::Apply(&slice))
                .await
                .map_err(|source| Error::PublishSlice { name: name.clone(), source })?;
            self.written.insert(name.clone(), SliceRef { name: name.clone(), ..SliceRef::of(&applied) });
            names.push(name);
        }
        self.written.retain(|n, _| names.contains(n));
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

/// The stream of [`SliceEvent`]s about our slices, as the agent loop reads it.
pub struct SliceWatch {
    rx: mpsc::Receiver<SliceEvent>,
}

impl SliceWatch {
    /// A watch that never reports anything (tests, or no API server).
    pub fn disabled() -> Self {
        let (tx, rx) = mpsc::channel(1);
        // Keep the sender alive so that `next()` waits forever instead of ending.
        std::mem::forget(tx);
        SliceWatch { rx }
    }

    /// A watch fed by the caller, for tests of the loop.
    pub fn from_channel(rx: mpsc::Receiver<SliceEvent>) -> Self {
        SliceWatch { rx }
    }

    /// Watches our slices (same selectors as the publisher's list) until the receiver is dropped.
    /// The watcher re-lists after a broken watch; each list becomes one [`SliceEvent::Listed`].
    pub fn watch(client: kube::Client, id: &PoolIdentity) -> Self {
        // Bursts are a handful of events (one per slice); the watcher waits when it is full.
        let (tx, rx) = mpsc::channel(16);
        let (labels, fields) = our_selectors(id);
        let api: Api<ResourceSlice> = Api::all(client);
        tokio::spawn(async move {
            let config = watcher::Config::default().labels(&labels).fields(&fields);
            // A short backoff of its own (at most 5 s), not client-go's 30 s: the slices are back in
            // view within seconds of an API-server restart.
            let mut stream = switchyard_api::watch::backed_off(watcher(api, config)).boxed();
            let mut listing: Vec<SliceRef> = Vec::new();
            while let Some(event) = stream.next().await {
                let event = match event {
                    Ok(watcher::Event::Init) => {
                        listing.clear();
                        continue;
                    }
                    Ok(watcher::Event::InitApply(s)) => {
                        listing.push(SliceRef::of(&s));
                        continue;
                    }
                    Ok(watcher::Event::InitDone) => SliceEvent::Listed(std::mem::take(&mut listing)),
                    Ok(watcher::Event::Apply(s)) => SliceEvent::Applied(SliceRef::of(&s)),
                    Ok(watcher::Event::Delete(s)) => SliceEvent::Deleted(SliceRef::of(&s)),
                    Err(e) => {
                        tracing::warn!(error = %e, "watching our ResourceSlices failed; the watcher retries");
                        continue;
                    }
                };
                if tx.send(event).await.is_err() {
                    return;
                }
            }
        });
        SliceWatch { rx }
    }

    /// The next event; waits forever once the watch has ended.
    pub async fn next(&mut self) -> SliceEvent {
        match self.rx.recv().await {
            Some(e) => e,
            None => std::future::pending().await,
        }
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
    use crate::discovery::{Gpu, NodeGpus};
    use crate::health::HealthState;
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

    fn inventory(n: u32) -> NodeGpus {
        NodeGpus {
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
        let desired = desired_slices(&id(), &inventory(2), &HealthState::default(), &[], 1, 0);
        assert!(p.publish(&desired).await.unwrap());
        assert_eq!(p.generation(), 5);
        let mut handle = server.await.unwrap();
        // Unchanged: no request at all (the mock would hang the test if one were made).
        assert!(p.is_current(&desired));
        assert!(!p.publish(&desired).await.unwrap());
        drop(p);
        assert!(handle.next_request().await.is_none());
    }

    #[test]
    fn drift_is_a_missing_or_foreign_changed_slice_not_a_lagging_event() {
        let r = |name: &str, uid: Option<&str>, generation: Option<i64>| SliceRef {
            name: name.into(),
            uid: uid.map(str::to_string),
            generation,
        };
        let written: BTreeMap<String, SliceRef> =
            [r("s-0", Some("u0"), Some(5)), r("s-1", Some("u1"), Some(2))]
                .into_iter()
                .map(|w| (w.name.clone(), w))
                .collect();
        use SliceEvent::*;
        let cases: Vec<(&str, SliceEvent, Option<&str>)> = vec![
            ("ours deleted", Deleted(r("s-1", Some("u1"), Some(2))), Some("a slice was deleted")),
            ("ours deleted, uid unknown", Deleted(r("s-1", None, None)), Some("a slice was deleted")),
            ("an older object of that name deleted", Deleted(r("s-1", Some("old"), Some(9))), None),
            ("a stale slice we deleted", Deleted(r("s-2", Some("u2"), Some(1))), None),
            ("our write echoed", Applied(r("s-0", Some("u0"), Some(5))), None),
            ("an earlier write echoed late", Applied(r("s-0", Some("u0"), Some(4))), None),
            (
                "changed after our write",
                Applied(r("s-0", Some("u0"), Some(6))),
                Some("a slice was changed by someone else"),
            ),
            ("an older object changed", Applied(r("s-0", Some("old"), Some(9))), None),
            ("no generation to compare", Applied(r("s-0", Some("u0"), None)), None),
            ("a slice we did not write", Applied(r("s-9", Some("u9"), Some(1))), None),
            (
                "list has ours",
                Listed(vec![r("s-0", Some("u0"), Some(5)), r("s-1", Some("u1"), Some(2))]),
                None,
            ),
            (
                "list lags behind our write",
                Listed(vec![r("s-0", Some("u0"), Some(4)), r("s-1", Some("u1"), Some(2))]),
                None,
            ),
            ("list misses one", Listed(vec![r("s-0", Some("u0"), Some(5))]), Some("a slice is missing")),
            ("list is empty", Listed(vec![]), Some("a slice is missing")),
            (
                "list has another object of that name",
                Listed(vec![r("s-0", Some("u0"), Some(5)), r("s-1", Some("new"), Some(1))]),
                Some("a slice was replaced"),
            ),
            (
                "list has a foreign change",
                Listed(vec![r("s-0", Some("u0"), Some(7)), r("s-1", Some("u1"), Some(2))]),
                Some("a slice was changed by someone else"),
            ),
        ];
        for (name, event, want) in cases {
            assert_eq!(drift(&written, &event), want, "{name}");
        }
        assert_eq!(drift(&BTreeMap::new(), &Listed(vec![])), None, "nothing written yet");
    }

    /// The watch uses the publisher's selectors and turns a list and watch events into
    /// `SliceEvent`s.
    #[tokio::test]
    async fn slice_watch_lists_then_forwards_events() {
        let (svc, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let client = kube::Client::new(svc, "default");
        let slice = |name: &str, uid: &str, generation: i64| {
            serde_json::json!({
                "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
                "metadata": {"name": name, "uid": uid, "generation": generation, "resourceVersion": "11"},
                "spec": {"driver": "gpu.switchyard.dev", "nodeName": "node-a", "pool": {"name": "node-a", "generation": 1, "resourceSliceCount": 1}}
            })
        };
        let server = tokio::spawn(async move {
            let (req, send) = handle.next_request().await.unwrap();
            let q = req.uri().query().unwrap().to_string();
            assert!(!q.contains("watch=true"), "a list first: {q}");
            assert!(q.contains("labelSelector=switchyard.dev%2Fmanaged-by%3Dswitchyard-driver-agent"), "{q}");
            assert!(
                q.contains("fieldSelector=spec.nodeName%3Dnode-a%2Cspec.driver%3Dgpu.switchyard.dev"),
                "{q}"
            );
            send.send_response(json(serde_json::json!({
                "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSliceList", "metadata": {"resourceVersion": "10"},
                "items": [slice("s-0", "u0", 3)]
            })));
            let (req, send) = handle.next_request().await.unwrap();
            let q = req.uri().query().unwrap().to_string();
            assert!(q.contains("watch=true") && q.contains("fieldSelector=spec.nodeName%3Dnode-a"), "{q}");
            let mut lines = Vec::new();
            for (ty, obj) in [("DELETED", slice("s-0", "u0", 3)), ("ADDED", slice("s-0", "u1", 1))] {
                lines.extend(serde_json::to_vec(&serde_json::json!({"type": ty, "object": obj})).unwrap());
                lines.push(b'\n');
            }
            send.send_response(Response::builder().status(200).body(Body::from(lines)).unwrap());
            handle
        });
        let mut watch = SliceWatch::watch(client, &id());
        let r = |uid: &str, generation: i64| SliceRef {
            name: "s-0".into(),
            uid: Some(uid.into()),
            generation: Some(generation),
        };
        assert_eq!(watch.next().await, SliceEvent::Listed(vec![r("u0", 3)]));
        assert_eq!(watch.next().await, SliceEvent::Deleted(r("u0", 3)));
        assert_eq!(watch.next().await, SliceEvent::Applied(r("u1", 1)));
        drop(server);
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
        let desired = desired_slices(&id(), &inventory(1), &HealthState::default(), &[], 1, 0);
        let err = p.publish(&desired).await.unwrap_err();
        assert!(matches!(err, Error::PublishSlice { .. }) && err.is_transient(), "{err}");
        assert!(!p.is_current(&desired));
        assert!(p.publish(&desired).await.unwrap());
        assert!(p.is_current(&desired));
        server.await.unwrap();
    }
}
