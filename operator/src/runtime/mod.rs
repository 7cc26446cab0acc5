//! The operator process: leader election, the controller, `/metrics`, `/readyz` (the leader: its
//! caches synced; a standby: it reads the Lease, so it can take over),
//! `/livez`, and a graceful stop on SIGTERM (stop being ready, finish in-flight reconciles, give
//! the lease back, return).

pub mod alloc;
pub mod leader;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use tokio::sync::watch;
use tracing::{error, info, warn};

use crate::controller;
use crate::reconcile::context::Config;
use crate::report::metrics::Metrics;
use crate::runtime::leader::{Elector, RENEW_DEADLINE, RENEW_INTERVAL};

/// How long a stop (SIGTERM) waits for the reconciles in flight before it aborts them: under the
/// packaged pods' `terminationGracePeriodSeconds` of 30, with time left to release the Lease.
/// What an aborted reconcile left half done is in the API, and the next leader resumes it.
pub const STOP_GRACE: std::time::Duration = std::time::Duration::from_secs(20);

/// Everything `main` parses from flags and environment.
#[derive(Clone, Debug)]
pub struct Settings {
    pub metrics_addr: SocketAddr,
    /// The operator's namespace: the Lease and canary pods live here.
    pub namespace: String,
    pub lease_name: String,
    pub identity: String,
    pub leader_election: bool,
    /// Label selector on the GpuPoolMigrations this operator manages (`None`: all).
    pub migration_selector: Option<String>,
}

#[derive(Clone)]
struct Health {
    metrics: Arc<Metrics>,
    ready: Arc<AtomicBool>,
}

async fn metrics_handler(State(h): State<Health>) -> impl IntoResponse {
    if let Some(bytes) = alloc::heap_in_use() {
        h.metrics.set_heap_in_use(bytes);
    }
    h.metrics.refresh_cluster();
    (
        [(header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")],
        h.metrics.encode(),
    )
}

async fn readyz(State(h): State<Health>) -> impl IntoResponse {
    if h.ready.load(Ordering::SeqCst) {
        (StatusCode::OK, "ok")
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "not ready (leader: caches not synced; standby: the Lease cannot be read)",
        )
    }
}

async fn livez() -> impl IntoResponse {
    (StatusCode::OK, "ok")
}

/// The health and metrics endpoints.
pub fn router(metrics: Arc<Metrics>, ready: Arc<AtomicBool>) -> Router {
    Router::new()
        .route("/metrics", get(metrics_handler))
        .route("/readyz", get(readyz))
        .route("/livez", get(livez))
        .with_state(Health { metrics, ready })
}

/// Resolves on SIGTERM or Ctrl-C.
/// SIGTERM or Ctrl-C. The SIGTERM handler is installed when this is called, not when the future is
/// first polled: a kubelet's SIGTERM that arrives while the process is still starting is kept and
/// ends the run, instead of killing the process with the default action.
fn termination() -> impl std::future::Future<Output = ()> {
    #[cfg(unix)]
    let term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate());
    async move {
        #[cfg(unix)]
        match term {
            Ok(mut term) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = tokio::signal::ctrl_c() => {}
                }
            }
            Err(e) => {
                warn!(error = %e, "cannot listen for SIGTERM; only Ctrl-C stops the operator");
                let _ = tokio::signal::ctrl_c().await;
            }
        }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

/// The API client. kube's default retry layer is off: it retries 429 up to 15 times with a
/// backoff that grows to minutes, and a PodDisruptionBudget refusing an eviction answers 429. The
/// reconciler must see that answer at once (to report the blocking PDB and requeue); its own
/// error policy backs off transient failures.
pub async fn client() -> anyhow::Result<kube::Client> {
    let mut config = kube::Config::infer().await?;
    config.default_retry = false;
    // Names the operator in audit logs and API server metrics.
    config.headers.push((
        http::header::USER_AGENT,
        http::HeaderValue::from_static(concat!("switchyard-operator/", env!("CARGO_PKG_VERSION"))),
    ));
    Ok(kube::Client::try_from(config)?)
}

/// Serves `/metrics`, `/readyz` and `/livez` until `stop` turns true.
async fn serve(listener: tokio::net::TcpListener, app: Router, mut stop: watch::Receiver<bool>) {
    let res = axum::serve(listener, app)
        .with_graceful_shutdown(async move {
            let _ = stop.wait_for(|s| *s).await;
        })
        .await;
    if let Err(e) = res {
        error!(error = %e, "health server failed");
    }
}

/// Renews the lease until leadership is lost, then says so on `lost`.
async fn keep_leading(elector: Elector, lost: watch::Sender<bool>) {
    // Leadership is lost when another holder has the Lease, or when no renewal has
    // succeeded for RENEW_DEADLINE; each attempt is bounded by what is left of it, so a
    // hung request cannot outlast the lease.
    let mut renewed = tokio::time::Instant::now();
    loop {
        tokio::time::sleep(RENEW_INTERVAL).await;
        let left = RENEW_DEADLINE.saturating_sub(renewed.elapsed());
        match tokio::time::timeout(left, elector.try_acquire()).await {
            Ok(Ok(true)) => renewed = tokio::time::Instant::now(),
            Ok(Ok(false)) => {
                warn!("another replica holds the lease");
                let _ = lost.send(true);
                return;
            }
            Ok(Err(e)) => warn!(error = %e, "renewing the lease failed"),
            Err(_) => warn!("renewing the lease timed out"),
        }
        if renewed.elapsed() >= RENEW_DEADLINE {
            warn!(deadline = ?RENEW_DEADLINE, "no renewal within the deadline");
            let _ = lost.send(true);
            return;
        }
    }
}

/// The operator process: serves `/metrics`, `/readyz` and `/livez`, stands by until it holds the
/// lease (with `leader_election`), runs the controller, and on SIGTERM or a lost lease stops:
/// not ready, in-flight reconciles finished (or aborted at once when the lease was lost), the
/// lease given back. It fails when it cannot start (no API client, the port taken) and when it
/// lost the lease, so that the pod restarts, as a standby.
///
/// Kept whole although it is over 100 lines: the process's life reads top to bottom, each phase
/// handing the next its channels and its lease; the health server and the lease renewal are
/// functions of their own.
pub async fn run(settings: Settings) -> anyhow::Result<()> {
    // Listening for SIGTERM before anything else: a stop during start-up is a clean stop too.
    let term = termination();
    tokio::pin!(term);
    let client = client().await?;
    let metrics = Arc::new(Metrics::new());
    let ready = Arc::new(AtomicBool::new(false));

    let listener = tokio::net::TcpListener::bind(settings.metrics_addr).await?;
    info!(addr = %settings.metrics_addr, "serving /metrics, /readyz, /livez");
    let app = router(metrics.clone(), ready.clone());
    let (stop_tx, stop_rx) = watch::channel(false);
    let http = tokio::spawn(serve(listener, app, stop_rx.clone()));

    let elector = Elector::new(client.clone(), &settings.namespace, &settings.lease_name, &settings.identity);
    if settings.leader_election {
        info!(lease = %settings.lease_name, identity = %settings.identity, "waiting for leadership");
        loop {
            tokio::select! {
                _ = &mut term => {
                    let _ = stop_tx.send(true);
                    let _ = http.await;
                    return Ok(());
                }
                r = elector.try_acquire() => match r {
                    Ok(true) => break,
                    // Standing by: the API server answers and another replica leads. Ready, as a
                    // standby that can take over is what the operator's PodDisruptionBudget
                    // (maxUnavailable 1) counts on: with it unready, `kubectl drain` of the
                    // leader's node could never evict the leader.
                    Ok(false) => ready.store(true, Ordering::SeqCst),
                    Err(e) => {
                        ready.store(false, Ordering::SeqCst);
                        warn!(error = %e, "leader election round failed");
                    }
                }
            }
            tokio::time::sleep(RENEW_INTERVAL).await;
        }
        // Leading: ready again once the controller's caches have synced.
        ready.store(false, Ordering::SeqCst);
        info!("leading");
    }
    metrics.leader.set(1);

    // Shutdown fires on SIGTERM or on lost leadership.
    let (lost_tx, mut lost_rx) = watch::channel(false);
    let renew = settings.leader_election.then(|| {
        let elector =
            Elector::new(client.clone(), &settings.namespace, &settings.lease_name, &settings.identity);
        tokio::spawn(keep_leading(elector, lost_tx))
    });
    let mut shutdown_stop = stop_rx.clone();
    let shutdown = async move {
        let _ = shutdown_stop.wait_for(|s| *s).await;
    };
    let leader = metrics.leader.clone();
    let mut ctrl = tokio::spawn(controller::run(
        client.clone(),
        metrics,
        Config {
            canary_namespace: settings.namespace.clone(),
            migration_selector: settings.migration_selector.clone(),
        },
        ready.clone(),
        shutdown,
    ));

    // Without leader election the sender is dropped at once and `wait_for` errors; only a real
    // `true` means leadership was lost, so the error disables that branch instead.
    let lost = tokio::select! {
        _ = &mut term => false,
        Ok(_) = lost_rx.wait_for(|l| *l) => true,
    };
    ready.store(false, Ordering::SeqCst);
    leader.set(0);
    let _ = stop_tx.send(true);
    if lost {
        // Not one more write: a standby may lead already. Whatever a reconcile left half done
        // is in the API and the next leader resumes it.
        warn!("lost leadership: stopping at once");
        ctrl.abort();
    } else {
        info!("stopping: finishing in-flight reconciles");
    }
    let stopped = match tokio::time::timeout(STOP_GRACE, &mut ctrl).await {
        Ok(stopped) => stopped,
        Err(_) => {
            warn!(grace = ?STOP_GRACE, "in-flight reconciles did not finish in time; stopping them");
            ctrl.abort();
            ctrl.await
        }
    };
    if let Err(e) = stopped
        && !e.is_cancelled()
    {
        error!(error = %e, "controller task failed");
    }
    if let Some(r) = renew {
        r.abort();
    }
    if settings.leader_election
        && !lost
        && let Err(e) = elector.release().await
    {
        warn!(error = %e, "releasing the lease failed");
    }
    let _ = http.await;
    if lost {
        anyhow::bail!("lost leadership of lease {}", settings.lease_name);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;
    use axum::http::Request;
    use tower::ServiceExt;

    async fn get_path(app: Router, path: &str) -> (StatusCode, String) {
        let resp = app.oneshot(Request::get(path).body(Body::empty()).unwrap()).await.unwrap();
        let status = resp.status();
        let bytes = axum::body::to_bytes(resp.into_body(), 1 << 20).await.unwrap();
        (status, String::from_utf8_lossy(&bytes).into_owned())
    }

    #[tokio::test]
    async fn readyz_follows_cache_sync_and_livez_does_not() {
        let metrics = Arc::new(Metrics::new());
        let ready = Arc::new(AtomicBool::new(false));
        let app = router(metrics.clone(), ready.clone());
        assert_eq!(get_path(app.clone(), "/readyz").await.0, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(get_path(app.clone(), "/livez").await.0, StatusCode::OK);
        ready.store(true, Ordering::SeqCst);
        assert_eq!(get_path(app.clone(), "/readyz").await.0, StatusCode::OK);
        metrics.reconciliations.inc();
        let (code, body) = get_path(app, "/metrics").await;
        assert_eq!(code, StatusCode::OK);
        assert!(body.contains("switchyard_reconciliations_total 1"), "{body}");
    }
}
