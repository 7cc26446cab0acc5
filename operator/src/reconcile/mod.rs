//! One reconcile of a GpuPoolMigration, in three parts:
//!
//! - [`observe`]: one snapshot of the pool, from the controller's caches, plus the reads a
//!   moving node's step needs that no cache holds (its pods, its rollback rule, its canary);
//! - [`decide`]: pure. The DeviceClasses and placement to apply, the gate and what holds the
//!   pool, each moving node's action and the writes it makes, the status, events and metrics.
//!   Table-tested;
//! - [`execute`]: carries the decision out, each node's error its own, and writes the status.

pub mod decide;
pub mod execute;
pub mod observe;

use kube::runtime::controller::Action as Requeue;

use crate::api::v1alpha1::GpuPoolMigration;
use crate::controller::Context;
use crate::error::Result;
use crate::metrics::PhaseLabels;

/// Observes the pool, decides, and carries the decision out.
pub async fn apply(gpm: &GpuPoolMigration, ctx: &Context) -> Result<Requeue> {
    let timed = |phase: &'static str, since: std::time::Instant| {
        ctx.metrics
            .reconcile_phase_duration
            .get_or_create(&PhaseLabels { phase })
            .observe(since.elapsed().as_secs_f64());
    };
    let t = std::time::Instant::now();
    let mut snapshot = observe::pool(ctx, gpm).await?;
    timed("observe", t);
    let t = std::time::Instant::now();
    let decision = decide::pool(&snapshot)?;
    timed("decide", t);
    snapshot.release_decided();
    let t = std::time::Instant::now();
    let requeue = execute::pool(ctx, &snapshot, decision).await;
    timed("execute", t);
    requeue
}
