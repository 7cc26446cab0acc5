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

/// Observes the pool, decides, and carries the decision out.
pub async fn apply(gpm: &GpuPoolMigration, ctx: &Context) -> Result<Requeue> {
    let snapshot = observe::pool(ctx, gpm).await?;
    let decision = decide::pool(&snapshot)?;
    execute::pool(ctx, &snapshot, decision).await
}
