//! Switchyard operator: moves GPU node pools from the NVIDIA device plugin to a DRA driver, node
//! by node, and back.
//!
//! The folders, from the process down; each imports only folders below it, and `report`, which
//! imports none:
//!
//! - [`runtime`]: the process: leader election, the allocator, `/metrics`, `/readyz`, the stop;
//! - [`controller`]: the watches that feed the caches and trigger reconciles (wiring only);
//! - [`reconcile`]: one reconcile: observe, decide (pure), execute; cleanup beside apply; the
//!   context every reconcile shares;
//! - [`reads`]: API reads no cache holds (discovery, paged pod LISTs, the capacity readers);
//! - [`cache`]: the stores the watches feed, and read-your-writes for patched nodes;
//! - [`pool`]: the pool's judgements, pure: the gate, the rollout, prerequisites, capacity,
//!   overlap, placement, DeviceClasses and their selectors, the capacity readers, and the
//!   preview `switchyard plan` shows;
//! - [`node`]: one node, pure: its slim cached shape, its record, its patches, its state
//!   machine, drain and canary;
//! - [`report`]: conditions, events and metrics.

pub mod api;
pub mod cache;
pub mod controller;
pub mod crd;
pub mod error;
pub mod node;
pub mod pool;
pub mod reads;
pub mod reconcile;
pub mod report;
#[cfg(feature = "runtime")]
pub mod runtime;
#[doc(hidden)]
pub mod testing;
pub use switchyard_api::well_known;

pub use error::{Error, Result};
