//! A backoff for one watch at a time.
//!
//! kube-runtime's controller backs off the merged stream of all its watches as a whole, by
//! client-go's 0.8 s doubling to 30 s that resets only after two quiet minutes, and polls none of
//! them while it sleeps. After an API-server restart every watch fails a few times and the sleeps
//! pile up, so caches froze for minutes after the server was back. [`backed_off`] gives one watch
//! its own backoff instead: 250 ms doubling to at most [`WATCH_BACKOFF_MAX`], back to the start at
//! the first event that arrives. A watch is then polled again at most [`WATCH_BACKOFF_MAX`] after
//! the server answers, and a failing watch never spins.

use std::time::Duration;

use futures::Stream;
use kube::runtime::utils::{Backoff, StreamBackoff};
use kube::runtime::watcher;

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_to_its_cap_and_resets() {
        let mut b = WatchBackoff::default();
        let got: Vec<u128> = (0..7).map(|_| b.next().unwrap().as_millis()).collect();
        assert_eq!(got, [250, 500, 1000, 2000, 4000, 5000, 5000]);
        b.reset();
        assert_eq!(b.next(), Some(WATCH_BACKOFF_MIN));
    }
}
