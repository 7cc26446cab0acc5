//! One reconcile of a GpuPoolMigration, in three parts:
//!
//! - [`observe`]: one snapshot of the pool, from the controller's caches, plus the reads a
//!   moving node's step needs that no cache holds (its pods, its rollback rule, its canary);
//! - [`decide`]: pure. The DeviceClasses and placement to apply, the gate and what holds the
//!   pool, each moving node's action and the writes it makes, the status, events and metrics.
//!   Table-tested;
//! - [`execute`]: carries the decision out, each node's error its own, and writes the status.

pub mod cleanup;
pub mod context;
pub mod decide;
pub mod execute;
pub mod observe;

use std::future::Future;

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use kube::runtime::controller::Action as Requeue;

use crate::api::v1alpha1::GpuPoolMigration;
use crate::error::Result;
use crate::reconcile::context::Context;
use crate::report::metrics::PhaseLabels;

/// Observes the pool, decides, and carries the decision out.
pub async fn apply(gpm: &GpuPoolMigration, ctx: &Context) -> Result<Requeue> {
    let timed = |phase: &'static str, since: std::time::Instant| {
        ctx.metrics
            .reconcile_phase_duration
            .get_or_create(&PhaseLabels { phase })
            .observe(since.elapsed().as_secs_f64());
    };
    let t = std::time::Instant::now();
    // Nodes it holds that left the selector are let go first: the snapshot holds only the pool.
    let departed = cleanup::departed(gpm, ctx).await?;
    let mut snapshot = observe::pool(ctx, gpm).await?;
    snapshot.departed = departed.iter().map(|p| p.name.clone()).collect();
    timed("observe", t);
    let t = std::time::Instant::now();
    let decision = decide::pool(&snapshot)?;
    timed("decide", t);
    snapshot.release_decided();
    let t = std::time::Instant::now();
    let requeue = execute::pool(ctx, &snapshot, decision, departed).await;
    timed("execute", t);
    requeue
}

/// Runs `runs` with at most `limit` in flight and returns their outputs in the order of `runs`.
///
/// Not `StreamExt::buffered`: it counts a finished future as in flight until every one before it
/// has finished, so one slow node (a drain of many pods, a request the API server queues) left the
/// other slots idle while a reconcile of hundreds of moving nodes waited behind it. A loop, not
/// `stream::iter(..).map(..).buffer_unordered(..)`: a closure over futures that borrow the snapshot
/// is not general enough for the `Send` bound the controller puts on the reconcile.
pub async fn bounded_in_order<T>(
    runs: impl IntoIterator<Item = impl Future<Output = T>>,
    limit: usize,
) -> Vec<T> {
    let mut runs = runs.into_iter().enumerate();
    let mut in_flight = FuturesUnordered::new();
    let mut out: Vec<(usize, T)> = Vec::new();
    loop {
        while in_flight.len() < limit.max(1) {
            let Some((i, run)) = runs.next() else { break };
            in_flight.push(async move { (i, run.await) });
        }
        let Some(done) = in_flight.next().await else { break };
        out.push(done);
    }
    out.sort_unstable_by_key(|(i, _)| *i);
    out.into_iter().map(|(_, t)| t).collect()
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::time::{Instant, sleep};

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_slow_run_does_not_hold_up_the_others_and_the_order_is_kept() {
        // One run of 10 s, then ten of 1 s, two at a time: the slow one takes one slot and the
        // ten pass through the other. (`buffered` would leave the second slot idle behind the
        // slow run: 10 s, then five more.)
        let secs = [10, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1];
        let t = Instant::now();
        let runs = secs.iter().enumerate().map(|(i, s)| async move {
            sleep(Duration::from_secs(*s)).await;
            i
        });
        let out = bounded_in_order(runs, 2).await;
        assert_eq!(t.elapsed(), Duration::from_secs(10));
        assert_eq!(out, (0..secs.len()).collect::<Vec<_>>());
    }

    #[tokio::test(start_paused = true)]
    async fn no_more_than_the_limit_run_at_once() {
        let running = std::sync::atomic::AtomicUsize::new(0);
        let most = std::sync::atomic::AtomicUsize::new(0);
        let runs = (0..20u64).map(|i| {
            let (running, most) = (&running, &most);
            async move {
                let now = running.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
                most.fetch_max(now, std::sync::atomic::Ordering::SeqCst);
                sleep(Duration::from_millis(100 + 37 * (i % 5))).await;
                running.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
                i
            }
        });
        let out = bounded_in_order(runs, 3).await;
        assert_eq!(most.load(std::sync::atomic::Ordering::SeqCst), 3);
        assert_eq!(out, (0..20).collect::<Vec<_>>());
    }
}
