//! Watch streams that recover on their own.
//!
//! The controller merges its watches (migrations, nodes, DaemonSets, DeviceClasses,
//! ResourceSlices) into one trigger stream, and kube-runtime backs that merged stream off as a
//! whole: every watch error anywhere adds a sleep (client-go's 0.8 s doubling to 30 s, reset only
//! after two quiet minutes) during which no watch is polled, so no cache is updated. When the API
//! server restarts, each of the five watches fails a few times, and the sleeps pile up: the caches
//! froze for minutes after the server was back, and nodes sat in Switching although their slices
//! had long been published.
//!
//! So each watch here backs off alone ([`WatchBackoff`]: 250 ms doubling to at most
//! [`WATCH_BACKOFF_MAX`], reset by the first event that arrives), and its errors are logged and
//! counted here and never reach the merged stream, whose backoff then never runs. A watch is
//! therefore polled again at most [`WATCH_BACKOFF_MAX`] after the server answers.

use std::future::ready;
use std::time::Duration;

use futures::{Stream, StreamExt};
use kube::runtime::utils::{Backoff, StreamBackoff};
use kube::runtime::watcher;
use tracing::warn;

use crate::metrics::Metrics;

/// The first retry of a failed watch.
pub const WATCH_BACKOFF_MIN: Duration = Duration::from_millis(250);
/// The longest a failed watch waits before it tries again: the bound on how long a cache stays
/// behind once the API server answers again.
pub const WATCH_BACKOFF_MAX: Duration = Duration::from_secs(5);

/// Doubling from [`WATCH_BACKOFF_MIN`] to [`WATCH_BACKOFF_MAX`], back to the start on `reset`
/// (which [`StreamBackoff`] calls on every event that is not an error).
#[derive(Debug, Clone)]
pub struct WatchBackoff {
    next: Duration,
}

impl Default for WatchBackoff {
    fn default() -> Self {
        Self { next: WATCH_BACKOFF_MIN }
    }
}

impl Iterator for WatchBackoff {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        let now = self.next;
        self.next = (now * 2).min(WATCH_BACKOFF_MAX);
        Some(now)
    }
}

impl Backoff for WatchBackoff {
    fn reset(&mut self) {
        self.next = WATCH_BACKOFF_MIN;
    }
}

/// `events` (a watcher) with a backoff of its own: after an error, only this stream sleeps.
pub fn backed_off<S, T>(events: S) -> StreamBackoff<S, WatchBackoff>
where
    S: Stream<Item = watcher::Result<T>>,
{
    StreamBackoff::new(events, WatchBackoff::default())
}

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
                metrics.watch_errors.get_or_create(&crate::metrics::WatchLabels { kind }).inc();
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

    fn err() -> watcher::Error {
        watcher::Error::NoResourceVersion
    }

    #[test]
    fn backoff_doubles_to_its_cap_and_resets() {
        let mut b = WatchBackoff::default();
        let got: Vec<u128> = (0..7).map(|_| b.next().unwrap().as_millis()).collect();
        assert_eq!(got, [250, 500, 1000, 2000, 4000, 5000, 5000]);
        b.reset();
        assert_eq!(b.next(), Some(WATCH_BACKOFF_MIN));
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
        let counted = metrics.watch_errors.get_or_create(&crate::metrics::WatchLabels { kind: "Node" }).get();
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
