//! Mocked-API tests of the thin layer: the exact requests the operator sends, answered by a
//! tower-test `Handle` standing in for the API server.

use std::pin::pin;

use http::{Method, Request, Response, StatusCode};
use kube::Client;
use kube::client::Body;
use serde_json::{Value, json};
use switchyard_operator::api::v1alpha1::GpuPoolMigrationSpec;
use switchyard_operator::node::drain::{self, Evicted, PodRef};
use switchyard_operator::{controller, pool::device_classes};
use tower_test::mock::{self, Handle};

type ApiHandle = Handle<Request<Body>, Response<Body>>;

fn mock_client() -> (Client, ApiHandle) {
    let (svc, handle) = mock::pair::<Request<Body>, Response<Body>>();
    (Client::new(svc, "default"), handle)
}

/// Answers exactly one request with `status` and `body`, and returns what was asked.
async fn answer_one(
    handle: ApiHandle,
    status: StatusCode,
    body: Value,
) -> (Method, String, Option<String>, Value) {
    let mut handle = pin!(handle);
    let (req, send) = handle.next_request().await.expect("the operator sent no request");
    let method = req.method().clone();
    let uri = req.uri().to_string();
    let content_type = req.headers().get(http::header::CONTENT_TYPE).map(|v| v.to_str().unwrap().to_string());
    let bytes = req.into_body().collect_bytes().await.unwrap();
    let sent: Value = if bytes.is_empty() { Value::Null } else { serde_json::from_slice(&bytes).unwrap() };
    send.send_response(
        Response::builder().status(status).body(Body::from(serde_json::to_vec(&body).unwrap())).unwrap(),
    );
    (method, uri, content_type, sent)
}

fn pod() -> PodRef {
    PodRef { namespace: "ml".into(), name: "trainer-0".into() }
}

#[tokio::test]
async fn eviction_posts_our_body_with_the_grace_period() {
    let (client, handle) = mock_client();
    let server = tokio::spawn(answer_one(
        handle,
        StatusCode::CREATED,
        json!({"kind": "Status", "apiVersion": "v1", "status": "Success"}),
    ));
    let got = drain::evict(client, &pod(), Some(45)).await.unwrap();
    assert_eq!(got, Evicted::Yes);
    let (method, uri, _, sent) = server.await.unwrap();
    assert_eq!(method, Method::POST);
    assert_eq!(uri, "/api/v1/namespaces/ml/pods/trainer-0/eviction?");
    assert_eq!(
        sent,
        json!({
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": "trainer-0", "namespace": "ml"},
            "deleteOptions": {"gracePeriodSeconds": 45}
        })
    );
}

#[tokio::test]
async fn eviction_without_grace_period_leaves_delete_options_out() {
    let (client, handle) = mock_client();
    let server =
        tokio::spawn(answer_one(handle, StatusCode::CREATED, json!({"kind": "Status", "status": "Success"})));
    drain::evict(client, &pod(), None).await.unwrap();
    let (_, _, _, sent) = server.await.unwrap();
    assert!(sent.get("deleteOptions").is_none(), "{sent}");
}

#[tokio::test]
async fn eviction_429_is_a_blocking_pdb_not_an_error() {
    let (client, handle) = mock_client();
    let status = json!({
        "kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 429, "reason": "TooManyRequests",
        "message": "Cannot evict pod as it would violate the pod's disruption budget.",
        "details": {"causes": [{"reason": "DisruptionBudget", "message": "The disruption budget trainer-pdb needs 2 healthy pods and has 2 currently"}]}
    });
    let server = tokio::spawn(answer_one(handle, StatusCode::TOO_MANY_REQUESTS, status));
    let got = drain::evict(client, &pod(), Some(30)).await.unwrap();
    server.await.unwrap();
    match got {
        Evicted::Blocked(m) => {
            assert!(m.contains("disruption budget"), "{m}");
            assert!(m.contains("trainer-pdb"), "the PDB must be named: {m}");
        }
        other => panic!("expected Blocked, got {other:?}"),
    }
}

#[tokio::test]
async fn eviction_of_a_gone_pod_is_fine_and_server_errors_are_transient() {
    let (client, handle) = mock_client();
    let server = tokio::spawn(answer_one(
        handle,
        StatusCode::NOT_FOUND,
        json!({"kind": "Status", "code": 404, "status": "Failure", "reason": "NotFound", "message": "pods \"trainer-0\" not found"}),
    ));
    assert_eq!(drain::evict(client, &pod(), None).await.unwrap(), Evicted::Gone);
    server.await.unwrap();

    let (client, handle) = mock_client();
    let server = tokio::spawn(answer_one(
        handle,
        StatusCode::INTERNAL_SERVER_ERROR,
        json!({"kind": "Status", "code": 500, "status": "Failure", "message": "etcd timeout"}),
    ));
    let err = drain::evict(client, &pod(), None).await.unwrap_err();
    server.await.unwrap();
    assert_eq!(err.category(), "EvictPod");
    assert!(err.is_transient());
}

fn spec() -> GpuPoolMigrationSpec {
    serde_json::from_value(json!({
        "nodeSelector": {"matchLabels": {"pool": "a100"}},
        "resources": [{"extendedResourceName": "nvidia.com/gpu", "deviceClassName": "gpu.switchyard.dev",
                       "selector": "device.attributes['gpu.switchyard.dev'].type == 'gpu'"}],
        "driver": {"name": "gpu.switchyard.dev", "daemonSet": {"namespace": "switchyard", "name": "driver"}},
        "devicePlugin": {"daemonSet": {"namespace": "gpu", "name": "nvidia-device-plugin"}}
    }))
    .unwrap()
}

#[tokio::test]
async fn device_class_is_server_side_applied_with_our_field_manager() {
    let (client, handle) = mock_client();
    let s = spec();
    let dc = device_classes::desired(&s, "pool-a", &s.resources[0]);
    let mut echoed = serde_json::to_value(&dc).unwrap();
    echoed["metadata"]["creationTimestamp"] = json!("2026-09-01T00:00:00Z");
    let server = tokio::spawn(answer_one(handle, StatusCode::OK, echoed));
    let applied = switchyard_operator::reconcile::execute::apply_device_class(&client, &dc).await.unwrap();
    assert_eq!(applied.metadata.name.as_deref(), Some("gpu.switchyard.dev"));
    let (method, uri, content_type, sent) = server.await.unwrap();
    assert_eq!(method, Method::PATCH);
    assert!(uri.starts_with("/apis/resource.k8s.io/v1/deviceclasses/gpu.switchyard.dev?"), "{uri}");
    assert!(uri.contains("fieldManager=switchyard-operator"), "{uri}");
    assert!(uri.contains("force=true"), "{uri}");
    assert_eq!(content_type.as_deref(), Some("application/apply-patch+yaml"));
    assert_eq!(sent["apiVersion"], "resource.k8s.io/v1");
    assert_eq!(sent["kind"], "DeviceClass");
    assert_eq!(sent["spec"]["extendedResourceName"], "nvidia.com/gpu");
    assert_eq!(
        sent["spec"]["selectors"][0]["cel"]["expression"],
        "device.driver == 'gpu.switchyard.dev' && (device.attributes['gpu.switchyard.dev'].type == 'gpu')"
    );
    assert_eq!(sent["metadata"]["labels"]["switchyard.dev/migration"], "pool-a");
}

#[tokio::test]
async fn device_class_conflict_surfaces_as_apply_error() {
    let (client, handle) = mock_client();
    let s = spec();
    let dc = device_classes::desired(&s, "pool-a", &s.resources[0]);
    let server = tokio::spawn(answer_one(
        handle,
        StatusCode::FORBIDDEN,
        json!({"kind": "Status", "code": 403, "status": "Failure", "message": "forbidden"}),
    ));
    let err = switchyard_operator::reconcile::execute::apply_device_class(&client, &dc).await.unwrap_err();
    server.await.unwrap();
    assert_eq!(err.category(), "ApplyDeviceClass");
    assert!(!err.is_transient());
}

#[tokio::test]
async fn served_apis_reads_the_resource_group_and_a_missing_group_serves_nothing() {
    let (client, handle) = mock_client();
    let list = json!({
        "kind": "APIResourceList", "apiVersion": "v1", "groupVersion": "resource.k8s.io/v1",
        "resources": [
            {"name": "deviceclasses", "singularName": "deviceclass", "namespaced": false, "kind": "DeviceClass", "verbs": ["list", "watch"]},
            {"name": "resourceslices", "singularName": "resourceslice", "namespaced": false, "kind": "ResourceSlice", "verbs": ["list", "watch"]}
        ]
    });
    let server = tokio::spawn(answer_one(handle, StatusCode::OK, list));
    let served = switchyard_operator::reads::server::served_apis(&client).await.unwrap();
    let (method, uri, _, _) = server.await.unwrap();
    assert_eq!((method, uri.as_str()), (Method::GET, "/apis/resource.k8s.io/v1"));
    assert!(served.device_classes && served.resource_slices);
    assert!(!served.resource_claims && !served.device_taint_rules);

    let (client, handle) = mock_client();
    let server = tokio::spawn(answer_one(
        handle,
        StatusCode::NOT_FOUND,
        json!({"kind": "Status", "code": 404, "status": "Failure", "reason": "NotFound", "message": "the server could not find the requested resource"}),
    ));
    let served = switchyard_operator::reads::server::served_apis(&client).await.unwrap();
    server.await.unwrap();
    assert!(!served.device_classes && !served.resource_slices);
}

mod execute {
    //! One reconcile's execute against a mocked API server: one node's failed patch is that
    //! node's, the other node still moves, and the status is written with both.

    use std::sync::{Arc, Mutex};

    use super::*;
    use k8s_openapi::jiff::Timestamp;
    use kube::runtime::reflector;
    use switchyard_operator::api::v1alpha1::GpuPoolMigration;
    use switchyard_operator::cache::{Caches, NodeWrites};
    use switchyard_operator::reconcile::context::{Config, Context};
    use switchyard_operator::reconcile::{decide, execute, observe};
    use switchyard_operator::report::metrics::Metrics;
    use switchyard_operator::testing;

    type Seen = Arc<Mutex<Vec<(Method, String, Value)>>>;

    /// Answers every request: a node PATCH of `failing` with a 500, everything else with what
    /// was sent (events, status, the other node).
    fn serve(handle: ApiHandle, failing: &'static str, migration: Value) -> Seen {
        let seen: Seen = Arc::default();
        let log = seen.clone();
        tokio::spawn(async move {
            let mut handle = pin!(handle);
            while let Some((req, send)) = handle.next_request().await {
                let (method, uri) = (req.method().clone(), req.uri().path().to_string());
                let bytes = req.into_body().collect_bytes().await.unwrap();
                let sent: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
                log.lock().unwrap().push((method.clone(), uri.clone(), sent.clone()));
                let (status, body) = if method == Method::PATCH && uri == format!("/api/v1/nodes/{failing}") {
                    let body = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                        "message": "etcdserver: request timed out", "reason": "InternalError", "code": 500});
                    (StatusCode::INTERNAL_SERVER_ERROR, body)
                } else if uri.starts_with("/api/v1/nodes/") {
                    let name = uri.trim_start_matches("/api/v1/nodes/");
                    (
                        StatusCode::OK,
                        json!({"apiVersion": "v1", "kind": "Node",
                        "metadata": {"name": name, "resourceVersion": "8"}}),
                    )
                } else if uri.ends_with("/status") {
                    let mut body = migration.clone();
                    body["status"] = sent["status"].clone();
                    (StatusCode::OK, body)
                } else {
                    let mut body = sent;
                    if body.get("metadata").is_none() {
                        body["metadata"] = json!({"name": "x"});
                    }
                    (if method == Method::POST { StatusCode::CREATED } else { StatusCode::OK }, body)
                };
                send.send_response(
                    Response::builder()
                        .status(status)
                        .body(Body::from(serde_json::to_vec(&body).unwrap()))
                        .unwrap(),
                );
            }
        });
        seen
    }

    #[tokio::test]
    async fn one_nodes_failed_patch_stays_its_own_and_the_status_is_written() {
        let (client, handle) = mock_client();
        let (migrations, _w) = reflector::store::<GpuPoolMigration>();
        let caches = Caches {
            nodes: reflector::store().0,
            daemon_sets: reflector::store().0,
            device_classes: reflector::store().0,
            resource_slices: reflector::store().0,
            gpu_pods: reflector::store().0,
            node_writes: Arc::new(NodeWrites::default()),
        };
        let config = Config { canary_namespace: "switchyard-system".into(), migration_selector: None };
        let ctx = Context::new(client, Arc::new(Metrics::new()), config, migrations, caches);

        let gpm: GpuPoolMigration = serde_json::from_value(json!({
            "apiVersion": "switchyard.dev/v1alpha1", "kind": "GpuPoolMigration",
            "metadata": {"name": "pool-a", "uid": "uid-1", "generation": 1},
            "spec": serde_json::to_value(spec()).unwrap()
        }))
        .unwrap();
        let mut gpm = gpm;
        gpm.spec.strategy.max_unavailable = k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(2);
        let seen = serve(handle, "n1", serde_json::to_value(&gpm).unwrap());
        let mut classes = device_classes::desired_all_synced(&gpm.spec, "pool-a", "uid-1", &[]);
        for c in &mut classes {
            c.metadata.creation_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                Timestamp::from_second(1).unwrap(),
            ));
        }
        use switchyard_operator::pool::placement::Role;
        let (dn, dp) = (&gpm.spec.driver.daemon_set, &gpm.spec.device_plugin.daemon_set);
        let nodes = vec![testing::gpu_node("n1", &json!({})), testing::gpu_node("n2", &json!({}))];
        let snapshot = observe::Snapshot {
            facts: testing::server_v1_37(),
            driver_ds: Some(testing::placed_daemon_set(&dn.namespace, &dn.name, Role::Driver)),
            plugin_ds: Some(testing::placed_daemon_set(&dp.namespace, &dp.name, Role::DevicePlugin)),
            device_classes: Some(classes),
            ..testing::snapshot(&gpm, nodes, 1_000_000)
        };
        let decision = decide::pool(&snapshot).unwrap();
        assert_eq!(decision.steps.len(), 2, "both nodes start: {:?}", decision.steps);

        let requeue = execute::pool(&ctx, &snapshot, decision, Vec::new()).await.unwrap();
        assert_eq!(
            requeue,
            kube::runtime::controller::Action::requeue(std::time::Duration::from_secs(5)),
            "a failed step is retried soon"
        );

        let seen = seen.lock().unwrap().clone();
        let mut patched: Vec<&str> = seen
            .iter()
            .filter(|(m, u, _)| *m == Method::PATCH && u.starts_with("/api/v1/nodes/"))
            .map(|(_, u, _)| u.as_str())
            .collect();
        // The steps run concurrently; which patch the server saw first does not matter.
        patched.sort_unstable();
        assert_eq!(patched, vec!["/api/v1/nodes/n1", "/api/v1/nodes/n2"], "n1's error did not stop n2");
        let (_, _, status) = seen
            .iter()
            .find(|(m, u, _)| *m == Method::PATCH && u.ends_with("/gpupoolmigrations/pool-a/status"))
            .expect("the status is written");
        let in_progress = &status["status"]["inProgress"];
        assert_eq!(in_progress[0]["name"], "n1");
        assert_eq!(in_progress[0]["state"], "Pending");
        let message = in_progress[0]["message"].as_str().unwrap();
        assert!(message.starts_with("StepError: ") && message.contains("request timed out"), "{message}");
        assert_eq!(in_progress[1]["name"], "n2");
        assert_eq!(in_progress[1]["state"], "Draining", "cordoned and draining in one write");
        let reasons: Vec<&str> = seen
            .iter()
            .filter_map(|(m, _, b)| (*m == Method::POST).then(|| b["reason"].as_str()).flatten())
            .collect();
        assert!(reasons.contains(&"NodeStepFailed"), "{reasons:?}");
        assert!(reasons.contains(&"NodeDraining"), "{reasons:?}");
    }
}

/// A pod LIST page: pods as (name, node), and the continue token for the next page.
fn pod_page(pods: &[(&str, &str)], next: Option<&str>) -> Value {
    let items: Vec<Value> = pods
        .iter()
        .map(|(name, node)| json!({"metadata": {"name": name, "namespace": "ml"}, "spec": {"nodeName": node, "containers": []}}))
        .collect();
    json!({"apiVersion": "v1", "kind": "PodList", "metadata": {"continue": next.unwrap_or("")}, "items": items})
}

#[tokio::test]
async fn pods_of_a_pool_come_from_paged_lists_of_bound_pods_not_one_per_node() {
    let (client, handle) = mock_client();
    let server = tokio::spawn(async move {
        let mut handle = pin!(handle);
        let mut uris = Vec::new();
        let pages = [
            pod_page(&[("a-0", "n1"), ("b-0", "elsewhere"), ("a-1", "n2")], Some("tok1")),
            pod_page(&[("a-2", "n1")], None),
        ];
        for page in pages {
            let (req, send) = handle.next_request().await.expect("a LIST page");
            assert_eq!(req.method(), Method::GET);
            uris.push(req.uri().to_string());
            send.send_response(
                Response::builder().body(Body::from(serde_json::to_vec(&page).unwrap())).unwrap(),
            );
        }
        uris
    });
    let nodes = std::collections::HashSet::from(["n1", "n2", "n3"]);
    let got = switchyard_operator::reads::pods::fold_pods_on_nodes(
        &client,
        &nodes,
        true,
        std::collections::HashMap::<String, Vec<String>>::new(),
        |by_node, node, p| {
            by_node.entry(node.to_owned()).or_default().push(p.metadata.name.unwrap_or_default())
        },
    )
    .await
    .unwrap();
    let uris = server.await.unwrap();
    // Two requests for three nodes; the server filters out unbound and finished pods.
    assert_eq!(uris.len(), 2, "{uris:?}");
    let fields = "fieldSelector=spec.nodeName%21%3D%2Cstatus.phase%21%3DSucceeded%2Cstatus.phase%21%3DFailed";
    assert!(uris[0].starts_with("/api/v1/pods?") && uris[0].contains(fields), "{}", uris[0]);
    assert!(uris[0].contains("limit=500") && !uris[0].contains("continue="), "{}", uris[0]);
    assert!(uris[1].contains("continue=tok1") && uris[1].contains("limit=500"), "{}", uris[1]);
    // Only the pool's nodes, in page order; a node without pods has no entry.
    assert_eq!(got.get("n1"), Some(&vec!["a-0".to_owned(), "a-2".to_owned()]));
    assert_eq!(got.get("n2"), Some(&vec!["a-1".to_owned()]));
    assert_eq!(got.len(), 2, "{got:?}");
}

#[tokio::test]
async fn a_stop_before_the_migration_crd_is_served_ends_the_controller_at_once() {
    // The API server answers every request 404, as before the GpuPoolMigration CRD is installed:
    // the migration cache never syncs, so kube-runtime never starts the reconcile runner that a
    // graceful shutdown waits for. Before the fix the operator hung after SIGTERM until killed.
    let (client, handle) = mock_client();
    let (gpm_listed_tx, gpm_listed) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(async move {
        let mut handle = pin!(handle);
        let mut gpm_listed_tx = Some(gpm_listed_tx);
        while let Some((req, send)) = handle.next_request().await {
            let path = req.uri().path().to_owned();
            if path.ends_with("/gpupoolmigrations")
                && let Some(tx) = gpm_listed_tx.take()
            {
                let _ = tx.send(());
            }
            send.send_response(
                Response::builder()
                    .status(StatusCode::NOT_FOUND)
                    .body(Body::from(b"404 page not found".to_vec()))
                    .unwrap(),
            );
        }
    });
    let ready = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let run = controller::run(
        client,
        std::sync::Arc::new(switchyard_operator::report::metrics::Metrics::new()),
        switchyard_operator::reconcile::context::Config {
            canary_namespace: "switchyard-system".into(),
            migration_selector: None,
        },
        ready.clone(),
        async move {
            // The stop comes once the migration watch has failed at least once.
            let _ = gpm_listed.await;
        },
    );
    // A bound on a hang, not a measurement: the stop itself takes no time.
    tokio::time::timeout(std::time::Duration::from_secs(30), run)
        .await
        .expect("the controller did not stop while its migration cache had not synced");
    assert!(!ready.load(std::sync::atomic::Ordering::SeqCst), "never synced, so never ready");
    // Its spawned readiness task still holds a client, so the mock server runs on: stop it.
    server.abort();
}
