//! Watch streams that recover on their own.
//!
//! The controller merges its watches (migrations, nodes, DaemonSets, DeviceClasses,
//! ResourceSlices) into one trigger stream, and kube-runtime backs that merged stream off as a
//! whole: every watch error anywhere adds a sleep during which no watch is polled, so no cache is
//! updated (see `switchyard_api::watch`). So each watch backs off alone ([`backed_off`]) and its
//! errors are logged and counted here ([`errors_handled`]); they never reach the merged stream,
//! whose backoff then never runs.

use std::future::ready;

use futures::{Stream, StreamExt};
use kube::runtime::watcher;
use tracing::warn;

pub use switchyard_api::watch::{WATCH_BACKOFF_MAX, WATCH_BACKOFF_MIN, WatchBackoff, backed_off};

use crate::report::metrics::Metrics;

/// Drops the errors of a watch-derived stream after logging and counting them under `kind`: the
/// watch underneath retries by itself ([`backed_off`]), and an error passed on would put the
/// controller's shared backoff to sleep.
pub fn errors_handled<S, T>(
    kind: &'static str,
    metrics: std::sync::Arc<Metrics>,
    stream: S,
) -> impl Stream<Item = watcher::Result<T>> + Send + 'static
where
    S: Stream<Item = watcher::Result<T>> + Send + 'static,
    T: Send + 'static,
{
    stream.filter_map(move |item| {
        ready(match item {
            Ok(obj) => Some(Ok(obj)),
            Err(e) => {
                warn!(watch = kind, error = %e, "watch failed; it retries on its own within {}s", WATCH_BACKOFF_MAX.as_secs());
                metrics.watch_errors.get_or_create(&crate::report::metrics::WatchLabels { kind }).inc();
                None
            }
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::stream;
    use std::sync::Arc;
    use std::time::Duration;

    fn err() -> watcher::Error {
        watcher::Error::NoResourceVersion
    }

    /// Twenty errors in a row (an API server that is down) cost the watch at most
    /// WATCH_BACKOFF_MAX per retry, and the events after them arrive; the errors never leave.
    #[tokio::test(start_paused = true)]
    async fn a_failing_watch_sleeps_alone_and_its_errors_stay_here() {
        let metrics = Arc::new(Metrics::default());
        let items: Vec<watcher::Result<u32>> =
            (0..20).map(|_| Err(err())).chain([Ok(1), Err(err()), Ok(2)]).collect();
        let start = tokio::time::Instant::now();
        let out: Vec<u32> = errors_handled("Node", metrics.clone(), backed_off(stream::iter(items)))
            .map(|r| r.expect("errors are dropped"))
            .collect()
            .await;
        assert_eq!(out, [1, 2]);
        // 250+500+1000+2000+4000 and 15 × 5000 ms for the outage, then 250 ms after the reset.
        let slept = start.elapsed();
        assert_eq!(slept, Duration::from_millis(7750 + 15 * 5000 + 250), "{slept:?}");
        let counted =
            metrics.watch_errors.get_or_create(&crate::report::metrics::WatchLabels { kind: "Node" }).get();
        assert_eq!(counted, 21);
    }

    /// Two watches merged as the controller merges them: one failing does not hold up the other.
    #[tokio::test(start_paused = true)]
    async fn one_failing_watch_does_not_delay_another() {
        let metrics = Arc::new(Metrics::default());
        let failing = stream::iter((0..10).map(|_| Err::<u32, _>(err())));
        let healthy = stream::iter([Ok(7u32)]);
        let mut merged = std::pin::pin!(stream::select(
            errors_handled("DaemonSet", metrics.clone(), backed_off(failing)),
            errors_handled("Node", metrics, backed_off(healthy)),
        ));
        let start = tokio::time::Instant::now();
        assert_eq!(merged.next().await.unwrap().unwrap(), 7);
        assert!(start.elapsed() < WATCH_BACKOFF_MIN, "{:?}", start.elapsed());
    }
}
