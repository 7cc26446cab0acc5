//! Polling with a deadline, for conditions that real controllers reach in their own time.
//!
//! [`until`] keeps "not yet" and "wrong" apart. Its check answers one of:
//!
//! - `Ok(Some(v))`: the condition holds; `until` returns `Ok(v)`.
//! - `Ok(None)`: not yet; checked again after `POLL` (250 ms).
//! - `Err(e)` where `e` is a *transient read failure*: checked again, as for `Ok(None)`, and `e`
//!   is remembered, so that the timeout names the last one. Transient means that the error's
//!   chain ([`anyhow::Error::chain`]) holds a [`kube::Error`] (the API server answered with an
//!   error, 404 included, or could not be reached), a [`std::io::Error`] (a connection refused or
//!   reset, a file not written yet; [`crate::measure::http`] fails with one for any transport
//!   failure), or that the error was made by [`not_yet`].
//! - any other `Err(e)`: the condition is *wrong* (an `ensure!`, `bail!` or `anyhow!` in the
//!   check, a `.context(..)` on a `None` or a failed parse of what the API returned): `until`
//!   fails at once with `"{what}: {e:#}"`, without waiting for the deadline. An `ensure!` in a
//!   check is therefore an invariant of the whole wait, not a condition to wait for.
//!
//! A state that is only *not there yet* (an object not listed yet, a status not written yet, a
//! process not answering yet) must be `Ok(None)` (`let Some(x) = .. else { return Ok(None) }`),
//! or, when its reason is worth reporting at the timeout, an error made by [`not_yet`].
//!
//! [`holds_for`] is the other half: not "this happens within a deadline" but "nothing happens
//! for this long". Its check answers `Ok(())` (the invariant holds now), a transient read failure
//! (retried, as for [`until`]) or any other `Err` (the invariant is broken: it fails at once).

use std::fmt::Display;
use std::future::Future;
use std::time::{Duration, Instant};

/// How often a condition is re-checked: fast enough that tests do not idle, slow enough not to
/// load a 2-core machine's API server.
const POLL: Duration = Duration::from_millis(250);

/// A reason a condition does not hold yet, made by [`not_yet`]: retried by [`until`].
#[derive(Debug)]
struct NotYet(String);

impl Display for NotYet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for NotYet {}

/// An error that [`until`] treats as "not yet" (retries, and reports at the timeout if it is the
/// last one), for a check that fails for a reason other than the API's while the cluster settles:
/// `real::kubectl(..).map_err(wait::not_yet)?`. `reason` is written with `{:#}`, so an
/// [`anyhow::Error`] keeps its whole chain.
pub fn not_yet(reason: impl Display) -> anyhow::Error {
    anyhow::Error::new(NotYet(format!("{reason:#}")))
}

/// Whether `e` is a transient read failure: see the [module docs](self).
fn transient(e: &anyhow::Error) -> bool {
    e.chain().any(|c| c.is::<kube::Error>() || c.is::<std::io::Error>() || c.is::<NotYet>())
}

/// Polls `check` every `POLL` (250 ms) until it returns `Ok(Some(v))`, and returns `v`.
///
/// `Ok(None)` is "not yet". An `Err` that is a transient read failure (its chain holds a
/// [`kube::Error`] or a [`std::io::Error`], or it came from [`not_yet`]) is retried too, and
/// remembered. Any other `Err(e)` means the condition is wrong: `until` fails at once with
/// `"{what}: {e:#}"`. Past `timeout`, it fails naming `what` and the last transient error.
pub async fn until<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = anyhow::Result<Option<T>>>,
{
    let deadline = Instant::now() + timeout;
    let mut last_error = None;
    loop {
        match check().await {
            Ok(Some(value)) => return Ok(value),
            Ok(None) => {}
            Err(e) if transient(&e) => last_error = Some(e),
            Err(e) => anyhow::bail!("{what}: {e:#}"),
        }
        if Instant::now() >= deadline {
            let detail = last_error.map(|e| format!(" (last error: {e:#})")).unwrap_or_default();
            anyhow::bail!("timed out after {timeout:?} waiting for {what}{detail}");
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Watches an invariant for the whole of `window`: polls `check` every `POLL` (250 ms), from the
/// start of the window to its end, and fails on the first sign of what should not happen.
///
/// Use it where a scenario shows that *nothing happens for this long* (a paused migration moves
/// no node, a pod with nowhere to go is not evicted, a held node stays held), instead of a sleep
/// followed by one look, which misses what came and went inside the window and says nothing about
/// the window itself. Keep the window the scenario chose (long enough to outlast the controller
/// reaction it rules out), and write the invariant with `anyhow::ensure!`; use `?` only on the
/// API reads.
///
/// `check` answers:
/// - `Ok(())`: the invariant holds now;
/// - an `Err` that is a transient read failure (its chain holds a [`kube::Error`], a 404 included,
///   or a [`std::io::Error`], or it came from [`not_yet`]): neither holds nor breaks; the next
///   check decides. An object whose *absence* breaks the invariant must therefore be read with
///   `get_opt` and `ensure!`d, not with `get(..)?`, whose 404 would only be retried;
/// - any other `Err(e)` (a failed `ensure!`, a `bail!`): the invariant is broken, and `holds_for`
///   fails at once with `"{what}: {e:#}"` and how far into the window it was seen.
///
/// The first check is at once, and the last one starts at or after the end of the window:
/// `holds_for` returns `Ok(())` only when that last check confirms the invariant. A window that
/// ends on transient failures (every check since the last `Ok(())` failed transiently) fails,
/// naming the last error: the invariant was not confirmed at its end.
///
/// A polled invariant can still miss a violation that comes and goes between two checks (shorter
/// than `POLL`); what is irreversible (a pod deleted, an object created that stays) is not missed.
pub async fn holds_for<F, Fut>(what: &str, window: Duration, mut check: F) -> anyhow::Result<()>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = anyhow::Result<()>>,
{
    let started = Instant::now();
    let end = started + window;
    loop {
        // Taken before the check, so that the last check starts at or after the window's end.
        let at_end = Instant::now() >= end;
        // A transient failure leaves the invariant unconfirmed until the next check.
        let unconfirmed = match check().await {
            Ok(()) => None,
            Err(e) if transient(&e) => Some(e),
            Err(e) => {
                let into = started.elapsed();
                anyhow::bail!("{what}: {e:#} (seen {into:.2?} into the {window:?} window)");
            }
        };
        if at_end {
            return match unconfirmed {
                None => Ok(()),
                Some(e) => Err(anyhow::anyhow!(
                    "{what}: not confirmed at the end of the {window:?} window (last error: {e:#})"
                )),
            };
        }
        // The last poll lands on the window's end rather than up to `POLL` past it.
        tokio::time::sleep(POLL.min(end.saturating_duration_since(Instant::now()))).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unavailable() -> kube::Error {
        let status = kube::core::Status::failure("etcdserver: leader changed", "ServiceUnavailable");
        kube::Error::Api(status.with_code(503).boxed())
    }

    #[tokio::test]
    async fn not_yet_then_ready_returns_the_value() {
        let mut calls = 0;
        let got = until("the third call", Duration::from_secs(30), || {
            calls += 1;
            let n = calls;
            async move { Ok((n >= 3).then_some(n)) }
        })
        .await
        .unwrap();
        assert_eq!(got, 3);
    }

    #[tokio::test]
    async fn an_api_error_is_retried_until_the_condition_holds() {
        let mut calls = 0;
        let got = until("the API to answer", Duration::from_secs(30), || {
            calls += 1;
            let n = calls;
            async move {
                if n < 3 {
                    // As `api.get(..).await?` propagates it, with a context on top for good measure.
                    return Err(anyhow::Error::new(unavailable()).context("reading the migration"));
                }
                Ok(Some("answered"))
            }
        })
        .await
        .unwrap();
        assert_eq!((got, calls), ("answered", 3));
    }

    #[tokio::test]
    async fn an_io_error_and_a_not_yet_are_retried() {
        let mut calls = 0;
        let got = until("the endpoint to answer", Duration::from_secs(30), || {
            calls += 1;
            let n = calls;
            async move {
                match n {
                    1 => Err(std::io::Error::from(std::io::ErrorKind::ConnectionRefused).into()),
                    2 => Err(not_yet("kubectl logs: container is waiting to start")),
                    _ => Ok(Some(n)),
                }
            }
        })
        .await
        .unwrap();
        assert_eq!(got, 3);
    }

    #[tokio::test]
    async fn a_failed_ensure_fails_at_once() {
        let started = Instant::now();
        let mut calls = 0;
        let err = until("the rollback to finish", Duration::from_secs(30), || {
            calls += 1;
            let n = calls;
            async move {
                if n == 1 {
                    return Ok(None);
                }
                anyhow::ensure!(n > 100, "the rollback reported an overlap");
                Ok(Some(()))
            }
        })
        .await
        .unwrap_err();
        assert!(started.elapsed() < Duration::from_secs(1), "waited {:?}", started.elapsed());
        assert_eq!(calls, 2, "no retry after the failed ensure");
        assert_eq!(err.to_string(), "the rollback to finish: the rollback reported an overlap");
    }

    #[tokio::test]
    async fn a_context_on_a_missing_value_fails_at_once_with_its_chain() {
        use anyhow::Context as _;
        let started = Instant::now();
        let err = until("a parsed status", Duration::from_secs(30), || async {
            let parsed: Result<u32, _> = "not a number".parse::<u32>();
            Ok(Some(parsed.context("status.pods is not a number")?))
        })
        .await
        .unwrap_err();
        assert!(started.elapsed() < Duration::from_secs(1), "waited {:?}", started.elapsed());
        let msg = err.to_string();
        assert!(msg.starts_with("a parsed status: status.pods is not a number: "), "{msg}");
    }

    #[tokio::test]
    async fn the_timeout_names_the_last_transient_error() {
        let started = Instant::now();
        let err = until("the API to answer", Duration::from_millis(300), || async {
            Err::<Option<()>, _>(anyhow::Error::new(unavailable()))
        })
        .await
        .unwrap_err();
        assert!(started.elapsed() >= Duration::from_millis(300), "gave up early: {:?}", started.elapsed());
        let msg = err.to_string();
        assert!(
            msg.starts_with("timed out after 300ms waiting for the API to answer (last error: "),
            "{msg}"
        );
        assert!(msg.contains("etcdserver: leader changed"), "{msg}");
    }

    #[tokio::test]
    async fn the_timeout_names_the_last_not_yet_reason_with_its_chain() {
        let err = until("the plugin's log", Duration::from_millis(100), || async {
            let e = anyhow::anyhow!("container \"cuda\" is waiting to start").context("kubectl logs");
            Err::<Option<()>, _>(not_yet(e))
        })
        .await
        .unwrap_err();
        let msg = err.to_string();
        assert!(msg.ends_with("(last error: kubectl logs: container \"cuda\" is waiting to start)"), "{msg}");
    }

    #[tokio::test]
    async fn an_invariant_that_holds_passes_after_the_whole_window() {
        let started = Instant::now();
        let window = Duration::from_millis(600);
        let mut calls = Vec::new();
        holds_for("nothing to move", window, || {
            calls.push(started.elapsed());
            async { Ok(()) }
        })
        .await
        .unwrap();
        assert!(started.elapsed() >= window, "returned early: {:?}", started.elapsed());
        assert!(started.elapsed() < window + Duration::from_secs(1), "overstayed: {:?}", started.elapsed());
        // At the start, every `POLL` through the window, and once at its end.
        assert!(calls[0] < Duration::from_millis(50), "the first check is not at once: {calls:?}");
        assert!(calls.len() >= 3, "{calls:?}");
        assert!(calls.last().is_some_and(|t| *t >= window), "no check at the window's end: {calls:?}");
    }

    #[tokio::test]
    async fn a_violation_fails_at_once_with_the_time_into_the_window() {
        let started = Instant::now();
        let mut calls = 0;
        let err = holds_for("the bare pod to stay", Duration::from_secs(30), || {
            calls += 1;
            let n = calls;
            async move {
                anyhow::ensure!(n < 2, "the bare pod was evicted");
                Ok(())
            }
        })
        .await
        .unwrap_err();
        assert!(started.elapsed() < Duration::from_secs(1), "waited {:?}", started.elapsed());
        assert_eq!(calls, 2, "no check after the violation");
        let msg = err.to_string();
        assert!(msg.starts_with("the bare pod to stay: the bare pod was evicted (seen "), "{msg}");
        assert!(msg.ends_with(" into the 30s window)"), "{msg}");
    }

    #[tokio::test]
    async fn a_transient_error_then_ok_still_holds() {
        let started = Instant::now();
        let mut calls = 0;
        holds_for("nodes to stay put", Duration::from_millis(600), || {
            calls += 1;
            let n = calls;
            async move {
                match n {
                    1 => Err(anyhow::Error::new(unavailable()).context("listing nodes")),
                    2 => Err(std::io::Error::from(std::io::ErrorKind::ConnectionReset).into()),
                    _ => Ok(()),
                }
            }
        })
        .await
        .unwrap();
        assert!(started.elapsed() >= Duration::from_millis(600), "returned early: {:?}", started.elapsed());
        assert!(calls >= 3, "{calls}");
    }

    #[tokio::test]
    async fn a_window_ending_on_transient_errors_fails_naming_the_last() {
        let started = Instant::now();
        let mut calls = 0;
        let err = holds_for("the taints to stay", Duration::from_millis(600), || {
            calls += 1;
            let n = calls;
            async move {
                if n == 1 {
                    return Ok(());
                }
                Err(anyhow::Error::new(unavailable()).context("listing slices"))
            }
        })
        .await
        .unwrap_err();
        assert!(started.elapsed() >= Duration::from_millis(600), "gave up early: {:?}", started.elapsed());
        let msg = err.to_string();
        assert!(
            msg.starts_with("the taints to stay: not confirmed at the end of the 600ms window (last error: "),
            "{msg}"
        );
        assert!(msg.contains("listing slices") && msg.contains("etcdserver: leader changed"), "{msg}");
    }

    #[tokio::test]
    async fn a_zero_window_checks_once() {
        let mut calls = 0;
        holds_for("at once", Duration::ZERO, || {
            calls += 1;
            async { Ok(()) }
        })
        .await
        .unwrap();
        assert_eq!(calls, 1);
    }

    #[test]
    fn what_is_transient() {
        assert!(transient(&anyhow::Error::new(unavailable())));
        assert!(transient(&anyhow::Error::new(unavailable()).context("listing pods")));
        assert!(transient(&std::io::Error::other("connection reset").into()));
        assert!(transient(&not_yet("no answer yet")));
        assert!(!transient(&anyhow::anyhow!("migration failed")));
        assert!(!transient(&"x".parse::<u32>().unwrap_err().into()));
        // A kube error flattened into a message is no longer one.
        assert!(!transient(&anyhow::anyhow!("{}", unavailable())));
    }
}
