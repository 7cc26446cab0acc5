//! Switchyard's API, shared by the operator, the CLI, the driver agent and the e2e suite, so that
//! the agent does not depend on the whole operator.
//!
//! - [`v1alpha1`]: the `GpuPoolMigration` custom resource, the only served version and the
//!   storage version.
//! - [`well_known`]: the labels, annotations, finalizer and taint keys both sides read and write.
//! - [`watch`]: the per-watch backoff every long-lived watch of the project uses.
//! - [`quantity`]: Kubernetes quantities read exactly.
//! - [`sharing`]: how many claims a published device can be allocated to.

pub mod quantity;
pub mod reference;
pub mod sharing;
pub mod v1alpha1;
pub mod watch;
pub mod well_known;

/// The API group of every Switchyard custom resource.
pub const GROUP: &str = "switchyard.dev";
