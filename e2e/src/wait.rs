//! Polling with a deadline, for conditions that real controllers reach in their own time.

use std::future::Future;
use std::time::{Duration, Instant};

/// How often a condition is re-checked: fast enough that tests do not idle, slow enough not to
/// load a 2-core machine's API server.
const POLL: Duration = Duration::from_millis(250);

/// Polls `check` until it returns `Some`, or fails after `timeout` naming `what` and the last
/// error seen.
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
            Err(e) => last_error = Some(e),
        }
        if Instant::now() >= deadline {
            let detail = last_error.map(|e| format!(" (last error: {e:#})")).unwrap_or_default();
            anyhow::bail!("timed out after {timeout:?} waiting for {what}{detail}");
        }
        tokio::time::sleep(POLL).await;
    }
}
